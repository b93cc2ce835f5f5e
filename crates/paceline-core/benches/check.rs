//! Our check against the `governor` crate's keyed limiter, on the same work,
//! in the same run: one key, 1,000 keys, 1,000,000 keys, two threads on one
//! key; and our two-policy (burst + daily) plan against the `limitador`
//! crate's in-memory limiter checking the same two limits per key (one key
//! and 1,000 keys).
//!
//! Run: `cargo bench -p paceline-core --bench check`

#![allow(missing_docs)] // criterion_group! generates undocumented items

use std::collections::HashMap;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use governor::{Quota, RateLimiter};
use paceline_core::{Limiter, MemoryStore, Plan, Policy, SystemClock};

const Q: u32 = 50; // 50 per second, burst 50, for both

fn ours() -> (Limiter<MemoryStore, SystemClock>, Plan, Plan) {
    let one = Plan::new(
        "p",
        vec![Policy::token_bucket("burst", Q as u64, 1).unwrap()],
    )
    .unwrap();
    let two = Plan::new(
        "p2",
        vec![
            Policy::token_bucket("burst", Q as u64, 1).unwrap(),
            Policy::daily("daily", 1_000_000_000).unwrap(),
        ],
    )
    .unwrap();
    (Limiter::in_memory(), one, two)
}

fn theirs() -> governor::DefaultKeyedRateLimiter<String> {
    let q = NonZeroU32::new(Q).unwrap();
    RateLimiter::keyed(Quota::per_second(q).allow_burst(q))
}

/// limitador's in-memory limiter with the same two limits per key: 50 a
/// second and 1,000,000,000 a day, each counted per value of `key`
/// (limitador counts fixed windows; it has no token bucket).
fn limitadors() -> (limitador::RateLimiter, limitador::limit::Namespace) {
    use limitador::limit::{Expression, Limit};
    let ns: limitador::limit::Namespace = "api".into();
    let lim = limitador::RateLimiter::new(100_000);
    let by_key = || -> Vec<Expression> { vec!["key".try_into().unwrap()] };
    lim.add_limit(Limit::new(ns.clone(), Q as u64, 1, [], by_key()));
    lim.add_limit(Limit::new(ns.clone(), 1_000_000_000, 86_400, [], by_key()));
    (lim, ns)
}

/// limitador's request context for each key, built once (what a caller
/// would have in hand from the request's descriptors).
fn contexts(ks: &[String]) -> Vec<limitador::limit::Context<'static>> {
    ks.iter()
        .map(|k| HashMap::from([("key".to_string(), k.clone())]).into())
        .collect()
}

fn keys(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("sk_live_{i:08}")).collect()
}

fn keyed(c: &mut Criterion) {
    for &n in &[1usize, 1_000, 1_000_000] {
        let ks = keys(n);
        let mut g = c.benchmark_group(format!("keys_{n}"));
        if n >= 1_000_000 {
            g.sample_size(20).measurement_time(Duration::from_secs(8));
        }
        let (lim, one, two) = ours();
        let gov = theirs();
        // warm both stores with every key so we measure lookups, not growth
        for k in &ks {
            let _ = lim.check_sync(&one, k, 1);
            let _ = lim.check_sync(&two, k, 1);
            let _ = gov.check_key(k);
        }
        let mut i = 0usize;
        g.bench_function(BenchmarkId::new("paceline_one_policy", n), |b| {
            b.iter(|| {
                i = (i + 1) % n;
                black_box(lim.check_sync(&one, &ks[i], 1).unwrap().is_allowed())
            })
        });
        g.bench_function(BenchmarkId::new("paceline_two_policies", n), |b| {
            b.iter(|| {
                i = (i + 1) % n;
                black_box(lim.check_sync(&two, &ks[i], 1).unwrap().is_allowed())
            })
        });
        g.bench_function(BenchmarkId::new("governor_keyed", n), |b| {
            b.iter(|| {
                i = (i + 1) % n;
                black_box(gov.check_key(&ks[i]).is_ok())
            })
        });
        if n <= 1_000 {
            let (tor, ns) = limitadors();
            let ctxs = contexts(&ks);
            for c in &ctxs {
                let _ = tor.check_rate_limited_and_update(&ns, c, 1);
            }
            g.bench_function(BenchmarkId::new("limitador_two_limits", n), |b| {
                b.iter(|| {
                    i = (i + 1) % n;
                    let r = tor.check_rate_limited_and_update(&ns, &ctxs[i], 1);
                    black_box(!r.unwrap().limited)
                })
            });
        }
        g.finish();
    }
}

/// Every check a key never seen before (a flood of new clients): the
/// insert path, not the lookup.
fn new_keys(c: &mut Criterion) {
    const N: usize = 3_000_000;
    let ks: Vec<String> = (0..N).map(|i| format!("sk_new_{i:08}")).collect();
    let mut g = c.benchmark_group("new_keys");
    g.sample_size(20).measurement_time(Duration::from_secs(5));
    let (lim, one, _) = ours();
    let gov = theirs();
    let mut i = 0usize;
    g.bench_function("paceline_one_policy", |b| {
        b.iter(|| {
            i = (i + 1) % N;
            black_box(lim.check_sync(&one, &ks[i], 1).unwrap().is_allowed())
        })
    });
    let mut i = 0usize;
    g.bench_function("governor_keyed", |b| {
        b.iter(|| {
            i = (i + 1) % N;
            black_box(gov.check_key(&ks[i]).is_ok())
        })
    });
    g.finish();
}

/// Two threads hammering one key; reported as time per check per thread.
fn two_threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("two_threads_one_key");
    let (lim, one, _) = ours();
    let lim = Arc::new(lim);
    let gov = Arc::new(theirs());
    let key = "sk_live_00000001".to_string();
    g.bench_function("paceline_one_policy", |b| {
        b.iter_custom(|iters| {
            run_two(iters, {
                let (lim, one, key) = (lim.clone(), one.clone(), key.clone());
                move || {
                    black_box(lim.check_sync(&one, &key, 1).unwrap().is_allowed());
                }
            })
        })
    });
    g.bench_function("governor_keyed", |b| {
        b.iter_custom(|iters| {
            run_two(iters, {
                let (gov, key) = (gov.clone(), key.clone());
                move || {
                    black_box(gov.check_key(&key).is_ok());
                }
            })
        })
    });
    g.finish();
}

fn run_two(iters: u64, f: impl Fn() + Send + Clone + 'static) -> Duration {
    let start = Instant::now();
    let hs: Vec<_> = (0..2)
        .map(|_| {
            let f = f.clone();
            std::thread::spawn(move || {
                for _ in 0..iters {
                    f();
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    start.elapsed()
}

criterion_group!(benches, keyed, two_threads, new_keys);
criterion_main!(benches);
