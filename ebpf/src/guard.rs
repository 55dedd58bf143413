//! The DHCP guard: a TC program pair on the host end of a workload port,
//! and an XDP twin of the ingress program for a port that something reads
//! before TC ingress runs.
//!
//! Ingress sees what the workload sends. UDP datagrams that are not to or
//! from the DHCP ports pass after two or three reads (`EtherType`, IPv4
//! protocol, UDP ports); the port's entry is looked up only for DHCP. Then:
//!
//! - a server message (UDP source port 67, destination port 68, or a
//!   BOOTREPLY to port 67) is dropped unless the port is trusted;
//! - a client message on a single-client port whose Ethernet source,
//!   `chaddr` or type-1 client identifier (`01` + MAC, option 61) is not the
//!   port's MAC is dropped, and so is one whose options the guard cannot
//!   check (two client identifiers, option overload, more options than it
//!   reads);
//! - a client message over the port's rate (GCRA token bucket) is dropped;
//! - a client message too short for a BOOTP header is dropped;
//! - a client message that passes on a learning port is copied to the
//!   guard ring for the agent;
//! - on a port with the broadcast flag (a VM's), a client message from a
//!   client without an address leaves with the BOOTP broadcast flag set
//!   and its UDP checksum updated ([`broadcast_replies`]).
//!
//! IPv6 ([`ingress6`]): the guard walks up to six extension headers to
//! the upper-layer header, then
//!
//! - a router advertisement (ICMPv6 134) or redirect (137) is dropped
//!   unless the port is trusted (RA guard, RFC 6105);
//! - a DHCPv6 message a server or relay sends (UDP source port 547,
//!   destination port 546, or to port 547 any type but a client's) is
//!   dropped unless the port is trusted;
//! - a DHCPv6 client message is policed as a DHCPv4 one: on a single-client
//!   port its Ethernet source and a link-layer DUID in its Client
//!   Identifier must be the port's MAC, and it takes a token from the same
//!   bucket;
//! - a frame whose upper-layer header the walk does not find (more
//!   extension headers than it reads, or a first fragment that ends inside
//!   the chain, RFC 7113's evasions) is dropped, trusted port or not;
//!   a later fragment passes, as for IPv4.
//!
//! A frame with more VLAN tags than the parser reads (it reads one; at TC
//! ingress the kernel has already moved the outermost tag to the skb's
//! metadata) whose next header is IPv4 UDP to or from port 67 or 68, or
//! IPv6 carrying what the guard polices or hiding its upper layer, or
//! with too many tags to see what follows, is dropped on a guarded port as
//! unclassifiable: it may be a server reply that a switch further on
//! untags.
//!
//! On a learning port, the DHCPv6 client messages that pass and that
//! learning reads (SOLICIT, REQUEST, RENEW, REBIND, RELEASE, DECLINE) are
//! copied to the guard ring as well, and so are the guest's duplicate
//! address detection probes (neighbour solicitations from `::`, within the
//! port's learning bucket: [`dad`]); neighbour discovery always passes.
//!
//! Egress sees what is sent to the workload: on a learning port, the server
//! replies for the port's MAC that learning uses (DHCPv4 ACKs, DHCPv6
//! REPLYs) are copied to the
//! ring while the port's reply bucket has a token (a token bucket refilled
//! from `bpf_ktime_get_ns` at the rate the agent sets); the other replies,
//! and the ACKs over the bucket, are counted and not copied, so a flood of
//! well-formed replies towards a guest costs the agent nothing. Nothing is
//! dropped.
//!
//! The XDP program gives the ingress program's verdicts in the XDP hook:
//! on a port of an Open vSwitch bridge on the userspace datapath,
//! `ovs-vswitchd` reads the port through a packet socket, which the kernel
//! feeds after XDP and before TC ingress, so a frame dropped at TC ingress
//! has already been forwarded. A port carries one of the two ingress
//! programs, never both (each takes a token from the port's bucket).
//!
//! Unlike the capture programs this guard fails closed for what it polices
//! (DHCP, DHCPv6, RAs and redirects from an untrusted workload) and open for
//! everything else: a non-DHCP frame, a frame on a port without an entry,
//! an IPv4 or IPv6 fragment after the first (it has no ports and nothing
//! reassembles it without the first, which is policed), a frame too short
//! to show its UDP ports or its IPv6 header.
//! Only helpers available since kernel 5.11 are used (`bpf_ktime_get_coarse_ns`
//! is the newest).
//!
//! One thing: the guard's kernel programs, which must stay one object (they
//! share the port map, the counters and the parser the verifier sees).

use core::ffi::c_void;
use core::hint::black_box;
use core::ptr::addr_of_mut;

use aya_ebpf::bindings::BPF_NOEXIST;
use aya_ebpf::bindings::{BPF_F_MARK_MANGLED_0, TC_ACT_SHOT, TC_ACT_UNSPEC, xdp_action};
use aya_ebpf::helpers::generated::{bpf_ktime_get_coarse_ns, bpf_ktime_get_ns, bpf_skb_load_bytes};
use aya_ebpf::macros::{classifier, map, xdp};
use aya_ebpf::maps::{Array, HashMap, PerCpuArray, PerCpuHashMap, RingBuf};
use aya_ebpf::programs::{TcContext, XdpContext};
use xdhcp_common::guard::{
    GUARD_BUCKETS, GUARD_DROPPED_MALFORMED, GUARD_DROPPED_RATE, GUARD_DROPPED_SERVER,
    GUARD_DROPPED_SPOOF, GUARD_DROPPED_UNCLASSIFIED, GUARD_EVENTS_BYTES, GUARD_FROM_WORKLOAD,
    GUARD_LEARN, GUARD_LEARN_LOST, GUARD_LEARNED, GUARD_PASSED_CLIENT, GUARD_PASSED_TRUSTED_SERVER,
    GUARD_PORTS_CAPACITY, GUARD_SINGLE_CLIENT, GUARD_TO_WORKLOAD, GUARD_TRUSTED, GuardCounters,
    GuardHeader, GuardPort, GuardRecord,
};
// The guard ring's record kinds.
use xdhcp_common::guard::{GUARD_KIND_DAD6, GUARD_KIND_DHCP4, GUARD_KIND_DHCP6};
// The IPv6 verdicts' counters.
use xdhcp_common::guard::{
    GUARD_DROPPED_MALFORMED6, GUARD_DROPPED_RA, GUARD_DROPPED_RATE6, GUARD_DROPPED_REDIRECT,
    GUARD_DROPPED_SERVER6, GUARD_DROPPED_SPOOF6, GUARD_DROPPED_UNCLASSIFIED6, GUARD_PASSED_CLIENT6,
    GUARD_PASSED_TRUSTED6,
};
// The broadcast-flag rewrite's (kept apart from the list above).
use xdhcp_common::guard::{BOOTP_BROADCAST, GUARD_BROADCAST, udp_checksum_replace};
// The learning replies' filter and bucket.
use xdhcp_common::guard::{
    LEARN_COUNTER_SLOTS, LEARN_SHED, LEARN_TOKEN, LEARN_UNUSED, LearnBucket, LearnLimit, learn_take,
};

/// Port entries ([`xdhcp_common::guard::MAP_GUARD_PORTS`]).
#[map]
static XDHCP_GUARD_PORTS: HashMap<u32, GuardPort> =
    HashMap::with_max_entries(GUARD_PORTS_CAPACITY, 0);

/// Per-port counters ([`xdhcp_common::guard::MAP_GUARD_COUNTERS`]).
#[map]
static XDHCP_GUARD_COUNTERS: PerCpuHashMap<u32, GuardCounters> =
    PerCpuHashMap::with_max_entries(GUARD_PORTS_CAPACITY, 0);

/// Observed exchanges on learning ports ([`xdhcp_common::guard::MAP_GUARD_EVENTS`]).
#[map]
static XDHCP_GUARD_EVENTS: RingBuf = RingBuf::with_byte_size(GUARD_EVENTS_BYTES, 0);

/// Learning ports' reply buckets ([`xdhcp_common::guard::MAP_LEARN_BUCKETS`]).
#[map]
static XDHCP_LEARN_BUCKETS: HashMap<u32, LearnBucket> =
    HashMap::with_max_entries(GUARD_PORTS_CAPACITY, 0);

/// Their rate and burst ([`xdhcp_common::guard::MAP_LEARN_LIMIT`]).
#[map]
static XDHCP_LEARN_LIMIT: Array<LearnLimit> = Array::with_max_entries(1, 0);

/// Replies on learning ports not copied, by reason
/// ([`xdhcp_common::guard::MAP_LEARN_COUNTERS`]).
#[map]
static XDHCP_LEARN_COUNTERS: PerCpuArray<u64> =
    PerCpuArray::with_max_entries(LEARN_COUNTER_SLOTS, 0);

const ETH_HLEN: usize = 14;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88a8;
/// The pre-standard outer tag of stacked VLANs some switches still use.
const ETH_P_QINQ_9100: u16 = 0x9100;
const IPPROTO_UDP: u8 = 17;
const UDP_HLEN: usize = 8;
const BOOTREQUEST: u8 = 1;
const BOOTREPLY: u8 = 2;
/// Offset of `chaddr` in the BOOTP message.
const CHADDR: usize = 28;
const SERVER_PORT: u16 = 67;
const CLIENT_PORT: u16 = 68;
/// Offset of the magic cookie, then of the options, in the BOOTP message.
const COOKIE: usize = 236;
const OPTIONS: usize = 240;
const MAGIC_COOKIE: [u8; 4] = [99, 130, 83, 99];
const OPT_PAD: u8 = 0;
const OPT_END: u8 = 255;
const OPT_OVERLOAD: u8 = 52;
const OPT_CLIENT_ID: u8 = 61;
const OPT_MESSAGE_TYPE: u8 = 53;
const DHCPACK: u8 = 5;
/// Options the client-identifier scan reads before it gives up (a client's
/// message has a dozen or two; pads count one each).
const MAX_OPTIONS: usize = 48;
/// Offsets the scan reads below: a bound the verifier can see on every
/// packet offset; a DHCP message with options beyond it is not checked,
/// so refused.
const OPTIONS_LIMIT: usize = 2048;

const ETH_P_IPV6: u16 = 0x86dd;
const IPV6_HLEN: usize = 40;
const IPPROTO_ICMPV6: u8 = 58;
/// IPv6 extension headers (RFC 8200 §4, the IANA list of RFC 7045): all
/// but the fragment header and AH have the generic layout (next header,
/// length in 8-octet units after the first 8).
const NEXTHDR_HOP: u8 = 0;
const NEXTHDR_ROUTING: u8 = 43;
const NEXTHDR_FRAGMENT: u8 = 44;
const NEXTHDR_AUTH: u8 = 51;
const NEXTHDR_DEST: u8 = 60;
const NEXTHDR_MOBILITY: u8 = 135;
const NEXTHDR_HIP: u8 = 139;
const NEXTHDR_SHIM6: u8 = 140;
const NEXTHDR_EXP1: u8 = 253;
const NEXTHDR_EXP2: u8 = 254;
/// Extension headers the walk reads before it gives up (a frame with more
/// is unclassified: RFC 7113's evasion stacks them, nothing legitimate
/// sends this many).
const MAX_EXT_HEADERS: usize = 6;
/// The upper-layer header must start before this offset of the frame (a
/// bound the verifier can see; a chain longer than that is unclassified).
const V6_CHAIN_LIMIT: usize = 2048;
const ICMPV6_ROUTER_ADVERT: u8 = 134;
const ICMPV6_REDIRECT: u8 = 137;
/// Neighbour solicitation (RFC 4861 §4.3): from `::`, a host's duplicate
/// address detection of an address it is configuring (RFC 4862 §5.4.2).
const ICMPV6_NEIGHBOUR_SOLICIT: u8 = 135;
/// Bytes of a neighbour solicitation without options (type, code,
/// checksum, reserved, target address): what learning reads of one.
const NS_LEN: usize = 24;
const DHCP6_CLIENT_PORT: u16 = 546;
const DHCP6_SERVER_PORT: u16 = 547;
/// The DHCPv6 REPLY, the one server message learning reads.
const DHCP6_REPLY: u8 = 7;
/// DHCPv6 Client Identifier option (RFC 8415 §21.2).
const OPTION_CLIENTID: u16 = 1;
/// DUID types that carry a link-layer address (RFC 8415 §11.2, §11.4), and
/// the hardware type of Ethernet.
const DUID_LLT: u16 = 1;
const DUID_LL: u16 = 3;
const HWTYPE_ETHERNET: u16 = 1;
/// Top-level DHCPv6 options the Client Identifier scan reads (a client's
/// message has under a dozen).
const MAX_OPTIONS6: usize = 32;
/// Offsets that scan reads below (as [`OPTIONS_LIMIT`], with room for the
/// longer IPv6 header chain in front).
const OPTIONS6_LIMIT: usize = 4096;

/// What the guard needs from a frame, whichever hook it runs in.
trait Wire {
    /// A `T` at `offset` of the frame, if the frame has it.
    fn read<T: Copy>(&self, offset: usize) -> Option<T>;
    /// The device the frame arrived on (the guarded port's key).
    fn ifindex(&self) -> u32;
    /// The frame's length.
    fn frame_len(&self) -> usize;
    /// Copies the first `len` (1..=`N`) bytes of the frame to `dst`, which
    /// has room for `N`.
    fn copy_prefix<const N: usize>(&self, dst: *mut u8, len: usize) -> bool;
    /// Replaces the 16-bit word `old` at `offset` (inside a UDP datagram)
    /// with `new` and updates the UDP checksum at `check` to match; the
    /// frame's last access (at TC the helpers leave no packet pointer
    /// valid).
    fn rewrite_u16(&self, offset: usize, old: u16, new: u16, check: usize) -> bool;
}

/// A frame at TC: bounded reads from the linear part of the skb, the rest
/// through `bpf_skb_load_bytes`.
struct TcFrame<'a> {
    ctx: &'a TcContext,
    start: usize,
    end: usize,
}

impl Wire for TcFrame<'_> {
    #[inline(always)]
    fn read<T: Copy>(&self, offset: usize) -> Option<T> {
        let at = self.start + offset;
        if at + size_of::<T>() <= self.end {
            // SAFETY: bounds checked against data_end just above; integer
            // fields are read with one load each (`crate::read_packet`).
            return Some(unsafe { crate::read_packet(at) });
        }
        self.ctx.load::<T>(offset).ok()
    }

    #[inline(always)]
    fn ifindex(&self) -> u32 {
        // SAFETY: reading a context field the verifier allows for sched_cls.
        unsafe { (*self.ctx.skb.skb).ifindex }
    }

    #[inline(always)]
    fn frame_len(&self) -> usize {
        self.ctx.len() as usize
    }

    #[inline(always)]
    fn copy_prefix<const N: usize>(&self, dst: *mut u8, len: usize) -> bool {
        // Bound the very value handed to the helper to 1..=N by arithmetic,
        // not by tests: 6.1's verifier learns nothing from `len != 0` about
        // a range that starts at 0, and refuses a size that may be 0
        // (`invalid access to memory, mem_size=1056 off=32 size=0`). N is a
        // power of two, so for the 1..=N the caller passes this is the
        // identity.
        let len = black_box(len);
        if len == 0 || len > N {
            return false;
        }
        let len = ((black_box(len) - 1) & (N - 1)) + 1;
        // SAFETY: `dst` has room for N >= len bytes; the helper
        // bounds-checks the skb.
        unsafe {
            bpf_skb_load_bytes(self.ctx.skb.skb.cast(), 0, dst.cast::<c_void>(), len as u32) == 0
        }
    }

    #[inline(always)]
    fn rewrite_u16(&self, offset: usize, old: u16, new: u16, check: usize) -> bool {
        // The kernel's own update: it knows the skb's checksum state (a
        // partial checksum is left alone, a zero UDP checksum stays zero,
        // a result of zero is sent as 0xffff). The word moves the sum by
        // as much as the checksum field moves it back, so a complete
        // checksum (`skb->csum`) stays right without a recompute.
        // The word first: if that fails, the frame is as it was.
        let flags = u64::from(BPF_F_MARK_MANGLED_0) | 2;
        self.ctx.store(offset, &new, 0).is_ok()
            && self
                .ctx
                .l4_csum_replace(check, u64::from(old), u64::from(new), flags)
                .is_ok()
    }
}

/// A frame at XDP: all of it is in the linear buffer.
struct XdpFrame<'a> {
    ctx: &'a XdpContext,
    start: usize,
    end: usize,
}

impl Wire for XdpFrame<'_> {
    #[inline(always)]
    fn read<T: Copy>(&self, offset: usize) -> Option<T> {
        let at = self.start + offset;
        if at + size_of::<T>() > self.end {
            return None;
        }
        // SAFETY: bounds checked against data_end just above (one load per
        // integer field, as for TC).
        Some(unsafe { crate::read_packet(at) })
    }

    #[inline(always)]
    fn ifindex(&self) -> u32 {
        self.ctx.ingress_ifindex() as u32
    }

    #[inline(always)]
    fn frame_len(&self) -> usize {
        self.end - self.start
    }

    #[inline(always)]
    fn copy_prefix<const N: usize>(&self, dst: *mut u8, len: usize) -> bool {
        // The capture programs' word copy (no bpf_xdp_load_bytes: 5.18).
        crate::direct_copy::<N>(self.start, self.end, dst, len)
    }

    #[inline(always)]
    fn rewrite_u16(&self, offset: usize, old: u16, new: u16, check: usize) -> bool {
        // Each bound tested on the very pointer written through (opaque to
        // the compiler, which would fold one test into the other).
        let sum = black_box(self.start + check);
        if sum + 2 > self.end {
            return false;
        }
        let at = black_box(self.start + offset);
        if at + 2 > self.end {
            return false;
        }
        // SAFETY: both words are inside the frame (checked just above); a
        // frame at XDP is writable.
        unsafe {
            let old_sum = core::ptr::read_unaligned(sum as *const u16);
            core::ptr::write_unaligned(at as *mut u16, new);
            core::ptr::write_unaligned(sum as *mut u16, udp_checksum_replace(old_sum, old, new));
        }
        true
    }
}

/// A UDP datagram to or from a DHCP port.
struct Udp {
    /// Offset of the UDP payload (the BOOTP message).
    payload: usize,
    /// UDP payload length from the UDP header.
    payload_len: usize,
    sport: u16,
    dport: u16,
}

/// What [`locate`] found in a frame.
enum Located {
    /// A UDP datagram to or from a DHCP port.
    Udp(Udp),
    /// IPv6, its header at this offset ([`ingress6`] reads on).
    Ipv6(usize),
    /// Not such a datagram nor IPv6, and no VLAN tag in front (the common case: it
    /// is decided by the `EtherType` and, for IPv4, the protocol byte).
    Other,
    /// Not such a datagram behind the one tag `locate` reads, or a tag
    /// `locate` does not read: more tags may hide one ([`stacked_dhcp`]).
    Tagged,
}

/// Finds a UDP datagram with port 67 or 68 on either side (one VLAN tag at
/// most; any IHL; a first fragment counts, later ones do not), or an IPv6
/// header (untagged or behind one tag).
///
/// Untagged IPv4 is tested first, and a frame that is not IPv4 UDP leaves
/// after the `EtherType` and the protocol byte: every frame a workload
/// sends pays for this much, and only DHCP for more.
#[inline(always)]
fn locate<W: Wire>(f: &W) -> Located {
    let Some(ethertype) = f.read::<u16>(12) else {
        return Located::Other;
    };
    let l3 = if ethertype == ETH_P_IP.to_be() {
        ETH_HLEN
    } else if ethertype == ETH_P_IPV6.to_be() {
        return Located::Ipv6(ETH_HLEN);
    } else if !is_tag(ethertype) {
        return Located::Other;
    } else if ethertype == ETH_P_QINQ_9100.to_be() {
        return Located::Tagged;
    } else {
        match f.read::<u16>(ETH_HLEN + 2) {
            Some(inner) if inner == ETH_P_IP.to_be() => ETH_HLEN + 4,
            Some(inner) if inner == ETH_P_IPV6.to_be() => return Located::Ipv6(ETH_HLEN + 4),
            _ => return Located::Tagged,
        }
    };
    match locate_udp(f, l3) {
        Some(udp) => Located::Udp(udp),
        None if l3 == ETH_HLEN => Located::Other,
        None => Located::Tagged,
    }
}

/// [`locate`] from the IPv4 header at `l3` on.
#[inline(always)]
fn locate_udp<W: Wire>(f: &W, l3: usize) -> Option<Udp> {
    let ip = f.read::<[u16; 5]>(l3)?;
    let [version_ihl, _tos] = ip[0].to_ne_bytes();
    let [_ttl, protocol] = ip[4].to_ne_bytes();
    if protocol != IPPROTO_UDP || version_ihl >> 4 != 4 {
        return None;
    }
    let ihl = usize::from(version_ihl & 0x0f) * 4;
    // A later fragment carries no UDP header.
    if ihl < 20 || u16::from_be(ip[3]) & 0x1fff != 0 {
        return None;
    }
    let l4 = l3 + ihl;
    let udp = f.read::<[u16; 3]>(l4)?;
    let sport = u16::from_be(udp[0]);
    let dport = u16::from_be(udp[1]);
    if sport != SERVER_PORT && sport != CLIENT_PORT && dport != SERVER_PORT && dport != CLIENT_PORT
    {
        return None;
    }
    Some(Udp {
        payload: l4 + UDP_HLEN,
        payload_len: usize::from(u16::from_be(udp[2])).saturating_sub(UDP_HLEN),
        sport,
        dport,
    })
}

/// The BOOTP `op` byte, read with `htype`, `hlen` and `hops` as one word: a
/// one-byte packet read compiles to a test the verifier cannot use
/// (`data + off < data_end`, which proves nothing at offset 0).
#[inline(always)]
fn op<W: Wire>(f: &W, payload: usize) -> Option<u8> {
    f.read::<[u8; 4]>(payload).map(|w| w[0])
}

#[inline(always)]
fn count(ifindex: u32, slot: usize) {
    if let Some(c) = XDHCP_GUARD_COUNTERS.get_ptr_mut(ifindex)
        && slot < GUARD_COUNTER_SLOTS_USIZE
    {
        // SAFETY: per-CPU value, this program is the only writer on this CPU.
        unsafe { (*c).slots[slot] += 1 };
    }
}

const GUARD_COUNTER_SLOTS_USIZE: usize = xdhcp_common::guard::GUARD_COUNTER_SLOTS;

/// Whether the MAC at `offset` is `mac`.
#[inline(always)]
fn mac_at<W: Wire>(f: &W, offset: usize, mac: [u8; 6]) -> Option<bool> {
    let [a, b] = f.read::<[u32; 2]>(offset)?.map(u32::to_ne_bytes);
    Some([a[0], a[1], a[2], a[3], b[0], b[1]] == mac)
}

/// Whether `ethertype` (as on the wire) is a VLAN tag's.
#[inline(always)]
fn is_tag(ethertype: u16) -> bool {
    ethertype == ETH_P_8021Q.to_be()
        || ethertype == ETH_P_8021AD.to_be()
        || ethertype == ETH_P_QINQ_9100.to_be()
}

/// What a frame with more VLAN tags than [`locate`] reads carries.
enum Stacked {
    /// Nothing the guard polices.
    Pass,
    /// IPv4 UDP to or from port 67 or 68, or more tags than [`stacked`]
    /// reads.
    Dhcp,
    /// IPv6, its header at this offset: [`ingress6`] decides.
    Ipv6(usize),
}

/// Whether a frame [`locate`] did not classify may still be DHCP: it has
/// more VLAN tags than `locate` reads (two or more in the frame, or one of
/// the pre-standard 0x9100 kind) and, behind at most three, IPv4 UDP to or
/// from port 67 or 68 — or more than three, so the guard cannot see what
/// they carry — or IPv6.
#[inline(always)]
fn stacked<W: Wire>(f: &W) -> Stacked {
    let Some([outer, _tci, inner]) = f.read::<[u16; 3]>(12) else {
        return Stacked::Pass;
    };
    // One 802.1Q/802.1ad tag and no other: `locate` read it.
    if !is_tag(outer) || (!is_tag(inner) && outer != ETH_P_QINQ_9100.to_be()) {
        return Stacked::Pass;
    }
    // The EtherType after the first tag is at 16; up to two more tags.
    let mut at = ETH_HLEN + 2;
    let mut next = inner;
    if is_tag(next) {
        at += 4;
        let Some(n) = f.read::<u16>(at) else {
            return Stacked::Pass;
        };
        next = n;
    }
    if is_tag(next) {
        at += 4;
        let Some(n) = f.read::<u16>(at) else {
            return Stacked::Pass;
        };
        next = n;
    }
    if is_tag(next) {
        return Stacked::Dhcp;
    }
    if next == ETH_P_IPV6.to_be() {
        return Stacked::Ipv6(at + 2);
    }
    if next != ETH_P_IP.to_be() {
        return Stacked::Pass;
    }
    let l3 = at + 2;
    let Some(ip) = f.read::<[u16; 5]>(l3) else {
        return Stacked::Pass;
    };
    let [version_ihl, _tos] = ip[0].to_ne_bytes();
    let [_ttl, protocol] = ip[4].to_ne_bytes();
    if protocol != IPPROTO_UDP || version_ihl >> 4 != 4 {
        return Stacked::Pass;
    }
    let ihl = usize::from(version_ihl & 0x0f) * 4;
    if ihl < 20 || u16::from_be(ip[3]) & 0x1fff != 0 {
        return Stacked::Pass;
    }
    let Some([sport, dport]) = f.read::<[u16; 2]>(l3 + ihl) else {
        return Stacked::Pass;
    };
    let dhcp = |p: u16| p == SERVER_PORT.to_be() || p == CLIENT_PORT.to_be();
    if dhcp(sport) || dhcp(dport) {
        Stacked::Dhcp
    } else {
        Stacked::Pass
    }
}

/// What a client message's options say about whose it is.
enum ClientIds {
    /// No client identifier naming another MAC (DHCPv4: of type 1;
    /// DHCPv6: a link-layer DUID).
    Own,
    /// A client identifier `01` + another MAC, or a DUID-LL/LLT of another
    /// MAC.
    Other,
    /// The guard cannot tell: two client identifiers (a server may join
    /// them, RFC 3396), option overload (options in `sname`/`file`, which
    /// the scan does not read), more options than it reads; for DHCPv6,
    /// options past the frame's end as well.
    Unknown,
}

/// Scans the options of the client message at `payload` for client
/// identifiers (option 61). Only a type-1 identifier (`01` + a MAC: what
/// xdhcp sends by default, for a pod and for a VM) names a MAC the guard
/// can compare; identifiers of other types pass. The scan stops at the
/// end option, at the UDP payload's end or where the frame ends (a server
/// sees no more options either).
#[inline(always)]
fn client_ids<W: Wire>(f: &W, payload: usize, payload_len: usize, mac: [u8; 6]) -> ClientIds {
    // No cookie: a BOOTP message, no options for a server to read.
    if f.read::<[u8; 4]>(payload + COOKIE) != Some(MAGIC_COOKIE) {
        return ClientIds::Own;
    }
    let end = payload + payload_len;
    let mut off = payload + OPTIONS;
    let mut seen = false;
    for _ in 0..MAX_OPTIONS {
        if off >= end {
            return ClientIds::Own;
        }
        if off >= OPTIONS_LIMIT {
            return ClientIds::Unknown;
        }
        // Masked, though the test above bounds it: a range the verifier
        // sees the same on every round (so it prunes), whatever the
        // compiler makes of the test.
        let at = black_box(off) & (OPTIONS_LIMIT - 1);
        let Some([code, len]) = f.read::<[u8; 2]>(at) else {
            return ClientIds::Own;
        };
        match code {
            OPT_PAD => {
                off = at + 1;
                continue;
            }
            OPT_END => return ClientIds::Own,
            OPT_OVERLOAD => return ClientIds::Unknown,
            OPT_CLIENT_ID => {
                if seen {
                    return ClientIds::Unknown;
                }
                seen = true;
                if len == 7 {
                    let Some(id) = f.read::<[u8; 7]>(at + 2) else {
                        return ClientIds::Own;
                    };
                    if id[0] == 1 && [id[1], id[2], id[3], id[4], id[5], id[6]] != mac {
                        return ClientIds::Other;
                    }
                }
            }
            _ => {}
        }
        off = at + 2 + usize::from(len);
    }
    // More options than the scan reads, unless it ended exactly here.
    if off >= end {
        ClientIds::Own
    } else {
        ClientIds::Unknown
    }
}

/// Takes one token from the port's bucket (GCRA: the theoretical arrival
/// time advances by one interval per message and may run at most
/// `tolerance` ahead of now).
///
/// A plain read-modify-write, not a compare-and-swap: the BPF target of
/// Rust has no atomic compare-exchange. Two CPUs taking a token from one
/// port in the same few nanoseconds can both pass on the same token, so a
/// flood spread over `n` CPUs may get up to `n - 1` extra messages through
/// per collision; a port's frames mostly arrive on one CPU (the sender's),
/// and the bench and tests see the configured rate.
#[inline(always)]
fn take_token(port: *mut GuardPort, now: u64) -> bool {
    // SAFETY: `port` points into a map value that outlives this program run;
    // the value is plain data (a torn read from a concurrent user-space
    // update at worst misjudges one message).
    unsafe {
        let interval = (*port).interval_ns;
        if interval == 0 {
            return true;
        }
        let tat = (*port).tat_ns;
        let base = if tat > now { tat } else { now };
        if base - now > (*port).tolerance_ns {
            return false;
        }
        addr_of_mut!((*port).tat_ns).write_volatile(base + interval);
    }
    true
}

/// What the ingress program decided.
enum Verdict {
    /// Pass, nothing to count (not DHCP, or not a guarded port).
    Pass,
    /// Pass, counted in the given slot.
    PassCounted(usize),
    /// Drop, counted in the given slot.
    Drop(usize),
}

#[inline(always)]
fn ingress<W: Wire>(f: &W) -> Verdict {
    // One call of each family's verdict, whichever way the frame came (the
    // verifier walks each once).
    let (l3, stacked_tags) = match locate(f) {
        Located::Udp(udp) => return ingress4(f, &udp),
        Located::Ipv6(l3) => (l3, false),
        Located::Other => return Verdict::Pass,
        // Rare (a frame with stacked VLAN tags): looked up only then.
        Located::Tagged => match stacked(f) {
            Stacked::Pass => return Verdict::Pass,
            Stacked::Dhcp => {
                if XDHCP_GUARD_PORTS.get_ptr(f.ifindex()).is_some() {
                    return Verdict::Drop(GUARD_DROPPED_UNCLASSIFIED);
                }
                return Verdict::Pass;
            }
            Stacked::Ipv6(l3) => (l3, true),
        },
    };
    ingress6(f, l3, stacked_tags)
}

/// The verdict on a UDP datagram to or from port 67 or 68.
#[inline(always)]
fn ingress4<W: Wire>(f: &W, udp: &Udp) -> Verdict {
    let client = udp.dport == SERVER_PORT && udp.sport != SERVER_PORT;
    let server = udp.sport == SERVER_PORT || udp.dport == CLIENT_PORT;
    if !client && !server {
        return Verdict::Pass;
    }
    let ifindex = f.ifindex();
    let Some(port) = XDHCP_GUARD_PORTS.get_ptr_mut(ifindex) else {
        return Verdict::Pass;
    };
    // SAFETY: plain data in a map value; a concurrent update from user space
    // at worst gives this one frame the old policy.
    let (flags, mac) = unsafe { ((*port).flags, (*port).mac) };
    let server = server || {
        let Some(op) = op(f, udp.payload) else {
            return Verdict::Drop(GUARD_DROPPED_MALFORMED);
        };
        op == BOOTREPLY
    };
    if server {
        if flags & GUARD_TRUSTED != 0 {
            return Verdict::PassCounted(GUARD_PASSED_TRUSTED_SERVER);
        }
        return Verdict::Drop(GUARD_DROPPED_SERVER);
    }
    // A client message: the whole fixed BOOTP header up to chaddr must be there.
    let Some(op) = op(f, udp.payload) else {
        return Verdict::Drop(GUARD_DROPPED_MALFORMED);
    };
    let Some(chaddr_ok) = mac_at(f, udp.payload + CHADDR, mac) else {
        return Verdict::Drop(GUARD_DROPPED_MALFORMED);
    };
    if op != BOOTREQUEST {
        return Verdict::Drop(GUARD_DROPPED_MALFORMED);
    }
    if flags & GUARD_SINGLE_CLIENT != 0 {
        let Some(src_ok) = mac_at(f, 6, mac) else {
            return Verdict::Drop(GUARD_DROPPED_MALFORMED);
        };
        if !src_ok || !chaddr_ok {
            return Verdict::Drop(GUARD_DROPPED_SPOOF);
        }
        match client_ids(f, udp.payload, udp.payload_len, mac) {
            ClientIds::Own => {}
            ClientIds::Other => return Verdict::Drop(GUARD_DROPPED_SPOOF),
            ClientIds::Unknown => return Verdict::Drop(GUARD_DROPPED_UNCLASSIFIED),
        }
    }
    // SAFETY: helper without arguments.
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    if !take_token(port, now) {
        return Verdict::Drop(GUARD_DROPPED_RATE);
    }
    if flags & GUARD_LEARN != 0 {
        learn(f, ifindex, GUARD_FROM_WORKLOAD, GUARD_KIND_DHCP4, udp, now);
    }
    if flags & GUARD_BROADCAST != 0 {
        broadcast_replies(f, udp);
    }
    Verdict::PassCounted(GUARD_PASSED_CLIENT)
}

/// What [`upper6`] found behind an IPv6 header.
enum Upper6 {
    /// Nothing the guard polices: another upper layer (TCP, UDP between
    /// other ports, ICMPv6 other than RA and redirect, ESP, no next
    /// header), a fragment after the first, a frame too short for the
    /// fixed IPv6 header.
    Other,
    /// UDP to port 547 or 546, or from port 547.
    Udp(Udp),
    /// An ICMPv6 router advertisement or redirect (the type).
    Icmp(u8),
    /// An ICMPv6 neighbour solicitation, its header at this offset: passed
    /// whatever the port, and on a learning port copied when it is a
    /// duplicate address detection ([`dad`]).
    Solicit(usize),
    /// The upper-layer header is not found: more extension headers than
    /// the walk reads, a chain past [`V6_CHAIN_LIMIT`], or a frame that
    /// ends inside the chain (a first fragment without the upper-layer
    /// header, which RFC 7112 forbids).
    Unknown,
}

/// Walks the IPv6 header at `l3` and up to [`MAX_EXT_HEADERS`] extension
/// headers to the upper-layer header (RFC 7113: hop-by-hop, destination
/// options, routing, fragment and other extension headers may stand in
/// front of an RA or a DHCPv6 datagram to hide it from a guard that reads
/// only the first next-header field).
///
/// A fragment header with a non-zero offset ends the walk with
/// [`Upper6::Other`]: a later fragment carries no upper-layer header, and
/// no receiver reassembles it without the first, which is policed (an
/// overlapping later fragment that would rewrite the first's header is
/// discarded with the whole datagram, RFC 5722).
#[inline(always)]
fn upper6<W: Wire>(f: &W, l3: usize) -> Upper6 {
    let Some(ip) = f.read::<[u8; 8]>(l3) else {
        return Upper6::Other;
    };
    if ip[0] >> 4 != 6 {
        return Upper6::Other;
    }
    let mut next = ip[6];
    let mut off = l3 + IPV6_HLEN;
    for _ in 0..MAX_EXT_HEADERS {
        if !is_extension_header(next) {
            break;
        }
        if off >= V6_CHAIN_LIMIT {
            return Upper6::Unknown;
        }
        // Masked, though the test above bounds it: the verifier sees one
        // range on every round.
        let at = black_box(off) & (V6_CHAIN_LIMIT - 1);
        let Some([nh, len, frag_hi, frag_lo]) = f.read::<[u8; 4]>(at) else {
            return Upper6::Unknown;
        };
        off = if next == NEXTHDR_FRAGMENT {
            // Offset in the upper 13 bits of the third and fourth bytes.
            if u16::from_be_bytes([frag_hi, frag_lo]) & 0xfff8 != 0 {
                return Upper6::Other;
            }
            at + 8
        } else if next == NEXTHDR_AUTH {
            // AH's length counts 4-octet units, minus 2 (RFC 4302).
            at + (usize::from(len) + 2) * 4
        } else {
            at + (usize::from(len) + 1) * 8
        };
        next = nh;
    }
    // One place reads the upper-layer header, whichever round found it:
    // the verifier walks what follows once, not once per round.
    let (next, off) = (black_box(next), black_box(off));
    if next != IPPROTO_UDP && next != IPPROTO_ICMPV6 {
        return if is_extension_header(next) {
            Upper6::Unknown
        } else {
            Upper6::Other
        };
    }
    if off >= V6_CHAIN_LIMIT {
        return Upper6::Unknown;
    }
    let at = black_box(off) & (V6_CHAIN_LIMIT - 1);
    if next == IPPROTO_UDP {
        udp6(f, at)
    } else {
        icmp6(f, at)
    }
}

/// Whether `next` is an IPv6 extension header the walk steps over.
#[inline(always)]
fn is_extension_header(next: u8) -> bool {
    matches!(
        next,
        NEXTHDR_HOP
            | NEXTHDR_ROUTING
            | NEXTHDR_FRAGMENT
            | NEXTHDR_AUTH
            | NEXTHDR_DEST
            | NEXTHDR_MOBILITY
            | NEXTHDR_HIP
            | NEXTHDR_SHIM6
            | NEXTHDR_EXP1
            | NEXTHDR_EXP2
    )
}

/// The UDP header at `at` (behind an IPv6 header chain).
#[inline(always)]
fn udp6<W: Wire>(f: &W, at: usize) -> Upper6 {
    let Some(udp) = f.read::<[u16; 3]>(at) else {
        return Upper6::Unknown;
    };
    let sport = u16::from_be(udp[0]);
    let dport = u16::from_be(udp[1]);
    if sport != DHCP6_SERVER_PORT && dport != DHCP6_SERVER_PORT && dport != DHCP6_CLIENT_PORT {
        return Upper6::Other;
    }
    Upper6::Udp(Udp {
        payload: at + UDP_HLEN,
        payload_len: usize::from(u16::from_be(udp[2])).saturating_sub(UDP_HLEN),
        sport,
        dport,
    })
}

/// The ICMPv6 header at `at`: a router advertisement or a redirect, or
/// nothing the guard polices (neighbour solicitations and advertisements,
/// router solicitations, echo, MLD…).
#[inline(always)]
fn icmp6<W: Wire>(f: &W, at: usize) -> Upper6 {
    // Type, code and checksum as one read.
    let Some([kind, _code, _, _]) = f.read::<[u8; 4]>(at) else {
        return Upper6::Unknown;
    };
    if kind == ICMPV6_ROUTER_ADVERT || kind == ICMPV6_REDIRECT {
        Upper6::Icmp(kind)
    } else if kind == ICMPV6_NEIGHBOUR_SOLICIT {
        Upper6::Solicit(at)
    } else {
        Upper6::Other
    }
}

/// Whether DHCPv6 message type `t` is a client's, sent to servers and
/// relays on port 547 (RFC 8415 §7.3: SOLICIT, REQUEST, CONFIRM, RENEW,
/// REBIND, RELEASE, DECLINE, INFORMATION-REQUEST; RFC 7341's
/// DHCPV4-QUERY). Every other type is a server's or a relay's (ADVERTISE,
/// REPLY, RECONFIGURE, RELAY-FORW, RELAY-REPL, the leasequery and
/// reconfigure-request families) or unassigned.
#[inline(always)]
fn is_client_type6(t: u8) -> bool {
    matches!(t, 1 | 3 | 4 | 5 | 6 | 8 | 9 | 11 | 20)
}

/// The verdict on an IPv6 frame from the workload, its header at `l3`
/// (`stacked_tags`: behind more VLAN tags than [`locate`] reads).
///
/// What is not DHCPv6, an RA or a redirect passes after the next-header
/// walk, without a lookup. On a guarded port: an RA or a redirect is
/// dropped unless the port is trusted; a frame whose upper layer the walk
/// cannot find is dropped, trusted port or not (it may hide either, and
/// nothing legitimate looks like it); DHCPv6 is policed as DHCPv4 is: a
/// server's or relay's message dropped unless the port is trusted, a
/// client's checked against the port's MAC on a single-client port and
/// limited by the port's bucket (the one DHCPv4 client messages take from).
/// On a learning port, a client message that passes and that learning reads
/// ([`is_learned_type6`]) is copied to the guard ring.
#[inline(always)]
fn ingress6<W: Wire>(f: &W, l3: usize, stacked_tags: bool) -> Verdict {
    let upper = match upper6(f, l3) {
        Upper6::Other => return Verdict::Pass,
        Upper6::Solicit(at) => {
            dad(f, l3, at);
            return Verdict::Pass;
        }
        upper => upper,
    };
    let Some(port) = XDHCP_GUARD_PORTS.get_ptr_mut(f.ifindex()) else {
        return Verdict::Pass;
    };
    if stacked_tags {
        return Verdict::Drop(GUARD_DROPPED_UNCLASSIFIED6);
    }
    // SAFETY: plain data in a map value, as in `ingress4`.
    let (flags, mac) = unsafe { ((*port).flags, (*port).mac) };
    let trusted = flags & GUARD_TRUSTED != 0;
    let udp = match upper {
        Upper6::Other | Upper6::Solicit(_) => return Verdict::Pass,
        Upper6::Unknown => return Verdict::Drop(GUARD_DROPPED_UNCLASSIFIED6),
        Upper6::Icmp(_) if trusted => return Verdict::PassCounted(GUARD_PASSED_TRUSTED6),
        Upper6::Icmp(ICMPV6_ROUTER_ADVERT) => return Verdict::Drop(GUARD_DROPPED_RA),
        Upper6::Icmp(_) => return Verdict::Drop(GUARD_DROPPED_REDIRECT),
        Upper6::Udp(udp) => udp,
    };
    let mut msg_type = 0;
    let client = udp.dport == DHCP6_SERVER_PORT && udp.sport != DHCP6_SERVER_PORT && {
        // The message type, with the transaction id (one read).
        let Some([t, _, _, _]) = f.read::<[u8; 4]>(udp.payload) else {
            return Verdict::Drop(GUARD_DROPPED_MALFORMED6);
        };
        msg_type = t;
        is_client_type6(t)
    };
    if !client {
        if trusted {
            return Verdict::PassCounted(GUARD_PASSED_TRUSTED6);
        }
        return Verdict::Drop(GUARD_DROPPED_SERVER6);
    }
    if flags & GUARD_SINGLE_CLIENT != 0 {
        let Some(src_ok) = mac_at(f, 6, mac) else {
            return Verdict::Drop(GUARD_DROPPED_MALFORMED6);
        };
        if !src_ok {
            return Verdict::Drop(GUARD_DROPPED_SPOOF6);
        }
        match client_duid(f, udp.payload, udp.payload_len, mac) {
            ClientIds::Own => {}
            ClientIds::Other => return Verdict::Drop(GUARD_DROPPED_SPOOF6),
            ClientIds::Unknown => return Verdict::Drop(GUARD_DROPPED_UNCLASSIFIED6),
        }
    }
    // SAFETY: helper without arguments.
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    if !take_token(port, now) {
        return Verdict::Drop(GUARD_DROPPED_RATE6);
    }
    if flags & GUARD_LEARN != 0 && is_learned_type6(msg_type) {
        learn(
            f,
            f.ifindex(),
            GUARD_FROM_WORKLOAD,
            GUARD_KIND_DHCP6,
            &udp,
            now,
        );
    }
    Verdict::PassCounted(GUARD_PASSED_CLIENT6)
}

/// Copies a neighbour solicitation from the workload, its ICMPv6 header at
/// `at`, to the guard ring when it is a duplicate address detection (from
/// `::`, RFC 4862 §5.4.2: the guest is about to use the target address it
/// names, configured by itself, SLAAC or static) on a learning port, from
/// the port's MAC, within the port's learning bucket (over it: passed
/// uncopied, counted as shed). Address resolution (a solicitation from an
/// address) costs the source read and nothing more. Never changes the
/// verdict: neighbour discovery always passes.
#[inline(always)]
fn dad<W: Wire>(f: &W, l3: usize, at: usize) {
    // The IPv6 source address, as one read.
    let Some(src) = f.read::<[u32; 4]>(black_box(l3) + 8) else {
        return;
    };
    if src != [0; 4] {
        return;
    }
    let ifindex = f.ifindex();
    // SAFETY: plain data, read only.
    let Some(port) = (unsafe { XDHCP_GUARD_PORTS.get(ifindex) }) else {
        return;
    };
    if port.flags & GUARD_LEARN == 0 || mac_at(f, 6, port.mac) != Some(true) {
        return;
    }
    let ns = Udp {
        payload: at,
        payload_len: NS_LEN,
        sport: 0,
        dport: 0,
    };
    learn_in_bucket(f, ifindex, GUARD_FROM_WORKLOAD, GUARD_KIND_DAD6, &ns);
}

/// Whether learning reads DHCPv6 client message type `t`: the messages a
/// REPLY that binds may answer (SOLICIT, with Rapid Commit, REQUEST,
/// RENEW, REBIND) and those that give an address up (RELEASE, DECLINE).
/// CONFIRM and INFORMATION-REQUEST bind nothing.
#[inline(always)]
fn is_learned_type6(t: u8) -> bool {
    matches!(t, 1 | 3 | 5 | 6 | 8 | 9)
}

/// Scans the top-level options of the DHCPv6 client message at `payload`
/// for Client Identifier options (1). A DUID that carries an Ethernet
/// address (DUID-LL, type 3, or DUID-LLT, type 1, of hardware type 1:
/// xdhcp's own client sends DUID-LL of the workload's MAC) must name
/// `mac`; other DUIDs (DUID-EN, DUID-UUID, another hardware type) name no
/// MAC and pass. Two Client Identifiers (a server may take either), more
/// options than the scan reads, or options the frame does not hold (a
/// first fragment: the rest comes in another) are [`ClientIds::Unknown`].
#[inline(always)]
fn client_duid<W: Wire>(f: &W, payload: usize, payload_len: usize, mac: [u8; 6]) -> ClientIds {
    let end = payload + payload_len;
    // Behind the message type and the transaction id.
    let mut off = payload + 4;
    let mut seen = false;
    for _ in 0..MAX_OPTIONS6 {
        if off >= end {
            return ClientIds::Own;
        }
        if off >= OPTIONS6_LIMIT {
            return ClientIds::Unknown;
        }
        let at = black_box(off) & (OPTIONS6_LIMIT - 1);
        let Some([c0, c1, l0, l1]) = f.read::<[u8; 4]>(at) else {
            return ClientIds::Unknown;
        };
        let len = u16::from_be_bytes([l0, l1]);
        if u16::from_be_bytes([c0, c1]) == OPTION_CLIENTID {
            if seen {
                return ClientIds::Unknown;
            }
            seen = true;
            match duid_names(f, at + 4, len, mac) {
                Some(true) => {}
                Some(false) => return ClientIds::Other,
                None => return ClientIds::Unknown,
            }
        }
        off = at + 4 + usize::from(len);
    }
    if off >= end {
        ClientIds::Own
    } else {
        ClientIds::Unknown
    }
}

/// Whether the DUID of `len` bytes at `at` names `mac`: `Some(false)` for
/// a DUID-LL or DUID-LLT of hardware type 1 with another address,
/// `Some(true)` for one with `mac` and for a DUID of another kind, `None`
/// when the frame ends inside it.
#[inline(always)]
fn duid_names<W: Wire>(f: &W, at: usize, len: u16, mac: [u8; 6]) -> Option<bool> {
    // Opaque: the compiler would reuse the option header's bound test.
    let at = black_box(at);
    // DUID type and hardware type, one read for both kinds.
    let [t0, t1, h0, h1] = f.read::<[u8; 4]>(at)?;
    let (kind, hw) = (u16::from_be_bytes([t0, t1]), u16::from_be_bytes([h0, h1]));
    let addr = if kind == DUID_LL && len == 10 {
        at + 4
    } else if kind == DUID_LLT && len == 14 {
        // Behind the 4-byte time.
        at + 8
    } else {
        return Some(true);
    };
    if hw != HWTYPE_ETHERNET {
        return Some(true);
    }
    let named = f.read::<[u8; 6]>(black_box(addr))?;
    // Two comparisons, not six.
    let word = |m: [u8; 6]| {
        (
            u32::from_ne_bytes([m[0], m[1], m[2], m[3]]),
            u16::from_ne_bytes([m[4], m[5]]),
        )
    };
    Some(word(named) == word(mac))
}

/// Sets the BOOTP broadcast flag on a client message from a client
/// without an address (`ciaddr` 0: a DISCOVER, a REQUEST while selecting or
/// rebooting, a DECLINE), fixing the UDP checksum, so that a server
/// answers by broadcast (RFC 2131 §4.1). OVN's port security on a VM's
/// port passes broadcast (`ff:ff:ff:ff:ff:ff`, `255.255.255.255`) but not a
/// unicast reply to an address other than the one the port is pinned to:
/// without this, a guest whose own client is offered another address than
/// the port's never gets it. A renewal (`ciaddr` set) is answered by
/// unicast to `ciaddr` whatever the flag says, so it is left alone. Called
/// last: at TC the frame is not read after it.
#[inline(always)]
fn broadcast_replies<W: Wire>(f: &W, udp: &Udp) {
    // Opaque to the compiler: it knows earlier reads covered these bytes
    // and would drop the bounds tests the verifier needs here.
    let payload = black_box(udp.payload);
    // `secs` and `flags` (offsets 8 and 10), then `ciaddr` (12).
    let Some([_secs, flags, ciaddr_hi, ciaddr_lo]) = f.read::<[u16; 4]>(payload + 8) else {
        return;
    };
    let broadcast = BOOTP_BROADCAST.to_be();
    if ciaddr_hi != 0 || ciaddr_lo != 0 || flags & broadcast != 0 {
        return;
    }
    // The UDP checksum, the last word of the UDP header; opaque as well: a
    // packet pointer with a negative constant offset is refused, whatever
    // its variable part.
    let check = black_box(payload - 2);
    f.rewrite_u16(payload + 10, flags, flags | broadcast, check);
}

#[inline(always)]
fn egress<W: Wire>(f: &W) {
    let udp = match locate(f) {
        Located::Udp(udp) => udp,
        Located::Ipv6(l3) => return egress6(f, l3),
        Located::Other | Located::Tagged => return,
    };
    if udp.sport != SERVER_PORT || udp.dport != CLIENT_PORT {
        return;
    }
    let ifindex = f.ifindex();
    // SAFETY: plain data, read only.
    let Some(port) = (unsafe { XDHCP_GUARD_PORTS.get(ifindex) }) else {
        return;
    };
    if port.flags & GUARD_LEARN == 0 {
        return;
    }
    if op(f, udp.payload) != Some(BOOTREPLY)
        || mac_at(f, udp.payload + CHADDR, port.mac) != Some(true)
    {
        return;
    }
    // Learning reads ACKs only (an OFFER or a NAK teaches it nothing); a
    // message whose type the scan cannot see goes on to the bucket.
    if message_type(f, udp.payload, udp.payload_len) == MessageType::Other {
        learn_count(LEARN_UNUSED);
        return;
    }
    learn_in_bucket(f, ifindex, GUARD_TO_WORKLOAD, GUARD_KIND_DHCP4, &udp);
}

/// [`egress`] for IPv6: a DHCPv6 REPLY (UDP from port 547 to port 546)
/// to the port's MAC, behind any extension headers the ingress walk
/// reads, is copied within the port's reply bucket (the one DHCPv4 ACKs
/// take from); another server message (ADVERTISE, RECONFIGURE) is counted
/// as unused. A DHCPv6 reply has no `chaddr`: a server sends it to the
/// client's link-local address, so the frame's Ethernet destination names
/// the client.
#[inline(always)]
fn egress6<W: Wire>(f: &W, l3: usize) {
    let Upper6::Udp(udp) = upper6(f, l3) else {
        return;
    };
    if udp.sport != DHCP6_SERVER_PORT || udp.dport != DHCP6_CLIENT_PORT {
        return;
    }
    let ifindex = f.ifindex();
    // SAFETY: plain data, read only.
    let Some(port) = (unsafe { XDHCP_GUARD_PORTS.get(ifindex) }) else {
        return;
    };
    if port.flags & GUARD_LEARN == 0 || mac_at(f, 0, port.mac) != Some(true) {
        return;
    }
    // Opaque, as in `broadcast_replies`: the walk's bounds tests are not
    // reused for this read.
    let payload = black_box(udp.payload);
    let Some([msg_type, _, _, _]) = f.read::<[u8; 4]>(payload) else {
        return;
    };
    if msg_type != DHCP6_REPLY {
        learn_count(LEARN_UNUSED);
        return;
    }
    learn_in_bucket(f, ifindex, GUARD_TO_WORKLOAD, GUARD_KIND_DHCP6, &udp);
}

/// [`learn`] within the port's bucket: a token taken for the message
/// `udp` frames, else it is shed and counted (`LEARN_SHED`).
#[inline(always)]
fn learn_in_bucket<W: Wire>(f: &W, ifindex: u32, direction: u16, kind: u16, udp: &Udp) {
    // SAFETY: helper without arguments.
    if !take_learn_token(ifindex, unsafe { bpf_ktime_get_ns() }) {
        learn_count(LEARN_SHED);
        return;
    }
    // SAFETY: helper without arguments.
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    learn(f, ifindex, direction, kind, udp, now);
}

#[inline(always)]
fn learn_count(slot: u32) {
    if let Some(c) = XDHCP_LEARN_COUNTERS.get_ptr_mut(slot) {
        // SAFETY: per-CPU slot, this program is the only writer on this CPU.
        unsafe { *c += 1 };
    }
}

/// Takes a token from learning port `ifindex`'s reply bucket at `now`
/// (`bpf_ktime_get_ns`), adding a full bucket for a port without one. A
/// plain read-modify-write, as [`take_token`]: two CPUs replying to one
/// port in the same nanoseconds may both pass on one token.
#[inline(always)]
fn take_learn_token(ifindex: u32, now: u64) -> bool {
    let limit = XDHCP_LEARN_LIMIT.get(0).copied().unwrap_or_default();
    let mut bucket = if let Some(b) = XDHCP_LEARN_BUCKETS.get_ptr_mut(ifindex) {
        // SAFETY: plain data in a map value that outlives this run.
        unsafe { *b }
    } else {
        let burst = if limit.burst == 0 {
            xdhcp_common::guard::LEARN_DEFAULT_BURST
        } else {
            limit.burst
        };
        LearnBucket {
            tokens: u64::from(burst) * LEARN_TOKEN,
            last_ns: now,
        }
    };
    let ok = learn_take(&mut bucket, limit, now);
    match XDHCP_LEARN_BUCKETS.get_ptr_mut(ifindex) {
        // SAFETY: as above.
        Some(b) => unsafe { b.write_volatile(bucket) },
        None => {
            // Full map: the reply is shed, as a full ring would lose it.
            if XDHCP_LEARN_BUCKETS
                .insert(ifindex, bucket, u64::from(BPF_NOEXIST))
                .is_err()
            {
                return false;
            }
        }
    }
    ok
}

/// What a reply's message type (option 53) says to learning.
#[derive(PartialEq, Eq)]
enum MessageType {
    /// An ACK, or a type the scan cannot see (option overload, more
    /// options than it reads): learning may use it.
    Learned,
    /// Any other type, or none (BOOTP): learning does not use it.
    Other,
}

/// Scans the options of the reply at `payload` for its message type, as
/// [`client_ids`] scans for client identifiers.
#[inline(always)]
fn message_type<W: Wire>(f: &W, payload: usize, payload_len: usize) -> MessageType {
    if f.read::<[u8; 4]>(payload + COOKIE) != Some(MAGIC_COOKIE) {
        return MessageType::Other;
    }
    let end = payload + payload_len;
    let mut off = payload + OPTIONS;
    for _ in 0..MAX_OPTIONS {
        if off >= end || off >= OPTIONS_LIMIT {
            break;
        }
        // Masked: a range the verifier sees the same on every round.
        let at = black_box(off) & (OPTIONS_LIMIT - 1);
        let Some([code, len]) = f.read::<[u8; 2]>(at) else {
            return MessageType::Other;
        };
        match code {
            OPT_PAD => {
                off = at + 1;
                continue;
            }
            OPT_END => return MessageType::Other,
            OPT_OVERLOAD => return MessageType::Learned,
            OPT_MESSAGE_TYPE => {
                // The length again with the value: a one-byte read's bound
                // test is compiled to a form the verifier does not credit.
                let Some([_, t]) = f.read::<[u8; 2]>(at + 1) else {
                    return MessageType::Other;
                };
                return if len == 1 && t == DHCPACK {
                    MessageType::Learned
                } else {
                    MessageType::Other
                };
            }
            _ => {}
        }
        off = at + 2 + usize::from(len);
    }
    // Ran out of the options the scan reads before the end: cannot tell.
    if off >= end {
        MessageType::Other
    } else {
        MessageType::Learned
    }
}

/// Copies the frame (up to the largest bucket) to the guard ring.
#[inline(always)]
fn learn<W: Wire>(f: &W, ifindex: u32, direction: u16, kind: u16, udp: &Udp, now: u64) {
    let frame_len = f.frame_len();
    let [small, large] = GUARD_BUCKETS;
    let way = (direction, kind);
    let ok = if frame_len <= small {
        emit::<W, { GUARD_BUCKETS[0] }>(f, ifindex, way, udp, now, frame_len)
    } else {
        let len = if frame_len > large { large } else { frame_len };
        emit::<W, { GUARD_BUCKETS[1] }>(f, ifindex, way, udp, now, len)
    };
    count(ifindex, if ok { GUARD_LEARNED } else { GUARD_LEARN_LOST });
}

#[inline(always)]
fn emit<W: Wire, const N: usize>(
    f: &W,
    ifindex: u32,
    (direction, kind): (u16, u16),
    udp: &Udp,
    now: u64,
    len: usize,
) -> bool {
    let Some(mut entry) = XDHCP_GUARD_EVENTS.reserve::<GuardRecord<N>>(0) else {
        return false;
    };
    let len = black_box(len);
    if len == 0 || len > N {
        entry.discard(0);
        return false;
    }
    let rec = entry.as_mut_ptr();
    // SAFETY: `rec` is a reserved, writable record of the right size.
    unsafe {
        addr_of_mut!((*rec).header).write(GuardHeader {
            ifindex,
            direction,
            kind,
            ts_ns: now,
            payload_offset: udp.payload as u32,
            payload_len: udp.payload_len as u32,
            captured_len: len as u32,
            frame_len: f.frame_len() as u32,
        });
    }
    // SAFETY: same record; its frame area has N >= len bytes.
    let dst = unsafe { addr_of_mut!((*rec).frame) }.cast::<u8>();
    let copied = f.copy_prefix::<N>(dst, len);
    if copied {
        entry.submit(0);
    } else {
        entry.discard(0);
    }
    copied
}

#[inline(always)]
fn tc_frame(ctx: &TcContext) -> TcFrame<'_> {
    TcFrame {
        ctx,
        start: ctx.data(),
        end: ctx.data_end(),
    }
}

/// TC ingress on the host end of a workload port: frames from the workload.
#[classifier]
#[expect(
    clippy::needless_pass_by_value,
    reason = "entry-point signature fixed by #[classifier]"
)]
pub fn xdhcp_guard_ingress(ctx: TcContext) -> i32 {
    let f = tc_frame(&ctx);
    match ingress(&f) {
        Verdict::Pass => TC_ACT_UNSPEC,
        Verdict::PassCounted(slot) => {
            count(f.ifindex(), slot);
            TC_ACT_UNSPEC
        }
        Verdict::Drop(reason) => {
            count(f.ifindex(), reason);
            TC_ACT_SHOT
        }
    }
}

/// XDP on the host end of a workload port: the ingress program's verdicts,
/// before any packet tap has the frame.
#[xdp]
#[expect(
    clippy::needless_pass_by_value,
    reason = "entry-point signature fixed by #[xdp]"
)]
pub fn xdhcp_guard_xdp(ctx: XdpContext) -> u32 {
    let f = XdpFrame {
        ctx: &ctx,
        start: ctx.data(),
        end: ctx.data_end(),
    };
    match ingress(&f) {
        Verdict::Pass => xdp_action::XDP_PASS,
        Verdict::PassCounted(slot) => {
            count(f.ifindex(), slot);
            xdp_action::XDP_PASS
        }
        Verdict::Drop(reason) => {
            count(f.ifindex(), reason);
            xdp_action::XDP_DROP
        }
    }
}

/// TC egress on the host end of a workload port: frames towards the
/// workload. Observes only; always passes.
#[classifier]
#[expect(
    clippy::needless_pass_by_value,
    reason = "entry-point signature fixed by #[classifier]"
)]
pub fn xdhcp_guard_egress(ctx: TcContext) -> i32 {
    egress(&tc_frame(&ctx));
    TC_ACT_UNSPEC
}

/// The do-nothing TC baseline of the guard's rows in `bench_xdp`; test
/// builds only (the `test-hooks` feature), never in the shipped object.
#[cfg(feature = "test-hooks")]
#[classifier]
pub fn xdhcp_guard_pass(_ctx: TcContext) -> i32 {
    TC_ACT_UNSPEC
}
