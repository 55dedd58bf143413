//! The binding table: which MAC holds which address behind which workload
//! port, until when, and how the agent knows — it leased the address
//! itself, or it learned it by watching the guest's own DHCP or DHCPv6 on
//! a VM's port.
//!
//! [`learner::Learner`] says which observed DHCP messages a real exchange
//! on the port proves, and what they change, [`learner6::Learner6`] the
//! same for DHCPv6 (sans-IO); [`LearnedStore`] keeps the learned bindings
//! (one IPv4 and one IPv6 binding per MAC) in memory and in one file, replaced durably
//! (temporary file, `fsync`, rename, directory `fsync`) by its owner off the
//! async runtime ([`LearnedStore::take_snapshot`], [`Snapshot::write`]), so
//! they survive agent restarts; a file that does not parse is set aside in
//! the quarantine directory, never trusted.

pub mod learner;
pub mod learner6;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::sys::fs::{AtomicWrite, Temp, WriteStep};

/// `GET` path of the binding table on the agent socket.
pub const PATH_BINDINGS: &str = "/v1/bindings";

/// How the agent knows a binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BindingSource {
    /// xdhcp leased the address itself (a pod's lease, a VM's one-shot).
    Leased,
    /// Learned from the guest's own DHCP or DHCPv6 exchange on a VM's port.
    Learned,
    /// An IPv6 address the guest configured itself (SLAAC, static), learned
    /// from its duplicate address detection on a VM's port.
    Dad,
}

impl BindingSource {
    /// Stable label (metrics, table).
    pub const fn label(self) -> &'static str {
        match self {
            Self::Leased => "leased",
            Self::Learned => "learned",
            Self::Dad => "dad",
        }
    }
}

/// One row of `xdhcp bindings`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Binding {
    /// `aa:bb:cc:dd:ee:ff`.
    pub mac: String,
    /// IPv4 or IPv6.
    pub ip: IpAddr,
    /// Host end of the workload port, when the guard knows it.
    pub port: Option<String>,
    /// `<namespace>/<name>` of the pod, when known.
    pub pod: Option<String>,
    /// Expiry, wall clock, milliseconds since the epoch (`None`: infinite).
    pub expires_unix_ms: Option<u64>,
    pub source: BindingSource,
    /// A learned binding whose ACK (or REPLY) moved the `pod-networks`
    /// entry: the address of its family the entry reported before, put
    /// back if the guest declines this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaced: Option<IpAddr>,
}

impl Binding {
    /// The address when it is IPv4 (every learned binding's).
    pub fn ipv4(&self) -> Option<Ipv4Addr> {
        match self.ip {
            IpAddr::V4(a) => Some(a),
            IpAddr::V6(_) => None,
        }
    }
}

/// One row of `xdhcp bindings` as the agent serves it: the binding, and
/// where its port's identity came from (`ovs`: the Open vSwitch database,
/// `cni`: an ADD, `both`), when the guard is on the port. A client that
/// reads a [`Binding`] ignores the extra field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BindingRow {
    #[serde(flatten)]
    pub binding: Binding,
    /// `ipv4` or `ipv6`, the address's.
    #[serde(default)]
    pub family: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
}

/// What one observed message means for the port's binding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Learned {
    /// The server acknowledged `ip` for the port's MAC.
    Bound {
        ip: Ipv4Addr,
        prefix_len: Option<u8>,
        router: Option<Ipv4Addr>,
        /// Lease time in seconds (`None`: infinite).
        lease_secs: Option<u32>,
    },
    /// The guest gave `ip` back (RELEASE).
    Released { ip: Ipv4Addr },
    /// The guest refused `ip` after the server acknowledged it (DECLINE:
    /// its probe found the address in use): it never held it.
    Declined { ip: Ipv4Addr },
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn format_mac(mac: [u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Errors of the learned-binding store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The blocking task writing the file did not finish.
    #[error("the task writing the learned bindings failed: {0}")]
    Task(String),
}

/// What a change to the table needs on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Change {
    /// Nothing changed.
    None,
    /// Only an expiry moved (a renewal): written with the next batch.
    Expiry,
    /// A binding came, went, or changed address: written soon.
    Durable,
}

/// The learned bindings, one per MAC and family, in memory; the owner
/// writes them to one file ([`LearnedStore::take_snapshot`]): a list of
/// [`Binding`]s, each row's family its address's, so a file written before
/// IPv6 bindings were learned loads as it was.
#[derive(Debug)]
pub struct LearnedStore {
    path: PathBuf,
    /// By [`row_key`].
    rows: BTreeMap<String, Binding>,
    /// The most a change since the last snapshot needs.
    dirty: Change,
}

/// The table's bytes, to be written to its file (blocking IO: off the
/// async runtime).
#[derive(Debug)]
pub struct Snapshot {
    path: PathBuf,
    bytes: Vec<u8>,
    /// The most a change it holds needed.
    pub change: Change,
}

impl Snapshot {
    /// Replaces the file durably (temporary file, `fsync`, rename,
    /// directory `fsync`).
    pub fn write(&self) -> Result<(), StoreError> {
        let io = |op, source| StoreError::Io {
            op,
            path: self.path.clone(),
            source,
        };
        let tmp = self.path.with_extension("tmp");
        let options = AtomicWrite {
            create: Temp::Reuse,
            ..AtomicWrite::durable(&tmp)
        };
        crate::sys::fs::atomic_replace(&self.path, &self.bytes, &options).map_err(|e| {
            let op = match e.step {
                WriteStep::Write => "write",
                WriteStep::SyncFile => "fsync",
                WriteStep::Install => "rename",
                WriteStep::SyncDir => "fsync the directory of",
            };
            io(op, e.source)
        })
    }
}

impl LearnedStore {
    /// File name in the state directory.
    pub const FILE: &'static str = "learned-bindings.json";

    /// Opens (or starts) the store in `state_dir`. An unreadable or
    /// unparsable file is moved to the state directory's quarantine
    /// (`quarantine/learned-bindings.json.<unix ms>`, pruned with the
    /// lease store's) and the store starts empty; the second value says so.
    pub fn open(state_dir: &Path) -> Result<(Self, Option<String>), StoreError> {
        let path = state_dir.join(Self::FILE);
        let mut quarantined = None;
        let rows = match std::fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice::<Vec<Binding>>(&bytes) {
                Ok(v) => v.into_iter().map(|b| (row_key(&b), b)).collect(),
                Err(e) => {
                    let dir = crate::store::quarantine_dir(state_dir);
                    let aside = dir.join(format!("{}.{}", Self::FILE, now_ms()));
                    let set_aside = |source| StoreError::Io {
                        op: "set aside",
                        path: path.clone(),
                        source,
                    };
                    std::os::unix::fs::DirBuilderExt::mode(
                        std::fs::DirBuilder::new().recursive(true),
                        0o700,
                    )
                    .create(&dir)
                    .map_err(set_aside)?;
                    std::fs::rename(&path, &aside).map_err(set_aside)?;
                    crate::store::prune_quarantine(&dir, now_ms());
                    quarantined = Some(format!("{}: {e}", aside.display()));
                    BTreeMap::new()
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(source) => {
                return Err(StoreError::Io {
                    op: "read",
                    path,
                    source,
                });
            }
        };
        Ok((
            Self {
                path,
                rows,
                dirty: Change::None,
            },
            quarantined,
        ))
    }

    /// Every learned binding not expired at `now_ms`.
    pub fn rows(&self, now_ms: u64) -> Vec<Binding> {
        self.rows
            .values()
            .filter(|b| b.expires_unix_ms.is_none_or(|e| e > now_ms))
            .cloned()
            .collect()
    }

    /// The learned IPv4 binding of `mac`, if any (expired or not).
    pub fn get(&self, mac: &str) -> Option<&Binding> {
        self.rows.get(mac)
    }

    /// The learned IPv6 binding of `mac`, if any (expired or not).
    pub fn get6(&self, mac: &str) -> Option<&Binding> {
        self.rows.get(&key6(mac))
    }

    fn mark(&mut self, change: Change) -> Change {
        self.dirty = self.dirty.max(change);
        change
    }

    /// Records `b` (replacing the MAC's previous binding of its family);
    /// what the change needs on disk.
    pub fn upsert(&mut self, b: Binding) -> Change {
        let key = row_key(&b);
        let change = match self.rows.get(&key) {
            Some(old) if *old == b => Change::None,
            Some(old)
                if Binding {
                    expires_unix_ms: b.expires_unix_ms,
                    ..old.clone()
                } == b =>
            {
                Change::Expiry
            }
            _ => Change::Durable,
        };
        if change != Change::None {
            self.rows.insert(key, b);
        }
        self.mark(change)
    }

    /// Forgets `mac`'s IPv4 binding when it is for `ip` (`None`: whatever
    /// it is). Returns whether one was removed.
    pub fn remove(&mut self, mac: &str, ip: Option<Ipv4Addr>) -> bool {
        self.take(mac, ip).is_some()
    }

    /// Like [`Self::remove`], returning the binding removed.
    pub fn take(&mut self, mac: &str, ip: Option<Ipv4Addr>) -> Option<Binding> {
        self.take_key(mac, ip.map(IpAddr::from))
    }

    /// Forgets `mac`'s IPv6 binding when it is for `ip` (`None`: whatever
    /// it is); returns it.
    pub fn take6(&mut self, mac: &str, ip: Option<Ipv6Addr>) -> Option<Binding> {
        self.take_key(&key6(mac), ip.map(IpAddr::from))
    }

    /// The IPv6 addresses `mac`'s guest configured itself (expired or
    /// not: they have no expiry).
    pub fn configured(&self, mac: &str) -> Vec<Ipv6Addr> {
        let from = format!("{mac}/dad/");
        self.rows
            .range(from.clone()..)
            .take_while(|(k, _)| k.starts_with(&from))
            .filter_map(|(_, b)| match b.ip {
                IpAddr::V6(a) => Some(a),
                IpAddr::V4(_) => None,
            })
            .collect()
    }

    /// Forgets the row `b` is (its MAC and family), whatever its address.
    pub fn remove_row(&mut self, b: &Binding) -> bool {
        self.take_key(&row_key(b), None).is_some()
    }

    fn take_key(&mut self, key: &str, ip: Option<IpAddr>) -> Option<Binding> {
        match self.rows.get(key) {
            Some(b) if ip.is_none_or(|ip| b.ip == ip) => {
                let gone = self.rows.remove(key);
                self.mark(Change::Durable);
                gone
            }
            _ => None,
        }
    }

    /// Drops the bindings expired at `now_ms`; returns them.
    pub fn expire(&mut self, now_ms: u64) -> Vec<Binding> {
        let gone: Vec<Binding> = self
            .rows
            .values()
            .filter(|b| b.expires_unix_ms.is_some_and(|e| e <= now_ms))
            .cloned()
            .collect();
        if !gone.is_empty() {
            for b in &gone {
                self.rows.remove(&row_key(b));
            }
            self.mark(Change::Durable);
        }
        gone
    }

    /// What the changes since the last snapshot need on disk.
    pub fn dirty(&self) -> Change {
        self.dirty
    }

    /// The table to write, when it changed since the last snapshot (the
    /// mark is cleared: a failed write must [`Self::mark_unwritten`]).
    pub fn take_snapshot(&mut self) -> Result<Option<Snapshot>, StoreError> {
        if self.dirty == Change::None {
            return Ok(None);
        }
        let rows: Vec<&Binding> = self.rows.values().collect();
        let bytes = serde_json::to_vec_pretty(&rows).map_err(|e| StoreError::Io {
            op: "encode",
            path: self.path.clone(),
            source: e.into(),
        })?;
        let change = std::mem::replace(&mut self.dirty, Change::None);
        Ok(Some(Snapshot {
            path: self.path.clone(),
            bytes,
            change,
        }))
    }

    /// A snapshot's write failed: its changes are still to be written.
    pub fn mark_unwritten(&mut self, change: Change) {
        self.mark(change);
    }

    /// Writes the table now if it changed (blocking: tests and shutdown).
    pub fn flush(&mut self) -> Result<(), StoreError> {
        if let Some(s) = self.take_snapshot()? {
            s.write().inspect_err(|_| self.mark_unwritten(s.change))?;
        }
        Ok(())
    }
}

/// The store's key of an IPv6 binding of `mac` (an IPv4 one's is the MAC,
/// as it always was).
fn key6(mac: &str) -> String {
    format!("{mac}/ipv6")
}

/// The store's key of `b`: its MAC, and its family; for an address the
/// guest configured itself, the address too (a MAC may hold several).
fn row_key(b: &Binding) -> String {
    match (b.ip, b.source) {
        (IpAddr::V6(ip), BindingSource::Dad) => format!("{}/dad/{ip}", b.mac),
        (IpAddr::V4(_), _) => b.mac.clone(),
        (IpAddr::V6(_), _) => key6(&b.mac),
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The table as `xdhcp bindings` prints it.
pub fn render(rows: &[BindingRow], now_ms: u64) -> String {
    use std::fmt::Write as _;
    let width = rows
        .iter()
        .map(|r| r.binding.ip.to_string().len())
        .max()
        .unwrap_or(0)
        .max(15);
    let mut s = format!(
        "{:<17}  {:<6}  {:<width$}  {:<15}  {:<8}  {:<30}  {:<10}  {:>10}\n",
        "MAC", "FAMILY", "IP", "PORT", "IDENTITY", "POD", "SOURCE", "EXPIRES IN"
    );
    for row in rows {
        let b = &row.binding;
        let expires = b.expires_unix_ms.map_or_else(
            || "never".to_owned(),
            |e| format!("{}s", e.saturating_sub(now_ms) / 1000),
        );
        let family = if row.family.is_empty() {
            family_of(b.ip)
        } else {
            row.family.as_str()
        };
        let _ = writeln!(
            s,
            "{:<17}  {:<6}  {:<width$}  {:<15}  {:<8}  {:<30}  {:<10}  {:>10}",
            b.mac,
            family,
            b.ip.to_string(),
            b.port.as_deref().unwrap_or("-"),
            row.identity.as_deref().unwrap_or("-"),
            b.pod.as_deref().unwrap_or("-"),
            b.source.label(),
            expires
        );
    }
    s
}

/// `ipv4` or `ipv6`: the family of `ip`.
pub fn family_of(ip: IpAddr) -> &'static str {
    if ip.is_ipv4() { "ipv4" } else { "ipv6" }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(mac: &str, ip: [u8; 4], expires: Option<u64>) -> Binding {
        Binding {
            mac: mac.to_owned(),
            ip: Ipv4Addr::from(ip).into(),
            port: Some("veth1".to_owned()),
            pod: Some("default/vm1".to_owned()),
            expires_unix_ms: expires,
            source: BindingSource::Learned,
            replaced: None,
        }
    }

    #[test]
    fn learned_bindings_survive_a_reopen_and_expire() {
        let dir = tempfile::tempdir().unwrap();
        let (mut s, q) = LearnedStore::open(dir.path()).unwrap();
        assert!(q.is_none());
        let first = binding("02:00:00:00:00:01", [192, 0, 2, 5], Some(10_000));
        assert_eq!(s.upsert(first.clone()), Change::Durable);
        assert_eq!(s.upsert(first), Change::None);
        s.upsert(binding("02:00:00:00:00:02", [192, 0, 2, 6], None));
        s.flush().unwrap();
        assert_eq!(s.dirty(), Change::None);
        let (mut s, _) = LearnedStore::open(dir.path()).unwrap();
        assert_eq!(s.rows(0).len(), 2);
        assert_eq!(s.rows(10_000).len(), 1, "expired rows are not shown");
        let gone = s.expire(10_000);
        assert_eq!(gone.len(), 1);
        // A RELEASE of another address keeps the binding; of its own removes it.
        assert!(!s.remove("02:00:00:00:00:02", Some(Ipv4Addr::new(192, 0, 2, 99))));
        assert!(s.remove("02:00:00:00:00:02", Some(Ipv4Addr::new(192, 0, 2, 6))));
        s.flush().unwrap();
        let (s, _) = LearnedStore::open(dir.path()).unwrap();
        assert!(s.rows(0).is_empty());
    }

    /// A renewal moves only the expiry: kept in memory, the file is not
    /// rewritten until a batch takes it (or a durable change comes).
    #[test]
    fn a_renewal_changes_only_memory_until_the_batch() {
        let dir = tempfile::tempdir().unwrap();
        let (mut s, _) = LearnedStore::open(dir.path()).unwrap();
        s.upsert(binding("02:00:00:00:00:01", [192, 0, 2, 5], Some(10_000)));
        s.flush().unwrap();
        let file = dir.path().join(LearnedStore::FILE);
        let written = std::fs::read(&file).unwrap();
        for e in 1..100 {
            let renewed = binding("02:00:00:00:00:01", [192, 0, 2, 5], Some(10_000 + e));
            assert_eq!(s.upsert(renewed), Change::Expiry);
        }
        assert_eq!(std::fs::read(&file).unwrap(), written, "nothing written");
        assert_eq!(s.rows(10_050).len(), 1, "the table has the new expiry");
        assert_eq!(s.dirty(), Change::Expiry);
        // A move is durable, and takes the renewals with it.
        s.upsert(binding("02:00:00:00:00:01", [192, 0, 2, 6], Some(20_000)));
        let snap = s.take_snapshot().unwrap().unwrap();
        assert_eq!(snap.change, Change::Durable);
        assert_eq!(s.dirty(), Change::None);
        // A failed write leaves the change to be written.
        s.mark_unwritten(snap.change);
        assert_eq!(s.dirty(), Change::Durable);
        s.flush().unwrap();
        let (s, _) = LearnedStore::open(dir.path()).unwrap();
        assert_eq!(s.rows(0)[0].ip, Ipv4Addr::new(192, 0, 2, 6));
    }

    /// What a learned binding replaced in the entry is of its family: a
    /// file from before IPv6 bindings recorded one (an IPv4 address) loads
    /// as it was, and an IPv6 one is kept across a reopen.
    #[test]
    fn the_replaced_address_is_of_either_family_and_old_files_load() {
        let dir = tempfile::tempdir().unwrap();
        let old = r#"[{"mac": "02:00:00:00:00:01", "ip": "192.0.2.5", "port": "veth1",
            "pod": "default/vm1", "expiresUnixMs": 10000, "source": "learned",
            "replaced": "192.0.2.9"}]"#;
        std::fs::write(dir.path().join(LearnedStore::FILE), old).unwrap();
        let (mut s, q) = LearnedStore::open(dir.path()).unwrap();
        assert!(q.is_none());
        let mac = "02:00:00:00:00:01";
        let v4_replaced = s.get(mac).and_then(|b| b.replaced);
        assert_eq!(v4_replaced, Some(Ipv4Addr::new(192, 0, 2, 9).into()));
        let mut v6 = binding(mac, [0; 4], Some(20_000));
        v6.ip = "fd00:6::1a0".parse().unwrap();
        v6.replaced = Some("fd00:6::154".parse().unwrap());
        s.upsert(v6.clone());
        s.flush().unwrap();
        let (s, _) = LearnedStore::open(dir.path()).unwrap();
        assert_eq!(s.get6(mac), Some(&v6));
        assert_eq!(s.get(mac).and_then(|b| b.replaced), v4_replaced);
    }

    /// A MAC has an IPv4 and an IPv6 binding side by side; a file written
    /// before IPv6 bindings were learned (IPv4 rows only) loads as it was.
    #[test]
    fn a_macs_ipv6_binding_sits_beside_its_ipv4_one_and_old_files_load() {
        let dir = tempfile::tempdir().unwrap();
        let old = r#"[{"mac": "02:00:00:00:00:01", "ip": "192.0.2.5", "port": "veth1",
            "pod": "default/vm1", "expiresUnixMs": 10000, "source": "learned"}]"#;
        std::fs::write(dir.path().join(LearnedStore::FILE), old).unwrap();
        let (mut s, q) = LearnedStore::open(dir.path()).unwrap();
        assert!(q.is_none());
        let mac = "02:00:00:00:00:01";
        assert_eq!(
            s.get(mac).map(|b| b.ip),
            Some(Ipv4Addr::new(192, 0, 2, 5).into())
        );
        assert!(s.get6(mac).is_none());
        let mut v6 = binding(mac, [0; 4], Some(20_000));
        v6.ip = "fd00:6::1a0".parse().unwrap();
        assert_eq!(s.upsert(v6.clone()), Change::Durable);
        assert_eq!(s.rows(0).len(), 2, "both families");
        s.flush().unwrap();
        let (mut s, _) = LearnedStore::open(dir.path()).unwrap();
        assert_eq!(s.get6(mac), Some(&v6));
        assert!(s.get(mac).is_some());
        // Each family goes on its own.
        assert!(s.take6(mac, Some("fd00:6::1".parse().unwrap())).is_none());
        assert_eq!(s.take6(mac, None), Some(v6.clone()));
        assert!(s.get(mac).is_some());
        s.upsert(v6.clone());
        assert!(s.remove(mac, None));
        assert_eq!(s.get6(mac), Some(&v6));
        assert!(s.remove_row(&v6));
        assert!(s.rows(0).is_empty());
    }

    /// A MAC may hold several addresses its guest configured itself, beside
    /// its DHCPv6 binding; each is a row of its own, kept across a reopen.
    #[test]
    fn configured_addresses_are_rows_of_their_own() {
        let dir = tempfile::tempdir().unwrap();
        let (mut s, _) = LearnedStore::open(dir.path()).unwrap();
        let mac = "02:00:00:00:00:01";
        let row = |ip: &str, source| Binding {
            ip: ip.parse().unwrap(),
            source,
            ..binding(mac, [0; 4], None)
        };
        s.upsert(row("fd00:6::1a0", BindingSource::Learned));
        s.upsert(row("fd00:6::a", BindingSource::Dad));
        s.upsert(row("fd00:6::b", BindingSource::Dad));
        s.upsert(binding("02:00:00:00:00:02", [192, 0, 2, 6], None));
        s.upsert(Binding {
            mac: "02:00:00:00:00:02".to_owned(),
            ..row("fd00:6::c", BindingSource::Dad)
        });
        s.flush().unwrap();
        let (s, _) = LearnedStore::open(dir.path()).unwrap();
        assert_eq!(s.rows(0).len(), 5);
        let want: Vec<Ipv6Addr> = vec!["fd00:6::a".parse().unwrap(), "fd00:6::b".parse().unwrap()];
        assert_eq!(s.configured(mac), want);
        assert_eq!(
            s.get6(mac).map(|b| b.ip),
            Some("fd00:6::1a0".parse().unwrap())
        );
        let t = render(
            &[BindingRow {
                binding: row("fd00:6::a", BindingSource::Dad),
                family: String::new(),
                identity: None,
            }],
            0,
        );
        assert!(t.contains(" ipv6 ") && t.contains(" dad "), "{t}");
    }

    #[test]
    fn a_corrupt_file_is_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(LearnedStore::FILE), b"{not json").unwrap();
        let (s, q) = LearnedStore::open(dir.path()).unwrap();
        assert!(s.rows(0).is_empty());
        assert!(q.is_some_and(|q| q.contains("quarantine")));
        assert!(!dir.path().join(LearnedStore::FILE).exists());
        let aside: Vec<_> = std::fs::read_dir(dir.path().join("quarantine"))
            .unwrap()
            .collect();
        assert_eq!(aside.len(), 1);
    }

    #[test]
    fn table_rendering() {
        let row = |identity: Option<&str>| BindingRow {
            binding: binding("02:00:00:00:00:01", [192, 0, 2, 5], Some(65_000)),
            family: "ipv4".to_owned(),
            identity: identity.map(str::to_owned),
        };
        let mut v6 = row(None);
        v6.binding.ip = "fd00:6::1dc".parse().unwrap();
        v6.binding.source = BindingSource::Leased;
        v6.family = "ipv6".to_owned();
        let t = render(&[row(None), row(Some("both")), v6], 5_000);
        assert!(t.lines().next().unwrap().contains(" FAMILY "), "{t}");
        assert!(
            t.lines().nth(1).unwrap().contains(" ipv4    192.0.2.5 "),
            "{t}"
        );
        assert!(t.contains("learned") && t.contains("60s"));
        assert!(t.lines().nth(2).unwrap().contains(" both "), "{t}");
        assert!(
            t.lines().nth(3).unwrap().contains(" ipv6    fd00:6::1dc "),
            "{t}"
        );
        // A client that reads plain bindings reads the rows too.
        let json = serde_json::to_string(&[row(Some("ovs"))]).unwrap();
        let plain: Vec<Binding> = serde_json::from_str(&json).unwrap();
        assert_eq!(plain[0], row(None).binding);
        assert!(json.contains(r#""identity":"ovs""#), "{json}");
    }
}
