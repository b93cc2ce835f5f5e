//! One `Idempotency-Key` per logical call, the same on every retry, for
//! POST and PATCH through both adapters; a 409 with a wait (the same key
//! still in flight) is retried with that key, and a conflict (409 or 422
//! without a wait) reaches the application after one attempt. On
//! loopback, on tokio's paused clock.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client as Hyper;
use hyper_util::rt::TokioExecutor;
use paceline_client::adapter::reqwest::PacelineMiddleware;
use paceline_client::adapter::tower::PacelineLayer;
use paceline_client::adapter::TokioClock;
use paceline_client::Client;
use tower::{Layer, ServiceExt};

/// What the server saw: (method, path, key) of every request.
type Seen = Arc<parking_lot::Mutex<Vec<(String, String, Option<String>)>>>;

/// Answers by path: `/flaky` 503 once, `/inflight` 409 with a wait once,
/// `/conflict` always 409, `/unprocessable` always 422, the rest 201.
async fn spawn() -> (SocketAddr, Seen) {
    let seen: Seen = Arc::default();
    async fn answer(
        State(seen): State<Seen>,
        method: Method,
        uri: Uri,
        headers: HeaderMap,
    ) -> Response {
        let path = uri.path().to_string();
        let key = headers
            .get("idempotency-key")
            .map(|v| v.to_str().unwrap().to_string());
        let first = {
            let mut s = seen.lock();
            let first = !s
                .iter()
                .any(|(m, p, _)| *m == method.as_str() && *p == path);
            s.push((method.to_string(), path.clone(), key));
            first
        };
        let problem = |status: u16, code: &str, wait: bool| {
            let mut r = (
                StatusCode::from_u16(status).unwrap(),
                format!(r#"{{"type":"https://e.x/{code}","status":{status}}}"#),
            )
                .into_response();
            r.headers_mut()
                .insert("content-type", "application/problem+json".parse().unwrap());
            if wait {
                r.headers_mut().insert("retry-after", "1".parse().unwrap());
            }
            r
        };
        match path.as_str() {
            "/flaky" if first => problem(503, "overloaded", true),
            "/inflight" if first => problem(409, "idempotency_in_flight", true),
            "/conflict" => problem(409, "idempotency_conflict", false),
            "/unprocessable" => problem(422, "idempotency_conflict", false),
            _ => (StatusCode::CREATED, "{}").into_response(),
        }
    }
    let app = axum::Router::new()
        .fallback(answer)
        .with_state(seen.clone());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    (addr, seen)
}

fn keys(seen: &Seen, method: &str, path: &str) -> Vec<Option<String>> {
    seen.lock()
        .iter()
        .filter(|(m, p, _)| m == method && p == path)
        .map(|(_, _, k)| k.clone())
        .collect()
}

/// Every request of `path` carried one key, the same, `n` times.
fn one_key(seen: &Seen, method: &str, path: &str, n: usize) -> String {
    let k = keys(seen, method, path);
    assert_eq!(k.len(), n, "{method} {path}: {k:?}");
    let first = k[0].clone().expect("a key");
    assert!(
        k.iter().all(|x| x.as_deref() == Some(first.as_str())),
        "{k:?}"
    );
    first
}

fn sdk() -> Client {
    Client::builder().clock(TokioClock::new()).seed(7).build()
}

/// The statuses the application got, in order: `/flaky`, `/inflight`,
/// `/conflict`, `/unprocessable`, and `/flaky` again (a second call).
const PATHS: [&str; 4] = ["/flaky", "/inflight", "/conflict", "/unprocessable"];

fn check(seen: &Seen, method: &str, statuses: &[u16]) {
    assert_eq!(statuses, [201, 201, 409, 422, 201], "{method}");
    let flaky = keys(seen, method, "/flaky");
    assert_eq!(flaky.len(), 3, "{method}: {flaky:?}");
    // a retry reuses the key; a new call has its own
    assert_eq!(flaky[0], flaky[1]);
    assert_ne!(flaky[1], flaky[2]);
    assert!(flaky.iter().all(Option::is_some));
    one_key(seen, method, "/inflight", 2);
    // a conflict is the application's to see: one attempt, no retry
    one_key(seen, method, "/conflict", 1);
    one_key(seen, method, "/unprocessable", 1);
}

#[tokio::test(start_paused = true)]
async fn reqwest_sends_one_key_per_call_and_reuses_it() {
    let (addr, seen) = spawn().await;
    for method in [reqwest::Method::POST, reqwest::Method::PATCH] {
        let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
            .with(PacelineMiddleware::new(sdk()))
            .build();
        let mut statuses = Vec::new();
        for path in PATHS.iter().chain(&["/flaky"]) {
            let r = http
                .request(method.clone(), format!("http://{addr}{path}"))
                .body("{}")
                .send()
                .await
                .unwrap();
            statuses.push(r.status().as_u16());
        }
        check(&seen, method.as_str(), &statuses);
        seen.lock().clear();
    }
}

#[tokio::test(start_paused = true)]
async fn tower_sends_one_key_per_call_and_reuses_it() {
    let (addr, seen) = spawn().await;
    for method in [Method::POST, Method::PATCH] {
        let hyper: Hyper<_, Full<Bytes>> = Hyper::builder(TokioExecutor::new()).build_http();
        let svc = PacelineLayer::new(sdk()).layer(hyper);
        let mut statuses = Vec::new();
        for path in PATHS.iter().chain(&["/flaky"]) {
            let req = http::Request::builder()
                .method(method.clone())
                .uri(format!("http://{addr}{path}"))
                .body(Full::new(Bytes::from_static(b"{}")))
                .unwrap();
            let r = svc.clone().oneshot(req).await.unwrap();
            statuses.push(r.status().as_u16());
        }
        check(&seen, method.as_str(), &statuses);
        seen.lock().clear();
    }
}

#[tokio::test(start_paused = true)]
async fn a_key_the_application_chose_is_kept() {
    let (addr, seen) = spawn().await;
    let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(PacelineMiddleware::new(sdk()))
        .build();
    let r = http
        .post(format!("http://{addr}/flaky"))
        .header("idempotency-key", "order-4711")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    assert_eq!(one_key(&seen, "POST", "/flaky", 2), "order-4711");
    // a GET has none
    http.get(format!("http://{addr}/x")).send().await.unwrap();
    assert_eq!(keys(&seen, "GET", "/x"), [None]);
}
