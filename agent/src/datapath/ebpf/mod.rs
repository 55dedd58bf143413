//! Loads the embedded eBPF object, attaches it, and reads its ring buffer.
//!
//! One [`Datapath`] holds the loaded programs (XDP and its TC twin) and their
//! maps. It attaches to any number of interfaces, in the caller's network
//! namespace or in another one ([`attach`]); it keeps typed handles on the
//! maps ([`maps`]), pinned under the bpffs directory when it can be
//! ([`pin`]); [`EventReader`] drains the ring buffer through tokio's
//! `AsyncFd` and hands each captured frame on, its DHCP payload undecoded
//! ([`reader`]); it and the guard's reader share one drain ([`ring`]).
//!
//! With the `test-hooks` feature (the tests crate turns it on), the object
//! also carries a do-nothing XDP baseline and [`Datapath::test_run`] runs
//! programs with `BPF_PROG_TEST_RUN`; the shipped agent has neither.

mod attach;
mod guard;
mod maps;
mod pin;
mod reader;
mod ring;
#[cfg(feature = "test-hooks")]
mod test_run;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use aya::maps::{MapData, MapError, RingBuf};
use aya::programs::ProgramError;
use aya::{Ebpf, EbpfError, EbpfLoader};
use xdhcp_common as common;

pub use attach::{
    AttachTarget, Attachment, Handover, InterfaceKind, Role, classify_driver, default_attach_mode,
};
#[cfg(feature = "test-hooks")]
pub use guard::GuardProgram;
pub use guard::{
    Carried, Direction, GUARD_PIN_DIR, GUARD_PINNED_MAPS, Guard, GuardCounters, GuardDrop,
    GuardEvent, GuardHook, GuardReader, GuardRecordError, GuardedPortInfo, LearnCounters,
    PortPolicy, decode_guard_record, prepare_port,
};
pub use maps::{CaptureMode, Counters, Ownership, Xid6Ownership, XidOwnership};
pub use pin::{LINKS_DIR, PINNED_MAPS, PinnedMap, Pinning, link_key, pin_maps};
pub use reader::{
    Captured, DhcpEvent, EventReader, ReaderStats, RecordError, decode_captured, decode_record,
};
#[cfg(feature = "test-hooks")]
pub use test_run::{ProgramKind, TestRunOutcome};

use super::AttachMode;
use crate::sys::netns::NetnsError;

/// The eBPF object built by `agent/build.rs` (empty when `AYA_BUILD_SKIP=1`).
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xdhcp-ebpf"));

/// The embedded eBPF object, for tests that load every program in it.
pub fn embedded_object() -> &'static [u8] {
    EBPF_OBJECT
}

/// Errors of the eBPF datapath. Each names what it was doing.
#[derive(Debug, thiserror::Error)]
pub enum EbpfDatapathError {
    /// The agent was built with `AYA_BUILD_SKIP=1`: no object is embedded.
    #[error("this xdhcp binary embeds no eBPF object (built with AYA_BUILD_SKIP=1)")]
    NoObject,
    #[error("failed to load the eBPF object: {source}")]
    Load {
        #[source]
        source: EbpfError,
    },
    #[error("program {name} missing from the eBPF object")]
    MissingProgram { name: &'static str },
    #[error("map {name} missing from the eBPF object")]
    MissingMap { name: &'static str },
    #[error("failed to load program {name} into the kernel: {source}")]
    ProgramLoad {
        name: &'static str,
        #[source]
        source: ProgramError,
    },
    #[error("map {name}: {source}")]
    Map {
        name: &'static str,
        #[source]
        source: MapError,
    },
    #[error("failed to attach {mode} to {ifname}: {source}")]
    Attach {
        ifname: String,
        mode: AttachMode,
        #[source]
        source: ProgramError,
    },
    #[error("attached {mode} to {ifname}, but cannot hold its BPF link: {source}")]
    HoldLink {
        ifname: String,
        mode: AttachMode,
        #[source]
        source: aya::programs::links::LinkError,
    },
    #[error("failed to attach the guard's XDP program to {ifname} through netlink: {source}")]
    AttachXdp {
        ifname: String,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to detach the guard's XDP program from {ifname}: {source}")]
    DetachXdp {
        ifname: String,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to detach from {ifname}: {source}")]
    Detach {
        ifname: String,
        #[source]
        source: ProgramError,
    },
    #[error("cannot make a network namespace to load the TC modules in: {source}")]
    PrepareTc {
        #[source]
        source: std::io::Error,
    },
    #[error("{ifname} is already attached ({mode})")]
    AlreadyAttached { ifname: String, mode: AttachMode },
    #[error("{ifname} is not attached")]
    NotAttached { ifname: String },
    #[error("attach mode {mode} is not an eBPF mode")]
    NotEbpf { mode: AttachMode },
    #[error("interface {ifname} not found: {source}")]
    NoInterface {
        ifname: String,
        #[source]
        source: std::io::Error,
    },
    /// Entering the interface's network namespace failed (the error names it).
    #[error(transparent)]
    Netns { source: NetnsError },
    #[error("ring buffer poll: {source}")]
    Poll {
        #[source]
        source: std::io::Error,
    },
    #[cfg(feature = "test-hooks")]
    #[error("the XDP program is not available on this kernel: {reason}")]
    XdpUnavailable { reason: String },
    #[cfg(feature = "test-hooks")]
    #[error("test run of {name}: {source}")]
    TestRun {
        name: &'static str,
        #[source]
        source: ProgramError,
    },
}

pub type Result<T, E = EbpfDatapathError> = std::result::Result<T, E>;

/// The XDP programs in the object: the capture program, and with
/// `test-hooks` the do-nothing baseline of `bench_xdp`.
#[cfg(not(feature = "test-hooks"))]
const XDP_PROGRAMS: [&str; 2] = [common::PROG_XDP, common::PROG_UPLINK_XDP];
#[cfg(feature = "test-hooks")]
const XDP_PROGRAMS: [&str; 3] = [
    common::PROG_XDP,
    common::PROG_UPLINK_XDP,
    common::PROG_XDP_PASS,
];
/// The TC programs in the object: for workload ports and for uplinks.
const TC_PROGRAMS: [&str; 2] = [common::PROG_TC, common::PROG_UPLINK_TC];

/// The capture's programs: on workload ports (in pods' namespaces, and
/// their host ends) and on uplinks.
const CAPTURE_PROGRAMS: ProgramSet = ProgramSet {
    what: "eBPF",
    tc: &TC_PROGRAMS,
    xdp: &XDP_PROGRAMS,
};

/// A set of programs of the object that one user (the capture, the DHCP
/// guard) loads, pins for the next agent and takes from those pins, by
/// one rule ([`Programs::open`]): the TC programs must load; an XDP
/// program may be refused by an old kernel (then it is neither used nor
/// pinned).
pub(super) struct ProgramSet {
    /// What the set is, in the log ("eBPF", "DHCP guard").
    pub what: &'static str,
    pub tc: &'static [&'static str],
    pub xdp: &'static [&'static str],
}

impl ProgramSet {
    fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.tc.iter().chain(self.xdp).copied()
    }
}

/// Loads the programs of `set` in `ebpf` into the kernel, each on its own
/// thread: the verifier's time is most of a start that has programs to
/// load, and the programs are independent of each other. The TC programs
/// must load; when an XDP program is refused, returns why (TC only then).
fn load_programs(ebpf: &mut Ebpf, set: &ProgramSet) -> Result<Option<String>> {
    let mut outcomes: Vec<(&'static str, std::result::Result<(), ProgramError>)> =
        std::thread::scope(|s| {
            let threads: Vec<_> = ebpf
                .programs_mut()
                .filter_map(|(name, prog)| {
                    let name = set.names().find(|n| *n == name)?;
                    Some((name, prog))
                })
                .map(|(name, prog)| {
                    let t = s.spawn(move || match prog {
                        aya::programs::Program::SchedClassifier(p) => p.load(),
                        aya::programs::Program::Xdp(p) => p.load(),
                        _ => Err(ProgramError::UnexpectedProgramType),
                    });
                    (name, t)
                })
                .collect();
            threads
                .into_iter()
                .map(|(name, t)| {
                    let r = t
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                    (name, r)
                })
                .collect()
        });
    let mut xdp_unavailable = None;
    for name in set.names() {
        let i = outcomes
            .iter()
            .position(|(n, _)| *n == name)
            .ok_or(EbpfDatapathError::MissingProgram { name })?;
        match outcomes.swap_remove(i).1 {
            Ok(()) => {}
            Err(source) if set.xdp.contains(&name) => {
                if xdp_unavailable.is_none() {
                    tracing::warn!(program = name, error = %source, "XDP program refused by the kernel; TC only");
                    xdp_unavailable = Some(format!("{name}: {}", error_chain(&source)));
                }
            }
            Err(source) => return Err(EbpfDatapathError::ProgramLoad { name, source }),
        }
    }
    Ok(xdp_unavailable)
}

/// A set of programs and the maps they use: those of the loaded object,
/// or the same build's programs a previous agent pinned (`progs/<stamp>/`
/// in the pin directory) with the pinned maps they refer to, taken from
/// their pins instead of being loaded and verified again — the object is
/// then not read at all.
pub(super) struct Programs {
    /// The object, when it was loaded (`None`: everything came from pins).
    ebpf: Option<Ebpf>,
    pinned: HashMap<&'static str, aya::programs::Program>,
    /// The maps, opened from their pins when the programs were.
    maps: HashMap<&'static str, aya::maps::Map>,
}

impl Programs {
    /// The programs of `set` and the maps of `specs`: from their pins in
    /// the directory `pinning` names when every map there was reused (the
    /// pinned programs refer to those very maps) and every program of this
    /// build's stamp is pinned; otherwise the object is loaded (`configure`
    /// adjusts its loader; the maps of `specs` are pinned or reused), its
    /// programs loaded and verified, pinned for the next agent, and the
    /// pins of other builds removed (a filter or link that runs one holds
    /// it). The second value says why an XDP program was refused.
    pub(super) fn open(
        set: &ProgramSet,
        pinning: &Pinning,
        specs: &[PinnedMap],
        configure: impl FnOnce(&mut EbpfLoader),
    ) -> Result<(Self, Option<String>)> {
        if EBPF_OBJECT.is_empty() {
            return Err(EbpfDatapathError::NoObject);
        }
        let stamp = object_stamp();
        let started = std::time::Instant::now();
        let (progs_dir, maps_reused) = match pinning {
            Pinning::On {
                dir,
                reused,
                replaced,
            } => (
                Some((dir, dir.join(PROGS_DIR))),
                replaced.is_empty() && specs.iter().all(|m| reused.contains(&m.name)),
            ),
            Pinning::Off { .. } => (None, false),
        };
        if let Some((dir, progs)) = progs_dir.as_ref().filter(|_| maps_reused)
            && let Some(pinned) = programs_from_pins(&progs.join(stamp), set)
            && let Some(maps) = maps_from_pins(dir, specs)
        {
            tracing::info!(%stamp, took = ?started.elapsed(),
                "{} programs of this build taken from their pins (not loaded again)", set.what);
            let me = Self {
                ebpf: None,
                pinned,
                maps,
            };
            return Ok((me, None));
        }
        let mut loader = EbpfLoader::new();
        configure(&mut loader);
        if let Some((dir, _)) = &progs_dir {
            for spec in specs {
                loader.map_pin_path(spec.name, dir.join(spec.name));
            }
        }
        let mut ebpf = loader
            .load(EBPF_OBJECT)
            .map_err(|source| EbpfDatapathError::Load { source })?;
        let xdp_unavailable = load_programs(&mut ebpf, set)?;
        tracing::info!(%stamp, took = ?started.elapsed(), "{} programs loaded", set.what);
        if let Some((_, progs)) = &progs_dir {
            pin_programs(&mut ebpf, progs, stamp, set);
        }
        let me = Self {
            ebpf: Some(ebpf),
            pinned: HashMap::new(),
            maps: HashMap::new(),
        };
        Ok((me, xdp_unavailable))
    }

    /// Whether the programs were taken from their pins.
    pub(super) fn taken_from_pins(&self) -> bool {
        self.ebpf.is_none()
    }

    /// Takes map `name` out (once).
    pub(super) fn take_map<T>(&mut self, name: &'static str) -> Result<T>
    where
        T: TryFrom<aya::maps::Map, Error = MapError>,
    {
        let map = match self.maps.remove(name) {
            Some(m) => m,
            None => self
                .ebpf
                .as_mut()
                .and_then(|e| e.take_map(name))
                .ok_or(EbpfDatapathError::MissingMap { name })?,
        };
        T::try_from(map).map_err(|source| EbpfDatapathError::Map { name, source })
    }

    /// The kernel's id of map `name`, while it has not been taken.
    fn map_id(&self, name: &'static str) -> Option<u32> {
        let map = match self.maps.get(name) {
            Some(m) => m,
            None => self.ebpf.as_ref()?.map(name)?,
        };
        match map {
            aya::maps::Map::RingBuf(data) => data.info().ok().map(|i| i.id()),
            _ => None,
        }
    }
}

/// The program `name`: the pinned one taken over, else the object's.
fn prog<'a, T>(progs: &'a mut Programs, name: &'static str) -> Result<&'a mut T>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program>,
{
    let p = match progs.pinned.get_mut(name) {
        Some(p) => Some(p),
        None => progs.ebpf.as_mut().and_then(|e| e.program_mut(name)),
    };
    p.and_then(|p| p.try_into().ok())
        .ok_or(EbpfDatapathError::MissingProgram { name })
}

/// The subdirectory of a pin directory that holds the programs, one
/// directory per build of the object ([`object_stamp`]): `progs/` for the
/// capture's, `guard/progs/` for the DHCP guard's.
pub const PROGS_DIR: &str = "progs";

/// A stamp of the embedded object: 64-bit FNV-1a of its bytes, in hex,
/// computed when the agent is built. Two agents with the same stamp run
/// the same programs.
pub fn object_stamp() -> &'static str {
    env!("XDHCP_EBPF_STAMP")
}

/// Every program of `set` of this build from its pin in `dir`
/// (`progs/<stamp>`), or `None` when one is missing or unusable (then the
/// object's programs are loaded). An XDP program the kernel refused was not
/// pinned: its absence sends this agent to the loader too, which says why.
fn programs_from_pins(
    dir: &Path,
    set: &ProgramSet,
) -> Option<HashMap<&'static str, aya::programs::Program>> {
    use aya::programs::{Program, SchedClassifier, Xdp};
    use aya_obj::programs::XdpAttachType;
    let mut out = HashMap::new();
    for &name in set.tc {
        let p = SchedClassifier::from_pin(dir.join(name))
            .map_err(|e| tracing::debug!(program = name, error = %e, "no pinned program"))
            .ok()?;
        out.insert(name, Program::SchedClassifier(p));
    }
    for &name in set.xdp {
        let p = Xdp::from_pin(dir.join(name), XdpAttachType::Interface)
            .map_err(|e| tracing::debug!(program = name, error = %e, "no pinned program"))
            .ok()?;
        out.insert(name, Program::Xdp(p));
    }
    Some(out)
}

/// The maps of `specs` from their pins in `dir`, or `None` when one
/// cannot be opened (then the object is loaded, which reuses or replaces
/// them).
fn maps_from_pins(
    dir: &Path,
    specs: &[PinnedMap],
) -> Option<HashMap<&'static str, aya::maps::Map>> {
    specs
        .iter()
        .map(|spec| {
            let path = dir.join(spec.name);
            let map = MapData::from_pin(&path)
                .and_then(aya::maps::Map::from_map_data)
                .map_err(|e| tracing::debug!(pin = %path.display(), error = %e, "no pinned map"))
                .ok()?;
            Some((spec.name, map))
        })
        .collect()
}

/// Pins the loaded programs of `set` in `progs_dir/<stamp>`, for the next
/// agent of this build, and removes the pins of other builds (a link or
/// filter that runs one of those holds it; the pin is not needed for it).
/// A failure is logged: the next agent then loads the programs itself.
fn pin_programs(ebpf: &mut Ebpf, progs_dir: &Path, stamp: &str, set: &ProgramSet) {
    if let Ok(entries) = std::fs::read_dir(progs_dir) {
        for e in entries.flatten() {
            if e.file_name().to_str() != Some(stamp) {
                tracing::info!(pin = %e.path().display(), "removed the program pins of another build");
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    let dir = progs_dir.join(stamp);
    if let Err(e) = std::fs::create_dir_all(&dir) {
        tracing::warn!(dir = %dir.display(), error = %e,
            "cannot make the program pin directory; the next agent loads the programs again");
        return;
    }
    for name in set.names() {
        let path = dir.join(name);
        let _ = std::fs::remove_file(&path);
        let Some(p) = ebpf.program_mut(name) else {
            continue;
        };
        // An XDP program the kernel refused is not loaded: nothing to pin.
        if p.fd().is_err() {
            continue;
        }
        if let Err(e) = p.pin(&path) {
            tracing::warn!(pin = %path.display(), error = %e,
                "cannot pin a program; the next agent loads the programs again");
        }
    }
}

/// The loaded eBPF programs and their maps.
pub struct Datapath {
    ebpf: Programs,
    xdp_unavailable: Option<String>,
    counters: maps::CounterMap,
    /// What the records read so far say (the programs count no capture).
    record_counts: Arc<reader::RecordCounts>,
    owned: XidOwnership,
    owned6: Xid6Ownership,
    ifconfig: Mutex<maps::IfConfigMaps>,
    events: Option<RingBuf<MapData>>,
    /// The kernel's id of the ring buffer map, to open a new reader on it.
    events_id: Option<u32>,
    attached: HashMap<AttachTarget, attach::Attached>,
    pinning: Pinning,
    /// Where the links are pinned (`links/` in the pin directory), when
    /// the maps are.
    links_dir: Option<std::path::PathBuf>,
    /// Live link pins a previous agent left, by [`link_key`], not yet
    /// taken over by an attach; [`Datapath::release_unclaimed`] removes
    /// those nobody claimed.
    inherited: HashMap<String, pin::LeftLink>,
}

impl std::fmt::Debug for Datapath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Datapath")
            .field("xdp_unavailable", &self.xdp_unavailable)
            .field("attached", &self.attached.len())
            .field("pinning", &self.pinning)
            .finish_non_exhaustive()
    }
}

impl Datapath {
    /// Loads the embedded object and all its programs, with no map pinned.
    /// The TC program must load; the XDP programs may be refused by an old
    /// kernel (then every interface gets TC and [`Datapath::xdp_unavailable`]
    /// says why).
    pub fn load() -> Result<Self> {
        Self::load_with(Pinning::Off {
            reason: "not asked to pin".to_owned(),
        })
    }

    /// Like [`Datapath::load`], with the maps of [`PINNED_MAPS`] pinned by
    /// name in `bpffs_dir` when that directory is (or its parent is, and it
    /// can be created) on a bpffs mount; otherwise nothing is pinned and
    /// [`Datapath::pinning`] says why. See [`pin_maps`] for what is reused.
    pub fn load_pinned(bpffs_dir: &Path) -> Result<Self> {
        let pinning = pin_maps(bpffs_dir);
        match &pinning {
            Pinning::Off { reason } => {
                tracing::info!(dir = %bpffs_dir.display(), %reason, "eBPF maps not pinned");
            }
            Pinning::On {
                dir,
                reused,
                replaced,
            } => tracing::info!(
                dir = %dir.display(),
                reused = ?reused,
                replaced = ?replaced,
                "eBPF maps pinned"
            ),
        }
        Self::load_with(pinning)
    }

    /// Whether the programs were taken from the pins a previous agent of
    /// the same build left (not loaded and verified again).
    pub fn programs_from_pins(&self) -> bool {
        self.ebpf.taken_from_pins()
    }

    /// Where the maps are pinned, if they are.
    pub fn pinning(&self) -> &Pinning {
        &self.pinning
    }

    fn load_with(pinning: Pinning) -> Result<Self> {
        // The guard's maps are of no use to the capture's copy of the
        // object: as small as the kernel allows.
        let (mut ebpf, xdp_unavailable) =
            Programs::open(&CAPTURE_PROGRAMS, &pinning, &PINNED_MAPS, |loader| {
                guard::shrink_guard_maps(loader);
            })?;
        let counters = ebpf.take_map(common::MAP_COUNTERS)?;
        let owned = ebpf.take_map(common::MAP_OWNED)?;
        let owned6 = ebpf.take_map(common::MAP_OWNED6)?;
        let ifconfig = maps::IfConfigMaps {
            hash: ebpf.take_map(common::MAP_IFCONFIG)?,
            direct: ebpf.take_map(common::MAP_IFCONFIG_DIRECT)?,
            uplinks: ebpf.take_map(common::MAP_UPLINKS)?,
        };
        let events_id = ebpf.map_id(common::MAP_EVENTS);
        let events = ebpf.take_map(common::MAP_EVENTS)?;
        let owned = XidOwnership::new(owned, common::MAP_OWNED);
        let owned6 = Xid6Ownership::new(owned6, common::MAP_OWNED6);
        let (links_dir, inherited) = match &pinning {
            Pinning::On { dir, reused, .. } => {
                // The tables a previous agent filled stay as they are
                // while its links capture: reconciled once this agent
                // has taken over what it needs (`release_unclaimed`).
                if reused.contains(&common::MAP_OWNED) {
                    owned.mark_inherited();
                }
                if reused.contains(&common::MAP_OWNED6) {
                    owned6.mark_inherited();
                }
                let links = dir.join(LINKS_DIR);
                match std::fs::create_dir(&links) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(e) => tracing::warn!(dir = %links.display(), error = %e,
                        "cannot make the link pin directory; links will not outlive this agent"),
                }
                let (left, removed) = pin::scan_link_pins(&links);
                if !removed.is_empty() {
                    tracing::info!(count = removed.len(), pins = ?removed,
                        "removed files in the link pin directory that are not link pins of this agent");
                }
                if !left.is_empty() {
                    tracing::info!(
                        count = left.len(),
                        "found a previous agent's pinned links; taking them over as their interfaces are attached"
                    );
                }
                (links.is_dir().then_some(links), left)
            }
            Pinning::Off { .. } => (None, HashMap::new()),
        };
        Ok(Self {
            events_id,
            ebpf,
            xdp_unavailable,
            counters,
            record_counts: Arc::default(),
            owned,
            owned6,
            ifconfig: Mutex::new(ifconfig),
            events: Some(events),
            attached: HashMap::new(),
            pinning,
            links_dir,
            inherited,
        })
    }

    /// How many of a previous agent's pinned links are still waiting to be
    /// taken over.
    pub fn unclaimed_links(&self) -> usize {
        self.inherited.len()
    }

    /// Why the XDP programs could not be loaded, if they could not.
    pub fn xdp_unavailable(&self) -> Option<&str> {
        self.xdp_unavailable.as_deref()
    }

    /// Takes the ring buffer reader (once).
    pub fn take_reader(&mut self) -> Result<Option<EventReader>> {
        self.events
            .take()
            .map(|ring| EventReader::new(ring, Arc::clone(&self.record_counts)))
            .transpose()
    }

    /// A new reader on the ring buffer map, after the first one failed.
    pub fn reopen_reader(&self) -> Result<EventReader> {
        let name = common::MAP_EVENTS;
        let id = self
            .events_id
            .ok_or(EbpfDatapathError::MissingMap { name })?;
        let map_err = |source| EbpfDatapathError::Map { name, source };
        let map = MapData::from_id(id).map_err(map_err)?;
        let ring = RingBuf::try_from(aya::maps::Map::RingBuf(map)).map_err(map_err)?;
        EventReader::new(ring, Arc::clone(&self.record_counts))
    }
}

/// Removes everything the agent pins under `dir`, for uninstalling (`xdhcp
/// unpin`; a restarted agent needs it all): first the DHCP guard's programs
/// on the ports its pinned table names, and its pins in [`GUARD_PIN_DIR`],
/// then the capture's link pins (which detaches the capture programs), its
/// map pins and the directories (`dir` itself stays when it is a mount
/// point). Returns what was removed; absent is fine.
pub fn unpin_all(dir: &Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    let mut removed = guard::unpin_guard(&dir.join(GUARD_PIN_DIR))?;
    removed.extend(pin::unpin_all(dir)?);
    Ok(removed)
}

/// `e` and its sources, joined by ": ".
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
