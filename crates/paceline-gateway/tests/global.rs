//! The global plan (`[gateway] global_plan`): one limit on everything the
//! limiter passes to the upstream, whatever the key. Past it a request is
//! answered `503 overloaded` from its head, with the plan's wait, and its
//! key's charge is given back; a request its own key's plan refuses
//! spends none of it.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use paceline_core::{Clock, ManualClock, Nanos};
use paceline_gateway::{Gateway, GatewayConfig};

fn config(upstream: std::net::SocketAddr, global: &str) -> String {
    format!(
        r#"[gateway]
listen = "127.0.0.1:0"
upstream = "http://{upstream}"
watch = false
{global}

[plans.upstream]
policies = [{{ name = "upstream", algorithm = "token_bucket", q = 5, w = 1 }}]

[plans.free]
policies = [{{ name = "burst", algorithm = "token_bucket", q = 100, w = 1 }}]

[plans.tiny]
policies = [{{ name = "burst", algorithm = "token_bucket", q = 2, w = 1 }}]

[keys]
sk_a = "free"
sk_b = "free"
sk_tiny = "tiny"

[escalation]
enabled = false
"#
    )
}

fn remaining(res: &http::Response<Bytes>) -> String {
    res.headers()
        .get("ratelimit")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default()
}

#[tokio::test]
async fn past_the_global_plan_requests_get_503_and_their_keys_keep_their_charge() {
    let (upstream, hits) = common::counting_upstream().await;
    let clock = ManualClock::at_unix_secs(1_790_000_000);
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let text = config(upstream, "global_plan = \"upstream\"");
    let cfg = GatewayConfig::parse(&text, "gateway.toml", None).unwrap();
    let gw = Gateway::bind_with_clock(cfg, shared).await.unwrap();
    let addr = gw.local_addr();
    let handle = gw.handle();
    tokio::spawn(gw.run(std::future::pending()));
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();

    // a key over its own plan spends nothing of the global one
    for _ in 0..4 {
        common::get(&client, addr, "/v1/x", "sk_tiny").await;
    }
    assert_eq!(hits.load(Ordering::SeqCst), 2);
    // two keys share the 3 requests left of the upstream's 5
    let mut statuses = Vec::new();
    let mut last = None;
    for i in 0..6 {
        let key = if i % 2 == 0 { "sk_a" } else { "sk_b" };
        let res = common::get(&client, addr, "/v1/x", key).await;
        statuses.push(res.status().as_u16());
        last = Some(res);
    }
    assert_eq!(statuses, [200, 200, 200, 503, 503, 503]);
    assert_eq!(hits.load(Ordering::SeqCst), 5);
    let res = last.unwrap();
    assert_eq!(res.headers()["retry-after"], "1");
    assert_eq!(
        res.headers()["content-type"],
        "application/problem+json",
        "{res:?}"
    );
    let body = String::from_utf8_lossy(res.body());
    assert!(body.contains("overloaded"), "{body}");
    // sk_b was charged once (its two refusals given back): 99 left
    assert!(remaining(&res).contains("r=99"), "{}", remaining(&res));
    // a request without a body keeps its connection
    assert!(res.headers().get("connection").is_none());

    // the bucket refills: one request a fifth of a second
    clock.advance(Nanos::from_millis(200));
    let res = common::get(&client, addr, "/v1/x", "sk_a").await;
    assert_eq!(res.status(), 200);

    // a reload that drops the global plan lifts it at once
    let text = config(upstream, "");
    handle.apply(GatewayConfig::parse(&text, "gateway.toml", None).unwrap());
    for _ in 0..5 {
        let res = common::get(&client, addr, "/v1/x", "sk_b").await;
        assert_eq!(res.status(), 200);
    }
}

#[test]
fn a_global_plan_must_be_a_plan_of_the_file() {
    let addr = "127.0.0.1:9".parse().unwrap();
    let e = GatewayConfig::parse(
        &config(addr, "global_plan = \"nope\""),
        "gateway.toml",
        None,
    )
    .unwrap_err();
    assert_eq!(e.field(), "gateway.global_plan", "{e}");
    assert!(e.to_string().contains("upstream"), "{e}");
}

/// `POST /v1/labels` with `Bearer key` and, if given, an Idempotency-Key.
async fn post(
    client: &Client<HttpConnector, Full<Bytes>>,
    addr: std::net::SocketAddr,
    key: &str,
    idempotency: Option<&str>,
) -> http::Response<Bytes> {
    use http_body_util::BodyExt;
    let mut b = http::Request::post(format!("http://{addr}/v1/labels"))
        .header("authorization", format!("Bearer {key}"));
    if let Some(k) = idempotency {
        b = b.header("idempotency-key", k);
    }
    let req = b.body(Full::default()).unwrap();
    let res = tokio::time::timeout(common::LIMIT, client.request(req))
        .await
        .expect("answer in time")
        .expect("a response");
    let (parts, body) = res.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    http::Response::from_parts(parts, body)
}

#[tokio::test]
async fn requests_that_never_reach_the_upstream_give_their_global_charge_back() {
    let (upstream, hits) = common::counting_upstream().await;
    let clock = ManualClock::at_unix_secs(1_790_000_000);
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let mut text = config(upstream, "global_plan = \"upstream\"");
    text.push_str(
        "\n[[routes]]\nmethod = \"POST\"\npath = \"/v1/labels\"\nidempotency = \"required\"\n",
    );
    let cfg = GatewayConfig::parse(&text, "gateway.toml", None).unwrap();
    let gw = Gateway::bind_with_clock(cfg, shared).await.unwrap();
    let addr = gw.local_addr();
    tokio::spawn(gw.run(std::future::pending()));
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();

    // one label made: the upstream's first of 5
    let res = post(&client, addr, "sk_a", Some("k1")).await;
    assert_eq!(res.status(), 200, "{res:?}");
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    // retried again and again: replayed by the gateway, never reaching
    // the upstream, so none of them spends its budget
    for _ in 0..8 {
        let res = post(&client, addr, "sk_a", Some("k1")).await;
        assert_eq!(res.status(), 200);
        assert_eq!(res.headers()["idempotent-replayed"], "true");
    }
    // nor do writes the idempotency layer refuses for want of a key
    for _ in 0..3 {
        let res = post(&client, addr, "sk_b", None).await;
        assert_eq!(res.status(), 400);
    }
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    // the 4 the upstream has left are all there
    let mut statuses = Vec::new();
    for i in 0..5 {
        let key = if i % 2 == 0 { "sk_a" } else { "sk_b" };
        statuses.push(
            common::get(&client, addr, "/v1/x", key)
                .await
                .status()
                .as_u16(),
        );
    }
    assert_eq!(statuses, [200, 200, 200, 200, 503]);
    assert_eq!(hits.load(Ordering::SeqCst), 5);
}
