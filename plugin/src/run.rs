//! One plugin invocation: environment + stdin config in, CNI result or
//! error out. The plugin validates its input (so bad input is refused before
//! anything is sent), forwards the invocation to the agent socket, and
//! prints what the agent answers. It holds no state.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use serde_json::Value;

use crate::call::CniCall;
use crate::client::{Client, ClientError};
use crate::config::{self, DEFAULT_SOCKET, IpamType, NetworkConfig, UPSTREAM_SOCKET};
use crate::env::{CniEnv, Command};
use crate::error_chain::format_chain;
use crate::proto::{self, CniRequest, GcReply, GcRequest, Readiness};
use crate::types::{CniError, CniResult, LATEST_VERSION, VersionResult, code};

/// How long the shim waits for the agent beyond the configured DHCP timeout.
const ANSWER_MARGIN: Duration = Duration::from_secs(15);

/// Entry point of the plugin: reads the process environment and stdin,
/// writes the result or error object to stdout, returns the exit status.
pub fn main() -> ExitCode {
    let mut stdin = Vec::new();
    let outcome = match std::io::stdin().read_to_end(&mut stdin) {
        Ok(_) => run(|k| std::env::var(k).ok(), &stdin),
        Err(e) => Err(CniError::new(
            code::IO_FAILURE,
            "cannot read the network configuration from stdin",
        )
        .with_details(format_chain(&e))),
    };
    let (json, status) = match outcome {
        Ok(Some(v)) => (Some(v), ExitCode::SUCCESS),
        Ok(None) => (None, ExitCode::SUCCESS),
        Err(e) => {
            // The error object in the version the config asked for.
            let version =
                config::sniff_version(&stdin).unwrap_or_else(|| LATEST_VERSION.to_owned());
            (Some(e.to_json(&version)), ExitCode::FAILURE)
        }
    };
    if let Some(v) = json {
        let mut out = std::io::stdout().lock();
        // Nothing useful can be done if stdout is gone; the exit status stays.
        let _ = serde_json::to_writer(&mut out, &v)
            .and_then(|()| out.write_all(b"\n").map_err(serde_json::Error::io));
        let _ = out.flush();
    }
    status
}

/// Run one invocation. `Ok(Some(json))` is printed, `Ok(None)` prints nothing
/// (DEL, CHECK, GC, STATUS success).
pub fn run(
    lookup: impl Fn(&str) -> Option<String>,
    stdin: &[u8],
) -> Result<Option<Value>, CniError> {
    let (env, config) = match CniCall::read(lookup, stdin)? {
        CniCall::Version => return Ok(Some(to_json(&VersionResult::current()))),
        CniCall::Invoke { env, config } => (env, config),
    };
    let client = Client::new(agent_socket(&config, Path::exists), shim_timeout(&config));
    dispatch(&client, env, config)
}

fn dispatch(
    client: &Client,
    env: CniEnv,
    config: NetworkConfig,
) -> Result<Option<Value>, CniError> {
    let cni_version = config.cni_version.clone();
    match env.command {
        Command::Version => Ok(Some(to_json(&VersionResult::current()))),
        Command::Status => {
            let r: Readiness = client.get(proto::PATH_READY).map_err(|e| {
                let e = e.into_cni();
                CniError::new(code::PLUGIN_NOT_AVAILABLE, e.msg).with_details(e.details)
            })?;
            if r.ready {
                Ok(None)
            } else {
                Err(CniError::new(
                    code::PLUGIN_NOT_AVAILABLE,
                    format!("the xdhcp agent is not ready: {}", r.reason),
                ))
            }
        }
        Command::Gc => {
            let _: GcReply = client
                .post(proto::PATH_GC, &GcRequest { config })
                .map_err(ClientError::into_cni)?;
            Ok(None)
        }
        Command::Add | Command::Del | Command::Check => {
            let req = CniRequest {
                container_id: env.container_id.unwrap_or_default(),
                ifname: env.ifname.unwrap_or_default(),
                netns: env.netns,
                args: env.args,
                config,
            };
            match env.command {
                Command::Add => {
                    // The agent answers within the wait it is told.
                    let r: CniResult = client
                        .post_telling_wait(proto::PATH_ADD, &req)
                        .map_err(ClientError::into_cni)?;
                    Ok(Some(to_json(&r.for_version(&cni_version))))
                }
                Command::Del => {
                    let _: Value = client
                        .post(proto::PATH_DEL, &req)
                        .map_err(ClientError::into_cni)?;
                    Ok(None)
                }
                _ => {
                    let _: Value = client
                        .post(proto::PATH_CHECK, &req)
                        .map_err(ClientError::into_cni)?;
                    Ok(None)
                }
            }
        }
    }
}

/// The socket to talk to: the configured one, except that a `"type":
/// "dhcp"` config pointing at the upstream daemon's socket (its default)
/// falls back to xdhcp's own socket when nothing is at the upstream path —
/// an agent that serves only `/run/xdhcp/xdhcp.sock`.
fn agent_socket(config: &NetworkConfig, exists: impl Fn(&Path) -> bool) -> PathBuf {
    let configured = &config.socket_path;
    if config.ipam.ipam_type == IpamType::Dhcp
        && configured == Path::new(UPSTREAM_SOCKET)
        && !exists(configured)
        && exists(Path::new(DEFAULT_SOCKET))
    {
        return PathBuf::from(DEFAULT_SOCKET);
    }
    configured.clone()
}

/// The shim waits for the configured DHCP timeout plus a margin; without a
/// configured timeout, for the largest one the agent could apply. An ADD
/// tells the agent this wait ([`proto::HEADER_WAIT_MS`]), and the agent
/// answers within it.
pub fn shim_timeout(config: &NetworkConfig) -> Duration {
    config.ipam.timeout.unwrap_or(config::MAX_TIMEOUT) + ANSWER_MARGIN
}

fn to_json<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).expect("CNI reply types always serialize")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn run_with(vars: &[(&str, &str)], stdin: &str) -> Result<Option<Value>, CniError> {
        let m: BTreeMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        run(|k| m.get(k).cloned(), stdin.as_bytes())
    }

    #[test]
    fn version_needs_no_config() {
        let v = run_with(&[("CNI_COMMAND", "VERSION")], "")
            .unwrap()
            .unwrap();
        assert_eq!(v["cniVersion"], "1.1.0");
        assert!(v["supportedVersions"].as_array().unwrap().len() >= 2);
    }

    #[test]
    fn add_with_agent_down_names_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("xdhcp.sock");
        let netns = format!("/proc/{}/ns/net", std::process::id());
        let conf = format!(
            r#"{{"cniVersion":"1.0.0","name":"n","ipam":{{"type":"xdhcp","socketPath":"{}","timeout":"2s"}}}}"#,
            sock.display()
        );
        let e = run_with(
            &[
                ("CNI_COMMAND", "ADD"),
                ("CNI_CONTAINERID", "c1"),
                ("CNI_NETNS", &netns),
                ("CNI_IFNAME", "eth0"),
            ],
            &conf,
        )
        .unwrap_err();
        assert_eq!(e.code, code::AGENT_UNREACHABLE);
        assert!(e.msg.contains(&sock.display().to_string()), "{e}");
        assert!(e.msg.contains("not running"), "{e}");

        let e = run_with(
            &[("CNI_COMMAND", "STATUS")],
            &conf.replace("1.0.0", "1.1.0"),
        )
        .unwrap_err();
        assert_eq!(e.code, code::PLUGIN_NOT_AVAILABLE);
        assert!(e.msg.contains("not running"), "{e}");
    }

    /// An ADD tells the agent how long the plugin waits for the answer:
    /// the configured DHCP timeout plus the plugin's margin.
    #[test]
    fn add_tells_the_agent_the_plugins_wait() {
        use std::io::{Read as _, Write as _};
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("xdhcp.sock");
        let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let agent = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut buf = [0u8; 8192];
            let n = conn.read(&mut buf).unwrap();
            let body = r#"{"cniVersion":"1.0.0","ips":[],"routes":[],"dns":{}}"#;
            write!(
                conn,
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
            .unwrap();
            String::from_utf8_lossy(&buf[..n]).into_owned()
        });
        let netns = format!("/proc/{}/ns/net", std::process::id());
        let conf = format!(
            r#"{{"cniVersion":"1.0.0","name":"n","ipam":{{"type":"xdhcp","socketPath":"{}","timeout":"5s"}}}}"#,
            sock.display()
        );
        run_with(
            &[
                ("CNI_COMMAND", "ADD"),
                ("CNI_CONTAINERID", "c1"),
                ("CNI_NETNS", &netns),
                ("CNI_IFNAME", "eth0"),
            ],
            &conf,
        )
        .unwrap();
        let request = agent.join().unwrap();
        assert!(request.starts_with("POST /v1/cni/add "), "{request}");
        assert!(
            request.contains(&format!("\r\n{}: 20000\r\n", proto::HEADER_WAIT_MS)),
            "{request}"
        );
    }

    #[test]
    fn status_needs_1_1() {
        let e = run_with(
            &[("CNI_COMMAND", "STATUS")],
            r#"{"cniVersion":"1.0.0","name":"n","ipam":{"type":"xdhcp"}}"#,
        )
        .unwrap_err();
        assert_eq!(e.code, code::INCOMPATIBLE_VERSION);
    }

    #[test]
    fn malformed_config_names_the_field() {
        let netns = format!("/proc/{}/ns/net", std::process::id());
        let e = run_with(
            &[
                ("CNI_COMMAND", "ADD"),
                ("CNI_CONTAINERID", "c1"),
                ("CNI_NETNS", &netns),
                ("CNI_IFNAME", "eth0"),
            ],
            r#"{"cniVersion":"1.0.0","name":"n","ipam":{"type":"xdhcp","timeout":"forever"}}"#,
        )
        .unwrap_err();
        assert_eq!(e.code, code::INVALID_NETWORK_CONFIG);
        assert_eq!(
            e.msg,
            "ipam.timeout: must be a duration between 1s and 300s"
        );
    }

    #[test]
    fn upstream_default_socket_falls_back_to_xdhcps_own() {
        let ovnk = config::parse(
            br#"{"cniVersion":"1.1.0","name":"n","type":"ovn-k8s-cni-overlay","ipam":{"type":"dhcp"}}"#,
        )
        .unwrap();
        let only = |present: &'static str| move |p: &Path| p == Path::new(present);
        // The upstream socket served: used.
        assert_eq!(
            agent_socket(&ovnk, only(UPSTREAM_SOCKET)),
            Path::new(UPSTREAM_SOCKET)
        );
        // Only xdhcp's own: that one.
        assert_eq!(
            agent_socket(&ovnk, only(DEFAULT_SOCKET)),
            Path::new(DEFAULT_SOCKET)
        );
        // Neither: the upstream path, so the error names what the config meant.
        assert_eq!(agent_socket(&ovnk, |_| false), Path::new(UPSTREAM_SOCKET));
        // An xdhcp config, or another daemonSocketPath, never falls back.
        let own = config::parse(
            br#"{"cniVersion":"1.1.0","name":"n","ipam":{"type":"xdhcp","socketPath":"/run/cni/dhcp.sock"}}"#,
        )
        .unwrap();
        assert_eq!(
            agent_socket(&own, only(DEFAULT_SOCKET)),
            Path::new(UPSTREAM_SOCKET)
        );
        let other = config::parse(
            br#"{"cniVersion":"1.1.0","name":"n","ipam":{"type":"dhcp","daemonSocketPath":"/tmp/d.sock"}}"#,
        )
        .unwrap();
        assert_eq!(
            agent_socket(&other, only(DEFAULT_SOCKET)),
            Path::new("/tmp/d.sock")
        );
    }

    #[test]
    fn shim_waits_longer_than_the_agent() {
        let c = config::parse(
            br#"{"cniVersion":"1.0.0","name":"n","ipam":{"type":"xdhcp","timeout":"5s"}}"#,
        )
        .unwrap();
        assert_eq!(shim_timeout(&c), Duration::from_secs(20));
    }
}
