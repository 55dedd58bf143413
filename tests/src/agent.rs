//! The agent in-process (`xdhcp::daemon::run`) on its own runtime, with its
//! own socket, state directory and eBPF pin directory; stopped (leases
//! kept) on drop.

use std::path::{Path, PathBuf};
use std::time::Duration;

use xdhcp::cli::{AgentArgs, DatapathChoice, KubeMode};
use xdhcp::rpc::{self, Client, ClientError, CniRequest, CniResult, LeaseView};

use crate::wait_until;

/// An agent running on its own runtime.
pub struct InProcessAgent {
    pub rt: tokio::runtime::Runtime,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: Option<tokio::task::JoinHandle<Result<(), xdhcp::daemon::DaemonError>>>,
    pub socket: PathBuf,
    dir: tempfile::TempDir,
}

impl InProcessAgent {
    /// Start an embedded-mode agent with `datapath`.
    ///
    /// # Panics
    /// If the agent does not become ready within 20 s.
    pub fn start(datapath: DatapathChoice) -> Self {
        Self::start_with(|a| a.datapath = datapath)
    }

    /// Start an embedded-mode agent whose flags `edit` adjusts.
    ///
    /// # Panics
    /// If the agent does not become ready within 20 s.
    pub fn start_with(edit: impl FnOnce(&mut AgentArgs)) -> Self {
        // Agent logs on stderr (shown for failing tests); one subscriber per process.
        let _ = xdhcp::telemetry::init(xdhcp::telemetry::LogFormat::Human);
        let dir = tempfile::Builder::new()
            .prefix("xdt-agent-")
            .tempdir()
            .unwrap();
        let socket = dir.path().join("run/xdhcp.sock");
        let mut args = AgentArgs::with_defaults(socket.clone(), dir.path().join("state"));
        args.kube = KubeMode::Off;
        args.bpffs_dir = dir.path().join("bpffs");
        // Never this machine's Open vSwitch: its uplinks are no test's.
        args.ovsdb = dir.path().join("no-ovsdb.sock");
        edit(&mut args);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let listener = rt
            .block_on(xdhcp::daemon::bind_socket(&socket))
            .expect("bind agent socket");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let done = rt.spawn(xdhcp::daemon::run(args, listener, async move {
            let _ = stopped.await;
        }));
        let me = Self {
            rt,
            stop: Some(stop),
            done: Some(done),
            socket,
            dir,
        };
        let c = me.client();
        let ready = wait_until(Duration::from_secs(20), || {
            c.get::<rpc::Readiness>(rpc::PATH_READY)
                .is_ok_and(|r| r.ready)
        });
        assert!(ready, "agent did not become ready");
        me
    }

    /// A client of the agent socket.
    pub fn client(&self) -> Client {
        Client::new(&self.socket, Duration::from_mins(1))
    }

    /// POST `req` to `path`.
    ///
    /// # Errors
    /// The agent's CNI error, or a transport failure.
    pub fn post<T: serde::Serialize>(
        &self,
        path: &str,
        req: &T,
    ) -> Result<serde_json::Value, ClientError> {
        self.client().post(path, req)
    }

    /// The agent's state directory (its lease records are under `leases/`).
    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// The file names of the lease records on disk.
    pub fn record_files(&self) -> Vec<String> {
        lease_record_files(&self.state_dir())
            .iter()
            .filter_map(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .collect()
    }

    /// ADD.
    ///
    /// # Errors
    /// The agent's CNI error, or a transport failure.
    pub fn add(&self, req: &CniRequest) -> Result<CniResult, ClientError> {
        self.post(rpc::PATH_ADD, req)
            .map(|v| serde_json::from_value(v).expect("ADD reply is a CNI result"))
    }

    /// `xdhcp leases`.
    ///
    /// # Panics
    /// If the agent does not answer.
    pub fn leases(&self) -> Vec<LeaseView> {
        self.client().get(rpc::PATH_LEASES).expect("lease table")
    }

    /// `xdhcp status`.
    ///
    /// # Panics
    /// If the agent does not answer.
    pub fn status(&self) -> rpc::AgentStatus {
        self.client().get(rpc::PATH_STATUS).expect("status")
    }
}

impl Drop for InProcessAgent {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(d) = self.done.take() {
            let _ = self
                .rt
                .block_on(async { tokio::time::timeout(Duration::from_secs(15), d).await });
        }
    }
}

/// The lease record files under an agent's state directory `state_dir`
/// (`leases/*.json`), sorted; none when the directory is missing.
pub fn lease_record_files(state_dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(state_dir.join("leases"))
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "json"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}
