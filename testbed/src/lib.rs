//! The test bed: what `cargo xtask`, the integration tests (`xdhcp-tests`)
//! and the benchmarks share. No shipped crate depends on it: the agent, the
//! plugin and the eBPF object carry none of it (`xtask/tests/release_build.rs`
//! checks the dependency trees).
//!
//! - [`programs`]: every external program they run, and where it comes from.
//! - [`ovn`]: how an OVN-Kubernetes node wires a localnet network (names,
//!   `external_ids`), for the OVS + OVN lab of the tests and the demo.
//! - [`TEST_BUILD_PACKAGES`]: the package selection of the test build.

pub mod ovn;
pub mod programs;

/// The packages every `cargo` invocation of the test build selects (`cargo
/// xtask test`'s clippy, tests and fuzz replay, the VM tier's build, and the
/// agent binary the integration tests build for themselves): every workspace
/// member that builds for the host.
///
/// Not the default members: those are what a plain `cargo build --release`
/// at the workspace root builds, and they leave out `xdhcp-tests`, which
/// turns on the agent's `test-hooks` feature (fault injection, test-only
/// eBPF programs); as a default member it would put them into that build.
/// The test build wants them, and one selection everywhere means one feature
/// set, so nothing is compiled twice. `xdhcp-ebpf` builds only for the BPF
/// target (`agent/build.rs` builds it).
pub const TEST_BUILD_PACKAGES: &[&str] = &["--workspace", "--exclude", "xdhcp-ebpf"];
