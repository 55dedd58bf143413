//! xdhcp kernel programs: an XDP program and its TC (clsact ingress) twin that
//! share one parser. Both find DHCPv4 server→client frames (Ethernet, at most
//! one 802.1Q/802.1ad tag, IPv4 with any IHL, not a fragment, UDP 67 → 68)
//! whose xid the agent owns, and `DHCPv6` ADVERTISEs and REPLYs (IPv6 with
//! no extension header, UDP 547 → 546) whose transaction id and `IA_NA`
//! IAID the agent owns, copy them into a ring buffer for the agent and,
//! in intercept mode, drop them. Replies with an xid the agent does not own
//! pass without a record: nothing for user space that it does not need.
//! Everything else passes unchanged. Every outcome of a DHCP frame but a
//! capture bumps a per-CPU counter; a capture is counted by the agent from
//! its record. Fail-open: any doubt means "pass".
//!
//! The same pair exists twice: for workload ports (a pod's interface, a VF
//! netdev) and for node uplinks (`xdhcp_uplink_*`). The two differ only in
//! where they read their mode — [`XDHCP_IFCFG`] or [`XDHCP_UPLINKS`] — and
//! in the flag on their records, so an ifindex of a pod's namespace never
//! selects an uplink's configuration or the other way round.
#![no_std]
#![no_main]
#![expect(
    clippy::inline_always,
    reason = "eBPF: helpers must inline into the entry point so the verifier sees one bounds-checked flow"
)]

mod guard;
mod parse;

use core::ffi::c_void;
use core::hint::black_box;
use core::ptr::addr_of_mut;

use aya_ebpf::bindings::{TC_ACT_SHOT, TC_ACT_UNSPEC, xdp_action};
use aya_ebpf::helpers::generated::{bpf_ktime_get_coarse_ns, bpf_skb_load_bytes};
use aya_ebpf::macros::{classifier, map, xdp};
use aya_ebpf::maps::{Array, HashMap, PerCpuArray, RingBuf};
use aya_ebpf::programs::{TcContext, XdpContext};
use xdhcp_common::{
    COUNTER_FRAGMENT, COUNTER_LOAD_ERROR, COUNTER_MALFORMED, COUNTER_MODE_OFF,
    COUNTER_RINGBUF_FULL, COUNTER_SLOTS, COUNTER_UNOWNED_UNCAPTURED, CaptureHeader, CaptureRecord,
    EVENTS_BYTES, FLAG_DHCP6, FLAG_OWNED, FLAG_TC, FLAG_TRUNCATED, FLAG_UPLINK, FLAG_VLAN_OFFLOAD,
    FLAG_XDP, FRAME_BUCKETS, IFCONFIG_CAPACITY, IFCONFIG_DIRECT_SLOTS, IfConfig, MAX_FRAME_LEN,
    MODE_INTERCEPT, MODE_OBSERVE, OWNED_CAPACITY, OWNED6_CAPACITY, Owned, Owned6Key,
    UPLINKS_CAPACITY, VERDICT_DROP, VERDICT_PASS, VLAN_NONE,
};

use crate::parse::{Class, Dhcp, Packet, classify};

/// Capture records for the agent ([`xdhcp_common::MAP_EVENTS`]).
#[map]
static XDHCP_EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_BYTES, 0);

/// Per-CPU outcome counters ([`xdhcp_common::MAP_COUNTERS`]).
#[map]
static XDHCP_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_SLOTS, 0);

/// Owned xids, wire byte order ([`xdhcp_common::MAP_OWNED`]).
#[map]
static XDHCP_OWNED: HashMap<u32, Owned> = HashMap::with_max_entries(OWNED_CAPACITY, 0);

/// Owned `DHCPv6` transactions: transaction id and IAID, as on the wire
/// ([`xdhcp_common::MAP_OWNED6`]).
#[map]
static XDHCP_OWNED6: HashMap<Owned6Key, Owned> = HashMap::with_max_entries(OWNED6_CAPACITY, 0);

/// Mode per ingress ifindex ([`xdhcp_common::MAP_IFCONFIG`]); absent means off.
#[map]
static XDHCP_IFCFG: HashMap<u32, IfConfig> = HashMap::with_max_entries(IFCONFIG_CAPACITY, 0);

/// Array mirror of [`XDHCP_IFCFG`] for small ifindexes
/// ([`xdhcp_common::MAP_IFCONFIG_DIRECT`]); a zero slot means off.
#[map]
static XDHCP_IFCFG_DIRECT: Array<IfConfig> = Array::with_max_entries(IFCONFIG_DIRECT_SLOTS, 0);

/// Mode per uplink ifindex, in the agent's own namespace
/// ([`xdhcp_common::MAP_UPLINKS`]); absent means off. Read only by the
/// uplink programs.
#[map]
static XDHCP_UPLINKS: HashMap<u32, IfConfig> = HashMap::with_max_entries(UPLINKS_CAPACITY, 0);

/// Which attachment a program serves: selects the mode map and the record flag.
const PORT: bool = false;
/// See [`PORT`].
const UPLINK: bool = true;

/// Where the frame came from, as recorded in the capture event.
struct Meta {
    ifindex: u32,
    rx_queue: u32,
    flags: u32,
    /// VLAN id the device stripped into metadata (TC only), or [`VLAN_NONE`].
    offload_vlan: u32,
}

/// What the program-type glue must provide besides bounded header reads.
trait Capture: Packet {
    /// Interface, queue and flags for the record (read only for DHCP frames).
    fn meta(&self) -> Meta;
    /// Copy the first `len` bytes (1..=`N`) of the frame to `dst`, which has
    /// room for `N` bytes.
    fn copy_prefix<const N: usize>(&self, dst: *mut u8, len: usize) -> bool;
}

#[inline(always)]
fn count(index: u32) {
    if let Some(slot) = XDHCP_COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, this program is the only writer on this CPU.
        unsafe { *slot += 1 };
    }
}

/// Classifies the frame and acts on it (`UPLINK`: as an uplink program).
/// Returns `true` to drop.
#[inline(always)]
fn process<P: Capture, const ROLE: bool>(pkt: &P) -> bool {
    match classify(pkt) {
        // Counted nowhere: on an uplink this is nearly every frame, and a
        // per-CPU increment was most of what the program cost it.
        Class::NotDhcp => false,
        Class::Malformed => {
            count(COUNTER_MALFORMED);
            false
        }
        Class::Fragment => {
            count(COUNTER_FRAGMENT);
            false
        }
        Class::Dhcp(dhcp) => capture::<P, ROLE>(pkt, &pkt.meta(), &dhcp),
        Class::Unkeyed6 => {
            count(COUNTER_UNOWNED_UNCAPTURED);
            false
        }
    }
}

#[inline(always)]
fn capture<P: Capture, const ROLE: bool>(pkt: &P, meta: &Meta, dhcp: &Dhcp) -> bool {
    // Uplinks: their own map (a handful of entries, in the agent's
    // namespace). Ports: small ifindexes in the array mirror (an inlined
    // lookup), others in the hash.
    // SAFETY: the value is plain data; a concurrent update from user space can
    // at worst give us a stale mode, which is harmless.
    let cfg = if ROLE == UPLINK {
        unsafe { XDHCP_UPLINKS.get(meta.ifindex) }
    } else if meta.ifindex < IFCONFIG_DIRECT_SLOTS {
        XDHCP_IFCFG_DIRECT.get(meta.ifindex)
    } else {
        unsafe { XDHCP_IFCFG.get(meta.ifindex) }
    };
    let mode = match cfg {
        Some(cfg) => cfg.mode,
        None => xdhcp_common::MODE_OFF,
    };
    if mode != MODE_OBSERVE && mode != MODE_INTERCEPT {
        count(COUNTER_MODE_OFF);
        return false;
    }
    // A reply no lease of this agent waits for stays in the kernel: user
    // space would only count it as unrouted, and a flood of them would
    // fill the ring the owned ones need.
    // A DHCPv6 reply is owned by its transaction id and IAID together.
    // SAFETY: presence tests only.
    let known = match dhcp.iaid6 {
        None => unsafe { XDHCP_OWNED.get(dhcp.xid) }.is_some(),
        Some(iaid) => unsafe {
            XDHCP_OWNED6.get(Owned6Key {
                xid: dhcp.xid,
                iaid,
            })
        }
        .is_some(),
    };
    if !known {
        count(COUNTER_UNOWNED_UNCAPTURED);
        return false;
    }
    let owned = mode == MODE_INTERCEPT;

    let end = dhcp.payload_offset + dhcp.payload_len;
    let truncated = end > MAX_FRAME_LEN as u32;
    let len = if truncated { MAX_FRAME_LEN as u32 } else { end };
    // Never drop what we could not hand over completely (fail-open).
    let drop = owned && !truncated;

    let (vlan, vlan_flag) = if dhcp.vlan != VLAN_NONE {
        (dhcp.vlan, 0)
    } else if meta.offload_vlan != VLAN_NONE {
        (meta.offload_vlan, FLAG_VLAN_OFFLOAD)
    } else {
        (VLAN_NONE, 0)
    };
    let mut flags = meta.flags | vlan_flag;
    if ROLE == UPLINK {
        flags |= FLAG_UPLINK;
    }
    if owned {
        flags |= FLAG_OWNED;
    }
    if truncated {
        flags |= FLAG_TRUNCATED;
    }
    if dhcp.iaid6.is_some() {
        flags |= FLAG_DHCP6;
    }
    let header = CaptureHeader {
        ifindex: meta.ifindex,
        rx_queue: meta.rx_queue,
        ts_ns: 0,
        verdict: if drop { VERDICT_DROP } else { VERDICT_PASS },
        vlan,
        frame_len: pkt.frame_len() as u32,
        captured_len: len,
        payload_offset: dhcp.payload_offset,
        payload_len: dhcp.payload_len,
        xid: dhcp.xid,
        flags,
    };
    // The smallest record that holds the frame (FRAME_BUCKETS).
    let [b0, b1, b2, b3, _] = FRAME_BUCKETS;
    let len = len as usize;
    let emitted = if len <= b0 {
        emit::<P, { FRAME_BUCKETS[0] }>(pkt, &header)
    } else if len <= b1 {
        emit::<P, { FRAME_BUCKETS[1] }>(pkt, &header)
    } else if len <= b2 {
        emit::<P, { FRAME_BUCKETS[2] }>(pkt, &header)
    } else if len <= b3 {
        emit::<P, { FRAME_BUCKETS[3] }>(pkt, &header)
    } else {
        emit::<P, { FRAME_BUCKETS[4] }>(pkt, &header)
    };
    match emitted {
        Emitted::Submitted => {}
        Emitted::RingFull => {
            count(COUNTER_RINGBUF_FULL);
            return false;
        }
        Emitted::CopyFailed => {
            count(COUNTER_LOAD_ERROR);
            return false;
        }
    }
    // Not counted here: the agent counts the records it reads, by what
    // their headers say (one or two per-CPU increments less on a capture).
    drop
}

/// What became of one capture record.
enum Emitted {
    Submitted,
    RingFull,
    CopyFailed,
}

/// Reserves a record with room for `N` frame bytes, writes `header` (with
/// the timestamp) and the first `header.captured_len` (1..=`N`) bytes of the
/// frame, and submits it; on a failed copy the record is discarded.
#[inline(always)]
fn emit<P: Capture, const N: usize>(pkt: &P, header: &CaptureHeader) -> Emitted {
    let Some(mut entry) = XDHCP_EVENTS.reserve::<CaptureRecord<N>>(0) else {
        return Emitted::RingFull;
    };
    let rec = entry.as_mut_ptr();
    // Bound the length on the very value handed to the copy, in 1..=N (a
    // no-op: the caller chose N >= captured_len >= 1). Without the opaque
    // step the optimiser may compare one copy of the length and pass another
    // whose range the verifier cannot see, and the program fails to load.
    let len = black_box(header.captured_len) as usize;
    if len == 0 || len > N {
        entry.discard(0);
        return Emitted::CopyFailed;
    }
    // SAFETY: `rec` points at a reserved, writable record of the right size.
    unsafe {
        let h = addr_of_mut!((*rec).header);
        addr_of_mut!((*h).ifindex).write(header.ifindex);
        addr_of_mut!((*h).rx_queue).write(header.rx_queue);
        // Tick resolution is plenty for DHCP, and the coarse clock costs
        // half of bpf_ktime_get_ns here (docs/kernel.md).
        addr_of_mut!((*h).ts_ns).write(bpf_ktime_get_coarse_ns());
        addr_of_mut!((*h).verdict).write(header.verdict);
        addr_of_mut!((*h).vlan).write(header.vlan);
        addr_of_mut!((*h).frame_len).write(header.frame_len);
        addr_of_mut!((*h).captured_len).write(header.captured_len);
        addr_of_mut!((*h).payload_offset).write(header.payload_offset);
        addr_of_mut!((*h).payload_len).write(header.payload_len);
        addr_of_mut!((*h).xid).write(header.xid);
        addr_of_mut!((*h).flags).write(header.flags);
    }
    // SAFETY: same record; its frame area has N bytes and len <= N.
    let frame = unsafe { addr_of_mut!((*rec).frame) }.cast::<u8>();
    if !pkt.copy_prefix::<N>(frame, len) {
        entry.discard(0);
        return Emitted::CopyFailed;
    }
    entry.submit(0);
    Emitted::Submitted
}

/// Copies `len` (1..=`N`) bytes from the linear packet at `start` to `dst`
/// (which has room for `N` bytes) with bounds-checked 8-byte words: 64-byte
/// blocks, then words, up to the packet's end or the record's (whichever
/// comes first), then one last word ending at `len` that may overlap the
/// ones before. Frames shorter than 8 bytes are never DHCP (callers
/// guarantee `len >= 8`). Returns `false` when the packet is shorter than
/// `len`. Bytes past `len` that land in the record (padding) are not part
/// of the capture (`captured_len` says where it ends).
///
/// The loops test the word's offset only against constants and the
/// packet's end, never against `len`: an older verifier (6.1's; 6.18's does
/// not) cannot decide a test of a constant against a range, follows the
/// impossible branch with an empty range for `len`, and refuses the program
/// (`invalid access to memory, mem_size=2096 off=2096`, `R2 invalid mem
/// access 'scalar'`).
///
/// Several times faster than `bpf_xdp_load_bytes` (a helper call and a
/// `memcpy`) for a DHCP-sized frame; the figures are in `docs/kernel.md`,
/// "Where the time goes".
/// The 8-byte accesses may be unaligned: the verifier allows that wherever
/// the kernel has efficient unaligned access (x86-64, arm64); volatile keeps
/// each one a single load or store instead of a byte loop or a `memcpy` call.
#[inline(always)]
#[expect(
    clippy::cast_ptr_alignment,
    reason = "BPF unaligned 8-byte access, see above"
)]
fn direct_copy<const N: usize>(start: usize, end: usize, dst: *mut u8, len: usize) -> bool {
    // Opaque: what the parser proved about the packet's length must not let
    // the optimiser drop a test below that the verifier needs to see.
    let end = black_box(end);
    if len < 8 {
        return false;
    }
    let mut off = 0usize;
    while off + 64 <= N {
        let src = start + off;
        if src + 64 > end {
            break;
        }
        let mut i = 0;
        while i < 64 {
            // SAFETY: src+i+8 <= src+64 <= end; dst has N bytes.
            unsafe {
                let w = core::ptr::read_volatile((src + i) as *const u64);
                core::ptr::write_volatile(dst.add(off + i).cast::<u64>(), w);
            }
            i += 8;
        }
        off += 64;
    }
    while off + 8 <= N {
        let src = start + off;
        if src + 8 > end {
            break;
        }
        // SAFETY: as above.
        unsafe {
            let w = core::ptr::read_volatile(src as *const u64);
            core::ptr::write_volatile(dst.add(off).cast::<u64>(), w);
        }
        off += 8;
    }
    // Opaque, so the test below stays on the very value the store uses.
    let last = black_box(len - 8);
    if last > N - 8 {
        return false;
    }
    let src = start + last;
    if src + 8 > end {
        return false;
    }
    // SAFETY: as above.
    unsafe {
        let w = core::ptr::read_volatile(src as *const u64);
        core::ptr::write_volatile(dst.add(last).cast::<u64>(), w);
    }
    true
}

/// Reads a `T` from the packet at `at` with loads of `T`'s natural width
/// (one 16-bit load for a `u16`, not two byte loads and a shift).
///
/// # Safety
///
/// `at..at + size_of::<T>()` must lie inside the packet. `at` need not be
/// aligned: in BPF a load is a plain `ldx`, and the verifier accepts
/// unaligned packet loads wherever the kernel has efficient unaligned access
/// (x86-64, arm64), as for the frame copy.
#[inline(always)]
unsafe fn read_packet<T: Copy>(at: usize) -> T {
    // SAFETY: the caller checked the bounds.
    unsafe { core::ptr::read(at as *const T) }
}

// ---------------------------------------------------------------- XDP glue --

struct XdpPacket<'a> {
    ctx: &'a XdpContext,
    start: usize,
    end: usize,
}

impl Packet for XdpPacket<'_> {
    #[inline(always)]
    fn frame_len(&self) -> usize {
        self.end - self.start
    }

    #[inline(always)]
    fn read<T: Copy>(&self, offset: usize) -> Option<T> {
        let at = self.start + offset;
        if at + size_of::<T>() > self.end {
            return None;
        }
        // SAFETY: bounds checked against data_end just above.
        Some(unsafe { read_packet(at) })
    }
}

impl Capture for XdpPacket<'_> {
    #[inline(always)]
    fn meta(&self) -> Meta {
        Meta {
            ifindex: self.ctx.ingress_ifindex() as u32,
            rx_queue: self.ctx.rx_queue_index(),
            flags: FLAG_XDP,
            offload_vlan: VLAN_NONE,
        }
    }

    #[inline(always)]
    fn copy_prefix<const N: usize>(&self, dst: *mut u8, len: usize) -> bool {
        // Not bpf_xdp_load_bytes: that helper needs 5.18 and is slower here.
        direct_copy::<N>(self.start, self.end, dst, len)
    }
}

/// XDP entry point: drop only owned DHCP replies in intercept mode.
#[xdp]
#[expect(
    clippy::needless_pass_by_value,
    reason = "entry-point signature fixed by #[xdp]"
)]
pub fn xdhcp_xdp(ctx: XdpContext) -> u32 {
    xdp_verdict::<PORT>(&ctx)
}

/// XDP entry point for a node uplink: as [`xdhcp_xdp`], configured per
/// uplink in `XDHCP_UPLINKS`.
#[xdp]
#[expect(
    clippy::needless_pass_by_value,
    reason = "entry-point signature fixed by #[xdp]"
)]
pub fn xdhcp_uplink_xdp(ctx: XdpContext) -> u32 {
    xdp_verdict::<UPLINK>(&ctx)
}

#[inline(always)]
fn xdp_verdict<const ROLE: bool>(ctx: &XdpContext) -> u32 {
    let pkt = XdpPacket {
        ctx,
        start: ctx.data(),
        end: ctx.data_end(),
    };
    if process::<_, ROLE>(&pkt) {
        xdp_action::XDP_DROP
    } else {
        xdp_action::XDP_PASS
    }
}

/// The do-nothing baseline for `bench_xdp`; test builds only (the
/// `test-hooks` feature), never in the shipped object.
#[cfg(feature = "test-hooks")]
#[xdp]
pub fn xdhcp_xdp_pass(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
}

// ----------------------------------------------------------------- TC glue --

struct TcPacket<'a> {
    ctx: &'a TcContext,
    start: usize,
    end: usize,
}

impl Packet for TcPacket<'_> {
    /// `skb->len`, read only when asked (a DHCP frame): a frame that is not
    /// DHCP never needs it.
    #[inline(always)]
    fn frame_len(&self) -> usize {
        self.ctx.len() as usize
    }

    #[inline(always)]
    fn read<T: Copy>(&self, offset: usize) -> Option<T> {
        let at = self.start + offset;
        if at + size_of::<T>() <= self.end {
            // SAFETY: bounds checked against data_end just above.
            return Some(unsafe { read_packet(at) });
        }
        // Not in the linear part: ask the kernel (fails beyond skb->len).
        self.ctx.load::<T>(offset).ok()
    }
}

impl Capture for TcPacket<'_> {
    #[inline(always)]
    fn meta(&self) -> Meta {
        let skb = self.ctx.skb.skb;
        // SAFETY: reading context fields the verifier allows for sched_cls.
        let (ifindex, queue, vlan_present, vlan_tci) = unsafe {
            (
                (*skb).ifindex,
                (*skb).queue_mapping,
                (*skb).vlan_present,
                (*skb).vlan_tci,
            )
        };
        Meta {
            ifindex,
            // skb_record_rx_queue() stores queue + 1; 0 means not recorded.
            rx_queue: queue.saturating_sub(1),
            flags: FLAG_TC,
            offload_vlan: if vlan_present != 0 {
                vlan_tci & 0x0fff
            } else {
                VLAN_NONE
            },
        }
    }

    #[inline(always)]
    fn copy_prefix<const N: usize>(&self, dst: *mut u8, len: usize) -> bool {
        // The usual case, a frame all in the linear part of the skb: the
        // same word copy as XDP, which costs a fraction of the helper's
        // memcpy into ring memory. The test goes through an opaque step so
        // the optimiser cannot use it to drop the per-access bounds tests
        // the verifier needs inside the copy.
        if black_box(self.start + len) <= self.end {
            return direct_copy::<N>(self.start, self.end, dst, len);
        }
        // Non-linear skb: the helper gathers the fragments. The length is
        // bounded again, on the very register handed to the helper: the
        // caller's test may sit on another copy of it, and 6.1's verifier
        // then sees only the largest record's bound (it refused the uplink
        // twin, `invalid access to memory, mem_size=1584 off=48 size=2048`).
        let len = black_box(len);
        if len == 0 || len > N {
            return false;
        }
        // SAFETY: dst has room for len <= N bytes; the helper bounds-checks
        // the skb.
        unsafe {
            bpf_skb_load_bytes(self.ctx.skb.skb.cast(), 0, dst.cast::<c_void>(), len as u32) == 0
        }
    }
}

/// TC clsact ingress entry point: same classification as [`xdhcp_xdp`].
/// Passing returns `TC_ACT_UNSPEC` so later filters still see the packet.
#[classifier]
#[expect(
    clippy::needless_pass_by_value,
    reason = "entry-point signature fixed by #[classifier]"
)]
pub fn xdhcp_tc(ctx: TcContext) -> i32 {
    tc_verdict::<PORT>(&ctx)
}

/// TC entry point for a node uplink that is a veth: as [`xdhcp_tc`],
/// configured per uplink in `XDHCP_UPLINKS`.
#[classifier]
#[expect(
    clippy::needless_pass_by_value,
    reason = "entry-point signature fixed by #[classifier]"
)]
pub fn xdhcp_uplink_tc(ctx: TcContext) -> i32 {
    tc_verdict::<UPLINK>(&ctx)
}

#[inline(always)]
fn tc_verdict<const ROLE: bool>(ctx: &TcContext) -> i32 {
    let pkt = TcPacket {
        ctx,
        start: ctx.data(),
        end: ctx.data_end(),
    };
    if process::<_, ROLE>(&pkt) {
        TC_ACT_SHOT
    } else {
        TC_ACT_UNSPEC
    }
}

/// License section: no GPL-only helper is used.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 11] = *b"Apache-2.0\0";

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // A reachable panic is an infinite loop, which the verifier rejects at load.
    loop {}
}
