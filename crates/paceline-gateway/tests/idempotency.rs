//! The idempotency layer in the gateway, against the demo API on
//! loopback: 50 concurrent POSTs with one key run once; a client cut off
//! after (or while) the upstream works finds its label on retry; an
//! upstream connection lost mid-request frees the key and the demo's own
//! dedupe keeps one label; conflicts, missing keys, expiry, body bounds
//! and the replay's marks. Every wait is bounded.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use paceline_core::{Clock, ManualClock, Nanos};
use paceline_demo::api::{self as demo, DemoOptions, DemoUpstream};
use paceline_gateway::{Gateway, GatewayConfig, GatewayHandle};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const LIMIT: Duration = Duration::from_secs(10);

fn config_text(upstream: SocketAddr, idempotency: &str) -> String {
    format!(
        r#"[gateway]
listen = "127.0.0.1:0"
upstream = "http://{upstream}"
watch = false

[gateway.shedding]
max_in_flight = 0

[plans.free]
policies = [{{ name = "burst", algorithm = "token_bucket", q = 1000, w = 3600 }}]

[keys]
sk_a = "free"
sk_b = "free"

[idempotency]
max_body_bytes = 256
{idempotency}

[[routes]]
method = "POST"
path = "/v1/labels"
idempotency = "required"

[[routes]]
method = "POST"
path = "/v1/labels:batch"
idempotency = "optional"
"#
    )
}

struct Rig {
    api: DemoUpstream,
    addr: SocketAddr,
    handle: GatewayHandle,
    served: tokio::task::JoinHandle<std::io::Result<()>>,
    client: Client<HttpConnector, Full<Bytes>>,
    clock: ManualClock,
}

impl Rig {
    async fn start(delay: Duration, settings: &str) -> Rig {
        let api = demo::serve(([127, 0, 0, 1], 0).into(), DemoOptions { delay })
            .await
            .unwrap();
        Rig::start_before(api.addr(), api, settings).await
    }

    /// The gateway to `upstream` (the demo API itself, or a relay to it).
    async fn start_before(upstream: SocketAddr, api: DemoUpstream, settings: &str) -> Rig {
        let text = config_text(upstream, settings);
        let cfg = GatewayConfig::parse(&text, "gateway.toml", None).unwrap();
        let clock = ManualClock::at_unix_secs(1_790_000_000);
        let shared: Arc<dyn Clock> = Arc::new(clock.clone());
        let gw = Gateway::bind_with_clock(cfg, shared).await.unwrap();
        let addr = gw.local_addr();
        let handle = gw.handle();
        let served = tokio::spawn(gw.run(std::future::pending()));
        let client = Client::builder(TokioExecutor::new()).build_http();
        Rig {
            api,
            addr,
            handle,
            served,
            client,
            clock,
        }
    }

    fn post(&self, who: &str, key: Option<&str>, body: &'static str) -> Request<Full<Bytes>> {
        let mut b = Request::post(format!("http://{}/v1/labels", self.addr))
            .header("authorization", format!("Bearer {who}"))
            .header("content-type", "application/json");
        if let Some(k) = key {
            b = b.header("idempotency-key", k);
        }
        b.body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap()
    }

    async fn send(&self, req: Request<Full<Bytes>>) -> (Response<()>, Value) {
        send(&self.client, req).await
    }

    async fn stop(self) {
        self.handle.shutdown();
        tokio::time::timeout(LIMIT, self.served)
            .await
            .expect("stops in time")
            .unwrap()
            .unwrap();
    }
}

async fn send(
    client: &Client<HttpConnector, Full<Bytes>>,
    req: Request<Full<Bytes>>,
) -> (Response<()>, Value) {
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
    let v = serde_json::from_slice(&body).unwrap_or(Value::Null);
    (Response::from_parts(parts, ()), v)
}

fn code(v: &Value) -> &str {
    v["type"].as_str().unwrap_or("").rsplit('/').next().unwrap()
}

fn replayed(res: &Response<()>) -> bool {
    res.headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true")
}

async fn fifty_with_one_key(settings: &str) -> (Rig, Vec<(StatusCode, bool, Value)>) {
    let rig = Rig::start(Duration::from_millis(300), settings).await;
    let mut calls = Vec::new();
    for _ in 0..50 {
        let client = rig.client.clone();
        let req = rig.post("sk_a", Some("\"order-4711\""), r#"{"to":"NYC"}"#);
        calls.push(tokio::spawn(async move { send(&client, req).await }));
    }
    let mut answers = Vec::new();
    for c in calls {
        let (res, v) = c.await.unwrap();
        answers.push((res.status(), replayed(&res), v));
    }
    (rig, answers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_posts_with_one_key_run_once() {
    let (rig, answers) = fifty_with_one_key("").await;
    assert_eq!(rig.api.hits_on("/v1/labels"), 1, "one upstream execution");
    assert_eq!(rig.api.labels_created(), 1, "one label");
    let first: Vec<_> = answers.iter().filter(|a| a.0 == 201 && !a.1).collect();
    assert_eq!(first.len(), 1, "one first answer");
    let label = first[0].2["label_id"].clone();
    assert_eq!(label, "lbl_77120");
    for (status, replay, v) in &answers {
        match status.as_u16() {
            201 => assert_eq!(v["label_id"], label),
            409 => {
                assert_eq!(code(v), "idempotency_in_flight");
                assert!(!replay);
            }
            other => panic!("{other}: {v}"),
        }
    }
    // once it is done, every retry is the same label, replayed
    let (res, v) = rig
        .send(rig.post("sk_a", Some("order-4711"), r#"{"to":"NYC"}"#))
        .await;
    assert_eq!((res.status(), replayed(&res)), (StatusCode::CREATED, true));
    assert_eq!(v["label_id"], label);
    assert_eq!(rig.api.hits_on("/v1/labels"), 1);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_posts_can_all_wait_for_the_one_label() {
    let (rig, answers) = fifty_with_one_key("in_flight = \"wait\"").await;
    assert_eq!(rig.api.hits_on("/v1/labels"), 1);
    assert_eq!(rig.api.labels_created(), 1);
    for (status, _, v) in &answers {
        assert_eq!(status.as_u16(), 201, "{v}");
        assert_eq!(v["label_id"], "lbl_77120");
    }
    assert_eq!(answers.iter().filter(|a| a.1).count(), 49);
    rig.stop().await;
}

/// Writes a POST with `key` on a raw connection, and cuts it when `cut`
/// says so, the answer unread.
async fn post_and_cut(rig: &Rig, key: &str, cut: impl Fn(&DemoUpstream) -> bool) {
    let mut s = TcpStream::connect(rig.addr).await.unwrap();
    let body = r#"{"to":"NYC"}"#;
    let head = format!(
        "POST /v1/labels HTTP/1.1\r\nhost: x\r\nauthorization: Bearer sk_a\r\nidempotency-key: {key}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let deadline = tokio::time::Instant::now() + LIMIT;
    while !cut(&rig.api) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the upstream never got it"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    drop(s);
}

/// Retries until the answer is no longer "in flight".
async fn retry(rig: &Rig, key: &str) -> (Response<()>, Value) {
    for _ in 0..500 {
        let (res, v) = rig
            .send(rig.post("sk_a", Some(key), r#"{"to":"NYC"}"#))
            .await;
        if code(&v) != "idempotency_in_flight" {
            return (res, v);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("still in flight");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cut_off_after_the_upstream_answered_gets_its_label_on_retry() {
    let rig = Rig::start(Duration::from_millis(100), "").await;
    // cut once the label exists: the upstream has answered
    post_and_cut(&rig, "k-answered", |api| api.labels_created() == 1).await;
    let (res, v) = retry(&rig, "k-answered").await;
    assert_eq!((res.status(), replayed(&res)), (StatusCode::CREATED, true));
    assert_eq!(v["label_id"], "lbl_77120");
    assert_eq!(rig.api.labels_created(), 1);
    assert_eq!(rig.api.hits_on("/v1/labels"), 1);

    // cut while the upstream still works: the first execution goes on
    post_and_cut(&rig, "k-working", |api| api.hits_on("/v1/labels") == 2).await;
    let (res, v) = retry(&rig, "k-working").await;
    assert_eq!((res.status(), replayed(&res)), (StatusCode::CREATED, true));
    assert_eq!(v["label_id"], "lbl_77121");
    assert_eq!(rig.api.labels_created(), 2);
    assert_eq!(rig.api.hits_on("/v1/labels"), 2);
    rig.stop().await;
}

/// A relay to `to` that, on its first connection, passes the request on
/// and drops the connection once the answer starts coming back (the
/// upstream dies mid-request, as the gateway sees it); later connections
/// are relayed whole.
async fn dying_relay(to: SocketAddr) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let mut first = true;
        while let Ok((mut gw, _)) = l.accept().await {
            let kill = std::mem::replace(&mut first, false);
            tokio::spawn(async move {
                let Ok(mut up) = TcpStream::connect(to).await else {
                    return;
                };
                if !kill {
                    let _ = tokio::io::copy_bidirectional(&mut gw, &mut up).await;
                    return;
                }
                let (mut gr, _gw_w) = gw.split();
                let (mut ur, mut uw) = up.split();
                let up_going = tokio::io::copy(&mut gr, &mut uw);
                let mut one = [0u8; 1];
                tokio::select! {
                    _ = up_going => {}
                    _ = ur.read(&mut one) => {}
                }
                // both connections end here, the answer unsent
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_lost_mid_request_frees_the_key_and_the_retry_runs() {
    let api = demo::serve(([127, 0, 0, 1], 0).into(), DemoOptions::default())
        .await
        .unwrap();
    let relay = dying_relay(api.addr()).await;
    let rig = Rig::start_before(relay, api, "").await;
    let (res, v) = rig
        .send(rig.post("sk_a", Some("k-lost"), r#"{"to":"NYC"}"#))
        .await;
    assert_eq!(res.status(), 502, "{v}");
    assert_eq!(rig.api.hits_on("/v1/labels"), 1);
    // the key was freed: the retry runs, and the demo's dedupe keeps one label
    let (res, v) = rig
        .send(rig.post("sk_a", Some("k-lost"), r#"{"to":"NYC"}"#))
        .await;
    assert_eq!(res.status(), 201, "{v}");
    assert_eq!(v["label_id"], "lbl_77120");
    assert_eq!(rig.api.hits_on("/v1/labels"), 2);
    assert_eq!(rig.api.labels_created(), 1);
    // and now the gateway replays it
    let (res, _) = rig
        .send(rig.post("sk_a", Some("k-lost"), r#"{"to":"NYC"}"#))
        .await;
    assert!(replayed(&res));
    assert_eq!(rig.api.hits_on("/v1/labels"), 2);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicts_missing_keys_expiry_and_bounds() {
    let rig = Rig::start(Duration::ZERO, "").await;
    // the replay carries the mark and the original status
    let (res, v) = rig
        .send(rig.post("sk_a", Some("k1"), r#"{"to":"NYC"}"#))
        .await;
    assert_eq!((res.status(), replayed(&res)), (StatusCode::CREATED, false));
    let label = v["label_id"].clone();
    let (res, v) = rig
        .send(rig.post("sk_a", Some("k1"), r#"{"to":"NYC"}"#))
        .await;
    assert_eq!((res.status(), replayed(&res)), (StatusCode::CREATED, true));
    assert_eq!(v["label_id"], label);
    // the rate-limit fields are the limiter's, fresh on a replay
    assert!(res.headers().contains_key("ratelimit"));
    // a different body: 409, not retryable, the upstream untouched
    let (res, v) = rig
        .send(rig.post("sk_a", Some("k1"), r#"{"to":"LAX"}"#))
        .await;
    assert_eq!(res.status(), 409);
    assert_eq!(code(&v), "idempotency_conflict");
    assert!(!res.headers().contains_key("retry-after"));
    assert_eq!(rig.api.hits_on("/v1/labels"), 1);
    // another caller's same key is its own: it reaches the upstream (the
    // demo API, deduping by key alone, answers it itself)
    rig.send(rig.post("sk_b", Some("k1"), r#"{"to":"LAX"}"#))
        .await;
    assert_eq!(rig.api.hits_on("/v1/labels"), 2);
    // no key on a route that requires one
    let (res, v) = rig.send(rig.post("sk_a", None, r#"{"to":"NYC"}"#)).await;
    assert_eq!(res.status(), 400);
    assert_eq!(code(&v), "idempotency_key_missing");
    // a body past max_body_bytes
    let big: &'static str = "x".repeat(300).leak();
    let (res, v) = rig.send(rig.post("sk_a", Some("k2"), big)).await;
    assert_eq!(res.status(), 413);
    assert_eq!(code(&v), "payload_too_large");
    assert_eq!(rig.api.hits_on("/v1/labels"), 2);
    // expired after its TTL: runs again (and the demo dedupes by key)
    rig.clock.advance(Nanos::from_secs(24 * 3600));
    let (res, _) = rig
        .send(rig.post("sk_a", Some("k1"), r#"{"to":"NYC"}"#))
        .await;
    assert_eq!(res.status(), 201);
    assert_eq!(rig.api.hits_on("/v1/labels"), 3);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_is_422_when_configured() {
    let rig = Rig::start(Duration::ZERO, "conflict_status = 422").await;
    rig.send(rig.post("sk_a", Some("k1"), r#"{"to":"NYC"}"#))
        .await;
    let (res, v) = rig
        .send(rig.post("sk_a", Some("k1"), r#"{"to":"LAX"}"#))
        .await;
    assert_eq!(res.status(), 422);
    assert_eq!(code(&v), "idempotency_conflict");
    assert_eq!(v["status"], 422);
    assert_eq!(rig.api.hits_on("/v1/labels"), 1);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_without_keys_are_left_alone() {
    let rig = Rig::start(Duration::ZERO, "").await;
    // an optional route runs without a key, every time
    for _ in 0..2 {
        let req = Request::post(format!("http://{}/v1/labels:batch", rig.addr))
            .header("authorization", "Bearer sk_a")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        let (res, _) = rig.send(req).await;
        assert_eq!((res.status(), replayed(&res)), (StatusCode::OK, false));
    }
    assert_eq!(rig.api.hits_on("/v1/labels:batch"), 2);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_idempotency_table_is_named_for_restart() {
    let rig = Rig::start(Duration::ZERO, "").await;
    let same = config_text(rig.api.addr(), "");
    let cfg = GatewayConfig::parse(&same, "gateway.toml", None).unwrap();
    assert!(rig.handle.apply(cfg).is_empty());
    let changed = config_text(rig.api.addr(), "ttl_s = 60");
    let cfg = GatewayConfig::parse(&changed, "gateway.toml", None).unwrap();
    assert_eq!(
        rig.handle.apply(cfg),
        ["idempotency changed; restart to apply it"]
    );
    rig.stop().await;
}
