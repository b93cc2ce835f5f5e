//! Heads the layer refuses whoever sends them, in process: more than one
//! credential, more than one `Host`, and framing that cannot be read
//! faithfully. Each is a problem answer, the inner service is not called
//! and nothing is charged.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Empty};
use paceline_core::{ManualClock, MemoryStore, Plan, Policy};
use paceline_server::{KeySource, Limits, RateLimiter};
use paceline_wire::problem::PROBLEM_CONTENT_TYPE;
use tower::{Service, ServiceExt};

fn limiter(source: KeySource) -> RateLimiter<MemoryStore, ManualClock> {
    let plan = Plan::new("free", vec![Policy::token_bucket("burst", 5, 60).unwrap()]).unwrap();
    let limits = Limits::builder()
        .plan(plan)
        .key("sk_1", "free")
        .key_source(source)
        .build()
        .unwrap();
    RateLimiter::new(
        limits,
        MemoryStore::new(),
        ManualClock::at_unix_secs(1_790_000_000),
    )
}

/// Sends `fields` through the layer; the answer's status, its problem
/// code (if any), whether the inner service was called, and its
/// `RateLimit` field.
async fn send(
    limiter: &RateLimiter<MemoryStore, ManualClock>,
    fields: &[(&str, &str)],
) -> (u16, Option<String>, bool, String) {
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let inner = tower::service_fn(move |_req: Request<()>| {
        seen.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new())) }
    });
    let mut svc = tower::ServiceBuilder::new()
        .layer(limiter.layer())
        .service(inner);
    let mut req = Request::post("/v1/labels");
    for (n, v) in fields {
        req = req.header(*n, *v);
    }
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(req.body(()).unwrap())
        .await
        .unwrap();
    let status = res.status().as_u16();
    let rate = res
        .headers()
        .get("ratelimit")
        .map_or(String::new(), |v| v.to_str().unwrap().to_string());
    let problem = res
        .headers()
        .get("content-type")
        .map(|v| v.as_bytes().to_vec());
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let code = match problem.as_deref() == Some(PROBLEM_CONTENT_TYPE.as_bytes()) {
        true => {
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
            v["type"]
                .as_str()
                .unwrap()
                .rsplit('/')
                .next()
                .map(str::to_string)
        }
        false => None,
    };
    (status, code, calls.load(Ordering::SeqCst) == 1, rate)
}

fn refused(code: &str) -> (u16, Option<String>, bool, String) {
    let status = match code {
        "not_implemented" => 501,
        _ => 400,
    };
    (status, Some(code.to_string()), false, String::new())
}

#[tokio::test]
async fn two_credentials_are_refused_and_charge_nothing() {
    let l = limiter(KeySource::ApiKey);
    let key = ("authorization", "Bearer sk_1");
    for first in ["Bearer x", "Bearer sk_1", "Basic eDp5"] {
        let two = [("authorization", first), key];
        assert_eq!(send(&l, &two).await, refused("duplicate_credentials"));
    }
    for listed in [
        "Bearer x, Bearer sk_1",
        "Bearer, Bearer sk_1",
        "bearer,sk_1",
    ] {
        let listed = [("authorization", listed)];
        assert_eq!(send(&l, &listed).await, refused("duplicate_credentials"));
    }
    // the first admitted request is the first charged
    let ok = send(&l, &[key]).await;
    assert_eq!(
        (ok.0, ok.2, ok.3.as_str()),
        (200, true, r#""burst";r=4;t=12"#)
    );
}

#[tokio::test]
async fn the_key_header_is_sent_once() {
    let l = limiter(KeySource::Header("x-api-key".parse().unwrap()));
    let two = [("x-api-key", "x"), ("x-api-key", "sk_1")];
    assert_eq!(send(&l, &two).await, refused("duplicate_credentials"));
    let ok = send(&l, &two[1..]).await;
    assert_eq!(
        (ok.0, ok.2, ok.3.as_str()),
        (200, true, r#""burst";r=4;t=12"#)
    );
}

#[tokio::test]
async fn framing_is_read_one_way_or_refused() {
    let l = limiter(KeySource::ApiKey);
    let key = ("authorization", "Bearer sk_1");
    let cases = [
        (("transfer-encoding", "gzip, chunked"), "not_implemented"),
        (("transfer-encoding", "chunked, chunked"), "bad_request"),
        (("content-length", "18446744073709551616"), "bad_request"),
        (("content-length", "12, 13"), "bad_request"),
        (("content-length", "0x10"), "bad_request"),
        (("host", "a, b"), "bad_request"),
    ];
    for (field, code) in cases {
        assert_eq!(send(&l, &[key, field]).await, refused(code), "{field:?}");
    }
    let hosts = [key, ("host", "a"), ("host", "b")];
    assert_eq!(send(&l, &hosts).await, refused("bad_request"));
    let ok = send(&l, &[key, ("content-length", "0"), ("host", "a")]).await;
    assert_eq!(
        (ok.0, ok.2, ok.3.as_str()),
        (200, true, r#""burst";r=4;t=12"#)
    );
}
