//! The guard's one rewrite, run for real through `BPF_PROG_TEST_RUN` in
//! both ingress programs (TC, and its XDP twin): on a VM's port (a learning
//! port), a client message from a client without an address leaves with
//! the BOOTP broadcast flag set and a UDP checksum a receiver accepts, so
//! that servers answer by broadcast, which OVN's port security passes when
//! the port is pinned to another address. Nothing else in the frame
//! changes; a renewal (`ciaddr` set), a message that already asks for
//! broadcast, a datagram without a UDP checksum (it keeps none) and a pod's
//! port are handled as they must be. Under test-run the device is the
//! loopback of the test's namespace (ifindex 1), so policies are set on 1.
//!
//! Needs root (`CAP_BPF`, `CAP_NET_ADMIN`); fails, never skips, without it.

use std::net::Ipv4Addr;

use dhcproto::v4::{DhcpOption, Flags, Message, MessageType, Opcode};
use dhcproto::{Decodable as _, Encodable as _, Encoder};
use xdhcp::datapath::ebpf::{Guard, GuardProgram, PortPolicy};
use xdhcp::datapath::frame::{FrameHeaders, build_udp_frame};

const LO: u32 = 1;
const TC_ACT_UNSPEC: u32 = u32::MAX;
const XDP_PASS: u32 = 2;
const VM_MAC: [u8; 6] = [0x02, 0x00, 0x5e, 0x00, 0x53, 0x42];
/// Offset of the UDP header in an untagged frame, and of the BOOTP flags.
const UDP: usize = 14 + 20;
const FLAGS: usize = UDP + 8 + 10;

fn message(mt: MessageType, ciaddr: Ipv4Addr, broadcast: bool) -> Vec<u8> {
    let mut m = Message::default();
    m.set_opcode(Opcode::BootRequest)
        .set_xid(0x5eed)
        .set_chaddr(&VM_MAC)
        .set_ciaddr(ciaddr)
        .set_flags(if broadcast {
            Flags::default().set_broadcast()
        } else {
            Flags::default()
        });
    m.opts_mut().insert(DhcpOption::MessageType(mt));
    m.opts_mut()
        .insert(DhcpOption::ClientIdentifier(vec![0xff, 0, 0, 0, 1, 0, 1]));
    let mut buf = Vec::new();
    m.encode(&mut Encoder::new(&mut buf)).expect("encode");
    buf
}

fn frame(src_ip: Ipv4Addr, payload: &[u8]) -> Vec<u8> {
    build_udp_frame(
        &FrameHeaders {
            src_mac: VM_MAC,
            dst_mac: [0xff; 6],
            vlan: None,
            src_ip,
            dst_ip: Ipv4Addr::BROADCAST,
            src_port: 68,
            dst_port: 67,
        },
        payload,
    )
}

/// The one's complement sum over the UDP datagram of `f` and its pseudo
/// header: 0xffff when its checksum is right.
fn udp_sum(f: &[u8]) -> u16 {
    let udp = &f[UDP..];
    let mut sum: u32 = 0;
    let mut add = |b: &[u8]| {
        for c in b.chunks(2) {
            sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
        }
    };
    add(&f[26..34]); // source and destination addresses
    add(&[0, 17]);
    add(&u16::try_from(udp.len()).unwrap().to_be_bytes());
    add(udp);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

fn checksum_field(f: &[u8]) -> u16 {
    u16::from_be_bytes([f[UDP + 6], f[UDP + 7]])
}

/// Runs `f` through both ingress programs; the frames they passed.
fn run(g: &mut Guard, f: &[u8]) -> [Vec<u8>; 2] {
    let (tc, tc_out) = g
        .test_run_frame(GuardProgram::Ingress, f, LO)
        .expect("BPF_PROG_TEST_RUN (TC)");
    assert_eq!(tc, TC_ACT_UNSPEC, "TC passes the client message");
    let (xdp, xdp_out) = g
        .test_run_frame(GuardProgram::Xdp, f, LO)
        .expect("BPF_PROG_TEST_RUN (XDP)");
    assert_eq!(xdp, XDP_PASS, "XDP passes the client message");
    [tc_out, xdp_out]
}

fn vm_port() -> PortPolicy {
    PortPolicy {
        rate: 0,
        single_client: Some(VM_MAC),
        learn: true,
        ..PortPolicy::default()
    }
}

fn load() -> Guard {
    let mut g =
        Guard::load().expect("load the guard programs (needs root and the embedded object)");
    // The ring is not read here.
    drop(g.take_reader());
    g
}

#[tokio::test]
async fn a_vm_guests_discover_and_request_ask_for_broadcast_replies_with_a_valid_udp_checksum() {
    let mut g = load();
    g.set_policy(LO, &vm_port()).unwrap();
    for mt in [
        MessageType::Discover,
        MessageType::Request,
        MessageType::Decline,
    ] {
        let f = frame(
            Ipv4Addr::UNSPECIFIED,
            &message(mt, Ipv4Addr::UNSPECIFIED, false),
        );
        assert_eq!(udp_sum(&f), 0xffff, "the test's own frame is sound");
        for (hook, out) in ["tc", "xdp"].into_iter().zip(run(&mut g, &f)) {
            assert_eq!(out.len(), f.len(), "{hook} {mt:?}");
            assert_eq!(out[FLAGS], 0x80, "{hook} {mt:?}: broadcast flag set");
            assert_eq!(udp_sum(&out), 0xffff, "{hook} {mt:?}: UDP checksum right");
            // Nothing else moved: the flags and the checksum are the only
            // differences.
            let moved: Vec<usize> = (0..f.len()).filter(|&i| f[i] != out[i]).collect();
            assert!(
                moved
                    .iter()
                    .all(|&i| i == FLAGS || i == UDP + 6 || i == UDP + 7),
                "{hook} {mt:?}: bytes {moved:?} changed"
            );
            let msg = Message::decode(&mut dhcproto::Decoder::new(&out[UDP + 8..])).unwrap();
            assert!(msg.flags().broadcast(), "{hook} {mt:?}");
        }
    }
}

#[tokio::test]
async fn a_datagram_without_a_udp_checksum_keeps_none() {
    let mut g = load();
    g.set_policy(LO, &vm_port()).unwrap();
    let mut f = frame(
        Ipv4Addr::UNSPECIFIED,
        &message(MessageType::Discover, Ipv4Addr::UNSPECIFIED, false),
    );
    f[UDP + 6] = 0;
    f[UDP + 7] = 0;
    for (hook, out) in ["tc", "xdp"].into_iter().zip(run(&mut g, &f)) {
        assert_eq!(out[FLAGS], 0x80, "{hook}: broadcast flag set");
        assert_eq!(checksum_field(&out), 0, "{hook}: still no checksum");
    }
}

#[tokio::test]
async fn renewals_broadcast_requests_and_pods_ports_are_left_alone() {
    let mut g = load();
    g.set_policy(LO, &vm_port()).unwrap();
    // A renewal: the server answers ciaddr by unicast whatever the flag.
    let client = Ipv4Addr::new(192, 0, 2, 50);
    let renewal = frame(client, &message(MessageType::Request, client, false));
    // Already asking for broadcast.
    let asked = frame(
        Ipv4Addr::UNSPECIFIED,
        &message(MessageType::Discover, Ipv4Addr::UNSPECIFIED, true),
    );
    for f in [&renewal, &asked] {
        for (hook, out) in ["tc", "xdp"].into_iter().zip(run(&mut g, f)) {
            assert_eq!(&out, f, "{hook}: unchanged");
        }
    }
    // A pod's port (one client, no learning): nothing is rewritten.
    g.set_policy(
        LO,
        &PortPolicy {
            learn: false,
            ..vm_port()
        },
    )
    .unwrap();
    let discover = frame(
        Ipv4Addr::UNSPECIFIED,
        &message(MessageType::Discover, Ipv4Addr::UNSPECIFIED, false),
    );
    for (hook, out) in ["tc", "xdp"].into_iter().zip(run(&mut g, &discover)) {
        assert_eq!(out, discover, "{hook}: a pod's DISCOVER unchanged");
    }
}
