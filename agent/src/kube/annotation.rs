//! The `k8s.ovn.org/pod-networks` annotation: a pure merge that preserves every foreign entry.
//!
//! The annotation is a JSON object keyed by network (`"default"` for the
//! cluster network, `"<nad-namespace>/<nad-name>"` for secondary networks).
//! xdhcp owns exactly one key per attachment and must never disturb the
//! others: foreign entries are kept as the raw JSON text they arrived as
//! (only insignificant whitespace is dropped), so field order, numbers and
//! unknown fields survive byte for byte. Top-level keys are emitted sorted,
//! as Go's `encoding/json` (OVN-Kubernetes) emits them.
//!
//! Our own entry has the shape of the example in the OVN-Kubernetes DHCP IPAM
//! design (OKEP-6224), fields in
//! this order:
//! ```json
//! {"ip_addresses":["10.1.192.213/24"],"mac_address":"02:00:00:00:20:08",
//!  "gateway_ips":["10.1.192.1"],"role":"secondary","ipam_mode":"dhcp"}
//! ```
//! `gateway_ips` is omitted when the lease has no router, like Go's
//! `omitempty` on that field; `ipam_mode` is omitted when unset.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::workload::MacAddr;

/// The annotation OVN-Kubernetes reads pod IPs from.
pub const POD_NETWORKS_ANNOTATION: &str = "k8s.ovn.org/pod-networks";
/// `role` of a secondary-network entry.
pub const ROLE_SECONDARY: &str = "secondary";
/// `ipam_mode` of an entry whose address came from an external DHCP server.
pub const IPAM_MODE_DHCP: &str = "dhcp";

/// The fields [`PodNetworkEntry`] names; everything else is in `other`.
const KNOWN_FIELDS: [&str; 5] = [
    "ip_addresses",
    "mac_address",
    "gateway_ips",
    "role",
    "ipam_mode",
];

/// OVN-Kubernetes' deprecated copy of `ip_addresses[0]` (written when the
/// entry has one address).
const LEGACY_IP: &str = "ip_address";
/// Its deprecated copy of `gateway_ips[0]` (written when there is one).
const LEGACY_GATEWAY: &str = "gateway_ip";

/// One network's entry of the annotation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodNetworkEntry {
    /// Addresses in CIDR form, e.g. `10.1.192.213/24`.
    #[serde(default)]
    pub ip_addresses: Vec<String>,
    /// Interface MAC, lowercase with colons.
    #[serde(default)]
    pub mac_address: String,
    /// Gateways (no prefix length); omitted when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gateway_ips: Vec<String>,
    /// `"primary"` or `"secondary"`.
    #[serde(default)]
    pub role: String,
    /// `"dhcp"` for addresses learned from an external DHCP server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipam_mode: Option<String>,
    /// Any other fields (e.g. `routes`, `tunnel_id`), emitted after the known
    /// ones in key order.
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

impl PodNetworkEntry {
    /// The entry xdhcp writes for a DHCP lease on a secondary network.
    pub fn dhcp(address: Ipv4Addr, prefix_len: u8, mac: MacAddr, gateways: &[Ipv4Addr]) -> Self {
        Self::dhcp_of(address, prefix_len, mac, gateways)
    }

    /// The entry xdhcp writes for a `DHCPv6` lease: the address with the
    /// prefix length the network names (128 without one), the network's
    /// gateway when it names one (`DHCPv6` carries none).
    pub fn dhcp6(
        address: Ipv6Addr,
        prefix_len: u8,
        mac: MacAddr,
        gateway: Option<Ipv6Addr>,
    ) -> Self {
        Self::dhcp_of(address, prefix_len, mac, gateway.as_slice())
    }

    /// The entry xdhcp writes for a dual-stack attachment's two leases:
    /// the IPv4 address then the IPv6 one, each with its prefix length,
    /// and the gateways of both that are known (the IPv4 lease's router,
    /// the network's IPv6 gateway).
    pub fn dhcp_dual(
        v4: (Ipv4Addr, u8, Option<Ipv4Addr>),
        v6: (Ipv6Addr, u8, Option<Ipv6Addr>),
        mac: MacAddr,
    ) -> Self {
        let mut entry = Self::dhcp_of(v4.0, v4.1, mac, v4.2.as_slice());
        entry.ip_addresses.push(format!("{}/{}", v6.0, v6.1));
        entry.gateway_ips.extend(v6.2.map(|g| g.to_string()));
        entry
    }

    fn dhcp_of<A: std::fmt::Display>(
        address: A,
        prefix_len: u8,
        mac: MacAddr,
        gateways: &[A],
    ) -> Self {
        PodNetworkEntry {
            ip_addresses: vec![format!("{address}/{prefix_len}")],
            mac_address: mac.to_string(),
            gateway_ips: gateways.iter().map(ToString::to_string).collect(),
            role: ROLE_SECONDARY.to_owned(),
            ipam_mode: Some(IPAM_MODE_DHCP.to_owned()),
            other: BTreeMap::new(),
        }
    }
}

/// Why an annotation or a network key was rejected.
#[derive(Debug, thiserror::Error)]
pub enum AnnotationError {
    /// The annotation value is not a JSON object.
    #[error("annotation {POD_NETWORKS_ANNOTATION} is not a JSON object of networks: {source}")]
    NotJson {
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// The entry for a key does not have the entry shape.
    #[error("annotation {POD_NETWORKS_ANNOTATION} entry {key:?} is malformed: {source}")]
    BadEntry {
        /// The network key.
        key: String,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// A network key (from `netAttachDefName` or the network name) is unusable.
    #[error("invalid network key {value:?}: {reason}")]
    BadNetworkKey {
        /// The rejected value.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// The whole annotation: foreign entries kept verbatim, ours editable.
#[derive(Debug, Clone, Default)]
pub struct PodNetworks {
    entries: BTreeMap<String, Box<RawValue>>,
}

impl PartialEq for PodNetworks {
    fn eq(&self, other: &Self) -> bool {
        self.entries.len() == other.entries.len()
            && self
                .entries
                .iter()
                .zip(&other.entries)
                .all(|((ka, va), (kb, vb))| ka == kb && va.get() == vb.get())
    }
}

impl PodNetworks {
    /// Parse the annotation value; an absent or empty annotation is an empty map.
    pub fn parse(annotation: Option<&str>) -> Result<Self, AnnotationError> {
        let text = annotation.map_or("", str::trim);
        if text.is_empty() {
            return Ok(PodNetworks::default());
        }
        let parsed: BTreeMap<String, Box<RawValue>> =
            serde_json::from_str(text).map_err(|source| AnnotationError::NotJson { source })?;
        let entries = parsed
            .into_iter()
            .map(|(k, v)| {
                let min = minify(v.get());
                // Re-wrapping text that was already valid JSON cannot fail.
                let raw = RawValue::from_string(min).unwrap_or(v);
                (k, raw)
            })
            .collect();
        Ok(PodNetworks { entries })
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The network keys, sorted.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    /// The raw (minified) JSON of one entry.
    pub fn raw(&self, key: &str) -> Option<&str> {
        self.entries.get(key).map(|r| r.get())
    }

    /// The entry for `key`, parsed.
    pub fn entry(&self, key: &str) -> Result<Option<PodNetworkEntry>, AnnotationError> {
        self.entries
            .get(key)
            .map(|raw| {
                serde_json::from_str(raw.get()).map_err(|source| AnnotationError::BadEntry {
                    key: key.to_owned(),
                    source,
                })
            })
            .transpose()
    }

    /// Set the entry for `key`. Unknown fields an earlier entry at that key
    /// carried (and `entry.other` does not override) are kept, except that
    /// the deprecated single-value fields OVN-Kubernetes also writes
    /// (`ip_address`, `gateway_ip`) follow the lists they repeat: it
    /// refuses an entry where they disagree (`ip_address and ip_addresses
    /// conflict`), so a kept one is set to the one address (gateway) the
    /// entry now has, or dropped when it has not exactly one.
    pub fn set(&mut self, key: &str, entry: &PodNetworkEntry) {
        let mut entry = entry.clone();
        if let Some(old) = self.entries.get(key)
            && let Ok(serde_json::Value::Object(old)) = serde_json::from_str(old.get())
        {
            for (k, v) in old {
                if !KNOWN_FIELDS.contains(&k.as_str()) {
                    entry.other.entry(k).or_insert(v);
                }
            }
        }
        for (single, list) in [
            (LEGACY_IP, &entry.ip_addresses),
            (LEGACY_GATEWAY, &entry.gateway_ips),
        ] {
            if entry.other.contains_key(single) {
                match list.as_slice() {
                    [one] => entry.other.insert(single.to_owned(), one.as_str().into()),
                    _ => entry.other.remove(single),
                };
            }
        }
        let raw = serde_json::value::to_raw_value(&entry)
            .expect("an entry of strings and JSON values always serializes");
        self.entries.insert(key.to_owned(), raw);
    }

    /// Remove the entry for `key`; returns whether it was present.
    pub fn remove(&mut self, key: &str) -> bool {
        self.entries.remove(key).is_some()
    }

    /// The annotation value: compact JSON, keys sorted.
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(&self.entries).expect("a map of raw JSON values always serializes")
    }
}

/// Merge `entry` under `key` into an annotation value; returns the new value.
pub fn merge_entry(
    existing: Option<&str>,
    key: &str,
    entry: &PodNetworkEntry,
) -> Result<String, AnnotationError> {
    let mut nets = PodNetworks::parse(existing)?;
    nets.set(key, entry);
    Ok(nets.to_annotation())
}

/// Remove `key` from an annotation value. Returns `None` when nothing
/// changes (no such key), `Some(None)` when the annotation is left empty
/// (delete it), `Some(Some(value))` otherwise.
pub fn remove_entry(
    existing: Option<&str>,
    key: &str,
) -> Result<Option<Option<String>>, AnnotationError> {
    let mut nets = PodNetworks::parse(existing)?;
    if !nets.remove(key) {
        return Ok(None);
    }
    Ok(Some((!nets.is_empty()).then(|| nets.to_annotation())))
}

/// The annotation key of a network: the config's `netAttachDefName`
/// (`"<ns>/<name>"`, as OVN-Kubernetes' generated NADs carry it) when set,
/// else `"<pod-namespace>/<network name>"`.
pub fn network_key(
    net_attach_def_name: Option<&str>,
    pod_namespace: &str,
    network_name: &str,
) -> Result<String, AnnotationError> {
    let bad = |value: &str, reason| AnnotationError::BadNetworkKey {
        value: value.to_owned(),
        reason,
    };
    if let Some(nad) = net_attach_def_name.filter(|n| !n.is_empty()) {
        let Some((ns, name)) = nad.split_once('/') else {
            return Err(bad(nad, "netAttachDefName must be <namespace>/<name>"));
        };
        if !is_dns_label(ns) {
            return Err(bad(nad, "namespace part is not a DNS-1123 label"));
        }
        if !is_dns_subdomain(name) {
            return Err(bad(nad, "name part is not a DNS-1123 subdomain"));
        }
        return Ok(nad.to_owned());
    }
    if !is_dns_label(pod_namespace) {
        return Err(bad(pod_namespace, "pod namespace is not a DNS-1123 label"));
    }
    if network_name.is_empty()
        || network_name.contains('/')
        || network_name.chars().any(char::is_whitespace)
    {
        return Err(bad(
            network_name,
            "network name must be non-empty, without '/' or whitespace",
        ));
    }
    Ok(format!("{pod_namespace}/{network_name}"))
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// Drop insignificant whitespace from valid JSON text.
fn minify(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    let mut in_string = false;
    let mut escaped = false;
    for c in json.chars() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
            out.push(c);
        } else if !matches!(c, ' ' | '\t' | '\n' | '\r') {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// OKEP-6224's example annotation ("DHCP VFIO secondary on a VM pod").
    const OKEP_EXAMPLE: &str = r#"{
  "default": {
    "ip_addresses": ["10.220.2.18/24"],
    "mac_address": "0a:58:0a:dc:02:12",
    "gateway_ips": ["10.220.2.1"],
    "role": "primary"
  },

  "default/ovn-localnet-dhcp-vfio": {
    "ip_addresses": ["10.1.192.213/24"],
    "mac_address": "02:00:00:00:20:08",
    "gateway_ips": ["10.1.192.1"],
    "role": "secondary",
    "ipam_mode": "dhcp"
  }
}"#;

    const OKEP_DEFAULT_ONLY: &str = r#"{
  "default": {
    "ip_addresses": ["10.220.2.18/24"],
    "mac_address": "0a:58:0a:dc:02:12",
    "gateway_ips": ["10.220.2.1"],
    "role": "primary"
  }
}"#;

    fn okep_entry() -> PodNetworkEntry {
        PodNetworkEntry::dhcp(
            Ipv4Addr::new(10, 1, 192, 213),
            24,
            "02:00:00:00:20:08".parse().unwrap(),
            &[Ipv4Addr::new(10, 1, 192, 1)],
        )
    }

    #[test]
    fn produces_the_okep_example_byte_for_byte() {
        let out = merge_entry(
            Some(OKEP_DEFAULT_ONLY),
            "default/ovn-localnet-dhcp-vfio",
            &okep_entry(),
        )
        .unwrap();
        assert_eq!(out, minify(OKEP_EXAMPLE));
        assert_eq!(
            out,
            concat!(
                r#"{"default":{"ip_addresses":["10.220.2.18/24"],"mac_address":"0a:58:0a:dc:02:12","#,
                r#""gateway_ips":["10.220.2.1"],"role":"primary"},"#,
                r#""default/ovn-localnet-dhcp-vfio":{"ip_addresses":["10.1.192.213/24"],"#,
                r#""mac_address":"02:00:00:00:20:08","gateway_ips":["10.1.192.1"],"#,
                r#""role":"secondary","ipam_mode":"dhcp"}}"#
            )
        );
    }

    /// An IPv6 lease's entry: the address in CIDR form as OVN-Kubernetes
    /// writes IPv6 ones (compressed, lowercase), the network's gateway when
    /// it names one, none otherwise.
    #[test]
    fn an_ipv6_entry_has_the_same_shape() {
        let mac: MacAddr = "02:00:00:00:20:08".parse().unwrap();
        let named = PodNetworkEntry::dhcp6(
            "2001:db8:0:0::5".parse().unwrap(),
            64,
            mac,
            Some("2001:DB8::1".parse().unwrap()),
        );
        let out = merge_entry(None, "ns/v6", &named).unwrap();
        assert_eq!(
            out,
            concat!(
                r#"{"ns/v6":{"ip_addresses":["2001:db8::5/64"],"mac_address":"02:00:00:00:20:08","#,
                r#""gateway_ips":["2001:db8::1"],"role":"secondary","ipam_mode":"dhcp"}}"#
            )
        );
        let bare = PodNetworkEntry::dhcp6("2001:db8::5".parse().unwrap(), 128, mac, None);
        let out = merge_entry(None, "ns/v6", &bare).unwrap();
        assert_eq!(
            out,
            concat!(
                r#"{"ns/v6":{"ip_addresses":["2001:db8::5/128"],"mac_address":"02:00:00:00:20:08","#,
                r#""role":"secondary","ipam_mode":"dhcp"}}"#
            )
        );
    }

    /// A dual-stack attachment's entry: both addresses, IPv4 first, and
    /// the gateways of both that are known.
    #[test]
    fn a_dual_stack_entry_carries_both_addresses() {
        let mac: MacAddr = "02:00:00:00:20:08".parse().unwrap();
        let both = PodNetworkEntry::dhcp_dual(
            (
                "192.0.2.10".parse().unwrap(),
                24,
                Some("192.0.2.1".parse().unwrap()),
            ),
            (
                "2001:db8::5".parse().unwrap(),
                64,
                Some("2001:db8::1".parse().unwrap()),
            ),
            mac,
        );
        assert_eq!(
            merge_entry(None, "ns/dual", &both).unwrap(),
            concat!(
                r#"{"ns/dual":{"ip_addresses":["192.0.2.10/24","2001:db8::5/64"],"#,
                r#""mac_address":"02:00:00:00:20:08","gateway_ips":["192.0.2.1","2001:db8::1"],"#,
                r#""role":"secondary","ipam_mode":"dhcp"}}"#
            )
        );
        let no_v6_gateway = PodNetworkEntry::dhcp_dual(
            (
                "192.0.2.10".parse().unwrap(),
                24,
                Some("192.0.2.1".parse().unwrap()),
            ),
            ("2001:db8::5".parse().unwrap(), 128, None),
            mac,
        );
        assert_eq!(no_v6_gateway.gateway_ips, ["192.0.2.1"]);
        assert_eq!(
            no_v6_gateway.ip_addresses,
            ["192.0.2.10/24", "2001:db8::5/128"]
        );
    }

    #[test]
    fn parses_the_okep_example() {
        let nets = PodNetworks::parse(Some(OKEP_EXAMPLE)).unwrap();
        assert_eq!(
            nets.keys().collect::<Vec<_>>(),
            ["default", "default/ovn-localnet-dhcp-vfio"]
        );
        assert_eq!(
            nets.entry("default/ovn-localnet-dhcp-vfio")
                .unwrap()
                .unwrap(),
            okep_entry()
        );
        let default = nets.entry("default").unwrap().unwrap();
        assert_eq!(default.role, "primary");
        assert_eq!(default.ipam_mode, None);
        assert!(nets.entry("missing").unwrap().is_none());
    }

    #[test]
    fn foreign_entries_survive_verbatim() {
        // Unknown fields, their order, number formats and odd values are kept.
        let existing = r#"{"zeta/net":{"z":1.50,"a":[true,null],"s":"x y\" }"},
            "default":{"ip_addresses":["10.0.0.5/24"],"mac_address":"0a:58:0a:00:00:05",
            "routes":[{"dest":"10.96.0.0/16","nextHop":"10.0.0.1"}],"tunnel_id":7,"role":"primary"},
            "weird":"not an object"}"#;
        let out = merge_entry(Some(existing), "ns/mine", &okep_entry()).unwrap();
        assert!(
            out.contains(r#""zeta/net":{"z":1.50,"a":[true,null],"s":"x y\" }"}"#),
            "{out}"
        );
        assert!(out.contains(
            r#""default":{"ip_addresses":["10.0.0.5/24"],"mac_address":"0a:58:0a:00:00:05","routes":[{"dest":"10.96.0.0/16","nextHop":"10.0.0.1"}],"tunnel_id":7,"role":"primary"}"#
        ), "{out}");
        assert!(out.contains(r#""weird":"not an object""#), "{out}");
        let nets = PodNetworks::parse(Some(&out)).unwrap();
        assert_eq!(
            nets.keys().collect::<Vec<_>>(),
            ["default", "ns/mine", "weird", "zeta/net"]
        );
    }

    #[test]
    fn replacing_our_entry_keeps_its_unknown_fields() {
        let existing = r#"{"ns/mine":{"ip_addresses":["192.0.2.9/24"],"mac_address":"02:00:00:00:00:09","role":"secondary","tunnel_id":3,"ipam_mode":"dhcp"}}"#;
        let out = merge_entry(Some(existing), "ns/mine", &okep_entry()).unwrap();
        assert_eq!(
            out,
            r#"{"ns/mine":{"ip_addresses":["10.1.192.213/24"],"mac_address":"02:00:00:00:20:08","gateway_ips":["10.1.192.1"],"role":"secondary","ipam_mode":"dhcp","tunnel_id":3}}"#
        );
    }

    /// The entry OVN-Kubernetes' one-shot writes for a VM (its marshaller
    /// adds the deprecated single-value fields for one address) follows a
    /// move: they agree with the lists after it, as OVN-Kubernetes' parser
    /// demands, and everything else stays.
    #[test]
    fn moving_an_ovn_kubernetes_entry_keeps_its_deprecated_fields_in_step() {
        let existing = r#"{"default":{"ip_addresses":["10.0.0.5/24"],"mac_address":"0a:58:0a:00:00:05"},"ns/vm":{"ip_addresses":["192.0.2.83/24"],"mac_address":"02:00:00:00:30:01","gateway_ips":["192.0.2.1"],"routes":[{"dest":"198.51.100.0/24","nextHop":"192.0.2.1"}],"ip_address":"192.0.2.83/24","gateway_ip":"192.0.2.1","tunnel_id":7,"role":"secondary","ipam_mode":"dhcp"}}"#;
        let mac = MacAddr([2, 0, 0, 0, 0x30, 1]);
        let moved = PodNetworkEntry::dhcp(
            Ipv4Addr::new(192, 0, 2, 84),
            24,
            mac,
            &[Ipv4Addr::new(192, 0, 2, 254)],
        );
        let out = merge_entry(Some(existing), "ns/vm", &moved).unwrap();
        let nets = PodNetworks::parse(Some(&out)).unwrap();
        assert_eq!(
            nets.raw("default"),
            PodNetworks::parse(Some(existing)).unwrap().raw("default")
        );
        let e = nets.entry("ns/vm").unwrap().unwrap();
        assert_eq!(e.ip_addresses, ["192.0.2.84/24"]);
        assert_eq!(e.gateway_ips, ["192.0.2.254"]);
        assert_eq!(e.ipam_mode.as_deref(), Some("dhcp"));
        assert_eq!(e.other["ip_address"], "192.0.2.84/24");
        assert_eq!(e.other["gateway_ip"], "192.0.2.254");
        assert_eq!(e.other["tunnel_id"], 7);
        assert_eq!(
            e.other["routes"],
            serde_json::json!([{"dest": "198.51.100.0/24", "nextHop": "192.0.2.1"}])
        );
        // A lease without a router: no gateway, so no deprecated copy of one.
        let bare = PodNetworkEntry::dhcp(Ipv4Addr::new(192, 0, 2, 85), 24, mac, &[]);
        let out = merge_entry(Some(&out), "ns/vm", &bare).unwrap();
        let e = PodNetworks::parse(Some(&out))
            .unwrap()
            .entry("ns/vm")
            .unwrap()
            .unwrap();
        assert!(e.gateway_ips.is_empty());
        assert!(!e.other.contains_key("gateway_ip"), "{out}");
        assert_eq!(e.other["ip_address"], "192.0.2.85/24");
        // An entry that never had them does not get them.
        let out = merge_entry(None, "ns/vm", &bare).unwrap();
        assert!(!out.contains("ip_address\""), "{out}");
    }

    #[test]
    fn empty_gateways_are_omitted_and_absent_annotation_is_empty() {
        let entry = PodNetworkEntry::dhcp(
            Ipv4Addr::new(198, 51, 100, 7),
            25,
            "02:00:00:00:00:07".parse().unwrap(),
            &[],
        );
        for existing in [None, Some(""), Some("  ")] {
            let out = merge_entry(existing, "a/b", &entry).unwrap();
            assert_eq!(
                out,
                r#"{"a/b":{"ip_addresses":["198.51.100.7/25"],"mac_address":"02:00:00:00:00:07","role":"secondary","ipam_mode":"dhcp"}}"#
            );
        }
    }

    #[test]
    fn merge_is_idempotent() {
        let once = merge_entry(Some(OKEP_DEFAULT_ONLY), "x/y", &okep_entry()).unwrap();
        let twice = merge_entry(Some(&once), "x/y", &okep_entry()).unwrap();
        assert_eq!(once, twice);
    }

    #[test]
    fn remove_keeps_others_and_reports_emptiness() {
        let out = remove_entry(Some(OKEP_EXAMPLE), "default/ovn-localnet-dhcp-vfio").unwrap();
        assert_eq!(out, Some(Some(minify(OKEP_DEFAULT_ONLY))));
        assert_eq!(
            remove_entry(Some(OKEP_EXAMPLE), "absent/key").unwrap(),
            None
        );
        assert_eq!(remove_entry(None, "absent/key").unwrap(), None);
        let only = merge_entry(None, "a/b", &okep_entry()).unwrap();
        assert_eq!(remove_entry(Some(&only), "a/b").unwrap(), Some(None));
    }

    #[test]
    fn malformed_annotations_are_errors() {
        for bad in ["[]", "{", "\"x\"", "{\"a\":}", "null"] {
            let err = PodNetworks::parse(Some(bad)).unwrap_err();
            assert!(
                matches!(err, AnnotationError::NotJson { .. }),
                "{bad}: {err}"
            );
            assert!(merge_entry(Some(bad), "a/b", &okep_entry()).is_err());
            assert!(remove_entry(Some(bad), "a/b").is_err());
        }
        let nets = PodNetworks::parse(Some(r#"{"a/b":{"ip_addresses":5}}"#)).unwrap();
        let err = nets.entry("a/b").unwrap_err();
        assert!(err.to_string().contains("\"a/b\""), "{err}");
    }

    #[test]
    fn network_key_sources() {
        assert_eq!(
            network_key(Some("default/ovn-localnet-dhcp"), "tenant", "localnet-dhcp").unwrap(),
            "default/ovn-localnet-dhcp"
        );
        assert_eq!(
            network_key(None, "tenant", "localnet-dhcp").unwrap(),
            "tenant/localnet-dhcp"
        );
        assert_eq!(
            network_key(Some(""), "tenant", "net").unwrap(),
            "tenant/net"
        );
        for bad in [
            "noslash", "/name", "ns/", "NS/name", "ns/na me", "ns/a/b", "-ns/x",
        ] {
            let err = network_key(Some(bad), "tenant", "net").unwrap_err();
            assert!(
                matches!(err, AnnotationError::BadNetworkKey { .. }),
                "{bad}"
            );
        }
        assert!(network_key(None, "Tenant", "net").is_err());
        assert!(network_key(None, "tenant", "").is_err());
        assert!(network_key(None, "tenant", "a/b").is_err());
    }

    #[test]
    fn minify_respects_strings() {
        assert_eq!(
            minify("{ \"a b\" : [ 1 , \"\\\" x\" ] }"),
            "{\"a b\":[1,\"\\\" x\"]}"
        );
        assert_eq!(minify(r#""\\" "#), r#""\\""#);
    }
}
