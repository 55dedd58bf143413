//! Ethernet/IPv4/UDP framing around DHCP payloads, in both directions.
//!
//! [`parse_udp_frame`] accepts what the kernel program accepts: Ethernet,
//! at most one 802.1Q/802.1ad tag, IPv4 with any header length (IHL 5..15),
//! not a fragment, UDP. [`build_udp_frame`] writes IHL=5 frames with valid
//! IPv4 and UDP checksums (the raw-socket sender bypasses the stack, so
//! nothing else fills them in).

use std::net::{Ipv4Addr, Ipv6Addr};

/// `EtherType` of IPv4.
pub const ETH_P_IP: u16 = 0x0800;
/// `EtherType` of IPv6.
pub const ETH_P_IPV6: u16 = 0x86dd;
/// `EtherType` (TPID) of an 802.1Q VLAN tag.
pub const ETH_P_8021Q: u16 = 0x8100;
/// `EtherType` (TPID) of an 802.1ad service VLAN tag.
pub const ETH_P_8021AD: u16 = 0x88a8;

const ETH_HLEN: usize = 14;
const VLAN_HLEN: usize = 4;
const IPV4_MIN_HLEN: usize = 20;
const IPV6_HLEN: usize = 40;
const UDP_HLEN: usize = 8;
const IPPROTO_UDP: u8 = 17;
/// TTL of frames we build (RFC 1700 default).
const DEFAULT_TTL: u8 = 64;

/// Addresses and ports of a UDP-in-IP-in-Ethernet frame: IPv4 by default,
/// [`Frame6Headers`] for IPv6.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeaders<A = Ipv4Addr> {
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    /// VLAN id (12 bits) of the one tag, if any.
    pub vlan: Option<u16>,
    pub src_ip: A,
    pub dst_ip: A,
    pub src_port: u16,
    pub dst_port: u16,
}

/// Addresses and ports of a UDP-in-IPv6-in-Ethernet frame.
pub type Frame6Headers = FrameHeaders<Ipv6Addr>;

/// Why a frame is not a UDP-in-IPv4 (or, for [`parse_udp6_frame`],
/// UDP-in-IPv6) datagram we accept.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    /// The frame ends before the header `what` (needs `need` bytes, has `have`).
    #[error("frame truncated in the {what} header: need {need} bytes, have {have}")]
    Truncated {
        what: &'static str,
        need: usize,
        have: usize,
    },
    /// The `EtherType` (after an optional tag) is not IPv4.
    #[error("not IPv4 (EtherType {ethertype:#06x})")]
    NotIpv4 { ethertype: u16 },
    /// The IP version nibble is not 4.
    #[error("IP version {version} in an IPv4 EtherType frame")]
    BadVersion { version: u8 },
    /// IHL below 5 words.
    #[error("bad IPv4 header length {ihl} (words)")]
    BadIhl { ihl: u8 },
    /// The IPv4 header checksum does not verify.
    #[error("bad IPv4 header checksum")]
    BadIpChecksum,
    /// More-fragments set or a fragment offset: not a whole datagram.
    #[error("IPv4 fragment (flags/offset {flags_offset:#06x})")]
    Fragment { flags_offset: u16 },
    /// IP protocol is not UDP.
    #[error("not UDP (IP protocol {protocol})")]
    NotUdp { protocol: u8 },
    /// The `EtherType` (after an optional tag) is not IPv6.
    #[error("not IPv6 (EtherType {ethertype:#06x})")]
    NotIpv6 { ethertype: u16 },
    /// A length field disagrees with the frame.
    #[error("bad {what} length {len} (available {available})")]
    BadLength {
        what: &'static str,
        len: usize,
        available: usize,
    },
    /// Not a duplicate address detection probe ([`parse_dad_frame`]).
    #[error("not a duplicate address detection probe: {0}")]
    NotDad(&'static str),
}

/// The Ethernet header and one optional tag.
struct Ethernet {
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    vlan: Option<u16>,
    /// After the tag.
    ethertype: u16,
    /// Offset of the network header.
    l3: usize,
}

fn ethernet(frame: &[u8]) -> Result<Ethernet, FrameError> {
    let have = frame.len();
    let eth = frame.get(..ETH_HLEN).ok_or(FrameError::Truncated {
        what: "Ethernet",
        need: ETH_HLEN,
        have,
    })?;
    let dst_mac: [u8; 6] = eth[0..6].try_into().expect("6 bytes");
    let src_mac: [u8; 6] = eth[6..12].try_into().expect("6 bytes");
    let ethertype = be16(&eth[12..14]);
    if ethertype != ETH_P_8021Q && ethertype != ETH_P_8021AD {
        return Ok(Ethernet {
            dst_mac,
            src_mac,
            vlan: None,
            ethertype,
            l3: ETH_HLEN,
        });
    }
    let tag = frame
        .get(ETH_HLEN..ETH_HLEN + VLAN_HLEN)
        .ok_or(FrameError::Truncated {
            what: "VLAN",
            need: ETH_HLEN + VLAN_HLEN,
            have,
        })?;
    Ok(Ethernet {
        dst_mac,
        src_mac,
        vlan: Some(be16(&tag[0..2]) & 0x0fff),
        ethertype: be16(&tag[2..4]),
        l3: ETH_HLEN + VLAN_HLEN,
    })
}

/// Parse Ethernet (+ optional one 802.1Q/802.1ad tag) / IPv6 with no
/// extension header / ICMPv6 neighbour solicitation for duplicate address
/// detection (RFC 4862 §5.4.2): from `::`, hop limit 255 (RFC 4861 §7.1.1),
/// type 135 code 0, to the solicited-node multicast address of its target
/// (RFC 4291 §2.7.1); returns the headers (ports 0) and the target.
pub fn parse_dad_frame(frame: &[u8]) -> Result<(Frame6Headers, Ipv6Addr), FrameError> {
    let have = frame.len();
    let eth = ethernet(frame)?;
    if eth.ethertype != ETH_P_IPV6 {
        return Err(FrameError::NotIpv6 {
            ethertype: eth.ethertype,
        });
    }
    let l3 = eth.l3;
    let need = l3 + IPV6_HLEN + 24;
    let ip = frame.get(l3..need).ok_or(FrameError::Truncated {
        what: "neighbour solicitation",
        need,
        have,
    })?;
    let octets = |b: &[u8]| -> Ipv6Addr {
        let a: [u8; 16] = b.try_into().expect("16 bytes");
        Ipv6Addr::from(a)
    };
    let (src_ip, dst_ip) = (octets(&ip[8..24]), octets(&ip[24..40]));
    let icmp = &ip[IPV6_HLEN..];
    let target = octets(&icmp[8..24]);
    let solicited = {
        let t = target.octets();
        Ipv6Addr::new(
            0xff02,
            0,
            0,
            0,
            0,
            1,
            0xff00 | u16::from(t[13]),
            u16::from_be_bytes([t[14], t[15]]),
        )
    };
    let why = if ip[0] >> 4 != 6 {
        Some("not IPv6")
    } else if ip[6] != 58 || icmp[0] != 135 || icmp[1] != 0 {
        Some("not a neighbour solicitation")
    } else if ip[7] != 255 {
        Some("hop limit is not 255")
    } else if !src_ip.is_unspecified() {
        Some("its source is an address")
    } else if dst_ip != solicited {
        Some("not sent to its target's solicited-node address")
    } else {
        None
    };
    if let Some(why) = why {
        return Err(FrameError::NotDad(why));
    }
    let headers = FrameHeaders {
        src_mac: eth.src_mac,
        dst_mac: eth.dst_mac,
        vlan: eth.vlan,
        src_ip,
        dst_ip,
        src_port: 0,
        dst_port: 0,
    };
    Ok((headers, target))
}

/// Parse Ethernet (+ optional one 802.1Q/802.1ad tag) / IPv6 with no
/// extension header / UDP, as the kernel program accepts a `DHCPv6` server
/// message; returns the headers and the UDP payload (trailing Ethernet
/// padding excluded). The UDP checksum is not verified, for the reason
/// [`parse_udp_frame`] gives.
pub fn parse_udp6_frame(frame: &[u8]) -> Result<(Frame6Headers, &[u8]), FrameError> {
    let have = frame.len();
    let eth = ethernet(frame)?;
    let (ethertype, l3) = (eth.ethertype, eth.l3);
    if ethertype != ETH_P_IPV6 {
        return Err(FrameError::NotIpv6 { ethertype });
    }
    let ip = frame.get(l3..l3 + IPV6_HLEN).ok_or(FrameError::Truncated {
        what: "IPv6",
        need: l3 + IPV6_HLEN,
        have,
    })?;
    let version = ip[0] >> 4;
    if version != 6 {
        return Err(FrameError::BadVersion { version });
    }
    let protocol = ip[6];
    if protocol != IPPROTO_UDP {
        return Err(FrameError::NotUdp { protocol });
    }
    let payload_len = usize::from(be16(&ip[4..6]));
    let available = have - l3 - IPV6_HLEN;
    if payload_len < UDP_HLEN || payload_len > available {
        return Err(FrameError::BadLength {
            what: "IPv6 payload",
            len: payload_len,
            available,
        });
    }
    let octets = |b: &[u8]| -> Ipv6Addr {
        let a: [u8; 16] = b.try_into().expect("16 bytes");
        Ipv6Addr::from(a)
    };
    let (src_ip, dst_ip) = (octets(&ip[8..24]), octets(&ip[24..40]));
    udp_datagram(frame, &eth, l3 + IPV6_HLEN, payload_len, (src_ip, dst_ip))
}

/// The UDP datagram at `l4`, of which the IP header says `available` bytes
/// are there (checked to lie inside the frame), with the frame's addresses:
/// its headers and payload (trailing Ethernet padding excluded).
fn udp_datagram<'f, A>(
    frame: &'f [u8],
    eth: &Ethernet,
    l4: usize,
    available: usize,
    (src_ip, dst_ip): (A, A),
) -> Result<(FrameHeaders<A>, &'f [u8]), FrameError> {
    let udp = &frame[l4..l4 + UDP_HLEN];
    let udp_len = usize::from(be16(&udp[4..6]));
    if udp_len < UDP_HLEN || udp_len > available {
        return Err(FrameError::BadLength {
            what: "UDP",
            len: udp_len,
            available,
        });
    }
    let headers = FrameHeaders {
        src_mac: eth.src_mac,
        dst_mac: eth.dst_mac,
        vlan: eth.vlan,
        src_ip,
        dst_ip,
        src_port: be16(&udp[0..2]),
        dst_port: be16(&udp[2..4]),
    };
    Ok((headers, &frame[l4 + UDP_HLEN..l4 + udp_len]))
}

/// Parse Ethernet (+ optional one 802.1Q/802.1ad tag) / IPv4 (any IHL 5..15) /
/// UDP; returns the headers and the UDP payload (trailing Ethernet padding
/// excluded). The IPv4 header checksum is verified. The UDP checksum is not:
/// frames captured on the receive path of a veth (XDP or TC) still carry the
/// partial checksum of a `CHECKSUM_PARTIAL` skb, which is not an error.
pub fn parse_udp_frame(frame: &[u8]) -> Result<(FrameHeaders, &[u8]), FrameError> {
    let have = frame.len();
    let eth = ethernet(frame)?;
    let (ethertype, l3) = (eth.ethertype, eth.l3);
    if ethertype != ETH_P_IP {
        return Err(FrameError::NotIpv4 { ethertype });
    }
    let ip_fixed = frame
        .get(l3..l3 + IPV4_MIN_HLEN)
        .ok_or(FrameError::Truncated {
            what: "IPv4",
            need: l3 + IPV4_MIN_HLEN,
            have,
        })?;
    let version = ip_fixed[0] >> 4;
    if version != 4 {
        return Err(FrameError::BadVersion { version });
    }
    let ihl = ip_fixed[0] & 0x0f;
    if ihl < 5 {
        return Err(FrameError::BadIhl { ihl });
    }
    let ip_hlen = usize::from(ihl) * 4;
    let ip_hdr = frame.get(l3..l3 + ip_hlen).ok_or(FrameError::Truncated {
        what: "IPv4 options",
        need: l3 + ip_hlen,
        have,
    })?;
    let flags_offset = be16(&ip_hdr[6..8]);
    if flags_offset & 0x3fff != 0 {
        return Err(FrameError::Fragment { flags_offset });
    }
    let protocol = ip_hdr[9];
    if protocol != IPPROTO_UDP {
        return Err(FrameError::NotUdp { protocol });
    }
    if checksum(&[ip_hdr]) != 0 {
        return Err(FrameError::BadIpChecksum);
    }
    let total_len = usize::from(be16(&ip_hdr[2..4]));
    let available = have - l3;
    if total_len < ip_hlen + UDP_HLEN || total_len > available {
        return Err(FrameError::BadLength {
            what: "IPv4 total",
            len: total_len,
            available,
        });
    }
    let src_ip = Ipv4Addr::new(ip_hdr[12], ip_hdr[13], ip_hdr[14], ip_hdr[15]);
    let dst_ip = Ipv4Addr::new(ip_hdr[16], ip_hdr[17], ip_hdr[18], ip_hdr[19]);
    udp_datagram(
        frame,
        &eth,
        l3 + ip_hlen,
        total_len - ip_hlen,
        (src_ip, dst_ip),
    )
}

/// Build a frame with IHL=5, correct IPv4 header checksum and UDP checksum,
/// optional VLAN tag (802.1Q, priority 0). The payload must fit a UDP datagram
/// (at most 65507 bytes); longer payloads are a caller bug and panic.
pub fn build_udp_frame(h: &FrameHeaders, payload: &[u8]) -> Vec<u8> {
    let udp_len = UDP_HLEN + payload.len();
    let total_len = IPV4_MIN_HLEN + udp_len;
    let total_len_u16 = u16::try_from(total_len).expect("UDP payload larger than an IPv4 datagram");
    let l2 = ETH_HLEN + if h.vlan.is_some() { VLAN_HLEN } else { 0 };
    let mut f = Vec::with_capacity(l2 + total_len);
    f.extend_from_slice(&h.dst_mac);
    f.extend_from_slice(&h.src_mac);
    if let Some(vid) = h.vlan {
        f.extend_from_slice(&ETH_P_8021Q.to_be_bytes());
        f.extend_from_slice(&(vid & 0x0fff).to_be_bytes());
    }
    f.extend_from_slice(&ETH_P_IP.to_be_bytes());
    let ip_start = f.len();
    f.extend_from_slice(&[0x45, 0x00]);
    f.extend_from_slice(&total_len_u16.to_be_bytes());
    f.extend_from_slice(&[0, 0, 0, 0]); // id 0, no flags, offset 0
    f.extend_from_slice(&[DEFAULT_TTL, IPPROTO_UDP, 0, 0]);
    f.extend_from_slice(&h.src_ip.octets());
    f.extend_from_slice(&h.dst_ip.octets());
    seal_ipv4_header(&mut f[ip_start..ip_start + IPV4_MIN_HLEN]);
    let udp_start = f.len();
    f.extend_from_slice(&h.src_port.to_be_bytes());
    f.extend_from_slice(&h.dst_port.to_be_bytes());
    f.extend_from_slice(&((udp_len) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(payload);
    let mut udp_csum = udp_checksum(h.src_ip, h.dst_ip, &f[udp_start..]);
    if udp_csum == 0 {
        // RFC 768: a computed zero is sent as all ones.
        udp_csum = 0xffff;
    }
    f[udp_start + 6..udp_start + 8].copy_from_slice(&udp_csum.to_be_bytes());
    f
}

/// Build an Ethernet (optional 802.1Q tag) / IPv6 / UDP frame with a valid
/// UDP checksum (RFC 8200 §8.1), hop limit 64 and no extension header.
/// The payload must fit a UDP datagram; longer payloads are a caller bug
/// and panic.
pub fn build_udp6_frame(h: &Frame6Headers, payload: &[u8]) -> Vec<u8> {
    let udp_len = u16::try_from(UDP_HLEN + payload.len()).expect("payload fits a UDP datagram");
    let mut f = Vec::with_capacity(ETH_HLEN + VLAN_HLEN + IPV6_HLEN + usize::from(udp_len));
    f.extend_from_slice(&h.dst_mac);
    f.extend_from_slice(&h.src_mac);
    if let Some(vid) = h.vlan {
        f.extend_from_slice(&ETH_P_8021Q.to_be_bytes());
        f.extend_from_slice(&(vid & 0x0fff).to_be_bytes());
    }
    f.extend_from_slice(&ETH_P_IPV6.to_be_bytes());
    f.extend_from_slice(&[0x60, 0, 0, 0]);
    f.extend_from_slice(&udp_len.to_be_bytes());
    f.extend_from_slice(&[IPPROTO_UDP, DEFAULT_TTL]);
    f.extend_from_slice(&h.src_ip.octets());
    f.extend_from_slice(&h.dst_ip.octets());
    let udp_start = f.len();
    f.extend_from_slice(&h.src_port.to_be_bytes());
    f.extend_from_slice(&h.dst_port.to_be_bytes());
    f.extend_from_slice(&udp_len.to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(payload);
    let len = u32::from(udp_len).to_be_bytes();
    let pseudo_tail = [len[0], len[1], len[2], len[3], 0, 0, 0, IPPROTO_UDP];
    let mut csum = checksum(&[
        &h.src_ip.octets(),
        &h.dst_ip.octets(),
        &pseudo_tail,
        &f[udp_start..],
    ]);
    if csum == 0 {
        csum = 0xffff;
    }
    f[udp_start + 6..udp_start + 8].copy_from_slice(&csum.to_be_bytes());
    f
}

/// The EUI-64 link-local address of `mac` (RFC 4291 appendix A): what a
/// Linux interface with that MAC takes by default.
pub(crate) fn link_local(mac: [u8; 6]) -> Ipv6Addr {
    let mut a = [0u8; 16];
    a[..2].copy_from_slice(&[0xfe, 0x80]);
    a[8..11].copy_from_slice(&[mac[0] ^ 0x02, mac[1], mac[2]]);
    a[11..13].copy_from_slice(&[0xff, 0xfe]);
    a[13..].copy_from_slice(&mac[3..]);
    Ipv6Addr::from(a)
}

/// Writes the RFC 1071 checksum of the IPv4 header `ip_header` (the whole
/// header, options included) into its checksum field, e.g. after editing it.
///
/// # Panics
/// If `ip_header` is shorter than the 20-byte minimum header.
pub fn seal_ipv4_header(ip_header: &mut [u8]) {
    ip_header[10..12].copy_from_slice(&[0, 0]);
    let c = checksum(&[ip_header]);
    ip_header[10..12].copy_from_slice(&c.to_be_bytes());
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

/// RFC 1071 Internet checksum over the concatenation of `parts` (each part
/// starts on an even offset except possibly the last).
fn checksum(parts: &[&[u8]]) -> u16 {
    let mut sum: u32 = 0;
    for part in parts {
        let mut chunks = part.chunks_exact(2);
        for c in &mut chunks {
            sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
        }
        if let [last] = chunks.remainder() {
            sum += u32::from(u16::from_be_bytes([*last, 0]));
        }
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// UDP checksum with the IPv4 pseudo-header (RFC 768). Over a datagram whose
/// checksum field is filled in, a correct one yields 0.
fn udp_checksum(src: Ipv4Addr, dst: Ipv4Addr, datagram: &[u8]) -> u16 {
    let len = (datagram.len() as u16).to_be_bytes();
    let pseudo = [
        src.octets()[0],
        src.octets()[1],
        src.octets()[2],
        src.octets()[3],
        dst.octets()[0],
        dst.octets()[1],
        dst.octets()[2],
        dst.octets()[3],
        0,
        IPPROTO_UDP,
        len[0],
        len[1],
    ];
    checksum(&[&pseudo, datagram])
}

#[cfg(test)]
mod tests6 {
    use super::*;

    #[test]
    fn a_macs_link_local_address_is_its_eui_64_one() {
        // RFC 4291 appendix A: the universal/local bit flipped, ff:fe in
        // the middle.
        assert_eq!(
            link_local([0x52, 0x54, 0x00, 0x12, 0x34, 0x56]),
            "fe80::5054:ff:fe12:3456".parse::<Ipv6Addr>().unwrap()
        );
        assert_eq!(
            link_local([0x02, 0, 0, 0, 0, 0x01]),
            "fe80::ff:fe00:1".parse::<Ipv6Addr>().unwrap()
        );
    }

    fn headers(vlan: Option<u16>) -> Frame6Headers {
        Frame6Headers {
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            vlan,
            src_ip: "fe80::1".parse().unwrap(),
            dst_ip: "fe80::2".parse().unwrap(),
            src_port: 547,
            dst_port: 546,
        }
    }

    #[test]
    fn an_ipv6_frame_parses_back_to_what_built_it_with_or_without_a_tag() {
        for vlan in [None, Some(42)] {
            let mut f = build_udp6_frame(&headers(vlan), b"\x07\x01\x02\x03rest");
            f.extend_from_slice(&[0; 6]); // Ethernet padding
            let (h, payload) = parse_udp6_frame(&f).unwrap();
            assert_eq!(h, headers(vlan));
            assert_eq!(payload, b"\x07\x01\x02\x03rest");
            // The UDP checksum verifies over the pseudo-header.
            let l4 = if vlan.is_some() { 58 } else { 54 };
            let udp = &f[l4..f.len() - 6];
            let len = (udp.len() as u32).to_be_bytes();
            let tail = [len[0], len[1], len[2], len[3], 0, 0, 0, 17];
            let (src, dst) = (h.src_ip.octets(), h.dst_ip.octets());
            assert_eq!(checksum(&[&src, &dst, &tail, udp]), 0);
        }
    }

    #[test]
    fn an_ipv6_frame_that_lies_about_its_lengths_or_is_not_udp_is_refused() {
        let f = build_udp6_frame(&headers(None), b"\x07\x01\x02\x03");
        assert!(matches!(
            parse_udp6_frame(&f[..50]),
            Err(FrameError::Truncated { .. })
        ));
        let mut long = f.clone();
        long[18..20].copy_from_slice(&500u16.to_be_bytes());
        assert!(matches!(
            parse_udp6_frame(&long),
            Err(FrameError::BadLength { .. })
        ));
        let mut udp_long = f.clone();
        udp_long[58..60].copy_from_slice(&13u16.to_be_bytes());
        assert!(matches!(
            parse_udp6_frame(&udp_long),
            Err(FrameError::BadLength { .. })
        ));
        let mut hop_by_hop = f.clone();
        hop_by_hop[20] = 0;
        assert_eq!(
            parse_udp6_frame(&hop_by_hop),
            Err(FrameError::NotUdp { protocol: 0 })
        );
        let mut v4 = f;
        v4[12..14].copy_from_slice(&ETH_P_IP.to_be_bytes());
        assert!(matches!(
            parse_udp6_frame(&v4),
            Err(FrameError::NotIpv6 { .. })
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(vlan: Option<u16>) -> FrameHeaders {
        FrameHeaders {
            src_mac: [0x02, 0, 0, 0, 0, 1],
            dst_mac: [0xff; 6],
            vlan,
            src_ip: Ipv4Addr::new(192, 0, 2, 1),
            dst_ip: Ipv4Addr::BROADCAST,
            src_port: 67,
            dst_port: 68,
        }
    }

    #[test]
    fn build_then_parse_round_trips_with_and_without_vlan() {
        for vlan in [None, Some(100), Some(4095)] {
            let payload: Vec<u8> = (0..=255u8).cycle().take(301).collect(); // odd length
            let f = build_udp_frame(&headers(vlan), &payload);
            assert_eq!(f.len(), 14 + vlan.map_or(0, |_| 4) + 20 + 8 + 301);
            let (h, p) = parse_udp_frame(&f).expect("parses");
            assert_eq!(h, headers(vlan));
            assert_eq!(p, &payload[..]);
        }
    }

    #[test]
    fn build_writes_known_checksums() {
        // Reference: IPv4 header checksum of this exact header computed by hand
        // (RFC 1071 example style): 45 00 00 1d 00 00 00 00 40 11 ..
        let f = build_udp_frame(&headers(None), b"x");
        let ip = &f[14..34];
        assert_eq!(checksum(&[ip]), 0, "IPv4 header checksum verifies");
        assert_ne!(&ip[10..12], &[0, 0]);
        let udp = &f[34..];
        assert_ne!(&udp[6..8], &[0, 0], "UDP checksum filled in");
        assert_eq!(
            udp_checksum(headers(None).src_ip, Ipv4Addr::BROADCAST, udp),
            0
        );
    }

    #[test]
    fn parse_accepts_ihl_above_five_and_ethernet_padding() {
        let mut f = build_udp_frame(&headers(None), &[1, 2, 3, 4]);
        // Insert 8 bytes of options (two NOPs words... use NOP/EOL) → IHL 7.
        let opts = [1u8, 1, 1, 1, 1, 1, 1, 0];
        f.splice(34..34, opts);
        f[14] = 0x47;
        let total = u16::from_be_bytes([f[16], f[17]]) + 8;
        f[16..18].copy_from_slice(&total.to_be_bytes());
        seal_ipv4_header(&mut f[14..42]);
        f.resize(80, 0); // padding after the datagram
        let (h, p) = parse_udp_frame(&f).expect("parses");
        assert_eq!(h.src_port, 67);
        assert_eq!(p, &[1, 2, 3, 4]);
    }

    #[test]
    fn parse_rejects_every_truncation() {
        let f = build_udp_frame(&headers(Some(7)), &[9; 40]);
        for cut in 0..f.len() {
            assert!(parse_udp_frame(&f[..cut]).is_err(), "cut at {cut} accepted");
        }
    }

    #[test]
    fn parse_reports_typed_errors() {
        let good = build_udp_frame(&headers(None), &[0; 8]);
        let mut arp = good.clone();
        arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        assert_eq!(
            parse_udp_frame(&arp),
            Err(FrameError::NotIpv4 { ethertype: 0x0806 })
        );

        let mut frag = good.clone();
        frag[20] = 0x20; // MF
        assert!(matches!(
            parse_udp_frame(&frag),
            Err(FrameError::Fragment { .. })
        ));

        let mut tcp = good.clone();
        tcp[23] = 6;
        assert_eq!(
            parse_udp_frame(&tcp),
            Err(FrameError::NotUdp { protocol: 6 })
        );

        let mut ihl = good.clone();
        ihl[14] = 0x44;
        assert_eq!(parse_udp_frame(&ihl), Err(FrameError::BadIhl { ihl: 4 }));

        let mut v6 = good.clone();
        v6[14] = 0x65;
        assert_eq!(
            parse_udp_frame(&v6),
            Err(FrameError::BadVersion { version: 6 })
        );

        let mut ipsum = good.clone();
        ipsum[22] ^= 1; // TTL changes, checksum stale
        assert_eq!(parse_udp_frame(&ipsum), Err(FrameError::BadIpChecksum));

        let mut partial = good.clone();
        partial[40..42].copy_from_slice(&[0x12, 0x34]); // offloaded, not final
        assert!(parse_udp_frame(&partial).is_ok());

        let mut udplen = good.clone();
        udplen[38..40].copy_from_slice(&4u16.to_be_bytes());
        assert!(matches!(
            parse_udp_frame(&udplen),
            Err(FrameError::BadLength { what: "UDP", .. })
        ));
    }
}
