//! `ClusterUserDefinedNetwork` (`k8s.ovn.org/v1`): the parts the DHCP IPAM mode touches.
//!
//! The shape follows OVN-Kubernetes' CRD (`spec.namespaceSelector` and the `spec.network` union
//! of `layer3` / `layer2` / `localnet`), extended with the OKEP's `ipam.mode: DHCP` and its three
//! validation rules. The rules are attached to the types with `#[x_kube(validation = ...)]`, so the
//! generated CRD carries them as `x-kubernetes-validations` and the apiserver enforces them.
//!
//! Unknown fields of a real OVN-K object (fields newer than this model) are ignored on read; this
//! crate never writes a `ClusterUserDefinedNetwork` back.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, KubeSchema};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

/// CEL rule texts and messages, exactly as the OKEP states them.
pub mod rules {
    /// Localnet: DHCP only with role `Secondary`.
    pub const LOCALNET_DHCP_SECONDARY_ONLY: &str = r#"!has(self.ipam) || !has(self.ipam.mode) || self.ipam.mode != "DHCP" || self.role == "Secondary""#;
    /// Message of [`LOCALNET_DHCP_SECONDARY_ONLY`].
    pub const LOCALNET_DHCP_SECONDARY_ONLY_MESSAGE: &str =
        "DHCP ipam.mode is only supported for Localnet Secondary networks";
    /// Localnet: `subnets` forbidden with DHCP.
    pub const LOCALNET_DHCP_NO_SUBNETS: &str = r#"!has(self.ipam) || !has(self.ipam.mode) || self.ipam.mode != "DHCP" || !has(self.subnets)"#;
    /// Message of [`LOCALNET_DHCP_NO_SUBNETS`].
    pub const LOCALNET_DHCP_NO_SUBNETS_MESSAGE: &str = "Subnets is forbidden when ipam.mode is DHCP; addresses are assigned by the external DHCP server";
    /// Layer2: DHCP rejected.
    pub const LAYER2_NO_DHCP: &str =
        r#"!has(self.ipam) || !has(self.ipam.mode) || self.ipam.mode != "DHCP""#;
    /// Message of [`LAYER2_NO_DHCP`].
    pub const LAYER2_NO_DHCP_MESSAGE: &str =
        "DHCP ipam.mode is not supported for Layer2 topology, use Localnet topology instead";
    /// xdhcp's own rule (not the OKEP's): `ipam.dhcpGuard` tunes the DHCP
    /// guard on the ports of a DHCP network, and means nothing elsewhere.
    pub const DHCP_GUARD_NEEDS_DHCP: &str = r#"!has(self.ipam) || !has(self.ipam.dhcpGuard) || (has(self.ipam.mode) && self.ipam.mode == "DHCP")"#;
    /// Message of [`DHCP_GUARD_NEEDS_DHCP`].
    pub const DHCP_GUARD_NEEDS_DHCP_MESSAGE: &str =
        "ipam.dhcpGuard is only supported when ipam.mode is DHCP";
    /// xdhcp's own rule: `ipam.dhcpFamilies` says which address families
    /// the external DHCP server assigns, and means nothing without DHCP.
    pub const DHCP_FAMILIES_NEED_DHCP: &str = r#"!has(self.ipam) || !has(self.ipam.dhcpFamilies) || (has(self.ipam.mode) && self.ipam.mode == "DHCP")"#;
    /// Message of [`DHCP_FAMILIES_NEED_DHCP`].
    pub const DHCP_FAMILIES_NEED_DHCP_MESSAGE: &str =
        "ipam.dhcpFamilies is only supported when ipam.mode is DHCP";
    /// xdhcp's own rule: each family named once, so a network is IPv4,
    /// IPv6, or dual stack (both, in either order).
    pub const DHCP_FAMILIES_DISTINCT: &str = "!has(self.ipam) || !has(self.ipam.dhcpFamilies) || size(self.ipam.dhcpFamilies) == 1 || self.ipam.dhcpFamilies[0] != self.ipam.dhcpFamilies[1]";
    /// Message of [`DHCP_FAMILIES_DISTINCT`].
    pub const DHCP_FAMILIES_DISTINCT_MESSAGE: &str =
        "ipam.dhcpFamilies names each family once: [IPv4], [IPv6], or [IPv4, IPv6] for dual stack";
}

/// Which namespaces get the network, and the network itself.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "k8s.ovn.org",
    version = "v1",
    kind = "ClusterUserDefinedNetwork",
    plural = "clusteruserdefinednetworks",
    singular = "clusteruserdefinednetwork",
    status = "ClusterUserDefinedNetworkStatus",
    derive = "PartialEq",
    doc = "ClusterUserDefinedNetwork describes a network shared across the selected namespaces."
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterUserDefinedNetworkSpec {
    /// Label selector for the namespaces the network is available in.
    #[schemars(schema_with = "label_selector_schema")]
    pub namespace_selector: LabelSelector,
    /// The network; immutable once created.
    pub network: NetworkSpec,
}

/// The conditions OVN-Kubernetes reports.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterUserDefinedNetworkStatus {
    /// Conditions about the network (for example `NetworkCreated`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
}

/// The network union: `topology` names which of `layer3`, `layer2`, `localnet` is set.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "has(self.topology) && self.topology == 'Layer3' ? has(self.layer3): !has(self.layer3)"
).message("spec.layer3 is required when topology is Layer3 and forbidden otherwise"))]
#[x_kube(validation = Rule::new(
    "has(self.topology) && self.topology == 'Layer2' ? has(self.layer2): !has(self.layer2)"
).message("spec.layer2 is required when topology is Layer2 and forbidden otherwise"))]
#[x_kube(validation = Rule::new(
    "has(self.topology) && self.topology == 'Localnet' ? has(self.localnet): !has(self.localnet)"
).message("spec.localnet is required when topology is Localnet and forbidden otherwise"))]
#[x_kube(validation = Rule::new("self == oldSelf").message("Network spec is immutable"))]
pub struct NetworkSpec {
    /// Which topology configuration below is used.
    pub topology: NetworkTopology,
    /// Layer3 topology configuration (not used by the DHCP mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer3: Option<Layer3Config>,
    /// Layer2 topology configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer2: Option<Layer2Config>,
    /// Localnet topology configuration: the only topology the DHCP mode supports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub localnet: Option<LocalnetConfig>,
}

/// The network topology.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum NetworkTopology {
    /// One logical switch per node, routed.
    Layer3,
    /// One logical switch shared by all nodes.
    Layer2,
    /// A logical switch bridged onto a physical network (OVS bridge mapping).
    Localnet,
}

impl NetworkTopology {
    /// The lower-case name OVN-Kubernetes writes into the NAD (`"localnet"`, ...).
    pub fn cni_name(self) -> &'static str {
        match self {
            Self::Layer3 => "layer3",
            Self::Layer2 => "layer2",
            Self::Localnet => "localnet",
        }
    }
}

/// The role of the network in the pod.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum NetworkRole {
    /// The pod's primary network.
    Primary,
    /// An additional network selected with `k8s.v1.cni.cncf.io/networks`.
    Secondary,
}

impl NetworkRole {
    /// The lower-case name OVN-Kubernetes writes into the NAD (`"secondary"`, ...).
    pub fn cni_name(self) -> &'static str {
        match self {
            Self::Primary => "primary",
            Self::Secondary => "secondary",
        }
    }
}

/// How much of the IP configuration OVN-Kubernetes manages.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum IpamMode {
    /// OVN-Kubernetes assigns addresses from `subnets`.
    Enabled,
    /// No address assignment; the workload configures its own.
    Disabled,
    /// An external DHCP server assigns addresses (IPv4 unless `dhcpFamilies` says otherwise);
    /// lease handling is chosen per workload (pods: the DHCP IPAM plugin maintains the lease;
    /// virtual machines: one-shot discovery).
    #[serde(rename = "DHCP")]
    Dhcp,
}

/// IP address lifecycle.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum IpamLifecycle {
    /// Assigned addresses persist in `ipamclaims.k8s.cni.cncf.io` objects.
    Persistent,
}

/// IPAM configuration of a layer2 or localnet network.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IpamConfig {
    /// Enabled (the default when unset), Disabled or DHCP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<IpamMode>,
    /// Address lifecycle; only meaningful with mode Enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<IpamLifecycle>,
    /// The DHCP guard on the network's workload ports (mode DHCP only; an
    /// xdhcp extension): rendered into the NAD's `ipam.dhcpGuard`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhcp_guard: Option<DhcpGuardConfig>,
    /// The address families the external DHCP server assigns (mode DHCP
    /// only; an xdhcp extension): `[IPv4]` when unset, `[IPv6]` for DHCPv6,
    /// both (`[IPv4, IPv6]`, each once) for dual stack: a DHCPv4 and a
    /// DHCPv6 lease on every attachment. Rendered into the NAD's
    /// `ipam.family` (`ipv6`, `dual`; none for IPv4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2))]
    pub dhcp_families: Option<Vec<IpFamily>>,
}

/// An address family, named as Kubernetes names them (`ipFamilies`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum IpFamily {
    /// DHCPv4.
    IPv4,
    /// DHCPv6.
    IPv6,
}

/// `ipam.dhcpGuard`: the DHCP guard's settings for a network, every field
/// optional (the agent's defaults: untrusted, 20 client messages a second,
/// a burst of 10). The same object in the CUDN and in the NAD's `ipam`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DhcpGuardConfig {
    /// DHCP server messages from the network's workloads pass (a network
    /// whose DHCP server or relay runs in a pod).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trusted: Option<bool>,
    /// Client messages per second a workload port may send.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    pub rate: Option<u32>,
    /// Client messages a quiet workload port may send back to back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    pub burst: Option<u32>,
}

/// Localnet topology configuration.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(rules::LOCALNET_DHCP_SECONDARY_ONLY)
    .message(rules::LOCALNET_DHCP_SECONDARY_ONLY_MESSAGE))]
#[x_kube(validation = Rule::new(rules::LOCALNET_DHCP_NO_SUBNETS)
    .message(rules::LOCALNET_DHCP_NO_SUBNETS_MESSAGE))]
#[x_kube(validation = Rule::new(rules::DHCP_GUARD_NEEDS_DHCP)
    .message(rules::DHCP_GUARD_NEEDS_DHCP_MESSAGE))]
#[x_kube(validation = Rule::new(rules::DHCP_FAMILIES_NEED_DHCP)
    .message(rules::DHCP_FAMILIES_NEED_DHCP_MESSAGE))]
#[x_kube(validation = Rule::new(rules::DHCP_FAMILIES_DISTINCT)
    .message(rules::DHCP_FAMILIES_DISTINCT_MESSAGE))]
pub struct LocalnetConfig {
    /// The network role in the pod; mode DHCP requires Secondary.
    pub role: NetworkRole,
    /// The OVS bridge mapping's network name on the nodes.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[^,:]+$')")
        .message("physicalNetworkName cannot contain `,` or `:` characters"))]
    pub physical_network_name: String,
    /// Subnets OVN-Kubernetes assigns from (one per IP family); forbidden with DHCP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2))]
    pub subnets: Option<Vec<String>>,
    /// CIDRs removed from subnets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 25))]
    pub exclude_subnets: Option<Vec<String>>,
    /// IPAM configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipam: Option<IpamConfig>,
    /// MTU of the pod interface.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 576, max = 65536))]
    pub mtu: Option<i32>,
    /// VLAN configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<VlanConfig>,
}

impl LocalnetConfig {
    /// The effective IPAM mode (`Enabled` when unset, as in OVN-Kubernetes).
    pub fn ipam_mode(&self) -> IpamMode {
        self.ipam
            .as_ref()
            .and_then(|i| i.mode)
            .unwrap_or(IpamMode::Enabled)
    }
}

/// VLAN mode.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum VlanMode {
    /// The logical switch port is an access port of `access.id`.
    Access,
}

/// VLAN configuration of a localnet network.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VlanConfig {
    /// VLAN mode.
    pub mode: VlanMode,
    /// Access VLAN; required with mode Access.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<AccessVlanConfig>,
}

/// Access VLAN configuration.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub struct AccessVlanConfig {
    /// VLAN id, 1 to 4094.
    #[schemars(range(min = 1, max = 4094))]
    pub id: i32,
}

/// Layer2 topology configuration.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(rules::LAYER2_NO_DHCP).message(rules::LAYER2_NO_DHCP_MESSAGE))]
#[x_kube(validation = Rule::new(rules::DHCP_GUARD_NEEDS_DHCP)
    .message(rules::DHCP_GUARD_NEEDS_DHCP_MESSAGE))]
pub struct Layer2Config {
    /// The network role in the pod.
    pub role: NetworkRole,
    /// MTU of the pod interface.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 576, max = 65536))]
    pub mtu: Option<i32>,
    /// Subnets OVN-Kubernetes assigns from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2))]
    pub subnets: Option<Vec<String>>,
    /// Join subnets (primary networks only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2))]
    pub join_subnets: Option<Vec<String>>,
    /// IPAM configuration; mode DHCP is rejected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipam: Option<IpamConfig>,
}

/// Layer3 topology configuration.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Layer3Config {
    /// The network role in the pod.
    pub role: NetworkRole,
    /// MTU of the pod interface.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 576, max = 65536))]
    pub mtu: Option<i32>,
    /// Cluster subnets, split per node.
    #[schemars(length(min = 1, max = 2))]
    pub subnets: Vec<Layer3Subnet>,
    /// Join subnets (primary networks only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2))]
    pub join_subnets: Option<Vec<String>>,
}

/// One layer3 cluster subnet.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Layer3Subnet {
    /// Cluster CIDR.
    pub cidr: String,
    /// Per-node prefix length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 127))]
    pub host_subnet: Option<i32>,
}

/// Structural schema of `metav1.LabelSelector` (k8s-openapi's `schemars` feature is not enabled:
/// it would add schema impls for every Kubernetes type to every build of the workspace).
fn label_selector_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "description": "A label query over a set of resources (metav1.LabelSelector).",
        "properties": {
            "matchLabels": {
                "type": "object",
                "additionalProperties": { "type": "string" }
            },
            "matchExpressions": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["key", "operator"],
                    "properties": {
                        "key": { "type": "string" },
                        "operator": { "type": "string" },
                        "values": { "type": "array", "items": { "type": "string" } }
                    }
                }
            }
        },
        "x-kubernetes-map-type": "atomic"
    })
}

/// Structural schema of a list of `metav1.Condition`, keyed by `type`.
fn conditions_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "items": {
            "type": "object",
            "required": ["lastTransitionTime", "message", "reason", "status", "type"],
            "properties": {
                "lastTransitionTime": { "type": "string", "format": "date-time" },
                "message": { "type": "string", "maxLength": 32768 },
                "observedGeneration": { "type": "integer", "format": "int64", "minimum": 0 },
                "reason": { "type": "string", "maxLength": 1024, "minLength": 1 },
                "status": { "type": "string", "enum": ["True", "False", "Unknown"] },
                "type": { "type": "string", "maxLength": 316 }
            }
        }
    })
}
