//! Content-bytes policies are charged the announced body length.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use paceline_core::{ManualClock, MemoryStore, Plan, Policy, Unit};
use paceline_server::{Limits, RateLimiter};
use tower::{Service, ServiceExt};

/// `bytes` per minute for key `sk_1` (plus `extra` policies before it),
/// in front of a handler that counts its calls.
fn uploads(
    extra: Vec<Policy>,
    bytes: u64,
) -> (
    impl Service<
        http::Request<()>,
        Response = http::Response<impl http_body::Body>,
        Error = std::convert::Infallible,
    >,
    Arc<AtomicUsize>,
) {
    let mut policies = extra;
    policies.push(
        Policy::fixed_window("bytes", bytes, 60)
            .unwrap()
            .with_unit(Unit::ContentBytes)
            .unwrap(),
    );
    let limits = Limits::builder()
        .plan(Plan::new("uploads", policies).unwrap())
        .key("sk_1", "uploads")
        .build()
        .unwrap();
    let limiter = RateLimiter::new(
        limits,
        MemoryStore::new(),
        ManualClock::at_unix_secs(1_800_000_000),
    );
    let called = Arc::new(AtomicUsize::new(0));
    let seen = called.clone();
    let ok = tower::service_fn(move |_req: http::Request<()>| {
        seen.fetch_add(1, Ordering::SeqCst);
        async {
            Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Empty::<
                bytes::Bytes,
            >::new()))
        }
    });
    let svc = tower::ServiceBuilder::new()
        .layer(limiter.layer())
        .service(ok);
    (svc, called)
}

fn post(header: (&str, String)) -> http::Request<()> {
    http::Request::post("/v1/files")
        .header("authorization", "Bearer sk_1")
        .header(header.0, header.1)
        .body(())
        .unwrap()
}

#[tokio::test]
async fn upload_bytes_are_charged_by_content_length() {
    let burst = Policy::token_bucket("burst", 100, 1).unwrap();
    let (mut svc, _) = uploads(vec![burst], 10_000);
    let upload = |len: u64| post(("content-length", len.to_string()));
    let r = svc
        .ready()
        .await
        .unwrap()
        .call(upload(6_000))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let fields = r.headers()["ratelimit"].to_str().unwrap().to_string();
    assert!(fields.contains(r#""bytes";r=4000"#), "{fields}");
    // the next 6,000 bytes do not fit this minute's window
    let r = svc
        .ready()
        .await
        .unwrap()
        .call(upload(6_000))
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    // a body larger than the whole window can never fit
    let r = svc
        .ready()
        .await
        .unwrap()
        .call(upload(20_000))
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
}

#[tokio::test]
async fn a_body_of_unknown_length_is_refused_when_bytes_count() {
    let (mut svc, called) = uploads(Vec::new(), 1_000);
    let chunked = post(("transfer-encoding", "chunked".to_string()));
    let r = svc.ready().await.unwrap().call(chunked).await.unwrap();
    assert_eq!(r.status(), 411);
    assert_eq!(r.headers()["cache-control"], "no-store");
    assert_eq!(called.load(Ordering::SeqCst), 0);
}
