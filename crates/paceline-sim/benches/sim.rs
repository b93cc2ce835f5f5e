//! Simulator throughput.
//!
//! - `load_1M_requests`: 1,000 SDK clients × 1,000 jobs, every request the
//!   whole way (SDK, engine, limiter, header emitter, parser): the cost any
//!   scenario pays per request.
//! - `export_default`: the nightly export (about 250,000 requests, nearly
//!   all from the naive fleet, which reads no headers).
//! - `herd_default`: 10,000 SDK instances and 10,000 bare clients, each
//!   rejected once and retrying once (40,000 requests).
//! - `race_default`: the two-fleet race.
//!
//! Run: `cargo bench -p paceline-sim --bench sim`

use criterion::{criterion_main, Criterion};
use paceline_sim::scenario::{export, herd, load, race};

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("sim");
    g.sample_size(10);
    let million = load::LoadParams::default();
    g.bench_function("load_1M_requests", |b| b.iter(|| load::run(&million, 1)));
    g.bench_function("export_default", |b| {
        b.iter(|| export::run(&export::ExportParams::default(), 1))
    });
    g.bench_function("herd_default", |b| {
        b.iter(|| herd::run(&herd::HerdParams::default(), 1))
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
