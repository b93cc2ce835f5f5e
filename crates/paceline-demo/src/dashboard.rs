//! The race's live dashboard: the page (`dashboard/race.html`, embedded in
//! the binary), the state it polls (`/race.json`) and the button that runs
//! the race again (`/race/run`), kept apart from the race they show.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse};
use axum::routing::{get, post};
use axum::{Json, Router};
use paceline_sim::report::FleetReport;
use serde::Serialize;

use crate::race::{self, Race};

/// A point of the page's time series.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Sample {
    t_s: f64,
    fleets: [[u64; 3]; 2], // served, 429, dropped (cumulative)
}

/// The race's numbers as the page shows them.
#[derive(Serialize)]
struct Shown {
    depth: u64,
    refill_per_s: f64,
    capacity_per_s: u64,
}

/// What `/race.json` answers.
#[derive(Serialize)]
struct Snapshot {
    config: Shown,
    floor_s: f64,
    running: bool,
    runs: u64,
    elapsed_s: f64,
    fleets: Vec<FleetReport>,
    samples: Vec<Sample>,
    last_response: Vec<(String, String)>,
}

fn snapshot(race: &Race) -> Snapshot {
    let p = race.params();
    Snapshot {
        config: Shown {
            depth: p.quota,
            refill_per_s: p.rate_per_s(),
            capacity_per_s: p.capacity,
        },
        floor_s: p.floor_s(),
        running: race.running(),
        runs: race.runs.load(Ordering::Relaxed),
        elapsed_s: race.elapsed_ms() as f64 / 1000.0,
        fleets: race.results(),
        samples: race.samples.lock().clone(),
        last_response: race.last_response.lock().clone(),
    }
}

/// The page, its state and its button.
pub(crate) fn routes(race: Arc<Race>) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/race.json", get(state))
        .route("/race/run", post(rerun))
        .with_state(race)
}

async fn page() -> Html<&'static str> {
    Html(include_str!("dashboard/race.html"))
}

async fn state(State(race): State<Arc<Race>>) -> impl IntoResponse {
    let mut resp = Json(snapshot(&race)).into_response();
    resp.headers_mut()
        .insert("cache-control", HeaderValue::from_static("no-store"));
    resp
}

/// Starts another race unless one is running.
async fn rerun(State(race): State<Arc<Race>>) -> StatusCode {
    let base = race.base.lock().clone();
    match base {
        Some(base) if !race.running() => {
            tokio::spawn(async move {
                if let Err(e) = race::run(race, &base).await {
                    eprintln!("paceline: race failed: {e:#}");
                }
            });
            StatusCode::ACCEPTED
        }
        _ => StatusCode::CONFLICT,
    }
}

/// Adds a point to the page's time series.
pub(crate) fn push_sample(race: &Race) {
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

/// Adds a point every 250 ms until aborted.
pub(crate) async fn sample(race: Arc<Race>) {
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tick.tick().await;
        push_sample(&race);
    }
}
