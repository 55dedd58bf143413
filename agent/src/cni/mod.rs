//! The CNI IPAM plugin: environment + stdin config in, CNI result or error out.
