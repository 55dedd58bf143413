//! xdhcp's CNI IPAM plugin, without the agent: the CNI environment and
//! network configuration, validated field by field; the CNI result and
//! error objects; the plugin's side of the agent-socket protocol and a
//! blocking client for it; one invocation from environment to output.
//!
//! The agent crate (`xdhcp`) builds on these same modules, so the agent
//! binary and the thin plugin binary (`xdhcp-plugin`, installed as `dhcp`
//! and `xdhcp`) parse, validate and print identically. This crate links no
//! async runtime, no Kubernetes client and no eBPF loader: the plugin is
//! exec'd once per CNI call, and its start-up is the floor of every burst.
//!
//! - [`config`], [`env`], [`types`]: CNI wire formats and validation;
//!   [`call`]: one call read from both, in one step.
//! - [`error_chain`]: errors and their sources as one line.
//! - [`proto`]: the CNI calls on the agent socket (paths and bodies).
//! - [`views`]: what the socket's read-only calls answer (leases, status).
//! - [`client`]: blocking HTTP/1.1 over the unix socket, the one client of
//!   the socket (the plugin, the operator commands and the tests use it).
//! - [`run`]: one plugin invocation.
//! - [`invocation`]: what an execution is, and the hand-over to the agent.

#![warn(unreachable_pub)]

pub mod call;
pub mod client;
pub mod config;
pub mod env;
pub mod error_chain;
pub mod invocation;
pub mod proto;
pub mod run;
pub mod types;
pub mod views;
