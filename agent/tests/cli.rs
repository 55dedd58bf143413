//! The agent binary as an operator runs it: the commands it lists and the
//! error it gives when it cannot reach an agent.
//!
//! Having an integration test here also makes `cargo test` build the plain
//! `xdhcp` binary with the workspace's test feature set, which the tests
//! crate then runs (`tests/tests/agent_support`) instead of building it a
//! second time with other features.

use std::process::Command;

fn xdhcp() -> Command {
    Command::new(env!("CARGO_BIN_EXE_xdhcp"))
}

#[test]
fn help_lists_every_command() {
    let out = xdhcp().arg("--help").output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    for command in ["agent", "leases", "status", "bindings"] {
        assert!(
            text.lines().any(|l| l.trim_start().starts_with(command)),
            "`{command}` missing from --help:\n{text}"
        );
    }
}

#[test]
fn a_client_command_without_an_agent_names_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("absent.sock");
    let out = xdhcp()
        .args(["leases", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&*socket.to_string_lossy()),
        "the error does not name the socket: {err}"
    );
}
