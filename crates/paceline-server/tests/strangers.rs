//! Requests without a known key, in process on a manual clock: a missing
//! key and an unknown key each get their configured treatment, 401 when
//! none is configured, and nothing passes unlimited but an unlimited route.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use paceline_core::{ManualClock, MemoryStore, Plan, Policy};
use paceline_server::{KeyTreatment, Limits, LimitsBuilder, LimitsConfig, PeerAddr, Route};
use tower::{Layer, Service};

fn now_or_never<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("in-memory decisions are ready at once"),
    }
}

fn builder() -> LimitsBuilder {
    Limits::builder()
        .plan(Plan::new("free", vec![Policy::token_bucket("burst", 20, 2).unwrap()]).unwrap())
        .plan(Plan::new("anon", vec![Policy::token_bucket("ip", 3, 60).unwrap()]).unwrap())
        .key("sk_known", "free")
        .route(Route::new("GET", "/healthz").unwrap().unlimited())
}

struct Got {
    status: u16,
    headers: http::HeaderMap,
    body: serde_json::Value,
}

/// Sends `n` requests for `path` with `key` (none when `None`) from one
/// client address; returns the answers.
fn send(limits: Limits, path: &str, key: Option<&str>, n: usize) -> Vec<Got> {
    let clock = ManualClock::at_unix_secs(1_790_769_600);
    let limiter = paceline_server::RateLimiter::new(limits, MemoryStore::new(), clock);
    let mut svc = limiter
        .layer()
        .layer(tower::service_fn(|_r: Request<()>| async {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"{}"))))
        }));
    let peer: SocketAddr = "127.0.0.1:40000".parse().unwrap();
    (0..n)
        .map(|_| {
            let mut req = Request::get(path);
            if let Some(k) = key {
                req = req.header("authorization", format!("Bearer {k}"));
            }
            let mut req = req.body(()).unwrap();
            req.extensions_mut().insert(PeerAddr(peer));
            let res = now_or_never(svc.call(req)).unwrap();
            let (parts, body) = res.into_parts();
            let bytes = now_or_never(body.collect()).unwrap().to_bytes();
            Got {
                status: parts.status.as_u16(),
                headers: parts.headers,
                body: serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
            }
        })
        .collect()
}

fn code(g: &Got) -> &str {
    g.body["type"]
        .as_str()
        .unwrap_or("")
        .rsplit('/')
        .next()
        .unwrap()
}

#[test]
fn with_no_setting_a_missing_and_an_unknown_key_are_refused_with_401() {
    let limits = || builder().build().unwrap();
    for g in send(limits(), "/v1/rates", None, 200) {
        assert_eq!(g.status, 401);
        assert_eq!(code(&g), "unauthorized");
        assert!(g.body["detail"]
            .as_str()
            .unwrap()
            .contains("sends no API key"));
        assert_eq!(g.headers["www-authenticate"], "Bearer");
    }
    for g in send(limits(), "/v1/rates", Some("sk_not_a_key"), 200) {
        assert_eq!(g.status, 401);
        assert_eq!(code(&g), "unknown_key");
        assert!(g.body["detail"].as_str().unwrap().contains("not known"));
        assert!(g.headers.get("ratelimit").is_none());
    }
    // a known key is limited as before
    let known = send(limits(), "/v1/rates", Some("sk_known"), 21);
    assert!(known[..20].iter().all(|g| g.status == 200));
    assert_eq!(known[20].status, 429);
}

#[test]
fn the_usage_endpoint_tells_no_key_from_an_unknown_key() {
    let missing = &send(builder().build().unwrap(), "/v1/usage", None, 1)[0];
    assert_eq!((missing.status, code(missing)), (401, "unauthorized"));
    let unknown = &send(builder().build().unwrap(), "/v1/usage", Some("sk_nope"), 1)[0];
    assert_eq!((unknown.status, code(unknown)), (401, "unknown_key"));
    assert!(unknown.body["detail"]
        .as_str()
        .unwrap()
        .contains("not known"));
    // even when strangers are served on the anonymous plan
    let anon = builder()
        .anonymous_plan("anon")
        .missing_key(KeyTreatment::Anonymous)
        .unknown_key(KeyTreatment::Anonymous)
        .build()
        .unwrap();
    let unknown = &send(anon, "/v1/usage", Some("sk_nope"), 1)[0];
    assert_eq!((unknown.status, code(unknown)), (401, "unknown_key"));
    let known = &send(builder().build().unwrap(), "/v1/usage", Some("sk_known"), 1)[0];
    assert_eq!(known.status, 200);
}

#[test]
fn the_anonymous_treatment_limits_per_ip_and_publishes_nothing() {
    let limits = || {
        builder()
            .anonymous_plan("anon")
            .missing_key(KeyTreatment::Anonymous)
            .build()
            .unwrap()
    };
    let got = send(limits(), "/v1/rates", None, 5);
    assert!(got[..3].iter().all(|g| g.status == 200));
    assert!(got[3..].iter().all(|g| g.status == 429));
    for g in &got {
        assert!(g.headers.get("ratelimit").is_none());
        assert!(g.headers.get("ratelimit-policy").is_none());
    }
    // an unknown key is still refused: its treatment is its own
    let unknown = send(limits(), "/v1/rates", Some("sk_not_a_key"), 1);
    assert_eq!(unknown[0].status, 401);
}

#[test]
fn only_an_unlimited_route_passes_without_a_limit() {
    for key in [None, Some("sk_not_a_key"), Some("sk_known")] {
        let got = send(builder().build().unwrap(), "/healthz", key, 50);
        assert!(got.iter().all(|g| g.status == 200), "{key:?}");
        assert!(got.iter().all(|g| g.headers.get("ratelimit").is_none()));
    }
}

#[test]
fn a_file_states_the_treatments_and_refuses_what_cannot_work() {
    let file = |extra: &str| {
        let text = format!(
            "{extra}\n[plans.free]\npolicies = [{{ name = \"burst\", algorithm = \"token_bucket\", q = 20, w = 2 }}]\n"
        );
        toml::from_str::<LimitsConfig>(&text).unwrap().build()
    };
    let l = file("").unwrap();
    let got = send(l, "/v1/rates", None, 1);
    assert_eq!(got[0].status, 401);
    // anonymous needs the plan it names
    let e = file("missing_key = \"anonymous\"").unwrap_err();
    assert_eq!(e.field(), "missing_key");
    // default_plan already answers unknown keys
    let e = file("default_plan = \"free\"\nunknown_key = \"reject\"").unwrap_err();
    assert_eq!(e.field(), "unknown_key");
    assert!(toml::from_str::<LimitsConfig>("unknown_key = \"pass\"").is_err());
}
