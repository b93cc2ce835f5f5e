//! The SDK's own cost per request: the pacing decision before it, and the
//! header parse plus state update after it.

#![allow(missing_docs)]

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use http::HeaderMap;
use paceline_client::{After, Before, Client, Observation, RequestInfo};
use paceline_core::{Clock, ManualClock, Nanos};

fn headers() -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(
        "ratelimit-policy",
        r#""burst";q=100000;w=2, "daily";q=100000000;w=86400"#
            .parse()
            .unwrap(),
    );
    h.insert(
        "ratelimit",
        r#""burst";r=99000;t=1, "daily";r=99999000;t=21600"#
            .parse()
            .unwrap(),
    );
    h.insert("content-type", "application/json".parse().unwrap());
    h
}

fn bench(c: &mut Criterion) {
    let clock = ManualClock::new(Nanos::from_secs(1_790_000_000));
    let client = Client::builder().clock(clock.clone()).seed(1).build();
    let h = headers();
    let info = RequestInfo::get("http://api.test/v1/rates");
    // seed the scope so every request is paced by the mirror
    let mut warm = client.call(info.clone());
    assert_eq!(client.before(&mut warm), Before::Go);
    client.after_response(&mut warm, 200, &h, None);

    c.bench_function("request: before + parse + after", |b| {
        b.iter(|| {
            clock.advance(Nanos::new(50_000));
            let mut call = client.call(info.clone());
            assert_eq!(client.before(&mut call), Before::Go);
            let a = client.after_response(&mut call, 200, black_box(&h), None);
            debug_assert_eq!(a, After::Done);
            black_box(a)
        })
    });
    c.bench_function("before (pacing decision)", |b| {
        b.iter(|| {
            clock.advance(Nanos::new(50_000));
            let mut call = client.call(info.clone());
            let go = client.before(&mut call);
            client.cancel(&mut call);
            black_box(go)
        })
    });
    c.bench_function("wire parse alone (paceline_wire::parse_response)", |b| {
        b.iter(|| {
            black_box(paceline_wire::parse_response(
                200,
                black_box(&h),
                None,
                clock.now(),
            ))
        })
    });
    c.bench_function("header parse (Observation::parse)", |b| {
        b.iter(|| black_box(Observation::parse(200, black_box(&h), None, clock.now())))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
