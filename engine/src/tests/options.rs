//! Option handling through the client: 121 vs 3, overload, split options,
//! bad lengths, route policy, informative options.

use std::net::Ipv4Addr;
use std::time::Duration;

use super::server::{ADDR, H, SERVER_IP, Server, cfg, raw_opts, raw_reply};
use crate::routes::encode_option121;
use crate::{
    ClientConfig, DropReason, Event, Lease, LeaseOption, Route, RoutePolicy, RouteRejection, State,
    Transmit,
};

fn route(dest: [u8; 4], len: u8, gw: [u8; 4]) -> Route {
    Route {
        dest: Ipv4Addr::from(dest),
        prefix_len: len,
        gateway: Ipv4Addr::from(gw),
    }
}

/// Client in REQUESTING; returns the harness and the REQUEST.
fn requesting(cfg: ClientConfig) -> (H, Transmit) {
    let mut h = H::new(cfg);
    let d = h.one_tx();
    h.feed(&h.srv.offer(&d)).unwrap();
    let r = h.one_tx();
    (h, r)
}

/// Options every ACK needs: type, server id, lease time, mask.
fn base_opts() -> Vec<u8> {
    raw_opts(&[
        (53, &[5]),
        (54, &SERVER_IP.octets()),
        (51, &3600u32.to_be_bytes()),
        (1, &[255, 255, 255, 0]),
    ])
}

fn bound_lease(h: &mut H) -> Lease {
    assert_eq!(h.c.state(), State::Bound);
    match h.ev().as_slice() {
        [Event::Bound(l)] => l.clone(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn option_121_replaces_option_3() {
    let (mut h, r) = requesting(cfg());
    let routes = vec![
        route([0, 0, 0, 0], 0, [192, 0, 2, 254]),
        route([198, 51, 100, 0], 24, [192, 0, 2, 253]),
    ];
    let mut srv = h.srv.clone();
    srv.extra.push((121, encode_option121(&routes)));
    h.feed(&srv.ack(&r)).unwrap();
    let l = bound_lease(&mut h);
    assert!(l.routers.is_empty(), "option 3 must be ignored (RFC 3442)");
    assert_eq!(l.routes, routes);
    assert_eq!(l.default_gateway(), Some(Ipv4Addr::new(192, 0, 2, 254)));
    assert_eq!(h.c.stats().routers_ignored_for_121, 1);
}

#[test]
fn option_3_used_without_121() {
    let (mut h, r) = requesting(cfg());
    h.feed(&h.srv.ack(&r)).unwrap();
    let l = bound_lease(&mut h);
    assert_eq!(l.routers, vec![SERVER_IP]);
    assert!(l.routes.is_empty());
    assert_eq!(l.default_gateway(), Some(SERVER_IP));
    assert_eq!(h.c.stats().routers_ignored_for_121, 0);
}

#[test]
fn malformed_121_is_dropped_whole_and_option_3_used() {
    for bad in [
        vec![33, 10, 0, 0, 0, 0, 192, 0, 2, 1],  // prefix 33
        vec![24, 198, 51, 100, 192, 0, 2, 1, 8], // short trailing entry
        vec![24, 198, 51, 100, 192, 0, 2],       // short first entry
        vec![],                                  // empty
        vec![8, 10, 192, 0, 2, 1, 200, 1, 2, 3], // good then impossible
    ] {
        let (mut h, r) = requesting(cfg());
        let mut srv = h.srv.clone();
        srv.extra.push((121, bad.clone()));
        h.feed(&srv.ack(&r)).unwrap();
        let l = bound_lease(&mut h);
        // Nothing of the broken option is applied, not even its good first
        // entry; the router of option 3 is the default gateway, as when 121
        // is absent.
        assert!(l.routes.is_empty(), "{bad:?}: {l:?}");
        assert_eq!(l.routers, vec![SERVER_IP], "{bad:?}");
        assert_eq!(l.default_gateway(), Some(SERVER_IP));
        let s = h.c.stats();
        assert_eq!(s.malformed(LeaseOption::ClasslessStaticRoute), 1, "{bad:?}");
        assert_eq!(s.malformed_total(), 1);
        assert_eq!(s.routers_ignored_for_121, 0);
        assert_eq!(s.dropped_total(), 0);
    }
}

#[test]
fn split_121_instances_are_concatenated_rfc3396() {
    let (mut h, r) = requesting(cfg());
    let routes: Vec<Route> = (0..40u8)
        .map(|i| route([10, i, 0, 0], 16, [192, 0, 2, 254]))
        .collect();
    let data = encode_option121(&routes);
    assert!(data.len() > 255);
    // Non-adjacent split: half, another option, the rest.
    let (head, tail) = data.split_at(101);
    let mut opts = base_opts();
    opts.extend(raw_opts(&[(121, head), (6, &[192, 0, 2, 53]), (121, tail)]));
    opts.push(255);
    let ack = raw_reply(r.xid, ADDR, &opts, &[], &[]);
    h.feed(&ack).unwrap();
    let l = bound_lease(&mut h);
    assert_eq!(l.routes, routes);
    assert_eq!(l.dns_servers, vec![Ipv4Addr::new(192, 0, 2, 53)]);
    // A >255-byte option split by the encoder (adjacent instances) too.
    let (mut h, r) = requesting(cfg());
    let mut srv = h.srv.clone();
    srv.extra.push((121, data));
    h.feed(&srv.ack(&r)).unwrap();
    assert_eq!(bound_lease(&mut h).routes, routes);
}

#[test]
fn overload_into_file_and_sname() {
    let (mut h, r) = requesting(cfg());
    let route = route([198, 51, 100, 0], 24, [192, 0, 2, 254]);
    let r121 = encode_option121(&[route]);
    // Options field: type, server id, overload=3, first half of option 15.
    let opts = {
        let mut v = raw_opts(&[
            (53, &[5]),
            (54, &SERVER_IP.octets()),
            (52, &[3]),
            (15, b"exam"),
        ]);
        v.push(255);
        v
    };
    // file: lease time, mask, 121, second part of 15. sname: last part.
    let mut file = raw_opts(&[
        (51, &600u32.to_be_bytes()),
        (1, &[255, 255, 255, 0]),
        (121, &r121),
        (15, b"ple."),
    ]);
    file.push(255);
    let mut sname = raw_opts(&[(15, b"com")]);
    sname.push(255);
    let ack = raw_reply(r.xid, ADDR, &opts, &sname, &file);
    h.feed(&ack).unwrap();
    let l = bound_lease(&mut h);
    assert_eq!(l.lease_time, Duration::from_mins(10));
    assert_eq!(l.routes, vec![route]);
    assert_eq!(l.domain_name.as_deref(), Some("example.com"));

    // The same bytes without option 52: file/sname are not options, so the
    // mandatory lease time is missing.
    let (mut h, r) = requesting(cfg());
    let mut opts = raw_opts(&[(53, &[5]), (54, &SERVER_IP.octets())]);
    opts.push(255);
    let ack = raw_reply(r.xid, ADDR, &opts, &sname, &file);
    assert_eq!(h.feed(&ack), Err(DropReason::MissingLeaseTime));
}

#[test]
fn bad_overload_and_bad_lengths_reject_the_reply() {
    let cases: Vec<(Vec<u8>, Vec<u8>, DropReason)> = vec![
        // overload value 7
        (raw_opts(&[(52, &[7])]), vec![], DropReason::BadOverload),
        // overload says file, file has an option running past its end
        (
            raw_opts(&[(52, &[1])]),
            {
                let mut f = vec![0u8; 126];
                f.extend_from_slice(&[51, 4]);
                f
            },
            DropReason::BadOptionLength,
        ),
        // overload option inside file
        (
            raw_opts(&[(52, &[1])]),
            raw_opts(&[(52, &[2])]),
            DropReason::BadOverload,
        ),
    ];
    for (extra, file, want) in cases {
        let (mut h, r) = requesting(cfg());
        let mut opts = base_opts();
        opts.extend(extra);
        opts.push(255);
        let ack = raw_reply(r.xid, ADDR, &opts, &[], &file);
        assert_eq!(h.feed(&ack), Err(want));
        assert_eq!(h.c.state(), State::Requesting);
    }
    // Length byte past the end of the packet.
    let (mut h, r) = requesting(cfg());
    let mut opts = base_opts();
    opts.extend_from_slice(&[6, 200, 192, 0, 2, 53]);
    let ack = raw_reply(r.xid, ADDR, &opts, &[], &[]);
    assert_eq!(h.feed(&ack), Err(DropReason::BadOptionLength));
    // Lease time with the wrong length.
    let (mut h, r) = requesting(cfg());
    let mut opts = raw_opts(&[(53, &[5]), (54, &SERVER_IP.octets()), (51, &[0, 0, 14])]);
    opts.push(255);
    assert_eq!(
        h.feed(&raw_reply(r.xid, ADDR, &opts, &[], &[])),
        Err(DropReason::BadLeaseTime)
    );
    // Message type with two bytes.
    let (mut h, r) = requesting(cfg());
    let mut opts = raw_opts(&[(53, &[5, 5]), (54, &SERVER_IP.octets())]);
    opts.push(255);
    assert_eq!(
        h.feed(&raw_reply(r.xid, ADDR, &opts, &[], &[])),
        Err(DropReason::BadMessageType)
    );
}

#[test]
fn malformed_subnet_mask_falls_back_to_classful_like_a_missing_one() {
    for (mask, extra) in [
        (Some(Ipv4Addr::new(255, 0, 255, 0)), None),
        (Some(Ipv4Addr::UNSPECIFIED), None),
        (None, Some(vec![255, 255, 255])),
        (None, Some(vec![255, 255, 255, 0, 0])),
    ] {
        let (mut h, r) = requesting(cfg());
        let mut srv = h.srv.clone();
        srv.mask = mask;
        srv.extra.extend(extra.map(|e| (1, e)));
        h.feed(&srv.ack(&r)).unwrap();
        assert_eq!(
            bound_lease(&mut h).prefix_len,
            24,
            "classful /24 for 192.0.2.x"
        );
        assert_eq!(h.c.stats().malformed(LeaseOption::SubnetMask), 1);
        assert_eq!(h.c.stats().subnet_mask_missing, 0);
    }
    let (mut h, r) = requesting(cfg());
    let mut srv = h.srv.clone();
    srv.mask = None;
    h.feed(&srv.ack(&r)).unwrap();
    assert_eq!(
        bound_lease(&mut h).prefix_len,
        24,
        "classful /24 for 192.0.2.x"
    );
    assert_eq!(h.c.stats().subnet_mask_missing, 1);
    assert_eq!(h.c.stats().malformed_total(), 0);
}

#[test]
fn informative_options_decoded_or_ignored_one_by_one() {
    let (mut h, r) = requesting(cfg());
    let mut srv = Server {
        dns: vec![],
        ..h.srv.clone()
    };
    let search = [
        3, b'e', b'n', b'g', 7, b'e', b'x', b'a', b'm', b'p', b'l', b'e', 0, 1, b'x', 0xc0, 4,
    ];
    srv.extra = vec![
        (6, vec![192, 0, 2, 53, 192, 0, 2, 54]),
        (15, b"corp.example".to_vec()),
        (26, 1400u16.to_be_bytes().to_vec()),
        (119, search.to_vec()),
    ];
    h.feed(&srv.ack(&r)).unwrap();
    let l = bound_lease(&mut h);
    assert_eq!(
        l.dns_servers,
        vec![Ipv4Addr::new(192, 0, 2, 53), Ipv4Addr::new(192, 0, 2, 54)]
    );
    assert_eq!(l.domain_name.as_deref(), Some("corp.example"));
    assert_eq!(l.mtu, Some(1400));
    assert_eq!(l.search, vec!["eng.example", "x.example"]);
    assert_eq!(h.c.stats().malformed_total(), 0);

    let (mut h, r) = requesting(cfg());
    srv.extra = vec![
        (6, vec![192, 0, 2, 53, 1]),
        (15, b"evil.example\nnameserver 203.0.113.66".to_vec()),
        (26, 20u16.to_be_bytes().to_vec()),
        (119, vec![0xc0, 0]),
    ];
    h.feed(&srv.ack(&r)).unwrap();
    let l = bound_lease(&mut h);
    assert!(l.dns_servers.is_empty());
    assert_eq!(l.domain_name, None);
    assert_eq!(l.mtu, None);
    assert!(l.search.is_empty());
    let dropped: Vec<_> = h.c.stats().malformed_by_option().collect();
    assert_eq!(
        dropped,
        vec![
            (LeaseOption::DomainNameServer, 1),
            (LeaseOption::DomainName, 1),
            (LeaseOption::InterfaceMtu, 1),
            (LeaseOption::DomainSearch, 1),
        ]
    );
}

#[test]
fn tunnelvision_routes_rejected_and_counted() {
    let (mut h, r) = requesting(ClientConfig {
        route_policy: RoutePolicy {
            protected: vec!["10.128.0.0/14".parse().unwrap()],
            ..RoutePolicy::default()
        },
        ..cfg()
    });
    let routes = vec![
        route([0, 0, 0, 0], 0, [192, 0, 2, 1]),
        route([0, 0, 0, 0], 1, [192, 0, 2, 66]),
        route([128, 0, 0, 0], 1, [192, 0, 2, 66]),
        route([10, 128, 5, 0], 24, [192, 0, 2, 66]),
        route([198, 51, 100, 0], 24, [192, 0, 2, 1]),
    ];
    let mut srv = h.srv.clone();
    srv.extra.push((121, encode_option121(&routes)));
    h.feed(&srv.ack(&r)).unwrap();
    let l = bound_lease(&mut h);
    assert_eq!(l.routes, vec![routes[0], routes[4]]);
    let reasons: Vec<_> = l.rejected_routes.iter().map(|r| r.reason).collect();
    assert_eq!(
        reasons,
        vec![
            RouteRejection::OverridesDefault,
            RouteRejection::OverridesDefault,
            RouteRejection::Protected {
                prefix: "10.128.0.0/14".parse().unwrap()
            }
        ]
    );
    assert_eq!(h.c.stats().routes_rejected, 3);
}

#[test]
fn default_route_refused_on_secondary_networks() {
    let (mut h, r) = requesting(ClientConfig {
        route_policy: RoutePolicy {
            allow_default_route: false,
            ..RoutePolicy::default()
        },
        ..cfg()
    });
    h.feed(&h.srv.ack(&r)).unwrap();
    let l = bound_lease(&mut h);
    assert!(l.routers.is_empty());
    assert_eq!(l.default_gateway(), None);
    assert_eq!(l.rejected_routes.len(), 1);
    assert_eq!(l.rejected_routes[0].reason, RouteRejection::DefaultRoute);
    assert_eq!(h.c.stats().routes_rejected, 1);
}

#[test]
fn absurd_addresses_are_dropped() {
    for (yiaddr, want) in [
        (Ipv4Addr::UNSPECIFIED, DropReason::BadAddress),
        (Ipv4Addr::BROADCAST, DropReason::BadAddress),
        (Ipv4Addr::new(224, 0, 0, 1), DropReason::BadAddress),
        (Ipv4Addr::LOCALHOST, DropReason::BadAddress),
    ] {
        let mut h = H::new(cfg());
        let d = h.one_tx();
        let offer = h.srv.reply(&d, dhcproto::v4::MessageType::Offer, yiaddr);
        assert_eq!(h.feed(&offer), Err(want), "{yiaddr}");
    }
    // The subnet's network/broadcast address, or the server's own address.
    for yiaddr in [
        Ipv4Addr::new(192, 0, 2, 0),
        Ipv4Addr::new(192, 0, 2, 255),
        SERVER_IP,
    ] {
        let mut h = H::new(cfg());
        let d = h.one_tx();
        let offer = h.srv.reply(&d, dhcproto::v4::MessageType::Offer, yiaddr);
        assert_eq!(h.feed(&offer), Err(DropReason::BadAddress), "{yiaddr}");
    }
    // On a /31 both addresses are hosts (RFC 3021).
    let mut h = H::new(cfg());
    h.srv.mask = Some(Ipv4Addr::new(255, 255, 255, 254));
    let d = h.one_tx();
    let offer = h.srv.reply(
        &d,
        dhcproto::v4::MessageType::Offer,
        Ipv4Addr::new(192, 0, 2, 0),
    );
    h.feed(&offer).unwrap();

    let mut h = H::new(cfg());
    let d = h.one_tx();
    let mut opts = raw_opts(&[
        (53, &[2]),
        (54, &[0, 0, 0, 0]),
        (51, &3600u32.to_be_bytes()),
    ]);
    opts.push(255);
    assert_eq!(
        h.feed(&raw_reply(d.xid, ADDR, &opts, &[], &[])),
        Err(DropReason::BadServerId)
    );
}
