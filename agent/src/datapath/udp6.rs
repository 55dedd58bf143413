//! One DHCPv6 lease's socket: UDP bound to `[::]:546` on the pod's
//! interface, inside the pod's network namespace.
//!
//! The lease sends through it (the pod's kernel picks the source address,
//! its link-local one) and reads from it what the capture programs did not
//! take: where the eBPF capture serves the interface, the replies to the
//! transactions the lease owns in the kernel come over the ring buffer
//! instead (`lease/v6.rs`, `docs/dhcpv6.md`).

use std::io;
use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};

use tokio::net::UdpSocket;

/// The `DHCPv6` client port (RFC 8415 §7.2).
pub(crate) const CLIENT_PORT: u16 = 546;
/// The `DHCPv6` server and relay port.
pub(crate) const SERVER_PORT: u16 = 547;

/// A `DHCPv6` client socket on one interface of one namespace.
#[derive(Debug)]
pub(crate) struct Udp6 {
    sock: UdpSocket,
    ifindex: u32,
}

impl Udp6 {
    /// The socket `fd`, made by [`bound_socket`] in the interface's
    /// namespace (in the trip that opens the link, `Sockets::Udp6`, or in
    /// one of its own), for the interface of index `ifindex`. Must be
    /// called within a tokio runtime.
    pub(crate) fn from_fd(fd: OwnedFd, ifindex: u32) -> io::Result<Self> {
        let sock = UdpSocket::from_std(std::net::UdpSocket::from(fd))?;
        Ok(Self { sock, ifindex })
    }

    /// The interface's index.
    pub(crate) fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// Send `payload` to `dst` port 547 out of the interface.
    pub(crate) async fn send(&self, payload: &[u8], dst: Ipv6Addr) -> io::Result<()> {
        let scope = if is_link_scoped(dst) { self.ifindex } else { 0 };
        let to = SocketAddrV6::new(dst, SERVER_PORT, 0, scope);
        self.sock.send_to(payload, to).await.map(|_| ())
    }

    /// The next datagram: its length and source address.
    pub(crate) async fn recv(&self, buf: &mut [u8]) -> io::Result<(usize, Ipv6Addr)> {
        loop {
            let (n, from) = self.sock.recv_from(buf).await?;
            if let SocketAddr::V6(a) = from {
                return Ok((n, *a.ip()));
            }
        }
    }
}

/// Link-local unicast or link-scoped multicast: needs the interface named.
fn is_link_scoped(a: Ipv6Addr) -> bool {
    let s = a.segments()[0];
    (s & 0xffc0) == 0xfe80 || (s & 0xff0f) == 0xff02
}

/// The socket, made in the namespace the calling thread is in: the failed
/// step and its error otherwise.
pub(crate) fn bound_socket(
    ifname: &str,
    ifindex: u32,
) -> Result<OwnedFd, (&'static str, io::Error)> {
    // SAFETY: plain socket(2); the result is checked before use.
    let raw = unsafe {
        libc::socket(
            libc::AF_INET6,
            libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            libc::IPPROTO_UDP,
        )
    };
    if raw < 0 {
        return Err(("create a UDP socket", io::Error::last_os_error()));
    }
    // SAFETY: `raw` is a fresh descriptor owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let one: libc::c_int = 1;
    set(&fd, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, &one)
        .map_err(|e| ("set IPV6_V6ONLY on the DHCPv6 socket", e))?;
    let index = libc::c_int::try_from(ifindex).unwrap_or(0);
    set(&fd, libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_IF, &index)
        .map_err(|e| ("set IPV6_MULTICAST_IF on the DHCPv6 socket", e))?;
    bind_to_device(&fd, ifname).map_err(|e| ("bind the DHCPv6 socket to the interface", e))?;
    // SAFETY: an all-zero sockaddr_in6 is valid; the fields are set below.
    let mut sa: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
    sa.sin6_family = libc::AF_INET6 as libc::sa_family_t;
    sa.sin6_port = CLIENT_PORT.to_be();
    // SAFETY: `sa` is a valid sockaddr_in6 of the length given.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&raw const sa).cast(),
            libc::socklen_t::try_from(std::mem::size_of::<libc::sockaddr_in6>()).unwrap_or(0),
        )
    };
    if rc < 0 {
        return Err(("bind [::]:546", io::Error::last_os_error()));
    }
    Ok(fd)
}

/// `SO_BINDTODEVICE` to `ifname`: the socket hears and sends on it only.
pub(super) fn bind_to_device(fd: &OwnedFd, ifname: &str) -> io::Result<()> {
    // SAFETY: the name's bytes and length are passed as setsockopt reads them.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_BINDTODEVICE,
            ifname.as_ptr().cast(),
            libc::socklen_t::try_from(ifname.len()).unwrap_or(0),
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `setsockopt` of a plain value.
pub(super) fn set<T>(fd: &OwnedFd, level: i32, name: i32, value: &T) -> io::Result<()> {
    // SAFETY: `value` points to a live T of the length given.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            std::ptr::from_ref(value).cast(),
            libc::socklen_t::try_from(std::mem::size_of::<T>()).unwrap_or(0),
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_scoped_destinations_name_the_interface() {
        assert!(is_link_scoped("ff02::1:2".parse().unwrap()));
        assert!(is_link_scoped("fe80::1".parse().unwrap()));
        assert!(!is_link_scoped("2001:db8::1".parse().unwrap()));
        assert!(!is_link_scoped("ff05::1:3".parse().unwrap()));
    }
}
