//! DHCP frames as the tests put them on a wire by hand: a client's
//! broadcast BOOTREQUEST, and a server's (or a rogue's) BOOTREPLY; a
//! DHCPv6 message of a guest's or a server's ([`dhcp6`]) and its frame
//! ([`from_guest6`], [`to_guest6`]); the DHCP
//! payload encoded by `dhcproto`, the frame by the agent's own builder.

use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;

use dhcproto::v4::{DhcpOption, Flags, Message, MessageType, Opcode};
use dhcproto::{Encodable as _, Encoder};
use xdhcp::datapath::frame::{FrameHeaders, build_udp_frame};

/// Where a reply's BOOTP `xid` is in a [`server_reply`] frame (no VLAN
/// tag): a sender may rewrite it in place, frame after frame.
pub const XID_AT: usize = 14 + 20 + 8 + 4;

/// The encoded BOOTP message `m`.
fn encode(m: &Message) -> Vec<u8> {
    let mut payload = Vec::new();
    m.encode(&mut Encoder::new(&mut payload))
        .expect("a DHCP message encodes");
    payload
}

/// A client's broadcast BOOTREQUEST frame (0.0.0.0:68 to
/// 255.255.255.255:67, to `ff:ff:ff:ff:ff:ff`) from `src_mac` for
/// `chaddr`, transaction `xid`, the broadcast flag set, carrying `opts`
/// (its message type among them).
pub fn client_broadcast(
    src_mac: [u8; 6],
    chaddr: [u8; 6],
    xid: u32,
    opts: impl IntoIterator<Item = DhcpOption>,
) -> Vec<u8> {
    let mut m = Message::default();
    m.set_opcode(Opcode::BootRequest)
        .set_xid(xid)
        .set_flags(Flags::default().set_broadcast())
        .set_chaddr(&chaddr);
    for o in opts {
        m.opts_mut().insert(o);
    }
    build_udp_frame(
        &FrameHeaders {
            src_mac,
            dst_mac: [0xff; 6],
            vlan: None,
            src_ip: Ipv4Addr::UNSPECIFIED,
            dst_ip: Ipv4Addr::BROADCAST,
            src_port: 68,
            dst_port: 67,
        },
        &encode(&m),
    )
}

/// A client's broadcast DHCPDISCOVER ([`client_broadcast`]).
pub fn discover(src_mac: [u8; 6], chaddr: [u8; 6], xid: u32) -> Vec<u8> {
    client_broadcast(
        src_mac,
        chaddr,
        xid,
        [DhcpOption::MessageType(MessageType::Discover)],
    )
}

/// A server's BOOTREPLY: message type `kind` for `chaddr`, transaction
/// `xid`, offering `yiaddr` with `mask` for an hour, from server `server`.
#[derive(Debug, Clone, Copy)]
pub struct Reply {
    pub kind: MessageType,
    pub xid: u32,
    pub chaddr: [u8; 6],
    pub yiaddr: Ipv4Addr,
    pub server: Ipv4Addr,
    pub mask: Ipv4Addr,
}

/// `reply` in a frame from `src_mac` and its server's address (port 67) to
/// `dst_mac` and `dst_ip` (port 68). The BOOTP message is padded to 300
/// bytes, as servers send it, and the UDP checksum is left out (0, which
/// IPv4 allows), so the xid at [`XID_AT`] may be rewritten in place.
pub fn server_reply(
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    dst_ip: Ipv4Addr,
    reply: &Reply,
) -> Vec<u8> {
    let mut m = Message::default();
    m.set_opcode(Opcode::BootReply)
        .set_xid(reply.xid)
        .set_yiaddr(reply.yiaddr)
        .set_chaddr(&reply.chaddr);
    let opts = m.opts_mut();
    opts.insert(DhcpOption::MessageType(reply.kind));
    opts.insert(DhcpOption::ServerIdentifier(reply.server));
    opts.insert(DhcpOption::AddressLeaseTime(3600));
    opts.insert(DhcpOption::SubnetMask(reply.mask));
    let mut payload = encode(&m);
    payload.resize(payload.len().max(300), 0);
    let mut frame = build_udp_frame(
        &FrameHeaders {
            src_mac,
            dst_mac,
            vlan: None,
            src_ip: reply.server,
            dst_ip,
            src_port: 67,
            dst_port: 68,
        },
        &payload,
    );
    frame[14 + 20 + 6..14 + 20 + 8].fill(0);
    frame
}

/// A DHCPv6 message of `kind`, transaction `xid` (its low 24 bits), for
/// the client DUID-LL of `mac` (hardware type 1) with one `IA_NA` (IAID 1)
/// naming `addr` with preferred and valid lifetimes `life`, and what
/// `more` adds (a Server Identifier, a status, …).
pub fn dhcp6(
    kind: dhcproto::v6::MessageType,
    xid: u32,
    mac: [u8; 6],
    (addr, life): (std::net::Ipv6Addr, u32),
    more: impl FnOnce(&mut dhcproto::v6::DhcpOptions),
) -> Vec<u8> {
    use dhcproto::v6::{DhcpOption, DhcpOptions, IAAddr, IANA};
    let b = xid.to_be_bytes();
    let mut m = dhcproto::v6::Message::new_with_id(kind, [b[1], b[2], b[3]]);
    let o = m.opts_mut();
    o.insert(DhcpOption::ClientId([&[0, 3, 0, 1][..], &mac].concat()));
    more(o);
    let mut ia = IANA {
        id: 1,
        t1: 0,
        t2: 0,
        opts: DhcpOptions::default(),
    };
    ia.opts.insert(DhcpOption::IAAddr(IAAddr {
        addr,
        preferred_life: life,
        valid_life: life,
        opts: DhcpOptions::default(),
    }));
    o.insert(DhcpOption::IANA(ia));
    let mut payload = Vec::new();
    m.encode(&mut Encoder::new(&mut payload))
        .expect("a DHCPv6 message encodes");
    payload
}

/// A guest's DHCPv6 client message `payload` in a frame from its MAC and
/// link-local address to `All_DHCP_Relay_Agents_and_Servers` (`ff02::1:2`),
/// port 546 to 547.
pub fn from_guest6(guest: ([u8; 6], std::net::Ipv6Addr), payload: &[u8]) -> Vec<u8> {
    xdhcp::datapath::frame::build_udp6_frame(
        &xdhcp::datapath::frame::Frame6Headers {
            src_mac: guest.0,
            dst_mac: [0x33, 0x33, 0, 1, 0, 2],
            vlan: None,
            src_ip: guest.1,
            dst_ip: std::net::Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 1, 2),
            src_port: 546,
            dst_port: 547,
        },
        payload,
    )
}

/// A server's DHCPv6 message `payload` in a frame from `server` (its MAC
/// and address) to the guest's MAC and link-local address, port 547 to
/// 546.
pub fn to_guest6(
    server: ([u8; 6], std::net::Ipv6Addr),
    guest: ([u8; 6], std::net::Ipv6Addr),
    payload: &[u8],
) -> Vec<u8> {
    xdhcp::datapath::frame::build_udp6_frame(
        &xdhcp::datapath::frame::Frame6Headers {
            src_mac: server.0,
            dst_mac: guest.0,
            vlan: None,
            src_ip: server.1,
            dst_ip: guest.1,
            src_port: 547,
            dst_port: 546,
        },
        payload,
    )
}

/// Sends `frame` on `socket`, a bound packet socket.
///
/// # Panics
/// If the frame is not sent whole.
#[track_caller]
pub fn send(socket: &impl AsRawFd, frame: &[u8]) {
    // SAFETY: sending a buffer we own on an open socket.
    let n = unsafe { libc::send(socket.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
    assert_eq!(
        usize::try_from(n).ok(),
        Some(frame.len()),
        "send: {}",
        std::io::Error::last_os_error()
    );
}

#[cfg(test)]
mod tests {
    use dhcproto::Decodable as _;

    use super::*;

    #[test]
    fn a_server_reply_is_a_bootreply_whose_xid_can_be_rewritten() {
        let reply = Reply {
            kind: MessageType::Ack,
            xid: 0xdead_beef,
            chaddr: [2, 0, 0, 0, 0, 1],
            yiaddr: Ipv4Addr::new(198, 18, 1, 10),
            server: Ipv4Addr::new(198, 18, 0, 1),
            mask: Ipv4Addr::new(255, 255, 252, 0),
        };
        let mut f = server_reply(
            [2, 0, 0, 0, 0, 9],
            [2, 0, 0, 0, 0, 1],
            Ipv4Addr::BROADCAST,
            &reply,
        );
        let (headers, payload) =
            xdhcp::datapath::frame::parse_udp_frame(&f).expect("an IPv4 UDP frame");
        assert_eq!((headers.src_port, headers.dst_port), (67, 68));
        assert_eq!(headers.src_ip, reply.server);
        assert_eq!(payload.len(), 300);
        f[XID_AT..XID_AT + 4].copy_from_slice(&7u32.to_be_bytes());
        let m = Message::decode(&mut dhcproto::Decoder::new(&f[42..])).expect("BOOTP");
        assert_eq!(m.opcode(), Opcode::BootReply);
        assert_eq!(m.xid(), 7);
        assert_eq!(m.yiaddr(), reply.yiaddr);
        assert_eq!(m.chaddr(), &reply.chaddr);
        assert_eq!(m.opts().msg_type(), Some(MessageType::Ack));
        assert_eq!(
            m.opts().get(dhcproto::v4::OptionCode::ServerIdentifier),
            Some(&DhcpOption::ServerIdentifier(reply.server))
        );
    }

    /// A DHCPv6 message carries its type, the transaction's low 24 bits,
    /// the client's DUID-LL, one `IA_NA` (IAID 1) naming the address with
    /// its lifetimes, and what the caller added.
    #[test]
    fn a_dhcpv6_message_names_its_client_ia_and_extras() {
        use dhcproto::v6::{DhcpOption as O6, Message as M6, MessageType as T6, OptionCode};
        let addr: std::net::Ipv6Addr = "fd00:6::1e7".parse().unwrap();
        let mac = [2, 0, 0, 0, 0x30, 1];
        let bytes = dhcp6(T6::Decline, 0xab_12_34_56, mac, (addr, 60), |o| {
            o.insert(O6::ServerId(vec![0, 3, 0, 1, 2, 0, 0, 0, 0, 9]));
        });
        let m = M6::decode(&mut dhcproto::Decoder::new(&bytes)).expect("DHCPv6");
        assert_eq!(m.msg_type(), T6::Decline);
        assert_eq!(m.xid(), [0x12, 0x34, 0x56]);
        assert_eq!(
            m.opts().get(OptionCode::ClientId),
            Some(&O6::ClientId(vec![0, 3, 0, 1, 2, 0, 0, 0, 0x30, 1]))
        );
        assert!(m.opts().get(OptionCode::ServerId).is_some());
        let Some(O6::IANA(ia)) = m.opts().get(OptionCode::IANA) else {
            panic!("no IA_NA: {m:?}");
        };
        assert_eq!(ia.id, 1);
        let Some(O6::IAAddr(a)) = ia.opts.get(OptionCode::IAAddr) else {
            panic!("no IAADDR: {ia:?}");
        };
        assert_eq!((a.addr, a.preferred_life, a.valid_life), (addr, 60, 60));
    }
}
