//! `cargo xtask bench cni6`: IPv6 ADDs through xdhcp against Kea's
//! `kea-dhcp6`, each beside its floor measured in the same run, and beside
//! `dhcpcd -6` as a client of the same server.
//!
//! - The harness of `bench cni`: a node namespace with a Linux bridge, the
//!   server in its own namespace behind a veth on the bridge, 100 pod
//!   namespaces with a veth each, created up front and reused.
//! - Kea twice: answering with Preference 255 (a client requests at once
//!   instead of collecting ADVERTISEs for a second), then with Rapid Commit
//!   (SOLICIT and REPLY; the network asks for it with `rapidCommit`).
//! - For each, `xdhcp agent --kube off` started fresh in the node
//!   namespace, its thin plugin exec'd with a `"family": "ipv6"` network
//!   (`"apply": false`: the runtime configures the address, as with the
//!   upstream plugin; with `apply` an ADD also waits the 1–2 s of the
//!   kernel's duplicate address detection), timed as the plugin process's
//!   wall time; bursts of 1 and 100 concurrent ADDs in rounds, each pod
//!   given a DEL (RELEASE) after its round.
//! - Each round's floor, right after it: as many concurrent plugin execs
//!   doing no DHCP (`CNI_COMMAND=VERSION`) plus as many exchanges of the
//!   server's own — xdhcp's v6 engine as a bare client over a UDP socket in
//!   the same pods' namespaces, no CNI, no plugin, no agent — the fastest
//!   of three runs.
//! - `dhcpcd -6` (straight to DHCPv6, no router solicitation), run once
//!   per round on a pod, timed to its exit once bound.
//! - Then single dual-stack ADDs (`"family": "dual"`) against `kea-dhcp4`
//!   and `kea-dhcp6` together: the floor is one exec plus the slower of
//!   the two exchanges of the server's own, since the ADD runs both at once;
//!   and, beside it, one exec plus the two exchanges run at once (sharing
//!   the cores as the ADD's two acquisitions do).
//! - The CPU each size's bursts took: the agent's per ADD and the machine's
//!   busy share, from `/proc`.
//!
//! There is no upstream baseline: the upstream CNI `dhcp` plugin speaks
//! DHCPv4 only. Nothing here asserts a timing. `XDHCP_BENCH_ROUNDS=n` sets
//! the rounds of every size; `XDHCP_BENCH_AGENT_ARGS` adds flags to the
//! agent's command line.
#![expect(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark report"
)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use xdhcp_tests::{
    Kea, Kea6, Kea6Options, KeaConfig,
    bench::{Daemon, DaemonOptions, Impl, median_p99},
    cni_burst::{
        Burst, Leases, burst, cpu_cells, del_all, exec_floor, raw_dora_burst, raw_dora_passes,
        settle as settle4, v6_exchange_burst, v6_exchange_passes, wait_link_local,
    },
    guest::GuestFs,
    netns::{Lab, LabClient},
    progress,
};

const CONCURRENT: usize = 100;
/// (concurrent ADDs, rounds).
const BURSTS: &[(usize, usize)] = &[(1, 20), (100, 5)];
/// Runs of the server's own exchanges per floor, the fastest taken.
const PASSES: usize = 3;
/// The dual-stack rounds against the floor whose two exchanges ran at once.
fn both_table(md: &mut String, phases: &[Phase]) {
    let rows: Vec<(&Phase, &Vec<Round>)> = phases
        .iter()
        .flat_map(|p| p.bursts.iter().map(move |(_, r)| (p, r)))
        .filter(|(_, r)| r.iter().any(|r| r.both.is_some()))
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\nThe dual-stack ADD runs its two acquisitions at once; its floor above takes the \
         slower of the two exchanges of the server's own, each measured alone. Measured at \
         once as well (the DHCPv4 DORA and the `DHCPv6` exchange started together from the \
         pod's namespace, the fastest of {PASSES} passes), the two share the machine's cores, \
         as the ADD's do:\n"
    );
    let _ = writeln!(
        md,
        "| server | rounds | floor with both at once, median (exec + both) | ÷ that floor, median / p99 | over it, median |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|");
    for (p, rounds) in rows {
        let with: Vec<(&Round, Duration)> = rounds
            .iter()
            .filter_map(|r| r.both.map(|b| (r, r.exec + b)))
            .collect();
        let (f50, _) = median_p99(with.iter().map(|(_, f)| ms(*f)).collect());
        let (b50, _) = median_p99(with.iter().filter_map(|(r, _)| r.both).map(ms).collect());
        let (e50, _) = median_p99(with.iter().map(|(r, _)| ms(r.exec)).collect());
        let (o50, o99) = median_p99(
            with.iter()
                .map(|(r, f)| r.burst.wall.as_secs_f64() / f.as_secs_f64().max(1e-9))
                .collect(),
        );
        let (d50, _) = median_p99(
            with.iter()
                .map(|(r, f)| ms(r.burst.wall) - ms(*f))
                .collect(),
        );
        let _ = writeln!(
            md,
            "| {} | {} | {f50:.1} ms ({e50:.1} + {b50:.1}) | {o50:.2}× / {o99:.2}× | {d50:+.1} ms |",
            p.server,
            with.len()
        );
    }
}

/// Where the bursts' time went: the agent's CPU per ADD and how busy the
/// machine was, from `/proc`'s CPU times (read in clock ticks: a sum over
/// every round of a size, so one tick is spread over all its ADDs).
fn cpu_table(md: &mut String, phases: &[Phase]) {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let _ = writeln!(
        md,
        "\nThe CPU the bursts took, from `/proc` (summed over the rounds of a size): the agent's \
         own (every thread, user and system, with the kernel's work done in its threads: its \
         sends' flooding through the bridge among it), per ADD, where the rounds took at least \
         20 of `/proc`'s clock ticks of it; and the whole machine's busy \
         time over the rounds' wall time on {cores} cores, where it took at least 20 ticks (\"–\" where \
         fewer: too coarse to say). A machine busy near 100 % is a burst \
         bound by CPU: the agent's, the plugin execs', the server's and the kernel's together.\n"
    );
    let _ = writeln!(
        md,
        "| server | ADDs | agent CPU per ADD | machine busy during the bursts |"
    );
    let _ = writeln!(md, "|---|---|---|---|");
    for p in phases {
        for (n, rounds) in &p.bursts {
            let (per_add, busy) = cpu_cells(rounds.iter().map(|r| &r.burst), *n);
            let _ = writeln!(md, "| {} | {n} | {per_add} | {busy} |", p.server);
        }
    }
}

/// Rounds of `dhcpcd -6`.
const DHCPCD_ROUNDS: usize = 10;
/// Rounds of the single dual-stack ADD.
const DUAL_ROUNDS: usize = 20;

/// One round of a burst beside its floor.
struct Round {
    burst: Burst,
    exec: Duration,
    exchange: Duration,
    exchange_failed: usize,
    /// Dual stack: both exchanges of the server's own at once (`None`
    /// elsewhere, or when no pass bound both).
    both: Option<Duration>,
}

impl Round {
    fn floor(&self) -> Duration {
        self.exec + self.exchange
    }
}

/// What one server configuration measured.
struct Phase {
    server: &'static str,
    bursts: Vec<(usize, Vec<Round>)>,
    /// `dhcpcd -6` runs that bound, and the ones that did not.
    dhcpcd: Vec<Duration>,
    dhcpcd_failed: usize,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The DUID-LL Kea records for a pod (hex, colon-separated).
fn duid_ll(mac: [u8; 6]) -> String {
    let mut s = "00:03:00:01".to_owned();
    for b in mac {
        let _ = write!(s, ":{b:02x}");
    }
    s
}

/// Waits until Kea holds no lease for `clients` (every RELEASE done).
fn settle(kea: &Kea6, clients: &[LabClient]) {
    let duids: Vec<String> = clients.iter().map(|c| duid_ll(c.mac)).collect();
    let held = || {
        kea.leases()
            .iter()
            .filter(|l| duids.iter().any(|d| l.duid.eq_ignore_ascii_case(d)))
            .count()
    };
    if !xdhcp_tests::wait_until(Duration::from_secs(10), || held() == 0) {
        eprintln!(
            "  Kea still holds {} leases 10 s after their release",
            held()
        );
    }
}

/// `XDHCP_BENCH_AGENT_ARGS`: more flags for the agent.
fn agent_args() -> Vec<String> {
    std::env::var("XDHCP_BENCH_AGENT_ARGS")
        .map(|v| v.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// `xdhcp agent --kube off` started fresh in the node's namespace, its
/// plugin exec'd with `"apply": false`, `"ipv6": {"prefixLength": 64, …}`
/// and `family`; then one unmeasured ADD and DEL on the first pod (the
/// first exec of a binary may read it from disk).
fn start_agent(lab: &Lab, xdhcp: &Path, family: &str, rapid_commit: bool) -> Daemon {
    let mut ipam = serde_json::Map::new();
    ipam.insert("family".into(), family.into());
    ipam.insert("apply".into(), false.into());
    ipam.insert(
        "ipv6".into(),
        serde_json::json!({"prefixLength": 64, "rapidCommit": rapid_commit}),
    );
    let d = Daemon::start_with(
        Impl::Xdhcp,
        xdhcp,
        &DaemonOptions {
            node_ns: Some(lab.server.name().to_owned()),
            ipam_extra: Some(ipam),
            agent_args: agent_args(),
            ..DaemonOptions::default()
        },
    );
    let first = &lab.clients[0];
    if let Err(e) = d.cni("ADD", "warmup", first) {
        eprintln!("  warm-up ADD failed: {e}");
    }
    let _ = d.cni("DEL", "warmup", first);
    d
}

fn phase(
    lab: &Lab,
    xdhcp: &Path,
    server: &'static str,
    opts: Kea6Options,
    plan: &[(usize, usize)],
) -> Phase {
    let kea = Kea6::start_with(lab.dhcp_ns(), opts);
    let d = start_agent(lab, xdhcp, "ipv6", opts.rapid_commit);
    let first = &lab.clients[0];
    settle(&kea, std::slice::from_ref(first));
    let mut bursts = Vec::new();
    for &(n, rounds) in plan {
        let clients = &lab.clients[..n];
        let mut set = Vec::new();
        for r in 0..rounds {
            let tag = format!("v6-{n}-{r}");
            let b = burst(&d, clients, &tag);
            if let Some(e) = &b.first_error {
                eprintln!("  {} of {n} ADDs failed, first: {e}", b.failed);
            }
            del_all(&d, clients, &tag);
            settle(&kea, clients);
            let exec = exec_floor(&d, clients);
            let (exchange, exchange_failed) = v6_exchange_burst(clients, PASSES, opts.rapid_commit);
            settle(&kea, clients);
            set.push(Round {
                burst: b,
                exec,
                exchange,
                exchange_failed,
                both: None,
            });
        }
        let (w50, _) = median_p99(set.iter().map(|r| ms(r.burst.wall)).collect());
        let (f50, _) = median_p99(set.iter().map(|r| ms(r.floor())).collect());
        progress!("{server}: {n} ADDs × {rounds}: wall {w50:.1} ms median, floor {f50:.1} ms");
        bursts.push((n, set));
    }
    drop(d);
    // dhcpcd on the last pod (no lease of the rounds' left there).
    let pod = &lab.clients[CONCURRENT - 1];
    let fs = GuestFs::new();
    let (mut dhcpcd, mut dhcpcd_failed) = (Vec::new(), 0);
    for _ in 0..rounds_or(DHCPCD_ROUNDS) {
        let t = Instant::now();
        match fs.dhcpcd6_once(&pod.ns, &pod.ifname, 10) {
            Some(_) => dhcpcd.push(t.elapsed()),
            None => dhcpcd_failed += 1,
        }
        // dhcpcd leaves its address configured: off again for the next run.
        let _ = pod
            .ns
            .ip(&["-6", "addr", "flush", "dev", &pod.ifname, "scope", "global"]);
    }
    progress!(
        "{server}: dhcpcd -6: {} bound, {dhcpcd_failed} failed, median {:.1} ms",
        dhcpcd.len(),
        median_p99(dhcpcd.iter().map(|d| ms(*d)).collect()).0
    );
    Phase {
        server,
        bursts,
        dhcpcd,
        dhcpcd_failed,
    }
}

/// Single dual-stack ADDs (`"family": "dual"`) against Kea's `kea-dhcp4`
/// and `kea-dhcp6` (Preference 255) in the server's namespace. The two
/// leases are acquired at once, so the floor is one exec plus the slower
/// of the two exchanges of the server's own (each the fastest of
/// [`PASSES`], measured apart).
fn dual_phase(lab: &Lab, xdhcp: &Path, rounds: usize) -> Phase {
    let kea6 = Kea6::start_with(
        lab.dhcp_ns(),
        Kea6Options {
            preference: Some(255),
            quiet: true,
            ..Kea6Options::default()
        },
    );
    let kea4 = Kea::start(
        lab.dhcp_ns(),
        KeaConfig {
            interface: lab.dhcp_ifname().to_owned(),
            valid_lifetime: 3600,
            renew_timer: 1800,
            rebind_timer: 3000,
            ..KeaConfig::default()
        },
    );
    let d = start_agent(lab, xdhcp, "dual", false);
    let one = std::slice::from_ref(&lab.clients[0]);
    let leases4 = || kea4.leases();
    settle(&kea6, one);
    settle4(&leases4, one);
    let mut set = Vec::new();
    for r in 0..rounds {
        let tag = format!("dual-{r}");
        let b = burst(&d, one, &tag);
        if let Some(e) = &b.first_error {
            eprintln!("  the dual-stack ADD failed: {e}");
        }
        del_all(&d, one, &tag);
        settle(&kea6, one);
        settle4(&leases4, one);
        let exec = exec_floor(&d, one);
        let (x6, f6) = v6_exchange_burst(one, PASSES, false);
        settle(&kea6, one);
        let (x4, f4) = raw_dora_burst(one, &leases4, PASSES);
        settle(&kea6, one);
        let both = both_at_once(one, &leases4);
        settle(&kea6, one);
        set.push(Round {
            burst: b,
            exec,
            exchange: x4.max(x6),
            exchange_failed: f4 + f6,
            both,
        });
    }
    let (w50, _) = median_p99(set.iter().map(|r| ms(r.burst.wall)).collect());
    let (f50, _) = median_p99(set.iter().map(|r| ms(r.floor())).collect());
    progress!("dual stack: 1 ADD × {rounds}: wall {w50:.1} ms median, floor {f50:.1} ms");
    Phase {
        server: "Kea 4 + Kea 6 (Preference 255), dual stack",
        bursts: vec![(1, set)],
        dhcpcd: Vec::new(),
        dhcpcd_failed: 0,
    }
}

/// The two exchanges of the server's own run at once, as a dual-stack ADD
/// runs its two acquisitions: each pass's DHCPv4 DORA and `DHCPv6`
/// exchange started together from `one`'s namespace, the pass taking as
/// long as the slower; the fastest of [`PASSES`] passes in which both
/// bound.
fn both_at_once(one: &[LabClient], leases4: Leases<'_>) -> Option<Duration> {
    let gate = std::sync::Barrier::new(2);
    let (v4, v6) = std::thread::scope(|s| {
        let v6 = s.spawn(|| v6_exchange_passes(one, PASSES, false, Some(&gate)));
        let v4 = raw_dora_passes(one, leases4, PASSES, Some(&gate));
        (v4, v6.join().expect("DHCPv6 floor thread"))
    });
    v4.iter()
        .zip(&v6)
        .filter(|((_, f4), (_, f6))| f4 + f6 == 0)
        .map(|((x4, _), (x6, _))| *x4.max(x6))
        .min()
}

fn rounds_or(default: usize) -> usize {
    std::env::var("XDHCP_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(default)
}

fn report(phases: &[Phase], took: Duration) {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# DHCPv6 ADD benchmark: xdhcp against Kea, beside its floor and `dhcpcd -6`\n"
    );
    let _ = writeln!(
        md,
        "Written by `cargo xtask bench cni6`, commit {}, on {} cores; {:.0} s.\n",
        std::env::var("XDHCP_BENCH_COMMIT").unwrap_or_else(|_| "unknown".to_owned()),
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        took.as_secs_f64()
    );
    let _ = writeln!(
        md,
        "The harness of `bench cni` ({CONCURRENT} pod namespaces on a Linux bridge, the server \
         behind a veth), Kea's `kea-dhcp6` (memfile), `xdhcp agent --kube off` fresh per server \
         configuration, its thin plugin exec'd with a `\"family\": \"ipv6\"`, `\"apply\": false` \
         network and timed as the plugin process's wall time; each pod given a DEL (RELEASE) \
         after its round. Each round's floor, right after it: as many concurrent plugin execs \
         doing no DHCP plus as many exchanges of the server's own from the same namespaces \
         (xdhcp's v6 engine as a bare client over UDP: no CNI, no plugin, no agent), the fastest \
         of {PASSES} runs. There is no upstream baseline: the upstream CNI `dhcp` plugin speaks \
         DHCPv4 only; `dhcpcd -6` on the same server is the comparison (it waits a random \
         0–1 s before its first SOLICIT, as RFC 8415 asks of a host; an ADD does not).\n"
    );
    let _ = writeln!(
        md,
        "| server | ADDs | rounds | wall, median / p99 | floor, median (exec + server) | ÷ floor, median / p99 | over the floor, median | floor exchanges failed |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
    for p in phases {
        for (n, rounds) in &p.bursts {
            let (w50, w99) = median_p99(rounds.iter().map(|r| ms(r.burst.wall)).collect());
            let (f50, _) = median_p99(rounds.iter().map(|r| ms(r.floor())).collect());
            let (e50, _) = median_p99(rounds.iter().map(|r| ms(r.exec)).collect());
            let (x50, _) = median_p99(rounds.iter().map(|r| ms(r.exchange)).collect());
            let (o50, o99) = median_p99(
                rounds
                    .iter()
                    .map(|r| r.burst.wall.as_secs_f64() / r.floor().as_secs_f64().max(1e-9))
                    .collect(),
            );
            let (d50, _) = median_p99(
                rounds
                    .iter()
                    .map(|r| ms(r.burst.wall) - ms(r.floor()))
                    .collect(),
            );
            let failed: usize = rounds.iter().map(|r| r.exchange_failed).sum();
            let add_failed: usize = rounds.iter().map(|r| r.burst.failed).sum();
            let _ = writeln!(
                md,
                "| {} | {n}{} | {} | {w50:.1} / {w99:.1} ms | {f50:.1} ms ({e50:.1} + {x50:.1}) | {o50:.2}× / {o99:.2}× | {d50:+.1} ms | {failed} |",
                p.server,
                if add_failed > 0 {
                    format!(" ({add_failed} failed)")
                } else {
                    String::new()
                },
                rounds.len()
            );
        }
    }
    both_table(&mut md, phases);
    cpu_table(&mut md, phases);
    let _ = writeln!(
        md,
        "\n| server | `dhcpcd -6` bound, median / p99 | runs (failed) | single ADD median ÷ dhcpcd median |"
    );
    let _ = writeln!(md, "|---|---|---|---|");
    for p in phases
        .iter()
        .filter(|p| !p.dhcpcd.is_empty() || p.dhcpcd_failed > 0)
    {
        let (c50, c99) = median_p99(p.dhcpcd.iter().map(|d| ms(*d)).collect());
        let single = p
            .bursts
            .iter()
            .find(|(n, _)| *n == 1)
            .map(|(_, r)| median_p99(r.iter().map(|r| ms(r.burst.wall)).collect()).0);
        let _ = writeln!(
            md,
            "| {} | {c50:.1} / {c99:.1} ms | {} ({}) | {} |",
            p.server,
            p.dhcpcd.len() + p.dhcpcd_failed,
            p.dhcpcd_failed,
            single.map_or("–".to_owned(), |s| format!("{:.1}× faster", c50 / s))
        );
    }
    println!("\n{md}");
    xdhcp_tests::bench::write_result("cni6.md", &md);
}

fn main() {
    let started = Instant::now();
    let xdhcp = PathBuf::from(
        std::env::var_os("XDHCP_BIN")
            .expect("XDHCP_BIN: path of the release xdhcp binary (cargo xtask bench sets it)"),
    );
    xdhcp_tests::netns::sweep_leftovers();
    progress!("building the harness: {CONCURRENT} pod namespaces…");
    let lab = Lab::builder()
        .clients(CONCURRENT)
        .server_behind_uplink()
        .build();
    if !wait_link_local(&lab.clients) {
        eprintln!("  some pods have no usable link-local address after 10 s");
    }
    let plan: Vec<(usize, usize)> = BURSTS.iter().map(|&(n, r)| (n, rounds_or(r))).collect();
    let phases = vec![
        phase(
            &lab,
            &xdhcp,
            "Kea, Preference 255",
            Kea6Options {
                preference: Some(255),
                quiet: true,
                ..Kea6Options::default()
            },
            &plan,
        ),
        phase(
            &lab,
            &xdhcp,
            "Kea, Rapid Commit",
            Kea6Options {
                rapid_commit: true,
                quiet: true,
                ..Kea6Options::default()
            },
            &plan,
        ),
        dual_phase(&lab, &xdhcp, rounds_or(DUAL_ROUNDS)),
    ];
    report(&phases, started.elapsed());
    progress!(
        "bench_cni6 done in {:.0} s",
        started.elapsed().as_secs_f64()
    );
}
