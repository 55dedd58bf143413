//! `cargo xtask bench soak`: the soak (`xdhcp_tests::soak`) at its bench
//! size, 500 pods for 30 minutes by default, against dnsmasq and Kea at
//! once under the seeded chaos schedule, the invariant checker at every
//! check. The report (a table of counts, the violations, the chaos log) in
//! `soak.md`, the agent's footprint and the operations against time in
//! `soak-footprint.svg` and `soak-ops.svg`. Exits 1 when an invariant
//! broke.
//!
//! Parameters (each from `cargo xtask bench soak --…`, which sets these):
//! `XDHCP_SOAK_PODS` (500), `XDHCP_SOAK_CHURN` (pod replacements per
//! second, 2), `XDHCP_SOAK_LEASE` (lease seconds, 120, dnsmasq's minimum),
//! `XDHCP_SOAK_T1` (4), `XDHCP_SOAK_T2` (8), `XDHCP_SOAK_DURATION`
//! (seconds, 1800), `XDHCP_SOAK_SEED` (1), `XDHCP_SOAK_CHAOS_EVERY`
//! (seconds, 20), `XDHCP_SOAK_CHECK_EVERY` (seconds, 120),
//! `XDHCP_SOAK_UPGRADE_BIN` (the second build of a rolling upgrade; by
//! default a copy of the agent binary).
#![expect(clippy::print_stdout, reason = "a benchmark report")]

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use xdhcp_tests::{
    bench::{write_result, xdhcp_bin, xdhcp_plugin_bin},
    progress,
    soak::{self, SoakConfig},
};

fn env<T: std::str::FromStr>(name: &str) -> Option<T> {
    let v = std::env::var(name).ok()?;
    Some(
        v.parse()
            .unwrap_or_else(|_| panic!("{name}: cannot read {v:?} as a number")),
    )
}

fn main() {
    let plugin = xdhcp_plugin_bin()
        .expect("XDHCP_PLUGIN_BIN: the thin plugin binary (cargo xtask bench sets it)");
    let mut cfg = SoakConfig::long(xdhcp_bin(), plugin);
    if let Some(v) = env("XDHCP_SOAK_PODS") {
        cfg.pods = v;
    }
    if let Some(v) = env("XDHCP_SOAK_CHURN") {
        cfg.churn_per_s = v;
    }
    if let Some(v) = env("XDHCP_SOAK_LEASE") {
        cfg.lease_secs = v;
    }
    if let Some(v) = env("XDHCP_SOAK_T1") {
        cfg.t1_secs = v;
    }
    if let Some(v) = env("XDHCP_SOAK_T2") {
        cfg.t2_secs = v;
    }
    if let Some(v) = env("XDHCP_SOAK_DURATION") {
        cfg.duration = Duration::from_secs(v);
    }
    if let Some(v) = env("XDHCP_SOAK_SEED") {
        cfg.seed = v;
    }
    if let Some(v) = env("XDHCP_SOAK_CHAOS_EVERY") {
        cfg.chaos_every = Duration::from_secs(v);
    }
    if let Some(v) = env("XDHCP_SOAK_CHECK_EVERY") {
        cfg.check_every = Duration::from_secs(v);
    }
    cfg.upgrade_bin = std::env::var_os("XDHCP_SOAK_UPGRADE_BIN").map(PathBuf::from);
    assert!(
        cfg.pods >= 2,
        "XDHCP_SOAK_PODS: at least 2 (one per network)"
    );
    assert!(
        cfg.t1_secs < cfg.t2_secs && cfg.t2_secs < cfg.lease_secs,
        "T1 < T2 < lease time"
    );
    cfg.plot_dir = std::env::var_os("XDHCP_BENCH_RESULTS").map(PathBuf::from);
    let report = soak::run(cfg);
    let plots = report.plot();
    let mut md = format!(
        "# Soak: churn under chaos against dnsmasq and Kea\n\n\
         Written by `cargo xtask bench soak` at commit {}, {:.0} s of soak.\n\n",
        std::env::var("XDHCP_BENCH_COMMIT").unwrap_or_else(|_| "unknown".to_owned()),
        report.elapsed.as_secs_f64()
    );
    md.push_str(&report.markdown());
    for p in plots {
        if let Some(name) = p.file_name() {
            let _ = writeln!(md, "\n![{0}]({0})", name.to_string_lossy());
        }
    }
    println!("\n{md}");
    write_result("soak.md", &md);
    if !report.violations.is_empty() {
        progress!("soak: {} violations", report.violations.len());
        std::process::exit(1);
    }
}
