//! The embedded pod store used when no cluster is configured.
//!
//! With `--kube=off` (the default when no cluster configuration is found)
//! pod identity comes from `CNI_ARGS` and the `k8s.ovn.org/pod-networks`
//! annotation is kept in one JSON file, `<state_dir>/pod-networks.json`,
//! written atomically (temporary file, rename) so `xdhcp status` always reads
//! a whole document; the rename is what protects against the agent dying.
//! This file stands in for the API server's copy of the annotation, and the
//! agent's lease records ([`crate::store`], durable on every change) are what
//! a restart resumes from, so `fsync` here (a host crash, which also ends
//! every pod the file describes) is left to the agent's group-commit flusher
//! ([`EmbeddedStore::flush`]) and the CNI ADD path does not wait for it.
//! The parsed document is cached and reused while the file is unchanged
//! (same inode, size and mtime), so a hand edit is still seen at once:
//!
//! ```json
//! {"pods": {"<ns>/<name>": {"uid": "…", "labels": {…}, "owner_vmi": null,
//!                            "annotations": {"k8s.ovn.org/pod-networks": "{…}"}}},
//!  "vmis": {"<ns>/<name>": { <kubevirt.io/v1 VirtualMachineInstance JSON> }},
//!  "migrations": {"<ns>/<name>": { <kubevirt.io/v1 VirtualMachineInstanceMigration JSON> }}}
//! ```
//!
//! A pod the file does not know is a plain pod with no labels. An operator
//! (or a test) may seed `labels`, `owner_vmi`, `vmis` and `migrations` by hand to exercise
//! the VM path without a cluster; the agent only ever writes `uid` and
//! `annotations`. A corrupt file is reported and never overwritten.
//!
//! One thing: the embedded pod store (file format, durable write, group
//! commit) and its tests.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::annotation::{self, POD_NETWORKS_ANNOTATION, PodNetworkEntry};
use super::{PodApiError, PodInfo, Result, WriteGuard};
use crate::sys::fs::{AtomicWrite, Install, Temp};
use crate::sys::sync::lock;
use crate::workload::{ANNOTATION_MIGRATION_JOB_NAME, MigrationInfo, VmiInfo, Workload, classify};

/// File name of the store under the state dir.
pub const STORE_FILE: &str = "pod-networks.json";

/// One pod's record.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct EmbeddedPod {
    /// `K8S_POD_UID` of the last ADD that wrote the record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// Labels (seeded by hand; the agent never invents them).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Controlling VMI name (seeded by hand).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_vmi: Option<String>,
    /// Annotations; the agent writes only `k8s.ovn.org/pod-networks`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl EmbeddedPod {
    fn is_blank(&self) -> bool {
        self.labels.is_empty() && self.owner_vmi.is_none() && self.annotations.is_empty()
    }
}

/// The whole store document.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct EmbeddedState {
    /// Pods by `"<ns>/<name>"`.
    #[serde(default)]
    pub pods: BTreeMap<String, EmbeddedPod>,
    /// VMI documents by `"<ns>/<name>"` (seeded by hand).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub vmis: BTreeMap<String, serde_json::Value>,
    /// `VirtualMachineInstanceMigration` documents by `"<ns>/<name>"`
    /// (seeded by hand).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub migrations: BTreeMap<String, serde_json::Value>,
}

/// The embedded backend of [`super::PodApi`].
#[derive(Debug, Clone)]
pub struct EmbeddedStore {
    path: PathBuf,
    /// Serializes read-modify-write cycles; holds the parsed document.
    /// Never held across an await (a write's file IO runs with it
    /// released, see [`Cache::writing`]), so the synchronous
    /// [`EmbeddedStore::pod_by_uid`] waits at most for another caller's
    /// in-memory step.
    lock: Arc<Mutex<Cache>>,
    /// Serializes file writes (see [`EmbeddedStore::commit`]).
    writer: Arc<tokio::sync::Mutex<()>>,
    /// Written since the last [`EmbeddedStore::flush`].
    unsynced: Arc<AtomicBool>,
}

/// Identity of one version of the store file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: i64,
    mtime_nsec: i64,
}

impl Stamp {
    fn of(m: &std::fs::Metadata) -> Self {
        Stamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: m.mtime(),
            mtime_nsec: m.mtime_nsec(),
        }
    }
}

/// The current document: the file as last read or written (`stamp`, `None`
/// when there was no file) plus the changes not written yet.
#[derive(Debug, Default)]
struct Cache {
    valid: bool,
    /// A write of ours is between serialisation and recording its stamp:
    /// the file changes under us, and that is not a hand edit.
    writing: bool,
    stamp: Option<Stamp>,
    state: EmbeddedState,
    /// Changes made to `state` so far, and how many of them are in the file.
    version: u64,
    written: u64,
    /// How many times the file was read and parsed.
    reads: u64,
}

impl Cache {
    /// Count a change to `state`; its number for [`EmbeddedStore::commit`].
    fn changed(&mut self) -> u64 {
        self.version += 1;
        self.version
    }

    /// The current document: the cached one while the file is unchanged
    /// since we last read or wrote it. A file changed by someone else (a
    /// hand edit) is read again; changes of ours not written yet are then
    /// lost, so edit by hand while no CNI operation is running. A corrupt
    /// file is an error and invalidates the cache.
    fn current(&mut self, path: &Path) -> Result<&mut EmbeddedState> {
        if self.valid && self.writing {
            // Our own write is landing; the cache holds it and anything newer.
            return Ok(&mut self.state);
        }
        let read = |e: std::io::Error| PodApiError::Store {
            op: "read",
            path: path.to_owned(),
            source: e,
        };
        // A stat answers the common case (the file as we last saw it)
        // without opening it.
        match std::fs::metadata(path) {
            Ok(m) if self.valid && self.stamp == Some(Stamp::of(&m)) => {
                return Ok(&mut self.state);
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(self.no_file()),
            Err(e) => return Err(read(e)),
        }
        let mut file = match std::fs::File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(self.no_file()),
            Err(e) => return Err(read(e)),
        };
        // The stamp of what is read: the file may have been replaced since
        // the stat above.
        let stamp = Stamp::of(&file.metadata().map_err(read)?);
        if !(self.valid && self.stamp == Some(stamp)) {
            self.valid = false;
            self.reads += 1;
            let mut bytes = Vec::new();
            file.read_to_end(&mut bytes).map_err(read)?;
            let state =
                serde_json::from_slice(&bytes).map_err(|source| PodApiError::StoreCorrupt {
                    path: path.to_owned(),
                    source,
                })?;
            *self = Cache {
                valid: true,
                stamp: Some(stamp),
                state,
                ..*self
            };
        }
        Ok(&mut self.state)
    }

    /// The file is gone: an empty store.
    fn no_file(&mut self) -> &mut EmbeddedState {
        if !(self.valid && self.stamp.is_none()) {
            *self = Cache {
                valid: true,
                stamp: None,
                state: EmbeddedState::default(),
                ..*self
            };
        }
        &mut self.state
    }
}

fn pod_key(ns: &str, name: &str) -> String {
    format!("{ns}/{name}")
}

/// Pod `ns/name` as its record `rec` describes it.
fn pod_info(ns: &str, name: &str, rec: EmbeddedPod) -> PodInfo {
    PodInfo {
        namespace: ns.to_owned(),
        name: name.to_owned(),
        uid: rec.uid,
        // Seeded by the node's administrator (or a test): its labels are
        // trusted to name the VMI, as virt-controller's owner reference
        // does in a cluster.
        owner_vmi: rec.owner_vmi.or_else(|| match classify(&rec.labels) {
            Workload::Vm { vmi_name } => Some(vmi_name),
            Workload::Pod => None,
        }),
        owner_vmi_uid: None,
        labels: rec.labels,
        pod_networks: rec.annotations.get(POD_NETWORKS_ANNOTATION).cloned(),
        migration_job_name: rec.annotations.get(ANNOTATION_MIGRATION_JOB_NAME).cloned(),
        node_name: None,
    }
}

impl EmbeddedStore {
    /// The store under `state_dir` (created on first write).
    pub fn open(state_dir: &Path) -> Self {
        EmbeddedStore {
            path: state_dir.join(STORE_FILE),
            lock: Arc::new(Mutex::new(Cache::default())),
            writer: Arc::new(tokio::sync::Mutex::new(())),
            unsynced: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Make the writes since the last flush durable (fsync of the file and
    /// its directory); the agent's group-commit flusher calls this.
    pub fn flush(&self) -> Result<()> {
        if !self.unsynced.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let sync = |p: &Path| {
            crate::sys::fs::sync_path(p).map_err(|source| PodApiError::Store {
                op: "fsync",
                path: p.to_owned(),
                source,
            })
        };
        let r = match sync(&self.path) {
            Err(PodApiError::Store { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                Ok(())
            }
            other => other,
        }
        .and_then(|()| sync(dir));
        if r.is_err() {
            self.unsynced.store(true, Ordering::Release);
        }
        r
    }

    /// Whether writes wait for [`EmbeddedStore::flush`].
    pub fn has_unsynced(&self) -> bool {
        self.unsynced.load(Ordering::Acquire)
    }

    /// The store file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Read the whole store (what `xdhcp status` shows); a missing file is empty.
    pub fn load(&self) -> Result<EmbeddedState> {
        load_file(&self.path)
    }

    /// A pod as the store knows it; unknown pods are plain pods without labels.
    pub fn get_pod(&self, ns: &str, name: &str) -> Result<PodInfo> {
        let mut cache = lock(&self.lock);
        let state = cache.current(&self.path)?;
        let rec = state
            .pods
            .get(&pod_key(ns, name))
            .cloned()
            .unwrap_or_default();
        Ok(pod_info(ns, name, rec))
    }

    /// The pod whose UID is `uid`, if the store has one: with no cluster,
    /// the store stands for the node's pods, so a workload port found in
    /// Open vSwitch (its `iface-id-ver`) is matched to a pod seeded here.
    /// Synchronous, for the callers that decide a port's policy (every
    /// port, every second): the cached document, the file read again only
    /// when it changed. An unreadable or corrupt store knows no pod
    /// (logged).
    pub fn pod_by_uid(&self, uid: &str) -> Option<PodInfo> {
        let mut cache = lock(&self.lock);
        let found = cache.current(&self.path).map(|state| {
            state.pods.iter().find_map(|(key, rec)| {
                (rec.uid.as_deref() == Some(uid)).then(|| {
                    let (ns, name) = key.split_once('/').unwrap_or(("", key));
                    pod_info(ns, name, rec.clone())
                })
            })
        });
        found.unwrap_or_else(|e| {
            tracing::warn!(error = %crate::rpc::format_chain(&e), uid,
                "cannot read the pod store to find a pod by its UID");
            None
        })
    }

    /// A seeded migration, if any.
    pub fn get_migration(&self, ns: &str, name: &str) -> Result<Option<MigrationInfo>> {
        if name.is_empty() {
            return Ok(None);
        }
        let mut cache = lock(&self.lock);
        let state = cache.current(&self.path)?;
        state
            .migrations
            .get(&pod_key(ns, name))
            .map(|doc| {
                MigrationInfo::from_json(doc).map_err(|source| PodApiError::Migration {
                    namespace: ns.to_owned(),
                    name: name.to_owned(),
                    source,
                })
            })
            .transpose()
    }

    /// A seeded VMI, if any.
    pub fn get_vmi(&self, ns: &str, name: &str) -> Result<Option<VmiInfo>> {
        if name.is_empty() {
            return Ok(None);
        }
        let mut cache = lock(&self.lock);
        let state = cache.current(&self.path)?;
        state
            .vmis
            .get(&pod_key(ns, name))
            .map(|doc| {
                VmiInfo::from_json(ns, name, doc).map_err(|source| PodApiError::Vmi {
                    namespace: ns.to_owned(),
                    name: name.to_owned(),
                    source,
                })
            })
            .transpose()
    }

    /// Set `key`'s entry; records the guarded UID when given. The sandbox
    /// guard is checked under the store's lock, before the change. (The
    /// store only records UIDs the ADDs bring, so it cannot tell an older
    /// pod from a newer one: the UID guard needs the API server.)
    pub async fn set_network_entry(
        &self,
        ns: &str,
        name: &str,
        guard: &WriteGuard,
        key: &str,
        entry: &PodNetworkEntry,
    ) -> Result<()> {
        let uid = guard.uid.as_deref();
        let mine = {
            let mut cache = lock(&self.lock);
            guard.check_sandbox(ns, name)?;
            let state = cache.current(&self.path)?;
            let current = state
                .pods
                .get(&pod_key(ns, name))
                .and_then(|r| r.annotations.get(POD_NETWORKS_ANNOTATION))
                .map(String::as_str);
            let next = annotation::merge_entry(current, key, entry).map_err(|source| {
                PodApiError::Annotation {
                    namespace: ns.to_owned(),
                    name: name.to_owned(),
                    source,
                }
            })?;
            let rec = state.pods.entry(pod_key(ns, name)).or_default();
            if let Some(uid) = uid {
                rec.uid = Some(uid.to_owned());
            }
            rec.annotations
                .insert(POD_NETWORKS_ANNOTATION.to_owned(), next);
            cache.changed()
        };
        self.commit(mine).await
    }

    /// Remove `key`'s entry; a pod or entry the store does not know is success.
    pub async fn remove_network_entry(&self, ns: &str, name: &str, key: &str) -> Result<()> {
        let mine = {
            let mut cache = lock(&self.lock);
            let state = cache.current(&self.path)?;
            let pk = pod_key(ns, name);
            let Some(rec) = state.pods.get_mut(&pk) else {
                return Ok(());
            };
            let current = rec
                .annotations
                .get(POD_NETWORKS_ANNOTATION)
                .map(String::as_str);
            let change = annotation::remove_entry(current, key).map_err(|source| {
                PodApiError::Annotation {
                    namespace: ns.to_owned(),
                    name: name.to_owned(),
                    source,
                }
            })?;
            match change {
                None => return Ok(()),
                Some(Some(next)) => {
                    rec.annotations
                        .insert(POD_NETWORKS_ANNOTATION.to_owned(), next);
                }
                Some(None) => {
                    rec.annotations.remove(POD_NETWORKS_ANNOTATION);
                    if rec.is_blank() {
                        state.pods.remove(&pk);
                    }
                }
            }
            cache.changed()
        };
        self.commit(mine).await
    }

    /// Group commit: returns once a file write that includes change `mine`
    /// is done. Writes are serialized; a caller that gets the write lock
    /// after another caller wrote its change returns at once, and one write
    /// carries every change made before it (a burst of ADDs costs a few
    /// rewrites of the document, not one each).
    async fn commit(&self, mine: u64) -> Result<()> {
        let _writer = self.writer.lock().await;
        let (bytes, version) = {
            let mut cache = lock(&self.lock);
            if cache.written >= mine {
                return Ok(());
            }
            let mut bytes = serde_json::to_vec_pretty(&cache.state)
                .expect("a map of strings and JSON values always serializes");
            bytes.push(b'\n');
            // Until the new stamp is recorded below, a reader must not take
            // our write for a hand edit and reload the file: that would drop
            // the changes made since `bytes` was taken.
            cache.writing = true;
            (bytes, cache.version)
        };
        // The write and the stat block: on the blocking pool, so the
        // runtime's workers go on with other tasks meanwhile.
        let path = self.path.clone();
        let (written, stamp) = tokio::task::spawn_blocking(move || {
            let written = write_atomic(&path, &bytes);
            let stamp = std::fs::metadata(&path).ok().map(|m| Stamp::of(&m));
            (written, stamp)
        })
        .await
        .unwrap_or_else(|e| {
            let source = std::io::Error::other(format!("the blocking write died: {e}"));
            let failed = PodApiError::Store {
                op: "write",
                path: self.path.clone(),
                source,
            };
            (Err(failed), None)
        });
        let mut cache = lock(&self.lock);
        cache.writing = false;
        // On failure the changes stay in the cache (the file, untouched,
        // still matches its stamp) and go out with the next commit.
        written?;
        self.unsynced.store(true, Ordering::Release);
        cache.written = cache.written.max(version);
        // The file is now our write; the cached document is it or newer.
        match stamp {
            Some(s) => cache.stamp = Some(s),
            None => cache.valid = false,
        }
        Ok(())
    }
}

/// Read a store file (for `xdhcp status`); a missing file is an empty store.
pub fn load_file(path: &Path) -> Result<EmbeddedState> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|source| PodApiError::StoreCorrupt {
            path: path.to_owned(),
            source,
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(EmbeddedState::default()),
        Err(source) => Err(PodApiError::Store {
            op: "read",
            path: path.to_owned(),
            source,
        }),
    }
}

/// Write `bytes` to `path` so readers see the old or the new content, never
/// a mix (durability: [`EmbeddedStore::flush`]). Creates the directory if
/// needed. The content goes to a spare file next to `path`
/// (`.<name>.spare`), which is then atomically exchanged with `path`
/// ([`Install::Exchange`]): the spare keeps the previous document and is
/// rewritten next time, so a rewrite allocates and frees no inode (on
/// ext4, allocating one skips over every recently freed inode, which showed
/// up in the agent's CPU profile). Where the exchange is not supported, or
/// `path` does not exist yet, the spare is renamed over `path` instead.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|source| PodApiError::Store {
        op: "create directory",
        path: dir.to_owned(),
        source,
    })?;
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let spare = dir.join(format!(".{file_name}.spare"));
    let options = AtomicWrite {
        temp: &spare,
        create: Temp::Reuse,
        install: Install::Exchange,
        durable: false,
        syncs: None,
    };
    crate::sys::fs::atomic_replace(path, bytes, &options).map_err(|e| PodApiError::Store {
        op: e.step.label(),
        path: e.path,
        source: e.source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn entry(last: u8) -> PodNetworkEntry {
        PodNetworkEntry::dhcp(
            Ipv4Addr::new(192, 0, 2, last),
            24,
            "02:00:00:00:00:01".parse().unwrap(),
            &[Ipv4Addr::new(192, 0, 2, 1)],
        )
    }

    #[tokio::test]
    async fn unknown_pod_is_a_plain_pod() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path());
        let pod = store.get_pod("ns", "p").unwrap();
        assert_eq!(pod.workload(), crate::workload::Workload::Pod);
        assert_eq!(pod.pod_networks, None);
        assert!(store.get_vmi("ns", "vm").unwrap().is_none());
        assert!(!store.path().exists(), "reads must not create the file");
    }

    #[tokio::test]
    async fn set_and_remove_round_trip_through_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path());
        store
            .set_network_entry(
                "ns",
                "p",
                &WriteGuard::uid(Some("uid-1")),
                "ns/a",
                &entry(10),
            )
            .await
            .unwrap();
        store
            .set_network_entry("ns", "p", &WriteGuard::default(), "ns/b", &entry(11))
            .await
            .unwrap();
        // A second handle (another process, `xdhcp status`) sees the same data.
        let state = load_file(&dir.path().join(STORE_FILE)).unwrap();
        let rec = &state.pods["ns/p"];
        assert_eq!(rec.uid.as_deref(), Some("uid-1"));
        let ann = &rec.annotations[POD_NETWORKS_ANNOTATION];
        assert!(
            ann.contains("\"ns/a\"") && ann.contains("\"ns/b\""),
            "{ann}"
        );

        let pod = store.get_pod("ns", "p").unwrap();
        assert_eq!(pod.uid.as_deref(), Some("uid-1"));
        assert_eq!(pod.pod_networks.as_deref(), Some(ann.as_str()));

        store.remove_network_entry("ns", "p", "ns/a").await.unwrap();
        let state = store.load().unwrap();
        let ann = &state.pods["ns/p"].annotations[POD_NETWORKS_ANNOTATION];
        assert!(
            !ann.contains("\"ns/a\"") && ann.contains("\"ns/b\""),
            "{ann}"
        );
        // Idempotent DEL, unknown pods too.
        store.remove_network_entry("ns", "p", "ns/a").await.unwrap();
        store
            .remove_network_entry("ns", "gone", "ns/a")
            .await
            .unwrap();
        store.remove_network_entry("ns", "p", "ns/b").await.unwrap();
        assert!(store.load().unwrap().pods.is_empty());
        // No temporaries left behind: the document and its spare (the
        // previous version, rewritten next time) only.
        let mut names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [format!(".{STORE_FILE}.spare"), STORE_FILE.to_owned()]
        );
        // Rewrites swap the two files: no inode is allocated after the first.
        let inodes = |d: &Path| -> std::collections::BTreeSet<u64> {
            std::fs::read_dir(d)
                .unwrap()
                .map(|e| e.unwrap().metadata().unwrap().ino())
                .collect()
        };
        let before = inodes(dir.path());
        for i in 0..5 {
            store
                .set_network_entry("ns", "q", &WriteGuard::default(), "ns/a", &entry(20 + i))
                .await
                .unwrap();
        }
        assert_eq!(inodes(dir.path()), before);
        let ann = &store.load().unwrap().pods["ns/q"].annotations[POD_NETWORKS_ANNOTATION];
        assert!(ann.contains("192.0.2.24/24"), "{ann}");
    }

    #[tokio::test]
    async fn the_cached_document_follows_hand_edits_and_flush_is_a_group_commit() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path());
        assert!(!store.has_unsynced());
        store
            .set_network_entry(
                "ns",
                "p",
                &WriteGuard::uid(Some("uid-1")),
                "ns/a",
                &entry(10),
            )
            .await
            .unwrap();
        assert!(store.has_unsynced());
        // Served from the cache...
        assert_eq!(
            store.get_pod("ns", "p").unwrap().uid.as_deref(),
            Some("uid-1")
        );
        // ...until an operator edits the file by hand (labels, a VM owner).
        let mut state = load_file(store.path()).unwrap();
        state
            .pods
            .get_mut("ns/p")
            .unwrap()
            .labels
            .insert("kubevirt.io".into(), "virt-launcher".into());
        std::fs::write(store.path(), serde_json::to_vec(&state).unwrap()).unwrap();
        let pod = store.get_pod("ns", "p").unwrap();
        assert_eq!(pod.labels["kubevirt.io"], "virt-launcher");
        // The next write starts from the edited document, not the cache.
        store
            .set_network_entry("ns", "p", &WriteGuard::default(), "ns/b", &entry(11))
            .await
            .unwrap();
        let rec = &store.load().unwrap().pods["ns/p"];
        assert_eq!(rec.labels["kubevirt.io"], "virt-launcher");
        assert!(rec.annotations[POD_NETWORKS_ANNOTATION].contains("\"ns/a\""));
        // A file removed by hand is an empty store again.
        std::fs::remove_file(store.path()).unwrap();
        assert_eq!(store.get_pod("ns", "p").unwrap().uid, None);
        store.flush().unwrap();
        assert!(!store.has_unsynced());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_writers_share_writes_and_lose_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path());
        let tasks: Vec<_> = (0..60u8)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(async move {
                    store
                        .set_network_entry(
                            "ns",
                            &format!("p{i}"),
                            &WriteGuard::default(),
                            "ns/a",
                            &entry(i),
                        )
                        .await
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        // Every ADD's entry is in the file once its call returned.
        let state = load_file(store.path()).unwrap();
        assert_eq!(state.pods.len(), 60);
        for i in 0..60u8 {
            let ann = &state.pods[&format!("ns/p{i}")].annotations[POD_NETWORKS_ANNOTATION];
            assert!(ann.contains(&format!("192.0.2.{i}/24")), "{ann}");
        }
        // Removals interleaved with additions, then everything removed.
        let tasks: Vec<_> = (0..60u8)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(async move {
                    store
                        .remove_network_entry("ns", &format!("p{i}"), "ns/a")
                        .await
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        assert!(load_file(store.path()).unwrap().pods.is_empty());
    }

    #[tokio::test]
    async fn seeded_vm_pod_and_vmi() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(STORE_FILE),
            serde_json::to_vec(&serde_json::json!({
                "pods": {"t/virt-launcher-vm1-x": {"labels": {"kubevirt.io": "virt-launcher", "vm.kubevirt.io/name": "vm1"}}},
                "vmis": {"t/vm1": {"spec": {"networks": [{"name": "n", "multus": {"networkName": "t/net"}}],
                                   "domain": {"devices": {"interfaces": [{"name": "n", "macAddress": "02:00:00:00:20:08"}]}}}}}
            }))
            .unwrap(),
        )
        .unwrap();
        let store = EmbeddedStore::open(dir.path());
        let pod = store.get_pod("t", "virt-launcher-vm1-x").unwrap();
        let crate::workload::Workload::Vm { vmi_name } = pod.workload() else {
            panic!("seeded launcher pod must be a VM");
        };
        let vmi = store.get_vmi("t", &vmi_name).unwrap().unwrap();
        let m = vmi.interface_for_network("t/net").unwrap();
        assert_eq!(m.spec_mac.unwrap().to_string(), "02:00:00:00:20:08");
        // Removing the last entry keeps a seeded record.
        store
            .set_network_entry(
                "t",
                "virt-launcher-vm1-x",
                &WriteGuard::default(),
                "t/net",
                &entry(5),
            )
            .await
            .unwrap();
        store
            .remove_network_entry("t", "virt-launcher-vm1-x", "t/net")
            .await
            .unwrap();
        assert!(
            store
                .load()
                .unwrap()
                .pods
                .contains_key("t/virt-launcher-vm1-x")
        );
    }

    #[tokio::test]
    async fn a_pod_is_found_by_its_uid() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(STORE_FILE),
            serde_json::to_vec(&serde_json::json!({
                "pods": {
                    "t/plain": {"uid": "uid-plain"},
                    "t/virt-launcher-vm1-x": {"uid": "uid-vm1", "owner_vmi": "vm1"}
                }
            }))
            .unwrap(),
        )
        .unwrap();
        let store = EmbeddedStore::open(dir.path());
        let vm = store
            .pod_by_uid("uid-vm1")
            .expect("the launcher by its UID");
        assert_eq!(
            (
                vm.namespace.as_str(),
                vm.name.as_str(),
                vm.owner_vmi.as_deref()
            ),
            ("t", "virt-launcher-vm1-x", Some("vm1"))
        );
        assert_eq!(store.pod_by_uid("uid-plain").unwrap().name, "plain");
        assert!(store.pod_by_uid("uid-nobody").is_none());
        // A corrupt store knows no pod (and says so in the log).
        std::fs::write(dir.path().join(STORE_FILE), b"{not json").unwrap();
        assert!(store.pod_by_uid("uid-vm1").is_none());
    }

    /// The file is read (and parsed) once per version of it: a port's
    /// policy asks for its pod every second, and neither those calls nor
    /// the store's own writes read it again; a hand edit is read once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pod_by_uid_reads_the_file_only_when_it_changed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(STORE_FILE);
        let seed = |pods: serde_json::Value| {
            std::fs::write(
                &path,
                serde_json::to_vec(&serde_json::json!({ "pods": pods })).unwrap(),
            )
            .unwrap();
        };
        seed(serde_json::json!({"t/vm": {"uid": "uid-vm", "owner_vmi": "vm"}}));
        let store = EmbeddedStore::open(dir.path());
        let reads = || lock(&store.lock).reads;
        for _ in 0..50 {
            assert_eq!(store.pod_by_uid("uid-vm").unwrap().name, "vm");
        }
        assert_eq!(reads(), 1);
        // Callers racing each other (and a writer) share the cached copy.
        let racers: Vec<_> = (0..4)
            .map(|_| {
                let store = store.clone();
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        assert!(store.pod_by_uid("uid-vm").is_some());
                    }
                })
            })
            .collect();
        store
            .set_network_entry("t", "p", &WriteGuard::uid(Some("uid-p")), "t/a", &entry(7))
            .await
            .unwrap();
        for r in racers {
            r.join().unwrap();
        }
        // The store's own write is the cached document: not read back.
        assert_eq!(store.pod_by_uid("uid-p").unwrap().name, "p");
        assert_eq!(reads(), 1);
        // A hand edit is a new version: read once, then cached again.
        seed(serde_json::json!({"t/vm2": {"uid": "uid-vm", "owner_vmi": "vm2"}}));
        for _ in 0..10 {
            assert_eq!(store.pod_by_uid("uid-vm").unwrap().name, "vm2");
        }
        assert_eq!(reads(), 2);
    }

    #[tokio::test]
    async fn a_gone_sandbox_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path());
        let netns = dir.path().join("netns-cni-1");
        std::fs::write(&netns, b"").unwrap();
        let guard = WriteGuard {
            uid: Some("uid-1".into()),
            netns: Some(netns.clone()),
        };
        store
            .set_network_entry("ns", "p", &guard, "ns/a", &entry(10))
            .await
            .unwrap();
        std::fs::remove_file(&netns).unwrap();
        let err = store
            .set_network_entry("ns", "p", &guard, "ns/b", &entry(11))
            .await
            .unwrap_err();
        assert!(matches!(err, PodApiError::SandboxGone { .. }), "{err}");
        assert!(err.to_string().contains("ns/p"), "{err}");
        let ann = &store.load().unwrap().pods["ns/p"].annotations[POD_NETWORKS_ANNOTATION];
        assert!(
            ann.contains("\"ns/a\"") && !ann.contains("\"ns/b\""),
            "{ann}"
        );
    }

    #[tokio::test]
    async fn corrupt_store_is_an_error_and_left_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(STORE_FILE);
        std::fs::write(&path, b"{not json").unwrap();
        let store = EmbeddedStore::open(dir.path());
        let err = store
            .set_network_entry("ns", "p", &WriteGuard::default(), "ns/a", &entry(1))
            .await
            .unwrap_err();
        assert!(matches!(err, PodApiError::StoreCorrupt { .. }), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"{not json");
        // A corrupt annotation in a valid file is an error too, and kept.
        std::fs::write(
            &path,
            br#"{"pods":{"ns/p":{"annotations":{"k8s.ovn.org/pod-networks":"[1]"}}}}"#,
        )
        .unwrap();
        let err = store
            .set_network_entry("ns", "p", &WriteGuard::default(), "ns/a", &entry(1))
            .await
            .unwrap_err();
        assert!(matches!(err, PodApiError::Annotation { .. }), "{err}");
        assert!(std::fs::read_to_string(&path).unwrap().contains("[1]"));
    }
}
