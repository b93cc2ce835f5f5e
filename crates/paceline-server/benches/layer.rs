//! The layer's own cost per request, in process (in-memory store, no
//! sockets): a trivial handler alone, the same handler behind the layer
//! (admitted), and a rejection (plain, while the key is blocked by
//! escalation, and alternating between two plans so that the per-thread
//! memo of the last denial never helps); then the same behind an axum
//! router with a JSON handler. Requests are built outside the timed part
//! (a server gets them from its HTTP parser); the response is dropped
//! inside it, in every variant alike.

#![allow(missing_docs)] // criterion_group! generates undocumented items

use std::convert::Infallible;
use std::future::Future;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use criterion::{black_box, criterion_group, BatchSize, Criterion};
use http::{Request, Response};
use http_body_util::Full;
use paceline_core::{ManualClock, MemoryStore, Plan, Policy};
use paceline_server::{EscalationConfig, Limits, RateLimiter};
use tower::{Layer, Service};

fn handler(
) -> impl Service<Request<()>, Response = Response<Full<Bytes>>, Error = Infallible, Future: Send>
       + Clone
       + Send
       + 'static {
    tower::service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(
            b"{\"ok\":true}",
        ))))
    })
}

/// Drives a future that is ready at once (in-memory store, trivial handler).
fn run<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    match f.as_mut().poll(&mut cx) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("the bench expects ready futures"),
    }
}

fn request(key: &str) -> Request<()> {
    Request::post("/v1/labels")
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(())
        .unwrap()
}

fn limiter(escalation: bool) -> RateLimiter<MemoryStore, ManualClock> {
    let roomy = Plan::new(
        "roomy",
        vec![
            Policy::token_bucket("burst", 1_000_000_000, 1).unwrap(),
            Policy::daily("daily", 1_000_000_000_000).unwrap(),
        ],
    )
    .unwrap();
    let tiny = Plan::new(
        "tiny",
        vec![
            Policy::token_bucket("burst", 1, 1000).unwrap(),
            Policy::daily("daily", 10_000).unwrap(),
        ],
    )
    .unwrap();
    let other = Plan::new("other", tiny.policies().to_vec()).unwrap();
    let limits = Limits::builder()
        .plan(roomy)
        .plan(tiny)
        .plan(other)
        .key("sk_admit", "roomy")
        .key("sk_reject", "tiny")
        .key("sk_other", "other")
        .escalation(EscalationConfig {
            enabled: escalation,
            ..Default::default()
        })
        .build()
        .unwrap();
    RateLimiter::new(
        limits,
        MemoryStore::new(),
        ManualClock::at_unix_secs(1_790_769_600),
    )
}

/// Times one call with its request built outside the timed part, the
/// response dropped inside it: the layer's work, the handler's and the
/// cost of freeing what they answered.
fn time<S, B>(b: &mut criterion::Bencher<'_>, svc: &mut S, make: impl Fn() -> Request<B>)
where
    S: Service<Request<B>, Error = Infallible>,
{
    b.iter_batched(
        &make,
        |req| {
            let res = run(svc.call(req)).unwrap();
            black_box(&res);
        },
        BatchSize::SmallInput,
    )
}

fn axum_app() -> axum::Router {
    axum::Router::new().route(
        "/v1/labels",
        axum::routing::post(|| async { axum::Json(serde_json::json!({ "ok": true })) }),
    )
}

fn axum_request(key: &str) -> Request<axum::body::Body> {
    let (parts, ()) = request(key).into_parts();
    Request::from_parts(parts, axum::body::Body::empty())
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("layer");
    let mut bare = handler();
    g.bench_function("bare_handler", |b| {
        time(b, &mut bare, || request("sk_admit"))
    });

    let mut svc = limiter(false).layer().layer(handler());
    assert_eq!(run(svc.call(request("sk_admit"))).unwrap().status(), 200);
    g.bench_function("admitted", |b| time(b, &mut svc, || request("sk_admit")));
    let _ = run(svc.call(request("sk_reject")));
    assert_eq!(run(svc.call(request("sk_reject"))).unwrap().status(), 429);
    g.bench_function("rejected", |b| time(b, &mut svc, || request("sk_reject")));
    let _ = run(svc.call(request("sk_other")));
    let flip = std::cell::Cell::new(false);
    g.bench_function("rejected_two_plans", |b| {
        time(b, &mut svc, || {
            flip.set(!flip.get());
            request(if flip.get() { "sk_reject" } else { "sk_other" })
        })
    });

    let mut esc = limiter(true).layer().layer(handler());
    for _ in 0..100 {
        let _ = run(esc.call(request("sk_reject")));
    }
    g.bench_function("rejected_blocked", |b| {
        time(b, &mut esc, || request("sk_reject"))
    });

    // the same behind an axum router with a JSON handler, as an app has it
    let mut app = axum_app();
    g.bench_function("axum_bare", |b| {
        time(b, &mut app, || axum_request("sk_admit"))
    });
    let mut app = limiter(false).layer().layer(axum_app());
    assert_eq!(
        run(app.call(axum_request("sk_admit"))).unwrap().status(),
        200
    );
    g.bench_function("axum_admitted", |b| {
        time(b, &mut app, || axum_request("sk_admit"))
    });
    let _ = run(app.call(axum_request("sk_reject")));
    assert_eq!(
        run(app.call(axum_request("sk_reject"))).unwrap().status(),
        429
    );
    g.bench_function("axum_rejected", |b| {
        time(b, &mut app, || axum_request("sk_reject"))
    });
    g.finish();
}

criterion_group!(benches, bench);

/// `LAYER_COUNT=<variant>:<n>` runs one variant n times without criterion,
/// for instruction counts under a profiler (wall time on a shared machine
/// is noisy; instructions are not).
fn main() {
    if let Ok(spec) = std::env::var("LAYER_COUNT") {
        let (variant, n) = spec.split_once(':').expect("variant:n");
        count(variant, n.parse().expect("a count"));
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}

fn count(variant: &str, n: u64) {
    let mut bare = handler();
    let mut plain = limiter(false).layer().layer(handler());
    let mut esc = limiter(true).layer().layer(handler());
    let mut app_bare = axum_app();
    let mut app = limiter(false).layer().layer(axum_app());
    for _ in 0..100 {
        let _ = run(app.call(axum_request("sk_reject")));
        let _ = run(plain.call(request("sk_reject")));
        let _ = run(plain.call(request("sk_other")));
        let _ = run(esc.call(request("sk_reject")));
    }
    for i in 0..n {
        let status = match variant {
            "bare" => run(bare.call(request("sk_admit"))).unwrap().status(),
            "admitted" => run(plain.call(request("sk_admit"))).unwrap().status(),
            "rejected" => run(plain.call(request("sk_reject"))).unwrap().status(),
            "two_plans" => {
                let key = if i % 2 == 0 { "sk_reject" } else { "sk_other" };
                run(plain.call(request(key))).unwrap().status()
            }
            "blocked" => run(esc.call(request("sk_reject"))).unwrap().status(),
            "axum_bare" => run(app_bare.call(axum_request("sk_admit")))
                .unwrap()
                .status(),
            "axum_admitted" => run(app.call(axum_request("sk_admit"))).unwrap().status(),
            "axum_rejected" => run(app.call(axum_request("sk_reject"))).unwrap().status(),
            other => panic!("unknown variant {other}"),
        };
        black_box(status);
    }
}
