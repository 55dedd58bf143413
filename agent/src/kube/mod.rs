//! Kubernetes: the pod-networks annotation, the API client, the embedded store.
//!
//! The daemon talks to one interface, [`PodStore`], through the backend
//! chosen once at start by `--kube=auto|on|off` ([`KubeMode`],
//! [`PodApi::connect`]):
//! - [`PodApi::Kube`]: the real API server through [`client::KubeClient`]
//!   (pods get/patch, VMIs get — the whole RBAC surface);
//! - [`PodApi::Embedded`]: no cluster (`--kube=off`); pod identity comes from
//!   `CNI_ARGS` and annotations go to a JSON file under the state dir
//!   ([`embedded::EmbeddedStore`]) that `xdhcp status` shows.
//!
//! One thing: the pod store's interface, its errors and the choice of
//! backend (about 490 lines of code; the rest is its tests).

pub mod annotation;
pub mod client;
pub mod embedded;
/// An in-memory pod store for unit tests (not a cluster).
#[cfg(test)]
pub(crate) mod fake;
pub mod guard_policies;
pub mod node_pods;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;

use serde::{Deserialize, Serialize};

pub use annotation::{POD_NETWORKS_ANNOTATION, PodNetworkEntry, network_key};
pub use client::{KubeClient, KubeMode, RetryPolicy};
pub use embedded::EmbeddedStore;

use crate::workload::{
    MigrationInfo, MigrationTarget, VmiInfo, VmiParseError, Workload, migration_target,
};
use annotation::AnnotationError;

/// `pub type Result<T, E = PodApiError>`.
pub type Result<T, E = PodApiError> = std::result::Result<T, E>;

/// What the agent needs to know about a pod.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PodInfo {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid` (absent in embedded mode unless recorded).
    pub uid: Option<String>,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// Name of the controlling `VirtualMachineInstance` owner reference
    /// (the embedded store: the VMI its seeded labels name).
    pub owner_vmi: Option<String>,
    /// UID of that owner reference (the VMI's `metadata.uid` it must
    /// match; the embedded store knows none).
    #[serde(default)]
    pub owner_vmi_uid: Option<String>,
    /// The current `k8s.ovn.org/pod-networks` annotation value.
    pub pod_networks: Option<String>,
    /// The `kubevirt.io/migrationJobName` annotation (migration targets).
    #[serde(default)]
    pub migration_job_name: Option<String>,
    /// `spec.nodeName`: the node the pod is scheduled to (the embedded
    /// store knows none).
    #[serde(default)]
    pub node_name: Option<String>,
}

impl PodInfo {
    /// `Ok` when the pod is scheduled to node `ours`; else
    /// [`PodApiError::OtherNode`].
    pub fn check_node(&self, ours: &str) -> Result<()> {
        check_node(&self.namespace, &self.name, self.node_name.as_deref(), ours)
    }

    /// Pod or VM: a VM pod is one with a controlling
    /// `VirtualMachineInstance` owner reference, whatever its labels say
    /// (labels are set by whoever creates the pod). The embedded store
    /// gives its seeded pods the owner their labels name.
    pub fn workload(&self) -> Workload {
        match &self.owner_vmi {
            Some(vmi) => Workload::Vm {
                vmi_name: vmi.clone(),
            },
            None => Workload::Pod,
        }
    }

    /// Whether this is a live-migration target launcher pod (see
    /// [`crate::workload::migration_target`]).
    pub fn migration_target(&self) -> Option<MigrationTarget> {
        migration_target(&self.labels, self.migration_job_name.as_deref())
    }
}

/// Failures of the pod API, each naming the object and (for API errors)
/// the HTTP status code.
#[derive(Debug, thiserror::Error)]
pub enum PodApiError {
    /// The API server answered with an error status.
    #[error("{op} {resource} {namespace}/{name}: Kubernetes API answered HTTP {code}: {message}")]
    Api {
        /// `get` or `patch`.
        op: &'static str,
        /// `pod` or `VirtualMachineInstance`.
        resource: &'static str,
        /// Object namespace.
        namespace: String,
        /// Object name.
        name: String,
        /// HTTP status code.
        code: u16,
        /// The API server's message.
        message: String,
        /// The client error.
        #[source]
        source: Box<kube::Error>,
    },
    /// The request never got an API answer (connection, TLS, decoding).
    #[error("{op} {resource} {namespace}/{name}: request to the Kubernetes API failed")]
    Transport {
        /// `get` or `patch`.
        op: &'static str,
        /// `pod` or `VirtualMachineInstance`.
        resource: &'static str,
        /// Object namespace.
        namespace: String,
        /// Object name.
        name: String,
        /// The client error.
        #[source]
        source: Box<kube::Error>,
    },
    /// Every read-modify-write attempt lost a resourceVersion race.
    #[error(
        "updating {POD_NETWORKS_ANNOTATION} on pod {namespace}/{name}: still HTTP 409 Conflict after {attempts} attempts"
    )]
    ConflictsExhausted {
        /// Pod namespace.
        namespace: String,
        /// Pod name.
        name: String,
        /// Attempts made.
        attempts: u32,
        /// The last conflict.
        #[source]
        source: Box<kube::Error>,
    },
    /// The pod's annotation (or the network key) is unusable; nothing was written.
    #[error("pod {namespace}/{name}")]
    Annotation {
        /// Pod namespace.
        namespace: String,
        /// Pod name.
        name: String,
        /// What is wrong.
        #[source]
        source: AnnotationError,
    },
    /// The migration object does not have the `kubevirt.io/v1` shape.
    #[error("VirtualMachineInstanceMigration {namespace}/{name}")]
    Migration {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// What is wrong.
        #[source]
        source: VmiParseError,
    },
    /// The VMI does not have the `kubevirt.io/v1` shape.
    #[error("VirtualMachineInstance {namespace}/{name}")]
    Vmi {
        /// VMI namespace.
        namespace: String,
        /// VMI name.
        name: String,
        /// What is wrong.
        #[source]
        source: VmiParseError,
    },
    /// The pod was deleted and recreated under the same name.
    #[error(
        "pod {namespace}/{name} has UID {actual:?}, the request was for UID {expected} (pod recreated)"
    )]
    UidMismatch {
        /// Pod namespace.
        namespace: String,
        /// Pod name.
        name: String,
        /// UID the caller expected (`CNI_ARGS` `K8S_POD_UID`).
        expected: String,
        /// UID the API server has.
        actual: Option<String>,
    },
    /// The pod is not scheduled to this agent's node: the agent acts on,
    /// and writes, only pods of its own node.
    #[error(
        "pod {namespace}/{name} is on node {}, not on this agent's node {ours}; the agent serves only pods of its own node",
        theirs.as_deref().unwrap_or("(none: not scheduled)")
    )]
    OtherNode {
        /// Pod namespace.
        namespace: String,
        /// Pod name.
        name: String,
        /// The pod's `spec.nodeName`.
        theirs: Option<String>,
        /// This agent's node (`--node-name`).
        ours: String,
    },
    /// The ADD's sandbox network namespace is gone: the sandbox was torn
    /// down (or superseded by a newer one) while the address was being
    /// acquired, so the address must not be reported.
    #[error(
        "pod {namespace}/{name}: the sandbox network namespace {} is gone (sandbox torn down or superseded); not reporting its address",
        netns.display()
    )]
    SandboxGone {
        /// Pod namespace.
        namespace: String,
        /// Pod name.
        name: String,
        /// `CNI_NETNS` of the ADD.
        netns: PathBuf,
        /// Why the path could not be used.
        #[source]
        source: std::io::Error,
    },
    /// No usable client configuration.
    #[error("Kubernetes client configuration: {reason}")]
    Config {
        /// What was missing or wrong.
        reason: String,
        /// The underlying error, if any.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// The embedded store could not be read or written.
    #[error("embedded pod store: failed to {op} {path}")]
    Store {
        /// What we were doing.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The embedded store file is not valid; it was left untouched.
    #[error("embedded pod store {path} is corrupt")]
    StoreCorrupt {
        /// The file.
        path: PathBuf,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
}

impl PodApiError {
    /// The HTTP status code, for API errors (409 for exhausted conflicts).
    pub fn http_status(&self) -> Option<u16> {
        match self {
            PodApiError::Api { code, .. } => Some(*code),
            PodApiError::ConflictsExhausted { .. } => Some(409),
            _ => None,
        }
    }
}

/// `Ok` when pod `ns/name`, scheduled to `theirs`, is on node `ours`.
pub fn check_node(ns: &str, name: &str, theirs: Option<&str>, ours: &str) -> Result<()> {
    if theirs == Some(ours) {
        return Ok(());
    }
    Err(PodApiError::OtherNode {
        namespace: ns.to_owned(),
        name: name.to_owned(),
        theirs: theirs.map(str::to_owned),
        ours: ours.to_owned(),
    })
}

/// What must still hold when an ADD writes its `pod-networks` entry; checked
/// on every read-modify-write attempt, after the pod is read and before the
/// patch is sent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteGuard {
    /// The pod UID the ADD is for (`K8S_POD_UID`, else the UID read when the
    /// ADD started). A pod deleted and recreated under the same name has
    /// another UID; its annotation is not written. The real API server also
    /// checks it: the patch carries `metadata.uid`, which a recreated pod
    /// refuses (an immutable field).
    pub uid: Option<String>,
    /// The ADD's `CNI_NETNS`. When it no longer exists the sandbox was torn
    /// down or superseded, and a newer sandbox may already have reported its
    /// own address; nothing is written.
    pub netns: Option<PathBuf>,
}

impl WriteGuard {
    /// A guard on the pod UID only.
    pub fn uid(uid: Option<&str>) -> Self {
        WriteGuard {
            uid: uid.map(str::to_owned),
            netns: None,
        }
    }

    /// Whether the sandbox network namespace still exists (`Ok` when none
    /// is guarded).
    pub fn check_sandbox(&self, ns: &str, name: &str) -> Result<()> {
        let Some(netns) = &self.netns else {
            return Ok(());
        };
        match std::fs::metadata(netns) {
            Ok(_) => Ok(()),
            Err(source) => Err(PodApiError::SandboxGone {
                namespace: ns.to_owned(),
                name: name.to_owned(),
                netns: netns.clone(),
                source,
            }),
        }
    }
}

/// The future a [`PodStore`] method returns (boxed: the trait is used as
/// `dyn PodStore`).
pub type PodFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

/// The pod operations the daemon needs, whichever backend answers them:
/// [`KubeClient`] (a real API server) or [`EmbeddedStore`] (no cluster).
/// Object safe; tests implement it with an in-memory fake.
pub trait PodStore: std::fmt::Debug + Send + Sync {
    /// Read a pod (labels, uid, owner, current annotation).
    fn get_pod<'a>(&'a self, ns: &'a str, name: &'a str) -> PodFuture<'a, PodInfo>;

    /// Read a VMI; `Ok(None)` when it does not exist (or `name` is empty).
    fn get_vmi<'a>(&'a self, ns: &'a str, name: &'a str) -> PodFuture<'a, Option<VmiInfo>>;

    /// Read a `VirtualMachineInstanceMigration`; `Ok(None)` when it does not
    /// exist (or `name` is empty).
    fn get_migration<'a>(
        &'a self,
        ns: &'a str,
        name: &'a str,
    ) -> PodFuture<'a, Option<MigrationInfo>>;

    /// Set this network's entry of `k8s.ovn.org/pod-networks`, preserving
    /// every other entry, under `guard`: nothing is written when the pod's
    /// UID is not the guarded one or the sandbox's network namespace is
    /// gone, checked on every attempt (read-modify-write, retried on 409).
    fn set_network_entry_guarded<'a>(
        &'a self,
        ns: &'a str,
        name: &'a str,
        guard: &'a WriteGuard,
        key: &'a str,
        entry: PodNetworkEntry,
    ) -> PodFuture<'a, ()>;

    /// Remove this network's entry (DEL) from the pod with UID `uid` only:
    /// a pod recreated under the same name (another UID) is left alone,
    /// which is success (its entry is its own ADD's). Idempotent: a missing
    /// pod or entry is success. The embedded store keeps no pod identity to
    /// compare, so there it removes by name.
    fn remove_network_entry_for_uid<'a>(
        &'a self,
        ns: &'a str,
        name: &'a str,
        uid: Option<&'a str>,
        key: &'a str,
    ) -> PodFuture<'a, ()>;

    /// [`PodStore::set_network_entry_guarded`] with no guard.
    fn set_network_entry<'a>(
        &'a self,
        ns: &'a str,
        name: &'a str,
        key: &'a str,
        entry: PodNetworkEntry,
    ) -> PodFuture<'a, ()> {
        self.set_network_entry_for_uid(ns, name, None, key, entry)
    }

    /// [`PodStore::set_network_entry_guarded`], refusing (before writing)
    /// when the pod's UID is not `uid` (a recreated pod must not receive a
    /// stale address).
    fn set_network_entry_for_uid<'a>(
        &'a self,
        ns: &'a str,
        name: &'a str,
        uid: Option<&'a str>,
        key: &'a str,
        entry: PodNetworkEntry,
    ) -> PodFuture<'a, ()> {
        let guard = WriteGuard::uid(uid);
        Box::pin(async move {
            self.set_network_entry_guarded(ns, name, &guard, key, entry)
                .await
        })
    }

    /// [`PodStore::remove_network_entry_for_uid`] whatever the pod's UID.
    fn remove_network_entry<'a>(
        &'a self,
        ns: &'a str,
        name: &'a str,
        key: &'a str,
    ) -> PodFuture<'a, ()> {
        self.remove_network_entry_for_uid(ns, name, None, key)
    }
}

impl PodStore for KubeClient {
    fn get_pod<'a>(&'a self, ns: &'a str, name: &'a str) -> PodFuture<'a, PodInfo> {
        Box::pin(KubeClient::get_pod(self, ns, name))
    }
    fn get_vmi<'a>(&'a self, ns: &'a str, name: &'a str) -> PodFuture<'a, Option<VmiInfo>> {
        Box::pin(KubeClient::get_vmi(self, ns, name))
    }
    fn get_migration<'a>(
        &'a self,
        ns: &'a str,
        name: &'a str,
    ) -> PodFuture<'a, Option<MigrationInfo>> {
        Box::pin(KubeClient::get_migration(self, ns, name))
    }
    fn set_network_entry_guarded<'a>(
        &'a self,
        ns: &'a str,
        name: &'a str,
        guard: &'a WriteGuard,
        key: &'a str,
        entry: PodNetworkEntry,
    ) -> PodFuture<'a, ()> {
        Box::pin(
            async move { KubeClient::set_network_entry(self, ns, name, guard, key, &entry).await },
        )
    }
    fn remove_network_entry_for_uid<'a>(
        &'a self,
        ns: &'a str,
        name: &'a str,
        uid: Option<&'a str>,
        key: &'a str,
    ) -> PodFuture<'a, ()> {
        Box::pin(KubeClient::remove_network_entry(self, ns, name, uid, key))
    }
}

impl PodStore for EmbeddedStore {
    fn get_pod<'a>(&'a self, ns: &'a str, name: &'a str) -> PodFuture<'a, PodInfo> {
        Box::pin(std::future::ready(EmbeddedStore::get_pod(self, ns, name)))
    }
    fn get_vmi<'a>(&'a self, ns: &'a str, name: &'a str) -> PodFuture<'a, Option<VmiInfo>> {
        Box::pin(std::future::ready(EmbeddedStore::get_vmi(self, ns, name)))
    }
    fn get_migration<'a>(
        &'a self,
        ns: &'a str,
        name: &'a str,
    ) -> PodFuture<'a, Option<MigrationInfo>> {
        Box::pin(std::future::ready(EmbeddedStore::get_migration(
            self, ns, name,
        )))
    }
    fn set_network_entry_guarded<'a>(
        &'a self,
        ns: &'a str,
        name: &'a str,
        guard: &'a WriteGuard,
        key: &'a str,
        entry: PodNetworkEntry,
    ) -> PodFuture<'a, ()> {
        Box::pin(async move {
            EmbeddedStore::set_network_entry(self, ns, name, guard, key, &entry).await
        })
    }
    fn remove_network_entry_for_uid<'a>(
        &'a self,
        ns: &'a str,
        name: &'a str,
        _uid: Option<&'a str>,
        key: &'a str,
    ) -> PodFuture<'a, ()> {
        Box::pin(EmbeddedStore::remove_network_entry(self, ns, name, key))
    }
}

/// The backend the daemon chose at start. Every pod operation goes through
/// [`PodStore`] (`PodApi` dereferences to the chosen backend's); the
/// variants are for what only one backend has (the embedded store's flush
/// and status).
#[derive(Debug, Clone)]
pub enum PodApi {
    /// A real API server.
    Kube(KubeClient),
    /// No cluster: `CNI_ARGS` identity and a local annotation store.
    Embedded(EmbeddedStore),
}

impl std::ops::Deref for PodApi {
    type Target = dyn PodStore;

    fn deref(&self) -> &Self::Target {
        match self {
            PodApi::Kube(c) => c,
            PodApi::Embedded(s) => s,
        }
    }
}

impl PodApi {
    /// Choose the backend for `--kube=<mode>`: `off` → embedded store under
    /// `state_dir`; `on` → a client from in-cluster config or kubeconfig
    /// (error if neither works); `auto` → `on` when in-cluster environment or
    /// a kubeconfig is present ([`client::cluster_config_present`]), else `off`.
    pub async fn connect(mode: KubeMode, state_dir: &Path) -> Result<PodApi> {
        if mode.resolve_from_env() {
            Ok(PodApi::Kube(KubeClient::infer().await?))
        } else {
            Ok(PodApi::Embedded(EmbeddedStore::open(state_dir)))
        }
    }

    /// [`PodApi::connect`] with an explicit kubeconfig (`--kubeconfig`).
    /// When that file exists, `auto` and `on` build the client from it;
    /// otherwise (absent, or a `KUBECONFIG`-style path list) this is
    /// [`PodApi::connect`], whose inference reads `KUBECONFIG` itself.
    pub async fn connect_with_kubeconfig(
        mode: KubeMode,
        kubeconfig: Option<&Path>,
        state_dir: &Path,
    ) -> Result<PodApi> {
        match kubeconfig.filter(|p| p.is_file()) {
            Some(path) if mode != KubeMode::Off => {
                Ok(PodApi::Kube(KubeClient::from_kubeconfig(path).await?))
            }
            _ => Self::connect(mode, state_dir).await,
        }
    }

    /// Scope the backend to node `node` (`--node-name`): the cluster
    /// backend then writes only pods scheduled there, and it needs the
    /// name (a configuration error without it); the embedded store has no
    /// nodes and is returned as it is.
    pub fn on_node(self, node: Option<&str>) -> Result<PodApi> {
        match self {
            PodApi::Kube(c) => match node.filter(|n| !n.trim().is_empty()) {
                Some(n) => Ok(PodApi::Kube(c.with_node(n))),
                None => Err(PodApiError::Config {
                    reason: "--node-name (NODE_NAME) is required with the Kubernetes API: the agent acts only on pods of its own node".into(),
                    source: None,
                }),
            },
            embedded @ PodApi::Embedded(_) => Ok(embedded),
        }
    }

    /// This agent's node, with the cluster backend.
    pub fn node(&self) -> Option<&str> {
        match self {
            PodApi::Kube(c) => c.node(),
            PodApi::Embedded(_) => None,
        }
    }

    /// The embedded store, without a cluster.
    pub fn embedded(&self) -> Option<&EmbeddedStore> {
        match self {
            PodApi::Kube(_) => None,
            PodApi::Embedded(s) => Some(s),
        }
    }

    /// Whether this is the real cluster backend.
    pub fn is_kube(&self) -> bool {
        matches!(self, PodApi::Kube(_))
    }
}

#[cfg(test)]
mod tests {
    use crate::kube::fake::FakePods;

    use super::*;

    fn entry() -> PodNetworkEntry {
        PodNetworkEntry::dhcp(
            std::net::Ipv4Addr::new(192, 0, 2, 10),
            24,
            "02:00:00:00:00:01".parse().unwrap(),
            &[std::net::Ipv4Addr::new(192, 0, 2, 1)],
        )
    }

    /// The provided methods reach the backend as their guarded forms: a
    /// write for another pod UID is refused, an unguarded one lands, and a
    /// DEL for another UID leaves the entry.
    #[tokio::test]
    async fn a_fake_backend_sees_the_provided_methods_as_their_guarded_forms() {
        let fake = FakePods::with_pod("ns", "vm", "uid-1");
        let api: &dyn PodStore = &fake;
        assert_eq!(
            api.get_pod("ns", "vm").await.unwrap().uid.as_deref(),
            Some("uid-1")
        );
        let err = api
            .set_network_entry_for_uid("ns", "vm", Some("uid-0"), "default", entry())
            .await
            .unwrap_err();
        assert!(matches!(err, PodApiError::UidMismatch { .. }), "{err}");
        assert!(fake.entries("ns", "vm").is_empty());
        api.set_network_entry("ns", "vm", "default", entry())
            .await
            .unwrap();
        assert_eq!(fake.entries("ns", "vm"), ["default"]);
        api.remove_network_entry_for_uid("ns", "vm", Some("uid-0"), "default")
            .await
            .unwrap();
        assert_eq!(fake.entries("ns", "vm"), ["default"]);
        api.remove_network_entry("ns", "vm", "default")
            .await
            .unwrap();
        assert!(fake.entries("ns", "vm").is_empty());
    }

    /// The ADD's node check (`ops/trust.rs` `on_this_node`): a pod read from
    /// the store is accepted on its own node only; a pod of another node, or
    /// one not scheduled anywhere, is refused naming both nodes.
    #[tokio::test]
    async fn a_pod_of_another_node_is_refused() {
        let fake = FakePods::with_pod_on("ns", "web", "uid-1", "node-b");
        let api: &dyn PodStore = &fake;
        let info = api.get_pod("ns", "web").await.unwrap();
        info.check_node("node-b").unwrap();
        let err = info.check_node("node-a").unwrap_err();
        assert!(
            matches!(&err, PodApiError::OtherNode { theirs: Some(t), ours, .. }
                if t == "node-b" && ours == "node-a"),
            "{err}"
        );
        let msg = err.to_string();
        assert!(msg.contains("node-b") && msg.contains("node-a"), "{msg}");
        let unscheduled = FakePods::with_pod("ns", "web", "uid-1");
        let info = unscheduled.get_pod("ns", "web").await.unwrap();
        assert!(matches!(
            info.check_node("node-a"),
            Err(PodApiError::OtherNode { theirs: None, .. })
        ));
    }

    /// With the cluster backend the node is required; the embedded store
    /// has none and needs none.
    #[tokio::test]
    async fn the_cluster_backend_needs_the_node_name() {
        let dir = tempfile::tempdir().unwrap();
        let embedded = PodApi::Embedded(EmbeddedStore::open(dir.path()));
        assert!(embedded.on_node(None).unwrap().node().is_none());
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let kube = PodApi::Kube(KubeClient::from_config(config).unwrap());
        let err = kube.clone().on_node(Some(" ")).unwrap_err();
        assert!(err.to_string().contains("--node-name"), "{err}");
        assert_eq!(kube.on_node(Some("node-a")).unwrap().node(), Some("node-a"));
    }

    /// `PodApi` hands every operation to the backend it holds.
    #[tokio::test]
    async fn pod_api_dispatches_to_its_backend() {
        let dir = tempfile::tempdir().unwrap();
        let api = PodApi::Embedded(EmbeddedStore::open(dir.path()));
        assert!(!api.is_kube());
        api.set_network_entry("ns", "pod", "default", entry())
            .await
            .unwrap();
        let PodApi::Embedded(store) = &api else {
            unreachable!()
        };
        let direct = store.get_pod("ns", "pod").unwrap();
        assert_eq!(api.get_pod("ns", "pod").await.unwrap(), direct);
        assert!(
            direct
                .pod_networks
                .is_some_and(|a| a.contains("192.0.2.10"))
        );
    }
}
