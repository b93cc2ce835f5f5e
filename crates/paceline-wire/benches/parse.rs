//! What one response's headers cost to parse, in the common cases: a 200
//! carrying the IETF `RateLimit` + `RateLimit-Policy` pair, and a 200 with
//! GitHub's `x-ratelimit-*` set; plus the emitting side for comparison.
//!
//! Run: `cargo bench -p paceline-wire --bench parse`

#![allow(missing_docs)]

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use http::{HeaderMap, HeaderName, HeaderValue};
use paceline_core::{Decision, Nanos, Outcome, Plan, Policy, PolicyStatus};
use paceline_wire::{emit, parse_response};

const NOW: Nanos = Nanos::from_secs(1_700_000_000);

fn map(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    h
}

fn common() -> [(&'static str, &'static str); 4] {
    [
        ("content-type", "application/json"),
        ("date", "Tue, 14 Nov 2023 22:13:20 GMT"),
        ("content-length", "512"),
        ("server", "shiplane"),
    ]
}

fn bench(c: &mut Criterion) {
    let mut ietf = common().to_vec();
    ietf.push((
        "ratelimit-policy",
        r#""burst";q=20;w=2, "daily";q=10000;w=86400"#,
    ));
    ietf.push(("ratelimit", r#""burst";r=7;t=1, "daily";r=2310;t=21600"#));
    let ietf = map(&ietf);

    let mut gh = common().to_vec();
    gh.extend([
        ("x-ratelimit-limit", "5000"),
        ("x-ratelimit-remaining", "4999"),
        ("x-ratelimit-used", "1"),
        ("x-ratelimit-reset", "1700003600"),
        ("x-ratelimit-resource", "core"),
    ]);
    let gh = map(&gh);

    let mut g = c.benchmark_group("parse_response");
    g.bench_function("ietf_200", |b| {
        b.iter(|| parse_response(200, black_box(&ietf), None, NOW))
    });
    g.bench_function("github_200", |b| {
        b.iter(|| parse_response(200, black_box(&gh), None, NOW))
    });
    g.finish();

    let plan = Plan::new(
        "free",
        vec![
            Policy::token_bucket("burst", 20, 2).unwrap(),
            Policy::daily("daily", 10_000).unwrap(),
        ],
    )
    .unwrap();
    let mut d = Decision {
        outcome: Outcome::Allowed,
        statuses: Default::default(),
    };
    for (r, t) in [(7, 1), (2310, 21_600)] {
        d.statuses.push(PolicyStatus {
            remaining: r,
            reset_after: Nanos::from_secs(t),
            would_deny: false,
        });
    }
    c.bench_function("emit/write_headers_ietf", |b| {
        b.iter(|| {
            let mut h = HeaderMap::new();
            emit::write_headers(&plan, black_box(&d), &emit::Dialects::default(), &mut h);
            h
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
