//! Fuzzing entry point of the `DHCPv6` engine (re-exported as
//! `xdhcp_engine::fuzzing::v6_server_messages`; the `fuzz/` target of that
//! name calls it, unit tests replay its committed corpus).
//!
//! Input: a selector byte, then one server message. The selector's low three
//! bits put a client in a state that waits for a server message (SOLICITING,
//! REQUESTING, RENEWING, REBINDING, CONFIRMING, RELEASING, DECLINING) or in
//! BOUND; bit 3 turns Rapid Commit on; unless bit 4 is set the message's
//! transaction id is replaced by the client's, so most inputs reach the
//! option walk. Invariants:
//! - no panic, in the decoder or the client, nor at the timers after it;
//! - a message the client accepts also decodes on its own;
//! - a dropped message changes nothing but its drop counter (state, lease,
//!   timers, events);
//! - a lease appears or changes only through an accepted message whose IA_NA
//!   for the client's IAID lists that address with a non-zero valid
//!   lifetime, from the Server Identifier the lease names, with
//!   T1 ≤ T2 ≤ valid lifetime and a usable address;
//! - a timer is armed in every state but RELEASED and FAILED.
//!
//! One thing: the `DHCPv6` fuzz entry point and its seeds (built for fuzzing
//! and tests only, never shipped).

use std::net::Ipv6Addr;
use std::time::{Duration, Instant};

use dhcproto::v6::{DhcpOption, DhcpOptions, IAAddr, IANA, Message, MessageType, OptionCode};
use dhcproto::{Decodable, Decoder, Encodable, Encoder};

use super::lease::{INFINITY, IaView};
use super::validate;
use super::{
    Client, ClientConfig, Event, Lease, MessageKind, ResumeMode, State, Timeouts, Transmit,
};

const MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x61];
const ADDR: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x61);
const SRC: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);
const WALL0: u64 = 1_800_000_000_000;

fn server_duid() -> Vec<u8> {
    vec![0, 3, 0, 1, 0x02, 0, 0, 0, 0xee, 1]
}

fn config(rapid_commit: bool, resume: ResumeMode) -> ClientConfig {
    ClientConfig {
        mac: MAC,
        rapid_commit,
        resume,
        timeouts: Timeouts {
            sol_max_delay: Duration::ZERO,
            ..Timeouts::default()
        },
        ..ClientConfig::default()
    }
}

/// A valid server message of type `ty` answering `t`.
fn answer(t: &Transmit, ty: MessageType, rapid: bool) -> Vec<u8> {
    let sent = Message::decode(&mut Decoder::new(&t.payload)).expect("own message decodes");
    let mut m = Message::new_with_id(ty, [0; 3]);
    m.set_xid_num(t.xid);
    let mut o = DhcpOptions::new();
    if let Some(id) = sent.opts().get(OptionCode::ClientId) {
        o.insert(id.clone());
    }
    o.insert(DhcpOption::ServerId(server_duid()));
    if ty == MessageType::Advertise {
        o.insert(DhcpOption::Preference(255));
    }
    if rapid {
        o.insert(DhcpOption::RapidCommit);
    }
    let mut ia = DhcpOptions::new();
    ia.insert(DhcpOption::IAAddr(IAAddr {
        addr: ADDR,
        preferred_life: 2000,
        valid_life: 3000,
        opts: DhcpOptions::new(),
    }));
    o.insert(DhcpOption::IANA(IANA {
        id: t.iaid,
        t1: 1000,
        t2: 1600,
        opts: ia,
    }));
    m.set_opts(o);
    let mut buf = Vec::new();
    m.encode(&mut Encoder::new(&mut buf)).expect("encodes");
    buf
}

fn drain(c: &mut Client) -> Option<Transmit> {
    std::iter::from_fn(|| c.poll_transmit()).last()
}

fn bound_lease(c: &Client) -> Lease {
    c.lease().cloned().expect("bound")
}

/// A client in the state `which` selects, with the message it sent last.
fn client_in(which: u8, rapid: bool) -> (Client, Instant, Option<Transmit>) {
    let now = Instant::now();
    let resume = if which == 4 {
        ResumeMode::Confirm
    } else {
        ResumeMode::Rebind
    };
    let mut c = Client::new(config(rapid, resume), now, u64::from(which));
    c.set_wall_clock_unix_ms(WALL0);
    c.handle_timeout(now);
    let sol = drain(&mut c).expect("SOLICIT");
    if which == 0 {
        return (c, now, Some(sol));
    }
    let _ = c.handle_packet(now, SRC, &answer(&sol, MessageType::Advertise, false));
    let req = drain(&mut c).expect("REQUEST");
    if which == 1 {
        return (c, now, Some(req));
    }
    let _ = c.handle_packet(now, SRC, &answer(&req, MessageType::Reply, false));
    while c.poll_event().is_some() {}
    let lease = bound_lease(&c);
    match which {
        2 | 3 => {
            let t = c.lease_timers().expect("timers");
            let at = if which == 2 { t.t1 } else { t.t2 }.expect("finite");
            c.handle_timeout(at);
            let last = drain(&mut c);
            (c, at, last)
        }
        4 => {
            let mut c = Client::resume(config(rapid, resume), lease, now, WALL0 + 1000, 4);
            let last = drain(&mut c);
            (c, now, last)
        }
        5 => {
            c.release(now);
            let last = drain(&mut c);
            (c, now, last)
        }
        6 => {
            c.decline(now);
            while c.poll_event().is_some() {}
            let last = drain(&mut c);
            (c, now, last)
        }
        _ => (c, now, None),
    }
}

fn check_lease(l: &Lease, msg: &[u8], iaid: u32) {
    let m = validate::parse(msg).expect("an accepted message decodes");
    assert_eq!(
        m.server_id.as_ref(),
        Some(&l.server_id),
        "lease names another server"
    );
    let view = m
        .ia(iaid)
        .and_then(IaView::of)
        .expect("lease without our IA_NA");
    assert!(
        view.addresses
            .iter()
            .any(|a| a.address == l.address && a.valid == l.valid_secs && a.valid != 0),
        "lease address not in the IA_NA: {l:?}"
    );
    assert!(validate::is_usable(l.address), "{l:?}");
    assert!(l.t1_secs <= l.t2_secs, "{l:?}");
    assert!(
        l.t2_secs <= l.valid_secs || l.valid_secs == INFINITY,
        "{l:?}"
    );
    assert_eq!(l.iaid, iaid);
}

/// Feed one server message to a client in a chosen state; panics on a
/// violated invariant (see the module docs).
pub fn server_messages(data: &[u8]) {
    let Some((&sel, msg)) = data.split_first() else {
        return;
    };
    let _ = validate::parse(msg);
    let (mut c, now, _) = client_in(sel & 7, sel & 8 != 0);
    let mut msg = msg.to_vec();
    if sel & 16 == 0 && msg.len() >= 4 {
        let xid = c.xid().to_be_bytes();
        msg[1..4].copy_from_slice(&xid[1..]);
    }
    let before = (c.state(), c.lease().cloned(), c.lease_timers());
    let dropped = c.stats().dropped_total();
    let result = c.handle_packet(now, SRC, &msg);
    let events: Vec<Event> = std::iter::from_fn(|| c.poll_event()).collect();
    if let Err(reason) = result {
        assert_eq!(
            (c.state(), c.lease().cloned(), c.lease_timers()),
            before,
            "a dropped message ({reason}) changed the client"
        );
        assert!(
            events.is_empty(),
            "a dropped message made events: {events:?}"
        );
        assert_eq!(c.stats().dropped_total(), dropped + 1);
        assert!(c.stats().dropped(reason) >= 1);
    } else {
        assert!(
            validate::parse(&msg).is_ok(),
            "accepted but does not decode"
        );
        for e in &events {
            match e {
                Event::Bound(l) | Event::Renewed(l) | Event::Changed { new: l, .. } => {
                    check_lease(l, &msg, c.iaid());
                }
                Event::Lost { .. } | Event::Released | Event::Failed(_) => {}
            }
        }
        if c.lease() != before.1.as_ref() && c.lease().is_some() {
            assert!(
                events.iter().any(|e| matches!(
                    e,
                    Event::Bound(_) | Event::Renewed(_) | Event::Changed { .. }
                )),
                "lease changed without an event"
            );
        }
    }
    if !matches!(c.state(), State::Released | State::Failed) {
        let t = c.poll_timeout();
        assert!(t.is_some(), "no timer in {}", c.state());
        // The timers run without panicking and do not make a lease.
        let lease = c.lease().cloned();
        if let Some(t) = t {
            c.handle_timeout(t);
        }
        assert!(c.lease().is_none() || c.lease() == lease.as_ref());
    }
    while c.poll_transmit().is_some() {}
}

/// Seeds: for each state, the valid message it waits for.
pub fn server_messages_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let names = [
        "soliciting-advertise",
        "requesting-reply",
        "renewing-reply",
        "rebinding-reply",
        "confirming-reply",
        "releasing-reply",
        "declining-reply",
    ];
    let mut out = Vec::new();
    for (which, name) in (0u8..).zip(names) {
        let (_, _, last) = client_in(which, false);
        let t = last.expect("a message out");
        let ty = if t.kind == MessageKind::Solicit {
            MessageType::Advertise
        } else {
            MessageType::Reply
        };
        let mut v = vec![which];
        v.extend(answer(&t, ty, false));
        out.push((name, v));
    }
    let (_, _, last) = client_in(0, true);
    let mut v = vec![8];
    v.extend(answer(&last.expect("SOLICIT"), MessageType::Reply, true));
    out.push(("rapid-commit-reply", v));
    out
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn corpus_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/v6_server_messages")
    }

    #[test]
    fn seeds_pass_and_reach_the_deep_checks() {
        for (name, s) in server_messages_seeds() {
            server_messages(&s);
            // Each seed is accepted by its client: the lease checks run.
            let (mut c, now, _) = client_in(s[0] & 7, s[0] & 8 != 0);
            assert_eq!(c.handle_packet(now, SRC, &s[1..]), Ok(()), "{name}");
        }
    }

    #[test]
    fn the_committed_corpus_replays() {
        let mut n = 0;
        for e in std::fs::read_dir(corpus_dir()).expect("corpus directory") {
            let bytes = std::fs::read(e.expect("entry").path()).expect("corpus file");
            server_messages(&bytes);
            n += 1;
        }
        assert!(n >= server_messages_seeds().len());
    }

    #[test]
    fn the_checks_catch_a_lease_from_elsewhere() {
        let (_, _, last) = client_in(1, false);
        let msg = answer(&last.unwrap(), MessageType::Reply, false);
        let lease = Lease {
            address: "2001:db8::99".parse().unwrap(),
            iaid: u32::from_be_bytes([MAC[2], MAC[3], MAC[4], MAC[5]]),
            server_id: server_duid(),
            server_unicast: None,
            preferred_secs: 2000,
            valid_secs: 3000,
            t1_secs: 1000,
            t2_secs: 1600,
            dns_servers: Vec::new(),
            domain_search: Vec::new(),
            acquired_unix_ms: WALL0,
            server_source: None,
        };
        let r = std::panic::catch_unwind(|| check_lease(&lease, &msg, lease.iaid));
        assert!(r.is_err(), "an address the message does not carry passed");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(3000))]

        /// The invariants hold on mutated seeds (what libFuzzer starts
        /// from), so a finding is a real one.
        #[test]
        fn invariants_hold_on_mutated_seeds(
            idx in 0usize..8,
            sel in proptest::prelude::any::<u8>(),
            edits in proptest::collection::vec(
                (proptest::prelude::any::<usize>(), proptest::prelude::any::<u8>(), 0u8..4),
                0..6,
            ),
        ) {
            let mut s = server_messages_seeds().swap_remove(idx).1;
            if sel & 0x80 != 0 {
                s[0] = sel & 0x1f;
            }
            for (at, byte, op) in edits {
                let i = 1 + at % (s.len() - 1).max(1);
                match op {
                    0 if i < s.len() => s[i] = byte,
                    1 => s.truncate(i.max(2)),
                    2 => s.insert(i.min(s.len()), byte),
                    _ if i < s.len() && s.len() > 2 => { s.remove(i); }
                    _ => {}
                }
            }
            server_messages(&s);
        }
    }

    /// Writes the seeds into `fuzz/corpus/v6_server_messages/seed-*`.
    #[test]
    #[ignore = "writes files; run once when the seeds change"]
    fn write_seed_corpus() {
        let dir = corpus_dir();
        std::fs::create_dir_all(&dir).expect("mkdir");
        for (name, s) in server_messages_seeds() {
            std::fs::write(dir.join(format!("seed-{name}")), s).expect("write seed");
        }
    }
}
