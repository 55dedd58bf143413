//! `NetworkAttachmentDefinition` rendering from a `ClusterUserDefinedNetwork`, and NAD validation.
//!
//! Rendering follows OVN-Kubernetes' UDN controller: one NAD per selected namespace, named like
//! the CUDN, carrying a single-plugin (not a `plugins` list) `ovn-k8s-cni-overlay` config. For a
//! localnet network in `DHCP` mode the config gains `"ipam": {"type": "dhcp"}` and no `subnets`
//! (OKEP "Generated NAD Config"). The config does not depend on the workload: pods and `KubeVirt`
//! VMs get the same NAD, and the lease handling is chosen at CNI ADD time.
//!
//! Validation follows the OKEP's change to OVN-K's NAD controller: an `ipam.type` is accepted
//! only when it is empty or `dhcp`; anything else is rejected with the offending value named.
//!
//! One thing: the NAD a CUDN renders to, and its validation (about 420
//! lines of code; the rest is its tests).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{CustomResource, Resource as _};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::cudn::{
    ClusterUserDefinedNetwork, DhcpGuardConfig, IpFamily, IpamLifecycle, IpamMode, NetworkTopology,
};

/// `cniVersion` of rendered configs.
pub const CNI_VERSION: &str = "1.0.0";
/// The OVN-Kubernetes CNI plugin type.
pub const OVN_K8S_CNI_OVERLAY: &str = "ovn-k8s-cni-overlay";
/// The IPAM type that selects DHCP (the upstream DHCP plugin's name, which xdhcp also answers to).
pub const DHCP_IPAM_TYPE: &str = "dhcp";
/// Label OVN-Kubernetes puts on the NADs it renders.
pub const LABEL_USER_DEFINED_NETWORK: &str = "k8s.ovn.org/user-defined-network";
/// Finalizer OVN-Kubernetes puts on the NADs it renders.
pub const FINALIZER_USER_DEFINED_NETWORK: &str = "k8s.ovn.org/user-defined-network-protection";
/// Prefix of the CNI network name of a CUDN (`cluster.udn.<cudn name>`).
pub const CUDN_NETWORK_NAME_PREFIX: &str = "cluster.udn.";

/// `spec` of a `k8s.cni.cncf.io/v1` `NetworkAttachmentDefinition`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "k8s.cni.cncf.io",
    version = "v1",
    kind = "NetworkAttachmentDefinition",
    plural = "network-attachment-definitions",
    namespaced,
    derive = "PartialEq"
)]
pub struct NetworkAttachmentDefinitionSpec {
    /// The CNI network configuration, as a JSON document in a string.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub config: String,
}

/// The OVN-Kubernetes CNI network configuration carried by a UDN NAD.
///
/// Fields this crate does not model are kept in [`NetConf::extra`], so parsing and serialising a
/// config loses nothing.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NetConf {
    /// CNI spec version.
    pub cni_version: String,
    /// CNI network name.
    pub name: String,
    /// Plugin type (`ovn-k8s-cni-overlay`).
    #[serde(rename = "type")]
    pub plugin_type: String,
    /// `<namespace>/<name>` of the NAD this config belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net_attach_def_name: Option<String>,
    /// `layer3`, `layer2` or `localnet`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<String>,
    /// `primary` or `secondary`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// Localnet: the OVS bridge mapping's network name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub physical_network_name: Option<String>,
    /// Pod interface MTU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Comma-separated subnets OVN-K assigns from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnets: Option<String>,
    /// Comma-separated excluded subnets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclude_subnets: Option<String>,
    /// Localnet access VLAN.
    #[serde(rename = "vlanID", default, skip_serializing_if = "Option::is_none")]
    pub vlan_id: Option<u16>,
    /// Persistent IPs (`ipam.lifecycle: Persistent`).
    #[serde(
        rename = "allowPersistentIPs",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub allow_persistent_ips: Option<bool>,
    /// IPAM delegation; only `{"type": "dhcp"}` (or an empty type) is valid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipam: Option<IpamConf>,
    /// Every other key, preserved verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The `ipam` object of a [`NetConf`].
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct IpamConf {
    /// IPAM plugin type; empty or `dhcp`.
    #[serde(rename = "type", default)]
    pub ipam_type: String,
    /// `dhcpGuard`: the DHCP guard on the network's workload ports, as the
    /// agent reads it (fields left out take the agent's defaults).
    #[serde(rename = "dhcpGuard", default, skip_serializing_if = "Option::is_none")]
    pub dhcp_guard: Option<DhcpGuardConfig>,
    /// `family`: `ipv6` for a DHCPv6 network (the CUDN's `dhcpFamilies:
    /// [IPv6]`); left out for IPv4, the agent's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub family: Option<String>,
    /// Every other key (plugin-specific settings), preserved verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl NetConf {
    /// Whether the config delegates addressing to DHCP (`ipam.type == "dhcp"`).
    pub fn is_dhcp(&self) -> bool {
        self.ipam
            .as_ref()
            .is_some_and(|i| i.ipam_type == DHCP_IPAM_TYPE)
    }
}

/// Why a CUDN cannot be rendered into a NAD.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// The CUDN has no `metadata.name`.
    #[error("ClusterUserDefinedNetwork has no metadata.name")]
    MissingName,
    /// The target namespace is empty.
    #[error("ClusterUserDefinedNetwork {cudn}: target namespace is empty")]
    EmptyNamespace {
        /// CUDN name.
        cudn: String,
    },
    /// `topology` names a configuration that is absent.
    #[error(
        "ClusterUserDefinedNetwork {cudn}: topology {topology:?} is specified but its configuration is missing"
    )]
    MissingTopologyConfig {
        /// CUDN name.
        cudn: String,
        /// The topology.
        topology: NetworkTopology,
    },
    /// Only localnet networks are rendered here.
    #[error(
        "ClusterUserDefinedNetwork {cudn}: topology {topology:?} is rendered by OVN-Kubernetes, not by xdhcp (only Localnet is supported)"
    )]
    UnsupportedTopology {
        /// CUDN name.
        cudn: String,
        /// The topology.
        topology: NetworkTopology,
    },
    /// The rendered config breaks the NAD rules (the CUDN escaped CRD validation).
    #[error("ClusterUserDefinedNetwork {cudn}: rendered NAD is invalid")]
    Invalid {
        /// CUDN name.
        cudn: String,
        /// What is wrong.
        #[source]
        source: NadError,
    },
    /// Serialising the config failed.
    #[error("ClusterUserDefinedNetwork {cudn}: serialising the CNI config")]
    Serialize {
        /// CUDN name.
        cudn: String,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
}

/// Why a NAD config is rejected.
#[derive(Debug, thiserror::Error)]
pub enum NadError {
    /// `spec.config` is not a valid CNI config.
    #[error("error parsing NAD {nad}: invalid CNI config")]
    Parse {
        /// `<namespace>/<name>`.
        nad: String,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
    /// An IPAM type other than empty or `dhcp`.
    #[error(
        "error parsing NAD {nad}: unsupported ipam type {ipam_type:?}: only an empty type or \"dhcp\" is allowed"
    )]
    UnsupportedIpamType {
        /// `<namespace>/<name>`.
        nad: String,
        /// The offending value.
        ipam_type: String,
    },
    /// DHCP IPAM on a topology other than localnet.
    #[error(
        "error parsing NAD {nad}: DHCP IPAM is only supported for localnet topology, not {topology:?}"
    )]
    DhcpTopology {
        /// `<namespace>/<name>`.
        nad: String,
        /// The topology in the config (empty when absent).
        topology: String,
    },
    /// DHCP IPAM on a network whose role is not secondary.
    #[error(
        "error parsing NAD {nad}: DHCP IPAM is only supported for secondary networks, not role {role:?}"
    )]
    DhcpRole {
        /// `<namespace>/<name>`.
        nad: String,
        /// The role in the config.
        role: String,
    },
    /// DHCP IPAM together with OVN-K subnets.
    #[error(
        "error parsing NAD {nad}: subnets {subnets:?} are forbidden with DHCP IPAM; addresses are assigned by the external DHCP server"
    )]
    DhcpWithSubnets {
        /// `<namespace>/<name>`.
        nad: String,
        /// The subnets in the config.
        subnets: String,
    },
}

/// Parse a NAD's `spec.config` and validate it ([`validate_netconf`]).
pub fn parse_netconf(nad: &str, config: &str) -> Result<NetConf, NadError> {
    let conf: NetConf = serde_json::from_str(config).map_err(|source| NadError::Parse {
        nad: nad.to_owned(),
        source,
    })?;
    validate_netconf(nad, &conf)?;
    Ok(conf)
}

/// Validate a NAD object: its `spec.config` must parse and pass [`validate_netconf`].
pub fn validate_nad(nad: &NetworkAttachmentDefinition) -> Result<NetConf, NadError> {
    let name = format!(
        "{}/{}",
        nad.metadata.namespace.as_deref().unwrap_or_default(),
        nad.metadata.name.as_deref().unwrap_or_default()
    );
    parse_netconf(&name, &nad.spec.config)
}

/// The NAD controller's IPAM rule: `ipam.type` must be empty or `dhcp`. With `dhcp`, the config
/// must also be a localnet secondary network without `subnets` (the CRD's DHCP rules, enforced
/// again here because NADs can be written by hand).
pub fn validate_netconf(nad: &str, conf: &NetConf) -> Result<(), NadError> {
    let Some(ipam) = &conf.ipam else {
        return Ok(());
    };
    match ipam.ipam_type.as_str() {
        "" => Ok(()),
        DHCP_IPAM_TYPE => {
            let topology = conf.topology.as_deref().unwrap_or_default();
            if topology != NetworkTopology::Localnet.cni_name() {
                return Err(NadError::DhcpTopology {
                    nad: nad.to_owned(),
                    topology: topology.to_owned(),
                });
            }
            let role = conf.role.as_deref().unwrap_or_default();
            if role != "secondary" {
                return Err(NadError::DhcpRole {
                    nad: nad.to_owned(),
                    role: role.to_owned(),
                });
            }
            if let Some(subnets) = conf.subnets.as_deref().filter(|s| !s.is_empty()) {
                return Err(NadError::DhcpWithSubnets {
                    nad: nad.to_owned(),
                    subnets: subnets.to_owned(),
                });
            }
            Ok(())
        }
        other => Err(NadError::UnsupportedIpamType {
            nad: nad.to_owned(),
            ipam_type: other.to_owned(),
        }),
    }
}

/// `<namespace>/<name>`, the NAD key OVN-Kubernetes and Multus use.
pub fn nad_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// Render the CNI config of the NAD for `cudn` in `namespace`.
pub fn render_netconf(
    cudn: &ClusterUserDefinedNetwork,
    namespace: &str,
) -> Result<NetConf, RenderError> {
    let name = cudn
        .metadata
        .name
        .as_deref()
        .filter(|n| !n.is_empty())
        .ok_or(RenderError::MissingName)?;
    if namespace.is_empty() {
        return Err(RenderError::EmptyNamespace {
            cudn: name.to_owned(),
        });
    }
    let network = &cudn.spec.network;
    let topology = network.topology;
    let localnet = match topology {
        NetworkTopology::Localnet => {
            network
                .localnet
                .as_ref()
                .ok_or(RenderError::MissingTopologyConfig {
                    cudn: name.to_owned(),
                    topology,
                })?
        }
        NetworkTopology::Layer2 | NetworkTopology::Layer3 => {
            return Err(RenderError::UnsupportedTopology {
                cudn: name.to_owned(),
                topology,
            });
        }
    };
    let join = |v: &Option<Vec<String>>| v.as_ref().filter(|v| !v.is_empty()).map(|v| v.join(","));
    let mode = localnet.ipam_mode();
    let (subnets, exclude_subnets, ipam) = match mode {
        IpamMode::Enabled => (
            join(&localnet.subnets),
            join(&localnet.exclude_subnets),
            None,
        ),
        IpamMode::Disabled => (None, None, None),
        IpamMode::Dhcp => (
            None,
            None,
            Some(IpamConf {
                ipam_type: DHCP_IPAM_TYPE.to_owned(),
                dhcp_guard: localnet.ipam.as_ref().and_then(|i| i.dhcp_guard),
                family: rendered_family(
                    localnet
                        .ipam
                        .as_ref()
                        .and_then(|i| i.dhcp_families.as_deref()),
                ),
                extra: Map::new(),
            }),
        ),
    };
    let persistent = mode == IpamMode::Enabled
        && localnet.ipam.as_ref().and_then(|i| i.lifecycle) == Some(IpamLifecycle::Persistent);
    let conf = NetConf {
        cni_version: CNI_VERSION.to_owned(),
        name: format!("{CUDN_NETWORK_NAME_PREFIX}{name}"),
        plugin_type: OVN_K8S_CNI_OVERLAY.to_owned(),
        net_attach_def_name: Some(nad_key(namespace, name)),
        topology: Some(topology.cni_name().to_owned()),
        role: Some(localnet.role.cni_name().to_owned()),
        physical_network_name: Some(localnet.physical_network_name.clone()),
        mtu: localnet
            .mtu
            .and_then(|m| u32::try_from(m).ok())
            .filter(|m| *m > 0),
        subnets,
        exclude_subnets,
        vlan_id: localnet
            .vlan
            .as_ref()
            .and_then(|v| v.access)
            .and_then(|a| u16::try_from(a.id).ok()),
        allow_persistent_ips: persistent.then_some(true),
        ipam,
        extra: Map::new(),
    };
    validate_netconf(&nad_key(namespace, name), &conf).map_err(|source| RenderError::Invalid {
        cudn: name.to_owned(),
        source,
    })?;
    Ok(conf)
}

/// The NAD's `ipam.family` for a CUDN's `ipam.dhcpFamilies`: none for
/// IPv4 (the OKEP's config, and the agent's default), `ipv6` for DHCPv6
/// alone, `dual` for both (whichever order they are named in).
fn rendered_family(families: Option<&[IpFamily]>) -> Option<String> {
    let families = families?;
    let v4 = families.contains(&IpFamily::IPv4);
    let v6 = families.contains(&IpFamily::IPv6);
    match (v4, v6) {
        (true, true) => Some("dual".to_owned()),
        (false, true) => Some("ipv6".to_owned()),
        _ => None,
    }
}

/// Render the NAD for `cudn` in `namespace`: named like the CUDN, labelled and finalized as
/// OVN-Kubernetes does, owned by the CUDN when it has a `uid`.
pub fn render_nad(
    cudn: &ClusterUserDefinedNetwork,
    namespace: &str,
) -> Result<NetworkAttachmentDefinition, RenderError> {
    let conf = render_netconf(cudn, namespace)?;
    let name = cudn.metadata.name.clone().unwrap_or_default();
    let config = serde_json::to_string(&conf).map_err(|source| RenderError::Serialize {
        cudn: name.clone(),
        source,
    })?;
    let owner = cudn.metadata.uid.as_ref().map(|uid| OwnerReference {
        api_version: ClusterUserDefinedNetwork::api_version(&()).into_owned(),
        kind: ClusterUserDefinedNetwork::kind(&()).into_owned(),
        name: name.clone(),
        uid: uid.clone(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    });
    Ok(NetworkAttachmentDefinition {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(namespace.to_owned()),
            labels: Some(BTreeMap::from([(
                LABEL_USER_DEFINED_NETWORK.to_owned(),
                String::new(),
            )])),
            finalizers: Some(vec![FINALIZER_USER_DEFINED_NETWORK.to_owned()]),
            owner_references: owner.map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        spec: NetworkAttachmentDefinitionSpec { config },
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::cudn::{
        ClusterUserDefinedNetworkSpec, IpamConfig, LocalnetConfig, NetworkRole, NetworkSpec,
    };

    /// The OKEP's "Generated NAD Config", verbatim.
    const OKEP_NAD_CONFIG: &str = r#"{
  "cniVersion": "1.0.0",
  "name": "localnet-dhcp",
  "type": "ovn-k8s-cni-overlay",
  "topology": "localnet",
  "role": "secondary",
  "physicalNetworkName": "physnet",
  "ipam": { "type": "dhcp" }
}"#;

    /// The OKEP's example CUDN, verbatim.
    const OKEP_CUDN: &str = r#"apiVersion: k8s.ovn.org/v1
kind: ClusterUserDefinedNetwork
metadata:
  name: localnet-dhcp-ipam
spec:
  namespaceSelector:
    matchLabels:
      localnet: "true"
  network:
    topology: Localnet
    localnet:
      role: Secondary
      physicalNetworkName: physnet
      ipam:
        mode: DHCP
"#;

    fn okep_cudn() -> ClusterUserDefinedNetwork {
        serde_yaml::from_str(OKEP_CUDN).expect("OKEP CUDN parses")
    }

    fn localnet(mutate: impl FnOnce(&mut LocalnetConfig)) -> ClusterUserDefinedNetwork {
        let mut cudn = okep_cudn();
        mutate(cudn.spec.network.localnet.as_mut().expect("localnet"));
        cudn
    }

    #[test]
    fn okep_config_round_trips_without_loss() {
        let original: Value = serde_json::from_str(OKEP_NAD_CONFIG).unwrap();
        let conf: NetConf = serde_json::from_str(OKEP_NAD_CONFIG).unwrap();
        assert!(conf.is_dhcp());
        assert_eq!(conf.physical_network_name.as_deref(), Some("physnet"));
        assert!(
            conf.extra.is_empty(),
            "every OKEP key is modelled: {:?}",
            conf.extra
        );
        assert_eq!(serde_json::to_value(&conf).unwrap(), original);
        parse_netconf("default/localnet-dhcp", OKEP_NAD_CONFIG).expect("OKEP config is valid");
    }

    #[test]
    fn unknown_keys_survive_a_round_trip() {
        let original = json!({
            "cniVersion": "1.0.0", "name": "n", "type": "ovn-k8s-cni-overlay",
            "topology": "localnet", "role": "secondary", "physicalNetworkName": "physnet",
            "someFutureKey": {"a": [1, 2]},
            "ipam": {"type": "dhcp", "daemonSocketPath": "/run/xdhcp/xdhcp.sock"}
        });
        let conf: NetConf = serde_json::from_value(original.clone()).unwrap();
        assert_eq!(conf.extra.get("someFutureKey"), Some(&json!({"a": [1, 2]})));
        assert_eq!(serde_json::to_value(&conf).unwrap(), original);
    }

    #[test]
    fn dhcp_cudn_renders_the_okep_config() {
        let conf = render_netconf(&okep_cudn(), "default").unwrap();
        let mut expected: Value = serde_json::from_str(OKEP_NAD_CONFIG).unwrap();
        // OVN-K names a CUDN's network `cluster.udn.<name>` and records the NAD key; every other
        // key is the OKEP's, with the OKEP's values.
        expected["name"] = json!("cluster.udn.localnet-dhcp-ipam");
        expected["netAttachDefName"] = json!("default/localnet-dhcp-ipam");
        assert_eq!(serde_json::to_value(&conf).unwrap(), expected);
    }

    #[test]
    fn rendered_nad_is_the_same_for_every_namespace_but_its_key() {
        // Pods and VMs are told apart at CNI ADD time, never in the NAD: the namespaces holding
        // pods and the ones holding VMs get configs that differ only in netAttachDefName.
        let pods = render_nad(&okep_cudn(), "pods").unwrap();
        let vms = render_nad(&okep_cudn(), "vms").unwrap();
        let mut p: Value = serde_json::from_str(&pods.spec.config).unwrap();
        let mut v: Value = serde_json::from_str(&vms.spec.config).unwrap();
        assert_eq!(p["netAttachDefName"], "pods/localnet-dhcp-ipam");
        assert_eq!(v["netAttachDefName"], "vms/localnet-dhcp-ipam");
        p.as_object_mut().unwrap().remove("netAttachDefName");
        v.as_object_mut().unwrap().remove("netAttachDefName");
        assert_eq!(p, v);
        assert_eq!(pods.metadata.name.as_deref(), Some("localnet-dhcp-ipam"));
        assert_eq!(pods.metadata.namespace.as_deref(), Some("pods"));
        assert_eq!(
            pods.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_USER_DEFINED_NETWORK))
                .map(String::as_str),
            Some("")
        );
        assert_eq!(
            pods.metadata.finalizers,
            Some(vec![FINALIZER_USER_DEFINED_NETWORK.to_owned()])
        );
        assert!(
            pods.metadata.owner_references.is_none(),
            "no uid, no owner reference"
        );
        validate_nad(&pods).expect("rendered NAD validates");
    }

    #[test]
    fn owner_reference_points_at_the_cudn() {
        let mut cudn = okep_cudn();
        cudn.metadata.uid = Some("0b6f3c52-1111-4c1a-9a7e-5f0e3f1d2c3b".to_owned());
        let nad = render_nad(&cudn, "default").unwrap();
        let owner = &nad.metadata.owner_references.unwrap()[0];
        assert_eq!(owner.api_version, "k8s.ovn.org/v1");
        assert_eq!(owner.kind, "ClusterUserDefinedNetwork");
        assert_eq!(owner.name, "localnet-dhcp-ipam");
        assert_eq!(owner.uid, "0b6f3c52-1111-4c1a-9a7e-5f0e3f1d2c3b");
        assert_eq!(owner.controller, Some(true));
    }

    #[test]
    fn dhcp_guard_is_rendered_and_the_agent_reads_what_was_asked() {
        // Each field alone, all together, none: the NAD carries exactly
        // what the CUDN says, and the agent's parser makes of it the CUDN's
        // values with its own defaults for the rest.
        let defaults = xdhcp_plugin::config::DhcpGuardSpec::default();
        let cases = [
            (
                DhcpGuardConfig {
                    trusted: Some(true),
                    rate: Some(50),
                    burst: Some(5),
                },
                json!({"trusted": true, "rate": 50, "burst": 5}),
            ),
            (
                DhcpGuardConfig {
                    rate: Some(10_000),
                    ..DhcpGuardConfig::default()
                },
                json!({"rate": 10_000}),
            ),
            (
                DhcpGuardConfig {
                    trusted: Some(false),
                    burst: Some(1),
                    ..DhcpGuardConfig::default()
                },
                json!({"trusted": false, "burst": 1}),
            ),
            (DhcpGuardConfig::default(), json!({})),
        ];
        for (guard, rendered) in cases {
            let cudn = localnet(|l| {
                l.ipam.as_mut().unwrap().dhcp_guard = Some(guard);
            });
            let nad = render_nad(&cudn, "ns").unwrap();
            let conf: Value = serde_json::from_str(&nad.spec.config).unwrap();
            assert_eq!(conf["ipam"]["dhcpGuard"], rendered, "{guard:?}");
            // The NAD's config round-trips through the typed model.
            let parsed = validate_nad(&nad).unwrap();
            assert_eq!(parsed.ipam.as_ref().unwrap().dhcp_guard, Some(guard));
            assert!(parsed.ipam.as_ref().unwrap().extra.is_empty());
            assert_eq!(serde_json::to_value(&parsed).unwrap(), conf);
            // The agent's own parser of the config it is handed at ADD.
            let agent = xdhcp_plugin::config::parse(nad.spec.config.as_bytes())
                .unwrap_or_else(|e| panic!("{guard:?}: {e:?}"));
            assert_eq!(
                agent.ipam.dhcp_guard,
                xdhcp_plugin::config::DhcpGuardSpec {
                    trusted: guard.trusted.unwrap_or(defaults.trusted),
                    rate: guard.rate.unwrap_or(defaults.rate),
                    burst: guard.burst.unwrap_or(defaults.burst),
                },
                "{guard:?}"
            );
        }
        // No dhcpGuard in the CUDN: none in the NAD (the OKEP's config).
        let conf = serde_json::to_value(render_netconf(&okep_cudn(), "ns").unwrap()).unwrap();
        assert_eq!(conf["ipam"], json!({"type": "dhcp"}));
    }

    /// `dhcpFamilies: [IPv6]` renders `"family": "ipv6"`, which the
    /// agent's parser reads as a DHCPv6 network; both families (either
    /// order) render `"family": "dual"`, a dual-stack network; `[IPv4]` or
    /// none renders no family (the OKEP's config), an IPv4 network.
    #[test]
    fn dhcp_families_render_the_family_the_agent_reads() {
        use xdhcp_plugin::config::Family;
        for (families, rendered, family) in [
            (Some(vec![IpFamily::IPv6]), Some("ipv6"), Family::Ipv6),
            (
                Some(vec![IpFamily::IPv4, IpFamily::IPv6]),
                Some("dual"),
                Family::Dual,
            ),
            (
                Some(vec![IpFamily::IPv6, IpFamily::IPv4]),
                Some("dual"),
                Family::Dual,
            ),
            (Some(vec![IpFamily::IPv4]), None, Family::Ipv4),
            (None, None, Family::Ipv4),
        ] {
            let cudn = localnet(|l| {
                l.ipam.as_mut().unwrap().dhcp_families = families.clone();
            });
            let nad = render_nad(&cudn, "ns").unwrap();
            let conf: Value = serde_json::from_str(&nad.spec.config).unwrap();
            assert_eq!(conf["ipam"]["family"].as_str(), rendered, "{families:?}");
            let parsed = validate_nad(&nad).unwrap();
            assert!(parsed.ipam.as_ref().unwrap().extra.is_empty());
            assert_eq!(serde_json::to_value(&parsed).unwrap(), conf);
            let agent = xdhcp_plugin::config::parse(nad.spec.config.as_bytes())
                .unwrap_or_else(|e| panic!("{families:?}: {e:?}"));
            assert_eq!(agent.ipam.family, family, "{families:?}");
        }
    }

    #[test]
    fn enabled_mode_renders_subnets_and_no_ipam() {
        let cudn = localnet(|l| {
            l.ipam = Some(IpamConfig {
                mode: Some(IpamMode::Enabled),
                lifecycle: Some(IpamLifecycle::Persistent),
                dhcp_guard: None,
                dhcp_families: None,
            });
            l.subnets = Some(vec!["192.0.2.0/24".into(), "2001:db8::/64".into()]);
            l.exclude_subnets = Some(vec!["192.0.2.0/30".into()]);
            l.mtu = Some(1500);
            l.vlan = Some(crate::cudn::VlanConfig {
                mode: crate::cudn::VlanMode::Access,
                access: Some(crate::cudn::AccessVlanConfig { id: 100 }),
            });
        });
        let conf = serde_json::to_value(render_netconf(&cudn, "ns").unwrap()).unwrap();
        assert_eq!(conf["subnets"], "192.0.2.0/24,2001:db8::/64");
        assert_eq!(conf["excludeSubnets"], "192.0.2.0/30");
        assert_eq!(conf["mtu"], 1500);
        assert_eq!(conf["vlanID"], 100);
        assert_eq!(conf["allowPersistentIPs"], true);
        assert!(conf.get("ipam").is_none());
    }

    #[test]
    fn disabled_mode_renders_neither_subnets_nor_ipam() {
        let cudn = localnet(|l| {
            l.ipam = Some(IpamConfig {
                mode: Some(IpamMode::Disabled),
                lifecycle: None,
                dhcp_guard: None,
                dhcp_families: None,
            });
        });
        let conf = serde_json::to_value(render_netconf(&cudn, "ns").unwrap()).unwrap();
        assert!(conf.get("subnets").is_none());
        assert!(conf.get("ipam").is_none());
    }

    #[test]
    fn render_refuses_what_the_crd_forbids() {
        let primary = localnet(|l| l.role = NetworkRole::Primary);
        let err = render_netconf(&primary, "ns").unwrap_err();
        assert!(
            matches!(&err, RenderError::Invalid { source: NadError::DhcpRole { role, .. }, .. } if role == "primary"),
            "{err:?}"
        );
        let layer2 = ClusterUserDefinedNetwork::new(
            "l2",
            ClusterUserDefinedNetworkSpec {
                namespace_selector:
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector::default(),
                network: NetworkSpec {
                    topology: NetworkTopology::Layer2,
                    layer3: None,
                    layer2: None,
                    localnet: None,
                },
            },
        );
        assert!(matches!(
            render_netconf(&layer2, "ns"),
            Err(RenderError::UnsupportedTopology {
                topology: NetworkTopology::Layer2,
                ..
            })
        ));
        let mut missing = okep_cudn();
        missing.spec.network.localnet = None;
        assert!(matches!(
            render_netconf(&missing, "ns"),
            Err(RenderError::MissingTopologyConfig { .. })
        ));
        assert!(matches!(
            render_netconf(&okep_cudn(), ""),
            Err(RenderError::EmptyNamespace { .. })
        ));
        let mut unnamed = okep_cudn();
        unnamed.metadata.name = None;
        assert!(matches!(
            render_netconf(&unnamed, "ns"),
            Err(RenderError::MissingName)
        ));
    }

    fn with_ipam(ipam: &Value) -> String {
        json!({
            "cniVersion": "1.0.0", "name": "n", "type": "ovn-k8s-cni-overlay",
            "topology": "localnet", "role": "secondary", "physicalNetworkName": "physnet",
            "ipam": ipam
        })
        .to_string()
    }

    #[test]
    fn ipam_type_empty_or_dhcp_is_accepted() {
        parse_netconf("ns/a", &with_ipam(&json!({}))).unwrap();
        parse_netconf("ns/a", &with_ipam(&json!({"type": ""}))).unwrap();
        parse_netconf("ns/a", &with_ipam(&json!({"type": "dhcp"}))).unwrap();
        let no_ipam =
            json!({"cniVersion": "1.0.0", "name": "n", "type": "ovn-k8s-cni-overlay"}).to_string();
        parse_netconf("ns/a", &no_ipam).unwrap();
    }

    #[test]
    fn other_ipam_types_are_rejected_by_name() {
        for bad in ["host-local", "whereabouts", "static", "DHCP", "xdhcp"] {
            let err = parse_netconf("ns/a", &with_ipam(&json!({"type": bad}))).unwrap_err();
            match &err {
                NadError::UnsupportedIpamType { nad, ipam_type } => {
                    assert_eq!(nad, "ns/a");
                    assert_eq!(ipam_type, bad);
                }
                other => panic!("{bad}: unexpected {other:?}"),
            }
            let msg = err.to_string();
            assert!(
                msg.contains(&format!("{bad:?}")) && msg.contains("ns/a"),
                "{msg}"
            );
        }
    }

    #[test]
    fn dhcp_outside_localnet_secondary_without_subnets_is_rejected() {
        let base =
            || -> Value { serde_json::from_str(&with_ipam(&json!({"type": "dhcp"}))).unwrap() };
        let mut l2 = base();
        l2["topology"] = json!("layer2");
        assert!(matches!(
            parse_netconf("ns/a", &l2.to_string()),
            Err(NadError::DhcpTopology { topology, .. }) if topology == "layer2"
        ));
        let mut primary = base();
        primary["role"] = json!("primary");
        assert!(matches!(
            parse_netconf("ns/a", &primary.to_string()),
            Err(NadError::DhcpRole { role, .. }) if role == "primary"
        ));
        let mut subnets = base();
        subnets["subnets"] = json!("192.0.2.0/24");
        let err = parse_netconf("ns/a", &subnets.to_string()).unwrap_err();
        assert!(
            matches!(&err, NadError::DhcpWithSubnets { subnets, .. } if subnets == "192.0.2.0/24")
        );
    }

    #[test]
    fn malformed_config_is_a_parse_error() {
        for bad in [
            "",
            "{",
            "[]",
            r#"{"name": "n"}"#,
            r#"{"cniVersion":"1.0.0","name":"n","type":"t","ipam":{"type":7}}"#,
        ] {
            assert!(
                matches!(parse_netconf("ns/a", bad), Err(NadError::Parse { .. })),
                "{bad}"
            );
        }
    }
}
