//! `cargo xtask`: everything a person does with xdhcp — set up the toolchain,
//! build, run the demo, run the tests, run the benchmarks.
#![expect(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "xtask is a CLI tool"
)]

mod bench;
mod build;
mod cmd;
mod demo;
mod fuzz;
mod image;
mod setup;
mod test;
mod testrun;
mod triple;
mod vmtest;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "xdhcp developer tasks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install what the project needs (Debian packages, rust-src, bpf-linker). Idempotent.
    Setup,
    /// Build the eBPF object and the agent (release); the agent embeds the object.
    Build,
    /// Set up, build, then run the end-to-end demo: an OVS + OVN node in private
    /// network namespaces (a Linux bridge where OVS cannot run).
    Demo(demo::Args),
    /// Set up, then run every check and test: fmt, clippy (workspace and eBPF), unit and integration tests, the VM tier.
    Test(test::Args),
    /// The VM test tier: boot Debian 12's 6.1 kernel in qemu and run the guest
    /// suite there (eBPF verifier, native XDP on virtio-net, the pod path, the
    /// VFIO handoff of a real PCI NIC). Sets up what it needs first.
    Vmtest(vmtest::Args),
    /// Benchmarks, side by side with the baselines, reported as ratios.
    Bench(bench::Args),
    /// Run the cargo-fuzz targets (one or all; installs cargo-fuzz if missing). Not part of CI.
    Fuzz(fuzz::Args),
    /// Regenerate manifests/crd from the Rust types (or check them with --check).
    Manifests {
        /// Fail instead of writing when the committed files differ.
        #[arg(long)]
        check: bool,
    },
    /// Build the agent image from `Containerfile` (localhost/xdhcp:latest, the
    /// `DaemonSet`'s) with podman, docker or buildah, whichever is on PATH.
    Image(image::Args),
    /// Run the kind-based end-to-end test (needs Docker and a container registry; never run so far).
    E2eKind,
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Setup => setup::run(),
        Command::Build => build::run().map(|_| ()),
        Command::Demo(args) => demo::run(&args),
        Command::Test(args) => test::run(&args),
        Command::Vmtest(args) => vmtest::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Fuzz(args) => fuzz::run(&args),
        Command::Manifests { check } => build::manifests(check),
        Command::Image(args) => image::run(&args),
        Command::E2eKind => cmd::run(cmd::program("bash").arg("hack/e2e-kind.sh")),
    };
    if let Err(e) = result {
        eprintln!("xtask: error: {e:#}");
        std::process::exit(1);
    }
}
