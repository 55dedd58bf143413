//! Every RFC 8415 exchange of the client, in virtual time.

use dhcproto::v6::{MessageType, Status};

use super::server::{
    ADDR, ADDR2, DNS, H, MAC, Msg, PREFERRED, SRC, Sent, T1, T2, VALID, WALL0, cfg, client_duid,
    ms, secs, server_duid,
};
use crate::v6::{
    Client, ClientConfig, Destination, DropReason, Event, Lease, LostReason, MessageKind,
    ResumeMode, State,
};

#[test]
fn solicit_advertise_request_reply_binds_with_rfc_message_shapes() {
    let mut h = H::new(cfg());
    assert_eq!(h.c.state(), State::Soliciting);
    let sol = h.one();
    assert_eq!(sol.kind, MessageKind::Solicit);
    assert_eq!(sol.dst, Destination::Multicast);
    assert_eq!(
        sol.dst.address(),
        "ff02::1:2".parse::<std::net::Ipv6Addr>().unwrap()
    );
    assert!(sol.xid <= 0x00ff_ffff);
    let s = Sent::decode(&sol);
    assert_eq!(s.ty(), MessageType::Solicit);
    assert_eq!(
        s.client_id(),
        Some(client_duid().as_slice()),
        "DUID-LL of the MAC"
    );
    assert_eq!(s.server_id(), None);
    assert_eq!(s.elapsed(), Some(0), "first transmission: Elapsed Time 0");
    assert_eq!(
        s.ia().id,
        u32::from_be_bytes([MAC[2], MAC[3], MAC[4], MAC[5]])
    );
    assert_eq!(sol.iaid, s.ia().id);
    assert!(s.ia_addresses().is_empty());
    assert_eq!(
        s.oro(),
        [23, 24, 82],
        "DNS, search list, and SOL_MAX_RT (§18.2.1)"
    );
    assert!(!s.rapid_commit());

    // An ADVERTISE below 255 is collected, not acted on, until the first RT.
    h.now += ms(300);
    h.feed(&Msg::advertise(&sol, 1)).unwrap();
    assert_eq!(h.c.state(), State::Soliciting);
    assert!(h.tx().is_empty());
    let (at, req) = h.next_tx();
    assert!(at > secs(1) && at <= ms(1100), "{at:?}");
    assert_eq!(req.kind, MessageKind::Request);
    assert_ne!(req.xid, sol.xid, "each exchange has its own xid");
    let r = Sent::decode(&req);
    assert_eq!(r.server_id(), Some(server_duid(1).as_slice()));
    assert_eq!(r.ia_addresses(), [ADDR]);
    assert_eq!(r.elapsed(), Some(0));
    assert_eq!(h.c.state(), State::Requesting);

    let sent_at = h.now;
    h.now += ms(200);
    h.feed(&Msg::reply(&req, 1)).unwrap();
    assert_eq!(h.c.state(), State::Bound);
    let ev = h.ev();
    let [Event::Bound(lease)] = ev.as_slice() else {
        panic!("{ev:?}")
    };
    assert_eq!(lease.address, ADDR);
    assert_eq!(lease.server_id, server_duid(1));
    assert_eq!(lease.iaid, h.c.iaid());
    assert_eq!((lease.t1_secs, lease.t2_secs), (T1, T2));
    assert_eq!((lease.preferred_secs, lease.valid_secs), (PREFERRED, VALID));
    assert_eq!(lease.dns_servers, [DNS]);
    // Times count from when the REQUEST was first sent.
    let t = h.c.lease_timers().unwrap();
    assert_eq!(t.t1, Some(sent_at + secs(u64::from(T1))));
    assert_eq!(t.t2, Some(sent_at + secs(u64::from(T2))));
    assert_eq!(t.expires, Some(sent_at + secs(u64::from(VALID))));
    assert_eq!(
        lease.acquired_unix_ms,
        WALL0 + (sent_at - h.t0).as_millis() as u64
    );
    assert_eq!(h.c.poll_timeout(), t.t1);
    assert_eq!(h.c.stats().leases_bound, 1);
}

#[test]
fn the_highest_preference_wins_and_ties_go_to_the_first_heard() {
    let mut h = H::new(cfg());
    let sol = h.one();
    h.feed(&Msg::advertise(&sol, 1).pref(10)).unwrap();
    h.feed(&Msg::advertise(&sol, 2).pref(50)).unwrap();
    h.feed(&Msg::advertise(&sol, 3).pref(50).addr(ADDR2, 10, 20))
        .unwrap();
    h.feed(&Msg::advertise(&sol, 4)).unwrap();
    assert!(h.tx().is_empty());
    let (_, req) = h.next_tx();
    let r = Sent::decode(&req);
    assert_eq!(r.server_id(), Some(server_duid(2).as_slice()));
    assert_eq!(r.ia_addresses(), [ADDR]);
}

#[test]
fn preference_255_is_requested_at_once() {
    let mut h = H::new(cfg());
    let sol = h.one();
    h.feed(&Msg::advertise(&sol, 1).pref(200)).unwrap();
    assert!(h.tx().is_empty());
    h.feed(&Msg::advertise(&sol, 2).pref(255)).unwrap();
    let req = h.one();
    assert_eq!(req.kind, MessageKind::Request);
    assert_eq!(
        Sent::decode(&req).server_id(),
        Some(server_duid(2).as_slice())
    );
    assert_eq!(h.now, h.t0, "no waiting for the first RT");
}

#[test]
fn after_the_first_rt_the_first_advertise_is_taken_at_once() {
    let mut h = H::new(cfg());
    let sol = h.one();
    let (at, again) = h.next_tx();
    assert_eq!(again.kind, MessageKind::Solicit);
    assert_eq!(again.xid, sol.xid, "a retransmission keeps the xid");
    let cs = Sent::decode(&again).elapsed().unwrap();
    assert_eq!(
        u128::from(cs),
        at.as_millis() / 10,
        "Elapsed Time in hundredths"
    );
    h.now += ms(100);
    h.feed(&Msg::advertise(&again, 1)).unwrap();
    assert_eq!(h.one().kind, MessageKind::Request);
}

#[test]
fn advertise_with_no_addrs_avail_is_ignored() {
    let mut h = H::new(cfg());
    let sol = h.one();
    assert_eq!(
        h.feed(
            &Msg::advertise(&sol, 1)
                .pref(255)
                .status(Status::NoAddrsAvail)
                .no_ia()
        ),
        Err(DropReason::NoAddrsAvail)
    );
    assert_eq!(
        h.feed(
            &Msg::advertise(&sol, 2)
                .pref(255)
                .ia_status(Status::NoAddrsAvail)
        ),
        Err(DropReason::NoAddrsAvail)
    );
    assert_eq!(h.c.stats().dropped(DropReason::NoAddrsAvail), 2);
    assert_eq!(h.c.stats().status(Status::NoAddrsAvail), 2);
    assert!(h.tx().is_empty());
    h.feed(&Msg::advertise(&sol, 3)).unwrap();
    let (_, req) = h.next_tx();
    assert_eq!(
        Sent::decode(&req).server_id(),
        Some(server_duid(3).as_slice())
    );
}

#[test]
fn rapid_commit_binds_on_the_reply_to_solicit() {
    let mut h = H::new(ClientConfig {
        rapid_commit: true,
        ..cfg()
    });
    let sol = h.one();
    assert!(Sent::decode(&sol).rapid_commit());
    // A REPLY without Rapid Commit is not an answer to SOLICIT.
    assert_eq!(
        h.feed(&Msg::reply(&sol, 1)),
        Err(DropReason::UnexpectedType)
    );
    h.feed(&Msg::reply(&sol, 1).rapid()).unwrap();
    assert_eq!(h.c.state(), State::Bound);
    assert!(matches!(h.ev().as_slice(), [Event::Bound(l)] if l.address == ADDR));
    assert_eq!(h.c.stats().rapid_commits, 1);
    assert!(h.tx().is_empty(), "no REQUEST");

    // Without the option configured, a Rapid Commit REPLY is not accepted.
    let mut h = H::new(cfg());
    let sol = h.one();
    assert_eq!(
        h.feed(&Msg::reply(&sol, 1).rapid()),
        Err(DropReason::UnexpectedType)
    );
    assert_eq!(h.c.state(), State::Soliciting);
}

#[test]
fn renew_at_t1_to_the_server_rebind_at_t2_to_all_then_expiry() {
    let mut h = H::new(cfg());
    let base = h.bind(1);
    let (at, renew) = h.next_tx();
    assert_eq!(h.t0 + at, base + secs(u64::from(T1)), "RENEW at T1");
    assert_eq!(renew.kind, MessageKind::Renew);
    assert_eq!(h.c.state(), State::Renewing);
    let r = Sent::decode(&renew);
    assert_eq!(
        r.server_id(),
        Some(server_duid(1).as_slice()),
        "RENEW names the server"
    );
    assert_eq!(r.ia_addresses(), [ADDR]);
    assert_eq!(
        renew.dst,
        Destination::Multicast,
        "no Server Unicast option"
    );
    // Retransmissions until T2, then REBIND without a Server Identifier.
    let mut last = renew.clone();
    loop {
        let (_, t) = h.next_tx();
        if t.kind != MessageKind::Renew {
            assert_eq!(t.kind, MessageKind::Rebind);
            assert_eq!(h.now, base + secs(u64::from(T2)), "REBIND at T2");
            assert_eq!(Sent::decode(&t).server_id(), None);
            assert_eq!(Sent::decode(&t).ia_addresses(), [ADDR]);
            assert_eq!(h.c.state(), State::Rebinding);
            break;
        }
        assert_eq!(t.xid, last.xid);
        last = t;
    }
    // Silence until the valid lifetime ends: the lease is lost.
    loop {
        let (_, t) = h.next_tx();
        if t.kind == MessageKind::Solicit {
            break;
        }
        assert_eq!(t.kind, MessageKind::Rebind);
    }
    assert_eq!(
        h.now,
        base + secs(u64::from(VALID)),
        "lost at the valid lifetime's end"
    );
    assert_eq!(
        h.ev(),
        [Event::Lost {
            reason: LostReason::Expired
        }]
    );
    assert_eq!(h.c.lease(), None);
    assert_eq!(h.c.state(), State::Soliciting);
    assert_eq!(h.c.stats().expirations, 1);
}

#[test]
fn zero_t1_t2_default_to_half_and_four_fifths_of_preferred() {
    let mut h = H::new(cfg());
    let sol = h.one();
    h.feed(&Msg::advertise(&sol, 1).pref(255)).unwrap();
    let req = h.one();
    let base = h.now;
    h.feed(&Msg::reply(&req, 1).times(0, 0)).unwrap();
    let l = h.c.lease().unwrap();
    assert_eq!((l.t1_secs, l.t2_secs), (PREFERRED / 2, PREFERRED * 4 / 5));
    let (at, renew) = h.next_tx();
    assert_eq!(renew.kind, MessageKind::Renew);
    assert_eq!(h.t0 + at, base + secs(u64::from(PREFERRED / 2)));
}

#[test]
fn full_life_renew_rebind_to_another_server_then_expiry_when_all_are_silent() {
    let mut h = H::new(cfg());
    h.bind(1);
    let (_, renew) = h.next_tx();
    assert_eq!(renew.kind, MessageKind::Renew);
    // Server 1 is gone; at T2 REBIND goes to all and server 2 answers.
    let rebind = loop {
        let (_, t) = h.next_tx();
        if t.kind == MessageKind::Rebind {
            break t;
        }
    };
    let rebind_sent = h.now;
    h.now += ms(50);
    // A REPLY to REBIND from another server is accepted (no server check).
    h.feed(&Msg::reply(&rebind, 2)).unwrap();
    let ev = h.ev();
    let [Event::Changed { old, new }] = ev.as_slice() else {
        panic!("{ev:?}")
    };
    assert_eq!(old.server_id, server_duid(1));
    assert_eq!(new.server_id, server_duid(2));
    assert_eq!(new.address, ADDR);
    assert_eq!(h.c.state(), State::Bound);
    assert_eq!(h.c.stats().rebinds, 1);
    // The next RENEW goes to server 2, at T1 from the REBIND.
    let (at, renew) = h.next_tx();
    assert_eq!(h.t0 + at, rebind_sent + secs(u64::from(T1)));
    assert_eq!(
        Sent::decode(&renew).server_id(),
        Some(server_duid(2).as_slice())
    );
    // Everyone silent: REBIND at T2, lost at the end of the valid lifetime.
    let mut kinds = vec![MessageKind::Renew];
    loop {
        let (_, t) = h.next_tx();
        kinds.push(t.kind);
        if t.kind == MessageKind::Solicit {
            break;
        }
    }
    assert!(kinds.contains(&MessageKind::Rebind));
    assert_eq!(h.now, rebind_sent + secs(u64::from(VALID)));
    assert_eq!(
        h.ev(),
        [Event::Lost {
            reason: LostReason::Expired
        }]
    );
}

#[test]
fn no_binding_on_renew_requests_the_ia_again_and_keeps_the_lease() {
    let mut h = H::new(cfg());
    h.bind(1);
    let (_, renew) = h.next_tx();
    h.feed(&Msg::reply(&renew, 1).ia_status(Status::NoBinding))
        .unwrap();
    assert_eq!(h.c.state(), State::Requesting);
    assert!(h.c.lease().is_some(), "the lease is kept meanwhile");
    let req = h.one();
    assert_eq!(req.kind, MessageKind::Request);
    let r = Sent::decode(&req);
    assert_eq!(r.server_id(), Some(server_duid(1).as_slice()));
    assert_eq!(r.ia_addresses(), [ADDR]);
    h.feed(&Msg::reply(&req, 1)).unwrap();
    assert!(matches!(h.ev().as_slice(), [Event::Renewed(l)] if l.address == ADDR));
    assert_eq!(h.c.state(), State::Bound);
    assert_eq!(h.c.stats().status(Status::NoBinding), 1);
}

#[test]
fn no_binding_on_rebind_requests_from_the_server_that_answered() {
    let mut h = H::new(cfg());
    h.bind(1);
    let rebind = loop {
        let (_, t) = h.next_tx();
        if t.kind == MessageKind::Rebind {
            break t;
        }
    };
    h.feed(&Msg::reply(&rebind, 3).ia_status(Status::NoBinding))
        .unwrap();
    let req = h.one();
    assert_eq!(req.kind, MessageKind::Request);
    assert_eq!(
        Sent::decode(&req).server_id(),
        Some(server_duid(3).as_slice())
    );
    // Unanswered REQUEST for a binding the server disowned: the lease goes.
    let mut n = 1;
    loop {
        let (_, t) = h.next_tx();
        if t.kind == MessageKind::Solicit {
            break;
        }
        n += 1;
    }
    assert_eq!(n, 10, "REQ_MAX_RC");
    assert_eq!(
        h.ev(),
        [Event::Lost {
            reason: LostReason::NoBinding
        }]
    );
}

#[test]
fn use_multicast_resends_the_same_message_to_multicast() {
    let unicast: std::net::Ipv6Addr = "2001:db8::547".parse().unwrap();
    let mut h = H::new(cfg());
    let sol = h.one();
    h.feed(&Msg::advertise(&sol, 1).pref(255).unicast(unicast))
        .unwrap();
    let req = h.one();
    assert_eq!(
        req.dst,
        Destination::Unicast(unicast),
        "Server Unicast honoured"
    );
    h.feed(&Msg::reply(&req, 1).unicast(unicast)).unwrap();
    assert_eq!(h.c.lease().unwrap().server_unicast, Some(unicast));
    let (_, renew) = h.next_tx();
    assert_eq!(renew.dst, Destination::Unicast(unicast));
    h.feed(&Msg::reply(&renew, 1).status(Status::UseMulticast).no_ia())
        .unwrap();
    let again = h.one();
    assert_eq!(again.kind, MessageKind::Renew);
    assert_eq!(again.xid, renew.xid, "the original message, resent");
    assert_eq!(again.dst, Destination::Multicast);
    assert_eq!(h.c.state(), State::Renewing);
    // And so is every later message to that server.
    h.feed(&Msg::reply(&again, 1).unicast(unicast)).unwrap();
    let (_, renew2) = h.next_tx();
    assert_eq!(renew2.dst, Destination::Multicast);
    // A second UseMulticast while already multicasting changes nothing.
    assert_eq!(
        h.feed(&Msg::reply(&renew2, 1).status(Status::UseMulticast).no_ia()),
        Err(DropReason::StatusFailure)
    );
}

#[test]
fn not_on_link_restarts_from_solicit() {
    // In the REPLY to REQUEST.
    let mut h = H::new(cfg());
    let sol = h.one();
    h.feed(&Msg::advertise(&sol, 1).pref(255)).unwrap();
    let req = h.one();
    h.feed(&Msg::reply(&req, 1).status(Status::NotOnLink).no_ia())
        .unwrap();
    assert_eq!(h.c.state(), State::Soliciting);
    assert_eq!(h.one().kind, MessageKind::Solicit);
    assert!(h.ev().is_empty(), "no lease to lose");

    // In our IA of the REPLY to RENEW: the lease goes.
    let mut h = H::new(cfg());
    h.bind(1);
    let (_, renew) = h.next_tx();
    h.feed(&Msg::reply(&renew, 1).ia_status(Status::NotOnLink))
        .unwrap();
    assert_eq!(
        h.ev(),
        [Event::Lost {
            reason: LostReason::NotOnLink
        }]
    );
    assert_eq!(h.one().kind, MessageKind::Solicit);
}

#[test]
fn no_addrs_avail_in_the_reply_to_request_tries_again_from_solicit() {
    let mut h = H::new(cfg());
    let sol = h.one();
    h.feed(&Msg::advertise(&sol, 1).pref(255)).unwrap();
    let req = h.one();
    h.feed(&Msg::reply(&req, 1).ia_status(Status::NoAddrsAvail))
        .unwrap();
    assert_eq!(h.c.state(), State::Soliciting);
    assert_eq!(h.one().kind, MessageKind::Solicit);
}

#[test]
fn unspec_fail_keeps_the_exchange_going() {
    let mut h = H::new(cfg());
    let sol = h.one();
    h.feed(&Msg::advertise(&sol, 1).pref(255)).unwrap();
    let req = h.one();
    let next = h.c.poll_timeout().unwrap();
    assert_eq!(
        h.feed(&Msg::reply(&req, 1).status(Status::UnspecFail).no_ia()),
        Err(DropReason::StatusFailure)
    );
    assert_eq!(h.c.state(), State::Requesting);
    assert_eq!(
        h.c.poll_timeout(),
        Some(next),
        "retransmission schedule unchanged"
    );
    let (_, again) = h.next_tx();
    assert_eq!((again.kind, again.xid), (MessageKind::Request, req.xid));
    assert_eq!(h.c.stats().status(Status::UnspecFail), 1);
}

#[test]
fn renew_reply_withdrawing_the_address_loses_the_lease() {
    let mut h = H::new(cfg());
    h.bind(1);
    let (_, renew) = h.next_tx();
    h.feed(&Msg::reply(&renew, 1).addr(ADDR, 0, 0)).unwrap();
    assert_eq!(
        h.ev(),
        [Event::Lost {
            reason: LostReason::Withdrawn
        }]
    );
    assert_eq!(h.one().kind, MessageKind::Solicit);
}

#[test]
fn release_is_retransmitted_rel_max_rc_times_then_released() {
    let mut h = H::new(cfg());
    h.bind(1);
    h.now += secs(5);
    h.c.release(h.now);
    assert_eq!(h.c.lease(), None);
    assert_eq!(h.c.state(), State::Releasing);
    let rel = h.one();
    assert_eq!(rel.kind, MessageKind::Release);
    let r = Sent::decode(&rel);
    assert_eq!(r.server_id(), Some(server_duid(1).as_slice()));
    assert_eq!(r.ia_addresses(), [ADDR]);
    let start = h.now;
    let mut at = Vec::new();
    for _ in 0..3 {
        let (t, again) = h.next_tx();
        assert_eq!((again.kind, again.xid), (MessageKind::Release, rel.xid));
        at.push(h.t0 + t - start);
    }
    // REL_TIMEOUT 1 s doubling, each ±10 %.
    assert!(at[0] >= ms(900) && at[0] <= ms(1100), "{at:?}");
    assert!(
        at[1] >= ms(900 + 1710) && at[1] <= ms(1100 + 2310),
        "{at:?}"
    );
    h.fire();
    assert!(h.tx().is_empty(), "REL_MAX_RC = 4 transmissions");
    assert_eq!(h.c.state(), State::Released);
    assert_eq!(h.ev(), [Event::Released]);
    assert_eq!(h.c.poll_timeout(), None);
    assert_eq!(h.c.stats().sent(MessageKind::Release), 4);

    // Answered: released at once.
    let mut h = H::new(cfg());
    h.bind(1);
    h.c.release(h.now);
    let rel = h.one();
    h.feed(&Msg::reply(&rel, 1).no_ia()).unwrap();
    assert_eq!(h.c.state(), State::Released);
    assert_eq!(h.ev(), [Event::Released]);
}

#[test]
fn decline_after_dad_failure_then_solicit_and_never_take_it_again() {
    let mut h = H::new(cfg());
    h.bind(1);
    h.c.decline(h.now);
    assert_eq!(
        h.ev(),
        [Event::Lost {
            reason: LostReason::Declined
        }]
    );
    assert_eq!(h.c.state(), State::Declining);
    let dec = h.one();
    assert_eq!(dec.kind, MessageKind::Decline);
    let d = Sent::decode(&dec);
    assert_eq!(d.server_id(), Some(server_duid(1).as_slice()));
    assert_eq!(d.ia_addresses(), [ADDR]);
    for _ in 0..3 {
        let (_, t) = h.next_tx();
        assert_eq!((t.kind, t.xid), (MessageKind::Decline, dec.xid));
    }
    let (_, sol) = h.next_tx();
    assert_eq!(sol.kind, MessageKind::Solicit, "after DEC_MAX_RC = 4");
    assert_eq!(
        h.feed(&Msg::advertise(&sol, 1).pref(255)),
        Err(DropReason::DeclinedAddress)
    );
    h.feed(&Msg::advertise(&sol, 1).pref(255).addr(ADDR2, 100, 200))
        .unwrap();
    let req = h.one();
    assert_eq!(Sent::decode(&req).ia_addresses(), [ADDR2]);

    // A REPLY to DECLINE ends it at once.
    let mut h = H::new(cfg());
    h.bind(1);
    h.c.decline(h.now);
    let dec = h.one();
    h.feed(&Msg::reply(&dec, 1).no_ia()).unwrap();
    assert_eq!(h.one().kind, MessageKind::Solicit);
}

fn stored() -> Lease {
    Lease {
        address: ADDR,
        iaid: u32::from_be_bytes([MAC[2], MAC[3], MAC[4], MAC[5]]),
        server_id: server_duid(1),
        server_unicast: None,
        preferred_secs: PREFERRED,
        valid_secs: VALID,
        t1_secs: T1,
        t2_secs: T2,
        dns_servers: vec![DNS],
        domain_search: Vec::new(),
        acquired_unix_ms: WALL0,
        server_source: None,
    }
}

#[test]
fn a_resumed_lease_is_rebound_by_default() {
    let now = std::time::Instant::now();
    // 100 s after it was acquired.
    let mut c = Client::resume(cfg(), stored(), now, WALL0 + 100_000, 1);
    assert_eq!(c.state(), State::Rebinding);
    assert_eq!(c.lease().unwrap().address, ADDR);
    assert!(c.poll_event().is_none(), "no Bound: the caller holds it");
    let t = c.lease_timers().unwrap();
    assert_eq!(t.expires, Some(now + secs(u64::from(VALID) - 100)));
    let reb = c.poll_transmit().unwrap();
    assert_eq!(reb.kind, MessageKind::Rebind);
    assert_eq!(Sent::decode(&reb).ia_addresses(), [ADDR]);
    c.handle_packet(now, SRC, &Msg::reply(&reb, 1).bytes())
        .unwrap();
    assert!(matches!(c.poll_event(), Some(Event::Renewed(l)) if l.address == ADDR));
    assert_eq!(c.state(), State::Bound);
}

#[test]
fn a_resumed_lease_can_be_confirmed_instead() {
    let now = std::time::Instant::now();
    let c_cfg = ClientConfig {
        resume: ResumeMode::Confirm,
        ..cfg()
    };
    let mut c = Client::resume(c_cfg.clone(), stored(), now, WALL0 + 100_000, 1);
    assert_eq!(c.state(), State::Confirming);
    let cnf = c.poll_transmit().unwrap();
    assert_eq!(cnf.kind, MessageKind::Confirm);
    let s = Sent::decode(&cnf);
    assert_eq!(s.server_id(), None, "CONFIRM goes to all servers");
    assert_eq!(s.ia_addresses(), [ADDR]);
    let timers = c.lease_timers();
    c.handle_packet(now, SRC, &Msg::reply(&cnf, 2).no_ia().bytes())
        .unwrap();
    assert_eq!(c.state(), State::Bound);
    assert_eq!(
        c.lease_timers(),
        timers,
        "CONFIRM does not extend lifetimes"
    );
    assert_eq!(c.poll_timeout(), Some(now + secs(u64::from(T1) - 100)));

    // NotOnLink: lost, SOLICIT.
    let mut c = Client::resume(c_cfg.clone(), stored(), now, WALL0 + 100_000, 1);
    let cnf = c.poll_transmit().unwrap();
    c.handle_packet(
        now,
        SRC,
        &Msg::reply(&cnf, 2)
            .status(Status::NotOnLink)
            .no_ia()
            .bytes(),
    )
    .unwrap();
    assert_eq!(
        c.poll_event(),
        Some(Event::Lost {
            reason: LostReason::NotOnLink
        })
    );
    assert_eq!(c.poll_transmit().unwrap().kind, MessageKind::Solicit);

    // Silence for CNF_MAX_RD (10 s): the lease is kept.
    let mut c = Client::resume(c_cfg, stored(), now, WALL0 + 100_000, 1);
    let mut sent = 0;
    let mut t = now;
    while c.state() == State::Confirming {
        while c.poll_transmit().is_some() {
            sent += 1;
        }
        t = c.poll_timeout().unwrap();
        c.handle_timeout(t);
    }
    assert_eq!(c.state(), State::Bound);
    assert_eq!(t, now + secs(10), "CNF_MAX_RD");
    assert!(sent >= 4, "{sent}");
    assert!(c.poll_event().is_none());
}

#[test]
fn a_resumed_lease_past_its_valid_lifetime_is_lost() {
    let now = std::time::Instant::now();
    let mut c = Client::resume(cfg(), stored(), now, WALL0 + u64::from(VALID) * 1000, 1);
    assert_eq!(
        c.poll_event(),
        Some(Event::Lost {
            reason: LostReason::Expired
        })
    );
    assert_eq!(c.poll_transmit().unwrap().kind, MessageKind::Solicit);
    assert_eq!(c.lease(), None);
}

#[test]
fn the_acquisition_deadline_fails_with_what_was_heard() {
    let mut h = H::new(ClientConfig {
        acquire_timeout: Some(secs(30)),
        ..cfg()
    });
    let sol = h.one();
    h.feed(
        &Msg::advertise(&sol, 1)
            .pref(255)
            .status(Status::NoAddrsAvail)
            .no_ia(),
    )
    .unwrap_err();
    h.advance(secs(31));
    let ev = h.ev();
    let [Event::Failed(e)] = ev.as_slice() else {
        panic!("{ev:?}")
    };
    assert_eq!(e.elapsed, secs(30));
    assert!(e.solicits_sent >= 4, "{e}");
    assert_eq!(e.last_status, Some(Status::NoAddrsAvail));
    assert_eq!(e.last_drop, Some(DropReason::NoAddrsAvail));
    assert_eq!(h.c.state(), State::Failed);
    assert_eq!(h.c.poll_timeout(), None);
    h.tx();
    h.c.restart(h.now);
    assert_eq!(h.one().kind, MessageKind::Solicit);
}

#[test]
fn retransmit_now_repeats_a_renewal_at_once_and_nothing_else() {
    let mut h = H::new(cfg());
    let sol = h.one();
    let before = h.c.poll_timeout();
    h.c.retransmit_now(h.now);
    assert_eq!(h.c.poll_timeout(), before, "no effect while soliciting");
    h.feed(&Msg::advertise(&sol, 1).pref(255)).unwrap();
    let req = h.one();
    h.feed(&Msg::reply(&req, 1)).unwrap();
    let (_, renew) = h.next_tx();
    assert_eq!(renew.kind, MessageKind::Renew);
    h.now += secs(2);
    assert!(h.c.poll_timeout().unwrap() > h.now);
    h.c.retransmit_now(h.now);
    assert_eq!(h.c.poll_timeout(), Some(h.now));
    h.c.handle_timeout(h.now);
    let again = h.one();
    assert_eq!((again.kind, again.xid), (MessageKind::Renew, renew.xid));
    assert_eq!(Sent::decode(&again).elapsed(), Some(200));
}

/// The lease records where its REPLY came from: the IPv6 source, and the
/// Ethernet source when the frame was seen. A renewal read from a socket
/// (no frame) from the same sender keeps the Ethernet source it had; one
/// from another sender does not inherit it.
#[test]
fn the_lease_records_the_replys_sender_and_keeps_its_mac_across_a_socket_renewal() {
    use crate::v6::Source;
    const SERVER_MAC: [u8; 6] = [2, 0, 0x5e, 0, 0x53, 1];
    let mut h = H::new(cfg());
    let sol = h.one();
    h.feed(&Msg::advertise(&sol, 1).pref(255)).unwrap();
    let req = h.one();
    h.c.handle_packet_from(
        h.now,
        Source::new(SRC, Some(SERVER_MAC)),
        &Msg::reply(&req, 1).bytes(),
    )
    .unwrap();
    let ev = h.ev();
    let [Event::Bound(lease)] = ev.as_slice() else {
        panic!("{ev:?}")
    };
    let seen = Source {
        ip: SRC,
        mac: Some(SERVER_MAC),
    };
    assert_eq!(lease.server_source, Some(seen));

    // RENEW at T1, its REPLY from the socket: same sender, MAC kept.
    let (_, renew) = h.next_tx();
    assert_eq!(renew.kind, MessageKind::Renew);
    h.feed(&Msg::reply(&renew, 1)).unwrap();
    let ev = h.ev();
    let [Event::Renewed(lease)] = ev.as_slice() else {
        panic!("{ev:?}")
    };
    assert_eq!(lease.server_source, Some(seen));

    // The next one from another address (a relay agent): its own source,
    // no MAC it was not seen with.
    let (_, renew) = h.next_tx();
    let relay: std::net::Ipv6Addr = "fe80::fe".parse().unwrap();
    h.c.handle_packet(h.now, relay, &Msg::reply(&renew, 1).bytes())
        .unwrap();
    let ev = h.ev();
    let [Event::Renewed(lease)] = ev.as_slice() else {
        panic!("{ev:?}")
    };
    assert_eq!(
        lease.server_source,
        Some(Source {
            ip: relay,
            mac: None
        })
    );
    // A multicast or zero Ethernet source is no station's.
    assert_eq!(Source::new(SRC, Some([0x33, 0x33, 0, 1, 0, 2])).mac, None);
    assert_eq!(Source::new(SRC, Some([0; 6])).mac, None);
}
