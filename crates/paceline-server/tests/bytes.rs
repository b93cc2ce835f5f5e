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
