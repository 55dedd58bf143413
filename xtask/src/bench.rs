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
    /// DORA latency against dnsmasq and memory per bound lease.
    Dora,
    /// 1000 leases: restart under them (SIGTERM, SIGKILL), re-adoption time, the T1 renewal storm.
    Scale,
    /// A flood of DHCP replies no lease owns at a leased port and at an uplink: daemon CPU, and a
    /// 100-ADD burst during it against the same burst without it.
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
                .env("XDHCP_BENCH_COMMIT", head_commit(&root))
                .env("XDHCP_BIN", root.join("target/release/xdhcp"))
                .env("XDHCP_PLUGIN_BIN", crate::build::plugin_binary()?)
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
    use super::head_commit;

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
