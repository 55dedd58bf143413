//! What the daemon persists per attachment, and where.
//!
//! One JSON record per attachment under `<state_dir>/leases/<key>.json`,
//! `key = <container_id>.<ifname>` (both validated, so the name cannot
//! escape the directory); writes are atomic (temp file, fsync, rename, fsync
//! of the directory); [`load_all`] moves records it cannot read to
//! `<state_dir>/quarantine/` and carries on (SPEC R6).

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use xdhcp_engine::Lease;

use crate::cni::config::NetworkConfig;
use crate::cni::env::{validate_container_id, validate_ifname};

/// Record format version.
pub const RECORD_VERSION: u32 = 1;

/// Pod or VM, as decided at ADD.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum WorkloadKind {
    /// Plain pod: the lease is maintained until DEL.
    Pod,
    /// `KubeVirt` VM: one-shot discovery, never configured, no RELEASE.
    Vm { vmi: String },
}

/// The pod an attachment belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
}

/// Everything needed to resume an attachment after a restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseRecord {
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
    /// The store key (`<container>.<ifname>`), validated.
    pub fn key(&self) -> io::Result<String> {
        key(&self.container_id, &self.ifname)
    }
}

/// File stem for an attachment; refuses anything that is not a valid
/// container id or interface name.
pub fn key(container_id: &str, ifname: &str) -> io::Result<String> {
    validate_container_id(container_id).map_err(io::Error::other)?;
    validate_ifname(ifname).map_err(io::Error::other)?;
    Ok(format!("{container_id}.{ifname}"))
}

/// The lease directory under the state dir.
pub fn lease_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("leases")
}

/// Write `rec` atomically.
pub fn save(state_dir: &Path, rec: &LeaseRecord) -> io::Result<()> {
    let dir = lease_dir(state_dir);
    fs::create_dir_all(&dir)?;
    let name = rec.key()?;
    let path = dir.join(format!("{name}.json"));
    let tmp = dir.join(format!(".{name}.json.tmp"));
    let bytes = serde_json::to_vec_pretty(rec).map_err(io::Error::other)?;
    {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
    }
    fs::rename(&tmp, &path)?;
    fs::File::open(&dir)?.sync_all()
}

/// Remove an attachment's record (absent is fine).
pub fn remove(state_dir: &Path, container_id: &str, ifname: &str) -> io::Result<()> {
    let dir = lease_dir(state_dir);
    let path = dir.join(format!("{}.json", key(container_id, ifname)?));
    match fs::remove_file(&path) {
        Ok(()) => fs::File::open(&dir)?.sync_all(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// A record that could not be read, moved aside.
#[derive(Debug)]
pub struct Quarantined {
    pub from: PathBuf,
    pub to: PathBuf,
    pub reason: String,
}

/// Load every record; unreadable ones are moved to `quarantine/`.
pub fn load_all(state_dir: &Path) -> io::Result<(Vec<LeaseRecord>, Vec<Quarantined>)> {
    let dir = lease_dir(state_dir);
    let entries = match fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((Vec::new(), Vec::new())),
        Err(e) => return Err(e),
    };
    let mut ok = Vec::new();
    let mut bad = Vec::new();
    for entry in entries {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let is_json = Path::new(name)
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("json"));
        if name.starts_with('.') || !is_json {
            continue;
        }
        let parsed = fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice::<LeaseRecord>(&b).map_err(|e| e.to_string()))
            .and_then(|r| {
                let k = r.key().map_err(|e| e.to_string())?;
                if format!("{k}.json") == name {
                    Ok(r)
                } else {
                    Err(format!("record for {k} stored as {name}"))
                }
            });
        match parsed {
            Ok(r) => ok.push(r),
            Err(reason) => {
                let qdir = state_dir.join("quarantine");
                fs::create_dir_all(&qdir)?;
                let to = qdir.join(name);
                fs::rename(&path, &to)?;
                bad.push(Quarantined {
                    from: path,
                    to,
                    reason,
                });
            }
        }
    }
    Ok((ok, bad))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str) -> LeaseRecord {
        LeaseRecord {
            version: RECORD_VERSION,
            container_id: id.into(),
            ifname: "eth0".into(),
            netns: Some("/run/netns/x".into()),
            config: crate::cni::config::parse(
                br#"{"cniVersion":"1.0.0","name":"n","ipam":{"type":"xdhcp"}}"#,
            )
            .unwrap(),
            args: BTreeMap::new(),
            pod: None,
            workload: WorkloadKind::Pod,
            mac: [2, 0, 0, 0, 0, 1],
            annotation_key: None,
            lease: None,
        }
    }

    #[test]
    fn save_load_remove_and_quarantine() {
        let dir = tempfile::tempdir().unwrap();
        save(dir.path(), &record("c1")).unwrap();
        save(dir.path(), &record("c2")).unwrap();
        fs::write(lease_dir(dir.path()).join("junk.eth0.json"), b"{not json").unwrap();
        let (ok, bad) = load_all(dir.path()).unwrap();
        assert_eq!(ok.len(), 2);
        assert_eq!(bad.len(), 1);
        assert!(dir.path().join("quarantine/junk.eth0.json").exists());
        remove(dir.path(), "c1", "eth0").unwrap();
        remove(dir.path(), "c1", "eth0").unwrap();
        let (ok, bad) = load_all(dir.path()).unwrap();
        assert_eq!((ok.len(), bad.len()), (1, 0));
        assert!(key("../x", "eth0").is_err());
        assert!(key("c", "a/b").is_err());
    }
}
