//! Fuzzing entry points: one function per target, each feeding arbitrary
//! bytes to the real decoders and checking what must hold whatever the bytes
//! (the `fuzz/` crate's targets call only these; unit tests replay the
//! committed corpora through them).
//!
//! - [`client_replies`]: a [`Client`] driven by a script of replies (built with
//!   `dhcproto`, then extended with arbitrary options), raw bytes, timers and
//!   commands, so every state sees every kind of reply. Invariants: no panic;
//!   a lease appears or changes only through an accepted DHCPACK carrying the
//!   client's own xid, with `yiaddr`, server identifier and a non-zero lease
//!   time taken from that ACK; a dropped reply changes nothing but its
//!   counter; no route the policy refuses is ever in a lease; timers are
//!   armed exactly in the states that need them and never left due.
//! - [`reply_options`]: the raw option walk (overload, RFC 3396
//!   concatenation) and option 121. Invariants: splitting the reassembled
//!   options again and re-parsing gives the same map; option 121 re-encodes
//!   to the same routes; a lease built from the reply holds only routes the
//!   policy accepts and accounts for every route it refused.
//! - [`observed_messages`]: [`validate::parse_observed`], the decoder of
//!   watched messages (passive learning). Invariants: it agrees with
//!   [`validate::parse_reply`] on the same bytes as a BOOTREPLY (same
//!   header fields, message type, server identifier; a refusal for the
//!   same reason, or for one of its own option checks); its typed fields
//!   are exactly the option bytes; the direction (`op`) changes nothing
//!   else.
//!
//! - [`v6_server_messages`]: the `DHCPv6` decoder and client (see
//!   [`crate::v6::fuzzing`] for its layout and invariants).
//!
//! One thing: the engine's fuzz entry points, each with the invariants it
//! checks (built for fuzzing and the corpus replay only, never shipped).

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use dhcproto::v4::{DhcpOption, Message, MessageType, Opcode};
use dhcproto::{Encodable, Encoder};

pub use crate::v6::fuzzing::{
    server_messages as v6_server_messages, server_messages_seeds as v6_server_messages_seeds,
};

use crate::routes::{self, Ipv4Prefix, Route, RoutePolicy, RouteRejection};
use crate::validate::{self, ReplyType, is_unicast};
use crate::{Client, ClientConfig, ClientId, Event, Lease, Mode, PacketSource, State};

/// The client's hardware address in every script.
pub const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
/// The server scripts answer as.
pub const SERVER_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
/// A second server (its ACKs are for someone else's transaction).
pub const OTHER_SERVER_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);
/// The address offered by default.
pub const ADDR: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);
const OTHER_ADDR: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 11);
const SERVER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xfe];
const WALL0: u64 = 1_800_000_000_000;
/// Scripts stop after this many operations (keeps one input cheap).
const MAX_OPS: usize = 64;

/// Reads a script: missing bytes read as zero, so every input is a script.
struct Bytes<'a>(&'a [u8]);

impl<'a> Bytes<'a> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn take(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        head
    }
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// One step of a [`client_replies`] script; [`ScriptOp::encode`] writes the
/// bytes that decode to it (used to build the seed corpus).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScriptOp {
    /// Advance virtual time by this many seconds and fire due timers.
    Advance(u16),
    /// Jump to the next armed timer and fire it.
    Fire,
    /// A reply to the open transaction, encoded with `dhcproto`.
    Reply(ReplySpec),
    /// Raw bytes given the client's xid, `chaddr`, op/htype/hlen and cookie
    /// (when long enough), so the option walk runs on them.
    Addressed(Vec<u8>),
    /// Raw bytes as they are.
    Raw(Vec<u8>),
    Release,
    Decline,
    Restart,
    /// Move the wall clock by this many seconds (the monotonic clock stays).
    WallJump(u32),
}

/// A reply built with `dhcproto`; `extra` is appended verbatim before END.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplySpec {
    /// 0 OFFER, 1 ACK, 2 NAK, 3 ACK from another server.
    pub kind: u8,
    /// Option 51 (omitted when `flags` bit 0 is clear).
    pub lease_secs: u32,
    /// Bit 0: option 51; bit 1: option 1 (/24); bit 2: option 3; bit 3:
    /// echo option 61; bit 4: `yiaddr` is another address; bit 5: source
    /// MAC all-zero; bit 6: wrong `chaddr`; bit 7: wrong xid.
    pub flags: u8,
    pub extra: Vec<u8>,
}

impl ScriptOp {
    /// The script bytes of this operation.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            ScriptOp::Advance(s) => {
                out.push(0);
                out.extend_from_slice(&s.to_be_bytes());
            }
            ScriptOp::Fire => out.push(1),
            ScriptOp::Reply(r) => {
                out.push(2);
                out.push(r.kind);
                out.extend_from_slice(&r.lease_secs.to_be_bytes());
                out.push(r.flags);
                out.push(r.extra.len().min(255) as u8);
                out.extend_from_slice(&r.extra[..r.extra.len().min(255)]);
            }
            ScriptOp::Addressed(b) => {
                out.push(3);
                let n = b.len().min(1023);
                out.extend_from_slice(&(n as u16).to_be_bytes());
                out.extend_from_slice(&b[..n]);
            }
            ScriptOp::Raw(b) => {
                out.push(4);
                let n = b.len().min(255);
                out.push(n as u8);
                out.extend_from_slice(&b[..n]);
            }
            ScriptOp::Release => out.push(5),
            ScriptOp::Decline => out.push(6),
            ScriptOp::Restart => out.push(7),
            ScriptOp::WallJump(s) => {
                out.push(8);
                out.extend_from_slice(&s.to_be_bytes());
            }
        }
    }

    fn decode(b: &mut Bytes<'_>) -> ScriptOp {
        match b.u8() % 10 {
            0 => ScriptOp::Advance(b.u16()),
            1 | 9 => ScriptOp::Fire,
            2 => {
                let kind = b.u8() % 4;
                let lease_secs = b.u32();
                let flags = b.u8();
                let n = usize::from(b.u8());
                ScriptOp::Reply(ReplySpec {
                    kind,
                    lease_secs,
                    flags,
                    extra: b.take(n).to_vec(),
                })
            }
            3 => {
                let n = usize::from(b.u16() % 1024);
                ScriptOp::Addressed(b.take(n).to_vec())
            }
            4 => {
                let n = usize::from(b.u8());
                ScriptOp::Raw(b.take(n).to_vec())
            }
            5 => ScriptOp::Release,
            6 => ScriptOp::Decline,
            7 => ScriptOp::Restart,
            _ => ScriptOp::WallJump(b.u32()),
        }
    }
}

/// The configuration byte of a script: bit 0 INIT-REBOOT for [`ADDR`];
/// bit 1 one-shot; bit 2 no default route allowed; bit 3 10.0.0.0/8
/// protected; bit 4 default-route override allowed; bit 5 no client id;
/// bit 6 one-second renewal retransmissions; bit 7 at most two routes.
pub fn script_config(flags: u8) -> ClientConfig {
    let mut c = ClientConfig {
        chaddr: CLIENT_MAC,
        hostname: Some("pod-a".into()),
        ..ClientConfig::default()
    };
    if flags & 1 != 0 {
        c.requested_ip = Some(ADDR);
    }
    if flags & 2 != 0 {
        c.mode = Mode::OneShot;
    }
    let p = &mut c.route_policy;
    p.allow_default_route = flags & 4 == 0;
    if flags & 8 != 0 {
        p.protected = vec![Ipv4Prefix::new(Ipv4Addr::new(10, 0, 0, 0), 8).expect("/8")];
    }
    p.allow_default_override = flags & 16 != 0;
    if flags & 32 != 0 {
        c.client_id = ClientId::None;
    }
    if flags & 64 != 0 {
        c.retransmit.renew_min_interval = Duration::from_secs(1);
    }
    if flags & 128 != 0 {
        p.max_routes = 2;
    }
    c
}

/// A whole script: configuration byte, seed byte, operations.
pub fn encode_script(config: u8, seed: u8, ops: &[ScriptOp]) -> Vec<u8> {
    let mut out = vec![config, seed];
    for op in ops {
        op.encode(&mut out);
    }
    out
}

fn build_reply(c: &Client, spec: &ReplySpec) -> Vec<u8> {
    let (ty, server) = match spec.kind % 4 {
        0 => (MessageType::Offer, SERVER_IP),
        1 => (MessageType::Ack, SERVER_IP),
        2 => (MessageType::Nak, SERVER_IP),
        _ => (MessageType::Ack, OTHER_SERVER_IP),
    };
    let f = spec.flags;
    let yiaddr = match (ty, f & 16 != 0) {
        (MessageType::Nak, _) => Ipv4Addr::UNSPECIFIED,
        (_, true) => OTHER_ADDR,
        (_, false) => ADDR,
    };
    let xid = if f & 128 != 0 { c.xid() ^ 1 } else { c.xid() };
    let mut chaddr = CLIENT_MAC;
    if f & 64 != 0 {
        chaddr[5] ^= 0x80;
    }
    let mut m = Message::new_with_id(
        xid,
        Ipv4Addr::UNSPECIFIED,
        yiaddr,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        &chaddr,
    );
    m.set_opcode(Opcode::BootReply);
    let o = m.opts_mut();
    o.insert(DhcpOption::MessageType(ty));
    o.insert(DhcpOption::ServerIdentifier(server));
    if ty != MessageType::Nak {
        if f & 1 != 0 {
            o.insert(DhcpOption::AddressLeaseTime(spec.lease_secs));
        }
        if f & 2 != 0 {
            o.insert(DhcpOption::SubnetMask(Ipv4Addr::new(255, 255, 255, 0)));
        }
        if f & 4 != 0 {
            o.insert(DhcpOption::Router(vec![SERVER_IP]));
        }
    }
    if f & 8 != 0
        && let Some(id) = c.config().client_id.bytes(CLIENT_MAC)
    {
        o.insert(DhcpOption::ClientIdentifier(id));
    }
    let mut buf = Vec::new();
    // Encoding a message of a few fixed options into a Vec cannot fail.
    m.encode(&mut Encoder::new(&mut buf))
        .expect("encoding a reply into a Vec");
    if buf.last() == Some(&255) {
        buf.pop();
    }
    buf.extend_from_slice(&spec.extra);
    buf.push(255);
    buf
}

fn addressed(c: &Client, raw: &[u8]) -> Vec<u8> {
    let mut p = raw.to_vec();
    if p.len() >= 34 {
        p[0] = 2;
        p[1] = 1;
        p[2] = 6;
        p[4..8].copy_from_slice(&c.xid().to_be_bytes());
        p[28..34].copy_from_slice(&CLIENT_MAC);
    }
    if p.len() >= validate::HEADER_LEN + 4 {
        p[validate::HEADER_LEN..validate::HEADER_LEN + 4].copy_from_slice(&validate::MAGIC_COOKIE);
    }
    p
}

/// What every lease the client holds satisfies: a unicast address, a
/// non-zero lease time, ordered timers, and only routes `policy` accepts.
/// Panics on a violation.
pub fn check_lease(l: &Lease, policy: &RoutePolicy) {
    assert!(is_unicast(l.address), "leased {} is not unicast", l.address);
    assert!(l.prefix_len <= 32, "{l:?}");
    assert!(!l.lease_time.is_zero(), "a zero lease time was accepted");
    if !l.is_infinite() {
        assert!(
            !l.t1.is_zero() && l.t1 < l.t2 && l.t2 < l.lease_time,
            "timers out of order: {l:?}"
        );
    }
    assert!(l.routes.len() <= policy.max_routes, "{l:?}");
    for r in &l.routes {
        assert!(r.prefix_len <= 32);
        assert_eq!(
            Ipv4Prefix::new(r.dest, r.prefix_len).map(|p| p.addr),
            Some(r.dest),
            "host bits set in {r}"
        );
        assert_eq!(policy.check(r), Ok(()), "route {r} the policy refuses");
    }
    if let Some(gw) = l.routers.first() {
        let implied = Route {
            dest: Ipv4Addr::UNSPECIFIED,
            prefix_len: 0,
            gateway: *gw,
        };
        assert_eq!(
            policy.check(&implied),
            Ok(()),
            "router {gw} the policy refuses"
        );
    }
    for gw in &l.routers {
        assert!(is_unicast(*gw), "router {gw}");
    }
}

/// What a lease appearing or changing must be backed by: an ACK with the
/// client's xid, from which address, server and lease time are taken.
fn check_ack_backs(l: &Lease, payload: &[u8], xid: u32) {
    let reply = validate::parse_reply(payload).expect("a lease from a reply that does not parse");
    assert_eq!(reply.xid, xid, "a lease from a reply to another xid");
    assert_eq!(
        reply.chaddr, CLIENT_MAC,
        "a lease from a reply to another client"
    );
    assert_eq!(
        reply.reply_type(),
        Ok(ReplyType::Ack),
        "a lease without an ACK"
    );
    assert_eq!(reply.yiaddr, l.address, "leased address is not yiaddr");
    assert_eq!(reply.server_id(), Ok(l.server_id));
    let secs = reply
        .options
        .get(&51)
        .and_then(|v| <[u8; 4]>::try_from(v.as_slice()).ok())
        .map(u32::from_be_bytes)
        .expect("a lease from an ACK without a 4-byte option 51");
    assert_ne!(secs, 0, "a zero lease time was accepted");
    assert_eq!(
        l.lease_time,
        Duration::from_secs(u64::from(secs).max(crate::lease::MIN_LEASE_SECS))
    );
}

struct Driver {
    c: Client,
    t0: Instant,
    now: Instant,
    wall_offset: u64,
}

impl Driver {
    fn wall(&self) -> u64 {
        WALL0
            .saturating_add(self.wall_offset)
            .saturating_add((self.now - self.t0).as_millis() as u64)
    }

    fn set_wall(&mut self) {
        let w = self.wall();
        self.c.set_wall_clock_unix_ms(w);
    }

    /// Drain and check transmits; return the events.
    fn drain(&mut self) -> Vec<Event> {
        while let Some(t) = self.c.poll_transmit() {
            assert_eq!(
                &t.payload[28..34],
                &CLIENT_MAC,
                "transmit for another chaddr"
            );
            assert_eq!(
                u32::from_be_bytes([t.payload[4], t.payload[5], t.payload[6], t.payload[7]]),
                t.xid
            );
            assert!(
                t.src_ip.is_unspecified()
                    || self.c.lease().is_some()
                    || t.kind == crate::MessageKind::Release,
                "sent from {} without a lease",
                t.src_ip
            );
        }
        std::iter::from_fn(|| self.c.poll_event()).collect()
    }

    fn check_state(&self) {
        let st = self.c.state();
        assert_eq!(st.has_lease(), self.c.lease().is_some(), "state {st:?}");
        if let Some(l) = self.c.lease() {
            check_lease(l, &self.c.config().route_policy);
        }
        match st {
            State::Released | State::Failed => assert_eq!(self.c.poll_timeout(), None),
            State::Bound => {}
            _ => assert!(self.c.poll_timeout().is_some(), "no timer in {st:?}"),
        }
        if let Some(t) = self.c.poll_timeout() {
            assert!(t > self.now, "timer left due in {st:?}");
        }
    }

    fn feed(&mut self, payload: &[u8], src_mac: [u8; 6]) {
        let before = self.c.state();
        let lease_before = self.c.lease().cloned();
        let xid = self.c.xid();
        let stats_before = self.c.stats().clone();
        self.set_wall();
        let src = PacketSource {
            src_mac,
            src_ip: SERVER_IP,
        };
        if let Err(reason) = self.c.handle_packet(self.now, src, payload) {
            assert_eq!(self.c.state(), before, "drop {reason:?} changed the state");
            assert_eq!(self.c.lease(), lease_before.as_ref());
            assert!(
                self.c.poll_event().is_none(),
                "drop {reason:?} made an event"
            );
            assert!(self.c.poll_transmit().is_none(), "drop {reason:?} sent");
            assert_eq!(
                self.c.stats().dropped(reason),
                stats_before.dropped(reason) + 1
            );
            return;
        }
        assert!(before.expects_reply(), "accepted a reply in {before:?}");
        let reply = validate::parse_reply(payload).expect("accepted unparsable bytes");
        assert_eq!(reply.xid, xid, "accepted a reply to another xid");
        let events = self.drain();
        let lease = self.c.lease().cloned();
        if let Some(l) = &lease
            && lease_before.as_ref() != Some(l)
        {
            check_ack_backs(l, payload, xid);
        }
        let bound = events.iter().any(|e| matches!(e, Event::Bound(_)));
        let lost = events.iter().any(|e| matches!(e, Event::Lost { .. }));
        // A late ACK may be past its expiry already: Bound, then Lost.
        assert_eq!(
            bound,
            lease_before.is_none() && (lease.is_some() || lost),
            "{before:?} -> {:?}: {events:?}",
            self.c.state()
        );
        if bound && lease.is_none() {
            let Some(Event::Bound(l)) = events.first() else {
                panic!("Bound is not the first event: {events:?}");
            };
            check_ack_backs(l, payload, xid);
        }
        if lease_before.is_some() && lease.is_none() {
            assert!(
                events.iter().any(|e| matches!(e, Event::Lost { .. })),
                "lease gone without Lost: {events:?}"
            );
        }
    }

    /// Inputs that are not replies never create or alter a lease.
    fn after_command(&mut self, lease_before: Option<&Lease>) {
        let events = self.drain();
        let lease = self.c.lease();
        if let Some(l) = lease {
            assert_eq!(Some(l), lease_before, "a lease appeared without a reply");
        }
        if lease_before.is_some() && lease.is_none() && self.c.state() != State::Released {
            assert!(
                events.iter().any(|e| matches!(e, Event::Lost { .. })),
                "lease gone without Lost: {events:?}"
            );
        }
        assert!(
            !events.iter().any(|e| matches!(
                e,
                Event::Bound(_) | Event::Renewed(_) | Event::Changed { .. }
            )),
            "lease event without a reply: {events:?}"
        );
    }

    fn advance(&mut self, d: Duration) {
        let lease_before = self.c.lease().cloned();
        self.now += d;
        self.set_wall();
        self.c.handle_timeout(self.now);
        self.after_command(lease_before.as_ref());
    }
}

/// Drive a client with the script in `data` (see [`ScriptOp`]), checking the
/// invariants after every step. Panics on a violation.
pub fn client_replies(data: &[u8]) {
    let mut b = Bytes(data);
    let cfg = script_config(b.u8());
    let seed = u64::from(b.u8());
    let t0 = Instant::now();
    let mut c = Client::new(cfg, t0, seed);
    c.set_wall_clock_unix_ms(WALL0);
    let mut d = Driver {
        c,
        t0,
        now: t0,
        wall_offset: 0,
    };
    d.after_command(None);
    d.check_state();
    for _ in 0..MAX_OPS {
        if b.is_empty() {
            break;
        }
        match ScriptOp::decode(&mut b) {
            ScriptOp::Advance(s) => d.advance(Duration::from_secs(u64::from(s))),
            ScriptOp::Fire => {
                if let Some(t) = d.c.poll_timeout() {
                    let step = t.saturating_duration_since(d.now);
                    d.advance(step);
                }
            }
            ScriptOp::Reply(spec) => {
                let bytes = build_reply(&d.c, &spec);
                let mac = if spec.flags & 32 != 0 {
                    [0; 6]
                } else {
                    SERVER_MAC
                };
                d.feed(&bytes, mac);
            }
            ScriptOp::Addressed(raw) => {
                let bytes = addressed(&d.c, &raw);
                d.feed(&bytes, SERVER_MAC);
            }
            ScriptOp::Raw(raw) => d.feed(&raw, SERVER_MAC),
            ScriptOp::Release => {
                let lease_before = d.c.lease().cloned();
                d.set_wall();
                d.c.release(d.now);
                assert_eq!(d.c.state(), State::Released);
                d.after_command(lease_before.as_ref());
            }
            ScriptOp::Decline => {
                let before = d.c.state();
                let lease_before = d.c.lease().cloned();
                d.set_wall();
                d.c.decline(d.now);
                if matches!(
                    before,
                    State::Requesting | State::Bound | State::Renewing | State::Rebinding
                ) {
                    assert_eq!(d.c.state(), State::Init);
                } else {
                    assert_eq!(d.c.state(), before);
                }
                d.after_command(lease_before.as_ref());
            }
            ScriptOp::Restart => {
                d.set_wall();
                d.c.restart(d.now);
                assert!(matches!(d.c.state(), State::Selecting | State::Rebooting));
                assert!(d.c.lease().is_none());
                d.after_command(None);
            }
            ScriptOp::WallJump(s) => {
                d.wall_offset = d.wall_offset.saturating_add(u64::from(s) * 1000);
            }
        }
        d.check_state();
    }
}

/// Resume a stored `lease` (as the agent does after a restart) whose
/// acquisition was `elapsed_ms` ago, and check the client it gives: a held
/// lease only while unexpired and satisfying [`check_lease`], timers armed.
/// Panics on a violation.
pub fn resume_stored(lease: &Lease, elapsed_ms: u64) {
    let cfg = script_config(0);
    let now = Instant::now();
    let now_ms = lease.acquired_unix_ms.saturating_add(elapsed_ms);
    let mut c = Client::resume(cfg, lease.clone(), now, now_ms, 0);
    let st = c.state();
    assert_eq!(st.has_lease(), c.lease().is_some(), "{st:?}");
    if let Some(l) = c.lease() {
        // Times are repaired, but what the server granted is not altered.
        assert_eq!(l.address, lease.address);
        assert_eq!(l.lease_time, lease.lease_time);
        assert!(
            l.is_infinite() || Duration::from_millis(elapsed_ms) < l.lease_time,
            "an expired lease resumed as held"
        );
        assert!(!l.lease_time.is_zero(), "a zero lease time was resumed");
        assert!(l.prefix_len <= 32);
        if !l.is_infinite() {
            assert!(
                !l.t1.is_zero() && l.t1 < l.t2 && l.t2 < l.lease_time,
                "{l:?}"
            );
        }
    }
    match st {
        State::Released | State::Failed => assert_eq!(c.poll_timeout(), None),
        State::Bound => {}
        _ => assert!(c.poll_timeout().is_some(), "no timer in {st:?}"),
    }
    while let Some(t) = c.poll_transmit() {
        assert_eq!(&t.payload[28..34], &CLIENT_MAC);
    }
}

/// Split `options` into ≤255-byte instances in an options field (the
/// inverse of the RFC 3396 concatenation).
fn encode_options(options: &std::collections::BTreeMap<u8, Vec<u8>>) -> Vec<u8> {
    let mut out = Vec::new();
    for (code, data) in options {
        if data.is_empty() {
            out.extend_from_slice(&[*code, 0]);
        }
        for chunk in data.chunks(255) {
            out.push(*code);
            out.push(chunk.len() as u8);
            out.extend_from_slice(chunk);
        }
    }
    out.push(255);
    out
}

fn bootreply(yiaddr: Ipv4Addr, sname: &[u8], file: &[u8], options: &[u8]) -> Vec<u8> {
    let mut p = vec![0u8; validate::HEADER_LEN + 4];
    p[0] = 2;
    p[1] = 1;
    p[2] = 6;
    p[4..8].copy_from_slice(&1u32.to_be_bytes());
    p[16..20].copy_from_slice(&yiaddr.octets());
    p[28..34].copy_from_slice(&CLIENT_MAC);
    let sname = &sname[..sname.len().min(64)];
    let file = &file[..file.len().min(128)];
    p[44..44 + sname.len()].copy_from_slice(sname);
    p[108..108 + file.len()].copy_from_slice(file);
    p[validate::HEADER_LEN..].copy_from_slice(&validate::MAGIC_COOKIE);
    p.extend_from_slice(options);
    p
}

fn check_option121(data: &[u8]) {
    if let Ok(routes) = routes::parse_option121(data) {
        for r in &routes {
            assert!(r.prefix_len <= 32);
            assert_eq!(
                Ipv4Prefix::new(r.dest, r.prefix_len).map(|p| p.addr),
                Some(r.dest),
                "host bits kept in {r}"
            );
        }
        let again = routes::parse_option121(&routes::encode_option121(&routes))
            .expect("re-encoded option 121 does not parse");
        assert_eq!(again, routes, "option 121 does not round-trip");
    }
}

fn policies() -> [RoutePolicy; 3] {
    let strict = RoutePolicy {
        max_routes: 3,
        allow_default_route: false,
        protected: vec![
            Ipv4Prefix::new(Ipv4Addr::new(10, 0, 0, 0), 8).expect("/8"),
            Ipv4Prefix::new(Ipv4Addr::new(192, 0, 2, 0), 24).expect("/24"),
        ],
        ..RoutePolicy::default()
    };
    let open = RoutePolicy {
        allow_default_override: true,
        allow_protected_override: true,
        ..RoutePolicy::default()
    };
    [RoutePolicy::default(), strict, open]
}

/// The option walk of one reply whose options field, `sname` and `file`
/// come from `data`, and option 121 on `data` itself. Panics on a violation.
///
/// Layout: byte 0 `sname` length (mod 65), byte 1 `file` length (mod 129),
/// bytes 2..6 `yiaddr`, then `sname`, `file`, and the options field.
pub fn reply_options(data: &[u8]) {
    check_option121(data);
    let mut b = Bytes(data);
    let sname_len = usize::from(b.u8() % 65);
    let file_len = usize::from(b.u8() % 129);
    let yiaddr = Ipv4Addr::from(b.u32());
    let sname = b.take(sname_len);
    let file = b.take(file_len);
    let options = b.0;
    let p = bootreply(yiaddr, sname, file, options);
    let Ok(reply) = validate::parse_reply(&p) else {
        return;
    };
    let total: usize = reply.options.values().map(Vec::len).sum();
    assert!(total <= p.len(), "options longer than the message");
    // Reassembled options, split again into the options field alone (no
    // overload), parse back to the same map.
    let mut flat = reply.options.clone();
    flat.remove(&52);
    let again = validate::parse_reply(&bootreply(yiaddr, &[], &[], &encode_options(&flat)))
        .expect("re-split options do not parse");
    assert_eq!(
        again.options, flat,
        "RFC 3396 split/concatenation is not stable"
    );
    if let Some(o121) = reply.options.get(&121) {
        check_option121(o121);
    }
    let _ = reply.reply_type();
    let _ = reply.message();
    let Ok(server) = reply.server_id() else {
        return;
    };
    for policy in policies() {
        let Ok((lease, _notes)) = crate::lease::from_reply(&reply, server, &policy, WALL0) else {
            continue;
        };
        check_lease(&lease, &policy);
        assert_eq!(lease.address, reply.yiaddr);
        // Every option-121 route is either in the lease or rejected with a
        // reason the policy gives.
        if let Some(Ok(all)) = reply.options.get(&121).map(|d| routes::parse_option121(d)) {
            for r in &all {
                let kept = lease.routes.contains(r);
                let refused = lease.rejected_routes.iter().find(|x| x.route == *r);
                assert!(kept || refused.is_some(), "route {r} vanished");
                if let Some(x) = refused
                    && !kept
                {
                    match x.reason {
                        RouteRejection::TooMany => {
                            assert_eq!(lease.routes.len(), policy.max_routes);
                        }
                        reason => assert_eq!(policy.check(r), Err(reason)),
                    }
                }
            }
        }
    }
}

/// One watched message: `data` is the whole DHCP message (BOOTP header,
/// cookie, options). Panics on a violation.
pub fn observed_messages(data: &[u8]) {
    let observed = validate::parse_observed(data);
    let Some(&op) = data.first() else {
        assert_eq!(observed, Err(validate::DropReason::Truncated));
        return;
    };
    // The direction changes nothing but `op`.
    let mut other = data.to_vec();
    other[0] = if op == 1 { 2 } else { 1 };
    let flipped = validate::parse_observed(&other);
    match (&observed, &flipped) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a.op, op);
            assert_eq!(b.op, other[0]);
            assert_eq!(&validate::Observed { op, ..b.clone() }, a);
        }
        (Err(a), Err(b)) => assert_eq!(a, b),
        _ => panic!("op changed the outcome: {observed:?} / {flipped:?}"),
    }
    // The same bytes as a BOOTREPLY, through the lease path's parser.
    let mut as_reply = data.to_vec();
    as_reply[0] = 2;
    let reply = validate::parse_reply(&as_reply);
    let o = match (observed, reply) {
        (Ok(o), Ok(r)) => {
            assert_eq!(
                (o.xid, o.chaddr, o.ciaddr, o.yiaddr, o.giaddr),
                (r.xid, r.chaddr, r.ciaddr, r.yiaddr, r.giaddr)
            );
            let reply_type = match o.message_type {
                Some(validate::MessageType::Offer) => Ok(ReplyType::Offer),
                Some(validate::MessageType::Ack) => Ok(ReplyType::Ack),
                Some(validate::MessageType::Nak) => Ok(ReplyType::Nak),
                // Values no RFC assigns (the reply parser knows up to 18).
                Some(validate::MessageType::Other(v)) if !(9..=18).contains(&v) => {
                    Err(validate::DropReason::BadMessageType)
                }
                Some(_) => Err(validate::DropReason::UnexpectedType),
                None => Err(validate::DropReason::MissingMessageType),
            };
            assert_eq!(r.reply_type(), reply_type);
            match o.server_id {
                Some(s) => assert_eq!(r.server_id(), Ok(s)),
                None => assert_eq!(r.server_id(), Err(validate::DropReason::MissingServerId)),
            }
            check_observed_options(&o, &r.options);
            o
        }
        (Err(reason), Ok(r)) => {
            // Refused only by a check parse_reply leaves to its callers.
            let option = match reason {
                validate::DropReason::BadMessageType => 53,
                validate::DropReason::BadServerId => 54,
                validate::DropReason::BadLeaseTime => 51,
                other => panic!("refused with {other}, which the reply parser accepts"),
            };
            assert!(
                r.options.contains_key(&option),
                "{reason} without option {option}"
            );
            return;
        }
        (Err(a), Err(b)) => {
            assert_eq!(a, b, "the two parsers refuse for different reasons");
            return;
        }
        (Ok(_), Err(b)) => panic!("the reply parser refuses ({b}) what parse_observed accepts"),
    };
    assert!(o.server_id.is_none_or(is_unicast));
}

/// The typed fields of `o` are the option bytes.
fn check_observed_options(
    o: &validate::Observed,
    options: &std::collections::BTreeMap<u8, Vec<u8>>,
) {
    let get = |code: u8| options.get(&code).map(Vec::as_slice);
    assert_eq!(
        o.lease_time.map(u32::to_be_bytes).as_ref().map(|b| &b[..]),
        get(51)
    );
    if let Some(n) = o.prefix_len {
        let mask = u32::MAX.checked_shl(32 - u32::from(n)).unwrap_or(0);
        assert_eq!(get(1), Some(&mask.to_be_bytes()[..]));
    }
    if let Some(r) = o.router {
        assert_eq!(get(3).and_then(|v| v.get(..4)), Some(&r.octets()[..]));
    }
    if let Some(ip) = o.requested_ip {
        assert_eq!(get(50), Some(&ip.octets()[..]));
    }
    assert_eq!(o.rapid_commit, options.contains_key(&80));
    assert_eq!(
        o.message_type,
        match get(53) {
            Some(&[v]) => Some(validate::MessageType::from_code(v)),
            _ => None,
        }
    );
}

/// Seed scripts for [`client_replies`]: the RFC 2131 paths a real server
/// takes the client through (DORA, renewal, rebinding, NAK, reboot, expiry,
/// decline, release), with `dhcproto`-built replies.
pub fn client_replies_seeds() -> Vec<(&'static str, Vec<u8>)> {
    use ScriptOp::{Advance, Decline, Fire, Release, Reply, Restart, WallJump};
    let full = |kind| {
        Reply(ReplySpec {
            kind,
            lease_secs: 3600,
            flags: 0b0000_0111,
            extra: Vec::new(),
        })
    };
    let offer = full(0);
    let ack = full(1);
    let nak = Reply(ReplySpec {
        kind: 2,
        lease_secs: 0,
        flags: 0,
        extra: b"\x38\x05no!!".to_vec(),
    });
    let with_121 = Reply(ReplySpec {
        kind: 1,
        lease_secs: 600,
        flags: 0b0000_0111,
        // 121: 10.0.0.0/8 via 192.0.2.1, 0/0 via 192.0.2.1; 58/59 times.
        extra: vec![
            121, 13, 8, 10, 192, 0, 2, 1, 0, 192, 0, 2, 1, 58, 4, 0, 0, 0, 100, 59, 4, 0, 0, 1, 0,
        ],
    });
    vec![
        ("dora", encode_script(0, 1, &[offer.clone(), ack.clone()])),
        (
            "dora-renew",
            encode_script(
                0,
                2,
                &[offer.clone(), ack.clone(), Advance(1800), ack.clone(), Fire],
            ),
        ),
        (
            "dora-rebind-expire",
            encode_script(
                0x40,
                3,
                &[
                    offer.clone(),
                    ack.clone(),
                    Fire,
                    Fire,
                    Fire,
                    ack.clone(),
                    Advance(4000),
                ],
            ),
        ),
        (
            "nak-then-dora",
            encode_script(
                0,
                4,
                &[offer.clone(), nak.clone(), Fire, offer.clone(), ack.clone()],
            ),
        ),
        (
            "reboot",
            encode_script(
                1,
                5,
                &[ack.clone(), Advance(1800), nak, Fire, offer.clone()],
            ),
        ),
        (
            "routes-policy",
            encode_script(0x8c, 6, &[offer.clone(), with_121.clone(), Fire, with_121]),
        ),
        (
            "decline-release",
            encode_script(
                0x20,
                7,
                &[
                    offer.clone(),
                    ack.clone(),
                    Decline,
                    Fire,
                    offer,
                    ack,
                    Release,
                ],
            ),
        ),
        (
            "one-shot-wall",
            encode_script(2, 8, &[WallJump(7200), full(0), full(3), full(1), Restart]),
        ),
    ]
}

/// Seed inputs for [`reply_options`]: an ACK with options split across
/// instances, overloaded into `file` and `sname`, and option 121.
pub fn reply_options_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let head = |sname: &[u8], file: &[u8]| {
        let mut v = vec![sname.len() as u8, file.len() as u8, 192, 0, 2, 10];
        v.extend_from_slice(sname);
        v.extend_from_slice(file);
        v
    };
    let base = [53, 1, 5, 54, 4, 192, 0, 2, 1, 51, 4, 0, 0, 14, 16];
    let mut plain = head(&[], &[]);
    plain.extend_from_slice(&base);
    plain.extend_from_slice(&[1, 4, 255, 255, 255, 0, 3, 4, 192, 0, 2, 1, 255]);

    let mut split121 = head(&[], &[]);
    split121.extend_from_slice(&base);
    // 121 in two instances (RFC 3396): 10.0.0.0/8 via .1 | 0/0 via .1.
    split121.extend_from_slice(&[121, 6, 8, 10, 192, 0, 2, 1, 15, 3, b'e', b'x', b'a']);
    split121.extend_from_slice(&[121, 5, 0, 192, 0, 2, 1, 15, 4, b'm', b'p', b'l', b'e', 255]);

    let file = [121, 7, 16, 172, 16, 192, 0, 2, 1, 255];
    let sname = [6, 4, 192, 0, 2, 53, 255];
    let mut overload = head(&sname, &file);
    overload.extend_from_slice(&base);
    overload.extend_from_slice(&[52, 1, 3, 121, 5, 0, 192, 0, 2, 1, 255]);

    let tunnelvision = {
        let mut v = head(&[], &[]);
        v.extend_from_slice(&base);
        v.extend_from_slice(&[
            121, 20, 1, 0, 192, 0, 2, 1, 1, 128, 192, 0, 2, 1, 32, 10, 1, 2, 3, 192, 0, 2, 1, 255,
        ]);
        v
    };
    vec![
        ("plain-ack", plain),
        ("split-121", split121),
        ("overload-both", overload),
        ("tunnelvision", tunnelvision),
    ]
}

/// Seed inputs for [`observed_messages`]: a guest's exchange as a server
/// and its client send it (ACK, RELEASE, DECLINE, an INFORM's ACK), and an
/// ACK whose options are overloaded into `file` and `sname`.
pub fn observed_messages_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let build = |op: Opcode, ty: MessageType, f: &dyn Fn(&mut Message)| {
        let mut m = Message::new_with_id(
            0x2468_ace0,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            &CLIENT_MAC,
        );
        m.set_opcode(op);
        m.opts_mut().insert(DhcpOption::MessageType(ty));
        f(&mut m);
        let mut b = Vec::new();
        m.encode(&mut Encoder::new(&mut b))
            .expect("a message encodes");
        b
    };
    let ack = build(Opcode::BootReply, MessageType::Ack, &|m| {
        m.set_yiaddr(ADDR);
        let o = m.opts_mut();
        o.insert(DhcpOption::ServerIdentifier(SERVER_IP));
        o.insert(DhcpOption::AddressLeaseTime(3600));
        o.insert(DhcpOption::SubnetMask(Ipv4Addr::new(255, 255, 255, 0)));
        o.insert(DhcpOption::Router(vec![SERVER_IP]));
    });
    let release = build(Opcode::BootRequest, MessageType::Release, &|m| {
        m.set_ciaddr(ADDR);
        m.opts_mut().insert(DhcpOption::ServerIdentifier(SERVER_IP));
    });
    let decline = build(Opcode::BootRequest, MessageType::Decline, &|m| {
        let o = m.opts_mut();
        o.insert(DhcpOption::RequestedIpAddress(ADDR));
        o.insert(DhcpOption::ServerIdentifier(SERVER_IP));
    });
    let inform_ack = build(Opcode::BootReply, MessageType::Ack, &|m| {
        m.opts_mut().insert(DhcpOption::ServerIdentifier(SERVER_IP));
    });
    let overloaded = bootreply(
        ADDR,
        &[3, 4, 192, 0, 2, 1, 255],
        &[1, 4, 255, 255, 255, 0, 255],
        &[
            52, 1, 3, 53, 1, 5, 54, 4, 192, 0, 2, 1, 51, 4, 0, 0, 14, 16, 255,
        ],
    );
    vec![
        ("ack", ack),
        ("release", release),
        ("decline", decline),
        ("inform-ack", inform_ack),
        ("overloaded-ack", overloaded),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_scripts_reach_bound_and_pass() {
        for (name, s) in client_replies_seeds() {
            client_replies(&s);
            // Decoding the encoded script gives the same operations.
            let mut b = Bytes(&s[2..]);
            while !b.is_empty() {
                let op = ScriptOp::decode(&mut b);
                let mut again = Vec::new();
                op.encode(&mut again);
                let mut b2 = Bytes(&again);
                assert_eq!(ScriptOp::decode(&mut b2), op, "{name}");
            }
        }
        // The DORA seed does bind: the script reaches the deep checks.
        let s = &client_replies_seeds()[0].1;
        let mut c = Client::new(script_config(s[0]), Instant::now(), u64::from(s[1]));
        let spec = ReplySpec {
            kind: 0,
            lease_secs: 3600,
            flags: 7,
            extra: Vec::new(),
        };
        let src = PacketSource {
            src_mac: SERVER_MAC,
            src_ip: SERVER_IP,
        };
        let now = Instant::now();
        c.handle_packet(now, src, &build_reply(&c, &spec)).unwrap();
        let spec = ReplySpec { kind: 1, ..spec };
        c.handle_packet(now, src, &build_reply(&c, &spec)).unwrap();
        assert_eq!(c.state(), State::Bound);
    }

    #[test]
    fn observed_seeds_pass_and_decode() {
        for (_, s) in observed_messages_seeds() {
            observed_messages(&s);
        }
        // The seeds reach the deep checks: every one decodes, and the
        // overloaded ACK's mask and router come from `file` and `sname`.
        let all = observed_messages_seeds();
        for (name, s) in &all {
            assert!(validate::parse_observed(s).is_ok(), "{name}");
        }
        let o = validate::parse_observed(&all[4].1).unwrap();
        assert_eq!((o.prefix_len, o.router), (Some(24), Some(SERVER_IP)));
        assert_eq!(o.lease_time, Some(3600));
    }

    #[test]
    fn option_seeds_pass() {
        for (_, s) in reply_options_seeds() {
            reply_options(&s);
        }
    }

    #[test]
    fn the_checks_catch_a_refused_route() {
        let policy = RoutePolicy {
            allow_default_route: false,
            ..RoutePolicy::default()
        };
        let mut lease = Lease {
            address: ADDR,
            prefix_len: 24,
            server_id: SERVER_IP,
            server_mac: None,
            routers: Vec::new(),
            routes: Vec::new(),
            dns_servers: Vec::new(),
            domain_name: None,
            search: Vec::new(),
            mtu: None,
            lease_time: Duration::from_hours(1),
            t1: Duration::from_mins(30),
            t2: Duration::from_secs(3150),
            acquired_unix_ms: WALL0,
            rejected_routes: Vec::new(),
        };
        check_lease(&lease, &policy);
        lease.routes.push(Route {
            dest: Ipv4Addr::UNSPECIFIED,
            prefix_len: 0,
            gateway: SERVER_IP,
        });
        let r = std::panic::catch_unwind(|| check_lease(&lease, &policy));
        assert!(
            r.is_err(),
            "a default route under a no-default policy passed"
        );
    }
}
