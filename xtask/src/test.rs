//! `cargo xtask test`: set up, then every check and test of the workspace.
//!
//! Order: formatting, clippy on the workspace, clippy on the eBPF crate in its
//! own invocation (feature unification would otherwise mix kernel and user
//! builds), then unit and integration tests, then the fuzz smoke step, then
//! the VM tier (`vmtest`: the kernel-facing tests again on Debian 12's 6.1
//! kernel in qemu, plus native XDP on virtio-net and the VFIO handoff of a
//! real PCI NIC). Integration tests need root: they create their own network
//! namespaces and start real DHCP servers.
//!
//! The fuzz smoke step replays every committed corpus of `fuzz/` through the
//! fuzz functions as a plain unit test (`xdhcp::fuzzing`), without libFuzzer:
//! building the fuzz crate with coverage instrumentation costs several
//! minutes, the replay under a second (`docs/fuzzing.md`).

use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use crate::{cmd, setup, vmtest};

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
    // failure at once.
    run_tests(
        cargo()
            .args(["test", "--no-fail-fast"])
            .args(packages)
            .args(&args.extra)
            .env("XDHCP_PLUGIN_BIN", &plugin)
            .env("RUST_TEST_THREADS", test_threads()),
    )?;
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

/// Runs `cargo test`, its output passed through as it comes, and when a
/// test failed, names each failed test with the head of its panic message
/// once more at the very end: a log that only its tail is read of (a CI
/// page) still says what failed, where the messages in full are far above,
/// among the other binaries' output.
fn run_tests(cargo: &mut Command) -> Result<()> {
    cargo.stdout(Stdio::piped());
    let line = cmd::describe(cargo);
    println!("\x1b[1m$ {line}\x1b[0m");
    let mut child = cargo
        .spawn()
        .with_context(|| format!("failed to start `{line}`"))?;
    let mut out = BufReader::new(child.stdout.take().context("cargo's stdout")?);
    let mut failures = Failures::default();
    let mut buf = Vec::new();
    loop {
        buf.clear();
        if out.read_until(b'\n', &mut buf)? == 0 {
            break;
        }
        let text = String::from_utf8_lossy(&buf);
        let text = text.trim_end_matches(['\n', '\r']);
        println!("{text}");
        failures.read(text);
    }
    let status = child.wait()?;
    if status.success() {
        return Ok(());
    }
    print!("{}", failures.digest());
    bail!("`{line}` failed ({status})")
}

/// The failed tests of a `cargo test` run, read from libtest's output: the
/// name of each (`---- name stdout ----`) and the head of its panic message.
#[derive(Default)]
struct Failures {
    tests: Vec<(String, Vec<String>)>,
    /// Reading the message of the last test: lines still to keep.
    keep: usize,
}

impl Failures {
    /// Lines of a panic message kept (its first, and where it points).
    const MESSAGE_LINES: usize = 6;
    /// A kept line's characters (messages carry whole agent logs).
    const LINE_CHARS: usize = 240;

    fn read(&mut self, line: &str) {
        if let Some(name) = line
            .strip_prefix("---- ")
            .and_then(|l| l.strip_suffix(" stdout ----"))
        {
            self.tests.push((name.to_owned(), Vec::new()));
            self.keep = 0;
            return;
        }
        let Some((_, message)) = self.tests.last_mut() else {
            return;
        };
        // `thread 'name' (id) panicked at file:line:col:`; older toolchains
        // print no id.
        if line.starts_with("thread '") && line.contains(" panicked at ") {
            // A test's first panic; a later one (another thread's) is not
            // the cause.
            if message.is_empty() {
                message.push(line.to_owned());
                self.keep = Self::MESSAGE_LINES - 1;
            }
            return;
        }
        if self.keep == 0 {
            return;
        }
        if line.starts_with("note: run with `RUST_BACKTRACE")
            || line.starts_with("stack backtrace:")
            || line == "failures:"
        {
            self.keep = 0;
            return;
        }
        message.push(line.chars().take(Self::LINE_CHARS).collect());
        self.keep -= 1;
    }

    fn digest(&self) -> String {
        if self.tests.is_empty() {
            return String::new();
        }
        let mut out = format!(
            "\n{} test(s) failed (their output is above in full):\n",
            self.tests.len()
        );
        for (name, message) in &self.tests {
            let _ = writeln!(out, "- {name}");
            for line in message {
                let _ = writeln!(out, "    {line}");
            }
        }
        out
    }
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

#[cfg(test)]
mod tests {
    use super::Failures;

    #[test]
    fn a_failed_tests_name_and_panic_head_are_repeated_in_the_digest() {
        let mut f = Failures::default();
        let out = "running 2 tests\n\
            test a ... ok\n\
            test b ... FAILED\n\
            \n\
            failures:\n\
            \n\
            ---- b stdout ----\n\
            20 concurrent ADDs: 1s\n\
            thread 'b' (4057) panicked at tests/tests/cni.rs:95:5:\n\
            the ADD took 3s\n\
            agent:\n\
            line 1\n\
            line 2\n\
            line 3\n\
            line 4\n\
            thread '<unnamed>' panicked at tests/src/lib.rs:1:1:\n\
            note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n\
            \n\
            \n\
            failures:\n\
            \x20   b\n\
            \n\
            test result: FAILED. 1 passed; 1 failed; 0 ignored";
        for line in out.lines() {
            f.read(line);
        }
        assert_eq!(
            f.digest(),
            "\n1 test(s) failed (their output is above in full):\n\
             - b\n\
             \x20   thread 'b' (4057) panicked at tests/tests/cni.rs:95:5:\n\
             \x20   the ADD took 3s\n\
             \x20   agent:\n\
             \x20   line 1\n\
             \x20   line 2\n\
             \x20   line 3\n"
        );
    }

    #[test]
    fn a_passing_run_has_no_digest() {
        let mut f = Failures::default();
        for line in ["running 1 test", "test a ... ok", "test result: ok."] {
            f.read(line);
        }
        assert_eq!(f.digest(), "");
    }
}
