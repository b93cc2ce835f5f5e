//! Against a three-master Redis Cluster: every policy kind works, keys
//! spread over all masters, concurrent decisions of many keys are batched
//! per slot (no CROSSSLOT), and a node that lost the functions gets them
//! again.

#[path = "../src/testing.rs"]
mod testing;

use std::time::Duration;

use paceline_core::{Nanos, Plan, Policy, Store};
use paceline_redis::{RedisStore, RedisStoreConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_counts_every_key_in_its_slot() {
    let cluster = testing::RedisCluster::start();
    let store = RedisStore::connect(RedisStoreConfig {
        urls: cluster.urls(),
        cluster: true,
        deadline: Duration::from_secs(1),
        key_secret: b"test".to_vec(),
        ..RedisStoreConfig::default()
    })
    .await
    .unwrap();
    let plan = Plan::new(
        "mixed",
        vec![
            Policy::token_bucket("burst", 5, 3_600).unwrap(),
            Policy::daily("daily", 100).unwrap(),
            Policy::sliding_log("log", 50, 60).unwrap(),
            Policy::sliding_counter("counter", 50, 60).unwrap(),
            Policy::concurrency("inflight", 50).unwrap(),
        ],
    )
    .unwrap();
    // 60 keys, 8 tries each, all at once: 5 admitted per key
    let mut tasks = Vec::new();
    for k in 0..60 {
        for _ in 0..8 {
            let (s, plan) = (store.clone(), plan.clone());
            tasks.push(tokio::spawn(async move {
                (k, s.check(&plan, &format!("k:{k}"), 1, Nanos::ZERO).await)
            }));
        }
    }
    let mut admitted = [0u32; 60];
    for t in tasks {
        let (k, r) = t.await.unwrap();
        let d = r.unwrap_or_else(|e| panic!("key {k}: {e}"));
        admitted[k] += u32::from(d.is_allowed());
    }
    assert!(admitted.iter().all(|&n| n == 5), "{admitted:?}");
    let st = store.stats();
    assert!(st.calls < 480, "{st:?}: no batching");
    // rows landed on every master
    for n in &cluster.nodes {
        let keys = n.cli("DBSIZE");
        assert!(!keys.starts_with(":0"), "a master holds no row: {keys}");
    }
    // a master that lost the library gets it back on its next call
    for n in &cluster.nodes {
        assert!(n.cli("FUNCTION FLUSH").starts_with("+OK"));
    }
    let d = store.check(&plan, "k:fresh", 1, Nanos::ZERO).await.unwrap();
    assert!(d.is_allowed());
    let leases = store.release(&plan, "k:fresh", 1, Nanos::ZERO).await;
    assert!(leases.is_ok());
}

/// Slots move from one master to another while decisions run: none is
/// lost (every call answers) and every key's count stays exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resharding_loses_no_decision() {
    let cluster = testing::RedisCluster::start();
    let store = RedisStore::connect(RedisStoreConfig {
        urls: cluster.urls(),
        cluster: true,
        deadline: Duration::from_secs(2),
        key_secret: b"test".to_vec(),
        ..RedisStoreConfig::default()
    })
    .await
    .unwrap();
    let plan = Plan::new(
        "q",
        vec![Policy::fixed_window("day", 1_000_000, 86_400).unwrap()],
    )
    .unwrap();
    let node = |i: usize| {
        let out = cluster.nodes[i].cli("CLUSTER MYID");
        out.lines().nth(1).unwrap_or("").trim().to_string()
    };
    let (from, to) = (node(0), node(1));
    let addr = format!("127.0.0.1:{}", cluster.nodes[0].port());
    let reshard = std::thread::spawn(move || {
        std::process::Command::new("redis-cli")
            .args(["--cluster", "reshard", &addr])
            .args(["--cluster-from", &from, "--cluster-to", &to])
            .args(["--cluster-slots", "300", "--cluster-yes"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap()
    });
    let keys = 400usize;
    let mut counted = vec![0u64; keys];
    let mut errors = Vec::new();
    let mut rounds = 0;
    while !reshard.is_finished() || rounds < 3 {
        let mut tasks = Vec::new();
        for k in 0..keys {
            let (s, plan) = (store.clone(), plan.clone());
            tasks.push(tokio::spawn(async move {
                (k, s.check(&plan, &format!("k:{k}"), 1, Nanos::ZERO).await)
            }));
        }
        for t in tasks {
            match t.await.unwrap() {
                (k, Ok(d)) if d.is_allowed() => counted[k] += 1,
                (k, Ok(d)) => errors.push(format!("key {k} denied: {d:?}")),
                (k, Err(e)) => errors.push(format!("key {k}: {e}")),
            }
        }
        rounds += 1;
        assert!(rounds < 2_000, "the resharding did not finish");
    }
    assert!(
        reshard.join().unwrap().success(),
        "redis-cli --cluster reshard failed"
    );
    assert!(
        errors.is_empty(),
        "{} lost: {:?}",
        errors.len(),
        &errors[..errors.len().min(5)]
    );
    // every admitted decision was counted once, wherever its slot went
    for (k, n) in counted.iter().enumerate() {
        let d = store
            .check(&plan, &format!("k:{k}"), 0, Nanos::ZERO)
            .await
            .unwrap();
        assert_eq!(d.statuses[0].remaining, 1_000_000 - n, "key {k}");
    }
    println!("{rounds} rounds of {keys} decisions while 300 slots moved");
}

/// A group whose rows share a slot (one client key under several plans:
/// the key is the hash tag) is one atomic call; a group across slots is
/// decided item by item, and a refusal still keeps nothing of its
/// charges once answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_in_one_slot_is_one_call_and_across_slots_charges_nothing() {
    use paceline_core::{Cost, GroupItem};
    let cluster = testing::RedisCluster::start();
    let store = RedisStore::connect(RedisStoreConfig {
        urls: cluster.urls(),
        cluster: true,
        deadline: Duration::from_secs(1),
        key_secret: b"test".to_vec(),
        deny_cache: 0,
        ..RedisStoreConfig::default()
    })
    .await
    .unwrap();
    let daily = |name: &str, q| Plan::new(name, vec![Policy::daily(name, q).unwrap()]).unwrap();
    let (wide, narrow) = (daily("wide", 50), daily("narrow", 1));
    store.check(&wide, "k:warm", 1, Nanos::ZERO).await.unwrap();
    let c = Cost::requests(1);
    let left = |key: &'static str| {
        let (s, p) = (store.clone(), wide.clone());
        async move {
            let d = s.check(&p, key, 0, Nanos::ZERO).await.unwrap();
            d.statuses[0].remaining
        }
    };
    let same = [
        GroupItem::new(&wide, "k:a", c),
        GroupItem::new(&narrow, "k:a", c),
    ];
    let calls = store.stats().calls;
    assert!(store
        .check_all(&same, Nanos::ZERO)
        .await
        .unwrap()
        .is_admitted());
    let g = store.check_all(&same, Nanos::ZERO).await.unwrap();
    assert_eq!(g.refused(), Some(1));
    assert_eq!(store.stats().calls, calls + 2, "one call per group");
    assert_eq!(left("k:a").await, 49);
    let across = [
        GroupItem::new(&wide, "k:b", c),
        GroupItem::new(&narrow, "k:c", c),
    ];
    assert!(store
        .check_all(&across, Nanos::ZERO)
        .await
        .unwrap()
        .is_admitted());
    let g = store.check_all(&across, Nanos::ZERO).await.unwrap();
    assert_eq!(g.refused(), Some(1));
    assert_eq!(left("k:b").await, 49);
}
