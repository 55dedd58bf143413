//! Crash-safe lease persistence: one record per lease, atomic writes, quarantine of corrupt records.
//!
//! Leases survive an agent restart: every change is written here and the
//! agent resumes each recorded lease when it starts. Layout under the state
//! dir:
//! ```text
//! <state_dir>/leases/<container_id>@<ifname>.json   one LeaseRecord each
//! <state_dir>/leases/<container_id>@<ifname>@ipv4.json  a dual-stack attachment's
//! <state_dir>/leases/<container_id>@<ifname>@ipv6.json  two leases, one record each
//! <state_dir>/quarantine/<original name>.<unix_ms>  records that failed to load
//! ```
//! The quarantine keeps what it holds for [`QUARANTINE_MAX_AGE`], and at
//! most the [`QUARANTINE_MAX_FILES`] newest ([`prune_quarantine`], at open
//! and after every file set aside): evidence for a while, never a disk
//! filled by a record that is corrupted again at every start.
//! File names are only ever built from a validated [`LeaseKey`]; the interface
//! name part is percent-encoded outside `[A-Za-z0-9_.-]`, so no input can
//! escape the directory. A record that cannot be read back is moved aside,
//! logged and counted; it never stops the agent.
//!
//! # Durable on every change
//!
//! [`LeaseStore::save`] writes a temporary file, `fsync`s it, renames it over
//! the record and `fsync`s the directory; [`LeaseStore::delete`] `fsync`s the
//! directory after the record is gone. When either returns, the change
//! survives the agent's death (`SIGKILL`, OOM kill, panic, restart) and a host
//! crash or power loss alike, and every reader sees the old or the new record,
//! never a torn one. Concurrent saves share the directory `fsync`s through the
//! filesystem's journal commit, so a burst of ADDs does not pay one commit
//! each. Should a record still be found torn (a disk that lies about flushes),
//! it fails to decode on the next start and is quarantined like any other
//! corrupt record.
//!
//! One kind of save returns earlier: the record an ADD's answer waits for
//! ([`Wait::Visible`], [`LeaseStore::save_as`]) returns once it is renamed
//! into place, which the agent's death cannot undo (the next agent reads
//! it), and the store's syncer makes it durable moments later, off the
//! ADD's path (on the development VM's disk those barriers were 2–7 ms of
//! every ADD that waited for them). What a host crash in those moments can
//! cost: the record is lost or torn (quarantined), so the lease it names is
//! not released at the next start and the server keeps the address until
//! the lease runs out; the pod is gone with the host either way. Every
//! later write of the record (the full lease, renewals) and every removal
//! is durable before it returns.
//!
//! The temporary files come from a pool of empty files created off the hot
//! path (at open and by [`LeaseStore::replenish`]), and a deleted record goes
//! back to that pool instead of being unlinked, so ADD and DEL neither
//! allocate nor free inodes (costly on ext4 under a burst; the figures are in
//! `docs/performance-notes.md`).
//!
//! One thing, whole: the record format, its file names, the durable write
//! and the quarantine all guard the same promise (a record that returned is
//! on disk and loads back, or is set aside with a reason); the tests of that
//! promise are a third of the file.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::fs::{self, File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer, Serialize};
use xdhcp_engine::Lease;

use crate::cni::env::{validate_container_id, validate_ifname};
use crate::model::{Family, Network, PodRef, UplinkRef, WorkloadKind};
use crate::sys;
use crate::sys::fs::{AtomicWriteError, Barrier, Disk, Staged, Temp, WriteStep};

/// Version of the on-disk record format.
pub const RECORD_VERSION: u32 = 2;

/// Largest record file accepted on load; anything bigger is quarantined.
pub const MAX_RECORD_BYTES: u64 = 1 << 20;

const LEASES_DIR: &str = "leases";
const QUARANTINE_DIR: &str = "quarantine";
/// Files the quarantine keeps at most (the newest).
pub const QUARANTINE_MAX_FILES: usize = 64;
/// How long the quarantine keeps a file.
pub const QUARANTINE_MAX_AGE: std::time::Duration = std::time::Duration::from_hours(30 * 24);
const RECORD_EXT: &str = ".json";
const TMP_MARKER: &str = ".tmp.";
/// Empty files kept ready in the leases directory (see [`LeaseStore::save`]).
const POOL_TARGET: usize = 128;
/// Below this many spares the pool is topped up even while records are
/// being written (see [`LeaseStore::replenish_due`]).
const POOL_LOW: usize = 16;
/// How long the store must have written nothing before the pool is topped
/// up while it holds at least [`POOL_LOW`] spares.
pub const POOL_QUIET: Duration = Duration::from_millis(500);

/// Errors of the lease store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The container id is not `[A-Za-z0-9][A-Za-z0-9_.-]{0,127}`.
    #[error("invalid container id {value:?}: must match [A-Za-z0-9][A-Za-z0-9_.-]{{0,127}}")]
    InvalidContainerId { value: String },
    /// The interface name is not a valid Linux interface name.
    #[error(
        "invalid interface name {value:?}: must be 1-15 bytes, not \".\" or \"..\", without '/', ':' or whitespace"
    )]
    InvalidIfname { value: String },
    /// Only records that hold a lease, or the address of a first REQUEST
    /// still out, are stored.
    #[error("the record of {key} holds no lease and no requested address")]
    NoLease { key: LeaseKey },
    /// A filesystem operation failed.
    #[error("failed to {op}: {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A record could not be serialised.
    #[error("failed to serialise the lease record for {key}: {source}")]
    Serialize {
        key: LeaseKey,
        #[source]
        source: serde_json::Error,
    },
    /// A stored record could not be read back (see [`Corruption`]).
    #[error("corrupt lease record {path}: {reason}")]
    Corrupt {
        path: PathBuf,
        #[source]
        reason: Corruption,
    },
}

/// Convenience alias for results of this module.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

impl StoreError {}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |source| StoreError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Why a stored record was rejected.
#[derive(Debug, thiserror::Error)]
pub enum Corruption {
    /// The file name is not `<container_id>@<ifname>.json` with valid parts.
    #[error("file name is not a valid lease key")]
    BadFileName,
    /// Larger than [`MAX_RECORD_BYTES`].
    #[error("record is {size} bytes, larger than the {MAX_RECORD_BYTES} byte limit")]
    TooLarge { size: u64 },
    /// Not a regular file.
    #[error("not a regular file")]
    NotAFile,
    /// Unreadable or not valid JSON for a record.
    #[error("cannot decode: {0}")]
    Decode(#[source] serde_json::Error),
    /// Written by a newer or unknown format version.
    #[error("unsupported record version {0} (supported: {RECORD_VERSION})")]
    Version(u32),
    /// The key inside the record does not match the file name. (Boxed:
    /// the keys would make every store error as large as both.)
    #[error("record is for {inside}, but is stored as {file}")]
    KeyMismatch {
        inside: Box<LeaseKey>,
        file: Box<LeaseKey>,
    },
    /// The identity inside the record is not a valid lease key.
    #[error("the container id or interface name inside is invalid")]
    BadKey,
    /// The record holds no lease and no requested address (nothing to
    /// resume: such records are never written).
    #[error("holds no lease and no requested address")]
    NoLease,
    /// Could not be read.
    #[error("cannot read: {0}")]
    Read(#[source] std::io::Error),
}

impl Corruption {
    /// Bounded label for logs and metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::BadFileName => "bad_file_name",
            Self::TooLarge { .. } => "too_large",
            Self::NotAFile => "not_a_file",
            Self::Decode(_) => "decode",
            Self::Version(_) => "version",
            Self::KeyMismatch { .. } => "key_mismatch",
            Self::BadKey => "bad_key",
            Self::NoLease => "no_lease",
            Self::Read(_) => "read",
        }
    }
}

/// Validated identity of a lease: one per (container, interface), and on a
/// dual-stack network one per family of it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct LeaseKey {
    container_id: String,
    ifname: String,
    /// Which of a dual-stack attachment's leases ([`LeaseRecord::lease_family`]);
    /// `None` for the one lease of a single-family network, whose file
    /// keeps the name it had before dual stack.
    #[serde(skip)]
    family: Option<Family>,
}

impl LeaseKey {
    /// Validates both parts by the rules the CNI environment is checked with
    /// (one rule for both places): container id
    /// `[A-Za-z0-9][A-Za-z0-9_.-]{0,127}`, interface name 1-15 printable
    /// ASCII characters, not `.`/`..`, no `/` or `:`.
    pub fn new(container_id: &str, ifname: &str) -> Result<Self> {
        if validate_container_id(container_id).is_err() {
            return Err(StoreError::InvalidContainerId {
                value: container_id.to_owned(),
            });
        }
        if validate_ifname(ifname).is_err() {
            return Err(StoreError::InvalidIfname {
                value: ifname.to_owned(),
            });
        }
        Ok(Self {
            container_id: container_id.to_owned(),
            ifname: ifname.to_owned(),
            family: None,
        })
    }

    /// The key of a dual-stack attachment's lease of `family` (`None`: the
    /// one lease of a single-family network).
    #[must_use]
    pub fn of_family(self, family: Option<Family>) -> Self {
        Self {
            family: family.filter(|f| *f != Family::Dual),
            ..self
        }
    }

    /// Which of a dual-stack attachment's leases this is.
    pub fn family(&self) -> Option<Family> {
        self.family
    }

    /// The container id.
    pub fn container_id(&self) -> &str {
        &self.container_id
    }

    /// The interface name inside the container.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// `<container_id>@<percent-encoded ifname>`, then `@ipv4` or `@ipv6`
    /// for a dual-stack attachment's lease — safe as a file name (`@` is
    /// percent-encoded in the interface name, and no container id holds
    /// one).
    pub(crate) fn file_stem(&self) -> String {
        let mut stem = String::with_capacity(self.container_id.len() + 1 + self.ifname.len());
        stem.push_str(&self.container_id);
        stem.push('@');
        for b in self.ifname.bytes() {
            if b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-') {
                stem.push(char::from(b));
            } else {
                let _ = write!(stem, "%{b:02X}");
            }
        }
        if let Some(f) = self.family {
            stem.push('@');
            stem.push_str(f.label());
        }
        stem
    }

    /// Inverse of [`LeaseKey::file_stem`], validating the result.
    pub(crate) fn from_file_stem(stem: &str) -> Option<Self> {
        let (cid, enc) = stem.split_once('@')?;
        let (enc, family) = match enc.split_once('@') {
            None => (enc, None),
            Some((enc, "ipv4")) => (enc, Some(Family::Ipv4)),
            Some((enc, "ipv6")) => (enc, Some(Family::Ipv6)),
            Some(_) => return None,
        };
        let mut bytes = Vec::with_capacity(enc.len());
        let mut it = enc.bytes();
        while let Some(b) = it.next() {
            if b == b'%' {
                let hi = char::from(it.next()?).to_digit(16)?;
                let lo = char::from(it.next()?).to_digit(16)?;
                bytes.push((hi * 16 + lo) as u8);
            } else {
                bytes.push(b);
            }
        }
        let ifname = String::from_utf8(bytes).ok()?;
        let key = Self::new(cid, &ifname).ok()?.of_family(family);
        // Only the canonical encoding is accepted, so one key has one file.
        (key.file_stem() == stem).then_some(key)
    }
}

impl fmt::Display for LeaseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.container_id, self.ifname)?;
        match self.family {
            Some(family) => write!(f, " ({})", family.label()),
            None => Ok(()),
        }
    }
}

impl<'de> Deserialize<'de> for LeaseKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Raw {
            container_id: String,
            ifname: String,
        }
        let raw = Raw::deserialize(d)?;
        Self::new(&raw.container_id, &raw.ifname).map_err(serde::de::Error::custom)
    }
}

/// One lease, as the agent keeps it and as it is stored: where and for whom
/// it was acquired (everything a restarted agent needs to resume it without
/// a new DISCOVER) and the lease itself. Only records that hold a lease, or
/// the address of an attachment's first REQUEST while it is out, are stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseRecord {
    /// Format version ([`RECORD_VERSION`] when written).
    pub version: u32,
    pub container_id: String,
    pub ifname: String,
    /// Network namespace path (`CNI_NETNS`); none for a VF netdev in the
    /// agent's own namespace.
    pub netns: Option<PathBuf>,
    /// The network the attachment is on, to rebuild the client on resume
    /// (stored under `config`, the name it has always had on disk).
    #[serde(rename = "config")]
    pub network: Network,
    /// `CNI_ARGS`.
    #[serde(default)]
    pub args: BTreeMap<String, String>,
    pub pod: Option<PodRef>,
    pub workload: WorkloadKind,
    /// The MAC the client uses (the interface's, or the VM's).
    #[serde(with = "mac_serde")]
    pub mac: [u8; 6],
    /// The `k8s.ovn.org/pod-networks` key written at ADD, if any.
    pub annotation_key: Option<String>,
    /// The lease as last bound or renewed.
    pub lease: Option<Lease>,
    /// Wall clock of the last write (Unix ms).
    #[serde(default)]
    pub updated_unix_ms: u64,
    /// The node uplink that carried the lease's replies, if one did (absent
    /// in records written before uplinks existed, which read as `None`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uplink: Option<UplinkRef>,
    /// Before the first lease: the address the attachment's REQUEST is out
    /// for (the offer it chose). Written while the server's ACK is awaited,
    /// so the record that lets a restart get the lease back is on disk by
    /// the time the lease is bound; a restart that finds it asks for the
    /// same address again (INIT-REBOOT). Absent once a lease is held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested: Option<std::net::Ipv4Addr>,
    /// With `requested`: the server identifier of the offer that REQUEST
    /// accepted. That server may have committed the lease while no answer
    /// was heard (the agent killed, say), so a DEL that finds no lease
    /// releases the requested address to it. Absent in records written
    /// before it was kept, which then release nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_from: Option<std::net::Ipv4Addr>,
    /// With a lease: the xids its next renewal and rebinding carry, drawn
    /// at its last ACK and so written with it (no write of its own). A
    /// restarted agent that finds one of them still owned in the pinned
    /// ownership map knows that REQUEST went out, and adopts the
    /// transaction: the reply that arrived while no agent ran completes it
    /// (`Client::adopt_sent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planned_xids: Option<xdhcp_engine::PlannedXids>,
    /// On an IPv6 network (`network.ipam.family`): the DHCPv6 lease as last
    /// bound or renewed (`lease` stays empty). Absent in every IPv4 record.
    /// Boxed: records are moved through the ADD's futures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease6: Option<Box<xdhcp_engine::v6::Lease>>,
    /// With `lease6`: what the link's router advertisements give its
    /// address (the on-link prefix length, the default router), when the
    /// network names neither.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router6: Option<xdhcp_engine::v6::ra::Router6>,
    /// On a dual-stack network (`"family": "dual"`): which of the
    /// attachment's two leases this record keeps, `ipv4` (in `lease`) or
    /// `ipv6` (in `lease6`), each in a file of its own. Absent on a
    /// single-family network, whose one lease is of the network's family
    /// (so every record written before dual stack reads as it was).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_family: Option<Family>,
}

impl LeaseRecord {
    /// The family of the record's lease: `ipv4` or `ipv6`, never `dual`.
    pub fn family(&self) -> Family {
        match (self.lease_family, self.network.ipam.family) {
            (Some(Family::Ipv6), _) | (None, Family::Ipv6) => Family::Ipv6,
            _ => Family::Ipv4,
        }
    }

    /// Whether the record holds anything a restart can resume: a lease
    /// (either family), or the address of a first REQUEST.
    pub fn resumable(&self) -> bool {
        self.lease.is_some() || self.requested.is_some() || self.lease6.is_some()
    }

    /// The record's validated identity.
    pub fn key(&self) -> Result<LeaseKey> {
        Ok(LeaseKey::new(&self.container_id, &self.ifname)?.of_family(self.lease_family))
    }
}

/// The first record format (version 1), read so that leases recorded by an
/// older agent are resumed; they are written back in the current format at
/// their next change.
mod v1 {
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    use serde::Deserialize;
    use xdhcp_engine::Lease;

    use super::{LeaseKey, LeaseRecord, mac_serde};
    use crate::model::{Network, PodRef, WorkloadKind};

    #[derive(Deserialize)]
    pub(super) struct Record {
        key: LeaseKey,
        attachment: Attachment,
        lease: Lease,
        #[serde(default)]
        updated_unix_ms: u64,
    }

    #[derive(Deserialize)]
    struct Attachment {
        netns: PathBuf,
        #[serde(with = "mac_serde")]
        mac: [u8; 6],
        #[serde(default)]
        pod_namespace: Option<String>,
        #[serde(default)]
        pod_name: Option<String>,
        #[serde(default)]
        pod_uid: Option<String>,
        #[serde(default)]
        network_key: Option<String>,
        mode: Mode,
        cni_config: Extra,
    }

    #[derive(Deserialize)]
    #[serde(tag = "kind", rename_all = "lowercase")]
    enum Mode {
        Pod,
        Vm { vmi_name: String },
    }

    #[derive(Deserialize)]
    struct Extra {
        config: Network,
        #[serde(default)]
        args: BTreeMap<String, String>,
    }

    impl Record {
        pub(super) fn upgrade(self) -> LeaseRecord {
            let a = self.attachment;
            let pod = match (a.pod_namespace, a.pod_name) {
                (Some(namespace), Some(name)) => Some(PodRef {
                    namespace,
                    name,
                    uid: a.pod_uid,
                }),
                _ => None,
            };
            LeaseRecord {
                version: super::RECORD_VERSION,
                container_id: self.key.container_id().to_owned(),
                ifname: self.key.ifname().to_owned(),
                netns: (!a.netns.as_os_str().is_empty()).then_some(a.netns),
                network: a.cni_config.config,
                args: a.cni_config.args,
                pod,
                workload: match a.mode {
                    Mode::Pod => WorkloadKind::Pod,
                    Mode::Vm { vmi_name } => WorkloadKind::Vm { vmi: vmi_name },
                },
                mac: a.mac,
                annotation_key: a.network_key,
                lease: Some(self.lease),
                updated_unix_ms: self.updated_unix_ms,
                uplink: None,
                requested: None,
                requested_from: None,
                planned_xids: None,
                lease6: None,
                router6: None,
                lease_family: None,
            }
        }
    }
}

/// Serialises MACs as `aa:bb:cc:dd:ee:ff`.
mod mac_serde {
    use serde::{Deserialize, Deserializer, Serializer};

    #[expect(
        clippy::trivially_copy_pass_by_ref,
        reason = "signature required by serde(with)"
    )]
    pub(super) fn serialize<S: Serializer>(mac: &[u8; 6], s: S) -> Result<S::Ok, S::Error> {
        let text: Vec<String> = mac.iter().map(|b| format!("{b:02x}")).collect();
        s.serialize_str(&text.join(":"))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; 6], D::Error> {
        let text = String::deserialize(d)?;
        let mut mac = [0u8; 6];
        let mut parts = text.split(':');
        for byte in &mut mac {
            let part = parts
                .next()
                .filter(|p| p.len() == 2)
                .ok_or_else(|| serde::de::Error::custom(format!("invalid MAC {text:?}")))?;
            *byte = u8::from_str_radix(part, 16)
                .map_err(|_| serde::de::Error::custom(format!("invalid MAC {text:?}")))?;
        }
        if parts.next().is_some() {
            return Err(serde::de::Error::custom(format!("invalid MAC {text:?}")));
        }
        Ok(mac)
    }
}

fn unix_ms_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A record moved aside by [`LeaseStore::load_all`].
#[derive(Debug)]
pub struct Quarantined {
    /// Where the file was.
    pub original: PathBuf,
    /// Where it is now (`None` if moving it failed; it was then left in place and skipped).
    pub moved_to: Option<PathBuf>,
    /// Why it was rejected.
    pub reason: Corruption,
}

/// Result of [`LeaseStore::load_all`].
#[derive(Debug, Default)]
pub struct LoadReport {
    /// Valid records, sorted by key.
    pub records: Vec<LeaseRecord>,
    /// Records that were rejected and moved aside.
    pub quarantined: Vec<Quarantined>,
}

/// The lease store rooted at a state dir.
#[derive(Debug)]
pub struct LeaseStore {
    leases_dir: PathBuf,
    quarantine_dir: PathBuf,
    quarantined_total: AtomicU64,
    tmp_counter: AtomicU64,
    /// Durability barriers made by saves and deletes (for tests and metrics).
    syncs_total: Arc<AtomicU64>,
    /// Spare files (temporary names, empty or holding a deleted record).
    pool: Mutex<Vec<PathBuf>>,
    /// When the store was opened: the origin of `last_change_ms`.
    opened: Instant,
    /// Milliseconds from `opened` to the last save or delete, plus one
    /// (0: none yet).
    last_change_ms: AtomicU64,
    /// Where the writes' barriers go (the disk; a test's counter).
    barrier: Arc<dyn Barrier>,
    /// Saves waiting to be written, and whether a batch is being written.
    commit: Mutex<Commit>,
    /// Signalled when a batch is done.
    committed: Condvar,
    /// The barriers of [`Wait::Visible`] saves, made after they returned.
    settling: Arc<Settling>,
    /// Where those barriers are made: a thread of the store's own, started
    /// by the first such save (`None`: it could not be started, and the
    /// barriers are made by the save itself).
    syncer: OnceLock<Option<mpsc::Sender<Vec<File>>>>,
}

/// What a save waits for before it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// The record is on disk: it survives the agent's death and a host
    /// crash, and a failure leaves the previous record in place.
    Durable,
    /// The record is in place: the agent's death (`SIGKILL`, OOM kill,
    /// panic) cannot lose it and a restarted agent reads it, which is what
    /// an ADD's answer needs. The store makes it durable moments later, off
    /// the caller's path; a host crash before then may lose it or leave it
    /// torn (quarantined at the next start), and a failure to make it
    /// durable is logged and counted ([`LeaseStore::sync_failures`]).
    Visible,
}

/// One save waiting for the batch that writes it.
#[derive(Debug)]
struct Job {
    ticket: u64,
    key: LeaseKey,
    bytes: Vec<u8>,
    wait: Wait,
}

/// The group commit's state (see [`LeaseStore::save`]).
#[derive(Debug, Default)]
struct Commit {
    next_ticket: u64,
    queued: Vec<Job>,
    /// A save is writing a batch of [`Wait::Durable`] saves now.
    busy_durable: bool,
    /// A save is writing a batch of [`Wait::Visible`] saves now (beside a
    /// durable batch: a record is never in two saves at once, each lease
    /// task waiting for its last write before the next).
    busy_visible: bool,
    /// Results of written saves, taken by the save that waits for each.
    done: std::collections::HashMap<u64, Result<()>>,
}

impl Commit {
    /// Whether a batch of `wait`'s kind is being written.
    fn busy(&mut self, wait: Wait) -> &mut bool {
        match wait {
            Wait::Durable => &mut self.busy_durable,
            Wait::Visible => &mut self.busy_visible,
        }
    }
}

/// The barriers still to make for [`Wait::Visible`] saves that returned.
#[derive(Debug, Default)]
struct Settling {
    /// Batches handed to the syncer and not yet durable.
    pending: Mutex<usize>,
    /// Signalled when `pending` falls.
    settled: Condvar,
    /// Batches whose barrier failed.
    failures: AtomicU64,
}

impl LeaseStore {
    /// Opens (creating with mode 0700 if needed) `<state_dir>/leases` and
    /// `<state_dir>/quarantine`, and removes temporary files left by an
    /// interrupted write. The pool of spare files starts empty (a save
    /// makes its own file meanwhile): [`LeaseStore::replenish`] fills it,
    /// off the start's path (a hundred files made there held a restarted
    /// agent's socket back).
    pub fn open(state_dir: &Path) -> Result<Self> {
        Self::open_with(state_dir, Arc::new(Disk))
    }

    /// [`LeaseStore::open`] with the writes' barriers going to `barrier`.
    pub(crate) fn open_with(state_dir: &Path, barrier: Arc<dyn Barrier>) -> Result<Self> {
        let leases_dir = state_dir.join(LEASES_DIR);
        let quarantine_dir = state_dir.join(QUARANTINE_DIR);
        for dir in [&leases_dir, &quarantine_dir] {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(io_err("create directory", dir))?;
        }
        let store = Self {
            leases_dir,
            quarantine_dir,
            quarantined_total: AtomicU64::new(0),
            tmp_counter: AtomicU64::new(0),
            syncs_total: Arc::new(AtomicU64::new(0)),
            pool: Mutex::new(Vec::new()),
            opened: Instant::now(),
            last_change_ms: AtomicU64::new(0),
            barrier,
            commit: Mutex::new(Commit::default()),
            committed: Condvar::new(),
            settling: Arc::new(Settling::default()),
            syncer: OnceLock::new(),
        };
        store.remove_stale_tmp()?;
        prune_quarantine(&store.quarantine_dir, unix_ms_now());
        Ok(store)
    }

    /// `<state_dir>/leases`.
    pub fn leases_dir(&self) -> &Path {
        &self.leases_dir
    }

    /// `<state_dir>/quarantine`.
    pub fn quarantine_dir(&self) -> &Path {
        &self.quarantine_dir
    }

    /// Records quarantined since this store was opened (for metrics).
    pub fn quarantined_total(&self) -> u64 {
        self.quarantined_total.load(Ordering::Relaxed)
    }

    /// Path of the record for `key`.
    pub fn path_for(&self, key: &LeaseKey) -> PathBuf {
        self.leases_dir
            .join(format!("{}{RECORD_EXT}", key.file_stem()))
    }

    fn remove_stale_tmp(&self) -> Result<()> {
        let entries =
            fs::read_dir(&self.leases_dir).map_err(io_err("read directory", &self.leases_dir))?;
        for entry in entries {
            let entry = entry.map_err(io_err("read directory", &self.leases_dir))?;
            let name = entry.file_name();
            if name.to_string_lossy().starts_with('.')
                && name.to_string_lossy().contains(TMP_MARKER)
            {
                let path = entry.path();
                fs::remove_file(&path).map_err(io_err("remove stale temporary file", &path))?;
                tracing::debug!(path = %path.display(), "removed temporary file of an interrupted write");
            }
        }
        Ok(())
    }

    /// Writes `record` durably and atomically: a temporary file (a spare
    /// from the pool when there is one, so no inode is allocated here) is
    /// written and synced, renamed over the record, and the directory is
    /// synced. Once this returns the record survives the agent's death and
    /// a host crash; a failure leaves the previous record in place.
    ///
    /// Saves made at the same time share their barriers (a group commit):
    /// one save at a time writes a batch, every save queued meanwhile waits
    /// and is written in the next batch, whole, by one of them: each
    /// record's temporary written, one barrier for all of them
    /// ([`Barrier::files`]), each renamed over its record in the order the
    /// saves came, one barrier for the directory. No timer: a save that
    /// finds no batch being written writes its own at once; a burst of N
    /// saves costs two or four barriers, not 2N. Each save returns only once
    /// the batch holding it is durable.
    pub fn save(&self, record: &LeaseRecord) -> Result<()> {
        self.save_as(record, Wait::Durable)
    }

    /// [`LeaseStore::save`], returning once the record is in place or on
    /// disk as `wait` says. Saves of the two kinds are batched apart: a
    /// [`Wait::Visible`] batch is written and renamed over its records at
    /// once, its saves return, and the store's syncer makes its barriers
    /// after (every batch handed to it meanwhile under one pair of
    /// barriers; [`LeaseStore::flush`] waits for them).
    pub fn save_as(&self, record: &LeaseRecord, wait: Wait) -> Result<()> {
        let key = record.key()?;
        if !record.resumable() {
            return Err(StoreError::NoLease { key });
        }
        // A save refused above writes nothing: only real writes hold the
        // pool's top-up back.
        self.changed_now();
        let mut bytes =
            serde_json::to_vec_pretty(record).map_err(|source| StoreError::Serialize {
                key: key.clone(),
                source,
            })?;
        bytes.push(b'\n');
        let mut commit = lock(&self.commit);
        let ticket = commit.next_ticket;
        commit.next_ticket += 1;
        commit.queued.push(Job {
            ticket,
            key,
            bytes,
            wait,
        });
        loop {
            if let Some(result) = commit.done.remove(&ticket) {
                return result;
            }
            if *commit.busy(wait) {
                commit = self
                    .committed
                    .wait(commit)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                continue;
            }
            // No batch of its kind is being written: this save writes
            // everything of its kind queued (the other kind is left to one
            // of its own saves).
            *commit.busy(wait) = true;
            let (batch, other): (Vec<Job>, Vec<Job>) = std::mem::take(&mut commit.queued)
                .into_iter()
                .partition(|j| j.wait == wait);
            commit.queued = other;
            drop(commit);
            let mut writing = Writing {
                store: self,
                wait,
                tickets: batch.iter().map(|j| j.ticket).collect(),
                results: Vec::new(),
            };
            writing.results = self.write_batch(batch, wait);
            drop(writing);
            commit = lock(&self.commit);
        }
    }

    /// Saves queued for the next batch (for tests).
    #[cfg(test)]
    fn queued(&self) -> usize {
        lock(&self.commit).queued.len()
    }

    /// Writes `batch` (see [`LeaseStore::save`] and [`LeaseStore::save_as`]):
    /// each record's temporary written, then installed as `wait` says —
    /// durably, or renamed at once with its barriers handed to the syncer.
    /// One result per job.
    fn write_batch(&self, batch: Vec<Job>, wait: Wait) -> Vec<(u64, Result<()>)> {
        let mut staged: Vec<Staged> = Vec::with_capacity(batch.len());
        let mut tickets = Vec::with_capacity(batch.len());
        let mut results = Vec::with_capacity(batch.len());
        for job in batch {
            match self.stage(&job) {
                Ok(s) => {
                    staged.push(s);
                    tickets.push(job.ticket);
                }
                Err(e) => results.push((job.ticket, Err(write_err(e)))),
            }
        }
        let installed = match wait {
            Wait::Durable => {
                let barriers = Counted {
                    inner: &*self.barrier,
                    count: &self.syncs_total,
                };
                sys::fs::install_staged(&self.leases_dir, staged, &barriers)
            }
            Wait::Visible => {
                let (installed, files) = sys::fs::install_unsynced(staged);
                self.settle_later(files);
                installed
            }
        };
        results.extend(
            tickets
                .into_iter()
                .zip(installed)
                .map(|(t, r)| (t, r.map_err(write_err))),
        );
        results
    }

    /// Has the syncer make `files` and the directory durable (at once, on
    /// this thread, if the syncer could not be started).
    fn settle_later(&self, files: Vec<File>) {
        if files.is_empty() {
            return;
        }
        let syncer = self.syncer.get_or_init(|| {
            let (tx, rx) = mpsc::channel();
            let work = self.syncer_work();
            match std::thread::Builder::new()
                .name("xdhcp-store-sync".to_owned())
                .spawn(move || work.run(&rx))
            {
                Ok(_) => Some(tx),
                Err(e) => {
                    tracing::warn!(error = %e, "no thread for the lease records' barriers; each save makes its own");
                    None
                }
            }
        });
        *lock(&self.settling.pending) += 1;
        let unsent = match syncer {
            Some(tx) => tx.send(files).err().map(|e| e.0),
            None => Some(files),
        };
        if let Some(files) = unsent {
            self.syncer_work().settle(vec![files]);
        }
    }

    /// What the syncer needs of the store, to make barriers on its own.
    fn syncer_work(&self) -> Syncer {
        Syncer {
            barrier: self.barrier.clone(),
            count: self.syncs_total.clone(),
            settling: self.settling.clone(),
            dir: self.leases_dir.clone(),
        }
    }

    /// Waits until every [`Wait::Visible`] save that returned is durable
    /// (or its barrier failed: [`LeaseStore::sync_failures`]).
    pub fn flush(&self) {
        let mut pending = lock(&self.settling.pending);
        while *pending > 0 {
            pending = self
                .settling
                .settled
                .wait(pending)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// Batches of [`Wait::Visible`] saves whose barrier failed: records in
    /// place that a host crash could still lose.
    pub fn sync_failures(&self) -> u64 {
        self.settling.failures.load(Ordering::Relaxed)
    }

    /// The temporary of one job, written: a spare from the pool when there
    /// is one (no inode allocated), a fresh file if there is none or it
    /// could not be written (and is gone).
    fn stage(&self, job: &Job) -> std::result::Result<Staged, AtomicWriteError> {
        let path = self.path_for(&job.key);
        let spare = lock(&self.pool).pop();
        if let Some(spare) = spare
            && let Ok(staged) = sys::fs::stage(&path, &spare, Temp::Reuse, &job.bytes)
        {
            return Ok(staged);
        }
        sys::fs::stage(&path, &self.tmp_name(), Temp::Fresh, &job.bytes)
    }

    /// Syncs the leases directory, making renames and removals in it durable.
    fn sync_dir(&self) -> Result<()> {
        self.barrier
            .dir(&self.leases_dir)
            .map_err(io_err("fsync directory", &self.leases_dir))?;
        self.syncs_total.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// A fresh temporary file name in the leases directory.
    fn tmp_name(&self) -> PathBuf {
        self.leases_dir.join(format!(
            ".spare{TMP_MARKER}{}.{}",
            std::process::id(),
            self.tmp_counter.fetch_add(1, Ordering::Relaxed)
        ))
    }

    /// Tops the pool of spare files up to its target (best effort: a file
    /// that cannot be created now is created by the save that needs it).
    /// The agent calls this off the ADD path when the pool runs low.
    pub fn replenish(&self) {
        let missing = self.spares_missing();
        let mut fresh = Vec::with_capacity(missing);
        for _ in 0..missing {
            let tmp = self.tmp_name();
            if write_new_file(&tmp, b"").is_err() {
                break;
            }
            fresh.push(tmp);
        }
        lock(&self.pool).extend(fresh);
    }

    /// Whether [`LeaseStore::replenish`] should run at `now`: the pool
    /// lacks spares, and either it is nearly empty or the store has written
    /// nothing for [`POOL_QUIET`]. A burst of ADDs takes its spares and the
    /// burst's DELs give them back; making new files meanwhile (an inode
    /// allocation each) would only take CPU from the burst.
    pub fn replenish_due(&self, now: Instant) -> bool {
        let spares = self.spares();
        if spares >= POOL_TARGET {
            return false;
        }
        if spares < POOL_LOW {
            return true;
        }
        match self.last_change_ms.load(Ordering::Relaxed) {
            0 => true,
            ms => {
                now.saturating_duration_since(self.opened + Duration::from_millis(ms - 1))
                    >= POOL_QUIET
            }
        }
    }

    /// Notes that a record is being written or removed now.
    fn changed_now(&self) {
        let ms = u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        self.last_change_ms.store(ms + 1, Ordering::Relaxed);
    }

    /// How many spare files the pool lacks.
    pub fn spares_missing(&self) -> usize {
        POOL_TARGET.saturating_sub(lock(&self.pool).len())
    }

    /// Spare files ready for saves (for tests).
    pub fn spares(&self) -> usize {
        lock(&self.pool).len()
    }

    /// Durability barriers made by saves and deletes so far (a batch of
    /// saves makes two: its files', its directory's).
    pub fn syncs_total(&self) -> u64 {
        self.syncs_total.load(Ordering::Relaxed)
    }

    /// Reads the record for `key`; `Ok(None)` if there is none. A corrupt
    /// record is reported as [`StoreError::Corrupt`] and left in place
    /// (quarantining is [`LeaseStore::load_all`]'s job).
    pub fn load(&self, key: &LeaseKey) -> Result<Option<LeaseRecord>> {
        let path = self.path_for(key);
        match fs::symlink_metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err("stat", &path)(e)),
            Ok(_) => {}
        }
        read_record(&path, key)
            .map(Some)
            .map_err(|reason| StoreError::Corrupt { path, reason })
    }

    /// Removes the record for `key` and `fsync`s the directory; returns
    /// whether one existed. Once this returns, the removal is durable.
    pub fn delete(&self, key: &LeaseKey) -> Result<bool> {
        let path = self.path_for(key);
        self.changed_now();
        // Into the pool (renamed, its inode kept for the next save) while the
        // pool is short; unlinked otherwise.
        let recycle = lock(&self.pool).len() < POOL_TARGET;
        let spare = recycle.then(|| self.tmp_name());
        let gone = match &spare {
            Some(spare) => sys::fs::rename(&path, spare),
            None => fs::remove_file(&path),
        };
        match gone {
            Ok(()) => {
                if let Some(spare) = spare {
                    lock(&self.pool).push(spare);
                }
                self.sync_dir().map(|()| true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io_err("remove", &path)(e)),
        }
    }

    /// Loads every record. Corrupt ones (bad name, too large, undecodable,
    /// unknown version, key mismatch) are moved to the quarantine directory,
    /// logged and counted; only a failure to list the directory is an error.
    pub fn load_all(&self) -> Result<LoadReport> {
        let mut report = LoadReport::default();
        let entries =
            fs::read_dir(&self.leases_dir).map_err(io_err("read directory", &self.leases_dir))?;
        for entry in entries {
            let entry = entry.map_err(io_err("read directory", &self.leases_dir))?;
            let name = entry.file_name();
            let name_str = name.to_string_lossy();
            if name_str.starts_with('.') && name_str.contains(TMP_MARKER) {
                // A write in progress (another task of this process).
                continue;
            }
            let path = entry.path();
            let key = name
                .to_str()
                .and_then(|n| n.strip_suffix(RECORD_EXT))
                .and_then(LeaseKey::from_file_stem);
            let outcome = match key {
                None => Err(Corruption::BadFileName),
                Some(key) => read_record(&path, &key),
            };
            match outcome {
                Ok(record) => report.records.push(record),
                Err(reason) => report.quarantined.push(self.quarantine(&path, reason)),
            }
        }
        report.records.sort_by(|a, b| {
            (&a.container_id, &a.ifname, a.lease_family).cmp(&(
                &b.container_id,
                &b.ifname,
                b.lease_family,
            ))
        });
        Ok(report)
    }

    /// Moves `path` into the quarantine directory; never fails (a failure to
    /// move is logged and the file stays where it is).
    fn quarantine(&self, path: &Path, reason: Corruption) -> Quarantined {
        self.quarantined_total.fetch_add(1, Ordering::Relaxed);
        let file_name = path
            .file_name()
            .map_or_else(|| "unnamed".into(), |n| n.to_string_lossy().into_owned());
        let target = self
            .quarantine_dir
            .join(format!("{file_name}.{}", unix_ms_now()));
        let moved = sys::fs::rename(path, &target)
            .map_err(io_err("move corrupt record to", &target))
            .and_then(|()| sync_dir(&self.quarantine_dir))
            .and_then(|()| sync_dir(&self.leases_dir));
        prune_quarantine(&self.quarantine_dir, unix_ms_now());
        match moved {
            Ok(()) => {
                tracing::warn!(
                    path = %path.display(),
                    quarantined_to = %target.display(),
                    reason = %reason,
                    "corrupt lease record quarantined"
                );
                Quarantined {
                    original: path.to_path_buf(),
                    moved_to: Some(target),
                    reason,
                }
            }
            Err(error) => {
                tracing::error!(
                    path = %path.display(),
                    reason = %reason,
                    error = %error,
                    "corrupt lease record could not be quarantined; skipping it"
                );
                Quarantined {
                    original: path.to_path_buf(),
                    moved_to: None,
                    reason,
                }
            }
        }
    }
}

/// `<state_dir>/quarantine`, where every store of the state directory sets
/// aside a file it cannot read.
pub fn quarantine_dir(state_dir: &Path) -> PathBuf {
    state_dir.join(QUARANTINE_DIR)
}

/// Removes from the quarantine directory `dir` the files set aside more
/// than [`QUARANTINE_MAX_AGE`] before `now_ms`, then all but the
/// [`QUARANTINE_MAX_FILES`] newest. A file's age is the `.<unix ms>` suffix
/// its name was given when set aside (its modification time when it has
/// none). Never fails: what cannot be listed or removed is logged and
/// stays. Returns how many files were removed.
pub fn prune_quarantine(dir: &Path, now_ms: u64) -> usize {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return 0,
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot list the quarantine to prune it");
            return 0;
        }
    };
    let mut files: Vec<(u64, PathBuf)> = entries
        .filter_map(std::result::Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| {
            let path = e.path();
            let stamp = path
                .extension()
                .and_then(|x| x.to_str())
                .and_then(|x| x.parse::<u64>().ok())
                .or_else(|| {
                    let modified = e.metadata().ok()?.modified().ok()?;
                    let d = modified.duration_since(UNIX_EPOCH).ok()?;
                    u64::try_from(d.as_millis()).ok()
                })
                .unwrap_or(0);
            (stamp, path)
        })
        .collect();
    // Newest first.
    files.sort_by(|a, b| b.cmp(a));
    let max_age_ms = u64::try_from(QUARANTINE_MAX_AGE.as_millis()).unwrap_or(u64::MAX);
    let mut removed = 0;
    for (i, (stamp, path)) in files.iter().enumerate() {
        if i < QUARANTINE_MAX_FILES && now_ms.saturating_sub(*stamp) <= max_age_ms {
            continue;
        }
        match fs::remove_file(path) {
            Ok(()) => removed += 1,
            Err(e) => tracing::warn!(path = %path.display(), error = %e,
                "cannot remove an old quarantined file"),
        }
    }
    if removed > 0 {
        tracing::info!(dir = %dir.display(), removed, "old quarantined files removed");
    }
    removed
}

/// Creates `path` exclusively with mode 0600 and writes `bytes`; the caller
/// decides whether to `fsync` the returned file.
fn write_new_file(path: &Path, bytes: &[u8]) -> Result<File> {
    sys::fs::write_new(path, bytes).map_err(io_err("create temporary file", path))
}

/// A batch being written: when it is done (or its writer panicked), its
/// results are handed to the saves waiting for them and the next batch may
/// start.
struct Writing<'a> {
    store: &'a LeaseStore,
    wait: Wait,
    tickets: Vec<u64>,
    results: Vec<(u64, Result<()>)>,
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        let mut commit = lock(&self.store.commit);
        *commit.busy(self.wait) = false;
        let results = std::mem::take(&mut self.results);
        if results.len() < self.tickets.len() {
            // The writer panicked: its saves fail rather than wait forever.
            for t in &self.tickets {
                commit.done.insert(
                    *t,
                    Err(StoreError::Io {
                        op: "write the lease record batch",
                        path: self.store.leases_dir.clone(),
                        source: std::io::Error::other("the batch's writer panicked"),
                    }),
                );
            }
        }
        commit.done.extend(results);
        drop(commit);
        self.store.committed.notify_all();
    }
}

impl Drop for LeaseStore {
    fn drop(&mut self) {
        // Every record that returned is durable before the store goes.
        self.flush();
    }
}

/// The store's syncer: makes the barriers of [`Wait::Visible`] batches,
/// every batch waiting when it starts under one pair.
struct Syncer {
    barrier: Arc<dyn Barrier>,
    count: Arc<AtomicU64>,
    settling: Arc<Settling>,
    dir: PathBuf,
}

impl Syncer {
    /// Until the store is gone: take every batch waiting, make them
    /// durable.
    fn run(&self, rx: &mpsc::Receiver<Vec<File>>) {
        while let Ok(first) = rx.recv() {
            let mut batches = vec![first];
            batches.extend(rx.try_iter());
            self.settle(batches);
        }
    }

    /// One barrier for every file of `batches`, one for the directory.
    fn settle(&self, batches: Vec<Vec<File>>) {
        let counted = Counted {
            inner: &*self.barrier,
            count: &self.count,
        };
        let files: Vec<&File> = batches.iter().flatten().collect();
        if let Err(e) = counted.files(&files).and_then(|()| counted.dir(&self.dir)) {
            self.settling.failures.fetch_add(1, Ordering::Relaxed);
            tracing::error!(dir = %self.dir.display(), records = files.len(), error = %e,
                "lease records written but not made durable: the agent's death cannot lose them, a host crash could");
        }
        drop(files);
        let settled = batches.len();
        // The files are closed before the saves count as settled.
        drop(batches);
        let mut pending = lock(&self.settling.pending);
        *pending = pending.saturating_sub(settled);
        drop(pending);
        self.settling.settled.notify_all();
    }
}

/// Barriers counted into the store's `syncs_total`.
#[derive(Debug)]
struct Counted<'a> {
    inner: &'a dyn Barrier,
    count: &'a AtomicU64,
}

impl Barrier for Counted<'_> {
    fn files(&self, files: &[&File]) -> std::io::Result<()> {
        self.inner.files(files)?;
        self.count.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn dir(&self, dir: &Path) -> std::io::Result<()> {
        self.inner.dir(dir)?;
        self.count.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// A failed save, named as the store names its steps.
fn write_err(e: AtomicWriteError) -> StoreError {
    let op = match e.step {
        WriteStep::Write => "create temporary file",
        WriteStep::SyncFile => "fsync temporary file",
        WriteStep::Install => "rename temporary file over",
        WriteStep::SyncDir => "fsync directory",
    };
    io_err(op, &e.path)(e.source)
}

/// Lock a mutex holding plain values, ignoring poisoning.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// fsyncs a directory so a rename/unlink in it is durable.
fn sync_dir(dir: &Path) -> Result<()> {
    sys::fs::sync_dir(dir).map_err(io_err("fsync directory", dir))
}

/// Reads and validates one record file stored under `key`'s name.
fn read_record(path: &Path, key: &LeaseKey) -> Result<LeaseRecord, Corruption> {
    // O_NOFOLLOW: a symlink planted in the directory is not followed.
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                Corruption::NotAFile
            } else {
                Corruption::Read(e)
            }
        })?;
    let meta = file.metadata().map_err(Corruption::Read)?;
    if !meta.is_file() {
        return Err(Corruption::NotAFile);
    }
    if meta.len() > MAX_RECORD_BYTES {
        return Err(Corruption::TooLarge { size: meta.len() });
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(MAX_RECORD_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(Corruption::Read)?;
    if bytes.len() as u64 > MAX_RECORD_BYTES {
        return Err(Corruption::TooLarge {
            size: bytes.len() as u64,
        });
    }
    decode_record(&bytes, key)
}

/// Decodes the bytes of a record file stored under `key`'s name: the format
/// version first (so a future format is reported as such rather than as a
/// decode error; the first format is read and upgraded), then the record,
/// whose identity must be the file's and which must hold a lease.
pub(crate) fn decode_record(bytes: &[u8], key: &LeaseKey) -> Result<LeaseRecord, Corruption> {
    #[derive(Deserialize)]
    struct Versioned {
        version: u32,
    }
    let versioned: Versioned = serde_json::from_slice(bytes).map_err(Corruption::Decode)?;
    let record = match versioned.version {
        1 => serde_json::from_slice::<v1::Record>(bytes)
            .map_err(Corruption::Decode)?
            .upgrade(),
        RECORD_VERSION => {
            serde_json::from_slice::<LeaseRecord>(bytes).map_err(Corruption::Decode)?
        }
        other => return Err(Corruption::Version(other)),
    };
    let inside = record.key().map_err(|_| Corruption::BadKey)?;
    if &inside != key {
        return Err(Corruption::KeyMismatch {
            inside: Box::new(inside),
            file: Box::new(key.clone()),
        });
    }
    if !record.resumable() {
        return Err(Corruption::NoLease);
    }
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use std::time::Duration;

    fn lease(addr: [u8; 4]) -> Lease {
        Lease {
            address: Ipv4Addr::from(addr),
            prefix_len: 24,
            server_id: Ipv4Addr::new(192, 0, 2, 1),
            server_mac: Some([2, 0, 0, 0, 0, 1]),
            routers: vec![Ipv4Addr::new(192, 0, 2, 1)],
            routes: Vec::new(),
            dns_servers: vec![Ipv4Addr::new(192, 0, 2, 53)],
            domain_name: Some("example.test".to_owned()),
            search: vec!["example.test".to_owned()],
            mtu: Some(1500),
            lease_time: Duration::from_mins(2),
            t1: Duration::from_mins(1),
            t2: Duration::from_secs(105),
            acquired_unix_ms: 1_700_000_000_000,
            rejected_routes: Vec::new(),
        }
    }

    fn record(cid: &str, ifname: &str, addr: [u8; 4]) -> LeaseRecord {
        LeaseRecord {
            version: RECORD_VERSION,
            container_id: cid.to_owned(),
            ifname: ifname.to_owned(),
            netns: Some(PathBuf::from("/var/run/netns/pod")),
            network: (&crate::cni::config::parse(
                br#"{"cniVersion":"1.0.0","name":"localnet","ipam":{"type":"xdhcp","apply":true}}"#,
            )
            .unwrap())
                .into(),
            args: BTreeMap::from([("K8S_POD_NAME".to_owned(), "pod-a".to_owned())]),
            pod: Some(PodRef {
                namespace: "default".to_owned(),
                name: "pod-a".to_owned(),
                uid: Some("uid-1".to_owned()),
            }),
            workload: WorkloadKind::Vm {
                vmi: "vm-a".to_owned(),
            },
            mac: [2, 0, 0, 0, 0, 9],
            annotation_key: Some("default/localnet".to_owned()),
            lease: Some(lease(addr)),
            updated_unix_ms: 1_700_000_000_000,
            uplink: None,
            requested: None,
            requested_from: None,
            planned_xids: None,
            lease6: None,
            router6: None,
            lease_family: None,
        }
    }

    /// Records written by the agent before the lease record kept its own
    /// network type (the CNI configuration, stored as is) load, whole; and
    /// what this agent writes for them is what that agent wrote (less the
    /// GC-only `validAttachments`, which it read as absent), so either
    /// agent reads the other's records.
    #[test]
    fn records_written_with_the_cni_configuration_load() {
        let dir = tempfile::tempdir().unwrap();
        let store = LeaseStore::open(dir.path()).unwrap();
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        for (fixture, file) in [
            ("lease-record-v2.json", "ctr-fixture-1@net1.json"),
            ("lease-record-v2-requested.json", "ctr-fixture-2@eth0.json"),
        ] {
            fs::copy(fixtures.join(fixture), store.leases_dir().join(file)).unwrap();
        }
        let report = store.load_all().unwrap();
        assert!(report.quarantined.is_empty(), "{:?}", report.quarantined);
        let [vm, pod] = &report.records[..] else {
            panic!("{:?}", report.records);
        };
        let n = &vm.network;
        assert_eq!(
            (n.cni_version.as_str(), n.name.as_str()),
            ("1.1.0", "localnet-dhcp")
        );
        assert_eq!(
            n.net_attach_def_name.as_deref(),
            Some("tenant/localnet-dhcp")
        );
        assert_eq!(n.device_id.as_deref(), Some("0000:3b:02.1"));
        let i = &n.ipam;
        assert!(i.apply && i.allow_default_route_override);
        assert_eq!(
            i.client_id,
            crate::model::ClientIdSetting::Raw(vec![0xff, 0, 0x11, 0x22])
        );
        assert_eq!(
            i.hostname,
            crate::model::HostnameSetting::FromArg("K8S_POD_NAME".to_owned())
        );
        assert_eq!(i.timeout, Some(Duration::from_secs(45)));
        assert_eq!(i.resend_max, Some(Duration::from_millis(1500)));
        assert_eq!(i.route_priority, Some(200));
        assert_eq!(
            i.protected_prefixes,
            [
                crate::model::Prefix {
                    addr: Ipv4Addr::new(10, 128, 0, 0),
                    len: 14
                },
                crate::model::Prefix {
                    addr: Ipv4Addr::new(172, 30, 0, 0),
                    len: 16
                }
            ]
        );
        assert_eq!(
            (i.dhcp_guard.trusted, i.dhcp_guard.rate, i.dhcp_guard.burst),
            (true, 50, 20)
        );
        assert_eq!(
            vm.lease.as_ref().map(|l| l.address),
            Some(Ipv4Addr::new(192, 0, 2, 77))
        );
        assert_eq!(
            vm.uplink.as_ref().map(|u| (u.ifname.as_str(), u.vlan)),
            Some(("br-ex", Some(100)))
        );
        assert_eq!(pod.workload, WorkloadKind::Pod);
        assert_eq!(pod.requested, Some(Ipv4Addr::new(192, 0, 2, 78)));
        assert_eq!(pod.network.ipam.timeout, None);

        for (rec, fixture) in [
            (vm, "lease-record-v2.json"),
            (pod, "lease-record-v2-requested.json"),
        ] {
            store.save(rec).unwrap();
            let stem = rec.key().unwrap().file_stem();
            let written: serde_json::Value = serde_json::from_slice(
                &fs::read(store.leases_dir().join(format!("{stem}.json"))).unwrap(),
            )
            .unwrap();
            let mut before: serde_json::Value =
                serde_json::from_slice(&fs::read(fixtures.join(fixture)).unwrap()).unwrap();
            before["config"]
                .as_object_mut()
                .unwrap()
                .remove("validAttachments");
            before["updatedUnixMs"] = written["updatedUnixMs"].clone();
            assert_eq!(written, before, "{fixture}");
        }
    }

    #[test]
    fn key_validation() {
        assert!(LeaseKey::new("abc123", "eth0").is_ok());
        assert!(LeaseKey::new(&"a".repeat(128), "net1").is_ok());
        for bad in [
            "",
            "-x",
            ".x",
            "a/b",
            "../x",
            "a b",
            "a@b",
            &"a".repeat(129),
            "ä",
        ] {
            assert!(
                matches!(
                    LeaseKey::new(bad, "eth0"),
                    Err(StoreError::InvalidContainerId { .. })
                ),
                "{bad:?} accepted"
            );
        }
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "a:b",
            "a b",
            "0123456789abcdef",
            "a\0",
        ] {
            assert!(
                matches!(
                    LeaseKey::new("c", bad),
                    Err(StoreError::InvalidIfname { .. })
                ),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn file_names_round_trip_and_stay_in_the_directory() {
        for ifname in ["eth0", "net1", "a%b", "a@b", "x.y-z_", "a~!"] {
            let key = LeaseKey::new("c1", ifname).unwrap();
            let stem = key.file_stem();
            assert!(!stem.contains('/') && stem.is_ascii(), "{stem}");
            assert_eq!(LeaseKey::from_file_stem(&stem), Some(key));
        }
        // Names the CNI environment refuses are refused here too (one rule).
        for ifname in ["é", "\u{1}", "a b"] {
            assert!(LeaseKey::new("c1", ifname).is_err(), "{ifname:?}");
        }
        // Non-canonical encodings are rejected.
        assert_eq!(LeaseKey::from_file_stem("c1@%65th0"), None);
        assert_eq!(LeaseKey::from_file_stem("c1@eth0@x"), None);
        assert_eq!(LeaseKey::from_file_stem("c1"), None);
        assert_eq!(LeaseKey::from_file_stem("c1@%zz"), None);
    }

    /// A dual-stack attachment's two leases are two records, each under a
    /// name of its own that says its family, beside the unchanged name of
    /// a single-family attachment's one record; each loads under its own
    /// key, is removed on its own, and a record stored under another
    /// family's name is set aside.
    #[test]
    fn a_dual_stack_attachment_has_a_record_per_family() {
        for (family, stem) in [
            (None, "c1@a%40b"),
            (Some(Family::Ipv4), "c1@a%40b@ipv4"),
            (Some(Family::Ipv6), "c1@a%40b@ipv6"),
        ] {
            let key = LeaseKey::new("c1", "a@b").unwrap().of_family(family);
            assert_eq!(key.file_stem(), stem);
            assert_eq!(LeaseKey::from_file_stem(stem), Some(key));
        }
        assert_eq!(LeaseKey::from_file_stem("c1@eth0@dual"), None);
        assert_eq!(LeaseKey::from_file_stem("c1@eth0@ipv6@ipv6"), None);

        let dir = tempfile::tempdir().unwrap();
        let store = LeaseStore::open(dir.path()).unwrap();
        let dual = |family| {
            let mut r = record("c1", "eth0", [192, 0, 2, 7]);
            r.network.ipam.family = Family::Dual;
            r.lease_family = Some(family);
            r
        };
        let (v4, mut v6) = (dual(Family::Ipv4), dual(Family::Ipv6));
        v6.lease = None;
        v6.lease6 = Some(Box::new(crate::lease::v6::tests::lease()));
        let single = record("c2", "eth0", [192, 0, 2, 8]);
        for r in [&v4, &v6, &single] {
            store.save(r).unwrap();
        }
        let mut names: Vec<String> = fs::read_dir(store.leases_dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.'))
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["c1@eth0@ipv4.json", "c1@eth0@ipv6.json", "c2@eth0.json"]
        );
        let loaded = store.load_all().unwrap().records;
        let families: Vec<_> = loaded
            .iter()
            .map(|r| (r.container_id.as_str(), r.family()))
            .collect();
        assert_eq!(
            families,
            [
                ("c1", Family::Ipv4),
                ("c1", Family::Ipv6),
                ("c2", Family::Ipv4)
            ]
        );
        assert_eq!(loaded[1].lease6, v6.lease6);
        assert!(store.delete(&v6.key().unwrap()).unwrap());
        assert_eq!(store.load_all().unwrap().records.len(), 2);
        // The IPv4 record renamed as the attachment's one record: set aside.
        fs::rename(
            store.leases_dir().join("c1@eth0@ipv4.json"),
            store.leases_dir().join("c1@eth0.json"),
        )
        .unwrap();
        let report = store.load_all().unwrap();
        assert_eq!(report.records.len(), 1);
        assert_eq!(report.quarantined.len(), 1);
    }

    /// A DHCPv6 lease keeps where its REPLY came from (IPv6 and Ethernet
    /// source) through the store; a record written before it was kept
    /// (no `server_source` in `lease6`) loads, knowing none.
    #[test]
    fn a_dhcpv6_leases_reply_source_is_stored_and_an_older_record_still_loads() {
        let dir = tempfile::tempdir().unwrap();
        let store = LeaseStore::open(dir.path()).unwrap();
        let mut r = record("c6", "eth0", [192, 0, 2, 9]);
        r.network.ipam.family = Family::Ipv6;
        r.lease = None;
        let mut l6 = crate::lease::v6::tests::lease();
        l6.server_source = Some(xdhcp_engine::v6::Source::new(
            "fe80::53".parse().unwrap(),
            Some([2, 0, 0x5e, 0, 0x53, 1]),
        ));
        r.lease6 = Some(Box::new(l6));
        store.save(&r).unwrap();
        let path = store.leases_dir().join("c6@eth0.json");
        let mut json: serde_json::Value =
            serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        assert_eq!(
            json["lease6"]["server_source"],
            serde_json::json!({"ip": "fe80::53", "mac": [2, 0, 0x5e, 0, 0x53, 1]})
        );
        let loaded = store.load_all().unwrap().records;
        assert_eq!(loaded.len(), 1);
        assert_eq!(loaded[0].lease6, r.lease6);

        // As an older agent wrote it.
        json["lease6"]
            .as_object_mut()
            .unwrap()
            .remove("server_source");
        fs::write(&path, serde_json::to_vec(&json).unwrap()).unwrap();
        let report = store.load_all().unwrap();
        assert!(report.quarantined.is_empty(), "{:?}", report.quarantined);
        let old = report.records[0].lease6.as_deref().unwrap();
        assert_eq!(old.server_source, None);
        assert_eq!(old.address, r.lease6.as_deref().unwrap().address);
    }

    #[test]
    fn the_uplink_is_kept_and_records_without_it_still_load() {
        let dir = tempfile::tempdir().unwrap();
        let store = LeaseStore::open(dir.path()).unwrap();
        let mut rec = record("c-up", "eth0", [192, 0, 2, 9]);
        rec.uplink = Some(UplinkRef {
            ifname: "bond0".into(),
            vlan: Some(100),
        });
        store.save(&rec).unwrap();
        assert_eq!(store.load(&rec.key().unwrap()).unwrap(), Some(rec.clone()));
        // A record as written before uplinks existed: no `uplink` key at all.
        let mut json = serde_json::to_value(&rec).unwrap();
        assert!(json.as_object_mut().unwrap().remove("uplink").is_some());
        std::fs::write(
            store.leases_dir().join("c-up@eth0.json"),
            serde_json::to_vec(&json).unwrap(),
        )
        .unwrap();
        let report = store.load_all().unwrap();
        assert!(report.quarantined.is_empty(), "{:?}", report.quarantined);
        assert_eq!(
            report.records,
            vec![LeaseRecord {
                uplink: None,
                requested: None,
                planned_xids: None,
                lease6: None,
                router6: None,
                lease_family: None,
                ..rec
            }]
        );
    }

    #[test]
    fn a_record_naming_its_requested_address_is_kept_and_one_with_nothing_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let store = LeaseStore::open(dir.path()).unwrap();
        let requesting = LeaseRecord {
            lease: None,
            requested: Some(Ipv4Addr::new(192, 0, 2, 11)),
            planned_xids: None,
            lease6: None,
            router6: None,
            lease_family: None,
            ..record("c-req", "eth0", [192, 0, 2, 11])
        };
        store.save(&requesting).unwrap();
        let json: serde_json::Value = serde_json::from_slice(
            &std::fs::read(store.leases_dir().join("c-req@eth0.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(json["requested"], "192.0.2.11");
        let report = store.load_all().unwrap();
        assert!(report.quarantined.is_empty(), "{:?}", report.quarantined);
        assert_eq!(report.records, vec![requesting.clone()]);

        // Neither a lease nor a requested address: never written, and set
        // aside if found.
        let empty = LeaseRecord {
            requested: None,
            planned_xids: None,
            lease6: None,
            router6: None,
            lease_family: None,
            ..requesting
        };
        assert!(matches!(
            store.save(&empty),
            Err(StoreError::NoLease { .. })
        ));
        std::fs::write(
            store.leases_dir().join("c-req@eth0.json"),
            serde_json::to_vec(&empty).unwrap(),
        )
        .unwrap();
        let report = store.load_all().unwrap();
        assert!(report.records.is_empty());
        assert_eq!(report.quarantined.len(), 1);
        assert_eq!(report.quarantined[0].reason.metric_label(), "no_lease");
    }

    #[test]
    fn save_load_delete_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let store = LeaseStore::open(dir.path()).unwrap();
        let rec = record("c1", "eth0", [192, 0, 2, 10]);
        store.save(&rec).unwrap();
        assert_eq!(store.load(&rec.key().unwrap()).unwrap(), Some(rec.clone()));
        // Overwrite.
        let mut rec2 = rec.clone();
        rec2.lease = Some(lease([192, 0, 2, 11]));
        store.save(&rec2).unwrap();
        assert_eq!(store.load(&rec.key().unwrap()).unwrap(), Some(rec2.clone()));
        let report = store.load_all().unwrap();
        assert_eq!(report.records, vec![rec2]);
        assert!(report.quarantined.is_empty());
        // No temporary files remain besides the pool of spares, mode is 0600.
        let names: Vec<_> = fs::read_dir(store.leases_dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with(".spare.tmp."))
            .collect();
        assert_eq!(names, vec!["c1@eth0.json".to_owned()]);
        let dot_files = fs::read_dir(store.leases_dir())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with('.')
            })
            .count();
        assert_eq!(dot_files, store.spares());
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &fs::metadata(store.path_for(&rec.key().unwrap()))
                .unwrap()
                .permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        assert!(store.delete(&rec.key().unwrap()).unwrap());
        assert!(!store.delete(&rec.key().unwrap()).unwrap());
        assert_eq!(store.load(&rec.key().unwrap()).unwrap(), None);
    }

    /// A record written by the first format (version 1) is still resumed:
    /// same attachment, same lease; it is rewritten in the current format
    /// at its next save.
    #[test]
    fn records_of_the_first_format_are_read_and_upgraded() {
        let dir = tempfile::tempdir().unwrap();
        let store = LeaseStore::open(dir.path()).unwrap();
        let want = record("c1", "eth0", [192, 0, 2, 10]);
        let v1 = serde_json::json!({
            "version": 1,
            "key": {"container_id": "c1", "ifname": "eth0"},
            "attachment": {
                "netns": "/var/run/netns/pod",
                "mac": "02:00:00:00:00:09",
                "pod_namespace": "default",
                "pod_name": "pod-a",
                "pod_uid": "uid-1",
                "network_key": "default/localnet",
                "mode": {"kind": "vm", "vmi_name": "vm-a"},
                "apply": true,
                "cni_config": {"config": want.network, "args": want.args},
            },
            "lease": want.lease,
            "updated_unix_ms": 1_700_000_000_000_u64,
        });
        fs::write(
            store.leases_dir().join("c1@eth0.json"),
            serde_json::to_vec(&v1).unwrap(),
        )
        .unwrap();
        let report = store.load_all().unwrap();
        assert!(report.quarantined.is_empty(), "{:?}", report.quarantined);
        assert_eq!(report.records, vec![want.clone()]);
        store.save(&report.records[0]).unwrap();
        let again: serde_json::Value =
            serde_json::from_slice(&fs::read(store.leases_dir().join("c1@eth0.json")).unwrap())
                .unwrap();
        assert_eq!(again["version"], RECORD_VERSION);
        assert_eq!(store.load(&want.key().unwrap()).unwrap(), Some(want));
    }

    #[test]
    fn record_json_is_readable() {
        let rec = record("c1", "eth0", [192, 0, 2, 10]);
        let json: serde_json::Value = serde_json::to_value(&rec).unwrap();
        assert_eq!(json["containerId"], "c1");
        assert_eq!(json["mac"], "02:00:00:00:00:09");
        assert_eq!(json["workload"]["kind"], "vm");
        assert_eq!(json["version"], RECORD_VERSION);
        assert_eq!(json["lease"]["address"], "192.0.2.10");
    }

    /// The quarantine keeps the newest files, none older than its age
    /// limit; a file without a stamp in its name is aged by its mtime.
    #[test]
    fn the_quarantine_is_pruned_by_age_and_count() {
        let dir = tempfile::tempdir().unwrap();
        let q = quarantine_dir(dir.path());
        fs::create_dir(&q).unwrap();
        let day = 24 * 3600 * 1000;
        let now = unix_ms_now();
        // 70 recent files, 5 older than the limit.
        for i in 0..70u64 {
            fs::write(q.join(format!("c@eth0.json.{}", now - i * 1000)), b"x").unwrap();
        }
        for i in 0..5u64 {
            fs::write(
                q.join(format!("old@eth0.json.{}", now - 31 * day - i)),
                b"x",
            )
            .unwrap();
        }
        fs::write(q.join("learned-bindings.json.notastamp"), b"x").unwrap();
        let removed = prune_quarantine(&q, now);
        let left: Vec<String> = fs::read_dir(&q)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left.len(), QUARANTINE_MAX_FILES, "{left:?}");
        assert_eq!(removed, 70 + 5 + 1 - QUARANTINE_MAX_FILES);
        assert!(left.iter().all(|n| !n.starts_with("old@")), "{left:?}");
        // Pruning again changes nothing; a store opening prunes too.
        assert_eq!(prune_quarantine(&q, now), 0);
        fs::write(q.join(format!("x@eth0.json.{}", 1)), b"x").unwrap();
        LeaseStore::open(dir.path()).unwrap();
        assert_eq!(fs::read_dir(&q).unwrap().count(), QUARANTINE_MAX_FILES);
    }

    #[test]
    fn corrupt_records_are_quarantined_not_fatal() {
        let dir = tempfile::tempdir().unwrap();
        let store = LeaseStore::open(dir.path()).unwrap();
        let good = record("good", "eth0", [192, 0, 2, 10]);
        store.save(&good).unwrap();
        let leases = store.leases_dir().to_path_buf();
        // Truncated JSON.
        let full = serde_json::to_vec(&record("trunc", "eth0", [192, 0, 2, 11])).unwrap();
        fs::write(leases.join("trunc@eth0.json"), &full[..full.len() / 2]).unwrap();
        // Garbage.
        fs::write(leases.join("garbage@eth0.json"), b"\xff\x00not json").unwrap();
        // Key mismatch: a valid record under another name.
        fs::write(
            leases.join("other@eth0.json"),
            serde_json::to_vec(&record("c9", "eth0", [192, 0, 2, 12])).unwrap(),
        )
        .unwrap();
        // Future version.
        let mut v9 = serde_json::to_value(record("v9", "eth0", [192, 0, 2, 13])).unwrap();
        v9["version"] = 9.into();
        fs::write(
            leases.join("v9@eth0.json"),
            serde_json::to_vec(&v9).unwrap(),
        )
        .unwrap();
        // Invalid key inside (path traversal attempt in the record).
        let mut evil = serde_json::to_value(record("evil", "eth0", [192, 0, 2, 14])).unwrap();
        evil["containerId"] = "../../etc".into();
        fs::write(
            leases.join("evil@eth0.json"),
            serde_json::to_vec(&evil).unwrap(),
        )
        .unwrap();
        // Bad file name, too large, symlink, directory.
        fs::write(leases.join("no-key.json"), b"{}").unwrap();
        fs::write(
            leases.join("big@eth0.json"),
            vec![b' '; (MAX_RECORD_BYTES + 1) as usize],
        )
        .unwrap();
        std::os::unix::fs::symlink("/etc/hostname", leases.join("link@eth0.json")).unwrap();
        fs::create_dir(leases.join("dir@eth0.json")).unwrap();

        let report = store.load_all().unwrap();
        assert_eq!(report.records, vec![good.clone()]);
        let mut reasons: Vec<(&str, &'static str)> = report
            .quarantined
            .iter()
            .map(|q| {
                (
                    q.original.file_name().unwrap().to_str().unwrap(),
                    q.reason.metric_label(),
                )
            })
            .collect();
        reasons.sort_unstable();
        assert_eq!(
            reasons,
            vec![
                ("big@eth0.json", "too_large"),
                ("dir@eth0.json", "not_a_file"),
                ("evil@eth0.json", "bad_key"),
                ("garbage@eth0.json", "decode"),
                ("link@eth0.json", "not_a_file"),
                ("no-key.json", "bad_file_name"),
                ("other@eth0.json", "key_mismatch"),
                ("trunc@eth0.json", "decode"),
                ("v9@eth0.json", "version"),
            ]
        );
        assert!(
            report
                .quarantined
                .iter()
                .all(|q| q.moved_to.as_ref().is_some_and(|p| p.exists()))
        );
        assert_eq!(store.quarantined_total(), 9);
        // The symlink target was not touched.
        assert!(Path::new("/etc/hostname").exists());
        // A second load is clean.
        let again = store.load_all().unwrap();
        assert_eq!(again.records, vec![good]);
        assert!(again.quarantined.is_empty());
        assert_eq!(fs::read_dir(store.quarantine_dir()).unwrap().count(), 9);
    }

    #[test]
    fn stale_temporary_files_are_removed_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let store = LeaseStore::open(dir.path()).unwrap();
        let stale = store.leases_dir().join(".c1@eth0.json.tmp.1.0");
        fs::write(&stale, b"{").unwrap();
        // Ignored by load_all while present...
        assert!(store.load_all().unwrap().quarantined.is_empty());
        drop(store);
        // ...and removed when the store is opened again (after a crash).
        let store = LeaseStore::open(dir.path()).unwrap();
        assert!(!stale.exists());
        assert!(store.load_all().unwrap().records.is_empty());
    }

    #[test]
    fn every_save_and_delete_is_fsynced_before_it_returns() {
        let dir = tempfile::tempdir().unwrap();
        let store = LeaseStore::open(dir.path()).unwrap();
        assert_eq!(store.syncs_total(), 0, "opening writes no record");
        // A save: the temporary file, then the directory after the rename.
        store.save(&record("c0", "eth0", [192, 0, 2, 1])).unwrap();
        assert_eq!(store.syncs_total(), 2);
        // A rewrite of the same record is a change like any other.
        store.save(&record("c0", "eth0", [192, 0, 2, 2])).unwrap();
        assert_eq!(store.syncs_total(), 4);
        // A fresh file (pool empty) is fsynced too.
        while store.spares() > 0 {
            lock(&store.pool).pop();
        }
        store.save(&record("c1", "eth0", [192, 0, 2, 3])).unwrap();
        assert_eq!(store.syncs_total(), 6);
        // A delete syncs the directory; deleting nothing syncs nothing.
        assert!(store.delete(&LeaseKey::new("c0", "eth0").unwrap()).unwrap());
        assert_eq!(store.syncs_total(), 7);
        assert!(!store.delete(&LeaseKey::new("c0", "eth0").unwrap()).unwrap());
        assert_eq!(store.syncs_total(), 7);
        let report = store.load_all().unwrap();
        assert_eq!(report.records.len(), 1);
        assert_eq!(
            report.records[0].lease.as_ref().map(|l| l.address),
            Some(Ipv4Addr::new(192, 0, 2, 3))
        );
    }

    #[test]
    fn saves_and_deletes_recycle_spare_files_instead_of_inodes() {
        use std::os::unix::fs::MetadataExt as _;
        let dir = tempfile::tempdir().unwrap();
        let store = LeaseStore::open(dir.path()).unwrap();
        // None at open (the start does not wait for them); ready once
        // replenished, before the first save.
        assert_eq!(store.spares(), 0);
        store.replenish();
        assert_eq!(store.spares(), POOL_TARGET);
        let spare_inodes: std::collections::BTreeSet<u64> = fs::read_dir(store.leases_dir())
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().ino())
            .collect();
        let rec = record("c1", "eth0", [192, 0, 2, 10]);
        store.save(&rec).unwrap();
        assert_eq!(store.spares(), POOL_TARGET - 1);
        // The record took over a spare's inode.
        let ino = fs::metadata(store.path_for(&rec.key().unwrap()))
            .unwrap()
            .ino();
        assert!(spare_inodes.contains(&ino));
        // A delete gives the inode back to the pool; the record is gone.
        assert!(store.delete(&rec.key().unwrap()).unwrap());
        assert_eq!(store.spares(), POOL_TARGET);
        assert_eq!(store.load(&rec.key().unwrap()).unwrap(), None);
        assert!(store.load_all().unwrap().records.is_empty());
        // Reused spares hold only the new record (a deleted one was longer).
        let mut big = record("c2", "eth0", [192, 0, 2, 11]);
        big.args.insert("pad".to_owned(), "x".repeat(4096));
        store.save(&big).unwrap();
        assert!(store.delete(&big.key().unwrap()).unwrap());
        for i in 0..POOL_TARGET + 5 {
            store
                .save(&record(&format!("d{i}"), "eth0", [192, 0, 2, 12]))
                .unwrap();
        }
        let report = store.load_all().unwrap();
        assert_eq!(report.records.len(), POOL_TARGET + 5);
        assert!(report.quarantined.is_empty());
        // The pool ran dry (later saves made new files); replenishing refills it.
        assert_eq!(store.spares(), 0);
        assert_eq!(store.spares_missing(), POOL_TARGET);
        store.replenish();
        assert_eq!(store.spares(), POOL_TARGET);
    }

    /// The pool is topped up when it is nearly empty or the store has been
    /// quiet, not while records are being written: a burst's saves take
    /// spares and its deletes give them back.
    #[test]
    fn the_pool_is_topped_up_only_when_quiet_or_nearly_empty() {
        let dir = tempfile::tempdir().unwrap();
        let store = LeaseStore::open(dir.path()).unwrap();
        assert!(store.replenish_due(Instant::now()), "an empty pool at open");
        store.replenish();
        assert!(
            !store.replenish_due(Instant::now() + POOL_QUIET),
            "a full pool"
        );
        let rec = record("c1", "eth0", [192, 0, 2, 10]);
        // The save counts from its start (however long its syncs take).
        let before_save = Instant::now();
        store.save(&rec).unwrap();
        let after_save = Instant::now();
        assert_eq!(store.spares(), POOL_TARGET - 1);
        assert!(!store.replenish_due(before_save), "just written");
        assert!(
            !store.replenish_due(before_save + POOL_QUIET / 2),
            "written less than the quiet time ago"
        );
        assert!(store.replenish_due(after_save + POOL_QUIET), "quiet since");
        // A delete is a write too, and gives its spare back.
        assert!(store.delete(&rec.key().unwrap()).unwrap());
        assert_eq!(store.spares(), POOL_TARGET);
        assert!(
            !store.replenish_due(Instant::now() + POOL_QUIET),
            "full again"
        );
        // Nearly empty: topped up at once, however busy.
        for i in 0..=POOL_TARGET - POOL_LOW {
            store
                .save(&record(&format!("d{i}"), "eth0", [192, 0, 2, 12]))
                .unwrap();
        }
        assert_eq!(store.spares(), POOL_LOW - 1);
        assert!(store.replenish_due(Instant::now()), "below the low mark");
        store.replenish();
        assert_eq!(store.spares(), POOL_TARGET);
    }

    /// A barrier that counts the files of each batch and the directory
    /// syncs, holds the first batch until released, and fails every batch
    /// once told to.
    #[derive(Debug, Default)]
    struct Gate {
        batches: Mutex<Vec<usize>>,
        dirs: AtomicU64,
        released: Mutex<bool>,
        opened: Condvar,
        fail: std::sync::atomic::AtomicBool,
    }

    #[derive(Debug)]
    struct Gated(std::sync::Arc<Gate>);

    impl Barrier for Gated {
        fn files(&self, files: &[&File]) -> std::io::Result<()> {
            lock(&self.0.batches).push(files.len());
            let mut open = lock(&self.0.released);
            while !*open {
                open = self.0.opened.wait(open).unwrap();
            }
            if self.0.fail.load(Ordering::SeqCst) {
                return Err(std::io::Error::from_raw_os_error(libc::EIO));
            }
            files.iter().try_for_each(|f| f.sync_data())
        }
        fn dir(&self, dir: &Path) -> std::io::Result<()> {
            self.0.dirs.fetch_add(1, Ordering::SeqCst);
            sys::fs::sync_dir(dir)
        }
    }

    impl Gate {
        fn release(&self) {
            *lock(&self.released) = true;
            self.opened.notify_all();
        }
    }

    fn wait_for(what: &str, cond: impl Fn() -> bool) {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !cond() {
            assert!(std::time::Instant::now() < until, "never: {what}");
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    #[test]
    fn saves_queued_behind_a_batch_are_written_with_one_barrier() {
        const N: u8 = 10;
        let dir = tempfile::tempdir().unwrap();
        let gate = std::sync::Arc::new(Gate::default());
        let store = std::sync::Arc::new(
            LeaseStore::open_with(dir.path(), Arc::new(Gated(gate.clone()))).unwrap(),
        );
        let save = |cid: String, last: u8| {
            let store = store.clone();
            std::thread::spawn(move || store.save(&record(&cid, "eth0", [192, 0, 2, last])))
        };
        // The first save writes its batch at once and is held in its barrier.
        let first = save("c0".to_owned(), 100);
        wait_for("the first batch's barrier", || {
            lock(&gate.batches).len() == 1
        });
        // A burst arrives meanwhile: every save queues for the next batch.
        let burst: Vec<_> = (1..=N).map(|i| save(format!("c{i}"), i)).collect();
        wait_for("the burst queued", || store.queued() == usize::from(N));
        assert_eq!(store.syncs_total(), 0, "nothing is durable yet");
        gate.release();
        first.join().unwrap().unwrap();
        for s in burst {
            s.join().unwrap().unwrap();
        }
        // Two batches: the first save alone, then the whole burst.
        assert_eq!(*lock(&gate.batches), [1, usize::from(N)]);
        assert_eq!(gate.dirs.load(Ordering::SeqCst), 2);
        assert_eq!(store.syncs_total(), 4, "not {} (two per save)", 2 * (N + 1));
        let report = store.load_all().unwrap();
        assert!(report.quarantined.is_empty());
        assert_eq!(report.records.len(), usize::from(N) + 1);
        for rec in &report.records {
            let i: u8 = rec.container_id[1..].parse().unwrap();
            let want = if i == 0 { 100 } else { i };
            assert_eq!(
                rec.lease.as_ref().map(|l| l.address),
                Some(Ipv4Addr::new(192, 0, 2, want))
            );
        }
        // Only records and spares are left in the directory.
        assert_eq!(
            fs::read_dir(store.leases_dir()).unwrap().count(),
            usize::from(N) + 1 + store.spares()
        );
    }

    #[test]
    fn a_failed_barrier_fails_every_save_of_its_batch_and_keeps_the_old_records() {
        let dir = tempfile::tempdir().unwrap();
        let gate = std::sync::Arc::new(Gate::default());
        gate.release();
        let store = std::sync::Arc::new(
            LeaseStore::open_with(dir.path(), Arc::new(Gated(gate.clone()))).unwrap(),
        );
        store.save(&record("c1", "eth0", [192, 0, 2, 1])).unwrap();
        gate.fail.store(true, Ordering::SeqCst);
        let err = store
            .save(&record("c1", "eth0", [192, 0, 2, 2]))
            .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("failed to fsync temporary file"),
            "{err}"
        );
        store
            .save(&record("c2", "eth0", [192, 0, 2, 3]))
            .unwrap_err();
        let report = store.load_all().unwrap();
        assert_eq!(report.records.len(), 1, "{:?}", report.records);
        assert_eq!(
            report.records[0].lease.as_ref().map(|l| l.address),
            Some(Ipv4Addr::new(192, 0, 2, 1))
        );
        // No temporary of a failed write is left behind.
        let names: Vec<String> = fs::read_dir(store.leases_dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with(".spare"))
            .collect();
        assert_eq!(names, ["c1@eth0.json"]);
    }

    /// A visible save returns with its record in place while the disk's
    /// barrier is still held (an ADD does not wait for it), and a durable
    /// save's barrier held at the same time does not hold it back; the
    /// barriers follow, and `flush` waits for them.
    #[test]
    fn a_visible_save_is_in_place_before_its_barrier_and_durable_after_flush() {
        let dir = tempfile::tempdir().unwrap();
        let gate = std::sync::Arc::new(Gate::default());
        let store = std::sync::Arc::new(
            LeaseStore::open_with(dir.path(), Arc::new(Gated(gate.clone()))).unwrap(),
        );
        // A durable save held in its barrier.
        let durable = {
            let store = store.clone();
            std::thread::spawn(move || store.save(&record("c0", "eth0", [192, 0, 2, 100])))
        };
        wait_for("the durable batch's barrier", || {
            lock(&gate.batches).len() == 1
        });
        // The visible save returns meanwhile, its record readable.
        let rec = record("c1", "eth0", [192, 0, 2, 1]);
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let (store, rec) = (store.clone(), rec.clone());
            std::thread::spawn(move || tx.send(store.save_as(&rec, Wait::Visible)));
        }
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("the visible save returned with every barrier held")
            .unwrap();
        assert_eq!(store.load(&rec.key().unwrap()).unwrap(), Some(rec.clone()));
        assert_eq!(store.syncs_total(), 0, "nothing is durable yet");
        gate.release();
        durable.join().unwrap().unwrap();
        store.flush();
        // Two barriers for the durable batch, two for the visible one.
        assert_eq!(store.syncs_total(), 4);
        assert_eq!(lock(&gate.batches).len(), 2);
        assert_eq!(store.sync_failures(), 0);
        assert_eq!(store.load_all().unwrap().records.len(), 2);
    }

    /// A visible save whose barrier fails keeps its record (in place, the
    /// agent's death cannot lose it) and is counted; its save had returned.
    #[test]
    fn a_visible_save_whose_barrier_fails_is_counted_and_its_record_kept() {
        let dir = tempfile::tempdir().unwrap();
        let gate = std::sync::Arc::new(Gate::default());
        gate.release();
        gate.fail.store(true, Ordering::SeqCst);
        let store = LeaseStore::open_with(dir.path(), Arc::new(Gated(gate.clone()))).unwrap();
        let rec = record("c1", "eth0", [192, 0, 2, 1]);
        store.save_as(&rec, Wait::Visible).unwrap();
        store.flush();
        assert_eq!(store.sync_failures(), 1);
        assert_eq!(store.syncs_total(), 0);
        assert_eq!(store.load(&rec.key().unwrap()).unwrap(), Some(rec));
    }

    /// Visible saves made at once share one pair of barriers.
    #[test]
    fn visible_saves_made_at_once_share_their_barriers() {
        const N: u8 = 10;
        let dir = tempfile::tempdir().unwrap();
        let gate = std::sync::Arc::new(Gate::default());
        let store = std::sync::Arc::new(
            LeaseStore::open_with(dir.path(), Arc::new(Gated(gate.clone()))).unwrap(),
        );
        // The first batch's barrier is held; the rest are written meanwhile
        // and wait for the syncer together.
        store
            .save_as(&record("c0", "eth0", [192, 0, 2, 100]), Wait::Visible)
            .unwrap();
        wait_for("the first barrier", || lock(&gate.batches).len() == 1);
        for i in 1..=N {
            store
                .save_as(
                    &record(&format!("c{i}"), "eth0", [192, 0, 2, i]),
                    Wait::Visible,
                )
                .unwrap();
        }
        assert_eq!(store.load_all().unwrap().records.len(), usize::from(N) + 1);
        gate.release();
        store.flush();
        assert_eq!(*lock(&gate.batches), [1, usize::from(N)]);
        assert_eq!(store.syncs_total(), 4);
    }

    #[test]
    fn concurrent_saves_never_tear_a_record() {
        let dir = tempfile::tempdir().unwrap();
        let store = std::sync::Arc::new(LeaseStore::open(dir.path()).unwrap());
        let threads: Vec<_> = (0..4u8)
            .map(|t| {
                let store = store.clone();
                std::thread::spawn(move || {
                    for i in 0..25u8 {
                        store
                            .save(&record("c1", "eth0", [192, 0, 2, t * 25 + i]))
                            .unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let report = store.load_all().unwrap();
        assert_eq!(report.records.len(), 1);
        assert!(report.quarantined.is_empty());
    }
}
