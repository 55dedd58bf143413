//! Types shared by the xdhcp eBPF programs and the user-space agent.
//!
//! Everything here is `#[repr(C)]`, `Copy`, free of `bool` and implicit padding,
//! and implements `aya::Pod` behind the `user` feature. Map names, capacities,
//! counter indices and verdict codes are defined here once; both sides use them.
#![no_std]

/// The rustup toolchain that builds the eBPF object: the machine's installed
/// nightly (never a downloaded one). Used by `agent/build.rs` and by
/// `cargo xtask setup`, which builds bpf-linker against this toolchain's LLVM.
pub const EBPF_TOOLCHAIN: &str = "nightly";

pub mod guard;

/// Name of the BPF ring buffer carrying [`CaptureRecord`]s to user space.
pub const MAP_EVENTS: &str = "XDHCP_EVENTS";
/// Name of the per-CPU counter array (indices are the `COUNTER_*` constants).
pub const MAP_COUNTERS: &str = "XDHCP_COUNTERS";
/// Name of the xid ownership hash map (`u32` xid in network byte order → [`Owned`]).
pub const MAP_OWNED: &str = "XDHCP_OWNED";
/// Name of the `DHCPv6` ownership hash map ([`Owned6Key`] → [`Owned`]): a
/// reply is owned by its transaction id *and* the IAID of its `IA_NA`, so a
/// 24-bit transaction id another client happens to use is not enough to take
/// its reply, and the two families' ids never meet in one key space.
pub const MAP_OWNED6: &str = "XDHCP_OWNED6";
/// Name of the per-ifindex configuration hash map (`u32` ifindex → [`IfConfig`]).
/// The source of truth; the programs read it only for ifindexes at or above
/// [`IFCONFIG_DIRECT_SLOTS`].
pub const MAP_IFCONFIG: &str = "XDHCP_IFCFG";
/// Name of the array mirror of [`MAP_IFCONFIG`] indexed by ifindex, for
/// ifindexes below [`IFCONFIG_DIRECT_SLOTS`] (an all-zero slot is
/// [`MODE_OFF`]). An array lookup is inlined by the verifier; a hash lookup
/// is a helper call that hashes and compares the key (~28 ns per captured
/// frame in `bench_xdp`).
pub const MAP_IFCONFIG_DIRECT: &str = "XDHCP_IFCFG_DIRECT";

/// Name of the uplink configuration hash map (`u32` ifindex in the agent's
/// own network namespace → [`IfConfig`]), read only by the uplink programs
/// ([`PROG_UPLINK_XDP`], [`PROG_UPLINK_TC`]). Uplinks have a map of their
/// own because ifindexes repeat across namespaces: a pod's `eth0` may have
/// the very index of a node uplink, and the per-port map
/// ([`MAP_IFCONFIG`]) is keyed by ifindex alone. The role (uplink or
/// workload port) is the program's own, so the two key spaces never meet.
pub const MAP_UPLINKS: &str = "XDHCP_UPLINKS";

/// Program names (entry points) in the eBPF object.
pub const PROG_XDP: &str = "xdhcp_xdp";
/// TC clsact ingress twin of [`PROG_XDP`].
pub const PROG_TC: &str = "xdhcp_tc";
/// XDP capture program for a node uplink (a NIC, bond or bridge port that
/// carries a localnet network): the same parser and verdicts as
/// [`PROG_XDP`], its mode read from [`MAP_UPLINKS`], its records flagged
/// [`FLAG_UPLINK`].
pub const PROG_UPLINK_XDP: &str = "xdhcp_uplink_xdp";
/// TC (clsact ingress) twin of [`PROG_UPLINK_XDP`] (uplinks that are veths).
pub const PROG_UPLINK_TC: &str = "xdhcp_uplink_tc";
/// Do-nothing XDP program (returns `XDP_PASS`), the baseline of `bench_xdp`;
/// only in objects built with the eBPF crate's `test-hooks` feature.
pub const PROG_XDP_PASS: &str = "xdhcp_xdp_pass";

/// Ring buffer size in bytes (power of two, multiple of the page size):
/// 2383 records of a minimal 342-byte DHCP frame, 498 of the largest.
pub const EVENTS_BYTES: u32 = 1 << 20;
/// Capacity of the ownership map: open DHCP transactions on the node.
pub const OWNED_CAPACITY: u32 = 65_536;
/// Capacity of the `DHCPv6` ownership map.
pub const OWNED6_CAPACITY: u32 = 16_384;
/// Capacity of the uplink configuration map: uplinks on one node.
pub const UPLINKS_CAPACITY: u32 = 256;
/// Capacity of the interface configuration map.
pub const IFCONFIG_CAPACITY: u32 = 4096;
/// Slots of [`MAP_IFCONFIG_DIRECT`]: ifindexes `0..IFCONFIG_DIRECT_SLOTS`.
pub const IFCONFIG_DIRECT_SLOTS: u32 = 16_384;

/// Largest frame prefix copied into a capture record: Ethernet (14) + one
/// VLAN tag (4) + an IPv4 header with every option (60) + UDP (8) + a DHCP
/// message of up to 1962 bytes (1472, the largest on a 1500-byte MTU, fits
/// with room). A power of two: the programs bound the copy length with a mask
/// the verifier can follow.
pub const MAX_FRAME_LEN: usize = 2048;
/// Smallest UDP payload the kernel accepts as a DHCP message: the fixed BOOTP
/// header (236 bytes) plus the magic cookie (RFC 2131 §3).
pub const MIN_DHCP_LEN: usize = 240;

/// Per-interface mode: pass everything, capture nothing.
pub const MODE_OFF: u32 = 0;
/// Per-interface mode: capture server→client DHCP frames whose xid is
/// owned, pass them all on.
pub const MODE_OBSERVE: u32 = 1;
/// Per-interface mode: capture and drop frames whose xid is in the ownership
/// map; pass the others uncaptured.
pub const MODE_INTERCEPT: u32 = 2;

/// Verdict recorded in [`CaptureHeader::verdict`]: the frame continued up the stack.
pub const VERDICT_PASS: u32 = 0;
/// Verdict recorded in [`CaptureHeader::verdict`]: the frame was dropped (owned xid).
pub const VERDICT_DROP: u32 = 1;

/// [`CaptureHeader::vlan`] when the frame carried no VLAN tag.
pub const VLAN_NONE: u32 = u32::MAX;

/// [`CaptureHeader::flags`]: captured by the XDP program.
pub const FLAG_XDP: u32 = 1 << 0;
/// [`CaptureHeader::flags`]: captured by the TC program.
pub const FLAG_TC: u32 = 1 << 1;
/// [`CaptureHeader::flags`]: the xid was found in the ownership map.
pub const FLAG_OWNED: u32 = 1 << 2;
/// [`CaptureHeader::flags`]: the UDP datagram was longer than [`MAX_FRAME_LEN`];
/// only a prefix was copied (and the frame was passed, never dropped).
pub const FLAG_TRUNCATED: u32 = 1 << 3;
/// [`CaptureHeader::flags`]: the VLAN id came from skb metadata (tag stripped by
/// the device), not from the frame bytes.
pub const FLAG_VLAN_OFFLOAD: u32 = 1 << 4;

/// [`CaptureHeader::flags`]: captured by an uplink program (the ifindex is
/// then one of the agent's own namespace).
pub const FLAG_UPLINK: u32 = 1 << 5;

/// [`CaptureHeader::flags`]: a `DHCPv6` server message (IPv6, UDP 547 → 546);
/// [`CaptureHeader::xid`] then holds its 24-bit transaction id (the
/// message's first four bytes with the type byte zeroed, as on the wire).
pub const FLAG_DHCP6: u32 = 1 << 6;

/// Counter slot no longer counted: it held the frames that are neither an
/// IPv4/UDP 67→68 nor an IPv6/UDP 547→546 datagram (ARP, TCP, other UDP, a
/// client message). That one per-CPU increment on every frame of the
/// localnet was most of what the capture programs cost a frame that is not
/// DHCP (2–3 ns of 3–5 over a bare program); the interface's own counters
/// count those frames. Kept so the other counters keep their indexes in a
/// map an older agent pinned.
pub const COUNTER_RETIRED_NOT_DHCP: u32 = 0;
/// Counter slot no longer counted: it held the frames copied into the ring
/// buffer. The agent counts them as it reads their records, and from each
/// record's header the two outcomes below it (it was dropped; it passed in
/// intercept mode), which the record says. Kept, as
/// [`COUNTER_RETIRED_NOT_DHCP`] is, for the other counters' indexes.
pub const COUNTER_RETIRED_CAPTURED: u32 = 1;
/// Counter slot no longer counted: a captured frame dropped (see
/// [`COUNTER_RETIRED_CAPTURED`]).
pub const COUNTER_RETIRED_DROPPED_OWNED: u32 = 2;
/// Counter: ring buffer full, frame passed without capture.
pub const COUNTER_RINGBUF_FULL: u32 = 3;
/// Counter: truncated or malformed Ethernet/IPv4/UDP/BOOTP framing, passed.
pub const COUNTER_MALFORMED: u32 = 4;
/// Counter: IPv4 UDP fragment (first or later), passed.
pub const COUNTER_FRAGMENT: u32 = 5;
/// Counter: DHCP frame on an interface whose mode is off (or unconfigured), passed.
pub const COUNTER_MODE_OFF: u32 = 6;
/// Counter slot no longer counted: a captured frame passed in intercept
/// mode (see [`COUNTER_RETIRED_CAPTURED`]).
pub const COUNTER_RETIRED_PASSED_UNOWNED: u32 = 7;
/// Counter: copying the frame into the reserved record failed; record discarded, frame passed.
pub const COUNTER_LOAD_ERROR: u32 = 8;
/// Counter: DHCP reply whose xid is not in the ownership map, passed in the
/// kernel without a record (observe or intercept mode). Nothing in user
/// space reads a capture record it cannot route by xid: a flood of replies
/// that belong to no lease costs the agent nothing and cannot fill the ring
/// that carries the owned ones.
pub const COUNTER_UNOWNED_UNCAPTURED: u32 = 9;
/// Number of counters in use.
pub const COUNTER_COUNT: u32 = 10;
/// Slots in the counter array (room for new counters without a layout change).
pub const COUNTER_SLOTS: u32 = 16;

/// Per-interface configuration, value of [`MAP_IFCONFIG`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IfConfig {
    /// One of [`MODE_OFF`], [`MODE_OBSERVE`], [`MODE_INTERCEPT`]; anything else acts as off.
    pub mode: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

/// Value of [`MAP_OWNED`]: presence is what matters; `ifindex` is informational.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owned {
    /// Interface the transaction runs on (0 = any).
    pub ifindex: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

/// Key of [`MAP_OWNED6`]: a `DHCPv6` transaction id and the IAID of the
/// message's `IA_NA`, both as on the wire.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Owned6Key {
    /// The message's first four bytes with the type byte zeroed (network
    /// byte order in memory): `[0, t0, t1, t2]`.
    pub xid: u32,
    /// The IAID, the first four bytes of the `IA_NA` option's data.
    pub iaid: u32,
}

impl Owned6Key {
    /// The key of transaction `xid` (24 bits, host order, as the engine
    /// reports it) for `iaid` (host order).
    #[must_use]
    pub const fn new(xid: u32, iaid: u32) -> Self {
        Self {
            xid: u32::from_ne_bytes((xid & 0x00ff_ffff).to_be_bytes()),
            iaid: u32::from_ne_bytes(iaid.to_be_bytes()),
        }
    }
}

/// Header of one captured DHCP server→client frame in [`MAP_EVENTS`]; the
/// frame bytes follow it in the same record ([`CaptureRecord`]).
///
/// 48 bytes, no implicit padding.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CaptureHeader {
    /// Ingress interface index (in the namespace of the device).
    pub ifindex: u32,
    /// Receive queue (XDP: `rx_queue_index`; TC: recorded rx queue or 0).
    pub rx_queue: u32,
    /// `bpf_ktime_get_coarse_ns()`: `CLOCK_MONOTONIC` at tick resolution
    /// (the kernel's `CLOCK_MONOTONIC_COARSE`), at capture.
    pub ts_ns: u64,
    /// [`VERDICT_PASS`] or [`VERDICT_DROP`].
    pub verdict: u32,
    /// VLAN id (12 bits) of the one tag, or [`VLAN_NONE`].
    pub vlan: u32,
    /// Full length of the frame on the wire (as seen by the program).
    pub frame_len: u32,
    /// Bytes valid in the record's frame area (`≤` its capacity `≤ MAX_FRAME_LEN`).
    pub captured_len: u32,
    /// Offset of the UDP payload (the DHCP message) in the frame.
    pub payload_offset: u32,
    /// UDP payload length from the UDP header.
    pub payload_len: u32,
    /// The DHCP xid exactly as on the wire (network byte order in memory);
    /// with [`FLAG_DHCP6`], the `DHCPv6` transaction id (see there).
    pub xid: u32,
    /// `FLAG_*` bits.
    pub flags: u32,
}

/// Bytes before the frame in a record.
pub const CAPTURE_HEADER_LEN: usize = 48;

/// Frame capacities of the capture records, smallest first. The programs
/// reserve the smallest record whose frame area holds the captured prefix
/// (`bpf_ringbuf_reserve` takes a size fixed at load time, hence a few
/// sizes rather than the exact length): a minimal 342-byte DHCP frame takes
/// a 432-byte record instead of a 2096-byte one. Compact records are what
/// makes a capture cheap: the copy writes into ring memory that is cold,
/// and records laid end to end let the CPU stream those writes (see
/// `docs/kernel.md`). 384: a frame with a DHCP message of up to 342 bytes
/// (the 300-byte BOOTP minimum and short option lists); 640: up to 598 (the
/// 576-byte datagram every client must accept); 1024; 1536: a full
/// 1500-byte MTU frame; [`MAX_FRAME_LEN`]. Multiples of 8, so every record
/// stays 8-byte aligned.
pub const FRAME_BUCKETS: [usize; 5] = [384, 640, 1024, 1536, MAX_FRAME_LEN];

/// One record of [`MAP_EVENTS`]: the header, then room for `N` frame bytes
/// (`N` one of [`FRAME_BUCKETS`]). The record's length in the ring is
/// `CAPTURE_HEADER_LEN + N`; [`CaptureHeader::captured_len`] bytes of the
/// frame area are valid.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CaptureRecord<const N: usize> {
    pub header: CaptureHeader,
    /// The frame prefix (only `header.captured_len` bytes are meaningful).
    pub frame: [u8; N],
}

/// Frame capacity of the record the programs use for a captured prefix of
/// `captured_len` bytes (`captured_len ≤ MAX_FRAME_LEN`; larger values get
/// [`MAX_FRAME_LEN`]).
#[must_use]
pub const fn frame_bucket(captured_len: usize) -> usize {
    let mut i = 0;
    while i < FRAME_BUCKETS.len() {
        if captured_len <= FRAME_BUCKETS[i] {
            return FRAME_BUCKETS[i];
        }
        i += 1;
    }
    MAX_FRAME_LEN
}

/// Length of the ring-buffer record holding a captured prefix of
/// `captured_len` bytes (without the ring's own 8-byte record header).
#[must_use]
pub const fn record_len(captured_len: usize) -> usize {
    CAPTURE_HEADER_LEN + frame_bucket(captured_len)
}

const _: () = assert!(core::mem::size_of::<CaptureHeader>() == CAPTURE_HEADER_LEN);
const _: () = assert!(core::mem::offset_of!(CaptureRecord<384>, frame) == CAPTURE_HEADER_LEN);
const _: () = assert!(MAX_FRAME_LEN.is_power_of_two());
const _: () = {
    let mut i = 0;
    while i < FRAME_BUCKETS.len() {
        assert!(FRAME_BUCKETS[i].is_multiple_of(8) && FRAME_BUCKETS[i] <= MAX_FRAME_LEN);
        assert!(i == 0 || FRAME_BUCKETS[i - 1] < FRAME_BUCKETS[i]);
        i += 1;
    }
    assert!(FRAME_BUCKETS[FRAME_BUCKETS.len() - 1] == MAX_FRAME_LEN);
};
const _: () = assert!(core::mem::size_of::<IfConfig>() == 8);
const _: () = assert!(core::mem::size_of::<Owned>() == 8);
const _: () = assert!(core::mem::size_of::<Owned6Key>() == 8);

#[cfg(feature = "user")]
mod user {
    // SAFETY: all three types are #[repr(C)], Copy, made of integers only,
    // with no padding (checked by the const assertions above).
    unsafe impl aya::Pod for super::IfConfig {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::Owned {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::CaptureHeader {}
    // SAFETY: see above (two u32, no padding).
    unsafe impl aya::Pod for super::Owned6Key {}
}
