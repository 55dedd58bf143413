//! The DHCP IPAM mode of the `ClusterUserDefinedNetwork` API and NAD rendering.
//!
//! - [`cudn`]: the `k8s.ovn.org/v1` `ClusterUserDefinedNetwork` types with the OKEP's CEL rules.
//! - [`crd`]: the CRD manifest generated from those types (`manifests/crd/`).
//! - [`guard`]: xdhcp's own `DhcpGuardPolicy` (`xdhcp.io/v1alpha1`): the DHCP guard of one network.
//! - [`nad`]: rendering a `NetworkAttachmentDefinition` from a CUDN, and validating NAD configs.

pub mod crd;
pub mod cudn;
pub mod guard;
pub mod nad;

pub use cudn::{ClusterUserDefinedNetwork, ClusterUserDefinedNetworkSpec};
