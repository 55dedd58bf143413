//! One attachment's router-advertisement socket: a raw `ICMPv6` socket in the
//! pod's namespace, bound to its interface, that hears only router
//! advertisements (the kernel's `ICMPv6` filter) with each one's hop limit,
//! and sends router solicitations. What the advertisements mean is
//! [`xdhcp_engine::v6::ra`]'s; this is only the socket.
//!
//! The pod's own kernel hears the same advertisements and acts on them as
//! its `accept_ra` says; this socket only reads them.

use std::io::{self, IoSliceMut};
use std::net::Ipv6Addr;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::path::Path;

use nix::sys::socket::{ControlMessageOwned, MsgFlags, SockaddrIn6, recvmsg, sendto};
use tokio::io::unix::AsyncFd;
use xdhcp_engine::v6::ra::{ALL_ROUTERS, ND_HOP_LIMIT, ROUTER_ADVERTISEMENT};

use crate::datapath::link::LinkError;
use crate::datapath::rawsock::classify;
use crate::datapath::udp6::{bind_to_device, set};
use crate::sys::netns::run_in_or_here;

/// `ICMPV6_FILTER` (linux/icmpv6.h), at level `IPPROTO_ICMPV6`: which
/// `ICMPv6` types the socket hears (a set bit blocks the type).
const ICMPV6_FILTER: libc::c_int = 1;

/// A router-advertisement socket on one interface of one namespace.
#[derive(Debug)]
pub(crate) struct RouterSocket {
    fd: AsyncFd<OwnedFd>,
    ifindex: u32,
}

/// A router advertisement as received: the `ICMPv6` message, its source and
/// the hop limit it arrived with (for the checks of RFC 4861 §6.1.2).
#[derive(Debug)]
pub(crate) struct Received {
    pub(crate) icmp: Vec<u8>,
    pub(crate) source: Ipv6Addr,
    pub(crate) hop_limit: u8,
}

impl RouterSocket {
    /// Open the socket for `ifname` (index `ifindex`) in `netns` (`None`:
    /// the agent's own). Must be called within a tokio runtime.
    pub(crate) async fn open(
        netns: Option<&Path>,
        ifname: &str,
        ifindex: u32,
    ) -> Result<Self, LinkError> {
        let name = ifname.to_owned();
        let made = run_in_or_here(netns, move || raw_socket(&name, ifindex)).await?;
        let error = |op, source| classify(op, ifname, netns, source);
        let fd = made.map_err(|(op, source)| error(op, source))?;
        // SAFETY: the OwnedFd is moved into the AsyncFd, which owns it and
        // keeps it open for as long as it is registered.
        let fd = unsafe { AsyncFd::register(fd) }
            .map_err(|e| error("register the ICMPv6 socket", e.into_parts().1))?;
        Ok(Self { fd, ifindex })
    }

    /// Send a router solicitation (`rs`, the `ICMPv6` message; the kernel
    /// fills its checksum) to all routers on the link.
    pub(crate) async fn solicit(&self, rs: &[u8]) -> io::Result<()> {
        let to = SockaddrIn6::from(std::net::SocketAddrV6::new(ALL_ROUTERS, 0, 0, self.ifindex));
        loop {
            let mut ready = self.fd.writable().await?;
            match ready.try_io(|fd| {
                sendto(fd.as_raw_fd(), rs, &to, MsgFlags::empty())
                    .map(|_| ())
                    .map_err(io::Error::from)
            }) {
                Ok(done) => return done,
                Err(_would_block) => {}
            }
        }
    }

    /// The next router advertisement the socket hears.
    pub(crate) async fn recv(&self) -> io::Result<Received> {
        let mut buf = vec![0u8; 1500];
        loop {
            let mut ready = self.fd.readable().await?;
            let got = ready.try_io(|fd| {
                let mut iov = [IoSliceMut::new(&mut buf)];
                let mut cmsg = nix::cmsg_space!(libc::c_int);
                let msg = recvmsg::<SockaddrIn6>(
                    fd.as_raw_fd(),
                    &mut iov,
                    Some(&mut cmsg),
                    MsgFlags::empty(),
                )
                .map_err(io::Error::from)?;
                let hop_limit = msg
                    .cmsgs()
                    .map_err(io::Error::from)?
                    .find_map(|c| match c {
                        ControlMessageOwned::Ipv6HopLimit(h) => u8::try_from(h).ok(),
                        _ => None,
                    })
                    // Without the ancillary data the limit is unknown:
                    // taken as not 255, so the message is not believed.
                    .unwrap_or(0);
                let source = msg.address.map_or(Ipv6Addr::UNSPECIFIED, |a| a.ip());
                Ok((msg.bytes, source, hop_limit))
            });
            match got {
                Ok(Ok((n, source, hop_limit))) => {
                    return Ok(Received {
                        icmp: buf[..n].to_vec(),
                        source,
                        hop_limit,
                    });
                }
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => {}
            }
        }
    }
}

/// The socket, made in the namespace the calling thread is in.
fn raw_socket(ifname: &str, ifindex: u32) -> Result<OwnedFd, (&'static str, io::Error)> {
    // SAFETY: plain socket(2); the result is checked before use.
    let raw = unsafe {
        libc::socket(
            libc::AF_INET6,
            libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            libc::IPPROTO_ICMPV6,
        )
    };
    if raw < 0 {
        return Err(("create a raw ICMPv6 socket", io::Error::last_os_error()));
    }
    // SAFETY: `raw` is a fresh descriptor owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // Every type blocked but router advertisements.
    let mut filter = [u32::MAX; 8];
    let t = usize::from(ROUTER_ADVERTISEMENT);
    filter[t >> 5] &= !(1u32 << (t & 31));
    set(&fd, libc::IPPROTO_ICMPV6, ICMPV6_FILTER, &filter)
        .map_err(|e| ("set the ICMPv6 filter", e))?;
    let one: libc::c_int = 1;
    set(&fd, libc::IPPROTO_IPV6, libc::IPV6_RECVHOPLIMIT, &one)
        .map_err(|e| ("set IPV6_RECVHOPLIMIT", e))?;
    let hops = libc::c_int::from(ND_HOP_LIMIT);
    set(&fd, libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_HOPS, &hops)
        .map_err(|e| ("set IPV6_MULTICAST_HOPS", e))?;
    let index = libc::c_int::try_from(ifindex).unwrap_or(0);
    set(&fd, libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_IF, &index)
        .map_err(|e| ("set IPV6_MULTICAST_IF", e))?;
    bind_to_device(&fd, ifname).map_err(|e| ("bind the ICMPv6 socket to the interface", e))?;
    Ok(fd)
}
