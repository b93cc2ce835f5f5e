//! Decisions per second of the Redis store: N callers on one instance,
//! each checking the Free plan for random keys as fast as answers come.
//!
//! ```text
//! cargo run --release -p paceline-redis --example bench-redis -- \
//!     redis://127.0.0.1:6379 CALLERS SECONDS [KEYS]
//! ```
//!
//! Prints one line: `callers=N decisions=D seconds=S per_second=R calls=C`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use paceline_core::{Nanos, Plan, Policy, Store};
use paceline_redis::{RedisStore, RedisStoreConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let url = args
        .get(1)
        .cloned()
        .unwrap_or("redis://127.0.0.1:6379".into());
    let callers: usize = args.get(2).map_or(Ok(1), |s| s.parse())?;
    let seconds: f64 = args.get(3).map_or(Ok(5.0), |s| s.parse())?;
    let keys: u64 = args.get(4).map_or(Ok(100_000), |s| s.parse())?;
    let store = RedisStore::connect(RedisStoreConfig {
        urls: vec![url],
        deadline: Duration::from_millis(500),
        key_secret: b"bench".to_vec(),
        ..RedisStoreConfig::default()
    })
    .await?;
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
    println!(
        "callers={callers} decisions={n} errors={} seconds={secs:.2} per_second={:.0} calls={}",
        errors.load(Ordering::Relaxed),
        n as f64 / secs,
        store.stats().calls
    );
    Ok(())
}
