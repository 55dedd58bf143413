//! Differential test: replies encoded by `dhcproto` (the codec servers such
//! as dora use) decode through our own validator into exactly the lease the
//! server meant.

use std::net::Ipv4Addr;
use std::time::Duration;

use dhcproto::v4::{DhcpOption, Message, MessageType, Opcode};
use dhcproto::{Encodable, Encoder, Name};
use proptest::prelude::*;

use super::server::CLIENT_MAC;
use crate::validate::{ReplyType, parse_reply};
use crate::{RoutePolicy, lease};

fn label() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9-]{0,10}[a-z0-9]"
}

fn domain() -> impl Strategy<Value = String> {
    prop::collection::vec(label(), 1..4).prop_map(|l| l.join("."))
}

fn host_ip() -> impl Strategy<Value = Ipv4Addr> {
    (1u8..=223, any::<u8>(), any::<u8>(), 1u8..=254)
        .prop_filter("not loopback", |(a, ..)| *a != 127)
        .prop_map(|(a, b, c, d)| Ipv4Addr::new(a, b, c, d))
}

#[derive(Debug, Clone)]
struct Params {
    xid: u32,
    yiaddr: Ipv4Addr,
    server: Ipv4Addr,
    lease: u32,
    t1: Option<u32>,
    t2: Option<u32>,
    routers: Vec<Ipv4Addr>,
    dns: Vec<Ipv4Addr>,
    domain: Option<String>,
    search: Vec<String>,
    mtu: Option<u16>,
}

fn params() -> impl Strategy<Value = Params> {
    (
        (any::<u32>(), host_ip(), host_ip(), 1u32..=u32::MAX),
        (
            prop::option::of(1u32..1_000_000),
            prop::option::of(1u32..1_000_000),
        ),
        (
            prop::collection::vec(host_ip(), 0..4),
            prop::collection::vec(host_ip(), 0..4),
        ),
        (
            prop::option::of(domain()),
            prop::collection::vec(domain(), 0..4),
            prop::option::of(68u16..=9000),
        ),
    )
        .prop_filter("server differs from client", |((_, y, s, _), ..)| y != s)
        .prop_map(
            |((xid, yiaddr, server, lease), (t1, t2), (routers, dns), (domain, search, mtu))| {
                Params {
                    xid,
                    yiaddr,
                    server,
                    lease,
                    t1,
                    t2,
                    routers,
                    dns,
                    domain,
                    search,
                    mtu,
                }
            },
        )
}

fn encode(p: &Params) -> Vec<u8> {
    let mut m = Message::new_with_id(
        p.xid,
        Ipv4Addr::UNSPECIFIED,
        p.yiaddr,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        &CLIENT_MAC,
    );
    m.set_opcode(Opcode::BootReply);
    let o = m.opts_mut();
    o.insert(DhcpOption::MessageType(MessageType::Ack));
    o.insert(DhcpOption::ServerIdentifier(p.server));
    o.insert(DhcpOption::AddressLeaseTime(p.lease));
    o.insert(DhcpOption::SubnetMask(Ipv4Addr::BROADCAST));
    if let Some(t) = p.t1 {
        o.insert(DhcpOption::Renewal(t));
    }
    if let Some(t) = p.t2 {
        o.insert(DhcpOption::Rebinding(t));
    }
    if !p.routers.is_empty() {
        o.insert(DhcpOption::Router(p.routers.clone()));
    }
    if !p.dns.is_empty() {
        o.insert(DhcpOption::DomainNameServer(p.dns.clone()));
    }
    if let Some(d) = &p.domain {
        o.insert(DhcpOption::DomainName(d.clone()));
    }
    if !p.search.is_empty() {
        let names = p
            .search
            .iter()
            .map(|s| Name::from_ascii(format!("{s}.")).unwrap())
            .collect();
        o.insert(DhcpOption::DomainSearch(names));
    }
    if let Some(mtu) = p.mtu {
        o.insert(DhcpOption::InterfaceMtu(mtu));
    }
    let mut buf = Vec::new();
    m.encode(&mut Encoder::new(&mut buf)).unwrap();
    buf
}

proptest! {
    #[test]
    fn dhcproto_encoded_acks_decode_to_the_intended_lease(p in params()) {
        let bytes = encode(&p);
        let reply = parse_reply(&bytes).unwrap();
        prop_assert_eq!(reply.xid, p.xid);
        prop_assert_eq!(reply.yiaddr, p.yiaddr);
        prop_assert_eq!(reply.reply_type(), Ok(ReplyType::Ack));
        prop_assert_eq!(reply.server_id(), Ok(p.server));
        let policy = RoutePolicy::default();
        let (l, _) = lease::from_reply(&reply, p.server, &policy, 7).unwrap();
        prop_assert_eq!(l.address, p.yiaddr);
        prop_assert_eq!(l.prefix_len, 32);
        prop_assert_eq!(
            l.lease_time,
            Duration::from_secs(u64::from(p.lease).max(lease::MIN_LEASE_SECS))
        );
        prop_assert_eq!(&l.routers, &p.routers);
        prop_assert_eq!(&l.dns_servers, &p.dns);
        prop_assert_eq!(&l.domain_name, &p.domain);
        prop_assert_eq!(&l.search, &p.search);
        prop_assert_eq!(l.mtu, p.mtu);
        prop_assert_eq!(l.acquired_unix_ms, 7);
        if l.is_infinite() {
            prop_assert_eq!(l.t1, l.lease_time);
        } else {
            prop_assert!(l.t1 < l.t2 && l.t2 < l.lease_time, "{:?}", l);
            if let (Some(t1), Some(t2)) = (p.t1, p.t2)
                && t1 < t2
                && t2 < p.lease
                && u64::from(p.lease) >= lease::MIN_LEASE_SECS
            {
                prop_assert_eq!(l.t1, Duration::from_secs(u64::from(t1)));
                prop_assert_eq!(l.t2, Duration::from_secs(u64::from(t2)));
            }
        }
    }
}
