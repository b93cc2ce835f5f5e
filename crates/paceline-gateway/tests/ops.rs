//! The operations endpoints of a gateway on Redis: `/readyz` turns `503`
//! within one deadline of Redis stopping (killed, or paused with its
//! connections open) and `200` within a second of it returning, while
//! `/healthz` stays `200`; with `ready_when_degraded` the degraded limiter
//! keeps the instance ready. On the memory store it is always ready.
#![cfg(feature = "redis")]

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use paceline_gateway::{Gateway, GatewayConfig, GatewayHandle};
use paceline_redis::testing::RedisServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use common::LIMIT;

/// The store's deadline in these tests.
const DEADLINE_MS: u64 = 100;

/// `GET path` on the operations listener: the status and the JSON body.
async fn probe(addr: SocketAddr, path: &str) -> (u16, serde_json::Value) {
    let req = format!("GET {path} HTTP/1.1\r\nhost: ops\r\nconnection: close\r\n\r\n");
    let out = common::until_closed(addr, req.as_bytes()).await;
    let text = String::from_utf8(out).unwrap();
    let status = text[9..12].parse().unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{head}"
    );
    (status, serde_json::from_str(body.trim()).unwrap())
}

async fn gateway(redis: Option<&str>, extra: &str) -> (SocketAddr, GatewayHandle) {
    let store = match redis {
        Some(url) => format!(
            "store = \"redis\"\n\n[gateway.redis]\nurl = \"{url}\"\ndeadline_ms = {DEADLINE_MS}\n{extra}\n"
        ),
        None => String::new(),
    };
    let text = format!(
        r#"[gateway]
listen = "127.0.0.1:0"
upstream = "http://127.0.0.1:9"
metrics_listen = "127.0.0.1:0"
watch = false
{store}

[plans.free]
policies = [{{ name = "burst", algorithm = "token_bucket", q = 5, w = 1 }}]

[keys]
sk_a = "free"
"#
    );
    let env = |v: &str| {
        (v == paceline_gateway::KEY_HASH_SECRET_ENV).then(|| "one secret for the test".to_string())
    };
    let cfg = GatewayConfig::parse_with_env(&text, "ops.toml", None, &env).unwrap();
    let gw = Gateway::bind(cfg).await.unwrap();
    let (ops, handle) = (gw.metrics_addr().unwrap(), gw.handle());
    tokio::spawn(gw.run(std::future::pending()));
    (ops, handle)
}

/// Polls `/readyz` until it answers `want`; how long that took.
async fn until_ready_is(ops: SocketAddr, want: u16) -> (Duration, serde_json::Value) {
    let t = Instant::now();
    loop {
        let (status, body) = probe(ops, "/readyz").await;
        if status == want {
            return (t.elapsed(), body);
        }
        assert!(t.elapsed() < LIMIT, "/readyz never answered {want}: {body}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_redis_and_health_stays() {
    let mut redis = RedisServer::start();
    let (ops, handle) = gateway(Some(&redis.url()), "").await;
    let (status, body) = probe(ops, "/readyz").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "ready");
    assert_eq!(body["store"], "redis");

    // killed: not ready within one deadline (and the time to ask)
    redis.kill();
    let (took, body) = until_ready_is(ops, 503).await;
    assert!(
        took < Duration::from_millis(DEADLINE_MS + 150),
        "{took:?} to notice"
    );
    assert_eq!(body["status"], "not_ready");
    assert!(
        body["reason"]
            .as_str()
            .unwrap()
            .contains("Redis does not answer"),
        "{body}"
    );
    assert_eq!(probe(ops, "/healthz").await.0, 200);

    // back: ready within a second
    redis.restart();
    let (took, body) = until_ready_is(ops, 200).await;
    assert!(
        took < Duration::from_secs(1),
        "{took:?} to come back: {body}"
    );
    assert_eq!(probe(ops, "/healthz").await.0, 200);

    // paused, its connections open and silent: the deadline decides
    redis.pause();
    let t = Instant::now();
    let (status, body) = probe(ops, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(
        t.elapsed() < Duration::from_millis(DEADLINE_MS + 150),
        "{:?}",
        t.elapsed()
    );
    assert!(
        body["reason"].as_str().unwrap().contains("within 100 ms"),
        "{body}"
    );
    assert_eq!(probe(ops, "/healthz").await.0, 200);
    redis.resume();
    let (took, _) = until_ready_is(ops, 200).await;
    assert!(took < Duration::from_secs(1), "{took:?}");
    handle.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_degraded_mode_can_count_as_ready_and_memory_always_is() {
    let mut redis = RedisServer::start();
    let (ops, handle) = gateway(
        Some(&redis.url()),
        "degraded_share = 0.5\nready_when_degraded = true",
    )
    .await;
    assert_eq!(probe(ops, "/readyz").await.0, 200);
    redis.kill();
    let (status, body) = probe(ops, "/readyz").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "degraded");
    handle.shutdown();

    let (ops, handle) = gateway(None, "").await;
    let (status, body) = probe(ops, "/readyz").await;
    assert_eq!((status, body["store"].as_str()), (200, Some("memory")));
    let (status, body) = probe(ops, "/healthz").await;
    assert_eq!((status, body["status"].as_str()), (200, Some("alive")));
    assert_eq!(probe_status(ops, "/nothing").await, 404);
    handle.shutdown();
}

async fn probe_status(addr: SocketAddr, path: &str) -> u16 {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nhost: ops\r\nconnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(LIMIT, s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out)[9..12].parse().unwrap()
}
