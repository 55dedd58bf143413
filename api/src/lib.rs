//! The DHCP IPAM mode of the ClusterUserDefinedNetwork API and NAD rendering.
