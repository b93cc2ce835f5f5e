//! Group checks against a real redis-server: one call for the whole group,
//! all or nothing on the server's clock, a refusal from the deny cache
//! with no call, and a row the group names twice.

#[path = "../src/testing.rs"]
mod testing;

use std::time::{Duration, Instant};

use paceline_core::{Cost, GroupItem, Nanos, Plan, Policy, Store};
use paceline_redis::{RedisStore, RedisStoreConfig};

fn daily(name: &str, q: u64) -> Plan {
    Plan::new(name, vec![Policy::daily(name, q).unwrap()]).unwrap()
}

async fn store(url: String, deny_cache: usize) -> RedisStore {
    let s = RedisStore::connect(RedisStoreConfig {
        urls: vec![url],
        deadline: Duration::from_millis(200),
        key_secret: b"test".to_vec(),
        deny_cache,
        ..RedisStoreConfig::default()
    })
    .await
    .unwrap();
    // the first call connects and loads the library: up to two seconds
    let warm = daily("warm", 1_000);
    let until = Instant::now() + Duration::from_secs(2);
    while s.check(&warm, "k:warm", 1, Nanos::ZERO).await.is_err() {
        assert!(Instant::now() < until, "Redis did not answer within 2 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    s
}

fn one<'a>(plan: &'a Plan, key: &'a str) -> GroupItem<'a> {
    GroupItem::new(plan, key, Cost::requests(1))
}

async fn remaining(s: &RedisStore, plan: &Plan, key: &str) -> u64 {
    let d = s.check(plan, key, 0, Nanos::ZERO).await.unwrap();
    d.statuses[0].remaining
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_whose_second_limit_is_spent_charges_nothing_on_the_first() {
    let server = testing::RedisServer::start();
    let s = store(server.url(), 0).await;
    let (wide, narrow) = (daily("wide", 50), daily("narrow", 1));
    let group = [one(&wide, "k:a"), one(&narrow, "k:b")];
    let calls = s.stats().calls;
    let g = s.check_all(&group, Nanos::ZERO).await.unwrap();
    assert!(g.is_admitted(), "{g:?}");
    assert_eq!(s.stats().calls, calls + 1, "one call for the group");
    for _ in 0..5 {
        let g = s.check_all(&group, Nanos::ZERO).await.unwrap();
        assert!(!g.is_admitted());
        assert_eq!(g.refused(), Some(1));
        assert!(g.retry_after().is_some());
        // the first item's answer: its standing without the group's charge
        let first = g.decisions[0].as_ref().unwrap();
        assert!(first.is_allowed());
        assert_eq!(first.statuses[0].remaining, 49);
    }
    assert_eq!(s.stats().calls, calls + 6);
    assert_eq!(
        remaining(&s, &wide, "k:a").await,
        49,
        "the refusals charged nothing"
    );
    assert_eq!(remaining(&s, &narrow, "k:b").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_named_twice_is_charged_twice_or_not_at_all() {
    let server = testing::RedisServer::start();
    let s = store(server.url(), 1_000).await;
    let (wide, pair) = (daily("wide", 50), daily("pair", 3));
    let twice = [one(&pair, "k:p"), one(&wide, "k:w"), one(&pair, "k:p")];
    let g = s.check_all(&twice, Nanos::ZERO).await.unwrap();
    assert!(g.is_admitted());
    assert_eq!(g.decisions[2].as_ref().unwrap().statuses[0].remaining, 1);
    // one unit left, two asked: refused by the second, nothing charged
    let g = s.check_all(&twice, Nanos::ZERO).await.unwrap();
    assert_eq!(g.refused(), Some(2), "{g:?}");
    assert_eq!(remaining(&s, &pair, "k:p").await, 1);
    assert_eq!(remaining(&s, &wide, "k:w").await, 49);
    // that refusal is not kept in the deny cache: one unit still fits
    let d = s.check(&pair, "k:p", 1, Nanos::ZERO).await.unwrap();
    assert!(d.is_allowed(), "{d:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_the_deny_cache_refuses_makes_no_call() {
    let server = testing::RedisServer::start();
    let s = store(server.url(), 1_000).await;
    let (wide, narrow) = (daily("wide", 50), daily("narrow", 1));
    let group = [one(&wide, "k:a"), one(&narrow, "k:b")];
    assert!(s
        .check_all(&group, Nanos::ZERO)
        .await
        .unwrap()
        .is_admitted());
    // Redis refuses the group once; the denial is kept
    let g = s.check_all(&group, Nanos::ZERO).await.unwrap();
    assert_eq!(g.refused(), Some(1));
    let (calls, hits) = (s.stats().calls, s.stats().cache_hits);
    for _ in 0..10 {
        let g = s.check_all(&group, Nanos::ZERO).await.unwrap();
        assert_eq!(g.refused(), Some(1));
        assert!(g.decisions[0].is_none(), "the first item is not asked");
    }
    assert_eq!(s.stats().calls, calls, "no call");
    assert_eq!(s.stats().cache_hits, hits + 10);
    assert_eq!(remaining(&s, &wide, "k:a").await, 49);
}
