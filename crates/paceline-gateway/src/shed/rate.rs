//! A requests-per-second capacity at the edge, shared fairly between
//! callers (`[gateway.shedding] max_rps`).
//!
//! Why a rate capacity beside the in-flight one: an upstream sized for 40
//! requests a second is hurt by the 41st whether or not the earlier ones
//! are still running. Past the capacity the gateway answers `503
//! overloaded` itself, before the rate limiter, so the dropped request is
//! charged to no quota.
//!
//! Why fair: dropping whatever arrives once the capacity is spent makes a
//! polite caller pay for a noisy one. Within each one-second window (by
//! the gateway's clock) a caller may pass at most its fair share, the
//! capacity divided by the callers active in this window or the one
//! before (rounded up); the heaviest caller's excess is what is dropped. A caller under
//! its share is only dropped when the window's capacity is already spent
//! before it first appears (for the rest of that window; from the next
//! one on it has its share).
//!
//! Callers are told apart by their API key (`Authorization: Bearer`,
//! fingerprinted, never kept); requests without one count as one caller.
//! At most [`MAX_CALLERS`] callers are tracked per window; callers beyond
//! that share one entry.
//!
//! ```
//! use paceline_core::Nanos;
//! use paceline_gateway::shed::RateShed;
//!
//! let edge = RateShed::default();
//! let t = Nanos::from_secs(1);
//! // a noisy caller alone may use the whole capacity of 4...
//! assert!((0..4).all(|_| edge.admit(4, 1, t)));
//! assert!(!edge.admit(4, 1, t));
//! // ...and in the next second, with a second caller about, half of it
//! let t = Nanos::from_secs(2);
//! assert!(edge.admit(4, 2, t));
//! assert!((0..3).filter(|_| edge.admit(4, 1, t)).count() == 2);
//! assert!(edge.admit(4, 2, t));
//! ```

use std::collections::HashMap;

use http::Request;
use paceline_core::Nanos;
use paceline_server::{bearer_token, KeyHash};
use parking_lot::Mutex;

use super::Shedder;
use crate::config::SheddingSettings;

/// The most callers one window tracks apart; more share one entry.
pub const MAX_CALLERS: usize = 100_000;

const WINDOW_NS: u64 = 1_000_000_000;

/// The caller every request without an API key counts as, and the one
/// callers beyond [`MAX_CALLERS`] share.
const SHARED_CALLER: u64 = 0;

/// Per-second capacity with a fair share per caller; cheap to share.
#[derive(Debug, Default)]
pub struct RateShed {
    window: Mutex<Window>,
}

#[derive(Debug, Default)]
struct Window {
    /// The window's index + 1 (0: none yet).
    idx: u64,
    /// Requests passed in this window.
    total: u64,
    /// Callers that passed or asked in this window.
    active_cur: u64,
    /// Callers active in this window or the one before.
    active_union: u64,
    /// Per caller: the window index + 1 it was last seen in, its count there.
    callers: HashMap<u64, (u64, u64)>,
}

impl RateShed {
    /// Whether a request from `caller` at `now` fits a capacity of
    /// `capacity` requests a second (counted when it does). A capacity of
    /// 0 passes everything.
    pub fn admit(&self, capacity: u64, caller: u64, now: Nanos) -> bool {
        if capacity == 0 {
            return true;
        }
        let mut w = self.window.lock();
        let idx = now.as_u64() / WINDOW_NS + 1;
        w.roll(idx);
        let caller = match w.callers.len() >= MAX_CALLERS && !w.callers.contains_key(&caller) {
            true => SHARED_CALLER,
            false => caller,
        };
        let (last, _) = w.callers.get(&caller).copied().unwrap_or((0, 0));
        if last != idx {
            w.active_cur += 1;
            if last == 0 || last + 1 != idx {
                w.active_union += 1;
            }
            w.callers.insert(caller, (idx, 0));
        }
        let share = capacity.div_ceil(w.active_union.max(1));
        let count = w.callers.get(&caller).map_or(0, |c| c.1);
        if w.total >= capacity || count >= share {
            return false;
        }
        w.total += 1;
        if let Some(c) = w.callers.get_mut(&caller) {
            c.1 += 1;
        }
        true
    }

    /// Callers tracked now (this window and the one before).
    pub fn callers(&self) -> usize {
        self.window.lock().callers.len()
    }
}

impl Window {
    /// Moves to window `idx`, keeping the callers of the window before.
    fn roll(&mut self, idx: u64) {
        if idx == self.idx {
            return;
        }
        if idx == self.idx + 1 {
            let before = self.idx;
            self.callers.retain(|_, (last, _)| *last == before);
            self.active_union = self.active_cur;
        } else {
            // a gap (or a clock set back): nobody is recent
            self.callers.clear();
            self.active_union = 0;
        }
        self.active_cur = 0;
        self.total = 0;
        self.idx = idx;
    }
}

/// The caller a request counts as: its API key's fingerprint, or the
/// shared caller without one.
pub fn caller_of<B>(req: &Request<B>) -> u64 {
    bearer_token(req.headers()).map_or(SHARED_CALLER, |k| KeyHash::of(k).0.max(1))
}

impl Shedder {
    /// Whether `req` fits the requests-per-second capacity of `s` now
    /// (always, with `max_rps` 0), counted when it does.
    pub(crate) fn admit_rate<B>(&self, s: &SheddingSettings, req: &Request<B>) -> bool {
        s.max_rps == 0
            || self
                .inner
                .rate
                .admit(u64::from(s.max_rps), caller_of(req), self.now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const POLITE: u64 = 7;
    const NOISY: u64 = 9;

    #[test]
    fn a_polite_caller_under_its_share_is_never_dropped_while_a_noisy_one_floods() {
        let edge = RateShed::default();
        let (mut polite, mut noisy, mut noisy_sent) = (0, 0, 0);
        // 10 s: the polite caller sends 4 a second, the noisy one every ms
        for ms in 0..10_000u64 {
            let now = Nanos::from_millis(ms);
            if ms % 250 == 0 {
                assert!(edge.admit(40, POLITE, now), "polite dropped at {ms} ms");
                polite += 1;
            }
            noisy_sent += 1;
            noisy += u64::from(edge.admit(40, NOISY, now));
        }
        assert_eq!(polite, 40);
        // held to its share: 40 in the first second (both active, 20 each
        // after the polite one's first request), 20 a second after
        assert!(noisy <= 20 * 10, "{noisy}");
        assert!(noisy >= 20 * 9, "{noisy}");
        assert!(noisy_sent > 9_000);
    }

    #[test]
    fn the_capacity_holds_per_second_and_comes_back_each_second() {
        let edge = RateShed::default();
        for s in 0..5u64 {
            let passed = (0..1000u64)
                .filter(|i| edge.admit(40, 1 + i % 3, Nanos::from_millis(s * 1000 + i % 1000)))
                .count();
            assert_eq!(passed, 40, "second {s}");
        }
    }

    #[test]
    fn no_capacity_passes_everything_and_tracks_nobody() {
        let edge = RateShed::default();
        assert!((0..10_000).all(|i| edge.admit(0, i, Nanos::from_secs(1))));
        assert_eq!(edge.callers(), 0);
    }

    #[test]
    fn callers_are_bounded_and_the_excess_shares_one_entry() {
        let edge = RateShed::default();
        let now = Nanos::from_secs(5);
        for c in 1..=(MAX_CALLERS as u64 + 500) {
            edge.admit(u64::MAX, c, now);
        }
        assert_eq!(edge.callers(), MAX_CALLERS + 1);
        // two windows on, everybody is forgotten
        edge.admit(10, 1, Nanos::from_secs(7));
        assert_eq!(edge.callers(), 1);
    }

    #[test]
    fn requests_without_a_key_are_one_caller_and_keys_are_told_apart() {
        let req = |auth: Option<&str>| {
            let b = Request::get("/");
            match auth {
                Some(a) => b.header("authorization", a),
                None => b,
            }
            .body(())
            .unwrap()
        };
        assert_eq!(caller_of(&req(None)), SHARED_CALLER);
        assert_eq!(caller_of(&req(Some("Basic eDp5"))), SHARED_CALLER);
        let a = caller_of(&req(Some("Bearer sk_a")));
        assert_ne!(a, SHARED_CALLER);
        assert_ne!(a, caller_of(&req(Some("Bearer sk_b"))));
        assert_eq!(a, caller_of(&req(Some("bearer  sk_a"))));
    }

    /// The shed layer (capacity 2 a second) over the limit layer (20 an
    /// hour) over a handler: the `RateLimit` remaining of each answer.
    #[tokio::test]
    async fn dropped_requests_are_answered_503_and_not_charged() {
        use std::convert::Infallible;
        use std::sync::Arc;

        use bytes::Bytes;
        use http::Response;
        use http_body_util::Empty;
        use paceline_core::{ManualClock, MemoryStore, Plan, Policy};
        use paceline_server::{Limits, RateLimiter};
        use tower::{Service, ServiceExt};

        let clock = ManualClock::at_unix_secs(1_790_000_000);
        let plan = Plan::new(
            "free",
            vec![Policy::token_bucket("burst", 20, 3600).unwrap()],
        );
        let limits = Limits::builder()
            .plan(plan.unwrap())
            .key("sk_1", "free")
            .build()
            .unwrap();
        let limiter = RateLimiter::new(limits, MemoryStore::new(), clock.clone());
        let settings = SheddingSettings {
            max_rps: 2,
            ..Default::default()
        };
        let shedder = Shedder::with_clock(settings, Arc::new(clock.clone()));
        let l = limiter.clone();
        let handler = tower::service_fn(|_req: Request<()>| async {
            Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
        });
        let mut svc = tower::ServiceBuilder::new()
            .layer(super::super::LoadShedLayer::new(
                shedder,
                Arc::new(move || l.limits()),
            ))
            .layer(limiter.layer())
            .service(handler);
        let mut send = async || {
            let req = Request::get("/v1/rates")
                .header("authorization", "Bearer sk_1")
                .body(())
                .unwrap();
            let res = svc.ready().await.unwrap().call(req).await.unwrap();
            let field = res.headers()["ratelimit"].to_str().unwrap().to_string();
            let r = field.split(';').find_map(|p| p.strip_prefix("r=")).unwrap();
            let retry = res.headers().get("retry-after").cloned();
            (res.status().as_u16(), r.parse::<u64>().unwrap(), retry)
        };
        assert_eq!(send().await, (200, 19, None));
        assert_eq!(send().await, (200, 18, None));
        for _ in 0..3 {
            let (status, r, retry) = send().await;
            // told its counters as they stand: nothing was charged
            assert_eq!((status, r), (503, 18));
            assert_eq!(retry.unwrap(), "1");
        }
        clock.advance(Nanos::from_secs(1));
        assert_eq!(send().await, (200, 17, None));
    }

    proptest! {
        #[test]
        fn never_more_than_the_capacity_in_a_second(
            cap in 1u64..50,
            reqs in proptest::collection::vec((0u64..5, 0u64..4_000), 0..400),
        ) {
            let mut reqs = reqs;
            reqs.sort_by_key(|r| r.1);
            let edge = RateShed::default();
            let mut per_second = std::collections::BTreeMap::new();
            for (k, ms) in reqs {
                if edge.admit(cap, k, Nanos::from_millis(ms)) {
                    *per_second.entry(ms / 1000).or_insert(0u64) += 1;
                }
            }
            for (_, n) in per_second {
                prop_assert!(n <= cap);
            }
        }
    }
}
