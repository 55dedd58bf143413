//! `cargo xtask setup`: idempotent installation of what xdhcp needs on a fresh
//! machine of this kind (Debian 12, rustup with stable + nightly, root).
//!
//! Fast when everything is present: every step checks before it acts.

use std::{
    env,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};

use xdhcp_testbed::programs::{PROGRAMS, Source};

use crate::cmd;

/// The one toolchain used to build the eBPF object: the machine's installed
/// nightly (never a downloaded one). `agent/build.rs` reads the same constant
/// from `xdhcp-common`.
pub use xdhcp_common::EBPF_TOOLCHAIN;

/// bpf-linker release known to build against nightly's own LLVM.
const BPF_LINKER_VERSION: &str = "0.13.0";

/// The programs the test suites, the benchmarks, the demo and the VM tier
/// cannot run without, named here so that what a fresh machine gets is
/// visible where it is installed: each is a Debian entry of the program
/// table (unit test below) and present once `setup` has run (checked after
/// the install).
const ESSENTIAL: &[&str] = &[
    "dnsmasq",
    "kea-dhcp4",
    "kea-dhcp6",
    "dhcpd",
    "nft",
    "ip",
    "tc",
    "ss",
    "tcpdump",
    "bpftool",
    "iperf3",
    "mkfs.ext4",
    "losetup",
    "cni/bridge",
    "cni/dhcp",
    "qemu-system-x86_64",
    "busybox",
    "python3",
    // Guest DHCP clients of the passive-learning tests; `udhcpc` is
    // busybox's applet (`busybox udhcpc`), installed with `busybox` above.
    "dhcpcd",
    "dhclient",
    // Each guest client runs in a private mount namespace (and the
    // OVN-Kubernetes drop-in test's bare `dhcp daemon` too).
    "unshare",
    "sh",
    "mount",
    // The Open vSwitch + OVN node lab (the OVSDB client's tests, the uplinks
    // read from OVS), and ethtool to turn checksum offload off on its veths.
    "ovsdb-server",
    "ovsdb-tool",
    "ovs-vsctl",
    "ovs-ofctl",
    "ovs-vswitchd",
    "ovn-northd",
    "ovn-controller",
    "ovn-nbctl",
    "ethtool",
];
// Not installed on purpose: `socat` appears in the tests only as the name
// of a program outside the table, which `tests/tests/programs.rs` checks is
// refused; nothing runs it.

pub fn run() -> Result<()> {
    debian_packages()?;
    installed()?;
    rust_src()?;
    musl_target()?;
    bpf_linker()?;
    println!("setup: everything is in place");
    Ok(())
}

/// Installs the Debian package of every program in the one program table
/// (`xdhcp_testbed::programs`) whose file is missing. The tests, the
/// benchmarks and the demo find their programs in the same table, so what
/// they run is what this installs.
fn debian_packages() -> Result<()> {
    let mut missing: Vec<&str> = Vec::new();
    for p in PROGRAMS {
        if let Source::Debian { package, path } = p.source
            && !Path::new(path).exists()
            && !missing.contains(&package)
        {
            missing.push(package);
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    if !nix_is_root() {
        bail!(
            "Debian packages missing ({}) and this is not root: run `sudo cargo xtask setup` or \
             `apt-get install {}`",
            missing.join(", "),
            missing.join(" ")
        );
    }
    println!("setup: installing Debian packages: {}", missing.join(" "));
    cmd::run(cmd::program("apt-get").args(["update", "-qq"]))
        .context("apt-get update failed: is the Debian package mirror reachable?")?;
    cmd::run(
        cmd::program("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing),
    )
    .with_context(|| format!("could not install {}", missing.join(" ")))?;
    Ok(())
}

/// After the install: every Debian program of the table is where the table
/// says (a package that installed elsewhere fails here, not in a test).
fn installed() -> Result<()> {
    for name in ESSENTIAL {
        if xdhcp_testbed::programs::find(name)
            .and_then(xdhcp_testbed::programs::Program::package)
            .is_none()
        {
            bail!("{name} is not a Debian program of the table (testbed/src/programs.rs)");
        }
    }
    let absent: Vec<String> = PROGRAMS
        .iter()
        .filter_map(|p| match p.source {
            Source::Debian { package, path } if !Path::new(path).exists() => {
                Some(format!("{} ({path}, package {package})", p.name))
            }
            _ => None,
        })
        .collect();
    if absent.is_empty() {
        return Ok(());
    }
    bail!(
        "after installing, still missing: {} (testbed/src/programs.rs names the wrong path?)",
        absent.join(", ")
    )
}

fn nix_is_root() -> bool {
    cmd::output(cmd::program("id").arg("-u"))
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn toolchain_arg() -> String {
    format!("+{EBPF_TOOLCHAIN}")
}

/// The musl standard library for the workspace's toolchain: the thin
/// plugin is built against it (`build::plugin`).
fn musl_target() -> Result<()> {
    let target = crate::triple::plugin_target()?;
    let root = cmd::workspace_root();
    let installed = cmd::output(cmd::program("rustup").current_dir(&root).args([
        "target",
        "list",
        "--installed",
    ]))?;
    if String::from_utf8_lossy(&installed.stdout)
        .lines()
        .any(|l| l.trim() == target)
    {
        return Ok(());
    }
    println!("setup: adding the {target} target (the thin plugin's)");
    cmd::run(
        cmd::program("rustup")
            .current_dir(&root)
            .args(["target", "add", &target]),
    )
    .with_context(|| format!("could not add the {target} target (the thin plugin is built for it)"))
}

fn rust_src() -> Result<()> {
    if !cmd::succeeds(cmd::program("rustc").args([&toolchain_arg(), "-V"])) {
        bail!(
            "the `{EBPF_TOOLCHAIN}` toolchain is not installed: the eBPF object needs it \
             (`rustup toolchain install {EBPF_TOOLCHAIN}` where rustup can reach its server)"
        );
    }
    let installed = cmd::output(cmd::program("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        EBPF_TOOLCHAIN,
    ]))?;
    if String::from_utf8_lossy(&installed.stdout)
        .lines()
        .any(|l| l.starts_with("rust-src"))
    {
        return Ok(());
    }
    println!("setup: adding rust-src to {EBPF_TOOLCHAIN}");
    cmd::run(cmd::program("rustup").args([
        "component",
        "add",
        "rust-src",
        "--toolchain",
        EBPF_TOOLCHAIN,
    ]))
    .context("could not add rust-src (needed for -Z build-std=core)")
}

/// LLVM major version of the eBPF toolchain, read from `rustc -vV`.
fn nightly_llvm_major() -> Result<String> {
    let out = cmd::output(cmd::program("rustc").args([&toolchain_arg(), "-vV"]))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next())
        .map(str::to_owned)
        .with_context(|| format!("`rustc {} -vV` printed no LLVM version", toolchain_arg()))
}

/// `$XDG_CACHE_HOME/xdhcp` (or `~/.cache/xdhcp`): what setup and the VM tier
/// download or build once.
pub fn cache_dir() -> PathBuf {
    env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/var/cache"))
        .join("xdhcp")
}

/// Build bpf-linker against the LLVM shared library inside the nightly
/// toolchain (Debian's newest LLVM is older than nightly's).
fn bpf_linker() -> Result<()> {
    let major = nightly_llvm_major()?;
    let works = cmd::output(cmd::program("bpf-linker").arg("--version"));
    if let Ok(out) = &works {
        let v = String::from_utf8_lossy(&out.stdout);
        if v.contains(BPF_LINKER_VERSION) {
            return Ok(());
        }
        println!(
            "setup: bpf-linker present but not {BPF_LINKER_VERSION} ({}); rebuilding",
            v.trim()
        );
    }
    let sysroot =
        cmd::output(cmd::program("rustc").args([&toolchain_arg(), "--print", "sysroot"]))?;
    let sysroot = PathBuf::from(String::from_utf8_lossy(&sysroot.stdout).trim());
    let lib = sysroot.join("lib");
    // The real shared object is libLLVM.so.<ver>; libLLVM-*.so is a linker script.
    let so = std::fs::read_dir(&lib)
        .with_context(|| format!("reading {}", lib.display()))?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("libLLVM.so."))
        .with_context(|| {
            format!(
                "no libLLVM.so.* in {}: the {EBPF_TOOLCHAIN} toolchain ships no LLVM library",
                lib.display()
            )
        })?;
    let prefix = cache_dir().join(format!("llvm-prefix-{major}"));
    let plib = prefix.join("lib");
    std::fs::create_dir_all(&plib).with_context(|| format!("creating {}", plib.display()))?;
    for name in ["libLLVM.so", so.as_str()] {
        let link = plib.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(lib.join(&so), &link)
            .with_context(|| format!("linking {}", link.display()))?;
    }
    println!(
        "setup: building bpf-linker {BPF_LINKER_VERSION} against {EBPF_TOOLCHAIN}'s LLVM {major} (a few minutes, once)"
    );
    cmd::run(
        cmd::program("cargo")
            .env("LLVM_PREFIX", &prefix)
            .args([
                "install",
                "bpf-linker",
                "--version",
                BPF_LINKER_VERSION,
                "--locked",
                "--no-default-features",
            ])
            .args(["--features", &format!("llvm-{major}")]),
    )
    .context("could not build bpf-linker (needs crates.io)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_essential_program_is_installed_from_a_debian_package() {
        for name in ESSENTIAL {
            let p = xdhcp_testbed::programs::find(name)
                .unwrap_or_else(|| panic!("{name} is not in the program table"));
            assert!(p.package().is_some(), "{name} comes from no Debian package");
        }
    }
}
