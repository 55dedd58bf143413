//! xdhcp: DHCPv4 IPAM for OVN-Kubernetes localnet networks, with the DHCP
//! packet path in the kernel.
//!
//! Module map:
//! - [`datapath`]: the eBPF loader and ring-buffer reader, the AF_PACKET
//!   fallback receiver and the raw-socket sender.
//! - [`netns`]: running work inside another network namespace.
//! - [`netlink`]: link lookup and address/route configuration (rtnetlink).
//! - [`store`]: crash-safe lease persistence under the state dir.
//! - [`kube`]: the `k8s.ovn.org/pod-networks` annotation, the Kubernetes
//!   client and the embedded (no cluster) store.
//! - [`workload`]: pod vs. VM detection and VM MAC resolution.
//! - [`vfio`]: the journaled VFIO driver handoff.

pub mod datapath;
pub mod kube;
pub mod netlink;
pub mod netns;
pub mod store;
pub mod vfio;
pub mod workload;
