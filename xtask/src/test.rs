//! `cargo xtask test`: set up, then every check and test of the workspace.
//!
//! Order: formatting, clippy on the workspace, clippy on the eBPF crate in its
//! own invocation (feature unification would otherwise mix kernel and user
//! builds), then unit and integration tests, then the fuzz smoke step.
//! Integration tests need root: they create their own network namespaces and
//! start real DHCP servers.
//!
//! The fuzz smoke step replays every committed corpus of `fuzz/` through the
//! fuzz functions as a plain unit test (`xdhcp::fuzzing`), without libFuzzer:
//! building the fuzz crate with coverage instrumentation costs several
//! minutes, the replay under a second (`docs/fuzzing.md`).

use std::process::Command;

use anyhow::{Result, bail};

use crate::{cmd, setup};

#[derive(clap::Args)]
pub struct Args {
    /// Skip `cargo xtask setup` (when you know everything is installed).
    #[arg(long)]
    no_setup: bool,
    /// Skip fmt and clippy.
    #[arg(long)]
    no_lint: bool,
    /// Extra arguments passed to `cargo test` (e.g. a test-name filter).
    #[arg(last = true)]
    extra: Vec<String>,
}

pub fn run(args: &Args) -> Result<()> {
    if !args.no_setup {
        setup::run()?;
    }
    if !nix_root() {
        bail!("the integration tests create network namespaces and need root: run as root");
    }
    let root = cmd::workspace_root();
    let cargo = || {
        let mut c = Command::new("cargo");
        c.current_dir(&root);
        c
    };
    if !args.no_lint {
        cmd::run(cargo().args(["fmt", "--all", "--", "--check"]))?;
        cmd::run(cargo().args(["clippy", "--all-targets", "--", "-D", "warnings"]))?;
        ebpf_clippy(&root)?;
    }
    cmd::run(cargo().args(["test"]).args(&args.extra))?;
    // Fuzz smoke: every seed and corpus input through its fuzz function.
    // Same package selection as above, so the test binaries are reused.
    cmd::run(cargo().args(["test", "--lib", "fuzzing::tests"]))?;
    Ok(())
}

/// Lint the eBPF crate for its own target with the eBPF toolchain.
fn ebpf_clippy(root: &std::path::Path) -> Result<()> {
    cmd::run(
        Command::new("cargo")
            .current_dir(root.join("ebpf"))
            .arg(format!("+{}", setup::EBPF_TOOLCHAIN))
            .args([
                "clippy",
                "--release",
                "--target",
                "bpfel-unknown-none",
                "-Z",
                "build-std=core",
            ])
            .args(["--", "-D", "warnings"]),
    )
}

fn nix_root() -> bool {
    cmd::output(Command::new("id").arg("-u"))
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}
