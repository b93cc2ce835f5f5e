//! The tower layer over real loopback sockets, on tokio's paused clock.

#[path = "../examples/support/server.rs"]
mod server;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client as Hyper;
use hyper_util::rt::TokioExecutor;
use paceline_client::adapter::tower::PacelineLayer;
use paceline_client::adapter::TokioClock;
use paceline_client::{Client, ClientError};
use server::Publish;
use tower::{Layer, ServiceExt};

type Queue = Arc<tokio::sync::Mutex<Vec<usize>>>;

/// The same race through the tower layer, on tokio's paused clock: the
/// server's limiter and the client both read tokio time.
#[tokio::test(start_paused = true)]
async fn tower_finishes_at_the_floor_on_paused_time() {
    let clock = TokioClock::new();
    let (addr, seen) = server::spawn(server::race_plan(), Publish::Full, clock.clone()).await;
    let sdk = Client::builder().clock(clock).seed(4).build();
    let hyper: Hyper<_, Full<Bytes>> = Hyper::builder(TokioExecutor::new()).build_http();
    let svc = PacelineLayer::new(sdk.clone()).layer(hyper);
    let queue: Queue = Arc::new(tokio::sync::Mutex::new((0..50).collect()));
    let started = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let (svc, queue) = (svc.clone(), queue.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let Some(i) = queue.lock().await.pop() else {
                    break;
                };
                let req = http::Request::get(format!("http://{addr}/v1/jobs/{i}"))
                    .body(Full::new(Bytes::new()))
                    .unwrap();
                let resp = svc.clone().oneshot(req).await.unwrap();
                assert_eq!(resp.status(), 200);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    println!("paused time: {elapsed:.3} s");
    assert_eq!(seen.requests.load(Ordering::Relaxed), 50);
    assert_eq!(seen.rejected.load(Ordering::Relaxed), 0);
    assert!((elapsed - 10.5).abs() <= 10.5 * 0.03, "{elapsed} s");
}

#[tokio::test(start_paused = true)]
async fn a_body_over_the_replay_cap_fails_clearly() {
    let clock = TokioClock::new();
    let (addr, _) = server::spawn(server::race_plan(), Publish::Full, clock.clone()).await;
    let cfg = paceline_client::Config {
        replay_buffer_cap: 16,
        ..Default::default()
    };
    let sdk = Client::builder().clock(clock).config(cfg).build();
    let hyper: Hyper<_, Full<Bytes>> = Hyper::builder(TokioExecutor::new()).build_http();
    let svc = PacelineLayer::new(sdk).layer(hyper);
    let req = http::Request::post(format!("http://{addr}/v1/labels"))
        .body(Full::new(Bytes::from(vec![b'x'; 64])))
        .unwrap();
    let err = svc.oneshot(req).await.unwrap_err();
    assert_eq!(
        err.downcast_ref::<ClientError>(),
        Some(&ClientError::BodyNotReplayable { cap: 16 })
    );
}
