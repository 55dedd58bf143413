//! Classless static routes (option 121, RFC 3442) and the route policy that
//! guards against route injection (CVE-2024-3661, `TunnelVision`).
//!
//! Decoding is all-or-nothing: one impossible prefix length or one short entry
//! rejects the whole option (a half-applied route table is a wrong lease).
//! Host bits beyond the prefix length are zeroed, so `10.1.2.3/8` becomes
//! `10.0.0.0/8` (the kernel refuses routes with host bits set).

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// One route: `dest/prefix_len via gateway`. A gateway of `0.0.0.0` means
/// "on-link" (no next hop).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Route {
    pub dest: Ipv4Addr,
    pub prefix_len: u8,
    pub gateway: Ipv4Addr,
}

impl Route {
    /// The prefix this route covers.
    pub fn prefix(&self) -> Ipv4Prefix {
        Ipv4Prefix {
            addr: self.dest,
            len: self.prefix_len,
        }
    }

    /// `0.0.0.0/0`.
    pub fn is_default(&self) -> bool {
        self.prefix_len == 0
    }
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{} via {}", self.dest, self.prefix_len, self.gateway)
    }
}

/// An IPv4 prefix such as `10.128.0.0/14` (host bits are always zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Ipv4Prefix {
    pub addr: Ipv4Addr,
    pub len: u8,
}

/// Netmask for a prefix length (`len` is clamped to 32).
pub fn mask(len: u8) -> u32 {
    match len {
        0 => 0,
        l if l >= 32 => u32::MAX,
        l => u32::MAX << (32 - u32::from(l)),
    }
}

impl Ipv4Prefix {
    /// Build a prefix, zeroing host bits. `None` when `len > 32`.
    pub fn new(addr: Ipv4Addr, len: u8) -> Option<Self> {
        (len <= 32).then(|| Self {
            addr: Ipv4Addr::from(u32::from(addr) & mask(len)),
            len,
        })
    }

    /// Whether `self` contains every address of `other` (so `other` is equal
    /// or more specific).
    pub fn contains(&self, other: &Ipv4Prefix) -> bool {
        other.len >= self.len && (u32::from(other.addr) & mask(self.len)) == u32::from(self.addr)
    }

    /// Whether the two prefixes share any address (one contains the other).
    pub fn overlaps(&self, other: &Ipv4Prefix) -> bool {
        self.contains(other) || other.contains(self)
    }

    /// Whether `addr` is inside the prefix.
    pub fn contains_addr(&self, addr: Ipv4Addr) -> bool {
        (u32::from(addr) & mask(self.len)) == u32::from(self.addr)
    }
}

impl fmt::Display for Ipv4Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// Error parsing an [`Ipv4Prefix`] from text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid IPv4 prefix {input:?}: expected a.b.c.d/len with len <= 32 and no host bits")]
pub struct PrefixParseError {
    pub input: String,
}

impl FromStr for Ipv4Prefix {
    type Err = PrefixParseError;

    /// Parses `a.b.c.d/len`; host bits must be zero (a typo such as
    /// `10.0.0.1/8` in a policy is an error, not silently widened).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || PrefixParseError {
            input: s.to_owned(),
        };
        let (addr, len) = s.split_once('/').ok_or_else(err)?;
        let addr: Ipv4Addr = addr.parse().map_err(|_| err())?;
        let len: u8 = len.parse().map_err(|_| err())?;
        let p = Ipv4Prefix::new(addr, len).ok_or_else(err)?;
        if p.addr == addr { Ok(p) } else { Err(err()) }
    }
}

/// Why option 121 was rejected as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Option121Error {
    #[error("option 121 is empty")]
    Empty,
    #[error("option 121 entry at offset {offset} has impossible prefix length {prefix_len}")]
    BadPrefixLength { offset: usize, prefix_len: u8 },
    #[error("option 121 entry at offset {offset} is truncated")]
    ShortEntry { offset: usize },
}

/// Decode option 121 (RFC 3442 §3): a sequence of
/// `prefix_len, significant destination octets, gateway (4 octets)`.
pub fn parse_option121(data: &[u8]) -> Result<Vec<Route>, Option121Error> {
    if data.is_empty() {
        return Err(Option121Error::Empty);
    }
    let mut routes = Vec::new();
    let mut i = 0;
    while i < data.len() {
        let offset = i;
        let prefix_len = data[i];
        if prefix_len > 32 {
            return Err(Option121Error::BadPrefixLength { offset, prefix_len });
        }
        let sig = usize::from(prefix_len).div_ceil(8);
        let need = 1 + sig + 4;
        let entry = data
            .get(i..i + need)
            .ok_or(Option121Error::ShortEntry { offset })?;
        let mut dest = [0u8; 4];
        dest[..sig].copy_from_slice(&entry[1..=sig]);
        let gateway = Ipv4Addr::new(
            entry[1 + sig],
            entry[2 + sig],
            entry[3 + sig],
            entry[4 + sig],
        );
        let dest = Ipv4Addr::from(u32::from(Ipv4Addr::from(dest)) & mask(prefix_len));
        let route = Route {
            dest,
            prefix_len,
            gateway,
        };
        if !routes.contains(&route) {
            routes.push(route);
        }
        i += need;
    }
    Ok(routes)
}

/// Encode routes as option 121 payload (used by tests and by callers that
/// re-advertise routes).
pub fn encode_option121(routes: &[Route]) -> Vec<u8> {
    let mut out = Vec::new();
    for r in routes {
        let len = r.prefix_len.min(32);
        out.push(len);
        let sig = usize::from(len).div_ceil(8);
        out.extend_from_slice(&r.dest.octets()[..sig]);
        out.extend_from_slice(&r.gateway.octets());
    }
    out
}

/// Route policy applied to routes a server hands out (option 121, and the
/// default route implied by option 3).
///
/// Defaults: at most 64 routes, default route accepted, split-default routes
/// (prefixes shorter than /8 other than /0) rejected, no protected prefixes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RoutePolicy {
    /// Maximum number of routes accepted from one reply; further routes are
    /// rejected with [`RouteRejection::TooMany`]. Default 64.
    pub max_routes: usize,
    /// Accept a default route (`0.0.0.0/0` in option 121, or option 3). Set to
    /// `false` on secondary networks so a server cannot take over the pod's
    /// default route. Default `true`.
    pub allow_default_route: bool,
    /// Routes with `1 <= prefix_len < min_prefix_len` cover a large part of
    /// the address space and, being more specific than `/0`, silently override
    /// the default route (`TunnelVision` pushes `0.0.0.0/1` + `128.0.0.0/1`).
    /// They are rejected unless `allow_default_override` is set. Default 8.
    pub min_prefix_len: u8,
    /// Accept routes shorter than `min_prefix_len`. Default `false`.
    pub allow_default_override: bool,
    /// Prefixes that must keep their existing routing (cluster pod/service
    /// CIDRs, node networks, the pod's other interfaces). A route that
    /// overlaps one of them in either direction is rejected unless
    /// `allow_protected_override` is set: one inside it hijacks part of that
    /// traffic, and one around it (`172.16.0.0/12` around a service CIDR
    /// `172.30.0.0/16`) takes all of it wherever the protected prefix has no
    /// more specific route of its own (a service CIDR reached through the
    /// default route). The default route is governed by
    /// `allow_default_route` alone. Default empty.
    pub protected: Vec<Ipv4Prefix>,
    /// Accept routes inside protected prefixes. Default `false`.
    pub allow_protected_override: bool,
}

impl Default for RoutePolicy {
    fn default() -> Self {
        Self {
            max_routes: 64,
            allow_default_route: true,
            min_prefix_len: 8,
            allow_default_override: false,
            protected: Vec::new(),
            allow_protected_override: false,
        }
    }
}

/// Why the policy rejected a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RouteRejection {
    /// More than `max_routes` routes.
    TooMany,
    /// A default route while `allow_default_route` is false.
    DefaultRoute,
    /// A short prefix that overrides the default route (`TunnelVision`).
    OverridesDefault,
    /// Overlaps a protected prefix (inside it or around it).
    Protected { prefix: Ipv4Prefix },
    /// The gateway is not a usable unicast address.
    BadGateway,
}

impl RouteRejection {
    /// Bounded label for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            RouteRejection::TooMany => "too_many",
            RouteRejection::DefaultRoute => "default_route",
            RouteRejection::OverridesDefault => "overrides_default",
            RouteRejection::Protected { .. } => "protected_prefix",
            RouteRejection::BadGateway => "bad_gateway",
        }
    }
}

impl fmt::Display for RouteRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RouteRejection::TooMany => f.write_str("route count limit reached"),
            RouteRejection::DefaultRoute => {
                f.write_str("default route not allowed on this network")
            }
            RouteRejection::OverridesDefault => {
                f.write_str("prefix overrides the default route (CVE-2024-3661)")
            }
            RouteRejection::Protected { prefix } => {
                write!(f, "overlaps protected prefix {prefix}")
            }
            RouteRejection::BadGateway => f.write_str("gateway is not a unicast address"),
        }
    }
}

/// A route the policy refused, kept with the lease so the driver can log it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RejectedRoute {
    pub route: Route,
    pub reason: RouteRejection,
}

fn gateway_ok(gw: Ipv4Addr) -> bool {
    // 0.0.0.0 = on-link; anything else must be plain unicast.
    gw.is_unspecified() || !(gw.is_broadcast() || gw.is_multicast() || gw.is_loopback())
}

impl RoutePolicy {
    /// Check one route (not counting the `max_routes` bound).
    pub fn check(&self, route: &Route) -> Result<(), RouteRejection> {
        if !gateway_ok(route.gateway) {
            return Err(RouteRejection::BadGateway);
        }
        if route.is_default() {
            return if self.allow_default_route {
                Ok(())
            } else {
                Err(RouteRejection::DefaultRoute)
            };
        }
        if route.prefix_len < self.min_prefix_len && !self.allow_default_override {
            return Err(RouteRejection::OverridesDefault);
        }
        if !self.allow_protected_override {
            let p = route.prefix();
            if let Some(prefix) = self.protected.iter().find(|prot| prot.overlaps(&p)) {
                return Err(RouteRejection::Protected { prefix: *prefix });
            }
        }
        Ok(())
    }

    /// Split routes into accepted and rejected, preserving order.
    pub fn apply(&self, routes: Vec<Route>) -> (Vec<Route>, Vec<RejectedRoute>) {
        let mut accepted = Vec::new();
        let mut rejected = Vec::new();
        for route in routes {
            let verdict = self.check(&route).and(if accepted.len() < self.max_routes {
                Ok(())
            } else {
                Err(RouteRejection::TooMany)
            });
            match verdict {
                Ok(()) => accepted.push(route),
                Err(reason) => rejected.push(RejectedRoute { route, reason }),
            }
        }
        (accepted, rejected)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(dest: [u8; 4], len: u8, gw: [u8; 4]) -> Route {
        Route {
            dest: Ipv4Addr::from(dest),
            prefix_len: len,
            gateway: Ipv4Addr::from(gw),
        }
    }

    #[test]
    fn parses_rfc3442_examples() {
        // 0/0 via 192.0.2.1, 10.0.0.0/8 via 192.0.2.2, 10.17.0.0/16 via
        // 192.0.2.3, 10.27.129.0/24 via 192.0.2.4, 192.0.2.77/32 via 0.0.0.0
        let data = [
            0, 192, 0, 2, 1, //
            8, 10, 192, 0, 2, 2, //
            16, 10, 17, 192, 0, 2, 3, //
            24, 10, 27, 129, 192, 0, 2, 4, //
            32, 192, 0, 2, 77, 0, 0, 0, 0,
        ];
        let routes = parse_option121(&data).unwrap();
        assert_eq!(
            routes,
            vec![
                r([0, 0, 0, 0], 0, [192, 0, 2, 1]),
                r([10, 0, 0, 0], 8, [192, 0, 2, 2]),
                r([10, 17, 0, 0], 16, [192, 0, 2, 3]),
                r([10, 27, 129, 0], 24, [192, 0, 2, 4]),
                r([192, 0, 2, 77], 32, [0, 0, 0, 0]),
            ]
        );
        assert_eq!(encode_option121(&routes), data);
    }

    #[test]
    fn rejects_whole_option_on_bad_prefix_length() {
        let data = [8, 10, 192, 0, 2, 2, 33, 1, 2, 3, 4, 5, 6, 7, 8];
        assert_eq!(
            parse_option121(&data),
            Err(Option121Error::BadPrefixLength {
                offset: 6,
                prefix_len: 33
            })
        );
    }

    #[test]
    fn rejects_whole_option_on_short_entry() {
        let data = [8, 10, 192, 0, 2, 2, 24, 10, 1, 2, 192, 0];
        assert_eq!(
            parse_option121(&data),
            Err(Option121Error::ShortEntry { offset: 6 })
        );
        assert_eq!(parse_option121(&[]), Err(Option121Error::Empty));
        assert_eq!(
            parse_option121(&[0]),
            Err(Option121Error::ShortEntry { offset: 0 })
        );
    }

    #[test]
    fn zeroes_host_bits() {
        // 10.255/9: second octet 255 has 7 host bits set.
        let data = [9, 10, 255, 192, 0, 2, 1];
        assert_eq!(
            parse_option121(&data).unwrap(),
            vec![r([10, 128, 0, 0], 9, [192, 0, 2, 1])]
        );
    }

    #[test]
    fn tunnelvision_split_default_rejected_by_default() {
        let policy = RoutePolicy::default();
        let (ok, bad) = policy.apply(vec![
            r([0, 0, 0, 0], 1, [192, 0, 2, 66]),
            r([128, 0, 0, 0], 1, [192, 0, 2, 66]),
            r([198, 51, 100, 0], 24, [192, 0, 2, 1]),
        ]);
        assert_eq!(ok, vec![r([198, 51, 100, 0], 24, [192, 0, 2, 1])]);
        assert_eq!(bad.len(), 2);
        assert!(
            bad.iter()
                .all(|b| b.reason == RouteRejection::OverridesDefault)
        );
        let permissive = RoutePolicy {
            allow_default_override: true,
            ..RoutePolicy::default()
        };
        assert_eq!(
            permissive
                .apply(vec![r([0, 0, 0, 0], 1, [192, 0, 2, 66])])
                .0
                .len(),
            1
        );
    }

    #[test]
    fn protected_prefixes_and_default_route_policy() {
        let policy = RoutePolicy {
            protected: vec!["10.128.0.0/14".parse().unwrap()],
            allow_default_route: false,
            ..RoutePolicy::default()
        };
        // More specific than the protected prefix: hijack → rejected.
        assert_eq!(
            policy.check(&r([10, 129, 0, 0], 16, [192, 0, 2, 1])),
            Err(RouteRejection::Protected {
                prefix: "10.128.0.0/14".parse().unwrap()
            })
        );
        // Less specific: it takes the whole protected prefix wherever that
        // prefix has no route of its own → rejected too.
        assert_eq!(
            policy.check(&r([10, 0, 0, 0], 8, [192, 0, 2, 1])),
            Err(RouteRejection::Protected {
                prefix: "10.128.0.0/14".parse().unwrap()
            })
        );
        // The service-CIDR capture: a /12 around a /16.
        let services = RoutePolicy {
            protected: vec!["172.30.0.0/16".parse().unwrap()],
            ..RoutePolicy::default()
        };
        assert!(matches!(
            services.check(&r([172, 16, 0, 0], 12, [192, 0, 2, 1])),
            Err(RouteRejection::Protected { .. })
        ));
        // Disjoint prefixes are untouched, and the default route is not an
        // overlap (it is more general than every route the pod has).
        assert_eq!(
            policy.check(&r([10, 132, 0, 0], 16, [192, 0, 2, 1])),
            Ok(())
        );
        assert_eq!(services.check(&r([0, 0, 0, 0], 0, [192, 0, 2, 1])), Ok(()));
        assert_eq!(
            policy.check(&r([0, 0, 0, 0], 0, [192, 0, 2, 1])),
            Err(RouteRejection::DefaultRoute)
        );
        assert_eq!(
            policy.check(&r([198, 51, 100, 0], 24, [255, 255, 255, 255])),
            Err(RouteRejection::BadGateway)
        );
    }

    #[test]
    fn route_count_is_bounded() {
        let policy = RoutePolicy {
            max_routes: 2,
            ..RoutePolicy::default()
        };
        let routes = (0..5).map(|i| r([198, 51, 100, i], 32, [192, 0, 2, 1]));
        let (ok, bad) = policy.apply(routes.collect());
        assert_eq!(ok.len(), 2);
        assert_eq!(bad.len(), 3);
        assert!(bad.iter().all(|b| b.reason == RouteRejection::TooMany));
    }

    #[test]
    fn prefix_parsing() {
        assert_eq!(
            "10.0.0.0/8".parse::<Ipv4Prefix>().unwrap(),
            Ipv4Prefix {
                addr: Ipv4Addr::new(10, 0, 0, 0),
                len: 8
            }
        );
        assert!("10.0.0.1/8".parse::<Ipv4Prefix>().is_err());
        assert!("10.0.0.0/33".parse::<Ipv4Prefix>().is_err());
        assert!("10.0.0.0".parse::<Ipv4Prefix>().is_err());
    }
}
