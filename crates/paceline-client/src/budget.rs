//! The retry budget: retries may be at most a share of recent requests.
//!
//! Why a budget and not only "at most 3 attempts"? Three attempts per call
//! still triples the load when everything fails at once, which is exactly
//! when the server can least afford it. A budget bounds the extra load of
//! the whole client: over the last minute, retries may be at most 10% of the
//! first attempts the client sent (about 1.1× load at worst).
//!
//! The arithmetic is exact: a retry is allowed when
//! `100 · (retries + 1) ≤ percent · requests`, or while the client has used
//! fewer than `min_retries` retries in the window (a small reserve, so a
//! client that sends a handful of requests can still retry one of them).
//!
//! **The floor for small clients.** A share starves a client that sends
//! little: 10% of a 40-request job is four retries, and one burst of 429s
//! from a server that said when to come back uses them all. So beside the
//! share the budget keeps a bucket of retry tokens ([`RetryBudget::with_floor`]:
//! by default 10 deep, refilling 1 per second, the way Finagle keeps a
//! minimum of retries per second and the AWS SDKs a bucket of retry
//! tokens). The floor only serves a client whose share allows fewer
//! retries than the bucket holds; once the share is the larger of the two
//! (at 100 first attempts a minute and up, by default) only the share
//! counts, so a busy client's retries stay within its 10% during an
//! incident, whatever the floor.
//!
//! ```
//! use paceline_client::budget::RetryBudget;
//! use paceline_client::Nanos;
//!
//! let mut b = RetryBudget::new(Nanos::from_secs(60), 10, 0);
//! let now = Nanos::from_secs(1_000);
//! for _ in 0..20 {
//!     b.record_request(now);
//! }
//! assert!(b.try_retry(now));
//! assert!(b.try_retry(now));
//! assert!(!b.try_retry(now)); // 3 retries would be 15% of 20
//! assert_eq!(b.stats(now).retries, 2);
//! ```

use paceline_core::Nanos;
use serde::Serialize;

use crate::window::SlotWindow;

/// The budget's counts as they stand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct BudgetStats {
    /// First attempts sent in the window.
    pub requests: u64,
    /// Retries spent in the window.
    pub retries: u64,
    /// Retries the window allows in total right now.
    pub allowance: u64,
}

/// Retries allowed as a share of the first attempts over a sliding window.
#[derive(Clone, Debug)]
pub struct RetryBudget {
    window: SlotWindow,
    percent: u64,
    min_retries: u64,
    floor: Option<Floor>,
}

/// The floor's token bucket, as a theoretical arrival time (GCRA).
#[derive(Clone, Copy, Debug)]
struct Floor {
    /// Time one token takes to come back.
    emission: u64,
    /// Tokens the bucket holds when full.
    burst: u64,
    tat: u64,
}

impl Floor {
    fn available(&self, now: u64) -> bool {
        let tat = self.tat.max(now);
        tat + self.emission - now <= self.burst.saturating_mul(self.emission)
    }

    fn take(&mut self, now: u64) {
        self.tat = self.tat.max(now) + self.emission;
    }
}

impl RetryBudget {
    /// Retries at most `percent`% of the requests over `window` (one-second
    /// slots), with a reserve of `min_retries` per window.
    pub fn new(window: Nanos, percent: u32, min_retries: u32) -> Self {
        RetryBudget {
            window: SlotWindow::new(window, Nanos::SECOND),
            percent: u64::from(percent),
            min_retries: u64::from(min_retries),
            floor: None,
        }
    }

    /// Adds the floor for small clients: a bucket of `burst` retry tokens
    /// refilling `per_s` a second, drawn on when the share says no and the
    /// share allows fewer than `burst` retries (zero for either: no floor).
    pub fn with_floor(mut self, per_s: u32, burst: u32) -> Self {
        self.floor = (per_s > 0 && burst > 0).then(|| Floor {
            emission: 1_000_000_000 / u64::from(per_s),
            burst: u64::from(burst),
            tat: 0,
        });
        self
    }

    /// Whether the floor may grant a retry at `now` (the share allows
    /// fewer than the floor's burst, and a token is there).
    fn floor_grants(&self, now: Nanos, requests: u64) -> bool {
        self.floor.is_some_and(|f| {
            requests.saturating_mul(self.percent) / 100 < f.burst && f.available(now.as_u64())
        })
    }

    /// Records a first attempt (not a retry).
    pub fn record_request(&mut self, now: Nanos) {
        self.window.add(now, 1, 0);
    }

    /// Retries the window allows in total at `now`.
    pub fn allowance(&self, now: Nanos) -> u64 {
        let (requests, _) = self.window.totals(now);
        (requests.saturating_mul(self.percent) / 100).max(self.min_retries)
    }

    /// Whether the share (or the reserve) allows one more retry.
    fn by_share(&self, now: Nanos) -> bool {
        let (requests, retries) = self.window.totals(now);
        let by_share =
            retries.saturating_add(1).saturating_mul(100) <= requests.saturating_mul(self.percent);
        by_share || retries < self.min_retries
    }

    /// Whether one more retry fits, without spending it.
    pub fn can_retry(&self, now: Nanos) -> bool {
        self.by_share(now) || self.floor_grants(now, self.window.totals(now).0)
    }

    /// Spends one retry if it fits; `false` when the budget is used up.
    pub fn try_retry(&mut self, now: Nanos) -> bool {
        if self.by_share(now) {
            self.window.add(now, 0, 1);
            return true;
        }
        if self.floor_grants(now, self.window.totals(now).0) {
            if let Some(f) = self.floor.as_mut() {
                f.take(now.as_u64());
            }
            self.window.add(now, 0, 1);
            return true;
        }
        false
    }

    /// The counts at `now`.
    pub fn stats(&self, now: Nanos) -> BudgetStats {
        let (requests, retries) = self.window.totals(now);
        BudgetStats {
            requests,
            retries,
            allowance: self.allowance(now),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reserve_lets_a_quiet_client_retry() {
        let mut b = RetryBudget::new(Nanos::from_secs(60), 10, 2);
        let now = Nanos::from_secs(5);
        b.record_request(now);
        assert!(b.try_retry(now));
        assert!(b.try_retry(now));
        assert!(!b.try_retry(now));
    }

    #[test]
    fn the_floor_lets_a_small_client_retry_a_burst_then_one_a_second() {
        let mut b = RetryBudget::new(Nanos::from_secs(60), 10, 0).with_floor(1, 10);
        let t0 = Nanos::from_secs(1_000);
        for _ in 0..40 {
            b.record_request(t0);
        }
        // the share alone: 4 retries; the floor: 10 at once
        for i in 0..14 {
            assert!(b.try_retry(t0), "retry {i}");
        }
        assert!(!b.try_retry(t0));
        assert!(!b.try_retry(t0.saturating_add(Nanos::from_millis(900))));
        assert!(b.try_retry(t0.saturating_add(Nanos::from_secs(1))));
        assert!(!b.try_retry(t0.saturating_add(Nanos::from_secs(1))));
    }

    #[test]
    fn a_busy_client_gets_no_floor() {
        let mut b = RetryBudget::new(Nanos::from_secs(60), 10, 0).with_floor(1, 10);
        let t0 = Nanos::from_secs(1_000);
        for _ in 0..1_000 {
            b.record_request(t0);
        }
        let granted = (0..200).filter(|_| b.try_retry(t0)).count();
        assert_eq!(granted, 100);
    }

    #[test]
    fn budget_refills_as_the_window_slides() {
        let mut b = RetryBudget::new(Nanos::from_secs(60), 10, 0);
        let t0 = Nanos::from_secs(100);
        for _ in 0..10 {
            b.record_request(t0);
        }
        assert!(b.try_retry(t0));
        assert!(!b.try_retry(t0));
        let t1 = t0.saturating_add(Nanos::from_secs(61));
        for _ in 0..10 {
            b.record_request(t1);
        }
        assert!(b.try_retry(t1));
    }

    proptest! {
        /// Whatever the order of requests and retries, each granted retry
        /// leaves the window at or under max(reserve, 10% of requests).
        #[test]
        fn retries_never_exceed_the_share(ops in proptest::collection::vec((0u64..3_000, any::<bool>()), 1..400),
                                          reserve in 0u32..4) {
            let mut b = RetryBudget::new(Nanos::from_secs(60), 10, reserve);
            let mut t = Nanos::from_secs(1_000);
            for (dt_ms, is_retry) in ops {
                t = t.saturating_add(Nanos::from_millis(dt_ms));
                if !is_retry { b.record_request(t); continue; }
                if !b.try_retry(t) { continue; }
                let s = b.stats(t);
                prop_assert!(s.retries * 100 <= s.requests * 10 || s.retries <= u64::from(reserve),
                    "retries {} requests {}", s.retries, s.requests);
            }
        }

        /// With the floor, a client whose share allows at least the
        /// floor's burst never goes past its share; below that, the floor
        /// grants at most its burst plus its rate over the time elapsed.
        #[test]
        fn the_floor_never_lifts_a_busy_client_past_its_share(
            ops in proptest::collection::vec((0u64..3_000, 0u8..4), 1..400)) {
            let mut b = RetryBudget::new(Nanos::from_secs(60), 10, 0).with_floor(1, 10);
            let mut share_only = RetryBudget::new(Nanos::from_secs(60), 10, 0);
            let start = Nanos::from_secs(1_000);
            let mut t = start;
            let mut extra = 0u64;
            for (dt_ms, op) in ops {
                t = t.saturating_add(Nanos::from_millis(dt_ms));
                if op != 0 {
                    b.record_request(t);
                    share_only.record_request(t);
                    continue;
                }
                let before = b.stats(t);
                let by_share = share_only.can_retry(t);
                if !b.try_retry(t) { continue; }
                if by_share {
                    share_only.try_retry(t);
                } else {
                    extra += 1;
                    prop_assert!(before.requests * 10 / 100 < 10,
                        "the floor served a client of {} requests", before.requests);
                }
                let secs = t.saturating_sub(start).as_secs_floor();
                prop_assert!(extra <= 10 + secs, "{extra} floor retries in {secs} s");
            }
        }
    }
}
