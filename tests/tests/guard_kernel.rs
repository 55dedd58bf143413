//! The DHCP guard programs run for real through `BPF_PROG_TEST_RUN`: every
//! verdict (server message dropped or passed on a trusted port, client
//! message passed, rate-limited, spoofed, malformed), truncation at every
//! offset, VLAN-tagged and not, stacked VLAN tags, a neighbour's client
//! identifier, fragments, IPv4 options, non-DHCP traffic,
//! and the records of the learning ring in both directions (DHCPv4 and
//! DHCPv6); the ingress
//! program's XDP twin gives the same verdicts. Under test-run
//! the device is the loopback of the test's namespace (ifindex 1), so port
//! policies are set on 1.
//!
//! Needs root (`CAP_BPF`, `CAP_NET_ADMIN`); fails, never skips, without it.

use std::net::Ipv4Addr;

use dhcproto::v4::{DhcpOption, Message, MessageType, Opcode};
use dhcproto::{Encodable as _, Encoder};
use xdhcp::datapath::ebpf::{
    Carried, Direction, Guard, GuardCounters, GuardProgram, GuardReader, LearnCounters, PortPolicy,
};
use xdhcp::datapath::frame::{FrameHeaders, build_udp_frame, seal_ipv4_header};

const LO: u32 = 1;
const TC_ACT_UNSPEC: u32 = u32::MAX; // -1
const TC_ACT_SHOT: u32 = 2;
const VM_MAC: [u8; 6] = [0x02, 0x00, 0x5e, 0x00, 0x53, 0x42];
const OTHER_MAC: [u8; 6] = [0x02, 0x00, 0x5e, 0x00, 0x53, 0x99];
const SERVER_MAC: [u8; 6] = [0x02, 0x00, 0x5e, 0x00, 0x53, 0x01];

fn message(op: Opcode, mt: MessageType, chaddr: [u8; 6]) -> Vec<u8> {
    let mut m = Message::default();
    m.set_opcode(op).set_xid(0x5eed).set_chaddr(&chaddr);
    if op == Opcode::BootReply {
        m.set_yiaddr(Ipv4Addr::new(192, 0, 2, 50));
        m.opts_mut()
            .insert(DhcpOption::ServerIdentifier(Ipv4Addr::new(192, 0, 2, 1)));
    }
    m.opts_mut().insert(DhcpOption::MessageType(mt));
    let mut buf = Vec::new();
    m.encode(&mut Encoder::new(&mut buf)).expect("encode");
    buf
}

struct Dhcp {
    src_mac: [u8; 6],
    chaddr: [u8; 6],
    vlan: Option<u16>,
    ports: (u16, u16),
    op: Opcode,
    mt: MessageType,
}

impl Dhcp {
    fn client(mt: MessageType) -> Self {
        Self {
            src_mac: VM_MAC,
            chaddr: VM_MAC,
            vlan: None,
            ports: (68, 67),
            op: Opcode::BootRequest,
            mt,
        }
    }

    fn server(mt: MessageType) -> Self {
        Self {
            src_mac: SERVER_MAC,
            chaddr: VM_MAC,
            vlan: None,
            ports: (67, 68),
            op: Opcode::BootReply,
            mt,
        }
    }

    fn vlan(mut self, vlan: Option<u16>) -> Self {
        self.vlan = vlan;
        self
    }

    fn frame(&self) -> Vec<u8> {
        let client = self.ports.1 == 67;
        build_udp_frame(
            &FrameHeaders {
                src_mac: self.src_mac,
                dst_mac: [0xff; 6],
                vlan: self.vlan,
                src_ip: if client {
                    Ipv4Addr::UNSPECIFIED
                } else {
                    Ipv4Addr::new(192, 0, 2, 1)
                },
                dst_ip: Ipv4Addr::BROADCAST,
                src_port: self.ports.0,
                dst_port: self.ports.1,
            },
            &message(self.op, self.mt, self.chaddr),
        )
    }
}

fn load() -> (Guard, GuardReader) {
    let mut g =
        Guard::load().expect("load the guard programs (needs root and the embedded object)");
    let r = g.take_reader().unwrap().unwrap();
    (g, r)
}

fn ingress(g: &mut Guard, f: &[u8]) -> u32 {
    g.test_run(GuardProgram::Ingress, f, LO)
        .expect("BPF_PROG_TEST_RUN")
}

fn egress(g: &mut Guard, f: &[u8]) -> u32 {
    g.test_run(GuardProgram::Egress, f, LO)
        .expect("BPF_PROG_TEST_RUN")
}

fn counters(g: &Guard) -> GuardCounters {
    g.counters(LO).unwrap().expect("the port has counters")
}

fn unlimited() -> PortPolicy {
    PortPolicy {
        rate: 0,
        ..PortPolicy::default()
    }
}

/// The loopback guarded as a VM's port: its one client `VM_MAC`, no rate
/// limit, learning when `learn`.
fn set_vm_port(g: &mut Guard, learn: bool) {
    g.set_policy(
        LO,
        &PortPolicy {
            single_client: Some(VM_MAC),
            learn,
            ..unlimited()
        },
    )
    .unwrap();
}

const VLANS: [Option<u16>; 2] = [None, Some(100)];

#[tokio::test]
async fn server_messages_from_an_untrusted_port_are_dropped_and_counted() {
    for vlan in VLANS {
        let (mut g, mut r) = load();
        g.set_policy(LO, &unlimited()).unwrap();
        let mut frames = Vec::new();
        for mt in [MessageType::Offer, MessageType::Ack, MessageType::Nak] {
            frames.push(Dhcp::server(mt).vlan(vlan).frame());
        }
        // A relay agent's forward (67 → 67, BOOTREQUEST) is a server-side message.
        let mut relay = Dhcp::client(MessageType::Discover).vlan(vlan);
        relay.ports = (67, 67);
        frames.push(relay.frame());
        // A BOOTREPLY to the server port from the client port.
        let mut reply = Dhcp::server(MessageType::Offer).vlan(vlan);
        reply.ports = (68, 67);
        frames.push(reply.frame());
        // Anything to the client port.
        let mut to_client = Dhcp::client(MessageType::Discover).vlan(vlan);
        to_client.ports = (5000, 68);
        frames.push(to_client.frame());
        for f in &frames {
            assert_eq!(ingress(&mut g, f), TC_ACT_SHOT, "{vlan:?}");
        }
        assert_eq!(
            counters(&g),
            GuardCounters {
                dropped_server: frames.len() as u64,
                ..GuardCounters::default()
            },
            "{vlan:?}"
        );
        assert!(r.try_recv().is_none());
    }
}

#[tokio::test]
async fn a_trusted_port_passes_server_messages() {
    for vlan in VLANS {
        let (mut g, _r) = load();
        g.set_policy(
            LO,
            &PortPolicy {
                trusted: true,
                ..unlimited()
            },
        )
        .unwrap();
        for mt in [MessageType::Offer, MessageType::Ack] {
            let f = Dhcp::server(mt).vlan(vlan).frame();
            assert_eq!(ingress(&mut g, &f), TC_ACT_UNSPEC, "{vlan:?}");
        }
        let c = counters(&g);
        assert_eq!(
            (c.passed_trusted_server, c.dropped_server),
            (2, 0),
            "{vlan:?}"
        );
    }
}

#[tokio::test]
async fn an_unguarded_port_passes_everything() {
    let (mut g, mut r) = load();
    for f in [
        Dhcp::server(MessageType::Offer).frame(),
        Dhcp::client(MessageType::Discover).frame(),
        server6(ADVERTISE, 547, 546, None),
        client6(SOLICIT, OTHER_MAC, OTHER_MAC, None),
        ra(None, &[]),
        ra(None, &vec![dest_opts(0); 7]),
    ] {
        assert_eq!(ingress(&mut g, &f), TC_ACT_UNSPEC);
        assert_eq!(egress(&mut g, &f), TC_ACT_UNSPEC);
    }
    assert_eq!(g.counters(LO).unwrap(), None);
    assert!(r.try_recv().is_none());
}

#[tokio::test]
async fn client_messages_are_limited_to_the_ports_bucket() {
    for vlan in VLANS {
        let (mut g, _r) = load();
        // One message a second, three back to back: a test run takes
        // microseconds, so exactly the burst passes.
        g.set_policy(
            LO,
            &PortPolicy {
                rate: 1,
                burst: 3,
                ..PortPolicy::default()
            },
        )
        .unwrap();
        let f = Dhcp::client(MessageType::Discover).vlan(vlan).frame();
        let verdicts: Vec<u32> = (0..8).map(|_| ingress(&mut g, &f)).collect();
        assert_eq!(
            verdicts,
            [
                TC_ACT_UNSPEC,
                TC_ACT_UNSPEC,
                TC_ACT_UNSPEC,
                TC_ACT_SHOT,
                TC_ACT_SHOT,
                TC_ACT_SHOT,
                TC_ACT_SHOT,
                TC_ACT_SHOT
            ],
            "{vlan:?}"
        );
        let c = counters(&g);
        assert_eq!((c.passed_client, c.dropped_rate), (3, 5), "{vlan:?}");
        // A new policy starts with a full bucket.
        g.set_policy(
            LO,
            &PortPolicy {
                rate: 1,
                burst: 1,
                ..PortPolicy::default()
            },
        )
        .unwrap();
        assert_eq!(ingress(&mut g, &f), TC_ACT_UNSPEC, "{vlan:?}");
        assert_eq!(ingress(&mut g, &f), TC_ACT_SHOT, "{vlan:?}");
        // Server messages are not client messages: they never take a token.
        let s = Dhcp::server(MessageType::Offer).vlan(vlan).frame();
        assert_eq!(ingress(&mut g, &s), TC_ACT_SHOT);
        let c = counters(&g);
        assert_eq!((c.dropped_rate, c.dropped_server), (6, 1), "{vlan:?}");
    }
}

#[tokio::test]
async fn single_client_ports_drop_other_sources_and_chaddrs() {
    for vlan in VLANS {
        let (mut g, _r) = load();
        set_vm_port(&mut g, false);
        for mt in [
            MessageType::Discover,
            MessageType::Request,
            MessageType::Release,
            MessageType::Decline,
            MessageType::Inform,
        ] {
            let ok = Dhcp::client(mt).vlan(vlan);
            assert_eq!(ingress(&mut g, &ok.frame()), TC_ACT_UNSPEC, "{mt:?}");
            let mut src = Dhcp::client(mt).vlan(vlan);
            src.src_mac = OTHER_MAC;
            assert_eq!(ingress(&mut g, &src.frame()), TC_ACT_SHOT, "{mt:?} src");
            let mut chaddr = Dhcp::client(mt).vlan(vlan);
            chaddr.chaddr = OTHER_MAC;
            assert_eq!(
                ingress(&mut g, &chaddr.frame()),
                TC_ACT_SHOT,
                "{mt:?} chaddr"
            );
            let mut both = Dhcp::client(mt).vlan(vlan);
            both.src_mac = OTHER_MAC;
            both.chaddr = OTHER_MAC;
            assert_eq!(ingress(&mut g, &both.frame()), TC_ACT_SHOT, "{mt:?} both");
        }
        let c = counters(&g);
        assert_eq!((c.passed_client, c.dropped_spoof), (5, 15), "{vlan:?}");
        // A port without the rule lets any client through.
        g.set_policy(LO, &unlimited()).unwrap();
        let mut other = Dhcp::client(MessageType::Discover).vlan(vlan);
        other.src_mac = OTHER_MAC;
        other.chaddr = OTHER_MAC;
        assert_eq!(ingress(&mut g, &other.frame()), TC_ACT_UNSPEC);
    }
}

/// Offsets in a frame with `tag` bytes of VLAN header: where the UDP
/// ports and length end (what the program reads first), and where the
/// 8-byte word holding `chaddr` ends.
fn offsets(tag: usize) -> (usize, usize) {
    let payload = 14 + tag + 20 + 8;
    (14 + tag + 20 + 6, payload + 28 + 8)
}

#[tokio::test]
async fn client_messages_truncated_at_every_offset() {
    for vlan in VLANS {
        let tag = if vlan.is_some() { 4 } else { 0 };
        let (ports_end, chaddr_end) = offsets(tag);
        let (mut g, mut r) = load();
        set_vm_port(&mut g, true);
        let f = Dhcp::client(MessageType::Discover).vlan(vlan).frame();
        let mut want = GuardCounters::default();
        // The kernel refuses shorter test inputs for an IPv4 skb.
        for cut in 14 + 20..=f.len() {
            let ret = ingress(&mut g, &f[..cut]);
            if cut < ports_end {
                // Ports not visible (a tagged frame shorter than its IPv4
                // header included): nothing a DHCP server would parse.
                assert_eq!(ret, TC_ACT_UNSPEC, "{vlan:?} cut {cut}");
            } else if cut < chaddr_end {
                assert_eq!(ret, TC_ACT_SHOT, "{vlan:?} cut {cut}");
                want.dropped_malformed += 1;
            } else {
                assert_eq!(ret, TC_ACT_UNSPEC, "{vlan:?} cut {cut}");
                want.passed_client += 1;
                want.learned += 1;
            }
        }
        assert_eq!(counters(&g), want, "{vlan:?}");
        // Every passed message was recorded; only the whole one decodes
        // (the others are cut short of their IPv4 length and rejected).
        let ev = r.try_recv().expect("the whole frame's record");
        assert_eq!(ev.direction, Direction::FromWorkload);
        assert_eq!(ev.headers.src_mac, VM_MAC);
        assert!(r.try_recv().is_none());
        assert_eq!(r.rejected, want.learned - 1, "{vlan:?}");
    }
}

#[tokio::test]
async fn server_messages_truncated_at_every_offset() {
    for vlan in VLANS {
        let tag = if vlan.is_some() { 4 } else { 0 };
        let (ports_end, _) = offsets(tag);
        let (mut g, _r) = load();
        g.set_policy(LO, &unlimited()).unwrap();
        let f = Dhcp::server(MessageType::Offer).vlan(vlan).frame();
        let mut dropped = 0;
        for cut in 14 + 20..=f.len() {
            let ret = ingress(&mut g, &f[..cut]);
            if cut < ports_end {
                assert_eq!(ret, TC_ACT_UNSPEC, "{vlan:?} cut {cut}");
            } else {
                // The source port alone makes it a server message.
                assert_eq!(ret, TC_ACT_SHOT, "{vlan:?} cut {cut}");
                dropped += 1;
            }
        }
        assert_eq!(
            counters(&g),
            GuardCounters {
                dropped_server: dropped,
                ..GuardCounters::default()
            },
            "{vlan:?}"
        );
    }
}

fn set_frag(mut f: Vec<u8>, flags_offset: u16) -> Vec<u8> {
    f[20..22].copy_from_slice(&flags_offset.to_be_bytes());
    seal_ipv4_header(&mut f[14..34]);
    f
}

#[tokio::test]
async fn first_fragments_are_policed_later_ones_pass() {
    let (mut g, _r) = load();
    g.set_policy(LO, &unlimited()).unwrap();
    let offer = Dhcp::server(MessageType::Offer).frame();
    // More fragments, offset 0: the first fragment, ports visible.
    assert_eq!(
        ingress(&mut g, &set_frag(offer.clone(), 0x2000)),
        TC_ACT_SHOT
    );
    // Later fragments carry no UDP header.
    for fo in [0x0001, 0x2010] {
        assert_eq!(ingress(&mut g, &set_frag(offer.clone(), fo)), TC_ACT_UNSPEC);
    }
    assert_eq!(counters(&g).dropped_server, 1);
}

#[tokio::test]
async fn ip_options_do_not_hide_a_server_message() {
    let (mut g, _r) = load();
    g.set_policy(LO, &unlimited()).unwrap();
    for extra in (0..=40).step_by(4) {
        let mut f = Dhcp::server(MessageType::Offer).frame();
        f.splice(34..34, std::iter::repeat_n(1u8, extra)); // NOP options
        f[14] = 0x45 + (extra / 4) as u8;
        let total = u16::from_be_bytes([f[16], f[17]]) + extra as u16;
        f[16..18].copy_from_slice(&total.to_be_bytes());
        seal_ipv4_header(&mut f[14..34 + extra]);
        assert_eq!(ingress(&mut g, &f), TC_ACT_SHOT, "IHL {}", 5 + extra / 4);
    }
    assert_eq!(counters(&g).dropped_server, 11);
}

#[tokio::test]
async fn non_dhcp_traffic_passes_uncounted() {
    let (mut g, mut r) = load();
    g.set_policy(
        LO,
        &PortPolicy {
            single_client: Some(VM_MAC),
            learn: true,
            rate: 1,
            burst: 1,
            ..PortPolicy::default()
        },
    )
    .unwrap();
    let udp = |sport, dport| {
        build_udp_frame(
            &FrameHeaders {
                src_mac: OTHER_MAC,
                dst_mac: [0xff; 6],
                vlan: None,
                src_ip: Ipv4Addr::new(192, 0, 2, 9),
                dst_ip: Ipv4Addr::new(192, 0, 2, 1),
                src_port: sport,
                dst_port: dport,
            },
            &[0u8; 300],
        )
    };
    let mut tcp = udp(40000, 67);
    tcp[23] = 6; // protocol: TCP, to port 67
    seal_ipv4_header(&mut tcp[14..34]);
    let mut ipv6 = udp(546, 547);
    ipv6[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
    let mut arp = vec![0xff; 12];
    arp.extend_from_slice(&0x0806u16.to_be_bytes());
    arp.resize(60, 0);
    for f in [udp(53, 40000), udp(40000, 53), tcp, ipv6, arp] {
        for _ in 0..3 {
            assert_eq!(ingress(&mut g, &f), TC_ACT_UNSPEC);
            assert_eq!(egress(&mut g, &f), TC_ACT_UNSPEC);
        }
    }
    assert_eq!(counters(&g), GuardCounters::default());
    assert!(r.try_recv().is_none());
}

#[tokio::test]
async fn learning_ports_record_the_guests_exchange_both_ways() {
    for vlan in VLANS {
        let (mut g, mut r) = load();
        set_vm_port(&mut g, true);
        let req = Dhcp::client(MessageType::Request).vlan(vlan).frame();
        assert_eq!(ingress(&mut g, &req), TC_ACT_UNSPEC);
        let ev = r.try_recv().expect("the client message");
        assert_eq!(ev.direction, Direction::FromWorkload);
        assert_eq!(ev.ifindex, LO);
        assert_eq!(ev.headers.vlan, vlan);
        assert_eq!(
            ev.payload,
            message(Opcode::BootRequest, MessageType::Request, VM_MAC)
        );
        assert!(ev.ts_ns > 0);

        let ack = Dhcp::server(MessageType::Ack).vlan(vlan).frame();
        assert_eq!(egress(&mut g, &ack), TC_ACT_UNSPEC);
        let ev = r.try_recv().expect("the server reply");
        assert_eq!(ev.direction, Direction::ToWorkload);
        assert_eq!(
            ev.payload,
            message(Opcode::BootReply, MessageType::Ack, VM_MAC)
        );

        // Replies for other clients (broadcast on the segment) are not recorded.
        let mut other = Dhcp::server(MessageType::Ack).vlan(vlan);
        other.chaddr = OTHER_MAC;
        assert_eq!(egress(&mut g, &other.frame()), TC_ACT_UNSPEC);
        // Nor client messages going towards the workload, nor anything on
        // the ingress hook of a port without learning.
        assert_eq!(egress(&mut g, &req), TC_ACT_UNSPEC);
        assert!(r.try_recv().is_none(), "{vlan:?}");
        assert_eq!(counters(&g).learned, 2);

        set_vm_port(&mut g, false);
        assert_eq!(ingress(&mut g, &req), TC_ACT_UNSPEC);
        assert_eq!(egress(&mut g, &ack), TC_ACT_UNSPEC);
        assert!(r.try_recv().is_none(), "{vlan:?}: learning off");
    }
}

/// A learning port hands learning only the replies it uses (ACKs for the
/// port's client), at most the bucket's burst back to back and then its
/// rate; the rest pass in the kernel, counted by reason. The bucket fills
/// again with time.
#[tokio::test]
async fn learning_ports_hand_only_acks_to_learning_within_their_bucket() {
    let (mut g, mut r) = load();
    g.set_learn_limit(10, 3).unwrap();
    set_vm_port(&mut g, true);
    let drain = |r: &mut GuardReader| std::iter::from_fn(|| r.try_recv()).count();

    // OFFERs and NAKs teach learning nothing.
    for mt in [MessageType::Offer, MessageType::Nak] {
        assert_eq!(egress(&mut g, &Dhcp::server(mt).frame()), TC_ACT_UNSPEC);
    }
    assert_eq!(drain(&mut r), 0, "no OFFER or NAK is recorded");
    assert_eq!(
        g.learn_counters().unwrap(),
        LearnCounters { shed: 0, unused: 2 }
    );

    // ACKs: the burst, then shed.
    let ack = Dhcp::server(MessageType::Ack).frame();
    for _ in 0..8 {
        assert_eq!(egress(&mut g, &ack), TC_ACT_UNSPEC, "never dropped");
    }
    assert_eq!(drain(&mut r), 3, "the burst reaches the ring");
    assert_eq!(g.learn_counters().unwrap().shed, 5);
    assert_eq!(counters(&g).learned, 3);

    // 10 per second: after 150 ms one or two more (the burst caps it at 3).
    tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    for _ in 0..5 {
        assert_eq!(egress(&mut g, &ack), TC_ACT_UNSPEC);
    }
    let again = drain(&mut r);
    assert!((1..=3).contains(&again), "{again} after a refill");
    assert_eq!(g.learn_counters().unwrap().shed, 5 + 5 - again as u64);

    // A new policy starts the port with a full bucket (the same one set
    // again, as a restarted agent does, keeps the entry as it is).
    g.set_policy(
        LO,
        &PortPolicy {
            single_client: Some(VM_MAC),
            learn: true,
            rate: 1000,
            ..PortPolicy::default()
        },
    )
    .unwrap();
    for _ in 0..3 {
        assert_eq!(egress(&mut g, &ack), TC_ACT_UNSPEC);
    }
    assert_eq!(drain(&mut r), 3, "a fresh bucket");
}

#[tokio::test]
async fn large_frames_are_recorded_whole() {
    let (mut g, mut r) = load();
    set_vm_port(&mut g, true);
    // Around the record-size boundary, and a full 1500-byte MTU frame.
    let base = Dhcp::server(MessageType::Ack).frame();
    for len in [1023usize, 1024, 1025, 1514] {
        let mut m = message(Opcode::BootReply, MessageType::Ack, VM_MAC);
        let pad = len - base.len();
        m.extend(std::iter::repeat_n(0u8, pad)); // padding after the end option
        let f = build_udp_frame(
            &FrameHeaders {
                src_mac: SERVER_MAC,
                dst_mac: [0xff; 6],
                vlan: None,
                src_ip: Ipv4Addr::new(192, 0, 2, 1),
                dst_ip: Ipv4Addr::BROADCAST,
                src_port: 67,
                dst_port: 68,
            },
            &m,
        );
        assert_eq!(f.len(), len);
        assert_eq!(egress(&mut g, &f), TC_ACT_UNSPEC);
        let ev = r.try_recv().unwrap_or_else(|| panic!("{len}: no record"));
        assert_eq!(ev.payload, m, "{len}");
    }
}

/// A client message from `VM_MAC` with raw `extra` option bytes inserted
/// before the end option.
fn client_with_options(mt: MessageType, vlan: Option<u16>, extra: &[u8]) -> Vec<u8> {
    let mut m = message(Opcode::BootRequest, mt, VM_MAC);
    // Walk the options (after the cookie at 236) to the end option.
    let mut at = 240;
    while m[at] != 255 {
        at += if m[at] == 0 {
            1
        } else {
            2 + usize::from(m[at + 1])
        };
    }
    m.splice(at..at, extra.iter().copied());
    build_udp_frame(
        &FrameHeaders {
            src_mac: VM_MAC,
            dst_mac: [0xff; 6],
            vlan,
            src_ip: Ipv4Addr::UNSPECIFIED,
            dst_ip: Ipv4Addr::BROADCAST,
            src_port: 68,
            dst_port: 67,
        },
        &m,
    )
}

/// Option 61 of type 1 with `mac`.
fn mac_id(mac: [u8; 6]) -> Vec<u8> {
    let mut o = vec![61, 7, 1];
    o.extend_from_slice(&mac);
    o
}

#[tokio::test]
async fn single_client_ports_drop_a_neighbours_client_identifier() {
    for vlan in VLANS {
        let (mut g, _r) = load();
        set_vm_port(&mut g, false);
        let text_id = [61, 5, 0, b'p', b'o', b'd', b'1'];
        let mut want = GuardCounters::default();
        for mt in [
            MessageType::Discover,
            MessageType::Request,
            MessageType::Release,
            MessageType::Decline,
        ] {
            // Its own MAC as the identifier, an identifier of another type,
            // none at all, pads in front: passed.
            let mut own_padded = vec![0; 5];
            own_padded.extend(mac_id(VM_MAC));
            for ok in [mac_id(VM_MAC), text_id.to_vec(), Vec::new(), own_padded] {
                let f = client_with_options(mt, vlan, &ok);
                assert_eq!(ingress(&mut g, &f), TC_ACT_UNSPEC, "{mt:?} {ok:?}");
                want.passed_client += 1;
            }
            // The neighbour's `01` + MAC with the port's own chaddr and
            // source: a RELEASE in its name. Dropped as a spoof.
            let f = client_with_options(mt, vlan, &mac_id(OTHER_MAC));
            assert_eq!(ingress(&mut g, &f), TC_ACT_SHOT, "{mt:?} neighbour id");
            want.dropped_spoof += 1;
            // What the guard cannot check: two identifiers (its own first),
            // option overload, more options than it reads.
            let mut two = mac_id(VM_MAC);
            two.extend(mac_id(OTHER_MAC));
            let overload = vec![52, 1, 3];
            let many: Vec<u8> = (0..60).flat_map(|_| [250u8, 1, 0]).collect();
            for bad in [two, overload, many] {
                let f = client_with_options(mt, vlan, &bad);
                assert_eq!(ingress(&mut g, &f), TC_ACT_SHOT, "{mt:?} {bad:?}");
                want.dropped_unclassified += 1;
            }
        }
        assert_eq!(counters(&g), want, "{vlan:?}");
        // A port without the rule lets the neighbour's identifier through.
        g.set_policy(LO, &unlimited()).unwrap();
        let f = client_with_options(MessageType::Release, vlan, &mac_id(OTHER_MAC));
        assert_eq!(ingress(&mut g, &f), TC_ACT_UNSPEC);
    }
}

/// `f` (untagged) with VLAN tags of `tpids` (outermost first) inserted
/// after the MAC addresses.
fn with_tags(f: &[u8], tpids: &[u16]) -> Vec<u8> {
    let mut out = f[..12].to_vec();
    for (i, tpid) in tpids.iter().enumerate() {
        out.extend_from_slice(&tpid.to_be_bytes());
        out.extend_from_slice(&(100 + i as u16).to_be_bytes());
    }
    out.extend_from_slice(&f[12..]);
    out
}

#[tokio::test]
async fn stacked_vlan_tags_do_not_hide_dhcp() {
    // Trusted or not, with or without the single-client rule: a frame the
    // guard cannot classify is dropped.
    for policy in [
        unlimited(),
        PortPolicy {
            trusted: true,
            single_client: Some(VM_MAC),
            ..unlimited()
        },
    ] {
        let (mut g, _r) = load();
        g.set_policy(LO, &policy).unwrap();
        let offer = Dhcp::server(MessageType::Offer).frame();
        let discover = Dhcp::client(MessageType::Discover).frame();
        let stacks: [&[u16]; 6] = [
            &[0x88a8, 0x8100],
            &[0x8100, 0x8100],
            &[0x9100],
            &[0x9100, 0x8100],
            &[0x88a8, 0x8100, 0x8100],
            &[0x88a8, 0x8100, 0x8100, 0x8100],
        ];
        let mut dropped = 0;
        for tags in stacks {
            for f in [&offer, &discover] {
                let tagged = with_tags(f, tags);
                assert_eq!(ingress(&mut g, &tagged), TC_ACT_SHOT, "{tags:x?}");
                dropped += 1;
            }
        }
        let c = counters(&g);
        assert_eq!(c.dropped_unclassified, dropped, "{policy:?}");
        // Stacked tags over anything else pass uncounted.
        let dns = build_udp_frame(
            &FrameHeaders {
                src_mac: OTHER_MAC,
                dst_mac: [0xff; 6],
                vlan: None,
                src_ip: Ipv4Addr::new(192, 0, 2, 9),
                dst_ip: Ipv4Addr::new(192, 0, 2, 1),
                src_port: 40000,
                dst_port: 53,
            },
            &[0u8; 300],
        );
        let mut arp = vec![0xff; 12];
        arp.extend_from_slice(&0x0806u16.to_be_bytes());
        arp.resize(60, 0);
        for f in [dns, arp] {
            for tags in [&[0x88a8u16, 0x8100][..], &[0x8100, 0x8100, 0x8100]] {
                assert_eq!(ingress(&mut g, &with_tags(&f, tags)), TC_ACT_UNSPEC);
            }
        }
        assert_eq!(counters(&g), c);
    }
    // An unguarded port passes them.
    let (mut g, _r) = load();
    let f = with_tags(&Dhcp::server(MessageType::Offer).frame(), &[0x88a8, 0x8100]);
    assert_eq!(ingress(&mut g, &f), TC_ACT_UNSPEC);
}

const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;

/// The XDP twin of the ingress program (on the ports of a userspace-datapath
/// Open vSwitch bridge) gives the ingress program's verdict on every frame,
/// under every kind of policy, with the same counters and the same learning
/// records.
#[tokio::test]
async fn the_xdp_twin_gives_the_ingress_programs_verdicts() {
    let mut frames = Vec::new();
    for vlan in VLANS {
        frames.push(Dhcp::server(MessageType::Offer).vlan(vlan).frame());
        frames.push(Dhcp::server(MessageType::Ack).vlan(vlan).frame());
        for mt in [MessageType::Discover, MessageType::Request] {
            frames.push(Dhcp::client(mt).vlan(vlan).frame());
        }
        let mut spoofed = Dhcp::client(MessageType::Discover).vlan(vlan);
        spoofed.src_mac = OTHER_MAC;
        frames.push(spoofed.frame());
        let mut other = Dhcp::client(MessageType::Discover).vlan(vlan);
        other.chaddr = OTHER_MAC;
        frames.push(other.frame());
        // Cut short before chaddr.
        let (_, chaddr_end) = offsets(usize::from(vlan.is_some()) * 4);
        frames.push(
            Dhcp::client(MessageType::Discover).vlan(vlan).frame()[..chaddr_end - 1].to_vec(),
        );
        // Not DHCP.
        let mut dns = Dhcp::client(MessageType::Discover).vlan(vlan);
        dns.ports = (5353, 53);
        frames.push(dns.frame());
        // IPv6: DHCPv6 both ways, spoofed, RAs plain and hidden, a later
        // fragment, neighbour discovery.
        frames.push(server6(ADVERTISE, 547, 546, vlan));
        frames.push(server6(REPLY, 547, 546, vlan));
        frames.push(client6(SOLICIT, VM_MAC, VM_MAC, vlan));
        frames.push(client6(REQUEST, VM_MAC, VM_MAC, vlan));
        frames.push(client6(SOLICIT, OTHER_MAC, VM_MAC, vlan));
        frames.push(client6(RELEASE, VM_MAC, OTHER_MAC, vlan));
        frames.push(ra(vlan, &[]));
        frames.push(ra(vlan, &[hop_by_hop(), dest_opts(0)]));
        frames.push(ra(vlan, &[fragment(0, true)]));
        frames.push(ra(vlan, &vec![dest_opts(0); 7]));
        frames.push(v6(
            VM_MAC,
            vlan,
            &[fragment(9, false)],
            IPPROTO_ICMPV6,
            &icmp6(ROUTER_ADVERT, 12),
        ));
        frames.push(v6(VM_MAC, vlan, &[], IPPROTO_ICMPV6, &icmp6(135, 20)));
    }
    let policies = [
        unlimited(),
        PortPolicy {
            trusted: true,
            ..unlimited()
        },
        PortPolicy {
            single_client: Some(VM_MAC),
            learn: true,
            ..unlimited()
        },
        PortPolicy {
            rate: 1,
            burst: 3,
            ..PortPolicy::default()
        },
    ];
    for policy in &policies {
        let (mut tc, mut tc_ring) = load();
        let (mut xdp, mut xdp_ring) = load();
        tc.set_policy(LO, policy).unwrap();
        xdp.set_policy(LO, policy).unwrap();
        for (i, f) in frames.iter().enumerate() {
            let at_tc = ingress(&mut tc, f);
            let at_xdp = xdp
                .test_run(GuardProgram::Xdp, f, LO)
                .expect("BPF_PROG_TEST_RUN");
            let want = match at_tc {
                TC_ACT_SHOT => XDP_DROP,
                TC_ACT_UNSPEC => XDP_PASS,
                other => panic!("TC action {other}"),
            };
            assert_eq!(at_xdp, want, "frame {i} under {policy:?}");
        }
        assert_eq!(counters(&tc), counters(&xdp), "{policy:?}");
        let mut learned = 0;
        loop {
            match (tc_ring.try_recv(), xdp_ring.try_recv()) {
                (None, None) => break,
                (Some(a), Some(b)) => {
                    assert_eq!(
                        (a.ifindex, a.direction, a.headers, &a.payload),
                        (b.ifindex, b.direction, b.headers, &b.payload),
                        "{policy:?}"
                    );
                    learned += 1;
                }
                (a, b) => panic!("one ring has a record the other lacks: {a:?} / {b:?}"),
            }
        }
        assert_eq!(learned > 0, policy.learn, "{policy:?}: {learned} records");
    }
}

// ---------------------------------------------------------------- IPv6 --

const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const IPPROTO_ICMPV6: u8 = 58;
const NEXTHDR_HOP: u8 = 0;
const NEXTHDR_ROUTING: u8 = 43;
const NEXTHDR_FRAGMENT: u8 = 44;
const NEXTHDR_DEST: u8 = 60;

/// DHCPv6 message types (RFC 8415 §7.3).
const SOLICIT: u8 = 1;
const ADVERTISE: u8 = 2;
const REQUEST: u8 = 3;
const RENEW: u8 = 5;
const REPLY: u8 = 7;
const RELEASE: u8 = 8;
const DECLINE: u8 = 9;
const RECONFIGURE: u8 = 10;
const INFORMATION_REQUEST: u8 = 11;
const RELAY_REPL: u8 = 13;

/// An extension header: its kind and its bytes (the first, the next
/// header, is filled in by [`v6`]).
type Ext = (u8, Vec<u8>);

fn hop_by_hop() -> Ext {
    // A `PadN` of 4 bytes: 8 bytes in all.
    (NEXTHDR_HOP, vec![0, 0, 1, 2, 0, 0, 0, 0])
}

/// Destination options of `(units + 1) * 8` bytes (`PadN` options).
fn dest_opts(units: u8) -> Ext {
    let total = (usize::from(units) + 1) * 8;
    let mut h = vec![0, units];
    // PadN options of at most 255 bytes each.
    let mut left = total - 2;
    while left > 0 {
        let n = left.min(257);
        h.push(1);
        h.push((n - 2) as u8);
        h.extend(std::iter::repeat_n(0, n - 2));
        left -= n;
    }
    (NEXTHDR_DEST, h)
}

/// A routing header of type 253 (experimental), no segments left.
fn routing() -> Ext {
    (NEXTHDR_ROUTING, vec![0, 0, 253, 0, 0, 0, 0, 0])
}

/// A fragment header: offset in 8-byte units, more fragments or not.
fn fragment(offset: u16, more: bool) -> Ext {
    let [a, b] = (offset << 3 | u16::from(more)).to_be_bytes();
    (NEXTHDR_FRAGMENT, vec![0, 0, a, b, 0x5e, 0xed, 0, 1])
}

/// An IPv6 frame from `src` (link-local source, to `ff02::1`): the
/// extension headers `ext`, then `proto` carrying `l4`.
fn v6(src: [u8; 6], vlan: Option<u16>, ext: &[Ext], proto: u8, l4: &[u8]) -> Vec<u8> {
    let mut chain = Vec::new();
    for (i, (_, body)) in ext.iter().enumerate() {
        let mut body = body.clone();
        body[0] = ext.get(i + 1).map_or(proto, |e| e.0);
        chain.extend(body);
    }
    chain.extend_from_slice(l4);
    let mut f = vec![0x33, 0x33, 0, 0, 0, 1];
    f.extend_from_slice(&src);
    if let Some(v) = vlan {
        f.extend_from_slice(&0x8100u16.to_be_bytes());
        f.extend_from_slice(&v.to_be_bytes());
    }
    f.extend_from_slice(&0x86ddu16.to_be_bytes());
    f.extend_from_slice(&[0x60, 0, 0, 0]);
    f.extend_from_slice(&u16::try_from(chain.len()).unwrap().to_be_bytes());
    f.push(ext.first().map_or(proto, |e| e.0));
    f.push(255);
    let mut ll = [0u8; 16];
    ll[0] = 0xfe;
    ll[1] = 0x80;
    ll[8..11].copy_from_slice(&src[..3]);
    ll[13..].copy_from_slice(&src[3..]);
    f.extend_from_slice(&ll);
    let mut all_nodes = [0u8; 16];
    all_nodes[0] = 0xff;
    all_nodes[1] = 0x02;
    all_nodes[15] = 1;
    f.extend_from_slice(&all_nodes);
    f.extend(chain);
    f
}

fn udp_datagram(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut u = Vec::new();
    u.extend_from_slice(&sport.to_be_bytes());
    u.extend_from_slice(&dport.to_be_bytes());
    u.extend_from_slice(&u16::try_from(8 + payload.len()).unwrap().to_be_bytes());
    u.extend_from_slice(&[0, 0]);
    u.extend_from_slice(payload);
    u
}

/// A Client Identifier option (1) with `duid`.
fn client_id(duid: &[u8]) -> Vec<u8> {
    let mut o = vec![0, 1];
    o.extend_from_slice(&u16::try_from(duid.len()).unwrap().to_be_bytes());
    o.extend_from_slice(duid);
    o
}

/// DUID-LL (type 3) of Ethernet address `mac`.
fn duid_ll(mac: [u8; 6]) -> Vec<u8> {
    let mut d = vec![0, 3, 0, 1];
    d.extend_from_slice(&mac);
    d
}

/// DUID-LLT (type 1) of Ethernet address `mac`.
fn duid_llt(mac: [u8; 6]) -> Vec<u8> {
    let mut d = vec![0, 1, 0, 1, 0x2b, 0x3c, 0x4d, 0x5e];
    d.extend_from_slice(&mac);
    d
}

/// DUID-EN (type 2): enterprise number and an identifier, no MAC.
fn duid_en() -> Vec<u8> {
    vec![0, 2, 0, 0, 0x7f, 0xff, 0xde, 0xad, 0xbe, 0xef]
}

/// A DHCPv6 message of type `t` with `options` after the transaction id.
fn dhcp6(t: u8, options: &[Vec<u8>]) -> Vec<u8> {
    let mut m = vec![t, 0x5e, 0xed, 0x06];
    for o in options {
        m.extend_from_slice(o);
    }
    // Elapsed Time, as clients send it.
    m.extend_from_slice(&[0, 8, 0, 2, 0, 0]);
    m
}

/// A DHCPv6 client message of type `t` from `src` with a DUID-LL of
/// `duid_mac`, 546 → 547.
fn client6(t: u8, src: [u8; 6], duid_mac: [u8; 6], vlan: Option<u16>) -> Vec<u8> {
    let m = dhcp6(t, &[client_id(&duid_ll(duid_mac))]);
    v6(src, vlan, &[], IPPROTO_UDP, &udp_datagram(546, 547, &m))
}

/// A DHCPv6 server message of type `t`, `sport` → `dport`.
fn server6(t: u8, sport: u16, dport: u16, vlan: Option<u16>) -> Vec<u8> {
    let m = dhcp6(
        t,
        &[
            client_id(&duid_ll(VM_MAC)),
            // Server Identifier.
            [vec![0, 2, 0, 10], duid_ll(SERVER_MAC)].concat(),
        ],
    );
    v6(
        SERVER_MAC,
        vlan,
        &[],
        IPPROTO_UDP,
        &udp_datagram(sport, dport, &m),
    )
}

/// An ICMPv6 message of type `t` (a router advertisement: 134) with a
/// body of `body_len` zero bytes.
fn icmp6(t: u8, body_len: usize) -> Vec<u8> {
    let mut m = vec![t, 0, 0, 0];
    m.extend(std::iter::repeat_n(0, body_len));
    m
}

const ROUTER_ADVERT: u8 = 134;
const REDIRECT: u8 = 137;

/// A router advertisement (router lifetime 1800 s) behind `ext`.
fn ra(vlan: Option<u16>, ext: &[Ext]) -> Vec<u8> {
    let mut m = icmp6(ROUTER_ADVERT, 12);
    m[4] = 64;
    m[6..8].copy_from_slice(&1800u16.to_be_bytes());
    v6(SERVER_MAC, vlan, ext, IPPROTO_ICMPV6, &m)
}

#[tokio::test]
async fn dhcpv6_server_messages_from_an_untrusted_port_are_dropped_and_counted() {
    let (mut g, mut r) = load();
    g.set_policy(LO, &unlimited()).unwrap();
    let mut frames = Vec::new();
    for vlan in VLANS {
        for t in [ADVERTISE, REPLY, RECONFIGURE] {
            frames.push(server6(t, 547, 546, vlan));
        }
        // A relay's reply (547 → 547) and a server type sent from the
        // client port: both a server's, whatever the ports say.
        frames.push(server6(RELAY_REPL, 547, 547, vlan));
        frames.push(server6(ADVERTISE, 546, 547, vlan));
        frames.push(server6(REPLY, 40000, 547, vlan));
        // Anything to the client port.
        frames.push(server6(SOLICIT, 40000, 546, vlan));
    }
    for (i, f) in frames.iter().enumerate() {
        assert_eq!(ingress(&mut g, f), TC_ACT_SHOT, "frame {i}");
    }
    assert_eq!(
        counters(&g),
        GuardCounters {
            dropped_server_v6: frames.len() as u64,
            ..GuardCounters::default()
        }
    );
    assert!(r.try_recv().is_none());
}

#[tokio::test]
async fn a_trusted_port_passes_dhcpv6_server_messages_and_router_advertisements() {
    let (mut g, _r) = load();
    g.set_policy(
        LO,
        &PortPolicy {
            trusted: true,
            ..unlimited()
        },
    )
    .unwrap();
    let frames = [
        server6(ADVERTISE, 547, 546, None),
        server6(REPLY, 547, 546, Some(100)),
        server6(RECONFIGURE, 547, 546, None),
        ra(None, &[]),
        v6(SERVER_MAC, None, &[], IPPROTO_ICMPV6, &icmp6(REDIRECT, 36)),
    ];
    for (i, f) in frames.iter().enumerate() {
        assert_eq!(ingress(&mut g, f), TC_ACT_UNSPEC, "frame {i}");
    }
    assert_eq!(
        counters(&g),
        GuardCounters {
            passed_trusted_v6: frames.len() as u64,
            ..GuardCounters::default()
        }
    );
}

#[tokio::test]
async fn router_advertisements_and_redirects_are_dropped_behind_any_extension_headers() {
    let (mut g, _r) = load();
    g.set_policy(LO, &unlimited()).unwrap();
    let redirect = |ext: &[Ext]| v6(SERVER_MAC, None, ext, IPPROTO_ICMPV6, &icmp6(REDIRECT, 36));
    let chains: Vec<Vec<Ext>> = vec![
        vec![],
        // RFC 7113 §2: hop-by-hop, then destination options.
        vec![hop_by_hop(), dest_opts(0)],
        vec![hop_by_hop(), dest_opts(3), routing()],
        // Long options (a 2 KiB chain would be past the guard's bound).
        vec![dest_opts(100)],
        // Six extension headers: the most the guard walks.
        vec![
            hop_by_hop(),
            dest_opts(0),
            routing(),
            dest_opts(1),
            dest_opts(0),
            dest_opts(2),
        ],
    ];
    let mut n = 0;
    for ext in &chains {
        for vlan in VLANS {
            assert_eq!(ingress(&mut g, &ra(vlan, ext)), TC_ACT_SHOT, "{ext:?}");
            n += 1;
        }
        assert_eq!(ingress(&mut g, &redirect(ext)), TC_ACT_SHOT, "{ext:?}");
    }
    let c = counters(&g);
    assert_eq!(
        (c.dropped_router_advertisement, c.dropped_redirect),
        (n, chains.len() as u64)
    );
    // Seven: the guard cannot see what they carry, and drops it whatever
    // it is (an echo request too).
    let seven = vec![dest_opts(0); 7];
    assert_eq!(ingress(&mut g, &ra(None, &seven)), TC_ACT_SHOT);
    let echo = v6(VM_MAC, None, &seven, IPPROTO_ICMPV6, &icmp6(128, 8));
    assert_eq!(ingress(&mut g, &echo), TC_ACT_SHOT);
    assert_eq!(counters(&g).dropped_unclassified_v6, 2);
    // Behind stacked VLAN tags (more than the guard parses) as well.
    let stacked = with_tags(&ra(None, &[])[..], &[0x88a8, 0x8100]);
    assert_eq!(ingress(&mut g, &stacked), TC_ACT_SHOT);
    assert_eq!(counters(&g).dropped_unclassified_v6, 3);
    // An echo request behind the six passes.
    let echo6 = v6(VM_MAC, None, &chains[4], IPPROTO_ICMPV6, &icmp6(128, 8));
    assert_eq!(ingress(&mut g, &echo6), TC_ACT_UNSPEC);
}

/// `f` cut to its first `len` bytes, its IPv6 payload length fixed to
/// match (the first fragment of a larger datagram).
fn first_fragment(mut f: Vec<u8>, len: usize) -> Vec<u8> {
    f.truncate(len);
    let plen = u16::try_from(len - 14 - 40).unwrap();
    f[18..20].copy_from_slice(&plen.to_be_bytes());
    f
}

#[tokio::test]
async fn fragmented_router_advertisements_are_dropped_later_fragments_pass() {
    let (mut g, _r) = load();
    g.set_policy(LO, &unlimited()).unwrap();
    // The first fragment holds the ICMPv6 header: seen, dropped.
    for ext in [
        vec![fragment(0, true)],
        vec![hop_by_hop(), fragment(0, true), dest_opts(0)],
        // An atomic fragment (RFC 6946): offset 0, no more.
        vec![fragment(0, false)],
    ] {
        assert_eq!(ingress(&mut g, &ra(None, &ext)), TC_ACT_SHOT, "{ext:?}");
    }
    assert_eq!(counters(&g).dropped_router_advertisement, 3);
    // RFC 7113 §3: the first fragment ends inside a long destination
    // options header, the RA comes in the second. The guard cannot see it
    // and drops the first (RFC 7112 forbids such a first fragment).
    let whole = ra(None, &[hop_by_hop(), fragment(0, true), dest_opts(200)]);
    assert!(whole.len() > 1200);
    let first = first_fragment(whole, 14 + 40 + 8 + 8 + 1000);
    assert_eq!(ingress(&mut g, &first), TC_ACT_SHOT);
    assert_eq!(counters(&g).dropped_unclassified_v6, 1);
    // A later fragment has no upper-layer header: it passes, whatever its
    // bytes look like (nothing reassembles it without the first).
    let later = v6(
        SERVER_MAC,
        None,
        &[fragment(126, false)],
        IPPROTO_ICMPV6,
        &icmp6(ROUTER_ADVERT, 12),
    );
    assert_eq!(ingress(&mut g, &later), TC_ACT_UNSPEC);
    // A DHCPv6 ADVERTISE in a first fragment is a server message.
    let m = dhcp6(ADVERTISE, &[client_id(&duid_ll(VM_MAC))]);
    let advertise = v6(
        SERVER_MAC,
        None,
        &[fragment(0, true)],
        IPPROTO_UDP,
        &udp_datagram(547, 546, &m),
    );
    assert_eq!(ingress(&mut g, &advertise), TC_ACT_SHOT);
    let c = counters(&g);
    assert_eq!(
        (c.dropped_server_v6, c.dropped_unclassified_v6),
        (1, 1),
        "{c:?}"
    );
}

#[tokio::test]
async fn dhcpv6_client_messages_pass_within_the_ports_bucket() {
    let (mut g, _r) = load();
    g.set_policy(LO, &unlimited()).unwrap();
    let types = [
        SOLICIT,
        REQUEST,
        4, // CONFIRM
        RENEW,
        6, // REBIND
        RELEASE,
        DECLINE,
        INFORMATION_REQUEST,
    ];
    for t in types {
        for vlan in VLANS {
            let f = client6(t, VM_MAC, VM_MAC, vlan);
            assert_eq!(ingress(&mut g, &f), TC_ACT_UNSPEC, "type {t}");
        }
    }
    // Behind a hop-by-hop header too.
    let m = dhcp6(SOLICIT, &[client_id(&duid_ll(VM_MAC))]);
    let hbh = v6(
        VM_MAC,
        None,
        &[hop_by_hop()],
        IPPROTO_UDP,
        &udp_datagram(546, 547, &m),
    );
    assert_eq!(ingress(&mut g, &hbh), TC_ACT_UNSPEC);
    assert_eq!(
        counters(&g),
        GuardCounters {
            passed_client_v6: 2 * types.len() as u64 + 1,
            ..GuardCounters::default()
        }
    );

    // One message a second, three back to back: exactly the burst passes.
    g.set_policy(
        LO,
        &PortPolicy {
            rate: 1,
            burst: 3,
            ..PortPolicy::default()
        },
    )
    .unwrap();
    let solicit = client6(SOLICIT, VM_MAC, VM_MAC, None);
    let verdicts: Vec<u32> = (0..8).map(|_| ingress(&mut g, &solicit)).collect();
    assert_eq!(
        verdicts,
        [
            TC_ACT_UNSPEC,
            TC_ACT_UNSPEC,
            TC_ACT_UNSPEC,
            TC_ACT_SHOT,
            TC_ACT_SHOT,
            TC_ACT_SHOT,
            TC_ACT_SHOT,
            TC_ACT_SHOT
        ]
    );
    assert_eq!(counters(&g).dropped_rate_v6, 5);
    // The bucket is the port's, for both families: DHCPv4 finds it empty.
    let discover = Dhcp::client(MessageType::Discover).frame();
    assert_eq!(ingress(&mut g, &discover), TC_ACT_SHOT);
    assert_eq!(counters(&g).dropped_rate, 1);
    // A new policy, a full bucket, and DHCPv4 spends it for DHCPv6.
    g.set_policy(
        LO,
        &PortPolicy {
            rate: 1,
            burst: 1,
            ..PortPolicy::default()
        },
    )
    .unwrap();
    assert_eq!(ingress(&mut g, &discover), TC_ACT_UNSPEC);
    assert_eq!(ingress(&mut g, &solicit), TC_ACT_SHOT);
    assert_eq!(counters(&g).dropped_rate_v6, 6);
    // Server messages and RAs never take a token.
    let c = counters(&g);
    assert_eq!(
        (c.dropped_server_v6, c.dropped_router_advertisement),
        (0, 0)
    );
}

#[tokio::test]
async fn single_client_ports_drop_dhcpv6_in_another_clients_name() {
    let (mut g, _r) = load();
    set_vm_port(&mut g, false);
    let with = |options: &[Vec<u8>]| {
        v6(
            VM_MAC,
            None,
            &[],
            IPPROTO_UDP,
            &udp_datagram(546, 547, &dhcp6(SOLICIT, options)),
        )
    };
    // Its own MAC, in the Ethernet source and the DUID: passes; a DUID
    // without a MAC (DUID-EN) or none at all too (the Ethernet source is
    // checked).
    for (i, f) in [
        client6(SOLICIT, VM_MAC, VM_MAC, None),
        client6(RELEASE, VM_MAC, VM_MAC, Some(100)),
        with(&[client_id(&duid_llt(VM_MAC))]),
        with(&[client_id(&duid_en())]),
        with(&[]),
        // A DUID-LL of another hardware type (6, IEEE 802) names no
        // Ethernet address.
        with(&[client_id(&[0, 3, 0, 6, 1, 2, 3, 4, 5, 6])]),
    ]
    .iter()
    .enumerate()
    {
        assert_eq!(ingress(&mut g, f), TC_ACT_UNSPEC, "frame {i}");
    }
    assert_eq!(counters(&g).passed_client_v6, 6);
    // Another Ethernet source, or a neighbour's DUID-LL or DUID-LLT: spoof.
    for (i, f) in [
        client6(SOLICIT, OTHER_MAC, VM_MAC, None),
        client6(RELEASE, VM_MAC, OTHER_MAC, None),
        client6(DECLINE, VM_MAC, OTHER_MAC, Some(100)),
        with(&[client_id(&duid_llt(OTHER_MAC))]),
        // Behind other options.
        with(&[vec![0, 6, 0, 2, 0, 23], client_id(&duid_ll(OTHER_MAC))]),
    ]
    .iter()
    .enumerate()
    {
        assert_eq!(ingress(&mut g, f), TC_ACT_SHOT, "frame {i}");
    }
    assert_eq!(counters(&g).dropped_spoof_v6, 5);
    // Two Client Identifiers (a server may read either), or a message cut
    // inside its options: the guard cannot tell whose, and drops it.
    for (i, f) in [
        with(&[client_id(&duid_ll(VM_MAC)), client_id(&duid_ll(OTHER_MAC))]),
        with(&[client_id(&duid_en()), client_id(&duid_ll(VM_MAC))]),
        {
            let f = client6(SOLICIT, VM_MAC, VM_MAC, None);
            f[..f.len() - 10].to_vec()
        },
    ]
    .iter()
    .enumerate()
    {
        assert_eq!(ingress(&mut g, f), TC_ACT_SHOT, "frame {i}");
    }
    let c = counters(&g);
    assert_eq!(
        (c.dropped_unclassified_v6, c.passed_client_v6),
        (3, 6),
        "{c:?}"
    );
    // A port that is not single-client does not compare.
    g.set_policy(LO, &unlimited()).unwrap();
    let other = client6(SOLICIT, OTHER_MAC, OTHER_MAC, None);
    assert_eq!(ingress(&mut g, &other), TC_ACT_UNSPEC);
}

#[tokio::test]
async fn ordinary_ipv6_traffic_passes_uncounted() {
    let (mut g, mut r) = load();
    g.set_policy(
        LO,
        &PortPolicy {
            single_client: Some(VM_MAC),
            learn: true,
            rate: 1,
            burst: 1,
            ..PortPolicy::default()
        },
    )
    .unwrap();
    let tcp = {
        let mut t = vec![0u8; 20];
        t[..4].copy_from_slice(&[0x9c, 0x40, 0, 80]);
        t[12] = 0x50;
        t
    };
    let frames = [
        v6(VM_MAC, None, &[], IPPROTO_TCP, &tcp),
        v6(VM_MAC, Some(100), &[], IPPROTO_TCP, &tcp),
        v6(
            VM_MAC,
            None,
            &[],
            IPPROTO_UDP,
            &udp_datagram(5353, 53, b"q"),
        ),
        // The DHCPv6 ports' neighbours, and a client port's datagram to
        // something other than a server.
        v6(
            VM_MAC,
            None,
            &[],
            IPPROTO_UDP,
            &udp_datagram(545, 548, b"x"),
        ),
        v6(
            VM_MAC,
            None,
            &[],
            IPPROTO_UDP,
            &udp_datagram(546, 5000, b"x"),
        ),
        // Neighbour solicitation and advertisement, router solicitation,
        // echo request, MLDv2 report behind hop-by-hop.
        v6(VM_MAC, None, &[], IPPROTO_ICMPV6, &icmp6(135, 20)),
        v6(VM_MAC, None, &[], IPPROTO_ICMPV6, &icmp6(136, 20)),
        v6(VM_MAC, None, &[], IPPROTO_ICMPV6, &icmp6(133, 4)),
        v6(VM_MAC, None, &[], IPPROTO_ICMPV6, &icmp6(128, 8)),
        v6(
            VM_MAC,
            None,
            &[hop_by_hop()],
            IPPROTO_ICMPV6,
            &icmp6(143, 4),
        ),
        // TCP behind a fragment header, and a later fragment.
        v6(VM_MAC, None, &[fragment(0, true)], IPPROTO_TCP, &tcp),
        v6(
            VM_MAC,
            None,
            &[fragment(3, false)],
            IPPROTO_UDP,
            b"anything",
        ),
        // ESP: encrypted, nothing to read.
        v6(VM_MAC, None, &[], 50, &[0; 24]),
    ];
    for (i, f) in frames.iter().enumerate() {
        // Twice: nothing takes a token.
        assert_eq!(ingress(&mut g, f), TC_ACT_UNSPEC, "frame {i}");
        assert_eq!(ingress(&mut g, f), TC_ACT_UNSPEC, "frame {i}");
    }
    assert_eq!(counters(&g), GuardCounters::default());
    assert!(r.try_recv().is_none(), "nothing learned from IPv6");
}

/// A learning port copies the guest's DHCPv6 client messages that learning
/// reads (SOLICIT, REQUEST, RENEW, REBIND, RELEASE, DECLINE) as they pass,
/// and the REPLYs sent to the VM's MAC, each record marked as DHCPv6 with
/// the frame's IPv6 addresses; CONFIRM and INFORMATION-REQUEST, an
/// ADVERTISE (counted as unused), a REPLY to another MAC and anything on a
/// port that does not learn are not copied.
#[tokio::test]
async fn learning_ports_record_the_guests_dhcpv6_both_ways() {
    for vlan in VLANS {
        let (mut g, mut r) = load();
        set_vm_port(&mut g, true);
        for t in [SOLICIT, REQUEST, RENEW, 6, RELEASE, DECLINE] {
            let f = client6(t, VM_MAC, VM_MAC, vlan);
            assert_eq!(ingress(&mut g, &f), TC_ACT_UNSPEC, "type {t}");
            let ev = r
                .try_recv()
                .unwrap_or_else(|| panic!("type {t}, {vlan:?}: the client message"));
            assert_eq!(ev.direction, Direction::FromWorkload);
            assert_eq!(ev.ifindex, LO);
            assert_eq!(ev.headers.vlan, vlan);
            assert!(
                matches!(ev.headers.src_ip, std::net::IpAddr::V6(a) if a.is_unicast_link_local()),
                "{:?}",
                ev.headers
            );
            assert_eq!(ev.payload, dhcp6(t, &[client_id(&duid_ll(VM_MAC))]));
        }
        for t in [4, INFORMATION_REQUEST] {
            assert_eq!(
                ingress(&mut g, &client6(t, VM_MAC, VM_MAC, vlan)),
                TC_ACT_UNSPEC
            );
        }
        assert!(
            r.try_recv().is_none(),
            "{vlan:?}: CONFIRM, INFORMATION-REQUEST"
        );

        // The server's REPLY to the VM's MAC (a unicast to its link-local
        // address).
        let to_vm = |mut f: Vec<u8>| {
            f[..6].copy_from_slice(&VM_MAC);
            f
        };
        let reply = to_vm(server6(REPLY, 547, 546, vlan));
        assert_eq!(egress(&mut g, &reply), TC_ACT_UNSPEC);
        let ev = r.try_recv().expect("the REPLY");
        assert_eq!(ev.direction, Direction::ToWorkload);
        assert_eq!(ev.headers.src_mac, SERVER_MAC);
        assert_eq!((ev.headers.src_port, ev.headers.dst_port), (547, 546));
        assert_eq!(ev.payload[0], REPLY);
        // An ADVERTISE teaches nothing; a REPLY to another MAC is not the
        // guest's.
        let before = g.learn_counters().unwrap().unused;
        assert_eq!(
            egress(&mut g, &to_vm(server6(ADVERTISE, 547, 546, vlan))),
            TC_ACT_UNSPEC
        );
        assert_eq!(g.learn_counters().unwrap().unused, before + 1);
        assert_eq!(
            egress(&mut g, &server6(REPLY, 547, 546, vlan)),
            TC_ACT_UNSPEC
        );
        assert!(r.try_recv().is_none(), "{vlan:?}");
        assert_eq!(counters(&g).learned, 7);

        set_vm_port(&mut g, false);
        assert_eq!(
            ingress(&mut g, &client6(REQUEST, VM_MAC, VM_MAC, vlan)),
            TC_ACT_UNSPEC
        );
        assert_eq!(egress(&mut g, &reply), TC_ACT_UNSPEC);
        assert!(r.try_recv().is_none(), "{vlan:?}: learning off");
    }
}

/// A neighbour solicitation for `target` from `src` (its Ethernet
/// source): from `::` to the target's solicited-node address when `dad`,
/// else from `src`'s link-local address (address resolution).
fn solicitation(src: [u8; 6], vlan: Option<u16>, target: std::net::Ipv6Addr, dad: bool) -> Vec<u8> {
    let mut body = icmp6(135, 20);
    body[8..24].copy_from_slice(&target.octets());
    let mut f = v6(src, vlan, &[], IPPROTO_ICMPV6, &body);
    let l3 = if vlan.is_some() { 18 } else { 14 };
    let t = target.octets();
    let solicited = std::net::Ipv6Addr::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | u16::from(t[13]),
        u16::from_be_bytes([t[14], t[15]]),
    );
    f[l3 + 24..l3 + 40].copy_from_slice(&solicited.octets());
    f[..6].copy_from_slice(&[0x33, 0x33, 0xff, t[13], t[14], t[15]]);
    if dad {
        f[l3 + 8..l3 + 24].fill(0);
    }
    f
}

/// A learning port copies the guest's duplicate address detection probes
/// (neighbour solicitations from `::`, from the VM's MAC) with their
/// target; address resolution, a probe from another MAC and a port that
/// does not learn copy nothing; every solicitation passes.
#[tokio::test]
async fn learning_ports_record_the_guests_duplicate_address_detection() {
    let target: std::net::Ipv6Addr = "fd00:6::5054:ff:fe00:3001".parse().unwrap();
    for vlan in VLANS {
        let (mut g, mut r) = load();
        set_vm_port(&mut g, true);
        let probe = solicitation(VM_MAC, vlan, target, true);
        assert_eq!(ingress(&mut g, &probe), TC_ACT_UNSPEC);
        let ev = r.try_recv().expect("the probe");
        assert_eq!(ev.carried, Carried::Dad6);
        assert_eq!(ev.direction, Direction::FromWorkload);
        assert_eq!((ev.ifindex, ev.headers.vlan), (LO, vlan));
        assert_eq!(ev.payload, target.octets());
        assert_eq!(
            g.test_run(GuardProgram::Xdp, &probe, LO).unwrap(),
            2,
            "XDP passes it"
        );
        assert_eq!(
            r.try_recv().expect("the XDP twin's copy").payload,
            target.octets()
        );

        for (what, f) in [
            ("resolution", solicitation(VM_MAC, vlan, target, false)),
            ("another MAC", solicitation(OTHER_MAC, vlan, target, true)),
        ] {
            assert_eq!(ingress(&mut g, &f), TC_ACT_UNSPEC, "{what}");
            assert!(r.try_recv().is_none(), "{vlan:?}: {what}");
        }
        set_vm_port(&mut g, false);
        assert_eq!(ingress(&mut g, &probe), TC_ACT_UNSPEC);
        assert!(r.try_recv().is_none(), "{vlan:?}: learning off");
        assert_eq!(counters(&g).learned, 2);
    }
}
