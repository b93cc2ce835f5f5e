//! Leased budgets on a real Redis: three stores (three instances) share
//! one global limit of 2,000 a second, offered 6,000 a second unevenly
//! (one instance gets half), on a virtual clock every instance reads.
//! Each decision goes as the limit layer sends it: the store's local
//! answer first, Redis only when that has none.
//!
//! - a fixed window: every second admits at most its 2,000 (a slice
//!   lapses with the window it was charged in) and at least 95% of it;
//! - a sliding counter: every second at most 2,000 plus the stated bound,
//!   and the ten seconds at least 95% of the limit;
//! - a token bucket: every second after the first admits at most 2,000
//!   plus the stated bound (3 instances × 2 slices × `max_slice`), and
//!   the ten seconds at least 95% of what exact mode would;
//! - at least 95% of the decisions are made without a round trip;
//! - what Redis counts, once a slice's unused units are given back, is
//!   what was admitted: no slice counted twice or lost;
//! - Redis stopped mid-run: each instance decides from the slice it
//!   holds, then from its degraded share, and never beyond the two.

#[path = "../src/testing.rs"]
mod testing;

use std::time::Duration;

use paceline_core::{Cost, Nanos, Plan, Policy, Share, Store};
use paceline_redis::{Degraded, RedisStore, RedisStoreConfig};

const LIMIT: u64 = 2_000;
const MAX_SLICE: u64 = 40;
const INSTANCES: u64 = 3;
/// Requests a millisecond each instance is offered: 6,000 a second, half
/// of them at the first.
const OFFER: [u64; 3] = [3, 2, 1];

fn config(url: String, degraded: Option<f64>) -> RedisStoreConfig {
    RedisStoreConfig {
        urls: vec![url],
        // short: with Redis gone, each decision the slices cannot answer
        // waits for it before the degraded limiter answers
        deadline: Duration::from_millis(50),
        key_secret: b"one secret for every instance".to_vec(),
        clock: paceline_redis::ClockSource::Caller,
        slice: Duration::from_millis(100),
        degraded: degraded.map(|share| Degraded { share }),
        ..RedisStoreConfig::default()
    }
}

fn leased(policy: Policy) -> Plan {
    Plan::new(
        "global",
        vec![policy.with_share(Share::Leased {
            max_slice: MAX_SLICE,
        })],
    )
    .unwrap()
}

/// One decision, as the limit layer makes it.
async fn decide(s: &RedisStore, plan: &Plan, now: Nanos) -> bool {
    let cost = Cost::requests(1);
    let d = match s.check_local(plan, "all", cost, now) {
        Some(r) => r.unwrap(),
        None => s.check_cost(plan, "all", cost, now).await.unwrap(),
    };
    d.is_allowed()
}

struct Run {
    per_second: Vec<u64>,
    decisions: u64,
    round_trips: u64,
}

/// `secs` seconds of the offered load from `t0`, a millisecond a step;
/// `pause` runs between the steps (to stop Redis, say).
async fn run(stores: &[RedisStore], plan: &Plan, t0: u64, secs: u64) -> Run {
    let before: u64 = stores.iter().map(|s| s.stats().calls).sum();
    let mut per_second = vec![0u64; secs as usize];
    let mut decisions = 0;
    for ms in 0..secs * 1_000 {
        let now = Nanos::from_secs(t0).saturating_add(Nanos::from_millis(ms));
        for (s, &n) in stores.iter().zip(&OFFER) {
            for _ in 0..n {
                decisions += 1;
                if decide(s, plan, now).await {
                    per_second[(ms / 1_000) as usize] += 1;
                }
            }
        }
        // the slices taken ahead of need land between the steps
        tokio::task::yield_now().await;
    }
    let after: u64 = stores.iter().map(|s| s.stats().calls).sum();
    Run {
        per_second,
        decisions,
        round_trips: after - before,
    }
}

async fn stores(url: &str, degraded: Option<f64>) -> Vec<RedisStore> {
    let mut v = Vec::new();
    for _ in 0..INSTANCES {
        v.push(
            RedisStore::connect(config(url.to_string(), degraded))
                .await
                .unwrap(),
        );
    }
    v
}

fn report(name: &str, r: &Run) {
    let local = 1.0 - r.round_trips as f64 / r.decisions as f64;
    println!(
        "{name}: admitted per second {:?}, {} decisions, {} calls to Redis ({:.2}% of decisions without a round trip)",
        r.per_second,
        r.decisions,
        r.round_trips,
        100.0 * local
    );
    assert!(
        local >= 0.95,
        "{name}: {:.3} of the decisions were local",
        local
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_fixed_window_holds_its_quota_every_second() {
    let server = testing::RedisServer::start();
    let stores = stores(&server.url(), None).await;
    let plan = leased(Policy::fixed_window("global", LIMIT, 1).unwrap());
    let r = run(&stores, &plan, 1_800_000_000, 10).await;
    report("fixed window", &r);
    for (i, &n) in r.per_second.iter().enumerate() {
        assert!(n <= LIMIT, "second {i}: {n}");
        assert!(n * 100 >= LIMIT * 95, "second {i}: {n}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_token_bucket_overshoots_by_at_most_the_stated_bound() {
    let server = testing::RedisServer::start();
    let stores = stores(&server.url(), None).await;
    let plan = leased(Policy::token_bucket("global", LIMIT, 1).unwrap());
    let t0 = 1_800_000_000;
    let r = run(&stores, &plan, t0, 10).await;
    report("token bucket", &r);
    let bound = INSTANCES * 2 * MAX_SLICE;
    // the first second spends the full bucket as well as its refill
    assert!(r.per_second[0] <= 2 * LIMIT + bound, "{:?}", r.per_second);
    for (i, &n) in r.per_second.iter().enumerate().skip(1) {
        assert!(n <= LIMIT + bound, "second {i}: {n}");
    }
    let total: u64 = r.per_second.iter().sum();
    let exact = LIMIT + 10 * LIMIT;
    assert!(total * 100 >= exact * 95, "{total} of {exact}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_sliding_counter_overshoots_by_at_most_the_stated_bound() {
    let server = testing::RedisServer::start();
    let stores = stores(&server.url(), None).await;
    let plan = leased(Policy::sliding_counter("global", LIMIT, 1).unwrap());
    let r = run(&stores, &plan, 1_800_000_000, 10).await;
    report("sliding counter", &r);
    let bound = INSTANCES * 2 * MAX_SLICE;
    // each second is one sub-window: the counter's estimate there is
    // what it holds plus a share of the one before, at most the limit
    for (i, &n) in r.per_second.iter().enumerate() {
        assert!(n <= LIMIT + bound, "second {i}: {n}");
    }
    let total: u64 = r.per_second.iter().sum();
    assert!(total * 100 >= 10 * LIMIT * 95, "{total}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_redis_counts_is_what_was_admitted_once_unused_units_go_back() {
    let server = testing::RedisServer::start();
    let s = RedisStore::connect(config(server.url(), None))
        .await
        .unwrap();
    // a thousand an hour and a half: no refill to speak of within the test
    let plan = leased(Policy::token_bucket("slow", 1_000, 5_400).unwrap());
    let t = Nanos::from_secs(1_800_000_000);
    let mut admitted = 0;
    for i in 0..300u64 {
        // 300 in 30 ms: the slices grow with the rate
        let now = t.saturating_add(Nanos::new(i * 100_000));
        admitted += u64::from(decide(&s, &plan, now).await);
        tokio::task::yield_now().await;
    }
    assert_eq!(admitted, 300);
    let held = s.stats();
    assert!(held.leased > 200, "{held:?}");
    // the slice's time up: a read gives back what is left, and once more
    // later for a slice taken ahead of need that landed after the first
    // (a busy machine may take that long), each time until the count of
    // units given back stands still
    let mut later = t;
    for step in [200, 1_000] {
        tokio::time::sleep(Duration::from_millis(200)).await;
        later = t.saturating_add(Nanos::from_millis(step));
        let _ = s
            .check_cost(&plan, "all", Cost::requests(0), later)
            .await
            .unwrap();
        let until = std::time::Instant::now() + Duration::from_secs(5);
        let mut seen = u64::MAX;
        while s.stats().lease_returned != seen && std::time::Instant::now() < until {
            seen = s.stats().lease_returned;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let back = s.stats().lease_returned;
    let d = s
        .check_cost(&plan, "all", Cost::requests(0), later)
        .await
        .unwrap();
    println!(
        "admitted 300, gave back {back}, Redis holds {} left",
        d.statuses[0].remaining
    );
    assert!(back > 0, "{:?}", s.stats());
    assert_eq!(d.statuses[0].remaining, 1_000 - 300);
    // and once only: a later sweep has nothing more to give
    let much_later = later.saturating_add(Nanos::from_secs(2));
    let _ = s
        .check_cost(&plan, "all", Cost::requests(0), much_later)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(s.stats().lease_returned, back);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_gone_an_instance_decides_from_its_slice_then_its_share() {
    let server = testing::RedisServer::start();
    let share = 0.1;
    let stores = stores(&server.url(), Some(share)).await;
    let plan = leased(Policy::fixed_window("global", LIMIT, 1).unwrap());
    let t0 = 1_800_000_000;
    let warm = run(&stores, &plan, t0, 2).await;
    report("before the outage", &warm);
    // stopped for 5 s (its calls go unanswered until the deadline)
    server.pause();
    let r = run(&stores, &plan, t0 + 2, 5).await;
    server.resume();
    println!("Redis stopped: admitted per second {:?}", r.per_second);
    // each instance: at most its slices, then its degraded share of the window
    let most = INSTANCES * (2 * MAX_SLICE + (LIMIT as f64 * share) as u64);
    for (i, &n) in r.per_second.iter().enumerate() {
        assert!(n <= most, "second {i} without Redis: {n} > {most}");
        assert!(n > 0, "second {i}: the degraded limiter admits its share");
    }
    let degraded: u64 = stores.iter().map(|s| s.stats().degraded).sum();
    assert!(degraded > 0);
    // back: the shared count decides again, a second at a time exactly
    let after = run(&stores, &plan, t0 + 7, 3).await;
    println!("Redis back: admitted per second {:?}", after.per_second);
    for (i, &n) in after.per_second.iter().enumerate().skip(1) {
        assert!(n <= LIMIT, "second {i} after: {n}");
        assert!(n * 100 >= LIMIT * 95, "second {i} after: {n}");
    }
    // and what Redis counted in the last second is what was admitted in it
    let last = Nanos::from_secs(t0 + 9).saturating_add(Nanos::from_millis(999));
    let d = stores[0]
        .check_cost(&plan, "all", Cost::requests(0), last)
        .await
        .unwrap();
    let held: u64 = after.per_second[2];
    assert!(
        LIMIT - d.statuses[0].remaining >= held,
        "Redis counts {} of {held} admitted",
        LIMIT - d.statuses[0].remaining
    );
}
