//! Content-bytes policies are charged the announced body length.

use paceline_core::{ManualClock, MemoryStore, Plan, Policy, Unit};
use paceline_server::{Limits, RateLimiter};
use tower::{Service, ServiceExt};

#[tokio::test]
async fn upload_bytes_are_charged_by_content_length() {
    let plan = Plan::new(
        "uploads",
        vec![
            Policy::token_bucket("burst", 100, 1).unwrap(),
            Policy::fixed_window("bytes", 10_000, 60)
                .unwrap()
                .with_unit(Unit::ContentBytes)
                .unwrap(),
        ],
    )
    .unwrap();
    let limits = Limits::builder()
        .plan(plan)
        .key("sk_1", "uploads")
        .build()
        .unwrap();
    let limiter = RateLimiter::new(
        limits,
        MemoryStore::new(),
        ManualClock::at_unix_secs(1_800_000_000),
    );
    let ok = tower::service_fn(|_req: http::Request<()>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(
            http_body_util::Empty::<bytes::Bytes>::new(),
        ))
    });
    let mut svc = tower::ServiceBuilder::new()
        .layer(limiter.layer())
        .service(ok);
    let upload = |len: u64| {
        http::Request::post("/v1/files")
            .header("authorization", "Bearer sk_1")
            .header("content-length", len.to_string())
            .body(())
            .unwrap()
    };
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
    let plan = Plan::new(
        "uploads",
        vec![Policy::fixed_window("bytes", 1_000, 60)
            .unwrap()
            .with_unit(Unit::ContentBytes)
            .unwrap()],
    )
    .unwrap();
    let limits = Limits::builder()
        .plan(plan)
        .key("sk_1", "uploads")
        .build()
        .unwrap();
    let limiter = RateLimiter::new(
        limits,
        MemoryStore::new(),
        ManualClock::at_unix_secs(1_800_000_000),
    );
    let called = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = called.clone();
    let ok = tower::service_fn(move |_req: http::Request<()>| {
        seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async {
            Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Empty::<
                bytes::Bytes,
            >::new()))
        }
    });
    let mut svc = tower::ServiceBuilder::new()
        .layer(limiter.layer())
        .service(ok);
    let chunked = http::Request::post("/v1/files")
        .header("authorization", "Bearer sk_1")
        .header("transfer-encoding", "chunked")
        .body(())
        .unwrap();
    let r = svc.ready().await.unwrap().call(chunked).await.unwrap();
    assert_eq!(r.status(), 411);
    assert_eq!(r.headers()["cache-control"], "no-store");
    assert_eq!(called.load(std::sync::atomic::Ordering::SeqCst), 0);
}
