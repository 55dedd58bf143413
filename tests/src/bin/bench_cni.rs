//! `cargo xtask bench cni`: xdhcp side by side with the upstream CNI `dhcp`
//! daemon (Debian's `/usr/lib/cni/dhcp`), on one testbed and in one run.
//!
//! Both are invoked exactly as a runtime invokes an IPAM plugin (exec with the
//! CNI environment and the network config on stdin) on the same pre-created
//! pod interfaces (veths from a lab bridge into per-pod namespaces):
//!
//! 1. single ADD latency (median, p99 over 50 ADD+DEL rounds after one
//!    unmeasured warm-up round, dnsmasq `--no-ping`), and its floor: one
//!    plugin exec that does no DHCP plus one DORA of the server's own
//!    (medians of 50, same run);
//! 2. 100 concurrent ADDs against dnsmasq `--no-ping` and against Kea: wall
//!    time, leases/s, failures, and the daemon's CPU time (printed); each
//!    burst `XDHCP_BENCH_ROUNDS` times (default 5), the median reported
//!    with the rounds' range;
//! 3. the floors under those bursts, measured in the same run: 100 plugin
//!    execs that do no DHCP (`CNI_COMMAND=VERSION`) per implementation,
//!    after each burst round, and each server's own limit — 100 DORAs
//!    straight from this process over raw sockets, no CNI (back to back,
//!    and all at once; the faster), as many rounds; medians;
//! 4. daemon RSS and OS thread count at 0, 100 and 1000 leases.
//!
//! For 1–3 the server sits in its own namespace behind the lab bridge's
//! uplink port, and the agent runs in the bridge's namespace with that port
//! as its uplink (`--uplink physnet1=up0`), as on a node;
//! `XDHCP_BENCH_CNI_UPLINK=off` runs it without, capturing on each pod's
//! interface instead.
//!
//! Both daemons are measured once they serve (xdhcp: CNI STATUS succeeds),
//! not during their start-up. Results are printed as a Markdown table of
//! figures and ratios and written to `$XDHCP_BENCH_RESULTS/cni.md`. Nothing
//! here asserts a timing. `XDHCP_BENCH_CNI=latency|footprint|floor` runs one
//! part; `floor` is the exec floor alone, for three binaries side by side:
//! upstream's plugin, the full agent binary as the plugin (`XDHCP_BIN`) and
//! the thin plugin binary (`XDHCP_PLUGIN_BIN`), written to `cni-floor.md`;
//! `XDHCP_BENCH_ONLY=xdhcp|upstream` one implementation (no ratios then);
//! `XDHCP_BENCH_LOG_DIR` keeps the daemon logs (agent at
//! `XDHCP_BENCH_RUST_LOG`) and per-ADD timings there;
//! `XDHCP_BENCH_AGENT_ARGS` adds flags to the agent's command line (e.g.
//! `--acquisitions-per-network 0` to compare pacing settings).
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

use xdhcp::datapath::{afpacket::AfPacketReceiver, rawsock::RawSender};
use xdhcp_engine::{Client, ClientConfig, Event, MessageKind, PacketSource};
use xdhcp_tests::{
    CNI_PLUGIN_DIR, PluginCall,
    bench::{Daemon, DaemonOptions, Impl, Series, impls, upstream},
    netns::{Lab, LabClient, NetNs},
    progress,
    servers::{Dnsmasq, DnsmasqConfig, Kea, KeaConfig},
};

const SINGLE_RUNS: usize = 50;
const CONCURRENT: usize = 100;
const BIG: usize = 1000;
/// Concurrency levels between the single ADD and the full burst, for the
/// latency-against-concurrency plot (against dnsmasq).
const SWEEP: &[usize] = &[10, 25, 50];

/// ADD latency (median and p99 of the ADDs in each burst) against the
/// number of concurrent ADDs, one line per implementation and percentile,
/// written beside the table as `cni-latency.svg`.
fn plot_sweep(sweep: &[(Impl, usize, Vec<Duration>)], plots: &mut Vec<String>) {
    let Some(path) = xdhcp_tests::bench::results_path("cni-latency.svg") else {
        return;
    };
    let mut series = Vec::new();
    for w in impls() {
        for (label, p) in [("median", 0.5), ("p99", 0.99)] {
            let mut points: Vec<(f64, f64)> = sweep
                .iter()
                .filter(|(x, _, lat)| *x == w && !lat.is_empty())
                .map(|(_, n, lat)| (*n as f64, ms(percentile(lat, p))))
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            series.push(Series {
                label: format!("{} {label}", w.name()),
                points,
            });
        }
    }
    xdhcp_tests::bench::plot_lines(
        &path,
        "CNI ADD latency against concurrent ADDs (dnsmasq --no-ping)",
        "concurrent ADDs",
        "ADD latency (ms)",
        &series,
    );
    plots.push("![ADD latency against concurrency](cni-latency.svg)".to_owned());
}

fn unix_us() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros()
}

fn unix_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// ADD+DEL rounds on one interface (its port in `node` made fresh again
/// after each, see [`fresh_ports`]); returns sorted ADD latencies.
fn single(d: &Daemon, node: &NetNs, client: &LabClient) -> Vec<Duration> {
    // One unmeasured round first, for both implementations alike: the first
    // exec of a freshly built binary reads it from disk (100-200 ms), which
    // says nothing about the plugin.
    let _ = d.cni("ADD", "warmup", client);
    let _ = d.cni("DEL", "warmup", client);
    fresh_ports(node, std::slice::from_ref(client));
    let mut lat = Vec::with_capacity(SINGLE_RUNS);
    for i in 0..SINGLE_RUNS {
        let id = format!("single-{i}");
        match d.cni("ADD", &id, client) {
            Ok(t) => lat.push(t),
            Err(e) => eprintln!("  single ADD failed: {e}"),
        }
        let _ = d.cni("DEL", &id, client);
        fresh_ports(node, std::slice::from_ref(client));
    }
    if let Some(dir) = std::env::var_os("XDHCP_BENCH_LOG_DIR") {
        let mut text = String::new();
        for t in &lat {
            let _ = writeln!(text, "{:.3}", ms(*t));
        }
        let name = format!("{}-singles.txt", d.which.name().replace(' ', "-"));
        let _ = std::fs::write(Path::new(&dir).join(name), text);
    }
    lat.sort();
    lat
}

struct Burst {
    wall: Duration,
    /// The successful ADDs' own latencies, sorted.
    lat: Vec<Duration>,
    ok: usize,
    failed: usize,
    first_error: Option<String>,
}

/// The rounds of one burst, by wall time.
struct Rounds(Vec<Burst>);

impl Rounds {
    fn of(mut rounds: Vec<Burst>) -> Self {
        assert!(!rounds.is_empty(), "at least one round");
        rounds.sort_by_key(|b| b.wall);
        Self(rounds)
    }

    /// The round of median wall time (the slower middle one of an even
    /// count).
    fn median(&self) -> &Burst {
        &self.0[self.0.len() / 2]
    }

    fn fastest(&self) -> Duration {
        self.0[0].wall
    }

    fn slowest(&self) -> Duration {
        self.0[self.0.len() - 1].wall
    }

    /// Failed ADDs over every round.
    fn failed(&self) -> usize {
        self.0.iter().map(|b| b.failed).sum()
    }
}

/// `n` concurrent ADDs on clients `0..n`, container ids `<tag>-<i>`.
fn burst(d: &Daemon, clients: &[LabClient], tag: &str) -> Burst {
    let started = Instant::now();
    let t0 = unix_us();
    let timed: Vec<(u128, u128, Result<Duration, String>)> = std::thread::scope(|s| {
        let handles: Vec<_> = clients
            .iter()
            .enumerate()
            .map(|(i, c)| {
                s.spawn(move || {
                    let a = unix_us();
                    let r = d.cni("ADD", &format!("{tag}-{i}"), c);
                    (a, unix_us(), r)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("ADD thread"))
            .collect()
    });
    let wall = started.elapsed();
    if let Some(dir) = std::env::var_os("XDHCP_BENCH_LOG_DIR") {
        // When each plugin ran, relative to the burst's start (µs).
        let mut text = format!("start {t0}\n");
        for (i, (a, b, _)) in timed.iter().enumerate() {
            let _ = writeln!(text, "{tag}-{i} {} {}", a - t0, b - t0);
        }
        let name = format!("{}-{tag}-{t0}.txt", d.which.name().replace(' ', "-"));
        let _ = std::fs::write(Path::new(&dir).join(name), text);
    }
    let results: Vec<Result<Duration, String>> = timed.into_iter().map(|(_, _, r)| r).collect();
    let failed: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    let mut lat: Vec<Duration> = results
        .iter()
        .filter_map(|r| r.as_ref().ok().copied())
        .collect();
    lat.sort();
    Burst {
        wall,
        lat,
        ok: results.len() - failed.len(),
        failed: failed.len(),
        first_error: failed.first().map(|s| (*s).clone()),
    }
}

/// `n` concurrent plugin execs that do no DHCP at all (`CNI_COMMAND=VERSION`,
/// same environment and stdin as an ADD): what exec alone costs on this
/// machine, the floor under any burst of ADDs.
fn exec_floor(d: &Daemon, clients: &[LabClient]) -> Duration {
    let started = Instant::now();
    std::thread::scope(|s| {
        for (i, c) in clients.iter().enumerate() {
            s.spawn(move || {
                if let Err(e) = d.cni("VERSION", &format!("floor-{i}"), c) {
                    eprintln!("  VERSION failed: {e}");
                }
            });
        }
    });
    started.elapsed()
}

/// One plugin exec that does no DHCP (`CNI_COMMAND=VERSION`), `SINGLE_RUNS`
/// times one after another: the median is what exec alone adds to a single
/// ADD. Sorted.
fn single_exec(d: &Daemon, client: &LabClient) -> Vec<Duration> {
    let mut lat: Vec<Duration> = (0..SINGLE_RUNS)
        .filter_map(|i| d.cni("VERSION", &format!("exec-{i}"), client).ok())
        .collect();
    lat.sort();
    lat
}

/// The server's own limit: one DORA per lab client straight from this
/// process — the xdhcp engine over raw/`AF_PACKET` sockets opened
/// beforehand, no CNI, no plugin exec, no agent — run back to back and then
/// all at once; the faster of the two (wall time from the first DISCOVER to
/// the last ACK), and its failures. Every lease is released after. Also
/// each back-to-back DORA's own time, sorted: the server's single DORA.
fn raw_dora_burst(clients: &[LabClient]) -> (Duration, usize, Vec<Duration>) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        let mut socks = Vec::with_capacity(clients.len());
        for c in clients {
            let tx = RawSender::open_async(c.ns.path(), &c.ifname)
                .await
                .expect("raw sender in the client namespace");
            let rx = AfPacketReceiver::open_async(c.ns.path(), &c.ifname)
                .await
                .expect("AF_PACKET receiver in the client namespace");
            // As the agent does: each socket takes only its client's replies.
            rx.only_for(c.mac)
                .expect("narrow the receiver to its client");
            socks.push((tx, rx, c.mac));
        }
        // Back to back first: a single-threaded server (dnsmasq) serves one
        // client at a time anyway, and firing all DISCOVERs at the same
        // instant floods the bridge (every broadcast to every port).
        let seq_start = Instant::now();
        let mut seq_failed = 0;
        let mut each = Vec::with_capacity(socks.len());
        for (i, (tx, rx, mac)) in socks.iter().enumerate() {
            let cfg = ClientConfig {
                chaddr: *mac,
                ..ClientConfig::default()
            };
            let started = Instant::now();
            let mut client = Client::new(cfg, started, 0x5eed + i as u64);
            if until_bound(tx, rx, &mut client).await {
                each.push(started.elapsed());
                release_now(&mut client, tx);
            } else {
                seq_failed += 1;
            }
        }
        let sequential = seq_start.elapsed();
        // Let the server settle the releases.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let started = Instant::now();
        let mut set = tokio::task::JoinSet::new();
        for (i, (tx, rx, mac)) in socks.into_iter().enumerate() {
            set.spawn(async move {
                let cfg = ClientConfig {
                    chaddr: mac,
                    ..ClientConfig::default()
                };
                let mut client = Client::new(cfg, Instant::now(), 0x5eed + i as u64);
                let bound = until_bound(&tx, &rx, &mut client).await;
                (bound, started.elapsed(), client, tx)
            });
        }
        let mut wall = Duration::ZERO;
        let mut failed = 0;
        let mut held = Vec::new();
        while let Some(r) = set.join_next().await {
            match r {
                Ok((true, at, client, tx)) => {
                    wall = wall.max(at);
                    held.push((client, tx));
                }
                _ => failed += 1,
            }
        }
        // Released only once every client is bound: a RELEASE makes the
        // server rewrite its lease file, which the CNI bursts do not pay
        // either (their DELs come afterwards).
        for (mut client, tx) in held {
            release_now(&mut client, &tx);
        }
        println!(
            "  back to back {:.3} s ({seq_failed} failed), all at once {:.3} s ({failed} failed)",
            sequential.as_secs_f64(),
            wall.as_secs_f64()
        );
        each.sort();
        if (sequential, seq_failed) < (wall, failed) {
            (sequential, seq_failed, each)
        } else {
            (wall, failed, each)
        }
    })
}

fn release_now(client: &mut Client, tx: &RawSender) {
    client.set_wall_clock_unix_ms(unix_ms() as u64);
    client.release(Instant::now());
    while let Some(t) = client.poll_transmit() {
        if t.kind == MessageKind::Release {
            let _ = tx.send_transmit(&t);
        }
    }
}

/// Drives `client` to `Bound` (true) or gives up after 10 s (false).
async fn until_bound(tx: &RawSender, rx: &AfPacketReceiver, client: &mut Client) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        while let Some(t) = client.poll_transmit() {
            if tx.send_transmit(&t).is_err() {
                return false;
            }
        }
        while let Some(ev) = client.poll_event() {
            match ev {
                Event::Bound(_) => return true,
                Event::Failed(_) => return false,
                _ => {}
            }
        }
        let timer = client
            .poll_timeout()
            .map_or(deadline, tokio::time::Instant::from_std)
            .min(deadline);
        tokio::select! {
            frame = rx.recv() => {
                let Ok(frame) = frame else { return false };
                client.set_wall_clock_unix_ms(unix_ms() as u64);
                let src = PacketSource { src_mac: frame.headers.src_mac, src_ip: frame.headers.src_ip };
                let _ = client.handle_packet(Instant::now(), src, &frame.payload);
            }
            () = tokio::time::sleep_until(timer) => {
                if tokio::time::Instant::now() >= deadline {
                    return false;
                }
                client.set_wall_clock_unix_ms(unix_ms() as u64);
                client.handle_timeout(Instant::now());
            }
        }
    }
}

/// Give `clients`' bridge ports (in `node`) back the state of a fresh
/// pod's port: no `clsact` qdisc. A real pod's host-side veth is new with
/// every pod, and the first filter on a new qdisc is the costly one (the
/// kernel waits for an RCU grace period); the lab's ports outlive their
/// ADDs, and xdhcp's DHCP guard, detached at DEL, leaves the qdisc behind.
/// Upstream attaches nothing, so this changes nothing for it. Outside the
/// timed ADDs.
fn fresh_ports(node: &NetNs, clients: &[LabClient]) {
    let mut batch = String::new();
    for c in clients {
        let _ = writeln!(batch, "qdisc del dev {} clsact", c.port());
    }
    let file = std::env::temp_dir().join(format!("xdt-fresh-ports-{}.tc", std::process::id()));
    std::fs::write(&file, batch).expect("write the tc batch");
    // -force: ports without a qdisc (never guarded) are not an error.
    let _ = node.exec_output(&["tc", "-force", "-batch", &file.to_string_lossy()]);
    let _ = std::fs::remove_file(&file);
}

fn del_all(d: &Daemon, clients: &[LabClient], tag: &str) {
    std::thread::scope(|s| {
        for (i, c) in clients.iter().enumerate() {
            s.spawn(move || {
                let _ = d.cni("DEL", &format!("{tag}-{i}"), c);
            });
        }
    });
}

fn dnsmasq_config(prefix: (Ipv4Addr, Ipv4Addr), netmask: Ipv4Addr) -> DnsmasqConfig {
    DnsmasqConfig {
        range: prefix,
        netmask,
        lease_secs: 3600,
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
    let xdhcp = PathBuf::from(
        std::env::var_os("XDHCP_BIN")
            .expect("XDHCP_BIN: path of the release xdhcp binary (cargo xtask bench sets it)"),
    );
    // Panics with what to install when the plugin is missing.
    let _ = upstream();
    xdhcp_tests::netns::sweep_leftovers();
    let parts = Parts::from_env();
    let mut rows: Vec<Row> = Vec::new();
    let mut plots: Vec<String> = Vec::new();

    // ---- single ADD latency and 100 concurrent ADDs against dnsmasq and Kea.
    if parts.latency {
        latency_and_bursts(&xdhcp, &mut rows, &mut plots);
    }
    if parts.footprint {
        footprint(&xdhcp, &mut rows);
    }
    if parts.latency || parts.footprint {
        report(&rows, &plots);
    }
    if parts.floor {
        let thin = PathBuf::from(std::env::var_os("XDHCP_PLUGIN_BIN").expect(
            "XDHCP_PLUGIN_BIN: path of the release thin plugin binary (cargo xtask bench sets it)",
        ));
        exec_floors(&xdhcp, &thin);
    }
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

/// Rounds of each 100-ADD burst, of its exec floor and of the server's own
/// limit (`XDHCP_BENCH_ROUNDS`, default 5); medians are reported.
fn burst_rounds() -> usize {
    std::env::var("XDHCP_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(5)
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

/// "upstream U ms, xdhcp X ms" (– for an implementation not run).
fn fmt_pair(upstream: Option<Duration>, xdhcp: Option<Duration>) -> String {
    let f = |v: Option<Duration>| v.map_or_else(|| "–".to_owned(), |d| format!("{:.2} ms", ms(d)));
    format!("upstream {}, xdhcp {}", f(upstream), f(xdhcp))
}

/// Whether xdhcp captures at the lab's uplink (`--uplink physnet1=up0`, as
/// a node with a localnet uplink runs it; the default) or on each pod's
/// interface (`XDHCP_BENCH_CNI_UPLINK=off`, the path for interfaces no
/// uplink serves).
fn uplink_capture() -> bool {
    match std::env::var("XDHCP_BENCH_CNI_UPLINK").as_deref() {
        Err(_) | Ok("on") => true,
        Ok("off") => false,
        Ok(other) => panic!("XDHCP_BENCH_CNI_UPLINK: expected on or off, not {other:?}"),
    }
}

/// Which sections to run: `XDHCP_BENCH_CNI=latency,footprint,floor` (default: all).
/// Handy while working on one of them; the published table needs both.
struct Parts {
    latency: bool,
    footprint: bool,
    floor: bool,
}

impl Parts {
    fn from_env() -> Self {
        let Some(v) = std::env::var_os("XDHCP_BENCH_CNI") else {
            return Self {
                latency: true,
                footprint: true,
                floor: true,
            };
        };
        let v = v.to_string_lossy().into_owned();
        let mut parts = Self {
            latency: false,
            footprint: false,
            floor: false,
        };
        for p in v.split(',').map(str::trim) {
            match p {
                "latency" => parts.latency = true,
                "footprint" => parts.footprint = true,
                "floor" => parts.floor = true,
                "all" => {
                    parts.latency = true;
                    parts.footprint = true;
                    parts.floor = true;
                }
                other => panic!(
                    "XDHCP_BENCH_CNI: unknown part {other:?} (expected latency, footprint, floor or all)"
                ),
            }
        }
        parts
    }
}

/// Single ADD latency and the 100-ADD bursts against dnsmasq and Kea.
#[expect(
    clippy::too_many_lines,
    reason = "one linear script: lab, servers, both implementations, rows"
)]
fn latency_and_bursts(xdhcp: &Path, rows: &mut Vec<Row>, plots: &mut Vec<String>) {
    progress!("building a lab with {CONCURRENT} pod interfaces…");
    let lab = Lab::builder()
        .clients(CONCURRENT)
        .server_behind_uplink()
        .build();
    let uplink = uplink_capture();
    let opts = DaemonOptions {
        node_ns: Some(lab.server.name().to_owned()),
        agent_args: if uplink {
            vec!["--uplink".to_owned(), format!("physnet1={}", Lab::UPLINK)]
        } else {
            Vec::new()
        },
        ..DaemonOptions::default()
    };
    let mut opts = opts;
    if let Ok(extra) = std::env::var("XDHCP_BENCH_AGENT_ARGS") {
        opts.agent_args
            .extend(extra.split_whitespace().map(str::to_owned));
    }
    let mut single_execs = Vec::new();
    let mut server_doras = Vec::new();
    let mut singles = Vec::new();
    let mut bursts = Vec::new();
    let mut floors = Vec::new();
    let mut limits = Vec::new();
    let rounds = burst_rounds();
    // (implementation, concurrency, sorted ADD latencies) against dnsmasq.
    let mut sweep: Vec<(Impl, usize, Vec<Duration>)> = Vec::new();
    for server in ["dnsmasq --no-ping", "Kea"] {
        let _dnsmasq;
        let _kea;
        if server == "Kea" {
            _kea = Some(Kea::start(
                lab.dhcp_ns(),
                KeaConfig {
                    interface: lab.dhcp_ifname().to_owned(),
                    pool: (Ipv4Addr::new(192, 0, 2, 10), Ipv4Addr::new(192, 0, 2, 250)),
                    valid_lifetime: 3600,
                    renew_timer: 1800,
                    rebind_timer: 3000,
                    ..KeaConfig::default()
                },
            ));
            _dnsmasq = None;
        } else {
            _dnsmasq = Some(Dnsmasq::start(
                lab.dhcp_ns(),
                DnsmasqConfig {
                    interface: lab.dhcp_ifname().to_owned(),
                    ..dnsmasq_config(
                        (Ipv4Addr::new(192, 0, 2, 10), Ipv4Addr::new(192, 0, 2, 250)),
                        Ipv4Addr::new(255, 255, 255, 0),
                    )
                },
            ));
            _kea = None;
        }
        for which in impls() {
            let d = Daemon::start_with(which, xdhcp, &opts);
            if server != "Kea" {
                progress!(
                    "{}: {SINGLE_RUNS} single ADDs against {server}…",
                    which.name()
                );
                singles.push((which, single(&d, &lab.server, &lab.clients[0])));
                progress!(
                    "{}: {SINGLE_RUNS} single plugin execs (VERSION)…",
                    which.name()
                );
                single_execs.push((which, single_exec(&d, &lab.clients[0])));
            }
            if server != "Kea" {
                for &n in SWEEP {
                    progress!("{}: {n} concurrent ADDs against {server}…", which.name());
                    let b = burst(&d, &lab.clients[..n], &format!("sweep{n}"));
                    del_all(&d, &lab.clients[..n], &format!("sweep{n}"));
                    fresh_ports(&lab.server, &lab.clients[..n]);
                    sweep.push((which, n, b.lat));
                }
            }
            // A burst lasts a tenth of a second on a machine it saturates:
            // one alone is as much the scheduler's draw as the code's, so
            // each is run `rounds` times, each round followed by its exec
            // floor, and the medians are reported.
            let mut set = Vec::with_capacity(rounds);
            for round in 1..=rounds {
                progress!(
                    "{}: {CONCURRENT} concurrent ADDs against {server}, round {round} of {rounds}…",
                    which.name()
                );
                let cpu0 = d.cpu_ms();
                let b = burst(&d, &lab.clients, "burst");
                progress!(
                    "  {:.3} s, {} failed, daemon CPU {} ms",
                    b.wall.as_secs_f64(),
                    b.failed,
                    d.cpu_ms().saturating_sub(cpu0)
                );
                if let Some(e) = &b.first_error {
                    eprintln!("  first failure: {e}");
                }
                del_all(&d, &lab.clients, "burst");
                fresh_ports(&lab.server, &lab.clients);
                progress!(
                    "{}: {CONCURRENT} concurrent plugin execs (VERSION)…",
                    which.name()
                );
                floors.push((which, exec_floor(&d, &lab.clients)));
                set.push(b);
            }
            let set = Rounds::of(set);
            if server != "Kea" {
                sweep.push((which, CONCURRENT, set.median().lat.clone()));
            }
            bursts.push((server, which, set));
        }
        let mut walls = Vec::with_capacity(rounds);
        let mut failures = 0;
        for round in 1..=rounds {
            progress!(
                "{server}: {CONCURRENT} raw DORAs, no CNI (the server's own limit), round {round} of {rounds}…"
            );
            let (wall, failed, each) = raw_dora_burst(&lab.clients);
            progress!("  {:.3} s, {failed} failed", wall.as_secs_f64());
            if server != "Kea" && server_doras.is_empty() {
                server_doras = each;
            }
            walls.push(wall);
            failures += failed;
        }
        walls.sort();
        limits.push((server, percentile(&walls, 0.5), failures));
    }
    let single_of = |w: Impl| singles.iter().find(|(x, _)| *x == w).map(|(_, v)| v);
    for (w, v) in &singles {
        sweep.push((*w, 1, v.clone()));
    }
    plot_sweep(&sweep, plots);
    for (label, p) in [
        ("single ADD median (ms)", 0.5),
        ("single ADD p99 (ms)", 0.99),
    ] {
        let at = |w: Impl| single_of(w).map(|v| ms(percentile(v, p)));
        rows.push(Row::new(
            label.to_owned(),
            (at(Impl::Upstream), at(Impl::Xdhcp)),
            |v| format!("{v:.1}"),
            |u, x| format!("{:.1}× faster", u / x.max(1e-9)),
        ));
    }
    // The floor under a single ADD: one exec of that implementation's
    // plugin and one DORA of the server's own, both medians of this run.
    let dora = (!server_doras.is_empty()).then(|| percentile(&server_doras, 0.5));
    let single_floor = |w: Impl| {
        let exec = single_execs
            .iter()
            .find(|(x, v)| *x == w && !v.is_empty())
            .map(|(_, v)| percentile(v, 0.5))?;
        Some((percentile(single_of(w)?, 0.5), exec + dora?))
    };
    rows.push(Row::new(
        format!(
            "single ADD median ÷ its floor (that implementation's single plugin exec, median {}, + the server's own single DORA, median {}; floor in ms)",
            fmt_pair(
                single_execs.iter().find(|(x, _)| *x == Impl::Upstream).map(|(_, v)| percentile(v, 0.5)),
                single_execs.iter().find(|(x, _)| *x == Impl::Xdhcp).map(|(_, v)| percentile(v, 0.5)),
            ),
            dora.map_or_else(|| "–".to_owned(), |d| format!("{:.2} ms", ms(d))),
        ),
        (single_floor(Impl::Upstream), single_floor(Impl::Xdhcp)),
        |(t, f)| format!("{:.2}× ({:.2})", ms(t) / ms(f).max(1e-9), ms(f)),
        |_, _| String::new(),
    ));
    let floor_of = |w: Impl| {
        let mut of: Vec<Duration> = floors
            .iter()
            .filter(|(x, _)| *x == w)
            .map(|(_, f)| *f)
            .collect();
        of.sort();
        (!of.is_empty()).then(|| percentile(&of, 0.5))
    };
    for server in ["dnsmasq --no-ping", "Kea"] {
        let get = |w: Impl| {
            bursts
                .iter()
                .find(|(s, x, _)| *s == server && *x == w)
                .map(|(_, _, b)| b)
        };
        let both = (get(Impl::Upstream), get(Impl::Xdhcp));
        if matches!(both, (None, None)) {
            continue;
        }
        rows.push(Row::new(
            format!(
                "{CONCURRENT} concurrent ADDs, {server}: wall (s, median of {rounds} rounds; their range) / leases/s / failures (all rounds)"
            ),
            both,
            |r| {
                let b = r.median();
                format!(
                    "{:.2} ({:.2}–{:.2}) / {:.0} / {}",
                    b.wall.as_secs_f64(),
                    r.fastest().as_secs_f64(),
                    r.slowest().as_secs_f64(),
                    b.ok as f64 / b.wall.as_secs_f64(),
                    r.failed()
                )
            },
            |u, x| {
                format!(
                    "{:.1}× faster",
                    u.median().wall.as_secs_f64() / x.median().wall.as_secs_f64().max(1e-9)
                )
            },
        ));
        if let Some((_, limit, lf)) = limits.iter().find(|(s, _, _)| *s == server) {
            let l = limit.as_secs_f64().max(1e-9);
            rows.push(Row::new(
                format!(
                    "{CONCURRENT} ADDs, {server}: wall ÷ the server's own limit ({CONCURRENT} raw DORAs without CNI, best of back to back and all at once, median of {rounds} rounds: {:.3} s, {lf} failed)",
                    limit.as_secs_f64()
                ),
                both,
                |r| format!("{:.1}×", r.median().wall.as_secs_f64() / l),
                |_, _| String::new(),
            ));
            // The floor under a burst: its implementation's exec floor
            // (measured below, same run) plus the server's own limit.
            let with_floor = |w: Impl| get(w).zip(floor_of(w));
            rows.push(Row::new(
                format!(
                    "{CONCURRENT} ADDs, {server}: wall ÷ the floor (that implementation's exec floor, below, + the server's own limit, medians; floor in s; the rounds' range)"
                ),
                (with_floor(Impl::Upstream), with_floor(Impl::Xdhcp)),
                |(r, f)| {
                    let floor = (f + *limit).as_secs_f64();
                    format!(
                        "{:.2}× ({floor:.3}; {:.2}–{:.2}×)",
                        r.median().wall.as_secs_f64() / floor,
                        r.fastest().as_secs_f64() / floor,
                        r.slowest().as_secs_f64() / floor
                    )
                },
                |_, _| String::new(),
            ));
        }
    }
    rows.push(Row::new(
        format!(
            "{CONCURRENT} concurrent plugin execs without DHCP (CNI VERSION, the exec floor): wall (s, median of one after each burst round)"
        ),
        (floor_of(Impl::Upstream), floor_of(Impl::Xdhcp)),
        |f| format!("{:.3}", f.as_secs_f64()),
        |u, x| format!("{:.1}× faster", u.as_secs_f64() / x.as_secs_f64().max(1e-9)),
    ));
    drop(lab);
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

/// Prints the table and writes it to `$XDHCP_BENCH_RESULTS/cni.md`.
fn report(rows: &[Row], plots: &[String]) {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# CNI IPAM benchmark: xdhcp vs. upstream `dhcp` ({})\n",
        upstream().display()
    );
    let _ = writeln!(
        md,
        "Same testbed, same run: veth pod interfaces into a lab bridge, plugins exec'd with the CNI environment. \
         Latency and bursts: the DHCP server in its own namespace behind the bridge's uplink port `up0`, \
         the xdhcp agent in the bridge's namespace {}; the upstream daemon enters each pod's namespace itself. \
         Servers: dnsmasq 2.90 `--no-ping`, Kea 2.2 memfile. Machine: {} cores. \
         Each pod port is made fresh again (its qdisc removed) after each DEL, as a new pod's veth is; \
         each 100-ADD burst, its exec floor and the server's own limit are run in rounds, medians reported.\n",
        if uplink_capture() {
            "capturing at the uplink (`--uplink physnet1=up0`)"
        } else {
            "capturing on each pod's interface (no uplink configured)"
        },
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get)
    );
    let _ = writeln!(
        md,
        "| measure | upstream | xdhcp | ratio |\n|---|---|---|---|"
    );
    for r in rows {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} |",
            r.what, r.upstream, r.xdhcp, r.ratio
        );
    }
    for p in plots {
        let _ = writeln!(md, "\n{p}");
    }
    println!("\n{md}");
    if let Some(dir) = std::env::var_os("XDHCP_BENCH_RESULTS") {
        let path = PathBuf::from(dir).join("cni.md");
        std::fs::write(&path, &md).expect("write results");
        println!("written to {}", path.display());
    }
}
