//! Decisions per second on one hot key through several instances of the
//! Redis store on one Redis: each instance a store of its own (its own
//! connections, batcher and slices), the callers spread over them, each
//! decision asked as the limit layer asks it (the store's local answer
//! first, Redis only when that has none). The plan is one token bucket far
//! above what the machine can reach, so every decision is an admission:
//! `exact` counts each one in Redis, `leased` takes slices of at most
//! `MAX_SLICE` (default 1,000).
//!
//! ```text
//! cargo run --release -p paceline-redis --example bench-hot-key -- \
//!     redis://127.0.0.1:6379 exact|leased CALLERS SECONDS [INSTANCES]
//! ```
//!
//! Prints one line: `mode=M instances=I callers=N decisions=D errors=E
//! seconds=S per_second=R calls=C calls_per_1000=K local=L` (C: calls to
//! Redis; K: calls per 1,000 decisions; L: decisions answered from a
//! slice).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use paceline_core::{Clock, Cost, Nanos, Plan, Policy, Share, Store, SystemClock};
use paceline_redis::{RedisStore, RedisStoreConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(bench())
}

async fn bench() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let url = args
        .get(1)
        .cloned()
        .unwrap_or("redis://127.0.0.1:6379".into());
    let mode = args.get(2).cloned().unwrap_or("leased".into());
    let callers: usize = args.get(3).map_or(Ok(50), |s| s.parse())?;
    let seconds: f64 = args.get(4).map_or(Ok(5.0), |s| s.parse())?;
    let instances: usize = args.get(5).map_or(Ok(3), |s| s.parse())?;
    let max_slice: u64 = std::env::var("MAX_SLICE").map_or(Ok(1_000), |s| s.parse())?;
    let share = match mode.as_str() {
        "exact" => Share::Exact,
        "leased" => Share::Leased { max_slice },
        other => return Err(format!("{other:?}: exact or leased").into()),
    };
    let mut stores = Vec::new();
    for _ in 0..instances.max(1) {
        let config = RedisStoreConfig {
            urls: vec![url.clone()],
            deadline: Duration::from_millis(500),
            key_secret: b"bench".to_vec(),
            ..RedisStoreConfig::default()
        };
        stores.push(RedisStore::connect(config).await?);
    }
    let clock = SystemClock::new();
    let plan = Arc::new(Plan::new(
        "hot",
        vec![Policy::token_bucket("rps", 100_000_000, 1)?.with_share(share)],
    )?);
    // the first calls connect and load the functions: not measured
    for s in &stores {
        let until = Instant::now() + Duration::from_secs(10);
        while let Err(e) = s
            .check_cost(&plan, "warm", Cost::requests(1), clock.now())
            .await
        {
            if Instant::now() > until {
                return Err(format!("Redis did not answer for 10 s: {e:?}").into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let before: Vec<_> = stores.iter().map(|s| s.stats()).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..callers {
        let store = stores[c % stores.len()].clone();
        let (plan, stop, done, errors, clock) = (
            plan.clone(),
            stop.clone(),
            done.clone(),
            errors.clone(),
            clock.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let cost = Cost::requests(1);
            while !stop.load(Ordering::Relaxed) {
                let now: Nanos = clock.now();
                let r = match store.check_local(&plan, "hot", cost, now) {
                    Some(r) => {
                        // a local answer: let the others run
                        tokio::task::yield_now().await;
                        r
                    }
                    None => store.check_cost(&plan, "hot", cost, now).await,
                };
                match r {
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
    let (mut calls, mut local) = (0, 0);
    for (s, b) in stores.iter().zip(&before) {
        let a = s.stats();
        calls += a.calls - b.calls;
        local += a.leased - b.leased;
    }
    println!(
        "mode={mode} instances={} callers={callers} decisions={n} errors={} seconds={secs:.2} per_second={:.0} calls={calls} calls_per_1000={:.2} local={local}",
        stores.len(),
        errors.load(Ordering::Relaxed),
        n as f64 / secs,
        calls as f64 * 1000.0 / n.max(1) as f64,
    );
    Ok(())
}
