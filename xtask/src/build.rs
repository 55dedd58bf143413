//! `cargo xtask build` and `cargo xtask manifests`.

use std::path::PathBuf;

use anyhow::{Context as _, Result, bail};

use crate::{cmd, setup};

/// Build the agent in release mode; `agent/build.rs` builds and embeds the
/// eBPF object, so the binary is self-contained. Returns the binary's path.
pub fn run() -> Result<PathBuf> {
    setup::run()?;
    release_binary()
}

/// Build the release binaries, the agent and the thin plugin, without
/// running setup (callers ran it already). Returns the agent's path.
pub fn release_binary() -> Result<PathBuf> {
    let root = cmd::workspace_root();
    cmd::run(cmd::program("cargo").current_dir(&root).args([
        "build",
        "--release",
        "-p",
        "xdhcp",
        "-p",
        "xdhcp-plugin",
    ]))?;
    let bin = root.join("target/release/xdhcp");
    for built in [&bin, &root.join("target/release/xdhcp-plugin")] {
        if !built.exists() {
            bail!(
                "cargo reported success but {} does not exist",
                built.display()
            );
        }
    }
    println!("built {}", bin.display());
    Ok(bin)
}

/// The CRD file generated from `xdhcp-api`'s Rust types.
const CRD_PATH: &str = "manifests/crd/clusteruserdefinednetworks.k8s.ovn.org.yaml";

/// Regenerate the CRD manifest from the Rust types, or with `check` fail when
/// the committed file has drifted from them.
pub fn manifests(check: bool) -> Result<()> {
    let root = cmd::workspace_root();
    let out = cmd::output(cmd::program("cargo").current_dir(&root).args([
        "run",
        "--quiet",
        "-p",
        "xdhcp-api",
        "--bin",
        "crdgen",
    ]))?;
    let path = root.join(CRD_PATH);
    if check {
        let committed =
            std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        if committed != out.stdout {
            bail!("{CRD_PATH} is out of date with the Rust types: run `cargo xtask manifests`");
        }
        println!("{CRD_PATH} matches the Rust types");
    } else {
        std::fs::write(&path, &out.stdout)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {CRD_PATH}");
    }
    Ok(())
}
