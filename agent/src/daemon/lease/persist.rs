//! What the daemon persists per attachment, through the lease store
//! ([`crate::store`]: one JSON record per lease under
//! `<state_dir>/leases/`, atomic writes, corrupt records quarantined).
//!
//! The daemon's view ([`LeaseRecord`]) carries the validated network
//! configuration and `CNI_ARGS`; they travel in the store's
//! `attachment.cni_config` so a restarted agent rebuilds the same client.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use xdhcp_engine::Lease;

use crate::cni::config::NetworkConfig;
use crate::store::{self, AttachmentMode, LeaseKey, LeaseStore, StoreError};

/// Record format version of the daemon's view.
pub(crate) const RECORD_VERSION: u32 = 1;

/// Pod or VM, as decided at ADD.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub(crate) enum WorkloadKind {
    /// Plain pod: the lease is maintained until DEL.
    Pod,
    /// `KubeVirt` VM: one-shot discovery, never configured, no RELEASE.
    Vm { vmi: String },
}

/// The pod an attachment belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
}

/// Everything needed to resume an attachment after a restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct LeaseRecord {
    pub version: u32,
    pub container_id: String,
    pub ifname: String,
    pub netns: Option<PathBuf>,
    pub config: NetworkConfig,
    pub args: BTreeMap<String, String>,
    pub pod: Option<PodRef>,
    pub workload: WorkloadKind,
    /// The MAC the client uses (the interface's, or the VM's).
    pub mac: [u8; 6],
    /// `k8s.ovn.org/pod-networks` key written at ADD, if any.
    pub annotation_key: Option<String>,
    /// The lease as last bound/renewed.
    pub lease: Option<Lease>,
}

impl LeaseRecord {
    /// The record of an attachment an ADD starts, before its first lease.
    pub(crate) fn fresh(
        req: &crate::rpc::CniRequest,
        pod: Option<PodRef>,
        workload: WorkloadKind,
        mac: [u8; 6],
        annotation_key: Option<String>,
    ) -> Self {
        Self {
            version: RECORD_VERSION,
            container_id: req.container_id.clone(),
            ifname: req.ifname.clone(),
            netns: req.netns.clone(),
            config: req.config.clone(),
            args: req.args.clone(),
            pod,
            workload,
            mac,
            annotation_key,
            lease: None,
        }
    }
}

/// What the daemon keeps in the store's free-form `cni_config`.
#[derive(Debug, Serialize, Deserialize)]
struct Extra {
    config: NetworkConfig,
    args: BTreeMap<String, String>,
}

impl LeaseRecord {
    fn to_store(&self) -> Result<Option<store::LeaseRecord>, StoreError> {
        let Some(lease) = self.lease.clone() else {
            return Ok(None);
        };
        let key = LeaseKey::new(&self.container_id, &self.ifname)?;
        let extra = serde_json::to_value(Extra {
            config: self.config.clone(),
            args: self.args.clone(),
        })
        .unwrap_or_default();
        let attachment = store::Attachment {
            netns: self.netns.clone().unwrap_or_default(),
            mac: self.mac,
            pod_namespace: self.pod.as_ref().map(|p| p.namespace.clone()),
            pod_name: self.pod.as_ref().map(|p| p.name.clone()),
            pod_uid: self.pod.as_ref().and_then(|p| p.uid.clone()),
            network_key: self.annotation_key.clone(),
            mode: match &self.workload {
                WorkloadKind::Pod => AttachmentMode::Pod,
                WorkloadKind::Vm { vmi } => AttachmentMode::Vm {
                    vmi_name: vmi.clone(),
                },
            },
            apply: self.config.ipam.apply,
            cni_config: extra,
        };
        Ok(Some(store::LeaseRecord::new(key, attachment, lease)))
    }

    fn from_store(r: store::LeaseRecord) -> Result<Self, String> {
        let extra: Extra = serde_json::from_value(r.attachment.cni_config)
            .map_err(|e| format!("attachment.cni_config: {e}"))?;
        let pod = match (r.attachment.pod_namespace, r.attachment.pod_name) {
            (Some(namespace), Some(name)) => Some(PodRef {
                namespace,
                name,
                uid: r.attachment.pod_uid,
            }),
            _ => None,
        };
        Ok(Self {
            version: RECORD_VERSION,
            container_id: r.key.container_id().to_owned(),
            ifname: r.key.ifname().to_owned(),
            netns: (!r.attachment.netns.as_os_str().is_empty()).then_some(r.attachment.netns),
            config: extra.config,
            args: extra.args,
            pod,
            workload: match r.attachment.mode {
                AttachmentMode::Pod => WorkloadKind::Pod,
                AttachmentMode::Vm { vmi_name } => WorkloadKind::Vm { vmi: vmi_name },
            },
            mac: r.attachment.mac,
            annotation_key: r.attachment.network_key,
            lease: Some(r.lease),
        })
    }
}

/// Persist `rec` (only once it holds a lease: nothing to resume before).
pub(crate) fn save(store: &LeaseStore, rec: &LeaseRecord) -> Result<(), StoreError> {
    match rec.to_store()? {
        Some(r) => store.save(&r),
        None => Ok(()),
    }
}

/// Forget an attachment's record (absent is fine).
pub(crate) fn remove(
    store: &LeaseStore,
    container_id: &str,
    ifname: &str,
) -> Result<(), StoreError> {
    store
        .delete(&LeaseKey::new(container_id, ifname)?)
        .map(|_| ())
}

/// A record that could not be used, and why.
#[derive(Debug)]
pub(crate) struct Unusable {
    pub what: String,
    pub reason: String,
}

/// Load every record; the store quarantines corrupt files, records whose
/// daemon view cannot be rebuilt are reported (and deleted).
pub(crate) fn load_all(
    store: &LeaseStore,
) -> Result<(Vec<LeaseRecord>, Vec<Unusable>), StoreError> {
    let report = store.load_all()?;
    let mut bad: Vec<Unusable> = report
        .quarantined
        .into_iter()
        .map(|q| Unusable {
            what: q.original.display().to_string(),
            reason: format!("{}: {}", q.reason.metric_label(), q.reason),
        })
        .collect();
    let mut ok = Vec::with_capacity(report.records.len());
    for r in report.records {
        let key = r.key.clone();
        match LeaseRecord::from_store(r) {
            Ok(rec) => ok.push(rec),
            Err(reason) => {
                let _ = store.delete(&key);
                bad.push(Unusable {
                    what: key.to_string(),
                    reason,
                });
            }
        }
    }
    Ok((ok, bad))
}

/// Where the store lives under the state dir.
pub(crate) fn open(state_dir: &Path) -> Result<LeaseStore, StoreError> {
    LeaseStore::open(state_dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn record(id: &str, lease: Option<Lease>) -> LeaseRecord {
        LeaseRecord {
            version: RECORD_VERSION,
            container_id: id.into(),
            ifname: "eth0".into(),
            netns: Some("/run/netns/x".into()),
            config: crate::cni::config::parse(
                br#"{"cniVersion":"1.0.0","name":"n","ipam":{"type":"xdhcp","apply":true}}"#,
            )
            .unwrap(),
            args: BTreeMap::from([("K8S_POD_NAME".to_owned(), "web".to_owned())]),
            pod: Some(PodRef {
                namespace: "default".into(),
                name: "web".into(),
                uid: None,
            }),
            workload: WorkloadKind::Vm { vmi: "vm1".into() },
            mac: [2, 0, 0, 0, 0, 1],
            annotation_key: Some("default/n".into()),
            lease,
        }
    }

    fn lease() -> Lease {
        Lease {
            address: "192.0.2.10".parse().unwrap(),
            prefix_len: 24,
            server_id: "192.0.2.1".parse().unwrap(),
            server_mac: None,
            routers: vec![],
            routes: vec![],
            dns_servers: vec![],
            domain_name: None,
            search: vec![],
            mtu: None,
            lease_time: Duration::from_mins(2),
            t1: Duration::from_mins(1),
            t2: Duration::from_secs(105),
            acquired_unix_ms: 1,
            rejected_routes: vec![],
        }
    }

    #[test]
    fn round_trip_through_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path()).unwrap();
        // Nothing to persist before a lease exists.
        save(&store, &record("c0", None)).unwrap();
        let rec = record("c1", Some(lease()));
        save(&store, &rec).unwrap();
        let (ok, bad) = load_all(&store).unwrap();
        assert!(bad.is_empty());
        assert_eq!(ok, vec![rec]);
        remove(&store, "c1", "eth0").unwrap();
        remove(&store, "c1", "eth0").unwrap();
        assert!(load_all(&store).unwrap().0.is_empty());
        assert!(remove(&store, "../x", "eth0").is_err());
    }
}
