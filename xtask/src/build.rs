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
/// running setup (callers ran it already). Returns the agent's path; the
/// plugin's is [`plugin_binary`].
pub fn release_binary() -> Result<PathBuf> {
    let root = cmd::workspace_root();
    cmd::run(
        cmd::program("cargo")
            .current_dir(&root)
            .args(["build", "--release", "-p", "xdhcp"]),
    )?;
    // The thin plugin is linked statically: the node's container runtime
    // execs it for every CNI call, from the host's /opt/cni/bin, so it must
    // not depend on the host's C library (the agent runs in its image), and
    // with no dynamic loader to run each exec is about half a millisecond
    // shorter. `--target` keeps the static flag off build scripts and
    // proc-macros, which cannot be static.
    let host = host_triple()?;
    let plugin = plugin_path(&root, &host);
    let flags_var = format!(
        "CARGO_TARGET_{}_RUSTFLAGS",
        host.to_uppercase().replace('-', "_")
    );
    cmd::run(
        cmd::program("cargo")
            .current_dir(&root)
            .env(flags_var, "-C target-feature=+crt-static")
            .args([
                "build",
                "--release",
                "-p",
                "xdhcp-plugin",
                "--target",
                &host,
            ]),
    )?;
    let bin = root.join("target/release/xdhcp");
    for built in [&bin, &plugin] {
        if !built.exists() {
            bail!(
                "cargo reported success but {} does not exist",
                built.display()
            );
        }
    }
    println!("built {} and {}", bin.display(), plugin.display());
    Ok(bin)
}

/// Where [`release_binary`] puts the statically linked thin plugin.
pub fn plugin_binary() -> Result<PathBuf> {
    Ok(plugin_path(&cmd::workspace_root(), &host_triple()?))
}

fn plugin_path(root: &std::path::Path, host: &str) -> PathBuf {
    root.join("target").join(host).join("release/xdhcp-plugin")
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
