//! `cargo xtask bench scale`: a thousand leases held, the daemon restarted
//! under them (SIGTERM, then SIGKILL), and the renewal storm at T1 — xdhcp
//! side by side with the upstream CNI `dhcp` daemon, in one run.
//!
//! Testbed: one dnsmasq (`--no-ping`, a /20 pool, 300 s leases, T1 60 s) in
//! its own namespace behind the lab bridge's uplink port, and 1000 pod
//! namespaces, each with one veth into the bridge (what the agent needs per
//! lease: an interface in a network namespace, keyed by container id and
//! interface name). The xdhcp agent runs in the bridge's namespace, as on a
//! node, capturing at the uplink (`--uplink physnet1=up0`) and guarding
//! every pod's port; `XDHCP_BENCH_SCALE_UPLINK=off` puts the server on the
//! bridge instead, so each pod's interface carries its own capture. Both
//! daemons are exec'd as IPAM plugins exactly as a runtime does.
//!
//! Per implementation, with a fresh server:
//! 1. start the daemon (the start-up floor: time until it serves with no
//!    leases); ADD 1000 pods, 100 at a time, sampling RSS after each 100;
//! 2. SIGTERM, start again: time from exec until every lease is held again
//!    (xdhcp: `/metrics` shows 1000 bound leases; its metrics endpoint only
//!    answers once recovery is done);
//! 3. SIGKILL, and stay down until every lease is past T1 (from the grant
//!    times in the server's lease file), then start again: the same
//!    re-adoption time, and the renewal storm — every lease resumes past T1
//!    at once. The server's lease file shows how many leases it saw renewed
//!    (expiry moved on), when, and how many not (renewals missed) — the
//!    server's view, the same for both daemons.
//!
//! Where the lab can lose packets, counted around each phase: the kernel's
//! one ARP table for all network namespaces (`/proc/net/stat/arp_cache`:
//! new entries refused when full), each CPU's input backlog that every veth
//! hop and every bridge flood copy passes (`/proc/net/softnet_stat`), and
//! dnsmasq's socket receive buffer (`RcvbufErrors` in the server
//! namespace). In the storm dnsmasq — one thread, writing its lease file
//! for every renewal — falls behind a thousand requests in a few seconds,
//! and with the default 208 KiB receive buffer the kernel drops what does
//! not fit: those are the renewals the server never sees. So by default the
//! run raises `net.core.rmem_default` to 4 MiB for its duration (only the
//! initial namespace may set it, and child namespaces take it from there;
//! restored at the end, also on panic); `XDHCP_BENCH_SCALE_RCVBUF=leave`
//! keeps the machine's value.
//!
//! Once dnsmasq takes every request it must also unicast every ACK, and
//! resolving a thousand pod addresses at once fills the ARP table
//! (`gc_thresh3` is 1024 by default, for all namespaces together): the
//! ACKs it cannot resolve are dropped after the lease file is written, so
//! the server's view shows the renewal while the agent never hears of it. So by default the run also
//! raises `net.ipv4.neigh.default.gc_thresh1/2/3`, as a node running a
//! thousand pods is set up (restored at the end, also on panic);
//! `XDHCP_BENCH_SCALE_NEIGH=leave` keeps the machine's values.
//!
//! The upstream daemon keeps its leases in memory only: after a restart it
//! holds none and renews none (they expire at the server while the pods keep
//! using the addresses). The run shows that rather than assume it.
//!
//! Results: `$XDHCP_BENCH_RESULTS/scale.md`, plots `scale-rss.svg` (RSS
//! against leases) and `scale-renewals.svg` (renewals over time).
//! `XDHCP_BENCH_SCALE_N` changes the lease count, `XDHCP_BENCH_ONLY` runs
//! one implementation, `XDHCP_BENCH_SCALE_RCVBUF` is `raise` (default) or
//! `leave`, and so is `XDHCP_BENCH_SCALE_NEIGH`.
#![expect(clippy::print_stdout, reason = "a benchmark report")]
#![expect(
    clippy::cast_precision_loss,
    reason = "counts and KiB figures far below 2^52 turned into ratios"
)]

use std::{
    collections::HashMap,
    fmt::Write as _,
    net::{Ipv4Addr, SocketAddr},
    path::Path,
    time::{Duration, Instant},
};

use xdhcp_tests::{
    bench::{self, Daemon, DaemonOptions, Impl, Series},
    neigh::{self, ArpStat, RaisedSysctl, RaisedThresholds},
    netns::{Lab, LabClient},
    progress,
    servers::Dnsmasq,
};

const CHUNK: usize = 100;
const LEASE_SECS: u32 = 300;
const T1_SECS: u32 = 60;
/// How long after the storm's spread window the run waits for renewals.
const RENEW_GRACE: Duration = Duration::from_secs(20);
/// The storm's watch goes on while the server has renewed a lease within
/// this long.
const RENEW_QUIET: Duration = Duration::from_secs(10);
/// The agent's default renewal fuzz (5 % of T1): leases resumed past T1
/// renew spread over this window.
const FUZZ: Duration = Duration::from_secs(T1_SECS as u64 / 20);
/// ARP table thresholds for `XDHCP_BENCH_SCALE_NEIGH=raise`.
const NEIGH_RAISED: [u64; 3] = [4096, 16384, 32768];
/// The default socket receive buffer for `XDHCP_BENCH_SCALE_RCVBUF=raise`:
/// about two thousand DHCP datagrams.
const SERVER_RCVBUF: u64 = 4 << 20;

/// What one implementation did.
struct Run {
    which: Impl,
    start_floor: Duration,
    add_wall: Duration,
    add_failed: usize,
    /// (leases held, RSS KiB, threads) after each chunk.
    rss: Vec<(usize, u64, u64)>,
    /// SIGTERM then SIGKILL: stop time, time until every lease is held
    /// again (`None`: never), leases held then, RSS KiB after.
    restarts: Vec<Restart>,
    /// Seconds after the start past T1 at which the server saw each
    /// renewal.
    renewed_at: Vec<f64>,
    /// Leases the server never saw renewed in the storm.
    missed: usize,
    /// Kernel ARP table counters grown during each phase (`None`: could not
    /// read them).
    arp: Vec<(&'static str, Option<Drops>)>,
    /// The ADDs' spread (first to last success), seconds after the first ADD.
    add_span: (f64, f64),
    /// Agent counters at the end (renewals, failures); xdhcp only.
    counters: Option<(f64, f64)>,
}

struct Restart {
    /// The agent's own account of recovery (its log line "lease state
    /// recovered": loading the records, then all of it), ms.
    recovery_log: Option<(u64, u64)>,
    stop: Duration,
    /// How long the daemon was kept down (waiting for every lease's T1).
    down: Option<Duration>,
    adopted: Option<Duration>,
    held: usize,
    rss: u64,
}

fn main() {
    let xdhcp = bench::xdhcp_bin();
    let _ = bench::upstream();
    xdhcp_tests::netns::sweep_leftovers();
    let n: usize = std::env::var("XDHCP_BENCH_SCALE_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let neigh_mode = std::env::var("XDHCP_BENCH_SCALE_NEIGH").unwrap_or_else(|_| "raise".into());
    let before = neigh::gc_thresholds();
    let raised = match neigh_mode.as_str() {
        "raise" => Some(
            RaisedThresholds::raise(NEIGH_RAISED)
                .expect("raise net.ipv4.neigh.default.gc_thresh* (run as root)"),
        ),
        "leave" => None,
        other => panic!("XDHCP_BENCH_SCALE_NEIGH={other}: expected `raise` or `leave`"),
    };
    let neigh_note = match (&raised, before) {
        (Some(r), _) => format!(
            "the kernel's ARP table thresholds (net.ipv4.neigh.default.gc_thresh1/2/3) raised \
             from {} to {} for the run and restored after (XDHCP_BENCH_SCALE_NEIGH=raise)",
            slash(r.previous()),
            slash(r.now)
        ),
        (None, Some(b)) => format!(
            "the kernel's ARP table thresholds (net.ipv4.neigh.default.gc_thresh1/2/3) left at \
             the machine's {} (XDHCP_BENCH_SCALE_NEIGH=leave)",
            slash(b)
        ),
        (None, None) => "the kernel's ARP table thresholds left as they are (unreadable)".into(),
    };
    progress!("{neigh_note}");
    // A namespace takes rmem_default when it is created: before the lab.
    let (rcvbuf, rcvbuf_note) = match std::env::var("XDHCP_BENCH_SCALE_RCVBUF").as_deref() {
        Ok("raise") | Err(_) => {
            let g = RaisedSysctl::raise("net.core.rmem_default", SERVER_RCVBUF)
                .expect("raise net.core.rmem_default (run as root)");
            let note = format!(
                "net.core.rmem_default (the receive buffer dnsmasq's socket gets) raised from {} \
                 to {} bytes for the run and restored after (XDHCP_BENCH_SCALE_RCVBUF=raise)",
                g.previous(),
                g.now
            );
            (Some(g), note)
        }
        Ok("leave") => (
            None,
            format!(
                "net.core.rmem_default (the receive buffer dnsmasq's socket gets) left at {} \
                 bytes (XDHCP_BENCH_SCALE_RCVBUF=leave)",
                std::fs::read_to_string("/proc/sys/net/core/rmem_default")
                    .map_or_else(|e| e.to_string(), |v| v.trim().to_owned())
            ),
        ),
        Ok(other) => panic!("XDHCP_BENCH_SCALE_RCVBUF={other}: expected `raise` or `leave`"),
    };
    progress!("{rcvbuf_note}");
    let neigh_note = format!("{neigh_note}; {rcvbuf_note}");
    progress!("building a lab with {n} pod namespaces (a veth each into one bridge)…");
    let uplink = uplink_capture();
    // IPv6 off: a thousand pods' link-local chatter, flooded to every
    // bridge port, overflowed the kernel's input backlog (hundreds of
    // thousands of drops per phase, renewals among them).
    let mut builder = Lab::builder()
        .server_ip(Ipv4Addr::new(198, 18, 0, 1), 20)
        .clients(n)
        .without_ipv6();
    if uplink {
        builder = builder.server_behind_uplink();
    }
    let lab = builder.build();
    progress!("lab ready");
    let mut runs = Vec::new();
    for which in bench::impls() {
        runs.push(run(which, &xdhcp, &lab));
    }
    report(&runs, n, &neigh_note);
    drop(raised);
    drop(rcvbuf);
}

/// Whether the server sits behind the lab bridge's uplink port and the
/// agent, in the bridge's namespace, captures there and guards every pod's
/// port (`--uplink physnet1=up0`, as on a node; the default), or the server
/// is on the bridge and each pod's interface carries its own capture
/// (`XDHCP_BENCH_SCALE_UPLINK=off`).
fn uplink_capture() -> bool {
    match std::env::var("XDHCP_BENCH_SCALE_UPLINK").as_deref() {
        Err(_) | Ok("on") => true,
        Ok("off") => false,
        Ok(other) => panic!("XDHCP_BENCH_SCALE_UPLINK: expected on or off, not {other:?}"),
    }
}

/// The agent's `/metrics` text, fetched from the namespace it runs in.
fn scrape(lab: &Lab, metrics: SocketAddr) -> Option<String> {
    lab.server
        .run_in(move || bench::http_get(metrics, "/metrics"))
}

fn slash(t: [u64; 3]) -> String {
    format!("{}/{}/{}", t[0], t[1], t[2])
}

/// The kernel's counts of packets it could not take, where the lab's
/// packets can be lost.
#[derive(Clone, Copy)]
struct Drops {
    /// The ARP table (machine-wide).
    arp: ArpStat,
    /// Input backlog full (machine-wide).
    backlog: u64,
    /// UDP receive buffers full in the server's namespace (dnsmasq's).
    server_rcvbuf: u64,
}

impl Drops {
    fn read(lab: &Lab) -> Option<Drops> {
        Some(Drops {
            arp: ArpStat::read()?,
            backlog: neigh::softnet_dropped()?,
            server_rcvbuf: neigh::udp_rcvbuf_errors_in(lab.dhcp_ns())?,
        })
    }

    fn since(self, before: Drops) -> Drops {
        Drops {
            arp: self.arp.since(before.arp),
            backlog: self.backlog.saturating_sub(before.backlog),
            server_rcvbuf: self.server_rcvbuf.saturating_sub(before.server_rcvbuf),
        }
    }
}

/// The drops counted since `before`, logged.
fn arp_phase(lab: &Lab, which: Impl, phase: &'static str, before: Option<Drops>) -> Option<Drops> {
    let d = Drops::read(lab).zip(before).map(|(a, b)| a.since(b));
    progress!(
        "{}: kernel drops during {phase}: {}",
        which.name(),
        d.map_or_else(
            || "unreadable".to_owned(),
            |d| format!(
                "ARP table {} table_fulls, {} forced_gc_runs; input backlog {} dropped; \
                 server UDP receive buffer {} dropped",
                d.arp.table_fulls, d.arp.forced_gc_runs, d.backlog, d.server_rcvbuf
            )
        )
    );
    d
}

fn server(lab: &Lab) -> Dnsmasq {
    bench::pool_server(lab, LEASE_SECS, T1_SECS, None)
}

/// Leases the agent holds in state bound, renewing or rebinding, per its
/// `/metrics` (`None` until it answers: it binds after recovery).
fn held(lab: &Lab, metrics: SocketAddr) -> Option<usize> {
    let text = scrape(lab, metrics)?;
    let n: f64 = ["bound", "renewing", "rebinding"]
        .iter()
        .map(|s| bench::metric(&text, "xdhcp_leases", &format!("state=\"{s}\"")))
        .sum();
    Some(n as usize)
}

#[allow(
    clippy::too_many_lines,
    reason = "one linear script per implementation"
)]
#[allow(
    clippy::many_single_char_names,
    reason = "n leases, t a start instant, d the daemon, r/h readings: a short script"
)]
fn run(which: Impl, xdhcp: &Path, lab: &Lab) -> Run {
    let n = lab.clients.len();
    let dnsmasq = server(lab);
    let state = tempfile::Builder::new()
        .prefix("xdt-bench-scale-")
        .tempdir()
        .expect("tempdir");
    let metrics = bench::free_local_addr();
    let opts = || DaemonOptions {
        rust_log: Some("info".to_owned()),
        state_in: Some(state.path().to_path_buf()),
        metrics: Some(metrics),
        no_wait: true,
        node_ns: Some(lab.server.name().to_owned()),
        agent_args: if lab.uplink.is_some() {
            vec!["--uplink".to_owned(), format!("physnet1={}", Lab::UPLINK)]
        } else {
            Vec::new()
        },
        ovsdb: None,
        upstream_dialect: false,
        ipam_extra: None,
    };
    progress!("{}: starting with no leases", which.name());
    let t = Instant::now();
    let mut d = Daemon::start_with(which, xdhcp, &opts());
    d.wait_serving(Duration::from_secs(30));
    let start_floor = t.elapsed();
    progress!(
        "{}: serving after {:.0} ms",
        which.name(),
        start_floor.as_secs_f64() * 1e3
    );
    std::thread::sleep(Duration::from_millis(300));
    let (rss0, thr0) = d.footprint();
    let mut rss = vec![(0, rss0, thr0)];
    let mut arp = Vec::new();
    let mut arp0 = Drops::read(lab);
    let first_add = Instant::now();
    let mut add_failed = 0;
    let mut done_at: HashMap<usize, f64> = HashMap::new();
    for (c, chunk) in lab.clients.chunks(CHUNK).enumerate() {
        let results = burst(&d, chunk, c * CHUNK);
        for (i, r) in results {
            match r {
                Ok(()) => {
                    done_at.insert(i, first_add.elapsed().as_secs_f64());
                }
                Err(e) => {
                    if add_failed == 0 {
                        progress!("  first failure: {e}");
                    }
                    add_failed += 1;
                }
            }
        }
        let (r, t) = d.footprint();
        rss.push((done_at.len(), r, t));
        progress!(
            "{}: {} leases held, RSS {} KiB, {} threads",
            which.name(),
            done_at.len(),
            r,
            t
        );
    }
    let add_wall = first_add.elapsed();
    let add_span = (
        done_at.values().copied().fold(f64::MAX, f64::min),
        done_at.values().copied().fold(0.0, f64::max),
    );
    // What the server granted, to see later which leases it renewed.
    let leases = dnsmasq.leases();
    let mut granted: HashMap<[u8; 6], u64> =
        leases.iter().map(|l| (l.mac, l.expires_unix)).collect();
    progress!(
        "{}: putting the leased addresses on the pod interfaces…",
        which.name()
    );
    bench::configure_leased(&lab.clients, &leases, 20);
    progress!(
        "{}: {n} ADDs in {:.2} s, {add_failed} failed; the server holds {} leases",
        which.name(),
        add_wall.as_secs_f64(),
        granted.len()
    );
    arp.push(("the ADDs", arp_phase(lab, which, "the ADDs", arp0)));

    let mut restarts = Vec::new();
    let mut storm_start = Instant::now();
    for signal in ["SIGTERM", "SIGKILL"] {
        progress!("{}: restarting with {signal}", which.name());
        arp0 = Drops::read(lab);
        let t = Instant::now();
        if signal == "SIGTERM" {
            d.process.stop(Duration::from_secs(30));
        } else {
            d.process.kill();
        }
        let stop = t.elapsed();
        drop(d);
        let mut down = None;
        if signal == "SIGKILL" {
            // Stay down until every lease the server holds is past T1 (its
            // lease file has each expiry; T1 is that less the lease time
            // plus T1), so that all of them resume past T1 at once. What
            // the server holds now is the base the storm's renewals move
            // on from.
            let leases = dnsmasq.leases();
            granted = leases.iter().map(|l| (l.mac, l.expires_unix)).collect();
            let last_t1 = leases
                .iter()
                .map(|l| l.expires_unix - u64::from(LEASE_SECS) + u64::from(T1_SECS))
                .max()
                .unwrap_or(0);
            // Whole seconds in the file, and the agent's T1 counts from
            // when it took the ACK: a margin.
            let wait = Duration::from_millis(
                ((last_t1 + 2) * 1000).saturating_sub(bench::unix_ms() as u64),
            );
            progress!(
                "{}: down for {:.1} s, until every lease is past T1",
                which.name(),
                wait.as_secs_f64()
            );
            std::thread::sleep(wait);
            down = Some(t.elapsed());
            arp.push((
                "SIGKILL and down past T1",
                arp_phase(lab, which, "SIGKILL and down past T1", arp0),
            ));
            arp0 = Drops::read(lab);
        }
        let t = Instant::now();
        storm_start = t;
        d = Daemon::start_with(which, xdhcp, &opts());
        let adopted = match which {
            Impl::Xdhcp => {
                let ok = xdhcp_tests::wait_until(Duration::from_mins(1), || {
                    held(lab, metrics).is_some_and(|h| h >= done_at.len())
                });
                ok.then(|| t.elapsed())
            }
            // Nothing to re-adopt: it keeps no state.
            Impl::Upstream => None,
        };
        d.wait_serving(Duration::from_secs(30));
        let serving = t.elapsed();
        std::thread::sleep(Duration::from_millis(300));
        let (r, _) = d.footprint();
        let h = match which {
            Impl::Xdhcp => held(lab, metrics).unwrap_or(0),
            Impl::Upstream => 0,
        };
        progress!(
            "{}: stopped in {:.0} ms; serving after {:.0} ms; every lease held again after {}; {h} held, RSS {r} KiB",
            which.name(),
            stop.as_secs_f64() * 1e3,
            serving.as_secs_f64() * 1e3,
            adopted.map_or_else(
                || "never".to_owned(),
                |a| format!("{:.0} ms", a.as_secs_f64() * 1e3)
            ),
        );
        if signal == "SIGTERM" {
            arp.push((
                "the SIGTERM restart",
                arp_phase(lab, which, "the SIGTERM restart", arp0),
            ));
        }
        restarts.push(Restart {
            recovery_log: recovery_log(&d.log),
            stop,
            down,
            adopted,
            held: h,
            rss: r,
        });
    }

    // The storm: the server's view of renewals after the start past T1.
    // Through the spread window after every lease is held again, and a
    // grace after it; longer while renewals still arrive (a server slower
    // than the storm works through its backlog), until none came for
    // RENEW_QUIET (no retransmission is due that soon: the next is half the
    // time to T2 away).
    let mut wait_until =
        (storm_start + Duration::from_secs(30)).max(Instant::now() + FUZZ + RENEW_GRACE);
    progress!(
        "{}: watching the server's leases through the storm ({:.0} s more)…",
        which.name(),
        wait_until
            .saturating_duration_since(Instant::now())
            .as_secs_f64()
    );
    let mut renewed: HashMap<[u8; 6], f64> = HashMap::new();
    let cap = Instant::now() + Duration::from_mins(2);
    while Instant::now() < wait_until && renewed.len() < granted.len() {
        for l in dnsmasq.leases() {
            if granted.get(&l.mac).is_some_and(|e| l.expires_unix > *e) {
                renewed.entry(l.mac).or_insert_with(|| {
                    wait_until = wait_until.max((Instant::now() + RENEW_QUIET).min(cap));
                    storm_start.elapsed().as_secs_f64()
                });
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let missed = granted.len() - renewed.len();
    arp.push((
        "the renewal storm",
        arp_phase(lab, which, "the renewal storm", arp0),
    ));
    // The server writes its lease file before it sends the ACK: give the
    // agent a moment to take the last ones.
    std::thread::sleep(Duration::from_secs(2));
    let counters = (which == Impl::Xdhcp).then(|| {
        let text = scrape(lab, metrics).unwrap_or_default();
        (
            bench::metric(&text, "xdhcp_renewals_total", ""),
            bench::metric(&text, "xdhcp_failures_total", ""),
        )
    });
    progress!(
        "{}: {} renewals seen by the server, {missed} missed",
        which.name(),
        renewed.len()
    );
    let mut renewed_at: Vec<f64> = renewed.into_values().collect();
    renewed_at.sort_by(f64::total_cmp);
    // Release what is held so the next implementation starts clean (a fresh
    // server too).
    del_all(&d, &lab.clients);
    for c in &lab.clients {
        let _ = c.ns.exec_output(&["ip", "addr", "flush", "dev", &c.ifname]);
    }
    drop(d);
    drop(dnsmasq);
    Run {
        which,
        start_floor,
        add_wall,
        add_failed,
        rss,
        restarts,
        renewed_at,
        missed,
        arp,
        add_span,
        counters,
    }
}

/// `load_ms` and `total_ms` from the agent's "lease state recovered" log
/// line (logged at info; the bench runs the agent at info).
fn recovery_log(log: &Path) -> Option<(u64, u64)> {
    let raw = std::fs::read_to_string(log).ok()?;
    // Drop ANSI colour sequences (ESC [ … m) around field names.
    let mut text = String::with_capacity(raw.len());
    let mut in_escape = false;
    for ch in raw.chars() {
        match (in_escape, ch) {
            (false, '\x1b') => in_escape = true,
            (true, 'm') => in_escape = false,
            (true, _) => {}
            (false, c) => text.push(c),
        }
    }
    let line = text
        .lines()
        .rev()
        .find(|l| l.contains("lease state recovered"))?;
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .and_then(|v| v.trim_matches(|c: char| !c.is_ascii_digit()).parse().ok())
    };
    Some((field("load_ms=")?, field("total_ms=")?))
}

/// Concurrent ADDs on `clients`, container ids `scale-<offset + i>`.
fn burst(d: &Daemon, clients: &[LabClient], offset: usize) -> Vec<(usize, Result<(), String>)> {
    std::thread::scope(|s| {
        let handles: Vec<_> = clients
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let id = offset + i;
                s.spawn(move || (id, d.cni("ADD", &format!("scale-{id}"), c).map(|_| ())))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("ADD thread"))
            .collect()
    })
}

fn del_all(d: &Daemon, clients: &[LabClient]) {
    for (c, chunk) in clients.chunks(CHUNK).enumerate() {
        std::thread::scope(|s| {
            for (i, cl) in chunk.iter().enumerate() {
                s.spawn(move || {
                    let _ = d.cni("DEL", &format!("scale-{}", c * CHUNK + i), cl);
                });
            }
        });
    }
}

/// Renewals per second, as (second, count) points.
fn per_second(at: &[f64]) -> Vec<(f64, f64)> {
    let Some(last) = at.last() else {
        return Vec::new();
    };
    let mut buckets = vec![0u32; *last as usize + 2];
    for t in at {
        buckets[*t as usize] += 1;
    }
    let first = at[0] as usize;
    buckets
        .iter()
        .enumerate()
        .skip(first.saturating_sub(2))
        .map(|(s, c)| (s as f64, f64::from(*c)))
        .collect()
}

#[allow(clippy::too_many_lines, reason = "one table")]
fn report(runs: &[Run], n: usize, neigh_note: &str) {
    let get = |w: Impl| runs.iter().find(|r| r.which == w);
    let (up, xd) = (get(Impl::Upstream), get(Impl::Xdhcp));
    let cell = |r: Option<&Run>, f: &dyn Fn(&Run) -> String| r.map_or_else(|| "–".to_owned(), f);
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# A thousand leases through a restart: xdhcp vs. upstream `dhcp` ({})\n",
        bench::upstream().display()
    );
    let _ = writeln!(
        md,
        "Same testbed, same run: {n} pod namespaces with a veth each into one lab bridge; {}; dnsmasq \
         `--no-ping`, a /20 pool, {LEASE_SECS} s leases, T1 {T1_SECS} s. ADDs 100 at a time. \
         Renewals as the server saw them (its lease file: the expiry moved on). Machine: {} cores; \
         {neigh_note}.\n",
        if uplink_capture() {
            "the server in its own namespace behind the bridge's uplink port, the xdhcp agent in the \
             bridge's namespace capturing at the uplink (`--uplink physnet1=up0`) and guarding every \
             pod's port, the upstream daemon entering each pod's namespace itself"
        } else {
            "the server on the bridge, the xdhcp agent in the bridge's namespace capturing on each \
             pod's interface"
        },
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get)
    );
    let _ = writeln!(
        md,
        "| measure | upstream | xdhcp | ratio |\n|---|---|---|---|"
    );
    let mut row = |what: String, u: String, x: String, ratio: String| {
        let _ = writeln!(md, "| {what} | {u} | {x} | {ratio} |");
    };
    let ms = |d: Duration| format!("{:.0}", d.as_secs_f64() * 1e3);
    row(
        "start-up with no leases, exec → serving (ms): the floor under a restart".into(),
        cell(up, &|r| ms(r.start_floor)),
        cell(xd, &|r| ms(r.start_floor)),
        String::new(),
    );
    let adds = |r: &Run| {
        format!(
            "{:.2} / {} (first to last success {:.1}–{:.1} s)",
            r.add_wall.as_secs_f64(),
            r.add_failed,
            r.add_span.0,
            r.add_span.1
        )
    };
    row(
        format!("{n} ADDs, 100 at a time: wall (s) / failures"),
        cell(up, &adds),
        cell(xd, &adds),
        match (up, xd) {
            (Some(u), Some(x)) => format!(
                "{:.1}× faster",
                u.add_wall.as_secs_f64() / x.add_wall.as_secs_f64().max(1e-9)
            ),
            _ => String::new(),
        },
    );
    let last_rss = |r: &Run| r.rss.last().copied().unwrap_or_default();
    row(
        format!("RSS (KiB) / threads holding {n} leases"),
        cell(up, &|r| format!("{} / {}", last_rss(r).1, last_rss(r).2)),
        cell(xd, &|r| format!("{} / {}", last_rss(r).1, last_rss(r).2)),
        match (up, xd) {
            (Some(u), Some(x)) => format!(
                "{:.2}× the memory",
                last_rss(x).1 as f64 / last_rss(u).1.max(1) as f64
            ),
            _ => String::new(),
        },
    );
    for (i, signal) in ["SIGTERM", "SIGKILL"].iter().enumerate() {
        let rs = |r: &Run| {
            r.restarts.get(i).map_or_else(
                || "–".to_owned(),
                |x| {
                    format!(
                        "stop {} ms{}; all held again after {}{}; {} held; RSS {} KiB",
                        ms(x.stop),
                        x.down.map_or_else(String::new, |d| format!(
                            "; down {:.1} s, until every lease was past T1",
                            d.as_secs_f64()
                        )),
                        x.adopted
                            .map_or_else(|| "never".to_owned(), |a| format!("{} ms", ms(a))),
                        x.recovery_log.map_or_else(String::new, |(l, t)| format!(
                            " (recovery itself {t} ms, reading the records {l} ms)"
                        )),
                        x.held,
                        x.rss
                    )
                },
            )
        };
        let ratio = xd
            .and_then(|x| x.restarts.get(i))
            .and_then(|x| x.adopted)
            .map(|a| {
                format!(
                    "{:.1}× the start-up floor",
                    a.as_secs_f64() / xd.map_or(1.0, |x| x.start_floor.as_secs_f64()).max(1e-9)
                )
            })
            .unwrap_or_default();
        row(
            format!("restart with {signal} holding {n} leases"),
            cell(up, &rs),
            cell(xd, &rs),
            ratio,
        );
    }
    let storm = |r: &Run| {
        let at = &r.renewed_at;
        let quantile = |f: f64| {
            at.get(((at.len() as f64 - 1.0) * f).round() as usize)
                .copied()
        };
        let peak = per_second(at).iter().map(|p| p.1).fold(0.0, f64::max);
        let spread = match (quantile(0.0), quantile(0.5), quantile(1.0)) {
            (Some(first), Some(median), Some(last)) => format!(
                "; first {first:.1} s, median {median:.1} s, last {last:.1} s after the start; \
                 widest 1-s bucket {peak:.0}"
            ),
            _ => String::new(),
        };
        let renewed = format!("{} renewed, {} missed{spread}", at.len(), r.missed);
        match r.which {
            Impl::Xdhcp => renewed,
            Impl::Upstream => format!(
                "– (keeps no leases across a restart, so it has nothing to renew; \
                 the server saw {renewed})"
            ),
        }
    };
    row(
        format!(
            "renewal storm: every lease past T1 when the daemon starts (server's view, \
             until {} s after the spread window and {} s without a new renewal)",
            RENEW_GRACE.as_secs(),
            RENEW_QUIET.as_secs()
        ),
        cell(up, &storm),
        cell(xd, &storm),
        String::new(),
    );
    let phases: Vec<&str> =
        runs.iter()
            .flat_map(|r| r.arp.iter().map(|p| p.0))
            .fold(Vec::new(), |mut v, p| {
                if !v.contains(&p) {
                    v.push(p);
                }
                v
            });
    for phase in phases {
        let arp = |r: &Run| {
            r.arp
                .iter()
                .find(|p| p.0 == phase)
                .and_then(|p| p.1)
                .map_or_else(
                    || "–".to_owned(),
                    |d| {
                        format!(
                            "{} / {} / {} / {}",
                            d.arp.table_fulls, d.arp.forced_gc_runs, d.backlog, d.server_rcvbuf
                        )
                    },
                )
        };
        row(
            format!(
                "kernel drops during {phase}: ARP entries refused (table full) / ARP forced GC \
                 runs / packets dropped at a full input backlog (these three machine-wide) / \
                 datagrams dropped at dnsmasq's full receive buffer"
            ),
            cell(up, &arp),
            cell(xd, &arp),
            String::new(),
        );
    }
    row(
        "agent counters at the end: renewals / failures".into(),
        "–".into(),
        cell(xd, &|r| {
            r.counters
                .map_or_else(|| "–".to_owned(), |(a, b)| format!("{a:.0} / {b:.0}"))
        }),
        String::new(),
    );
    println!("\n{md}");
    // Plots.
    let series = |f: &dyn Fn(&Run) -> Vec<(f64, f64)>| -> Vec<Series> {
        runs.iter()
            .map(|r| Series {
                label: r.which.name().to_owned(),
                points: f(r),
            })
            .collect()
    };
    if let Some(p) = bench::results_path("scale-rss.svg") {
        bench::plot_lines(
            &p,
            "Daemon RSS against leases held",
            "leases held",
            "RSS (MiB)",
            &series(&|r| {
                r.rss
                    .iter()
                    .map(|(l, k, _)| (*l as f64, *k as f64 / 1024.0))
                    .collect()
            }),
        );
        let _ = writeln!(md, "\n![RSS against leases](scale-rss.svg)");
    }
    if let Some(p) = bench::results_path("scale-renewals.svg") {
        bench::plot_lines(
            &p,
            "Renewals the server saw after a start past every T1, per second",
            "seconds after the start past T1",
            "renewals / s",
            &series(&|r| per_second(&r.renewed_at)),
        );
        let _ = writeln!(md, "\n![Renewals per second](scale-renewals.svg)");
    }
    bench::write_result("scale.md", &md);
}
