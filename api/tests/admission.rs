//! Evaluates the `ValidatingAdmissionPolicy` CEL of `manifests/admission.yaml` the way the API
//! server does for an UPDATE of a pod: the match conditions decide whether a policy applies, then
//! every validation must hold. The objects are `k8s_openapi` pods and the request's user a
//! `k8s_openapi` `UserInfo`, serialised as the API server hands them to CEL.
//!
//! Evaluation uses kube's `cel` feature (the `cel` interpreter with the Kubernetes CEL library
//! registered), as `cel.rs` does for the CRD rules; `manifests.rs` proves the policies parse
//! strictly into their API types.

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;

use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use k8s_openapi::api::authentication::v1::UserInfo;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::core::cel::{KubeCelExt as _, cel};
use serde::Deserialize as _;
use serde_json::{Value, json};

const AGENT: &str = "system:serviceaccount:xdhcp-system:xdhcp";
const NODE_CLAIM: &str = "authentication.kubernetes.io/node-name";
const POD_NETWORKS: &str = "k8s.ovn.org/pod-networks";

fn policies() -> BTreeMap<String, ValidatingAdmissionPolicy> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../manifests/admission.yaml");
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde_yaml::Value::deserialize(d).unwrap())
        .filter(|d| d["kind"] == "ValidatingAdmissionPolicy")
        .map(|d| {
            let p: ValidatingAdmissionPolicy = serde_yaml::from_value(d).unwrap();
            (p.metadata.name.clone().unwrap(), p)
        })
        .collect()
}

/// A scheduled pod with the pod-networks annotation.
fn pod(node: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("tenant".into()),
            uid: Some("u-1".into()),
            labels: Some([("app".to_owned(), "web".to_owned())].into()),
            annotations: Some(
                [
                    (POD_NETWORKS.to_owned(), "{}".to_owned()),
                    (
                        "k8s.v1.cni.cncf.io/networks".to_owned(),
                        "localnet-dhcp".to_owned(),
                    ),
                ]
                .into(),
            ),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            containers: vec![Container {
                name: "c".into(),
                image: Some("registry.invalid/c".into()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        status: None,
    }
}

/// The agent's entry written into `pod`.
fn with_entry(pod: &Pod) -> Pod {
    let mut p = pod.clone();
    p.metadata.annotations.as_mut().unwrap().insert(
        POD_NETWORKS.into(),
        r#"{"tenant/localnet-dhcp":{"ip_addresses":["192.0.2.10/24"]}}"#.into(),
    );
    p
}

/// The user of a request: `username`, and the node claim when given.
fn user(username: &str, node: Option<&str>) -> UserInfo {
    UserInfo {
        username: Some(username.into()),
        uid: Some("sa-uid".into()),
        groups: Some(vec!["system:serviceaccounts".into()]),
        extra: node.map(|n| [(NODE_CLAIM.to_owned(), vec![n.to_owned()])].into()),
    }
}

/// An UPDATE of `old` into `new` by `user`, as CEL's `request`.
fn request(user: &UserInfo) -> Value {
    json!({
        "operation": "UPDATE",
        "namespace": "tenant",
        "name": "web",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "userInfo": user,
        "dryRun": false,
    })
}

/// Evaluate `expr` with `object`, `oldObject` and `request` bound.
fn eval(expr: &str, new: &Pod, old: &Pod, user: &UserInfo) -> bool {
    let mut ctx = cel::Context::default().with_all();
    ctx.add_variable("object", serde_json::to_value(new).unwrap())
        .unwrap();
    ctx.add_variable("oldObject", serde_json::to_value(old).unwrap())
        .unwrap();
    ctx.add_variable("request", request(user)).unwrap();
    let program = cel::Program::compile(expr).unwrap_or_else(|e| panic!("{expr}: {e}"));
    match program.execute(&ctx) {
        Ok(cel::Value::Bool(b)) => b,
        // An error fails the request under `failurePolicy: Fail`.
        Ok(other) => panic!("{expr}: not a boolean: {other:?}"),
        Err(_) => false,
    }
}

/// What the API server answers for the UPDATE: `None` when it is admitted,
/// else the messages of the validations that failed, by policy.
fn admit(new: &Pod, old: &Pod, user: &UserInfo) -> Option<Vec<String>> {
    let mut denied = Vec::new();
    for (name, policy) in policies() {
        let spec = policy.spec.as_ref().unwrap();
        assert_eq!(spec.failure_policy.as_deref(), Some("Fail"), "{name}");
        let applies = spec
            .match_conditions
            .iter()
            .flatten()
            .all(|c| eval(&c.expression, new, old, user));
        if !applies {
            continue;
        }
        for v in spec.validations.iter().flatten() {
            if !eval(&v.expression, new, old, user) {
                denied.push(format!("{name}: {}", v.message.as_deref().unwrap_or("")));
            }
        }
    }
    (!denied.is_empty()).then_some(denied)
}

/// The policies cover exactly pod UPDATEs, match the agent's service
/// account (rbac.yaml's), and every binding denies.
#[test]
fn the_policies_match_the_agents_pod_updates() {
    let policies = policies();
    assert_eq!(
        policies.keys().map(String::as_str).collect::<Vec<_>>(),
        ["xdhcp-own-node-pods", "xdhcp-pod-networks-only"]
    );
    for (name, p) in &policies {
        let spec = p.spec.as_ref().unwrap();
        let rules = spec
            .match_constraints
            .as_ref()
            .and_then(|m| m.resource_rules.as_ref())
            .unwrap();
        assert_eq!(rules.len(), 1, "{name}");
        assert_eq!(
            rules[0].operations.as_deref(),
            Some(&["UPDATE".to_owned()][..])
        );
        assert_eq!(
            rules[0].resources.as_deref(),
            Some(&["pods".to_owned()][..])
        );
        let conditions = spec.match_conditions.as_ref().unwrap();
        assert!(conditions[0].expression.contains(AGENT), "{name}");
    }
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../manifests/admission.yaml");
    let text = fs::read_to_string(path).unwrap();
    let bindings: Vec<Value> = serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde_yaml::Value::deserialize(d).unwrap())
        .filter(|d| d["kind"] == "ValidatingAdmissionPolicyBinding")
        .map(|d| serde_json::to_value(d).unwrap())
        .collect();
    assert_eq!(bindings.len(), policies.len());
    for b in bindings {
        assert!(policies.contains_key(b["spec"]["policyName"].as_str().unwrap()));
        assert_eq!(b["spec"]["validationActions"], json!(["Deny"]));
    }
}

#[test]
fn the_agent_writes_the_entry_of_a_pod_on_its_own_node() {
    let old = pod("node-a");
    assert_eq!(
        admit(&with_entry(&old), &old, &user(AGENT, Some("node-a"))),
        None
    );
}

#[test]
fn the_agent_may_not_write_a_pod_of_another_node() {
    let old = pod("node-b");
    let denied = admit(&with_entry(&old), &old, &user(AGENT, Some("node-a"))).unwrap();
    assert_eq!(denied.len(), 1, "{denied:?}");
    assert!(denied[0].starts_with("xdhcp-own-node-pods:"), "{denied:?}");
    // An unscheduled pod is no pod of its node either.
    let mut unscheduled = pod("node-a");
    unscheduled.spec.as_mut().unwrap().node_name = None;
    assert!(
        admit(
            &with_entry(&unscheduled),
            &unscheduled,
            &user(AGENT, Some("node-a"))
        )
        .is_some()
    );
}

/// Without the node claim (a token not bound to a pod, or a cluster
/// before 1.30) the policy fails closed: the fallback is to delete its
/// binding (docs/security.md), not a policy that lets it through.
#[test]
fn a_token_without_the_node_claim_is_refused() {
    let old = pod("node-a");
    let denied = admit(&with_entry(&old), &old, &user(AGENT, None)).unwrap();
    assert!(denied[0].starts_with("xdhcp-own-node-pods:"), "{denied:?}");
}

#[test]
fn the_agent_may_change_nothing_but_the_pod_networks_annotation() {
    let old = pod("node-a");
    let agent = user(AGENT, Some("node-a"));
    let mut changes: Vec<(&str, Pod)> = Vec::new();
    let mut p = with_entry(&old);
    p.metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert("k8s.v1.cni.cncf.io/networks".into(), "other-net".into());
    changes.push(("another annotation changed", p));
    let mut p = with_entry(&old);
    p.metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert("new".into(), "x".into());
    changes.push(("an annotation added", p));
    let mut p = with_entry(&old);
    p.metadata
        .annotations
        .as_mut()
        .unwrap()
        .remove("k8s.v1.cni.cncf.io/networks");
    changes.push(("an annotation removed", p));
    let mut p = with_entry(&old);
    p.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("vm.kubevirt.io/name".into(), "victim".into());
    changes.push(("a label added", p));
    let mut p = with_entry(&old);
    p.metadata.labels = None;
    changes.push(("the labels removed", p));
    let mut p = with_entry(&old);
    p.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "kubevirt.io/v1".into(),
        kind: "VirtualMachineInstance".into(),
        name: "victim".into(),
        uid: "vmi-uid".into(),
        controller: Some(true),
        ..OwnerReference::default()
    }]);
    changes.push(("an owner added", p));
    let mut p = with_entry(&old);
    p.metadata.finalizers = Some(vec!["hold".into()]);
    changes.push(("a finalizer added", p));
    let mut p = with_entry(&old);
    p.spec.as_mut().unwrap().active_deadline_seconds = Some(1);
    changes.push(("the spec changed", p));
    for (what, new) in changes {
        let denied = admit(&new, &old, &agent).unwrap_or_else(|| panic!("{what}: admitted"));
        assert!(
            denied
                .iter()
                .all(|d| d.starts_with("xdhcp-pod-networks-only:")),
            "{what}: {denied:?}"
        );
    }
    // Removing the agent's own entry's annotation is its DEL: admitted.
    let mut removed = old.clone();
    removed
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .remove(POD_NETWORKS);
    assert_eq!(admit(&removed, &old, &agent), None);
}

/// Nobody else is concerned: the policies' match conditions leave every
/// other writer (OVN-Kubernetes, the kubelet, a user) alone.
#[test]
fn other_writers_are_left_alone() {
    let old = pod("node-b");
    let mut new = with_entry(&old);
    new.metadata.labels = None;
    for other in [
        "system:serviceaccount:ovn-kubernetes:ovnkube-node",
        "system:node:node-b",
        "alice",
    ] {
        assert_eq!(
            admit(&new, &old, &user(other, Some("node-a"))),
            None,
            "{other}"
        );
    }
}
