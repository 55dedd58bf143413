//! `cargo xtask bench kea1000`: N concurrent ADDs (default 1000,
//! `--adds N`, `XDHCP_KEA_ADDS`) against Kea, xdhcp beside the upstream
//! CNI `dhcp` daemon in one run, each against its own floor measured in the
//! same phase.
//!
//! The lab: a node namespace with bridge `br0` (198.18.0.1/22) and Kea 2.2
//! (memfile, 1 h leases, a fresh lease database per phase) on it; N pod
//! namespaces with a veth each on the bridge, IPv6 off (a thousand ports
//! flooding router solicitations and DAD would drop DHCP frames
//! machine-wide). Per implementation, started fresh in the node namespace
//! and invoked with the upstream plugin's network config (xdhcp's thin
//! plugin as the drop-in): one unmeasured ADD and DEL; the daemon's RSS and
//! threads; `XDHCP_KEA_ROUNDS` rounds (default 2) of N ADDs at once, each
//! timed as the wall time from the first exec to the last exit, the
//! daemon's RSS taken at the end of the first with every lease held, then a
//! DEL of every pod and a wait until Kea holds none; then the floor: N
//! concurrent plugin execs doing no DHCP (`CNI_COMMAND=VERSION`) plus N
//! DORAs of the server's own from the same namespaces, back to back (the
//! xdhcp engine over raw sockets: no CNI, no plugin, no agent), the faster
//! of two runs. "÷ floor" is the median wall over that floor; "RSS per
//! lease" the RSS at N leases less the RSS before the first burst, over N.
//! Results in `kea1000.md`.
#![expect(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark report"
)]
#![expect(
    clippy::cast_precision_loss,
    reason = "KiB figures and counts far below 2^52"
)]

use std::{fmt::Write as _, net::Ipv4Addr, time::Duration};

use xdhcp_tests::{
    bench::{Daemon, DaemonOptions, Impl, footprint_of, impls, xdhcp_bin},
    cni_burst::{burst, del_all, exec_floor, raw_dora_burst, settle},
    netns::Lab,
    progress,
    servers::{Kea, KeaConfig},
};

/// What one implementation measured.
struct Measured {
    which: Impl,
    walls: Vec<Duration>,
    failed: usize,
    first_error: Option<String>,
    exec: Duration,
    dora: Duration,
    dora_failed: usize,
    rss0: u64,
    rss_n: u64,
    threads_n: u64,
    held: usize,
}

impl Measured {
    /// The median round (the mean of the middle two of an even count).
    fn median_wall(&self) -> Duration {
        let mut w = self.walls.clone();
        w.sort();
        match w.len() {
            0 => Duration::ZERO,
            n if n % 2 == 1 => w[n / 2],
            n => (w[n / 2 - 1] + w[n / 2]) / 2,
        }
    }

    fn floor(&self) -> Duration {
        self.exec + self.dora
    }

    fn rss_per_lease(&self, n: usize) -> f64 {
        self.rss_n.saturating_sub(self.rss0) as f64 / n.max(1) as f64
    }
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).map_or(default, |v| {
        v.parse()
            .ok()
            .filter(|&n| n > 0)
            .unwrap_or_else(|| panic!("{name}: a positive count, not {v:?}"))
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[expect(
    clippy::too_many_lines,
    reason = "one phase per implementation, each step in order"
)]
fn main() {
    let n = env_usize("XDHCP_KEA_ADDS", 1000);
    let rounds = env_usize("XDHCP_KEA_ROUNDS", 2);
    assert!(
        n <= 1000,
        "XDHCP_KEA_ADDS: at most 1000 (the lab's /22 pool)"
    );
    let xdhcp = xdhcp_bin();
    let _ = xdhcp_tests::bench::upstream();
    xdhcp_tests::netns::sweep_leftovers();
    progress!("kea1000: building a lab of {n} pod namespaces…");
    let lab = Lab::builder()
        .server_ip(Ipv4Addr::new(198, 18, 0, 1), 22)
        .clients(n)
        .without_ipv6()
        .build();
    let mut all = Vec::new();
    for which in impls() {
        let kea = Kea::start(
            &lab.server,
            KeaConfig {
                subnet: "198.18.0.0/22".to_owned(),
                pool: (
                    Ipv4Addr::new(198, 18, 0, 10),
                    Ipv4Addr::new(198, 18, 3, 250),
                ),
                valid_lifetime: 3600,
                renew_timer: 1800,
                rebind_timer: 3000,
                router: Some(Ipv4Addr::new(198, 18, 0, 1)),
                dns: vec![],
                ..KeaConfig::default()
            },
        );
        let leases = || kea.leases();
        let d = Daemon::start_with(
            which,
            &xdhcp,
            &DaemonOptions {
                node_ns: Some(lab.server.name().to_owned()),
                upstream_dialect: true,
                ..DaemonOptions::default()
            },
        );
        let first = &lab.clients[0];
        if let Err(e) = d.cni("ADD", "warmup", first) {
            eprintln!("  warm-up ADD failed: {e}");
        }
        let _ = d.cni("DEL", "warmup", first);
        settle(&leases, std::slice::from_ref(first));
        let (rss0, _) = d.footprint();
        let mut m = Measured {
            which,
            walls: Vec::new(),
            failed: 0,
            first_error: None,
            exec: Duration::ZERO,
            dora: Duration::ZERO,
            dora_failed: 0,
            rss0,
            rss_n: 0,
            threads_n: 0,
            held: 0,
        };
        for r in 0..rounds {
            progress!(
                "kea1000: {}: {n} ADDs at once, round {}…",
                which.name(),
                r + 1
            );
            let b = burst(&d, &lab.clients, &format!("k{r}"));
            progress!(
                "kea1000: {}: {:.0} ms, {} failed{}",
                which.name(),
                ms(b.wall),
                b.failed,
                b.first_error
                    .as_ref()
                    .map_or_else(String::new, |e| format!(", first: {e}"))
            );
            if r == 0 {
                let (rss, threads) = footprint_of(d.process.pid().expect("daemon running"));
                m.rss_n = rss;
                m.threads_n = threads;
                m.held = leases().len();
            }
            m.walls.push(b.wall);
            m.failed += b.failed;
            if m.first_error.is_none() {
                m.first_error = b.first_error;
            }
            del_all(&d, &lab.clients, &format!("k{r}"));
            settle(&leases, &lab.clients);
        }
        progress!("kea1000: {}: the floor…", which.name());
        m.exec = exec_floor(&d, &lab.clients);
        let (dora, dora_failed) = raw_dora_burst(&lab.clients, &leases, 2);
        m.dora = dora;
        m.dora_failed = dora_failed;
        progress!(
            "kea1000: {}: wall {:.0} ms (median), floor {:.0} ms (exec {:.0} + DORAs {:.0}), ÷ floor {:.2}, RSS per lease {:.1} KiB",
            which.name(),
            ms(m.median_wall()),
            ms(m.floor()),
            ms(m.exec),
            ms(m.dora),
            m.median_wall().as_secs_f64() / m.floor().as_secs_f64().max(1e-9),
            m.rss_per_lease(n)
        );
        all.push(m);
    }
    report(&all, n, rounds);
}

fn report(all: &[Measured], n: usize, rounds: usize) {
    let mut md = format!(
        "# {n} concurrent ADDs against Kea: xdhcp beside upstream `dhcp`\n\n\
         Written by `cargo xtask bench kea1000` at commit {}, on {} cores, {rounds} rounds. \
         Kea 2.2 (memfile, 1 h leases) on a bridge with {n} pod namespaces (IPv6 off); each \
         daemon started fresh in the bridge's namespace and invoked with the upstream \
         plugin's network config. The floor, measured in the same phase: {n} concurrent \
         plugin execs doing no DHCP plus {n} DORAs of the server's own from the same \
         namespaces back to back (the faster of two runs). RSS per lease: RSS with {n} \
         leases held less RSS before the first burst, over {n}.\n\n\
         | measure | {} |\n|---|{}\n",
        std::env::var("XDHCP_BENCH_COMMIT").unwrap_or_else(|_| "unknown".to_owned()),
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        all.iter()
            .map(|m| m.which.name())
            .collect::<Vec<_>>()
            .join(" | "),
        "---|".repeat(all.len()),
    );
    let row = |md: &mut String, what: &str, f: &dyn Fn(&Measured) -> String| {
        let _ = writeln!(
            md,
            "| {what} | {} |",
            all.iter().map(f).collect::<Vec<_>>().join(" | ")
        );
    };
    row(&mut md, "burst wall, median (ms)", &|m| {
        format!("{:.0}", ms(m.median_wall()))
    });
    row(&mut md, "each round (ms)", &|m| {
        m.walls
            .iter()
            .map(|w| format!("{:.0}", ms(*w)))
            .collect::<Vec<_>>()
            .join(", ")
    });
    row(&mut md, "exec floor (ms)", &|m| {
        format!("{:.0}", ms(m.exec))
    });
    row(&mut md, "server's own DORAs (ms)", &|m| {
        format!("{:.0} ({} failed)", ms(m.dora), m.dora_failed)
    });
    row(&mut md, "wall ÷ floor", &|m| {
        format!(
            "{:.2}",
            m.median_wall().as_secs_f64() / m.floor().as_secs_f64().max(1e-9)
        )
    });
    row(&mut md, "ADDs failed (all rounds)", &|m| {
        m.failed.to_string()
    });
    row(&mut md, "leases Kea held after the first burst", &|m| {
        m.held.to_string()
    });
    row(&mut md, "RSS before (KiB)", &|m| m.rss0.to_string());
    row(&mut md, &format!("RSS with {n} leases (KiB)"), &|m| {
        m.rss_n.to_string()
    });
    row(&mut md, "RSS per lease (KiB)", &|m| {
        format!("{:.1}", m.rss_per_lease(n))
    });
    row(&mut md, &format!("threads with {n} leases"), &|m| {
        m.threads_n.to_string()
    });
    if let [u, x] = all {
        let _ = writeln!(
            md,
            "\nxdhcp's median wall is {:.2}× upstream's (upstream ÷ xdhcp {:.2}); its RSS per lease {:.2}× upstream's.",
            x.median_wall().as_secs_f64() / u.median_wall().as_secs_f64().max(1e-9),
            u.median_wall().as_secs_f64() / x.median_wall().as_secs_f64().max(1e-9),
            x.rss_per_lease(n) / u.rss_per_lease(n).max(1e-9),
        );
    }
    for m in all {
        if let Some(e) = &m.first_error {
            let _ = writeln!(md, "\n{} first failure: {e}", m.which.name());
        }
    }
    println!("\n{md}");
    xdhcp_tests::bench::write_result("kea1000.md", &md);
}
