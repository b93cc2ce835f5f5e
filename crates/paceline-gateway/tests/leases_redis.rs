//! Leased budgets through the gateway: three gateways on one Redis, one
//! key on a leased plan of 2,000 requests a second, offered 6,000 a
//! second unevenly (one gateway gets half), on a virtual clock all three
//! read. Each second admits at most the limit plus the stated bound
//! (3 instances × 2 slices × `max_slice`) and at least 95% of the limit,
//! and at least 95% of the decisions are made without a round trip to
//! Redis (from the stores' own counts).

#![cfg(feature = "redis")]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use paceline_core::{Clock, ManualClock, Nanos};
use paceline_gateway::{Gateway, GatewayConfig, GatewayHandle, GatewayStore};
use paceline_redis::testing::RedisServer;

const LIMIT: u64 = 2_000;
const MAX_SLICE: u64 = 40;
const SECONDS: u64 = 3;
/// Requests a millisecond each gateway is offered.
const OFFER: [usize; 3] = [3, 2, 1];

fn config(upstream: SocketAddr, redis: &str) -> String {
    format!(
        r#"[gateway]
listen = "127.0.0.1:0"
upstream = "http://{upstream}"
watch = false
store = "redis"

[gateway.redis]
url = "{redis}"
deadline_ms = 2000
slice_ms = 100

[gateway.shedding]
max_in_flight = 0

[plans.big]
policies = [
  {{ name = "rps", algorithm = "token_bucket", q = {LIMIT}, w = 1, share = "leased", max_slice = {MAX_SLICE} }},
]

[keys]
sk_big = "big"

[escalation]
enabled = false
"#
    )
}

async fn start(text: &str, clock: Arc<dyn Clock>) -> (SocketAddr, GatewayHandle) {
    let env = |v: &str| {
        (v == paceline_gateway::KEY_HASH_SECRET_ENV)
            .then(|| "one secret for every instance".to_string())
    };
    let mut cfg = GatewayConfig::parse_with_env(text, "gateway.toml", None, &env).unwrap();
    cfg.settings.redis.as_mut().unwrap().caller_clock = true;
    let gw = Gateway::bind_with_clock(cfg, clock).await.unwrap();
    let addr = gw.local_addr();
    let handle = gw.handle();
    tokio::spawn(gw.run(std::future::pending()));
    (addr, handle)
}

fn stats(h: &GatewayHandle) -> paceline_redis::RedisStats {
    match h.limiter().store() {
        GatewayStore::Redis(r) => r.stats(),
        _ => panic!("a Redis store"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_share_a_leased_limit_with_few_round_trips() {
    let (upstream, _) = common::counting_upstream().await;
    let server = RedisServer::start();
    let clock = ManualClock::at_unix_secs(1_790_000_000);
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let text = config(upstream, &server.url());
    let mut gws = Vec::new();
    for _ in 0..3 {
        gws.push(start(&text, shared.clone()).await);
    }
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let mut per_second = vec![0u64; SECONDS as usize];
    let mut decisions = 0u64;
    for ms in 0..SECONDS * 1_000 {
        let mut sent = tokio::task::JoinSet::new();
        for ((addr, _), &n) in gws.iter().zip(&OFFER) {
            for _ in 0..n {
                let (client, addr) = (client.clone(), *addr);
                sent.spawn(async move { common::get(&client, addr, "/v1/any", "sk_big").await });
            }
        }
        while let Some(res) = sent.join_next().await {
            decisions += 1;
            let s = res.unwrap().status().as_u16();
            assert!(s == 200 || s == 429, "{s}");
            per_second[(ms / 1_000) as usize] += u64::from(s == 200);
        }
        clock.advance(Nanos::from_millis(1));
    }
    let calls: u64 = gws.iter().map(|(_, h)| stats(h).lease_calls).sum();
    let local: u64 = gws.iter().map(|(_, h)| stats(h).leased).sum();
    let without = 1.0 - calls as f64 / decisions as f64;
    println!(
        "admitted per second {per_second:?}, {decisions} decisions, {local} from slices, {calls} lease calls ({:.2}% without a round trip)",
        100.0 * without
    );
    let bound = 3 * 2 * MAX_SLICE;
    // the first second spends the full bucket as well as its refill
    assert!(per_second[0] <= 2 * LIMIT + bound, "{per_second:?}");
    for (i, &n) in per_second.iter().enumerate().skip(1) {
        assert!(n <= LIMIT + bound, "second {i}: {n}");
        assert!(n * 100 >= LIMIT * 95, "second {i}: {n}");
    }
    assert!(without >= 0.95, "{without}");
}
