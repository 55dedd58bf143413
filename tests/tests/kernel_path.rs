//! The kernel half of the packet path, run for real.
//!
//! Part 1 runs the XDP and TC programs through `BPF_PROG_TEST_RUN` on crafted
//! frames and checks verdicts, counters and ring-buffer records in every mode,
//! with and without an owned xid. Under test-run the ingress device is the
//! loopback device of the test's namespace (ifindex 1), so modes are set on 1.
//!
//! Part 2 (netns) attaches the programs to a veth whose peer runs dnsmasq.
//!
//! Needs root (`CAP_BPF`, `CAP_NET_ADMIN`); fails, never skips, without it.

use std::net::Ipv4Addr;

use dhcproto::v4::{DhcpOption, Message, MessageType, Opcode};
use dhcproto::{Decodable as _, Decoder, Encodable as _, Encoder};
use xdhcp::datapath::AttachMode;
use xdhcp::datapath::RxPath;
use xdhcp::datapath::Verdict;
use xdhcp::datapath::ebpf::{
    AttachTarget, CaptureMode, Counters, Datapath, DhcpEvent, Handover, LINKS_DIR, PINNED_MAPS,
    Pinning, ProgramKind, Role, link_key, pin_maps, unpin_all,
};
use xdhcp::datapath::frame::{FrameHeaders, build_udp_frame, seal_ipv4_header};
use xdhcp_tests::netns::{NetNs, Veth};

const LO: u32 = 1;
const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;
const TC_ACT_UNSPEC: u32 = u32::MAX; // -1
const TC_ACT_SHOT: u32 = 2;
const SERVER_MAC: [u8; 6] = [0x02, 0x00, 0x5e, 0x00, 0x53, 0x01];
const CLIENT_MAC: [u8; 6] = [0x02, 0x00, 0x5e, 0x00, 0x53, 0x42];

fn pass(kind: ProgramKind) -> u32 {
    match kind {
        ProgramKind::Tc => TC_ACT_UNSPEC,
        _ => XDP_PASS,
    }
}

fn drop_code(kind: ProgramKind) -> u32 {
    match kind {
        ProgramKind::Tc => TC_ACT_SHOT,
        _ => XDP_DROP,
    }
}

fn dhcp_reply(mt: MessageType, xid: u32) -> Vec<u8> {
    let mut m = Message::default();
    m.set_opcode(Opcode::BootReply)
        .set_xid(xid)
        .set_yiaddr(Ipv4Addr::new(192, 0, 2, 50))
        .set_siaddr(Ipv4Addr::new(192, 0, 2, 1))
        .set_chaddr(&CLIENT_MAC);
    m.opts_mut().insert(DhcpOption::MessageType(mt));
    m.opts_mut()
        .insert(DhcpOption::ServerIdentifier(Ipv4Addr::new(192, 0, 2, 1)));
    if mt != MessageType::Nak {
        m.opts_mut().insert(DhcpOption::AddressLeaseTime(3600));
        m.opts_mut()
            .insert(DhcpOption::SubnetMask(Ipv4Addr::new(255, 255, 255, 0)));
    }
    let mut buf = Vec::new();
    m.encode(&mut Encoder::new(&mut buf)).expect("encode");
    buf
}

/// The DHCP message of a captured frame (the reader hands the bytes on
/// undecoded; the engine validates them in the agent).
fn message(ev: &DhcpEvent) -> Message {
    Message::decode(&mut Decoder::new(&ev.frame.payload)).expect("a DHCP message")
}

fn headers(vlan: Option<u16>) -> FrameHeaders {
    FrameHeaders {
        src_mac: SERVER_MAC,
        dst_mac: [0xff; 6],
        vlan,
        src_ip: Ipv4Addr::new(192, 0, 2, 1),
        dst_ip: Ipv4Addr::BROADCAST,
        src_port: 67,
        dst_port: 68,
    }
}

fn frame(mt: MessageType, xid: u32) -> Vec<u8> {
    build_udp_frame(&headers(None), &dhcp_reply(mt, xid))
}

/// Rewrites an untagged frame's IPv4 header to carry `extra` bytes of options.
fn with_ip_options(mut f: Vec<u8>, extra: usize) -> Vec<u8> {
    assert!(extra.is_multiple_of(4) && extra <= 40);
    f.splice(34..34, std::iter::repeat_n(1u8, extra)); // NOP options
    f[14] = 0x45 + (extra / 4) as u8;
    let total = u16::from_be_bytes([f[16], f[17]]) + extra as u16;
    f[16..18].copy_from_slice(&total.to_be_bytes());
    seal_ipv4_header(&mut f[14..34 + extra]);
    f
}

fn set_frag(mut f: Vec<u8>, flags_offset: u16) -> Vec<u8> {
    f[20..22].copy_from_slice(&flags_offset.to_be_bytes());
    seal_ipv4_header(&mut f[14..34]);
    f
}

fn load() -> Datapath {
    Datapath::load().expect("load the eBPF object (needs root and the embedded object)")
}

fn run(dp: &mut Datapath, kind: ProgramKind, f: &[u8]) -> u32 {
    dp.test_run(kind, f, 1).expect("BPF_PROG_TEST_RUN").retval
}

const KINDS: [ProgramKind; 2] = [ProgramKind::Xdp, ProgramKind::Tc];

#[tokio::test]
async fn dhcp_replies_in_every_mode_with_and_without_owned_xid() {
    for kind in KINDS {
        for mt in [MessageType::Offer, MessageType::Ack, MessageType::Nak] {
            for mode in [
                CaptureMode::Off,
                CaptureMode::Observe,
                CaptureMode::Intercept,
            ] {
                for owned in [false, true] {
                    let ctx = format!("{kind:?} {mt:?} {mode:?} owned={owned}");
                    let mut dp = load();
                    let mut reader = dp.take_reader().unwrap().unwrap();
                    let xid = 0xdead_0000 | u32::from(u8::from(mt));
                    dp.set_mode(LO, mode).unwrap();
                    if owned {
                        dp.xid_ownership().own(xid, LO).unwrap();
                    }
                    // A different owned xid must never make this frame drop.
                    dp.xid_ownership().own(0x1234_5678, LO).unwrap();
                    let f = frame(mt, xid);
                    let ret = run(&mut dp, kind, &f);
                    let dropped = mode == CaptureMode::Intercept && owned;
                    let want = if dropped { drop_code(kind) } else { pass(kind) };
                    assert_eq!(ret, want, "{ctx}: verdict");

                    // Only replies to an owned xid reach user space; the
                    // others pass in the kernel, counted.
                    let captured = mode != CaptureMode::Off && owned;
                    let mut c = Counters::default();
                    if captured {
                        c.captured = 1;
                        if dropped {
                            c.dropped_owned = 1;
                        }
                    } else if mode == CaptureMode::Off {
                        c.mode_off = 1;
                    } else {
                        c.unowned_uncaptured = 1;
                    }
                    // A capture is counted once its record is read.
                    let ev = reader.try_recv();
                    assert_eq!(dp.counters().unwrap(), c, "{ctx}: counters");
                    if !captured {
                        assert!(ev.is_none(), "{ctx}: nothing captured");
                        continue;
                    }
                    let ev = ev.unwrap_or_else(|| panic!("{ctx}: no record"));
                    assert_eq!(message(&ev).xid(), xid, "{ctx}");
                    assert_eq!(message(&ev).opts().msg_type(), Some(mt), "{ctx}");
                    assert_eq!(ev.frame.ifindex, LO, "{ctx}");
                    assert_eq!(ev.frame.headers, headers(None), "{ctx}");
                    assert_eq!(ev.frame.payload, dhcp_reply(mt, xid), "{ctx}");
                    let verdict = if dropped {
                        Verdict::Drop
                    } else {
                        Verdict::Pass
                    };
                    assert_eq!(ev.frame.via, RxPath::Ebpf { verdict }, "{ctx}");
                    assert_eq!(ev.owned, dropped, "{ctx}");
                    assert_eq!(ev.via_tc, kind == ProgramKind::Tc, "{ctx}");
                    assert!(ev.frame.ts_ns > 0, "{ctx}");
                    assert!(reader.try_recv().is_none(), "{ctx}: exactly one record");
                }
            }
        }
    }
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid timespec to write into.
    assert_eq!(unsafe { libc::clock_gettime(clock, &raw mut ts) }, 0);
    u64::try_from(ts.tv_sec).unwrap() * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap()
}

/// Records come in a few sizes (`FRAME_BUCKETS`): frames on either side of
/// every boundary must come back whole, with a `CLOCK_MONOTONIC` timestamp
/// (tick resolution) taken during the run.
#[tokio::test]
async fn frames_of_every_record_size_round_trip() {
    let reply = dhcp_reply(MessageType::Offer, 0x5eed);
    let mut lens = vec![42 + reply.len()]; // the reply unpadded
    for b in xdhcp_common::FRAME_BUCKETS {
        lens.extend([b - 1, b]);
        if b < xdhcp_common::MAX_FRAME_LEN {
            lens.push(b + 1);
        }
    }
    assert!(
        lens[0] < lens[1],
        "the unpadded reply fits the smallest record"
    );
    for kind in KINDS {
        let mut dp = load();
        let mut reader = dp.take_reader().unwrap().unwrap();
        dp.set_mode(LO, CaptureMode::Observe).unwrap();
        dp.xid_ownership().own(0x5eed, LO).unwrap();
        for &len in &lens {
            let ctx = format!("{kind:?} frame of {len} bytes");
            let mut payload = reply.clone();
            payload.resize(len - 42, 0); // pad after END
            let f = build_udp_frame(&headers(None), &payload);
            assert_eq!(f.len(), len);
            let before = clock_ns(libc::CLOCK_MONOTONIC_COARSE);
            assert_eq!(run(&mut dp, kind, &f), pass(kind), "{ctx}");
            let after = clock_ns(libc::CLOCK_MONOTONIC);
            let ev = reader
                .try_recv()
                .unwrap_or_else(|| panic!("{ctx}: no record ({:?})", reader.stats()));
            assert_eq!(ev.frame.payload, payload, "{ctx}");
            assert_eq!(message(&ev).xid(), 0x5eed, "{ctx}");
            assert!(
                (before..=after).contains(&ev.frame.ts_ns),
                "{ctx}: ts {} not in [{before}, {after}]",
                ev.frame.ts_ns
            );
        }
        assert_eq!(dp.counters().unwrap().captured, lens.len() as u64);
    }
}

#[tokio::test]
async fn disowned_xid_passes_again() {
    for kind in KINDS {
        let mut dp = load();
        let mut reader = dp.take_reader().unwrap().unwrap();
        dp.set_mode(LO, CaptureMode::Intercept).unwrap();
        dp.xid_ownership().own(7, LO).unwrap();
        let f = frame(MessageType::Offer, 7);
        assert_eq!(run(&mut dp, kind, &f), drop_code(kind));
        dp.xid_ownership().disown(7).unwrap();
        dp.xid_ownership().disown(7).unwrap(); // absent is fine
        assert_eq!(run(&mut dp, kind, &f), pass(kind));
        assert!(reader.try_recv().unwrap().owned);
        assert!(
            reader.try_recv().is_none(),
            "a disowned xid is not captured"
        );
        let c = dp.counters().unwrap();
        assert_eq!(
            (c.captured, c.dropped_owned, c.unowned_uncaptured),
            (1, 1, 1)
        );
        // Forgetting the interface's mode means off.
        dp.clear_mode(LO).unwrap();
        assert_eq!(run(&mut dp, kind, &f), pass(kind));
        assert_eq!(dp.counters().unwrap().mode_off, 1);
    }
}

#[tokio::test]
async fn vlan_tagged_replies_are_captured_with_their_vlan() {
    for kind in KINDS {
        for tpid in [0x8100u16, 0x88a8] {
            let mut dp = load();
            let mut reader = dp.take_reader().unwrap().unwrap();
            dp.set_mode(LO, CaptureMode::Intercept).unwrap();
            dp.xid_ownership().own(99, LO).unwrap();
            let mut f = build_udp_frame(&headers(Some(100)), &dhcp_reply(MessageType::Ack, 99));
            f[12..14].copy_from_slice(&tpid.to_be_bytes());
            assert_eq!(
                run(&mut dp, kind, &f),
                drop_code(kind),
                "{kind:?} {tpid:#x}"
            );
            let ev = reader.try_recv().expect("record");
            assert_eq!(ev.frame.headers.vlan, Some(100));
            assert_eq!(message(&ev).xid(), 99);
        }
    }
}

#[tokio::test]
async fn ip_options_up_to_ihl_15_are_parsed() {
    for kind in KINDS {
        for extra in [4, 20, 40] {
            let mut dp = load();
            let mut reader = dp.take_reader().unwrap().unwrap();
            dp.set_mode(LO, CaptureMode::Observe).unwrap();
            dp.xid_ownership().own(5, LO).unwrap();
            let f = with_ip_options(frame(MessageType::Offer, 5), extra);
            assert_eq!(run(&mut dp, kind, &f), pass(kind));
            let ev = reader
                .try_recv()
                .unwrap_or_else(|| panic!("{kind:?} +{extra}: no record"));
            assert_eq!(ev.frame.payload, dhcp_reply(MessageType::Offer, 5));
            assert_eq!(dp.counters().unwrap().captured, 1);
        }
    }
}

#[tokio::test]
async fn fragments_pass_uncaptured() {
    for kind in KINDS {
        let mut dp = load();
        let mut reader = dp.take_reader().unwrap().unwrap();
        dp.set_mode(LO, CaptureMode::Intercept).unwrap();
        dp.xid_ownership().own(5, LO).unwrap();
        for flags_offset in [0x2000, 0x0001, 0x2010] {
            let f = set_frag(frame(MessageType::Offer, 5), flags_offset);
            assert_eq!(
                run(&mut dp, kind, &f),
                pass(kind),
                "{kind:?} {flags_offset:#x}"
            );
        }
        // DF alone is not a fragment.
        let f = set_frag(frame(MessageType::Offer, 5), 0x4000);
        assert_eq!(run(&mut dp, kind, &f), drop_code(kind));
        assert!(reader.try_recv().is_some());
        assert!(reader.try_recv().is_none());
        let c = dp.counters().unwrap();
        assert_eq!((c.fragment, c.captured), (3, 1), "{kind:?}");
    }
}

#[tokio::test]
async fn truncated_at_every_offset_passes_as_malformed() {
    for kind in KINDS {
        let mut dp = load();
        let mut reader = dp.take_reader().unwrap().unwrap();
        dp.set_mode(LO, CaptureMode::Intercept).unwrap();
        dp.xid_ownership().own(77, LO).unwrap();
        let f = frame(MessageType::Offer, 77);
        // BPF_PROG_TEST_RUN refuses inputs shorter than an Ethernet header;
        // for skb programs also an IPv4 EtherType frame shorter than an IPv4
        // header. Those cuts reach the shared parser through XDP only.
        let min = if kind == ProgramKind::Tc { 14 + 20 } else { 14 };
        for cut in 0..min {
            assert!(
                dp.test_run(kind, &f[..cut], 1).is_err(),
                "{kind:?}: {cut}-byte input"
            );
        }
        let cuts = min..f.len();
        let n = cuts.len() as u64;
        for cut in cuts {
            let ret = dp
                .test_run(kind, &f[..cut], 1)
                .unwrap_or_else(|e| panic!("{kind:?} cut {cut}: {e}"));
            assert_eq!(ret.retval, pass(kind), "{kind:?} cut {cut}");
        }
        let c = dp.counters().unwrap();
        assert_eq!(
            c,
            Counters {
                malformed: n,
                ..Counters::default()
            },
            "{kind:?}"
        );
        assert!(reader.try_recv().is_none());
        // The whole frame still works.
        assert_eq!(run(&mut dp, kind, &f), drop_code(kind));
    }
}

#[tokio::test]
async fn non_dhcp_traffic_passes_counted() {
    let udp53 = build_udp_frame(
        &FrameHeaders {
            src_port: 53,
            dst_port: 40000,
            ..headers(None)
        },
        &[0; 40],
    );
    let request = build_udp_frame(
        &FrameHeaders {
            src_port: 68,
            dst_port: 67,
            ..headers(None)
        },
        &dhcp_reply(MessageType::Offer, 1),
    );
    let mut tcp = frame(MessageType::Offer, 1);
    tcp[23] = 6;
    let mut arp = vec![0xff; 6];
    arp.extend_from_slice(&SERVER_MAC);
    arp.extend_from_slice(&[0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 1]);
    arp.resize(60, 0);
    let mut ipv6 = vec![0x33, 0x33, 0, 0, 0, 1];
    ipv6.extend_from_slice(&SERVER_MAC);
    ipv6.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0, 0, 8, 17, 64]);
    ipv6.resize(14 + 40 + 8, 0);
    let frames = [udp53, request, tcp, arp, ipv6];
    for kind in KINDS {
        let mut dp = load();
        let mut reader = dp.take_reader().unwrap().unwrap();
        dp.set_mode(LO, CaptureMode::Intercept).unwrap();
        dp.xid_ownership().own(1, LO).unwrap();
        for f in &frames {
            assert_eq!(run(&mut dp, kind, f), pass(kind));
        }
        // Passed and counted nowhere: the common case costs one read of
        // the EtherType and, for IP, of the protocol and the ports.
        assert_eq!(dp.counters().unwrap(), Counters::default(), "{kind:?}");
        assert!(reader.try_recv().is_none());
    }
}

#[tokio::test]
async fn not_a_bootp_reply_is_malformed() {
    for kind in KINDS {
        let mut dp = load();
        dp.set_mode(LO, CaptureMode::Intercept).unwrap();
        dp.xid_ownership().own(3, LO).unwrap();
        let mut request_op = frame(MessageType::Offer, 3);
        request_op[42] = 1; // BOOTREQUEST from port 67
        let mut bad_cookie = frame(MessageType::Offer, 3);
        bad_cookie[42 + 236] = 0;
        let mut short = frame(MessageType::Offer, 3);
        // UDP length below the BOOTP minimum (fix IP total length to match).
        short[38..40].copy_from_slice(&(8u16 + 200).to_be_bytes());
        for f in [&request_op, &bad_cookie, &short] {
            assert_eq!(run(&mut dp, kind, f), pass(kind));
        }
        assert_eq!(dp.counters().unwrap().malformed, 3, "{kind:?}");
    }
}

#[tokio::test]
async fn oversized_reply_is_flagged_and_never_dropped() {
    for kind in KINDS {
        let mut dp = load();
        let mut reader = dp.take_reader().unwrap().unwrap();
        dp.set_mode(LO, CaptureMode::Intercept).unwrap();
        dp.xid_ownership().own(11, LO).unwrap();
        let mut payload = dhcp_reply(MessageType::Offer, 11);
        payload.resize(xdhcp_common::MAX_FRAME_LEN, 0); // pad: datagram beyond MAX_FRAME_LEN
        let f = build_udp_frame(&headers(None), &payload);
        assert_eq!(run(&mut dp, kind, &f), pass(kind), "{kind:?}");
        assert!(
            reader.try_recv().is_none(),
            "partial record is not an event"
        );
        assert_eq!(reader.stats().errors.get("truncated"), Some(&1));
        // Captured (its record read), and passed in intercept mode.
        let c = dp.counters().unwrap();
        assert_eq!((c.captured, c.dropped_owned, c.passed_unowned), (1, 0, 1));
    }
}

#[tokio::test]
async fn full_ring_buffer_fails_open() {
    for kind in KINDS {
        let mut dp = load();
        let mut reader = dp.take_reader().unwrap().unwrap();
        dp.set_mode(LO, CaptureMode::Intercept).unwrap();
        dp.xid_ownership().own(21, LO).unwrap();
        let f = frame(MessageType::Ack, 21);
        // Each record: the ring's 8-byte header + a record sized for this frame.
        let slots = xdhcp_common::EVENTS_BYTES as usize / (xdhcp_common::record_len(f.len()) + 8);
        // Fill the ring without reading it.
        let res = dp.test_run(kind, &f, (slots + 10) as u32).unwrap();
        assert_eq!(
            res.retval,
            pass(kind),
            "{kind:?}: last run found the ring full and passed"
        );
        let mut n = 0;
        while reader.try_recv().is_some() {
            n += 1;
        }
        assert_eq!(n, slots);
        let c = dp.counters().unwrap();
        assert_eq!(c.captured, slots as u64, "{kind:?}");
        assert_eq!(c.dropped_owned, slots as u64);
        assert_eq!(c.ringbuf_full, 10);
        // Drained: capture resumes.
        assert_eq!(run(&mut dp, kind, &f), drop_code(kind));
    }
}

/// A flood of well-formed replies whose xid no lease owns stays in the
/// kernel (passed, counted, never a record), on ports and uplinks alike,
/// in both capturing modes: many times the ring's capacity of them leaves
/// it empty, and the next owned reply still gets its record.
#[tokio::test]
async fn unowned_replies_never_reach_the_ring_and_owned_ones_always_do() {
    let kinds = [
        (ProgramKind::Xdp, Role::Port),
        (ProgramKind::Tc, Role::Port),
        (ProgramKind::UplinkXdp, Role::Uplink),
        (ProgramKind::UplinkTc, Role::Uplink),
    ];
    for (kind, role) in kinds {
        for mode in [CaptureMode::Observe, CaptureMode::Intercept] {
            let ctx = format!("{kind:?} {mode:?}");
            let mut dp = load();
            let mut reader = dp.take_reader().unwrap().unwrap();
            dp.set_role_mode(role, LO, mode).unwrap();
            dp.xid_ownership().own(21, 0).unwrap();
            let junk = frame(MessageType::Ack, 0x0bad_0bad);
            let slots =
                xdhcp_common::EVENTS_BYTES as usize / (xdhcp_common::record_len(junk.len()) + 8);
            let n = 3 * slots as u32;
            let res = dp.test_run(kind, &junk, n).unwrap();
            let passed = if matches!(kind, ProgramKind::Tc | ProgramKind::UplinkTc) {
                TC_ACT_UNSPEC
            } else {
                XDP_PASS
            };
            assert_eq!(res.retval, passed, "{ctx}: junk passes");
            assert_eq!(
                dp.counters().unwrap(),
                Counters {
                    unowned_uncaptured: u64::from(n),
                    ..Counters::default()
                },
                "{ctx}: every junk reply counted, none captured"
            );
            assert!(reader.try_recv().is_none(), "{ctx}: the ring stays empty");

            let owned = frame(MessageType::Ack, 21);
            let ret = dp.test_run(kind, &owned, 1).unwrap().retval;
            let dropped = mode == CaptureMode::Intercept;
            assert_eq!(ret != passed, dropped, "{ctx}: owned verdict");
            let ev = reader.try_recv().expect("the owned reply's record");
            assert_eq!(message(&ev).xid(), 21, "{ctx}");
            let c = dp.counters().unwrap();
            assert_eq!((c.captured, c.ringbuf_full), (1, 0), "{ctx}");
        }
    }
}

/// A private bpffs mounted on a temporary directory, unmounted on drop.
struct BpffsMount {
    dir: tempfile::TempDir,
}

impl BpffsMount {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        nix::mount::mount(
            Some("bpf"),
            dir.path(),
            Some("bpf"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )
        .expect("mount -t bpf (needs root)");
        Self { dir }
    }
}

impl Drop for BpffsMount {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(self.dir.path(), nix::mount::MntFlags::MNT_DETACH);
    }
}

fn pinned(dp: &Datapath) -> (Vec<&'static str>, Vec<&'static str>) {
    match dp.pinning() {
        Pinning::On {
            reused, replaced, ..
        } => (
            reused.clone(),
            replaced.iter().map(|(name, _)| *name).collect(),
        ),
        Pinning::Off { reason } => panic!("not pinned: {reason}"),
    }
}

/// `--bpffs-dir` on a bpffs: the maps are pinned by name, the ring buffer
/// with them; a restarted agent reuses them (counters carry on; the
/// ownership and mode tables stay as the previous agent left them until it
/// reconciles them with what it holds); a pin with another definition is
/// replaced; elsewhere nothing is pinned and nothing is created.
#[tokio::test]
async fn maps_pinned_in_bpffs_are_reused_and_bad_pins_replaced() {
    use xdhcp_common::{MAP_COUNTERS, MAP_EVENTS, MAP_IFCONFIG_DIRECT};
    let fs = BpffsMount::new();
    let dir = fs.dir.path().join("xdhcp");
    let mut arp = vec![0u8; 60];
    arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
    let all: Vec<&str> = PINNED_MAPS.iter().map(|m| m.name).collect();
    assert!(all.contains(&MAP_EVENTS), "the ring is pinned");
    {
        let mut dp = Datapath::load_pinned(&dir).expect("load pinned");
        assert_eq!(pinned(&dp), (vec![], vec![]), "first start creates");
        assert!(
            !dp.programs_from_pins(),
            "nothing to take at the first start"
        );
        assert!(
            dir.join("progs").is_dir(),
            "its programs pinned for the next"
        );
        for name in &all {
            assert!(dir.join(name).exists(), "{name} pinned");
        }
        for _ in 0..3 {
            assert_eq!(run(&mut dp, ProgramKind::Xdp, &arp), XDP_PASS);
        }
        dp.set_mode(LO, CaptureMode::Intercept).unwrap();
        dp.xid_ownership().own(7, LO).unwrap();
        for _ in 0..3 {
            assert_eq!(
                run(&mut dp, ProgramKind::Xdp, &frame(MessageType::Offer, 7)),
                XDP_DROP
            );
        }
    }
    {
        // The agent restarts.
        let mut dp = Datapath::load_pinned(&dir).expect("reload pinned");
        assert_eq!(pinned(&dp), (all.clone(), vec![]));
        assert!(
            dp.programs_from_pins(),
            "the same build's programs from pins"
        );
        assert_eq!(
            dp.mode(LO).unwrap(),
            Some(CaptureMode::Intercept),
            "modes stay until reconciled"
        );
        assert_eq!(
            run(&mut dp, ProgramKind::Xdp, &frame(MessageType::Offer, 7)),
            XDP_DROP,
            "the previous agent's xid stays owned while the agents hand over"
        );
        // The previous agent's ring records are drained first.
        let mut reader = dp.take_reader().unwrap().expect("the ring reader");
        let left = reader
            .try_recv()
            .expect("the record captured before the restart");
        assert_eq!(
            Message::decode(&mut Decoder::new(&left.frame.payload))
                .unwrap()
                .xid(),
            7
        );
        assert!(reader.try_recv().is_some() && reader.try_recv().is_some());
        // The previous agent's captures are counted as their records are
        // read: none is lost across the restart.
        let c = dp.counters().unwrap();
        assert_eq!((c.captured, c.dropped_owned), (3, 3), "counters carry on");
        // Nothing of this agent's claims xid 7 or LO: both go.
        assert_eq!(dp.release_unclaimed().unwrap(), (0, 1));
        assert_eq!(dp.mode(LO).unwrap(), None, "a mode nothing is attached for");
        dp.set_mode(LO, CaptureMode::Intercept).unwrap();
        assert_eq!(
            run(&mut dp, ProgramKind::Xdp, &frame(MessageType::Offer, 7)),
            XDP_PASS,
            "the previous agent's xid is no longer owned"
        );
    }
    // Another definition under a pinned name: the mode array (16384 slots)
    // where the counters (16 per-CPU slots) belong.
    std::fs::remove_file(dir.join(MAP_COUNTERS)).unwrap();
    std::fs::rename(dir.join(MAP_IFCONFIG_DIRECT), dir.join(MAP_COUNTERS)).unwrap();
    {
        let dp = Datapath::load_pinned(&dir).expect("load over a bad pin");
        let (reused, replaced) = pinned(&dp);
        assert_eq!(replaced, vec![MAP_COUNTERS]);
        // The pinned programs refer to the old map: loaded again.
        assert!(!dp.programs_from_pins(), "a map replaced");
        // Every pin but the two touched: the replaced one, and the mode
        // array whose name is now free (created anew).
        assert_eq!(reused.len(), all.len() - 2, "{reused:?}");
        assert_eq!(dp.counters().unwrap(), Counters::default());
    }
    match pin_maps(&dir) {
        Pinning::On {
            reused, replaced, ..
        } => assert_eq!((reused, replaced), (all.clone(), vec![])),
        Pinning::Off { reason } => panic!("{reason}"),
    }
    let removed = unpin_all(&dir).unwrap();
    // The maps, and the directory of the programs pinned for the next agent.
    assert_eq!(removed.len(), all.len() + 1, "{removed:?}");
    assert!(!dir.exists(), "the pin directory is removed with the pins");
    // Not a bpffs: nothing pinned, nothing created.
    let plain = tempfile::tempdir().unwrap();
    let dp = Datapath::load_pinned(&plain.path().join("xdhcp")).expect("load unpinned");
    assert!(
        matches!(dp.pinning(), Pinning::Off { reason } if reason.contains("not on a bpffs")),
        "{:?}",
        dp.pinning()
    );
    assert!(!plain.path().join("xdhcp").exists());
}

/// Whether a BPF link with this id exists.
fn link_exists(id: u32) -> bool {
    aya::programs::loaded_links()
        .filter_map(Result::ok)
        .any(|l| l.id() == id)
}

/// The link pinned at `path`: (link id, program id).
fn pinned_link(path: &std::path::Path) -> (u32, u32) {
    let link: aya::programs::links::FdLink = aya::programs::links::PinnedLink::from_pin(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .into();
    let info = link.info().unwrap();
    (info.id(), info.program_id())
}

/// Links are pinned per attachment and outlive the agent: capture goes on
/// while none runs (what arrives waits in the pinned ring, and the next
/// agent drains it first); a starting agent takes each one over as it
/// attaches (same link id), replacing a program of another version in
/// place; a pin whose device went away while no agent ran, and one nobody
/// claims, are released once the agent reconciles, a detach removes its pin, and
/// `unpin_all` removes the rest.
#[tokio::test]
#[expect(
    clippy::too_many_lines,
    reason = "one agent's life, its exit and the next agent's start, in order"
)]
async fn pinned_links_are_taken_over_updated_in_place_and_stale_ones_removed() {
    use std::os::fd::AsRawFd as _;
    let fs = BpffsMount::new();
    let dir = fs.dir.path().join("xdhcp");
    let links_dir = dir.join(LINKS_DIR);
    let ns_a = NetNs::new();
    let ns_b = NetNs::new();
    let ns_c = NetNs::new();
    let _v = Veth::new(&ns_a, "p0", &ns_b, "p1");
    let _w = Veth::new(&ns_a, "p3", &ns_b, "p4");
    let gone_veth = Veth::new(&ns_c, "q0", &ns_b, "q1");
    let t = |ns: &NetNs, ifname: &str| AttachTarget {
        ifname: ifname.to_owned(),
        netns: Some(ns.path().to_path_buf()),
    };
    let (tc, xdp, unclaimed, gone) = (
        t(&ns_a, "p0"),
        t(&ns_b, "p1"),
        t(&ns_a, "p3"),
        t(&ns_c, "q0"),
    );
    let pin_of = |target: &AttachTarget, mode: AttachMode| {
        links_dir.join(format!("{}_{mode}", link_key(Role::Port, target)))
    };
    let xid = 0x5a5a_0001;
    let p1 = ns_b.ifindex("p1");
    let (tc_id, xdp_id, unclaimed_id) = {
        let mut dp = Datapath::load_pinned(&dir).expect("load pinned");
        let mut attach = |target: &AttachTarget, mode| {
            let a = dp
                .attach(target, Some(mode), CaptureMode::Intercept)
                .unwrap();
            assert_eq!(a.handover, Handover::Attached);
            dp.link_id(target).expect("a BPF link")
        };
        let ids = (
            attach(&tc, AttachMode::Tc),
            attach(&xdp, AttachMode::XdpGeneric),
            attach(&unclaimed, AttachMode::Tc),
        );
        attach(&gone, AttachMode::Tc);
        assert_eq!(std::fs::read_dir(&links_dir).unwrap().count(), 4);
        assert_eq!(pinned_link(&pin_of(&tc, AttachMode::Tc)).0, ids.0);
        dp.xid_ownership().own(xid, p1).unwrap();
        ids
        // The agent exits.
    };
    for id in [tc_id, xdp_id, unclaimed_id] {
        assert!(link_exists(id), "link {id} went with the agent");
    }
    // While no agent runs, an owned reply reaches p1: the pinned program
    // keeps it from b's stack and puts it in the pinned ring.
    let sock = ns_a.packet_socket(ns_a.ifindex("p0"), libc::ETH_P_ALL as u16, None);
    let f = frame(MessageType::Ack, xid);
    // SAFETY: sending a buffer on a bound packet socket.
    let n = unsafe { libc::send(sock.as_raw_fd(), f.as_ptr().cast(), f.len(), 0) };
    assert_eq!(
        n,
        f.len() as isize,
        "send: {}",
        std::io::Error::last_os_error()
    );
    // The device of one pinned link goes away while no agent runs.
    drop(gone_veth);
    drop(ns_c);
    // Another version of the XDP program is running on p1 when the next
    // agent starts (here the object's do-nothing baseline).
    let pass_prog = {
        let mut other = aya::EbpfLoader::new()
            .load(xdhcp::datapath::ebpf::embedded_object())
            .unwrap();
        let prog: &mut aya::programs::Xdp = other
            .program_mut(xdhcp_common::PROG_XDP_PASS)
            .unwrap()
            .try_into()
            .unwrap();
        prog.load().unwrap();
        let link: aya::programs::links::FdLink =
            aya::programs::links::PinnedLink::from_pin(pin_of(&xdp, AttachMode::XdpGeneric))
                .unwrap()
                .into();
        let link = aya::programs::xdp::XdpLink::try_from(link).unwrap();
        prog.attach_to_link(link).unwrap();
        prog.info().unwrap().id()
    };
    let (id, prog) = pinned_link(&pin_of(&xdp, AttachMode::XdpGeneric));
    assert_eq!((id, prog), (xdp_id, pass_prog), "the stand-in version runs");

    let mut dp = Datapath::load_pinned(&dir).expect("the next agent");
    // Only the pins' names are read at start (no system call per link on
    // the way to serving): the gone device's pin waits with the others.
    assert_eq!(dp.unclaimed_links(), 4);
    // What arrived meanwhile is drained first.
    let mut reader = dp.take_reader().unwrap().expect("the ring reader");
    let ev = reader
        .try_recv()
        .expect("the reply captured while no agent ran");
    assert!(ev.owned);
    assert_eq!(ev.frame.ifindex, p1);
    assert_eq!(
        Message::decode(&mut Decoder::new(&ev.frame.payload))
            .unwrap()
            .xid(),
        xid
    );

    let a0 = dp
        .attach(&tc, Some(AttachMode::Tc), CaptureMode::Intercept)
        .unwrap();
    assert_eq!(a0.handover, Handover::Adopted);
    assert_eq!(dp.link_id(&tc), Some(tc_id), "the same link, taken over");
    let a1 = dp
        .attach(&xdp, Some(AttachMode::XdpGeneric), CaptureMode::Intercept)
        .unwrap();
    assert_eq!(a1.handover, Handover::Updated);
    assert_eq!(
        dp.link_id(&xdp),
        Some(xdp_id),
        "updated in place, not re-attached"
    );
    let (_, prog) = pinned_link(&pin_of(&xdp, AttachMode::XdpGeneric));
    assert_ne!(
        prog, pass_prog,
        "this agent's program replaced the other version"
    );
    // The reply's xid is still owned until the agent reconciles.
    // The unclaimed link and the gone device's are released.
    assert_eq!(dp.release_unclaimed().unwrap(), (2, 1));
    assert!(!link_exists(unclaimed_id), "the unclaimed link is released");
    assert!(!pin_of(&unclaimed, AttachMode::Tc).exists());
    assert!(!pin_of(&gone, AttachMode::Tc).exists());
    dp.detach(&tc).unwrap();
    assert!(!pin_of(&tc, AttachMode::Tc).exists(), "a detach unpins");
    assert!(!link_exists(tc_id));
    drop(dp);
    assert!(link_exists(xdp_id), "still pinned");
    let removed = unpin_all(&dir).unwrap();
    // The link, the programs' directory and the maps.
    assert_eq!(removed.len(), 2 + PINNED_MAPS.len(), "{removed:?}");
    assert!(!link_exists(xdp_id), "uninstalling detaches");
    assert!(!dir.exists());
}

/// Ifindexes at or above `IFCONFIG_DIRECT_SLOTS` have no slot in the array
/// mirror: the programs must find their mode in the hash map (set, then
/// cleared), on a real device (a veth) of that index in a namespace of our own.
#[test]
fn large_ifindex_mode_comes_from_the_hash_map() {
    const BIG: u32 = 20_000;
    const { assert!(BIG >= xdhcp_common::IFCONFIG_DIRECT_SLOTS) };
    let ns = xdhcp_tests::NetNs::new();
    ns.ip(&[
        "link",
        "add",
        "xdhcp-hi",
        "index",
        &BIG.to_string(),
        "type",
        "veth",
        "peer",
        "name",
        "xdhcp-hp",
    ]);
    ns.link_up("xdhcp-hp");
    ns.link_up("xdhcp-hi");
    assert_eq!(ns.ifindex("xdhcp-hi"), BIG);
    let f = frame(MessageType::Offer, 9);
    let outcome = xdhcp::sys::netns::run_in_netns(ns.path(), move || {
        let mut out = Vec::new();
        // The ring reader registers with a runtime's reactor.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .expect("a runtime for the ring reader");
        let _entered = rt.enter();
        for kind in KINDS {
            let mut dp = load();
            let mut reader = dp.take_reader().unwrap().unwrap();
            let run_big = |dp: &mut Datapath| {
                dp.test_run_on(kind, &f, 1, BIG)
                    .expect("BPF_PROG_TEST_RUN on the veth")
                    .retval
            };
            let unset = run_big(&mut dp);
            dp.set_mode(BIG, CaptureMode::Intercept).unwrap();
            dp.xid_ownership().own(9, BIG).unwrap();
            let owned = run_big(&mut dp);
            dp.clear_mode(BIG).unwrap();
            let cleared = run_big(&mut dp);
            // A capture is counted once its record is read.
            assert!(
                reader.try_recv().is_some(),
                "{kind:?}: the owned reply's record"
            );
            let c = dp.counters().unwrap();
            out.push((
                kind,
                [unset, owned, cleared],
                (c.mode_off, c.captured, c.dropped_owned),
            ));
        }
        out
    })
    .expect("enter the test namespace");
    for (kind, verdicts, counts) in outcome {
        assert_eq!(
            verdicts,
            [pass(kind), drop_code(kind), pass(kind)],
            "{kind:?}: unset, intercept with owned xid, cleared"
        );
        assert_eq!(
            counts,
            (2, 1, 1),
            "{kind:?}: (mode_off, captured, dropped_owned)"
        );
    }
}

// ------------------------------------------------------------------ netns --

mod netns {
    use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
    use std::time::{Duration, Instant};

    use dhcproto::v4::{Message, MessageType};
    use dhcproto::{Decodable as _, Decoder};
    use xdhcp::datapath::ebpf::{AttachTarget, CaptureMode, Datapath, EventReader};
    use xdhcp::datapath::frame::parse_udp_frame;
    use xdhcp::datapath::{AttachMode, RxPath, Verdict};
    use xdhcp_tests::{Dnsmasq, DnsmasqConfig, Lab, LabClient};

    const ETH_P_IP: u16 = 0x0800;

    /// An AF_PACKET socket bound to the client's interface, created inside its
    /// namespace. `protocol` 0 sends only.
    fn packet_socket(client: &LabClient, protocol: u16) -> OwnedFd {
        client
            .ns
            .packet_socket(client.ifindex, protocol, Some(Duration::from_millis(100)))
    }

    fn send_discover(tx: &OwnedFd, client: &LabClient, xid: u32) {
        let frame = xdhcp_tests::frames::discover(client.mac, client.mac, xid);
        xdhcp_tests::frames::send(tx, &frame);
    }

    /// Waits for a DHCP reply with `xid` on a packet socket.
    fn socket_sees_reply(rx: &OwnedFd, xid: u32, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let mut buf = vec![0u8; 4096];
        while Instant::now() < deadline {
            // SAFETY: receiving into an owned buffer.
            let n = unsafe { libc::recv(rx.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            let Ok(n) = usize::try_from(n) else { continue };
            let Ok((h, payload)) = parse_udp_frame(&buf[..n]) else {
                continue;
            };
            if h.src_port != 67 || h.dst_port != 68 {
                continue;
            }
            if Message::decode(&mut Decoder::new(payload)).is_ok_and(|m| m.xid() == xid) {
                return true;
            }
        }
        false
    }

    async fn next_offer(reader: &mut EventReader, xid: u32) -> xdhcp::datapath::ebpf::DhcpEvent {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            let ev = tokio::time::timeout_at(deadline, reader.recv())
                .await
                .unwrap_or_else(|_| panic!("no OFFER with xid {xid:#x} in the ring buffer"))
                .expect("ring buffer");
            let xdhcp::datapath::ebpf::Captured::V4(ev) = ev else {
                continue;
            };
            if super::message(&ev).xid() == xid {
                return ev;
            }
        }
    }

    async fn dnsmasq_offer_through(mode: AttachMode) {
        let lab = Lab::with_clients(1);
        let _dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
        let client = &lab.clients[0];
        let mut dp = Datapath::load().expect("load");
        let mut reader = dp.take_reader().unwrap().unwrap();
        let target = AttachTarget {
            ifname: client.ifname.clone(),
            netns: Some(client.ns.path().to_path_buf()),
        };
        let att = dp
            .attach(&target, Some(mode), CaptureMode::Observe)
            .expect("attach");
        assert_eq!(att.mode, mode, "{mode}: {:?}", att.native_refused);
        assert_eq!(att.ifindex, client.ifindex);
        // The default for a veth is TC.
        assert_eq!(
            xdhcp::datapath::ebpf::default_attach_mode(xdhcp::datapath::ebpf::InterfaceKind::Veth),
            AttachMode::Tc
        );

        let tx = packet_socket(client, 0);
        // Bound to ETH_P_IP, not ETH_P_ALL: ETH_P_ALL taps run before TC
        // ingress, protocol-bound sockets (like a pod's DHCP client) after it.
        let rx = packet_socket(client, ETH_P_IP);

        // Observe: captured and delivered.
        let xid = 0x5eed_0001;
        dp.xid_ownership().own(xid, client.ifindex).unwrap();
        send_discover(&tx, client, xid);
        let ev = next_offer(&mut reader, xid).await;
        assert_eq!(
            super::message(&ev).opts().msg_type(),
            Some(MessageType::Offer)
        );
        assert_eq!(super::message(&ev).chaddr()[..6], client.mac);
        assert_eq!(ev.frame.ifindex, client.ifindex);
        assert_eq!(ev.frame.headers.src_ip, lab.server_ip);
        assert_eq!(
            ev.frame.via,
            RxPath::Ebpf {
                verdict: Verdict::Pass
            }
        );
        assert_eq!(ev.via_tc, mode == AttachMode::Tc);
        assert!(
            socket_sees_reply(&rx, xid, Duration::from_secs(5)),
            "{mode}: observe must pass"
        );

        // Intercept, owned: captured, not delivered.
        dp.set_mode(client.ifindex, CaptureMode::Intercept).unwrap();
        let xid = 0x5eed_0002;
        dp.xid_ownership().own(xid, client.ifindex).unwrap();
        send_discover(&tx, client, xid);
        let ev = next_offer(&mut reader, xid).await;
        assert_eq!(
            ev.frame.via,
            RxPath::Ebpf {
                verdict: Verdict::Drop
            }
        );
        assert!(
            !socket_sees_reply(&rx, xid, Duration::from_secs(2)),
            "{mode}: owned OFFER reached the namespace"
        );

        // Intercept, not owned: delivered, not captured.
        let xid = 0x5eed_0003;
        send_discover(&tx, client, xid);
        assert!(
            socket_sees_reply(&rx, xid, Duration::from_secs(5)),
            "{mode}: unowned OFFER must pass"
        );
        while let Some(ev) = reader.try_recv() {
            assert_ne!(
                super::message(&ev).xid(),
                xid,
                "{mode}: unowned OFFER captured"
            );
        }

        let c = dp.counters().unwrap();
        assert!(
            c.captured >= 2 && c.dropped_owned >= 1 && c.unowned_uncaptured >= 1,
            "{c:?}"
        );

        // Clean detach: a fourth OFFER is no longer captured.
        dp.detach(&target).expect("detach");
        let xid = 0x5eed_0004;
        dp.xid_ownership().own(xid, client.ifindex).unwrap();
        send_discover(&tx, client, xid);
        assert!(socket_sees_reply(&rx, xid, Duration::from_secs(5)));
        assert!(reader.try_recv().is_none(), "{mode}: captured after detach");
        assert_eq!(dp.counters().unwrap().captured, c.captured);
    }

    #[tokio::test]
    async fn dnsmasq_offer_through_tc() {
        dnsmasq_offer_through(AttachMode::Tc).await;
    }

    #[tokio::test]
    async fn dnsmasq_offer_through_native_xdp() {
        dnsmasq_offer_through(AttachMode::XdpNative).await;
    }

    #[tokio::test]
    async fn dnsmasq_offer_through_generic_xdp() {
        dnsmasq_offer_through(AttachMode::XdpGeneric).await;
    }

    #[tokio::test]
    async fn one_program_many_interfaces_default_choice() {
        let lab = Lab::with_clients(2);
        let mut dp = Datapath::load().expect("load");
        for c in &lab.clients {
            let target = AttachTarget {
                ifname: c.ifname.clone(),
                netns: Some(c.ns.path().to_path_buf()),
            };
            let att = dp
                .attach(&target, None, CaptureMode::Observe)
                .expect("attach");
            assert_eq!(att.mode, AttachMode::Tc, "veth default");
            assert!(
                dp.attach(&target, None, CaptureMode::Observe).is_err(),
                "double attach"
            );
        }
        // The bridge in the server namespace is "other": generic XDP.
        let br = AttachTarget {
            ifname: Lab::BRIDGE.to_owned(),
            netns: Some(lab.server.path().to_path_buf()),
        };
        let att = dp.attach(&br, None, CaptureMode::Observe).unwrap();
        assert_eq!(
            (att.mode, att.native_refused),
            (AttachMode::XdpGeneric, None)
        );
        // Asking for native XDP on a bridge (no driver XDP) falls back to
        // generic and says why.
        dp.detach(&br).unwrap();
        let att = dp
            .attach(&br, Some(AttachMode::XdpNative), CaptureMode::Observe)
            .unwrap();
        assert_eq!(att.mode, AttachMode::XdpGeneric);
        assert!(att.native_refused.is_some(), "fallback reported");
        assert_eq!(dp.attachments().len(), 3);
        // Both clients' eth0 have the same ifindex in their own namespaces:
        // detaching one keeps the shared mode entry for the other.
        let (c0, c1) = (&lab.clients[0], &lab.clients[1]);
        assert_eq!(c0.ifindex, c1.ifindex, "lab clients share an ifindex");
        let t0 = AttachTarget {
            ifname: c0.ifname.clone(),
            netns: Some(c0.ns.path().to_path_buf()),
        };
        dp.detach(&t0).expect("detach");
        assert!(dp.detach(&t0).is_err(), "double detach");
        assert_eq!(dp.mode(c1.ifindex).unwrap(), Some(CaptureMode::Observe));
        for (t, _, _) in dp.attachments() {
            dp.detach(&t).expect("detach");
        }
        assert_eq!(dp.mode(c1.ifindex).unwrap(), None);
        let missing = AttachTarget {
            ifname: "nope0".into(),
            netns: Some(lab.server.path().to_path_buf()),
        };
        assert!(dp.attach(&missing, None, CaptureMode::Observe).is_err());
    }

    /// A TAP device in `ns` created with `IFF_NAPI_FRAGS`: each frame written
    /// with `writev` becomes an skb whose linear part is the first iovec and
    /// whose other iovecs are page fragments, as a NIC's receive path builds
    /// them. Returns the device's file descriptor.
    fn frags_tap(ns: &xdhcp_tests::NetNs, name: &'static str) -> OwnedFd {
        const IFF_TAP: libc::c_short = 0x0002;
        const IFF_NAPI: libc::c_short = 0x0010;
        const IFF_NAPI_FRAGS: libc::c_short = 0x0020;
        const IFF_NO_PI: libc::c_short = 0x1000;
        const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
        let fd = ns.run_in(move || {
            // SAFETY: open(2) of a device node; ownership taken at once.
            let fd =
                unsafe { libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
            assert!(fd >= 0, "/dev/net/tun: {}", std::io::Error::last_os_error());
            // SAFETY: fd is fresh and ours.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            // SAFETY: zeroed ifreq is valid; the name fits IFNAMSIZ.
            let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
            for (d, s) in ifr.ifr_name.iter_mut().zip(name.bytes()) {
                *d = s as libc::c_char;
            }
            ifr.ifr_ifru.ifru_flags = IFF_TAP | IFF_NO_PI | IFF_NAPI | IFF_NAPI_FRAGS;
            // SAFETY: TUNSETIFF takes a pointer to a live ifreq.
            let rc = unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETIFF, &raw mut ifr) };
            assert_eq!(rc, 0, "TUNSETIFF: {}", std::io::Error::last_os_error());
            fd
        });
        ns.ip(&["link", "set", name, "up"]);
        fd
    }

    /// Writes `frame` to the TAP in pieces split at `cuts`.
    fn write_in_pieces(tap: &OwnedFd, frame: &[u8], cuts: &[usize]) {
        let mut bounds = vec![0];
        bounds.extend_from_slice(cuts);
        bounds.push(frame.len());
        let iov: Vec<libc::iovec> = bounds
            .windows(2)
            .map(|w| libc::iovec {
                iov_base: frame[w[0]..w[1]].as_ptr().cast_mut().cast(),
                iov_len: w[1] - w[0],
            })
            .collect();
        // SAFETY: every iovec points into `frame`, alive for the call.
        let n = unsafe { libc::writev(tap.as_raw_fd(), iov.as_ptr(), iov.len() as i32) };
        assert_eq!(
            n,
            frame.len() as isize,
            "writev: {}",
            std::io::Error::last_os_error()
        );
    }

    /// TC reads what is not in the skb's linear part through the kernel
    /// (`bpf_skb_load_bytes`): a reply whose BOOTP message, or everything
    /// after the Ethernet header, sits in page fragments is parsed and
    /// copied whole, byte for byte.
    #[tokio::test]
    async fn tc_captures_replies_held_in_page_fragments() {
        let ns = xdhcp_tests::NetNs::new();
        let tap = frags_tap(&ns, "xfrag0");
        let mut dp = Datapath::load().expect("load");
        let mut reader = dp.take_reader().unwrap().unwrap();
        let target = AttachTarget {
            ifname: "xfrag0".to_owned(),
            netns: Some(ns.path().to_path_buf()),
        };
        let att = dp
            .attach(&target, Some(AttachMode::Tc), CaptureMode::Observe)
            .expect("attach TC to the TAP");
        // Ethernet | IPv4 | UDP | BOOTP: the linear part ends after the UDP
        // header, after the Ethernet header, or (the control) holds it all.
        let layouts: [(&str, &[usize]); 3] = [
            ("headers linear, BOOTP in fragments", &[42, 142, 242]),
            ("only Ethernet linear", &[14, 34, 100]),
            ("all linear", &[]),
        ];
        for (i, (layout, cuts)) in layouts.into_iter().enumerate() {
            let xid = 0xf7a6_0000 + i as u32;
            dp.xid_ownership().own(xid, att.ifindex).unwrap();
            let payload = super::dhcp_reply(MessageType::Offer, xid);
            let frame = super::frame(MessageType::Offer, xid);
            write_in_pieces(&tap, &frame, cuts);
            let ev = tokio::time::timeout(Duration::from_secs(5), reader.recv())
                .await
                .unwrap_or_else(|_| panic!("{layout}: nothing captured"))
                .expect("ring buffer");
            let xdhcp::datapath::ebpf::Captured::V4(ev) = ev else {
                panic!("{layout}: a DHCPv6 record")
            };
            assert_eq!(super::message(&ev).xid(), xid, "{layout}");
            assert!(ev.via_tc, "{layout}");
            assert_eq!(ev.frame.ifindex, att.ifindex, "{layout}");
            assert_eq!(ev.frame.payload, payload, "{layout}: BOOTP bytes differ");
            assert_eq!(
                super::message(&ev).chaddr()[..6],
                super::CLIENT_MAC,
                "{layout}"
            );
        }
        let c = dp.counters().unwrap();
        assert_eq!((c.captured, c.load_error, c.malformed), (3, 0, 0), "{c:?}");
        dp.detach(&target).expect("detach");
    }
}

// ------------------------------------------------------------- DHCPv6 --

use dhcproto::v6;
use xdhcp::datapath::ebpf::Captured;
use xdhcp::datapath::frame::{Frame6Headers, build_udp6_frame};

const IAID6: u32 = 0x5e00_5342;

/// A `DHCPv6` server message: `extra` options of no meaning first, then
/// the Client and Server Identifiers and (with `iaid`) an `IA_NA` holding
/// one address.
fn dhcp6(ty: v6::MessageType, xid: u32, iaid: Option<u32>, extra: usize) -> Vec<u8> {
    let mut m = v6::Message::new_with_id(ty, [0; 3]);
    m.set_xid_num(xid);
    let o = m.opts_mut();
    o.insert(v6::DhcpOption::ClientId(vec![
        0, 3, 0, 1, 2, 0, 0x5e, 0, 0x53, 0x42,
    ]));
    o.insert(v6::DhcpOption::ServerId(vec![
        0, 3, 0, 1, 2, 0, 0x5e, 0, 0x53, 1,
    ]));
    if let Some(id) = iaid {
        let mut io = v6::DhcpOptions::new();
        io.insert(v6::DhcpOption::IAAddr(v6::IAAddr {
            addr: "2001:db8::42".parse().unwrap(),
            preferred_life: 3000,
            valid_life: 3600,
            opts: v6::DhcpOptions::new(),
        }));
        o.insert(v6::DhcpOption::IANA(v6::IANA {
            id,
            t1: 1500,
            t2: 2400,
            opts: io,
        }));
    }
    let mut buf = Vec::new();
    m.encode(&mut Encoder::new(&mut buf)).expect("encode");
    // dhcproto writes options sorted by code; these go before all of them.
    for i in 0..extra {
        let code = 200 + i as u8;
        buf.splice(4..4, [0, code, 0, 3, 0xaa, 0xaa, 0xaa]);
    }
    buf
}

fn headers6(vlan: Option<u16>, src_port: u16, dst_port: u16) -> Frame6Headers {
    Frame6Headers {
        src_mac: SERVER_MAC,
        dst_mac: CLIENT_MAC,
        vlan,
        src_ip: "fe80::5eff:fe00:5301".parse().unwrap(),
        dst_ip: "fe80::5eff:fe00:5342".parse().unwrap(),
        src_port,
        dst_port,
    }
}

fn frame6(payload: &[u8]) -> Vec<u8> {
    build_udp6_frame(&headers6(None, 547, 546), payload)
}

/// Owned by transaction id *and* IAID: an ADVERTISE or REPLY of an owned
/// pair is captured and, in intercept mode, dropped, its record an IPv6
/// one; the same transaction id for another IAID, an IAID of another
/// transaction, a v4 xid of the same number, a message with no `IA_NA`
/// (or one past the options the program reads), a client message and a
/// reply behind an extension header all pass uncaptured.
#[tokio::test]
async fn dhcpv6_replies_are_owned_by_transaction_id_and_iaid() {
    for kind in KINDS {
        // One load per program kind (the VM tier runs this under emulation).
        let mut dp = load();
        let mut reader = dp.take_reader().unwrap().unwrap();
        dp.set_mode(LO, CaptureMode::Intercept).unwrap();
        let mut seen = Counters::default();
        for (n, ty) in [v6::MessageType::Advertise, v6::MessageType::Reply]
            .into_iter()
            .enumerate()
        {
            for vlan in [None, Some(7)] {
                let ctx = format!("{kind:?} {ty:?} vlan {vlan:?}");
                let xid = 0x00ab_cd00 | (n as u32) << 4 | u32::from(vlan.is_some());
                dp.xid6_ownership().own(xid, IAID6, LO).unwrap();
                // The same number owned as a v4 xid must not matter.
                let v4_xid = xid ^ 0x80;
                dp.xid_ownership().own(v4_xid, LO).unwrap();
                // Its IA_NA is the eighth option, the last the program reads.
                let payload = dhcp6(ty, xid, Some(IAID6), 5);
                let f = build_udp6_frame(&headers6(vlan, 547, 546), &payload);
                assert_eq!(run(&mut dp, kind, &f), drop_code(kind), "{ctx}: owned");
                let rec = reader
                    .try_recv_any()
                    .unwrap_or_else(|| panic!("{ctx}: no record"));
                let Captured::V6(rx) = rec else {
                    panic!("{ctx}: a v4 record for a DHCPv6 frame")
                };
                assert_eq!(rx.payload, payload, "{ctx}");
                assert_eq!(rx.headers, headers6(vlan, 547, 546), "{ctx}");
                assert_eq!(rx.ifindex, LO, "{ctx}");
                assert_eq!(
                    rx.via,
                    RxPath::Ebpf {
                        verdict: Verdict::Drop
                    },
                    "{ctx}"
                );

                let unowned = [
                    ("another IAID", dhcp6(ty, xid, Some(IAID6 + 1), 0)),
                    ("another transaction", dhcp6(ty, xid + 1, Some(IAID6), 0)),
                    ("the v4 xid's number", dhcp6(ty, v4_xid, Some(IAID6), 0)),
                    ("no IA_NA", dhcp6(ty, xid, None, 0)),
                    ("IA_NA as the ninth option", dhcp6(ty, xid, Some(IAID6), 6)),
                ];
                for (what, p) in &unowned {
                    let f = build_udp6_frame(&headers6(vlan, 547, 546), p);
                    assert_eq!(run(&mut dp, kind, &f), pass(kind), "{ctx}: {what}");
                }
                // Not a server message to the client port.
                let solicit = dhcp6(v6::MessageType::Solicit, xid, Some(IAID6), 0);
                let f = build_udp6_frame(&headers6(vlan, 546, 547), &solicit);
                assert_eq!(run(&mut dp, kind, &f), pass(kind), "{ctx}: SOLICIT");
                let reconfigure = dhcp6(v6::MessageType::Reconfigure, xid, Some(IAID6), 0);
                let f = build_udp6_frame(&headers6(vlan, 547, 546), &reconfigure);
                assert_eq!(run(&mut dp, kind, &f), pass(kind), "{ctx}: RECONFIGURE");
                let c = dp.counters().unwrap();
                assert_eq!(
                    (
                        c.captured - seen.captured,
                        c.dropped_owned - seen.dropped_owned
                    ),
                    (1, 1),
                    "{ctx}: {c:?}"
                );
                assert_eq!(
                    c.unowned_uncaptured - seen.unowned_uncaptured,
                    unowned.len() as u64,
                    "{ctx}: {c:?}"
                );
                assert!(reader.try_recv_any().is_none(), "{ctx}: one record only");

                // Disowned: passes again, uncaptured.
                dp.xid6_ownership().disown(xid, IAID6).unwrap();
                let f = build_udp6_frame(&headers6(vlan, 547, 546), &payload);
                assert_eq!(run(&mut dp, kind, &f), pass(kind), "{ctx}: disowned");
                assert!(reader.try_recv_any().is_none(), "{ctx}: disowned");
                seen = dp.counters().unwrap();
            }
        }
    }
}

/// A frame whose lengths disagree, or too short for a transaction id, is
/// counted as malformed and passed; a reply behind a hop-by-hop header is
/// not looked into (passed as not DHCP), even when owned.
#[tokio::test]
async fn dhcpv6_frames_that_lie_pass_uncaptured() {
    for kind in KINDS {
        let mut dp = load();
        let mut reader = dp.take_reader().unwrap().unwrap();
        dp.set_mode(LO, CaptureMode::Intercept).unwrap();
        dp.xid6_ownership().own(0x42, IAID6, LO).unwrap();
        let good = frame6(&dhcp6(v6::MessageType::Reply, 0x42, Some(IAID6), 0));
        let mut long_ip = good.clone();
        long_ip[18..20].copy_from_slice(&2000u16.to_be_bytes());
        let mut long_udp = good.clone();
        let ip_len = u16::from_be_bytes([good[18], good[19]]);
        long_udp[58..60].copy_from_slice(&(ip_len + 1).to_be_bytes());
        let short = frame6(&[7, 0, 0]);
        for (what, f) in [
            ("IPv6 length", &long_ip),
            ("UDP length", &long_udp),
            ("3-byte message", &short),
        ] {
            assert_eq!(run(&mut dp, kind, f), pass(kind), "{kind:?} {what}");
        }
        let mut hop_by_hop = good.clone();
        hop_by_hop[20] = 0;
        assert_eq!(
            run(&mut dp, kind, &hop_by_hop),
            pass(kind),
            "{kind:?} hop-by-hop"
        );
        let c = dp.counters().unwrap();
        assert_eq!((c.malformed, c.captured), (3, 0), "{kind:?} {c:?}");
        assert!(reader.try_recv_any().is_none());
        // And the good one is captured.
        assert_eq!(run(&mut dp, kind, &good), drop_code(kind), "{kind:?} good");
    }
}
