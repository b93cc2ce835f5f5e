//! Refunds, settles and releases go back to the side that charged: a
//! charge made in Redis does not credit the degraded local limiter (which
//! never took it), and a charge or lease the degraded limiter made does
//! not credit Redis.
//! Against a redis-server of its own, killed and restarted.

#[path = "../src/testing.rs"]
mod testing;

use std::time::{Duration, Instant};

use paceline_core::{Cost, FailMode, Nanos, Plan, Policy, Store, StoreError};
use paceline_redis::{Degraded, RedisStore, RedisStoreConfig};

const T0: u64 = 1_790_000_000;

fn at(ms: u64) -> Nanos {
    Nanos::from_secs(T0).saturating_add(Nanos::from_millis(ms))
}

async fn store(url: String) -> RedisStore {
    RedisStore::connect(RedisStoreConfig {
        urls: vec![url],
        // Redis is killed, not stopped, so an outage fails at once; the
        // deadline only has to hold a slow answer on a busy machine, lest
        // a decision meant for Redis fall to the degraded limiter
        deadline: Duration::from_millis(500),
        key_secret: b"test".to_vec(),
        // every decision asks Redis: a cached denial would hide a credit
        deny_cache: 0,
        degraded: Some(Degraded { share: 0.5 }),
        ..RedisStoreConfig::default()
    })
    .await
    .unwrap()
}

/// Waits (at most 5 s) until Redis answers a decision on another key.
async fn reachable(s: &RedisStore, plan: &Plan) {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let before = s.stats().degraded;
        let ok = s.check(plan, "k:probe", 0, at(0)).await.is_ok();
        if ok && s.stats().degraded == before {
            return;
        }
        assert!(Instant::now() < until, "Redis did not answer within 5 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn burst(q: u64) -> Plan {
    Plan::new(
        "free",
        vec![Policy::token_bucket("burst", q, 3_600).unwrap()],
    )
    .unwrap()
}

async fn allowed(s: &RedisStore, plan: &Plan, key: &str, now: Nanos) -> bool {
    s.check(plan, key, 1, now).await.unwrap().is_allowed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_goes_back_only_to_the_side_that_charged() {
    let mut server = testing::RedisServer::start();
    let s = store(server.url()).await;
    // burst 4 in Redis; 2 for the degraded limiter (share 0.5)
    let plan = burst(4);
    reachable(&s, &plan).await;
    let one = Cost::requests(1);

    // charged in Redis at 1 ms
    let before = s.stats().degraded;
    assert!(allowed(&s, &plan, "k:a", at(1)).await);
    server.kill();
    // the degraded limiter's own two, at 2 ms, then it is empty
    assert!(allowed(&s, &plan, "k:a", at(2)).await);
    assert!(allowed(&s, &plan, "k:a", at(2)).await);
    assert!(!allowed(&s, &plan, "k:a", at(2)).await);
    assert_eq!(s.stats().degraded - before, 3);

    // the Redis charge's refund: Redis cannot take it now, and the
    // degraded bucket, which never had it, is not credited
    let r = s.refund(&plan, "k:a", one, at(1), at(3)).await;
    assert!(matches!(r, Err(StoreError::Unavailable(_))), "{r:?}");
    assert!(
        !allowed(&s, &plan, "k:a", at(3)).await,
        "the degraded bucket was credited a charge it never took"
    );

    // a degraded charge's refund goes back there, and needs no Redis
    s.refund(&plan, "k:a", one, at(2), at(4)).await.unwrap();
    assert!(
        allowed(&s, &plan, "k:a", at(4)).await,
        "its own charge back"
    );

    // Redis back, empty (nothing was saved): fill the burst there
    server.restart();
    reachable(&s, &plan).await;
    for _ in 0..4 {
        assert!(allowed(&s, &plan, "k:a", at(10)).await);
    }
    assert!(!allowed(&s, &plan, "k:a", at(10)).await);
    // the other degraded charge's refund, now: Redis never took it, so
    // Redis's bucket is not credited
    s.refund(&plan, "k:a", one, at(2), at(11)).await.unwrap();
    assert!(
        !allowed(&s, &plan, "k:a", at(11)).await,
        "Redis was credited a charge the degraded limiter made"
    );
    // while a Redis charge's refund still credits Redis
    s.refund(&plan, "k:a", one, at(10), at(12)).await.unwrap();
    assert!(allowed(&s, &plan, "k:a", at(12)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_degraded_lease_is_released_locally_not_in_redis() {
    let mut server = testing::RedisServer::start();
    let s = store(server.url()).await;
    let plan = Plan::new(
        "c",
        vec![Policy::concurrency("inflight", 4)
            .unwrap()
            .with_fail_mode(FailMode::Open)],
    )
    .unwrap();
    reachable(&s, &plan).await;
    server.kill();
    // the degraded limiter's cap is 2
    assert!(allowed(&s, &plan, "k:c", at(1)).await);
    assert!(allowed(&s, &plan, "k:c", at(1)).await);
    assert!(!allowed(&s, &plan, "k:c", at(1)).await);
    // Redis back, empty: four leases there fill the cap
    server.restart();
    reachable(&s, &plan).await;
    for _ in 0..4 {
        assert!(allowed(&s, &plan, "k:c", at(2)).await);
    }
    assert!(!allowed(&s, &plan, "k:c", at(2)).await);
    // the degraded requests end: their leases go back to the degraded
    // limiter; Redis's four are still out
    s.release(&plan, "k:c", 1, at(3)).await.unwrap();
    s.release(&plan, "k:c", 1, at(3)).await.unwrap();
    assert!(
        !allowed(&s, &plan, "k:c", at(3)).await,
        "Redis gave back a lease the degraded limiter had taken"
    );
    // one of Redis's ends: that one goes to Redis
    s.release(&plan, "k:c", 1, at(4)).await.unwrap();
    assert!(allowed(&s, &plan, "k:c", at(4)).await);
    // and the degraded limiter has its two places again
    server.kill();
    assert!(allowed(&s, &plan, "k:c", at(5)).await);
    assert!(allowed(&s, &plan, "k:c", at(5)).await);
    assert!(!allowed(&s, &plan, "k:c", at(5)).await);
}

/// Redis away, a group of fail-open plans is decided by the degraded
/// limiter, all or nothing as in Redis; a group with a fail-closed plan is
/// an error (its 503 stands).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_degraded_group_is_all_or_nothing() {
    use paceline_core::GroupItem;
    let mut server = testing::RedisServer::start();
    let s = store(server.url()).await;
    let open = |name: &str, q: u64| {
        Plan::new(
            name,
            vec![Policy::token_bucket(name, q, 3_600)
                .unwrap()
                .with_fail_mode(FailMode::Open)],
        )
        .unwrap()
    };
    let (wide, narrow) = (open("wide", 20), open("narrow", 2));
    reachable(&s, &wide).await;
    server.kill();
    let c = Cost::requests(1);
    let group = [
        GroupItem::new(&wide, "k:g", c),
        GroupItem::new(&narrow, "k:g", c),
    ];
    // half of each quota: the narrow bucket holds 1
    let g = s.check_all(&group, at(1)).await.unwrap();
    assert!(g.is_admitted(), "{g:?}");
    let g = s.check_all(&group, at(2)).await.unwrap();
    assert_eq!(g.refused(), Some(1), "{g:?}");
    let wide_left = g.decisions[0].as_ref().unwrap().statuses[0].remaining;
    assert_eq!(wide_left, 9, "the refusal charged the wide bucket nothing");
    assert!(s.stats().degraded >= 4);
    let closed = Plan::new(
        "closed",
        vec![Policy::token_bucket("closed", 5, 3_600)
            .unwrap()
            .with_fail_mode(FailMode::Closed)],
    )
    .unwrap();
    let mixed = [
        GroupItem::new(&wide, "k:g", c),
        GroupItem::new(&closed, "k:g", c),
    ];
    let r = s.check_all(&mixed, at(3)).await;
    assert!(matches!(r, Err(StoreError::Unavailable(_))), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_goes_only_to_the_side_that_charged() {
    let mut server = testing::RedisServer::start();
    let s = store(server.url()).await;
    // burst 4 an hour in Redis; 2 for the degraded limiter (share 0.5)
    let plan = burst(4);
    reachable(&s, &plan).await;
    let c = Cost::requests;

    // charged in Redis at 1 ms, then the degraded limiter's first at 2 ms
    assert!(allowed(&s, &plan, "k:s", at(1)).await);
    server.kill();
    assert!(allowed(&s, &plan, "k:s", at(2)).await);

    // the Redis charge's settle: Redis cannot take it now, and the
    // degraded bucket, which never had it, is not charged the difference
    let r = s.settle(&plan, "k:s", c(1), c(3), at(1), at(3)).await;
    assert!(matches!(r, Err(StoreError::Unavailable(_))), "{r:?}");
    assert!(allowed(&s, &plan, "k:s", at(3)).await, "charged for Redis");

    // a degraded charge settled below its estimate gives back there
    s.settle(&plan, "k:s", c(1), c(0), at(3), at(4))
        .await
        .unwrap();
    assert!(
        allowed(&s, &plan, "k:s", at(4)).await,
        "its own charge back"
    );

    // and one settled above it charges there, into debt: 2 units used,
    // 4 more owed, capped at one full burst (2 units of 1,800 s)
    s.settle(&plan, "k:s", c(1), c(5), at(2), at(5))
        .await
        .unwrap();
    let d = s.check(&plan, "k:s", 1, at(5)).await.unwrap();
    let wait = d.denial().expect("in debt").retry_after;
    assert_eq!(wait, Nanos::from_secs(5_400), "{d:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_hung_exact_decisions_wait_out_the_deadline_once_not_each() {
    let server = testing::RedisServer::start();
    let s = RedisStore::connect(RedisStoreConfig {
        urls: vec![server.url()],
        deadline: Duration::from_millis(300),
        key_secret: b"test".to_vec(),
        degraded: Some(Degraded { share: 0.5 }),
        ..RedisStoreConfig::default()
    })
    .await
    .unwrap();
    let plan = burst(1_000);
    reachable(&s, &plan).await;
    server.pause();
    let t = Instant::now();
    for i in 0..20 {
        assert!(allowed(&s, &plan, &format!("k:{i}"), at(1)).await);
    }
    let took = t.elapsed();
    server.resume();
    // the first decision waits out the deadline; the rest are answered by
    // the degraded limiter at once, but for a probe each 100 ms (the slice
    // time), which waits too: 20 deadlines without the breaker
    assert!(took < Duration::from_millis(1_500), "{took:?}");
    assert_eq!(s.stats().degraded, 20);
    // back: decided by Redis again
    reachable(&s, &plan).await;
}
