//! Delays a test build puts where a race must be made to happen, each read
//! from its own environment variable in milliseconds (absent or malformed:
//! none). Only in builds with the `test-hooks` feature.

use std::time::Duration;

/// The delay named by environment variable `var`.
pub(crate) fn from_env(var: &str) -> Duration {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Duration::ZERO, Duration::from_millis)
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_absent_or_malformed_variable_is_no_delay() {
        assert!(super::from_env("XDHCP_TEST_NO_SUCH_DELAY_MS").is_zero());
    }
}
