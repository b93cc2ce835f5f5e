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
//! ```
//! use paceline_client::budget::RetryBudget;
//! use paceline_core::Nanos;
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
}

impl RetryBudget {
    /// Retries at most `percent`% of the requests over `window` (one-second
    /// slots), with a reserve of `min_retries` per window.
    pub fn new(window: Nanos, percent: u32, min_retries: u32) -> Self {
        RetryBudget {
            window: SlotWindow::new(window, Nanos::SECOND),
            percent: u64::from(percent),
            min_retries: u64::from(min_retries),
        }
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

    /// Whether one more retry fits, without spending it.
    pub fn can_retry(&self, now: Nanos) -> bool {
        let (requests, retries) = self.window.totals(now);
        let by_share =
            retries.saturating_add(1).saturating_mul(100) <= requests.saturating_mul(self.percent);
        by_share || retries < self.min_retries
    }

    /// Spends one retry if it fits; `false` when the budget is used up.
    pub fn try_retry(&mut self, now: Nanos) -> bool {
        let ok = self.can_retry(now);
        if ok {
            self.window.add(now, 0, 1);
        }
        ok
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
    }
}
