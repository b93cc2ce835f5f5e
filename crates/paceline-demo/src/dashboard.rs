//! The race's live dashboard: the pages (`dashboard/*.html`, `*.js`,
//! `*.css`, embedded in the binary: no build step), the feed they listen
//! to (`/race/events`, server-sent events pushed as the race runs), the
//! controls (`/race/controls`, `/race/run`), the last run's numbers
//! (`/race.json`) and the simulator's herd and export (`/sim.json`).

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use http_body::Frame;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::race::{self, Controls, Race, CONTROL_BOUNDS};

/// The page, its feed, its controls and its numbers.
pub(crate) fn routes(race: Arc<Race>) -> Router {
    Router::new()
        .route("/", get(|| page(include_str!("dashboard/race.html"))))
        .route("/sim", get(|| page(include_str!("dashboard/sim.html"))))
        .route(
            "/race.js",
            get(|| script(include_str!("dashboard/race.js"))),
        )
        .route("/sim.js", get(|| script(include_str!("dashboard/sim.js"))))
        .route(
            "/plot.js",
            get(|| script(include_str!("dashboard/plot.js"))),
        )
        .route("/style.css", get(style))
        .route("/race.json", get(state))
        .route("/race/events", get(events))
        .route("/race/controls", post(controls))
        .route("/race/run", post(rerun))
        .route("/sim.json", get(sim))
        .with_state(race)
}

async fn page(html: &'static str) -> Html<&'static str> {
    Html(html)
}

async fn script(js: &'static str) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        js,
    )
}

async fn style() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("dashboard/style.css"),
    )
}

fn no_store(mut resp: Response) -> Response {
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// Everything a page needs to draw the race as it stands.
pub(crate) fn hello(race: &Race) -> Value {
    let p = race.params();
    let run = race.last_run();
    let (ticks, last, results) = match &run {
        Some(r) => (
            json!(*r.ticks.lock()),
            json!(*r.last_response.lock()),
            json!(*r.results.lock()),
        ),
        None => (json!([]), Value::Null, Value::Null),
    };
    json!({
        "type": "hello",
        "controls": Controls::of(&p),
        "bounds": CONTROL_BOUNDS.iter().map(|(n, lo, hi)| json!({"name": n, "min": lo, "max": hi})).collect::<Vec<_>>(),
        "capacity_per_s": p.capacity,
        "jobs": p.jobs,
        "naive_retry_ms": p.naive_retry.as_u64() / 1_000_000,
        "floor_s": p.floor_s(),
        "instances": race.deployment().instances,
        "store": race.deployment().store(),
        "running": race.is_running(),
        "runs": race.runs(),
        "run": run.as_ref().map(|r| json!({
            "controls": Controls::of(&r.params),
            "floor_s": r.params.floor_s(),
            "ticks": ticks,
            "last_response": last,
            "fleets": results,
            "admitted": json!(*r.admitted.lock()),
            "table": r.results.lock().as_ref().map(|f| paceline_sim::scenario::race::table(f)),
        })),
    })
}

async fn state(State(race): State<Arc<Race>>) -> Response {
    let mut v = hello(&race);
    v["fleets"] = json!(race.results());
    no_store(Json(v).into_response())
}

/// The feed: a `hello` with the state so far, then every message of the
/// race as it is sent. A page too slow to keep up is let go (its
/// `EventSource` connects again and is sent a new `hello`).
async fn events(State(race): State<Arc<Race>>) -> Response {
    let rx = race.subscribe();
    let first = sse(&hello(&race).to_string());
    let body = Body::new(Feed {
        rx,
        first: Some(first),
    });
    let resp = Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header("x-accel-buffering", "no")
        .body(body)
        .expect("a valid response");
    no_store(resp)
}

fn sse(data: &str) -> Bytes {
    Bytes::from(format!("data: {data}\n\n"))
}

/// The feed's body: server-sent events from the page's channel.
struct Feed {
    rx: mpsc::Receiver<Arc<str>>,
    first: Option<Bytes>,
}

impl http_body::Body for Feed {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        self.rx
            .poll_recv(cx)
            .map(|msg| msg.map(|m| Ok(Frame::data(sse(&m)))))
    }
}

/// Changes the next run's numbers.
async fn controls(State(race): State<Arc<Race>>, Json(c): Json<Controls>) -> Response {
    match race.set_controls(c) {
        Ok(p) => Json(json!({
            "controls": Controls::of(&p),
            "floor_s": p.floor_s(),
        }))
        .into_response(),
        Err(e) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({ "error": e })),
        )
            .into_response(),
    }
}

/// Starts another race unless one is running.
async fn rerun(State(race): State<Arc<Race>>) -> StatusCode {
    if race.is_running() {
        return StatusCode::CONFLICT;
    }
    tokio::spawn(async move {
        if let Err(e) = race::run(race).await {
            eprintln!("paceline: race failed: {e:#}");
        }
    });
    StatusCode::ACCEPTED
}

/// The simulator's herd (10,000 clients, with and without jitter) and
/// export job, run once (deterministic, seed 1) and kept.
async fn sim() -> Response {
    static SIM: OnceLock<Value> = OnceLock::new();
    if let Some(v) = SIM.get() {
        return Json(v.clone()).into_response();
    }
    let made = tokio::task::spawn_blocking(|| {
        use paceline_sim::scenario::{export, herd};
        let h = herd::HerdParams::default();
        let e = export::ExportParams::default();
        json!({
            "herd": herd::run(&h, 1),
            "herd_params": {"clients": h.clients, "retry_after_s": h.retry_after_s, "blip_s": h.blip.as_u64() / 1_000_000_000},
            "export": export::run(&e, 1),
            "export_params": {"records": e.records, "workers": e.workers, "quota": e.quota, "window_s": e.window_s},
        })
    })
    .await;
    match made {
        Ok(v) => Json(SIM.get_or_init(|| v).clone()).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}
