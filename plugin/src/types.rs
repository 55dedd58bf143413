//! CNI 1.0/1.1 wire types: the error object with the spec's codes, and the
//! IPAM result (`ips`, `routes`, `dns`).
//!
//! The plugin supports cniVersion 0.3.0 → 1.1.0 so that it drops in wherever
//! the upstream `dhcp` plugin was configured; results for versions before
//! 1.0.0 carry the `"version"` field (`"4"`, `"6"`) those versions require.
//! A result holds IPv4 entries ([`IpConfig`], [`RouteConfig`]) and IPv6
//! ones ([`Ip6Config`], [`Route6Config`]) in separate, typed lists; on the
//! wire they share `ips` and `routes`, IPv4 first.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};

/// Versions the plugin accepts in `cniVersion` and lists in `VERSION`.
pub const SUPPORTED_VERSIONS: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// Version used for replies when the request carried none we could read.
pub const LATEST_VERSION: &str = "1.1.0";

/// CNI error codes. 1–99 are the spec's well-known codes; 100+ are ours.
pub mod code {
    /// Incompatible CNI version.
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    /// Unsupported field in the network configuration.
    pub const UNSUPPORTED_FIELD: u32 = 2;
    /// Container unknown or does not exist.
    pub const UNKNOWN_CONTAINER: u32 = 3;
    /// Invalid necessary environment variables.
    pub const INVALID_ENV: u32 = 4;
    /// I/O failure.
    pub const IO_FAILURE: u32 = 5;
    /// Failed to decode content.
    pub const DECODE_FAILURE: u32 = 6;
    /// Invalid network configuration.
    pub const INVALID_NETWORK_CONFIG: u32 = 7;
    /// Try again later.
    pub const TRY_AGAIN_LATER: u32 = 11;
    /// Plugin not available (STATUS).
    pub const PLUGIN_NOT_AVAILABLE: u32 = 50;
    /// The xdhcp agent could not be reached on its socket.
    pub const AGENT_UNREACHABLE: u32 = 100;
    /// No lease was acquired within the configured timeout.
    pub const DHCP_TIMEOUT: u32 = 101;
    /// The DHCP exchange failed for another reason (NAK loop, declined, …).
    pub const DHCP_FAILED: u32 = 102;
    /// The Kubernetes API refused or failed a call the ADD needs.
    pub const KUBE_API: u32 = 103;
    /// The VFIO driver handoff failed.
    pub const VFIO: u32 = 104;
    /// The interface named by `CNI_IFNAME` is not usable in the namespace.
    pub const INTERFACE: u32 = 105;
    /// CHECK found the lease or the configured address missing.
    pub const CHECK_FAILED: u32 = 106;
    /// An internal agent failure (persistence, datapath, task failure).
    pub const INTERNAL: u32 = 107;
}

/// A CNI error object: what the plugin prints on stdout when it fails.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub struct CniError {
    /// One of [`code`].
    pub code: u32,
    /// One line a person can act on.
    pub msg: String,
    /// Longer context (the underlying error chain), may be empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub details: String,
}

impl fmt::Display for CniError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CNI error {}: {}", self.code, self.msg)?;
        if !self.details.is_empty() {
            write!(f, " ({})", self.details)?;
        }
        Ok(())
    }
}

impl CniError {
    /// An error with a message and no details.
    pub fn new(code: u32, msg: impl Into<String>) -> Self {
        Self {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    /// Attach details (typically the error chain behind the message).
    #[must_use]
    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = details.into();
        self
    }

    /// Shortcut for an invalid-network-config error naming the field.
    pub fn config(field: &str, problem: impl fmt::Display) -> Self {
        Self::new(code::INVALID_NETWORK_CONFIG, format!("{field}: {problem}"))
    }

    /// Shortcut for an unsupported-field error naming the field.
    pub fn unsupported(field: &str, why: impl fmt::Display) -> Self {
        Self::new(code::UNSUPPORTED_FIELD, format!("{field}: {why}"))
    }

    /// Shortcut for an invalid-environment error naming the variable.
    pub fn env(var: &str, problem: impl fmt::Display) -> Self {
        Self::new(code::INVALID_ENV, format!("{var}: {problem}"))
    }

    /// The JSON object the CNI spec prescribes, tagged with `cni_version`.
    pub fn to_json(&self, cni_version: &str) -> serde_json::Value {
        let mut v = serde_json::json!({
            "cniVersion": cni_version,
            "code": self.code,
            "msg": self.msg,
        });
        if !self.details.is_empty() {
            v["details"] = serde_json::Value::String(self.details.clone());
        }
        v
    }
}

/// Why a string is not an IPv4 CIDR.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    /// No `/` between address and prefix length.
    #[error("{input:?} is not a CIDR (expected a.b.c.d/n)")]
    NoSlash {
        /// The whole input.
        input: String,
    },
    /// The part before the `/` is not a dotted-quad IPv4 address.
    #[error("{addr:?} is not an IPv4 address")]
    Address {
        /// The address part.
        addr: String,
    },
    /// The part after the `/` is not a number from 0 to 32.
    #[error("{prefix:?} is not a prefix length between 0 and 32")]
    PrefixLen {
        /// The prefix-length part.
        prefix: String,
    },
}

/// One IPv4 prefix (`a.b.c.d/n`) with host bits allowed (an interface
/// address) or not (a route/prefix), depending on where it was parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Cidr {
    pub addr: Ipv4Addr,
    pub prefix_len: u8,
}

impl Ipv4Cidr {
    /// Parse `a.b.c.d/n`.
    pub fn parse(s: &str) -> Result<Self, CidrError> {
        let (a, p) = s.split_once('/').ok_or_else(|| CidrError::NoSlash {
            input: s.to_owned(),
        })?;
        // `AddrParseError` says only "invalid IPv4 address syntax": the
        // variant names the rejected text instead.
        let addr: Ipv4Addr = a
            .parse()
            .map_err(|_| CidrError::Address { addr: a.to_owned() })?;
        let prefix_len: u8 =
            p.parse()
                .ok()
                .filter(|n| *n <= 32)
                .ok_or_else(|| CidrError::PrefixLen {
                    prefix: p.to_owned(),
                })?;
        Ok(Self { addr, prefix_len })
    }

    /// The network mask as an integer.
    pub fn mask(self) -> u32 {
        if self.prefix_len == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(self.prefix_len))
        }
    }

    /// Whether address bits beyond the prefix are zero.
    pub fn is_network(self) -> bool {
        u32::from(self.addr) & !self.mask() == 0
    }

    /// The same prefix with the host bits cleared.
    #[must_use]
    pub fn network(self) -> Self {
        Self {
            addr: Ipv4Addr::from(u32::from(self.addr) & self.mask()),
            prefix_len: self.prefix_len,
        }
    }
}

impl fmt::Display for Ipv4Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

impl Serialize for Ipv4Cidr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Ipv4Cidr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// One IPv6 address with its prefix length (`2001:db8::5/64`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv6Cidr {
    pub addr: Ipv6Addr,
    pub prefix_len: u8,
}

impl Ipv6Cidr {
    /// Parse `addr/n` with n from 0 to 128.
    pub fn parse(s: &str) -> Result<Self, String> {
        let (a, p) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?} is not an IPv6 CIDR (expected addr/n)"))?;
        let addr: Ipv6Addr = a
            .parse()
            .map_err(|_| format!("{a:?} is not an IPv6 address"))?;
        let prefix_len = p
            .parse()
            .ok()
            .filter(|n| *n <= 128)
            .ok_or_else(|| format!("{p:?} is not a prefix length between 0 and 128"))?;
        Ok(Self { addr, prefix_len })
    }

    /// The same prefix with the host bits cleared.
    #[must_use]
    pub fn network(self) -> Self {
        let mask = u128::MAX
            .checked_shl(128 - u32::from(self.prefix_len))
            .unwrap_or(0);
        Self {
            addr: Ipv6Addr::from(u128::from(self.addr) & mask),
            prefix_len: self.prefix_len,
        }
    }

    /// Whether `a` is inside this prefix.
    pub fn contains(self, a: Ipv6Addr) -> bool {
        Self {
            addr: a,
            prefix_len: self.prefix_len,
        }
        .network()
            == self.network()
    }
}

impl fmt::Display for Ipv6Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

impl Serialize for Ipv6Cidr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Ipv6Cidr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// `ips[]` entry of a CNI result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpConfig {
    /// Present (always `"4"`) only for cniVersion < 1.0.0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    pub address: Ipv4Cidr,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<Ipv4Addr>,
}

/// An IPv6 `ips[]` entry of a CNI result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ip6Config {
    /// Present (always `"6"`) only for cniVersion < 1.0.0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    pub address: Ipv6Cidr,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<Ipv6Addr>,
}

/// An IPv6 `routes[]` entry of a CNI result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route6Config {
    pub dst: Ipv6Cidr,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<Ipv6Addr>,
    /// Route metric (1.1.0 `priority`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
}

/// `RT_SCOPE_LINK` (`<linux/rtnetlink.h>`): the destination is on the link.
pub const SCOPE_LINK: u8 = 253;

/// `routes[]` entry of a CNI result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteConfig {
    pub dst: Ipv4Cidr,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<Ipv4Addr>,
    /// Route metric (1.1.0 `priority`), from the upstream `ipam.priority`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    /// Route scope (1.1.0 `scope`, the kernel's `RT_SCOPE_*` number):
    /// [`SCOPE_LINK`] for an on-link route (an option-121 router of
    /// 0.0.0.0), as the upstream plugin and OVN-Kubernetes return it, so
    /// whoever installs the route installs it on the link.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<u8>,
}

impl RouteConfig {
    /// A route to `dst` through `gw`; a `gw` of 0.0.0.0 means on-link: no
    /// gateway, scope link.
    pub fn new(dst: Ipv4Cidr, gw: Ipv4Addr, priority: Option<u32>) -> Self {
        let on_link = gw.is_unspecified();
        Self {
            dst,
            gw: (!on_link).then_some(gw),
            priority,
            scope: on_link.then_some(SCOPE_LINK),
        }
    }
}

/// `dns` of a CNI result.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DnsConfig {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
}

impl DnsConfig {
    fn is_empty(&self) -> bool {
        self.nameservers.is_empty() && self.domain.is_none() && self.search.is_empty()
    }
}

/// An IPAM plugin's success result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "WireResult", from = "WireResult")]
pub struct CniResult {
    pub cni_version: String,
    /// The IPv4 `ips` entries.
    pub ips: Vec<IpConfig>,
    /// The IPv6 `ips` entries (after the IPv4 ones on the wire).
    pub ips6: Vec<Ip6Config>,
    /// The IPv4 `routes`.
    pub routes: Vec<RouteConfig>,
    /// The IPv6 `routes` (after the IPv4 ones on the wire).
    pub routes6: Vec<Route6Config>,
    pub dns: DnsConfig,
}

/// [`CniResult`] as the CNI specification lays it out: one `ips` and one
/// `routes` list for both families.
#[derive(Serialize, Deserialize)]
struct WireResult {
    #[serde(rename = "cniVersion")]
    cni_version: String,
    ips: Vec<WireIp>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    routes: Vec<WireRoute>,
    #[serde(default, skip_serializing_if = "DnsConfig::is_empty")]
    dns: DnsConfig,
}

/// An `ips[]` entry of either family (an IPv4 CIDR is tried first).
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum WireIp {
    V4(IpConfig),
    V6(Ip6Config),
}

/// A `routes[]` entry of either family.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum WireRoute {
    V4(RouteConfig),
    V6(Route6Config),
}

impl From<CniResult> for WireResult {
    fn from(r: CniResult) -> Self {
        Self {
            cni_version: r.cni_version,
            ips: (r.ips.into_iter().map(WireIp::V4))
                .chain(r.ips6.into_iter().map(WireIp::V6))
                .collect(),
            routes: (r.routes.into_iter().map(WireRoute::V4))
                .chain(r.routes6.into_iter().map(WireRoute::V6))
                .collect(),
            dns: r.dns,
        }
    }
}

impl From<WireResult> for CniResult {
    fn from(w: WireResult) -> Self {
        let mut r = CniResult {
            cni_version: w.cni_version,
            ips: Vec::new(),
            ips6: Vec::new(),
            routes: Vec::new(),
            routes6: Vec::new(),
            dns: w.dns,
        };
        for ip in w.ips {
            match ip {
                WireIp::V4(c) => r.ips.push(c),
                WireIp::V6(c) => r.ips6.push(c),
            }
        }
        for route in w.routes {
            match route {
                WireRoute::V4(c) => r.routes.push(c),
                WireRoute::V6(c) => r.routes6.push(c),
            }
        }
        r
    }
}

impl CniResult {
    /// Adjust the shape to `cni_version`: pre-1.0 results need
    /// `ips[].version`, and `routes[].priority` and `routes[].scope` only
    /// exist from 1.1.0.
    #[must_use]
    pub fn for_version(mut self, cni_version: &str) -> Self {
        let pre_1_0 = version_lt(cni_version, "1.0.0");
        let pre_1_1 = version_lt(cni_version, "1.1.0");
        for ip in &mut self.ips {
            ip.version = pre_1_0.then(|| "4".to_owned());
        }
        for ip in &mut self.ips6 {
            ip.version = pre_1_0.then(|| "6".to_owned());
        }
        if pre_1_1 {
            for r in &mut self.routes {
                r.priority = None;
                r.scope = None;
            }
            for r in &mut self.routes6 {
                r.priority = None;
            }
        }
        cni_version.clone_into(&mut self.cni_version);
        self
    }
}

/// The `VERSION` reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionResult {
    #[serde(rename = "cniVersion")]
    pub cni_version: String,
    #[serde(rename = "supportedVersions")]
    pub supported_versions: Vec<String>,
}

impl VersionResult {
    /// The plugin's own version reply.
    pub fn current() -> Self {
        Self {
            cni_version: LATEST_VERSION.to_owned(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|s| (*s).to_owned()).collect(),
        }
    }
}

/// Compare dotted versions numerically (`"0.10.0" > "0.9.0"`). Unparsable
/// components compare as 0; callers validate against [`SUPPORTED_VERSIONS`].
pub fn version_lt(a: &str, b: &str) -> bool {
    fn parts(v: &str) -> [u32; 3] {
        let mut out = [0; 3];
        for (slot, p) in out.iter_mut().zip(v.split('.')) {
            *slot = p.parse().unwrap_or(0);
        }
        out
    }
    parts(a) < parts(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_json_has_spec_shape() {
        let e = CniError::config("ipam.timeout", "must be a duration between 1s and 300s")
            .with_details("got \"0s\"");
        let v = e.to_json("1.0.0");
        assert_eq!(v["cniVersion"], "1.0.0");
        assert_eq!(v["code"], 7);
        assert_eq!(
            v["msg"],
            "ipam.timeout: must be a duration between 1s and 300s"
        );
        assert_eq!(v["details"], "got \"0s\"");
        let plain = CniError::new(code::UNKNOWN_CONTAINER, "x").to_json("1.1.0");
        assert!(plain.get("details").is_none());
    }

    #[test]
    fn cidr_parse_and_network() {
        let c = Ipv4Cidr::parse("192.0.2.17/24").unwrap();
        assert_eq!(c.to_string(), "192.0.2.17/24");
        assert!(!c.is_network());
        assert_eq!(c.network().to_string(), "192.0.2.0/24");
        assert!(Ipv4Cidr::parse("0.0.0.0/0").unwrap().is_network());
        assert_eq!(
            Ipv4Cidr::parse("192.0.2.0/33"),
            Err(CidrError::PrefixLen {
                prefix: "33".into()
            })
        );
        assert_eq!(
            Ipv4Cidr::parse("192.0.2.0"),
            Err(CidrError::NoSlash {
                input: "192.0.2.0".into()
            })
        );
        assert_eq!(
            Ipv4Cidr::parse("300.0.2.0/8"),
            Err(CidrError::Address {
                addr: "300.0.2.0".into()
            })
        );
        assert_eq!(
            Ipv4Cidr::parse("300.0.2.0/8").unwrap_err().to_string(),
            "\"300.0.2.0\" is not an IPv4 address"
        );
        assert_eq!(Ipv4Cidr::parse("10.0.0.0/8").unwrap().mask(), 0xff00_0000);
    }

    fn sample() -> CniResult {
        CniResult {
            cni_version: String::new(),
            ips: vec![IpConfig {
                version: None,
                address: Ipv4Cidr::parse("192.0.2.10/24").unwrap(),
                gateway: Some(Ipv4Addr::new(192, 0, 2, 1)),
            }],
            ips6: vec![],
            routes6: vec![],
            routes: vec![
                RouteConfig::new(
                    Ipv4Cidr::parse("0.0.0.0/0").unwrap(),
                    Ipv4Addr::new(192, 0, 2, 1),
                    Some(10),
                ),
                RouteConfig::new(
                    Ipv4Cidr::parse("198.51.100.0/24").unwrap(),
                    Ipv4Addr::UNSPECIFIED,
                    Some(10),
                ),
            ],
            dns: DnsConfig {
                nameservers: vec![Ipv4Addr::new(192, 0, 2, 53).into()],
                domain: Some("example.test".into()),
                search: vec!["example.test".into()],
            },
        }
    }

    /// IPv6 entries follow the IPv4 ones in `ips` and `routes`, carry
    /// `"version": "6"` before 1.0.0, and read back into their own lists.
    #[test]
    fn ipv6_entries_share_the_lists_and_read_back() {
        let mut r = sample();
        r.ips6.push(Ip6Config {
            version: None,
            address: Ipv6Cidr::parse("2001:db8::5/64").unwrap(),
            gateway: Some("2001:db8::1".parse().unwrap()),
        });
        r.routes6.push(Route6Config {
            dst: Ipv6Cidr::parse("::/0").unwrap(),
            gw: Some("2001:db8::1".parse().unwrap()),
            priority: Some(10),
        });
        r.dns.nameservers.push("2001:db8::53".parse().unwrap());
        let v = serde_json::to_value(r.clone().for_version("1.1.0")).unwrap();
        assert_eq!(v["ips"][1]["address"], "2001:db8::5/64");
        assert_eq!(v["ips"][1]["gateway"], "2001:db8::1");
        assert_eq!(
            v["routes"][2],
            serde_json::json!({"dst": "::/0", "gw": "2001:db8::1", "priority": 10})
        );
        assert_eq!(v["dns"]["nameservers"][1], "2001:db8::53");
        let back: CniResult = serde_json::from_value(v).unwrap();
        assert_eq!(back, r.clone().for_version("1.1.0"));
        let v0 = serde_json::to_value(r.for_version("0.4.0")).unwrap();
        assert_eq!(v0["ips"][0]["version"], "4");
        assert_eq!(v0["ips"][1]["version"], "6");
        assert!(v0["routes"][2].get("priority").is_none());
    }

    #[test]
    fn ipv6_cidr_parse_and_contains() {
        let c = Ipv6Cidr::parse("fd00:1::7/64").unwrap();
        assert_eq!(c.network().to_string(), "fd00:1::/64");
        assert!(c.contains("fd00:1::ffff".parse().unwrap()));
        assert!(!c.contains("fd00:2::1".parse().unwrap()));
        assert!(
            Ipv6Cidr::parse("::/0")
                .unwrap()
                .contains("2001:db8::1".parse().unwrap())
        );
        assert!(Ipv6Cidr::parse("fd00::1/129").is_err());
        assert!(Ipv6Cidr::parse("192.0.2.1/24").is_err());
    }

    #[test]
    fn result_shape_per_version() {
        let v1 = serde_json::to_value(sample().for_version("1.1.0")).unwrap();
        assert_eq!(v1["cniVersion"], "1.1.0");
        assert_eq!(v1["ips"][0]["address"], "192.0.2.10/24");
        assert_eq!(v1["ips"][0]["gateway"], "192.0.2.1");
        assert!(v1["ips"][0].get("version").is_none());
        assert_eq!(v1["routes"][0]["dst"], "0.0.0.0/0");
        assert_eq!(v1["routes"][0]["priority"], 10);
        assert!(v1["routes"][0].get("scope").is_none());
        // On-link (router 0.0.0.0): no gateway, scope link, as 1.1.0 says it.
        assert_eq!(
            v1["routes"][1],
            serde_json::json!({"dst": "198.51.100.0/24", "priority": 10, "scope": 253})
        );
        assert_eq!(v1["dns"]["nameservers"][0], "192.0.2.53");
        assert_eq!(v1["dns"]["search"][0], "example.test");

        let v0 = serde_json::to_value(sample().for_version("0.4.0")).unwrap();
        assert_eq!(v0["ips"][0]["version"], "4");
        assert!(v0["routes"][0].get("priority").is_none());

        let v10 = serde_json::to_value(sample().for_version("1.0.0")).unwrap();
        assert!(v10["routes"][0].get("priority").is_none());
        assert_eq!(
            v10["routes"][1],
            serde_json::json!({"dst": "198.51.100.0/24"})
        );
        let back: CniResult = serde_json::from_value(v1).unwrap();
        assert_eq!(back.ips[0].address.prefix_len, 24);
    }

    #[test]
    fn version_ordering() {
        assert!(version_lt("0.4.0", "1.0.0"));
        assert!(version_lt("0.9.0", "0.10.0"));
        assert!(!version_lt("1.1.0", "1.0.0"));
        assert!(!version_lt("1.0.0", "1.0.0"));
    }

    #[test]
    fn version_reply_lists_supported() {
        let v = serde_json::to_value(VersionResult::current()).unwrap();
        assert_eq!(v["cniVersion"], "1.1.0");
        let list: Vec<&str> = v["supportedVersions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap())
            .collect();
        assert!(list.contains(&"1.0.0") && list.contains(&"1.1.0"));
    }
}
