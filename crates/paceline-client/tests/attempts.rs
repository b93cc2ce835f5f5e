//! What the application sees of each attempt: the `Idempotency-Key` and
//! attempt number on the response and in the events; with
//! `final_response`, the last 429 itself when retries are spent; and a
//! clear error when another retrying layer wraps the SDK's. On loopback,
//! on tokio's paused clock.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::Extensions;
use http_body_util::Full;
use hyper_util::client::legacy::Client as Hyper;
use hyper_util::rt::TokioExecutor;
use paceline_client::adapter::reqwest::PacelineMiddleware;
use paceline_client::adapter::tower::PacelineLayer;
use paceline_client::adapter::TokioClock;
use paceline_client::{Attempt, Client, ClientError, Config, Event};
use parking_lot::Mutex;
use reqwest_middleware::{Middleware, Next};
use tower::{Layer, ServiceExt};

/// The key of every request the server saw, by path.
type Seen = Arc<Mutex<Vec<(String, Option<String>)>>>;

/// `/twice` answers a burst 429 twice, then 201; `/always` always 429;
/// `/stored` marks the answer to a key it saw before as a replay; every
/// answer publishes its limit.
async fn spawn() -> (SocketAddr, Seen) {
    async fn answer(State(seen): State<Seen>, uri: Uri, headers: HeaderMap) -> Response {
        let path = uri.path().to_string();
        let key = headers
            .get("idempotency-key")
            .map(|v| v.to_str().unwrap().to_string());
        let before = {
            let mut s = seen.lock();
            let n = s.iter().filter(|(p, _)| *p == path).count();
            s.push((path.clone(), key.clone()));
            n
        };
        if path == "/always" || (path == "/twice" && before < 2) {
            let mut r = (
                StatusCode::TOO_MANY_REQUESTS,
                r#"{"type":"https://e.x/rate_limited","status":429}"#,
            )
                .into_response();
            let h = r.headers_mut();
            h.insert("content-type", "application/problem+json".parse().unwrap());
            h.insert("retry-after", "1".parse().unwrap());
            published(h, 0);
            return r;
        }
        let mut r = (StatusCode::CREATED, "{}").into_response();
        published(r.headers_mut(), 10);
        // a key seen before: the stored answer, marked as a replay
        let again = seen
            .lock()
            .iter()
            .filter(|(_, k)| *k == key && key.is_some())
            .count()
            > 1;
        if path == "/stored" && again {
            r.headers_mut()
                .insert("idempotent-replayed", "true".parse().unwrap());
        }
        r
    }
    let seen: Seen = Arc::default();
    let app = axum::Router::new()
        .fallback(answer)
        .with_state(seen.clone());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    (addr, seen)
}

/// The IETF fields of a bucket of 20 per 2 s with `left` units left.
fn published(h: &mut HeaderMap, left: u32) {
    h.insert("ratelimit-policy", r#""burst";q=20;w=2"#.parse().unwrap());
    let now = format!(r#""burst";r={left};t=1"#);
    h.insert("ratelimit", now.parse().unwrap());
}

fn sdk(final_response: bool) -> Client {
    Client::builder()
        .clock(TokioClock::new())
        .seed(11)
        .config(Config {
            final_response,
            ..Config::default()
        })
        .build()
}

/// What the events told: (kind, attempt number, key).
type Heard = Arc<Mutex<Vec<(&'static str, u32, Option<String>)>>>;

/// Every `Event::Attempt` and `Event::Retry` as (kind, number, key).
fn record(sdk: &Client) -> Heard {
    let heard: Heard = Arc::default();
    let sink = heard.clone();
    sdk.subscribe(move |e| match e {
        Event::Attempt {
            attempt,
            idempotency_key,
            ..
        } => sink
            .lock()
            .push(("attempt", *attempt, idempotency_key.clone())),
        Event::Retry {
            attempt,
            idempotency_key,
            ..
        } => sink
            .lock()
            .push(("retry", *attempt, idempotency_key.clone())),
        _ => {}
    });
    heard
}

#[tokio::test(start_paused = true)]
async fn every_attempt_s_key_is_on_the_response_and_in_the_events() {
    let (addr, seen) = spawn().await;
    let sdk = sdk(false);
    let heard = record(&sdk);
    let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(PacelineMiddleware::new(sdk.clone()))
        .build();
    let resp = http
        .post(format!("http://{addr}/twice"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let attempt = resp.extensions().get::<Attempt>().expect("the attempt");
    assert_eq!(attempt.number, 3);
    let key = attempt.idempotency_key.clone().expect("a POST has a key");
    let sent: Vec<_> = seen.lock().iter().map(|(_, k)| k.clone()).collect();
    assert_eq!(sent, vec![Some(key.clone()); 3]);
    let k = || Some(key.clone());
    assert_eq!(
        *heard.lock(),
        [
            ("attempt", 1, k()),
            ("retry", 1, k()),
            ("attempt", 2, k()),
            ("retry", 2, k()),
            ("attempt", 3, k()),
        ]
    );
    let diag = sdk.diagnostics();
    let scope = &diag.scopes[0];
    assert_eq!(scope.last_attempt.as_ref(), Some(attempt));
    assert_eq!(scope.last_429_attempt.as_ref().map(|a| a.number), Some(2));
    assert_eq!(diag.by_status[&429], 2);
}

#[tokio::test(start_paused = true)]
async fn spent_retries_are_an_error_by_default_and_the_429_with_final_response() {
    let (addr, seen) = spawn().await;
    let url = format!("http://{addr}/always");
    let typed = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(PacelineMiddleware::new(sdk(false)))
        .build();
    let err = typed.post(&url).send().await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "gave up after 3 attempts (last status 429)"
    );
    let reqwest_middleware::Error::Middleware(e) = err else {
        panic!("{err}")
    };
    assert_eq!(
        e.downcast_ref::<ClientError>(),
        Some(&ClientError::RetriesExhausted {
            attempts: 3,
            status: Some(429)
        })
    );
    let last = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(PacelineMiddleware::new(sdk(true)))
        .build();
    let resp = last.post(&url).send().await.unwrap();
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.extensions().get::<Attempt>().unwrap().number, 3);
    assert!(matches!(
        resp.extensions().get::<ClientError>(),
        Some(ClientError::RetriesExhausted { attempts: 3, .. })
    ));
    // the body is still there for the application to read
    assert!(resp.text().await.unwrap().contains("rate_limited"));
    assert_eq!(seen.lock().len(), 6);
}

#[tokio::test(start_paused = true)]
async fn tower_hands_back_the_attempt_and_with_final_response_the_429() {
    let (addr, _seen) = spawn().await;
    for (path, final_response, status) in [("/twice", false, 201), ("/always", true, 429)] {
        let hyper: Hyper<_, Full<Bytes>> = Hyper::builder(TokioExecutor::new()).build_http();
        let svc = PacelineLayer::new(sdk(final_response)).layer(hyper);
        let req = http::Request::post(format!("http://{addr}{path}"))
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        let resp = svc.oneshot(req).await.unwrap();
        assert_eq!(resp.status(), status);
        let attempt = resp.extensions().get::<Attempt>().unwrap();
        assert_eq!(attempt.number, 3);
        assert!(attempt.idempotency_key.is_some());
    }
}

/// A naive retrying layer: sends again on a 429, up to three times.
struct RetryOn429;

#[async_trait::async_trait]
impl Middleware for RetryOn429 {
    async fn handle(
        &self,
        req: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let mut last = None;
        for _ in 0..3 {
            let r = next
                .clone()
                .run(req.try_clone().unwrap(), extensions)
                .await?;
            if r.status() != 429 {
                return Ok(r);
            }
            last = Some(r);
        }
        Ok(last.unwrap())
    }
}

#[tokio::test(start_paused = true)]
async fn a_retrying_layer_around_the_sdk_is_a_clear_error() {
    let (addr, seen) = spawn().await;
    let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(RetryOn429)
        .with(PacelineMiddleware::new(sdk(true)))
        .build();
    let err = http
        .post(format!("http://{addr}/always"))
        .send()
        .await
        .unwrap_err();
    let reqwest_middleware::Error::Middleware(e) = &err else {
        panic!("{err}")
    };
    assert_eq!(
        e.downcast_ref::<ClientError>(),
        Some(&ClientError::NestedRetry { status: 429 })
    );
    assert!(err.to_string().contains("reqwest-retry"), "{err}");
    // the SDK's three attempts, not three times three
    assert_eq!(seen.lock().len(), 3);
}

/// A layer that sends every request twice (as a retrying layer does after
/// a lost answer) and hands back the second answer.
struct SendTwice;

#[async_trait::async_trait]
impl Middleware for SendTwice {
    async fn handle(
        &self,
        req: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let first = req.try_clone().unwrap();
        next.clone().run(first, extensions).await?;
        next.run(req, extensions).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_resending_layer_inside_the_sdk_s_is_told() {
    let (addr, seen) = spawn().await;
    let url = format!("http://{addr}/stored");
    let alone = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(PacelineMiddleware::new(sdk(false)))
        .build();
    assert_eq!(alone.post(&url).send().await.unwrap().status(), 201);
    // a key the application chose may be a replay: that is what it is for
    let again = alone
        .post(&url)
        .header("idempotency-key", "order-1")
        .send()
        .await
        .unwrap();
    let replay = alone
        .post(&url)
        .header("idempotency-key", "order-1")
        .send()
        .await
        .unwrap();
    assert!(again.headers().get("idempotent-replayed").is_none());
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    seen.lock().clear();
    let inside = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(PacelineMiddleware::new(sdk(false)))
        .with(SendTwice)
        .build();
    let told = tokio::spawn(async move { inside.post(&url).send().await.map(|r| r.status()) });
    let outcome = told.await;
    if cfg!(debug_assertions) {
        let panic = outcome.unwrap_err().into_panic();
        let message = panic.downcast_ref::<String>().unwrap();
        assert!(
            message.contains("retrying middleware added after paceline's"),
            "{message}"
        );
    } else {
        // release builds only warn
        assert_eq!(outcome.unwrap().unwrap(), 201);
    }
    assert_eq!(seen.lock().len(), 2);
}
