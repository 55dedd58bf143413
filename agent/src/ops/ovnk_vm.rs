//! KubeVirt VMs whose DHCP OVN-Kubernetes does itself: no ADD reaches the
//! agent for them (ovnkube-node runs its own one-shot and writes the
//! `pod-networks` entry), so the agent knows such a VM only from its
//! `br-int` port (`daemon/workloads.rs`) and its pod (the node's pod
//! reflector, by the port's `iface-id-ver`).
//!
//! - [`is_vm_port`]: a port whose pod a `VirtualMachineInstance` controls
//!   (its controller owner reference) gets the VM policy: one client (the
//!   port's `attached_mac`), learning, and the broadcast-flag rewrite.
//! - What such a port's network is, with no lease record of the agent's
//!   own ([`EntryNetwork`]): its prefix and gateway are those of the entry
//!   ovnkube-node wrote (the network key is the port's `k8s.ovn.org/nad`,
//!   or `default`); its server is the one whose ACK the port carried for
//!   the entry's very address — the one-shot's own exchange, seen by the
//!   guard because the port is guarded before ovnkube-node asks — anchored
//!   for as long as the port is guarded. A server no exchange on the port
//!   anchored is refused (`unknown_server`), as for any VM.
//! - What vouches for its IPv6 side ([`view6`]): nothing the port carried
//!   (there is no DHCPv6 one-shot on this path to anchor a server from),
//!   only the node's DHCPv6 leases of the network the port names
//!   (`k8s.ovn.org/network`, matched against the records' network name):
//!   their servers' DUIDs, where those servers' REPLYs came from, their
//!   prefixes, with the prefix of the IPv6 address the pod's entry
//!   reports. A network with no DHCPv6 lease on the node has no IPv6 view:
//!   nothing of the guest's IPv6 is learned there.
//! - [`moved_entry`]: the entry moved to the guest's addresses, each
//!   family on its own (an IPv6 move keeps the IPv4 address and the other
//!   way round; the guest's self-configured addresses listed after its
//!   IPv6 one), every other field kept; written by [`write_entry`] with
//!   the pod's UID and resourceVersion as preconditions.
//! - Live migration: a migration target's port takes the source pod's
//!   address, prefix length and gateway ([`migration_source_address`])
//!   while its guest, keeping its lease, asks nothing (its one-shot's
//!   server anchored first, [`EntryNetwork::anchor`]); a port that leaves OVS loses the bindings learned
//!   on it ([`gone_ports`]), and nothing is sent for the VM.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use tracing::info;

use crate::bindings::format_mac;
use crate::bindings::learner::NetworkView;
use crate::bindings::learner6::{NetworkView6, network6};
use crate::guard::OvsIdentity;
use crate::kube::annotation::{IPAM_MODE_DHCP, PodNetworkEntry, PodNetworks};
use crate::kube::{PodInfo, WriteGuard};
use crate::ops::context::Agent;
use crate::sys::sync::lock;
use crate::workload::SourceReport;

/// The network key of the cluster's default network.
pub(crate) const DEFAULT_NETWORK: &str = "default";
/// ACKs remembered per port before the entry names their address.
const CANDIDATES: usize = 4;

/// The `pod-networks` key of the port's network: its NAD, else `default`.
pub(crate) fn entry_key(ovs: &OvsIdentity) -> &str {
    ovs.nad
        .as_deref()
        .filter(|n| !n.is_empty())
        .unwrap_or(DEFAULT_NETWORK)
}

/// Whether `pod` is a VM pod: a `VirtualMachineInstance` is its
/// controller owner.
pub(crate) fn is_vm_pod(pod: &PodInfo) -> bool {
    pod.owner_vmi.as_deref().is_some_and(|v| !v.is_empty())
}

/// The pod of a port found in Open vSwitch (by its `iface-id-ver`), if
/// the node's pod reflector has it; without a cluster, if the embedded pod
/// store has a pod of that UID.
pub(crate) fn pod_of(agent: &Agent, ovs: &OvsIdentity) -> Option<PodInfo> {
    let uid = ovs.pod_uid.as_deref()?;
    match (&agent.node_pods, agent.pod_api.embedded()) {
        (Some(pods), _) => pods.by_uid(uid),
        (None, Some(store)) => store.pod_by_uid(uid),
        (None, None) => None,
    }
}

/// Whether the port found in Open vSwitch is a VM's (gets the VM policy).
pub(crate) fn is_vm_port(agent: &Agent, ovs: &OvsIdentity) -> bool {
    ovs.mac.is_some() && pod_of(agent, ovs).is_some_and(|p| is_vm_pod(&p))
}

/// The first IPv4 address of `entry` with its prefix length.
pub(crate) fn entry_address(entry: &PodNetworkEntry) -> Option<(Ipv4Addr, u8)> {
    entry.ip_addresses.iter().find_map(|cidr| {
        let (ip, len) = cidr.split_once('/')?;
        let len: u8 = len.parse().ok().filter(|l| *l <= 32)?;
        Some((ip.parse().ok()?, len))
    })
}

/// The first IPv6 address of `entry` with its prefix length.
pub(crate) fn entry_address6(entry: &PodNetworkEntry) -> Option<(Ipv6Addr, u8)> {
    entry.ip_addresses.iter().find_map(|cidr| {
        let (ip, len) = cidr.split_once('/')?;
        let len: u8 = len.parse().ok().filter(|l| *l <= 128)?;
        Some((ip.parse().ok()?, len))
    })
}

/// One port's knowledge of its network without a lease record: the ACKs
/// it carried (server, its link-layer source, the address), and the
/// servers anchored by the entry naming an address one of them acked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct EntryNetwork {
    candidates: Vec<(Ipv4Addr, [u8; 6], Ipv4Addr)>,
    servers: BTreeMap<Ipv4Addr, BTreeSet<[u8; 6]>>,
}

impl EntryNetwork {
    /// The port carried an ACK answering the guest's own exchange from
    /// `server` (sent from `src_ip`, `src_mac`) for `yiaddr`, which no
    /// anchored server vouched for. Only a server that sent it itself
    /// counts (a relayed one-shot is not anchored).
    pub(crate) fn saw_ack(
        &mut self,
        server: Ipv4Addr,
        src_ip: Ipv4Addr,
        src_mac: [u8; 6],
        yiaddr: Ipv4Addr,
    ) {
        if src_ip != server || yiaddr.is_unspecified() {
            return;
        }
        let c = (server, src_mac, yiaddr);
        self.candidates.retain(|x| *x != c);
        if self.candidates.len() >= CANDIDATES {
            self.candidates.remove(0);
        }
        self.candidates.push(c);
    }

    /// Anchors the servers of the ACKs the port carried for the address
    /// `entry` reports (the one-shot's, once ovnkube-node has written it).
    /// Done on every guest message and, without one, on every sweep of
    /// the learning loop: a migration target's entry moves on to the
    /// source's address before the guest, re-plugged, says anything, and
    /// a one-shot ACK anchors only while the entry names its address.
    pub(crate) fn anchor(&mut self, entry: &PodNetworkEntry) {
        let Some((ip, _)) = entry_address(entry) else {
            return;
        };
        self.candidates.retain(|&(server, mac, acked)| {
            if acked != ip {
                return true;
            }
            self.servers.entry(server).or_default().insert(mac);
            false
        });
    }

    /// The view of the network from `entry` (the entry the pod carries
    /// now, if any): its prefix, the servers anchored so far (an ACK for
    /// the entry's address anchors its server), plus `known` (servers of
    /// the network's leases on the node), with `held` the addresses other
    /// bindings hold.
    pub(crate) fn view(
        &mut self,
        entry: Option<&PodNetworkEntry>,
        known: &BTreeMap<Ipv4Addr, BTreeSet<[u8; 6]>>,
        held: BTreeSet<Ipv4Addr>,
    ) -> NetworkView {
        let mut view = NetworkView {
            held,
            ..NetworkView::default()
        };
        if let Some(e) = entry {
            self.anchor(e);
        }
        if let Some((ip, len)) = entry.and_then(entry_address) {
            let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
            view.prefixes
                .insert((Ipv4Addr::from(u32::from(ip) & mask), len));
        }
        for (s, macs) in self.servers.iter().chain(known) {
            view.servers.entry(*s).or_default().extend(macs);
        }
        view
    }
}

/// Where [`moved_entry`] puts each family of an entry: a family left
/// `None` keeps the addresses the entry lists for it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct EntryMove {
    /// The IPv4 address, its prefix length (the entry's when `None`) and
    /// gateway (the entry's IPv4 gateways when `None`).
    pub(crate) v4: Option<(Ipv4Addr, Option<u8>, Option<Ipv4Addr>)>,
    /// The IPv6 address and its prefix length.
    pub(crate) v6: Option<(Ipv6Addr, u8)>,
    /// Addresses the guest configured itself (SLAAC, static), listed after
    /// the IPv6 one unless the entry lists them already.
    pub(crate) configured6: Vec<(Ipv6Addr, u8)>,
}

/// The address of a CIDR string of an entry, if it parses.
fn cidr_ip(cidr: &str) -> Option<IpAddr> {
    cidr.split_once('/')?.0.parse().ok()
}

/// `entry` moved as `mv` says: the IPv4 addresses replaced by the move's
/// one (a move with no prefix length where the entry has none moves
/// nothing: nothing can be said), the IPv6 ones by the move's, the guest's
/// self-configured addresses added; each family the move leaves alone
/// kept as the entry lists it, and so are the IPv6 gateways when the
/// IPv4 one moves; every other field kept, `ipam_mode` `dhcp`. `None`
/// when it already reports all that.
pub(crate) fn moved_entry(entry: &PodNetworkEntry, mv: &EntryMove) -> Option<PodNetworkEntry> {
    let (mut v4, mut v6, mut other) = (Vec::new(), Vec::new(), Vec::new());
    for c in &entry.ip_addresses {
        match cidr_ip(c) {
            Some(IpAddr::V4(_)) => v4.push(c.clone()),
            Some(IpAddr::V6(_)) => v6.push(c.clone()),
            None => other.push(c.clone()),
        }
    }
    let mut gateways = entry.gateway_ips.clone();
    if let Some((ip, len, router)) = mv.v4
        && let Some(len) = len.or(entry_address(entry).map(|(_, l)| l))
    {
        v4 = vec![format!("{ip}/{len}")];
        if let Some(r) = router {
            // Only the IPv4 gateway is the router's to move.
            gateways.retain(|g| g.parse::<Ipv4Addr>().is_err());
            gateways.insert(0, r.to_string());
        }
    }
    if let Some((ip, len)) = mv.v6 {
        v6 = vec![format!("{ip}/{len}")];
    }
    for &(ip, len) in &mv.configured6 {
        if !v6.iter().any(|c| cidr_ip(c) == Some(IpAddr::V6(ip))) {
            v6.push(format!("{ip}/{len}"));
        }
    }
    let addresses: Vec<String> = v4.into_iter().chain(v6).chain(other).collect();
    if addresses == entry.ip_addresses && gateways == entry.gateway_ips {
        return None;
    }
    let mut moved = entry.clone();
    moved.ip_addresses = addresses;
    moved.gateway_ips = gateways;
    moved.ipam_mode = Some(IPAM_MODE_DHCP.to_owned());
    Some(moved)
}

/// The host interfaces of `seen` (learning ports found in OVS this run)
/// that are no longer guarded (their port left OVS): their learned
/// bindings go (no RELEASE is sent: the guest may live on, migrated).
pub(crate) fn gone_ports(seen: &BTreeSet<String>, guarded: impl Fn(&str) -> bool) -> Vec<String> {
    seen.iter().filter(|p| !guarded(p)).cloned().collect()
}

/// On a live-migration target's port (OVN-Kubernetes' own path): what the
/// source pod's entry reports for the port's network (address, prefix
/// length, gateway), which the target's entry is to take while the guest,
/// keeping its lease, asks nothing. `None` when the pod is no migration
/// target or the source is not known or reports no address (logged by the
/// lookup).
pub(crate) async fn migration_source_address(
    agent: &Agent,
    ovs: &OvsIdentity,
) -> Option<SourceReport> {
    let pod = pod_of(agent, ovs)?;
    let migration = pod.migration_target()?;
    let vmi_name = pod.owner_vmi.clone()?;
    let vmi = agent
        .pod_api
        .get_vmi(&pod.namespace, &vmi_name)
        .await
        .ok()
        .flatten();
    let at = crate::model::PodRef {
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        uid: pod.uid.clone(),
    };
    let report = crate::ops::vm::migration_source(
        &*agent.pod_api,
        &vmi_name,
        Some(&at),
        Some(&migration),
        vmi.as_ref(),
        entry_key(ovs),
    )
    .await?;
    report.address.is_some().then_some(report)
}

/// The entry of network `key` in `pod`'s annotation as the pod carries it.
pub(crate) fn entry_of(pod: &PodInfo, key: &str) -> Option<PodNetworkEntry> {
    PodNetworks::parse(pod.pod_networks.as_deref())
        .ok()?
        .entry(key)
        .ok()?
}

/// The servers of the leases on the node of network `network` (as the
/// port names it), and the addresses the other bindings hold: those
/// leases' of other MACs, and the learned bindings of other MACs.
pub(crate) fn node_knowledge(
    agent: &Agent,
    network: Option<&str>,
    mac: [u8; 6],
) -> (BTreeMap<Ipv4Addr, BTreeSet<[u8; 6]>>, BTreeSet<Ipv4Addr>) {
    let mut servers: BTreeMap<Ipv4Addr, BTreeSet<[u8; 6]>> = BTreeMap::new();
    let mut held = BTreeSet::new();
    let mut macs = HashSet::new();
    for h in agent.leases.all() {
        let live = lock(&h.live);
        let r = &live.record;
        let other = r.mac != mac;
        if other {
            macs.insert(format_mac(r.mac));
        }
        if let Some(l) = &r.lease {
            if other {
                held.insert(l.address);
            }
            if network == Some(r.network.name.as_str()) {
                let m = servers.entry(l.server_id).or_default();
                m.extend(l.server_mac);
            }
        }
    }
    let now = crate::sys::clock::now_unix_ms();
    let own = format_mac(mac);
    held.extend(
        lock(&agent.guard.learned)
            .rows(now)
            .into_iter()
            .filter(|b| b.mac != own)
            .filter_map(|b| b.ipv4()),
    );
    (servers, held)
}

/// One DHCPv6 lease on the node, as much of it as the IPv6 view of a
/// network ([`view6`]) needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeLease6 {
    /// The network's name (the record's, as a port's `k8s.ovn.org/network`
    /// names it).
    pub(crate) network: String,
    pub(crate) mac: [u8; 6],
    /// The server's DUID, and where its REPLY came from when known.
    pub(crate) server: Vec<u8>,
    pub(crate) from: Option<xdhcp_engine::v6::Source>,
    pub(crate) address: Ipv6Addr,
    pub(crate) prefix_len: u8,
}

/// What vouches for a guest's IPv6 addresses on a port without a lease
/// record (sans-IO): the DHCPv6 servers (DUIDs, with where their REPLYs
/// came from) and prefixes of the node's DHCPv6 `leases` of `network` (as
/// the port names it), plus the prefix of the IPv6 address `entry` (the
/// pod's entry for the network) reports; the addresses other bindings
/// hold: other MACs' DHCPv6 leases and `learned` bindings (MAC, address).
///
/// `None` when no DHCPv6 lease of the network is on the node: there is no
/// DHCPv6 one-shot on this path to anchor a server from, and a server no
/// lease of the network was served by is nobody's word; nor is a prefix
/// alone (the entry's) enough, so a self-configured address is not
/// learned either.
pub(crate) fn view6(
    leases: &[NodeLease6],
    learned: &[(String, IpAddr)],
    network: Option<&str>,
    mac: [u8; 6],
    entry: Option<&PodNetworkEntry>,
) -> Option<NetworkView6> {
    let network = network?;
    let mut view = NetworkView6::default();
    for l in leases {
        if l.mac != mac {
            view.held.insert(l.address);
        }
        if l.network == network {
            view.served(&l.server, l.from, l.address, l.prefix_len);
        }
    }
    if view.servers.is_empty() {
        return None;
    }
    if let Some((ip, len)) = entry.and_then(entry_address6) {
        view.prefixes.insert((network6(ip, len), len));
    }
    let own = format_mac(mac);
    view.held
        .extend(learned.iter().filter_map(|(m, ip)| match ip {
            IpAddr::V6(a) if *m != own => Some(*a),
            _ => None,
        }));
    Some(view)
}

/// [`view6`] from the node's lease records and learned bindings now.
pub(crate) fn node_knowledge6(
    agent: &Agent,
    network: Option<&str>,
    mac: [u8; 6],
    entry: Option<&PodNetworkEntry>,
) -> Option<NetworkView6> {
    let leases: Vec<NodeLease6> = agent
        .leases
        .all()
        .iter()
        .filter_map(|h| {
            let live = lock(&h.live);
            let r = &live.record;
            let l6 = r.lease6.as_deref()?;
            let a = crate::lease::v6::address6(&r.network, l6, r.router6);
            Some(NodeLease6 {
                network: r.network.name.clone(),
                mac: r.mac,
                server: l6.server_id.clone(),
                from: l6.server_source,
                address: l6.address,
                prefix_len: a.prefix_len,
            })
        })
        .collect();
    let now = crate::sys::clock::now_unix_ms();
    let learned: Vec<(String, IpAddr)> = lock(&agent.guard.learned)
        .rows(now)
        .into_iter()
        .map(|b| (b.mac, b.ip))
        .collect();
    view6(&leases, &learned, network, mac, entry)
}

/// The prefix length an IPv6 address the view vouched for is reported
/// with: that of the longest of the view's prefixes holding it (128 when
/// none does, or there is no view).
pub(crate) fn prefix_len6(view: Option<&NetworkView6>, ip: Ipv6Addr) -> u8 {
    view.into_iter()
        .flat_map(|v| v.prefixes.iter())
        .filter(|&&(net, len)| network6(ip, len) == net)
        .map(|&(_, len)| len)
        .max()
        .unwrap_or(128)
}

/// What a guest's addresses move the entry of its port's network to, by
/// family: the IPv4 address (with its prefix length and router when
/// known), the IPv6 address, the addresses the guest configured itself. A
/// family left `None` keeps what the entry lists.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct GuestAddresses {
    pub(crate) v4: Option<(Ipv4Addr, Option<u8>, Option<Ipv4Addr>)>,
    pub(crate) v6: Option<Ipv6Addr>,
    pub(crate) configured6: Vec<Ipv6Addr>,
}

/// Moves the `pod-networks` entry of the VM pod of `ovs` to the guest's
/// addresses (read fresh from the API; the IPv6 ones with the prefix
/// length of the network's prefix holding them; written under the pod's
/// UID and resourceVersion; an entry already there is left). Whether it
/// is as wanted (no pod, no entry: nothing to write, done).
pub(crate) async fn write_entry(agent: &Agent, ovs: &OvsIdentity, to: &GuestAddresses) -> bool {
    let ip = to.v4.map(|(a, ..)| a);
    let ip6 = to.v6;
    let Some(known) = pod_of(agent, ovs) else {
        info!(pod_uid = ?ovs.pod_uid, ?ip, ?ip6, "the port's pod is not known; the entry is not written");
        return true;
    };
    let pod = match agent.pod_api.get_pod(&known.namespace, &known.name).await {
        Ok(p) if p.uid == known.uid => p,
        Ok(_) => return true,
        Err(e) => {
            agent.metrics().failure("kube_api");
            tracing::warn!(error = %crate::rpc::format_chain(&e), "could not read the VM pod");
            return false;
        }
    };
    let key = entry_key(ovs);
    let Some(entry) = entry_of(&pod, key) else {
        info!(pod = %format!("{}/{}", pod.namespace, pod.name), network = key, ?ip, ?ip6,
            "the pod has no entry for the network (OVN-Kubernetes writes it); nothing written");
        return true;
    };
    let view = (to.v6.is_some() || !to.configured6.is_empty())
        .then(|| {
            node_knowledge6(
                agent,
                ovs.network.as_deref(),
                ovs.mac.unwrap_or_default(),
                Some(&entry),
            )
        })
        .flatten();
    let with_len = |a: Ipv6Addr| (a, prefix_len6(view.as_ref(), a));
    let mv = EntryMove {
        v4: to.v4,
        v6: to.v6.map(with_len),
        configured6: to.configured6.iter().copied().map(with_len).collect(),
    };
    let Some(moved) = moved_entry(&entry, &mv) else {
        return true;
    };
    let guard = WriteGuard::uid(pod.uid.as_deref());
    match agent
        .pod_api
        .set_network_entry_guarded(&pod.namespace, &pod.name, &guard, key, moved)
        .await
    {
        Ok(()) => {
            info!(pod = %format!("{}/{}", pod.namespace, pod.name), network = key, ?ip, ?ip6,
                "pod-networks entry reports the guest's address");
            true
        }
        Err(e) => {
            agent.metrics().failure("kube_api");
            tracing::warn!(error = %crate::rpc::format_chain(&e),
                "could not update the pod-networks entry to the guest's address");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
    const SMAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const A: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 50);
    const B: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 77);

    fn entry(ip: &str) -> PodNetworkEntry {
        serde_json::from_str(&format!(
            r#"{{"ip_addresses":["{ip}"],"mac_address":"02:00:00:00:30:01",
                "gateway_ips":["192.0.2.1"],"role":"secondary","ipam_mode":"dhcp",
                "ip_address":"{ip}","routes":[{{"dest":"10.0.0.0/8","nextHop":"192.0.2.1"}}]}}"#
        ))
        .unwrap()
    }

    fn ovs(nad: Option<&str>) -> OvsIdentity {
        OvsIdentity {
            network: None,
            nad: nad.map(str::to_owned),
            pod_uid: Some("u".into()),
            sandbox: None,
            pod_if_name: None,
            mac: Some(SMAC),
            vf_netdev_name: None,
            vf_is_vfio: false,
        }
    }

    #[test]
    fn the_network_key_is_the_ports_nad_else_default() {
        assert_eq!(entry_key(&ovs(Some("ns/net"))), "ns/net");
        assert_eq!(entry_key(&ovs(None)), "default");
        assert_eq!(entry_key(&ovs(Some(""))), "default");
    }

    #[test]
    fn a_vm_pod_is_one_a_vmi_controls() {
        let mut pod = PodInfo {
            namespace: "ns".into(),
            name: "virt-launcher-x".into(),
            uid: Some("u".into()),
            labels: [("kubevirt.io".to_owned(), "virt-launcher".to_owned())].into(),
            owner_vmi: None,
            owner_vmi_uid: None,
            pod_networks: None,
            migration_job_name: None,
            node_name: None,
        };
        // A label claims nothing.
        assert!(!is_vm_pod(&pod));
        pod.owner_vmi = Some("vm1".into());
        assert!(is_vm_pod(&pod));
    }

    #[test]
    fn the_one_shots_ack_anchors_its_server_once_the_entry_names_its_address() {
        let mut n = EntryNetwork::default();
        let none = BTreeMap::new();
        // The one-shot's ACK, before ovnkube-node wrote the entry.
        n.saw_ack(S, S, SMAC, A);
        let v = n.view(None, &none, BTreeSet::new());
        assert!(v.servers.is_empty() && v.prefixes.is_empty());
        // The entry names A: S is the network's server, with its prefix.
        let e = entry("192.0.2.50/24");
        let v = n.view(Some(&e), &none, BTreeSet::new());
        assert_eq!(v.servers[&S], BTreeSet::from([SMAC]));
        assert_eq!(
            v.prefixes,
            BTreeSet::from([(Ipv4Addr::new(192, 0, 2, 0), 24)])
        );
        // And stays so once the entry moved on.
        let v = n.view(Some(&entry("192.0.2.77/24")), &none, BTreeSet::new());
        assert!(v.servers.contains_key(&S));
    }

    #[test]
    fn an_ack_for_another_address_or_not_from_its_server_anchors_nothing() {
        let mut n = EntryNetwork::default();
        let none = BTreeMap::new();
        let rogue = Ipv4Addr::new(192, 0, 2, 9);
        n.saw_ack(rogue, rogue, [9; 6], B);
        // Claims S but is sent from elsewhere.
        n.saw_ack(S, rogue, [9; 6], A);
        let v = n.view(Some(&entry("192.0.2.50/24")), &none, BTreeSet::new());
        assert!(v.servers.is_empty(), "{v:?}");
        // The servers of the network's leases on the node count.
        let known = BTreeMap::from([(S, BTreeSet::new())]);
        let v = n.view(Some(&entry("192.0.2.50/24")), &known, BTreeSet::from([B]));
        assert!(v.servers.contains_key(&S));
        assert!(v.held.contains(&B));
    }

    #[test]
    fn only_ports_that_left_are_gone() {
        let seen = BTreeSet::from(["a".to_owned(), "b".to_owned()]);
        assert_eq!(gone_ports(&seen, |p| p == "a"), ["b"]);
        assert!(gone_ports(&seen, |_| true).is_empty());
    }

    /// A migration target: the one-shot's ACK (A) on the port, the entry
    /// naming A seen by a sweep with no guest message, then the entry moved
    /// to the source's address B: the guest's ACK for B comes from a known
    /// server.
    #[test]
    fn an_entry_seen_without_a_guest_message_anchors_the_one_shots_server() {
        let mut n = EntryNetwork::default();
        let none = BTreeMap::new();
        n.saw_ack(S, S, SMAC, A);
        n.anchor(&entry("192.0.2.50/24"));
        let v = n.view(Some(&entry("192.0.2.77/24")), &none, BTreeSet::new());
        assert_eq!(v.servers[&S], BTreeSet::from([SMAC]));
        // Without the sweep's look, the moved entry anchors nothing.
        let mut m = EntryNetwork::default();
        m.saw_ack(S, S, SMAC, A);
        let v = m.view(Some(&entry("192.0.2.77/24")), &none, BTreeSet::new());
        assert!(v.servers.is_empty(), "{v:?}");
    }

    #[test]
    fn candidates_are_bounded() {
        let mut n = EntryNetwork::default();
        for i in 0..10u8 {
            n.saw_ack(S, S, SMAC, Ipv4Addr::new(192, 0, 2, 100 + i));
        }
        assert_eq!(n.candidates.len(), CANDIDATES);
        // The oldest went first.
        let v = n.view(
            Some(&entry("192.0.2.100/24")),
            &BTreeMap::new(),
            BTreeSet::new(),
        );
        assert!(v.servers.is_empty());
    }

    /// A move of the IPv4 address alone (with its prefix length and
    /// router when given).
    fn v4(ip: Ipv4Addr, len: Option<u8>, router: Option<Ipv4Addr>) -> EntryMove {
        EntryMove {
            v4: Some((ip, len, router)),
            ..EntryMove::default()
        }
    }

    fn v6(ip: &str, len: u8) -> EntryMove {
        EntryMove {
            v6: Some((ip.parse().unwrap(), len)),
            ..EntryMove::default()
        }
    }

    #[test]
    fn a_moved_entry_keeps_every_other_field() {
        let e = entry("192.0.2.50/24");
        let m = moved_entry(&e, &v4(B, Some(24), None)).unwrap();
        assert_eq!(m.ip_addresses, ["192.0.2.77/24"]);
        assert_eq!(m.gateway_ips, e.gateway_ips);
        assert_eq!(m.role, "secondary");
        assert_eq!(m.mac_address, e.mac_address);
        assert_eq!(m.ipam_mode.as_deref(), Some("dhcp"));
        assert_eq!(m.other["routes"], e.other["routes"]);
        // The same address: nothing to write.
        assert_eq!(moved_entry(&e, &v4(A, Some(24), None)), None);
        assert_eq!(moved_entry(&e, &v4(A, None, None)), None);
        assert_eq!(moved_entry(&e, &EntryMove::default()), None);
        // Another router moves the gateway.
        let r = Ipv4Addr::new(192, 0, 2, 254);
        let m = moved_entry(&e, &v4(A, Some(24), Some(r))).unwrap();
        assert_eq!(m.gateway_ips, ["192.0.2.254"]);
        // No prefix anywhere: nothing can be said.
        let mut bare = e.clone();
        bare.ip_addresses.clear();
        assert_eq!(moved_entry(&bare, &v4(B, None, None)), None);
        // The deprecated copy follows when merged into the annotation.
        let mut nets = PodNetworks::default();
        nets.set("ns/net", &e);
        nets.set("ns/net", &moved_entry(&e, &v4(B, Some(24), None)).unwrap());
        assert!(
            nets.raw("ns/net")
                .unwrap()
                .contains(r#""ip_address":"192.0.2.77/24""#)
        );
    }

    /// A dual-stack entry as ovnkube-node writes it: both addresses, both
    /// gateways.
    fn dual() -> PodNetworkEntry {
        let mut e = entry("192.0.2.50/24");
        e.ip_addresses.push("fd00:6::110/64".into());
        e.gateway_ips.push("fd00:6::1".into());
        e
    }

    #[test]
    fn an_ipv6_move_keeps_the_ipv4_address_and_every_other_field() {
        let e = dual();
        let m = moved_entry(&e, &v6("fd00:6::1a0", 64)).unwrap();
        assert_eq!(m.ip_addresses, ["192.0.2.50/24", "fd00:6::1a0/64"]);
        assert_eq!(m.gateway_ips, e.gateway_ips);
        assert_eq!(m.mac_address, e.mac_address);
        assert_eq!(m.role, e.role);
        assert_eq!(m.other["routes"], e.other["routes"]);
        assert_eq!(m.ipam_mode.as_deref(), Some("dhcp"));
        // An IPv4-only entry gains the IPv6 address after its IPv4 one.
        let m = moved_entry(&entry("192.0.2.50/24"), &v6("fd00:6::1a0", 64)).unwrap();
        assert_eq!(m.ip_addresses, ["192.0.2.50/24", "fd00:6::1a0/64"]);
        // Already there: nothing to write.
        assert_eq!(moved_entry(&e, &v6("fd00:6::110", 64)), None);
        // The deprecated single copy goes once there are two addresses
        // (OVN-Kubernetes refuses one that disagrees with the list).
        let mut nets = PodNetworks::default();
        nets.set("ns/net", &entry("192.0.2.50/24"));
        nets.set("ns/net", &m);
        let raw = nets.raw("ns/net").unwrap();
        assert!(!raw.contains(r#""ip_address""#), "{raw}");
    }

    #[test]
    fn an_ipv4_move_keeps_the_ipv6_address_and_gateway() {
        let e = dual();
        let r = Ipv4Addr::new(192, 0, 2, 254);
        let m = moved_entry(&e, &v4(B, Some(24), Some(r))).unwrap();
        assert_eq!(m.ip_addresses, ["192.0.2.77/24", "fd00:6::110/64"]);
        assert_eq!(m.gateway_ips, ["192.0.2.254", "fd00:6::1"]);
        // Both at once, each where its move puts it.
        let both = EntryMove {
            v4: Some((B, None, None)),
            v6: Some(("fd00:6::1a0".parse().unwrap(), 64)),
            configured6: vec![],
        };
        let m = moved_entry(&e, &both).unwrap();
        assert_eq!(m.ip_addresses, ["192.0.2.77/24", "fd00:6::1a0/64"]);
        assert_eq!(m.gateway_ips, e.gateway_ips);
    }

    #[test]
    fn self_configured_addresses_are_listed_after_the_ipv6_one_once() {
        let e = dual();
        let c: Ipv6Addr = "fd00:6::abc".parse().unwrap();
        let mv = EntryMove {
            configured6: vec![(c, 64)],
            ..EntryMove::default()
        };
        let m = moved_entry(&e, &mv).unwrap();
        assert_eq!(
            m.ip_addresses,
            ["192.0.2.50/24", "fd00:6::110/64", "fd00:6::abc/64"]
        );
        // Listed already: nothing to write.
        assert_eq!(moved_entry(&m, &mv), None);
        // An IPv6 move keeps them after the new address.
        let mv = EntryMove {
            v6: Some(("fd00:6::1a0".parse().unwrap(), 64)),
            configured6: vec![(c, 64)],
            ..EntryMove::default()
        };
        let m = moved_entry(&m, &mv).unwrap();
        assert_eq!(
            m.ip_addresses,
            ["192.0.2.50/24", "fd00:6::1a0/64", "fd00:6::abc/64"]
        );
    }

    const NET: &str = "localnet6";
    const VM_MAC: [u8; 6] = [2, 0, 0, 0, 0x30, 1];
    const POD_MAC: [u8; 6] = [2, 0, 0, 0, 0x40, 1];
    const SERVER_DUID: &[u8] = &[0, 3, 0, 1, 2, 0, 0x5e, 0, 0x53, 1];
    const OTHER_DUID: &[u8] = &[0, 3, 0, 1, 2, 0, 0x5e, 0, 0x53, 0x66];
    const SERVER_MAC: [u8; 6] = [2, 0, 0x5e, 0, 0x53, 1];

    fn ip6(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    /// A pod's DHCPv6 lease on `network` from `server`, its REPLY from
    /// `fe80::53` at [`SERVER_MAC`].
    fn lease6(network: &str, mac: [u8; 6], server: &[u8], address: &str) -> NodeLease6 {
        NodeLease6 {
            network: network.into(),
            mac,
            server: server.to_vec(),
            from: Some(xdhcp_engine::v6::Source::new(
                ip6("fe80::53"),
                Some(SERVER_MAC),
            )),
            address: ip6(address),
            prefix_len: 64,
        }
    }

    #[test]
    fn the_ipv6_view_is_the_networks_dhcpv6_leases_on_the_node() {
        let leases = [
            lease6(NET, POD_MAC, SERVER_DUID, "fd00:6::150"),
            // Another network's server and prefix vouch for nothing here.
            lease6("other", [2, 0, 0, 0, 0x50, 1], OTHER_DUID, "fd00:7::10"),
        ];
        let learned = [
            (
                "02:00:00:00:50:02".to_owned(),
                IpAddr::V6(ip6("fd00:6::160")),
            ),
            ("02:00:00:00:50:02".to_owned(), IpAddr::V4(B)),
            // The guest's own learned address is its own, not held.
            (format_mac(VM_MAC), IpAddr::V6(ip6("fd00:6::1a0"))),
        ];
        let v = view6(&leases, &learned, Some(NET), VM_MAC, None).unwrap();
        assert_eq!(
            v.servers.keys().collect::<Vec<_>>(),
            [&SERVER_DUID.to_vec()]
        );
        assert_eq!(
            v.servers[SERVER_DUID].ips,
            BTreeSet::from([ip6("fe80::53")])
        );
        assert_eq!(v.servers[SERVER_DUID].macs, BTreeSet::from([SERVER_MAC]));
        assert_eq!(v.prefixes, BTreeSet::from([(ip6("fd00:6::"), 64)]));
        // Other MACs' leases (whatever their network) and learned addresses.
        assert_eq!(
            v.held,
            BTreeSet::from([ip6("fd00:6::150"), ip6("fd00:7::10"), ip6("fd00:6::160")])
        );
        // The entry's IPv6 address adds its prefix.
        let mut e = dual();
        e.ip_addresses[1] = "fd00:8::5/64".into();
        let v = view6(&leases, &learned, Some(NET), VM_MAC, Some(&e)).unwrap();
        assert_eq!(
            v.prefixes,
            BTreeSet::from([(ip6("fd00:6::"), 64), (ip6("fd00:8::"), 64)])
        );
    }

    #[test]
    fn a_network_with_no_dhcpv6_lease_on_the_node_has_no_ipv6_view() {
        let other = [lease6("other", POD_MAC, OTHER_DUID, "fd00:7::10")];
        // Not even with an IPv6 address in the entry: a prefix alone
        // vouches for no server, and no server is anchored from nothing.
        let e = dual();
        assert_eq!(view6(&other, &[], Some(NET), VM_MAC, Some(&e)), None);
        assert_eq!(view6(&[], &[], Some(NET), VM_MAC, Some(&e)), None);
        // A port naming no network matches no lease.
        let ours = [lease6(NET, POD_MAC, SERVER_DUID, "fd00:6::150")];
        assert_eq!(view6(&ours, &[], None, VM_MAC, Some(&e)), None);
    }

    #[test]
    fn an_ipv6_address_is_reported_with_the_longest_prefix_holding_it() {
        let mut v = NetworkView6::default();
        v.prefixes.insert((ip6("fd00:6::"), 64));
        v.prefixes.insert((ip6("fd00::"), 16));
        assert_eq!(prefix_len6(Some(&v), ip6("fd00:6::1a0")), 64);
        assert_eq!(prefix_len6(Some(&v), ip6("fd00:9::1")), 16);
        assert_eq!(prefix_len6(Some(&v), ip6("2001:db8::1")), 128);
        assert_eq!(prefix_len6(None, ip6("fd00:6::1a0")), 128);
    }

    /// The guest's DHCPv6 messages and address probes on a port with no
    /// lease record, decided against [`view6`] as the learning loop does,
    /// with a host on the segment (or the guest) trying each check.
    mod attacks {
        use dhcproto::v6::MessageType;

        use super::*;
        use crate::bindings::learner::Direction;
        use crate::bindings::learner6::messages::{client, reply};
        use crate::bindings::learner6::{Learned6, Learner6, Refused6, Seen6, dad};

        const ATTACKER_MAC: [u8; 6] = [2, 0, 0x5e, 0, 0x53, 0x66];

        /// The node: a pod's lease of the network from the server, one of
        /// another network from another server; the entry (IPv4 only, as
        /// ovnkube-node wrote it).
        fn node_view() -> Option<NetworkView6> {
            let leases = [
                lease6(NET, POD_MAC, SERVER_DUID, "fd00:6::150"),
                lease6("other", POD_MAC, OTHER_DUID, "fd00:7::10"),
            ];
            view6(
                &leases,
                &[],
                Some(NET),
                VM_MAC,
                Some(&entry("192.0.2.50/24")),
            )
        }

        /// The guest REQUESTs `addr`; a REPLY from `server` (sent from
        /// `src`) binding `got` comes back.
        fn exchange(
            server: &[u8],
            src: (Ipv6Addr, [u8; 6]),
            got: Ipv6Addr,
            view: Option<NetworkView6>,
        ) -> Result<Option<Learned6>, Refused6> {
            let mut l = Learner6::default();
            let t0 = std::time::Instant::now();
            let request = client(MessageType::Request, 7, Some(got));
            let out = Seen6 {
                direction: Direction::FromGuest,
                src_mac: VM_MAC,
                src_ip: ip6("fe80::30:1"),
                payload: &request,
            };
            assert_eq!(l.observe(1, &out, t0, || None), Ok(None));
            let reply = reply(7, got, server);
            let back = Seen6 {
                direction: Direction::ToGuest,
                src_mac: src.1,
                src_ip: src.0,
                payload: &reply,
            };
            l.observe(1, &back, t0, || view)
        }

        const FROM_SERVER: (Ipv6Addr, [u8; 6]) =
            (Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0x53), SERVER_MAC);

        #[test]
        fn the_networks_server_binding_a_free_address_in_its_prefix_is_learned() {
            assert_eq!(
                exchange(SERVER_DUID, FROM_SERVER, ip6("fd00:6::1a0"), node_view()),
                Ok(Some(Learned6::Bound {
                    ip: ip6("fd00:6::1a0"),
                    valid_secs: Some(300)
                }))
            );
        }

        #[test]
        fn a_server_no_lease_of_the_network_was_served_by_is_refused() {
            let rogue = [9, 9, 9, 9];
            assert_eq!(
                exchange(&rogue, FROM_SERVER, ip6("fd00:6::1a0"), node_view()),
                Err(Refused6::UnknownServer(Some(rogue.to_vec())))
            );
            // Another network's server on the node is not this one's.
            assert_eq!(
                exchange(OTHER_DUID, FROM_SERVER, ip6("fd00:6::1a0"), node_view()),
                Err(Refused6::UnknownServer(Some(OTHER_DUID.to_vec())))
            );
        }

        #[test]
        fn the_servers_duid_from_another_host_on_the_segment_is_refused() {
            for src in [(FROM_SERVER.0, ATTACKER_MAC), (ip6("fe80::66"), SERVER_MAC)] {
                assert_eq!(
                    exchange(SERVER_DUID, src, ip6("fd00:6::1a0"), node_view()),
                    Err(Refused6::ServerSource {
                        src_ip: src.0,
                        src_mac: src.1
                    })
                );
            }
        }

        #[test]
        fn an_address_outside_the_networks_prefixes_or_a_neighbours_is_refused() {
            // Inside another network's prefix on the node.
            let outside = ip6("fd00:7::1a0");
            assert_eq!(
                exchange(SERVER_DUID, FROM_SERVER, outside, node_view()),
                Err(Refused6::OutsidePrefix(outside))
            );
            let neighbours = ip6("fd00:6::150");
            assert_eq!(
                exchange(SERVER_DUID, FROM_SERVER, neighbours, node_view()),
                Err(Refused6::AddressTaken(neighbours))
            );
        }

        #[test]
        fn with_nothing_on_the_node_for_the_network_a_reply_is_not_learned() {
            let leases = [lease6("other", POD_MAC, OTHER_DUID, "fd00:7::10")];
            let view = view6(&leases, &[], Some(NET), VM_MAC, Some(&dual()));
            assert_eq!(
                exchange(OTHER_DUID, FROM_SERVER, ip6("fd00:6::1a0"), view),
                Err(Refused6::UnknownNetwork)
            );
        }

        #[test]
        fn probes_for_a_neighbours_or_an_outside_address_are_refused() {
            let none = BTreeSet::new();
            let v = node_view().unwrap();
            let neighbours = ip6("fd00:6::150");
            assert_eq!(
                dad(neighbours, Some(&v), &none, &none),
                Err(Refused6::AddressTaken(neighbours))
            );
            let outside = ip6("fd00:7::99");
            assert_eq!(
                dad(outside, Some(&v), &none, &none),
                Err(Refused6::OutsidePrefix(outside))
            );
            let own = ip6("fd00:6::5054:ff:fe00:3001");
            assert_eq!(
                dad(own, Some(&v), &none, &none),
                Ok(Some(Learned6::Configured { ip: own }))
            );
        }
    }
}
