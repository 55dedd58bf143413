//! The agent daemon, as a library with an injected shutdown ([`run`]) so
//! tests run it in-process; [`run_until_signal`] is what `xdhcp agent` calls.
//!
//! Actors and where they live:
//! - `capture`: the eBPF datapath (attach lifecycle, ring reader, xid
//!   routing, health and fallback);
//! - `registry`: the lease table, per-attachment locks, starting and
//!   stopping lease tasks;
//! - `lease::task`: one task per lease, driving the DHCP engine;
//! - `add` / `vm` / `acquire`: the CNI operations;
//! - `recover`: resuming persisted leases at start;
//! - `uplinks`: without `--uplink`, the uplinks read from Open vSwitch;
//! - `workloads`: the guard on the workload ports read from Open vSwitch;
//! - `server` / `status`: the agent socket.
//!
//! One [`CancellationToken`] fans out to every task. SIGTERM/SIGINT persist
//! every lease and do **not** release them: a restarted agent resumes them
//! without a new DISCOVER.

mod recover;
mod server;
mod socket;
mod status;
mod uplinks;
mod workloads;

use std::future::Future;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::datapath::AttachMode;
use crate::datapath::capture::{self, Capture};
use crate::datapath::ebpf::Datapath;
use crate::datapath::link;
use crate::guard;
use crate::kube::PodApi;
use crate::lease::registry::Registry;
use crate::lease::task::Services;
use crate::lease::{self, pacing};
use crate::metrics::{Health, Metrics};
use crate::ops::context::Agent;
use crate::ops::vm;
use crate::settings::{AgentArgs, AttachChoice, DatapathChoice};

/// How long shutdown waits for the stopped leases' packet sockets to close.
const SOCKET_CLOSE_GRACE: Duration = Duration::from_secs(5);

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
    #[error("another daemon is already serving {} (an xdhcp agent, or the upstream dhcp daemon: stop it first)", path.display())]
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
    #[error("--uplink {ifname} is given more than once")]
    DuplicateUplink { ifname: String },
    #[error("opening the learned-binding store: {source}")]
    Bindings {
        #[source]
        source: crate::bindings::StoreError,
    },
    #[error("serving the agent socket: {source}")]
    Serve {
        #[source]
        source: io::Error,
    },
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
    // Bound in a private directory (mode 0700) beside the path, given mode
    // 0600 there and only then renamed into place: whatever the umask, the
    // socket is never at its path with a wider mode, not even between the
    // bind and the chmod.
    let name = path
        .file_name()
        .ok_or_else(|| io_err("bind the agent socket", io::ErrorKind::InvalidInput.into()))?;
    let mut private_name = std::ffi::OsString::from(".");
    private_name.push(name);
    private_name.push(format!(".bind-{}", std::process::id()));
    let private = path.with_file_name(private_name);
    // A killed agent of the same pid may have left it.
    let _ = std::fs::remove_dir_all(&private);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&private)
        .map_err(|e| io_err("create the private bind directory", e))?;
    let staged = private.join("sock");
    let bound = UnixListener::bind(&staged)
        .map_err(|e| io_err("bind the agent socket", e))
        .and_then(|l| {
            std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| io_err("set the socket mode", e))?;
            std::fs::rename(&staged, path).map_err(|e| io_err("move the socket into place", e))?;
            Ok(l)
        });
    let _ = std::fs::remove_dir_all(&private);
    bound
}

/// `xdhcp agent`: bind the socket and every `--extra-socket`, write the
/// `--pidfile`, run until SIGTERM/SIGINT.
pub async fn run_until_signal(args: AgentArgs) -> Result<(), DaemonError> {
    let mut listeners = vec![bind_socket(&args.socket).await?];
    for extra in &args.extra_socket {
        listeners.push(bind_socket(extra).await?);
    }
    let pidfile = args.pidfile.clone();
    if let Some(p) = &pidfile {
        std::fs::write(p, std::process::id().to_string()).map_err(|source| DaemonError::Io {
            op: "write the pid file",
            path: p.clone(),
            source,
        })?;
    }
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
    let served = run_on(args, listeners, shutdown).await;
    if let Some(p) = &pidfile {
        let _ = std::fs::remove_file(p);
    }
    served
}

/// Run the agent on `listener` until `shutdown` completes.
pub async fn run(
    args: AgentArgs,
    listener: UnixListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), DaemonError> {
    run_on(args, vec![listener], shutdown).await
}

/// Run the agent on `listeners` (the socket first, then the extra ones)
/// until `shutdown` completes.
async fn run_on(
    args: AgentArgs,
    listeners: Vec<UnixListener>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), DaemonError> {
    let begun = std::time::Instant::now();
    // Read before anything enters a pod's namespace.
    crate::ops::trust::forbidden_netns();
    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health::default());
    std::fs::create_dir_all(&args.state_dir).map_err(|source| DaemonError::Io {
        op: "create the state directory",
        path: args.state_dir.clone(),
        source,
    })?;
    let mut steps = StartSteps::new();
    vm::heal_at_start(&args).await;
    steps.lap("heal");
    // The two eBPF loads (the capture's and the guard's: each opens its
    // programs and maps from their pins when a previous agent of this
    // build left them, else reads the object, makes or opens its maps and
    // verifies its programs) run on blocking threads while the rest of the
    // start goes on.
    let guard_loading = start_guard(&args);
    let datapath_loading = start_datapath(&args, &metrics, &health);
    let store =
        lease::persist::open(&args.state_dir).map_err(|source| DaemonError::Store { source })?;
    steps.lap("store");
    let pod_api =
        PodApi::connect_with_kubeconfig(args.kube, args.kubeconfig.as_deref(), &args.state_dir)
            .await
            .and_then(|api| api.on_node(args.node_name.as_deref()))
            .map_err(|source| DaemonError::Kube { source })?;
    steps.lap("pod_api");
    let base = base_config(&args).await;
    steps.lap("node_networks");
    let (capture, started) = datapath_loading
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))?;
    steps.lap("datapath_wait");
    let capture = Arc::new(capture.with_uplinks(&args.uplinks));
    info!(datapath = capture.name(), note = capture.note().unwrap_or(""),
        pod_api = if pod_api.is_kube() { "kubernetes" } else { "embedded" },
        socket = %args.socket.display(), extra_sockets = ?args.extra_socket, state_dir = %args.state_dir.display(), "xdhcp agent starting");

    let token = CancellationToken::new();
    let svc = Arc::new(Services {
        metrics: metrics.clone(),
        capture: capture.clone(),
        store,
        token: token.clone(),
    });
    let args_guard = args.clone();
    let (node_ovs, node_pods, watch_pods) = node_sources(&args, &pod_api);
    let guard = guard_loaded(guard_loading).await?;
    steps.lap("guard_wait");
    let agent = Arc::new(Agent {
        base,
        args,
        health: health.clone(),
        pod_api,
        leases: Arc::new(Registry::new(svc.clone())),
        guard,
        pacing: pacing::Pacing::new(
            args_guard.acquisitions_per_network,
            args_guard.acquisition_slot_hold,
            svc.metrics.acquisitions_queued(),
        ),
        uplink_source: std::sync::Mutex::new(uplinks::source_at_start(&args_guard)),
        node_ovs,
        node_pods,
        svc,
    });

    let mut side = JoinSet::new();
    if let Some(started) = started {
        capture.spawn(started, &mut side, &token);
    }
    follow_node(&agent, &mut side, &token, watch_pods).await;
    health.set_datapath_ready();
    side.spawn(flush_stores(agent.clone(), token.clone()));
    side.spawn(status::export_metrics(agent.clone(), token.clone()));
    side.spawn(crate::ops::learn::learn_guests(
        agent.clone(),
        token.clone(),
    ));

    // The socket answers from here on; the records are resumed meanwhile.
    // An operation on an attachment whose record is being resumed waits
    // for that record (see `Registry::begin_recovery`); the rest go ahead.
    steps.lap("node_watch");
    agent.leases.begin_recovery();
    let mut servers = serve(listeners, &agent, &token);
    info!(
        ms = begun.elapsed().as_millis(),
        steps = %steps,
        "serving the agent socket; recovering the lease records"
    );
    recover_until_stopped(&agent, &capture, &token, &mut side, shutdown).await;
    stop(&agent, &capture, &token, &mut servers, &mut side).await
}

/// Stop: every lease persisted and kept (no RELEASE), the capture left
/// attached for the next agent, the sockets removed.
async fn stop(
    agent: &Arc<Agent>,
    capture: &Capture,
    token: &CancellationToken,
    servers: &mut JoinSet<io::Result<()>>,
    side: &mut JoinSet<()>,
) -> Result<(), DaemonError> {
    // The capture stays attached for the next agent (its links are pinned
    // where a bpffs allows): stopping leases let go of nothing.
    capture.keep_attached();
    token.cancel();
    let served = first_failure(servers).await;
    // Lease tasks persist and stop without RELEASE.
    agent.leases.drain(SHUTDOWN_GRACE).await;
    while let Some(r) = side.join_next().await {
        if let Err(e) = r
            && e.is_panic()
        {
            error!(error = %e, "an agent task panicked");
        }
    }
    let a = agent.clone();
    let _ = tokio::task::spawn_blocking(move || settle(&a)).await;
    socket::remove_unserved(std::iter::once(&agent.args.socket).chain(&agent.args.extra_socket));
    info!("stopped");
    served.map_err(|source| DaemonError::Serve { source })
}

/// The steps of a start, each one's time: logged when the socket serves.
struct StartSteps {
    last: std::time::Instant,
    done: Vec<(&'static str, Duration)>,
}

impl StartSteps {
    fn new() -> Self {
        Self {
            last: std::time::Instant::now(),
            done: Vec::new(),
        }
    }

    /// `step` ended now.
    fn lap(&mut self, step: &'static str) {
        let now = std::time::Instant::now();
        self.done.push((step, now - self.last));
        self.last = now;
    }
}

impl std::fmt::Display for StartSteps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (step, took)) in self.done.iter().enumerate() {
            let sep = if i == 0 { "" } else { " " };
            write!(f, "{sep}{step}={:.1}ms", took.as_secs_f64() * 1e3)?;
        }
        Ok(())
    }
}

/// The capture datapath being loaded (see [`choose_datapath`]), on a
/// blocking thread.
type DatapathLoading =
    tokio::task::JoinHandle<Result<(Capture, Option<capture::Started>), DaemonError>>;

fn start_datapath(
    args: &AgentArgs,
    metrics: &Arc<Metrics>,
    health: &Arc<Health>,
) -> DatapathLoading {
    let (args, metrics, health) = (args.clone(), metrics.clone(), health.clone());
    tokio::task::spawn_blocking(move || choose_datapath(&args, &metrics, &health))
}

/// The guard being loaded: its programs load (the verifier) on a blocking
/// thread while the capture datapath loads, not after it — the two are
/// independent, and each is most of a start that has them to load.
type GuardLoading =
    tokio::task::JoinHandle<Result<guard::GuardService, crate::bindings::StoreError>>;

fn start_guard(args: &AgentArgs) -> GuardLoading {
    let args = args.clone();
    tokio::task::spawn_blocking(move || guard::GuardService::start(&args))
}

async fn guard_loaded(loading: GuardLoading) -> Result<Arc<guard::GuardService>, DaemonError> {
    let loaded = loading
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    Ok(Arc::new(
        loaded.map_err(|source| DaemonError::Bindings { source })?,
    ))
}

/// Resume the records while the socket answers, then run until `shutdown`,
/// a cancellation, or a side task's end. Stopped while recovering, the
/// recovery stops too: what it had not resumed stays on disk, and its
/// attachment held (no operation makes a lease over it).
async fn recover_until_stopped(
    agent: &Arc<Agent>,
    capture: &Arc<Capture>,
    token: &CancellationToken,
    side: &mut JoinSet<()>,
    shutdown: impl Future<Output = ()>,
) {
    let recovery = agent.clone();
    let mut recovering = Some(tokio::spawn(async move {
        recover::recover(&recovery).await;
    }));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            done = async { recovering.as_mut().expect("guarded").await }, if recovering.is_some() => {
                recovering = None;
                if let Err(e) = done {
                    error!(error = %e, "lease recovery failed; stopping");
                    break;
                }
                recovered(agent, capture, token, side).await;
            }
            () = &mut shutdown => break,
            () = token.cancelled() => break,
            // A side task that ends before shutdown is a failure: say so, and
            // stop rather than run without it.
            ended = side.join_next() => {
                match ended {
                    Some(Err(e)) if e.is_panic() => error!(error = %e, "an agent task panicked; stopping"),
                    _ => error!("an agent task ended unexpectedly; stopping"),
                }
                break;
            }
        }
    }
    if let Some(r) = recovering.take() {
        r.abort();
        let _ = r.await;
    }
}

/// Recovery is over: the replies kept for adopted transactions go to
/// their leases, what the previous agent left and nobody claimed is
/// released in the background, and `/metrics` answers (its lease counts
/// are whole from now on).
async fn recovered(
    agent: &Arc<Agent>,
    capture: &Arc<Capture>,
    token: &CancellationToken,
    side: &mut JoinSet<()>,
) {
    capture.recovered();
    agent.health.set_recovered();
    // Short-lived: not a side task (those run for the agent's life).
    tokio::spawn(capture.clone().release_unclaimed(token.clone()));
    tokio::spawn(agent.guard.clone().release_unclaimed(token.clone()));
    if let Some(addr) = agent.args.metrics_addr {
        serve_metrics(addr, &agent.svc.metrics, &agent.health, token, side).await;
    }
    info!("ready");
}

/// The future that keeps the node's pod watch.
type PodWatch = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// What the agent reads about its node from start: its Open vSwitch (the
/// workload ports' guard, the uplinks and the ADDs that find their pod
/// there share the one watch) and, with the Kubernetes API, its pods (the
/// store, and the task that keeps it).
fn node_sources(
    args: &AgentArgs,
    pod_api: &PodApi,
) -> (
    tokio::sync::watch::Receiver<xdhcp_ovsdb::NodeState>,
    Option<crate::kube::node_pods::NodePods>,
    Option<PodWatch>,
) {
    let ovs = xdhcp_ovsdb::NodeWatch::spawn(&args.ovsdb, xdhcp_ovsdb::WatchOptions::default());
    let pods = match pod_api {
        PodApi::Kube(client) => crate::kube::node_pods::NodePods::follow(client),
        PodApi::Embedded(_) => None,
    };
    let (pods, watch) = pods.map(|(p, w)| (p, Box::pin(w) as PodWatch)).unzip();
    (ovs, pods, watch)
}

/// Follow the node's Open vSwitch (`--ovsdb`): its workload ports are
/// guarded from the moment they appear; without `--uplink`, the uplinks
/// are its too, and start-up waits a little for the first view, so
/// persisted leases resume on their uplink. And keep the node's pod watch
/// (`pods`) and the cluster's `DhcpGuardPolicy` objects, with the
/// Kubernetes API.
async fn follow_node(
    agent: &Arc<Agent>,
    side: &mut JoinSet<()>,
    token: &CancellationToken,
    pods: Option<PodWatch>,
) {
    if let Some(watch) = pods {
        side.spawn(futures::FutureExt::map(
            token.clone().run_until_cancelled_owned(watch),
            drop,
        ));
    }
    // The cluster's per-network guard settings, with the Kubernetes API
    // and the guard on.
    if let PodApi::Kube(client) = &agent.pod_api
        && agent.guard.is_on()
    {
        let (table, watch) = crate::kube::guard_policies::follow(client);
        side.spawn(futures::FutureExt::map(
            token.clone().run_until_cancelled_owned(watch),
            drop,
        ));
        side.spawn(workloads::follow_guard_policies(
            agent.clone(),
            table,
            token.clone(),
        ));
    }
    // The Linux bridges the guard serves: the ports enslaved to them are
    // made ready for it before their ADD. An uplink's bridge is served
    // from the start.
    if agent.guard.is_on() {
        for uplink in &agent.args.uplinks {
            agent.guard.serve_bridge_of(&uplink.ifname, None);
        }
        side.spawn(agent.guard.clone().prepare_ahead(token.clone()));
    }
    let ovs = agent.node_ovs.clone();
    side.spawn(workloads::follow_ports(
        agent.clone(),
        ovs.clone(),
        token.clone(),
    ));
    if agent.args.uplinks.is_empty() {
        let (first, heard) = tokio::sync::oneshot::channel();
        side.spawn(uplinks::follow_ovs(
            agent.clone(),
            ovs,
            token.clone(),
            first,
        ));
        let _ = tokio::time::timeout(uplinks::FIRST_VIEW_WAIT, heard).await;
    }
}

/// Serve `/metrics`, `/healthz` and `/readyz` on `addr` until `token` is
/// cancelled; an address that cannot be bound is logged and skipped.
async fn serve_metrics(
    addr: std::net::SocketAddr,
    metrics: &Arc<Metrics>,
    health: &Arc<Health>,
    token: &CancellationToken,
    side: &mut JoinSet<()>,
) {
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

/// Before exit: the lease records written for ADDs' answers and the
/// embedded pod store's last changes still wait for their barriers; and the stopped
/// leases' packet sockets are closing on the closer threads, many at once
/// (left to the exit, the kernel would close them one after another, a
/// grace period each).
fn settle(agent: &Agent) {
    flush_embedded(agent);
    // The records written for ADDs' answers, made durable before the exit.
    agent.svc.store.flush();
    if !link::wait_closed(SOCKET_CLOSE_GRACE) {
        warn!("packet sockets still closing at exit; the kernel finishes them");
    }
}

/// Serve the agent socket's routes on every listener until `token` is
/// cancelled.
fn serve(
    listeners: Vec<UnixListener>,
    agent: &Arc<Agent>,
    token: &CancellationToken,
) -> JoinSet<io::Result<()>> {
    let app = server::router(agent.clone());
    let limits = socket::Limits {
        allowed_uids: agent.args.socket_allow_uid.clone().into(),
        max_connections: agent.args.socket_max_connections,
    };
    let mut servers = JoinSet::new();
    for listener in listeners {
        let (app, t) = (app.clone(), token.clone());
        servers.spawn(socket::serve(listener, app, limits.clone(), t));
    }
    servers
}

/// Wait for every server; the first failure, if any.
async fn first_failure(servers: &mut JoinSet<io::Result<()>>) -> io::Result<()> {
    let mut served = Ok(());
    while let Some(r) = servers.join_next().await {
        let r = r.map_err(io::Error::other).and_then(|r| r);
        if served.is_ok() {
            served = r;
        }
    }
    served
}

/// Every `--uplink` names another interface.
fn check_uplinks(uplinks: &[crate::settings::Uplink]) -> Result<(), DaemonError> {
    for (i, u) in uplinks.iter().enumerate() {
        if uplinks[..i].iter().any(|v| v.ifname == u.ifname) {
            return Err(DaemonError::DuplicateUplink {
                ifname: u.ifname.clone(),
            });
        }
    }
    Ok(())
}

/// Top up the lease store's spare files (once it has been quiet, or its
/// pool is nearly empty) and group-commit the embedded pod store, off the
/// ADD path.
/// The first tick is at once: the store opens with no spare files.
async fn flush_stores(agent: Arc<Agent>, token: CancellationToken) {
    let mut tick = tokio::time::interval(STORE_FLUSH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = token.cancelled() => return,
            _ = tick.tick() => {}
        }
        let embedded = matches!(&agent.pod_api, PodApi::Embedded(s) if s.has_unsynced());
        let replenish = agent.svc.store.replenish_due(std::time::Instant::now());
        if replenish || embedded {
            let a = agent.clone();
            let _ = tokio::task::spawn_blocking(move || {
                if replenish {
                    a.svc.store.replenish();
                }
                flush_embedded(&a);
            })
            .await;
        }
    }
}

/// The embedded pod store's group commit (a no-op with a cluster).
fn flush_embedded(agent: &Agent) {
    if let PodApi::Embedded(s) = &agent.pod_api
        && let Err(e) = s.flush()
    {
        agent.metrics().failure("persist_flush");
        warn!(error = %crate::rpc::format_chain(&e), "could not make the embedded pod store durable; retrying");
    }
}

/// The capture actor for the flags: eBPF when it loads (or must), else
/// `AF_PACKET`.
fn choose_datapath(
    args: &AgentArgs,
    metrics: &Arc<Metrics>,
    health: &Arc<Health>,
) -> Result<(Capture, Option<capture::Started>), DaemonError> {
    check_uplinks(&args.uplinks)?;
    let attach = match args.attach {
        AttachChoice::Auto => None,
        AttachChoice::Tc => Some(AttachMode::Tc),
        AttachChoice::Xdp => Some(AttachMode::XdpNative),
        AttachChoice::XdpGeneric => Some(AttachMode::XdpGeneric),
    };
    let af_packet = |note: String| Capture::af_packet(Some(note), metrics.clone(), health.clone());
    match args.datapath {
        DatapathChoice::Afpacket => Ok((af_packet("--datapath=afpacket".into()), None)),
        DatapathChoice::Ebpf | DatapathChoice::Auto => match Datapath::load_pinned(&args.bpffs_dir)
        {
            Ok(dp) => {
                let (c, started) = Capture::ebpf(dp, attach, metrics.clone(), health.clone());
                Ok((c, Some(started)))
            }
            Err(source) if args.datapath == DatapathChoice::Ebpf => {
                Err(DaemonError::Ebpf { source })
            }
            Err(e) => {
                warn!(error = %crate::rpc::format_chain(&e), "eBPF datapath unavailable; using the AF_PACKET receiver");
                Ok((af_packet(format!("eBPF unavailable: {e}")), None))
            }
        },
    }
}

/// The engine configuration every lease starts from: the flags, and the
/// node's own networks and routes among the prefixes no lease may reroute
/// (read once at start; `--protect-prefix` adds what the node cannot see,
/// such as a service CIDR without a route of its own).
async fn base_config(args: &AgentArgs) -> xdhcp_engine::ClientConfig {
    let mut base = args.client_config();
    let node = async {
        crate::netlink::Netlink::open(None)
            .await?
            .prefixes_to_protect(None)
            .await
    };
    match node.await {
        Ok(prefixes) => {
            info!(
                count = prefixes.len(),
                "the node's networks are protected from lease routes"
            );
            base.route_policy.protected.extend(prefixes);
        }
        Err(e) => warn!(error = %crate::rpc::format_chain(&e),
            "could not read the node's networks; only --protect-prefix protects routes"),
    }
    base
}
