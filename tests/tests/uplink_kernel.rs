//! The uplink programs (`xdhcp_uplink_xdp`, `xdhcp_uplink_tc`) through
//! `BPF_PROG_TEST_RUN`: every verdict, tagged and untagged, every
//! truncation offset, and the separation of the uplink and workload-port
//! configurations (an ifindex of a pod's namespace never selects an
//! uplink's mode, nor the other way round). Under test-run the ingress
//! device is the loopback device of the test's namespace (ifindex 1).
//!
//! Needs root (`CAP_BPF`, `CAP_NET_ADMIN`); fails, never skips, without it.

use std::net::Ipv4Addr;

use dhcproto::v4::{DhcpOption, Message, MessageType, Opcode};
use dhcproto::{Encodable as _, Encoder};
use xdhcp::datapath::ebpf::{CaptureMode, Counters, Datapath, ProgramKind, Role};
use xdhcp::datapath::frame::{FrameHeaders, build_udp_frame};
use xdhcp::datapath::{RxPath, Verdict};

const LO: u32 = 1;
const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;
const TC_ACT_UNSPEC: u32 = u32::MAX; // -1
const TC_ACT_SHOT: u32 = 2;
const SERVER_MAC: [u8; 6] = [0x02, 0x00, 0x5e, 0x00, 0x53, 0x01];
const CLIENT_MAC: [u8; 6] = [0x02, 0x00, 0x5e, 0x00, 0x53, 0x42];

const UPLINK_KINDS: [ProgramKind; 2] = [ProgramKind::UplinkXdp, ProgramKind::UplinkTc];
const VLANS: [Option<u16>; 2] = [None, Some(100)];

fn is_tc(kind: ProgramKind) -> bool {
    matches!(kind, ProgramKind::Tc | ProgramKind::UplinkTc)
}

fn pass(kind: ProgramKind) -> u32 {
    if is_tc(kind) { TC_ACT_UNSPEC } else { XDP_PASS }
}

fn drop_code(kind: ProgramKind) -> u32 {
    if is_tc(kind) { TC_ACT_SHOT } else { XDP_DROP }
}

fn reply(mt: MessageType, xid: u32) -> Vec<u8> {
    let mut m = Message::default();
    m.set_opcode(Opcode::BootReply)
        .set_xid(xid)
        .set_yiaddr(Ipv4Addr::new(192, 0, 2, 50))
        .set_chaddr(&CLIENT_MAC);
    m.opts_mut().insert(DhcpOption::MessageType(mt));
    m.opts_mut()
        .insert(DhcpOption::ServerIdentifier(Ipv4Addr::new(192, 0, 2, 1)));
    let mut buf = Vec::new();
    m.encode(&mut Encoder::new(&mut buf)).expect("encode");
    buf
}

fn headers(vlan: Option<u16>) -> FrameHeaders {
    FrameHeaders {
        src_mac: SERVER_MAC,
        dst_mac: CLIENT_MAC,
        vlan,
        src_ip: Ipv4Addr::new(192, 0, 2, 1),
        dst_ip: Ipv4Addr::new(192, 0, 2, 50),
        src_port: 67,
        dst_port: 68,
    }
}

fn frame(mt: MessageType, xid: u32, vlan: Option<u16>) -> Vec<u8> {
    build_udp_frame(&headers(vlan), &reply(mt, xid))
}

fn load() -> Datapath {
    Datapath::load().expect("load the eBPF object (needs root and the embedded object)")
}

fn run(dp: &mut Datapath, kind: ProgramKind, f: &[u8]) -> u32 {
    dp.test_run(kind, f, 1).expect("BPF_PROG_TEST_RUN").retval
}

#[tokio::test]
async fn uplink_verdicts_in_every_mode_tagged_and_untagged() {
    for kind in UPLINK_KINDS {
        for vlan in VLANS {
            for mode in [
                CaptureMode::Off,
                CaptureMode::Observe,
                CaptureMode::Intercept,
            ] {
                for owned in [false, true] {
                    let ctx = format!("{kind:?} vlan={vlan:?} {mode:?} owned={owned}");
                    let mut dp = load();
                    let mut reader = dp.take_reader().unwrap().unwrap();
                    let xid = 0x0b0b_0000 | u32::from(owned);
                    dp.set_role_mode(Role::Uplink, LO, mode).unwrap();
                    if owned {
                        // 0: owned before any path is known (any interface).
                        dp.xid_ownership().own(xid, 0).unwrap();
                    }
                    dp.xid_ownership().own(0x1234_5678, 0).unwrap();
                    let f = frame(MessageType::Offer, xid, vlan);
                    let dropped = mode == CaptureMode::Intercept && owned;
                    let want = if dropped { drop_code(kind) } else { pass(kind) };
                    assert_eq!(run(&mut dp, kind, &f), want, "{ctx}: verdict");

                    // Only replies to an owned xid reach user space.
                    let mut c = Counters::default();
                    if mode == CaptureMode::Off {
                        c.mode_off = 1;
                    } else if !owned {
                        c.unowned_uncaptured = 1;
                    } else {
                        c.captured = 1;
                        if dropped {
                            c.dropped_owned = 1;
                        }
                    }
                    // A capture is counted once its record is read.
                    let ev = reader.try_recv();
                    assert_eq!(dp.counters().unwrap(), c, "{ctx}: counters");
                    if mode == CaptureMode::Off || !owned {
                        assert!(ev.is_none(), "{ctx}: nothing captured");
                        continue;
                    }
                    let ev = ev.unwrap_or_else(|| panic!("{ctx}: no record"));
                    let verdict = if dropped {
                        Verdict::Drop
                    } else {
                        Verdict::Pass
                    };
                    assert_eq!(ev.frame.via, RxPath::Uplink { verdict }, "{ctx}");
                    assert_eq!(ev.frame.headers, headers(vlan), "{ctx}");
                    assert_eq!(ev.frame.payload, reply(MessageType::Offer, xid), "{ctx}");
                    assert_eq!(ev.owned, dropped, "{ctx}");
                    assert_eq!(ev.via_tc, is_tc(kind), "{ctx}");
                    assert!(reader.try_recv().is_none(), "{ctx}: exactly one record");
                }
            }
        }
    }
}

/// The two configurations are separate key spaces: the same ifindex set
/// for a workload port does not configure an uplink, nor the reverse.
#[tokio::test]
async fn uplink_and_port_configurations_never_collide() {
    let f = frame(MessageType::Ack, 42, None);
    for (port_kind, uplink_kind) in [
        (ProgramKind::Xdp, ProgramKind::UplinkXdp),
        (ProgramKind::Tc, ProgramKind::UplinkTc),
    ] {
        let mut dp = load();
        let mut reader = dp.take_reader().unwrap().unwrap();
        dp.xid_ownership().own(42, LO).unwrap();
        // A pod's port with the uplink's ifindex, in intercept mode.
        dp.set_mode(LO, CaptureMode::Intercept).unwrap();
        assert_eq!(run(&mut dp, uplink_kind, &f), pass(uplink_kind));
        assert_eq!(dp.counters().unwrap().mode_off, 1, "{uplink_kind:?}");
        assert!(reader.try_recv().is_none());
        assert_eq!(run(&mut dp, port_kind, &f), drop_code(port_kind));
        let ev = reader.try_recv().expect("the port's record");
        assert_eq!(
            ev.frame.via,
            RxPath::Ebpf {
                verdict: Verdict::Drop
            }
        );

        // Now the uplink on, the port off.
        dp.clear_mode(LO).unwrap();
        dp.set_role_mode(Role::Uplink, LO, CaptureMode::Intercept)
            .unwrap();
        assert_eq!(dp.uplink_mode(LO).unwrap(), Some(CaptureMode::Intercept));
        assert_eq!(dp.mode(LO).unwrap(), None);
        assert_eq!(run(&mut dp, port_kind, &f), pass(port_kind));
        assert!(reader.try_recv().is_none(), "{port_kind:?}: off");
        assert_eq!(run(&mut dp, uplink_kind, &f), drop_code(uplink_kind));
        let ev = reader.try_recv().expect("the uplink's record");
        assert_eq!(
            ev.frame.via,
            RxPath::Uplink {
                verdict: Verdict::Drop
            }
        );
        dp.clear_role_mode(Role::Uplink, LO).unwrap();
        assert_eq!(dp.uplink_mode(LO).unwrap(), None);
        assert_eq!(run(&mut dp, uplink_kind, &f), pass(uplink_kind));
    }
}

#[tokio::test]
async fn uplink_truncated_at_every_offset_passes_as_malformed() {
    for kind in UPLINK_KINDS {
        for vlan in VLANS {
            let ctx = format!("{kind:?} vlan={vlan:?}");
            let mut dp = load();
            let mut reader = dp.take_reader().unwrap().unwrap();
            dp.set_role_mode(Role::Uplink, LO, CaptureMode::Intercept)
                .unwrap();
            dp.xid_ownership().own(77, 0).unwrap();
            let f = frame(MessageType::Offer, 77, vlan);
            let l3 = if vlan.is_some() { 18 } else { 14 };
            // BPF_PROG_TEST_RUN refuses inputs shorter than an Ethernet
            // header, and for skb programs an IPv4 EtherType frame shorter
            // than an IPv4 header (a tagged frame's EtherType is 802.1Q).
            let min = if is_tc(kind) && vlan.is_none() {
                14 + 20
            } else {
                14
            };
            for cut in 0..min {
                assert!(
                    dp.test_run(kind, &f[..cut], 1).is_err(),
                    "{ctx}: {cut}-byte input"
                );
            }
            let cuts = min..f.len();
            let n = cuts.len() as u64;
            for cut in cuts {
                let ret = dp
                    .test_run(kind, &f[..cut], 1)
                    .unwrap_or_else(|e| panic!("{ctx} cut {cut}: {e}"));
                assert_eq!(ret.retval, pass(kind), "{ctx} cut {cut}");
            }
            assert_eq!(
                dp.counters().unwrap(),
                Counters {
                    malformed: n,
                    ..Counters::default()
                },
                "{ctx} (IPv4 at {l3})"
            );
            assert!(reader.try_recv().is_none(), "{ctx}");
            // The whole frame is consumed.
            assert_eq!(run(&mut dp, kind, &f), drop_code(kind), "{ctx}");
            let ev = reader.try_recv().expect("a record");
            assert_eq!(ev.frame.headers.vlan, vlan, "{ctx}");
        }
    }
}

/// Everything that is not a DHCP reply passes an uplink untouched: a
/// client's request, other UDP, TCP, ARP, IPv6, IPv4 fragments.
#[tokio::test]
async fn uplink_passes_everything_else() {
    let mut request = frame(MessageType::Offer, 5, None);
    request[34..38].copy_from_slice(&[0, 68, 0, 67]); // 68 → 67
    let mut udp53 = frame(MessageType::Offer, 5, None);
    udp53[34..36].copy_from_slice(&53u16.to_be_bytes());
    let mut tcp = frame(MessageType::Offer, 5, None);
    tcp[23] = 6;
    let mut arp = vec![0xff; 6];
    arp.extend_from_slice(&SERVER_MAC);
    arp.extend_from_slice(&[0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 1]);
    arp.resize(60, 0);
    let mut frag = frame(MessageType::Offer, 5, None);
    frag[20] = 0x20; // more fragments
    xdhcp::datapath::frame::seal_ipv4_header(&mut frag[14..34]);
    for kind in UPLINK_KINDS {
        let mut dp = load();
        let mut reader = dp.take_reader().unwrap().unwrap();
        dp.set_role_mode(Role::Uplink, LO, CaptureMode::Intercept)
            .unwrap();
        dp.xid_ownership().own(5, 0).unwrap();
        for f in [&request, &udp53, &tcp, &arp, &frag] {
            assert_eq!(run(&mut dp, kind, f), pass(kind), "{kind:?}");
        }
        assert_eq!(
            dp.counters().unwrap(),
            Counters {
                fragment: 1,
                ..Counters::default()
            },
            "{kind:?}"
        );
        assert!(reader.try_recv().is_none());
    }
}
