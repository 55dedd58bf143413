//! `cargo xtask bench <name>`: benchmarks, each side by side with its baseline
//! in the same run, reported as ratios and written under `bench/results/`.

use std::path::Path;

use anyhow::{Context as _, Result};

use crate::{cmd, setup};

#[derive(clap::Args)]
pub struct Args {
    /// Which benchmark.
    #[arg(value_enum)]
    which: Which,
    #[command(flatten)]
    soak: SoakArgs,
    /// `kea1000`: concurrent ADDs in the burst.
    #[arg(long, value_name = "N")]
    adds: Option<usize>,
}

/// The soak's parameters (`soak`; each defaults in the benchmark).
#[derive(clap::Args)]
struct SoakArgs {
    /// Pods alive at once, half on each server [default: 500].
    #[arg(long)]
    pods: Option<usize>,
    /// Pod replacements (a DEL and an ADD) per second [default: 2].
    #[arg(long)]
    churn: Option<f64>,
    /// Lease time in seconds [default: 120, dnsmasq's minimum].
    #[arg(long, value_name = "SECS")]
    lease_time: Option<u32>,
    /// T1: seconds between renewals [default: 4].
    #[arg(long, value_name = "SECS")]
    t1: Option<u32>,
    /// T2 in seconds [default: 8].
    #[arg(long, value_name = "SECS")]
    t2: Option<u32>,
    /// How long: `90s`, `3m`, `1h` or plain seconds [default: 30m].
    #[arg(long, value_parser = parse_duration_secs)]
    duration: Option<u64>,
    /// Seed of the chaos schedule and the churn [default: 1].
    #[arg(long)]
    seed: Option<u64>,
    /// Mean seconds between chaos steps [default: 20].
    #[arg(long, value_name = "SECS")]
    chaos_every: Option<u64>,
    /// Seconds between invariant checks [default: 120].
    #[arg(long, value_name = "SECS")]
    check_every: Option<u64>,
    /// The second build a rolling upgrade switches to [default: a copy of
    /// the agent binary].
    #[arg(long, value_name = "PATH")]
    upgrade_bin: Option<std::path::PathBuf>,
}

impl SoakArgs {
    /// The environment `bench_soak` reads, for the flags given.
    fn env(&self) -> Vec<(&'static str, String)> {
        let mut v = Vec::new();
        let mut put = |k: &'static str, x: Option<String>| {
            if let Some(x) = x {
                v.push((k, x));
            }
        };
        put("XDHCP_SOAK_PODS", self.pods.map(|x| x.to_string()));
        put("XDHCP_SOAK_CHURN", self.churn.map(|x| x.to_string()));
        put("XDHCP_SOAK_LEASE", self.lease_time.map(|x| x.to_string()));
        put("XDHCP_SOAK_T1", self.t1.map(|x| x.to_string()));
        put("XDHCP_SOAK_T2", self.t2.map(|x| x.to_string()));
        put("XDHCP_SOAK_DURATION", self.duration.map(|x| x.to_string()));
        put("XDHCP_SOAK_SEED", self.seed.map(|x| x.to_string()));
        put(
            "XDHCP_SOAK_CHAOS_EVERY",
            self.chaos_every.map(|x| x.to_string()),
        );
        put(
            "XDHCP_SOAK_CHECK_EVERY",
            self.check_every.map(|x| x.to_string()),
        );
        put(
            "XDHCP_SOAK_UPGRADE_BIN",
            self.upgrade_bin.as_ref().map(|p| p.display().to_string()),
        );
        v
    }
}

/// `90s`, `3m`, `1h` or plain seconds, as seconds.
fn parse_duration_secs(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (num, unit) = match t.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => t.split_at(i),
        None => (t, "s"),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{text:?}: expected a number with s, m or h"))?;
    let mult = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        _ => return Err(format!("{text:?}: the unit is s, m or h")),
    };
    if n == 0 {
        return Err(format!("{text:?}: a duration above zero"));
    }
    Ok(n * mult)
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Which {
    /// ns/packet of the XDP/TC capture program through `BPF_PROG_TEST_RUN` vs. a bare `XDP_PASS` program.
    Xdp,
    /// TCP throughput across a veth pair: bare, TC attached, XDP attached.
    Dataplane,
    /// xdhcp vs. the upstream CNI dhcp plugin and daemon in a new user's harness: bursts of
    /// 1-100 ADDs beside their floors, with and without an uplink, tcpdump off and on.
    Cni,
    /// DHCPv6 ADDs against Kea (Preference 255, then Rapid Commit): bursts of 1 and 100 beside
    /// their floors, and `dhcpcd -6` on the same server.
    Cni6,
    /// DORA latency against dnsmasq and memory per bound lease.
    Dora,
    /// 1000 leases: restart under them (SIGTERM, SIGKILL), re-adoption time, the T1 renewal storm.
    Scale,
    /// The agent restarted under 1000 renewing leases: cold start, restart
    /// with pins, upgrade — time to serving and to every lease held, replies
    /// lost.
    Restart,
    /// A flood of DHCP replies no lease owns at a leased port and at an uplink: daemon CPU, and a
    /// 100-ADD burst during it against the same burst without it.
    Flood,
    /// A pod's ADD through OVN (userspace datapath) beside the bridge lab, each against the
    /// server's own DORA; the time from an `ovn-bridge-mappings` change to an attached uplink.
    Ovn,
    /// Pods churned against dnsmasq and Kea at once under a seeded chaos
    /// schedule (agent killed and upgraded, servers restarted and down past
    /// T2, netns removed, API failures, junk replies), an invariant checker
    /// throughout (`--pods`, `--churn`, `--lease-time`, `--duration`, `--seed`…).
    Soak,
    /// N concurrent ADDs against Kea (`--adds`, default 1000): wall time ÷
    /// its floor, and RSS per lease, xdhcp beside upstream.
    Kea1000,
    /// All of the above, in that order (the soak at its defaults).
    All,
}

impl Which {
    fn bins(self) -> &'static [&'static str] {
        match self {
            Which::Xdp => &["bench_xdp"],
            Which::Dataplane => &["bench_dataplane"],
            Which::Cni => &["bench_cni"],
            Which::Cni6 => &["bench_cni6"],
            Which::Dora => &["bench_dora"],
            Which::Scale => &["bench_scale"],
            Which::Restart => &["bench_restart"],
            Which::Flood => &["bench_flood"],
            Which::Ovn => &["bench_ovn"],
            Which::Soak => &["bench_soak"],
            Which::Kea1000 => &["bench_kea1000"],
            Which::All => &[
                "bench_xdp",
                "bench_dataplane",
                "bench_dora",
                "bench_cni",
                "bench_cni6",
                "bench_scale",
                "bench_restart",
                "bench_flood",
                "bench_ovn",
                "bench_kea1000",
                "bench_soak",
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
                .env("XDHCP_BENCH_COMMIT", head_commit(&root))
                .env("XDHCP_BIN", root.join("target/release/xdhcp"))
                .env("XDHCP_PLUGIN_BIN", crate::build::plugin_binary()?)
                .envs(args.soak.env())
                .envs(args.adds.map(|n| ("XDHCP_KEA_ADDS", n.to_string())))
                .args(["run", "--release", "-p", "xdhcp-tests", "--bin", bin]),
        )?;
    }
    println!("results written under {}", results.display());
    Ok(())
}

/// The commit checked out at `root`, read from its git directory (a
/// worktree's `.git` file names it; refs live in the common directory,
/// loose or packed): for the results to say what they measured. "unknown"
/// outside a git checkout.
fn head_commit(root: &Path) -> String {
    let read = |p: &Path| std::fs::read_to_string(p).ok();
    let dot_git = root.join(".git");
    let git_dir = if dot_git.is_dir() {
        dot_git
    } else {
        let Some(text) = read(&dot_git) else {
            return "unknown".to_owned();
        };
        let Some(dir) = text.trim().strip_prefix("gitdir:") else {
            return "unknown".to_owned();
        };
        root.join(dir.trim())
    };
    let common = read(&git_dir.join("commondir"))
        .map_or_else(|| git_dir.clone(), |c| git_dir.join(c.trim()));
    let Some(head) = read(&git_dir.join("HEAD")) else {
        return "unknown".to_owned();
    };
    let head = head.trim();
    let Some(name) = head.strip_prefix("ref:").map(str::trim) else {
        return short(head);
    };
    if let Some(id) = read(&git_dir.join(name)).or_else(|| read(&common.join(name))) {
        return format!(
            "{} ({})",
            short(id.trim()),
            name.trim_start_matches("refs/heads/")
        );
    }
    read(&common.join("packed-refs"))
        .and_then(|packed| {
            packed.lines().find_map(|l| {
                let (id, r) = l.split_once(' ')?;
                (r == name)
                    .then(|| format!("{} ({})", short(id), name.trim_start_matches("refs/heads/")))
            })
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

fn short(id: &str) -> String {
    id.chars().take(10).collect()
}

#[cfg(test)]
mod tests {
    use super::{head_commit, parse_duration_secs};

    #[test]
    fn soak_durations_read_with_their_unit() {
        assert_eq!(parse_duration_secs("90"), Ok(90));
        assert_eq!(parse_duration_secs("90s"), Ok(90));
        assert_eq!(parse_duration_secs("3m"), Ok(180));
        assert_eq!(parse_duration_secs("1h"), Ok(3600));
        assert!(parse_duration_secs("3d").is_err());
        assert!(parse_duration_secs("m").is_err());
        assert!(parse_duration_secs("0s").is_err());
    }

    fn scratch(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("xtask-head-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("scratch dir");
        d
    }

    #[test]
    fn a_checkout_s_commit_is_read_from_a_loose_ref() {
        let root = scratch("loose");
        std::fs::create_dir_all(root.join(".git/refs/heads")).expect("refs");
        std::fs::write(root.join(".git/HEAD"), "ref: refs/heads/main\n").expect("HEAD");
        std::fs::write(
            root.join(".git/refs/heads/main"),
            "0123456789abcdef0123456789abcdef01234567\n",
        )
        .expect("ref");
        assert_eq!(head_commit(&root), "0123456789 (main)");
        std::fs::write(
            root.join(".git/HEAD"),
            "fedcba9876543210fedcba9876543210fedcba98\n",
        )
        .expect("detached HEAD");
        assert_eq!(head_commit(&root), "fedcba9876");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_worktree_s_commit_is_read_through_its_common_dir_and_packed_refs() {
        let base = scratch("worktree");
        let common = base.join("main/.git");
        let gitdir = common.join("worktrees/wt");
        let root = base.join("wt");
        std::fs::create_dir_all(&gitdir).expect("gitdir");
        std::fs::create_dir_all(&root).expect("worktree");
        std::fs::write(root.join(".git"), format!("gitdir: {}\n", gitdir.display()))
            .expect(".git file");
        std::fs::write(gitdir.join("HEAD"), "ref: refs/heads/bench\n").expect("HEAD");
        std::fs::write(gitdir.join("commondir"), "../..\n").expect("commondir");
        std::fs::write(
            common.join("packed-refs"),
            "# pack-refs with: peeled fully-peeled sorted\n\
             aaaaaaaaaabbbbbbbbbbccccccccccdddddddddd refs/heads/bench\n",
        )
        .expect("packed-refs");
        assert_eq!(head_commit(&root), "aaaaaaaaaa (bench)");
        assert_eq!(head_commit(&base.join("nowhere")), "unknown");
        let _ = std::fs::remove_dir_all(&base);
    }
}
