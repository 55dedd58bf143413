//! `cargo xtask test`: set up, then every check and test of the workspace.
//!
//! Order: formatting, clippy on the workspace, clippy on the eBPF crate in its
//! own invocation (feature unification would otherwise mix kernel and user
//! builds), then unit and integration tests (every test binary, two at a
//! time: `testrun`), then the fuzz smoke step, then
//! the VM tier (`vmtest`: the kernel-facing tests again on Debian 12's 6.1
//! kernel in qemu, plus native XDP on virtio-net and the VFIO handoff of a
//! real PCI NIC). Integration tests need root: they create their own network
//! namespaces and start real DHCP servers.
//!
//! The fuzz smoke step replays every committed corpus of `fuzz/` through the
//! fuzz functions as a plain unit test (`xdhcp::fuzzing`), without libFuzzer:
//! building the fuzz crate with coverage instrumentation costs several
//! minutes, the replay under a second (`docs/fuzzing.md`).

use anyhow::{Result, bail};

use crate::{cmd, setup, testrun, vmtest};

#[derive(clap::Args)]
pub struct Args {
    /// Skip `cargo xtask setup` (when you know everything is installed).
    #[arg(long)]
    no_setup: bool,
    /// Skip fmt and clippy.
    #[arg(long)]
    no_lint: bool,
    /// Skip the VM tier (`cargo xtask vmtest`), which otherwise runs last.
    #[arg(long)]
    no_vm: bool,
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
        let mut c = cmd::program("cargo");
        c.current_dir(&root);
        c
    };
    // Every host member, the tests crate included: it is no default member
    // (`xdhcp_testbed::TEST_BUILD_PACKAGES`).
    let packages = xdhcp_testbed::TEST_BUILD_PACKAGES;
    if !args.no_lint {
        cmd::run(cargo().args(["fmt", "--all", "--", "--check"]))?;
        cmd::run(cargo().arg("clippy").args(packages).args([
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]))?;
        ebpf_clippy(&root)?;
    }
    // The tests that exec the plugin exec it as shipped: release, static,
    // musl (`build::plugin`), not the debug build `cargo test` makes.
    let plugin = crate::build::plugin()?;
    // Every test binary runs even when one fails, so a run reports every
    // failure at once. A filter goes to `cargo test`, which applies it.
    if args.extra.is_empty() {
        testrun::all_binaries(&root, packages, &plugin, &test_threads())?;
    } else {
        testrun::cargo_test(
            cargo()
                .args(["test", "--no-fail-fast"])
                .args(packages)
                .args(&args.extra)
                .env("XDHCP_PLUGIN_BIN", &plugin)
                .env("RUST_TEST_THREADS", test_threads()),
        )?;
    }
    // Fuzz smoke: every seed and corpus input through its fuzz function.
    // Same package selection as above, so the test binaries are reused.
    cmd::run(
        cargo()
            .arg("test")
            .args(packages)
            .args(["--lib", "fuzzing::tests"]),
    )?;
    if !args.no_vm && args.extra.is_empty() {
        // The second kernel: Debian 12's 6.1 in qemu (its own setup steps
        // fetch the kernel and virtme-ng; the packages came with setup).
        vmtest::run(&vmtest::Args {
            no_setup: true,
            ..vmtest::Args::default()
        })?;
    } else {
        println!(
            "test: the VM tier was not run ({}); run it with `cargo xtask vmtest`",
            if args.no_vm {
                "--no-vm"
            } else {
                "a cargo test filter was given"
            }
        );
    }
    Ok(())
}

/// Lint the eBPF crate for its own target with the eBPF toolchain, with
/// every feature (the test-only programs too).
fn ebpf_clippy(root: &std::path::Path) -> Result<()> {
    cmd::run(
        cmd::program("cargo")
            .current_dir(root.join("ebpf"))
            .arg(format!("+{}", setup::EBPF_TOOLCHAIN))
            .args([
                "clippy",
                "--release",
                "--all-features",
                "--target",
                "bpfel-unknown-none",
                "-Z",
                "build-std=core",
            ])
            .args(["--", "-D", "warnings"]),
    )
}

/// How many tests of one binary run at once: `RUST_TEST_THREADS` when set,
/// else [`TEST_THREADS`].
fn test_threads() -> String {
    std::env::var("RUST_TEST_THREADS").unwrap_or_else(|_| TEST_THREADS.to_string())
}

/// Tests of one binary run at once by default. The integration tests spend
/// most of their time waiting (DHCP exchanges, lease timers, retransmits),
/// not on a core, so libtest's default of one per core leaves the machine
/// idle: on 2 cores the test binaries took 561 s with 4 at once against
/// 685 s with 2, every test passing. Each test makes its own namespaces,
/// servers and agent, so more at once changes only the load.
const TEST_THREADS: usize = 4;

fn nix_root() -> bool {
    cmd::output(cmd::program("id").arg("-u"))
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}
