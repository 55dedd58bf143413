//! The network configuration on stdin, validated into [`NetworkConfig`].
//!
//! Parsing works on a `serde_json::Value` and checks field by field so every
//! error names the offending field (`ipam.timeout: must be a duration between
//! 1s and 300s`). Unknown top-level fields belong to the main plugin and are
//! ignored; unknown `ipam` fields are errors (they are ours, a typo there
//! would otherwise be silently ignored).
//!
//! Two dialects are accepted:
//! - `"ipam": {"type": "xdhcp", …}` with xdhcp's own fields;
//! - `"ipam": {"type": "dhcp", …}` — the upstream containernetworking `dhcp`
//!   plugin's config, so xdhcp installed as `dhcp` is a drop-in: its
//!   `daemonSocketPath`, `provide`, `request`, `priority`, `timeout` and
//!   `resendMax` are mapped onto ours, or rejected with code 2 when xdhcp
//!   cannot honour them. Without `daemonSocketPath` it connects where the
//!   upstream plugin would, `/run/cni/dhcp.sock`.
//!
//! One thing, whole: every field of the network configuration, each checked
//! where it is read so its error names it; a fourth of the file is tests.

use std::net::Ipv6Addr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::env::{validate_container_id, validate_ifname};
use super::types::{CniError, Ipv4Cidr, SUPPORTED_VERSIONS, code};

/// Default agent socket (the agent's `--socket` default), and where a
/// `"type": "xdhcp"` config without `socketPath` connects.
pub const DEFAULT_SOCKET: &str = "/run/xdhcp/xdhcp.sock";
/// The upstream `dhcp` daemon's default socket: where a `"type": "dhcp"`
/// config without `daemonSocketPath` connects, as the upstream plugin does
/// (`dhcp daemon` serves it; `xdhcp agent --extra-socket` serves it beside
/// its own).
pub const UPSTREAM_SOCKET: &str = "/run/cni/dhcp.sock";
/// Bounds on `ipam.timeout` and `ipam.resendMax`.
pub const MIN_TIMEOUT: Duration = Duration::from_secs(1);
/// Upper bound on `ipam.timeout` and `ipam.resendMax`.
pub const MAX_TIMEOUT: Duration = Duration::from_mins(5);

/// Which `ipam.type` the config named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IpamType {
    /// `"type": "xdhcp"`.
    Xdhcp,
    /// `"type": "dhcp"`: the upstream plugin's name (drop-in).
    Dhcp,
}

/// The client identifier to send (option 61).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "kind", content = "bytes")]
pub enum ClientIdSpec {
    /// Type 1 + the interface MAC (RFC 2132 §9.14), the default.
    #[default]
    Mac,
    /// Do not send option 61.
    None,
    /// Exactly these bytes (type byte included).
    Raw(Vec<u8>),
}

/// Where the hostname (option 12) comes from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "kind", content = "value")]
pub enum HostnameSpec {
    /// The pod name from `CNI_ARGS` (`K8S_POD_NAME`) when it is a valid
    /// hostname, else none. The default.
    #[default]
    PodName,
    /// A fixed hostname.
    Fixed(String),
    /// The value of this `CNI_ARGS` key (upstream `provide[].fromArg`).
    FromArg(String),
}

/// `ipam.family`: which address family the network leases.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// DHCPv4 (RFC 2131), the default.
    #[default]
    Ipv4,
    /// DHCPv6 (RFC 8415): one address of an `IA_NA`.
    Ipv6,
    /// Dual stack: a DHCPv4 lease and a DHCPv6 one on the same attachment,
    /// each kept on its own, in one result.
    Dual,
}

impl Family {
    /// Whether this is the default, IPv4 (not written when it is).
    pub fn is_ipv4(&self) -> bool {
        *self == Family::Ipv4
    }

    /// Whether the network leases a DHCPv4 address (`ipv4` or `dual`).
    pub fn has_ipv4(self) -> bool {
        matches!(self, Family::Ipv4 | Family::Dual)
    }

    /// Whether the network leases a `DHCPv6` address (`ipv6` or `dual`).
    pub fn has_ipv6(self) -> bool {
        matches!(self, Family::Ipv6 | Family::Dual)
    }
}

/// `ipam.ipv6`: what DHCPv6 does not carry and the network may name. A
/// lease is an address only: without a prefix length it is returned (and
/// configured) as a /128; a default route needs a gateway.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ipv6Spec {
    /// `ipam.ipv6.prefixLength`: the on-link prefix's length (1..=128).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_length: Option<u8>,
    /// `ipam.ipv6.gateway`: the default router (needs `prefixLength`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<Ipv6Addr>,
    /// `ipam.ipv6.rapidCommit`: ask for Rapid Commit (RFC 8415 §21.14).
    #[serde(default)]
    pub rapid_commit: bool,
}

/// The validated `ipam` object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IpamOptions {
    /// `ipam.type`.
    pub ipam_type: IpamType,
    /// `ipam.apply`: the agent configures address and routes itself.
    pub apply: bool,
    /// `ipam.clientId`.
    pub client_id: ClientIdSpec,
    /// `ipam.hostname` (or upstream `provide: host-name`).
    pub hostname: HostnameSpec,
    /// `ipam.timeout`: overall acquisition deadline.
    #[serde(with = "opt_millis", default)]
    pub timeout: Option<Duration>,
    /// `ipam.resendMax`: retransmission backoff cap.
    #[serde(with = "opt_millis", default)]
    pub resend_max: Option<Duration>,
    /// `ipam.allowDefaultRouteOverride`: let option 121 carry 0.0.0.0/0.
    pub allow_default_route_override: bool,
    /// `ipam.protectedPrefixes`: option-121 routes into these are rejected.
    pub protected_prefixes: Vec<Ipv4Cidr>,
    /// `ipam.priority` (upstream): route metric for the routes we return/apply.
    pub route_priority: Option<u32>,
    /// `ipam.dhcpGuard`: the DHCP guard on the workload's port.
    #[serde(default)]
    pub dhcp_guard: DhcpGuardSpec,
    /// `ipam.family`.
    #[serde(default, skip_serializing_if = "Family::is_ipv4")]
    pub family: Family,
    /// `ipam.ipv6` (only with `"family": "ipv6"` or `"dual"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<Ipv6Spec>,
}

/// `ipam.dhcpGuard`: `{"trusted": bool, "rate": pps, "burst": n}`, every
/// field optional. The guard is always on for the ports xdhcp serves; this
/// only tunes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DhcpGuardSpec {
    /// DHCP server messages from the workload pass (a server or relay pod).
    pub trusted: bool,
    /// Client messages per second the port may send (1..=10000).
    pub rate: u32,
    /// Client messages a quiet port may send back to back (1..=10000).
    pub burst: u32,
}

impl Default for DhcpGuardSpec {
    fn default() -> Self {
        Self {
            trusted: false,
            rate: xdhcp_common::guard::GUARD_DEFAULT_RATE,
            burst: xdhcp_common::guard::GUARD_DEFAULT_BURST,
        }
    }
}

fn parse_dhcp_guard(v: &Value) -> Result<DhcpGuardSpec, CniError> {
    const FIELDS: &[&str] = &["trusted", "rate", "burst"];
    let obj = v.as_object().ok_or_else(|| {
        CniError::config(
            "ipam.dhcpGuard",
            "must be an object {\"trusted\": bool, \"rate\": pps, \"burst\": n}",
        )
    })?;
    if let Some(key) = obj.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(CniError::unsupported(
            &format!("ipam.dhcpGuard.{key}"),
            format!("unknown field; supported: {}", FIELDS.join(", ")),
        ));
    }
    let mut spec = DhcpGuardSpec::default();
    if let Some(t) = opt_bool(obj, "trusted", "ipam.dhcpGuard.trusted")? {
        spec.trusted = t;
    }
    for (key, slot) in [("rate", &mut spec.rate), ("burst", &mut spec.burst)] {
        match obj.get(key) {
            None | Some(Value::Null) => {}
            Some(v) => {
                *slot = v
                    .as_u64()
                    .filter(|n| (1..=10_000).contains(n))
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| {
                        CniError::config(
                            &format!("ipam.dhcpGuard.{key}"),
                            format!("{v} must be an integer between 1 and 10000"),
                        )
                    })?;
            }
        }
    }
    Ok(spec)
}

/// A `{containerID, ifname}` pair from `cni.dev/valid-attachments` (GC).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Attachment {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
}

/// The validated network configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkConfig {
    /// `cniVersion` (one of [`SUPPORTED_VERSIONS`]).
    pub cni_version: String,
    /// `name`: the network name.
    pub name: String,
    /// `netAttachDefName` (`<namespace>/<name>`) as OVN-K's NADs carry it.
    pub net_attach_def_name: Option<String>,
    /// Agent socket: `ipam.socketPath` / `ipam.daemonSocketPath`, else the default.
    pub socket_path: PathBuf,
    /// PCI device id of an SR-IOV VF (`deviceID` or `runtimeConfig.deviceID`).
    pub device_id: Option<String>,
    /// `cni.dev/valid-attachments` (GC only).
    pub valid_attachments: Option<Vec<Attachment>>,
    /// The `ipam` object.
    pub ipam: IpamOptions,
}

impl NetworkConfig {
    /// The overall acquisition timeout the agent will apply.
    pub fn acquire_timeout(&self, default: Duration) -> Duration {
        self.ipam.timeout.unwrap_or(default)
    }
}

/// Read just `cniVersion` from raw stdin, for tagging error replies even when
/// the rest of the config is invalid.
pub fn sniff_version(stdin: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(stdin).ok()?;
    let s = v.get("cniVersion")?.as_str()?;
    SUPPORTED_VERSIONS.contains(&s).then(|| s.to_owned())
}

/// Parse and validate the network configuration from stdin.
pub fn parse(stdin: &[u8]) -> Result<NetworkConfig, CniError> {
    let root: Value = serde_json::from_slice(stdin).map_err(|e| {
        CniError::new(
            code::DECODE_FAILURE,
            "network configuration on stdin is not valid JSON",
        )
        .with_details(e.to_string())
    })?;
    let Value::Object(root) = root else {
        return Err(CniError::new(
            code::DECODE_FAILURE,
            "network configuration on stdin must be a JSON object",
        ));
    };

    let cni_version = req_str(&root, "cniVersion", "cniVersion")?;
    if !SUPPORTED_VERSIONS.contains(&cni_version.as_str()) {
        return Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            format!(
                "cniVersion: {cni_version:?} is not supported; supported versions: {}",
                SUPPORTED_VERSIONS.join(", ")
            ),
        ));
    }
    let name = req_str(&root, "name", "name")?;
    validate_network_name(&name).map_err(|p| CniError::config("name", p))?;

    let net_attach_def_name = opt_str(&root, "netAttachDefName", "netAttachDefName")?;
    if let Some(n) = &net_attach_def_name {
        validate_nad_name(n).map_err(|p| CniError::config("netAttachDefName", p))?;
    }

    let mut device_id = opt_str(&root, "deviceID", "deviceID")?;
    if let Some(rc) = root.get("runtimeConfig") {
        let rc = rc
            .as_object()
            .ok_or_else(|| CniError::config("runtimeConfig", "must be an object"))?;
        if let Some(d) = opt_str(rc, "deviceID", "runtimeConfig.deviceID")? {
            device_id.get_or_insert(d);
        }
    }

    let valid_attachments = match root.get("cni.dev/valid-attachments") {
        None | Some(Value::Null) => None,
        Some(v) => Some(parse_attachments(v)?),
    };

    let ipam = root.get("ipam").ok_or_else(|| {
        CniError::config(
            "ipam",
            "missing; xdhcp is an IPAM plugin: configure it as \"ipam\": {\"type\": \"xdhcp\"}",
        )
    })?;
    let ipam = ipam
        .as_object()
        .ok_or_else(|| CniError::config("ipam", "must be an object"))?;
    let (ipam, socket_path) = parse_ipam(ipam)?;

    Ok(NetworkConfig {
        cni_version,
        name,
        net_attach_def_name,
        socket_path,
        device_id,
        valid_attachments,
        ipam,
    })
}

const IPAM_FIELDS: &[&str] = &[
    "type",
    "apply",
    "clientId",
    "hostname",
    "timeout",
    "resendMax",
    "allowDefaultRouteOverride",
    "protectedPrefixes",
    "socketPath",
    "daemonSocketPath",
    "provide",
    "request",
    "priority",
    "dhcpGuard",
    "family",
    "ipv6",
];

/// The `ipam` fields that configure DHCPv4 only: refused on an IPv6
/// network rather than silently ignored (a dual-stack network takes them,
/// for its DHCPv4 lease).
const IPV4_ONLY_FIELDS: &[&str] = &[
    "clientId",
    "hostname",
    "resendMax",
    "allowDefaultRouteOverride",
    "protectedPrefixes",
    "provide",
    "request",
];

/// `ipam.family` and `ipam.ipv6`.
fn parse_family(ipam: &Map<String, Value>) -> Result<(Family, Option<Ipv6Spec>), CniError> {
    let family = match opt_str(ipam, "family", "ipam.family")?.as_deref() {
        None | Some("ipv4") => Family::Ipv4,
        Some("ipv6") => Family::Ipv6,
        Some("dual") => Family::Dual,
        Some(other) => {
            return Err(CniError::config(
                "ipam.family",
                format!("{other:?} is not a family (expected \"ipv4\", \"ipv6\" or \"dual\")"),
            ));
        }
    };
    let ipv6 = match ipam.get("ipv6") {
        None | Some(Value::Null) => None,
        Some(_) if !family.has_ipv6() => {
            return Err(CniError::config(
                "ipam.ipv6",
                "only with \"family\": \"ipv6\" or \"dual\" (this network leases IPv4 only)",
            ));
        }
        Some(v) => Some(parse_ipv6(v)?),
    };
    if family == Family::Ipv6
        && let Some(key) = IPV4_ONLY_FIELDS.iter().find(|k| ipam.contains_key(**k))
    {
        return Err(CniError::unsupported(
            &format!("ipam.{key}"),
            "a DHCPv4 setting; this network is \"family\": \"ipv6\"",
        ));
    }
    Ok((family, ipv6))
}

fn parse_ipv6(v: &Value) -> Result<Ipv6Spec, CniError> {
    const FIELDS: &[&str] = &["prefixLength", "gateway", "rapidCommit"];
    let obj = v.as_object().ok_or_else(|| {
        CniError::config(
            "ipam.ipv6",
            "must be an object {\"prefixLength\": n, \"gateway\": addr, \"rapidCommit\": bool}",
        )
    })?;
    if let Some(key) = obj.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(CniError::unsupported(
            &format!("ipam.ipv6.{key}"),
            format!("unknown field; supported: {}", FIELDS.join(", ")),
        ));
    }
    let prefix_length = match obj.get("prefixLength") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .filter(|n| (1..=128).contains(n))
                .and_then(|n| u8::try_from(n).ok())
                .ok_or_else(|| {
                    CniError::config(
                        "ipam.ipv6.prefixLength",
                        format!("{v} must be an integer between 1 and 128"),
                    )
                })?,
        ),
    };
    let gateway = match opt_str(obj, "gateway", "ipam.ipv6.gateway")? {
        None => None,
        Some(g) => {
            let a: Ipv6Addr = g.parse().map_err(|_| {
                CniError::config("ipam.ipv6.gateway", format!("{g:?} is not an IPv6 address"))
            })?;
            if a.is_unspecified() || a.is_loopback() || a.is_multicast() {
                return Err(CniError::config(
                    "ipam.ipv6.gateway",
                    format!("{a} is not a unicast router address"),
                ));
            }
            if prefix_length.is_none() {
                return Err(CniError::config(
                    "ipam.ipv6.gateway",
                    "needs ipam.ipv6.prefixLength (DHCPv6 carries no prefix length)",
                ));
            }
            Some(a)
        }
    };
    let rapid_commit = opt_bool(obj, "rapidCommit", "ipam.ipv6.rapidCommit")?.unwrap_or(false);
    Ok(Ipv6Spec {
        prefix_length,
        gateway,
        rapid_commit,
    })
}

#[expect(
    clippy::too_many_lines,
    reason = "one flat field-by-field walk reads better than scattered helpers"
)]
fn parse_ipam(ipam: &Map<String, Value>) -> Result<(IpamOptions, PathBuf), CniError> {
    for key in ipam.keys() {
        if !IPAM_FIELDS.contains(&key.as_str()) {
            return Err(CniError::unsupported(
                &format!("ipam.{key}"),
                format!("unknown field; supported: {}", IPAM_FIELDS.join(", ")),
            ));
        }
    }
    let ipam_type = match req_str(ipam, "type", "ipam.type")?.as_str() {
        "xdhcp" => IpamType::Xdhcp,
        "dhcp" => IpamType::Dhcp,
        other => {
            return Err(CniError::config(
                "ipam.type",
                format!("{other:?} is not handled by this plugin (expected \"xdhcp\" or \"dhcp\")"),
            ));
        }
    };

    let apply = opt_bool(ipam, "apply", "ipam.apply")?.unwrap_or(false);
    let allow_default_route_override = opt_bool(
        ipam,
        "allowDefaultRouteOverride",
        "ipam.allowDefaultRouteOverride",
    )?
    .unwrap_or(false);

    let mut client_id = match opt_str(ipam, "clientId", "ipam.clientId")? {
        None => ClientIdSpec::Mac,
        Some(s) => parse_client_id(&s).map_err(|p| CniError::config("ipam.clientId", p))?,
    };
    let mut hostname = match opt_str(ipam, "hostname", "ipam.hostname")? {
        None => HostnameSpec::PodName,
        Some(h) => {
            validate_hostname(&h).map_err(|p| CniError::config("ipam.hostname", p))?;
            HostnameSpec::Fixed(h)
        }
    };

    let timeout = opt_duration(ipam, "timeout", "ipam.timeout")?;
    let resend_max = opt_duration(ipam, "resendMax", "ipam.resendMax")?;

    let protected_prefixes = match ipam.get("protectedPrefixes") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let field = format!("ipam.protectedPrefixes[{i}]");
                let s = item
                    .as_str()
                    .ok_or_else(|| CniError::config(&field, "must be a CIDR string"))?;
                let c = Ipv4Cidr::parse(s).map_err(|p| CniError::config(&field, p))?;
                if !c.is_network() {
                    return Err(CniError::config(
                        &field,
                        format!("{c} has host bits set; did you mean {}?", c.network()),
                    ));
                }
                out.push(c);
            }
            out
        }
        Some(_) => {
            return Err(CniError::config(
                "ipam.protectedPrefixes",
                "must be a list of CIDR strings",
            ));
        }
    };

    let socket = opt_str(ipam, "socketPath", "ipam.socketPath")?;
    let daemon_socket = opt_str(ipam, "daemonSocketPath", "ipam.daemonSocketPath")?;
    let socket_path = match (socket, daemon_socket) {
        (Some(a), Some(b)) if a != b => {
            return Err(CniError::config(
                "ipam.socketPath",
                format!("conflicts with ipam.daemonSocketPath ({a:?} vs {b:?}); set only one"),
            ));
        }
        (Some(p), _) | (None, Some(p)) => {
            if !p.starts_with('/') {
                return Err(CniError::config(
                    "ipam.socketPath",
                    format!("{p:?} must be an absolute path"),
                ));
            }
            PathBuf::from(p)
        }
        (None, None) => PathBuf::from(match ipam_type {
            IpamType::Xdhcp => DEFAULT_SOCKET,
            IpamType::Dhcp => UPSTREAM_SOCKET,
        }),
    };

    let route_priority = match ipam.get("priority") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| {
                    CniError::config(
                        "ipam.priority",
                        "must be a non-negative integer (route metric)",
                    )
                })?,
        ),
    };

    if let Some(v) = ipam.get("provide") {
        apply_provide(v, &mut client_id, &mut hostname)?;
    }
    if let Some(v) = ipam.get("request") {
        check_request(v)?;
    }
    let dhcp_guard = match ipam.get("dhcpGuard") {
        None | Some(Value::Null) => DhcpGuardSpec::default(),
        Some(v) => parse_dhcp_guard(v)?,
    };
    let (family, ipv6) = parse_family(ipam)?;

    Ok((
        IpamOptions {
            ipam_type,
            apply,
            client_id,
            hostname,
            timeout,
            resend_max,
            allow_default_route_override,
            protected_prefixes,
            route_priority,
            dhcp_guard,
            family,
            ipv6,
        },
        socket_path,
    ))
}

/// Options xdhcp always puts in its parameter request list (option 55), by
/// code and by the upstream plugin's name; the same list as the engine's
/// `REQUESTED_OPTIONS`.
const REQUESTED: &[(u8, &str)] = &[
    (1, "subnet-mask"),
    (3, "routers"),
    (6, "domain-name-servers"),
    (15, "domain-name"),
    (26, "interface-mtu"),
    (51, "dhcp-lease-time"),
    (54, "dhcp-server-identifier"),
    (58, "dhcp-renewal-time"),
    (59, "dhcp-rebinding-time"),
    (119, "domain-search"),
    (121, "classless-static-routes"),
];

/// Upstream option names (containernetworking `options.go`) and ours.
fn option_code(v: &Value, field: &str) -> Result<u8, CniError> {
    let named = |s: &str| -> Option<u8> {
        match s {
            "host-name" => Some(12),
            "dhcp-client-identifier" => Some(61),
            "user-class" => Some(77),
            "vendor-class-identifier" => Some(60),
            _ => REQUESTED.iter().find(|(_, n)| *n == s).map(|(c, _)| *c),
        }
    };
    let code = match v {
        Value::Number(n) => n.as_u64().and_then(|n| u8::try_from(n).ok()),
        Value::String(s) => s.parse::<u8>().ok().or_else(|| named(s)),
        _ => None,
    };
    code.filter(|c| *c != 0 && *c != 255).ok_or_else(|| {
        CniError::config(
            field,
            format!("{v} is not a DHCP option name or code between 1 and 254"),
        )
    })
}

fn apply_provide(
    v: &Value,
    client_id: &mut ClientIdSpec,
    hostname: &mut HostnameSpec,
) -> Result<(), CniError> {
    let items = v.as_array().ok_or_else(|| {
        CniError::config("ipam.provide", "must be a list of {option, value|fromArg}")
    })?;
    for (i, item) in items.iter().enumerate() {
        let base = format!("ipam.provide[{i}]");
        let obj = item
            .as_object()
            .ok_or_else(|| CniError::config(&base, "must be an object"))?;
        for key in obj.keys() {
            if !["option", "value", "fromArg"].contains(&key.as_str()) {
                return Err(CniError::unsupported(
                    &format!("{base}.{key}"),
                    "unknown field; supported: option, value, fromArg",
                ));
            }
        }
        let opt = obj
            .get("option")
            .ok_or_else(|| CniError::config(&format!("{base}.option"), "missing"))?;
        let opt = option_code(opt, &format!("{base}.option"))?;
        let value = opt_str(obj, "value", &format!("{base}.value"))?;
        let from_arg = opt_str(obj, "fromArg", &format!("{base}.fromArg"))?;
        match (opt, value, from_arg) {
            (_, Some(_), Some(_)) => {
                return Err(CniError::config(
                    &base,
                    "set either value or fromArg, not both",
                ));
            }
            (_, None, None) => {
                return Err(CniError::config(&base, "needs a value or a fromArg"));
            }
            (12, Some(h), None) => {
                validate_hostname(&h).map_err(|p| CniError::config(&format!("{base}.value"), p))?;
                *hostname = HostnameSpec::Fixed(h);
            }
            (12, None, Some(arg)) => *hostname = HostnameSpec::FromArg(arg),
            // The upstream plugin sends the value's bytes as the whole
            // option, without a type byte of its own; so does xdhcp, so a
            // server reservation made for it still matches.
            (61, Some(id), None) => {
                if id.len() < 2 || id.len() > 255 {
                    return Err(CniError::config(
                        &format!("{base}.value"),
                        ClientIdError::Length {
                            len: id.len(),
                            input: id,
                        },
                    ));
                }
                *client_id = ClientIdSpec::Raw(id.into_bytes());
            }
            (61, None, Some(_)) => {
                return Err(CniError::unsupported(
                    &format!("{base}.fromArg"),
                    "a client identifier from CNI_ARGS is not supported; set ipam.clientId",
                ));
            }
            (other, _, _) => {
                return Err(CniError::unsupported(
                    &format!("{base}.option"),
                    format!(
                        "xdhcp can provide only host-name (12) and dhcp-client-identifier (61), not option {other}"
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn check_request(v: &Value) -> Result<(), CniError> {
    let items = v.as_array().ok_or_else(|| {
        CniError::config("ipam.request", "must be a list of {option, skipDefault}")
    })?;
    for (i, item) in items.iter().enumerate() {
        let base = format!("ipam.request[{i}]");
        let obj = item
            .as_object()
            .ok_or_else(|| CniError::config(&base, "must be an object"))?;
        for key in obj.keys() {
            if !["option", "skipDefault"].contains(&key.as_str()) {
                return Err(CniError::unsupported(
                    &format!("{base}.{key}"),
                    "unknown field; supported: option, skipDefault",
                ));
            }
        }
        // skipDefault only shrinks upstream's request list; xdhcp's list is
        // fixed, so it is accepted and has no effect.
        opt_bool(obj, "skipDefault", &format!("{base}.skipDefault"))?;
        if let Some(opt) = obj.get("option") {
            let field = format!("{base}.option");
            let c = option_code(opt, &field)?;
            if !REQUESTED.iter().any(|(r, _)| *r == c) {
                let list: Vec<String> = REQUESTED.iter().map(|(c, _)| c.to_string()).collect();
                return Err(CniError::unsupported(
                    &field,
                    format!(
                        "xdhcp always requests options {} and cannot request option {c}",
                        list.join(",")
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn parse_attachments(v: &Value) -> Result<Vec<Attachment>, CniError> {
    const F: &str = "cni.dev/valid-attachments";
    let items = v
        .as_array()
        .ok_or_else(|| CniError::config(F, "must be a list of {containerID, ifname}"))?;
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let base = format!("{F}[{i}]");
        let obj = item
            .as_object()
            .ok_or_else(|| CniError::config(&base, "must be an object"))?;
        let container_id = req_str(obj, "containerID", &format!("{base}.containerID"))?;
        let ifname = req_str(obj, "ifname", &format!("{base}.ifname"))?;
        // Entries are only compared against our own validated keys, so an
        // entry we could never have created is harmless; still reject garbage.
        validate_container_id(&container_id)
            .map_err(|p| CniError::config(&format!("{base}.containerID"), p))?;
        validate_ifname(&ifname).map_err(|p| CniError::config(&format!("{base}.ifname"), p))?;
        out.push(Attachment {
            container_id,
            ifname,
        });
    }
    Ok(out)
}

fn req_str(obj: &Map<String, Value>, key: &str, field: &str) -> Result<String, CniError> {
    opt_str(obj, key, field)?.ok_or_else(|| CniError::config(field, "missing"))
}

fn opt_str(obj: &Map<String, Value>, key: &str, field: &str) -> Result<Option<String>, CniError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Err(CniError::config(field, "must not be empty")),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(CniError::config(
            field,
            format!("must be a string, got {other}"),
        )),
    }
}

fn opt_bool(obj: &Map<String, Value>, key: &str, field: &str) -> Result<Option<bool>, CniError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(CniError::config(
            field,
            format!("must be true or false, got {other}"),
        )),
    }
}

fn opt_duration(
    obj: &Map<String, Value>,
    key: &str,
    field: &str,
) -> Result<Option<Duration>, CniError> {
    let bad = |got: &Value| {
        CniError::config(field, "must be a duration between 1s and 300s").with_details(format!(
            "got {got}; use a string like \"30s\" or \"2m\", or a number of seconds"
        ))
    };
    let v = match obj.get(key) {
        None | Some(Value::Null) => return Ok(None),
        Some(v) => v,
    };
    let d = match v {
        Value::Number(n) => n
            .as_f64()
            .filter(|f| f.is_finite() && *f >= 0.0 && *f <= 1e6)
            .map(Duration::from_secs_f64),
        Value::String(s) => parse_go_duration(s),
        _ => None,
    }
    .ok_or_else(|| bad(v))?;
    // Whole milliseconds: what crosses the agent socket (`opt_millis`), so
    // the agent applies exactly the duration validated here.
    let d = Duration::from_millis(d.as_millis() as u64);
    if !(MIN_TIMEOUT..=MAX_TIMEOUT).contains(&d) {
        return Err(bad(v));
    }
    Ok(Some(d))
}

/// Parse a Go-style duration: `"30s"`, `"1m30s"`, `"500ms"`, `"1.5s"`.
pub fn parse_go_duration(s: &str) -> Option<Duration> {
    let mut rest = s.trim();
    if rest.is_empty() {
        return None;
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_end == 0 {
            return None;
        }
        let n: f64 = rest[..num_end].parse().ok()?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        rest = &rest[unit_end..];
        total += n * scale;
    }
    (total.is_finite() && total <= 1e9).then(|| Duration::from_secs_f64(total))
}

/// What a valid host name looks like, for messages.
const HOSTNAME_RULE: &str = "letters, digits, '-' and '.', labels of 1-63 characters";

/// Why an `ipam.clientId` (or a provided option 61) is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientIdError {
    /// Looks like hex bytes (has a `:`) but a part is not two hex digits.
    #[error("{input:?} is not colon-separated hex bytes (like \"01:02:03\")")]
    NotHex {
        /// The refused value.
        input: String,
    },
    /// Option 61 carries 2 to 255 bytes (type byte included).
    #[error("{input:?} gives a {len}-byte client identifier; option 61 needs 2 to 255 bytes")]
    Length {
        /// The refused value.
        input: String,
        /// The identifier's length, type byte included.
        len: usize,
    },
}

/// Why a host name (option 12) is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostnameError {
    /// Empty or longer than 253 characters.
    #[error(
        "{name:?} is not a valid host name: {len} characters long ({HOSTNAME_RULE})",
        HOSTNAME_RULE = HOSTNAME_RULE
    )]
    Length {
        /// The refused name.
        name: String,
        /// Its length.
        len: usize,
    },
    /// A label that is empty, longer than 63 characters, starts or ends
    /// with `-`, or holds something other than letters, digits and `-`.
    #[error(
        "{name:?} is not a valid host name: bad label {label:?} ({HOSTNAME_RULE})",
        HOSTNAME_RULE = HOSTNAME_RULE
    )]
    Label {
        /// The refused name.
        name: String,
        /// The first bad label.
        label: String,
    },
}

/// Why a network name or a `netAttachDefName` is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The network's `name`.
    #[error(
        "{name:?} is not a valid network name (letters, digits, '_', '.', '-', starting with a letter or digit)"
    )]
    Network {
        /// The refused name.
        name: String,
    },
    /// `netAttachDefName`.
    #[error("{name:?} must be <namespace>/<name> of a NetworkAttachmentDefinition")]
    NetAttachDef {
        /// The refused value.
        name: String,
    },
}

/// `"mac"`, `"none"`, colon-separated hex bytes (type byte included, e.g.
/// `"ff:00:01:02"`), or any other text, sent as type 0 + the text.
fn parse_client_id(s: &str) -> Result<ClientIdSpec, ClientIdError> {
    match s {
        "mac" => return Ok(ClientIdSpec::Mac),
        "none" => return Ok(ClientIdSpec::None),
        _ => {}
    }
    let looks_hex = s.contains(':') && s.bytes().all(|b| b == b':' || b.is_ascii_hexdigit());
    let bytes = if looks_hex {
        s.split(':')
            .map(|b| {
                (b.len() == 2)
                    .then(|| u8::from_str_radix(b, 16).ok())
                    .flatten()
            })
            .collect::<Option<Vec<u8>>>()
            .ok_or_else(|| ClientIdError::NotHex {
                input: s.to_owned(),
            })?
    } else {
        let mut v = vec![0u8];
        v.extend_from_slice(s.as_bytes());
        v
    };
    if bytes.len() < 2 || bytes.len() > 255 {
        return Err(ClientIdError::Length {
            input: s.to_owned(),
            len: bytes.len(),
        });
    }
    Ok(ClientIdSpec::Raw(bytes))
}

/// RFC 1123 host name: labels of 1–63 letters, digits and `-`, not starting
/// or ending with `-`, at most 253 characters.
pub fn validate_hostname(h: &str) -> Result<(), HostnameError> {
    if h.is_empty() || h.len() > 253 {
        return Err(HostnameError::Length {
            name: h.to_owned(),
            len: h.len(),
        });
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    match h.split('.').find(|l| !label_ok(l)) {
        None => Ok(()),
        Some(label) => Err(HostnameError::Label {
            name: h.to_owned(),
            label: label.to_owned(),
        }),
    }
}

fn validate_network_name(n: &str) -> Result<(), NameError> {
    let mut bytes = n.bytes();
    let first_ok = bytes.next().is_some_and(|b| b.is_ascii_alphanumeric());
    if first_ok
        && n.len() <= 253
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
    {
        Ok(())
    } else {
        Err(NameError::Network { name: n.to_owned() })
    }
}

fn validate_nad_name(n: &str) -> Result<(), NameError> {
    let dns_label = |s: &str| {
        !s.is_empty()
            && s.len() <= 253
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    };
    match n.split_once('/') {
        Some((ns, name)) if dns_label(ns) && dns_label(name) => Ok(()),
        _ => Err(NameError::NetAttachDef { name: n.to_owned() }),
    }
}

mod opt_millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    #[expect(
        clippy::ref_option,
        reason = "serde's `with` protocol passes &Option<T>"
    )]
    pub(super) fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&(d.as_millis() as u64)),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_millis))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(ipam: &str) -> Vec<u8> {
        format!(
            r#"{{"cniVersion":"1.0.0","name":"net1","type":"bridge","bridge":"br0","ipam":{ipam}}}"#
        )
        .into_bytes()
    }

    fn err(stdin: &[u8]) -> CniError {
        parse(stdin).expect_err("config must be rejected")
    }

    /// An IPv6 network: the family, its prefix length, gateway and Rapid
    /// Commit, kept; every mistake named by its field.
    #[test]
    fn ipv6_network_config() {
        let c = parse(&conf(
            r#"{"type":"xdhcp","family":"ipv6","apply":true,"timeout":"20s",
                "ipv6":{"prefixLength":64,"gateway":"fe80::1","rapidCommit":true}}"#,
        ))
        .unwrap();
        assert_eq!(c.ipam.family, Family::Ipv6);
        assert_eq!(
            c.ipam.ipv6,
            Some(Ipv6Spec {
                prefix_length: Some(64),
                gateway: Some("fe80::1".parse().unwrap()),
                rapid_commit: true,
            })
        );
        let plain = parse(&conf(r#"{"type":"xdhcp","family":"ipv6"}"#)).unwrap();
        assert_eq!((plain.ipam.family, plain.ipam.ipv6), (Family::Ipv6, None));
        assert_eq!(
            parse(&conf(r#"{"type":"xdhcp"}"#)).unwrap().ipam.family,
            Family::Ipv4
        );
        // Stored and sent to the agent as given; an IPv4 network as before.
        let back: NetworkConfig =
            serde_json::from_value(serde_json::to_value(&c).unwrap()).unwrap();
        assert_eq!(back, c);
        let v4 = serde_json::to_value(parse(&conf(r#"{"type":"xdhcp"}"#)).unwrap()).unwrap();
        assert!(v4["ipam"].get("family").is_none() && v4["ipam"].get("ipv6").is_none());

        for (ipam, field, code) in [
            (r#"{"type":"xdhcp","family":"v6"}"#, "ipam.family", 7),
            (r#"{"type":"xdhcp","ipv6":{}}"#, "ipam.ipv6", 7),
            (
                r#"{"type":"xdhcp","family":"ipv6","ipv6":[]}"#,
                "ipam.ipv6",
                7,
            ),
            (
                r#"{"type":"xdhcp","family":"ipv6","ipv6":{"prefix":64}}"#,
                "ipam.ipv6.prefix",
                2,
            ),
            (
                r#"{"type":"xdhcp","family":"ipv6","ipv6":{"prefixLength":129}}"#,
                "ipam.ipv6.prefixLength",
                7,
            ),
            (
                r#"{"type":"xdhcp","family":"ipv6","ipv6":{"prefixLength":0}}"#,
                "ipam.ipv6.prefixLength",
                7,
            ),
            (
                r#"{"type":"xdhcp","family":"ipv6","ipv6":{"gateway":"fe80::1"}}"#,
                "ipam.ipv6.gateway",
                7,
            ),
            (
                r#"{"type":"xdhcp","family":"ipv6","ipv6":{"prefixLength":64,"gateway":"10.0.0.1"}}"#,
                "ipam.ipv6.gateway",
                7,
            ),
            (
                r#"{"type":"xdhcp","family":"ipv6","ipv6":{"prefixLength":64,"gateway":"ff02::2"}}"#,
                "ipam.ipv6.gateway",
                7,
            ),
            (
                r#"{"type":"xdhcp","family":"ipv6","ipv6":{"rapidCommit":"yes"}}"#,
                "ipam.ipv6.rapidCommit",
                7,
            ),
            (
                r#"{"type":"xdhcp","family":"ipv6","clientId":"01:02"}"#,
                "ipam.clientId",
                2,
            ),
            (
                r#"{"type":"xdhcp","family":"ipv6","protectedPrefixes":[]}"#,
                "ipam.protectedPrefixes",
                2,
            ),
        ] {
            let e = err(&conf(ipam));
            assert!(
                e.msg.starts_with(&format!("{field}: ")),
                "{ipam}: {}",
                e.msg
            );
            assert_eq!(e.code, code, "{ipam}: {}", e.msg);
        }
    }

    /// A dual-stack network: both families' settings kept (the DHCPv4 ones
    /// for its DHCPv4 lease, `ipv6` for its DHCPv6 one); the combinations
    /// that cannot be are refused naming the field, with these words.
    #[test]
    fn dual_stack_network_config() {
        let c = parse(&conf(
            r#"{"type":"xdhcp","family":"dual","apply":true,"clientId":"01:02",
                "protectedPrefixes":["10.0.0.0/8"],
                "ipv6":{"prefixLength":64,"gateway":"fe80::1"}}"#,
        ))
        .unwrap();
        assert_eq!(c.ipam.family, Family::Dual);
        assert!(c.ipam.family.has_ipv4() && c.ipam.family.has_ipv6());
        assert!(!Family::Ipv4.has_ipv6() && !Family::Ipv6.has_ipv4());
        assert_eq!(c.ipam.ipv6.and_then(|v| v.prefix_length), Some(64));
        assert_eq!(c.ipam.protected_prefixes.len(), 1);
        let back: NetworkConfig =
            serde_json::from_value(serde_json::to_value(&c).unwrap()).unwrap();
        assert_eq!(back, c);
        assert_eq!(serde_json::to_value(&c).unwrap()["ipam"]["family"], "dual");
        let bare = parse(&conf(r#"{"type":"xdhcp","family":"dual"}"#)).unwrap();
        assert_eq!((bare.ipam.family, bare.ipam.ipv6), (Family::Dual, None));

        for (ipam, msg) in [
            (
                r#"{"type":"xdhcp","ipv6":{"prefixLength":64}}"#,
                r#"ipam.ipv6: only with "family": "ipv6" or "dual" (this network leases IPv4 only)"#,
            ),
            (
                r#"{"type":"xdhcp","family":"ipv4","ipv6":{}}"#,
                r#"ipam.ipv6: only with "family": "ipv6" or "dual" (this network leases IPv4 only)"#,
            ),
            (
                r#"{"type":"xdhcp","family":"both"}"#,
                r#"ipam.family: "both" is not a family (expected "ipv4", "ipv6" or "dual")"#,
            ),
            (
                r#"{"type":"xdhcp","family":"dual","ipv6":{"gateway":"fe80::1"}}"#,
                "ipam.ipv6.gateway: needs ipam.ipv6.prefixLength (DHCPv6 carries no prefix length)",
            ),
        ] {
            let e = err(&conf(ipam));
            assert_eq!(e.msg, msg, "{ipam}");
            assert_eq!(e.code, 7, "{ipam}");
        }
    }

    #[test]
    fn minimal_xdhcp_config() {
        let c = parse(&conf(r#"{"type":"xdhcp"}"#)).unwrap();
        assert_eq!(c.cni_version, "1.0.0");
        assert_eq!(c.name, "net1");
        assert_eq!(c.ipam.ipam_type, IpamType::Xdhcp);
        assert!(!c.ipam.apply);
        assert_eq!(c.ipam.client_id, ClientIdSpec::Mac);
        assert_eq!(c.ipam.hostname, HostnameSpec::PodName);
        assert_eq!(c.socket_path, PathBuf::from(DEFAULT_SOCKET));
        assert_eq!(
            c.acquire_timeout(Duration::from_secs(30)),
            Duration::from_secs(30)
        );
    }

    #[test]
    fn full_xdhcp_config() {
        let c = parse(
            br#"{"cniVersion":"1.1.0","name":"localnet-dhcp","type":"ovn-k8s-cni-overlay",
                "netAttachDefName":"default/ovn-localnet-dhcp","deviceID":"0000:3b:02.1",
                "ipam":{"type":"xdhcp","apply":true,"clientId":"ff:00:11:22","hostname":"web-1",
                "timeout":"45s","resendMax":30,"allowDefaultRouteOverride":true,
                "protectedPrefixes":["10.128.0.0/14","172.30.0.0/16"],"socketPath":"/tmp/x.sock"}}"#,
        )
        .unwrap();
        assert!(c.ipam.apply);
        assert_eq!(
            c.ipam.client_id,
            ClientIdSpec::Raw(vec![0xff, 0, 0x11, 0x22])
        );
        assert_eq!(c.ipam.hostname, HostnameSpec::Fixed("web-1".into()));
        assert_eq!(c.ipam.timeout, Some(Duration::from_secs(45)));
        assert_eq!(c.ipam.resend_max, Some(Duration::from_secs(30)));
        assert!(c.ipam.allow_default_route_override);
        assert_eq!(c.ipam.protected_prefixes.len(), 2);
        assert_eq!(c.socket_path, PathBuf::from("/tmp/x.sock"));
        assert_eq!(
            c.net_attach_def_name.as_deref(),
            Some("default/ovn-localnet-dhcp")
        );
        assert_eq!(c.device_id.as_deref(), Some("0000:3b:02.1"));
        // Survives the trip over the agent socket.
        let back: NetworkConfig =
            serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
    }

    /// Fuzzing finding (target `cni_config`): a timeout with sub-millisecond
    /// digits (`"1s500us"`, `1.0005`) crossed the agent socket as whole
    /// milliseconds, so the agent applied another timeout than the one
    /// parsed and validated.
    #[test]
    fn durations_survive_the_agent_socket() {
        for ipam in [
            r#"{"type":"xdhcp","timeout":"1s500us","resendMax":"2.0000001s"}"#,
            r#"{"type":"xdhcp","timeout":1.0005,"resendMax":299.9999}"#,
        ] {
            let c = parse(&conf(ipam)).unwrap();
            let back: NetworkConfig =
                serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
            assert_eq!(back, c, "{ipam}");
        }
    }

    #[test]
    fn okep_nad_is_accepted_as_upstream_dialect() {
        let c = parse(
            br#"{"cniVersion":"1.0.0","name":"localnet-dhcp","type":"ovn-k8s-cni-overlay",
                "topology":"localnet","role":"secondary","physicalNetworkName":"physnet",
                "ipam":{"type":"dhcp"}}"#,
        )
        .unwrap();
        assert_eq!(c.ipam.ipam_type, IpamType::Dhcp);
        assert_eq!(c.socket_path, PathBuf::from(UPSTREAM_SOCKET));
    }

    /// The exact bytes OVN-Kubernetes builds for the plugin it execs
    /// (`buildDHCPConf`): nothing but version, name, its own type and
    /// `ipam.type`.
    #[test]
    fn ovn_kubernetes_delegated_config() {
        let c = parse(
            br#"{"cniVersion":"1.1.0","ipam":{"type":"dhcp"},"name":"tenant-blue","type":"ovn-k8s-cni-overlay"}"#,
        )
        .unwrap();
        assert_eq!(c.cni_version, "1.1.0");
        assert_eq!(c.name, "tenant-blue");
        assert_eq!(c.ipam.ipam_type, IpamType::Dhcp);
        assert_eq!(c.socket_path, PathBuf::from(UPSTREAM_SOCKET));
        assert_eq!(c.net_attach_def_name, None);
        assert_eq!(c.ipam.client_id, ClientIdSpec::Mac);
        assert!(!c.ipam.apply);
    }

    #[test]
    fn upstream_fields_are_mapped() {
        let c = parse(&conf(
            r#"{"type":"dhcp","daemonSocketPath":"/run/cni/dhcp.sock","priority":100,
               "provide":[{"option":"host-name","fromArg":"K8S_POD_NAME"},
                          {"option":61,"value":"client-a"}],
               "request":[{"skipDefault":false,"option":"classless-static-routes"},{"option":"1"}]}"#,
        ))
        .unwrap();
        assert_eq!(c.socket_path, PathBuf::from("/run/cni/dhcp.sock"));
        assert_eq!(c.ipam.route_priority, Some(100));
        assert_eq!(
            c.ipam.hostname,
            HostnameSpec::FromArg("K8S_POD_NAME".into())
        );
        // As upstream sends it: the value's bytes, no type byte added.
        assert_eq!(c.ipam.client_id, ClientIdSpec::Raw(b"client-a".to_vec()));
        let c = parse(&conf(
            r#"{"type":"dhcp","provide":[{"option":"dhcp-client-identifier","value":"01:02"}]}"#,
        ))
        .unwrap();
        assert_eq!(c.ipam.client_id, ClientIdSpec::Raw(b"01:02".to_vec()));
        let e = err(&conf(
            r#"{"type":"dhcp","provide":[{"option":61,"value":"x"}]}"#,
        ));
        assert!(e.msg.starts_with("ipam.provide[0].value:"), "{e}");
    }

    #[test]
    fn upstream_fields_we_cannot_honour_are_named() {
        let e = err(&conf(
            r#"{"type":"dhcp","provide":[{"option":"user-class","value":"x"}]}"#,
        ));
        assert_eq!(e.code, code::UNSUPPORTED_FIELD);
        assert!(e.msg.starts_with("ipam.provide[0].option:"), "{e}");

        let e = err(&conf(r#"{"type":"dhcp","request":[{"option":"ntp"}]}"#));
        assert_eq!(e.code, code::INVALID_NETWORK_CONFIG);
        assert!(e.msg.starts_with("ipam.request[0].option:"), "{e}");

        let e = err(&conf(r#"{"type":"dhcp","request":[{"option":42}]}"#));
        assert_eq!(e.code, code::UNSUPPORTED_FIELD);
        assert!(e.msg.contains("cannot request option 42"), "{e}");

        let e = err(&conf(
            r#"{"type":"dhcp","provide":[{"option":12,"value":"a","fromArg":"B"}]}"#,
        ));
        assert!(e.msg.starts_with("ipam.provide[0]:"), "{e}");
    }

    #[test]
    fn timeout_bounds_name_the_field() {
        for bad in [r#""0s""#, r#""301s""#, r#""soon""#, "0", "true", r#""10""#] {
            let e = err(&conf(&format!(r#"{{"type":"xdhcp","timeout":{bad}}}"#)));
            assert_eq!(e.code, code::INVALID_NETWORK_CONFIG, "{bad}");
            assert_eq!(
                e.msg, "ipam.timeout: must be a duration between 1s and 300s",
                "{bad}"
            );
        }
        for (good, secs) in [
            (r#""1s""#, 1.0),
            (r#""5m""#, 300.0),
            ("2.5", 2.5),
            (r#""1m30s""#, 90.0),
        ] {
            let c = parse(&conf(&format!(r#"{{"type":"xdhcp","timeout":{good}}}"#))).unwrap();
            assert!(
                (c.ipam.timeout.unwrap().as_secs_f64() - secs).abs() < 1e-9,
                "{good}"
            );
        }
    }

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("1h"), Some(Duration::from_hours(1)));
        assert_eq!(parse_go_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_go_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_go_duration(""), None);
        assert_eq!(parse_go_duration("s"), None);
        assert_eq!(parse_go_duration("10"), None);
        assert_eq!(parse_go_duration("10x"), None);
    }

    #[test]
    fn structural_errors() {
        assert_eq!(err(b"not json").code, code::DECODE_FAILURE);
        assert_eq!(err(b"[1,2]").code, code::DECODE_FAILURE);
        let e = err(br#"{"name":"n","ipam":{"type":"xdhcp"}}"#);
        assert_eq!((e.code, e.msg.as_str()), (7, "cniVersion: missing"));
        let e = err(br#"{"cniVersion":"2.0.0","name":"n","ipam":{"type":"xdhcp"}}"#);
        assert_eq!(e.code, code::INCOMPATIBLE_VERSION);
        assert!(e.msg.contains("1.1.0"));
        let e = err(br#"{"cniVersion":"1.0.0","name":"n"}"#);
        assert!(e.msg.starts_with("ipam: missing"), "{e}");
        let e = err(br#"{"cniVersion":"1.0.0","name":"bad name","ipam":{"type":"xdhcp"}}"#);
        assert!(e.msg.starts_with("name:"), "{e}");
        let e = err(&conf(r#"{"type":"host-local"}"#));
        assert!(e.msg.starts_with("ipam.type:"), "{e}");
        let e = err(&conf(r#"{"type":"xdhcp","timout":"5s"}"#));
        assert_eq!(e.code, code::UNSUPPORTED_FIELD);
        assert!(e.msg.starts_with("ipam.timout: unknown field"), "{e}");
        let e = err(&conf(r#"{"type":"xdhcp","apply":"yes"}"#));
        assert_eq!(e.msg, "ipam.apply: must be true or false, got \"yes\"");
        let e = err(&conf(
            r#"{"type":"xdhcp","protectedPrefixes":["10.1.2.3/8"]}"#,
        ));
        assert!(e.msg.contains("did you mean 10.0.0.0/8"), "{e}");
        assert!(e.msg.starts_with("ipam.protectedPrefixes[0]:"), "{e}");
        let e = err(&conf(r#"{"type":"xdhcp","socketPath":"rel.sock"}"#));
        assert!(e.msg.starts_with("ipam.socketPath:"), "{e}");
        let e = err(&conf(
            r#"{"type":"xdhcp","socketPath":"/a","daemonSocketPath":"/b"}"#,
        ));
        assert!(e.msg.contains("conflicts"), "{e}");
        let e = err(&conf(r#"{"type":"xdhcp","hostname":"-bad-"}"#));
        assert!(e.msg.starts_with("ipam.hostname:"), "{e}");
        let e = err(&conf(r#"{"type":"xdhcp","clientId":"ab:"}"#));
        assert!(e.msg.starts_with("ipam.clientId:"), "{e}");
        let e = err(br#"{"cniVersion":"1.0.0","name":"n","netAttachDefName":"noslash","ipam":{"type":"xdhcp"}}"#);
        assert!(e.msg.starts_with("netAttachDefName:"), "{e}");
    }

    #[test]
    fn hostname_rules() {
        for ok in ["web", "web-1.example.com", "a", &"a".repeat(63)] {
            assert_eq!(validate_hostname(ok), Ok(()), "{ok}");
        }
        assert_eq!(
            validate_hostname(""),
            Err(HostnameError::Length {
                name: String::new(),
                len: 0
            })
        );
        assert!(matches!(
            validate_hostname(&"a.".repeat(127)),
            Err(HostnameError::Length { len: 254, .. })
        ));
        for (bad, label) in [
            ("-web", "-web"),
            ("web-.x", "web-"),
            ("a..b", ""),
            ("a.", ""),
            ("we_b", "we_b"),
            (&"a".repeat(64), &"a".repeat(64)),
        ] {
            assert_eq!(
                validate_hostname(bad),
                Err(HostnameError::Label {
                    name: bad.to_owned(),
                    label: label.to_owned()
                }),
                "{bad}"
            );
        }
        let e = validate_hostname("we_b").unwrap_err().to_string();
        assert!(e.starts_with("\"we_b\" is not a valid host name"), "{e}");
    }

    #[test]
    fn client_id_forms() {
        assert_eq!(parse_client_id("mac"), Ok(ClientIdSpec::Mac));
        assert_eq!(parse_client_id("none"), Ok(ClientIdSpec::None));
        assert_eq!(parse_client_id("01:02"), Ok(ClientIdSpec::Raw(vec![1, 2])));
        assert_eq!(
            parse_client_id("ab"),
            Ok(ClientIdSpec::Raw(vec![0, b'a', b'b']))
        );
        assert!(parse_client_id("01").is_ok());
        assert_eq!(
            parse_client_id(&"x".repeat(255)),
            Err(ClientIdError::Length {
                input: "x".repeat(255),
                len: 256
            })
        );
        assert_eq!(
            parse_client_id("01:2"),
            Err(ClientIdError::NotHex {
                input: "01:2".into()
            })
        );
    }

    #[test]
    fn gc_attachments() {
        let c = parse(
            br#"{"cniVersion":"1.1.0","name":"n","ipam":{"type":"xdhcp"},
                "cni.dev/valid-attachments":[{"containerID":"abc","ifname":"eth0"}]}"#,
        )
        .unwrap();
        assert_eq!(
            c.valid_attachments,
            Some(vec![Attachment {
                container_id: "abc".into(),
                ifname: "eth0".into()
            }])
        );
        let e = err(
            br#"{"cniVersion":"1.1.0","name":"n","ipam":{"type":"xdhcp"},
                "cni.dev/valid-attachments":[{"containerID":"abc"}]}"#,
        );
        assert_eq!(e.msg, "cni.dev/valid-attachments[0].ifname: missing");
    }

    #[test]
    fn runtime_config_device_id() {
        let c = parse(
            br#"{"cniVersion":"1.0.0","name":"n","ipam":{"type":"xdhcp"},
                "runtimeConfig":{"deviceID":"0000:af:00.2"}}"#,
        )
        .unwrap();
        assert_eq!(c.device_id.as_deref(), Some("0000:af:00.2"));
    }

    #[test]
    fn sniffs_version_for_error_replies() {
        assert_eq!(
            sniff_version(br#"{"cniVersion":"0.4.0"}"#).as_deref(),
            Some("0.4.0")
        );
        assert_eq!(sniff_version(br#"{"cniVersion":"9.9.9"}"#), None);
        assert_eq!(sniff_version(b"garbage"), None);
    }

    #[test]
    fn dhcp_guard_defaults_fields_and_errors() {
        let c = parse(&conf(r#"{"type":"xdhcp"}"#)).unwrap();
        assert_eq!(c.ipam.dhcp_guard, DhcpGuardSpec::default());
        assert!((15..=100).contains(&c.ipam.dhcp_guard.rate));
        let c = parse(&conf(
            r#"{"type":"dhcp","dhcpGuard":{"trusted":true,"rate":50,"burst":5}}"#,
        ))
        .unwrap();
        assert_eq!(
            c.ipam.dhcp_guard,
            DhcpGuardSpec {
                trusted: true,
                rate: 50,
                burst: 5
            }
        );
        let back: NetworkConfig =
            serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
        for (ipam, field) in [
            (r#"{"type":"xdhcp","dhcpGuard":true}"#, "ipam.dhcpGuard"),
            (
                r#"{"type":"xdhcp","dhcpGuard":{"rate":0}}"#,
                "ipam.dhcpGuard.rate",
            ),
            (
                r#"{"type":"xdhcp","dhcpGuard":{"burst":"9"}}"#,
                "ipam.dhcpGuard.burst",
            ),
            (
                r#"{"type":"xdhcp","dhcpGuard":{"trusted":1}}"#,
                "ipam.dhcpGuard.trusted",
            ),
            (
                r#"{"type":"xdhcp","dhcpGuard":{"rates":1}}"#,
                "ipam.dhcpGuard.rates",
            ),
        ] {
            let e = err(&conf(ipam));
            assert!(e.msg.contains(field), "{ipam}: {e:?}");
        }
    }
}
