//! The service on Redis: three instances, each with its own connection,
//! share one count; a refused request gives its charges back there too;
//! a paused Redis is answered within the deadline, per the domain's fail
//! mode.

mod common;

use std::time::{Duration, Instant};

use common::*;
use paceline_core::{Nanos, Plan, Policy, Store, SystemClock};
use paceline_redis::{testing, RedisStore, RedisStoreConfig};
use paceline_rls::RlsService;

const SHARED: &str = "
domain: shared
descriptors:
  - key: tenant
    rate_limit:
      unit: hour
      requests_per_unit: 600
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
";

async fn instance(url: &str, yaml: &str, deadline: Duration) -> Served<RedisStore, SystemClock> {
    let store = RedisStore::connect(RedisStoreConfig {
        urls: vec![url.to_string()],
        key_secret: b"the same secret on every instance".to_vec(),
        deadline,
        deny_cache: 0,
        ..RedisStoreConfig::default()
    })
    .await
    .unwrap();
    serve(RlsService::new(config(yaml), store, SystemClock::new())).await
}

/// The first call connects and loads the functions: wait for it (at
/// most 2 s).
async fn warm(c: &mut Client, domain: &str) {
    let until = Instant::now() + Duration::from_secs(2);
    let r = request(domain, &[&[("warm", "up")]]);
    while c.should_rate_limit(r.clone()).await.is_err() {
        assert!(Instant::now() < until, "not answering within 2 s");
    }
}

type Client = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient<tonic::transport::Channel>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_share_one_count() {
    let server = testing::RedisServer::start();
    let url = server.url();
    let mut instances = Vec::new();
    for _ in 0..3 {
        instances.push(instance(&url, SHARED, Duration::from_millis(500)).await);
    }
    let mut tasks = Vec::new();
    for s in &instances {
        let addr = s.addr;
        tasks.push(tokio::spawn(async move {
            let mut c = client(addr).await;
            warm(&mut c, "shared").await;
            let req = request("shared", &[&[("tenant", "t1")]]);
            // four streams per instance, 100 requests each
            let mut streams = Vec::new();
            for _ in 0..4 {
                let (mut c, req) = (c.clone(), req.clone());
                streams.push(tokio::spawn(async move {
                    let mut ok = 0u32;
                    for _ in 0..100 {
                        ok += u32::from(code(&ask(&mut c, &req).await) == Code::Ok);
                    }
                    ok
                }));
            }
            let mut ok = 0;
            for s in streams {
                ok += s.await.unwrap();
            }
            ok
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.unwrap();
    }
    println!("three instances admitted {admitted} of 1200 against one limit of 600");
    // 1,200 asked of one limit of 600: within 1% of it, whatever the spread
    assert!(
        (594..=606).contains(&admitted),
        "admitted {admitted} of 1200 against one limit of 600"
    );
    let mut c = client(instances[0].addr).await;
    let r = ask(&mut c, &request("shared", &[&[("tenant", "t1")]])).await;
    assert_eq!(code(&r), Code::OverLimit);
    assert_eq!(r.statuses[0].limit_remaining, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_gives_its_charges_back_in_redis() {
    let server = testing::RedisServer::start();
    let a = instance(&server.url(), SHARED, Duration::from_millis(500)).await;
    let b = instance(&server.url(), SHARED, Duration::from_millis(500)).await;
    let (mut ca, mut cb) = (client(a.addr).await, client(b.addr).await);
    warm(&mut ca, "shared").await;
    let n = "2061111111";
    let both = request(
        "shared",
        &[
            &[("to_number", n)],
            &[("message_type", "marketing"), ("to_number", n)],
        ],
    );
    for _ in 0..5 {
        assert_eq!(code(&ask(&mut ca, &both).await), Code::Ok);
    }
    for _ in 0..4 {
        let r = ask(&mut cb, &both).await;
        assert_eq!(code(&r), Code::OverLimit);
        assert_eq!(status_code(&r, 1), Code::OverLimit);
        assert!(header(&r, "retry-after").is_some());
    }
    let wide = request("shared", &[&[("to_number", n)]]);
    let r = ask(&mut ca, &wide).await;
    assert_eq!(code(&r), Code::Ok);
    assert_eq!(
        r.statuses[0].limit_remaining, 94,
        "5 admitted, 1 now; none refused"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_redis_is_answered_within_the_deadline_per_fail_mode() {
    let server = testing::RedisServer::start();
    let deadline = Duration::from_millis(100);
    let open = instance(
        &server.url(),
        "domain: open\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n",
        deadline,
    )
    .await;
    let closed = instance(
        &server.url(),
        "domain: closed\nfail_mode: closed\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n",
        deadline,
    )
    .await;
    let (mut co, mut cc) = (client(open.addr).await, client(closed.addr).await);
    warm(&mut co, "open").await;
    warm(&mut cc, "closed").await;
    assert_eq!(
        code(&ask(&mut co, &request("open", &[&[("k", "a")]])).await),
        Code::Ok
    );
    server.pause();
    for i in 0..3 {
        let key = format!("fresh-{i}");
        let t = Instant::now();
        let r = ask(&mut co, &request("open", &[&[("k", &key)]])).await;
        let took = t.elapsed();
        println!("paused, fail open: OK in {took:?}");
        assert_eq!(code(&r), Code::Ok);
        assert!(
            took < deadline + Duration::from_millis(400),
            "open took {took:?}"
        );
        let t = Instant::now();
        let r = ask(&mut cc, &request("closed", &[&[("k", &key)]])).await;
        let took = t.elapsed();
        println!("paused, fail closed: OVER_LIMIT in {took:?}");
        assert_eq!(code(&r), Code::OverLimit);
        assert_eq!(header(&r, "retry-after"), Some("1"));
        assert!(problem(&r)["type"]
            .as_str()
            .unwrap()
            .ends_with("overloaded"));
        assert!(
            took < deadline + Duration::from_millis(400),
            "closed took {took:?}"
        );
    }
    server.resume();
}

const RACE: &str = "
domain: race
descriptors:
  - key: a
    rate_limit: {unit: day, requests_per_unit: 50}
  - key: b
    rate_limit: {unit: day, requests_per_unit: 1}
";

/// A service on its own store (no deny cache: every refusal is Redis's).
async fn on_redis(url: &str, yaml: &str) -> RlsService<RedisStore, SystemClock> {
    let store = RedisStore::connect(RedisStoreConfig {
        urls: vec![url.to_string()],
        key_secret: b"the same secret on every instance".to_vec(),
        deadline: Duration::from_millis(500),
        deny_cache: 0,
        ..RedisStoreConfig::default()
    })
    .await
    .unwrap();
    // the first call connects and loads the library: up to two seconds
    let warm = Plan::new("warm", vec![Policy::daily("warm", 1_000).unwrap()]).unwrap();
    let until = Instant::now() + Duration::from_secs(2);
    while store.check(&warm, "warm", 1, Nanos::ZERO).await.is_err() {
        assert!(Instant::now() < until, "Redis did not answer within 2 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    RlsService::new(config(yaml), store, SystemClock::new())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_descriptor_request_is_one_call_and_a_refusal_charges_nothing() {
    let server = testing::RedisServer::start();
    let svc = on_redis(&server.url(), RACE).await;
    let both = request("race", &[&[("a", "x")], &[("b", "x")]]);
    let calls = svc.store().stats().calls;
    let r = svc.decide(&both).await.unwrap();
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(svc.store().stats().calls, calls + 1, "one call per request");
    for _ in 0..5 {
        let r = svc.decide(&both).await.unwrap();
        assert_eq!(r.overall_code, Code::OverLimit as i32);
        assert_eq!(status_code(&r, 1), Code::OverLimit);
        assert_eq!(status_code(&r, 0), Code::Ok);
        assert_eq!(r.statuses[0].limit_remaining, 49, "a as it stands");
    }
    assert_eq!(
        svc.store().stats().calls,
        calls + 6,
        "one call per request, refused or not: nothing given back after"
    );
    let r = svc
        .decide(&request("race", &[&[("a", "x")]]))
        .await
        .unwrap();
    assert_eq!(
        r.statuses[0].limit_remaining, 48,
        "1 admitted with b, 1 now"
    );
}

/// The memory store's `a_refused_request_s_charge_is_never_seen_by_another`
/// on Redis: requests refused by `b` race reads of `a`, which always has
/// its last unit, on two services (two connections) over one server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_s_charge_is_never_seen_by_another_on_redis() {
    let server = testing::RedisServer::start();
    let one = on_redis(&server.url(), RACE).await;
    let two = on_redis(&server.url(), RACE).await;
    // b spent, a at 49 of 50: every (a, b) request is refused after a
    // was charged its last unit
    one.decide(&request("race", &[&[("b", "x")]]))
        .await
        .unwrap();
    let mut fill = request("race", &[&[("a", "x")]]);
    fill.hits_addend = 49;
    one.decide(&fill).await.unwrap();
    let mut tasks = Vec::new();
    for k in 0..3 {
        let svc = [&one, &two][k % 2].clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..300 {
                let r = svc
                    .decide(&request("race", &[&[("a", "x")], &[("b", "x")]]))
                    .await;
                assert_eq!(r.unwrap().overall_code, Code::OverLimit as i32);
            }
            0
        }));
    }
    for k in 0..3 {
        let svc = [&two, &one][k % 2].clone();
        tasks.push(tokio::spawn(async move {
            // a read (no hit): a always has its one unit left
            let mut read = request("race", &[&[("a", "x")]]);
            read.descriptors[0].hits_addend =
                Some(envoy_types::pb::google::protobuf::UInt64Value { value: 0 });
            let mut seen = 0u32;
            for _ in 0..300 {
                let r = svc.decide(&read).await.unwrap();
                seen += u32::from(r.statuses[0].limit_remaining != 1);
            }
            seen
        }));
    }
    let mut seen = 0;
    for t in tasks {
        seen += t.await.unwrap();
    }
    println!("reads of a that saw a refused request's charge: {seen} of 900");
    assert_eq!(seen, 0, "a refused request's charge was seen");
}
