//! Ten workers share one paceline client through `reqwest-middleware`,
//! against a local API with a burst of 8 refilling 4 per second.
//!
//! Run: `cargo run -p paceline-client --example reqwest_middleware --features reqwest`

#[path = "support/server.rs"]
mod server;

use std::time::Instant;

use paceline_client::adapter::reqwest::PacelineMiddleware;
use paceline_client::Client;
use paceline_client::SystemClock;

#[tokio::main]
async fn main() {
    let (addr, seen) = server::spawn(
        server::race_plan(),
        server::Publish::Full,
        SystemClock::new(),
    )
    .await;
    let sdk = Client::new();
    let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(PacelineMiddleware::new(sdk.clone()))
        .build();
    let jobs = 20;
    let started = Instant::now();
    let queue: Queue = std::sync::Arc::new(tokio::sync::Mutex::new((0..jobs).rev().collect()));
    let mut workers = Vec::new();
    for _ in 0..10 {
        let http = http.clone();
        let queue = queue.clone();
        workers.push(tokio::spawn(async move {
            loop {
                let Some(i) = queue.lock().await.pop() else {
                    break;
                };
                let url = format!("http://{addr}/v1/labels/{i}");
                match http.get(&url).send().await {
                    Ok(r) => println!(
                        "{:>6.2} s  job {i:>2}  {}",
                        started.elapsed().as_secs_f64(),
                        r.status()
                    ),
                    Err(e) => println!("job {i}: {e}"),
                }
            }
        }));
    }
    for w in workers {
        w.await.unwrap();
    }
    let d = sdk.diagnostics();
    println!(
        "{} jobs in {:.2} s: {} requests, {} answered 429 by the server; floor {:.2} s",
        jobs,
        started.elapsed().as_secs_f64(),
        d.requests,
        seen.rejected.load(std::sync::atomic::Ordering::Relaxed),
        (jobs as f64 - 8.0) / 4.0
    );
    println!("{}", serde_json::to_string_pretty(&d).unwrap());
}

type Queue = std::sync::Arc<tokio::sync::Mutex<Vec<usize>>>;
