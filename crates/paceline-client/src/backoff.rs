//! Exponential backoff for providers that publish nothing useful.
//!
//! When a provider sends neither rate-limit fields nor a `Retry-After`, the
//! client cannot know when capacity returns, so it backs off: 1 s, 2 s,
//! 4 s, … each ±10%, capped at 300 s, for at most 6 attempts. The ±10%
//! keeps clients that failed together from retrying together.
//!
//! ```
//! use paceline_client::backoff::ABSENT;
//! use paceline_client::Nanos;
//! use rand::SeedableRng;
//!
//! let mut rng = rand::rngs::StdRng::seed_from_u64(3);
//! let w = ABSENT.wait(2, &mut rng); // after the second attempt: 2 s ± 10%
//! assert!(w >= Nanos::from_millis(1_800) && w <= Nanos::from_millis(2_200));
//! ```

use std::time::Duration;

use paceline_core::Nanos;
use rand::Rng;

/// Exponential backoff with proportional jitter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// The first wait.
    pub base: Duration,
    /// The longest wait.
    pub cap: Duration,
    /// Jitter, in percent of the wait, either way.
    pub jitter_percent: u32,
    /// Attempts in all, the first included.
    pub max_attempts: u32,
}

/// Header-absent mode: 1 s × 2 ± 10%, capped at 300 s, up to 6 attempts.
pub const ABSENT: Backoff = Backoff {
    base: Duration::from_secs(1),
    cap: Duration::from_secs(300),
    jitter_percent: 10,
    max_attempts: 6,
};

impl Backoff {
    /// The wait without jitter after `attempt` attempts (1 after the first):
    /// `min(cap, base · 2^(attempt − 1))`.
    pub fn nominal(&self, attempt: u32) -> Nanos {
        let shift = attempt.saturating_sub(1).min(63);
        let mult = 1u64.checked_shl(shift).unwrap_or(u64::MAX);
        let base = Nanos::from_duration(self.base);
        Nanos::new(base.as_u64().saturating_mul(mult)).min(Nanos::from_duration(self.cap))
    }

    /// The wait after `attempt` attempts, jittered, never above the cap.
    pub fn wait<R: Rng + ?Sized>(&self, attempt: u32, rng: &mut R) -> Nanos {
        let n = self.nominal(attempt).as_u64();
        let spread = n / 100 * u64::from(self.jitter_percent);
        let lo = n - spread.min(n);
        let hi = n.saturating_add(spread);
        Nanos::new(rng.gen_range(lo..=hi)).min(Nanos::from_duration(self.cap))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;

    #[test]
    fn doubles_then_caps() {
        let n: Vec<u64> = (1..=10)
            .map(|a| ABSENT.nominal(a).as_secs_floor())
            .collect();
        assert_eq!(n, vec![1, 2, 4, 8, 16, 32, 64, 128, 256, 300]);
    }

    proptest! {
        #[test]
        fn within_ten_percent_and_the_cap(attempt in 1u32..40, seed in any::<u64>()) {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let w = ABSENT.wait(attempt, &mut rng).as_u64();
            let n = ABSENT.nominal(attempt).as_u64();
            prop_assert!(w * 10 >= n * 9 && w * 10 <= n * 11);
            prop_assert!(u128::from(w) <= ABSENT.cap.as_nanos());
        }
    }
}
