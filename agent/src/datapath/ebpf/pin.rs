//! Pinning of the long-lived maps under the bpffs directory, so counters
//! survive agent restarts: which maps are pinned, with which definitions, and
//! the check that lets a restarted agent reuse or replace what it finds.

//!
//! Links are pinned too, one pin per attachment, in `links/` under the same
//! directory: named by the attachment's role, a hash of its network
//! namespace and interface name, and its attach mode, so a restarted agent
//! finds the link for each interface it attaches to and takes it over
//! instead of attaching again ([`super::Datapath::attach_as`]). Pins whose
//! link lost its device (the interface or its namespace went while no agent
//! ran) are removed when an attach finds them so, or with the other pins
//! nobody claimed once the resumed leases are attached.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use aya::maps::{MapData, MapType};
use xdhcp_common as common;

use super::{AttachTarget, Role, error_chain};
use crate::datapath::AttachMode;

/// The subdirectory of the pin directory that holds the link pins.
pub const LINKS_DIR: &str = "links";

/// A link pin a previous agent left, live when it was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct LeftLink {
    pub path: PathBuf,
    pub mode: AttachMode,
}

/// The stable key of an attachment's link pin: its role, and a 64-bit
/// FNV-1a hash of its namespace path and interface name (a pod's namespace
/// path, `/var/run/netns/<id>`, lasts as long as the pod; the hash keeps
/// the name short and free of `/`).
pub fn link_key(role: Role, target: &AttachTarget) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let ns = target
        .netns
        .as_deref()
        .map(|p| p.as_os_str().as_encoded_bytes())
        .unwrap_or_default();
    for b in ns.iter().chain(&[0]).chain(target.ifname.as_bytes()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{}-{h:016x}", role.as_str())
}

/// The file name of a link pin: its key and attach mode, joined by `_`
/// (bpffs refuses names with a dot).
pub(super) fn link_pin_name(key: &str, mode: AttachMode) -> String {
    format!("{key}_{mode}")
}

/// The key and attach mode a link pin's file name holds.
pub(super) fn parse_link_pin_name(name: &str) -> Option<(&str, AttachMode)> {
    let (key, mode) = name.rsplit_once('_')?;
    let mode: AttachMode = mode.parse().ok()?;
    let (role, hash) = key.rsplit_once('-')?;
    let known = [Role::Port, Role::Uplink, Role::PortEgress]
        .iter()
        .any(|r| r.as_str() == role);
    (known
        && hash.len() == 16
        && hash.bytes().all(|b| b.is_ascii_hexdigit())
        && mode != AttachMode::AfPacket)
        .then_some((key, mode))
}

/// Removes a link pin (detaching its link unless someone else holds it);
/// absent is fine.
pub(super) fn remove_link_pin(path: &Path) {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(pin = %path.display(), error = %e, "cannot remove a link pin"),
    }
}

/// The link pins in `links_dir`, by key, for the agent to take over as it
/// attaches each interface; files that are not one of this agent's pins
/// are removed. Returns the pins kept and the names removed.
///
/// Only the names are read: whether a pin's link is still on its device
/// is asked when it is taken over ([`super::attach`]: a link whose device
/// went, or is another one, is unpinned there and the interface attached
/// anew), and the pins nobody claims — a deleted pod's, a crashed agent's
/// leftovers — are released with the rest once the resumed leases are
/// attached ([`super::Datapath::release_unclaimed`]). Asking each link at
/// start cost several system calls per pin, on the way to serving.
pub(super) fn scan_link_pins(links_dir: &Path) -> (HashMap<String, LeftLink>, Vec<String>) {
    let mut left = HashMap::new();
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(links_dir) else {
        return (left, removed);
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if let Some((key, mode)) = parse_link_pin_name(&name) {
            left.insert(key.to_owned(), LeftLink { path, mode });
        } else {
            remove_link_pin(&path);
            removed.push(name);
        }
    }
    (left, removed)
}

/// Removes the map pins of `specs` under `dir` (adding each removed to
/// `removed`), then `dir` itself when it is empty; what is already gone,
/// or a directory still busy, is no error.
pub(super) fn remove_map_pins(
    dir: &Path,
    specs: &[PinnedMap],
    removed: &mut Vec<PathBuf>,
) -> std::io::Result<()> {
    for spec in specs {
        let path = dir.join(spec.name);
        match std::fs::remove_file(&path) {
            Ok(()) => removed.push(path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    match std::fs::remove_dir(dir) {
        Err(e)
            if e.kind() != std::io::ErrorKind::NotFound
                && e.raw_os_error() != Some(libc::EBUSY) =>
        {
            Err(e)
        }
        _ => Ok(()),
    }
}

/// Removes everything the capture pins under `dir`: every link pin (which
/// detaches the capture programs), every map pin, then the directories
/// (`dir` itself stays when it is a mount point; the guard's `guard/` must
/// be gone first: `super::unpin_all` does both). Returns what was removed;
/// absent is fine.
pub(super) fn unpin_all(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut removed = Vec::new();
    let links = dir.join(LINKS_DIR);
    match std::fs::read_dir(&links) {
        Ok(entries) => {
            for entry in entries {
                let path = entry?.path();
                // Detached first, so that `unpin` returns with every
                // capture program off its device: the pin's removal alone
                // detaches it only later, from a kernel work queue. A link
                // already defunct (its device gone) has nothing to detach.
                if let Err(e) = crate::sys::bpf::detach_pinned_link(&path) {
                    tracing::debug!(path = %path.display(), error = %e,
                        "link not detached before its pin goes");
                }
                std::fs::remove_file(&path)?;
                removed.push(path);
            }
            std::fs::remove_dir(&links)?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    // The programs pinned for the next agent: unpinned, they go once no
    // link runs them (the links went first).
    let progs = dir.join(super::PROGS_DIR);
    match std::fs::remove_dir_all(&progs) {
        Ok(()) => removed.push(progs),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    remove_map_pins(dir, &PINNED_MAPS, &mut removed)?;
    Ok(removed)
}

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
/// from the same constants). The ring buffer is pinned with them: the
/// capture links a restarted agent takes over keep writing into it while no
/// agent runs, and the next agent's reader drains what arrived meanwhile
/// before anything newer (a record of a layout it does not know is counted
/// and skipped by its decoder).
pub const PINNED_MAPS: [PinnedMap; 7] = [
    PinnedMap {
        name: common::MAP_EVENTS,
        map_type: MapType::RingBuf,
        key_size: 0,
        value_size: 0,
        max_entries: common::EVENTS_BYTES,
    },
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
        name: common::MAP_OWNED6,
        map_type: MapType::Hash,
        key_size: size_of::<common::Owned6Key>() as u32,
        value_size: size_of::<common::Owned>() as u32,
        max_entries: common::OWNED6_CAPACITY,
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
    pin_maps_in(dir, &PINNED_MAPS)
}

/// [`pin_maps`] for any set of maps: `specs` are checked in `dir`, which
/// is made when its parent is on a bpffs (the DHCP guard pins its own maps
/// in a subdirectory, `guard/`).
pub(super) fn pin_maps_in(dir: &Path, specs: &[PinnedMap]) -> Pinning {
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
        match std::fs::create_dir(dir) {
            Ok(()) => {}
            // Made meanwhile (the capture and the guard start side by side).
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return off(format!("creating {}: {e}", dir.display())),
        }
    }
    match is_bpffs(dir) {
        Ok(true) => {}
        Ok(false) => return off(format!("{} is not on a bpffs mount", dir.display())),
        Err(e) => return off(format!("statfs {}: {e}", dir.display())),
    }
    let mut reused = Vec::new();
    let mut replaced = Vec::new();
    for spec in specs {
        let path = dir.join(spec.name);
        if std::fs::symlink_metadata(&path).is_err() {
            continue;
        }
        match pin_mismatch(&path, spec) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn target(ns: Option<&str>, ifname: &str) -> AttachTarget {
        AttachTarget {
            ifname: ifname.to_owned(),
            netns: ns.map(PathBuf::from),
        }
    }

    #[test]
    fn a_link_key_is_stable_and_tells_role_namespace_and_interface_apart() {
        let pod = target(Some("/var/run/netns/cni-1"), "eth0");
        // FNV-1a of "/var/run/netns/cni-1\0eth0": the same in every build.
        assert_eq!(
            link_key(Role::Port, &pod),
            link_key(Role::Port, &pod.clone())
        );
        let keys = [
            link_key(Role::Port, &pod),
            link_key(Role::PortEgress, &pod),
            link_key(Role::Port, &target(Some("/var/run/netns/cni-2"), "eth0")),
            link_key(Role::Port, &target(Some("/var/run/netns/cni-1"), "eth1")),
            link_key(Role::Uplink, &target(None, "eth0")),
            link_key(Role::Port, &target(None, "eth0")),
        ];
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(
            link_key(Role::Uplink, &target(None, "")),
            "uplink-af63bd4c8601b7df"
        );
    }

    #[test]
    fn a_link_pin_name_round_trips_and_foreign_names_are_refused() {
        let key = link_key(Role::PortEgress, &target(Some("/proc/1/ns/net"), "veth1"));
        for mode in [
            AttachMode::Tc,
            AttachMode::XdpNative,
            AttachMode::XdpGeneric,
        ] {
            let name = link_pin_name(&key, mode);
            assert_eq!(parse_link_pin_name(&name), Some((key.as_str(), mode)));
        }
        for bad in [
            "",
            "port-0123456789abcdef",
            "port-0123456789abcdef_af-packet",
            "port-0123456789abcdef_bogus",
            "port-0123456789abcdef.tc",
            "pod-0123456789abcdef_tc",
            "port-0123_tc",
            "port-0123456789abcdeg_tc",
            "XDHCP_OWNED",
        ] {
            assert_eq!(parse_link_pin_name(bad), None, "{bad}");
        }
    }
}
