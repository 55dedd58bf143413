//! The soak: pods churned through the real CNI plugin against dnsmasq and
//! Kea at once, while a seeded chaos schedule kills, upgrades and starves
//! the agent, and an invariant checker ([`invariants`]) reads everything
//! that holds a lease and fails on what disagrees.
//!
//! The world:
//! - two networks, each a bridge `br0` in its own namespace with its
//!   server on it: `soak-dnsmasq` (198.18.0.0/22, dnsmasq) and `soak-kea`
//!   (198.19.0.0/22, Kea memfile); half the pods on each;
//! - every pod its own network namespace with a veth (`eth0`) on its
//!   network's bridge, IPv6 off; each new pod (incarnation) on a slot gets a
//!   fresh MAC, as a new sandbox's veth does, so a server lease names one
//!   incarnation;
//! - the `xdhcp agent` binary as a child process (`--kube on` against the
//!   in-process stand-in API server, [`crate::fake_apiserver`]), its state
//!   directory kept across restarts; every ADD and DEL is an exec of the
//!   thin plugin binary with `"apply": true`, so the agent configures the
//!   pod's address and writes the pod's `k8s.ovn.org/pod-networks` entry;
//! - churn: every `1 / churn_per_s` seconds a random pod slot is cycled:
//!   the live pod there is DEL'd (and its pod object deleted) and a new one
//!   `ADD`ed; an ADD that fails is DEL'd at once, as the kubelet does, and the
//!   slot is filled again by a later tick.
//!
//! Chaos ([`Step`], scheduled by [`schedule`] from the seed, each logged
//! with its time): SIGKILL and restart of the agent; a rolling upgrade
//! (SIGTERM, then the *other* build started on the same state: see
//! [`SoakConfig::upgrade_bin`]); a server restarted, or stopped past T2 and
//! started again; a live pod's namespace removed under its lease (the
//! runtime's DEL follows without a namespace); the stand-in API server
//! answering 409, 500 or nothing (a hold past the client's timeout) for a
//! while; forged DHCP replies (OFFER, ACK, NAK with foreign transaction ids,
//! from the real server's address, to the pods' MACs) flooded onto both
//! bridges. A new kind of step is one [`Step`] variant, its line in
//! [`Step::ALL`] and its arm in `World::apply`.
//!
//! Every `check_every` the churn and the chaos pause, in-flight operations
//! finish, the world settles (T1 and a margin: every lease renewed at least
//! once since the last disturbance), and the checker runs on snapshots
//! until one is clean or five in a row (3 s apart) agree on what is wrong:
//! only what stays wrong is a violation. A final check runs at the end.
//! Meanwhile the agent's RSS, open fds and tasks are sampled from `/proc`
//! every two seconds; [`invariants::growth`] fits them per process over its
//! settled samples and judges the processes that lived long enough.

pub mod invariants;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use invariants::{AgentLease, GonePod, GrowthLimits, LivePod, Sample, ServerLease, Snapshot};

use crate::fake_apiserver::{FakeApiServer, Fault, Op};
use crate::netns::{Lab, NetNs, Veth};
use crate::servers::{Dnsmasq, DnsmasqConfig, Kea, KeaConfig, Process, wait_until};
use crate::{CNI_PLUGIN_DIR, PluginCall, format_mac, progress};

/// The pods' Kubernetes namespace.
const POD_NS: &str = "soak";
const POD_NETWORKS: &str = "k8s.ovn.org/pod-networks";

/// One soak's parameters.
#[derive(Debug, Clone)]
pub struct SoakConfig {
    /// Pods alive at once (half on each network).
    pub pods: usize,
    /// Pod replacements (one DEL, one ADD) per second.
    pub churn_per_s: f64,
    /// Lease time in seconds (dnsmasq's minimum is 120).
    pub lease_secs: u32,
    /// T1: renewals every this many seconds.
    pub t1_secs: u32,
    /// T2 (the server outage step stops a server past it).
    pub t2_secs: u32,
    pub duration: Duration,
    pub seed: u64,
    /// Mean time between chaos steps.
    pub chaos_every: Duration,
    /// Time between invariant checks.
    pub check_every: Duration,
    /// How long after a DEL its server lease may remain.
    pub release_window: Duration,
    /// The agent binary.
    pub agent_bin: PathBuf,
    /// The second build the rolling upgrade switches to (and back from).
    /// `None`: a copy of `agent_bin` at another path — the same code from
    /// another file, which exercises the handover (a new process, new
    /// inode, the state and pins of the old one) but not a change of
    /// version: building a second agent with another version string costs
    /// a second full build of the agent, which `cargo xtask bench soak`
    /// leaves to whoever passes `--upgrade-bin`.
    pub upgrade_bin: Option<PathBuf>,
    /// The thin plugin binary (`xdhcp-plugin`).
    pub plugin_bin: PathBuf,
    /// Write the plots here (`soak-footprint.svg`, `soak-ops.svg`).
    pub plot_dir: Option<PathBuf>,
    pub growth: GrowthLimits,
}

impl SoakConfig {
    /// The short soak of `cargo xtask test`: 40 pods for 50 s, a chaos step
    /// every 4 s (every kind once).
    pub fn short(agent_bin: PathBuf, plugin_bin: PathBuf) -> Self {
        Self {
            pods: 40,
            churn_per_s: 2.0,
            lease_secs: 120,
            t1_secs: 4,
            t2_secs: 8,
            duration: Duration::from_secs(50),
            seed: 1,
            chaos_every: Duration::from_secs(4),
            check_every: Duration::from_secs(30),
            release_window: Duration::from_secs(10),
            agent_bin,
            upgrade_bin: None,
            plugin_bin,
            plot_dir: None,
            growth: GrowthLimits::default(),
        }
    }

    /// The bench's default: 500 pods for 30 minutes.
    pub fn long(agent_bin: PathBuf, plugin_bin: PathBuf) -> Self {
        Self {
            pods: 500,
            churn_per_s: 2.0,
            duration: Duration::from_mins(30),
            chaos_every: Duration::from_secs(20),
            check_every: Duration::from_mins(2),
            ..Self::short(agent_bin, plugin_bin)
        }
    }
}

/// The two networks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Net {
    Dnsmasq,
    Kea,
}

impl Net {
    pub fn name(self) -> &'static str {
        match self {
            Net::Dnsmasq => "soak-dnsmasq",
            Net::Kea => "soak-kea",
        }
    }

    fn index(self) -> usize {
        match self {
            Net::Dnsmasq => 0,
            Net::Kea => 1,
        }
    }
}

/// One chaos step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Step {
    /// SIGKILL the agent, start it again on its state.
    KillAgent,
    /// SIGTERM the agent, start the other build on its state.
    UpgradeAgent,
    /// Restart a server (its lease database kept).
    RestartServer(Net),
    /// Stop a server for T2 and three seconds, then start it again.
    ServerPastT2(Net),
    /// Remove a live pod's network namespace under its lease; the
    /// runtime's DEL follows two seconds later, without a namespace.
    RemoveNetns,
    /// The next pod writes answer 409 Conflict (a stale resourceVersion).
    ApiConflicts,
    /// The next pod reads and writes answer 500.
    ApiErrors,
    /// The next pod reads hang for 20 s (past the client's timeout).
    ApiTimeouts,
    /// Forged DHCP replies onto both bridges for five seconds.
    JunkFlood,
    /// A live pod's capture taken apart from outside, as an operator or
    /// another tool might: the agent's BPF links on its interface
    /// detached, its tc filters and a `clsact` qdisc deleted, the
    /// interface taken down and up.
    CaptureTakenApart,
}

impl Step {
    /// Every step, in the order a schedule's first round would take them
    /// unshuffled.
    pub const ALL: &'static [Step] = &[
        Step::KillAgent,
        Step::UpgradeAgent,
        Step::RestartServer(Net::Dnsmasq),
        Step::RestartServer(Net::Kea),
        Step::ServerPastT2(Net::Dnsmasq),
        Step::ServerPastT2(Net::Kea),
        Step::RemoveNetns,
        Step::ApiConflicts,
        Step::ApiErrors,
        Step::ApiTimeouts,
        Step::JunkFlood,
        Step::CaptureTakenApart,
    ];

    pub fn name(self) -> String {
        match self {
            Step::KillAgent => "SIGKILL agent".into(),
            Step::UpgradeAgent => "rolling upgrade".into(),
            Step::RestartServer(n) => format!("restart {}", n.name()),
            Step::ServerPastT2(n) => format!("{} down past T2", n.name()),
            Step::RemoveNetns => "pod netns removed".into(),
            Step::ApiConflicts => "API 409s".into(),
            Step::ApiErrors => "API 500s".into(),
            Step::ApiTimeouts => "API timeouts".into(),
            Step::JunkFlood => "junk DHCP flood".into(),
            Step::CaptureTakenApart => "capture taken apart".into(),
        }
    }
}

/// `SplitMix64`: the soak's one source of randomness, from its seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// The chaos schedule of a soak: a step every `every` (jittered by up to a
/// third either way) from `every` until `duration` less `every`, the steps
/// taken from seeded shuffles of [`Step::ALL`] one round after another, so
/// every kind comes once before any comes twice.
pub fn schedule(seed: u64, duration: Duration, every: Duration) -> Vec<(Duration, Step)> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    let mut round: Vec<Step> = Vec::new();
    let every_ms = u64::try_from(every.as_millis()).unwrap_or(u64::MAX).max(3);
    let mut at = every;
    while at + every <= duration {
        if round.is_empty() {
            round = Step::ALL.to_vec();
            // Fisher–Yates.
            for i in (1..round.len()).rev() {
                round.swap(i, rng.below(i + 1));
            }
        }
        out.push((at, round.remove(0)));
        let jitter = rng.next_u64() % (every_ms * 2 / 3);
        at += Duration::from_millis(every_ms - every_ms / 3 + jitter);
    }
    out
}

/// What a soak counted.
#[derive(Debug, Clone, Default)]
pub struct Counts {
    pub adds: u64,
    pub adds_failed: u64,
    pub dels: u64,
    pub dels_failed: u64,
    pub renewals: u64,
    pub agent_restarts: u64,
    pub upgrades: u64,
    pub checks: u64,
    /// Chaos steps survived, by kind.
    pub faults: BTreeMap<String, u64>,
    /// The first failed ADDs and DELs (what they said), for the report.
    pub failures: Vec<String>,
}

/// (time s, cumulative ADDs, DELs, renewals, live pods).
pub type OpsPoint = (f64, u64, u64, u64, usize);

/// A soak's outcome.
#[derive(Debug, Clone)]
pub struct SoakReport {
    pub config: SoakConfig,
    pub counts: Counts,
    /// Every violation found, with the soak time (s) of its check.
    pub violations: Vec<(f64, invariants::Violation)>,
    pub samples: Vec<Sample>,
    /// (time s, cumulative ADDs, DELs, renewals, live pods).
    pub ops: Vec<OpsPoint>,
    /// Every chaos step: time (s), what, how long it took.
    pub chaos_log: Vec<(f64, String, Duration)>,
    pub elapsed: Duration,
}

impl SoakReport {
    /// The report as Markdown: parameters, the table, the violations, the
    /// chaos log.
    pub fn markdown(&self) -> String {
        let c = &self.config;
        let n = &self.counts;
        let mut md = String::new();
        let _ = writeln!(
            md,
            "Parameters: {} pods (half on dnsmasq, half on Kea), churn {} pod replacements/s, \
             lease {} s, T1 {} s, T2 {} s, {} s, seed {}, a chaos step every ~{} s, checks every {} s, \
             release window {} s; upgrade build: {}.\n",
            c.pods,
            c.churn_per_s,
            c.lease_secs,
            c.t1_secs,
            c.t2_secs,
            c.duration.as_secs(),
            c.seed,
            c.chaos_every.as_secs(),
            c.check_every.as_secs(),
            c.release_window.as_secs(),
            c.upgrade_bin.as_ref().map_or_else(
                || "a copy of the same binary".to_owned(),
                |p| p.display().to_string()
            ),
        );
        let faults: u64 = n.faults.values().sum();
        let _ = writeln!(md, "| measure | count |\n|---|---|");
        for (what, v) in [
            ("ADDs answered", n.adds),
            (
                "ADDs failed (then DEL'd, as the kubelet does)",
                n.adds_failed,
            ),
            ("DELs", n.dels),
            ("DELs failed", n.dels_failed),
            (
                "renewals (agent counter, summed over its processes)",
                n.renewals,
            ),
            ("agent SIGKILLs and restarts", n.agent_restarts),
            ("rolling upgrades", n.upgrades),
            ("faults survived (all chaos steps)", faults),
            ("invariant checks", n.checks),
            ("violations", self.violations.len() as u64),
        ] {
            let _ = writeln!(md, "| {what} | {v} |");
        }
        let _ = writeln!(md, "\n| chaos step | times |\n|---|---|");
        for (k, v) in &n.faults {
            let _ = writeln!(md, "| {k} | {v} |");
        }
        if let Some(last) = self.samples.last() {
            let first = self.samples.first().unwrap_or(last);
            let _ = writeln!(
                md,
                "\nAgent footprint: first sample RSS {} KiB, {} fds, {} tasks; last {} KiB, {} fds, {} tasks.",
                first.rss_kib, first.fds, first.tasks, last.rss_kib, last.fds, last.tasks
            );
        }
        self.write_fits(&mut md);
        if self.violations.is_empty() {
            let _ = writeln!(md, "\nNo violation.");
        } else {
            let _ = writeln!(md, "\nViolations:\n");
            for (t, v) in &self.violations {
                let _ = writeln!(md, "- at {t:.0} s, {}: {v}", v.kind());
            }
        }
        if !n.failures.is_empty() {
            let _ = writeln!(md, "\nFirst failed operations:\n");
            for f in &n.failures {
                let _ = writeln!(md, "- {f}");
            }
        }
        let _ = writeln!(md, "\nChaos log:\n");
        for (t, what, took) in &self.chaos_log {
            let _ = writeln!(md, "- {t:7.1} s {what} ({:.1} s)", took.as_secs_f64());
        }
        md
    }

    /// The steady-state footprint fit of each agent process, as a table
    /// saying which window each was fitted over and whether it was judged.
    fn write_fits(&self, md: &mut String) {
        let c = &self.config;
        let fits = invariants::fits(&self.samples, c.pods, &c.growth);
        if fits.is_empty() {
            let _ = writeln!(
                md,
                "\nFootprint growth: no agent process had {} steady samples (after its warm-up, \
                 at {} pods, {:.0} s or more after a chaos step): nothing fitted, nothing judged.",
                c.growth.min_samples, c.pods, c.growth.settle_s
            );
            return;
        }
        let g = &c.growth;
        let _ = writeln!(
            md,
            "\nFootprint of each agent process in its steady state: its samples after {:.0} s of \
             warm-up, at {} pods, with no chaos step under way and every lease bound or renewing, \
             and {:.0} s or more after the last chaos step ended. The slope is Theil–Sen's (the \
             median of the slopes between every two samples: one shift of the level or a spike \
             does not make one). A process is judged only when its window spans {:.0} minutes or \
             more; growth is a slope above its limit **and** a rise over the window above \
             {:.0} KiB, {:.0} fds, {:.0} tasks:\n\n\
             | pid | window (s of the soak) | minutes | samples | judged | RSS KiB/min (limit {:.0}) | fds/min (limit {:.1}) | tasks/min (limit {:.1}) |\n\
             |---|---|---|---|---|---|---|---|",
            g.warmup_s,
            c.pods,
            g.settle_s,
            g.min_window_min,
            g.rss_kib.rise,
            g.fds.rise,
            g.tasks.rise,
            g.rss_kib.per_min,
            g.fds.per_min,
            g.tasks.per_min,
        );
        for f in &fits {
            let slope = |name: &str| {
                f.slopes
                    .iter()
                    .find(|(w, _, _)| *w == name)
                    .map_or_else(|| "—".to_owned(), |(_, v, _)| format!("{v:.2}"))
            };
            let _ = writeln!(
                md,
                "| {} | {:.0}–{:.0} | {:.1} | {} | {} | {} | {} | {} |",
                f.pid,
                f.from_s,
                f.to_s,
                f.span_min,
                f.samples,
                if f.judged {
                    "yes".to_owned()
                } else {
                    format!("no (under {:.0} min)", g.min_window_min)
                },
                slope("RSS (KiB)"),
                slope("open fds"),
                slope("tasks")
            );
        }
    }

    /// The two plots, when a directory is set: the footprint against time
    /// and the operations against time.
    pub fn plot(&self) -> Vec<PathBuf> {
        use crate::bench::{Series, plot_lines};
        let Some(dir) = &self.config.plot_dir else {
            return Vec::new();
        };
        #[expect(clippy::cast_precision_loss, reason = "KiB and counts far below 2^52")]
        let foot = [
            Series {
                label: "RSS (MiB)".into(),
                points: self
                    .samples
                    .iter()
                    .map(|s| (s.t_s, s.rss_kib as f64 / 1024.0))
                    .collect(),
            },
            Series {
                label: "open fds".into(),
                points: self.samples.iter().map(|s| (s.t_s, s.fds as f64)).collect(),
            },
            Series {
                label: "tasks".into(),
                points: self
                    .samples
                    .iter()
                    .map(|s| (s.t_s, s.tasks as f64))
                    .collect(),
            },
        ];
        #[expect(clippy::cast_precision_loss, reason = "counts far below 2^52")]
        let ops = [
            Series {
                label: "ADDs".into(),
                points: self.ops.iter().map(|o| (o.0, o.1 as f64)).collect(),
            },
            Series {
                label: "DELs".into(),
                points: self.ops.iter().map(|o| (o.0, o.2 as f64)).collect(),
            },
            Series {
                label: "renewals".into(),
                points: self.ops.iter().map(|o| (o.0, o.3 as f64)).collect(),
            },
            Series {
                label: "live pods".into(),
                points: self.ops.iter().map(|o| (o.0, o.4 as f64)).collect(),
            },
        ];
        let a = dir.join("soak-footprint.svg");
        let b = dir.join("soak-ops.svg");
        plot_lines(
            &a,
            "xdhcp agent under the soak",
            "seconds",
            "RSS MiB / fds / tasks",
            &foot,
        );
        plot_lines(&b, "Soak operations", "seconds", "count", &ops);
        vec![a, b]
    }
}

fn unix_ms() -> u64 {
    u64::try_from(crate::bench::unix_ms()).unwrap_or(u64::MAX)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A pod slot: a namespace and veth that successive pods use.
struct Slot {
    net: Net,
    idx: usize,
    generation: u32,
    /// Dropped before `ns`.
    veth: Option<Veth>,
    ns: Option<NetNs>,
    state: SlotState,
}

#[derive(Clone)]
enum SlotState {
    Idle,
    Busy,
    Live(LivePod),
}

/// The agent child process.
struct Agent {
    /// `None` only before the first start.
    process: Option<Process>,
    dir: PathBuf,
    socket: PathBuf,
    log: PathBuf,
    kubeconfig: PathBuf,
    metrics: std::net::SocketAddr,
    /// Which build runs: 0 the first, 1 the upgrade.
    build: usize,
    bins: [PathBuf; 2],
    /// Renewals counted by processes already gone.
    renewals_before: u64,
    /// The running process's last renewal count.
    renewals_now: u64,
}

impl Agent {
    fn spawn(&mut self) {
        let mut cmd = std::process::Command::new(&self.bins[self.build]);
        cmd.args(["agent", "--kube", "on", "--kubeconfig"])
            .arg(&self.kubeconfig)
            .args(["--node-name", crate::fake_apiserver::NODE, "--socket"])
            .arg(&self.socket)
            .arg("--state-dir")
            .arg(self.dir.join("state"))
            .arg("--bpffs-dir")
            .arg(self.dir.join("bpffs"))
            .arg("--ovsdb")
            .arg(self.dir.join("no-ovsdb.sock"))
            .arg("--metrics-addr")
            .arg(self.metrics.to_string())
            .env_remove("CNI_COMMAND")
            .env(
                "RUST_LOG",
                std::env::var("XDHCP_SOAK_RUST_LOG").unwrap_or_else(|_| "info".into()),
            );
        self.process = Some(Process::spawn_logged("xdhcp agent", cmd, &self.log));
        let client = xdhcp::rpc::Client::new(&self.socket, Duration::from_secs(5));
        let ready = wait_until(Duration::from_mins(1), || {
            client
                .get::<xdhcp::rpc::Readiness>(xdhcp::rpc::PATH_READY)
                .is_ok_and(|r| r.ready)
        });
        assert!(
            ready,
            "the agent did not become ready; log {}",
            self.log.display()
        );
    }

    fn pid(&self) -> Option<u32> {
        self.process.as_ref().and_then(Process::pid)
    }

    /// Reads the running process's renewal counter.
    fn poll_renewals(&mut self) {
        if let Some(text) = crate::bench::http_get(self.metrics, "/metrics") {
            let n = crate::bench::metric_count(&text, "xdhcp_renewals_total", "");
            self.renewals_now = self.renewals_now.max(n);
        }
    }

    fn renewals(&self) -> u64 {
        self.renewals_before + self.renewals_now
    }

    /// Before the process goes: keep its count.
    fn retire(&mut self) {
        self.poll_renewals();
        self.renewals_before += self.renewals_now;
        self.renewals_now = 0;
    }
}

struct Servers {
    dnsmasq: Dnsmasq,
    kea: Kea,
}

/// Everything the soak's threads share.
struct World {
    cfg: SoakConfig,
    labs: [Lab; 2],
    slots: Mutex<Vec<Slot>>,
    gone: Mutex<Vec<GonePod>>,
    counts: Mutex<Counts>,
    agent: Mutex<Agent>,
    servers: Mutex<Servers>,
    api: FakeApiServer,
    /// The agent's socket (the same across restarts).
    socket: PathBuf,
    /// Per network: how many times its server has gone down (stopped or
    /// restarted) so far, and whether it is down now.
    server_outages: [AtomicU64; 2],
    server_down: [AtomicBool; 2],
    /// Churn and chaos hold off while set.
    paused: AtomicBool,
    /// Churn operations and chaos steps under way.
    busy: AtomicUsize,
    stop: AtomicBool,
    started: Instant,
    /// When the last chaos step ended (`None`: none yet), and whether one
    /// is under way.
    chaos_ended: Mutex<Option<Instant>>,
    chaos_running: AtomicBool,
    next_mac: Mutex<u64>,
}

impl World {
    fn t(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Seconds since the last chaos step ended: 0 while one is under way,
    /// infinite before the first ([`Sample::since_chaos_s`]).
    fn since_chaos(&self) -> f64 {
        if self.chaos_running.load(Ordering::SeqCst) {
            return 0.0;
        }
        lock(&self.chaos_ended).map_or(f64::INFINITY, |t| t.elapsed().as_secs_f64())
    }

    /// The steady state: no chaos step under way, and every lease the
    /// agent holds bound or renewing (how long since the last step is
    /// [`World::since_chaos`], judged by the growth check). After a
    /// server's outage its leases stay in rebinding until their next
    /// retransmission (RFC 2131: half the time left, at least 60 s), each
    /// holding sockets of its own, so the agent's fds stand about one per
    /// such lease higher for a minute or more: not growth.
    fn quiet(&self) -> bool {
        if self.chaos_running.load(Ordering::SeqCst) {
            return false;
        }
        xdhcp::rpc::Client::new(&self.socket, Duration::from_secs(5))
            .get::<Vec<xdhcp::rpc::LeaseView>>(xdhcp::rpc::PATH_LEASES)
            .is_ok_and(|t| {
                t.iter()
                    .all(|l| l.state == "Bound" || l.state == "Renewing")
            })
    }

    fn lab(&self, net: Net) -> &Lab {
        &self.labs[net.index()]
    }

    fn fresh_mac(&self) -> [u8; 6] {
        let mut n = lock(&self.next_mac);
        *n += 1;
        let b = n.to_be_bytes();
        // Locally administered, unicast.
        [0x0a, 0x5a, b[4], b[5], b[6], b[7]]
    }

    /// A namespace and veth for `slot` (its generation in the port name).
    fn plumb(&self, net: Net, idx: usize, generation: u32) -> (NetNs, Veth) {
        let lab = self.lab(net);
        let ns = NetNs::new();
        ns.disable_ipv6();
        let port = format!("p{idx}g{generation}");
        let veth = Veth::new(&lab.server, &port, &ns, "eth0");
        lab.bridge.attach(&port);
        (ns, veth)
    }

    fn config(&self, net: Net) -> String {
        serde_json::json!({"cniVersion": "1.0.0", "name": net.name(), "type": "bridge",
            "ipam": {"type": "xdhcp", "socketPath": self.socket, "apply": true, "timeout": "20s"}})
        .to_string()
    }

    fn cni(
        &self,
        command: &str,
        net: Net,
        name: &str,
        uid: &str,
        netns: Option<&Path>,
    ) -> Result<serde_json::Value, String> {
        let config = self.config(net);
        let args = format!("K8S_POD_NAMESPACE={POD_NS};K8S_POD_NAME={name};K8S_POD_UID={uid}");
        let out = PluginCall {
            plugin: &self.cfg.plugin_bin,
            node_ns: None,
            command,
            container_id: name,
            netns,
            ifname: "eth0",
            cni_path: Path::new(CNI_PLUGIN_DIR),
            cni_args: &args,
            config: &config,
        }
        .run()
        .map_err(|e| format!("exec {}: {e}", self.cfg.plugin_bin.display()))?;
        if out.ok {
            Ok(out.json)
        } else {
            Err(format!("{command} {name}: {}", out.text()))
        }
    }

    fn failure(&self, what: &str) {
        let mut c = lock(&self.counts);
        if c.failures.len() < 20 {
            c.failures.push(format!("{:.1} s: {what}", self.t()));
        }
    }

    /// ADD a new pod on slot `i` (Busy, plumbed).
    fn add(&self, i: usize) {
        let (net, idx, generation, path) = {
            let s = &lock(&self.slots)[i];
            (
                s.net,
                s.idx,
                s.generation,
                s.ns.as_ref().map(|n| n.path().to_path_buf()),
            )
        };
        let Some(path) = path else {
            lock(&self.slots)[i].state = SlotState::Idle;
            return;
        };
        let mac = self.fresh_mac();
        let ns_name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let _ = crate::netns::output(std::process::Command::new(crate::program("ip")).args([
            "-n",
            &ns_name,
            "link",
            "set",
            "eth0",
            "address",
            &format_mac(mac),
        ]));
        let name = format!("{}-{idx}-{generation}-{:x}", net.name(), unix_ms());
        let uid = self.api.add_pod(POD_NS, &name, &[], &[]);
        let agent_before = self.agent_generation();
        let server_before = self.server_state(net);
        let answer = self.cni("ADD", net, &name, &uid, Some(&path));
        let answered = answer.as_ref().ok().and_then(|v| {
            v["ips"][0]["address"]
                .as_str()
                .and_then(|a| a.split('/').next())
                .and_then(|a| a.parse::<Ipv4Addr>().ok())
        });
        if let Some(ip) = answered {
            lock(&self.counts).adds += 1;
            lock(&self.slots)[i].state = SlotState::Live(LivePod {
                name,
                network: net.name().to_owned(),
                mac,
                answered: ip,
            });
        } else {
            lock(&self.counts).adds_failed += 1;
            self.failure(&match answer {
                Err(e) => e,
                Ok(v) => format!("ADD {name}: no address in {v}"),
            });
            // The kubelet tears a failed sandbox down with a DEL.
            self.del_until_done(net, &name, &uid, Some(&path));
            self.api.delete_pod(POD_NS, &name);
            // An exchange the agent's exit cut short may have left the
            // server a lease the agent never learned: it runs out
            // (docs/faults.md, "The agent killed"); any other failed
            // ADD's lease is released.
            let cut_short =
                self.agent_generation() != agent_before || self.server_missed(net, server_before);
            self.forget(&name, net, mac, self.release_by(cut_short));
            lock(&self.slots)[i].state = SlotState::Idle;
        }
    }

    fn release_by(&self, release_lost: bool) -> u64 {
        let window = u64::try_from(self.cfg.release_window.as_millis()).unwrap_or(u64::MAX);
        if release_lost {
            unix_ms() + u64::from(self.cfg.lease_secs) * 1000 + window
        } else {
            unix_ms() + window
        }
    }

    fn forget(&self, name: &str, net: Net, mac: [u8; 6], release_by_ms: u64) {
        lock(&self.gone).push(GonePod {
            name: name.to_owned(),
            network: net.name().to_owned(),
            mac,
            release_by_ms,
        });
    }

    /// DEL slot `i`'s live pod (the slot is Busy, its pod given).
    fn del(&self, i: usize, pod: &LivePod) {
        let (net, path) = {
            let s = &lock(&self.slots)[i];
            (s.net, s.ns.as_ref().map(|n| n.path().to_path_buf()))
        };
        let uid = self
            .api
            .pod(POD_NS, &pod.name)
            .and_then(|p| p["metadata"]["uid"].as_str().map(str::to_owned))
            .unwrap_or_default();
        let server_before = self.server_state(net);
        if self.del_until_done(net, &pod.name, &uid, path.as_deref()) {
            lock(&self.counts).dels += 1;
        }
        self.api.delete_pod(POD_NS, &pod.name);
        // The release window: 10 s, or the lease's own expiry when no
        // RELEASE could reach the server (the interface was gone, or the
        // server down).
        let lost = path.is_none() || self.server_missed(net, server_before);
        self.forget(&pod.name, net, pod.mac, self.release_by(lost));
    }

    fn server_going_down(&self, net: Net) {
        self.server_down[net.index()].store(true, Ordering::SeqCst);
        self.server_outages[net.index()].fetch_add(1, Ordering::SeqCst);
    }

    /// Where `net`'s server stands: (outages so far, down now).
    fn server_state(&self, net: Net) -> (u64, bool) {
        (
            self.server_outages[net.index()].load(Ordering::SeqCst),
            self.server_down[net.index()].load(Ordering::SeqCst),
        )
    }

    /// Whether `net`'s server may have missed what was sent between
    /// `before` (its [`World::server_state`] then) and now: it was down at
    /// either end, or went down in between. A RELEASE is never answered
    /// (RFC 2131), so one sent into an outage is lost and the lease runs
    /// out at the server instead.
    fn server_missed(&self, net: Net, before: (u64, bool)) -> bool {
        let now = self.server_state(net);
        before.1 || now.1 || now.0 != before.0
    }

    /// How many agent processes have started (restarts and upgrades).
    fn agent_generation(&self) -> u64 {
        let c = lock(&self.counts);
        c.agent_restarts + c.upgrades
    }

    /// DEL as a runtime does: again, 2 s apart, until it succeeds (an
    /// agent restarting refuses it for a moment), 15 times at most; false
    /// (counted, its error kept) when it never did.
    fn del_until_done(&self, net: Net, name: &str, uid: &str, netns: Option<&Path>) -> bool {
        let mut last = String::new();
        for attempt in 0..15 {
            if attempt > 0 {
                std::thread::sleep(Duration::from_secs(2));
            }
            match self.cni("DEL", net, name, uid, netns) {
                Ok(_) => return true,
                Err(e) => last = e,
            }
        }
        lock(&self.counts).dels_failed += 1;
        self.failure(&last);
        false
    }

    /// Takes a random slot that is not busy (idle ones first) and marks it
    /// busy; returns its index and what was on it.
    fn take_slot(&self, rng: &mut Rng) -> Option<(usize, SlotState)> {
        let mut slots = lock(&self.slots);
        let idle: Vec<usize> = (0..slots.len())
            .filter(|&i| matches!(slots[i].state, SlotState::Idle))
            .collect();
        let live: Vec<usize> = (0..slots.len())
            .filter(|&i| matches!(slots[i].state, SlotState::Live(_)))
            .collect();
        let i = if idle.is_empty() {
            if live.is_empty() {
                return None;
            }
            live[rng.below(live.len())]
        } else {
            idle[rng.below(idle.len())]
        };
        let was = std::mem::replace(&mut slots[i].state, SlotState::Busy);
        Some((i, was))
    }

    /// One churn operation on slot `i`: DEL what lives there, ADD anew.
    fn cycle(&self, i: usize, was: &SlotState) {
        if let SlotState::Live(p) = was {
            self.del(i, p);
        }
        self.add(i);
    }

    fn live(&self) -> Vec<LivePod> {
        lock(&self.slots)
            .iter()
            .filter_map(|s| match &s.state {
                SlotState::Live(p) => Some(p.clone()),
                _ => None,
            })
            .collect()
    }

    /// One chaos step.
    fn apply(&self, step: Step, rng: &mut Rng) {
        match step {
            Step::KillAgent => {
                let mut a = lock(&self.agent);
                a.retire();
                if let Some(p) = a.process.as_mut() {
                    p.kill();
                }
                a.spawn();
                drop(a);
                lock(&self.counts).agent_restarts += 1;
            }
            Step::UpgradeAgent => {
                let mut a = lock(&self.agent);
                a.retire();
                if let Some(p) = a.process.as_mut() {
                    p.stop(Duration::from_secs(10));
                }
                a.build = 1 - a.build;
                a.spawn();
                drop(a);
                lock(&self.counts).upgrades += 1;
            }
            Step::RestartServer(net) => {
                self.server_going_down(net);
                match net {
                    Net::Dnsmasq => lock(&self.servers).dnsmasq.restart(),
                    Net::Kea => lock(&self.servers).kea.restart(),
                }
                self.server_down[net.index()].store(false, Ordering::SeqCst);
            }
            Step::ServerPastT2(net) => {
                self.server_going_down(net);
                match net {
                    Net::Dnsmasq => lock(&self.servers).dnsmasq.stop(),
                    Net::Kea => lock(&self.servers).kea.stop(),
                }
                std::thread::sleep(Duration::from_secs(u64::from(self.cfg.t2_secs) + 3));
                match net {
                    Net::Dnsmasq => lock(&self.servers).dnsmasq.restart(),
                    Net::Kea => lock(&self.servers).kea.restart(),
                }
                self.server_down[net.index()].store(false, Ordering::SeqCst);
            }
            Step::RemoveNetns => self.remove_netns(rng),
            Step::ApiConflicts => {
                self.api
                    .inject_n(Op::PatchPod, &Fault::Status(409), self.api_fault_count());
            }
            Step::ApiErrors => {
                let n = self.api_fault_count();
                self.api.inject_n(Op::GetPod, &Fault::Status(500), n / 2);
                self.api.inject_n(Op::PatchPod, &Fault::Status(500), n / 2);
            }
            Step::ApiTimeouts => self.api.inject_n(
                Op::GetPod,
                &Fault::Delay(Duration::from_secs(20)),
                self.api_fault_count() / 2,
            ),
            Step::JunkFlood => self.flood(Duration::from_secs(5), rng),
            Step::CaptureTakenApart => self.take_capture_apart(rng),
        }
    }

    /// On a random live pod's interface (`eth0` in its namespace), from
    /// outside: the agent's BPF links detached, filters and a `clsact`
    /// qdisc deleted, the link down for half a second and up again. The
    /// slot is held busy meanwhile, so churn leaves the pod alone.
    fn take_capture_apart(&self, rng: &mut Rng) {
        let taken = {
            let mut slots = lock(&self.slots);
            let live: Vec<usize> = (0..slots.len())
                .filter(|&i| matches!(slots[i].state, SlotState::Live(_)) && slots[i].ns.is_some())
                .collect();
            if live.is_empty() {
                return;
            }
            let i = live[rng.below(live.len())];
            let was = std::mem::replace(&mut slots[i].state, SlotState::Busy);
            let path = slots[i].ns.as_ref().map(|ns| ns.path().to_path_buf());
            (i, was, path)
        };
        let (i, was, Some(path)) = taken else {
            return;
        };
        let ns = Some(path.as_path());
        crate::chaos::add_clsact(ns, "eth0");
        crate::chaos::detach_links(ns, "eth0");
        crate::chaos::delete_tc_filters(ns, "eth0");
        crate::chaos::delete_clsact(ns, "eth0");
        crate::chaos::flap(ns, "eth0", Duration::from_millis(500));
        lock(&self.slots)[i].state = was;
    }

    /// Faults per API step: a few seconds' worth of the churn's requests.
    fn api_fault_count(&self) -> usize {
        let n = (self.cfg.churn_per_s * 4.0).ceil() as usize;
        n.clamp(4, 40)
    }

    /// Removes a random live pod's namespace under its lease; the
    /// runtime's DEL (no namespace) follows; the slot is plumbed anew.
    fn remove_netns(&self, rng: &mut Rng) {
        let taken = {
            let mut slots = lock(&self.slots);
            let live: Vec<usize> = (0..slots.len())
                .filter(|&i| matches!(slots[i].state, SlotState::Live(_)))
                .collect();
            if live.is_empty() {
                None
            } else {
                let i = live[rng.below(live.len())];
                let was = std::mem::replace(&mut slots[i].state, SlotState::Busy);
                let veth = slots[i].veth.take();
                let ns = slots[i].ns.take();
                Some((i, was, veth, ns))
            }
        };
        let Some((i, SlotState::Live(pod), veth, ns)) = taken else {
            return;
        };
        drop(ns);
        drop(veth);
        std::thread::sleep(Duration::from_secs(2));
        self.del(i, &pod);
        let (net, idx, generation) = {
            let s = &lock(&self.slots)[i];
            (s.net, s.idx, s.generation + 1)
        };
        let (ns, veth) = self.plumb(net, idx, generation);
        let mut slots = lock(&self.slots);
        slots[i].generation = generation;
        slots[i].ns = Some(ns);
        slots[i].veth = Some(veth);
        slots[i].state = SlotState::Idle;
    }

    /// Forged replies onto both bridges for `how_long`, about 2000 frames/s
    /// each: OFFER, ACK and NAK from the real server's address with random
    /// transaction ids, to live pods' MACs.
    fn flood(&self, how_long: Duration, rng: &mut Rng) {
        let targets: Vec<LivePod> = self.live();
        if targets.is_empty() {
            return;
        }
        let seeds = [rng.next_u64(), rng.next_u64()];
        std::thread::scope(|s| {
            for (lab, seed) in self.labs.iter().zip(seeds) {
                let net = if lab.server_ip == self.labs[0].server_ip {
                    Net::Dnsmasq
                } else {
                    Net::Kea
                };
                let mine: Vec<[u8; 6]> = targets
                    .iter()
                    .filter(|p| p.network == net.name())
                    .map(|p| p.mac)
                    .collect();
                if mine.is_empty() {
                    continue;
                }
                let server_ip = lab.server_ip;
                let ifindex = lab.server.ifindex(Lab::BRIDGE);
                let fd = lab.server.packet_socket(ifindex, 0, None);
                s.spawn(move || junk(&fd, ifindex, server_ip, &mine, how_long, seed));
            }
        });
    }
}

/// Sends forged replies on `fd` for `how_long`.
fn junk(
    fd: &std::os::fd::OwnedFd,
    ifindex: u32,
    server: Ipv4Addr,
    macs: &[[u8; 6]],
    how_long: Duration,
    seed: u64,
) {
    use std::os::fd::AsRawFd as _;
    let mut rng = Rng::new(seed);
    let started = Instant::now();
    let mut n: u64 = 0;
    while started.elapsed() < how_long {
        let mac = macs[rng.below(macs.len())];
        let kind = [2u8, 5, 6][rng.below(3)];
        let xid = rng.next_u64() as u32;
        let o = server.octets();
        let yiaddr = Ipv4Addr::new(o[0], o[1], 1, 10 + (rng.next_u64() % 200) as u8);
        let frame = forged_reply(mac, server, yiaddr, xid, kind);
        // SAFETY: a sockaddr_ll for this socket's device, a buffer we own.
        unsafe {
            let mut sll: libc::sockaddr_ll = std::mem::zeroed();
            sll.sll_family = libc::AF_PACKET as u16;
            sll.sll_ifindex = i32::try_from(ifindex).unwrap_or(0);
            sll.sll_halen = 6;
            sll.sll_addr[..6].copy_from_slice(&mac);
            libc::sendto(
                fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                std::ptr::from_ref(&sll).cast(),
                u32::try_from(std::mem::size_of::<libc::sockaddr_ll>()).unwrap_or(0),
            );
        }
        n += 1;
        // About 2000 frames a second.
        if n.is_multiple_of(20) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// An Ethernet frame carrying a BOOTREPLY of DHCP message type `kind` to
/// `mac` (unicast frame, broadcast IP) from `server`, offering `yiaddr`,
/// with transaction id `xid`.
pub fn forged_reply(
    mac: [u8; 6],
    server: Ipv4Addr,
    yiaddr: Ipv4Addr,
    xid: u32,
    kind: u8,
) -> Vec<u8> {
    let reply = crate::frames::Reply {
        kind: dhcproto::v4::MessageType::from(kind),
        xid,
        chaddr: mac,
        yiaddr,
        server,
        mask: Ipv4Addr::new(255, 255, 252, 0),
    };
    crate::frames::server_reply(
        [0x0a, 0xba, 0xd0, 0, 0, 1],
        mac,
        Ipv4Addr::BROADCAST,
        &reply,
    )
}

/// The IPv4 addresses of a `pod-networks` annotation's entries.
pub fn annotation_addresses(text: &str) -> Vec<Ipv4Addr> {
    let Ok(serde_json::Value::Object(map)) = serde_json::from_str::<serde_json::Value>(text) else {
        return Vec::new();
    };
    map.values()
        .flat_map(|e| {
            e["ip_addresses"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
        })
        .filter_map(|a| a.as_str()?.split('/').next()?.parse().ok())
        .collect()
}

/// The lease records under `state_dir`: container id and address.
fn read_records(state_dir: &Path) -> Vec<AgentLease> {
    crate::agent::lease_record_files(state_dir)
        .iter()
        .filter_map(|p| std::fs::read(p).ok())
        .filter_map(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .filter_map(|v| {
            Some(AgentLease {
                container_id: v["containerId"].as_str()?.to_owned(),
                address: v["lease"]["address"].as_str().and_then(|a| a.parse().ok()),
            })
        })
        .collect()
}

impl World {
    /// Everything read now; `None` when the agent did not answer.
    fn snapshot(&self) -> Option<Snapshot> {
        let (bin, socket, dir) = {
            let a = lock(&self.agent);
            (a.bins[a.build].clone(), a.socket.clone(), a.dir.clone())
        };
        let live = self.live();
        let out = std::process::Command::new(&bin)
            .args(["leases", "--json", "--socket"])
            .arg(&socket)
            .env_remove("CNI_COMMAND")
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        let table: Vec<xdhcp::rpc::LeaseView> = serde_json::from_slice(&out.stdout).ok()?;
        let agent_leases = table
            .into_iter()
            .map(|l| AgentLease {
                container_id: l.container_id,
                address: l.address.map(|c| c.addr),
            })
            .collect();
        let agent_records = read_records(&dir.join("state"));
        let server = {
            let s = lock(&self.servers);
            let d = s.dnsmasq.leases();
            let k = s.kea.leases();
            d.into_iter()
                .map(|l| (Net::Dnsmasq, l))
                .chain(k.into_iter().map(|l| (Net::Kea, l)))
                .map(|(n, l)| ServerLease {
                    network: n.name().to_owned(),
                    mac: l.mac,
                    ip: l.ip,
                })
                .collect()
        };
        let mut annotations = BTreeMap::new();
        let mut configured = BTreeMap::new();
        {
            let slots = lock(&self.slots);
            for s in slots.iter() {
                if let (SlotState::Live(p), Some(ns)) = (&s.state, &s.ns) {
                    configured.insert(
                        p.name.clone(),
                        ns.ipv4_addrs("eth0").into_iter().map(|(a, _)| a).collect(),
                    );
                }
            }
        }
        for p in &live {
            if let Some(a) = self.api.annotation(POD_NS, &p.name, POD_NETWORKS) {
                annotations.insert(p.name.clone(), annotation_addresses(&a));
            }
        }
        Some(Snapshot {
            now_ms: unix_ms(),
            live,
            gone: lock(&self.gone).clone(),
            server,
            agent_leases,
            agent_records,
            annotations,
            configured,
        })
    }

    /// Waits for the churn and chaos to stop, lets the world settle, then
    /// checks until a snapshot is clean or five agree; returns what stayed
    /// wrong.
    fn check(&self) -> Vec<invariants::Violation> {
        self.paused.store(true, Ordering::SeqCst);
        let idle = wait_until(Duration::from_mins(2), || {
            self.busy.load(Ordering::SeqCst) == 0
        });
        if !idle {
            progress!("soak: operations still running after 120 s; checking anyway");
        }
        std::thread::sleep(Duration::from_secs(u64::from(self.cfg.t1_secs) + 3));
        let mut seen: Vec<Vec<invariants::Violation>> = Vec::new();
        let mut last = Vec::new();
        for attempt in 0..5 {
            if attempt > 0 {
                std::thread::sleep(Duration::from_secs(3));
            }
            let Some(snap) = self.snapshot() else {
                progress!("soak: the agent did not answer `xdhcp leases`; trying again");
                continue;
            };
            let v = invariants::check(&snap);
            if v.is_empty() {
                seen.clear();
                last.clear();
                break;
            }
            if !last.is_empty() {
                seen.push(std::mem::take(&mut last));
            }
            last = v;
        }
        lock(&self.counts).checks += 1;
        self.paused.store(false, Ordering::SeqCst);
        invariants::persistent(&seen, last)
    }
}

/// Counts the open fds of `pid`.
fn fd_count(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64)
}

/// Runs one soak.
///
/// # Panics
/// If the world cannot be built (namespaces, servers, the agent).
#[expect(clippy::too_many_lines, reason = "one soak: build, run, report")]
pub fn run(cfg: SoakConfig) -> SoakReport {
    crate::netns::sweep_leftovers();
    let dir = tempfile::Builder::new()
        .prefix("xdt-soak-")
        .tempdir()
        .expect("soak directory");
    progress!(
        "soak: {} pods, churn {}/s, lease {} s, T1 {} s, T2 {} s, {} s, seed {}",
        cfg.pods,
        cfg.churn_per_s,
        cfg.lease_secs,
        cfg.t1_secs,
        cfg.t2_secs,
        cfg.duration.as_secs(),
        cfg.seed
    );
    let lab_d = Lab::builder()
        .clients(0)
        .without_ipv6()
        .server_ip(Ipv4Addr::new(198, 18, 0, 1), 22)
        .build();
    let lab_k = Lab::builder()
        .clients(0)
        .without_ipv6()
        .server_ip(Ipv4Addr::new(198, 19, 0, 1), 22)
        .build();
    // A bridge without an address of its own set takes its lowest port's
    // MAC, so its MAC changes as pods' ports come and go; Kea's raw socket
    // keeps the MAC it read at start for its replies' source, and the
    // agent unicasts RENEW and RELEASE to that: once the bridge's MAC has
    // moved, they flood the ports and never reach Kea. A node's bridge
    // has a stable address; so do these.
    for (lab, mac) in [(&lab_d, "02:5a:0a:00:00:01"), (&lab_k, "02:5a:0a:00:00:02")] {
        lab.server.ip(&["link", "set", Lab::BRIDGE, "address", mac]);
    }
    let dnsmasq = Dnsmasq::start(
        &lab_d.server,
        DnsmasqConfig {
            range: (
                Ipv4Addr::new(198, 18, 0, 10),
                Ipv4Addr::new(198, 18, 3, 250),
            ),
            netmask: Ipv4Addr::new(255, 255, 252, 0),
            lease_secs: cfg.lease_secs,
            t1_secs: Some(cfg.t1_secs),
            t2_secs: Some(cfg.t2_secs),
            router: Some(Ipv4Addr::new(198, 18, 0, 1)),
            dns: vec![],
            on_tmpfs: true,
            extra_args: vec!["--dhcp-lease-max=4000".to_owned()],
            ..DnsmasqConfig::default()
        },
    );
    let kea = Kea::start(
        &lab_k.server,
        KeaConfig {
            subnet: "198.19.0.0/22".to_owned(),
            pool: (
                Ipv4Addr::new(198, 19, 0, 10),
                Ipv4Addr::new(198, 19, 3, 250),
            ),
            valid_lifetime: cfg.lease_secs,
            renew_timer: cfg.t1_secs,
            rebind_timer: cfg.t2_secs,
            router: Some(Ipv4Addr::new(198, 19, 0, 1)),
            dns: vec![],
            ..KeaConfig::default()
        },
    );
    let api_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("API server runtime");
    let api = api_rt.block_on(FakeApiServer::start());
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: fake\n\
             clusters:\n- name: fake\n  cluster:\n    server: {}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: nobody\n\
             users:\n- name: nobody\n  user: {{}}\n",
            api.url()
        ),
    )
    .expect("kubeconfig");
    let second = cfg.upgrade_bin.clone().unwrap_or_else(|| {
        let p = dir.path().join("xdhcp-second-build");
        std::fs::copy(&cfg.agent_bin, &p).expect("copy the agent binary");
        p
    });
    let log = std::env::var_os("XDHCP_SOAK_LOG")
        .map_or_else(|| dir.path().join("agent.log"), PathBuf::from);
    progress!("soak: agent log {}", log.display());
    let mut agent = Agent {
        process: None,
        dir: dir.path().to_path_buf(),
        socket: dir.path().join("run/xdhcp.sock"),
        log,
        kubeconfig,
        metrics: crate::bench::free_local_addr(),
        build: 0,
        bins: [cfg.agent_bin.clone(), second],
        renewals_before: 0,
        renewals_now: 0,
    };
    agent.spawn();
    let world = Arc::new(World {
        cfg: cfg.clone(),
        labs: [lab_d, lab_k],
        slots: Mutex::new(Vec::new()),
        gone: Mutex::new(Vec::new()),
        counts: Mutex::new(Counts::default()),
        agent: Mutex::new(agent),
        servers: Mutex::new(Servers { dnsmasq, kea }),
        api,
        socket: dir.path().join("run/xdhcp.sock"),
        server_outages: [AtomicU64::new(0), AtomicU64::new(0)],
        server_down: [AtomicBool::new(false), AtomicBool::new(false)],
        paused: AtomicBool::new(false),
        busy: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        started: Instant::now(),
        chaos_ended: Mutex::new(None),
        chaos_running: AtomicBool::new(false),
        next_mac: Mutex::new(0),
    });
    progress!("soak: plumbing {} pod namespaces…", cfg.pods);
    {
        let mut slots = Vec::with_capacity(cfg.pods);
        for i in 0..cfg.pods {
            let net = if i % 2 == 0 { Net::Dnsmasq } else { Net::Kea };
            let (ns, veth) = world.plumb(net, i, 0);
            slots.push(Slot {
                net,
                idx: i,
                generation: 0,
                veth: Some(veth),
                ns: Some(ns),
                state: SlotState::Idle,
            });
        }
        *lock(&world.slots) = slots;
    }
    progress!("soak: the first ADD of every pod…");
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= cfg.pods {
                        break;
                    }
                    lock(&world.slots)[i].state = SlotState::Busy;
                    world.add(i);
                }
            });
        }
    });
    let ramp_failed = lock(&world.counts).adds_failed;
    progress!(
        "soak: {} pods live ({} first ADDs failed); churn and chaos start",
        world.live().len(),
        ramp_failed
    );

    let started = Instant::now();
    let mut violations: Vec<(f64, invariants::Violation)> = Vec::new();
    let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
    let ops: Arc<Mutex<Vec<OpsPoint>>> = Arc::default();
    let chaos_log: Arc<Mutex<Vec<(f64, String, Duration)>>> = Arc::default();
    let plan = schedule(cfg.seed, cfg.duration, cfg.chaos_every);
    progress!(
        "soak: chaos schedule: {}",
        plan.iter()
            .map(|(t, s)| format!("{:.0}s {}", t.as_secs_f64(), s.name()))
            .collect::<Vec<_>>()
            .join(", ")
    );
    std::thread::scope(|s| {
        // Churn.
        let w = &world;
        s.spawn(move || {
            let mut rng = Rng::new(cfg.seed ^ 0xc4_u64);
            let period = Duration::from_secs_f64(1.0 / cfg.churn_per_s.max(0.01));
            let mut next = Instant::now();
            std::thread::scope(|ops| {
                while !w.stop.load(Ordering::SeqCst) {
                    next += period;
                    std::thread::sleep(next.saturating_duration_since(Instant::now()));
                    if w.paused.load(Ordering::SeqCst) {
                        next = Instant::now();
                        continue;
                    }
                    // At most 16 operations in flight.
                    if w.busy.load(Ordering::SeqCst) >= 16 {
                        continue;
                    }
                    let Some((i, was)) = w.take_slot(&mut rng) else {
                        continue;
                    };
                    w.busy.fetch_add(1, Ordering::SeqCst);
                    ops.spawn(move || {
                        w.cycle(i, &was);
                        w.busy.fetch_sub(1, Ordering::SeqCst);
                    });
                }
            });
        });
        // Chaos.
        let log = &chaos_log;
        let plan = &plan;
        s.spawn(move || {
            let mut rng = Rng::new(cfg.seed ^ 0xc7_u64);
            for &(at, step) in plan {
                while started.elapsed() < at && !w.stop.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(100));
                }
                while w.paused.load(Ordering::SeqCst) && !w.stop.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(100));
                }
                if w.stop.load(Ordering::SeqCst) {
                    break;
                }
                w.busy.fetch_add(1, Ordering::SeqCst);
                let t = w.t();
                progress!("soak: chaos at {t:.1} s: {}", step.name());
                let began = Instant::now();
                w.chaos_running.store(true, Ordering::SeqCst);
                w.apply(step, &mut rng);
                *lock(&w.chaos_ended) = Some(Instant::now());
                w.chaos_running.store(false, Ordering::SeqCst);
                let took = began.elapsed();
                w.busy.fetch_sub(1, Ordering::SeqCst);
                *lock(&w.counts).faults.entry(step.name()).or_default() += 1;
                lock(log).push((t, step.name(), took));
            }
        });
        // Samples and progress.
        let samples_ref = &samples;
        let ops_ref = &ops;
        s.spawn(move || {
            let mut last_line = Instant::now();
            while !w.stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_secs(2));
                let pid = {
                    let mut a = lock(&w.agent);
                    a.poll_renewals();
                    a.pid()
                };
                let live = w.live().len();
                let c = lock(&w.counts).clone();
                let renewals = lock(&w.agent).renewals();
                let t = w.t();
                lock(ops_ref).push((t, c.adds, c.dels, renewals, live));
                if let Some(pid) = pid {
                    let (rss, tasks) = crate::bench::footprint_of(pid);
                    if rss > 0 {
                        lock(samples_ref).push(Sample {
                            t_s: t,
                            pid,
                            rss_kib: rss,
                            fds: fd_count(pid),
                            tasks,
                            population: live,
                            quiet: w.quiet(),
                            since_chaos_s: w.since_chaos(),
                        });
                    }
                }
                if last_line.elapsed() >= Duration::from_secs(10) {
                    last_line = Instant::now();
                    let last = lock(samples_ref).last().copied();
                    progress!(
                        "soak: {t:.0} s: {live} live, {} ADDs ({} failed), {} DELs, {} renewals, {} restarts, {} upgrades, {} faults; agent {}",
                        c.adds,
                        c.adds_failed,
                        c.dels,
                        renewals,
                        c.agent_restarts,
                        c.upgrades,
                        c.faults.values().sum::<u64>(),
                        last.map_or_else(String::new, |s| format!(
                            "RSS {} KiB, {} fds, {} tasks",
                            s.rss_kib, s.fds, s.tasks
                        ))
                    );
                }
            }
        });
        // Checks, on this thread.
        let mut next_check = cfg.check_every;
        while started.elapsed() < cfg.duration {
            std::thread::sleep(Duration::from_millis(200));
            if started.elapsed() >= next_check
                && started.elapsed() + cfg.check_every / 2 < cfg.duration
            {
                next_check += cfg.check_every;
                let t = w.t();
                progress!("soak: checking the invariants at {t:.0} s…");
                let v = w.check();
                report_found(t, &v);
                violations.extend(v.into_iter().map(|v| (t, v)));
            }
        }
        w.stop.store(true, Ordering::SeqCst);
    });
    let t = world.t();
    progress!("soak: final check at {t:.0} s…");
    let v = world.check();
    report_found(t, &v);
    violations.extend(v.into_iter().map(|v| (t, v)));
    let samples = lock(&samples).clone();
    let steady = cfg.pods;
    for g in invariants::growth(&samples, steady, &cfg.growth) {
        violations.push((t, g));
    }
    {
        let mut a = lock(&world.agent);
        a.poll_renewals();
    }
    let mut counts = lock(&world.counts).clone();
    counts.renewals = lock(&world.agent).renewals();
    let report = SoakReport {
        config: cfg,
        counts,
        violations,
        samples,
        ops: lock(&ops).clone(),
        chaos_log: lock(&chaos_log).clone(),
        elapsed: started.elapsed(),
    };
    // The servers' logs, for a look at what they saw (`XDHCP_SOAK_SERVER_LOGS`).
    if let Some(d) = std::env::var_os("XDHCP_SOAK_SERVER_LOGS").map(PathBuf::from) {
        let s = lock(&world.servers);
        let _ = std::fs::create_dir_all(&d);
        let _ = std::fs::write(d.join("dnsmasq.log"), s.dnsmasq.log());
        let _ = std::fs::write(d.join("kea.log"), s.kea.log());
        let _ = std::fs::copy(s.dnsmasq.lease_file(), d.join("dnsmasq.leases"));
        let _ = std::fs::copy(s.kea.lease_file(), d.join("kea-leases4.csv"));
    }
    // Tear down: the agent first (its leases stay; the namespaces go).
    if let Some(p) = lock(&world.agent).process.as_mut() {
        p.stop(Duration::from_secs(10));
    }
    drop(world);
    drop(api_rt);
    report
}

fn report_found(t: f64, v: &[invariants::Violation]) {
    if v.is_empty() {
        progress!("soak: {t:.0} s: every invariant holds");
    }
    for x in v {
        progress!("soak: {t:.0} s: VIOLATION {}: {x}", x.kind());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_is_seeded_and_takes_every_step_before_repeating_one() {
        let a = schedule(7, Duration::from_mins(10), Duration::from_secs(10));
        assert_eq!(
            a,
            schedule(7, Duration::from_mins(10), Duration::from_secs(10))
        );
        assert_ne!(
            a,
            schedule(8, Duration::from_mins(10), Duration::from_secs(10))
        );
        let first: std::collections::BTreeSet<Step> =
            a.iter().take(Step::ALL.len()).map(|(_, s)| *s).collect();
        assert_eq!(first.len(), Step::ALL.len());
        assert!(a.windows(2).all(|w| w[0].0 < w[1].0));
        assert!(
            a.iter()
                .all(|(t, _)| *t + Duration::from_secs(10) <= Duration::from_mins(10))
        );
        assert!(schedule(1, Duration::from_secs(5), Duration::from_secs(10)).is_empty());
    }

    #[test]
    fn a_forged_reply_is_a_well_formed_bootreply() {
        let f = forged_reply(
            [2, 0, 0, 0, 0, 1],
            Ipv4Addr::new(198, 18, 0, 1),
            Ipv4Addr::new(198, 18, 1, 10),
            0xdead_beef,
            6,
        );
        assert_eq!(&f[..6], &[2, 0, 0, 0, 0, 1]);
        assert_eq!(&f[12..14], &[8, 0]);
        let ip = &f[14..34];
        let sum: u32 = ip
            .chunks(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
            .sum();
        assert_eq!((sum & 0xffff) + (sum >> 16), 0xffff, "IP checksum");
        let bootp = &f[42..];
        assert_eq!(bootp[0], 2);
        assert_eq!(&bootp[4..8], &0xdead_beef_u32.to_be_bytes());
        let m = <dhcproto::v4::Message as dhcproto::Decodable>::decode(
            &mut dhcproto::Decoder::new(bootp),
        )
        .expect("a DHCP message");
        assert_eq!(m.opts().msg_type(), Some(dhcproto::v4::MessageType::Nak));
    }

    #[test]
    fn annotation_addresses_are_read_from_every_entry() {
        let a = r#"{"soak/soak-kea":{"ip_addresses":["198.19.0.12/22"],"mac_address":"0a:5a:00:00:00:01","role":"secondary"},"default":{"ip_addresses":["10.0.0.5/24"]}}"#;
        let mut got = annotation_addresses(a);
        got.sort();
        assert_eq!(
            got,
            vec![Ipv4Addr::new(10, 0, 0, 5), Ipv4Addr::new(198, 19, 0, 12)]
        );
        assert!(annotation_addresses("not json").is_empty());
    }
}
