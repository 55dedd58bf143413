//! Command-line flags of `xdhcp agent`, `xdhcp leases` and `xdhcp status`.
