//! `cargo xtask fuzz [TARGET] [--time S]`: run the cargo-fuzz targets in
//! `fuzz/` (one, or all one after the other), installing cargo-fuzz first
//! when it is missing.
//!
//! Each target starts from its committed seed corpus (`fuzz/corpus/<target>`,
//! files named `seed-*`); inputs libFuzzer finds interesting are added next
//! to them (ignored by git), crashes land in `fuzz/artifacts/<target>/`.
//! Runs are single-process (one libFuzzer job): the machines this runs on are
//! shared. Not part of CI; `cargo xtask test` replays the corpora through the
//! same fuzz functions as unit tests instead (see `docs/fuzzing.md`).

use std::path::Path;

use anyhow::{Context as _, Result, bail};

use crate::{cmd, setup};

/// cargo-fuzz release installed when `cargo fuzz` is missing or older.
const CARGO_FUZZ_VERSION: &str = "0.13.2";

#[derive(clap::Args)]
pub struct Args {
    /// Fuzz target (`cargo xtask fuzz --list`); all targets when omitted.
    target: Option<String>,
    /// Seconds to fuzz each target.
    #[arg(long, default_value_t = 60)]
    time: u64,
    /// Stop each target after this many executions instead (libFuzzer
    /// `-runs`; 0 replays the corpus only).
    #[arg(long)]
    runs: Option<u64>,
    /// Sanitizer (`none` or `address`). `none` is several times faster; the
    /// code under test is safe Rust, so panics, overflows and violated
    /// invariants are found either way.
    #[arg(long, default_value = "none")]
    sanitizer: String,
    /// List the targets and exit.
    #[arg(long)]
    list: bool,
    /// Extra libFuzzer flags (after `--`), e.g. `-- -max_len=4096`.
    #[arg(last = true)]
    libfuzzer: Vec<String>,
}

pub fn run(args: &Args) -> Result<()> {
    cargo_fuzz()?;
    let dir = cmd::workspace_root().join("fuzz");
    let all = targets(&dir)?;
    if args.list {
        for t in &all {
            println!("{t}");
        }
        return Ok(());
    }
    let chosen: Vec<String> = match &args.target {
        Some(t) if all.contains(t) => vec![t.clone()],
        Some(t) => bail!("no fuzz target {t:?}; targets: {}", all.join(", ")),
        None => all,
    };
    for t in &chosen {
        run_target(&dir, t, args)?;
    }
    Ok(())
}

/// `cargo fuzz` at [`CARGO_FUZZ_VERSION`] (or newer), installed if missing.
fn cargo_fuzz() -> Result<()> {
    let installed = cmd::output(cmd::program("cargo").args(["fuzz", "--version"]))
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    if let Ok(v) = &installed {
        // "cargo-fuzz 0.13.2"
        let have = v.rsplit(' ').next().unwrap_or_default();
        if version_at_least(have, CARGO_FUZZ_VERSION) {
            return Ok(());
        }
        println!("fuzz: {v} is older than {CARGO_FUZZ_VERSION}; reinstalling");
    }
    println!("fuzz: installing cargo-fuzz {CARGO_FUZZ_VERSION} (a minute or two, once)");
    cmd::run(cmd::program("cargo").args([
        "install",
        "cargo-fuzz",
        "--version",
        CARGO_FUZZ_VERSION,
        "--locked",
    ]))
    .context("could not install cargo-fuzz (needs crates.io)")
}

/// Dotted-version comparison, numerically per component.
fn version_at_least(have: &str, want: &str) -> bool {
    let parts = |v: &str| -> Vec<u64> { v.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
    parts(have) >= parts(want)
}

fn targets(dir: &Path) -> Result<Vec<String>> {
    let out = cmd::output(
        cmd::program("cargo")
            .arg(format!("+{}", setup::EBPF_TOOLCHAIN))
            .args(["fuzz", "list"])
            .current_dir(dir),
    )?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect())
}

fn run_target(dir: &Path, target: &str, args: &Args) -> Result<()> {
    let corpus = dir.join("corpus").join(target);
    let mut c = cmd::program("cargo");
    c.current_dir(dir)
        // The targets never load the eBPF object: skip building it.
        .env("AYA_BUILD_SKIP", "1")
        .arg(format!("+{}", setup::EBPF_TOOLCHAIN))
        .args(["fuzz", "run", "--sanitizer", &args.sanitizer, target])
        .arg(&corpus)
        .arg("--")
        .arg("-print_final_stats=1");
    match args.runs {
        Some(n) => c.arg(format!("-runs={n}")),
        None => c.arg(format!("-max_total_time={}", args.time)),
    };
    c.args(&args.libfuzzer);
    let artifacts = dir.join("artifacts").join(target);
    let before = files_in(&artifacts);
    let status = cmd::status(&mut c)?;
    if status.success() {
        return Ok(());
    }
    // libFuzzer writes every crashing input to the artifacts directory; a
    // run stopped from outside (a signal, a killed session) leaves none.
    let found: Vec<String> = files_in(&artifacts)
        .into_iter()
        .filter(|f| !before.contains(f))
        .collect();
    if found.is_empty() {
        bail!(
            "fuzz target {target} did not finish ({status}) and left no crashing input in {}: \
             it was stopped, or failed before fuzzing (see its output above)",
            artifacts.display()
        );
    }
    bail!(
        "fuzz target {target} found a crash: {} (in {})",
        found.join(", "),
        artifacts.display()
    )
}

/// The file names in `dir` (none when it does not exist).
fn files_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::version_at_least;

    #[test]
    fn versions_compare_numerically() {
        assert!(version_at_least("0.13.2", "0.13.2"));
        assert!(version_at_least("0.13.10", "0.13.2"));
        assert!(version_at_least("1.0.0", "0.13.2"));
        assert!(!version_at_least("0.12.9", "0.13.2"));
        assert!(!version_at_least("", "0.13.2"));
    }
}
