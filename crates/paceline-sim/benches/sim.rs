//! Simulator throughput: how long a million simulated requests take.
//!
//! `herd` with 250,000 clients sends 1,000,000 requests (each client a
//! first attempt and one retry, under both strategies; half of them go
//! through the real SDK with headers emitted and parsed). `export` runs the
//! default nightly export (about 250,000 requests, nearly all from the naive
//! fleet) and `race` the default race, for scale.
//!
//! Run: `cargo bench -p paceline-sim --bench sim`

use criterion::{criterion_main, Criterion};
use paceline_sim::scenario::{export, herd, race};

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("sim");
    g.sample_size(10);
    let million = herd::HerdParams {
        clients: 250_000,
        ..Default::default()
    };
    g.bench_function("herd_1M_requests", |b| b.iter(|| herd::run(&million, 1)));
    g.bench_function("export_default", |b| {
        b.iter(|| export::run(&export::ExportParams::default(), 1))
    });
    g.bench_function("race_default", |b| {
        b.iter(|| race::run(&race::RaceParams::default(), 1))
    });
    g.finish();
}

mod group {
    #![allow(missing_docs)]
    criterion::criterion_group!(benches, super::bench);
}
criterion_main!(group::benches);
