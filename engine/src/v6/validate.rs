//! Decoding and validation of server messages (ADVERTISE, REPLY) before they
//! can touch client state: bad input from the wire is dropped and counted,
//! never a panic, never a wrong or lost lease.
//!
//! Messages are decoded with dhcproto's `v6` types, one top-level option at a
//! time. dhcproto 0.15 cannot be handed raw input directly: it subtracts
//! from option lengths without checking (Status Code shorter than 2 octets,
//! Vendor Class/Options shorter than 4, Authentication shorter than 11 panic
//! in a debug build), reads fixed-size options (Preference, Elapsed Time,
//! Server Unicast, Rapid Commit) without looking at their length, so a wrong
//! length shifts every later option, recurses without a depth limit, and
//! stops silently at the first option it cannot decode inside an IA. So this
//! module first walks the option framing itself (RFC 8415 §21.1: code,
//! length, data; lengths must fit their container), checks the lengths
//! dhcproto relies on, bounds nesting, and only then lets dhcproto decode
//! each option from its own slice, checking that it consumed all of it and
//! that every nested option survived.
//!
//! An essential option that fails (Client/Server Identifier, `IA_NA`,
//! Preference, Status Code, Rapid Commit) rejects the message; any other
//! malformed option is dropped on its own and counted, and the message goes
//! ahead without it.

use std::fmt;
use std::net::Ipv6Addr;

use dhcproto::v6::{DhcpOption, DhcpOptions, IANA, MessageType, Status};
use dhcproto::{Decodable, Decoder};

use crate::tally::Counted;

/// Message header: type (1 octet) and transaction id (3 octets).
pub const HEADER_LEN: usize = 4;
/// Deepest option nesting accepted: message → `IA_NA` → IA Address → Status
/// Code is three levels; one more for vendor sub-options.
const MAX_DEPTH: u8 = 4;

/// Option codes (RFC 8415 §24, RFC 3646).
pub mod code {
    pub const CLIENT_ID: u16 = 1;
    pub const SERVER_ID: u16 = 2;
    pub const IA_NA: u16 = 3;
    pub const IA_TA: u16 = 4;
    pub const IA_ADDR: u16 = 5;
    pub const ORO: u16 = 6;
    pub const PREFERENCE: u16 = 7;
    pub const ELAPSED_TIME: u16 = 8;
    pub const RELAY_MSG: u16 = 9;
    pub const AUTH: u16 = 11;
    pub const UNICAST: u16 = 12;
    pub const STATUS_CODE: u16 = 13;
    pub const RAPID_COMMIT: u16 = 14;
    pub const VENDOR_CLASS: u16 = 16;
    pub const VENDOR_OPTS: u16 = 17;
    pub const RECONF_MSG: u16 = 19;
    pub const RECONF_ACCEPT: u16 = 20;
    pub const DNS_SERVERS: u16 = 23;
    pub const DOMAIN_LIST: u16 = 24;
    pub const IA_PD: u16 = 25;
    pub const IA_PREFIX: u16 = 26;
    pub const SOL_MAX_RT: u16 = 82;
}

/// Why a server message was ignored. Every drop is counted in
/// [`ClientStats`](super::ClientStats) by reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DropReason {
    /// Shorter than the 4-octet header.
    Truncated,
    /// Not an ADVERTISE or REPLY (a client or relay message, RECONFIGURE,
    /// an unknown type).
    NotServerMessage,
    /// Not the transaction we have open.
    WrongXid,
    /// An option length runs past the end of its message or container.
    BadOptionLength,
    /// Options nested deeper than any message we accept has them.
    TooDeep,
    /// An essential option (identifiers, `IA_NA`, Preference, Status Code,
    /// Rapid Commit) is malformed or repeated.
    MalformedOption,
    /// No Client Identifier (RFC 8415 §16.3, §16.10).
    MissingClientId,
    /// The Client Identifier is not our DUID.
    WrongClientId,
    /// No Server Identifier.
    MissingServerId,
    /// The Server Identifier is empty or longer than a DUID can be.
    BadServerId,
    /// The Server Identifier is not the server this exchange talks to.
    WrongServer,
    /// A server message this state does not expect (an ADVERTISE while
    /// requesting, a REPLY to SOLICIT without Rapid Commit).
    UnexpectedType,
    /// The client has no exchange open.
    WrongState,
    /// No `IA_NA` with our IAID, or one whose T1 > T2 (RFC 8415 §21.4 says
    /// to discard it).
    MissingIa,
    /// The `IA_NA` holds no address with a non-zero valid lifetime that is a
    /// usable unicast address.
    NoUsableAddress,
    /// An address this client declined was assigned again.
    DeclinedAddress,
    /// Status `NoAddrsAvail` where it only means "not from this server"
    /// (ADVERTISE, RENEW/REBIND).
    NoAddrsAvail,
    /// Status `UnspecFail` or another failure status: the exchange goes on
    /// (RFC 8415 §18.2.10: retransmit, rate-limited by the usual timers).
    StatusFailure,
    /// `UseMulticast` from a server we already reach by multicast.
    UseMulticast,
}

impl DropReason {
    /// Every reason, in counter order.
    pub const ALL: [DropReason; 19] = [
        DropReason::Truncated,
        DropReason::NotServerMessage,
        DropReason::WrongXid,
        DropReason::BadOptionLength,
        DropReason::TooDeep,
        DropReason::MalformedOption,
        DropReason::MissingClientId,
        DropReason::WrongClientId,
        DropReason::MissingServerId,
        DropReason::BadServerId,
        DropReason::WrongServer,
        DropReason::UnexpectedType,
        DropReason::WrongState,
        DropReason::MissingIa,
        DropReason::NoUsableAddress,
        DropReason::DeclinedAddress,
        DropReason::NoAddrsAvail,
        DropReason::StatusFailure,
        DropReason::UseMulticast,
    ];

    /// Bounded, stable label for metrics and structured logs.
    pub fn label(&self) -> &'static str {
        match self {
            DropReason::Truncated => "truncated",
            DropReason::NotServerMessage => "not_server_message",
            DropReason::WrongXid => "wrong_xid",
            DropReason::BadOptionLength => "bad_option_length",
            DropReason::TooDeep => "too_deep",
            DropReason::MalformedOption => "malformed_option",
            DropReason::MissingClientId => "missing_client_id",
            DropReason::WrongClientId => "wrong_client_id",
            DropReason::MissingServerId => "missing_server_id",
            DropReason::BadServerId => "bad_server_id",
            DropReason::WrongServer => "wrong_server",
            DropReason::UnexpectedType => "unexpected_type",
            DropReason::WrongState => "wrong_state",
            DropReason::MissingIa => "missing_ia",
            DropReason::NoUsableAddress => "no_usable_address",
            DropReason::DeclinedAddress => "declined_address",
            DropReason::NoAddrsAvail => "no_addrs_avail",
            DropReason::StatusFailure => "status_failure",
            DropReason::UseMulticast => "use_multicast",
        }
    }
}

impl Counted for DropReason {
    const ALL: &'static [DropReason] = &DropReason::ALL;
}

impl fmt::Display for DropReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

impl std::error::Error for DropReason {}

/// Type and transaction id, read before anything else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub msg_type: MessageType,
    pub xid: u32,
}

/// Check length and type; return type and xid.
pub fn parse_header(p: &[u8]) -> Result<Header, DropReason> {
    if p.len() < HEADER_LEN {
        return Err(DropReason::Truncated);
    }
    let msg_type = MessageType::from(p[0]);
    if !matches!(msg_type, MessageType::Advertise | MessageType::Reply) {
        return Err(DropReason::NotServerMessage);
    }
    Ok(Header {
        msg_type,
        xid: u32::from_be_bytes([0, p[1], p[2], p[3]]),
    })
}

/// A server message that passed the structural checks, with its options
/// decoded by dhcproto.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerMessage {
    pub msg_type: MessageType,
    pub xid: u32,
    pub client_id: Option<Vec<u8>>,
    pub server_id: Option<Vec<u8>>,
    /// Preference (§21.8); 0 when absent.
    pub preference: u8,
    pub rapid_commit: bool,
    /// Top-level Status Code; `None` means Success (§21.13).
    pub status: Option<(Status, String)>,
    /// Server Unicast (§21.12), if sent and well formed.
    pub server_unicast: Option<Ipv6Addr>,
    /// Every `IA_NA`, in message order.
    pub ia_na: Vec<IANA>,
    pub dns_servers: Vec<Ipv6Addr>,
    pub domain_search: Vec<String>,
    /// `SOL_MAX_RT` (§21.24) in seconds, if sent with 4 octets.
    pub sol_max_rt: Option<u32>,
    /// Codes of optional options dropped because they were malformed.
    pub malformed: Vec<u16>,
}

impl ServerMessage {
    /// The first `IA_NA` with `iaid`.
    pub fn ia(&self, iaid: u32) -> Option<&IANA> {
        self.ia_na.iter().find(|ia| ia.id == iaid)
    }
}

/// One option's framing: code and data slice, and the whole TLV.
struct Tlv<'a> {
    code: u16,
    data: &'a [u8],
    whole: &'a [u8],
}

/// Split an options area into TLVs; a length running past the area fails.
fn split(area: &[u8]) -> Result<Vec<Tlv<'_>>, DropReason> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < area.len() {
        let head = area.get(i..i + 4).ok_or(DropReason::BadOptionLength)?;
        let code = u16::from_be_bytes([head[0], head[1]]);
        let len = usize::from(u16::from_be_bytes([head[2], head[3]]));
        let whole = area
            .get(i..i + 4 + len)
            .ok_or(DropReason::BadOptionLength)?;
        out.push(Tlv {
            code,
            data: &whole[4..],
            whole,
        });
        i += 4 + len;
    }
    Ok(out)
}

/// How an option's value is malformed in a way dhcproto cannot be trusted
/// with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Problem {
    /// Framing inside a container is broken.
    Framing,
    TooDeep,
    /// A value of the wrong length, or an option that has no place in a
    /// message to a client.
    Value,
}

impl Problem {
    fn reason(self) -> DropReason {
        match self {
            Problem::Framing => DropReason::BadOptionLength,
            Problem::TooDeep => DropReason::TooDeep,
            Problem::Value => DropReason::MalformedOption,
        }
    }
}

/// Where a container's nested options start, for the options dhcproto
/// decodes into a `DhcpOptions`.
fn nested_offset(code: u16) -> Option<usize> {
    match code {
        code::IA_NA | code::IA_PD => Some(12),
        code::IA_TA | code::VENDOR_OPTS => Some(4),
        code::IA_ADDR => Some(24),
        code::IA_PREFIX => Some(25),
        _ => None,
    }
}

/// Check one option so that dhcproto can decode it without panicking or
/// misreading; return how many options it holds, itself included, counting
/// through every container.
fn check(code: u16, data: &[u8], depth: u8) -> Result<usize, Problem> {
    let len = data.len();
    let ok = match code {
        code::PREFERENCE | code::RECONF_MSG => len == 1,
        code::ELAPSED_TIME => len == 2,
        code::UNICAST => len == 16,
        code::STATUS_CODE => len >= 2,
        code::RAPID_COMMIT | code::RECONF_ACCEPT => len == 0,
        code::AUTH => len >= 11,
        code::VENDOR_CLASS => len >= 4,
        code::ORO => len.is_multiple_of(2),
        code::DNS_SERVERS => len.is_multiple_of(16),
        // A relay message has no place in a message to a client, and
        // dhcproto would decode it recursively.
        code::RELAY_MSG => false,
        _ => true,
    };
    if !ok {
        return Err(Problem::Value);
    }
    let Some(offset) = nested_offset(code) else {
        return Ok(1);
    };
    let inner = data.get(offset..).ok_or(Problem::Value)?;
    if depth >= MAX_DEPTH {
        return Err(Problem::TooDeep);
    }
    let mut n = 1;
    for tlv in split(inner).map_err(|_| Problem::Framing)? {
        n += check(tlv.code, tlv.data, depth + 1)?;
    }
    Ok(n)
}

/// Options dhcproto decoded, counted the way [`check`] counts them.
fn count(opt: &DhcpOption) -> usize {
    let nested = |opts: &DhcpOptions| opts.iter().map(count).sum::<usize>();
    1 + match opt {
        DhcpOption::IANA(ia) => nested(&ia.opts),
        DhcpOption::IAPD(ia) => nested(&ia.opts),
        DhcpOption::IATA(ia) => nested(&ia.opts),
        DhcpOption::IAAddr(a) => nested(&a.opts),
        DhcpOption::IAPrefix(p) => nested(&p.opts),
        DhcpOption::VendorOpts(v) => nested(&v.opts),
        _ => 0,
    }
}

/// Decode one top-level option with dhcproto, after [`check`].
fn decode_one(tlv: &Tlv<'_>) -> Result<DhcpOption, Problem> {
    let expected = check(tlv.code, tlv.data, 1)?;
    let mut d = Decoder::new(tlv.whole);
    let opt = DhcpOption::decode(&mut d).map_err(|_| Problem::Value)?;
    if !d.buffer().is_empty() || count(&opt) != expected {
        return Err(Problem::Value);
    }
    Ok(opt)
}

fn essential(code: u16) -> bool {
    matches!(
        code,
        code::CLIENT_ID
            | code::SERVER_ID
            | code::IA_NA
            | code::PREFERENCE
            | code::STATUS_CODE
            | code::RAPID_COMMIT
    )
}

/// Decode and check a server message (after [`parse_header`]).
pub fn parse(p: &[u8]) -> Result<ServerMessage, DropReason> {
    let header = parse_header(p)?;
    let mut m = ServerMessage {
        msg_type: header.msg_type,
        xid: header.xid,
        client_id: None,
        server_id: None,
        preference: 0,
        rapid_commit: false,
        status: None,
        server_unicast: None,
        ia_na: Vec::new(),
        dns_servers: Vec::new(),
        domain_search: Vec::new(),
        sol_max_rt: None,
        malformed: Vec::new(),
    };
    let mut once = OnceOnly::new([
        code::CLIENT_ID,
        code::SERVER_ID,
        code::PREFERENCE,
        code::STATUS_CODE,
        code::RAPID_COMMIT,
        code::UNICAST,
    ]);
    for tlv in split(&p[HEADER_LEN..])? {
        let opt = match decode_one(&tlv) {
            Ok(opt) => opt,
            Err(problem) if essential(tlv.code) => return Err(problem.reason()),
            Err(_) => {
                m.malformed.push(tlv.code);
                continue;
            }
        };
        once.see(tlv.code)?;
        match opt {
            DhcpOption::ClientId(id) => m.client_id = Some(id),
            DhcpOption::ServerId(id) => m.server_id = Some(id),
            DhcpOption::Preference(v) => m.preference = v,
            DhcpOption::RapidCommit => m.rapid_commit = true,
            DhcpOption::StatusCode(s) => m.status = Some((s.status, sanitize(&s.msg))),
            DhcpOption::ServerUnicast(a) => m.server_unicast = Some(a),
            DhcpOption::IANA(ia) => m.ia_na.push(ia),
            DhcpOption::DomainNameServers(v) => m.dns_servers.extend(v),
            DhcpOption::DomainSearchList(names) => m.domain_search.extend(
                names
                    .iter()
                    .map(|n| n.to_utf8().trim_end_matches('.').to_owned()),
            ),
            DhcpOption::Unknown(u) if u16::from(u.code()) == code::SOL_MAX_RT => {
                match <[u8; 4]>::try_from(u.data()) {
                    Ok(b) => m.sol_max_rt = Some(u32::from_be_bytes(b)),
                    Err(_) => m.malformed.push(tlv.code),
                }
            }
            _ => {}
        }
    }
    m.dns_servers.truncate(16);
    m.domain_search.truncate(16);
    Ok(m)
}

/// A client message seen on the wire (another client's, not this
/// engine's: a VM guest's own, which the agent learns from), decoded with
/// the same structural checks as a server message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientMessage {
    pub msg_type: MessageType,
    pub xid: u32,
    pub client_id: Option<Vec<u8>>,
    pub rapid_commit: bool,
    /// Every `IA_NA`, in message order (with the addresses a REQUEST,
    /// RENEW, REBIND, RELEASE or DECLINE names).
    pub ia_na: Vec<IANA>,
}

/// Decodes and checks a client message: SOLICIT, REQUEST, CONFIRM,
/// RENEW, REBIND, RELEASE, DECLINE or INFORMATION-REQUEST (anything else
/// is [`DropReason::UnexpectedType`]). An essential option that is
/// malformed or repeated rejects it, as in [`parse`].
pub fn parse_client(p: &[u8]) -> Result<ClientMessage, DropReason> {
    if p.len() < HEADER_LEN {
        return Err(DropReason::Truncated);
    }
    let msg_type = MessageType::from(p[0]);
    if !matches!(
        msg_type,
        MessageType::Solicit
            | MessageType::Request
            | MessageType::Confirm
            | MessageType::Renew
            | MessageType::Rebind
            | MessageType::Release
            | MessageType::Decline
            | MessageType::InformationRequest
    ) {
        return Err(DropReason::UnexpectedType);
    }
    let mut m = ClientMessage {
        msg_type,
        xid: u32::from_be_bytes([0, p[1], p[2], p[3]]),
        client_id: None,
        rapid_commit: false,
        ia_na: Vec::new(),
    };
    let mut once = OnceOnly::new([code::CLIENT_ID, code::SERVER_ID, code::RAPID_COMMIT]);
    for tlv in split(&p[HEADER_LEN..])? {
        let opt = match decode_one(&tlv) {
            Ok(opt) => opt,
            Err(problem) if essential(tlv.code) => return Err(problem.reason()),
            Err(_) => continue,
        };
        once.see(tlv.code)?;
        match opt {
            DhcpOption::ClientId(id) => m.client_id = Some(id),
            DhcpOption::RapidCommit => m.rapid_commit = true,
            DhcpOption::IANA(ia) => m.ia_na.push(ia),
            _ => {}
        }
    }
    Ok(m)
}

/// The options of a message that may appear in it once only, among those
/// its parser reads (RFC 8415 §21 says "MUST NOT appear more than once" of
/// each): a second one rejects the message as malformed.
struct OnceOnly<const N: usize> {
    codes: [u16; N],
    seen: [bool; N],
}

impl<const N: usize> OnceOnly<N> {
    const fn new(codes: [u16; N]) -> Self {
        Self {
            codes,
            seen: [false; N],
        }
    }

    /// An option of `code` is in the message: an error if it is one of
    /// the once-only codes and was seen before.
    fn see(&mut self, code: u16) -> Result<(), DropReason> {
        match self.codes.iter().position(|c| *c == code) {
            Some(i) if std::mem::replace(&mut self.seen[i], true) => {
                Err(DropReason::MalformedOption)
            }
            _ => Ok(()),
        }
    }
}

/// A status message fit for a log line: printable, at most 128 characters.
pub(crate) fn sanitize(s: &str) -> String {
    s.chars().filter(|c| !c.is_control()).take(128).collect()
}

/// Whether `a` can be a leased address: not unspecified, loopback,
/// multicast or link-local (DHCPv6 assigns global and unique-local ones).
pub fn is_usable(a: Ipv6Addr) -> bool {
    !(a.is_unspecified()
        || a.is_loopback()
        || a.is_multicast()
        || a.is_unicast_link_local()
        || a.to_ipv4_mapped().is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A guest's client messages decode with the server messages' checks:
    /// their `IA_NA` and DUID read, a server's type refused, a repeated or
    /// malformed essential option refused.
    #[test]
    fn client_messages_decode_with_the_same_checks() {
        let duid = [0, 3, 0, 1, 2, 0, 0, 0, 0x30, 1];
        let mut m = vec![3, 0xab, 0xcd, 0xef];
        m.extend(tlv(code::CLIENT_ID, &duid));
        let mut ia = vec![0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0];
        let mut addr = "fd00:6::1a0".parse::<Ipv6Addr>().unwrap().octets().to_vec();
        addr.extend_from_slice(&[0, 0, 1, 0, 0, 0, 2, 0]);
        ia.extend(tlv(code::IA_ADDR, &addr));
        m.extend(tlv(code::IA_NA, &ia));
        let c = parse_client(&m).unwrap();
        assert_eq!((c.msg_type, c.xid), (MessageType::Request, 0x00ab_cdef));
        assert_eq!(c.client_id.as_deref(), Some(&duid[..]));
        assert_eq!(c.ia_na.len(), 1);
        assert_eq!(c.ia_na[0].id, 9);
        assert!(!c.rapid_commit);
        // A REPLY is not a client's.
        let mut reply = m.clone();
        reply[0] = 7;
        assert_eq!(parse_client(&reply), Err(DropReason::UnexpectedType));
        // Two Client Identifiers; Rapid Commit with a value; truncated.
        let mut two = m.clone();
        two.extend(tlv(code::CLIENT_ID, &duid));
        assert_eq!(parse_client(&two), Err(DropReason::MalformedOption));
        let mut rc = m.clone();
        rc.extend(tlv(code::RAPID_COMMIT, &[1]));
        assert_eq!(parse_client(&rc), Err(DropReason::MalformedOption));
        assert_eq!(parse_client(&m[..3]), Err(DropReason::Truncated));
        for cut in 4..m.len() {
            let _ = parse_client(&m[..cut]);
        }
    }

    fn tlv(code: u16, data: &[u8]) -> Vec<u8> {
        let mut v = code.to_be_bytes().to_vec();
        v.extend_from_slice(&(data.len() as u16).to_be_bytes());
        v.extend_from_slice(data);
        v
    }

    fn msg(opts: &[Vec<u8>]) -> Vec<u8> {
        let mut v = vec![7, 1, 2, 3];
        for o in opts {
            v.extend_from_slice(o);
        }
        v
    }

    #[test]
    fn header_checks() {
        assert_eq!(parse_header(&[7, 0, 0]), Err(DropReason::Truncated));
        assert_eq!(
            parse_header(&[1, 0, 0, 1]),
            Err(DropReason::NotServerMessage)
        );
        assert_eq!(
            parse_header(&[10, 0, 0, 1]),
            Err(DropReason::NotServerMessage)
        );
        assert_eq!(
            parse_header(&[2, 0xab, 0xcd, 0xef]).unwrap().xid,
            0x00ab_cdef
        );
    }

    #[test]
    fn lengths_dhcproto_would_misread_are_rejected_before_it_sees_them() {
        // Status Code of 0 and 1 octets (dhcproto subtracts 2 from the length).
        for bad in [&[][..], &[0][..]] {
            assert_eq!(
                parse(&msg(&[tlv(code::STATUS_CODE, bad)])),
                Err(DropReason::MalformedOption)
            );
        }
        // Preference of 2 octets would shift every later option.
        assert_eq!(
            parse(&msg(&[tlv(code::PREFERENCE, &[1, 2])])),
            Err(DropReason::MalformedOption)
        );
        // Rapid Commit with data.
        assert_eq!(
            parse(&msg(&[tlv(code::RAPID_COMMIT, &[1])])),
            Err(DropReason::MalformedOption)
        );
        // A Status Code too short inside an IA_NA.
        let mut ia = vec![0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0];
        ia.extend(tlv(code::STATUS_CODE, &[0]));
        assert_eq!(
            parse(&msg(&[tlv(code::IA_NA, &ia)])),
            Err(DropReason::MalformedOption)
        );
        // Vendor Class / Authentication shorter than their fixed part, and
        // Vendor Options whose sub-option overruns it, are dropped on their
        // own.
        let m = parse(&msg(&[
            tlv(code::VENDOR_CLASS, &[1]),
            tlv(code::AUTH, &[1; 10]),
            tlv(code::VENDOR_OPTS, &[0, 0, 0, 9, 0, 1, 0, 9]),
        ]))
        .unwrap();
        assert_eq!(
            m.malformed,
            [code::VENDOR_CLASS, code::AUTH, code::VENDOR_OPTS]
        );
    }

    #[test]
    fn framing_errors_reject_the_message() {
        let mut m = msg(&[tlv(code::SERVER_ID, &[0, 3, 0, 1, 1, 2, 3, 4, 5, 6])]);
        m.truncate(m.len() - 1);
        assert_eq!(parse(&m), Err(DropReason::BadOptionLength));
        let m = msg(&[vec![0, 1, 0]]);
        assert_eq!(parse(&m), Err(DropReason::BadOptionLength));
        // A nested length running past the IA_NA.
        let mut ia = vec![0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0];
        ia.extend([0, 5, 0, 30, 0]);
        assert_eq!(
            parse(&msg(&[tlv(code::IA_NA, &ia)])),
            Err(DropReason::BadOptionLength)
        );
    }

    #[test]
    fn deep_nesting_is_refused() {
        // IA_NA inside IA_NA inside IA_NA …
        let mut inner = tlv(code::STATUS_CODE, &[0, 0]);
        for _ in 0..8 {
            let mut ia = vec![0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0];
            ia.extend(inner);
            inner = tlv(code::IA_NA, &ia);
        }
        assert_eq!(parse(&msg(&[inner])), Err(DropReason::TooDeep));
    }

    #[test]
    fn relay_message_is_dropped_not_decoded() {
        let m = parse(&msg(&[tlv(code::RELAY_MSG, &[12; 40])])).unwrap();
        assert_eq!(m.malformed, [code::RELAY_MSG]);
    }

    /// Each once-only code passes once and is refused the second time;
    /// any other code passes as often as it comes.
    #[test]
    fn once_only_options_pass_once() {
        let mut once = OnceOnly::new([code::CLIENT_ID, code::RAPID_COMMIT]);
        assert_eq!(once.see(code::CLIENT_ID), Ok(()));
        assert_eq!(once.see(code::RAPID_COMMIT), Ok(()));
        for _ in 0..3 {
            assert_eq!(once.see(code::IA_NA), Ok(()));
        }
        assert_eq!(
            once.see(code::RAPID_COMMIT),
            Err(DropReason::MalformedOption)
        );
        assert_eq!(once.see(code::CLIENT_ID), Err(DropReason::MalformedOption));
    }

    #[test]
    fn repeated_single_options_are_refused() {
        let id = tlv(code::SERVER_ID, &[0, 3, 0, 1, 1, 2, 3, 4, 5, 6]);
        assert_eq!(
            parse(&msg(&[id.clone(), id])),
            Err(DropReason::MalformedOption)
        );
    }

    #[test]
    fn optional_options_decode_and_bad_ones_are_dropped_alone() {
        let dns: Vec<u8> = "2001:db8::53"
            .parse::<Ipv6Addr>()
            .unwrap()
            .octets()
            .to_vec();
        let m = parse(&msg(&[
            tlv(code::DNS_SERVERS, &dns),
            tlv(code::DNS_SERVERS, &[1; 17]),
            tlv(code::DOMAIN_LIST, b"\x07example\x03com\x00"),
            tlv(code::SOL_MAX_RT, &[0, 0, 0, 120]),
            tlv(code::PREFERENCE, &[200]),
            tlv(code::RAPID_COMMIT, &[]),
        ]))
        .unwrap();
        assert_eq!(m.dns_servers, ["2001:db8::53".parse::<Ipv6Addr>().unwrap()]);
        assert_eq!(m.domain_search, ["example.com"]);
        assert_eq!(m.sol_max_rt, Some(120));
        assert_eq!(m.preference, 200);
        assert!(m.rapid_commit);
        assert_eq!(m.malformed, [code::DNS_SERVERS]);
    }

    #[test]
    fn usable_addresses() {
        for bad in ["::", "::1", "ff02::1:2", "fe80::1", "::ffff:192.0.2.1"] {
            assert!(!is_usable(bad.parse().unwrap()), "{bad}");
        }
        for good in ["2001:db8::10", "fd00::1"] {
            assert!(is_usable(good.parse().unwrap()), "{good}");
        }
    }
}
