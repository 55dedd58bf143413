//! The ring-buffer reader: capture records in, [`DhcpEvent`]s out.
//!
//! A record is checked as a frame only (record size, captured length,
//! Ethernet/IPv4/UDP framing); the DHCP message inside is handed on as the
//! bytes that arrived. Whether a reply is acceptable is decided in one place,
//! the engine's validation, for this path and the AF_PACKET one alike: a
//! second decoder here would drop replies the engine accepts (dhcproto 0.15
//! even panics, in debug builds, on some malformed options the engine
//! ignores), so the outcome of a reply would depend on the path it came by.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use aya::maps::{MapData, RingBuf};
use xdhcp_common as common;

use super::Result;
use super::ring::Ring;
use crate::datapath::frame::{FrameError, FrameHeaders, parse_udp_frame, parse_udp6_frame};
use crate::datapath::{Rx6Frame, RxFrame, RxPath, Verdict};

/// A captured DHCP server→client frame, its UDP payload not interpreted.
#[derive(Debug, Clone)]
pub struct DhcpEvent {
    pub frame: RxFrame,
    /// Receive queue the frame arrived on.
    #[cfg(any(test, feature = "test-hooks"))]
    pub rx_queue: u32,
    /// The xid was in the ownership map when the frame was seen.
    #[cfg(any(test, feature = "test-hooks"))]
    pub owned: bool,
    /// Captured by the TC program (else by XDP).
    #[cfg(any(test, feature = "test-hooks"))]
    pub via_tc: bool,
}

/// A record of either family.
#[derive(Debug, Clone)]
pub enum Captured {
    V4(DhcpEvent),
    /// A `DHCPv6` ADVERTISE or REPLY ([`common::FLAG_DHCP6`]).
    V6(Rx6Frame),
}

/// Why a ring-buffer record could not become a [`DhcpEvent`].
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("record of {len} bytes, expected {min}..={max}")]
    Size { len: usize, min: usize, max: usize },
    #[error("record claims {captured_len} captured bytes (room for {max})")]
    CapturedLen { captured_len: u32, max: usize },
    #[error("frame of {frame_len} bytes only partly captured")]
    Truncated { frame_len: u32 },
    #[error("captured frame: {source}")]
    Frame {
        #[source]
        source: FrameError,
    },
}

impl RecordError {
    /// Stable label for metrics.
    pub const fn label(&self) -> &'static str {
        match self {
            Self::Size { .. } => "size",
            Self::CapturedLen { .. } => "captured_len",
            Self::Truncated { .. } => "truncated",
            Self::Frame { .. } => "frame",
        }
    }
}

/// Records read and rejected by an [`EventReader`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReaderStats {
    pub events: u64,
    /// Rejected records by [`RecordError::label`].
    pub errors: HashMap<&'static str, u64>,
}

/// Decodes one ring-buffer record: a [`common::CaptureHeader`], then a frame
/// area of any length up to [`common::MAX_FRAME_LEN`] (the programs size
/// records by [`common::FRAME_BUCKETS`]; any length is accepted here). The
/// UDP payload is passed on as it is: the engine validates the DHCP message.
pub fn decode_record(bytes: &[u8]) -> Result<DhcpEvent, RecordError> {
    let (ev, frame) = split_record(bytes)?;
    v4_event(&ev, frame)
}

/// Decodes one record of either family: a `DHCPv4` one as
/// [`decode_record`] does, one flagged [`common::FLAG_DHCP6`] as an IPv6
/// frame ([`parse_udp6_frame`]). The payload is handed on undecoded: the
/// v6 engine validates the message.
pub fn decode_captured(bytes: &[u8]) -> Result<Captured, RecordError> {
    let (ev, frame) = split_record(bytes)?;
    if ev.flags & common::FLAG_DHCP6 == 0 {
        return v4_event(&ev, frame).map(Captured::V4);
    }
    rx_frame(&ev, parse_udp6_frame(frame)).map(Captured::V6)
}

/// The `DHCPv4` event of a checked record.
fn v4_event(ev: &common::CaptureHeader, frame: &[u8]) -> Result<DhcpEvent, RecordError> {
    Ok(DhcpEvent {
        frame: rx_frame(ev, parse_udp_frame(frame))?,
        #[cfg(any(test, feature = "test-hooks"))]
        rx_queue: ev.rx_queue,
        #[cfg(any(test, feature = "test-hooks"))]
        owned: ev.flags & common::FLAG_OWNED != 0,
        #[cfg(any(test, feature = "test-hooks"))]
        via_tc: ev.flags & common::FLAG_TC != 0,
    })
}

/// The received frame of a record whose captured bytes parsed as `parsed`:
/// the VLAN id the device stripped into metadata put back, the path the
/// record names.
fn rx_frame<A>(
    ev: &common::CaptureHeader,
    parsed: Result<(FrameHeaders<A>, &[u8]), FrameError>,
) -> Result<RxFrame<A>, RecordError> {
    let (mut headers, payload) = parsed.map_err(|source| RecordError::Frame { source })?;
    if ev.flags & common::FLAG_VLAN_OFFLOAD != 0 && ev.vlan != common::VLAN_NONE {
        headers.vlan = Some((ev.vlan & 0x0fff) as u16);
    }
    Ok(RxFrame {
        ifindex: ev.ifindex,
        ts_ns: ev.ts_ns,
        headers,
        payload: payload.to_vec(),
        via: rx_path(ev),
    })
}

/// The record's header and its captured frame bytes, both checked.
fn split_record(bytes: &[u8]) -> Result<(common::CaptureHeader, &[u8]), RecordError> {
    let (min, max) = (
        common::CAPTURE_HEADER_LEN,
        common::CAPTURE_HEADER_LEN + common::MAX_FRAME_LEN,
    );
    if bytes.len() < min || bytes.len() > max {
        return Err(RecordError::Size {
            len: bytes.len(),
            min,
            max,
        });
    }
    let Some(ev) = read_header(bytes) else {
        return Err(RecordError::Size {
            len: bytes.len(),
            min,
            max,
        });
    };
    let frame = &bytes[common::CAPTURE_HEADER_LEN..];
    let captured = ev.captured_len as usize;
    if captured > frame.len() {
        return Err(RecordError::CapturedLen {
            captured_len: ev.captured_len,
            max: frame.len(),
        });
    }
    if ev.flags & common::FLAG_TRUNCATED != 0 {
        return Err(RecordError::Truncated {
            frame_len: ev.frame_len,
        });
    }
    Ok((ev, &frame[..captured]))
}

/// The header at the start of a record, if the record is long enough.
fn read_header(bytes: &[u8]) -> Option<common::CaptureHeader> {
    let head = bytes.get(..common::CAPTURE_HEADER_LEN)?;
    // SAFETY: `head` has exactly size_of::<CaptureHeader>() bytes, and the
    // header is a Pod made of integers (any bit pattern is valid).
    Some(unsafe { std::ptr::read_unaligned(head.as_ptr().cast()) })
}

/// The path a record names: an uplink's program or a port's.
fn rx_path(ev: &common::CaptureHeader) -> RxPath {
    let verdict = if ev.verdict == common::VERDICT_DROP {
        Verdict::Drop
    } else {
        Verdict::Pass
    };
    if ev.flags & common::FLAG_UPLINK != 0 {
        RxPath::Uplink { verdict }
    } else {
        RxPath::Ebpf { verdict }
    }
}

/// The outcomes of the captures, counted from the records as they are
/// read: the programs do not count what their records already say (a
/// per-CPU increment is a map lookup and a store on every capture).
/// Shared by the [`Datapath`](super::Datapath) and its readers.
#[derive(Debug, Default)]
pub(super) struct RecordCounts {
    /// Every record read, well-framed or not: a frame the kernel copied
    /// into the ring.
    captured: AtomicU64,
    /// Records whose frame the program dropped (intercept mode, owned).
    dropped_owned: AtomicU64,
    /// Records of intercept mode whose frame passed: too long to hand over
    /// whole, it went on to the stack (fail-open).
    passed_unowned: AtomicU64,
}

impl RecordCounts {
    /// Counts one record by its header (`bytes` as read off the ring).
    fn count(&self, bytes: &[u8]) {
        self.captured.fetch_add(1, Ordering::Relaxed);
        let Some(h) = read_header(bytes) else {
            return;
        };
        if h.verdict == common::VERDICT_DROP {
            self.dropped_owned.fetch_add(1, Ordering::Relaxed);
        } else if h.flags & common::FLAG_OWNED != 0 {
            self.passed_unowned.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// `(captured, dropped_owned, passed_unowned)` so far.
    pub(super) fn read(&self) -> (u64, u64, u64) {
        (
            self.captured.load(Ordering::Relaxed),
            self.dropped_owned.load(Ordering::Relaxed),
            self.passed_unowned.load(Ordering::Relaxed),
        )
    }
}

/// Async reader of the capture ring buffer.
pub struct EventReader {
    ring: Ring,
    stats: ReaderStats,
    counts: Arc<RecordCounts>,
}

impl std::fmt::Debug for EventReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventReader")
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl EventReader {
    /// Wraps the ring buffer taken from the loaded object.
    pub(super) fn new(ring: RingBuf<MapData>, counts: Arc<RecordCounts>) -> Result<Self> {
        Ok(Self {
            ring: Ring::new(ring)?,
            stats: ReaderStats::default(),
            counts,
        })
    }

    /// Waits for the next well-framed record of either family; malformed
    /// records are counted in [`EventReader::stats`] and skipped.
    pub async fn recv(&mut self) -> Result<Captured> {
        let (stats, counts) = (&mut self.stats, &*self.counts);
        self.ring.recv(|item| Self::take(item, stats, counts)).await
    }

    /// Returns the next well-framed record already in the ring, without waiting.
    pub fn try_recv_any(&mut self) -> Option<Captured> {
        let (stats, counts) = (&mut self.stats, &*self.counts);
        self.ring.try_recv(|item| Self::take(item, stats, counts))
    }

    /// Returns the next `DHCPv4` event already in the ring, without
    /// waiting; a `DHCPv6` record before it is skipped (tests and benches
    /// that send only `DHCPv4` frames).
    #[cfg(any(test, feature = "test-hooks"))]
    pub fn try_recv(&mut self) -> Option<DhcpEvent> {
        loop {
            match self.try_recv_any()? {
                Captured::V4(ev) => return Some(ev),
                Captured::V6(_) => {}
            }
        }
    }

    /// One record, counted by its outcome: an event, or a malformed record
    /// counted and skipped.
    fn take(item: &[u8], stats: &mut ReaderStats, counts: &RecordCounts) -> Option<Captured> {
        counts.count(item);
        match decode_captured(item) {
            Ok(ev) => {
                stats.events += 1;
                Some(ev)
            }
            Err(e) => {
                tracing::debug!(error = %e, "dropping malformed capture record");
                *stats.errors.entry(e.label()).or_default() += 1;
                None
            }
        }
    }

    /// Counts of events and rejected records so far.
    pub fn stats(&self) -> &ReaderStats {
        &self.stats
    }
}

#[cfg(test)]
mod tests {
    use dhcproto::{Encodable as _, Encoder, v4};

    use super::*;
    use crate::datapath::frame::{FrameHeaders, build_udp_frame, seal_ipv4_header};

    /// A record as the programs write it: header, then the frame in the
    /// smallest bucket that holds it (the tail is left as garbage, 0xee).
    fn record(frame: &[u8], flags: u32, vlan: u32) -> Vec<u8> {
        record_with(frame, flags, vlan, common::VERDICT_DROP)
    }

    /// [`record`] with the program's `verdict`.
    fn record_with(frame: &[u8], flags: u32, vlan: u32, verdict: u32) -> Vec<u8> {
        let h = common::CaptureHeader {
            ifindex: 7,
            rx_queue: 3,
            ts_ns: 42,
            verdict,
            vlan,
            frame_len: frame.len() as u32,
            captured_len: frame.len() as u32,
            payload_offset: 42,
            payload_len: (frame.len() - 42) as u32,
            xid: 0,
            flags,
        };
        // SAFETY: CaptureHeader is a padding-free Pod.
        let head = unsafe {
            std::slice::from_raw_parts(
                (&raw const h).cast::<u8>(),
                size_of::<common::CaptureHeader>(),
            )
        };
        let mut r = head.to_vec();
        r.extend_from_slice(frame);
        r.resize(common::record_len(frame.len()), 0xee);
        r
    }

    fn reply_headers() -> FrameHeaders {
        FrameHeaders {
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [0xff; 6],
            vlan: None,
            src_ip: std::net::Ipv4Addr::new(192, 0, 2, 1),
            dst_ip: std::net::Ipv4Addr::BROADCAST,
            src_port: 67,
            dst_port: 68,
        }
    }

    fn offer_frame(xid: u32) -> Vec<u8> {
        let mut m = v4::Message::default();
        m.set_opcode(v4::Opcode::BootReply).set_xid(xid);
        m.opts_mut()
            .insert(v4::DhcpOption::MessageType(v4::MessageType::Offer));
        let mut payload = Vec::new();
        m.encode(&mut Encoder::new(&mut payload)).unwrap();
        build_udp_frame(&reply_headers(), &payload)
    }

    #[test]
    fn record_becomes_an_event() {
        let f = offer_frame(0xabcd);
        let ev = decode_record(&record(
            &f,
            common::FLAG_TC | common::FLAG_OWNED,
            common::VLAN_NONE,
        ))
        .unwrap();
        assert_eq!(ev.frame.payload, f[42..]);
        assert_eq!(ev.frame.payload[4..8], 0xabcd_u32.to_be_bytes());
        assert_eq!((ev.frame.ifindex, ev.frame.ts_ns, ev.rx_queue), (7, 42, 3));
        assert_eq!(
            ev.frame.via,
            RxPath::Ebpf {
                verdict: Verdict::Drop
            }
        );
        assert!(ev.owned && ev.via_tc);
        assert_eq!(ev.frame.headers, reply_headers());
    }

    /// A `DHCPv6` REPLY's frame, as the programs capture it.
    fn reply6_frame(vlan: Option<u16>) -> (Vec<u8>, crate::datapath::frame::Frame6Headers) {
        let h = crate::datapath::frame::Frame6Headers {
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            vlan,
            src_ip: "fe80::1".parse().unwrap(),
            dst_ip: "fe80::2".parse().unwrap(),
            src_port: 547,
            dst_port: 546,
        };
        // REPLY, transaction 0x0a0b0c, an IA_NA with IAID 0x01020304.
        let payload = [
            7, 0x0a, 0x0b, 0x0c, 0, 3, 0, 12, 1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0, 0,
        ];
        (crate::datapath::frame::build_udp6_frame(&h, &payload), h)
    }

    #[test]
    fn a_dhcpv6_record_becomes_an_ipv6_event_and_only_through_the_two_family_decoder() {
        let (f, h) = reply6_frame(None);
        let r = record(&f, common::FLAG_XDP | common::FLAG_DHCP6, common::VLAN_NONE);
        let Captured::V6(rx) = decode_captured(&r).unwrap() else {
            panic!("not a DHCPv6 event")
        };
        assert_eq!(rx.headers, h);
        assert_eq!(rx.payload, f[62..]);
        assert_eq!((rx.ifindex, rx.ts_ns), (7, 42));
        assert_eq!(
            rx.via,
            RxPath::Ebpf {
                verdict: Verdict::Drop
            }
        );
        // The v4 decoder refuses it as a frame; a v4 record stays v4.
        assert_eq!(decode_record(&r).unwrap_err().label(), "frame");
        let v4 = record(&offer_frame(9), common::FLAG_TC, common::VLAN_NONE);
        assert!(matches!(decode_captured(&v4).unwrap(), Captured::V4(_)));
        // A v4 frame flagged DHCPv6 is a typed error, not a v4 event.
        let lying = record(&offer_frame(9), common::FLAG_DHCP6, common::VLAN_NONE);
        assert_eq!(decode_captured(&lying).unwrap_err().label(), "frame");
        // The tag stripped into metadata is reported, as for v4.
        let (f, _) = reply6_frame(None);
        let r = record(
            &f,
            common::FLAG_TC | common::FLAG_DHCP6 | common::FLAG_VLAN_OFFLOAD,
            5,
        );
        let Captured::V6(rx) = decode_captured(&r).unwrap() else {
            panic!("not a DHCPv6 event")
        };
        assert_eq!(rx.headers.vlan, Some(5));
    }

    /// The committed fuzz seed of a `DHCPv6` record is the record this
    /// builds (write it with `XDHCP_WRITE_SEEDS=1`).
    #[test]
    fn the_dhcpv6_ring_record_seed_is_current() {
        let (f, _) = reply6_frame(Some(12));
        let r = record(
            &f,
            common::FLAG_XDP | common::FLAG_DHCP6 | common::FLAG_OWNED,
            12,
        );
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fuzz/corpus/ring_record/seed-dhcpv6-vlan");
        if std::env::var_os("XDHCP_WRITE_SEEDS").is_some() {
            std::fs::write(&path, &r).unwrap();
        }
        assert_eq!(std::fs::read(&path).unwrap(), r, "{}", path.display());
    }

    #[test]
    fn vlan_from_metadata_is_reported() {
        let f = offer_frame(1);
        let ev = decode_record(&record(
            &f,
            common::FLAG_TC | common::FLAG_VLAN_OFFLOAD,
            100,
        ))
        .unwrap();
        assert_eq!(ev.frame.headers.vlan, Some(100));
    }

    #[test]
    fn bad_records_are_typed_errors() {
        let f = offer_frame(1);
        let mut r = record(
            &f,
            common::FLAG_XDP | common::FLAG_TRUNCATED,
            common::VLAN_NONE,
        );
        assert_eq!(decode_record(&r).unwrap_err().label(), "truncated");
        r = record(&f, common::FLAG_XDP, common::VLAN_NONE);
        let at = std::mem::offset_of!(common::CaptureHeader, captured_len);
        let room = (r.len() - common::CAPTURE_HEADER_LEN) as u32;
        r[at..at + 4].copy_from_slice(&(room + 1).to_ne_bytes());
        assert_eq!(decode_record(&r).unwrap_err().label(), "captured_len");
        let mut arp = f.clone();
        arp[12] = 0x08;
        arp[13] = 0x06;
        assert_eq!(
            decode_record(&record(&arp, 0, common::VLAN_NONE))
                .unwrap_err()
                .label(),
            "frame"
        );
    }

    /// The reader judges framing only: whatever the UDP payload holds reaches
    /// the engine byte for byte, which alone decides (as it does for frames
    /// from the AF_PACKET receiver). Here: bytes that are no DHCP message at
    /// all, and an ACK whose option 80 (Rapid Commit, RFC 4039: no value)
    /// carries a value byte, which the engine ignores but dhcproto 0.15's
    /// decoder asserts against in debug builds.
    #[test]
    fn payload_is_passed_on_undecoded() {
        let garbage = build_udp_frame(&reply_headers(), &[0xff; 8]);
        let ev = decode_record(&record(&garbage, common::FLAG_XDP, common::VLAN_NONE))
            .expect("a well-framed record");
        assert_eq!(ev.frame.payload, [0xff; 8]);

        let mut m = v4::Message::default();
        m.set_opcode(v4::Opcode::BootReply).set_xid(0x0a0c);
        m.opts_mut()
            .insert(v4::DhcpOption::MessageType(v4::MessageType::Ack));
        let mut ack = Vec::new();
        m.encode(&mut Encoder::new(&mut ack)).unwrap();
        assert_eq!(ack.pop(), Some(255), "END last");
        ack.extend_from_slice(&[80, 1, 1, 255]);
        let f = build_udp_frame(&reply_headers(), &ack);
        let ev = decode_record(&record(&f, common::FLAG_TC, common::VLAN_NONE))
            .expect("a well-framed record");
        assert_eq!(ev.frame.payload, ack);
    }

    #[test]
    fn short_or_oversized_record_is_a_typed_error() {
        let err = decode_record(&[0; 10]).unwrap_err();
        assert_eq!(err.label(), "size");
        let err =
            decode_record(&vec![0; common::record_len(common::MAX_FRAME_LEN) + 8]).unwrap_err();
        assert_eq!(err.label(), "size");
    }

    #[test]
    fn records_of_every_bucket_decode() {
        for bucket in common::FRAME_BUCKETS {
            let mut f = offer_frame(0x1234);
            // Pad the DHCP message (after END) so the frame fills the bucket.
            let extra = bucket - f.len();
            f.resize(bucket, 0);
            let udp_len = u16::from_be_bytes([f[38], f[39]]) + extra as u16;
            f[38..40].copy_from_slice(&udp_len.to_be_bytes());
            f[40..42].copy_from_slice(&[0, 0]); // no UDP checksum
            let ip_len = u16::from_be_bytes([f[16], f[17]]) + extra as u16;
            f[16..18].copy_from_slice(&ip_len.to_be_bytes());
            seal_ipv4_header(&mut f[14..34]);
            let r = record(&f, common::FLAG_XDP, common::VLAN_NONE);
            assert_eq!(r.len(), common::CAPTURE_HEADER_LEN + bucket);
            let ev = decode_record(&r).unwrap();
            assert_eq!(
                ev.frame.payload[4..8],
                0x1234_u32.to_be_bytes(),
                "bucket {bucket}"
            );
            assert_eq!(ev.frame.payload.len(), bucket - 42);
        }
    }

    /// The programs no longer count their captures: every record read is
    /// one, dropped or passed in intercept mode as its header says, a
    /// record too short to decode included (the kernel wrote it).
    #[test]
    fn records_read_are_counted_by_their_outcome() {
        let frame = build_udp_frame(&reply_headers(), &offer_frame(9));
        let counts = RecordCounts::default();
        let mut stats = ReaderStats::default();
        let owned = common::FLAG_XDP | common::FLAG_OWNED;
        for r in [
            // Intercept mode, dropped.
            record_with(&frame, owned, common::VLAN_NONE, common::VERDICT_DROP),
            // Intercept mode, passed (only a prefix copied).
            record_with(
                &frame,
                owned | common::FLAG_TRUNCATED,
                common::VLAN_NONE,
                common::VERDICT_PASS,
            ),
            // Observe mode: passed, neither of the two.
            record_with(
                &frame,
                common::FLAG_XDP,
                common::VLAN_NONE,
                common::VERDICT_PASS,
            ),
            // Shorter than a header.
            vec![0u8; 3],
        ] {
            let _ = EventReader::take(&r, &mut stats, &counts);
        }
        assert_eq!(counts.read(), (4, 1, 1));
        assert_eq!(stats.events, 2, "{stats:?}");
    }
}
