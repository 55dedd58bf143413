//! The agent daemon: socket API, lease tasks, recovery and shutdown.
//!
//! A library with an injected shutdown ([`run`], the mini-redis shape) so
//! tests run the agent in-process; [`run_until_signal`] is what `xdhcp agent`
//! calls. One [`CancellationToken`] fans out to every task; lease tasks live
//! in one `JoinSet` and are joined at shutdown. SIGTERM/SIGINT persist every
//! lease and do **not** release them: a restarted agent resumes them without
//! a new DISCOVER (SPEC R6).

pub mod apply;
pub mod lease;
pub mod link;
pub mod ops;
pub mod persist;
pub mod server;
pub mod vm;

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::UnixListener;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};
use xdhcp_engine::{Client, ClientConfig, Mode};

use self::lease::{Command as LeaseCmd, Live, Outcome, Task, lock};
use self::link::Link;
use self::persist::{LeaseRecord, WorkloadKind};
use crate::cli::{AgentArgs, AttachChoice, ClientArgs, DatapathChoice, ExpiredPolicy};
use crate::datapath::ebpf::{AttachTarget, CaptureMode, Datapath, XidOwnership};
use crate::datapath::{AttachMode, RxFrame};
use crate::kube::PodApi;
use crate::metrics::{Health, Metrics};
use crate::rpc::{self, AgentStatus, LeaseView};

/// Channel depth per lease task for captured frames.
const FRAME_QUEUE: usize = 32;
/// How often kernel counters are folded into the metrics.
const KERNEL_POLL: Duration = Duration::from_secs(5);
/// How long shutdown waits for lease tasks to persist and stop.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// Store housekeeping period: the lease store's spare files are topped up
/// and the embedded pod store's writes are made durable (group commit) this
/// often, off the ADD path. Lease records are durable when saved.
const STORE_FLUSH: Duration = Duration::from_secs(1);

/// Start-up failures.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("failed to {op}: {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("another xdhcp agent is already serving {}", path.display())]
    AlreadyRunning { path: PathBuf },
    #[error("--datapath=ebpf, but the eBPF programs could not be loaded: {source}")]
    Ebpf {
        #[source]
        source: crate::datapath::ebpf::EbpfDatapathError,
    },
    #[error("connecting to Kubernetes: {source}")]
    Kube {
        #[source]
        source: crate::kube::PodApiError,
    },
    #[error("opening the lease store: {source}")]
    Store {
        #[source]
        source: crate::store::StoreError,
    },
    #[error("serving the agent socket: {source}")]
    Serve {
        #[source]
        source: io::Error,
    },
}

/// An eBPF attachment shared by the leases on one interface:
/// (users, ifindex, mode).
type Shared = (usize, u32, AttachMode);

/// A background eBPF attach: the interface index and mode, or `None`.
pub type PendingAttach = tokio::task::JoinHandle<Option<(u32, AttachMode)>>;

/// Serializes CNI operations on one attachment.
type KeyLock = Arc<tokio::sync::Mutex<()>>;

/// The receive path for DHCP replies.
pub struct Rx {
    ebpf: Option<Mutex<Datapath>>,
    /// The kernel xid ownership map, outside the `ebpf` lock: attaches hold
    /// that lock for milliseconds each (hundreds queue up when many leases
    /// bind at once), and xid registration runs on the async workers.
    xids: Option<XidOwnership>,
    note: Option<String>,
    attach: Option<AttachMode>,
    routes: Mutex<HashMap<u32, mpsc::Sender<RxFrame>>>,
    attached: Mutex<HashMap<AttachTarget, Shared>>,
}

impl std::fmt::Debug for Rx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rx")
            .field("ebpf", &self.ebpf.is_some())
            .field("note", &self.note)
            .finish_non_exhaustive()
    }
}

impl Rx {
    fn af_packet(note: Option<String>) -> Self {
        Self {
            ebpf: None,
            xids: None,
            note,
            attach: None,
            routes: Mutex::new(HashMap::new()),
            attached: Mutex::new(HashMap::new()),
        }
    }

    /// `ebpf` or `af-packet`.
    pub fn name(&self) -> &'static str {
        if self.ebpf.is_some() {
            "ebpf"
        } else {
            "af-packet"
        }
    }

    /// Route replies carrying `xid` to `tx`, and (eBPF) mark the xid owned.
    pub fn register(&self, xid: u32, tx: mpsc::Sender<RxFrame>, ifindex: Option<u32>) {
        lock(&self.routes).insert(xid, tx);
        if let (Some(xids), Some(ifindex)) = (&self.xids, ifindex)
            && let Err(e) = xids.own(xid, ifindex)
        {
            warn!(xid, error = %e, "could not register the xid in the kernel ownership map");
        }
    }

    /// Stop routing `xid` (and drop it from the kernel map if `in_kernel`).
    pub fn unregister(&self, xid: u32, in_kernel: bool) {
        lock(&self.routes).remove(&xid);
        if in_kernel
            && let Some(xids) = &self.xids
            && let Err(e) = xids.disown(xid)
        {
            warn!(xid, error = %e, "could not remove the xid from the kernel ownership map");
        }
    }

    /// Hand a captured frame to the lease task owning its xid.
    pub fn deliver(&self, frame: RxFrame) -> bool {
        let Some(xid) = frame
            .payload
            .get(4..8)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        else {
            return false;
        };
        let tx = lock(&self.routes).get(&xid).cloned();
        tx.is_some_and(|tx| tx.try_send(frame).is_ok())
    }
}

/// Shared agent state.
pub struct Agent {
    pub args: AgentArgs,
    pub base: ClientConfig,
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
    pub pod_api: PodApi,
    pub rx: Rx,
    pub store: crate::store::LeaseStore,
    pub token: CancellationToken,
    leases: Mutex<HashMap<(String, String), Handle>>,
    key_locks: Mutex<HashMap<(String, String), KeyLock>>,
    tasks: Mutex<JoinSet<()>>,
    generation: AtomicU64,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("rx", &self.rx)
            .finish_non_exhaustive()
    }
}

/// A known attachment: its live view and (while its task runs) a command channel.
#[derive(Debug, Clone)]
pub struct Handle {
    pub generation: u64,
    pub live: Arc<Mutex<Live>>,
    pub cmds: Option<mpsc::Sender<LeaseCmd>>,
    /// Becomes `true` once the first lease is persisted (ADD waits for it,
    /// overlapping the store write with the annotation write).
    pub persisted: Option<tokio::sync::watch::Receiver<bool>>,
}

impl Agent {
    /// Serialize operations on one attachment.
    pub async fn key_lock(&self, cid: &str, ifname: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let m = lock(&self.key_locks)
            .entry((cid.to_owned(), ifname.to_owned()))
            .or_default()
            .clone();
        m.lock_owned().await
    }

    /// The attachment, if known.
    pub fn handle(&self, cid: &str, ifname: &str) -> Option<Handle> {
        lock(&self.leases)
            .get(&(cid.to_owned(), ifname.to_owned()))
            .cloned()
    }

    /// Remove an attachment from the table (only `generation`'s, if given).
    pub fn forget(&self, cid: &str, ifname: &str, generation: u64) -> Option<Handle> {
        let mut m = lock(&self.leases);
        let k = (cid.to_owned(), ifname.to_owned());
        if m.get(&k).is_some_and(|h| h.generation == generation) {
            m.remove(&k)
        } else {
            None
        }
    }

    /// Every attachment.
    pub fn handles(&self) -> Vec<Handle> {
        lock(&self.leases).values().cloned().collect()
    }

    /// The `xdhcp leases` rows.
    pub fn lease_views(&self) -> Vec<LeaseView> {
        self.handles()
            .iter()
            .map(|h| lock(&h.live).view())
            .collect()
    }

    /// Insert an attachment without a task (a discovered VM lease).
    pub fn insert_static(&self, record: LeaseRecord) -> Handle {
        let generation = self.generation.fetch_add(1, Ordering::Relaxed);
        let expires = record.lease.as_ref().and_then(lease::expiry_ms);
        let h = Handle {
            generation,
            live: Arc::new(Mutex::new(Live {
                record,
                state: xdhcp_engine::State::Bound,
                attach: "-".into(),
                expires_unix_ms: expires,
            })),
            cmds: None,
            persisted: None,
        };
        let k = {
            let l = lock(&h.live);
            (l.record.container_id.clone(), l.record.ifname.clone())
        };
        lock(&self.leases).insert(k, h.clone());
        h
    }

    /// Arrange capture for `link`. An interface already attached (another
    /// lease on it) uses eBPF at once. Otherwise the link gets its own
    /// `AF_PACKET` receiver so the first exchange starts immediately (with
    /// `eager`, for one-shot discoveries, eBPF is attached first instead); when
    /// eBPF is loaded (the returned flag), the lease task attaches it once
    /// the lease is held and then switches to the ring buffer. The attach
    /// costs 10–20 ms of kernel work under RTNL and the loader's lock, so no
    /// ADD waits for it and a burst of ADDs does not contend with it.
    pub async fn attach_capture(
        self: &Arc<Self>,
        link: Link,
        eager: bool,
    ) -> Result<(Link, String, Option<u32>, bool), link::LinkError> {
        if self.rx.ebpf.is_some() {
            let target = AttachTarget {
                ifname: link.ifname.clone(),
                netns: link.netns.clone(),
            };
            let shared = lock(&self.rx.attached).get_mut(&target).map(|e| {
                e.0 += 1;
                (e.1, e.2)
            });
            if let Some((ifindex, mode)) = shared {
                let mut link = link;
                link.drop_rx();
                return Ok((link, mode.to_string(), Some(ifindex), false));
            }
            if eager {
                // One-shot discoveries (VMs) end at BOUND: capture them on
                // eBPF from the first frame, or not at all.
                if let Some((ifindex, mode)) = self.clone().attach_ebpf(target).await {
                    let mut link = link;
                    link.drop_rx();
                    return Ok((link, mode.to_string(), Some(ifindex), false));
                }
            } else {
                let link = link.with_afpacket_rx().await?;
                return Ok((link, "af-packet (ebpf pending)".into(), None, true));
            }
        }
        let link = link.with_afpacket_rx().await?;
        Ok((link, AttachMode::AfPacket.to_string(), None, false))
    }

    /// Attach the eBPF capture to `target` for one lease (shared if another
    /// lease attached it meanwhile). `None` when the kernel refused.
    pub(crate) async fn attach_ebpf(
        self: Arc<Self>,
        target: AttachTarget,
    ) -> Option<(u32, AttachMode)> {
        let me = self.clone();
        let t = target.clone();
        let res = tokio::task::spawn_blocking(move || {
            let dp = me.rx.ebpf.as_ref()?;
            let mut attached = lock(&me.rx.attached);
            if let Some(e) = attached.get_mut(&t) {
                e.0 += 1;
                return Some(Ok((e.1, e.2)));
            }
            drop(attached);
            let r = lock(dp).attach(&t, me.rx.attach, CaptureMode::Intercept);
            Some(r.map(|a| {
                lock(&me.rx.attached).insert(t.clone(), (1, a.ifindex, a.mode));
                (a.ifindex, a.mode)
            }))
        })
        .await
        .ok()
        .flatten()?;
        match res {
            Ok(x) => Some(x),
            Err(e) => {
                warn!(ifname = %target.ifname, netns = ?target.netns, error = %e,
                    "eBPF attach failed; this interface keeps the AF_PACKET receiver");
                None
            }
        }
    }

    /// Release the capture arranged by [`Agent::attach_capture`].
    pub fn detach_capture(&self, link: &Link) {
        let Some(dp) = &self.rx.ebpf else { return };
        let target = AttachTarget {
            ifname: link.ifname.clone(),
            netns: link.netns.clone(),
        };
        let last = {
            let mut m = lock(&self.rx.attached);
            match m.get_mut(&target) {
                Some(e) if e.0 > 1 => {
                    e.0 -= 1;
                    false
                }
                Some(_) => {
                    m.remove(&target);
                    true
                }
                None => false,
            }
        };
        if last && let Err(e) = lock(dp).detach(&target) {
            // The interface is often gone already (pod deleted): nothing to detach.
            tracing::debug!(ifname = %link.ifname, error = %e, "eBPF detach");
        }
    }

    /// Start a lease task for `record` on `link` with `client`.
    pub async fn spawn_lease(
        self: &Arc<Self>,
        record: LeaseRecord,
        client: Client,
        link: Link,
        waiter: Option<oneshot::Sender<Outcome>>,
    ) -> Result<Handle, link::LinkError> {
        let eager = client.config().mode == Mode::OneShot;
        let (link, attach, ebpf_ifindex, defer_ebpf) = self.attach_capture(link, eager).await?;
        tracing::debug!(ifname = %link.ifname, %attach, "capture ready");
        let generation = self.generation.fetch_add(1, Ordering::Relaxed);
        let (frames_tx, frames) = mpsc::channel(FRAME_QUEUE);
        let (cmd_tx, cmds) = mpsc::channel(2);
        let expires = record.lease.as_ref().and_then(lease::expiry_ms);
        let state = client.state();
        self.metrics.lease_state(None, Some(state.label()));
        let live = Arc::new(Mutex::new(Live {
            record,
            state,
            attach,
            expires_unix_ms: expires,
        }));
        let (persisted_tx, persisted) = tokio::sync::watch::channel(false);
        let handle = Handle {
            generation,
            live: live.clone(),
            cmds: Some(cmd_tx),
            persisted: Some(persisted),
        };
        let k = {
            let l = lock(&live);
            (l.record.container_id.clone(), l.record.ifname.clone())
        };
        lock(&self.leases).insert(k, handle.clone());
        let task = Task {
            agent: self.clone(),
            generation,
            client,
            link,
            live,
            frames,
            frames_tx,
            cmds,
            waiter,
            ebpf_ifindex,
            pending_attach: None,
            defer_ebpf,
            attach_cancel: self.token.child_token(),
            started: Instant::now(),
            persisted: persisted_tx,
        };
        lock(&self.tasks).spawn(lease::run(task));
        Ok(handle)
    }

    /// Per-interface datapath view.
    pub fn interface_status(&self) -> Vec<rpc::InterfaceStatus> {
        self.handles()
            .iter()
            .map(|h| {
                let l = lock(&h.live);
                rpc::InterfaceStatus {
                    container_id: l.record.container_id.clone(),
                    ifname: l.record.ifname.clone(),
                    netns: l.record.netns.clone(),
                    attach: l.attach.clone(),
                }
            })
            .collect()
    }

    /// Agent + kernel counters.
    pub fn counters(&self) -> std::collections::BTreeMap<String, u64> {
        let mut out = std::collections::BTreeMap::new();
        if let Some(dp) = &self.rx.ebpf {
            match lock(dp).counters() {
                Ok(c) => {
                    for (k, v) in c.labelled() {
                        out.insert(format!("kernel.{k}"), v);
                    }
                }
                Err(e) => warn!(error = %e, "reading kernel counters"),
            }
        }
        out.insert("agent.leases".into(), lock(&self.leases).len() as u64);
        out.insert(
            "agent.routed_xids".into(),
            lock(&self.rx.routes).len() as u64,
        );
        out
    }

    /// `xdhcp status`.
    pub fn status(&self) -> AgentStatus {
        let annotations = match &self.pod_api {
            PodApi::Embedded(s) => s
                .load()
                .ok()
                .and_then(|st| serde_json::to_value(st).ok())
                .unwrap_or(serde_json::Value::Null),
            PodApi::Kube(_) => serde_json::Value::Null,
        };
        // Each lock is taken and released on its own (a guard held across
        // the struct literal would deadlock against `interface_status`).
        let leases = lock(&self.leases).len();
        let interfaces = self.interface_status();
        let counters = self.counters();
        AgentStatus {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            ready: self.health.ready().is_ok(),
            state_recovered: self.health.recovered(),
            datapath: self.rx.name().to_owned(),
            datapath_note: self.rx.note.clone(),
            pod_api: if self.pod_api.is_kube() {
                "kubernetes"
            } else {
                "embedded"
            }
            .to_owned(),
            socket: self.args.socket.clone(),
            state_dir: self.args.state_dir.clone(),
            leases,
            interfaces,
            counters,
            annotations,
        }
    }
}

/// Bind the agent socket: parent directory created with mode 0700, a stale
/// socket replaced, another live agent refused, the socket set to 0600.
pub async fn bind_socket(path: &Path) -> Result<UnixListener, DaemonError> {
    let io_err = |op, source| DaemonError::Io {
        op,
        path: path.to_path_buf(),
        source,
    };
    if let Some(parent) = path.parent()
        && !parent.exists()
    {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(|e| io_err("create the socket directory", e))?;
    }
    if path.exists() {
        if tokio::net::UnixStream::connect(path).await.is_ok() {
            return Err(DaemonError::AlreadyRunning {
                path: path.to_path_buf(),
            });
        }
        std::fs::remove_file(path).map_err(|e| io_err("remove the stale socket", e))?;
    }
    let l = UnixListener::bind(path).map_err(|e| io_err("bind the agent socket", e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| io_err("set the socket mode", e))?;
    Ok(l)
}

/// `xdhcp agent`: bind, run until SIGTERM/SIGINT.
pub async fn run_until_signal(args: AgentArgs) -> Result<(), DaemonError> {
    let listener = bind_socket(&args.socket).await?;
    let shutdown = async {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    error!(error = %e, "cannot watch SIGTERM; stopping on SIGINT only");
                    let _ = tokio::signal::ctrl_c().await;
                    return;
                }
            };
        tokio::select! {
            _ = term.recv() => info!("SIGTERM: persisting leases and stopping (leases are kept)"),
            _ = tokio::signal::ctrl_c() => info!("SIGINT: persisting leases and stopping (leases are kept)"),
        }
    };
    run(args, listener, shutdown).await
}

/// Run the agent on `listener` until `shutdown` completes.
#[expect(
    clippy::too_many_lines,
    reason = "start-up reads best as one sequence: state, datapath, recovery, servers, shutdown"
)]
pub async fn run(
    args: AgentArgs,
    listener: UnixListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), DaemonError> {
    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health::default());
    std::fs::create_dir_all(&args.state_dir).map_err(|source| DaemonError::Io {
        op: "create the state directory",
        path: args.state_dir.clone(),
        source,
    })?;
    vm::heal_at_start(&args).await;

    let store = persist::open(&args.state_dir).map_err(|source| DaemonError::Store { source })?;
    let pod_api =
        PodApi::connect_with_kubeconfig(args.kube, args.kubeconfig.as_deref(), &args.state_dir)
            .await
            .map_err(|source| DaemonError::Kube { source })?;
    let mut rx = choose_datapath(&args)?;
    let taken = rx.ebpf.as_ref().map(|dp| lock(dp).take_reader());
    let reader = match taken {
        Some(Ok(Some(r))) => Some(r),
        Some(Ok(None)) => {
            rx = Rx::af_packet(Some("ring buffer already taken".into()));
            None
        }
        Some(Err(e)) => {
            warn!(error = %e, "eBPF ring buffer unavailable; falling back to AF_PACKET");
            rx = Rx::af_packet(Some(format!("ring buffer: {e}")));
            None
        }
        None => None,
    };
    info!(datapath = rx.name(), note = rx.note.as_deref().unwrap_or(""),
        pod_api = if pod_api.is_kube() { "kubernetes" } else { "embedded" },
        socket = %args.socket.display(), state_dir = %args.state_dir.display(), "xdhcp agent starting");

    let token = CancellationToken::new();
    let agent = Arc::new(Agent {
        base: args.client_config(),
        args,
        metrics: metrics.clone(),
        health: health.clone(),
        pod_api,
        rx,
        store,
        token: token.clone(),
        leases: Mutex::new(HashMap::new()),
        key_locks: Mutex::new(HashMap::new()),
        tasks: Mutex::new(JoinSet::new()),
        generation: AtomicU64::new(1),
    });

    let mut side = JoinSet::new();
    if let Some(mut reader) = reader {
        let a = agent.clone();
        let t = token.clone();
        side.spawn(async move {
            loop {
                tokio::select! {
                    () = t.cancelled() => break,
                    ev = reader.recv() => match ev {
                        Ok(ev) => {
                            if !a.rx.deliver(ev.frame) {
                                a.metrics.dropped("unrouted_xid", 1);
                            }
                        }
                        Err(e) => {
                            error!(error = %e, "eBPF ring buffer reader failed");
                            break;
                        }
                    }
                }
            }
        });
        let a = agent.clone();
        let t = token.clone();
        side.spawn(async move {
            let mut tick = tokio::time::interval(KERNEL_POLL);
            loop {
                tokio::select! {
                    () = t.cancelled() => break,
                    _ = tick.tick() => {
                        // Off the async workers: the datapath lock may be
                        // held by a run of attaches.
                        let b = a.clone();
                        let snap = tokio::task::spawn_blocking(move || {
                            b.rx.ebpf.as_ref().map(|dp| lock(dp).counters())
                        })
                        .await;
                        if let Ok(Some(Ok(c))) = snap {
                            a.metrics.kernel_snapshot(&c.labelled());
                        }
                    }
                }
            }
        });
    }
    health.set_datapath_ready();
    {
        let a = agent.clone();
        let t = token.clone();
        side.spawn(async move {
            let mut tick = tokio::time::interval(STORE_FLUSH);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = t.cancelled() => break,
                    _ = tick.tick() => {
                        let embedded = matches!(&a.pod_api, PodApi::Embedded(s) if s.has_unsynced());
                        if a.store.spares_missing() > 0 || embedded {
                            let b = a.clone();
                            let _ = tokio::task::spawn_blocking(move || {
                                b.store.replenish();
                                flush_embedded(&b);
                            })
                            .await;
                        }
                    }
                }
            }
        });
    }

    recover(&agent).await;
    health.set_recovered();

    if let Some(addr) = agent.args.metrics_addr {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => {
                let app = crate::metrics::router(metrics.clone(), health.clone());
                let t = token.clone();
                info!(%addr, "serving /metrics, /healthz, /readyz");
                side.spawn(async move {
                    if let Err(e) = axum::serve(l, app)
                        .with_graceful_shutdown(async move { t.cancelled().await })
                        .await
                    {
                        error!(error = %e, "metrics server failed");
                    }
                });
            }
            Err(e) => {
                error!(%addr, error = %e, "cannot bind the metrics address; metrics disabled");
            }
        }
    }

    let app = server::router(agent.clone());
    let t = token.clone();
    let server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { t.cancelled().await })
            .await
    });
    info!("ready");
    tokio::select! {
        () = shutdown => {},
        () = token.cancelled() => {},
    }
    token.cancel();
    let served = match server.await {
        Ok(r) => r,
        Err(e) => Err(io::Error::other(e.to_string())),
    };

    // Lease tasks persist and stop without RELEASE.
    let mut tasks = std::mem::take(&mut *lock(&agent.tasks));
    let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while let Some(r) = tasks.join_next().await {
            if let Err(e) = r
                && e.is_panic()
            {
                error!(error = %e, "a lease task panicked");
            }
        }
    })
    .await;
    if drained.is_err() {
        warn!("some lease tasks did not stop within {SHUTDOWN_GRACE:?}");
        tasks.abort_all();
    }
    side.shutdown().await;
    // Lease records are durable when saved; the embedded pod store's last
    // changes still wait for their group commit.
    let a = agent.clone();
    let _ = tokio::task::spawn_blocking(move || flush_embedded(&a)).await;
    let _ = std::fs::remove_file(&agent.args.socket);
    info!("stopped");
    served.map_err(|source| DaemonError::Serve { source })
}

/// The embedded pod store's group commit (a no-op with a cluster).
fn flush_embedded(agent: &Agent) {
    if let PodApi::Embedded(s) = &agent.pod_api
        && let Err(e) = s.flush()
    {
        agent.metrics.failure("persist_flush");
        warn!(error = %e, "could not make the embedded pod store durable; retrying");
    }
}

fn choose_datapath(args: &AgentArgs) -> Result<Rx, DaemonError> {
    let attach = match args.attach {
        AttachChoice::Auto => None,
        AttachChoice::Tc => Some(AttachMode::Tc),
        AttachChoice::Xdp => Some(AttachMode::XdpNative),
        AttachChoice::XdpGeneric => Some(AttachMode::XdpGeneric),
    };
    match args.datapath {
        DatapathChoice::Afpacket => Ok(Rx::af_packet(Some("--datapath=afpacket".into()))),
        DatapathChoice::Ebpf | DatapathChoice::Auto => match Datapath::load_pinned(&args.bpffs_dir)
        {
            Ok(dp) => {
                let note = dp
                    .xdp_unavailable()
                    .map(|w| format!("XDP unavailable, TC only: {w}"));
                Ok(Rx {
                    xids: Some(dp.xid_ownership()),
                    ebpf: Some(Mutex::new(dp)),
                    note,
                    attach,
                    routes: Mutex::new(HashMap::new()),
                    attached: Mutex::new(HashMap::new()),
                })
            }
            Err(source) if args.datapath == DatapathChoice::Ebpf => {
                Err(DaemonError::Ebpf { source })
            }
            Err(e) => {
                warn!(error = %e, "eBPF datapath unavailable; using the AF_PACKET receiver");
                Ok(Rx::af_packet(Some(format!("eBPF unavailable: {e}"))))
            }
        },
    }
}

/// Load persisted attachments and resume them without a new DISCOVER.
async fn recover(agent: &Arc<Agent>) {
    let (records, quarantined) = match persist::load_all(&agent.store) {
        Ok(x) => x,
        Err(e) => {
            error!(error = %e, "cannot read the lease directory; starting without recovered leases");
            agent.metrics.failure("recover");
            return;
        }
    };
    for q in quarantined {
        agent.metrics.failure("corrupt_record");
        warn!(record = %q.what, reason = %q.reason, "unusable lease record set aside");
    }
    let now_ms = crate::cli::now_unix_ms();
    let mut resumed = 0usize;
    for rec in records {
        if let WorkloadKind::Vm { .. } = rec.workload {
            // One-shot discoveries are not maintained; keep them for CHECK/DEL.
            agent.insert_static(rec);
            continue;
        }
        let expired = rec
            .lease
            .as_ref()
            .and_then(lease::expiry_ms)
            .is_some_and(|e| e <= now_ms);
        if expired && agent.args.expired_lease_policy == ExpiredPolicy::Drop {
            info!(container = %rec.container_id, ifname = %rec.ifname,
                "lease expired while the agent was down; dropped (--expired-lease-policy=drop)");
            let _ = persist::remove(&agent.store, &rec.container_id, &rec.ifname);
            continue;
        }
        match resume_one(agent, rec.clone(), now_ms).await {
            Ok(()) => resumed += 1,
            Err(e) => {
                warn!(container = %rec.container_id, ifname = %rec.ifname, error = %e,
                    "cannot resume the lease (interface or namespace gone); forgetting it");
                let _ = persist::remove(&agent.store, &rec.container_id, &rec.ifname);
            }
        }
    }
    info!(resumed, "lease state recovered");
}

async fn resume_one(
    agent: &Arc<Agent>,
    rec: LeaseRecord,
    now_ms: u64,
) -> Result<(), link::LinkError> {
    let link = Link::open(rec.netns.as_deref(), &rec.ifname, true)
        .await?
        .with_src_mac(rec.mac);
    let cfg = ops::client_config(agent, &rec.config, &rec.args, rec.mac, Mode::Maintain, None);
    let now = Instant::now();
    let client = match rec.lease.clone() {
        Some(l) => {
            info!(container = %rec.container_id, ifname = %rec.ifname, address = %l.address,
                "resuming lease without DISCOVER");
            Client::resume(cfg, l, now, now_ms, seed())
        }
        None => Client::new(cfg, now, seed()),
    };
    agent.spawn_lease(rec, client, link, None).await.map(|_| ())
}

/// A fresh random seed for an engine client (xids, backoff jitter).
pub fn seed() -> u64 {
    use rand::TryRngCore as _;
    rand::rngs::OsRng.try_next_u64().unwrap_or_else(|_| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        t.as_nanos() as u64 ^ u64::from(std::process::id()).rotate_left(32)
    })
}

fn block_on<F: Future>(f: F) -> io::Result<F::Output> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(f))
}

/// `xdhcp leases`.
pub fn leases_text(a: &ClientArgs) -> anyhow::Result<String> {
    let c = rpc::Client::new(a.socket.clone(), Duration::from_secs(10));
    let rows: Vec<LeaseView> =
        block_on(c.get(rpc::PATH_LEASES))?.map_err(|e| anyhow::anyhow!(e.into_cni().msg))?;
    if a.json {
        Ok(serde_json::to_string_pretty(&rows)? + "\n")
    } else {
        Ok(crate::cli::render_leases(&rows, crate::cli::now_unix_ms()))
    }
}

/// `xdhcp status`.
pub fn status_text(a: &ClientArgs) -> anyhow::Result<String> {
    let c = rpc::Client::new(a.socket.clone(), Duration::from_secs(10));
    let s: AgentStatus =
        block_on(c.get(rpc::PATH_STATUS))?.map_err(|e| anyhow::anyhow!(e.into_cni().msg))?;
    if a.json {
        Ok(serde_json::to_string_pretty(&s)? + "\n")
    } else {
        Ok(crate::cli::render_status(&s))
    }
}
