//! The SDK against servers that count in fixed windows, on virtual time:
//! a counter that restores its whole quota at once when its window ends
//! (opened by the first request after the last one ended, the way popular
//! open-source limiters count, or aligned to the clock) is paced as such,
//! whichever way the answers overtake one another.

mod common;

use common::{client, Driver, Resp, T0};
use http::HeaderMap;
use paceline_core::{ManualClock, Nanos, Plan, Policy};
use paceline_wire::emit;

const URL: &str = "http://api.test/v1/jobs";

/// A fixed window of `q` per `w` seconds, opened by the first request
/// after the previous window ended; every request counts, rejected or not.
struct Anchored {
    q: u64,
    w: Nanos,
    reset: Nanos,
    hits: u64,
    dialect: Dialect,
}

#[derive(Clone, Copy, Debug)]
enum Dialect {
    /// `RateLimit-Policy: 8;w=2` with `RateLimit-Limit/-Remaining/-Reset`.
    Draft6,
    /// `RateLimit: "jobs"; r=7; t=2` with `RateLimit-Policy: "jobs"; q=8; w=2`.
    Draft8,
    /// `X-RateLimit-Limit/-Remaining/-Reset` (epoch seconds), no window.
    Legacy,
}

impl Anchored {
    fn new(q: u64, w_s: u64, dialect: Dialect) -> Self {
        Anchored::of(q, Nanos::from_secs(w_s), dialect)
    }

    fn of(q: u64, w: Nanos, dialect: Dialect) -> Self {
        Anchored {
            q,
            w,
            reset: Nanos::ZERO,
            hits: 0,
            dialect,
        }
    }

    fn respond(&mut self, now: Nanos) -> Resp {
        if now >= self.reset {
            self.reset = now.saturating_add(self.w);
            self.hits = 0;
        }
        self.hits += 1;
        let r = self.q.saturating_sub(self.hits);
        let t = self
            .reset
            .saturating_sub(now)
            .as_u64()
            .div_ceil(1_000_000_000);
        let (q, w) = (self.q, self.w.as_secs_floor());
        let mut h = HeaderMap::new();
        let mut put = |k: &'static str, v: String| {
            h.insert(k, v.parse().unwrap());
        };
        match self.dialect {
            Dialect::Draft6 => {
                put("ratelimit-policy", format!("{q};w={w}"));
                put("ratelimit-limit", q.to_string());
                put("ratelimit-remaining", r.to_string());
                put("ratelimit-reset", t.to_string());
            }
            Dialect::Draft8 => {
                put("ratelimit-policy", format!("\"jobs\"; q={q}; w={w}"));
                put("ratelimit", format!("\"jobs\"; r={r}; t={t}"));
            }
            Dialect::Legacy => {
                put("x-ratelimit-limit", q.to_string());
                put("x-ratelimit-remaining", r.to_string());
                let epoch = self.reset.as_u64().div_ceil(1_000_000_000);
                put("x-ratelimit-reset", epoch.to_string());
            }
        }
        let allowed = self.hits <= self.q;
        if !allowed {
            put("retry-after", t.to_string());
        }
        (if allowed { 200 } else { 429 }, h, None)
    }
}

fn driver<'a>(c: &'a paceline_client::Client, clock: &'a ManualClock, seed: u64) -> Driver<'a> {
    Driver {
        client: c,
        clock,
        workers: 10,
        jobs: 40,
        latency: Nanos::from_millis(2),
        think: Nanos::ZERO,
        stop: Some(T0.saturating_add(Nanos::from_secs(120))),
        url: URL,
        jitter_think: false,
        spread: Nanos::from_millis(3),
        latency_seed: seed,
    }
}

#[test]
fn an_anchored_fixed_window_is_paced_as_one() {
    for dialect in [Dialect::Draft6, Dialect::Draft8] {
        for seed in 1..=8 {
            let clock = ManualClock::new(T0.saturating_add(Nanos::from_millis(seed * 137)));
            let c = client(&clock, seed);
            let mut server = Anchored::new(8, 2, dialect);
            let run = driver(&c, &clock, seed).run(&mut |now| server.respond(now));
            assert_eq!(run.done, 40, "{dialect:?} seed {seed}: {run:?}");
            assert_eq!(run.status(429), 0, "{dialect:?} seed {seed}: {run:?}");
            assert_eq!(run.requests, 40, "{dialect:?} seed {seed}");
            // five windows of 8; the last opens 8 s after the first
            let floor = 8.0;
            assert!(
                run.finished_s <= floor * 1.05,
                "{dialect:?} seed {seed}: finished at {} s",
                run.finished_s
            );
            let snap = c.diagnostics();
            assert_eq!(snap.scopes[0].policies[0].window_kind, "fixed");
        }
    }
}

#[test]
fn a_window_announced_by_its_reset_instant_draws_no_429() {
    for seed in 1..=8 {
        let clock = ManualClock::new(T0.saturating_add(Nanos::from_millis(seed * 211)));
        let c = client(&clock, seed);
        let mut server = Anchored::new(8, 2, Dialect::Legacy);
        let run = driver(&c, &clock, seed).run(&mut |now| server.respond(now));
        assert_eq!(run.done, 40, "seed {seed}: {run:?}");
        assert_eq!(run.status(429), 0, "seed {seed}: {run:?}");
        // the window's length read off its reset instant: near the floor
        // although each reset is published up to a second late
        println!("legacy seed {seed}: {:.3} s", run.finished_s);
        assert!(
            run.finished_s <= 8.0 * 1.05,
            "seed {seed}: {}",
            run.finished_s
        );
    }
}

#[test]
fn a_window_of_a_fraction_of_a_second_costs_at_most_one_429() {
    for seed in 1..=8 {
        let clock = ManualClock::new(T0.saturating_add(Nanos::from_millis(seed * 97)));
        let c = client(&clock, seed);
        let mut server = Anchored::of(8, Nanos::from_millis(1_500), Dialect::Legacy);
        let run = driver(&c, &clock, seed).run(&mut |now| server.respond(now));
        assert_eq!(run.done, 40, "seed {seed}: {run:?}");
        assert!(run.status(429) <= 1, "seed {seed}: {run:?}");
    }
}

#[test]
fn a_clock_aligned_fixed_window_draws_no_429() {
    for seed in 1..=8 {
        let clock = ManualClock::new(T0.saturating_add(Nanos::from_millis(seed * 173)));
        let plan = Plan::new("fw", vec![Policy::fixed_window("burst", 8, 2).unwrap()]).unwrap();
        let limiter = paceline_core::Limiter::new(paceline_core::MemoryStore::new(), clock.clone());
        let c = client(&clock, seed);
        let run = driver(&c, &clock, seed).run(&mut |_| {
            let d = limiter.check_sync(&plan, "k", 1).unwrap();
            let mut h = HeaderMap::new();
            emit::write_headers(&plan, &d, &emit::Dialects::default(), &mut h);
            (if d.is_allowed() { 200 } else { 429 }, h, None)
        });
        assert_eq!(run.done, 40, "seed {seed}: {run:?}");
        assert_eq!(run.status(429), 0, "seed {seed}: {run:?}");
        assert!(run.finished_s <= 10.5, "seed {seed}: {}", run.finished_s);
    }
}
