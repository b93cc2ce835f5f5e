//! Invariants of the race over many settings: nobody beats the bucket, and
//! a client that reads the headers is not rejected.

use paceline_core::Nanos;
use paceline_sim::scenario::race::{self, RaceParams};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn no_fleet_beats_the_floor_and_the_cooperative_one_is_never_rejected(
        workers in 1u32..16,
        jobs in 1u64..80,
        quota in 1u64..20,
        window_s in 1u64..4,
        latency_ms in 0u64..60,
        seed in any::<u64>(),
    ) {
        let p = RaceParams {
            workers,
            jobs,
            quota,
            window_s,
            capacity: 0,
            latency: Nanos::from_millis(latency_ms),
            ..RaceParams::default()
        };
        let r = race::run(&p, seed);
        let floor = race::floor_s(jobs, quota, quota as f64 / window_s as f64);
        for f in &r.fleets {
            prop_assert_eq!(f.jobs_done, jobs, "{}", f.name);
            let at = f.finished_at_s.expect("finished");
            prop_assert!(at + 1e-3 >= floor, "{} finished at {} before the floor {}", f.name, at, floor);
            prop_assert!(f.requests >= jobs);
        }
        let coop = &r.fleets[0];
        prop_assert_eq!(coop.rejected_429, 0, "{:?}", coop);
        prop_assert_eq!(coop.requests, jobs);
    }
}
