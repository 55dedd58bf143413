//! Bridge ports made ready for the guard before their ADD.
//!
//! The guard's filter hangs on the port's `clsact` qdisc, and making that
//! qdisc deactivates the port for an RCU grace period (a frame handed to
//! the port then is dropped), so a pod's ADD holds its first DISCOVER
//! until the qdisc is there (`datapath::link::PortPrepared`): 0.1–0.5 ms
//! on a quiet node, milliseconds when a burst's ADDs queue for RTNL. That
//! is work that can be done before the ADD: the main plugin enslaves the
//! pod's host port to its bridge a plugin exec or more before it calls the
//! IPAM plugin.
//!
//! So the guard learns the Linux bridges it serves — the master of each
//! port it guards, and of each uplink — and from then on every veth
//! enslaved to one of them gets its `clsact` qdisc as soon as the kernel
//! says so (`RTNLGRP_LINK`). A `clsact` qdisc without a filter does nothing
//! to the port's frames. The ADD's own call then finds the qdisc made and
//! lets its DISCOVER go without the wait.
//!
//! The ports a bridge already has when it is learned are left alone: they
//! carry traffic (the bridge's uplink, pods running already, another
//! pod's exchange), and making their qdisc would drop what the bridge
//! hands them in that moment. Their ADD, if one comes, makes the qdisc
//! before its DISCOVER; from then on the port counts as made ready, so the
//! next ADD on it (a pod whose sandbox is made again on the same port)
//! does not wait for the qdisc a second time. The same holds after missed
//! link events: the ports found then are left alone. Open vSwitch ports
//! are not made ready here: the daemon guards them from the OVS database
//! before their ADD.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::GuardService;
use crate::netlink::{LinkDetails, LinkEvent, LinkEvents, Netlink};
use crate::sys::sync::lock;

/// How long after a failed subscription to the link events it is tried
/// again.
const RETRY: Duration = Duration::from_secs(5);

/// Which bridges are served and which of their ports are made ready.
/// Sans-IO: [`GuardService::prepare_ahead`] feeds it the kernel's links.
#[derive(Debug, Default)]
pub(crate) struct Ahead {
    /// Ifindexes of the Linux bridges the guard serves.
    bridges: BTreeSet<u32>,
    /// Ifindexes of the ports whose qdisc was made (or asked for).
    prepared: BTreeSet<u32>,
    /// Ifindexes of the ports a served bridge had when it was learned (or
    /// when events were missed): live ports, never made ready here.
    found: BTreeSet<u32>,
}

impl Ahead {
    /// Serves `master` (the device a guarded port or an uplink is enslaved
    /// to) when it is a Linux bridge; `true` when it was not served yet.
    pub(crate) fn learn(&mut self, master: &LinkDetails) -> bool {
        master.kind.as_deref() == Some("bridge") && self.bridges.insert(master.ifindex)
    }

    /// Whether `link` is a port to make ready now: a veth enslaved to a
    /// served bridge since it was learned, not made ready yet (it is
    /// marked so). A port taken off the bridge is forgotten, so it is made
    /// ready if it comes back.
    pub(crate) fn wants(&mut self, link: &LinkDetails) -> bool {
        let served = link.master.is_some_and(|m| self.bridges.contains(&m));
        if !served {
            self.prepared.remove(&link.ifindex);
            self.found.remove(&link.ifindex);
            return false;
        }
        link.kind.as_deref() == Some("veth")
            && !self.found.contains(&link.ifindex)
            && self.prepared.insert(link.ifindex)
    }

    /// Notes the ports of the served bridges among `links` (the node's
    /// links now) that are not made ready: they are live and left alone.
    /// How many were not noted before.
    pub(crate) fn found(&mut self, links: &[LinkDetails]) -> usize {
        let mut noted = 0;
        for link in links {
            let served = link.master.is_some_and(|m| self.bridges.contains(&m));
            if served && !self.prepared.contains(&link.ifindex) && self.found.insert(link.ifindex) {
                noted += 1;
            }
        }
        noted
    }

    /// Port `ifindex` of bridge `master` got its qdisc at its ADD: when the
    /// bridge is served, the port counts as made ready from now on (until
    /// it leaves the bridge or is deleted). Whether it does.
    pub(crate) fn had_made(&mut self, ifindex: u32, master: Option<u32>) -> bool {
        if !master.is_some_and(|m| self.bridges.contains(&m)) {
            return false;
        }
        self.found.remove(&ifindex);
        self.prepared.insert(ifindex);
        true
    }

    /// Serves no bridge (their ports could not be listed: which are live
    /// is unknown). Each is learned again at its next guarded port.
    fn forget_bridges(&mut self) {
        self.bridges.clear();
    }

    /// Whether port `ifindex` is marked made ready.
    fn is_marked(&self, ifindex: u32) -> bool {
        self.prepared.contains(&ifindex)
    }

    /// Link `ifindex` was deleted.
    pub(crate) fn gone(&mut self, ifindex: u32) {
        self.prepared.remove(&ifindex);
        self.found.remove(&ifindex);
        self.bridges.remove(&ifindex);
    }

    /// Whether any bridge is served.
    fn serves(&self) -> bool {
        !self.bridges.is_empty()
    }
}

/// What the guard tells its follower ([`GuardService::prepare_ahead`]):
/// a port whose bridge is to be learned, and, when the port got its qdisc
/// at its ADD (a guard attached on TC), its index.
#[derive(Debug)]
struct Told {
    port: String,
    has_qdisc: Option<u32>,
}

/// The ports whose bridge is to be learned, from the guard to its
/// follower ([`GuardService::prepare_ahead`]).
#[derive(Debug, Default)]
pub(crate) struct Learning {
    tx: Option<tokio::sync::mpsc::UnboundedSender<Told>>,
    rx: Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<Told>>>,
    /// Ifindexes of the ports whose qdisc is there: made here, or found
    /// made.
    made: Made,
}

/// The ports made ready, shared with the blocking thread that makes them.
type Made = Arc<Mutex<BTreeSet<u32>>>;

impl Learning {
    /// A guard that is on learns bridges; one that is off has no channel.
    pub(crate) fn on() -> Self {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        Self {
            tx: Some(tx),
            rx: Mutex::new(Some(rx)),
            made: Made::default(),
        }
    }
}

impl GuardService {
    /// Whether host port `ifindex` has its `clsact` qdisc already (made
    /// ready before its ADD): the ADD's first DISCOVER need not wait for
    /// it.
    pub(crate) fn made_ready(&self, ifindex: u32) -> bool {
        lock(&self.ahead.made).contains(&ifindex)
    }

    /// Serve the bridge `port` (a host interface of the agent's namespace)
    /// is enslaved to, if it is a Linux bridge: the veth ports enslaved to
    /// it from then on are made ready before their ADD. `has_qdisc`: the
    /// port's index, when its guard's filters hang on its `clsact` qdisc
    /// now (made at its ADD); the port then counts as made ready for the
    /// next ADD on it. Cheap: the lookup is the follower's, and a port made
    /// ready is of a served bridge already, so it asks for none (in a
    /// burst of fresh pods, every ADD but the bridge's first).
    pub(crate) fn serve_bridge_of(&self, port: &str, has_qdisc: Option<u32>) {
        if has_qdisc.is_some_and(|i| self.made_ready(i)) {
            return;
        }
        if let Some(tx) = &self.ahead.tx {
            let _ = tx.send(Told {
                port: port.to_owned(),
                has_qdisc,
            });
        }
    }

    /// Follows the agent's namespace's links, making each veth port of a
    /// served bridge ready for the guard ([`Ahead`]), until `token` is
    /// cancelled. A side task: a failed subscription is logged and tried
    /// again; this returns only when cancelled.
    pub(crate) async fn prepare_ahead(self: Arc<Self>, token: CancellationToken) {
        let learning = self
            .ahead
            .rx
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        let Some(mut learning) = learning else {
            token.cancelled().await;
            return;
        };
        let mut ahead = Ahead::default();
        loop {
            // Subscribed before any port is read, so a port enslaved in
            // between is heard of.
            let opened = LinkEvents::open_here().map_err(|e| e.to_string());
            let opened = match opened {
                Ok(events) => Netlink::open(None)
                    .await
                    .map(|nl| (events, nl))
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e),
            };
            let (mut events, nl) = match opened {
                Ok(both) => both,
                Err(error) => {
                    warn!(%error, "cannot follow the node's links; bridge ports are made ready for the guard at their ADD");
                    tokio::select! {
                        () = token.cancelled() => return,
                        () = tokio::time::sleep(RETRY) => continue,
                    }
                }
            };
            if ahead.serves() {
                // Events were missed: what is there now may be live.
                self.note_found(&nl, &mut ahead).await;
            }
            loop {
                tokio::select! {
                    () = token.cancelled() => return,
                    Some(told) = learning.recv() => self.told(&nl, &mut ahead, told).await,
                    event = events.next() => match event {
                        Some(LinkEvent::Changed(link)) => {
                            if ahead.wants(&link) {
                                self.make_ready(vec![(link.ifindex, link.name)]).await;
                            } else if !ahead.is_marked(link.ifindex) {
                                lock(&self.ahead.made).remove(&link.ifindex);
                            }
                        }
                        Some(LinkEvent::Gone(ifindex)) => {
                            ahead.gone(ifindex);
                            lock(&self.ahead.made).remove(&ifindex);
                        }
                        None => {
                            warn!("the node's link events ended; subscribing again");
                            break;
                        }
                    },
                }
            }
        }
    }

    /// Serves the bridge the port `told` of is enslaved to (noting the
    /// ports it has now as live when it is new); a port that has its qdisc
    /// counts as made ready from now on.
    async fn told(&self, nl: &Netlink, ahead: &mut Ahead, told: Told) {
        let Told { port, has_qdisc } = told;
        let master = self.learn_bridge(nl, ahead, &port).await;
        if let Some(ifindex) = has_qdisc
            && ahead.had_made(ifindex, master)
        {
            lock(&self.ahead.made).insert(ifindex);
            debug!(
                port,
                "port made ready for the guard at its ADD: the next ADD on it does not wait for its qdisc"
            );
        }
    }

    /// Serves the bridge `port` is enslaved to, noting the ports it has
    /// now as live when it is new; the port's master, if it has one.
    async fn learn_bridge(&self, nl: &Netlink, ahead: &mut Ahead, port: &str) -> Option<u32> {
        let master = match nl.link(port).await {
            Ok(link) => link.master,
            Err(e) => {
                debug!(port, error = %e, "no bridge learned");
                return None;
            }
        };
        let master = master?;
        match nl.link_by_index(master).await {
            Ok(Some(bridge)) if ahead.learn(&bridge) => {
                if let Some(live) = self.note_found(nl, ahead).await {
                    info!(bridge = %bridge.name, port, live_ports_left_alone = live,
                        "the guard serves this bridge: veth ports enslaved from now on get their qdisc before their ADD");
                }
            }
            Ok(_) => {}
            Err(e) => debug!(port, error = %e, "no bridge learned"),
        }
        Some(master)
    }

    /// Notes the ports the served bridges have now as live (never made
    /// ready here); how many were not noted before. When the ports cannot
    /// be listed, no bridge is served any more (`None`).
    async fn note_found(&self, nl: &Netlink, ahead: &mut Ahead) -> Option<usize> {
        match nl.links().await {
            Ok(links) => Some(ahead.found(&links)),
            Err(e) => {
                ahead.forget_bridges();
                warn!(error = %e, "cannot list the node's links; bridge ports are made ready for the guard at their ADD");
                None
            }
        }
    }

    /// Makes each port's `clsact` qdisc, one after another on a blocking
    /// thread (netlink, RTNL), and notes the ports that have one.
    async fn make_ready(&self, ports: Vec<(u32, String)>) {
        if ports.is_empty() {
            return;
        }
        let made = self.ahead.made.clone();
        let done = tokio::task::spawn_blocking(move || {
            for (ifindex, port) in ports {
                let t = std::time::Instant::now();
                match crate::datapath::ebpf::prepare_port(&port) {
                    Ok(new) => {
                        lock(&made).insert(ifindex);
                        debug!(
                            port,
                            made = new,
                            qdisc_us = t.elapsed().as_micros(),
                            "port made ready for the guard before its ADD"
                        );
                    }
                    Err(e) => debug!(port, error = %e, "port not made ready for the guard"),
                }
            }
        })
        .await;
        if let Err(e) = done {
            warn!(error = %e, "the task making bridge ports ready failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(ifindex: u32, kind: &str, master: Option<u32>) -> LinkDetails {
        LinkDetails {
            ifindex,
            name: format!("if{ifindex}"),
            mac: None,
            kind: Some(kind.to_owned()),
            mtu: None,
            up: true,
            running: true,
            master,
        }
    }

    #[test]
    fn only_veth_ports_of_a_served_linux_bridge_are_made_ready_and_each_once() {
        let mut ahead = Ahead::default();
        let port = link(10, "veth", Some(2));
        assert!(!ahead.wants(&port), "no bridge is served yet");
        assert!(
            !ahead.learn(&link(3, "openvswitch", None)),
            "not a Linux bridge"
        );
        assert!(ahead.learn(&link(2, "bridge", None)));
        assert!(!ahead.learn(&link(2, "bridge", None)), "served already");
        assert!(ahead.wants(&port));
        assert!(!ahead.wants(&port), "made ready once");
        assert!(!ahead.wants(&link(11, "veth", Some(3))), "another master");
        assert!(!ahead.wants(&link(12, "dummy", Some(2))), "not a veth");
        assert!(!ahead.wants(&link(13, "veth", None)), "no master");
    }

    #[test]
    fn a_port_that_leaves_and_comes_back_or_is_remade_is_made_ready_again() {
        let mut ahead = Ahead::default();
        ahead.learn(&link(2, "bridge", None));
        assert!(ahead.wants(&link(10, "veth", Some(2))));
        assert!(
            !ahead.wants(&link(10, "veth", None)),
            "taken off the bridge"
        );
        assert!(ahead.wants(&link(10, "veth", Some(2))), "back on it");
        ahead.gone(10);
        assert!(
            ahead.wants(&link(10, "veth", Some(2))),
            "a new device, same index"
        );
    }

    #[test]
    fn the_ports_a_bridge_has_when_it_is_learned_are_live_and_left_alone() {
        let mut ahead = Ahead::default();
        let uplink = link(10, "veth", Some(2));
        let running_pod = link(11, "veth", Some(2));
        let elsewhere = link(12, "veth", Some(3));
        ahead.learn(&link(2, "bridge", None));
        assert_eq!(
            ahead.found(&[uplink.clone(), running_pod.clone(), elsewhere.clone()]),
            2,
            "the served bridge's two ports"
        );
        assert!(!ahead.wants(&uplink), "the uplink carries traffic");
        assert!(
            !ahead.wants(&running_pod),
            "nor is a running pod's port touched"
        );
        assert!(ahead.wants(&link(13, "veth", Some(2))), "enslaved since");
        assert_eq!(
            ahead.found(&[uplink.clone(), link(13, "veth", Some(2))]),
            0,
            "after missed events, a port made ready stays so and a live one is noted once"
        );
        assert!(
            !ahead.wants(&link(11, "veth", None)),
            "taken off the bridge"
        );
        assert!(
            ahead.wants(&running_pod),
            "enslaved again: a fresh port, made ready"
        );
        ahead.gone(10);
        assert!(
            ahead.wants(&uplink),
            "a new device with a deleted live port's index"
        );
    }

    #[test]
    fn a_found_port_that_got_its_qdisc_at_its_add_counts_as_made_ready_until_it_leaves() {
        let mut ahead = Ahead::default();
        let port = link(10, "veth", Some(2));
        assert!(
            !ahead.had_made(10, Some(2)),
            "its bridge is not served: nothing is kept of it"
        );
        assert!(ahead.learn(&link(2, "bridge", None)));
        assert_eq!(ahead.found(std::slice::from_ref(&port)), 1);
        assert!(!ahead.is_marked(10), "live when the bridge was learned");
        assert!(!ahead.had_made(10, Some(3)), "a port of another bridge");
        assert!(ahead.had_made(10, Some(2)));
        assert!(ahead.is_marked(10));
        // Its link changes (carrier, up) keep it so: no second qdisc to make.
        assert!(!ahead.wants(&port));
        assert!(ahead.is_marked(10));
        // Off the bridge, it is forgotten.
        assert!(!ahead.wants(&link(10, "veth", None)));
        assert!(!ahead.is_marked(10));
        // A deleted port too.
        assert!(ahead.had_made(10, Some(2)));
        ahead.gone(10);
        assert!(!ahead.is_marked(10));
    }

    #[test]
    fn bridges_whose_ports_cannot_be_listed_are_served_no_more() {
        let mut ahead = Ahead::default();
        ahead.learn(&link(2, "bridge", None));
        ahead.forget_bridges();
        assert!(!ahead.wants(&link(10, "veth", Some(2))), "maybe live");
        assert!(ahead.learn(&link(2, "bridge", None)), "learned again");
    }

    #[test]
    fn a_deleted_bridge_is_no_longer_served() {
        let mut ahead = Ahead::default();
        ahead.learn(&link(2, "bridge", None));
        ahead.gone(2);
        assert!(!ahead.wants(&link(10, "veth", Some(2))));
        assert!(ahead.learn(&link(2, "bridge", None)), "learned again");
    }
}
