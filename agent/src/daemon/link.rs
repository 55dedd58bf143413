//! Per-lease link I/O: interface lookup, the raw-socket sender and the
//! `AF_PACKET` receive fallback, all opened inside the target namespace.
//!
//! Sockets are created on a thread that entered the namespace
//! ([`crate::netns::run_in_netns_async`]) and keep that namespace for their
//! whole life; the lease task then uses them from any tokio worker.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use tokio::io::unix::AsyncFd;

use crate::datapath::frame::{self, FrameHeaders};
use crate::datapath::{RxFrame, RxPath};
use crate::netns::{NetnsError, run_in_netns_async};

/// Failure opening or using a link.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("entering network namespace {}: {source}", netns.display())]
    Netns {
        netns: PathBuf,
        #[source]
        source: NetnsError,
    },
    #[error("interface {ifname:?} not found in {}: {source}", netns_label(netns.as_deref()))]
    NoSuchInterface {
        ifname: String,
        netns: Option<PathBuf>,
        #[source]
        source: io::Error,
    },
    #[error("{op} on {ifname:?} in {}: {source}", netns_label(netns.as_deref()))]
    Io {
        op: &'static str,
        ifname: String,
        netns: Option<PathBuf>,
        #[source]
        source: io::Error,
    },
}

impl LinkError {
    /// Whether the error means the interface is gone (ENODEV/ENXIO).
    pub fn interface_gone(&self) -> bool {
        match self {
            Self::NoSuchInterface { .. } => true,
            Self::Io { source, .. } => is_gone(source),
            Self::Netns { .. } => false,
        }
    }
}

/// Whether an I/O error means the interface disappeared.
pub fn is_gone(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENODEV | libc::ENXIO | libc::ENETDOWN)
    )
}

fn netns_label(p: Option<&Path>) -> String {
    p.map_or_else(
        || "the host namespace".to_owned(),
        |p| p.display().to_string(),
    )
}

/// Interface index and MAC inside its namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkInfo {
    pub ifindex: u32,
    pub mac: [u8; 6],
}

/// The raw sender for one interface, plus (`AF_PACKET` fallback) its receiver.
#[derive(Debug)]
pub struct Link {
    pub ifname: String,
    pub netns: Option<PathBuf>,
    pub info: LinkInfo,
    tx: OwnedFd,
    rx: Option<AsyncFd<OwnedFd>>,
}

impl Link {
    /// Look the interface up and open its sender (and, with `afpacket_rx`,
    /// the filtered receive socket) inside `netns` (`None`: host namespace).
    pub async fn open(
        netns: Option<&Path>,
        ifname: &str,
        afpacket_rx: bool,
    ) -> Result<Self, LinkError> {
        let name = ifname.to_owned();
        let ns = netns.map(Path::to_path_buf);
        let work = move || open_here(&name, afpacket_rx);
        let opened = match netns {
            Some(p) => run_in_netns_async(p, work)
                .await
                .map_err(|source| LinkError::Netns {
                    netns: p.to_path_buf(),
                    source,
                })?,
            None => tokio::task::spawn_blocking(work)
                .await
                .map_err(|e| io::Error::other(e.to_string()))
                .and_then(|r| r),
        };
        let (info, tx, rx) = opened.map_err(|source| {
            if is_gone(&source) || source.kind() == io::ErrorKind::NotFound {
                LinkError::NoSuchInterface {
                    ifname: ifname.to_owned(),
                    netns: ns.clone(),
                    source,
                }
            } else {
                LinkError::Io {
                    op: "opening packet sockets",
                    ifname: ifname.to_owned(),
                    netns: ns.clone(),
                    source,
                }
            }
        })?;
        let rx = match rx {
            // SAFETY: the AsyncFd takes ownership of the descriptor and is the
            // only user of it; it is deregistered before the fd is closed.
            Some(fd) => Some(unsafe { AsyncFd::register(fd) }.map_err(|e| LinkError::Io {
                op: "registering the receive socket",
                ifname: ifname.to_owned(),
                netns: ns.clone(),
                source: e.into_parts().1,
            })?),
            None => None,
        };
        Ok(Self {
            ifname: ifname.to_owned(),
            netns: ns,
            info,
            tx,
            rx,
        })
    }

    /// Send one UDP frame built from `headers` and `payload`.
    pub fn send(&self, headers: &FrameHeaders, payload: &[u8]) -> Result<(), LinkError> {
        let bytes = frame::build_udp_frame(headers, payload);
        // SAFETY: `tx` is an open `AF_PACKET` socket bound to the interface;
        // the buffer is valid for `bytes.len()` bytes.
        let n = unsafe {
            libc::send(
                self.tx.as_raw_fd(),
                bytes.as_ptr().cast(),
                bytes.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n < 0 {
            return Err(LinkError::Io {
                op: "sending a DHCP frame",
                ifname: self.ifname.clone(),
                netns: self.netns.clone(),
                source: io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    /// Whether this link has its own `AF_PACKET` receiver.
    pub fn has_rx(&self) -> bool {
        self.rx.is_some()
    }

    /// Next DHCP server→client frame from the `AF_PACKET` receiver. Pends
    /// forever when the link has none (the eBPF dispatcher delivers instead).
    pub async fn recv(&self) -> Result<RxFrame, LinkError> {
        let Some(rx) = &self.rx else {
            return std::future::pending().await;
        };
        let mut buf = vec![0u8; 2048];
        loop {
            let mut guard = rx.readable().await.map_err(|source| LinkError::Io {
                op: "waiting for the receive socket",
                ifname: self.ifname.clone(),
                netns: self.netns.clone(),
                source,
            })?;
            let res = guard.try_io(|fd| {
                // SAFETY: reading into a buffer we own, of its full length.
                let n = unsafe {
                    libc::recv(
                        fd.as_raw_fd(),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                        libc::MSG_DONTWAIT,
                    )
                };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            match res {
                Ok(Ok(n)) => {
                    // Frames the filter let through but that do not parse are
                    // not ours to report; keep reading.
                    if let Ok((headers, payload)) = frame::parse_udp_frame(&buf[..n]) {
                        return Ok(RxFrame {
                            ifindex: self.info.ifindex,
                            ts_ns: 0,
                            headers,
                            payload: payload.to_vec(),
                            via: RxPath::AfPacket,
                        });
                    }
                }
                Ok(Err(source)) => {
                    return Err(LinkError::Io {
                        op: "receiving",
                        ifname: self.ifname.clone(),
                        netns: self.netns.clone(),
                        source,
                    });
                }
                Err(_would_block) => {}
            }
        }
    }
}

/// Classic BPF: IPv4, UDP, not a fragment, destination port 68.
const DHCP_CLIENT_FILTER: [libc::sock_filter; 11] = [
    bpf(0x28, 0, 0, 12),
    bpf(0x15, 0, 8, 0x0800),
    bpf(0x30, 0, 0, 23),
    bpf(0x15, 0, 6, 17),
    bpf(0x28, 0, 0, 20),
    bpf(0x45, 4, 0, 0x1fff),
    bpf(0xb1, 0, 0, 14),
    bpf(0x48, 0, 0, 16),
    bpf(0x15, 0, 1, 68),
    bpf(0x06, 0, 0, 0x0004_0000),
    bpf(0x06, 0, 0, 0),
];

const fn bpf(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

type Opened = (LinkInfo, OwnedFd, Option<OwnedFd>);

/// Runs on a thread inside the target namespace.
fn open_here(ifname: &str, afpacket_rx: bool) -> io::Result<Opened> {
    let ifindex = nix::net::if_::if_nametoindex(ifname).map_err(io::Error::from)?;
    let mac = hw_addr(ifname)?;
    let tx = packet_socket(ifindex, 0)?;
    let rx = if afpacket_rx {
        let fd = packet_socket(ifindex, (libc::ETH_P_IP as u16).to_be())?;
        let prog = libc::sock_fprog {
            len: DHCP_CLIENT_FILTER.len() as u16,
            filter: DHCP_CLIENT_FILTER.as_ptr().cast_mut(),
        };
        // SAFETY: `prog` points at a static filter that outlives the call.
        let r = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_ATTACH_FILTER,
                (&raw const prog).cast(),
                size_of::<libc::sock_fprog>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Some(fd)
    } else {
        None
    };
    Ok((LinkInfo { ifindex, mac }, tx, rx))
}

/// An `AF_PACKET` raw socket bound to `ifindex`; `proto` (network order) 0
/// means send-only (nothing is queued for receive).
fn packet_socket(ifindex: u32, proto: u16) -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the fd is owned immediately.
    let raw = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            i32::from(proto),
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh, valid descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: zeroed sockaddr_ll is a valid value; fields set below.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = proto;
    sll.sll_ifindex = ifindex as i32;
    // SAFETY: `sll` is a properly sized sockaddr_ll.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&raw const sll).cast(),
            size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// SIOCGIFHWADDR on a throwaway socket in the current namespace.
fn hw_addr(ifname: &str) -> io::Result<[u8; 6]> {
    // SAFETY: plain socket(2); the fd is owned immediately.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: zeroed ifreq is valid; the name is copied in with a NUL left.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(ifname.bytes().take(15)) {
        *dst = src as libc::c_char;
    }
    // SAFETY: SIOCGIFHWADDR fills `ifr_ifru.ifru_hwaddr` of a valid ifreq.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFHWADDR, &raw mut req) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the ioctl succeeded, so the hwaddr member is initialised.
    let data = unsafe { req.ifr_ifru.ifru_hwaddr.sa_data };
    let mut mac = [0u8; 6];
    for (m, d) in mac.iter_mut().zip(data.iter()) {
        *m = *d as u8;
    }
    Ok(mac)
}

/// Format a MAC as `aa:bb:cc:dd:ee:ff`.
pub fn mac_string(mac: [u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_lookup_and_missing_interface() {
        let (info, _tx, rx) = open_here("lo", true).expect("lo exists and we are root");
        assert_eq!(info.ifindex, 1);
        assert_eq!(info.mac, [0; 6]);
        assert!(rx.is_some());
        let e = open_here("xdt-nope0", false).unwrap_err();
        assert!(is_gone(&e) || e.kind() == io::ErrorKind::NotFound, "{e}");
        assert_eq!(mac_string([2, 0, 0, 0, 0, 0xab]), "02:00:00:00:00:ab");
    }
}
