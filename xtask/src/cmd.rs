//! Running commands with a readable echo and errors that say what failed.

use std::{
    path::PathBuf,
    process::{Command, Output},
};

use anyhow::{Context as _, Result, bail};

/// The executable of the external program `name` from the one program table
/// (`xdhcp_testbed::programs`, which `cargo xtask setup` installs from): an
/// absolute path for a Debian program, the bare name for a Rust toolchain
/// program.
///
/// # Panics
/// If `name` is not in the table: a bug in xtask; add it there with its
/// Debian package.
pub fn executable(name: &str) -> &'static str {
    xdhcp_testbed::programs::find(name).map_or_else(
        || panic!("`{name}` is not in the program table (testbed/src/programs.rs): add it there"),
        xdhcp_testbed::programs::Program::executable,
    )
}

/// A [`Command`] for the table program `name` ([`executable`]).
pub fn program(name: &str) -> Command {
    let mut cmd = Command::new(executable(name));
    if name == "cargo" {
        // `cargo xtask` ran us with cargo's per-target variables set; the
        // cargo we start must see a shell's environment, as the cargo the
        // tests start does (`xdhcp_testbed::programs::is_cargo_target_env`).
        for (key, _) in std::env::vars_os() {
            let key = key.to_string_lossy();
            if xdhcp_testbed::programs::is_cargo_target_env(&key) {
                cmd.env_remove(&*key);
            }
        }
    }
    cmd
}

/// The workspace root (xtask lives one level below it).
pub fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map_or(manifest.clone(), PathBuf::from)
}

pub fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Run a command with inherited stdio; fail with the command line if it fails.
pub fn run(cmd: &mut Command) -> Result<()> {
    let status = status(cmd)?;
    if !status.success() {
        bail!("`{}` failed ({status})", describe(cmd));
    }
    Ok(())
}

/// Run a command, echoing it first, and return its exit status whatever it
/// is (for callers that explain a failure themselves).
pub fn status(cmd: &mut Command) -> Result<std::process::ExitStatus> {
    let line = describe(cmd);
    println!("\x1b[1m$ {line}\x1b[0m");
    cmd.status()
        .with_context(|| format!("failed to start `{line}`"))
}

/// Run a command quietly and capture its output; fail (with stderr) if it fails.
pub fn output(cmd: &mut Command) -> Result<Output> {
    let line = describe(cmd);
    let out = cmd
        .output()
        .with_context(|| format!("failed to start `{line}`"))?;
    if !out.status.success() {
        bail!(
            "`{line}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out)
}

/// Whether a command runs and exits 0 (used for idempotent checks).
pub fn succeeds(cmd: &mut Command) -> bool {
    cmd.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
