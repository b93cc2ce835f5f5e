//! The service on Redis: three instances, each with its own connection,
//! share one count; a refused request gives its charges back there too;
//! a paused Redis is answered within the deadline, per the domain's fail
//! mode.

mod common;

use std::time::{Duration, Instant};

use common::*;
use paceline_core::SystemClock;
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
