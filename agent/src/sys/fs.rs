//! The one writer of files that must not tear: [`atomic_replace`] writes a
//! temporary file beside its target, `fsync`s it, puts it in place
//! atomically (rename, exchange, or an exclusive link) and `fsync`s the
//! directory; [`AtomicWrite`] says which temporary, which step and whether
//! to sync.
//!
//! The lease store, the learned-binding store, the embedded pod store and
//! the VFIO journal all write through it; none of them opens, syncs or
//! renames a file of its own. The lease store writes a burst's records as
//! one batch ([`stage`] each, then [`install_staged`]: one [`Barrier`] for
//! all their content, one for the directory). Moving a corrupt file aside
//! (quarantine) is another operation: a plain [`rename`] of a file already
//! written.

use std::fs::{File, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Create `path` (it must not exist) with mode 0600 and write `bytes`, not
/// synced: the temporary of [`atomic_replace`], or an empty spare file a
/// store keeps for later writes.
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
fn rewrite(path: &Path, bytes: &[u8]) -> io::Result<File> {
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
fn sync_file(file: &File) -> io::Result<()> {
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
fn exchange_or_rename(from: &Path, to: &Path) -> io::Result<()> {
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
fn link_new(from: &Path, to: &Path) -> io::Result<()> {
    let linked = std::fs::hard_link(from, to);
    let _ = std::fs::remove_file(from);
    linked
}

/// How [`atomic_replace`] creates the temporary file it writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Temp {
    /// A new file (mode 0600); the name must not exist.
    Fresh,
    /// A spare file kept for this (an old temporary, or the previous
    /// content left by [`Install::Exchange`]): written over in place
    /// ([`rewrite`]), so no inode is allocated; created if absent. A
    /// symlink planted at its name is refused.
    Reuse,
}

/// How [`atomic_replace`] puts the written temporary in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Install {
    /// Rename over the target; the temporary name is gone.
    Rename,
    /// Exchange with the target ([`exchange_or_rename`]): the temporary
    /// name keeps the previous content, to be reused next time.
    Exchange,
    /// Link to the target only if it does not exist yet ([`link_new`]),
    /// failing with `ErrorKind::AlreadyExists` otherwise; the temporary
    /// name is gone either way.
    Exclusive,
}

/// Options of one [`atomic_replace`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct AtomicWrite<'a> {
    /// The temporary file, in the target's directory.
    pub temp: &'a Path,
    /// How it is created.
    pub create: Temp,
    /// How it takes the target's place.
    pub install: Install,
    /// `fsync` the temporary before it is installed and the directory after:
    /// once the write returns it survives a host crash. Without it readers
    /// still see the old or the new content, never a mix; the caller makes
    /// it durable later ([`sync_path`], [`sync_dir`]).
    pub durable: bool,
    /// Counts the `fsync` calls made (for callers that report them).
    pub syncs: Option<&'a AtomicU64>,
}

impl<'a> AtomicWrite<'a> {
    /// Write a fresh `temp`, `fsync` it, rename it over the target, `fsync`
    /// the directory.
    pub(crate) fn durable(temp: &'a Path) -> Self {
        AtomicWrite {
            temp,
            create: Temp::Fresh,
            install: Install::Rename,
            durable: true,
            syncs: None,
        }
    }
}

/// The step of [`atomic_replace`] that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteStep {
    /// Creating or writing the temporary file.
    Write,
    /// `fsync` of the temporary file.
    SyncFile,
    /// Rename, exchange or link into the target's name.
    Install,
    /// `fsync` of the directory.
    SyncDir,
}

impl WriteStep {
    /// What the step does, for messages.
    pub(crate) const fn label(self) -> &'static str {
        match self {
            WriteStep::Write => "write",
            WriteStep::SyncFile => "fsync",
            WriteStep::Install => "put into place",
            WriteStep::SyncDir => "fsync the directory of",
        }
    }
}

/// A failed [`atomic_replace`]: the step, the path it acted on (the
/// temporary for [`WriteStep::Write`] and [`WriteStep::SyncFile`], the
/// target for [`WriteStep::Install`], the directory for
/// [`WriteStep::SyncDir`]) and the I/O error. On any failure before the
/// install the target is untouched and the temporary removed.
#[derive(Debug, thiserror::Error)]
#[error("{} {}: {source}", step.label(), path.display())]
pub(crate) struct AtomicWriteError {
    pub step: WriteStep,
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

/// Replace the content of `path` with `bytes` so a reader sees the old or
/// the new content, never a mix, and (with [`AtomicWrite::durable`]) so the
/// new content survives a crash once this returns: write `options.temp`,
/// `fsync` it, install it (rename, exchange or exclusive link), `fsync` the
/// directory.
pub(crate) fn atomic_replace(
    path: &Path,
    bytes: &[u8],
    options: &AtomicWrite<'_>,
) -> Result<(), AtomicWriteError> {
    let temp = options.temp;
    let fail = |step, path: &Path| {
        let path = path.to_owned();
        move |source| AtomicWriteError { step, path, source }
    };
    let count = || {
        if let Some(n) = options.syncs {
            n.fetch_add(1, Ordering::Relaxed);
        }
    };
    let written = match options.create {
        Temp::Fresh => write_new(temp, bytes),
        Temp::Reuse => rewrite(temp, bytes),
    }
    .map_err(fail(WriteStep::Write, temp))
    .and_then(|file| {
        if options.durable {
            sync_file(&file).map_err(fail(WriteStep::SyncFile, temp))?;
            count();
        }
        Ok(())
    })
    .and_then(|()| {
        match options.install {
            Install::Rename => rename(temp, path),
            Install::Exchange => exchange_or_rename(temp, path),
            Install::Exclusive => link_new(temp, path),
        }
        .map_err(fail(WriteStep::Install, path))
    });
    if let Err(e) = written {
        // Best effort: never leave a half-written temporary behind.
        let _ = std::fs::remove_file(temp);
        return Err(e);
    }
    if options.durable {
        let dir = parent_dir(path);
        sync_dir(dir).map_err(fail(WriteStep::SyncDir, dir))?;
        count();
    }
    Ok(())
}

/// Where a batch of writes ([`stage`], [`install_staged`]) is made
/// durable: one barrier for all the batch's files, one for its directory.
/// The real one is [`Disk`]; a test counts or holds the barriers.
pub(crate) trait Barrier: std::fmt::Debug + Send + Sync {
    /// Make the content of every file of `files` durable.
    fn files(&self, files: &[&File]) -> io::Result<()>;
    /// Make the renames in `dir` durable.
    fn dir(&self, dir: &Path) -> io::Result<()>;
}

/// The disk's barriers: `fdatasync` of every file of the batch, all at
/// once from threads of their own, and `fsync` of the directory. At once,
/// because one after another each `fdatasync` waits for a cache flush of
/// its own (on ext4 the first commits the journal holding every file's new
/// size, and each later one still flushes the device's cache: ~5 ms a file
/// on a slow disk, a burst's records in a row); side by side, the journal
/// commits once and the block layer merges the flushes that wait together.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Disk;

/// Threads that sync one batch's files at most.
const SYNC_THREADS: usize = 16;

impl Barrier for Disk {
    fn files(&self, files: &[&File]) -> io::Result<()> {
        if files.len() <= 1 {
            return files.iter().try_for_each(|f| f.sync_data());
        }
        let threads = files.len().min(SYNC_THREADS);
        std::thread::scope(|scope| {
            let syncing: Vec<_> = (0..threads)
                .map(|t| {
                    scope.spawn(move || {
                        files
                            .iter()
                            .skip(t)
                            .step_by(threads)
                            .try_for_each(|f| f.sync_data())
                    })
                })
                .collect();
            let mut first = Ok(());
            for s in syncing {
                let done = s
                    .join()
                    .unwrap_or_else(|_| Err(io::Error::other("a sync thread panicked")));
                if first.is_ok() {
                    first = done;
                }
            }
            first
        })
    }

    fn dir(&self, dir: &Path) -> io::Result<()> {
        sync_dir(dir)
    }
}

/// A temporary file written by [`stage`], not yet durable nor in place.
#[derive(Debug)]
pub(crate) struct Staged {
    file: File,
    temp: PathBuf,
    target: PathBuf,
}

/// The first step of a batched [`atomic_replace`]: write `bytes` to `temp`
/// (created as `create` says) for `target`, not synced. A failure removes
/// the temporary.
pub(crate) fn stage(
    target: &Path,
    temp: &Path,
    create: Temp,
    bytes: &[u8],
) -> Result<Staged, AtomicWriteError> {
    match create {
        Temp::Fresh => write_new(temp, bytes),
        Temp::Reuse => rewrite(temp, bytes),
    }
    .map(|file| Staged {
        file,
        temp: temp.to_owned(),
        target: target.to_owned(),
    })
    .map_err(|source| {
        let _ = std::fs::remove_file(temp);
        AtomicWriteError {
            step: WriteStep::Write,
            path: temp.to_owned(),
            source,
        }
    })
}

/// The rest of a batched [`atomic_replace`] for files staged in `dir`: one
/// [`Barrier::files`] for all of them, each renamed over its target, one
/// [`Barrier::dir`]. One result per staged file, in order: a failed
/// barrier fails every file it covered (a file whose content is not
/// durable is not installed; its target is untouched and its temporary
/// removed); a failed directory barrier fails every file installed.
/// Renames follow the order given, so of two writes of one target the
/// later one stays.
pub(crate) fn install_staged(
    dir: &Path,
    staged: Vec<Staged>,
    barrier: &dyn Barrier,
) -> Vec<Result<(), AtomicWriteError>> {
    if staged.is_empty() {
        return Vec::new();
    }
    let files: Vec<&File> = staged.iter().map(|s| &s.file).collect();
    if let Err(e) = barrier.files(&files) {
        return staged
            .into_iter()
            .map(|s| {
                let _ = std::fs::remove_file(&s.temp);
                Err(AtomicWriteError {
                    step: WriteStep::SyncFile,
                    path: s.temp,
                    source: io::Error::new(e.kind(), e.to_string()),
                })
            })
            .collect();
    }
    let mut results: Vec<Result<(), AtomicWriteError>> = staged
        .into_iter()
        .map(|s| {
            drop(s.file);
            rename(&s.temp, &s.target).map_err(|source| {
                let _ = std::fs::remove_file(&s.temp);
                AtomicWriteError {
                    step: WriteStep::Install,
                    path: s.target,
                    source,
                }
            })
        })
        .collect();
    if results.iter().any(Result::is_ok)
        && let Err(e) = barrier.dir(dir)
    {
        for r in results.iter_mut().filter(|r| r.is_ok()) {
            *r = Err(AtomicWriteError {
                step: WriteStep::SyncDir,
                path: dir.to_owned(),
                source: io::Error::new(e.kind(), e.to_string()),
            });
        }
    }
    results
}

/// [`install_staged`] without its barriers: each staged file renamed over
/// its target at once, in order (a reader sees the new content from here
/// on; a host crash may still lose it). One result per staged file, and the
/// files installed, for [`Barrier::files`] and [`Barrier::dir`] later.
pub(crate) fn install_unsynced(
    staged: Vec<Staged>,
) -> (Vec<Result<(), AtomicWriteError>>, Vec<File>) {
    let mut installed = Vec::with_capacity(staged.len());
    let results = staged
        .into_iter()
        .map(|s| match rename(&s.temp, &s.target) {
            Ok(()) => {
                installed.push(s.file);
                Ok(())
            }
            Err(source) => {
                let _ = std::fs::remove_file(&s.temp);
                Err(AtomicWriteError {
                    step: WriteStep::Install,
                    path: s.target,
                    source,
                })
            }
        })
        .collect();
    (results, installed)
}

/// The directory holding `path` (`.` for a bare file name).
fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
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

    fn options(temp: &Path, create: Temp, install: Install) -> AtomicWrite<'_> {
        AtomicWrite {
            temp,
            create,
            install,
            durable: true,
            syncs: None,
        }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn atomic_replace_replaces_the_content_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let (path, tmp) = (dir.path().join("doc"), dir.path().join(".doc.tmp"));
        let syncs = AtomicU64::new(0);
        let opts = AtomicWrite {
            syncs: Some(&syncs),
            ..AtomicWrite::durable(&tmp)
        };
        atomic_replace(&path, b"first, and longer", &opts).unwrap();
        atomic_replace(&path, b"second", &opts).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        assert_eq!(names(dir.path()), ["doc"]);
        assert_eq!(
            syncs.load(Ordering::Relaxed),
            4,
            "file and directory, twice"
        );
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&path).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn atomic_replace_by_exchange_keeps_the_old_content_as_the_spare() {
        let dir = tempfile::tempdir().unwrap();
        let (path, spare) = (dir.path().join("doc"), dir.path().join(".doc.spare"));
        let opts = AtomicWrite {
            durable: false,
            ..options(&spare, Temp::Reuse, Install::Exchange)
        };
        atomic_replace(&path, b"one", &opts).unwrap();
        assert!(!spare.exists(), "the first write is a rename");
        atomic_replace(&path, b"two", &opts).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        // tmpfs and ext4 exchange; elsewhere the rename leaves no spare.
        if let Ok(old) = std::fs::read(&spare) {
            assert_eq!(old, b"one");
        }
        // The spare (holding "one", longer than the new content) is
        // written over in place and cut to the new length.
        atomic_replace(&path, b"3", &opts).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"3");
        if let Ok(old) = std::fs::read(&spare) {
            assert_eq!(old, b"two");
        }
    }

    #[test]
    fn atomic_replace_refuses_a_planted_symlink_and_keeps_the_target() {
        let dir = tempfile::tempdir().unwrap();
        let (path, spare) = (dir.path().join("doc"), dir.path().join(".doc.spare"));
        let victim = dir.path().join("victim");
        std::fs::write(&path, b"old").unwrap();
        std::fs::write(&victim, b"keep").unwrap();
        std::os::unix::fs::symlink(&victim, &spare).unwrap();
        let err = atomic_replace(
            &path,
            b"new",
            &options(&spare, Temp::Reuse, Install::Exchange),
        )
        .unwrap_err();
        assert_eq!(err.step, WriteStep::Write);
        assert_eq!(err.path, spare);
        assert_eq!(err.source.raw_os_error(), Some(libc::ELOOP));
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        // A fresh temporary never follows or overwrites what is at its name.
        std::os::unix::fs::symlink(&victim, &spare).unwrap();
        let err = atomic_replace(&path, b"new", &AtomicWrite::durable(&spare)).unwrap_err();
        assert_eq!(err.step, WriteStep::Write);
        assert_eq!(err.source.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
    }

    #[test]
    fn atomic_replace_exclusive_never_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let (path, tmp) = (dir.path().join("entry"), dir.path().join(".entry.tmp"));
        let opts = options(&tmp, Temp::Fresh, Install::Exclusive);
        atomic_replace(&path, b"first", &opts).unwrap();
        let err = atomic_replace(&path, b"second", &opts).unwrap_err();
        assert_eq!(err.step, WriteStep::Install);
        assert_eq!(err.path, path);
        assert_eq!(err.source.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(&path).unwrap(), b"first");
        assert_eq!(names(dir.path()), ["entry"]);
    }

    #[test]
    fn atomic_replace_failing_to_install_removes_the_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let tmp = dir.path().join(".doc.tmp");
        // A directory in the target's place: a file cannot be renamed over it.
        let path = dir.path().join("doc");
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("inside"), b"x").unwrap();
        let err = atomic_replace(&path, b"new", &AtomicWrite::durable(&tmp)).unwrap_err();
        assert_eq!(err.step, WriteStep::Install);
        assert!(err.to_string().starts_with("put into place "), "{err}");
        assert_eq!(names(dir.path()), ["doc"]);
    }
}
