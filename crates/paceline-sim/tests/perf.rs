//! The simulator's speed, in release builds:
//! `cargo test -p paceline-sim --release --test perf -- --ignored --nocapture`.
//!
//! Every request of the load goes the whole way (SDK, engine, limiter,
//! emitter, parser), so this is the cost any scenario pays per request.
//! The check is on the CPU time the process used (wall time on a busy
//! machine measures the neighbours too); both are printed.

use std::time::Instant;

use paceline_sim::scenario::load::{self, LoadParams};

/// CPU seconds this process has used (Linux), if known.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // fields after the parenthesised command name; utime and stime are the
    // 14th and 15th fields, in clock ticks (100 per second on Linux)
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

#[test]
#[ignore = "a timing measurement: run it in release"]
fn a_million_requests_in_under_two_seconds() {
    let params = LoadParams::default();
    let cpu0 = cpu_seconds();
    let t = Instant::now();
    let r = load::run(&params, 1);
    let wall = t.elapsed().as_secs_f64();
    let cpu = cpu_seconds().zip(cpu0).map(|(b, a)| b - a);
    assert_eq!(r.requests, 1_000_000);
    println!(
        "{} requests ({} events, {:.0} virtual s): wall {:.3} s, cpu {}",
        r.requests,
        r.events,
        r.virtual_s,
        wall,
        cpu.map_or("unknown".into(), |c| format!("{c:.2} s")),
    );
    let spent = cpu.unwrap_or(wall);
    assert!(spent < 2.0, "took {spent:.2} s of CPU");
}
