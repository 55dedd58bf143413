//! Property tests: arbitrary bytes, mutated valid replies and random command
//! sequences in every state never panic and only make allowed transitions.

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::time::Duration;

use dhcproto::v4::MessageType;
use proptest::prelude::*;

use super::server::{ADDR, CLIENT_MAC, H, OTHER_SERVER_IP, Server, cfg, raw_reply};
use crate::validate::is_unicast;
use crate::{ClientConfig, Event, Mode, State, Transmit};

#[derive(Debug, Clone, Copy)]
enum Kind {
    Offer,
    Ack,
    Nak,
    OtherAck,
}

#[derive(Debug, Clone)]
enum Mutation {
    Set(usize, u8),
    Truncate(usize),
    Insert(usize, Vec<u8>),
    Remove(usize, usize),
}

#[derive(Debug, Clone)]
enum Op {
    /// Advance virtual time by this many milliseconds and fire timers.
    Advance(u64),
    /// Jump to the next armed timer.
    Fire,
    /// Arbitrary bytes.
    Garbage(Vec<u8>),
    /// A header addressed to us (xid, chaddr, cookie) and arbitrary options,
    /// `sname` and `file`.
    GarbageOptions(Vec<u8>, Vec<u8>, Vec<u8>),
    /// A valid reply to the last message.
    Valid(Kind),
    /// A valid reply to the last message, then mutated.
    Mutated(Kind, Vec<Mutation>),
    Release,
    Decline,
    Restart,
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::Offer),
        Just(Kind::Ack),
        Just(Kind::Nak),
        Just(Kind::OtherAck)
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Set(i, b)),
        1 => any::<usize>().prop_map(Mutation::Truncate),
        2 => (any::<usize>(), prop::collection::vec(any::<u8>(), 1..8))
            .prop_map(|(i, v)| Mutation::Insert(i, v)),
        1 => (any::<usize>(), 1usize..8).prop_map(|(i, n)| Mutation::Remove(i, n)),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u64..5_000_000).prop_map(Op::Advance),
        3 => Just(Op::Fire),
        2 => prop::collection::vec(any::<u8>(), 0..600).prop_map(Op::Garbage),
        3 => (
            prop::collection::vec(any::<u8>(), 0..400),
            prop::collection::vec(any::<u8>(), 0..64),
            prop::collection::vec(any::<u8>(), 0..128)
        )
            .prop_map(|(o, s, f)| Op::GarbageOptions(o, s, f)),
        6 => kind().prop_map(Op::Valid),
        6 => (kind(), prop::collection::vec(mutation(), 1..6))
            .prop_map(|(k, m)| Op::Mutated(k, m)),
        1 => Just(Op::Release),
        1 => Just(Op::Decline),
        1 => Just(Op::Restart),
    ]
}

fn config() -> impl Strategy<Value = ClientConfig> {
    (any::<bool>(), any::<bool>(), any::<bool>()).prop_map(|(reboot, one_shot, short)| {
        let mut c = cfg();
        if reboot {
            c.requested_ip = Some(ADDR);
        }
        if one_shot {
            c.mode = Mode::OneShot;
        }
        if short {
            c.retransmit.renew_min_interval = Duration::from_secs(1);
        }
        c
    })
}

/// Server parameters varied so ACKs carry odd but valid times.
fn server() -> impl Strategy<Value = Server> {
    (
        prop_oneof![
            Just(None),
            (0u32..100_000).prop_map(Some),
            Just(Some(u32::MAX))
        ],
        prop::option::of(0u32..100_000),
        prop::option::of(0u32..100_000),
    )
        .prop_map(|(lease, t1, t2)| Server {
            lease_secs: lease.or(Some(3600)),
            t1,
            t2,
            ..Server::default()
        })
}

fn mutate(mut b: Vec<u8>, muts: &[Mutation]) -> Vec<u8> {
    for m in muts {
        let len = b.len().max(1);
        match m {
            Mutation::Set(i, v) => {
                if !b.is_empty() {
                    b[i % len] = *v;
                }
            }
            Mutation::Truncate(i) => b.truncate(i % len),
            Mutation::Insert(i, v) => {
                let at = i % (b.len() + 1);
                b.splice(at..at, v.iter().copied());
            }
            Mutation::Remove(i, n) => {
                let at = i % len;
                let end = (at + n).min(b.len());
                if at < end {
                    b.drain(at..end);
                }
            }
        }
    }
    b
}

fn reply(srv: &Server, last: &Transmit, k: Kind) -> Vec<u8> {
    match k {
        Kind::Offer => srv.offer(last),
        Kind::Ack => srv.ack(last),
        Kind::Nak => srv.nak(last, Some("no")),
        Kind::OtherAck => Server {
            ip: OTHER_SERVER_IP,
            ..srv.clone()
        }
        .reply(last, MessageType::Ack, ADDR),
    }
}

/// One step of the RFC 2131 diagram caused by a timer.
fn timer_step(from: State) -> &'static [State] {
    use State::*;
    match from {
        Init | Selecting => &[Selecting, Failed],
        Requesting => &[Requesting, Selecting, Failed],
        InitReboot => &[Rebooting, Failed],
        Rebooting => &[Rebooting, Selecting, Failed],
        Bound | Renewing => &[Renewing, Rebinding, Selecting],
        Rebinding => &[Rebinding, Selecting],
        Released | Failed => &[],
    }
}

fn timer_reachable(from: State, to: State) -> bool {
    let mut seen = vec![from];
    let mut i = 0;
    while i < seen.len() {
        for next in timer_step(seen[i]) {
            if !seen.contains(next) {
                seen.push(*next);
            }
        }
        i += 1;
    }
    seen.contains(&to)
}

/// States an accepted reply may lead to. An ACK may be followed at once by
/// timers that are already due (a late ACK past T1/T2/expiry).
fn packet_allowed(from: State, to: State) -> bool {
    use State::*;
    match from {
        Selecting => to == Requesting,
        Requesting | Rebooting | Renewing | Rebinding => {
            matches!(to, Init | Selecting) || timer_reachable(Bound, to) || to == Bound
        }
        _ => false,
    }
}

fn check_invariants(h: &H) -> Result<(), TestCaseError> {
    let st = h.c.state();
    prop_assert_eq!(st.has_lease(), h.c.lease().is_some(), "state {:?}", st);
    if let Some(l) = h.c.lease() {
        prop_assert!(l.prefix_len <= 32);
        prop_assert!(is_unicast(l.address), "{:?}", l.address);
        prop_assert!(!l.lease_time.is_zero());
        if !l.is_infinite() {
            prop_assert!(
                !l.t1.is_zero() && l.t1 < l.t2 && l.t2 < l.lease_time,
                "{:?}",
                l
            );
        }
        for r in &l.routes {
            prop_assert!(r.prefix_len <= 32);
        }
    }
    match st {
        State::Released | State::Failed => prop_assert_eq!(h.c.poll_timeout(), None),
        State::Bound => {}
        _ => prop_assert!(h.c.poll_timeout().is_some(), "no timer in {:?}", st),
    }
    Ok(())
}

/// Check queued transmits and remember the last one (replies answer it).
fn drain(h: &mut H, last: &mut Option<Transmit>) -> Result<(), TestCaseError> {
    let tx = h.tx();
    for t in &tx {
        prop_assert_eq!(t.payload[28..34].to_vec(), CLIENT_MAC.to_vec());
        if t.src_ip != Ipv4Addr::UNSPECIFIED {
            prop_assert!(h.c.lease().is_some() || t.kind == crate::MessageKind::Release);
        }
    }
    if let Some(t) = tx.into_iter().next_back() {
        *last = Some(t);
    }
    Ok(())
}

/// Feed one reply: a drop changes nothing but its counter; an accepted reply
/// moves along the diagram.
fn feed_checked(
    h: &mut H,
    bytes: &[u8],
    before: State,
    lease_before: Option<&crate::Lease>,
) -> Result<bool, TestCaseError> {
    let stats_before = h.c.stats().clone();
    if let Err(reason) = h.feed(bytes) {
        prop_assert_eq!(h.c.state(), before, "drop {:?} changed state", reason);
        prop_assert_eq!(h.c.lease(), lease_before);
        prop_assert!(h.c.poll_event().is_none());
        prop_assert!(h.c.poll_transmit().is_none());
        prop_assert_eq!(
            h.c.stats().dropped(reason),
            stats_before.dropped(reason) + 1
        );
        return Ok(false);
    }
    let after = h.c.state();
    prop_assert!(
        packet_allowed(before, after),
        "packet moved {:?} -> {:?}",
        before,
        after
    );
    if after == State::Bound && !before.has_lease() {
        let ev: Vec<Event> = std::iter::from_fn(|| h.c.poll_event()).collect();
        prop_assert!(ev.iter().any(|e| matches!(e, Event::Bound(_))), "{:?}", ev);
    }
    Ok(true)
}

/// States visited and transitions made by accepted replies, to show the
/// property tests really reach every state.
#[derive(Default)]
struct Coverage {
    states: HashSet<State>,
    packet_moves: HashSet<(State, State)>,
}

fn run(
    cfg: ClientConfig,
    srv: Server,
    seed: u64,
    ops: Vec<Op>,
    cov: &mut Coverage,
) -> Result<(), TestCaseError> {
    let mut h = H::with_seed(cfg, seed);
    h.srv = srv;
    let mut last: Option<Transmit> = None;
    drain(&mut h, &mut last)?;
    for op in ops {
        let before = h.c.state();
        let lease_before = h.c.lease().cloned();
        match op {
            Op::Advance(ms) => {
                h.advance(Duration::from_millis(ms));
                let after = h.c.state();
                prop_assert!(
                    timer_reachable(before, after),
                    "{:?} -> {:?}",
                    before,
                    after
                );
                if let Some(t) = h.c.poll_timeout() {
                    prop_assert!(t > h.now, "timer left due after handle_timeout");
                }
            }
            Op::Fire => {
                if h.c.poll_timeout().is_some() {
                    h.fire();
                    let after = h.c.state();
                    prop_assert!(
                        timer_reachable(before, after),
                        "{:?} -> {:?}",
                        before,
                        after
                    );
                }
            }
            Op::Garbage(_) | Op::GarbageOptions(..) | Op::Valid(_) | Op::Mutated(..) => {
                let bytes = match op {
                    Op::Garbage(b) => b,
                    Op::GarbageOptions(o, s, f) => raw_reply(h.c.xid(), ADDR, &o, &s, &f),
                    Op::Valid(k) => match &last {
                        Some(t) => reply(&h.srv, t, k),
                        None => continue,
                    },
                    Op::Mutated(k, m) => match &last {
                        Some(t) => mutate(reply(&h.srv, t, k), &m),
                        None => continue,
                    },
                    _ => unreachable!(),
                };
                if feed_checked(&mut h, &bytes, before, lease_before.as_ref())? {
                    cov.packet_moves.insert((before, h.c.state()));
                }
            }
            Op::Release => {
                h.c.release(h.now);
                prop_assert_eq!(h.c.state(), State::Released);
            }
            Op::Decline => {
                h.c.decline(h.now);
                let after = h.c.state();
                if matches!(
                    before,
                    State::Requesting | State::Bound | State::Renewing | State::Rebinding
                ) {
                    prop_assert_eq!(after, State::Init);
                } else {
                    prop_assert_eq!(after, before);
                }
            }
            Op::Restart => {
                h.c.restart(h.now);
                prop_assert!(matches!(h.c.state(), State::Selecting | State::Rebooting));
            }
        }
        drain(&mut h, &mut last)?;
        while h.c.poll_event().is_some() {}
        check_invariants(&h)?;
        cov.states.insert(h.c.state());
    }
    Ok(())
}

proptest! {
    // 512 cases by default; PROPTEST_CASES raises it for longer fuzzing runs.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(512),
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_sequences_never_panic_or_break_the_diagram(
        cfg in config(),
        srv in server(),
        seed in any::<u64>(),
        ops in prop::collection::vec(op(), 1..40),
    ) {
        run(cfg, srv, seed, ops, &mut Coverage::default())?;
    }

    #[test]
    fn arbitrary_payloads_in_every_state_are_dropped_without_effect(
        state_script in 0usize..8,
        payload in prop::collection::vec(any::<u8>(), 0..700),
        addressed in any::<bool>(),
    ) {
        // Drive the client to a given state with valid traffic first.
        let mut h = H::new(cfg());
        let d = h.one_tx();
        let mut last = d.clone();
        let steps: &[&str] = match state_script {
            0 => &[],                                   // SELECTING
            1 => &["offer"],                            // REQUESTING
            2 => &["offer", "ack"],                     // BOUND
            3 => &["offer", "ack", "t1"],               // RENEWING
            4 => &["offer", "ack", "t1", "t2"],         // REBINDING
            5 => &["offer", "nak2"],                    // INIT (NAK backoff)
            6 => &["release"],                          // RELEASED
            _ => &["fail"],                             // FAILED
        };
        for s in steps {
            match *s {
                "offer" => { h.feed(&h.srv.offer(&last)).unwrap(); last = h.one_tx(); }
                "ack" => { h.feed(&h.srv.ack(&last)).unwrap(); }
                "t1" => { h.fire(); last = h.one_tx(); }
                "t2" => { while h.c.state() == State::Renewing { h.fire(); } last = h.tx().pop().unwrap(); }
                "nak2" => {
                    h.feed(&h.srv.nak(&last, None)).unwrap();
                    last = h.one_tx();
                    h.feed(&h.srv.offer(&last)).unwrap();
                    last = h.one_tx();
                    h.feed(&h.srv.nak(&last, None)).unwrap();
                    prop_assert_eq!(h.c.state(), State::Init);
                }
                "release" => h.c.release(h.now),
                _ => { while h.c.state() != State::Failed { h.fire(); } }
            }
        }
        let _ = last;
        h.ev();
        h.tx();
        let before = h.c.state();
        let lease = h.c.lease().cloned();
        let bytes = if addressed && payload.len() > 34 {
            // Put our xid and chaddr into the arbitrary bytes so the deeper
            // checks run.
            let mut p = payload.clone();
            p[4..8].copy_from_slice(&h.c.xid().to_be_bytes());
            p[28..34].copy_from_slice(&CLIENT_MAC);
            p
        } else {
            payload
        };
        let r = h.feed(&bytes);
        if r.is_err() {
            prop_assert_eq!(h.c.state(), before);
            prop_assert_eq!(h.c.lease().cloned(), lease);
            prop_assert!(h.c.poll_event().is_none() && h.c.poll_transmit().is_none());
        } else {
            prop_assert!(packet_allowed(before, h.c.state()));
        }
    }

    #[test]
    fn parser_never_panics_and_agrees_with_itself(
        opts in prop::collection::vec(any::<u8>(), 0..600),
        sname in prop::collection::vec(any::<u8>(), 0..64),
        file in prop::collection::vec(any::<u8>(), 0..128),
    ) {
        let p = raw_reply(1, ADDR, &opts, &sname, &file);
        if let Ok(r) = crate::validate::parse_reply(&p) {
            // Every option payload is a concatenation of bytes present in the
            // message, so none can exceed its size.
            let total: usize = r.options.values().map(Vec::len).sum();
            prop_assert!(total <= p.len());
            let _ = crate::lease::from_reply(&r, Ipv4Addr::new(192, 0, 2, 1), &crate::RoutePolicy::default(), 0);
        }
    }

    #[test]
    fn observed_parser_agrees_with_the_reply_parser(
        op in 0u8..4,
        opts in prop::collection::vec(any::<u8>(), 0..600),
        sname in prop::collection::vec(any::<u8>(), 0..64),
        file in prop::collection::vec(any::<u8>(), 0..128),
    ) {
        let mut p = raw_reply(1, ADDR, &opts, &sname, &file);
        p[0] = op;
        // Panics on a disagreement (see its documentation).
        crate::fuzzing::observed_messages(&p);
    }
}

/// The generated sequences reach every state and every kind of transition a
/// reply can cause (a deterministic sample of the same strategies).
#[test]
fn property_sequences_cover_every_state() {
    use State::*;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strategy = (
        config(),
        server(),
        any::<u64>(),
        prop::collection::vec(op(), 1..40),
    );
    let mut cov = Coverage::default();
    for _ in 0..600 {
        let (cfg, srv, seed, ops) = strategy.new_tree(&mut runner).unwrap().current();
        run(cfg, srv, seed, ops, &mut cov).unwrap();
    }
    for st in [
        Init, Selecting, Requesting, InitReboot, Rebooting, Bound, Renewing, Rebinding, Released,
        Failed,
    ] {
        // INIT-REBOOT is only transient (no init delay in these configs).
        if st != InitReboot {
            assert!(cov.states.contains(&st), "never reached {st:?}");
        }
    }
    for mv in [
        (Selecting, Requesting),
        (Requesting, Bound),
        (Requesting, Selecting),
        (Rebooting, Bound),
        (Rebooting, Selecting),
        (Renewing, Bound),
        (Renewing, Selecting),
        (Rebinding, Bound),
        (Rebinding, Selecting),
    ] {
        assert!(
            cov.packet_moves.contains(&mv),
            "never saw {mv:?} by reply: {:?}",
            cov.packet_moves
        );
    }
}
