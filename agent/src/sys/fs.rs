//! The one writer of files that must not tear: temporary files written
//! beside their target, `fsync`, and the atomic step that puts them in place
//! (rename, exchange, or an exclusive link), then the directory's `fsync`.
//!
//! The lease store, the embedded pod store and the VFIO journal each compose
//! these steps for their own guarantee; none of them opens, syncs or renames
//! files on its own.

use std::fs::{File, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

/// Create `path` (it must not exist) with mode 0600 and write `bytes`; the
/// caller decides whether to [`sync_file`] it.
pub(crate) fn write_new(path: &Path, bytes: &[u8]) -> io::Result<File> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)?;
    Ok(file)
}

/// Replace the content of `path` (created with mode 0600 if absent) with
/// `bytes`; a symlink planted in its place is refused, not followed.
///
/// The old content is overwritten and the file then cut to the new length,
/// not truncated to nothing first: on ext4 a file truncated to zero and
/// written again has its blocks allocated and written out when it is
/// closed or renamed (`auto_da_alloc`), which put a synchronous block
/// allocation on every caller's path, `fsync` or not.
pub(crate) fn rewrite(path: &Path, bytes: &[u8]) -> io::Result<File> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    file.write_all(bytes)?;
    file.set_len(bytes.len() as u64)?;
    Ok(file)
}

/// Make a written file's content durable.
pub(crate) fn sync_file(file: &File) -> io::Result<()> {
    file.sync_all()
}

/// `fsync` the file at `path` (written earlier, maybe by another handle).
pub(crate) fn sync_path(path: &Path) -> io::Result<()> {
    File::open(path)?.sync_all()
}

/// `fsync` a directory, making the renames, links and removals in it durable.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Put `from` in place of `to`, replacing it atomically.
pub(crate) fn rename(from: &Path, to: &Path) -> io::Result<()> {
    std::fs::rename(from, to)
}

/// Put `from` in place of `to` atomically and leave the old `to` at `from`
/// (`renameat2(RENAME_EXCHANGE)`), so the old file's inode can be written
/// again next time; where the filesystem cannot exchange (or `to` does not
/// exist yet), a plain rename.
pub(crate) fn exchange_or_rename(from: &Path, to: &Path) -> io::Result<()> {
    match exchange(from, to) {
        Ok(()) => Ok(()),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOENT | libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP)
            ) =>
        {
            rename(from, to)
        }
        Err(e) => Err(e),
    }
}

fn exchange(a: &Path, b: &Path) -> io::Result<()> {
    let cstr = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
    };
    let (a, b) = (cstr(a)?, cstr(b)?);
    // SAFETY: both paths are valid NUL-terminated strings for the call.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Give the written file `from` the name `to` only if `to` does not exist
/// (`ErrorKind::AlreadyExists` otherwise), then drop the name `from`.
pub(crate) fn link_new(from: &Path, to: &Path) -> io::Result<()> {
    let linked = std::fs::hard_link(from, to);
    let _ = std::fs::remove_file(from);
    linked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrite_refuses_a_planted_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, b"keep").unwrap();
        let spare = dir.path().join("spare");
        std::os::unix::fs::symlink(&target, &spare).unwrap();
        let err = rewrite(&spare, b"evil").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ELOOP));
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
    }

    #[test]
    fn rewrite_leaves_exactly_the_new_content() {
        let dir = tempfile::tempdir().unwrap();
        let spare = dir.path().join("spare");
        rewrite(&spare, b"a longer first document").unwrap();
        rewrite(&spare, b"short").unwrap();
        assert_eq!(std::fs::read(&spare).unwrap(), b"short");
        rewrite(&spare, b"longer again, past the old end").unwrap();
        assert_eq!(
            std::fs::read(&spare).unwrap(),
            b"longer again, past the old end"
        );
    }

    #[test]
    fn exchange_keeps_the_old_content_at_the_spare_name() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, b"new").unwrap();
        std::fs::write(&b, b"old").unwrap();
        exchange_or_rename(&a, &b).unwrap();
        assert_eq!(std::fs::read(&b).unwrap(), b"new");
        // tmpfs and ext4 exchange; elsewhere the rename leaves no spare.
        if let Ok(old) = std::fs::read(&a) {
            assert_eq!(old, b"old");
        }
        // Into a name that does not exist yet: a rename.
        let c = dir.path().join("c");
        exchange_or_rename(&b, &c).unwrap();
        assert_eq!(std::fs::read(&c).unwrap(), b"new");
    }

    #[test]
    fn link_new_never_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let (tmp, entry) = (dir.path().join("tmp"), dir.path().join("entry"));
        std::fs::write(&entry, b"first").unwrap();
        write_new(&tmp, b"second").unwrap();
        let err = link_new(&tmp, &entry).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(&entry).unwrap(), b"first");
        assert!(!tmp.exists(), "the temporary name is gone either way");
        assert_eq!(
            write_new(&entry, b"x").unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
    }
}
