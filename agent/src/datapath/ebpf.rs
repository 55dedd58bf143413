//! Loads the embedded eBPF object, attaches it, and reads its ring buffer.
//!
//! One [`Datapath`] holds the loaded programs (XDP, its TC twin and the
//! do-nothing XDP baseline) and their maps. It attaches to any number of
//! interfaces, in the caller's network namespace or in another one, with the
//! default choice per interface (veth → TC, physical NIC / VF → native XDP,
//! anything else → generic XDP) or an override; native XDP that the driver
//! refuses falls back to generic XDP and says so. [`EventReader`] drains the
//! ring buffer through tokio's `AsyncFd` and turns records into
//! [`DhcpEvent`]s; malformed records are counted, never fatal.

use std::collections::HashMap as StdHashMap;
use std::fs::File;
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aya::maps::MapType;
use aya::maps::{Array, HashMap, MapData, MapError, PerCpuArray, RingBuf};
use aya::programs::tc::{SchedClassifierLinkId, TcAttachType, qdisc_add_clsact};
use aya::programs::xdp::XdpLinkId;
use aya::programs::{ProgramError, SchedClassifier, TestRun as _, TestRunOptions, Xdp, XdpMode};
use aya::{Ebpf, EbpfError, EbpfLoader};
use dhcproto::{Decodable as _, Decoder, v4};
use tokio::io::unix::AsyncFd;
use xdhcp_common as common;

use super::frame::{FrameError, parse_udp_frame};
use super::{AttachMode, RxFrame, RxPath, Verdict};

/// The eBPF object built by `agent/build.rs` (empty when `AYA_BUILD_SKIP=1`).
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xdhcp-ebpf"));

/// The embedded eBPF object, for tests that load every program in it.
pub fn embedded_object() -> &'static [u8] {
    EBPF_OBJECT
}

/// Per-interface capture mode, mirrored into the kernel's config map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CaptureMode {
    /// Pass everything, capture nothing.
    Off,
    /// Capture DHCP server→client frames, pass them on.
    Observe,
    /// Capture; drop the frames whose xid is owned, pass all others.
    Intercept,
}

impl CaptureMode {
    const fn to_kernel(self) -> u32 {
        match self {
            Self::Off => common::MODE_OFF,
            Self::Observe => common::MODE_OBSERVE,
            Self::Intercept => common::MODE_INTERCEPT,
        }
    }
}

/// The programs in the object, for [`Datapath::test_run`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgramKind {
    /// The XDP capture program.
    Xdp,
    /// The TC (clsact ingress) capture program.
    Tc,
    /// The do-nothing XDP baseline.
    XdpPass,
}

impl ProgramKind {
    const fn name(self) -> &'static str {
        match self {
            Self::Xdp => common::PROG_XDP,
            Self::Tc => common::PROG_TC,
            Self::XdpPass => common::PROG_XDP_PASS,
        }
    }
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
    #[error("the XDP program is not available on this kernel: {reason}")]
    XdpUnavailable { reason: String },
    #[error("failed to attach {mode} to {ifname}: {source}")]
    Attach {
        ifname: String,
        mode: AttachMode,
        #[source]
        source: ProgramError,
    },
    #[error("failed to detach from {ifname}: {source}")]
    Detach {
        ifname: String,
        #[source]
        source: ProgramError,
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
    #[error("failed to enter network namespace {path}: {source}")]
    Netns {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("test run of {name}: {source}")]
    TestRun {
        name: &'static str,
        #[source]
        source: ProgramError,
    },
    #[error("ring buffer poll: {source}")]
    Poll {
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = EbpfDatapathError> = std::result::Result<T, E>;

/// Where to attach: an interface name, optionally inside another network
/// namespace (`/var/run/netns/<name>` or `/proc/<pid>/ns/net`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AttachTarget {
    pub ifname: String,
    pub netns: Option<PathBuf>,
}

/// Outcome of an attach, for logs and status reporting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    /// Interface index inside the interface's namespace.
    pub ifindex: u32,
    /// What was actually attached.
    pub mode: AttachMode,
    /// Set when native XDP was refused and generic XDP was used instead.
    pub native_refused: Option<String>,
}

enum LinkHandle {
    Xdp(XdpLinkId),
    Tc(SchedClassifierLinkId),
}

struct Attached {
    ifindex: u32,
    mode: AttachMode,
    link: LinkHandle,
}

/// Counters summed over CPUs, one field per kernel outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub passed_not_dhcp: u64,
    pub captured: u64,
    pub dropped_owned: u64,
    pub ringbuf_full: u64,
    pub malformed: u64,
    pub fragment: u64,
    pub mode_off: u64,
    pub passed_unowned: u64,
    pub load_error: u64,
}

impl Counters {
    /// `(label, value)` pairs for metrics.
    pub fn labelled(&self) -> [(&'static str, u64); 9] {
        [
            ("passed_not_dhcp", self.passed_not_dhcp),
            ("captured", self.captured),
            ("dropped_owned", self.dropped_owned),
            ("ringbuf_full", self.ringbuf_full),
            ("malformed", self.malformed),
            ("fragment", self.fragment),
            ("mode_off", self.mode_off),
            ("passed_unowned", self.passed_unowned),
            ("load_error", self.load_error),
        ]
    }
}

/// Result of one `BPF_PROG_TEST_RUN`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TestRunOutcome {
    /// The program's return value (XDP action or TC action as `u32`).
    pub retval: u32,
    /// Average time per repetition, as measured by the kernel.
    pub duration: Duration,
}

/// Shared handle on the kernel xid ownership map (see
/// [`Datapath::xid_ownership`]); clones refer to the same map.
#[derive(Clone)]
pub struct XidOwnership(Arc<Mutex<HashMap<MapData, u32, common::Owned>>>);

impl std::fmt::Debug for XidOwnership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XidOwnership").finish_non_exhaustive()
    }
}

impl XidOwnership {
    /// Registers `xid` (host order, as in `Client::xid()`) as owned by
    /// `ifindex`: in intercept mode the programs drop replies carrying it.
    pub fn own(&self, xid: u32, ifindex: u32) -> Result<()> {
        let value = common::Owned {
            ifindex,
            reserved: 0,
        };
        lock(&self.0)
            .insert(wire_xid(xid), value, 0)
            .map_err(|source| EbpfDatapathError::Map {
                name: common::MAP_OWNED,
                source,
            })
    }

    /// Removes `xid` from the ownership map (absent is fine).
    pub fn disown(&self, xid: u32) -> Result<()> {
        match lock(&self.0).remove(&wire_xid(xid)) {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(source) => Err(EbpfDatapathError::Map {
                name: common::MAP_OWNED,
                source,
            }),
        }
    }
}

/// The loaded eBPF programs and their maps.
pub struct Datapath {
    ebpf: Ebpf,
    xdp_unavailable: Option<String>,
    counters: PerCpuArray<MapData, u64>,
    owned: XidOwnership,
    ifconfig: Mutex<IfConfigMaps>,
    events: Option<RingBuf<MapData>>,
    attached: StdHashMap<AttachTarget, Attached>,
    pinning: Pinning,
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

    /// Where the maps are pinned, if they are.
    pub fn pinning(&self) -> &Pinning {
        &self.pinning
    }

    fn load_with(pinning: Pinning) -> Result<Self> {
        if EBPF_OBJECT.is_empty() {
            return Err(EbpfDatapathError::NoObject);
        }
        let mut loader = EbpfLoader::new();
        if let Pinning::On { dir, .. } = &pinning {
            for spec in PINNED_MAPS {
                loader.map_pin_path(spec.name, dir.join(spec.name));
            }
        }
        let mut ebpf = loader
            .load(EBPF_OBJECT)
            .map_err(|source| EbpfDatapathError::Load { source })?;
        let tc: &mut SchedClassifier = program(&mut ebpf, common::PROG_TC)?;
        tc.load().map_err(|source| EbpfDatapathError::ProgramLoad {
            name: common::PROG_TC,
            source,
        })?;
        let mut xdp_unavailable = None;
        for name in [common::PROG_XDP, common::PROG_XDP_PASS] {
            let xdp: &mut Xdp = program(&mut ebpf, name)?;
            if let Err(source) = xdp.load() {
                tracing::warn!(program = name, error = %source, "XDP program refused by the kernel; TC only");
                xdp_unavailable = Some(format!("{name}: {}", error_chain(&source)));
                break;
            }
        }
        let counters = take_map(&mut ebpf, common::MAP_COUNTERS)?;
        let owned = take_map(&mut ebpf, common::MAP_OWNED)?;
        let ifconfig = IfConfigMaps {
            hash: take_map(&mut ebpf, common::MAP_IFCONFIG)?,
            direct: take_map(&mut ebpf, common::MAP_IFCONFIG_DIRECT)?,
        };
        let events = take_map(&mut ebpf, common::MAP_EVENTS)?;
        let mut dp = Self {
            ebpf,
            xdp_unavailable,
            counters,
            owned: XidOwnership(Arc::new(Mutex::new(owned))),
            ifconfig: Mutex::new(ifconfig),
            events: Some(events),
            attached: StdHashMap::new(),
            pinning,
        };
        if let Pinning::On { reused, .. } = &dp.pinning
            && !reused.is_empty()
        {
            dp.reset_tables()?;
        }
        Ok(dp)
    }

    /// Empties the ownership and interface tables, as reused from pins: the
    /// previous agent's programs were detached when it exited (their links
    /// die with it), its transactions are gone (a restarted agent resumes
    /// leases with new xids), and every interface gets its mode again when
    /// it is re-attached. Old entries would only drop replies to dead xids
    /// and leave modes on ifindexes a new interface may reuse.
    fn reset_tables(&mut self) -> Result<()> {
        {
            let mut owned = lock(&self.owned.0);
            let keys: Vec<u32> = owned.keys().filter_map(std::result::Result::ok).collect();
            for k in keys {
                owned
                    .remove(&k)
                    .or_else(|e| if is_not_found(&e) { Ok(()) } else { Err(e) })
                    .map_err(|source| EbpfDatapathError::Map {
                        name: common::MAP_OWNED,
                        source,
                    })?;
            }
        }
        let stale: Vec<u32> = {
            let cfg = lock(&self.ifconfig);
            cfg.hash
                .keys()
                .filter_map(std::result::Result::ok)
                .collect()
        };
        for ifindex in stale {
            self.clear_mode(ifindex)?;
        }
        // Array slots set without a hash entry (never by this agent, but a
        // pin is outside our control): zero every non-zero slot.
        let mut cfg = lock(&self.ifconfig);
        let off = common::IfConfig {
            mode: common::MODE_OFF,
            reserved: 0,
        };
        for ifindex in 0..common::IFCONFIG_DIRECT_SLOTS {
            let v = cfg
                .direct
                .get(&ifindex, 0)
                .map_err(|source| EbpfDatapathError::Map {
                    name: common::MAP_IFCONFIG_DIRECT,
                    source,
                })?;
            if v != off {
                cfg.set_direct(ifindex, off)?;
            }
        }
        Ok(())
    }

    /// Why the XDP programs could not be loaded, if they could not.
    pub fn xdp_unavailable(&self) -> Option<&str> {
        self.xdp_unavailable.as_deref()
    }

    /// Takes the ring buffer reader (once).
    pub fn take_reader(&mut self) -> Result<Option<EventReader>> {
        match self.events.take() {
            None => Ok(None),
            Some(ring) => Ok(Some(EventReader {
                // SAFETY: the RingBuf owns its map fd and keeps it open for as
                // long as the AsyncFd holds it; nothing else closes or replaces it.
                ring: unsafe { AsyncFd::register(ring) }.map_err(|e| EbpfDatapathError::Poll {
                    source: e.into_parts().1,
                })?,
                stats: ReaderStats::default(),
            })),
        }
    }

    /// Sets the capture mode of `ifindex` (an index in the interface's own
    /// namespace; the map is keyed by ifindex alone, see `docs/kernel.md`).
    pub fn set_mode(&self, ifindex: u32, mode: CaptureMode) -> Result<()> {
        let cfg = common::IfConfig {
            mode: mode.to_kernel(),
            reserved: 0,
        };
        let mut maps = lock(&self.ifconfig);
        maps.hash
            .insert(ifindex, cfg, 0)
            .map_err(|source| EbpfDatapathError::Map {
                name: common::MAP_IFCONFIG,
                source,
            })?;
        maps.set_direct(ifindex, cfg)
    }

    /// The mode set for `ifindex`, if any (`None`: the programs treat it as off).
    pub fn mode(&self, ifindex: u32) -> Result<Option<CaptureMode>> {
        match lock(&self.ifconfig).hash.get(&ifindex, 0) {
            Ok(cfg) => Ok(Some(match cfg.mode {
                common::MODE_OBSERVE => CaptureMode::Observe,
                common::MODE_INTERCEPT => CaptureMode::Intercept,
                _ => CaptureMode::Off,
            })),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(source) => Err(EbpfDatapathError::Map {
                name: common::MAP_IFCONFIG,
                source,
            }),
        }
    }

    /// Forgets the mode of `ifindex` (the programs then treat it as off).
    pub fn clear_mode(&self, ifindex: u32) -> Result<()> {
        let mut maps = lock(&self.ifconfig);
        // The mirror first: the programs prefer it for small ifindexes.
        maps.set_direct(
            ifindex,
            common::IfConfig {
                mode: common::MODE_OFF,
                reserved: 0,
            },
        )?;
        match maps.hash.remove(&ifindex) {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(source) => Err(EbpfDatapathError::Map {
                name: common::MAP_IFCONFIG,
                source,
            }),
        }
    }

    /// Registers `xid` (host order, as in `Client::xid()`) as owned: in
    /// intercept mode the programs drop replies carrying it.
    pub fn own_xid(&self, xid: u32, ifindex: u32) -> Result<()> {
        self.owned.own(xid, ifindex)
    }

    /// Removes `xid` from the ownership map (absent is fine).
    pub fn disown_xid(&self, xid: u32) -> Result<()> {
        self.owned.disown(xid)
    }

    /// A handle on the xid ownership map that works without this
    /// `Datapath`: callers keeping the datapath behind a lock can register
    /// xids while an attach (netlink work, milliseconds) holds that lock.
    pub fn xid_ownership(&self) -> XidOwnership {
        self.owned.clone()
    }

    /// Reads the per-CPU counters and sums them.
    pub fn counters(&self) -> Result<Counters> {
        let sum = |index: u32| -> Result<u64> {
            let values = self
                .counters
                .get(&index, 0)
                .map_err(|source| EbpfDatapathError::Map {
                    name: common::MAP_COUNTERS,
                    source,
                })?;
            Ok(values.iter().copied().fold(0u64, u64::wrapping_add))
        };
        Ok(Counters {
            passed_not_dhcp: sum(common::COUNTER_PASS_NOT_DHCP)?,
            captured: sum(common::COUNTER_CAPTURED)?,
            dropped_owned: sum(common::COUNTER_DROPPED_OWNED)?,
            ringbuf_full: sum(common::COUNTER_RINGBUF_FULL)?,
            malformed: sum(common::COUNTER_MALFORMED)?,
            fragment: sum(common::COUNTER_FRAGMENT)?,
            mode_off: sum(common::COUNTER_MODE_OFF)?,
            passed_unowned: sum(common::COUNTER_PASSED_UNOWNED)?,
            load_error: sum(common::COUNTER_LOAD_ERROR)?,
        })
    }

    /// Attaches to `target` with `mode` (or the default choice for the
    /// interface when `None`) and sets its capture mode. Native XDP refused by
    /// the driver falls back to generic XDP; the returned [`Attachment`] says
    /// what was attached.
    pub fn attach(
        &mut self,
        target: &AttachTarget,
        mode: Option<AttachMode>,
        capture: CaptureMode,
    ) -> Result<Attachment> {
        if let Some(a) = self.attached.get(target) {
            return Err(EbpfDatapathError::AlreadyAttached {
                ifname: target.ifname.clone(),
                mode: a.mode,
            });
        }
        let ifname = target.ifname.clone();
        let xdp_ok = self.xdp_unavailable.is_none();
        let ebpf = &mut self.ebpf;
        let (attached, refused) = in_netns(target.netns.as_deref(), move || {
            let (ifindex, kind) = interface_kind(&ifname)?;
            let wanted = mode.unwrap_or_else(|| default_attach_mode(kind));
            let wanted = match wanted {
                AttachMode::XdpNative | AttachMode::XdpGeneric if !xdp_ok => AttachMode::Tc,
                m => m,
            };
            attach_here(ebpf, &ifname, ifindex, wanted)
        })??;
        // Mode before anything is captured: set it now that the ifindex is known.
        if let Err(e) = self.set_mode(attached.ifindex, capture) {
            if let Err(undo) = self.detach_attached(target, attached) {
                tracing::error!(ifname = %target.ifname, netns = ?target.netns, error = %undo,
                    "could not detach after failing to set the capture mode");
            }
            return Err(e);
        }
        let out = Attachment {
            ifindex: attached.ifindex,
            mode: attached.mode,
            native_refused: refused,
        };
        if let Some(reason) = &out.native_refused {
            tracing::warn!(ifname = %target.ifname, netns = ?target.netns, mode = %out.mode, reason = %reason,
                "native XDP refused, attached generic XDP");
        } else {
            tracing::info!(ifname = %target.ifname, netns = ?target.netns, mode = %out.mode, "attached");
        }
        self.attached.insert(target.clone(), attached);
        Ok(out)
    }

    /// Detaches from `target` and clears its mode.
    pub fn detach(&mut self, target: &AttachTarget) -> Result<()> {
        let attached =
            self.attached
                .remove(target)
                .ok_or_else(|| EbpfDatapathError::NotAttached {
                    ifname: target.ifname.clone(),
                })?;
        let ifindex = attached.ifindex;
        self.detach_attached(target, attached)?;
        // The mode map is keyed by ifindex alone: keep the entry while an
        // interface with the same index in another namespace is attached.
        if self.attached.values().any(|a| a.ifindex == ifindex) {
            return Ok(());
        }
        self.clear_mode(ifindex)
    }

    /// Attach modes per target, for status reporting.
    pub fn attachments(&self) -> Vec<(AttachTarget, u32, AttachMode)> {
        self.attached
            .iter()
            .map(|(t, a)| (t.clone(), a.ifindex, a.mode))
            .collect()
    }

    fn detach_attached(&mut self, target: &AttachTarget, attached: Attached) -> Result<()> {
        let ifname = target.ifname.clone();
        let ebpf = &mut self.ebpf;
        in_netns(target.netns.as_deref(), move || {
            let res = match attached.link {
                LinkHandle::Xdp(id) => program::<Xdp>(ebpf, common::PROG_XDP)?.detach(id),
                LinkHandle::Tc(id) => program::<SchedClassifier>(ebpf, common::PROG_TC)?.detach(id),
            };
            res.map_err(|source| EbpfDatapathError::Detach { ifname, source })
        })?
    }

    /// Runs a program once per repetition on `data` with `BPF_PROG_TEST_RUN`
    /// (the ingress ifindex is the loopback device of the caller's namespace).
    pub fn test_run(
        &mut self,
        kind: ProgramKind,
        data: &[u8],
        repeat: u32,
    ) -> Result<TestRunOutcome> {
        self.test_run_ctx(kind, data, repeat, None)
    }

    /// Like [`Datapath::test_run`], as if the frame arrived on `ifindex`
    /// (rx queue 0), a device of the caller's namespace.
    pub fn test_run_on(
        &mut self,
        kind: ProgramKind,
        data: &[u8],
        repeat: u32,
        ifindex: u32,
    ) -> Result<TestRunOutcome> {
        let mut ctx = Vec::with_capacity(44);
        match kind {
            // struct xdp_md { data, data_end, data_meta, ingress_ifindex,
            // rx_queue_index, egress_ifindex }
            ProgramKind::Xdp | ProgramKind::XdpPass => {
                let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
                for v in [0, len, 0, ifindex, 0, 0] {
                    ctx.extend_from_slice(&v.to_ne_bytes());
                }
            }
            // struct __sk_buff up to `ifindex` (offset 40); the kernel
            // zero-fills the rest.
            ProgramKind::Tc => {
                ctx.resize(40, 0);
                ctx.extend_from_slice(&ifindex.to_ne_bytes());
            }
        }
        self.test_run_ctx(kind, data, repeat, Some(&ctx))
    }

    fn test_run_ctx(
        &mut self,
        kind: ProgramKind,
        data: &[u8],
        repeat: u32,
        ctx_in: Option<&[u8]>,
    ) -> Result<TestRunOutcome> {
        let name = kind.name();
        let opts = TestRunOptions {
            data_in: Some(data),
            ctx_in,
            repeat,
            ..TestRunOptions::default()
        };
        let res = match kind {
            ProgramKind::Tc => program::<SchedClassifier>(&mut self.ebpf, name)?.test_run(opts),
            ProgramKind::Xdp | ProgramKind::XdpPass => {
                if let Some(reason) = &self.xdp_unavailable {
                    return Err(EbpfDatapathError::XdpUnavailable {
                        reason: reason.clone(),
                    });
                }
                program::<Xdp>(&mut self.ebpf, name)?.test_run(opts)
            }
        }
        .map_err(|source| EbpfDatapathError::TestRun { name, source })?;
        Ok(TestRunOutcome {
            retval: res.return_value,
            duration: res.duration,
        })
    }
}

/// The per-interface mode maps: the hash map is the source of truth (it
/// knows "never set" from "off"); the array mirrors it for ifindexes below
/// [`common::IFCONFIG_DIRECT_SLOTS`], where the programs read the array.
struct IfConfigMaps {
    hash: HashMap<MapData, u32, common::IfConfig>,
    direct: Array<MapData, common::IfConfig>,
}

impl IfConfigMaps {
    /// Mirrors `cfg` into the array when `ifindex` has a slot there.
    fn set_direct(&mut self, ifindex: u32, cfg: common::IfConfig) -> Result<()> {
        if ifindex >= common::IFCONFIG_DIRECT_SLOTS {
            return Ok(());
        }
        self.direct
            .set(ifindex, cfg, 0)
            .map_err(|source| EbpfDatapathError::Map {
                name: common::MAP_IFCONFIG_DIRECT,
                source,
            })
    }
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
/// from the same constants). The ring buffer is not pinned: records left in
/// it by a previous agent (possibly of another record layout) are of no use
/// to the next one, which resumes its leases from the lease store.
pub const PINNED_MAPS: [PinnedMap; 4] = [
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave a map handle inconsistent.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Deleting an absent key: aya reports `ENOENT` from `bpf_map_delete_elem`.
fn is_not_found(e: &MapError) -> bool {
    match e {
        MapError::KeyNotFound => true,
        MapError::SyscallError(s) => s.io_error.raw_os_error() == Some(libc::ENOENT),
        _ => false,
    }
}

/// The ownership map is keyed by the xid bytes as they appear on the wire.
fn wire_xid(xid: u32) -> u32 {
    u32::from_ne_bytes(xid.to_be_bytes())
}

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

fn program<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut T>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program>,
{
    ebpf.program_mut(name)
        .and_then(|p| p.try_into().ok())
        .ok_or(EbpfDatapathError::MissingProgram { name })
}

fn take_map<T>(ebpf: &mut Ebpf, name: &'static str) -> Result<T>
where
    T: TryFrom<aya::maps::Map, Error = MapError>,
{
    let map = ebpf
        .take_map(name)
        .ok_or(EbpfDatapathError::MissingMap { name })?;
    T::try_from(map).map_err(|source| EbpfDatapathError::Map { name, source })
}

/// Runs `f` on a dedicated scoped thread inside `netns` (or directly when
/// `None`). The caller's thread never changes namespace.
fn in_netns<T: Send>(netns: Option<&Path>, f: impl FnOnce() -> T + Send) -> Result<T> {
    let Some(path) = netns else {
        return Ok(f());
    };
    let file = File::open(path).map_err(|source| EbpfDatapathError::Netns {
        path: path.to_path_buf(),
        source,
    })?;
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: setns on this thread only; the fd is valid for the call.
            if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(EbpfDatapathError::Netns {
                    path: path.to_path_buf(),
                    source: std::io::Error::last_os_error(),
                });
            }
            Ok(f())
        })
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// What kind of device an interface is, for the default attach choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InterfaceKind {
    /// A veth end.
    Veth,
    /// A device with a bus address: a physical NIC or an SR-IOV VF netdev.
    Hardware,
    /// Anything else (bridge, macvlan, tun/tap, dummy, ...).
    Other,
}

/// The default attach choice: veth → TC (native XDP on veth costs the pod's
/// TCP throughput dearly), hardware → native XDP, anything else → generic XDP.
pub const fn default_attach_mode(kind: InterfaceKind) -> AttachMode {
    match kind {
        InterfaceKind::Veth => AttachMode::Tc,
        InterfaceKind::Hardware => AttachMode::XdpNative,
        InterfaceKind::Other => AttachMode::XdpGeneric,
    }
}

/// Classifies a device from its ethtool driver name and bus address.
pub fn classify_driver(driver: &str, bus_info: &str) -> InterfaceKind {
    if driver == "veth" {
        InterfaceKind::Veth
    } else if !bus_info.is_empty() && bus_info != "N/A" && !bus_info.starts_with("tap") {
        InterfaceKind::Hardware
    } else {
        InterfaceKind::Other
    }
}

/// `struct ethtool_drvinfo` from `<linux/ethtool.h>`.
#[repr(C)]
struct EthtoolDrvinfo {
    cmd: u32,
    driver: [u8; 32],
    version: [u8; 32],
    fw_version: [u8; 32],
    bus_info: [u8; 32],
    erom_version: [u8; 32],
    reserved2: [u8; 12],
    n_priv_flags: u32,
    n_stats: u32,
    testinfo_len: u32,
    eedump_len: u32,
    regdump_len: u32,
}

const ETHTOOL_GDRVINFO: u32 = 0x0000_0003;
const SIOCETHTOOL: libc::c_ulong = 0x8946;

/// ifindex and kind of `ifname` in the current thread's namespace.
fn interface_kind(ifname: &str) -> Result<(u32, InterfaceKind)> {
    let no_if = |source| EbpfDatapathError::NoInterface {
        ifname: ifname.to_owned(),
        source,
    };
    let c_name = std::ffi::CString::new(ifname)
        .map_err(|e| no_if(std::io::Error::new(std::io::ErrorKind::InvalidInput, e)))?;
    // SAFETY: valid NUL-terminated string.
    let ifindex = unsafe { libc::if_nametoindex(c_name.as_ptr()) };
    if ifindex == 0 {
        return Err(no_if(std::io::Error::last_os_error()));
    }
    // SAFETY: plain socket(2) call; the fd is owned below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(no_if(std::io::Error::last_os_error()));
    }
    // SAFETY: fd was just created and is owned by nobody else.
    let sock = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    // SAFETY: zeroed is a valid EthtoolDrvinfo / ifreq.
    let mut info: EthtoolDrvinfo = unsafe { std::mem::zeroed() };
    info.cmd = ETHTOOL_GDRVINFO;
    // SAFETY: see above.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr
        .ifr_name
        .iter_mut()
        .zip(ifname.bytes().take(libc::IFNAMSIZ - 1))
    {
        *dst = src as libc::c_char;
    }
    ifr.ifr_ifru.ifru_data = (&raw mut info).cast();
    // SAFETY: SIOCETHTOOL with a valid ifreq pointing at a drvinfo buffer.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), SIOCETHTOOL, &raw mut ifr) };
    if rc != 0 {
        // Devices without ethtool support (e.g. some virtual ones): "other".
        return Ok((ifindex, InterfaceKind::Other));
    }
    let cstr = |b: &[u8]| {
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        String::from_utf8_lossy(&b[..end]).into_owned()
    };
    Ok((
        ifindex,
        classify_driver(&cstr(&info.driver), &cstr(&info.bus_info)),
    ))
}

/// Attaches in the current thread's namespace. Returns what was attached and
/// the native-XDP refusal reason when it fell back to generic.
fn attach_here(
    ebpf: &mut Ebpf,
    ifname: &str,
    ifindex: u32,
    mode: AttachMode,
) -> Result<(Attached, Option<String>)> {
    let attach_err = |mode, source| EbpfDatapathError::Attach {
        ifname: ifname.to_owned(),
        mode,
        source,
    };
    match mode {
        AttachMode::Tc => {
            let prog: &mut SchedClassifier = program(ebpf, common::PROG_TC)?;
            let id = match prog.attach(ifname, TcAttachType::Ingress) {
                Ok(id) => id,
                Err(first) => {
                    // Before TCX (kernel < 6.6) a clsact qdisc is needed first.
                    if qdisc_add_clsact(ifname).is_err() {
                        return Err(attach_err(mode, first));
                    }
                    prog.attach(ifname, TcAttachType::Ingress)
                        .map_err(|e| attach_err(mode, e))?
                }
            };
            Ok((
                Attached {
                    ifindex,
                    mode,
                    link: LinkHandle::Tc(id),
                },
                None,
            ))
        }
        AttachMode::XdpNative | AttachMode::XdpGeneric => {
            let prog: &mut Xdp = program(ebpf, common::PROG_XDP)?;
            if mode == AttachMode::XdpNative {
                match prog.attach_to_if_index(ifindex, XdpMode::Driver) {
                    Ok(id) => {
                        return Ok((
                            Attached {
                                ifindex,
                                mode,
                                link: LinkHandle::Xdp(id),
                            },
                            None,
                        ));
                    }
                    Err(e) => {
                        let reason = error_chain(&e);
                        let id = prog
                            .attach_to_if_index(ifindex, XdpMode::Skb)
                            .map_err(|e| attach_err(AttachMode::XdpGeneric, e))?;
                        return Ok((
                            Attached {
                                ifindex,
                                mode: AttachMode::XdpGeneric,
                                link: LinkHandle::Xdp(id),
                            },
                            Some(reason),
                        ));
                    }
                }
            }
            let id = prog
                .attach_to_if_index(ifindex, XdpMode::Skb)
                .map_err(|e| attach_err(mode, e))?;
            Ok((
                Attached {
                    ifindex,
                    mode,
                    link: LinkHandle::Xdp(id),
                },
                None,
            ))
        }
        AttachMode::AfPacket => Err(EbpfDatapathError::NotEbpf { mode }),
    }
}

// ------------------------------------------------------------ ring reader --

/// A captured DHCP reply, decoded.
#[derive(Debug, Clone)]
pub struct DhcpEvent {
    pub frame: RxFrame,
    /// The DHCP message decoded from `frame.payload`.
    pub message: v4::Message,
    /// Receive queue the frame arrived on.
    pub rx_queue: u32,
    /// The xid was in the ownership map when the frame was seen.
    pub owned: bool,
    /// Captured by the TC program (else by XDP).
    pub via_tc: bool,
}

/// Why a ring-buffer record could not become a [`DhcpEvent`].
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("record of {len} bytes, expected {min}..={max}")]
    Size { len: usize, min: usize, max: usize },
    #[error("record claims {captured_len} captured bytes (room for {max})")]
    CapturedLen { captured_len: u32, max: usize },
    #[error("frame of {frame_len} bytes only partly captured")]
    Truncated { frame_len: u32 },
    #[error("captured frame: {source}")]
    Frame {
        #[source]
        source: FrameError,
    },
    #[error("DHCP message: {source}")]
    Dhcp {
        #[source]
        source: dhcproto::error::DecodeError,
    },
}

impl RecordError {
    /// Stable label for metrics.
    pub const fn label(&self) -> &'static str {
        match self {
            Self::Size { .. } => "size",
            Self::CapturedLen { .. } => "captured_len",
            Self::Truncated { .. } => "truncated",
            Self::Frame { .. } => "frame",
            Self::Dhcp { .. } => "dhcp",
        }
    }
}

/// Records read and rejected by an [`EventReader`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReaderStats {
    pub events: u64,
    /// Rejected records by [`RecordError::label`].
    pub errors: StdHashMap<&'static str, u64>,
}

/// Decodes one ring-buffer record: a [`common::CaptureHeader`], then a frame
/// area of any length up to [`common::MAX_FRAME_LEN`] (the programs size
/// records by [`common::FRAME_BUCKETS`]; any length is accepted here).
pub fn decode_record(bytes: &[u8]) -> Result<DhcpEvent, RecordError> {
    let (min, max) = (
        common::CAPTURE_HEADER_LEN,
        common::CAPTURE_HEADER_LEN + common::MAX_FRAME_LEN,
    );
    if bytes.len() < min || bytes.len() > max {
        return Err(RecordError::Size {
            len: bytes.len(),
            min,
            max,
        });
    }
    let (head, frame) = bytes.split_at(common::CAPTURE_HEADER_LEN);
    // SAFETY: `head` has exactly size_of::<CaptureHeader>() bytes, and the
    // header is a Pod made of integers (any bit pattern is valid).
    let ev: common::CaptureHeader = unsafe { std::ptr::read_unaligned(head.as_ptr().cast()) };
    let captured = ev.captured_len as usize;
    if captured > frame.len() {
        return Err(RecordError::CapturedLen {
            captured_len: ev.captured_len,
            max: frame.len(),
        });
    }
    if ev.flags & common::FLAG_TRUNCATED != 0 {
        return Err(RecordError::Truncated {
            frame_len: ev.frame_len,
        });
    }
    let (mut headers, payload) =
        parse_udp_frame(&frame[..captured]).map_err(|source| RecordError::Frame { source })?;
    if ev.flags & common::FLAG_VLAN_OFFLOAD != 0 && ev.vlan != common::VLAN_NONE {
        headers.vlan = Some((ev.vlan & 0x0fff) as u16);
    }
    let message = v4::Message::decode(&mut Decoder::new(payload))
        .map_err(|source| RecordError::Dhcp { source })?;
    let verdict = if ev.verdict == common::VERDICT_DROP {
        Verdict::Drop
    } else {
        Verdict::Pass
    };
    Ok(DhcpEvent {
        frame: RxFrame {
            ifindex: ev.ifindex,
            ts_ns: ev.ts_ns,
            headers,
            payload: payload.to_vec(),
            via: RxPath::Ebpf { verdict },
        },
        message,
        rx_queue: ev.rx_queue,
        owned: ev.flags & common::FLAG_OWNED != 0,
        via_tc: ev.flags & common::FLAG_TC != 0,
    })
}

/// Async reader of the capture ring buffer.
pub struct EventReader {
    ring: AsyncFd<RingBuf<MapData>>,
    stats: ReaderStats,
}

impl std::fmt::Debug for EventReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventReader")
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl EventReader {
    /// Waits for the next decodable event; malformed records are counted in
    /// [`EventReader::stats`] and skipped.
    pub async fn recv(&mut self) -> Result<DhcpEvent> {
        loop {
            if let Some(ev) = self.try_recv() {
                return Ok(ev);
            }
            let mut guard = self
                .ring
                .readable_mut()
                .await
                .map_err(|source| EbpfDatapathError::Poll { source })?;
            if let Some(ev) = Self::drain_one(guard.get_inner_mut(), &mut self.stats) {
                return Ok(ev);
            }
            guard.clear_ready();
        }
    }

    /// Returns the next decodable event already in the ring, without waiting.
    pub fn try_recv(&mut self) -> Option<DhcpEvent> {
        Self::drain_one(self.ring.get_mut(), &mut self.stats)
    }

    fn drain_one(ring: &mut RingBuf<MapData>, stats: &mut ReaderStats) -> Option<DhcpEvent> {
        while let Some(item) = ring.next() {
            match decode_record(&item) {
                Ok(ev) => {
                    stats.events += 1;
                    return Some(ev);
                }
                Err(e) => {
                    tracing::debug!(error = %e, "dropping malformed capture record");
                    *stats.errors.entry(e.label()).or_default() += 1;
                }
            }
        }
        None
    }

    /// Counts of events and rejected records so far.
    pub fn stats(&self) -> &ReaderStats {
        &self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datapath::frame;

    #[test]
    fn default_attach_choice_per_device_kind() {
        assert_eq!(
            default_attach_mode(classify_driver("veth", "")),
            AttachMode::Tc
        );
        assert_eq!(
            default_attach_mode(classify_driver("mlx5_core", "0000:3b:00.2")),
            AttachMode::XdpNative
        );
        assert_eq!(
            default_attach_mode(classify_driver("iavf", "0000:af:02.0")),
            AttachMode::XdpNative
        );
        assert_eq!(
            default_attach_mode(classify_driver("bridge", "N/A")),
            AttachMode::XdpGeneric
        );
        assert_eq!(
            default_attach_mode(classify_driver("tun", "tap")),
            AttachMode::XdpGeneric
        );
        assert_eq!(
            default_attach_mode(classify_driver("macvlan", "")),
            AttachMode::XdpGeneric
        );
    }

    #[test]
    fn xid_is_keyed_in_wire_order() {
        assert_eq!(wire_xid(0x0102_0304).to_ne_bytes(), [1, 2, 3, 4]);
    }

    /// A record as the programs write it: header, then the frame in the
    /// smallest bucket that holds it (the tail is left as garbage, 0xee).
    fn record(frame: &[u8], flags: u32, vlan: u32) -> Vec<u8> {
        let h = common::CaptureHeader {
            ifindex: 7,
            rx_queue: 3,
            ts_ns: 42,
            verdict: common::VERDICT_DROP,
            vlan,
            frame_len: frame.len() as u32,
            captured_len: frame.len() as u32,
            payload_offset: 42,
            payload_len: (frame.len() - 42) as u32,
            xid: 0,
            flags,
        };
        // SAFETY: CaptureHeader is a padding-free Pod.
        let head = unsafe {
            std::slice::from_raw_parts(
                (&raw const h).cast::<u8>(),
                size_of::<common::CaptureHeader>(),
            )
        };
        let mut r = head.to_vec();
        r.extend_from_slice(frame);
        r.resize(common::record_len(frame.len()), 0xee);
        r
    }

    fn offer_frame(xid: u32) -> Vec<u8> {
        use dhcproto::{Encodable as _, Encoder};
        let mut m = v4::Message::default();
        m.set_opcode(v4::Opcode::BootReply).set_xid(xid);
        m.opts_mut()
            .insert(v4::DhcpOption::MessageType(v4::MessageType::Offer));
        let mut payload = Vec::new();
        m.encode(&mut Encoder::new(&mut payload)).unwrap();
        let h = super::super::frame::FrameHeaders {
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [0xff; 6],
            vlan: None,
            src_ip: std::net::Ipv4Addr::new(192, 0, 2, 1),
            dst_ip: std::net::Ipv4Addr::BROADCAST,
            src_port: 67,
            dst_port: 68,
        };
        super::super::frame::build_udp_frame(&h, &payload)
    }

    #[test]
    fn record_decodes_into_an_event() {
        let f = offer_frame(0xabcd);
        let ev = decode_record(&record(
            &f,
            common::FLAG_TC | common::FLAG_OWNED,
            common::VLAN_NONE,
        ))
        .unwrap();
        assert_eq!(ev.message.xid(), 0xabcd);
        assert_eq!(ev.message.opts().msg_type(), Some(v4::MessageType::Offer));
        assert_eq!((ev.frame.ifindex, ev.frame.ts_ns, ev.rx_queue), (7, 42, 3));
        assert_eq!(
            ev.frame.via,
            RxPath::Ebpf {
                verdict: Verdict::Drop
            }
        );
        assert!(ev.owned && ev.via_tc);
        assert_eq!(ev.frame.headers.vlan, None);
        assert_eq!(ev.frame.payload, f[42..]);
    }

    #[test]
    fn vlan_from_metadata_is_reported() {
        let f = offer_frame(1);
        let ev = decode_record(&record(
            &f,
            common::FLAG_TC | common::FLAG_VLAN_OFFLOAD,
            100,
        ))
        .unwrap();
        assert_eq!(ev.frame.headers.vlan, Some(100));
    }

    #[test]
    fn bad_records_are_typed_errors() {
        let f = offer_frame(1);
        let mut r = record(
            &f,
            common::FLAG_XDP | common::FLAG_TRUNCATED,
            common::VLAN_NONE,
        );
        assert_eq!(decode_record(&r).unwrap_err().label(), "truncated");
        r = record(&f, common::FLAG_XDP, common::VLAN_NONE);
        let at = std::mem::offset_of!(common::CaptureHeader, captured_len);
        let room = (r.len() - common::CAPTURE_HEADER_LEN) as u32;
        r[at..at + 4].copy_from_slice(&(room + 1).to_ne_bytes());
        assert_eq!(decode_record(&r).unwrap_err().label(), "captured_len");
        let mut arp = f.clone();
        arp[12] = 0x08;
        arp[13] = 0x06;
        assert_eq!(
            decode_record(&record(&arp, 0, common::VLAN_NONE))
                .unwrap_err()
                .label(),
            "frame"
        );
        let mut garbage = f[..42].to_vec();
        garbage.extend_from_slice(&[0xff; 8]);
        let len = garbage.len() - 14;
        garbage[16..18].copy_from_slice(&(len as u16).to_be_bytes());
        frame::seal_ipv4_header(&mut garbage[14..34]);
        garbage[38..40].copy_from_slice(&16u16.to_be_bytes());
        assert_eq!(
            decode_record(&record(&garbage, 0, common::VLAN_NONE))
                .unwrap_err()
                .label(),
            "dhcp"
        );
    }

    #[test]
    fn short_or_oversized_record_is_a_typed_error() {
        let err = decode_record(&[0; 10]).unwrap_err();
        assert_eq!(err.label(), "size");
        let err =
            decode_record(&vec![0; common::record_len(common::MAX_FRAME_LEN) + 8]).unwrap_err();
        assert_eq!(err.label(), "size");
    }

    #[test]
    fn records_of_every_bucket_decode() {
        for bucket in common::FRAME_BUCKETS {
            let mut f = offer_frame(0x1234);
            // Pad the DHCP message (after END) so the frame fills the bucket.
            let extra = bucket - f.len();
            f.resize(bucket, 0);
            let udp_len = u16::from_be_bytes([f[38], f[39]]) + extra as u16;
            f[38..40].copy_from_slice(&udp_len.to_be_bytes());
            f[40..42].copy_from_slice(&[0, 0]); // no UDP checksum
            let ip_len = u16::from_be_bytes([f[16], f[17]]) + extra as u16;
            f[16..18].copy_from_slice(&ip_len.to_be_bytes());
            frame::seal_ipv4_header(&mut f[14..34]);
            let r = record(&f, common::FLAG_XDP, common::VLAN_NONE);
            assert_eq!(r.len(), common::CAPTURE_HEADER_LEN + bucket);
            let ev = decode_record(&r).unwrap();
            assert_eq!(ev.message.xid(), 0x1234, "bucket {bucket}");
            assert_eq!(ev.frame.payload.len(), bucket - 42);
        }
    }
}
