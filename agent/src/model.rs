//! Who an attachment is for and the network it is on, as the agent decides
//! them at ADD and keeps them for the lease's life (in memory and in the
//! lease store).

use std::net::Ipv4Addr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Pod or VM, as decided at ADD.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum WorkloadKind {
    /// Plain pod: the lease is maintained until DEL.
    Pod,
    /// `KubeVirt` VM: one-shot discovery, never configured, no RELEASE.
    Vm { vmi: String },
}

/// The pod an attachment belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
}

/// The node uplink that carried a lease's replies: where a RELEASE goes out
/// when the pod's own interface is gone at DEL.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UplinkRef {
    /// Interface name in the agent's namespace.
    pub ifname: String,
    /// The 802.1Q VLAN the replies carried there, if tagged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
}

/// The network an attachment is on, as the agent keeps it for the lease's
/// life and stores it in the lease record: what a restarted agent needs to
/// resume the lease (the DHCP client's settings, whether the address is
/// configured, the guard's settings, the names the reports use). The ADD
/// converts it from the CNI network configuration it was given (`ops`);
/// the CNI wire types stay out of the lease store.
///
/// The stored form (field names, value forms) is the one the lease store
/// has always written for the network configuration, so records written by
/// earlier agents load, and an earlier agent reads what this one writes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Network {
    /// The CNI version the network's configuration named.
    pub cni_version: String,
    /// The network's name.
    pub name: String,
    /// The network attachment definition (`<namespace>/<name>`), if named.
    pub net_attach_def_name: Option<String>,
    /// The agent socket the configuration named.
    pub socket_path: std::path::PathBuf,
    /// The PCI device id of an SR-IOV VF, if the configuration named one.
    pub device_id: Option<String>,
    /// The DHCP settings.
    pub ipam: Ipam,
}

/// A network's DHCP settings (the configuration's `ipam` object).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ipam {
    /// Which plugin name the configuration used.
    pub ipam_type: IpamKind,
    /// The agent configures the leased address and routes on the pod
    /// interface itself.
    pub apply: bool,
    /// The client identifier to send.
    pub client_id: ClientIdSetting,
    /// Where the hostname comes from.
    pub hostname: HostnameSetting,
    /// The overall acquisition deadline, if the network sets one.
    #[serde(with = "opt_millis", default)]
    pub timeout: Option<Duration>,
    /// The retransmission backoff cap, if the network sets one.
    #[serde(with = "opt_millis", default)]
    pub resend_max: Option<Duration>,
    /// Option 121 may carry a default route.
    pub allow_default_route_override: bool,
    /// Option-121 routes into these are refused.
    pub protected_prefixes: Vec<Prefix>,
    /// Route metric of the routes returned and configured.
    pub route_priority: Option<u32>,
    /// The DHCP guard on the workload's port.
    #[serde(default)]
    pub dhcp_guard: GuardSetting,
    /// Which family the network leases (absent in records of IPv4
    /// networks, as in every record written before IPv6).
    #[serde(default, skip_serializing_if = "Family::is_ipv4")]
    pub family: Family,
    /// What an IPv6 network names besides the lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<Ipv6Setting>,
}

/// The address family a network leases.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// DHCPv4.
    #[default]
    Ipv4,
    /// DHCPv6, one `IA_NA` address.
    Ipv6,
    /// Both: a DHCPv4 lease and a `DHCPv6` one on each attachment, each in
    /// a record of its own.
    Dual,
}

impl Family {
    /// Whether this is IPv4 (the stored default, not written).
    pub fn is_ipv4(&self) -> bool {
        *self == Family::Ipv4
    }

    /// Bounded label for views and logs.
    pub fn label(self) -> &'static str {
        match self {
            Family::Ipv4 => "ipv4",
            Family::Ipv6 => "ipv6",
            Family::Dual => "dual",
        }
    }
}

/// An IPv6 network's prefix length, gateway and Rapid Commit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ipv6Setting {
    /// The on-link prefix's length; without it a lease is a /128.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_length: Option<u8>,
    /// The default router (only with a prefix length).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<std::net::Ipv6Addr>,
    /// Ask for Rapid Commit.
    #[serde(default)]
    pub rapid_commit: bool,
}

/// The plugin name a configuration used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IpamKind {
    /// `xdhcp`.
    Xdhcp,
    /// `dhcp`, the upstream plugin's name.
    Dhcp,
}

/// The client identifier (option 61) to send.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "kind", content = "bytes")]
pub enum ClientIdSetting {
    /// Type 1 and the MAC.
    Mac,
    /// None.
    None,
    /// Exactly these bytes.
    Raw(Vec<u8>),
}

/// Where the hostname (option 12) comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "kind", content = "value")]
pub enum HostnameSetting {
    /// The pod name (`K8S_POD_NAME`), when it is a valid hostname.
    PodName,
    /// A fixed hostname.
    Fixed(String),
    /// The value of this `CNI_ARGS` key.
    FromArg(String),
}

/// The DHCP guard's settings on a workload port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GuardSetting {
    /// DHCP server messages from the workload pass.
    pub trusted: bool,
    /// Client messages per second the port may send.
    pub rate: u32,
    /// Client messages a quiet port may send back to back.
    pub burst: u32,
}

impl Default for GuardSetting {
    fn default() -> Self {
        Self {
            trusted: false,
            rate: xdhcp_common::guard::GUARD_DEFAULT_RATE,
            burst: xdhcp_common::guard::GUARD_DEFAULT_BURST,
        }
    }
}

/// An IPv4 prefix, stored as `a.b.c.d/n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefix {
    pub addr: Ipv4Addr,
    pub len: u8,
}

impl Serialize for Prefix {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&format_args!("{}/{}", self.addr, self.len))
    }
}

impl<'de> Deserialize<'de> for Prefix {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        let bad = || serde::de::Error::custom(format!("invalid IPv4 prefix {text:?}"));
        let (addr, len) = text.split_once('/').ok_or_else(bad)?;
        Ok(Self {
            addr: addr.parse().map_err(|_| bad())?,
            len: len.parse().ok().filter(|n| *n <= 32).ok_or_else(bad)?,
        })
    }
}

/// `Option<Duration>` stored as whole milliseconds.
mod opt_millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    #[expect(
        clippy::ref_option,
        reason = "serde's `with` protocol passes &Option<T>"
    )]
    pub(super) fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_millis))
    }
}
