//! The CNI IPAM plugin: environment + stdin config in, CNI result or error out.
//!
//! The plugin is a thin client of the agent socket ([`crate::rpc`]): it
//! validates its input (so bad input is refused before anything is sent),
//! forwards the invocation, and prints what the agent answers. It holds no
//! state. The parsing, validation, output and the plugin's client live in
//! the `xdhcp-plugin` crate, shared with the thin plugin binary, so both
//! binaries behave identically; this binary behaves as the plugin whenever
//! `CNI_COMMAND` is set.

pub use xdhcp_plugin::run::{main, run};
pub use xdhcp_plugin::{config, env, types};
