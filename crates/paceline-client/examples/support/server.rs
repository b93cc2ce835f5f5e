//! A small rate-limited API on loopback for the examples and socket tests:
//! `paceline_core::Limiter` decides, `paceline_wire` publishes.

#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Response, StatusCode};
use paceline_core::{Clock, Limiter, MemoryStore, Plan, Policy};
use paceline_wire::{emit, Problem, PROBLEM_CONTENT_TYPE};

/// What the server publishes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Publish {
    /// IETF RateLimit fields, Retry-After and a problem body.
    Full,
    /// Only Retry-After on 429.
    RetryAfterOnly,
    /// A bare 429.
    Bare,
}

/// Counts of what the server saw.
#[derive(Debug, Default)]
pub struct Seen {
    pub requests: AtomicU64,
    pub ok: AtomicU64,
    pub rejected: AtomicU64,
    /// Every rate-limited request: when (seconds on the server's clock) and
    /// the status it got.
    pub log: std::sync::Mutex<Vec<(f64, u16, String)>>,
}

struct App<C: Clock> {
    limiter: Limiter<MemoryStore, C>,
    plan: Plan,
    publish: Publish,
    seen: Arc<Seen>,
}

/// The race's plan: a bucket 8 deep refilling 4 per second.
pub fn race_plan() -> Plan {
    Plan::new("race", vec![Policy::token_bucket("burst", 8, 2).unwrap()]).unwrap()
}

async fn handle<C: Clock + Clone>(
    State(app): State<Arc<App<C>>>,
    uri: axum::http::Uri,
    req_headers: HeaderMap,
) -> Response<Body> {
    let key = req_headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("anonymous");
    if uri.path() == "/v1/usage" {
        return usage(&app, key);
    }
    app.seen.requests.fetch_add(1, Ordering::Relaxed);
    let d = app.limiter.check_sync(&app.plan, key, 1).unwrap();
    let mut headers = HeaderMap::new();
    let (status, body) = if d.is_allowed() {
        app.seen.ok.fetch_add(1, Ordering::Relaxed);
        (StatusCode::OK, Body::from("{\"ok\":true}"))
    } else {
        app.seen.rejected.fetch_add(1, Ordering::Relaxed);
        let body = Problem::from_decision(&app.plan, &d, "https://errors.paceline.test/")
            .map(|p| p.to_json())
            .unwrap_or_default();
        (StatusCode::TOO_MANY_REQUESTS, Body::from(body))
    };
    match app.publish {
        Publish::Full => {
            emit::write_headers(&app.plan, &d, &emit::Dialects::default(), &mut headers)
        }
        Publish::RetryAfterOnly => {
            if let Some(s) = emit::retry_after_secs(&d) {
                headers.insert("retry-after", s.into());
            }
        }
        Publish::Bare => {}
    }
    let mut resp = Response::new(
        if app.publish == Publish::Full || status == StatusCode::OK {
            body
        } else {
            Body::empty()
        },
    );
    *resp.status_mut() = status;
    if status != StatusCode::OK && app.publish == Publish::Full {
        headers.insert("content-type", PROBLEM_CONTENT_TYPE.parse().unwrap());
    }
    resp.headers_mut().extend(headers);
    resp
}

/// `GET /v1/usage`: every policy with what is left, without charging.
fn usage<C: Clock + Clone>(app: &App<C>, key: &str) -> Response<Body> {
    let d = app.limiter.check_sync(&app.plan, key, 0).unwrap();
    let limits: Vec<_> = app
        .plan
        .policies()
        .iter()
        .zip(d.statuses.iter())
        .map(|(p, s)| {
            serde_json::json!({"name": p.name(), "q": p.quota(), "w": p.window_s(), "r": s.remaining, "t": s.reset_secs()})
        })
        .collect();
    let body = serde_json::json!({"plan": app.plan.name(), "limits": limits}).to_string();
    let mut resp = Response::new(Body::from(body));
    resp.headers_mut()
        .insert("cache-control", "no-store".parse().unwrap());
    resp
}

/// Serves `plan` on 127.0.0.1 (a free port) until the runtime ends.
pub async fn spawn<C: Clock + Clone>(
    plan: Plan,
    publish: Publish,
    clock: C,
) -> (SocketAddr, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let app = Arc::new(App {
        limiter: Limiter::new(MemoryStore::new(), clock),
        plan,
        publish,
        seen: seen.clone(),
    });
    let router = axum::Router::new().fallback(handle::<C>).with_state(app);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, router).await.unwrap();
    });
    (addr, seen)
}
