//! envoyproxy/ratelimit's counters, per domain and rule, as labelled
//! series.

mod common;

use common::*;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use paceline_core::{ManualClock, MemoryStore};
use paceline_rls::RlsService;

const YAML: &str = "
domain: m
descriptors:
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: user
    value: a
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: team
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5}
";

#[test]
fn counters_per_domain_and_rule() {
    let rec = DebuggingRecorder::new();
    let snap = rec.snapshotter();
    let svc = RlsService::new(
        config(YAML),
        MemoryStore::new(),
        ManualClock::at_unix_secs(START),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    metrics::with_local_recorder(&rec, || {
        rt.block_on(async {
            for _ in 0..12 {
                svc.decide(&request("m", &[&[("ip", "1.2.3.4")]]))
                    .await
                    .unwrap();
            }
            for _ in 0..3 {
                svc.decide(&request("m", &[&[("user", "a")]]))
                    .await
                    .unwrap();
            }
        })
    });
    let mut seen = std::collections::HashMap::new();
    for (key, _, _, v) in snap.snapshot().into_vec() {
        let labels: Vec<String> = key
            .key()
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        let DebugValue::Counter(n) = v else { continue };
        seen.insert(format!("{}{{{}}}", key.key().name(), labels.join(",")), n);
    }
    let get = |s: &str| seen.get(s).copied().unwrap_or(0);
    assert_eq!(
        get("ratelimit_service_rate_limit_total_hits{domain=m,key1=ip}"),
        12,
        "{seen:?}"
    );
    assert_eq!(
        get("ratelimit_service_rate_limit_over_limit{domain=m,key1=ip}"),
        2
    );
    assert_eq!(
        get("ratelimit_service_rate_limit_within_limit{domain=m,key1=ip}"),
        10
    );
    assert_eq!(
        get("ratelimit_service_rate_limit_near_limit{domain=m,key1=ip}"),
        2
    );
    assert_eq!(
        get("ratelimit_service_rate_limit_shadow_mode{domain=m,key1=user_a}"),
        2
    );
    assert_eq!(
        get("ratelimit_service_rate_limit_over_limit{domain=m,key1=user_a}"),
        0
    );
}
