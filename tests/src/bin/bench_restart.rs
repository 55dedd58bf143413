//! `cargo xtask bench restart`: the agent restarted under 1000 leases whose
//! renewals never stop — a cold start, a restart with its pins, and an
//! upgrade's start (programs loaded again) side by side in one run.
//!
//! Testbed: one dnsmasq (a /20 pool, 120 s leases, T1 10 s: with 1000
//! leases, about 100 renewals a second, so REQUESTs and ACKs are in flight
//! at every instant) in its own namespace behind the lab bridge's uplink
//! port, 1000 pod namespaces with a veth each into the bridge, and the
//! agent in the bridge's namespace capturing at the uplink
//! (`--uplink physnet1=up0`), its `--bpffs-dir` on a bpffs of the run's own.
//!
//! After the ADDs, for each start (the agent stopped with SIGTERM first):
//! - **cold start**: `xdhcp unpin` after the stop, so nothing is handed over
//!   (as for a first install);
//! - **restart with pins**: the same build again;
//! - **upgrade**: the program pins removed after the stop, so the agent
//!   loads and verifies its programs as another build does (it finds none of
//!   its own) — or `XDHCP_BENCH_RESTART_UPGRADE_BIN`, a second build, started
//!   instead.
//!
//! Measured from the new process's exec: until it answers a CNI request
//! over its socket (the plugin's STATUS), and until every lease is held
//! again (`/metrics`); and the replies lost: the server's ACKs (its log,
//! `--log-dhcp`, names each one's xid) from the stop until two T1 after the
//! start whose xid completed no renewal (or acquisition) in either agent's
//! log (each `renewed` and `bound` line names its xid). The floor beside them: a bare exec of the
//! binary (`xdhcp --version`).
//!
//! The test bed itself must not lose what it counts: a thousand pods and a
//! server resolving every leased address overflow the kernel's one ARP
//! table (`gc_thresh3`, 1024 entries for all namespaces), and dnsmasq's
//! socket buffer (208 KiB by default) overflows in a restart's burst of
//! renewals — an ACK the server logs but cannot send, or a REQUEST it never
//! sees, would count against the agent. So the run raises both for its
//! duration, as `bench scale` does (restored at the end, also on panic),
//! and reports the kernel's drops per start beside the losses
//! (`XDHCP_BENCH_RESTART_LAB=leave` keeps the machine's values).
//!
//! `XDHCP_BENCH_RESTART_N` (default 1000) and `XDHCP_BENCH_RESTART_T1`
//! (default 10) change the population and T1 while developing;
//! `XDHCP_BENCH_LOG_DIR` keeps the agents' logs, and there the server's
//! log (`dnsmasq.log`) and each start's lost xids (`lost-<start>.txt`).

#![expect(clippy::print_stdout, reason = "a benchmark report")]

use std::collections::HashSet;
use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use xdhcp_tests::bench::{self, Daemon, DaemonOptions, Impl};
use xdhcp_tests::neigh::{self, ArpStat, RaisedSysctl, RaisedThresholds};
use xdhcp_tests::netns::{Lab, LabClient};
use xdhcp_tests::progress;
use xdhcp_tests::wait_until;

const LEASE_SECS: u32 = 120;
const CHUNK: usize = 100;
/// ARP table thresholds for the run (`bench scale`'s).
const NEIGH_RAISED: [u64; 3] = [4096, 16384, 32768];
/// The default socket receive buffer for the run: dnsmasq's socket.
const SERVER_RCVBUF: u64 = 4 << 20;
/// How long after a start's window the agents' logs are read: an ACK the
/// server logged as the window closed is taken by the agent a little later.
const LOG_SETTLE: Duration = Duration::from_secs(1);

/// One start measured.
struct Start {
    what: String,
    serving: Duration,
    all_held: Option<Duration>,
    acks: usize,
    lost: usize,
    programs: &'static str,
    /// The kernel's drops in the lab from the stop to the window's end.
    drops: Option<Drops>,
}

/// Where the lab can lose what the bench counts, machine-wide and in the
/// server's namespace.
#[derive(Clone, Copy)]
struct Drops {
    /// New ARP entries refused, the table full (machine-wide).
    arp_fulls: u64,
    /// Datagrams dropped at a full UDP receive buffer in the server's
    /// namespace (dnsmasq's socket).
    server_rcvbuf: u64,
}

impl Drops {
    fn read(lab: &Lab) -> Option<Drops> {
        Some(Drops {
            arp_fulls: ArpStat::read()?.table_fulls,
            server_rcvbuf: neigh::udp_rcvbuf_errors_in(lab.dhcp_ns())?,
        })
    }

    fn since(self, before: Drops) -> Drops {
        Drops {
            arp_fulls: self.arp_fulls.saturating_sub(before.arp_fulls),
            server_rcvbuf: self.server_rcvbuf.saturating_sub(before.server_rcvbuf),
        }
    }
}

/// A bpffs of the run's own, unmounted (lazily) on drop.
struct Bpffs(PathBuf);

impl Bpffs {
    fn mount(path: &Path) -> Self {
        std::fs::create_dir_all(path).expect("the bpffs mount point");
        nix::mount::mount(
            Some("bpf"),
            path,
            Some("bpf"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )
        .expect("mount -t bpf (needs root)");
        Self(path.to_path_buf())
    }
}

impl Drop for Bpffs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().map_or(default, |v| {
        v.parse().unwrap_or_else(|_| panic!("{name}={v}: a number"))
    })
}

#[allow(
    clippy::too_many_lines,
    reason = "one linear script: the lab, the ADDs, then each start"
)]
fn main() {
    let xdhcp = bench::xdhcp_bin();
    xdhcp_tests::netns::sweep_leftovers();
    let n = usize::try_from(env_num("XDHCP_BENCH_RESTART_N", 1000)).expect("N");
    let t1 = u32::try_from(env_num("XDHCP_BENCH_RESTART_T1", 10)).expect("T1");
    assert!(
        t1 >= 2 && t1 * 2 < LEASE_SECS,
        "T1 between 2 and {} s",
        LEASE_SECS / 2
    );
    let t2 = LEASE_SECS * 3 / 4;
    let upgrade_bin = std::env::var_os("XDHCP_BENCH_RESTART_UPGRADE_BIN").map(PathBuf::from);
    // `XDHCP_BENCH_RESTART_LAB=leave` keeps the machine's values (to see
    // what the lab itself loses).
    let raise = std::env::var("XDHCP_BENCH_RESTART_LAB").as_deref() != Ok("leave");
    let neigh = raise.then(|| {
        RaisedThresholds::raise(NEIGH_RAISED)
            .expect("raise net.ipv4.neigh.default.gc_thresh* (run as root)")
    });
    // A namespace takes rmem_default when it is created: before the lab.
    let rcvbuf = raise.then(|| {
        RaisedSysctl::raise("net.core.rmem_default", SERVER_RCVBUF)
            .expect("raise net.core.rmem_default (run as root)")
    });
    let lab_note = match (&neigh, &rcvbuf) {
        (Some(n), Some(r)) => format!(
            "the kernel's ARP table thresholds raised from {:?} to {:?} and \
             net.core.rmem_default from {} to {} bytes for the run",
            n.previous(),
            n.now,
            r.previous(),
            r.now
        ),
        _ => format!(
            "the kernel's ARP table thresholds ({:?}) and net.core.rmem_default left as the \
             machine has them (XDHCP_BENCH_RESTART_LAB=leave)",
            neigh::gc_thresholds()
        ),
    };
    progress!("{lab_note}");
    let log_dir = std::env::var_os("XDHCP_BENCH_LOG_DIR").map(PathBuf::from);
    progress!("building a lab with {n} pod namespaces behind one uplink…");
    let lab = Lab::builder()
        .server_ip(Ipv4Addr::new(198, 18, 0, 1), 20)
        .clients(n)
        .without_ipv6()
        .server_behind_uplink()
        .build();
    let dnsmasq = bench::pool_server(&lab, LEASE_SECS, t1, Some(t2));
    let state = tempfile::Builder::new()
        .prefix("xdt-bench-restart-")
        .tempdir()
        .expect("tempdir");
    let pins = Bpffs::mount(&state.path().join("bpffs"));
    let metrics = bench::free_local_addr();
    let opts = || DaemonOptions {
        // At least `info`: each `renewed` line names its xid.
        rust_log: Some(std::env::var("XDHCP_BENCH_RUST_LOG").unwrap_or_else(|_| "info".into())),
        state_in: Some(state.path().to_path_buf()),
        metrics: Some(metrics),
        no_wait: true,
        node_ns: Some(lab.server.name().to_owned()),
        agent_args: vec!["--uplink".to_owned(), format!("physnet1={}", Lab::UPLINK)],
        ovsdb: None,
        upstream_dialect: false,
        ipam_extra: None,
    };
    let floor = exec_floor(&xdhcp);
    progress!("floor: a bare exec of the binary takes {:.1} ms", ms(floor));

    progress!("starting the agent and adding {n} pods, {CHUNK} at a time…");
    let mut d = Daemon::start_with(Impl::Xdhcp, &xdhcp, &opts());
    d.wait_serving(Duration::from_mins(1));
    let failed = add_all(&d, &lab.clients);
    assert_eq!(failed, 0, "ADDs failed; log {}", d.log.display());
    bench::configure_leased(&lab.clients, &dnsmasq.leases(), 20);
    assert!(
        wait_until(Duration::from_mins(1), || held(&lab, metrics) == Some(n)),
        "not every lease held after the ADDs"
    );
    progress!("{n} leases held; renewals run for {} s first", t1 + 2);
    std::thread::sleep(Duration::from_secs(u64::from(t1) + 2));

    let mut starts = Vec::new();
    for phase in ["cold", "pins", "upgrade"] {
        let acks_before = ack_xids(&dnsmasq.log()).len();
        let drops_before = Drops::read(&lab);
        assert!(
            d.process.stop(Duration::from_secs(30)),
            "the agent did not stop on SIGTERM"
        );
        let (what, bin, programs) = match phase {
            "cold" => {
                unpin(&xdhcp, &pins.0);
                (
                    "cold start (`xdhcp unpin` after the stop: nothing handed over)".to_owned(),
                    xdhcp.clone(),
                    "loaded",
                )
            }
            "pins" => (
                "restart with pins (same build)".to_owned(),
                xdhcp.clone(),
                "from pins",
            ),
            _ => {
                if let Some(b) = &upgrade_bin {
                    (
                        format!("upgrade to a second build ({})", b.display()),
                        b.clone(),
                        "loaded",
                    )
                } else {
                    let _ = std::fs::remove_dir_all(pins.0.join("progs"));
                    (
                        "upgrade: the program pins removed (as another build finds none of its own)"
                            .to_owned(),
                        xdhcp.clone(),
                        "loaded",
                    )
                }
            }
        };
        progress!("{what}: starting…");
        let t = Instant::now();
        d = Daemon::start_with(Impl::Xdhcp, &bin, &opts());
        while !d.ready() {
            assert!(t.elapsed() < Duration::from_mins(1), "{what}: not serving");
            std::thread::sleep(Duration::from_millis(2));
        }
        let serving = t.elapsed();
        let all_held = wait_until(Duration::from_mins(2), || held(&lab, metrics) == Some(n))
            .then(|| t.elapsed());
        progress!(
            "{what}: serving after {:.0} ms, every lease held after {}",
            ms(serving),
            all_held.map_or_else(|| "never".to_owned(), |h| format!("{:.0} ms", ms(h)))
        );
        // Every lease renews at least once after the start.
        std::thread::sleep(Duration::from_secs(2 * u64::from(t1)));
        let acks: HashSet<u32> = ack_xids(&dnsmasq.log())[acks_before..]
            .iter()
            .copied()
            .collect();
        let drops = Drops::read(&lab).zip(drops_before).map(|(a, b)| a.since(b));
        std::thread::sleep(LOG_SETTLE);
        let completed = renewed_xids(state.path());
        let mut lost: Vec<u32> = acks.difference(&completed).copied().collect();
        lost.sort_unstable();
        progress!(
            "{what}: {} ACKs in the window, {} completed nothing; kernel drops: {}",
            acks.len(),
            lost.len(),
            drops.map_or_else(|| "unreadable".to_owned(), Drops::describe)
        );
        if let Some(dir) = &log_dir {
            let text = lost.iter().fold(String::new(), |mut t, x| {
                let _ = writeln!(t, "{x}");
                t
            });
            let _ = std::fs::write(dir.join(format!("lost-{phase}.txt")), text);
        }
        starts.push(Start {
            what,
            serving,
            all_held,
            acks: acks.len(),
            lost: lost.len(),
            programs,
            drops,
        });
    }
    let _ = d.process.stop(Duration::from_secs(30));
    if let Some(dir) = &log_dir {
        let _ = std::fs::write(dir.join("dnsmasq.log"), dnsmasq.log());
    }
    report(&starts, n, t1, floor, &lab_note);
    unpin(&xdhcp, &pins.0);
    drop(pins);
    // The lab goes before the sysctls it needed are restored (declared
    // after them, it drops first).
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The median of five bare execs of the binary (`--version`).
fn exec_floor(bin: &Path) -> Duration {
    let mut v: Vec<Duration> = (0..5)
        .map(|_| {
            let t = Instant::now();
            let out = Command::new(bin)
                .arg("--version")
                .env_remove("CNI_COMMAND")
                .output()
                .expect("exec the agent binary");
            assert!(out.status.success(), "xdhcp --version failed");
            t.elapsed()
        })
        .collect();
    v.sort();
    v[2]
}

/// `xdhcp unpin` on the run's pin directory.
fn unpin(bin: &Path, dir: &Path) {
    let out = Command::new(bin)
        .arg("unpin")
        .arg("--bpffs-dir")
        .arg(dir)
        .env_remove("CNI_COMMAND")
        .output()
        .expect("run xdhcp unpin");
    assert!(
        out.status.success(),
        "xdhcp unpin: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// ADD every client, `CHUNK` at a time in parallel; how many failed.
fn add_all(d: &Daemon, clients: &[LabClient]) -> usize {
    let mut failed = 0;
    for (c, chunk) in clients.chunks(CHUNK).enumerate() {
        failed += std::thread::scope(|s| {
            let threads: Vec<_> = chunk
                .iter()
                .enumerate()
                .map(|(i, client)| {
                    let id = format!("pod{}", c * CHUNK + i);
                    s.spawn(move || d.cni("ADD", &id, client))
                })
                .collect();
            threads
                .into_iter()
                .map(std::thread::ScopedJoinHandle::join)
                .filter(|r| !matches!(r, Ok(Ok(_))))
                .count()
        });
    }
    failed
}

/// Leases the agent holds (bound, renewing or rebinding) per `/metrics`.
fn held(lab: &Lab, metrics: SocketAddr) -> Option<usize> {
    let text = lab
        .server
        .run_in(move || bench::http_get(metrics, "/metrics"))?;
    let n: f64 = ["bound", "renewing", "rebinding"]
        .iter()
        .map(|s| bench::metric(&text, "xdhcp_leases", &format!("state=\"{s}\"")))
        .sum();
    Some(n as usize)
}

/// The xids of the server's DHCPACKs, in order (`--log-dhcp` puts each
/// message's xid, in decimal, first).
fn ack_xids(log: &str) -> Vec<u32> {
    log.lines()
        .filter(|l| l.contains("DHCPACK("))
        .filter_map(|l| {
            l.split_once("]: ")?
                .1
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

/// The xids every agent's log (the daemons' logs in `dir`) names as having
/// completed a renewal (or an acquisition).
fn renewed_xids(dir: &Path) -> HashSet<u32> {
    let mut out = HashSet::new();
    let logs =
        std::env::var_os("XDHCP_BENCH_LOG_DIR").map_or_else(|| dir.to_path_buf(), PathBuf::from);
    for e in std::fs::read_dir(logs).into_iter().flatten().flatten() {
        if e.path().extension().and_then(|x| x.to_str()) != Some("log") {
            continue;
        }
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        // A lease that ran out meanwhile is acquired again: its ACK
        // completes a `bound` line.
        for l in text
            .lines()
            .filter(|l| l.contains(" renewed ") || l.contains(" bound "))
        {
            if let Some(x) = l
                .split_whitespace()
                .find_map(|w| w.strip_prefix("xid="))
                .and_then(|x| x.parse().ok())
            {
                out.insert(x);
            }
        }
    }
    out
}

impl Drops {
    fn describe(self) -> String {
        format!(
            "ARP table full {} times, server receive buffer {} dropped",
            self.arp_fulls, self.server_rcvbuf
        )
    }
}

fn report(starts: &[Start], n: usize, t1: u32, floor: Duration, lab_note: &str) {
    let cold = starts.first().map_or(Duration::ZERO, |s| s.serving);
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# The agent restarted under {n} renewing leases: cold start, restart with pins, upgrade\n\n\
         One run: dnsmasq (a /20 pool, {LEASE_SECS} s leases, T1 {t1} s: renewals all the time) \
         behind the lab bridge's uplink, {n} pod namespaces, the agent in the bridge's namespace \
         capturing at the uplink, its pins on a bpffs of the run's own. Each start follows a \
         SIGTERM. Times from the new process's exec; *serving* = the first CNI request (STATUS) \
         answered over its socket; *every lease held* = `/metrics` shows {n}. Replies lost = \
         the server's ACKs from the stop until 2×T1 after the start whose xid completed no \
         renewal (or acquisition) in either agent's log (read 1 s after the window closes). Floor: a bare exec \
         of the binary (`--version`), {:.1} ms. The lab: {lab_note}; its kernel drops per start \
         in the last column (an ACK the server could not send for want of an ARP entry, or a \
         REQUEST it never read, is the lab's loss, not the agent's).\n",
        ms(floor)
    );
    let _ = writeln!(
        md,
        "| start | programs | exec → serving (ms) | ÷ cold | ÷ floor | exec → every lease held (ms) | ACKs in the window | replies lost | lab drops (ARP full / server buffer) |\n\
         |---|---|---|---|---|---|---|---|---|"
    );
    for s in starts {
        let _ = writeln!(
            md,
            "| {} | {} | {:.0} | {:.2} | {:.1} | {} | {} | {} | {} |",
            s.what,
            s.programs,
            ms(s.serving),
            ms(s.serving) / ms(cold).max(f64::MIN_POSITIVE),
            ms(s.serving) / ms(floor).max(f64::MIN_POSITIVE),
            s.all_held
                .map_or_else(|| "never".to_owned(), |h| format!("{:.0}", ms(h))),
            s.acks,
            s.lost,
            s.drops.map_or_else(
                || "unreadable".to_owned(),
                |d| format!("{} / {}", d.arp_fulls, d.server_rcvbuf)
            )
        );
    }
    println!("{md}");
    bench::write_result("restart.md", &md);
}
