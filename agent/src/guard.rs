//! The DHCP guard actor: which workload ports are guarded, with what policy.
//!
//! At ADD the agent finds the host end of the pod interface (the veth's
//! peer, which must live in the agent's own namespace: the node's) and
//! attaches the guard programs there before the first DHCP message; at DEL
//! it detaches them. A pod interface that is not a veth (macvlan, a VF) or
//! whose peer lives elsewhere is not guarded, and the log says so.
//!
//! A port can also be found before its ADD: the daemon reads the workload
//! ports of the integration bridge from Open vSwitch and hands each port of
//! a DHCP network here ([`GuardService::protect_found`]) as soon as it is
//! in the database; it takes it away when the port leaves the database
//! ([`GuardService::release_found`]). The ADD that follows for the same port
//! finds the guard on and only sets the network's policy: one attachment,
//! whichever came first, and each port remembers where its identity came
//! from ([`Identity`]).
//!
//! The attachments are TC filters, and XDP programs attached through
//! netlink: they stay on their ports when the agent stops or is killed
//! (each holds its program and maps), so no port is bare while the agent
//! restarts; [`GuardService::protect`] is called again for every lease the
//! agent resumes at start and replaces the program an earlier agent left
//! in one step (with the very same program when this agent took the
//! guard's programs from the pins an agent of its build left). With a bpffs, the guard's tables are pinned: the next agent
//! carries on with each port's entry, and releases the ports nothing
//! claims again ([`GuardService::release_unclaimed`]).
//!
//! Where a port is policed depends on who reads it. A Linux bridge, the
//! kernel datapath of Open vSwitch and the routing stack all take a frame
//! after TC ingress, so the ingress program runs there. A port of an Open
//! vSwitch bridge on the userspace datapath (`datapath_type=netdev`) is
//! read by `ovs-vswitchd` through a packet socket, which the kernel feeds
//! after XDP and before TC ingress: a rogue OFFER dropped at TC ingress has
//! already been forwarded. Those ports (the daemon tells, from the OVS
//! database: [`GuardService::set_userspace_ports`]) are policed at XDP.
//!
//! The policy on a port is its network's: what the ADD's network config
//! asks (`ipam.dhcpGuard`, capped by the agent's flags), else the
//! defaults, each field overridden by the cluster-scoped `DhcpGuardPolicy`
//! naming the port's NAD or network when there is one
//! ([`GuardService::set_overrides`], [`with_overrides`]). Each port keeps
//! the policy it would have without an object (its `base`) and the names
//! of its network, so an object that comes, changes or goes is applied to
//! every port of its network at once, in the kernel map in place.
//!
//! One thing: the table of guarded workload ports and the policy on each,
//! whichever of the ADD, a resumed lease or Open vSwitch found the port
//! (about 700 lines, most of them the ways a port comes and goes).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::fd::AsFd as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tracing::{debug, info, warn};
use xdhcp_api::guard::GuardOverrides;

use crate::bindings::LearnedStore;
use crate::cni::config::DhcpGuardSpec;
use crate::datapath::ebpf::{
    AttachTarget, EbpfDatapathError, Guard, GuardCounters, GuardHook, LearnCounters, PortPolicy,
};
use crate::datapath::link::PortPrepared;
use crate::netlink::{PeerLookup, veth_peer_here};
use crate::settings::{AgentArgs, GuardChoice};
use crate::sys::netns::run_in_netns_async;

mod ahead;

/// How long after recovery the guard reconciles what an earlier agent
/// left ([`GuardService::release_unclaimed`]): the resumed leases' ports
/// are guarded during recovery; this leaves the follower of Open vSwitch
/// time to read the database and guard the ports it finds.
const RECONCILE_AFTER: std::time::Duration = std::time::Duration::from_secs(5);

/// Why a port could not be guarded.
#[derive(Debug, thiserror::Error)]
pub(crate) enum GuardError {
    #[error("finding the host end of {ifname} in {}: {source}", netns.display())]
    Peer {
        ifname: String,
        netns: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Netns(#[from] crate::sys::netns::NetnsError),
    #[error("opening the agent's own network namespace: {0}")]
    OwnNamespace(#[source] std::io::Error),
    #[error("the host end of {ifname} (ifindex {ifindex}) has no name in the agent's namespace")]
    NoName { ifname: String, ifindex: u32 },
    #[error(transparent)]
    Ebpf(#[from] EbpfDatapathError),
    #[error("the guard's attach task failed: {0}")]
    Task(String),
}

/// What Open vSwitch says about a workload port (the `external_ids`
/// OVN-Kubernetes' CNI writes on its Interface), as the daemon hands it
/// down.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct OvsIdentity {
    /// `k8s.ovn.org/network`.
    pub(crate) network: Option<String>,
    /// `k8s.ovn.org/nad` (`namespace/name`).
    pub(crate) nad: Option<String>,
    /// `iface-id-ver`: the pod UID.
    pub(crate) pod_uid: Option<String>,
    /// `sandbox`: the sandbox (container) id.
    pub(crate) sandbox: Option<String>,
    /// `pod-if-name`: the interface inside the pod.
    pub(crate) pod_if_name: Option<String>,
    /// `attached_mac`.
    pub(crate) mac: Option<[u8; 6]>,
    /// `vf-netdev-name`, and whether the VF is bound to VFIO.
    pub(crate) vf_netdev_name: Option<String>,
    pub(crate) vf_is_vfio: bool,
}

/// Where a guarded port's identity came from: the CNI ADD, Open vSwitch,
/// or both.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Identity {
    /// What Open vSwitch says, while the port is in its database.
    pub(crate) ovs: Option<OvsIdentity>,
    /// An ADD holds the port (until its DEL).
    pub(crate) cni: bool,
}

impl Identity {
    /// `ovs`, `cni` or `both`, as `xdhcp status` and `xdhcp bindings` say.
    pub(crate) fn label(&self) -> &'static str {
        match (self.ovs.is_some(), self.cni) {
            (true, true) => "both",
            (true, false) => "ovs",
            (false, _) => "cni",
        }
    }
}

/// The names a port's network goes by, as a `DhcpGuardPolicy` may name it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct NetworkNames {
    /// The NAD, `namespace/name`.
    pub(crate) nad: Option<String>,
    /// The network's name (its CNI config's `name`).
    pub(crate) name: Option<String>,
}

impl NetworkNames {
    /// Each name of `self`, else `other`'s.
    fn or(self, other: &NetworkNames) -> NetworkNames {
        NetworkNames {
            nad: self.nad.or_else(|| other.nad.clone()),
            name: self.name.or_else(|| other.name.clone()),
        }
    }

    /// The names Open vSwitch gives the port.
    pub(crate) fn of_ovs(ovs: &OvsIdentity) -> NetworkNames {
        NetworkNames {
            nad: ovs.nad.clone(),
            name: ovs.network.clone(),
        }
    }

    /// The settings `table` holds for this network: the object naming its
    /// NAD, else the one naming its network.
    fn overrides<'a>(
        &self,
        table: &'a BTreeMap<String, GuardOverrides>,
    ) -> Option<&'a GuardOverrides> {
        [&self.nad, &self.name]
            .into_iter()
            .flatten()
            .find_map(|n| table.get(n))
    }
}

/// `base` (a port's policy without a `DhcpGuardPolicy`) with what the
/// network's object sets: trust, rate and burst as it says; its
/// `singleClient: false` takes the one-client rule off, and learning with
/// it (replies are matched against that MAC); its `learn: false` takes
/// learning (and the broadcast rewrite that goes with it) off a VM's port.
/// Neither turns on what the port cannot have: no MAC known, no single
/// client; not a VM's port, no learning.
pub(crate) fn with_overrides(base: PortPolicy, o: &GuardOverrides) -> PortPolicy {
    let single = o.single_client != Some(false);
    PortPolicy {
        trusted: o.trusted.unwrap_or(base.trusted),
        rate: o.rate.unwrap_or(base.rate),
        burst: o.burst.unwrap_or(base.burst),
        single_client: base.single_client.filter(|_| single),
        learn: base.learn && single && o.learn != Some(false),
    }
}

/// One guarded port.
#[derive(Debug, Clone)]
pub(crate) struct GuardedPort {
    /// Host-side interface name (in the agent's namespace).
    pub(crate) host_ifname: String,
    pub(crate) ifindex: u32,
    /// The policy in the kernel: `base` with its network's object.
    pub(crate) policy: PortPolicy,
    /// The policy it would have without a `DhcpGuardPolicy`.
    pub(crate) base: PortPolicy,
    /// Its network's names (an object names one of them).
    pub(crate) network: NetworkNames,
    pub(crate) identity: Identity,
    /// Where its frames from the workload are policed.
    pub(crate) hook: GuardHook,
}

struct Inner {
    guard: Guard,
    /// The guard ring, until the learning task takes it.
    reader: Option<crate::datapath::ebpf::GuardReader>,
    /// (container id, pod ifname) → its port.
    ports: HashMap<(String, String), GuardedPort>,
    /// Host-side ports of Open vSwitch bridges on the userspace datapath,
    /// as last read from the OVS database: policed at XDP.
    userspace_ports: BTreeSet<String>,
    /// Network (NAD or name) → what its `DhcpGuardPolicy` sets.
    overrides: BTreeMap<String, GuardOverrides>,
}

impl Inner {
    /// The policy of a port of `network` whose policy without an object
    /// is `base`.
    fn effective(&self, base: PortPolicy, network: &NetworkNames) -> PortPolicy {
        network
            .overrides(&self.overrides)
            .map_or(base, |o| with_overrides(base, o))
    }
}

impl Inner {
    /// Where port `host_ifname` must be policed.
    /// (TC when the XDP program did not load: the guard said so at start.)
    fn hook_for(&self, host_ifname: &str) -> GuardHook {
        if self.guard.xdp_available() && self.userspace_ports.contains(host_ifname) {
            GuardHook::Xdp
        } else {
            GuardHook::Tc
        }
    }
}

impl Inner {
    /// Takes the guard off `host_ifname`, logging the outcome.
    fn detach(&mut self, host_ifname: &str) {
        let target = AttachTarget {
            ifname: host_ifname.to_owned(),
            netns: None,
        };
        match self.guard.detach(&target) {
            Ok(()) => info!(port = %host_ifname, "DHCP guard detached"),
            Err(e) => warn!(port = %host_ifname, error = %crate::rpc::format_chain(&e),
                "could not detach the DHCP guard"),
        }
    }
}

/// The attachment whose port is on host interface `host_ifname`.
fn key_of_host(
    ports: &HashMap<(String, String), GuardedPort>,
    host_ifname: &str,
) -> Option<(String, String)> {
    ports
        .iter()
        .find(|(_, p)| p.host_ifname == host_ifname)
        .map(|(k, _)| k.clone())
}

/// The guard, or why there is none.
pub(crate) struct GuardService {
    inner: Option<Mutex<Inner>>,
    /// Bindings learned from guests, persisted in the state directory.
    pub(crate) learned: Mutex<LearnedStore>,
    /// Why the guard is off (logged at start).
    off_reason: Option<String>,
    /// Woken each time an ADD holds a port (guarded, or taken over from
    /// Open vSwitch): the follower of the OVS ports learns from it, at
    /// once, that the port's network is a DHCP network.
    added: tokio::sync::Notify,
    /// The ports whose bridge the guard learns, to make the bridge's
    /// other ports ready before their ADD ([`ahead`]).
    ahead: ahead::Learning,
}

impl std::fmt::Debug for GuardService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardService")
            .field("on", &self.inner.is_some())
            .field("off_reason", &self.off_reason)
            .finish_non_exhaustive()
    }
}

/// The kernel policy of a port: the network's `ipam.dhcpGuard`, plus the
/// single-client rule on the workload's MAC when it is known (a pod
/// interface's MAC, a VM's MAC; for a port found in Open vSwitch, its
/// `attached_mac`): one workload sends DHCP in one client's name only, so
/// it cannot release, decline or take addresses in a neighbour's name or
/// drain the pool with made-up MACs. The agent's own exchanges for a pod
/// leave through the pod's interface with that MAC (or through an uplink,
/// past no guard). `vm`: the port is a VM's, whose guest runs its own DHCP
/// client after the one-shot discovery: its exchanges are learned.
pub(crate) fn port_policy(spec: &DhcpGuardSpec, mac: Option<[u8; 6]>, vm: bool) -> PortPolicy {
    PortPolicy {
        trusted: spec.trusted,
        rate: spec.rate,
        burst: spec.burst,
        single_client: mac,
        learn: vm && mac.is_some(),
    }
}

impl GuardService {
    /// Loads the guard unless `--dhcp-guard off`; a kernel that refuses it
    /// leaves the agent running unguarded, with the reason logged and in
    /// `xdhcp status`.
    pub(crate) fn start(args: &AgentArgs) -> Result<Self, crate::bindings::StoreError> {
        let (learned, quarantined) = LearnedStore::open(&args.state_dir)?;
        if let Some(q) = quarantined {
            warn!(file = %q, "unreadable learned-binding file set aside; starting empty");
        }
        let learned = Mutex::new(learned);
        if args.dhcp_guard == GuardChoice::Off {
            return Ok(Self::off("--dhcp-guard off", learned));
        }
        Ok(match Guard::load_pinned(&args.bpffs_dir) {
            Ok(mut guard) => {
                info!("DHCP guard loaded");
                if let Err(e) = guard.set_learn_limit(args.learn_reply_rate, args.learn_reply_burst)
                {
                    warn!(error = %crate::rpc::format_chain(&e),
                        "could not set the learning reply limit; the kernel's defaults apply");
                }
                let reader = match guard.take_reader() {
                    Ok(r) => r,
                    Err(e) => {
                        warn!(error = %crate::rpc::format_chain(&e),
                            "the guard ring cannot be read; guests' leases are not learned");
                        None
                    }
                };
                Self {
                    inner: Some(Mutex::new(Inner {
                        guard,
                        reader,
                        ports: HashMap::new(),
                        userspace_ports: BTreeSet::new(),
                        overrides: BTreeMap::new(),
                    })),
                    learned,
                    off_reason: None,
                    added: tokio::sync::Notify::new(),
                    ahead: ahead::Learning::on(),
                }
            }
            Err(e) => {
                let reason = crate::rpc::format_chain(&e);
                warn!(error = %reason, "the DHCP guard could not be loaded; workload ports are not guarded");
                Self::off(&reason, learned)
            }
        })
    }

    fn off(reason: &str, learned: Mutex<LearnedStore>) -> Self {
        Self {
            inner: None,
            learned,
            off_reason: Some(reason.to_owned()),
            added: tokio::sync::Notify::new(),
            ahead: ahead::Learning::default(),
        }
    }

    /// The attachment and port guarded under host ifindex `ifindex`.
    pub(crate) fn port_of(&self, ifindex: u32) -> Option<((String, String), GuardedPort)> {
        let inner = self.lock()?;
        inner
            .ports
            .iter()
            .find(|(_, p)| p.ifindex == ifindex)
            .map(|(k, p)| (k.clone(), p.clone()))
    }

    /// The port of attachment `(container_id, ifname)`.
    pub(crate) fn port_for(&self, container_id: &str, ifname: &str) -> Option<GuardedPort> {
        let inner = self.lock()?;
        inner
            .ports
            .get(&(container_id.to_owned(), ifname.to_owned()))
            .cloned()
    }

    /// The guard ring's reader, once: whoever follows the guests' DHCP
    /// takes it at start.
    pub(crate) fn take_reader(&self) -> Option<crate::datapath::ebpf::GuardReader> {
        self.lock().and_then(|mut inner| inner.reader.take())
    }

    fn lock(&self) -> Option<std::sync::MutexGuard<'_, Inner>> {
        self.inner
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// Guards the host end of `ifname` (in `netns`) for the attachment
    /// `(container_id, ifname)`. `Ok(None)`: the guard is off, or the port
    /// is not one it can guard (not a veth, or its peer is not in the
    /// agent's namespace). A second call for a guarded attachment updates
    /// its policy.
    pub(crate) async fn protect(
        self: &Arc<Self>,
        container_id: &str,
        ifname: &str,
        netns: &Path,
        end: HostEnd,
        policy: PortPolicy,
        network: NetworkNames,
    ) -> Result<Option<GuardedPort>, GuardError> {
        if self.inner.is_none() {
            return Ok(None);
        }
        let t0 = std::time::Instant::now();
        let HostEnd { peer, prepared } = end;
        let host = host_end(netns, ifname, peer).await?;
        let Some(host_ifname) = host else {
            info!(ifname, netns = %netns.display(),
                "pod interface is not a veth with its peer in the agent's namespace; not guarded");
            return Ok(None);
        };
        let key = (container_id.to_owned(), ifname.to_owned());
        // Attaching takes RTNL and waits for RCU grace periods (tens of ms
        // under a burst): on a blocking thread, never on a runtime worker.
        let me = self.clone();
        let peer = t0.elapsed();
        tokio::task::spawn_blocking(move || {
            prepare(&host_ifname, prepared);
            #[cfg(feature = "test-hooks")]
            // Tests: the attach moved into the exchange's replies.
            std::thread::sleep(crate::sys::test_delay::from_env(
                "XDHCP_TEST_GUARD_ATTACH_DELAY_MS",
            ));
            let t1 = std::time::Instant::now();
            let r = me.protect_port(key, host_ifname, policy, network, t1);
            debug!(
                peer_us = peer.as_micros(),
                queued_us = t1
                    .saturating_duration_since(t0)
                    .saturating_sub(peer)
                    .as_micros(),
                attach_us = t1.elapsed().as_micros(),
                "guard timing"
            );
            r
        })
        .await
        .map_err(|e| GuardError::Task(e.to_string()))?
    }

    /// Once the agent has guarded again the ports of the leases it resumed
    /// (and Open vSwitch's have had [`RECONCILE_AFTER`] to be found), takes
    /// the guard off the ports an earlier agent guarded that nothing claims
    /// now, and drops their entries from the pinned tables
    /// ([`Guard::release_unclaimed`]). Call after recovery.
    pub(crate) async fn release_unclaimed(
        self: Arc<Self>,
        token: tokio_util::sync::CancellationToken,
    ) {
        if self.inner.is_none() {
            return;
        }
        tokio::select! {
            () = token.cancelled() => return,
            () = tokio::time::sleep(RECONCILE_AFTER) => {}
        }
        let me = self.clone();
        let released = tokio::task::spawn_blocking(move || {
            me.lock()
                .map(|mut inner| inner.guard.release_unclaimed())
                .unwrap_or_default()
        })
        .await;
        match released {
            Ok(ports) if ports.is_empty() => {}
            Ok(ports) => info!(
                ?ports,
                "took the DHCP guard off the ports an earlier agent guarded and no workload claims now"
            ),
            Err(e) => warn!(error = %e, "the guard's reconciliation task failed"),
        }
    }

    /// Waits until an ADD holds a port, since the last time this returned
    /// (one wake-up remembered while nobody waits).
    pub(crate) async fn added(&self) {
        self.added.notified().await;
    }

    /// The kernel side of [`GuardService::protect`], blocking; says so to
    /// [`GuardService::added`] when it holds the port.
    fn protect_port(
        &self,
        key: (String, String),
        host_ifname: String,
        policy: PortPolicy,
        network: NetworkNames,
        t1: std::time::Instant,
    ) -> Result<Option<GuardedPort>, GuardError> {
        let held = self.hold_port(key, host_ifname, policy, network, t1);
        if matches!(held, Ok(Some(_))) {
            self.added.notify_one();
        }
        held
    }

    fn hold_port(
        &self,
        key: (String, String),
        host_ifname: String,
        base: PortPolicy,
        network: NetworkNames,
        t1: std::time::Instant,
    ) -> Result<Option<GuardedPort>, GuardError> {
        let Some(mut inner) = self.lock() else {
            return Ok(None);
        };
        debug!(lock_wait_us = t1.elapsed().as_micros(), "guard lock");
        let hook = inner.hook_for(&host_ifname);
        if let Some(port) = inner.ports.get(&key).cloned()
            && port.host_ifname != host_ifname
        {
            // The pod interface was recreated with another peer.
            let old = AttachTarget {
                ifname: port.host_ifname,
                netns: None,
            };
            if let Err(e) = inner.guard.detach(&old) {
                warn!(error = %e, "could not detach the guard from the old host end");
            }
            inner.ports.remove(&key);
        }
        // Found in Open vSwitch before this ADD, under the key its
        // `external_ids` gave (the same one, unless `pod-if-name` was
        // missing): the guard is on; the ADD takes it over.
        if !inner.ports.contains_key(&key)
            && let Some(found) = key_of_host(&inner.ports, &host_ifname)
            && let Some(port) = inner.ports.remove(&found)
        {
            inner.ports.insert(key.clone(), port);
        }
        if let Some(port) = inner.ports.get(&key).cloned() {
            let target = AttachTarget {
                ifname: host_ifname,
                netns: None,
            };
            let network = network.or(&port.network);
            let policy = inner.effective(base, &network);
            inner.guard.update(&target, &policy)?;
            inner.guard.rehook(&target, hook)?;
            let port = GuardedPort {
                policy,
                base,
                network,
                hook,
                identity: Identity {
                    cni: true,
                    ..port.identity
                },
                ..port
            };
            inner.ports.insert(key, port.clone());
            return Ok(Some(port));
        }
        let target = AttachTarget {
            ifname: host_ifname.clone(),
            netns: None,
        };
        let policy = inner.effective(base, &network);
        let ifindex = inner.guard.attach_at(&target, &policy, hook)?;
        if hook == GuardHook::Tc {
            // The ports enslaved to its bridge from now on are made ready
            // before their ADD; this one has its qdisc now.
            self.serve_bridge_of(&host_ifname, Some(ifindex));
        }
        let port = GuardedPort {
            host_ifname,
            ifindex,
            policy,
            base,
            network,
            identity: Identity {
                ovs: None,
                cni: true,
            },
            hook,
        };
        inner.ports.insert(key, port.clone());
        Ok(Some(port))
    }

    /// The host-side ports of Open vSwitch bridges on the userspace
    /// datapath, as the OVS database now says: each guarded port moves to
    /// the hook it needs (XDP for those, TC for the others), and a port
    /// guarded later starts there. Blocking (netlink), cheap when nothing
    /// moves.
    pub(crate) fn set_userspace_ports(&self, ports: BTreeSet<String>) {
        let Some(mut inner) = self.lock() else {
            return;
        };
        if inner.userspace_ports == ports {
            return;
        }
        inner.userspace_ports = ports;
        let moves: Vec<_> = inner
            .ports
            .iter()
            .filter_map(|(k, p)| {
                let hook = inner.hook_for(&p.host_ifname);
                (hook != p.hook).then(|| (k.clone(), p.host_ifname.clone(), hook))
            })
            .collect();
        for (key, host_ifname, hook) in moves {
            let target = AttachTarget {
                ifname: host_ifname,
                netns: None,
            };
            match inner.guard.rehook(&target, hook) {
                Ok(()) => {
                    if let Some(p) = inner.ports.get_mut(&key) {
                        p.hook = hook;
                    }
                }
                Err(e) => {
                    warn!(port = %target.ifname, %hook, error = %crate::rpc::format_chain(&e),
                    "could not move the DHCP guard to the hook the port's datapath needs");
                }
            }
        }
    }

    /// Unguards the attachment's port (DEL). Nothing to do is fine. A port
    /// Open vSwitch still holds stays guarded until it leaves the database
    /// ([`GuardService::release_found`]).
    pub(crate) fn release(&self, container_id: &str, ifname: &str) {
        let Some(mut inner) = self.lock() else {
            return;
        };
        let key = (container_id.to_owned(), ifname.to_owned());
        let Some(port) = inner.ports.get_mut(&key) else {
            return;
        };
        if port.identity.ovs.is_some() {
            // The port stays, a workload's port no ADD holds: a VM's
            // learning goes with the VM's attachment; the one client left
            // is the MAC Open vSwitch names (the daemon sets the network's
            // policy again).
            port.identity.cni = false;
            port.base = PortPolicy {
                single_client: port.identity.ovs.as_ref().and_then(|o| o.mac),
                learn: false,
                ..port.base
            };
            let (base, network, old) = (port.base, port.network.clone(), port.policy);
            let target = AttachTarget {
                ifname: port.host_ifname.clone(),
                netns: None,
            };
            let policy = inner.effective(base, &network);
            if policy != old {
                if let Some(port) = inner.ports.get_mut(&key) {
                    port.policy = policy;
                }
                if let Err(e) = inner.guard.update(&target, &policy) {
                    warn!(port = %target.ifname, error = %crate::rpc::format_chain(&e),
                        "could not set a pod's policy on a port its VM left");
                }
            }
            return;
        }
        if let Some(port) = inner.ports.remove(&key) {
            inner.detach(&port.host_ifname);
        }
    }

    /// Guards `host_ifname`, a port Open vSwitch holds for a workload of a
    /// DHCP network, before (or without) any ADD; `key` is the attachment
    /// its `external_ids` name (sandbox, pod interface). A port already
    /// guarded (by an ADD, or found before) is not attached again: it only
    /// gains the OVS identity, and, unless an ADD holds it, `base` (the
    /// policy without a `DhcpGuardPolicy`; the network's object, named by
    /// the port's `external_ids`, is applied on it).
    /// `Ok(None)`: the guard is off. Blocking: attaching takes RTNL.
    pub(crate) fn protect_found(
        &self,
        key: (String, String),
        host_ifname: &str,
        base: PortPolicy,
        ovs: OvsIdentity,
    ) -> Result<Option<GuardedPort>, GuardError> {
        let Some(mut inner) = self.lock() else {
            return Ok(None);
        };
        if let Some(port) = inner.ports.get(&key)
            && port.host_ifname != host_ifname
        {
            // The attachment's port was recreated under another name.
            let old = port.host_ifname.clone();
            inner.detach(&old);
            inner.ports.remove(&key);
        }
        if let Some(held) = key_of_host(&inner.ports, host_ifname) {
            let target = AttachTarget {
                ifname: host_ifname.to_owned(),
                netns: None,
            };
            let port =
                inner.ports.get(&held).cloned().ok_or_else(|| {
                    GuardError::Task("a guarded port vanished under the lock".into())
                })?;
            // An ADD's policy is the network's own (and a VM's single
            // client): it stays.
            let (base, network) = if port.identity.cni {
                (
                    port.base,
                    port.network.clone().or(&NetworkNames::of_ovs(&ovs)),
                )
            } else {
                (base, NetworkNames::of_ovs(&ovs))
            };
            let policy = inner.effective(base, &network);
            if policy != port.policy {
                inner.guard.update(&target, &policy)?;
            }
            let port = GuardedPort {
                policy,
                base,
                network,
                identity: Identity {
                    ovs: Some(ovs),
                    cni: port.identity.cni,
                },
                ..port
            };
            inner.ports.insert(held, port.clone());
            return Ok(Some(port));
        }
        let target = AttachTarget {
            ifname: host_ifname.to_owned(),
            netns: None,
        };
        let hook = inner.hook_for(host_ifname);
        let network = NetworkNames::of_ovs(&ovs);
        let policy = inner.effective(base, &network);
        let ifindex = inner.guard.attach_at(&target, &policy, hook)?;
        let port = GuardedPort {
            host_ifname: host_ifname.to_owned(),
            ifindex,
            policy,
            base,
            network,
            identity: Identity {
                ovs: Some(ovs),
                cni: false,
            },
            hook,
        };
        inner.ports.insert(key, port.clone());
        Ok(Some(port))
    }

    /// `host_ifname` left Open vSwitch's database (or its network is no
    /// DHCP network any more): unguarded, unless an ADD holds it (its DEL
    /// does that). Nothing to do is fine.
    pub(crate) fn release_found(&self, host_ifname: &str) {
        let Some(mut inner) = self.lock() else {
            return;
        };
        let Some(key) = key_of_host(&inner.ports, host_ifname) else {
            return;
        };
        let Some(port) = inner.ports.get_mut(&key) else {
            return;
        };
        port.identity.ovs = None;
        if port.identity.cni {
            return;
        }
        if let Some(port) = inner.ports.remove(&key) {
            inner.detach(&port.host_ifname);
        }
    }

    /// The `DhcpGuardPolicy` settings by network (NAD or name), as the
    /// watch now holds them: every guarded port whose policy they change
    /// gets its new policy in the kernel map in place (its programs stay;
    /// only a VM port whose learning turns on or off gains or loses its
    /// egress filter), and a port guarded later starts with them. Returns
    /// the ports changed, with the error of each that failed. Blocking.
    pub(crate) fn set_overrides(
        &self,
        table: BTreeMap<String, GuardOverrides>,
    ) -> Vec<(String, Result<PortPolicy, String>)> {
        let Some(mut inner) = self.lock() else {
            return Vec::new();
        };
        if inner.overrides == table {
            return Vec::new();
        }
        inner.overrides = table;
        let changes: Vec<_> = inner
            .ports
            .iter()
            .filter_map(|(k, p)| {
                let policy = inner.effective(p.base, &p.network);
                (policy != p.policy).then(|| (k.clone(), p.host_ifname.clone(), policy))
            })
            .collect();
        let mut out = Vec::new();
        for (key, host_ifname, policy) in changes {
            let target = AttachTarget {
                ifname: host_ifname.clone(),
                netns: None,
            };
            match inner.guard.update(&target, &policy) {
                Ok(_) => {
                    if let Some(p) = inner.ports.get_mut(&key) {
                        p.policy = policy;
                    }
                    out.push((host_ifname, Ok(policy)));
                }
                Err(e) => out.push((host_ifname, Err(crate::rpc::format_chain(&e)))),
            }
        }
        out
    }

    /// The guarded ports found in Open vSwitch.
    pub(crate) fn found_ports(&self) -> Vec<GuardedPort> {
        let Some(inner) = self.lock() else {
            return Vec::new();
        };
        inner
            .ports
            .values()
            .filter(|p| p.identity.ovs.is_some())
            .cloned()
            .collect()
    }

    /// The guarded port on host interface `host_ifname`.
    pub(crate) fn port_on(&self, host_ifname: &str) -> Option<GuardedPort> {
        let inner = self.lock()?;
        inner
            .ports
            .values()
            .find(|p| p.host_ifname == host_ifname)
            .cloned()
    }

    /// Every guarded port with its attachment, sorted by host interface.
    pub(crate) fn ports(&self) -> Vec<((String, String), GuardedPort)> {
        let Some(inner) = self.lock() else {
            return Vec::new();
        };
        let mut v: Vec<_> = inner
            .ports
            .iter()
            .map(|(k, p)| (k.clone(), p.clone()))
            .collect();
        v.sort_by(|a, b| a.1.host_ifname.cmp(&b.1.host_ifname));
        v
    }

    /// Whether the guard is loaded (else nothing is ever attached).
    pub(crate) fn is_on(&self) -> bool {
        self.inner.is_some()
    }

    /// Forgets what was learned about `mac` (its attachment is gone); the
    /// learning task writes the change to the file.
    pub(crate) fn forget_learned(&self, mac: [u8; 6]) {
        let mac = crate::bindings::format_mac(mac);
        self.learned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&mac, None);
    }

    /// Every guarded port with its counters, for metrics and status.
    /// The learning filter's counters (`None`: the guard is off).
    pub(crate) fn learn_counters(&self) -> Option<LearnCounters> {
        self.lock()?.guard.learn_counters().ok()
    }

    pub(crate) fn snapshot(&self) -> Vec<(GuardedPort, GuardCounters)> {
        let Some(inner) = self.lock() else {
            return Vec::new();
        };
        inner
            .ports
            .values()
            .map(|p| {
                let c = inner
                    .guard
                    .counters(p.ifindex)
                    .ok()
                    .flatten()
                    .unwrap_or_default();
                (p.clone(), c)
            })
            .collect()
    }
}

/// What an ADD hands the guard of its pod interface's host end.
#[derive(Debug, Default)]
pub(crate) struct HostEnd {
    /// What the link's trip did about the veth peer.
    pub(crate) peer: PeerLookup,
    /// Held by the lease's first frame until the port's `clsact` qdisc
    /// is made ([`PortPrepared`]); `None`: no frame waits.
    pub(crate) prepared: Option<PortPrepared>,
}

impl HostEnd {
    /// The host end of the peer `peer` (looked up or not); no frame waits.
    pub(crate) fn of(peer: PeerLookup) -> Self {
        Self {
            peer,
            prepared: None,
        }
    }
}

/// Makes host port `port`'s `clsact` qdisc before the lease that
/// `prepared` holds sends its first frame ([`PortPrepared`]), then lets it
/// go. Nothing when no frame waits. Blocking (netlink, RTNL).
fn prepare(port: &str, prepared: Option<PortPrepared>) {
    if let Some(prepared) = prepared {
        let t = std::time::Instant::now();
        if let Err(e) = crate::datapath::ebpf::prepare_port(port) {
            // The filter's attach says why the port cannot be guarded.
            debug!(port, error = %e, "no clsact qdisc made");
        }
        prepared.done();
        debug!(
            port,
            qdisc_us = t.elapsed().as_micros(),
            "guard's port prepared"
        );
    }
}

/// The name, in the agent's namespace, of the peer of veth `ifname` in
/// `netns`; `None` when `ifname` is not a veth or its peer is elsewhere.
/// `known`: what the link's own trip found, if it looked.
pub(crate) async fn host_end(
    netns: &Path,
    ifname: &str,
    known: PeerLookup,
) -> Result<Option<String>, GuardError> {
    let found = match known {
        PeerLookup::NotLooked => {
            let own = std::fs::File::open("/proc/thread-self/ns/net")
                .map_err(GuardError::OwnNamespace)?;
            let name = ifname.to_owned();
            run_in_netns_async(netns, move || veth_peer_here(&name, own.as_fd())).await?
        }
        PeerLookup::Found(found) => found,
    };
    host_end_of(netns, ifname, found)
}

/// [`host_end`] once the peer is `found`.
fn host_end_of(
    netns: &Path,
    ifname: &str,
    found: std::io::Result<Option<crate::netlink::VethPeer>>,
) -> Result<Option<String>, GuardError> {
    let peer = found.map_err(|source| GuardError::Peer {
        ifname: ifname.to_owned(),
        netns: netns.to_path_buf(),
        source,
    })?;
    let Some(peer) = peer.filter(|p| p.in_namespace) else {
        return Ok(None);
    };
    let name = nix::net::if_::if_indextoname(peer.ifindex).map_err(|_| GuardError::NoName {
        ifname: ifname.to_owned(),
        ifindex: peer.ifindex,
    })?;
    Ok(Some(name.to_string_lossy().into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use xdhcp_common::guard as g;

    const MAC: [u8; 6] = [0x0a, 0x58, 0xc0, 0, 2, 5];

    #[test]
    fn every_port_with_a_known_mac_has_one_client_and_only_a_vm_s_learns() {
        let spec = DhcpGuardSpec::default();
        let pod = port_policy(&spec, Some(MAC), false);
        assert_eq!((pod.single_client, pod.learn), (Some(MAC), false));
        let entry = pod.entry();
        assert_eq!(entry.flags, g::GUARD_SINGLE_CLIENT);
        assert_eq!(entry.mac, MAC);
        assert!(!pod.needs_egress());
        let vm = port_policy(&spec, Some(MAC), true);
        assert_eq!((vm.single_client, vm.learn), (Some(MAC), true));
        assert_eq!(
            vm.entry().flags,
            g::GUARD_SINGLE_CLIENT | g::GUARD_LEARN | g::GUARD_BROADCAST
        );
        // No MAC (a port OVS names none for): no rule, nothing learned.
        let unknown = port_policy(&spec, None, true);
        assert_eq!((unknown.single_client, unknown.learn), (None, false));
        assert_eq!(unknown.entry().flags, 0);
    }

    fn overrides(f: impl FnOnce(&mut GuardOverrides)) -> GuardOverrides {
        let mut o = GuardOverrides::default();
        f(&mut o);
        o
    }

    #[test]
    fn an_object_sets_trust_rate_and_burst_and_leaves_the_rest_to_the_port() {
        let spec = DhcpGuardSpec::default();
        let base = port_policy(&spec, Some(MAC), false);
        // An empty object changes nothing.
        assert_eq!(with_overrides(base, &GuardOverrides::default()), base);
        let o = overrides(|o| {
            o.trusted = Some(true);
            o.rate = Some(2);
            o.burst = Some(3);
        });
        let p = with_overrides(base, &o);
        assert_eq!((p.trusted, p.rate, p.burst), (true, 2, 3));
        assert_eq!(p.single_client, Some(MAC));
        assert_eq!(p.entry().flags, g::GUARD_TRUSTED | g::GUARD_SINGLE_CLIENT);
        assert_eq!(p.entry().interval_ns, 500_000_000);
        // Rogue-server drop back on, over a trusted base.
        let trusted = PortPolicy {
            trusted: true,
            ..base
        };
        assert!(!with_overrides(trusted, &overrides(|o| o.trusted = Some(false))).trusted);
        // Rate 0: no limit.
        assert_eq!(
            with_overrides(base, &overrides(|o| o.rate = Some(0)))
                .entry()
                .interval_ns,
            0
        );
    }

    #[test]
    fn single_client_off_takes_learning_with_it_and_nothing_turns_on_what_a_port_cannot_have() {
        let spec = DhcpGuardSpec::default();
        let vm = port_policy(&spec, Some(MAC), true);
        let p = with_overrides(vm, &overrides(|o| o.single_client = Some(false)));
        assert_eq!((p.single_client, p.learn), (None, false));
        assert_eq!(p.entry().flags, 0);
        assert!(!p.needs_egress());
        // Learning (and the broadcast rewrite) off a VM's port, one client kept.
        let p = with_overrides(vm, &overrides(|o| o.learn = Some(false)));
        assert_eq!(p.entry().flags, g::GUARD_SINGLE_CLIENT);
        // A pod's port does not learn, whatever the object says; a port with
        // no known MAC has no one client.
        let pod = port_policy(&spec, Some(MAC), false);
        let on = overrides(|o| {
            o.learn = Some(true);
            o.single_client = Some(true);
        });
        assert!(!with_overrides(pod, &on).learn);
        let unknown = port_policy(&spec, None, true);
        assert_eq!(with_overrides(unknown, &on).single_client, None);
    }

    #[test]
    fn the_object_naming_the_nad_wins_over_the_one_naming_the_network() {
        let by_name = overrides(|o| o.rate = Some(1));
        let by_nad = overrides(|o| o.rate = Some(2));
        let table: BTreeMap<String, GuardOverrides> = [
            ("ns_net".to_owned(), by_name),
            ("ns/net".to_owned(), by_nad),
        ]
        .into();
        let both = NetworkNames {
            nad: Some("ns/net".into()),
            name: Some("ns_net".into()),
        };
        assert_eq!(both.overrides(&table), Some(&by_nad));
        let name_only = NetworkNames {
            nad: None,
            name: Some("ns_net".into()),
        };
        assert_eq!(name_only.overrides(&table), Some(&by_name));
        assert_eq!(NetworkNames::default().overrides(&table), None);
        // An ADD's names first, Open vSwitch's where the ADD named none.
        let cni = NetworkNames {
            nad: None,
            name: Some("a".into()),
        };
        assert_eq!(cni.or(&both).nad.as_deref(), Some("ns/net"));
    }
}
