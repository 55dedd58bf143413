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
fn be16(b: [u8; 2]) -> u16 {
    u16::from_be_bytes(b)
}

#[inline(always)]
pub(crate) fn classify<P: Packet>(pkt: &P) -> Class {
    let Some(ethertype) = pkt.read::<[u8; 2]>(12) else {
        return Class::Malformed;
    };
    let mut ethertype = be16(ethertype);
    let mut l3 = ETH_HLEN;
    let mut vlan = VLAN_NONE;
    if ethertype == ETH_P_8021Q || ethertype == ETH_P_8021AD {
        let Some(tag) = pkt.read::<[u8; 4]>(ETH_HLEN) else {
            return Class::Malformed;
        };
        vlan = u32::from(be16([tag[0], tag[1]]) & 0x0fff);
        ethertype = be16([tag[2], tag[3]]);
        l3 += 4;
    }
    if ethertype != ETH_P_IP {
        return Class::NotDhcp;
    }
    let Some(ip) = pkt.read::<[u8; 20]>(l3) else {
        return Class::Malformed;
    };
    if ip[9] != IPPROTO_UDP {
        return Class::NotDhcp;
    }
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    if ip[0] >> 4 != 4 || ihl < 20 {
        return Class::Malformed;
    }
    // More-fragments flag or a fragment offset: not a whole datagram.
    if be16([ip[6], ip[7]]) & 0x3fff != 0 {
        return Class::Fragment;
    }
    let l4 = l3 + ihl;
    let Some(udp) = pkt.read::<[u8; 8]>(l4) else {
        return Class::Malformed;
    };
    if be16([udp[0], udp[1]]) != 67 || be16([udp[2], udp[3]]) != 68 {
        return Class::NotDhcp;
    }
    let total_len = usize::from(be16([ip[2], ip[3]]));
    let udp_len = usize::from(be16([udp[4], udp[5]]));
    if udp_len < UDP_HLEN + MIN_DHCP_LEN
        || total_len < ihl + udp_len
        || l3 + total_len > pkt.frame_len()
    {
        return Class::Malformed;
    }
    let payload_offset = l4 + UDP_HLEN;
    let Some(head) = pkt.read::<[u8; 8]>(payload_offset) else {
        return Class::Malformed;
    };
    let Some(cookie) = pkt.read::<[u8; 4]>(payload_offset + COOKIE_OFFSET) else {
        return Class::Malformed;
    };
    if head[0] != BOOTREPLY || cookie != MAGIC_COOKIE {
        return Class::Malformed;
    }
    Class::Dhcp(Dhcp {
        vlan,
        payload_offset: payload_offset as u32,
        payload_len: (udp_len - UDP_HLEN) as u32,
        xid: u32::from_ne_bytes([head[4], head[5], head[6], head[7]]),
    })
}
