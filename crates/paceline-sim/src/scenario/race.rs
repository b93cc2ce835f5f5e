//! The race: two fleets, one quota each, one gateway.
//!
//! Both fleets have `workers` workers and the same `jobs` jobs (one request
//! each), each fleet its own API key with a token bucket of depth `q`
//! refilling `q` per `w` seconds (8 per 2 s: 4/s). They share a gateway
//! whose edge passes `capacity` requests per second, shedding the heaviest
//! key first. The cooperative fleet runs the SDK, which reads the
//! published headers and paces itself; the naive fleet sends again every
//! `naive_retry` after any failure, ignoring `Retry-After`.
//!
//! The floor for `jobs` jobs: the burst at once, the rest at the refill
//! rate — for the defaults 8 at once, then 42 at 4/s, 10.5 s.
//!
//! ```
//! use paceline_sim::scenario::race::{self, RaceParams};
//!
//! let r = race::run(&RaceParams::default(), 1);
//! let coop = &r.fleets[0];
//! assert_eq!((coop.jobs_done, coop.requests, coop.rejected_429), (50, 50, 0));
//! assert!((coop.finished_at_s.unwrap() - 10.5).abs() <= 0.25);
//! ```

use paceline_core::{ManualClock, Nanos, Plan, Policy};

use crate::fleet::{self, AnyFleet, Fleet, FleetSpec, Naive, Network};
use crate::gateway::Gateway;
use crate::report::{round3, FleetReport, RaceReport};
use crate::scenario::START;
use crate::sdk::Cooperative;
use crate::svg::{Chart, Series};

/// The numbers of the race.
#[derive(Clone, Debug, PartialEq)]
pub struct RaceParams {
    /// Workers per fleet.
    pub workers: u32,
    /// Jobs per fleet.
    pub jobs: u64,
    /// Bucket depth `q`.
    pub quota: u64,
    /// Seconds `w` to refill the whole bucket (rate `q / w`).
    pub window_s: u64,
    /// Requests per second the gateway's edge passes (0: unlimited).
    pub capacity: u64,
    /// The naive fleet's pause before sending again.
    pub naive_retry: Nanos,
    /// One-way latency between a worker and the gateway.
    pub latency: Nanos,
    /// Width of a timeline bucket.
    pub bucket: Nanos,
}

impl Default for RaceParams {
    fn default() -> Self {
        RaceParams {
            workers: 10,
            jobs: 50,
            quota: 8,
            window_s: 2,
            capacity: 40,
            naive_retry: Nanos::from_millis(100),
            latency: Nanos::from_millis(10),
            bucket: Nanos::SECOND,
        }
    }
}

impl RaceParams {
    /// The bucket's refill rate, tokens per second (`quota / window_s`).
    pub fn rate_per_s(&self) -> f64 {
        self.quota as f64 / self.window_s as f64
    }

    /// The race's floor: [`floor_s`] for these numbers.
    pub fn floor_s(&self) -> f64 {
        floor_s(self.jobs, self.quota, self.rate_per_s())
    }
}

/// The fastest `jobs` jobs (one request each) can finish under a token
/// bucket of depth `burst` refilling `rate_per_s` tokens a second: the
/// burst at once, the rest at the refill rate.
///
/// ```
/// // 8 at once, then 42 at 4/s
/// assert_eq!(paceline_sim::scenario::race::floor_s(50, 8, 4.0), 10.5);
/// ```
pub fn floor_s(jobs: u64, burst: u64, rate_per_s: f64) -> f64 {
    jobs.saturating_sub(burst) as f64 / rate_per_s
}

/// The cooperative and the naive fleet, side by side, each on its own key.
pub(crate) struct Contest {
    pub(crate) plan: Plan,
    pub(crate) workers: u32,
    pub(crate) jobs: u64,
    pub(crate) capacity: u64,
    pub(crate) naive_retry: Nanos,
    pub(crate) net: Network,
}

impl Contest {
    pub(crate) fn run(&self, seed: u64) -> Vec<FleetReport> {
        let clock = ManualClock::new(START);
        let mut gw = Gateway::new(self.plan.clone(), 2);
        if self.capacity > 0 {
            gw = gw.with_capacity(self.capacity);
        }
        let spec = |name: &str| FleetSpec {
            name: name.into(),
            workers: self.workers,
            jobs: self.jobs,
        };
        let coop = Cooperative::new(clock.clone(), seed, &gw, 0, START);
        let mut coop = Fleet::new(spec("cooperative"), coop);
        let mut naive = Fleet::new(
            spec("naive"),
            Naive {
                retry_every: self.naive_retry,
            },
        );
        let mut fleets: [&mut dyn AnyFleet; 2] = [&mut coop, &mut naive];
        fleet::run(&mut fleets, &mut gw, clock, START, self.net).0
    }
}

/// Runs the race.
pub fn run(params: &RaceParams, seed: u64) -> RaceReport {
    let plan = Plan::new(
        "race",
        vec![Policy::token_bucket("burst", params.quota, params.window_s).expect("a valid bucket")],
    )
    .expect("one policy");
    let floor = params.floor_s();
    let contest = Contest {
        plan,
        workers: params.workers,
        jobs: params.jobs,
        capacity: params.capacity,
        naive_retry: params.naive_retry,
        net: Network {
            latency: params.latency,
            bucket: params.bucket,
            deadline: Nanos::from_secs_f64(floor * 20.0 + 60.0),
        },
    };
    RaceReport {
        fleets: contest.run(seed),
        floor_s: round3(floor),
        seed,
    }
}

/// The fleets side by side, the way the demo's table shows them.
pub fn table(fleets: &[FleetReport]) -> String {
    let mut header = vec!["measure"];
    header.extend(fleets.iter().map(|f| f.name.as_str()));
    let row = |label: &str, f: &dyn Fn(&FleetReport) -> String| {
        let mut r = vec![label.to_string()];
        r.extend(fleets.iter().map(f));
        r
    };
    let c = crate::table::count;
    let rows = vec![
        row("jobs done", &|f| format!("{}/{}", f.jobs_done, f.jobs)),
        row("requests sent", &|f| c(f.requests)),
        row("rejected 429", &|f| c(f.rejected_429)),
        row("rejected 503", &|f| c(f.rejected_503)),
        row("dropped at the edge", &|f| c(f.dropped)),
        row("retries", &|f| c(f.retries)),
        row("dropped by the client", &|f| c(f.local_drops)),
        row("finished at", &|f| match f.finished_at_s {
            Some(s) => format!("{s:.2} s"),
            None => "—".into(),
        }),
    ];
    crate::table::render(&header, &rows)
}

/// Requests over time, per fleet: sent (solid) and served (dashed).
pub fn svg_fleets(title: &str, fleets: &[FleetReport]) -> String {
    let mut chart = Chart::lines(title, "seconds from the start", "requests per second");
    for (i, f) in fleets.iter().enumerate() {
        let b = f.timeline.bucket_s.max(1e-9);
        let per_s = |v: &[u64]| -> Vec<(f64, f64)> {
            let mut pts: Vec<(f64, f64)> = v
                .iter()
                .enumerate()
                .map(|(j, &n)| (j as f64 * b, n as f64 / b))
                .collect();
            pts.push((v.len() as f64 * b, 0.0));
            pts
        };
        chart = chart
            .series(
                Series::new(format!("{}: sent", f.name), per_s(&f.timeline.sent))
                    .step()
                    .color(i),
            )
            .series(
                Series::new(
                    format!("{}: served (200)", f.name),
                    per_s(&f.timeline.served),
                )
                .step()
                .dashed()
                .color(i),
            );
    }
    chart.render()
}

/// The race as a plot.
pub fn svg(report: &RaceReport) -> String {
    svg_fleets(
        &format!(
            "The race: requests over time (floor {:.1} s)",
            report.floor_s
        ),
        &report.fleets,
    )
}
