//! `DhcpGuardPolicy` (`xdhcp.io/v1alpha1`, cluster-scoped): the DHCP guard's
//! settings for the workload ports of one network, written by the cluster's
//! administrators and read by every node's agent.
//!
//! A namespaced NetworkAttachmentDefinition may only tighten the guard
//! (`ipam.dhcpGuard`, capped by the agent's flags); a cluster-scoped object
//! is the administrators' own word, so it sets the network's guard outright,
//! trust included. What an object leaves out keeps what the network would
//! get without it.
//!
//! Sans-IO: [`DhcpGuardPolicySpec::validate`] checks one object, and
//! [`PolicyBook`] turns the objects the watch holds into one table, network
//! → settings, keeping each object's last good settings while a later
//! version of it is invalid.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The highest client-message rate (per second and port) an object may set.
pub const MAX_RATE: u32 = 100_000;
/// The largest burst an object may set.
pub const MAX_BURST: u32 = 100_000;

/// The guard on the workload ports of one network.
#[derive(
    CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema,
)]
#[kube(
    group = "xdhcp.io",
    version = "v1alpha1",
    kind = "DhcpGuardPolicy",
    plural = "dhcpguardpolicies",
    singular = "dhcpguardpolicy",
    derive = "PartialEq",
    doc = "DhcpGuardPolicy sets the xdhcp DHCP guard on every workload port of one network."
)]
#[serde(rename_all = "camelCase")]
pub struct DhcpGuardPolicySpec {
    /// The network, as OVN-Kubernetes names it on a port: the NAD
    /// (`namespace/name`, `k8s.ovn.org/nad`) or the network's name (the
    /// `name` of its CNI config, `k8s.ovn.org/network`). An object naming
    /// the NAD wins over one naming the network.
    pub network: String,
    /// Drop DHCP server messages (OFFER, ACK, NAK) sent from the network's
    /// workloads (default true). `false` trusts every port of the network:
    /// for a network whose DHCP server or relay runs in a pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drop_server_messages: Option<bool>,
    /// Client messages per second each port may send (0: no limit; at most
    /// 100000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<u32>,
    /// Client messages a quiet port may send back to back (1 to 100000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
    /// One client per port, the workload's own MAC (default true): client
    /// messages under another Ethernet source, `chaddr` or client
    /// identifier `01`+MAC are dropped. `false` also turns learning off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub single_client: Option<bool>,
    /// On a VM's port, learn the address its guest's own DHCP client holds,
    /// with the BOOTP broadcast flag set on the guest's DISCOVER and REQUEST
    /// so the replies pass a port pinned to another address (default true).
    /// Needs `singleClient`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learn: Option<bool>,
}

/// An object's settings once checked: what it sets, each `None` left to
/// the network's settings without it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GuardOverrides {
    /// `Some(true)`: server messages from the network's ports pass.
    pub trusted: Option<bool>,
    pub rate: Option<u32>,
    pub burst: Option<u32>,
    pub single_client: Option<bool>,
    pub learn: Option<bool>,
}

/// Why an object's settings were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("spec.network is empty: name the NAD (namespace/name) or the network")]
    NoNetwork,
    #[error(
        "spec.network {0:?} is neither a NAD (namespace/name, lower-case DNS labels) nor a network name (no '/', no spaces)"
    )]
    BadNetwork(String),
    #[error("spec.rate {0} is above the highest allowed, {MAX_RATE} (0 means no limit)")]
    Rate(u32),
    #[error("spec.burst {0} is outside 1..={MAX_BURST}")]
    Burst(u32),
    #[error(
        "spec.learn is true but spec.singleClient is false: learning needs the port's one client"
    )]
    LearnWithoutSingleClient,
    #[error(
        "spec.network {network:?} is already set by DhcpGuardPolicy {holder:?} (the first by name wins)"
    )]
    Duplicate { network: String, holder: String },
}

/// Whether `s` is a DNS-1123 label.
fn is_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

impl DhcpGuardPolicySpec {
    /// The object's settings, or the first thing wrong with it.
    pub fn validate(&self) -> Result<GuardOverrides, PolicyError> {
        let net = self.network.as_str();
        if net.is_empty() {
            return Err(PolicyError::NoNetwork);
        }
        let ok = match net.split_once('/') {
            Some((ns, name)) => {
                is_label(ns) && !name.is_empty() && name.len() <= 253 && {
                    name.split('.').all(is_label)
                }
            }
            None => net.len() <= 253 && !net.chars().any(|c| c.is_whitespace() || c.is_control()),
        };
        if !ok {
            return Err(PolicyError::BadNetwork(net.to_owned()));
        }
        if let Some(r) = self.rate.filter(|r| *r > MAX_RATE) {
            return Err(PolicyError::Rate(r));
        }
        if let Some(b) = self.burst.filter(|b| *b == 0 || *b > MAX_BURST) {
            return Err(PolicyError::Burst(b));
        }
        if self.single_client == Some(false) && self.learn == Some(true) {
            return Err(PolicyError::LearnWithoutSingleClient);
        }
        Ok(GuardOverrides {
            trusted: self.drop_server_messages.map(|d| !d),
            rate: self.rate,
            burst: self.burst,
            single_client: self.single_client,
            learn: self.learn,
        })
    }
}

/// What became of one object at the last [`PolicyBook::update`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Its settings hold for its network.
    Applied { network: String },
    /// Refused; its last good settings, if it had any, still hold.
    Refused {
        error: PolicyError,
        kept: Option<String>,
    },
}

/// The objects' settings by network, as the watch shows them: each object's
/// last good spec is kept while a newer version of it is invalid; a deleted
/// object's settings go.
#[derive(Debug, Default, Clone)]
pub struct PolicyBook {
    /// Object name → (its network, its settings), last good.
    good: BTreeMap<String, (String, GuardOverrides)>,
}

impl PolicyBook {
    /// Take the objects the watch now holds (name → spec); returns the
    /// verdict on each (by name). Two objects naming one network: the first
    /// by name holds it, the other is refused.
    pub fn update<'a>(
        &mut self,
        objects: impl IntoIterator<Item = (&'a str, &'a DhcpGuardPolicySpec)>,
    ) -> BTreeMap<String, Verdict> {
        let objects: BTreeMap<&str, &DhcpGuardPolicySpec> = objects.into_iter().collect();
        self.good
            .retain(|name, _| objects.contains_key(name.as_str()));
        let mut verdicts = BTreeMap::new();
        for (name, spec) in &objects {
            match spec.validate() {
                Ok(o) => {
                    self.good
                        .insert((*name).to_owned(), (spec.network.clone(), o));
                }
                Err(error) => {
                    let kept = self.good.get(*name).map(|(n, _)| n.clone());
                    verdicts.insert((*name).to_owned(), Verdict::Refused { error, kept });
                }
            }
        }
        let mut holder: BTreeMap<&str, &str> = BTreeMap::new();
        for (name, (network, _)) in &self.good {
            match holder.get(network.as_str()) {
                Some(first) if !verdicts.contains_key(name) => {
                    let error = PolicyError::Duplicate {
                        network: network.clone(),
                        holder: (*first).to_owned(),
                    };
                    verdicts.insert(name.clone(), Verdict::Refused { error, kept: None });
                }
                Some(_) => {}
                None => {
                    holder.insert(network, name);
                    verdicts.entry(name.clone()).or_insert(Verdict::Applied {
                        network: network.clone(),
                    });
                }
            }
        }
        verdicts
    }

    /// Network (NAD or network name) → its settings, as the book holds them.
    pub fn table(&self) -> BTreeMap<String, GuardOverrides> {
        let mut out = BTreeMap::new();
        for (network, o) in self.good.values() {
            out.entry(network.clone()).or_insert(*o);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(network: &str) -> DhcpGuardPolicySpec {
        DhcpGuardPolicySpec {
            network: network.to_owned(),
            ..DhcpGuardPolicySpec::default()
        }
    }

    #[test]
    fn a_valid_object_sets_only_what_it_names() {
        let s = DhcpGuardPolicySpec {
            drop_server_messages: Some(false),
            rate: Some(0),
            burst: Some(3),
            ..spec("lab-ns/localnet1")
        };
        assert_eq!(
            s.validate(),
            Ok(GuardOverrides {
                trusted: Some(true),
                rate: Some(0),
                burst: Some(3),
                single_client: None,
                learn: None,
            })
        );
        assert_eq!(
            spec("lab-ns_localnet1").validate(),
            Ok(GuardOverrides::default())
        );
    }

    #[test]
    fn every_bad_field_is_refused_with_its_name() {
        let cases = [
            (spec(""), PolicyError::NoNetwork),
            (spec("a b"), PolicyError::BadNetwork("a b".into())),
            (spec("NS/x"), PolicyError::BadNetwork("NS/x".into())),
            (spec("ns/"), PolicyError::BadNetwork("ns/".into())),
            (
                DhcpGuardPolicySpec {
                    rate: Some(MAX_RATE + 1),
                    ..spec("n")
                },
                PolicyError::Rate(MAX_RATE + 1),
            ),
            (
                DhcpGuardPolicySpec {
                    burst: Some(0),
                    ..spec("n")
                },
                PolicyError::Burst(0),
            ),
            (
                DhcpGuardPolicySpec {
                    single_client: Some(false),
                    learn: Some(true),
                    ..spec("n")
                },
                PolicyError::LearnWithoutSingleClient,
            ),
        ];
        for (s, want) in cases {
            let got = s.validate();
            assert_eq!(got, Err(want.clone()), "{s:?}");
            assert!(!want.to_string().is_empty());
        }
        assert!(PolicyError::Burst(0).to_string().contains("spec.burst 0"));
    }

    #[test]
    fn an_invalid_version_keeps_the_last_good_settings_and_a_deleted_object_drops_them() {
        let mut book = PolicyBook::default();
        let good = DhcpGuardPolicySpec {
            rate: Some(2),
            ..spec("ns/net")
        };
        let v = book.update([("p", &good)]);
        assert_eq!(
            v["p"],
            Verdict::Applied {
                network: "ns/net".into()
            }
        );
        assert_eq!(book.table()["ns/net"].rate, Some(2));
        let bad = DhcpGuardPolicySpec {
            burst: Some(0),
            ..good.clone()
        };
        let v = book.update([("p", &bad)]);
        assert_eq!(
            v["p"],
            Verdict::Refused {
                error: PolicyError::Burst(0),
                kept: Some("ns/net".into())
            }
        );
        assert_eq!(book.table()["ns/net"].rate, Some(2));
        // Bad from the start: nothing to keep.
        let v = book.update([
            ("p", &bad),
            (
                "q",
                &DhcpGuardPolicySpec {
                    burst: Some(0),
                    ..spec("other")
                },
            ),
        ]);
        assert_eq!(
            v["q"],
            Verdict::Refused {
                error: PolicyError::Burst(0),
                kept: None
            }
        );
        assert!(!book.table().contains_key("other"));
        // Deleted: its settings go.
        book.update([]);
        assert!(book.table().is_empty());
    }

    #[test]
    fn two_objects_on_one_network_the_first_by_name_holds_it() {
        let mut book = PolicyBook::default();
        let a = DhcpGuardPolicySpec {
            rate: Some(1),
            ..spec("n")
        };
        let b = DhcpGuardPolicySpec {
            rate: Some(9),
            ..spec("n")
        };
        let v = book.update([("b", &b), ("a", &a)]);
        assert_eq!(
            v["a"],
            Verdict::Applied {
                network: "n".into()
            }
        );
        assert_eq!(
            v["b"],
            Verdict::Refused {
                error: PolicyError::Duplicate {
                    network: "n".into(),
                    holder: "a".into()
                },
                kept: None
            }
        );
        assert_eq!(book.table()["n"].rate, Some(1));
    }
}
