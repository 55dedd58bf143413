//! Every RFC 2131 transition, in virtual time.

use std::net::Ipv4Addr;
use std::time::Duration;

use dhcproto::v4::{DhcpOption, MessageType};

use super::server::{
    ADDR, CLIENT_MAC, H, OTHER_SERVER_IP, OTHER_SERVER_MAC, Request, SERVER_IP, SERVER_MAC, Server,
    WALL0, cfg,
};
use crate::{
    Client, ClientConfig, Destination, DropReason, Event, ExpiredLeasePolicy, Lease, LostReason,
    MessageKind, Mode, PacketSource, PlannedXids, State,
};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[test]
fn dora_reaches_bound_with_rfc_message_shapes() {
    let mut h = H::new(cfg());
    assert_eq!(h.c.state(), State::Selecting);
    assert_eq!(h.c.requesting(), None, "no offer chosen yet");
    let d = h.one_tx();
    assert_eq!(d.kind, MessageKind::Discover);
    assert_eq!(d.dst, Destination::Broadcast);
    assert_eq!(d.src_ip, Ipv4Addr::UNSPECIFIED);
    assert_eq!(d.xid, h.c.xid());
    let dm = Request::decode(&d);
    assert_eq!(dm.msg_type(), MessageType::Discover);
    assert_eq!(dm.msg.xid(), d.xid);
    assert_eq!(dm.msg.chaddr(), &CLIENT_MAC);
    assert_eq!(dm.msg.secs(), 0);
    assert_eq!(dm.server_id(), None);
    assert!(
        matches!(dm.opt(61), Some(DhcpOption::ClientIdentifier(id)) if id == &[1, 2, 0, 0, 0, 0, 1])
    );
    assert!(matches!(dm.opt(12), Some(DhcpOption::Hostname(n)) if n == "pod-a"));
    assert!(matches!(dm.opt(57), Some(DhcpOption::MaxMessageSize(1500))));
    assert!(dm.opt(55).is_some());

    // OFFER → REQUESTING; REQUEST keeps the xid, carries 50 and 54.
    h.now += Duration::from_millis(300);
    let offer = h.srv.offer(&d);
    h.feed(&offer).unwrap();
    assert_eq!(h.c.state(), State::Requesting);
    assert_eq!(h.c.requesting(), Some(ADDR), "the offered address is out");
    let r = h.one_tx();
    let rm = Request::decode(&r);
    assert_eq!(r.kind, MessageKind::Request);
    assert_eq!(
        r.xid, d.xid,
        "REQUEST after OFFER keeps the xid (RFC 2131 Table 5)"
    );
    assert_eq!(r.dst, Destination::Broadcast);
    assert_eq!(rm.requested_ip(), Some(ADDR));
    assert_eq!(rm.server_id(), Some(SERVER_IP));
    assert_eq!(rm.msg.ciaddr(), Ipv4Addr::UNSPECIFIED);

    // ACK → BOUND with the lease.
    h.now += Duration::from_millis(200);
    let ack = h.srv.ack(&r);
    h.feed(&ack).unwrap();
    assert_eq!(h.c.state(), State::Bound);
    assert_eq!(h.c.requesting(), None, "nothing is out once bound");
    let ev = h.ev();
    let [Event::Bound(lease)] = ev.as_slice() else {
        panic!("{ev:?}")
    };
    assert_eq!(lease.address, ADDR);
    assert_eq!(lease.prefix_len, 24);
    assert_eq!(lease.server_id, SERVER_IP);
    assert_eq!(lease.server_mac, Some(SERVER_MAC));
    assert_eq!(lease.routers, vec![SERVER_IP]);
    assert_eq!(lease.lease_time, secs(3600));
    assert_eq!(lease.t1, secs(1800));
    assert_eq!(lease.t2, secs(3150));
    // Lease times count from when the REQUEST was sent (RFC 2131 §4.4.1).
    assert_eq!(lease.acquired_unix_ms, WALL0 + 300);
    assert_eq!(h.c.lease(), Some(lease));
    assert_eq!(
        h.c.poll_timeout(),
        Some(h.t0 + Duration::from_millis(300) + secs(1800))
    );
    assert_eq!(h.c.stats().leases_bound, 1);
    assert_eq!(h.c.stats().lease_times_missing, 2);
    let t = h.c.lease_timers().unwrap();
    let sent = h.t0 + Duration::from_millis(300);
    assert_eq!(t.t1, Some(sent + secs(1800)));
    assert_eq!(t.t2, Some(sent + secs(3150)));
    assert_eq!(t.expires, Some(sent + secs(3600)));
    assert_eq!(lease.expires_unix_ms(), Some(WALL0 + 300 + 3_600_000));
    assert!(h.tx().is_empty());
}

#[test]
fn discover_retransmits_with_backoff_and_secs() {
    let mut h = H::new(cfg());
    let first = h.one_tx();
    let mut last = h.now;
    let mut gaps = Vec::new();
    for attempt in 0..3 {
        let t = h.fire();
        let d = h.one_tx();
        assert_eq!(d.kind, MessageKind::Discover);
        assert_eq!(d.xid, first.xid, "retransmissions keep the xid");
        let gap = t - last;
        let base = secs(4 << attempt);
        assert!(gap + secs(1) >= base && gap <= base + secs(1), "{gap:?}");
        gaps.push(gap);
        last = t;
        assert_eq!(
            u64::from(Request::decode(&d).msg.secs()),
            h.elapsed().as_secs(),
            "secs counts from the start of the acquisition"
        );
    }
    assert_eq!(h.c.stats().retransmits, 3);
    assert_eq!(h.c.stats().discovers_sent, 4);
}

#[test]
fn acquisition_deadline_fails_with_what_was_heard() {
    let mut h = H::new(cfg());
    h.tx();
    while h.c.state() == State::Selecting {
        h.fire();
        h.tx();
    }
    assert_eq!(h.c.state(), State::Failed);
    assert_eq!(h.elapsed(), secs(30));
    assert_eq!(h.c.poll_timeout(), None);
    let ev = h.ev();
    let [Event::Failed(err)] = ev.as_slice() else {
        panic!("{ev:?}")
    };
    assert!(err.heard_nothing());
    assert!((3..=4).contains(&err.discovers_sent), "{err:?}");
    assert_eq!(err.label(), "no_reply");
    let text = err.to_string();
    assert!(text.contains("heard nothing"), "{text}");
    assert!(text.contains("30.0s"), "{text}");
    assert_eq!(h.c.stats().acquisitions_failed, 1);

    // restart() begins a fresh acquisition.
    h.c.restart(h.now);
    assert_eq!(h.c.state(), State::Selecting);
    assert_eq!(h.one_tx().kind, MessageKind::Discover);
}

#[test]
fn failure_names_servers_offers_and_naks() {
    let mut h = H::new(ClientConfig {
        acquire_timeout: secs(10),
        ..cfg()
    });
    let d = h.one_tx();
    let offer = h.srv.offer(&d);
    h.feed(&offer).unwrap();
    let r = h.one_tx();
    let nak = h.srv.nak(&r, Some("address in use\nX"));
    h.feed(&nak).unwrap();
    let d2 = h.one_tx();
    // A reply for us that is invalid is counted as heard.
    let mut bad = h.srv.offer(&d2);
    bad[236] = 0;
    assert_eq!(h.feed(&bad), Err(DropReason::BadCookie));
    let offer = h.srv.offer(&d2);
    h.feed(&offer).unwrap();
    while h.c.state() != State::Failed {
        h.fire();
    }
    let ev = h.ev();
    let Some(Event::Failed(err)) = ev.last() else {
        panic!("{ev:?}")
    };
    assert_eq!(err.servers_requested, vec![SERVER_IP]);
    assert_eq!(err.offers.len(), 2);
    assert_eq!(err.naks.len(), 1);
    assert_eq!(err.naks[0].message.as_deref(), Some("address in use?X"));
    assert_eq!(err.dropped, 1);
    assert_eq!(err.last_drop, Some(DropReason::BadCookie));
    assert_eq!(err.label(), "nak");
    let text = err.to_string();
    assert!(text.contains("2 offer(s) from 192.0.2.1"), "{text}");
    assert!(text.contains("1 NAK(s) from 192.0.2.1"), "{text}");
    assert!(text.contains("requested from 192.0.2.1"), "{text}");
    assert!(text.contains("bad_cookie"), "{text}");
}

#[test]
fn request_silence_falls_back_to_init_with_new_xid() {
    let mut h = H::new(ClientConfig {
        acquire_timeout: secs(300),
        ..cfg()
    });
    let d = h.one_tx();
    let offer = h.srv.offer(&d);
    h.feed(&offer).unwrap();
    h.one_tx();
    for _ in 0..3 {
        h.fire();
        assert_eq!(h.one_tx().kind, MessageKind::Request);
        assert_eq!(h.c.state(), State::Requesting);
    }
    h.fire();
    assert_eq!(h.c.state(), State::Selecting);
    let d2 = h.one_tx();
    assert_eq!(d2.kind, MessageKind::Discover);
    assert_ne!(d2.xid, d.xid);
    assert_eq!(h.c.stats().request_timeouts, 1);
}

#[test]
fn first_valid_offer_wins_and_later_offers_are_dropped() {
    let mut h = H::new(cfg());
    let d = h.one_tx();
    // An invalid offer (a lease time of 3 octets) does not win.
    let mut bad = h.srv.clone();
    bad.lease_secs = None;
    bad.extra.push((51, vec![0, 14, 16]));
    assert_eq!(h.feed(&bad.offer(&d)), Err(DropReason::BadLeaseTime));
    assert_eq!(h.c.state(), State::Selecting);
    let other = Server {
        ip: OTHER_SERVER_IP,
        mac: OTHER_SERVER_MAC,
        ..Server::default()
    };
    let o2 = other.offer(&d);
    h.feed_from(other.src(), &o2).unwrap();
    assert_eq!(h.c.state(), State::Requesting);
    let r = h.one_tx();
    assert_eq!(Request::decode(&r).server_id(), Some(OTHER_SERVER_IP));
    // The first server's (late) offer is ignored.
    assert_eq!(h.feed(&h.srv.offer(&d)), Err(DropReason::UnexpectedType));
    // An ACK from a server we did not select is dropped (server id check).
    assert_eq!(h.feed(&h.srv.ack(&r)), Err(DropReason::WrongServer));
    // ... and so is a NAK from it.
    assert_eq!(h.feed(&h.srv.nak(&r, None)), Err(DropReason::WrongServer));
    h.feed_from(other.src(), &other.ack(&r)).unwrap();
    assert_eq!(h.c.lease().unwrap().server_id, OTHER_SERVER_IP);
    assert_eq!(h.c.lease().unwrap().server_mac, Some(OTHER_SERVER_MAC));
    assert_eq!(h.c.stats().dropped(DropReason::WrongServer), 2);
    assert_eq!(h.c.stats().dropped(DropReason::UnexpectedType), 1);
    assert_eq!(h.c.stats().dropped(DropReason::BadLeaseTime), 1);
}

#[test]
fn ack_for_other_address_is_dropped() {
    let mut h = H::new(cfg());
    let d = h.one_tx();
    h.feed(&h.srv.offer(&d)).unwrap();
    let r = h.one_tx();
    let wrong = h
        .srv
        .reply(&r, MessageType::Ack, Ipv4Addr::new(192, 0, 2, 99));
    assert_eq!(h.feed(&wrong), Err(DropReason::BadAddress));
    assert_eq!(h.c.state(), State::Requesting);
}

#[test]
fn foreign_replies_are_dropped_and_counted() {
    let mut h = H::new(cfg());
    let d = h.one_tx();
    let good = h.srv.offer(&d);

    let mut wrong_xid = good.clone();
    wrong_xid[4] ^= 0xff;
    assert_eq!(h.feed(&wrong_xid), Err(DropReason::WrongXid));
    let mut wrong_mac = good.clone();
    wrong_mac[33] ^= 1;
    assert_eq!(h.feed(&wrong_mac), Err(DropReason::WrongChaddr));
    let mut request = good.clone();
    request[0] = 1;
    assert_eq!(h.feed(&request), Err(DropReason::NotBootReply));
    assert_eq!(h.feed(&good[..200]), Err(DropReason::Truncated));
    let mut cookie = good.clone();
    cookie[238] = 0;
    assert_eq!(h.feed(&cookie), Err(DropReason::BadCookie));
    let mut foreign_id = h.srv.clone();
    foreign_id.extra.push((61, vec![1, 2, 0, 0, 0, 0, 2]));
    assert_eq!(
        h.feed(&foreign_id.offer(&d)),
        Err(DropReason::WrongClientId)
    );
    let mut echoed = h.srv.clone();
    echoed.extra.push((61, vec![1, 2, 0, 0, 0, 0, 1]));
    let mut no_sid = h.srv.offer(&d);
    // Turn option 54 into an unknown option 254.
    let pos = no_sid
        .windows(6)
        .position(|w| w == [54, 4, 192, 0, 2, 1])
        .unwrap();
    no_sid[pos] = 254;
    assert_eq!(h.feed(&no_sid), Err(DropReason::MissingServerId));
    let mut no_lease = h.srv.clone();
    no_lease.lease_secs = None;
    assert_eq!(
        h.feed(&no_lease.offer(&d)),
        Err(DropReason::MissingLeaseTime)
    );
    let mut zero = h.srv.clone();
    zero.lease_secs = Some(0);
    assert_eq!(h.feed(&zero.offer(&d)), Err(DropReason::ZeroLeaseTime));
    let ack_in_selecting = h.srv.ack(&d);
    assert_eq!(h.feed(&ack_in_selecting), Err(DropReason::UnexpectedType));
    assert_eq!(h.c.state(), State::Selecting);
    assert!(h.ev().is_empty() && h.tx().is_empty());
    assert_eq!(h.c.stats().dropped_total(), 10);
    // An echoed client id (RFC 6842) is fine.
    h.feed(&echoed.offer(&d)).unwrap();
    assert_eq!(h.c.state(), State::Requesting);
    let labels: Vec<_> =
        h.c.stats()
            .dropped_by_reason()
            .map(|(r, n)| (r.label(), n))
            .collect();
    assert!(labels.contains(&("wrong_xid", 1)), "{labels:?}");
}

#[test]
fn replies_in_bound_are_dropped_as_wrong_state() {
    let mut h = H::new(cfg());
    let d = h.one_tx();
    let offer = h.srv.offer(&d);
    h.feed(&offer).unwrap();
    let r = h.one_tx();
    let ack = h.srv.ack(&r);
    h.feed(&ack).unwrap();
    assert_eq!(h.feed(&ack), Err(DropReason::WrongState));
    assert_eq!(h.feed(&h.srv.nak(&r, None)), Err(DropReason::WrongState));
    assert_eq!(h.c.state(), State::Bound);
}

fn bound(h: &mut H) -> Lease {
    h.bind()
}

#[test]
fn t1_is_fuzzed_earlier_so_leases_granted_together_renew_apart() {
    // The default configuration: up to 5 % of T1 early (90 s of 1800 s).
    let mut fired = Vec::new();
    for seed in 0..20 {
        let mut c = cfg();
        c.retransmit.renew_fuzz_permille = ClientConfig::default().retransmit.renew_fuzz_permille;
        let mut h = H::with_seed(c, seed);
        h.bind();
        let t1 = h.fire();
        assert_eq!(h.c.state(), State::Renewing);
        let offset = t1 - h.t0;
        assert!(
            offset <= secs(1800) && offset >= secs(1710),
            "seed {seed}: renewed at {offset:?}, outside [T1 - 5 %, T1]"
        );
        fired.push(offset);
    }
    fired.sort();
    fired.dedup();
    assert!(
        fired.len() > 15,
        "20 clients renewed at only {} instants",
        fired.len()
    );
}

#[test]
fn renewing_at_t1_is_unicast_from_the_leased_address() {
    let mut h = H::new(cfg());
    let lease = bound(&mut h);
    let bound_xid = h.c.xid();
    let t1 = h.fire();
    assert_eq!(t1, h.t0 + secs(1800));
    assert_eq!(h.c.state(), State::Renewing);
    let r = h.one_tx();
    assert_ne!(r.xid, bound_xid, "a renewal is a new transaction");
    assert_eq!(r.xid, h.c.xid());
    assert_eq!(r.src_ip, ADDR);
    assert_eq!(
        r.dst,
        Destination::Unicast {
            ip: SERVER_IP,
            mac: Some(SERVER_MAC)
        }
    );
    let rm = Request::decode(&r);
    assert_eq!(rm.msg_type(), MessageType::Request);
    assert_eq!(rm.msg.ciaddr(), ADDR);
    assert_eq!(rm.requested_ip(), None, "no option 50 when RENEWING");
    assert_eq!(rm.server_id(), None, "no option 54 when RENEWING");
    assert_eq!(rm.msg.secs(), 0);

    h.now += secs(2);
    let mut srv = h.srv.clone();
    srv.lease_secs = Some(7200);
    h.feed(&srv.ack(&r)).unwrap();
    assert_eq!(h.c.state(), State::Bound);
    let ev = h.ev();
    let [Event::Renewed(new)] = ev.as_slice() else {
        panic!("{ev:?}")
    };
    assert!(new.same_config(&lease));
    assert_eq!(new.lease_time, secs(7200));
    assert_eq!(new.acquired_unix_ms, WALL0 + 1_800_000);
    assert_eq!(h.c.poll_timeout(), Some(t1 + secs(3600)));
    assert_eq!(h.c.stats().renewals, 1);
}

#[test]
fn renewing_retransmits_per_rfc2131_4_4_5() {
    let mut h = H::new(cfg());
    h.srv.lease_secs = Some(1000);
    h.srv.t1 = Some(500);
    h.srv.t2 = Some(875);
    bound(&mut h);
    let t1 = h.fire();
    h.tx();
    // Half the time to T2 (187.5 s), then 93.75 s, then the 60 s minimum,
    // then T2 itself.
    let mut times = Vec::new();
    while h.c.state() == State::Renewing {
        let t = h.fire();
        times.push(t - t1);
        let tx = h.tx();
        assert_eq!(tx.len(), 1);
    }
    assert_eq!(
        times,
        vec![
            Duration::from_millis(187_500),
            Duration::from_millis(281_250),
            Duration::from_millis(341_250),
            secs(375),
        ]
    );
    assert_eq!(h.c.state(), State::Rebinding);
}

#[test]
fn retransmit_now_resends_a_renewal_at_once_and_keeps_its_schedule_after() {
    let mut h = H::new(cfg());
    h.srv.lease_secs = Some(1000);
    h.srv.t1 = Some(500);
    h.srv.t2 = Some(875);
    bound(&mut h);
    // Bound: nothing in flight, nothing to send.
    h.c.retransmit_now(h.now);
    h.c.handle_timeout(h.now);
    assert!(h.tx().is_empty());
    let t1 = h.fire();
    let first = h.one_tx();
    assert_eq!(h.c.state(), State::Renewing);
    // Ten seconds on (the next retransmission is 187.5 s away), the reply
    // may have been lost: the REQUEST goes again now, same transaction.
    h.advance(secs(10));
    assert!(h.tx().is_empty());
    h.c.retransmit_now(h.now);
    assert_eq!(h.c.poll_timeout(), Some(h.now));
    h.c.handle_timeout(h.now);
    let again = h.one_tx();
    assert_eq!(again.xid, first.xid);
    assert_eq!(again.kind, first.kind);
    assert_eq!(again.dst, first.dst);
    // Unanswered, it goes once more 3 s on (the new path may still have
    // been settling), then the RFC's schedule again: half the time to T2.
    let quick = h.fire();
    assert_eq!(quick - t1, secs(13));
    assert_eq!(h.one_tx().xid, first.xid);
    let next = h.fire();
    assert_eq!(next - quick, secs(181));
    assert_eq!(h.c.state(), State::Renewing);
}

#[test]
fn rebinding_at_t2_is_broadcast_and_any_server_may_answer() {
    let mut h = H::new(cfg());
    let old = bound(&mut h);
    h.fire(); // T1
    let renew = h.one_tx();
    // The leasing server stays silent; another server's ACK is not accepted
    // while RENEWING.
    let other = Server {
        ip: OTHER_SERVER_IP,
        mac: OTHER_SERVER_MAC,
        ..Server::default()
    };
    assert_eq!(
        h.feed_from(other.src(), &other.ack(&renew)),
        Err(DropReason::WrongServer)
    );
    while h.c.state() == State::Renewing {
        h.fire();
    }
    assert_eq!(h.c.state(), State::Rebinding);
    assert_eq!(h.elapsed(), secs(3150));
    let tx = h.tx();
    let rb = tx.last().unwrap();
    assert_eq!(rb.dst, Destination::Broadcast);
    assert_eq!(rb.src_ip, ADDR);
    assert_ne!(rb.xid, renew.xid);
    let rm = Request::decode(rb);
    assert_eq!(rm.msg.ciaddr(), ADDR);
    assert_eq!(rm.server_id(), None);
    assert_eq!(
        u64::from(rm.msg.secs()),
        3150 - 1800,
        "secs counts from the start of renewal"
    );
    h.feed_from(other.src(), &other.ack(rb)).unwrap();
    assert_eq!(h.c.state(), State::Bound);
    let ev = h.ev();
    let [Event::Changed { old: o, new }] = ev.as_slice() else {
        panic!("{ev:?}")
    };
    assert_eq!(o, &old);
    assert_eq!(new.server_id, OTHER_SERVER_IP);
    assert_eq!(new.server_mac, Some(OTHER_SERVER_MAC));
    assert_eq!(h.c.stats().rebinds, 1);
    // The next renewal goes to the new server.
    h.fire();
    assert_eq!(
        h.one_tx().dst,
        Destination::Unicast {
            ip: OTHER_SERVER_IP,
            mac: Some(OTHER_SERVER_MAC)
        }
    );
}

#[test]
fn expiry_returns_to_init_and_reports_lost() {
    let mut h = H::new(cfg());
    bound(&mut h);
    while h.c.state() != State::Selecting {
        h.fire();
    }
    assert_eq!(h.elapsed(), secs(3600));
    let ev = h.ev();
    assert_eq!(
        ev,
        vec![Event::Lost {
            reason: LostReason::Expired
        }]
    );
    assert_eq!(h.c.lease(), None);
    let tx = h.tx();
    let d = tx.last().unwrap();
    assert_eq!(d.kind, MessageKind::Discover);
    assert_eq!(d.src_ip, Ipv4Addr::UNSPECIFIED);
    assert_eq!(
        Request::decode(d).requested_ip(),
        Some(ADDR),
        "DISCOVER hints the old address"
    );
    assert_eq!(h.c.stats().expirations, 1);
    // And a new lease can be obtained.
    let offer = h.srv.offer(d);
    h.feed(&offer).unwrap();
    let r = h.one_tx();
    h.feed(&h.srv.ack(&r)).unwrap();
    assert!(matches!(h.ev().as_slice(), [Event::Bound(_)]));
}

#[test]
fn late_timer_past_t2_goes_straight_to_rebinding() {
    let mut h = H::new(cfg());
    bound(&mut h);
    h.advance(secs(3200));
    assert_eq!(h.c.state(), State::Rebinding);
    let tx = h.tx();
    assert_eq!(tx.len(), 1);
    assert_eq!(tx[0].dst, Destination::Broadcast);
    // Far past expiry: lost.
    h.advance(secs(10_000));
    assert_eq!(h.c.state(), State::Selecting);
    assert!(h.ev().contains(&Event::Lost {
        reason: LostReason::Expired
    }));
}

#[test]
fn nak_in_requesting_restarts_at_once_with_new_xid() {
    let mut h = H::new(cfg());
    let d = h.one_tx();
    h.feed(&h.srv.offer(&d)).unwrap();
    let r = h.one_tx();
    h.feed(&h.srv.nak(&r, Some("wrong network"))).unwrap();
    assert_eq!(h.c.state(), State::Selecting);
    assert_eq!(
        h.ev(),
        vec![Event::Nak {
            server: SERVER_IP,
            message: Some("wrong network".into())
        }]
    );
    let d2 = h.one_tx();
    assert_eq!(d2.kind, MessageKind::Discover);
    assert_ne!(d2.xid, d.xid);
    assert_eq!(Request::decode(&d2).requested_ip(), None);
    // Replies to the old transaction are now foreign.
    assert_eq!(h.feed(&h.srv.ack(&r)), Err(DropReason::WrongXid));
}

#[test]
fn nak_while_renewing_or_rebinding_loses_the_lease() {
    for rebinding in [false, true] {
        let mut h = H::new(cfg());
        bound(&mut h);
        h.fire();
        if rebinding {
            while h.c.state() == State::Renewing {
                h.fire();
            }
        }
        let tx = h.tx();
        let r = tx.last().unwrap();
        h.feed(&h.srv.nak(r, None)).unwrap();
        assert_eq!(h.c.state(), State::Selecting);
        assert_eq!(
            h.ev(),
            vec![
                Event::Nak {
                    server: SERVER_IP,
                    message: None
                },
                Event::Lost {
                    reason: LostReason::Nak { server: SERVER_IP }
                }
            ]
        );
        assert_eq!(h.c.lease(), None);
        assert_eq!(h.one_tx().kind, MessageKind::Discover);
    }
}

#[test]
fn nak_storm_backs_off_boundedly_and_ends_bound() {
    // Ten NAKs in a row within the default 30 s deadline.
    for seed in 0..20 {
        let mut h = H::with_seed(cfg(), seed);
        let mut xids = std::collections::HashSet::new();
        let mut last_discover = h.now;
        for n in 1..=10u32 {
            if n >= 3 {
                assert_eq!(h.c.state(), State::Init, "repeated NAKs must back off");
                let t = h.fire();
                let gap = t - last_discover;
                let cap = h.c.config().retransmit.nak_backoff_max;
                assert!(gap <= cap, "NAK backoff exceeded its cap: {gap:?}");
                assert!(!gap.is_zero());
            }
            assert_eq!(h.c.state(), State::Selecting, "seed {seed} nak {n}");
            let d = h.one_tx();
            last_discover = h.now;
            assert!(xids.insert(d.xid), "new xid after every NAK");
            h.feed(&h.srv.offer(&d)).unwrap();
            let r = h.one_tx();
            h.feed(&h.srv.nak(&r, None)).unwrap();
            if n == 1 {
                assert_eq!(h.c.state(), State::Selecting, "first NAK restarts at once");
            }
        }
        if h.c.state() == State::Init {
            h.fire();
        }
        assert_eq!(h.ev().len(), 10, "one Nak event per NAK");
        let lease = h.bind();
        assert_eq!(lease.address, ADDR);
        assert!(h.elapsed() < secs(30), "{:?}", h.elapsed());
        assert_eq!(h.c.stats().naks_received, 10);
    }
}

#[test]
fn long_nak_storm_is_rate_limited_and_still_binds() {
    let mut h = H::new(ClientConfig {
        acquire_timeout: secs(600),
        ..cfg()
    });
    for _ in 0..100 {
        if h.c.state() == State::Init {
            h.fire();
        }
        let d = h.one_tx();
        h.feed(&h.srv.offer(&d)).unwrap();
        let r = h.one_tx();
        h.feed(&h.srv.nak(&r, None)).unwrap();
    }
    // 100 NAKs took at least ~ (100 - 6) × 2 s at the 4 s cap × [0.5, 1].
    assert!(h.elapsed() > secs(180), "{:?}", h.elapsed());
    assert!(h.elapsed() < secs(400), "{:?}", h.elapsed());
    if h.c.state() == State::Init {
        h.fire();
    }
    h.ev();
    h.bind();
}

#[test]
fn init_reboot_requests_the_old_address() {
    let mut h = H::new(ClientConfig {
        requested_ip: Some(ADDR),
        ..cfg()
    });
    assert_eq!(h.c.state(), State::Rebooting);
    let r = h.one_tx();
    let rm = Request::decode(&r);
    assert_eq!(rm.msg_type(), MessageType::Request);
    assert_eq!(r.dst, Destination::Broadcast);
    assert_eq!(r.src_ip, Ipv4Addr::UNSPECIFIED);
    assert_eq!(rm.requested_ip(), Some(ADDR));
    assert_eq!(rm.server_id(), None, "INIT-REBOOT must not send option 54");
    assert_eq!(rm.msg.ciaddr(), Ipv4Addr::UNSPECIFIED);
    // An ACK for another address is refused.
    let other = h
        .srv
        .reply(&r, MessageType::Ack, Ipv4Addr::new(192, 0, 2, 77));
    assert_eq!(h.feed(&other), Err(DropReason::BadAddress));
    h.feed(&h.srv.ack(&r)).unwrap();
    assert_eq!(h.c.state(), State::Bound);
    assert!(matches!(h.ev().as_slice(), [Event::Bound(l)] if l.address == ADDR));
}

#[test]
fn init_reboot_nak_goes_to_init() {
    let mut h = H::new(ClientConfig {
        requested_ip: Some(ADDR),
        ..cfg()
    });
    let r = h.one_tx();
    // Any server may NAK an INIT-REBOOT request.
    let other = Server {
        ip: OTHER_SERVER_IP,
        ..Server::default()
    };
    h.feed_from(other.src(), &other.nak(&r, None)).unwrap();
    assert_eq!(h.c.state(), State::Selecting);
    let d = h.one_tx();
    assert_eq!(d.kind, MessageKind::Discover);
    assert_eq!(Request::decode(&d).requested_ip(), None);
}

#[test]
fn init_reboot_silence_falls_back_to_discover() {
    let mut h = H::new(ClientConfig {
        requested_ip: Some(ADDR),
        ..cfg()
    });
    let r1 = h.one_tx();
    h.fire();
    let r2 = h.one_tx();
    assert_eq!(r2.xid, r1.xid);
    assert_eq!(h.c.state(), State::Rebooting);
    h.fire();
    assert_eq!(h.c.state(), State::Selecting);
    let d = h.one_tx();
    assert_eq!(d.kind, MessageKind::Discover);
    assert_eq!(Request::decode(&d).requested_ip(), Some(ADDR));
    assert!(h.elapsed() < secs(15));
    assert_eq!(h.c.stats().reboot_fallbacks, 1);
    h.feed(&h.srv.offer(&d)).unwrap();
    let r = h.one_tx();
    h.feed(&h.srv.ack(&r)).unwrap();
    assert_eq!(h.c.state(), State::Bound);
}

#[test]
fn release_is_unicast_from_the_leased_address() {
    let mut h = H::new(cfg());
    bound(&mut h);
    h.c.release(h.now);
    assert_eq!(h.c.state(), State::Released);
    let t = h.one_tx();
    assert_eq!(t.kind, MessageKind::Release);
    assert!(!t.expects_reply());
    assert_eq!(t.src_ip, ADDR);
    assert_eq!(
        t.dst,
        Destination::Unicast {
            ip: SERVER_IP,
            mac: Some(SERVER_MAC)
        }
    );
    let m = Request::decode(&t);
    assert_eq!(m.msg_type(), MessageType::Release);
    assert_eq!(m.msg.ciaddr(), ADDR);
    assert_eq!(m.server_id(), Some(SERVER_IP));
    assert_eq!(m.requested_ip(), None);
    assert!(m.opt(61).is_some());
    assert!(m.opt(55).is_none() && m.opt(12).is_none());
    assert_eq!(t.xid, h.c.xid());
    assert_eq!(h.c.poll_timeout(), None);
    assert_eq!(h.c.lease(), None);
    assert_eq!(h.c.stats().releases_sent, 1);
    // Nothing more happens.
    h.advance(secs(100_000));
    assert!(h.tx().is_empty());
}

#[test]
fn release_while_renewing_discards_unsent_request() {
    let mut h = H::new(cfg());
    bound(&mut h);
    h.fire();
    assert_eq!(h.c.state(), State::Renewing);
    h.c.release(h.now);
    let tx = h.tx();
    assert_eq!(tx.len(), 1);
    assert_eq!(tx[0].kind, MessageKind::Release);
}

#[test]
fn release_without_lease_sends_nothing() {
    let mut h = H::new(cfg());
    h.tx();
    h.c.release(h.now);
    assert_eq!(h.c.state(), State::Released);
    assert!(h.tx().is_empty());
}

/// The RELEASE of an address no ACK was heard for, as the server that
/// offered it sees it.
fn assert_unanswered_release(t: &crate::Transmit) {
    assert_eq!(t.kind, MessageKind::Release);
    assert_eq!(t.src_ip, ADDR);
    assert_eq!(
        t.dst,
        Destination::Unicast {
            ip: SERVER_IP,
            mac: None
        }
    );
    let m = Request::decode(t);
    assert_eq!(m.msg_type(), MessageType::Release);
    assert_eq!(m.msg.ciaddr(), ADDR);
    assert_eq!(m.server_id(), Some(SERVER_IP));
}

#[test]
fn release_with_the_request_out_gives_the_offered_address_back() {
    // The server may have committed the lease to an ACK the client never
    // heard: released, it frees the address instead of holding it.
    let mut h = H::new(cfg());
    let d = h.one_tx();
    h.feed(&h.srv.offer(&d)).unwrap();
    assert_eq!(h.c.state(), State::Requesting);
    assert_eq!(h.c.requesting_from(), Some(SERVER_IP));
    h.tx();
    h.c.release(h.now);
    assert_eq!(h.c.state(), State::Released);
    let tx = h.tx();
    assert_eq!(tx.len(), 1, "{tx:?}");
    assert_unanswered_release(&tx[0]);
    assert_eq!(h.c.stats().releases_sent, 1);
}

#[test]
fn release_while_asking_again_for_an_earlier_request_gives_it_back_to_its_server() {
    // A successor asking again (INIT-REBOOT) for the address an earlier
    // client's REQUEST was out for, knowing the server that offered it.
    let mut h = H::new(ClientConfig {
        requested_ip: Some(ADDR),
        requested_from: Some(SERVER_IP),
        ..cfg()
    });
    assert_eq!(h.c.state(), State::Rebooting);
    h.tx();
    h.c.release(h.now);
    let tx = h.tx();
    assert_eq!(tx.len(), 1, "{tx:?}");
    assert_unanswered_release(&tx[0]);

    // Without the server (a migrating VM's INIT-REBOOT): nothing to release.
    let mut h = H::new(ClientConfig {
        requested_ip: Some(ADDR),
        ..cfg()
    });
    h.tx();
    h.c.release(h.now);
    assert!(h.tx().is_empty());
}

#[test]
fn decline_bound_address_then_avoid_it() {
    let mut h = H::new(cfg());
    bound(&mut h);
    h.c.decline(h.now);
    assert_eq!(h.c.state(), State::Init);
    assert_eq!(
        h.ev(),
        vec![Event::Lost {
            reason: LostReason::Declined
        }]
    );
    let t = h.one_tx();
    assert_eq!(t.kind, MessageKind::Decline);
    assert_eq!(t.dst, Destination::Broadcast);
    assert_eq!(t.src_ip, Ipv4Addr::UNSPECIFIED);
    let m = Request::decode(&t);
    assert_eq!(m.msg_type(), MessageType::Decline);
    assert_eq!(m.requested_ip(), Some(ADDR));
    assert_eq!(m.server_id(), Some(SERVER_IP));
    assert_eq!(m.msg.ciaddr(), Ipv4Addr::UNSPECIFIED);
    // RFC 2131 §3.1: wait at least ten seconds.
    assert_eq!(h.c.poll_timeout(), Some(h.now + secs(10)));
    h.fire();
    let d = h.one_tx();
    assert_eq!(d.kind, MessageKind::Discover);
    assert_eq!(h.feed(&h.srv.offer(&d)), Err(DropReason::DeclinedAddress));
    let other = h
        .srv
        .reply(&d, MessageType::Offer, Ipv4Addr::new(192, 0, 2, 11));
    h.feed(&other).unwrap();
    assert_eq!(h.c.state(), State::Requesting);
}

#[test]
fn decline_in_requesting_and_noop_elsewhere() {
    let mut h = H::new(cfg());
    let d = h.one_tx();
    h.c.decline(h.now);
    assert!(h.tx().is_empty(), "nothing to decline in SELECTING");
    assert_eq!(h.c.state(), State::Selecting);
    h.feed(&h.srv.offer(&d)).unwrap();
    h.one_tx();
    h.c.decline(h.now);
    let t = h.one_tx();
    assert_eq!(t.kind, MessageKind::Decline);
    assert_eq!(h.c.state(), State::Init);
    assert!(h.ev().is_empty(), "no lease was held");
}

#[test]
fn one_shot_stops_at_bound() {
    let mut h = H::new(ClientConfig {
        mode: Mode::OneShot,
        ..cfg()
    });
    bound(&mut h);
    assert_eq!(h.c.poll_timeout(), None);
    h.advance(secs(100_000));
    assert_eq!(h.c.state(), State::Bound);
    assert!(h.tx().is_empty() && h.ev().is_empty());
    h.c.release(h.now);
    assert_eq!(h.one_tx().kind, MessageKind::Release);
}

#[test]
fn infinite_lease_arms_no_timer() {
    let mut h = H::new(cfg());
    h.srv.lease_secs = Some(u32::MAX);
    let l = bound(&mut h);
    assert!(l.is_infinite());
    assert_eq!(h.c.poll_timeout(), None);
}

#[test]
fn init_delay_waits_in_init() {
    let mut c = cfg();
    c.retransmit.init_delay_max = secs(10);
    let mut h = H::new(c);
    assert_eq!(h.c.state(), State::Init);
    assert!(h.tx().is_empty());
    let t = h.fire();
    assert!(t - h.t0 <= secs(10));
    assert_eq!(h.c.state(), State::Selecting);
    assert_eq!(h.one_tx().kind, MessageKind::Discover);
}

fn stored_lease() -> Lease {
    Lease {
        address: ADDR,
        prefix_len: 24,
        server_id: SERVER_IP,
        server_mac: Some(SERVER_MAC),
        routers: vec![SERVER_IP],
        routes: vec![],
        dns_servers: vec![],
        domain_name: None,
        search: vec![],
        mtu: None,
        lease_time: secs(3600),
        t1: secs(1800),
        t2: secs(3150),
        acquired_unix_ms: WALL0,
        rejected_routes: vec![],
    }
}

#[test]
fn resume_past_t1_spreads_the_renewals_over_the_fuzz_window() {
    // Stopped across T1 (1800 s) and resumed at 2000 s: with the default
    // fuzz (5 % of T1 = 90 s), each client renews within 90 s, not all in
    // the same instant.
    let t0 = std::time::Instant::now();
    let mut at = Vec::new();
    for seed in 0..20 {
        let mut c = cfg();
        c.retransmit.renew_fuzz_permille = ClientConfig::default().retransmit.renew_fuzz_permille;
        let mut client = Client::resume(c, stored_lease(), t0, WALL0 + 2_000_000, seed);
        let first = client.poll_timeout().expect("a renewal is scheduled");
        assert!(
            first <= t0 + secs(90),
            "seed {seed}: renews {:?} after resume",
            first - t0
        );
        if first > t0 {
            assert_eq!(client.state(), State::Bound);
            assert!(
                client.poll_transmit().is_none(),
                "nothing sent before its turn"
            );
        }
        client.handle_timeout(first);
        assert_eq!(client.state(), State::Renewing);
        assert_eq!(client.poll_transmit().unwrap().kind, MessageKind::Request);
        at.push(first);
    }
    at.sort();
    at.dedup();
    assert!(
        at.len() > 15,
        "20 resumed clients renew at only {} instants",
        at.len()
    );
}

#[test]
fn resume_picks_state_from_wall_clock() {
    let t0 = std::time::Instant::now();
    // Before T1: BOUND, T1 timer at the remaining time, nothing sent.
    let mut c = Client::resume(cfg(), stored_lease(), t0, WALL0 + 100_000, 9);
    assert_eq!(c.state(), State::Bound);
    assert_eq!(c.poll_timeout(), Some(t0 + secs(1700)));
    assert!(c.poll_transmit().is_none() && c.poll_event().is_none());
    assert_eq!(c.lease(), Some(&stored_lease()));

    // Between T1 and T2: RENEWING, unicast REQUEST at once, no new DISCOVER.
    let mut c = Client::resume(cfg(), stored_lease(), t0, WALL0 + 2_000_000, 9);
    assert_eq!(c.state(), State::Renewing);
    let t = c.poll_transmit().unwrap();
    assert_eq!(t.kind, MessageKind::Request);
    assert_eq!(t.src_ip, ADDR);
    assert!(matches!(t.dst, Destination::Unicast { ip: SERVER_IP, .. }));
    assert!(c.poll_transmit().is_none());
    // The renewal completes with a normal ACK (same configuration).
    let srv = Server {
        dns: vec![],
        ..Server::default()
    };
    c.handle_packet(t0, srv.src(), &srv.ack(&t)).unwrap();
    assert_eq!(c.state(), State::Bound);
    assert!(matches!(c.poll_event(), Some(Event::Renewed(_))));

    // Between T2 and expiry: REBINDING, broadcast.
    let mut c = Client::resume(cfg(), stored_lease(), t0, WALL0 + 3_200_000, 9);
    assert_eq!(c.state(), State::Rebinding);
    assert_eq!(c.poll_transmit().unwrap().dst, Destination::Broadcast);
    // Half the 400 s left until expiry (RFC 2131 §4.4.5).
    assert_eq!(c.poll_timeout(), Some(t0 + secs(200)));

    // Expired: Lost, then INIT-REBOOT for the same address.
    let mut c = Client::resume(cfg(), stored_lease(), t0, WALL0 + 3_600_000, 9);
    assert_eq!(c.state(), State::Rebooting);
    assert_eq!(
        c.poll_event(),
        Some(Event::Lost {
            reason: LostReason::Expired
        })
    );
    let t = c.poll_transmit().unwrap();
    assert_eq!(Request::decode(&t).requested_ip(), Some(ADDR));
    assert_eq!(Request::decode(&t).server_id(), None);

    // Expired with the Discover policy.
    let mut c = Client::resume(
        ClientConfig {
            expired_lease: ExpiredLeasePolicy::Discover,
            ..cfg()
        },
        stored_lease(),
        t0,
        WALL0 + 9_000_000,
        9,
    );
    assert_eq!(c.state(), State::Selecting);
    let t = c.poll_transmit().unwrap();
    assert_eq!(t.kind, MessageKind::Discover);
    assert_eq!(Request::decode(&t).requested_ip(), Some(ADDR));
}

/// A process stopped with its renewal out; the next one, resumed with the
/// planned xids from the record, adopts the one that was sent: it sends
/// nothing, and the reply to the previous process's REQUEST renews the
/// lease — only that exact transaction: another xid, another chaddr or
/// another server's ACK is dropped.
#[test]
fn a_resumed_lease_adopts_the_renewal_its_previous_process_had_sent() {
    let t0 = std::time::Instant::now();
    let plan = PlannedXids {
        renew: 0x1111_0001,
        rebind: 0x2222_0002,
    };
    // The first process: bound, at T1 it renews with the planned xid.
    let mut first =
        Client::resume_planned(cfg(), stored_lease(), Some(plan), t0, WALL0 + 100_000, 1);
    assert_eq!(first.planned_xids(), Some(plan));
    let t1 = first.poll_timeout().unwrap();
    first.handle_timeout(t1);
    assert_eq!(first.state(), State::Renewing);
    let sent = first.poll_transmit().unwrap();
    assert_eq!(sent.xid, plan.renew);

    // Stopped; the next process resumes 5 s after T1 and adopts it.
    let now = t1 + secs(5);
    let wall = WALL0 + 1_805_000;
    let mut next = Client::resume_planned(cfg(), stored_lease(), Some(plan), now, wall, 2);
    assert_eq!(next.state(), State::Renewing, "past T1");
    assert!(
        !next.adopt_sent(now, 0x3333_0003, secs(3)),
        "not a planned xid"
    );
    assert!(next.adopt_sent(now, plan.renew, secs(3)));
    assert!(next.poll_transmit().is_none(), "nothing sent again");
    assert_eq!(next.adopted(), Some(plan.renew));
    assert_eq!(next.state(), State::Renewing);
    assert_eq!(
        next.poll_timeout(),
        Some(now + secs(3)),
        "sent again after the grace if no reply came, not now"
    );
    let srv = Server {
        dns: vec![],
        ..Server::default()
    };
    // Another xid, another chaddr, another server: dropped.
    let mut other = srv.ack(&sent);
    other[4..8].copy_from_slice(&plan.rebind.to_be_bytes());
    assert_eq!(
        next.handle_packet(now, srv.src(), &other),
        Err(DropReason::WrongXid)
    );
    let mut foreign = srv.ack(&sent);
    foreign[28] ^= 0xff;
    assert_eq!(
        next.handle_packet(now, srv.src(), &foreign),
        Err(DropReason::WrongChaddr)
    );
    let stranger = Server {
        ip: OTHER_SERVER_IP,
        mac: OTHER_SERVER_MAC,
        dns: vec![],
        ..Server::default()
    };
    assert_eq!(
        next.handle_packet(now, stranger.src(), &stranger.ack(&sent)),
        Err(DropReason::WrongServer)
    );
    // The server's reply to the first process's REQUEST renews the lease.
    next.set_wall_clock_unix_ms(wall);
    next.handle_packet(now, srv.src(), &srv.ack(&sent)).unwrap();
    assert_eq!(next.state(), State::Bound);
    let Some(Event::Renewed(lease)) = next.poll_event() else {
        panic!("not renewed")
    };
    // Counted from when that REQUEST can have left at the earliest (T1,
    // no fuzz here), not from the adoption.
    assert_eq!(lease.acquired_unix_ms, WALL0 + 1_800_000);
    assert_eq!(next.adopted(), None);
    let again = next.planned_xids().unwrap();
    assert!(again.renew != plan.renew && again.rebind != plan.rebind);

    // The rebinding's xid adopts REBINDING; an expired lease adopts nothing.
    let mut rebinding =
        Client::resume_planned(cfg(), stored_lease(), Some(plan), now, WALL0 + 3_200_000, 3);
    assert!(rebinding.adopt_sent(now, plan.rebind, secs(3)));
    assert_eq!(rebinding.state(), State::Rebinding);
    assert!(rebinding.poll_transmit().is_none());
    let mut expired =
        Client::resume_planned(cfg(), stored_lease(), Some(plan), now, WALL0 + 3_700_000, 4);
    assert!(!expired.adopt_sent(now, plan.renew, secs(3)));
    // Without a plan (a record of an older agent), nothing is adopted.
    let mut old = Client::resume(cfg(), stored_lease(), now, wall, 5);
    assert!(!old.adopt_sent(now, plan.renew, secs(3)));
    assert!(old.poll_transmit().is_some(), "renews at once, as before");
}

#[test]
fn resume_round_trips_through_json() {
    let mut h = H::new(cfg());
    h.now += secs(1);
    let lease = bound(&mut h);
    let json = serde_json::to_string(&lease).unwrap();
    let back: Lease = serde_json::from_str(&json).unwrap();
    // Restarted 1000 s later (wall and monotonic clocks both moved).
    let t = h.now + secs(1000);
    let c = Client::resume(cfg(), back, t, h.wall() + 1_000_000, 3);
    assert_eq!(c.state(), State::Bound);
    assert_eq!(c.poll_timeout(), Some(t + secs(800)));
}

#[test]
fn resume_repairs_nonsense_lease() {
    let t0 = std::time::Instant::now();
    let mut l = stored_lease();
    l.t1 = secs(5000);
    l.prefix_len = 99;
    let c = Client::resume(cfg(), l, t0, WALL0, 1);
    assert_eq!(c.state(), State::Bound);
    let l = c.lease().unwrap();
    assert!(l.t1 < l.t2 && l.prefix_len == 24);
    assert!(c.stats().stored_lease_repairs >= 2);
    let mut bad = stored_lease();
    bad.address = Ipv4Addr::BROADCAST;
    let c = Client::resume(cfg(), bad, t0, WALL0, 1);
    assert_eq!(c.state(), State::Selecting);
}

#[test]
fn one_shot_resume_does_not_renew() {
    let t0 = std::time::Instant::now();
    let c = Client::resume(
        ClientConfig {
            mode: Mode::OneShot,
            ..cfg()
        },
        stored_lease(),
        t0,
        WALL0 + 2_000_000,
        1,
    );
    assert_eq!(c.state(), State::Bound);
    assert_eq!(c.poll_timeout(), None);
}

#[test]
fn inconsistent_times_are_corrected_and_counted() {
    let mut h = H::new(cfg());
    h.srv.t1 = Some(3000);
    h.srv.t2 = Some(2000);
    let l = bound(&mut h);
    assert_eq!((l.t1, l.t2), (secs(1800), secs(2000)));
    assert_eq!(h.c.stats().lease_times_inconsistent, 1);
    let mut h = H::new(cfg());
    h.srv.t1 = Some(0);
    h.srv.t2 = Some(4000);
    let l = bound(&mut h);
    assert_eq!((l.t1, l.t2), (secs(1800), secs(3150)));
    assert_eq!(h.c.stats().lease_times_zero, 1);
    assert_eq!(h.c.stats().lease_times_inconsistent, 1);
}

#[test]
fn same_seed_is_deterministic() {
    let run = |seed| {
        let mut h = H::with_seed(cfg(), seed);
        let mut out = Vec::new();
        for _ in 0..4 {
            out.extend(h.tx().into_iter().map(|t| (t.xid, h.elapsed())));
            h.fire();
        }
        out
    };
    assert_eq!(run(5), run(5));
    assert_ne!(run(5), run(6));
}

#[test]
fn client_is_send() {
    fn assert_send<T: Send + Sync>() {}
    assert_send::<Client>();
}

#[test]
fn ack_via_relay_learns_next_hop_mac() {
    let mut h = H::new(cfg());
    let d = h.one_tx();
    h.feed(&h.srv.offer(&d)).unwrap();
    let r = h.one_tx();
    let relay = PacketSource {
        src_mac: [0x02, 0, 0, 0, 0, 0x77],
        src_ip: Ipv4Addr::new(192, 0, 2, 254),
    };
    let ack = h.srv.ack(&r);
    h.feed_from(relay, &ack).unwrap();
    assert_eq!(
        h.c.lease().unwrap().server_mac,
        Some([0x02, 0, 0, 0, 0, 0x77])
    );
}

#[test]
fn request_repeats_the_discover_secs() {
    let mut h = H::new(cfg());
    h.one_tx();
    h.fire();
    let d = h.one_tx();
    let dsecs = Request::decode(&d).msg.secs();
    assert!(dsecs >= 3);
    h.now += secs(1);
    h.feed(&h.srv.offer(&d)).unwrap();
    let r = h.one_tx();
    assert_eq!(Request::decode(&r).msg.secs(), dsecs);
    h.fire();
    let r2 = h.one_tx();
    assert_eq!(r2.kind, MessageKind::Request);
    assert_eq!(Request::decode(&r2).msg.secs(), dsecs);
}

#[test]
fn discover_attempts_bound_selecting() {
    let mut c = cfg();
    c.discover_attempts = 2;
    let mut h = H::new(c);
    assert!(h.one_tx().expects_reply());
    h.fire();
    h.one_tx();
    assert_eq!(h.c.state(), State::Selecting);
    h.fire();
    assert_eq!(h.c.state(), State::Failed);
    assert!(h.tx().is_empty());
    let ev = h.ev();
    let [Event::Failed(err)] = ev.as_slice() else {
        panic!("{ev:?}")
    };
    assert_eq!(err.discovers_sent, 2);
    assert!(h.elapsed() < secs(15));
}

#[test]
fn client_stays_small() {
    // Thousands of leases per node: keep the per-lease state compact
    // (heap parts — queues, the lease's vectors — come on top).
    let size = std::mem::size_of::<Client>();
    assert!(size <= 2048, "Client is {size} bytes");
}

#[test]
fn unusable_source_mac_is_not_learned() {
    for mac in [[0u8; 6], [0xff; 6], [0x01, 0, 0x5e, 0, 0, 1]] {
        let mut h = H::new(cfg());
        let d = h.one_tx();
        h.feed(&h.srv.offer(&d)).unwrap();
        let r = h.one_tx();
        let src = PacketSource {
            src_mac: mac,
            src_ip: SERVER_IP,
        };
        let ack = h.srv.ack(&r);
        h.feed_from(src, &ack).unwrap();
        assert_eq!(h.c.lease().unwrap().server_mac, None, "{mac:02x?}");
        h.fire();
        assert_eq!(
            h.one_tx().dst,
            Destination::Unicast {
                ip: SERVER_IP,
                mac: None
            }
        );
    }
}

#[test]
fn renewal_without_source_mac_keeps_the_learned_one() {
    let mut h = H::new(cfg());
    h.bind();
    h.fire();
    let r = h.one_tx();
    let src = PacketSource {
        src_mac: [0; 6],
        src_ip: SERVER_IP,
    };
    let ack = h.srv.ack(&r);
    h.feed_from(src, &ack).unwrap();
    assert_eq!(h.c.lease().unwrap().server_mac, Some(SERVER_MAC));
}
