//! The agent in-process (`xdhcp::daemon::run`) on its own runtime, with its
//! own socket, state directory and eBPF pin directory; stopped (leases
//! kept) on drop: [`InProcessAgent`] on a runtime the test drives,
//! [`ThreadAgent`] on a thread of its own (inside a node's namespace).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use xdhcp::bindings::{Binding, BindingSource, PATH_BINDINGS};
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
    /// If the agent stops during start-up or is not ready within
    /// [`crate::AGENT_READY_WITHIN`].
    pub fn start(datapath: DatapathChoice) -> Self {
        Self::start_with(|a| a.datapath = datapath)
    }

    /// Start an embedded-mode agent whose flags `edit` adjusts.
    ///
    /// # Panics
    /// If the agent stops during start-up or is not ready within
    /// [`crate::AGENT_READY_WITHIN`].
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
        let mut me = Self {
            rt,
            stop: Some(stop),
            done: Some(done),
            socket,
            dir,
        };
        let c = me.client();
        let ended = || {
            me.done
                .as_ref()
                .is_some_and(tokio::task::JoinHandle::is_finished)
        };
        let ready = wait_until(crate::AGENT_READY_WITHIN, || {
            ended()
                || c.get::<rpc::Readiness>(rpc::PATH_READY)
                    .is_ok_and(|r| r.ready)
        });
        if ended() {
            let ended = me.done.take().map(|d| me.rt.block_on(d));
            panic!("the agent stopped during start-up: {ended:?}");
        }
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

    /// ADD of container `container` on `client`'s pod interface, network
    /// `net1` with `"apply": true` (the agent configures the lease there);
    /// the request, for what follows (DEL, CHECK).
    ///
    /// # Panics
    /// If the ADD fails.
    pub fn add_applied(&self, client: &crate::LabClient, container: &str) -> CniRequest {
        let conf = r#"{"cniVersion":"1.0.0","name":"net1","type":"bridge","ipam":{"type":"xdhcp","timeout":"15s","apply":true}}"#;
        let req = crate::cni_request(client, container, "default", conf);
        self.add(&req).expect("ADD succeeds");
        req
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

/// An agent on a thread of its own, inside network namespace `netns` when
/// given (every thread the agent starts inherits it: it is the agent's
/// "host" namespace), else on a runtime of its own here; stopped on drop.
pub struct ThreadAgent {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), String>>>,
    pub socket: PathBuf,
    pub state_dir: PathBuf,
    /// The agent's directory: `run/` (the socket), `state/`, `bpffs/`.
    pub dir: tempfile::TempDir,
}

impl ThreadAgent {
    /// Start an agent in a new directory named with `prefix`; `edit`
    /// adjusts its flags (the socket, the state directory, which exists,
    /// and the pin directory are the agent's own).
    ///
    /// # Panics
    /// If the agent stops during start-up or is not ready within
    /// [`crate::AGENT_READY_WITHIN`].
    pub fn start(netns: Option<&Path>, prefix: &str, edit: impl FnOnce(&mut AgentArgs)) -> Self {
        let dir = tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
        let socket = dir.path().join("run/xdhcp.sock");
        let state_dir = dir.path().join("state");
        std::fs::create_dir_all(&state_dir).unwrap();
        let mut args = AgentArgs::with_defaults(socket.clone(), state_dir.clone());
        args.bpffs_dir = dir.path().join("bpffs");
        edit(&mut args);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let sock = socket.clone();
        let agent = move || async move {
            let listener = xdhcp::daemon::bind_socket(&sock)
                .await
                .map_err(|e| e.to_string())?;
            xdhcp::daemon::run(args, listener, async move {
                let _ = stopped.await;
            })
            .await
            .map_err(|e| e.to_string())
        };
        let ns = netns.map(Path::to_path_buf);
        let thread = std::thread::spawn(move || match ns {
            Some(ns) => xdhcp::sys::netns::block_on_in_netns(&ns, agent)
                .map_err(|e| e.to_string())
                .and_then(|r| r),
            None => tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap()
                .block_on(agent()),
        });
        let mut me = Self {
            stop: Some(stop),
            thread: Some(thread),
            socket,
            state_dir,
            dir,
        };
        let c = me.client();
        let ended = || {
            me.thread
                .as_ref()
                .is_some_and(std::thread::JoinHandle::is_finished)
        };
        let ready = wait_until(crate::AGENT_READY_WITHIN, || {
            ended()
                || c.get::<rpc::Readiness>(rpc::PATH_READY)
                    .is_ok_and(|r| r.ready)
        });
        if ended() {
            let ended = me.thread.take().map(std::thread::JoinHandle::join);
            panic!("the agent stopped during start-up: {ended:?}");
        }
        assert!(ready, "agent did not become ready");
        me
    }

    /// A client of the agent socket.
    pub fn client(&self) -> Client {
        Client::new(&self.socket, Duration::from_mins(1))
    }

    /// `xdhcp status`.
    ///
    /// # Panics
    /// If the agent does not answer.
    pub fn status(&self) -> rpc::AgentStatus {
        self.client().get(rpc::PATH_STATUS).expect("status")
    }

    /// Waits until the agent has uplinks and every one is live (attached).
    ///
    /// # Panics
    /// If that takes longer than `within`, naming `whose` uplinks.
    #[track_caller]
    pub fn wait_uplinks_live(&self, within: Duration, whose: &str) {
        assert!(
            wait_until(within, || {
                let s = self.status();
                !s.uplinks.is_empty() && s.uplinks.iter().all(|u| u.state == "live")
            }),
            "{whose} uplinks were not attached: {:?}",
            self.status().uplinks
        );
    }

    /// ADD.
    ///
    /// # Errors
    /// The agent's CNI error, or a transport failure.
    pub fn add(&self, req: &CniRequest) -> Result<CniResult, ClientError> {
        self.client()
            .post(rpc::PATH_ADD, req)
            .map(|v| serde_json::from_value(v).expect("ADD reply is a CNI result"))
    }

    /// The binding table's learned entries.
    ///
    /// # Panics
    /// If the agent does not answer.
    pub fn learned(&self) -> Vec<Binding> {
        let all: Vec<Binding> = self.client().get(PATH_BINDINGS).expect("binding table");
        all.into_iter()
            .filter(|b| b.source == BindingSource::Learned)
            .collect()
    }
}

impl Drop for ThreadAgent {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        // A stuck agent is left to the process exit rather than hanging the test.
        if let Some(t) = self.thread.take()
            && wait_until(Duration::from_secs(20), || t.is_finished())
        {
            let _ = t.join();
        }
    }
}

/// The exposition lines starting with `prefix` of the metrics an agent
/// serves at `addr` inside network namespace `netns` (none when it does
/// not answer).
///
/// # Panics
/// If `netns` cannot be entered.
pub fn metric_lines(netns: &Path, addr: SocketAddr, prefix: &str) -> Vec<String> {
    let text = xdhcp::sys::netns::run_in_netns(netns, || crate::bench::http_get(addr, "/metrics"))
        .expect("enter the node namespace")
        .unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .map(str::to_owned)
        .collect()
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
