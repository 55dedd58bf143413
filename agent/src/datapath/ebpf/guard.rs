//! The DHCP guard on workload ports, user-space half: loads the guard
//! programs, attaches them to the host end of a workload port (the ingress
//! program always, at TC ingress or, where a packet tap reads the port
//! before TC ingress runs, at XDP; TC egress only where the port's policy
//! learns the guest's exchanges, as the egress program does nothing else),
//! keeps each port's policy in the kernel map, reads the per-port counters
//! and the ring of observed guest exchanges.
//!
//! [`Guard`] is independent of [`super::Datapath`]: it loads its own copy
//! of the embedded object (the capture maps in that copy are shrunk to the
//! minimum, as nothing uses them) so it works whichever capture path the
//! agent uses, AF_PACKET included. With a bpffs its programs are pinned,
//! and taken from their pins by the next agent of the same build, by the
//! capture's rule ([`super::Programs::open`]): that agent neither reads
//! the object nor verifies the programs again.
//!
//! One thing: the guard programs' loader, attachments, policy map, counters
//! and ring, as one object the guard service holds.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use aya::maps::{
    Array, HashMap as BpfHashMap, MapData, MapType, PerCpuArray, PerCpuHashMap, RingBuf,
};
use std::os::fd::AsFd as _;

use aya::EbpfLoader;
use aya::programs::ProgramError;
use aya::programs::tc::{
    NlOptions, SchedClassifierLink, SchedClassifierLinkId, TcAttachOptions, TcAttachType, TcError,
    TcHandle, qdisc_add_clsact,
};
use aya::programs::{SchedClassifier, Xdp};
use xdhcp_common as common;
use xdhcp_common::guard as g;

use super::pin::{PinnedMap, Pinning, pin_maps_in};
use super::ring::Ring;
use super::{AttachTarget, EbpfDatapathError, ProgramSet, Programs, Result, prog};
use crate::datapath::frame::{FrameHeaders, parse_dad_frame, parse_udp_frame, parse_udp6_frame};
use crate::netlink::{XdpHook, set_xdp_here, xdp_prog_here};

/// Where a port's frames from the workload are policed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum GuardHook {
    /// TC ingress (`xdhcp_guard_ingress`): after the device's packet taps.
    /// Where the port's frames go on through the kernel (a Linux bridge, the
    /// kernel datapath of Open vSwitch, routing) TC ingress runs before
    /// anything forwards them.
    Tc,
    /// XDP (`xdhcp_guard_xdp`, in the generic receive path: see
    /// [`XDP_PORT_MODE`]): before the packet taps. For a port something reads
    /// through a packet socket, as `ovs-vswitchd` reads the ports of a
    /// userspace-datapath bridge: a frame dropped at TC ingress has already
    /// been copied to that socket.
    Xdp,
}

impl GuardHook {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Tc => "tc",
            Self::Xdp => "xdp",
        }
    }
}

impl std::fmt::Display for GuardHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A workload port's guard policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortPolicy {
    /// DHCP server messages from the workload pass (a server or relay pod).
    pub trusted: bool,
    /// Client messages per second (0: unlimited).
    pub rate: u32,
    /// Client messages a quiet port may send back to back.
    pub burst: u32,
    /// The one client allowed behind the port (a pod interface's MAC, a
    /// VM's MAC): client messages with another Ethernet source, `chaddr` or
    /// type-1 client identifier are dropped.
    pub single_client: Option<[u8; 6]>,
    /// Copy the port's DHCP exchanges to the guard ring (passive learning;
    /// needs `single_client` for the MAC replies are matched against), and
    /// have the replies to a client without an address broadcast (the
    /// BOOTP broadcast flag on its DISCOVER and REQUEST).
    pub learn: bool,
}

impl Default for PortPolicy {
    fn default() -> Self {
        Self {
            trusted: false,
            rate: g::GUARD_DEFAULT_RATE,
            burst: g::GUARD_DEFAULT_BURST,
            single_client: None,
            learn: false,
        }
    }
}

impl PortPolicy {
    /// Whether the port needs the egress program: it only copies replies
    /// towards a learning port's one client to the guard ring.
    pub fn needs_egress(&self) -> bool {
        self.learn && self.single_client.is_some()
    }

    /// The kernel map entry for this policy.
    pub fn entry(&self) -> g::GuardPort {
        let mut flags = 0;
        if self.trusted {
            flags |= g::GUARD_TRUSTED;
        }
        if self.single_client.is_some() {
            flags |= g::GUARD_SINGLE_CLIENT;
            if self.learn {
                // A learning port is a VM's: its guest's own client may be
                // offered an address its port security does not pass
                // unicast; replies by broadcast do pass.
                flags |= g::GUARD_LEARN | g::GUARD_BROADCAST;
            }
        }
        g::GuardPort::new(
            flags,
            self.single_client.unwrap_or([0; 6]),
            self.rate,
            self.burst,
        )
    }
}

/// A port's counters, summed over CPUs. The first nine count DHCPv4, the
/// rest IPv6 (DHCPv6, router advertisements, redirects).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct GuardCounters {
    pub passed_client: u64,
    pub passed_trusted_server: u64,
    pub dropped_server: u64,
    pub dropped_rate: u64,
    pub dropped_spoof: u64,
    pub dropped_malformed: u64,
    pub learned: u64,
    pub learn_lost: u64,
    pub dropped_unclassified: u64,
    /// DHCPv6 client messages passed.
    pub passed_client_v6: u64,
    /// DHCPv6 server messages, router advertisements and redirects passed
    /// on a trusted port.
    pub passed_trusted_v6: u64,
    pub dropped_server_v6: u64,
    pub dropped_rate_v6: u64,
    pub dropped_spoof_v6: u64,
    pub dropped_malformed_v6: u64,
    pub dropped_unclassified_v6: u64,
    /// Router advertisements (ICMPv6 134) from an untrusted port.
    pub dropped_router_advertisement: u64,
    /// Redirects (ICMPv6 137) from an untrusted port.
    pub dropped_redirect: u64,
}

/// One drop figure of a port: (family, reason, frames).
pub type GuardDrop = (&'static str, &'static str, u64);

impl GuardCounters {
    fn from_slots(s: &[u64; g::GUARD_COUNTER_SLOTS]) -> Self {
        Self {
            passed_client: s[g::GUARD_PASSED_CLIENT],
            passed_trusted_server: s[g::GUARD_PASSED_TRUSTED_SERVER],
            dropped_server: s[g::GUARD_DROPPED_SERVER],
            dropped_rate: s[g::GUARD_DROPPED_RATE],
            dropped_spoof: s[g::GUARD_DROPPED_SPOOF],
            dropped_malformed: s[g::GUARD_DROPPED_MALFORMED],
            learned: s[g::GUARD_LEARNED],
            learn_lost: s[g::GUARD_LEARN_LOST],
            dropped_unclassified: s[g::GUARD_DROPPED_UNCLASSIFIED],
            passed_client_v6: s[g::GUARD_PASSED_CLIENT6],
            passed_trusted_v6: s[g::GUARD_PASSED_TRUSTED6],
            dropped_server_v6: s[g::GUARD_DROPPED_SERVER6],
            dropped_rate_v6: s[g::GUARD_DROPPED_RATE6],
            dropped_spoof_v6: s[g::GUARD_DROPPED_SPOOF6],
            dropped_malformed_v6: s[g::GUARD_DROPPED_MALFORMED6],
            dropped_unclassified_v6: s[g::GUARD_DROPPED_UNCLASSIFIED6],
            dropped_router_advertisement: s[g::GUARD_DROPPED_RA],
            dropped_redirect: s[g::GUARD_DROPPED_REDIRECT],
        }
    }

    /// Drops by family and reason label, for metrics: the reasons that
    /// mean the same for both families share their label.
    pub fn drops(&self) -> [GuardDrop; 12] {
        [
            ("ipv4", "server", self.dropped_server),
            ("ipv4", "rate", self.dropped_rate),
            ("ipv4", "spoof", self.dropped_spoof),
            ("ipv4", "malformed", self.dropped_malformed),
            ("ipv4", "unclassified", self.dropped_unclassified),
            ("ipv6", "server", self.dropped_server_v6),
            ("ipv6", "rate", self.dropped_rate_v6),
            ("ipv6", "spoof", self.dropped_spoof_v6),
            ("ipv6", "malformed", self.dropped_malformed_v6),
            ("ipv6", "unclassified", self.dropped_unclassified_v6),
            (
                "ipv6",
                "router_advertisement",
                self.dropped_router_advertisement,
            ),
            ("ipv6", "redirect", self.dropped_redirect),
        ]
    }

    /// Client messages passed by family, for metrics.
    pub fn passed(&self) -> [(&'static str, u64); 2] {
        [
            ("ipv4", self.passed_client),
            ("ipv6", self.passed_client_v6),
        ]
    }
}

/// The learning ports' replies that were not copied to the guard ring,
/// summed over CPUs and ports (the kernel's `LEARN_*` counters).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct LearnCounters {
    /// ACKs over the port's reply bucket.
    pub shed: u64,
    /// Replies learning does not use (not an ACK).
    pub unused: u64,
}

impl LearnCounters {
    /// `(reason, value)` pairs for metrics.
    pub fn labelled(&self) -> [(&'static str, u64); 2] {
        [("shed_rate", self.shed), ("not_learned", self.unused)]
    }
}

/// Which way an observed exchange went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// A client message the workload sent (and the guard passed).
    FromWorkload,
    /// A server reply sent to the workload.
    ToWorkload,
}

/// One observed DHCP or DHCPv6 message on a learning port, undecoded.
#[derive(Debug, Clone)]
pub struct GuardEvent {
    /// ifindex of the guarded port (host side).
    pub ifindex: u32,
    pub direction: Direction,
    /// `CLOCK_MONOTONIC` at tick resolution, at the observation.
    pub ts_ns: u64,
    /// The frame's addresses: IPv4 for a DHCPv4 message, IPv6 for a
    /// DHCPv6 one or a duplicate address detection probe.
    pub headers: FrameHeaders<IpAddr>,
    /// The DHCP or DHCPv6 message; a probe's target address (16 bytes).
    pub payload: Vec<u8>,
    /// What the record carries.
    pub carried: Carried,
}

/// What a guard record carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carried {
    Dhcp4,
    Dhcp6,
    /// A duplicate address detection probe (a neighbour solicitation from
    /// `::`): the guest is about to use its target, configured by itself.
    Dad6,
}

impl GuardEvent {
    /// The DHCPv4 message as the learner sees it (who sent it which way,
    /// from where); `None` for a DHCPv6 one.
    pub(crate) fn seen(&self) -> Option<crate::bindings::learner::Seen<'_>> {
        let IpAddr::V4(src_ip) = self.headers.src_ip else {
            return None;
        };
        Some(crate::bindings::learner::Seen {
            direction: self.way(),
            src_mac: self.headers.src_mac,
            src_ip,
            payload: &self.payload,
        })
    }

    /// The DHCPv6 message as the learner sees it; `None` for a DHCPv4 one.
    pub(crate) fn seen6(&self) -> Option<crate::bindings::learner6::Seen6<'_>> {
        let (Carried::Dhcp6, IpAddr::V6(src_ip)) = (self.carried, self.headers.src_ip) else {
            return None;
        };
        Some(crate::bindings::learner6::Seen6 {
            direction: self.way(),
            src_mac: self.headers.src_mac,
            src_ip,
            payload: &self.payload,
        })
    }

    /// The address a duplicate address detection probe is for; `None` for
    /// a DHCP message.
    pub(crate) fn dad_target(&self) -> Option<std::net::Ipv6Addr> {
        let octets: [u8; 16] = self.payload.as_slice().try_into().ok()?;
        (self.carried == Carried::Dad6).then(|| octets.into())
    }

    fn way(&self) -> crate::bindings::learner::Direction {
        use crate::bindings::learner::Direction as Way;
        match self.direction {
            Direction::FromWorkload => Way::FromGuest,
            Direction::ToWorkload => Way::ToGuest,
        }
    }
}

/// The frame's headers with its addresses of either family.
fn any_family<A: Into<IpAddr>>(h: FrameHeaders<A>) -> FrameHeaders<IpAddr> {
    FrameHeaders {
        src_mac: h.src_mac,
        dst_mac: h.dst_mac,
        vlan: h.vlan,
        src_ip: h.src_ip.into(),
        dst_ip: h.dst_ip.into(),
        src_port: h.src_port,
        dst_port: h.dst_port,
    }
}

/// Why a guard ring record could not become a [`GuardEvent`].
#[derive(Debug, thiserror::Error)]
pub enum GuardRecordError {
    #[error("guard record of {len} bytes, expected {min}..={max}")]
    Size { len: usize, min: usize, max: usize },
    #[error("guard record claims {captured_len} captured bytes (room for {max})")]
    CapturedLen { captured_len: u32, max: usize },
    #[error("guard record direction {0} unknown")]
    Direction(u16),
    /// A record layout this agent does not read (skipped and counted).
    #[error("guard record kind {0} unknown")]
    Kind(u16),
    #[error("observed frame: {0}")]
    Frame(#[from] crate::datapath::frame::FrameError),
}

/// Decodes one guard ring record.
pub fn decode_guard_record(bytes: &[u8]) -> Result<GuardEvent, GuardRecordError> {
    let max_frame = g::GUARD_BUCKETS[g::GUARD_BUCKETS.len() - 1];
    let (min, max) = (g::GUARD_HEADER_LEN, g::GUARD_HEADER_LEN + max_frame);
    if bytes.len() < min || bytes.len() > max {
        return Err(GuardRecordError::Size {
            len: bytes.len(),
            min,
            max,
        });
    }
    let (head, frame) = bytes.split_at(g::GUARD_HEADER_LEN);
    // SAFETY: `head` has exactly size_of::<GuardHeader>() bytes of a Pod
    // made of integers.
    let h: g::GuardHeader = unsafe { std::ptr::read_unaligned(head.as_ptr().cast()) };
    let captured = h.captured_len as usize;
    if captured > frame.len() {
        return Err(GuardRecordError::CapturedLen {
            captured_len: h.captured_len,
            max: frame.len(),
        });
    }
    let direction = match h.direction {
        g::GUARD_FROM_WORKLOAD => Direction::FromWorkload,
        g::GUARD_TO_WORKLOAD => Direction::ToWorkload,
        other => return Err(GuardRecordError::Direction(other)),
    };
    let frame = &frame[..captured];
    let (carried, headers, payload) = match h.kind {
        g::GUARD_KIND_DHCP4 => {
            let (h, p) = parse_udp_frame(frame)?;
            (Carried::Dhcp4, any_family(h), p.to_vec())
        }
        g::GUARD_KIND_DHCP6 => {
            let (h, p) = parse_udp6_frame(frame)?;
            (Carried::Dhcp6, any_family(h), p.to_vec())
        }
        g::GUARD_KIND_DAD6 if h.direction == g::GUARD_FROM_WORKLOAD => {
            let (h, target) = parse_dad_frame(frame)?;
            (Carried::Dad6, any_family(h), target.octets().to_vec())
        }
        other => return Err(GuardRecordError::Kind(other)),
    };
    Ok(GuardEvent {
        carried,
        ifindex: h.ifindex,
        direction,
        ts_ns: h.ts_ns,
        headers,
        payload,
    })
}

/// Async reader of the guard ring.
pub struct GuardReader {
    ring: Ring,
    /// Records that did not decode (logged and skipped).
    pub rejected: u64,
}

impl std::fmt::Debug for GuardReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardReader")
            .field("rejected", &self.rejected)
            .finish_non_exhaustive()
    }
}

impl GuardReader {
    /// Waits for the next observed exchange.
    pub async fn recv(&mut self) -> Result<GuardEvent> {
        let rejected = &mut self.rejected;
        self.ring.recv(|item| Self::take(item, rejected)).await
    }

    /// The next observed exchange already in the ring, without waiting.
    pub fn try_recv(&mut self) -> Option<GuardEvent> {
        let rejected = &mut self.rejected;
        self.ring.try_recv(|item| Self::take(item, rejected))
    }

    /// One record: an exchange, or a malformed record counted and skipped.
    fn take(item: &[u8], rejected: &mut u64) -> Option<GuardEvent> {
        match decode_guard_record(item) {
            Ok(ev) => Some(ev),
            Err(e) => {
                tracing::debug!(error = %e, "dropping malformed guard record");
                *rejected += 1;
                None
            }
        }
    }
}

/// A port's ingress program: a TC filter, or XDP attached through netlink
/// (no BPF link: like the filter, it stays when the agent stops).
#[derive(Debug)]
enum Ingress {
    Tc(SchedClassifierLinkId),
    Xdp(XdpHook),
}

impl Ingress {
    const fn hook(&self) -> GuardHook {
        match self {
            Self::Tc(_) => GuardHook::Tc,
            Self::Xdp(_) => GuardHook::Xdp,
        }
    }
}

/// A guarded port: where, its ingress program and its TC egress link
/// (only when learning).
struct GuardedPort {
    ifindex: u32,
    ingress: Ingress,
    egress: Option<SchedClassifierLinkId>,
}

impl GuardedPort {
    /// Its TC filters.
    fn links(self) -> impl Iterator<Item = (&'static str, SchedClassifierLinkId)> {
        let ingress = match self.ingress {
            Ingress::Tc(id) => Some((g::PROG_GUARD_INGRESS, id)),
            Ingress::Xdp(_) => None,
        };
        ingress
            .into_iter()
            .chain(self.egress.map(|id| (g::PROG_GUARD_EGRESS, id)))
    }
}

/// How the guard's XDP program goes on a port (one an earlier agent left
/// stays in its own mode). Generic: it runs in `__netif_receive_skb_core`
/// before the packet taps, as a veth's driver program does, and with the
/// program attached once for good ([`XdpKeeper`]) going on and coming off
/// a port costs no kernel wait. Native XDP on a veth sets up and tears
/// down the device's NAPI rings on every attach and detach (the detach
/// waits for an RCU grace period: 30–70 ms measured on a loaded 2-core
/// host, against 0.01 ms for generic), and either mode's first program
/// rewrites the XDP dispatcher and waits for a grace period again.
pub(crate) const XDP_PORT_MODE: XdpHook = XdpHook::Generic;

/// One attachment of the guard's XDP program held for as long as the guard
/// is loaded: generic XDP on the loopback of a network namespace of its
/// own, which nothing else uses and which goes (with the attachment) when
/// the last handle to it closes, whether the agent stops or is killed.
///
/// Why: the kernel's XDP dispatcher (used by every XDP attachment but
/// offloaded ones) is rewritten whenever the set of attached programs
/// changes, and each rewrite waits for an RCU grace period; the generic
/// path's static key is switched on with the first generic program and
/// off with the last, each a text patch. With one instance always
/// attached, a port's attach and detach change neither: measured on this
/// project's 2-core test host under load, 12–48 ms per attach and 15–48 ms
/// per detach without it, 0.01 ms each with it.
struct XdpKeeper {
    netns: std::os::fd::OwnedFd,
}

impl XdpKeeper {
    /// A namespace of its own with `prog` on its loopback.
    fn start(prog: std::os::fd::BorrowedFd<'_>) -> std::io::Result<Self> {
        std::thread::scope(|s| {
            s.spawn(move || -> std::io::Result<Self> {
                // This thread alone moves; the namespace stays while its
                // handle is open.
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(std::io::Error::from)?;
                let netns: std::os::fd::OwnedFd =
                    std::fs::File::open("/proc/thread-self/ns/net")?.into();
                let lo = nix::net::if_::if_nametoindex("lo").map_err(std::io::Error::from)?;
                set_xdp_here(lo, Some(prog), XdpHook::Generic)?;
                Ok(Self { netns })
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// The id of the program on the keeper's loopback, as the kernel says.
    fn program(&self) -> std::io::Result<Option<u32>> {
        use std::os::fd::AsRawFd as _;
        let path = std::path::PathBuf::from(format!("/proc/self/fd/{}", self.netns.as_raw_fd()));
        crate::sys::netns::run_in_netns(&path, || {
            let lo = nix::net::if_::if_nametoindex("lo").map_err(std::io::Error::from)?;
            Ok(xdp_prog_here(lo)?.map(|(id, _)| id))
        })
        .map_err(std::io::Error::other)?
    }
}

/// The subdirectory of `--bpffs-dir` the guard pins its maps in (its own
/// directory: the capture's scan of `links/` and its map checks never see
/// them).
pub const GUARD_PIN_DIR: &str = "guard";

/// The guard's maps, pinned by name in [`GUARD_PIN_DIR`] (the definitions
/// of `ebpf/src/guard.rs`, from the same constants). Pinned, they are the
/// same maps across agent restarts: the filters an earlier agent left keep
/// policing with them while no agent runs, and the next agent's programs,
/// which replace those filters in place, read the very same entries — each
/// port's settings, its single client's MAC, its rate bucket, its counters.
pub const GUARD_PINNED_MAPS: [PinnedMap; 6] = [
    PinnedMap {
        name: g::MAP_GUARD_PORTS,
        map_type: MapType::Hash,
        key_size: 4,
        value_size: size_of::<g::GuardPort>() as u32,
        max_entries: g::GUARD_PORTS_CAPACITY,
    },
    PinnedMap {
        name: g::MAP_GUARD_COUNTERS,
        map_type: MapType::PerCpuHash,
        key_size: 4,
        value_size: size_of::<g::GuardCounters>() as u32,
        max_entries: g::GUARD_PORTS_CAPACITY,
    },
    PinnedMap {
        name: g::MAP_GUARD_EVENTS,
        map_type: MapType::RingBuf,
        key_size: 0,
        value_size: 0,
        max_entries: g::GUARD_EVENTS_BYTES,
    },
    PinnedMap {
        name: g::MAP_LEARN_BUCKETS,
        map_type: MapType::Hash,
        key_size: 4,
        value_size: size_of::<g::LearnBucket>() as u32,
        max_entries: g::GUARD_PORTS_CAPACITY,
    },
    PinnedMap {
        name: g::MAP_LEARN_LIMIT,
        map_type: MapType::Array,
        key_size: 4,
        value_size: size_of::<g::LearnLimit>() as u32,
        max_entries: 1,
    },
    PinnedMap {
        name: g::MAP_LEARN_COUNTERS,
        map_type: MapType::PerCpuArray,
        key_size: 4,
        value_size: 8,
        max_entries: g::LEARN_COUNTER_SLOTS,
    },
];

/// The guard's TC programs: ingress and egress (with `test-hooks`, the
/// do-nothing baseline too).
#[cfg(not(feature = "test-hooks"))]
const GUARD_TC_PROGRAMS: [&str; 2] = [g::PROG_GUARD_INGRESS, g::PROG_GUARD_EGRESS];
#[cfg(feature = "test-hooks")]
const GUARD_TC_PROGRAMS: [&str; 3] = [
    g::PROG_GUARD_INGRESS,
    g::PROG_GUARD_EGRESS,
    g::PROG_GUARD_PASS,
];

/// The guard's programs: loaded, pinned in `guard/progs/<stamp>` and taken
/// from those pins by the next agent of the same build by the capture's
/// rule ([`Programs::open`]). The XDP twin of the ingress program is
/// needed only on userspace-datapath OVS ports: a kernel that refuses it
/// leaves the TC pair working.
const GUARD_PROGRAMS: ProgramSet = ProgramSet {
    what: "DHCP guard",
    tc: &GUARD_TC_PROGRAMS,
    xdp: &[g::PROG_GUARD_XDP],
};

/// Makes the guard's maps as small as the kernel allows in a copy of the
/// object whose guard programs are not used (the capture's).
pub(super) fn shrink_guard_maps(loader: &mut EbpfLoader) {
    let page = u32::try_from(page_size()).unwrap_or(4096);
    loader
        .map_max_entries(g::MAP_GUARD_PORTS, 1)
        .map_max_entries(g::MAP_GUARD_COUNTERS, 1)
        .map_max_entries(g::MAP_GUARD_EVENTS, page)
        .map_max_entries(g::MAP_LEARN_BUCKETS, 1)
        .map_max_entries(g::MAP_LEARN_COUNTERS, 1);
}

/// The loaded guard programs and their maps.
pub struct Guard {
    ebpf: Programs,
    ports: BpfHashMap<MapData, u32, g::GuardPort>,
    counters: PerCpuHashMap<MapData, u32, g::GuardCounters>,
    events: Option<RingBuf<MapData>>,
    learn_buckets: BpfHashMap<MapData, u32, g::LearnBucket>,
    learn_limit: Array<MapData, g::LearnLimit>,
    learn_counters: PerCpuArray<MapData, u64>,
    attached: HashMap<AttachTarget, GuardedPort>,
    /// Why the XDP program did not load (the kernel refused it): ports
    /// that need XDP are then guarded at TC ingress, with a warning.
    xdp_unavailable: Option<String>,
    /// The XDP program held attached while the guard is loaded, so ports
    /// gain and lose it cheaply (`None`: XDP did not load, or the keeper
    /// could not be set up, said in the log: attaches then pay the kernel's
    /// waits).
    keeper: Option<XdpKeeper>,
    /// Whether and where the maps are pinned.
    pinning: Pinning,
    /// Ports an earlier agent guarded (their entries were in the pinned
    /// port table when this one loaded) that this one has not guarded
    /// again yet; [`Guard::release_unclaimed`] takes the guard off those
    /// left over.
    inherited: BTreeSet<u32>,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("attached", &self.attached.len())
            .finish_non_exhaustive()
    }
}

/// The guard stays on its ports when the agent stops, whether it exits or
/// is killed (a filter, and an XDP program attached through netlink, holds
/// its program and maps): ports are never left unguarded while the agent
/// restarts, and the restarted agent replaces the programs as it guards
/// the ports of the leases it resumes ([`attach_tc`], [`attach_xdp`]). A
/// stop therefore does no netlink work per port.
impl Drop for Guard {
    fn drop(&mut self) {
        for port in std::mem::take(&mut self.attached).into_values() {
            for (name, id) in port.links() {
                if let Ok(p) = prog::<SchedClassifier>(&mut self.ebpf, name)
                    && let Ok(link) = p.take_link(id)
                {
                    std::mem::forget(link);
                }
            }
        }
    }
}

/// Attached guard ports, for status reporting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardedPortInfo {
    pub target: AttachTarget,
    pub ifindex: u32,
    pub hook: GuardHook,
    pub policy: Option<g::GuardPort>,
}

impl Guard {
    /// Loads the guard programs from the embedded object, with no map
    /// pinned: the ports this guard protects start from empty tables.
    pub fn load() -> Result<Self> {
        Self::load_with(Pinning::Off {
            reason: "not asked to pin".to_owned(),
        })
    }

    /// Like [`Guard::load`], with the maps of [`GUARD_PINNED_MAPS`] pinned
    /// in `bpffs_dir/guard` when `bpffs_dir` is (or its parent is, and it
    /// can be made) on a bpffs mount; the pins a previous agent left there
    /// with the right definitions are reused, so its ports' settings,
    /// buckets and counters carry on ([`Guard::release_unclaimed`] drops
    /// those of ports this agent does not guard again). Elsewhere nothing
    /// is pinned and the log says why.
    pub fn load_pinned(bpffs_dir: &Path) -> Result<Self> {
        let pinning = match pin_maps_in(bpffs_dir, &[]) {
            off @ Pinning::Off { .. } => off,
            Pinning::On { .. } => pin_maps_in(&bpffs_dir.join(GUARD_PIN_DIR), &GUARD_PINNED_MAPS),
        };
        match &pinning {
            Pinning::Off { reason } => {
                tracing::info!(dir = %bpffs_dir.display(), %reason, "DHCP guard maps not pinned");
            }
            Pinning::On {
                dir,
                reused,
                replaced,
            } => tracing::info!(dir = %dir.display(), ?reused, ?replaced, "DHCP guard maps pinned"),
        }
        Self::load_with(pinning)
    }

    fn load_with(pinning: Pinning) -> Result<Self> {
        // The capture maps of this copy of the object are never used: keep
        // them as small as the kernel allows.
        let (mut ebpf, xdp_unavailable) =
            Programs::open(&GUARD_PROGRAMS, &pinning, &GUARD_PINNED_MAPS, |loader| {
                let page = u32::try_from(page_size()).unwrap_or(4096);
                loader
                    .map_max_entries(common::MAP_EVENTS, page)
                    .map_max_entries(common::MAP_OWNED, 1)
                    .map_max_entries(common::MAP_IFCONFIG, 1)
                    .map_max_entries(common::MAP_IFCONFIG_DIRECT, 1)
                    .map_max_entries(common::MAP_UPLINKS, 1);
            })?;
        let name = g::PROG_GUARD_XDP;
        if let Some(reason) = &xdp_unavailable {
            // The XDP program is needed only on userspace-datapath OVS
            // ports: a kernel that refuses it leaves the TC pair working.
            tracing::warn!(reason = %reason,
                "the DHCP guard's XDP program did not load; ports of userspace-datapath OVS bridges are guarded at TC ingress, which OVS reads around");
        }
        let keeper = if xdp_unavailable.is_none() {
            let prog: &mut Xdp = prog(&mut ebpf, name)?;
            let kept = prog
                .fd()
                .map_err(std::io::Error::other)
                .and_then(|fd| XdpKeeper::start(fd.as_fd()));
            match kept {
                Ok(k) => Some(k),
                Err(e) => {
                    tracing::warn!(error = %e,
                        "could not keep the DHCP guard's XDP program attached; each port's XDP attach and detach waits for the kernel");
                    None
                }
            }
        } else {
            None
        };
        let ports = ebpf.take_map(g::MAP_GUARD_PORTS)?;
        let counters = ebpf.take_map(g::MAP_GUARD_COUNTERS)?;
        let events = ebpf.take_map(g::MAP_GUARD_EVENTS)?;
        let learn_buckets = ebpf.take_map(g::MAP_LEARN_BUCKETS)?;
        let learn_limit = ebpf.take_map(g::MAP_LEARN_LIMIT)?;
        let learn_counters = ebpf.take_map(g::MAP_LEARN_COUNTERS)?;
        let inherited: BTreeSet<u32> = match &pinning {
            Pinning::On { reused, .. } if reused.contains(&g::MAP_GUARD_PORTS) => {
                let ports: &BpfHashMap<MapData, u32, g::GuardPort> = &ports;
                ports.keys().filter_map(std::result::Result::ok).collect()
            }
            _ => BTreeSet::new(),
        };
        if !inherited.is_empty() {
            tracing::info!(ports = ?inherited,
                "found the ports an earlier agent guarded in the pinned table; their settings carry on as each is guarded again");
        }
        Ok(Self {
            ebpf,
            ports,
            counters,
            events: Some(events),
            learn_buckets,
            learn_limit,
            learn_counters,
            attached: HashMap::new(),
            xdp_unavailable,
            keeper,
            pinning,
            inherited,
        })
    }

    /// Where the guard's maps are pinned, if they are.
    pub fn pinning(&self) -> &Pinning {
        &self.pinning
    }

    /// The ports an earlier agent guarded that this one has not guarded
    /// again (yet).
    pub fn unclaimed_ports(&self) -> Vec<u32> {
        self.inherited.iter().copied().collect()
    }

    /// Takes the guard off the ports an earlier agent guarded and this one
    /// did not guard again (their workload went while no agent ran, or is
    /// not this agent's any more): their programs come off, if their
    /// device is still there, and their entries go from the pinned tables.
    /// Call once the ports of the resumed leases and of Open vSwitch are
    /// guarded. Returns the ifindexes released.
    pub fn release_unclaimed(&mut self) -> Vec<u32> {
        let left = std::mem::take(&mut self.inherited);
        for &ifindex in &left {
            remove_guard_programs(ifindex);
            self.forget(ifindex);
        }
        left.into_iter().collect()
    }

    /// Takes the reader of observed exchanges (once).
    pub fn take_reader(&mut self) -> Result<Option<GuardReader>> {
        let Some(ring) = self.events.take() else {
            return Ok(None);
        };
        Ok(Some(GuardReader {
            ring: Ring::new(ring)?,
            rejected: 0,
        }))
    }

    /// Guards `target` (the host end of a workload port) with `policy`, its
    /// frames from the workload policed at TC ingress
    /// ([`Guard::attach_at`] with [`GuardHook::Tc`]).
    pub fn attach(&mut self, target: &AttachTarget, policy: &PortPolicy) -> Result<u32> {
        self.attach_at(target, policy, GuardHook::Tc)
    }

    /// Guards `target` (the host end of a workload port) with `policy`,
    /// its frames from the workload policed at `hook`: the policy is in
    /// the map before the programs are attached, so the first frame is
    /// already policed. Returns the port's ifindex.
    ///
    /// A port gets the ingress program, and the egress one only when its
    /// policy learns: the egress program runs on every frame towards the
    /// workload, and for a port that does not learn it only parses the
    /// frame and passes it.
    pub fn attach_at(
        &mut self,
        target: &AttachTarget,
        policy: &PortPolicy,
        hook: GuardHook,
    ) -> Result<u32> {
        if self.attached.contains_key(target) {
            return Err(EbpfDatapathError::AlreadyAttached {
                ifname: target.ifname.clone(),
                mode: attach_mode(hook),
            });
        }
        let hook = self.usable(hook, &target.ifname);
        let ifname = target.ifname.clone();
        let ifindex = in_netns(target.netns.as_deref(), || {
            nix::net::if_::if_nametoindex(ifname.as_str()).map_err(|e| {
                EbpfDatapathError::NoInterface {
                    ifname: ifname.clone(),
                    source: e.into(),
                }
            })
        })??;
        self.set_policy(ifindex, policy)?;
        if target.netns.is_none() {
            self.inherited.remove(&ifindex);
        }
        let ebpf = &mut self.ebpf;
        let ifname = target.ifname.clone();
        let egress = policy.needs_egress();
        let links = in_netns(target.netns.as_deref(), move || {
            // Fails when the port has one already (a previous agent's guard,
            // or another user of clsact), which is fine; a port that cannot
            // have one fails the attach below.
            let _ = qdisc_add_clsact(&ifname);
            let (ingress, replaced) = attach_ingress(ebpf, &ifname, ifindex, hook)?;
            if !egress {
                // An earlier agent (or policy) may have left an egress
                // filter; only a port that had an ingress program can have it.
                if replaced {
                    remove_left_filter(&ifname, TcAttachType::Egress);
                }
                return Ok((ingress, None));
            }
            match attach_tc(ebpf, g::PROG_GUARD_EGRESS, &ifname, TcAttachType::Egress) {
                Ok((egress, _)) => Ok((ingress, Some(egress))),
                Err(e) => {
                    if let Err(undo) = detach_ingress(ebpf, ingress, &ifname, ifindex) {
                        tracing::warn!(ifname, error = %undo,
                            "could not take the guard's ingress program off after the egress attach failed");
                    }
                    Err(e)
                }
            }
        })
        .and_then(|r| r);
        let (ingress, egress) = match links {
            Ok(l) => l,
            Err(e) => {
                self.forget(ifindex);
                return Err(e);
            }
        };
        tracing::info!(ifname = %target.ifname, netns = ?target.netns, ifindex, ?policy,
            %hook, egress = egress.is_some(), "DHCP guard attached");
        self.attached.insert(
            target.clone(),
            GuardedPort {
                ifindex,
                ingress,
                egress,
            },
        );
        Ok(ifindex)
    }

    /// Moves the attached port `target`'s ingress program to `hook`: the
    /// new program is attached before the old one is taken off, so the
    /// port is never bare (for that moment both police it). Nothing to do
    /// when it is there already.
    pub fn rehook(&mut self, target: &AttachTarget, hook: GuardHook) -> Result<()> {
        let Some(port) = self.attached.get(target) else {
            return Err(EbpfDatapathError::NotAttached {
                ifname: target.ifname.clone(),
            });
        };
        let from = port.ingress.hook();
        let hook = self.usable(hook, &target.ifname);
        if from == hook {
            return Ok(());
        }
        let Some(mut port) = self.attached.remove(target) else {
            unreachable!("looked up just above")
        };
        let ifindex = port.ifindex;
        let ebpf = &mut self.ebpf;
        let ifname = target.ifname.clone();
        let res = in_netns(target.netns.as_deref(), || {
            let _ = qdisc_add_clsact(&ifname);
            let (new, _) = attach_ingress(ebpf, &ifname, ifindex, hook)?;
            // attach_ingress at XDP removes the TC filter it finds (the
            // one this port had); at TC the XDP program is taken off here.
            let old = std::mem::replace(&mut port.ingress, new);
            match old {
                Ingress::Xdp(_) => detach_ingress(ebpf, old, &ifname, ifindex),
                Ingress::Tc(id) => {
                    // Already gone with the filter; the program's table
                    // forgets it.
                    if let Ok(p) = prog::<SchedClassifier>(ebpf, g::PROG_GUARD_INGRESS)
                        && let Ok(link) = p.take_link(id)
                    {
                        std::mem::forget(link);
                    }
                    Ok(())
                }
            }
        })
        .and_then(|r| r);
        self.attached.insert(target.clone(), port);
        res?;
        tracing::info!(ifname = %target.ifname, netns = ?target.netns, ifindex,
            %from, to = %hook, "DHCP guard moved to another hook");
        Ok(())
    }

    /// `hook`, or TC ingress when it is XDP and the XDP program did not
    /// load (said in the log).
    fn usable(&self, hook: GuardHook, ifname: &str) -> GuardHook {
        match (&self.xdp_unavailable, hook) {
            (Some(reason), GuardHook::Xdp) => {
                tracing::warn!(ifname, reason = %reason,
                    "this port needs the DHCP guard at XDP, which did not load; guarding it at TC ingress");
                GuardHook::Tc
            }
            _ => hook,
        }
    }

    /// Whether ports can be guarded at XDP (the kernel took the program).
    pub fn xdp_available(&self) -> bool {
        self.xdp_unavailable.is_none()
    }

    /// Where the attached port `target` is policed.
    pub fn hook(&self, target: &AttachTarget) -> Option<GuardHook> {
        self.attached.get(target).map(|p| p.ingress.hook())
    }

    /// How the attached port `target`'s XDP program is attached (`None`:
    /// not attached, or policed at TC).
    pub fn xdp_mode(&self, target: &AttachTarget) -> Option<XdpHook> {
        match self.attached.get(target)?.ingress {
            Ingress::Xdp(mode) => Some(mode),
            Ingress::Tc(_) => None,
        }
    }

    /// The id of the XDP program the guard keeps attached outside any port
    /// ([`XdpKeeper`]), as the kernel reports it; `None` when there is no
    /// keeper.
    pub fn kept_xdp_program(&self) -> Result<Option<u32>> {
        let Some(k) = &self.keeper else {
            return Ok(None);
        };
        k.program().map_err(|source| EbpfDatapathError::AttachXdp {
            ifname: "lo (the guard's own namespace)".to_owned(),
            source,
        })
    }

    /// Gives the attached port `target` a new policy, adding or removing
    /// its egress filter as the policy needs. Returns the port's ifindex.
    pub fn update(&mut self, target: &AttachTarget, policy: &PortPolicy) -> Result<u32> {
        let port = self
            .attached
            .get(target)
            .ok_or_else(|| EbpfDatapathError::NotAttached {
                ifname: target.ifname.clone(),
            })?;
        let (ifindex, has) = (port.ifindex, port.egress.is_some());
        let wants = policy.needs_egress();
        self.set_policy(ifindex, policy)?;
        if wants == has {
            return Ok(ifindex);
        }
        let ifname = target.ifname.clone();
        if wants {
            let ebpf = &mut self.ebpf;
            let id = in_netns(target.netns.as_deref(), move || {
                attach_tc(ebpf, g::PROG_GUARD_EGRESS, &ifname, TcAttachType::Egress)
            })??
            .0;
            if let Some(port) = self.attached.get_mut(target) {
                port.egress = Some(id);
            }
        } else if let Some(id) = self.attached.get_mut(target).and_then(|p| p.egress.take()) {
            let ebpf = &mut self.ebpf;
            in_netns(target.netns.as_deref(), move || {
                detach_tc(ebpf, g::PROG_GUARD_EGRESS, id, &ifname)
            })??;
        }
        Ok(ifindex)
    }

    /// Sets how many replies per second (`rate`) and back to back
    /// (`burst`) each learning port may copy to the guard ring; values are
    /// kept within 1..=[`g::LEARN_MAX`] (burst) and 0..=[`g::LEARN_MAX`]
    /// (rate). Takes effect at each port's next reply (a port's bucket keeps
    /// its tokens, up to the new burst). Until it is called the kernel uses
    /// [`g::LEARN_DEFAULT_RATE`] and [`g::LEARN_DEFAULT_BURST`].
    pub fn set_learn_limit(&mut self, rate: u32, burst: u32) -> Result<()> {
        let limit = g::LearnLimit {
            rate: rate.min(g::LEARN_MAX),
            burst: burst.clamp(1, g::LEARN_MAX),
        };
        self.learn_limit
            .set(0, limit, 0)
            .map_err(|source| EbpfDatapathError::Map {
                name: g::MAP_LEARN_LIMIT,
                source,
            })
    }

    /// The learning filter's counters, summed over CPUs.
    pub fn learn_counters(&self) -> Result<LearnCounters> {
        let sum = |slot: u32| -> Result<u64> {
            let v = self
                .learn_counters
                .get(&slot, 0)
                .map_err(|source| EbpfDatapathError::Map {
                    name: g::MAP_LEARN_COUNTERS,
                    source,
                })?;
            Ok(v.iter().copied().fold(0u64, u64::wrapping_add))
        };
        Ok(LearnCounters {
            shed: sum(g::LEARN_SHED)?,
            unused: sum(g::LEARN_UNUSED)?,
        })
    }

    /// Sets the policy of port `ifindex` and makes sure its counters
    /// exist. A changed policy replaces the entry (the rate limiter and, on
    /// a learning port, the reply bucket start full); the same policy
    /// leaves it as it is, bucket included: a restarted agent guarding a
    /// port again from the pinned table carries on where the last one was,
    /// and a workload that spent its burst does not get a new one.
    pub fn set_policy(&mut self, ifindex: u32, policy: &PortPolicy) -> Result<()> {
        let name = g::MAP_GUARD_PORTS;
        let entry = policy.entry();
        let same = self
            .ports
            .get(&ifindex, 0)
            .is_ok_and(|cur| g::GuardPort { tat_ns: 0, ..cur } == entry);
        if !same {
            self.ports
                .insert(ifindex, entry, 0)
                .map_err(|source| EbpfDatapathError::Map { name, source })?;
            // The program adds a full bucket for a learning port without one.
            let _ = self.learn_buckets.remove(&ifindex);
        }
        let name = g::MAP_GUARD_COUNTERS;
        if self.counters.get(&ifindex, 0).is_err() {
            let zero = aya::maps::PerCpuValues::try_from(vec![
                g::GuardCounters::default();
                aya::util::nr_cpus().map_err(
                    |(_, source)| EbpfDatapathError::Poll { source }
                )?
            ])
            .map_err(|source| EbpfDatapathError::Poll { source })?;
            self.counters
                .insert(ifindex, zero, 0)
                .map_err(|source| EbpfDatapathError::Map { name, source })?;
        }
        Ok(())
    }

    /// Unguards `target`: detaches its programs and removes the port's
    /// entry and counters. A port whose device is already gone (the
    /// workload deleted first) only loses its entries.
    pub fn detach(&mut self, target: &AttachTarget) -> Result<()> {
        let port = self
            .attached
            .remove(target)
            .ok_or_else(|| EbpfDatapathError::NotAttached {
                ifname: target.ifname.clone(),
            })?;
        let ebpf = &mut self.ebpf;
        let ifname = target.ifname.clone();
        let ifindex = port.ifindex;
        let res = in_netns(target.netns.as_deref(), move || {
            let mut first = detach_ingress(ebpf, port.ingress, &ifname, ifindex).err();
            if let Some(id) = port.egress
                && let Err(e) = detach_tc(ebpf, g::PROG_GUARD_EGRESS, id, &ifname)
                && first.is_none()
            {
                first = Some(e);
            }
            first.map_or(Ok(()), Err)
        });
        self.forget(ifindex);
        match res {
            Ok(Ok(())) => Ok(()),
            // The device went with the workload: its filters went with it.
            Ok(Err(e)) | Err(e) if !device_exists(target) => {
                tracing::debug!(ifname = %target.ifname, error = %e, "guard port already gone");
                Ok(())
            }
            Ok(Err(e)) | Err(e) => Err(e),
        }
    }

    /// Removes the port's entry and counters (absent ones are fine).
    fn forget(&mut self, ifindex: u32) {
        let _ = self.ports.remove(&ifindex);
        let _ = self.counters.remove(&ifindex);
        let _ = self.learn_buckets.remove(&ifindex);
    }

    /// Counters of port `ifindex`, summed over CPUs (`None`: not guarded).
    pub fn counters(&self, ifindex: u32) -> Result<Option<GuardCounters>> {
        let name = g::MAP_GUARD_COUNTERS;
        match self.counters.get(&ifindex, 0) {
            Ok(values) => {
                let mut sum = [0u64; g::GUARD_COUNTER_SLOTS];
                for v in values.iter() {
                    for (s, x) in sum.iter_mut().zip(v.slots) {
                        *s += x;
                    }
                }
                Ok(Some(GuardCounters::from_slots(&sum)))
            }
            Err(aya::maps::MapError::KeyNotFound) => Ok(None),
            Err(source) => Err(EbpfDatapathError::Map { name, source }),
        }
    }

    /// The map entry of port `ifindex`.
    pub fn policy(&self, ifindex: u32) -> Result<Option<g::GuardPort>> {
        match self.ports.get(&ifindex, 0) {
            Ok(p) => Ok(Some(p)),
            Err(aya::maps::MapError::KeyNotFound) => Ok(None),
            Err(source) => Err(EbpfDatapathError::Map {
                name: g::MAP_GUARD_PORTS,
                source,
            }),
        }
    }

    /// The guarded ports.
    pub fn ports(&self) -> Vec<GuardedPortInfo> {
        self.attached
            .iter()
            .map(|(t, p)| GuardedPortInfo {
                target: t.clone(),
                ifindex: p.ifindex,
                hook: p.ingress.hook(),
                policy: self.policy(p.ifindex).ok().flatten(),
            })
            .collect()
    }

    /// The ifindex `target` was guarded under.
    pub fn ifindex(&self, target: &AttachTarget) -> Option<u32> {
        self.attached.get(target).map(|p| p.ifindex)
    }
}

/// Whether `target`'s device still exists.
fn device_exists(target: &AttachTarget) -> bool {
    let ifname = target.ifname.clone();
    in_netns(target.netns.as_deref(), move || {
        nix::net::if_::if_nametoindex(ifname.as_str()).is_ok()
    })
    .unwrap_or(false)
}

/// The attach mode a hook is reported as.
const fn attach_mode(hook: GuardHook) -> crate::datapath::AttachMode {
    match (hook, XDP_PORT_MODE) {
        (GuardHook::Tc, _) => crate::datapath::AttachMode::Tc,
        (GuardHook::Xdp, XdpHook::Native) => crate::datapath::AttachMode::XdpNative,
        (GuardHook::Xdp, XdpHook::Generic) => crate::datapath::AttachMode::XdpGeneric,
    }
}

/// Attaches the guard's ingress program to `ifname` (`ifindex`) at
/// `hook`; returns it and whether it replaced one an earlier agent left.
/// At XDP, a TC ingress filter of the guard found on the port (an earlier
/// agent's, or this port's before it moved) is removed once the XDP
/// program is on: one ingress program per port, as each takes a token.
fn attach_ingress(
    ebpf: &mut Programs,
    ifname: &str,
    ifindex: u32,
    hook: GuardHook,
) -> Result<(Ingress, bool)> {
    match hook {
        GuardHook::Tc => {
            let (id, replaced) =
                attach_tc(ebpf, g::PROG_GUARD_INGRESS, ifname, TcAttachType::Ingress)?;
            Ok((Ingress::Tc(id), replaced))
        }
        GuardHook::Xdp => {
            let (mode, replaced) = attach_xdp(ebpf, ifname, ifindex)?;
            remove_left_filter(ifname, TcAttachType::Ingress);
            Ok((Ingress::Xdp(mode), replaced))
        }
    }
}

/// Takes `ingress` off `ifname` (`ifindex`).
fn detach_ingress(ebpf: &mut Programs, ingress: Ingress, ifname: &str, ifindex: u32) -> Result<()> {
    match ingress {
        Ingress::Tc(id) => detach_tc(ebpf, g::PROG_GUARD_INGRESS, id, ifname),
        Ingress::Xdp(mode) => {
            set_xdp_here(ifindex, None, mode).map_err(|source| EbpfDatapathError::DetachXdp {
                ifname: ifname.to_owned(),
                source,
            })
        }
    }
}

/// Attaches `xdhcp_guard_xdp` to `ifname` through netlink, in
/// [`XDP_PORT_MODE`] (a program an earlier agent left is replaced in its
/// own mode). Not a BPF link: like the guard's TC filters, it stays on the
/// port when the agent stops, and the program an earlier agent left is
/// replaced in one step. (A BPF link would go through the same
/// `dev_xdp_install` and cost the same; it would not outlive the agent.)
/// Returns the mode and whether an XDP program was there before.
fn attach_xdp(ebpf: &mut Programs, ifname: &str, ifindex: u32) -> Result<(XdpHook, bool)> {
    let prog: &mut Xdp = super::prog(ebpf, g::PROG_GUARD_XDP)?;
    let fd = prog.fd().map_err(|source| EbpfDatapathError::Attach {
        ifname: ifname.to_owned(),
        mode: crate::datapath::AttachMode::XdpNative,
        source,
    })?;
    let err = |source| EbpfDatapathError::AttachXdp {
        ifname: ifname.to_owned(),
        source,
    };
    let before = xdp_prog_here(ifindex).map_err(err)?;
    if let Some((id, _)) = before
        && !is_guard_program(id)
    {
        // Someone else's (OVS's own program on an AF_XDP port, say):
        // never replaced.
        return Err(err(std::io::Error::other(format!(
            "the port carries XDP program {id}, which is not the DHCP guard's"
        ))));
    }
    // An earlier agent's program stays in its mode: replace it there (the
    // kernel refuses a second mode while one is attached).
    let mode = before.map_or(XDP_PORT_MODE, |(_, mode)| mode);
    set_xdp_here(ifindex, Some(fd.as_fd()), mode).map_err(err)?;
    if before.is_some() {
        tracing::info!(
            ifname,
            program = g::PROG_GUARD_XDP,
            "replaced an XDP program left on the port (a DHCP guard of an earlier agent)"
        );
    }
    Ok((mode, before.is_some()))
}

/// Whether loaded program `id` is a guard XDP program (of this agent or an
/// earlier one). Looked up only when a port already has an XDP program.
fn is_guard_program(id: u32) -> bool {
    aya::programs::loaded_programs()
        .flatten()
        .find(|p| p.id() == id)
        .is_some_and(|p| p.name_as_str() == Some(g::PROG_GUARD_XDP))
}

/// The guard's TC filters: priority (first on the port) and handle, the
/// same on every port, so a restarted agent finds the filter an earlier one
/// left and replaces it in place.
const GUARD_TC_PRIORITY: u16 = 1;
const GUARD_TC_HANDLE: TcHandle = TcHandle::new(0, 0x7864);

/// Attaches guard program `name` to `ifname` (which has a clsact qdisc) as
/// a TC filter, on every kernel. Not a tcx link: the kernel waits for an
/// RCU grace period, holding RTNL, inside every tcx attach and detach
/// (median ~15 ms on a loaded 2-vCPU host against ~0.3 ms for the qdisc
/// and filter: `bench_guard_attach`), and a port is guarded on the ADD path
/// of every pod; a filter is added and removed without that wait. A filter
/// also outlives the agent process (it holds its program and maps — the
/// pinned ones, with a bpffs), so a port stays guarded while the agent
/// restarts; the filter a previous agent left gets this agent's program
/// here in one step, never leaving the port bare.
fn attach_tc(
    ebpf: &mut Programs,
    name: &'static str,
    ifname: &str,
    kind: TcAttachType,
) -> Result<(SchedClassifierLinkId, bool)> {
    let prog: &mut SchedClassifier = super::prog(ebpf, name)?;
    let err = |source| EbpfDatapathError::Attach {
        ifname: ifname.to_owned(),
        mode: crate::datapath::AttachMode::Tc,
        source,
    };
    let options = TcAttachOptions::Netlink(NlOptions {
        priority: GUARD_TC_PRIORITY,
        handle: GUARD_TC_HANDLE,
        ..NlOptions::default()
    });
    match prog.attach_with_options(ifname, kind, options) {
        Ok(id) => Ok((id, false)),
        Err(ProgramError::TcError(TcError::NetlinkError(e)))
            if e.raw_os_error() == Some(libc::EEXIST) =>
        {
            let left = SchedClassifierLink::attached(
                ifname,
                kind,
                GUARD_TC_PRIORITY,
                GUARD_TC_HANDLE,
                None,
            )
            .map_err(|e| err(ProgramError::TcError(TcError::IoError(e))))?;
            let id = prog.attach_to_link(left).map_err(err)?;
            tracing::info!(
                ifname,
                program = name,
                "replaced a DHCP guard filter left by an earlier agent"
            );
            Ok((id, true))
        }
        Err(e) => Err(err(e)),
    }
}

/// Detaches guard program `name`'s filter `id` from `ifname`.
fn detach_tc(
    ebpf: &mut Programs,
    name: &'static str,
    id: SchedClassifierLinkId,
    ifname: &str,
) -> Result<()> {
    prog::<SchedClassifier>(ebpf, name)?
        .detach(id)
        .map_err(|source| EbpfDatapathError::Detach {
            ifname: ifname.to_owned(),
            source,
        })
}

/// Removes the guard filter an earlier agent left on `ifname`'s `kind`
/// hook, if there is one (none is the common case: nothing to do).
fn remove_left_filter(ifname: &str, kind: TcAttachType) {
    let left =
        match SchedClassifierLink::attached(ifname, kind, GUARD_TC_PRIORITY, GUARD_TC_HANDLE, None)
        {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(ifname, error = %e, "no port to look for a left guard filter on");
                return;
            }
        };
    match aya::programs::links::Link::detach(left) {
        Ok(()) => tracing::info!(
            ifname,
            ?kind,
            "removed a DHCP guard filter an earlier agent left (this port's policy does not need it)"
        ),
        Err(ProgramError::NetlinkError(e)) if e.raw_os_error() == Some(libc::ENOENT) => {}
        Err(e) => tracing::warn!(ifname, ?kind, error = %e,
            "could not remove a DHCP guard filter an earlier agent left"),
    }
}

/// Takes the guard's programs off device `ifindex` of the caller's
/// namespace (its TC filters at ingress and egress, and its XDP program),
/// whatever agent put them there; a device that is gone has none.
fn remove_guard_programs(ifindex: u32) {
    let Ok(ifname) = nix::net::if_::if_indextoname(ifindex) else {
        return;
    };
    let Ok(ifname) = ifname.into_string() else {
        return;
    };
    remove_left_filter(&ifname, TcAttachType::Ingress);
    remove_left_filter(&ifname, TcAttachType::Egress);
    match xdp_prog_here(ifindex) {
        Ok(Some((id, mode))) if is_guard_program(id) => match set_xdp_here(ifindex, None, mode) {
            Ok(()) => tracing::info!(%ifname, "removed the DHCP guard's XDP program"),
            Err(e) => tracing::warn!(%ifname, error = %e,
                "could not remove the DHCP guard's XDP program"),
        },
        Ok(_) => {}
        Err(e) => tracing::debug!(%ifname, error = %e, "no XDP program to look for"),
    }
}

/// Removes the guard from every port its pinned port table in `dir` names
/// (in the caller's namespace: the agent's, where the workload ports'
/// host ends live), then its map pins and `dir`. For uninstalling
/// (`xdhcp unpin`). Returns the pins removed; absent is fine.
pub(super) fn unpin_guard(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut removed = Vec::new();
    let ports_pin = dir.join(g::MAP_GUARD_PORTS);
    if ports_pin.exists() {
        let ports: Vec<u32> = MapData::from_pin(&ports_pin)
            .ok()
            .and_then(|m| {
                BpfHashMap::<MapData, u32, g::GuardPort>::try_from(aya::maps::Map::HashMap(m)).ok()
            })
            .map(|m| m.keys().filter_map(std::result::Result::ok).collect())
            .unwrap_or_default();
        for ifindex in ports {
            remove_guard_programs(ifindex);
        }
    }
    // The programs pinned for the next agent: unpinned, they go once no
    // port runs them (their filters went above).
    let progs = dir.join(super::PROGS_DIR);
    match std::fs::remove_dir_all(&progs) {
        Ok(()) => removed.push(progs),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    super::pin::remove_map_pins(dir, &GUARD_PINNED_MAPS, &mut removed)?;
    Ok(removed)
}

/// Makes the `clsact` qdisc of port `ifname` (in the calling thread's
/// namespace), where the guard's TC filters hang, ahead of their attach:
/// creating it deactivates the device for a moment and drops the frames
/// sent through it then, adding a filter to it later does not. One there
/// already (a previous agent's guard, another user of `clsact`) is kept;
/// a port that cannot have one fails the attach, which says why.
/// `Ok(true)`: made now; `Ok(false)`: the port had one.
pub fn prepare_port(ifname: &str) -> Result<bool, TcError> {
    match qdisc_add_clsact(ifname) {
        Ok(()) => Ok(true),
        Err(TcError::NetlinkError(e)) if e.raw_os_error() == Some(libc::EEXIST) => Ok(false),
        Err(e) => Err(e),
    }
}

fn in_netns<T: Send>(netns: Option<&Path>, f: impl FnOnce() -> T + Send) -> Result<T> {
    match netns {
        None => Ok(f()),
        Some(path) => crate::sys::netns::run_in_netns(path, f)
            .map_err(|source| EbpfDatapathError::Netns { source }),
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).unwrap_or(4096)
}

/// The guard programs, for [`Guard::test_run`].
#[cfg(feature = "test-hooks")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuardProgram {
    Ingress,
    Egress,
    /// The do-nothing TC baseline.
    Pass,
    /// The ingress program's XDP twin (returns an XDP action).
    Xdp,
}

#[cfg(feature = "test-hooks")]
impl Guard {
    /// Runs a guard program once on `data` with `BPF_PROG_TEST_RUN`, as if
    /// the frame crossed device `ifindex` of the caller's namespace.
    /// Returns the TC action (the XDP action for [`GuardProgram::Xdp`]).
    pub fn test_run(&mut self, which: GuardProgram, data: &[u8], ifindex: u32) -> Result<u32> {
        self.test_run_timed(which, data, ifindex, 1).map(|(r, _)| r)
    }

    /// Like [`Guard::test_run`], and the frame as the program left it.
    pub fn test_run_frame(
        &mut self,
        which: GuardProgram,
        data: &[u8],
        ifindex: u32,
    ) -> Result<(u32, Vec<u8>)> {
        let mut out = vec![0; data.len() + 256];
        let (r, _, len) = self.test_run_inner(which, data, ifindex, 1, Some(&mut out))?;
        out.truncate(len);
        Ok((r, out))
    }

    /// Like [`Guard::test_run`], `repeat` times in one call; returns the
    /// last TC action and the kernel's average time per repetition.
    pub fn test_run_timed(
        &mut self,
        which: GuardProgram,
        data: &[u8],
        ifindex: u32,
        repeat: u32,
    ) -> Result<(u32, std::time::Duration)> {
        self.test_run_inner(which, data, ifindex, repeat, None)
            .map(|(r, d, _)| (r, d))
    }

    fn test_run_inner(
        &mut self,
        which: GuardProgram,
        data: &[u8],
        ifindex: u32,
        repeat: u32,
        data_out: Option<&mut [u8]>,
    ) -> Result<(u32, std::time::Duration, usize)> {
        use aya::programs::{TestRun as _, TestRunOptions};
        let name = match which {
            GuardProgram::Ingress => g::PROG_GUARD_INGRESS,
            GuardProgram::Egress => g::PROG_GUARD_EGRESS,
            GuardProgram::Pass => g::PROG_GUARD_PASS,
            GuardProgram::Xdp => g::PROG_GUARD_XDP,
        };
        let mut ctx = Vec::with_capacity(44);
        if which == GuardProgram::Xdp {
            // struct xdp_md { data, data_end, data_meta, ingress_ifindex,
            // rx_queue_index, egress_ifindex }
            let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
            for v in [0, len, 0, ifindex, 0, 0] {
                ctx.extend_from_slice(&v.to_ne_bytes());
            }
        } else {
            // struct __sk_buff up to `ifindex` (offset 40); the kernel
            // zero-fills the rest.
            ctx.resize(40, 0);
            ctx.extend_from_slice(&ifindex.to_ne_bytes());
        }
        let opts = TestRunOptions {
            data_in: Some(data),
            data_out,
            ctx_in: Some(&ctx),
            repeat,
            ..TestRunOptions::default()
        };
        let res = if which == GuardProgram::Xdp {
            prog::<Xdp>(&mut self.ebpf, name)?.test_run(opts)
        } else {
            prog::<SchedClassifier>(&mut self.ebpf, name)?.test_run(opts)
        }
        .map_err(|source| EbpfDatapathError::TestRun { name, source })?;
        Ok((res.return_value, res.duration, res.data_size_out as usize))
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv6Addr;

    use super::{Carried, Direction, GuardRecordError, decode_guard_record, g};
    use crate::datapath::frame::{FrameError, FrameHeaders, build_udp6_frame};

    const MAC: [u8; 6] = [2, 0, 0x5e, 0, 0x53, 0x42];

    /// A guard record of `kind` going `direction` around `frame`.
    fn record(direction: u16, kind: u16, frame: &[u8]) -> Vec<u8> {
        let len = u32::try_from(frame.len()).unwrap();
        let mut r = Vec::new();
        r.extend_from_slice(&7u32.to_ne_bytes());
        r.extend_from_slice(&direction.to_ne_bytes());
        r.extend_from_slice(&kind.to_ne_bytes());
        r.extend_from_slice(&42u64.to_ne_bytes());
        for v in [62, len.saturating_sub(62), len, len] {
            r.extend_from_slice(&v.to_ne_bytes());
        }
        assert_eq!(r.len(), g::GUARD_HEADER_LEN);
        r.extend_from_slice(frame);
        r
    }

    /// A duplicate address detection probe for `target` from `MAC`, sent
    /// to `dst`.
    fn probe(target: Ipv6Addr, dst: Ipv6Addr) -> Vec<u8> {
        let mut f = vec![0x33, 0x33, 0xff, 0, 0x30, 0x01];
        f.extend_from_slice(&MAC);
        f.extend_from_slice(&0x86ddu16.to_be_bytes());
        f.extend_from_slice(&[0x60, 0, 0, 0, 0, 24, 58, 255]);
        f.extend_from_slice(&Ipv6Addr::UNSPECIFIED.octets());
        f.extend_from_slice(&dst.octets());
        f.extend_from_slice(&[135, 0, 0, 0, 0, 0, 0, 0]);
        f.extend_from_slice(&target.octets());
        f
    }

    #[test]
    fn each_record_kind_decodes_as_its_own_and_an_unknown_one_is_refused() {
        let h = FrameHeaders {
            src_mac: MAC,
            dst_mac: [0x33, 0x33, 0, 1, 0, 2],
            vlan: None,
            src_ip: "fe80::1".parse::<Ipv6Addr>().unwrap(),
            dst_ip: "ff02::1:2".parse::<Ipv6Addr>().unwrap(),
            src_port: 546,
            dst_port: 547,
        };
        let dhcp6 = build_udp6_frame(&h, &[3, 0, 0, 7]);
        let ev = decode_guard_record(&record(g::GUARD_FROM_WORKLOAD, g::GUARD_KIND_DHCP6, &dhcp6))
            .unwrap();
        assert_eq!(
            (ev.carried, ev.direction),
            (Carried::Dhcp6, Direction::FromWorkload)
        );
        assert_eq!(ev.payload, [3, 0, 0, 7]);
        assert!(ev.seen6().is_some() && ev.seen().is_none() && ev.dad_target().is_none());
        // The same frame said to be DHCPv4 is not what its record says.
        assert!(matches!(
            decode_guard_record(&record(g::GUARD_FROM_WORKLOAD, g::GUARD_KIND_DHCP4, &dhcp6)),
            Err(GuardRecordError::Frame(FrameError::NotIpv4 { .. }))
        ));
        // A kind this agent does not read is refused (the reader counts it).
        assert!(matches!(
            decode_guard_record(&record(g::GUARD_FROM_WORKLOAD, 9, &dhcp6)),
            Err(GuardRecordError::Kind(9))
        ));

        let target: Ipv6Addr = "fd00:6::5054:ff:fe00:3001".parse().unwrap();
        let solicited: Ipv6Addr = "ff02::1:ff00:3001".parse().unwrap();
        let ok = record(
            g::GUARD_FROM_WORKLOAD,
            g::GUARD_KIND_DAD6,
            &probe(target, solicited),
        );
        let ev = decode_guard_record(&ok).unwrap();
        assert_eq!(ev.carried, Carried::Dad6);
        assert_eq!(ev.dad_target(), Some(target));
        assert!(ev.seen().is_none() && ev.seen6().is_none());
        // A probe towards the workload, or to another address than its
        // target's solicited-node one, is not one.
        assert!(matches!(
            decode_guard_record(&record(
                g::GUARD_TO_WORKLOAD,
                g::GUARD_KIND_DAD6,
                &probe(target, solicited)
            )),
            Err(GuardRecordError::Kind(2))
        ));
        assert!(matches!(
            decode_guard_record(&record(
                g::GUARD_FROM_WORKLOAD,
                g::GUARD_KIND_DAD6,
                &probe(target, "ff02::1".parse().unwrap())
            )),
            Err(GuardRecordError::Frame(FrameError::NotDad(_)))
        ));
        // Cut anywhere, it is refused, never a panic.
        let frame = probe(target, solicited);
        for cut in 0..frame.len() {
            assert!(
                decode_guard_record(&record(
                    g::GUARD_FROM_WORKLOAD,
                    g::GUARD_KIND_DAD6,
                    &frame[..cut]
                ))
                .is_err(),
                "{cut}"
            );
        }
    }
}
