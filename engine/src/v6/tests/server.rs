//! A scriptable `DHCPv6` server and a harness driving the client in virtual
//! time. Server messages are built with dhcproto, like the client's.

use std::net::Ipv6Addr;
use std::time::{Duration, Instant};

use dhcproto::v6::{
    DhcpOption, DhcpOptions, IAAddr, IANA, Message, MessageType, OptionCode, Status, StatusCode,
    UnknownOption,
};
use dhcproto::{Decodable, Decoder, Encodable, Encoder};

use crate::v6::{Client, ClientConfig, DropReason, Event, Timeouts, Transmit};

pub const MAC: [u8; 6] = [0x02, 0x00, 0x5e, 0x10, 0x20, 0x30];
pub const ADDR: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x100);
pub const ADDR2: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x200);
pub const DNS: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x53);
pub const SRC: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);
/// Lease times every test server hands out unless told otherwise.
pub const T1: u32 = 1000;
pub const T2: u32 = 1600;
pub const PREFERRED: u32 = 2000;
pub const VALID: u32 = 3000;
pub const WALL0: u64 = 1_800_000_000_000;

/// `DUID-LL` of test server `n`.
pub fn server_duid(n: u8) -> Vec<u8> {
    vec![0, 3, 0, 1, 0x02, 0, 0, 0, 0xee, n]
}

/// The client's `DUID-LL` for [`MAC`].
pub fn client_duid() -> Vec<u8> {
    let mut v = vec![0, 3, 0, 1];
    v.extend_from_slice(&MAC);
    v
}

pub fn cfg() -> ClientConfig {
    ClientConfig {
        mac: MAC,
        timeouts: Timeouts {
            sol_max_delay: Duration::ZERO,
            ..Timeouts::default()
        },
        acquire_timeout: None,
        ..ClientConfig::default()
    }
}

pub fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

pub fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

/// A client message, decoded.
#[derive(Debug)]
pub struct Sent {
    pub msg: Message,
}

impl Sent {
    pub fn decode(t: &Transmit) -> Sent {
        Sent {
            msg: Message::decode(&mut Decoder::new(&t.payload)).expect("client message decodes"),
        }
    }
    pub fn ty(&self) -> MessageType {
        self.msg.msg_type()
    }
    pub fn client_id(&self) -> Option<&[u8]> {
        match self.msg.opts().get(OptionCode::ClientId) {
            Some(DhcpOption::ClientId(v)) => Some(v),
            _ => None,
        }
    }
    pub fn server_id(&self) -> Option<&[u8]> {
        match self.msg.opts().get(OptionCode::ServerId) {
            Some(DhcpOption::ServerId(v)) => Some(v),
            _ => None,
        }
    }
    pub fn elapsed(&self) -> Option<u16> {
        match self.msg.opts().get(OptionCode::ElapsedTime) {
            Some(DhcpOption::ElapsedTime(v)) => Some(*v),
            _ => None,
        }
    }
    pub fn ia(&self) -> &IANA {
        match self.msg.opts().get(OptionCode::IANA) {
            Some(DhcpOption::IANA(ia)) => ia,
            other => panic!("no IA_NA: {other:?}"),
        }
    }
    pub fn ia_addresses(&self) -> Vec<Ipv6Addr> {
        self.ia()
            .opts
            .iter()
            .filter_map(|o| match o {
                DhcpOption::IAAddr(a) => Some(a.addr),
                _ => None,
            })
            .collect()
    }
    pub fn oro(&self) -> Vec<u16> {
        match self.msg.opts().get(OptionCode::ORO) {
            Some(DhcpOption::ORO(o)) => o.opts.iter().map(|c| u16::from(*c)).collect(),
            _ => Vec::new(),
        }
    }
    pub fn rapid_commit(&self) -> bool {
        self.msg.opts().get(OptionCode::RapidCommit).is_some()
    }
}

/// A server message under construction.
#[derive(Debug, Clone)]
pub struct Msg {
    pub ty: MessageType,
    pub xid: u32,
    pub client_id: Option<Vec<u8>>,
    pub server_id: Option<Vec<u8>>,
    pub preference: Option<u8>,
    pub status: Option<Status>,
    pub rapid_commit: bool,
    pub unicast: Option<Ipv6Addr>,
    pub sol_max_rt: Option<u32>,
    /// `None`: no `IA_NA` at all.
    pub ia: Option<Ia>,
}

#[derive(Debug, Clone)]
pub struct Ia {
    pub iaid: u32,
    pub t1: u32,
    pub t2: u32,
    pub status: Option<Status>,
    /// (address, preferred, valid)
    pub addrs: Vec<(Ipv6Addr, u32, u32)>,
}

impl Msg {
    fn to(t: &Transmit, ty: MessageType, server: u8) -> Msg {
        let sent = Sent::decode(t);
        Msg {
            ty,
            xid: t.xid,
            client_id: sent.client_id().map(<[u8]>::to_vec),
            server_id: Some(server_duid(server)),
            preference: None,
            status: None,
            rapid_commit: false,
            unicast: None,
            sol_max_rt: None,
            ia: Some(Ia {
                iaid: sent.ia().id,
                t1: T1,
                t2: T2,
                status: None,
                addrs: vec![(ADDR, PREFERRED, VALID)],
            }),
        }
    }

    /// ADVERTISE from server `server` offering [`ADDR`].
    pub fn advertise(t: &Transmit, server: u8) -> Msg {
        Msg::to(t, MessageType::Advertise, server)
    }

    /// REPLY from server `server` assigning [`ADDR`] (or the address asked
    /// for, if any).
    pub fn reply(t: &Transmit, server: u8) -> Msg {
        let mut m = Msg::to(t, MessageType::Reply, server);
        if let (Some(ia), Some(asked)) = (&mut m.ia, Sent::decode(t).ia_addresses().first()) {
            ia.addrs = vec![(*asked, PREFERRED, VALID)];
        }
        m
    }

    pub fn pref(mut self, p: u8) -> Msg {
        self.preference = Some(p);
        self
    }
    pub fn status(mut self, s: Status) -> Msg {
        self.status = Some(s);
        self
    }
    pub fn ia_status(mut self, s: Status) -> Msg {
        let ia = self.ia.as_mut().expect("IA");
        ia.status = Some(s);
        ia.addrs.clear();
        self
    }
    pub fn no_ia(mut self) -> Msg {
        self.ia = None;
        self
    }
    pub fn addr(mut self, a: Ipv6Addr, preferred: u32, valid: u32) -> Msg {
        self.ia.as_mut().expect("IA").addrs = vec![(a, preferred, valid)];
        self
    }
    pub fn times(mut self, t1: u32, t2: u32) -> Msg {
        let ia = self.ia.as_mut().expect("IA");
        ia.t1 = t1;
        ia.t2 = t2;
        self
    }
    pub fn rapid(mut self) -> Msg {
        self.rapid_commit = true;
        self
    }
    pub fn unicast(mut self, a: Ipv6Addr) -> Msg {
        self.unicast = Some(a);
        self
    }

    pub fn bytes(&self) -> Vec<u8> {
        let mut m = Message::new_with_id(self.ty, [0; 3]);
        m.set_xid_num(self.xid);
        let mut o = DhcpOptions::new();
        if let Some(id) = &self.client_id {
            o.insert(DhcpOption::ClientId(id.clone()));
        }
        if let Some(id) = &self.server_id {
            o.insert(DhcpOption::ServerId(id.clone()));
        }
        if let Some(p) = self.preference {
            o.insert(DhcpOption::Preference(p));
        }
        if let Some(s) = self.status {
            o.insert(DhcpOption::StatusCode(StatusCode {
                status: s,
                msg: "test".into(),
            }));
        }
        if self.rapid_commit {
            o.insert(DhcpOption::RapidCommit);
        }
        if let Some(a) = self.unicast {
            o.insert(DhcpOption::ServerUnicast(a));
        }
        if let Some(v) = self.sol_max_rt {
            o.insert(DhcpOption::Unknown(UnknownOption::new(
                OptionCode::from(82u16),
                v.to_be_bytes().to_vec(),
            )));
        }
        o.insert(DhcpOption::DomainNameServers(vec![DNS]));
        if let Some(ia) = &self.ia {
            let mut io = DhcpOptions::new();
            for (addr, p, v) in &ia.addrs {
                io.insert(DhcpOption::IAAddr(IAAddr {
                    addr: *addr,
                    preferred_life: *p,
                    valid_life: *v,
                    opts: DhcpOptions::new(),
                }));
            }
            if let Some(s) = ia.status {
                io.insert(DhcpOption::StatusCode(StatusCode {
                    status: s,
                    msg: String::new(),
                }));
            }
            o.insert(DhcpOption::IANA(IANA {
                id: ia.iaid,
                t1: ia.t1,
                t2: ia.t2,
                opts: io,
            }));
        }
        m.set_opts(o);
        let mut buf = Vec::new();
        m.encode(&mut Encoder::new(&mut buf)).expect("encodes");
        buf
    }
}

/// The client in virtual time.
pub struct H {
    pub c: Client,
    pub t0: Instant,
    pub now: Instant,
}

impl H {
    pub fn new(cfg: ClientConfig) -> H {
        H::seeded(cfg, 7)
    }

    pub fn seeded(cfg: ClientConfig, seed: u64) -> H {
        let t0 = Instant::now();
        let mut c = Client::new(cfg, t0, seed);
        c.set_wall_clock_unix_ms(WALL0);
        c.handle_timeout(t0);
        H { c, t0, now: t0 }
    }

    pub fn tx(&mut self) -> Vec<Transmit> {
        std::iter::from_fn(|| self.c.poll_transmit()).collect()
    }

    /// Exactly one queued transmission.
    pub fn one(&mut self) -> Transmit {
        let v = self.tx();
        assert_eq!(v.len(), 1, "{v:?}");
        v.into_iter().next().unwrap()
    }

    pub fn ev(&mut self) -> Vec<Event> {
        std::iter::from_fn(|| self.c.poll_event()).collect()
    }

    pub fn feed(&mut self, m: &Msg) -> Result<(), DropReason> {
        self.c.handle_packet(self.now, SRC, &m.bytes())
    }

    pub fn feed_bytes(&mut self, b: &[u8]) -> Result<(), DropReason> {
        self.c.handle_packet(self.now, SRC, b)
    }

    /// Advance by `d`, firing timers on the way.
    pub fn advance(&mut self, d: Duration) {
        let end = self.now + d;
        while let Some(t) = self.c.poll_timeout() {
            if t > end {
                break;
            }
            self.now = self.now.max(t);
            self.c.handle_timeout(self.now);
        }
        self.now = end;
        self.c.handle_timeout(end);
    }

    /// Go to the next timer and fire it; return the time it fired at
    /// (relative to `t0`).
    pub fn fire(&mut self) -> Duration {
        let t = self.c.poll_timeout().expect("a timer is set");
        self.now = self.now.max(t);
        self.c.handle_timeout(self.now);
        self.now - self.t0
    }

    /// Fire timers until a message goes out; return it and when.
    pub fn next_tx(&mut self) -> (Duration, Transmit) {
        for _ in 0..64 {
            let at = self.fire();
            let mut v = self.tx();
            if let Some(t) = v.pop() {
                assert!(v.is_empty(), "{v:?}");
                return (at, t);
            }
        }
        panic!("no transmission after 64 timers");
    }

    /// Reach BOUND through SOLICIT/ADVERTISE/REQUEST/REPLY from server
    /// `server`; return the REQUEST's transmission time.
    pub fn bind(&mut self, server: u8) -> Instant {
        let sol = self.one();
        self.feed(&Msg::advertise(&sol, server).pref(255)).unwrap();
        let req = self.one();
        let sent_at = self.now;
        self.feed(&Msg::reply(&req, server)).unwrap();
        let ev = self.ev();
        assert!(matches!(ev.as_slice(), [Event::Bound(_)]), "{ev:?}");
        sent_at
    }
}
