//! `cargo xtask bench <name>`: benchmarks, each side by side with its baseline
//! in the same run, reported as ratios and written under `bench/results/`.

use anyhow::{Context as _, Result};

use crate::{cmd, setup};

#[derive(clap::Args)]
pub struct Args {
    /// Which benchmark.
    #[arg(value_enum)]
    which: Which,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Which {
    /// ns/packet of the XDP/TC capture program through `BPF_PROG_TEST_RUN` vs. a bare `XDP_PASS` program.
    Xdp,
    /// TCP throughput across a veth pair: bare, TC attached, XDP attached.
    Dataplane,
    /// xdhcp vs. the upstream CNI dhcp daemon: ADD latency, concurrency, memory, threads.
    Cni,
    /// DORA latency against dnsmasq and memory per bound lease.
    Dora,
    /// 1000 leases: restart under them (SIGTERM, SIGKILL), re-adoption time, the T1 renewal storm.
    Scale,
    /// Junk frames to UDP 68 on leased interfaces: daemon CPU and RSS against the packet rate.
    Flood,
    /// A pod's ADD through OVN (userspace datapath) beside the bridge lab, each against the
    /// server's own DORA; the time from an `ovn-bridge-mappings` change to an attached uplink.
    Ovn,
    /// All of the above, in that order.
    All,
}

impl Which {
    fn bins(self) -> &'static [&'static str] {
        match self {
            Which::Xdp => &["bench_xdp"],
            Which::Dataplane => &["bench_dataplane"],
            Which::Cni => &["bench_cni"],
            Which::Dora => &["bench_dora"],
            Which::Scale => &["bench_scale"],
            Which::Flood => &["bench_flood"],
            Which::Ovn => &["bench_ovn"],
            Which::All => &[
                "bench_xdp",
                "bench_dataplane",
                "bench_dora",
                "bench_cni",
                "bench_scale",
                "bench_flood",
                "bench_ovn",
            ],
        }
    }
}

pub fn run(args: &Args) -> Result<()> {
    setup::run()?;
    let root = cmd::workspace_root();
    // The CNI benchmark invokes the release agent binary.
    crate::build::release_binary()?;
    let results = root.join("bench/results");
    std::fs::create_dir_all(&results).with_context(|| format!("creating {}", results.display()))?;
    for bin in args.which.bins() {
        cmd::run(
            cmd::program("cargo")
                .current_dir(&root)
                .env("XDHCP_BENCH_RESULTS", &results)
                .env("XDHCP_BIN", root.join("target/release/xdhcp"))
                .env("XDHCP_PLUGIN_BIN", crate::build::plugin_binary()?)
                .args(["run", "--release", "-p", "xdhcp-tests", "--bin", bin]),
        )?;
    }
    println!("results written under {}", results.display());
    Ok(())
}
