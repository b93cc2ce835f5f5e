//! The store against a real redis-server: the server's clock, both ways of
//! invoking the Lua and their reloads, the deadline, a server killed and
//! restarted, bounded queues, batching, the deny cache, the degraded local
//! limiter, and several instances sharing one count.

#[path = "../src/testing.rs"]
mod testing;

use std::sync::Arc;
use std::time::{Duration, Instant};

use paceline_core::{FailMode, Nanos, Plan, Policy, Store, StoreError};
use paceline_redis::{ClockSource, Degraded, RedisStore, RedisStoreConfig, Scripting};

fn burst(q: u64, w: u64) -> Plan {
    Plan::new("free", vec![Policy::token_bucket("burst", q, w).unwrap()]).unwrap()
}

fn config(url: String) -> RedisStoreConfig {
    RedisStoreConfig {
        urls: vec![url],
        deadline: Duration::from_millis(200),
        key_secret: b"test".to_vec(),
        ..RedisStoreConfig::default()
    }
}

async fn store(c: RedisStoreConfig) -> RedisStore {
    RedisStore::connect(c).await.unwrap()
}

/// The first call connects and loads the functions, which may outlast a
/// short deadline: try again for up to two seconds.
async fn warm(s: &RedisStore, plan: &Plan) {
    let until = Instant::now() + Duration::from_secs(2);
    while s.check(plan, "k:warm", 1, Nanos::ZERO).await.is_err() {
        assert!(Instant::now() < until, "Redis did not answer within 2 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn admitted(s: &RedisStore, plan: &Plan, key: &str, n: usize) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        if s.check(plan, key, 1, Nanos::ZERO)
            .await
            .unwrap()
            .is_allowed()
        {
            ok += 1;
        }
    }
    ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_clock_decides() {
    let server = testing::RedisServer::start();
    let s = store(config(server.url())).await;
    // the caller's instant is ignored: zero here, and still a fresh burst
    let plan = burst(20, 3_600);
    assert_eq!(admitted(&s, &plan, "k:a", 25).await, 20);
    let d = s.check(&plan, "k:b", 1, Nanos::ZERO).await.unwrap();
    assert_eq!(d.statuses[0].remaining, 19);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn functions_are_reloaded_when_the_server_lost_them() {
    let server = testing::RedisServer::start();
    let s = store(RedisStoreConfig {
        scripting: Scripting::Functions,
        ..config(server.url())
    })
    .await;
    let plan = burst(5, 3_600);
    assert_eq!(admitted(&s, &plan, "k:a", 2).await, 2);
    assert!(server.cli("FUNCTION LIST").contains("paceline_v8"));
    assert!(server.cli("FUNCTION FLUSH").starts_with("+OK"));
    assert!(!server.cli("FUNCTION LIST").contains("paceline_v8"));
    // loaded again on the next call, and the count went on
    assert_eq!(admitted(&s, &plan, "k:a", 5).await, 3);
    assert!(server.cli("FUNCTION LIST").contains("paceline_v8"));
}

/// The library is on the server once the store has connected, so the
/// first requests of a start do not each wait for it to load; a server
/// that is down at start delays the start by the connect bound at most.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_library_is_loaded_at_connect() {
    let server = testing::RedisServer::start();
    let s = store(config(server.url())).await;
    assert!(server.cli("FUNCTION LIST").contains("paceline_v8"));
    assert_eq!(s.stats().calls, 0, "no decision was made");
    let down = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("redis://{}", l.local_addr().unwrap())
    };
    let t = Instant::now();
    let _lazy = store(config(down)).await;
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_are_reloaded_on_noscript() {
    let server = testing::RedisServer::start();
    let s = store(RedisStoreConfig {
        scripting: Scripting::Eval,
        ..config(server.url())
    })
    .await;
    let plan = burst(5, 3_600);
    assert_eq!(admitted(&s, &plan, "k:a", 2).await, 2);
    assert!(!server.cli("FUNCTION LIST").contains("paceline_v8"));
    assert!(server.cli("SCRIPT FLUSH").starts_with("+OK"));
    assert_eq!(admitted(&s, &plan, "k:a", 5).await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_server_fails_within_the_deadline_and_the_queue_stays_bounded() {
    let server = testing::RedisServer::start();
    let s = store(RedisStoreConfig {
        deadline: Duration::from_millis(20),
        queue: 16,
        ..config(server.url())
    })
    .await;
    let plan = burst(1_000, 1);
    warm(&s, &plan).await;
    server.pause();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..500 {
        let (s, plan) = (s.clone(), plan.clone());
        tasks.push(tokio::spawn(async move {
            let t = Instant::now();
            let r = s.check(&plan, &format!("k:{i}"), 1, Nanos::ZERO).await;
            (r, t.elapsed())
        }));
    }
    let mut full = 0;
    for t in tasks {
        let (r, took) = t.await.unwrap();
        match r {
            Err(StoreError::Unavailable(m)) => full += usize::from(m.contains("queue")),
            other => panic!("a paused server answered {other:?}"),
        }
        assert!(took < Duration::from_millis(500), "waited {took:?}");
    }
    assert!(full > 0, "500 decisions never filled a queue of 16");
    assert!(started.elapsed() < Duration::from_secs(2));
    server.resume();
    // back at once
    let until = Instant::now() + Duration::from_secs(1);
    while s.check(&plan, "k:a", 1, Nanos::ZERO).await.is_err() {
        assert!(Instant::now() < until, "not back within 1 s of resuming");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_is_used_again_within_a_second() {
    let mut server = testing::RedisServer::start();
    let s = store(RedisStoreConfig {
        deadline: Duration::from_millis(20),
        ..config(server.url())
    })
    .await;
    let plan = burst(1_000, 1);
    warm(&s, &plan).await;
    server.kill();
    for _ in 0..50 {
        let t = Instant::now();
        let r = s.check(&plan, "k:a", 1, Nanos::ZERO).await;
        assert!(matches!(r, Err(StoreError::Unavailable(_))), "{r:?}");
        assert!(
            t.elapsed() < Duration::from_millis(200),
            "{:?}",
            t.elapsed()
        );
    }
    server.restart();
    let back = Instant::now();
    loop {
        if s.check(&plan, "k:a", 1, Nanos::ZERO).await.is_ok() {
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(1),
            "not back within 1 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // the restarted server had no functions: they were loaded again
    assert!(server.cli("FUNCTION LIST").contains("paceline_v8"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_over_their_limit_are_answered_without_a_round_trip() {
    let server = testing::RedisServer::start();
    let s = store(config(server.url())).await;
    let plan = burst(3, 3_600);
    assert_eq!(admitted(&s, &plan, "k:hot", 4).await, 3);
    let before = s.stats();
    for _ in 0..100 {
        let d = s
            .check(&plan, "k:hot", 1, Nanos::from_secs(1))
            .await
            .unwrap();
        assert!(!d.is_allowed());
    }
    let after = s.stats();
    assert_eq!(after.calls, before.calls, "a cached denial made a call");
    assert_eq!(after.cache_hits - before.cache_hits, 100);
    // a read of its standing too, as the denial left it
    let d = s
        .check(&plan, "k:hot", 0, Nanos::from_secs(1))
        .await
        .unwrap();
    assert!(d.is_allowed() && d.statuses[0].remaining == 0, "{d:?}");
    assert_eq!(s.stats().calls, after.calls);
    // another key goes to Redis
    s.check(&plan, "k:cold", 1, Nanos::from_secs(1))
        .await
        .unwrap();
    assert_eq!(s.stats().calls, after.calls + 1);
}

/// The standing a peek reads (a held request's fields, a shed 503's)
/// follows this instance's answers with no round trip, and is dropped by
/// a refund, so a peek never shows a charge that was given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peek_reads_the_last_answer_and_a_refund_drops_it() {
    let server = testing::RedisServer::start();
    let s = store(config(server.url())).await;
    let plan = burst(3, 3_600);
    let t = Nanos::from_secs(1_000);
    assert!(s.peek_local(&plan, "k:held", t).is_none(), "never answered");
    assert_eq!(admitted(&s, &plan, "k:held", 2).await, 2);
    let calls = s.stats().calls;
    let d = s.peek_local(&plan, "k:held", t).unwrap();
    assert!(d.is_allowed() && d.statuses[0].remaining == 1, "{d:?}");
    assert_eq!(s.stats().calls, calls, "a peek made a call");
    s.refund(&plan, "k:held", paceline_core::Cost::requests(1), t, t)
        .await
        .unwrap();
    assert!(
        s.peek_local(&plan, "k:held", t).is_none(),
        "a peek still showed the refunded charge"
    );
    // the next answer is the standing again
    let d = s.check(&plan, "k:held", 0, t).await.unwrap();
    assert_eq!(d.statuses[0].remaining, 2, "{d:?}");
    assert_eq!(
        s.peek_local(&plan, "k:held", t).unwrap().statuses[0].remaining,
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_decisions_share_calls() {
    let server = testing::RedisServer::start();
    let s = store(RedisStoreConfig {
        max_in_flight: 2,
        ..config(server.url())
    })
    .await;
    let plan = burst(10_000, 1);
    let mut tasks = Vec::new();
    for i in 0..400 {
        let (s, plan) = (s.clone(), plan.clone());
        tasks.push(tokio::spawn(async move {
            s.check(&plan, &format!("k:{}", i % 7), 1, Nanos::ZERO)
                .await
        }));
    }
    for t in tasks {
        assert!(t.await.unwrap().unwrap().is_allowed());
    }
    let st = s.stats();
    assert_eq!(st.sent, 400);
    assert!(st.calls < 200, "{st:?}: decisions were not batched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_server_gets_few_large_calls() {
    let server = testing::RedisServer::start();
    // the defaults: 16 calls in flight at most, two connections
    let s = store(config(server.url())).await;
    let plan = burst(10_000, 1);
    warm(&s, &plan).await;
    let before = s.stats();
    let mut tasks = Vec::new();
    for i in 0..1_000 {
        let (s, plan) = (s.clone(), plan.clone());
        tasks.push(tokio::spawn(async move {
            s.check(&plan, &format!("k:{i}"), 1, Nanos::ZERO).await
        }));
    }
    for t in tasks {
        assert!(t.await.unwrap().unwrap().is_allowed());
    }
    let calls = s.stats().calls - before.calls;
    // one call per connection at a time: while two are out, the rest
    // gather, about 55 decisions a call here (17 calls; with sixteen out
    // at once they split into smaller calls: about 40). The bound leaves
    // room for a loaded machine, where the tasks queue more slowly.
    println!("{calls} calls for 1,000 decisions");
    assert!(calls <= 40, "{calls} calls for 1,000 decisions");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_caller_sends_its_own_calls() {
    let server = testing::RedisServer::start();
    let s = store(config(server.url())).await;
    let plan = burst(1_000, 1);
    warm(&s, &plan).await;
    let before = s.stats();
    assert_eq!(admitted(&s, &plan, "k:a", 50).await, 50);
    let st = s.stats();
    assert_eq!(st.calls - before.calls, 50, "{st:?}");
    assert_eq!(
        st.direct - before.direct,
        50,
        "{st:?}: a lone caller waited for the batcher"
    );
    // with a linger asked for, every decision waits to gather others
    let s = store(RedisStoreConfig {
        batch_linger: Duration::from_micros(100),
        ..config(server.url())
    })
    .await;
    warm(&s, &plan).await;
    assert_eq!(admitted(&s, &plan, "k:b", 5).await, 5);
    assert_eq!(s.stats().direct, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_library_on_the_server_is_left_alone() {
    let server = testing::RedisServer::start();
    let s = store(RedisStoreConfig {
        scripting: Scripting::Functions,
        ..config(server.url())
    })
    .await;
    // the library of an older release, answering in its own format
    let old = "#!lua name=paceline_v1\nredis.register_function('paceline_v1_run', \
               function(keys, args) return 'A 0 0 7 0 0' end)";
    let mut load = redis::cmd("FUNCTION");
    load.arg("LOAD").arg(old);
    s.command(&load).await.unwrap();
    let plan = burst(20, 3_600);
    let d = s.check(&plan, "k:a", 1, Nanos::ZERO).await.unwrap();
    assert_eq!(d.statuses[0].remaining, 19, "{d:?}");
    let list = server.cli("FUNCTION LIST");
    assert!(
        list.contains("paceline_v1") && list.contains("paceline_v8"),
        "{list}"
    );
}

/// Rows of token buckets and fixed windows written by version 2 (msgpack
/// arrays) and version 3 (doubles after the marker byte 1) are read by
/// version 4 (the marker 2, the doubles and the key's expiry): the count
/// goes on across an upgrade, and the row is written back in the new form.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_of_the_previous_releases_are_read() {
    let server = testing::RedisServer::start();
    let s = store(config(server.url())).await;
    let plan = Plan::new(
        "free",
        vec![
            Policy::token_bucket("burst", 20, 3_600).unwrap(),
            Policy::daily("daily", 1_000).unwrap(),
        ],
    )
    .unwrap();
    let d = s.check(&plan, "k:a", 1, Nanos::ZERO).await.unwrap();
    assert_eq!(d.statuses[0].remaining, 19);
    let marker = || {
        let mut first = redis::cmd("EVAL");
        first
            .arg("return string.byte(redis.call('GET', redis.call('KEYS', '*')[1]), 1)")
            .arg(0);
        first
    };
    assert_eq!(s.command(&marker()).await.unwrap(), redis::Value::Int(2));
    // the row rewritten as an older version kept it (the script answers
    // what it wrote), then read on and written back in the new form
    let older = |lua: &'static str, wrote: i64, after: (u64, u64)| {
        let (s, plan, marker) = (&s, &plan, &marker);
        async move {
            let mut eval = redis::cmd("EVAL");
            eval.arg(lua).arg(0);
            assert_eq!(s.command(&eval).await.unwrap(), redis::Value::Int(wrote));
            let d = s.check(plan, "k:a", 1, Nanos::ZERO).await.unwrap();
            assert_eq!(
                (d.statuses[0].remaining, d.statuses[1].remaining),
                after,
                "{d:?}"
            );
            assert_eq!(s.command(&marker()).await.unwrap(), redis::Value::Int(2));
        }
    };
    // version 3: the same fields after the byte 1, without the expiry
    older(
        "local k = redis.call('KEYS', '*')[1] \
         local v = redis.call('GET', k) \
         assert(string.byte(v, 1) == 2 and #v == 49, 'a row of version 4') \
         local t = {struct.unpack('<ddddd', v, 2)} t[6] = nil \
         redis.call('SET', k, struct.pack('<Bddddd', 1, unpack(t)), 'KEEPTTL') \
         return #redis.call('GET', k)",
        41,
        (18, 998),
    )
    .await;
    // version 2: the same fields as a msgpack array
    older(
        "local k = redis.call('KEYS', '*')[1] \
         local v = redis.call('GET', k) \
         local t = {struct.unpack('<ddddd', v, 2)} t[6] = nil \
         redis.call('SET', k, cmsgpack.pack(t), 'KEEPTTL') \
         return string.byte(redis.call('GET', k), 1)",
        0x95,
        (17, 997),
    )
    .await;
}

/// A key lives at least as long as its state must be kept, whether its
/// write set the expiry or kept the one an earlier write set: after every
/// decision its TTL covers each policy's reset, and it is kept no longer
/// than that, the slack and the margin (at most a minute) say; a write
/// keeps the expiry exactly when that covers what the state needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_lives_as_long_as_its_state_must() {
    let server = testing::RedisServer::start();
    // on the server's clock (the default), where expiries are kept
    let s = store(config(server.url())).await;
    let slack_ms = RedisStoreConfig::default().ttl_slack.as_millis() as i64;
    let plans = [
        burst(20, 2),
        burst(5, 600),
        Plan::new(
            "free",
            vec![
                Policy::token_bucket("burst", 20, 2).unwrap(),
                Policy::daily("daily", 10_000).unwrap(),
            ],
        )
        .unwrap(),
    ];
    let mut ttl_of = redis::cmd("EVAL");
    ttl_of
        .arg("return redis.call('PTTL', redis.call('KEYS', '*')[1])")
        .arg(0);
    for (n, plan) in plans.iter().enumerate() {
        server.cli("FLUSHALL");
        let mut most_need = 0;
        for i in 0..30 {
            let d = s.check(plan, "k:a", 1 + i % 2, Nanos::ZERO).await.unwrap();
            let need_ms = d
                .statuses
                .iter()
                .map(|p| p.reset_after.as_u64().div_ceil(1_000_000) as i64)
                .max()
                .unwrap();
            most_need = most_need.max(need_ms);
            let redis::Value::Int(ttl) = s.command(&ttl_of).await.unwrap() else {
                panic!("no TTL");
            };
            assert!(
                ttl >= need_ms,
                "plan {n}, step {i}: ttl {ttl} ms < {need_ms} ms ({d:?})"
            );
            // a window is kept a second past its end, and all rounded up to seconds
            let whole = most_need + slack_ms + 3_000;
            let most = whole + whole.min(60_000);
            assert!(ttl <= most, "plan {n}, step {i}: ttl {ttl} ms > {most} ms");
        }
    }
    // which writes keep the expiry: one put far out by hand stays there
    // when kept; a daily quota's writes all keep it, a bucket of 5 per 10
    // minutes (each charge 2 minutes more to keep, past the margin) sets it
    for (n, plan, want_kept) in [(1, &plans[1], 0), (2, &plans[2], 4)] {
        server.cli("FLUSHALL");
        s.check(plan, "k:b", 1, Nanos::ZERO).await.unwrap();
        let mut far = redis::cmd("EVAL");
        far.arg("return redis.call('PEXPIRE', redis.call('KEYS', '*')[1], 900000000)")
            .arg(0);
        let mut kept = 0;
        for i in 0..4 {
            s.command(&far).await.unwrap();
            let d = s.check(plan, "k:b", 1, Nanos::ZERO).await.unwrap();
            assert!(d.is_allowed(), "plan {n}, step {i}: {d:?}");
            let redis::Value::Int(ttl) = s.command(&ttl_of).await.unwrap() else {
                panic!("no TTL");
            };
            if ttl > 800_000_000 {
                kept += 1;
            }
        }
        assert_eq!(kept, want_kept, "plan {n}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_degraded_limiter_grants_a_share_while_redis_is_away() {
    let mut server = testing::RedisServer::start();
    let s = store(RedisStoreConfig {
        deadline: Duration::from_millis(20),
        degraded: Some(Degraded { share: 0.25 }),
        ..config(server.url())
    })
    .await;
    let open = burst(20, 3_600);
    let closed = Plan::new(
        "strict",
        vec![Policy::token_bucket("burst", 20, 3_600)
            .unwrap()
            .with_fail_mode(FailMode::Closed)],
    )
    .unwrap();
    server.kill();
    let now = Nanos::from_secs(1_000);
    let mut ok = 0;
    for _ in 0..20 {
        if s.check(&open, "k:a", 1, now).await.unwrap().is_allowed() {
            ok += 1;
        }
    }
    assert_eq!(ok, 5, "a quarter of the burst");
    assert_eq!(s.stats().degraded, 20);
    // a fail-closed plan is not decided locally
    assert!(s.check(&closed, "k:a", 1, now).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_share_one_count() {
    let server = testing::RedisServer::start();
    let mut stores = Vec::new();
    for _ in 0..3 {
        stores.push(
            store(RedisStoreConfig {
                clock: ClockSource::Caller,
                deny_cache: 0,
                ..config(server.url())
            })
            .await,
        );
    }
    let plan = Arc::new(
        Plan::new(
            "free",
            vec![
                Policy::token_bucket("burst", 20, 2).unwrap(),
                Policy::daily("daily", 10_000).unwrap(),
            ],
        )
        .unwrap(),
    );
    // 1,000 requests, 5 ms apart, round-robin: 20 + 5 s × 10/s
    let t0 = 1_790_000_000u64 * 1_000_000_000;
    let mut ok = 0;
    let mut last = None;
    for i in 0..1_000u64 {
        let now = Nanos::new(t0 + i * 5_000_000);
        let d = stores[i as usize % 3]
            .check(&plan, "k:one", 1, now)
            .await
            .unwrap();
        if d.is_allowed() {
            ok += 1;
        }
        last = Some(d);
    }
    let memory = paceline_core::MemoryStore::new();
    let mut one = 0;
    for i in 0..1_000u64 {
        let now = Nanos::new(t0 + i * 5_000_000);
        one += usize::from(
            memory
                .check_sync(&plan, "k:one", 1, now)
                .unwrap()
                .is_allowed(),
        );
    }
    assert_eq!(ok, one, "three instances admitted what one does");
    assert!((69..=71).contains(&ok), "{ok}");
    // the daily quota is one count across the three
    assert_eq!(last.unwrap().statuses[1].remaining, 10_000 - ok as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_left_behind_expires_even_on_a_busy_key() {
    let server = testing::RedisServer::start();
    let s = store(RedisStoreConfig {
        clock: ClockSource::Caller,
        lease_ttl: Duration::from_secs(10),
        deny_cache: 0,
        ..config(server.url())
    })
    .await;
    let plan = Plan::new("c", vec![Policy::concurrency("inflight", 2).unwrap()]).unwrap();
    let t0 = 1_790_000_000u64;
    // one lease is never given back (its instance died)
    assert!(s
        .check(&plan, "k:a", 1, Nanos::from_secs(t0))
        .await
        .unwrap()
        .is_allowed());
    // the key stays busy: a lease taken and given back every second
    for i in 1..10 {
        let now = Nanos::from_secs(t0 + i);
        assert!(s.check(&plan, "k:a", 1, now).await.unwrap().is_allowed());
        let d = s.check(&plan, "k:a", 1, now).await.unwrap();
        assert!(!d.is_allowed(), "two leases out at {i} s");
        s.release(&plan, "k:a", 1, now).await.unwrap();
    }
    // the lost lease has outlived the lease ttl: both fit again
    let now = Nanos::from_secs(t0 + 11);
    assert!(s.check(&plan, "k:a", 1, now).await.unwrap().is_allowed());
    assert!(s.check(&plan, "k:a", 1, now).await.unwrap().is_allowed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_linger_gathers_decisions_that_arrive_apart() {
    let server = testing::RedisServer::start();
    let s = store(RedisStoreConfig {
        batch_linger: Duration::from_millis(10),
        batch_max: 8,
        ..config(server.url())
    })
    .await;
    let plan = burst(1_000, 1);
    // one call to warm the connection (and load the functions)
    s.check(&plan, "k:warm", 1, Nanos::ZERO).await.unwrap();
    let before = s.stats().calls;
    let mut tasks = Vec::new();
    for i in 0..8 {
        let (s, plan) = (s.clone(), plan.clone());
        tasks.push(tokio::spawn(async move {
            s.check(&plan, &format!("k:{i}"), 1, Nanos::ZERO).await
        }));
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    for t in tasks {
        assert!(t.await.unwrap().unwrap().is_allowed());
    }
    // eight decisions about a millisecond apart share a few 10 ms lingers
    // (without one, each is its own call)
    let calls = s.stats().calls - before;
    assert!(calls <= 4, "{calls} calls for 8 decisions");
}

/// A lone caller's checks of a plan counted exactly go in the library's
/// short form (`one`) on a connection of their own, once a call the usual
/// way has succeeded; they count as the batch's form does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_caller_has_a_connection_of_its_own() {
    let server = testing::RedisServer::start();
    let s = store(RedisStoreConfig {
        connections: 1,
        ..config(server.url())
    })
    .await;
    let plan = burst(20, 3_600);
    warm(&s, &plan).await;
    let clients = || server.cli("CLIENT LIST").lines().count();
    let before = clients();
    assert_eq!(admitted(&s, &plan, "k:a", 25).await, 20);
    // the multiplexed connection, the direct one, and this client
    assert_eq!(clients(), before + 1, "{}", server.cli("CLIENT LIST"));
    let stats = server.cli("INFO commandstats");
    assert!(stats.contains("cmdstat_fcall:calls="), "{stats}");
    let d = s.check(&plan, "k:b", 1, Nanos::ZERO).await.unwrap();
    assert_eq!(d.statuses[0].remaining, 19);
}

/// The lone form refuses what it cannot read (a missing key or cost, an
/// unreadable head, clock or cost) with an error naming it, and charges
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lone_form_refuses_what_it_cannot_read() {
    let server = testing::RedisServer::start();
    let s = store(config(server.url())).await;
    warm(&s, &burst(20, 3_600)).await;
    let head = "\"1000 30000 t,20,2,0,0,r\"";
    for args in [
        format!("0 T {head} 1 0"),
        format!("1 k:x T {head} 1"),
        "1 k:x T \"junk\" 1 0".to_string(),
        format!("1 k:x T {head} x 0"),
        format!("1 k:x T {head} 1 -1"),
        format!("1 k:x soon {head} 1 0"),
    ] {
        let reply = server.cli(&format!("FCALL paceline_v8_one {args}"));
        assert!(
            reply.starts_with("-") && reply.contains("paceline"),
            "{args}: {reply}"
        );
    }
    assert!(server.cli("EXISTS k:x").starts_with(":0"));
    let reply = server.cli(&format!("FCALL paceline_v8_one 1 k:x T {head} 1 0"));
    assert!(reply.starts_with("*4"), "{reply}");
}
