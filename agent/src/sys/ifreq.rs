//! Interface ioctls (`struct ifreq`): index, hardware address, MTU, flags,
//! ethtool driver information.
//! Every `SIOC*IF*` call of the agent goes through here.

use std::io;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};

/// An `ifreq` naming `ifname`; `None` when the name cannot be an interface
/// name (empty, too long, NUL or `/` inside).
pub(crate) fn request(ifname: &str) -> Option<libc::ifreq> {
    if ifname.is_empty()
        || ifname.len() >= libc::IFNAMSIZ
        || ifname.bytes().any(|b| b == 0 || b == b'/')
    {
        return None;
    }
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(ifname.bytes()) {
        *dst = src as libc::c_char;
    }
    Some(req)
}

/// A socket for interface ioctls. A UDP socket, not `AF_PACKET`: closing a
/// packet socket waits for an RCU grace period, and interface ioctls work on
/// any socket.
pub(crate) fn socket() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn ioctl(sock: &OwnedFd, op: libc::Ioctl, req: &mut libc::ifreq) -> io::Result<()> {
    // SAFETY: `req` is a valid ifreq for the duration of the call and every
    // request used here reads and writes only within it.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), op, std::ptr::from_mut(req)) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `SIOCGIFINDEX`.
pub(crate) fn index(sock: &OwnedFd, req: &mut libc::ifreq) -> io::Result<u32> {
    ioctl(sock, libc::SIOCGIFINDEX, req)?;
    // SAFETY: SIOCGIFINDEX filled the ifindex member of the union.
    Ok(unsafe { req.ifr_ifru.ifru_ifindex } as u32)
}

/// `SIOCGIFHWADDR`: the hardware type and the first six address bytes.
pub(crate) fn hwaddr(sock: &OwnedFd, req: &mut libc::ifreq) -> io::Result<(u16, [u8; 6])> {
    ioctl(sock, libc::SIOCGIFHWADDR, req)?;
    // SAFETY: SIOCGIFHWADDR filled the hwaddr member of the union.
    let hw = unsafe { req.ifr_ifru.ifru_hwaddr };
    let mut mac = [0u8; 6];
    for (dst, src) in mac.iter_mut().zip(hw.sa_data.iter()) {
        *dst = *src as u8;
    }
    Ok((hw.sa_family, mac))
}

/// `SIOCGIFMTU`.
pub(crate) fn mtu(sock: &OwnedFd, req: &mut libc::ifreq) -> io::Result<u32> {
    ioctl(sock, libc::SIOCGIFMTU, req)?;
    // SAFETY: SIOCGIFMTU filled the mtu member of the union.
    Ok(unsafe { req.ifr_ifru.ifru_mtu } as u32)
}

/// Set `IFF_UP` on `ifname` if it is down, through `sock`, a [`socket`]
/// of `ifname`'s namespace (kept by a caller that raised it, for
/// [`running`]): whether this raised it.
pub(crate) fn ensure_up_on(sock: &OwnedFd, ifname: &str) -> io::Result<bool> {
    let mut req = request(ifname).ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    ioctl(sock, libc::SIOCGIFFLAGS, &mut req)?;
    // SAFETY: the ioctl succeeded, so the flags member is initialised.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    if flags & libc::IFF_UP as libc::c_short != 0 {
        return Ok(false);
    }
    req.ifr_ifru.ifru_flags = flags | libc::IFF_UP as libc::c_short;
    ioctl(sock, libc::SIOCSIFFLAGS, &mut req)?;
    Ok(true)
}

/// Whether the interface with index `ifindex` in `sock`'s namespace is
/// `IFF_RUNNING` ([`running`]); `SIOCGIFNAME` names it first.
pub(crate) fn running_index(sock: &OwnedFd, ifindex: u32) -> io::Result<bool> {
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    req.ifr_ifru.ifru_ifindex = i32::try_from(ifindex).unwrap_or(i32::MAX);
    ioctl(sock, libc::SIOCGIFNAME, &mut req)?;
    ioctl(sock, libc::SIOCGIFFLAGS, &mut req)?;
    // SAFETY: the ioctl succeeded, so the flags member is initialised.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    Ok(flags & libc::IFF_RUNNING as libc::c_short != 0)
}

/// Whether `ifname` (in `sock`'s namespace) is `IFF_RUNNING`: operational,
/// as the kernel's link watcher marks it once it has handled the carrier
/// coming on — the same pass that gives the device its transmit queue.
pub(crate) fn running(sock: &OwnedFd, ifname: &str) -> io::Result<bool> {
    let mut req = request(ifname).ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    ioctl(sock, libc::SIOCGIFFLAGS, &mut req)?;
    // SAFETY: the ioctl succeeded, so the flags member is initialised.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    Ok(flags & libc::IFF_RUNNING as libc::c_short != 0)
}

/// The two fields of `struct ethtool_drvinfo` the attach choice reads.
pub(crate) struct DriverInfo {
    pub(crate) driver: String,
    pub(crate) bus_info: String,
}

/// `ETHTOOL_GDRVINFO` on `ifname` in the current thread's namespace
/// (`SIOCETHTOOL`). `Ok(None)` when the device does not answer it; `Err`
/// only when no socket could be opened.
pub(crate) fn driver_info(ifname: &str) -> io::Result<Option<DriverInfo>> {
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
    const SIOCETHTOOL: libc::Ioctl = 0x8946;

    let Some(mut req) = request(ifname) else {
        return Ok(None);
    };
    let sock = socket()?;
    // SAFETY: all-zero is a valid EthtoolDrvinfo.
    let mut info: EthtoolDrvinfo = unsafe { std::mem::zeroed() };
    info.cmd = ETHTOOL_GDRVINFO;
    req.ifr_ifru.ifru_data = (&raw mut info).cast();
    if ioctl(&sock, SIOCETHTOOL, &mut req).is_err() {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_cannot_be_interfaces_are_refused() {
        assert!(request("").is_none());
        assert!(request("a/b").is_none());
        assert!(request("0123456789abcdef").is_none());
        assert!(request("lo").is_some());
    }

    #[test]
    fn loopback_has_an_index_and_an_mtu() {
        let sock = socket().unwrap();
        let mut req = request("lo").unwrap();
        assert!(index(&sock, &mut req).unwrap() >= 1);
        assert!(mtu(&sock, &mut req).unwrap() >= 1280);
        let mut missing = request("xdt-nope0").unwrap();
        assert_eq!(
            index(&sock, &mut missing).unwrap_err().raw_os_error(),
            Some(libc::ENODEV)
        );
    }
}
