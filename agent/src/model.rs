//! Who an attachment is for, as the agent decides it at ADD and keeps it
//! for the lease's life (in memory and in the lease store).

use serde::{Deserialize, Serialize};

/// Pod or VM, as decided at ADD.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum WorkloadKind {
    /// Plain pod: the lease is maintained until DEL.
    Pod,
    /// `KubeVirt` VM: one-shot discovery, never configured, no RELEASE.
    Vm { vmi: String },
}

/// The pod an attachment belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
}

/// The node uplink that carried a lease's replies: where a RELEASE goes out
/// when the pod's own interface is gone at DEL.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UplinkRef {
    /// Interface name in the agent's namespace.
    pub ifname: String,
    /// The 802.1Q VLAN the replies carried there, if tagged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
}
