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
//! - [`moved_entry`]: the entry moved to the guest's address, every other
//!   field kept; written by [`write_entry`] with the pod's UID and
//!   resourceVersion as preconditions.
//! - Live migration: a migration target's port takes the source pod's
//!   address, prefix length and gateway ([`migration_source_address`])
//!   while its guest, keeping its lease, asks nothing (its one-shot's
//!   server anchored first, [`EntryNetwork::anchor`]); a port that leaves OVS loses the bindings learned
//!   on it ([`gone_ports`]), and nothing is sent for the VM.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::Ipv4Addr;

use tracing::info;

use crate::bindings::format_mac;
use crate::bindings::learner::NetworkView;
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

/// `entry` moved to `ip` (with `prefix_len`, and `router` as its gateway
/// when given): every other field kept, `ipam_mode` `dhcp`. `None` when
/// it already reports that address and prefix.
pub(crate) fn moved_entry(
    entry: &PodNetworkEntry,
    ip: Ipv4Addr,
    prefix_len: Option<u8>,
    router: Option<Ipv4Addr>,
) -> Option<PodNetworkEntry> {
    let now = entry_address(entry);
    let len = prefix_len.or(now.map(|(_, l)| l))?;
    let gateways: Vec<String> = match router {
        Some(r) => vec![r.to_string()],
        None => entry.gateway_ips.clone(),
    };
    if now == Some((ip, len)) && gateways == entry.gateway_ips {
        return None;
    }
    let mut moved = entry.clone();
    moved.ip_addresses = vec![format!("{ip}/{len}")];
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

/// Moves the `pod-networks` entry of the VM pod of `ovs` to `ip` (read
/// fresh from the API; written under the pod's UID and resourceVersion;
/// an entry already there is left). Whether it is as wanted (no pod, no
/// entry: nothing to write, done).
pub(crate) async fn write_entry(
    agent: &Agent,
    ovs: &OvsIdentity,
    ip: Ipv4Addr,
    prefix_len: Option<u8>,
    router: Option<Ipv4Addr>,
) -> bool {
    let Some(known) = pod_of(agent, ovs) else {
        info!(pod_uid = ?ovs.pod_uid, %ip, "the port's pod is not known; the entry is not written");
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
        info!(pod = %format!("{}/{}", pod.namespace, pod.name), network = key, %ip,
            "the pod has no entry for the network (OVN-Kubernetes writes it); nothing written");
        return true;
    };
    let Some(moved) = moved_entry(&entry, ip, prefix_len, router) else {
        return true;
    };
    let guard = WriteGuard::uid(pod.uid.as_deref());
    match agent
        .pod_api
        .set_network_entry_guarded(&pod.namespace, &pod.name, &guard, key, moved)
        .await
    {
        Ok(()) => {
            info!(pod = %format!("{}/{}", pod.namespace, pod.name), network = key, %ip,
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

    #[test]
    fn a_moved_entry_keeps_every_other_field() {
        let e = entry("192.0.2.50/24");
        let m = moved_entry(&e, B, Some(24), None).unwrap();
        assert_eq!(m.ip_addresses, ["192.0.2.77/24"]);
        assert_eq!(m.gateway_ips, e.gateway_ips);
        assert_eq!(m.role, "secondary");
        assert_eq!(m.mac_address, e.mac_address);
        assert_eq!(m.ipam_mode.as_deref(), Some("dhcp"));
        assert_eq!(m.other["routes"], e.other["routes"]);
        // The same address: nothing to write.
        assert_eq!(moved_entry(&e, A, Some(24), None), None);
        assert_eq!(moved_entry(&e, A, None, None), None);
        // Another router moves the gateway.
        let r = Ipv4Addr::new(192, 0, 2, 254);
        let m = moved_entry(&e, A, Some(24), Some(r)).unwrap();
        assert_eq!(m.gateway_ips, ["192.0.2.254"]);
        // No prefix anywhere: nothing can be said.
        let mut bare = e.clone();
        bare.ip_addresses.clear();
        assert_eq!(moved_entry(&bare, B, None, None), None);
        // The deprecated copy follows when merged into the annotation.
        let mut nets = PodNetworks::default();
        nets.set("ns/net", &e);
        nets.set("ns/net", &moved_entry(&e, B, Some(24), None).unwrap());
        assert!(
            nets.raw("ns/net")
                .unwrap()
                .contains(r#""ip_address":"192.0.2.77/24""#)
        );
    }
}
