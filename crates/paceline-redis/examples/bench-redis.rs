//! Decisions per second of the Redis store: N callers on one instance,
//! each checking the Free plan for random keys as fast as answers come.
//!
//! ```text
//! cargo run --release -p paceline-redis --example bench-redis -- \
//!     redis://127.0.0.1:6379 CALLERS SECONDS [KEYS]
//! ```
//!
//! Prints one line: `callers=N decisions=D errors=E seconds=S
//! per_second=R calls=C per_call=P cpu_us=U` (P: decisions per Redis
//! call; U: this process's own CPU time per decision, user and system, in
//! microseconds: a figure that moves less with the machine's load than
//! the rate does).
//!
//! The store's defaults can be overridden for tuning runs with
//! `BENCH_CONNECTIONS`, `BENCH_MAX_IN_FLIGHT` and `BENCH_BATCH_MAX`, and
//! `BENCH_THREADS` sets the runtime's worker threads (default: one per
//! core).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use paceline_core::{Nanos, Plan, Policy, Store};
use paceline_redis::{RedisStore, RedisStoreConfig};

fn env_usize(name: &str) -> Result<Option<usize>, Box<dyn std::error::Error>> {
    match std::env::var(name) {
        Ok(v) => Ok(Some(v.parse().map_err(|e| format!("{name}={v}: {e}"))?)),
        Err(_) => Ok(None),
    }
}

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

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    rt.enable_all();
    if let Some(n) = env_usize("BENCH_THREADS")? {
        rt.worker_threads(n.max(1));
    }
    rt.build()?.block_on(bench())
}

async fn bench() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let url = args
        .get(1)
        .cloned()
        .unwrap_or("redis://127.0.0.1:6379".into());
    let callers: usize = args.get(2).map_or(Ok(1), |s| s.parse())?;
    let seconds: f64 = args.get(3).map_or(Ok(5.0), |s| s.parse())?;
    let keys: u64 = args.get(4).map_or(Ok(100_000), |s| s.parse())?;
    let mut config = RedisStoreConfig {
        urls: vec![url],
        deadline: Duration::from_millis(500),
        key_secret: b"bench".to_vec(),
        ..RedisStoreConfig::default()
    };
    if let Some(n) = env_usize("BENCH_CONNECTIONS")? {
        config.connections = n;
    }
    if let Some(n) = env_usize("BENCH_MAX_IN_FLIGHT")? {
        config.max_in_flight = n;
    }
    if let Some(n) = env_usize("BENCH_BATCH_MAX")? {
        config.batch_max = n;
    }
    let store = RedisStore::connect(config).await?;
    // the first call connects and loads the functions: not measured
    let warm = Plan::new("warm", vec![Policy::token_bucket("b", 1, 1)?])?;
    let until = Instant::now() + Duration::from_secs(10);
    while let Err(e) = store.check(&warm, "k:warm", 1, Nanos::ZERO).await {
        if Instant::now() > until {
            return Err(format!("Redis did not answer for 10 s: {e:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = store.stats();
    let cpu_before = cpu_seconds();
    let plan = Arc::new(Plan::new(
        "free",
        vec![
            Policy::token_bucket("burst", 20, 2)?,
            Policy::daily("daily", 10_000)?,
        ],
    )?);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..callers {
        let (store, plan, stop, done, errors) = (
            store.clone(),
            plan.clone(),
            stop.clone(),
            done.clone(),
            errors.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (c as u64 + 1);
            while !stop.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let key = format!("k:{}", x % keys);
                match store.check(&plan, &key, 1, Nanos::ZERO).await {
                    Ok(_) => done.fetch_add(1, Ordering::Relaxed),
                    Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                };
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
    let calls = store.stats().calls - before.calls;
    println!(
        "callers={callers} decisions={n} errors={} seconds={secs:.2} per_second={:.0} calls={calls} per_call={:.2} cpu_us={:.2}",
        errors.load(Ordering::Relaxed),
        n as f64 / secs,
        n as f64 / calls.max(1) as f64,
        cpu * 1e6 / n.max(1) as f64,
    );
    Ok(())
}
