//! Load shedding by criticality.
//!
//! Why shed before limiting: a rate limit protects the upstream from one
//! client; shedding protects it from everyone at once. When the upstream is
//! slow or swamped, the cheapest useful thing the gateway can do is answer
//! the least important requests at once with `503 overloaded` and keep the
//! capacity for the requests that matter (a label purchase, not a rate
//! quote). A shed request never reaches the rate limiter, so it is charged
//! to no quota: the client did nothing wrong.
//!
//! Each criticality level may use a share of the in-flight capacity `N`
//! (the most requests the upstream is given at once), with `r` the reserve
//! (20% by default):
//!
//! | level | may run while in flight is below |
//! |---|---|
//! | `CRITICAL_PLUS` | `N` |
//! | `CRITICAL` | `N − ⌈r·N/4⌉` (a sliver kept for `CRITICAL_PLUS`) |
//! | `SHEDDABLE_PLUS` | `N·(1 − r)` |
//! | `SHEDDABLE` | `N·(1 − 2r)` |
//!
//! so sheddable work always leaves at least `r·N` for critical routes, and
//! the least critical goes first. When a latency bound is set and the
//! smoothed upstream latency is above it, `SHEDDABLE` is cut to one probe
//! in flight (so the latency can be seen to recover) and `SHEDDABLE_PLUS`
//! to the share `SHEDDABLE` had. The latency is the one the shed layer
//! measures itself, by the shedder's clock: from the call of the service
//! it guards to the head of the upstream's answer.
//!
//! A request counts in flight from the moment it holds a unit. The
//! gateway's shed layer is [deferred](LoadShedLayer::deferred): it decides
//! from the head whether there is room (a `503` then costs the client no
//! wait for its body), and the unit is taken only once the limiter has
//! admitted the request and its body can flow: one whose body has still
//! to come first waits in the intake (`intake.rs`: a receiving place per
//! client address and overall, its first bytes in, the least rate held
//! to), so clients sending bodies slowly cannot hold the in-flight places
//! critical work needs. A request that finds no room by then is shed with
//! its charge given back.
//!
//! Beside the in-flight capacity, `max_rps` caps the requests a second the
//! gateway passes on, the heaviest caller's excess dropped first (see
//! [`RateShed`]).
//!
//! ```
//! use paceline_gateway::shed::Shedder;
//! use paceline_gateway::SheddingSettings;
//! use paceline_server::Criticality;
//!
//! let shedder = Shedder::new(SheddingSettings { max_in_flight: 10, ..Default::default() });
//! let held: Vec<_> = (0..6).map(|_| shedder.try_admit(Criticality::Sheddable).unwrap()).collect();
//! assert!(shedder.try_admit(Criticality::Sheddable).is_none()); // 6 of 10: quotes stop
//! assert!(shedder.try_admit(Criticality::Critical).is_some()); // labels go on
//! drop(held);
//! assert!(shedder.try_admit(Criticality::Sheddable).is_some());
//! ```

mod rate;
mod service;

use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use paceline_core::{Clock, Nanos, SystemClock};
use paceline_server::Criticality;
use parking_lot::RwLock;

pub use rate::{caller_of, RateShed, MAX_CALLERS};
pub(crate) use service::ShedFuture;
pub use service::{
    overloaded, CallClassified, CurrentLimits, LoadShed, LoadShedLayer, OwnAnswer, ShedBody,
};

use crate::config::SheddingSettings;

/// Decides which requests to shed; clones share the count.
#[derive(Clone)]
pub struct Shedder {
    inner: Arc<Inner>,
}

struct Inner {
    in_flight: AtomicU32,
    /// Smoothed upstream latency in microseconds (0: no sample yet).
    latency_us: AtomicU64,
    settings: RwLock<SheddingSettings>,
    /// What latencies are measured by.
    clock: Arc<dyn Clock>,
    /// The requests-per-second capacity's window (`max_rps`).
    rate: rate::RateShed,
}

impl fmt::Debug for Shedder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shedder")
            .field("in_flight", &self.in_flight())
            .field("settings", &*self.inner.settings.read())
            .finish()
    }
}

/// Holds one unit of in-flight capacity until dropped.
#[derive(Debug)]
pub struct ShedGuard {
    shedder: Shedder,
}

impl Drop for ShedGuard {
    fn drop(&mut self) {
        self.shedder.inner.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Shedder {
    /// A shedder with `settings` (`max_in_flight` 0 admits everything),
    /// measuring latencies by the system clock.
    pub fn new(settings: SheddingSettings) -> Self {
        Shedder::with_clock(settings, Arc::new(SystemClock::new()))
    }

    /// A shedder measuring latencies by `clock` (the gateway's own).
    pub fn with_clock(settings: SheddingSettings, clock: Arc<dyn Clock>) -> Self {
        Shedder {
            inner: Arc::new(Inner {
                in_flight: AtomicU32::new(0),
                latency_us: AtomicU64::new(0),
                settings: RwLock::new(settings),
                clock,
                rate: rate::RateShed::default(),
            }),
        }
    }

    /// The time by the shedder's clock.
    pub(crate) fn now(&self) -> Nanos {
        self.inner.clock.now()
    }

    /// Replaces the settings (requests in flight keep their units).
    pub fn set_settings(&self, settings: SheddingSettings) {
        *self.inner.settings.write() = settings;
    }

    /// The settings in force.
    pub fn settings(&self) -> SheddingSettings {
        *self.inner.settings.read()
    }

    /// Requests admitted and not yet finished.
    pub fn in_flight(&self) -> u32 {
        self.inner.in_flight.load(Ordering::Acquire)
    }

    /// The smoothed upstream latency, if any was recorded.
    pub fn latency(&self) -> Option<Duration> {
        match self.inner.latency_us.load(Ordering::Relaxed) {
            0 => None,
            us => Some(Duration::from_micros(us)),
        }
    }

    /// Records one upstream latency (time to the response head); the
    /// smoothed value moves a fifth of the way towards it.
    pub fn record_latency(&self, sample: Duration) {
        let s = (sample.as_micros() as u64).max(1);
        let old = self.inner.latency_us.load(Ordering::Relaxed);
        let new = if old == 0 {
            s
        } else {
            (old * 4 + s).div_ceil(5)
        };
        self.inner.latency_us.store(new, Ordering::Relaxed);
    }

    /// Admits a request of criticality `c`, or sheds it (`None`).
    pub fn try_admit(&self, c: Criticality) -> Option<ShedGuard> {
        self.admit(&self.settings(), c)
    }

    /// [`Shedder::try_admit`] under settings `s` already read.
    pub(crate) fn admit(&self, s: &SheddingSettings, c: Criticality) -> Option<ShedGuard> {
        if s.max_in_flight == 0 {
            return Some(self.guard());
        }
        let limit = self.limit_now(s, c);
        let counter = &self.inner.in_flight;
        let mut cur = counter.load(Ordering::Acquire);
        loop {
            if cur >= limit {
                return None;
            }
            match counter.compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    return Some(ShedGuard {
                        shedder: self.clone(),
                    })
                }
                Err(now) => cur = now,
            }
        }
    }

    /// Whether a request of criticality `c` would be admitted now under
    /// settings `s` (nothing is taken: see [`ShedTicket`]).
    pub(crate) fn would_admit(&self, s: &SheddingSettings, c: Criticality) -> bool {
        s.max_in_flight == 0 || self.in_flight() < self.limit_now(s, c)
    }

    /// The in-flight count below which criticality `c` runs now, the
    /// latency rule applied.
    fn limit_now(&self, s: &SheddingSettings, c: Criticality) -> u32 {
        let slow = match (s.max_latency, self.latency()) {
            (Some(max), Some(l)) => l > max,
            _ => false,
        };
        limit(s, c, slow)
    }

    fn guard(&self) -> ShedGuard {
        self.inner.in_flight.fetch_add(1, Ordering::AcqRel);
        ShedGuard {
            shedder: self.clone(),
        }
    }
}

/// A request's unit of in-flight capacity, taken by the stage after a
/// [deferred](LoadShedLayer::deferred) shed layer (the gateway's, once the
/// body can flow) with [`redeem`](ShedTicket::redeem) and left in its
/// answer's extensions: the shed layer takes it from there and holds the
/// unit until the answer's body ends.
#[derive(Clone, Debug)]
pub struct ShedTicket {
    inner: Arc<TicketInner>,
}

#[derive(Debug)]
struct TicketInner {
    /// The unit taken, and when (by the shedder's clock).
    held: parking_lot::Mutex<Option<(ShedGuard, Nanos)>>,
}

impl ShedTicket {
    /// Takes a request's unit of in-flight capacity now, for its
    /// criticality; `None` when there is no room left (it is to be shed).
    pub fn redeem(shedder: &Shedder, criticality: Criticality) -> Option<ShedTicket> {
        let Some(guard) = shedder.admit(&shedder.settings(), criticality) else {
            metrics::counter!(crate::metrics::SHED, "criticality" => criticality.as_str(), "reason" => "in_flight")
                .increment(1);
            return None;
        };
        Some(ShedTicket {
            inner: Arc::new(TicketInner {
                held: parking_lot::Mutex::new(Some((guard, shedder.now()))),
            }),
        })
    }

    /// The unit taken and when, once the request is done with the stages
    /// after the shed layer.
    fn take(&self) -> Option<(ShedGuard, Nanos)> {
        self.inner.held.lock().take()
    }
}

/// The in-flight count below which a request of criticality `c` runs.
pub fn limit(s: &SheddingSettings, c: Criticality, slow: bool) -> u32 {
    let n = f64::from(s.max_in_flight);
    let r = s.reserve;
    let share = |x: f64| (x.floor() as u32).max(1);
    match (c, slow) {
        (Criticality::CriticalPlus, _) => s.max_in_flight,
        (Criticality::Critical, _) => share(n - (r * n / 4.0).ceil()),
        (Criticality::SheddablePlus, false) => share(n * (1.0 - r)),
        (Criticality::SheddablePlus, true) | (Criticality::Sheddable, false) => {
            share(n * (1.0 - 2.0 * r))
        }
        (Criticality::Sheddable, true) => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The table of the gateway's README and of `examples/shiplane.toml`.
    #[test]
    fn the_documented_shares_hold() {
        use Criticality::*;
        // The table in the crate's README, row by row: N, r, then the share
        // of each criticality from CRITICAL_PLUS down.
        let readme = include_str!("../../README.md");
        let rows: Vec<Vec<String>> = readme
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("| ") && l.split('|').count() == 8)
            .map(|l| l.split('|').map(|c| c.trim().to_string()).collect())
            .filter(|c: &Vec<String>| c[1].parse::<u32>().is_ok())
            .collect();
        assert!(rows.len() >= 4, "the README's shares table: {rows:?}");
        for c in rows {
            let n: u32 = c[1].parse().unwrap();
            let r: f64 = c[2].parse().unwrap();
            let want: [u32; 4] = std::array::from_fn(|i| c[3 + i].parse().unwrap());
            let s = SheddingSettings {
                max_in_flight: n,
                reserve: r,
                ..Default::default()
            };
            let got =
                [CriticalPlus, Critical, SheddablePlus, Sheddable].map(|c| limit(&s, c, false));
            assert_eq!(got, want, "N = {n}, r = {r}");
            assert_eq!(limit(&s, Sheddable, true), 1);
            assert_eq!(limit(&s, SheddablePlus, true), want[3]);
        }
    }

    const LEVELS: [Criticality; 4] = [
        Criticality::CriticalPlus,
        Criticality::Critical,
        Criticality::SheddablePlus,
        Criticality::Sheddable,
    ];

    fn settings(n: u32, r: f64) -> SheddingSettings {
        SheddingSettings {
            max_in_flight: n,
            reserve: r,
            ..Default::default()
        }
    }

    #[test]
    fn the_default_shares() {
        let s = settings(100, 0.2);
        let l: Vec<u32> = LEVELS.iter().map(|&c| limit(&s, c, false)).collect();
        assert_eq!(l, vec![100, 95, 80, 60]);
        let l: Vec<u32> = LEVELS.iter().map(|&c| limit(&s, c, true)).collect();
        assert_eq!(l, vec![100, 95, 60, 1]);
    }

    #[test]
    fn off_admits_everything() {
        let sh = Shedder::new(settings(0, 0.2));
        let held: Vec<_> = (0..1000)
            .map(|_| sh.try_admit(Criticality::Sheddable).unwrap())
            .collect();
        assert_eq!(sh.in_flight(), 1000);
        drop(held);
        assert_eq!(sh.in_flight(), 0);
    }

    #[test]
    fn slow_upstream_sheds_sheddable_first() {
        let sh = Shedder::new(SheddingSettings {
            max_latency: Some(Duration::from_millis(50)),
            ..settings(10, 0.2)
        });
        sh.record_latency(Duration::from_millis(200));
        let probe = sh.try_admit(Criticality::Sheddable).unwrap();
        assert!(sh.try_admit(Criticality::Sheddable).is_none());
        assert!(sh.try_admit(Criticality::SheddablePlus).is_some());
        drop(probe);
        for _ in 0..20 {
            sh.record_latency(Duration::from_millis(5));
        }
        assert!(sh.latency().unwrap() < Duration::from_millis(50));
        let a = sh.try_admit(Criticality::Sheddable).unwrap();
        assert!(sh.try_admit(Criticality::Sheddable).is_some());
        drop(a);
    }

    proptest! {
        #[test]
        fn levels_are_ordered_and_keep_the_reserve(n in 1u32..10_000, r in 0.0f64..=0.9, slow: bool) {
            let s = settings(n, r);
            let l: Vec<u32> = LEVELS.iter().map(|&c| limit(&s, c, slow)).collect();
            // a less critical level never gets more than a more critical one
            for w in l.windows(2) {
                prop_assert!(w[0] >= w[1], "{l:?}");
            }
            prop_assert_eq!(l[0], n);
            // sheddable work leaves the reserve free (unless N is tiny)
            let reserve = (f64::from(n) * r).floor() as u32;
            if l[2] > 1 {
                prop_assert!(l[2] <= n - reserve, "{l:?} reserve {reserve}");
            }
        }

        #[test]
        fn in_flight_never_passes_the_level_limit(ops in proptest::collection::vec((0usize..4, any::<bool>()), 1..200)) {
            let sh = Shedder::new(settings(8, 0.25));
            let mut held: Vec<(usize, ShedGuard)> = Vec::new();
            for (lvl, release) in ops {
                if release && !held.is_empty() {
                    held.remove(0);
                    continue;
                }
                let before = sh.in_flight();
                match sh.try_admit(LEVELS[lvl]) {
                    Some(g) => {
                        prop_assert!(before < limit(&sh.settings(), LEVELS[lvl], false));
                        held.push((lvl, g));
                    }
                    None => prop_assert!(before >= limit(&sh.settings(), LEVELS[lvl], false)),
                }
                prop_assert_eq!(sh.in_flight() as usize, held.len());
            }
        }
    }
}
