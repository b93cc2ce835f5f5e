//! The nightly export: the race at the scale of a partner job.
//!
//! `records` records, one request each, under a quota of `quota` per
//! `window_s` seconds (10/s with a burst of 50), pulled by `workers`
//! workers. The cooperative fleet shares one SDK client across its workers;
//! the naive fleet retries immediately on any failure. Each round trip
//! takes `2 · latency`; the default (200 ms) is what makes 40 workers
//! retrying immediately arrive at the 200 req/s of the design document.
//!
//! The bucket sets the pace, not the client: the floor is the burst at
//! once and the rest at the refill rate, 11,950 / 10 = 1,195 s. Retrying
//! harder cannot beat it; it only multiplies the requests: a naive worker
//! sends one request per round trip for the whole run, so the fleet sends
//! about `workers / round trip × floor` (40 / 0.2 s × 1,195 s ≈ 239,000),
//! where the design document's round ~200,000 counts 200 req/s over about
//! a thousand seconds. The cooperative fleet shares one mirrored bucket,
//! seeded from the key's usage, across its workers, so it sends one
//! request per record and meets no 429 (the document's ~12,050 leaves room
//! for a few).
//!
//! ```
//! use paceline_sim::scenario::export::{self, ExportParams};
//!
//! let small = ExportParams { records: 600, ..Default::default() };
//! let r = export::run(&small, 1);
//! assert_eq!(r.floor_s, 55.0);
//! assert!(r.fleets[1].requests > 10 * r.fleets[0].requests);
//! ```

use paceline_core::{Nanos, Plan, Policy};

use crate::fleet::Network;
use crate::report::{round3, ExportReport};
use crate::scenario::race::{floor_s, svg_fleets, Contest};

/// The numbers of the export.
#[derive(Clone, Debug, PartialEq)]
pub struct ExportParams {
    /// Records to fetch, one request each.
    pub records: u64,
    /// Workers per fleet.
    pub workers: u32,
    /// Bucket depth (the burst).
    pub quota: u64,
    /// Seconds to refill the whole bucket (rate `quota / window_s`).
    pub window_s: u64,
    /// Requests per second the gateway's edge passes (0: unlimited).
    pub capacity: u64,
    /// The naive fleet's pause before retrying (zero: immediately).
    pub naive_retry: Nanos,
    /// One-way latency.
    pub latency: Nanos,
    /// Width of a timeline bucket.
    pub bucket: Nanos,
}

impl Default for ExportParams {
    fn default() -> Self {
        ExportParams {
            records: 12_000,
            workers: 40,
            quota: 50,
            window_s: 5,
            capacity: 0,
            naive_retry: Nanos::ZERO,
            latency: Nanos::from_millis(100),
            bucket: Nanos::from_secs(10),
        }
    }
}

/// Runs the export.
pub fn run(params: &ExportParams, seed: u64) -> ExportReport {
    let plan = Plan::new(
        "export",
        vec![Policy::token_bucket("burst", params.quota, params.window_s).expect("a valid bucket")],
    )
    .expect("one policy");
    let rate_per_s = params.quota as f64 / params.window_s as f64;
    let floor = floor_s(params.records, params.quota, rate_per_s);
    let contest = Contest {
        plan,
        workers: params.workers,
        jobs: params.records,
        capacity: params.capacity,
        naive_retry: params.naive_retry,
        net: Network {
            latency: params.latency,
            bucket: params.bucket,
            deadline: Nanos::from_secs_f64(floor * 5.0 + 600.0),
        },
    };
    ExportReport {
        floor_s: round3(floor),
        fleets: contest.run(seed),
        seed,
    }
}

/// The export as a plot.
pub fn svg(report: &ExportReport) -> String {
    svg_fleets(
        &format!(
            "The export: requests over time (floor {:.0} s)",
            report.floor_s
        ),
        &report.fleets,
    )
}

/// The export as a table, with what the numbers come from.
pub fn table(report: &ExportReport) -> String {
    let mut t = crate::scenario::race::table(&report.fleets);
    t.push_str(&format!("\nfloor: {:.1} s\n", report.floor_s));
    for f in &report.fleets {
        if let Some(at) = f.finished_at_s.filter(|s| *s > 0.0) {
            t.push_str(&format!(
                "{}: {} requests in {:.0} s = {:.1} req/s ({:.2} requests per record)\n",
                f.name,
                crate::table::count(f.requests),
                at,
                f.requests as f64 / at,
                f.requests as f64 / f.jobs.max(1) as f64
            ));
        }
    }
    t
}
