//! Pinning of the long-lived maps under the bpffs directory, so counters
//! survive agent restarts: which maps are pinned, with which definitions, and
//! the check that lets a restarted agent reuse or replace what it finds.

use std::path::{Path, PathBuf};

use aya::maps::{MapData, MapType};
use xdhcp_common as common;

use super::error_chain;

/// A map the agent pins, with the definition a pin must have to be reused.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PinnedMap {
    pub name: &'static str,
    pub map_type: MapType,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
}

/// The maps pinned under `--bpffs-dir` (the definitions of `ebpf/src/main.rs`,
/// from the same constants). The ring buffer is not pinned: records left in
/// it by a previous agent (possibly of another record layout) are of no use
/// to the next one, which resumes its leases from the lease store.
pub const PINNED_MAPS: [PinnedMap; 5] = [
    PinnedMap {
        name: common::MAP_COUNTERS,
        map_type: MapType::PerCpuArray,
        key_size: 4,
        value_size: 8,
        max_entries: common::COUNTER_SLOTS,
    },
    PinnedMap {
        name: common::MAP_OWNED,
        map_type: MapType::Hash,
        key_size: 4,
        value_size: size_of::<common::Owned>() as u32,
        max_entries: common::OWNED_CAPACITY,
    },
    PinnedMap {
        name: common::MAP_IFCONFIG,
        map_type: MapType::Hash,
        key_size: 4,
        value_size: size_of::<common::IfConfig>() as u32,
        max_entries: common::IFCONFIG_CAPACITY,
    },
    PinnedMap {
        name: common::MAP_IFCONFIG_DIRECT,
        map_type: MapType::Array,
        key_size: 4,
        value_size: size_of::<common::IfConfig>() as u32,
        max_entries: common::IFCONFIG_DIRECT_SLOTS,
    },
    PinnedMap {
        name: common::MAP_UPLINKS,
        map_type: MapType::Hash,
        key_size: 4,
        value_size: size_of::<common::IfConfig>() as u32,
        max_entries: common::UPLINKS_CAPACITY,
    },
];

/// Whether and where the maps are pinned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pinning {
    /// Nothing pinned, and why.
    Off { reason: String },
    /// [`PINNED_MAPS`] are pinned in `dir`; `reused` were found there with
    /// the right definition (their counters carry on); `replaced` were there
    /// with another definition and were unpinned (name, what differed). The
    /// others were created.
    On {
        dir: PathBuf,
        reused: Vec<&'static str>,
        replaced: Vec<(&'static str, String)>,
    },
}

/// Whether `path` is on a bpffs mount (`statfs(2)` `f_type` is `BPF_FS_MAGIC`).
fn is_bpffs(path: &Path) -> std::io::Result<bool> {
    let st = nix::sys::statfs::statfs(path).map_err(std::io::Error::from)?;
    Ok(st.filesystem_type() == nix::sys::statfs::BPF_FS_MAGIC)
}

/// Prepares `dir` for pinning: it must be on a bpffs mount (if it does not
/// exist, it is created when its parent is on one). Pins already there are
/// checked against [`PINNED_MAPS`]: a pin of the right type, key and value
/// sizes and capacity is reused by the loader (so the counters survive agent
/// restarts); any other pin under one of those names (another version's
/// layout, another program's map, a non-map) is removed with a warning and
/// replaced by a fresh map. Never fails: when pinning is impossible the
/// maps are simply not pinned ([`Pinning::Off`] says why).
pub fn pin_maps(dir: &Path) -> Pinning {
    let off = |reason: String| Pinning::Off { reason };
    if !dir.exists() {
        let Some(parent) = dir.parent() else {
            return off("no parent directory".to_owned());
        };
        match is_bpffs(parent) {
            Ok(true) => {}
            Ok(false) => return off(format!("{} is not on a bpffs mount", parent.display())),
            Err(e) => return off(format!("statfs {}: {e}", parent.display())),
        }
        if let Err(e) = std::fs::create_dir(dir) {
            return off(format!("creating {}: {e}", dir.display()));
        }
    }
    match is_bpffs(dir) {
        Ok(true) => {}
        Ok(false) => return off(format!("{} is not on a bpffs mount", dir.display())),
        Err(e) => return off(format!("statfs {}: {e}", dir.display())),
    }
    let mut reused = Vec::new();
    let mut replaced = Vec::new();
    for spec in PINNED_MAPS {
        let path = dir.join(spec.name);
        if std::fs::symlink_metadata(&path).is_err() {
            continue;
        }
        match pin_mismatch(&path, &spec) {
            None => reused.push(spec.name),
            Some(why) => {
                tracing::warn!(
                    pin = %path.display(),
                    reason = %why,
                    "incompatible pinned map replaced (its contents are lost)"
                );
                if let Err(e) = std::fs::remove_file(&path) {
                    return off(format!("removing {}: {e}", path.display()));
                }
                replaced.push((spec.name, why));
            }
        }
    }
    Pinning::On {
        dir: dir.to_path_buf(),
        reused,
        replaced,
    }
}

/// Why the object pinned at `path` cannot stand for `spec`, or `None`.
fn pin_mismatch(path: &Path, spec: &PinnedMap) -> Option<String> {
    let info = match MapData::from_pin(path).and_then(|m| m.info()) {
        Ok(info) => info,
        Err(e) => return Some(format!("not a readable map pin: {}", error_chain(&e))),
    };
    let got = (
        info.map_type().ok(),
        info.key_size(),
        info.value_size(),
        info.max_entries(),
    );
    let want = (
        Some(spec.map_type),
        spec.key_size,
        spec.value_size,
        spec.max_entries,
    );
    (got != want).then(|| {
        format!(
            "(type, key, value, entries) is {got:?}, expected {want:?}",
            got = (got.0, got.1, got.2, got.3),
            want = (want.0, want.1, want.2, want.3)
        )
    })
}
