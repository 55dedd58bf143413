//! Target triples: the host's, and the thin plugin's (its musl twin).
//!
//! Shared by `setup` (which installs the plugin's target) and `build` (which
//! builds for it); it imports only [`crate::cmd`], so neither imports the
//! other for it.

use anyhow::{Context as _, Result};

use crate::cmd;

/// The musl triple of the host's architecture (`x86_64-unknown-linux-musl`).
pub fn plugin_target() -> Result<String> {
    let host = host_triple()?;
    let arch = host
        .split('-')
        .next()
        .with_context(|| format!("host triple {host:?}"))?;
    Ok(format!("{arch}-unknown-linux-musl"))
}

/// The host's target triple, as `rustc -vV` prints it.
fn host_triple() -> Result<String> {
    let out = cmd::output(cmd::program("rustc").arg("-vV"))?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(|h| h.trim().to_owned())
        .context("`rustc -vV` printed no host triple")
}
