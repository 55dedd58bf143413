//! The one door to the host's system calls that no crate wraps for us.
//!
//! - [`bpf`]: link information aya does not expose;
//! - [`fs`]: durable, atomic file writes;
//! - [`ifreq`]: interface ioctls;
//! - [`netns`]: running work inside another network namespace (`setns`).

pub(crate) mod bpf;
pub(crate) mod fs;
pub(crate) mod ifreq;
pub mod netns;
