//! Validation of server replies before they can touch client state: bad
//! input from the wire is dropped and counted, never a panic, never a wrong
//! lease.
//!
//! `dhcproto` 0.15 is not used to decode replies: it ignores option overload
//! (52), joins repeated options only when adjacent, stops silently at the first
//! bad option, has `debug_assert`s and unchecked subtractions reachable from
//! input, and does not check the magic cookie. Instead this module walks the
//! raw BOOTP message itself:
//!
//! * fixed header (RFC 2131 §2, 236 octets) and magic cookie (RFC 2131 §3);
//! * the options field, then `file` and `sname` when option 52 says they are
//!   overloaded (RFC 2131 §4.1, RFC 2132 §9.3);
//! * every instance of an option code is concatenated in that order (RFC 3396
//!   §5), whether adjacent or not;
//! * a length running past its area, an overload value other than 1..=3, or an
//!   overload option outside the options field rejects the whole reply.
//!
//! The result is a [`Reply`] with a map of complete option payloads; typed
//! interpretation happens in `lease.rs`.
//!
//! One thing: the one decoder of DHCP messages from the wire, with its
//! checks (about 460 lines of code; the rest is its tests).

use std::collections::BTreeMap;
use std::fmt;
use std::net::Ipv4Addr;

use crate::tally::Counted;

/// BOOTP fixed header length (op..file).
pub const HEADER_LEN: usize = 236;
/// RFC 2131 §3 magic cookie.
pub const MAGIC_COOKIE: [u8; 4] = [99, 130, 83, 99];
const SNAME: std::ops::Range<usize> = 44..108;
const FILE: std::ops::Range<usize> = 108..236;

/// Why a reply was ignored. Every drop is counted in
/// [`ClientStats`](crate::ClientStats) by reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DropReason {
    /// Shorter than the fixed header plus magic cookie.
    Truncated,
    /// The magic cookie is not 99.130.83.99.
    BadCookie,
    /// `op` is not BOOTREPLY (2).
    NotBootReply,
    /// `htype`/`hlen` are not Ethernet/6.
    BadHardwareType,
    /// Not the transaction we have open.
    WrongXid,
    /// `chaddr` is not ours.
    WrongChaddr,
    /// Option 61 echoed by the server differs from ours (RFC 6842).
    WrongClientId,
    /// An option length runs past the end of its area.
    BadOptionLength,
    /// Option 52 malformed, out of range or found inside `file`/`sname`.
    BadOverload,
    /// No option 53.
    MissingMessageType,
    /// Option 53 has a bad length or an unknown value.
    BadMessageType,
    /// A valid message type that this state does not expect (e.g. an OFFER
    /// while REQUESTING).
    UnexpectedType,
    /// No option 54.
    MissingServerId,
    /// Option 54 is malformed or not a unicast address.
    BadServerId,
    /// Option 54 is not the server this transaction talks to.
    WrongServer,
    /// `yiaddr` is not a usable unicast address, or differs from the address
    /// requested.
    BadAddress,
    /// An address the client declined in this acquisition was offered again.
    DeclinedAddress,
    /// No option 51 in an OFFER/ACK.
    MissingLeaseTime,
    /// Option 51 is zero.
    ZeroLeaseTime,
    /// Option 51 has a length other than 4. (A malformed optional option —
    /// 1, 3, 6, 15, 26, 58, 59, 119, 121 — never drops the reply: it is
    /// dropped on its own, see [`LeaseOption`](crate::lease::LeaseOption).)
    BadLeaseTime,
    /// The client has no transaction open (BOUND, INIT, RELEASED, FAILED).
    WrongState,
}

impl DropReason {
    /// Every reason, in counter order.
    pub const ALL: [DropReason; 21] = [
        DropReason::Truncated,
        DropReason::BadCookie,
        DropReason::NotBootReply,
        DropReason::BadHardwareType,
        DropReason::WrongXid,
        DropReason::WrongChaddr,
        DropReason::WrongClientId,
        DropReason::BadOptionLength,
        DropReason::BadOverload,
        DropReason::MissingMessageType,
        DropReason::BadMessageType,
        DropReason::UnexpectedType,
        DropReason::MissingServerId,
        DropReason::BadServerId,
        DropReason::WrongServer,
        DropReason::BadAddress,
        DropReason::DeclinedAddress,
        DropReason::MissingLeaseTime,
        DropReason::ZeroLeaseTime,
        DropReason::BadLeaseTime,
        DropReason::WrongState,
    ];

    /// Bounded, stable label for metrics and structured logs.
    pub fn label(&self) -> &'static str {
        match self {
            DropReason::Truncated => "truncated",
            DropReason::BadCookie => "bad_cookie",
            DropReason::NotBootReply => "not_bootreply",
            DropReason::BadHardwareType => "bad_hardware_type",
            DropReason::WrongXid => "wrong_xid",
            DropReason::WrongChaddr => "wrong_chaddr",
            DropReason::WrongClientId => "wrong_client_id",
            DropReason::BadOptionLength => "bad_option_length",
            DropReason::BadOverload => "bad_overload",
            DropReason::MissingMessageType => "missing_message_type",
            DropReason::BadMessageType => "bad_message_type",
            DropReason::UnexpectedType => "unexpected_type",
            DropReason::MissingServerId => "missing_server_id",
            DropReason::BadServerId => "bad_server_id",
            DropReason::WrongServer => "wrong_server",
            DropReason::BadAddress => "bad_address",
            DropReason::DeclinedAddress => "declined_address",
            DropReason::MissingLeaseTime => "missing_lease_time",
            DropReason::ZeroLeaseTime => "zero_lease_time",
            DropReason::BadLeaseTime => "bad_lease_time",
            DropReason::WrongState => "wrong_state",
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

/// DHCP message types a client can receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyType {
    Offer,
    Ack,
    Nak,
}

/// A structurally valid BOOTREPLY with its options reassembled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub xid: u32,
    pub secs: u16,
    pub flags: u16,
    pub ciaddr: Ipv4Addr,
    pub yiaddr: Ipv4Addr,
    pub siaddr: Ipv4Addr,
    pub giaddr: Ipv4Addr,
    pub chaddr: [u8; 6],
    /// Complete option payloads by code, each the RFC 3396 concatenation of
    /// every instance (options field, then `file`, then `sname`).
    pub options: BTreeMap<u8, Vec<u8>>,
}

fn ip_at(b: &[u8], at: usize) -> Ipv4Addr {
    Ipv4Addr::new(b[at], b[at + 1], b[at + 2], b[at + 3])
}

/// Header fields checked before the (more expensive) option walk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub xid: u32,
    pub chaddr: [u8; 6],
}

/// Check length, op and hardware type; return xid and chaddr. The cookie is
/// checked by [`parse_reply`], after the caller knows the reply is addressed
/// to it (so a broken reply to us is reported as heard).
pub fn parse_header(p: &[u8]) -> Result<Header, DropReason> {
    if p.len() < HEADER_LEN + MAGIC_COOKIE.len() {
        return Err(DropReason::Truncated);
    }
    if p[0] != 2 {
        return Err(DropReason::NotBootReply);
    }
    hardware_header(p)
}

/// Hardware type and length (Ethernet, 6), xid and chaddr of a message at
/// least [`HEADER_LEN`] long.
fn hardware_header(p: &[u8]) -> Result<Header, DropReason> {
    if p[1] != 1 || p[2] != 6 {
        return Err(DropReason::BadHardwareType);
    }
    let xid = u32::from_be_bytes([p[4], p[5], p[6], p[7]]);
    let mut chaddr = [0u8; 6];
    chaddr.copy_from_slice(&p[28..34]);
    Ok(Header { xid, chaddr })
}

/// Which area an option instance came from (overload is legal only in the
/// options field).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Area {
    Options,
    File,
    Sname,
}

/// Walk one area, appending every option instance to `out`.
///
/// Ends at END (255) or exactly at the end of the area; PAD (0) is skipped.
fn walk(area: &[u8], which: Area, out: &mut BTreeMap<u8, Vec<u8>>) -> Result<(), DropReason> {
    let mut i = 0;
    while i < area.len() {
        let code = area[i];
        match code {
            0 => i += 1,
            255 => return Ok(()),
            _ => {
                let len = usize::from(*area.get(i + 1).ok_or(DropReason::BadOptionLength)?);
                let data = area
                    .get(i + 2..i + 2 + len)
                    .ok_or(DropReason::BadOptionLength)?;
                if code == 52 && which != Area::Options {
                    return Err(DropReason::BadOverload);
                }
                out.entry(code).or_default().extend_from_slice(data);
                i += 2 + len;
            }
        }
    }
    Ok(())
}

/// Full structural parse of a reply: header, cookie, options with overload
/// and RFC 3396 concatenation.
pub fn parse_reply(p: &[u8]) -> Result<Reply, DropReason> {
    let h = parse_header(p)?;
    parse_body(p, h)
}

/// The cookie and options of a message whose header checked out.
fn parse_body(p: &[u8], h: Header) -> Result<Reply, DropReason> {
    if p[HEADER_LEN..HEADER_LEN + 4] != MAGIC_COOKIE {
        return Err(DropReason::BadCookie);
    }
    let mut options = BTreeMap::new();
    walk(&p[HEADER_LEN + 4..], Area::Options, &mut options)?;
    if let Some(ov) = options.get(&52) {
        let [v] = ov.as_slice() else {
            return Err(DropReason::BadOverload);
        };
        let v = *v;
        if !(1..=3).contains(&v) {
            return Err(DropReason::BadOverload);
        }
        // RFC 3396 §5: options field, then file, then sname.
        if v & 1 != 0 {
            walk(&p[FILE], Area::File, &mut options)?;
        }
        if v & 2 != 0 {
            walk(&p[SNAME], Area::Sname, &mut options)?;
        }
    }
    Ok(Reply {
        xid: h.xid,
        secs: u16::from_be_bytes([p[8], p[9]]),
        flags: u16::from_be_bytes([p[10], p[11]]),
        ciaddr: ip_at(p, 12),
        yiaddr: ip_at(p, 16),
        siaddr: ip_at(p, 20),
        giaddr: ip_at(p, 24),
        chaddr: h.chaddr,
        options,
    })
}

impl Reply {
    /// Option 53, mapped to the types a client accepts.
    pub fn reply_type(&self) -> Result<ReplyType, DropReason> {
        match self.options.get(&53).map(Vec::as_slice) {
            None => Err(DropReason::MissingMessageType),
            Some([2]) => Ok(ReplyType::Offer),
            Some([5]) => Ok(ReplyType::Ack),
            Some([6]) => Ok(ReplyType::Nak),
            // DISCOVER, REQUEST, DECLINE, RELEASE, INFORM and others are
            // well-formed but never sent to a client.
            Some([1 | 3 | 4 | 7 | 8 | 9..=18]) => Err(DropReason::UnexpectedType),
            Some(_) => Err(DropReason::BadMessageType),
        }
    }

    /// Option 54 (RFC 2131 requires it in OFFER, ACK and NAK).
    pub fn server_id(&self) -> Result<Ipv4Addr, DropReason> {
        match self.options.get(&54).map(Vec::as_slice) {
            None => Err(DropReason::MissingServerId),
            Some(&[a, b, c, d]) => {
                let ip = Ipv4Addr::new(a, b, c, d);
                if is_unicast(ip) {
                    Ok(ip)
                } else {
                    Err(DropReason::BadServerId)
                }
            }
            Some(_) => Err(DropReason::BadServerId),
        }
    }

    /// Option 56 (message) as printable text, bounded to 256 characters.
    pub fn message(&self) -> Option<String> {
        self.options
            .get(&56)
            .map(|m| sanitize_text(&String::from_utf8_lossy(m), 256))
    }
}

/// Option 53 (RFC 2132 §9.6): the type of a DHCP message, either direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageType {
    Discover,
    Offer,
    Request,
    Decline,
    Ack,
    Nak,
    Release,
    Inform,
    /// Any other value (lease query and later extensions).
    Other(u8),
}

impl MessageType {
    /// The type of option-53 value `v`.
    pub fn from_code(v: u8) -> Self {
        match v {
            1 => MessageType::Discover,
            2 => MessageType::Offer,
            3 => MessageType::Request,
            4 => MessageType::Decline,
            5 => MessageType::Ack,
            6 => MessageType::Nak,
            7 => MessageType::Release,
            8 => MessageType::Inform,
            v => MessageType::Other(v),
        }
    }
}

/// A DHCP message of someone else's exchange — a guest's own client and
/// its server, watched on a learning port, not answered — through the same
/// checks as a reply to the engine's own client ([`parse_reply`]: length,
/// Ethernet hardware type, magic cookie, the option walk with overload and
/// RFC 3396 concatenation), whichever its direction, with the fields that
/// say what the exchange binds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// `op`: 1 BOOTREQUEST (from the client), 2 BOOTREPLY; not checked.
    pub op: u8,
    /// Option 53, when present.
    pub message_type: Option<MessageType>,
    pub xid: u32,
    pub chaddr: [u8; 6],
    pub ciaddr: Ipv4Addr,
    pub yiaddr: Ipv4Addr,
    /// `giaddr`: the relay agent a relayed reply goes back through.
    pub giaddr: Ipv4Addr,
    /// Option 54, when present (a unicast address).
    pub server_id: Option<Ipv4Addr>,
    /// Option 50, when present and well-formed.
    pub requested_ip: Option<Ipv4Addr>,
    /// Option 1 as a prefix length, when present and a contiguous mask.
    pub prefix_len: Option<u8>,
    /// The first address of option 3, when present and well-formed.
    pub router: Option<Ipv4Addr>,
    /// Option 51 in seconds, when present (`u32::MAX`: infinite).
    pub lease_time: Option<u32>,
    /// Option 80 (Rapid Commit, RFC 4039) is present: a DISCOVER that
    /// carries it may be answered by an ACK.
    pub rapid_commit: bool,
}

/// Decode a watched DHCP message ([`Observed`]). Whatever would make the
/// engine drop a reply structurally drops it here too, and so does a
/// malformed option 53 ([`DropReason::BadMessageType`]), 54
/// ([`DropReason::BadServerId`]) or 51 ([`DropReason::BadLeaseTime`]); a
/// malformed option 1, 3 or 50 is left out on its own, as the lease path
/// leaves out a malformed optional option.
pub fn parse_observed(p: &[u8]) -> Result<Observed, DropReason> {
    if p.len() < HEADER_LEN + MAGIC_COOKIE.len() {
        return Err(DropReason::Truncated);
    }
    let header = hardware_header(p)?;
    let m = parse_body(p, header)?;
    let opt = |code: u8| m.options.get(&code).map(Vec::as_slice);
    let message_type = match opt(53) {
        None => None,
        Some(&[v]) => Some(MessageType::from_code(v)),
        Some(_) => return Err(DropReason::BadMessageType),
    };
    let server_id = match opt(54) {
        None => None,
        Some(_) => Some(m.server_id()?),
    };
    let lease_time = match opt(51).map(<[u8; 4]>::try_from) {
        None => None,
        Some(Ok(secs)) => Some(u32::from_be_bytes(secs)),
        Some(Err(_)) => return Err(DropReason::BadLeaseTime),
    };
    let addr = |code| opt(code).and_then(|v| <[u8; 4]>::try_from(v).ok().map(Ipv4Addr::from));
    let router = match opt(3) {
        Some(list) if !list.is_empty() && list.len().is_multiple_of(4) => Some(ip_at(list, 0)),
        _ => None,
    };
    Ok(Observed {
        op: p[0],
        message_type,
        xid: m.xid,
        chaddr: m.chaddr,
        ciaddr: m.ciaddr,
        yiaddr: m.yiaddr,
        giaddr: m.giaddr,
        server_id,
        requested_ip: addr(50),
        prefix_len: addr(1).and_then(|mask| mask_to_prefix(mask.octets())),
        router,
        lease_time,
        rapid_commit: m.options.contains_key(&80),
    })
}

/// Replace control characters and bound the length of text from the wire so
/// it is safe to log.
pub fn sanitize_text(s: &str, max_chars: usize) -> String {
    s.chars()
        .take(max_chars)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// A usable unicast host address (not 0.0.0.0, broadcast, multicast, loopback
/// or class E).
pub fn is_unicast(ip: Ipv4Addr) -> bool {
    !(ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_loopback()
        || ip.octets()[0] >= 240)
}

/// Prefix length of a contiguous mask.
pub(crate) fn mask_to_prefix(m: [u8; 4]) -> Option<u8> {
    let v = u32::from_be_bytes(m);
    let ones = v.leading_ones();
    (v.checked_shl(ones).unwrap_or(0) == 0).then_some(ones as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Vec<u8> {
        let mut p = vec![0u8; 240];
        p[0] = 2;
        p[1] = 1;
        p[2] = 6;
        p[4..8].copy_from_slice(&0x1234_5678u32.to_be_bytes());
        p[28..34].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        p[236..240].copy_from_slice(&MAGIC_COOKIE);
        p
    }

    #[test]
    fn header_checks() {
        assert_eq!(parse_header(&[2; 100]), Err(DropReason::Truncated));
        let mut p = base();
        p[0] = 1;
        assert_eq!(parse_header(&p), Err(DropReason::NotBootReply));
        let mut p = base();
        p[2] = 16;
        assert_eq!(parse_header(&p), Err(DropReason::BadHardwareType));
        let mut p = base();
        p[239] = 0;
        assert!(parse_header(&p).is_ok());
        assert_eq!(parse_reply(&p), Err(DropReason::BadCookie));
        let h = parse_header(&base()).unwrap();
        assert_eq!(h.xid, 0x1234_5678);
        assert_eq!(h.chaddr, [2, 0, 0, 0, 0, 1]);
    }

    #[test]
    fn option_length_past_end_is_rejected() {
        let mut p = base();
        p.extend_from_slice(&[53, 1, 2, 6, 10, 1, 2]);
        assert_eq!(parse_reply(&p), Err(DropReason::BadOptionLength));
        let mut p = base();
        p.extend_from_slice(&[53, 1, 2, 6]);
        assert_eq!(parse_reply(&p), Err(DropReason::BadOptionLength));
    }

    #[test]
    fn missing_end_is_accepted_when_exact_and_trailing_bytes_after_end_ignored() {
        let mut p = base();
        p.extend_from_slice(&[53, 1, 2]);
        assert_eq!(parse_reply(&p).unwrap().reply_type(), Ok(ReplyType::Offer));
        let mut p = base();
        p.extend_from_slice(&[0, 0, 53, 1, 5, 255, 99, 99, 99]);
        let r = parse_reply(&p).unwrap();
        assert_eq!(r.reply_type(), Ok(ReplyType::Ack));
        assert_eq!(r.options.len(), 1);
    }

    #[test]
    fn split_options_are_concatenated_even_when_not_adjacent() {
        let mut p = base();
        p.extend_from_slice(&[
            15, 3, b'e', b'x', b'a', 53, 1, 2, 15, 4, b'm', b'p', b'l', b'e', 255,
        ]);
        let r = parse_reply(&p).unwrap();
        assert_eq!(r.options[&15], b"example");
    }

    #[test]
    fn overload_into_file_and_sname_in_rfc3396_order() {
        let mut p = base();
        // sname holds the tail of option 15; file holds the middle.
        p[FILE.start..FILE.start + 5].copy_from_slice(&[15, 2, b'm', b'p', 255]);
        p[SNAME.start..SNAME.start + 6].copy_from_slice(&[15, 3, b'l', b'e', b'!', 255]);
        p.extend_from_slice(&[52, 1, 3, 53, 1, 5, 15, 2, b'e', b'x', 255]);
        let r = parse_reply(&p).unwrap();
        assert_eq!(r.options[&15], b"exmple!");
        // Without the overload option the fields are not options.
        let mut q = p.clone();
        q[240..243].copy_from_slice(&[0, 0, 0]);
        assert_eq!(parse_reply(&q).unwrap().options[&15], b"ex");
    }

    #[test]
    fn bad_overload_values() {
        let cases: [&[u8]; 4] = [
            &[52, 1, 0],
            &[52, 1, 4],
            &[52, 2, 1, 1],
            &[52, 1, 1, 52, 1, 2],
        ];
        for bad in cases {
            let mut p = base();
            p.extend_from_slice(bad);
            p.push(255);
            assert_eq!(parse_reply(&p), Err(DropReason::BadOverload), "{bad:?}");
        }
        // Overload option inside the file field.
        let mut p = base();
        p[FILE.start..FILE.start + 4].copy_from_slice(&[52, 1, 2, 255]);
        p.extend_from_slice(&[52, 1, 1, 255]);
        assert_eq!(parse_reply(&p), Err(DropReason::BadOverload));
        // Bad length inside the overloaded field.
        let mut p = base();
        p[FILE.end - 2..FILE.end].copy_from_slice(&[15, 9]);
        p.extend_from_slice(&[52, 1, 1, 255]);
        assert_eq!(parse_reply(&p), Err(DropReason::BadOptionLength));
    }

    #[test]
    fn message_type_and_server_id() {
        let mut p = base();
        p.extend_from_slice(&[53, 2, 2, 2, 255]);
        assert_eq!(
            parse_reply(&p).unwrap().reply_type(),
            Err(DropReason::BadMessageType)
        );
        let mut p = base();
        p.extend_from_slice(&[53, 1, 3, 255]);
        assert_eq!(
            parse_reply(&p).unwrap().reply_type(),
            Err(DropReason::UnexpectedType)
        );
        let mut p = base();
        p.extend_from_slice(&[255]);
        assert_eq!(
            parse_reply(&p).unwrap().reply_type(),
            Err(DropReason::MissingMessageType)
        );
        let mut p = base();
        p.extend_from_slice(&[54, 4, 255, 255, 255, 255, 255]);
        assert_eq!(
            parse_reply(&p).unwrap().server_id(),
            Err(DropReason::BadServerId)
        );
        let mut p = base();
        p.extend_from_slice(&[54, 3, 1, 2, 3, 255]);
        assert_eq!(
            parse_reply(&p).unwrap().server_id(),
            Err(DropReason::BadServerId)
        );
    }

    #[test]
    fn drop_reason_labels_are_unique() {
        let mut labels: Vec<_> = DropReason::ALL.iter().map(DropReason::label).collect();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), DropReason::ALL.len());
        for (i, r) in DropReason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
        }
    }

    #[test]
    fn observed_messages_of_either_direction() {
        // A client's DECLINE: op 1, option 50, no server checks needed.
        let mut p = base();
        p[0] = 1;
        p[12..16].copy_from_slice(&[192, 0, 2, 9]);
        p.extend_from_slice(&[53, 1, 4, 50, 4, 192, 0, 2, 7, 255]);
        assert_eq!(parse_reply(&p), Err(DropReason::NotBootReply));
        let o = parse_observed(&p).unwrap();
        assert_eq!(o.op, 1);
        assert_eq!(o.message_type, Some(MessageType::Decline));
        assert_eq!(o.xid, 0x1234_5678);
        assert_eq!(o.chaddr, [2, 0, 0, 0, 0, 1]);
        assert_eq!(o.ciaddr, Ipv4Addr::new(192, 0, 2, 9));
        assert_eq!(o.requested_ip, Some(Ipv4Addr::new(192, 0, 2, 7)));
        assert_eq!((o.server_id, o.lease_time, o.router), (None, None, None));
        // A server's ACK, its mask and routers split across instances.
        let mut p = base();
        p[16..20].copy_from_slice(&[192, 0, 2, 10]);
        p.extend_from_slice(&[53, 1, 5, 54, 4, 192, 0, 2, 1, 51, 4, 0, 0, 0, 120]);
        p.extend_from_slice(&[1, 2, 255, 255, 3, 4, 192, 0, 2, 1, 1, 2, 255, 0]);
        p.extend_from_slice(&[3, 4, 192, 0, 2, 2, 255]);
        let o = parse_observed(&p).unwrap();
        assert_eq!(o.message_type, Some(MessageType::Ack));
        assert_eq!(o.yiaddr, Ipv4Addr::new(192, 0, 2, 10));
        assert_eq!(o.server_id, Some(Ipv4Addr::new(192, 0, 2, 1)));
        assert_eq!(o.lease_time, Some(120));
        assert_eq!(o.prefix_len, Some(24));
        assert_eq!(o.router, Some(Ipv4Addr::new(192, 0, 2, 1)));
    }

    #[test]
    fn observed_messages_are_checked_like_replies() {
        assert_eq!(parse_observed(&[1; 100]), Err(DropReason::Truncated));
        let mut p = base();
        p[239] = 0;
        assert_eq!(parse_observed(&p), Err(DropReason::BadCookie));
        let mut p = base();
        p[2] = 16;
        assert_eq!(parse_observed(&p), Err(DropReason::BadHardwareType));
        let cases: [(&[u8], DropReason); 5] = [
            (&[53, 1, 5, 3, 9, 1], DropReason::BadOptionLength),
            (&[52, 1, 7, 53, 1, 5], DropReason::BadOverload),
            (&[53, 2, 5, 5], DropReason::BadMessageType),
            (&[53, 1, 5, 54, 4, 224, 0, 0, 1], DropReason::BadServerId),
            (&[53, 1, 5, 51, 2, 0, 1], DropReason::BadLeaseTime),
        ];
        for (options, reason) in cases {
            let mut p = base();
            p.extend_from_slice(options);
            assert_eq!(parse_observed(&p), Err(reason), "{options:?}");
        }
        // Malformed optional options are left out; the rest stands.
        let mut p = base();
        p.extend_from_slice(&[53, 1, 5, 1, 4, 255, 0, 255, 0, 3, 3, 1, 2, 3, 50, 1, 9, 255]);
        let o = parse_observed(&p).unwrap();
        assert_eq!(o.message_type, Some(MessageType::Ack));
        assert_eq!((o.prefix_len, o.router, o.requested_ip), (None, None, None));
        // No option 53 at all: a message of no type.
        let mut p = base();
        p.push(255);
        assert_eq!(parse_observed(&p).unwrap().message_type, None);
    }
}
