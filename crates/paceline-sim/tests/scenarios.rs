//! The scenarios at their default numbers land where the design documents
//! say, and the same seed always gives the same JSON.

use paceline_core::Nanos;
use paceline_sim::report::FleetReport;
use paceline_sim::scenario::{export, herd, incident, race, throttle};

fn fleet<'a>(fleets: &'a [FleetReport], name: &str) -> &'a FleetReport {
    fleets
        .iter()
        .find(|f| f.name == name)
        .unwrap_or_else(|| panic!("no fleet {name}"))
}

#[test]
fn race_cooperative_finishes_at_the_floor_without_a_429() {
    let r = race::run(&race::RaceParams::default(), 1);
    assert_eq!(r.floor_s, 10.5);
    let coop = fleet(&r.fleets, "cooperative");
    assert_eq!(coop.jobs, 50);
    assert_eq!(coop.jobs_done, 50);
    assert_eq!(coop.requests, 50);
    assert_eq!(coop.rejected_429, 0);
    assert_eq!(coop.dropped, 0);
    let at = coop.finished_at_s.expect("finished");
    assert!((at - 10.5).abs() <= 0.25, "finished at {at}");
}

#[test]
fn race_naive_pays_in_requests_and_rejections() {
    let r = race::run(&race::RaceParams::default(), 1);
    let naive = fleet(&r.fleets, "naive");
    assert_eq!(naive.jobs_done, 50);
    assert!(naive.requests >= 10 * 50, "{naive:?}");
    assert!(naive.rejected_429 + naive.dropped >= 9 * 50, "{naive:?}");
    // the bucket sets the pace: hammering does not beat the floor
    assert!(naive.finished_at_s.expect("finished") >= 10.5);
}

#[test]
fn race_cooperative_holds_for_other_seeds() {
    for seed in [2, 3, 99] {
        let r = race::run(&race::RaceParams::default(), seed);
        let coop = fleet(&r.fleets, "cooperative");
        assert_eq!((coop.requests, coop.rejected_429), (50, 0), "seed {seed}");
    }
}

#[test]
fn herd_without_jitter_returns_in_one_second_and_with_jitter_spreads() {
    let r = herd::run(&herd::HerdParams::default(), 1);
    assert_eq!(r.series[0].name, "no_jitter");
    assert_eq!(r.series[1].name, "jitter");
    let flat: Vec<(u64, u64)> = r.series[0]
        .per_second
        .iter()
        .map(|p| (p.t_s, p.requests))
        .collect();
    assert_eq!(flat, [(5, 10_000), (6, 0), (7, 0), (8, 0), (9, 0)]);
    let jitter = &r.series[1].per_second;
    assert_eq!(
        jitter.iter().map(|p| p.t_s).collect::<Vec<_>>(),
        [5, 6, 7, 8, 9]
    );
    assert_eq!(jitter.iter().map(|p| p.requests).sum::<u64>(), 10_000);
    for p in jitter {
        assert!((1_850..=2_150).contains(&p.requests), "{p:?}");
    }
    assert_eq!(r.series[0].peak_per_ms, 10_000);
    assert!(r.series[1].peak_per_ms < 50);
}

#[test]
fn export_cooperative_meets_the_floor_and_naive_multiplies_requests() {
    let r = export::run(&export::ExportParams::default(), 1);
    assert_eq!(r.floor_s, 1195.0);
    let coop = fleet(&r.fleets, "cooperative");
    assert_eq!(coop.jobs_done, 12_000);
    assert!(
        (12_000..=12_300).contains(&coop.requests),
        "cooperative sent {}",
        coop.requests
    );
    let at = coop.finished_at_s.expect("finished");
    assert!((1195.0..=1205.0).contains(&at), "finished at {at}");
    let naive = fleet(&r.fleets, "naive");
    assert_eq!(naive.jobs_done, 12_000);
    assert!(
        (150_000..=300_000).contains(&naive.requests),
        "naive sent {}",
        naive.requests
    );
    assert!(naive.finished_at_s.expect("finished") >= 1195.0);
}

#[test]
fn throttle_matches_the_formula_at_each_tenth() {
    let r = throttle::run(&throttle::ThrottleParams::default(), 1);
    let ks: Vec<f64> = r.curves.iter().map(|c| c.k).collect();
    assert_eq!(ks, [2.0, 1.1]);
    for c in &r.curves {
        assert_eq!(c.points.len(), 11);
        for (i, p) in c.points.iter().enumerate() {
            let tenth = i as f64 / 10.0;
            assert_eq!(p.server_capacity_ratio, tenth);
            let want = (1.0 - c.k * tenth).max(0.0);
            assert!(
                (p.drop_probability - want).abs() <= 0.03,
                "K={} at {tenth}: simulated {} formula {want}",
                c.k,
                p.drop_probability
            );
            assert!((p.accept_ratio - tenth).abs() <= 0.03, "{p:?}");
        }
    }
    // the design document's worked point: 30% accepts, K = 2, 40% dropped
    assert!((r.curves[0].points[3].drop_probability - 0.4).abs() <= 0.02);
}

#[test]
fn incident_retries_stay_within_ten_percent_of_normal_traffic() {
    for (status, retry_after_s) in [(503, 1), (503, 0), (429, 1)] {
        let p = incident::IncidentParams {
            status,
            retry_after_s,
            after: Nanos::from_secs(60),
            ..Default::default()
        };
        let r = incident::run(&p, 1);
        assert!((r.normal_rps - 100.0).abs() < 1.0, "{}", r.normal_rps);
        assert!(
            r.retries_peak_minute_ratio <= 0.10,
            "{status} ra={retry_after_s}: worst minute {}",
            r.retries_peak_minute_ratio
        );
    }
}

#[test]
fn the_client_is_back_to_normal_traffic_within_fifteen_minutes_of_an_outage() {
    let r = incident::run(&incident::IncidentParams::default(), 1);
    let after = r.recovered_after_s.expect("recovers within the run");
    assert!(after <= 900.0, "recovered after {after} s");
    assert!(r.local_drops > 0, "the throttle engaged");
}

#[test]
fn same_seed_same_json() {
    let race_p = race::RaceParams::default();
    let a = serde_json::to_string(&race::run(&race_p, 7)).unwrap();
    let b = serde_json::to_string(&race::run(&race_p, 7)).unwrap();
    assert_eq!(a, b);
    let herd_p = herd::HerdParams {
        clients: 500,
        ..Default::default()
    };
    let a = serde_json::to_string(&herd::run(&herd_p, 7)).unwrap();
    let b = serde_json::to_string(&herd::run(&herd_p, 7)).unwrap();
    assert_eq!(a, b);
    let c = serde_json::to_string(&herd::run(&herd_p, 8)).unwrap();
    assert_ne!(a, c, "the seed drives the jitter");
    let thr_p = throttle::ThrottleParams {
        ratios: vec![0.3],
        ..Default::default()
    };
    let a = serde_json::to_string(&throttle::run(&thr_p, 7)).unwrap();
    let b = serde_json::to_string(&throttle::run(&thr_p, 7)).unwrap();
    assert_eq!(a, b);
}

#[test]
fn json_has_the_contract_fields() {
    let r = race::run(&race::RaceParams::default(), 1);
    let v = serde_json::to_value(&r).unwrap();
    let f = &v["fleets"][0];
    for key in [
        "name",
        "jobs",
        "jobs_done",
        "requests",
        "rejected_429",
        "dropped",
        "finished_at_s",
    ] {
        assert!(f.get(key).is_some(), "missing {key}");
    }
    assert_eq!(f["name"], "cooperative");
    assert_eq!(v["fleets"][1]["name"], "naive");
    let h = serde_json::to_value(herd::run(
        &herd::HerdParams {
            clients: 100,
            ..Default::default()
        },
        1,
    ))
    .unwrap();
    assert_eq!(h["series"][0]["per_second"][0]["t_s"], 5);
    assert_eq!(h["series"][0]["per_second"][0]["requests"], 100);
}

#[test]
fn a_small_client_retries_every_call_of_a_burst_of_429s() {
    for seed in [1, 2, 3] {
        let with = incident::small_client(true, seed);
        println!("with the floor: {with:?}");
        assert_eq!(with.calls_done, 40, "{with:?}");
        assert_eq!(with.rejected_429, 10, "a burst of 429s: {with:?}");
        assert_eq!(with.retries_refused, 0, "{with:?}");
        assert_eq!(with.retries_granted, with.retries_wanted, "{with:?}");
        // the same burst with the share alone: most retries refused
        let without = incident::small_client(false, seed);
        println!("share only: {without:?}");
        assert!(without.retries_refused >= 4, "{without:?}");
        assert!(without.calls_done < 40, "{without:?}");
    }
}

#[test]
fn the_throttle_lets_traffic_back_within_its_window_after_an_outage() {
    for retry_after_s in [1, 0] {
        let p = incident::IncidentParams {
            retry_after_s,
            ..Default::default()
        };
        let r = incident::run(&p, 1);
        let after = r.recovered_after_s.expect("recovers within the run");
        println!(
            "503 ra={retry_after_s}: back to 90% after {after} s, {} dropped",
            r.local_drops
        );
        assert!(r.local_drops > 0, "the throttle engaged");
        assert!(after <= 120.0, "ra={retry_after_s}: back after {after} s");
        assert!(r.retries_peak_minute_ratio <= 0.10);
    }
}
