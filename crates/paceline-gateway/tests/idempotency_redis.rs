//! Retried writes across instances: three in-process gateways (each its
//! own limiter and stores) on one Redis, 50 concurrent POSTs with one
//! `Idempotency-Key` spread round-robin over them, to the demo API: one
//! upstream execution, one label, and every caller gets that label
//! (replayed) or a 409 in-flight answer. With a memory store each, the
//! same load runs the request once per gateway. A Redis that does not
//! answer makes a keyed write `503 overloaded` within the deadline, never
//! a second execution. Every wait is bounded.
#![cfg(feature = "redis")]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use paceline_core::{Clock, SystemClock};
use paceline_demo::api::{self as demo, DemoOptions, DemoUpstream};
use paceline_gateway::{Gateway, GatewayConfig, GatewayHandle};
use paceline_redis::testing::RedisServer;
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(10);

fn config(upstream: SocketAddr, store: &str) -> String {
    format!(
        r#"[gateway]
listen = "127.0.0.1:0"
upstream = "http://{upstream}"
watch = false
{store}

[gateway.shedding]
max_in_flight = 0

[plans.free]
policies = [{{ name = "burst", algorithm = "token_bucket", q = 1000, w = 3600, fail = "open" }}]

[keys]
sk_a = "free"

[escalation]
enabled = false

[[routes]]
method = "POST"
path = "/v1/labels"
idempotency = "required"
"#
    )
}

fn redis_table(url: &str) -> String {
    format!("store = \"redis\"\n\n[gateway.redis]\nurl = \"{url}\"\ndeadline_ms = 500\n")
}

async fn start(text: &str) -> (SocketAddr, GatewayHandle) {
    // the instances share one key-hash secret, so they name entries alike
    let env = |v: &str| {
        (v == paceline_gateway::KEY_HASH_SECRET_ENV)
            .then(|| "one secret for every instance".to_string())
    };
    let cfg = GatewayConfig::parse_with_env(text, "gateway.toml", None, &env).unwrap();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let gw = Gateway::bind_with_clock(cfg, clock).await.unwrap();
    let addr = gw.local_addr();
    let handle = gw.handle();
    tokio::spawn(gw.run(std::future::pending()));
    (addr, handle)
}

/// What one caller got: status, whether replayed, the body.
type Answer = (u16, bool, Value);

async fn post(client: &Client<HttpConnector, Full<Bytes>>, addr: SocketAddr) -> Answer {
    let req = Request::post(format!("http://{addr}/v1/labels"))
        .header("authorization", "Bearer sk_a")
        .header("content-type", "application/json")
        .header("idempotency-key", "\"order-4711\"")
        .body(Full::new(Bytes::from_static(br#"{"to":"NYC"}"#)))
        .unwrap();
    let res = tokio::time::timeout(LIMIT, client.request(req))
        .await
        .expect("answer in time")
        .expect("a response");
    let (parts, body) = res.into_parts();
    let body = tokio::time::timeout(LIMIT, body.collect())
        .await
        .expect("body in time")
        .expect("a body")
        .to_bytes();
    let replayed = parts
        .headers
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    let v = serde_json::from_slice(&body).unwrap_or(Value::Null);
    (parts.status.as_u16(), replayed, v)
}

/// Three gateways with `store` before one demo API; 50 concurrent POSTs
/// with one key, round-robin over them.
async fn fifty_over_three(
    store: &str,
) -> (DemoUpstream, Vec<Answer>, Vec<(SocketAddr, GatewayHandle)>) {
    let api = demo::serve(
        ([127, 0, 0, 1], 0).into(),
        DemoOptions {
            delay: Duration::from_millis(300),
        },
    )
    .await
    .unwrap();
    let text = config(api.addr(), store);
    let mut gateways = Vec::new();
    for _ in 0..3 {
        gateways.push(start(&text).await);
    }
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let mut calls = Vec::new();
    for i in 0..50 {
        let (client, addr) = (client.clone(), gateways[i % 3].0);
        calls.push(tokio::spawn(async move { post(&client, addr).await }));
    }
    let mut answers = Vec::new();
    for c in calls {
        answers.push(c.await.unwrap());
    }
    (api, answers, gateways)
}

fn code(v: &Value) -> &str {
    v["type"].as_str().unwrap_or("").rsplit('/').next().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_posts_over_three_gateways_on_one_redis_run_once() {
    let server = RedisServer::start();
    let (api, answers, gateways) = fifty_over_three(&redis_table(&server.url())).await;
    assert_eq!(api.hits_on("/v1/labels"), 1, "one upstream execution");
    assert_eq!(api.labels_created(), 1, "one label");
    let first: Vec<_> = answers.iter().filter(|a| a.0 == 201 && !a.1).collect();
    assert_eq!(first.len(), 1, "one first answer: {answers:?}");
    let label = first[0].2["label_id"].clone();
    assert!(label.is_string(), "{label}");
    for (status, replayed, v) in &answers {
        match status {
            201 => assert_eq!(v["label_id"], label),
            409 => {
                assert_eq!(code(v), "idempotency_in_flight", "{v}");
                assert!(!replayed);
            }
            other => panic!("{other}: {v}"),
        }
    }
    // once done, a retry on any instance is that label, replayed
    let client = Client::builder(TokioExecutor::new()).build_http();
    for (addr, _) in &gateways {
        let (status, replayed, v) = post(&client, *addr).await;
        assert_eq!((status, replayed), (201, true), "{v}");
        assert_eq!(v["label_id"], label);
    }
    assert_eq!(api.hits_on("/v1/labels"), 1);
    for (_, h) in &gateways {
        h.shutdown();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_memory_store_each_the_same_posts_run_once_per_gateway() {
    let (api, answers, gateways) = fifty_over_three("").await;
    // the demo dedupes by key itself (one label), but each gateway let
    // its first request through: more than one upstream execution
    assert!(api.hits_on("/v1/labels") > 1, "{answers:?}");
    for (_, h) in &gateways {
        h.shutdown();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_redis_makes_a_keyed_write_503_not_a_second_run() {
    let server = RedisServer::start();
    let api = demo::serve(([127, 0, 0, 1], 0).into(), DemoOptions::default())
        .await
        .unwrap();
    let (addr, handle) = start(&config(api.addr(), &redis_table(&server.url()))).await;
    let client = Client::builder(TokioExecutor::new()).build_http();
    let (status, _, v) = post(&client, addr).await;
    assert_eq!(status, 201, "{v}");
    server.pause();
    let t = Instant::now();
    // the limiter fails open; the idempotency store cannot answer
    let (status, _, v) = post(&client, addr).await;
    let took = t.elapsed();
    server.resume();
    assert_eq!((status, code(&v)), (503, "overloaded"), "{v}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert_eq!(api.hits_on("/v1/labels"), 1);
    // back: the retry is the first answer, replayed
    let (status, replayed, _) = post(&client, addr).await;
    assert_eq!((status, replayed), (201, true));
    assert_eq!(api.hits_on("/v1/labels"), 1);
    handle.shutdown();
}

/// POSTs with `key` as its `Idempotency-Key`: the status, whether
/// replayed, and how long the answer took.
async fn post_key(
    client: &Client<HttpConnector, Full<Bytes>>,
    addr: SocketAddr,
    key: &str,
) -> (u16, bool, Duration) {
    let req = Request::post(format!("http://{addr}/v1/labels"))
        .header("authorization", "Bearer sk_a")
        .header("content-type", "application/json")
        .header("idempotency-key", format!("\"{key}\""))
        .body(Full::new(Bytes::from_static(br#"{"to":"NYC"}"#)))
        .unwrap();
    let t = Instant::now();
    let res = tokio::time::timeout(LIMIT, client.request(req))
        .await
        .expect("answer in time")
        .expect("a response");
    let (parts, body) = res.into_parts();
    tokio::time::timeout(LIMIT, body.collect())
        .await
        .expect("body in time")
        .expect("a body");
    let replayed = parts
        .headers
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    (parts.status.as_u16(), replayed, t.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_idempotency_deadline_is_the_configured_one() {
    let server = RedisServer::start();
    let api = demo::serve(([127, 0, 0, 1], 0).into(), DemoOptions::default())
        .await
        .unwrap();
    // the limiter gives up after 20 ms (and fails open); an idempotency
    // step waits a whole second, not the default 250 ms
    let table = format!(
        "store = \"redis\"\n\n[gateway.redis]\nurl = \"{}\"\ndeadline_ms = 20\nidempotency_deadline_ms = 1000\n",
        server.url()
    );
    let (addr, handle) = start(&config(api.addr(), &table)).await;
    let client = Client::builder(TokioExecutor::new()).build_http();
    let (status, _, _) = post_key(&client, addr, "warm-1").await;
    assert_eq!(status, 201);
    server.pause();
    let (status, _, took) = post_key(&client, addr, "slow-1").await;
    server.resume();
    assert_eq!(status, 503);
    assert!(
        took >= Duration::from_millis(950) && took < Duration::from_secs(3),
        "{took:?}"
    );
    handle.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_load_answers_in_time_and_runs_a_stored_key_once() {
    // every write on disk before it is answered, so a restart keeps what
    // was stored
    let mut server = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let api = demo::serve(([127, 0, 0, 1], 0).into(), DemoOptions::default())
        .await
        .unwrap();
    let table = format!(
        "store = \"redis\"\n\n[gateway.redis]\nurl = \"{}\"\ndeadline_ms = 50\nidempotency_deadline_ms = 200\n",
        server.url()
    );
    let (addr, handle) = start(&config(api.addr(), &table)).await;
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    // five keys whose first answers are stored (their retries replay)
    let stored: Vec<String> = (0..5).map(|i| format!("done-{i}")).collect();
    for k in &stored {
        assert_eq!(post_key(&client, addr, k).await.0, 201);
        assert_eq!(post_key(&client, addr, k).await.0, 201);
        let (status, replayed, _) = post_key(&client, addr, k).await;
        assert_eq!((status, replayed), (201, true), "{k}");
    }
    let runs = api.hits_on("/v1/labels");
    assert_eq!(runs, 5);

    // the load: four callers, new keys and the stored ones' retries; Redis
    // killed a little way in
    let mut callers = Vec::new();
    for c in 0..4 {
        let (client, stored) = (client.clone(), stored.clone());
        callers.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            for i in 0..30 {
                let key = match i % 3 {
                    0 => stored[(c + i) % stored.len()].clone(),
                    _ => format!("load-{c}-{i}"),
                };
                let (status, replayed, took) = post_key(&client, addr, &key).await;
                seen.push((key, status, replayed, took));
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            seen
        }));
    }
    tokio::time::sleep(Duration::from_millis(60)).await;
    server.kill();
    let mut seen = Vec::new();
    for c in callers {
        seen.extend(c.await.expect("a caller panicked"));
    }
    let mut refused = 0;
    for (key, status, replayed, took) in &seen {
        // bounded: the limiter's and the idempotency deadline, and more
        assert!(*took < Duration::from_secs(2), "{key}: {took:?}");
        match status {
            201 => {}
            503 => refused += 1,
            other => panic!("{key}: {other}"),
        }
        // a stored key is replayed or refused, never run again
        if key.starts_with("done-") && *status == 201 {
            assert!(replayed, "{key} ran a second time");
        }
    }
    assert!(refused > 0, "Redis was killed: some writes are refused");
    let executed_in_load = api.hits_on("/v1/labels") - runs;
    let new_ok = seen
        .iter()
        .filter(|(k, s, r, _)| k.starts_with("load-") && *s == 201 && !r)
        .count() as u64;
    assert_eq!(executed_in_load, new_ok, "only new keys ran, once each");

    // Redis back with what it had stored: every stored key is replayed
    server.restart();
    let before = api.hits_on("/v1/labels");
    let until = Instant::now() + Duration::from_secs(5);
    for k in &stored {
        loop {
            let (status, replayed, _) = post_key(&client, addr, k).await;
            if status == 201 {
                assert!(replayed, "{k} ran again after the restart");
                break;
            }
            assert_eq!(status, 503);
            assert!(Instant::now() < until, "Redis not back within 5 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert_eq!(api.hits_on("/v1/labels"), before, "no second execution");
    handle.shutdown();
}
