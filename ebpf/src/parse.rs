//! The one parser shared by the XDP and TC programs.
//!
//! It reads the fewest bytes that decide: the `EtherType` (and one VLAN tag),
//! the IPv4 protocol byte, then fragment bits, ports, lengths and the `BOOTP`
//! fixed fields only for UDP. An IPv6 frame is looked at only after the
//! IPv4 test failed, so the IPv4 path costs what it did: its next header,
//! then, for UDP 547 → 546, the message type, the transaction id and the
//! IAID of the first `IA_NA` among the first [`MAX_OPTIONS6`] options.
//! Every read is bounds-checked by [`Packet::read`].

use xdhcp_common::{MAX_FRAME_LEN, MIN_DHCP_LEN, VLAN_NONE};

const ETH_HLEN: usize = 14;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const IPV6_HLEN: usize = 40;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88a8;
const IPPROTO_UDP: u8 = 17;
const UDP_HLEN: usize = 8;
const BOOTREPLY: u8 = 2;
/// RFC 2131 §3: the magic cookie at offset 236 of the BOOTP message.
const MAGIC_COOKIE: [u8; 4] = [99, 130, 83, 99];
const COOKIE_OFFSET: usize = 236;
/// `DHCPv6` ports (RFC 8415 §7.2): server → client.
const DHCP6_SERVER_PORT: u16 = 547;
const DHCP6_CLIENT_PORT: u16 = 546;
/// `DHCPv6` message types a client waits for (RFC 8415 §7.3).
const DHCP6_ADVERTISE: u8 = 2;
const DHCP6_REPLY: u8 = 7;
/// `OPTION_IA_NA` (RFC 8415 §21.4): IAID, T1, T2, then sub-options.
const OPTION_IA_NA: u16 = 3;
/// How many top-level options the IAID is looked for among. Servers put
/// the identifiers first and the `IA_NA` right after them (dnsmasq, Kea
/// and ISC dhcpd all do); a message whose `IA_NA` comes later is passed
/// to the workload's stack, where the lease's socket still reads it.
pub(crate) const MAX_OPTIONS6: usize = 8;

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
    /// xid as on the wire (network byte order in memory); for `DHCPv6`, the
    /// message's first word with the type byte zeroed.
    pub(crate) xid: u32,
    /// `Some(IAID as on the wire)` for a `DHCPv6` ADVERTISE or REPLY.
    pub(crate) iaid6: Option<u32>,
}

pub(crate) enum Class {
    /// Not IPv4/UDP 67 → 68: ARP, IPv6, TCP, other UDP, ...
    NotDhcp,
    /// Truncated or inconsistent framing.
    Malformed,
    /// An IPv4 fragment of a UDP datagram.
    Fragment,
    Dhcp(Dhcp),
    /// A `DHCPv6` ADVERTISE or REPLY with no `IA_NA` among its first
    /// [`MAX_OPTIONS6`] options: nothing to own it by.
    Unkeyed6,
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
        let vlan = u32::from(u16::from_be(tci) & 0x0fff);
        if inner == ETH_P_IPV6.to_be() {
            return classify6(pkt, ETH_HLEN + 4, vlan);
        }
        if inner != ETH_P_IP.to_be() {
            return Class::NotDhcp;
        }
        (ETH_HLEN + 4, vlan)
    } else if ethertype == ETH_P_IPV6.to_be() {
        return classify6(pkt, ETH_HLEN, VLAN_NONE);
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
        iaid6: None,
    })
}

/// The IPv6 part of [`classify`], from the IPv6 header at `l3`. Only a UDP
/// datagram right after the fixed header counts: servers send their
/// replies without extension headers, and a reply with one is passed to
/// the workload's stack, where the lease's own socket reads it.
#[inline(always)]
fn classify6<P: Packet>(pkt: &P, l3: usize, vlan: u32) -> Class {
    // Version, class and flow label; payload length; next header and hop
    // limit.
    let Some([version_class, _flow, payload_len, next_hop]) = pkt.read::<[u16; 4]>(l3) else {
        return Class::Malformed;
    };
    if next_hop.to_ne_bytes()[0] != IPPROTO_UDP {
        return Class::NotDhcp;
    }
    if version_class.to_ne_bytes()[0] >> 4 != 6 {
        return Class::Malformed;
    }
    let l4 = l3 + IPV6_HLEN;
    let Some(udp) = pkt.read::<[u16; 4]>(l4) else {
        return Class::Malformed;
    };
    if u16::from_be(udp[0]) != DHCP6_SERVER_PORT || u16::from_be(udp[1]) != DHCP6_CLIENT_PORT {
        return Class::NotDhcp;
    }
    let payload_len = usize::from(u16::from_be(payload_len));
    let udp_len = usize::from(u16::from_be(udp[2]));
    // The message type and transaction id: four bytes at least.
    if udp_len < UDP_HLEN + 4
        || payload_len < udp_len
        || l3 + IPV6_HLEN + payload_len > pkt.frame_len()
    {
        return Class::Malformed;
    }
    let payload_offset = l4 + UDP_HLEN;
    let Some(head) = pkt.read::<u32>(payload_offset) else {
        return Class::Malformed;
    };
    let [kind, t0, t1, t2] = head.to_ne_bytes();
    if kind != DHCP6_ADVERTISE && kind != DHCP6_REPLY {
        return Class::NotDhcp;
    }
    let Some(iaid) = ia_na_iaid(pkt, payload_offset + 4, payload_offset + udp_len - UDP_HLEN)
    else {
        return Class::Unkeyed6;
    };
    Class::Dhcp(Dhcp {
        vlan,
        payload_offset: payload_offset as u32,
        payload_len: (udp_len - UDP_HLEN) as u32,
        xid: u32::from_ne_bytes([0, t0, t1, t2]),
        iaid6: Some(iaid),
    })
}

/// The IAID (as on the wire) of the first `IA_NA` among the first
/// [`MAX_OPTIONS6`] options between `off` and `end`, when its IAID lies
/// inside the message.
#[inline(always)]
fn ia_na_iaid<P: Packet>(pkt: &P, mut off: usize, end: usize) -> Option<u32> {
    for _ in 0..MAX_OPTIONS6 {
        // The option's code and length, and the four bytes an IAID needs.
        if off + 8 > end {
            return None;
        }
        let [code, len] = pkt.read::<[u16; 2]>(off)?;
        let len = usize::from(u16::from_be(len));
        if code == OPTION_IA_NA.to_be() {
            // IAID, T1, T2: twelve bytes at least.
            return if len >= 12 {
                pkt.read::<u32>(off + 4)
            } else {
                None
            };
        }
        off += 4 + len;
        // A bound the verifier can see on every offset the loop reads at.
        if off > MAX_FRAME_LEN {
            return None;
        }
    }
    None
}
