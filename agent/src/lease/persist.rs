//! A lease's record in the lease store ([`crate::store`]: one JSON record
//! per lease under `<state_dir>/leases/`, durable atomic writes, corrupt
//! records quarantined): saved at every lease change, removed when the
//! attachment ends, loaded at start.

use std::path::Path;
use std::sync::Arc;

pub(crate) use crate::model::{Family, PodRef, WorkloadKind};
pub(crate) use crate::store::LeaseRecord;
use crate::store::{LeaseKey, LeaseStore, StoreError, Wait};

/// Whether an attachment's first lease has reached the disk. ADD answers
/// success only on [`Durable::Saved`]: a lease the agent could not record
/// would be lost by a restart, so such an ADD fails instead.
#[derive(Debug, Clone, Default)]
pub(crate) enum Durable {
    /// Not yet written.
    #[default]
    Pending,
    /// Written and `fsync`ed.
    Saved,
    /// The write failed (a full or read-only state directory, an I/O error).
    Failed(Arc<StoreError>),
}

/// Persist `rec` once it holds a lease or its first REQUEST's address
/// (nothing to resume before), returning as `wait` says.
pub(crate) fn save(store: &LeaseStore, rec: &LeaseRecord, wait: Wait) -> Result<(), StoreError> {
    if !rec.resumable() {
        return Ok(());
    }
    store.save_as(rec, wait)
}

/// Forget the record of an attachment's lease (absent is fine): its one
/// lease (`family` `None`), or on a dual-stack network its lease of
/// `family`.
pub(crate) fn remove(
    store: &LeaseStore,
    container_id: &str,
    ifname: &str,
    family: Option<Family>,
) -> Result<(), StoreError> {
    store
        .delete(&LeaseKey::new(container_id, ifname)?.of_family(family))
        .map(|_| ())
}

/// Forget every record of an attachment, whatever its network's family
/// (absent is fine).
pub(crate) fn remove_attachment(
    store: &LeaseStore,
    container_id: &str,
    ifname: &str,
) -> Result<(), StoreError> {
    for family in [None, Some(Family::Ipv4), Some(Family::Ipv6)] {
        remove(store, container_id, ifname, family)?;
    }
    Ok(())
}

/// A record that could not be used, and why.
#[derive(Debug)]
pub(crate) struct Unusable {
    pub(crate) what: String,
    pub(crate) reason: String,
}

/// Load every record; the store quarantines the ones it cannot read back.
pub(crate) fn load_all(
    store: &LeaseStore,
) -> Result<(Vec<LeaseRecord>, Vec<Unusable>), StoreError> {
    let report = store.load_all()?;
    let bad = report
        .quarantined
        .into_iter()
        .map(|q| Unusable {
            what: q.original.display().to_string(),
            reason: format!("{}: {}", q.reason.metric_label(), q.reason),
        })
        .collect();
    Ok((report.records, bad))
}

/// Where the store lives under the state dir.
pub(crate) fn open(state_dir: &Path) -> Result<LeaseStore, StoreError> {
    LeaseStore::open(state_dir)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::store::RECORD_VERSION;
    use std::collections::BTreeMap;
    use std::time::Duration;
    use xdhcp_engine::Lease;

    /// A VM's record on an IPv4 network with `"apply": true`.
    pub(crate) fn record(id: &str, lease: Option<Lease>) -> LeaseRecord {
        LeaseRecord {
            version: RECORD_VERSION,
            updated_unix_ms: 0,
            container_id: id.into(),
            ifname: "eth0".into(),
            netns: Some("/run/netns/x".into()),
            network: (&crate::cni::config::parse(
                br#"{"cniVersion":"1.0.0","name":"n","ipam":{"type":"xdhcp","apply":true}}"#,
            )
            .unwrap())
                .into(),
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
            uplink: None,
            requested: None,
            requested_from: None,
            planned_xids: None,
            lease6: None,
            router6: None,
            lease_family: None,
        }
    }

    /// A lease of 192.0.2.10/24 from 192.0.2.1 (the other layers' unit
    /// tests start from it too).
    pub(crate) fn lease() -> Lease {
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
        save(&store, &record("c0", None), Wait::Durable).unwrap();
        let rec = record("c1", Some(lease()));
        save(&store, &rec, Wait::Durable).unwrap();
        let (ok, bad) = load_all(&store).unwrap();
        assert!(bad.is_empty());
        assert_eq!(ok.len(), 1);
        let want = LeaseRecord {
            updated_unix_ms: ok[0].updated_unix_ms,
            ..rec
        };
        assert_eq!(ok, vec![want]);
        remove(&store, "c1", "eth0", None).unwrap();
        remove(&store, "c1", "eth0", None).unwrap();
        assert!(load_all(&store).unwrap().0.is_empty());
        assert!(remove(&store, "../x", "eth0", None).is_err());
    }
}
