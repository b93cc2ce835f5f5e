//! Resident memory per key with 1,000,000 live keys, ours against governor's
//! keyed store, each in its own process:
//! `cargo run --release -p paceline-core --example memory -- ours|ours2|governor`

use std::num::NonZeroU32;

use governor::{Quota, RateLimiter};
use paceline_core::{Limiter, Plan, Policy};

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "ours".into());
    const N: usize = 1_000_000;
    // an hour-long window keeps every key live; keys are built first and counted out of the measurement
    let keys: Vec<String> = (0..N).map(|i| format!("sk_live_{i:08}")).collect();
    let before = rss_bytes();
    let one = Plan::new("p", vec![Policy::token_bucket("burst", 50, 3_600).unwrap()]).unwrap();
    let two = Plan::new(
        "p2",
        vec![
            Policy::token_bucket("burst", 50, 3_600).unwrap(),
            Policy::daily("daily", 1_000_000).unwrap(),
        ],
    )
    .unwrap();
    let q = NonZeroU32::new(50).unwrap();
    let lim = Limiter::in_memory();
    let gov = RateLimiter::keyed(Quota::per_hour(q).allow_burst(q));
    for k in &keys {
        match mode.as_str() {
            "ours" => drop(lim.check_sync(&one, k, 1)),
            "ours2" => drop(lim.check_sync(&two, k, 1)),
            // governor stores its own copy of each key
            _ => drop(gov.check_key(k)),
        }
    }
    let after = rss_bytes();
    let live = match mode.as_str() {
        "ours" | "ours2" => lim.store().len(),
        _ => gov.len(),
    };
    println!(
        "{mode}: {live} keys, {:.1} bytes per key",
        (after - before) as f64 / N as f64
    );
}
