//! Properties of the layer's answers over random request sequences (in
//! process, manual clock).

use std::convert::Infallible;
use std::future::Future;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Empty};
use paceline_core::{ManualClock, MemoryStore, Nanos, Plan, Policy};
use paceline_server::{Limits, Route};
use proptest::prelude::*;
use tower::{Layer, Service};

fn now_or_never<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("in-memory decisions are ready at once"),
    }
}

fn param(field: &str, item: &str, key: &str) -> u64 {
    let it = field
        .split(", ")
        .find(|i| i.starts_with(&format!("\"{item}\"")))
        .unwrap();
    it.split(';')
        .find_map(|p| p.strip_prefix(&format!("{key}=")))
        .unwrap()
        .parse()
        .unwrap()
}

const KEYS: [&str; 3] = ["sk_a", "sk_b", "sk_c"];
const DAILY: u64 = 100;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn answers_are_consistent(ops in prop::collection::vec((0usize..3, 0u64..400, any::<bool>()), 1..250)) {
        let plan = Plan::new("p", vec![
            Policy::token_bucket("burst", 20, 2).unwrap(),
            Policy::daily("daily", DAILY).unwrap(),
        ]).unwrap();
        let mut b = Limits::builder()
            .plan(plan)
            .route(Route::new("POST", "/batch").unwrap().with_cost(5));
        for k in KEYS {
            b = b.key(k, "p");
        }
        let clock = ManualClock::at_unix_secs(1_790_769_600);
        let limiter = paceline_server::RateLimiter::new(b.build().unwrap(), MemoryStore::new(), clock.clone());
        let mut svc = limiter.layer().layer(tower::service_fn(|_r: Request<()>| async {
            Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
        }));
        let mut daily_left = [DAILY; 3];
        for (k, advance_ms, batch) in ops {
            clock.advance(Nanos::from_millis(advance_ms));
            let (method, path, cost) = if batch { ("POST", "/batch", 5) } else { ("GET", "/one", 1) };
            let req = Request::builder().method(method).uri(path)
                .header("authorization", format!("Bearer {}", KEYS[k]))
                .body(()).unwrap();
            let res = now_or_never(svc.call(req)).unwrap();
            let h = res.headers().clone();
            let rl = h["ratelimit"].to_str().unwrap().to_string();
            prop_assert_eq!(&h["ratelimit-policy"], "\"burst\";q=20;w=2, \"daily\";q=100;w=86400");
            let daily = param(&rl, "daily", "r");
            match res.status().as_u16() {
                200 => {
                    prop_assert_eq!(daily, daily_left[k] - cost, "an admitted request spends its cost");
                    daily_left[k] = daily;
                }
                429 => {
                    prop_assert_eq!(daily, daily_left[k], "a denied request spends nothing");
                    let ra: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
                    prop_assert!(ra >= 1);
                    prop_assert_eq!(&h["cache-control"], "no-store");
                    let body = now_or_never(res.into_body().collect()).unwrap().to_bytes();
                    let p: serde_json::Value = serde_json::from_slice(&body).unwrap();
                    prop_assert_eq!(p["retry_after_s"].as_u64(), Some(ra));
                    let limit = p["limit"].as_str().unwrap();
                    let kind = p["type"].as_str().unwrap();
                    if limit == "daily" {
                        prop_assert!(kind.ends_with("quota_exhausted"));
                    } else {
                        prop_assert_eq!(limit, "burst");
                        prop_assert!(kind.ends_with("rate_limited"));
                    }
                }
                s => prop_assert!(false, "unexpected status {}", s),
            }
        }
    }
}

#[test]
fn a_per_connection_peer_keys_requests_without_an_address() {
    use paceline_server::{KeySource, PeerAddr};
    let plan = Plan::new("p", vec![Policy::token_bucket("burst", 2, 60).unwrap()]).unwrap();
    let limits = Limits::builder()
        .plan(plan)
        .key_source(KeySource::ClientIp)
        .default_plan("p")
        .build()
        .unwrap();
    let clock = ManualClock::at_unix_secs(1_790_769_600);
    let limiter = paceline_server::RateLimiter::new(limits, MemoryStore::new(), clock);
    let inner = tower::service_fn(|_r: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
    });
    let conn_a = "10.0.0.1:5000".parse().unwrap();
    let conn_b = "10.0.0.2:5000".parse().unwrap();
    let mut a = paceline_server::RateLimit::new(inner, limiter.clone()).with_peer(conn_a);
    let mut b = paceline_server::RateLimit::new(inner, limiter).with_peer(conn_b);
    let status = |svc: &mut paceline_server::RateLimit<_, _, _>, ext: Option<&str>| {
        let mut req = Request::get("/x").body(()).unwrap();
        if let Some(addr) = ext {
            req.extensions_mut().insert(PeerAddr(addr.parse().unwrap()));
        }
        now_or_never(svc.call(req)).unwrap().status().as_u16()
    };
    // each connection's peer has its own burst of two
    assert_eq!([status(&mut a, None), status(&mut a, None)], [200, 200]);
    assert_eq!(status(&mut a, None), 429);
    assert_eq!(status(&mut b, None), 200, "another peer, another key");
    // an address in the request's extensions wins over the connection's
    assert_eq!(status(&mut a, Some("10.0.0.3:1")), 200);
    assert_eq!(status(&mut b, Some("10.0.0.1:1")), 429, "10.0.0.1 is spent");
}
