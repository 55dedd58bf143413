//! Transport integration tests in network namespaces: the raw-socket sender,
//! the AF_PACKET receiver with its classic BPF filter, netlink configuration
//! and link watching, against real dnsmasq and Kea servers.

use std::net::Ipv4Addr;
use std::time::Duration;

use dhcproto::v4::{self, DhcpOption, Flags, MessageType, OptionCode};
use dhcproto::{Decodable, Encodable};
use xdhcp::datapath::frame::{self, FrameHeaders};
use xdhcp::datapath::rawsock::{self, BROADCAST_MAC, LinkRemovalWatch, RawSender, RawSockError};
use xdhcp::datapath::{RxFrame, RxPath, afpacket::AfPacketReceiver};
use xdhcp::netlink::{Ipv4Route, Netlink, NetlinkError};
use xdhcp_engine::{Destination, MessageKind, Transmit};
use xdhcp_tests::{Dnsmasq, DnsmasqConfig, Kea, KeaConfig, Lab};

const RECV_TIMEOUT: Duration = Duration::from_secs(10);

fn request_base(xid: u32, mac: [u8; 6], broadcast: bool, kind: MessageType) -> v4::Message {
    let z = Ipv4Addr::UNSPECIFIED;
    let mut msg = v4::Message::new_with_id(xid, z, z, z, z, &mac);
    if broadcast {
        msg.set_flags(Flags::default().set_broadcast());
    }
    msg.opts_mut().insert(DhcpOption::MessageType(kind));
    msg.opts_mut().insert(DhcpOption::ParameterRequestList(vec![
        OptionCode::SubnetMask,
        OptionCode::Router,
        OptionCode::DomainNameServer,
    ]));
    msg
}

fn discover(xid: u32, mac: [u8; 6], broadcast: bool) -> Vec<u8> {
    request_base(xid, mac, broadcast, MessageType::Discover)
        .to_vec()
        .expect("encode DISCOVER")
}

fn request(xid: u32, mac: [u8; 6], server: Ipv4Addr, addr: Ipv4Addr) -> Vec<u8> {
    let mut msg = request_base(xid, mac, false, MessageType::Request);
    msg.opts_mut().insert(DhcpOption::ServerIdentifier(server));
    msg.opts_mut().insert(DhcpOption::RequestedIpAddress(addr));
    msg.to_vec().expect("encode REQUEST")
}

fn release(xid: u32, mac: [u8; 6], server: Ipv4Addr, addr: Ipv4Addr) -> Vec<u8> {
    let z = Ipv4Addr::UNSPECIFIED;
    // RFC 2131 §4.4.6: ciaddr = the leased address, unicast to the server.
    let mut msg = v4::Message::new_with_id(xid, addr, z, z, z, &mac);
    msg.opts_mut()
        .insert(DhcpOption::MessageType(MessageType::Release));
    msg.opts_mut().insert(DhcpOption::ServerIdentifier(server));
    msg.to_vec().expect("encode RELEASE")
}

/// Sends a DISCOVER for `mac` (with the broadcast flag when `broadcast`)
/// to the broadcast address.
fn send_discover(
    tx: &RawSender,
    xid: u32,
    mac: [u8; 6],
    broadcast: bool,
) -> Result<(), RawSockError> {
    tx.send_transmit(&broadcast_transmit(
        discover(xid, mac, broadcast),
        xid,
        MessageKind::Discover,
    ))
}

fn broadcast_transmit(payload: Vec<u8>, xid: u32, kind: MessageKind) -> Transmit {
    Transmit {
        payload,
        xid,
        src_ip: Ipv4Addr::UNSPECIFIED,
        dst: Destination::Broadcast,
        kind,
    }
}

/// Receives until a reply with `xid` and message type `want` arrives.
async fn recv_reply(rx: &AfPacketReceiver, xid: u32, want: MessageType) -> (RxFrame, v4::Message) {
    let deadline = tokio::time::Instant::now() + RECV_TIMEOUT;
    loop {
        let frame = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("no {want:?} for xid {xid:#x} within {RECV_TIMEOUT:?}"))
            .expect("receive");
        let Ok(msg) = v4::Message::from_bytes(&frame.payload) else {
            continue;
        };
        if msg.xid() == xid && msg.opts().msg_type() == Some(want) {
            return (frame, msg);
        }
    }
}

fn server_id(msg: &v4::Message) -> Ipv4Addr {
    match msg.opts().get(OptionCode::ServerIdentifier) {
        Some(DhcpOption::ServerIdentifier(ip)) => *ip,
        other => panic!("reply without server identifier: {other:?}"),
    }
}

#[tokio::test]
async fn discover_via_rawsock_gets_offer_via_afpacket_from_dnsmasq() {
    let lab = Lab::with_clients(1);
    let dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    let c = &lab.clients[0];

    let tx = RawSender::open_async(c.ns.path(), &c.ifname)
        .await
        .expect("open sender");
    assert_eq!(tx.info().ifindex, c.ifindex);
    assert_eq!(tx.info().mac, c.mac);
    assert_eq!(tx.info().mtu, 1500);
    let rx = AfPacketReceiver::open_async(c.ns.path(), &c.ifname)
        .await
        .expect("open receiver");

    let xid = 0x0bad_cafe;
    send_discover(&tx, xid, c.mac, true).expect("send DISCOVER");
    let (frame, offer) = recv_reply(&rx, xid, MessageType::Offer).await;

    assert_eq!(frame.via, RxPath::AfPacket);
    assert_eq!(frame.ifindex, c.ifindex);
    assert!(frame.ts_ns > 0);
    assert_eq!((frame.headers.src_port, frame.headers.dst_port), (67, 68));
    assert_eq!(frame.headers.src_ip, lab.server_ip);
    assert_eq!(frame.headers.src_mac, lab.server_mac());
    assert_eq!(frame.headers.vlan, None);
    assert_eq!(offer.chaddr()[..6], c.mac);
    let (lo, hi) = dnsmasq.config().range;
    assert!(
        (lo..=hi).contains(&offer.yiaddr()),
        "offered {} outside {lo}-{hi}",
        offer.yiaddr()
    );
    assert_eq!(server_id(&offer), lab.server_ip);
    assert!(
        dnsmasq
            .log()
            .contains(&format!("DHCPDISCOVER({})", Lab::BRIDGE))
    );
    assert_eq!(rx.stats().bad_frames, 0);
    assert!(rx.stats().received >= 1);
}

/// dnsmasq broadcasts its replies to a client that sets the broadcast flag,
/// so every port of the segment sees them. A receiver narrowed to one
/// client's `chaddr` must take that client's replies and no one else's.
#[tokio::test]
async fn a_receiver_narrowed_to_its_client_ignores_other_clients_broadcast_replies() {
    let lab = Lab::with_clients(2);
    let _dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    let (a, b) = (&lab.clients[0], &lab.clients[1]);
    let narrowed = AfPacketReceiver::open_async(a.ns.path(), &a.ifname)
        .await
        .unwrap();
    narrowed.only_for(a.mac).unwrap();
    // The control: an unrestricted receiver on the same interface.
    let everything = AfPacketReceiver::open_async(a.ns.path(), &a.ifname)
        .await
        .unwrap();

    // B's OFFER, broadcast: it reaches A's interface...
    let tx_b = RawSender::open_async(b.ns.path(), &b.ifname).await.unwrap();
    let xid_b = 0x0b0b_0b0b;
    send_discover(&tx_b, xid_b, b.mac, true).unwrap();
    let (frame, offer) = recv_reply(&everything, xid_b, MessageType::Offer).await;
    assert_eq!(frame.headers.dst_mac, BROADCAST_MAC);
    assert_eq!(offer.chaddr()[..6], b.mac);
    // ...and not A's narrowed receiver (the frame was queued on both
    // sockets at once, so it would be there by now).
    assert!(
        narrowed.try_recv().unwrap().is_none(),
        "a reply for another client got through"
    );

    // A's own OFFER does.
    let tx_a = RawSender::open_async(a.ns.path(), &a.ifname).await.unwrap();
    let xid_a = 0x0a0a_0a0a;
    send_discover(&tx_a, xid_a, a.mac, true).unwrap();
    let (_, offer) = recv_reply(&narrowed, xid_a, MessageType::Offer).await;
    assert_eq!(offer.chaddr()[..6], a.mac);
    assert_eq!(narrowed.stats().received, 1, "only A's reply was delivered");
}

#[tokio::test]
async fn kea_offer_reaches_afpacket_receiver() {
    let lab = Lab::with_clients(1);
    let _kea = Kea::start(&lab.server, KeaConfig::default());
    let c = &lab.clients[0];
    let tx = RawSender::open_async(c.ns.path(), &c.ifname).await.unwrap();
    let rx = AfPacketReceiver::open_async(c.ns.path(), &c.ifname)
        .await
        .unwrap();
    let xid = 0x1357_9bdf;
    send_discover(&tx, xid, c.mac, false).unwrap();
    let (_, offer) = recv_reply(&rx, xid, MessageType::Offer).await;
    assert_eq!(server_id(&offer), lab.server_ip);
    assert!(offer.yiaddr().octets()[3] >= 100, "{}", offer.yiaddr());
}

/// DORA by hand, then a RELEASE that must leave as unicast from the leased
/// address to the server's MAC (dnsmasq ignores a RELEASE from 0.0.0.0) — checked on the wire by a packet
/// socket on the server side and by dnsmasq forgetting the lease.
#[tokio::test]
async fn unicast_release_leaves_from_the_leased_address_and_dnsmasq_honours_it() {
    let lab = Lab::with_clients(1);
    let dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    let c = &lab.clients[0];
    let tx = RawSender::open_async(c.ns.path(), &c.ifname).await.unwrap();
    let rx = AfPacketReceiver::open_async(c.ns.path(), &c.ifname)
        .await
        .unwrap();

    // Unicast replies (no broadcast flag): dnsmasq sends them to chaddr/yiaddr.
    let xid = 0x2468_ace0;
    send_discover(&tx, xid, c.mac, false).unwrap();
    let (_, offer) = recv_reply(&rx, xid, MessageType::Offer).await;
    let (addr, server) = (offer.yiaddr(), server_id(&offer));
    tx.send_transmit(&broadcast_transmit(
        request(xid, c.mac, server, addr),
        xid,
        MessageKind::Request,
    ))
    .unwrap();
    let (ack_frame, ack) = recv_reply(&rx, xid, MessageType::Ack).await;
    assert_eq!(ack.yiaddr(), addr);
    assert_eq!(
        ack_frame.headers.dst_mac, c.mac,
        "dnsmasq unicasts without the broadcast flag"
    );
    assert!(
        xdhcp_tests::wait_until(Duration::from_secs(5), || dnsmasq
            .lease_for(c.mac)
            .is_some()),
        "lease not in dnsmasq's file: {:?}",
        dnsmasq.leases()
    );

    // Server-side wire check: a plain packet socket on the bridge port.
    let port = c.port().to_owned();
    let capture = lab
        .server
        .run_in(move || ServerCapture::open(&port))
        .expect("server-side capture socket");

    let rel_xid = 0x2468_ace1;
    let server_mac = ack_frame.headers.src_mac;
    tx.send_transmit(&Transmit {
        payload: release(rel_xid, c.mac, server, addr),
        xid: rel_xid,
        src_ip: addr,
        dst: Destination::Unicast {
            ip: server,
            mac: Some(server_mac),
        },
        kind: MessageKind::Release,
    })
    .unwrap();

    let (headers, payload) = capture
        .wait_for(|h, p| {
            h.dst_port == 67 && v4::Message::from_bytes(p).is_ok_and(|m| m.xid() == rel_xid)
        })
        .expect("RELEASE seen on the server side");
    assert_eq!(
        headers.src_ip, addr,
        "RELEASE must come from the leased address"
    );
    assert_eq!(headers.dst_ip, server);
    assert_eq!(headers.dst_mac, server_mac, "RELEASE must be unicast at L2");
    assert_eq!(headers.dst_mac, lab.server_mac());
    assert_eq!(headers.src_mac, c.mac);
    assert_eq!((headers.src_port, headers.dst_port), (68, 67));
    let msg = v4::Message::from_bytes(&payload).unwrap();
    assert_eq!(msg.opts().msg_type(), Some(MessageType::Release));
    assert_eq!(msg.ciaddr(), addr);

    assert!(
        dnsmasq.wait_for_log(
            &format!("DHCPRELEASE({}) {addr}", Lab::BRIDGE),
            Duration::from_secs(5)
        ),
        "dnsmasq did not log the RELEASE:\n{}",
        dnsmasq.log()
    );
    assert!(
        xdhcp_tests::wait_until(Duration::from_secs(5), || dnsmasq
            .lease_for(c.mac)
            .is_none()),
        "lease still in dnsmasq's file after RELEASE: {:?}",
        dnsmasq.leases()
    );
}

#[tokio::test]
async fn filter_drops_non_dhcp_in_kernel_and_stripped_vlan_is_recovered() {
    let lab = Lab::with_clients(1);
    let c = &lab.clients[0];
    let rx = AfPacketReceiver::open_async(c.ns.path(), &c.ifname)
        .await
        .unwrap();
    // Inject from the server side onto the bridge.
    let tx = RawSender::open_async(lab.server.path(), Lab::BRIDGE)
        .await
        .unwrap();
    let headers = |vlan: Option<u16>, src_port: u16, dst_port: u16| FrameHeaders {
        src_mac: tx.info().mac,
        dst_mac: BROADCAST_MAC,
        vlan,
        src_ip: lab.server_ip,
        dst_ip: Ipv4Addr::BROADCAST,
        src_port,
        dst_port,
    };
    // Not for us: DNS, client→server, and a fragment of a DHCP reply.
    tx.send(&headers(None, 53, 68), b"dns").unwrap();
    tx.send(&headers(None, 68, 67), b"request").unwrap();
    let mut frag = frame::build_udp_frame(&headers(None, 67, 68), b"fragment");
    frag[20..22].copy_from_slice(&0x2000u16.to_be_bytes()); // MF
    tx.send_frame(&frag).unwrap();
    // For us: a tagged reply, then an untagged one.
    tx.send(&headers(Some(5), 67, 68), b"tagged").unwrap();
    tx.send(&headers(None, 67, 68), b"plain").unwrap();

    let first = tokio::time::timeout(RECV_TIMEOUT, rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.payload, b"tagged");
    assert_eq!(
        first.headers.vlan,
        Some(5),
        "VLAN id from the frame or PACKET_AUXDATA"
    );
    let second = tokio::time::timeout(RECV_TIMEOUT, rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(second.payload, b"plain");
    assert_eq!(second.headers.vlan, None);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        rx.try_recv().unwrap().is_none(),
        "nothing else may pass the filter"
    );
    let stats = rx.stats();
    assert_eq!(stats.received, 2);
    assert_eq!(
        stats.bad_frames, 0,
        "non-DHCP frames must be dropped by the kernel filter"
    );
}

#[tokio::test]
async fn oversized_payload_is_a_typed_error() {
    let lab = Lab::with_clients(1);
    let c = &lab.clients[0];
    let tx = RawSender::open_async(c.ns.path(), &c.ifname).await.unwrap();
    let t = broadcast_transmit(vec![0; 1500], 1, MessageKind::Discover);
    let err = tx.send_transmit(&t).unwrap_err();
    assert!(
        matches!(err, RawSockError::TooLarge { mtu: 1500, .. }),
        "{err:?}"
    );
}

#[tokio::test]
async fn interface_deletion_surfaces_as_interface_gone() {
    let lab = Lab::with_clients(1);
    let c = &lab.clients[0];
    let tx = RawSender::open_async(c.ns.path(), &c.ifname).await.unwrap();
    let rx = AfPacketReceiver::open_async(c.ns.path(), &c.ifname)
        .await
        .unwrap();
    // The removal watch each lease holds, opened in the pod namespace and
    // registered with this runtime.
    let runtime = tokio::runtime::Handle::current();
    let watch = c.ns.run_in(move || {
        let _entered = runtime.enter();
        LinkRemovalWatch::open_here().expect("subscribe to link notifications")
    });

    // Deleting the bridge-side end removes the pod-side end too.
    lab.server.link_del(c.port());

    tokio::time::timeout(Duration::from_secs(5), watch.removed(c.ifindex, Some(&tx)))
        .await
        .expect("RTM_DELLINK within 5 s")
        .expect("link watch");
    let err = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("receiver must wake up when its interface goes")
        .unwrap_err();
    assert!(err.is_interface_gone(), "receive: {err:?}");
    let err = send_discover(&tx, 7, c.mac, true).unwrap_err();
    assert!(err.is_interface_gone(), "send: {err:?}");
    assert!(err.to_string().contains(&c.ifname), "{err}");
    let err = RawSender::open_async(c.ns.path(), &c.ifname)
        .await
        .unwrap_err();
    assert!(err.is_interface_gone(), "reopen: {err:?}");
    let err = rawsock::link_info_async(c.ns.path(), &c.ifname)
        .await
        .unwrap_err();
    assert!(err.is_interface_gone(), "lookup: {err:?}");
    // The sender's binding is gone too: what the watch falls back on when
    // notifications were lost.
    assert!(
        !tx.is_bound(),
        "the kernel unbinds a packet socket from a deleted link"
    );
}

fn lease_with(routes: Vec<xdhcp_engine::Route>) -> xdhcp_engine::Lease {
    xdhcp_engine::Lease {
        address: Ipv4Addr::new(192, 0, 2, 77),
        prefix_len: 24,
        server_id: Ipv4Addr::new(192, 0, 2, 1),
        server_mac: None,
        routers: vec![Ipv4Addr::new(192, 0, 2, 1)],
        routes,
        dns_servers: Vec::new(),
        domain_name: None,
        search: Vec::new(),
        mtu: None,
        lease_time: Duration::from_mins(2),
        t1: Duration::from_mins(1),
        t2: Duration::from_secs(105),
        acquired_unix_ms: 0,
        rejected_routes: Vec::new(),
    }
}

#[tokio::test]
async fn netlink_looks_up_links_and_applies_and_removes_leases() {
    let lab = Lab::with_clients(1);
    let c = &lab.clients[0];
    let nl = Netlink::open(Some(c.ns.path())).await.unwrap();

    let link = nl.link(&c.ifname).await.unwrap();
    assert_eq!(link.ifindex, c.ifindex);
    assert_eq!(link.mac, Some(c.mac));
    assert_eq!(link.kind.as_deref(), Some("veth"));
    assert_eq!(link.name, c.ifname);
    assert!(link.up);
    assert_eq!(
        nl.link_by_index(c.ifindex).await.unwrap().map(|l| l.name),
        Some(c.ifname.clone())
    );
    assert!(nl.link_by_index(999_999).await.unwrap().is_none());
    let err = nl.link("nope0").await.unwrap_err();
    assert!(matches!(err, NetlinkError::NoSuchLink { .. }), "{err:?}");
    assert!(
        err.to_string().contains(c.ns.path().to_str().unwrap()),
        "{err}"
    );

    // Option 3 only: address + default route; option 26 sets the MTU.
    let mut plain = lease_with(Vec::new());
    plain.mtu = Some(1400);
    nl.apply_lease(c.ifindex, &plain, None).await.unwrap();
    assert_eq!(nl.link(&c.ifname).await.unwrap().mtu, Some(1400));
    plain.mtu = None;
    assert!(c.ns.ipv4_addrs(&c.ifname).contains(&(plain.address, 24)));
    assert!(
        nl.has_address(c.ifindex, plain.address, Some(24))
            .await
            .unwrap()
    );
    assert!(
        !nl.has_address(c.ifindex, plain.address, Some(25))
            .await
            .unwrap()
    );
    let routes = c.ns.routes();
    assert!(
        routes.contains("default via 192.0.2.1 dev eth0 proto dhcp"),
        "{routes}"
    );
    // Applying again is idempotent.
    nl.apply_lease(c.ifindex, &plain, None).await.unwrap();
    nl.remove_lease(c.ifindex, &plain, None).await.unwrap();
    assert!(
        !nl.has_address(c.ifindex, plain.address, None)
            .await
            .unwrap()
    );
    assert!(!c.ns.routes().contains("default"), "{}", c.ns.routes());
}

#[tokio::test]
async fn netlink_applies_classless_routes_and_checks_addresses() {
    let lab = Lab::with_clients(1);
    let c = &lab.clients[0];
    let nl = Netlink::open(Some(c.ns.path())).await.unwrap();

    // Option 121: classless routes replace the router; 0.0.0.0 = on-link.
    let classless = lease_with(vec![
        xdhcp_engine::Route {
            dest: Ipv4Addr::new(198, 51, 100, 0),
            prefix_len: 24,
            gateway: Ipv4Addr::new(203, 0, 113, 1),
        },
        xdhcp_engine::Route {
            dest: Ipv4Addr::new(203, 0, 113, 0),
            prefix_len: 24,
            gateway: Ipv4Addr::UNSPECIFIED,
        },
        xdhcp_engine::Route {
            dest: Ipv4Addr::UNSPECIFIED,
            prefix_len: 0,
            gateway: Ipv4Addr::new(192, 0, 2, 254),
        },
    ]);
    nl.apply_lease(c.ifindex, &classless, None).await.unwrap();
    let routes = c.ns.routes();
    assert!(
        routes.contains("203.0.113.0/24 dev eth0 proto dhcp scope link"),
        "{routes}"
    );
    assert!(
        routes.contains("198.51.100.0/24 via 203.0.113.1 dev eth0 proto dhcp"),
        "{routes}"
    );
    assert!(
        routes.contains("default via 192.0.2.254 dev eth0 proto dhcp"),
        "{routes}"
    );
    assert!(
        !routes.contains("192.0.2.1 "),
        "option 3 must be ignored with 121: {routes}"
    );

    // CHECK after the address was removed by hand.
    c.ns.ip(&["addr", "del", "192.0.2.77/24", "dev", "eth0"]);
    assert!(
        !nl.has_address(c.ifindex, classless.address, Some(24))
            .await
            .unwrap()
    );
    assert!(
        !nl.del_address(c.ifindex, classless.address, 24)
            .await
            .unwrap()
    );
    nl.add_address(c.ifindex, classless.address, 24)
        .await
        .unwrap();
    assert!(
        nl.del_address(c.ifindex, classless.address, 24)
            .await
            .unwrap()
    );
    // Routes can be removed one by one, and removing twice reports absence.
    let on_link = Ipv4Route {
        dest: Ipv4Addr::new(203, 0, 113, 0),
        prefix_len: 24,
        gateway: None,
    };
    // (Deleting the address flushed routes that depended on it.)
    nl.add_route(c.ifindex, on_link, None).await.unwrap();
    assert!(nl.del_route(c.ifindex, on_link, None).await.unwrap());
    assert!(!nl.del_route(c.ifindex, on_link, None).await.unwrap());
}

/// A raw packet socket receiving every frame on one interface (server side),
/// used to check what actually went over the wire.
struct ServerCapture {
    fd: std::os::fd::OwnedFd,
}

impl ServerCapture {
    fn open(ifname: &str) -> std::io::Result<Self> {
        // ETH_P_ALL: on a bridge port, protocol-specific packet sockets never
        // see frames (the bridge's rx_handler consumes them first); taps do.
        let ifindex = nix::net::if_::if_nametoindex(ifname)?;
        let fd = xdhcp_tests::netns::packet_socket_here(
            ifindex,
            libc::ETH_P_ALL as u16,
            Some(Duration::from_millis(200)),
        )?;
        Ok(Self { fd })
    }

    /// Reads frames (up to 10 s) until `pred` matches one.
    fn wait_for(
        &self,
        pred: impl Fn(&FrameHeaders, &[u8]) -> bool,
    ) -> Option<(FrameHeaders, Vec<u8>)> {
        use std::os::fd::AsRawFd;
        let deadline = std::time::Instant::now() + RECV_TIMEOUT;
        let mut buf = vec![0u8; 9300];
        while std::time::Instant::now() < deadline {
            // SAFETY: buf is valid for its length.
            let n =
                unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            let Ok(n) = usize::try_from(n) else { continue };
            if let Ok((h, p)) = frame::parse_udp_frame(&buf[..n])
                && pred(&h, p)
            {
                return Some((h, p.to_vec()));
            }
        }
        None
    }
}

#[test]
fn open_in_none_uses_the_calling_namespace() {
    let lab = Lab::with_clients(1);
    let c = &lab.clients[0];
    let (ifname, mac) = (c.ifname.clone(), c.mac);
    let (tx_index, rx_index, nl_index) = c.ns.block_on_in(move || async move {
        let tx = RawSender::open_in(None, &ifname).await.expect("sender");
        assert_eq!(tx.info().mac, mac);
        let rx = AfPacketReceiver::open_in(None, &ifname)
            .await
            .expect("receiver");
        let nl = Netlink::open(None).await.expect("netlink");
        let link = nl.link(&ifname).await.expect("link");
        (tx.info().ifindex, rx.info().ifindex, link.ifindex)
    });
    assert_eq!(
        (tx_index, rx_index, nl_index),
        (c.ifindex, c.ifindex, c.ifindex)
    );
}

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Drives an engine client over the raw sender and AF_PACKET receiver until
/// `stop` accepts an event (returned) or `limit` passes (panic).
async fn drive(
    client: &mut xdhcp_engine::Client,
    tx: &RawSender,
    rx: &AfPacketReceiver,
    limit: Duration,
    mut stop: impl FnMut(&xdhcp_engine::Event) -> bool,
) -> xdhcp_engine::Event {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        while let Some(t) = client.poll_transmit() {
            tx.send_transmit(&t).expect("send");
        }
        while let Some(ev) = client.poll_event() {
            if stop(&ev) {
                return ev;
            }
        }
        let timer = client
            .poll_timeout()
            .map_or(deadline, tokio::time::Instant::from_std);
        tokio::select! {
            frame = rx.recv() => {
                let frame = frame.expect("receive");
                client.set_wall_clock_unix_ms(wall_ms());
                let src = xdhcp_engine::PacketSource {
                    src_mac: frame.headers.src_mac,
                    src_ip: frame.headers.src_ip,
                };
                // Replies for other clients or states are dropped by the engine.
                let _ = client.handle_packet(std::time::Instant::now(), src, &frame.payload);
            }
            () = tokio::time::sleep_until(timer.min(deadline)) => {
                assert!(tokio::time::Instant::now() < deadline, "no matching event within {limit:?} (state {:?})", client.state());
                client.set_wall_clock_unix_ms(wall_ms());
                client.handle_timeout(std::time::Instant::now());
            }
        }
    }
}

/// The real engine over these transports: DORA, the address applied with
/// netlink (as a CNI main plugin would), a unicast renewal answered by Kea,
/// then a unicast RELEASE that removes the lease from Kea's lease file.
#[tokio::test]
async fn engine_over_rawsock_and_afpacket_binds_renews_and_releases_with_kea() {
    let lab = Lab::with_clients(1);
    let kea = Kea::start(
        &lab.server,
        KeaConfig {
            valid_lifetime: 20,
            renew_timer: 2,
            rebind_timer: 15,
            ..KeaConfig::default()
        },
    );
    let c = &lab.clients[0];
    let tx = RawSender::open_async(c.ns.path(), &c.ifname).await.unwrap();
    let rx = AfPacketReceiver::open_async(c.ns.path(), &c.ifname)
        .await
        .unwrap();
    let cfg = xdhcp_engine::ClientConfig {
        chaddr: c.mac,
        ..xdhcp_engine::ClientConfig::default()
    };
    let mut client = xdhcp_engine::Client::new(cfg, std::time::Instant::now(), 42);

    let bound = drive(&mut client, &tx, &rx, Duration::from_secs(15), |e| {
        matches!(e, xdhcp_engine::Event::Bound(_))
    })
    .await;
    let xdhcp_engine::Event::Bound(lease) = bound else {
        unreachable!()
    };
    assert_eq!(lease.server_id, lab.server_ip);
    assert_eq!(lease.server_mac, Some(lab.server_mac()));
    assert_eq!(kea.lease_for(c.mac).map(|l| l.ip), Some(lease.address));

    let nl = Netlink::open(Some(c.ns.path())).await.unwrap();
    nl.apply_lease(c.ifindex, &lease, None).await.unwrap();
    assert!(
        c.ns.routes().contains("default via 192.0.2.1"),
        "{}",
        c.ns.routes()
    );

    // T1 = 2 s: the renewal is unicast from the leased address.
    let capture = {
        let port = c.port().to_owned();
        lab.server
            .run_in(move || ServerCapture::open(&port))
            .unwrap()
    };
    let renewed = drive(&mut client, &tx, &rx, Duration::from_secs(10), |e| {
        matches!(e, xdhcp_engine::Event::Renewed(_))
    })
    .await;
    let xdhcp_engine::Event::Renewed(renewed) = renewed else {
        unreachable!()
    };
    assert_eq!(renewed.address, lease.address);
    let (renew_headers, _) = capture
        .wait_for(|h, p| {
            h.dst_port == 67
                && v4::Message::from_bytes(p)
                    .is_ok_and(|m| m.opts().msg_type() == Some(MessageType::Request))
        })
        .expect("renewal REQUEST on the wire");
    assert_eq!(renew_headers.src_ip, lease.address);
    assert_eq!(renew_headers.dst_ip, lab.server_ip);
    assert_eq!(renew_headers.dst_mac, lab.server_mac());

    client.set_wall_clock_unix_ms(wall_ms());
    client.release(std::time::Instant::now());
    let t = client.poll_transmit().expect("RELEASE queued");
    assert_eq!(t.kind, MessageKind::Release);
    assert_eq!(t.src_ip, lease.address);
    tx.send_transmit(&t).unwrap();
    assert!(
        xdhcp_tests::wait_until(Duration::from_secs(5), || kea.lease_for(c.mac).is_none()),
        "Kea still holds the lease after RELEASE: {:?}",
        kea.leases()
    );
    nl.remove_lease(c.ifindex, &lease, None).await.unwrap();
    assert!(c.ns.ipv4_addrs(&c.ifname).is_empty());
}

/// A VM's pod interface is a port of KubeVirt's in-pod bridge: the receiver
/// must still see replies on it (only packet taps run before the bridge).
#[tokio::test]
async fn receiver_works_on_a_bridge_port() {
    let lab = Lab::with_clients(1);
    let _dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
    let c = &lab.clients[0];
    let bridge = xdhcp_tests::Bridge::new(&c.ns, "k6t-eth0");
    bridge.attach(&c.ifname);
    let vm_mac = [0x02, 0x42, 0, 0, 0, 0x01];
    let tx = RawSender::open_async(c.ns.path(), &c.ifname)
        .await
        .unwrap()
        .with_src_mac(vm_mac);
    assert_eq!(tx.src_mac(), vm_mac);
    let rx = AfPacketReceiver::open_async(c.ns.path(), &c.ifname)
        .await
        .unwrap();
    let xid = 0x5eed_0001;
    send_discover(&tx, xid, vm_mac, true).unwrap();
    let (frame, offer) = recv_reply(&rx, xid, MessageType::Offer).await;
    assert_eq!(offer.chaddr()[..6], vm_mac);
    assert_eq!(frame.ifindex, c.ifindex);
}

/// With the server's unicast path cut ([`Lab::cut_server_unicast`]) the
/// engine's unicast RENEW goes unanswered and the lease is kept by the
/// broadcast REBIND at T2 — through these transports, against dnsmasq.
#[tokio::test]
async fn rebind_broadcast_keeps_the_lease_when_unicast_is_cut() {
    let lab = Lab::with_clients(1);
    let dnsmasq = Dnsmasq::start(
        &lab.server,
        DnsmasqConfig {
            t1_secs: Some(2),
            t2_secs: Some(4),
            ..DnsmasqConfig::default()
        },
    );
    let c = &lab.clients[0];
    let tx = RawSender::open_async(c.ns.path(), &c.ifname).await.unwrap();
    let rx = AfPacketReceiver::open_async(c.ns.path(), &c.ifname)
        .await
        .unwrap();
    let cfg = xdhcp_engine::ClientConfig {
        chaddr: c.mac,
        ..xdhcp_engine::ClientConfig::default()
    };
    let mut client = xdhcp_engine::Client::new(cfg, std::time::Instant::now(), 7);
    let xdhcp_engine::Event::Bound(lease) =
        drive(&mut client, &tx, &rx, Duration::from_secs(15), |e| {
            matches!(e, xdhcp_engine::Event::Bound(_))
        })
        .await
    else {
        unreachable!()
    };
    Netlink::open(Some(c.ns.path()))
        .await
        .unwrap()
        .apply_lease(c.ifindex, &lease, None)
        .await
        .unwrap();

    let cut = lab.cut_server_unicast();
    let capture = {
        let port = c.port().to_owned();
        lab.server
            .run_in(move || ServerCapture::open(&port))
            .unwrap()
    };
    let ev = drive(&mut client, &tx, &rx, Duration::from_secs(15), |e| {
        matches!(
            e,
            xdhcp_engine::Event::Renewed(_) | xdhcp_engine::Event::Lost { .. }
        )
    })
    .await;
    assert!(
        matches!(ev, xdhcp_engine::Event::Renewed(ref l) if l.address == lease.address),
        "{ev:?}"
    );
    assert!(
        cut.dropped() >= 1,
        "the unicast RENEW should have been dropped"
    );
    let (rebind, _) = capture
        .wait_for(|h, p| {
            h.dst_port == 67
                && h.dst_ip == Ipv4Addr::BROADCAST
                && v4::Message::from_bytes(p)
                    .is_ok_and(|m| m.opts().msg_type() == Some(MessageType::Request))
        })
        .expect("broadcast REBIND on the wire");
    assert_eq!(
        rebind.src_ip, lease.address,
        "REBIND comes from the leased address"
    );
    assert_eq!(rebind.dst_mac, BROADCAST_MAC);
    assert!(dnsmasq.lease_for(c.mac).is_some());
    drop(cut);
}

/// ISC dhcpd guard end to end: a hand-driven DORA over the raw transports,
/// and the lease shows up in dhcpd's lease file as parsed by the harness.
#[tokio::test]
async fn dhcpd_lease_appears_in_its_lease_file() {
    let lab = Lab::with_clients(1);
    let dhcpd = xdhcp_tests::Dhcpd::start(&lab.server, &xdhcp_tests::DhcpdConfig::default());
    let c = &lab.clients[0];
    let tx = RawSender::open_async(c.ns.path(), &c.ifname).await.unwrap();
    let rx = AfPacketReceiver::open_async(c.ns.path(), &c.ifname)
        .await
        .unwrap();
    let xid = 0x0dc0_0001;
    send_discover(&tx, xid, c.mac, true).unwrap();
    let (_, offer) = recv_reply(&rx, xid, MessageType::Offer).await;
    let (addr, server) = (offer.yiaddr(), server_id(&offer));
    assert_eq!(server, lab.server_ip);
    tx.send_transmit(&broadcast_transmit(
        request(xid, c.mac, server, addr),
        xid,
        MessageKind::Request,
    ))
    .unwrap();
    let (_, ack) = recv_reply(&rx, xid, MessageType::Ack).await;
    assert_eq!(ack.yiaddr(), addr);
    assert!(
        xdhcp_tests::wait_until(Duration::from_secs(5), || dhcpd
            .leases()
            .iter()
            .any(|l| l.ip == addr && l.mac == c.mac)),
        "lease {addr} not in dhcpd's file: {:?}\n{}",
        dhcpd.leases(),
        dhcpd.log()
    );
}
