//! What a guest's own DHCPv6 on a learning port proves (sans-IO: messages,
//! what the node knows about the network and an explicit clock in;
//! decisions out): the IPv6 edition of [`super::learner`]'s rules.
//!
//! A REPLY seen towards a guest is learned only when a real exchange on
//! that port proves it ([`Learner6::observe`]):
//!
//! 1. it answers a client message seen leaving the guest — a REQUEST,
//!    RENEW or REBIND, or a SOLICIT with Rapid Commit answered with Rapid
//!    Commit (RFC 8415 §18.2.1) — with the same 24-bit transaction id and
//!    the same Client Identifier (the guest's DUID), seen at most that
//!    message's retransmission window before ([`window`]: its maximum
//!    retransmission time, RFC 8415 §7.6, plus the 10 % of randomisation
//!    §15 allows); its `IA_NA` is one the guest asked for (by IAID);
//! 2. its Server Identifier is a DUID this network's DHCPv6 leases on the
//!    node were served by, and it comes from where those leases' REPLYs
//!    came from on the link: one of their IPv6 sources (the server's, or
//!    on a relayed network the relay agent's: a relay forwards the
//!    server's REPLY to the client from its own address on the client's
//!    link, RFC 8415 §19.2), and one of their link-layer sources — each
//!    when known (leases recorded before the sources were kept know
//!    neither; a lease read from a UDP socket knows no link-layer source);
//! 3. the address it binds (the first of the `IA_NA` with a non-zero valid
//!    lifetime) lies inside one of the network's IPv6 prefixes (those of
//!    the network's DHCPv6 leases on the node);
//! 4. no other binding of the network on the node holds the address.
//!
//! A REPLY whose Status Code (top level or in the `IA_NA`) is not Success
//! teaches nothing and closes nothing. Anything else is refused with a
//! [`Refused6`] reason the caller counts. The guest's own RELEASE and
//! DECLINE (client messages the guard has already matched to the port's
//! one MAC) give the addresses they name up, as they are.
//!
//! An address the guest configures itself (SLAAC, static) is learned from
//! its duplicate address detection probe ([`dad`]): a global address
//! inside the network's prefixes that no other binding holds, at most
//! [`DAD_PER_PORT`] per port.
//!
//! One thing: what an observed guest DHCPv6 message or address probe
//! proves, decided without IO.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::Ipv6Addr;
use std::time::{Duration, Instant};

use dhcproto::v6::{DhcpOption, IANA, MessageType, Status};
use xdhcp_engine::v6::validate;
use xdhcp_engine::v6::{DropReason, Source};

use super::learner::{Direction, EXCHANGES_PER_PORT};

/// The retransmission window of a client message of type `t`: the longest
/// a client waits between two transmissions of it (RFC 8415 §7.6:
/// `SOL_MAX_RT` 3600 s, `REQ_MAX_RT` 30 s, `REN_MAX_RT` and `REB_MAX_RT`
/// 600 s; RELEASE and DECLINE wait at most their first timeout doubled
/// four times, 16 s), plus the 10 % randomisation §15 adds to each.
pub fn window(t: MessageType) -> Duration {
    let max_rt = match t {
        MessageType::Solicit => 3600,
        MessageType::Request => 30,
        MessageType::Renew | MessageType::Rebind => 600,
        _ => 16,
    };
    Duration::from_secs(max_rt) + Duration::from_secs(max_rt) / 10
}

/// One observed DHCPv6 message and the frame's sources.
#[derive(Debug, Clone, Copy)]
pub struct Seen6<'a> {
    pub direction: Direction,
    /// Ethernet source of the frame.
    pub src_mac: [u8; 6],
    /// IPv6 source of the frame.
    pub src_ip: Ipv6Addr,
    /// The DHCPv6 message (UDP payload).
    pub payload: &'a [u8],
}

/// Where a server's REPLYs to the network's leases came from on the link
/// (each set empty: not known, any).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Senders {
    /// IPv6 sources: the server's, or the relay agent's that forwarded
    /// them.
    pub ips: BTreeSet<Ipv6Addr>,
    /// Link-layer sources.
    pub macs: BTreeSet<[u8; 6]>,
}

impl Senders {
    /// Whether a REPLY from `ip` and `mac` comes from one of them.
    pub fn sent(&self, ip: Ipv6Addr, mac: [u8; 6]) -> bool {
        (self.ips.is_empty() || self.ips.contains(&ip))
            && (self.macs.is_empty() || self.macs.contains(&mac))
    }
}

/// What the node knows about a learning port's network for IPv6: the
/// servers (DUIDs) its DHCPv6 leases were served by and where their REPLYs
/// came from, its prefixes, the addresses other bindings hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetworkView6 {
    /// Server DUID → where its REPLYs came from.
    pub servers: BTreeMap<Vec<u8>, Senders>,
    /// `(network address, prefix length)`.
    pub prefixes: BTreeSet<(Ipv6Addr, u8)>,
    /// Addresses held by other bindings of the network on the node.
    pub held: BTreeSet<Ipv6Addr>,
}

impl NetworkView6 {
    /// A DHCPv6 lease of the network, served by `server` (a DUID; its
    /// REPLY came from `from`, when known), for `address`/`prefix_len`.
    pub fn served(
        &mut self,
        server: &[u8],
        from: Option<Source>,
        address: Ipv6Addr,
        prefix_len: u8,
    ) {
        let senders = self.servers.entry(server.to_vec()).or_default();
        if let Some(from) = from {
            senders.ips.insert(from.ip);
            senders.macs.extend(from.mac);
        }
        if prefix_len <= 128 {
            self.prefixes
                .insert((network6(address, prefix_len), prefix_len));
        }
    }

    /// Whether `ip` lies inside one of the network's prefixes.
    pub fn inside(&self, ip: Ipv6Addr) -> bool {
        self.prefixes
            .iter()
            .any(|&(net, len)| network6(ip, len) == net)
    }
}

/// `ip` with every bit past the first `len` cleared.
pub fn network6(ip: Ipv6Addr, len: u8) -> Ipv6Addr {
    let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
    Ipv6Addr::from(u128::from(ip) & mask)
}

/// What one observed DHCPv6 message means for the port's IPv6 binding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Learned6 {
    /// The server bound `ip` to the guest.
    Bound {
        ip: Ipv6Addr,
        /// Valid lifetime in seconds (`None`: infinite).
        valid_secs: Option<u32>,
    },
    /// The guest gave these addresses up (RELEASE), or refused them
    /// (DECLINE, `declined`: its duplicate address detection found them
    /// in use, so it never held them).
    GivenUp { ips: Vec<Ipv6Addr>, declined: bool },
    /// The guest configured `ip` itself (its duplicate address detection
    /// probe for it).
    Configured { ip: Ipv6Addr },
}

/// Addresses a port's guest may have configured itself at once (SLAAC's
/// stable and temporary addresses, a static one); one more is refused
/// until the port goes: a guest announcing address after address does not
/// make its entry churn.
pub const DAD_PER_PORT: usize = 4;

/// What the guest's duplicate address detection probe for `target` (a
/// neighbour solicitation from `::`) teaches: a global address (not
/// link-local, multicast or unspecified: those teach nothing) inside the
/// network's prefixes (`view`; `None`: unknown network), held by no other
/// binding of the network, not already one of the guest's `own` addresses
/// (its DHCPv6 lease or binding: nothing new) or of those it configured
/// (`configured`), of which it may have [`DAD_PER_PORT`].
pub fn dad(
    target: Ipv6Addr,
    view: Option<&NetworkView6>,
    own: &BTreeSet<Ipv6Addr>,
    configured: &BTreeSet<Ipv6Addr>,
) -> Result<Option<Learned6>, Refused6> {
    if !validate::is_usable(target) || own.contains(&target) || configured.contains(&target) {
        return Ok(None);
    }
    let view = view.ok_or(Refused6::UnknownNetwork)?;
    if !view.inside(target) {
        return Err(Refused6::OutsidePrefix(target));
    }
    if view.held.contains(&target) {
        return Err(Refused6::AddressTaken(target));
    }
    if configured.len() >= DAD_PER_PORT {
        return Err(Refused6::TooMany(target));
    }
    Ok(Some(Learned6::Configured { ip: target }))
}

/// Why an observed DHCPv6 message was refused. The labels are the IPv4
/// learner's for the same check.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused6 {
    /// The engine's validator refused the message.
    #[error("not a valid DHCPv6 message: {0}")]
    Decode(DropReason),
    /// A REPLY answering no client message of the guest (no such
    /// transaction id and Client Identifier, or past its window, or an
    /// `IA_NA` the guest did not ask for).
    #[error("answers no message the guest sent (transaction {xid:#08x})")]
    Unsolicited { xid: u32 },
    /// The port's attachment has no DHCPv6 lease on the node to say which
    /// network it is and who serves it.
    #[error("nothing is known of the port's IPv6 network")]
    UnknownNetwork,
    #[error("server identifier {} serves none of the network's leases", hex(.0.as_deref()))]
    UnknownServer(Option<Vec<u8>>),
    /// The Server Identifier is a known server's, but the REPLY comes
    /// from an IPv6 or link-layer source none of the network's leases got
    /// that server's REPLYs from.
    #[error("sent from {src_ip} ({}), not from where the server's replies came from", super::format_mac(*src_mac))]
    ServerSource { src_ip: Ipv6Addr, src_mac: [u8; 6] },
    #[error("{0} is outside the network's IPv6 prefixes")]
    OutsidePrefix(Ipv6Addr),
    #[error("{0} is held by another binding of the network")]
    AddressTaken(Ipv6Addr),
    /// The guest already configured as many addresses as a port may hold.
    #[error("{0} is one self-configured address too many for the port")]
    TooMany(Ipv6Addr),
}

fn hex(duid: Option<&[u8]>) -> String {
    use std::fmt::Write as _;
    duid.map_or_else(
        || "(none)".to_owned(),
        |d| {
            d.iter().fold(String::new(), |mut s, b| {
                let _ = write!(s, "{b:02x}");
                s
            })
        },
    )
}

impl Refused6 {
    /// Stable metric label (the IPv4 learner's for the same check).
    pub const fn label(&self) -> &'static str {
        match self {
            Self::Decode(_) => "decode",
            Self::Unsolicited { .. } => "unsolicited",
            Self::UnknownNetwork => "unknown_network",
            Self::UnknownServer(_) => "unknown_server",
            Self::ServerSource { .. } => "server_source",
            Self::OutsidePrefix(_) => "outside_prefix",
            Self::AddressTaken(_) => "address_taken",
            Self::TooMany(_) => "too_many",
        }
    }
}

/// A client message a REPLY may answer.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Exchange6 {
    xid: u32,
    duid: Vec<u8>,
    /// The IAIDs of the message's `IA_NA`s.
    iaids: Vec<u32>,
    /// A SOLICIT (answered only with Rapid Commit).
    solicit: bool,
    /// A RELEASE or DECLINE: its REPLY binds nothing.
    gives_up: bool,
    /// When it (or its last retransmission) was seen.
    last: Instant,
    window: Duration,
}

impl Exchange6 {
    fn open_at(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.last) <= self.window
    }
}

/// The open DHCPv6 exchanges of every learning port, by port (host
/// ifindex).
#[derive(Debug, Default)]
pub struct Learner6 {
    ports: HashMap<u32, VecDeque<Exchange6>>,
}

impl Learner6 {
    /// What DHCPv6 message `seen` on `port` teaches. `Ok(None)`: nothing
    /// (a client message is kept to match the REPLY it asks for; ADVERTISE
    /// and failure statuses change no binding). `view` is asked only for a
    /// REPLY that answers an exchange.
    pub fn observe(
        &mut self,
        port: u32,
        seen: &Seen6<'_>,
        now: Instant,
        view: impl FnOnce() -> Option<NetworkView6>,
    ) -> Result<Option<Learned6>, Refused6> {
        match seen.direction {
            Direction::FromGuest => {
                let msg = validate::parse_client(seen.payload).map_err(Refused6::Decode)?;
                Ok(self.client_message(port, &msg, now))
            }
            Direction::ToGuest => {
                let msg = validate::parse(seen.payload).map_err(Refused6::Decode)?;
                self.reply(port, &msg, seen, now, view)
            }
        }
    }

    fn client_message(
        &mut self,
        port: u32,
        msg: &validate::ClientMessage,
        now: Instant,
    ) -> Option<Learned6> {
        let gives_up = matches!(msg.msg_type, MessageType::Release | MessageType::Decline);
        let opens = match msg.msg_type {
            MessageType::Request | MessageType::Renew | MessageType::Rebind => true,
            MessageType::Solicit => msg.rapid_commit,
            _ => gives_up,
        };
        let duid = msg.client_id.clone()?;
        if opens {
            let open = self.ports.entry(port).or_default();
            open.retain(|e| !(e.xid == msg.xid && e.duid == duid) && e.open_at(now));
            if open.len() >= EXCHANGES_PER_PORT {
                open.pop_front();
            }
            open.push_back(Exchange6 {
                xid: msg.xid,
                duid,
                iaids: msg.ia_na.iter().map(|ia| ia.id).collect(),
                solicit: msg.msg_type == MessageType::Solicit,
                gives_up,
                last: now,
                window: window(msg.msg_type),
            });
        }
        gives_up.then(|| Learned6::GivenUp {
            ips: msg.ia_na.iter().flat_map(addresses).collect(),
            declined: msg.msg_type == MessageType::Decline,
        })
    }

    fn reply(
        &mut self,
        port: u32,
        msg: &validate::ServerMessage,
        seen: &Seen6<'_>,
        now: Instant,
        view: impl FnOnce() -> Option<NetworkView6>,
    ) -> Result<Option<Learned6>, Refused6> {
        if msg.msg_type != MessageType::Reply {
            return Ok(None);
        }
        let unsolicited = Refused6::Unsolicited { xid: msg.xid };
        let open = self.ports.get_mut(&port);
        let at = open.as_ref().and_then(|o| {
            o.iter().position(|e| {
                e.xid == msg.xid
                    && msg.client_id.as_ref() == Some(&e.duid)
                    && e.open_at(now)
                    && (!e.solicit || msg.rapid_commit)
            })
        });
        let (Some(open), Some(at)) = (open, at) else {
            return Err(unsolicited);
        };
        if open[at].gives_up {
            // The server's answer to a RELEASE or DECLINE binds nothing.
            open.remove(at);
            return Ok(None);
        }
        // A failure status teaches nothing and closes nothing: a forged
        // one must not shut the exchange the real REPLY answers.
        if msg
            .status
            .as_ref()
            .is_some_and(|(s, _)| *s != Status::Success)
        {
            return Ok(None);
        }
        let asked = &open[at].iaids;
        let Some(ia) = msg
            .ia_na
            .iter()
            .find(|ia| asked.is_empty() || asked.contains(&ia.id))
        else {
            return Err(unsolicited);
        };
        if ia_status(ia).is_some_and(|s| s != Status::Success) {
            return Ok(None);
        }
        let Some((ip, valid)) = bound_address(ia) else {
            return Ok(None);
        };
        let view = view().ok_or(Refused6::UnknownNetwork)?;
        let server = msg
            .server_id
            .as_ref()
            .filter(|s| view.servers.contains_key(*s))
            .ok_or_else(|| Refused6::UnknownServer(msg.server_id.clone()))?;
        if !view.servers[server].sent(seen.src_ip, seen.src_mac) {
            return Err(Refused6::ServerSource {
                src_ip: seen.src_ip,
                src_mac: seen.src_mac,
            });
        }
        if !view.inside(ip) {
            return Err(Refused6::OutsidePrefix(ip));
        }
        if view.held.contains(&ip) {
            return Err(Refused6::AddressTaken(ip));
        }
        open.remove(at);
        if open.is_empty() {
            self.ports.remove(&port);
        }
        Ok(Some(Learned6::Bound {
            ip,
            valid_secs: (valid != xdhcp_engine::v6::lease::INFINITY).then_some(valid),
        }))
    }

    /// Forgets exchanges past their window, and ports with none left.
    pub fn prune(&mut self, now: Instant) {
        self.ports.retain(|_, open| {
            open.retain(|e| e.open_at(now));
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

/// The addresses an `IA_NA` names.
fn addresses(ia: &IANA) -> Vec<Ipv6Addr> {
    ia.opts
        .iter()
        .filter_map(|o| match o {
            DhcpOption::IAAddr(a) => Some(a.addr),
            _ => None,
        })
        .collect()
}

/// The `IA_NA`'s own Status Code, if it has one.
fn ia_status(ia: &IANA) -> Option<Status> {
    ia.opts.iter().find_map(|o| match o {
        DhcpOption::StatusCode(s) => Some(s.status),
        _ => None,
    })
}

/// The first usable address of the `IA_NA` with a non-zero valid
/// lifetime, and that lifetime.
fn bound_address(ia: &IANA) -> Option<(Ipv6Addr, u32)> {
    ia.opts.iter().find_map(|o| match o {
        DhcpOption::IAAddr(a) if a.valid_life != 0 && validate::is_usable(a.addr) => {
            Some((a.addr, a.valid_life))
        }
        _ => None,
    })
}

/// DHCPv6 messages of a guest (its DUID, one `IA_NA`) and of a server
/// for it, as the learning tests here and elsewhere play them.
#[cfg(test)]
pub(crate) mod messages {
    use dhcproto::v6::{DhcpOption, DhcpOptions, IAAddr, IANA, Message, MessageType};
    use dhcproto::{Encodable as _, Encoder};
    use std::net::Ipv6Addr;

    pub(crate) const GUEST_DUID: &[u8] = &[0, 1, 0, 1, 0x2c, 0, 0, 1, 2, 0, 0, 0, 0x30, 1];
    pub(crate) const IAID: u32 = 0x0a0b_0c0d;

    pub(crate) fn encode(m: &Message) -> Vec<u8> {
        let mut b = Vec::new();
        m.encode(&mut Encoder::new(&mut b)).unwrap();
        b
    }

    pub(crate) fn ia(addr: Option<Ipv6Addr>, valid: u32) -> DhcpOption {
        let mut ia = IANA {
            id: IAID,
            t1: 0,
            t2: 0,
            opts: DhcpOptions::default(),
        };
        if let Some(addr) = addr {
            ia.opts.insert(DhcpOption::IAAddr(IAAddr {
                addr,
                preferred_life: valid,
                valid_life: valid,
                opts: DhcpOptions::default(),
            }));
        }
        DhcpOption::IANA(ia)
    }

    /// A client message of the guest (its DUID, one `IA_NA`).
    pub(crate) fn client(t: MessageType, xid: u32, addr: Option<Ipv6Addr>) -> Vec<u8> {
        let mut m = Message::new_with_id(t, xid_bytes(xid));
        m.opts_mut()
            .insert(DhcpOption::ClientId(GUEST_DUID.to_vec()));
        m.opts_mut().insert(ia(addr, 0));
        encode(&m)
    }

    pub(crate) fn xid_bytes(xid: u32) -> [u8; 3] {
        let b = xid.to_be_bytes();
        [b[1], b[2], b[3]]
    }

    /// A REPLY for the guest's DUID, binding `addr`, from `server`.
    pub(crate) fn reply(xid: u32, addr: Ipv6Addr, server: &[u8]) -> Vec<u8> {
        reply_with(xid, addr, server, |_| {})
    }

    pub(crate) fn reply_with(
        xid: u32,
        addr: Ipv6Addr,
        server: &[u8],
        f: impl FnOnce(&mut Message),
    ) -> Vec<u8> {
        let mut m = Message::new_with_id(MessageType::Reply, xid_bytes(xid));
        m.opts_mut()
            .insert(DhcpOption::ClientId(GUEST_DUID.to_vec()));
        m.opts_mut().insert(DhcpOption::ServerId(server.to_vec()));
        m.opts_mut().insert(ia(Some(addr), 300));
        f(&mut m);
        encode(&m)
    }
}

#[cfg(test)]
mod tests {
    use dhcproto::v6::{DhcpOptions, IAAddr, Message, StatusCode};

    use super::messages::*;
    use super::*;

    const PORT: u32 = 9;
    const SERVER_DUID: &[u8] = &[0, 3, 0, 1, 2, 0, 0x5e, 0, 0x53, 1];
    const ROGUE_DUID: &[u8] = &[0, 3, 0, 1, 2, 0, 0x5e, 0, 0x53, 0x66];
    const SERVER_MAC: [u8; 6] = [2, 0, 0x5e, 0, 0x53, 1];
    const ATTACKER_MAC: [u8; 6] = [2, 0, 0x5e, 0, 0x53, 0x66];

    fn ip(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    fn view() -> NetworkView6 {
        let mut v = NetworkView6::default();
        // The VM's own one-shot lease and a neighbour's, from the server.
        v.served(SERVER_DUID, None, ip("fd00:6::110"), 64);
        v.served(SERVER_DUID, None, ip("fd00:6::150"), 64);
        v.held.insert(ip("fd00:6::150"));
        v
    }

    struct T {
        l: Learner6,
        t0: Instant,
        view: NetworkView6,
    }

    impl T {
        fn new() -> Self {
            Self {
                l: Learner6::default(),
                t0: Instant::now(),
                view: view(),
            }
        }

        fn at(&self, secs: u64) -> Instant {
            self.t0 + Duration::from_secs(secs)
        }

        fn guest_sends(&mut self, at: u64, payload: &[u8]) -> Result<Option<Learned6>, Refused6> {
            let seen = Seen6 {
                direction: Direction::FromGuest,
                src_mac: [2, 0, 0, 0, 0x30, 1],
                src_ip: ip("fe80::1"),
                payload,
            };
            self.l.observe(PORT, &seen, self.at(at), || {
                panic!("a client message needs no view")
            })
        }

        fn guest_gets_from(
            &mut self,
            at: u64,
            mac: [u8; 6],
            payload: &[u8],
        ) -> Result<Option<Learned6>, Refused6> {
            let seen = Seen6 {
                direction: Direction::ToGuest,
                src_mac: mac,
                src_ip: ip("fe80::53"),
                payload,
            };
            let view = self.view.clone();
            self.l.observe(PORT, &seen, self.at(at), || Some(view))
        }

        fn guest_gets(&mut self, at: u64, payload: &[u8]) -> Result<Option<Learned6>, Refused6> {
            self.guest_gets_from(at, SERVER_MAC, payload)
        }
    }

    fn bound(addr: &str) -> Learned6 {
        Learned6::Bound {
            ip: ip(addr),
            valid_secs: Some(300),
        }
    }

    #[test]
    fn the_reply_to_a_request_the_guest_sent_is_learned_once() {
        let mut t = T::new();
        let a = ip("fd00:6::1a0");
        assert_eq!(
            t.guest_sends(0, &client(MessageType::Request, 7, Some(a))),
            Ok(None)
        );
        assert_eq!(t.l.open_exchanges(), 1);
        assert_eq!(
            t.guest_gets(1, &reply(7, a, SERVER_DUID)),
            Ok(Some(bound("fd00:6::1a0")))
        );
        assert_eq!(t.l.open_exchanges(), 0, "the exchange is closed");
        // The same REPLY again answers nothing now.
        assert_eq!(
            t.guest_gets(1, &reply(7, a, SERVER_DUID)),
            Err(Refused6::Unsolicited { xid: 7 })
        );
    }

    #[test]
    fn renew_rebind_and_rapid_commit_solicit_open_exchanges_a_plain_solicit_does_not() {
        let a = ip("fd00:6::1a0");
        for t6 in [MessageType::Renew, MessageType::Rebind] {
            let mut t = T::new();
            t.guest_sends(0, &client(t6, 9, Some(a))).unwrap();
            assert_eq!(
                t.guest_gets(599, &reply(9, a, SERVER_DUID)),
                Ok(Some(bound("fd00:6::1a0")))
            );
        }
        let mut t = T::new();
        t.guest_sends(0, &client(MessageType::Solicit, 3, None))
            .unwrap();
        assert_eq!(
            t.l.open_exchanges(),
            0,
            "no Rapid Commit: an ADVERTISE follows"
        );
        let mut m = Message::new_with_id(MessageType::Solicit, xid_bytes(4));
        m.opts_mut()
            .insert(DhcpOption::ClientId(GUEST_DUID.to_vec()));
        m.opts_mut().insert(DhcpOption::RapidCommit);
        m.opts_mut().insert(ia(None, 0));
        t.guest_sends(0, &encode(&m)).unwrap();
        // A REPLY to a SOLICIT without Rapid Commit is not an answer.
        assert_eq!(
            t.guest_gets(1, &reply(4, a, SERVER_DUID)),
            Err(Refused6::Unsolicited { xid: 4 })
        );
        let rc = reply_with(4, a, SERVER_DUID, |m| {
            m.opts_mut().insert(DhcpOption::RapidCommit);
        });
        assert_eq!(t.guest_gets(2, &rc), Ok(Some(bound("fd00:6::1a0"))));
    }

    #[test]
    fn a_forged_reply_with_no_client_message_is_refused() {
        let mut t = T::new();
        assert_eq!(
            t.guest_gets(0, &reply(0x0bad, ip("fd00:6::66"), SERVER_DUID)),
            Err(Refused6::Unsolicited { xid: 0x0bad })
        );
    }

    #[test]
    fn a_reply_for_another_xid_or_duid_or_iaid_is_refused() {
        let mut t = T::new();
        let a = ip("fd00:6::1a0");
        t.guest_sends(0, &client(MessageType::Request, 7, Some(a)))
            .unwrap();
        assert_eq!(
            t.guest_gets(1, &reply(8, a, SERVER_DUID)),
            Err(Refused6::Unsolicited { xid: 8 })
        );
        let other_duid = reply_with(7, a, SERVER_DUID, |m| {
            m.opts_mut().remove(dhcproto::v6::OptionCode::ClientId);
            m.opts_mut()
                .insert(DhcpOption::ClientId(vec![0, 3, 0, 1, 2, 0, 0, 0, 0, 9]));
        });
        assert_eq!(
            t.guest_gets(1, &other_duid),
            Err(Refused6::Unsolicited { xid: 7 })
        );
        let other_ia = reply_with(7, a, SERVER_DUID, |m| {
            let mut ia6 = IANA {
                id: IAID + 1,
                t1: 0,
                t2: 0,
                opts: DhcpOptions::default(),
            };
            ia6.opts.insert(DhcpOption::IAAddr(IAAddr {
                addr: a,
                preferred_life: 300,
                valid_life: 300,
                opts: DhcpOptions::default(),
            }));
            m.opts_mut().remove(dhcproto::v6::OptionCode::IANA);
            m.opts_mut().insert(DhcpOption::IANA(ia6));
        });
        assert_eq!(
            t.guest_gets(1, &other_ia),
            Err(Refused6::Unsolicited { xid: 7 })
        );
        // None of them closed the exchange: the real REPLY is learned.
        assert_eq!(
            t.guest_gets(2, &reply(7, a, SERVER_DUID)),
            Ok(Some(bound("fd00:6::1a0")))
        );
    }

    #[test]
    fn a_reply_past_the_retransmission_window_is_refused() {
        let mut t = T::new();
        let a = ip("fd00:6::1a0");
        // REQUEST: REQ_MAX_RT 30 s, plus 10 %.
        t.guest_sends(0, &client(MessageType::Request, 7, Some(a)))
            .unwrap();
        assert_eq!(
            t.guest_gets(34, &reply(7, a, SERVER_DUID)),
            Err(Refused6::Unsolicited { xid: 7 })
        );
        // A retransmission opens the window again.
        t.guest_sends(40, &client(MessageType::Request, 7, Some(a)))
            .unwrap();
        assert_eq!(
            t.guest_gets(73, &reply(7, a, SERVER_DUID)),
            Ok(Some(bound("fd00:6::1a0")))
        );
        t.l.prune(t.at(1000));
        assert_eq!(t.l.open_exchanges(), 0);
    }

    #[test]
    fn a_reply_from_a_server_never_seen_for_the_network_is_refused() {
        let mut t = T::new();
        let a = ip("fd00:6::1a0");
        t.guest_sends(0, &client(MessageType::Request, 7, Some(a)))
            .unwrap();
        assert_eq!(
            t.guest_gets(1, &reply(7, a, ROGUE_DUID)),
            Err(Refused6::UnknownServer(Some(ROGUE_DUID.to_vec())))
        );
        assert_eq!(
            t.guest_gets(2, &reply(7, a, SERVER_DUID)),
            Ok(Some(bound("fd00:6::1a0")))
        );
    }

    /// The view of a network whose lease saw the server's REPLY come from
    /// `fe80::53` at [`SERVER_MAC`] (`mac` false: from a socket, no MAC).
    fn view_with_sender(mac: bool) -> NetworkView6 {
        let mut v = NetworkView6::default();
        let from = Source::new(ip("fe80::53"), mac.then_some(SERVER_MAC));
        v.served(SERVER_DUID, Some(from), ip("fd00:6::110"), 64);
        v
    }

    #[test]
    fn a_reply_with_the_servers_duid_from_another_link_layer_source_is_refused() {
        let mut t = T::new();
        t.view = view_with_sender(true);
        let a = ip("fd00:6::1a0");
        t.guest_sends(0, &client(MessageType::Request, 7, Some(a)))
            .unwrap();
        // The server's DUID and IPv6 source, another host's MAC.
        assert_eq!(
            t.guest_gets_from(1, ATTACKER_MAC, &reply(7, a, SERVER_DUID)),
            Err(Refused6::ServerSource {
                src_ip: ip("fe80::53"),
                src_mac: ATTACKER_MAC
            })
        );
        // The refusal closed nothing: the server's own REPLY is learned.
        assert_eq!(
            t.guest_gets(2, &reply(7, a, SERVER_DUID)),
            Ok(Some(bound("fd00:6::1a0")))
        );
        assert_eq!(
            Refused6::ServerSource {
                src_ip: ip("fe80::53"),
                src_mac: ATTACKER_MAC
            }
            .label(),
            "server_source"
        );
    }

    #[test]
    fn a_reply_with_the_servers_duid_from_another_ipv6_source_is_refused() {
        for mac in [true, false] {
            let mut t = T::new();
            t.view = view_with_sender(mac);
            let a = ip("fd00:6::1a0");
            t.guest_sends(0, &client(MessageType::Request, 7, Some(a)))
                .unwrap();
            // The server's DUID and even its MAC, from another address.
            let seen = Seen6 {
                direction: Direction::ToGuest,
                src_mac: SERVER_MAC,
                src_ip: ip("fe80::6666"),
                payload: &reply(7, a, SERVER_DUID),
            };
            let view = t.view.clone();
            assert_eq!(
                t.l.observe(PORT, &seen, t.at(1), || Some(view)),
                Err(Refused6::ServerSource {
                    src_ip: ip("fe80::6666"),
                    src_mac: SERVER_MAC
                }),
                "MAC known: {mac}"
            );
            assert_eq!(
                t.guest_gets(2, &reply(7, a, SERVER_DUID)),
                Ok(Some(bound("fd00:6::1a0"))),
                "MAC known: {mac}"
            );
        }
    }

    /// Relayed: the network's leases saw the server's REPLYs come from the
    /// relay agent's address on the link; the guest's come from there too,
    /// and a host on the link that is not the relay is refused.
    #[test]
    fn a_relayed_reply_comes_from_the_relay_agent_the_leases_saw() {
        let relay = ip("fe80::1");
        let relay_mac = [2, 0, 0x5e, 0, 0x53, 0xfe];
        let mut t = T::new();
        t.view = NetworkView6::default();
        t.view.served(
            SERVER_DUID,
            Some(Source::new(relay, Some(relay_mac))),
            ip("fd00:6::110"),
            64,
        );
        let a = ip("fd00:6::1a0");
        t.guest_sends(0, &client(MessageType::Request, 7, Some(a)))
            .unwrap();
        let seen = |l: &mut Learner6, src_ip, src_mac, view: &NetworkView6| {
            let s = Seen6 {
                direction: Direction::ToGuest,
                src_mac,
                src_ip,
                payload: &reply(7, a, SERVER_DUID),
            };
            let view = view.clone();
            l.observe(PORT, &s, t.t0 + Duration::from_secs(1), || Some(view))
        };
        for (src_ip, src_mac) in [
            (ip("fe80::53"), ATTACKER_MAC),
            // The relay's MAC, not its address.
            (ip("fe80::53"), relay_mac),
        ] {
            assert_eq!(
                seen(&mut t.l, src_ip, src_mac, &t.view),
                Err(Refused6::ServerSource { src_ip, src_mac })
            );
        }
        assert_eq!(
            seen(&mut t.l, relay, relay_mac, &t.view),
            Ok(Some(bound("fd00:6::1a0")))
        );
    }

    /// Leases that know no source (recorded before it was kept) check
    /// none: any source passes, as before; one that knows the IPv6 source
    /// only (read from a socket) checks that alone.
    #[test]
    fn unknown_sources_are_not_checked() {
        let a = ip("fd00:6::1a0");
        // `view()`: served with no source at all.
        let mut t = T::new();
        t.guest_sends(0, &client(MessageType::Request, 7, Some(a)))
            .unwrap();
        assert_eq!(
            t.guest_gets_from(1, ATTACKER_MAC, &reply(7, a, SERVER_DUID)),
            Ok(Some(bound("fd00:6::1a0")))
        );
        // The IPv6 source known, not the MAC: any MAC from it passes.
        let mut t = T::new();
        t.view = view_with_sender(false);
        t.guest_sends(0, &client(MessageType::Request, 7, Some(a)))
            .unwrap();
        assert_eq!(
            t.guest_gets_from(1, ATTACKER_MAC, &reply(7, a, SERVER_DUID)),
            Ok(Some(bound("fd00:6::1a0")))
        );
    }

    #[test]
    fn an_address_outside_the_prefix_or_held_by_another_binding_is_refused() {
        let mut t = T::new();
        t.guest_sends(0, &client(MessageType::Request, 7, None))
            .unwrap();
        let outside = ip("fd00:7::1");
        assert_eq!(
            t.guest_gets(1, &reply(7, outside, SERVER_DUID)),
            Err(Refused6::OutsidePrefix(outside))
        );
        let held = ip("fd00:6::150");
        assert_eq!(
            t.guest_gets(1, &reply(7, held, SERVER_DUID)),
            Err(Refused6::AddressTaken(held))
        );
        // A link-local or multicast address is never bound.
        assert_eq!(
            t.guest_gets(1, &reply(7, ip("fe80::5"), SERVER_DUID)),
            Ok(None)
        );
    }

    #[test]
    fn a_port_of_no_known_network_learns_nothing() {
        let mut t = T::new();
        let a = ip("fd00:6::1a0");
        t.guest_sends(0, &client(MessageType::Request, 7, Some(a)))
            .unwrap();
        let seen = Seen6 {
            direction: Direction::ToGuest,
            src_mac: SERVER_MAC,
            src_ip: ip("fe80::53"),
            payload: &reply(7, a, SERVER_DUID),
        };
        assert_eq!(
            t.l.observe(PORT, &seen, t.t0, || None),
            Err(Refused6::UnknownNetwork)
        );
    }

    #[test]
    fn a_failure_status_teaches_nothing_and_closes_nothing() {
        let mut t = T::new();
        let a = ip("fd00:6::1a0");
        t.guest_sends(0, &client(MessageType::Request, 7, Some(a)))
            .unwrap();
        let fail = reply_with(7, a, SERVER_DUID, |m| {
            m.opts_mut().insert(DhcpOption::StatusCode(StatusCode {
                status: Status::UnspecFail,
                msg: "no".into(),
            }));
        });
        assert_eq!(t.guest_gets(1, &fail), Ok(None));
        let mut m = Message::new_with_id(MessageType::Reply, xid_bytes(7));
        m.opts_mut()
            .insert(DhcpOption::ClientId(GUEST_DUID.to_vec()));
        m.opts_mut()
            .insert(DhcpOption::ServerId(SERVER_DUID.to_vec()));
        let mut none = IANA {
            id: IAID,
            t1: 0,
            t2: 0,
            opts: DhcpOptions::default(),
        };
        none.opts.insert(DhcpOption::StatusCode(StatusCode {
            status: Status::NoAddrsAvail,
            msg: String::new(),
        }));
        m.opts_mut().insert(DhcpOption::IANA(none));
        assert_eq!(t.guest_gets(1, &encode(&m)), Ok(None));
        assert_eq!(t.l.open_exchanges(), 1);
        assert_eq!(
            t.guest_gets(2, &reply(7, a, SERVER_DUID)),
            Ok(Some(bound("fd00:6::1a0")))
        );
    }

    #[test]
    fn release_and_decline_give_the_address_up_and_their_reply_binds_nothing() {
        let mut t = T::new();
        let a = ip("fd00:6::1a0");
        for t6 in [MessageType::Release, MessageType::Decline] {
            assert_eq!(
                t.guest_sends(0, &client(t6, 11, Some(a))),
                Ok(Some(Learned6::GivenUp {
                    ips: vec![a],
                    declined: t6 == MessageType::Decline
                }))
            );
            // The server's REPLY to it (Success, the address named with
            // lifetimes 0 or none) is expected, not a forgery.
            assert_eq!(t.guest_gets(1, &reply(11, a, SERVER_DUID)), Ok(None));
            assert_eq!(t.l.open_exchanges(), 0);
        }
    }

    #[test]
    fn malformed_messages_are_refused_never_a_panic() {
        let mut t = T::new();
        for junk in [
            &[][..],
            &[3],
            &[3, 0, 0, 7, 0, 1, 0, 200],
            &[7, 0, 0, 7, 0, 13, 0, 1, 0],
            &[12, 0, 0, 0],
        ] {
            assert!(
                matches!(t.guest_sends(0, junk), Err(Refused6::Decode(_))),
                "{junk:?}"
            );
            assert!(
                matches!(t.guest_gets(0, junk), Err(Refused6::Decode(_))),
                "{junk:?}"
            );
        }
        // An ADVERTISE teaches nothing.
        let mut m = Message::new_with_id(MessageType::Advertise, xid_bytes(7));
        m.opts_mut()
            .insert(DhcpOption::ServerId(SERVER_DUID.to_vec()));
        assert_eq!(t.guest_gets(0, &encode(&m)), Ok(None));
    }

    #[test]
    fn a_guests_own_global_address_is_learned_from_its_probe() {
        let v = view();
        let none = BTreeSet::new();
        let a = ip("fd00:6::5054:ff:fe00:3001");
        assert_eq!(
            dad(a, Some(&v), &none, &none),
            Ok(Some(Learned6::Configured { ip: a }))
        );
        // Link-local, multicast and unspecified addresses teach nothing;
        // nor does an address the guest already holds or configured.
        for nothing in [ip("fe80::1"), ip("ff02::1"), Ipv6Addr::UNSPECIFIED] {
            assert_eq!(dad(nothing, Some(&v), &none, &none), Ok(None), "{nothing}");
        }
        let own: BTreeSet<_> = [a].into();
        assert_eq!(dad(a, Some(&v), &own, &none), Ok(None));
        assert_eq!(dad(a, Some(&v), &none, &own), Ok(None));
        assert_eq!(dad(a, None, &none, &none), Err(Refused6::UnknownNetwork));
    }

    #[test]
    fn a_probe_for_another_workloads_or_an_outside_address_is_refused() {
        let v = view();
        let none = BTreeSet::new();
        let neighbour = ip("fd00:6::150");
        assert_eq!(
            dad(neighbour, Some(&v), &none, &none),
            Err(Refused6::AddressTaken(neighbour))
        );
        let outside = ip("2001:db8::1");
        assert_eq!(
            dad(outside, Some(&v), &none, &none),
            Err(Refused6::OutsidePrefix(outside))
        );
    }

    #[test]
    fn a_guest_announcing_address_after_address_holds_a_bounded_few() {
        let v = view();
        let none = BTreeSet::new();
        let mut configured = BTreeSet::new();
        let mut refused = 0;
        for i in 0..100u16 {
            let a = Ipv6Addr::new(0xfd00, 6, 0, 0, 0, 0, 0xa, i);
            match dad(a, Some(&v), &none, &configured) {
                Ok(Some(Learned6::Configured { ip })) => {
                    configured.insert(ip);
                }
                Err(Refused6::TooMany(ip)) => {
                    assert_eq!(ip, a);
                    refused += 1;
                }
                other => panic!("{a}: {other:?}"),
            }
        }
        assert_eq!(configured.len(), DAD_PER_PORT);
        assert_eq!(refused, 100 - DAD_PER_PORT);
    }

    #[test]
    fn open_exchanges_are_bounded_per_port() {
        let mut t = T::new();
        for xid in 0..20 {
            t.guest_sends(0, &client(MessageType::Request, xid, None))
                .unwrap();
        }
        assert_eq!(t.l.open_exchanges(), EXCHANGES_PER_PORT);
        t.l.forget(PORT);
        assert_eq!(t.l.open_exchanges(), 0);
    }
}
