//! The `k8s.ovn.org/pod-networks` annotation: a pure merge that preserves every foreign entry.
