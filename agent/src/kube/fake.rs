//! An in-memory [`PodStore`] for unit tests: pods by `ns/name` with their
//! UID and `pod-networks` entries, guarded writes checked against the UID
//! and recorded, and reads that can be made to never answer (a hung API
//! server). Not a cluster.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::{
    MigrationInfo, PodApiError, PodFuture, PodInfo, PodNetworkEntry, PodStore, VmiInfo, WriteGuard,
};

/// A fake pod: its UID and its `pod-networks` entries by network key.
type FakePod = (Option<String>, BTreeMap<String, PodNetworkEntry>);

/// Which reads never answer.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Hung {
    pub(crate) pods: bool,
    pub(crate) vmis: bool,
    pub(crate) migrations: bool,
}

/// An in-memory [`PodStore`].
#[derive(Debug, Default)]
pub(crate) struct FakePods {
    pods: Mutex<BTreeMap<String, FakePod>>,
    /// The guard of every write, in order, with its pod (`ns/name`).
    guards: Mutex<Vec<(String, WriteGuard)>>,
    /// The node of each pod (`ns/name`) that has one.
    nodes: Mutex<BTreeMap<String, String>>,
    hung: Hung,
}

impl FakePods {
    /// A store whose reads of `hung` never answer.
    pub(crate) fn hung(hung: Hung) -> Self {
        Self {
            hung,
            ..Self::default()
        }
    }

    /// A store holding pod `ns/name` with UID `uid` and no entries.
    pub(crate) fn with_pod(ns: &str, name: &str, uid: &str) -> Self {
        let fake = FakePods::default();
        fake.pods.lock().unwrap().insert(
            format!("{ns}/{name}"),
            (Some(uid.to_owned()), BTreeMap::new()),
        );
        fake
    }

    /// [`FakePods::with_pod`], the pod scheduled to node `node`.
    pub(crate) fn with_pod_on(ns: &str, name: &str, uid: &str, node: &str) -> Self {
        let fake = Self::with_pod(ns, name, uid);
        fake.nodes
            .lock()
            .unwrap()
            .insert(format!("{ns}/{name}"), node.to_owned());
        fake
    }

    /// The network keys of pod `ns/name`'s entries.
    pub(crate) fn entries(&self, ns: &str, name: &str) -> Vec<String> {
        self.pods.lock().unwrap()[&format!("{ns}/{name}")]
            .1
            .keys()
            .cloned()
            .collect()
    }

    /// Pod `ns/name`'s entry for network `key`.
    pub(crate) fn entry(&self, ns: &str, name: &str, key: &str) -> Option<PodNetworkEntry> {
        self.pods
            .lock()
            .unwrap()
            .get(&format!("{ns}/{name}"))?
            .1
            .get(key)
            .cloned()
    }

    /// The guard of every write so far, with its pod (`ns/name`).
    pub(crate) fn guards(&self) -> Vec<(String, WriteGuard)> {
        self.guards.lock().unwrap().clone()
    }
}

impl PodStore for FakePods {
    fn get_pod<'a>(&'a self, ns: &'a str, name: &'a str) -> PodFuture<'a, PodInfo> {
        if self.hung.pods {
            return Box::pin(std::future::pending());
        }
        let uid = self
            .pods
            .lock()
            .unwrap()
            .get(&format!("{ns}/{name}"))
            .and_then(|p| p.0.clone());
        let node_name = self
            .nodes
            .lock()
            .unwrap()
            .get(&format!("{ns}/{name}"))
            .cloned();
        Box::pin(async move {
            Ok(PodInfo {
                namespace: ns.to_owned(),
                name: name.to_owned(),
                uid,
                node_name,
                ..PodInfo::default()
            })
        })
    }
    fn get_vmi<'a>(&'a self, _: &'a str, _: &'a str) -> PodFuture<'a, Option<VmiInfo>> {
        if self.hung.vmis {
            return Box::pin(std::future::pending());
        }
        Box::pin(async { Ok(None) })
    }
    fn get_migration<'a>(&'a self, _: &'a str, _: &'a str) -> PodFuture<'a, Option<MigrationInfo>> {
        if self.hung.migrations {
            return Box::pin(std::future::pending());
        }
        Box::pin(async { Ok(None) })
    }
    fn set_network_entry_guarded<'a>(
        &'a self,
        ns: &'a str,
        name: &'a str,
        guard: &'a WriteGuard,
        key: &'a str,
        entry: PodNetworkEntry,
    ) -> PodFuture<'a, ()> {
        let at = format!("{ns}/{name}");
        self.guards
            .lock()
            .unwrap()
            .push((at.clone(), guard.clone()));
        let mut pods = self.pods.lock().unwrap();
        let pod = pods.entry(at).or_default();
        let result = match &guard.uid {
            Some(expected) if pod.0.as_ref() != Some(expected) => Err(PodApiError::UidMismatch {
                namespace: ns.to_owned(),
                name: name.to_owned(),
                expected: expected.clone(),
                actual: pod.0.clone(),
            }),
            _ => {
                pod.1.insert(key.to_owned(), entry);
                Ok(())
            }
        };
        Box::pin(async move { result })
    }
    fn remove_network_entry_for_uid<'a>(
        &'a self,
        ns: &'a str,
        name: &'a str,
        uid: Option<&'a str>,
        key: &'a str,
    ) -> PodFuture<'a, ()> {
        if let Some(pod) = self.pods.lock().unwrap().get_mut(&format!("{ns}/{name}"))
            && uid.is_none_or(|u| pod.0.as_deref() == Some(u))
        {
            pod.1.remove(key);
        }
        Box::pin(async { Ok(()) })
    }
}
