//! The DHCP IPAM mode of the `ClusterUserDefinedNetwork` API and NAD rendering.
//!
//! - [`cudn`]: the `k8s.ovn.org/v1` `ClusterUserDefinedNetwork` types with the OKEP's CEL rules.
//! - [`crd`]: the CRD manifest generated from those types (`manifests/crd/`).
//! - [`nad`]: rendering a `NetworkAttachmentDefinition` from a CUDN, and validating NAD configs.

pub mod crd;
pub mod cudn;
pub mod nad;

pub use cudn::{ClusterUserDefinedNetwork, ClusterUserDefinedNetworkSpec};
