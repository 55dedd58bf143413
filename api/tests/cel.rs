//! Evaluates the CRD's `x-kubernetes-validations` (CEL) against the OKEP's example and against
//! objects the rules must reject, asserting the OKEP's exact messages.
//!
//! The schema evaluated is the one generated from the Rust types (`ClusterUserDefinedNetwork::crd()`),
//! which `manifests.rs` proves is byte-identical to the committed CRD manifest. Evaluation uses
//! kube's `cel` feature (the `kube-cel` crate, with the Kubernetes CEL library registered).

use kube::CustomResourceExt as _;
use kube::core::cel::Validator;
use serde_json::{Value, json};
use xdhcp_api::ClusterUserDefinedNetwork;

const DHCP_SECONDARY_ONLY: &str =
    "DHCP ipam.mode is only supported for Localnet Secondary networks";
const DHCP_NO_SUBNETS: &str = "Subnets is forbidden when ipam.mode is DHCP; addresses are assigned by the external DHCP server";
const LAYER2_NO_DHCP: &str =
    "DHCP ipam.mode is not supported for Layer2 topology, use Localnet topology instead";
/// xdhcp's own rule, next to the OKEP's.
const DHCP_GUARD_NEEDS_DHCP: &str = "ipam.dhcpGuard is only supported when ipam.mode is DHCP";
const DHCP_FAMILIES_NEED_DHCP: &str = "ipam.dhcpFamilies is only supported when ipam.mode is DHCP";
const DHCP_FAMILIES_DISTINCT: &str =
    "ipam.dhcpFamilies names each family once: [IPv4], [IPv6], or [IPv4, IPv6] for dual stack";

/// The OKEP's example, verbatim.
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

fn schema() -> Value {
    let crd = ClusterUserDefinedNetwork::crd();
    let schema = crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .expect("CRD has an openAPIV3Schema");
    serde_json::to_value(schema).unwrap()
}

fn okep_cudn() -> Value {
    serde_yaml::from_str(OKEP_CUDN).unwrap()
}

/// The failure messages, in schema order; empty when the object is valid.
fn failures(object: &Value, old: Option<&Value>) -> Vec<String> {
    match Validator::new().validate(&schema(), object, old) {
        Ok(()) => Vec::new(),
        Err(errors) => errors.iter().map(|e| e.message.clone()).collect(),
    }
}

/// The rules exist in the generated schema with the OKEP's rule text, where the OKEP puts them.
#[test]
fn schema_carries_the_okep_rules_verbatim() {
    let schema = schema();
    let network = &schema["properties"]["spec"]["properties"]["network"]["properties"];
    let rules = |v: &Value| -> Vec<(String, String)> {
        v["x-kubernetes-validations"]
            .as_array()
            .expect("x-kubernetes-validations")
            .iter()
            .map(|r| {
                (
                    r["rule"].as_str().unwrap().to_owned(),
                    r["message"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    let localnet = rules(&network["localnet"]);
    assert!(localnet.contains(&(
        r#"!has(self.ipam) || !has(self.ipam.mode) || self.ipam.mode != "DHCP" || self.role == "Secondary""#.to_owned(),
        DHCP_SECONDARY_ONLY.to_owned()
    )));
    assert!(localnet.contains(&(
        r#"!has(self.ipam) || !has(self.ipam.mode) || self.ipam.mode != "DHCP" || !has(self.subnets)"#.to_owned(),
        DHCP_NO_SUBNETS.to_owned()
    )));
    let guard_rule = (
        r#"!has(self.ipam) || !has(self.ipam.dhcpGuard) || (has(self.ipam.mode) && self.ipam.mode == "DHCP")"#.to_owned(),
        DHCP_GUARD_NEEDS_DHCP.to_owned(),
    );
    assert!(localnet.contains(&guard_rule));
    assert_eq!(
        rules(&network["layer2"]),
        vec![
            (
                r#"!has(self.ipam) || !has(self.ipam.mode) || self.ipam.mode != "DHCP""#.to_owned(),
                LAYER2_NO_DHCP.to_owned()
            ),
            guard_rule
        ]
    );
    let modes = &network["localnet"]["properties"]["ipam"]["properties"]["mode"]["enum"];
    assert_eq!(modes, &json!(["Enabled", "Disabled", "DHCP"]));
}

#[test]
fn okep_example_is_valid() {
    assert_eq!(failures(&okep_cudn(), None), Vec::<String>::new());
}

#[test]
fn dhcp_on_a_primary_localnet_is_rejected() {
    let mut obj = okep_cudn();
    obj["spec"]["network"]["localnet"]["role"] = json!("Primary");
    assert_eq!(failures(&obj, None), vec![DHCP_SECONDARY_ONLY]);
}

#[test]
fn dhcp_with_subnets_is_rejected() {
    let mut obj = okep_cudn();
    obj["spec"]["network"]["localnet"]["subnets"] = json!(["192.0.2.0/24"]);
    assert_eq!(failures(&obj, None), vec![DHCP_NO_SUBNETS]);
}

#[test]
fn dhcp_on_primary_with_subnets_reports_both_rules() {
    let mut obj = okep_cudn();
    obj["spec"]["network"]["localnet"]["role"] = json!("Primary");
    obj["spec"]["network"]["localnet"]["subnets"] = json!(["192.0.2.0/24"]);
    assert_eq!(
        failures(&obj, None),
        vec![DHCP_SECONDARY_ONLY, DHCP_NO_SUBNETS]
    );
}

#[test]
fn dhcp_on_layer2_is_rejected() {
    let mut obj = okep_cudn();
    obj["spec"]["network"] = json!({
        "topology": "Layer2",
        "layer2": { "role": "Secondary", "ipam": { "mode": "DHCP" } }
    });
    assert_eq!(failures(&obj, None), vec![LAYER2_NO_DHCP]);
}

#[test]
fn dhcp_guard_goes_with_dhcp_only() {
    let mut obj = okep_cudn();
    obj["spec"]["network"]["localnet"]["ipam"]["dhcpGuard"] =
        json!({"trusted": true, "rate": 50, "burst": 5});
    assert_eq!(failures(&obj, None), Vec::<String>::new());
    let round: ClusterUserDefinedNetwork = serde_json::from_value(obj.clone()).unwrap();
    assert_eq!(serde_json::to_value(&round).unwrap()["spec"], obj["spec"]);
    for mode in [json!("Enabled"), json!("Disabled"), Value::Null] {
        let mut other = obj.clone();
        other["spec"]["network"]["localnet"]["subnets"] = json!(["192.0.2.0/24"]);
        other["spec"]["network"]["localnet"]["ipam"]["mode"] = mode.clone();
        if mode.is_null() {
            other["spec"]["network"]["localnet"]["ipam"]
                .as_object_mut()
                .unwrap()
                .remove("mode");
        }
        assert_eq!(
            failures(&other, None),
            vec![DHCP_GUARD_NEEDS_DHCP],
            "mode {mode}"
        );
    }
    let mut l2 = okep_cudn();
    l2["spec"]["network"] = json!({
        "topology": "Layer2",
        "layer2": { "role": "Secondary", "subnets": ["192.0.2.0/24"],
                    "ipam": { "mode": "Enabled", "dhcpGuard": { "rate": 5 } } }
    });
    assert_eq!(failures(&l2, None), vec![DHCP_GUARD_NEEDS_DHCP]);
}

/// `ipam.dhcpFamilies`: one family with DHCP (IPv4 or IPv6), or both
/// (dual stack, in either order), is valid and survives the typed model; a
/// family named twice is refused, naming why; without DHCP it is refused;
/// an unknown family, an empty list or three entries are refused by the
/// schema (its enum and lengths, checked before the rules).
#[test]
fn dhcp_families_name_each_family_once_with_dhcp_only() {
    for families in [
        json!(["IPv4"]),
        json!(["IPv6"]),
        json!(["IPv4", "IPv6"]),
        json!(["IPv6", "IPv4"]),
    ] {
        let mut obj = okep_cudn();
        obj["spec"]["network"]["localnet"]["ipam"]["dhcpFamilies"] = families.clone();
        assert_eq!(failures(&obj, None), Vec::<String>::new(), "{families}");
        let round: ClusterUserDefinedNetwork = serde_json::from_value(obj.clone()).unwrap();
        assert_eq!(serde_json::to_value(&round).unwrap()["spec"], obj["spec"]);
    }
    for twice in [json!(["IPv4", "IPv4"]), json!(["IPv6", "IPv6"])] {
        let mut obj = okep_cudn();
        obj["spec"]["network"]["localnet"]["ipam"]["dhcpFamilies"] = twice.clone();
        assert_eq!(
            failures(&obj, None),
            vec![DHCP_FAMILIES_DISTINCT],
            "{twice}"
        );
    }

    let mut enabled = okep_cudn();
    enabled["spec"]["network"]["localnet"]["subnets"] = json!(["2001:db8::/64"]);
    enabled["spec"]["network"]["localnet"]["ipam"] =
        json!({"mode": "Enabled", "dhcpFamilies": ["IPv6"]});
    assert_eq!(failures(&enabled, None), vec![DHCP_FAMILIES_NEED_DHCP]);

    // The schema (which the apiserver checks before any rule) allows the
    // two families only, one or two of them; the typed model refuses others.
    let field = &schema()["properties"]["spec"]["properties"]["network"]["properties"]["localnet"]
        ["properties"]["ipam"]["properties"]["dhcpFamilies"];
    assert_eq!(field["items"]["enum"], json!(["IPv4", "IPv6"]), "{field}");
    assert_eq!(
        (&field["minItems"], &field["maxItems"]),
        (&json!(1), &json!(2)),
        "{field}"
    );
    let mut bad = okep_cudn();
    bad["spec"]["network"]["localnet"]["ipam"]["dhcpFamilies"] = json!(["IPv5"]);
    assert!(serde_json::from_value::<ClusterUserDefinedNetwork>(bad).is_err());
}

#[test]
fn rules_leave_other_modes_alone() {
    let cases = [
        json!({ "role": "Primary", "physicalNetworkName": "physnet", "subnets": ["192.0.2.0/24"] }),
        json!({ "role": "Secondary", "physicalNetworkName": "physnet", "subnets": ["192.0.2.0/24"],
                "ipam": { "mode": "Enabled" } }),
        json!({ "role": "Primary", "physicalNetworkName": "physnet", "ipam": { "mode": "Disabled" } }),
        json!({ "role": "Secondary", "physicalNetworkName": "physnet", "subnets": ["192.0.2.0/24"],
                "ipam": { "lifecycle": "Persistent" } }),
    ];
    for localnet in cases {
        let mut obj = okep_cudn();
        obj["spec"]["network"]["localnet"] = localnet.clone();
        assert_eq!(failures(&obj, None), Vec::<String>::new(), "{localnet}");
    }
    let mut l2 = okep_cudn();
    l2["spec"]["network"] = json!({
        "topology": "Layer2",
        "layer2": { "role": "Secondary", "subnets": ["192.0.2.0/24"], "ipam": { "mode": "Enabled" } }
    });
    assert_eq!(failures(&l2, None), Vec::<String>::new());
}

#[test]
fn topology_union_and_immutability_are_enforced() {
    let mut mismatched = okep_cudn();
    mismatched["spec"]["network"]["topology"] = json!("Layer2");
    assert_eq!(
        failures(&mismatched, None),
        vec![
            "spec.layer2 is required when topology is Layer2 and forbidden otherwise",
            "spec.localnet is required when topology is Localnet and forbidden otherwise",
        ]
    );

    let old = okep_cudn();
    assert_eq!(failures(&okep_cudn(), Some(&old)), Vec::<String>::new());
    let mut changed = okep_cudn();
    changed["spec"]["network"]["localnet"]["physicalNetworkName"] = json!("other");
    assert_eq!(
        failures(&changed, Some(&old)),
        vec!["Network spec is immutable"]
    );
}

#[test]
fn physical_network_name_rejects_separators() {
    let mut obj = okep_cudn();
    obj["spec"]["network"]["localnet"]["physicalNetworkName"] = json!("phys:net");
    assert_eq!(
        failures(&obj, None),
        vec!["physicalNetworkName cannot contain `,` or `:` characters"]
    );
}

/// The typed API reads and writes the OKEP's example without loss.
#[test]
fn okep_example_round_trips_through_the_types() {
    let typed: ClusterUserDefinedNetwork = serde_yaml::from_str(OKEP_CUDN).unwrap();
    let localnet = typed.spec.network.localnet.as_ref().unwrap();
    assert_eq!(localnet.ipam_mode(), xdhcp_api::cudn::IpamMode::Dhcp);
    assert_eq!(localnet.physical_network_name, "physnet");
    assert_eq!(serde_json::to_value(&typed).unwrap(), okep_cudn());
    let yaml = serde_yaml::to_string(&typed).unwrap();
    let back: ClusterUserDefinedNetwork = serde_yaml::from_str(&yaml).unwrap();
    assert_eq!(back, typed);
}

/// Every modelled field keeps its OVN-Kubernetes name through a round trip, and a full
/// `Enabled` localnet network is valid.
#[test]
fn full_localnet_network_round_trips_and_validates() {
    let original: Value = serde_yaml::from_str(
        r#"apiVersion: k8s.ovn.org/v1
kind: ClusterUserDefinedNetwork
metadata:
  name: localnet-static
spec:
  namespaceSelector:
    matchExpressions:
      - key: kubernetes.io/metadata.name
        operator: In
        values: [red, blue]
  network:
    topology: Localnet
    localnet:
      role: Secondary
      physicalNetworkName: physnet
      subnets: ["192.0.2.0/24", "2001:db8::/64"]
      excludeSubnets: ["192.0.2.0/30"]
      ipam:
        mode: Enabled
        lifecycle: Persistent
      mtu: 1500
      vlan:
        mode: Access
        access:
          id: 100
"#,
    )
    .unwrap();
    let typed: ClusterUserDefinedNetwork = serde_json::from_value(original.clone()).unwrap();
    assert_eq!(serde_json::to_value(&typed).unwrap(), original);
    assert_eq!(failures(&original, None), Vec::<String>::new());
}
