//! Keys from Redis (`[gateway.keys_redis]`), against a real redis-server:
//! a key added to the hash is admitted, and one removed refused, within
//! the TTL read from the gateway's clock; hashed fields hold no key; a
//! Redis that does not answer leaves a cached answer in force (stale) and
//! otherwise gets the configured treatment (503 by default, or an unknown
//! key); keys listed in the file are never looked up.
#![cfg(feature = "redis")]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use paceline_core::{Clock, ManualClock, Nanos};
use paceline_demo::api::{self as demo, DemoOptions};
use paceline_gateway::{Gateway, GatewayConfig};
use paceline_redis::testing::RedisServer;

const HASH: &str = "paceline:keys";

fn config(upstream: SocketAddr, redis: &str, extra: &str) -> String {
    format!(
        r#"[gateway]
listen = "127.0.0.1:0"
upstream = "http://{upstream}"
watch = false
store = "redis"

[gateway.redis]
url = "{redis}"
deadline_ms = 200
deny_cache = 0

[gateway.keys_redis]
hash = "{HASH}"
ttl_s = 10
stale_s = 60
{extra}

[gateway.shedding]
max_in_flight = 0

[plans.free]
policies = [{{ name = "burst", algorithm = "token_bucket", q = 5, w = 5 }}]

[plans.gold]
policies = [{{ name = "burst", algorithm = "token_bucket", q = 50, w = 5 }}]

[keys]
sk_file = "free"

[escalation]
enabled = false
"#
    )
}

struct Rig {
    addr: SocketAddr,
    clock: ManualClock,
    client: Client<HttpConnector, Full<Bytes>>,
    _api: demo::DemoUpstream,
}

async fn start(redis: &RedisServer, extra: &str) -> Rig {
    let api = demo::serve(([127, 0, 0, 1], 0).into(), DemoOptions::default())
        .await
        .unwrap();
    let env = |v: &str| {
        (v == paceline_gateway::KEY_HASH_SECRET_ENV).then(|| "one secret for every instance".into())
    };
    let text = config(api.addr(), &redis.url(), extra);
    let mut cfg = GatewayConfig::parse_with_env(&text, "gateway.toml", None, &env).unwrap();
    if let Some(r) = cfg.settings.redis.as_mut() {
        r.caller_clock = true;
    }
    let clock = ManualClock::at_unix_secs(1_790_000_000);
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let gw = Gateway::bind_with_clock(cfg, shared).await.unwrap();
    let addr = gw.local_addr();
    tokio::spawn(gw.run(std::future::pending()));
    Rig {
        addr,
        clock,
        client: Client::builder(TokioExecutor::new()).build_http(),
        _api: api,
    }
}

impl Rig {
    async fn get(&self, key: &str) -> (u16, http::HeaderMap, serde_json::Value) {
        let (parts, body) = common::get(&self.client, self.addr, "/v1/rates", key)
            .await
            .into_parts();
        let body = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
        (parts.status.as_u16(), parts.headers, body)
    }
    async fn status(&self, key: &str) -> u16 {
        self.get(key).await.0
    }
    fn advance(&self, secs: u64) {
        self.clock.advance(Nanos::from_secs(secs));
    }
}

fn policy(h: &http::HeaderMap) -> &str {
    h.get("ratelimit-policy")
        .map_or("", |v| v.to_str().unwrap_or(""))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_added_then_removed_is_admitted_then_refused_within_the_ttl() {
    let redis = RedisServer::start();
    let rig = start(&redis, "").await;

    // not in Redis: unknown (and that answer is cached for the TTL)
    let (status, _, body) = rig.get("sk_new").await;
    assert_eq!(status, 401);
    assert!(body["type"].as_str().unwrap().ends_with("unknown_key"));

    // added: admitted once the cached "not found" is past its TTL, on the
    // plan Redis names
    assert!(redis
        .cli(&format!("HSET {HASH} sk_new gold"))
        .starts_with(':'));
    assert_eq!(
        rig.status("sk_new").await,
        401,
        "a miss is cached for ttl_s"
    );
    rig.advance(11);
    let (status, headers, _) = rig.get("sk_new").await;
    assert_eq!(status, 200);
    assert!(policy(&headers).contains("q=50"), "gold: {headers:?}");

    // removed: still admitted while the answer is cached, refused once
    // the TTL has passed
    assert!(redis.cli(&format!("HDEL {HASH} sk_new")).starts_with(":1"));
    rig.advance(5);
    assert_eq!(rig.status("sk_new").await, 200, "within the TTL");
    rig.advance(6);
    assert_eq!(rig.status("sk_new").await, 401, "revoked within the TTL");

    // moved to another plan: the new plan within the TTL
    redis.cli(&format!("HSET {HASH} sk_moved gold"));
    assert!(policy(&rig.get("sk_moved").await.1).contains("q=50"));
    redis.cli(&format!("HSET {HASH} sk_moved free"));
    rig.advance(11);
    assert!(policy(&rig.get("sk_moved").await.1).contains("q=5;"));

    // a key the file lists is the file's, whatever Redis says
    redis.cli(&format!("HSET {HASH} sk_file gold"));
    rig.advance(11);
    let (status, headers, _) = rig.get("sk_file").await;
    assert_eq!(status, 200);
    assert!(!policy(&headers).contains("q=50"), "{headers:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hashed_fields_hold_no_key() {
    let redis = RedisServer::start();
    let rig = start(&redis, "field = \"sha256\"").await;
    let field = &paceline_server::hashed_key_entry("sk_hidden")["sha256:".len()..];
    redis.cli(&format!("HSET {HASH} {field} gold"));
    // the clear key as a field is not it
    redis.cli(&format!("HSET {HASH} sk_clear gold"));
    let (status, headers, _) = rig.get("sk_hidden").await;
    assert_eq!(status, 200);
    assert!(policy(&headers).contains("q=50"));
    assert_eq!(rig.status("sk_clear").await, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_does_not_answer_leaves_the_cache_then_503() {
    let redis = RedisServer::start();
    let rig = start(&redis, "").await;
    redis.cli(&format!("HSET {HASH} sk_known gold"));
    assert_eq!(rig.status("sk_known").await, 200);
    redis.pause();
    // past the TTL, within stale_s: the cached answer serves
    rig.advance(20);
    assert_eq!(rig.status("sk_known").await, 200, "a stale answer serves");
    // a key never seen: nothing cached, fail closed
    let (status, headers, body) = rig.get("sk_never_seen").await;
    assert_eq!(status, 503);
    assert_eq!(headers["retry-after"], "1");
    assert_eq!(headers["content-type"], "application/problem+json");
    assert!(
        body["detail"].as_str().unwrap().contains("looked up"),
        "{body}"
    );
    // past ttl + stale: nothing usable is cached any more
    rig.advance(60);
    assert_eq!(rig.status("sk_known").await, 503);
    // the file's keys never wait for Redis
    assert_eq!(rig.status("sk_file").await, 200);
    redis.resume();
    assert_eq!(rig.status("sk_known").await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_unavailable_unknown_a_redis_down_means_an_unknown_key() {
    let redis = RedisServer::start();
    let rig = start(&redis, "unavailable = \"unknown\"").await;
    redis.pause();
    let (status, _, body) = rig.get("sk_never_seen").await;
    assert_eq!(status, 401);
    assert!(body["type"].as_str().unwrap().ends_with("unknown_key"));
    redis.resume();
}

#[test]
fn the_keys_redis_table_is_checked_by_field() {
    let env = |v: &str| {
        (v == paceline_gateway::KEY_HASH_SECRET_ENV).then(|| "one secret for every instance".into())
    };
    let text = config("127.0.0.1:9".parse().unwrap(), "redis://127.0.0.1:1", "");
    assert!(GatewayConfig::parse_with_env(&text, "g.toml", None, &env).is_ok());
    let err = |from: &str, to: &str| {
        let t = text.replace(from, to);
        GatewayConfig::parse_with_env(&t, "g.toml", None, &env)
            .unwrap_err()
            .field()
            .to_string()
    };
    assert_eq!(err("ttl_s = 10", "ttl_s = 0"), "gateway.keys_redis.ttl_s");
    assert_eq!(
        err("ttl_s = 10", "ttl_s = 10\nfield = \"md5\""),
        "gateway.keys_redis.field"
    );
    assert_eq!(
        err("ttl_s = 10", "ttl_s = 10\ncache_size = 0"),
        "gateway.keys_redis.cache_size"
    );
    assert_eq!(
        err("ttl_s = 10", "ttl_s = 10\nunavailable = \"open\""),
        "gateway.keys_redis.unavailable"
    );
    assert_eq!(
        err(&format!("hash = \"{HASH}\""), "hash = \"\""),
        "gateway.keys_redis.hash"
    );
    // keys in Redis are API keys (or a key header's)
    let ip = format!("key = \"ip\"\n{text}");
    let e = GatewayConfig::parse_with_env(&ip, "g.toml", None, &env).unwrap_err();
    assert_eq!(e.field(), "gateway.keys_redis", "{e}");
    // and they are looked up on the Redis store's connections
    let memory = text
        .replace("store = \"redis\"", "store = \"memory\"")
        .replace(
            "[gateway.redis]\nurl = \"redis://127.0.0.1:1\"\ndeadline_ms = 200\ndeny_cache = 0\n",
            "",
        );
    let e = GatewayConfig::parse_with_env(&memory, "g.toml", None, &env).unwrap_err();
    assert_eq!(e.field(), "gateway.keys_redis", "{e}");
}
