//! Per-lease link I/O: the raw-socket sender and, when the eBPF path is not
//! used for this interface, the filtered `AF_PACKET` receiver — both opened
//! inside the target namespace ([`crate::datapath::rawsock`],
//! [`crate::datapath::afpacket`]).

use std::os::fd::{AsRawFd as _, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, mpsc};

use tracing::{debug, info};
use xdhcp_engine::{Ipv4Prefix, Transmit};

use crate::datapath::RxFrame;
use crate::datapath::afpacket::AfPacketReceiver;
use crate::datapath::rawsock::{
    LinkInfo, LinkRemovalWatch, RawSender, RawSockError, is_gone_errno, link_info_on,
};
use crate::netlink::PeerLookup;
use crate::sys::netns::run_switched_holding;

/// Failure opening or using a link.
pub(crate) type LinkError = RawSockError;

/// What one trip into the namespace opens for a link.
struct Opened {
    /// The query socket, kept when the trip brought the interface up (for
    /// [`Link::settle`]).
    raised: Option<std::os::fd::OwnedFd>,
    info: LinkInfo,
    tx: Option<RawSender>,
    rx: Option<AfPacketReceiver>,
    watch: Option<LinkRemovalWatch>,
    veth_peer: PeerLookup,
    /// The prefixes the lease must not reroute, when the trip looked.
    protected: Option<Vec<Ipv4Prefix>>,
    clock: TripClock,
    /// The DHCPv6 client socket ([`Sockets::Udp6`]).
    udp6: Option<std::os::fd::OwnedFd>,
}

/// Where a trip's time went, µs per step (logged with "link opened").
#[derive(Debug, Default)]
struct TripClock {
    last: Option<std::time::Instant>,
    up: u64,
    watch: u64,
    sender: u64,
    receiver: u64,
    routes: u64,
    peer: u64,
}

impl TripClock {
    fn new() -> Self {
        Self {
            last: Some(std::time::Instant::now()),
            ..Self::default()
        }
    }

    /// µs since the previous lap.
    fn lap(&mut self) -> u64 {
        let now = std::time::Instant::now();
        let since = self.last.map_or(0, |l| now.duration_since(l).as_micros());
        self.last = Some(now);
        u64::try_from(since).unwrap_or(u64::MAX)
    }
}

/// Which packet sockets [`Link::open`] opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sockets {
    /// The sender only (replies come from the ring buffer).
    Sender,
    /// The sender and the `AF_PACKET` receiver.
    SenderAndReceiver,
    /// None yet: a resumed lease with nothing to send; each is opened
    /// before its first transmit.
    Later,
    /// No packet socket and no removal watch: the `DHCPv6` client's UDP
    /// socket, bound to `[::]:546` on the interface
    /// ([`crate::datapath::udp6`]), made in the same trip
    /// ([`Link::take_udp6`]).
    Udp6,
    /// A dual-stack attachment's: the sender and the receiver of
    /// [`Sockets::SenderAndReceiver`], and the `DHCPv6` client socket of
    /// [`Sockets::Udp6`], all from one trip (the `DHCPv6` exchange then
    /// makes none of its own beside the DHCPv4 one).
    Dual,
}

/// The sender for one interface, plus (`AF_PACKET` fallback) its receiver.
///
/// Both are packet sockets, and closing a packet socket waits for an RCU
/// grace period (`packet_release` -> `synchronize_net`, 5-30 ms). Dropping a
/// link (DEL, interface gone) or its receiver (capture moved to eBPF)
/// therefore hands the sockets to [`close_later`] instead of blocking the
/// async worker that runs the lease task.
#[derive(Debug)]
pub(crate) struct Link {
    pub ifname: String,
    pub netns: Option<PathBuf>,
    pub info: LinkInfo,
    /// The hardware address the DHCP client uses (`chaddr`): the
    /// interface's, or a VM's. The receiver takes only replies for it.
    client_mac: [u8; 6],
    /// The sender. Closed while a held lease has nothing to send (see
    /// [`Link::idle_tx`]) and opened again before the next transmit.
    tx: Option<RawSender>,
    /// The Ethernet source the sender uses (the interface's, or a VM's).
    src_mac: [u8; 6],
    rx: Option<AfPacketReceiver>,
    /// Interface-removal notifications (pod namespaces only).
    watch: Option<LinkRemovalWatch>,
    /// The namespace, held open: sockets are opened again in it (an idle
    /// lease's sender, the RELEASE of an ADD given up) even once its path
    /// is gone, as a runtime removes the sandbox's path before the DEL.
    ns_handle: Option<std::fs::File>,
    watch_failed: AtomicBool,
    /// The veth peer, when the open was asked to look (for the DHCP guard,
    /// which then needs no trip into the namespace of its own).
    veth_peer: PeerLookup,
    /// What the lease must not reroute in the namespace (the routes and
    /// networks of its other interfaces), when the open was asked to look:
    /// read in the same trip, so the acquisition needs none of its own
    /// before its first DISCOVER.
    protected: Option<Vec<Ipv4Prefix>>,
    /// When the open brought the interface up: what [`Link::settle`]
    /// waits for.
    raised: Option<Raised>,
    /// Set while the interface's host port is being made ready for the
    /// DHCP guard ([`Link::hold_first_send`]): [`Link::settle`] waits for it.
    port_gate: Option<PortGate>,
    /// With [`Sockets::Udp6`]: the `DHCPv6` client socket made in the
    /// trip, until taken.
    udp6: Option<std::os::fd::OwnedFd>,
}

/// The promise, held by whoever puts the DHCP guard on a link's host
/// port, that the port's `clsact` qdisc exists; the link's first frame
/// waits for it ([`Link::hold_first_send`]). Kept or dropped, either way
/// the frame goes.
///
/// Creating a port's first qdisc grafts it, and the kernel's
/// `qdisc_graft` deactivates the device for that moment (`dev_deactivate`:
/// its transmit queues point at `noop_qdisc`, which drops, until an RCU
/// grace period later): a frame the bridge hands the port then, on its way
/// into the pod, is lost without a word. Made before the DISCOVER leaves,
/// no reply of the exchange can arrive in that moment; the guard's filter,
/// added to the existing qdisc beside the exchange, deactivates nothing.
#[derive(Debug)]
pub(crate) struct PortPrepared(tokio::sync::watch::Sender<bool>);

impl PortPrepared {
    /// The port's qdisc is there (or cannot be made): the link may send.
    pub(crate) fn done(self) {
        self.0.send_replace(true);
    }
}

/// What a first frame waits on for [`PortPrepared`]: the link's own
/// ([`Link::settle`]), or a copy for another sender on the same port (a
/// dual-stack ADD's DHCPv6 socket, [`Link::port_gate`]).
#[derive(Debug, Clone)]
pub(crate) struct PortGate(tokio::sync::watch::Receiver<bool>);

impl PortGate {
    /// Until the promise is kept or dropped, at most [`PORT_LIMIT`];
    /// whether it came in time.
    pub(crate) async fn ready(mut self) -> bool {
        tokio::time::timeout(PORT_LIMIT, self.0.wait_for(|ready| *ready))
            .await
            .is_ok()
    }
}

/// The longest a link's first frame waits for [`PortPrepared`]: making a
/// qdisc waits for the RTNL lock, tens of milliseconds under a burst of
/// ADDs; beyond this the frame goes anyway (a reply lost to the graft
/// costs a retransmission, not the lease).
const PORT_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);

/// An interface the open brought up, until the kernel has made its far
/// end operational.
#[derive(Debug)]
struct Raised {
    /// An ioctl socket in the interface's namespace.
    sock: std::os::fd::OwnedFd,
    /// Its veth peer's index, when the peer is in the agent's namespace.
    peer: Option<u32>,
    since: std::time::Instant,
}

/// The longest [`Link::settle`] waits: the kernel's link watcher handles a
/// carrier change within a second (its rate limit), later only when the
/// RTNL lock is held that long.
const SETTLE_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);

impl Drop for Link {
    fn drop(&mut self) {
        if let Some(tx) = self.tx.take() {
            close_later(Box::new(tx));
        }
        if let Some(rx) = self.rx.take() {
            close_later(Box::new(rx));
        }
    }
}

/// Threads that take packet sockets off the queue; a fixed number, so the
/// idle thread count stays O(1) in the lease count.
const CLOSERS: usize = 2;

/// At most this many short-lived threads close one batch of queued sockets
/// at once. Each close waits for an RCU grace period, and concurrent waits
/// share grace periods: a thousand sockets closed one after another take
/// a thousand grace periods (tens of seconds), closed by this many threads
/// at once a few dozen.
const CLOSE_FANOUT: usize = 64;

type Closing = Box<dyn Send>;

/// Sockets handed to [`close_later`] and not closed yet.
static CLOSING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Close `sock` (drop it) on a background closer thread; inline if none
/// could be started.
pub(crate) fn close_later(sock: Closing) {
    static QUEUE: OnceLock<Option<Mutex<mpsc::Sender<Closing>>>> = OnceLock::new();
    let queue = QUEUE.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Closing>();
        let rx = Arc::new(Mutex::new(rx));
        let mut started = 0;
        for i in 0..CLOSERS {
            let rx = rx.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("xdhcp-close{i}"))
                .stack_size(64 * 1024)
                .spawn(move || {
                    while let Some(batch) = next_batch(&rx) {
                        close_batch(batch);
                    }
                });
            started += usize::from(spawned.is_ok());
        }
        (started > 0).then(|| Mutex::new(tx))
    });
    CLOSING.fetch_add(1, Ordering::SeqCst);
    let rejected = match queue {
        Some(q) => q
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .send(sock)
            .err()
            .map(|e| e.0),
        None => Some(sock),
    };
    if let Some(sock) = rejected {
        drop(sock);
        CLOSING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The next socket on the queue and every one queued behind it; `None`
/// once the queue is gone.
fn next_batch(rx: &Mutex<mpsc::Receiver<Closing>>) -> Option<Vec<Closing>> {
    let rx = rx.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut batch = vec![rx.recv().ok()?];
    batch.extend(rx.try_iter());
    Some(batch)
}

/// Close `batch`, spread over up to [`CLOSE_FANOUT`] threads so that their
/// grace periods overlap (inline when the batch is one socket or no thread
/// can be started).
fn close_batch(mut batch: Vec<Closing>) {
    let n = batch.len();
    let threads = n.min(CLOSE_FANOUT);
    if threads > 1 {
        let per = n.div_ceil(threads);
        std::thread::scope(|s| {
            while !batch.is_empty() {
                let chunk: Vec<Closing> = batch.split_off(batch.len().saturating_sub(per));
                let spawned = std::thread::Builder::new()
                    .stack_size(64 * 1024)
                    .spawn_scoped(s, move || drop(chunk));
                if let Err(e) = spawned {
                    debug!(error = %e, "closing sockets on this thread");
                    break;
                }
            }
        });
    }
    drop(batch);
    CLOSING.fetch_sub(n, Ordering::SeqCst);
}

/// Wait until every socket handed to [`close_later`] is closed, at most
/// `limit`. Called at shutdown: sockets left open at exit are closed by
/// the kernel one after another, a grace period each. Whether all were.
pub(crate) fn wait_closed(limit: std::time::Duration) -> bool {
    let until = std::time::Instant::now() + limit;
    while CLOSING.load(Ordering::SeqCst) > 0 {
        if std::time::Instant::now() >= until {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    true
}

impl Link {
    /// Open the sender (and, with `afpacket_rx`, the receiver) on `ifname`
    /// inside `netns` (`None`: the agent's own namespace, e.g. a VF netdev
    /// during the VFIO handoff).
    pub(crate) fn open(
        netns: Option<&Path>,
        ifname: &str,
        sockets: Sockets,
    ) -> Result<Self, LinkError> {
        Self::open_looking(netns, ifname, sockets, false)
    }

    /// [`Link::open`], and with `looking`, in the same trip into `netns`,
    /// find what an ADD needs of the namespace: the interface's veth peer
    /// for the DHCP guard ([`Link::take_veth_peer`]) and the prefixes its
    /// lease must not reroute ([`Link::take_protected`]).
    pub(crate) fn open_looking(
        netns: Option<&Path>,
        ifname: &str,
        sockets: Sockets,
        looking: bool,
    ) -> Result<Self, LinkError> {
        // The receiver registers with this runtime's reactor: one trip for
        // everything. Must be called within the runtime.
        let runtime = tokio::runtime::Handle::current();
        let begun = std::time::Instant::now();
        // `home`: the namespace the trip came from (the agent's), which the
        // veth peer lookup compares against; none without a trip.
        let work = |home: Option<BorrowedFd<'_>>| {
            open_here(ifname, netns, sockets, looking, &runtime, home)
        };
        let (opened, ns_handle) = match netns {
            // On this thread, moved in and back: the work is short and never
            // blocks, and a thread of its own cost a spawn and a cross-CPU
            // wake-up on every ADD (~0.2 ms of the ~0.4 ms trip). The
            // namespace file it entered by is held (sockets are opened
            // again in it later, even once its path is gone).
            Some(ns) => {
                let (opened, file) = run_switched_holding(ns, |home| work(Some(home)))?;
                (opened?, Some(file))
            }
            None => (work(None)?, None),
        };
        let Opened {
            raised,
            info,
            tx,
            rx,
            watch,
            veth_peer,
            protected,
            clock,
            udp6,
        } = opened;
        debug!(
            ifname,
            trip_us = begun.elapsed().as_micros(),
            up_us = clock.up,
            watch_us = clock.watch,
            sender_us = clock.sender,
            receiver_us = clock.receiver,
            routes_us = clock.routes,
            peer_us = clock.peer,
            "link opened"
        );
        Ok(Self {
            ifname: ifname.to_owned(),
            netns: netns.map(Path::to_path_buf),
            info,
            client_mac: info.mac,
            src_mac: info.mac,
            tx,
            rx,
            watch,
            ns_handle,
            watch_failed: AtomicBool::new(false),
            protected,
            raised: raised.map(|sock| Raised {
                sock,
                peer: match &veth_peer {
                    PeerLookup::Found(Ok(Some(p))) if p.in_namespace => Some(p.ifindex),
                    _ => None,
                },
                since: std::time::Instant::now(),
            }),
            veth_peer,
            port_gate: None,
            udp6,
        })
    }

    /// The `DHCPv6` client socket the trip made ([`Sockets::Udp6`],
    /// [`Sockets::Dual`]), once.
    pub(crate) fn take_udp6(&mut self) -> Option<std::os::fd::OwnedFd> {
        self.udp6.take()
    }

    /// Hold the link's first frame until the returned promise is kept or
    /// dropped (at most [`PORT_LIMIT`]): the host port's `clsact` qdisc
    /// is made meanwhile ([`PortPrepared`]).
    pub(crate) fn hold_first_send(&mut self) -> PortPrepared {
        let (tx, rx) = tokio::sync::watch::channel(false);
        self.port_gate = Some(PortGate(rx));
        PortPrepared(tx)
    }

    /// What the link's first frame waits on, for another sender on the
    /// same port to wait on too; `None` when nothing holds it.
    pub(crate) fn port_gate(&self) -> Option<PortGate> {
        self.port_gate.clone()
    }

    /// Wait, when the open brought the interface up, until the kernel has
    /// made the link operational (at most [`SETTLE_LIMIT`]): its veth peer
    /// when the open found it in the agent's namespace, else the interface
    /// itself. Bringing a veth up turns its peer's carrier on, and the
    /// kernel's link watcher handles that change later, under the RTNL
    /// lock; until then the peer's bridge port forwards nothing, so a
    /// first DISCOVER sent at once was dropped at the bridge — silently —
    /// in about a third of the ADDs of a pod handed over down, and the
    /// exchange began only at its retransmission, seconds later. Whether
    /// it became operational; `true` when the interface was up already.
    ///
    /// First, when the first frame is held ([`Link::hold_first_send`]),
    /// until the port is ready for its guard.
    pub(crate) async fn settle(&mut self) -> bool {
        if let Some(gate) = self.port_gate.take() {
            let since = std::time::Instant::now();
            let in_time = gate.ready().await;
            debug!(ifname = %self.ifname, waited_us = since.elapsed().as_micros(),
                in_time, "the host port is ready for its guard");
        }
        let Some(raised) = self.raised.take() else {
            return true;
        };
        // The peer is in the agent's namespace: this thread's.
        let here = match raised.peer {
            Some(_) => crate::sys::ifreq::socket().ok(),
            None => None,
        };
        loop {
            let running = match (&here, raised.peer) {
                (Some(sock), Some(peer)) => crate::sys::ifreq::running_index(sock, peer),
                _ => crate::sys::ifreq::running(&raised.sock, &self.ifname),
            };
            match running {
                Ok(true) => {
                    debug!(ifname = %self.ifname, peer = ?raised.peer,
                        waited_us = raised.since.elapsed().as_micros(),
                        "the link brought up is operational");
                    return true;
                }
                Ok(false) if raised.since.elapsed() < SETTLE_LIMIT => {
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                }
                Ok(false) => {
                    debug!(ifname = %self.ifname, limit = ?SETTLE_LIMIT,
                        "the link brought up is not operational yet; sending anyway");
                    return false;
                }
                // Gone or unreadable: the send says what is wrong.
                Err(e) => {
                    debug!(ifname = %self.ifname, error = %e,
                        "cannot read the flags of the link brought up");
                    return false;
                }
            }
        }
    }

    /// [`Link::take_veth_peer`] when `take`; else nothing is taken.
    pub(crate) fn take_veth_peer_if(&mut self, take: bool) -> PeerLookup {
        if take {
            self.take_veth_peer()
        } else {
            PeerLookup::NotLooked
        }
    }

    /// What [`Link::open_looking`] found of the veth peer, or made ready
    /// to ask (once).
    pub(crate) fn take_veth_peer(&mut self) -> PeerLookup {
        std::mem::replace(&mut self.veth_peer, PeerLookup::NotLooked)
    }

    /// The prefixes [`Link::open_looking`] found the lease must not
    /// reroute (once); `None` when the open did not look.
    pub(crate) fn take_protected(&mut self) -> Option<Vec<Ipv4Prefix>> {
        self.protected.take()
    }

    /// Whether the `AF_PACKET` receiver is open.
    pub(crate) fn has_rx(&self) -> bool {
        self.rx.is_some()
    }

    /// Where to open sockets again: the held namespace, else its path.
    fn reopen_path(&self) -> Option<PathBuf> {
        match &self.ns_handle {
            Some(f) => Some(PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()))),
            None => self.netns.clone(),
        }
    }

    /// Open the `AF_PACKET` receiver on a link that has none (opened
    /// without one, or its capture moved to eBPF and was lost since).
    pub(crate) async fn open_rx(&mut self) -> Result<(), LinkError> {
        if self.rx.is_none() {
            let rx = match &self.reopen_path() {
                Some(ns) => AfPacketReceiver::open_async(ns, &self.ifname).await?,
                None => AfPacketReceiver::open_here(&self.ifname)?,
            };
            rx.only_for(self.client_mac)?;
            self.rx = Some(rx);
        }
        Ok(())
    }

    /// Send frames with `mac` as the Ethernet source (a VM's MAC).
    #[must_use]
    pub(crate) fn with_src_mac(mut self, mac: [u8; 6]) -> Self {
        self.tx = self.tx.take().map(|tx| tx.with_src_mac(mac));
        self.src_mac = mac;
        if mac == self.client_mac {
            return self;
        }
        self.client_mac = mac;
        if let Some(rx) = &self.rx
            && let Err(error) = rx.only_for(mac)
        {
            // Still correct (the engine ignores other clients' replies),
            // only busier: say so and go on.
            tracing::warn!(ifname = %self.ifname, %error,
                "receiving DHCP replies for every client on this interface");
        }
        self
    }

    /// Send one engine transmit. The sender must be open
    /// ([`Link::ensure_tx`]); a closed one is an error, never a panic.
    pub(crate) fn send(&self, t: &Transmit) -> Result<(), LinkError> {
        match &self.tx {
            Some(tx) => tx.send_transmit(t),
            None => Err(LinkError::Io {
                op: "send a frame (the sender is closed)",
                ifname: self.ifname.clone(),
                netns: self.netns.clone(),
                source: std::io::Error::from_raw_os_error(libc::EBADF),
            }),
        }
    }

    /// Close the sender while the lease has nothing to send, off this
    /// thread. A bound lease sends again only at T1 (minutes to hours
    /// away); until then holding a packet socket costs its close: the
    /// kernel closes a packet socket only after an RCU grace period, and
    /// a process that dies holding a thousand of them takes that many
    /// grace periods, one after another, to exit (tens of seconds on a
    /// small node), which delays the agent's restart by as much.
    pub(crate) fn idle_tx(&mut self) {
        if let Some(tx) = self.tx.take() {
            close_later(Box::new(tx));
        }
    }

    /// Open the sender again if it was idled: one trip into the
    /// namespace. An interface that is gone, or was replaced by another
    /// under the same name (a different index), is `InterfaceGone`.
    pub(crate) async fn ensure_tx(&mut self) -> Result<(), LinkError> {
        if self.tx.is_some() {
            return Ok(());
        }
        let tx = RawSender::open_in(self.reopen_path().as_deref(), &self.ifname).await?;
        self.adopt_tx(tx)
    }

    /// [`Link::ensure_tx`] from synchronous code (the RELEASE at the end of
    /// a lease): the namespace trip blocks this thread for its duration.
    pub(crate) fn ensure_tx_blocking(&mut self) -> Result<(), LinkError> {
        if self.tx.is_some() {
            return Ok(());
        }
        let tx = match &self.reopen_path() {
            Some(ns) => RawSender::open(ns, &self.ifname)?,
            None => RawSender::open_here(&self.ifname)?,
        };
        self.adopt_tx(tx)
    }

    fn adopt_tx(&mut self, tx: RawSender) -> Result<(), LinkError> {
        if tx.info().ifindex != self.info.ifindex {
            let err = LinkError::InterfaceGone {
                ifname: self.ifname.clone(),
                netns: self.netns.clone(),
                source: std::io::Error::other(format!(
                    "the interface was replaced (index {} is now {})",
                    self.info.ifindex,
                    tx.info().ifindex
                )),
            };
            close_later(Box::new(tx));
            return Err(err);
        }
        self.tx = Some(tx.with_src_mac(self.src_mac));
        Ok(())
    }

    /// Close the `AF_PACKET` receiver (capture moved to eBPF), off this thread.
    pub(crate) fn drop_rx(&mut self) {
        if let Some(rx) = self.rx.take() {
            close_later(Box::new(rx));
        }
    }

    /// Next DHCP server→client frame from the `AF_PACKET` receiver. Pends
    /// forever when the link has none (the eBPF dispatcher delivers instead).
    ///
    /// An interface taken down (and up again) is not gone: the kernel
    /// reports `ENETDOWN` on the receiver once, and the receiver serves
    /// again when the interface is up. Only when the interface is no longer
    /// there is that an error.
    pub(crate) async fn recv(&self) -> Result<RxFrame, LinkError> {
        let Some(rx) = &self.rx else {
            return std::future::pending().await;
        };
        loop {
            match rx.recv().await {
                Err(e) if e.is_net_down() && self.still_there().await => {
                    info!(ifname = %self.ifname, netns = ?self.netns,
                        "the interface went down; its receiver waits for it to come up");
                }
                other => return other,
            }
        }
    }

    /// Whether the interface the link was opened on is still there, under
    /// its name and index (an `ENETDOWN` from one of its sockets then means
    /// it is down, not gone). One trip into its namespace, off the async
    /// workers.
    pub(crate) async fn still_there(&self) -> bool {
        let ifindex = self.info.ifindex;
        let ifname = self.ifname.clone();
        let ns = self.reopen_path();
        let looked = tokio::task::spawn_blocking(move || {
            let look = || {
                nix::net::if_::if_indextoname(ifindex)
                    .is_ok_and(|n| n.to_str().is_ok_and(|n| n == ifname))
            };
            match ns {
                Some(ns) => crate::sys::netns::run_in_netns(&ns, look).unwrap_or(false),
                None => look(),
            }
        })
        .await;
        looked.unwrap_or(false)
    }

    /// Stop watching for the interface's removal (a one-shot discovery
    /// ends at BOUND and never asks).
    pub(crate) fn drop_watch(&mut self) {
        self.watch = None;
    }

    /// Resolves once the interface is deleted (or moved out of its
    /// namespace). Pends forever when the link has no watch (opened in the
    /// agent's own namespace) or the watch failed; cancel-safe.
    pub(crate) async fn removed(&self) {
        let Some(w) = &self.watch else {
            return std::future::pending().await;
        };
        if self.watch_failed.load(Ordering::Relaxed) {
            return std::future::pending().await;
        }
        if let Err(e) = w.removed(self.info.ifindex, self.tx.as_ref()).await {
            debug!(ifname = %self.ifname, error = %e,
                "link notifications failed; interface removal is noticed at the next send");
            self.watch_failed.store(true, Ordering::Relaxed);
            std::future::pending::<()>().await;
        }
    }
}

/// What [`Link::open_looking`] does in `ifname`'s namespace (`netns`, the
/// calling thread's now): main plugins may hand the interface over still
/// down (bridge, macvlan), so it is brought up first, as the upstream dhcp
/// plugin does; then the sockets, and with `looking` what an ADD needs of
/// the namespace. `home`: the namespace the trip came from.
fn open_here(
    ifname: &str,
    netns: Option<&Path>,
    sockets: Sockets,
    looking: bool,
    runtime: &tokio::runtime::Handle,
    home: Option<BorrowedFd<'_>>,
) -> Result<Opened, LinkError> {
    let name = ifname.to_owned();
    let ns_owned = netns.map(Path::to_path_buf);
    let watched = netns.is_some();
    let mut clock = TripClock::new();
    let in_ns = |e: RawSockError| match e {
        RawSockError::InterfaceGone { ifname, source, .. } => LinkError::InterfaceGone {
            ifname,
            netns: ns_owned.clone(),
            source,
        },
        other => other,
    };
    let io_err = |op: &'static str| {
        let (name, ns) = (name.clone(), ns_owned.clone());
        move |source: std::io::Error| {
            if is_gone_errno(&source) {
                LinkError::InterfaceGone {
                    ifname: name.clone(),
                    netns: ns.clone(),
                    source,
                }
            } else {
                LinkError::Io {
                    op,
                    ifname: name.clone(),
                    netns: ns.clone(),
                    source,
                }
            }
        }
    };
    // One query socket for the flags and the link's index, MAC and
    // MTU (kept when it raised the interface, for `settle`).
    let query = crate::sys::ifreq::socket().map_err(io_err("open a query socket"))?;
    let raised =
        crate::sys::ifreq::ensure_up_on(&query, &name).map_err(io_err("bring the interface up"))?;
    clock.up = clock.lap();
    let _entered = runtime.enter();
    // Opened before the sender binds. With a sender, subscribed when the
    // lease task first waits for events (its first DISCOVER out): a
    // deletion before then shows on the sender, whose binding the kernel
    // clears ([`LinkRemovalWatch::removed`]). Without one (a resumed lease
    // opens it at its first transmit), subscribed now: a deletion after
    // this point is queued on the watch.
    let watch = if !watched || sockets == Sockets::Udp6 {
        None
    } else if sockets == Sockets::Later {
        Some(LinkRemovalWatch::open_here().map_err(io_err("subscribe to link notifications"))?)
    } else {
        Some(
            LinkRemovalWatch::unsubscribed_here()
                .map_err(io_err("open a link notification socket"))?,
        )
    };
    clock.watch = clock.lap();
    let info = link_info_on(&query, &name, ns_owned.as_deref()).map_err(in_ns)?;
    let tx = if matches!(sockets, Sockets::Later | Sockets::Udp6) {
        None
    } else {
        Some(RawSender::open_for(&name, info, ns_owned.as_deref()).map_err(in_ns)?)
    };
    clock.sender = clock.lap();
    let rx = if matches!(sockets, Sockets::SenderAndReceiver | Sockets::Dual) {
        Some(AfPacketReceiver::open_here_on(&name, info, info.mac).map_err(in_ns)?)
    } else {
        None
    };
    clock.receiver = clock.lap();
    let udp6 = if matches!(sockets, Sockets::Udp6 | Sockets::Dual) {
        Some(
            crate::datapath::udp6::bound_socket(&name, info.ifindex)
                .map_err(|(op, source)| io_err(op)(source))?,
        )
    } else {
        None
    };
    let (veth_peer, protected) = if looking {
        let (peer, protected) = look_here(&name, info.ifindex, home, &mut clock);
        (peer, Some(protected))
    } else {
        (PeerLookup::NotLooked, None)
    };
    Ok(Opened {
        raised: raised.then_some(query),
        info,
        tx,
        rx,
        watch,
        veth_peer,
        protected,
        clock,
        udp6,
    })
}

/// What an ADD needs of the calling thread's namespace besides its link
/// (`ifname`, index `ifindex`), with one route socket there: the prefixes
/// its lease must not reroute, read now (the engine needs them before its
/// first DISCOVER), and the veth peer (two round trips on the same
/// socket): the guard's port, which the first DISCOVER may wait for
/// (`Link::hold_first_send`), and, for an interface the open raised, the
/// device `settle` waits for. Asked here rather than in a blocking hop of
/// the guard's after the trip, it costs the DISCOVER no thread wake-up. A
/// failed lookup costs the guard, not the lease: carried to it. No `home`
/// (no trip): no peer.
fn look_here(
    ifname: &str,
    ifindex: u32,
    home: Option<BorrowedFd<'_>>,
    clock: &mut TripClock,
) -> (PeerLookup, Vec<Ipv4Prefix>) {
    // A namespace that cannot be read protects nothing more and says so
    // (as `lease::apply::protected_in_pod` does).
    let unread = |error: &std::io::Error| {
        tracing::warn!(ifname, %error, "could not read the pod's other routes to protect them");
        Vec::new()
    };
    let sock = match crate::netlink::route_socket_here() {
        Ok(sock) => sock,
        Err(e) => {
            let protected = unread(&e);
            let peer = match home {
                Some(_) => PeerLookup::Found(Err(e)),
                None => PeerLookup::NotLooked,
            };
            return (peer, protected);
        }
    };
    let protected =
        crate::netlink::prefixes_to_protect_on(&sock, ifindex).unwrap_or_else(|e| unread(&e));
    clock.routes = clock.lap();
    let peer = match home {
        None => PeerLookup::NotLooked,
        Some(home) => PeerLookup::Found(crate::netlink::veth_peer_on(&sock, ifname, home)),
    };
    clock.peer = clock.lap();
    (peer, protected)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread in a fresh network namespace of its own, parked until
    /// dropped: the namespace lives as long as it does.
    struct Parked {
        path: PathBuf,
        stop: Option<mpsc::Sender<()>>,
    }

    impl Parked {
        fn new() -> Self {
            let (ready_tx, ready_rx) = mpsc::channel();
            let (stop, stopped) = mpsc::channel::<()>();
            std::thread::spawn(move || {
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
                    .expect("unshare(CLONE_NEWNET) (root needed)");
                ready_tx.send(nix::unistd::gettid().as_raw()).unwrap();
                let _ = stopped.recv();
            });
            let tid = ready_rx.recv().expect("the namespace's thread died");
            Self {
                path: PathBuf::from(format!("/proc/{}/task/{tid}/ns/net", std::process::id())),
                stop: Some(stop),
            }
        }
    }

    impl Drop for Parked {
        fn drop(&mut self) {
            self.stop.take();
        }
    }

    /// The ADD's trip into a pod's namespace finds the veth peer, in the
    /// agent's namespace, whether it raised the interface or found it up.
    /// The removal watch joins its group only when first waited on, and
    /// still sees an interface deleted before then.
    #[test]
    fn the_trip_finds_the_peer_and_leaves_the_watch_unsubscribed() {
        // This test's own "node" namespace: a thread unshared from the host.
        std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
                .expect("unshare(CLONE_NEWNET) (root needed)");
            let pod = Parked::new();
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let (conn, handle, _) = rtnetlink::new_connection().unwrap();
                tokio::spawn(conn);
                handle
                    .link()
                    .add(rtnetlink::LinkVeth::new("xdt-host", "eth0").build())
                    .execute()
                    .await
                    .unwrap();
                let ns = std::fs::File::open(&pod.path).unwrap();
                handle
                    .link()
                    .set(
                        rtnetlink::LinkUnspec::new_with_name("eth0")
                            .setns_by_fd(ns.as_raw_fd())
                            .build(),
                    )
                    .execute()
                    .await
                    .unwrap();
                handle
                    .link()
                    .set(
                        rtnetlink::LinkUnspec::new_with_name("xdt-host")
                            .up()
                            .build(),
                    )
                    .execute()
                    .await
                    .unwrap();
                let host = nix::net::if_::if_nametoindex("xdt-host").unwrap();
                let want = crate::netlink::VethPeer {
                    ifindex: host,
                    in_namespace: true,
                };
                // Handed over down: the trip raises it and looks.
                let mut link =
                    Link::open_looking(Some(&pod.path), "eth0", Sockets::SenderAndReceiver, true)
                        .unwrap();
                assert!(
                    matches!(link.take_veth_peer(), PeerLookup::Found(Ok(Some(p))) if p == want)
                );
                drop(link);
                // A dual-stack attachment's trip makes both families'
                // sockets: the DHCPv6 exchange needs no trip of its own.
                let mut link =
                    Link::open_looking(Some(&pod.path), "eth0", Sockets::Dual, true).unwrap();
                assert!(link.tx.is_some(), "the DHCPv4 sender");
                assert!(link.rx.is_some(), "the DHCPv4 receiver");
                assert!(link.take_udp6().is_some(), "the DHCPv6 client socket");
                drop(link);
                // Up: the trip looks all the same.
                let mut link =
                    Link::open_looking(Some(&pod.path), "eth0", Sockets::SenderAndReceiver, true)
                        .unwrap();
                let found = link.take_veth_peer();
                assert_eq!(found.host_ifindex(), Some(host), "{found:?}");
                // Its removal watch subscribes when first waited on; a
                // deletion before that is seen on the sender.
                handle.link().del(host).execute().await.unwrap();
                tokio::time::timeout(std::time::Duration::from_secs(5), link.removed())
                    .await
                    .expect("the interface deleted before the watch subscribed is seen");
            });
        })
        .join()
        .unwrap();
    }

    #[tokio::test(flavor = "current_thread")]
    async fn missing_interface_is_gone() {
        let e = Link::open(None, "xdt-nope0", Sockets::Sender).unwrap_err();
        assert!(e.is_interface_gone(), "{e}");
    }
}
