//! A hyper client with the paceline `tower` layer: ten concurrent requests
//! against a local API with a burst of 8 refilling 4 per second.
//!
//! Run: `cargo run -p paceline-client --example tower_hyper --features tower`

#[path = "support/server.rs"]
mod server;

use std::time::Instant;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client as Hyper;
use hyper_util::rt::TokioExecutor;
use paceline_client::adapter::tower::PacelineLayer;
use paceline_client::Client;
use paceline_core::SystemClock;
use tower::{Layer, ServiceExt};

#[tokio::main]
async fn main() {
    let (addr, seen) = server::spawn(
        server::race_plan(),
        server::Publish::Full,
        SystemClock::new(),
    )
    .await;
    let sdk = Client::new();
    let hyper: Hyper<_, Full<Bytes>> = Hyper::builder(TokioExecutor::new()).build_http();
    let svc = PacelineLayer::new(sdk.clone()).layer(hyper);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..12u32 {
        let svc = svc.clone();
        tasks.push(tokio::spawn(async move {
            let req = http::Request::get(format!("http://{addr}/v1/rates/{i}"))
                .body(Full::new(Bytes::new()))
                .unwrap();
            match svc.oneshot(req).await {
                Ok(r) => println!(
                    "{:>6.2} s  request {i:>2}  {}",
                    started.elapsed().as_secs_f64(),
                    r.status()
                ),
                Err(e) => println!("request {i}: {e}"),
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let d = sdk.diagnostics();
    println!(
        "12 requests in {:.2} s, {} sent, {} answered 429 (floor {:.2} s)",
        started.elapsed().as_secs_f64(),
        d.requests,
        seen.rejected.load(std::sync::atomic::Ordering::Relaxed),
        floor_s(12, 8, 4.0)
    );
}

/// A burst of `burst` at once, then the rest at `rate` per second.
fn floor_s(jobs: u32, burst: u32, rate: f64) -> f64 {
    f64::from(jobs.saturating_sub(burst)) / rate
}
