//! What the agent socket's read-only calls answer, as the operator
//! commands (`xdhcp leases`, `xdhcp status`) print it: the lease table, the
//! agent's status, its interfaces and uplinks. Shared by the agent (which
//! fills them) and every client of the socket.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::types::{Ipv4Cidr, Ipv6Cidr};

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
    /// `ipv4` or `ipv6`: the lease's family (a dual-stack attachment has
    /// a row of each; absent from an agent that predates IPv6: read as
    /// empty).
    #[serde(default)]
    pub family: String,
    /// The `DHCPv6` address, with the network's prefix length (else /128).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address6: Option<Ipv6Cidr>,
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
    /// The pod's UID, when known (`CNI_ARGS`, or the port's `iface-id-ver`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// The NetworkAttachmentDefinition (`<namespace>/<name>`), when the
    /// network's configuration or its Open vSwitch port names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nad: Option<String>,
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
    /// The leases by family (`ipv4`, `ipv6`): a dual-stack attachment
    /// holds one of each.
    #[serde(default)]
    pub leases_by_family: BTreeMap<String, usize>,
    pub interfaces: Vec<InterfaceStatus>,
    /// The node uplinks: the `--uplink` flags in their order, or those
    /// read from Open vSwitch.
    #[serde(default)]
    pub uplinks: Vec<UplinkStatus>,
    /// Where the uplinks come from, and whether that source answers.
    #[serde(default)]
    pub uplink_source: UplinkSourceStatus,
    /// The workload ports the DHCP guard is on, with where each one's
    /// identity came from.
    #[serde(default)]
    pub guarded_ports: Vec<GuardedPortStatus>,
    /// With no uplink: the workload ports found in Open vSwitch whose
    /// replies are captured on their host side, before (and without) an
    /// ADD.
    #[serde(default)]
    pub port_captures: Vec<PortCaptureStatus>,
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
    /// The `physicalNetworkName` it carries (`PHYSNET=IFACE`, or the
    /// `ovn-bridge-mappings` entry it was read from).
    pub physnet: Option<String>,
    /// The OVS bridge it is a port of, when read from Open vSwitch.
    #[serde(default)]
    pub bridge: Option<String>,
    /// Where the agent learnt of it: `flag` (`--uplink`) or `ovs`.
    #[serde(default)]
    pub source: String,
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

/// One workload port the DHCP guard is on, as `xdhcp status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GuardedPortStatus {
    /// The port's host interface (in the agent's namespace).
    pub port: String,
    /// Where the port's identity came from: `ovs` (found in the Open
    /// vSwitch database before, or without, a CNI ADD), `cni` (an ADD), or
    /// `both`.
    pub identity: String,
    /// The attachment: the CNI container (sandbox) id and the interface
    /// in the pod, as the ADD gave them or OVS names them (`sandbox`,
    /// `pod-if-name`).
    pub container_id: String,
    pub ifname: String,
    /// From OVS: `k8s.ovn.org/network`, `k8s.ovn.org/nad`, `iface-id-ver`
    /// (the pod UID), `attached_mac`, `vf-netdev-name`, `vf-is-vfio`.
    #[serde(default)]
    pub network: Option<String>,
    #[serde(default)]
    pub nad: Option<String>,
    #[serde(default)]
    pub pod_uid: Option<String>,
    #[serde(default)]
    pub mac: Option<String>,
    #[serde(default)]
    pub vf_netdev_name: Option<String>,
    #[serde(default)]
    pub vf_is_vfio: bool,
    /// The port has the VM policy: its guest's DHCP exchanges are learned
    /// and the BOOTP broadcast flag is set on its DISCOVER and REQUEST.
    #[serde(default)]
    pub learning: bool,
    /// Frames the guard dropped on the port since it was attached, by
    /// `family.reason` (`ipv4.server`, `ipv6.router_advertisement`…; the
    /// reasons of `xdhcp_guard_dropped_frames`), those with drops only.
    #[serde(default)]
    pub drops: BTreeMap<String, u64>,
}

/// A workload port found in Open vSwitch whose host side the capture
/// program is on (TC egress: the replies to the pod leave the switch
/// there), as `xdhcp status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortCaptureStatus {
    /// The port's host interface (in the agent's namespace).
    pub port: String,
    /// Its `attached_mac`: a lease on a link with this MAC takes the port.
    pub mac: String,
    /// Its `k8s.ovn.org/network`.
    #[serde(default)]
    pub network: Option<String>,
    /// `live`, `pending` (attaching), `lost` (detached or refused), or
    /// `off` (no eBPF datapath).
    pub state: String,
    /// `tc-egress` while attached.
    pub hook: Option<String>,
    pub ifindex: Option<u32>,
    /// The kernel id of the program's BPF link (kernels with tcx).
    pub bpf_link: Option<u32>,
    /// DHCP replies captured here and delivered to their lease.
    pub replies: u64,
}

/// Where the agent's uplinks come from, as `xdhcp status` shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UplinkSourceStatus {
    /// `flag` (`--uplink` given: OVS is not read), `ovs` (the uplinks of
    /// `ovn-bridge-mappings`, followed), or empty (an agent that does not
    /// say).
    pub kind: String,
    /// The OVS database socket read (`--ovsdb`), for `ovs`.
    pub ovsdb: Option<PathBuf>,
    /// For `ovs`: `connecting`, `connected`, or `unavailable`.
    pub state: Option<String>,
    /// Why OVS is not read, while `unavailable` (the agent then runs with
    /// the uplinks it last read, none if it never did: every lease takes
    /// its per-interface path).
    pub reason: Option<String>,
}
