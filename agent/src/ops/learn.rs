//! Guest learning: follows the guests' own DHCP and DHCPv6 on guarded VM
//! ports (the guard's ring) and keeps each VM's `pod-networks` entry at the
//! addresses its guest holds, through the same report as an ADD.
//!
//! What may be learned is decided by [`crate::bindings::learner`] and, for
//! DHCPv6, [`crate::bindings::learner6`] (sans-IO): only a reply that
//! answers the guest's own REQUEST, from a server of the network, for an
//! address inside the network's prefixes that no other binding holds;
//! anything else is counted (`xdhcp_learn_refused_total`, by reason) and
//! ignored. DHCPv6, and the addresses a guest configures itself (its
//! duplicate address detection probes), are learned where the node has a
//! DHCPv6 lease of the port's network to vouch for its servers and prefixes:
//! the attachment's own (VMs on IPv6 and dual-stack networks), or on a VM
//! port OVN-Kubernetes serves itself another workload's of the network the
//! port names; with none, a REPLY is refused (`unknown_network`) and a probe
//! ignored. This module is its edge, and keeps the runtime free: one task
//! reads the ring into a bounded queue (a full queue drops and counts); the
//! deciding loop never waits on IO: the learned-binding file is written on a
//! blocking thread, a binding change within about a second
//! ([`FLUSH_PERIOD`]) and a renewal that moves only an expiry with the next
//! batch ([`EXPIRY_FLUSH`]); entry writes run as their own tasks, one at a
//! time per port, paced and coalesced per port
//! ([`crate::bindings::learner::Moves`]).
//!
//! A VM port OVN-Kubernetes serves itself (no ADD, no lease record) is
//! followed the same way, both families, its network taken from its port and
//! its pod's entry ([`crate::ops::ovnk_vm`]; IPv4 servers also from the
//! one-shot's ACK, IPv6 ones only from the node's DHCPv6 leases of that
//! network); there the loop also has a migration target's entry take the
//! source's address, and drops the bindings learned on a port that left Open
//! vSwitch.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::bindings::learner::{Learner, Moves, NetworkView, Pace, Refused};
use crate::bindings::learner6::{self, Learned6, Learner6, NetworkView6, Seen6};
use crate::bindings::{Binding, BindingSource, Change, Learned, StoreError, format_mac};
use crate::datapath::ebpf::GuardEvent;
use crate::kube::annotation::PodNetworkEntry;
use crate::ops::context::Agent;
use crate::ops::ovnk_vm::{self, EntryNetwork};
use crate::sys::sync::lock;

/// How often expired learned bindings and stale exchanges are dropped.
const EXPIRY_PERIOD: Duration = Duration::from_secs(5);
/// How often the learned-binding file is written when a binding came,
/// went or moved.
pub(crate) const FLUSH_PERIOD: Duration = Duration::from_secs(1);
/// How often the file is written at most when only expiries moved.
pub(crate) const EXPIRY_FLUSH: Duration = Duration::from_mins(1);
/// Observed messages waiting to be decided.
pub(crate) const QUEUE: usize = 1024;

/// An attachment: (container id, pod interface).
type Attachment = (String, String);

/// Where a move puts the entry: its IPv4 address, its IPv6 address, or
/// both (a family left `None` stays where the last move put it, else at
/// the guest's learned address, else at the record's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Move {
    v4: Option<Target>,
    v6: Option<Ipv6Addr>,
}

impl Move {
    /// This move, with what `older` (a move not started yet, which this one
    /// replaces) set and this one does not.
    fn over(self, older: Option<&Move>) -> Self {
        Self {
            v4: self.v4.or_else(|| older.and_then(|o| o.v4)),
            v6: self.v6.or_else(|| older.and_then(|o| o.v6)),
        }
    }
}

/// Where a move puts the entry's IPv4 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Target {
    ip: Ipv4Addr,
    /// The record's when `None`.
    prefix_len: Option<u8>,
    /// The record's when `None`.
    router: Option<Ipv4Addr>,
}

/// Follows the guests' own DHCP on VM ports (the guard ring): an accepted
/// ACK for the VM's MAC records a learned binding and, when the address is
/// not the one the `pod-networks` entry reports, has the entry rewritten
/// (the same read-modify-write as at ADD, which keeps every other network
/// and every field of the entry it does not set); a renewal of the same
/// address moves its expiry and reads the entry, which is written only if
/// something reset it meanwhile (a repeated ADD: followed until the guest's
/// next exchange, never undone at once); a RELEASE or the lease's expiry drops the
/// learned binding and leaves the entry at the last address the guest held;
/// a DECLINE drops it and, when its ACK had moved the entry, puts back the
/// address the entry reported before (the guest never held the declined
/// one).
pub(crate) async fn learn_guests(agent: Arc<Agent>, token: tokio_util::sync::CancellationToken) {
    let (tx, mut rx) = mpsc::channel(QUEUE);
    let mut ring = JoinSet::new();
    if let Some(reader) = agent.guard.take_reader() {
        ring.spawn(read_ring(reader, tx, agent.clone(), token.clone()));
    } else {
        drop(tx);
    }
    let mut f = Following::default();
    let mut sweep = tokio::time::interval(EXPIRY_PERIOD);
    let mut flush = tokio::time::interval(FLUSH_PERIOD);
    flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut queue_open = true;
    loop {
        let next_move = f.moves.poll_timeout(Instant::now().into_std());
        tokio::select! {
            () = token.cancelled() => break,
            ev = rx.recv(), if queue_open => match ev {
                Some(ev) => f.on_event(&agent, &ev),
                None => queue_open = false,
            },
            _ = sweep.tick() => f.sweep(&agent),
            _ = flush.tick() => f.flush(&agent, false),
            Some(done) = f.writes.join_next() => f.written(done),
            Some(Ok((key, target))) = f.sources.join_next() => f.source_known(&agent, key, target),
            Some(done) = f.flushing.join_next() => flushed(&agent, done),
            () = sleep_until(next_move), if next_move.is_some() => {}
        }
        f.dispatch(&agent);
    }
    // Whatever is not on disk yet goes now (the daemon waits for it).
    while let Some(done) = f.flushing.join_next().await {
        flushed(&agent, done);
    }
    f.flush(&agent, true);
    while let Some(done) = f.flushing.join_next().await {
        flushed(&agent, done);
    }
}

async fn sleep_until(at: Option<std::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(Instant::from_std(at)).await,
        None => std::future::pending().await,
    }
}

/// Reads the guard ring into the bounded queue; a full queue drops the
/// message and counts it.
async fn read_ring(
    mut reader: crate::datapath::ebpf::GuardReader,
    tx: mpsc::Sender<GuardEvent>,
    agent: Arc<Agent>,
    token: tokio_util::sync::CancellationToken,
) {
    loop {
        let skipped = reader.rejected;
        let ev = tokio::select! {
            () = token.cancelled() => return,
            ev = reader.recv() => ev,
        };
        // Records that did not decode (a kind this agent does not read, a
        // frame that is not what its record says) were skipped meanwhile.
        agent
            .metrics()
            .learn_records_skipped(reader.rejected.saturating_sub(skipped));
        match ev {
            Ok(ev) => match tx.try_send(ev) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => agent.metrics().learn_event_dropped(),
                Err(mpsc::error::TrySendError::Closed(_)) => return,
            },
            Err(e) => {
                warn!(error = %crate::rpc::format_chain(&e),
                    "the guard ring failed; guests' leases are no longer learned");
                return;
            }
        }
    }
}

/// The deciding loop's state.
#[derive(Default)]
struct Following {
    learner: Learner,
    learner6: Learner6,
    moves: Moves<Attachment, Move>,
    /// What each attachment's last move put in its entry, by family.
    written: HashMap<Attachment, Move>,
    /// Entry writes out: the attachment and whether it was written.
    writes: JoinSet<(Attachment, bool)>,
    /// The learned-binding file's write, when one is out.
    flushing: JoinSet<(Change, Result<(), StoreError>)>,
    /// When the file was last written (expiry-only changes wait for
    /// [`EXPIRY_FLUSH`] after it).
    last_flush: Option<Instant>,
    /// The VM ports without a lease record (OVN-Kubernetes' own VM path),
    /// by host ifindex: what each knows of its network.
    entries: HashMap<u32, EntryNetwork>,
    /// Host interfaces of such ports seen this run: when one leaves OVS,
    /// the bindings learned on it go.
    own_path_ports: std::collections::BTreeSet<String>,
    /// Migration targets on that path whose source was asked: (host
    /// interface, pod UID).
    asked_source: HashSet<(String, String)>,
    /// Those lookups out: the attachment, and where the source's entry
    /// puts the target's.
    sources: JoinSet<(Attachment, Option<Target>)>,
}

impl Following {
    fn on_event(&mut self, agent: &Agent, ev: &GuardEvent) {
        let Some(((cid, ifname), port)) = agent.guard.port_of(ev.ifindex) else {
            return;
        };
        let Some(mac) = port.policy.single_client else {
            return;
        };
        if let Some(target) = ev.dad_target() {
            self.on_dad(agent, (cid, ifname), &port, mac, target);
            return;
        }
        match (ev.seen(), ev.seen6()) {
            (Some(seen), _) => self.on_dhcp4(agent, (cid, ifname), &port, mac, &seen),
            (None, Some(seen)) => self.on_dhcp6(agent, (cid, ifname), &port, mac, &seen),
            (None, None) => {}
        }
    }

    /// The guest's duplicate address detection probe for `target`: an
    /// address it configured itself (SLAAC, static) is recorded (source
    /// `dad`) and added to the entry, by [`learner6::dad`]'s rules; a
    /// refusal is counted.
    fn on_dad(
        &mut self,
        agent: &Agent,
        key: Attachment,
        port: &crate::guard::GuardedPort,
        mac: [u8; 6],
        target: Ipv6Addr,
    ) {
        let mac_text = format_mac(mac);
        let (mut own, configured): (BTreeSet<Ipv6Addr>, BTreeSet<Ipv6Addr>) = {
            let store = lock(&agent.guard.learned);
            let own = store.get6(&mac_text).and_then(|b| match b.ip {
                IpAddr::V6(a) => Some(a),
                IpAddr::V4(_) => None,
            });
            (
                own.into_iter().collect(),
                store.configured(&mac_text).into_iter().collect(),
            )
        };
        for h in agent.leases.attachment(&key.0, &key.1) {
            own.extend(lock(&h.live).record.lease6.as_ref().map(|l| l.address));
        }
        let ovs = self.own_path(agent, &key, port);
        // A network without DHCPv6 leases on the node (an IPv4 network)
        // has no IPv6 prefix to hold the address to: nothing to report.
        let own_pod = OwnPod::new(agent, ovs.as_ref());
        let Some(view) = view6_of(agent, &key, &own_pod, mac) else {
            return;
        };
        let ip = match learner6::dad(target, Some(&view), &own, &configured) {
            Ok(Some(Learned6::Configured { ip })) => ip,
            Ok(_) => return,
            Err(reason) => {
                agent.metrics().learn_refused(reason.label());
                debug!(port = %port.host_ifname, reason = %reason, "guest's address probe refused");
                return;
            }
        };
        lock(&agent.guard.learned).upsert(Binding {
            mac: mac_text.clone(),
            ip: ip.into(),
            port: Some(port.host_ifname.clone()),
            pod: pod_named(agent, &key, &own_pod),
            expires_unix_ms: None,
            source: BindingSource::Dad,
            replaced: None,
        });
        info!(port = %port.host_ifname, mac = %mac_text, %ip,
            "guest configured an address itself");
        // A move of neither family's lease: the entry is written with the
        // configured addresses as they are now.
        self.want_move(agent, key, Move::default());
    }

    /// A DHCPv4 message on a learning port.
    fn on_dhcp4(
        &mut self,
        agent: &Agent,
        (cid, ifname): Attachment,
        port: &crate::guard::GuardedPort,
        mac: [u8; 6],
        seen: &crate::bindings::learner::Seen<'_>,
    ) {
        let now = Instant::now().into_std();
        // A VM port OVN-Kubernetes serves itself has no record: its network
        // is its pod's entry and the servers its port saw ack it.
        let ovs = self.own_path(agent, &(cid.clone(), ifname.clone()), port);
        let entries = &mut self.entries;
        let learned = self.learner.observe(port.ifindex, mac, seen, now, || {
            let Some(ovs) = &ovs else {
                return network_view(agent, &cid, &ifname, mac);
            };
            let entry = ovnk_vm::pod_of(agent, ovs)
                .and_then(|p| ovnk_vm::entry_of(&p, ovnk_vm::entry_key(ovs)));
            let (known, held) = ovnk_vm::node_knowledge(agent, ovs.network.as_deref(), mac);
            Some(
                entries
                    .entry(port.ifindex)
                    .or_default()
                    .view(entry.as_ref(), &known, held),
            )
        });
        let learned = match learned {
            Ok(Some(l)) => l,
            Ok(None) => return,
            Err(reason) => {
                if let (Refused::UnknownServer(Some(server)), Some(_)) = (&reason, &ovs)
                    && let Ok(msg) = xdhcp_engine::validate::parse_observed(seen.payload)
                {
                    self.entries.entry(port.ifindex).or_default().saw_ack(
                        *server,
                        seen.src_ip,
                        seen.src_mac,
                        msg.yiaddr,
                    );
                }
                agent.metrics().learn_refused(reason.label());
                debug!(port = %port.host_ifname, reason = %reason, "guest message refused");
                return;
            }
        };
        let key = (cid, ifname);
        let record = agent
            .leases
            .get(&key.0, &key.1)
            .map(|h| lock(&h.live).record.clone());
        let mac_text = format_mac(mac);
        match learned {
            Learned::Released { ip } => {
                lock(&agent.guard.learned).remove(&mac_text, Some(ip));
                info!(port = %port.host_ifname, mac = %mac_text, %ip, "guest gave its address back");
            }
            Learned::Declined { ip } => {
                let gone = lock(&agent.guard.learned).take(&mac_text, Some(ip));
                info!(port = %port.host_ifname, mac = %mac_text, %ip,
                    "guest declined the address it was acknowledged (in use)");
                // The ACK moved the entry to an address the guest never held:
                // put back what it reported before.
                if let Some(IpAddr::V4(back)) = gone.and_then(|b| b.replaced)
                    && back != ip
                {
                    let target = Target {
                        ip: back,
                        prefix_len: None,
                        router: None,
                    };
                    self.want(agent, key, target);
                }
            }
            Learned::Bound {
                ip,
                prefix_len,
                router,
                lease_secs,
            } => {
                let (pod, reported) = reported_by(agent, record.as_ref(), ovs.as_ref());
                follow(
                    agent,
                    &port.host_ifname,
                    &mac_text,
                    pod,
                    reported,
                    ip,
                    lease_secs,
                );
                // A renewal too: the entry may have been reset meanwhile (a
                // repeated ADD reports the one-shot's address again), and
                // an exchange the guest completed is what moves it back.
                // The write reads the entry first and patches nothing when
                // it already reports the address.
                let target = Target {
                    ip,
                    prefix_len,
                    router,
                };
                self.want(agent, key, target);
            }
        }
    }

    /// A DHCPv6 message on a learning port: what [`Self::on_event`] does
    /// for DHCPv4, by [`crate::bindings::learner6`]'s rules. An accepted
    /// REPLY records the guest's IPv6 binding (source `learned`) and moves
    /// the entry's IPv6 address to it, keeping its IPv4 address on a
    /// dual-stack network; a RELEASE drops the binding and leaves the
    /// entry at the last address the guest held; a DECLINE drops it and,
    /// when its REPLY had moved the entry, puts back the IPv6 address the
    /// entry reported before (the guest never held the declined one).
    fn on_dhcp6(
        &mut self,
        agent: &Agent,
        key: Attachment,
        port: &crate::guard::GuardedPort,
        mac: [u8; 6],
        seen: &Seen6<'_>,
    ) {
        let now = Instant::now().into_std();
        let ovs = self.own_path(agent, &key, port);
        // Read once for the view and the binding: the pod and its entry.
        let own_pod = OwnPod::new(agent, ovs.as_ref());
        let learned = self.learner6.observe(port.ifindex, seen, now, || {
            view6_of(agent, &key, &own_pod, mac)
        });
        let learned = match learned {
            Ok(Some(l)) => l,
            Ok(None) => return,
            Err(reason) => {
                agent.metrics().learn_refused(reason.label());
                debug!(port = %port.host_ifname, reason = %reason, "guest DHCPv6 message refused");
                return;
            }
        };
        let mac_text = format_mac(mac);
        match learned {
            Learned6::GivenUp { ips, declined } => {
                let mut back = None;
                let mut store = lock(&agent.guard.learned);
                for ip in ips {
                    let Some(gone) = store.take6(&mac_text, Some(ip)) else {
                        continue;
                    };
                    if declined {
                        info!(port = %port.host_ifname, mac = %mac_text, %ip,
                            "guest declined the IPv6 address it was given (in use)");
                        // The REPLY moved the entry to an address the guest
                        // never held: what it reported before goes back.
                        if let Some(IpAddr::V6(before)) = gone.replaced
                            && before != ip
                        {
                            back = Some(before);
                        }
                    } else {
                        info!(port = %port.host_ifname, mac = %mac_text, %ip,
                            "guest gave its IPv6 address up");
                    }
                }
                drop(store);
                if let Some(before) = back {
                    let mv = Move {
                        v4: None,
                        v6: Some(before),
                    };
                    self.want_move(agent, key, mv);
                }
            }
            Learned6::Configured { .. } => {}
            Learned6::Bound { ip, valid_secs } => {
                let pod = pod_named(agent, &key, &own_pod);
                let reported = reported6(agent, &key, &own_pod);
                let guest = Guest6 {
                    port: &port.host_ifname,
                    mac: &mac_text,
                    pod,
                    reported,
                };
                follow6(agent, guest, ip, valid_secs);
                let mv = Move {
                    v4: None,
                    v6: Some(ip),
                };
                self.want_move(agent, key, mv);
            }
        }
    }

    /// What Open vSwitch says of `port` when it is a VM port
    /// OVN-Kubernetes serves itself (no lease record of its attachment),
    /// remembered as such: the bindings learned on it go with it.
    fn own_path(
        &mut self,
        agent: &Agent,
        (cid, ifname): &Attachment,
        port: &crate::guard::GuardedPort,
    ) -> Option<crate::guard::OvsIdentity> {
        let ovs = port
            .identity
            .ovs
            .clone()
            .filter(|_| agent.leases.get(cid, ifname).is_none())?;
        self.own_path_ports.insert(port.host_ifname.clone());
        Some(ovs)
    }

    fn want(&mut self, agent: &Agent, key: Attachment, target: Target) {
        let mv = Move {
            v4: Some(target),
            v6: None,
        };
        self.want_move(agent, key, mv);
    }

    /// Wants `mv` written, over a move of the attachment not started yet
    /// (which keeps what it set for the other family).
    fn want_move(&mut self, agent: &Agent, key: Attachment, mv: Move) {
        let mv = mv.over(self.moves.pending(&key));
        if self.moves.want(key, mv, Instant::now().into_std()) == Pace::Deferred {
            agent.metrics().learn_move_deferred();
        }
    }

    /// Starts every entry write that may start now.
    fn dispatch(&mut self, agent: &Arc<Agent>) {
        while let Some((key, mv)) = self.moves.poll(Instant::now().into_std()) {
            // A family the move leaves alone stays where the last write
            // put it.
            let mv = mv.over(self.written.get(&key));
            self.written.insert(key.clone(), mv);
            let agent = agent.clone();
            self.writes.spawn(async move {
                let ok = write_entry(&agent, &key, mv).await;
                (key, ok)
            });
        }
    }

    fn written(&mut self, done: Result<(Attachment, bool), tokio::task::JoinError>) {
        let Ok((key, ok)) = done else {
            return;
        };
        if self.moves.done(&key, ok, Instant::now().into_std()) {
            info!(container_id = %key.0, ifname = %key.1, "the entry write is tried again");
        }
    }

    fn sweep(&mut self, agent: &Arc<Agent>) {
        let now = crate::sys::clock::now_unix_ms();
        for b in lock(&agent.guard.learned).expire(now) {
            info!(mac = %b.mac, ip = %b.ip, "learned binding expired");
        }
        let mono = Instant::now().into_std();
        self.learner.prune(mono);
        self.learner6.prune(mono);
        self.moves.prune(mono);
        self.written
            .retain(|(cid, ifname), _| !agent.leases.attachment(cid, ifname).is_empty());
        // A port no longer guarded (gone from OVS) forgets its servers,
        // and the bindings learned on it go: the VM left the node (migrated,
        // or stopped); nothing is sent for it.
        self.entries
            .retain(|ifindex, _| agent.guard.port_of(*ifindex).is_some());
        let gone = ovnk_vm::gone_ports(&self.own_path_ports, |p| agent.guard.port_on(p).is_some());
        if !gone.is_empty() {
            let mut store = lock(&agent.guard.learned);
            for b in store.rows(now) {
                if b.port.as_ref().is_some_and(|p| gone.contains(p)) {
                    store.remove_row(&b);
                    info!(port = ?b.port, mac = %b.mac, ip = %b.ip,
                        "the VM's port left Open vSwitch: its learned binding is dropped");
                }
            }
        }
        for p in &gone {
            self.own_path_ports.remove(p);
        }
        drop_configured_of_gone_vms(agent, now);
        self.asked_source
            .retain(|(p, _)| agent.guard.port_on(p).is_some());
        self.anchor_entries(agent);
        self.ask_sources(agent);
    }

    /// The ports OVN-Kubernetes serves itself anchor their servers from
    /// their pod's entry as it is now, guest message or not (see
    /// [`EntryNetwork::anchor`]); before a migration target's entry is
    /// moved to the source's address, so the one-shot's server stays known
    /// once it has.
    fn anchor_entries(&mut self, agent: &Agent) {
        for (_, port) in agent.guard.ports() {
            let (Some(ovs), Some(network)) = (
                port.identity.ovs.as_ref(),
                self.entries.get_mut(&port.ifindex),
            ) else {
                continue;
            };
            let entry = ovnk_vm::pod_of(agent, ovs)
                .and_then(|p| ovnk_vm::entry_of(&p, ovnk_vm::entry_key(ovs)));
            if let Some(e) = entry {
                network.anchor(&e);
            }
        }
    }

    /// On OVN-Kubernetes' own VM path, a migration target's learning port
    /// whose guest has not been seen there yet: the source pod's address is
    /// asked for once, and the target's entry takes it (the guest keeps its
    /// lease across the migration and may not ask again).
    fn ask_sources(&mut self, agent: &Arc<Agent>) {
        let now = crate::sys::clock::now_unix_ms();
        let learned_on: HashSet<String> = lock(&agent.guard.learned)
            .rows(now)
            .into_iter()
            .filter_map(|b| b.port)
            .collect();
        for ((cid, ifname), port) in agent.guard.ports() {
            let Some(ovs) = port.identity.ovs.clone() else {
                continue;
            };
            if !port.policy.learn
                || learned_on.contains(&port.host_ifname)
                || agent.leases.get(&cid, &ifname).is_some()
            {
                continue;
            }
            let Some(pod) = ovnk_vm::pod_of(agent, &ovs) else {
                continue;
            };
            // Once ovnkube-node has written the target's own entry (its
            // one-shot's): the copy corrects it, and is not overwritten.
            let Some(uid) = pod.uid.clone().filter(|_| {
                pod.migration_target().is_some()
                    && ovnk_vm::entry_of(&pod, ovnk_vm::entry_key(&ovs)).is_some()
            }) else {
                continue;
            };
            if !self.asked_source.insert((port.host_ifname.clone(), uid)) {
                continue;
            }
            let agent = agent.clone();
            self.sources.spawn(async move {
                let target = ovnk_vm::migration_source_address(&agent, &ovs)
                    .await
                    .and_then(|r| {
                        Some(Target {
                            ip: r.address?,
                            prefix_len: r.prefix_len,
                            router: r.gateway,
                        })
                    });
                ((cid, ifname), target)
            });
        }
    }

    fn source_known(&mut self, agent: &Agent, key: Attachment, target: Option<Target>) {
        let Some(target) = target else {
            return;
        };
        info!(container_id = %key.0, ifname = %key.1, ip = %target.ip,
            prefix_len = ?target.prefix_len, gateway = ?target.router,
            "migration target: its entry takes the source pod's address");
        self.want(agent, key, target);
    }

    /// Writes the learned-binding file on a blocking thread when a change
    /// is due (`all`: whatever changed, at shutdown); one write at a time.
    fn flush(&mut self, agent: &Agent, all: bool) {
        if !self.flushing.is_empty() {
            return;
        }
        let mut s = lock(&agent.guard.learned);
        let due = match s.dirty() {
            Change::None => false,
            Change::Expiry => all || self.last_flush.is_none_or(|t| t.elapsed() >= EXPIRY_FLUSH),
            Change::Durable => true,
        };
        if !due {
            return;
        }
        match s.take_snapshot() {
            Ok(Some(snap)) => {
                self.last_flush = Some(Instant::now());
                self.flushing
                    .spawn_blocking(move || (snap.change, snap.write()));
            }
            Ok(None) => {}
            Err(e) => {
                agent.metrics().failure("learned_binding_store");
                warn!(error = %e, "could not encode the learned bindings");
            }
        }
    }
}

/// The addresses a guest configured itself have no lifetime the agent
/// sees: they go with the VM, once its MAC has no lease record on the
/// node (its DEL) and its port is not guarded.
fn drop_configured_of_gone_vms(agent: &Agent, now: u64) {
    let macs: HashSet<String> = agent
        .leases
        .all()
        .iter()
        .map(|h| format_mac(lock(&h.live).record.mac))
        .collect();
    let mut store = lock(&agent.guard.learned);
    for b in store.rows(now) {
        if b.source == BindingSource::Dad
            && !macs.contains(&b.mac)
            && b.port
                .as_ref()
                .is_none_or(|p| agent.guard.port_on(p).is_none())
        {
            store.remove_row(&b);
            info!(port = ?b.port, mac = %b.mac, ip = %b.ip,
                "the VM is gone: the address its guest configured is dropped");
        }
    }
}

/// A write of the learned-binding file ended; a failed one's changes are
/// written again with the next flush.
fn flushed(agent: &Agent, done: Result<(Change, Result<(), StoreError>), tokio::task::JoinError>) {
    let (change, result) = match done {
        Ok(d) => d,
        Err(e) => (Change::Durable, Err(StoreError::Task(e.to_string()))),
    };
    if let Err(e) = result {
        lock(&agent.guard.learned).mark_unwritten(change);
        agent.metrics().failure("learned_binding_store");
        warn!(error = %e, "could not persist the learned bindings; retrying");
    }
}

/// What the node knows of the network of attachment `(cid, ifname)`: the
/// servers and prefixes of every lease of that network on the node, and the
/// addresses the other bindings of that network hold (leases of other
/// attachments and MACs, bindings learned for other MACs). `None` when the
/// attachment has no record.
fn network_view(agent: &Agent, cid: &str, ifname: &str, mac: [u8; 6]) -> Option<NetworkView> {
    let mut view = NetworkView::default();
    let others = network_leases(agent, cid, ifname, mac, |r, other| {
        if let Some(l) = &r.lease {
            view.served(l.server_id, l.server_mac, l.address, l.prefix_len);
            if other {
                view.held.insert(l.address);
            }
        }
    })?;
    view.held.extend(
        learned_by(agent, &others)
            .into_iter()
            .filter_map(|ip| match ip {
                IpAddr::V4(a) => Some(a),
                IpAddr::V6(_) => None,
            }),
    );
    Some(view)
}

/// Walks every lease record of the network of attachment `(cid, ifname)`
/// on the node, telling `each` whether it belongs to another MAC than
/// `mac`; returns those other MACs. `None` when the attachment has no
/// record.
fn network_leases(
    agent: &Agent,
    cid: &str,
    ifname: &str,
    mac: [u8; 6],
    mut each: impl FnMut(&crate::lease::persist::LeaseRecord, bool),
) -> Option<HashSet<String>> {
    let own = agent.leases.get(cid, ifname)?;
    let network = lock(&own.live).record.network.name.clone();
    let mut others = HashSet::new();
    for h in agent.leases.all() {
        let live = lock(&h.live);
        let r = &live.record;
        if r.network.name != network {
            continue;
        }
        let other = r.mac != mac;
        if other {
            others.insert(format_mac(r.mac));
        }
        each(r, other);
    }
    Some(others)
}

/// The addresses learned now for the MACs in `macs`.
fn learned_by(agent: &Agent, macs: &HashSet<String>) -> Vec<IpAddr> {
    let now = crate::sys::clock::now_unix_ms();
    lock(&agent.guard.learned)
        .rows(now)
        .into_iter()
        .filter(|b| macs.contains(&b.mac))
        .map(|b| b.ip)
        .collect()
}

/// What the node knows of the IPv6 side of the network of attachment
/// `(cid, ifname)`: the servers (DUIDs), where their REPLYs came from and
/// the prefixes of every DHCPv6 lease of that network on the node, and the IPv6 addresses the other bindings
/// of that network hold (DHCPv6 leases of other MACs, IPv6 bindings
/// learned for other MACs). `None` when the attachment has no record, or
/// the network no DHCPv6 lease on the node.
fn network_view6(agent: &Agent, cid: &str, ifname: &str, mac: [u8; 6]) -> Option<NetworkView6> {
    let mut view = NetworkView6::default();
    let others = network_leases(agent, cid, ifname, mac, |r, other| {
        if let Some(l6) = r.lease6.as_deref() {
            let a = crate::lease::v6::address6(&r.network, l6, r.router6);
            view.served(&l6.server_id, l6.server_source, l6.address, a.prefix_len);
            if other {
                view.held.insert(l6.address);
            }
        }
    })?;
    if view.servers.is_empty() {
        return None;
    }
    view.held.extend(
        learned_by(agent, &others)
            .into_iter()
            .filter_map(|ip| match ip {
                IpAddr::V6(a) => Some(a),
                IpAddr::V4(_) => None,
            }),
    );
    Some(view)
}

/// The IPv6 view of the network of attachment `key`: from the node's
/// lease records of its network, or on a VM port OVN-Kubernetes serves
/// itself (`own`) of the network the port names, with its pod's entry
/// ([`ovnk_vm::view6`]). `None`: nothing on the node vouches for a
/// server or prefix of it.
fn view6_of(
    agent: &Agent,
    key: &Attachment,
    own: &OwnPod<'_>,
    mac: [u8; 6],
) -> Option<NetworkView6> {
    let Some(ovs) = own.ovs else {
        return network_view6(agent, &key.0, &key.1, mac);
    };
    ovnk_vm::node_knowledge6(agent, ovs.network.as_deref(), mac, own.entry())
}

/// A VM port OVN-Kubernetes serves itself (`ovs`; `None` on every other
/// port): its pod and the pod's entry, read from the node's pods once per
/// guest message, when first asked for.
struct OwnPod<'a> {
    agent: &'a Agent,
    ovs: Option<&'a crate::guard::OvsIdentity>,
    read: std::cell::OnceCell<Option<(crate::kube::PodInfo, Option<PodNetworkEntry>)>>,
}

impl<'a> OwnPod<'a> {
    fn new(agent: &'a Agent, ovs: Option<&'a crate::guard::OvsIdentity>) -> Self {
        Self {
            agent,
            ovs,
            read: std::cell::OnceCell::new(),
        }
    }

    fn read(&self) -> Option<&(crate::kube::PodInfo, Option<PodNetworkEntry>)> {
        self.read
            .get_or_init(|| {
                let ovs = self.ovs?;
                let pod = ovnk_vm::pod_of(self.agent, ovs)?;
                let entry = ovnk_vm::entry_of(&pod, ovnk_vm::entry_key(ovs));
                Some((pod, entry))
            })
            .as_ref()
    }

    /// `<namespace>/<name>` of the port's pod.
    fn pod_name(&self) -> Option<String> {
        self.read()
            .map(|(p, _)| format!("{}/{}", p.namespace, p.name))
    }

    /// The pod's entry for the port's network.
    fn entry(&self) -> Option<&PodNetworkEntry> {
        self.read().and_then(|(_, e)| e.as_ref())
    }
}

/// `<namespace>/<name>` of the attachment's pod: from its record, else
/// (a VM port OVN-Kubernetes serves itself) its port's pod.
fn pod_named(agent: &Agent, key: &Attachment, own: &OwnPod<'_>) -> Option<String> {
    pod_of(agent, key).or_else(|| own.pod_name())
}

/// `<namespace>/<name>` of the attachment's pod, from its record.
fn pod_of(agent: &Agent, (cid, ifname): &Attachment) -> Option<String> {
    agent.leases.get(cid, ifname).and_then(|h| {
        lock(&h.live)
            .record
            .pod
            .as_ref()
            .map(|p| format!("{}/{}", p.namespace, p.name))
    })
}

/// Records the guest's IPv6 binding (in memory), logging when its address
/// is not the one last learned.
fn follow6(agent: &Agent, guest: Guest6<'_>, ip: Ipv6Addr, valid_secs: Option<u32>) {
    let Guest6 {
        port,
        mac: mac_text,
        pod,
        reported,
    } = guest;
    let mut store = lock(&agent.guard.learned);
    let existing = store.get6(mac_text).cloned();
    // What the entry reports now: the last learned address, else the
    // attachment's own lease's (or, on OVN-Kubernetes' own path, the
    // entry's).
    let previous = existing
        .as_ref()
        .and_then(|b| match b.ip {
            IpAddr::V6(a) => Some(a),
            IpAddr::V4(_) => None,
        })
        .or(reported);
    let now = crate::sys::clock::now_unix_ms();
    store.upsert(Binding {
        mac: mac_text.to_owned(),
        ip: ip.into(),
        port: Some(port.to_owned()),
        pod,
        expires_unix_ms: valid_secs.map(|s| now + u64::from(s) * 1000),
        source: BindingSource::Learned,
        // A renewal keeps what its first REPLY replaced; a move records
        // what it replaces (put back if the guest declines the address).
        replaced: if previous == Some(ip) {
            existing.filter(|b| b.ip == ip).and_then(|b| b.replaced)
        } else {
            previous.map(IpAddr::from)
        },
    });
    drop(store);
    if previous != Some(ip) {
        info!(port, mac = %mac_text, %ip, previous = ?previous,
            "guest holds another IPv6 address than reported");
    }
}

/// The guest [`follow6`] records an IPv6 binding for: its port's host
/// end, its MAC, its pod, and the IPv6 address its entry reports.
struct Guest6<'a> {
    port: &'a str,
    mac: &'a str,
    pod: Option<String>,
    reported: Option<Ipv6Addr>,
}

/// The IPv6 address the attachment's entry reports as the agent knows it:
/// its own DHCPv6 lease's (a VM's one-shot), else, on a VM port
/// OVN-Kubernetes serves itself, the first IPv6 address of its pod's entry.
fn reported6(agent: &Agent, (cid, ifname): &Attachment, own: &OwnPod<'_>) -> Option<Ipv6Addr> {
    let ours = agent
        .leases
        .attachment(cid, ifname)
        .into_iter()
        .find_map(|h| lock(&h.live).record.lease6.as_ref().map(|l| l.address));
    ours.or_else(|| ovnk_vm::entry_address6(own.entry()?).map(|(ip, _)| ip))
}

/// The pod an attachment is for and the address its entry reported:
/// from its record, else (OVN-Kubernetes' own VM path) from its port's pod.
fn reported_by(
    agent: &Agent,
    record: Option<&crate::store::LeaseRecord>,
    ovs: Option<&crate::guard::OvsIdentity>,
) -> (Option<String>, Option<Ipv4Addr>) {
    match (record, ovs) {
        (Some(r), _) => (
            r.pod
                .as_ref()
                .map(|p| format!("{}/{}", p.namespace, p.name)),
            r.lease.as_ref().map(|l| l.address),
        ),
        (None, Some(o)) => ovnk_vm::pod_of(agent, o).map_or((None, None), |p| {
            let at = ovnk_vm::entry_of(&p, ovnk_vm::entry_key(o))
                .as_ref()
                .and_then(ovnk_vm::entry_address)
                .map(|(a, _)| a);
            (Some(format!("{}/{}", p.namespace, p.name)), at)
        }),
        (None, None) => (None, None),
    }
}

/// Records the guest's binding (in memory; `pod` named, `reported` the
/// address the entry reported before, the record's or the entry's),
/// logging when its address is not the one last learned or reported.
fn follow(
    agent: &Agent,
    port: &str,
    mac_text: &str,
    pod: Option<String>,
    reported: Option<Ipv4Addr>,
    ip: Ipv4Addr,
    lease_secs: Option<u32>,
) {
    let mut store = lock(&agent.guard.learned);
    let existing = store.get(mac_text).cloned();
    // What the entry reports now: the last learned address, else the one-shot's.
    let previous = existing.as_ref().and_then(Binding::ipv4).or(reported);
    let now = crate::sys::clock::now_unix_ms();
    let binding = Binding {
        mac: mac_text.to_owned(),
        ip: ip.into(),
        port: Some(port.to_owned()),
        pod,
        expires_unix_ms: lease_secs.map(|s| now + u64::from(s) * 1000),
        source: BindingSource::Learned,
        // A renewal keeps what its first ACK replaced; a move records
        // what it replaces.
        replaced: if previous == Some(ip) {
            existing.filter(|b| b.ip == ip).and_then(|b| b.replaced)
        } else {
            previous.map(IpAddr::from)
        },
    };
    store.upsert(binding);
    drop(store);
    if previous != Some(ip) {
        info!(port, mac = %mac_text, %ip, previous = ?previous,
            "guest holds another address than reported");
    }
}

/// Rewrites the `pod-networks` entry of the attachment's records to the
/// move (the IPv4 record's prefix length and router unless given; a family
/// the move leaves `None` at the guest's learned address of that family,
/// else the record's); an entry that already reports it is read, not
/// written. Whether the entry is as wanted (an attachment gone, or one
/// without an entry, has nothing to write: done).
///
/// Never while an ADD or DEL of the attachment is in flight: the write
/// holds the attachment's lock, and when an ADD holds it the write is
/// dropped (done): the ADD's report stands, and the guest's next exchange
/// moves the entry again. An ADD that comes while the write is out waits
/// for it, and what it reports is followed the same way.
async fn write_entry(agent: &Agent, key: &Attachment, mv: Move) -> bool {
    let Ok(_held) =
        tokio::time::timeout(Duration::ZERO, agent.leases.key_lock(&key.0, &key.1)).await
    else {
        info!(container_id = %key.0, ifname = %key.1, ip = ?mv.v4.map(|t| t.ip), ip6 = ?mv.v6,
            "an ADD or DEL of the attachment is in flight; its report stands until the guest's next exchange");
        return true;
    };
    let records: Vec<crate::store::LeaseRecord> = agent
        .leases
        .attachment(&key.0, &key.1)
        .iter()
        .map(|h| lock(&h.live).record.clone())
        .collect();
    let Some(rec) = records.first() else {
        // No record: a VM OVN-Kubernetes serves itself; its port says
        // which pod and network. Each family the move leaves alone stays
        // as the entry lists it; the guest's self-configured addresses
        // are listed after its IPv6 one.
        if let Some(ovs) = agent
            .guard
            .port_for(&key.0, &key.1)
            .and_then(|p| p.identity.ovs)
        {
            let configured6 = ovs.mac.map_or_else(Vec::new, |m| {
                lock(&agent.guard.learned).configured(&format_mac(m))
            });
            let to = ovnk_vm::GuestAddresses {
                v4: mv.v4.map(|t| (t.ip, t.prefix_len, t.router)),
                v6: mv.v6,
                configured6,
            };
            return ovnk_vm::write_entry(agent, &ovs, &to).await;
        }
        info!(container_id = %key.0, ip = ?mv.v4.map(|t| t.ip), ip6 = ?mv.v6,
            "no lease record for the port; the entry is not written");
        return true;
    };
    let (Some(pod), Some(annotation)) = (rec.pod.clone(), rec.annotation_key.clone()) else {
        return true;
    };
    let (lease, a6) = entry_addresses(agent, &records, mv);
    let configured = lock(&agent.guard.learned).configured(&format_mac(rec.mac));
    let written = crate::ops::report::report_learned(
        &*agent.pod_api,
        &pod,
        &annotation,
        (lease.as_ref(), a6),
        &configured,
        rec.mac,
    )
    .await;
    match written {
        Ok(()) => {
            info!(pod = %format!("{}/{}", pod.namespace, pod.name),
                ip = ?lease.map(|l| l.address), ip6 = ?a6.map(|a| a.address),
                "pod-networks entry reports the guest's address");
            true
        }
        Err(e) => {
            agent.metrics().failure("kube_api");
            warn!(error = %crate::rpc::format_chain(&e),
                "could not update the pod-networks entry to the guest's address");
            false
        }
    }
}

/// What the entry of the attachment whose records are `records` reports
/// after `mv`: its DHCPv4 lease with the move's IPv4 address (else the
/// guest's learned one, else the record's), and its DHCPv6 address (the
/// move's, else the guest's learned one, else the record's). A family the
/// attachment has no record of is `None`.
fn entry_addresses(
    agent: &Agent,
    records: &[crate::store::LeaseRecord],
    mv: Move,
) -> (
    Option<xdhcp_engine::Lease>,
    Option<crate::lease::apply::Address6>,
) {
    let Some(rec) = records.first() else {
        return (None, None);
    };
    let mac_text = format_mac(rec.mac);
    let now = crate::sys::clock::now_unix_ms();
    let (learned4, learned6) = {
        let store = lock(&agent.guard.learned);
        let live = |b: &Binding| b.expires_unix_ms.is_none_or(|e| e > now);
        (
            store
                .get(&mac_text)
                .filter(|b| live(b))
                .and_then(Binding::ipv4),
            store
                .get6(&mac_text)
                .filter(|b| live(b))
                .and_then(|b| match b.ip {
                    IpAddr::V6(a) => Some(a),
                    IpAddr::V4(_) => None,
                }),
        )
    };
    let lease = records
        .iter()
        .find_map(|r| r.lease.clone())
        .map(|mut lease| {
            match mv.v4 {
                Some(target) => {
                    lease.address = target.ip;
                    if let Some(p) = target.prefix_len {
                        lease.prefix_len = p;
                    }
                    if let Some(r) = target.router {
                        lease.routers = vec![r];
                    }
                }
                None => lease.address = learned4.unwrap_or(lease.address),
            }
            lease
        });
    // A dual-stack VM's entry carries its IPv6 address beside the IPv4
    // one: each family's move leaves the other's address in place.
    let a6 = records.iter().find_map(|r| {
        r.lease6.as_deref().map(|l6| {
            let mut a = crate::lease::v6::address6(&r.network, l6, r.router6);
            a.address = mv.v6.or(learned6).unwrap_or(a.address);
            a
        })
    });
    (lease, a6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_move_keeps_what_an_older_one_set_for_the_other_family() {
        let v4 = Target {
            ip: Ipv4Addr::new(192, 0, 2, 77),
            prefix_len: Some(24),
            router: None,
        };
        let older = Move {
            v4: Some(v4),
            v6: None,
        };
        let v6: Ipv6Addr = "fd00:6::1a0".parse().unwrap();
        let newer = Move {
            v4: None,
            v6: Some(v6),
        };
        assert_eq!(
            newer.over(Some(&older)),
            Move {
                v4: Some(v4),
                v6: Some(v6)
            }
        );
        // What the newer move sets wins; nothing older: as it is.
        let v4b = Target {
            ip: Ipv4Addr::new(192, 0, 2, 78),
            ..v4
        };
        let both = Move {
            v4: Some(v4b),
            v6: None,
        }
        .over(Some(&Move {
            v4: Some(v4),
            v6: Some(v6),
        }));
        assert_eq!(
            both,
            Move {
                v4: Some(v4b),
                v6: Some(v6)
            }
        );
        assert_eq!(newer.over(None), newer);
        assert_eq!(Move::default().over(Some(&both)), both);
    }
}
