//! Running work inside another network namespace.
//!
//! Network namespace membership is a property of an OS thread, so entering a
//! namespace on a thread that is shared (a tokio worker, the blocking pool)
//! would leak the namespace into unrelated work. The helpers here therefore
//! spawn a short-lived dedicated thread, `setns(CLONE_NEWNET)` it into the
//! target namespace, run the closure and let the thread exit; the caller's
//! thread never changes namespace. One exception, [`run_switched`], is for
//! short synchronous work on a pod's ADD path: it moves the calling thread
//! in and back around the closure (nothing else can run on that thread
//! meanwhile), which costs two `setns` calls (~1 µs) where a thread costs a
//! spawn and a cross-CPU wake-up (~0.2 ms on a 2-core VM).
//!
//! Sockets (AF_PACKET, netlink, UDP) created inside the closure stay bound to
//! the namespace they were created in after the thread exits, which is how the
//! datapath opens per-lease sockets in pod namespaces.

use std::fs::File;
use std::future::Future;
use std::os::fd::{AsFd as _, BorrowedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::sched::{CloneFlags, setns};

/// Errors entering a network namespace. Every variant names the namespace path.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// The namespace file could not be opened (missing, permissions, ...).
    #[error("failed to open network namespace {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The path exists but does not refer to a network namespace.
    #[error("{path} is not a network namespace")]
    NotNetns { path: PathBuf },
    /// `setns(2)` failed for another reason (e.g. missing `CAP_SYS_ADMIN`).
    #[error("failed to enter network namespace {path}: {source}")]
    Enter {
        path: PathBuf,
        #[source]
        source: Errno,
    },
    /// The dedicated thread could not be created.
    #[error("failed to spawn a thread for network namespace {path}: {source}")]
    Spawn {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The closure panicked on the namespace thread.
    #[error("the work run inside network namespace {path} panicked")]
    Panicked { path: PathBuf },
    /// A tokio runtime for async work inside the namespace could not be built.
    #[error("failed to build a tokio runtime inside network namespace {path}: {source}")]
    Runtime {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Convenience alias for results of this module.
pub type Result<T, E = NetnsError> = std::result::Result<T, E>;

impl NetnsError {}

/// Opens `netns` and moves the current thread into it.
///
/// Only ever called on a thread spawned for this purpose.
fn enter(netns: &Path) -> Result<()> {
    enter_file(&open(netns)?, netns)
}

/// Opens the namespace file `netns`.
fn open(netns: &Path) -> Result<File> {
    File::open(netns).map_err(|source| NetnsError::Open {
        path: netns.to_path_buf(),
        source,
    })
}

/// Moves the current thread into the namespace `file` (opened from `netns`).
fn enter_file(file: &File, netns: &Path) -> Result<()> {
    setns(file, CloneFlags::CLONE_NEWNET).map_err(|source| match source {
        // setns(2): "EINVAL fd refers to a namespace whose type does not
        // match that specified in nstype" (also: not a namespace at all).
        Errno::EINVAL => NetnsError::NotNetns {
            path: netns.to_path_buf(),
        },
        source => NetnsError::Enter {
            path: netns.to_path_buf(),
            source,
        },
    })
}

/// Run `f` on the calling thread moved into `netns`, and move the thread
/// back to the namespace it was in (which `f` is given) before returning,
/// also when `f` panics.
/// `f` must be short and must not block or yield (no `.await` can happen
/// inside it: it is synchronous), so no other work runs on the thread while
/// it is inside. Should the way back fail, the process aborts: a thread
/// left in a pod's namespace would do later, unrelated work there.
///
/// # Errors
/// Opening `netns` or entering it; `f` has not run then.
pub fn run_switched<T>(netns: &Path, f: impl FnOnce(BorrowedFd<'_>) -> T) -> Result<T> {
    run_switched_holding(netns, f).map(|(t, _)| t)
}

/// [`run_switched`], and the namespace file it entered by, for the caller
/// to hold (opened once for both). The calling thread's own namespace is
/// opened at its first trip and kept for the next ones: a thread returns
/// to it after every trip, so it never changes.
///
/// # Errors
/// Opening `netns` or entering it; `f` has not run then.
pub fn run_switched_holding<T>(
    netns: &Path,
    f: impl FnOnce(BorrowedFd<'_>) -> T,
) -> Result<(T, File)> {
    /// Moves the thread back when dropped.
    struct Back<'a>(&'a File);
    impl Drop for Back<'_> {
        fn drop(&mut self) {
            if let Err(e) = setns(self.0, CloneFlags::CLONE_NEWNET) {
                tracing::error!(error = %e,
                    "cannot return a thread to the agent's network namespace; aborting");
                std::process::abort();
            }
        }
    }
    thread_local! {
        /// This thread's own namespace, once a trip has opened it.
        static HOME: std::cell::OnceCell<File> = const { std::cell::OnceCell::new() };
    }
    HOME.with(|cell| {
        let home = if let Some(home) = cell.get() {
            home
        } else {
            let opened = open(Path::new("/proc/thread-self/ns/net"))?;
            cell.get_or_init(|| opened)
        };
        let target = open(netns)?;
        enter_file(&target, netns)?;
        let back = Back(home);
        let out = f(back.0.as_fd());
        drop(back);
        Ok((out, target))
    })
}

/// Spawns the dedicated thread that enters `netns` and runs `f`.
fn spawn_in_netns<T: Send + 'static>(
    netns: &Path,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<std::thread::JoinHandle<Result<T>>> {
    let path = netns.to_path_buf();
    // Opened here, so a namespace that is gone is this call's error (the
    // async forms could otherwise only see the thread end without a word).
    let file = open(netns)?;
    std::thread::Builder::new()
        .name("xdhcp-netns".to_owned())
        .spawn(move || {
            enter_file(&file, &path)?;
            drop(file);
            f()
        })
        .map_err(|source| NetnsError::Spawn {
            path: netns.to_path_buf(),
            source,
        })
}

/// Run `f` on a short-lived dedicated OS thread that has `setns()`-ed into the
/// namespace at `netns` (a `/var/run/netns/<name>` or `/proc/<pid>/ns/net`
/// path), and wait for it. The caller's thread never changes namespace.
/// Sockets created inside keep that namespace after the thread exits. The
/// thread is scoped, so `f` may borrow from the caller (the eBPF loader
/// attaches its programs, held by `&mut`, this way).
pub fn run_in_netns<T: Send>(netns: &Path, f: impl FnOnce() -> T + Send) -> Result<T> {
    std::thread::scope(|scope| {
        let handle = std::thread::Builder::new()
            .name("xdhcp-netns".to_owned())
            .spawn_scoped(scope, || {
                enter(netns)?;
                Ok(f())
            })
            .map_err(|source| NetnsError::Spawn {
                path: netns.to_path_buf(),
                source,
            })?;
        handle.join().map_err(|_| NetnsError::Panicked {
            path: netns.to_path_buf(),
        })?
    })
}

/// [`run_in_netns_async`] when `netns` names a namespace; with `None`
/// (the agent's own), `f` runs here, on the calling thread: for quick work
/// only, such as a socket made and bound.
///
/// # Errors
/// As [`run_in_netns_async`]; none with `None`.
pub async fn run_in_or_here<T: Send + 'static>(
    netns: Option<&Path>,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T> {
    match netns {
        Some(ns) => run_in_netns_async(ns, f).await,
        None => Ok(f()),
    }
}

/// Async form of [`run_in_netns`]: the work still runs on its own dedicated
/// thread (never on a tokio worker or the shared blocking pool); the caller's
/// task awaits its result without blocking a worker.
pub async fn run_in_netns_async<T: Send + 'static>(
    netns: &Path,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    // The join handle is dropped: the thread detaches and reports through
    // the channel. A panic drops `tx` without sending, which we map below.
    drop(spawn_in_netns(netns, move || {
        // The receiver may be gone if the caller was cancelled; nothing to do then.
        let _ = tx.send(f());
        Ok(())
    })?);
    rx.await.map_err(|_| NetnsError::Panicked {
        path: netns.to_path_buf(),
    })
}

/// Run the future produced by `f` to completion on a current-thread tokio
/// runtime living on a dedicated thread inside `netns` (e.g. rtnetlink
/// requests, which open their netlink socket in the calling namespace).
/// Blocks the calling thread; use [`block_on_in_netns_async`] from async code.
pub fn block_on_in_netns<T, Fut>(
    netns: &Path,
    f: impl FnOnce() -> Fut + Send + 'static,
) -> Result<T>
where
    T: Send + 'static,
    Fut: Future<Output = T>,
{
    let path = netns.to_path_buf();
    let handle = spawn_in_netns(netns, move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|source| NetnsError::Runtime { path, source })?;
        Ok(runtime.block_on(f()))
    })?;
    handle.join().map_err(|_| NetnsError::Panicked {
        path: netns.to_path_buf(),
    })?
}

/// Async form of [`block_on_in_netns`].
pub async fn block_on_in_netns_async<T, Fut>(
    netns: &Path,
    f: impl FnOnce() -> Fut + Send + 'static,
) -> Result<T>
where
    T: Send + 'static,
    Fut: Future<Output = T>,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    let path = netns.to_path_buf();
    drop(spawn_in_netns(netns, move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|source| NetnsError::Runtime { path, source });
        let _ = tx.send(runtime.map(|rt| rt.block_on(f())));
        Ok(())
    })?);
    rx.await.map_err(|_| NetnsError::Panicked {
        path: netns.to_path_buf(),
    })?
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;
    use std::sync::mpsc;

    /// A network namespace that lives as long as a parked helper thread that
    /// `unshare`d it; no `ip netns` and no host state involved.
    struct ThreadNetns {
        path: PathBuf,
        stop: Option<mpsc::Sender<()>>,
        thread: Option<std::thread::JoinHandle<()>>,
    }

    impl ThreadNetns {
        fn new() -> Self {
            let (ready_tx, ready_rx) = mpsc::channel();
            let (stop_tx, stop_rx) = mpsc::channel::<()>();
            let thread = std::thread::spawn(move || {
                nix::sched::unshare(CloneFlags::CLONE_NEWNET)
                    .expect("unshare(CLONE_NEWNET) (root needed)");
                ready_tx.send(nix::unistd::gettid().as_raw()).unwrap();
                let _ = stop_rx.recv();
            });
            let tid = ready_rx.recv().expect("netns helper thread died");
            let path = PathBuf::from(format!("/proc/{}/task/{tid}/ns/net", std::process::id()));
            Self {
                path,
                stop: Some(stop_tx),
                thread: Some(thread),
            }
        }

        fn inode(&self) -> u64 {
            std::fs::metadata(&self.path).unwrap().ino()
        }
    }

    impl Drop for ThreadNetns {
        fn drop(&mut self) {
            drop(self.stop.take());
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }

    fn current_thread_netns_inode() -> u64 {
        std::fs::metadata("/proc/thread-self/ns/net").unwrap().ino()
    }

    #[test]
    fn runs_closure_inside_target_namespace_and_leaves_caller_alone() {
        let ns = ThreadNetns::new();
        let before = current_thread_netns_inode();
        assert_ne!(before, ns.inode(), "helper namespace must differ from ours");
        let inside = run_in_netns(&ns.path, current_thread_netns_inode).unwrap();
        assert_eq!(inside, ns.inode());
        assert_eq!(current_thread_netns_inode(), before);
    }

    #[test]
    fn closure_may_borrow_from_the_caller() {
        let ns = ThreadNetns::new();
        let mut seen = Vec::new();
        run_in_netns(&ns.path, || seen.push(current_thread_netns_inode())).unwrap();
        assert_eq!(seen, [ns.inode()]);
    }

    /// Inode of the network namespace a socket belongs to (`SIOCGSKNS`).
    fn socket_netns_inode(sock: &impl std::os::fd::AsRawFd) -> u64 {
        const SIOCGSKNS: libc::c_ulong = 0x894C;
        // SAFETY: SIOCGSKNS takes no argument and returns a new fd or -1.
        let fd = unsafe { libc::ioctl(sock.as_raw_fd(), SIOCGSKNS) };
        assert!(fd >= 0, "SIOCGSKNS: {}", std::io::Error::last_os_error());
        // SAFETY: the kernel just handed us this fd; we own it.
        let file = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        file.metadata().unwrap().ino()
    }

    #[test]
    fn sockets_created_inside_keep_the_namespace() {
        let ns = ThreadNetns::new();
        let sock = run_in_netns(&ns.path, || std::net::UdpSocket::bind("0.0.0.0:0"))
            .unwrap()
            .unwrap();
        // The creating thread has exited; the socket still lives in the netns.
        assert_eq!(socket_netns_inode(&sock), ns.inode());
        let here = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        assert_eq!(socket_netns_inode(&here), current_thread_netns_inode());
    }

    #[test]
    fn missing_path_is_an_open_error_naming_the_path() {
        let err = run_in_netns(Path::new("/var/run/netns/xdt-does-not-exist"), || ()).unwrap_err();
        assert!(matches!(err, NetnsError::Open { .. }), "{err:?}");
        assert!(
            err.to_string()
                .contains("/var/run/netns/xdt-does-not-exist"),
            "{err}"
        );
    }

    #[test]
    fn non_netns_path_is_rejected() {
        let err = run_in_netns(Path::new("/proc/self/ns/uts"), || ()).unwrap_err();
        assert!(matches!(err, NetnsError::NotNetns { .. }), "{err:?}");
        let err = run_in_netns(Path::new("/etc/hostname"), || ()).unwrap_err();
        assert!(matches!(err, NetnsError::NotNetns { .. }), "{err:?}");
    }

    #[test]
    fn panics_are_reported_not_propagated() {
        let ns = ThreadNetns::new();
        let err = run_in_netns(&ns.path, || panic!("boom")).unwrap_err();
        assert!(matches!(err, NetnsError::Panicked { .. }), "{err:?}");
    }

    #[tokio::test]
    async fn async_wrappers_run_inside() {
        let ns = ThreadNetns::new();
        let want = ns.inode();
        let got = run_in_netns_async(&ns.path, current_thread_netns_inode)
            .await
            .unwrap();
        assert_eq!(got, want);
        let got = block_on_in_netns_async(&ns.path, || async {
            tokio::task::yield_now().await;
            current_thread_netns_inode()
        })
        .await
        .unwrap();
        assert_eq!(got, want);
        let got = block_on_in_netns(&ns.path, || async { current_thread_netns_inode() }).unwrap();
        assert_eq!(got, want);
        let err = run_in_netns_async(&ns.path, || panic!("boom"))
            .await
            .unwrap_err();
        assert!(matches!(err, NetnsError::Panicked { .. }), "{err:?}");
        assert_ne!(current_thread_netns_inode(), want);
    }

    #[test]
    fn run_switched_runs_inside_and_brings_the_thread_back_even_after_a_panic() {
        let ns = ThreadNetns::new();
        let before = current_thread_netns_inode();
        let (inside, sock, home) = run_switched(&ns.path, |home| {
            (
                current_thread_netns_inode(),
                std::net::UdpSocket::bind("0.0.0.0:0").unwrap(),
                File::from(home.try_clone_to_owned().unwrap())
                    .metadata()
                    .unwrap()
                    .ino(),
            )
        })
        .unwrap();
        assert_eq!(inside, ns.inode());
        assert_eq!(
            home, before,
            "the closure is given the namespace it came from"
        );
        assert_eq!(socket_netns_inode(&sock), ns.inode());
        assert_eq!(current_thread_netns_inode(), before);

        let caught = std::panic::catch_unwind(|| {
            run_switched(&ns.path, |_| -> () { panic!("boom") }).unwrap();
        });
        assert!(caught.is_err());
        assert_eq!(
            current_thread_netns_inode(),
            before,
            "a panic inside left the thread in the namespace"
        );

        let err = run_switched(Path::new("/proc/self/ns/uts"), |_| ()).unwrap_err();
        assert!(matches!(err, NetnsError::NotNetns { .. }), "{err:?}");
        let err = run_switched(Path::new("/run/netns/xdhcp-test-none"), |_| ()).unwrap_err();
        assert!(matches!(err, NetnsError::Open { .. }), "{err:?}");
        assert_eq!(current_thread_netns_inode(), before);
    }

    /// A namespace that is gone (a pod's, deleted under the agent) is an
    /// open error naming it from the async forms too, not a "panic".
    #[tokio::test]
    async fn async_wrappers_name_a_missing_namespace() {
        let gone = Path::new("/run/netns/xdhcp-test-no-such-namespace");
        let err = run_in_netns_async(gone, || ()).await.unwrap_err();
        assert!(matches!(err, NetnsError::Open { .. }), "{err:?}");
        assert!(
            err.to_string().contains(&gone.display().to_string()),
            "{err}"
        );
        let err = block_on_in_netns_async(gone, || async {})
            .await
            .unwrap_err();
        assert!(matches!(err, NetnsError::Open { .. }), "{err:?}");
    }
}
