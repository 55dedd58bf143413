//! The sans-IO `DHCPv6` client: `handle_*` in, `poll_*` out, time passed
//! explicitly — the same shape as the `DHCPv4` [`Client`](crate::Client).
//!
//! Method groups:
//! - A. inputs: [`Client::handle_packet`], [`Client::handle_timeout`],
//!   commands [`Client::release`], [`Client::decline`], [`Client::restart`],
//!   and [`Client::set_wall_clock_unix_ms`];
//! - B. outputs: [`Client::poll_transmit`], [`Client::poll_timeout`],
//!   [`Client::poll_event`] — drain all three after every input;
//! - C. inspection: [`Client::state`], [`Client::lease`], [`Client::xid`],
//!   [`Client::stats`].
//!
//! One thing: the RFC 8415 client for one `IA_NA` — every exchange and its
//! transitions in one type. Every exchange retransmits the same way
//! (§15), so one `Exchange` record carries the message being sent and its
//! timers whatever the state.

use std::collections::VecDeque;
use std::net::Ipv6Addr;
use std::time::{Duration, Instant};

use dhcproto::v6::Status;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tracing::{debug, trace};

use super::backoff::{self, Rand};
use super::config::{ClientConfig, MAX_DUID_LEN, ResumeMode, Timing};
use super::event::{AcquireError, Event, LostReason};
use super::lease::{self, IaAddress, IaView, Lease, Source};
use super::message::{self, MessageKind, Outgoing};
use super::state::State;
use super::stats::ClientStats;
use super::validate::{self, DropReason, ServerMessage};
use crate::wall::WallClock;

/// Where to send a message: UDP from port 546 (from the link-local address)
/// to port 547.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destination {
    /// `All_DHCP_Relay_Agents_and_Servers`, `ff02::1:2` (RFC 8415 §7.1).
    Multicast,
    /// A server that sent Server Unicast (§21.12) and never `UseMulticast`.
    Unicast(Ipv6Addr),
}

impl Destination {
    /// The destination address.
    pub fn address(self) -> Ipv6Addr {
        match self {
            Destination::Multicast => message::ALL_SERVERS,
            Destination::Unicast(a) => a,
        }
    }
}

/// A message to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    pub payload: Vec<u8>,
    /// Transaction id (24 bits). Every client message gets a reply in
    /// `DHCPv6`, RELEASE and DECLINE included: register it for capture.
    pub xid: u32,
    /// IAID of the message's `IA_NA` (with the xid, what owns a reply).
    pub iaid: u32,
    pub kind: MessageKind,
    pub dst: Destination,
}

/// Deadlines of the held lease on the monotonic clock (`None` = never).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTimers {
    pub t1: Option<Instant>,
    pub t2: Option<Instant>,
    pub expires: Option<Instant>,
}

/// The exchange in flight: what is sent and its retransmission state
/// (RFC 8415 §15).
#[derive(Debug, Clone)]
struct Exchange {
    kind: MessageKind,
    timing: Timing,
    first_sent: Instant,
    /// Transmissions so far.
    sent: u32,
    rt: Duration,
    next_at: Instant,
    /// When MRD ends the exchange, if it has one.
    give_up_at: Option<Instant>,
    server_id: Option<Vec<u8>>,
    address: Option<Ipv6Addr>,
    dst: Destination,
}

/// An ADVERTISE worth requesting from.
#[derive(Debug, Clone)]
struct Advert {
    server_id: Vec<u8>,
    preference: u8,
    address: Ipv6Addr,
    server_unicast: Option<Ipv6Addr>,
}

/// Internal state with its per-state data; [`State`] is the public view.
#[derive(Debug, Clone)]
enum Phase {
    Init {
        send_at: Instant,
    },
    Soliciting {
        /// Until the first RT elapses the client collects ADVERTISEs
        /// (§18.2.1); the best one so far.
        collecting: bool,
        best: Option<Advert>,
    },
    Requesting,
    Confirming,
    Bound,
    Renewing,
    Rebinding,
    Releasing,
    Declining,
    Released,
    Failed,
}

#[derive(Debug, Clone)]
struct Held {
    lease: Lease,
    t1_at: Option<Instant>,
    t2_at: Option<Instant>,
    expires_at: Option<Instant>,
}

/// An open acquisition and what it has seen.
#[derive(Debug, Clone)]
struct Acquisition {
    started: Instant,
    deadline: Option<Instant>,
    solicits: u32,
    requests: u32,
    advertises: u32,
    dropped: u64,
    last_drop: Option<DropReason>,
    last_status: Option<Status>,
}

/// Longest interval kept (keeps `Instant` arithmetic far from overflow).
const MAX_INTERVAL: Duration = Duration::from_hours(365 * 24);
/// Addresses remembered as declined.
const DECLINED_LIMIT: usize = 16;
/// `SOL_MAX_RT` values a server may set (RFC 8415 §21.24).
const SOL_MAX_RT_RANGE: std::ops::RangeInclusive<u32> = 60..=86_400;

fn later(now: Instant, d: Duration) -> Instant {
    now.checked_add(d.min(MAX_INTERVAL))
        .or_else(|| now.checked_add(Duration::from_secs(1)))
        .unwrap_or(now)
}

fn min_opt(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Status outcome of a REPLY's top level.
enum Top {
    Success,
    /// `UseMulticast`: the message was sent again to the multicast address.
    Resent,
    NotOnLink,
    NoAddrsAvail,
    Failure,
}

/// Sans-IO RFC 8415 `DHCPv6` client for one `IA_NA`. No sockets, no clocks:
/// every input carries `now`; randomness comes from the seed.
#[derive(Debug)]
pub struct Client {
    cfg: ClientConfig,
    duid: Vec<u8>,
    iaid: u32,
    rng: StdRng,
    phase: Phase,
    xid: u32,
    exchange: Option<Exchange>,
    held: Option<Held>,
    acq: Option<Acquisition>,
    /// A server said `UseMulticast`: never unicast to it again (§18.2.10).
    use_multicast: bool,
    /// `SOL_MAX_RT` a server sent (§21.24).
    sol_max_rt: Option<Duration>,
    declined: Vec<Ipv6Addr>,
    /// The sender of the message being handled ([`Client::handle_packet_from`]),
    /// stamped on the lease it binds or extends.
    rx_source: Option<Source>,
    transmits: VecDeque<Transmit>,
    events: VecDeque<Event>,
    stats: ClientStats,
    wall: WallClock,
}

impl Client {
    fn blank(mut cfg: ClientConfig, now: Instant, seed: u64) -> Client {
        cfg.normalize();
        let duid = cfg.client_duid();
        let iaid = cfg.client_iaid();
        let mut rng = StdRng::seed_from_u64(seed);
        let xid = rng.random::<u32>() & 0x00ff_ffff;
        Client {
            cfg,
            duid,
            iaid,
            rng,
            phase: Phase::Init { send_at: now },
            xid,
            exchange: None,
            held: None,
            rx_source: None,
            acq: None,
            use_multicast: false,
            sol_max_rt: None,
            declined: Vec::new(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            stats: ClientStats::default(),
            wall: WallClock::default(),
        }
    }

    /// Start a client with no lease: the first SOLICIT goes out after a
    /// uniform random delay in `[0, SOL_MAX_DELAY]` (RFC 8415 §18.2.1), at
    /// the first [`Client::handle_timeout`] at or after
    /// [`Client::poll_timeout`] (at once when the delay is 0).
    pub fn new(cfg: ClientConfig, now: Instant, seed: u64) -> Client {
        let mut c = Client::blank(cfg, now, seed);
        c.begin_acquisition(now);
        let delay = backoff::initial_delay(c.cfg.timeouts.sol_max_delay, &mut c.rng);
        c.phase = Phase::Init {
            send_at: later(now, delay),
        };
        if delay.is_zero() {
            c.start_solicit(now);
        }
        c
    }

    /// Resume a persisted lease after a restart. `now_unix_ms` is the wall
    /// clock at `now`. An expired lease emits [`Event::Lost`] and SOLICITs at
    /// once; a valid one is held with its remaining times and checked with
    /// a REBIND or a CONFIRM, per [`ClientConfig::resume`]. No
    /// [`Event::Bound`]: the caller already holds the lease.
    pub fn resume(
        cfg: ClientConfig,
        lease: Lease,
        now: Instant,
        now_unix_ms: u64,
        seed: u64,
    ) -> Client {
        let mut c = Client::blank(cfg, now, seed);
        c.wall = WallClock::anchored(now_unix_ms, now);
        let usable = validate::is_usable(lease.address)
            && (1..=MAX_DUID_LEN).contains(&lease.server_id.len())
            && lease.iaid == c.iaid;
        let elapsed = Duration::from_millis(now_unix_ms.saturating_sub(lease.acquired_unix_ms));
        let expired =
            lease.valid_secs == 0 || lease::finite(lease.valid_secs).is_some_and(|v| elapsed >= v);
        if !usable || expired {
            if usable {
                c.stats.expirations += 1;
                c.events.push_back(Event::Lost {
                    reason: LostReason::Expired,
                });
            }
            c.begin_acquisition(now);
            c.start_solicit(now);
            return c;
        }
        let at = |secs: u32| lease::finite(secs).map(|d| later(now, d.saturating_sub(elapsed)));
        c.held = Some(Held {
            t1_at: at(lease.t1_secs),
            t2_at: at(lease.t2_secs),
            expires_at: at(lease.valid_secs),
            lease,
        });
        match c.cfg.resume {
            ResumeMode::Rebind => c.start_rebind(now),
            ResumeMode::Confirm => c.start_confirm(now),
        }
        c
    }

    // ---- A. inputs -------------------------------------------------------

    /// Set the wall clock (Unix ms), anchored to the `now` of the next
    /// `handle_*`/`release`/`decline`/`restart` call; it stamps
    /// [`Lease::acquired_unix_ms`].
    pub fn set_wall_clock_unix_ms(&mut self, unix_ms: u64) {
        self.wall.set_pending(unix_ms);
    }

    /// Feed a UDP payload received on port 546 from `src`. Returns why it
    /// was ignored, if it was (the reason is also counted in
    /// [`Client::stats`]).
    pub fn handle_packet(
        &mut self,
        now: Instant,
        src: Ipv6Addr,
        payload: &[u8],
    ) -> Result<(), DropReason> {
        self.handle_packet_from(now, Source::new(src, None), payload)
    }

    /// [`Client::handle_packet`] for a message whose frame was seen: the
    /// lease it binds or extends records `source`, its Ethernet source
    /// included ([`Lease::server_source`]).
    pub fn handle_packet_from(
        &mut self,
        now: Instant,
        source: Source,
        payload: &[u8],
    ) -> Result<(), DropReason> {
        let src = source.ip;
        self.wall.apply(now);
        let before = self.state();
        let mut ours = false;
        self.rx_source = Some(source);
        let result = self.process(now, payload, &mut ours);
        self.rx_source = None;
        if let Err(reason) = result {
            self.stats.count_drop(reason);
            if ours {
                debug!(xid = self.xid, state = before.label(), reason = reason.label(), %src, "DHCPv6 message dropped");
                if let Some(a) = &mut self.acq {
                    a.dropped += 1;
                    a.last_drop = Some(reason);
                }
            } else {
                trace!(state = before.label(), reason = reason.label(), %src, "foreign DHCPv6 message dropped");
            }
        }
        self.log_transition(before, "reply");
        result
    }

    /// Fire every timer due at `now` (call at [`Client::poll_timeout`];
    /// early or late calls are harmless).
    pub fn handle_timeout(&mut self, now: Instant) {
        self.wall.apply(now);
        let before = self.state();
        for _ in 0..8 {
            if !self.step_timer(now) {
                break;
            }
        }
        self.log_transition(before, "timer");
    }

    /// The reply of the exchange in flight may have been lost on this host
    /// (the receive path changed under it): in RENEWING or REBINDING, send
    /// the message again at the next [`Client::handle_timeout`] rather than
    /// at its next retransmission, which may be up to `REN_MAX_RT` /
    /// `REB_MAX_RT` (600 s) away. Same transaction; the retransmission time
    /// keeps growing as for any retransmission. A no-op in every other state.
    pub fn retransmit_now(&mut self, now: Instant) {
        if matches!(self.phase, Phase::Renewing | Phase::Rebinding)
            && let Some(ex) = &mut self.exchange
            && ex.next_at > now
        {
            ex.next_at = now;
        }
    }

    /// Give the lease back: stop using the address and RELEASE it to its
    /// server (RFC 8415 §18.2.7), retransmitted per `REL_TIMEOUT` /
    /// `REL_MAX_RC`; [`Event::Released`] when answered or given up. Without a
    /// lease the client just stops. Unpolled transmissions are discarded.
    pub fn release(&mut self, now: Instant) {
        self.wall.apply(now);
        let before = self.state();
        self.transmits.clear();
        self.acq = None;
        if let Some(h) = self.held.take() {
            self.phase = Phase::Releasing;
            let dst = self.server_dst(h.lease.server_unicast);
            self.start_exchange(
                now,
                MessageKind::Release,
                self.cfg.timeouts.release,
                Some(h.lease.server_id),
                Some(h.lease.address),
                dst,
            );
        } else {
            self.exchange = None;
            self.phase = Phase::Released;
        }
        self.log_transition(before, "release");
    }

    /// Duplicate address detection failed for the leased address: stop
    /// using it ([`Event::Lost`] `Declined`), DECLINE it (RFC 8415 §18.2.8,
    /// `DEC_TIMEOUT` / `DEC_MAX_RC`), then SOLICIT again. An ADVERTISE or
    /// REPLY offering a declined address is ignored afterwards. A no-op
    /// without a lease.
    pub fn decline(&mut self, now: Instant) {
        self.wall.apply(now);
        let before = self.state();
        let Some(h) = self.held.take() else { return };
        self.events.push_back(Event::Lost {
            reason: LostReason::Declined,
        });
        if self.declined.len() < DECLINED_LIMIT {
            self.declined.push(h.lease.address);
        }
        self.phase = Phase::Declining;
        let dst = self.server_dst(h.lease.server_unicast);
        self.start_exchange(
            now,
            MessageKind::Decline,
            self.cfg.timeouts.decline,
            Some(h.lease.server_id),
            Some(h.lease.address),
            dst,
        );
        self.log_transition(before, "decline");
    }

    /// Start over from SOLICIT after [`State::Failed`] or
    /// [`State::Released`]; a no-op in every other state.
    pub fn restart(&mut self, now: Instant) {
        self.wall.apply(now);
        if matches!(self.phase, Phase::Failed | Phase::Released) {
            self.begin_acquisition(now);
            self.start_solicit(now);
        }
    }

    // ---- B. outputs ------------------------------------------------------

    /// Next message to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// When [`Client::handle_timeout`] must next be called (`None`: no
    /// timer — released, failed, or bound with an infinite lease).
    pub fn poll_timeout(&self) -> Option<Instant> {
        let held = self.held.as_ref();
        let expires = held.and_then(|h| h.expires_at);
        let exchange = self
            .exchange
            .as_ref()
            .and_then(|e| min_opt(Some(e.next_at), e.give_up_at));
        let deadline = if self.acquiring() {
            self.acq.as_ref().and_then(|a| a.deadline)
        } else {
            None
        };
        let t = match self.phase {
            Phase::Init { send_at } => Some(send_at),
            Phase::Bound => held.and_then(|h| min_opt(h.t1_at, h.t2_at)),
            Phase::Renewing => min_opt(exchange, held.and_then(|h| h.t2_at)),
            Phase::Soliciting { .. }
            | Phase::Requesting
            | Phase::Confirming
            | Phase::Rebinding
            | Phase::Releasing
            | Phase::Declining => exchange,
            Phase::Released | Phase::Failed => None,
        };
        min_opt(min_opt(t, expires), deadline)
    }

    /// Next event for the driver.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    // ---- C. inspection ---------------------------------------------------

    pub fn state(&self) -> State {
        match self.phase {
            Phase::Init { .. } => State::Init,
            Phase::Soliciting { .. } => State::Soliciting,
            Phase::Requesting => State::Requesting,
            Phase::Confirming => State::Confirming,
            Phase::Bound => State::Bound,
            Phase::Renewing => State::Renewing,
            Phase::Rebinding => State::Rebinding,
            Phase::Releasing => State::Releasing,
            Phase::Declining => State::Declining,
            Phase::Released => State::Released,
            Phase::Failed => State::Failed,
        }
    }

    /// The lease held, if any.
    pub fn lease(&self) -> Option<&Lease> {
        self.held.as_ref().map(|h| &h.lease)
    }

    /// T1/T2/expiry of the held lease.
    pub fn lease_timers(&self) -> Option<LeaseTimers> {
        self.held.as_ref().map(|h| LeaseTimers {
            t1: h.t1_at,
            t2: h.t2_at,
            expires: h.expires_at,
        })
    }

    /// Transaction id of the current (or last) exchange.
    pub fn xid(&self) -> u32 {
        self.xid
    }

    /// The DUID sent as Client Identifier.
    pub fn duid(&self) -> &[u8] {
        &self.duid
    }

    /// The IAID of the `IA_NA`.
    pub fn iaid(&self) -> u32 {
        self.iaid
    }

    pub fn stats(&self) -> &ClientStats {
        &self.stats
    }

    pub fn config(&self) -> &ClientConfig {
        &self.cfg
    }

    // ---- internals: bookkeeping -------------------------------------------

    fn log_transition(&self, before: State, cause: &'static str) {
        let after = self.state();
        if after != before {
            debug!(
                xid = self.xid,
                from = before.label(),
                to = after.label(),
                cause,
                "DHCPv6 state"
            );
        }
    }

    fn acquiring(&self) -> bool {
        match self.phase {
            Phase::Init { .. } | Phase::Soliciting { .. } => true,
            Phase::Requesting => self.held.is_none(),
            _ => false,
        }
    }

    fn begin_acquisition(&mut self, now: Instant) {
        self.acq = Some(Acquisition {
            started: now,
            deadline: self.cfg.acquire_timeout.map(|d| later(now, d)),
            solicits: 0,
            requests: 0,
            advertises: 0,
            dropped: 0,
            last_drop: None,
            last_status: None,
        });
    }

    fn server_dst(&self, unicast: Option<Ipv6Addr>) -> Destination {
        match unicast {
            Some(a) if !self.use_multicast => Destination::Unicast(a),
            _ => Destination::Multicast,
        }
    }

    // ---- internals: exchanges ----------------------------------------------

    /// Open a new exchange (new xid) and send its first message. RENEW and
    /// REBIND have no MRD of their own: T2 and the end of the valid lifetime
    /// end them (§18.2.4, §18.2.5), through the lease timers.
    fn start_exchange(
        &mut self,
        now: Instant,
        kind: MessageKind,
        timing: Timing,
        server_id: Option<Vec<u8>>,
        address: Option<Ipv6Addr>,
        dst: Destination,
    ) {
        let old = self.xid;
        while self.xid == old {
            self.xid = self.rng.random::<u32>() & 0x00ff_ffff;
        }
        let rand = if kind == MessageKind::Solicit {
            Rand::Positive
        } else {
            Rand::Symmetric
        };
        let rt = backoff::first_rt(&timing, rand, &mut self.rng);
        let mrd = (!timing.mrd.is_zero()).then(|| later(now, timing.mrd));
        self.exchange = Some(Exchange {
            kind,
            timing,
            first_sent: now,
            sent: 0,
            rt,
            next_at: later(now, rt),
            give_up_at: mrd,
            server_id,
            address,
            dst,
        });
        self.send_current(now);
    }

    /// Send the current exchange's message (again).
    fn send_current(&mut self, now: Instant) {
        let Some(ex) = &mut self.exchange else { return };
        let elapsed_cs = if ex.sent == 0 {
            0
        } else {
            (now.saturating_duration_since(ex.first_sent).as_millis() / 10).min(0xffff) as u16
        };
        ex.sent += 1;
        let (kind, dst, retransmit) = (ex.kind, ex.dst, ex.sent > 1);
        let built = message::build(&Outgoing {
            kind,
            xid: self.xid,
            client_id: &self.duid,
            server_id: ex.server_id.as_deref(),
            iaid: self.iaid,
            address: ex.address,
            elapsed_cs,
            rapid_commit: self.cfg.rapid_commit,
            request_options: &self.cfg.request_options,
        });
        match built {
            Ok(payload) => {
                self.stats.count_sent(kind);
                self.stats.retransmits += u64::from(retransmit);
                if let Some(a) = &mut self.acq {
                    match kind {
                        MessageKind::Solicit => a.solicits += 1,
                        MessageKind::Request => a.requests += 1,
                        _ => {}
                    }
                }
                trace!(
                    xid = self.xid,
                    kind = kind.label(),
                    elapsed_cs,
                    ?dst,
                    "DHCPv6 message queued"
                );
                self.transmits.push_back(Transmit {
                    payload,
                    xid: self.xid,
                    iaid: self.iaid,
                    kind,
                    dst,
                });
            }
            Err(e) => {
                self.stats.encode_errors += 1;
                debug!(xid = self.xid, kind = kind.label(), error = %e, "DHCPv6 message not encoded");
            }
        }
    }

    fn start_solicit(&mut self, now: Instant) {
        self.phase = Phase::Soliciting {
            collecting: true,
            best: None,
        };
        let mut timing = self.cfg.timeouts.solicit;
        if let Some(mrt) = self.sol_max_rt {
            timing.mrt = mrt;
        }
        self.start_exchange(
            now,
            MessageKind::Solicit,
            timing,
            None,
            None,
            Destination::Multicast,
        );
    }

    fn start_request(
        &mut self,
        now: Instant,
        server_id: Vec<u8>,
        address: Ipv6Addr,
        unicast: Option<Ipv6Addr>,
    ) {
        self.phase = Phase::Requesting;
        let dst = self.server_dst(unicast);
        self.start_exchange(
            now,
            MessageKind::Request,
            self.cfg.timeouts.request,
            Some(server_id),
            Some(address),
            dst,
        );
    }

    fn start_confirm(&mut self, now: Instant) {
        let Some(h) = &self.held else { return };
        let address = h.lease.address;
        self.phase = Phase::Confirming;
        self.start_exchange(
            now,
            MessageKind::Confirm,
            self.cfg.timeouts.confirm,
            None,
            Some(address),
            Destination::Multicast,
        );
    }

    /// RENEW at T1 to the leasing server (§18.2.4), until T2.
    fn start_renew(&mut self, now: Instant) {
        let Some(h) = &self.held else { return };
        let (id, address) = (h.lease.server_id.clone(), h.lease.address);
        let dst = self.server_dst(h.lease.server_unicast);
        self.phase = Phase::Renewing;
        self.start_exchange(
            now,
            MessageKind::Renew,
            self.cfg.timeouts.renew,
            Some(id),
            Some(address),
            dst,
        );
    }

    /// REBIND at T2 to all servers (§18.2.5), until the valid lifetime ends.
    fn start_rebind(&mut self, now: Instant) {
        let Some(h) = &self.held else { return };
        let address = h.lease.address;
        self.phase = Phase::Rebinding;
        self.start_exchange(
            now,
            MessageKind::Rebind,
            self.cfg.timeouts.rebind,
            None,
            Some(address),
            Destination::Multicast,
        );
    }

    // ---- internals: timers -------------------------------------------------

    /// Fire at most one timer; `true` if one fired.
    fn step_timer(&mut self, now: Instant) -> bool {
        if self.acquiring()
            && let Some(deadline) = self.acq.as_ref().and_then(|a| a.deadline)
            && now >= deadline
        {
            self.fail(now);
            return true;
        }
        let due = |t: Option<Instant>| t.is_some_and(|t| now >= t);
        let held = self.held.as_ref();
        if due(held.and_then(|h| h.expires_at))
            && !matches!(self.phase, Phase::Releasing | Phase::Declining)
        {
            self.stats.expirations += 1;
            self.lose(now, LostReason::Expired);
            return true;
        }
        match self.phase {
            Phase::Init { send_at } if now >= send_at => {
                self.start_solicit(now);
                return true;
            }
            // Past T2 already (a late timer): straight to REBIND.
            Phase::Bound if due(held.and_then(|h| h.t2_at)) => {
                self.start_rebind(now);
                return true;
            }
            Phase::Bound if due(held.and_then(|h| h.t1_at)) => {
                self.start_renew(now);
                return true;
            }
            Phase::Renewing if due(held.and_then(|h| h.t2_at)) => {
                self.start_rebind(now);
                return true;
            }
            _ => {}
        }
        let Some(ex) = &self.exchange else {
            return false;
        };
        if !self.state().expects_reply() {
            return false;
        }
        let out_of_count = ex.timing.mrc != 0 && ex.sent >= ex.timing.mrc && now >= ex.next_at;
        if due(ex.give_up_at) || out_of_count {
            self.exhausted(now);
            return true;
        }
        if now < ex.next_at {
            return false;
        }
        // §18.2.1: when the first RT elapses with ADVERTISEs collected, the
        // client requests from the best one instead of retransmitting.
        if let Phase::Soliciting { collecting, best } = &mut self.phase
            && *collecting
        {
            *collecting = false;
            if let Some(adv) = best.take() {
                self.start_request(now, adv.server_id, adv.address, adv.server_unicast);
                return true;
            }
        }
        let Some(ex) = &mut self.exchange else {
            return false;
        };
        ex.rt = backoff::next_rt(&ex.timing, ex.rt, &mut self.rng);
        ex.next_at = later(now, ex.rt);
        self.send_current(now);
        true
    }

    /// The exchange ran out of retransmissions (MRC) or time (MRD).
    fn exhausted(&mut self, now: Instant) {
        let Some(ex) = self.exchange.take() else {
            return;
        };
        debug!(
            xid = self.xid,
            kind = ex.kind.label(),
            sent = ex.sent,
            "DHCPv6 exchange gave up"
        );
        match ex.kind {
            MessageKind::Solicit => self.fail(now),
            MessageKind::Request => {
                self.stats.request_timeouts += 1;
                if self.held.is_some() {
                    self.lose(now, LostReason::NoBinding);
                } else {
                    self.start_solicit(now);
                }
            }
            // §18.2.3: no answer to CONFIRM — keep using the lease.
            MessageKind::Confirm => self.phase = Phase::Bound,
            // T2 and the lease end come first through the lease timers; only
            // a configured MRD shorter than those ends up here.
            MessageKind::Renew => self.start_rebind(now),
            MessageKind::Rebind => {
                self.stats.expirations += 1;
                self.lose(now, LostReason::Expired);
            }
            MessageKind::Release => {
                self.phase = Phase::Released;
                self.events.push_back(Event::Released);
            }
            MessageKind::Decline => {
                self.begin_acquisition(now);
                self.start_solicit(now);
            }
        }
    }

    /// The lease is gone: [`Event::Lost`], SOLICIT at once.
    /// Without a lease (a REQUEST refused during an acquisition) the
    /// acquisition and its deadline go on.
    fn lose(&mut self, now: Instant, reason: LostReason) {
        if self.held.take().is_some() {
            self.events.push_back(Event::Lost { reason });
            self.begin_acquisition(now);
        } else if self.acq.is_none() {
            self.begin_acquisition(now);
        }
        self.start_solicit(now);
    }

    fn fail(&mut self, now: Instant) {
        self.exchange = None;
        self.phase = Phase::Failed;
        let Some(a) = self.acq.take() else { return };
        self.stats.acquisitions_failed += 1;
        self.events.push_back(Event::Failed(AcquireError {
            elapsed: now.saturating_duration_since(a.started),
            solicits_sent: a.solicits,
            requests_sent: a.requests,
            advertises: a.advertises,
            dropped: a.dropped,
            last_drop: a.last_drop,
            last_status: a.last_status,
        }));
    }

    // ---- internals: server messages ----------------------------------------

    fn process(&mut self, now: Instant, payload: &[u8], ours: &mut bool) -> Result<(), DropReason> {
        if !self.state().expects_reply() {
            return Err(DropReason::WrongState);
        }
        let header = validate::parse_header(payload)?;
        if header.xid != self.xid {
            return Err(DropReason::WrongXid);
        }
        *ours = true;
        let msg = validate::parse(payload)?;
        match &msg.client_id {
            None => return Err(DropReason::MissingClientId),
            Some(id) if *id != self.duid => return Err(DropReason::WrongClientId),
            Some(_) => {}
        }
        let server = msg.server_id.as_ref().ok_or(DropReason::MissingServerId)?;
        if !(1..=MAX_DUID_LEN).contains(&server.len()) {
            return Err(DropReason::BadServerId);
        }
        let is_reply = msg.msg_type == dhcproto::v6::MessageType::Reply;
        // ADVERTISE only while soliciting; a REPLY in every waiting state,
        // but to SOLICIT only with Rapid Commit on both sides.
        let expected = match self.phase {
            Phase::Soliciting { .. } => !is_reply || (self.cfg.rapid_commit && msg.rapid_commit),
            _ => is_reply,
        };
        if !expected {
            return Err(DropReason::UnexpectedType);
        }
        self.stats.malformed_options += msg.malformed.len() as u64;
        self.note_statuses(&msg);
        // §18.2.9, §18.2.10: SOL_MAX_RT is processed even from an
        // ADVERTISE that is otherwise ignored.
        if let Some(v) = msg.sol_max_rt.filter(|v| SOL_MAX_RT_RANGE.contains(v)) {
            let mrt = Duration::from_secs(u64::from(v));
            self.sol_max_rt = Some(mrt);
            if let Some(ex) = &mut self.exchange
                && ex.kind == MessageKind::Solicit
            {
                ex.timing.mrt = mrt;
            }
        }
        match (&self.phase, is_reply) {
            (Phase::Soliciting { .. }, false) => {
                self.stats.advertises_received += 1;
                self.on_advertise(now, &msg)
            }
            (Phase::Soliciting { .. }, true) => {
                self.stats.replies_received += 1;
                self.on_assign_reply(now, &msg, true)
            }
            (Phase::Requesting, true) => {
                let asked = self.exchange.as_ref().and_then(|e| e.server_id.as_ref());
                if asked != Some(server) {
                    return Err(DropReason::WrongServer);
                }
                self.stats.replies_received += 1;
                self.on_assign_reply(now, &msg, false)
            }
            (Phase::Confirming, true) => {
                self.stats.replies_received += 1;
                self.on_confirm_reply(now, &msg)
            }
            (Phase::Renewing, true) => {
                if self.held.as_ref().map(|h| &h.lease.server_id) != Some(server) {
                    return Err(DropReason::WrongServer);
                }
                self.stats.replies_received += 1;
                self.on_extend_reply(now, &msg)
            }
            (Phase::Rebinding, true) => {
                self.stats.replies_received += 1;
                self.on_extend_reply(now, &msg)
            }
            // §18.2.7, §18.2.8: any REPLY ends RELEASE and DECLINE, whatever
            // its status.
            (Phase::Releasing, true) => {
                self.stats.replies_received += 1;
                self.exchange = None;
                self.phase = Phase::Released;
                self.events.push_back(Event::Released);
                Ok(())
            }
            (Phase::Declining, true) => {
                self.stats.replies_received += 1;
                self.exchange = None;
                self.begin_acquisition(now);
                self.start_solicit(now);
                Ok(())
            }
            _ => Err(DropReason::UnexpectedType),
        }
    }

    /// Count non-success statuses, top level and in our IA.
    fn note_statuses(&mut self, msg: &ServerMessage) {
        let ia_status = msg
            .ia(self.iaid)
            .and_then(IaView::of)
            .and_then(|v| v.status);
        let top = msg
            .status
            .as_ref()
            .map(|(s, _)| *s)
            .filter(|s| *s != Status::Success);
        for s in [top, ia_status].into_iter().flatten() {
            self.stats.count_status(s);
            if let Some(a) = &mut self.acq {
                a.last_status = Some(s);
            }
        }
        if let Some((s, text)) = &msg.status
            && *s != Status::Success
        {
            debug!(xid = self.xid, status = ?s, message = %text, "DHCPv6 status");
        }
    }

    /// Top-level status of a REPLY (§18.2.10).
    fn top_status(&mut self, now: Instant, msg: &ServerMessage) -> Top {
        match msg.status.as_ref().map(|(s, _)| *s) {
            None | Some(Status::Success) => Top::Success,
            Some(Status::UseMulticast) => {
                // Send the same message again to the multicast address, and
                // every later one too.
                match &mut self.exchange {
                    Some(ex) if ex.dst != Destination::Multicast => {
                        self.use_multicast = true;
                        ex.dst = Destination::Multicast;
                        self.send_current(now);
                        Top::Resent
                    }
                    _ => Top::Failure,
                }
            }
            Some(Status::NotOnLink) => Top::NotOnLink,
            Some(Status::NoAddrsAvail) => Top::NoAddrsAvail,
            Some(_) => Top::Failure,
        }
    }

    /// ADVERTISE (§18.2.9): usable ones are collected during the first RT,
    /// the highest preference wins, ties go to the first heard; preference
    /// 255, or any usable one after the first RT, is requested at once.
    fn on_advertise(&mut self, now: Instant, msg: &ServerMessage) -> Result<(), DropReason> {
        match msg.status.as_ref().map(|(s, _)| *s) {
            None | Some(Status::Success) => {}
            Some(Status::NoAddrsAvail) => return Err(DropReason::NoAddrsAvail),
            Some(_) => return Err(DropReason::StatusFailure),
        }
        let view = msg
            .ia(self.iaid)
            .and_then(IaView::of)
            .ok_or(DropReason::MissingIa)?;
        if view.status == Some(Status::NoAddrsAvail) {
            return Err(DropReason::NoAddrsAvail);
        }
        let addr = view.pick(None).ok_or(DropReason::NoUsableAddress)?;
        if self.declined.contains(&addr.address) {
            return Err(DropReason::DeclinedAddress);
        }
        if let Some(a) = &mut self.acq {
            a.advertises += 1;
        }
        let adv = Advert {
            server_id: msg.server_id.clone().unwrap_or_default(),
            preference: msg.preference,
            address: addr.address,
            server_unicast: msg.server_unicast.filter(|a| validate::is_usable(*a)),
        };
        let Phase::Soliciting { collecting, best } = &mut self.phase else {
            return Err(DropReason::UnexpectedType);
        };
        if adv.preference == u8::MAX || !*collecting {
            self.start_request(now, adv.server_id, adv.address, adv.server_unicast);
        } else if best.as_ref().is_none_or(|b| adv.preference > b.preference) {
            *best = Some(adv);
        }
        Ok(())
    }

    /// REPLY to REQUEST, or to a Rapid Commit SOLICIT: bind the address.
    fn on_assign_reply(
        &mut self,
        now: Instant,
        msg: &ServerMessage,
        rapid: bool,
    ) -> Result<(), DropReason> {
        match self.top_status(now, msg) {
            Top::Success => {}
            Top::Resent => return Ok(()),
            Top::NotOnLink => {
                self.lose(now, LostReason::NotOnLink);
                return Ok(());
            }
            // §18.2.10.1: "the client can try another server" — from SOLICIT.
            Top::NoAddrsAvail if !rapid => {
                self.lose(now, LostReason::Withdrawn);
                return Ok(());
            }
            Top::NoAddrsAvail => return Err(DropReason::NoAddrsAvail),
            Top::Failure => return Err(DropReason::StatusFailure),
        }
        let view = msg
            .ia(self.iaid)
            .and_then(IaView::of)
            .ok_or(DropReason::MissingIa)?;
        match view.status {
            None => {}
            Some(Status::NotOnLink) => {
                self.lose(now, LostReason::NotOnLink);
                return Ok(());
            }
            Some(Status::NoAddrsAvail) if !rapid => {
                self.lose(now, LostReason::Withdrawn);
                return Ok(());
            }
            Some(Status::NoAddrsAvail) => return Err(DropReason::NoAddrsAvail),
            Some(_) => return Err(DropReason::StatusFailure),
        }
        let prefer = self.exchange.as_ref().and_then(|e| e.address);
        let addr = view.pick(prefer).ok_or(DropReason::NoUsableAddress)?;
        if self.declined.contains(&addr.address) {
            return Err(DropReason::DeclinedAddress);
        }
        self.stats.rapid_commits += u64::from(rapid);
        self.bind(now, msg, &view, addr)
    }

    /// REPLY to RENEW or REBIND (§18.2.10.1).
    fn on_extend_reply(&mut self, now: Instant, msg: &ServerMessage) -> Result<(), DropReason> {
        match self.top_status(now, msg) {
            Top::Success => {}
            Top::Resent => return Ok(()),
            Top::NotOnLink => {
                self.lose(now, LostReason::NotOnLink);
                return Ok(());
            }
            Top::NoAddrsAvail => return Err(DropReason::NoAddrsAvail),
            Top::Failure => return Err(DropReason::StatusFailure),
        }
        let view = msg
            .ia(self.iaid)
            .and_then(IaView::of)
            .ok_or(DropReason::MissingIa)?;
        let Some(held) = self.held.as_ref().map(|h| h.lease.address) else {
            return Err(DropReason::WrongState);
        };
        match view.status {
            None => {}
            // The server has no binding for the IA: REQUEST it from that
            // server (§18.2.10.1), keeping the lease until it ends.
            Some(Status::NoBinding) => {
                let server = msg.server_id.clone().unwrap_or_default();
                let unicast = msg.server_unicast.filter(|a| validate::is_usable(*a));
                self.start_request(now, server, held, unicast);
                return Ok(());
            }
            Some(Status::NotOnLink) => {
                self.lose(now, LostReason::NotOnLink);
                return Ok(());
            }
            Some(Status::NoAddrsAvail) => return Err(DropReason::NoAddrsAvail),
            Some(_) => return Err(DropReason::StatusFailure),
        }
        match view.pick(Some(held)) {
            Some(addr) if !self.declined.contains(&addr.address) => {
                self.bind(now, msg, &view, addr)
            }
            _ if view.withdraws(held) => {
                self.lose(now, LostReason::Withdrawn);
                Ok(())
            }
            Some(_) => Err(DropReason::DeclinedAddress),
            None => Err(DropReason::NoUsableAddress),
        }
    }

    /// REPLY to CONFIRM (§18.2.10.1): success keeps the lease as stored,
    /// `NotOnLink` starts over.
    fn on_confirm_reply(&mut self, now: Instant, msg: &ServerMessage) -> Result<(), DropReason> {
        match self.top_status(now, msg) {
            Top::Success => {
                self.exchange = None;
                self.phase = Phase::Bound;
                // Late timers (T1 passed during the exchange).
                self.handle_timeout(now);
                Ok(())
            }
            Top::NotOnLink => {
                self.lose(now, LostReason::NotOnLink);
                Ok(())
            }
            Top::Resent => Ok(()),
            Top::NoAddrsAvail | Top::Failure => Err(DropReason::StatusFailure),
        }
    }

    /// Hold `addr`: lifetimes and T1/T2 count from when the exchange's
    /// first message was sent (the conservative reading).
    fn bind(
        &mut self,
        now: Instant,
        msg: &ServerMessage,
        view: &IaView,
        addr: IaAddress,
    ) -> Result<(), DropReason> {
        let Some(ex) = self.exchange.as_ref() else {
            return Err(DropReason::WrongState);
        };
        let (base, rebinding) = (ex.first_sent, ex.kind == MessageKind::Rebind);
        let mut lease = lease::build(msg, view, self.iaid, addr, self.wall.at(base))?;
        // A sender seen without its frame (a UDP socket) keeps the
        // Ethernet source the same sender's earlier REPLYs for the same
        // server came with.
        lease.server_source = self.rx_source.map(|src| Source {
            mac: src.mac.or_else(|| {
                self.held
                    .as_ref()
                    .map(|h| &h.lease)
                    .filter(|l| l.server_id == lease.server_id)
                    .and_then(|l| l.server_source)
                    .filter(|s| s.ip == src.ip)
                    .and_then(|s| s.mac)
            }),
            ..src
        });
        let at = |secs: u32| lease::finite(secs).map(|d| later(base, d));
        let held = Held {
            t1_at: at(lease.t1_secs),
            t2_at: at(lease.t2_secs),
            expires_at: at(lease.valid_secs),
            lease: lease.clone(),
        };
        let event = if let Some(old) = self.held.replace(held) {
            self.stats.renewals += 1;
            self.stats.rebinds += u64::from(rebinding);
            if old.lease.same_config(&lease) {
                Event::Renewed(lease)
            } else {
                Event::Changed {
                    old: old.lease,
                    new: lease,
                }
            }
        } else {
            self.stats.leases_bound += 1;
            Event::Bound(lease)
        };
        self.events.push_back(event);
        self.exchange = None;
        self.acq = None;
        self.declined.clear();
        self.phase = Phase::Bound;
        // A late REPLY may already be past T1/T2.
        self.handle_timeout(now);
        Ok(())
    }
}
