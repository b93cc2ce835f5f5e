//! One client, two API keys, each with its own limit on the server: the
//! adapters pace each key in a scope of its own, so both finish at the
//! floor of their own limit. On loopback, on tokio's paused clock.

#[path = "../examples/support/server.rs"]
mod server;

use std::sync::atomic::Ordering;
use std::time::Duration;

use paceline_client::adapter::reqwest::PacelineMiddleware;
use paceline_client::adapter::{PacingScope, TokioClock};
use paceline_client::Client;
use paceline_core::{Plan, Policy};
use reqwest_middleware::ClientWithMiddleware;
use server::Publish;

/// The Free plan's burst: 20 deep, 10 a second.
fn free_burst() -> Plan {
    Plan::new("free", vec![Policy::token_bucket("burst", 20, 2).unwrap()]).unwrap()
}

/// `jobs` requests with `key`, from `workers` workers; the time the last
/// one finished and the statuses seen.
async fn run_key(
    http: ClientWithMiddleware,
    url: String,
    key: &'static str,
    workers: usize,
    jobs: usize,
) -> (Duration, Vec<u16>) {
    let started = tokio::time::Instant::now();
    let tasks: Vec<_> = (0..workers)
        .map(|w| {
            let (http, url) = (http.clone(), url.clone());
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                for _ in (w..jobs).step_by(workers) {
                    let resp = http.get(&url).bearer_auth(key).send().await.unwrap();
                    statuses.push(resp.status().as_u16());
                }
                statuses
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.extend(t.await.unwrap());
    }
    (started.elapsed(), statuses)
}

#[tokio::test(start_paused = true)]
async fn two_keys_on_one_client_get_two_limits() {
    let clock = TokioClock::new();
    let (addr, seen) = server::spawn(free_burst(), Publish::Full, clock.clone()).await;
    let sdk = Client::builder().clock(clock).seed(29).build();
    let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(PacelineMiddleware::new(sdk.clone()))
        .build();
    let url = format!("http://{addr}/v1/rates");
    let alice = tokio::spawn(run_key(http.clone(), url.clone(), "sk_alice", 10, 40));
    let bob = tokio::spawn(run_key(http.clone(), url.clone(), "sk_bob", 10, 40));
    let (alice, bob) = (alice.await.unwrap(), bob.await.unwrap());
    // separate limits: 20 at once, then 20 at 10 a second
    let floor = 2.0;
    for (name, (elapsed, statuses)) in [("alice", &alice), ("bob", &bob)] {
        let s = elapsed.as_secs_f64();
        println!("{name}: 40 requests in {s:.3} s (floor {floor} s)");
        assert_eq!(statuses.len(), 40);
        assert!(statuses.iter().all(|&s| s == 200), "{name}: {statuses:?}");
        assert!(s <= floor * 1.1, "{name}: {s:.3} s, floor {floor} s");
    }
    assert_eq!(seen.rejected.load(Ordering::Relaxed), 0);
    let scopes: Vec<String> = sdk
        .diagnostics()
        .scopes
        .into_iter()
        .map(|s| s.scope)
        .collect();
    assert_eq!(scopes.len(), 2, "{scopes:?}");
    for s in &scopes {
        assert!(s.starts_with(&format!("{addr}#")), "{s}");
        assert!(
            !s.contains("sk_"),
            "a scope name must not show the key: {s}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_scope_function_and_a_per_request_scope_override_the_default() {
    let clock = TokioClock::new();
    let (addr, _seen) = server::spawn(free_burst(), Publish::Full, clock.clone()).await;
    let sdk = Client::builder().clock(clock).seed(30).build();
    let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(
            PacelineMiddleware::new(sdk.clone())
                .scope_fn(|head| format!("tenant:{}", head.path.trim_start_matches('/'))),
        )
        .build();
    let url = format!("http://{addr}/v1");
    http.get(&url).bearer_auth("sk_a").send().await.unwrap();
    http.get(&url)
        .bearer_auth("sk_a")
        .with_extension(PacingScope::new("pinned"))
        .send()
        .await
        .unwrap();
    let mut scopes: Vec<String> = sdk
        .diagnostics()
        .scopes
        .into_iter()
        .map(|s| s.scope)
        .collect();
    scopes.sort();
    assert_eq!(scopes, ["pinned", "tenant:v1"]);
}

#[tokio::test(start_paused = true)]
async fn without_a_credential_the_scope_is_the_authority() {
    let clock = TokioClock::new();
    let (addr, _seen) = server::spawn(free_burst(), Publish::Full, clock.clone()).await;
    let sdk = Client::builder().clock(clock).seed(31).build();
    let mw =
        PacelineMiddleware::new(sdk.clone()).key_header(http::HeaderName::from_static("x-api-key"));
    let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(mw.clone())
        .build();
    // the configured key header names the scope; Authorization does not
    let url = format!("http://{addr}/v1");
    http.get(&url).bearer_auth("sk_a").send().await.unwrap();
    assert!(sdk.mode(&addr.to_string()).is_some());
    let keyed = reqwest::Client::new()
        .get(&url)
        .header("x-api-key", "sk_b")
        .build()
        .unwrap();
    let scope = mw.scope_of(&keyed, &http::Extensions::new());
    assert!(scope.starts_with(&format!("{addr}#")), "{scope}");
}
