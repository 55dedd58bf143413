//! The wall clock and the agent's source of randomness: the two inputs
//! every layer reads and none should own.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the epoch now.
pub fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A random 64-bit seed from the OS, or (should the OS refuse) one from the
/// clock and the process id: jitter and xids need spread, not secrecy.
pub(crate) fn seed() -> u64 {
    use rand::TryRngCore as _;
    rand::rngs::OsRng.try_next_u64().unwrap_or_else(|_| {
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        t.as_nanos() as u64 ^ u64::from(std::process::id()).rotate_left(32)
    })
}
