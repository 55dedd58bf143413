//! The one door to the host's system calls that no crate wraps for us.
//!
//! - [`bpf`]: link information aya does not expose.

pub(crate) mod bpf;
