//! Attaching the capture programs to interfaces, in the caller's network
//! namespace or in another one: the default choice per device kind (veth →
//! TC, physical NIC / VF → native XDP, anything else → generic XDP), the
//! fallback from native to generic XDP, and detaching.

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use aya::programs::links::{FdLink, Link as _, LinkError, PinnedLink};
use aya::programs::tc::{
    SchedClassifierLink, SchedClassifierLinkId, TcAttachType, qdisc_add_clsact,
};
use aya::programs::xdp::XdpLink;
use aya::programs::{SchedClassifier, Xdp, XdpMode};
use xdhcp_common as common;

use super::pin::{self, LeftLink};
use super::{CaptureMode, Datapath, EbpfDatapathError, Programs, Result, error_chain, prog};
use crate::datapath::AttachMode;
use crate::netlink::{FilterWatch, TcHook};

/// Where to attach: an interface name, optionally inside another network
/// namespace (`/var/run/netns/<name>` or `/proc/<pid>/ns/net`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AttachTarget {
    pub ifname: String,
    pub netns: Option<PathBuf>,
}

/// What an attachment serves; selects the program pair and its mode map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// A workload port: a pod's interface or a VF netdev (`xdhcp_xdp`,
    /// `xdhcp_tc`; mode in the per-port map).
    Port,
    /// A node uplink in the agent's own namespace (`xdhcp_uplink_xdp`,
    /// `xdhcp_uplink_tc`; mode in the uplinks' own map, so no ifindex of a
    /// pod's namespace can select it).
    Uplink,
    /// A workload port's host side, in the agent's own namespace, at TC
    /// egress: the replies to the pod leave the switch there, on the kernel
    /// datapath (`dev_queue_xmit` from the openvswitch module) and on the
    /// userspace one (`ovs-vswitchd` sends through a packet socket without
    /// `PACKET_QDISC_BYPASS`, so `dev_queue_xmit` too). The port programs
    /// (`xdhcp_tc`), with the mode in the per-port map; always TC.
    PortEgress,
}

impl Role {
    const fn programs(self) -> (&'static str, &'static str) {
        match self {
            Self::Port | Self::PortEgress => (common::PROG_XDP, common::PROG_TC),
            Self::Uplink => (common::PROG_UPLINK_XDP, common::PROG_UPLINK_TC),
        }
    }

    /// The role whose mode map this one uses: a port's, on either side.
    pub(super) const fn mode_map(self) -> Self {
        match self {
            Self::Port | Self::PortEgress => Self::Port,
            Self::Uplink => Self::Uplink,
        }
    }

    /// Its name in a link pin's file name (see [`super::pin::link_key`]).
    pub(super) const fn as_str(self) -> &'static str {
        match self {
            Self::Port => "port",
            Self::Uplink => "uplink",
            Self::PortEgress => "port-egress",
        }
    }

    /// Where a TC attachment in this role hooks.
    const fn tc_hook(self) -> TcAttachType {
        match self {
            Self::PortEgress => TcAttachType::Egress,
            Self::Port | Self::Uplink => TcAttachType::Ingress,
        }
    }
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
    /// Whether a previous agent's pinned link was taken over.
    pub handover: Handover,
}

enum LinkHandle {
    /// An XDP BPF link, owned here (the program's own table would hide its
    /// kernel id).
    Xdp(XdpLink),
    /// A tcx BPF link (kernel 6.6 and later), owned here likewise.
    Tcx(SchedClassifierLink),
    /// A netlink TC filter (before tcx), kept in the program's table.
    TcNetlink(SchedClassifierLinkId),
}

pub(super) struct Attached {
    ifindex: u32,
    role: Role,
    mode: AttachMode,
    link: LinkHandle,
    /// The kernel's id of the BPF link, where the attachment is one (XDP,
    /// and TC through tcx): lets the agent notice a detach from outside.
    link_id: Option<u32>,
    /// Where the link is pinned, when it is: it then outlives the agent
    /// and the next one takes it over ([`super::pin`]).
    pin: Option<PathBuf>,
    /// A netlink TC filter's presence check (kernels before tcx, where
    /// there is no link id to ask about).
    filter: Option<FilterCheck>,
}

/// How often a netlink TC filter is looked for on its interface: a
/// listing of the hook's filters, cheaper than the trip a BPF link's check
/// is not, but not free for every pod four times a second.
const FILTER_CHECK_EVERY: Duration = Duration::from_secs(2);

/// A netlink TC filter's presence check, and when it is next due.
struct FilterCheck {
    watch: FilterWatch,
    due: Cell<Instant>,
}

impl FilterCheck {
    /// `Some(false)` when the check is due and the filter is gone;
    /// `None` when it is not due, or the listing failed (said at debug).
    fn gone(&self, now: Instant) -> Option<bool> {
        if now < self.due.get() {
            return None;
        }
        self.due.set(now + FILTER_CHECK_EVERY);
        match self.watch.present() {
            Ok(present) => Some(!present),
            Err(e) => {
                tracing::debug!(error = %e, "listing the TC filters failed");
                None
            }
        }
    }
}

/// How an attachment was made: anew, or taken over from a pin a previous
/// agent left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handover {
    /// Attached by this agent.
    Attached,
    /// A previous agent's link, kept as it was (same program).
    Adopted,
    /// A previous agent's link, whose program (another version) was
    /// replaced in place with `BPF_LINK_UPDATE`: the link, and capture,
    /// never went away.
    Updated,
}

impl Datapath {
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
        self.attach_as(Role::Port, target, mode, capture)
    }

    /// [`Datapath::attach`] in `role`: an uplink gets the uplink programs
    /// and its mode in the uplinks' map.
    pub fn attach_as(
        &mut self,
        role: Role,
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
        let key = pin::link_key(role, target);
        let left = self.inherited.remove(&key);
        let links_dir = self.links_dir.clone();
        let ebpf = &mut self.ebpf;
        let (attached, refused, handover) = in_netns(target.netns.as_deref(), move || {
            let (ifindex, kind) = interface_kind(&ifname)?;
            let wanted = mode.unwrap_or_else(|| default_attach_mode(kind));
            let wanted = match wanted {
                AttachMode::XdpNative | AttachMode::XdpGeneric if !xdp_ok => AttachMode::Tc,
                // XDP sees only what a device receives.
                _ if role == Role::PortEgress => AttachMode::Tc,
                m => m,
            };
            if let Some(left) = left {
                match adopt_here(ebpf, role, (&ifname, ifindex), &left, wanted) {
                    Ok(Some((attached, handover))) => return Ok((attached, None, handover)),
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(%ifname, pin = %left.path.display(), error = %error_chain(&e),
                            "cannot take over the pinned link a previous agent left; attaching anew");
                        pin::remove_link_pin(&left.path);
                    }
                }
            }
            let (attached, refused) = attach_here(ebpf, role, &ifname, ifindex, wanted)?;
            Ok((attached, refused, Handover::Attached))
        })??;
        let mut attached = attached;
        if handover == Handover::Attached
            && let Some(dir) = &links_dir
        {
            attached.pin_in(dir, &key, &target.ifname);
        }
        // Mode before anything is captured: set it now that the ifindex is known.
        if let Err(e) = self.set_role_mode(role, attached.ifindex, capture) {
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
            handover,
        };
        if handover != Handover::Attached {
            tracing::info!(ifname = %target.ifname, netns = ?target.netns, mode = %out.mode, ?role,
                link_id = ?attached.link_id, ?handover, "took over the link a previous agent pinned");
        } else if let Some(reason) = &out.native_refused {
            tracing::warn!(ifname = %target.ifname, netns = ?target.netns, mode = %out.mode, reason = %reason,
                "native XDP refused, attached generic XDP");
        } else {
            tracing::info!(ifname = %target.ifname, netns = ?target.netns, mode = %out.mode, ?role, "attached");
        }
        self.attached.insert(target.clone(), attached);
        Ok(out)
    }

    /// Has the kernel load what a netlink TC attachment needs before the
    /// first one is asked for: on kernels before tcx (6.6) a distribution
    /// kernel builds the `clsact` qdisc (`sch_ingress`) and the `bpf`
    /// classifier (`cls_bpf`) as modules, which the first `tc` request
    /// loads, each a `modprobe` the request waits for (0.6 s apiece on the
    /// VM tier's emulated 6.1 guest: most of a run-time uplink's attach, and
    /// of the first ADD's guard on the kernel datapath). Here the port
    /// program is attached once, and detached, on the loopback of a network
    /// namespace of its own that goes with the thread: no interface of the
    /// node is touched. Nothing to do on tcx kernels.
    pub fn prepare_tc(&mut self) -> Result<()> {
        if tcx_links() {
            return Ok(());
        }
        let ebpf = &mut self.ebpf;
        std::thread::scope(|s| {
            s.spawn(move || -> Result<()> {
                // This thread alone moves: the namespace goes when it ends.
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| {
                    EbpfDatapathError::PrepareTc {
                        source: std::io::Error::from(e),
                    }
                })?;
                let ifname = "lo";
                let attach_err = |source| EbpfDatapathError::Attach {
                    ifname: ifname.to_owned(),
                    mode: AttachMode::Tc,
                    source,
                };
                qdisc_add_clsact(ifname).map_err(|e| attach_err(e.into()))?;
                let prog: &mut SchedClassifier = prog(ebpf, common::PROG_TC)?;
                let id = prog
                    .attach(ifname, TcAttachType::Ingress)
                    .map_err(attach_err)?;
                prog.detach(id).map_err(|source| EbpfDatapathError::Detach {
                    ifname: ifname.to_owned(),
                    source,
                })
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// Detaches from `target` and clears its mode.
    pub fn detach(&mut self, target: &AttachTarget) -> Result<()> {
        let attached =
            self.attached
                .remove(target)
                .ok_or_else(|| EbpfDatapathError::NotAttached {
                    ifname: target.ifname.clone(),
                })?;
        let (ifindex, role) = (attached.ifindex, attached.role);
        self.detach_attached(target, attached)?;
        // The per-port map is keyed by ifindex alone: keep the entry while a
        // port with the same index in another namespace is attached.
        if self
            .attached
            .values()
            .any(|a| a.ifindex == ifindex && a.role.mode_map() == role.mode_map())
        {
            return Ok(());
        }
        self.clear_role_mode(role, ifindex)
    }

    /// Sets the capture mode of every attachment (observe while the ring
    /// reader is lost, intercept again once it is back).
    pub fn set_all_modes(&self, capture: CaptureMode) -> Vec<(AttachTarget, EbpfDatapathError)> {
        let mut failed = Vec::new();
        for (t, a) in &self.attached {
            if let Err(e) = self.set_role_mode(a.role, a.ifindex, capture) {
                failed.push((t.clone(), e));
            }
        }
        failed
    }

    /// Attached targets whose BPF link the kernel reports detached (an
    /// operator's `bpftool link detach`, or the device gone), and netlink
    /// TC filters (kernels before 6.6) no longer on their hook (`tc filter
    /// del`, the `clsact` qdisc deleted), those at most every
    /// [`FILTER_CHECK_EVERY`].
    pub fn detached_targets(&self) -> Vec<AttachTarget> {
        let now = Instant::now();
        self.attached
            .iter()
            .filter(|(_, a)| match (&a.filter, a.link_id) {
                (Some(check), _) => check.gone(now) == Some(true),
                (None, Some(id)) => {
                    matches!(crate::sys::bpf::link_ifindex(id), Ok(None | Some(0)))
                }
                (None, None) => false,
            })
            .map(|(t, _)| t.clone())
            .collect()
    }

    /// The kernel id of the BPF link attached to `target`, if it is one.
    pub fn link_id(&self, target: &AttachTarget) -> Option<u32> {
        self.attached.get(target).and_then(|a| a.link_id)
    }

    /// The ifindexes attached whose mode lives in `role`'s mode map.
    pub(super) fn ifindexes_in(&self, role: Role) -> std::collections::HashSet<u32> {
        self.attached
            .values()
            .filter(|a| a.role.mode_map() == role.mode_map())
            .map(|a| a.ifindex)
            .collect()
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
        // Unpinned first: the link then goes with its last descriptor.
        if let Some(pin) = &attached.pin {
            pin::remove_link_pin(pin);
        }
        in_netns(target.netns.as_deref(), move || {
            let res = match attached.link {
                LinkHandle::Xdp(link) => link.detach(),
                LinkHandle::Tcx(link) => link.detach(),
                LinkHandle::TcNetlink(id) => {
                    prog::<SchedClassifier>(ebpf, attached.role.programs().1)?.detach(id)
                }
            };
            res.map_err(|source| EbpfDatapathError::Detach { ifname, source })
        })?
    }
}

/// Runs `f` inside `netns` (on a dedicated thread, see [`crate::sys::netns`]), or
/// directly when `None`: interface names and indexes are looked up, and
/// programs attached, in the namespace of the thread that does it.
fn in_netns<T: Send>(netns: Option<&Path>, f: impl FnOnce() -> T + Send) -> Result<T> {
    match netns {
        None => Ok(f()),
        Some(path) => crate::sys::netns::run_in_netns(path, f)
            .map_err(|source| EbpfDatapathError::Netns { source }),
    }
}

/// What kind of device an interface is, for the default attach choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InterfaceKind {
    /// A veth end.
    Veth,
    /// A device with a bus address (a physical NIC or an SR-IOV VF netdev),
    /// or a bond of such devices.
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
    } else if driver == "bonding" {
        // A bond runs native XDP when its slaves' drivers do (the attach
        // falls back to generic XDP when they do not).
        InterfaceKind::Hardware
    } else if !bus_info.is_empty() && bus_info != "N/A" && !bus_info.starts_with("tap") {
        InterfaceKind::Hardware
    } else {
        InterfaceKind::Other
    }
}

/// ifindex and kind of `ifname` in the current thread's namespace.
fn interface_kind(ifname: &str) -> Result<(u32, InterfaceKind)> {
    let no_if = |source| EbpfDatapathError::NoInterface {
        ifname: ifname.to_owned(),
        source,
    };
    let ifindex = nix::net::if_::if_nametoindex(ifname).map_err(|e| no_if(e.into()))?;
    let kind = match crate::sys::ifreq::driver_info(ifname).map_err(no_if)? {
        Some(info) => classify_driver(&info.driver, &info.bus_info),
        // Devices without ethtool support (e.g. some virtual ones): "other".
        None => InterfaceKind::Other,
    };
    Ok((ifindex, kind))
}

/// Attaches in the current thread's namespace. Returns what was attached and
/// the native-XDP refusal reason when it fell back to generic.
fn attach_here(
    ebpf: &mut Programs,
    role: Role,
    ifname: &str,
    ifindex: u32,
    mode: AttachMode,
) -> Result<(Attached, Option<String>)> {
    let attach_err = |mode, source| EbpfDatapathError::Attach {
        ifname: ifname.to_owned(),
        mode,
        source,
    };
    let hold_err = |mode, source| EbpfDatapathError::HoldLink {
        ifname: ifname.to_owned(),
        mode,
        source,
    };
    let (xdp_prog, tc_prog) = role.programs();
    let attached = |mode, link, link_id| Attached {
        ifindex,
        role,
        mode,
        link,
        link_id,
        pin: None,
        filter: None,
    };
    // XDP links are BPF links on every supported kernel: take them out of
    // the program's table to learn their kernel id.
    let xdp = |prog: &mut Xdp, mode, id| -> Result<Attached> {
        let link = prog.take_link(id).map_err(|e| attach_err(mode, e))?;
        let (link, link_id) = owned_link(link).map_err(|e| hold_err(mode, e))?;
        Ok(attached(mode, LinkHandle::Xdp(link), link_id))
    };
    match mode {
        AttachMode::Tc => {
            let prog: &mut SchedClassifier = prog(ebpf, tc_prog)?;
            let hook = role.tc_hook();
            let tcx = tcx_links();
            // Before tcx (kernel < 6.6) the filter needs a clsact qdisc:
            // added first (it is there already when the guard is, which an
            // error here then says), not after a failed attach — a round
            // trip fewer on every new interface.
            let clsact = if tcx {
                Ok(())
            } else {
                qdisc_add_clsact(ifname)
            };
            let id = prog.attach(ifname, hook).map_err(|e| {
                let e = attach_err(mode, e);
                match clsact {
                    Err(q) => {
                        tracing::debug!(ifname, error = %q, "adding the clsact qdisc failed before the attach did");
                        e
                    }
                    Ok(()) => e,
                }
            })?;
            if !tcx {
                let mut a = attached(mode, LinkHandle::TcNetlink(id), None);
                a.filter = filter_check(prog, ifname, ifindex, hook);
                return Ok((a, None));
            }
            let link = prog.take_link(id).map_err(|e| attach_err(mode, e))?;
            let (link, link_id) = owned_link(link).map_err(|e| hold_err(mode, e))?;
            Ok((attached(mode, LinkHandle::Tcx(link), link_id), None))
        }
        AttachMode::XdpNative => {
            let prog: &mut Xdp = prog(ebpf, xdp_prog)?;
            match prog.attach_to_if_index(ifindex, XdpMode::Driver) {
                Ok(id) => Ok((xdp(prog, mode, id)?, None)),
                Err(e) => {
                    let reason = error_chain(&e);
                    let id = prog
                        .attach_to_if_index(ifindex, XdpMode::Skb)
                        .map_err(|e| attach_err(AttachMode::XdpGeneric, e))?;
                    Ok((xdp(prog, AttachMode::XdpGeneric, id)?, Some(reason)))
                }
            }
        }
        AttachMode::XdpGeneric => {
            let prog: &mut Xdp = prog(ebpf, xdp_prog)?;
            let id = prog
                .attach_to_if_index(ifindex, XdpMode::Skb)
                .map_err(|e| attach_err(mode, e))?;
            Ok((xdp(prog, mode, id)?, None))
        }
        AttachMode::AfPacket => Err(EbpfDatapathError::NotEbpf { mode }),
    }
}

impl Attached {
    /// Pins the link under `dir` by `key` and mode, so that it outlives
    /// this agent. A netlink TC filter (kernels before tcx) is no BPF link
    /// and cannot be pinned; a failed pin leaves the attachment as it is,
    /// unpinned (it then goes with this agent), and says why.
    fn pin_in(&mut self, dir: &Path, key: &str, ifname: &str) {
        let Some(id) = self.link_id else { return };
        let path = dir.join(pin::link_pin_name(key, self.mode));
        match crate::sys::bpf::pin_link(id, &path) {
            Ok(()) => self.pin = Some(path),
            Err(e) => tracing::warn!(ifname, pin = %path.display(), error = %e,
                "cannot pin the link; it will not outlive this agent"),
        }
    }
}

/// Takes over `left`, the link a previous agent pinned for this attachment,
/// in the current thread's namespace. `Ok(None)` when it cannot stand for
/// the attachment wanted — its device is gone or is another one, or it was
/// attached in another mode (the flags changed): it is then unpinned, which
/// detaches it, and the caller attaches anew. A link whose program is of
/// another version (its tag differs from this agent's program's) gets this
/// agent's program in place with `BPF_LINK_UPDATE` (aya's
/// `attach_to_link`): one step in the kernel, the link and its id stay, and
/// capture never stops.
fn adopt_here(
    ebpf: &mut Programs,
    role: Role,
    (ifname, ifindex): (&str, u32),
    left: &LeftLink,
    wanted: AttachMode,
) -> Result<Option<(Attached, Handover)>> {
    let hold = |source| EbpfDatapathError::HoldLink {
        ifname: ifname.to_owned(),
        mode: left.mode,
        source,
    };
    let update_err = |source| EbpfDatapathError::Attach {
        ifname: ifname.to_owned(),
        mode: left.mode,
        source,
    };
    // Native XDP refused by the driver fell back to generic, then as now.
    let fits = left.mode == wanted
        || (wanted == AttachMode::XdpNative && left.mode == AttachMode::XdpGeneric);
    if !fits {
        tracing::info!(pin = %left.path.display(), pinned = %left.mode, %wanted,
            "the pinned link is in another attach mode; replacing it");
        pin::remove_link_pin(&left.path);
        return Ok(None);
    }
    let fd: FdLink = PinnedLink::from_pin(&left.path).map_err(hold)?.into();
    let info = fd.info().map_err(hold)?;
    let link_id = info.id();
    match crate::sys::bpf::link_ifindex(link_id) {
        Ok(Some(i)) if i == ifindex => {}
        other => {
            tracing::info!(pin = %left.path.display(), link_id, device = ?other, ifindex,
                "the pinned link is not on this device any more; replacing it");
            drop(fd);
            pin::remove_link_pin(&left.path);
            return Ok(None);
        }
    }
    let theirs = crate::sys::bpf::prog_tag(info.program_id())
        .ok()
        .flatten()
        .map(u64::from_be_bytes);
    let (xdp_prog, tc_prog) = role.programs();
    let adopted = |link, handover| {
        let a = Attached {
            ifindex,
            role,
            mode: left.mode,
            link,
            link_id: Some(link_id),
            pin: Some(left.path.clone()),
            filter: None,
        };
        Ok(Some((a, handover)))
    };
    match left.mode {
        AttachMode::Tc => {
            let prog: &mut SchedClassifier = prog(ebpf, tc_prog)?;
            let ours = prog.info().map_err(update_err)?.tag();
            let link = SchedClassifierLink::try_from(fd).map_err(hold)?;
            if theirs == Some(ours) {
                return adopted(LinkHandle::Tcx(link), Handover::Adopted);
            }
            let id = prog.attach_to_link(link).map_err(update_err)?;
            let link = prog.take_link(id).map_err(update_err)?;
            adopted(LinkHandle::Tcx(link), Handover::Updated)
        }
        AttachMode::XdpNative | AttachMode::XdpGeneric => {
            let prog: &mut Xdp = prog(ebpf, xdp_prog)?;
            let ours = prog.info().map_err(update_err)?.tag();
            let link = XdpLink::try_from(fd).map_err(hold)?;
            if theirs == Some(ours) {
                return adopted(LinkHandle::Xdp(link), Handover::Adopted);
            }
            let id = prog.attach_to_link(link).map_err(update_err)?;
            let link = prog.take_link(id).map_err(update_err)?;
            adopted(LinkHandle::Xdp(link), Handover::Updated)
        }
        AttachMode::AfPacket => Err(EbpfDatapathError::NotEbpf { mode: left.mode }),
    }
}

/// The presence check of the netlink filter just attached with `prog` on
/// `ifname`'s `hook`, opened in the calling thread's namespace; `None`
/// (said) when it cannot be, the filter then going unchecked as before.
fn filter_check(
    prog: &SchedClassifier,
    ifname: &str,
    ifindex: u32,
    hook: TcAttachType,
) -> Option<FilterCheck> {
    let hook = match hook {
        TcAttachType::Egress => TcHook::Egress,
        _ => TcHook::Ingress,
    };
    let opened = prog
        .info()
        .map_err(|e| std::io::Error::other(e.to_string()))
        .and_then(|info| FilterWatch::open_here(ifindex, hook, info.id()));
    match opened {
        Ok(watch) => Some(FilterCheck {
            watch,
            due: Cell::new(Instant::now() + FILTER_CHECK_EVERY),
        }),
        Err(e) => {
            tracing::warn!(%ifname, error = %e,
                "cannot watch the TC filter; its removal from outside will go unnoticed");
            None
        }
    }
}

/// Whether TC attachments are tcx links (kernel 6.6 and later, as aya
/// decides), rather than netlink filters.
fn tcx_links() -> bool {
    aya::util::KernelVersion::current().is_ok_and(|v| v >= aya::util::KernelVersion::new(6, 6, 0))
}

/// A link taken out of its program's table, with the kernel id of the BPF
/// link behind it. Only BPF links can be taken this way: XDP links on the
/// supported kernels, tcx links on 6.6 and later.
fn owned_link<L>(link: L) -> std::result::Result<(L, Option<u32>), LinkError>
where
    FdLink: TryFrom<L, Error = LinkError>,
    L: TryFrom<FdLink, Error = LinkError>,
{
    let fd = FdLink::try_from(link)?;
    let id = fd.info().ok().map(|i| i.id());
    let link = L::try_from(fd)?;
    Ok((link, id))
}

#[cfg(test)]
mod tests {
    use super::*;

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
            default_attach_mode(classify_driver("bonding", "")),
            AttachMode::XdpNative
        );
        assert_eq!(
            default_attach_mode(classify_driver("macvlan", "")),
            AttachMode::XdpGeneric
        );
    }
}
