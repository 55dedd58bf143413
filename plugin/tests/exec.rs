//! The thin plugin binary as the container runtime execs it.
//!
//! Having an integration test here also makes `cargo test` build the plain
//! `xdhcp-plugin` binary with the workspace's test feature set, which the
//! tests crate then runs instead of building it a second time.

use std::io::Write;
use std::process::{Command, Stdio};

fn plugin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_xdhcp-plugin"))
}

#[test]
fn version_lists_the_supported_cni_versions() {
    let mut child = plugin()
        .env("CNI_COMMAND", "VERSION")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(br#"{"cniVersion":"1.0.0"}"#)
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let supported = v["supportedVersions"].as_array().unwrap();
    for version in ["0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        assert!(supported.iter().any(|s| s == version), "{v}");
    }
}

#[test]
fn an_agent_command_without_the_agent_beside_it_says_which_binary_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("dhcp");
    std::fs::copy(env!("CARGO_BIN_EXE_xdhcp-plugin"), &copy).unwrap();
    let out = Command::new(&copy).arg("daemon").output().unwrap();
    assert_eq!(out.status.code(), Some(127), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    let agent = dir.path().join(xdhcp_plugin::invocation::AGENT_NAME);
    assert!(
        err.contains(&*agent.to_string_lossy()),
        "the error does not name {}: {err}",
        agent.display()
    );
}
