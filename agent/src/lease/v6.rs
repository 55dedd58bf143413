//! A `DHCPv6` lease: the v6 engine ([`xdhcp_engine::v6`], one `IA_NA`
//! address) driven with tokio time against the attachment's UDP socket in
//! the pod's namespace ([`crate::datapath::udp6`]), and, where the eBPF
//! capture serves the pod's interface, the kernel path: every transaction
//! the engine opens is owned in the kernel by its transaction id and IAID,
//! and the program on the interface hands its ADVERTISEs and REPLYs over
//! the ring buffer instead of the pod's stack ([`Kernel6`]). The socket
//! stays open beside it: what the kernel does not own (a message with no
//! `IA_NA`, a transaction sent before the program was attached, a lost
//! ring) still reaches the engine through it. Its record is the
//! attachment's, with the lease in `lease6`: persisted at every lease
//! change, resumed after a restart (REBIND, the engine's default), renewed
//! at T1, and released (RELEASE) when DEL stops the task. With `"apply": true` the
//! task configures the address (and the network's gateway route) itself.
//!
//! A VM's record ([`WorkloadKind::Vm`]) runs the same engine once: the
//! discovery ends at the first binding, which the guest's own client owns
//! from then on (no renewal, no RELEASE, nothing configured; [`TaskRole`]).
//!
//! One thing: the v6 lease's acquisition, its event loop and its handlers.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, info, warn};
use xdhcp_engine::v6::{self, Client, ClientConfig, Event, State};

use crate::datapath::Rx6Frame;
use crate::datapath::capture::{Capture, CapturePath, TargetState};
use crate::datapath::ebpf::AttachTarget;
use crate::datapath::link::LinkError;
use crate::datapath::rawsock::classify;
use crate::datapath::udp6::{self, Udp6};
use crate::lease::acquire::{ADD_MARGIN, Failure, MIN_ACQUIRE_LEFT};
use crate::lease::apply::{self, Address6};
pub(crate) use crate::lease::apply::{address6, wants_router};
use crate::lease::effects::{Effect, Effects as _};
use crate::lease::live::{Command, EngineState, Exchange, ExchangeClock, Live};
use crate::lease::pacing::Pacing;
use crate::lease::persist::{Durable, LeaseRecord, WorkloadKind};
use crate::lease::registry::{Handle, Registry};
use crate::lease::router6::Routers;
use crate::lease::services::Services;
use crate::lease::task::Ended;
use crate::model::{Network, UplinkRef};
use crate::netlink::{Dad6, NetlinkError};
use crate::sys::clock::{now_unix_ms, seed};
use crate::sys::netns::run_in_or_here;
use crate::sys::sync::lock;

/// How long a stopped task waits for the server's REPLY to its RELEASE
/// before it ends anyway (within the registry's wait for a stop).
const RELEASE_WAIT: Duration = Duration::from_secs(3);

/// How long a new address's duplicate address detection is waited for:
/// the kernel's defaults take 1–2 s (a random delay below
/// `rtr_solicit_delay`, then one solicitation and `retrans_time`); an
/// interface configured for more solicitations is left to finish on its
/// own past this.
const DAD_LIMIT: Duration = Duration::from_secs(3);

/// How a maintained lease waits before soliciting again after an
/// acquisition failed with nobody waiting on it.
const REACQUIRE_DELAY: Duration = Duration::from_secs(10);

/// Captured messages queued per lease.
const FRAME_QUEUE: usize = 16;

/// How often a message the interface could not send for want of a usable
/// link-local address is tried again ([`Unsent`]) while the kernel's
/// notices of the interface's addresses are heard: a safety net for a
/// notice lost, never what decides the wait otherwise.
const UNSENT_RECHECK: Duration = Duration::from_millis(250);
/// How often it is tried again without them (their socket could not be
/// opened, or failed).
const UNSENT_RETRY: Duration = Duration::from_millis(10);
/// How long it is tried again at most: the kernel's duplicate address
/// detection with its defaults ends within 2 s; past this the engine's own
/// retransmissions go on alone.
const UNSENT_LIMIT: Duration = Duration::from_secs(3);

/// A message the pod's interface could not send because it has no usable
/// link-local address yet: a fresh interface's is tentative until the
/// kernel's duplicate address detection ends (1–2 s with its defaults), and
/// the kernel has no source to send from (`EADDRNOTAVAIL`). Left to the
/// engine, the exchange would start at its next retransmission (RFC 8415
/// §15: about 1 s, then 3 s, after the first SOLICIT), which may be seconds
/// after the address became usable; the task sends the same message again
/// the moment the kernel announces a link-local address of the interface
/// usable ([`LinkLocalWatch`]), and it goes as soon as it can. A newer
/// message replaces it.
#[derive(Debug)]
struct Unsent {
    payload: Vec<u8>,
    dst: std::net::Ipv6Addr,
    kind: v6::MessageKind,
    since: tokio::time::Instant,
}

/// Whether a send failed because the interface has no usable source
/// address yet (its link-local tentative).
fn no_source_yet(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(libc::EADDRNOTAVAIL)
}

/// A v6 lease's kernel path: its subscription to the capture of the pod's
/// interface, the channel its captured messages come on, and the
/// transaction it owns in the kernel now.
struct Kernel6 {
    capture: Arc<Capture>,
    target: AttachTarget,
    sub: watch::Receiver<TargetState>,
    tx: mpsc::Sender<Rx6Frame>,
    rx: mpsc::Receiver<Rx6Frame>,
    /// The (transaction id, IAID) registered now.
    owned: Option<(u32, u32)>,
    /// The node uplink whose program captured the latest reply, when one
    /// did (the server is behind it): the replies come from there, not
    /// from the pod's interface.
    uplink: Option<Arc<str>>,
}

impl Kernel6 {
    /// Subscribe to the capture of `ifname` in `netns`; `None` without
    /// eBPF. The program is attached in the background a little after the
    /// start, as an IPv4 lease's is: the first exchange is not disturbed by
    /// the attach (making a qdisc deactivates the device for a moment), and
    /// a burst of ADDs finishes before its RTNL-heavy attaches start. Until
    /// then the socket takes the replies.
    fn open(capture: &Arc<Capture>, netns: Option<&std::path::Path>, ifname: &str) -> Option<Self> {
        let target = AttachTarget {
            ifname: ifname.to_owned(),
            netns: netns.map(std::path::Path::to_path_buf),
        };
        let sub = capture.subscribe(&target, true)?;
        let (tx, rx) = mpsc::channel(FRAME_QUEUE);
        Some(Self {
            capture: capture.clone(),
            target,
            sub,
            tx,
            rx,
            owned: None,
            uplink: None,
        })
    }

    /// The path replies take now.
    fn path(&self) -> CapturePath {
        if let Some(u) = &self.uplink {
            return CapturePath::Uplink(u.clone());
        }
        match *self.sub.borrow() {
            TargetState::Live { mode, .. } => CapturePath::Ebpf(mode),
            _ => CapturePath::Udp6,
        }
    }

    /// A captured reply came by `frame`'s path: through a node uplink, or
    /// the pod's interface.
    fn heard(&mut self, frame: &Rx6Frame) -> CapturePath {
        self.uplink = match frame.via {
            crate::datapath::RxPath::Uplink { .. } => self.capture.uplink_name_at(frame.ifindex),
            _ => None,
        };
        self.path()
    }

    /// Own the transaction a transmission belongs to, giving up the one
    /// before. Owned from the first SOLICIT when a node uplink is live (its
    /// program may take the reply, which then never reaches the pod's
    /// stack), else once the program is live on the pod's interface; until
    /// then the replies come through the socket.
    fn own(&mut self, xid: u32, iaid: u32) {
        if self.owned == Some((xid, iaid)) {
            return;
        }
        self.disown();
        let ifindex = match *self.sub.borrow() {
            TargetState::Live { ifindex, .. } => ifindex,
            // The map's ifindex is informational: 0, any.
            _ if self.capture.owns_early() => 0,
            _ => return,
        };
        self.capture.register6(xid, iaid, self.tx.clone(), ifindex);
        self.owned = Some((xid, iaid));
    }

    fn disown(&mut self) {
        if let Some((xid, iaid)) = self.owned.take() {
            self.capture.unregister6(xid, iaid);
        }
    }

    /// The task ends: nothing owned, the subscription given back.
    fn close(&mut self) {
        self.disown();
        self.capture.unsubscribe(&self.target);
    }
}

/// The lease's client socket for `ifname` (index `ifindex`) in `netns`
/// (`None`: the agent's own):
/// `made` when the trip that opened the interface made it, else made in a
/// trip of its own — bound to `[::]:546` and to the device, multicast out
/// of it ([`crate::datapath::udp6::bound_socket`]). Must be called within a
/// tokio runtime.
async fn open_socket(
    netns: Option<&std::path::Path>,
    ifname: &str,
    ifindex: u32,
    made: Option<std::os::fd::OwnedFd>,
) -> Result<Udp6, LinkError> {
    let error = |op, source| classify(op, ifname, netns, source);
    let fd = if let Some(fd) = made {
        fd
    } else {
        let name = ifname.to_owned();
        run_in_or_here(netns, move || udp6::bound_socket(&name, ifindex))
            .await?
            .map_err(|(op, source)| error(op, source))?
    };
    Udp6::from_fd(fd, ifindex).map_err(|source| error("register the DHCPv6 socket", source))
}

/// The first record's write ended ([`Task6::write_first`]); never while
/// none is out.
async fn written(
    w: Option<&mut tokio::task::JoinHandle<Durable>>,
) -> Option<Result<Durable, tokio::task::JoinError>> {
    match w {
        Some(w) => Some(w.await),
        None => std::future::pending().await,
    }
}

/// The next captured message; never without a kernel path.
async fn captured(kernel: Option<&mut Kernel6>) -> Option<Rx6Frame> {
    match kernel {
        Some(k) => k.rx.recv().await,
        None => std::future::pending().await,
    }
}

/// The kernel's notices of the addresses in a lease's namespace, heard
/// while a message waits for the interface's link-local address to become
/// usable ([`Unsent`]); its connection lives as long as it does.
struct LinkLocalWatch {
    _nl: crate::netlink::Netlink,
    changes: crate::netlink::Addr6Events,
    /// The notices have ended (their socket failed).
    ended: bool,
}

impl LinkLocalWatch {
    /// Hears the address changes of `netns` from now on; `None` (logged)
    /// when the socket cannot be opened: the message is then tried again
    /// every [`UNSENT_RETRY`].
    async fn open(netns: Option<&std::path::Path>) -> Option<Self> {
        match crate::netlink::Netlink::open_watching6(netns).await {
            Ok((nl, changes)) => Some(Self {
                _nl: nl,
                changes,
                ended: false,
            }),
            Err(e) => {
                debug!(error = %e, "cannot hear the interface's address changes; the held-back message is tried again on a timer");
                None
            }
        }
    }
}

/// Ready when a message waiting for a usable link-local address
/// ([`Unsent`]) should be tried again: when the kernel announces a
/// link-local address of `ifindex` out of its duplicate address detection,
/// else after [`UNSENT_RECHECK`] (every [`UNSENT_RETRY`] without notices);
/// never while nothing waits. Returns what woke it, for the log:
/// `"notice"`, `"recheck"` or `"timer"`.
async fn retry_unsent(
    waiting: bool,
    watch: Option<&mut LinkLocalWatch>,
    ifindex: u32,
) -> &'static str {
    if !waiting {
        return std::future::pending().await;
    }
    let Some(w) = watch.filter(|w| !w.ended) else {
        tokio::time::sleep(UNSENT_RETRY).await;
        return "timer";
    };
    let usable = w.changes.next_where(|c| {
        c.ifindex == ifindex
            && c.state == crate::netlink::Dad6::Unique
            && c.address.is_unicast_link_local()
    });
    tokio::select! {
        heard = usable => {
            w.ended = heard.is_none();
            "notice"
        }
        () = tokio::time::sleep(UNSENT_RECHECK) => "recheck",
    }
}

/// What an ADD waits for.
#[derive(Debug)]
pub(crate) enum Outcome6 {
    /// The lease, and where the task's time went getting it.
    Bound(v6::Lease, Exchange),
    Failed(v6::AcquireError),
    /// Bound, but `"apply": true` could not configure the address.
    ApplyFailed(Arc<NetlinkError>),
    /// The agent is shutting down.
    Cancelled,
}

/// The engine configuration of an attachment on an IPv6 network: the
/// workload's MAC (DUID-LL and IAID), the network's Rapid Commit and
/// timeout (else `default_timeout`, the agent's). The first SOLICIT is not
/// delayed by `SOL_MAX_DELAY`: an ADD waits for it, and the network's
/// pacing already spreads a burst of them.
pub(crate) fn engine_config6(
    network: &Network,
    mac: [u8; 6],
    default_timeout: Duration,
) -> ClientConfig {
    let mut cfg = ClientConfig {
        mac,
        rapid_commit: network.ipam.ipv6.is_some_and(|v| v.rapid_commit),
        acquire_timeout: Some(network.ipam.timeout.unwrap_or(default_timeout)),
        ..ClientConfig::default()
    };
    cfg.timeouts.sol_max_delay = Duration::ZERO;
    cfg
}

/// What an IPv6 acquisition is for.
#[derive(Debug)]
pub(crate) struct Acquisition6 {
    /// The attachment's record, without a lease yet.
    pub(crate) record: LeaseRecord,
    /// The pod's namespace (`None`: the agent's own, where a VF's netdev
    /// is during its driver handoff) and the interface's index there.
    pub(crate) netns: Option<PathBuf>,
    pub(crate) ifindex: u32,
    /// The interface's own MAC, which its router solicitations carry: a
    /// pod's is the record's, a VM's launcher interface has its own (the
    /// record's is the VM's, which only the DUID and IAID carry).
    pub(crate) link_mac: [u8; 6],
    /// The client socket, when the trip that opened the interface made it
    /// (`Sockets::Udp6`): no second trip into the namespace. Else opened
    /// here.
    pub(crate) sock: Option<std::os::fd::OwnedFd>,
}

/// How a v6 lease task treats its lease, from whom the record is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TaskRole {
    /// A VM's one-shot discovery: the task ends at the first binding,
    /// which it neither renews nor releases (the guest's own client owns
    /// the binding from then on).
    pub(crate) one_shot: bool,
    /// Configure the address on the interface (`"apply": true`): a pod's
    /// only. The launcher pod's interface of a VM never carries the VM's
    /// address.
    pub(crate) apply: bool,
}

impl TaskRole {
    pub(crate) fn of(record: &LeaseRecord) -> Self {
        let pod = record.workload == WorkloadKind::Pod;
        Self {
            one_shot: !pod,
            apply: pod && record.network.ipam.apply,
        }
    }
}

/// A first IPv6 lease, and where its acquisition's time went.
pub(crate) struct Acquired6 {
    pub(crate) handle: Handle,
    pub(crate) lease: v6::Lease,
    /// Waiting for one of the network's acquisition slots.
    pub(crate) slot: Duration,
    /// From the admission (the socket's trip, when the link's open had not
    /// made it; the router-advertisement socket's) to the first SOLICIT,
    /// then the ADVERTISE, the REPLY, the record and the address.
    pub(crate) exchange: Exchange,
}

impl Registry {
    /// [`Registry::acquire6_timed`] without the timings.
    pub(crate) async fn acquire6(
        self: &Arc<Self>,
        pacing: &Pacing,
        default_timeout: Duration,
        a: Acquisition6,
    ) -> Result<(Handle, v6::Lease), Failure> {
        let got = self.acquire6_timed(pacing, default_timeout, a).await?;
        Ok((got.handle, got.lease))
    }

    /// Run the v6 engine on the attachment's interface until the first
    /// lease (or failure), admitted by the network's pacing first;
    /// `default_timeout` is the agent's acquisition timeout. On failure
    /// the attachment is given up without a trace.
    pub(crate) async fn acquire6_timed(
        self: &Arc<Self>,
        pacing: &Pacing,
        default_timeout: Duration,
        a: Acquisition6,
    ) -> Result<Acquired6, Failure> {
        let rec = &a.record;
        let mut cfg = engine_config6(&rec.network, rec.mac, default_timeout);
        cfg.validate().map_err(Failure::Config6)?;
        let timeout = cfg.acquire_timeout.unwrap_or(default_timeout);
        let (slot, waited) = self.admit(pacing, &rec.network.name, timeout).await?;
        let clock = ExchangeClock::new(Instant::now());
        cfg.acquire_timeout = Some(timeout.saturating_sub(waited).max(MIN_ACQUIRE_LEFT));
        let sock = open_socket(a.netns.as_deref(), &rec.ifname, a.ifindex, a.sock)
            .await
            .map_err(|source| {
                self.metrics().failure("interface");
                Failure::Port(source)
            })?;
        let routers = if wants_router(&rec.network) {
            Routers::open(a.netns.as_deref(), &rec.ifname, a.ifindex, a.link_mac).await
        } else {
            None
        };
        let client = Client::new(cfg, Instant::now(), seed());
        let (tx, rx) = oneshot::channel();
        let handle = self.spawn6(
            a.record,
            a.netns,
            client,
            (sock, routers),
            Some((tx, clock)),
        );
        let outcome = slot
            .hold_during(tokio::time::timeout(timeout + ADD_MARGIN, rx))
            .await;
        let failure = match outcome {
            Ok(Ok(Outcome6::Bound(lease, exchange))) => {
                return Ok(Acquired6 {
                    handle,
                    lease,
                    slot: waited,
                    exchange,
                });
            }
            Ok(Ok(Outcome6::Failed(source))) => Failure::NoLease6 {
                timeout,
                source: Box::new(source),
            },
            Ok(Ok(Outcome6::Cancelled)) => Failure::Cancelled,
            Ok(Ok(Outcome6::ApplyFailed(source))) => {
                // Bound at the server: give the address back.
                self.abandon(&handle, true).await;
                return Err(Failure::Apply(source));
            }
            Ok(Err(_)) | Err(_) => {
                self.metrics().failure("acquire_no_reply");
                Failure::Silent { timeout }
            }
        };
        self.abandon(&handle, false).await;
        Err(failure)
    }

    /// Resume a persisted IPv6 attachment after a restart: the stored lease
    /// checked with a REBIND (any server confirms and extends it; one that
    /// lost it answers `NoBinding` and the address is requested again), or,
    /// without a lease, a new SOLICIT. No acquisition deadline: nobody
    /// waits, and RFC 8415 has SOLICIT go on.
    pub(crate) async fn resume6(
        self: &Arc<Self>,
        default_timeout: Duration,
        record: LeaseRecord,
        netns: PathBuf,
        ifindex: u32,
        now_unix_ms: u64,
    ) -> Result<Handle, LinkError> {
        let mut cfg = engine_config6(&record.network, record.mac, default_timeout);
        cfg.acquire_timeout = None;
        let sock = open_socket(Some(&netns), &record.ifname, ifindex, None).await?;
        let routers = if wants_router(&record.network) {
            Routers::open(Some(&netns), &record.ifname, ifindex, record.mac).await
        } else {
            None
        };
        let now = Instant::now();
        let client = match record.lease6.clone() {
            Some(l) => {
                info!(container = %record.container_id, ifname = %record.ifname, address = %l.address,
                    "resuming DHCPv6 lease with REBIND");
                Client::resume(cfg, *l, now, now_unix_ms, seed())
            }
            None => Client::new(cfg, now, seed()),
        };
        Ok(self.spawn6(record, Some(netns), client, (sock, routers), None))
    }

    fn spawn6(
        self: &Arc<Self>,
        record: LeaseRecord,
        netns: Option<PathBuf>,
        client: Client,
        (sock, routers): (Udp6, Option<Routers>),
        waiter: Option<(oneshot::Sender<Outcome6>, ExchangeClock)>,
    ) -> Handle {
        let role = TaskRole::of(&record);
        let svc = self.services();
        let (waiter, clock) = match waiter {
            Some((w, clock)) => (Some(w), clock),
            None => (None, ExchangeClock::new(Instant::now())),
        };
        // A one-shot discovery is over in a round trip or two: its socket
        // takes the replies (the kernel owns none of its transactions, so
        // none is taken before the pod's stack), and the launcher's
        // interface gets no capture program attached as the discovery ends.
        let kernel = if role.one_shot {
            None
        } else {
            Kernel6::open(&svc.capture, netns.as_deref(), &record.ifname)
        };
        let started = self.register(record, client.state().into(), CapturePath::Udp6);
        let task = Task6 {
            svc,
            client,
            sock,
            kernel,
            routers,
            live: started.handle.live.clone(),
            cmds: started.cmds,
            waiter,
            clock,
            unsent: None,
            link_local: None,
            persisted: started.persisted,
            netns,
            role,
            applied: None,
            release_lost: false,
            writing: None,
        };
        // The task's lease leaves the `xdhcp_leases` gauge when it ends.
        let (live, metrics) = (task.live.clone(), task.svc.metrics.clone());
        self.run(&started.handle, async move {
            let ended = run(task).await;
            let state = lock(&live).state;
            metrics.lease_state(Some(state.metric()), None);
            ended
        });
        started.handle
    }
}

/// Everything a v6 lease task owns.
struct Task6 {
    svc: Arc<Services>,
    client: Client,
    sock: Udp6,
    /// The kernel path, where the eBPF capture serves the interface.
    kernel: Option<Kernel6>,
    /// The link's router advertisements, when the network leaves the prefix
    /// and router to them.
    routers: Option<Routers>,
    live: Arc<Mutex<Live>>,
    cmds: mpsc::Receiver<Command>,
    waiter: Option<oneshot::Sender<Outcome6>>,
    /// Where a first acquisition's time goes, for the ADD that waits.
    clock: ExchangeClock,
    /// The last message the interface could not send yet.
    unsent: Option<Unsent>,
    /// The namespace's address changes, heard while `unsent` waits.
    link_local: Option<LinkLocalWatch>,
    persisted: watch::Sender<Durable>,
    /// The interface's namespace (`None`: the agent's own).
    netns: Option<PathBuf>,
    /// One-shot or maintained; whether it configures the address.
    role: TaskRole,
    /// What the task configured on the interface.
    applied: Option<Address6>,
    /// A RELEASE could be sent by no path: no reply will come.
    release_lost: bool,
    /// The first lease's record, still being written when its ADD was
    /// told of the lease ([`Task6::write_first`]): settled by the task's
    /// loop, and before anything else is written or the lease ends.
    writing: Option<tokio::task::JoinHandle<Durable>>,
}

/// A stop in progress: the RELEASE is out.
struct Stopping {
    ack: oneshot::Sender<()>,
    until: tokio::time::Instant,
}

impl Task6 {
    fn record(&self) -> LeaseRecord {
        lock(&self.live).record.clone()
    }

    fn ifname(&self) -> String {
        lock(&self.live).record.ifname.clone()
    }

    fn sync_state(&self) {
        let state = EngineState::V6(self.client.state());
        let mut l = lock(&self.live);
        if l.state != state {
            self.svc
                .metrics
                .lease_state(Some(l.state.metric()), Some(state.metric()));
            l.state = state;
        }
    }

    /// Send what the engine queued. A send that fails (the interface's
    /// link-local address still tentative, the link down) is a lost
    /// message: the engine retransmits it.
    async fn flush(&mut self) {
        while let Some(t) = self.client.poll_transmit() {
            debug!(kind = %t.kind, xid = t.xid, iaid = t.iaid, dst = %t.dst.address(), "DHCPv6 send");
            // Owned before it leaves: the reply may beat the send's return.
            if let Some(k) = self.kernel.as_mut() {
                k.own(t.xid, t.iaid);
                let path = k.path();
                lock(&self.live).capture = path;
            }
            match self.sock.send(&t.payload, t.dst.address()).await {
                Ok(()) => {
                    self.clock.sent6(t.kind, Instant::now());
                    self.unsent = None;
                    self.link_local = None;
                }
                Err(e) if t.kind == v6::MessageKind::Release => self.release_elsewhere(&t, &e),
                Err(e) if no_source_yet(&e) => self.hold_back(t).await,
                Err(e) => {
                    debug!(kind = %t.kind, error = %e, "DHCPv6 send failed; the engine retransmits");
                }
            }
        }
    }

    /// A message the kernel took for the lease: the path it came by noted,
    /// then the engine's.
    fn on_captured(&mut self, frame: &Rx6Frame) {
        if let Some(k) = self.kernel.as_mut() {
            let path = k.heard(frame);
            let mut l = lock(&self.live);
            l.capture = path;
            // The server is behind that uplink: the record names it (with
            // the lease's next write), so a RELEASE the pod's interface
            // cannot send goes out there, after a restart too.
            if let Some(name) = &k.uplink {
                l.record.uplink = Some(UplinkRef {
                    ifname: name.to_string(),
                    vlan: frame.headers.vlan,
                });
            }
        }
        self.client.set_wall_clock_unix_ms(now_unix_ms());
        let src = frame.headers.src_ip;
        // The frame shows who sent it: the lease records the Ethernet
        // source beside the IPv6 one (guest learning checks REPLYs
        // against them).
        let from = v6::Source::new(src, Some(frame.headers.src_mac));
        if let Err(reason) = self
            .client
            .handle_packet_from(Instant::now(), from, &frame.payload)
        {
            debug!(%src, reason = reason.label(), "captured DHCPv6 message dropped");
        }
    }

    /// Keep `t`, which the interface could not send for want of a usable
    /// link-local address, to try again ([`Unsent`]), in place of any
    /// message kept before.
    async fn hold_back(&mut self, t: v6::Transmit) {
        let since = if let Some(u) = self.unsent.take() {
            u.since
        } else {
            debug!(kind = %t.kind,
                "the interface has no usable link-local address yet (duplicate address detection): the message goes as soon as it has");
            // Heard from before the send is tried again, so the notice of
            // the address's detection ending is not missed.
            self.link_local = LinkLocalWatch::open(self.netns.as_deref()).await;
            // The detection may have ended between the failed send and the
            // subscription, its notice gone with it: tried once more now.
            if self.link_local.is_some()
                && self.sock.send(&t.payload, t.dst.address()).await.is_ok()
            {
                self.clock.sent6(t.kind, Instant::now());
                self.link_local = None;
                return;
            }
            tokio::time::Instant::now()
        };
        self.unsent = Some(Unsent {
            payload: t.payload,
            dst: t.dst.address(),
            kind: t.kind,
            since,
        });
    }

    /// Try the message the interface could not send again ([`Unsent`]):
    /// gone once sent, once it fails for another reason (the engine
    /// retransmits), or once [`UNSENT_LIMIT`] has passed.
    async fn resend(&mut self, woken: &'static str) {
        let Some(u) = self.unsent.take() else {
            return;
        };
        match self.sock.send(&u.payload, u.dst).await {
            Ok(()) => {
                self.clock.sent6(u.kind, Instant::now());
                self.link_local = None;
                info!(kind = %u.kind, waited_ms = u.since.elapsed().as_millis(), woken_by = woken,
                    "the interface's link-local address became usable: the DHCPv6 message held back went out");
            }
            Err(e) if no_source_yet(&e) && u.since.elapsed() < UNSENT_LIMIT => {
                self.unsent = Some(u);
            }
            Err(e) => {
                self.link_local = None;
                debug!(kind = %u.kind, error = %e, "DHCPv6 message still not sent; the engine retransmits");
            }
        }
    }

    /// A RELEASE the pod's interface could not send — the bridge plugin
    /// deletes the interface before the IPAM plugin's DEL — goes out of the
    /// node uplink the lease's replies came through, from the pod's MAC and
    /// its link-local address. Without one it is lost: the stop then ends
    /// without waiting for a reply ([`Task6::release_lost`]), and the
    /// server keeps the address until its valid lifetime ends.
    fn release_elsewhere(&mut self, t: &v6::Transmit, e: &std::io::Error) {
        let (uplink, mac) = {
            let l = lock(&self.live);
            (l.record.uplink.clone(), l.record.mac)
        };
        let Some(uplink) = uplink else {
            self.release_lost = true;
            self.svc.metrics.failure("release_lost");
            warn!(error = %e,
                "the pod's interface could not send the DHCPv6 RELEASE and no node uplink carried this lease: the server keeps the address until its valid lifetime ends");
            return;
        };
        match self
            .svc
            .capture
            .send6_via_uplink(&uplink.ifname, mac, uplink.vlan, &t.payload)
        {
            Ok(()) => info!(uplink = %uplink.ifname, interface_error = %e, xid = t.xid,
                "the pod's interface could not send the DHCPv6 RELEASE: released through the uplink"),
            Err(sent) => {
                self.release_lost = true;
                self.svc.metrics.failure("release_uplink");
                warn!(uplink = %uplink.ifname, interface_error = %e, error = %crate::rpc::format_chain(&sent),
                    "the DHCPv6 RELEASE could be sent neither by the pod's interface nor through the uplink");
            }
        }
    }

    /// Write the record; the first write's outcome is the ADD's. While an
    /// ADD waits, the record is in place when this returns and durable
    /// moments later (the store's syncer), as an IPv4 first lease's is:
    /// the answer needs the next agent to find it, which the page cache
    /// gives; every later write is durable before it returns. The outcome
    /// goes to `persisted` (a failure counted where it failed).
    async fn persist(&mut self) {
        self.settle_writing().await;
        let rec = Box::new(self.record());
        let effect = if self.waiter.is_some() {
            Effect::PersistVisible(rec)
        } else {
            Effect::Persist(rec)
        };
        let written = self.svc.settled(self.svc.clone().start(effect)).await;
        self.persisted.send_replace(written);
    }

    /// Start writing the first lease's record without waiting for it: the
    /// ADD, told of the lease now, writes the `pod-networks` entry while
    /// the record is written, and answers once the record is in place
    /// (it waits for [`Task6::persisted`]). For a lease the agent does not
    /// configure: one it configures goes on the interface only once the
    /// record naming it is in place.
    fn write_first(&mut self) {
        let rec = Box::new(self.record());
        self.writing = Some(self.svc.clone().start(Effect::PersistVisible(rec)));
    }

    /// What became of the first record's write ([`Task6::write_first`]),
    /// once it is done: told to the ADD waiting for it.
    fn first_written(&mut self, joined: Result<Durable, tokio::task::JoinError>) {
        self.writing = None;
        // A failed write was counted where it failed (`Services::save`,
        // or `joined` for a carrier that died).
        let written = self.svc.joined(joined);
        self.persisted.send_replace(written);
    }

    /// Wait for the first record's write, if it is still out: a record is
    /// written by one save at a time, and a lease that ends leaves its
    /// record as its last write made it.
    async fn settle_writing(&mut self) {
        if let Some(w) = self.writing.as_mut() {
            let joined = w.await;
            self.first_written(joined);
        }
    }

    /// Configure `lease` (apply), replacing what was configured before;
    /// with `dad` (an address new to the interface), after the kernel's
    /// duplicate address detection ([`apply::configure6`]). A duplicate is
    /// taken off again and not recorded as applied.
    async fn configure(&mut self, lease: &v6::Lease, dad: bool) -> Result<Dad6, Arc<NetlinkError>> {
        if !self.role.apply {
            return Ok(Dad6::Unique);
        }
        let rec = self.record();
        let want = address6(&rec.network, lease, rec.router6);
        if let Some(old) = self.applied.filter(|old| *old != want) {
            self.unconfigure_one(old).await;
        }
        let state = apply::configure6(
            self.netns.as_deref(),
            &self.ifname(),
            want,
            dad.then_some(DAD_LIMIT),
        )
        .await
        .map_err(Arc::new)?;
        if state != Dad6::Duplicate {
            self.applied = Some(want);
        }
        Ok(state)
    }

    /// Duplicate address detection found `lease`'s address held by
    /// another node: the record forgets it and the engine DECLINEs it and
    /// solicits again (an ADD waiting goes on waiting, for the next
    /// address).
    async fn declined(&mut self, lease: &v6::Lease) {
        warn!(address = %lease.address,
            "another node on the link holds the leased IPv6 address (duplicate address detection failed); declining it and soliciting again");
        self.svc.metrics.failure("dad_duplicate");
        lock(&self.live).set_lease6(None);
        self.persist().await;
        self.client.set_wall_clock_unix_ms(now_unix_ms());
        self.client.decline(Instant::now());
    }

    async fn unconfigure(&mut self) {
        if let Some(old) = self.applied.take() {
            self.unconfigure_one(old).await;
        }
    }

    async fn unconfigure_one(&self, a: Address6) {
        if let Err(e) = apply::deconfigure6(self.netns.as_deref(), &self.ifname(), a).await {
            warn!(error = %crate::rpc::format_chain(&e), address = %a.address,
                "could not take the IPv6 address off the interface");
        }
    }

    /// The first lease, or one acquired again after it was lost: its
    /// record, its address configured, the ADD waiting for it told.
    async fn on_bound(&mut self, lease: v6::Lease) -> Option<Ended> {
        let bound_at = Instant::now();
        // A first lease waits (briefly) for the advertisements that
        // give its address a prefix and router.
        if let Some(r) = self.routers.as_mut() {
            let router = r.wait_for(lease.address, &self.svc.metrics).await;
            lock(&self.live).record.router6 = router;
        }
        // Nothing goes on the interface that a restart would not
        // know of: the record naming the address is in place first.
        // An ADD's lease the agent does not configure is told to the
        // ADD while its record is written (the ADD answers once it
        // is in place).
        lock(&self.live).set_lease6(Some(lease.clone()));
        // Either way the ADD learns how the write went from `persisted`.
        if self.waiter.is_some() && !self.role.apply && !self.role.one_shot {
            self.write_first();
        } else {
            self.persist().await;
        }
        let recorded_at = Instant::now();
        let applied = match self.configure(&lease, true).await {
            Ok(Dad6::Duplicate) => {
                self.declined(&lease).await;
                return None;
            }
            Ok(Dad6::Tentative) => {
                info!(address = %lease.address, limit = ?DAD_LIMIT,
                    "the IPv6 address is still tentative; kept (the kernel goes on detecting duplicates)");
                Ok(())
            }
            Ok(_) => Ok(()),
            Err(e) => Err(e),
        };
        let rec = self.record();
        let a = address6(&rec.network, &lease, rec.router6);
        if a.prefix_len == 128 && a.gateway.is_none() {
            info!(address = %lease.address,
                "DHCPv6 lease bound as a /128 with no route: neither the network (ipam.ipv6) nor a router advertisement names a prefix or router");
        } else {
            info!(address = %lease.address, prefix_len = a.prefix_len, gateway = ?a.gateway,
                "DHCPv6 lease bound");
        }
        if let Some(w) = self.waiter.take() {
            let exchange = self.clock.bound(bound_at, recorded_at, Instant::now());
            let outcome = match applied {
                Err(e) => Outcome6::ApplyFailed(e),
                Ok(()) => Outcome6::Bound(lease, exchange),
            };
            let _ = w.send(outcome);
        }
        // A VM's discovery is done: the record stays (the entry is
        // reported from it, a restart keeps it as it is), and
        // nothing more goes on the wire for it.
        if self.role.one_shot {
            info!(
                "DHCPv6 one-shot discovery done: no renewal, no RELEASE (the guest's own client owns the binding)"
            );
            return Some(Ended::Kept);
        }
        None
    }

    /// Act on one engine event; `Some` when the task ends.
    async fn on_event(&mut self, ev: Event, stopping: &mut Option<Stopping>) -> Option<Ended> {
        match ev {
            Event::Bound(lease) => return self.on_bound(lease).await,
            Event::Renewed(lease) | Event::Changed { new: lease, .. } => {
                // Another address may sit in another advertised prefix.
                if let Some(router) = self
                    .routers
                    .as_ref()
                    .and_then(|r| r.for_address(lease.address))
                {
                    lock(&self.live).record.router6 = Some(router);
                }
                // Configured again: a resumed lease is configured by now
                // (an address already there is fine), a changed one
                // replaces the old address.
                // A new address is checked for duplicates as a first one is.
                let new = self.applied.is_none_or(|a| a.address != lease.address);
                match self.configure(&lease, new).await {
                    Ok(Dad6::Duplicate) => {
                        self.declined(&lease).await;
                        return None;
                    }
                    Ok(_) => {}
                    Err(e) => {
                        warn!(error = %crate::rpc::format_chain(&*e), "could not configure the renewed IPv6 lease");
                    }
                }
                info!(address = %lease.address, "DHCPv6 lease renewed");
                lock(&self.live).set_lease6(Some(lease));
                self.persist().await;
            }
            Event::Lost { reason } => {
                warn!(
                    reason = reason.label(),
                    "DHCPv6 lease lost; soliciting again"
                );
                self.unconfigure().await;
                lock(&self.live).set_lease6(None);
            }
            Event::Released => {
                if let Some(s) = stopping.take() {
                    let _ = s.ack.send(());
                    return Some(Ended::Kept);
                }
            }
            Event::Failed(e) => {
                if let Some(w) = self.waiter.take() {
                    let _ = w.send(Outcome6::Failed(e));
                    return Some(Ended::Kept);
                }
                warn!(error = %e, "DHCPv6 acquisition failed; trying again later");
            }
        }
        None
    }

    /// An advertisement was heard: when it changes what the held address
    /// takes (a router came or went, its prefix changed), the record and
    /// the interface follow.
    async fn on_router(&mut self) {
        let Some(lease) = self.client.lease().cloned() else {
            return;
        };
        let Some(router) = self.routers.as_ref().map(|r| r.for_address(lease.address)) else {
            return;
        };
        if lock(&self.live).record.router6 == router {
            return;
        }
        info!(address = %lease.address, prefix_len = ?router.and_then(|r| r.prefix_len),
            gateway = ?router.and_then(|r| r.gateway), "router advertisements changed the IPv6 lease's prefix or router");
        lock(&self.live).record.router6 = router;
        self.persist().await;
        if let Err(e) = self.configure(&lease, false).await {
            warn!(error = %crate::rpc::format_chain(&*e), "could not configure the IPv6 lease's new prefix or router");
        }
    }

    /// DEL: the address off the interface, then RELEASE (when asked and
    /// held); the ack once the server answered it (or gave up).
    async fn on_stop(
        &mut self,
        release: bool,
        ack: oneshot::Sender<()>,
        stopping: &mut Option<Stopping>,
    ) -> Option<Ended> {
        self.settle_writing().await;
        self.unconfigure().await;
        if release && self.client.lease().is_some() {
            self.client.set_wall_clock_unix_ms(now_unix_ms());
            self.client.release(Instant::now());
            *stopping = Some(Stopping {
                ack,
                until: tokio::time::Instant::now() + RELEASE_WAIT,
            });
            return None;
        }
        let _ = ack.send(());
        Some(Ended::Kept)
    }
}

/// The next router advertisement `routers` believe; never without them.
async fn hear(routers: Option<&mut Routers>, metrics: &crate::metrics::Metrics) {
    match routers {
        Some(r) => r.next(metrics).await,
        None => std::future::pending().await,
    }
}

/// The v6 lease's event loop; its kernel path is given back when it ends.
async fn run(mut t: Task6) -> Ended {
    let ended = run_loop(&mut t).await;
    if let Some(k) = t.kernel.as_mut() {
        k.close();
    }
    ended
}

async fn run_loop(t: &mut Task6) -> Ended {
    let mut buf = vec![0u8; 4096];
    let mut stopping: Option<Stopping> = None;
    let mut restart_at: Option<tokio::time::Instant> = None;
    loop {
        t.flush().await;
        if t.release_lost
            && let Some(s) = stopping.take()
        {
            let _ = s.ack.send(());
            return Ended::Kept;
        }
        while let Some(ev) = t.client.poll_event() {
            if let Some(end) = t.on_event(ev, &mut stopping).await {
                t.sync_state();
                return end;
            }
        }
        t.flush().await;
        t.sync_state();
        if t.client.state() == State::Failed && restart_at.is_none() {
            restart_at = Some(tokio::time::Instant::now() + REACQUIRE_DELAY);
        }
        let deadline = [
            t.client.poll_timeout().map(tokio::time::Instant::from_std),
            restart_at,
            stopping.as_ref().map(|s| s.until),
        ]
        .into_iter()
        .flatten()
        .min();
        let timer = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = t.svc.token.cancelled() => {
                if let Some(w) = t.waiter.take() {
                    let _ = w.send(Outcome6::Cancelled);
                }
                return Ended::Kept;
            }
            () = hear(t.routers.as_mut(), &t.svc.metrics) => t.on_router().await,
            woken = retry_unsent(t.unsent.is_some(), t.link_local.as_mut(), t.sock.ifindex()) => t.resend(woken).await,
            cmd = t.cmds.recv(), if stopping.is_none() => match cmd {
                Some(Command::Stop { release, ack }) => {
                    if let Some(end) = t.on_stop(release, ack, &mut stopping).await {
                        return end;
                    }
                }
                None => return Ended::Kept,
            },
            Some(frame) = captured(t.kernel.as_mut()) => t.on_captured(&frame),
            Some(joined) = written(t.writing.as_mut()) => t.first_written(joined),
            got = t.sock.recv(&mut buf) => match got {
                Ok((n, src)) => {
                    // A socket hides the Ethernet source: the lease records
                    // the IPv6 one, and keeps the MAC an earlier captured
                    // REPLY from the same sender showed.
                    t.client.set_wall_clock_unix_ms(now_unix_ms());
                    if let Err(reason) = t.client.handle_packet(Instant::now(), src, &buf[..n]) {
                        debug!(%src, reason = reason.label(), "DHCPv6 message dropped");
                    }
                }
                Err(e) => {
                    warn!(error = %e, "DHCPv6 socket receive failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            () = timer => {
                let now = tokio::time::Instant::now();
                if let Some(s) = stopping.take_if(|s| s.until <= now) {
                    // The RELEASE went unanswered: the address is not used
                    // any more either way.
                    let _ = s.ack.send(());
                    return Ended::Kept;
                }
                if restart_at.is_some_and(|r| r <= now) {
                    restart_at = None;
                    t.client.set_wall_clock_unix_ms(now_unix_ms());
                    t.client.restart(Instant::now());
                }
                t.client.set_wall_clock_unix_ms(now_unix_ms());
                t.client.handle_timeout(Instant::now());
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use xdhcp_engine::v6::ra::Router6;

    fn network(ipam: &str) -> Network {
        let c = crate::cni::config::parse(
            format!(r#"{{"cniVersion":"1.1.0","name":"v6","ipam":{ipam}}}"#).as_bytes(),
        )
        .unwrap();
        Network::from(&c)
    }

    /// A lease of `2001:db8::5` (the operations' tests start from it too).
    pub(crate) fn lease() -> v6::Lease {
        v6::Lease {
            address: "2001:db8::5".parse().unwrap(),
            iaid: 1,
            server_id: vec![0, 3, 0, 1, 2, 0, 0, 0, 0, 1],
            server_unicast: None,
            preferred_secs: 100,
            valid_secs: 200,
            t1_secs: 50,
            t2_secs: 80,
            dns_servers: vec!["2001:db8::53".parse().unwrap()],
            domain_search: vec!["example.test".into()],
            acquired_unix_ms: 1,
            server_source: None,
        }
    }

    /// Without a prefix length the address is a /128 with no route; a
    /// gateway comes only with one; the metric is the network's priority.
    /// What the network names wins over the router advertisements; without
    /// it, their prefix and router are taken (a router alone: a /128 with a
    /// route through it).
    #[test]
    fn an_address_takes_the_networks_prefix_else_the_routers() {
        let bare = network(r#"{"type":"xdhcp","family":"ipv6"}"#);
        let a = address6(&bare, &lease(), None);
        assert_eq!((a.prefix_len, a.gateway), (128, None));
        let named = network(
            r#"{"type":"xdhcp","family":"ipv6","priority":7,
                "ipv6":{"prefixLength":64,"gateway":"fe80::1"}}"#,
        );
        let a = address6(&named, &lease(), None);
        assert_eq!(a.prefix_len, 64);
        assert_eq!(a.gateway, Some("fe80::1".parse().unwrap()));
        assert_eq!(a.metric, Some(7));
        let prefix_only = network(r#"{"type":"xdhcp","family":"ipv6","ipv6":{"prefixLength":64}}"#);
        let a = address6(&prefix_only, &lease(), None);
        assert_eq!((a.prefix_len, a.gateway), (64, None));

        let advertised = Router6 {
            prefix_len: Some(48),
            gateway: Some("fe80::2".parse().unwrap()),
        };
        let a = address6(&bare, &lease(), Some(advertised));
        assert_eq!((a.prefix_len, a.gateway), (48, advertised.gateway));
        let a = address6(&named, &lease(), Some(advertised));
        assert_eq!(
            (a.prefix_len, a.gateway),
            (64, Some("fe80::1".parse().unwrap()))
        );
        let a = address6(&prefix_only, &lease(), Some(advertised));
        assert_eq!((a.prefix_len, a.gateway), (64, None));
        let router_only = Router6 {
            prefix_len: None,
            ..advertised
        };
        let a = address6(&bare, &lease(), Some(router_only));
        assert_eq!((a.prefix_len, a.gateway), (128, advertised.gateway));
        assert!(wants_router(&bare) && !wants_router(&named) && !wants_router(&prefix_only));
    }

    /// A pod's v6 task is maintained and configures its address as the
    /// network says; a VM's is a one-shot discovery that configures
    /// nothing on the launcher's interface, whatever the network says.
    #[test]
    fn a_vms_task_is_one_shot_and_configures_nothing() {
        let mut rec = crate::lease::persist::tests::record("c", None);
        assert!(rec.network.ipam.apply);
        assert!(matches!(rec.workload, WorkloadKind::Vm { .. }));
        let vm = TaskRole {
            one_shot: true,
            apply: false,
        };
        assert_eq!(TaskRole::of(&rec), vm);
        rec.workload = WorkloadKind::Pod;
        assert_eq!(
            TaskRole::of(&rec),
            TaskRole {
                one_shot: false,
                apply: true
            }
        );
        rec.network.ipam.apply = false;
        assert_eq!(
            TaskRole::of(&rec),
            TaskRole {
                one_shot: false,
                apply: false
            }
        );
    }

    /// The engine gets the workload's MAC, the network's Rapid Commit and
    /// timeout, and no `SOL_MAX_DELAY`.
    #[test]
    fn the_engine_takes_the_networks_settings() {
        let mac = [2, 0, 0, 0, 0, 9];
        let n = network(
            r#"{"type":"xdhcp","family":"ipv6","timeout":"20s","ipv6":{"rapidCommit":true}}"#,
        );
        let cfg = engine_config6(&n, mac, Duration::from_secs(30));
        assert_eq!(cfg.mac, mac);
        assert!(cfg.rapid_commit);
        assert_eq!(cfg.acquire_timeout, Some(Duration::from_secs(20)));
        assert_eq!(cfg.timeouts.sol_max_delay, Duration::ZERO);
        cfg.validate().unwrap();
        let plain = engine_config6(
            &network(r#"{"type":"xdhcp","family":"ipv6"}"#),
            mac,
            Duration::from_secs(30),
        );
        assert!(!plain.rapid_commit);
        assert_eq!(plain.acquire_timeout, Some(Duration::from_secs(30)));
    }
}
