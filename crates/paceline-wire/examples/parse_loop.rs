//! Parses one common response many times, so the CPU time per parse can be
//! read with `perf stat` even on a busy machine:
//!
//! `perf stat -e task-clock target/release/examples/parse_loop ietf 2000000`
//! (or `gh` for GitHub's `x-ratelimit-*` set); divide by the count.

use http::{HeaderMap, HeaderName, HeaderValue};
use paceline_core::Nanos;
fn main() {
    let which = std::env::args().nth(1).unwrap_or_default();
    let n: u64 = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let mut pairs = vec![
        ("content-type", "application/json"),
        ("date", "Tue, 14 Nov 2023 22:13:20 GMT"),
        ("content-length", "512"),
        ("server", "shiplane"),
    ];
    if which == "gh" {
        pairs.extend([
            ("x-ratelimit-limit", "5000"),
            ("x-ratelimit-remaining", "4999"),
            ("x-ratelimit-used", "1"),
            ("x-ratelimit-reset", "1700003600"),
            ("x-ratelimit-resource", "core"),
        ]);
    } else {
        pairs.extend([
            (
                "ratelimit-policy",
                "\"burst\";q=20;w=2, \"daily\";q=10000;w=86400",
            ),
            ("ratelimit", "\"burst\";r=7;t=1, \"daily\";r=2310;t=21600"),
        ]);
    }
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(HeaderName::from_static(k), HeaderValue::from_static(v));
    }
    let mut acc = 0u64;
    for _ in 0..n {
        let v = paceline_wire::parse_response(
            200,
            std::hint::black_box(&h),
            None,
            Nanos::from_secs(1_700_000_000),
        );
        acc += v.remaining.unwrap_or(0);
    }
    println!("{acc}");
}
