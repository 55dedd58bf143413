//! A release build from the workspace root carries production code only.
//!
//! `cargo build --release` at the root builds the default members with the
//! features they ask for among themselves. The agent's `test-hooks` feature
//! (a fault-injection route on the agent socket, `BPF_PROG_TEST_RUN`, the
//! do-nothing baseline program in the eBPF object) is the tests crate's to
//! turn on; were the tests crate a default member, feature unification
//! would put the hooks into that build. These checks read cargo's own
//! resolution (`cargo tree` over normal and build edges, as a build sees
//! them) rather than the manifests.

use std::path::Path;
use std::process::Command;

use xdhcp_testbed::TEST_BUILD_PACKAGES;

/// One package of a resolved tree: its name and enabled features.
struct Node {
    name: String,
    features: Vec<String>,
}

/// `cargo tree` at the workspace root, for the packages `select` names
/// (none: the default members), as a build resolves them.
fn tree(select: &[&str]) -> Vec<Node> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root");
    let out = Command::new(env!("CARGO"))
        .current_dir(root)
        .args(["tree", "--locked"])
        .args(["--edges", "normal,build", "--prefix", "none"])
        .args(["--format", "{p}|{f}"])
        .args(select)
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree {select:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            // `xdhcp v0.1.0 (/path)|feat1,feat2`, ` (*)` after a repeat.
            let (package, features) = line.split_once('|')?;
            let features = features.trim_end_matches(" (*)");
            Some(Node {
                name: package.split_whitespace().next()?.to_owned(),
                features: features
                    .split(',')
                    .filter(|f| !f.is_empty())
                    .map(str::to_owned)
                    .collect(),
            })
        })
        .collect()
}

fn has(tree: &[Node], package: &str) -> bool {
    tree.iter().any(|n| n.name == package)
}

fn enabled(tree: &[Node], package: &str, feature: &str) -> bool {
    tree.iter()
        .any(|n| n.name == package && n.features.iter().any(|f| f == feature))
}

#[test]
fn a_plain_build_of_the_default_members_has_no_test_hooks() {
    let plain = tree(&[]);
    assert!(has(&plain, "xdhcp"), "the agent is a default member");
    assert!(
        !enabled(&plain, "xdhcp", "test-hooks"),
        "a plain `cargo build` at the workspace root turns on the agent's test-hooks feature: \
         a default member enables it (run `cargo tree -e features -i xdhcp` to see which)"
    );
    assert!(
        !has(&plain, "xdhcp-tests"),
        "the tests crate is in a plain build"
    );
}

#[test]
fn the_test_build_has_the_test_hooks() {
    // What `cargo xtask test` builds: the fault-injection tests and the
    // benchmarks need the hooks in it.
    let test = tree(TEST_BUILD_PACKAGES);
    assert!(has(&test, "xdhcp-tests"), "the tests crate is not selected");
    assert!(
        enabled(&test, "xdhcp", "test-hooks"),
        "the test build ({TEST_BUILD_PACKAGES:?}) has no test-hooks"
    );
}

#[test]
fn no_shipped_crate_depends_on_the_test_bed() {
    let shipped = tree(&[
        "-p",
        "xdhcp",
        "-p",
        "xdhcp-plugin",
        "-p",
        "xdhcp-common",
        "-p",
        "xdhcp-ebpf",
    ]);
    assert!(
        has(&shipped, "xdhcp-plugin"),
        "the plugin is not in the tree"
    );
    for tooling in ["xdhcp-testbed", "xdhcp-tests", "xtask"] {
        assert!(
            !has(&shipped, tooling),
            "a shipped crate depends on {tooling}"
        );
    }
    assert!(
        !enabled(&shipped, "xdhcp", "test-hooks"),
        "a shipped crate turns on the agent's test-hooks"
    );
}
