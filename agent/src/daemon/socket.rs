//! Serving the agent socket: who may talk to it and for how long.
//!
//! The socket is the agent's whole command surface (ADD names a namespace
//! and an interface the agent acts on as root), and its path is often
//! mounted into other pods (the upstream daemon's `/run/cni/dhcp.sock`).
//! So, before a byte of HTTP is read:
//! - the peer's credentials (`SO_PEERCRED`) must be root's or a uid given
//!   with `--socket-allow-uid`; anyone else gets one CNI error (uid named)
//!   and the connection ends;
//! - at most `--socket-max-connections` connections are served at once;
//!   the next is accepted only when one ends (the kernel's backlog holds
//!   the rest);
//! - a request's header must arrive within [`HEADER_TIMEOUT`], and a
//!   connection lives at most [`CONNECTION_LIFETIME`] (longer than any
//!   ADD may take), so an idle or trickling client cannot hold a slot.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::response::IntoResponse;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::UnixListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;
use tracing::{debug, warn};

use crate::cni::types::{CniError, code};
use crate::ops::trust;
use crate::rpc;

/// Longest wait for a request's header, from the connection's start or the
/// previous answer.
pub(crate) const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest life of one connection: the longest ADD the plugin waits for
/// (its largest `ipam.timeout` and its margin), and a minute more.
pub(crate) const CONNECTION_LIFETIME: Duration = Duration::from_secs(5 * 60 + 15 + 60);
/// How long a connection still in use at shutdown is waited for.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(10);

/// When a connection was accepted: the start of its first request's read
/// (the `request` phase of an ADD), put in each of its requests'
/// extensions.
#[derive(Debug, Clone)]
pub(crate) struct Accepted {
    at: Instant,
    taken: Arc<AtomicBool>,
}

impl Accepted {
    fn now() -> Self {
        Self {
            at: Instant::now(),
            taken: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The accept, for the connection's first request only: a later one
    /// on the same connection has no start of its own to count from.
    pub(crate) fn first(&self) -> Option<Instant> {
        (!self.taken.swap(true, Ordering::Relaxed)).then_some(self.at)
    }
}

/// Who may connect and how many at once.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    /// Uids besides root allowed to use the socket.
    pub(crate) allowed_uids: Arc<[u32]>,
    /// Connections served at once.
    pub(crate) max_connections: usize,
}

/// Serve `app` on `listener` under `limits` until `token` is cancelled,
/// then let the open connections finish (each for at most
/// [`SHUTDOWN_WAIT`]).
pub(crate) async fn serve(
    listener: UnixListener,
    app: Router,
    limits: Limits,
    token: CancellationToken,
) -> io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut conns = JoinSet::new();
    loop {
        let slot = tokio::select! {
            () = token.cancelled() => break,
            s = slots.clone().acquire_owned() => s.map_err(io::Error::other)?,
        };
        let stream = tokio::select! {
            () = token.cancelled() => break,
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    // EMFILE and the like: back off instead of spinning.
                    warn!(error = %e, "cannot accept on the agent socket; retrying");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let app = match stream.peer_cred() {
            Ok(c) if trust::peer_allowed(c.uid(), &limits.allowed_uids) => app.clone(),
            Ok(c) => {
                warn!(
                    uid = c.uid(),
                    pid = c.pid(),
                    "agent socket: peer refused (not root, not --socket-allow-uid)"
                );
                refusal(format!(
                    "the agent socket serves root and the uids given with --socket-allow-uid; this peer runs as uid {}",
                    c.uid()
                ))
            }
            Err(e) => {
                warn!(error = %e, "agent socket: cannot read the peer's credentials; refused");
                refusal(format!("cannot read the peer's credentials: {e}"))
            }
        };
        let t = token.clone();
        conns.spawn(async move {
            one(stream, app, t).await;
            drop(slot);
        });
        while conns.try_join_next().is_some() {}
    }
    while conns.join_next().await.is_some() {}
    Ok(())
}

/// A router that answers every request with the one refusal.
fn refusal(msg: String) -> Router {
    let err = CniError::new(code::INVALID_ENV, msg);
    Router::new().fallback(move || {
        let err = err.clone();
        async move { (rpc::status_for(err.code), axum::Json(err)).into_response() }
    })
}

/// One connection: HTTP/1.1 with the header timeout, until the client
/// closes, the lifetime ends or the agent stops. Its requests carry when
/// it was accepted ([`Accepted`]).
async fn one(stream: tokio::net::UnixStream, app: Router, token: CancellationToken) {
    // The accept goes in each request's extensions as it comes: layering
    // the router with it instead rebuilt every route once per connection,
    // which a CPU profile of a burst of ADDs showed.
    let accepted = Accepted::now();
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        req.extensions_mut().insert(accepted.clone());
        app.clone().oneshot(req)
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                debug!(error = %e, "agent socket connection ended with an error");
            }
        }
        () = tokio::time::sleep(CONNECTION_LIFETIME) => {
            warn!(lifetime = ?CONNECTION_LIFETIME, "agent socket connection outlived its lifetime; closed");
        }
        () = token.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(SHUTDOWN_WAIT, conn).await;
        }
    }
}

/// Removes the socket files at `paths` that no live listener answers on
/// (call it once this agent's own listeners are closed), leaving one that
/// another agent serves, saying so: a new agent that started while this
/// one was stopping (a rolling upgrade with a surge, a quick restart) has
/// put its own socket at the same path, and removing that would leave the
/// new agent serving nobody. (A file's identity cannot tell them apart:
/// the new socket may reuse the old one's inode.)
pub(crate) fn remove_unserved<'a>(paths: impl IntoIterator<Item = &'a std::path::PathBuf>) {
    for path in paths {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            tracing::info!(socket = %path.display(),
                "another agent serves the socket now; leaving it");
        } else {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod socket_files_tests {
    use super::remove_unserved;

    #[test]
    fn a_stopping_agent_removes_its_own_socket_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("xdhcp.sock");
        let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        drop(l);
        remove_unserved([&path]);
        assert!(!path.exists());
    }

    /// The next agent replaced the socket while this one was stopping: the
    /// new agent's socket stays.
    #[test]
    fn a_socket_another_agent_serves_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("xdhcp.sock");
        let old = std::os::unix::net::UnixListener::bind(&path).unwrap();
        drop(old);
        std::fs::remove_file(&path).unwrap();
        let _new = std::os::unix::net::UnixListener::bind(&path).unwrap();
        remove_unserved([&path]);
        assert!(std::os::unix::net::UnixStream::connect(&path).is_ok());
    }
}
