//! The Kubernetes API client: pods get/patch with a resourceVersion precondition, VMIs get.
//!
//! Writes are read-modify-write, retried whole: each attempt re-reads the
//! pod, recomputes the annotation from what it read, and sends a JSON merge
//! patch carrying `metadata.resourceVersion`, so the API server rejects it
//! with 409 Conflict if anyone wrote the pod in between. Conflicts are retried
//! with bounded, jittered exponential backoff ([`RetryPolicy`]); any other
//! API failure is returned at once as [`PodApiError::Api`] naming the pod and
//! the HTTP status code.
//!
//! One thing: the cluster backend of the pod store (about 520 lines of code;
//! the rest is its tests).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use rand::{Rng, SeedableRng};
use serde_json::json;

use super::annotation::{self, AnnotationError, POD_NETWORKS_ANNOTATION, PodNetworkEntry};
use super::{PodApiError, PodInfo, Result, WriteGuard};
use crate::workload::{ANNOTATION_MIGRATION_JOB_NAME, MigrationInfo, VmiInfo};

/// Longest wait for a TCP/TLS connection to the API server.
pub const API_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait for one API response (read or write).
pub const API_IO_TIMEOUT: Duration = Duration::from_secs(15);

/// Field manager recorded on our patches.
pub const FIELD_MANAGER: &str = "xdhcp";

const RESOURCE_POD: &str = "pod";
const RESOURCE_VMI: &str = "VirtualMachineInstance";
const RESOURCE_VMIM: &str = "VirtualMachineInstanceMigration";

/// `--kube=auto|on|off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum KubeMode {
    /// On when in-cluster environment or a kubeconfig is present.
    #[default]
    Auto,
    /// Always use the API server; fail if no configuration works.
    On,
    /// Never: pod identity from `CNI_ARGS`, annotations in the embedded store.
    Off,
}

impl KubeMode {
    /// Whether to use the API server, reading the process environment and
    /// filesystem (see [`cluster_config_present`]).
    pub fn resolve_from_env(self) -> bool {
        self.resolve(|k| std::env::var_os(k), Path::exists)
    }

    /// Whether to use the API server, with injected environment and file
    /// existence checks.
    pub fn resolve(
        self,
        env: impl Fn(&str) -> Option<OsString>,
        exists: impl Fn(&Path) -> bool,
    ) -> bool {
        match self {
            KubeMode::On => true,
            KubeMode::Off => false,
            KubeMode::Auto => cluster_config_present(env, exists),
        }
    }
}

/// Service-account token path of in-cluster pods.
pub const SERVICE_ACCOUNT_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

/// Whether a cluster configuration is present: in-cluster (both
/// `KUBERNETES_SERVICE_HOST` and `KUBERNETES_SERVICE_PORT` set and the
/// service-account token present), or a kubeconfig (any existing file named
/// by `KUBECONFIG`, else `$HOME/.kube/config`).
pub fn cluster_config_present(
    env: impl Fn(&str) -> Option<OsString>,
    exists: impl Fn(&Path) -> bool,
) -> bool {
    let set = |k: &str| env(k).is_some_and(|v| !v.is_empty());
    if set("KUBERNETES_SERVICE_HOST")
        && set("KUBERNETES_SERVICE_PORT")
        && exists(Path::new(SERVICE_ACCOUNT_TOKEN))
    {
        return true;
    }
    if let Some(paths) = env("KUBECONFIG").filter(|v| !v.is_empty()) {
        return std::env::split_paths(&paths).any(|p| !p.as_os_str().is_empty() && exists(&p));
    }
    env("HOME")
        .filter(|h| !h.is_empty())
        .is_some_and(|home| exists(&PathBuf::from(home).join(".kube/config")))
}

/// Bounded, jittered exponential backoff for 409 retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Total attempts (read + patch), at least 1.
    pub attempts: u32,
    /// Backoff before the second attempt.
    pub initial_backoff: Duration,
    /// Upper bound of any single backoff.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    /// 8 attempts, 50 ms doubling to at most 2 s (about 5 s worst case,
    /// well inside the 2-minute CNI deadline).
    fn default() -> Self {
        RetryPolicy {
            attempts: 8,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(2),
        }
    }
}

impl RetryPolicy {
    /// Backoff after failed attempt number `attempt` (1-based): the
    /// exponential step, jittered uniformly into its upper half.
    pub fn backoff(&self, attempt: u32, rng: &mut impl Rng) -> Duration {
        let exp = self
            .initial_backoff
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(16));
        let step = exp.min(self.max_backoff);
        let half = step / 2;
        half + step.saturating_sub(half).mul_f64(rng.random::<f64>())
    }
}

/// The real API-server backend.
#[derive(Clone)]
pub struct KubeClient {
    client: kube::Client,
    retry: RetryPolicy,
    /// This agent's node: every write refuses a pod scheduled elsewhere.
    node: Option<String>,
}

impl std::fmt::Debug for KubeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeClient")
            .field("retry", &self.retry)
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

fn vmi_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubevirt.io", "v1", "VirtualMachineInstance"),
        "virtualmachineinstances",
    )
}

fn vmim_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubevirt.io", "v1", "VirtualMachineInstanceMigration"),
        "virtualmachineinstancemigrations",
    )
}

impl KubeClient {
    /// Wrap an existing client (tests build one against a fake server).
    pub fn new(client: kube::Client) -> Self {
        KubeClient {
            client,
            retry: RetryPolicy::default(),
            node: None,
        }
    }

    /// Build a client from a configuration. Timeouts are capped at
    /// [`API_CONNECT_TIMEOUT`] / [`API_IO_TIMEOUT`] so a hung API server fails
    /// the CNI request with an error instead of outliving its deadline.
    pub fn from_config(mut config: kube::Config) -> Result<Self> {
        let cap = |t: Option<Duration>, max: Duration| Some(t.map_or(max, |t| t.min(max)));
        config.connect_timeout = cap(config.connect_timeout, API_CONNECT_TIMEOUT);
        config.read_timeout = cap(config.read_timeout, API_IO_TIMEOUT);
        config.write_timeout = cap(config.write_timeout, API_IO_TIMEOUT);
        let client = kube::Client::try_from(config).map_err(|e| PodApiError::Config {
            reason: "cannot build a client from the configuration".into(),
            source: Some(Box::new(e)),
        })?;
        Ok(Self::new(client))
    }

    /// In-cluster configuration, else kubeconfig (`kube::Config::infer`).
    pub async fn infer() -> Result<Self> {
        let config = kube::Config::infer()
            .await
            .map_err(|e| PodApiError::Config {
                reason: "no in-cluster configuration and no usable kubeconfig".into(),
                source: Some(Box::new(e)),
            })?;
        Self::from_config(config)
    }

    /// A client from an explicit kubeconfig file (`--kubeconfig`), using
    /// its current context.
    pub async fn from_kubeconfig(path: &Path) -> Result<Self> {
        let kubeconfig =
            kube::config::Kubeconfig::read_from(path).map_err(|e| PodApiError::Config {
                reason: format!("cannot read kubeconfig {}", path.display()),
                source: Some(Box::new(e)),
            })?;
        let config = kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .map_err(|e| PodApiError::Config {
            reason: format!("kubeconfig {} has no usable context", path.display()),
            source: Some(Box::new(e)),
        })?;
        Self::from_config(config)
    }

    /// Replace the conflict retry policy.
    #[must_use]
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = RetryPolicy {
            attempts: retry.attempts.max(1),
            ..retry
        };
        self
    }

    /// Write only pods scheduled to node `node` (`spec.nodeName`), checked
    /// on every attempt after the read, before the patch: a write for a pod
    /// of another node fails with [`PodApiError::OtherNode`] (a DEL's
    /// removal leaves such a pod alone and succeeds).
    #[must_use]
    pub fn with_node(mut self, node: impl Into<String>) -> Self {
        self.node = Some(node.into());
        self
    }

    /// The node this client writes pods of, if set.
    pub fn node(&self) -> Option<&str> {
        self.node.as_deref()
    }

    /// The underlying client (the node's pod watch shares it).
    pub(super) fn raw(&self) -> &kube::Client {
        &self.client
    }

    fn pods(&self, ns: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), ns)
    }

    /// Read a pod.
    pub async fn get_pod(&self, ns: &str, name: &str) -> Result<PodInfo> {
        let pod = self
            .pods(ns)
            .get(name)
            .await
            .map_err(|e| api_error("get", RESOURCE_POD, ns, name, e))?;
        Ok(pod_info(ns, name, &pod))
    }

    /// Read a VMI; `Ok(None)` when it does not exist or `name` is empty.
    pub async fn get_vmi(&self, ns: &str, name: &str) -> Result<Option<VmiInfo>> {
        if name.is_empty() {
            return Ok(None);
        }
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), ns, &vmi_resource());
        let Some(obj) = api
            .get_opt(name)
            .await
            .map_err(|e| api_error("get", RESOURCE_VMI, ns, name, e))?
        else {
            return Ok(None);
        };
        let mut info =
            VmiInfo::from_json(ns, name, &obj.data).map_err(|source| PodApiError::Vmi {
                namespace: ns.to_owned(),
                name: name.to_owned(),
                source,
            })?;
        // `data` holds everything but the metadata.
        info.uid.clone_from(&obj.metadata.uid);
        Ok(Some(info))
    }

    /// Read a migration; `Ok(None)` when it does not exist or `name` is empty.
    pub async fn get_migration(&self, ns: &str, name: &str) -> Result<Option<MigrationInfo>> {
        if name.is_empty() {
            return Ok(None);
        }
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), ns, &vmim_resource());
        let Some(obj) = api
            .get_opt(name)
            .await
            .map_err(|e| api_error("get", RESOURCE_VMIM, ns, name, e))?
        else {
            return Ok(None);
        };
        let mut info =
            MigrationInfo::from_json(&obj.data).map_err(|source| PodApiError::Migration {
                namespace: ns.to_owned(),
                name: name.to_owned(),
                source,
            })?;
        // `data` holds everything but the metadata.
        info.uid.clone_from(&obj.metadata.uid);
        Ok(Some(info))
    }

    /// Set `key`'s entry of the pod-networks annotation, preserving every
    /// other entry, under `guard` (see [`WriteGuard`]).
    pub async fn set_network_entry(
        &self,
        ns: &str,
        name: &str,
        guard: &WriteGuard,
        key: &str,
        entry: &PodNetworkEntry,
    ) -> Result<()> {
        self.update(ns, name, guard, false, |current| {
            let next = annotation::merge_entry(current, key, entry)?;
            Ok((current != Some(next.as_str())).then_some(Some(next)))
        })
        .await
    }

    /// Remove `key`'s entry (DEL); a missing pod or entry is success, and
    /// so is a pod whose UID is not `uid` (recreated: nothing of this
    /// attachment's is there).
    pub async fn remove_network_entry(
        &self,
        ns: &str,
        name: &str,
        uid: Option<&str>,
        key: &str,
    ) -> Result<()> {
        let guard = WriteGuard::uid(uid);
        match self
            .update(ns, name, &guard, true, |current| {
                annotation::remove_entry(current, key)
            })
            .await
        {
            Err(PodApiError::UidMismatch { actual, .. }) => {
                tracing::info!(namespace = ns, pod = name, expected = ?uid, ?actual,
                    "DEL: the pod was recreated; its pod-networks entry is not this attachment's");
                Ok(())
            }
            Err(e @ PodApiError::OtherNode { .. }) => {
                tracing::warn!(error = %e, "DEL: the pod is not on this node; its pod-networks entry is left alone");
                Ok(())
            }
            other => other,
        }
    }

    /// The read-modify-write loop. `mutate` maps the current annotation to
    /// `None` (nothing to do), `Some(None)` (delete the annotation) or
    /// `Some(Some(value))`. `guard` is checked after every read, before the
    /// patch; the patch also carries the guarded UID, which the API server
    /// refuses (422, `metadata.uid` is immutable) if the pod was recreated
    /// between the read and the write.
    async fn update(
        &self,
        ns: &str,
        name: &str,
        guard: &WriteGuard,
        missing_ok: bool,
        mutate: impl Fn(Option<&str>) -> Result<Option<Option<String>>, AnnotationError>,
    ) -> Result<()> {
        let api = self.pods(ns);
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let pod = match api.get_opt(name).await {
                Ok(Some(pod)) => pod,
                Ok(None) if missing_ok => return Ok(()),
                Ok(None) => {
                    return Err(api_error(
                        "get",
                        RESOURCE_POD,
                        ns,
                        name,
                        kube::Error::Api(
                            kube::core::Status::failure(
                                &format!("pods \"{name}\" not found"),
                                "NotFound",
                            )
                            .with_code(404)
                            .boxed(),
                        ),
                    ));
                }
                Err(e) => return Err(api_error("get", RESOURCE_POD, ns, name, e)),
            };
            self.check_pod(ns, name, guard, &pod)?;
            let current = pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(POD_NETWORKS_ANNOTATION))
                .map(String::as_str);
            let Some(next) = mutate(current).map_err(|source| PodApiError::Annotation {
                namespace: ns.to_owned(),
                name: name.to_owned(),
                source,
            })?
            else {
                return Ok(());
            };
            let mut metadata = json!({ "annotations": { POD_NETWORKS_ANNOTATION: next } });
            if let Some(rv) = &pod.metadata.resource_version {
                metadata["resourceVersion"] = json!(rv);
            }
            if let Some(uid) = &guard.uid {
                metadata["uid"] = json!(uid);
            }
            let patch = json!({ "metadata": metadata });
            match api.patch(name, &params, &Patch::Merge(&patch)).await {
                Ok(_) => {
                    tracing::debug!(
                        namespace = ns,
                        pod = name,
                        attempt,
                        "pod-networks annotation updated"
                    );
                    return Ok(());
                }
                Err(kube::Error::Api(s)) if s.is_conflict() => {
                    let err = kube::Error::Api(s);
                    if attempt >= self.retry.attempts {
                        return Err(PodApiError::ConflictsExhausted {
                            namespace: ns.to_owned(),
                            name: name.to_owned(),
                            attempts: attempt,
                            source: Box::new(err),
                        });
                    }
                    let wait = self
                        .retry
                        .backoff(attempt, &mut rand::rngs::SmallRng::from_os_rng());
                    tracing::debug!(
                        namespace = ns,
                        pod = name,
                        attempt,
                        ?wait,
                        "resourceVersion conflict, retrying"
                    );
                    tokio::time::sleep(wait).await;
                }
                Err(e) if missing_ok && is_not_found(&e) => return Ok(()),
                Err(kube::Error::Api(s)) if guard.uid.is_some() && s.code == 422 => {
                    // Invalid: the UID we sent is not the pod's any more
                    // (recreated since the read), or the patch itself is bad.
                    let err = kube::Error::Api(s);
                    if let Ok(Some(now)) = api.get_opt(name).await {
                        check_uid(ns, name, guard, now.metadata.uid.as_deref())?;
                    }
                    return Err(api_error("patch", RESOURCE_POD, ns, name, err));
                }
                Err(e) => return Err(api_error("patch", RESOURCE_POD, ns, name, e)),
            }
        }
    }
}

impl KubeClient {
    /// Before a write: the pod read is still the one `guard` names, on
    /// this client's node, and its sandbox is still there.
    fn check_pod(&self, ns: &str, name: &str, guard: &WriteGuard, pod: &Pod) -> Result<()> {
        check_uid(ns, name, guard, pod.metadata.uid.as_deref())?;
        if let Some(ours) = &self.node {
            let theirs = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
            super::check_node(ns, name, theirs, ours)?;
        }
        guard.check_sandbox(ns, name)
    }
}

/// The pod must still be the one `guard` names.
fn check_uid(ns: &str, name: &str, guard: &WriteGuard, actual: Option<&str>) -> Result<()> {
    match &guard.uid {
        Some(expected) if actual != Some(expected.as_str()) => Err(PodApiError::UidMismatch {
            namespace: ns.to_owned(),
            name: name.to_owned(),
            expected: expected.clone(),
            actual: actual.map(str::to_owned),
        }),
        _ => Ok(()),
    }
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.is_not_found())
}

fn api_error(
    op: &'static str,
    resource: &'static str,
    ns: &str,
    name: &str,
    e: kube::Error,
) -> PodApiError {
    match e {
        kube::Error::Api(s) => PodApiError::Api {
            op,
            resource,
            namespace: ns.to_owned(),
            name: name.to_owned(),
            code: s.code,
            message: if s.message.is_empty() {
                s.reason.clone()
            } else {
                s.message.clone()
            },
            source: Box::new(kube::Error::Api(s)),
        },
        other => PodApiError::Transport {
            op,
            resource,
            namespace: ns.to_owned(),
            name: name.to_owned(),
            source: Box::new(other),
        },
    }
}

pub(super) fn pod_info(ns: &str, name: &str, pod: &Pod) -> PodInfo {
    let meta = &pod.metadata;
    // A VM pod is one a VMI controls: its controller owner reference, as
    // virt-controller sets it. Labels and other owners claim nothing.
    let owner = meta
        .owner_references
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|o| {
            o.controller == Some(true)
                && o.kind == "VirtualMachineInstance"
                && o.api_version.starts_with("kubevirt.io/")
                && !o.name.is_empty()
        });
    PodInfo {
        namespace: meta.namespace.clone().unwrap_or_else(|| ns.to_owned()),
        name: meta.name.clone().unwrap_or_else(|| name.to_owned()),
        uid: meta.uid.clone(),
        labels: meta.labels.clone().unwrap_or_default(),
        owner_vmi: owner.map(|o| o.name.clone()),
        owner_vmi_uid: owner.map(|o| o.uid.clone()),
        pod_networks: meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(POD_NETWORKS_ANNOTATION))
            .cloned(),
        migration_job_name: meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_MIGRATION_JOB_NAME))
            .cloned(),
        node_name: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let map: HashMap<String, OsString> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), OsString::from(v)))
            .collect();
        move |k| map.get(k).cloned()
    }

    fn files(paths: &[&str]) -> impl Fn(&Path) -> bool {
        let set: Vec<PathBuf> = paths.iter().map(PathBuf::from).collect();
        move |p| set.iter().any(|s| s == p)
    }

    #[test]
    fn explicit_modes_ignore_the_environment() {
        assert!(KubeMode::On.resolve(env_of(&[]), files(&[])));
        assert!(!KubeMode::Off.resolve(
            env_of(&[
                ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
                ("KUBERNETES_SERVICE_PORT", "443")
            ]),
            files(&[SERVICE_ACCOUNT_TOKEN])
        ));
    }

    #[test]
    fn auto_detects_in_cluster() {
        let env = [
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
        ];
        assert!(KubeMode::Auto.resolve(env_of(&env), files(&[SERVICE_ACCOUNT_TOKEN])));
        // Without the token it is not a usable in-cluster config.
        assert!(!KubeMode::Auto.resolve(env_of(&env), files(&[])));
        assert!(!KubeMode::Auto.resolve(
            env_of(&[("KUBERNETES_SERVICE_HOST", "10.96.0.1")]),
            files(&[SERVICE_ACCOUNT_TOKEN])
        ));
    }

    #[test]
    fn auto_detects_kubeconfig() {
        assert!(KubeMode::Auto.resolve(
            env_of(&[("KUBECONFIG", "/nope:/etc/kube.conf")]),
            files(&["/etc/kube.conf"])
        ));
        // KUBECONFIG set but naming nothing that exists: home is not consulted.
        assert!(!KubeMode::Auto.resolve(
            env_of(&[("KUBECONFIG", "/nope"), ("HOME", "/root")]),
            files(&["/root/.kube/config"])
        ));
        assert!(
            KubeMode::Auto.resolve(env_of(&[("HOME", "/root")]), files(&["/root/.kube/config"]))
        );
        assert!(!KubeMode::Auto.resolve(env_of(&[("HOME", "/root")]), files(&[])));
        assert!(!KubeMode::Auto.resolve(env_of(&[]), files(&["/root/.kube/config"])));
    }

    #[test]
    fn backoff_is_bounded_and_grows() {
        let p = RetryPolicy {
            attempts: 5,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(700),
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..100 {
            let b1 = p.backoff(1, &mut rng);
            assert!(
                b1 >= Duration::from_millis(50) && b1 <= Duration::from_millis(100),
                "{b1:?}"
            );
            let b3 = p.backoff(3, &mut rng);
            assert!(
                b3 >= Duration::from_millis(200) && b3 <= Duration::from_millis(400),
                "{b3:?}"
            );
            let b40 = p.backoff(40, &mut rng);
            assert!(
                b40 >= Duration::from_millis(350) && b40 <= Duration::from_millis(700),
                "{b40:?}"
            );
        }
    }

    #[test]
    fn pod_info_prefers_controller_vmi_owner() {
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "virt-launcher-vm1-abcde", "namespace": "tenant", "uid": "u-1",
                "labels": {"kubevirt.io": "virt-launcher"},
                "annotations": {POD_NETWORKS_ANNOTATION: "{}"},
                "ownerReferences": [
                    {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "name": "other", "uid": "x"},
                    {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "name": "vm1", "uid": "y", "controller": true}
                ]
            }
        }))
        .unwrap();
        let info = pod_info("tenant", "virt-launcher-vm1-abcde", &pod);
        assert_eq!(info.owner_vmi.as_deref(), Some("vm1"));
        assert_eq!(info.owner_vmi_uid.as_deref(), Some("y"));
        assert_eq!(info.uid.as_deref(), Some("u-1"));
        assert_eq!(info.pod_networks.as_deref(), Some("{}"));
        assert_eq!(
            info.workload(),
            crate::workload::Workload::Vm {
                vmi_name: "vm1".into()
            }
        );
    }

    /// A pod poses as a VM by its labels alone, or by an owner that does
    /// not control it: it is a plain pod (its own MAC, its own address).
    #[test]
    fn labels_and_non_controller_owners_make_no_vm() {
        let posing: Pod = serde_json::from_value(json!({
            "metadata": {
                "name": "impostor", "namespace": "tenant", "uid": "u-2",
                "labels": {"kubevirt.io": "virt-launcher", "vm.kubevirt.io/name": "victim",
                           "kubevirt.io/domain": "victim"},
                "ownerReferences": [
                    {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "name": "victim", "uid": "v"},
                    {"apiVersion": "example.com/v1", "kind": "VirtualMachineInstance", "name": "victim",
                     "uid": "v", "controller": true}
                ]
            }
        }))
        .unwrap();
        let info = pod_info("tenant", "impostor", &posing);
        assert_eq!(info.workload(), crate::workload::Workload::Pod);
        assert_eq!(info.owner_vmi_uid, None);
    }
}
