//! The store's metrics, read from a recorder of the test's own: decisions
//! move the call latency and batch size histograms, a key over its limit
//! moves the deny-cache hits, a Redis killed moves the errors and (with a
//! degraded limiter) the degraded decisions and the degraded gauge, and
//! the recovery records the time spent degraded — to the sub-second, not
//! rounded down to whole seconds.
//!
//! One test in this binary: the recorder is the process's.

#[path = "../src/testing.rs"]
mod testing;

use std::time::{Duration, Instant};

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::MetricKind;
use paceline_core::{Nanos, Plan, Policy, Store};
use paceline_redis::{Degraded, RedisStore, RedisStoreConfig};

/// Every metric of the snapshot: name, labels, value.
type Seen = Vec<(String, Vec<(String, String)>, MetricKind, DebugValue)>;

fn seen(snap: metrics_util::debugging::Snapshot) -> Seen {
    snap.into_vec()
        .into_iter()
        .map(|(ck, _, _, v)| {
            let (kind, key) = ck.into_parts();
            let labels = key
                .labels()
                .map(|l| (l.key().to_string(), l.value().to_string()))
                .collect();
            (key.name().to_string(), labels, kind, v)
        })
        .collect()
}

fn counter(s: &Seen, name: &str, label: Option<(&str, &str)>) -> u64 {
    s.iter()
        .filter(|(n, ls, _, _)| {
            n == name && label.is_none_or(|(k, v)| ls.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .map(|(_, _, _, v)| match v {
            DebugValue::Counter(c) => *c,
            _ => 0,
        })
        .sum()
}

fn gauge(s: &Seen, name: &str) -> Option<f64> {
    s.iter()
        .find(|(n, ..)| n == name)
        .and_then(|(.., v)| match v {
            DebugValue::Gauge(g) => Some(g.into_inner()),
            _ => None,
        })
}

fn histogram(s: &Seen, name: &str) -> Vec<f64> {
    s.iter()
        .filter(|(n, ..)| n == name)
        .flat_map(|(.., v)| match v {
            DebugValue::Histogram(h) => h.iter().map(|x| x.into_inner()).collect(),
            _ => Vec::new(),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_of_the_issue_moves() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this binary");

    let mut server = testing::RedisServer::start();
    let s = RedisStore::connect(RedisStoreConfig {
        urls: vec![server.url()],
        deadline: Duration::from_millis(50),
        key_secret: b"test".to_vec(),
        degraded: Some(Degraded { share: 0.5 }),
        ..RedisStoreConfig::default()
    })
    .await
    .unwrap();
    let plan = Plan::new(
        "free",
        vec![Policy::token_bucket("burst", 4, 3_600).unwrap()],
    )
    .unwrap();
    let now = Nanos::from_secs(1_000);
    // decisions in Redis (the first connects and loads the functions,
    // which may outlast the deadline: then the degraded limiter answers,
    // and the warm-up goes on until Redis does)
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let before = s.stats().degraded;
        let ok = s.check(&plan, "k:warm", 0, now).await.is_ok();
        if ok && s.stats().degraded == before {
            break;
        }
        assert!(Instant::now() < until, "Redis did not answer");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // what the warm-up recorded is left out (histograms are drained by a
    // snapshot; counters are compared with these)
    let base = seen(snapshotter.snapshot());
    let degraded_before = s.stats().degraded;
    let mut allowed = 0;
    for _ in 0..8 {
        if s.check(&plan, "k:hot", 1, now).await.unwrap().is_allowed() {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 4);
    // the denials after the first were the cache's
    assert!(s.stats().cache_hits >= 3, "{:?}", s.stats());

    // Redis away: errors, and the degraded limiter decides
    server.kill();
    let away = Instant::now();
    for i in 0..5 {
        let d = s.check(&plan, &format!("k:away{i}"), 1, now).await;
        assert!(d.unwrap().is_allowed());
    }
    assert_eq!(s.stats().degraded - degraded_before, 5);
    let during = seen(snapshotter.snapshot());
    assert_eq!(gauge(&during, "paceline_redis_degraded"), Some(1.0));

    // back: the first answer from Redis ends the degraded period
    server.restart();
    let until = Instant::now() + Duration::from_secs(5);
    for n in 0.. {
        // a key each time: until Redis is probed again (a failed call
        // keeps decisions off it for a slice's time) the degraded limiter
        // answers, and one key would spend its share there
        let before = s.stats().degraded;
        let d = s.check(&plan, &format!("k:back{n}"), 1, now).await.unwrap();
        assert!(d.is_allowed());
        if s.stats().degraded == before {
            break;
        }
        assert!(Instant::now() < until, "Redis not back within 5 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let degraded_for = away.elapsed().as_secs_f64();

    let after = seen(snapshotter.snapshot());
    // histograms are drained by each snapshot: both together
    let both = |name: &str| {
        let mut v = histogram(&during, name);
        v.extend(histogram(&after, name));
        v
    };
    let calls = both("paceline_redis_call_seconds");
    assert!(!calls.is_empty(), "store latency: {after:?}");
    assert!(calls.iter().all(|&x| (0.0..5.0).contains(&x)), "{calls:?}");
    let sizes = both("paceline_redis_batch_size");
    assert!(
        !sizes.is_empty() && sizes.iter().all(|&n| n >= 1.0),
        "{sizes:?}"
    );
    // counters are totals: what they gained since the warm-up
    let gained = |name: &str, label: Option<(&str, &str)>| {
        counter(&after, name, label) - counter(&base, name, label)
    };
    assert!(gained("paceline_redis_deny_cache_hits_total", None) >= 3);
    let unavailable = gained("paceline_redis_errors_total", Some(("kind", "unavailable")));
    assert!(unavailable >= 1, "{after:?}");
    assert!(gained("paceline_redis_degraded_decisions_total", None) >= 5);
    assert_eq!(gauge(&after, "paceline_redis_degraded"), Some(0.0));
    // one degraded period, as long as it was (well under a second is
    // still counted)
    let periods = both("paceline_redis_degraded_seconds");
    assert_eq!(periods.len(), 1, "{periods:?}");
    assert!(
        periods[0] > 0.0 && periods[0] <= degraded_for + 0.001,
        "{periods:?} vs {degraded_for}"
    );
}
