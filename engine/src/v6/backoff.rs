//! Retransmission times of RFC 8415 §15 with an injected RNG.
//!
//! ```text
//! RT = IRT + RAND*IRT                  (first)
//! RT = 2*`RTprev` + RAND*`RTprev`          (then)
//! RT = MRT + RAND*MRT                  (if MRT is set and RT > MRT)
//! ```
//! RAND is uniform in [-0.1, +0.1]; for the first SOLICIT it is strictly
//! positive, so the first RT is strictly greater than IRT (§15, §18.2.1).

use std::time::Duration;

use rand::Rng;

use super::config::Timing;

/// RAND in parts per million: ±0.1.
const RAND_PPM: i64 = 100_000;

/// Which side of zero RAND may fall.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rand {
    /// [-0.1, +0.1].
    Symmetric,
    /// (0, +0.1] — the first RT of SOLICIT.
    Positive,
}

fn draw(rng: &mut impl Rng, rand: Rand) -> i64 {
    match rand {
        Rand::Symmetric => rng.random_range(-RAND_PPM..=RAND_PPM),
        Rand::Positive => rng.random_range(1..=RAND_PPM),
    }
}

/// `base + RAND*base`, RAND given in ppm.
fn plus_rand(base: Duration, rand_ppm: i64) -> Duration {
    let base_ns = base.as_nanos().min(u128::from(u64::MAX)) as i128;
    let ns = base_ns + base_ns * i128::from(rand_ppm) / 1_000_000;
    Duration::from_nanos(ns.clamp(0, i128::from(u64::MAX)) as u64)
}

/// The first RT of an exchange.
pub fn first_rt(t: &Timing, rand: Rand, rng: &mut impl Rng) -> Duration {
    cap(t, plus_rand(t.irt, draw(rng, rand)), rng)
}

/// The RT after `prev`.
pub fn next_rt(t: &Timing, prev: Duration, rng: &mut impl Rng) -> Duration {
    let r = draw(rng, Rand::Symmetric);
    cap(t, plus_rand(prev, r).saturating_add(prev), rng)
}

fn cap(t: &Timing, rt: Duration, rng: &mut impl Rng) -> Duration {
    if !t.mrt.is_zero() && rt > t.mrt {
        plus_rand(t.mrt, draw(rng, Rand::Symmetric))
    } else {
        rt
    }
}

/// A uniform delay in `[0, max]` (the `SOL_MAX_DELAY` wait, §18.2.1).
pub fn initial_delay(max: Duration, rng: &mut impl Rng) -> Duration {
    crate::backoff::uniform_delay(max, rng)
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;
    use crate::v6::config::Timeouts;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn first_solicit_rt_is_strictly_above_irt_and_within_ten_percent() {
        let t = Timeouts::default().solicit;
        for seed in 0..2000 {
            let mut rng = StdRng::seed_from_u64(seed);
            let rt = first_rt(&t, Rand::Positive, &mut rng);
            assert!(rt > ms(1000) && rt <= ms(1100), "{rt:?}");
        }
    }

    #[test]
    fn rt_doubles_within_rand_and_caps_at_mrt_plus_rand() {
        let t = Timeouts::default().renew; // IRT 10 s, MRT 600 s
        let (mut below, mut above) = (0, 0);
        for seed in 0..500 {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut rt = first_rt(&t, Rand::Symmetric, &mut rng);
            assert!(rt >= ms(9000) && rt <= ms(11_000), "{rt:?}");
            if rt < ms(10_000) {
                below += 1;
            } else if rt > ms(10_000) {
                above += 1;
            }
            for _ in 0..12 {
                let prev = rt;
                rt = next_rt(&t, prev, &mut rng);
                // Doubled ± RAND, or (past MRT) MRT ± RAND.
                let doubled = rt >= prev * 19 / 10 && rt <= prev * 21 / 10;
                let capped = rt >= ms(540_000) && rt <= ms(660_000);
                assert!(doubled || capped, "{prev:?} -> {rt:?}");
                assert!(rt <= ms(660_000));
            }
            // After 12 doublings of 10 s the cap has long been reached.
            assert!(rt >= ms(540_000) && rt <= ms(660_000), "{rt:?}");
        }
        assert!(below > 150 && above > 150, "{below} {above}");
    }

    #[test]
    fn no_mrt_means_no_cap() {
        let t = Timeouts::default().release; // MRT 0
        let mut rng = StdRng::seed_from_u64(1);
        let mut rt = first_rt(&t, Rand::Symmetric, &mut rng);
        for _ in 0..5 {
            rt = next_rt(&t, rt, &mut rng);
        }
        assert!(rt >= ms(1000 * 19u64.pow(5) / 10u64.pow(5)), "{rt:?}");
    }

    #[test]
    fn same_seed_same_schedule() {
        let t = Timeouts::default().request;
        let run = |seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut rt = first_rt(&t, Rand::Symmetric, &mut rng);
            let mut v = vec![rt];
            for _ in 0..8 {
                rt = next_rt(&t, rt, &mut rng);
                v.push(rt);
            }
            v
        };
        assert_eq!(run(3), run(3));
        assert_ne!(run(3), run(4));
    }

    #[test]
    fn initial_delay_is_within_bounds() {
        let mut rng = StdRng::seed_from_u64(9);
        assert_eq!(initial_delay(Duration::ZERO, &mut rng), Duration::ZERO);
        for _ in 0..1000 {
            assert!(initial_delay(ms(1000), &mut rng) <= ms(1000));
        }
    }
}
