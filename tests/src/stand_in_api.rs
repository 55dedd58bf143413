//! The stand-in API server ([`FakeApiServer`], **not a cluster**) set up as
//! the agent's tests use it: on a tokio runtime of its own, because the
//! test thread blocks on the agent or the plugin while it serves, with a
//! kubeconfig file naming it.

use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};

use crate::fake_apiserver::FakeApiServer;

/// The stand-in API server, its runtime, and a kubeconfig naming it. Dropped
/// with the test: the server stops and the kubeconfig's directory goes.
pub struct StandInApi {
    /// The server: its store, faults and recorded requests.
    pub server: FakeApiServer,
    /// A kubeconfig for it (plain HTTP, no user).
    pub kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
    // Dropped last: the server's task runs on it.
    _rt: tokio::runtime::Runtime,
}

impl StandInApi {
    /// Listening on `127.0.0.1` of this thread's network namespace.
    #[track_caller]
    pub fn start() -> Self {
        let listener =
            std::net::TcpListener::bind("127.0.0.1:0").expect("bind the stand-in API server");
        Self::serve(listener)
    }

    /// Listening on `127.0.0.1` of the network namespace at `netns`, where
    /// an agent whose threads live in that namespace reaches it.
    #[track_caller]
    pub fn start_in(netns: &Path) -> Self {
        let listener =
            xdhcp::sys::netns::run_in_netns(netns, || std::net::TcpListener::bind("127.0.0.1:0"))
                .expect("enter the namespace for the stand-in API server")
                .expect("bind the stand-in API server in the namespace");
        Self::serve(listener)
    }

    fn serve(listener: std::net::TcpListener) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime for the stand-in API server");
        let server = rt.block_on(async { FakeApiServer::start_on(listener) });
        let dir = tempfile::Builder::new()
            .prefix("xdt-kubeconfig-")
            .tempdir()
            .expect("a directory for the kubeconfig");
        let kubeconfig = write_kubeconfig(dir.path(), &server.url());
        Self {
            server,
            kubeconfig,
            _dir: dir,
            _rt: rt,
        }
    }
}

impl Deref for StandInApi {
    type Target = FakeApiServer;

    fn deref(&self) -> &FakeApiServer {
        &self.server
    }
}

/// Writes `dir/kubeconfig` for an API server at `url` (plain HTTP, no user)
/// and returns its path.
#[track_caller]
pub fn write_kubeconfig(dir: &Path, url: &str) -> PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: fake\n\
             clusters:\n- name: fake\n  cluster:\n    server: {url}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: nobody\n\
             users:\n- name: nobody\n  user: {{}}\n"
        ),
    )
    .expect("write the kubeconfig");
    path
}

impl DerefMut for StandInApi {
    fn deref_mut(&mut self) -> &mut FakeApiServer {
        &mut self.server
    }
}
