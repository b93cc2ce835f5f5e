//! Many servers: one key through several gateway instances behind a
//! round-robin balancer, counted per instance and counted once.
//!
//! The plan is the Free plan's shape, shrunk so a run is short: a bucket
//! of `burst` refilled over `window_s` seconds and a daily quota of
//! `daily`. A naive fleet (which retries every `retry_ms` whatever it is
//! told) works through more jobs than the plan allows for `seconds`
//! seconds. The limit one count allows in that time is
//! `min(daily, burst + rate · seconds)`, counted from the first arrival
//! (the last token of a run can fall due just after it ends).
//!
//! With per-instance counting (every process with its own in-memory
//! store) each instance grants the key that budget again, so the key gets
//! about `instances ×` the published limit: the headers promise a limit
//! the deployment does not enforce. With a shared count (the Redis store)
//! the instances together admit exactly the limit, at one round trip a
//! decision. Leased (`share = "leased"`, slices of at most `max_slice`;
//! [`paceline_core::lease`], the code the Redis store runs) the instances
//! decide from slices of the shared count: the admitted count stays
//! within the limit plus the stated bound (`instances × 2 × max_slice`),
//! at a fraction of a round trip a decision. `weights` sends the
//! instances unequal shares of the traffic.
//!
//! ```
//! use paceline_sim::scenario::servers::{self, ServersParams};
//!
//! let r = servers::run(&ServersParams { seconds: 30, ..Default::default() }, 1);
//! assert_eq!(r.limit, 320);
//! let [alone, shared, leased] = &r.runs[..] else { panic!() };
//! assert!((319..=320).contains(&shared.admitted));
//! assert!(alone.admitted >= 3 * 320 - 3);
//! assert!(leased.admitted <= 320 + 3 * 2 * 4);
//! assert!(leased.round_trips < shared.round_trips);
//! ```

use paceline_core::{ManualClock, Nanos, Plan, Policy, Share};

use crate::fleet::{self, AnyFleet, Fleet, FleetSpec, Naive, Network};
use crate::gateway::{Counting, Gateway};
use crate::report::{round3, ServersReport, ServersRun};
use crate::scenario::START;
use crate::svg::{Chart, Series};

/// The numbers of the run.
#[derive(Clone, Debug, PartialEq)]
pub struct ServersParams {
    /// Gateway instances behind the balancer.
    pub instances: u32,
    /// Seconds the fleet keeps sending.
    pub seconds: u64,
    /// Workers of the naive fleet.
    pub workers: u32,
    /// Bucket depth.
    pub burst: u64,
    /// Seconds to refill the whole bucket.
    pub window_s: u64,
    /// Requests per UTC day.
    pub daily: u64,
    /// The naive fleet's pause before sending a refused request again.
    pub retry: Nanos,
    /// One-way latency.
    pub latency: Nanos,
    /// Each instance's share of the requests (`None`: round robin).
    pub weights: Option<Vec<u32>>,
    /// The largest slice of the leased run.
    pub max_slice: u64,
}

impl Default for ServersParams {
    fn default() -> Self {
        ServersParams {
            instances: 3,
            seconds: 120,
            workers: 10,
            burst: 20,
            window_s: 2,
            daily: 1_000,
            retry: Nanos::from_millis(100),
            latency: Nanos::from_millis(10),
            weights: None,
            max_slice: 4,
        }
    }
}

impl ServersParams {
    /// What one count admits in `seconds`: the burst at once, then the
    /// refill rate, never past the daily quota.
    pub fn limit(&self) -> u64 {
        let refilled = self.burst.saturating_mul(self.seconds) / self.window_s.max(1);
        self.daily.min(self.burst.saturating_add(refilled))
    }

    fn plan(&self, share: Share) -> Plan {
        Plan::new(
            "servers",
            vec![
                Policy::token_bucket("burst", self.burst, self.window_s)
                    .expect("a valid bucket")
                    .with_share(share),
                Policy::daily("daily", self.daily)
                    .expect("a valid quota")
                    .with_share(share),
            ],
        )
        .expect("two policies")
    }
}

/// Runs the fleet once against per-instance counting, once against a
/// shared count.
pub fn run(params: &ServersParams, seed: u64) -> ServersReport {
    let limit = params.limit();
    let leased = Counting::Leased {
        slice: Nanos::from_millis(100),
    };
    let runs = [Counting::PerInstance, Counting::Shared, leased]
        .into_iter()
        .map(|counting| one(params, counting, limit))
        .collect();
    ServersReport {
        instances: params.instances,
        seconds: params.seconds,
        limit,
        weights: params.weights.clone(),
        max_slice: params.max_slice,
        runs,
        seed,
    }
}

fn one(params: &ServersParams, counting: Counting, limit: u64) -> ServersRun {
    let clock = ManualClock::new(START);
    let share = match counting {
        Counting::Leased { .. } => Share::Leased {
            max_slice: params.max_slice.max(1),
        },
        _ => Share::Exact,
    };
    let mut gw =
        Gateway::new(params.plan(share), 1).with_instances(params.instances as usize, counting);
    if let Some(w) = &params.weights {
        gw = gw.with_weights(w);
    }
    let spec = FleetSpec {
        name: "naive".into(),
        workers: params.workers,
        // More jobs than any deployment here admits, so the fleet is still
        // sending when the run ends.
        jobs: limit
            .saturating_mul(u64::from(params.instances))
            .saturating_mul(2)
            .saturating_add(1),
    };
    let mut fleet = Fleet::new(
        spec,
        Naive {
            retry_every: params.retry,
        },
    );
    let mut refs: [&mut dyn AnyFleet; 1] = [&mut fleet];
    let net = Network {
        latency: params.latency,
        bucket: Nanos::from_secs(1),
        // Measured from the first arrival, when the key's first token goes.
        deadline: Nanos::from_secs(params.seconds).saturating_add(params.latency),
    };
    let (reports, _) = fleet::run(&mut refs, &mut gw, clock, START, net);
    let f = &reports[0];
    let stats = gw.stats();
    ServersRun {
        store: match counting {
            Counting::PerInstance => "per_instance",
            Counting::Leased { .. } => "leased",
            _ => "shared",
        }
        .into(),
        round_trips: stats.round_trips,
        round_trips_per_decision: round3(stats.round_trips as f64 / stats.received.max(1) as f64),
        requests: stats.received,
        admitted: stats.served,
        rejected_429: stats.limited,
        admitted_per_limit: round3(stats.served as f64 / limit.max(1) as f64),
        jobs_done: f.jobs_done,
        admitted_per_s: f.timeline.served.clone(),
    }
}

/// The run as a plot: admissions so far against time, per way of
/// counting, beside the published limit.
pub fn svg(report: &ServersReport) -> String {
    let mut chart = Chart::lines(
        &format!(
            "One key through {} instances: admitted so far",
            report.instances
        ),
        "seconds",
        "requests admitted",
    );
    for (i, r) in report.runs.iter().enumerate() {
        let label = match r.store.as_str() {
            "per_instance" => "a count per instance (memory store)",
            "leased" => "one shared count, leased slices (redis store)",
            _ => "one shared count (redis store)",
        };
        let mut total = 0;
        let mut pts = vec![(0.0, 0.0)];
        for (s, n) in r.admitted_per_s.iter().enumerate() {
            total += n;
            pts.push(((s + 1) as f64, total as f64));
        }
        chart = chart.series(Series::new(label, pts).color(i));
    }
    let limit = report.limit as f64;
    chart = chart.series(
        Series::new(
            "the published limit",
            vec![(0.0, limit), (report.seconds as f64, limit)],
        )
        .dashed()
        .color(3),
    );
    chart.render()
}

/// The run as a table, with what the numbers come from.
pub fn table(report: &ServersReport) -> String {
    use crate::table::count;
    let rows: Vec<Vec<String>> = report
        .runs
        .iter()
        .map(|r| {
            vec![
                match r.store.as_str() {
                    "per_instance" => "a count per instance (memory)".to_string(),
                    "leased" => "one shared count, leased (redis)".to_string(),
                    _ => "one shared count (redis)".to_string(),
                },
                count(r.requests),
                count(r.admitted),
                count(r.rejected_429),
                format!("{:.2}×", r.admitted_per_limit),
                format!("{:.3}", r.round_trips_per_decision),
            ]
        })
        .collect();
    let mut t = crate::table::render(
        &[
            "counting",
            "requests",
            "admitted",
            "429s",
            "of the limit",
            "round trips a decision",
        ],
        &rows,
    );
    t.push_str(&format!(
        "\n{} instances, {}, {} s: the published limit allows {} (burst, then the refill rate, never past the daily quota); leased slices of at most {} stay within it plus {}.\n",
        report.instances,
        match &report.weights {
            Some(w) => format!("weighted {w:?}"),
            None => "round robin".to_string(),
        },
        report.seconds,
        count(report.limit),
        report.max_slice,
        u64::from(report.instances) * 2 * report.max_slice,
    ));
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_instance_counting_multiplies_the_limit_and_a_shared_count_does_not() {
        for instances in [1u32, 2, 3, 5] {
            let p = ServersParams {
                instances,
                seconds: 60,
                ..Default::default()
            };
            let r = run(&p, 7);
            assert_eq!(r.limit, 620);
            let (alone, shared) = (&r.runs[0], &r.runs[1]);
            // The last token can fall due just after the run ends.
            assert!(
                (619..=620).contains(&shared.admitted),
                "{instances} instances: {}",
                shared.admitted
            );
            let n = u64::from(instances);
            // Each instance grants the whole budget; round robin can leave
            // the last refill of an instance unspent.
            assert!(
                alone.admitted <= n * 620 && alone.admitted + n >= n * 620,
                "{instances} instances admitted {}",
                alone.admitted
            );
            assert!(alone.jobs_done <= alone.admitted && alone.jobs_done + 20 >= alone.admitted);
        }
    }

    #[test]
    fn the_daily_quota_is_one_count_when_shared() {
        let r = run(&ServersParams::default(), 1);
        assert_eq!(r.limit, 1_000);
        assert_eq!(r.runs[1].admitted, 1_000);
        assert_eq!(r.runs[0].admitted, 3_000);
        assert!(table(&r).contains("3.00×"));
        assert_eq!(r.runs[1].admitted_per_s.iter().sum::<u64>(), 1_000);
        assert!(svg(&r).contains("the published limit"));
    }

    #[test]
    fn leased_slices_hold_the_limit_within_the_bound_at_a_fraction_of_the_round_trips() {
        // a global limit of 2,000 a second, offered far more, unevenly
        let p = ServersParams {
            seconds: 10,
            burst: 2_000,
            window_s: 1,
            daily: 100_000_000,
            workers: 100,
            retry: Nanos::from_millis(10),
            latency: Nanos::from_millis(5),
            weights: Some(vec![3, 2, 1]),
            max_slice: 40,
            ..Default::default()
        };
        let r = run(&p, 1);
        let (shared, leased) = (&r.runs[1], &r.runs[2]);
        assert_eq!(r.limit, 22_000);
        assert_eq!(shared.admitted, 22_000);
        let bound = 3 * 2 * 40;
        assert!(leased.admitted <= r.limit + bound, "{}", leased.admitted);
        assert!(leased.admitted * 100 >= r.limit * 95, "{}", leased.admitted);
        assert_eq!(shared.round_trips_per_decision, 1.0);
        assert!(leased.round_trips_per_decision <= 0.05, "{leased:?}");
        // each second within the limit's refill plus the bound, after the
        // first (which also spends the full bucket)
        for (s, &n) in leased.admitted_per_s.iter().enumerate().skip(1) {
            assert!(n <= 2_000 + bound, "second {s}: {n}");
        }
        assert!(table(&r).contains("leased"));
    }

    #[test]
    fn same_seed_same_report() {
        let p = ServersParams {
            seconds: 20,
            ..Default::default()
        };
        assert_eq!(run(&p, 3), run(&p, 3));
    }
}
