//! The two-fleet race over real HTTP, with the real server layer and the
//! real SDK, and the live dashboard that shows it.
//!
//! Two fleets of workers each get their own API key on a token bucket (depth
//! 8, refilling 4/s) and the same jobs; one edge with a fixed capacity (40
//! requests a second, shared) drops what it cannot take. The cooperative
//! fleet sends through the SDK (it reads the headers and paces); the naive
//! fleet retries every 100 ms and ignores `Retry-After`. Everything is
//! counted where a request lands: at the edge.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, Request, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use paceline_core::{Limiter, MemoryStore, Plan, Policy, SystemClock};
use paceline_server::{Limits, RateLimiter};
use parking_lot::Mutex;
use serde::Serialize;

/// The race's numbers; the defaults are the design document's.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct RaceConfig {
    /// Workers per fleet.
    pub(crate) workers: usize,
    /// Jobs per fleet.
    pub(crate) jobs: usize,
    /// Token-bucket depth per key.
    pub(crate) depth: u64,
    /// Refill per second per key.
    pub(crate) refill_per_s: u64,
    /// Requests per second the edge takes before dropping, all keys.
    pub(crate) capacity_per_s: u64,
    /// The naive fleet's fixed retry interval.
    pub(crate) naive_retry_ms: u64,
}

impl Default for RaceConfig {
    fn default() -> Self {
        RaceConfig {
            workers: 10,
            jobs: 50,
            depth: 8,
            refill_per_s: 4,
            capacity_per_s: 40,
            naive_retry_ms: 100,
        }
    }
}

impl RaceConfig {
    /// The floor: `depth` at once, the rest at the refill rate.
    pub(crate) fn floor_s(&self) -> f64 {
        let rest = self.jobs.saturating_sub(self.depth as usize) as f64;
        rest / self.refill_per_s as f64
    }
}

const FLEETS: [(&str, &str); 2] = [
    ("cooperative", "sk_race_cooperative"),
    ("naive", "sk_race_naive"),
];

/// Live counters of one fleet, as the edge saw them.
#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    served: AtomicU64,
    rejected_429: AtomicU64,
    dropped: AtomicU64,
    jobs_done: AtomicU64,
    finished_at_ms: AtomicU64,
    remaining: AtomicU64,
}

/// One fleet's result (the JSON shape `paceline sim race` shares).
#[derive(Clone, Debug, Serialize)]
pub(crate) struct FleetResult {
    pub(crate) name: String,
    pub(crate) jobs: u64,
    pub(crate) jobs_done: u64,
    pub(crate) requests: u64,
    pub(crate) served: u64,
    pub(crate) rejected_429: u64,
    pub(crate) dropped: u64,
    pub(crate) finished_at_s: Option<f64>,
    pub(crate) tokens_left: u64,
}

/// A point of the dashboard's time series.
#[derive(Clone, Debug, Serialize)]
struct Sample {
    t_s: f64,
    fleets: [[u64; 3]; 2], // served, 429, dropped (cumulative)
}

/// The whole race's state, shared by the edge, the workers and the page.
pub(crate) struct Race {
    cfg: RaceConfig,
    fleets: [Counters; 2],
    started: Mutex<Option<Instant>>,
    samples: Mutex<Vec<Sample>>,
    last_response: Mutex<Vec<(String, String)>>,
    runs: AtomicU64,
    base: Mutex<Option<String>>,
}

/// What `/race.json` answers.
#[derive(Serialize)]
struct Snapshot {
    config: RaceConfig,
    floor_s: f64,
    running: bool,
    runs: u64,
    elapsed_s: f64,
    fleets: Vec<FleetResult>,
    samples: Vec<Sample>,
    last_response: Vec<(String, String)>,
}

impl Race {
    pub(crate) fn new(cfg: RaceConfig) -> Arc<Race> {
        Arc::new(Race {
            cfg,
            fleets: Default::default(),
            started: Mutex::new(None),
            samples: Mutex::new(Vec::new()),
            last_response: Mutex::new(Vec::new()),
            runs: AtomicU64::new(0),
            base: Mutex::new(None),
        })
    }

    fn elapsed_ms(&self) -> u64 {
        self.started
            .lock()
            .map_or(0, |s| s.elapsed().as_millis() as u64)
    }

    fn fleet_of(&self, req: &Request<Body>) -> Option<usize> {
        let auth = req.headers().get("authorization")?.to_str().ok()?;
        let key = auth.strip_prefix("Bearer ")?;
        FLEETS.iter().position(|(_, k)| *k == key)
    }

    /// The results so far.
    pub(crate) fn results(&self) -> Vec<FleetResult> {
        FLEETS
            .iter()
            .zip(&self.fleets)
            .map(|((name, _), c)| {
                let done = c.jobs_done.load(Ordering::Relaxed);
                let fin = c.finished_at_ms.load(Ordering::Relaxed);
                FleetResult {
                    name: name.to_string(),
                    jobs: self.cfg.jobs as u64,
                    jobs_done: done,
                    requests: c.requests.load(Ordering::Relaxed),
                    served: c.served.load(Ordering::Relaxed),
                    rejected_429: c.rejected_429.load(Ordering::Relaxed),
                    dropped: c.dropped.load(Ordering::Relaxed),
                    finished_at_s: (done == self.cfg.jobs as u64).then(|| fin as f64 / 1000.0),
                    tokens_left: c.remaining.load(Ordering::Relaxed),
                }
            })
            .collect()
    }

    fn snapshot(&self) -> Snapshot {
        let running = self.started.lock().is_some()
            && self
                .fleets
                .iter()
                .any(|c| c.jobs_done.load(Ordering::Relaxed) < self.cfg.jobs as u64);
        Snapshot {
            config: self.cfg.clone(),
            floor_s: self.cfg.floor_s(),
            running,
            runs: self.runs.load(Ordering::Relaxed),
            elapsed_s: self.elapsed_ms() as f64 / 1000.0,
            fleets: self.results(),
            samples: self.samples.lock().clone(),
            last_response: self.last_response.lock().clone(),
        }
    }

    fn reset(&self) {
        for c in &self.fleets {
            for a in [
                &c.requests,
                &c.served,
                &c.rejected_429,
                &c.dropped,
                &c.jobs_done,
                &c.finished_at_ms,
            ] {
                a.store(0, Ordering::Relaxed);
            }
            c.remaining.store(self.cfg.depth, Ordering::Relaxed);
        }
        self.samples.lock().clear();
        self.last_response.lock().clear();
        *self.started.lock() = Some(Instant::now());
    }
}

/// The edge: counts every request, drops what is over capacity, then the
/// rate-limit layer and the API behind it.
pub(crate) fn race_router(race: Arc<Race>) -> Router {
    let plan = Plan::new(
        "race",
        vec![Policy::token_bucket(
            "burst",
            race.cfg.depth,
            (race.cfg.depth / race.cfg.refill_per_s).max(1),
        )
        .expect("valid race policy")],
    )
    .expect("valid race plan");
    // the race shows pacing, not punishment: escalation would block the
    // naive fleet outright
    let mut limits = Limits::builder()
        .plan(plan)
        .escalation(paceline_server::EscalationConfig {
            enabled: false,
            ..Default::default()
        });
    for (_, key) in FLEETS {
        limits = limits.key(key, "race");
    }
    let limits = limits.build().expect("valid race limits");
    let limiter = RateLimiter::new(limits, MemoryStore::new(), SystemClock::new());
    // The edge sheds the heaviest caller: each key may use its fair share of
    // the capacity, so a flood from one key does not drop another's calls.
    let share = (race.cfg.capacity_per_s / FLEETS.len() as u64).max(1);
    let edge_plan = Plan::new(
        "edge",
        vec![Policy::token_bucket("capacity", share, 1).expect("valid edge")],
    )
    .expect("valid edge plan");
    let edge = Arc::new((Limiter::in_memory(), edge_plan));

    let api = Router::new()
        .route("/v1/jobs/{id}", get(job))
        .layer(limiter.layer())
        .layer(middleware::from_fn_with_state(
            (race.clone(), edge),
            edge_layer,
        ));
    Router::new()
        .route("/", get(dashboard))
        .route("/race.json", get(state))
        .route("/race/run", axum::routing::post(rerun))
        .with_state(race)
        .merge(api)
}

async fn job() -> impl IntoResponse {
    Json(serde_json::json!({ "status": "done" }))
}

type EdgeState = (Arc<Race>, Arc<(Limiter, Plan)>);

async fn edge_layer(
    State((race, edge)): State<EdgeState>,
    req: Request<Body>,
    next: Next,
) -> Response {
    // the usage endpoint costs no quota and is not part of the jobs
    let fleet = race
        .fleet_of(&req)
        .filter(|_| req.uri().path().starts_with("/v1/jobs/"));
    if let Some(f) = fleet {
        race.fleets[f].requests.fetch_add(1, Ordering::Relaxed);
    }
    let (limiter, plan) = &*edge;
    let key = fleet.map_or("anonymous", |f| FLEETS[f].1);
    let over = !limiter
        .check_sync(plan, key, 1)
        .map(|d| d.is_allowed())
        .unwrap_or(true);
    if over {
        if let Some(f) = fleet {
            race.fleets[f].dropped.fetch_add(1, Ordering::Relaxed);
        }
        let mut resp = (StatusCode::SERVICE_UNAVAILABLE, "edge at capacity").into_response();
        resp.headers_mut()
            .insert("retry-after", HeaderValue::from_static("1"));
        return resp;
    }
    let resp = next.run(req).await;
    if let Some(f) = fleet {
        let c = &race.fleets[f];
        match resp.status().as_u16() {
            429 => {
                c.rejected_429.fetch_add(1, Ordering::Relaxed);
            }
            200..=299 => {
                c.served.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
        if let Some(r) = remaining(&resp) {
            c.remaining.store(r, Ordering::Relaxed);
        }
        if f == 0 {
            *race.last_response.lock() =
                std::iter::once(("status".to_string(), resp.status().as_u16().to_string()))
                    .chain(resp.headers().iter().filter_map(|(k, v)| {
                        let k = k.as_str();
                        (k.starts_with("ratelimit") || k == "retry-after")
                            .then(|| (k.to_string(), v.to_str().unwrap_or("").to_string()))
                    }))
                    .collect();
        }
    }
    resp
}

/// What is left of the key's bucket, as a client reads the response.
fn remaining(resp: &Response) -> Option<u64> {
    let now = paceline_core::Nanos::from_system_time(std::time::SystemTime::now());
    paceline_wire::parse::parse_response(resp.status().as_u16(), resp.headers(), None, now)
        .remaining
}

async fn state(State(race): State<Arc<Race>>) -> impl IntoResponse {
    let mut resp = Json(race.snapshot()).into_response();
    resp.headers_mut()
        .insert("cache-control", HeaderValue::from_static("no-store"));
    resp
}

/// Starts another race unless one is running.
async fn rerun(State(race): State<Arc<Race>>) -> StatusCode {
    let base = race.base.lock().clone();
    match base {
        Some(base) if !race.snapshot().running => {
            tokio::spawn(async move {
                if let Err(e) = run(race, &base).await {
                    eprintln!("paceline: race failed: {e:#}");
                }
            });
            StatusCode::ACCEPTED
        }
        _ => StatusCode::CONFLICT,
    }
}

async fn dashboard() -> Html<&'static str> {
    Html(include_str!("race.html"))
}

/// Serves the race's API and dashboard on `listener` until the process ends.
pub(crate) async fn serve(listener: tokio::net::TcpListener, race: Arc<Race>) {
    let app = race_router(race).into_make_service_with_connect_info::<SocketAddr>();
    if let Err(e) = axum::serve(listener, app).await {
        eprintln!("paceline: race server stopped: {e}");
    }
}

/// Runs one race against the edge at `base` and returns the results.
pub(crate) async fn run(race: Arc<Race>, base: &str) -> anyhow::Result<Vec<FleetResult>> {
    *race.base.lock() = Some(base.to_string());
    race.reset();
    race.runs.fetch_add(1, Ordering::Relaxed);
    let sampler = tokio::spawn(sample(race.clone()));
    let coop = tokio::spawn(cooperative(race.clone(), base.to_string()));
    let naive = tokio::spawn(naive(race.clone(), base.to_string()));
    coop.await??;
    naive.await??;
    sampler.abort();
    push_sample(&race);
    Ok(race.results())
}

fn push_sample(race: &Race) {
    let fleets = [0, 1].map(|f| {
        let c = &race.fleets[f];
        [
            c.served.load(Ordering::Relaxed),
            c.rejected_429.load(Ordering::Relaxed),
            c.dropped.load(Ordering::Relaxed),
        ]
    });
    let t_s = race.elapsed_ms() as f64 / 1000.0;
    race.samples.lock().push(Sample { t_s, fleets });
}

async fn sample(race: Arc<Race>) {
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tick.tick().await;
        push_sample(&race);
    }
}

/// A job queue shared by one fleet's workers.
fn queue(n: usize) -> Arc<Mutex<std::ops::Range<usize>>> {
    Arc::new(Mutex::new(0..n))
}

fn job_done(race: &Race, fleet: usize) {
    let c = &race.fleets[fleet];
    let done = c.jobs_done.fetch_add(1, Ordering::Relaxed) + 1;
    if done == race.cfg.jobs as u64 {
        c.finished_at_ms.store(race.elapsed_ms(), Ordering::Relaxed);
    }
}

async fn cooperative(race: Arc<Race>, base: String) -> anyhow::Result<()> {
    use paceline_client::adapter::reqwest::PacelineMiddleware;
    let sdk = paceline_client::Client::builder()
        .clock(paceline_client::adapter::TokioClock::new())
        .build();
    // seed the mirrored bucket from the usage endpoint, so the first wave
    // already knows the depth
    let usage = reqwest::Client::new()
        .get(format!("{base}/v1/usage"))
        .bearer_auth(FLEETS[0].1)
        .send()
        .await?
        .bytes()
        .await?;
    let scope = base.trim_start_matches("http://").to_string();
    sdk.seed_usage(&scope, &usage)
        .map_err(|e| anyhow::anyhow!("usage endpoint: {e}"))?;
    let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(PacelineMiddleware::new(sdk))
        .build();
    let jobs = queue(race.cfg.jobs);
    let workers: Vec<_> = (0..race.cfg.workers)
        .map(|_| {
            let (race, http, jobs, base) = (race.clone(), http.clone(), jobs.clone(), base.clone());
            tokio::spawn(async move {
                loop {
                    let Some(n) = jobs.lock().next() else { break };
                    loop {
                        let resp = http
                            .get(format!("{base}/v1/jobs/{n}"))
                            .bearer_auth(FLEETS[0].1)
                            .send()
                            .await;
                        match resp {
                            Ok(r) if r.status().is_success() => break,
                            // the SDK gave up on this attempt (budget, drop,
                            // attempts): it paces the next one itself
                            Ok(_) | Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                        }
                    }
                    job_done(&race, 0);
                }
            })
        })
        .collect();
    for w in workers {
        w.await?;
    }
    Ok(())
}

async fn naive(race: Arc<Race>, base: String) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let jobs = queue(race.cfg.jobs);
    let retry = Duration::from_millis(race.cfg.naive_retry_ms);
    let workers: Vec<_> = (0..race.cfg.workers)
        .map(|_| {
            let (race, http, jobs, base) = (race.clone(), http.clone(), jobs.clone(), base.clone());
            tokio::spawn(async move {
                loop {
                    let Some(n) = jobs.lock().next() else { break };
                    loop {
                        let resp = http
                            .get(format!("{base}/v1/jobs/{n}"))
                            .bearer_auth(FLEETS[1].1)
                            .send()
                            .await;
                        if matches!(&resp, Ok(r) if r.status().is_success()) {
                            break;
                        }
                        tokio::time::sleep(retry).await;
                    }
                    job_done(&race, 1);
                }
            })
        })
        .collect();
    for w in workers {
        w.await?;
    }
    Ok(())
}

/// The result table, as people read it.
pub(crate) fn table(results: &[FleetResult], floor_s: f64) -> String {
    let mut out = String::new();
    let row = |label: &str, f: &dyn Fn(&FleetResult) -> String| {
        let mut s = format!("{label:<22}");
        for r in results {
            s.push_str(&format!("{:>14}", f(r)));
        }
        s.push('\n');
        s
    };
    out.push_str(&row("measure", &|r| r.name.clone()));
    out.push_str(&row("jobs done", &|r| {
        format!("{}/{}", r.jobs_done, r.jobs)
    }));
    out.push_str(&row("requests sent", &|r| r.requests.to_string()));
    out.push_str(&row("rejected 429", &|r| r.rejected_429.to_string()));
    out.push_str(&row("dropped at the edge", &|r| r.dropped.to_string()));
    out.push_str(&row("finished at", &|r| {
        r.finished_at_s
            .map_or("-".to_string(), |s| format!("{s:.2} s"))
    }));
    out.push_str(&format!("floor for the jobs: {floor_s:.1} s\n"));
    out
}

/// Binds the race's edge on `listen` and returns the listener and its URL.
pub(crate) async fn bind(listen: &str) -> anyhow::Result<(tokio::net::TcpListener, String)> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let url = format!("http://{}", listener.local_addr()?);
    Ok((listener, url))
}
