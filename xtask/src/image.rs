//! `cargo xtask image`: the agent image from `Containerfile`, with the
//! first container engine found on `PATH` (podman, docker, buildah).

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};

use crate::{build, cmd};

/// The image the `DaemonSet` names (`manifests/daemonset.yaml`); loaded into
/// nodes, never pulled.
pub const IMAGE: &str = "localhost/xdhcp:latest";
/// The Containerfile, relative to the workspace root.
pub const CONTAINERFILE: &str = "Containerfile";
/// Where the build context (the release binaries `xdhcp` and
/// `xdhcp-plugin`) is assembled.
const CONTEXT_DIR: &str = "target/image";

/// `cargo xtask image` flags.
#[derive(clap::Args)]
pub struct Args {
    /// Base image (its glibc must be at least the build host's).
    #[arg(long)]
    base_image: Option<String>,
}

/// An engine found on `PATH`.
struct Engine {
    path: PathBuf,
    /// The subcommand that builds from a Containerfile.
    build: &'static str,
}

/// The first usable engine on `PATH`; every engine found and why it is not
/// usable goes into `skipped` (a docker CLI without a reachable daemon).
fn find_engine(skipped: &mut Vec<String>) -> Option<Engine> {
    let path = std::env::var_os("PATH")?;
    for name in xdhcp_testbed::programs::CONTAINER_ENGINES {
        let Some(found) = std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|p| is_executable(p))
        else {
            continue;
        };
        if *name == "docker" {
            // The CLI alone builds nothing: it needs its daemon.
            let ok = cmd::succeeds(std::process::Command::new(&found).args([
                "version",
                "--format",
                "{{.Server.Version}}",
            ]));
            if !ok {
                skipped.push(format!(
                    "{} (its daemon is not reachable: `docker version` fails)",
                    found.display()
                ));
                continue;
            }
        }
        return Some(Engine {
            path: found,
            build: if *name == "buildah" { "bud" } else { "build" },
        });
    }
    None
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    p.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Build the image: engine first (so a machine without one says so before a
/// release build), then the binary, then the image.
pub fn run(args: &Args) -> Result<()> {
    let mut skipped = Vec::new();
    let Some(engine) = find_engine(&mut skipped) else {
        let found = if skipped.is_empty() {
            String::new()
        } else {
            format!("; found but unusable: {}", skipped.join(", "))
        };
        bail!(
            "no usable container engine on PATH (looked for {}{found}): install one to build the image, \
             or build {CONTAINERFILE} elsewhere with the release binary as `xdhcp` in the build context",
            xdhcp_testbed::programs::CONTAINER_ENGINES.join(", ")
        );
    };
    let bin = build::run()?;
    let root = cmd::workspace_root();
    let context = root.join(CONTEXT_DIR);
    std::fs::create_dir_all(&context).with_context(|| format!("creating {}", context.display()))?;
    for (built, name) in [
        (bin.clone(), "xdhcp"),
        (build::plugin_binary()?, "xdhcp-plugin"),
    ] {
        let staged = context.join(name);
        std::fs::copy(&built, &staged)
            .with_context(|| format!("copying {} to {}", built.display(), staged.display()))?;
    }
    let mut c = std::process::Command::new(&engine.path);
    c.arg(engine.build)
        .arg("-f")
        .arg(root.join(CONTAINERFILE))
        .args(["-t", IMAGE]);
    if let Some(base) = &args.base_image {
        c.arg("--build-arg").arg(format!("BASE_IMAGE={base}"));
    }
    cmd::run(c.arg(&context))?;
    println!("built {IMAGE} with {}", engine.path.display());
    Ok(())
}
