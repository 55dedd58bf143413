//! Why a CNI operation failed, typed. The agent socket maps each variant to
//! its CNI error code and message (`server.rs`), nowhere else.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use xdhcp_engine::{AcquireError, ConfigError};

use crate::cni::env::NetnsPathError;
use crate::datapath::link::LinkError;
use crate::kube::PodApiError;
use crate::kube::annotation::AnnotationError;
use crate::lease::acquire::Failure;
use crate::netlink::NetlinkError;
use crate::store::StoreError;
use crate::vfio::{PciAddr, VfioError};

/// Where a lease was being acquired, as the operator knows it.
#[derive(Debug, Clone)]
pub(crate) enum Place {
    /// A pod interface: `ifname` in `netns`.
    Pod { ifname: String, netns: PathBuf },
    /// The netdev of a passed-through VF during the VFIO handoff.
    VfNetdev { netdev: String },
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Place::Pod { ifname, netns } => write!(f, "interface {ifname} in {}", netns.display()),
            Place::VfNetdev { netdev } => write!(f, "VF netdev {netdev}"),
        }
    }
}

impl Error {
    /// The interface at `place` could not be opened: counted under the
    /// `interface` failure, and named.
    pub(crate) fn interface(
        metrics: &crate::metrics::Metrics,
        place: Place,
        source: LinkError,
    ) -> Self {
        metrics.failure("interface");
        Self::Interface { place, source }
    }

    /// An acquisition on `place` (of network `network`) that ended
    /// without a lease.
    pub(crate) fn acquisition(place: Place, network: &str, failure: Failure) -> Self {
        match failure {
            Failure::Config(source) => Self::ClientConfig { source },
            Failure::Config6(source) => Self::ClientConfig6 { source },
            Failure::NoLease6 { timeout, source } => Self::NoLease6 {
                place,
                timeout,
                source,
            },
            Failure::Queued { ahead, timeout } => Self::Queued {
                place,
                network: network.to_owned(),
                ahead,
                timeout,
            },
            Failure::Port(source) => Self::Interface { place, source },
            Failure::NoLease { timeout, source } => Self::NoLease {
                place,
                timeout,
                source: Box::new(source),
            },
            Failure::LinkFailed(source) => Self::LinkFailed { place, source },
            Failure::Cancelled => Self::ShuttingDown,
            Failure::Apply(source) => Self::Apply { place, source },
            Failure::Silent { timeout } => Self::Silent { place, timeout },
        }
    }
}

/// A failed ADD, DEL, CHECK or GC.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// `CNI_NETNS` is needed and was not given.
    #[error("CNI_NETNS is not set")]
    NoNetns,
    /// The annotation key cannot be formed from the config.
    #[error("netAttachDefName: {source}")]
    AnnotationKey {
        #[source]
        source: AnnotationError,
    },
    /// `cni.dev/valid-attachments` is required for GC.
    #[error("cni.dev/valid-attachments: missing (required for GC)")]
    NoValidAttachments,
    /// The engine refused the configuration the network asks for.
    #[error("invalid DHCP client configuration: {source}")]
    ClientConfig {
        #[source]
        source: ConfigError,
    },
    /// The v6 engine refused the configuration the network asks for.
    #[error("invalid DHCPv6 client configuration: {source}")]
    ClientConfig6 {
        #[source]
        source: xdhcp_engine::v6::ConfigError,
    },
    /// The Kubernetes API failed.
    #[error("{source}")]
    Kube {
        #[source]
        source: PodApiError,
    },
    /// The address was leased but not reported in `pod-networks` (the write
    /// failed, or the ADD went stale: pod recreated, sandbox gone); what
    /// became of the lease is part of the message.
    #[error("address {address} not reported: {source}; {fate}")]
    NotReported {
        address: IpAddr,
        fate: LeaseFate,
        #[source]
        source: Box<Error>,
    },
    /// The Kubernetes API did not answer within what was left of the ADD's
    /// deadline (a hung, overloaded or rate-limiting API server).
    #[error(
        "the Kubernetes API did not answer ({what}) within the ADD's deadline of {}s (the CNI plugin's wait)",
        deadline.as_secs()
    )]
    KubeDeadline { what: String, deadline: Duration },
    /// The interface cannot be opened or captured on.
    #[error("cannot use {place}")]
    Interface {
        place: Place,
        #[source]
        source: LinkError,
    },
    /// The VF's netdev could not be prepared for the discovery.
    #[error("VF {pci}: cannot {op} netdev {netdev} in the agent's namespace")]
    Netdev {
        pci: PciAddr,
        netdev: String,
        op: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// No lease within the acquisition deadline, and what was heard.
    #[error("no DHCP lease on {place} within {}s: {source}", timeout.as_secs())]
    NoLease {
        place: Place,
        timeout: Duration,
        #[source]
        source: Box<AcquireError>,
    },
    /// No `DHCPv6` lease within the acquisition deadline, and what was heard.
    #[error("no DHCPv6 lease on {place} within {}s: {source}", timeout.as_secs())]
    NoLease6 {
        place: Place,
        timeout: Duration,
        #[source]
        source: Box<xdhcp_engine::v6::AcquireError>,
    },
    /// The acquisition never got one of its network's slots by the
    /// deadline: the acquisitions ahead of it were slow or unanswered.
    #[error(
        "no DHCP lease on {place} within {}s: still waiting for one of network {network:?}'s acquisition slots ({ahead} ahead, in flight or queued: its DHCP server answers slowly or not at all)",
        timeout.as_secs()
    )]
    Queued {
        place: Place,
        network: String,
        ahead: usize,
        timeout: Duration,
    },
    /// Nothing answered by the deadline (or the task ended without a word).
    #[error("no DHCP lease on {place} within {}s: heard nothing", timeout.as_secs())]
    Silent { place: Place, timeout: Duration },
    /// The interface failed (or was deleted) during the acquisition.
    #[error("{place} failed during DHCP")]
    LinkFailed {
        place: Place,
        #[source]
        source: Option<LinkError>,
    },
    /// The agent is shutting down.
    #[error("the xdhcp agent is shutting down")]
    ShuttingDown,
    /// The request names something the agent must not act on.
    #[error("{source}")]
    Refused {
        #[source]
        source: Refusal,
    },
    /// The config's `deviceID` names no usable device.
    #[error("deviceID {device_id:?} of pod {pod}: {source}")]
    Device {
        device_id: String,
        pod: String,
        #[source]
        source: Box<VfioError>,
    },
    /// The VFIO driver handoff failed.
    #[error("VFIO handoff of {pci} for pod {pod}: {source}")]
    Handoff {
        pci: PciAddr,
        pod: String,
        #[source]
        source: Box<VfioError>,
    },
    /// The lease store failed.
    #[error("cannot {op} the lease record")]
    Store {
        op: &'static str,
        #[source]
        source: StoreError,
    },
    /// The first lease could not be recorded in the state directory (full,
    /// read-only, failing): the ADD fails rather than hand out a lease a
    /// restart would lose.
    #[error("cannot record the lease in the state directory {}: {reason}", dir.display())]
    Persist { dir: PathBuf, reason: String },
    /// `"apply": true` could not configure the lease (the lease was given
    /// back and what was configured taken off).
    #[error("could not configure the lease on {place}: {source}")]
    Apply {
        place: Place,
        #[source]
        source: std::sync::Arc<NetlinkError>,
    },
    /// CHECK while the lease is being acquired again.
    #[error("the lease on {ifname} is gone (state {state}); the agent is acquiring a new one")]
    LeaseGone { ifname: String, state: String },
    /// CHECK could not read the interface.
    #[error("cannot inspect {ifname}")]
    Inspect {
        ifname: String,
        #[source]
        source: NetlinkError,
    },
    /// CHECK found the address missing.
    #[error("address {address}/{prefix_len} is missing from {ifname} in {}", netns.display())]
    AddressMissing {
        address: std::net::IpAddr,
        prefix_len: u8,
        ifname: String,
        netns: PathBuf,
    },
}

/// What became of a lease whose address could not be reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LeaseFate {
    /// A pod's lease: RELEASE sent to the server (nobody would report or
    /// renew it otherwise).
    Released,
    /// A pod's lease another attachment on this node holds too (same MAC
    /// and address: a newer sandbox of the same pod); a RELEASE would take
    /// it from that one, so none is sent.
    Shared { container_id: String },
    /// A VM's lease: the binding belongs to the VM's identity, which the
    /// VM's next launcher pod asks for again; VM leases are never released.
    KeptForVm,
}

impl std::fmt::Display for LeaseFate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LeaseFate::Released => f.write_str("the lease was released at the DHCP server"),
            LeaseFate::Shared { container_id } => write!(
                f,
                "the lease was not released: container {container_id} on this node holds the same binding"
            ),
            LeaseFate::KeptForVm => f.write_str(
                "the VM's lease stays at the DHCP server for its next launcher pod (VM leases are never released)",
            ),
        }
    }
}

/// A request the agent refuses to act on.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refusal {
    /// `CNI_NETNS` is not a network namespace path (shape, or not nsfs).
    #[error("CNI_NETNS: {source}")]
    Netns {
        #[source]
        source: NetnsPathError,
    },
    /// `CNI_NETNS` names a namespace the agent must never configure.
    #[error(
        "CNI_NETNS {} is {which}; the agent acts only in pod network namespaces",
        path.display()
    )]
    ForbiddenNetns { path: PathBuf, which: &'static str },
    /// A pod's owner reference names a VMI with another UID than the VMI
    /// of that name has.
    #[error(
        "pod {pod} is owned by VirtualMachineInstance {vmi} with UID {owner_uid}, but {vmi} has UID {}; the pod is not that VM's",
        vmi_uid.as_deref().unwrap_or("(none)")
    )]
    NotTheVmisPod {
        pod: String,
        vmi: String,
        owner_uid: String,
        vmi_uid: Option<String>,
    },
    /// The VF the request names is a device plugin's, and not allocated to
    /// the pod being added.
    #[error(
        "deviceID {pci} is not allocated to pod UID {}: {why} (the kubelet's device checkpoint {})",
        pod_uid.as_deref().unwrap_or("(none given)"),
        checkpoint.display()
    )]
    NotThePodsDevice {
        pci: String,
        pod_uid: Option<String>,
        why: String,
        checkpoint: PathBuf,
    },
    /// The kubelet's device checkpoint exists but cannot be read.
    #[error("the kubelet's device checkpoint {}", path.display())]
    Checkpoint {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Open vSwitch shows the request's interface on a port of another
    /// sandbox: this ADD is a superseded (or torn-down) sandbox's.
    #[error(
        "stale sandbox: this ADD is for sandbox {container_id}, but Open vSwitch shows interface {ifname}'s port {port} for sandbox {sandbox}; refusing the superseded sandbox's ADD"
    )]
    StaleSandbox {
        container_id: String,
        ifname: String,
        port: String,
        sandbox: String,
    },
    /// The pod of that name now has another UID than the one its port was
    /// added for: the pod was recreated since.
    #[error(
        "stale sandbox: pod {pod} has UID {pod_uid}, but its port {port} was added for UID {port_uid} (the pod was recreated); refusing the old pod's ADD"
    )]
    RecreatedPod {
        pod: String,
        port: String,
        port_uid: String,
        pod_uid: String,
    },
    /// The port's logical port (`iface-id`) names no pod.
    #[error("Open vSwitch port {port}: external_ids:iface-id {iface_id:?} names no pod: {why}")]
    LogicalPort {
        port: String,
        iface_id: String,
        why: String,
    },
    /// The namespace could not be compared with the forbidden ones.
    #[error("CNI_NETNS {}: cannot read the namespace's identity", path.display())]
    NetnsIdentity {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}
