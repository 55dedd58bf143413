//! One lease's port: where its frames go out and its replies come in.
//!
//! Behind the port lives the choice between the three receive paths — the
//! lease's own link (raw sender, `AF_PACKET` receiver), the ring buffer of
//! the per-interface program, a node uplink — and the choice of the way out
//! (the pod's link, or the uplink the lease's replies come through). The
//! lease task hands the port what the engine wants sent and takes from it
//! the replies and the changes of path; it never sees a socket, a
//! subscription or the kernel's xid ownership.
//!
//! With node uplinks live, a lease owns its xids in the kernel from its
//! first DISCOVER (sent through the uplink its network's server last
//! answered through, if any); the first reply decides its path: captured on
//! an uplink, the port moves there for good (its `AF_PACKET` receiver
//! closed, nothing ever attached in its namespace); received on its own
//! `AF_PACKET` receiver, it keeps the per-interface path.
//!
//! Without uplinks, a lease whose link has the MAC of a workload port found
//! in Open vSwitch follows that port's host-side capture (attached when the
//! port appeared, before the ADD): it owns its xids in the kernel from its
//! first DISCOVER, and nothing is attached for it, then or later.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};
use xdhcp_engine::{Destination, MessageKind, Transmit};

use crate::datapath::capture::{Capture, CapturePath, HeldPath, ServedVia, TargetState};
use crate::datapath::ebpf::AttachTarget;
use crate::datapath::link::{Link, LinkError};
use crate::datapath::{RxFrame, RxPath};
use crate::metrics::Metrics;
use crate::model::UplinkRef;
use crate::workload::MacAddr;

/// Channel depth per lease for captured frames.
const FRAME_QUEUE: usize = 32;

/// The capture-loss reason of a lease whose xid the kernel would not own
/// (`xdhcp_capture_lost_total`, `xdhcp_capture_restored_total`).
const UNOWNED: &str = "xid_unowned";

/// Who the port is for: what the capture keys on and what leaves through
/// an uplink.
#[derive(Debug, Clone)]
pub(crate) struct PortOwner {
    /// The lease's network (its CNI name): where its server is heard.
    pub(crate) network: String,
    /// The lease's MAC: frames through an uplink leave from it.
    pub(crate) mac: [u8; 6],
    /// The uplink the lease's replies came through (from its record).
    pub(crate) uplink: Option<UplinkRef>,
}

/// How the port receives replies right now.
#[derive(Debug)]
struct Receive {
    target: AttachTarget,
    /// The capture actor's word on `target`, once subscribed.
    sub: Option<watch::Receiver<TargetState>>,
    /// Set while replies come from the ring buffer (the kernel keys xid
    /// ownership by it).
    ifindex: Option<u32>,
    /// Set once the lease's replies came through this node uplink (`target`
    /// is then the uplink's).
    uplink: Option<Arc<str>>,
    /// Set while the lease follows this found port's host-side capture
    /// (`target` is then the port's).
    found: Option<Arc<str>>,
}

impl Receive {
    /// Replies from the link's own `AF_PACKET` receiver.
    fn af_packet(link: &Link) -> Self {
        Self {
            target: target_of(link),
            sub: None,
            ifindex: None,
            uplink: None,
            found: None,
        }
    }

    /// Replies from a node uplink's program (a lease resumed there).
    fn uplink(up: HeldPath) -> Self {
        Self {
            target: up.target,
            sub: Some(up.sub),
            ifindex: up.ifindex,
            uplink: Some(up.name),
            found: None,
        }
    }

    /// Replies from a found port's host-side program.
    fn found(port: HeldPath) -> Self {
        Self {
            target: port.target,
            sub: Some(port.sub),
            ifindex: port.ifindex,
            uplink: None,
            found: Some(port.name),
        }
    }

    /// Replies from the ring buffer, already attached (one-shot discovery).
    fn ebpf(link: &Link, sub: watch::Receiver<TargetState>, ifindex: u32) -> Self {
        Self {
            target: target_of(link),
            sub: Some(sub),
            ifindex: Some(ifindex),
            uplink: None,
            found: None,
        }
    }
}

/// The capture target of a link.
fn target_of(link: &Link) -> AttachTarget {
    AttachTarget {
        ifname: link.ifname.clone(),
        netns: link.netns.clone(),
    }
}

/// The xid the engine has open, and whether the kernel knows it.
#[derive(Debug, Clone, Copy)]
struct OwnedXid {
    xid: u32,
    in_kernel: bool,
}

/// Where a lease on a node uplink sends: that uplink, from the lease's MAC,
/// tagged with the VLAN its replies carried.
struct UplinkRoute {
    name: Arc<str>,
    mac: [u8; 6],
    vlan: Option<u16>,
}

/// What the port has for the lease.
#[derive(Debug)]
pub(crate) enum Input {
    /// A reply.
    Frame(RxFrame),
    /// The capture actor's word on the port changed: follow it with
    /// [`LeasePort::follow_capture`].
    CaptureChanged,
    /// The interface was deleted (netlink `RTM_DELLINK`).
    Removed,
}

/// One lease's way to the wire.
pub(crate) struct Port {
    pub(crate) link: Link,
    capture: Arc<Capture>,
    metrics: Arc<Metrics>,
    owner: PortOwner,
    rx: Receive,
    frames: mpsc::Receiver<RxFrame>,
    frames_tx: mpsc::Sender<RxFrame>,
    owned: Option<OwnedXid>,
    /// Whether a DISCOVER went out yet (only the first may take the
    /// network's uplink before the lease is on one).
    discovered: bool,
    /// The server MAC the first DISCOVER was addressed to at the Ethernet
    /// layer, while that exchange lasts (`Capture::server_mac`).
    unicast_to: Option<[u8; 6]>,
    /// The Ethernet source of the first reply on the lease's own link.
    first_reply_from: Option<[u8; 6]>,
    /// The path the lease's view shows.
    path: CapturePath,
    /// Set while the kernel would not own the lease's xid (its ownership
    /// map full, or refusing the update) though the lease is on a capture
    /// path: the programs pass its replies uncaptured, so it reads its own
    /// `AF_PACKET` receiver, until an xid registers again; holds the path
    /// to return to.
    unowned: Option<CapturePath>,
}

impl Port {
    /// The port of a lease on `link`: on the uplink its record names when
    /// this agent has it; on the ring buffer at once for a one-shot
    /// discovery (`eager`) when the program attaches; else on the link's own
    /// receiver, until the capture actor serves the interface.
    pub(crate) async fn open(
        capture: Arc<Capture>,
        metrics: Arc<Metrics>,
        mut link: Link,
        owner: PortOwner,
        eager: bool,
    ) -> Result<Self, LinkError> {
        // A frame sent before the interface the open brought up is
        // operational is dropped without a word: wait for it first.
        link.settle().await;
        let target = target_of(&link);
        // The host side of the link's port, captured since the port
        // appeared in Open vSwitch (a one-shot discovery takes it only
        // once attached: it must capture from its first frame). Not for a
        // lease resumed on its uplink.
        let on_uplink = !eager && owner.uplink.is_some();
        let found = (!on_uplink)
            .then(|| capture.follow_found_port(link.info.mac, &owner.network, eager))
            .flatten();
        let now = if found.is_none() && eager && capture.has_ebpf() {
            capture.subscribe_now(&target).await
        } else {
            None
        };
        // A maintained lease resumed from a record that names one of this
        // agent's uplinks follows it from the start: no receiver of its
        // own, no per-interface capture (its renewals' replies come there).
        let resumed = (!eager)
            .then_some(owner.uplink.as_ref())
            .flatten()
            .and_then(|u| capture.resume_on_uplink(&u.ifname));
        let (rx, path) = if let Some(port) = found {
            link.drop_rx();
            let path = match port.ifindex {
                Some(_) => CapturePath::Port(port.name.clone()),
                None => CapturePath::AfPacketPending,
            };
            (Receive::found(port), path)
        } else if let Some(up) = resumed {
            link.drop_rx();
            // Its network's server answered there: a fresh pod of the
            // network sends its first DISCOVER there too.
            capture.note_served(
                &owner.network,
                Some(ServedVia {
                    uplink: up.name.clone(),
                    vlan: owner.uplink.as_ref().and_then(|u| u.vlan),
                }),
            );
            let path = match up.ifindex {
                Some(_) => CapturePath::Uplink(up.name.clone()),
                None => CapturePath::AfPacketPending,
            };
            (Receive::uplink(up), path)
        } else if let Some((sub, ifindex, mode)) = now {
            link.drop_rx();
            (Receive::ebpf(&link, sub, ifindex), CapturePath::Ebpf(mode))
        } else {
            link.open_rx().await?;
            let path = if capture.has_ebpf() && !eager {
                CapturePath::AfPacketPending
            } else {
                CapturePath::AfPacket
            };
            (Receive::af_packet(&link), path)
        };
        debug!(ifname = %link.ifname, %path, "capture ready");
        let (frames_tx, frames) = mpsc::channel(FRAME_QUEUE);
        Ok(Self {
            link,
            capture,
            metrics,
            owner,
            rx,
            frames,
            frames_tx,
            owned: None,
            discovered: false,
            unicast_to: None,
            first_reply_from: None,
            path,
            unowned: None,
        })
    }

    /// After asking the kernel to own the lease's xid on its capture path:
    /// when it did not (`owned` false), the lease falls back to its own
    /// `AF_PACKET` receiver (opened before the frame goes out), logged and
    /// counted as a capture loss; when it does again, the receiver closes
    /// and the lease is back on its path.
    async fn follow_ownership(&mut self, owned: bool) -> Result<(), LinkError> {
        match (owned, self.unowned.is_some()) {
            (false, false) => {
                if !self.link.has_rx() {
                    self.link.open_rx().await?;
                }
                self.metrics.capture_lost(UNOWNED);
                self.metrics.capture_fallback();
                warn!(path = %self.path,
                    "the kernel would not own this lease's xid (its replies pass the eBPF capture); the lease uses its own AF_PACKET receiver until an xid registers again");
                self.unowned = Some(std::mem::replace(
                    &mut self.path,
                    CapturePath::AfPacketFallback,
                ));
            }
            (true, true) => {
                self.link.drop_rx();
                self.metrics.capture_restored(UNOWNED);
                if let Some(path) = self.unowned.take() {
                    info!(%path, "xid owned in the kernel again; the lease is back on its capture path");
                    self.path = path;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Follow the capture actor's word on this interface: move to the ring
    /// buffer when it serves the interface, back to the link's own
    /// `AF_PACKET` receiver when it does not (never attached, refused, or
    /// lost). The new path, when it changed.
    async fn converge(&mut self) -> Result<Option<CapturePath>, LinkError> {
        let Some(sub) = self.rx.sub.as_mut() else {
            return Ok(None);
        };
        let state = *sub.borrow_and_update();
        let path = match state {
            TargetState::Live { ifindex, mode } => {
                if self.rx.ifindex == Some(ifindex) {
                    return Ok(None);
                }
                let was_fallback = self.path == CapturePath::AfPacketFallback;
                self.rx.ifindex = Some(ifindex);
                let owned = self.owned.is_none_or(|o| {
                    self.capture
                        .register(o.xid, self.frames_tx.clone(), Some(ifindex))
                });
                let live = match (&self.rx.uplink, &self.rx.found) {
                    (Some(name), _) => CapturePath::Uplink(name.clone()),
                    (None, Some(port)) => CapturePath::Port(port.clone()),
                    (None, None) => CapturePath::Ebpf(mode),
                };
                if owned {
                    self.link.drop_rx();
                    if self.unowned.take().is_some() {
                        self.metrics.capture_restored(UNOWNED);
                    }
                    if was_fallback {
                        info!(%mode, "capture back on the eBPF ring buffer");
                    } else {
                        debug!(%mode, "capture switched to eBPF");
                    }
                    live
                } else {
                    // Its open exchange's replies pass the program: keep
                    // reading them here until an xid registers.
                    if self.unowned.is_none() {
                        self.metrics.capture_lost(UNOWNED);
                        self.metrics.capture_fallback();
                        warn!(%live,
                            "the kernel would not own this lease's xid (its replies pass the eBPF capture); the lease keeps its own AF_PACKET receiver until an xid registers");
                    }
                    self.unowned = Some(live);
                    CapturePath::AfPacketFallback
                }
            }
            TargetState::Pending => CapturePath::AfPacketPending,
            TargetState::Refused => CapturePath::AfPacket,
            TargetState::Lost => {
                self.unowned = None;
                let was_ebpf = self.rx.ifindex.take().is_some();
                if let Err(e) = self.link.open_rx().await {
                    warn!(error = %e, "cannot open the AF_PACKET fallback receiver");
                    return Err(e);
                }
                if was_ebpf {
                    self.metrics.capture_fallback();
                    warn!(
                        "eBPF capture lost on this interface; the lease uses its own AF_PACKET receiver"
                    );
                }
                CapturePath::AfPacketFallback
            }
        };
        self.path = path.clone();
        Ok(Some(path))
    }

    /// Take over `xid`, the transaction a previous agent had open for this
    /// lease (`Client::adopted`): its replies are routed here, and it stays
    /// owned in the kernel (it is already, from that agent), before this
    /// lease sends anything.
    pub(crate) fn adopt(&mut self, xid: u32) {
        self.release_xid();
        let kernel = self.rx.ifindex.unwrap_or(0);
        self.capture
            .register(xid, self.frames_tx.clone(), Some(kernel));
        self.owned = Some(OwnedXid {
            xid,
            in_kernel: true,
        });
    }

    /// `t` as it leaves through the pod's own link: the first DISCOVER of
    /// a fresh acquisition addressed to its network's server at the
    /// Ethernet layer, when one bound the network's latest lease on a
    /// pod's link (`Capture::server_mac`), and the REQUEST for that
    /// server's OFFER likewise; the IP destination stays the broadcast one.
    /// A DISCOVER sent again with no reply heard since broadcasts, and
    /// the network forgets that MAC.
    fn addressed(&mut self, t: Transmit, first_discover: bool) -> Transmit {
        let broadcast = t.dst == Destination::Broadcast;
        let to = match t.kind {
            MessageKind::Discover if first_discover => {
                self.unicast_to = self.capture.server_mac(&self.owner.network);
                self.unicast_to
            }
            MessageKind::Discover => {
                if let Some(mac) = self.unicast_to.take()
                    && self.first_reply_from.is_none()
                {
                    debug!(server_mac = %MacAddr(mac),
                        "no reply to the DISCOVER sent to the network's server; broadcasting");
                    self.capture.forget_server_mac(&self.owner.network, mac);
                }
                None
            }
            // The REQUEST for the OFFER of the server the DISCOVER went to
            // (only it heard the DISCOVER, so no other server's OFFER waits
            // for the REQUEST to learn it was not chosen).
            MessageKind::Request => self
                .unicast_to
                .take()
                .filter(|mac| self.first_reply_from == Some(*mac)),
            _ => None,
        };
        match to {
            Some(mac) if broadcast => {
                debug!(kind = ?t.kind, server_mac = %MacAddr(mac), "sent to the network's server's MAC");
                Transmit {
                    dst: Destination::Unicast {
                        ip: std::net::Ipv4Addr::BROADCAST,
                        mac: Some(mac),
                    },
                    ..t
                }
            }
            _ => t,
        }
    }

    /// The port's [`UplinkRoute`] while its replies come through a live
    /// uplink.
    fn uplink_route(&self) -> Option<UplinkRoute> {
        self.rx.ifindex?;
        let name = self.rx.uplink.clone()?;
        let vlan = self.owner.uplink.as_ref()?.vlan;
        Some(UplinkRoute {
            name,
            mac: self.owner.mac,
            vlan,
        })
    }

    /// The route of a fresh lease's first DISCOVER: its network's uplink,
    /// from the lease's MAC (see `Capture::discover_route`).
    fn discover_route(&self) -> Option<UplinkRoute> {
        let via = self.capture.discover_route(&self.owner.network)?;
        debug!(uplink = %via.uplink, vlan = ?via.vlan, "first DISCOVER through the network's uplink");
        Some(UplinkRoute {
            name: via.uplink,
            mac: self.owner.mac,
            vlan: via.vlan,
        })
    }

    /// Send `t` through the uplink of `route` (see
    /// `Capture::send_via_uplink`); whether it went. When not, the caller
    /// sends through the pod's own link.
    fn sent_via_uplink(&self, route: Option<&UplinkRoute>, t: &Transmit) -> bool {
        let Some(r) = route else {
            return false;
        };
        match self.capture.send_via_uplink(&r.name, r.mac, r.vlan, t) {
            Ok(()) => true,
            Err(e) => {
                debug!(uplink = %r.name, error = %e, "not sent through the uplink; through the pod's link instead");
                false
            }
        }
    }
}

/// What a lease task needs of its way to the wire: [`Port`] on a node, a
/// fake in the lease task's unit tests. The lease task drives the engine
/// against it and knows nothing of sockets, rings or uplinks.
pub(crate) trait LeasePort: Send + Sync + 'static {
    /// The lease's interface, and its network namespace (`None`: the
    /// agent's own), where `"apply": true` configures the address.
    fn ifname(&self) -> &str;
    fn netns(&self) -> Option<&Path>;
    /// Stop watching for the interface's removal (a one-shot discovery).
    fn drop_watch(&mut self);
    /// Bound with nothing to send until T1: hold no packet socket.
    fn idle_tx(&mut self);
    /// The path the lease's replies come by now.
    fn path(&self) -> &CapturePath;
    /// Ask for the ring buffer (a held lease): the path it moved to, if any.
    fn take_ring(&mut self) -> impl Future<Output = Result<Option<CapturePath>, LinkError>> + Send;
    /// The next reply, capture notice or removal (cancel-safe).
    fn next(&mut self) -> impl Future<Output = Result<Input, LinkError>> + Send;
    /// After [`Input::CaptureChanged`]: move to whichever receive path the
    /// capture actor now offers; the path it moved to, if it moved. Not
    /// cancel-safe: await it to its end.
    fn follow_capture(
        &mut self,
    ) -> impl Future<Output = Result<Option<CapturePath>, LinkError>> + Send;
    /// A reply arrived: the uplink the lease moved onto, the first time.
    fn on_reply(&mut self, f: &RxFrame) -> Option<UplinkRef>;
    /// Reply `f` bound the lease (the engine accepted it).
    fn bound_by(&mut self, _f: &RxFrame) {}
    /// Send what the engine has to send.
    fn send(&mut self, out: Vec<Transmit>) -> impl Future<Output = Result<(), LinkError>> + Send;
    /// Send an ending lease's RELEASE, by whatever way is left.
    fn send_release(&mut self, t: &Transmit) -> Result<(), LinkError>;
    /// The engine expects no reply: let its xid go.
    fn release_xid(&mut self);
    /// The lease ends.
    fn close(&mut self);
}

impl LeasePort for Port {
    fn ifname(&self) -> &str {
        &self.link.ifname
    }

    fn netns(&self) -> Option<&Path> {
        self.link.netns.as_deref()
    }

    fn drop_watch(&mut self) {
        self.link.drop_watch();
    }

    fn idle_tx(&mut self) {
        self.link.idle_tx();
    }

    /// The path the lease's replies come by now.
    fn path(&self) -> &CapturePath {
        &self.path
    }

    /// Ask for the ring buffer (a held lease; one resumed on its uplink
    /// follows that already): the path it moved to, if it moved.
    async fn take_ring(&mut self) -> Result<Option<CapturePath>, LinkError> {
        if self.rx.sub.is_some() {
            return Ok(None);
        }
        self.rx.sub = self.capture.subscribe(&self.rx.target, true);
        self.converge().await
    }

    /// The next reply, capture notice or removal. Cancel-safe: it only
    /// waits (a notice is followed by [`LeasePort::follow_capture`], outside
    /// the caller's `select!`), so nothing is lost when another branch wins.
    async fn next(&mut self) -> Result<Input, LinkError> {
        enum Woke {
            Frame(RxFrame),
            Removed,
            Changed,
        }
        let woke = {
            let Self {
                link, rx, frames, ..
            } = self;
            let changed = async {
                match rx.sub.as_mut() {
                    Some(s) => {
                        if s.changed().await.is_err() {
                            // The capture actor dropped the target: nothing
                            // more will change.
                            std::future::pending::<()>().await;
                        }
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                // The port holds a sender: the channel never closes.
                Some(f) = frames.recv() => Woke::Frame(f),
                got = link.recv() => Woke::Frame(got?),
                () = link.removed() => Woke::Removed,
                () = changed => Woke::Changed,
            }
        };
        Ok(match woke {
            Woke::Frame(f) => Input::Frame(f),
            Woke::Removed => Input::Removed,
            Woke::Changed => Input::CaptureChanged,
        })
    }

    async fn follow_capture(&mut self) -> Result<Option<CapturePath>, LinkError> {
        self.converge().await
    }

    /// A lease bound by a reply on its own link (no uplink on the way):
    /// its Ethernet source is where the network's next first DISCOVER is
    /// addressed (`Capture::server_mac`).
    fn bound_by(&mut self, f: &RxFrame) {
        if !matches!(f.via, RxPath::Uplink { .. }) {
            self.capture
                .note_server_mac(&self.owner.network, f.headers.src_mac);
        }
    }

    /// A reply arrived: note where the network's server was heard and, when
    /// it came through a node uplink, move the port there for good (its own
    /// receiver closed, any per-interface subscription given up). The
    /// uplink, the first time, for the lease's record.
    fn on_reply(&mut self, f: &RxFrame) -> Option<UplinkRef> {
        if !matches!(f.via, RxPath::Uplink { .. }) {
            self.first_reply_from.get_or_insert(f.headers.src_mac);
            if let (RxPath::Ebpf { .. }, Some(port)) = (&f.via, &self.rx.found) {
                self.capture.found_reply(port);
            }
            self.capture.note_served(&self.owner.network, None);
            return None;
        }
        if self.rx.uplink.is_some() {
            return None;
        }
        let up = self.capture.adopt_uplink(f.ifindex)?;
        if self.rx.sub.take().is_some() {
            self.capture.unsubscribe(&self.rx.target);
        }
        info!(uplink = %up.name, "replies arrive through the uplink; no per-interface capture");
        let name = up.name.clone();
        self.rx = Receive::uplink(up);
        self.link.drop_rx();
        self.path = CapturePath::Uplink(name.clone());
        let uplink = UplinkRef {
            ifname: name.to_string(),
            vlan: f.headers.vlan,
        };
        self.owner.uplink = Some(uplink.clone());
        self.capture.note_served(
            &self.owner.network,
            Some(ServedVia {
                uplink: name,
                vlan: f.headers.vlan,
            }),
        );
        Some(uplink)
    }

    /// Send what the engine has to send, owning each new xid first (in the
    /// kernel too, where the ring buffer or an uplink captures).
    async fn send(&mut self, out: Vec<Transmit>) -> Result<(), LinkError> {
        if out.is_empty() {
            return Ok(());
        }
        let route = self.uplink_route();
        // Not on the ring buffer (yet): replies come to the link's own
        // receiver, opened now if the lease was resumed without one.
        if self.rx.ifindex.is_none() && !self.link.has_rx() {
            self.link.open_rx().await?;
        }
        for t in out {
            // Before the lease is on an uplink, its first DISCOVER takes the
            // one its network's server was last heard through.
            let first_discover = t.kind == MessageKind::Discover && !self.discovered;
            let first = if route.is_none() && first_discover {
                self.discovered = true;
                self.discover_route()
            } else {
                None
            };
            let route = route.as_ref().or(first.as_ref());
            let t = if route.is_none() {
                self.addressed(t, first_discover)
            } else {
                t
            };
            if self.owned.map(|o| o.xid) != Some(t.xid) {
                self.release_xid();
                // On the ring buffer, the kernel owns the xid; with an uplink
                // live, also before any path is known (0: any interface).
                let kernel = self
                    .rx
                    .ifindex
                    .or_else(|| self.capture.owns_early().then_some(0));
                let owned = self.capture.register(t.xid, self.frames_tx.clone(), kernel);
                self.owned = Some(OwnedXid {
                    xid: t.xid,
                    in_kernel: kernel.is_some(),
                });
                // Off a capture path (owning early, before one is known)
                // the lease's own receiver is open anyway.
                if self.rx.ifindex.is_some() {
                    self.follow_ownership(owned).await?;
                }
            }
            debug!(xid = t.xid, kind = ?t.kind, "send");
            if self.sent_via_uplink(route, &t) {
                continue;
            }
            self.link.ensure_tx().await?;
            match self.link.send(&t) {
                Ok(()) => {}
                // A full queue on the way out (ENOBUFS: the veth peer's
                // backlog overflowed, e.g. a bridge flooding broadcasts to
                // many pods) is a lost datagram, not a broken link: the
                // engine's retransmission timer sends it again, as for a
                // frame lost on the wire.
                Err(e) if is_transient_send_error(&e) => {
                    warn!(xid = t.xid, kind = ?t.kind, error = %e,
                        "frame not sent (queue full); the retransmission timer resends it");
                }
                // The interface is down, not gone (taken down and up from
                // outside): the frame is lost, as on a cut wire, and the
                // retransmission timer sends it again.
                Err(e) if e.is_net_down() && self.link.still_there().await => {
                    warn!(xid = t.xid, kind = ?t.kind,
                        "frame not sent (the interface is down); the retransmission timer resends it");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Send the RELEASE `t` of an ending lease: through its uplink when it
    /// is on one, else through the pod's link — or, when the interface or
    /// its namespace went (before DEL, the bridge plugin's order; or after
    /// it, before the RELEASE's second copy), through the uplink its
    /// replies came by. Whether it went.
    fn send_release(&mut self, t: &Transmit) -> Result<(), LinkError> {
        self.release_xid();
        let route = self.uplink_route();
        if self.sent_via_uplink(route.as_ref(), t) {
            return Ok(());
        }
        // An idle lease's sender is closed: open it for the RELEASE.
        let attempt = self
            .link
            .ensure_tx_blocking()
            .and_then(|()| self.link.send(t));
        match (attempt, &self.owner.uplink) {
            (Err(e), Some(u)) if e.is_interface_gone() || e.is_netns_gone() => self
                .capture
                .send_via_uplink(&u.ifname, self.owner.mac, u.vlan, t),
            (other, _) => other,
        }
    }

    /// The engine expects no reply: let its xid go.
    fn release_xid(&mut self) {
        if let Some(o) = self.owned.take() {
            // Registered in the kernel then, or since (moved to the ring
            // buffer).
            let in_kernel = o.in_kernel || self.rx.ifindex.is_some();
            self.capture.unregister(o.xid, in_kernel);
        }
    }

    /// The lease ends: its xid and its subscription go. The path stays in
    /// its view (a finished one-shot discovery reports how it was
    /// captured).
    fn close(&mut self) {
        self.release_xid();
        if self.rx.sub.take().is_some() {
            self.capture.unsubscribe(&self.rx.target);
        }
    }
}

/// Whether a send failure only lost this one frame (kernel queue or memory
/// pressure) rather than the link.
pub(crate) fn is_transient_send_error(e: &LinkError) -> bool {
    matches!(
        e,
        LinkError::Io { source, .. }
            if matches!(source.raw_os_error(), Some(libc::ENOBUFS | libc::EAGAIN | libc::ENOMEM))
    )
}
