//! The sans-IO client: `handle_*` in, `poll_*` out, time passed explicitly.
//!
//! Method groups, as in quinn-proto's `Connection`:
//! - A. inputs: [`Client::handle_packet`], [`Client::handle_timeout`],
//!   commands [`Client::release`], [`Client::decline`], [`Client::restart`],
//!   and [`Client::set_wall_clock_unix_ms`];
//! - B. outputs: [`Client::poll_transmit`], [`Client::poll_timeout`],
//!   [`Client::poll_event`] — drain all three after every input;
//! - C. inspection: [`Client::state`], [`Client::lease`], [`Client::xid`],
//!   [`Client::stats`].
//!
//! One thing: the DHCP client state machine of RFC 2131 §4.4 — every state
//! and its transitions in one type, as quinn-proto keeps a connection.

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tracing::{debug, trace, warn};

use crate::backoff;
use crate::config::{ClientConfig, ExpiredLeasePolicy, Mode};
use crate::event::{AcquireError, Event, HeardNak, HeardOffer, LostReason};
use crate::lease::{self, Lease, LeaseNotes, LeaseOption};
use crate::message::{self, MessageKind, Outgoing};
use crate::state::State;
use crate::stats::ClientStats;
use crate::tally::Tally;
use crate::validate::{self, DropReason, Reply, ReplyType};
use crate::wall::{self, WallClock};

/// Link-layer and IP source of a received reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketSource {
    pub src_mac: [u8; 6],
    pub src_ip: Ipv4Addr,
}

/// Where to send a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destination {
    /// 255.255.255.255 / ff:ff:ff:ff:ff:ff, port 67.
    Broadcast,
    /// Unicast to `ip` port 67; `mac` is the server's (or next hop's) MAC
    /// learned from its last reply, if known.
    Unicast { ip: Ipv4Addr, mac: Option<[u8; 6]> },
}

/// A message to send: UDP payload from port 68 to port 67.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    pub payload: Vec<u8>,
    /// Transaction id of the message (register it in the ownership map).
    pub xid: u32,
    /// `0.0.0.0`, or the leased address for RENEW/REBIND/RELEASE.
    pub src_ip: Ipv4Addr,
    pub dst: Destination,
    pub kind: MessageKind,
}

impl Transmit {
    /// Whether a reply is expected (DISCOVER, REQUEST): register the xid for
    /// reply capture. RELEASE and DECLINE get no answer.
    pub fn expects_reply(&self) -> bool {
        matches!(self.kind, MessageKind::Discover | MessageKind::Request)
    }
}

/// Deadlines of the held lease on the monotonic clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTimers {
    pub t1: Option<Instant>,
    pub t2: Option<Instant>,
    pub expires: Option<Instant>,
}

/// The xids a held lease's next RENEWING and REBINDING transactions will
/// carry, drawn when the lease is bound or extended. A driver persists them
/// with the lease: a process that resumes the lease after a restart can then
/// recognise the transaction its predecessor had open
/// ([`Client::adopt_sent`]) and take its reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PlannedXids {
    pub renew: u32,
    pub rebind: u32,
}

/// Retransmission bookkeeping for one xid.
#[derive(Debug, Clone, Copy)]
struct Retx {
    /// When to retransmit (or give up).
    next_at: Instant,
    /// Transmissions so far with this xid.
    sent: u32,
}

#[derive(Debug, Clone, Copy)]
struct Offer {
    server_id: Ipv4Addr,
    address: Ipv4Addr,
}

/// Internal state with its per-state data. [`State`] is the public view.
#[derive(Debug, Clone, Copy)]
enum Phase {
    Init {
        send_at: Instant,
    },
    Selecting {
        retx: Retx,
    },
    Requesting {
        offer: Offer,
        retx: Retx,
        first_sent: Instant,
    },
    InitReboot {
        send_at: Instant,
        address: Ipv4Addr,
    },
    Rebooting {
        address: Ipv4Addr,
        retx: Retx,
        first_sent: Instant,
    },
    Bound,
    Renewing {
        retx_at: Instant,
        first_sent: Instant,
        started: Instant,
    },
    Rebinding {
        retx_at: Instant,
        first_sent: Instant,
        started: Instant,
    },
    Released,
    Failed,
}

/// The lease currently held with its monotonic deadlines (`None` = never).
#[derive(Debug, Clone)]
struct Held {
    lease: Lease,
    t1_at: Option<Instant>,
    t2_at: Option<Instant>,
    expires_at: Option<Instant>,
}

const HEARD_LIMIT: usize = 16;

/// An open acquisition (INIT … BOUND) and what it has seen.
#[derive(Debug, Clone)]
struct Acquisition {
    started: Instant,
    deadline: Instant,
    discovers: u32,
    requests: u32,
    servers_requested: Vec<Ipv4Addr>,
    offers: Vec<HeardOffer>,
    naks: Vec<HeardNak>,
    dropped: u64,
    last_drop: Option<DropReason>,
    consecutive_naks: u32,
    /// `secs` of the last DISCOVER; REQUESTs answering its offer repeat it
    /// (as ISC dhclient does) so the exchange carries one consistent value.
    discover_secs: u16,
    /// Option 50 hint for DISCOVER (previous address), cleared by a NAK.
    hint: Option<Ipv4Addr>,
    declined: Vec<Ipv4Addr>,
}

/// Longest a configured interval may be (keeps `Instant` arithmetic far from
/// overflow).
const MAX_INTERVAL: Duration = Duration::from_hours(365 * 24);

fn later(now: Instant, d: Duration) -> Instant {
    now.checked_add(d.min(MAX_INTERVAL))
        .or_else(|| now.checked_add(Duration::from_secs(1)))
        .unwrap_or(now)
}

fn secs_since(now: Instant, start: Instant) -> u16 {
    now.saturating_duration_since(start)
        .as_secs()
        .min(u64::from(u16::MAX)) as u16
}

fn min_opt(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// How soon a renewal resent by [`Client::retransmit_now`] is sent again
/// if that resend is not answered either.
pub const QUICK_RESEND: Duration = Duration::from_secs(3);

/// Sans-IO RFC 2131 `DHCPv4` client. No sockets, no clocks: every input
/// carries `now`; randomness comes from the seed.
#[derive(Debug)]
pub struct Client {
    cfg: ClientConfig,
    rng: StdRng,
    phase: Phase,
    xid: u32,
    /// The xids of the held lease's next renewal and rebinding.
    planned: Option<PlannedXids>,
    /// The open transaction was adopted from a previous process
    /// ([`Client::adopt_sent`]) and nothing was sent in it since.
    adopted: bool,
    /// [`Client::retransmit_now`] asked for a resend: the retransmission
    /// after it comes at most [`QUICK_RESEND`] later, once.
    quick_resend: bool,
    held: Option<Held>,
    acq: Option<Acquisition>,
    transmits: VecDeque<Transmit>,
    events: VecDeque<Event>,
    stats: ClientStats,
    /// Malformed options dropped since the driver last took them
    /// ([`Client::take_malformed_options`]); fixed size, so a driver that
    /// never takes them costs nothing.
    malformed_pending: Tally<LeaseOption, { LeaseOption::ALL.len() }>,
    wall: WallClock,
}

impl Client {
    fn blank(mut cfg: ClientConfig, now: Instant, seed: u64) -> Client {
        cfg.normalize();
        let r = &mut cfg.retransmit;
        for d in [
            &mut r.initial,
            &mut r.max_interval,
            &mut r.jitter,
            &mut r.renew_min_interval,
            &mut r.nak_backoff_initial,
            &mut r.nak_backoff_max,
            &mut r.decline_delay,
            &mut r.init_delay_max,
            &mut cfg.acquire_timeout,
        ] {
            *d = (*d).min(MAX_INTERVAL);
        }
        let mut rng = StdRng::seed_from_u64(seed);
        let xid = rng.random();
        Client {
            cfg,
            rng,
            phase: Phase::Init { send_at: now },
            xid,
            planned: None,
            adopted: false,
            quick_resend: false,
            held: None,
            acq: None,
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            stats: ClientStats::default(),
            malformed_pending: Tally::default(),
            wall: WallClock::default(),
        }
    }

    /// Start a client in INIT (or INIT-REBOOT when `cfg.requested_ip` is
    /// set). Unless `retransmit.init_delay_max` is non-zero, the first
    /// DISCOVER/REQUEST is queued at once (state SELECTING/REBOOTING).
    pub fn new(cfg: ClientConfig, now: Instant, seed: u64) -> Client {
        let mut c = Client::blank(cfg, now, seed);
        c.begin_acquisition(now, None);
        let delay = c.random_init_delay();
        match c.cfg.requested_ip {
            Some(ip) => c.start_reboot(now, ip, delay),
            None => c.start_init(now, delay),
        }
        c
    }

    /// Resume a persisted lease. `now_unix_ms` is the wall clock at `now`;
    /// the time elapsed since `lease.acquired_unix_ms` decides the state:
    /// BOUND before T1, RENEWING before T2, REBINDING before expiry (a
    /// REQUEST is queued at once in the latter two). An expired lease emits
    /// [`Event::Lost`] and goes to INIT-REBOOT for the same address (or INIT,
    /// per [`ExpiredLeasePolicy`]). No [`Event::Bound`] is emitted for a
    /// still-valid lease: the caller already holds it.
    ///
    /// The wall clock is a parameter because the remaining times cannot be
    /// computed without it.
    pub fn resume(
        cfg: ClientConfig,
        lease: Lease,
        now: Instant,
        now_unix_ms: u64,
        seed: u64,
    ) -> Client {
        Client::resume_planned(cfg, lease, None, now, now_unix_ms, seed)
    }

    /// [`Client::resume`] with the xids the previous process had planned
    /// for the lease's renewal and rebinding (persisted with the lease,
    /// [`Client::planned_xids`]): a RENEWING or REBINDING entered now or
    /// later carries them, as that process's would have, and
    /// [`Client::adopt_sent`] can take over the one it had sent.
    pub fn resume_planned(
        cfg: ClientConfig,
        lease: Lease,
        planned: Option<PlannedXids>,
        now: Instant,
        now_unix_ms: u64,
        seed: u64,
    ) -> Client {
        let mut c = Client::blank(cfg, now, seed);
        c.wall = WallClock::anchored(now_unix_ms, now);
        c.planned = planned.filter(|p| p.renew != p.rebind);
        let mut lease = lease;
        c.stats.stored_lease_repairs += u64::from(lease.sanitize());
        if !validate::is_unicast(lease.address) || !validate::is_unicast(lease.server_id) {
            c.stats.stored_lease_repairs += 1;
            c.begin_acquisition(now, None);
            c.start_init(now, Duration::ZERO);
            return c;
        }
        let elapsed = Duration::from_millis(now_unix_ms.saturating_sub(lease.acquired_unix_ms));
        if lease.lease_time.is_zero() || (!lease.is_infinite() && elapsed >= lease.lease_time) {
            c.stats.expirations += 1;
            c.events.push_back(Event::Lost {
                reason: LostReason::Expired,
            });
            match c.cfg.expired_lease {
                ExpiredLeasePolicy::Reboot => {
                    c.begin_acquisition(now, None);
                    c.start_reboot(now, lease.address, Duration::ZERO);
                }
                ExpiredLeasePolicy::Discover => {
                    c.begin_acquisition(now, Some(lease.address));
                    c.start_init(now, Duration::ZERO);
                }
            }
            return c;
        }
        let t1 = c.fuzzed_t1(lease.t1);
        let remaining = |t: Duration| {
            if lease.is_infinite() || c.cfg.mode == Mode::OneShot {
                None
            } else {
                Some(later(now, t.saturating_sub(elapsed)))
            }
        };
        let held = Held {
            t1_at: remaining(t1),
            t2_at: remaining(lease.t2),
            expires_at: remaining(lease.lease_time),
            lease,
        };
        let (lease_t1, t2) = (held.lease.t1, held.lease.t2);
        let timers = held.expires_at.is_some();
        c.held = Some(held);
        c.phase = Phase::Bound;
        if timers && elapsed >= t2 {
            c.enter_rebinding(now);
        } else if timers && elapsed >= t1 {
            // T1 passed while the process was stopped: every lease resumed
            // in this start would renew in the same instant. Spread them
            // over the fuzz window, never past halfway to T2.
            let window = backoff::fuzz_window(lease_t1, c.cfg.retransmit.renew_fuzz_permille)
                .min(t2.saturating_sub(elapsed) / 2);
            let delay = backoff::uniform_delay(window, &mut c.rng);
            if delay.is_zero() {
                c.enter_renewing(now);
            } else if let Some(h) = &mut c.held {
                h.t1_at = Some(later(now, delay));
            }
        }
        c
    }

    // ---- A. inputs -------------------------------------------------------

    /// Set the wall clock (Unix ms). Call right before a `handle_*` call; it
    /// is anchored to that call's `now` and used to stamp
    /// [`Lease::acquired_unix_ms`].
    pub fn set_wall_clock_unix_ms(&mut self, unix_ms: u64) {
        self.wall.set_pending(unix_ms);
    }

    /// Feed a UDP payload received on port 68. Returns why it was ignored,
    /// if it was (the reason is also counted in [`Client::stats`]).
    pub fn handle_packet(
        &mut self,
        now: Instant,
        src: PacketSource,
        payload: &[u8],
    ) -> Result<(), DropReason> {
        self.wall.apply(now);
        let before = self.state();
        let mut ours = false;
        let result = self.process(now, src, payload, &mut ours);
        if let Err(reason) = result {
            self.stats.count_drop(reason);
            if ours {
                debug!(xid = self.xid, state = before.label(), reason = reason.label(), src = %src.src_ip, "reply dropped");
                if let Some(acq) = &mut self.acq {
                    acq.dropped += 1;
                    acq.last_drop = Some(reason);
                }
            } else {
                trace!(state = before.label(), reason = reason.label(), src = %src.src_ip, "foreign reply dropped");
            }
        }
        self.log_transition(before, "reply");
        result
    }

    /// Fire every timer due at `now` (call at [`Client::poll_timeout`]; early
    /// or late calls are harmless).
    pub fn handle_timeout(&mut self, now: Instant) {
        self.wall.apply(now);
        let before = self.state();
        // Each step fires one timer; a late call may owe several (for
        // example T1 and T2 both passed while the process was stopped).
        for _ in 0..8 {
            if !self.step_timer(now) {
                break;
            }
        }
        self.log_transition(before, "timer");
    }

    /// The reply of the exchange in flight may have been lost on this host
    /// (the receive path changed under it): in RENEWING or REBINDING, send
    /// the REQUEST again at the next [`Client::handle_timeout`] rather than
    /// at its next retransmission, which RFC 2131 §4.4.5 puts at least 60 s
    /// away. Same transaction, same `secs` rules as any retransmission. A
    /// no-op in every other state: an acquisition retransmits within
    /// seconds on its own (and counts its attempts), a bound lease has
    /// nothing in flight.
    ///
    /// The retransmission after that one comes at most [`QUICK_RESEND`]
    /// later (then the RFC's schedule again): the receive path may still
    /// be settling when the first resend's reply comes back.
    pub fn retransmit_now(&mut self, now: Instant) {
        if let Phase::Renewing { retx_at, .. } | Phase::Rebinding { retx_at, .. } = &mut self.phase
            && *retx_at > now
        {
            *retx_at = now;
            self.quick_resend = true;
        }
    }

    /// The retransmission time after a resend at `now` in RENEWING or
    /// REBINDING (`rebinding`): the RFC's, or [`QUICK_RESEND`] after a
    /// [`Client::retransmit_now`].
    fn renew_resend_at(&mut self, now: Instant, rebinding: bool) -> Instant {
        let at = self.renew_retx_at(now, rebinding);
        if std::mem::take(&mut self.quick_resend) {
            at.min(later(now, QUICK_RESEND))
        } else {
            at
        }
    }

    /// Adopt the transaction a previous process had open for this lease:
    /// `sent` is one of the [`PlannedXids`] it was resumed with
    /// ([`Client::resume_planned`]) that this process knows went out. The
    /// client takes it as its own — RENEWING for the renewal's xid,
    /// REBINDING for the rebinding's — without sending anything now, so the
    /// reply to the previous process's REQUEST completes it (validated as
    /// any reply: this xid, this chaddr, and in RENEWING the lease's
    /// server); the REQUEST is sent again only at the state's next
    /// retransmission, or after `grace` if that is sooner: the reply may
    /// have been lost in the handover, and the previous process's REQUEST
    /// left a while ago. The lease counts from the earliest moment that
    /// REQUEST can have left (T1 less its fuzz, or T2, after the lease's
    /// start), never later than it did. Whether it was adopted: not when
    /// `sent` is no planned xid, no lease is held, or it is expired.
    pub fn adopt_sent(&mut self, now: Instant, sent: u32, grace: Duration) -> bool {
        let (Some(planned), Some(held)) = (self.planned, &self.held) else {
            return false;
        };
        if held.expires_at.is_some_and(|e| e <= now)
            || !matches!(
                self.phase,
                Phase::Bound | Phase::Renewing { .. } | Phase::Rebinding { .. }
            )
        {
            return false;
        }
        let rebinding = if sent == planned.rebind {
            true
        } else if sent == planned.renew {
            false
        } else {
            return false;
        };
        let lease = &held.lease;
        let after = if rebinding {
            lease.t2
        } else {
            lease.t1.saturating_sub(backoff::fuzz_window(
                lease.t1,
                self.cfg.retransmit.renew_fuzz_permille,
            ))
        };
        let sent_ms = lease.acquired_unix_ms.saturating_add(wall::millis(after));
        let first_sent = match self.wall.anchor() {
            Some((ms, at)) if sent_ms < ms => at
                .checked_sub(Duration::from_millis(ms - sent_ms))
                .unwrap_or(at)
                .min(now),
            _ => now,
        };
        // Whatever the resume queued (a REQUEST at once) is not sent: the
        // previous process's REQUEST is out.
        self.transmits.clear();
        self.xid = sent;
        self.adopted = true;
        let retx_at = self.renew_retx_at(now, rebinding).min(later(now, grace));
        self.phase = if rebinding {
            Phase::Rebinding {
                retx_at,
                first_sent,
                started: first_sent,
            }
        } else {
            Phase::Renewing {
                retx_at,
                first_sent,
                started: first_sent,
            }
        };
        true
    }

    /// The xid of a transaction adopted with [`Client::adopt_sent`] while it
    /// is still open and nothing was sent in it by this process: the driver
    /// routes its replies here before anything goes out.
    pub fn adopted(&self) -> Option<u32> {
        (self.adopted && matches!(self.phase, Phase::Renewing { .. } | Phase::Rebinding { .. }))
            .then_some(self.xid)
    }

    /// Give the lease back: queue a DHCPRELEASE unicast from the leased
    /// address to the server identifier (RFC 2131 §4.4.6; dnsmasq ignores a
    /// RELEASE from 0.0.0.0) and stop.
    ///
    /// Without a lease, a client whose REQUEST for an offered address is
    /// out (REQUESTING), or that asks again for the address an earlier
    /// client's REQUEST was out for (INIT-REBOOT with
    /// [`ClientConfig::requested_from`]), releases that address to the
    /// server that offered it: the server may have committed the lease and
    /// acknowledged it to no one, and would hold it until it expires. A
    /// server that holds no such lease ignores the RELEASE. Otherwise the
    /// client just stops. Anything not yet polled from
    /// [`Client::poll_transmit`] is discarded first.
    pub fn release(&mut self, now: Instant) {
        self.wall.apply(now);
        let before = self.state();
        self.transmits.clear();
        let unanswered = match self.phase {
            Phase::Requesting { offer, .. } => Some((offer.address, offer.server_id)),
            Phase::InitReboot { address, .. } | Phase::Rebooting { address, .. } => self
                .cfg
                .requested_from
                .filter(|_| self.cfg.requested_ip == Some(address))
                .map(|server| (address, server)),
            _ => None,
        };
        let target = match (self.held.take(), unanswered) {
            (Some(held), _) => Some((
                held.lease.address,
                held.lease.server_id,
                held.lease.server_mac,
            )),
            (None, Some((address, server))) => Some((address, server, None)),
            (None, None) => None,
        };
        if let Some((address, server, server_mac)) = target {
            self.new_xid();
            self.send(&Send {
                kind: MessageKind::Release,
                secs: 0,
                ciaddr: address,
                requested_ip: None,
                server_id: Some(server),
                src_ip: address,
                dst: Destination::Unicast {
                    ip: server,
                    mac: server_mac,
                },
                retransmit: false,
            });
            self.stats.releases_sent += 1;
        }
        self.acq = None;
        self.phase = Phase::Released;
        self.log_transition(before, "release");
    }

    /// Decline the offered (REQUESTING) or leased address because it is in
    /// use (RFC 2131 §3.1 step 5): broadcast DHCPDECLINE, emit
    /// [`Event::Lost`] if a lease was held, and restart from INIT after
    /// `retransmit.decline_delay`, refusing that address in later offers.
    /// A no-op in states without an address.
    pub fn decline(&mut self, now: Instant) {
        self.wall.apply(now);
        let before = self.state();
        let target = match (&self.phase, &self.held) {
            (Phase::Requesting { offer, .. }, _) => Some((offer.address, offer.server_id)),
            (Phase::Bound | Phase::Renewing { .. } | Phase::Rebinding { .. }, Some(h)) => {
                Some((h.lease.address, h.lease.server_id))
            }
            _ => None,
        };
        let Some((address, server)) = target else {
            return;
        };
        self.transmits.clear();
        self.new_xid();
        self.send(&Send {
            kind: MessageKind::Decline,
            secs: 0,
            ciaddr: Ipv4Addr::UNSPECIFIED,
            requested_ip: Some(address),
            server_id: Some(server),
            src_ip: Ipv4Addr::UNSPECIFIED,
            dst: Destination::Broadcast,
            retransmit: false,
        });
        self.stats.declines_sent += 1;
        if self.held.take().is_some() {
            self.events.push_back(Event::Lost {
                reason: LostReason::Declined,
            });
        }
        let mut declined = self.acq.take().map(|a| a.declined).unwrap_or_default();
        if declined.len() >= HEARD_LIMIT {
            declined.remove(0);
        }
        declined.push(address);
        let delay = self.cfg.retransmit.decline_delay;
        self.begin_acquisition(later(now, delay), None);
        if let Some(acq) = &mut self.acq {
            acq.declined = declined;
        }
        self.new_xid();
        self.start_init(now, delay);
        self.log_transition(before, "decline");
    }

    /// Start over: a fresh acquisition from INIT (or INIT-REBOOT for
    /// `cfg.requested_ip`). Use after [`State::Failed`]; a held lease is
    /// forgotten without RELEASE (call [`Client::release`] first to give it
    /// back).
    pub fn restart(&mut self, now: Instant) {
        self.wall.apply(now);
        let before = self.state();
        self.held = None;
        self.begin_acquisition(now, None);
        self.new_xid();
        match self.cfg.requested_ip {
            Some(ip) => self.start_reboot(now, ip, Duration::ZERO),
            None => self.start_init(now, Duration::ZERO),
        }
        self.log_transition(before, "restart");
    }

    // ---- B. outputs ------------------------------------------------------

    /// Next message to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// When [`Client::handle_timeout`] must next be called (`None`: no timer;
    /// RELEASED, FAILED, or BOUND in one-shot mode / with an infinite lease).
    pub fn poll_timeout(&self) -> Option<Instant> {
        let acq_deadline = self.acq.as_ref().map(|a| a.deadline);
        let held = self.held.as_ref();
        match self.phase {
            Phase::Init { send_at } | Phase::InitReboot { send_at, .. } => {
                min_opt(Some(send_at), acq_deadline)
            }
            Phase::Selecting { retx }
            | Phase::Requesting { retx, .. }
            | Phase::Rebooting { retx, .. } => min_opt(Some(retx.next_at), acq_deadline),
            Phase::Bound => held.and_then(|h| min_opt(min_opt(h.t1_at, h.t2_at), h.expires_at)),
            Phase::Renewing { retx_at, .. } => min_opt(
                Some(retx_at),
                held.and_then(|h| min_opt(h.t2_at, h.expires_at)),
            ),
            Phase::Rebinding { retx_at, .. } => {
                min_opt(Some(retx_at), held.and_then(|h| h.expires_at))
            }
            Phase::Released | Phase::Failed => None,
        }
    }

    /// Next event for the driver.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    // ---- C. inspection ---------------------------------------------------

    /// Current RFC 2131 state.
    pub fn state(&self) -> State {
        match self.phase {
            Phase::Init { .. } => State::Init,
            Phase::Selecting { .. } => State::Selecting,
            Phase::Requesting { .. } => State::Requesting,
            Phase::InitReboot { .. } => State::InitReboot,
            Phase::Rebooting { .. } => State::Rebooting,
            Phase::Bound => State::Bound,
            Phase::Renewing { .. } => State::Renewing,
            Phase::Rebinding { .. } => State::Rebinding,
            Phase::Released => State::Released,
            Phase::Failed => State::Failed,
        }
    }

    /// The address a REQUEST is out for in REQUESTING (the one its chosen
    /// OFFER made). A driver that records it before the ACK lets a restart
    /// ask for the same address again (INIT-REBOOT) should the ACK's lease
    /// never reach its own record.
    pub fn requesting(&self) -> Option<Ipv4Addr> {
        match self.phase {
            Phase::Requesting { offer, .. } => Some(offer.address),
            _ => None,
        }
    }

    /// The server identifier of the offer whose REQUEST is out
    /// (REQUESTING), beside [`Client::requesting`].
    pub fn requesting_from(&self) -> Option<Ipv4Addr> {
        match self.phase {
            Phase::Requesting { offer, .. } => Some(offer.server_id),
            _ => None,
        }
    }

    /// The lease held (BOUND, RENEWING, REBINDING).
    pub fn lease(&self) -> Option<&Lease> {
        self.held.as_ref().map(|h| &h.lease)
    }

    /// Monotonic T1, T2 and expiry of the held lease (`None` inside: no such
    /// timer, e.g. one-shot mode or an infinite lease).
    pub fn lease_timers(&self) -> Option<LeaseTimers> {
        self.held.as_ref().map(|h| LeaseTimers {
            t1: h.t1_at,
            t2: h.t2_at,
            expires: h.expires_at,
        })
    }

    /// Transaction id of the open (or last) transaction.
    pub fn xid(&self) -> u32 {
        self.xid
    }

    /// The xids the held lease's next renewal and rebinding will carry
    /// (drawn at each ACK): persist them with the lease, for
    /// [`Client::resume_planned`] and [`Client::adopt_sent`] after a
    /// restart.
    pub fn planned_xids(&self) -> Option<PlannedXids> {
        self.planned.filter(|_| self.held.is_some())
    }

    /// Counters.
    pub fn stats(&self) -> &ClientStats {
        &self.stats
    }

    /// Optional options dropped as malformed from accepted replies since the
    /// last call, by option (non-zero counts only), then reset: what a driver
    /// adds to its metrics after [`Client::handle_packet`]. The engine also
    /// logs each one (`warn`) and keeps monotonic totals in
    /// [`ClientStats::malformed`].
    pub fn take_malformed_options(&mut self) -> Vec<(LeaseOption, u64)> {
        self.malformed_pending.take()
    }

    /// The configuration in force (after clamping).
    pub fn config(&self) -> &ClientConfig {
        &self.cfg
    }

    // ---- internals: time and randomness ----------------------------------

    fn log_transition(&self, before: State, cause: &'static str) {
        let after = self.state();
        if after != before {
            debug!(
                xid = self.xid,
                from = before.label(),
                to = after.label(),
                cause,
                "dhcp state"
            );
        }
    }

    fn new_xid(&mut self) {
        let old = self.xid;
        while self.xid == old {
            self.xid = self.rng.random();
        }
        self.adopted = false;
    }

    /// The next xid from the plan (`rebind` picks which), or a fresh one.
    fn planned_or_new_xid(&mut self, rebind: bool) {
        match self.planned {
            Some(p) if !rebind && p.renew != self.xid => self.xid = p.renew,
            Some(p) if rebind && p.rebind != self.xid => self.xid = p.rebind,
            _ => self.new_xid(),
        }
        self.adopted = false;
    }

    /// Draw the xids of the next renewal and rebinding (distinct from each
    /// other and from the current one).
    fn plan_xids(&mut self) {
        let mut draw = |not: &[u32]| loop {
            let x: u32 = self.rng.random();
            if !not.contains(&x) {
                break x;
            }
        };
        let renew = draw(&[self.xid]);
        let rebind = draw(&[self.xid, renew]);
        self.planned = Some(PlannedXids { renew, rebind });
    }

    fn random_init_delay(&mut self) -> Duration {
        let max = self.cfg.retransmit.init_delay_max;
        if max.is_zero() {
            return Duration::ZERO;
        }
        let ms = max.as_millis().min(u128::from(u64::MAX)) as u64;
        Duration::from_millis(self.rng.random_range(0..=ms))
    }

    fn retx_after(&mut self, now: Instant, sent: u32) -> Retx {
        let d = backoff::retransmit_delay(&self.cfg.retransmit, sent - 1, &mut self.rng);
        Retx {
            next_at: later(now, d),
            sent,
        }
    }

    // ---- internals: sending ----------------------------------------------

    fn send(&mut self, s: &Send) {
        let client_id = self.cfg.client_id.bytes(self.cfg.chaddr);
        let out = Outgoing {
            kind: s.kind,
            xid: self.xid,
            secs: s.secs,
            chaddr: self.cfg.chaddr,
            ciaddr: s.ciaddr,
            broadcast_flag: self.cfg.broadcast_flag,
            client_id: client_id.as_deref(),
            hostname: self.cfg.hostname.as_deref(),
            requested_ip: s.requested_ip,
            server_id: s.server_id,
            max_message_size: self.cfg.max_message_size,
        };
        self.adopted = false;
        match message::build(&out) {
            Ok(payload) => {
                if s.retransmit {
                    self.stats.retransmits += 1;
                }
                self.transmits.push_back(Transmit {
                    payload,
                    xid: self.xid,
                    src_ip: s.src_ip,
                    dst: s.dst,
                    kind: s.kind,
                });
            }
            Err(_) => self.stats.encode_errors += 1,
        }
    }

    fn acq_secs(&self, now: Instant) -> u16 {
        self.acq.as_ref().map_or(0, |a| secs_since(now, a.started))
    }

    fn begin_acquisition(&mut self, now: Instant, hint: Option<Ipv4Addr>) {
        self.acq = Some(Acquisition {
            started: now,
            deadline: later(now, self.cfg.acquire_timeout),
            discovers: 0,
            requests: 0,
            servers_requested: Vec::new(),
            offers: Vec::new(),
            naks: Vec::new(),
            dropped: 0,
            last_drop: None,
            consecutive_naks: 0,
            discover_secs: 0,
            hint,
            declined: Vec::new(),
        });
    }

    /// INIT: DISCOVER after `delay` (at once when zero).
    fn start_init(&mut self, now: Instant, delay: Duration) {
        if delay.is_zero() {
            self.send_discover(now, 1);
        } else {
            self.phase = Phase::Init {
                send_at: later(now, delay),
            };
        }
    }

    fn send_discover(&mut self, now: Instant, sent: u32) {
        let hint = self.acq.as_ref().and_then(|a| a.hint);
        let secs = self.acq_secs(now);
        self.send(&Send {
            kind: MessageKind::Discover,
            secs,
            ciaddr: Ipv4Addr::UNSPECIFIED,
            requested_ip: hint,
            server_id: None,
            src_ip: Ipv4Addr::UNSPECIFIED,
            dst: Destination::Broadcast,
            retransmit: sent > 1,
        });
        self.stats.discovers_sent += 1;
        if let Some(a) = &mut self.acq {
            a.discovers += 1;
            a.discover_secs = secs;
        }
        let retx = self.retx_after(now, sent);
        self.phase = Phase::Selecting { retx };
    }

    fn send_select_request(&mut self, now: Instant, offer: Offer, sent: u32, first_sent: Instant) {
        self.send(&Send {
            kind: MessageKind::Request,
            secs: self.acq.as_ref().map_or(0, |a| a.discover_secs),
            ciaddr: Ipv4Addr::UNSPECIFIED,
            requested_ip: Some(offer.address),
            server_id: Some(offer.server_id),
            src_ip: Ipv4Addr::UNSPECIFIED,
            dst: Destination::Broadcast,
            retransmit: sent > 1,
        });
        self.stats.requests_sent += 1;
        if let Some(a) = &mut self.acq {
            a.requests += 1;
            if !a.servers_requested.contains(&offer.server_id) {
                a.servers_requested.push(offer.server_id);
            }
        }
        let retx = self.retx_after(now, sent);
        self.phase = Phase::Requesting {
            offer,
            retx,
            first_sent,
        };
    }

    /// INIT-REBOOT: REQUEST for `address` after `delay`.
    fn start_reboot(&mut self, now: Instant, address: Ipv4Addr, delay: Duration) {
        if delay.is_zero() {
            self.send_reboot_request(now, address, 1, now);
        } else {
            self.phase = Phase::InitReboot {
                send_at: later(now, delay),
                address,
            };
        }
    }

    fn send_reboot_request(
        &mut self,
        now: Instant,
        address: Ipv4Addr,
        sent: u32,
        first_sent: Instant,
    ) {
        self.send(&Send {
            kind: MessageKind::Request,
            secs: self.acq_secs(now),
            ciaddr: Ipv4Addr::UNSPECIFIED,
            requested_ip: Some(address),
            server_id: None,
            src_ip: Ipv4Addr::UNSPECIFIED,
            dst: Destination::Broadcast,
            retransmit: sent > 1,
        });
        self.stats.requests_sent += 1;
        if let Some(a) = &mut self.acq {
            a.requests += 1;
        }
        let retx = self.retx_after(now, sent);
        self.phase = Phase::Rebooting {
            address,
            retx,
            first_sent,
        };
    }

    /// RENEWING/REBINDING REQUEST: ciaddr and source = leased address; no
    /// options 50/54 (RFC 2131 Table 5).
    fn send_extend_request(&mut self, now: Instant, started: Instant, rebinding: bool, retx: bool) {
        let Some(h) = &self.held else { return };
        let (address, server, mac) = (h.lease.address, h.lease.server_id, h.lease.server_mac);
        let dst = if rebinding {
            Destination::Broadcast
        } else {
            Destination::Unicast { ip: server, mac }
        };
        self.send(&Send {
            kind: MessageKind::Request,
            secs: secs_since(now, started),
            ciaddr: address,
            requested_ip: None,
            server_id: None,
            src_ip: address,
            dst,
            retransmit: retx,
        });
        self.stats.requests_sent += 1;
    }

    /// T1: RENEWING (RFC 2131 §4.4.5) with a new xid (the planned one).
    fn enter_renewing(&mut self, now: Instant) {
        self.planned_or_new_xid(false);
        self.send_extend_request(now, now, false, false);
        let retx_at = self.renew_retx_at(now, false);
        self.phase = Phase::Renewing {
            retx_at,
            first_sent: now,
            started: now,
        };
    }

    /// T2: REBINDING (RFC 2131 §4.4.5) with a new xid; `secs` keeps
    /// counting from the start of RENEWING.
    fn enter_rebinding(&mut self, now: Instant) {
        let started = match self.phase {
            Phase::Renewing { started, .. } => started,
            _ => now,
        };
        self.planned_or_new_xid(true);
        self.send_extend_request(now, started, true, false);
        let retx_at = self.renew_retx_at(now, true);
        self.phase = Phase::Rebinding {
            retx_at,
            first_sent: now,
            started,
        };
    }

    /// The lease's T1 with this client's random fuzz (see
    /// [`Retransmit::renew_fuzz_permille`](crate::config::Retransmit)), so
    /// leases granted together do not all renew at the same instant.
    fn fuzzed_t1(&mut self, t1: Duration) -> Duration {
        backoff::fuzzed_t1(t1, self.cfg.retransmit.renew_fuzz_permille, &mut self.rng)
    }

    fn renew_retx_at(&self, now: Instant, rebinding: bool) -> Instant {
        let until = self
            .held
            .as_ref()
            .and_then(|h| if rebinding { h.expires_at } else { h.t2_at });
        match until {
            Some(t) => later(
                now,
                backoff::renew_delay(
                    t.saturating_duration_since(now),
                    self.cfg.retransmit.renew_min_interval,
                ),
            ),
            None => later(now, self.cfg.retransmit.renew_min_interval),
        }
    }

    // ---- internals: timers -----------------------------------------------

    fn acquiring(&self) -> bool {
        matches!(
            self.phase,
            Phase::Init { .. }
                | Phase::Selecting { .. }
                | Phase::Requesting { .. }
                | Phase::InitReboot { .. }
                | Phase::Rebooting { .. }
        )
    }

    /// Fire at most one timer; `true` if one fired.
    fn step_timer(&mut self, now: Instant) -> bool {
        if self.acquiring()
            && let Some(acq) = &self.acq
            && now >= acq.deadline
        {
            self.fail(now);
            return true;
        }
        let held_due = |h: &Option<Held>, pick: fn(&Held) -> Option<Instant>| {
            h.as_ref().and_then(pick).is_some_and(|t| now >= t)
        };
        match self.phase {
            Phase::Init { send_at } if now >= send_at => {
                self.send_discover(now, 1);
            }
            Phase::Selecting { retx } if now >= retx.next_at => {
                let max = self.cfg.discover_attempts;
                if max != 0 && retx.sent >= max {
                    self.fail(now);
                } else {
                    self.send_discover(now, retx.sent + 1);
                }
            }
            Phase::Requesting {
                offer,
                retx,
                first_sent,
            } if now >= retx.next_at => {
                if retx.sent >= self.cfg.retransmit.request_attempts {
                    // RFC 2131 §4.4.1: no ACK/NAK after retransmitting →
                    // back to INIT with a new xid.
                    self.stats.request_timeouts += 1;
                    self.new_xid();
                    self.start_init(now, Duration::ZERO);
                } else {
                    self.send_select_request(now, offer, retx.sent + 1, first_sent);
                }
            }
            Phase::InitReboot { send_at, address } if now >= send_at => {
                self.send_reboot_request(now, address, 1, now);
            }
            Phase::Rebooting {
                address,
                retx,
                first_sent,
            } if now >= retx.next_at => {
                if retx.sent >= self.cfg.retransmit.reboot_attempts {
                    self.stats.reboot_fallbacks += 1;
                    if let Some(a) = &mut self.acq {
                        a.hint = Some(address);
                    }
                    self.new_xid();
                    self.start_init(now, Duration::ZERO);
                } else {
                    self.send_reboot_request(now, address, retx.sent + 1, first_sent);
                }
            }
            Phase::Bound if held_due(&self.held, |h| h.expires_at) => self.expire(now),
            // Past T2 already (late timer): straight to REBINDING, no
            // pointless unicast first.
            Phase::Bound if held_due(&self.held, |h| h.t2_at) => self.enter_rebinding(now),
            Phase::Bound if held_due(&self.held, |h| h.t1_at) => self.enter_renewing(now),
            Phase::Renewing { .. } | Phase::Rebinding { .. }
                if held_due(&self.held, |h| h.expires_at) =>
            {
                self.expire(now);
            }
            Phase::Renewing { .. } if held_due(&self.held, |h| h.t2_at) => {
                self.enter_rebinding(now);
            }
            Phase::Renewing {
                retx_at,
                first_sent,
                started,
            } if now >= retx_at => {
                self.send_extend_request(now, started, false, true);
                let retx_at = self.renew_resend_at(now, false);
                self.phase = Phase::Renewing {
                    retx_at,
                    first_sent,
                    started,
                };
            }
            Phase::Rebinding {
                retx_at,
                first_sent,
                started,
            } if now >= retx_at => {
                self.send_extend_request(now, started, true, true);
                let retx_at = self.renew_resend_at(now, true);
                self.phase = Phase::Rebinding {
                    retx_at,
                    first_sent,
                    started,
                };
            }
            _ => return false,
        }
        true
    }

    /// Lease expired: INIT + `Lost` (RFC 2131 §4.4.5), DISCOVER at once
    /// hinting the old address.
    fn expire(&mut self, now: Instant) {
        let old = self.held.take().map(|h| h.lease.address);
        self.stats.expirations += 1;
        self.events.push_back(Event::Lost {
            reason: LostReason::Expired,
        });
        self.begin_acquisition(now, old);
        self.new_xid();
        self.start_init(now, Duration::ZERO);
    }

    fn fail(&mut self, now: Instant) {
        let Some(acq) = self.acq.take() else { return };
        self.stats.acquisitions_failed += 1;
        self.events.push_back(Event::Failed(AcquireError {
            elapsed: now.saturating_duration_since(acq.started),
            discovers_sent: acq.discovers,
            requests_sent: acq.requests,
            servers_requested: acq.servers_requested,
            offers: acq.offers,
            naks: acq.naks,
            dropped: acq.dropped,
            last_drop: acq.last_drop,
        }));
        self.phase = Phase::Failed;
    }

    // ---- internals: replies ----------------------------------------------

    fn process(
        &mut self,
        now: Instant,
        src: PacketSource,
        payload: &[u8],
        ours: &mut bool,
    ) -> Result<(), DropReason> {
        if !self.state().expects_reply() {
            return Err(DropReason::WrongState);
        }
        let header = validate::parse_header(payload)?;
        if header.xid != self.xid {
            return Err(DropReason::WrongXid);
        }
        if header.chaddr != self.cfg.chaddr {
            return Err(DropReason::WrongChaddr);
        }
        *ours = true;
        let reply = validate::parse_reply(payload)?;
        if let Some(id) = reply.options.get(&61)
            && self.cfg.client_id.bytes(self.cfg.chaddr).as_ref() != Some(id)
        {
            return Err(DropReason::WrongClientId);
        }
        let ty = reply.reply_type()?;
        let server = reply.server_id()?;
        match (self.phase, ty) {
            (Phase::Selecting { .. }, ReplyType::Offer) => self.on_offer(now, &reply, server),
            (
                Phase::Requesting {
                    offer, first_sent, ..
                },
                ReplyType::Ack | ReplyType::Nak,
            ) => {
                if server != offer.server_id {
                    return Err(DropReason::WrongServer);
                }
                if ty == ReplyType::Nak {
                    self.on_nak(now, server, reply.message());
                    return Ok(());
                }
                if reply.yiaddr != offer.address {
                    return Err(DropReason::BadAddress);
                }
                self.on_ack(now, &reply, server, src, first_sent)
            }
            (
                Phase::Rebooting {
                    address,
                    first_sent,
                    ..
                },
                ReplyType::Ack | ReplyType::Nak,
            ) => {
                if ty == ReplyType::Nak {
                    self.on_nak(now, server, reply.message());
                    return Ok(());
                }
                if reply.yiaddr != address {
                    return Err(DropReason::BadAddress);
                }
                self.on_ack(now, &reply, server, src, first_sent)
            }
            (Phase::Renewing { first_sent, .. }, ReplyType::Ack | ReplyType::Nak) => {
                let leased_from = self.held.as_ref().map(|h| h.lease.server_id);
                if leased_from != Some(server) {
                    return Err(DropReason::WrongServer);
                }
                if ty == ReplyType::Nak {
                    self.on_nak(now, server, reply.message());
                    return Ok(());
                }
                self.on_ack(now, &reply, server, src, first_sent)
            }
            (Phase::Rebinding { first_sent, .. }, ReplyType::Ack | ReplyType::Nak) => {
                if ty == ReplyType::Nak {
                    self.on_nak(now, server, reply.message());
                    return Ok(());
                }
                self.on_ack(now, &reply, server, src, first_sent)
            }
            _ => Err(DropReason::UnexpectedType),
        }
    }

    /// SELECTING: the first valid offer wins (RFC 2131 §4.4.1), so the choice
    /// among several offers is deterministic.
    fn on_offer(
        &mut self,
        now: Instant,
        reply: &Reply,
        server: Ipv4Addr,
    ) -> Result<(), DropReason> {
        // Validate the whole offer as a lease so one without a usable
        // address or lease time cannot win.
        let (_, notes) = lease::from_reply(reply, server, &self.cfg.route_policy, 0)?;
        if self
            .acq
            .as_ref()
            .is_some_and(|a| a.declined.contains(&reply.yiaddr))
        {
            return Err(DropReason::DeclinedAddress);
        }
        self.stats.offers_received += 1;
        self.count_malformed(&notes, server, "OFFER");
        let offer = Offer {
            server_id: server,
            address: reply.yiaddr,
        };
        if let Some(a) = &mut self.acq
            && a.offers.len() < HEARD_LIMIT
        {
            a.offers.push(HeardOffer {
                server,
                address: reply.yiaddr,
            });
        }
        self.send_select_request(now, offer, 1, now);
        Ok(())
    }

    /// DHCPNAK: back to INIT with a new xid (RFC 2131 §3.1 step 5, §4.4.5);
    /// consecutive NAKs back off ([`backoff::nak_delay`]).
    fn on_nak(&mut self, now: Instant, server: Ipv4Addr, message: Option<String>) {
        self.stats.naks_received += 1;
        self.events.push_back(Event::Nak {
            server,
            message: message.clone(),
        });
        if self.held.take().is_some() {
            self.events.push_back(Event::Lost {
                reason: LostReason::Nak { server },
            });
            self.begin_acquisition(now, None);
        }
        if self.acq.is_none() {
            self.begin_acquisition(now, None);
        }
        let consecutive = match &mut self.acq {
            Some(a) => {
                a.consecutive_naks += 1;
                a.hint = None;
                if a.naks.len() < HEARD_LIMIT {
                    a.naks.push(HeardNak { server, message });
                }
                a.consecutive_naks
            }
            None => 1,
        };
        let delay = backoff::nak_delay(&self.cfg.retransmit, consecutive, &mut self.rng);
        self.new_xid();
        self.start_init(now, delay);
    }

    fn count_notes(&mut self, notes: &LeaseNotes, lease: &Lease) {
        let s = &mut self.stats;
        s.lease_times_missing += u64::from(notes.times_missing);
        s.lease_times_zero += u64::from(notes.times_zero);
        s.lease_times_inconsistent += u64::from(notes.times_inconsistent);
        s.lease_times_raised += u64::from(notes.lease_time_raised);
        s.subnet_mask_missing += u64::from(notes.mask_missing);
        s.routers_ignored_for_121 += u64::from(notes.routers_ignored_for_121);
        s.routes_rejected += lease.rejected_routes.len() as u64;
    }

    /// Count and log the optional options dropped from an accepted reply.
    fn count_malformed(&mut self, notes: &LeaseNotes, server: Ipv4Addr, kind: &'static str) {
        for m in &notes.malformed {
            self.stats.count_malformed(m.option);
            self.malformed_pending.count(m.option);
            warn!(xid = self.xid, %server, reply = kind, option = m.option.code(),
                problem = %m.problem, "malformed option dropped; the lease goes ahead without it");
        }
    }

    /// DHCPACK: BOUND (RFC 2131 §4.4.1) or lease extended (§4.4.5). Lease
    /// times count from `first_sent`, when the REQUEST was first sent.
    fn on_ack(
        &mut self,
        now: Instant,
        reply: &Reply,
        server: Ipv4Addr,
        src: PacketSource,
        first_sent: Instant,
    ) -> Result<(), DropReason> {
        let acquired_ms = self.wall.at(first_sent);
        let (mut lease, notes) =
            lease::from_reply(reply, server, &self.cfg.route_policy, acquired_ms)?;
        // A zero, broadcast or multicast source MAC (a driver without
        // link-layer information) is no next hop: keep what was learned from
        // the same server before, else leave it unknown.
        lease.server_mac = (src.src_mac != [0; 6] && src.src_mac[0] & 1 == 0)
            .then_some(src.src_mac)
            .or_else(|| {
                self.held
                    .as_ref()
                    .filter(|h| h.lease.server_id == server)
                    .and_then(|h| h.lease.server_mac)
            });
        self.stats.acks_received += 1;
        self.count_notes(&notes, &lease);
        self.count_malformed(&notes, server, "ACK");
        let timers = self.cfg.mode == Mode::Maintain && !lease.is_infinite();
        let at = |d: Duration| timers.then(|| later(first_sent, d));
        let t1 = self.fuzzed_t1(lease.t1);
        let held = Held {
            t1_at: at(t1),
            t2_at: at(lease.t2),
            expires_at: at(lease.lease_time),
            lease: lease.clone(),
        };
        let rebinding = matches!(self.phase, Phase::Rebinding { .. });
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
        self.acq = None;
        self.quick_resend = false;
        self.phase = Phase::Bound;
        self.adopted = false;
        self.plan_xids();
        // A late ACK may already be past T1/T2.
        if timers {
            self.handle_timeout(now);
        }
        Ok(())
    }
}

/// Arguments of one transmission.
struct Send {
    kind: MessageKind,
    secs: u16,
    ciaddr: Ipv4Addr,
    requested_ip: Option<Ipv4Addr>,
    server_id: Option<Ipv4Addr>,
    src_ip: Ipv4Addr,
    dst: Destination,
    retransmit: bool,
}
