//! A small DHCP server for tests: answers the client's own messages with
//! `dhcproto`-encoded replies, plus raw builders for malformed ones.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use dhcproto::v4::{DhcpOption, Message, MessageType, Opcode, OptionCode};
use dhcproto::{Decodable, Decoder, Encodable, Encoder};

use crate::{Client, ClientConfig, Event, Lease, PacketSource, State, Transmit};

pub const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
pub const SERVER_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
pub const SERVER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xfe];
pub const OTHER_SERVER_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);
pub const OTHER_SERVER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xfd];
pub const ADDR: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);
pub const WALL0: u64 = 1_800_000_000_000;

/// A decoded client message.
pub struct Request {
    pub msg: Message,
}

impl Request {
    pub fn decode(t: &Transmit) -> Request {
        Request {
            msg: Message::decode(&mut Decoder::new(&t.payload)).expect("client sent undecodable"),
        }
    }
    pub fn msg_type(&self) -> MessageType {
        self.msg.opts().msg_type().expect("no message type")
    }
    pub fn opt(&self, code: u8) -> Option<&DhcpOption> {
        self.msg.opts().get(OptionCode::from(code))
    }
    pub fn requested_ip(&self) -> Option<Ipv4Addr> {
        match self.opt(50) {
            Some(DhcpOption::RequestedIpAddress(ip)) => Some(*ip),
            _ => None,
        }
    }
    pub fn server_id(&self) -> Option<Ipv4Addr> {
        match self.opt(54) {
            Some(DhcpOption::ServerIdentifier(ip)) => Some(*ip),
            _ => None,
        }
    }
}

/// Reply parameters.
#[derive(Debug, Clone)]
pub struct Server {
    pub ip: Ipv4Addr,
    pub mac: [u8; 6],
    pub lease_secs: Option<u32>,
    pub t1: Option<u32>,
    pub t2: Option<u32>,
    pub mask: Option<Ipv4Addr>,
    pub routers: Vec<Ipv4Addr>,
    pub dns: Vec<Ipv4Addr>,
    /// Raw options appended after the encoded ones (code, payload; split
    /// into 255-byte instances when longer).
    pub extra: Vec<(u8, Vec<u8>)>,
}

impl Default for Server {
    fn default() -> Self {
        Server {
            ip: SERVER_IP,
            mac: SERVER_MAC,
            lease_secs: Some(3600),
            t1: None,
            t2: None,
            mask: Some(Ipv4Addr::new(255, 255, 255, 0)),
            routers: vec![SERVER_IP],
            dns: vec![Ipv4Addr::new(192, 0, 2, 53)],
            extra: Vec::new(),
        }
    }
}

pub fn raw_opts(opts: &[(u8, &[u8])]) -> Vec<u8> {
    let mut v = Vec::new();
    for (code, data) in opts {
        v.push(*code);
        v.push(data.len() as u8);
        v.extend_from_slice(data);
    }
    v
}

/// A BOOTREPLY built byte by byte: header, cookie, then `options` verbatim
/// (the caller adds END), with `sname`/`file` contents.
pub fn raw_reply(xid: u32, yiaddr: Ipv4Addr, options: &[u8], sname: &[u8], file: &[u8]) -> Vec<u8> {
    let mut p = vec![0u8; 240];
    p[0] = 2;
    p[1] = 1;
    p[2] = 6;
    p[4..8].copy_from_slice(&xid.to_be_bytes());
    p[16..20].copy_from_slice(&yiaddr.octets());
    p[28..34].copy_from_slice(&CLIENT_MAC);
    p[44..44 + sname.len()].copy_from_slice(sname);
    p[108..108 + file.len()].copy_from_slice(file);
    p[236..240].copy_from_slice(&crate::validate::MAGIC_COOKIE);
    p.extend_from_slice(options);
    p
}

impl Server {
    pub fn src(&self) -> PacketSource {
        PacketSource {
            src_mac: self.mac,
            src_ip: self.ip,
        }
    }

    pub fn reply(&self, req: &Transmit, ty: MessageType, yiaddr: Ipv4Addr) -> Vec<u8> {
        let r = Request::decode(req);
        let mut m = Message::new_with_id(
            r.msg.xid(),
            Ipv4Addr::UNSPECIFIED,
            yiaddr,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            r.msg.chaddr(),
        );
        m.set_opcode(Opcode::BootReply);
        let o = m.opts_mut();
        o.insert(DhcpOption::MessageType(ty));
        o.insert(DhcpOption::ServerIdentifier(self.ip));
        if ty != MessageType::Nak {
            if let Some(l) = self.lease_secs {
                o.insert(DhcpOption::AddressLeaseTime(l));
            }
            if let Some(t) = self.t1 {
                o.insert(DhcpOption::Renewal(t));
            }
            if let Some(t) = self.t2 {
                o.insert(DhcpOption::Rebinding(t));
            }
            if let Some(mask) = self.mask {
                o.insert(DhcpOption::SubnetMask(mask));
            }
            if !self.routers.is_empty() {
                o.insert(DhcpOption::Router(self.routers.clone()));
            }
            if !self.dns.is_empty() {
                o.insert(DhcpOption::DomainNameServer(self.dns.clone()));
            }
        }
        let mut buf = Vec::new();
        m.encode(&mut Encoder::new(&mut buf)).unwrap();
        assert_eq!(buf.pop(), Some(255));
        for (code, data) in &self.extra {
            if data.is_empty() {
                buf.extend_from_slice(&[*code, 0]);
            }
            for chunk in data.chunks(255) {
                buf.push(*code);
                buf.push(chunk.len() as u8);
                buf.extend_from_slice(chunk);
            }
        }
        buf.push(255);
        buf
    }

    pub fn offer(&self, req: &Transmit) -> Vec<u8> {
        self.reply(req, MessageType::Offer, ADDR)
    }
    pub fn ack(&self, req: &Transmit) -> Vec<u8> {
        self.reply(req, MessageType::Ack, ADDR)
    }
    pub fn nak(&self, req: &Transmit, text: Option<&str>) -> Vec<u8> {
        let mut s = self.clone();
        if let Some(t) = text {
            s.extra.push((56, t.as_bytes().to_vec()));
        }
        s.reply(req, MessageType::Nak, Ipv4Addr::UNSPECIFIED)
    }
}

/// Drives a client in virtual time.
pub struct H {
    pub c: Client,
    pub t0: Instant,
    pub now: Instant,
    pub srv: Server,
}

/// The default configuration but with T1 unfuzzed, so tests can name the
/// exact instant of each renewal (the fuzz has its own tests).
pub fn cfg() -> ClientConfig {
    let mut c = ClientConfig {
        chaddr: CLIENT_MAC,
        hostname: Some("pod-a".into()),
        ..ClientConfig::default()
    };
    c.retransmit.renew_fuzz_permille = 0;
    c
}

impl H {
    pub fn new(cfg: ClientConfig) -> H {
        H::with_seed(cfg, 1)
    }

    pub fn with_seed(cfg: ClientConfig, seed: u64) -> H {
        let t0 = Instant::now();
        let mut c = Client::new(cfg, t0, seed);
        c.set_wall_clock_unix_ms(WALL0);
        H {
            c,
            t0,
            now: t0,
            srv: Server::default(),
        }
    }

    pub fn wall(&self) -> u64 {
        WALL0 + (self.now - self.t0).as_millis() as u64
    }

    pub fn elapsed(&self) -> Duration {
        self.now - self.t0
    }

    pub fn tx(&mut self) -> Vec<Transmit> {
        std::iter::from_fn(|| self.c.poll_transmit()).collect()
    }

    pub fn one_tx(&mut self) -> Transmit {
        let mut v = self.tx();
        assert_eq!(v.len(), 1, "expected exactly one transmit, got {v:?}");
        v.remove(0)
    }

    pub fn ev(&mut self) -> Vec<Event> {
        std::iter::from_fn(|| self.c.poll_event()).collect()
    }

    pub fn feed_from(&mut self, src: PacketSource, bytes: &[u8]) -> Result<(), crate::DropReason> {
        let w = self.wall();
        self.c.set_wall_clock_unix_ms(w);
        self.c.handle_packet(self.now, src, bytes)
    }

    pub fn feed(&mut self, bytes: &[u8]) -> Result<(), crate::DropReason> {
        let src = self.srv.src();
        self.feed_from(src, bytes)
    }

    pub fn advance(&mut self, d: Duration) {
        self.now += d;
        let w = self.wall();
        self.c.set_wall_clock_unix_ms(w);
        self.c.handle_timeout(self.now);
    }

    /// Jump to the next timer and fire it.
    pub fn fire(&mut self) -> Instant {
        let t = self.c.poll_timeout().expect("no timer armed");
        assert!(t >= self.now, "timer in the past");
        self.advance(t - self.now);
        t
    }

    /// Run DISCOVER/OFFER/REQUEST/ACK with `self.srv`.
    pub fn bind(&mut self) -> Lease {
        assert_eq!(self.c.state(), State::Selecting);
        let d = self.one_tx();
        let offer = self.srv.offer(&d);
        self.feed(&offer).expect("offer");
        let r = self.one_tx();
        let ack = self.srv.ack(&r);
        self.feed(&ack).expect("ack");
        assert_eq!(self.c.state(), State::Bound);
        match self.ev().as_slice() {
            [Event::Bound(l)] => l.clone(),
            other => panic!("expected Bound, got {other:?}"),
        }
    }
}
