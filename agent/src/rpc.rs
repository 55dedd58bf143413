//! The agent-socket protocol shared by the daemon and the CNI shim.
//!
//! HTTP/1.1 with JSON bodies over the unix socket (`/run/xdhcp/xdhcp.sock`):
//!
//! | method + path            | body            | success body          |
//! |--------------------------|-----------------|-----------------------|
//! | `POST /v1/cni/add`       | [`CniRequest`]  | [`CniResult`]         |
//! | `POST /v1/cni/del`       | [`CniRequest`]  | `{}`                  |
//! | `POST /v1/cni/check`     | [`CniRequest`]  | `{}`                  |
//! | `POST /v1/cni/gc`        | [`GcRequest`]   | [`GcReply`]           |
//! | `GET  /v1/cni/status`    | –               | [`Readiness`]         |
//! | `GET  /v1/leases`        | –               | `Vec<LeaseView>`      |
//! | `GET  /v1/status`        | –               | [`AgentStatus`]       |
//!
//! Every failure is a non-2xx status with a [`CniError`] body, which the shim
//! prints unchanged: the agent decides codes and messages.
//!
//! [`Client`] is the thin client (hyper over a tokio `UnixStream`); it holds
//! no state beyond the socket path.

use std::collections::BTreeMap;
use std::io;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::cni::types::{CniError, Ipv4Cidr, code};

pub use crate::cni::types::CniResult;

pub use xdhcp_plugin::proto::{
    CniRequest, GcReply, GcRequest, PATH_ADD, PATH_CHECK, PATH_DEL, PATH_GC, PATH_READY, Readiness,
    format_chain,
};
/// `GET`: the lease table.
pub const PATH_LEASES: &str = "/v1/leases";
/// `GET`: agent status for `xdhcp status`.
pub const PATH_STATUS: &str = "/v1/status";

/// One row of `xdhcp leases`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseView {
    pub container_id: String,
    pub ifname: String,
    /// `<namespace>/<name>` when known.
    pub pod: Option<String>,
    pub network: String,
    /// `pod` or `vm:<vmi>`.
    pub workload: String,
    pub mac: String,
    pub address: Option<Ipv4Cidr>,
    pub server: Option<Ipv4Addr>,
    /// Engine state (`Bound`, `Renewing`, …) or `OneShot` for VM discoveries.
    pub state: String,
    /// The receive path serving the lease: `tc`, `xdp-native`, `xdp-generic`
    /// (the eBPF ring buffer), `af-packet`, `af-packet (ebpf pending)` or
    /// `af-packet (ebpf lost)`.
    #[serde(default)]
    pub path: String,
    /// Lease expiry, wall clock, milliseconds since the epoch.
    pub expires_unix_ms: Option<u64>,
}

/// Per-interface datapath view for `xdhcp status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceStatus {
    pub container_id: String,
    pub ifname: String,
    pub netns: Option<PathBuf>,
    /// `tc`, `xdp-native`, `xdp-generic` or `af-packet` (with what it waits
    /// for, or lost).
    pub attach: String,
    /// The kernel id of the BPF link capturing on the interface, when the
    /// attachment is one (`bpftool link show id N`).
    #[serde(default)]
    pub bpf_link: Option<u32>,
}

/// Tests only: break (`true`) or mend the agent's ring reader.
#[cfg(feature = "test-hooks")]
pub const PATH_TEST_READER_FAULT: &str = "/v1/test/reader-fault";

/// Body of [`PATH_TEST_READER_FAULT`].
#[cfg(feature = "test-hooks")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReaderFault {
    pub broken: bool,
}

/// `xdhcp status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    pub version: String,
    pub ready: bool,
    pub state_recovered: bool,
    /// `ebpf` or `af-packet` (what new leases use).
    pub datapath: String,
    /// Why the eBPF path is not in use, when it is not.
    pub datapath_note: Option<String>,
    /// Set while part of the kernel capture path is lost (its leases use
    /// `AF_PACKET` until it is restored), saying what.
    #[serde(default)]
    pub degraded: Option<String>,
    /// `kubernetes` or `embedded`.
    pub pod_api: String,
    pub socket: PathBuf,
    pub state_dir: PathBuf,
    pub leases: usize,
    pub interfaces: Vec<InterfaceStatus>,
    /// The node uplinks (`--uplink`), in flag order.
    #[serde(default)]
    pub uplinks: Vec<UplinkStatus>,
    /// Agent and kernel counters by name.
    pub counters: BTreeMap<String, u64>,
    /// Embedded mode: the pod-networks annotations written to the local store.
    pub annotations: serde_json::Value,
}

/// One uplink, as `xdhcp status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UplinkStatus {
    /// Interface name in the agent's namespace.
    pub ifname: String,
    /// The `physicalNetworkName` it carries, when given as `PHYSNET=IFACE`.
    pub physnet: Option<String>,
    /// `live`, `pending` (attaching), `lost` (absent or detached; retried),
    /// or `off` (no eBPF datapath).
    pub state: String,
    /// `tc`, `xdp-native` or `xdp-generic` while attached.
    pub mode: Option<String>,
    /// The uplink's ifindex while attached.
    pub ifindex: Option<u32>,
    /// The kernel id of the program's BPF link, while attached.
    pub bpf_link: Option<u32>,
    /// DHCP replies captured here and delivered to their lease.
    pub replies: u64,
}

/// Failure talking to the agent.
#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    #[error("cannot connect to the xdhcp agent at {}: {source}", socket.display())]
    Connect {
        socket: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the xdhcp agent at {} did not answer within {}s", socket.display(), after.as_secs())]
    Timeout { socket: PathBuf, after: Duration },
    #[error("HTTP exchange with the xdhcp agent at {} failed: {source}", socket.display())]
    Http {
        socket: PathBuf,
        #[source]
        source: hyper::Error,
    },
    #[error(
        "the xdhcp agent answered {status} with a body that is not JSON of the expected shape: {source}"
    )]
    Decode {
        status: StatusCode,
        #[source]
        source: serde_json::Error,
    },
    #[error(transparent)]
    Agent(#[from] CniError),
}

impl RpcError {
    /// The CNI error the shim prints for this failure: an agent error as is,
    /// everything else as "agent unreachable" naming the socket and what to do.
    pub fn into_cni(self) -> CniError {
        match self {
            Self::Agent(e) => e,
            Self::Connect { socket, source } => {
                let hint = xdhcp_plugin::proto::connect_hint(source.kind());
                CniError::new(
                    code::AGENT_UNREACHABLE,
                    format!("{hint} (socket {})", socket.display()),
                )
                .with_details(format_chain(&source))
            }
            e @ Self::Timeout { .. } => CniError::new(code::AGENT_UNREACHABLE, e.to_string()),
            // Go's net/rpc HTTP server (the upstream daemon) answers every
            // path but its own with a plain-text 404.
            e @ Self::Decode {
                status: StatusCode::NOT_FOUND,
                ..
            } => CniError::new(
                code::AGENT_UNREACHABLE,
                xdhcp_plugin::proto::NOT_XDHCP_DAEMON,
            )
            .with_details(format_chain(&e)),
            e @ (Self::Http { .. } | Self::Decode { .. }) => {
                CniError::new(code::AGENT_UNREACHABLE, "talking to the xdhcp agent failed")
                    .with_details(format_chain(&e))
            }
        }
    }
}

/// Thin HTTP/1.1 client of the agent socket. One connection per call.
#[derive(Debug, Clone)]
pub struct Client {
    socket: PathBuf,
    timeout: Duration,
}

impl Client {
    /// A client of the agent at `socket`; every call is bounded by `timeout`.
    pub fn new(socket: impl Into<PathBuf>, timeout: Duration) -> Self {
        Self {
            socket: socket.into(),
            timeout,
        }
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// `POST path` with a JSON body.
    pub async fn post<Q: Serialize, R: DeserializeOwned>(
        &self,
        path: &str,
        body: &Q,
    ) -> Result<R, RpcError> {
        let bytes = serde_json::to_vec(body).map_err(|source| RpcError::Decode {
            status: StatusCode::BAD_REQUEST,
            source,
        })?;
        self.call(Method::POST, path, Bytes::from(bytes)).await
    }

    /// `GET path`.
    pub async fn get<R: DeserializeOwned>(&self, path: &str) -> Result<R, RpcError> {
        self.call(Method::GET, path, Bytes::new()).await
    }

    async fn call<R: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Bytes,
    ) -> Result<R, RpcError> {
        match tokio::time::timeout(self.timeout, self.exchange(method, path, body)).await {
            Ok(r) => r,
            Err(_) => Err(RpcError::Timeout {
                socket: self.socket.clone(),
                after: self.timeout,
            }),
        }
    }

    async fn exchange<R: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Bytes,
    ) -> Result<R, RpcError> {
        let http = |source| RpcError::Http {
            socket: self.socket.clone(),
            source,
        };
        let stream = tokio::net::UnixStream::connect(&self.socket)
            .await
            .map_err(|source| RpcError::Connect {
                socket: self.socket.clone(),
                source,
            })?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(http)?;
        let conn = tokio::spawn(conn);
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, "xdhcp")
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .expect("static request parts are valid");
        let resp = sender.send_request(req).await.map_err(http)?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await.map_err(http)?.to_bytes();
        conn.abort();
        if status.is_success() {
            serde_json::from_slice(&bytes).map_err(|source| RpcError::Decode { status, source })
        } else {
            let e: CniError = serde_json::from_slice(&bytes)
                .map_err(|source| RpcError::Decode { status, source })?;
            Err(RpcError::Agent(e))
        }
    }
}

/// HTTP status the agent uses for a CNI error code.
pub fn status_for(code_: u32) -> StatusCode {
    match code_ {
        code::INCOMPATIBLE_VERSION
        | code::UNSUPPORTED_FIELD
        | code::INVALID_ENV
        | code::DECODE_FAILURE
        | code::INVALID_NETWORK_CONFIG => StatusCode::BAD_REQUEST,
        code::UNKNOWN_CONTAINER | code::CHECK_FAILED => StatusCode::NOT_FOUND,
        code::TRY_AGAIN_LATER | code::PLUGIN_NOT_AVAILABLE => StatusCode::SERVICE_UNAVAILABLE,
        code::DHCP_TIMEOUT => StatusCode::GATEWAY_TIMEOUT,
        code::KUBE_API | code::DHCP_FAILED => StatusCode::BAD_GATEWAY,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The upstream daemon (Go's `net/rpc` over HTTP) on the socket: every
    /// path but its own gets Go's plain-text 404, and the plugin says what
    /// is wrong instead of "not JSON".
    #[test]
    fn the_upstream_daemon_on_the_socket_is_named() {
        use std::io::{Read as _, Write as _};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dhcp.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf).unwrap();
            conn.write_all(
                b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain; charset=utf-8\r\n\
                  X-Content-Type-Options: nosniff\r\nContent-Length: 19\r\n\r\n404 page not found\n",
            )
            .unwrap();
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = Client::new(&path, Duration::from_secs(5));
        let e = rt
            .block_on(client.get::<Readiness>(PATH_READY))
            .unwrap_err()
            .into_cni();
        server.join().unwrap();
        assert_eq!(e.code, code::AGENT_UNREACHABLE);
        assert!(e.msg.contains("upstream dhcp daemon"), "{e}");
    }

    #[test]
    fn connect_errors_name_the_socket_and_the_fix() {
        let e = RpcError::Connect {
            socket: "/run/xdhcp/xdhcp.sock".into(),
            source: io::Error::from(io::ErrorKind::NotFound),
        }
        .into_cni();
        assert_eq!(e.code, code::AGENT_UNREACHABLE);
        assert!(e.msg.contains("not running"), "{e}");
        assert!(e.msg.contains("/run/xdhcp/xdhcp.sock"), "{e}");
        assert!(e.msg.contains("xdhcp agent"), "{e}");
        let e = RpcError::Connect {
            socket: "/s".into(),
            source: io::Error::from(io::ErrorKind::ConnectionRefused),
        }
        .into_cni();
        assert!(e.msg.contains("connection refused"), "{e}");
    }

    /// Fuzzing finding (target `rpc_request`): the socket accepted any
    /// container id and interface name, e.g. `"../x"` or an empty one, which
    /// the lease store then refuses to persist after the lease is bound.
    #[test]
    fn requests_with_an_unstorable_key_are_refused() {
        let config = r#"{"cniVersion":"1.0.0","name":"n","socketPath":"/s","ipam":{
            "ipamType":"xdhcp","apply":false,"clientId":{"kind":"mac"},
            "hostname":{"kind":"podname"},"allowDefaultRouteOverride":false,
            "protectedPrefixes":[],"routePriority":null}}"#;
        let body = |id: &str, ifname: &str| {
            format!(
                r#"{{"containerId":{id:?},"ifname":{ifname:?},"netns":null,"args":{{}},"config":{config}}}"#
            )
        };
        let ok: CniRequest = serde_json::from_str(&body("c1", "net1")).unwrap();
        assert_eq!(ok.container_id, "c1");
        for (id, ifname) in [("../x", "net1"), ("", "net1"), ("c1", "a/b"), ("c1", "")] {
            let e = serde_json::from_str::<CniRequest>(&body(id, ifname)).unwrap_err();
            assert!(e.to_string().contains("invalid"), "{id:?}/{ifname:?}: {e}");
        }
    }

    #[test]
    fn agent_errors_pass_through() {
        let inner = CniError::new(code::DHCP_TIMEOUT, "no lease on eth0");
        assert_eq!(RpcError::Agent(inner.clone()).into_cni(), inner);
        assert_eq!(status_for(code::DHCP_TIMEOUT), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(
            status_for(code::INVALID_NETWORK_CONFIG),
            StatusCode::BAD_REQUEST
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn missing_socket_is_a_connect_error() {
        let dir = tempfile::tempdir().unwrap();
        let c = Client::new(dir.path().join("none.sock"), Duration::from_secs(2));
        let e = c.get::<Readiness>(PATH_READY).await.unwrap_err();
        assert!(matches!(e, RpcError::Connect { .. }), "{e}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn silent_agent_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mute.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        // Accept and never answer.
        let _keep = tokio::spawn(async move {
            let (_s, _) = listener.accept().await.unwrap();
            std::future::pending::<()>().await;
        });
        let c = Client::new(&path, Duration::from_millis(200));
        let e = c.get::<Readiness>(PATH_READY).await.unwrap_err();
        assert!(matches!(e, RpcError::Timeout { .. }), "{e}");
        assert_eq!(e.into_cni().code, code::AGENT_UNREACHABLE);
    }
}
