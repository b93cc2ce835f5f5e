//! `paceline check` on the Redis store: checks and a gateway sharing one
//! Redis (and one key-hash secret) count as one, and a refusal one check
//! sealed for nginx is opened by another, so nginx may send its error page
//! to any instance behind one upstream block.
#![cfg(feature = "redis")]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use paceline_core::{Clock, ManualClock};
use paceline_gateway::check::Check;
use paceline_gateway::{Gateway, GatewayConfig};
use paceline_redis::testing::RedisServer;

fn config(upstream: SocketAddr, redis: &str) -> GatewayConfig {
    let text = format!(
        r#"[gateway]
listen = "127.0.0.1:0"
upstream = "http://{upstream}"
watch = false
store = "redis"

[gateway.redis]
url = "{redis}"
deadline_ms = 2000
deny_cache = 0

[plans.free]
policies = [
  {{ name = "burst", algorithm = "token_bucket", q = 20, w = 2 }},
  {{ name = "daily", algorithm = "daily", q = 10000 }},
]

[keys]
sk_one = "free"

[escalation]
enabled = false
"#
    );
    // every instance has the same key-hash secret
    let env = |v: &str| {
        (v == paceline_gateway::KEY_HASH_SECRET_ENV)
            .then(|| "one secret for every instance".to_string())
    };
    let mut cfg = GatewayConfig::parse_with_env(&text, "check.toml", None, &env).unwrap();
    if let Some(r) = cfg.settings.redis.as_mut() {
        r.caller_clock = true;
    }
    cfg
}

async fn call(
    c: &Client<HttpConnector, Full<Bytes>>,
    to: SocketAddr,
    fields: &[(&str, &str)],
) -> Response<Bytes> {
    let mut req = Request::get(format!("http://{to}/.paceline/check"));
    for (n, v) in fields {
        req = req.header(*n, *v);
    }
    let res = tokio::time::timeout(common::LIMIT, c.request(req.body(Full::default()).unwrap()))
        .await
        .expect("an answer in time")
        .expect("an answer");
    let (parts, body) = res.into_parts();
    Response::from_parts(parts, body.collect().await.unwrap().to_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_and_a_gateway_on_one_redis_count_as_one_and_open_each_others_seals() {
    let (api, seen) = common::counting_upstream().await;
    let server = RedisServer::start();
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::at_unix_secs(1_790_000_000));
    let gw = Gateway::bind_with_clock(config(api, &server.url()), clock.clone())
        .await
        .unwrap();
    let gateway = gw.local_addr();
    let gateway_handle = gw.handle();
    tokio::spawn(gw.run(std::future::pending()));
    let mut checks = Vec::new();
    for _ in 0..2 {
        let ck = Check::bind_with_clock(
            config(api, &server.url()),
            "127.0.0.1:0".parse().unwrap(),
            clock.clone(),
        )
        .await
        .unwrap();
        checks.push((ck.local_addr(), ck.handle()));
        tokio::spawn(ck.run(std::future::pending()));
    }
    let c = Client::builder(TokioExecutor::new()).build_http();
    let described = [
        ("x-original-method", "GET"),
        ("x-original-uri", "/v1/rates"),
        ("authorization", "Bearer sk_one"),
        ("paceline-deny-status", "403"),
    ];
    // 20 of one burst: 10 through the gateway, 5 through each check
    for i in 0..10 {
        let r = common::get(&c, gateway, "/v1/rates", "sk_one").await;
        assert_eq!(r.status(), 200, "gateway, request {i}");
        let r = call(&c, checks[i % 2].0, &described).await;
        assert_eq!(r.status(), 200, "check {}, request {i}", i % 2);
    }
    assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 10);
    let refused = call(&c, checks[0].0, &described).await;
    assert_eq!(refused.status(), 403);
    let sealed = refused.headers()["paceline-answer"]
        .to_str()
        .unwrap()
        .to_string();
    let answer = call(&c, checks[1].0, &[("paceline-answer", sealed.as_str())]).await;
    assert_eq!(answer.status(), 429);
    assert_eq!(answer.headers()["retry-after"], "1");
    let problem: serde_json::Value = serde_json::from_slice(answer.body()).unwrap();
    assert_eq!(problem["limit"], "burst");
    let direct = common::get(&c, gateway, "/v1/rates", "sk_one").await;
    assert_eq!(direct.status(), 429);
    assert_eq!(answer.body(), direct.body());
    gateway_handle.shutdown();
    for (_, h) in checks {
        h.shutdown();
    }
}
