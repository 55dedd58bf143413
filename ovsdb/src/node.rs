//! What the agent needs to know about a node's Open vSwitch, computed from a
//! replica of `Open_vSwitch`, `Bridge`, `Port` and `Interface` (sans-IO):
//!
//! * the uplinks: where each localnet network reaches the wire. OVN maps a
//!   physical network to a provider bridge with
//!   `Open_vSwitch.external_ids:ovn-bridge-mappings` (`physnet:bridge,…`);
//!   the NIC, or each member of an OVS bond, is a port of that bridge;
//! * the workload ports: pod (and VM) ports on the integration bridge, with
//!   the `external_ids` OVN-Kubernetes' CNI writes on their Interface.
//!
//! One thing: the node view computed from the replica (about 460 lines of
//! code; the rest is its tests).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use crate::client::MonitorRequests;
use crate::replica::{Replica, Row};
use crate::value::Uuid;

/// The integration bridge when neither the options nor
/// `Open_vSwitch.external_ids:ovn-bridge` name one (ovn-controller's default).
pub const DEFAULT_INTEGRATION_BRIDGE: &str = "br-int";

/// The tables and columns [`node_view`] reads: what a monitor must watch.
pub fn monitor_requests() -> MonitorRequests {
    let t = |table: &str, cols: &[&str]| {
        (
            table.to_owned(),
            Some(cols.iter().map(|c| (*c).to_owned()).collect()),
        )
    };
    MonitorRequests {
        tables: vec![
            t("Open_vSwitch", &["external_ids", "bridges"]),
            t("Bridge", &["name", "ports", "datapath_type"]),
            t("Port", &["name", "interfaces"]),
            t("Interface", &["name", "type", "external_ids"]),
        ],
    }
}

/// How the view is computed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ViewOptions {
    /// The integration bridge; `None`: `external_ids:ovn-bridge` of the
    /// `Open_vSwitch` row, else [`DEFAULT_INTEGRATION_BRIDGE`].
    pub integration_bridge: Option<String>,
}

/// Which datapath a bridge's packets take (`Bridge.datapath_type`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Datapath {
    /// `""` or `system`: the kernel's openvswitch module. The agent's eBPF
    /// programs on the NIC see the traffic.
    System,
    /// `netdev`: `ovs-vswitchd` in user space (DPDK, `AF_XDP`, or plain sockets).
    Netdev,
    /// Anything else, as written.
    Other(String),
}

impl Datapath {
    fn from_column(s: &str) -> Self {
        match s {
            "" | "system" => Self::System,
            "netdev" => Self::Netdev,
            other => Self::Other(other.to_owned()),
        }
    }
}

/// How an uplink interface is attached (`Interface.type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UplinkKind {
    /// `""` or `system`: a kernel network device.
    System,
    /// `dpdk`: a DPDK-bound NIC (no kernel device).
    Dpdk,
    /// `afxdp` or `afxdp-nonpmd`: a kernel device read through `AF_XDP`.
    Afxdp,
}

impl UplinkKind {
    /// The kind of an Interface `type` that carries the wire, or `None`
    /// (`patch`, `internal`, tunnels, `tap`…).
    fn from_type(ty: &str) -> Option<Self> {
        match ty {
            "" | "system" => Some(Self::System),
            "dpdk" => Some(Self::Dpdk),
            "afxdp" | "afxdp-nonpmd" => Some(Self::Afxdp),
            _ => None,
        }
    }
}

/// One interface through which a localnet network reaches the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uplink {
    /// The interface name (the kernel device for [`UplinkKind::System`] and
    /// [`UplinkKind::Afxdp`]).
    pub ifname: String,
    pub physnet: String,
    /// The provider bridge.
    pub bridge: String,
    pub datapath: Datapath,
    pub kind: UplinkKind,
    /// The OVS bond (Port) this interface is a member of.
    pub bond: Option<String>,
}

/// A MAC address (`attached_mac`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Mac(pub [u8; 6]);

/// A text that is not a MAC address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a MAC address (six colon-separated pairs of hex digits)")]
pub struct NotAMac {
    pub text: String,
}

impl FromStr for Mac {
    type Err = NotAMac;

    /// Six colon-separated pairs of hex digits, either case.
    fn from_str(s: &str) -> Result<Self, NotAMac> {
        let err = || NotAMac { text: s.to_owned() };
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for b in &mut out {
            let p = parts.next().ok_or_else(err)?;
            if p.len() != 2 || !p.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(err());
            }
            *b = u8::from_str_radix(p, 16).map_err(|_| err())?;
        }
        if parts.next().is_some() {
            return Err(err());
        }
        Ok(Self(out))
    }
}

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, byte) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

/// A workload's port on the integration bridge: an Interface with an
/// `external_ids:iface-id` (the OVN logical switch port it binds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadPort {
    /// The interface name: the host side of the pod's veth, or the VF
    /// representor.
    pub ifname: String,
    /// `iface-id`: the logical switch port.
    pub iface_id: String,
    /// `iface-id-ver`: the pod UID.
    pub pod_uid: Option<String>,
    /// `sandbox`: the pod sandbox (container) id.
    pub sandbox: Option<String>,
    /// `attached_mac`: the pod interface's MAC.
    pub attached_mac: Option<Mac>,
    /// `pod-if-name`: the interface name inside the pod (`eth0`, `net1`).
    pub pod_if_name: Option<String>,
    /// `k8s.ovn.org/network`: the network name (secondary networks).
    pub network: Option<String>,
    /// `k8s.ovn.org/nad`: the NetworkAttachmentDefinition (`ns/name`).
    pub nad: Option<String>,
    /// `vf-netdev-name`: the VF's netdev (SR-IOV).
    pub vf_netdev_name: Option<String>,
    /// `vf-is-vfio=true`: the VF is bound to VFIO (a VM's), so no netdev in
    /// the pod.
    pub vf_is_vfio: bool,
    /// `ovn-installed=true`: ovn-controller has bound the logical port and
    /// installed its flows, so the port forwards.
    pub ovn_installed: bool,
}

/// Something in the database the view could not use. The rest of the view
/// still holds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ViewWarning {
    #[error("the Open_vSwitch table has no row (ovs-vsctl init has not run)")]
    NoOpenVswitchRow,
    #[error("the Open_vSwitch table has {rows} rows; the first one is used")]
    SeveralOpenVswitchRows { rows: usize },
    #[error("ovn-bridge-mappings entry {index} is empty")]
    MappingEmpty { index: usize },
    #[error("ovn-bridge-mappings entry {entry:?} has no colon (physnet:bridge)")]
    MappingWithoutColon { entry: String },
    #[error("ovn-bridge-mappings entry {entry:?} has an empty physical network or bridge")]
    MappingHalfEmpty { entry: String },
    #[error(
        "ovn-bridge-mappings maps physical network {physnet} more than once; the first is used"
    )]
    PhysnetMappedTwice { physnet: String },
    #[error("physical network {physnet} maps to bridge {bridge}, which does not exist")]
    MappedBridgeMissing { physnet: String, bridge: String },
    #[error("the integration bridge {bridge} does not exist")]
    IntegrationBridgeMissing { bridge: String },
    #[error("{table} row {uuid} is referenced but not in the replica")]
    DanglingReference { table: &'static str, uuid: Uuid },
    #[error("interface {ifname}: attached_mac {value:?} is not a MAC address")]
    AttachedMacMalformed { ifname: String, value: String },
}

/// A physical network mapped to a bridge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeMapping {
    pub physnet: String,
    pub bridge: String,
}

/// Parses `ovn-bridge-mappings` (`physnet:bridge,physnet2:bridge2`). A
/// malformed entry is skipped with a warning; so is a second mapping of the
/// same physical network (ovn-controller keeps the first too).
pub fn parse_bridge_mappings(text: &str) -> (Vec<BridgeMapping>, Vec<ViewWarning>) {
    let mut maps: Vec<BridgeMapping> = Vec::new();
    let mut warnings = Vec::new();
    for (index, entry) in text.split(',').enumerate() {
        let entry = entry.trim();
        if entry.is_empty() {
            warnings.push(ViewWarning::MappingEmpty { index });
            continue;
        }
        let Some((physnet, bridge)) = entry.split_once(':') else {
            warnings.push(ViewWarning::MappingWithoutColon {
                entry: entry.to_owned(),
            });
            continue;
        };
        let (physnet, bridge) = (physnet.trim(), bridge.trim());
        if physnet.is_empty() || bridge.is_empty() {
            warnings.push(ViewWarning::MappingHalfEmpty {
                entry: entry.to_owned(),
            });
            continue;
        }
        if maps.iter().any(|m| m.physnet == physnet) {
            warnings.push(ViewWarning::PhysnetMappedTwice {
                physnet: physnet.to_owned(),
            });
            continue;
        }
        maps.push(BridgeMapping {
            physnet: physnet.to_owned(),
            bridge: bridge.to_owned(),
        });
    }
    (maps, warnings)
}

/// A node's Open vSwitch as the agent sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeView {
    /// The integration bridge's name.
    pub integration_bridge: String,
    /// Its datapath, if it exists.
    pub integration_datapath: Option<Datapath>,
    /// The mappings as parsed (well-formed entries only).
    pub mappings: Vec<BridgeMapping>,
    /// Sorted by physical network, bridge, interface.
    pub uplinks: Vec<Uplink>,
    /// Sorted by interface name.
    pub workloads: Vec<WorkloadPort>,
    pub warnings: Vec<ViewWarning>,
}

impl NodeView {
    /// The uplinks of physical network `physnet`.
    pub fn uplinks_of<'a>(&'a self, physnet: &'a str) -> impl Iterator<Item = &'a Uplink> {
        self.uplinks.iter().filter(move |u| u.physnet == physnet)
    }

    /// The workload port whose interface is `ifname`.
    pub fn workload(&self, ifname: &str) -> Option<&WorkloadPort> {
        self.workloads.iter().find(|w| w.ifname == ifname)
    }
}

/// One interface of a bridge, with its port.
struct BridgeIface<'a> {
    port: &'a Row,
    iface: &'a Row,
    /// The port has more than one interface: a bond.
    bonded: bool,
}

/// The interfaces of `bridge`'s ports, except the bridge's own port (the
/// port named like the bridge: its internal interface).
fn bridge_ifaces<'a>(
    replica: &'a Replica,
    bridge_name: &str,
    bridge: &'a Row,
    warnings: &mut Vec<ViewWarning>,
) -> Vec<BridgeIface<'a>> {
    let mut out = Vec::new();
    for puuid in bridge.uuids("ports") {
        let Some(port) = replica.row("Port", puuid) else {
            warnings.push(ViewWarning::DanglingReference {
                table: "Port",
                uuid: puuid.clone(),
            });
            continue;
        };
        if port.str("name") == bridge_name {
            continue;
        }
        let bonded = port.uuids("interfaces").nth(1).is_some();
        for iuuid in port.uuids("interfaces") {
            match replica.row("Interface", iuuid) {
                Some(iface) => out.push(BridgeIface {
                    port,
                    iface,
                    bonded,
                }),
                None => warnings.push(ViewWarning::DanglingReference {
                    table: "Interface",
                    uuid: iuuid.clone(),
                }),
            }
        }
    }
    out
}

/// The node view of `replica` (see the module documentation).
pub fn node_view(replica: &Replica, options: &ViewOptions) -> NodeView {
    let mut warnings = Vec::new();
    let ovs_rows: Vec<&Row> = replica.rows("Open_vSwitch").map(|(_, r)| r).collect();
    let ovs = ovs_rows.first().copied();
    match ovs_rows.len() {
        0 => warnings.push(ViewWarning::NoOpenVswitchRow),
        1 => {}
        rows => warnings.push(ViewWarning::SeveralOpenVswitchRows { rows }),
    }

    // Bridge names are unique (the schema's index).
    let bridges: BTreeMap<&str, &Row> = replica
        .rows("Bridge")
        .map(|(_, r)| (r.str("name"), r))
        .collect();

    let mappings = match ovs.and_then(|o| o.map_str("external_ids", "ovn-bridge-mappings")) {
        Some(text) => {
            let (m, w) = parse_bridge_mappings(text);
            warnings.extend(w);
            m
        }
        None => Vec::new(),
    };

    let mut uplinks = Vec::new();
    for m in &mappings {
        let Some(bridge) = bridges.get(m.bridge.as_str()) else {
            warnings.push(ViewWarning::MappedBridgeMissing {
                physnet: m.physnet.clone(),
                bridge: m.bridge.clone(),
            });
            continue;
        };
        let datapath = Datapath::from_column(bridge.str("datapath_type"));
        for bi in bridge_ifaces(replica, &m.bridge, bridge, &mut warnings) {
            let Some(kind) = UplinkKind::from_type(bi.iface.str("type")) else {
                continue;
            };
            uplinks.push(Uplink {
                ifname: bi.iface.str("name").to_owned(),
                physnet: m.physnet.clone(),
                bridge: m.bridge.clone(),
                datapath: datapath.clone(),
                kind,
                bond: bi.bonded.then(|| bi.port.str("name").to_owned()),
            });
        }
    }
    uplinks.sort_by(|a, b| {
        (&a.physnet, &a.bridge, &a.ifname).cmp(&(&b.physnet, &b.bridge, &b.ifname))
    });

    let integration_bridge = options
        .integration_bridge
        .as_deref()
        .or_else(|| ovs.and_then(|o| o.map_str("external_ids", "ovn-bridge")))
        .filter(|b| !b.is_empty())
        .unwrap_or(DEFAULT_INTEGRATION_BRIDGE)
        .to_owned();
    let mut workloads = Vec::new();
    let integration_datapath = match bridges.get(integration_bridge.as_str()) {
        None => {
            warnings.push(ViewWarning::IntegrationBridgeMissing {
                bridge: integration_bridge.clone(),
            });
            None
        }
        Some(bridge) => {
            for bi in bridge_ifaces(replica, &integration_bridge, bridge, &mut warnings) {
                if let Some(w) = workload_port(bi.iface, &mut warnings) {
                    workloads.push(w);
                }
            }
            Some(Datapath::from_column(bridge.str("datapath_type")))
        }
    };
    workloads.sort_by(|a, b| a.ifname.cmp(&b.ifname));

    NodeView {
        integration_bridge,
        integration_datapath,
        mappings,
        uplinks,
        workloads,
        warnings,
    }
}

/// The workload port of an integration-bridge interface, or `None` for an
/// interface that binds no logical port or never carries a workload: patch
/// ports (to provider bridges) and internal ports (OVN-Kubernetes'
/// management port `ovn-k8s-mp0` has an `iface-id` but is internal).
fn workload_port(iface: &Row, warnings: &mut Vec<ViewWarning>) -> Option<WorkloadPort> {
    if matches!(iface.str("type"), "patch" | "internal") {
        return None;
    }
    let id = |key: &str| {
        iface
            .map_str("external_ids", key)
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
    };
    let iface_id = id("iface-id")?;
    let ifname = iface.str("name").to_owned();
    let attached_mac = id("attached_mac").and_then(|value| {
        let mac = value.parse::<Mac>().ok();
        if mac.is_none() {
            warnings.push(ViewWarning::AttachedMacMalformed {
                ifname: ifname.clone(),
                value,
            });
        }
        mac
    });
    Some(WorkloadPort {
        iface_id,
        pod_uid: id("iface-id-ver"),
        sandbox: id("sandbox"),
        attached_mac,
        pod_if_name: id("pod-if-name"),
        network: id("k8s.ovn.org/network"),
        nad: id("k8s.ovn.org/nad"),
        vf_netdev_name: id("vf-netdev-name"),
        vf_is_vfio: id("vf-is-vfio").as_deref() == Some("true"),
        ovn_installed: id("ovn-installed").as_deref() == Some("true"),
        ifname,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replica::tests::{STEPS, replica_after, replica2_after};
    use crate::value::{Atom, Value};

    fn view_after(steps: usize) -> NodeView {
        let v = node_view(&replica2_after(steps), &ViewOptions::default());
        // The plain monitor's replica gives the same view.
        assert_eq!(
            node_view(&replica_after(steps), &ViewOptions::default()),
            v,
            "after {steps} steps"
        );
        v
    }

    fn names(v: &NodeView) -> Vec<(&str, &str, Option<&str>)> {
        v.uplinks
            .iter()
            .map(|u| (u.physnet.as_str(), u.ifname.as_str(), u.bond.as_deref()))
            .collect()
    }

    #[test]
    fn the_recorded_node_lists_nic_and_bond_members_never_patch_or_internal() {
        let v = view_after(0);
        assert_eq!(
            names(&v),
            [
                ("physnet1", "ens1f0", Some("bond0")),
                ("physnet1", "ens1f1", Some("bond0")),
                ("physnet1", "eth1", None),
            ]
        );
        assert!(v.uplinks.iter().all(|u| u.bridge == "br-ex"
            && u.datapath == Datapath::System
            && u.kind == UplinkKind::System));
        assert_eq!(v.integration_bridge, "br-int");
        assert_eq!(v.integration_datapath, Some(Datapath::Netdev));
        assert_eq!(v.warnings, []);
    }

    #[test]
    fn the_recorded_pod_ports_carry_ovn_kubernetes_external_ids() {
        let v = view_after(0);
        assert_eq!(v.workloads.len(), 2, "{:#?}", v.workloads);
        assert_eq!(
            v.workload("0123456789abcde_3"),
            Some(&WorkloadPort {
                ifname: "0123456789abcde_3".into(),
                iface_id: "my.ns.loc.dhcp_my-ns_pod1".into(),
                pod_uid: Some("6f1c2a52-1d2e-4b7a-9a51-3c2f0e7e9b10".into()),
                sandbox: Some("0123456789abcdef0123".into()),
                attached_mac: Some(Mac([0x0a, 0x58, 0x0a, 0x80, 0x00, 0x05])),
                pod_if_name: Some("net1".into()),
                network: Some("my-ns_loc".into()),
                nad: Some("my-ns/loc-dhcp".into()),
                vf_netdev_name: None,
                vf_is_vfio: false,
                ovn_installed: false,
            })
        );
        let vf = v.workload("vf0rep").unwrap();
        assert_eq!(vf.vf_netdev_name.as_deref(), Some("ens1f0v3"));
        assert!(vf.vf_is_vfio);
        assert_eq!(vf.network, None);
    }

    #[test]
    fn each_recorded_change_shows_in_the_view() {
        assert_eq!(STEPS[0], "mapping_added");
        // physnet2's bridge does not exist yet.
        let v = view_after(1);
        assert_eq!(names(&v).len(), 3);
        assert_eq!(
            v.warnings,
            [ViewWarning::MappedBridgeMissing {
                physnet: "physnet2".into(),
                bridge: "br-phys2".into()
            }]
        );
        // bridge_added: br-phys2 with eth2 (its own internal port ignored).
        let v = view_after(2);
        assert_eq!(
            v.uplinks_of("physnet2")
                .map(|u| u.ifname.as_str())
                .collect::<Vec<_>>(),
            ["eth2"]
        );
        assert_eq!(v.warnings, []);
        // port_renamed
        let v = view_after(3);
        assert_eq!(
            v.uplinks_of("physnet2")
                .map(|u| u.ifname.as_str())
                .collect::<Vec<_>>(),
            ["eth3"]
        );
        // bond_member_removed: ens1f0 is a port of its own, ens1f1 gone.
        let v = view_after(4);
        assert_eq!(
            v.uplinks_of("physnet1")
                .map(|u| (u.ifname.as_str(), u.bond.as_deref()))
                .collect::<Vec<_>>(),
            [("ens1f0", None), ("eth1", None)]
        );
        // port_deleted
        let v = view_after(5);
        assert_eq!(v.uplinks_of("physnet2").count(), 0);
        // datapath_changed
        let v = view_after(6);
        assert!(
            v.uplinks_of("physnet1")
                .all(|u| u.datapath == Datapath::Netdev)
        );
        // iface_ids_changed
        let v = view_after(7);
        assert_eq!(
            v.workload("0123456789abcde_3")
                .unwrap()
                .pod_if_name
                .as_deref(),
            Some("net9")
        );
        assert!(!v.workload("vf0rep").unwrap().vf_is_vfio);
        // mapping_removed
        let v = view_after(8);
        assert_eq!(v.uplinks, []);
        assert_eq!(v.mappings, []);
        assert_eq!(v.workloads.len(), 2);
    }

    #[test]
    fn malformed_mappings_are_warnings() {
        let (maps, warnings) =
            parse_bridge_mappings("physnet1:br-ex,,nocolon, :br-x,p2:,physnet1:br-y, p3 : br-z ");
        assert_eq!(
            maps,
            [
                BridgeMapping {
                    physnet: "physnet1".into(),
                    bridge: "br-ex".into()
                },
                BridgeMapping {
                    physnet: "p3".into(),
                    bridge: "br-z".into()
                }
            ]
        );
        assert_eq!(
            warnings,
            [
                ViewWarning::MappingEmpty { index: 1 },
                ViewWarning::MappingWithoutColon {
                    entry: "nocolon".into()
                },
                ViewWarning::MappingHalfEmpty {
                    entry: ":br-x".into()
                },
                ViewWarning::MappingHalfEmpty {
                    entry: "p2:".into()
                },
                ViewWarning::PhysnetMappedTwice {
                    physnet: "physnet1".into()
                },
            ]
        );
        let (maps, warnings) = parse_bridge_mappings("");
        assert_eq!(
            (maps, warnings),
            (vec![], vec![ViewWarning::MappingEmpty { index: 0 }])
        );
    }

    fn s(v: &str) -> Value {
        Value::Atom(Atom::String(v.into()))
    }

    fn refs(ids: &[&str]) -> Value {
        Value::Set(ids.iter().map(|i| Atom::Uuid(Uuid((*i).into()))).collect())
    }

    fn map(pairs: &[(&str, &str)]) -> Value {
        Value::Map(
            pairs
                .iter()
                .map(|(k, v)| (Atom::String((*k).into()), Atom::String((*v).into())))
                .collect(),
        )
    }

    /// A node with `ovn-bridge=br-ovn` and mappings to a DPDK bridge.
    fn built() -> Replica {
        let mut r = Replica::default();
        let row = |cols: Vec<(&str, Value)>| Row::with(cols);
        r.insert(
            "Open_vSwitch",
            Uuid("ovs".into()),
            row(vec![(
                "external_ids",
                map(&[
                    ("ovn-bridge", "br-ovn"),
                    ("ovn-bridge-mappings", "dp:br-dpdk"),
                ]),
            )]),
        );
        r.insert(
            "Bridge",
            Uuid("b1".into()),
            row(vec![
                ("name", s("br-dpdk")),
                ("datapath_type", s("netdev")),
                ("ports", refs(&["p1", "p2", "p3", "p-own"])),
            ]),
        );
        r.insert(
            "Bridge",
            Uuid("b2".into()),
            row(vec![("name", s("br-ovn")), ("ports", refs(&["p4", "p5"]))]),
        );
        for (p, name, ifaces) in [
            ("p1", "dpdk0", &["i1"][..]),
            ("p2", "xdp0", &["i2"][..]),
            ("p3", "tun", &["i3"][..]),
            ("p-own", "br-dpdk", &["i-own"][..]),
            ("p4", "mp0", &["i4"][..]),
            ("p5", "pod", &["i5", "missing"][..]),
        ] {
            r.insert(
                "Port",
                Uuid(p.into()),
                row(vec![("name", s(name)), ("interfaces", refs(ifaces))]),
            );
        }
        for (i, name, ty, ids) in [
            ("i1", "dpdk0", "dpdk", &[][..]),
            ("i2", "xdp0", "afxdp", &[][..]),
            ("i3", "tun", "geneve", &[][..]),
            // A bridge's own port is never an uplink, whatever its type says.
            ("i-own", "br-dpdk", "", &[][..]),
            ("i4", "mp0", "internal", &[("iface-id", "k8s-node1")][..]),
            (
                "i5",
                "pod",
                "",
                &[("iface-id", "ns_pod"), ("attached_mac", "not-a-mac")][..],
            ),
        ] {
            r.insert(
                "Interface",
                Uuid(i.into()),
                row(vec![
                    ("name", s(name)),
                    ("type", s(ty)),
                    ("external_ids", map(ids)),
                ]),
            );
        }
        r
    }

    #[test]
    fn ovn_bridge_names_the_integration_bridge_unless_the_options_do() {
        let v = node_view(&built(), &ViewOptions::default());
        assert_eq!(v.integration_bridge, "br-ovn");
        assert_eq!(v.integration_datapath, Some(Datapath::System));
        // The internal management port is no workload.
        assert_eq!(
            v.workloads
                .iter()
                .map(|w| w.ifname.as_str())
                .collect::<Vec<_>>(),
            ["pod"]
        );
        assert_eq!(v.workloads[0].attached_mac, None);
        assert_eq!(
            v.warnings,
            [
                ViewWarning::DanglingReference {
                    table: "Interface",
                    uuid: Uuid("missing".into())
                },
                ViewWarning::AttachedMacMalformed {
                    ifname: "pod".into(),
                    value: "not-a-mac".into()
                }
            ]
        );

        let v = node_view(
            &built(),
            &ViewOptions {
                integration_bridge: Some("br-int".into()),
            },
        );
        assert_eq!(v.integration_bridge, "br-int");
        assert_eq!(v.workloads, []);
        assert_eq!(
            v.warnings,
            [ViewWarning::IntegrationBridgeMissing {
                bridge: "br-int".into()
            }]
        );
    }

    #[test]
    fn dpdk_and_afxdp_interfaces_are_uplinks_tunnels_are_not() {
        let v = node_view(&built(), &ViewOptions::default());
        assert_eq!(
            v.uplinks
                .iter()
                .map(|u| (u.ifname.as_str(), u.kind, &u.datapath))
                .collect::<Vec<_>>(),
            [
                ("dpdk0", UplinkKind::Dpdk, &Datapath::Netdev),
                ("xdp0", UplinkKind::Afxdp, &Datapath::Netdev)
            ]
        );
    }

    #[test]
    fn an_empty_database_is_a_view_with_warnings() {
        let v = node_view(&Replica::default(), &ViewOptions::default());
        assert_eq!(v.uplinks, []);
        assert_eq!(
            v.warnings,
            [
                ViewWarning::NoOpenVswitchRow,
                ViewWarning::IntegrationBridgeMissing {
                    bridge: "br-int".into()
                }
            ]
        );
    }

    #[test]
    fn macs_parse_and_print() {
        let m: Mac = "0A:58:0a:80:00:05".parse().unwrap();
        assert_eq!(m.to_string(), "0a:58:0a:80:00:05");
        for bad in [
            "",
            "0a:58:0a:80:00",
            "0a:58:0a:80:00:05:06",
            "0a:58:0a:80:00:5",
            "zz:58:0a:80:00:05",
            "+a:58:0a:80:00:05",
        ] {
            assert!(bad.parse::<Mac>().is_err(), "{bad}");
        }
    }
}
