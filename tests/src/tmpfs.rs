//! A tiny tmpfs the fault tests put the agent's state (or a part of it)
//! on, to fill it or remount it read-only; unmounted when dropped.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags, mount, umount2};

/// A tmpfs of a given size, mounted on a fresh temporary directory or on a
/// directory the caller names; unmounted (lazily, so a straggling open file
/// cannot keep it) when dropped.
pub struct Tmpfs {
    path: PathBuf,
    _dir: Option<tempfile::TempDir>,
}

impl Tmpfs {
    /// Mount a tmpfs of `size` (`64k`, `1m`…) on a fresh temporary directory.
    pub fn mount(size: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("xdt-tmpfs-")
            .tempdir()
            .unwrap();
        mount_tmpfs(dir.path(), size);
        Self {
            path: dir.path().to_path_buf(),
            _dir: Some(dir),
        }
    }

    /// Mount a tmpfs of `size` on `dir` (created if missing), hiding what
    /// was there until it is dropped.
    pub fn mount_at(dir: &Path, size: &str) -> Self {
        std::fs::create_dir_all(dir).expect("create the tmpfs mount point");
        mount_tmpfs(dir, size);
        Self {
            path: dir.to_path_buf(),
            _dir: None,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Remount read-only (`ro`) or read-write; a read-only remount the
    /// kernel refuses as busy (a file open for writing) is tried again for
    /// up to 5 s.
    pub fn remount(&self, read_only: bool) {
        let mut flags = MsFlags::MS_REMOUNT | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
        if read_only {
            flags |= MsFlags::MS_RDONLY;
        }
        // Read-only is refused (EBUSY) while a file is open for writing on
        // it: a write the agent has in flight. Wait it out, a little.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            match mount(None::<&str>, self.path(), None::<&str>, flags, None::<&str>) {
                Err(nix::errno::Errno::EBUSY) if std::time::Instant::now() < until => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                r => {
                    r.expect("remount the tmpfs");
                    return;
                }
            }
        }
    }

    /// Fill every free block with `path`; returns its size.
    pub fn fill(path: &Path) -> u64 {
        let mut f = std::fs::File::create(path).expect("create the filler");
        let block = [0xa5u8; 4096];
        let mut written = 0u64;
        loop {
            match f.write(&block) {
                Ok(0) => break,
                Ok(n) => written += n as u64,
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling the tmpfs: {e}"),
            }
        }
        let _ = f.sync_all();
        written
    }
}

fn mount_tmpfs(dir: &Path, size: &str) {
    let data = format!("size={size},mode=0700");
    mount(
        Some("xdt-tmpfs"),
        dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(data.as_str()),
    )
    .expect("mount a tmpfs for the state directory");
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = umount2(&self.path, MntFlags::MNT_DETACH);
    }
}
