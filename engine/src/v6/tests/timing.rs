//! Retransmission timing (RFC 8415 §15) seen from outside: every interval
//! within its RAND bounds, over many seeds.

use std::time::Duration;

use super::server::{H, Msg, T1, T2, cfg, ms, secs};
use crate::v6::{ClientConfig, MessageKind, State, Timeouts};

/// `[lo, hi]` of RT number `n` (0-based) for IRT/MRT in ms, with RAND ±10 %
/// compounded, or (once capped) MRT ± 10 %.
fn within(prev: Option<Duration>, rt: Duration, irt: u64, mrt: u64) -> bool {
    let capped = mrt != 0 && rt >= ms(mrt * 9 / 10) && rt <= ms(mrt * 11 / 10);
    match prev {
        None => rt >= ms(irt * 9 / 10) && rt <= ms(irt * 11 / 10),
        Some(p) => capped || (rt >= p * 19 / 10 && rt <= p * 21 / 10),
    }
}

#[test]
fn solicit_retransmissions_double_from_one_second_and_cap_at_sol_max_rt() {
    for seed in 0..40 {
        let mut h = H::seeded(cfg(), seed);
        h.one();
        let mut last = Duration::ZERO;
        let mut prev = None;
        for i in 0..16 {
            let (at, t) = h.next_tx();
            assert_eq!(t.kind, MessageKind::Solicit);
            let rt = at.saturating_sub(last);
            if i == 0 {
                assert!(
                    rt > secs(1) && rt <= ms(1100),
                    "first RT strictly above IRT: {rt:?}"
                );
            } else {
                assert!(
                    within(prev, rt, 1000, 3_600_000),
                    "seed {seed} #{i}: {prev:?} -> {rt:?}"
                );
                assert!(rt <= ms(3_960_000));
            }
            prev = Some(rt);
            last = at;
        }
        // 2^12 s > SOL_MAX_RT: capped by now.
        assert!(prev.unwrap() >= ms(3_240_000), "{prev:?}");
    }
}

#[test]
fn the_first_solicit_waits_up_to_sol_max_delay() {
    let mut delays = Vec::new();
    for seed in 0..200 {
        let t0 = std::time::Instant::now();
        let mut c = crate::v6::Client::new(
            ClientConfig {
                timeouts: Timeouts::default(),
                ..cfg()
            },
            t0,
            seed,
        );
        let at = c.poll_timeout().unwrap();
        let d = at - t0;
        assert!(d <= secs(1), "{d:?}");
        if d.is_zero() {
            assert!(c.poll_transmit().is_some());
        } else {
            assert_eq!(c.state(), State::Init);
            assert!(c.poll_transmit().is_none(), "nothing before the delay");
            c.handle_timeout(at);
            assert_eq!(c.poll_transmit().unwrap().kind, MessageKind::Solicit);
        }
        delays.push(d);
    }
    // Spread over the second, not one fixed value.
    assert!(delays.iter().any(|d| *d < ms(300)) && delays.iter().any(|d| *d > ms(700)));
}

#[test]
fn sol_max_rt_from_a_server_caps_solicit() {
    let mut h = H::new(cfg());
    let sol = h.one();
    let mut m = Msg::advertise(&sol, 1).no_ia();
    m.sol_max_rt = Some(60);
    // Ignored as an ADVERTISE (no addresses), but SOL_MAX_RT applies.
    h.feed(&m).unwrap_err();
    let mut last = Duration::ZERO;
    let mut rt = Duration::ZERO;
    for _ in 0..12 {
        let (at, _) = h.next_tx();
        rt = at.saturating_sub(last);
        last = at;
        assert!(rt <= ms(66_000), "{rt:?}");
    }
    assert!(rt >= ms(54_000), "{rt:?}");
}

#[test]
fn request_retransmits_req_max_rc_times_capped_at_req_max_rt_then_solicits() {
    for seed in 0..20 {
        let mut h = H::seeded(cfg(), seed);
        let sol = h.one();
        h.feed(&Msg::advertise(&sol, 1).pref(255)).unwrap();
        let req = h.one();
        let mut last = h.now - h.t0;
        let mut prev = None;
        for i in 1..10 {
            let (at, t) = h.next_tx();
            assert_eq!((t.kind, t.xid), (MessageKind::Request, req.xid), "#{i}");
            let rt = at.saturating_sub(last);
            assert!(
                within(prev, rt, 1000, 30_000),
                "seed {seed} #{i}: {prev:?} -> {rt:?}"
            );
            prev = Some(rt);
            last = at;
        }
        let (_, t) = h.next_tx();
        assert_eq!(t.kind, MessageKind::Solicit, "after REQ_MAX_RC = 10");
        assert_eq!(h.c.stats().request_timeouts, 1);
        assert_eq!(h.c.stats().sent(MessageKind::Request), 10);
    }
}

#[test]
fn renew_retransmits_from_ren_timeout_until_t2() {
    for seed in 0..20 {
        let mut h = H::seeded(cfg(), seed);
        let base = h.bind(1);
        let (at, renew) = h.next_tx();
        assert_eq!(renew.kind, MessageKind::Renew);
        let mut last = at;
        let mut prev = None;
        loop {
            let (at, t) = h.next_tx();
            if t.kind == MessageKind::Rebind {
                assert_eq!(h.now, base + secs(u64::from(T2)));
                break;
            }
            let rt = at.saturating_sub(last);
            assert!(
                within(prev, rt, 10_000, 600_000),
                "seed {seed}: {prev:?} -> {rt:?}"
            );
            assert!(h.now < base + secs(u64::from(T2)));
            prev = Some(rt);
            last = at;
        }
        // T1 = 1000 s, T2 = 1600 s: 10 + 20 + 40 + 80 + 160 + 320 = 630 s of
        // RTs fit in the 600 s window at most six times.
        assert!(h.c.stats().sent(MessageKind::Renew) <= 7);
        let _ = T1;
    }
}

#[test]
fn elapsed_time_counts_hundredths_since_the_first_transmission() {
    let mut h = H::new(cfg());
    let sol = h.one();
    assert_eq!(super::server::Sent::decode(&sol).elapsed(), Some(0));
    for _ in 0..4 {
        let (at, t) = h.next_tx();
        let cs = super::server::Sent::decode(&t).elapsed().unwrap();
        assert_eq!(u128::from(cs), at.as_millis() / 10);
    }
    // Capped at 0xffff (655.35 s).
    for _ in 0..10 {
        h.next_tx();
    }
    let (_, t) = h.next_tx();
    assert_eq!(super::server::Sent::decode(&t).elapsed(), Some(0xffff));
}
