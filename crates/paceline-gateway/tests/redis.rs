//! Gateways sharing one Redis: three in-process gateways (each its own
//! limiter and Redis store) admit what one gateway does; the daily quota
//! is one count; with Redis killed, fail-open policies keep admitting and
//! fail-closed ones answer 503 `overloaded` with Retry-After within the
//! deadline; a restarted Redis counts again within a second; a charge
//! whose upstream answer never came is given back in Redis too.
#![cfg(feature = "redis")]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use paceline_core::{Clock, ManualClock, Nanos};
use paceline_demo::api::{self as demo, DemoOptions};
use paceline_gateway::{Gateway, GatewayConfig, GatewayHandle};
use paceline_redis::testing::RedisServer;
use serde_json::Value;

fn config(upstream: SocketAddr, store: &str, fail: &str) -> String {
    format!(
        r#"[gateway]
listen = "127.0.0.1:0"
upstream = "http://{upstream}"
watch = false
{store}

[gateway.shedding]
max_in_flight = 0

[plans.free]
policies = [
  {{ name = "burst", algorithm = "token_bucket", q = 20, w = 2, fail = "{fail}" }},
  {{ name = "daily", algorithm = "daily", q = 10000, reset_at = "00:00", fail = "{fail}" }},
]

[keys]
sk_one = "free"

[[routes]]
method = "GET"
path = "/v1/usage"
cost = 0

# escalation is per instance: left out of the comparison of counts
[escalation]
enabled = false
"#
    )
}

fn redis_table_with(url: &str, deadline_ms: u64) -> String {
    format!(
        "store = \"redis\"\n\n[gateway.redis]\nurl = \"{url}\"\ndeadline_ms = {deadline_ms}\ndeny_cache = 0\n"
    )
}

fn redis_table(url: &str) -> String {
    redis_table_with(url, 50)
}

struct Gw {
    addr: SocketAddr,
    handle: GatewayHandle,
}

async fn start(text: &str, clock: Arc<dyn Clock>, caller_clock: bool) -> Gw {
    // the instances share one key-hash secret, so they name keys alike
    let env = |v: &str| {
        (v == paceline_gateway::KEY_HASH_SECRET_ENV)
            .then(|| "one secret for every instance".to_string())
    };
    let mut cfg = GatewayConfig::parse_with_env(text, "gateway.toml", None, &env).unwrap();
    if let Some(r) = cfg.settings.redis.as_mut() {
        r.caller_clock = caller_clock;
    }
    let gw = Gateway::bind_with_clock(cfg, clock).await.unwrap();
    let addr = gw.local_addr();
    let handle = gw.handle();
    tokio::spawn(gw.run(std::future::pending()));
    Gw { addr, handle }
}

async fn get(
    client: &Client<HttpConnector, Full<Bytes>>,
    addr: SocketAddr,
    path: &str,
) -> (u16, http::HeaderMap, Bytes) {
    let (parts, body) = common::get(client, addr, path, "sk_one").await.into_parts();
    (parts.status.as_u16(), parts.headers, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_on_one_redis_admit_what_one_does() {
    let api = demo::serve(([127, 0, 0, 1], 0).into(), DemoOptions::default())
        .await
        .unwrap();
    let server = RedisServer::start();
    let clock = ManualClock::at_unix_secs(1_790_000_000);
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    // a generous deadline: a late answer would fail open and skew the count
    let text = config(api.addr(), &redis_table_with(&server.url(), 2_000), "open");
    let mut gws = Vec::new();
    for _ in 0..3 {
        gws.push(start(&text, shared.clone(), true).await);
    }
    let one_clock = ManualClock::at_unix_secs(1_790_000_000);
    let one = start(
        &config(api.addr(), "store = \"memory\"", "open"),
        Arc::new(one_clock.clone()),
        false,
    )
    .await;
    let client = Client::builder(TokioExecutor::new()).build_http();
    let (mut three, mut single) = (0u64, 0u64);
    for i in 0..1_000usize {
        let (s, _, _) = get(&client, gws[i % 3].addr, "/v1/rates").await;
        three += u64::from(s == 200);
        let (s, _, _) = get(&client, one.addr, "/v1/rates").await;
        single += u64::from(s == 200);
        clock.advance(Nanos::from_millis(5));
        one_clock.advance(Nanos::from_millis(5));
    }
    // burst 20, then 10 a second over 5 s
    assert!((69..=71).contains(&single), "one gateway admitted {single}");
    let diff = three.abs_diff(single) as f64;
    assert!(
        diff <= single as f64 * 0.01,
        "three admitted {three}, one {single}"
    );
    // the daily quota is one count, seen alike from every gateway
    for g in &gws {
        let (s, _, body) = get(&client, g.addr, "/v1/usage").await;
        assert_eq!(s, 200);
        let v: Value = serde_json::from_slice(&body).unwrap();
        let daily = v["limits"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["policy"] == "daily" || l["name"] == "daily")
            .unwrap_or_else(|| panic!("no daily in {v}"));
        assert_eq!(daily["r"].as_u64().unwrap(), 10_000 - three, "{v}");
    }
    for g in gws {
        g.handle.shutdown();
    }
    one.handle.shutdown();
}

async fn with_redis_down(fail: &str) -> (Vec<(u16, Option<String>, Duration)>, RedisServer, Gw) {
    let api = demo::serve(([127, 0, 0, 1], 0).into(), DemoOptions::default())
        .await
        .unwrap();
    let mut server = RedisServer::start();
    let text = config(api.addr(), &redis_table(&server.url()), fail);
    let gw = start(&text, Arc::new(paceline_core::SystemClock::new()), false).await;
    let client = Client::builder(TokioExecutor::new()).build_http();
    // the first call connects and loads the functions: allow it time
    let until = Instant::now() + Duration::from_secs(2);
    loop {
        let (s, h, _) = get(&client, gw.addr, "/v1/rates").await;
        if s == 200 && h.contains_key("ratelimit") {
            break;
        }
        assert!(Instant::now() < until, "Redis did not answer within 2 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    server.kill();
    let mut seen = Vec::new();
    for _ in 0..40 {
        let t = Instant::now();
        let (s, h, _) = get(&client, gw.addr, "/v1/rates").await;
        let ra = h
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_string());
        seen.push((s, ra, t.elapsed()));
    }
    std::mem::forget(api);
    (seen, server, gw)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_fail_closed_answers_503_within_the_deadline() {
    let (seen, mut server, gw) = with_redis_down("closed").await;
    for (s, ra, took) in &seen {
        assert_eq!(*s, 503);
        assert_eq!(ra.as_deref(), Some("1"));
        assert!(*took < Duration::from_millis(500), "took {took:?}");
    }
    // back: counting again within a second of the restart
    server.restart();
    let client = Client::builder(TokioExecutor::new()).build_http();
    let back = Instant::now();
    loop {
        let (s, h, _) = get(&client, gw.addr, "/v1/rates").await;
        if s == 200 && h.contains_key("ratelimit") {
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(1),
            "not back within 1 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    gw.handle.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_fail_open_keeps_admitting() {
    let (seen, _server, gw) = with_redis_down("open").await;
    for (s, _, took) in &seen {
        assert_eq!(*s, 200);
        assert!(*took < Duration::from_millis(500), "took {took:?}");
    }
    gw.handle.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_key_over_its_limit_is_answered_without_redis() {
    let api = demo::serve(([127, 0, 0, 1], 0).into(), DemoOptions::default())
        .await
        .unwrap();
    let server = RedisServer::start();
    // escalation on (the default): held requests read their standing
    let text = config(api.addr(), &redis_table_with(&server.url(), 2_000), "open")
        .replace("deny_cache = 0", "deny_cache = 1000")
        .replace("[escalation]\nenabled = false\n", "");
    let clock = ManualClock::at_unix_secs(1_790_000_000);
    let gw = start(&text, Arc::new(clock.clone()), false).await;
    let client = Client::builder(TokioExecutor::new()).build_http();
    let mut ok = 0;
    for _ in 0..21 {
        let (s, _, _) = get(&client, gw.addr, "/v1/rates").await;
        ok += u32::from(s == 200);
    }
    assert_eq!(ok, 20);
    let calls = |h: &GatewayHandle| match h.limiter().store() {
        paceline_gateway::GatewayStore::Redis(r) => r.stats().calls,
        _ => unreachable!("a Redis store"),
    };
    let before = calls(&gw.handle);
    for _ in 0..200 {
        let (s, h, _) = get(&client, gw.addr, "/v1/rates").await;
        assert_eq!(s, 429);
        assert!(h.contains_key("retry-after"));
    }
    assert_eq!(
        calls(&gw.handle),
        before,
        "a 429 of the hot key asked Redis"
    );
    gw.handle.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_failure_gives_its_charge_back_in_redis() {
    // an upstream nobody listens on: every admitted request ends in 502
    let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let upstream = gone.local_addr().unwrap();
    drop(gone);
    let server = RedisServer::start();
    let clock = ManualClock::at_unix_secs(1_790_000_000);
    let text = config(upstream, &redis_table_with(&server.url(), 2_000), "open");
    let gw = start(&text, Arc::new(clock.clone()), true).await;
    let client = Client::builder(TokioExecutor::new()).build_http();
    for _ in 0..30 {
        let (s, h, _) = get(&client, gw.addr, "/v1/rates").await;
        assert_eq!(s, 502);
        // the answer shows the budget as it stands after the refund
        let rl = h.get("ratelimit").unwrap().to_str().unwrap().to_string();
        assert!(rl.contains("\"burst\";r=20"), "{rl}");
    }
    // thirty failures later the burst is whole and the day untouched
    let (s, h, _) = get(&client, gw.addr, "/v1/rates").await;
    assert_eq!(s, 502);
    let rl = h.get("ratelimit").unwrap().to_str().unwrap();
    assert!(rl.contains("\"daily\";r=10000"), "{rl}");
    gw.handle.shutdown();
}
