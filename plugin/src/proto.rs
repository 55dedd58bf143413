//! The plugin's side of the agent-socket protocol: paths and bodies.
//!
//! HTTP/1.1 with JSON bodies over the unix socket (`/run/xdhcp/xdhcp.sock`);
//! the agent serves it (its `rpc` module has the whole table, these are the
//! CNI calls). Every failure is a non-2xx status with a [`CniError`] body,
//! which the plugin prints unchanged: the agent decides codes and messages.

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::config::{Attachment, NetworkConfig};
use crate::env::{validate_container_id, validate_ifname};

/// `POST`: CNI ADD.
pub const PATH_ADD: &str = "/v1/cni/add";
/// `POST`: CNI DEL.
pub const PATH_DEL: &str = "/v1/cni/del";
/// `POST`: CNI CHECK.
pub const PATH_CHECK: &str = "/v1/cni/check";
/// `POST`: CNI GC.
pub const PATH_GC: &str = "/v1/cni/gc";
/// `GET`: CNI STATUS (is the agent ready for ADDs?).
pub const PATH_READY: &str = "/v1/cni/status";

/// ADD: how long the caller waits for the answer, in whole milliseconds
/// from sending the request. The plugin sends its own wait (the
/// configured DHCP timeout plus a margin); the agent answers a little
/// before it, so the runtime always hears the outcome. Without it the agent
/// takes a deadline from the request's acquisition timeout (and its own
/// default) instead.
pub const HEADER_WAIT_MS: &str = "xdhcp-wait-ms";

/// ADD, DEL and CHECK: the validated CNI invocation.
///
/// Decoding checks that `container_id` and `ifname` form a lease-store key
/// (what the plugin's environment checks guarantee): the agent must never
/// answer an ADD for an attachment whose lease it cannot persist.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", try_from = "CniRequestWire")]
pub struct CniRequest {
    /// `CNI_CONTAINERID` (validated as a store key).
    pub container_id: String,
    /// `CNI_IFNAME` (validated Linux name).
    pub ifname: String,
    /// `CNI_NETNS`; `None` only for a DEL whose namespace is gone.
    pub netns: Option<PathBuf>,
    /// `CNI_ARGS` (`K8S_POD_NAMESPACE`, `K8S_POD_NAME`, `K8S_POD_UID`, …).
    pub args: BTreeMap<String, String>,
    /// The validated network configuration.
    pub config: NetworkConfig,
}

/// [`CniRequest`] as it arrives, before its key is checked.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CniRequestWire {
    container_id: String,
    ifname: String,
    netns: Option<PathBuf>,
    args: BTreeMap<String, String>,
    config: NetworkConfig,
}

/// A request whose container id or interface name is no lease-store key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("invalid container id {value:?}")]
    ContainerId { value: String },
    #[error("invalid interface name {value:?}")]
    Ifname { value: String },
}

impl TryFrom<CniRequestWire> for CniRequest {
    type Error = KeyError;

    fn try_from(w: CniRequestWire) -> Result<Self, Self::Error> {
        if validate_container_id(&w.container_id).is_err() {
            return Err(KeyError::ContainerId {
                value: w.container_id,
            });
        }
        if validate_ifname(&w.ifname).is_err() {
            return Err(KeyError::Ifname { value: w.ifname });
        }
        Ok(Self {
            container_id: w.container_id,
            ifname: w.ifname,
            netns: w.netns,
            args: w.args,
            config: w.config,
        })
    }
}

impl CniRequest {
    /// `<namespace>/<name>` of the pod from `CNI_ARGS`, if both are present.
    pub fn pod(&self) -> Option<(&str, &str)> {
        Some((
            self.args.get("K8S_POD_NAMESPACE")?.as_str(),
            self.args.get("K8S_POD_NAME")?.as_str(),
        ))
    }
}

/// GC: the network and its valid attachments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcRequest {
    pub config: NetworkConfig,
}

/// What GC did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcReply {
    /// Attachments whose leases were dropped.
    pub removed: Vec<Attachment>,
}

/// STATUS: readiness for new ADDs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Readiness {
    pub ready: bool,
    /// Why not ready (empty when ready).
    #[serde(default)]
    pub reason: String,
}

/// What the plugin tells the operator when it cannot connect to the socket.
pub fn connect_hint(kind: io::ErrorKind) -> &'static str {
    match kind {
        io::ErrorKind::NotFound => {
            "the xdhcp agent is not running (no socket); start it with `xdhcp agent` or check the xdhcp DaemonSet"
        }
        io::ErrorKind::ConnectionRefused => {
            "the xdhcp agent is not running (stale socket, connection refused); start it with `xdhcp agent`"
        }
        io::ErrorKind::PermissionDenied => {
            "permission denied on the agent socket; the plugin must run as root"
        }
        _ => "the xdhcp agent is not reachable",
    }
}

/// What the plugin says when the daemon on the socket answers 404 with a
/// body that is not a CNI error: Go's `net/rpc` HTTP server (the upstream
/// daemon) answers every path but its own that way.
pub const NOT_XDHCP_DAEMON: &str = "the daemon on the socket does not speak the xdhcp agent's protocol; is the upstream dhcp daemon still serving it? Stop it and run `dhcp daemon` (or the xdhcp DaemonSet) instead";
