//! Checks on everything under `manifests/`:
//!
//! - every YAML document parses into its typed model (k8s-openapi, this crate's CUDN/NAD types,
//!   a strict `KubeVirt` subset) and serialises back to the same JSON value, so a misspelt or
//!   unknown field — which serde would silently drop — fails the test;
//! - the CRD is byte-identical to what `crdgen` generates from the Rust types;
//! - RBAC is exactly the agent's API surface;
//! - the `DaemonSet` mounts every path the agent's defaults point to, with the propagation,
//!   privileges, probes and init container the agent needs;
//! - the examples agree with each other and with NAD rendering.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, Namespace, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use xdhcp_api::ClusterUserDefinedNetwork;
use xdhcp_api::nad::{self, NetworkAttachmentDefinition};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("api/ has a parent")
        .to_path_buf()
}

fn manifests_dir() -> PathBuf {
    workspace_root().join("manifests")
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            yaml_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "yaml" || x == "yml") {
            out.push(path);
        }
    }
}

/// Every YAML document of every manifest file: (file, index, value).
fn documents() -> Vec<(PathBuf, usize, Value)> {
    let mut files = Vec::new();
    yaml_files(&manifests_dir(), &mut files);
    assert!(
        !files.is_empty(),
        "no manifests found under {}",
        manifests_dir().display()
    );
    let mut docs = Vec::new();
    for file in files {
        let text = fs::read_to_string(&file).unwrap();
        for (i, doc) in serde_yaml::Deserializer::from_str(&text).enumerate() {
            let value = Value::deserialize(doc)
                .unwrap_or_else(|e| panic!("{} document {i}: invalid YAML: {e}", file.display()));
            if !value.is_null() {
                docs.push((file.clone(), i, value));
            }
        }
    }
    docs
}

fn docs_of(file: &str) -> Vec<Value> {
    let path = manifests_dir().join(file);
    documents()
        .into_iter()
        .filter(|(f, _, _)| *f == path)
        .map(|(_, _, v)| v)
        .collect()
}

fn doc_of_kind(file: &str, kind: &str) -> Value {
    docs_of(file)
        .into_iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("{file} has no {kind}"))
}

/// The first place two JSON values differ, as a JSON pointer with both sides.
fn first_difference(path: &str, original: &Value, reserialised: &Value) -> Option<String> {
    match (original, reserialised) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, va) in a {
                let p = format!("{path}/{k}");
                match b.get(k) {
                    None => return Some(format!("{p}: dropped (unknown or misspelt field): {va}")),
                    Some(vb) => {
                        if let Some(d) = first_difference(&p, va, vb) {
                            return Some(d);
                        }
                    }
                }
            }
            b.keys()
                .find(|k| !a.contains_key(*k))
                .map(|k| format!("{path}/{k}: added on re-serialisation: {}", b[k]))
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => a
            .iter()
            .zip(b)
            .enumerate()
            .find_map(|(i, (va, vb))| first_difference(&format!("{path}/{i}"), va, vb)),
        (Value::Number(a), Value::Number(b)) if a.as_f64() == b.as_f64() => None,
        _ if original == reserialised => None,
        _ => Some(format!("{path}: {original} became {reserialised}")),
    }
}

/// Parse `value` as `T` and require that serialising it gives back `value` exactly.
fn strict<T: DeserializeOwned + Serialize>(what: &str, value: &Value) -> T {
    let typed: T = serde_json::from_value(value.clone()).unwrap_or_else(|e| {
        panic!(
            "{what}: does not parse as {}: {e}",
            std::any::type_name::<T>()
        )
    });
    let back = serde_json::to_value(&typed).unwrap();
    if let Some(d) = first_difference("", value, &back) {
        panic!("{what}: {d}");
    }
    typed
}

/// The `KubeVirt` `VirtualMachine` fields the examples use; anything else is an error.
mod kubevirt {
    use super::{BTreeMap, Deserialize, ObjectMeta, Serialize};

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Empty {}

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct VirtualMachine {
        pub api_version: String,
        pub kind: String,
        pub metadata: ObjectMeta,
        pub spec: VmSpec,
    }

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct VmSpec {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub run_strategy: Option<String>,
        pub template: Template,
    }

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Template {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub metadata: Option<ObjectMeta>,
        pub spec: VmiSpec,
    }

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct VmiSpec {
        pub domain: Domain,
        pub networks: Vec<Network>,
        pub volumes: Vec<Volume>,
    }

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Domain {
        pub devices: Devices,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub resources: Option<Resources>,
    }

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Resources {
        pub requests: BTreeMap<String, String>,
    }

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Devices {
        pub disks: Vec<Disk>,
        pub interfaces: Vec<Interface>,
    }

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Disk {
        pub name: String,
        pub disk: DiskTarget,
    }

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct DiskTarget {
        pub bus: String,
    }

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct Interface {
        pub name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub masquerade: Option<Empty>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub bridge: Option<Empty>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub sriov: Option<Empty>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub mac_address: Option<String>,
    }

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Network {
        pub name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub pod: Option<Empty>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub multus: Option<Multus>,
    }

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct Multus {
        pub network_name: String,
    }

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct Volume {
        pub name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub container_disk: Option<ContainerDisk>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub cloud_init_no_cloud: Option<CloudInit>,
    }

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct ContainerDisk {
        pub image: String,
    }

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct CloudInit {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub network_data: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub user_data: Option<String>,
    }
}

/// `kustomization.yaml`, restricted to the fields we use.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Kustomization {
    api_version: String,
    kind: String,
    resources: Vec<String>,
}

#[test]
fn every_manifest_parses_strictly_into_its_type() {
    let mut kinds = BTreeSet::new();
    for (file, i, doc) in documents() {
        let what = format!("{} document {i}", file.display());
        let api_version = doc["apiVersion"]
            .as_str()
            .unwrap_or_else(|| panic!("{what}: no apiVersion"));
        let kind = doc["kind"]
            .as_str()
            .unwrap_or_else(|| panic!("{what}: no kind"));
        match (api_version, kind) {
            ("v1", "Namespace") => drop(strict::<Namespace>(&what, &doc)),
            ("v1", "ServiceAccount") => drop(strict::<ServiceAccount>(&what, &doc)),
            ("v1", "Pod") => drop(strict::<Pod>(&what, &doc)),
            ("apps/v1", "DaemonSet") => drop(strict::<DaemonSet>(&what, &doc)),
            ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy") => {
                drop(strict::<ValidatingAdmissionPolicy>(&what, &doc));
            }
            ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding") => {
                drop(strict::<ValidatingAdmissionPolicyBinding>(&what, &doc));
            }
            ("rbac.authorization.k8s.io/v1", "ClusterRole") => {
                drop(strict::<ClusterRole>(&what, &doc));
            }
            ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
                drop(strict::<ClusterRoleBinding>(&what, &doc));
            }
            ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => {
                drop(strict::<CustomResourceDefinition>(&what, &doc));
            }
            ("k8s.ovn.org/v1", "ClusterUserDefinedNetwork") => {
                drop(strict::<ClusterUserDefinedNetwork>(&what, &doc));
            }
            ("k8s.cni.cncf.io/v1", "NetworkAttachmentDefinition") => {
                let nad: NetworkAttachmentDefinition = strict(&what, &doc);
                let config: Value = serde_json::from_str(&nad.spec.config)
                    .unwrap_or_else(|e| panic!("{what}: spec.config is not JSON: {e}"));
                if config["type"] == nad::OVN_K8S_CNI_OVERLAY {
                    nad::validate_nad(&nad).unwrap_or_else(|e| panic!("{what}: {e}"));
                }
            }
            ("kubevirt.io/v1", "VirtualMachine") => {
                drop(strict::<kubevirt::VirtualMachine>(&what, &doc));
            }
            ("kustomize.config.k8s.io/v1beta1", "Kustomization") => {
                drop(strict::<Kustomization>(&what, &doc));
            }
            other => panic!("{what}: no typed model for {other:?}; add one to this test"),
        }
        kinds.insert(kind.to_owned());
    }
    for expected in [
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "DaemonSet",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ] {
        assert!(
            kinds.contains(expected),
            "no {expected} among the manifests"
        );
    }
}

#[test]
fn strict_parsing_catches_an_unknown_field() {
    // The check above relies on round-trip comparison; prove it notices a typo.
    let mut ds = doc_of_kind("daemonset.yaml", "DaemonSet");
    ds["spec"]["template"]["spec"]["hostNetwrok"] = Value::Bool(true);
    let back =
        serde_json::to_value(serde_json::from_value::<DaemonSet>(ds.clone()).unwrap()).unwrap();
    let diff = first_difference("", &ds, &back).expect("typo must be detected");
    assert!(diff.contains("/spec/template/spec/hostNetwrok"), "{diff}");
}

#[test]
fn committed_crd_matches_the_rust_types() {
    let path = workspace_root().join(xdhcp_api::crd::CRD_PATH);
    let committed =
        fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let generated = xdhcp_api::crd::crd_yaml().unwrap();
    assert!(
        committed == generated,
        "{} is out of date with api/src/cudn.rs: run `cargo xtask manifests` \
         (cargo run -q -p xdhcp-api --bin crdgen > {})",
        xdhcp_api::crd::CRD_PATH,
        xdhcp_api::crd::CRD_PATH
    );
    assert!(committed.starts_with("# Generated by"), "header missing");
    assert!(committed.contains("Do not edit"), "header missing");
}

#[test]
fn committed_guard_crd_matches_the_rust_types() {
    let path = workspace_root().join(xdhcp_api::crd::GUARD_CRD_PATH);
    let committed =
        fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let generated = xdhcp_api::crd::guard_crd_yaml().unwrap();
    assert!(
        committed == generated,
        "{} is out of date with api/src/guard.rs: run `cargo xtask manifests`",
        xdhcp_api::crd::GUARD_CRD_PATH
    );
    // xdhcp's own CRD is applied with the agent; the CUDN (OVN-K's) is not.
    let k = fs::read_to_string(manifests_dir().join("kustomization.yaml")).unwrap();
    assert!(k.contains("crd/dhcpguardpolicies.xdhcp.io.yaml"), "{k}");
    let crd: Value = serde_yaml::from_str(committed.split_once("---\n").unwrap().1).unwrap();
    assert_eq!(crd["spec"]["scope"], "Cluster");
}

/// (apiGroup, resource, verb) triples of the `ClusterRole`.
fn rbac_rules() -> BTreeSet<(String, String, String)> {
    let role: ClusterRole = strict("rbac.yaml", &doc_of_kind("rbac.yaml", "ClusterRole"));
    let mut out = BTreeSet::new();
    for rule in role.rules.unwrap_or_default() {
        assert!(
            rule.resource_names.is_none() && rule.non_resource_urls.is_none(),
            "unexpected rule shape"
        );
        for group in rule.api_groups.unwrap_or_default() {
            for resource in rule.resources.clone().unwrap_or_default() {
                for verb in &rule.verbs {
                    out.insert((group.clone(), resource.clone(), verb.clone()));
                }
            }
        }
    }
    out
}

/// The guard-policy watch lists and watches `DhcpGuardPolicy` objects, and
/// nothing else: what RBAC grants on them.
#[test]
fn the_guard_policy_watch_only_lists_and_watches() {
    let path = workspace_root().join("agent/src/kube/guard_policies.rs");
    let watch =
        fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    assert!(
        watch.contains("Api<DhcpGuardPolicy> = Api::all(") && watch.contains("watcher(api"),
        "the DhcpGuardPolicy watch changed; update RBAC and this test"
    );
    for call in [
        ".create(",
        ".replace(",
        ".delete(",
        ".patch(",
        ".patch_status(",
        "DynamicObject",
    ] {
        assert!(
            !watch.contains(call),
            "agent/src/kube/guard_policies.rs calls `{call}`: RBAC does not grant it"
        );
    }
}

#[test]
fn rbac_is_exactly_what_the_agent_uses() {
    let expected: BTreeSet<(String, String, String)> = [
        ("", "pods", "get"),
        ("", "pods", "patch"),
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("kubevirt.io", "virtualmachineinstances", "get"),
        ("kubevirt.io", "virtualmachineinstancemigrations", "get"),
        ("xdhcp.io", "dhcpguardpolicies", "list"),
        ("xdhcp.io", "dhcpguardpolicies", "watch"),
    ]
    .into_iter()
    .map(|(g, r, v)| (g.to_owned(), r.to_owned(), v.to_owned()))
    .collect();
    assert_eq!(rbac_rules(), expected);

    // The node's pod watch lists and watches pods, and nothing else: a
    // reflector of Api<Pod> over every namespace, narrowed to the node.
    let path = workspace_root().join("agent/src/kube/node_pods.rs");
    let watch =
        fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    assert!(
        watch.contains("Api<Pod> = Api::all(")
            && watch.contains("watcher(api")
            && watch.contains("spec.nodeName="),
        "the node's pod watch changed; update RBAC and this test"
    );
    for call in [
        ".create(",
        ".replace(",
        ".delete(",
        ".patch(",
        "DynamicObject",
    ] {
        assert!(
            !watch.contains(call),
            "agent/src/kube/node_pods.rs calls `{call}`: RBAC does not grant it"
        );
    }

    // Cross-check against the agent's Kubernetes client: it must reach exactly these resources
    // with exactly these verbs. A new call (a watch, a list, a write) there needs RBAC here.
    let path = workspace_root().join("agent/src/kube/client.rs");
    let client =
        fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    assert!(
        client.contains("Api<Pod>"),
        "agent no longer uses Api<Pod>; update RBAC and this test"
    );
    assert!(
        client.contains("\"kubevirt.io\"") && client.contains("\"virtualmachineinstances\""),
        "agent no longer reads kubevirt.io virtualmachineinstances; update RBAC and this test"
    );
    assert!(
        client.contains("\"virtualmachineinstancemigrations\""),
        "agent no longer reads kubevirt.io virtualmachineinstancemigrations; update RBAC and this test"
    );
    assert!(
        client.contains(".get(") || client.contains(".get_opt("),
        "agent reads nothing?"
    );
    assert!(
        client.contains(".patch("),
        "agent no longer patches pods; drop the verb from RBAC"
    );
    for call in [
        ".list(",
        ".watch(",
        "watcher(",
        ".create(",
        ".replace(",
        ".delete(",
        ".delete_collection(",
        ".patch_status(",
        ".replace_status(",
        ".entry(",
        "Api::all",
    ] {
        assert!(
            !client.contains(call),
            "agent/src/kube/client.rs calls `{call}`: RBAC does not grant it"
        );
    }

    let binding: ClusterRoleBinding =
        strict("rbac.yaml", &doc_of_kind("rbac.yaml", "ClusterRoleBinding"));
    let sa: ServiceAccount = strict("rbac.yaml", &doc_of_kind("rbac.yaml", "ServiceAccount"));
    let ds: DaemonSet = strict(
        "daemonset.yaml",
        &doc_of_kind("daemonset.yaml", "DaemonSet"),
    );
    let subject = &binding.subjects.as_ref().unwrap()[0];
    assert_eq!(binding.role_ref.name, "xdhcp");
    assert_eq!(
        (subject.kind.as_str(), Some(subject.name.as_str())),
        ("ServiceAccount", sa.metadata.name.as_deref())
    );
    assert_eq!(subject.namespace, sa.metadata.namespace);
    assert_eq!(ds.metadata.namespace, sa.metadata.namespace);
    let pod_spec = ds.spec.template.spec.unwrap();
    assert_eq!(pod_spec.service_account_name, sa.metadata.name);
}

/// Path defaults of `xdhcp agent`, read from its sources so a changed default fails here.
fn agent_default_paths() -> BTreeSet<String> {
    let root = workspace_root();
    // The agent's flags and their defaults live in settings.rs.
    let cli =
        fs::read_to_string(root.join("agent/src/settings.rs")).expect("agent/src/settings.rs");
    let mut paths: BTreeSet<String> = cli
        .split("default_value = \"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .filter(|v| v.starts_with('/'))
        .map(str::to_owned)
        .collect();
    let config =
        fs::read_to_string(root.join("plugin/src/config.rs")).expect("plugin/src/config.rs");
    let socket = config
        .split("DEFAULT_SOCKET: &str = \"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("DEFAULT_SOCKET in plugin/src/config.rs");
    paths.insert(socket.to_owned());
    // The agent's default paths (state, bpffs, sysfs, socket) must be among them.
    for p in [
        "/var/lib/xdhcp",
        "/sys/fs/bpf/xdhcp",
        "/sys",
        "/run/xdhcp/xdhcp.sock",
        "/var/run/openvswitch/db.sock",
    ] {
        assert!(
            paths.contains(p),
            "agent default {p} not found in agent sources: {paths:?}"
        );
    }
    // Runtime paths the agent uses without a flag: pod network namespaces, the CNI plugin
    // directory, and the upstream DHCP daemon's socket directory (OKEP prerequisites).
    paths.extend(["/var/run/netns", "/opt/cni/bin", "/run/cni"].map(str::to_owned));
    paths
}

fn agent_container(ds: &DaemonSet) -> &Container {
    let spec = ds.spec.template.spec.as_ref().unwrap();
    spec.containers
        .iter()
        .find(|c| c.name == "agent")
        .expect("container named agent")
}

#[test]
fn daemonset_mounts_every_agent_path_from_the_host_at_the_same_path() {
    let ds: DaemonSet = strict(
        "daemonset.yaml",
        &doc_of_kind("daemonset.yaml", "DaemonSet"),
    );
    let spec = ds.spec.template.spec.as_ref().unwrap();
    let host_paths: BTreeMap<&str, (&str, Option<&str>)> = spec
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .map(|v| {
            let hp = v
                .host_path
                .as_ref()
                .unwrap_or_else(|| panic!("volume {} is not a hostPath", v.name));
            (v.name.as_str(), (hp.path.as_str(), hp.type_.as_deref()))
        })
        .collect();
    let mounts = agent_container(&ds).volume_mounts.as_ref().unwrap();
    for path in agent_default_paths() {
        let mount = mounts
            .iter()
            .filter(|m| path == m.mount_path || path.starts_with(&format!("{}/", m.mount_path)))
            .max_by_key(|m| m.mount_path.len())
            .unwrap_or_else(|| panic!("agent path {path} is not under any mount"));
        let (host, _) = host_paths[mount.name.as_str()];
        assert_eq!(
            host, mount.mount_path,
            "{path}: mounted from host {host} at {}",
            mount.mount_path
        );
    }
    let by_path = |p: &str| {
        mounts
            .iter()
            .find(|m| m.mount_path == p)
            .unwrap_or_else(|| panic!("no mount at {p}"))
    };
    assert_eq!(
        by_path("/sys/fs/bpf").mount_propagation.as_deref(),
        Some("HostToContainer")
    );
    // Sysfs is read-only but for what the VFIO handoff writes
    // (agent/src/vfio.rs: driver_override under the device, the drivers'
    // bind and unbind).
    assert_eq!(by_path("/sys").read_only, Some(true));
    let vfio = workspace_root().join("agent/src/vfio.rs");
    let vfio = fs::read_to_string(&vfio).unwrap();
    for (written, mount) in [
        ("\"driver_override\"", "/sys/devices"),
        ("\"unbind\"", "/sys/bus/pci/drivers"),
        ("\"bind\"", "/sys/bus/pci/drivers"),
    ] {
        assert!(vfio.contains(written), "vfio.rs no longer writes {written}");
        assert_ne!(by_path(mount).read_only, Some(true), "{mount}");
        assert_eq!(host_paths[by_path(mount).name.as_str()].0, mount);
    }
    let writable: Vec<&str> = mounts
        .iter()
        .filter(|m| m.mount_path.starts_with("/sys") && m.read_only != Some(true))
        .map(|m| m.mount_path.as_str())
        .collect();
    assert_eq!(
        writable,
        ["/sys/devices", "/sys/bus/pci/drivers", "/sys/fs/bpf"],
        "writable sysfs mounts"
    );
    assert_eq!(
        by_path("/var/run/netns").mount_propagation.as_deref(),
        Some("HostToContainer")
    );
    assert_eq!(by_path("/opt/cni/bin").read_only, Some(true));
    // The uplinks are read from Open vSwitch (--ovsdb): its run directory,
    // read-only (connecting to its socket needs no writable mount).
    assert_eq!(by_path("/var/run/openvswitch").read_only, Some(true));
    assert_eq!(
        by_path("/var/run/openvswitch").mount_propagation.as_deref(),
        Some("HostToContainer")
    );
    assert_eq!(
        host_paths[by_path("/var/lib/xdhcp").name.as_str()].1,
        Some("DirectoryOrCreate")
    );
    assert_eq!(
        host_paths[by_path("/run/xdhcp").name.as_str()].1,
        Some("DirectoryOrCreate")
    );
}

/// Not privileged: the capabilities the agent uses, nothing else.
#[test]
fn daemonset_gives_the_agent_only_the_capabilities_it_uses() {
    let ds: DaemonSet = strict(
        "daemonset.yaml",
        &doc_of_kind("daemonset.yaml", "DaemonSet"),
    );
    let security = agent_container(&ds).security_context.as_ref().unwrap();
    assert_eq!(security.privileged, Some(false));
    // The API refuses allowPrivilegeEscalation: false beside SYS_ADMIN.
    assert_eq!(security.allow_privilege_escalation, None);
    let caps = security.capabilities.as_ref().unwrap();
    assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_owned()][..]));
    let added: BTreeSet<&str> = caps.add.iter().flatten().map(String::as_str).collect();
    assert_eq!(
        added,
        BTreeSet::from([
            "BPF",
            "PERFMON",
            "NET_ADMIN",
            "NET_RAW",
            "SYS_ADMIN",
            "SYS_RESOURCE"
        ])
    );
}

#[test]
fn daemonset_runs_the_agent_as_the_node_needs() {
    let ds: DaemonSet = strict(
        "daemonset.yaml",
        &doc_of_kind("daemonset.yaml", "DaemonSet"),
    );
    let spec = ds.spec.template.spec.as_ref().unwrap();
    assert_eq!(spec.host_network, Some(true));
    assert_eq!(
        spec.host_pid, None,
        "hostPID is not needed (namespaces come as /var/run/netns paths)"
    );
    let agent = agent_container(&ds);
    // NODE_NAME from the downward API.
    let node_name = agent
        .env
        .as_ref()
        .unwrap()
        .iter()
        .find(|e| e.name == "NODE_NAME")
        .expect("NODE_NAME");
    let field = node_name
        .value_from
        .as_ref()
        .and_then(|v| v.field_ref.as_ref())
        .expect("fieldRef");
    assert_eq!(field.field_path, "spec.nodeName");

    // Probes hit /healthz and /readyz on the port given to --metrics-addr.
    let cmd = agent.command.as_ref().unwrap();
    assert_eq!(&cmd[..2], ["xdhcp", "agent"]);
    let addr = cmd
        .iter()
        .skip_while(|a| *a != "--metrics-addr")
        .nth(1)
        .expect("--metrics-addr");
    // Loopback only by default: /metrics names every binding's pod, MAC
    // and address.
    let addr: std::net::SocketAddr = addr.parse().unwrap();
    assert!(addr.ip().is_loopback(), "--metrics-addr {addr}");
    let port = i32::from(addr.port());
    let ports = agent.ports.as_ref().unwrap();
    let named = ports
        .iter()
        .find(|p| p.container_port == port)
        .expect("metrics port declared");
    for (probe, path) in [
        (&agent.liveness_probe, "/healthz"),
        (&agent.readiness_probe, "/readyz"),
    ] {
        let get = probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .expect("httpGet probe");
        assert_eq!(get.path.as_deref(), Some(path));
        assert_eq!(get.host.as_deref(), Some(addr.ip().to_string().as_str()));
        let target = match &get.port {
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(p) => *p,
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(n) => {
                assert_eq!(Some(n), named.name.as_ref());
                named.container_port
            }
        };
        assert_eq!(target, port);
    }
    let requests = agent
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .expect("resource requests");
    assert!(requests.contains_key("cpu") && requests.contains_key("memory"));

    // The init container installs the plugin as xdhcp and, unless opted
    // out, as dhcp: the drop-in is the default.
    let init = &spec.init_containers.as_ref().unwrap()[0];
    let script = init.command.as_ref().unwrap().join("\n");
    assert!(script.contains("/host/opt/cni/bin/xdhcp"), "{script}");
    assert!(script.contains("/host/opt/cni/bin/dhcp"), "{script}");
    assert!(
        script.contains("\"$INSTALL_AS_DHCP\" = \"true\""),
        "{script}"
    );
    let flag = init
        .env
        .as_ref()
        .unwrap()
        .iter()
        .find(|e| e.name == "INSTALL_AS_DHCP")
        .expect("INSTALL_AS_DHCP");
    assert_eq!(
        flag.value.as_deref(),
        Some("true"),
        "installing as dhcp is the default"
    );
    let mount = &init.volume_mounts.as_ref().unwrap()[0];
    let volume = spec
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .find(|v| v.name == mount.name)
        .unwrap();
    assert_eq!(volume.host_path.as_ref().unwrap().path, "/opt/cni/bin");
    assert_eq!(mount.mount_path, "/host/opt/cni/bin");
}

/// The arguments of the Containerfile's lines that start with `instruction`
/// (`COPY ` gives `[src, dest]`, `RUN ln -s` gives `[target, link]`).
fn containerfile_lines(text: &str, instruction: &str) -> Vec<Vec<String>> {
    text.lines()
        .map(str::trim)
        .filter(|l| l.starts_with(instruction))
        .map(|l| {
            l.split_whitespace()
                .skip(instruction.split_whitespace().count())
                .map(str::to_owned)
                .collect()
        })
        .collect()
}

/// The image the `DaemonSet` runs is the one `Containerfile` builds, under the name
/// `cargo xtask image` and the kind test give it; the binary lands where the init
/// container installs it from; and the install step puts it in /opt/cni/bin under both
/// names, which the agent's `--extra-socket` and the plugin's defaults match.
#[test]
fn containerfile_daemonset_and_install_step_agree() {
    let root = workspace_root();
    let containerfile = fs::read_to_string(root.join("Containerfile")).expect("Containerfile");
    let copies = containerfile_lines(&containerfile, "COPY ");
    assert_eq!(
        copies,
        [
            ["xdhcp", "/usr/local/bin/xdhcp"],
            ["xdhcp-plugin", "/usr/local/bin/xdhcp-plugin"]
        ],
        "{containerfile}"
    );
    let binary = copies[0][1].as_str();
    let plugin = copies[1][1].as_str();
    let links = containerfile_lines(&containerfile, "RUN ln -s");
    assert_eq!(
        links,
        [["xdhcp", "/usr/local/bin/dhcp"]],
        "the image also has the binary as dhcp: {containerfile}"
    );

    // The image name: xtask image, the kind test, every container of the DaemonSet.
    let xtask = fs::read_to_string(root.join("xtask/src/image.rs")).expect("xtask/src/image.rs");
    let image = xtask
        .split("pub const IMAGE: &str = \"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .expect("IMAGE in xtask/src/image.rs");
    assert!(
        xtask.contains("pub const CONTAINERFILE: &str = \"Containerfile\""),
        "xtask image builds the Containerfile"
    );
    let e2e = fs::read_to_string(root.join("hack/e2e-kind.sh")).expect("hack/e2e-kind.sh");
    assert!(
        e2e.contains(&format!("-t {image}")) && e2e.contains("-f \"$ROOT/Containerfile\""),
        "hack/e2e-kind.sh builds {image} from the Containerfile"
    );
    assert!(
        e2e.contains("cp \"$BIN\" \"$WORK/image/xdhcp\""),
        "the kind test's build context holds the binary as {}",
        copies[0][0]
    );
    assert!(
        e2e.contains("\"$WORK/image/xdhcp-plugin\"") && xtask.contains("\"xdhcp-plugin\""),
        "the kind test's and xtask image's build contexts hold the thin plugin as {}",
        copies[1][0]
    );

    let ds: DaemonSet = strict(
        "daemonset.yaml",
        &doc_of_kind("daemonset.yaml", "DaemonSet"),
    );
    let spec = ds.spec.template.spec.as_ref().unwrap();
    let init = &spec.init_containers.as_ref().unwrap()[0];
    for c in spec.containers.iter().chain([init]) {
        assert_eq!(c.image.as_deref(), Some(image), "container {}", c.name);
    }
    // The agent runs the binary by the name the image has on PATH.
    let agent = agent_container(&ds);
    assert_eq!(
        agent.command.as_ref().unwrap()[0],
        Path::new(binary).file_name().unwrap().to_str().unwrap()
    );

    // The install step copies from where the Containerfile put the binaries, into
    // the host's /opt/cni/bin (the init container's mount): the thin plugin as xdhcp
    // and as dhcp, the agent binary as the name the plugin hands over to, each by
    // an atomic rename, the agent first.
    let script = init.command.as_ref().unwrap().join("\n");
    let mount = &init.volume_mounts.as_ref().unwrap()[0].mount_path;
    let agent_name = xdhcp_plugin::invocation::AGENT_NAME;
    let installed = |name: &str| {
        script
            .find(&format!("{mount}/{name}\n"))
            .unwrap_or_else(|| panic!("{name} is installed: {script}"))
    };
    assert!(
        installed(agent_name) < installed("xdhcp"),
        "the agent binary is in place before the plugin that hands over to it: {script}"
    );
    for (from, name) in [(binary, agent_name), (plugin, "xdhcp"), (plugin, "dhcp")] {
        let tmp = format!("{mount}/.{name}.tmp");
        assert!(
            script.contains(&format!("install -m 0755 {from} {tmp}")),
            "installs {from} as {name}: {script}"
        );
        assert!(
            script.contains(&format!("mv -f {tmp} {mount}/{name}")),
            "{script}"
        );
    }

    // The socket the plugin installed as dhcp connects to by default is the one the
    // agent serves beside its own.
    let config =
        fs::read_to_string(root.join("plugin/src/config.rs")).expect("plugin/src/config.rs");
    let upstream = config
        .split("UPSTREAM_SOCKET: &str = \"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .expect("UPSTREAM_SOCKET in plugin/src/config.rs");
    let cmd = agent.command.as_ref().unwrap();
    assert!(
        cmd.windows(2)
            .any(|w| w[0] == "--extra-socket" && w[1] == upstream),
        "{cmd:?}"
    );
}

#[test]
fn kustomization_lists_the_agent_manifests() {
    let k: Kustomization = strict("kustomization.yaml", &docs_of("kustomization.yaml")[0]);
    let listed: BTreeSet<&str> = k.resources.iter().map(String::as_str).collect();
    let mut top_level: BTreeSet<String> = BTreeSet::new();
    for entry in fs::read_dir(manifests_dir()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_file()
            && path.extension().is_some_and(|x| x == "yaml")
            && name != "kustomization.yaml"
        {
            top_level.insert(name);
        }
    }
    for r in &listed {
        assert!(
            manifests_dir().join(r).is_file(),
            "kustomization lists missing {r}"
        );
    }
    for f in &top_level {
        assert!(
            listed.contains(f.as_str()),
            "{f} is not in kustomization.yaml"
        );
    }
}

#[test]
fn example_nad_is_what_the_example_cudn_renders() {
    let cudn: ClusterUserDefinedNetwork = strict(
        "cudn",
        &doc_of_kind(
            "examples/cudn-localnet-dhcp.yaml",
            "ClusterUserDefinedNetwork",
        ),
    );
    let shipped: NetworkAttachmentDefinition = strict(
        "nad",
        &doc_of_kind(
            "examples/nad-localnet-dhcp.yaml",
            "NetworkAttachmentDefinition",
        ),
    );
    let namespace = shipped.metadata.namespace.clone().unwrap();
    let rendered = nad::render_nad(&cudn, &namespace).unwrap();
    assert_eq!(shipped.metadata, rendered.metadata);
    let a: Value = serde_json::from_str(&shipped.spec.config).unwrap();
    let b: Value = serde_json::from_str(&rendered.spec.config).unwrap();
    assert_eq!(a, b);
    assert_eq!(
        a["ipam"],
        serde_json::json!({"type": "dhcp", "dhcpGuard": {"trusted": false, "rate": 20, "burst": 10}})
    );
    // The agent reads the example's guard settings as written.
    let agent = xdhcp_plugin::config::parse(shipped.spec.config.as_bytes()).expect("agent parses");
    assert_eq!(
        agent.ipam.dhcp_guard,
        xdhcp_plugin::config::DhcpGuardSpec {
            trusted: false,
            rate: 20,
            burst: 10
        }
    );

    // The example CUDN passes the CRD's CEL rules; the namespace is selected by it.
    let crd = doc_of_kind(
        xdhcp_api::crd::CRD_PATH.trim_start_matches("manifests/"),
        "CustomResourceDefinition",
    );
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    let cudn_doc = doc_of_kind(
        "examples/cudn-localnet-dhcp.yaml",
        "ClusterUserDefinedNetwork",
    );
    kube::core::cel::Validator::new()
        .validate(schema, &cudn_doc, None)
        .expect("example CUDN is valid");
    let ns: Namespace = strict("ns", &doc_of_kind("examples/namespace.yaml", "Namespace"));
    assert_eq!(ns.metadata.name.as_deref(), Some(namespace.as_str()));
    let selector = cudn.spec.namespace_selector.match_labels.unwrap();
    let labels = ns.metadata.labels.unwrap();
    assert!(
        selector.iter().all(|(k, v)| labels.get(k) == Some(v)),
        "namespace not selected by the CUDN"
    );
}

#[test]
fn example_workloads_use_the_example_network() {
    let nad: NetworkAttachmentDefinition = strict(
        "nad",
        &doc_of_kind(
            "examples/nad-localnet-dhcp.yaml",
            "NetworkAttachmentDefinition",
        ),
    );
    let key = nad::nad_key(
        nad.metadata.namespace.as_deref().unwrap(),
        nad.metadata.name.as_deref().unwrap(),
    );

    let pod: Pod = strict("pod", &doc_of_kind("examples/pod.yaml", "Pod"));
    assert_eq!(pod.metadata.namespace, nad.metadata.namespace);
    let networks = &pod.metadata.annotations.as_ref().unwrap()["k8s.v1.cni.cncf.io/networks"];
    assert_eq!(Some(networks.as_str()), nad.metadata.name.as_deref());

    let vm: kubevirt::VirtualMachine =
        strict("vm", &doc_of_kind("examples/vm.yaml", "VirtualMachine"));
    let multus: Vec<&str> = vm
        .spec
        .template
        .spec
        .networks
        .iter()
        .filter_map(|n| n.multus.as_ref().map(|m| m.network_name.as_str()))
        .collect();
    assert_eq!(multus, [key.as_str()]);
    let bridged = vm
        .spec
        .template
        .spec
        .domain
        .devices
        .interfaces
        .iter()
        .find(|i| i.bridge.is_some())
        .unwrap();
    assert!(
        bridged.mac_address.is_some(),
        "the VM pins its MAC so it keeps its address"
    );

    let bridge: NetworkAttachmentDefinition = strict(
        "nad",
        &doc_of_kind(
            "examples/nad-bridge-dhcp.yaml",
            "NetworkAttachmentDefinition",
        ),
    );
    let config: Value = serde_json::from_str(&bridge.spec.config).unwrap();
    assert_eq!(config["ipam"]["type"], "xdhcp");
}
