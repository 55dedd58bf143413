//! What a guest's DHCP on a learning port proves, and how fast the
//! `pod-networks` entry may follow it (sans-IO: messages, what the node
//! knows about the network and an explicit clock in; decisions out).
//!
//! A reply seen towards a guest is learned only when a real exchange on
//! that port proves it ([`Learner::observe`]):
//!
//! 1. it answers a client message seen leaving the guest: a REQUEST (or a
//!    DISCOVER with Rapid Commit, RFC 4039) with the same `xid` and
//!    `chaddr`, seen at most [`EXCHANGE_WINDOW`] before (RFC 2131 §4.1:
//!    a client retransmits with a delay doubling up to 64 s); and when that
//!    message named an address (option 50, or `ciaddr` when renewing), the
//!    ACK's `yiaddr` is that address (RFC 2131 §4.3.2: a server ACKs the
//!    address requested or NAKs);
//! 2. its server identifier is a server this network's leases on the node
//!    were served by, and its link-layer source is the one those leases'
//!    replies came from (when known), its IP source that server or the
//!    relay agent the reply names (`giaddr`);
//! 3. its address lies inside one of the network's prefixes (those of the
//!    network's leases on the node), with that prefix's mask, and its router
//!    inside the same prefix;
//! 4. no other binding of the network on the node holds the address.
//!
//! Anything else is refused with a [`Refused`] reason the caller counts.
//! The guest's own RELEASE and DECLINE (client messages the guard has
//! already matched to the port's one MAC) are learned as they are.
//!
//! [`Moves`] paces and coalesces the entry writes these decisions call
//! for: per port, [`MOVE_BURST`] writes back to back and then one per
//! [`MOVE_INTERVAL`]; a write wanted while the port has no token, or while
//! its previous write is still out, waits, and a newer one replaces it.
//!
//! One thing: what an observed guest reply proves, decided without IO (about
//! 550 lines of code; the rest is the tests that try each attack).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::hash::Hash;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use xdhcp_engine::DropReason;
use xdhcp_engine::validate::{self, MessageType};

use super::Learned;

/// How long after the last client message of an exchange a reply may
/// still answer it: RFC 2131 §4.1's longest retransmission delay.
pub const EXCHANGE_WINDOW: Duration = Duration::from_secs(64);
/// Open exchanges remembered per port (the oldest goes first); a client
/// has one exchange out at a time, the guard limits how fast it sends.
pub const EXCHANGES_PER_PORT: usize = 8;
/// Entry writes a port may have back to back.
pub const MOVE_BURST: u32 = 4;
/// One more entry write per port per this long, once the burst is spent.
pub const MOVE_INTERVAL: Duration = Duration::from_secs(30);
/// Before a failed entry write is tried again.
pub const MOVE_RETRY: Duration = Duration::from_secs(5);
/// Tries of one entry write.
pub const MOVE_ATTEMPTS: u32 = 3;

/// Which way an observed message went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// A client message the guest sent (the guard passed it).
    FromGuest,
    /// A reply sent towards the guest.
    ToGuest,
}

/// One observed message and the frame's sources.
#[derive(Debug, Clone, Copy)]
pub struct Seen<'a> {
    pub direction: Direction,
    /// Ethernet source of the frame.
    pub src_mac: [u8; 6],
    /// IPv4 source of the frame.
    pub src_ip: Ipv4Addr,
    /// The DHCP message (UDP payload).
    pub payload: &'a [u8],
}

/// What the node knows about a learning port's network: the servers its
/// leases were served by, its prefixes, the addresses other bindings hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetworkView {
    /// Server identifier → the link-layer sources its replies came from
    /// (empty: not known, any).
    pub servers: BTreeMap<Ipv4Addr, BTreeSet<[u8; 6]>>,
    /// `(network address, prefix length)`.
    pub prefixes: BTreeSet<(Ipv4Addr, u8)>,
    /// Addresses held by other bindings of the network on the node.
    pub held: BTreeSet<Ipv4Addr>,
}

impl NetworkView {
    /// A lease of the network, served by `server` (whose replies came from
    /// `server_mac`, when known), for `address`/`prefix_len`.
    pub fn served(
        &mut self,
        server: Ipv4Addr,
        server_mac: Option<[u8; 6]>,
        address: Ipv4Addr,
        prefix_len: u8,
    ) {
        let macs = self.servers.entry(server).or_default();
        if let Some(m) = server_mac {
            macs.insert(m);
        }
        if prefix_len <= 32 {
            self.prefixes
                .insert((network(address, prefix_len), prefix_len));
        }
    }

    /// The network's prefix holding `ip`, if one does.
    fn prefix_of(&self, ip: Ipv4Addr) -> Option<(Ipv4Addr, u8)> {
        self.prefixes
            .iter()
            .copied()
            .find(|&(net, len)| network(ip, len) == net)
    }
}

fn network(ip: Ipv4Addr, len: u8) -> Ipv4Addr {
    let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
    Ipv4Addr::from(u32::from(ip) & mask)
}

/// Why an observed message was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The engine's validator refused the message.
    #[error("not a valid DHCP message: {0}")]
    Decode(DropReason),
    #[error("chaddr is not the port's MAC")]
    OtherClient,
    /// An ACK answering no client message of the guest (no such xid, or
    /// past its window).
    #[error("answers no REQUEST the guest sent (xid {xid:#010x})")]
    Unsolicited { xid: u32 },
    #[error("acknowledges {acked}, the guest asked for {requested}")]
    NotRequested {
        acked: Ipv4Addr,
        requested: Ipv4Addr,
    },
    /// The port's attachment has no lease on the node to say which
    /// network it is and who serves it.
    #[error("nothing is known of the port's network")]
    UnknownNetwork,
    #[error("server identifier {0:?} serves none of the network's leases")]
    UnknownServer(Option<Ipv4Addr>),
    #[error("sent from {src_ip} ({}), not by server {server}", super::format_mac(*src_mac))]
    ServerSource {
        server: Ipv4Addr,
        src_ip: Ipv4Addr,
        src_mac: [u8; 6],
    },
    #[error("{ip}/{prefix_len:?} (router {router:?}) is outside the network's prefixes")]
    OutsidePrefix {
        ip: Ipv4Addr,
        prefix_len: Option<u8>,
        router: Option<Ipv4Addr>,
    },
    #[error("{0} is held by another binding of the network")]
    AddressTaken(Ipv4Addr),
}

impl Refused {
    /// Stable metric label.
    pub const fn label(&self) -> &'static str {
        match self {
            Self::Decode(_) => "decode",
            Self::OtherClient => "other_client",
            Self::Unsolicited { .. } => "unsolicited",
            Self::NotRequested { .. } => "not_requested",
            Self::UnknownNetwork => "unknown_network",
            Self::UnknownServer(_) => "unknown_server",
            Self::ServerSource { .. } => "server_source",
            Self::OutsidePrefix { .. } => "outside_prefix",
            Self::AddressTaken(_) => "address_taken",
        }
    }

    /// Every label, for documentation and tests.
    pub const LABELS: [&'static str; 9] = [
        "decode",
        "other_client",
        "unsolicited",
        "not_requested",
        "unknown_network",
        "unknown_server",
        "server_source",
        "outside_prefix",
        "address_taken",
    ];
}

/// A client message a reply may answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Exchange {
    xid: u32,
    chaddr: [u8; 6],
    /// The address the message asked for, if it named one.
    requested: Option<Ipv4Addr>,
    /// When it (or its last retransmission) was seen.
    last: Instant,
}

/// The open exchanges of every learning port, by port (host ifindex).
#[derive(Debug, Default)]
pub struct Learner {
    ports: HashMap<u32, VecDeque<Exchange>>,
}

impl Learner {
    /// What message `seen` on `port`, whose one client is `mac`, teaches.
    /// `Ok(None)`: nothing (a client message is kept to match the reply
    /// it asks for; OFFERs, NAKs and INFORM ACKs change no binding).
    /// `view` is asked only for an ACK that answers an exchange.
    pub fn observe(
        &mut self,
        port: u32,
        mac: [u8; 6],
        seen: &Seen<'_>,
        now: Instant,
        view: impl FnOnce() -> Option<NetworkView>,
    ) -> Result<Option<Learned>, Refused> {
        let msg = validate::parse_observed(seen.payload).map_err(Refused::Decode)?;
        if msg.chaddr != mac {
            return Err(Refused::OtherClient);
        }
        match seen.direction {
            Direction::FromGuest => Ok(self.client_message(port, &msg, now)),
            Direction::ToGuest => self.reply(port, &msg, seen, now, view),
        }
    }

    fn client_message(
        &mut self,
        port: u32,
        msg: &validate::Observed,
        now: Instant,
    ) -> Option<Learned> {
        match msg.message_type {
            Some(MessageType::Request) => {
                let requested = msg
                    .requested_ip
                    .or_else(|| (!msg.ciaddr.is_unspecified()).then_some(msg.ciaddr));
                self.open(port, msg, requested, now);
                None
            }
            Some(MessageType::Discover) if msg.rapid_commit => {
                self.open(port, msg, msg.requested_ip, now);
                None
            }
            Some(MessageType::Release) if !msg.ciaddr.is_unspecified() => {
                Some(Learned::Released { ip: msg.ciaddr })
            }
            Some(MessageType::Decline) => msg.requested_ip.map(|ip| Learned::Declined { ip }),
            _ => None,
        }
    }

    /// Remembers (or refreshes, for a retransmission) a client message.
    fn open(
        &mut self,
        port: u32,
        msg: &validate::Observed,
        requested: Option<Ipv4Addr>,
        now: Instant,
    ) {
        let open = self.ports.entry(port).or_default();
        open.retain(|e| {
            e.xid != msg.xid && now.saturating_duration_since(e.last) <= EXCHANGE_WINDOW
        });
        if open.len() >= EXCHANGES_PER_PORT {
            open.pop_front();
        }
        open.push_back(Exchange {
            xid: msg.xid,
            chaddr: msg.chaddr,
            requested,
            last: now,
        });
    }

    fn reply(
        &mut self,
        port: u32,
        msg: &validate::Observed,
        seen: &Seen<'_>,
        now: Instant,
        view: impl FnOnce() -> Option<NetworkView>,
    ) -> Result<Option<Learned>, Refused> {
        let ack = match msg.message_type {
            Some(MessageType::Ack) if !msg.yiaddr.is_unspecified() => true,
            Some(MessageType::Nak) => false,
            _ => return Ok(None),
        };
        let open = self.ports.get_mut(&port);
        let at = open.as_ref().and_then(|o| {
            o.iter().position(|e| {
                e.xid == msg.xid
                    && e.chaddr == msg.chaddr
                    && now.saturating_duration_since(e.last) <= EXCHANGE_WINDOW
            })
        });
        let (Some(open), Some(at)) = (open, at) else {
            return if ack {
                Err(Refused::Unsolicited { xid: msg.xid })
            } else {
                Ok(None)
            };
        };
        if !ack {
            // A NAK teaches nothing; it closes nothing either (a forged one
            // must not shut the exchange its real ACK answers).
            return Ok(None);
        }
        if let Some(requested) = open[at].requested
            && requested != msg.yiaddr
        {
            return Err(Refused::NotRequested {
                acked: msg.yiaddr,
                requested,
            });
        }
        let view = view().ok_or(Refused::UnknownNetwork)?;
        let bound = check_server_and_address(msg, seen, &view)?;
        open.remove(at);
        if open.is_empty() {
            self.ports.remove(&port);
        }
        Ok(Some(bound))
    }

    /// Forgets exchanges past their window, and ports with none left.
    pub fn prune(&mut self, now: Instant) {
        self.ports.retain(|_, open| {
            open.retain(|e| now.saturating_duration_since(e.last) <= EXCHANGE_WINDOW);
            !open.is_empty()
        });
    }

    /// Forgets `port` (unguarded).
    pub fn forget(&mut self, port: u32) {
        self.ports.remove(&port);
    }

    /// Open exchanges, over every port.
    pub fn open_exchanges(&self) -> usize {
        self.ports.values().map(VecDeque::len).sum()
    }
}

/// Checks 2–4 of the module's list on an ACK that answers an exchange.
fn check_server_and_address(
    msg: &validate::Observed,
    seen: &Seen<'_>,
    view: &NetworkView,
) -> Result<Learned, Refused> {
    let server = msg
        .server_id
        .filter(|s| view.servers.contains_key(s))
        .ok_or(Refused::UnknownServer(msg.server_id))?;
    let macs = &view.servers[&server];
    let from_server =
        seen.src_ip == server || (!msg.giaddr.is_unspecified() && seen.src_ip == msg.giaddr);
    if !from_server || !(macs.is_empty() || macs.contains(&seen.src_mac)) {
        return Err(Refused::ServerSource {
            server,
            src_ip: seen.src_ip,
            src_mac: seen.src_mac,
        });
    }
    let outside = || Refused::OutsidePrefix {
        ip: msg.yiaddr,
        prefix_len: msg.prefix_len,
        router: msg.router,
    };
    let (net, len) = view.prefix_of(msg.yiaddr).ok_or_else(outside)?;
    if msg.prefix_len.is_some_and(|p| p != len)
        || msg.router.is_some_and(|r| network(r, len) != net)
    {
        return Err(outside());
    }
    if view.held.contains(&msg.yiaddr) {
        return Err(Refused::AddressTaken(msg.yiaddr));
    }
    let floor = u32::try_from(xdhcp_engine::lease::MIN_LEASE_SECS).unwrap_or(u32::MAX);
    Ok(Learned::Bound {
        ip: msg.yiaddr,
        prefix_len: Some(len),
        router: msg.router,
        // The floor the engine keeps for its own leases.
        lease_secs: msg
            .lease_time
            .filter(|s| *s != u32::MAX)
            .map(|s| s.max(floor)),
    })
}

/// Whether a wanted write goes out now or waits for the port's rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    /// A token is there (the write goes once the previous one is done).
    Now,
    /// Over the port's rate: the write waits for a token.
    Deferred,
}

/// When a GCRA bucket whose theoretical arrival time is `tat` next has a
/// token (`now` when it has one).
fn token_at(tat: Option<Instant>, tolerance: Duration, now: Instant) -> Instant {
    match tat {
        Some(tat) => tat.checked_sub(tolerance).map_or(now, |t| t.max(now)),
        None => now,
    }
}

/// One port's writes.
#[derive(Debug)]
struct Port<T> {
    /// GCRA theoretical arrival time; `None`: a full bucket.
    tat: Option<Instant>,
    /// The newest target not yet started, with its tries left.
    pending: Option<(T, u32)>,
    /// The target being written, with the tries left after this one.
    in_flight: Option<(T, u32)>,
    /// Not before this instant (a retry's delay).
    not_before: Option<Instant>,
}

/// The entry writes of every port: paced, one at a time per port, the
/// newest target replacing an older one not yet started.
#[derive(Debug)]
pub struct Moves<K, T> {
    ports: HashMap<K, Port<T>>,
    burst: u32,
    interval: Duration,
}

impl<K: Eq + Hash + Clone, T: Clone> Default for Moves<K, T> {
    fn default() -> Self {
        Self::new(MOVE_BURST, MOVE_INTERVAL)
    }
}

impl<K: Eq + Hash + Clone, T: Clone> Moves<K, T> {
    /// `burst` writes back to back, then one per `interval`.
    pub fn new(burst: u32, interval: Duration) -> Self {
        Self {
            ports: HashMap::new(),
            burst: burst.max(1),
            interval,
        }
    }

    fn tolerance(&self) -> Duration {
        self.interval * (self.burst - 1)
    }

    /// When the port's bucket next has a token (`now` when it has one).
    fn token_at(&self, p: &Port<T>, now: Instant) -> Instant {
        token_at(p.tat, self.tolerance(), now)
    }

    /// When the port's next write may start, if it has one waiting.
    fn ready_at(&self, p: &Port<T>, now: Instant) -> Option<Instant> {
        if p.pending.is_none() || p.in_flight.is_some() {
            return None;
        }
        let at = self.token_at(p, now);
        Some(p.not_before.map_or(at, |t| t.max(at)))
    }

    /// Wants the entry of `port` written to `target` (replacing a target
    /// not yet started).
    pub fn want(&mut self, port: K, target: T, now: Instant) -> Pace {
        let p = self.ports.entry(port).or_insert(Port {
            tat: None,
            pending: None,
            in_flight: None,
            not_before: None,
        });
        p.pending = Some((target, MOVE_ATTEMPTS));
        p.not_before = None;
        let tat = p.tat;
        if token_at(tat, self.tolerance(), now) > now {
            Pace::Deferred
        } else {
            Pace::Now
        }
    }

    /// The target waiting for `port`'s next write, if one is (not the
    /// one out).
    pub fn pending(&self, port: &K) -> Option<&T> {
        self.ports.get(port)?.pending.as_ref().map(|(t, _)| t)
    }

    /// The next write to start now, if one may; its port's token is taken
    /// and the port has a write out until [`Moves::done`].
    pub fn poll(&mut self, now: Instant) -> Option<(K, T)> {
        let key = self
            .ports
            .iter()
            .find(|(_, p)| self.ready_at(p, now).is_some_and(|t| t <= now))
            .map(|(k, _)| k.clone())?;
        let interval = self.interval;
        let p = self.ports.get_mut(&key)?;
        p.tat = Some(p.tat.map_or(now, |tat| tat.max(now)) + interval);
        p.not_before = None;
        let (target, tries) = p.pending.take()?;
        p.in_flight = Some((target.clone(), tries.saturating_sub(1)));
        Some((key, target))
    }

    /// The write of `port` ended; a failed one is tried again after
    /// [`MOVE_RETRY`] (up to [`MOVE_ATTEMPTS`] tries) unless a newer
    /// target is wanted. Returns whether it will be tried again.
    pub fn done(&mut self, port: &K, ok: bool, now: Instant) -> bool {
        let Some(p) = self.ports.get_mut(port) else {
            return false;
        };
        let Some((target, tries)) = p.in_flight.take() else {
            return false;
        };
        if ok || p.pending.is_some() || tries == 0 {
            return false;
        }
        p.pending = Some((target, tries));
        p.not_before = Some(now + MOVE_RETRY);
        true
    }

    /// When [`Moves::poll`] next has a write to give, if any waits.
    pub fn poll_timeout(&self, now: Instant) -> Option<Instant> {
        self.ports
            .values()
            .filter_map(|p| self.ready_at(p, now))
            .min()
    }

    /// Forgets ports with nothing waiting or out and a full bucket again.
    pub fn prune(&mut self, now: Instant) {
        self.ports.retain(|_, p| {
            p.pending.is_some() || p.in_flight.is_some() || p.tat.is_some_and(|t| t > now)
        });
    }

    /// Ports known (a write waiting or out, or a bucket refilling).
    pub fn ports(&self) -> usize {
        self.ports.len()
    }
}

#[cfg(test)]
mod tests {
    use dhcproto::v4::{self, DhcpOption, Message, Opcode};
    use dhcproto::{Encodable as _, Encoder};

    use super::*;

    const PORT: u32 = 9;
    const MAC: [u8; 6] = [2, 0, 0x5e, 0, 0x53, 0x42];
    const SERVER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
    const SERVER_MAC: [u8; 6] = [2, 0, 0x5e, 0, 0x53, 1];
    const ATTACKER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 66);
    const ATTACKER_MAC: [u8; 6] = [2, 0, 0x5e, 0, 0x53, 0x66];
    const GUEST_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 232);
    /// Held by a neighbour on the node.
    const NEIGHBOUR_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 50);

    fn msg(op: Opcode, mt: v4::MessageType, xid: u32, f: impl FnOnce(&mut Message)) -> Vec<u8> {
        let mut m = Message::default();
        m.set_opcode(op).set_xid(xid).set_chaddr(&MAC);
        m.opts_mut().insert(DhcpOption::MessageType(mt));
        f(&mut m);
        let mut b = Vec::new();
        m.encode(&mut Encoder::new(&mut b)).unwrap();
        b
    }

    /// A REQUEST for `ip` (SELECTING or INIT-REBOOT: option 50).
    fn request(xid: u32, ip: Ipv4Addr) -> Vec<u8> {
        msg(Opcode::BootRequest, v4::MessageType::Request, xid, |m| {
            m.opts_mut().insert(DhcpOption::RequestedIpAddress(ip));
        })
    }

    /// An ACK for `ip` from `server`, as dnsmasq sends it.
    fn ack(xid: u32, ip: Ipv4Addr, server: Ipv4Addr) -> Vec<u8> {
        ack_with(xid, ip, server, |_| {})
    }

    fn ack_with(xid: u32, ip: Ipv4Addr, server: Ipv4Addr, f: impl FnOnce(&mut Message)) -> Vec<u8> {
        msg(Opcode::BootReply, v4::MessageType::Ack, xid, |m| {
            m.set_yiaddr(ip);
            let o = m.opts_mut();
            o.insert(DhcpOption::ServerIdentifier(server));
            o.insert(DhcpOption::AddressLeaseTime(120));
            o.insert(DhcpOption::SubnetMask(Ipv4Addr::new(255, 255, 255, 0)));
            o.insert(DhcpOption::Router(vec![SERVER]));
            f(m);
        })
    }

    fn view() -> NetworkView {
        let mut v = NetworkView::default();
        // The VM's own one-shot lease and a neighbour's, both from SERVER.
        v.served(SERVER, Some(SERVER_MAC), Ipv4Addr::new(192, 0, 2, 10), 24);
        v.served(SERVER, Some(SERVER_MAC), NEIGHBOUR_IP, 24);
        v.held.insert(NEIGHBOUR_IP);
        v
    }

    /// A learner and an explicit clock.
    struct T {
        l: Learner,
        t0: Instant,
    }

    impl T {
        fn new() -> Self {
            Self {
                l: Learner::default(),
                t0: Instant::now(),
            }
        }

        fn guest_sends(&mut self, at: u64, payload: &[u8]) -> Result<Option<Learned>, Refused> {
            let seen = Seen {
                direction: Direction::FromGuest,
                src_mac: MAC,
                src_ip: Ipv4Addr::UNSPECIFIED,
                payload,
            };
            self.l.observe(PORT, MAC, &seen, self.at(at), || {
                panic!("a client message needs no view")
            })
        }

        fn guest_gets_from(
            &mut self,
            at: u64,
            src: (Ipv4Addr, [u8; 6]),
            payload: &[u8],
        ) -> Result<Option<Learned>, Refused> {
            let seen = Seen {
                direction: Direction::ToGuest,
                src_mac: src.1,
                src_ip: src.0,
                payload,
            };
            self.l
                .observe(PORT, MAC, &seen, self.at(at), || Some(view()))
        }

        /// A reply from the real server.
        fn guest_gets(&mut self, at: u64, payload: &[u8]) -> Result<Option<Learned>, Refused> {
            self.guest_gets_from(at, (SERVER, SERVER_MAC), payload)
        }

        fn at(&self, secs: u64) -> Instant {
            self.t0 + Duration::from_secs(secs)
        }
    }

    fn bound(ip: Ipv4Addr) -> Learned {
        Learned::Bound {
            ip,
            prefix_len: Some(24),
            router: Some(SERVER),
            lease_secs: Some(120),
        }
    }

    #[test]
    fn the_ack_of_a_request_the_guest_sent_is_learned_once() {
        let mut t = T::new();
        assert_eq!(t.guest_sends(0, &request(7, GUEST_IP)), Ok(None));
        assert_eq!(
            t.guest_gets(0, &ack(7, GUEST_IP, SERVER)),
            Ok(Some(bound(GUEST_IP)))
        );
        // The exchange is closed: a replay of the same ACK is refused.
        assert_eq!(
            t.guest_gets(1, &ack(7, GUEST_IP, SERVER)),
            Err(Refused::Unsolicited { xid: 7 })
        );
        assert_eq!(t.l.open_exchanges(), 0);
    }

    /// The finding itself: a unicast ACK for the VM's MAC that answers
    /// nothing the guest sent (any host on the segment can send one).
    #[test]
    fn a_forged_ack_with_no_client_message_is_refused() {
        let mut t = T::new();
        let forged = ack(0xdead_beef, NEIGHBOUR_IP, SERVER);
        assert_eq!(
            t.guest_gets_from(0, (ATTACKER, ATTACKER_MAC), &forged),
            Err(Refused::Unsolicited { xid: 0xdead_beef })
        );
        // Even sent as the server.
        assert_eq!(
            t.guest_gets(0, &ack(1, GUEST_IP, SERVER)),
            Err(Refused::Unsolicited { xid: 1 })
        );
    }

    #[test]
    fn an_ack_for_another_xid_is_refused() {
        let mut t = T::new();
        t.guest_sends(0, &request(7, GUEST_IP)).unwrap();
        assert_eq!(
            t.guest_gets(0, &ack(8, GUEST_IP, SERVER)),
            Err(Refused::Unsolicited { xid: 8 })
        );
        // Another client's ACK (another chaddr) on the port teaches nothing.
        let other = msg(Opcode::BootReply, v4::MessageType::Ack, 7, |m| {
            m.set_chaddr(&[2, 0, 0, 0, 0, 1]).set_yiaddr(GUEST_IP);
        });
        assert_eq!(t.guest_gets(0, &other), Err(Refused::OtherClient));
        // The real one still binds.
        assert_eq!(
            t.guest_gets(0, &ack(7, GUEST_IP, SERVER)),
            Ok(Some(bound(GUEST_IP)))
        );
    }

    #[test]
    fn an_ack_past_the_retransmission_window_is_refused() {
        let mut t = T::new();
        t.guest_sends(0, &request(7, GUEST_IP)).unwrap();
        assert_eq!(
            t.guest_gets(65, &ack(7, GUEST_IP, SERVER)),
            Err(Refused::Unsolicited { xid: 7 })
        );
        // A retransmission (same xid) opens the window again.
        t.guest_sends(100, &request(7, GUEST_IP)).unwrap();
        assert_eq!(
            t.guest_gets(164, &ack(7, GUEST_IP, SERVER)),
            Ok(Some(bound(GUEST_IP)))
        );
        // The window is pruned too.
        t.guest_sends(200, &request(9, GUEST_IP)).unwrap();
        t.l.prune(t.at(300));
        assert_eq!(t.l.open_exchanges(), 0);
    }

    #[test]
    fn an_ack_for_another_address_than_requested_is_refused() {
        let mut t = T::new();
        t.guest_sends(0, &request(7, GUEST_IP)).unwrap();
        let other = Ipv4Addr::new(192, 0, 2, 233);
        assert_eq!(
            t.guest_gets(0, &ack(7, other, SERVER)),
            Err(Refused::NotRequested {
                acked: other,
                requested: GUEST_IP
            })
        );
        // A renewal names its address in ciaddr.
        let renew = msg(Opcode::BootRequest, v4::MessageType::Request, 8, |m| {
            m.set_ciaddr(GUEST_IP);
        });
        t.guest_sends(1, &renew).unwrap();
        assert!(matches!(
            t.guest_gets(1, &ack(8, other, SERVER)),
            Err(Refused::NotRequested { .. })
        ));
        assert_eq!(
            t.guest_gets(1, &ack(8, GUEST_IP, SERVER)),
            Ok(Some(bound(GUEST_IP)))
        );
    }

    #[test]
    fn an_ack_from_a_server_never_seen_for_the_network_is_refused() {
        let mut t = T::new();
        t.guest_sends(0, &request(7, GUEST_IP)).unwrap();
        // A rogue server answering the guest's real REQUEST, as itself.
        assert_eq!(
            t.guest_gets_from(0, (ATTACKER, ATTACKER_MAC), &ack(7, GUEST_IP, ATTACKER)),
            Err(Refused::UnknownServer(Some(ATTACKER)))
        );
        // Or claiming the real server's identifier, from its own address or MAC.
        assert!(matches!(
            t.guest_gets_from(0, (ATTACKER, SERVER_MAC), &ack(7, GUEST_IP, SERVER)),
            Err(Refused::ServerSource { .. })
        ));
        assert!(matches!(
            t.guest_gets_from(0, (SERVER, ATTACKER_MAC), &ack(7, GUEST_IP, SERVER)),
            Err(Refused::ServerSource { .. })
        ));
        // Without a server identifier.
        let bare = msg(Opcode::BootReply, v4::MessageType::Ack, 7, |m| {
            m.set_yiaddr(GUEST_IP);
        });
        assert_eq!(t.guest_gets(0, &bare), Err(Refused::UnknownServer(None)));
        // The refusals closed nothing: the real ACK binds.
        assert_eq!(
            t.guest_gets(0, &ack(7, GUEST_IP, SERVER)),
            Ok(Some(bound(GUEST_IP)))
        );
    }

    /// Relayed: the reply comes from the relay agent it names (`giaddr`),
    /// at the link-layer source the network's own leases came from.
    #[test]
    fn a_relayed_ack_comes_from_its_relay_agent() {
        let relay = Ipv4Addr::new(192, 0, 2, 254);
        let remote = Ipv4Addr::new(198, 51, 100, 7);
        let mut v = NetworkView::default();
        v.served(remote, Some(SERVER_MAC), Ipv4Addr::new(192, 0, 2, 10), 24);
        let mut l = Learner::default();
        let now = Instant::now();
        let from_guest = Seen {
            direction: Direction::FromGuest,
            src_mac: MAC,
            src_ip: Ipv4Addr::UNSPECIFIED,
            payload: &request(7, GUEST_IP),
        };
        l.observe(PORT, MAC, &from_guest, now, || None).unwrap();
        let relayed = ack_with(7, GUEST_IP, remote, |m| {
            m.set_giaddr(relay);
        });
        let seen = |src_ip| Seen {
            direction: Direction::ToGuest,
            src_mac: SERVER_MAC,
            src_ip,
            payload: &relayed,
        };
        assert!(matches!(
            l.observe(PORT, MAC, &seen(ATTACKER), now, || Some(v.clone())),
            Err(Refused::ServerSource { .. })
        ));
        assert_eq!(
            l.observe(PORT, MAC, &seen(relay), now, || Some(v.clone())),
            Ok(Some(bound(GUEST_IP)))
        );
    }

    #[test]
    fn an_address_outside_the_networks_prefix_is_refused() {
        let mut t = T::new();
        let outside = Ipv4Addr::new(10, 0, 0, 5);
        t.guest_sends(0, &request(7, outside)).unwrap();
        assert!(matches!(
            t.guest_gets(0, &ack(7, outside, SERVER)),
            Err(Refused::OutsidePrefix { .. })
        ));
        // Inside, but with a wider mask, or a router elsewhere.
        t.guest_sends(0, &request(8, GUEST_IP)).unwrap();
        let wide = ack_with(8, GUEST_IP, SERVER, |m| {
            m.opts_mut()
                .insert(DhcpOption::SubnetMask(Ipv4Addr::new(255, 255, 0, 0)));
        });
        assert!(matches!(
            t.guest_gets(0, &wide),
            Err(Refused::OutsidePrefix {
                prefix_len: Some(16),
                ..
            })
        ));
        let router = ack_with(8, GUEST_IP, SERVER, |m| {
            m.opts_mut()
                .insert(DhcpOption::Router(vec![Ipv4Addr::new(10, 0, 0, 1)]));
        });
        assert!(matches!(
            t.guest_gets(0, &router),
            Err(Refused::OutsidePrefix { .. })
        ));
        // Without a mask the network's own prefix is reported.
        let no_mask = ack_with(8, GUEST_IP, SERVER, |m| {
            m.opts_mut().remove(v4::OptionCode::SubnetMask);
        });
        assert_eq!(t.guest_gets(0, &no_mask), Ok(Some(bound(GUEST_IP))));
    }

    #[test]
    fn an_address_another_binding_holds_is_refused() {
        let mut t = T::new();
        t.guest_sends(0, &request(7, NEIGHBOUR_IP)).unwrap();
        assert_eq!(
            t.guest_gets(0, &ack(7, NEIGHBOUR_IP, SERVER)),
            Err(Refused::AddressTaken(NEIGHBOUR_IP))
        );
    }

    #[test]
    fn a_port_of_no_known_network_learns_nothing() {
        let mut l = Learner::default();
        let now = Instant::now();
        let guest = Seen {
            direction: Direction::FromGuest,
            src_mac: MAC,
            src_ip: Ipv4Addr::UNSPECIFIED,
            payload: &request(7, GUEST_IP),
        };
        l.observe(PORT, MAC, &guest, now, || None).unwrap();
        let reply = ack(7, GUEST_IP, SERVER);
        let seen = Seen {
            direction: Direction::ToGuest,
            src_mac: SERVER_MAC,
            src_ip: SERVER,
            payload: &reply,
        };
        assert_eq!(
            l.observe(PORT, MAC, &seen, now, || None),
            Err(Refused::UnknownNetwork)
        );
    }

    #[test]
    fn a_nak_teaches_nothing_and_closes_nothing() {
        let mut t = T::new();
        t.guest_sends(0, &request(7, GUEST_IP)).unwrap();
        let nak = msg(Opcode::BootReply, v4::MessageType::Nak, 7, |m| {
            m.opts_mut().insert(DhcpOption::ServerIdentifier(SERVER));
        });
        assert_eq!(
            t.guest_gets_from(0, (ATTACKER, ATTACKER_MAC), &nak),
            Ok(None)
        );
        assert_eq!(
            t.guest_gets(0, &ack(7, GUEST_IP, SERVER)),
            Ok(Some(bound(GUEST_IP)))
        );
        // An unanswered NAK, an OFFER, an INFORM's ACK: nothing either.
        assert_eq!(t.guest_gets(0, &nak), Ok(None));
        let offer = msg(Opcode::BootReply, v4::MessageType::Offer, 3, |m| {
            m.set_yiaddr(GUEST_IP);
        });
        assert_eq!(t.guest_gets(0, &offer), Ok(None));
        let inform_ack = msg(Opcode::BootReply, v4::MessageType::Ack, 3, |_| {});
        assert_eq!(t.guest_gets(0, &inform_ack), Ok(None));
    }

    /// RFC 4039: a DISCOVER with Rapid Commit may be answered by an ACK;
    /// one without it may not.
    #[test]
    fn a_rapid_commit_discover_opens_an_exchange() {
        let mut t = T::new();
        let plain = msg(Opcode::BootRequest, v4::MessageType::Discover, 7, |_| {});
        t.guest_sends(0, &plain).unwrap();
        assert!(matches!(
            t.guest_gets(0, &ack(7, GUEST_IP, SERVER)),
            Err(Refused::Unsolicited { .. })
        ));
        let rapid = msg(Opcode::BootRequest, v4::MessageType::Discover, 8, |m| {
            m.opts_mut().insert(DhcpOption::RapidCommit);
        });
        t.guest_sends(0, &rapid).unwrap();
        assert_eq!(
            t.guest_gets(0, &ack(8, GUEST_IP, SERVER)),
            Ok(Some(bound(GUEST_IP)))
        );
    }

    #[test]
    fn a_tiny_lease_is_learned_at_the_engines_floor() {
        let mut t = T::new();
        t.guest_sends(0, &request(7, GUEST_IP)).unwrap();
        let tiny = ack_with(7, GUEST_IP, SERVER, |m| {
            m.opts_mut().insert(DhcpOption::AddressLeaseTime(1));
        });
        assert!(matches!(
            t.guest_gets(0, &tiny),
            Ok(Some(Learned::Bound {
                lease_secs: Some(20),
                ..
            }))
        ));
        // An infinite one has no expiry.
        t.guest_sends(0, &request(8, GUEST_IP)).unwrap();
        let forever = ack_with(8, GUEST_IP, SERVER, |m| {
            m.opts_mut().insert(DhcpOption::AddressLeaseTime(u32::MAX));
        });
        assert!(matches!(
            t.guest_gets(0, &forever),
            Ok(Some(Learned::Bound {
                lease_secs: None,
                ..
            }))
        ));
    }

    #[test]
    fn open_exchanges_are_bounded_per_port() {
        let mut t = T::new();
        for xid in 0..100 {
            t.guest_sends(0, &request(xid, GUEST_IP)).unwrap();
        }
        assert_eq!(t.l.open_exchanges(), EXCHANGES_PER_PORT);
        // The newest are kept.
        assert!(t.guest_gets(0, &ack(99, GUEST_IP, SERVER)).is_ok());
        assert!(matches!(
            t.guest_gets(0, &ack(0, GUEST_IP, SERVER)),
            Err(Refused::Unsolicited { .. })
        ));
    }

    #[test]
    fn release_gives_the_address_back_and_decline_refuses_it() {
        let mut t = T::new();
        let release = msg(Opcode::BootRequest, v4::MessageType::Release, 1, |m| {
            m.set_ciaddr(GUEST_IP);
        });
        assert_eq!(
            t.guest_sends(0, &release),
            Ok(Some(Learned::Released { ip: GUEST_IP }))
        );
        let decline = msg(Opcode::BootRequest, v4::MessageType::Decline, 2, |m| {
            m.opts_mut()
                .insert(DhcpOption::RequestedIpAddress(Ipv4Addr::new(192, 0, 2, 7)));
        });
        assert_eq!(
            t.guest_sends(0, &decline),
            Ok(Some(Learned::Declined {
                ip: Ipv4Addr::new(192, 0, 2, 7)
            }))
        );
        // A DECLINE without the address it refuses teaches nothing.
        let bare = msg(Opcode::BootRequest, v4::MessageType::Decline, 3, |_| {});
        assert_eq!(t.guest_sends(0, &bare), Ok(None));
    }

    /// Learning decodes with the engine's validator: what it refuses in a
    /// reply to the agent's own lease teaches nothing here either.
    #[test]
    fn a_message_the_validator_refuses_teaches_nothing() {
        let mut t = T::new();
        t.guest_sends(0, &request(7, GUEST_IP)).unwrap();
        let good = ack(7, GUEST_IP, SERVER);
        let refused = |t: &mut T, bytes: &[u8]| match t.guest_gets(0, bytes) {
            Err(Refused::Decode(reason)) => reason,
            other => panic!("{other:?}"),
        };
        let mut bad_cookie = good.clone();
        bad_cookie[236] = 0;
        assert_eq!(refused(&mut t, &bad_cookie), DropReason::BadCookie);
        let end = good.iter().rposition(|b| *b == 255).unwrap();
        let mut long_option = good[..end].to_vec();
        long_option.extend_from_slice(&[15, 200, b'x']);
        assert_eq!(refused(&mut t, &long_option), DropReason::BadOptionLength);
        let mut short_lease_time = good[..end].to_vec();
        short_lease_time.extend_from_slice(&[51, 2, 0, 60, 255]);
        assert_eq!(refused(&mut t, &short_lease_time), DropReason::BadLeaseTime);
        assert_eq!(refused(&mut t, b"junk"), DropReason::Truncated);
        assert_eq!(t.guest_gets(0, &good), Ok(Some(bound(GUEST_IP))));
    }

    #[test]
    fn every_refusal_has_a_listed_label() {
        let all = [
            Refused::Decode(DropReason::Truncated),
            Refused::OtherClient,
            Refused::Unsolicited { xid: 0 },
            Refused::NotRequested {
                acked: GUEST_IP,
                requested: GUEST_IP,
            },
            Refused::UnknownNetwork,
            Refused::UnknownServer(None),
            Refused::ServerSource {
                server: SERVER,
                src_ip: SERVER,
                src_mac: MAC,
            },
            Refused::OutsidePrefix {
                ip: GUEST_IP,
                prefix_len: None,
                router: None,
            },
            Refused::AddressTaken(GUEST_IP),
        ];
        let labels: Vec<_> = all.iter().map(Refused::label).collect();
        assert_eq!(labels, Refused::LABELS);
    }

    fn secs(t0: Instant, s: u64) -> Instant {
        t0 + Duration::from_secs(s)
    }

    /// A flood of moves on one port (every ACK a real exchange, say, but a
    /// guest flapping between addresses): the burst goes out, then one
    /// write per interval, each the newest target.
    #[test]
    fn a_flood_of_moves_is_paced_and_coalesced() {
        let mut m: Moves<&str, u32> = Moves::default();
        let t0 = Instant::now();
        let mut written = Vec::new();
        let mut deferred = 0;
        for i in 0..100 {
            if m.want("vm1", i, t0) == Pace::Deferred {
                deferred += 1;
            }
            while let Some((k, target)) = m.poll(t0) {
                written.push(target);
                assert!(!m.done(&k, true, t0));
            }
        }
        assert_eq!(written, [0, 1, 2, 3], "the burst, then nothing");
        assert_eq!(deferred, 96);
        assert_eq!(m.poll_timeout(t0), Some(secs(t0, 30)));
        assert_eq!(m.poll(secs(t0, 29)), None);
        assert_eq!(m.poll(secs(t0, 30)), Some(("vm1", 99)), "the newest target");
        m.done(&"vm1", true, secs(t0, 30));
        assert_eq!(m.poll_timeout(secs(t0, 30)), None, "nothing waits");
        // Another port is paced on its own.
        m.want("vm2", 7, t0);
        assert_eq!(m.poll(secs(t0, 30)), Some(("vm2", 7)));
        // Once quiet for the burst's worth of intervals, a port is forgotten.
        m.done(&"vm2", true, secs(t0, 30));
        m.prune(secs(t0, 1000));
        assert_eq!(m.ports(), 0);
    }

    #[test]
    fn one_write_per_port_is_out_and_the_newest_target_follows_it() {
        let mut m: Moves<&str, u32> = Moves::default();
        let t0 = Instant::now();
        m.want("vm1", 1, t0);
        assert_eq!(m.poll(t0), Some(("vm1", 1)));
        m.want("vm1", 2, t0);
        m.want("vm1", 3, t0);
        assert_eq!(m.poll(t0), None, "the first is still out");
        assert_eq!(m.poll_timeout(t0), None);
        assert!(
            !m.done(&"vm1", false, t0),
            "a newer target replaces the retry"
        );
        assert_eq!(m.poll(t0), Some(("vm1", 3)));
    }

    #[test]
    fn a_failed_write_is_tried_again_a_few_times() {
        let mut m: Moves<&str, u32> = Moves::default();
        let t0 = Instant::now();
        m.want("vm1", 1, t0);
        let mut now = t0;
        let mut tries = 0;
        while let Some(at) = m.poll_timeout(now) {
            now = now.max(at);
            assert_eq!(m.poll(now), Some(("vm1", 1)));
            tries += 1;
            m.done(&"vm1", false, now);
        }
        assert_eq!(tries, MOVE_ATTEMPTS);
        assert!(now >= t0 + MOVE_RETRY * (MOVE_ATTEMPTS - 1));
    }
}
