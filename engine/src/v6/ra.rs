//! Router advertisements (RFC 4861), sans-IO: what `DHCPv6` does not carry.
//!
//! A `DHCPv6` lease is an address and nothing else: no prefix length, no
//! router (RFC 8415 §21.6; RFC 4861 leaves both to router advertisements).
//! This module reads a router advertisement the driver received, checked
//! as RFC 4861 §6.1.2 has a host check it, and derives from the
//! advertisements heard on a link what a leased address needs
//! ([`Router6::for_address`]): the on-link prefix that holds it (a Prefix
//! Information option with the L flag, §4.6.2) and the default router (an
//! advertisement with a non-zero router lifetime, §6.3.4). It also builds
//! the router solicitation (§4.1) a driver sends so it need not wait for the
//! next unsolicited advertisement.
//!
//! ```
//! use std::net::Ipv6Addr;
//! use xdhcp_engine::v6::ra::{RouterAdvert, Router6};
//!
//! // An advertisement: router lifetime 1800 s, prefix 2001:db8:1::/64 on-link.
//! let mut ra = vec![134, 0, 0, 0, 64, 0x80, 0x07, 0x08, 0, 0, 0, 0, 0, 0, 0, 0];
//! ra.extend_from_slice(&[3, 4, 64, 0xc0, 0, 0, 0x0e, 0x10, 0, 0, 0x07, 0x08, 0, 0, 0, 0]);
//! ra.extend_from_slice(&"2001:db8:1::".parse::<Ipv6Addr>().unwrap().octets());
//! let router: Ipv6Addr = "fe80::1".parse().unwrap();
//! let advert = RouterAdvert::parse(&ra, router, 255).unwrap();
//! let got = Router6::for_address(&[advert], "2001:db8:1::55".parse().unwrap());
//! assert_eq!(got, Some(Router6 { prefix_len: Some(64), gateway: Some(router) }));
//! ```

use std::net::Ipv6Addr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// `ICMPv6` type of a router solicitation.
pub const ROUTER_SOLICITATION: u8 = 133;
/// `ICMPv6` type of a router advertisement.
pub const ROUTER_ADVERTISEMENT: u8 = 134;
/// The hop limit every neighbour discovery message is sent with, and the
/// only one a receiver accepts (RFC 4861 §6.1.2): a message that crossed a
/// router is not from this link.
pub const ND_HOP_LIMIT: u8 = 255;
/// All-routers multicast: where a router solicitation goes.
pub const ALL_ROUTERS: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 2);

/// Option types (RFC 4861 §4.6).
const OPT_SOURCE_LINK_ADDR: u8 = 1;
const OPT_PREFIX_INFO: u8 = 3;
/// The fixed part of an advertisement: type, code, checksum, hop limit,
/// flags, router lifetime, reachable time, retrans timer.
const RA_HEADER: usize = 16;

/// Why an advertisement was not believed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RaError {
    /// Not type 134, or a code other than 0.
    #[error("not a router advertisement (ICMPv6 type {0}, code {1})")]
    NotAdvert(u8, u8),
    /// Shorter than the fixed header.
    #[error("{0} bytes, shorter than a router advertisement's 16")]
    Short(usize),
    /// The source is not a link-local address (§6.1.2).
    #[error("source {0} is not link-local")]
    NotLinkLocal(Ipv6Addr),
    /// The hop limit is not 255: it crossed a router (§6.1.2).
    #[error("hop limit {0}, not 255: it crossed a router")]
    HopLimit(u8),
    /// An option with length 0, or one running past the message (§6.1.2).
    #[error("malformed option at byte {0}")]
    BadOption(usize),
}

impl RaError {
    /// Bounded label for metrics.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            RaError::NotAdvert(..) => "ra_not_advert",
            RaError::Short(_) => "ra_short",
            RaError::NotLinkLocal(_) => "ra_not_link_local",
            RaError::HopLimit(_) => "ra_hop_limit",
            RaError::BadOption(_) => "ra_bad_option",
        }
    }
}

/// One Prefix Information option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixInfo {
    pub prefix: Ipv6Addr,
    pub len: u8,
    /// L: the prefix is on-link.
    pub on_link: bool,
    /// A: hosts may form addresses in it (SLAAC).
    pub autonomous: bool,
    pub valid: Duration,
}

impl PrefixInfo {
    /// Whether `a` is inside the prefix.
    #[must_use]
    pub fn contains(&self, a: Ipv6Addr) -> bool {
        if self.len > 128 {
            return false;
        }
        let mask = u128::MAX
            .checked_shl(128 - u32::from(self.len))
            .unwrap_or(0);
        u128::from(a) & mask == u128::from(self.prefix) & mask
    }
}

/// A router advertisement that passed the checks of RFC 4861 §6.1.2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouterAdvert {
    /// The router (the message's link-local source).
    pub router: Ipv6Addr,
    /// How long it is a default router; zero: it is not one (§4.2).
    pub router_lifetime: Duration,
    /// M: addresses are available with `DHCPv6`.
    pub managed: bool,
    /// O: other configuration is available with `DHCPv6`.
    pub other: bool,
    pub prefixes: Vec<PrefixInfo>,
}

impl RouterAdvert {
    /// Check and read `icmp` (the `ICMPv6` message, from its type byte on; the
    /// kernel has verified its checksum), received from `source` with IPv6
    /// hop limit `hop_limit`. Unknown options are skipped (§6.1.2); a
    /// Prefix Information option whose length is not 4 is skipped, not
    /// believed.
    ///
    /// # Errors
    /// [`RaError`]: what RFC 4861 has a host silently discard.
    pub fn parse(icmp: &[u8], source: Ipv6Addr, hop_limit: u8) -> Result<Self, RaError> {
        if icmp.len() < RA_HEADER {
            return Err(RaError::Short(icmp.len()));
        }
        if icmp[0] != ROUTER_ADVERTISEMENT || icmp[1] != 0 {
            return Err(RaError::NotAdvert(icmp[0], icmp[1]));
        }
        if hop_limit != ND_HOP_LIMIT {
            return Err(RaError::HopLimit(hop_limit));
        }
        if !is_link_local(source) {
            return Err(RaError::NotLinkLocal(source));
        }
        let flags = icmp[5];
        let mut ra = RouterAdvert {
            router: source,
            router_lifetime: Duration::from_secs(u64::from(u16::from_be_bytes([icmp[6], icmp[7]]))),
            managed: flags & 0x80 != 0,
            other: flags & 0x40 != 0,
            prefixes: Vec::new(),
        };
        let mut at = RA_HEADER;
        while at < icmp.len() {
            let (Some(&kind), Some(&units)) = (icmp.get(at), icmp.get(at + 1)) else {
                return Err(RaError::BadOption(at));
            };
            let len = usize::from(units) * 8;
            if len == 0 || at + len > icmp.len() {
                return Err(RaError::BadOption(at));
            }
            if kind == OPT_PREFIX_INFO && len == 32 {
                let o = &icmp[at..at + len];
                let mut prefix = [0u8; 16];
                prefix.copy_from_slice(&o[16..32]);
                ra.prefixes.push(PrefixInfo {
                    prefix: Ipv6Addr::from(prefix),
                    len: o[2],
                    on_link: o[3] & 0x80 != 0,
                    autonomous: o[3] & 0x40 != 0,
                    valid: Duration::from_secs(u64::from(u32::from_be_bytes([
                        o[4], o[5], o[6], o[7],
                    ]))),
                });
            }
            at += len;
        }
        Ok(ra)
    }
}

/// What the advertisements on a link give a leased address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Router6 {
    /// The longest on-link prefix holding the address, if one does.
    pub prefix_len: Option<u8>,
    /// A default router (link-local), if one advertises itself as one.
    pub gateway: Option<Ipv6Addr>,
}

impl Router6 {
    /// From the advertisements `heard` (oldest first), what `address`
    /// takes: the longest on-link prefix with a non-zero valid lifetime
    /// that holds it, and the newest router with a non-zero router
    /// lifetime. `None` when they give it neither.
    #[must_use]
    pub fn for_address(heard: &[RouterAdvert], address: Ipv6Addr) -> Option<Self> {
        let prefix_len = heard
            .iter()
            .flat_map(|ra| &ra.prefixes)
            .filter(|p| p.on_link && !p.valid.is_zero() && p.len <= 128 && p.contains(address))
            .map(|p| p.len)
            .max();
        let gateway = heard
            .iter()
            .rev()
            .find(|ra| !ra.router_lifetime.is_zero())
            .map(|ra| ra.router);
        (prefix_len.is_some() || gateway.is_some()).then_some(Router6 {
            prefix_len,
            gateway,
        })
    }
}

/// A router solicitation (§4.1) from a host with link-layer address `mac`:
/// the source link-layer address option included, as a host with an
/// address does (the kernel fills the checksum of a raw `ICMPv6` socket).
#[must_use]
pub fn router_solicitation(mac: [u8; 6]) -> Vec<u8> {
    let mut rs = vec![ROUTER_SOLICITATION, 0, 0, 0, 0, 0, 0, 0];
    rs.extend_from_slice(&[OPT_SOURCE_LINK_ADDR, 1]);
    rs.extend_from_slice(&mac);
    rs
}

fn is_link_local(a: Ipv6Addr) -> bool {
    a.segments()[0] & 0xffc0 == 0xfe80
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROUTER: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);

    fn pio(prefix: &str, len: u8, flags: u8, valid: u32) -> Vec<u8> {
        let mut o = vec![OPT_PREFIX_INFO, 4, len, flags];
        o.extend_from_slice(&valid.to_be_bytes());
        o.extend_from_slice(&valid.to_be_bytes());
        o.extend_from_slice(&[0; 4]);
        o.extend_from_slice(&prefix.parse::<Ipv6Addr>().unwrap().octets());
        o
    }

    fn ra(lifetime: u16, flags: u8, options: &[Vec<u8>]) -> Vec<u8> {
        let mut m = vec![ROUTER_ADVERTISEMENT, 0, 0, 0, 64, flags];
        m.extend_from_slice(&lifetime.to_be_bytes());
        m.extend_from_slice(&[0; 8]);
        for o in options {
            m.extend_from_slice(o);
        }
        m
    }

    fn addr(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    /// dnsmasq's advertisement for a DHCPv6 range: M and O set, the prefix
    /// on-link but not for SLAAC, its link-layer address and MTU options
    /// skipped.
    #[test]
    fn reads_a_managed_advertisement() {
        let sll = vec![OPT_SOURCE_LINK_ADDR, 1, 2, 0, 0, 0, 0, 9];
        let mtu = vec![5, 1, 0, 0, 0, 0, 0x05, 0xdc];
        let m = ra(1800, 0xc0, &[sll, pio("fd00:6::", 64, 0x80, 3600), mtu]);
        let got = RouterAdvert::parse(&m, ROUTER, 255).unwrap();
        assert!(got.managed && got.other);
        assert_eq!(got.router_lifetime, Duration::from_mins(30));
        assert_eq!(
            got.prefixes,
            [PrefixInfo {
                prefix: addr("fd00:6::"),
                len: 64,
                on_link: true,
                autonomous: false,
                valid: Duration::from_hours(1),
            }]
        );
    }

    /// What RFC 4861 §6.1.2 has a host discard: a hop limit other than 255
    /// (an advertisement forwarded from off the link), a global source, a
    /// bad code, a short message, an option of length 0 (which would loop
    /// a reader forever) or one running past the end.
    #[test]
    fn discards_what_the_rfc_discards() {
        let good = ra(1800, 0, &[pio("fd00:6::", 64, 0x80, 3600)]);
        assert_eq!(
            RouterAdvert::parse(&good, ROUTER, 254),
            Err(RaError::HopLimit(254))
        );
        assert_eq!(
            RouterAdvert::parse(&good, addr("fd00:6::1"), 255),
            Err(RaError::NotLinkLocal(addr("fd00:6::1")))
        );
        let mut coded = good.clone();
        coded[1] = 1;
        assert_eq!(
            RouterAdvert::parse(&coded, ROUTER, 255),
            Err(RaError::NotAdvert(134, 1))
        );
        assert_eq!(
            RouterAdvert::parse(&good[..15], ROUTER, 255),
            Err(RaError::Short(15))
        );
        let zero = ra(1800, 0, &[vec![OPT_SOURCE_LINK_ADDR, 0, 0, 0, 0, 0, 0, 0]]);
        assert_eq!(
            RouterAdvert::parse(&zero, ROUTER, 255),
            Err(RaError::BadOption(16))
        );
        let long = ra(1800, 0, &[vec![OPT_PREFIX_INFO, 4, 64, 0x80]]);
        assert_eq!(
            RouterAdvert::parse(&long, ROUTER, 255),
            Err(RaError::BadOption(16))
        );
        let mut solicitation = good;
        solicitation[0] = ROUTER_SOLICITATION;
        assert!(matches!(
            RouterAdvert::parse(&solicitation, ROUTER, 255),
            Err(RaError::NotAdvert(133, 0))
        ));
    }

    /// The longest on-link prefix that holds the address wins; a prefix
    /// that is not on-link, expired, or does not hold it gives nothing; the
    /// newest router with a lifetime is the gateway, one with lifetime 0 is
    /// not a default router.
    #[test]
    fn derives_the_prefix_and_router_of_an_address() {
        let heard = |m: Vec<u8>, from: &str| RouterAdvert::parse(&m, addr(from), 255).unwrap();
        let a = addr("fd00:6:0:1::55");
        let ads = [
            heard(
                ra(
                    1800,
                    0,
                    &[
                        pio("fd00:6::", 48, 0x80, 3600),
                        pio("fd00:6:0:1::", 64, 0x80, 3600),
                        pio("fd00:6:0:1::", 80, 0x40, 3600),
                        pio("fd00:6:0:1::", 96, 0x80, 0),
                        pio("fd00:7::", 64, 0x80, 3600),
                    ],
                ),
                "fe80::1",
            ),
            heard(ra(0, 0, &[]), "fe80::2"),
            heard(ra(600, 0, &[]), "fe80::3"),
        ];
        assert_eq!(
            Router6::for_address(&ads, a),
            Some(Router6 {
                prefix_len: Some(64),
                gateway: Some(addr("fe80::3")),
            })
        );
        // Only a router that is not a default one, and no prefix for it.
        assert_eq!(Router6::for_address(&ads[1..2], a), None);
        assert_eq!(
            Router6::for_address(&ads[..1], addr("fd00:9::1")),
            Some(Router6 {
                prefix_len: None,
                gateway: Some(addr("fe80::1")),
            })
        );
    }

    #[test]
    fn a_solicitation_names_the_hosts_link_layer_address() {
        assert_eq!(
            router_solicitation([2, 0, 0, 0, 0, 9]),
            [133, 0, 0, 0, 0, 0, 0, 0, 1, 1, 2, 0, 0, 0, 0, 9]
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(5000))]

        /// Whatever arrives: no panic; what is believed passed the checks
        /// (type, code, hop limit, link-local source), carries no more
        /// prefixes than the message has room for, and gives an address
        /// only a prefix that holds it, on-link and valid, and only a
        /// router that advertised a lifetime.
        #[test]
        fn any_message_is_read_or_refused_and_what_is_derived_holds(
            body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200),
            pios in proptest::collection::vec(
                (proptest::prelude::any::<u128>(), 0u8..=130, proptest::prelude::any::<u8>(),
                 proptest::prelude::any::<u32>()),
                0..4,
            ),
            lifetime in proptest::prelude::any::<u16>(),
            hop_limit in proptest::prelude::any::<u8>(),
            source in proptest::prelude::any::<u128>(),
            address in proptest::prelude::any::<u128>(),
            well_formed in proptest::prelude::any::<bool>(),
        ) {
            // Half the cases a framed advertisement (so the option walk and
            // the derivation are reached), half arbitrary bytes.
            let msg = if well_formed {
                let opts: Vec<Vec<u8>> = pios
                    .iter()
                    .map(|&(p, len, flags, valid)| {
                        pio(&Ipv6Addr::from(p).to_string(), len, flags, valid)
                    })
                    .chain(std::iter::once(body.clone()))
                    .collect();
                ra(lifetime, 0, &opts)
            } else {
                body
            };
            let source = if well_formed { Ipv6Addr::from((0xfe80u128 << 112) | (source >> 16)) }
                else { Ipv6Addr::from(source) };
            let address = Ipv6Addr::from(address);
            if let Ok(advert) = RouterAdvert::parse(&msg, source, hop_limit) {
                proptest::prop_assert_eq!(hop_limit, ND_HOP_LIMIT);
                proptest::prop_assert_eq!((msg[0], msg[1]), (ROUTER_ADVERTISEMENT, 0));
                proptest::prop_assert!(is_link_local(advert.router));
                proptest::prop_assert!(advert.prefixes.len() <= (msg.len() - RA_HEADER) / 32);
                let heard = [advert.clone()];
                if let Some(r) = Router6::for_address(&heard, address) {
                    if let Some(len) = r.prefix_len {
                        proptest::prop_assert!(advert.prefixes.iter().any(|p| p.len == len
                            && p.on_link && !p.valid.is_zero() && p.contains(address)));
                    }
                    if let Some(gw) = r.gateway {
                        proptest::prop_assert_eq!(gw, advert.router);
                        proptest::prop_assert!(!advert.router_lifetime.is_zero());
                    }
                }
            }
        }
    }

    #[test]
    fn a_prefix_holds_what_its_bits_say() {
        let p = |s: &str, len| PrefixInfo {
            prefix: addr(s),
            len,
            on_link: true,
            autonomous: false,
            valid: Duration::from_secs(1),
        };
        assert!(p("fd00:6::", 64).contains(addr("fd00:6::ffff")));
        assert!(!p("fd00:6::", 64).contains(addr("fd00:6:0:1::")));
        assert!(p("::", 0).contains(addr("2001:db8::1")));
        assert!(p("fd00:6::1", 128).contains(addr("fd00:6::1")));
        assert!(!p("fd00:6::1", 129).contains(addr("fd00:6::1")));
    }
}
