//! A shed `503` on the Redis store carries the caller's `RateLimit` fields,
//! as it does on the memory store: the gateway (one unit of in-flight
//! capacity, the demo API slow behind it) sheds a request of a key Redis
//! answered before, and its 503 tells that key's counters as Redis last
//! gave them, with no round trip and no charge; a key never seen gets a
//! 503 with no fields, none invented. Every wait is bounded.
#![cfg(feature = "redis")]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::get;
use http::Response;
use http_body_util::Full;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use paceline_core::{Clock, SystemClock};
use paceline_demo::api::{self as demo, DemoOptions};
use paceline_gateway::{Gateway, GatewayConfig};
use paceline_redis::testing::RedisServer;

fn config(upstream: SocketAddr, redis: &str) -> String {
    format!(
        r#"[gateway]
listen = "127.0.0.1:0"
upstream = "http://{upstream}"
watch = false
store = "redis"

[gateway.shedding]
max_in_flight = 1
reserve = 0.2

[gateway.redis]
url = "{redis}"
deadline_ms = 2000

[plans.free]
policies = [
  {{ name = "burst", algorithm = "token_bucket", q = 1000, w = 3600, kind = "burst" }},
  {{ name = "hour", algorithm = "fixed_window", q = 1000, w = 3600 }},
]

[keys]
sk_a = "free"
sk_b = "free"
sk_c = "free"

[[routes]]
method = "GET"
path = "/v1/rates"
criticality = "SHEDDABLE"
"#
    )
}

fn header<'a>(res: &'a Response<Bytes>, name: &str) -> &'a str {
    res.headers()
        .get(name)
        .map(|v| v.to_str().unwrap())
        .unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shed_503_on_redis_tells_a_seen_key_its_counters_and_invents_none() {
    let server = RedisServer::start();
    let api = demo::serve(
        ([127, 0, 0, 1], 0).into(),
        DemoOptions {
            delay: Duration::from_millis(600),
        },
    )
    .await
    .unwrap();
    let env = |v: &str| {
        (v == paceline_gateway::KEY_HASH_SECRET_ENV).then(|| "one secret for the test".to_string())
    };
    let text = config(api.addr(), &server.url());
    let cfg = GatewayConfig::parse_with_env(&text, "gateway.toml", None, &env).unwrap();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let gw = Gateway::bind_with_clock(cfg, clock).await.unwrap();
    let addr = gw.local_addr();
    let handle = gw.handle();
    tokio::spawn(gw.run(std::future::pending()));
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();

    // a first request connects and loads the functions (sk_c: neither
    // key of the test)
    assert_eq!(get(&client, addr, "/v1/rates", "sk_c").await.status(), 200);
    // sk_a's first request is decided in Redis and holds the one unit
    let slow = {
        let client = client.clone();
        tokio::spawn(async move { get(&client, addr, "/v1/labels/lbl_77120", "sk_a").await })
    };
    for _ in 0..400 {
        if handle.shedder().in_flight() >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(handle.shedder().in_flight(), 1);
    // shed, with sk_a's counters as Redis last answered them
    let res = get(&client, addr, "/v1/rates", "sk_a").await;
    assert_eq!(res.status(), 503);
    assert_eq!(
        header(&res, "ratelimit-policy"),
        "\"burst\";q=1000;w=3600, \"hour\";q=1000;w=3600"
    );
    let fields = header(&res, "ratelimit");
    assert!(
        fields.contains("\"burst\";r=999;") && fields.contains("\"hour\";r=999;"),
        "{fields}"
    );
    // shed too: a key Redis never answered gets no fields
    let res = get(&client, addr, "/v1/rates", "sk_b").await;
    assert_eq!(res.status(), 503);
    assert!(res.headers().get("ratelimit").is_none(), "{res:?}");
    assert!(res.headers().get("ratelimit-policy").is_none(), "{res:?}");
    assert_eq!(slow.await.unwrap().status(), 200);

    // the shed requests charged nothing: sk_a's next answer is its second
    let res = get(&client, addr, "/v1/rates", "sk_a").await;
    assert_eq!(res.status(), 200);
    let fields = header(&res, "ratelimit");
    assert!(fields.contains("\"hour\";r=998;"), "{fields}");
    handle.shutdown();
}
