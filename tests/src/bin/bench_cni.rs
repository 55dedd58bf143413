//! `cargo xtask bench cni`: xdhcp side by side with the upstream CNI `dhcp`
//! plugin and daemon (Debian's containernetworking-plugins 1.1.1,
//! `/usr/lib/cni/dhcp`), in one run, in the harness anyone would build to
//! try it:
//!
//! - a node namespace holding a Linux bridge `br0`; dnsmasq (`--no-ping`,
//!   120 s leases) in a server namespace behind a veth whose bridge end is
//!   `up0`, its lease file on tmpfs (dnsmasq fsyncs it at every change,
//!   which on this shared VM's disk took 1–9 ms, varying with the other
//!   load: noise in every figure, floors included, that says nothing of
//!   either client); 100 pod namespaces, each with a veth on the bridge,
//!   created up front and reused by every phase (never made fresh between
//!   ADDs);
//! - a phase per configuration, each daemon started fresh for it: the
//!   upstream daemon (`dhcp daemon`); the xdhcp agent (`xdhcp agent
//!   --kube off`, in the node namespace) without an uplink, capturing on
//!   each pod's interface; and the same with `--uplink up0`, capturing at
//!   the bridge's port toward the server;
//! - every plugin exec'd as a runtime execs an IPAM plugin, with the
//!   upstream plugin's network config (`"type": "dhcp"`,
//!   `daemonSocketPath`) for both — xdhcp's thin plugin as the drop-in —
//!   timed as the wall time of the plugin process;
//! - the phases run twice, `tcpdump -i br0` off and then on
//!   (`XDHCP_BENCH_TCPDUMP=off|on|both`, default both);
//! - bursts of 1, 10, 25 and 100 concurrent ADDs, each run in rounds
//!   (20, 10, 6, 5; `XDHCP_BENCH_ROUNDS=n` makes it n for every size); each
//!   pod gets a DEL after its round (the plugin's DEL: both release the
//!   lease), so every round's ADDs start with no lease, from the same MACs;
//! - each round beside its floor, measured right after it in the same
//!   phase: the same number of concurrent execs of that plugin that do no
//!   DHCP (`CNI_COMMAND=VERSION`) plus the server's own exchanges — as many
//!   DORAs straight from this process over raw sockets in the same pods'
//!   namespaces (xdhcp's engine as the reference client: no CNI, no plugin,
//!   no agent), back to back (see [`raw_dora_burst`]);
//! - every figure as median and p99 over the rounds (with 5 rounds the p99
//!   is the slowest round), ÷ upstream and ÷ the floor, in `cni.md`;
//!   every round in `cni-rounds.md`; burst wall time against burst size on
//!   log axes in `cni-latency.svg`;
//! - where each ADD's time goes inside the agent: its own per-phase
//!   histograms (`xdhcp_add_phase_seconds`), read from its `/metrics`
//!   around each burst size's rounds, as the mean per ADD of each phase;
//! - the CPU the bursts took, from `/proc`: the daemon's per ADD and the
//!   machine's busy share.
//!
//! Then the 100-ADD burst against Kea (tcpdump off), the same way, and the
//! exec floor of three plugin binaries side by side (`cni-floor.md`). Daemon
//! RSS and threads at 0, 100 and 1000 leases (`cni-footprint.md`) only
//! with `XDHCP_BENCH_CNI=footprint` (or `all`): its lab of 1000 pods takes
//! about four minutes to build, use and remove on the development VM,
//! where the rest takes under five.
//!
//! Each phase starts with one unmeasured ADD and DEL (the first exec of a
//! binary may read it from disk). Nothing here asserts a timing.
//! `XDHCP_BENCH_CNI=harness|footprint|floor` runs parts;
//! `XDHCP_BENCH_ONLY=xdhcp|upstream` one implementation (no ratios to
//! upstream then); `XDHCP_BENCH_LOG_DIR` keeps the daemon logs (agent at
//! `XDHCP_BENCH_RUST_LOG`) and per-ADD timings there;
//! `XDHCP_BENCH_AGENT_ARGS` adds flags to the agent's command line;
//! `XDHCP_BENCH_SIZES=1,10` runs only those burst sizes;
//! `XDHCP_BENCH_SERVER_LEASES=disk` keeps dnsmasq's lease file on the disk.
//! Every namespace has a unique `xdt-<pid>-<n>` name and is removed, with the
//! processes in it, when the run ends or panics (and by the next run's sweep
//! if this one was killed); no interface is created in, nor touched of, the
//! host's namespace.
#![expect(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark report"
)]
#![expect(
    clippy::cast_precision_loss,
    reason = "counts and KiB figures far below 2^52 turned into ratios"
)]

use std::{
    fmt::Write as _,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use xdhcp_tests::{
    CNI_PLUGIN_DIR, PluginCall,
    bench::{Daemon, DaemonOptions, Impl, Series, impls, median_p99, upstream},
    cni_burst::{Burst, Leases, burst, cpu_cells, del_all, exec_floor, raw_dora_burst, settle},
    netns::{Lab, NetNs},
    progress,
    servers::{Dnsmasq, DnsmasqConfig, Kea, KeaConfig, Process},
};

/// Pod namespaces of the harness (the largest burst).
const CONCURRENT: usize = 100;
const BIG: usize = 1000;
/// (concurrent ADDs, rounds): a small burst is over in milliseconds and
/// one round says little, so the small ones get more rounds.
const BURSTS: &[(usize, usize)] = &[(1, 20), (10, 10), (25, 6), (100, 5)];
/// Rounds of the 100-ADD burst against Kea.
const KEA_ROUNDS: usize = 5;
/// Runs of the server's own exchanges per floor, the fastest taken.
const DORA_PASSES: usize = 3;
/// dnsmasq's lease time, its minimum.
const LEASE_SECS: u32 = 120;

/// How the IPAM daemon runs in a phase.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Config {
    /// The upstream `dhcp daemon`.
    Upstream,
    /// `xdhcp agent --kube off` in the node namespace, no uplink.
    NoUplink,
    /// The same with `--uplink up0`.
    Uplink,
}

impl Config {
    fn name(self) -> &'static str {
        match self {
            Config::Upstream => "upstream dhcp",
            Config::NoUplink => "xdhcp, no uplink",
            Config::Uplink => "xdhcp, --uplink up0",
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Config::Upstream => "up",
            Config::NoUplink => "xn",
            Config::Uplink => "xu",
        }
    }

    fn imp(self) -> Impl {
        match self {
            Config::Upstream => Impl::Upstream,
            Config::NoUplink | Config::Uplink => Impl::Xdhcp,
        }
    }

    /// The configurations `XDHCP_BENCH_ONLY` leaves, upstream first.
    fn all() -> Vec<Config> {
        let which = impls();
        [Config::Upstream, Config::NoUplink, Config::Uplink]
            .into_iter()
            .filter(|c| which.contains(&c.imp()))
            .collect()
    }
}

/// One round of a burst and its floor.
struct Round {
    burst: Burst,
    /// `n` concurrent plugin execs of `CNI_COMMAND=VERSION`.
    exec: Duration,
    /// `n` DORAs of the server's own, back to back (the fastest of
    /// [`DORA_PASSES`] runs).
    dora: Duration,
    dora_failed: usize,
}

impl Round {
    fn floor(&self) -> Duration {
        self.exec + self.dora
    }

    fn over_floor(&self) -> f64 {
        self.burst.wall.as_secs_f64() / self.floor().as_secs_f64().max(1e-9)
    }
}

/// What one phase measured: the rounds of each burst size.
struct Phase {
    server: &'static str,
    config: Config,
    tcpdump: bool,
    bursts: Vec<(usize, Vec<Round>)>,
    /// xdhcp only: per burst size, the agent's own mean time per ADD in
    /// each of its phases over that size's rounds (ms, in [`AGENT_PHASES`]
    /// order), and the mean of its whole ADD.
    inside: Vec<(usize, Inside)>,
}

/// The agent's phases of an ADD (`xdhcp_add_phase_seconds`), in order.
const AGENT_PHASES: [&str; 13] = xdhcp_tests::bench::ADD_PHASES;

/// Where an ADD's time went inside the agent over some rounds: the mean
/// per phase and of the whole ADD (ms), and how many ADDs it is over.
#[derive(Clone, Debug)]
struct Inside {
    phases: Vec<f64>,
    total: f64,
    adds: u64,
}

impl Inside {
    /// The mean per ADD of each phase between two scrapes of the agent's
    /// `/metrics` (`None` when either is missing or no ADD completed).
    fn between(before: Option<&str>, after: Option<&str>) -> Option<Self> {
        let (before, after) = (before?, after?);
        let delta = |name: &str, label: &str| {
            xdhcp_tests::bench::metric(after, name, label)
                - xdhcp_tests::bench::metric(before, name, label)
        };
        let count = |name: &str, label: &str| {
            xdhcp_tests::bench::metric_count(after, name, label)
                .saturating_sub(xdhcp_tests::bench::metric_count(before, name, label))
        };
        let adds = count("xdhcp_add_duration_seconds_count", "");
        if adds == 0 {
            return None;
        }
        let mean = |sum: f64, n: u64| if n == 0 { 0.0 } else { sum * 1000.0 / n as f64 };
        let phases = AGENT_PHASES
            .iter()
            .map(|p| {
                let label = format!("phase=\"{p}\"");
                mean(
                    delta("xdhcp_add_phase_seconds_sum", &label),
                    count("xdhcp_add_phase_seconds_count", &label),
                )
            })
            .collect();
        Some(Self {
            phases,
            total: mean(delta("xdhcp_add_duration_seconds_sum", ""), adds),
            adds,
        })
    }
}

impl Phase {
    fn rounds(&self, n: usize) -> Option<&[Round]> {
        self.bursts
            .iter()
            .find(|(m, r)| *m == n && !r.is_empty())
            .map(|(_, r)| r.as_slice())
    }
}

/// Median and p99 of `v` (sorted here).
/// Burst wall times of `rounds` in ms: (median, p99).
fn walls(rounds: &[Round]) -> (f64, f64) {
    median_p99(rounds.iter().map(|r| ms(r.burst.wall)).collect())
}

/// Per-ADD latency over every round's ADDs in ms: (median, p99).
fn per_add(rounds: &[Round]) -> (f64, f64) {
    median_p99(
        rounds
            .iter()
            .flat_map(|r| r.burst.lat.iter().map(|d| ms(*d)))
            .collect(),
    )
}

/// Floors of `rounds` in ms: (median, median exec part, median DORA part).
fn floors(rounds: &[Round]) -> (f64, f64, f64) {
    let m =
        |f: &dyn Fn(&Round) -> Duration| median_p99(rounds.iter().map(|r| ms(f(r))).collect()).0;
    (m(&Round::floor), m(&|r| r.exec), m(&|r| r.dora))
}

/// Each round's wall ÷ its own floor: (median, p99) over the rounds.
fn over_floor(rounds: &[Round]) -> (f64, f64) {
    median_p99(rounds.iter().map(Round::over_floor).collect())
}

/// `tcpdump -i <ifname>` in `ns`, printing every DHCP packet as a user
/// watching the bridge would (to a log here); stopped on drop.
struct Tcpdump {
    _process: Process,
}

impl Tcpdump {
    fn start(ns: &NetNs, ifname: &str) -> Self {
        let log = std::env::temp_dir().join(format!(
            "xdt-bench-tcpdump-{}-{}.log",
            std::process::id(),
            unix_ms()
        ));
        let mut cmd = ns.command("tcpdump");
        cmd.args(["-i", ifname, "-n", "-l", "port", "67", "or", "port", "68"]);
        let process = Process::spawn_logged("tcpdump", cmd, &log);
        // tcpdump says so on stderr once its socket is attached.
        let listening = xdhcp_tests::servers::wait_until(Duration::from_secs(10), || {
            std::fs::read_to_string(&log).is_ok_and(|t| t.contains("listening on"))
        });
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let _ = std::fs::remove_file(&log);
        assert!(listening, "tcpdump did not start on {ifname}: {text}");
        Self { _process: process }
    }
}

fn run_phase(
    lab: &Lab,
    xdhcp: &Path,
    (server, leases): (&'static str, Leases<'_>),
    config: Config,
    tcpdump: bool,
    bursts: &[(usize, usize)],
) -> Phase {
    let _dump = tcpdump.then(|| Tcpdump::start(&lab.server, Lab::BRIDGE));
    let mut opts = DaemonOptions {
        node_ns: Some(lab.server.name().to_owned()),
        upstream_dialect: true,
        ..DaemonOptions::default()
    };
    if config == Config::Uplink {
        opts.agent_args = vec!["--uplink".to_owned(), Lab::UPLINK.to_owned()];
    }
    // The agent's own phase timings, read from its /metrics in the node
    // namespace around each burst size's rounds.
    let metrics = (config != Config::Upstream).then(xdhcp_tests::bench::free_local_addr);
    opts.metrics = metrics;
    let scrape = || {
        metrics.and_then(|m| {
            lab.server
                .run_in(move || xdhcp_tests::bench::http_get(m, "/metrics"))
        })
    };
    if let Ok(extra) = std::env::var("XDHCP_BENCH_AGENT_ARGS") {
        opts.agent_args
            .extend(extra.split_whitespace().map(str::to_owned));
    }
    let d = Daemon::start_with(config.imp(), xdhcp, &opts);
    // Unmeasured, for every configuration alike: the first exec of a freshly
    // built binary may read it from disk.
    let first = &lab.clients[0];
    if let Err(e) = d.cni("ADD", "warmup", first) {
        eprintln!("  warm-up ADD failed: {e}");
    }
    let _ = d.cni("DEL", "warmup", first);
    settle(leases, std::slice::from_ref(first));
    let mut out = Vec::new();
    let mut inside = Vec::new();
    for &(n, rounds) in bursts {
        let clients = &lab.clients[..n];
        let mut set = Vec::with_capacity(rounds);
        let before = scrape();
        for r in 0..rounds {
            let tag = format!("{}-{}-{n}-{r}", config.tag(), u8::from(tcpdump));
            let burst = burst(&d, clients, &tag);
            if let Some(e) = &burst.first_error {
                eprintln!("  {} of {n} ADDs failed, first: {e}", burst.failed);
            }
            del_all(&d, clients, &tag);
            settle(leases, clients);
            let exec = exec_floor(&d, clients);
            let (dora, dora_failed) = raw_dora_burst(clients, leases, DORA_PASSES);
            set.push(Round {
                burst,
                exec,
                dora,
                dora_failed,
            });
        }
        if let Some(i) = Inside::between(before.as_deref(), scrape().as_deref()) {
            inside.push((n, i));
        }
        let (w50, w99) = walls(&set);
        let (f50, _, _) = floors(&set);
        let (o50, o99) = over_floor(&set);
        progress!(
            "{server}, {}, tcpdump {}: {n} ADDs × {rounds}: wall {w50:.1} / {w99:.1} ms (median / p99), floor {f50:.1} ms, ÷ floor {o50:.2} / {o99:.2}",
            config.name(),
            if tcpdump { "on" } else { "off" },
        );
        out.push((n, set));
    }
    Phase {
        server,
        config,
        tcpdump,
        bursts: out,
        inside,
    }
}

/// The burst sizes and their rounds (`XDHCP_BENCH_ROUNDS=n`: n each;
/// `XDHCP_BENCH_SIZES=1,10`: only those sizes).
fn burst_plan() -> Vec<(usize, usize)> {
    let sizes: Option<Vec<usize>> = std::env::var("XDHCP_BENCH_SIZES").ok().map(|v| {
        v.split(',')
            .map(|n| {
                n.trim().parse().unwrap_or_else(|_| {
                    panic!("XDHCP_BENCH_SIZES: burst sizes like 1,10, not {v:?}")
                })
            })
            .collect()
    });
    let rounds = std::env::var("XDHCP_BENCH_ROUNDS").ok().map(|v| {
        v.parse::<usize>()
            .ok()
            .filter(|&n| n > 0)
            .unwrap_or_else(|| panic!("XDHCP_BENCH_ROUNDS: a positive count, not {v:?}"))
    });
    BURSTS
        .iter()
        .filter(|(n, _)| sizes.as_ref().is_none_or(|s| s.contains(n)))
        .map(|&(n, r)| (n, rounds.unwrap_or(r)))
        .collect()
}

/// `XDHCP_BENCH_SERVER_LEASES=tmpfs|disk` (default tmpfs): where dnsmasq
/// keeps its lease file. On the disk, as a harness of one's own has it,
/// dnsmasq's `fsync` before every ACK (one ACK at a time) is most of a
/// burst's time on this VM.
fn server_leases_on_tmpfs() -> bool {
    match std::env::var("XDHCP_BENCH_SERVER_LEASES").as_deref() {
        Err(_) | Ok("tmpfs") => true,
        Ok("disk") => false,
        Ok(other) => panic!("XDHCP_BENCH_SERVER_LEASES: expected tmpfs or disk, not {other:?}"),
    }
}

/// `XDHCP_BENCH_TCPDUMP=off|on|both` (default both): the tcpdump settings
/// to run the phases with, off first.
fn tcpdump_plan() -> Vec<bool> {
    match std::env::var("XDHCP_BENCH_TCPDUMP").as_deref() {
        Err(_) | Ok("both") => vec![false, true],
        Ok("off") => vec![false],
        Ok("on") => vec![true],
        Ok(other) => panic!("XDHCP_BENCH_TCPDUMP: expected off, on or both, not {other:?}"),
    }
}

/// The harness: every configuration, tcpdump off and on, against dnsmasq;
/// then the 100-ADD burst against Kea.
fn harness(xdhcp: &Path) -> Vec<Phase> {
    progress!(
        "building the harness: node namespace, bridge, server namespace, {CONCURRENT} pod namespaces…"
    );
    let lab = Lab::builder()
        .clients(CONCURRENT)
        .server_behind_uplink()
        .build();
    let plan = burst_plan();
    let mut phases = Vec::new();
    {
        let dnsmasq = Dnsmasq::start(
            lab.dhcp_ns(),
            DnsmasqConfig {
                interface: lab.dhcp_ifname().to_owned(),
                on_tmpfs: server_leases_on_tmpfs(),
                ..dnsmasq_config(
                    (Ipv4Addr::new(192, 0, 2, 10), Ipv4Addr::new(192, 0, 2, 250)),
                    Ipv4Addr::new(255, 255, 255, 0),
                    LEASE_SECS,
                )
            },
        );
        for tcpdump in tcpdump_plan() {
            for config in Config::all() {
                progress!(
                    "phase: {}, tcpdump {}…",
                    config.name(),
                    if tcpdump { "on" } else { "off" }
                );
                phases.push(run_phase(
                    &lab,
                    xdhcp,
                    ("dnsmasq --no-ping", &|| dnsmasq.leases()),
                    config,
                    tcpdump,
                    &plan,
                ));
            }
        }
    }
    if plan.iter().all(|&(n, _)| n != CONCURRENT) {
        return phases;
    }
    let kea = Kea::start(
        lab.dhcp_ns(),
        KeaConfig {
            interface: lab.dhcp_ifname().to_owned(),
            pool: (Ipv4Addr::new(192, 0, 2, 10), Ipv4Addr::new(192, 0, 2, 250)),
            valid_lifetime: 3600,
            renew_timer: 1800,
            rebind_timer: 3000,
            ..KeaConfig::default()
        },
    );
    let kea_rounds = plan.last().map_or(KEA_ROUNDS, |&(_, r)| r.min(KEA_ROUNDS));
    for config in Config::all() {
        progress!("phase: Kea, {}…", config.name());
        phases.push(run_phase(
            &lab,
            xdhcp,
            ("Kea", &|| kea.leases()),
            config,
            false,
            &[(CONCURRENT, kea_rounds)],
        ));
    }
    phases
}

fn unix_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn dnsmasq_config(
    prefix: (Ipv4Addr, Ipv4Addr),
    netmask: Ipv4Addr,
    lease_secs: u32,
) -> DnsmasqConfig {
    DnsmasqConfig {
        range: prefix,
        netmask,
        lease_secs,
        no_ping: true,
        extra_args: vec!["--dhcp-lease-max=4000".to_owned()],
        ..DnsmasqConfig::default()
    }
}

/// (implementation, (RSS KiB, threads) at 0 / 100 / 1000 leases, ADD failures,
/// leases actually held at the 1000 point).
type Footprint = (Impl, [(u64, u64); 3], usize, usize);

struct Row {
    what: String,
    upstream: String,
    xdhcp: String,
    ratio: String,
}

impl Row {
    /// A row from what each implementation measured; a side not measured
    /// (`XDHCP_BENCH_ONLY`) shows "–" and the row has no ratio.
    fn new<T: Copy>(
        what: String,
        (upstream, xdhcp): (Option<T>, Option<T>),
        show: impl Fn(T) -> String,
        ratio: impl FnOnce(T, T) -> String,
    ) -> Self {
        let cell = |v: Option<T>| v.map_or_else(|| "–".to_owned(), &show);
        Row {
            what,
            upstream: cell(upstream),
            xdhcp: cell(xdhcp),
            ratio: match (upstream, xdhcp) {
                (Some(u), Some(x)) => ratio(u, x),
                _ => String::new(),
            },
        }
    }
}

fn main() {
    let started = Instant::now();
    let xdhcp = PathBuf::from(
        std::env::var_os("XDHCP_BIN")
            .expect("XDHCP_BIN: path of the release xdhcp binary (cargo xtask bench sets it)"),
    );
    // Panics with what to install when the plugin is missing.
    let _ = upstream();
    xdhcp_tests::netns::sweep_leftovers();
    let parts = Parts::from_env();
    let load_before = load_average();
    if parts.harness {
        let phases = harness(&xdhcp);
        report(&phases, &load_before, started.elapsed());
    }
    if parts.footprint {
        let mut rows: Vec<Row> = Vec::new();
        footprint(&xdhcp, &mut rows);
        footprint_report(&rows);
    }
    if parts.floor {
        let thin = PathBuf::from(std::env::var_os("XDHCP_PLUGIN_BIN").expect(
            "XDHCP_PLUGIN_BIN: path of the release thin plugin binary (cargo xtask bench sets it)",
        ));
        exec_floors(&xdhcp, &thin);
    }
    progress!("bench_cni done in {:.0} s", started.elapsed().as_secs_f64());
}

/// The 1, 5 and 15 minute load averages, as `/proc/loadavg` has them.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg").map_or_else(
        |_| "unknown".to_owned(),
        |t| t.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
    )
}

/// Which sections to run: `XDHCP_BENCH_CNI=harness,footprint,floor`, or
/// `all`; by default the harness and the exec floor. The footprint (a lab
/// of 1000 pods, about four minutes here) only when asked for.
struct Parts {
    harness: bool,
    footprint: bool,
    floor: bool,
}

impl Parts {
    fn from_env() -> Self {
        let Some(v) = std::env::var_os("XDHCP_BENCH_CNI") else {
            return Self {
                harness: true,
                footprint: false,
                floor: true,
            };
        };
        let v = v.to_string_lossy().into_owned();
        let mut parts = Self {
            harness: false,
            footprint: false,
            floor: false,
        };
        for p in v.split(',').map(str::trim) {
            match p {
                "harness" => parts.harness = true,
                "footprint" => parts.footprint = true,
                "floor" => parts.floor = true,
                "all" => {
                    parts.harness = true;
                    parts.footprint = true;
                    parts.floor = true;
                }
                other => panic!(
                    "XDHCP_BENCH_CNI: unknown part {other:?} (expected harness, footprint, floor or all)"
                ),
            }
        }
        parts
    }
}

/// Daemon RSS and threads at 0, 100 and 1000 leases (dnsmasq, a /22 so 1000 fit).
fn footprint(xdhcp: &Path, rows: &mut Vec<Row>) {
    progress!("building a lab with {BIG} pod interfaces (takes a while)…");
    let big = Lab::builder()
        .server_ip(Ipv4Addr::new(198, 18, 0, 1), 22)
        .clients(BIG)
        .build();
    let mut foot: Vec<Footprint> = Vec::new();
    for which in impls() {
        // A fresh server (empty lease database) per implementation: leases
        // the first one leaves behind (its daemon is stopped holding the
        // last 100) must not shrink the second one's pool.
        let _server = Dnsmasq::start(
            &big.server,
            DnsmasqConfig {
                router: Some(Ipv4Addr::new(198, 18, 0, 1)),
                dns: vec![],
                ..dnsmasq_config(
                    (
                        Ipv4Addr::new(198, 18, 0, 10),
                        Ipv4Addr::new(198, 18, 3, 250),
                    ),
                    Ipv4Addr::new(255, 255, 252, 0),
                    3600,
                )
            },
        );
        let d = Daemon::start(which, xdhcp);
        std::thread::sleep(Duration::from_millis(500));
        let at0 = d.footprint();
        let mut failed = 0;
        for (chunk_no, chunk) in big.clients.chunks(CONCURRENT).enumerate() {
            let b = burst(&d, chunk, &format!("big{chunk_no}"));
            failed += b.failed;
            if let Some(e) = &b.first_error {
                eprintln!(
                    "  chunk {chunk_no}: {} failed ({:.2} s), first: {e}",
                    b.failed,
                    b.wall.as_secs_f64()
                );
            }
            if chunk_no == 0 {
                std::thread::sleep(Duration::from_millis(500));
            }
        }
        let held_big = BIG - failed;
        std::thread::sleep(Duration::from_millis(500));
        let at_big = d.footprint();
        // The 100-lease point: measured on a fresh daemon so it is not a
        // high-water mark of the 1000-lease run.
        for (chunk_no, chunk) in big.clients.chunks(CONCURRENT).enumerate() {
            del_all(&d, chunk, &format!("big{chunk_no}"));
        }
        drop(d);
        let d = Daemon::start(which, xdhcp);
        let b = burst(&d, &big.clients[..CONCURRENT], "mid");
        failed += b.failed;
        std::thread::sleep(Duration::from_millis(500));
        let at100 = d.footprint();
        del_all(&d, &big.clients[..CONCURRENT], "mid");
        progress!(
            "{}: footprint {at0:?} {at100:?} {at_big:?}, failures {failed}",
            which.name()
        );
        foot.push((which, [at0, at100, at_big], failed, held_big));
    }
    let fp = |w: Impl| {
        foot.iter()
            .find(|(x, _, _, _)| *x == w)
            .map(|(_, f, e, h)| (*f, *e, *h))
    };
    let both = (fp(Impl::Upstream), fp(Impl::Xdhcp));
    for (i, n) in [0, CONCURRENT, BIG].into_iter().enumerate() {
        rows.push(Row::new(
            format!("daemon RSS (KiB) / threads at {n} leases"),
            both,
            |(f, _, _)| format!("{} / {}", f[i].0, f[i].1),
            |(u, _, _), (x, _, _)| {
                format!("{:.2}× the memory", x[i].0 as f64 / u[i].0.max(1) as f64)
            },
        ));
    }
    // Divide by the leases really held at the big point, not by the target.
    let per_lease = |(f, _, held): ([(u64, u64); 3], usize, usize)| {
        (f[2].0.saturating_sub(f[0].0)) as f64 / held.max(1) as f64
    };
    rows.push(Row::new(
        format!("RSS per lease (KiB, (RSS@{BIG} − RSS@0) / leases held)"),
        both,
        |f| format!("{:.1} ({} held)", per_lease(f), f.2),
        |u, x| format!("{:.2}×", per_lease(x) / per_lease(u).max(1e-9)),
    ));
    rows.push(Row::new(
        format!(
            "ADD failures in the footprint runs (of {})",
            BIG + CONCURRENT
        ),
        both,
        |(_, failed, _)| failed.to_string(),
        |_, _| String::new(),
    ));
}

/// `x` against `base`: "N× faster" or "N× slower".
fn speedup(base: Duration, x: Duration) -> String {
    let (b, x) = (base.as_secs_f64(), x.as_secs_f64().max(1e-9));
    if b >= x {
        format!("{:.1}× faster", b / x)
    } else {
        format!("{:.1}× slower", x / b.max(1e-9))
    }
}

/// Rounds of the exec-floor comparison; the median round is reported.
const FLOOR_ROUNDS: usize = 9;

/// The exec floor of three plugin binaries, side by side: `CONCURRENT`
/// concurrent execs of `CNI_COMMAND=VERSION` (no daemon needed), the three
/// interleaved round by round so load on the machine hits them alike.
/// Each binary is exec'd once, unmeasured, before the first round, so
/// none is read from disk while measured.
fn exec_floors(full: &Path, thin: &Path) {
    let binaries = [
        ("upstream dhcp", upstream().to_path_buf()),
        ("xdhcp, full agent binary", full.to_path_buf()),
        ("xdhcp, thin plugin binary", thin.to_path_buf()),
    ];
    let config =
        r#"{"cniVersion":"1.0.0","name":"benchnet","type":"macvlan","ipam":{"type":"dhcp"}}"#;
    let call = |plugin: &Path, i: usize| {
        let id = format!("floor-{i}");
        let out = PluginCall {
            plugin,
            node_ns: None,
            command: "VERSION",
            container_id: &id,
            netns: None,
            ifname: "eth0",
            cni_path: Path::new(CNI_PLUGIN_DIR),
            cni_args: "",
            config,
        }
        .run()
        .unwrap_or_else(|e| panic!("exec {}: {e}", plugin.display()));
        assert!(out.ok, "{} VERSION: {}", plugin.display(), out.text());
        out.json
    };
    for (name, bin) in &binaries {
        let v = call(bin, 0);
        println!("{name} ({}): VERSION {v}", bin.display());
    }
    let mut walls: Vec<Vec<Duration>> = vec![Vec::new(); binaries.len()];
    for round in 0..FLOOR_ROUNDS {
        for (k, (name, bin)) in binaries.iter().enumerate() {
            let started = Instant::now();
            std::thread::scope(|s| {
                for i in 0..CONCURRENT {
                    let call = &call;
                    s.spawn(move || call(bin, i));
                }
            });
            let wall = started.elapsed();
            println!(
                "round {round}: {name}: {CONCURRENT} execs in {:.3} s",
                wall.as_secs_f64()
            );
            walls[k].push(wall);
        }
    }
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let medians: Vec<Duration> = walls.iter_mut().map(median).collect();
    let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# Plugin exec floor: {CONCURRENT} concurrent execs of CNI VERSION\n\n\
         Same run, the three binaries interleaved round by round; median of {FLOOR_ROUNDS} rounds. \
         No daemon is involved (VERSION is answered by the plugin itself). Machine: {} cores.\n",
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get)
    );
    let _ = writeln!(
        md,
        "| plugin binary | size (MiB) | wall (s) | vs. upstream | vs. full agent binary |\n|---|---|---|---|---|"
    );
    for ((name, bin), m) in binaries.iter().zip(&medians) {
        let _ = writeln!(
            md,
            "| {name} | {:.1} | {:.3} | {} | {} |",
            size(bin) as f64 / (1024.0 * 1024.0),
            m.as_secs_f64(),
            speedup(medians[0], *m),
            speedup(medians[1], *m),
        );
    }
    println!("\n{md}");
    if let Some(dir) = std::env::var_os("XDHCP_BENCH_RESULTS") {
        let path = Path::new(&dir).join("cni-floor.md");
        std::fs::write(&path, md).expect("writing the results");
        println!("written to {}", path.display());
    }
}

/// "YYYY-MM-DD HH:MM UTC" of `secs` since the Unix epoch (the civil date
/// from the day count, proleptic Gregorian).
fn utc(secs: u64) -> String {
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
        rem / 3600,
        (rem % 3600) / 60
    )
}

fn on_off(b: bool) -> &'static str {
    if b { "on" } else { "off" }
}

/// One table: a row per burst size and configuration of `phases` that
/// match `server` and `tcpdump`.
fn phase_table(md: &mut String, phases: &[Phase], server: &str, tcpdump: bool) {
    let of = |c: Config| {
        phases
            .iter()
            .find(|p| p.server == server && p.tcpdump == tcpdump && p.config == c)
    };
    let mut sizes: Vec<usize> = phases
        .iter()
        .filter(|p| p.server == server && p.tcpdump == tcpdump)
        .flat_map(|p| p.bursts.iter().map(|(n, _)| *n))
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    if sizes.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\n## {server}, tcpdump on the bridge {}\n",
        on_off(tcpdump)
    );
    let _ = writeln!(
        md,
        "| configuration | ADDs | rounds | burst wall, median / p99 (ms) | per ADD, median / p99 (ms) | floor, median (ms): exec + server (each its median) | ÷ floor, median / p99 | ÷ upstream (upstream's ÷ this), median / p99 | failed ADDs |\n|---|---|---|---|---|---|---|---|---|"
    );
    for n in sizes {
        let upstream = of(Config::Upstream).and_then(|p| p.rounds(n)).map(walls);
        for c in Config::all() {
            let Some(rounds) = of(c).and_then(|p| p.rounds(n)) else {
                continue;
            };
            let (w50, w99) = walls(rounds);
            let (a50, a99) = per_add(rounds);
            let (f, fe, fd) = floors(rounds);
            let (o50, o99) = over_floor(rounds);
            let vs_upstream = match upstream {
                Some((u50, u99)) if c != Config::Upstream => {
                    format!("{:.1}× / {:.1}×", u50 / w50.max(1e-9), u99 / w99.max(1e-9))
                }
                _ => String::new(),
            };
            let failed: usize = rounds.iter().map(|r| r.burst.failed).sum();
            let dora_failed: usize = rounds.iter().map(|r| r.dora_failed).sum();
            let _ = writeln!(
                md,
                "| {} | {n} | {} | {w50:.1} / {w99:.1} | {a50:.1} / {a99:.1} | {f:.1}: {fe:.1} + {fd:.1} | {o50:.2}× / {o99:.2}× | {vs_upstream} | {failed}{} |",
                c.name(),
                rounds.len(),
                if dora_failed > 0 {
                    format!(" (server's own: {dora_failed} failed)")
                } else {
                    String::new()
                }
            );
        }
    }
}

/// Where one ADD's time goes inside the agent: a row per xdhcp phase of
/// the run and burst size, the mean of each of the agent's phases.
fn inside_table(md: &mut String, phases: &[Phase]) {
    let rows: Vec<(&Phase, usize, &Inside)> = phases
        .iter()
        .flat_map(|p| p.inside.iter().map(move |(n, i)| (p, *n, i)))
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\n## Inside the agent: where an ADD's time goes\n\n\
         The agent's own `xdhcp_add_phase_seconds` and `xdhcp_add_duration_seconds`, read from its \
         `/metrics` before and after each burst size's rounds: the mean per ADD, in ms. `request` \
         runs from the connection's accept to the ADD's start and `answer` from its end to the \
         answer written; `guard` runs beside the exchange (from `start` on), so the phases add up \
         to more than the ADD; `offer` + `ack` is the exchange with the server. What the plugin's \
         wall time holds beyond the agent's ADD is the exec, its connect and its output.\n"
    );
    let _ = writeln!(
        md,
        "| server | tcpdump | configuration | ADDs | measured | {} | agent's ADD |\n|{}",
        AGENT_PHASES.join(" | "),
        "---|".repeat(AGENT_PHASES.len() + 5)
    );
    for (p, n, i) in rows {
        let cells: Vec<String> = i.phases.iter().map(|v| format!("{v:.2}")).collect();
        let _ = writeln!(
            md,
            "| {} | {} | {} | {n} | {} | {} | {:.2} |",
            p.server,
            on_off(p.tcpdump),
            p.config.name(),
            i.adds,
            cells.join(" | "),
            i.total
        );
    }
}

/// The CPU each phase's bursts took, from `/proc`: the daemon's own per
/// ADD (upstream's `dhcp daemon`, or xdhcp's agent) and how busy the
/// machine was.
fn cpu_table(md: &mut String, phases: &[Phase]) {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let _ = writeln!(
        md,
        "\n## The CPU the bursts took\n\n\
         From `/proc`, summed over the rounds of a size: the daemon's own CPU time (every thread, \
         user and system, with the kernel's work done in its threads) per ADD — upstream's \
         `dhcp daemon` (its plugin, a process per ADD, does part of the work outside it) or \
         xdhcp's agent (its thin plugin only carries the request) — and the whole machine's busy \
         time over the rounds' wall time on {cores} cores. \"–\": fewer than 20 of `/proc`'s \
         clock ticks, too coarse to say. A machine busy near 100 % is a burst bound by CPU.\n"
    );
    let _ = writeln!(
        md,
        "| server | tcpdump | configuration | ADDs | daemon CPU per ADD | machine busy during the bursts |\n|---|---|---|---|---|---|"
    );
    for p in phases {
        for (n, rounds) in &p.bursts {
            let (per_add, busy) = cpu_cells(rounds.iter().map(|r| &r.burst), *n);
            let _ = writeln!(
                md,
                "| {} | {} | {} | {n} | {per_add} | {busy} |",
                p.server,
                on_off(p.tcpdump),
                p.config.name()
            );
        }
    }
}

/// Every round of every phase, beside its floor: `cni-rounds.md`.
fn rounds_file(phases: &[Phase]) -> String {
    let mut md = String::from(
        "# CNI benchmark: every round beside its floor\n\n\
         The rounds behind [cni.md](cni.md), in the order they ran. Times in ms; a round whose \
         fastest ADD is as slow as its slowest was held as a whole; \
         the floor is the same number of concurrent plugin execs doing no DHCP plus \
         the server's own DORAs, measured right after the round.\n\n\
         | server | tcpdump | configuration | ADDs | round | burst wall | fastest ADD | slowest ADD | floor: exec + server | ÷ floor | failed |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for p in phases {
        for (n, rounds) in &p.bursts {
            for (i, r) in rounds.iter().enumerate() {
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {n} | {} | {:.1} | {:.1} | {:.1} | {:.1}: {:.1} + {:.1} | {:.2}× | {} |",
                    p.server,
                    on_off(p.tcpdump),
                    p.config.name(),
                    i + 1,
                    ms(r.burst.wall),
                    r.burst.lat.first().map_or(f64::NAN, |d| ms(*d)),
                    r.burst.lat.last().map_or(f64::NAN, |d| ms(*d)),
                    ms(r.floor()),
                    ms(r.exec),
                    ms(r.dora),
                    r.over_floor(),
                    r.burst.failed
                );
            }
        }
    }
    md
}

/// Burst wall time against burst size, median and p99 over the rounds, per
/// configuration (dnsmasq, tcpdump off), with xdhcp's floor; log axes.
fn plot(phases: &[Phase]) -> Option<String> {
    let path = xdhcp_tests::bench::results_path("cni-latency.svg")?;
    let mut series = Vec::new();
    let chosen: Vec<&Phase> = phases
        .iter()
        .filter(|p| p.server == "dnsmasq --no-ping" && !p.tcpdump)
        .collect();
    for p in &chosen {
        for (label, pick) in [("median", 0usize), ("p99", 1)] {
            let points = p
                .bursts
                .iter()
                .filter(|(_, r)| !r.is_empty())
                .map(|(n, r)| {
                    let (m, p99) = walls(r);
                    (*n as f64, if pick == 0 { m } else { p99 })
                })
                .collect();
            series.push(Series {
                label: format!("{} {label}", p.config.name()),
                points,
            });
        }
    }
    if let Some(p) = chosen.iter().find(|p| p.config != Config::Upstream) {
        series.push(Series {
            label: "floor (thin plugin exec + server's own DORAs), median".to_owned(),
            points: p
                .bursts
                .iter()
                .filter(|(_, r)| !r.is_empty())
                .map(|(n, r)| (*n as f64, floors(r).0))
                .collect(),
        });
    }
    xdhcp_tests::bench::plot_lines_log(
        &path,
        "CNI ADD bursts: wall time against concurrent ADDs (dnsmasq --no-ping)",
        "concurrent ADDs (log)",
        "burst wall time, ms (log)",
        &series,
    );
    Some("![burst wall time against concurrent ADDs, log axes](cni-latency.svg)".to_owned())
}

/// Prints the tables and writes `cni.md` and `cni-rounds.md`.
fn report(phases: &[Phase], load_before: &str, took: Duration) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# CNI IPAM benchmark: xdhcp vs. upstream `dhcp` ({})\n",
        upstream().display()
    );
    let _ = writeln!(
        md,
        "Written by `cargo xtask bench cni` at {}, commit {}, on {} cores; load average (1, 5, 15 min) \
         {load_before} before, {} after; {:.0} s.\n",
        utc(now),
        std::env::var("XDHCP_BENCH_COMMIT").unwrap_or_else(|_| "unknown".to_owned()),
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        load_average(),
        took.as_secs_f64()
    );
    {
        let leases = if server_leases_on_tmpfs() {
            "on tmpfs so that its fsync at every change, 1–9 ms on this VM's shared disk, does \
             not swamp the figures"
        } else {
            "on the disk, as in a harness of one's own (`XDHCP_BENCH_SERVER_LEASES=disk`): \
             dnsmasq fsyncs it before every ACK, one ACK at a time"
        };
        let _ = writeln!(
            md,
            "The harness: a node namespace with a Linux bridge `br0`; the DHCP server (dnsmasq 2.90 \
             `--no-ping`, {LEASE_SECS} s leases, its lease file {leases}; then Kea 2.2 \
             memfile) in its own namespace behind a veth \
             whose bridge end is `up0`; {CONCURRENT} pod namespaces with a veth each on the bridge, created \
             up front and reused by every phase. Each phase starts its daemon fresh: the upstream \
             `dhcp daemon`; `xdhcp agent --kube off` in the node namespace without an uplink \
             (capturing on each pod's interface); the same with `--uplink up0`. Both plugins are \
             exec'd with the upstream plugin's network config (`\"type\": \"dhcp\"`, \
             `daemonSocketPath`; xdhcp's thin plugin as the drop-in) and timed as the plugin \
             process's wall time. Each burst is run in rounds, each pod given a DEL after its round \
             (both release the lease), so each round's ADDs start without a lease from the same \
             MACs. Right after each round its floor: as many concurrent execs of that plugin doing \
             no DHCP (`CNI_COMMAND=VERSION`) plus as many DORAs of the server's own from the same \
             pods' namespaces, back to back, the fastest of {DORA_PASSES} such runs (xdhcp's engine \
             over raw sockets: no CNI, no plugin, no agent; fired all at once from one process the \
             same DORAs took 7–15× longer here, broadcasts flooding every port). The daemon of the \
             phase runs throughout, the floor's exchanges pass its capture too. Medians and p99s are over the rounds (over \
             every ADD of every round for the per-ADD column); with 5 rounds the p99 is the \
             slowest. \"÷ floor\" is each round's wall over its own floor; \"÷ upstream\" is \
             upstream's median (p99) wall over this one's. Every round is in \
             [cni-rounds.md](cni-rounds.md)."
        );
        for tcpdump in [false, true] {
            phase_table(&mut md, phases, "dnsmasq --no-ping", tcpdump);
        }
        phase_table(&mut md, phases, "Kea", false);
        inside_table(&mut md, phases);
        cpu_table(&mut md, phases);
        if let Some(p) = plot(phases) {
            let _ = writeln!(md, "\n{p}");
        }
    }
    println!("\n{md}");
    xdhcp_tests::bench::write_result("cni.md", &md);
    xdhcp_tests::bench::write_result("cni-rounds.md", &rounds_file(phases));
}

/// The footprint table, `cni-footprint.md`.
fn footprint_report(rows: &[Row]) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let mut md = format!(
        "# CNI IPAM daemons' footprint: xdhcp vs. upstream `dhcp` ({})\n\n\
         Written by `XDHCP_BENCH_CNI=footprint cargo xtask bench cni` at {}, commit {}, on {} cores. \
         A lab of {BIG} pod interfaces (IPv6 on) on a bridge, dnsmasq on a /22 with 1 h leases in the \
         bridge's namespace, each daemon started with its defaults; ADDs in bursts of {CONCURRENT}; \
         the {CONCURRENT}-lease point on a fresh daemon.\n\n\
         | measure | upstream | xdhcp | ratio |\n|---|---|---|---|\n",
        upstream().display(),
        utc(now),
        std::env::var("XDHCP_BENCH_COMMIT").unwrap_or_else(|_| "unknown".to_owned()),
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
    );
    for r in rows {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} |",
            r.what, r.upstream, r.xdhcp, r.ratio
        );
    }
    println!("\n{md}");
    xdhcp_tests::bench::write_result("cni-footprint.md", &md);
}

#[cfg(test)]
mod tests {
    use super::utc;

    #[test]
    fn utc_dates_match_known_instants() {
        assert_eq!(utc(0), "1970-01-01 00:00 UTC");
        // 2026-12-05 10:15:03 UTC.
        assert_eq!(utc(1_796_465_703), "2026-12-05 10:15 UTC");
        // A leap day.
        assert_eq!(utc(1_709_164_800), "2024-02-29 00:00 UTC");
    }
}
