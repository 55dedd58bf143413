//! Running commands with a readable echo and errors that say what failed.

use std::{
    path::PathBuf,
    process::{Command, Output},
};

use anyhow::{Context as _, Result, bail};

/// The workspace root (xtask lives one level below it).
pub fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map_or(manifest.clone(), PathBuf::from)
}

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Run a command with inherited stdio; fail with the command line if it fails.
pub fn run(cmd: &mut Command) -> Result<()> {
    let line = describe(cmd);
    println!("\x1b[1m$ {line}\x1b[0m");
    let status = cmd
        .status()
        .with_context(|| format!("failed to start `{line}`"))?;
    if !status.success() {
        bail!("`{line}` failed ({status})");
    }
    Ok(())
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
