//! What the rest of the daemon sees of a running lease: its live view, the
//! commands it takes, and the outcome an ADD waits for.

use tokio::sync::oneshot;
use xdhcp_engine::{AcquireError, Lease, State};

use crate::datapath::capture::CapturePath;
use crate::datapath::link::LinkError;
use crate::lease::persist::{LeaseRecord, WorkloadKind};
use crate::rpc::LeaseView;
use crate::workload::MacAddr;

/// What ADD waits for.
#[derive(Debug)]
pub(crate) enum Outcome {
    Bound(Lease),
    Failed(AcquireError),
    /// The interface could not be used.
    LinkFailed(LinkError),
    /// The interface was deleted during the acquisition.
    Removed,
    /// Bound, but `"apply": true` could not configure the lease on the
    /// interface (a route there already, say); what was added is taken
    /// off again.
    ApplyFailed(std::sync::Arc<crate::netlink::NetlinkError>),
    /// The agent is shutting down.
    Cancelled,
}

/// Commands to a running lease task.
#[derive(Debug)]
pub(crate) enum Command {
    /// End the lease: RELEASE first when `release`; ack when done.
    Stop {
        release: bool,
        ack: oneshot::Sender<()>,
    },
}

/// Live, shared view of one attachment (for `leases`, `status`, CHECK).
#[derive(Debug, Clone)]
pub(crate) struct Live {
    pub(crate) record: LeaseRecord,
    pub(crate) state: State,
    pub(crate) capture: CapturePath,
    /// Expiry, wall clock ms.
    pub(crate) expires_unix_ms: Option<u64>,
}

impl Live {
    /// The view of a freshly known attachment.
    pub(crate) fn new(record: LeaseRecord, state: State, capture: CapturePath) -> Self {
        let expires_unix_ms = record.lease.as_ref().and_then(expiry_ms);
        Self {
            record,
            state,
            capture,
            expires_unix_ms,
        }
    }

    /// The `xdhcp leases` row.
    pub(crate) fn view(&self) -> LeaseView {
        let r = &self.record;
        LeaseView {
            container_id: r.container_id.clone(),
            ifname: r.ifname.clone(),
            pod: r
                .pod
                .as_ref()
                .map(|p| format!("{}/{}", p.namespace, p.name)),
            network: r.network.name.clone(),
            workload: match &r.workload {
                WorkloadKind::Pod => "pod".to_owned(),
                WorkloadKind::Vm { vmi } => format!("vm:{vmi}"),
            },
            mac: MacAddr(r.mac).to_string(),
            address: r.lease.as_ref().map(|l| crate::cni::types::Ipv4Cidr {
                addr: l.address,
                prefix_len: l.prefix_len,
            }),
            server: r.lease.as_ref().map(|l| l.server_id),
            state: if matches!(r.workload, WorkloadKind::Vm { .. }) && r.lease.is_some() {
                "OneShot".to_owned()
            } else {
                format!("{:?}", self.state)
            },
            path: self.capture.to_string(),
            expires_unix_ms: self.expires_unix_ms,
            pod_uid: r.pod.as_ref().and_then(|p| p.uid.clone()),
            nad: r.network.net_attach_def_name.clone(),
        }
    }

    /// Replace the lease (and its expiry).
    pub(crate) fn set_lease(&mut self, lease: Option<Lease>) {
        self.expires_unix_ms = lease.as_ref().and_then(expiry_ms);
        if lease.is_some() {
            self.record.requested = None;
        }
        self.record.lease = lease;
        self.record.updated_unix_ms = crate::sys::clock::now_unix_ms();
    }
}

/// Expiry of `lease` on the wall clock (None when infinite).
pub(crate) fn expiry_ms(lease: &Lease) -> Option<u64> {
    (!lease.is_infinite()).then(|| lease.acquired_unix_ms + lease.lease_time.as_millis() as u64)
}
