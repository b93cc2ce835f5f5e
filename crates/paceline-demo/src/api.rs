//! A Shiplane-style demo API to put behind the gateway.
//!
//! Why a demo upstream: the gateway's behaviour (what reaches the API, what
//! is shed, what is charged) is best seen against an API that counts what
//! it receives. This one buys labels (idempotently: the same
//! `Idempotency-Key` replays the same label, a different body under the
//! same key is a `409`), buys batches, quotes rates, logs people in and
//! does the race's jobs (`GET /v1/jobs/{id}`), counting them by key. It
//! knows nothing about rate limits: the gateway in front of it does that.
//!
//! ```
//! use paceline_demo::api::{self as demo, DemoOptions};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let api = demo::serve("127.0.0.1:0".parse().unwrap(), DemoOptions::default()).await.unwrap();
//! let cfg = demo::shiplane_config("127.0.0.1:0".parse().unwrap(), api.addr()).unwrap();
//! assert_eq!(cfg.limits.plan_for_key(demo::DEMO_KEYS[0]).unwrap().name(), "free");
//! # });
//! ```

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use paceline_wire::problem::{self, Problem, ProblemKind};
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::net::TcpListener;

use paceline_gateway::{ConfigFileError, GatewayConfig};

/// The example configuration: the Free plan, demo keys and the Shiplane
/// routes (the repository's `examples/shiplane.toml`).
pub const SHIPLANE_TOML: &str = include_str!("../../../examples/shiplane.toml");

/// The demo keys of [`SHIPLANE_TOML`], all on the Free plan.
pub const DEMO_KEYS: [&str; 3] = ["sk_demo_alice", "sk_demo_bob", "sk_demo_carol"];

/// The example configuration, listening on `listen` in front of `upstream`.
pub fn shiplane_config(
    listen: SocketAddr,
    upstream: SocketAddr,
) -> Result<GatewayConfig, ConfigFileError> {
    let mut cfg = GatewayConfig::parse(SHIPLANE_TOML, "examples/shiplane.toml", None)?;
    cfg.settings.listen = listen;
    cfg.settings.upstream = format!("http://{upstream}")
        .parse()
        .expect("a socket address makes a URI");
    cfg.settings.metrics_listen = None;
    cfg.settings.soft_limit_webhook = None;
    Ok(cfg)
}

/// [`shiplane_config`] with the counters in the Redis at `redis_url`
/// (`None`: in memory), keys named under `secret` (the same for every
/// instance that should count as one).
pub fn shiplane_config_in(
    listen: SocketAddr,
    upstream: SocketAddr,
    redis_url: Option<&str>,
    secret: &str,
) -> Result<GatewayConfig, ConfigFileError> {
    let text = match redis_url {
        Some(url) => format!(
            "{}\n[gateway.redis]\nurl = \"{url}\"\ndeadline_ms = {}\n",
            SHIPLANE_TOML.replacen("store = \"memory\"", "store = \"redis\"", 1),
            crate::race::REDIS_DEADLINE_MS
        ),
        None => SHIPLANE_TOML.to_string(),
    };
    let env =
        |var: &str| (var == paceline_gateway::KEY_HASH_SECRET_ENV).then(|| secret.to_string());
    let mut cfg = GatewayConfig::parse_with_env(&text, "examples/shiplane.toml", None, &env)?;
    cfg.settings.listen = listen;
    cfg.settings.upstream = format!("http://{upstream}")
        .parse()
        .expect("a socket address makes a URI");
    cfg.settings.metrics_listen = None;
    cfg.settings.soft_limit_webhook = None;
    Ok(cfg)
}

/// How the demo API behaves.
#[derive(Clone, Debug, Default)]
pub struct DemoOptions {
    /// Added to every answer (to play a slow upstream).
    pub delay: Duration,
}

/// A running demo API.
#[derive(Debug)]
pub struct DemoUpstream {
    addr: SocketAddr,
    state: Arc<Demo>,
    task: tokio::task::JoinHandle<()>,
}

impl DemoUpstream {
    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
    /// Requests received so far.
    pub fn hits(&self) -> u64 {
        self.state.hits.load(Ordering::Relaxed)
    }
    /// Requests received so far on one path.
    pub fn hits_on(&self, path: &str) -> u64 {
        self.state.by_path.lock().get(path).copied().unwrap_or(0)
    }
    /// Requests received so far carrying the API key `key` (as
    /// `Authorization: Bearer`): what the gateway let through for it.
    pub fn hits_by_key(&self, key: &str) -> u64 {
        self.state.by_key.lock().get(key).copied().unwrap_or(0)
    }
    /// When each race job (`/v1/jobs/…`) with the API key `key` arrived,
    /// in order (at most [`MAX_ARRIVALS`] kept per key).
    pub fn job_arrivals(&self, key: &str) -> Vec<std::time::Instant> {
        self.state
            .arrivals
            .lock()
            .get(key)
            .cloned()
            .unwrap_or_default()
    }
    /// Labels created (replays excluded).
    pub fn labels_created(&self) -> u64 {
        self.state.next_label.load(Ordering::Relaxed)
    }
    /// The soft-limit events received on `POST /hooks/soft-limit`.
    pub fn soft_limit_events(&self) -> Vec<Bytes> {
        self.state.events.lock().clone()
    }
    /// From now on, keeps the head fields of the last request received,
    /// for [`last_headers`](Self::last_headers). Off by default: a copy
    /// of every head costs each request more than the rest of its
    /// counting, and more for each field a proxy adds to it.
    pub fn record_headers(&self) {
        self.state.record.store(true, Ordering::Relaxed);
    }
    /// The head fields of the last request received since
    /// [`record_headers`](Self::record_headers) (for checking what a
    /// proxy forwarded).
    pub fn last_headers(&self) -> Option<HeaderMap> {
        self.state.last_headers.lock().clone()
    }
}

impl Drop for DemoUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Debug, Default)]
struct Demo {
    delay: Duration,
    hits: AtomicU64,
    by_path: Mutex<HashMap<String, u64>>,
    /// Requests per bearer key (at most [`MAX_COUNTED_KEYS`] keys apart).
    by_key: Mutex<HashMap<String, u64>>,
    /// Arrival instants of race jobs per bearer key.
    arrivals: Mutex<HashMap<String, Vec<std::time::Instant>>>,
    next_label: AtomicU64,
    /// Idempotency key → (request body, stored answer).
    idempotent: Mutex<HashMap<String, (Bytes, Value)>>,
    /// Whether `last_headers` is kept.
    record: std::sync::atomic::AtomicBool,
    last_headers: Mutex<Option<HeaderMap>>,
    /// Bodies posted to the soft-limit webhook route.
    events: Mutex<Vec<Bytes>>,
}

/// The most API keys (and paths) the demo API counts apart (the rest
/// are not counted by key, or by path).
pub const MAX_COUNTED_KEYS: usize = 1_000;

/// The most race-job arrivals kept per key.
pub const MAX_ARRIVALS: usize = 100_000;

/// Binds `addr` and serves the demo API in the background.
pub async fn serve(addr: SocketAddr, options: DemoOptions) -> io::Result<DemoUpstream> {
    let listener = TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let state = Arc::new(Demo {
        delay: options.delay,
        ..Demo::default()
    });
    let app = router(state.clone());
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "demo API stopped");
        }
    });
    Ok(DemoUpstream { addr, state, task })
}

fn router(state: Arc<Demo>) -> Router {
    Router::new()
        .route("/v1/labels", post(create_label))
        .route("/v1/labels:batch", post(batch))
        .route("/v1/labels/{id}", get(get_label))
        .route("/v1/rates", get(rates))
        .route("/v1/jobs/{id}", get(job))
        .route("/v1/login", post(login))
        .route("/healthz", get(|| async { "ok" }))
        .route("/hooks/soft-limit", post(soft_limit_event))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(state.clone(), count))
        .with_state(state)
}

async fn count(
    State(s): State<Arc<Demo>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    s.hits.fetch_add(1, Ordering::Relaxed);
    {
        // a path seen before is counted without a copy of it; a new one
        // while there is room (a flood of paths does not grow the map for
        // ever)
        let mut by_path = s.by_path.lock();
        let room = by_path.len() < MAX_COUNTED_KEYS;
        match by_path.get_mut(req.uri().path()) {
            Some(n) => *n += 1,
            None if room => {
                by_path.insert(req.uri().path().to_string(), 1);
            }
            None => {}
        }
    }
    if let Some(key) = paceline_server::bearer_token(req.headers()) {
        let mut by_key = s.by_key.lock();
        if let Some(n) = by_key.get_mut(key) {
            *n += 1;
        } else if by_key.len() < MAX_COUNTED_KEYS {
            by_key.insert(key.to_string(), 1);
        }
        drop(by_key);
        if req.uri().path().starts_with("/v1/jobs/") {
            let mut arrivals = s.arrivals.lock();
            if arrivals.len() < MAX_COUNTED_KEYS || arrivals.contains_key(key) {
                let seen = arrivals.entry(key.to_string()).or_default();
                if seen.len() < MAX_ARRIVALS {
                    seen.push(std::time::Instant::now());
                }
            }
        }
    }
    if s.record.load(Ordering::Relaxed) {
        *s.last_headers.lock() = Some(req.headers().clone());
    }
    if !s.delay.is_zero() {
        tokio::time::sleep(s.delay).await;
    }
    next.run(req).await
}

fn label(n: u64) -> Value {
    json!({
        "label_id": format!("lbl_{}", 77_120 + n),
        "tracking_number": format!("1Z999AA1{:010}", 123_456_784 + n),
    })
}

async fn create_label(State(s): State<Arc<Demo>>, headers: HeaderMap, body: Bytes) -> Response {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let Some(key) = key else {
        let n = s.next_label.fetch_add(1, Ordering::Relaxed);
        return (StatusCode::CREATED, Json(label(n))).into_response();
    };
    let mut seen = s.idempotent.lock();
    if let Some((prior_body, answer)) = seen.get(&key) {
        if *prior_body != body {
            return problem(
                ProblemKind::IdempotencyConflict,
                "This Idempotency-Key was used with a different body.",
            );
        }
        let mut r = (StatusCode::CREATED, Json(answer.clone())).into_response();
        r.headers_mut().insert(
            "idempotent-replayed",
            "true".parse().expect("a header value"),
        );
        return r;
    }
    let answer = label(s.next_label.fetch_add(1, Ordering::Relaxed));
    seen.insert(key, (body, answer.clone()));
    (StatusCode::CREATED, Json(answer)).into_response()
}

async fn batch(State(s): State<Arc<Demo>>) -> Json<Value> {
    let first = s.next_label.fetch_add(10, Ordering::Relaxed);
    Json(json!({ "labels": (first..first + 10).map(label).collect::<Vec<_>>() }))
}

async fn get_label(Path(id): Path<String>) -> Response {
    match id.strip_prefix("lbl_").and_then(|n| n.parse::<u64>().ok()) {
        Some(n) if n >= 77_120 => Json(label(n - 77_120)).into_response(),
        _ => problem(ProblemKind::NotFound, "No such label."),
    }
}

async fn rates() -> Json<Value> {
    Json(json!({"rates": [
        {"id": "rate_ups_ground", "carrier": "UPS", "service": "Ground", "amount": "7.45"},
        {"id": "rate_usps_priority", "carrier": "USPS", "service": "Priority", "amount": "8.10"},
    ]}))
}

/// One job of the two-fleet race: done as soon as it arrives.
async fn job(Path(id): Path<u64>) -> Json<Value> {
    Json(json!({ "job": id, "status": "done" }))
}

async fn login() -> Json<Value> {
    Json(json!({"session": "sess_demo", "expires_in_s": 3600}))
}

/// Receives the gateway's soft-limit webhook (to show it firing).
async fn soft_limit_event(State(s): State<Arc<Demo>>, body: Bytes) -> StatusCode {
    s.events.lock().push(body);
    StatusCode::NO_CONTENT
}

async fn not_found() -> Response {
    problem(ProblemKind::NotFound, "No such endpoint.")
}

/// Where the demo API's problem types live.
const PROBLEM_BASE: &str = "https://docs.shiplane.example/errors/";

pub(crate) fn problem(kind: ProblemKind, detail: &str) -> Response {
    problem::answer(&Problem::new(kind, PROBLEM_BASE, detail)).map(axum::body::Body::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_config_is_valid_and_has_the_demo_keys() {
        let cfg = shiplane_config(
            "127.0.0.1:0".parse().unwrap(),
            "127.0.0.1:9".parse().unwrap(),
        )
        .unwrap();
        for k in DEMO_KEYS {
            let plan = cfg.limits.plan_for_key(k).unwrap();
            assert_eq!(plan.name(), "free");
            assert_eq!(
                paceline_wire::emit::policy_field(plan),
                r#""burst";q=20;w=2, "daily";q=10000;w=86400"#
            );
        }
        let batch = cfg
            .limits
            .route(&axum::http::Method::POST, "/v1/labels:batch")
            .unwrap();
        assert_eq!(batch.cost(), 10);
        let login = cfg
            .limits
            .route(&axum::http::Method::POST, "/v1/login")
            .unwrap();
        assert!(login.is_anonymous());
        let rates = cfg
            .limits
            .route(&axum::http::Method::GET, "/v1/rates")
            .unwrap();
        assert_eq!(rates.criticality(), paceline_server::Criticality::Sheddable);
    }

    #[tokio::test]
    async fn heads_are_kept_once_asked_and_paths_counted_within_a_bound() {
        let api = serve(([127, 0, 0, 1], 0).into(), DemoOptions::default())
            .await
            .unwrap();
        let http = reqwest::Client::new();
        let get = |path: String, tag: &'static str| {
            http.get(format!("http://{}{path}", api.addr()))
                .header("x-tag", tag)
                .timeout(Duration::from_secs(5))
                .send()
        };
        assert_eq!(get("/v1/rates".into(), "a").await.unwrap().status(), 200);
        assert!(api.last_headers().is_none(), "not kept unless asked");
        api.record_headers();
        get("/v1/rates".into(), "b").await.unwrap();
        assert_eq!(api.last_headers().unwrap()["x-tag"], "b");
        assert_eq!(api.hits_on("/v1/rates"), 2);
        // a flood of paths: counted apart up to the bound, then not
        for i in 0..MAX_COUNTED_KEYS + 5 {
            get(format!("/nowhere/{i}"), "c").await.unwrap();
        }
        assert_eq!(api.state.by_path.lock().len(), MAX_COUNTED_KEYS);
        assert_eq!(api.hits_on("/v1/rates"), 2);
        assert_eq!(api.hits(), MAX_COUNTED_KEYS as u64 + 7);
    }
}
