//! xdhcp: DHCPv4 IPAM for OVN-Kubernetes localnet networks, with the DHCP
//! packet path in the kernel.
//!
//! Module map:
//! - [`cli`]: command-line flags of `xdhcp agent`, `xdhcp leases`, `xdhcp status`.
//! - [`cni`]: the CNI IPAM plugin (the same binary when `CNI_COMMAND` is set).
//! - [`daemon`]: the agent daemon: socket API, lease tasks, recovery, shutdown.
//! - [`rpc`]: the agent-socket protocol shared by the daemon and the CNI shim.
//! - [`datapath`]: the eBPF loader and ring-buffer reader, the AF_PACKET
//!   fallback receiver and the raw-socket sender.
//! - [`sys`]: the system calls no crate wraps (namespaces, interface
//!   ioctls, durable file writes, BPF link information).
//! - [`netlink`]: link lookup and address/route configuration (rtnetlink).
//! - [`store`]: crash-safe lease persistence under the state dir.
//! - [`kube`]: the `k8s.ovn.org/pod-networks` annotation, the Kubernetes
//!   client and the embedded (no cluster) store.
//! - [`workload`]: pod vs. VM detection and VM MAC resolution.
//! - [`vfio`]: the journaled VFIO driver handoff.
//! - `metrics`, [`telemetry`]: Prometheus metrics, health, logging.
//! - `fuzzing` (feature `fuzzing`): entry points of the `fuzz/` targets.

#![warn(unreachable_pub)]

pub mod bindings;
pub mod cli;
pub mod cni;
pub mod daemon;
pub mod datapath;
/// Fuzzing entry points (feature `fuzzing`; always built for unit tests,
/// which replay the committed corpora through them).
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
mod guard;
pub mod kube;
mod lease;
mod metrics;
pub mod model;
pub mod netlink;
mod ops;
pub mod rpc;
pub mod settings;
pub mod store;
pub mod sys;
pub mod telemetry;
pub mod vfio;
pub mod workload;
