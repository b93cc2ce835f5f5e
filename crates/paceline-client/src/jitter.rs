//! How long to wait before a retry.
//!
//! `Retry-After` says *when*; jitter says *not everyone at once*. A client
//! told to come back in `RA` waits `RA + uniform(0, J)` with
//! `J = min(20 s, max(1 s, RA))`: never earlier than the server asked, and
//! spread so that ten thousand clients rejected together return over the
//! next `J` seconds instead of in one instant. Without a `Retry-After`
//! (a reset connection, a 503 without it) the client falls back to "full
//! jitter": `uniform(0, min(20 s, 0.5 s · 2^attempt))`.
//!
//! ```
//! use paceline_client::jitter::retry_wait;
//! use paceline_client::Nanos;
//! use rand::SeedableRng;
//!
//! let mut rng = rand::rngs::StdRng::seed_from_u64(7);
//! let w = retry_wait(Some(Nanos::from_secs(5)), 1, &mut rng);
//! assert!(w >= Nanos::from_secs(5) && w <= Nanos::from_secs(10));
//! ```

use paceline_core::Nanos;
use rand::Rng;

/// The longest extra wait on top of a `Retry-After`, and the cap of full
/// jitter.
pub const JITTER_CAP: Nanos = Nanos::from_secs(20);
/// The base of full-jitter backoff.
pub const FULL_JITTER_BASE: Nanos = Nanos::from_millis(500);

/// `J = min(20 s, max(1 s, retry_after))`: how far past `Retry-After` a
/// retry may land.
pub fn jitter_span(retry_after: Nanos) -> Nanos {
    retry_after.max(Nanos::SECOND).min(JITTER_CAP)
}

/// A uniform draw in `[0, max]` nanoseconds.
pub fn uniform<R: Rng + ?Sized>(max: Nanos, rng: &mut R) -> Nanos {
    if max == Nanos::ZERO {
        return Nanos::ZERO;
    }
    Nanos::new(rng.gen_range(0..=max.as_u64()))
}

/// The full-jitter cap after `attempt` attempts: `min(20 s, 0.5 s · 2^attempt)`.
pub fn full_jitter_cap(attempt: u32) -> Nanos {
    let mult = 1u64.checked_shl(attempt.min(63)).unwrap_or(u64::MAX);
    Nanos::new(FULL_JITTER_BASE.as_u64().saturating_mul(mult)).min(JITTER_CAP)
}

/// The wait before the next attempt, after `attempt` attempts have been
/// made (1 after the first): `retry_after + uniform(0, J)` when the server
/// gave one, else full jitter.
pub fn retry_wait<R: Rng + ?Sized>(retry_after: Option<Nanos>, attempt: u32, rng: &mut R) -> Nanos {
    match retry_after {
        Some(ra) => ra.saturating_add(uniform(jitter_span(ra), rng)),
        None => uniform(full_jitter_cap(attempt), rng),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;

    #[test]
    fn spans() {
        assert_eq!(jitter_span(Nanos::from_millis(200)), Nanos::SECOND);
        assert_eq!(jitter_span(Nanos::from_secs(5)), Nanos::from_secs(5));
        assert_eq!(jitter_span(Nanos::from_secs(19_200)), JITTER_CAP);
        assert_eq!(full_jitter_cap(1), Nanos::SECOND);
        assert_eq!(full_jitter_cap(3), Nanos::from_secs(4));
        assert_eq!(full_jitter_cap(200), JITTER_CAP);
    }

    #[test]
    fn a_herd_told_five_seconds_spreads_over_five_more() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let mut per_second = [0u32; 11];
        for _ in 0..10_000 {
            let w = retry_wait(Some(Nanos::from_secs(5)), 1, &mut rng);
            per_second[w.as_secs_floor() as usize] += 1;
        }
        assert_eq!(per_second[..5].iter().sum::<u32>(), 0);
        for s in 5..10 {
            assert!((1_800..2_200).contains(&per_second[s]), "{per_second:?}");
        }
    }

    proptest! {
        #[test]
        fn never_earlier_than_retry_after_nor_later_than_its_span(ra_ms in 0u64..100_000_000, seed in any::<u64>()) {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let ra = Nanos::from_millis(ra_ms);
            let w = retry_wait(Some(ra), 1, &mut rng);
            prop_assert!(w >= ra);
            prop_assert!(w <= ra.saturating_add(jitter_span(ra)));
        }

        #[test]
        fn full_jitter_stays_under_its_cap(attempt in 0u32..100, seed in any::<u64>()) {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            prop_assert!(retry_wait(None, attempt, &mut rng) <= full_jitter_cap(attempt));
        }
    }
}
