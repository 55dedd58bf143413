//! The workload ports of the integration bridge, read from Open vSwitch:
//! the guard goes on a port of a DHCP network as soon as the port is in the
//! database — before the CNI ADD reaches the agent, and whether or not one
//! ever does (a VM whose DHCP is OVN-Kubernetes' own, an ADD that never
//! comes) — and comes off when the port leaves it.
//!
//! OVN-Kubernetes' CNI adds each pod's host-side port to `br-int` with the
//! pod's identity in the Interface's `external_ids` (`iface-id-ver`: the
//! pod UID, `sandbox`, `attached_mac`, `pod-if-name`, `k8s.ovn.org/network`,
//! `k8s.ovn.org/nad`, for SR-IOV `vf-netdev-name` / `vf-is-vfio`) before it
//! calls the IPAM plugin. The follower here keeps that table from the
//! [`xdhcp_ovsdb::NodeWatch`] view and hands the guard plain data
//! ([`GuardService::protect_found`]); the ADD that follows finds the guard
//! on and only sets its network's policy.
//!
//! A DHCP network is one named by `--dhcp-network` (the network or the NAD,
//! as the port names them), or one the agent has served since it started:
//! a network a lease is held on (including those it resumed), and the
//! network of a port found here that an ADD has guarded — learned the
//! moment that ADD's guard goes on ([`GuardService::added`]), beside its
//! exchange, not at the next look a second later (a lease that lives a
//! few milliseconds would be missed). Its first pod on a node is guarded
//! at its ADD, every later port from the moment it appears, and the first
//! one stays guarded after its DEL while Open vSwitch holds it. A port of
//! any other network is left alone: a DHCP server pod on a network xdhcp
//! does not serve is none of the agent's business.
//!
//! The policy of a port found this way is its network's `ipam.dhcpGuard`
//! as the network's latest lease carried it, else the defaults; an ADD's
//! own (a VM's single client among it) wins once it comes. A port whose
//! pod a `VirtualMachineInstance` controls gets the VM policy from the
//! start (learning and the broadcast rewrite): OVN-Kubernetes sends no ADD
//! for its VMs ([`crate::ops::ovnk_vm`]). While the database is away the
//! ports last read stay guarded.
//!
//! On a node without uplinks (none named by `--uplink`, none in
//! `ovn-bridge-mappings` the capture can hold), the same ports are handed
//! to the capture actor too ([`crate::datapath::capture::Capture::set_found_ports`]):
//! its program goes on each port's host side at TC egress, where the
//! replies to the pod leave the switch on both datapaths, so the ADD that
//! follows finds its replies captured from its first DISCOVER and nothing
//! is attached on or after its path. With an uplink, replies are taken
//! there and nothing is attached per port. Either way the port's capture
//! goes when the port leaves the database (docs/dhcp-guard.md, "Replies
//! captured before the ADD").

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use xdhcp_ovsdb::{NodeState, WorkloadPort};

use crate::cni::config::DhcpGuardSpec;
use crate::datapath::capture::FoundPortSpec;
use crate::datapath::ebpf::PortPolicy;
use crate::guard::{GuardService, GuardedPort, OvsIdentity, port_policy};
use crate::ops::context::Agent;
use crate::sys::sync::lock;

/// How often the follower looks again without a database change: a network
/// becomes a DHCP network when a lease on it starts, which the database
/// does not say.
const RECHECK: Duration = Duration::from_secs(1);

/// Which networks are DHCP networks, and with what guard settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct DhcpNetworks {
    /// `--dhcp-network`: network names or NAD keys.
    named: BTreeSet<String>,
    /// Networks leased on since start, with the `ipam.dhcpGuard` of the
    /// latest lease seen on each.
    served: BTreeMap<String, DhcpGuardSpec>,
}

impl DhcpNetworks {
    pub(super) fn named(names: &[String]) -> Self {
        Self {
            named: names.iter().cloned().collect(),
            served: BTreeMap::new(),
        }
    }

    /// Network `name` is leased on, with `spec`.
    pub(super) fn served(&mut self, name: &str, spec: DhcpGuardSpec) {
        self.served.insert(name.to_owned(), spec);
    }

    /// The guard settings of `port`'s network, or `None` when it is no
    /// DHCP network (the default network's ports name none).
    fn spec_for(&self, port: &WorkloadPort) -> Option<DhcpGuardSpec> {
        let network = port.network.as_deref();
        if let Some(spec) = network.and_then(|n| self.served.get(n)) {
            return Some(*spec);
        }
        let named = |v: Option<&str>| v.is_some_and(|v| self.named.contains(v));
        (named(network) || named(port.nad.as_deref())).then(DhcpGuardSpec::default)
    }
}

/// A port the guard is to be on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Wanted {
    pub(super) host_ifname: String,
    /// The attachment its `external_ids` name: (sandbox, pod interface).
    pub(super) key: (String, String),
    pub(super) policy: PortPolicy,
    pub(super) ovs: OvsIdentity,
}

/// What to change so that the guard holds exactly the DHCP ports of the
/// view (among those it found in OVS).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Plan {
    /// Ports to guard, or whose OVS identity or policy changed.
    pub(super) guard: Vec<Wanted>,
    /// Host interfaces to let go of (gone from the view, or no longer of a
    /// DHCP network).
    pub(super) release: Vec<String>,
}

impl Plan {
    fn is_empty(&self) -> bool {
        self.guard.is_empty() && self.release.is_empty()
    }
}

/// What OVS says about `port`, as the guard keeps it.
fn identity_of(port: &WorkloadPort) -> OvsIdentity {
    OvsIdentity {
        network: port.network.clone(),
        nad: port.nad.clone(),
        pod_uid: port.pod_uid.clone(),
        sandbox: port.sandbox.clone(),
        pod_if_name: port.pod_if_name.clone(),
        mac: port.attached_mac.map(|m| m.0),
        vf_netdev_name: port.vf_netdev_name.clone(),
        vf_is_vfio: port.vf_is_vfio,
    }
}

/// The ports of `ports` the guard should be on: those of a DHCP network.
#[cfg(test)]
pub(super) fn wanted(ports: &[WorkloadPort], nets: &DhcpNetworks) -> Vec<Wanted> {
    wanted_with(ports, nets, |_| false)
}

/// [`wanted`], with `vm` saying which ports are a VM's: those get the VM
/// policy (learning and the broadcast rewrite on `attached_mac`), as a VM
/// ADD would set it — OVN-Kubernetes sends none for its VMs
/// ([`crate::ops::ovnk_vm`]).
pub(super) fn wanted_with(
    ports: &[WorkloadPort],
    nets: &DhcpNetworks,
    vm: impl Fn(&OvsIdentity) -> bool,
) -> Vec<Wanted> {
    ports
        .iter()
        .filter_map(|p| {
            let spec = nets.spec_for(p)?;
            let ovs = identity_of(p);
            Some(Wanted {
                host_ifname: p.ifname.clone(),
                key: (
                    ovs.sandbox.clone().unwrap_or_default(),
                    ovs.pod_if_name.clone().unwrap_or_default(),
                ),
                policy: port_policy(&spec, ovs.mac, vm(&ovs)),
                ovs,
            })
        })
        .collect()
}

/// The step from `held` (the guarded ports the guard found in OVS) to
/// `wanted`. A port an ADD holds keeps the ADD's policy, so only its OVS
/// identity is compared. A wanted policy is the one without a
/// `DhcpGuardPolicy` (the guard applies the network's object itself), so it
/// is compared with the port's `base`.
pub(super) fn plan(wanted: &[Wanted], held: &[GuardedPort]) -> Plan {
    let by_port: HashMap<&str, &GuardedPort> =
        held.iter().map(|h| (h.host_ifname.as_str(), h)).collect();
    let wanted_ports: HashSet<&str> = wanted.iter().map(|w| w.host_ifname.as_str()).collect();
    let mut out = Plan::default();
    for w in wanted {
        let same = by_port.get(w.host_ifname.as_str()).is_some_and(|h| {
            h.identity.ovs.as_ref() == Some(&w.ovs) && (h.identity.cni || h.base == w.policy)
        });
        if !same {
            out.guard.push(w.clone());
        }
    }
    for h in held {
        if !wanted_ports.contains(h.host_ifname.as_str()) {
            out.release.push(h.host_ifname.clone());
        }
    }
    out
}

/// The networks (with the guard settings of their ADD) of the ports of
/// `ports` that an ADD holds among `guarded`: an ADD on a port of a
/// network makes it a DHCP network, from the moment its guard is on.
pub(super) fn networks_of_adds(
    ports: &[WorkloadPort],
    guarded: &[GuardedPort],
) -> Vec<(String, DhcpGuardSpec)> {
    let network: HashMap<&str, &str> = ports
        .iter()
        .filter_map(|p| Some((p.ifname.as_str(), p.network.as_deref()?)))
        .collect();
    guarded
        .iter()
        .filter(|g| g.identity.cni)
        .filter_map(|g| {
            let net = network.get(g.host_ifname.as_str())?;
            // The ADD's own settings, not a `DhcpGuardPolicy`'s (the guard
            // applies that on every port of the network by itself).
            let spec = DhcpGuardSpec {
                trusted: g.base.trusted,
                rate: g.base.rate,
                burst: g.base.burst,
            };
            Some(((*net).to_owned(), spec))
        })
        .collect()
}

/// The found ports the capture is to hold: with no uplink (`uplinks`:
/// whether the node has one, named or in the view), the wanted ports that
/// name their pod's MAC; with one, none.
pub(super) fn found_ports(wanted: &[Wanted], uplinks: bool) -> Vec<FoundPortSpec> {
    if uplinks {
        return Vec::new();
    }
    wanted
        .iter()
        .filter_map(|w| {
            Some(FoundPortSpec {
                ifname: w.host_ifname.clone(),
                mac: w.ovs.mac?,
                network: w.ovs.network.clone(),
            })
        })
        .collect()
}

/// Follow the workload ports of `rx` until `token` is cancelled: the guard
/// on them (when it is on), and their host-side capture (when the node has
/// no uplink and the eBPF datapath is loaded). With neither the task only
/// waits.
pub(super) async fn follow_ports(
    agent: Arc<Agent>,
    mut rx: watch::Receiver<NodeState>,
    token: CancellationToken,
) {
    let capture = agent.capture().has_ebpf();
    if !agent.guard.is_on() && !capture {
        token.cancelled().await;
        return;
    }
    let mut follower = Follower {
        nets: DhcpNetworks::named(&agent.args.dhcp_networks),
        named_uplinks: !agent.args.uplinks.is_empty(),
        agent,
        ports: None,
        userspace: None,
        view_uplinks: false,
        failed: BTreeMap::new(),
    };
    let mut tick = tokio::time::interval(RECHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let guard = follower.agent.guard.clone();
    let mut open = true;
    loop {
        if let NodeState::Ready(view) = &*rx.borrow_and_update() {
            follower.ports = Some(view.workloads.clone());
            follower.userspace = Some(super::uplinks::userspace_ports(view));
            follower.view_uplinks = super::uplinks::has_uplinks(view);
        }
        follower.pass().await;
        tokio::select! {
            () = token.cancelled() => return,
            r = rx.changed(), if open => open = r.is_ok(),
            () = guard.added() => {}
            _ = tick.tick() => {}
        }
    }
}

struct Follower {
    agent: Arc<Agent>,
    nets: DhcpNetworks,
    /// The workload ports last read; `None` until a view is read.
    ports: Option<Vec<WorkloadPort>>,
    /// The ports of a userspace-datapath integration bridge in the view
    /// last read, not yet handed to the guard (they are policed at XDP).
    userspace: Option<std::collections::BTreeSet<String>>,
    /// `--uplink` given.
    named_uplinks: bool,
    /// The view last read has uplinks the capture can hold.
    view_uplinks: bool,
    /// Ports the guard could not take, with the error last logged (each
    /// logged once, retried every pass).
    failed: BTreeMap<String, String>,
}

impl Follower {
    async fn pass(&mut self) {
        self.note_adds();
        self.note_served();
        let Some(ports) = &self.ports else {
            return;
        };
        let agent = &self.agent;
        let wanted = wanted_with(ports, &self.nets, |ovs| {
            crate::ops::ovnk_vm::is_vm_port(agent, ovs)
        });
        // The capture first: attaching runs in the capture actor's
        // background, and a port's ADD may follow at once.
        let uplinks = self.named_uplinks || self.view_uplinks;
        self.agent
            .capture()
            .set_found_ports(&found_ports(&wanted, uplinks));
        if !self.agent.guard.is_on() {
            return;
        }
        // Then the hook each port needs, so that ports guarded below start
        // on it. Moving a port's hook takes RTNL: a blocking thread.
        if let Some(userspace) = self.userspace.take() {
            let guard = self.agent.guard.clone();
            let _ = tokio::task::spawn_blocking(move || guard.set_userspace_ports(userspace)).await;
        }
        let plan = plan(&wanted, &self.agent.guard.found_ports());
        if plan.is_empty() {
            return;
        }
        let guard = self.agent.guard.clone();
        // Attaching takes RTNL: on a blocking thread.
        let outcome = tokio::task::spawn_blocking(move || apply(&guard, plan)).await;
        let Ok(outcome) = outcome else {
            warn!("the guard's attach task for OVS ports failed");
            return;
        };
        self.failed
            .retain(|port, _| outcome.iter().any(|(p, _)| p == port));
        for (port, error) in outcome {
            if self.failed.get(&port) != Some(&error) {
                self.agent.metrics().failure("dhcp_guard");
                warn!(%port, %error, "could not put the DHCP guard on a port found in Open vSwitch; retrying");
                self.failed.insert(port, error);
            }
        }
    }

    /// The network of every port found here that an ADD holds is a DHCP
    /// network from now on (a lease's own settings, below, win).
    fn note_adds(&mut self) {
        let Some(ports) = &self.ports else {
            return;
        };
        let guarded: Vec<GuardedPort> = self
            .agent
            .guard
            .ports()
            .into_iter()
            .map(|(_, p)| p)
            .collect();
        for (net, spec) in networks_of_adds(ports, &guarded) {
            self.nets.served(&net, spec);
        }
    }

    /// Every network a lease is held on is a DHCP network from now on.
    fn note_served(&mut self) {
        for h in self.agent.leases.all() {
            let l = lock(&h.live);
            let net = &l.record.network;
            self.nets.served(
                &net.name,
                crate::ops::network::guard_spec(net.ipam.dhcp_guard),
            );
        }
    }
}

/// Apply the cluster's `DhcpGuardPolicy` table (`table`, kept by the
/// watch in [`crate::kube::guard_policies`]) to the guarded ports until
/// `token` is cancelled: each change goes to every port of its network at
/// once, in the kernel map in place.
pub(super) async fn follow_guard_policies(
    agent: Arc<Agent>,
    mut table: watch::Receiver<crate::kube::guard_policies::GuardTable>,
    token: CancellationToken,
) {
    loop {
        let now = table.borrow_and_update().clone();
        let guard = agent.guard.clone();
        // Updating a port's egress filter takes RTNL: a blocking thread.
        match tokio::task::spawn_blocking(move || guard.set_overrides(now)).await {
            Ok(changed) => {
                for (port, outcome) in changed {
                    match outcome {
                        Ok(policy) => {
                            info!(%port, ?policy, "DHCP guard settings of the port's network changed");
                        }
                        Err(error) => {
                            agent.metrics().failure("dhcp_guard");
                            warn!(%port, %error, "could not give a port its network's new DHCP guard settings");
                        }
                    }
                }
            }
            Err(e) => warn!(error = %e, "the guard's update task failed"),
        }
        tokio::select! {
            () = token.cancelled() => return,
            r = table.changed() => if r.is_err() {
                token.cancelled().await;
                return;
            },
        }
    }
}

/// Carries `plan` out; the ports that failed, with why.
fn apply(guard: &GuardService, plan: Plan) -> Vec<(String, String)> {
    for port in &plan.release {
        guard.release_found(port);
        info!(%port, "the port left Open vSwitch (or its network is no DHCP network): no longer guarded for it");
    }
    let mut failed = Vec::new();
    for w in plan.guard {
        let held = guard.port_on(&w.host_ifname).is_some();
        match guard.protect_found(w.key, &w.host_ifname, w.policy, w.ovs.clone()) {
            Ok(Some(p)) if !held => info!(port = %w.host_ifname,
                network = w.ovs.network.as_deref().unwrap_or("-"),
                pod_uid = w.ovs.pod_uid.as_deref().unwrap_or("-"),
                policy = ?p.policy, "DHCP guard on a port found in Open vSwitch"),
            Ok(_) => {}
            Err(e) => failed.push((w.host_ifname, crate::rpc::format_chain(&e))),
        }
    }
    failed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::Identity;

    fn port(ifname: &str, network: Option<&str>, nad: Option<&str>) -> WorkloadPort {
        WorkloadPort {
            ifname: ifname.to_owned(),
            iface_id: format!("ns.nad_ns_{ifname}"),
            pod_uid: Some(format!("uid-{ifname}")),
            sandbox: Some(format!("sandbox-{ifname}")),
            attached_mac: Some(xdhcp_ovsdb::Mac([0x0a, 0x58, 0, 0, 0, 1])),
            pod_if_name: Some("net1".to_owned()),
            network: network.map(str::to_owned),
            nad: nad.map(str::to_owned),
            vf_netdev_name: None,
            vf_is_vfio: false,
            ovn_installed: true,
        }
    }

    fn held(w: &Wanted, cni: bool) -> GuardedPort {
        GuardedPort {
            host_ifname: w.host_ifname.clone(),
            ifindex: 7,
            policy: w.policy,
            base: w.policy,
            network: crate::guard::NetworkNames::of_ovs(&w.ovs),
            identity: Identity {
                ovs: Some(w.ovs.clone()),
                cni,
            },
            hook: crate::datapath::ebpf::GuardHook::Tc,
        }
    }

    #[test]
    fn only_ports_of_dhcp_networks_are_wanted_by_network_or_nad() {
        let ports = [
            port("a_3", Some("ns_dhcp"), Some("ns/dhcp")),
            port("b_4", Some("ns_static"), Some("ns/static")),
            // The default network: no network named on the port.
            port("c", None, None),
            port("d_5", Some("ns_other"), Some("ns/by-nad")),
        ];
        let nets = DhcpNetworks::named(&["ns_dhcp".to_owned(), "ns/by-nad".to_owned()]);
        let w = wanted(&ports, &nets);
        let names: Vec<_> = w.iter().map(|w| w.host_ifname.as_str()).collect();
        assert_eq!(names, ["a_3", "d_5"]);
        assert_eq!(w[0].key, ("sandbox-a_3".to_owned(), "net1".to_owned()));
        assert_eq!(w[0].ovs.pod_uid.as_deref(), Some("uid-a_3"));
        assert_eq!(w[0].ovs.mac, Some([0x0a, 0x58, 0, 0, 0, 1]));
        assert_eq!(
            w[0].policy,
            port_policy(
                &DhcpGuardSpec::default(),
                Some([0x0a, 0x58, 0, 0, 0, 1]),
                false
            )
        );
        // No network named at all: nothing is wanted.
        assert!(wanted(&ports, &DhcpNetworks::default()).is_empty());
    }

    #[test]
    fn a_network_leased_on_becomes_a_dhcp_network_with_its_lease_s_guard_settings() {
        let ports = [port("a_3", Some("ns_dhcp"), Some("ns/dhcp"))];
        let mut nets = DhcpNetworks::default();
        assert!(wanted(&ports, &nets).is_empty());
        let spec = DhcpGuardSpec {
            trusted: false,
            rate: 3,
            burst: 4,
        };
        nets.served("ns_dhcp", spec);
        let w = wanted(&ports, &nets);
        assert_eq!(w.len(), 1);
        assert_eq!(
            w[0].policy,
            port_policy(&spec, Some([0x0a, 0x58, 0, 0, 0, 1]), false)
        );
    }

    #[test]
    fn the_plan_guards_new_ports_releases_gone_ones_and_leaves_the_rest() {
        let nets = DhcpNetworks::named(&["n".to_owned()]);
        let a = port("a_3", Some("n"), None);
        let b = port("b_4", Some("n"), None);
        let w = wanted(&[a.clone(), b], &nets);
        // Nothing held: both guarded.
        let p = plan(&w, &[]);
        assert_eq!(p.guard, w);
        assert!(p.release.is_empty());
        // Both held as wanted: nothing to do.
        let both = [held(&w[0], false), held(&w[1], false)];
        assert!(plan(&w, &both).is_empty());
        // b left the database: released; a stays.
        let only_a = wanted(&[a], &nets);
        let p = plan(&only_a, &both);
        assert!(p.guard.is_empty());
        assert_eq!(p.release, ["b_4"]);
    }

    #[test]
    fn a_changed_identity_or_policy_is_handed_again_but_an_add_s_policy_stays() {
        let nets = DhcpNetworks::named(&["n".to_owned()]);
        let w = wanted(&[port("a_3", Some("n"), None)], &nets);
        // The pod UID changed on the same port (a new pod, same name).
        let mut old = held(&w[0], false);
        old.identity.ovs.as_mut().unwrap().pod_uid = Some("uid-old".into());
        assert_eq!(plan(&w, &[old]).guard, w);
        // Another policy, no ADD: the network's policy is set.
        let mut other = held(&w[0], false);
        other.base.rate += 1;
        assert_eq!(plan(&w, &[other.clone()]).guard, w);
        // An ADD holds it: its policy wins, nothing to do.
        other.identity.cni = true;
        assert!(plan(&w, &[other]).is_empty());
        // The network's DhcpGuardPolicy changed the policy in the kernel:
        // the port's policy without it is what is compared; nothing to do.
        let mut tuned = held(&w[0], false);
        tuned.policy.rate = 1;
        tuned.policy.trusted = true;
        assert!(plan(&w, &[tuned]).is_empty());
    }

    #[test]
    fn without_an_uplink_the_wanted_ports_with_a_mac_are_captured_on_their_host_side() {
        let nets = DhcpNetworks::named(&["n".to_owned()]);
        let mut no_mac = port("b_4", Some("n"), None);
        no_mac.attached_mac = None;
        let w = wanted(
            &[
                port("a_3", Some("n"), None),
                no_mac,
                port("c_5", Some("other"), None),
            ],
            &nets,
        );
        assert_eq!(w.len(), 2);
        // No uplink: the port that names its pod's MAC (a lease finds its
        // port by it); one without cannot be taken, so is not captured.
        assert_eq!(
            found_ports(&w, false),
            [FoundPortSpec {
                ifname: "a_3".to_owned(),
                mac: [0x0a, 0x58, 0, 0, 0, 1],
                network: Some("n".to_owned()),
            }]
        );
        // An uplink takes the replies: nothing per port.
        assert!(found_ports(&w, true).is_empty());
    }

    #[test]
    fn a_vm_port_gets_learning_and_the_broadcast_rewrite_and_a_pod_port_does_not() {
        let nets = DhcpNetworks::named(&["n".to_owned()]);
        let ports = [
            port("vm_3", Some("n"), None),
            port("pod_4", Some("n"), None),
        ];
        let w = wanted_with(&ports, &nets, |ovs| {
            ovs.pod_uid.as_deref() == Some("uid-vm_3")
        });
        let mac = Some([0x0a, 0x58, 0, 0, 0, 1]);
        assert_eq!(
            w[0].policy,
            port_policy(&DhcpGuardSpec::default(), mac, true)
        );
        assert!(w[0].policy.learn);
        assert!(!w[1].policy.learn);
        // The pod becomes known as a VM's later: the policy is handed again.
        let before = [held(&wanted(&ports, &nets)[0], false)];
        assert_eq!(plan(&w[..1], &before).guard, w[..1]);
    }

    #[test]
    fn a_port_an_add_guarded_makes_its_network_one_whose_next_port_is_guarded_when_it_appears() {
        let first = port("a_3", Some("n"), None);
        let mut nets = DhcpNetworks::default();
        // Not a DHCP network yet: the first port is not wanted.
        assert!(wanted(std::slice::from_ref(&first), &nets).is_empty());
        // Its ADD guards it, with the network's settings.
        let spec = DhcpGuardSpec {
            trusted: false,
            rate: 7,
            burst: 9,
        };
        let add = GuardedPort {
            host_ifname: "a_3".to_owned(),
            ifindex: 7,
            policy: port_policy(&spec, Some([0x0a, 0x58, 0, 0, 0, 1]), false),
            base: port_policy(&spec, Some([0x0a, 0x58, 0, 0, 0, 1]), false),
            network: crate::guard::NetworkNames::default(),
            identity: Identity {
                ovs: None,
                cni: true,
            },
            hook: crate::datapath::ebpf::GuardHook::Xdp,
        };
        // A port found in OVS only (no ADD) teaches nothing.
        let found = GuardedPort {
            identity: Identity {
                ovs: Some(identity_of(&first)),
                cni: false,
            },
            ..add.clone()
        };
        let other = port("b_4", Some("other"), None);
        assert!(networks_of_adds(&[first.clone(), other.clone()], &[found]).is_empty());
        let learned = networks_of_adds(&[first.clone(), other.clone()], &[add]);
        assert_eq!(learned, [("n".to_owned(), spec)]);
        for (net, spec) in learned {
            nets.served(&net, spec);
        }
        // The first port is wanted now (it stays guarded after its DEL
        // while OVS holds it), and so is the next port of the network,
        // from the moment it appears, with the ADD's settings; another
        // network's is not.
        let next = port("c_5", Some("n"), None);
        let w = wanted(&[first, next, other], &nets);
        let names: Vec<_> = w.iter().map(|w| w.host_ifname.as_str()).collect();
        assert_eq!(names, ["a_3", "c_5"]);
        assert_eq!(
            w[1].policy,
            port_policy(&spec, Some([0x0a, 0x58, 0, 0, 0, 1]), false)
        );
    }

    #[test]
    fn a_port_whose_network_stops_being_named_is_released() {
        let a = port("a_3", Some("n"), None);
        let w = wanted(
            std::slice::from_ref(&a),
            &DhcpNetworks::named(&["n".to_owned()]),
        );
        let p = plan(
            &wanted(&[a], &DhcpNetworks::default()),
            &[held(&w[0], true)],
        );
        assert_eq!(p.release, ["a_3"]);
    }
}
