//! xdhcp as the drop-in OVN-Kubernetes expects: the binary installed as
//! `dhcp`, its daemon started as `dhcp daemon` (bare, and with the upstream
//! daemon's flags), and the plugin exec'd exactly as ovnkube-node execs it
//! for a pod on a localnet network with DHCP IPAM — the same config bytes
//! (`{"cniVersion":"1.1.0","ipam":{"type":"dhcp"},"name":…,"type":"ovn-k8s-cni-overlay"}`,
//! Go's `json.Marshal` of its map), `CNI_COMMAND`, `CNI_CONTAINERID`,
//! `CNI_NETNS`, `CNI_IFNAME`, `CNI_PATH` and an empty `CNI_ARGS` — against
//! dnsmasq in namespaces. Like OVN-Kubernetes, the test applies the address
//! and routes of the result itself. DEL must release the lease at the server.
//!
//! The bare daemon serves the real `/run/cni/dhcp.sock` (that is what
//! "bare" means); its state directory and bpffs are the test's own (a
//! private mount namespace binds them over `/var/lib` and `/sys/fs/bpf`).
//! When something else already serves `/run/cni/dhcp.sock` on this machine,
//! that test says so and does nothing.

mod agent_support;

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use agent_support::{CniPath, xdhcp_bin};
use serde_json::{Value, json};
use xdhcp_tests::{
    Dnsmasq, DnsmasqConfig, Lab, LabClient, PluginCall, PluginOutput, Process, program, wait_until,
};

/// The network name in the NAD.
const NETWORK: &str = "ovnk-localnet";
/// The upstream daemon's default socket, which a bare `dhcp daemon` serves.
const UPSTREAM_SOCKET: &str = "/run/cni/dhcp.sock";

/// What ovnkube-node writes on the plugin's stdin (`buildDHCPConf`, keys
/// sorted as Go's `json.Marshal` sorts a map's).
fn ovnk_config() -> String {
    format!(
        r#"{{"cniVersion":"1.1.0","ipam":{{"type":"dhcp"}},"name":"{NETWORK}","type":"ovn-k8s-cni-overlay"}}"#
    )
}

/// The same with the upstream `ipam.daemonSocketPath`, for a daemon on
/// another socket.
fn ovnk_config_with_socket(socket: &Path) -> String {
    format!(
        r#"{{"cniVersion":"1.1.0","ipam":{{"daemonSocketPath":"{}","type":"dhcp"}},"name":"{NETWORK}","type":"ovn-k8s-cni-overlay"}}"#,
        socket.display()
    )
}

/// dnsmasq with option 121: one on-link route (router 0.0.0.0), one via a
/// router.
fn dnsmasq(lab: &Lab) -> Dnsmasq {
    Dnsmasq::start(
        &lab.server,
        DnsmasqConfig {
            extra_args: vec![
                "--dhcp-option=121,198.51.100.0/24,0.0.0.0,203.0.113.0/24,192.0.2.1".to_owned(),
            ],
            ..DnsmasqConfig::default()
        },
    )
}

/// Exec the plugin as ovnkube-node does (`invoke.ExecPluginWithResult`):
/// `CNI_ARGS` empty, no pod name or namespace anywhere.
fn ovnk_exec(cni: &CniPath, command: &str, id: &str, c: &LabClient, config: &str) -> PluginOutput {
    PluginCall {
        plugin: &cni.plugin("dhcp"),
        node_ns: None,
        command,
        container_id: id,
        netns: Some(c.ns.path()),
        ifname: &c.ifname,
        cni_path: cni.dir.path(),
        cni_args: "",
        config,
    }
    .run()
    .expect("run the dhcp plugin")
}

/// A daemon process and its log.
struct Daemon {
    process: Process,
    log: PathBuf,
}

impl Daemon {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM; the daemon must stop on it within the grace period.
    fn stop(&mut self) {
        assert!(
            self.process.stop(Duration::from_secs(15)),
            "dhcp daemon did not stop on SIGTERM:\n{}",
            self.log()
        );
    }
}

/// Wait for `socket` to accept connections.
fn wait_serving(socket: &Path, daemon: &Daemon) {
    assert!(
        wait_until(Duration::from_secs(30), || {
            std::os::unix::net::UnixStream::connect(socket).is_ok()
        }),
        "nothing serves {}:\n{}",
        socket.display(),
        daemon.log()
    );
}

/// What the daemon must do for OVN-Kubernetes, on `config`: ADD (the test
/// applies the result), a repeated ADD, CHECK, STATUS, DEL (released at the
/// server), a repeated DEL, DEL and CHECK of an attachment it never leased.
fn ovnk_pod_cycle(
    cni: &CniPath,
    lab: &Lab,
    server: &Dnsmasq,
    daemon: &Daemon,
    socket: &Path,
    config: &str,
) {
    let c = &lab.clients[0];
    let sandbox = "0f3c2a7d9e1b4c5a8f6e7d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b2a";

    // STATUS (CNI 1.1.0): the daemon is ready.
    let st = ovnk_exec(cni, "STATUS", "", c, config);
    assert!(st.ok, "STATUS: {}\n{}", st.text(), daemon.log());
    assert_eq!(st.stdout.trim(), "", "STATUS prints nothing on success");

    // ADD: a 1.1.0 result with the lease, on-link routes with scope link.
    let add = ovnk_exec(cni, "ADD", sandbox, c, config);
    assert!(add.ok, "ADD: {}\n{}", add.text(), daemon.log());
    let r = &add.json;
    assert_eq!(r["cniVersion"], "1.1.0", "{r}");
    let cidr = r["ips"][0]["address"].as_str().expect("ips[0].address");
    let (ip, len) = cidr.split_once('/').expect("a CIDR");
    let ip: Ipv4Addr = ip.parse().unwrap();
    assert_eq!(len, "24", "{r}");
    let routes = r["routes"].as_array().expect("routes").clone();
    assert!(
        routes.contains(&json!({"dst": "198.51.100.0/24", "scope": 253})),
        "on-link option-121 route with scope link (RT_SCOPE_LINK): {r}"
    );
    assert!(
        routes.contains(&json!({"dst": "203.0.113.0/24", "gw": "192.0.2.1"})),
        "{r}"
    );
    let lease = server.lease_for(c.mac).expect("dnsmasq holds the lease");
    assert_eq!(lease.ip, ip);
    // Keyed by container id and interface, no pod known, and nothing
    // written for the API (the embedded store holds no pod).
    let rows = leases(socket);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["containerId"], sandbox);
    assert_eq!(rows[0]["ifname"], c.ifname.as_str());
    assert_eq!(rows[0]["pod"], Value::Null);
    let s = status(socket);
    assert_eq!(s["annotations"]["pods"], json!({}), "{s}");

    // OVN-Kubernetes applies the result itself (`applyDHCPResultInNS`):
    // the address, then each route as given, honouring its scope.
    c.ns.ip(&["addr", "add", cidr, "dev", &c.ifname]);
    for route in &routes {
        let dst = route["dst"].as_str().unwrap();
        let mut args = vec!["route", "add", dst, "dev", c.ifname.as_str()];
        if let Some(gw) = route["gw"].as_str() {
            args.extend(["via", gw]);
        }
        if route["scope"] == 253 {
            args.extend(["scope", "link"]);
        }
        c.ns.ip(&args);
    }
    let table = c.ns.routes();
    assert!(
        table.contains("198.51.100.0/24 dev eth0 scope link"),
        "{table}"
    );

    // A repeated ADD (sandbox retried) answers the same lease.
    let again = ovnk_exec(cni, "ADD", sandbox, c, config);
    assert!(again.ok, "repeated ADD: {}", again.text());
    assert_eq!(again.json["ips"], r["ips"]);

    // GC keeps what the runtime lists, ignores listed attachments it never
    // leased, and leaves other networks' calls alone.
    let gc_config = |network: &str, valid: &[&str]| {
        let mut v: Value = serde_json::from_str(config).unwrap();
        v["name"] = network.into();
        v["cni.dev/valid-attachments"] = valid
            .iter()
            .map(|id| json!({"containerID": id, "ifname": c.ifname}))
            .collect();
        v.to_string()
    };
    let unknown = "9a8b7c6d5e4f30211f2e3d4c5b6a79880a1b2c3d4e5f60718293a4b5c6d7e8f9";
    for conf in [
        gc_config(NETWORK, &[sandbox, unknown]),
        gc_config("another-network", &[]),
    ] {
        let gc = ovnk_exec(cni, "GC", "", c, &conf);
        assert!(gc.ok, "GC {conf}: {}\n{}", gc.text(), daemon.log());
    }
    assert_eq!(leases(socket).len(), 1, "GC dropped a listed lease");
    assert!(server.lease_for(c.mac).is_some());

    // CHECK passes with the lease held.
    let check = ovnk_exec(cni, "CHECK", sandbox, c, config);
    assert!(check.ok, "CHECK: {}\n{}", check.text(), daemon.log());

    // DEL releases the lease at the server; a repeated DEL is fine.
    let del = ovnk_exec(cni, "DEL", sandbox, c, config);
    assert!(del.ok, "DEL: {}\n{}", del.text(), daemon.log());
    assert!(
        wait_until(Duration::from_secs(10), || server
            .lease_for(c.mac)
            .is_none()),
        "dnsmasq still holds the lease after DEL:\n{}\ndaemon:\n{}",
        server.log(),
        daemon.log()
    );
    assert!(server.log().contains("DHCPRELEASE"), "{}", server.log());
    let del = ovnk_exec(cni, "DEL", sandbox, c, config);
    assert!(del.ok, "repeated DEL: {}", del.text());

    // An attachment leased before xdhcp took over (never seen here): DEL
    // and CHECK succeed, with a log line saying why.
    let upstream_era = "5e1a0b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8";
    for cmd in ["CHECK", "DEL"] {
        let out = ovnk_exec(cni, cmd, upstream_era, c, config);
        assert!(out.ok, "{cmd} of an unknown attachment: {}", out.text());
        assert_eq!(out.stdout.trim(), "", "{cmd}");
    }
    assert!(
        wait_until(Duration::from_secs(5), || {
            let log = daemon.log();
            log.contains("CHECK for an attachment xdhcp holds no lease for")
                && log.contains("DEL for an attachment xdhcp holds no lease for")
        }),
        "{}",
        daemon.log()
    );
}

/// `xdhcp leases --json` rows of the daemon on `socket`.
fn leases(socket: &Path) -> Vec<Value> {
    let out = Command::new(xdhcp_bin())
        .args(["leases", "--json", "--socket"])
        .arg(socket)
        .env_remove("CNI_COMMAND")
        .output()
        .expect("run xdhcp leases");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("leases JSON")
}

/// `xdhcp status --json` of the daemon on `socket`.
fn status(socket: &Path) -> Value {
    let out = Command::new(xdhcp_bin())
        .args(["status", "--json", "--socket"])
        .arg(socket)
        .env_remove("CNI_COMMAND")
        .output()
        .expect("run xdhcp status");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("status JSON")
}

#[test]
fn dhcp_daemon_with_the_upstream_flags_serves_ovn_kubernetes() {
    let lab = Lab::with_clients(1);
    let server = dnsmasq(&lab);
    let cni = CniPath::new();
    let dir = tempfile::Builder::new()
        .prefix("xdt-ovnk-")
        .tempdir()
        .unwrap();
    let host = dir.path().join("host");
    // -hostprefix: the daemon serves <prefix>/run/cni/dhcp.sock and opens
    // <prefix>/var/run/netns/…; here the prefix's netns directory leads to
    // the real one.
    std::fs::create_dir_all(host.join("var/run")).unwrap();
    std::os::unix::fs::symlink("/var/run/netns", host.join("var/run/netns")).unwrap();
    let pidfile = dir.path().join("dhcp.pid");
    let log = dir.path().join("daemon.log");
    let own_socket = dir.path().join("xdhcp.sock");

    // How DaemonSets start the upstream daemon, plus the xdhcp flags that
    // keep this test's state to itself.
    let mut cmd = Command::new(cni.plugin("dhcp"));
    cmd.arg("daemon")
        .arg("-hostprefix")
        .arg(&host)
        .arg(format!("-pidfile={}", pidfile.display()))
        .args([
            "-broadcast",
            "-timeout",
            "2s",
            "-resendmax=8s",
            "--resendtimeout",
            "20s",
        ])
        .args(["--kube", "off", "--state-dir"])
        .arg(dir.path().join("state"))
        .arg("--bpffs-dir")
        .arg(dir.path().join("bpffs"))
        // xdhcp's own socket beside the upstream one, as the DaemonSet has it.
        .arg("--extra-socket")
        .arg(&own_socket)
        .env("RUST_LOG", "info,xdhcp=debug")
        .env("HOME", dir.path())
        .env_remove("KUBECONFIG")
        // `daemon` wins over CNI_COMMAND, as with the upstream binary.
        .env("CNI_COMMAND", "ADD");
    let mut daemon = Daemon {
        process: Process::spawn_logged("dhcp daemon", cmd, &log),
        log,
    };
    let socket = host.join("run/cni/dhcp.sock");
    wait_serving(&socket, &daemon);
    wait_serving(&own_socket, &daemon);
    // Written once the sockets are bound: a socket takes connections from
    // its bind on, so the file (and its content) may come a moment after.
    let written = || {
        std::fs::read_to_string(&pidfile)
            .is_ok_and(|p| !p.is_empty() && p.trim().parse::<u32>().is_ok())
    };
    assert!(
        wait_until(Duration::from_secs(10), written),
        "no pid file at {}:\n{}",
        pidfile.display(),
        daemon.log()
    );
    let pid = std::fs::read_to_string(&pidfile).expect("the pid file");
    assert_eq!(Some(pid.trim().parse().unwrap()), daemon.process.pid());

    let config = ovnk_config_with_socket(&socket);
    ovnk_pod_cycle(&cni, &lab, &server, &daemon, &socket, &config);

    // -broadcast took effect: the lease was asked for with the BROADCAST
    // flag, so dnsmasq broadcast its replies.
    assert!(
        server.log().contains("broadcast response"),
        "dnsmasq saw no BROADCAST flag:\n{}",
        server.log()
    );
    assert!(leases(&socket).is_empty());
    assert_eq!(status(&own_socket)["ready"], true);

    daemon.stop();
    assert!(!socket.exists(), "socket left behind");
    assert!(!own_socket.exists(), "extra socket left behind");
    assert!(!pidfile.exists(), "pid file left behind");
}

/// Removes the upstream socket, and `/run/cni` unless it existed before.
struct RestoreRunCni {
    existed: bool,
}

impl Drop for RestoreRunCni {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(UPSTREAM_SOCKET);
        if !self.existed
            && let Some(dir) = Path::new(UPSTREAM_SOCKET).parent()
        {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

#[test]
fn bare_dhcp_daemon_serves_ovn_kubernetes_on_the_upstream_socket() {
    let socket = Path::new(UPSTREAM_SOCKET);
    if socket.exists() {
        #[expect(clippy::print_stderr, reason = "a skipped test says why")]
        {
            eprintln!(
                "skipped: {UPSTREAM_SOCKET} exists (another daemon may serve it); a bare `dhcp daemon` would take it"
            );
        }
        return;
    }
    // Created before the daemon, so the daemon's mount namespace has it.
    let lab = Lab::with_clients(1);
    let server = dnsmasq(&lab);
    let cni = CniPath::new();
    let dir = tempfile::Builder::new()
        .prefix("xdt-ovnk-bare-")
        .tempdir()
        .unwrap();
    let var_lib = dir.path().join("var-lib");
    let bpffs = dir.path().join("bpffs");
    std::fs::create_dir_all(&var_lib).unwrap();
    std::fs::create_dir_all(&bpffs).unwrap();
    let run_cni_existed = socket.parent().is_some_and(Path::exists);
    let log = dir.path().join("daemon.log");

    // `dhcp daemon` and nothing else, as OVN-Kubernetes' e2e starts it. Its
    // default state dir (/var/lib/xdhcp) and bpffs (/sys/fs/bpf/xdhcp) are
    // the test's directories, bound over /var/lib and /sys/fs/bpf in a
    // mount namespace of its own; the socket is the host's.
    let mut cmd = Command::new(program("unshare"));
    cmd.args(["--mount", "--propagation", "slave", "--"])
        .arg(program("sh"))
        .args([
            "-ec",
            r#""$1" --bind "$2" /var/lib && "$1" --bind "$3" /sys/fs/bpf && exec "$4" daemon"#,
            "sh",
        ])
        .arg(program("mount"))
        .arg(&var_lib)
        .arg(&bpffs)
        .arg(cni.plugin("dhcp"))
        .env("RUST_LOG", "info,xdhcp=debug")
        .env("HOME", dir.path())
        .env_remove("KUBECONFIG")
        .env_remove("CNI_COMMAND");
    let mut daemon = Daemon {
        process: Process::spawn_logged("dhcp daemon (bare)", cmd, &log),
        log,
    };
    // Whatever happens below, leave /run/cni as it was.
    let _restore = RestoreRunCni {
        existed: run_cni_existed,
    };
    wait_serving(socket, &daemon);

    ovnk_pod_cycle(&cni, &lab, &server, &daemon, socket, &ovnk_config());
    let s = status(socket);
    assert_eq!(s["stateDir"], "/var/lib/xdhcp", "{s}");
    // The daemon's state went to the test's directory, not the host's.
    assert!(var_lib.join("xdhcp").is_dir(), "{}", daemon.log());

    daemon.stop();
    assert!(!socket.exists(), "socket left behind");
}

#[test]
fn dhcp_without_a_command_says_what_it_is_and_an_unknown_daemon_flag_is_refused() {
    let cni = CniPath::new();
    let about = Command::new(cni.plugin("dhcp"))
        .env_remove("CNI_COMMAND")
        .output()
        .unwrap();
    assert!(about.status.success(), "{about:?}");
    let text = String::from_utf8_lossy(&about.stderr);
    assert!(text.starts_with("CNI dhcp plugin"), "{text}");
    assert!(text.contains("1.1.0"), "{text}");

    let bad = Command::new(cni.plugin("dhcp"))
        .args(["daemon", "-socketpath", "/tmp/x.sock", "-bogus"])
        .env_remove("CNI_COMMAND")
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    let text = String::from_utf8_lossy(&bad.stderr);
    assert!(
        text.contains("flag provided but not defined: -bogus"),
        "{text}"
    );
    assert!(!Path::new("/tmp/x.sock").exists());

    let help = Command::new(cni.plugin("dhcp"))
        .args(["daemon", "-h"])
        .env_remove("CNI_COMMAND")
        .output()
        .unwrap();
    assert!(help.status.success());
    let text = String::from_utf8_lossy(&help.stderr);
    for flag in [
        "-socketpath",
        "-hostprefix",
        "-pidfile",
        "-broadcast",
        "-timeout",
        "-resendmax",
        "-resendtimeout",
    ] {
        assert!(text.contains(flag), "{flag} missing from:\n{text}");
    }
}
