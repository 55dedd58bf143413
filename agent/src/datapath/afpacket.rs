//! AF_PACKET receive path with a classic BPF filter: the fallback when the eBPF program cannot attach.
//!
//! The socket is opened inside the target namespace and bound to one
//! interface. A classic BPF filter ([`dhcp_reply_filter`]) lets only what the
//! eBPF program would capture reach user space: IPv4 (untagged or with one
//! 802.1Q/802.1ad tag in the frame), not a fragment, UDP source port 67,
//! destination port 68. The socket is created with protocol 0 (receives
//! nothing), the filter attached, and only then bound to `ETH_P_ALL` on the
//! interface, so no unfiltered frame is ever queued.
//!
//! A lease's receiver is narrowed to its client's hardware address
//! ([`AfPacketReceiver::only_for`]: `chaddr` in the BOOTP header): servers
//! such as dnsmasq broadcast OFFER and ACK, so on a shared segment every
//! client's socket would otherwise wake for every other client's replies,
//! O(n²) work in a burst of n pods starting at once.
//!
//! VLAN tags that the driver stripped (offload) are recovered from
//! `PACKET_AUXDATA`. Frames are parsed with [`frame::parse_udp_frame`]; a
//! frame that does not parse or is truncated is counted and skipped, never a
//! panic or an error.
//!
//! One thing: the `AF_PACKET` receiver, its classic BPF filter and the
//! filter's interpreter-based tests.

use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use super::frame::{self, ETH_P_8021AD, ETH_P_8021Q, ETH_P_IP};
use super::rawsock::{
    self, LinkInfo, RawSockError, SERVER_PORT, bind_packet, classify, packet_socket,
};
use super::{RxFrame, RxPath};
use crate::sys::netns::{run_in_netns, run_in_netns_async};

/// Receive buffer: a jumbo frame plus a VLAN tag; anything longer is truncated and counted.
const RECV_BUF: usize = 9216 + 18;

/// One classic BPF instruction (`struct sock_filter`).
pub type SockFilter = libc::sock_filter;

const BPF_LD: u16 = 0x00;
const BPF_LDX: u16 = 0x01;
const BPF_JMP: u16 = 0x05;
const BPF_RET: u16 = 0x06;
const BPF_W: u16 = 0x00;
const BPF_H: u16 = 0x08;
const BPF_B: u16 = 0x10;
const BPF_ABS: u16 = 0x20;
const BPF_IND: u16 = 0x40;
const BPF_MSH: u16 = 0xa0;
const BPF_JEQ: u16 = 0x10;
const BPF_JSET: u16 = 0x40;
const BPF_K: u16 = 0x00;

/// Accept: return up to this many bytes of the frame.
const ACCEPT_LEN: u32 = 0x0004_0000;
/// IPv4 flags/fragment-offset bits that mark a fragment (MF + offset).
const FRAGMENT_BITS: u32 = 0x3fff;
const IPPROTO_UDP: u32 = 17;
const CLIENT_PORT: u32 = rawsock::CLIENT_PORT as u32;

/// Straight-line instruction.
const fn stmt(code: u16, k: u32) -> SockFilter {
    SockFilter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

/// Conditional jump with absolute targets resolved to relative offsets.
const fn jump(pc: usize, code: u16, k: u32, jt_abs: usize, jf_abs: usize) -> SockFilter {
    assert!(jt_abs > pc && jf_abs > pc && jt_abs - pc - 1 <= 255 && jf_abs - pc - 1 <= 255);
    SockFilter {
        code,
        jt: (jt_abs - pc - 1) as u8,
        jf: (jf_abs - pc - 1) as u8,
        k,
    }
}

/// Offset of `chaddr` in the BOOTP message, plus the 8-byte UDP header.
const CHADDR_AFTER_IP: u32 = 8 + 28;

/// The classic BPF program: DHCP server→client UDP in IPv4, with at most
/// one in-frame VLAN tag, not fragmented; with `chaddr`, only replies whose
/// BOOTP `chaddr` is that hardware address.
pub fn dhcp_reply_filter(chaddr: Option<[u8; 6]>) -> Vec<SockFilter> {
    // Absolute instruction indexes of the labels: the EtherType dispatch,
    // then for each of the untagged and tagged L3 offsets the IPv4/UDP
    // checks and (with `chaddr`) the chaddr check, then ACCEPT and DROP.
    const VLAN: usize = 4;
    const IP: usize = 6;
    let per_l3 = 9 + if chaddr.is_some() { 4 } else { 0 };
    let ip_tagged = IP + per_l3;
    let accept = ip_tagged + per_l3;
    let drop = accept + 1;
    // IPv4 + UDP checks at L3 offset `l3`, starting at instruction `at`.
    let l3_checks = |at: usize, l3: u32| {
        let matched = if chaddr.is_some() { at + 9 } else { accept };
        let mut p = vec![
            stmt(BPF_LD | BPF_B | BPF_ABS, l3 + 9), // protocol
            jump(at + 1, BPF_JMP | BPF_JEQ | BPF_K, IPPROTO_UDP, at + 2, drop),
            stmt(BPF_LD | BPF_H | BPF_ABS, l3 + 6), // flags + fragment offset
            jump(
                at + 3,
                BPF_JMP | BPF_JSET | BPF_K,
                FRAGMENT_BITS,
                drop,
                at + 4,
            ),
            stmt(BPF_LDX | BPF_B | BPF_MSH, l3), // X = IHL * 4
            stmt(BPF_LD | BPF_H | BPF_IND, l3),  // UDP source port
            jump(
                at + 6,
                BPF_JMP | BPF_JEQ | BPF_K,
                u32::from(SERVER_PORT),
                at + 7,
                drop,
            ),
            stmt(BPF_LD | BPF_H | BPF_IND, l3 + 2), // UDP destination port
            jump(
                at + 8,
                BPF_JMP | BPF_JEQ | BPF_K,
                CLIENT_PORT,
                matched,
                drop,
            ),
        ];
        if let Some(mac) = chaddr {
            let hi = u32::from_be_bytes([mac[0], mac[1], mac[2], mac[3]]);
            let lo = u32::from(u16::from_be_bytes([mac[4], mac[5]]));
            p.extend([
                // chaddr[0..4], then chaddr[4..6]
                stmt(BPF_LD | BPF_W | BPF_IND, l3 + CHADDR_AFTER_IP),
                jump(at + 10, BPF_JMP | BPF_JEQ | BPF_K, hi, at + 11, drop),
                stmt(BPF_LD | BPF_H | BPF_IND, l3 + CHADDR_AFTER_IP + 4),
                jump(at + 12, BPF_JMP | BPF_JEQ | BPF_K, lo, accept, drop),
            ]);
        }
        p
    };
    let mut prog = vec![
        stmt(BPF_LD | BPF_H | BPF_ABS, 12), // EtherType / TPID
        jump(1, BPF_JMP | BPF_JEQ | BPF_K, u32::from(ETH_P_IP), IP, 2),
        jump(
            2,
            BPF_JMP | BPF_JEQ | BPF_K,
            u32::from(ETH_P_8021Q),
            VLAN,
            3,
        ),
        jump(
            3,
            BPF_JMP | BPF_JEQ | BPF_K,
            u32::from(ETH_P_8021AD),
            VLAN,
            drop,
        ),
        stmt(BPF_LD | BPF_H | BPF_ABS, 16), // inner EtherType
        jump(
            5,
            BPF_JMP | BPF_JEQ | BPF_K,
            u32::from(ETH_P_IP),
            ip_tagged,
            drop,
        ),
    ];
    debug_assert_eq!(prog.len(), IP);
    prog.extend(l3_checks(IP, 14));
    debug_assert_eq!(prog.len(), ip_tagged);
    prog.extend(l3_checks(ip_tagged, 18));
    debug_assert_eq!(prog.len(), accept);
    prog.push(stmt(BPF_RET | BPF_K, ACCEPT_LEN));
    prog.push(stmt(BPF_RET | BPF_K, 0));
    debug_assert_eq!(prog.len(), drop + 1);
    prog
}

/// Attaches (or replaces: the kernel swaps filters atomically) the filter.
fn attach_filter(fd: RawFd, chaddr: Option<[u8; 6]>) -> io::Result<()> {
    let prog = dhcp_reply_filter(chaddr);
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr().cast_mut(),
    };
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &fprog)
}

/// Counters of one receiver.
#[derive(Debug, Default)]
pub struct RxStats {
    /// Frames delivered as [`RxFrame`].
    pub received: AtomicU64,
    /// Frames that passed the filter but failed to parse (or were not 67→68).
    pub bad_frames: AtomicU64,
    /// Frames longer than the receive buffer.
    pub truncated: AtomicU64,
}

/// A snapshot of [`RxStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RxCounts {
    pub received: u64,
    pub bad_frames: u64,
    pub truncated: u64,
}

impl RxStats {
    /// Reads all counters.
    pub fn snapshot(&self) -> RxCounts {
        RxCounts {
            received: self.received.load(Ordering::Relaxed),
            bad_frames: self.bad_frames.load(Ordering::Relaxed),
            truncated: self.truncated.load(Ordering::Relaxed),
        }
    }
}

/// A filtered AF_PACKET receiver bound to one interface.
#[derive(Debug)]
pub struct AfPacketReceiver {
    fd: AsyncFd<OwnedFd>,
    ifname: String,
    netns: Option<PathBuf>,
    info: LinkInfo,
    stats: RxStats,
}

fn setsockopt<T>(fd: RawFd, level: i32, name: i32, value: &T) -> io::Result<()> {
    // SAFETY: `value` points to a live T of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            std::ptr::from_ref(value).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Opens, filters and binds the socket in the calling thread's namespace.
fn open_socket(
    ifname: &str,
    netns: Option<&Path>,
    chaddr: Option<[u8; 6]>,
) -> Result<(OwnedFd, LinkInfo), RawSockError> {
    let info = if let Some(ns) = netns {
        rawsock::link_info_here(ifname).map_err(|e| match e {
            RawSockError::InterfaceGone { ifname, source, .. } => RawSockError::InterfaceGone {
                ifname,
                netns: Some(ns.to_path_buf()),
                source,
            },
            other => other,
        })?
    } else {
        rawsock::link_info_here(ifname)?
    };
    open_socket_for(ifname, info, netns, chaddr).map(|fd| (fd, info))
}

/// [`open_socket`] for `ifname` already found as `info`.
fn open_socket_for(
    ifname: &str,
    info: LinkInfo,
    netns: Option<&Path>,
    chaddr: Option<[u8; 6]>,
) -> Result<OwnedFd, RawSockError> {
    let fd =
        packet_socket(0, true).map_err(|e| classify("open a packet socket", ifname, netns, e))?;
    attach_filter(fd.as_raw_fd(), chaddr)
        .map_err(|e| classify("attach the BPF filter", ifname, netns, e))?;
    setsockopt(
        fd.as_raw_fd(),
        libc::SOL_PACKET,
        libc::PACKET_AUXDATA,
        &1i32,
    )
    .map_err(|e| classify("enable PACKET_AUXDATA", ifname, netns, e))?;
    // Our own transmissions (and the pod's egress) need not be cloned to this
    // socket at all; kernels before 4.20 lack the option and we skip those
    // frames by packet type instead.
    if let Err(error) = setsockopt(
        fd.as_raw_fd(),
        libc::SOL_PACKET,
        libc::PACKET_IGNORE_OUTGOING,
        &1i32,
    ) {
        tracing::debug!(ifname, %error, "PACKET_IGNORE_OUTGOING unavailable");
    }
    // ETH_P_ALL, not ETH_P_IP: on a bridge port (a VM's pod interface under
    // KubeVirt's in-pod bridge) only taps see frames before the bridge
    // consumes them.
    bind_packet(&fd, info.ifindex, (libc::ETH_P_ALL as u16).to_be())
        .map_err(|e| classify("bind the packet socket", ifname, netns, e))?;
    Ok(fd)
}

/// Outcome of one `recvmsg`.
enum Recv {
    Frame(RxFrame),
    Skipped,
}

impl AfPacketReceiver {
    fn from_socket(
        fd: OwnedFd,
        info: LinkInfo,
        ifname: &str,
        netns: Option<&Path>,
    ) -> Result<Self, RawSockError> {
        // SAFETY: an OwnedFd always reports the same, open descriptor and
        // stays open until the AsyncFd (which owns it) is dropped.
        // ERROR interest too: when the interface is unregistered the kernel
        // sets ENETDOWN on the socket and reports only EPOLLERR.
        let fd =
            unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE | Interest::ERROR) }
                .map_err(|e| classify("register the socket with tokio", ifname, netns, e.into()))?;
        Ok(Self {
            fd,
            ifname: ifname.to_owned(),
            netns: netns.map(Path::to_path_buf),
            info,
            stats: RxStats::default(),
        })
    }

    /// Opens a receiver on `ifname` in the calling thread's namespace.
    /// Must be called within a tokio runtime.
    pub fn open_here(ifname: &str) -> Result<Self, RawSockError> {
        let (fd, info) = open_socket(ifname, None, None)?;
        Self::from_socket(fd, info, ifname, None)
    }

    /// Opens a receiver on `ifname` in the calling thread's namespace that
    /// takes only replies for the client with hardware address `chaddr`
    /// (as [`AfPacketReceiver::only_for`] would narrow it, with one filter
    /// attached instead of two). Must be called within a tokio runtime.
    pub fn open_here_for(ifname: &str, chaddr: [u8; 6]) -> Result<Self, RawSockError> {
        let (fd, info) = open_socket(ifname, None, Some(chaddr))?;
        Self::from_socket(fd, info, ifname, None)
    }

    /// [`AfPacketReceiver::open_here_for`] on `ifname` already found as
    /// `info` (the sender's lookup, in the same namespace).
    pub(crate) fn open_here_on(
        ifname: &str,
        info: LinkInfo,
        chaddr: [u8; 6],
    ) -> Result<Self, RawSockError> {
        let fd = open_socket_for(ifname, info, None, Some(chaddr))?;
        Self::from_socket(fd, info, ifname, None)
    }

    /// Opens a receiver on `ifname` inside the namespace at `netns`.
    /// Must be called within a tokio runtime (the socket is registered with
    /// the caller's reactor; it was created on the namespace thread).
    pub fn open(netns: &Path, ifname: &str) -> Result<Self, RawSockError> {
        let name = ifname.to_owned();
        let ns = netns.to_path_buf();
        let (fd, info) = run_in_netns(netns, move || open_socket(&name, Some(&ns), None))??;
        Self::from_socket(fd, info, ifname, Some(netns))
    }

    /// Async form of [`AfPacketReceiver::open`].
    pub async fn open_async(netns: &Path, ifname: &str) -> Result<Self, RawSockError> {
        let name = ifname.to_owned();
        let ns = netns.to_path_buf();
        let (fd, info) =
            run_in_netns_async(netns, move || open_socket(&name, Some(&ns), None)).await??;
        Self::from_socket(fd, info, ifname, Some(netns))
    }

    /// Opens in `netns`, or in the agent's own namespace for `None`.
    pub async fn open_in(netns: Option<&Path>, ifname: &str) -> Result<Self, RawSockError> {
        match netns {
            Some(ns) => Self::open_async(ns, ifname).await,
            None => Self::open_here(ifname),
        }
    }

    /// The interface (index, MAC, MTU) found at open time.
    pub fn info(&self) -> LinkInfo {
        self.info
    }

    /// From now on, receive only replies for the client with hardware
    /// address `chaddr` (frames already queued are still delivered; the
    /// engine ignores replies that are not its own).
    pub fn only_for(&self, chaddr: [u8; 6]) -> Result<(), RawSockError> {
        attach_filter(self.fd.as_raw_fd(), Some(chaddr)).map_err(|e| {
            classify(
                "narrow the BPF filter to one client",
                &self.ifname,
                self.netns.as_deref(),
                e,
            )
        })
    }

    /// The interface name.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// Counters.
    pub fn stats(&self) -> RxCounts {
        self.stats.snapshot()
    }

    /// Waits for the next DHCP server→client frame. Frames that passed the
    /// filter but do not parse are counted and skipped. The interface going
    /// away surfaces as [`RawSockError::InterfaceGone`].
    pub async fn recv(&self) -> Result<RxFrame, RawSockError> {
        loop {
            let mut guard = self
                .fd
                .ready(Interest::READABLE | Interest::ERROR)
                .await
                .map_err(|e| {
                    classify("wait for a frame", &self.ifname, self.netns.as_deref(), e)
                })?;
            // The buffer lives on the stack for the one call: a pending
            // receive (every lease task waits in one) holds no heap memory.
            match guard.try_io(|fd| self.recv_one(fd.as_raw_fd(), &mut [0u8; RECV_BUF])) {
                Ok(Ok(Recv::Frame(f))) => return Ok(f),
                Ok(Ok(Recv::Skipped)) | Err(_) => {} // would block: wait again
                Ok(Err(e)) => {
                    return Err(classify(
                        "receive a frame",
                        &self.ifname,
                        self.netns.as_deref(),
                        e,
                    ));
                }
            }
        }
    }

    /// Non-blocking receive of one frame (`Ok(None)`: nothing queued).
    pub fn try_recv(&self) -> Result<Option<RxFrame>, RawSockError> {
        let mut buf = [0u8; RECV_BUF];
        loop {
            match self.recv_one(self.fd.as_raw_fd(), &mut buf) {
                Ok(Recv::Frame(f)) => return Ok(Some(f)),
                Ok(Recv::Skipped) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) => {
                    return Err(classify(
                        "receive a frame",
                        &self.ifname,
                        self.netns.as_deref(),
                        e,
                    ));
                }
            }
        }
    }

    /// One `recvmsg(MSG_TRUNC)` with `PACKET_AUXDATA`; `WouldBlock` when empty.
    fn recv_one(&self, fd: RawFd, buf: &mut [u8]) -> io::Result<Recv> {
        // SAFETY: sockaddr_ll is plain old data.
        let mut addr: libc::sockaddr_ll = unsafe { zeroed() };
        // u64-aligned control buffer, large enough for one tpacket_auxdata cmsg.
        let mut cbuf = [0u64; 8];
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: msghdr is plain old data; pointers set below stay valid for the call.
        let mut msg: libc::msghdr = unsafe { zeroed() };
        msg.msg_name = std::ptr::from_mut(&mut addr).cast();
        msg.msg_namelen = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        msg.msg_iov = &raw mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = size_of::<[u64; 8]>();
        // SAFETY: all buffers referenced by `msg` are live and writable.
        let n = unsafe { libc::recvmsg(fd, &raw mut msg, libc::MSG_TRUNC | libc::MSG_DONTWAIT) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let ts_ns = monotonic_ns();
        let n = n as usize;
        if n > buf.len() {
            self.stats.truncated.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(ifname = %self.ifname, len = n, "oversized frame skipped");
            return Ok(Recv::Skipped);
        }
        if addr.sll_pkttype == libc::PACKET_OUTGOING {
            return Ok(Recv::Skipped);
        }
        let stripped_vlan = auxdata_vlan(&msg);
        let frame = &buf[..n];
        match frame::parse_udp_frame(frame) {
            Ok((mut headers, payload))
                if headers.src_port == SERVER_PORT && headers.dst_port == rawsock::CLIENT_PORT =>
            {
                if headers.vlan.is_none() {
                    headers.vlan = stripped_vlan;
                }
                self.stats.received.fetch_add(1, Ordering::Relaxed);
                Ok(Recv::Frame(RxFrame {
                    ifindex: if addr.sll_ifindex > 0 {
                        addr.sll_ifindex as u32
                    } else {
                        self.info.ifindex
                    },
                    ts_ns,
                    headers,
                    payload: payload.to_vec(),
                    via: RxPath::AfPacket,
                }))
            }
            Ok((headers, _)) => {
                self.stats.bad_frames.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(ifname = %self.ifname, src_port = headers.src_port, dst_port = headers.dst_port, "non-DHCP-reply frame skipped");
                Ok(Recv::Skipped)
            }
            Err(error) => {
                self.stats.bad_frames.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(ifname = %self.ifname, %error, "malformed frame skipped");
                Ok(Recv::Skipped)
            }
        }
    }
}

impl AsRawFd for AfPacketReceiver {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// The VLAN id from a `PACKET_AUXDATA` control message, if the tag was stripped.
fn auxdata_vlan(msg: &libc::msghdr) -> Option<u16> {
    // SAFETY: `msg` was filled by recvmsg; the CMSG_* macros walk within msg_control.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(msg);
        while !cmsg.is_null() {
            let hdr = &*cmsg;
            if hdr.cmsg_level == libc::SOL_PACKET
                && hdr.cmsg_type == libc::PACKET_AUXDATA
                && hdr.cmsg_len as usize
                    >= libc::CMSG_LEN(size_of::<libc::tpacket_auxdata>() as u32) as usize
            {
                let aux: libc::tpacket_auxdata =
                    std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast());
                if aux.tp_status & libc::TP_STATUS_VLAN_VALID != 0 {
                    return Some(aux.tp_vlan_tci & 0x0fff);
                }
                return None;
            }
            cmsg = libc::CMSG_NXTHDR(msg, cmsg);
        }
    }
    None
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write into.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) } != 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datapath::frame::{FrameHeaders, build_udp_frame};
    use std::net::Ipv4Addr;

    /// A classic BPF interpreter for the subset the filter uses, so every
    /// branch can be checked against crafted frames without a socket.
    #[expect(
        clippy::many_single_char_names,
        reason = "A, X and k are the BPF machine's register names"
    )]
    fn run_filter(prog: &[SockFilter], pkt: &[u8]) -> u32 {
        let (mut a, mut x, mut pc) = (0u32, 0u32, 0usize);
        let load = |off: usize, size: usize| -> Option<u32> {
            let bytes = pkt.get(off..off.checked_add(size)?)?;
            Some(bytes.iter().fold(0u32, |acc, b| (acc << 8) | u32::from(*b)))
        };
        loop {
            let ins = prog[pc];
            pc += 1;
            let k = ins.k as usize;
            match ins.code {
                c if c == BPF_LD | BPF_H | BPF_ABS => match load(k, 2) {
                    Some(v) => a = v,
                    None => return 0,
                },
                c if c == BPF_LD | BPF_B | BPF_ABS => match load(k, 1) {
                    Some(v) => a = v,
                    None => return 0,
                },
                c if c == BPF_LD | BPF_W | BPF_IND => match load(x as usize + k, 4) {
                    Some(v) => a = v,
                    None => return 0,
                },
                c if c == BPF_LD | BPF_H | BPF_IND => match load(x as usize + k, 2) {
                    Some(v) => a = v,
                    None => return 0,
                },
                c if c == BPF_LDX | BPF_B | BPF_MSH => match load(k, 1) {
                    Some(v) => x = (v & 0xf) * 4,
                    None => return 0,
                },
                c if c == BPF_JMP | BPF_JEQ | BPF_K => {
                    pc += usize::from(if a == ins.k { ins.jt } else { ins.jf });
                }
                c if c == BPF_JMP | BPF_JSET | BPF_K => {
                    pc += usize::from(if a & ins.k != 0 { ins.jt } else { ins.jf });
                }
                c if c == BPF_RET | BPF_K => return ins.k,
                other => panic!("unexpected opcode {other:#x}"),
            }
        }
    }

    fn headers(vlan: Option<u16>, sport: u16, dport: u16) -> FrameHeaders {
        FrameHeaders {
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [0xff; 6],
            vlan,
            src_ip: Ipv4Addr::new(192, 0, 2, 1),
            dst_ip: Ipv4Addr::BROADCAST,
            src_port: sport,
            dst_port: dport,
        }
    }

    fn accepts(pkt: &[u8]) -> bool {
        run_filter(&dhcp_reply_filter(None), pkt) != 0
    }

    const CLIENT: [u8; 6] = [0x02, 0x11, 0x22, 0x33, 0x44, 0x55];

    /// A DHCP reply (BOOTP header, `chaddr` at offset 28) for `chaddr`.
    fn reply_for(vlan: Option<u16>, chaddr: [u8; 6]) -> Vec<u8> {
        let mut bootp = [0u8; 300];
        bootp[0] = 2; // BOOTREPLY
        bootp[28..34].copy_from_slice(&chaddr);
        build_udp_frame(&headers(vlan, 67, 68), &bootp)
    }

    #[test]
    fn filter_accepts_dhcp_replies_plain_and_tagged() {
        assert!(accepts(&build_udp_frame(&headers(None, 67, 68), &[0; 300])));
        assert!(accepts(&build_udp_frame(
            &headers(Some(42), 67, 68),
            &[0; 300]
        )));
        // 802.1ad outer TPID.
        let mut qinq = build_udp_frame(&headers(Some(42), 67, 68), &[0; 300]);
        qinq[12..14].copy_from_slice(&ETH_P_8021AD.to_be_bytes());
        assert!(accepts(&qinq));
    }

    #[test]
    fn filter_rejects_other_traffic() {
        assert!(
            !accepts(&build_udp_frame(&headers(None, 68, 67), &[0; 300])),
            "client→server"
        );
        assert!(!accepts(&build_udp_frame(
            &headers(None, 67, 69),
            &[0; 300]
        )));
        assert!(!accepts(&build_udp_frame(
            &headers(None, 53, 68),
            &[0; 300]
        )));
        let mut tcp = build_udp_frame(&headers(None, 67, 68), &[0; 300]);
        tcp[23] = 6;
        assert!(!accepts(&tcp), "TCP");
        let mut arp = build_udp_frame(&headers(None, 67, 68), &[0; 300]);
        arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        assert!(!accepts(&arp), "ARP");
        let mut v6 = build_udp_frame(&headers(None, 67, 68), &[0; 300]);
        v6[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
        assert!(!accepts(&v6), "IPv6");
        for flags in [0x2000u16, 0x0001, 0x1fff] {
            let mut frag = build_udp_frame(&headers(None, 67, 68), &[0; 300]);
            frag[20..22].copy_from_slice(&flags.to_be_bytes());
            assert!(!accepts(&frag), "fragment {flags:#x}");
        }
        // DF alone is fine.
        let mut df = build_udp_frame(&headers(None, 67, 68), &[0; 300]);
        df[20..22].copy_from_slice(&0x4000u16.to_be_bytes());
        assert!(accepts(&df));
    }

    #[test]
    fn filter_honours_ip_options() {
        // IHL 6 (one word of options): ports move by 4 bytes.
        let plain = build_udp_frame(&headers(None, 67, 68), &[0; 64]);
        let mut opt = plain[..14].to_vec();
        opt.push(0x46);
        opt.extend_from_slice(&plain[15..34]);
        opt.extend_from_slice(&[1, 1, 1, 0]); // NOP NOP NOP EOL
        opt.extend_from_slice(&plain[34..]);
        assert!(accepts(&opt));
        // The same bytes read with IHL 5 would see the options as ports.
        let mut wrong = opt.clone();
        wrong[14] = 0x45;
        assert!(!accepts(&wrong));
    }

    #[test]
    fn filter_drops_every_truncation_before_the_ports() {
        let full = build_udp_frame(&headers(Some(7), 67, 68), &[0; 16]);
        // Ethernet 14 + tag 4 + IP 20 + ports 4 = 42 bytes needed.
        for len in 0..42 {
            assert!(
                !accepts(&full[..len]),
                "accepted truncated frame of {len} bytes"
            );
        }
        assert!(accepts(&full[..42]));
    }

    #[test]
    fn filter_for_one_client_accepts_only_its_replies() {
        let prog = dhcp_reply_filter(Some(CLIENT));
        let accepts_for = |pkt: &[u8]| run_filter(&prog, pkt) != 0;
        for vlan in [None, Some(42)] {
            assert!(accepts_for(&reply_for(vlan, CLIENT)), "vlan {vlan:?}");
            // Another client: one differing byte in either half of chaddr.
            for i in 0..6 {
                let mut other = CLIENT;
                other[i] ^= 0x80;
                assert!(
                    !accepts_for(&reply_for(vlan, other)),
                    "vlan {vlan:?}: accepted a reply for {other:02x?}"
                );
            }
            // The other checks still apply.
            let mut to_server = reply_for(vlan, CLIENT);
            let ports = if vlan.is_some() { 38 } else { 34 };
            to_server[ports..ports + 4].copy_from_slice(&[0, 68, 0, 67]);
            assert!(!accepts_for(&to_server), "vlan {vlan:?}: client→server");
        }
        // The unrestricted filter takes replies for anyone.
        let mut other = CLIENT;
        other[5] ^= 1;
        assert!(accepts(&reply_for(None, other)));
        // chaddr behind IP options (IHL 6) is found at its real offset.
        let plain = reply_for(None, CLIENT);
        let mut opt = plain[..14].to_vec();
        opt.push(0x46);
        opt.extend_from_slice(&plain[15..34]);
        opt.extend_from_slice(&[1, 1, 1, 0]);
        opt.extend_from_slice(&plain[34..]);
        assert!(accepts_for(&opt));
        // Truncated before the end of chaddr: dropped.
        let full = reply_for(Some(7), CLIENT);
        let end_of_chaddr = 18 + 20 + 8 + 34;
        assert!(!accepts_for(&full[..end_of_chaddr - 1]));
        assert!(accepts_for(&full[..end_of_chaddr]));
    }

    #[test]
    fn filter_fits_the_kernel_limits() {
        for chaddr in [None, Some(CLIENT)] {
            let prog = dhcp_reply_filter(chaddr);
            assert!(prog.len() <= 4096);
            assert_eq!(
                prog.last().map(|i| (i.code, i.k)),
                Some((BPF_RET | BPF_K, 0))
            );
        }
    }
}
