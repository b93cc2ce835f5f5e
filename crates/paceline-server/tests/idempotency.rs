//! The idempotency layer on its own, in front of a counting service, on a
//! manual clock: replays, conflicts, missing and bad keys, expiry, body
//! bounds, duplicates in flight, failures that free the key, and a first
//! execution that outlives its client.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Frame;
use paceline_core::{ManualClock, Nanos};
use paceline_server::idempotency::{
    AnsweredHere, BearerScope, DigestBody, IdempotencyBody, IdempotencyLayer, IdempotencyMode,
    IdempotencySettings, InFlight, MemoryIdempotencyStore, REPLAYED,
};
use tokio::sync::Notify;
use tower::{Layer, Service, ServiceExt};

type ReqBody = http_body_util::combinators::UnsyncBoxBody<Bytes, Infallible>;

/// The upstream: counts executions, answers 201 with the execution's
/// number (or the status `status` holds), optionally held until `gate`.
#[derive(Clone, Default)]
struct Upstream {
    runs: Arc<AtomicUsize>,
    status: Arc<AtomicUsize>,
    gate: Option<Arc<Notify>>,
    started: Arc<Notify>,
    big: usize,
}

impl Upstream {
    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

impl Service<Request<DigestBody<ReqBody>>> for Upstream {
    type Response = Response<Full<Bytes>>;
    type Error = std::io::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;
    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn call(&mut self, req: Request<DigestBody<ReqBody>>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let body = req.into_body().collect().await;
            let n = this.runs.fetch_add(1, Ordering::SeqCst) + 1;
            this.started.notify_one();
            if let Some(g) = &this.gate {
                g.notified().await;
            }
            if body.is_err() {
                return Err(std::io::Error::other("request body failed"));
            }
            let status = match this.status.load(Ordering::SeqCst) {
                0 => 201,
                s => s as u16,
            };
            if status == 999 {
                return Err(std::io::Error::other("upstream failed"));
            }
            let text = match this.big {
                0 => format!("{{\"label\":{n}}}"),
                len => "x".repeat(len),
            };
            Ok(Response::builder()
                .status(status)
                .header("x-run", n.to_string())
                .body(Full::new(Bytes::from(text)))
                .unwrap())
        })
    }
}

struct Rig {
    clock: ManualClock,
    up: Upstream,
    store: MemoryIdempotencyStore,
    svc: paceline_server::Idempotency<Upstream, MemoryIdempotencyStore, ManualClock, BearerScope>,
}

fn rig_with(up: Upstream, mode: IdempotencyMode, f: impl FnOnce(&mut IdempotencySettings)) -> Rig {
    let clock = ManualClock::at_unix_secs(1_790_000_000);
    let store = MemoryIdempotencyStore::default();
    let mut s = IdempotencySettings::default();
    s.max_body_bytes = 64;
    s.max_answer_bytes = 1024;
    f(&mut s);
    let layer = IdempotencyLayer::new(store.clone(), clock.clone(), BearerScope::new(mode), s);
    Rig {
        svc: layer.layer(up.clone()),
        clock,
        up,
        store,
    }
}

fn rig() -> Rig {
    rig_with(Upstream::default(), IdempotencyMode::Required, |_| {})
}

fn full(b: &'static str) -> ReqBody {
    Full::new(Bytes::from_static(b.as_bytes()))
        .map_err(|never| match never {})
        .boxed_unsync()
}

fn post(who: &str, key: Option<&str>, body: &'static str) -> Request<ReqBody> {
    let mut b = Request::post("/v1/labels")
        .header("authorization", format!("Bearer {who}"))
        .header("content-length", body.len().to_string());
    if let Some(k) = key {
        b = b.header("idempotency-key", k);
    }
    b.body(full(body)).unwrap()
}

async fn send(r: &mut Rig, req: Request<ReqBody>) -> (StatusCode, http::HeaderMap, String) {
    let res = r.svc.ready().await.unwrap().call(req).await.unwrap();
    parts(res).await
}

async fn parts(
    res: Response<IdempotencyBody<Full<Bytes>>>,
) -> (StatusCode, http::HeaderMap, String) {
    let (p, b) = res.into_parts();
    let body = b.collect().await.unwrap().to_bytes();
    (
        p.status,
        p.headers,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

fn problem_type(body: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    v["type"]
        .as_str()
        .unwrap()
        .rsplit('/')
        .next()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn a_retry_is_replayed_with_the_original_status_and_marked() {
    let mut r = rig();
    let (s1, h1, b1) = send(&mut r, post("sk_a", Some("\"k1\""), "{\"to\":1}")).await;
    assert_eq!(s1, 201);
    assert!(!h1.contains_key(REPLAYED));
    // the bare form names the same key
    let (s2, h2, b2) = send(&mut r, post("sk_a", Some("k1"), "{\"to\":1}")).await;
    assert_eq!(s2, 201);
    assert_eq!(h2[REPLAYED], "true");
    assert_eq!(h2["x-run"], "1");
    assert_eq!(b1, b2);
    assert_eq!(r.up.runs(), 1);
}

/// The status of `req`'s answer, and whether the layer marked it as its
/// own (the request going no further).
async fn marked(r: &mut Rig, req: Request<ReqBody>) -> (u16, bool) {
    let res = r.svc.ready().await.unwrap().call(req).await.unwrap();
    let here = res.extensions().get::<AnsweredHere>().is_some();
    (res.status().as_u16(), here)
}

#[tokio::test]
async fn the_answers_the_layer_makes_itself_are_marked_and_the_services_are_not() {
    let mut r = rig();
    // run by the service, then replayed, then a conflict
    assert_eq!(
        marked(&mut r, post("sk_a", Some("k1"), "{}")).await,
        (201, false)
    );
    assert_eq!(
        marked(&mut r, post("sk_a", Some("k1"), "{}")).await,
        (201, true)
    );
    assert_eq!(
        marked(&mut r, post("sk_a", Some("k1"), "{\"a\":1}")).await,
        (409, true)
    );
    // a key missing or unreadable
    assert_eq!(marked(&mut r, post("sk_a", None, "{}")).await, (400, true));
    assert_eq!(
        marked(&mut r, post("sk_a", Some("two words"), "{}")).await,
        (400, true)
    );
    // what the layer does not look at
    let get = Request::get("/v1/labels").body(full("")).unwrap();
    assert_eq!(marked(&mut r, get).await, (201, false));
    assert_eq!(r.up.runs(), 2);
}

#[tokio::test]
async fn the_same_key_from_another_caller_is_another_key() {
    let mut r = rig();
    send(&mut r, post("sk_a", Some("k1"), "{}")).await;
    let (s, h, _) = send(&mut r, post("sk_b", Some("k1"), "{}")).await;
    assert_eq!(s, 201);
    assert!(!h.contains_key(REPLAYED));
    assert_eq!(r.up.runs(), 2);
}

#[tokio::test]
async fn a_different_body_is_a_conflict_409_or_422_as_configured() {
    let mut r = rig();
    send(&mut r, post("sk_a", Some("k1"), "{\"to\":1}")).await;
    let (s, h, b) = send(&mut r, post("sk_a", Some("k1"), "{\"to\":2}")).await;
    assert_eq!(s, 409);
    assert_eq!(problem_type(&b), "idempotency_conflict");
    assert!(!h.contains_key("retry-after"));
    assert_eq!(r.up.runs(), 1);

    let mut r = rig_with(Upstream::default(), IdempotencyMode::Required, |s| {
        s.conflict_status = 422
    });
    send(&mut r, post("sk_a", Some("k1"), "{\"to\":1}")).await;
    let (s, _, b) = send(&mut r, post("sk_a", Some("k1"), "{\"to\":2}")).await;
    assert_eq!(s, 422);
    let v: serde_json::Value = serde_json::from_str(&b).unwrap();
    assert_eq!(v["status"], 422);
    assert_eq!(r.up.runs(), 1);
}

#[tokio::test]
async fn a_required_route_refuses_a_post_without_a_key_and_an_optional_one_runs_it() {
    let mut r = rig();
    let (s, _, b) = send(&mut r, post("sk_a", None, "{}")).await;
    assert_eq!(s, 400);
    assert_eq!(problem_type(&b), "idempotency_key_missing");
    assert_eq!(r.up.runs(), 0);
    // a GET is not asked for a key
    let get = Request::get("/v1/labels").body(full("")).unwrap();
    assert_eq!(send(&mut r, get).await.0, 201);

    let mut r = rig_with(Upstream::default(), IdempotencyMode::Optional, |_| {});
    assert_eq!(send(&mut r, post("sk_a", None, "{}")).await.0, 201);
    assert_eq!(send(&mut r, post("sk_a", None, "{}")).await.0, 201);
    assert_eq!(r.up.runs(), 2);
    // with a key it applies
    send(&mut r, post("sk_a", Some("k"), "{}")).await;
    let (_, h, _) = send(&mut r, post("sk_a", Some("k"), "{}")).await;
    assert_eq!(h[REPLAYED], "true");
    assert_eq!(r.up.runs(), 3);
}

#[tokio::test]
async fn a_key_that_is_not_one_is_refused() {
    let mut r = rig();
    let long = "k".repeat(256);
    for bad in ["\"unterminated", "two words", long.as_str(), "\"\""] {
        let (s, _, b) = send(&mut r, post("sk_a", Some(bad), "{}")).await;
        assert_eq!(s, 400, "{bad}");
        assert_eq!(problem_type(&b), "idempotency_key_invalid");
    }
    // 255 characters is the default bound
    assert_eq!(
        send(&mut r, post("sk_a", Some(&long[..255]), "{}")).await.0,
        201
    );
    assert_eq!(r.up.runs(), 1);
}

#[tokio::test]
async fn an_expired_key_runs_again() {
    let mut r = rig();
    send(&mut r, post("sk_a", Some("k1"), "{}")).await;
    r.clock.advance(Nanos::from_secs(24 * 3600 - 1));
    let (_, h, _) = send(&mut r, post("sk_a", Some("k1"), "{}")).await;
    assert_eq!(h[REPLAYED], "true");
    r.clock.advance(Nanos::from_secs(1));
    let (s, h, _) = send(&mut r, post("sk_a", Some("k1"), "{}")).await;
    assert_eq!(s, 201);
    assert!(!h.contains_key(REPLAYED));
    assert_eq!(r.up.runs(), 2);
}

fn chunked(parts: Vec<&'static str>) -> ReqBody {
    Chunks(parts.into_iter().collect()).boxed_unsync()
}

/// A body in chunks, with no length announced.
struct Chunks(std::collections::VecDeque<&'static str>);

impl http_body::Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let next = self.0.pop_front();
        std::task::Poll::Ready(next.map(|c| Ok(Frame::data(Bytes::from_static(c.as_bytes())))))
    }
}

#[tokio::test]
async fn an_oversize_body_is_413_and_frees_the_key() {
    let mut r = rig();
    let big = "x".repeat(65).leak();
    let (s, _, b) = send(&mut r, post("sk_a", Some("k1"), big)).await;
    assert_eq!(s, 413);
    assert_eq!(problem_type(&b), "payload_too_large");
    assert_eq!(r.up.runs(), 0);
    // announced by no length: failed while it streams, the key freed
    let req = Request::post("/v1/labels")
        .header("authorization", "Bearer sk_a")
        .header("idempotency-key", "k2")
        .body(chunked(vec!["0123456789"; 7]))
        .unwrap();
    let (s, _, _) = send(&mut r, req).await;
    assert_eq!(s, 413);
    let (s, h, _) = send(&mut r, post("sk_a", Some("k2"), "{}")).await;
    assert_eq!(s, 201);
    assert!(!h.contains_key(REPLAYED));
}

#[tokio::test]
async fn failures_before_a_final_answer_free_the_key() {
    let mut r = rig();
    for status in [500usize, 502, 503, 429, 999] {
        r.up.status.store(status, Ordering::SeqCst);
        let key = format!("k{status}");
        let before = r.up.runs();
        let res = r
            .svc
            .ready()
            .await
            .unwrap()
            .call(post("sk_a", Some(&key), "{}"))
            .await;
        assert_eq!(res.is_err(), status == 999);
        r.up.status.store(0, Ordering::SeqCst);
        let (s, h, _) = send(&mut r, post("sk_a", Some(&key), "{}")).await;
        assert_eq!(
            (s, h.contains_key(REPLAYED)),
            (StatusCode::CREATED, false),
            "{status}"
        );
        assert_eq!(r.up.runs(), before + 2);
    }
    // a 5xx configured final is stored; a 4xx is always final
    let mut r = rig_with(Upstream::default(), IdempotencyMode::Required, |s| {
        s.store_5xx = true
    });
    r.up.status.store(500, Ordering::SeqCst);
    send(&mut r, post("sk_a", Some("k"), "{}")).await;
    let (s, h, _) = send(&mut r, post("sk_a", Some("k"), "{}")).await;
    assert_eq!((s.as_u16(), h[REPLAYED].to_str().unwrap()), (500, "true"));
    r.up.status.store(404, Ordering::SeqCst);
    send(&mut r, post("sk_a", Some("k404"), "{}")).await;
    let (s, h, _) = send(&mut r, post("sk_a", Some("k404"), "{}")).await;
    assert_eq!((s.as_u16(), h[REPLAYED].to_str().unwrap()), (404, "true"));
    assert_eq!(r.up.runs(), 2);
}

#[tokio::test]
async fn a_duplicate_in_flight_gets_409_with_retry_after() {
    let gate = Arc::new(Notify::new());
    let up = Upstream {
        gate: Some(gate.clone()),
        ..Upstream::default()
    };
    let mut r = rig_with(up, IdempotencyMode::Required, |_| {});
    let first = tokio::spawn(r.svc.clone().oneshot(post("sk_a", Some("k1"), "{}")));
    r.up.started.notified().await;
    let (s, h, b) = send(&mut r, post("sk_a", Some("k1"), "{}")).await;
    assert_eq!(s, 409);
    assert_eq!(problem_type(&b), "idempotency_in_flight");
    assert_eq!(h["retry-after"], "1");
    gate.notify_one();
    let res = first.await.unwrap().unwrap();
    assert_eq!(res.status(), 201);
    let (_, h, _) = send(&mut r, post("sk_a", Some("k1"), "{}")).await;
    assert_eq!(h[REPLAYED], "true");
    assert_eq!(r.up.runs(), 1);
}

#[tokio::test]
async fn a_duplicate_in_flight_can_wait_for_the_first_answer() {
    let gate = Arc::new(Notify::new());
    let up = Upstream {
        gate: Some(gate.clone()),
        ..Upstream::default()
    };
    let r = rig_with(up, IdempotencyMode::Required, |s| {
        s.in_flight = InFlight::Wait;
        s.max_wait = Duration::from_secs(5);
    });
    let first = tokio::spawn(r.svc.clone().oneshot(post("sk_a", Some("k1"), "{}")));
    r.up.started.notified().await;
    let second = tokio::spawn(r.svc.clone().oneshot(post("sk_a", Some("k1"), "{}")));
    tokio::time::sleep(Duration::from_millis(30)).await;
    gate.notify_one();
    let (s1, _, b1) = parts(first.await.unwrap().unwrap()).await;
    let (s2, h2, b2) = parts(second.await.unwrap().unwrap()).await;
    assert_eq!((s1, s2), (StatusCode::CREATED, StatusCode::CREATED));
    assert_eq!(h2[REPLAYED], "true");
    assert_eq!(b1, b2);
    assert_eq!(r.up.runs(), 1);
}

#[tokio::test]
async fn a_wait_is_bounded() {
    let gate = Arc::new(Notify::new());
    let up = Upstream {
        gate: Some(gate.clone()),
        ..Upstream::default()
    };
    let mut r = rig_with(up, IdempotencyMode::Required, |s| {
        s.in_flight = InFlight::Wait;
        s.max_wait = Duration::from_millis(50);
    });
    let first = tokio::spawn(r.svc.clone().oneshot(post("sk_a", Some("k1"), "{}")));
    r.up.started.notified().await;
    let (s, _, b) = send(&mut r, post("sk_a", Some("k1"), "{}")).await;
    assert_eq!(s, 409);
    assert_eq!(problem_type(&b), "idempotency_in_flight");
    gate.notify_one();
    first.await.unwrap().unwrap();
    assert_eq!(r.up.runs(), 1);
}

#[tokio::test]
async fn the_first_execution_outlives_a_client_that_went_away() {
    let gate = Arc::new(Notify::new());
    let up = Upstream {
        gate: Some(gate.clone()),
        ..Upstream::default()
    };
    let mut r = rig_with(up, IdempotencyMode::Required, |_| {});
    let first = tokio::spawn(r.svc.clone().oneshot(post("sk_a", Some("k1"), "{}")));
    r.up.started.notified().await;
    // the client's connection is cut: its call is dropped
    first.abort();
    let _ = first.await;
    gate.notify_one();
    // the answer is stored once the upstream gives it
    let mut replayed = None;
    for _ in 0..100 {
        let (s, h, b) = send(&mut r, post("sk_a", Some("k1"), "{}")).await;
        if s == 201 {
            replayed = Some((h, b));
            break;
        }
        assert_eq!(s, 409);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (h, b) = replayed.expect("the answer was stored");
    assert_eq!(h[REPLAYED], "true");
    assert_eq!(b, "{\"label\":1}");
    assert_eq!(r.up.runs(), 1);
}

#[tokio::test]
async fn an_answer_too_large_to_keep_is_sent_whole_and_not_run_again() {
    let up = Upstream {
        big: 5000,
        ..Upstream::default()
    };
    let mut r = rig_with(up, IdempotencyMode::Required, |_| {});
    let (s, _, b) = send(&mut r, post("sk_a", Some("k1"), "{}")).await;
    assert_eq!((s, b.len()), (StatusCode::CREATED, 5000));
    let (s, _, b) = send(&mut r, post("sk_a", Some("k1"), "{}")).await;
    assert_eq!(s, 409);
    assert_eq!(problem_type(&b), "idempotency_conflict");
    assert_eq!(r.up.runs(), 1);
    assert!(r.store.bytes() < 5000);
}
