//! Raw AF_PACKET sender opened inside the target network namespace.
//!
//! A DHCP client has no usable IP configuration while it acquires a lease
//! (source 0.0.0.0, destination 255.255.255.255) and the interface lives in a
//! pod namespace, so requests are sent as whole Ethernet frames from an
//! AF_PACKET socket created inside that namespace ([`crate::netns`]) and bound
//! to the interface (SPEC R11). The socket uses protocol 0, so it never
//! receives anything; it is opened once per lease and closed on drop.
//!
//! Frames are built around the engine's [`Transmit`] payloads with
//! [`frame::build_udp_frame`]: broadcast to `ff:ff:ff:ff:ff:ff` /
//! 255.255.255.255, or unicast to the server (RENEWING, RELEASE — sourced
//! from the leased address, SPEC R4) at the MAC the engine learned.
//!
//! Interface removal (ENODEV/ENXIO/ENETDOWN) is reported as the typed
//! [`RawSockError::InterfaceGone`] so the lease can end instead of retrying.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use xdhcp_engine::{Destination, Transmit};

use super::frame::{self, FrameHeaders};
use crate::netns::{NetnsError, run_in_netns, run_in_netns_async};

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

    /// Bounded label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Netns(_) => "netns",
            Self::InterfaceGone { .. } => "interface_gone",
            Self::NotEthernet { .. } => "not_ethernet",
            Self::InvalidIfname { .. } => "invalid_ifname",
            Self::TooLarge { .. } => "too_large",
            Self::Io { .. } => "io",
        }
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
    let invalid = || RawSockError::InvalidIfname {
        ifname: ifname.to_owned(),
    };
    if ifname.is_empty()
        || ifname.len() >= libc::IFNAMSIZ
        || ifname.bytes().any(|b| b == 0 || b == b'/')
    {
        return Err(invalid());
    }
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(ifname.bytes()) {
        *dst = src as libc::c_char;
    }
    Ok(req)
}

/// Runs one `SIOCGIF*` ioctl on `fd`.
fn ifreq_ioctl(fd: RawFd, request: libc::Ioctl, req: &mut libc::ifreq) -> io::Result<()> {
    // SAFETY: `req` is a valid ifreq for the duration of the call and every
    // request used here reads/writes only within it.
    let rc = unsafe { libc::ioctl(fd, request, std::ptr::from_mut(req)) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Creates an `AF_PACKET`/`SOCK_RAW` socket (close-on-exec) for `protocol`
/// (network byte order already applied by the caller, 0 = receive nothing).
pub(crate) fn packet_socket(protocol: u16, nonblocking: bool) -> io::Result<OwnedFd> {
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

/// A socket for interface ioctls (cheap to open and close).
fn query_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Binds a packet socket to `ifindex` for `protocol` (network byte order).
pub(crate) fn bind_packet(fd: &OwnedFd, ifindex: u32, protocol: u16) -> io::Result<()> {
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

fn link_info_with(ifname: &str, netns: Option<&Path>) -> Result<LinkInfo> {
    let mut req = ifreq_for(ifname)?;
    // A UDP socket, not AF_PACKET: closing a packet socket waits for an RCU
    // grace period (packet_release -> synchronize_net, 5-30 ms), which every
    // lookup on the CNI ADD path paid; interface ioctls work on any socket.
    let sock = query_socket().map_err(|e| classify("open a query socket", ifname, netns, e))?;
    let fd = sock.as_raw_fd();
    let lookup = |op: &'static str, e: io::Error| {
        // A missing interface is ENODEV: report it as gone.
        classify(op, ifname, netns, e)
    };
    ifreq_ioctl(fd, libc::SIOCGIFINDEX, &mut req)
        .map_err(|e| lookup("look up the interface index", e))?;
    // SAFETY: SIOCGIFINDEX filled the ifindex member of the union.
    let ifindex = unsafe { req.ifr_ifru.ifru_ifindex } as u32;
    ifreq_ioctl(fd, libc::SIOCGIFHWADDR, &mut req)
        .map_err(|e| lookup("read the hardware address", e))?;
    // SAFETY: SIOCGIFHWADDR filled the hwaddr member of the union.
    let hw = unsafe { req.ifr_ifru.ifru_hwaddr };
    if hw.sa_family != libc::ARPHRD_ETHER {
        return Err(RawSockError::NotEthernet {
            ifname: ifname.to_owned(),
            netns: netns.map(Path::to_path_buf),
            hw_type: hw.sa_family,
        });
    }
    let mut mac = [0u8; 6];
    for (dst, src) in mac.iter_mut().zip(hw.sa_data.iter()) {
        *dst = *src as u8;
    }
    ifreq_ioctl(fd, libc::SIOCGIFMTU, &mut req).map_err(|e| lookup("read the MTU", e))?;
    // SAFETY: SIOCGIFMTU filled the mtu member of the union.
    let mtu = unsafe { req.ifr_ifru.ifru_mtu } as u32;
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
/// for RENEW/REBIND/RELEASE — SPEC R4); ports are 68 → 67.
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
        let info = link_info_with(ifname, netns)?;
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

    /// Tags every frame with VLAN `vid` (802.1Q).
    #[must_use]
    pub fn with_vlan(mut self, vid: Option<u16>) -> Self {
        self.vlan = vid;
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
