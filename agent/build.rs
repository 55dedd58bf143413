//! Builds the eBPF object (`ebpf/`, crate `xdhcp-ebpf`) with aya-build so the
//! agent can embed it with `include_bytes_aligned!`. `AYA_BUILD_SKIP=1` skips
//! it (then the agent still compiles, but embeds nothing loadable).

use anyhow::{Context as _, anyhow};

/// The eBPF crate's package name.
const EBPF_PACKAGE: &str = "xdhcp-ebpf";

fn main() -> anyhow::Result<()> {
    let metadata = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata (looking for the eBPF crate)")?;
    let package = metadata
        .packages
        .into_iter()
        .find(|p| p.name.as_str() == EBPF_PACKAGE)
        .ok_or_else(|| anyhow!("package {EBPF_PACKAGE} not found in the workspace"))?;
    let root_dir = package
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("{} has no parent directory", package.manifest_path))?;
    // The agent's `test-hooks` feature turns on the eBPF crate's feature of
    // the same name (test-only programs); the shipped object has none.
    let features: &[&str] = if std::env::var_os("CARGO_FEATURE_TEST_HOOKS").is_some() {
        &["test-hooks"]
    } else {
        &[]
    };
    aya_build::build_ebpf(
        [aya_build::Package {
            name: EBPF_PACKAGE,
            root_dir: root_dir.as_str(),
            features,
            ..Default::default()
        }],
        aya_build::Toolchain::Custom(xdhcp_common::EBPF_TOOLCHAIN),
    )
    .context("building the eBPF object (bpf-linker and the nightly toolchain with rust-src are needed; `cargo xtask setup` installs them)")?;
    // When skipped, leave an empty object so `include_bytes_aligned!` compiles;
    // loading it then fails with a clear "object is empty" error.
    let out_dir = std::path::PathBuf::from(std::env::var_os("OUT_DIR").context("OUT_DIR not set")?);
    let object = out_dir.join(EBPF_PACKAGE);
    if !object.exists() {
        std::fs::write(&object, []).with_context(|| format!("writing {}", object.display()))?;
    }
    // The object's stamp (64-bit FNV-1a of its bytes), computed here once
    // rather than over its megabyte at every agent start: a starting agent
    // compares it with the stamp of the programs a previous one pinned.
    let bytes = std::fs::read(&object).with_context(|| format!("reading {}", object.display()))?;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    println!("cargo:rustc-env=XDHCP_EBPF_STAMP={h:016x}");
    Ok(())
}
