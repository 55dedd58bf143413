//! The `bpf(2)` calls aya does not expose: reading a link's device from the
//! kernel, to notice a program detached from under the agent; pinning a
//! link by its id (aya's `FdLink::pin` consumes the link, and drops it
//! when the pin fails: the attachment would go with it); reading a
//! program's tag by id, to tell a previous agent's program version;
//! detaching a pinned link at once (dropping its pin only queues the
//! detach on a kernel work queue).

use std::io;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};

const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_LINK_GET_FD_BY_ID: libc::c_long = 30;
const BPF_LINK_DETACH: libc::c_long = 34;

/// `struct bpf_prog_info` up to its tag: `type`, `id`, `tag[8]`.
#[repr(C, align(8))]
#[derive(Default)]
struct ProgInfo {
    kind: u32,
    id: u32,
    tag: [u8; 8],
}

/// `struct bpf_link_info` up to and past its device union: `type`, `id`,
/// `prog_id`, padding to the 8-byte aligned union, whose `xdp` and `tcx`
/// members both start with the `ifindex`.
#[repr(C, align(8))]
#[derive(Default)]
struct LinkInfo {
    kind: u32,
    id: u32,
    prog_id: u32,
    _pad: u32,
    ifindex: u32,
    rest: [u32; 11],
}

fn bpf(cmd: libc::c_long, attr: &mut [u8]) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a zero-initialised `union bpf_attr` prefix of the
    // size passed; the kernel reads and writes only within it.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len()) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// The device a BPF link (XDP or tcx) is attached to, by link id:
/// `Ok(Some(0))` once the link was detached (by `bpftool link detach`, or
/// its device went away), `Ok(None)` when no such link exists any more.
pub(crate) fn link_ifindex(link_id: u32) -> io::Result<Option<u32>> {
    let mut attr = [0u8; 16];
    attr[..4].copy_from_slice(&link_id.to_ne_bytes());
    let fd = match bpf(BPF_LINK_GET_FD_BY_ID, &mut attr) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
        Err(e) => return Err(e),
    };
    // SAFETY: the kernel just returned this descriptor to us.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let mut info = LinkInfo::default();
    let mut attr = [0u8; 16];
    attr[..4].copy_from_slice(&(fd.as_raw_fd() as u32).to_ne_bytes());
    attr[4..8].copy_from_slice(&(std::mem::size_of::<LinkInfo>() as u32).to_ne_bytes());
    attr[8..16].copy_from_slice(&(std::ptr::from_mut(&mut info) as u64).to_ne_bytes());
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    Ok(Some(info.ifindex))
}

/// A new descriptor on the object of kind `get_cmd` with `id`; `None`
/// when no such object exists any more.
fn fd_by_id(get_cmd: libc::c_long, id: u32) -> io::Result<Option<OwnedFd>> {
    let mut attr = [0u8; 16];
    attr[..4].copy_from_slice(&id.to_ne_bytes());
    match bpf(get_cmd, &mut attr) {
        // SAFETY: the kernel just returned this descriptor to us.
        Ok(fd) => Ok(Some(unsafe { OwnedFd::from_raw_fd(fd as i32) })),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Pins the BPF link with id `link_id` at `path` (on a bpffs): the link
/// then outlives every descriptor on it, the agent's included.
pub(crate) fn pin_link(link_id: u32, path: &std::path::Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt as _;
    let fd = fd_by_id(BPF_LINK_GET_FD_BY_ID, link_id)?
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no BPF link {link_id}")))?;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // `union bpf_attr` for BPF_OBJ_PIN: pathname (u64), bpf_fd, file_flags,
    // path_fd.
    let mut attr = [0u8; 20];
    attr[..8].copy_from_slice(&(path.as_ptr() as u64).to_ne_bytes());
    attr[8..12].copy_from_slice(&(fd.as_raw_fd() as u32).to_ne_bytes());
    bpf(BPF_OBJ_PIN, &mut attr).map(drop)
}

/// Detaches the BPF link pinned at `path` now, leaving the pin (a
/// defunct link) for the caller to remove. Removing only the pin drops the
/// last reference from inside the kernel, which frees the link, and so
/// takes the program off its device, later, from a work queue: whoever
/// looks at the device right after still sees the program.
pub(crate) fn detach_pinned_link(path: &std::path::Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt as _;
    let cpath = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // `union bpf_attr` for BPF_OBJ_GET: pathname (u64), bpf_fd (0),
    // file_flags (0: read-write), path_fd.
    let mut attr = [0u8; 20];
    attr[..8].copy_from_slice(&(cpath.as_ptr() as u64).to_ne_bytes());
    let fd = bpf(BPF_OBJ_GET, &mut attr)?;
    // SAFETY: the kernel just returned this descriptor to us.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // `union bpf_attr` for BPF_LINK_DETACH: link_fd.
    let mut attr = [0u8; 4];
    attr.copy_from_slice(&(fd.as_raw_fd() as u32).to_ne_bytes());
    bpf(BPF_LINK_DETACH, &mut attr).map(drop)
}

/// The tag (the kernel's hash of its instructions, map references left
/// out) of the program with id `prog_id`; `None` when it is gone.
pub(crate) fn prog_tag(prog_id: u32) -> io::Result<Option<[u8; 8]>> {
    let Some(fd) = fd_by_id(BPF_PROG_GET_FD_BY_ID, prog_id)? else {
        return Ok(None);
    };
    let mut info = ProgInfo::default();
    let mut attr = [0u8; 16];
    attr[..4].copy_from_slice(&(fd.as_raw_fd() as u32).to_ne_bytes());
    attr[4..8].copy_from_slice(&(std::mem::size_of::<ProgInfo>() as u32).to_ne_bytes());
    attr[8..16].copy_from_slice(&(std::ptr::from_mut(&mut info) as u64).to_ne_bytes());
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    Ok(Some(info.tag))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_info_layout_puts_the_device_after_the_aligned_header() {
        assert_eq!(std::mem::offset_of!(LinkInfo, ifindex), 16);
        assert_eq!(std::mem::align_of::<LinkInfo>(), 8);
    }

    #[test]
    fn the_prog_info_layout_puts_the_tag_after_type_and_id() {
        assert_eq!(std::mem::offset_of!(ProgInfo, tag), 8);
    }

    #[test]
    fn an_unknown_program_has_no_tag() {
        assert!(matches!(prog_tag(u32::MAX - 7), Ok(None)));
    }

    #[test]
    fn pinning_an_unknown_link_fails_with_not_found() {
        let e = pin_link(u32::MAX - 7, std::path::Path::new("/sys/fs/bpf/x")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn detaching_a_link_pinned_nowhere_fails_with_not_found() {
        let e =
            detach_pinned_link(std::path::Path::new("/sys/fs/bpf/xdhcp-no-such-pin")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn an_unknown_link_is_none() {
        // Link ids count up from 1; this one is far beyond any real one.
        assert!(matches!(link_ifindex(u32::MAX - 7), Ok(None)));
    }
}
