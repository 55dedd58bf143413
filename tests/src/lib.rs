//! Test harness for xdhcp integration tests: network namespaces, veths,
//! bridges and DHCP servers as guard values that always clean up.
