//! A malformed optional option is dropped, counted and logged; the lease
//! goes ahead without it, on the first DORA and on a renewal.

use std::net::Ipv4Addr;
use std::time::Duration;

use super::server::{H, SERVER_IP, Server, cfg};
use crate::routes::encode_option121;
use crate::{Event, Lease, LeaseOption, Route, State};

/// One malformed case: the option, its bytes, what the server sends besides
/// (the encoded form of the same option is turned off), and what the lease
/// must look like without it.
struct Case {
    option: LeaseOption,
    bytes: Vec<u8>,
    check: fn(&Lease),
}

fn server_without(option: LeaseOption) -> Server {
    let mut srv = Server::default();
    match option {
        LeaseOption::SubnetMask => srv.mask = None,
        LeaseOption::Router => srv.routers.clear(),
        LeaseOption::DomainNameServer => srv.dns.clear(),
        _ => {}
    }
    srv
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            option: LeaseOption::SubnetMask,
            bytes: vec![255, 255, 0],
            check: |l| assert_eq!(l.prefix_len, 24, "classful prefix of 192.0.2.x"),
        },
        Case {
            option: LeaseOption::SubnetMask,
            bytes: vec![255, 0, 255, 0],
            check: |l| assert_eq!(l.prefix_len, 24),
        },
        Case {
            option: LeaseOption::Router,
            bytes: vec![192, 0, 2],
            check: |l| {
                assert!(l.routers.is_empty());
                assert_eq!(l.default_gateway(), None);
            },
        },
        Case {
            option: LeaseOption::DomainNameServer,
            bytes: vec![192, 0, 2, 53, 7],
            check: |l| assert!(l.dns_servers.is_empty()),
        },
        Case {
            option: LeaseOption::DomainNameServer,
            bytes: vec![224, 0, 0, 1],
            check: |l| assert!(l.dns_servers.is_empty()),
        },
        Case {
            option: LeaseOption::DomainName,
            bytes: b"corp example".to_vec(),
            check: |l| assert_eq!(l.domain_name, None),
        },
        Case {
            option: LeaseOption::InterfaceMtu,
            bytes: vec![5, 220, 0],
            check: |l| assert_eq!(l.mtu, None),
        },
        Case {
            option: LeaseOption::InterfaceMtu,
            bytes: 20u16.to_be_bytes().to_vec(),
            check: |l| assert_eq!(l.mtu, None),
        },
        Case {
            option: LeaseOption::RenewalTime,
            bytes: vec![0, 0, 3],
            check: |l| assert_eq!(l.t1, Duration::from_mins(30), "50 % of the lease"),
        },
        Case {
            option: LeaseOption::RebindingTime,
            bytes: vec![0, 0, 3, 0, 0],
            check: |l| assert_eq!(l.t2, Duration::from_secs(3150), "87.5 % of the lease"),
        },
        Case {
            option: LeaseOption::DomainSearch,
            bytes: vec![3, b'e', b'n', b'g', 0xc0, 9],
            check: |l| assert!(l.search.is_empty()),
        },
        Case {
            option: LeaseOption::ClasslessStaticRoute,
            bytes: vec![33, 10, 0, 0, 0, 0, 192, 0, 2, 1],
            check: fallback_to_option_3,
        },
        Case {
            option: LeaseOption::ClasslessStaticRoute,
            bytes: vec![24, 198, 51, 100, 192, 0, 2],
            check: fallback_to_option_3,
        },
    ]
}

fn fallback_to_option_3(l: &Lease) {
    assert!(l.routes.is_empty(), "{l:?}");
    assert_eq!(l.routers, vec![SERVER_IP]);
    assert_eq!(l.default_gateway(), Some(SERVER_IP));
}

#[test]
fn every_malformed_option_is_dropped_on_the_first_dora_and_on_renewal() {
    for case in cases() {
        let what = format!("option {} {:?}", case.option.code(), case.bytes);
        let mut h = H::new(cfg());
        h.srv = server_without(case.option);
        h.srv.extra.push((case.option.code(), case.bytes.clone()));

        // First DORA: the OFFER and the ACK both carry it; both are taken.
        let lease = h.bind();
        (case.check)(&lease);
        assert_eq!(h.c.stats().malformed(case.option), 2, "{what}");
        assert_eq!(h.c.stats().malformed_total(), 2, "{what}");
        assert_eq!(h.c.stats().dropped_total(), 0, "{what}");
        assert_eq!(
            h.c.take_malformed_options(),
            vec![(case.option, 2)],
            "{what}"
        );
        assert!(h.c.take_malformed_options().is_empty(), "taken once");

        // Renewal at T1: the ACK still carries it; the lease is extended
        // with the same configuration.
        h.fire();
        assert_eq!(h.c.state(), State::Renewing, "{what}");
        let r = h.one_tx();
        h.now += Duration::from_millis(5);
        h.feed(&h.srv.ack(&r))
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(h.c.state(), State::Bound, "{what}");
        match h.ev().as_slice() {
            [Event::Renewed(l)] => {
                (case.check)(l);
                assert!(l.same_config(&lease), "{what}");
            }
            other => panic!("{what}: {other:?}"),
        }
        assert_eq!(h.c.stats().renewals, 1, "{what}");
        assert_eq!(h.c.stats().malformed(case.option), 3, "{what}");
        assert_eq!(
            h.c.take_malformed_options(),
            vec![(case.option, 1)],
            "{what}"
        );
        assert!(h.c.lease_timers().unwrap().t1.is_some(), "{what}");
    }
}

#[test]
fn a_renewal_with_a_broken_121_falls_back_to_option_3() {
    let good = vec![
        Route {
            dest: Ipv4Addr::UNSPECIFIED,
            prefix_len: 0,
            gateway: Ipv4Addr::new(192, 0, 2, 254),
        },
        Route {
            dest: Ipv4Addr::new(198, 51, 100, 0),
            prefix_len: 24,
            gateway: Ipv4Addr::new(192, 0, 2, 253),
        },
    ];
    let mut h = H::new(cfg());
    h.srv.extra.push((121, encode_option121(&good)));
    let first = h.bind();
    assert_eq!(first.routes, good);
    assert!(first.routers.is_empty());
    assert_eq!(h.c.stats().malformed_total(), 0);

    h.fire();
    let r = h.one_tx();
    let mut broken = h.srv.clone();
    broken.extra = vec![(121, vec![24, 198, 51, 100, 192, 0])];
    h.feed(&broken.ack(&r)).unwrap();
    assert_eq!(h.c.state(), State::Bound);
    match h.ev().as_slice() {
        [Event::Changed { old, new }] => {
            assert_eq!(old.routes, good);
            fallback_to_option_3(new);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        h.c.take_malformed_options(),
        vec![(LeaseOption::ClasslessStaticRoute, 1)]
    );
}

#[test]
fn required_options_still_refuse_the_reply() {
    use crate::DropReason;
    let mut h = H::new(cfg());
    let d = h.one_tx();
    let mut srv = h.srv.clone();
    srv.lease_secs = None;
    srv.extra.push((51, vec![0, 0, 14]));
    assert_eq!(h.feed(&srv.offer(&d)), Err(DropReason::BadLeaseTime));
    srv.extra = vec![];
    assert_eq!(h.feed(&srv.offer(&d)), Err(DropReason::MissingLeaseTime));
    assert_eq!(h.c.state(), State::Selecting);
    assert_eq!(h.c.stats().malformed_total(), 0);
    assert!(h.c.take_malformed_options().is_empty());
}

#[test]
fn several_malformed_options_in_one_reply_are_each_counted() {
    let mut h = H::new(cfg());
    h.srv.dns.clear();
    h.srv.extra = vec![
        (121, vec![40]),
        (6, vec![1, 2, 3]),
        (26, vec![0]),
        (58, vec![]),
    ];
    let l = h.bind();
    fallback_to_option_3(&l);
    assert_eq!(l.mtu, None);
    assert_eq!(
        h.c.take_malformed_options(),
        vec![
            (LeaseOption::DomainNameServer, 2),
            (LeaseOption::InterfaceMtu, 2),
            (LeaseOption::RenewalTime, 2),
            (LeaseOption::ClasslessStaticRoute, 2),
        ]
    );
    assert_eq!(h.c.stats().malformed_total(), 8);
}
