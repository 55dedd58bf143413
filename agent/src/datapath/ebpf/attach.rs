//! Attaching the capture programs to interfaces, in the caller's network
//! namespace or in another one: the default choice per device kind (veth →
//! TC, physical NIC / VF → native XDP, anything else → generic XDP), the
//! fallback from native to generic XDP, and detaching.

use std::path::{Path, PathBuf};

use aya::Ebpf;
use aya::programs::tc::{SchedClassifierLinkId, TcAttachType, qdisc_add_clsact};
use aya::programs::xdp::XdpLinkId;
use aya::programs::{SchedClassifier, Xdp, XdpMode};
use xdhcp_common as common;

use super::{CaptureMode, Datapath, EbpfDatapathError, Result, error_chain, program};
use crate::datapath::AttachMode;

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

pub(super) struct Attached {
    ifindex: u32,
    mode: AttachMode,
    link: LinkHandle,
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
}

/// Runs `f` inside `netns` (on a dedicated thread, see [`crate::netns`]), or
/// directly when `None`: interface names and indexes are looked up, and
/// programs attached, in the namespace of the thread that does it.
fn in_netns<T: Send>(netns: Option<&Path>, f: impl FnOnce() -> T + Send) -> Result<T> {
    match netns {
        None => Ok(f()),
        Some(path) => crate::netns::run_in_netns(path, f)
            .map_err(|source| EbpfDatapathError::Netns { source }),
    }
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

/// ifindex and kind of `ifname` in the current thread's namespace.
fn interface_kind(ifname: &str) -> Result<(u32, InterfaceKind)> {
    let no_if = |source| EbpfDatapathError::NoInterface {
        ifname: ifname.to_owned(),
        source,
    };
    let ifindex = nix::net::if_::if_nametoindex(ifname).map_err(|e| no_if(e.into()))?;
    let kind = match ethtool_driver_info(ifname).map_err(no_if)? {
        Some(info) => classify_driver(&info.driver, &info.bus_info),
        // Devices without ethtool support (e.g. some virtual ones): "other".
        None => InterfaceKind::Other,
    };
    Ok((ifindex, kind))
}

/// The two fields of `struct ethtool_drvinfo` the attach choice reads.
struct DriverInfo {
    driver: String,
    bus_info: String,
}

/// `ETHTOOL_GDRVINFO` on `ifname` in the current thread's namespace, through
/// a `SIOCETHTOOL` ifreq ioctl on a throwaway socket. `Ok(None)` when the
/// device does not answer it; `Err` only when no socket could be opened.
fn ethtool_driver_info(ifname: &str) -> std::io::Result<Option<DriverInfo>> {
    use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};

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

    // SAFETY: plain socket(2) call; the fd is owned below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd was just created and is owned by nobody else.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
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
        return Ok(None);
    }
    let cstr = |b: &[u8]| {
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        String::from_utf8_lossy(&b[..end]).into_owned()
    };
    Ok(Some(DriverInfo {
        driver: cstr(&info.driver),
        bus_info: cstr(&info.bus_info),
    }))
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
    let attached = |mode, link| Attached {
        ifindex,
        mode,
        link,
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
            Ok((attached(mode, LinkHandle::Tc(id)), None))
        }
        AttachMode::XdpNative => {
            let prog: &mut Xdp = program(ebpf, common::PROG_XDP)?;
            match prog.attach_to_if_index(ifindex, XdpMode::Driver) {
                Ok(id) => Ok((attached(mode, LinkHandle::Xdp(id)), None)),
                Err(e) => {
                    let reason = error_chain(&e);
                    let id = prog
                        .attach_to_if_index(ifindex, XdpMode::Skb)
                        .map_err(|e| attach_err(AttachMode::XdpGeneric, e))?;
                    Ok((
                        attached(AttachMode::XdpGeneric, LinkHandle::Xdp(id)),
                        Some(reason),
                    ))
                }
            }
        }
        AttachMode::XdpGeneric => {
            let prog: &mut Xdp = program(ebpf, common::PROG_XDP)?;
            let id = prog
                .attach_to_if_index(ifindex, XdpMode::Skb)
                .map_err(|e| attach_err(mode, e))?;
            Ok((attached(mode, LinkHandle::Xdp(id)), None))
        }
        AttachMode::AfPacket => Err(EbpfDatapathError::NotEbpf { mode }),
    }
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
            default_attach_mode(classify_driver("macvlan", "")),
            AttachMode::XdpGeneric
        );
    }
}
