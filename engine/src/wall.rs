//! The wall clock both engines keep beside the monotonic `now`: a Unix time
//! in milliseconds anchored to an `Instant`, set by the driver right before
//! a `handle_*` call and applied at that call's `now`.

use std::time::{Duration, Instant};

/// `d` in whole milliseconds, saturating at `u64::MAX`.
pub(crate) fn millis(d: Duration) -> u64 {
    d.as_millis().min(u128::from(u64::MAX)) as u64
}

#[derive(Debug, Clone, Default)]
pub(crate) struct WallClock {
    /// (Unix ms, instant) pair anchoring wall-clock time.
    anchor: Option<(u64, Instant)>,
    /// A value set by the driver, anchored at the next call's `now`.
    pending: Option<u64>,
}

impl WallClock {
    /// Anchored at once (a resumed lease knows its `now`'s wall time).
    pub(crate) fn anchored(unix_ms: u64, at: Instant) -> Self {
        Self {
            anchor: Some((unix_ms, at)),
            pending: None,
        }
    }

    /// The driver's wall clock, to be anchored by the next [`WallClock::apply`].
    pub(crate) fn set_pending(&mut self, unix_ms: u64) {
        self.pending = Some(unix_ms);
    }

    /// Anchor a pending value at `now`.
    pub(crate) fn apply(&mut self, now: Instant) {
        if let Some(ms) = self.pending.take() {
            self.anchor = Some((ms, now));
        }
    }

    pub(crate) fn anchor(&self) -> Option<(u64, Instant)> {
        self.anchor
    }

    /// The wall clock at `t` (Unix ms), 0 when it was never set.
    pub(crate) fn at(&self, t: Instant) -> u64 {
        match self.anchor {
            None => 0,
            Some((ms, at)) if t >= at => ms.saturating_add(millis(t - at)),
            Some((ms, at)) => ms.saturating_sub(millis(at - t)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_value_is_anchored_at_the_next_call_and_moves_with_time() {
        let t0 = Instant::now();
        let mut w = WallClock::default();
        assert_eq!(w.at(t0), 0);
        w.set_pending(1_000_000);
        assert_eq!(w.at(t0), 0, "not anchored before apply");
        let t1 = t0 + Duration::from_secs(5);
        w.apply(t1);
        assert_eq!(w.anchor(), Some((1_000_000, t1)));
        assert_eq!(w.at(t1 + Duration::from_millis(250)), 1_000_250);
        assert_eq!(w.at(t0), 995_000);
        w.apply(t1 + Duration::from_secs(1));
        assert_eq!(w.anchor(), Some((1_000_000, t1)), "applied once");
        assert_eq!(
            WallClock::anchored(7, t0).at(t0 + Duration::from_millis(3)),
            10
        );
        assert_eq!(millis(Duration::MAX), u64::MAX);
    }
}
