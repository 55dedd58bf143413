//! `cargo xtask bench flood`: a flood of well-formed DHCP replies that
//! belong to no lease, at a leased port and at an uplink — the daemon's CPU
//! under it, and a 100-ADD burst during it against the same burst without
//! it — xdhcp side by side with the upstream CNI `dhcp` daemon, in one run.
//!
//! Testbed (the harness of `bench cni`): a node namespace holding a Linux
//! bridge `br0`; dnsmasq (`--no-ping`, 120 s leases, its lease file on
//! tmpfs) in a server namespace behind a veth whose bridge end is `up0`;
//! 100 pod namespaces for the bursts and 4 more whose pods hold a lease
//! for the whole phase (the flood's targets), each with a veth on the
//! bridge. Every plugin is exec'd as a runtime execs an IPAM plugin, with
//! the upstream plugin's network config for both. Three phases, each with
//! a fresh daemon: the upstream daemon; xdhcp capturing on each pod's
//! interface (the flood meets the program on the leased ports); xdhcp with
//! `--uplink up0` (the flood meets the uplink program first).
//!
//! The sender runs in the server namespace, on the server's own interface
//! (so every frame enters the node through `up0`, as a rogue or broken
//! server's would): DHCPACKs (UDP 67 → 68, a full BOOTP message with the
//! cookie and options) to the four leased pods' MACs and addresses, each
//! with a fresh random xid, from one `AF_PACKET` socket with
//! `PACKET_QDISC_BYPASS`, in `sendmmsg` batches of 64 frames, paced to the
//! target rate (`XDHCP_BENCH_FLOOD_PPS`, default 100 000) by the clock: a
//! batch goes when the rate is due for it. The rate it achieves is
//! reported beside the target.
//!
//! Per phase: three 100-ADD bursts (each then its DELs) with no flood; the flood on;
//! after one second, the daemon's CPU (user + system from
//! `/proc/<pid>/stat`) over `XDHCP_BENCH_FLOOD_SECS` (default 15) seconds
//! with nothing else going on, as % of one core; then three 100-ADD
//! bursts during the flood; the flood off. Each round is followed by its
//! floor under the same condition (as many plugin execs doing no DHCP, then
//! the server's own exchanges straight from this process), so the flood's
//! cost to the machine itself stands beside its cost to the ADDs. The burst
//! ratio is flood ÷ quiet, of the median rounds, beside the floor's. For xdhcp, its own counters over the phase say where the frames
//! went (the kernel program's outcomes, the replies dropped in user space).
//!
//! Results: `$XDHCP_BENCH_RESULTS/flood.md`.
#![expect(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark report, and its warnings"
)]
#![expect(
    clippy::cast_precision_loss,
    reason = "counts far below 2^52 turned into rates"
)]

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    net::{Ipv4Addr, SocketAddr},
    os::fd::{AsRawFd as _, OwnedFd},
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use xdhcp_tests::{
    bench::{self, Daemon, DaemonOptions, Impl},
    cni_burst::{burst, del_all, exec_floor, raw_dora_burst, settle},
    frames::XID_AT,
    netns::{Lab, LabClient},
    progress,
    servers::{Dnsmasq, DnsmasqConfig},
};

/// Concurrent ADDs of a burst.
const BURST: usize = 100;
/// Leased pods the flood is sent to.
const TARGETS: usize = 4;
const LEASE_SECS: u32 = 120;
const FAKE_SERVER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 254);
const FLOOD_MAC: [u8; 6] = [0x02, 0xf1, 0x00, 0x00, 0x00, 0x01];
/// Frames per `sendmmsg`.
const BATCH: usize = 64;
/// Bursts per condition (quiet, flood); the median is reported.
const ROUNDS: usize = 3;
/// Longer than the agent's kernel counter poll (5 s).
const COUNTER_SETTLE: Duration = Duration::from_secs(6);

/// A phase's daemon.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Config {
    Upstream,
    /// xdhcp capturing on each pod's interface.
    Port,
    /// xdhcp with `--uplink up0`.
    Uplink,
}

impl Config {
    fn all() -> Vec<Config> {
        bench::impls()
            .into_iter()
            .flat_map(|i| match i {
                Impl::Upstream => vec![Config::Upstream],
                Impl::Xdhcp => vec![Config::Port, Config::Uplink],
            })
            .collect()
    }

    fn name(self) -> &'static str {
        match self {
            Config::Upstream => "upstream dhcp daemon",
            Config::Port => "xdhcp, flood at the leased ports",
            Config::Uplink => "xdhcp --uplink up0, flood at the uplink",
        }
    }

    fn imp(self) -> Impl {
        match self {
            Config::Upstream => Impl::Upstream,
            Config::Port | Config::Uplink => Impl::Xdhcp,
        }
    }
}

/// One phase's figures.
struct Phase {
    config: Config,
    target_pps: u64,
    achieved_pps: f64,
    sent: u64,
    sender_cpu_ms: u64,
    /// Daemon CPU over the idle flood window, % of one core.
    cpu_pct: f64,
    /// Daemon CPU over the same window length without a flood, % of one core.
    idle_cpu_pct: f64,
    quiet: Rounds,
    flood: Rounds,
    /// Counter deltas over the phase (xdhcp).
    counters: BTreeMap<String, f64>,
}

/// One burst and the floor measured right after it.
struct Round {
    wall: Duration,
    floor: Duration,
    failed: usize,
    floor_failed: usize,
    first_error: Option<String>,
}

/// A condition's rounds (quiet, or during the flood).
struct Rounds {
    /// The median of the rounds' burst walls.
    wall: Duration,
    /// The median of the rounds' floors.
    floor: Duration,
    /// Every round's burst wall and floor, in order.
    walls: Vec<(Duration, Duration)>,
    failed: usize,
    /// The floor's own exchanges that did not complete.
    floor_failed: usize,
    first_error: Option<String>,
}

fn main() {
    let xdhcp = bench::xdhcp_bin();
    let _ = bench::upstream();
    xdhcp_tests::netns::sweep_leftovers();
    let secs: u64 = env_or("XDHCP_BENCH_FLOOD_SECS", 15);
    let pps: u64 = env_or("XDHCP_BENCH_FLOOD_PPS", 100_000);
    progress!(
        "building the harness: node namespace, bridge, server namespace, {} pod namespaces…",
        BURST + TARGETS
    );
    let lab = Lab::builder()
        .clients(BURST + TARGETS)
        .server_behind_uplink()
        .build();
    let dnsmasq = Dnsmasq::start(
        lab.dhcp_ns(),
        DnsmasqConfig {
            interface: lab.dhcp_ifname().to_owned(),
            on_tmpfs: true,
            range: (Ipv4Addr::new(192, 0, 2, 10), Ipv4Addr::new(192, 0, 2, 250)),
            netmask: Ipv4Addr::new(255, 255, 255, 0),
            lease_secs: LEASE_SECS,
            no_ping: true,
            extra_args: vec!["--dhcp-lease-max=4000".to_owned()],
            ..DnsmasqConfig::default()
        },
    );
    let mut phases = Vec::new();
    for config in Config::all() {
        progress!("phase: {}…", config.name());
        phases.push(run(
            config,
            &xdhcp,
            &lab,
            &dnsmasq,
            pps,
            Duration::from_secs(secs),
        ));
    }
    report(&phases, secs);
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn run(
    config: Config,
    xdhcp: &Path,
    lab: &Lab,
    dnsmasq: &Dnsmasq,
    pps: u64,
    secs: Duration,
) -> Phase {
    let metrics = bench::free_local_addr();
    let mut opts = DaemonOptions {
        node_ns: Some(lab.server.name().to_owned()),
        upstream_dialect: true,
        ..DaemonOptions::default()
    };
    if config.imp() == Impl::Xdhcp {
        opts.metrics = Some(metrics);
    }
    if config == Config::Uplink {
        opts.agent_args = vec!["--uplink".to_owned(), Lab::UPLINK.to_owned()];
    }
    let d = Daemon::start_with(config.imp(), xdhcp, &opts);
    let (pods, targets) = lab.clients.split_at(BURST);
    for (i, c) in targets.iter().enumerate() {
        if let Err(e) = d.cni("ADD", &format!("target-{i}"), c) {
            panic!("{}: the target's ADD failed: {e}", config.name());
        }
    }
    bench::configure_leased(targets, &dnsmasq.leases(), 24);
    let dest: Vec<([u8; 6], Ipv4Addr)> = targets
        .iter()
        .map(|c| {
            let ip = dnsmasq
                .lease_for(c.mac)
                .unwrap_or_else(|| panic!("{}: no lease for a target", config.name()))
                .ip;
            (c.mac, ip)
        })
        .collect();
    // Unmeasured: the first exec of the plugin may read it from disk.
    let _ = d.cni("ADD", "warmup", &pods[0]);
    let _ = d.cni("DEL", "warmup", &pods[0]);
    settle(&|| dnsmasq.leases(), &pods[..1]);
    // The leases move onto the ring buffer a little after BOUND.
    std::thread::sleep(Duration::from_secs(2));
    let pid = d.process.pid().expect("daemon running");
    let before = (config.imp() == Impl::Xdhcp).then(|| {
        std::thread::sleep(COUNTER_SETTLE);
        counters(lab.server.path(), metrics)
    });

    let cpu0 = bench::cpu_ms_of(pid);
    std::thread::sleep(secs);
    let idle_cpu_pct = (bench::cpu_ms_of(pid) - cpu0) as f64 / secs.as_secs_f64() / 10.0;

    let quiet = rounds(&d, dnsmasq, pods, "quiet");

    let stop = Arc::new(AtomicBool::new(false));
    let sender = {
        let stop = stop.clone();
        let ns = lab.dhcp_ns().path().to_path_buf();
        let ifname = lab.dhcp_ifname().to_owned();
        std::thread::spawn(move || send_flood(&ns, &ifname, pps, &dest, &stop))
    };
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    let cpu0 = bench::cpu_ms_of(pid);
    let t0 = Instant::now();
    std::thread::sleep(secs);
    let cpu_pct = (bench::cpu_ms_of(pid) - cpu0) as f64 / t0.elapsed().as_secs_f64() / 10.0;
    let flood = rounds(&d, dnsmasq, pods, "flood");
    stop.store(true, Ordering::SeqCst);
    let (sent, sender_cpu_ms) = sender.join().expect("sender");
    let achieved_pps = sent as f64 / started.elapsed().as_secs_f64();
    let counters = before.map_or_else(BTreeMap::new, |b| {
        std::thread::sleep(COUNTER_SETTLE);
        changed(&b, counters(lab.server.path(), metrics))
    });
    say(
        config,
        achieved_pps,
        pps,
        cpu_pct,
        idle_cpu_pct,
        &quiet,
        &flood,
    );
    for (i, c) in targets.iter().enumerate() {
        let _ = d.cni("DEL", &format!("target-{i}"), c);
        let _ = c.ns.exec_output(&["ip", "addr", "flush", "dev", &c.ifname]);
    }
    settle(&|| dnsmasq.leases(), targets);
    drop(d);
    Phase {
        config,
        target_pps: pps,
        achieved_pps,
        sent,
        sender_cpu_ms,
        cpu_pct,
        idle_cpu_pct,
        quiet,
        flood,
        counters,
    }
}

/// The phase's line of progress.
fn say(
    config: Config,
    achieved_pps: f64,
    pps: u64,
    cpu_pct: f64,
    idle_cpu_pct: f64,
    quiet: &Rounds,
    flood: &Rounds,
) {
    progress!(
        "{}: {achieved_pps:.0} pps of {pps}; CPU {cpu_pct:.2} % of a core (no flood {idle_cpu_pct:.2} %); \
         100 ADDs {:.0} ms quiet (floor {:.0}), {:.0} ms during the flood (floor {:.0}): \
         {:.2}× (the floor {:.2}×)",
        config.name(),
        ms(quiet.wall),
        ms(quiet.floor),
        ms(flood.wall),
        ms(flood.floor),
        ratio(flood.wall, quiet.wall),
        ratio(flood.floor, quiet.floor),
    );
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64()
}

/// [`ROUNDS`] bursts on `clients`, each followed by its DELs, the server's
/// release of every lease, and the round's floor (as many plugin execs that
/// do no DHCP, then the server's own exchanges from the same namespaces:
/// the machine's own cost of the same work under the same conditions).
fn rounds(d: &Daemon, dnsmasq: &Dnsmasq, clients: &[LabClient], tag: &str) -> Rounds {
    let leases = || dnsmasq.leases();
    let mut all: Vec<Round> = (0..ROUNDS)
        .map(|r| {
            let tag = format!("{tag}-{r}");
            let b = burst(d, clients, &tag);
            del_all(d, clients, &tag);
            settle(&leases, clients);
            let exec = exec_floor(d, clients);
            let (dora, dora_failed) = raw_dora_burst(clients, &leases, 1);
            Round {
                wall: b.wall,
                floor: exec + dora,
                failed: b.failed,
                floor_failed: dora_failed,
                first_error: b.first_error,
            }
        })
        .collect();
    let walls = all.iter().map(|r| (r.wall, r.floor)).collect();
    let failed = all.iter().map(|r| r.failed).sum();
    let floor_failed = all.iter().map(|r| r.floor_failed).sum();
    let first_error = all.iter_mut().find_map(|r| r.first_error.take());
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    Rounds {
        wall: median(all.iter().map(|r| r.wall).collect()),
        floor: median(all.iter().map(|r| r.floor).collect()),
        walls,
        failed,
        floor_failed,
        first_error,
    }
}

/// The counters of the agent's `/metrics` (served in the node namespace
/// `ns`) this bench accounts frames with.
fn counters(ns: &Path, metrics: SocketAddr) -> BTreeMap<String, f64> {
    let text = xdhcp::sys::netns::run_in_netns(ns, move || bench::http_get(metrics, "/metrics"))
        .ok()
        .flatten()
        .unwrap_or_default();
    let mut out = BTreeMap::new();
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((key, value)) = l.rsplit_once(' ') else {
            continue;
        };
        let interesting = ["xdhcp_kernel_frames_total{", "xdhcp_dropped_replies_total{"]
            .iter()
            .any(|p| key.starts_with(p));
        if interesting && let Ok(v) = value.parse::<f64>() {
            out.insert(key.to_owned(), v);
        }
    }
    out
}

/// The counters of `now` that moved since `before`, by how much.
fn changed(before: &BTreeMap<String, f64>, now: BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    now.into_iter()
        .map(|(k, v)| {
            let d = v - before.get(&k).copied().unwrap_or(0.0);
            (k, d)
        })
        .filter(|(_, v)| *v != 0.0)
        .collect()
}

/// CPU time of the calling thread, in ms.
fn thread_cpu_ms() -> u64 {
    // SAFETY: getrusage fills the struct it is given.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &raw mut ru);
        ru
    };
    let ms = |t: libc::timeval| t.tv_sec as u64 * 1000 + t.tv_usec as u64 / 1000;
    ms(ru.ru_utime) + ms(ru.ru_stime)
}

/// A DHCPACK for `mac`/`ip` from `FAKE_SERVER`, to `mac`/`ip` (the xid is
/// set per frame at [`XID_AT`]).
fn ack(mac: [u8; 6], ip: Ipv4Addr) -> Vec<u8> {
    let reply = xdhcp_tests::frames::Reply {
        kind: dhcproto::v4::MessageType::Ack,
        xid: 0,
        chaddr: mac,
        yiaddr: ip,
        server: FAKE_SERVER,
        mask: Ipv4Addr::new(255, 255, 255, 0),
    };
    xdhcp_tests::frames::server_reply(FLOOD_MAC, mac, ip, &reply)
}

/// Sends DHCPACKs with fresh random xids to `dest` in turn, `BATCH` frames
/// per `sendmmsg`, at `pps` until `stop`; returns the frames sent and the
/// sender's CPU time (ms).
fn send_flood(
    ns: &Path,
    ifname: &str,
    pps: u64,
    dest: &[([u8; 6], Ipv4Addr)],
    stop: &AtomicBool,
) -> (u64, u64) {
    let ifname = ifname.to_owned();
    xdhcp::sys::netns::run_in_netns(ns, move || {
        let fd = sender_socket(&ifname);
        let mut frames: Vec<Vec<u8>> = (0..BATCH)
            .map(|i| {
                let (mac, ip) = dest[i % dest.len()];
                ack(mac, ip)
            })
            .collect();
        let mut rng: u64 = 0x9e37_79b9_7f4a_7c15;
        let started = Instant::now();
        let mut sent: u64 = 0;
        while !stop.load(Ordering::SeqCst) {
            // The clock says when the next batch is due.
            let due = Duration::from_secs_f64(sent as f64 / pps as f64);
            let now = started.elapsed();
            if let Some(ahead) = due.checked_sub(now) {
                std::thread::sleep(ahead);
            }
            for f in &mut frames {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                f[XID_AT..XID_AT + 4].copy_from_slice(&(rng as u32).to_be_bytes());
            }
            let mut iov: Vec<libc::iovec> = frames
                .iter_mut()
                .map(|f| libc::iovec {
                    iov_base: f.as_mut_ptr().cast(),
                    iov_len: f.len(),
                })
                .collect();
            // SAFETY: zeroed mmsghdr is valid; each points at one iovec we own.
            let mut msgs: Vec<libc::mmsghdr> = iov
                .iter_mut()
                .map(|v| {
                    let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
                    m.msg_hdr.msg_iov = std::ptr::from_mut(v);
                    m.msg_hdr.msg_iovlen = 1;
                    m
                })
                .collect();
            // SAFETY: the headers and buffers outlive the call.
            let n = unsafe {
                libc::sendmmsg(
                    fd.as_raw_fd(),
                    msgs.as_mut_ptr(),
                    u32::try_from(msgs.len()).expect("a small batch"),
                    0,
                )
            };
            if let Ok(n) = u64::try_from(n) {
                sent += n;
            } else {
                // A full queue (ENOBUFS): give the receivers a moment.
                std::thread::yield_now();
            }
        }
        (sent, thread_cpu_ms())
    })
    .expect("sender in the server namespace")
}

/// An `AF_PACKET` socket bound to `ifname` for sending, past the qdisc.
fn sender_socket(ifname: &str) -> OwnedFd {
    let ifindex = nix::net::if_::if_nametoindex(ifname)
        .unwrap_or_else(|e| panic!("no interface {ifname}: {e}"));
    let fd = xdhcp_tests::netns::packet_socket_here(ifindex, 0, None)
        .unwrap_or_else(|e| panic!("AF_PACKET socket on {ifname}: {e}"));
    let one: libc::c_int = 1;
    // SAFETY: setting an int option on a socket we own.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_QDISC_BYPASS,
            std::ptr::from_ref(&one).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        eprintln!(
            "  PACKET_QDISC_BYPASS refused ({}): sending through the qdisc",
            std::io::Error::last_os_error()
        );
    }
    fd
}

fn report(phases: &[Phase], secs: u64) {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# A flood of replies that belong to no lease: xdhcp vs. upstream `dhcp` ({})\n",
        bench::upstream().display()
    );
    let _ = writeln!(
        md,
        "One run, one harness (the `bench cni` one: node namespace with `br0`, dnsmasq behind the \
         uplink `up0`, 100 burst pods and 4 leased target pods). The sender, in the server's \
         namespace, sends well-formed DHCPACKs with random xids to the 4 leased pods (their MACs \
         and addresses) from one `AF_PACKET` socket (`PACKET_QDISC_BYPASS`, `sendmmsg` batches of \
         {BATCH}), paced to the target by the clock; every frame enters the node through `up0`. \
         Daemon CPU: user + system from `/proc/<pid>/stat` over {secs} s of flood with nothing \
         else going on (beside the same window without a flood), % of one core; softirq work done \
         in the sender's context is in nobody's figure. The 100-ADD burst: wall time of 100 \
         concurrent plugin execs (then their DELs and the server's release), {ROUNDS} rounds \
         quiet and then {ROUNDS} during the flood, in the same phase; the table has the median \
         round. Each round's floor, measured right after it under the same condition: 100 \
         concurrent execs of the same plugin doing no DHCP (`CNI_COMMAND=VERSION`) plus the \
         server's own 100 DORAs from the same pods' namespaces, back to back, straight from the \
         bench process (no plugin, no daemon): what the flood costs the machine itself. Machine: \
         2 cores, shared by the sender, the kernel's handling of the flood, the server and the \
         daemon.\n"
    );
    if let Ok(commit) = std::env::var("XDHCP_BENCH_COMMIT") {
        let _ = writeln!(md, "Commit: `{commit}`.\n");
    }
    md.push_str(
        "| daemon | target pps | achieved pps | sender CPU (ms) | daemon CPU % of a core, flood (none) | 100 ADDs quiet: median / its floor (ms) | 100 ADDs in flood: median / its floor (ms) | burst: flood ÷ quiet | floor: flood ÷ quiet | burst ÷ floor: quiet, flood | failed ADDs (floor DORAs) |\n",
    );
    md.push_str("|---|---|---|---|---|---|---|---|---|---|---|\n");
    for p in phases {
        let _ = writeln!(
            md,
            "| {} | {} | {:.0} | {} | {:.2} ({:.2}) | {:.0} / {:.0} | {:.0} / {:.0} | {:.2}× | {:.2}× | {:.2}×, {:.2}× | {} / {} ({} / {}) |",
            p.config.name(),
            p.target_pps,
            p.achieved_pps,
            p.sender_cpu_ms,
            p.cpu_pct,
            p.idle_cpu_pct,
            ms(p.quiet.wall),
            ms(p.quiet.floor),
            ms(p.flood.wall),
            ms(p.flood.floor),
            ratio(p.flood.wall, p.quiet.wall),
            ratio(p.flood.floor, p.quiet.floor),
            ratio(p.quiet.wall, p.quiet.floor),
            ratio(p.flood.wall, p.flood.floor),
            p.quiet.failed,
            p.flood.failed,
            p.quiet.floor_failed,
            p.flood.floor_failed,
        );
    }
    md.push('\n');
    for p in phases {
        let list = |r: &Rounds| {
            r.walls
                .iter()
                .map(|(w, f)| format!("{:.0} (floor {:.0})", ms(*w), ms(*f)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(
            md,
            "- {}: 100-ADD bursts, ms per round: quiet {}; during the flood {}",
            p.config.name(),
            list(&p.quiet),
            list(&p.flood)
        );
        for (what, b) in [("quiet", &p.quiet), ("flood", &p.flood)] {
            if let Some(e) = &b.first_error {
                let _ = writeln!(
                    md,
                    "- {}, {what} burst: first failure: `{e}`",
                    p.config.name()
                );
            }
        }
        if p.counters.is_empty() {
            continue;
        }
        let list: Vec<String> = p
            .counters
            .iter()
            .map(|(k, v)| format!("`{k}` +{v:.0}"))
            .collect();
        let _ = writeln!(
            md,
            "- {} ({} frames sent): {}",
            p.config.name(),
            p.sent,
            list.join(", ")
        );
    }
    print!("{md}");
    bench::write_result("flood.md", &md);
}
