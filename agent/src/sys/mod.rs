//! The one door to the host's system calls that no crate wraps for us.
//!
//! - [`bpf`]: link information aya does not expose;
//! - [`clock`]: the wall clock and randomness;
//! - [`fs`]: durable, atomic file writes;
//! - [`ifreq`]: interface ioctls;
//! - [`netns`]: running work inside another network namespace (`setns`);
//! - [`sync`]: the mutex helper every layer locks with;
//! - `test_delay`: the delays a test build puts into races (tests only).

pub(crate) mod bpf;
pub mod clock;
pub(crate) mod fs;
pub(crate) mod ifreq;
pub mod netns;
pub(crate) mod sync;
#[cfg(feature = "test-hooks")]
pub(crate) mod test_delay;
