//! Randomised exponential backoff (RFC 2131 §4.1) with an injected RNG.

use std::time::Duration;

use rand::Rng;

use crate::config::Retransmit;

/// Base delay before retransmission number `attempt + 1`: `initial × 2^attempt`,
/// capped at `max_interval` (4 s, 8 s, 16 s, 32 s, 64 s, 64 s, …).
pub fn base_delay(cfg: &Retransmit, attempt: u32) -> Duration {
    let factor = 1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX);
    cfg.initial
        .checked_mul(factor)
        .unwrap_or(cfg.max_interval)
        .min(cfg.max_interval)
}

/// Add uniform jitter in `[-jitter, +jitter]` (RFC 2131 §4.1: "randomized by
/// the value of a uniform random number chosen from the range -1 to +1"),
/// never going below half of `base`.
pub fn jittered(base: Duration, jitter: Duration, rng: &mut impl Rng) -> Duration {
    if jitter.is_zero() {
        return base;
    }
    let j = jitter.as_micros().min(u128::from(u64::MAX)) as u64;
    let offset = rng.random_range(0..=2 * j);
    let lo = base / 2;
    let d = (base + Duration::from_micros(offset)).saturating_sub(jitter);
    d.max(lo)
}

/// Randomised delay before retransmission number `attempt + 1`.
pub fn retransmit_delay(cfg: &Retransmit, attempt: u32, rng: &mut impl Rng) -> Duration {
    jittered(base_delay(cfg, attempt), cfg.jitter, rng)
}

/// Delay before restarting after the `consecutive`-th NAK in a row (1-based):
/// zero for the first (RFC 2131 §3.1 step 5 restarts at once), then
/// `nak_backoff_initial × 2^(n-2)` capped at `nak_backoff_max`, scaled by a
/// uniform factor in [0.5, 1] so clients refused together do not collide again.
pub fn nak_delay(cfg: &Retransmit, consecutive: u32, rng: &mut impl Rng) -> Duration {
    if consecutive <= 1 || cfg.nak_backoff_initial.is_zero() {
        return Duration::ZERO;
    }
    let factor = 1u32
        .checked_shl((consecutive - 2).min(31))
        .unwrap_or(u32::MAX);
    let base = cfg
        .nak_backoff_initial
        .checked_mul(factor)
        .unwrap_or(cfg.nak_backoff_max)
        .min(cfg.nak_backoff_max);
    let permille = rng.random_range(500..=1000u32);
    base * permille / 1000
}

/// T1 with its random fuzz (RFC 2131 §4.4.5): `t1` moved earlier by a
/// uniform amount in `[0, t1 × permille / 1000]`, `permille` capped at 500.
pub fn fuzzed_t1(t1: Duration, permille: u32, rng: &mut impl Rng) -> Duration {
    t1.saturating_sub(uniform_delay(fuzz_window(t1, permille), rng))
}

/// A uniform delay in `[0, max]`, to the microsecond (no draw when `max` is
/// zero). Both engines' random waits use it: T1's fuzz and the spread of
/// renewals after a restart here, `SOL_MAX_DELAY` in
/// [`crate::v6::backoff::initial_delay`].
pub fn uniform_delay(max: Duration, rng: &mut impl Rng) -> Duration {
    let us = max.as_micros().min(u128::from(u64::MAX)) as u64;
    if us == 0 {
        return Duration::ZERO;
    }
    Duration::from_micros(rng.random_range(0..=us))
}

/// How far [`fuzzed_t1`] may move `t1`: `t1 × permille / 1000`, `permille`
/// capped at 500.
pub fn fuzz_window(t1: Duration, permille: u32) -> Duration {
    let us = (t1.as_micros() * u128::from(permille.min(500)) / 1000).min(u128::from(u64::MAX));
    Duration::from_micros(us as u64)
}

/// RFC 2131 §4.4.5: in RENEWING wait half the time left until T2 (in
/// REBINDING until expiry), but at least `min`; never past `until`.
pub fn renew_delay(remaining: Duration, min: Duration) -> Duration {
    (remaining / 2).max(min).min(remaining)
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn t1_fuzz_only_moves_earlier_within_the_spread_and_spreads() {
        let mut rng = StdRng::seed_from_u64(7);
        let t1 = secs(1800);
        let got: Vec<Duration> = (0..1000).map(|_| fuzzed_t1(t1, 50, &mut rng)).collect();
        assert!(got.iter().all(|d| *d <= t1 && *d >= secs(1710)));
        // 1000 draws over 90 s: both halves of the spread are used.
        assert!(got.iter().any(|d| *d < secs(1755)));
        assert!(got.iter().any(|d| *d > secs(1755)));
        assert_eq!(fuzzed_t1(t1, 0, &mut rng), t1);
        // Capped at half of T1.
        assert!(fuzzed_t1(t1, 10_000, &mut rng) >= secs(900));
    }

    #[test]
    fn base_schedule_doubles_and_caps() {
        let cfg = Retransmit::default();
        let got: Vec<_> = (0..8).map(|a| base_delay(&cfg, a)).collect();
        assert_eq!(got, [4, 8, 16, 32, 64, 64, 64, 64].map(secs).to_vec(),);
        assert_eq!(base_delay(&cfg, u32::MAX), secs(64));
    }

    #[test]
    fn jitter_is_bounded_and_uniform_enough() {
        // Statistical check over many seeds: every delay within ±1 s of the
        // base, mean close to the base, both halves of the range used.
        let cfg = Retransmit::default();
        for attempt in 0..6 {
            let base = base_delay(&cfg, attempt);
            let mut sum = 0f64;
            let (mut below, mut above) = (0, 0);
            let n: u32 = 2000;
            for seed in 0..u64::from(n) {
                let mut rng = StdRng::seed_from_u64(seed);
                let d = retransmit_delay(&cfg, attempt, &mut rng);
                assert!(
                    d >= base.saturating_sub(secs(1)) && d <= base + secs(1),
                    "{d:?} vs {base:?}"
                );
                sum += d.as_secs_f64();
                if d < base {
                    below += 1;
                } else if d > base {
                    above += 1;
                }
            }
            let mean = sum / f64::from(n);
            assert!(
                (mean - base.as_secs_f64()).abs() < 0.05,
                "mean {mean} base {base:?}"
            );
            assert!(below > n / 3 && above > n / 3, "{below} {above}");
        }
    }

    #[test]
    fn jitter_never_below_half_base() {
        let mut rng = StdRng::seed_from_u64(7);
        for _ in 0..1000 {
            let d = jittered(Duration::from_millis(100), secs(1), &mut rng);
            assert!(d >= Duration::from_millis(50));
        }
    }

    #[test]
    fn same_seed_same_schedule() {
        let cfg = Retransmit::default();
        let run = |seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            (0..6)
                .map(|a| retransmit_delay(&cfg, a, &mut rng))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(42), run(42));
        assert_ne!(run(42), run(43));
    }

    #[test]
    fn nak_backoff_is_bounded() {
        let cfg = Retransmit::default();
        let mut rng = StdRng::seed_from_u64(1);
        assert_eq!(nak_delay(&cfg, 1, &mut rng), Duration::ZERO);
        for n in 2..100 {
            let d = nak_delay(&cfg, n, &mut rng);
            let base = (cfg.nak_backoff_initial * 2u32.saturating_pow((n - 2).min(20)))
                .min(cfg.nak_backoff_max);
            assert!(d >= base / 2 && d <= base, "n={n} {d:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn any_config_stays_within_bounds(
            initial_ms in 10u64..10_000,
            cap_factor in 1u32..64,
            jitter_ms in 0u64..5_000,
            attempt in 0u32..200,
            seed in proptest::prelude::any::<u64>(),
        ) {
            let initial = Duration::from_millis(initial_ms);
            let jitter = Duration::from_millis(jitter_ms);
            let cfg = Retransmit {
                initial,
                max_interval: initial * cap_factor,
                jitter,
                ..Retransmit::default()
            };
            let base = base_delay(&cfg, attempt);
            proptest::prop_assert!(base >= initial && base <= cfg.max_interval);
            let mut rng = StdRng::seed_from_u64(seed);
            let d = retransmit_delay(&cfg, attempt, &mut rng);
            proptest::prop_assert!(d <= base + jitter, "{:?} > {:?} + {:?}", d, base, jitter);
            proptest::prop_assert!(d + jitter >= base, "{:?} too far below {:?}", d, base);
            proptest::prop_assert!(d >= base / 2);
        }
    }

    #[test]
    fn renew_schedule() {
        assert_eq!(renew_delay(secs(1000), secs(60)), secs(500));
        assert_eq!(renew_delay(secs(100), secs(60)), secs(60));
        assert_eq!(renew_delay(secs(30), secs(60)), secs(30));
    }
}
