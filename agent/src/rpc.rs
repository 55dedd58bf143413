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
//! The wire types, the view types and the one client ([`Client`], blocking)
//! live in the protocol crate (`xdhcp-plugin`), shared with the thin plugin
//! binary; this module names them for the agent and adds the server's one
//! decision, the HTTP status of a CNI error code.

use axum::http::StatusCode;

use crate::cni::types::code;

pub use crate::cni::types::{CniError, CniResult};
pub use xdhcp_plugin::client::{Client, ClientError};
pub use xdhcp_plugin::error_chain::format_chain;
pub use xdhcp_plugin::proto::{
    CniRequest, GcReply, GcRequest, HEADER_WAIT_MS, PATH_ADD, PATH_CHECK, PATH_DEL, PATH_GC,
    PATH_READY, Readiness,
};
pub use xdhcp_plugin::views::{
    AgentStatus, GuardedPortStatus, InterfaceStatus, LeaseView, PATH_LEASES, PATH_STATUS,
    PortCaptureStatus, UplinkSourceStatus, UplinkStatus,
};

/// Tests only: break (`true`) or mend the agent's ring reader.
#[cfg(feature = "test-hooks")]
pub const PATH_TEST_READER_FAULT: &str = "/v1/test/reader-fault";

/// Body of [`PATH_TEST_READER_FAULT`].
#[cfg(feature = "test-hooks")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReaderFault {
    pub broken: bool,
}

/// Tests only: stall (`true`) the agent's ring reader, so the ring fills
/// and stays full, or let it read again.
#[cfg(feature = "test-hooks")]
pub const PATH_TEST_READER_STALL: &str = "/v1/test/reader-stall";

/// Body of [`PATH_TEST_READER_STALL`].
#[cfg(feature = "test-hooks")]
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReaderStall {
    pub stalled: bool,
    /// Transaction ids the kernel owns (on any interface) while the reader
    /// is stalled, and disowns when it reads again: replies carrying them
    /// are copied into the ring, so a test can fill it (the programs copy
    /// no reply whose xid no lease owns).
    #[serde(default)]
    pub owned_xids: Vec<u32>,
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
}
