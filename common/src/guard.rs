//! Types shared by the DHCP guard programs (TC ingress and egress on the host
//! end of a workload port) and the agent.
//!
//! The guard is a program pair of its own, with its own maps, next to the
//! capture programs in the same object: it is attached per workload port
//! (the host-side peer of a pod's or VM's veth), not per uplink.
//!
//! - Ingress (frames *from* the workload): DHCP server messages are dropped
//!   unless the port is trusted; client messages are rate-limited per port
//!   (a token bucket, kept as a GCRA "theoretical arrival time"), and on a
//!   single-client port (every workload port whose MAC the agent knows)
//!   dropped when their Ethernet source, `chaddr` or a MAC-type client
//!   identifier (option 61, type 1) is not the port's MAC. A frame with more
//!   VLAN tags than the guard parses that may carry DHCP is dropped. Client
//!   messages that pass on a learning port are copied to
//!   [`MAP_GUARD_EVENTS`]; on a port with [`GUARD_BROADCAST`], those of a
//!   client without an address leave with the BOOTP broadcast flag set.
//!   IPv6 likewise: DHCPv6 server and relay messages, router
//!   advertisements and redirects are dropped unless the port is trusted
//!   (behind up to six extension headers; a frame whose upper layer the
//!   guard cannot find is dropped), DHCPv6 client messages take from the
//!   same bucket and on a single-client port must carry the port's MAC as
//!   Ethernet source and in a link-layer DUID. Each family has its own
//!   counters.
//!   On a learning port the DHCPv6 client messages that pass are copied
//!   too.
//! - Egress (frames *towards* the workload): on a learning port, the DHCP
//!   server replies learning uses (DHCPv4 ACKs whose `chaddr` is the
//!   port's MAC, DHCPv6 REPLYs to port 546 whose Ethernet destination is
//!   the port's MAC) are copied to [`MAP_GUARD_EVENTS`] as long as the port's bucket
//!   ([`MAP_LEARN_BUCKETS`]) has a token; other replies, and those over the
//!   bucket, are counted ([`MAP_LEARN_COUNTERS`]). Nothing is ever dropped.

/// Per-port configuration and rate-limiter state (`u32` ifindex → [`GuardPort`]).
/// A port without an entry is not guarded: everything passes.
pub const MAP_GUARD_PORTS: &str = "XDHCP_GUARD_PORTS";
/// Per-port, per-CPU drop and pass counters (`u32` ifindex → [`GuardCounters`]).
pub const MAP_GUARD_COUNTERS: &str = "XDHCP_GUARD_COUNTERS";
/// Ring buffer of observed guest DHCP exchanges ([`GuardRecord`]), for passive
/// learning. Separate from the capture ring: another consumer (the learning
/// task), another record, and it exists whether or not the capture datapath
/// is eBPF.
pub const MAP_GUARD_EVENTS: &str = "XDHCP_GUARD_EVENTS";

/// Per-port bucket of the replies a learning port copies to
/// [`MAP_GUARD_EVENTS`] (`u32` ifindex → [`LearnBucket`]). The agent writes
/// a full bucket when a port starts learning and removes it with the port;
/// the egress program adds one (full) for a learning port without it.
pub const MAP_LEARN_BUCKETS: &str = "XDHCP_LEARN_BUCKETS";
/// The learning buckets' rate and burst: one [`LearnLimit`] at index 0
/// (all zero: [`LEARN_DEFAULT_RATE`] and [`LEARN_DEFAULT_BURST`]).
pub const MAP_LEARN_LIMIT: &str = "XDHCP_LEARN_LIMIT";
/// Per-CPU counters of the replies on learning ports that did not reach
/// [`MAP_GUARD_EVENTS`], by reason (`LEARN_*` indices).
pub const MAP_LEARN_COUNTERS: &str = "XDHCP_LEARN_COUNTERS";

/// Default of the replies per second a learning port may copy to the guard
/// ring once its burst is spent. Learning reads only DHCPACKs: a guest
/// acknowledged more than a few times a second is a flood, not a client.
pub const LEARN_DEFAULT_RATE: u32 = 10;
/// Default burst of a learning port's bucket: ACKs copied back to back (a
/// guest's reboot, a server answering each retransmission).
pub const LEARN_DEFAULT_BURST: u32 = 20;
/// Largest rate and burst the agent writes (keeps the bucket's
/// nano-token arithmetic far from overflow).
pub const LEARN_MAX: u32 = 1_000_000;
/// The bucket's unit: one reply is this many nano-tokens.
pub const LEARN_TOKEN: u64 = 1_000_000_000;
/// Longest refill interval the program accounts for in one step
/// (`2^40` ns, about 18 minutes; times [`LEARN_MAX`] stays below `2^60`).
pub const LEARN_MAX_ELAPSED_NS: u64 = 1 << 40;

/// Value of [`MAP_LEARN_LIMIT`]. 8 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LearnLimit {
    /// Replies per second added to a port's bucket.
    pub rate: u32,
    /// The bucket's size in replies; 0: the defaults apply.
    pub burst: u32,
}

/// Value of [`MAP_LEARN_BUCKETS`]. 16 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LearnBucket {
    /// Tokens left, in units of 1/[`LEARN_TOKEN`] reply.
    pub tokens: u64,
    /// When the bucket was last refilled (`bpf_ktime_get_ns`).
    pub last_ns: u64,
}

/// Counter slots of [`MAP_LEARN_COUNTERS`].
pub const LEARN_COUNTER_SLOTS: u32 = 4;
/// A reply for a learning port's client that learning uses (a DHCPv4 ACK,
/// a DHCPv6 REPLY), over the port's bucket: passed, not copied.
pub const LEARN_SHED: u32 = 0;
/// A reply for a learning port's client that learning does not use (an
/// OFFER, a NAK, any type but ACK; a DHCPv6 ADVERTISE, any type but
/// REPLY): passed, not copied.
pub const LEARN_UNUSED: u32 = 1;
/// Counters in use.
pub const LEARN_COUNTER_COUNT: u32 = 2;

/// Takes one token from `bucket` at `now` (both in the program's clock),
/// refilling it at `limit`'s rate up to its burst first. The arithmetic of
/// the kernel's bucket, shared so the agent's tests check it too.
#[must_use]
pub const fn learn_take(bucket: &mut LearnBucket, limit: LearnLimit, now: u64) -> bool {
    let (rate, burst) = if limit.burst == 0 {
        (LEARN_DEFAULT_RATE, LEARN_DEFAULT_BURST)
    } else {
        (limit.rate, limit.burst)
    };
    let rate = if rate > LEARN_MAX { LEARN_MAX } else { rate };
    let burst = if burst > LEARN_MAX { LEARN_MAX } else { burst };
    let cap = burst as u64 * LEARN_TOKEN;
    let mut elapsed = now.saturating_sub(bucket.last_ns);
    if elapsed > LEARN_MAX_ELAPSED_NS {
        elapsed = LEARN_MAX_ELAPSED_NS;
    }
    let mut tokens = bucket.tokens.saturating_add(elapsed * rate as u64);
    if tokens > cap {
        tokens = cap;
    }
    bucket.last_ns = now;
    if tokens < LEARN_TOKEN {
        bucket.tokens = tokens;
        return false;
    }
    bucket.tokens = tokens - LEARN_TOKEN;
    true
}

/// TC ingress program (frames from the workload).
pub const PROG_GUARD_INGRESS: &str = "xdhcp_guard_ingress";
/// TC egress program (frames towards the workload).
pub const PROG_GUARD_EGRESS: &str = "xdhcp_guard_egress";
/// XDP program with the ingress program's verdicts, for a port that a
/// packet tap reads before TC ingress runs (a port of an Open vSwitch bridge
/// on the userspace datapath: `ovs-vswitchd` reads it through `AF_PACKET`).
pub const PROG_GUARD_XDP: &str = "xdhcp_guard_xdp";

/// Do-nothing TC program (returns `TC_ACT_UNSPEC`), the baseline of the
/// guard's rows in `bench_xdp`; only in objects built with the eBPF crate's
/// `test-hooks` feature.
pub const PROG_GUARD_PASS: &str = "xdhcp_guard_pass";

/// Capacity of [`MAP_GUARD_PORTS`] and [`MAP_GUARD_COUNTERS`]: guarded ports on a node.
pub const GUARD_PORTS_CAPACITY: u32 = 8192;
/// Size of [`MAP_GUARD_EVENTS`] in bytes: 128 records of the largest size,
/// many seconds of guest DHCP even for hundreds of VMs.
pub const GUARD_EVENTS_BYTES: u32 = 1 << 18;

/// [`GuardPort::flags`]: DHCP server messages from this port pass.
pub const GUARD_TRUSTED: u32 = 1 << 0;
/// [`GuardPort::flags`]: client messages must carry [`GuardPort::mac`] as
/// Ethernet source and `chaddr`, and in a client identifier of type 1
/// (`01` + MAC) if they carry one (one client behind the port: a pod's
/// interface, a VM).
pub const GUARD_SINGLE_CLIENT: u32 = 1 << 1;
/// [`GuardPort::flags`]: copy the port's DHCP exchanges to [`MAP_GUARD_EVENTS`].
pub const GUARD_LEARN: u32 = 1 << 2;
/// [`GuardPort::flags`]: set the BOOTP broadcast flag on the client
/// messages that pass from a guest without an address (`ciaddr` 0: a
/// DISCOVER, or a REQUEST while selecting or rebooting), fixing the UDP
/// checksum, so that servers answer by broadcast. A VM port whose logical
/// port security is pinned to another address (OVN-Kubernetes pins the
/// address its own one-shot leased) drops a unicast reply to the address a
/// guest's own client is offered; a broadcast reply passes it.
pub const GUARD_BROADCAST: u32 = 1 << 3;

/// The BOOTP `flags` field's broadcast bit (RFC 2131 §2), in host order.
pub const BOOTP_BROADCAST: u16 = 0x8000;

/// The UDP checksum after a 16-bit word of the datagram changed from `old`
/// to `new` (RFC 1624, eqn. 3: `HC' = ~(~HC + ~m + m')`). Every value is
/// as read from the wire (any byte order, the same for all three: one's
/// complement sums do not depend on it). A checksum of 0 means the sender
/// computed none (RFC 768) and stays 0; a result of 0 is sent as `0xffff`.
#[must_use]
pub const fn udp_checksum_replace(check: u16, old: u16, new: u16) -> u16 {
    if check == 0 {
        return 0;
    }
    let mut sum = (!check) as u32 + (!old) as u32 + new as u32;
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    let folded = !(sum as u16);
    if folded == 0 { 0xffff } else { folded }
}

/// Default client-message rate per port, messages per second (switch
/// vendors' DHCP snooping rate limits sit between 15 and 100 pps).
pub const GUARD_DEFAULT_RATE: u32 = 20;
/// Default burst: messages a quiet port may send back to back.
pub const GUARD_DEFAULT_BURST: u32 = 10;

/// Value of [`MAP_GUARD_PORTS`]. 40 bytes, no implicit padding.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuardPort {
    /// The workload's MAC (for [`GUARD_SINGLE_CLIENT`] and [`GUARD_LEARN`]).
    pub mac: [u8; 6],
    /// Reserved, zero.
    pub reserved: u16,
    /// `GUARD_*` flag bits.
    pub flags: u32,
    /// The configured rate in messages per second (informational; the
    /// program uses `interval_ns`).
    pub rate: u32,
    /// Nanoseconds per client message (1e9 / rate); 0 disables the limit.
    pub interval_ns: u64,
    /// How far ahead of now the bucket may run: `(burst - 1) * interval_ns`.
    pub tolerance_ns: u64,
    /// Rate-limiter state, written by the program: the theoretical arrival
    /// time of the next message (`bpf_ktime_get_ns` clock). User space
    /// writes 0 (a full bucket).
    pub tat_ns: u64,
}

impl GuardPort {
    /// A port entry with `flags`, `mac` and a bucket of `rate` messages per
    /// second and `burst` back to back (`rate == 0`: no limit).
    #[must_use]
    pub const fn new(flags: u32, mac: [u8; 6], rate: u32, burst: u32) -> Self {
        let (interval_ns, tolerance_ns) = if rate == 0 {
            (0, 0)
        } else {
            let interval = 1_000_000_000 / rate as u64;
            let burst = if burst == 0 { 1 } else { burst as u64 };
            (interval, (burst - 1) * interval)
        };
        Self {
            mac,
            reserved: 0,
            flags,
            rate,
            interval_ns,
            tolerance_ns,
            tat_ns: 0,
        }
    }
}

/// Counter slots of [`GuardCounters`]: 0–8 count IPv4 (DHCPv4), 9–17
/// IPv6 (DHCPv6, router advertisements, redirects).
pub const GUARD_COUNTER_SLOTS: usize = 18;
/// Client message passed.
pub const GUARD_PASSED_CLIENT: usize = 0;
/// Server message passed because the port is trusted.
pub const GUARD_PASSED_TRUSTED_SERVER: usize = 1;
/// Server message (UDP source port 67, destination port 68, or a BOOTREPLY)
/// from an untrusted port: dropped.
pub const GUARD_DROPPED_SERVER: usize = 2;
/// Client message over the port's rate: dropped.
pub const GUARD_DROPPED_RATE: usize = 3;
/// Client message whose Ethernet source, `chaddr` or type-1 client
/// identifier is not the port's MAC on a single-client port: dropped.
pub const GUARD_DROPPED_SPOOF: usize = 4;
/// UDP to port 67 too short for a BOOTP header (ingress): dropped.
pub const GUARD_DROPPED_MALFORMED: usize = 5;
/// Exchange copied to [`MAP_GUARD_EVENTS`] (either direction).
pub const GUARD_LEARNED: usize = 6;
/// [`MAP_GUARD_EVENTS`] full or the copy failed: the record is lost (the
/// frame's verdict is unaffected).
pub const GUARD_LEARN_LOST: usize = 7;
/// A frame the guard cannot classify on a guarded port, dropped because it
/// may be DHCP: more VLAN tags than the guard parses in front of IPv4 UDP
/// to or from port 67/68 (or too many to see what follows them); on a
/// single-client port, a client message whose options the guard cannot
/// check (more than one client identifier, option overload, more options
/// than it reads).
pub const GUARD_DROPPED_UNCLASSIFIED: usize = 8;

/// IPv6 client message (DHCPv6, UDP to port 547 of a client type) passed.
pub const GUARD_PASSED_CLIENT6: usize = 9;
/// DHCPv6 server message, router advertisement or redirect passed because
/// the port is trusted.
pub const GUARD_PASSED_TRUSTED6: usize = 10;
/// DHCPv6 message a server or relay sends (UDP source port 547,
/// destination port 546, or a type that is not a client's) from an
/// untrusted port: dropped.
pub const GUARD_DROPPED_SERVER6: usize = 11;
/// DHCPv6 client message over the port's rate (the IPv4 bucket): dropped.
pub const GUARD_DROPPED_RATE6: usize = 12;
/// DHCPv6 client message whose Ethernet source, or the MAC in a
/// link-layer DUID (DUID-LL, DUID-LLT of hardware type 1) in its Client
/// Identifier option, is not the port's MAC on a single-client port:
/// dropped.
pub const GUARD_DROPPED_SPOOF6: usize = 13;
/// UDP to port 547 too short for a DHCPv6 message type: dropped.
pub const GUARD_DROPPED_MALFORMED6: usize = 14;
/// An IPv6 frame the guard cannot classify on a guarded port, dropped
/// because it may be DHCPv6, a router advertisement or a redirect: its
/// upper-layer header is not found within the extension headers the guard
/// walks or within the frame (a first fragment without it); more VLAN tags
/// than the guard parses in front of such a frame or of DHCPv6, RA or
/// redirect; on a single-client port, a client message whose options the
/// guard cannot check (two Client Identifiers, more options than it
/// reads).
pub const GUARD_DROPPED_UNCLASSIFIED6: usize = 15;
/// ICMPv6 router advertisement (type 134) from an untrusted port: dropped
/// (RA guard, RFC 6105).
pub const GUARD_DROPPED_RA: usize = 16;
/// ICMPv6 redirect (type 137) from an untrusted port: dropped.
pub const GUARD_DROPPED_REDIRECT: usize = 17;

/// Value of [`MAP_GUARD_COUNTERS`] (per CPU; user space sums).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GuardCounters {
    pub slots: [u64; GUARD_COUNTER_SLOTS],
}

/// [`GuardHeader::direction`]: a client message from the workload (ingress).
pub const GUARD_FROM_WORKLOAD: u16 = 0;
/// [`GuardHeader::direction`]: a server reply towards the workload (egress).
pub const GUARD_TO_WORKLOAD: u16 = 1;

/// [`GuardHeader::kind`]: a DHCPv4 message in an IPv4 UDP datagram (0:
/// the one kind before the field was split off `direction`, whose upper
/// half was always zero).
pub const GUARD_KIND_DHCP4: u16 = 0;
/// [`GuardHeader::kind`]: a DHCPv6 message in an IPv6 UDP datagram (a
/// client message to port 547, or a server's REPLY to port 546); the
/// payload offset is behind whatever extension headers the frame has.
pub const GUARD_KIND_DHCP6: u16 = 1;
/// [`GuardHeader::kind`]: an ICMPv6 neighbour solicitation from `::` (a
/// workload's duplicate address detection of an address it configures
/// itself, RFC 4862 §5.4.2); the payload offset is the ICMPv6 header's,
/// the payload length the solicitation's fixed part (24 bytes).
pub const GUARD_KIND_DAD6: u16 = 2;

/// Header of one [`GuardRecord`]. 32 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuardHeader {
    /// ifindex of the guarded port (host side).
    pub ifindex: u32,
    /// [`GUARD_FROM_WORKLOAD`] or [`GUARD_TO_WORKLOAD`].
    pub direction: u16,
    /// What the frame carries, `GUARD_KIND_*` (a reader skips a kind it
    /// does not know).
    pub kind: u16,
    /// `bpf_ktime_get_coarse_ns()` at the observation.
    pub ts_ns: u64,
    /// Offset of the DHCP message in the frame.
    pub payload_offset: u32,
    /// UDP payload length from the UDP header.
    pub payload_len: u32,
    /// Bytes of the frame copied (`≤` the record's frame capacity).
    pub captured_len: u32,
    /// Length of the frame as the program saw it.
    pub frame_len: u32,
}

/// Bytes before the frame in a [`GuardRecord`].
pub const GUARD_HEADER_LEN: usize = 32;
/// Frame capacities of guard records, smallest first (as for capture
/// records). Powers of two: the program bounds the copy length with a mask.
pub const GUARD_BUCKETS: [usize; 2] = [1024, 2048];

/// One record of [`MAP_GUARD_EVENTS`]: header, then room for `N` frame bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GuardRecord<const N: usize> {
    pub header: GuardHeader,
    pub frame: [u8; N],
}

const _: () = assert!(core::mem::size_of::<GuardPort>() == 40);
const _: () = assert!(core::mem::size_of::<LearnLimit>() == 8);
const _: () = assert!(core::mem::size_of::<LearnBucket>() == 16);
const _: () = assert!(LEARN_MAX_ELAPSED_NS.checked_mul(LEARN_MAX as u64).is_some());
const _: () = assert!((LEARN_MAX as u64).checked_mul(LEARN_TOKEN).is_some());
const _: () = assert!(core::mem::size_of::<GuardHeader>() == GUARD_HEADER_LEN);
const _: () = assert!(core::mem::offset_of!(GuardRecord<1024>, frame) == GUARD_HEADER_LEN);
const _: () = assert!(GUARD_BUCKETS[0].is_power_of_two() && GUARD_BUCKETS[1].is_power_of_two());
const _: () = assert!(core::mem::size_of::<GuardCounters>() == 8 * GUARD_COUNTER_SLOTS);

#[cfg(feature = "user")]
mod user {
    // SAFETY: #[repr(C)], Copy, integers only, no padding (asserted above).
    unsafe impl aya::Pod for super::GuardPort {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::GuardCounters {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::GuardHeader {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::LearnLimit {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::LearnBucket {}
}

#[cfg(test)]
mod tests {
    use super::{LEARN_TOKEN, LearnBucket, LearnLimit, learn_take, udp_checksum_replace};

    #[test]
    fn the_learning_bucket_gives_its_burst_then_its_rate() {
        let limit = LearnLimit { rate: 10, burst: 3 };
        let mut b = LearnBucket {
            tokens: 3 * LEARN_TOKEN,
            last_ns: 1_000,
        };
        let now = 1_000;
        assert!((0..3).all(|_| learn_take(&mut b, limit, now)));
        assert!(!learn_take(&mut b, limit, now));
        // 10 per second: one token after 100 ms, not before.
        assert!(!learn_take(&mut b, limit, now + 99_000_000));
        assert!(learn_take(&mut b, limit, now + 100_000_000));
        assert!(!learn_take(&mut b, limit, now + 100_000_000));
        // A long quiet time refills to the burst, no more.
        let later = now + 3_600 * 1_000_000_000;
        assert!((0..3).all(|_| learn_take(&mut b, limit, later)));
        assert!(!learn_take(&mut b, limit, later));
    }

    #[test]
    fn an_unset_limit_is_the_default_and_a_clock_going_back_adds_nothing() {
        let mut b = LearnBucket {
            tokens: 0,
            last_ns: 5_000_000_000,
        };
        assert!(!learn_take(&mut b, LearnLimit::default(), 1));
        assert_eq!(b.tokens, 0);
        // Defaults: 10 per second.
        assert!(learn_take(&mut b, LearnLimit::default(), 1 + 100_000_000));
        // The largest values do not overflow.
        let max = LearnLimit {
            rate: u32::MAX,
            burst: u32::MAX,
        };
        let mut b = LearnBucket::default();
        assert!(learn_take(&mut b, max, u64::MAX));
    }

    /// The one's complement sum of `words`, folded (host order).
    fn sum(words: &[u16]) -> u16 {
        let mut s: u32 = words.iter().map(|&w| u32::from(w)).sum();
        while s > 0xffff {
            s = (s & 0xffff) + (s >> 16);
        }
        s as u16
    }

    /// The checksum of `words` as a sender computes it (0 sent as 0xffff).
    fn checksum(words: &[u16]) -> u16 {
        match !sum(words) {
            0 => 0xffff,
            c => c,
        }
    }

    #[test]
    fn the_incremental_checksum_is_the_recomputed_one() {
        // Words of a datagram (pseudo-header folded in); word 5 is the
        // BOOTP flags field the guard rewrites.
        let fixed: [[u16; 8]; 4] = [
            [
                0xc0a8, 0x0001, 0x0011, 0x0134, 0x0044, 0x0000, 0x1234, 0xabcd,
            ],
            [
                0xffff, 0xffff, 0x0000, 0x0000, 0x0001, 0x0000, 0x0000, 0x0000,
            ],
            [
                0x0000, 0x0000, 0x0000, 0x0000, 0x0000, 0x0000, 0x0000, 0x0001,
            ],
            [
                0x7fff, 0x8000, 0x0000, 0x0000, 0x0000, 0x0000, 0x0000, 0x0000,
            ],
        ];
        for words in fixed {
            check(words);
        }
        // A pseudo-random spread as well.
        let mut x: u32 = 0x1234_5678;
        for _ in 0..2000 {
            let mut words = [0u16; 8];
            for w in &mut words {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                *w = x as u16;
            }
            words[5] &= 0x7fff;
            check(words);
        }
    }

    fn check(words: [u16; 8]) {
        let before = checksum(&words);
        let mut after = words;
        after[5] |= 0x8000;
        let want = checksum(&after);
        let got = udp_checksum_replace(before, words[5], after[5]);
        // 0x0000 and 0xffff are the same one's complement value; a sender
        // never sends 0 and neither does the update.
        assert_ne!(got, 0, "{words:04x?}");
        assert_eq!(
            sum(&[!got]),
            sum(&[!want]),
            "{words:04x?}: {got:#06x} vs {want:#06x}"
        );
        // The receiver's check holds: the sum over the datagram with its
        // checksum is all ones.
        let mut with = [0u16; 9];
        with[..8].copy_from_slice(&after);
        with[8] = got;
        assert_eq!(sum(&with), 0xffff, "{words:04x?}");
    }

    #[test]
    fn a_datagram_without_a_checksum_keeps_none() {
        assert_eq!(udp_checksum_replace(0, 0x0000, 0x8000), 0);
    }

    #[test]
    fn byte_order_does_not_matter() {
        let (check, old, new) = (0x1a2bu16, 0x0000u16, 0x8000u16);
        let host = udp_checksum_replace(check, old, new);
        let wire = udp_checksum_replace(check.swap_bytes(), old.swap_bytes(), new.swap_bytes());
        assert_eq!(host, wire.swap_bytes());
    }
}
