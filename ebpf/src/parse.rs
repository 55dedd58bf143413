//! The one parser shared by the XDP and TC programs.
//!
//! It reads the fewest bytes that decide: the `EtherType` (and one VLAN tag),
//! the IPv4 protocol byte, then fragment bits, ports, lengths and the `BOOTP`
//! fixed fields only for UDP. Every read is bounds-checked by [`Packet::read`].

use xdhcp_common::{MIN_DHCP_LEN, VLAN_NONE};

const ETH_HLEN: usize = 14;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88a8;
const IPPROTO_UDP: u8 = 17;
const UDP_HLEN: usize = 8;
const BOOTREPLY: u8 = 2;
/// RFC 2131 §3: the magic cookie at offset 236 of the BOOTP message.
const MAGIC_COOKIE: [u8; 4] = [99, 130, 83, 99];
const COOKIE_OFFSET: usize = 236;

/// Bounded access to the frame.
pub(crate) trait Packet {
    /// Length of the frame as the program sees it.
    fn frame_len(&self) -> usize;
    /// Reads a `T` at `offset`, or `None` when it would cross the frame end.
    /// Integer fields are read with one load each whatever their alignment
    /// in the frame (see the implementations).
    fn read<T: Copy>(&self, offset: usize) -> Option<T>;
}

/// A DHCP server→client frame: where its parts are.
pub(crate) struct Dhcp {
    /// VLAN id of the tag in the frame, or [`VLAN_NONE`].
    pub(crate) vlan: u32,
    pub(crate) payload_offset: u32,
    pub(crate) payload_len: u32,
    /// xid as on the wire (network byte order in memory).
    pub(crate) xid: u32,
}

pub(crate) enum Class {
    /// Not IPv4/UDP 67 → 68: ARP, IPv6, TCP, other UDP, ...
    NotDhcp,
    /// Truncated or inconsistent framing.
    Malformed,
    /// An IPv4 fragment of a UDP datagram.
    Fragment,
    Dhcp(Dhcp),
}

#[inline(always)]
pub(crate) fn classify<P: Packet>(pkt: &P) -> Class {
    // Fields are read as the 16/32-bit words they are (one load each, not
    // byte by byte); network-order values are converted with from_be, wire
    // bytes compared as native words.
    let Some(ethertype) = pkt.read::<u16>(12) else {
        return Class::Malformed;
    };
    // Untagged IPv4 first: the common case decides in one compare.
    let (l3, vlan) = if ethertype == ETH_P_IP.to_be() {
        (ETH_HLEN, VLAN_NONE)
    } else if ethertype == ETH_P_8021Q.to_be() || ethertype == ETH_P_8021AD.to_be() {
        let Some([tci, inner]) = pkt.read::<[u16; 2]>(ETH_HLEN) else {
            return Class::Malformed;
        };
        if inner != ETH_P_IP.to_be() {
            return Class::NotDhcp;
        }
        (ETH_HLEN + 4, u32::from(u16::from_be(tci) & 0x0fff))
    } else {
        return Class::NotDhcp;
    };
    // The fixed IPv4 header as ten 16-bit words.
    let Some(ip) = pkt.read::<[u16; 10]>(l3) else {
        return Class::Malformed;
    };
    let [version_ihl, _tos] = ip[0].to_ne_bytes();
    let [_ttl, protocol] = ip[4].to_ne_bytes();
    if protocol != IPPROTO_UDP {
        return Class::NotDhcp;
    }
    let ihl = usize::from(version_ihl & 0x0f) * 4;
    if version_ihl >> 4 != 4 || ihl < 20 {
        return Class::Malformed;
    }
    // More-fragments flag or a fragment offset: not a whole datagram.
    if u16::from_be(ip[3]) & 0x3fff != 0 {
        return Class::Fragment;
    }
    let l4 = l3 + ihl;
    let Some(udp) = pkt.read::<[u16; 4]>(l4) else {
        return Class::Malformed;
    };
    if u16::from_be(udp[0]) != 67 || u16::from_be(udp[1]) != 68 {
        return Class::NotDhcp;
    }
    let total_len = usize::from(u16::from_be(ip[1]));
    let udp_len = usize::from(u16::from_be(udp[2]));
    if udp_len < UDP_HLEN + MIN_DHCP_LEN
        || total_len < ihl + udp_len
        || l3 + total_len > pkt.frame_len()
    {
        return Class::Malformed;
    }
    let payload_offset = l4 + UDP_HLEN;
    // op, htype, hlen, hops; then the xid, as on the wire.
    let Some([op_word, xid]) = pkt.read::<[u32; 2]>(payload_offset) else {
        return Class::Malformed;
    };
    let Some(cookie) = pkt.read::<u32>(payload_offset + COOKIE_OFFSET) else {
        return Class::Malformed;
    };
    if op_word.to_ne_bytes()[0] != BOOTREPLY || cookie != u32::from_ne_bytes(MAGIC_COOKIE) {
        return Class::Malformed;
    }
    Class::Dhcp(Dhcp {
        vlan,
        payload_offset: payload_offset as u32,
        payload_len: (udp_len - UDP_HLEN) as u32,
        xid,
    })
}
