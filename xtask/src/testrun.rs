//! Running the workspace's tests: every test binary cargo builds, two at
//! once, and a digest of what failed at the very end of the output.
//!
//! Two binaries at once, not one as `cargo test` runs them: the integration
//! tests spend most of their time waiting on DHCP exchanges, timers and
//! retransmissions, and one binary at a time left the two cores 60–70 %
//! idle. Each test makes its own namespaces, servers, agent and directories
//! (`xdhcp_tests::netns::unique_name` carries the process id), so binaries
//! share nothing but the load. A binary's output is held until it ends and
//! then printed whole, so the log reads as one binary after another.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufRead, BufReader, Seek};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::cmd;

/// Test binaries run at once.
const AT_ONCE: usize = 2;

/// Runs `cargo test` (a filter or other arguments given), its output passed
/// through as it comes, and when a test failed, names each failed test with
/// the head of its panic message once more at the very end: a log that only
/// its tail is read of (a CI page) still says what failed.
pub fn cargo_test(cargo: &mut Command) -> Result<()> {
    cargo.stdout(Stdio::piped());
    let line = cmd::describe(cargo);
    println!("\x1b[1m$ {line}\x1b[0m");
    let mut child = cargo
        .spawn()
        .with_context(|| format!("failed to start `{line}`"))?;
    let out = BufReader::new(child.stdout.take().context("cargo's stdout")?);
    let mut failures = Failures::default();
    for_each_line(out, |text| {
        println!("{text}");
        failures.read(text);
    })?;
    let status = child.wait()?;
    if status.success() {
        return Ok(());
    }
    print!("{}", failures.digest());
    bail!("`{line}` failed ({status})")
}

/// Builds every test binary of `packages`, runs them [`AT_ONCE`] at a time
/// (each in its package's directory, as cargo runs them, with `threads`
/// tests at once and the plugin at `plugin`), then the doctests. Every
/// binary runs even when one fails; at the end, the failed tests and
/// binaries are named again.
pub fn all_binaries(root: &Path, packages: &[&str], plugin: &Path, threads: &str) -> Result<()> {
    let binaries = build(root, packages)?;
    println!(
        "test: {} test binaries, {AT_ONCE} at once, {threads} tests at once in each",
        binaries.len()
    );
    let started = Instant::now();
    let mut queue: VecDeque<TestBinary> = binaries.into();
    let mut running: Vec<Running> = Vec::new();
    let mut failures = Failures::default();
    let mut failed: Vec<String> = Vec::new();
    while !queue.is_empty() || !running.is_empty() {
        while running.len() < AT_ONCE
            && let Some(binary) = queue.pop_front()
        {
            running.push(Running::start(binary, plugin, threads)?);
        }
        let mut i = 0;
        while i < running.len() {
            match running[i].child.try_wait()? {
                Some(status) => {
                    let mut done = running.swap_remove(i);
                    if !done.report(status, &mut failures)? {
                        failed.push(done.binary.name.clone());
                    }
                }
                None => i += 1,
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "test: every test binary ran in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    let doc = cmd::program("cargo")
        .current_dir(root)
        .args(["test", "--doc"])
        .args(packages)
        .status()
        .context("failed to start `cargo test --doc`")?;
    if !doc.success() {
        failed.push("the doctests".to_owned());
    }
    if failed.is_empty() {
        return Ok(());
    }
    print!("{}", failures.digest());
    bail!("{} failed: {}", failed.len(), failed.join(", "))
}

/// One test binary as `cargo test --no-run` built it.
struct TestBinary {
    /// Its package and what `cargo test` calls it: `xdhcp-tests
    /// tests/cni.rs`, `xdhcp-engine unittests src/lib.rs`.
    name: String,
    executable: PathBuf,
    /// Its package's directory: where cargo runs it.
    dir: PathBuf,
}

/// Builds the test binaries and reads their paths from cargo's messages.
fn build(root: &Path, packages: &[&str]) -> Result<Vec<TestBinary>> {
    let mut cargo = cmd::program("cargo");
    cargo
        .current_dir(root)
        .args([
            "test",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .args(packages)
        .stdout(Stdio::piped());
    let line = cmd::describe(&cargo);
    println!("\x1b[1m$ {line}\x1b[0m");
    let mut child = cargo
        .spawn()
        .with_context(|| format!("failed to start `{line}`"))?;
    let out = BufReader::new(child.stdout.take().context("cargo's stdout")?);
    let mut binaries = Vec::new();
    for_each_line(out, |text| {
        if let Some(binary) = test_binary(text) {
            binaries.push(binary);
        }
    })?;
    let status = child.wait()?;
    if !status.success() {
        bail!("`{line}` failed ({status})");
    }
    if binaries.is_empty() {
        bail!("`{line}` built no test binary");
    }
    Ok(binaries)
}

/// The test binary a line of cargo's JSON messages names, if it names one.
fn test_binary(line: &str) -> Option<TestBinary> {
    let message: serde_json::Value = serde_json::from_str(line).ok()?;
    if message["reason"] != "compiler-artifact" || message["profile"]["test"] != true {
        return None;
    }
    let executable = PathBuf::from(message["executable"].as_str()?);
    let manifest = Path::new(message["manifest_path"].as_str()?);
    let dir = manifest.parent()?.to_path_buf();
    let target = &message["target"];
    let src = Path::new(target["src_path"].as_str()?);
    let src = src.strip_prefix(&dir).unwrap_or(src).display().to_string();
    let kinds = target["kind"].as_array()?;
    // `path+file:///…/engine#xdhcp-engine@0.1.0`
    let package = message["package_id"]
        .as_str()
        .and_then(|id| id.rsplit_once('#'))
        .map_or("", |(_, p)| p.split_once('@').map_or(p, |(name, _)| name));
    let name = if kinds.iter().any(|k| k == "test") {
        format!("{package} {src}")
    } else {
        format!("{package} unittests {src}")
    };
    Some(TestBinary {
        name,
        executable,
        dir,
    })
}

/// A test binary running, its output going to a file of its own.
struct Running {
    binary: TestBinary,
    child: Child,
    output: File,
    started: Instant,
}

impl Running {
    fn start(binary: TestBinary, plugin: &Path, threads: &str) -> Result<Self> {
        let output = tempfile()?;
        let child = Command::new(&binary.executable)
            .current_dir(&binary.dir)
            .env("RUST_TEST_THREADS", threads)
            .env("XDHCP_PLUGIN_BIN", plugin)
            .stdin(Stdio::null())
            .stdout(output.try_clone()?)
            .stderr(output.try_clone()?)
            .spawn()
            .with_context(|| format!("failed to start {}", binary.executable.display()))?;
        Ok(Self {
            binary,
            child,
            output,
            started: Instant::now(),
        })
    }

    /// Prints the binary's output whole, feeds it to `failures`, and says
    /// whether the binary passed.
    fn report(&mut self, status: ExitStatus, failures: &mut Failures) -> Result<bool> {
        println!(
            "     Running {} ({}) in {:.1} s",
            self.binary.name,
            self.binary.executable.display(),
            self.started.elapsed().as_secs_f64()
        );
        self.output.rewind()?;
        for_each_line(BufReader::new(&mut self.output), |text| {
            println!("{text}");
            failures.read(text);
        })?;
        if !status.success() {
            println!("{} failed ({status})", self.binary.name);
        }
        Ok(status.success())
    }
}

/// An unnamed file, removed when closed.
fn tempfile() -> Result<File> {
    let dir = std::env::temp_dir();
    for n in 0..1000u32 {
        let path = dir.join(format!("xtask-test-{}-{n}.out", std::process::id()));
        match File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(file) => {
                std::fs::remove_file(&path)?;
                return Ok(file);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e).with_context(|| format!("creating {}", path.display())),
        }
    }
    bail!("no free name for a test output file in {}", dir.display())
}

/// Calls `f` with each line of `input`, invalid UTF-8 replaced.
fn for_each_line(mut input: impl BufRead, mut f: impl FnMut(&str)) -> Result<()> {
    let mut buf = Vec::new();
    loop {
        buf.clear();
        if input.read_until(b'\n', &mut buf)? == 0 {
            return Ok(());
        }
        let text = String::from_utf8_lossy(&buf);
        f(text.trim_end_matches(['\n', '\r']));
    }
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::{Failures, test_binary};

    #[test]
    fn cargos_messages_name_the_test_binaries_and_where_they_run() {
        let unit = r#"{"reason":"compiler-artifact","package_id":"path+file:///w/engine#xdhcp-engine@0.1.0","manifest_path":"/w/engine/Cargo.toml","target":{"kind":["lib"],"crate_types":["lib"],"name":"xdhcp_engine","src_path":"/w/engine/src/lib.rs","edition":"2024","doc":true,"doctest":true,"test":true},"profile":{"opt_level":"0","test":true},"features":[],"filenames":["/w/target/debug/deps/xdhcp_engine-f3"],"executable":"/w/target/debug/deps/xdhcp_engine-f3","fresh":false}"#;
        let b = test_binary(unit).expect("a lib's unit tests");
        assert_eq!(b.name, "xdhcp-engine unittests src/lib.rs");
        assert_eq!(
            b.executable,
            Path::new("/w/target/debug/deps/xdhcp_engine-f3")
        );
        assert_eq!(b.dir, Path::new("/w/engine"));

        let integration = unit
            .replace(r#""kind":["lib"]"#, r#""kind":["test"]"#)
            .replace("/w/engine/src/lib.rs", "/w/engine/tests/cni.rs");
        assert_eq!(
            test_binary(&integration).expect("a test").name,
            "xdhcp-engine tests/cni.rs"
        );

        // The same library built to link into the tests: no test binary.
        let lib = unit.replace(
            r#""opt_level":"0","test":true"#,
            r#""opt_level":"0","test":false"#,
        );
        assert!(test_binary(&lib).is_none());
        // A test build with nothing to run (no executable), other messages.
        let no_exe = unit.replace(
            r#""executable":"/w/target/debug/deps/xdhcp_engine-f3""#,
            r#""executable":null"#,
        );
        assert!(test_binary(&no_exe).is_none());
        assert!(test_binary(r#"{"reason":"build-finished","success":true}"#).is_none());
        assert!(test_binary("   Compiling xdhcp-engine").is_none());
    }

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
