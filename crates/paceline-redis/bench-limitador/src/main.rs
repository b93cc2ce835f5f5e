//! Decisions per second of the `limitador` crate's Redis storage: N
//! callers on one limiter, each checking the same two limits per key as
//! paceline's Free plan (20 per 2 s and 10,000 per day) for random keys
//! as fast as answers come. The peer of paceline-redis's `bench-redis`
//! example, run by `scripts/bench-limitador.sh`.
//!
//! ```text
//! cargo run --release --manifest-path crates/paceline-redis/bench-limitador/Cargo.toml -- \
//!     redis://127.0.0.1:6379 CALLERS SECONDS [KEYS]
//! ```
//!
//! The storage is `AsyncRedisStorage`, limitador's Redis storage: every
//! check reads the key's two counters from Redis (one script) and, when
//! admitted, increments them there (a pipeline of two scripts).
//! `CachedRedisStorage`, which answers from counters kept in the process
//! and flushes them to Redis in the background, is not measured: in
//! limitador 0.14.0 it deadlocks within a second at 50 concurrent tasks (a
//! task waits on a semaphore while holding a lock of the map of counters
//! waiting for a flush, and the worker threads block on that lock).
//!
//! limitador counts fixed windows (it has no token bucket): the burst
//! limit here is 20 in each 2 s window of a key, not a bucket refilling
//! one token every 100 ms.
//!
//! Prints one line in the fields of `bench-redis`: `storage=async
//! callers=N decisions=D limited=L errors=E seconds=T per_second=R
//! cpu_us=U` (L: how many of the decisions were denials; U: this process's
//! own CPU time per decision, user and system, in microseconds).
//! `BENCH_THREADS` sets the runtime's worker threads (default: one per
//! core).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use limitador::limit::{Context, Expression, Limit, Namespace};
use limitador::storage::redis::AsyncRedisStorage;
use limitador::AsyncRateLimiter;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// This process's CPU time so far (user + system), from /proc: 0 where
/// there is none.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // the fields after the command's closing parenthesis; utime and stime
    // are the 14th and 15th of the line, in clock ticks (100 a second)
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|s| s.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

fn main() -> Result<(), Error> {
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    rt.enable_all();
    if let Ok(v) = std::env::var("BENCH_THREADS") {
        let n: usize = v.parse().map_err(|e| format!("BENCH_THREADS={v}: {e}"))?;
        rt.worker_threads(n.max(1));
    }
    rt.build()?.block_on(bench())
}

/// The request context of one check: the key as the value limits count by.
fn context(key: String) -> Context<'static> {
    HashMap::from([("key".to_string(), key)]).into()
}

async fn bench() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    let url = args
        .get(1)
        .cloned()
        .unwrap_or("redis://127.0.0.1:6379".into());
    let callers: usize = args.get(2).map_or(Ok(1), |s| s.parse())?;
    let seconds: f64 = args.get(3).map_or(Ok(5.0), |s| s.parse())?;
    let keys: u64 = args.get(4).map_or(Ok(100_000), |s| s.parse())?;

    // connecting loads the storage's scripts: retried until Redis answers
    let until = Instant::now() + Duration::from_secs(10);
    let storage = loop {
        match AsyncRedisStorage::new(&url).await {
            Ok(s) => break s,
            Err(e) if Instant::now() > until => {
                return Err(format!("Redis did not answer for 10 s: {e}").into())
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    let limiter = AsyncRateLimiter::new_with_storage(Box::new(storage));
    // the Free plan's two limits, each counted per value of `key`
    let ns: Namespace = "free".into();
    let by_key = || -> Result<Vec<Expression>, Error> { Ok(vec!["key".try_into()?]) };
    limiter.add_limit(Limit::new(ns.clone(), 20, 2, [], by_key()?));
    limiter.add_limit(Limit::new(ns.clone(), 10_000, 86_400, [], by_key()?));
    // a first check: not measured
    limiter
        .check_rate_limited_and_update(&ns, &context("k:warm".into()), 1)
        .await
        .map_err(|e| format!("the first check: {e}"))?;

    let cpu_before = cpu_seconds();
    let limiter = Arc::new(limiter);
    let ns = Arc::new(ns);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let limited = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..callers {
        let (limiter, ns, stop, done, limited, errors) = (
            limiter.clone(),
            ns.clone(),
            stop.clone(),
            done.clone(),
            limited.clone(),
            errors.clone(),
        );
        tasks.push(tokio::spawn(async move {
            // the same key sequence per caller as bench-redis
            let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (c as u64 + 1);
            while !stop.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let ctx = context(format!("k:{}", x % keys));
                match limiter.check_rate_limited_and_update(&ns, &ctx, 1).await {
                    Ok(r) => {
                        done.fetch_add(1, Ordering::Relaxed);
                        if r.limited {
                            limited.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await?;
    }
    let secs = started.elapsed().as_secs_f64();
    let n = done.load(Ordering::Relaxed);
    let cpu = cpu_seconds() - cpu_before;
    println!(
        "storage=async callers={callers} decisions={n} limited={} errors={} seconds={secs:.2} per_second={:.0} cpu_us={:.2}",
        limited.load(Ordering::Relaxed),
        errors.load(Ordering::Relaxed),
        n as f64 / secs,
        cpu * 1e6 / n.max(1) as f64,
    );
    Ok(())
}
