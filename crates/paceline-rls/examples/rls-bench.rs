//! The load generator of `scripts/bench-rls.sh`, and its floor.
//!
//! ```text
//! rls-bench load --addr 127.0.0.1:8081 --streams 50 --seconds 10 [--keys 1000]
//! rls-bench floor --listen 127.0.0.1:0
//! ```
//!
//! `load` sends `ShouldRateLimit` calls through Envoy's generated client
//! from `--streams` tasks, each one call after another on one shared
//! HTTP/2 connection (as Envoy's rate-limit filter does), each call one
//! descriptor `remote_address` over `--keys` addresses in turn, for
//! `--seconds`; then prints one line: `decisions/s`, `p50_us`, `p99_us`,
//! `ok`, `over`, `errors`. `floor` serves the same service with the same
//! library, answering `OK` without deciding: what gRPC alone costs.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::transport::{Channel, Server};

fn arg(args: &[String], name: &str, default: &str) -> String {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| default.to_string())
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("load") => load(&args).await,
        Some("floor") => floor(&args).await,
        _ => {
            eprintln!("usage: rls-bench load --addr ADDR --streams N --seconds S [--keys K] [--domain D]\n       rls-bench floor --listen ADDR");
            std::process::exit(2);
        }
    }
}

struct Floor;

#[tonic::async_trait]
impl RateLimitService for Floor {
    async fn should_rate_limit(
        &self,
        _request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        Ok(tonic::Response::new(RateLimitResponse {
            overall_code: 1,
            ..Default::default()
        }))
    }
}

async fn floor(args: &[String]) {
    let addr: SocketAddr = arg(args, "--listen", "127.0.0.1:0").parse().unwrap();
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    println!(
        "rls-bench floor: listening on {}",
        listener.local_addr().unwrap()
    );
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    Server::builder()
        .serve_with_incoming(RateLimitServiceServer::new(Floor), incoming)
        .await
        .unwrap();
}

fn request(domain: &str, ip: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_string(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "remote_address".into(),
                value: ip.to_string(),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    }
}

async fn load(args: &[String]) {
    let addr = arg(args, "--addr", "127.0.0.1:8081");
    let streams: usize = arg(args, "--streams", "1").parse().unwrap();
    let seconds: f64 = arg(args, "--seconds", "10").parse().unwrap();
    let keys: usize = arg(args, "--keys", "1000").parse().unwrap();
    let domain = arg(args, "--domain", "bench");
    let ch = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("connecting");
    let client = RateLimitServiceClient::new(ch);
    let reqs: Vec<RateLimitRequest> = (0..keys.max(1))
        .map(|i| {
            request(
                &domain,
                &format!("10.{}.{}.{}", i >> 16 & 255, i >> 8 & 255, i & 255),
            )
        })
        .collect();
    // warm: the connection, the store's first call
    let mut c = client.clone();
    for r in reqs.iter().take(10) {
        let _ = c.should_rate_limit(r.clone()).await;
    }
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for s in 0..streams {
        let (mut c, reqs) = (client.clone(), reqs.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(100_000);
            let (mut ok, mut over, mut errors) = (0u64, 0u64, 0u64);
            let mut i = s;
            while Instant::now() < until {
                let t = Instant::now();
                match c.should_rate_limit(reqs[i % reqs.len()].clone()).await {
                    Ok(r) if r.get_ref().overall_code == 1 => ok += 1,
                    Ok(_) => over += 1,
                    Err(_) => errors += 1,
                }
                lat.push(t.elapsed().as_micros() as u64);
                i += streams;
            }
            (lat, ok, over, errors)
        }));
    }
    let mut lat = Vec::new();
    let (mut ok, mut over, mut errors) = (0, 0, 0);
    for t in tasks {
        let (l, o, v, e) = t.await.unwrap();
        lat.extend(l);
        (ok, over, errors) = (ok + o, over + v, errors + e);
    }
    let elapsed = started.elapsed().as_secs_f64();
    lat.sort_unstable();
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    println!(
        "decisions/s {:.0} p50_us {} p99_us {} ok {ok} over {over} errors {errors}",
        lat.len() as f64 / elapsed,
        pct(0.50),
        pct(0.99)
    );
}
