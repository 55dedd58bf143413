//! `cargo xtask build` and `cargo xtask manifests`.

use std::path::PathBuf;

use anyhow::{Context as _, Result, bail};

use crate::triple::plugin_target;
use crate::{cmd, setup};

/// Build the agent in release mode; `agent/build.rs` builds and embeds the
/// eBPF object, so the binary is self-contained. Returns the binary's path.
pub fn run() -> Result<PathBuf> {
    setup::run()?;
    release_binary()
}

/// Build the release binaries, the agent and the thin plugin, without
/// running setup (callers ran it already). Returns the agent's path; the
/// plugin's is [`plugin_binary`] ([`plugin`]).
pub fn release_binary() -> Result<PathBuf> {
    let root = cmd::workspace_root();
    cmd::run(
        cmd::program("cargo")
            .current_dir(&root)
            .args(["build", "--release", "-p", "xdhcp"]),
    )?;
    let plugin = plugin()?;
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

/// Build the thin plugin as shipped (release, static, musl); its path.
///
/// Static: the node's container runtime execs it for every CNI call, from
/// the host's /opt/cni/bin, so it must not depend on the host's C library
/// (the agent runs in its image). Against musl rather than glibc: glibc's
/// start-up reads the CPU's features and cache geometry with dozens of
/// `cpuid` instructions, and on a virtual machine — where most nodes run —
/// each one exits to the hypervisor. Measured on the 2-core VM this is
/// developed on: 1.04–1.10 ms per exec for the static glibc build (as much
/// as `/bin/true`), 0.43–0.52 ms for musl; the plugin does nothing where
/// musl's allocator or resolver would matter (one socket, one JSON
/// exchange). `--target` keeps build scripts and proc-macros native.
pub fn plugin() -> Result<PathBuf> {
    let root = cmd::workspace_root();
    let target = plugin_target()?;
    cmd::run(cmd::program("cargo").current_dir(&root).args([
        "build",
        "--release",
        "-p",
        "xdhcp-plugin",
        "--target",
        &target,
    ]))?;
    Ok(plugin_path(&target))
}

/// Where [`plugin`] puts the thin plugin.
pub fn plugin_binary() -> Result<PathBuf> {
    Ok(plugin_path(&plugin_target()?))
}

fn plugin_path(target: &str) -> PathBuf {
    cmd::workspace_root()
        .join("target")
        .join(target)
        .join("release/xdhcp-plugin")
}

/// The CRD files generated from `xdhcp-api`'s Rust types, with the
/// `crdgen` argument that prints each.
const CRDS: [(&str, Option<&str>); 2] = [
    (
        "manifests/crd/clusteruserdefinednetworks.k8s.ovn.org.yaml",
        None,
    ),
    (
        "manifests/crd/dhcpguardpolicies.xdhcp.io.yaml",
        Some("guard"),
    ),
];

/// Regenerate the CRD manifests from the Rust types, or with `check` fail
/// when a committed file has drifted from them.
pub fn manifests(check: bool) -> Result<()> {
    let root = cmd::workspace_root();
    for (crd_path, arg) in CRDS {
        let mut run = cmd::program("cargo");
        run.current_dir(&root)
            .args(["run", "--quiet", "-p", "xdhcp-api", "--bin", "crdgen"]);
        if let Some(arg) = arg {
            run.args(["--", arg]);
        }
        let out = cmd::output(&mut run)?;
        let path = root.join(crd_path);
        if check {
            let committed =
                std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            if committed != out.stdout {
                bail!("{crd_path} is out of date with the Rust types: run `cargo xtask manifests`");
            }
            println!("{crd_path} matches the Rust types");
        } else {
            std::fs::write(&path, &out.stdout)
                .with_context(|| format!("writing {}", path.display()))?;
            println!("wrote {crd_path}");
        }
    }
    Ok(())
}
