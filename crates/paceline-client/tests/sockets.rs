//! The reqwest middleware over real loopback sockets against a small server that
//! uses the real limiter and header emitter.

#[path = "../examples/support/server.rs"]
mod server;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use paceline_client::adapter::reqwest::PacelineMiddleware;
use paceline_client::adapter::TokioClock;
use paceline_client::{Client, ClientError};
use paceline_core::{Plan, Policy, SystemClock};
use server::Publish;

type Queue = Arc<tokio::sync::Mutex<Vec<usize>>>;

async fn run_reqwest(
    sdk: &Client,
    addr: std::net::SocketAddr,
    workers: usize,
    jobs: usize,
) -> (usize, usize) {
    let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(PacelineMiddleware::new(sdk.clone()))
        .build();
    let queue: Queue = Arc::new(tokio::sync::Mutex::new((0..jobs).collect()));
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let (http, queue) = (http.clone(), queue.clone());
        tasks.push(tokio::spawn(async move {
            let (mut ok, mut failed) = (0, 0);
            loop {
                let Some(i) = queue.lock().await.pop() else {
                    break;
                };
                match http.get(format!("http://{addr}/v1/jobs/{i}")).send().await {
                    Ok(r) if r.status().is_success() => ok += 1,
                    _ => failed += 1,
                }
            }
            (ok, failed)
        }));
    }
    let mut total = (0, 0);
    for t in tasks {
        let (o, f) = t.await.unwrap();
        total.0 += o;
        total.1 += f;
    }
    total
}

/// The one real-time test: 50 jobs, 10 workers, a bucket of 8 at 4/s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reqwest_finishes_at_the_floor_in_real_time() {
    // one clock for both ends: two independently calibrated TSC clocks on a
    // loaded machine can run a fraction of a percent apart, which is more
    // than the distance between two paced requests and the server's refill
    let clock = SystemClock::new();
    let (addr, seen) = server::spawn(server::race_plan(), Publish::Full, clock.clone()).await;
    let sdk = Client::builder().clock(clock).build();
    let started = Instant::now();
    let (ok, failed) = run_reqwest(&sdk, addr, 10, 50).await;
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "real time: {elapsed:.3} s, server saw {} requests, {} rejected; {}",
        seen.requests.load(Ordering::Relaxed),
        seen.rejected.load(Ordering::Relaxed),
        serde_json::to_string(&sdk.diagnostics()).unwrap()
    );
    assert_eq!((ok, failed), (50, 0));
    if seen.rejected.load(Ordering::Relaxed) > 0 {
        let log = seen.log.lock().unwrap();
        let t0 = log[0].0;
        for (t, s, h) in log.iter() {
            println!("{:.4} {s} {h}", t - t0);
        }
    }
    assert_eq!(seen.requests.load(Ordering::Relaxed), 50);
    assert_eq!(seen.rejected.load(Ordering::Relaxed), 0);
    assert!((elapsed - 10.5).abs() <= 10.5 * 0.03, "{elapsed} s");
}

/// Seeded from the usage endpoint, the first wave goes at once (no probe).
#[tokio::test(start_paused = true)]
async fn usage_seeding_lets_the_first_wave_go_at_once() {
    let clock = TokioClock::new();
    let (addr, seen) = server::spawn(server::race_plan(), Publish::Full, clock.clone()).await;
    let sdk = Client::builder().clock(clock).seed(4).build();
    let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(PacelineMiddleware::new(sdk.clone()).usage_path("/v1/usage"))
        .build();
    let started = tokio::time::Instant::now();
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let http = http.clone();
            tokio::spawn(async move {
                http.get(format!("http://{addr}/v1/jobs/{i}"))
                    .send()
                    .await
                    .unwrap()
                    .status()
            })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    assert_eq!(seen.rejected.load(Ordering::Relaxed), 0);
    assert_eq!(seen.requests.load(Ordering::Relaxed), 8);
    assert!(started.elapsed() < std::time::Duration::from_millis(50));
    assert_eq!(
        sdk.mode(&addr.to_string()),
        Some(paceline_client::Mode::Paced)
    );
}

#[tokio::test(start_paused = true)]
async fn a_daily_quota_comes_back_as_quota_exceeded() {
    let clock = TokioClock::new();
    let plan = Plan::new(
        "free",
        vec![
            Policy::token_bucket("burst", 20, 2).unwrap(),
            Policy::daily("daily", 2).unwrap(),
        ],
    )
    .unwrap();
    let (addr, seen) = server::spawn(plan, Publish::Full, clock.clone()).await;
    let sdk = Client::builder().clock(clock).seed(4).build();
    let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(PacelineMiddleware::new(sdk.clone()))
        .build();
    // someone else (no SDK) spends the day's quota of this key
    let plain = reqwest::Client::new();
    for _ in 0..2 {
        assert!(plain
            .get(format!("http://{addr}/"))
            .send()
            .await
            .unwrap()
            .status()
            .is_success());
    }
    let err = http
        .post(format!("http://{addr}/v1/labels"))
        .send()
        .await
        .unwrap_err();
    let sdk_err = match &err {
        reqwest_middleware::Error::Middleware(e) => e.downcast_ref::<ClientError>().cloned(),
        _ => None,
    };
    match sdk_err {
        Some(ClientError::QuotaExceeded { policy, reset_at }) => {
            assert_eq!(policy, "daily");
            // Retry-After is whole seconds, rounded up: midnight UTC, up to 1 s late
            let past_midnight = reset_at
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs()
                % 86_400;
            assert!(past_midnight <= 1, "{past_midnight} s past midnight");
        }
        other => panic!("{err}: {other:?}"),
    }
    assert_eq!(
        seen.requests.load(Ordering::Relaxed),
        3,
        "one request, no retry"
    );
    // the next call fails locally: the mirror knows the day is spent
    let again = http
        .get(format!("http://{addr}/"))
        .send()
        .await
        .unwrap_err();
    assert!(again.to_string().contains("quota"), "{again}");
    assert_eq!(seen.requests.load(Ordering::Relaxed), 3);
}

#[tokio::test(start_paused = true)]
async fn without_headers_the_job_completes_over_http() {
    for publish in [Publish::RetryAfterOnly, Publish::Bare] {
        let clock = TokioClock::new();
        let (addr, seen) = server::spawn(server::race_plan(), publish, clock.clone()).await;
        let sdk = Client::builder().clock(clock).seed(4).build();
        let (ok, failed) = run_reqwest(&sdk, addr, 10, 50).await;
        let rejected = seen.rejected.load(Ordering::Relaxed);
        println!("{publish:?}: {ok} ok, {failed} failed, {rejected} 429s");
        assert_eq!((ok, failed), (50, 0));
        assert!(rejected <= 6, "{rejected}");
    }
}
