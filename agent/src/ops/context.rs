//! The agent's shared state, handed to every CNI operation.

use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use xdhcp_engine::ClientConfig;
use xdhcp_ovsdb::NodeState;

use crate::datapath::capture::Capture;
use crate::guard::GuardService;
use crate::kube::PodApi;
use crate::kube::node_pods::NodePods;
use crate::lease::pacing::Pacing;
use crate::lease::registry::Registry;
use crate::lease::task::Services;
use crate::metrics::{Health, Metrics};
use crate::rpc::UplinkSourceStatus;
use crate::settings::AgentArgs;

/// Shared agent state.
#[derive(Debug)]
pub(crate) struct Agent {
    pub(crate) args: AgentArgs,
    /// The engine configuration every client starts from (the agent's flags).
    pub(crate) base: ClientConfig,
    pub(crate) health: Arc<Health>,
    pub(crate) pod_api: PodApi,
    /// Metrics, capture, lease store and shutdown token, shared with the
    /// lease tasks.
    pub(crate) svc: Arc<Services>,
    pub(crate) leases: Arc<Registry>,
    /// The DHCP guard on workload ports.
    pub(crate) guard: Arc<GuardService>,
    /// How many new acquisitions each network admits at once.
    pub(crate) pacing: Pacing,
    /// Where the node uplinks come from (`--uplink` or Open vSwitch), as
    /// `xdhcp status` shows it; the daemon's OVS follower keeps it.
    pub(crate) uplink_source: Mutex<UplinkSourceStatus>,
    /// The node's Open vSwitch as the daemon's watch last read it (the
    /// workload ports an ADD without `CNI_ARGS` finds its pod by).
    pub(crate) node_ovs: watch::Receiver<NodeState>,
    /// The pods of this node, as the API watch keeps them (with the
    /// Kubernetes API only).
    pub(crate) node_pods: Option<NodePods>,
}

impl Agent {
    pub(crate) fn metrics(&self) -> &Metrics {
        &self.svc.metrics
    }

    pub(crate) fn capture(&self) -> &Arc<Capture> {
        &self.svc.capture
    }
}
