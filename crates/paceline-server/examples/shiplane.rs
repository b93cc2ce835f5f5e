//! A small Shiplane-style API behind the rate-limit layer.
//!
//! ```text
//! cargo run -p paceline-server --example shiplane
//! curl -i -H 'authorization: Bearer sk_live_free' localhost:3000/v1/rates
//! curl -i -H 'authorization: Bearer sk_live_free' localhost:3000/v1/usage
//! curl -i -X POST localhost:3000/v1/login      # per IP, no counters
//! curl localhost:3000/metrics                  # Prometheus
//! ```
//!
//! The whole integration is the `limiter.layer()` line; the rest is the app.

use std::net::SocketAddr;

use axum::routing::{get, post};
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusBuilder;
use paceline_core::{MemoryStore, Plan, Policy, SystemClock};
use paceline_server::{Criticality, Limits, RateLimiter, Route, SoftLimitHook};
use serde_json::{json, Value};

fn limits() -> Limits {
    let free = Plan::new(
        "free",
        vec![
            Policy::token_bucket("burst", 20, 2).unwrap(),
            Policy::daily("daily", 10_000).unwrap(),
        ],
    )
    .unwrap();
    let pro = Plan::new(
        "pro",
        vec![
            Policy::token_bucket("burst", 200, 2).unwrap(),
            Policy::daily("daily", 1_000_000).unwrap(),
            // a new limit being rolled out: published and counted, never enforced
            Policy::fixed_window("minute", 3_000, 60)
                .unwrap()
                .with_shadow(true),
        ],
    )
    .unwrap();
    let login = Plan::new("login", vec![Policy::fixed_window("login", 5, 60).unwrap()]).unwrap();
    Limits::builder()
        .plan(free)
        .plan(pro)
        .plan(login)
        .key("sk_live_free", "free")
        .key("sk_live_pro", "pro")
        .route(
            Route::new("POST", "/v1/login")
                .unwrap()
                .anonymous(Some("login")),
        )
        .route(
            Route::new("POST", "/v1/labels:batch")
                .unwrap()
                .with_cost(10),
        )
        .route(
            Route::new("GET", "/v1/rates")
                .unwrap()
                .with_criticality(Criticality::Sheddable),
        )
        .build()
        .expect("valid limits")
}

async fn rates() -> Json<Value> {
    Json(json!({"rates": [{"id": "rate_ups_ground", "amount": "7.45"}]}))
}

async fn label() -> Json<Value> {
    Json(json!({"label_id": "lbl_77120", "tracking_number": "1Z999AA10123456784"}))
}

async fn batch() -> Json<Value> {
    Json(json!({"labels": 10}))
}

async fn login() -> Json<Value> {
    Json(json!({"session": "ok"}))
}

#[tokio::main]
async fn main() {
    let prometheus = PrometheusBuilder::new()
        .install_recorder()
        .expect("metrics recorder");
    let limiter = RateLimiter::new(limits(), MemoryStore::new(), SystemClock::new());
    limiter.set_soft_limit_hook(SoftLimitHook::new(|e| {
        println!(
            "soft limit: key {} used {} of {} on {}/{}",
            e.key_hash, e.used, e.quota, e.plan, e.policy
        );
    }));

    let api = Router::new()
        .route("/v1/rates", get(rates))
        .route("/v1/labels", post(label))
        .route("/v1/labels:batch", post(batch))
        .route("/v1/login", post(login))
        .fallback(|| async { (http::StatusCode::NOT_FOUND, "not found") })
        .layer(limiter.layer());
    let app = api.route(
        "/metrics",
        get(move || std::future::ready(prometheus.render())),
    );

    let addr: SocketAddr = std::env::var("PACELINE_ADDR")
        .unwrap_or_else(|_| "127.0.0.1:3000".into())
        .parse()
        .expect("PACELINE_ADDR is host:port");
    let listener = tokio::net::TcpListener::bind(addr).await.expect("bind");
    println!("listening on http://{addr} (keys: sk_live_free, sk_live_pro)");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
    .expect("serve");
}
