//! The capture actor: the one owner of the eBPF datapath.
//!
//! It routes captured replies to lease tasks by xid, attaches and detaches
//! the capture program per interface (in the background, off the ADD path),
//! reads the ring buffer, and watches its own health. When the ring reader
//! fails or a link is detached from under the agent, every lease that relied
//! on it is told (a per-interface `watch` channel) and falls back to its own
//! `AF_PACKET` receiver; the loss is logged, counted and reported on
//! `/readyz`; the actor then restores the path (a new reader, a new attach)
//! with backoff, and the leases return to the ring buffer.
//!
//! A full ring is such a loss too: the program passes a reply it has no
//! room to record on to the pod's stack, uncaptured, where a lease on the
//! ring buffer never hears it. The actor reads the kernel's count of those
//! every [`RING_CHECK`]; when it rises, every lease falls back and every
//! target is put in observe mode (the kernel consumes nothing, so each reply
//! reaches the leases' own receivers), until the reader has emptied the ring
//! and the count stayed still for [`RING_QUIET`].
//!
//! Without eBPF (not loaded, or `--datapath=afpacket`) the actor has nothing
//! to attach or read, and every lease keeps its `AF_PACKET` receiver.
//!
//! Node uplinks are held by the agent: given with `--uplink`, attached at
//! start for the agent's life; or the set the daemon reads from Open
//! vSwitch, which it hands over again whenever it changes
//! ([`Capture::set_uplinks`]: the new ones attached, the gone ones
//! detached). A lease whose replies are captured at an uplink (the program
//! on the uplink consumes the replies of owned xids and flags its records)
//! is moved onto the uplink — its own `AF_PACKET` receiver closed, nothing
//! attached in its namespace — and follows the uplink's state like any
//! other target's: an uplink that is dropped from the set is lost to its
//! leases, which fall back to their own receivers. An uplink that is
//! absent, or goes away, is retried as soon as the link check sees its
//! interface again.
//!
//! Without an uplink, the workload ports the daemon reads from Open vSwitch
//! (those of a DHCP network) are captured on their host side, at TC egress
//! in the agent's own namespace, from the moment they are in the database
//! ([`Capture::set_found_ports`]): the replies to the pod leave the switch
//! there on both datapaths. A lease whose link has a found port's MAC
//! follows that port's capture from its first DISCOVER — nothing is
//! attached on or after its ADD, in its namespace or elsewhere — and the
//! port's capture goes when the port leaves the database (its leases fall
//! back to their own receivers, as after any loss).
//!
//! One thing, whole: one actor with one piece of state (which interfaces
//! the program serves, and whether each still does), whose attach, health
//! and restore paths all change that state.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::datapath::ebpf::{
    AttachTarget, CaptureMode, Captured, Datapath, EventReader, Role, Xid6Ownership, XidOwnership,
};
use crate::datapath::rawsock::{RawSender, RawSockError, headers_for};
use crate::datapath::{AttachMode, Rx6Frame, RxFrame, RxPath};
use crate::metrics::{Health, Metrics, UplinkLabels};
use crate::rpc::UplinkStatus;
use crate::settings::Uplink;

/// How often attached links are checked against the kernel (a link detached
/// from outside is noticed within this).
const LINK_CHECK: Duration = Duration::from_millis(250);
/// How often kernel counters are folded into the metrics.
const KERNEL_POLL: Duration = Duration::from_secs(5);
/// How often the ring buffer's overflow counter is read: a full ring is
/// noticed within this.
const RING_CHECK: Duration = Duration::from_millis(250);
/// How long the overflow counter must stay still, with the reader caught
/// up, before leases return from a full ring.
const RING_QUIET: Duration = Duration::from_secs(2);
/// First try to reopen a failed ring reader; doubles up to [`RESTORE_MAX`].
const READER_RESTORE_FIRST: Duration = Duration::from_secs(2);
/// First try to re-attach a link detached from outside (later than a
/// reader: someone detached it, maybe on purpose, and sees it come back in
/// the log); doubles up to [`RESTORE_MAX`].
const LINK_RESTORE_FIRST: Duration = Duration::from_secs(10);
const RESTORE_MAX: Duration = Duration::from_mins(1);
/// First retry of an uplink that is absent or lost; doubles up to
/// [`UPLINK_RESTORE_MAX`]. An uplink's interface that (re)appears is
/// retried at the next link check whatever the backoff.
const UPLINK_RESTORE_FIRST: Duration = Duration::from_secs(1);
const UPLINK_RESTORE_MAX: Duration = Duration::from_secs(10);
/// When a held lease moves from `AF_PACKET` to the ring buffer: a little
/// after BOUND, spread over this window, so a burst of ADDs finishes on
/// `AF_PACKET` before the (RTNL-heavy) attaches start.
const PROMOTE_DELAY: Duration = Duration::from_millis(500);
const PROMOTE_JITTER_MS: u64 = 1500;
/// The longest a started agent waits for its resumed leases' attaches
/// before it releases the pinned links none of them claimed.
const RECONCILE_MAX: Duration = Duration::from_mins(2);
/// Records kept for the previous agent's transactions while the resumed
/// leases register (see [`Capture::recovered`]).
const HELD_MAX: usize = 4096;

/// How replies for one interface reach its leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TargetState {
    /// The background attach has not finished.
    Pending,
    /// Captured by the program attached in `mode`; `ifindex` keys the
    /// kernel's xid ownership.
    Live { ifindex: u32, mode: AttachMode },
    /// The kernel refused the attach: `AF_PACKET` for good.
    Refused,
    /// Attached once, but the path is lost (reader failed, link detached):
    /// `AF_PACKET` until it is restored.
    Lost,
}

/// Which receive path serves a lease, as `xdhcp leases`/`status` show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CapturePath {
    /// The ring buffer, captured by the program on this node uplink
    /// (nothing attached in the lease's namespace).
    Uplink(Arc<str>),
    /// The ring buffer, captured at TC egress on this host-side port, found
    /// in Open vSwitch before the lease's ADD (nothing attached in the
    /// lease's namespace).
    Port(Arc<str>),
    /// The lease's own `AF_PACKET` receiver (no eBPF, or attach refused).
    AfPacket,
    /// `AF_PACKET` while the eBPF attach runs in the background.
    AfPacketPending,
    /// `AF_PACKET` because the eBPF path was lost under the agent.
    AfPacketFallback,
    /// The ring buffer, with the program attached in this mode.
    Ebpf(AttachMode),
    /// Nothing receives (a finished one-shot discovery).
    Idle,
    /// A `DHCPv6` lease's UDP socket in the pod's namespace
    /// ([`crate::datapath::udp6`]): no capture program.
    Udp6,
}

impl fmt::Display for CapturePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CapturePath::Uplink(name) => write!(f, "uplink:{name}"),
            CapturePath::Port(name) => write!(f, "port:{name}"),
            CapturePath::AfPacket => f.write_str(AttachMode::AfPacket.as_str()),
            CapturePath::AfPacketPending => f.write_str("af-packet (ebpf pending)"),
            CapturePath::AfPacketFallback => f.write_str("af-packet (ebpf lost)"),
            CapturePath::Ebpf(mode) => f.write_str(mode.as_str()),
            CapturePath::Idle => f.write_str("-"),
            CapturePath::Udp6 => f.write_str("udp6"),
        }
    }
}

impl CapturePath {
    /// The `bound_by_path` metric label.
    pub(crate) fn metric_label(&self) -> &'static str {
        match self {
            CapturePath::Uplink(_) => "uplink",
            CapturePath::Ebpf(_) | CapturePath::Port(_) => "ebpf",
            CapturePath::AfPacket
            | CapturePath::AfPacketPending
            | CapturePath::AfPacketFallback
            | CapturePath::Idle => "af_packet",
            CapturePath::Udp6 => "udp6",
        }
    }
}

/// One attached (or attaching) interface.
struct Entry {
    users: usize,
    role: Role,
    state: watch::Sender<TargetState>,
}

/// Where the agent learnt of an uplink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UplinkSource {
    /// `--uplink`.
    Flag,
    /// A port of a provider bridge in Open vSwitch's `ovn-bridge-mappings`.
    Ovs,
}

impl UplinkSource {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            UplinkSource::Flag => "flag",
            UplinkSource::Ovs => "ovs",
        }
    }
}

/// One uplink the agent is to hold: what [`Capture::set_uplinks`] takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UplinkSpec {
    /// The interface, in the agent's own namespace.
    pub(crate) ifname: String,
    pub(crate) physnet: Option<String>,
    /// The OVS bridge it is a port of, when known.
    pub(crate) bridge: Option<String>,
    pub(crate) source: UplinkSource,
    /// The attach mode this uplink needs, over `--attach` and the
    /// per-device default (an uplink of a userspace-datapath bridge needs
    /// XDP: `ovs-vswitchd` reads it through a packet socket, which sees a
    /// frame before TC ingress runs).
    pub(crate) attach: Option<AttachMode>,
}

impl UplinkSpec {
    /// A `--uplink` flag.
    pub(crate) fn from_flag(u: &Uplink) -> Self {
        Self {
            ifname: u.ifname.clone(),
            physnet: u.physnet.clone(),
            bridge: None,
            source: UplinkSource::Flag,
            attach: None,
        }
    }
}

/// Make `held` the entries of exactly `desired`: those whose spec is no
/// longer wanted are taken out and returned first, an entry is made for
/// each wanted spec not held yet and returned second (already in `held`).
/// Entries whose spec is still wanted stay as they are.
fn reconcile<S: PartialEq + Clone, E>(
    held: &mut Vec<Arc<E>>,
    desired: &[S],
    spec: impl Fn(&E) -> &S,
    make: impl Fn(S) -> E,
) -> (Vec<Arc<E>>, Vec<Arc<E>>) {
    let (kept, gone): (Vec<_>, Vec<_>) = std::mem::take(held)
        .into_iter()
        .partition(|e| desired.contains(spec(e)));
    let added: Vec<Arc<E>> = desired
        .iter()
        .filter(|d| !kept.iter().any(|e| spec(e) == *d))
        .map(|d| Arc::new(make(d.clone())))
        .collect();
    *held = kept;
    held.extend(added.iter().cloned());
    (gone, added)
}

/// A held uplink and what the agent knows of it.
struct UplinkEntry {
    spec: UplinkSpec,
    name: Arc<str>,
    target: AttachTarget,
    /// Replies captured here and delivered to a lease.
    replies: std::sync::atomic::AtomicU64,
    /// An attach was tried and failed since the interface last appeared
    /// (then the backoff applies; an interface that reappears is tried at
    /// once).
    tried: AtomicBool,
    /// The packet socket the leases that moved here send through, opened
    /// on first use, bound to the ifindex it was opened at.
    tx: Mutex<Option<Arc<RawSender>>>,
}

impl UplinkEntry {
    fn new(spec: UplinkSpec) -> Self {
        Self {
            name: Arc::from(spec.ifname.as_str()),
            target: AttachTarget {
                ifname: spec.ifname.clone(),
                netns: None,
            },
            spec,
            replies: std::sync::atomic::AtomicU64::new(0),
            tried: AtomicBool::new(false),
            tx: Mutex::new(None),
        }
    }

    /// Its labels in the `uplink_attached` metric.
    fn labels(&self) -> UplinkLabels {
        UplinkLabels {
            uplink: self.spec.ifname.clone(),
            physnet: self.spec.physnet.clone().unwrap_or_default(),
            source: self.spec.source.as_str(),
        }
    }
}

/// A workload port read from Open vSwitch whose replies the capture takes
/// on its host side: what [`Capture::set_found_ports`] takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FoundPortSpec {
    /// The port's host interface, in the agent's own namespace.
    pub(crate) ifname: String,
    /// Its `attached_mac`: the MAC of the pod's interface, by which a
    /// lease's link finds it.
    pub(crate) mac: [u8; 6],
    /// Its `k8s.ovn.org/network`, when it names one: a lease of another
    /// network never takes the port.
    pub(crate) network: Option<String>,
}

/// A found port the agent holds.
struct FoundEntry {
    spec: FoundPortSpec,
    name: Arc<str>,
    target: AttachTarget,
    /// Replies captured here and delivered to a lease.
    replies: std::sync::atomic::AtomicU64,
}

impl FoundEntry {
    fn new(spec: FoundPortSpec) -> Self {
        Self {
            name: Arc::from(spec.ifname.as_str()),
            target: AttachTarget {
                ifname: spec.ifname.clone(),
                netns: None,
            },
            spec,
            replies: std::sync::atomic::AtomicU64::new(0),
        }
    }
}

/// What the capture hands a lease that follows a target the agent holds:
/// an uplink ([`Capture::adopt_uplink`], [`Capture::resume_on_uplink`]) or
/// a found port's host side ([`Capture::follow_found_port`]).
pub(crate) struct HeldPath {
    pub(crate) name: Arc<str>,
    pub(crate) target: AttachTarget,
    pub(crate) sub: watch::Receiver<TargetState>,
    /// The target's ifindex while it is live.
    pub(crate) ifindex: Option<u32>,
}

/// The eBPF half of the actor.
struct Kernel {
    dp: Mutex<Datapath>,
    /// The xid ownership map, outside the `dp` lock: attaches hold that lock
    /// for milliseconds each, xid registration runs on the async workers.
    xids: XidOwnership,
    /// The `DHCPv6` ownership map (transaction id and IAID), likewise.
    xids6: Xid6Ownership,
    /// `--attach`, or the per-device default.
    attach: Option<AttachMode>,
    /// One attach at a time, agent-wide: they serialize on `dp` anyway, and
    /// each waiting one would hold a thread of the bounded blocking pool.
    slots: Semaphore,
    /// Whether the ring reader runs.
    reader_ok: AtomicBool,
    /// Whether the ring has had room since the reader last caught up: false
    /// from the moment the kernel counts a record it could not reserve
    /// (the reply passed on uncaptured) until the reader has emptied the
    /// ring and the counter stayed still for [`RING_QUIET`].
    ring_ok: AtomicBool,
    /// Times the reader found the ring empty (it had caught up).
    drained: std::sync::atomic::AtomicU64,
    /// The agent is stopping: the leases that stop detach nothing, so the
    /// pinned links stay for the next agent ([`Capture::keep_attached`]).
    keep_attached: AtomicBool,
    /// Until the resumed leases are registered ([`Capture::recovered`]):
    /// records the ring held for a previous agent's xids that no lease has
    /// taken yet, kept for the lease that adopts the transaction (at most
    /// [`HELD_MAX`]). `None` once recovery is over.
    held: Mutex<Option<Vec<RxFrame>>>,
    /// Injected reader failure (tests only).
    #[cfg(feature = "test-hooks")]
    reader_fault: AtomicBool,
    /// Injected reader stall: the reader reads nothing, so the ring fills
    /// (tests only).
    #[cfg(feature = "test-hooks")]
    reader_stall: AtomicBool,
}

impl Kernel {
    /// Whether the ring buffer serves leases now: its reader runs and it
    /// has room. Otherwise every target is in observe mode (the kernel
    /// consumes nothing) and leases use their own receivers.
    fn ring_serves(&self) -> bool {
        self.reader_ok.load(Ordering::SeqCst) && self.ring_ok.load(Ordering::SeqCst)
    }

    /// The capture mode every attachment takes now.
    fn capture_mode(&self) -> CaptureMode {
        if self.ring_serves() {
            CaptureMode::Intercept
        } else {
            CaptureMode::Observe
        }
    }
}

/// The capture actor's shared state.
pub(crate) struct Capture {
    kernel: Option<Kernel>,
    note: Option<String>,
    routes: Mutex<HashMap<u32, mpsc::Sender<RxFrame>>>,
    /// `DHCPv6` replies by (transaction id, IAID), both host order.
    routes6: Mutex<HashMap<(u32, u32), mpsc::Sender<Rx6Frame>>>,
    targets: Mutex<HashMap<AttachTarget, Entry>>,
    /// The held uplinks. A leaf lock: copied out ([`Capture::uplinks`]),
    /// never held while another lock is taken.
    uplinks: Mutex<Vec<Arc<UplinkEntry>>>,
    /// Uplinks whose attach failed, for the link check to retry.
    uplink_retry: Mutex<Vec<AttachTarget>>,
    /// The workload ports found in Open vSwitch whose host side is
    /// captured. A leaf lock, like `uplinks`.
    found: Mutex<Vec<Arc<FoundEntry>>>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    /// Reasons the path is degraded, by what was lost.
    lost: Mutex<HashMap<String, &'static str>>,
    /// Per network (its CNI name): the uplink, and VLAN, its latest lease's
    /// replies came through. See [`Capture::discover_route`]. Locked (as
    /// are `targets`, there) while a lease task holds its own `live` lock;
    /// the capture never takes a lease's lock.
    served: Mutex<HashMap<String, ServedVia>>,
    /// Per network: the Ethernet source of the reply that bound its latest
    /// lease on a pod's own link (no uplink on the way). See
    /// [`Capture::server_mac`]. A leaf lock.
    server_macs: Mutex<HashMap<String, [u8; 6]>>,
}

/// Where a network's server was last heard: a live uplink, tagged so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServedVia {
    pub(crate) uplink: Arc<str>,
    pub(crate) vlan: Option<u16>,
}

impl fmt::Debug for Capture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Capture")
            .field("ebpf", &self.kernel.is_some())
            .field("note", &self.note)
            .finish_non_exhaustive()
    }
}

/// What the ring reader and its restorer need at start.
pub(crate) struct Started {
    reader: Option<EventReader>,
}

impl Capture {
    fn with(
        kernel: Option<Kernel>,
        note: Option<String>,
        metrics: Arc<Metrics>,
        health: Arc<Health>,
    ) -> Self {
        Self {
            kernel,
            note,
            routes: Mutex::new(HashMap::new()),
            routes6: Mutex::new(HashMap::new()),
            targets: Mutex::new(HashMap::new()),
            uplinks: Mutex::new(Vec::new()),
            uplink_retry: Mutex::new(Vec::new()),
            found: Mutex::new(Vec::new()),
            metrics,
            health,
            lost: Mutex::new(HashMap::new()),
            served: Mutex::new(HashMap::new()),
            server_macs: Mutex::new(HashMap::new()),
        }
    }

    /// `AF_PACKET` only; `note` says why.
    pub(crate) fn af_packet(
        note: Option<String>,
        metrics: Arc<Metrics>,
        health: Arc<Health>,
    ) -> Self {
        Self::with(None, note, metrics, health)
    }

    /// The eBPF datapath `dp`, its ring reader taken. Falls back to
    /// `AF_PACKET` when the reader cannot be had.
    pub(crate) fn ebpf(
        mut dp: Datapath,
        attach: Option<AttachMode>,
        metrics: Arc<Metrics>,
        health: Arc<Health>,
    ) -> (Self, Started) {
        let reader = match dp.take_reader() {
            Ok(Some(r)) => r,
            Ok(None) => {
                let me = Self::af_packet(Some("ring buffer already taken".into()), metrics, health);
                return (me, Started { reader: None });
            }
            Err(e) => {
                warn!(error = %e, "eBPF ring buffer unavailable; falling back to AF_PACKET");
                let me = Self::af_packet(Some(format!("ring buffer: {e}")), metrics, health);
                return (me, Started { reader: None });
            }
        };
        let note = dp
            .xdp_unavailable()
            .map(|w| format!("XDP unavailable, TC only: {w}"));
        let kernel = Kernel {
            xids: dp.xid_ownership(),
            xids6: dp.xid6_ownership(),
            dp: Mutex::new(dp),
            attach,
            slots: Semaphore::new(1),
            reader_ok: AtomicBool::new(true),
            ring_ok: AtomicBool::new(true),
            drained: std::sync::atomic::AtomicU64::new(0),
            keep_attached: AtomicBool::new(false),
            held: Mutex::new(Some(Vec::new())),
            #[cfg(feature = "test-hooks")]
            reader_fault: AtomicBool::new(false),
            #[cfg(feature = "test-hooks")]
            reader_stall: AtomicBool::new(false),
        };
        (
            Self::with(Some(kernel), note, metrics, health),
            Started {
                reader: Some(reader),
            },
        )
    }

    /// The node uplinks (`--uplink`), attached by [`Capture::spawn`].
    #[must_use]
    pub(crate) fn with_uplinks(self, uplinks: &[Uplink]) -> Self {
        *lock(&self.uplinks) = uplinks
            .iter()
            .map(|u| Arc::new(UplinkEntry::new(UplinkSpec::from_flag(u))))
            .collect();
        if self.kernel.is_none() && !uplinks.is_empty() {
            warn!(
                "uplinks configured but no eBPF datapath: leases use their own AF_PACKET receivers"
            );
        }
        self
    }

    /// Hold exactly the uplinks of `desired` from now on (the set read
    /// from Open vSwitch, each time it changes): an uplink not held yet is
    /// attached in the background, one no longer in the set is detached
    /// (its leases see it lost and fall back to their own receivers, as
    /// after a capture loss), one whose spec changed (another physical
    /// network, bridge or attach mode) is attached again. Call after
    /// [`Capture::spawn`]; without eBPF the set is only recorded.
    pub(crate) fn set_uplinks(self: &Arc<Self>, desired: &[UplinkSpec]) {
        let (gone, added) = reconcile(
            &mut lock(&self.uplinks),
            desired,
            |u| &u.spec,
            UplinkEntry::new,
        );
        for u in &gone {
            info!(uplink = %u.name, physnet = ?u.spec.physnet, source = u.spec.source.as_str(), "uplink dropped; detaching");
            self.release_uplink(u);
        }
        for u in &added {
            info!(uplink = %u.name, physnet = ?u.spec.physnet, bridge = ?u.spec.bridge,
                source = u.spec.source.as_str(), attach = ?u.spec.attach, "uplink added; attaching");
            self.hold_uplink(u);
        }
    }

    /// The held uplinks, copied out of their lock.
    fn uplinks(&self) -> Vec<Arc<UplinkEntry>> {
        lock(&self.uplinks).clone()
    }

    /// Capture exactly the found ports of `desired` from now on, on their
    /// host side (the workload ports of DHCP networks the daemon reads
    /// from Open vSwitch, each time they change): a port not held yet is
    /// attached at TC egress in the background, one no longer in the set
    /// is detached (its leases see it lost and fall back to their own
    /// receivers), one whose MAC or network changed is attached again.
    /// Without eBPF the set is only recorded.
    pub(crate) fn set_found_ports(self: &Arc<Self>, desired: &[FoundPortSpec]) {
        let (gone, added) = reconcile(
            &mut lock(&self.found),
            desired,
            |f| &f.spec,
            FoundEntry::new,
        );
        for f in &gone {
            info!(port = %f.name, "the port left Open vSwitch (or an uplink took over): no longer captured on its host side");
            self.release_found(f);
        }
        for f in &added {
            info!(port = %f.name, network = ?f.spec.network,
                "a port found in Open vSwitch: capturing its replies on its host side (TC egress)");
            self.hold_found(f);
        }
    }

    fn found_ports(&self) -> Vec<Arc<FoundEntry>> {
        lock(&self.found).clone()
    }

    fn found_on(&self, t: &AttachTarget) -> Option<Arc<FoundEntry>> {
        self.found_ports().into_iter().find(|f| &f.target == t)
    }

    /// Hold found port `f` (the agent is one more user of its target while
    /// `f` is held) and attach it in the background. Leases still following
    /// a port of that name from before see it pending, then live.
    fn hold_found(self: &Arc<Self>, f: &FoundEntry) {
        if self.kernel.is_none() {
            return;
        }
        {
            let mut targets = lock(&self.targets);
            match targets.get_mut(&f.target) {
                Some(e) if e.role != Role::PortEgress => {
                    warn!(port = %f.name, role = ?e.role, "the port's interface is captured in another role; not captured as a found port");
                    return;
                }
                Some(e) => {
                    e.users += 1;
                    e.state.send_replace(TargetState::Pending);
                }
                None => {
                    let (state, _) = watch::channel(TargetState::Pending);
                    targets.insert(
                        f.target.clone(),
                        Entry {
                            users: 1,
                            role: Role::PortEgress,
                            state,
                        },
                    );
                }
            }
        }
        let me = self.clone();
        let t = f.target.clone();
        tokio::spawn(async move { me.attach_in_background(t).await });
    }

    /// Stop holding found port `f`: its leases see it lost and fall back to
    /// their own receivers, and the program is detached.
    fn release_found(&self, f: &FoundEntry) {
        self.release_held(&f.target, Role::PortEgress);
    }

    /// The found port whose capture a lease on a link with `mac`, of
    /// network `network`, follows from its first DISCOVER: the lease is one
    /// more user of it until it unsubscribes. With `live_only`, only a port
    /// whose program is attached already. `None` without eBPF or without
    /// such a port.
    pub(crate) fn follow_found_port(
        &self,
        mac: [u8; 6],
        network: &str,
        live_only: bool,
    ) -> Option<HeldPath> {
        self.kernel.as_ref()?;
        let f = self.found_ports().into_iter().find(|f| {
            f.spec.mac == mac && f.spec.network.as_deref().is_none_or(|n| n == network)
        })?;
        let mut targets = lock(&self.targets);
        let e = targets.get_mut(&f.target)?;
        if e.role != Role::PortEgress {
            return None;
        }
        let ifindex = match *e.state.borrow() {
            TargetState::Live { ifindex, .. } => Some(ifindex),
            _ => None,
        };
        if live_only && ifindex.is_none() {
            return None;
        }
        e.users += 1;
        Some(HeldPath {
            name: f.name.clone(),
            target: f.target.clone(),
            sub: e.state.subscribe(),
            ifindex,
        })
    }

    /// A reply captured on found port `name` reached its lease.
    pub(crate) fn found_reply(&self, name: &str) {
        if let Some(f) = self.found_ports().into_iter().find(|f| &*f.name == name) {
            f.replies.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Every found port the capture holds, as `xdhcp status` shows it.
    pub(crate) fn found_port_status(&self) -> Vec<crate::rpc::PortCaptureStatus> {
        let found = self.found_ports();
        let states: Vec<Option<TargetState>> = {
            let targets = lock(&self.targets);
            found
                .iter()
                .map(|f| targets.get(&f.target).map(|e| *e.state.borrow()))
                .collect()
        };
        found
            .iter()
            .zip(states)
            .map(|(f, state)| {
                let (state, ifindex) = target_state_label(state);
                crate::rpc::PortCaptureStatus {
                    port: f.spec.ifname.clone(),
                    mac: crate::bindings::format_mac(f.spec.mac),
                    network: f.spec.network.clone(),
                    state: state.to_owned(),
                    hook: ifindex.map(|_| "tc-egress".to_owned()),
                    ifindex,
                    bpf_link: ifindex.and_then(|_| self.link_id(&f.target)),
                    replies: f.replies.load(Ordering::Relaxed),
                }
            })
            .collect()
    }

    /// `ebpf` or `af-packet`.
    pub(crate) fn name(&self) -> &'static str {
        if self.kernel.is_some() {
            "ebpf"
        } else {
            "af-packet"
        }
    }

    /// Why the datapath is what it is, if worth saying.
    pub(crate) fn note(&self) -> Option<&str> {
        self.note.as_deref()
    }

    /// Whether the eBPF datapath is loaded.
    pub(crate) fn has_ebpf(&self) -> bool {
        self.kernel.is_some()
    }

    // ---------------------------------------------------------- routing --

    /// Route replies carrying `xid` to `tx`; with `ifindex` (the lease is on
    /// the ring buffer) also mark the xid owned in the kernel, so the
    /// program consumes its replies. Whether the kernel owns it as asked
    /// (`true` when not asked): when it does not (the map is full, or
    /// refused the update), the programs pass the xid's replies on to the
    /// pod's stack uncaptured, and the caller must read them on the lease's
    /// own receiver.
    pub(crate) fn register(
        &self,
        xid: u32,
        tx: mpsc::Sender<RxFrame>,
        ifindex: Option<u32>,
    ) -> bool {
        lock(&self.routes).insert(xid, tx);
        if let (Some(k), Some(ifindex)) = (&self.kernel, ifindex)
            && let Err(e) = k.xids.own(xid, ifindex)
        {
            warn!(xid, error = %crate::rpc::format_chain(&e),
                "could not register the xid in the kernel ownership map");
            return false;
        }
        true
    }

    /// Stop routing `xid` (and drop it from the kernel map if `in_kernel`,
    /// unless the agent is stopping: then it stays owned, its replies kept
    /// from the pod, until the next agent reconciles the map).
    pub(crate) fn unregister(&self, xid: u32, in_kernel: bool) {
        lock(&self.routes).remove(&xid);
        if in_kernel
            && let Some(k) = &self.kernel
            && !k.keep_attached.load(Ordering::SeqCst)
            && let Err(e) = k.xids.disown(xid)
        {
            warn!(xid, error = %e, "could not remove the xid from the kernel ownership map");
        }
    }

    /// Route the `DHCPv6` replies of transaction `xid` for the `IA_NA`
    /// `iaid` to `tx`, and own the pair in the kernel for `ifindex`, so the
    /// program on that interface consumes them (in intercept mode). Whether
    /// the kernel owns the pair: when it does not, the replies reach the
    /// pod's stack and the lease's own socket.
    pub(crate) fn register6(
        &self,
        xid: u32,
        iaid: u32,
        tx: mpsc::Sender<Rx6Frame>,
        ifindex: u32,
    ) -> bool {
        lock(&self.routes6).insert((xid, iaid), tx);
        let Some(k) = &self.kernel else { return false };
        if let Err(e) = k.xids6.own(xid, iaid, ifindex) {
            warn!(xid, iaid, error = %crate::rpc::format_chain(&e),
                "could not register the DHCPv6 transaction in the kernel ownership map");
            return false;
        }
        true
    }

    /// Stop routing the pair and drop it from the kernel map (unless the
    /// agent is stopping, as for [`Capture::unregister`]).
    pub(crate) fn unregister6(&self, xid: u32, iaid: u32) {
        lock(&self.routes6).remove(&(xid, iaid));
        if let Some(k) = &self.kernel
            && !k.keep_attached.load(Ordering::SeqCst)
            && let Err(e) = k.xids6.disown(xid, iaid)
        {
            warn!(xid, iaid, error = %e, "could not remove a DHCPv6 transaction from the kernel ownership map");
        }
    }

    /// Whether `xid` is one the previous agent left owned in the pinned
    /// ownership map and nobody has registered since: its REQUEST went out
    /// and its reply may be in the ring (see `Client::adopt_sent`).
    pub(crate) fn sent_by_previous_agent(&self, xid: u32) -> bool {
        self.kernel
            .as_ref()
            .is_some_and(|k| k.xids.is_inherited(xid))
    }

    /// Recovery is over: every resumed lease that adopted a previous
    /// agent's transaction has registered its xid. The records the reader
    /// kept for such xids meanwhile are delivered now (what no lease took
    /// is counted as unrouted), and from now on an unrouted record is
    /// dropped at once.
    pub(crate) fn recovered(&self) {
        let Some(k) = &self.kernel else { return };
        let held = lock(&k.held).take().unwrap_or_default();
        let n = held.len();
        let unrouted = held
            .into_iter()
            .map(|f| self.deliver(f))
            .filter(|delivered| !delivered)
            .count();
        if unrouted > 0 {
            self.metrics.dropped("unrouted_xid", unrouted as u64);
        }
        if n > 0 {
            info!(
                records = n,
                delivered = n - unrouted,
                "replies to the previous agent's transactions handed to the leases that adopted them"
            );
        }
    }

    /// While recovery is on, keep `frame` for [`Capture::recovered`] when
    /// its xid is a previous agent's that no lease has registered yet; the
    /// frame back when it was not kept.
    fn hold_for_recovery(&self, frame: RxFrame) -> Option<RxFrame> {
        let Some(k) = &self.kernel else {
            return Some(frame);
        };
        let mut held = lock(&k.held);
        let Some(v) = held.as_mut() else {
            return Some(frame);
        };
        let Some(xid) = frame
            .payload
            .get(4..8)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        else {
            return Some(frame);
        };
        if v.len() >= HELD_MAX || !k.xids.is_inherited(xid) || lock(&self.routes).contains_key(&xid)
        {
            return Some(frame);
        }
        v.push(frame);
        None
    }

    /// Whether a lease should own its xids in the kernel from its first
    /// DISCOVER, before any path is known: some uplink is live, so its
    /// replies may arrive there, and the program must consume them (the
    /// pod's own stack never sees them). Replies that take another path are
    /// not touched by this: no program sits on it yet.
    pub(crate) fn owns_early(&self) -> bool {
        let Some(k) = &self.kernel else { return false };
        let uplinks = self.uplinks();
        if uplinks.is_empty() || !k.ring_serves() {
            return false;
        }
        uplinks.iter().any(|u| self.live_ifindex(u).is_some())
    }

    /// The held uplink named `name`.
    fn uplink_named(&self, name: &str) -> Option<Arc<UplinkEntry>> {
        self.uplinks().into_iter().find(|u| &*u.name == name)
    }

    /// The held uplink capturing on `t`.
    fn uplink_on(&self, t: &AttachTarget) -> Option<Arc<UplinkEntry>> {
        self.uplinks().into_iter().find(|u| &u.target == t)
    }

    /// Uplink `u`'s ifindex (in the agent's namespace) while it is live.
    fn live_ifindex(&self, u: &UplinkEntry) -> Option<u32> {
        let targets = lock(&self.targets);
        match *targets.get(&u.target)?.state.borrow() {
            TargetState::Live { ifindex, .. } => Some(ifindex),
            _ => None,
        }
    }

    /// The live uplink whose ifindex (in the agent's namespace) is `ifindex`.
    fn uplink_at(&self, ifindex: u32) -> Option<Arc<UplinkEntry>> {
        self.uplinks()
            .into_iter()
            .find(|u| self.live_ifindex(u) == Some(ifindex))
    }

    /// The name of the live uplink at `ifindex` (in the agent's namespace).
    pub(crate) fn uplink_name_at(&self, ifindex: u32) -> Option<Arc<str>> {
        self.uplink_at(ifindex).map(|u| u.name.clone())
    }

    /// Move a lease onto the uplink that captured one of its replies at
    /// `ifindex`: it follows that uplink's state from now on (unsubscribe
    /// its `target` when it ends). `None` when no live uplink has that
    /// index (detached meanwhile).
    pub(crate) fn adopt_uplink(&self, ifindex: u32) -> Option<HeldPath> {
        self.follow_uplink(&*self.uplink_at(ifindex)?)
    }

    /// A lease resumed from a record that names uplink `name` follows that
    /// uplink from the start, live or not yet: its replies came there
    /// before the restart, so it needs no receiver of its own and no
    /// per-interface capture. `None` without the eBPF datapath or when this
    /// agent has no such uplink (its flags changed); the lease then takes
    /// the per-interface path until a reply moves it.
    pub(crate) fn resume_on_uplink(&self, name: &str) -> Option<HeldPath> {
        self.kernel.as_ref()?;
        self.follow_uplink(&*self.uplink_named(name)?)
    }

    /// One more lease follows uplink `u`: its state, and its ifindex while
    /// it is live.
    fn follow_uplink(&self, u: &UplinkEntry) -> Option<HeldPath> {
        let mut targets = lock(&self.targets);
        let e = targets.get_mut(&u.target)?;
        e.users += 1;
        let ifindex = match *e.state.borrow() {
            TargetState::Live { ifindex, .. } => Some(ifindex),
            _ => None,
        };
        Some(HeldPath {
            name: u.name.clone(),
            target: u.target.clone(),
            sub: e.state.subscribe(),
            ifindex,
        })
    }

    /// Send `t` out of uplink `name` (an `--uplink` interface), from `mac`,
    /// tagged `vlan`: the frames of a lease whose replies come through an
    /// uplink (its REQUESTs, renewals and RELEASE skip the pod's veth and
    /// the node's bridge, which floods a broadcast to every other port), and
    /// the RELEASE of a lease whose interface is gone. While the uplink is
    /// live, through one socket shared by its leases (opened again when the
    /// uplink comes back under another index); otherwise through a socket
    /// of its own. An error when the uplink cannot take the frame: a lease
    /// then sends through the pod's own link.
    pub(crate) fn send_via_uplink(
        &self,
        name: &str,
        mac: [u8; 6],
        vlan: Option<u16>,
        t: &xdhcp_engine::Transmit,
    ) -> Result<(), RawSockError> {
        let frame = headers_for(mac, vlan, t);
        self.with_uplink_sender(name, |tx| tx.send(&frame, &t.payload))
    }

    /// Send the `DHCPv6` client message `payload` out of uplink `name` (as
    /// [`Capture::send_via_uplink`]), from `mac` and its EUI-64 link-local
    /// address to every DHCP relay agent and server (`ff02::1:2`), tagged
    /// `vlan`: the RELEASE of a v6 lease whose replies came through the
    /// uplink, once the pod's interface cannot send it.
    pub(crate) fn send6_via_uplink(
        &self,
        name: &str,
        mac: [u8; 6],
        vlan: Option<u16>,
        payload: &[u8],
    ) -> Result<(), RawSockError> {
        let frame = crate::datapath::frame::build_udp6_frame(
            &crate::datapath::frame::Frame6Headers {
                src_mac: mac,
                dst_mac: [0x33, 0x33, 0x00, 0x01, 0x00, 0x02],
                vlan,
                src_ip: crate::datapath::frame::link_local(mac),
                dst_ip: xdhcp_engine::v6::message::ALL_SERVERS,
                src_port: crate::datapath::udp6::CLIENT_PORT,
                dst_port: crate::datapath::udp6::SERVER_PORT,
            },
            payload,
        );
        self.with_uplink_sender(name, |tx| tx.send_frame(&frame))
    }

    /// Runs `send` with a sender on uplink `name`: while the uplink is
    /// live, the one its leases share (opened again when the uplink comes
    /// back under another index); otherwise one of its own, in the agent's
    /// namespace, closed after.
    fn with_uplink_sender(
        &self,
        name: &str,
        send: impl FnOnce(&RawSender) -> Result<(), RawSockError>,
    ) -> Result<(), RawSockError> {
        let entry = self.uplink_named(name);
        let live = entry.as_ref().and_then(|u| self.live_ifindex(u));
        let (Some(u), Some(ifindex)) = (entry, live) else {
            let tx = RawSender::open_here(name)?;
            let sent = send(&tx);
            crate::datapath::link::close_later(Box::new(tx));
            return sent;
        };
        let tx = {
            let mut slot = lock(&u.tx);
            match slot.as_ref() {
                Some(tx) if tx.info().ifindex == ifindex => tx.clone(),
                _ => {
                    let tx = Arc::new(RawSender::open_here(name)?);
                    // A socket bound to an index that went away is closed
                    // off this thread (it waits for a grace period).
                    if let Some(old) = slot.replace(tx.clone()) {
                        crate::datapath::link::close_later(Box::new(old));
                    }
                    tx
                }
            }
        };
        send(&tx)
    }

    /// A lease of `network` heard its server: through uplink `via` (with
    /// the VLAN its reply carried), or on its own path (`None`: the server
    /// answered without crossing an uplink — it sits on the node's bridge,
    /// or no uplink program is live).
    pub(crate) fn note_served(&self, network: &str, via: Option<ServedVia>) {
        let mut served = lock(&self.served);
        match via {
            Some(v) => {
                if served.get(network) != Some(&v) {
                    served.insert(network.to_owned(), v);
                }
            }
            None => {
                served.remove(network);
            }
        }
    }

    /// Where a fresh acquisition on `network` sends its first DISCOVER: the
    /// live uplink the network's latest lease was served through, if any.
    /// Sent into the pod's interface instead, a DISCOVER is a broadcast the
    /// node's bridge floods to every other port of the network (every pod's
    /// stack takes a copy) before it reaches the uplink; sent there, it
    /// reaches the same server and nothing else. Only the first one: a
    /// retransmission goes through the pod's interface and finds a server
    /// wherever it is now.
    pub(crate) fn discover_route(&self, network: &str) -> Option<ServedVia> {
        let via = lock(&self.served).get(network).cloned()?;
        self.live_ifindex(&*self.uplink_named(&via.uplink)?)?;
        Some(via)
    }

    /// A lease of `network` was bound, on its pod's own link, by a reply
    /// from Ethernet source `mac` (the server, or the relay or router
    /// before it): the next acquisition's first DISCOVER is sent there
    /// ([`Capture::server_mac`]). Only a reply the engine accepted and
    /// bound on counts, so no forged reply steers it.
    pub(crate) fn note_server_mac(&self, network: &str, mac: [u8; 6]) {
        lock(&self.server_macs).insert(network.to_owned(), mac);
    }

    /// Where a fresh acquisition on `network` without an uplink sends its
    /// first DISCOVER at the Ethernet layer: the source of the reply that
    /// bound the network's latest lease on a pod's link. A DISCOVER is an IP
    /// broadcast, and sent to the broadcast MAC the node's bridge floods it
    /// to every port of the segment — every pod's stack takes a copy, a
    /// hundred of them under a burst of a hundred ADDs; addressed to the
    /// server's MAC (its IP destination still 255.255.255.255) it reaches
    /// the same server and nothing else. Only the first DISCOVER (and the
    /// REQUEST for that server's OFFER): a retransmission is broadcast,
    /// and forgets this address ([`Capture::forget_server_mac`]).
    pub(crate) fn server_mac(&self, network: &str) -> Option<[u8; 6]> {
        lock(&self.server_macs).get(network).copied()
    }

    /// The first DISCOVER sent to `mac` went unanswered: the network's
    /// next acquisitions broadcast theirs until a lease is bound again.
    pub(crate) fn forget_server_mac(&self, network: &str, mac: [u8; 6]) {
        let mut macs = lock(&self.server_macs);
        if macs.get(network) == Some(&mac) {
            macs.remove(network);
        }
    }

    /// Hand a captured frame to the lease task owning its xid.
    /// Hand a captured `DHCPv6` message to the lease that registered its
    /// transaction id and IAID (read again from the payload: the kernel
    /// matched them, the record does not carry the IAID).
    fn deliver6(&self, frame: Rx6Frame) -> bool {
        let Some(key) = dhcp6_key(&frame.payload) else {
            return false;
        };
        let uplink = matches!(frame.via, RxPath::Uplink { .. })
            .then(|| self.uplink_at(frame.ifindex))
            .flatten();
        let tx = lock(&self.routes6).get(&key).cloned();
        let delivered = tx.is_some_and(|tx| tx.try_send(frame).is_ok());
        if delivered && let Some(u) = uplink {
            u.replies.fetch_add(1, Ordering::Relaxed);
            self.metrics.uplink_reply(&u.spec.ifname);
        }
        delivered
    }

    fn deliver(&self, frame: RxFrame) -> bool {
        let Some(xid) = frame
            .payload
            .get(4..8)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        else {
            return false;
        };
        let uplink = matches!(frame.via, RxPath::Uplink { .. })
            .then(|| self.uplink_at(frame.ifindex))
            .flatten();
        let tx = lock(&self.routes).get(&xid).cloned();
        let delivered = tx.is_some_and(|tx| tx.try_send(frame).is_ok());
        if delivered && let Some(u) = uplink {
            u.replies.fetch_add(1, Ordering::Relaxed);
            self.metrics.uplink_reply(&u.spec.ifname);
        }
        delivered
    }

    /// Every held uplink, as `xdhcp status` shows it.
    pub(crate) fn uplink_status(&self) -> Vec<UplinkStatus> {
        let uplinks = self.uplinks();
        let states: Vec<Option<TargetState>> = {
            let targets = lock(&self.targets);
            uplinks
                .iter()
                .map(|u| targets.get(&u.target).map(|e| *e.state.borrow()))
                .collect()
        };
        uplinks
            .iter()
            .zip(states)
            .map(|(u, state)| {
                let (state, mode, ifindex) = match state {
                    None => ("off", None, None),
                    Some(TargetState::Pending) => ("pending", None, None),
                    Some(TargetState::Live { ifindex, mode }) => {
                        ("live", Some(mode.as_str().to_owned()), Some(ifindex))
                    }
                    Some(TargetState::Lost | TargetState::Refused) => ("lost", None, None),
                };
                UplinkStatus {
                    ifname: u.spec.ifname.clone(),
                    physnet: u.spec.physnet.clone(),
                    bridge: u.spec.bridge.clone(),
                    source: u.spec.source.as_str().to_owned(),
                    state: state.to_owned(),
                    mode,
                    ifindex,
                    bpf_link: ifindex.and_then(|_| self.link_id(&u.target)),
                    replies: u.replies.load(Ordering::Relaxed),
                }
            })
            .collect()
    }

    /// Start holding every uplink: attach each now, in the agent's own
    /// namespace; failures are retried by the link check.
    fn start_uplinks(self: &Arc<Self>) {
        for u in self.uplinks() {
            self.hold_uplink(&u);
        }
    }

    /// Hold uplink `u` (the agent is one more user of its target, never
    /// leaving it while `u` is held) and attach it in the background.
    /// Leases still following an uplink of that name from before (it was
    /// dropped, and is back) see it pending, then live.
    fn hold_uplink(self: &Arc<Self>, u: &UplinkEntry) {
        if self.kernel.is_none() {
            return;
        }
        {
            let mut targets = lock(&self.targets);
            match targets.get_mut(&u.target) {
                Some(e) if e.role != Role::Uplink => {
                    warn!(uplink = %u.name, "the uplink's interface is served as a workload port; not held as an uplink");
                    return;
                }
                Some(e) => {
                    e.users += 1;
                    e.state.send_replace(TargetState::Pending);
                }
                None => {
                    let (state, _) = watch::channel(TargetState::Pending);
                    targets.insert(
                        u.target.clone(),
                        Entry {
                            users: 1,
                            role: Role::Uplink,
                            state,
                        },
                    );
                }
            }
        }
        self.uplink_metric(&u.target, TargetState::Pending);
        let me = self.clone();
        let t = u.target.clone();
        tokio::spawn(async move { me.attach_in_background(t).await });
    }

    /// Stop holding uplink `u` (no longer in the set): its leases see it
    /// lost and fall back to their own receivers, the program is detached,
    /// and it counts as no loss (it was dropped on purpose).
    fn release_uplink(&self, u: &UplinkEntry) {
        self.metrics.forget_uplink(&u.labels());
        lock(&self.uplink_retry).retain(|t| t != &u.target);
        // Also when the same interface is held again under a new spec: the
        // detach goes first, its attach follows, maybe in another mode.
        self.release_held(&u.target, Role::Uplink);
    }

    /// Stop holding `target`, held in `role` by the agent itself (an uplink
    /// or a found port): its leases see it lost, one user fewer, the
    /// program detached in the background, no loss counted for it.
    fn release_held(&self, target: &AttachTarget, role: Role) {
        lock(&self.lost).remove(&target_key(target));
        if self.kernel.is_some() {
            let mut targets = lock(&self.targets);
            if let Some(e) = targets.get_mut(target)
                && e.role == role
            {
                e.state.send_replace(TargetState::Lost);
                e.users -= 1;
                if e.users == 0 {
                    targets.remove(target);
                }
            }
            drop(targets);
            self.detach_in_background(target);
        }
        self.update_degraded();
    }

    fn is_uplink(&self, t: &AttachTarget) -> bool {
        self.uplink_on(t).is_some()
    }

    fn uplink_seen(&self, t: &AttachTarget) -> bool {
        self.uplink_on(t)
            .is_some_and(|u| u.tried.load(Ordering::Relaxed))
    }

    fn set_uplink_seen(&self, t: &AttachTarget, tried: bool) {
        if let Some(u) = self.uplink_on(t) {
            u.tried.store(tried, Ordering::Relaxed);
        }
    }

    /// The attach mode for `t`: its uplink's own need, else `--attach`,
    /// else (`None`) the per-device default.
    fn attach_mode(&self, t: &AttachTarget, k: &Kernel) -> Option<AttachMode> {
        if self.role_of(t) == Role::PortEgress {
            return Some(AttachMode::Tc);
        }
        self.uplink_on(t).and_then(|u| u.spec.attach).or(k.attach)
    }

    /// Whether `t` is held by the agent in a role it no longer holds it in
    /// (an uplink dropped from the set, a found port gone from OVS): then
    /// nothing is to be attached there.
    fn dropped_role(&self, t: &AttachTarget) -> bool {
        match self.role_of(t) {
            Role::Uplink => !self.is_uplink(t),
            Role::PortEgress => self.found_on(t).is_none(),
            Role::Port => false,
        }
    }

    fn role_of(&self, t: &AttachTarget) -> Role {
        lock(&self.targets).get(t).map_or(Role::Port, |e| e.role)
    }

    /// Report an uplink's attach state in the metrics.
    fn uplink_metric(&self, t: &AttachTarget, state: TargetState) {
        if let Some(u) = self.uplink_on(t) {
            let mode = match state {
                TargetState::Live { mode, .. } => Some(mode.as_str()),
                _ => None,
            };
            self.metrics.set_uplink_attached(&u.labels(), mode);
        }
    }

    /// Number of routed xids.
    pub(crate) fn routed(&self) -> usize {
        lock(&self.routes).len() + lock(&self.routes6).len()
    }

    // ------------------------------------------------------- attachment --

    /// Subscribe to `target`'s capture, attaching the program in the
    /// background if no other lease has. The receiver says when the ring
    /// buffer serves the target (and when it stops). `None` without eBPF.
    pub(crate) fn subscribe(
        self: &Arc<Self>,
        target: &AttachTarget,
        delay: bool,
    ) -> Option<watch::Receiver<TargetState>> {
        self.kernel.as_ref()?;
        let mut targets = lock(&self.targets);
        if let Some(e) = targets.get_mut(target) {
            e.users += 1;
            return Some(e.state.subscribe());
        }
        let (state, rx) = watch::channel(TargetState::Pending);
        targets.insert(
            target.clone(),
            Entry {
                users: 1,
                role: Role::Port,
                state,
            },
        );
        drop(targets);
        let me = self.clone();
        let t = target.clone();
        let wait = if delay {
            PROMOTE_DELAY + Duration::from_millis(crate::sys::clock::seed() % PROMOTE_JITTER_MS)
        } else {
            Duration::ZERO
        };
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            me.attach_in_background(t).await;
        });
        Some(rx)
    }

    /// Subscribe and wait for the attach to finish (a one-shot discovery
    /// that must capture from its first frame). `None`: use `AF_PACKET`.
    pub(crate) async fn subscribe_now(
        self: &Arc<Self>,
        target: &AttachTarget,
    ) -> Option<(watch::Receiver<TargetState>, u32, AttachMode)> {
        let mut rx = self.subscribe(target, false)?;
        let state = rx
            .wait_for(|s| *s != TargetState::Pending)
            .await
            .map(|s| *s)
            .ok();
        if let Some(TargetState::Live { ifindex, mode }) = state {
            Some((rx, ifindex, mode))
        } else {
            self.unsubscribe(target);
            None
        }
    }

    async fn attach_in_background(self: Arc<Self>, target: AttachTarget) {
        let Some(k) = &self.kernel else { return };
        let _slot = k.slots.acquire().await.ok();
        // Nobody left to serve (the lease ended during the delay).
        if !lock(&self.targets).contains_key(&target) {
            return;
        }
        let me = self.clone();
        let t = target.clone();
        let res = tokio::task::spawn_blocking(move || me.attach_blocking(&t)).await;
        let state = match res {
            Ok(Ok((ifindex, mode))) => {
                if k.ring_serves() {
                    TargetState::Live { ifindex, mode }
                } else {
                    TargetState::Lost
                }
            }
            Ok(Err(e)) if self.is_uplink(&target) => {
                warn!(uplink = %target.ifname, error = %e,
                    "cannot attach to the uplink; retrying when its interface is there");
                lock(&self.uplink_retry).push(target.clone());
                lock(&self.lost).insert(target_key(&target), "uplink_absent");
                self.update_degraded();
                TargetState::Lost
            }
            Ok(Err(e)) => {
                warn!(ifname = %target.ifname, netns = ?target.netns, error = %e,
                    "eBPF attach failed; this interface keeps the AF_PACKET receiver");
                TargetState::Refused
            }
            Err(e) => {
                error!(ifname = %target.ifname, error = %e, "the attach task failed");
                TargetState::Refused
            }
        };
        self.uplink_metric(&target, state);
        let orphaned = {
            let targets = lock(&self.targets);
            match targets.get(&target) {
                Some(e) => {
                    e.state.send_replace(state);
                    false
                }
                None => true,
            }
        };
        // Every lease left while the attach ran, or the uplink was
        // dropped meanwhile: undo it.
        let dropped = self.dropped_role(&target);
        if dropped && let Some(e) = lock(&self.targets).get(&target) {
            e.state.send_replace(TargetState::Lost);
        }
        if (orphaned || dropped) && matches!(state, TargetState::Live { .. } | TargetState::Lost) {
            self.detach_in_background(&target);
        }
    }

    fn attach_blocking(
        &self,
        target: &AttachTarget,
    ) -> Result<(u32, AttachMode), crate::datapath::ebpf::EbpfDatapathError> {
        let k = self.kernel.as_ref().expect("attach without eBPF");
        let capture = k.capture_mode();
        let role = self.role_of(target);
        let mode = self.attach_mode(target, k);
        let a = lock(&k.dp).attach_as(role, target, mode, capture)?;
        Ok((a.ifindex, a.mode))
    }

    /// A lease no longer needs `target`'s capture; the last one detaches.
    pub(crate) fn unsubscribe(&self, target: &AttachTarget) {
        let last = {
            let mut targets = lock(&self.targets);
            match targets.get_mut(target) {
                Some(e) if e.users > 1 => {
                    e.users -= 1;
                    None
                }
                Some(_) => targets.remove(target).map(|e| *e.state.borrow()),
                None => None,
            }
        };
        if matches!(last, Some(TargetState::Live { .. } | TargetState::Lost)) {
            self.detach_in_background(target);
        }
        self.update_degraded();
    }

    /// From now on (the agent stops) nothing is detached: the links, pinned
    /// where a bpffs allows, stay for the next agent to take over; unpinned
    /// ones go with the process.
    pub(crate) fn keep_attached(&self) {
        if let Some(k) = &self.kernel {
            k.keep_attached.store(true, Ordering::SeqCst);
        }
    }

    fn detach_in_background(&self, target: &AttachTarget) {
        let Some(k) = &self.kernel else { return };
        if k.keep_attached.load(Ordering::SeqCst) {
            return;
        }
        let res = lock(&k.dp).detach(target);
        if let Err(e) = res {
            // The interface is often gone already (pod deleted).
            debug!(ifname = %target.ifname, error = %e, "eBPF detach");
        }
    }

    // ----------------------------------------------------------- health --

    /// Mark `targets` (every attached one when `None`) lost: their leases
    /// fall back to `AF_PACKET`.
    fn mark_lost(&self, only: Option<&[AttachTarget]>, reason: &'static str) {
        let targets = lock(&self.targets);
        for (t, e) in targets.iter() {
            if only.is_some_and(|o| !o.contains(t)) {
                continue;
            }
            if matches!(*e.state.borrow(), TargetState::Live { .. }) {
                e.state.send_replace(TargetState::Lost);
            }
            if only.is_some() {
                lock(&self.lost).insert(target_key(t), reason);
            }
        }
        drop(targets);
        if let Some(only) = only {
            for t in only {
                self.uplink_metric(t, TargetState::Lost);
            }
        }
        self.update_degraded();
    }

    /// Mark `targets` (every lost one when `None`) live again.
    fn mark_restored(&self, only: Option<&[AttachTarget]>) {
        let Some(k) = &self.kernel else { return };
        let dp = lock(&k.dp);
        let attached: HashMap<AttachTarget, (u32, AttachMode)> = dp
            .attachments()
            .into_iter()
            .map(|(t, ifindex, mode)| (t, (ifindex, mode)))
            .collect();
        drop(dp);
        let targets = lock(&self.targets);
        for (t, e) in targets.iter() {
            if only.is_some_and(|o| !o.contains(t)) {
                continue;
            }
            if only.is_some() {
                lock(&self.lost).remove(&target_key(t));
            }
            if *e.state.borrow() == TargetState::Lost
                && lock(&self.lost).get(&target_key(t)).is_none()
                && let Some(&(ifindex, mode)) = attached.get(t)
            {
                let live = TargetState::Live { ifindex, mode };
                e.state.send_replace(live);
                if let Some(u) = self.uplink_on(t) {
                    self.metrics
                        .set_uplink_attached(&u.labels(), Some(mode.as_str()));
                }
            }
        }
        drop(targets);
        self.update_degraded();
    }

    fn update_degraded(&self) {
        let reader_lost = self
            .kernel
            .as_ref()
            .is_some_and(|k| !k.reader_ok.load(Ordering::SeqCst));
        let lost = lock(&self.lost);
        let ring_full = self
            .kernel
            .as_ref()
            .is_some_and(|k| !k.ring_ok.load(Ordering::SeqCst));
        let why = if reader_lost {
            Some("the eBPF ring buffer reader failed; leases use AF_PACKET".to_owned())
        } else if ring_full {
            Some("the eBPF ring buffer overflowed; leases use AF_PACKET until it drains".to_owned())
        } else if lost.is_empty() {
            None
        } else {
            let mut names: Vec<&str> = lost.keys().map(String::as_str).collect();
            names.sort_unstable();
            Some(format!(
                "eBPF capture lost on {}; their leases use AF_PACKET",
                names.join(", ")
            ))
        };
        drop(lost);
        self.metrics.set_capture_degraded(why.is_some());
        self.health.set_degraded(why);
    }

    /// Set the kernel capture mode of every attached interface.
    fn set_all_modes(&self, mode: CaptureMode) {
        let Some(k) = &self.kernel else { return };
        for (t, e) in lock(&k.dp).set_all_modes(mode) {
            warn!(ifname = %t.ifname, error = %e, ?mode, "could not set the capture mode");
        }
    }

    /// Start the actor's side tasks: the ring reader (restarted after a
    /// failure), the link check and the kernel counter poll.
    pub(crate) fn spawn(
        self: &Arc<Self>,
        started: Started,
        side: &mut JoinSet<()>,
        token: &CancellationToken,
    ) {
        let Some(reader) = started.reader else { return };
        self.start_uplinks();
        // Short-lived: not a side task (those run for the agent's life).
        tokio::spawn(self.clone().prepare_tc());
        side.spawn(self.clone().read_ring(reader, token.clone()));
        side.spawn(self.clone().check_links(token.clone()));
        side.spawn(self.clone().poll_counters(token.clone()));
        side.spawn(self.clone().watch_ring(token.clone()));
    }

    /// Once the resumed leases have had their interfaces attached (taking
    /// over the links a previous agent pinned), reconcile what that agent
    /// left: its pinned links nobody claimed are released, its xids this
    /// agent did not register are disowned, stale modes cleared (see
    /// `Datapath::release_unclaimed`). Call after recovery; returns at
    /// once without eBPF. Waits at least until every lease's delayed
    /// promotion to the ring is due, then until no attach is pending (at
    /// most [`RECONCILE_MAX`]).
    pub(crate) async fn release_unclaimed(self: Arc<Self>, token: CancellationToken) {
        if self.kernel.is_none() {
            return;
        }
        let started = tokio::time::Instant::now();
        let first =
            PROMOTE_DELAY + Duration::from_millis(PROMOTE_JITTER_MS) + Duration::from_secs(1);
        tokio::select! {
            () = token.cancelled() => return,
            () = tokio::time::sleep(first) => {}
        }
        while started.elapsed() < RECONCILE_MAX
            && lock(&self.targets)
                .values()
                .any(|e| *e.state.borrow() == TargetState::Pending)
        {
            tokio::select! {
                () = token.cancelled() => return,
                () = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
        let me = self.clone();
        let res = tokio::task::spawn_blocking(move || {
            me.kernel
                .as_ref()
                .map(|k| lock(&k.dp).release_unclaimed())
                .transpose()
        })
        .await;
        match res {
            Ok(Ok(Some((links, xids)))) => info!(
                released_links = links,
                disowned_xids = xids,
                after = ?started.elapsed(),
                "took over from the previous agent's pins; the rest released"
            ),
            Ok(Ok(None)) => {}
            Ok(Err(e)) => warn!(error = %crate::rpc::format_chain(&e),
                "could not reconcile the previous agent's pinned tables"),
            Err(e) => warn!(error = %e, "the pin reconciliation task failed"),
        }
    }

    /// Have the kernel's TC modules loaded now, after the start's uplinks
    /// (it queues behind their attaches), rather than inside the first
    /// attach that needs them: a run-time uplink or found port on a
    /// veth, or the guard's first port (see `Datapath::prepare_tc`).
    async fn prepare_tc(self: Arc<Self>) {
        let Some(k) = &self.kernel else { return };
        let _slot = k.slots.acquire().await.ok();
        let me = self.clone();
        let started = std::time::Instant::now();
        let res = tokio::task::spawn_blocking(move || {
            me.kernel
                .as_ref()
                .map(|k| lock(&k.dp).prepare_tc())
                .transpose()
        })
        .await;
        match res {
            Ok(Ok(_)) => debug!(took = ?started.elapsed(), "TC attachment path prepared"),
            Ok(Err(e)) => warn!(error = %crate::rpc::format_chain(&e),
                "could not prepare the TC attachment path; the first TC attach loads what it needs"),
            Err(e) => warn!(error = %e, "the TC preparation task failed"),
        }
    }

    /// The ring reader; when it fails, the leases fall back and a new
    /// reader is opened with backoff.
    async fn read_ring(self: Arc<Self>, mut reader: EventReader, token: CancellationToken) {
        let Some(k) = &self.kernel else { return };
        loop {
            let err = self.read_until_failure(&mut reader, &token).await;
            let Some(err) = err else { return };
            error!(error = %err, "eBPF ring buffer reader failed; leases fall back to AF_PACKET");
            self.metrics.capture_lost("reader");
            k.reader_ok.store(false, Ordering::SeqCst);
            // Owned replies must reach the stack (and AF_PACKET) again.
            self.set_all_modes(CaptureMode::Observe);
            self.mark_lost(None, "reader");
            let mut wait = READER_RESTORE_FIRST;
            reader = loop {
                tokio::select! {
                    () = token.cancelled() => return,
                    () = tokio::time::sleep(wait) => {}
                }
                match self.reopen_reader() {
                    Ok(r) => break r,
                    Err(e) => {
                        warn!(error = %crate::rpc::format_chain(&e), retry_in_s = wait.as_secs(), "cannot reopen the eBPF ring buffer");
                        wait = (wait * 2).min(RESTORE_MAX);
                    }
                }
            };
            k.reader_ok.store(true, Ordering::SeqCst);
            self.metrics.capture_restored("reader");
            if k.ring_serves() {
                self.set_all_modes(CaptureMode::Intercept);
                self.mark_restored(None);
                info!("eBPF ring buffer reader restored; leases return to it");
            } else {
                self.update_degraded();
                info!(
                    "eBPF ring buffer reader restored; leases return to it once the ring has room"
                );
            }
        }
    }

    /// Deliver events until cancelled (`None`) or the reader fails.
    async fn read_until_failure(
        &self,
        reader: &mut EventReader,
        token: &CancellationToken,
    ) -> Option<String> {
        let k = self.kernel.as_ref()?;
        loop {
            #[cfg(feature = "test-hooks")]
            if self.reader_fault() {
                return Some("injected reader failure".to_owned());
            }
            #[cfg(feature = "test-hooks")]
            if self.reader_stalled() {
                tokio::select! {
                    () = token.cancelled() => return None,
                    () = self.fault_poll() => continue,
                }
            }
            // What is in the ring already, first; once it is empty the
            // reader has caught up, which a full ring waits for.
            let ev = if let Some(ev) = reader.try_recv_any() {
                Ok(ev)
            } else {
                k.drained.fetch_add(1, Ordering::SeqCst);
                tokio::select! {
                    () = token.cancelled() => return None,
                    ev = reader.recv() => ev,
                    () = self.fault_poll() => continue,
                }
            };
            match ev {
                Ok(Captured::V4(ev)) => {
                    // A reply to a previous agent's transaction may come
                    // before the lease adopting it has registered.
                    if let Some(frame) = self.hold_for_recovery(ev.frame)
                        && !self.deliver(frame)
                    {
                        self.metrics.dropped("unrouted_xid", 1);
                    }
                }
                // A v6 lease resumed after a restart starts a transaction
                // of its own: nothing is held for it.
                Ok(Captured::V6(frame)) => {
                    if !self.deliver6(frame) {
                        self.metrics.dropped("unrouted_xid", 1);
                    }
                }
                Err(e) => return Some(crate::rpc::format_chain(&e)),
            }
        }
    }

    #[cfg(feature = "test-hooks")]
    fn reader_fault(&self) -> bool {
        self.kernel
            .as_ref()
            .is_some_and(|k| k.reader_fault.load(Ordering::SeqCst))
    }

    /// Wakes the reader loop now and then so an injected fault is seen
    /// (tests only); pends forever otherwise.
    async fn fault_poll(&self) {
        #[cfg(feature = "test-hooks")]
        tokio::time::sleep(Duration::from_millis(50)).await;
        #[cfg(not(feature = "test-hooks"))]
        std::future::pending::<()>().await;
    }

    /// Break (`true`) or mend the ring reader, as a failure would (tests).
    #[cfg(feature = "test-hooks")]
    pub(crate) fn inject_reader_fault(&self, broken: bool) {
        if let Some(k) = &self.kernel {
            k.reader_fault.store(broken, Ordering::SeqCst);
        }
    }

    #[cfg(feature = "test-hooks")]
    fn reader_stalled(&self) -> bool {
        self.kernel
            .as_ref()
            .is_some_and(|k| k.reader_stall.load(Ordering::SeqCst))
    }

    /// Stall (`true`) the ring reader, so the ring fills and stays full, or
    /// let it read again (tests).
    #[cfg(feature = "test-hooks")]
    pub(crate) fn inject_reader_stall(&self, stalled: bool, xids: &[u32]) {
        if let Some(k) = &self.kernel {
            k.reader_stall.store(stalled, Ordering::SeqCst);
            for &xid in xids {
                let done = if stalled {
                    k.xids.own(xid, 0)
                } else {
                    k.xids.disown(xid)
                };
                if let Err(e) = done {
                    warn!(xid, error = %e, "test hook: could not change the xid's ownership");
                }
            }
        }
    }

    fn reopen_reader(&self) -> Result<EventReader, RestoreError> {
        #[cfg(feature = "test-hooks")]
        if self.reader_fault() {
            return Err(RestoreError::Injected);
        }
        let k = self.kernel.as_ref().ok_or(RestoreError::NoEbpf)?;
        Ok(lock(&k.dp).reopen_reader()?)
    }

    /// Notice links detached from under the agent; re-attach them.
    async fn check_links(self: Arc<Self>, token: CancellationToken) {
        let mut tick = tokio::time::interval(LINK_CHECK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut retry: HashMap<AttachTarget, (tokio::time::Instant, Duration)> = HashMap::new();
        loop {
            tokio::select! {
                () = token.cancelled() => return,
                _ = tick.tick() => {}
            }
            let me = self.clone();
            let Ok(detached) = tokio::task::spawn_blocking(move || me.detached_links()).await
            else {
                continue;
            };
            for t in &detached {
                if retry.contains_key(t) {
                    continue;
                }
                // A found port's device gone while its port is still in
                // OVS (the pod's namespace went first): no loss, its
                // program goes with the port.
                if self.role_of(t) == Role::PortEgress && !interface_present(&t.ifname) {
                    continue;
                }
                error!(ifname = %t.ifname, netns = ?t.netns,
                    "the eBPF program was detached from under the agent (or its interface is gone); its leases fall back to AF_PACKET");
                self.metrics.capture_lost("link_detached");
                self.mark_lost(Some(std::slice::from_ref(t)), "link_detached");
                let first = if self.is_uplink(t) {
                    UPLINK_RESTORE_FIRST
                } else {
                    LINK_RESTORE_FIRST
                };
                retry.insert(t.clone(), (tokio::time::Instant::now() + first, first));
            }
            // Uplinks whose first attach failed (absent at start).
            for t in std::mem::take(&mut *lock(&self.uplink_retry)) {
                retry.entry(t).or_insert((
                    tokio::time::Instant::now() + UPLINK_RESTORE_FIRST,
                    UPLINK_RESTORE_FIRST,
                ));
            }
            let now = tokio::time::Instant::now();
            // An uplink is tried as soon as its interface is there (it came
            // back), and not at all while it is absent.
            let due: Vec<AttachTarget> = retry
                .iter()
                .filter(|(t, (at, _))| {
                    if self.is_uplink(t) {
                        interface_present(&t.ifname) && (*at <= now || !self.uplink_seen(t))
                    } else {
                        *at <= now
                    }
                })
                .map(|(t, _)| t.clone())
                .collect();
            for t in retry.keys() {
                if self.is_uplink(t) && !interface_present(&t.ifname) {
                    self.set_uplink_seen(t, false);
                }
            }
            for t in due {
                let me = self.clone();
                let t2 = t.clone();
                let res = tokio::task::spawn_blocking(move || me.reattach(&t2)).await;
                match res {
                    Ok(Ok(true)) => {
                        retry.remove(&t);
                        self.set_uplink_seen(&t, false);
                        self.mark_restored(Some(std::slice::from_ref(&t)));
                        self.metrics.capture_restored("link_detached");
                        info!(ifname = %t.ifname, netns = ?t.netns, "eBPF program re-attached; leases return to the ring buffer");
                    }
                    // Nobody needs it any more.
                    Ok(Ok(false)) => {
                        retry.remove(&t);
                        lock(&self.lost).remove(&target_key(&t));
                        self.update_degraded();
                    }
                    Ok(Err(e)) => {
                        let wait = retry.get(&t).map_or(LINK_RESTORE_FIRST, |r| r.1);
                        warn!(ifname = %t.ifname, error = %crate::rpc::format_chain(&e), retry_in_s = wait.as_secs(), "cannot re-attach the eBPF program");
                        let max = if self.is_uplink(&t) {
                            self.set_uplink_seen(&t, true);
                            UPLINK_RESTORE_MAX
                        } else {
                            RESTORE_MAX
                        };
                        let next = (wait * 2).min(max);
                        retry.insert(t, (now + next, next));
                    }
                    Err(_) => {}
                }
            }
        }
    }

    fn detached_links(&self) -> Vec<AttachTarget> {
        let Some(k) = &self.kernel else {
            return Vec::new();
        };
        lock(&k.dp).detached_targets()
    }

    /// Attach `t` anew; `false` when no lease needs it any more.
    fn reattach(&self, t: &AttachTarget) -> Result<bool, RestoreError> {
        let k = self.kernel.as_ref().ok_or(RestoreError::NoEbpf)?;
        let mut dp = lock(&k.dp);
        if let Err(e) = dp.detach(t) {
            debug!(ifname = %t.ifname, error = %e, "dropping the detached link");
        }
        if !lock(&self.targets).contains_key(t) {
            return Ok(false);
        }
        // An uplink dropped from the set, a found port gone from OVS: their
        // leases stay on their own receivers.
        let role = self.role_of(t);
        if self.dropped_role(t) {
            return Ok(false);
        }
        let mode = k.capture_mode();
        let attach = self.attach_mode(t, k);
        Ok(dp.attach_as(role, t, attach, mode).map(|_| true)?)
    }

    async fn poll_counters(self: Arc<Self>, token: CancellationToken) {
        let mut tick = tokio::time::interval(KERNEL_POLL);
        loop {
            tokio::select! {
                () = token.cancelled() => return,
                _ = tick.tick() => {}
            }
            // Off the async workers: the datapath lock may be held by a run
            // of attaches.
            let me = self.clone();
            let snap = tokio::task::spawn_blocking(move || me.kernel_counters()).await;
            if let Ok(Some(c)) = snap {
                self.metrics.kernel_snapshot(&c);
            }
        }
    }

    /// Notice a full ring buffer: when the kernel counts a record it could
    /// not reserve, the reply went on uncaptured (to the pod's stack, never
    /// to its lease), so every lease on the ring falls back to its own
    /// `AF_PACKET` receiver, which sees such replies, and the kernel stops
    /// consuming owned ones (observe mode), as when the reader fails. The
    /// leases return once the reader has emptied the ring and the counter
    /// stayed still for [`RING_QUIET`].
    async fn watch_ring(self: Arc<Self>, token: CancellationToken) {
        let Some(k) = &self.kernel else { return };
        let mut tick = tokio::time::interval(RING_CHECK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut seen: Option<u64> = None;
        let mut health = RingHealth::default();
        loop {
            tokio::select! {
                () = token.cancelled() => return,
                _ = tick.tick() => {}
            }
            let me = self.clone();
            let Ok(Some(full)) = tokio::task::spawn_blocking(move || me.ring_full_count()).await
            else {
                continue;
            };
            // The first reading is the baseline (pinned counters carry on
            // across restarts).
            let Some(before) = seen.replace(full) else {
                continue;
            };
            let now = tokio::time::Instant::now();
            let drained = k.drained.load(Ordering::SeqCst);
            match health.observe(full.saturating_sub(before), drained, now) {
                RingChange::Overflowed(lost) => {
                    k.ring_ok.store(false, Ordering::SeqCst);
                    error!(
                        uncaptured = lost,
                        "the eBPF ring buffer is full: replies went on uncaptured; leases fall back to AF_PACKET until it drains"
                    );
                    self.metrics.capture_lost("ring_full");
                    self.set_all_modes(CaptureMode::Observe);
                    self.mark_lost(None, "ring_full");
                }
                RingChange::Drained => {
                    k.ring_ok.store(true, Ordering::SeqCst);
                    self.metrics.capture_restored("ring_full");
                    if k.ring_serves() {
                        self.set_all_modes(CaptureMode::Intercept);
                        self.mark_restored(None);
                        info!("the eBPF ring buffer has room again; leases return to it");
                    } else {
                        self.update_degraded();
                    }
                }
                RingChange::None => {}
            }
        }
    }

    /// The kernel's count of records the ring had no room for.
    fn ring_full_count(&self) -> Option<u64> {
        let k = self.kernel.as_ref()?;
        match lock(&k.dp).counters() {
            Ok(c) => Some(c.ringbuf_full),
            Err(e) => {
                debug!(error = %e, "reading the ring buffer's overflow counter");
                None
            }
        }
    }

    /// The kernel id of the BPF link capturing on `target`.
    pub(crate) fn link_id(&self, target: &AttachTarget) -> Option<u32> {
        let k = self.kernel.as_ref()?;
        lock(&k.dp).link_id(target)
    }

    /// The kernel program's counters, labelled.
    pub(crate) fn kernel_counters(&self) -> Option<Vec<(&'static str, u64)>> {
        let k = self.kernel.as_ref()?;
        match lock(&k.dp).counters() {
            Ok(c) => Some(c.labelled().to_vec()),
            Err(e) => {
                warn!(error = %e, "reading kernel counters");
                None
            }
        }
    }
}

/// What the overflow counter says of the ring buffer (pure: the caller
/// reads the counter and the reader's progress).
#[derive(Debug, Default)]
struct RingHealth {
    /// Set while the ring is taken for full: the reader's drain count when
    /// the counter last rose, and when.
    full: Option<(u64, tokio::time::Instant)>,
}

/// A change of the ring's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RingChange {
    None,
    /// The counter rose by this many (the ring was healthy until now).
    Overflowed(u64),
    /// The reader emptied the ring after the last rise, and the counter
    /// stayed still for [`RING_QUIET`].
    Drained,
}

impl RingHealth {
    /// The counter rose by `rose` since the last call; the reader has found
    /// the ring empty `drained` times so far.
    fn observe(&mut self, rose: u64, drained: u64, now: tokio::time::Instant) -> RingChange {
        if rose > 0 {
            let was_full = self.full.is_some();
            self.full = Some((drained, now));
            return if was_full {
                RingChange::None
            } else {
                RingChange::Overflowed(rose)
            };
        }
        match self.full {
            Some((at_drain, since)) if drained > at_drain && now - since >= RING_QUIET => {
                self.full = None;
                RingChange::Drained
            }
            _ => RingChange::None,
        }
    }
}

/// Why a lost capture path could not be restored (yet).
#[derive(Debug, thiserror::Error)]
enum RestoreError {
    #[error("no eBPF datapath")]
    NoEbpf,
    /// The test suite keeps the reader broken.
    #[cfg(feature = "test-hooks")]
    #[error("injected reader failure")]
    Injected,
    #[error(transparent)]
    Datapath(#[from] crate::datapath::ebpf::EbpfDatapathError),
}

/// A held target's state as `xdhcp status` words it, and its ifindex
/// while it is live.
fn target_state_label(state: Option<TargetState>) -> (&'static str, Option<u32>) {
    match state {
        None => ("off", None),
        Some(TargetState::Pending) => ("pending", None),
        Some(TargetState::Live { ifindex, .. }) => ("live", Some(ifindex)),
        Some(TargetState::Lost | TargetState::Refused) => ("lost", None),
    }
}

/// Whether `ifname` exists in the agent's own namespace.
fn interface_present(ifname: &str) -> bool {
    nix::net::if_::if_nametoindex(ifname).is_ok()
}

fn target_key(t: &AttachTarget) -> String {
    match &t.netns {
        Some(ns) => format!("{} in {}", t.ifname, ns.display()),
        None => t.ifname.clone(),
    }
}

/// Lock a std mutex, ignoring poisoning (the data is plain values).
/// The (transaction id, IAID) of a `DHCPv6` message: its first word, and
/// the first `IA_NA` among its top-level options, as the kernel program
/// finds it (host order).
fn dhcp6_key(payload: &[u8]) -> Option<(u32, u32)> {
    let head = payload.get(..4)?;
    let xid = u32::from_be_bytes([0, head[1], head[2], head[3]]);
    let mut opts = payload.get(4..)?;
    while opts.len() >= 4 {
        let code = u16::from_be_bytes([opts[0], opts[1]]);
        let len = usize::from(u16::from_be_bytes([opts[2], opts[3]]));
        let body = opts.get(4..4 + len)?;
        if code == 3 {
            let iaid = body.get(..4)?;
            return Some((
                xid,
                u32::from_be_bytes([iaid[0], iaid[1], iaid[2], iaid[3]]),
            ));
        }
        opts = &opts[4 + len..];
    }
    None
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests6 {
    use super::dhcp6_key;

    #[test]
    fn a_dhcpv6_message_is_keyed_by_its_transaction_and_first_ia_na() {
        // REPLY 0x0a0b0c: a Server Identifier, then IA_NA 0x01020304.
        let m = [
            7, 0x0a, 0x0b, 0x0c, 0, 2, 0, 2, 9, 9, 0, 3, 0, 12, 1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0, 0,
        ];
        assert_eq!(dhcp6_key(&m), Some((0x000a_0b0c, 0x0102_0304)));
        // No IA_NA, a truncated option, a message too short: no key.
        assert_eq!(dhcp6_key(&m[..10]), None);
        assert_eq!(dhcp6_key(&m[..15]), None);
        assert_eq!(dhcp6_key(&m[..3]), None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_ring_is_healthy_again_only_once_drained_and_quiet() {
        let t0 = tokio::time::Instant::now();
        let mut h = RingHealth::default();
        assert_eq!(h.observe(0, 5, t0), RingChange::None);
        assert_eq!(h.observe(3, 5, t0), RingChange::Overflowed(3));
        // Still rising: no new change.
        assert_eq!(h.observe(2, 5, t0), RingChange::None);
        // Quiet for long, but the reader never caught up (stalled): full.
        assert_eq!(h.observe(0, 5, t0 + RING_QUIET * 3), RingChange::None);
        // Caught up, but not quiet for long enough since the last rise.
        let rose = t0 + RING_QUIET * 3;
        assert_eq!(h.observe(1, 5, rose), RingChange::None);
        assert_eq!(h.observe(0, 6, rose + RING_QUIET / 2), RingChange::None);
        assert_eq!(h.observe(0, 6, rose + RING_QUIET), RingChange::Drained);
        // Healthy again: the next rise is a new overflow.
        assert_eq!(h.observe(0, 9, rose + RING_QUIET * 2), RingChange::None);
        assert_eq!(
            h.observe(1, 9, rose + RING_QUIET * 2),
            RingChange::Overflowed(1)
        );
    }

    #[test]
    fn reconcile_keeps_the_wanted_drops_the_rest_and_makes_the_new() {
        let mut held: Vec<Arc<(u8, &str)>> = vec![Arc::new((1, "kept")), Arc::new((2, "gone"))];
        let kept_before = Arc::clone(&held[0]);
        let (gone, added) = reconcile(&mut held, &[1, 3], |e| &e.0, |s| (s, "new"));
        assert_eq!(gone.iter().map(|e| e.0).collect::<Vec<_>>(), [2]);
        assert_eq!(added.iter().map(|e| e.0).collect::<Vec<_>>(), [3]);
        assert_eq!(held.iter().map(|e| e.0).collect::<Vec<_>>(), [1, 3]);
        assert!(
            Arc::ptr_eq(&held[0], &kept_before),
            "a wanted entry is kept, not remade"
        );
        let (gone, added) = reconcile(&mut held, &[1, 3], |e| &e.0, |s| (s, "new"));
        assert!(
            gone.is_empty() && added.is_empty(),
            "nothing changes when nothing is asked to"
        );
    }
}
