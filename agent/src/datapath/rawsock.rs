//! Raw AF_PACKET sender opened inside the target network namespace.
//!
//! A DHCP client has no usable IP configuration while it acquires a lease
//! (source 0.0.0.0, destination 255.255.255.255) and the interface lives in a
//! pod namespace, so requests are sent as whole Ethernet frames from an
//! AF_PACKET socket created inside that namespace ([`crate::sys::netns`]) and bound
//! to the interface. The socket uses protocol 0, so it never receives
//! anything; it is opened once per lease and closed on drop, so nothing a
//! lease opened outlives it.
//!
//! Frames are built around the engine's [`Transmit`] payloads with
//! [`frame::build_udp_frame`]: broadcast to `ff:ff:ff:ff:ff:ff` /
//! 255.255.255.255, or unicast to the server (RENEWING, RELEASE — sourced
//! from the leased address, since dnsmasq ignores a RELEASE from 0.0.0.0) at
//! the MAC the engine learned.
//!
//! Interface removal (ENODEV/ENXIO/ENETDOWN) is reported as the typed
//! [`RawSockError::InterfaceGone`] so the lease can end instead of retrying.
//!
//! One thing: the raw-socket sender, from frame building to `sendto`.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use xdhcp_engine::{Destination, Transmit};

use super::frame::{self, FrameHeaders};
use crate::sys;
use crate::sys::netns::{NetnsError, run_in_netns, run_in_netns_async};

/// UDP port of DHCP clients (RFC 2131 §4.1).
pub const CLIENT_PORT: u16 = 68;
/// UDP port of DHCP servers.
pub const SERVER_PORT: u16 = 67;
/// The Ethernet broadcast address.
pub const BROADCAST_MAC: [u8; 6] = [0xff; 6];

const ETH_HLEN: usize = 14;
const VLAN_HLEN: usize = 4;
const IP_UDP_HLEN: usize = 28;

/// Errors opening or using a raw sender. Variants name the interface and,
/// when known, the namespace.
#[derive(Debug, thiserror::Error)]
pub enum RawSockError {
    /// Entering the namespace failed.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// The interface does not exist (any more) or went away under the socket
    /// (ENODEV, ENXIO, ENETDOWN). The lease on it should end.
    #[error("interface {ifname:?} in {} is gone: {source}", ns_label(netns.as_deref()))]
    InterfaceGone {
        ifname: String,
        netns: Option<PathBuf>,
        #[source]
        source: io::Error,
    },
    /// The interface is not an Ethernet device (`ARPHRD_ETHER`).
    #[error("interface {ifname:?} in {} is not Ethernet (hardware type {hw_type})", ns_label(netns.as_deref()))]
    NotEthernet {
        ifname: String,
        netns: Option<PathBuf>,
        hw_type: u16,
    },
    /// The interface name cannot be a Linux interface name.
    #[error("invalid interface name {ifname:?}")]
    InvalidIfname { ifname: String },
    /// The frame would exceed the interface MTU.
    #[error("DHCP message of {payload_len} bytes does not fit the MTU {mtu} of {ifname:?}")]
    TooLarge {
        ifname: String,
        payload_len: usize,
        mtu: u32,
    },
    /// Any other socket error.
    #[error("failed to {op} on {ifname:?} in {}: {source}", ns_label(netns.as_deref()))]
    Io {
        op: &'static str,
        ifname: String,
        netns: Option<PathBuf>,
        #[source]
        source: io::Error,
    },
}

impl RawSockError {
    /// Whether the interface is gone (the lease on it should end).
    pub fn is_interface_gone(&self) -> bool {
        matches!(self, Self::InterfaceGone { .. })
    }

    /// Whether the interface's namespace is gone: its file removed, or
    /// left behind unmounted (no longer a namespace) — the pod's sandbox
    /// was torn down.
    pub fn is_netns_gone(&self) -> bool {
        match self {
            Self::Netns(NetnsError::NotNetns { .. }) => true,
            Self::Netns(NetnsError::Open { source, .. }) => {
                source.kind() == io::ErrorKind::NotFound
            }
            _ => false,
        }
    }

    /// Whether the socket reported `ENETDOWN`: the interface went down, or
    /// went away (the kernel says the same for both); see
    /// `Link::still_there`, which tells them apart.
    pub fn is_net_down(&self) -> bool {
        matches!(self, Self::InterfaceGone { source, .. } if source.raw_os_error() == Some(libc::ENETDOWN))
    }
}

/// Convenience alias for results of this module.
pub type Result<T, E = RawSockError> = std::result::Result<T, E>;

fn ns_label(p: Option<&Path>) -> String {
    p.map_or_else(
        || "the current namespace".to_owned(),
        |p| p.display().to_string(),
    )
}

/// Whether an errno means the interface is gone.
pub fn is_gone_errno(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENODEV | libc::ENXIO | libc::ENETDOWN)
    )
}

/// Maps an I/O error to `InterfaceGone` or `Io`.
pub(crate) fn classify(
    op: &'static str,
    ifname: &str,
    netns: Option<&Path>,
    source: io::Error,
) -> RawSockError {
    if is_gone_errno(&source) {
        RawSockError::InterfaceGone {
            ifname: ifname.to_owned(),
            netns: netns.map(Path::to_path_buf),
            source,
        }
    } else {
        RawSockError::Io {
            op,
            ifname: ifname.to_owned(),
            netns: netns.map(Path::to_path_buf),
            source,
        }
    }
}

/// Index, MAC and MTU of an interface, as seen inside its namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkInfo {
    /// Interface index (only meaningful inside its namespace).
    pub ifindex: u32,
    /// Hardware address.
    pub mac: [u8; 6],
    /// MTU in bytes.
    pub mtu: u32,
}

/// `struct ifreq` with the interface name filled in.
fn ifreq_for(ifname: &str) -> Result<libc::ifreq> {
    sys::ifreq::request(ifname).ok_or_else(|| RawSockError::InvalidIfname {
        ifname: ifname.to_owned(),
    })
}

/// Creates an `AF_PACKET`/`SOCK_RAW` socket (close-on-exec) for `protocol`
/// (network byte order already applied by the caller, 0 = receive nothing).
pub fn packet_socket(protocol: u16, nonblocking: bool) -> io::Result<OwnedFd> {
    let mut ty = libc::SOCK_RAW | libc::SOCK_CLOEXEC;
    if nonblocking {
        ty |= libc::SOCK_NONBLOCK;
    }
    // SAFETY: plain syscall; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_PACKET, ty, i32::from(protocol)) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Binds a packet socket to `ifindex` for `protocol` (network byte order).
pub fn bind_packet(fd: &OwnedFd, ifindex: u32, protocol: u16) -> io::Result<()> {
    // SAFETY: sockaddr_ll is plain old data; all-zero is valid.
    let mut sll: libc::sockaddr_ll = unsafe { zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = protocol;
    sll.sll_ifindex = ifindex as i32;
    // SAFETY: `sll` is a valid sockaddr_ll of the size passed.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            std::ptr::from_ref(&sll).cast::<libc::sockaddr>(),
            size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Looks `ifname` up in the calling thread's namespace.
pub fn link_info_here(ifname: &str) -> Result<LinkInfo> {
    link_info_with(ifname, None)
}

pub(crate) fn link_info_with(ifname: &str, netns: Option<&Path>) -> Result<LinkInfo> {
    let sock =
        sys::ifreq::socket().map_err(|e| classify("open a query socket", ifname, netns, e))?;
    link_info_on(&sock, ifname, netns)
}

/// [`link_info_with`] with `sock`, a query socket of `ifname`'s namespace
/// (`sys::ifreq::socket`).
pub(crate) fn link_info_on(sock: &OwnedFd, ifname: &str, netns: Option<&Path>) -> Result<LinkInfo> {
    let mut req = ifreq_for(ifname)?;
    // A missing interface is ENODEV: reported as gone.
    let lookup = |op: &'static str| move |e: io::Error| classify(op, ifname, netns, e);
    let ifindex =
        sys::ifreq::index(sock, &mut req).map_err(lookup("look up the interface index"))?;
    let (hw_type, mac) =
        sys::ifreq::hwaddr(sock, &mut req).map_err(lookup("read the hardware address"))?;
    if hw_type != libc::ARPHRD_ETHER {
        return Err(RawSockError::NotEthernet {
            ifname: ifname.to_owned(),
            netns: netns.map(Path::to_path_buf),
            hw_type,
        });
    }
    let mtu = sys::ifreq::mtu(sock, &mut req).map_err(lookup("read the MTU"))?;
    Ok(LinkInfo { ifindex, mac, mtu })
}

/// Looks `ifname` up inside the namespace at `netns`.
pub fn link_info(netns: &Path, ifname: &str) -> Result<LinkInfo> {
    let name = ifname.to_owned();
    let ns = netns.to_path_buf();
    run_in_netns(netns, move || link_info_with(&name, Some(&ns)))?
}

/// Async form of [`link_info`].
pub async fn link_info_async(netns: &Path, ifname: &str) -> Result<LinkInfo> {
    let name = ifname.to_owned();
    let ns = netns.to_path_buf();
    run_in_netns_async(netns, move || link_info_with(&name, Some(&ns))).await?
}

/// Ethernet/IP/UDP headers for an engine [`Transmit`].
///
/// - [`Destination::Broadcast`]: `ff:ff:ff:ff:ff:ff` / 255.255.255.255.
/// - [`Destination::Unicast`]: the learned server (or next-hop) MAC; when none
///   was learned the frame goes to the Ethernet broadcast address with the
///   unicast IP destination (the server's IP stack accepts it; no ARP is
///   possible from a raw socket without an address).
///
/// The IP source is the engine's choice (`0.0.0.0`, or the leased address
/// for RENEW/REBIND/RELEASE); ports are 68 → 67.
pub fn headers_for(src_mac: [u8; 6], vlan: Option<u16>, t: &Transmit) -> FrameHeaders {
    let (dst_mac, dst_ip) = match t.dst {
        Destination::Broadcast => (BROADCAST_MAC, Ipv4Addr::BROADCAST),
        Destination::Unicast { ip, mac } => (mac.unwrap_or(BROADCAST_MAC), ip),
    };
    FrameHeaders {
        src_mac,
        dst_mac,
        vlan,
        src_ip: t.src_ip,
        dst_ip,
        src_port: CLIENT_PORT,
        dst_port: SERVER_PORT,
    }
}

/// A raw sender bound to one interface in one namespace.
#[derive(Debug)]
pub struct RawSender {
    fd: OwnedFd,
    ifname: String,
    netns: Option<PathBuf>,
    info: LinkInfo,
    src_mac: [u8; 6],
    vlan: Option<u16>,
}

impl RawSender {
    /// Opens a sender on `ifname` in the calling thread's namespace.
    pub fn open_here(ifname: &str) -> Result<Self> {
        Self::open_with(ifname, None)
    }

    fn open_with(ifname: &str, netns: Option<&Path>) -> Result<Self> {
        Self::open_for(ifname, link_info_with(ifname, netns)?, netns)
    }

    /// Opens a sender on `ifname`, found as `info`, in the calling
    /// thread's namespace (`netns` names it in errors).
    pub(crate) fn open_for(ifname: &str, info: LinkInfo, netns: Option<&Path>) -> Result<Self> {
        let fd = packet_socket(0, false)
            .map_err(|e| classify("open a packet socket", ifname, netns, e))?;
        bind_packet(&fd, info.ifindex, 0)
            .map_err(|e| classify("bind the packet socket", ifname, netns, e))?;
        Ok(Self {
            fd,
            ifname: ifname.to_owned(),
            netns: netns.map(Path::to_path_buf),
            src_mac: info.mac,
            info,
            vlan: None,
        })
    }

    /// Opens a sender on `ifname` inside the namespace at `netns`. The socket
    /// keeps that namespace; it can be used from any thread afterwards.
    pub fn open(netns: &Path, ifname: &str) -> Result<Self> {
        let name = ifname.to_owned();
        let ns = netns.to_path_buf();
        run_in_netns(netns, move || Self::open_with(&name, Some(&ns)))?
    }

    /// Async form of [`RawSender::open`].
    pub async fn open_async(netns: &Path, ifname: &str) -> Result<Self> {
        let name = ifname.to_owned();
        let ns = netns.to_path_buf();
        run_in_netns_async(netns, move || Self::open_with(&name, Some(&ns))).await?
    }

    /// Opens in `netns`, or in the agent's own namespace for `None`.
    pub async fn open_in(netns: Option<&Path>, ifname: &str) -> Result<Self> {
        match netns {
            Some(ns) => Self::open_async(ns, ifname).await,
            None => Self::open_here(ifname),
        }
    }

    /// Uses `mac` as the Ethernet source instead of the interface's own MAC
    /// (a VM's MAC when acquiring on its behalf).
    #[must_use]
    pub fn with_src_mac(mut self, mac: [u8; 6]) -> Self {
        self.src_mac = mac;
        self
    }

    /// Tags every frame with 802.1Q VLAN `vlan` (a localnet network
    /// carried tagged on an uplink), or sends untagged for `None`.
    #[must_use]
    pub fn with_vlan(mut self, vlan: Option<u16>) -> Self {
        self.vlan = vlan;
        self
    }

    /// Interface index, MAC and MTU found at open time.
    pub fn info(&self) -> LinkInfo {
        self.info
    }

    /// The interface name.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// The namespace path, if opened in another namespace.
    pub fn netns(&self) -> Option<&Path> {
        self.netns.as_deref()
    }

    /// The Ethernet source MAC used for frames.
    pub fn src_mac(&self) -> [u8; 6] {
        self.src_mac
    }

    /// Whether the socket is still bound to its interface: the kernel
    /// unbinds packet sockets (interface index -1) when their interface is
    /// unregistered — deleted, or moved to another namespace.
    pub fn is_bound(&self) -> bool {
        // SAFETY: sockaddr_ll is plain old data; all-zero is valid.
        let mut sll: libc::sockaddr_ll = unsafe { zeroed() };
        let mut len = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        // SAFETY: `sll` is writable for `len` bytes.
        let rc = unsafe {
            libc::getsockname(
                self.fd.as_raw_fd(),
                std::ptr::from_mut(&mut sll).cast::<libc::sockaddr>(),
                &raw mut len,
            )
        };
        // A failing getsockname on a live descriptor says nothing about the
        // interface: assume it is still there.
        rc != 0 || sll.sll_ifindex > 0
    }

    /// Builds and sends the frame for an engine [`Transmit`].
    pub fn send_transmit(&self, t: &Transmit) -> Result<()> {
        let headers = headers_for(self.src_mac, self.vlan, t);
        self.send(&headers, &t.payload)
    }

    /// Builds a UDP frame with `headers` around `payload` and sends it.
    pub fn send(&self, headers: &FrameHeaders, payload: &[u8]) -> Result<()> {
        // The MTU counts the IP packet; the VLAN tag is on top of it.
        let ip_len = IP_UDP_HLEN + payload.len();
        // Also bounded by the IPv4 total length field, whatever the MTU says
        // (frame::build_udp_frame relies on it).
        if ip_len > self.info.mtu as usize || ip_len > usize::from(u16::MAX) {
            return Err(RawSockError::TooLarge {
                ifname: self.ifname.clone(),
                payload_len: payload.len(),
                mtu: self.info.mtu,
            });
        }
        let frame = frame::build_udp_frame(headers, payload);
        debug_assert!(frame.len() <= ETH_HLEN + VLAN_HLEN + ip_len);
        self.send_frame(&frame)
    }

    /// Sends a complete Ethernet frame as is.
    pub fn send_frame(&self, frame: &[u8]) -> Result<()> {
        // MSG_DONTWAIT: never block a tokio worker on a full send queue.
        // SAFETY: `frame` is a valid buffer of the given length.
        let rc = unsafe {
            libc::send(
                self.fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if rc < 0 {
            return Err(classify(
                "send a frame",
                &self.ifname,
                self.netns.as_deref(),
                io::Error::last_os_error(),
            ));
        }
        if rc as usize != frame.len() {
            return Err(RawSockError::Io {
                op: "send a whole frame",
                ifname: self.ifname.clone(),
                netns: self.netns.clone(),
                source: io::Error::new(
                    io::ErrorKind::WriteZero,
                    format!("sent {rc} of {} bytes", frame.len()),
                ),
            });
        }
        Ok(())
    }
}

impl AsRawFd for RawSender {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Notices the deletion of an interface: a `NETLINK_ROUTE` socket in the
/// interface's namespace subscribed to `RTNLGRP_LINK`, read into a stack
/// buffer.
///
/// It is opened in the same trip into the namespace as the sender, so a
/// lease needs no extra thread, task or heap buffer to watch its interface
/// (why that matters: `docs/performance-notes.md`).
#[derive(Debug)]
pub struct LinkRemovalWatch {
    fd: AsyncFd<OwnedFd>,
    /// Whether the socket is subscribed to `RTNLGRP_LINK` yet.
    subscribed: AtomicBool,
}

/// Receive buffer for link notifications (one `RTM_NEWLINK`/`RTM_DELLINK`
/// is about 1.5 KiB; only the headers at the front are read).
const NOTIFY_BUF: usize = 8192;

impl LinkRemovalWatch {
    /// Subscribe in the calling thread's namespace; must run inside the
    /// tokio runtime that will poll it.
    pub fn open_here() -> io::Result<Self> {
        let watch = Self::unsubscribed_here()?;
        watch.subscribe()?;
        Ok(watch)
    }

    /// The watch's socket in the calling thread's namespace, subscribed
    /// only when [`LinkRemovalWatch::removed`] is first polled (from any
    /// thread: the socket stays in this namespace). Subscribing joins the
    /// group under the kernel's netlink table lock, 40–170 µs on a pod's
    /// ADD path measured; the lease task first waits for events after its
    /// first DISCOVER is out. Must run inside the tokio runtime that will
    /// poll it.
    pub fn unsubscribed_here() -> io::Result<Self> {
        // SAFETY: plain socket(2); the descriptor is owned at once.
        let raw = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                libc::NETLINK_ROUTE,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: the OwnedFd stays open, and is the same descriptor, until
        // the AsyncFd owning it is dropped.
        let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
            .map_err(io::Error::from)?;
        Ok(Self {
            fd,
            subscribed: AtomicBool::new(false),
        })
    }

    /// Join `RTNLGRP_LINK` (once).
    fn subscribe(&self) -> io::Result<()> {
        if self.subscribed.load(AtomicOrdering::Relaxed) {
            return Ok(());
        }
        // SAFETY: an all-zero sockaddr_nl is valid (pid 0: the kernel picks).
        let mut sa: libc::sockaddr_nl = unsafe { zeroed() };
        sa.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        sa.nl_groups = libc::RTMGRP_LINK as u32;
        // SAFETY: `sa` is a valid sockaddr_nl of the size passed.
        let rc = unsafe {
            libc::bind(
                self.fd.as_raw_fd(),
                std::ptr::from_ref(&sa).cast(),
                size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        self.subscribed.store(true, AtomicOrdering::Relaxed);
        Ok(())
    }

    /// Waits for `RTM_DELLINK` of `ifindex`. When notifications were lost
    /// (`ENOBUFS`: the socket overflowed) the interface is looked up
    /// through `tx`, whose binding the kernel clears on unregister; without
    /// an open sender (an idle lease) the removal is then noticed when the
    /// sender is opened again for the next transmit.
    ///
    /// A watch opened unsubscribed subscribes here first; an interface
    /// deleted before that is seen through `tx` as above.
    pub async fn removed(&self, ifindex: u32, tx: Option<&RawSender>) -> io::Result<()> {
        if !self.subscribed.load(AtomicOrdering::Relaxed) {
            self.subscribe()?;
            if tx.is_some_and(|tx| !tx.is_bound()) {
                return Ok(());
            }
        }
        loop {
            let mut guard = self.fd.readable().await?;
            match guard.try_io(|fd| drain_notifications(fd.as_raw_fd(), ifindex)) {
                Ok(Ok(true)) => return Ok(()),
                Ok(Ok(false)) => {}
                Ok(Err(e)) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    if tx.is_some_and(|tx| !tx.is_bound()) {
                        return Ok(());
                    }
                }
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => {}
            }
        }
    }
}

/// Reads every queued notification; `Ok(true)` when one of them deletes
/// `ifindex`, `WouldBlock` once the queue is empty without one.
fn drain_notifications(fd: RawFd, ifindex: u32) -> io::Result<bool> {
    let mut buf = [0u8; NOTIFY_BUF];
    loop {
        // SAFETY: `buf` is writable for its length.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = usize::try_from(n).unwrap_or(0).min(buf.len());
        if deletes(&buf[..n], ifindex) {
            return Ok(true);
        }
    }
}

/// Whether the netlink datagram `msg` holds an `RTM_DELLINK` for `ifindex`.
/// Truncated or malformed messages are skipped, never a panic.
fn deletes(mut msg: &[u8], ifindex: u32) -> bool {
    const NLMSG_HDRLEN: usize = 16;
    // ifinfomsg: family u8, pad u8, type u16, index i32, flags u32, change u32.
    const IFI_INDEX: std::ops::Range<usize> = 4..8;
    while msg.len() >= NLMSG_HDRLEN {
        let len = u32::from_ne_bytes([msg[0], msg[1], msg[2], msg[3]]) as usize;
        let ty = u16::from_ne_bytes([msg[4], msg[5]]);
        if len < NLMSG_HDRLEN {
            return false;
        }
        if ty == libc::RTM_DELLINK
            && let Some(b) = msg
                .get(NLMSG_HDRLEN..len.min(msg.len()))
                .and_then(|body| body.get(IFI_INDEX))
            && u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) == ifindex
        {
            return true;
        }
        // NLMSG_ALIGN: messages are padded to 4 bytes.
        let next = (len + 3) & !3;
        if next >= msg.len() {
            return false;
        }
        msg = &msg[next..];
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A namespace whose file is gone, or is no namespace any more (a torn
    /// down sandbox), is gone; one the agent may not open is not.
    #[test]
    fn a_removed_or_unmounted_namespace_is_gone() {
        let open = |errno| {
            RawSockError::Netns(NetnsError::Open {
                path: "/var/run/netns/x".into(),
                source: io::Error::from_raw_os_error(errno),
            })
        };
        assert!(open(libc::ENOENT).is_netns_gone());
        assert!(!open(libc::EACCES).is_netns_gone());
        let unmounted = RawSockError::Netns(NetnsError::NotNetns {
            path: "/var/run/netns/x".into(),
        });
        assert!(unmounted.is_netns_gone());
        let gone = RawSockError::InterfaceGone {
            ifname: "eth0".into(),
            netns: None,
            source: io::Error::from_raw_os_error(libc::ENODEV),
        };
        assert!(!gone.is_netns_gone(), "the interface, not the namespace");
    }

    /// A netlink notification: header, ifinfomsg for `ifindex`, padding.
    fn link_msg(ty: u16, ifindex: u32, extra: usize) -> Vec<u8> {
        let len = 16 + 16 + extra;
        let mut m = Vec::new();
        m.extend_from_slice(&u32::try_from(len).unwrap().to_ne_bytes());
        m.extend_from_slice(&ty.to_ne_bytes());
        m.extend_from_slice(&[0; 10]); // flags, seq, pid
        m.extend_from_slice(&[0, 0, 1, 0]); // family, pad, type
        m.extend_from_slice(&ifindex.to_ne_bytes());
        m.extend_from_slice(&[0; 8]); // flags, change
        m.resize(len.next_multiple_of(4), 0xee);
        m
    }

    #[test]
    fn only_a_dellink_of_our_interface_counts_as_removal() {
        assert!(deletes(&link_msg(libc::RTM_DELLINK, 7, 0), 7));
        assert!(!deletes(&link_msg(libc::RTM_DELLINK, 8, 0), 7));
        assert!(!deletes(&link_msg(libc::RTM_NEWLINK, 7, 0), 7));
        // Second message of a datagram, after a padded first one.
        let mut two = link_msg(libc::RTM_NEWLINK, 7, 5);
        two.extend(link_msg(libc::RTM_DELLINK, 7, 0));
        assert!(deletes(&two, 7));
    }

    #[test]
    fn truncated_or_malformed_notifications_are_skipped() {
        let full = link_msg(libc::RTM_DELLINK, 7, 0);
        for cut in 0..full.len() {
            let _ = deletes(&full[..cut], 7);
        }
        assert!(!deletes(&full[..23], 7), "index not received");
        let mut zero_len = full.clone();
        zero_len[..4].copy_from_slice(&0u32.to_ne_bytes());
        assert!(!deletes(&zero_len, 7));
        let mut huge = full;
        huge[..4].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert!(
            deletes(&huge, 7),
            "the index is present even if the length lies"
        );
    }

    fn transmit(dst: Destination, src_ip: Ipv4Addr) -> Transmit {
        Transmit {
            payload: vec![1, 2, 3],
            xid: 0x1234_5678,
            src_ip,
            dst,
            kind: xdhcp_engine::MessageKind::Discover,
        }
    }

    #[test]
    fn broadcast_headers() {
        let t = transmit(Destination::Broadcast, Ipv4Addr::UNSPECIFIED);
        let h = headers_for([2, 0, 0, 0, 0, 1], None, &t);
        assert_eq!(h.dst_mac, BROADCAST_MAC);
        assert_eq!(h.dst_ip, Ipv4Addr::BROADCAST);
        assert_eq!(h.src_ip, Ipv4Addr::UNSPECIFIED);
        assert_eq!(h.src_mac, [2, 0, 0, 0, 0, 1]);
        assert_eq!((h.src_port, h.dst_port), (68, 67));
    }

    #[test]
    fn unicast_headers_use_leased_source_and_learned_mac() {
        let leased = Ipv4Addr::new(192, 0, 2, 10);
        let server = Ipv4Addr::new(192, 0, 2, 1);
        let t = transmit(
            Destination::Unicast {
                ip: server,
                mac: Some([2, 0, 0, 0, 0, 0xaa]),
            },
            leased,
        );
        let h = headers_for([2, 0, 0, 0, 0, 1], Some(7), &t);
        assert_eq!(h.dst_mac, [2, 0, 0, 0, 0, 0xaa]);
        assert_eq!(h.dst_ip, server);
        assert_eq!(h.src_ip, leased);
        assert_eq!(h.vlan, Some(7));
        // Without a learned MAC: Ethernet broadcast, IP unicast.
        let t = transmit(
            Destination::Unicast {
                ip: server,
                mac: None,
            },
            leased,
        );
        let h = headers_for([2, 0, 0, 0, 0, 1], None, &t);
        assert_eq!(h.dst_mac, BROADCAST_MAC);
        assert_eq!(h.dst_ip, server);
    }

    #[test]
    fn missing_interface_is_gone_and_bad_names_are_rejected() {
        let err = link_info_here("xdt-nope0").unwrap_err();
        assert!(err.is_interface_gone(), "{err:?}");
        assert!(err.to_string().contains("xdt-nope0"), "{err}");
        let err = RawSender::open_here("xdt-nope0").unwrap_err();
        assert!(err.is_interface_gone(), "{err:?}");
        for bad in ["", "0123456789abcdefg", "a/b"] {
            assert!(
                matches!(link_info_here(bad), Err(RawSockError::InvalidIfname { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn loopback_is_not_ethernet() {
        let err = link_info_here("lo").unwrap_err();
        assert!(
            matches!(err, RawSockError::NotEthernet { hw_type, .. } if hw_type == libc::ARPHRD_LOOPBACK),
            "{err:?}"
        );
    }

    /// Interface lookups run on every CNI ADD; they must not use a packet
    /// socket, whose close waits for an RCU grace period (5-30 ms each).
    #[test]
    fn lookups_use_an_inet_socket_not_a_packet_socket() {
        let sock = sys::ifreq::socket().unwrap();
        let mut domain: libc::c_int = 0;
        let mut len = size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: getsockopt(2) writes at most `len` bytes into `domain`.
        let rc = unsafe {
            libc::getsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_DOMAIN,
                (&raw mut domain).cast(),
                &raw mut len,
            )
        };
        assert_eq!(rc, 0, "{}", io::Error::last_os_error());
        assert_eq!(domain, libc::AF_INET);
    }
}
