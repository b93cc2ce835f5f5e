//! The idempotency layer's own cost per request, in process (in-memory
//! store, no sockets, a current-thread runtime): a handler alone, the
//! same handler behind the layer for a request it leaves alone (no key
//! on an optional route), a replay (the same key and body every time,
//! the handler never called), and a first execution (a new key every
//! time: its own task, the body digested as it is read, the answer read
//! and stored, the store at its cap evicting the oldest). Requests are
//! built outside the timed part; the response body is read inside it, in
//! every variant alike.

#![allow(missing_docs)] // criterion_group! generates undocumented items

use std::convert::Infallible;

use bytes::Bytes;
use criterion::{black_box, criterion_group, BatchSize, Criterion};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use paceline_core::ManualClock;
use paceline_server::idempotency::{
    BearerScope, IdempotencyLayer, IdempotencyMode, IdempotencySettings, MemoryIdempotencyStore,
};
use tower::{Layer, Service, ServiceExt};

const BODY: &[u8] = br#"{"shipment":"shp_1","service":"ground"}"#;

/// A handler that reads its body and answers a small JSON label.
fn handler<B>(
) -> impl Service<Request<B>, Response = Response<Full<Bytes>>, Error = Infallible, Future: Send>
       + Clone
       + Send
       + 'static
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
{
    tower::service_fn(|req: Request<B>| async move {
        let _ = req.into_body().collect().await;
        Ok::<_, Infallible>(
            Response::builder()
                .status(201)
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from_static(
                    br#"{"label_id":"lbl_77120","tracking_number":"1Z999AA10123456784"}"#,
                )))
                .unwrap(),
        )
    })
}

fn request(key: Option<String>) -> Request<Full<Bytes>> {
    let mut b = Request::post("/v1/labels")
        .header("authorization", "Bearer sk_bench")
        .header("content-type", "application/json")
        .header("content-length", BODY.len());
    if let Some(k) = key {
        b = b.header("idempotency-key", k);
    }
    b.body(Full::new(Bytes::from_static(BODY))).unwrap()
}

fn layer(
    mode: IdempotencyMode,
) -> IdempotencyLayer<MemoryIdempotencyStore, ManualClock, BearerScope> {
    IdempotencyLayer::new(
        // a cap a first execution per iteration keeps reaching
        MemoryIdempotencyStore::new(8 * 1024 * 1024),
        ManualClock::at_unix_secs(1_790_000_000),
        BearerScope::new(mode),
        IdempotencySettings::default(),
    )
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut g = c.benchmark_group("idempotency");

    let alone = handler::<Full<Bytes>>();
    g.bench_function("handler_alone", |b| {
        b.iter_batched(
            || request(None),
            |req| {
                rt.block_on(async {
                    let res = alone.clone().oneshot(req).await.unwrap();
                    black_box(res.into_body().collect().await.unwrap());
                })
            },
            BatchSize::SmallInput,
        )
    });

    let passed = layer(IdempotencyMode::Optional).layer(handler());
    g.bench_function("left_alone", |b| {
        b.iter_batched(
            || request(None),
            |req| {
                rt.block_on(async {
                    let res = passed.clone().oneshot(req).await.unwrap();
                    black_box(res.into_body().collect().await.unwrap());
                })
            },
            BatchSize::SmallInput,
        )
    });

    let replayed = layer(IdempotencyMode::Required).layer(handler());
    rt.block_on(async {
        let first = replayed
            .clone()
            .oneshot(request(Some("k-1".into())))
            .await
            .unwrap();
        assert_eq!(first.status(), 201);
    });
    g.bench_function("replay", |b| {
        b.iter_batched(
            || request(Some("k-1".into())),
            |req| {
                rt.block_on(async {
                    let res = replayed.clone().oneshot(req).await.unwrap();
                    debug_assert!(res.headers().contains_key("idempotent-replayed"));
                    black_box(res.into_body().collect().await.unwrap());
                })
            },
            BatchSize::SmallInput,
        )
    });

    let fresh = layer(IdempotencyMode::Required).layer(handler());
    let mut n = 0u64;
    g.bench_function("first_execution", |b| {
        b.iter_batched(
            || {
                n += 1;
                request(Some(format!("k-{n}")))
            },
            |req| {
                rt.block_on(async {
                    let res = fresh.clone().oneshot(req).await.unwrap();
                    black_box(res.into_body().collect().await.unwrap());
                })
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, bench);

fn main() {
    benches();
    criterion::Criterion::default()
        .configure_from_args()
        .final_summary();
}
