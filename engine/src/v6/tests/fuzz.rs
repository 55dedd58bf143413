//! Validation at the edge: every wrong message is a typed, counted drop,
//! and no input — arbitrary bytes or a garbled valid message — panics the
//! client or costs it its lease.

use proptest::prelude::*;

use super::server::{ADDR, H, Msg, SRC, cfg, client_duid, secs, server_duid};
use crate::v6::{DropReason, Event, MessageKind, State};

#[test]
fn replies_must_match_xid_client_id_server_id_and_state() {
    let mut h = H::new(cfg());
    let sol = h.one();
    let good = Msg::advertise(&sol, 1).pref(255);

    let mut m = good.clone();
    m.xid ^= 1;
    assert_eq!(h.feed(&m), Err(DropReason::WrongXid));
    let mut m = good.clone();
    m.client_id = None;
    assert_eq!(h.feed(&m), Err(DropReason::MissingClientId));
    let mut m = good.clone();
    m.client_id = Some(vec![0, 3, 0, 1, 2, 0, 0, 0, 0, 9]);
    assert_eq!(h.feed(&m), Err(DropReason::WrongClientId));
    let mut m = good.clone();
    m.server_id = None;
    assert_eq!(h.feed(&m), Err(DropReason::MissingServerId));
    let mut m = good.clone();
    m.server_id = Some(Vec::new());
    assert_eq!(h.feed(&m), Err(DropReason::BadServerId));
    let mut m = good.clone();
    m.ia.as_mut().unwrap().iaid ^= 1;
    assert_eq!(h.feed(&m), Err(DropReason::MissingIa), "not our IAID");
    assert_eq!(
        h.feed(&good.clone().times(100, 50)),
        Err(DropReason::MissingIa),
        "T1 > T2"
    );
    assert_eq!(
        h.feed(&good.clone().addr(ADDR, 0, 0)),
        Err(DropReason::NoUsableAddress)
    );
    assert_eq!(
        h.feed(&good.clone().addr("fe80::5".parse().unwrap(), 10, 20)),
        Err(DropReason::NoUsableAddress)
    );
    // A client message echoed back (SOLICIT) is no server message.
    assert_eq!(
        h.feed_bytes(&sol.payload),
        Err(DropReason::NotServerMessage)
    );
    assert_eq!(h.c.state(), State::Soliciting);
    assert!(h.tx().is_empty());
    assert_eq!(h.c.stats().dropped_total(), 10);

    h.feed(&good).unwrap();
    let req = h.one();
    // An ADVERTISE while requesting, a REPLY from another server.
    assert_eq!(
        h.feed(&Msg::advertise(&req, 1)),
        Err(DropReason::UnexpectedType)
    );
    assert_eq!(h.feed(&Msg::reply(&req, 2)), Err(DropReason::WrongServer));
    // A REPLY without an IA: ignored, the REQUEST goes on.
    assert_eq!(
        h.feed(&Msg::reply(&req, 1).no_ia()),
        Err(DropReason::MissingIa)
    );
    assert_eq!(h.c.state(), State::Requesting);
    h.feed(&Msg::reply(&req, 1)).unwrap();
    assert_eq!(
        h.feed(&Msg::reply(&req, 1)),
        Err(DropReason::WrongState),
        "bound"
    );
    h.ev();

    // RENEW: a REPLY from another server, or without our IA, keeps the lease.
    let (_, renew) = h.next_tx();
    assert_eq!(h.feed(&Msg::reply(&renew, 2)), Err(DropReason::WrongServer));
    assert_eq!(
        h.feed(&Msg::reply(&renew, 1).no_ia()),
        Err(DropReason::MissingIa)
    );
    assert_eq!(h.c.state(), State::Renewing);
    assert_eq!(h.c.lease().unwrap().address, ADDR);
    assert!(h.ev().is_empty());
    assert_eq!(h.c.stats().dropped(DropReason::WrongServer), 2);
}

#[test]
fn a_malformed_optional_option_is_dropped_alone_and_counted() {
    let mut h = H::new(cfg());
    let sol = h.one();
    h.feed(&Msg::advertise(&sol, 1).pref(255)).unwrap();
    let req = h.one();
    let mut b = Msg::reply(&req, 1).bytes();
    // Append a DNS option of 17 octets (not a multiple of 16).
    b.extend_from_slice(&[0, 23, 0, 17]);
    b.extend_from_slice(&[1; 17]);
    h.feed_bytes(&b).unwrap();
    assert!(matches!(h.ev().as_slice(), [Event::Bound(_)]));
    assert_eq!(h.c.stats().malformed_options, 1);
}

/// A client in each state that expects a reply, with its last transmission.
fn clients() -> Vec<(H, Vec<u8>)> {
    let mut out = Vec::new();
    // Soliciting.
    let mut h = H::new(cfg());
    let sol = h.one();
    let m = Msg::advertise(&sol, 1).pref(255).bytes();
    out.push((h, m));
    // Requesting.
    let mut h = H::new(cfg());
    let sol = h.one();
    h.feed(&Msg::advertise(&sol, 1).pref(255)).unwrap();
    let req = h.one();
    let m = Msg::reply(&req, 1).bytes();
    out.push((h, m));
    // Renewing and Rebinding, holding a lease.
    for kind in [MessageKind::Renew, MessageKind::Rebind] {
        let mut h = H::new(cfg());
        h.bind(1);
        let t = loop {
            let (_, t) = h.next_tx();
            if t.kind == kind {
                break t;
            }
        };
        let m = Msg::reply(&t, 1).bytes();
        out.push((h, m));
    }
    out
}

fn check_no_harm(h: &mut H, input: &[u8]) {
    let before = (h.c.state(), h.c.lease().cloned(), h.c.lease_timers());
    let dropped = h.c.stats().dropped_total();
    if h.c.handle_packet(h.now, SRC, input).is_err() {
        assert_eq!(
            (h.c.state(), h.c.lease().cloned(), h.c.lease_timers()),
            before
        );
        assert!(
            h.c.poll_event().is_none(),
            "a dropped message changes nothing"
        );
        assert_eq!(
            h.c.stats().dropped_total(),
            dropped + 1,
            "every drop is counted"
        );
    }
    // The client still works afterwards.
    h.now += secs(1);
    h.c.handle_timeout(h.now);
    while h.c.poll_transmit().is_some() {}
}

/// An option TLV with a code the decoder treats specially and data of any
/// length, nested up to twice inside `IA_NA` / IA Address containers.
fn tlv() -> impl Strategy<Value = Vec<u8>> {
    let code = prop_oneof![
        Just(1u16),
        Just(2),
        Just(3),
        Just(4),
        Just(5),
        Just(6),
        Just(7),
        Just(8),
        Just(9),
        Just(11),
        Just(12),
        Just(13),
        Just(14),
        Just(16),
        Just(17),
        Just(19),
        Just(20),
        Just(23),
        Just(24),
        Just(25),
        Just(26),
        Just(56),
        Just(61),
        Just(82),
        any::<u16>(),
    ];
    let leaf = (code, proptest::collection::vec(any::<u8>(), 0..40)).prop_map(|(c, d)| enc(c, &d));
    leaf.prop_recursive(2, 16, 4, |inner| {
        (
            prop_oneof![Just(3u16), Just(5), Just(17), Just(25), Just(26)],
            proptest::collection::vec(any::<u8>(), 0..26),
            proptest::collection::vec(inner, 0..4),
        )
            .prop_map(|(c, head, kids)| enc(c, &[head, kids.concat()].concat()))
    })
}

fn enc(code: u16, data: &[u8]) -> Vec<u8> {
    let mut v = code.to_be_bytes().to_vec();
    v.extend_from_slice(&(data.len().min(0xffff) as u16).to_be_bytes());
    v.extend_from_slice(data);
    v
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn structured_option_soup_never_panics_and_never_costs_the_lease(
        which in 0usize..4,
        ty in prop_oneof![Just(2u8), Just(7u8)],
        opts in proptest::collection::vec(tlv(), 0..8),
        keep_ids in any::<bool>(),
    ) {
        let (mut h, _) = clients().swap_remove(which);
        let xid = h.c.xid().to_be_bytes();
        let mut m = vec![ty, xid[1], xid[2], xid[3]];
        if keep_ids {
            m.extend(enc(1, &client_duid()));
            m.extend(enc(2, &server_duid(1)));
        }
        m.extend(opts.concat());
        check_no_harm(&mut h, &m);
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_never_cost_the_lease(
        bytes in proptest::collection::vec(any::<u8>(), 0..400),
        ty in prop_oneof![Just(2u8), Just(7u8), any::<u8>()],
        which in 0usize..4,
    ) {
        let (mut h, _) = clients().swap_remove(which);
        let mut input = bytes.clone();
        // Most inputs get a server type and the open xid so they reach the
        // option walk rather than stopping at the header.
        if input.len() >= 4 {
            input[0] = ty;
            let xid = h.c.xid().to_be_bytes();
            input[1..4].copy_from_slice(&xid[1..]);
        }
        check_no_harm(&mut h, &input);
        // And the decoder alone.
        let _ = crate::v6::validate::parse(&bytes);
    }

    #[test]
    fn garbled_valid_messages_never_panic_and_never_cost_the_lease(
        which in 0usize..4,
        edits in proptest::collection::vec((any::<usize>(), any::<u8>(), 0u8..4), 1..6),
    ) {
        let (mut h, mut m) = clients().swap_remove(which);
        for (at, byte, op) in edits {
            if m.is_empty() { break; }
            let i = at % m.len();
            match op {
                0 => m[i] = byte,
                1 => m.truncate(i.max(4)),
                2 => m.insert(i, byte),
                _ => { m.remove(i); }
            }
        }
        check_no_harm(&mut h, &m);
    }
}

#[test]
fn the_client_identifier_is_checked_byte_for_byte() {
    // A DUID that is a prefix of ours, or ours with one more byte.
    let mut h = H::new(cfg());
    let sol = h.one();
    for id in [
        client_duid()[..9].to_vec(),
        [client_duid(), vec![0]].concat(),
    ] {
        let mut m = Msg::advertise(&sol, 1).pref(255);
        m.client_id = Some(id);
        assert_eq!(h.feed(&m), Err(DropReason::WrongClientId));
    }
    let mut m = Msg::advertise(&sol, 1).pref(255);
    m.server_id = Some(server_duid(1).repeat(14));
    assert_eq!(
        h.feed(&m),
        Err(DropReason::BadServerId),
        "140 octets: longer than a DUID"
    );
}
