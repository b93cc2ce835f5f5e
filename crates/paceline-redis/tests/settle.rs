//! Settling on the server's clock: a debt is refused for as long as it
//! says, settles racing on one key all land, and a seeded run decides as
//! the memory store does on virtual time. (The differential test compares
//! every field, waits too, on the caller's clock.)

#[path = "../src/testing.rs"]
mod testing;

use std::time::Duration;

use paceline_core::{policy::MAX_WINDOW_SECS, Cost, Nanos, Plan, Policy, Store};
use paceline_redis::{RedisStore, RedisStoreConfig};

fn config(url: String) -> RedisStoreConfig {
    RedisStoreConfig {
        urls: vec![url],
        deadline: Duration::from_secs(2),
        deny_cache: 0,
        key_secret: b"test".to_vec(),
        ..RedisStoreConfig::default()
    }
}

fn c(n: u64) -> Cost {
    Cost::requests(n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debt_on_the_server_clock_is_refused_for_as_long_as_it_says() {
    let server = testing::RedisServer::start();
    let s = RedisStore::connect(config(server.url())).await.unwrap();
    // 10 an hour: one unit every 360 s
    let plan = Plan::new("p", vec![Policy::token_bucket("tb", 10, 3_600).unwrap()]).unwrap();
    // the caller's instants are ignored on the server's clock
    let t = Nanos::ZERO;
    assert!(s
        .check_cost(&plan, "k", c(4), t)
        .await
        .unwrap()
        .is_allowed());
    // the answer cost 16: 6 past a full bucket
    s.settle(&plan, "k", c(4), c(16), t, t).await.unwrap();
    let d = s.check_cost(&plan, "k", c(2), t).await.unwrap();
    let wait = d.denial().expect("refused while in debt").retry_after;
    // 16 + 2 units of 360 s, less the hour of burst: 2,880 s, less the
    // moment between the calls
    let exact = Nanos::from_secs(2_880);
    assert!(wait <= exact, "{wait:?}");
    assert!(wait > exact.saturating_sub(Nanos::from_secs(1)), "{wait:?}");
    assert_eq!(d.statuses[0].remaining, 0);
    // an answer that cost less than its estimate gives the rest back
    let k2 = "k2";
    assert!(s
        .check_cost(&plan, k2, c(10), t)
        .await
        .unwrap()
        .is_allowed());
    s.settle(&plan, k2, c(10), c(3), t, t).await.unwrap();
    let d = s.check_cost(&plan, k2, c(0), t).await.unwrap();
    assert_eq!(d.statuses[0].remaining, 7);
    // a hostile actual cost owes at most one full burst
    s.settle(&plan, "k3", c(0), c(u64::MAX), t, t)
        .await
        .unwrap();
    let d = s.check_cost(&plan, "k3", c(1), t).await.unwrap();
    let wait = d.denial().expect("in debt").retry_after;
    assert!(wait <= Nanos::from_secs(3_600 + 360), "{wait:?}");
    assert!(wait > Nanos::from_secs(3_600 + 359), "{wait:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_settles_on_one_key_all_land() {
    let server = testing::RedisServer::start();
    let s = RedisStore::connect(config(server.url())).await.unwrap();
    let q = 1_000_000;
    let plans = [
        // a row of doubles (the flat path)
        Plan::new(
            "flat",
            vec![Policy::fixed_window("fw", q, 30 * 86_400).unwrap()],
        )
        .unwrap(),
        // a decoded row (a window past 104 days), two policies
        Plan::new(
            "rows",
            vec![
                Policy::fixed_window("fw", q, MAX_WINDOW_SECS).unwrap(),
                Policy::sliding_counter("sc", q, 600).unwrap(),
            ],
        )
        .unwrap(),
    ];
    for plan in plans {
        let tasks: Vec<_> = (0..4u64)
            .map(|t| {
                let (s, plan) = (s.clone(), plan.clone());
                tokio::spawn(async move {
                    let mut spent = 0;
                    for i in 0..100u64 {
                        let est = 1 + (i + t) % 7;
                        let actual = (i * 13 + t * 5) % 11;
                        let d = s.check_cost(&plan, "k", c(est), Nanos::ZERO).await.unwrap();
                        assert!(d.is_allowed());
                        s.settle(&plan, "k", c(est), c(actual), Nanos::ZERO, Nanos::ZERO)
                            .await
                            .unwrap();
                        spent += actual;
                    }
                    spent
                })
            })
            .collect();
        let mut spent = 0;
        for t in tasks {
            spent += t.await.unwrap();
        }
        let d = s.check_cost(&plan, "k", c(0), Nanos::ZERO).await.unwrap();
        assert_eq!(d.statuses[0].remaining, q - spent, "{}", plan.name());
    }
}

/// The differential on the server's clock: a seeded random run of checks
/// (estimates, some too big to ever fit) and settles (actual costs below,
/// at and far above the estimates) on a few keys, the memory store at one
/// virtual instant and Redis on its own clock, compared step by step:
/// the same outcome and the same counts left. The windows are an hour
/// and longer and every cost a whole number of emission intervals, so the
/// milliseconds the server's clock moves during the run change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_on_its_own_clock_settles_as_memory_does() {
    use paceline_core::{MemoryStore, Outcome};
    let server = testing::RedisServer::start();
    let s = RedisStore::connect(config(server.url())).await.unwrap();
    let plans = [
        Plan::new("tb", vec![Policy::token_bucket("tb", 10, 3_600).unwrap()]).unwrap(),
        Plan::new(
            "mixed",
            vec![
                Policy::token_bucket("tb", 20, 7_200).unwrap(),
                Policy::fixed_window("month", 40, 30 * 86_400).unwrap(),
            ],
        )
        .unwrap(),
        Plan::new("log", vec![Policy::sliding_log("log", 10, 3_600).unwrap()]).unwrap(),
        Plan::new(
            "decade",
            vec![Policy::fixed_window("fw", 25, MAX_WINDOW_SECS).unwrap()],
        )
        .unwrap(),
    ];
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let now = Nanos::from_secs(1_790_000_000);
    for plan in &plans {
        let memory = MemoryStore::new();
        let mut open: Vec<(String, u64)> = Vec::new();
        for step in 0..300 {
            let key = format!("k:{}:{}", plan.name(), next(3));
            if next(3) > 0 || open.is_empty() {
                let est = match next(10) {
                    0 => 11 + next(20),
                    _ => next(6),
                };
                let m = memory.check_sync(plan, &key, c(est), now).unwrap();
                let r = s.check_cost(plan, &key, c(est), now).await.unwrap();
                let kind = |o: &Outcome| std::mem::discriminant(o);
                assert_eq!(
                    kind(&r.outcome),
                    kind(&m.outcome),
                    "step {step}: {r:?} {m:?}"
                );
                let left = |d: &paceline_core::Decision| -> Vec<u64> {
                    d.statuses.iter().map(|s| s.remaining).collect()
                };
                assert_eq!(left(&r), left(&m), "step {step}: {r:?} {m:?}");
                if m.is_allowed() {
                    open.push((key, est));
                }
            } else {
                let (key, est) = open.remove(next(open.len() as u64) as usize);
                let actual = match next(10) {
                    0 => u64::MAX,
                    1..=3 => next(40),
                    _ => next(est + 1),
                };
                memory
                    .settle_sync(plan, &key, c(est), c(actual), now, now)
                    .unwrap();
                s.settle(plan, &key, c(est), c(actual), now, now)
                    .await
                    .unwrap();
            }
        }
    }
}
