//! The two-fleet race over real HTTP, with the real server layer and the
//! real SDK: the race `paceline sim race` runs on virtual time, run live.
//!
//! It takes the simulator's [`RaceParams`] and reports each fleet as the
//! simulator's [`FleetReport`], so the two commands state one race and
//! report it the same way. Two fleets of workers each get their own API key
//! on a token bucket (depth `quota`, refilling `quota` per `window_s`) and
//! the same jobs; one edge with a fixed capacity (`capacity` requests a
//! second, shared fairly) drops what it cannot take. The cooperative fleet
//! sends through the SDK (it reads the headers and paces); the naive fleet
//! sends again every `naive_retry` and ignores `Retry-After`. Everything is
//! counted where a request lands: at the edge.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, Request, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use paceline_core::{Limiter, MemoryStore, Plan, Policy, SystemClock};
use paceline_server::{Limits, RateLimiter};
use paceline_sim::report::{FleetReport, Timeline};
use paceline_sim::scenario::race::RaceParams;
use parking_lot::Mutex;
use reqwest_middleware::ClientWithMiddleware;

use crate::dashboard::{self, Sample};

const FLEETS: [(&str, &str); 2] = [
    ("cooperative", "sk_race_cooperative"),
    ("naive", "sk_race_naive"),
];

/// Live counters of one fleet, as the edge (and its workers) saw them.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) requests: AtomicU64,
    pub(crate) served: AtomicU64,
    pub(crate) rejected_429: AtomicU64,
    pub(crate) rejected_503: AtomicU64,
    pub(crate) dropped: AtomicU64,
    /// Requests a worker sent again after a failed one.
    pub(crate) retries: AtomicU64,
    pub(crate) jobs_done: AtomicU64,
    pub(crate) finished_at_ms: AtomicU64,
    pub(crate) remaining: AtomicU64,
}

/// The whole race's state, shared by the edge, the workers and the page.
pub struct Race {
    pub(crate) params: RaceParams,
    pub(crate) fleets: [Counters; 2],
    started: Mutex<Option<Instant>>,
    pub(crate) samples: Mutex<Vec<Sample>>,
    pub(crate) last_response: Mutex<Vec<(String, String)>>,
    pub(crate) runs: AtomicU64,
    pub(crate) base: Mutex<Option<String>>,
    /// The cooperative fleet's SDK in the current run, for its own counts.
    sdk: Mutex<Option<paceline_client::Client>>,
}

impl Race {
    /// A race on `params` (only `workers`, `jobs`, `quota`, `window_s`,
    /// `capacity` and `naive_retry` apply: the network is real).
    pub fn new(params: RaceParams) -> Arc<Race> {
        Arc::new(Race {
            params,
            fleets: Default::default(),
            started: Mutex::new(None),
            samples: Mutex::new(Vec::new()),
            last_response: Mutex::new(Vec::new()),
            runs: AtomicU64::new(0),
            base: Mutex::new(None),
            sdk: Mutex::new(None),
        })
    }

    /// The race's numbers.
    pub fn params(&self) -> &RaceParams {
        &self.params
    }

    pub(crate) fn elapsed_ms(&self) -> u64 {
        self.started
            .lock()
            .map_or(0, |s| s.elapsed().as_millis() as u64)
    }

    /// Whether a race has started and a fleet still has jobs to do.
    pub(crate) fn running(&self) -> bool {
        self.started.lock().is_some()
            && self
                .fleets
                .iter()
                .any(|c| c.jobs_done.load(Ordering::Relaxed) < self.params.jobs)
    }

    fn fleet_of(&self, req: &Request<Body>) -> Option<usize> {
        let auth = req.headers().get("authorization")?.to_str().ok()?;
        let key = auth.strip_prefix("Bearer ")?;
        FLEETS.iter().position(|(_, k)| *k == key)
    }

    /// The results so far, cooperative first, then naive.
    pub fn results(&self) -> Vec<FleetReport> {
        let sdk = self.sdk.lock().as_ref().map(|s| s.diagnostics());
        FLEETS
            .iter()
            .zip(&self.fleets)
            .enumerate()
            .map(|(i, ((name, _), c))| {
                let done = c.jobs_done.load(Ordering::Relaxed);
                let fin = c.finished_at_ms.load(Ordering::Relaxed);
                // the SDK retries inside the cooperative fleet's requests
                let (sdk_retries, local_drops) = match (&sdk, i) {
                    (Some(d), 0) => (d.retries, d.local_drops),
                    _ => (0, 0),
                };
                FleetReport {
                    name: name.to_string(),
                    jobs: self.params.jobs,
                    jobs_done: done,
                    requests: c.requests.load(Ordering::Relaxed),
                    rejected_429: c.rejected_429.load(Ordering::Relaxed),
                    dropped: c.dropped.load(Ordering::Relaxed),
                    finished_at_s: (done == self.params.jobs).then(|| fin as f64 / 1000.0),
                    rejected_503: c.rejected_503.load(Ordering::Relaxed),
                    retries: c.retries.load(Ordering::Relaxed) + sdk_retries,
                    local_drops,
                    jobs_failed: 0,
                    // no buckets: the page keeps its own time series
                    timeline: Timeline::default(),
                    served: Some(c.served.load(Ordering::Relaxed)),
                    tokens_left: Some(c.remaining.load(Ordering::Relaxed)),
                }
            })
            .collect()
    }

    fn reset(&self) {
        for c in &self.fleets {
            for a in [
                &c.requests,
                &c.served,
                &c.rejected_429,
                &c.rejected_503,
                &c.dropped,
                &c.retries,
                &c.jobs_done,
                &c.finished_at_ms,
            ] {
                a.store(0, Ordering::Relaxed);
            }
            c.remaining.store(self.params.quota, Ordering::Relaxed);
        }
        *self.sdk.lock() = None;
        self.samples.lock().clear();
        self.last_response.lock().clear();
        *self.started.lock() = Some(Instant::now());
    }
}

/// The edge: counts every request, drops what is over capacity, then the
/// rate-limit layer and the API behind it; the dashboard beside them.
pub fn router(race: Arc<Race>) -> Router {
    let p = &race.params;
    let plan = Plan::new(
        "race",
        vec![Policy::token_bucket("burst", p.quota, p.window_s).expect("valid race policy")],
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
    // A capacity of 0 sheds nothing.
    let edge = (p.capacity > 0).then(|| {
        let share = (p.capacity / FLEETS.len() as u64).max(1);
        let edge_plan = Plan::new(
            "edge",
            vec![Policy::token_bucket("capacity", share, 1).expect("valid edge")],
        )
        .expect("valid edge plan");
        Arc::new((Limiter::in_memory(), edge_plan))
    });

    let api = Router::new()
        .route("/v1/jobs/{id}", get(job))
        .layer(limiter.layer())
        .layer(middleware::from_fn_with_state(
            (race.clone(), edge),
            edge_layer,
        ));
    dashboard::routes(race).merge(api)
}

async fn job() -> impl IntoResponse {
    Json(serde_json::json!({ "status": "done" }))
}

type EdgeState = (Arc<Race>, Option<Arc<(Limiter, Plan)>>);

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
    let key = fleet.map_or("anonymous", |f| FLEETS[f].1);
    let over = edge.as_deref().is_some_and(|(limiter, plan)| {
        !limiter
            .check_sync(plan, key, 1)
            .map(|d| d.is_allowed())
            .unwrap_or(true)
    });
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
            503 => {
                c.rejected_503.fetch_add(1, Ordering::Relaxed);
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

/// Binds the race's edge on `listen` and returns the listener and its URL.
pub async fn bind(listen: &str) -> anyhow::Result<(tokio::net::TcpListener, String)> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let url = format!("http://{}", listener.local_addr()?);
    Ok((listener, url))
}

/// Serves the race's API and dashboard on `listener` until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, race: Arc<Race>) {
    let app = router(race).into_make_service_with_connect_info::<SocketAddr>();
    if let Err(e) = axum::serve(listener, app).await {
        eprintln!("paceline: race server stopped: {e}");
    }
}

/// Runs one race against the edge at `base` and returns the results,
/// cooperative first, then naive.
pub async fn run(race: Arc<Race>, base: &str) -> anyhow::Result<Vec<FleetReport>> {
    *race.base.lock() = Some(base.to_string());
    race.reset();
    race.runs.fetch_add(1, Ordering::Relaxed);
    let sampler = tokio::spawn(dashboard::sample(race.clone()));
    let coop = tokio::spawn(cooperative(race.clone(), base.to_string()));
    let naive = tokio::spawn(naive(race.clone(), base.to_string()));
    coop.await??;
    naive.await??;
    sampler.abort();
    dashboard::push_sample(&race);
    Ok(race.results())
}

/// A job queue shared by one fleet's workers.
fn queue(n: u64) -> Arc<Mutex<std::ops::Range<u64>>> {
    Arc::new(Mutex::new(0..n))
}

fn job_done(race: &Race, fleet: usize) {
    let c = &race.fleets[fleet];
    let done = c.jobs_done.fetch_add(1, Ordering::Relaxed) + 1;
    if done == race.params.jobs {
        c.finished_at_ms.store(race.elapsed_ms(), Ordering::Relaxed);
    }
}

/// Runs `fleet`'s workers over its jobs: each job is sent through `http` to
/// the edge at `base` until it succeeds, with `pause` between a failed
/// attempt and the next.
async fn workers(
    race: Arc<Race>,
    fleet: usize,
    http: ClientWithMiddleware,
    base: String,
    pause: Duration,
) -> anyhow::Result<()> {
    let key = FLEETS[fleet].1;
    let jobs = queue(race.params.jobs);
    let workers: Vec<_> = (0..race.params.workers)
        .map(|_| {
            let (race, http, jobs, base) = (race.clone(), http.clone(), jobs.clone(), base.clone());
            tokio::spawn(async move {
                loop {
                    let Some(n) = jobs.lock().next() else { break };
                    loop {
                        let resp = http
                            .get(format!("{base}/v1/jobs/{n}"))
                            .bearer_auth(key)
                            .send()
                            .await;
                        if matches!(&resp, Ok(r) if r.status().is_success()) {
                            break;
                        }
                        tokio::time::sleep(pause).await;
                        race.fleets[fleet].retries.fetch_add(1, Ordering::Relaxed);
                    }
                    job_done(&race, fleet);
                }
            })
        })
        .collect();
    for w in workers {
        w.await?;
    }
    Ok(())
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
    *race.sdk.lock() = Some(sdk.clone());
    let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(PacelineMiddleware::new(sdk))
        .build();
    // the SDK gave up on an attempt (budget, drop, attempts): it paces the
    // next one itself, so the pause is short
    workers(race, 0, http, base, Duration::from_millis(10)).await
}

/// The naive fleet: plain requests, the same pause after any failure.
async fn naive(race: Arc<Race>, base: String) -> anyhow::Result<()> {
    let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new()).build();
    let pause = race.params.naive_retry.as_duration();
    workers(race, 1, http, base, pause).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_before_a_run_are_the_sims_fleets_with_nothing_done() {
        let race = Race::new(RaceParams::default());
        let r = race.results();
        let names: Vec<&str> = r.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["cooperative", "naive"]);
        for f in &r {
            assert_eq!((f.jobs, f.jobs_done, f.requests), (50, 0, 0));
            assert_eq!(f.finished_at_s, None);
            assert_eq!((f.served, f.tokens_left), (Some(0), Some(0)));
            assert!(f.timeline.is_empty());
        }
        assert!(!race.running());
    }
}
