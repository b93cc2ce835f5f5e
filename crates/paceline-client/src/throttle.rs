//! Adaptive throttling: drop locally what the server would reject anyway.
//!
//! Why: when a backend is rejecting most requests, every rejected request
//! still costs it a connection, a parse and a log line. The client knows how
//! many of its recent requests were accepted, so it can refuse some of the
//! new ones itself, before they leave (Google SRE book, "Handling
//! Overload"). Over the last two minutes the client counts `requests` (every
//! request whose fate is known: answered, failed on the network, or
//! dropped here) and `accepts` (responses that were not a 429 or 503) and
//! drops a new request with probability
//! `max(0, (requests − K·accepts) / (requests + 1))`. Requests still in
//! flight are not counted yet, so a burst of first requests is never
//! dropped for lack of answers.
//!
//! **After the outage.** Local drops count as requests (as the SRE book
//! counts them), so once most requests are dropped the few that still go
//! out are the only source of accepts, and the formula alone climbs back
//! slowly: the sent share can only double per window, which kept traffic
//! away for minutes after the server had recovered. So the formula holds
//! while the window still holds a failure the server answered (a 429, a
//! 503, a network error); once every failure has left the window, the
//! server has accepted everything sent for a whole window and nothing is
//! dropped. Traffic is back at most one window (two minutes) after the
//! last failure.
//!
//! ```
//! use paceline_client::throttle::drop_probability;
//!
//! // 1,000 requests, 300 accepted, K = 2: about 40% never leave the client.
//! let p = drop_probability(1_000, 300, 2.0);
//! assert!((p - 0.3996).abs() < 1e-3);
//! assert_eq!(drop_probability(1_000, 600, 2.0), 0.0);
//! ```

use paceline_core::Nanos;
use rand::Rng;

use crate::window::SlotWindow;

/// The SRE book's client-side drop probability for `requests` attempted and
/// `accepts` accepted, with multiplier `k` (2 is the usual choice; lower
/// values start dropping sooner).
pub fn drop_probability(requests: u64, accepts: u64, k: f64) -> f64 {
    let r = requests as f64;
    let p = (r - k * accepts as f64) / (r + 1.0);
    p.clamp(0.0, 1.0)
}

/// The two-minute request/accept window behind [`drop_probability`].
#[derive(Clone, Debug)]
pub struct AdaptiveThrottle {
    window: SlotWindow,
    /// Local drops in the window (also counted in `window` as requests).
    drops: SlotWindow,
    k: f64,
    min_requests: u64,
}

impl AdaptiveThrottle {
    /// The default: a two-minute window, K = 2.
    pub fn standard() -> Self {
        AdaptiveThrottle::new(Nanos::from_secs(120), 2.0)
    }

    /// A throttle over `window` (one-second slots) with multiplier `k`
    /// (values below 1 are raised to 1: K < 1 would drop healthy traffic).
    pub fn new(window: Nanos, k: f64) -> Self {
        let k = if k.is_nan() { 2.0 } else { k.max(1.0) };
        AdaptiveThrottle {
            window: SlotWindow::new(window, Nanos::SECOND),
            drops: SlotWindow::new(window, Nanos::SECOND),
            k,
            min_requests: 0,
        }
    }

    /// Drops nothing until the window holds at least `n` requests. With a
    /// handful of requests the formula is noise (one 503 out of one request
    /// would drop half of the next ones), so a small floor keeps a quiet
    /// client from throttling itself on a single failure.
    pub fn with_min_requests(mut self, n: u64) -> Self {
        self.min_requests = n;
        self
    }

    /// The multiplier K.
    pub fn k(&self) -> f64 {
        self.k
    }

    /// Counts a request whose fate is known (answered, failed, or dropped).
    pub fn record_request(&mut self, now: Nanos) {
        self.window.add(now, 1, 0);
    }

    /// Counts a response the server accepted (anything but 429 or 503).
    pub fn record_accept(&mut self, now: Nanos) {
        self.window.add(now, 0, 1);
    }

    /// Counts a request dropped here, before it left: a request for the
    /// formula, but not a failure the server answered.
    pub fn record_drop(&mut self, now: Nanos) {
        self.window.add(now, 1, 0);
        self.drops.add(now, 1, 0);
    }

    /// Failures the server answered (requests neither accepted nor dropped
    /// here) in the window ending at `now`.
    pub fn failures(&self, now: Nanos) -> u64 {
        let (r, a) = self.counts(now);
        r.saturating_sub(a).saturating_sub(self.drops.totals(now).0)
    }

    /// `(requests, accepts)` in the window ending at `now`.
    pub fn counts(&self, now: Nanos) -> (u64, u64) {
        self.window.totals(now)
    }

    /// The drop probability at `now`.
    pub fn probability(&self, now: Nanos) -> f64 {
        let (r, a) = self.counts(now);
        if r < self.min_requests || self.failures(now) == 0 {
            return 0.0;
        }
        drop_probability(r, a, self.k)
    }

    /// Draws whether to drop a request at `now`.
    pub fn should_drop<R: Rng + ?Sized>(&self, now: Nanos, rng: &mut R) -> bool {
        let p = self.probability(now);
        p > 0.0 && rng.gen::<f64>() < p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_published_curve() {
        // large counts: p ≈ 1 − K·accept_ratio
        for (ratio, k, want) in [
            (0.3, 2.0, 0.4),
            (0.5, 2.0, 0.0),
            (0.3, 1.1, 0.67),
            (0.0, 2.0, 1.0),
        ] {
            let req = 1_000_000u64;
            let acc = (req as f64 * ratio) as u64;
            let p = drop_probability(req, acc, k);
            assert!((p - want).abs() < 1e-3, "ratio {ratio} k {k}: {p}");
        }
    }

    #[test]
    fn accepts_expire_after_two_minutes() {
        let mut t = AdaptiveThrottle::standard();
        let t0 = Nanos::from_secs(10_000);
        for _ in 0..100 {
            t.record_request(t0);
        }
        assert!(t.probability(t0) > 0.9);
        let later = t0.saturating_add(Nanos::from_secs(121));
        assert_eq!(t.probability(later), 0.0);
    }

    #[test]
    fn drops_alone_keep_nothing_dropped_once_the_failures_are_gone() {
        let mut t = AdaptiveThrottle::standard();
        let t0 = Nanos::from_secs(10_000);
        for _ in 0..100 {
            t.record_request(t0);
        }
        // the outage ends; for a minute most calls are still dropped
        let later = t0.saturating_add(Nanos::from_secs(60));
        for _ in 0..1_000 {
            t.record_drop(later);
        }
        t.record_request(later);
        t.record_accept(later);
        assert!(
            t.probability(later) > 0.9,
            "the formula while failures are live"
        );
        // the last failure leaves the window: nothing is dropped any more,
        // although the drops alone would keep the formula near 1
        let gone = t0.saturating_add(Nanos::from_secs(120));
        assert_eq!(t.failures(gone), 0);
        assert!(drop_probability(t.counts(gone).0, t.counts(gone).1, 2.0) > 0.9);
        assert_eq!(t.probability(gone), 0.0);
    }

    proptest! {
        #[test]
        fn probability_is_a_probability_and_falls_with_accepts(r in 0u64..1_000_000, a in 0u64..1_000_000, k in 1.0f64..4.0) {
            let a = a.min(r);
            let p = drop_probability(r, a, k);
            prop_assert!((0.0..1.0).contains(&p));
            prop_assert!(drop_probability(r, a.saturating_add(1).min(r), k) <= p);
        }
    }
}
