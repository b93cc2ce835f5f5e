//! Properties: what the emitter writes, the parser reads back; and no input
//! makes the parser panic or break its own invariants.

use http::{HeaderMap, HeaderName, HeaderValue};
use paceline_core::{Decision, Denial, Nanos, Outcome, Plan, Policy, PolicyKind, PolicyStatus};
use paceline_wire::emit::{retry_after_secs, write_headers, Dialects};
use paceline_wire::parse::{parse_response, parse_retry_after, OutcomeKind, Unit};
use paceline_wire::problem::Problem;
use proptest::prelude::*;

const NOW: Nanos = Nanos::from_secs(1_750_000_000);

#[derive(Clone, Debug)]
struct Spec {
    name: String,
    quota: u64,
    window: u64,
    kind: u8, // 0 bucket, 1 fixed window, 2 bytes bucket, 3 concurrency
}

fn policy(s: &Spec) -> Policy {
    match s.kind {
        0 => Policy::token_bucket(&s.name, s.quota, s.window).unwrap(),
        1 => Policy::fixed_window(&s.name, s.quota, s.window).unwrap(),
        2 => Policy::token_bucket(&s.name, s.quota, s.window)
            .unwrap()
            .with_unit(paceline_core::Unit::ContentBytes)
            .unwrap(),
        _ => Policy::concurrency(&s.name, s.quota).unwrap(),
    }
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        "[a-z][a-z0-9_.-]{0,12}",
        1u64..1_000_000,
        1u64..200_000,
        0u8..4,
    )
        .prop_map(|(name, quota, window, kind)| Spec {
            name,
            quota,
            window,
            kind,
        })
}

fn plan_and_decision() -> impl Strategy<Value = (Plan, Decision)> {
    proptest::collection::vec(spec(), 1..5)
        .prop_filter("unique names", |v| {
            let mut n: Vec<_> = v.iter().map(|s| s.name.clone()).collect();
            n.sort();
            n.dedup();
            n.len() == v.len()
        })
        .prop_flat_map(|specs| {
            let n = specs.len();
            let statuses =
                proptest::collection::vec((0u64..2_000_000, 0u64..400_000_000_000_000), n);
            (
                Just(specs),
                statuses,
                0u8..3,
                0..n,
                1u64..90_000_000_000_000,
            )
        })
        .prop_map(|(specs, raw, outcome, at, wait)| {
            let plan = Plan::new("p", specs.iter().map(policy).collect()).unwrap();
            let mut d = Decision {
                outcome: Outcome::Allowed,
                statuses: Default::default(),
            };
            for (i, (r, t)) in raw.into_iter().enumerate() {
                let p = plan.policy(i);
                let denying = outcome == 1 && i == at;
                d.statuses.push(PolicyStatus {
                    remaining: if denying { 0 } else { r.min(p.quota()) },
                    reset_after: Nanos::new(if denying { wait.max(t) } else { t }),
                    would_deny: denying,
                });
            }
            d.outcome = match outcome {
                0 => Outcome::Allowed,
                1 => Outcome::Denied(Denial {
                    policy: at,
                    kind: plan.policy(at).kind(),
                    retry_after: d.statuses[at].reset_after,
                }),
                _ => Outcome::CostExceedsBurst {
                    policy: at,
                    cost: plan.policy(at).quota() + 1,
                },
            };
            (plan, d)
        })
}

fn status_of(d: &Decision) -> u16 {
    match d.outcome {
        Outcome::Allowed => 200,
        Outcome::Denied(_) => 429,
        Outcome::CostExceedsBurst { .. } => 400,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn emit_then_parse_gives_back_the_decision((plan, d) in plan_and_decision(), all in any::<bool>()) {
        let dialects = if all { Dialects::all() } else { Dialects::default() };
        let mut h = HeaderMap::new();
        write_headers(&plan, &d, &dialects, &mut h);
        let body = Problem::from_decision(&plan, &d, "https://errors.example/").map(|p| p.to_json());
        let v = parse_response(status_of(&d), &h, body.as_deref().map(str::as_bytes), NOW);

        prop_assert!(v.ignored.is_empty(), "{:?}", v.ignored);
        prop_assert_eq!(v.policies.len(), plan.policies().len());
        for ((p, s), got) in plan.policies().iter().zip(&d.statuses).zip(&v.policies) {
            prop_assert_eq!(&got.name, p.name());
            prop_assert_eq!(got.quota, Some(p.quota()));
            prop_assert_eq!(got.remaining, Some(s.remaining));
            prop_assert_eq!(got.reset_in, Some(Nanos::from_secs(s.reset_secs())));
            let unit = match p.unit() {
                paceline_core::Unit::ContentBytes => Unit::ContentBytes,
                paceline_core::Unit::ConcurrentRequests => Unit::ConcurrentRequests,
                _ => Unit::Requests,
            };
            let window = (unit != Unit::ConcurrentRequests).then_some(p.window_s());
            prop_assert_eq!(got.window_s, window);
            prop_assert_eq!(&got.unit, &unit);
        }
        // The tightest request window is the emitter's own choice among them.
        let requests: Vec<usize> = (0..plan.policies().len())
            .filter(|&i| plan.policy(i).unit() == paceline_core::Unit::Requests)
            .collect();
        match v.tightest {
            None => prop_assert!(requests.is_empty()),
            Some(i) => {
                prop_assert!(requests.contains(&i));
                let min = requests.iter().map(|&j| d.statuses[j].remaining).min();
                prop_assert_eq!(Some(d.statuses[i].remaining), min);
                prop_assert_eq!(v.limit, Some(plan.policy(i).quota()));
            }
        }
        match d.outcome {
            Outcome::Denied(den) => {
                let secs = retry_after_secs(&d).unwrap();
                prop_assert_eq!(v.retry_after_header, Some(Nanos::from_secs(secs)));
                prop_assert_eq!(v.retry_after, Some(Nanos::from_secs(secs)));
                let want = match den.kind {
                    PolicyKind::Quota => OutcomeKind::QuotaExhausted,
                    PolicyKind::Burst => OutcomeKind::RateLimited,
                };
                prop_assert_eq!(v.outcome, want);
                prop_assert_eq!(v.retry, want == OutcomeKind::RateLimited);
                let pv = v.problem.as_ref().unwrap();
                prop_assert_eq!(pv.retry_after_s, Some(secs as f64));
                prop_assert_eq!(pv.limit.as_deref(), Some(plan.policy(den.policy).name()));
            }
            Outcome::Allowed => {
                prop_assert_eq!(v.outcome, OutcomeKind::Success);
                prop_assert!(!v.retry);
                prop_assert_eq!(v.retry_after_header, None);
                // A wait only when some window is used up: until its reset.
                let want = d
                    .statuses
                    .iter()
                    .filter(|s| s.remaining == 0)
                    .map(|s| Nanos::from_secs(s.reset_secs()))
                    .max()
                    .filter(|w| *w > Nanos::ZERO);
                prop_assert_eq!(v.retry_after, want);
            }
            Outcome::CostExceedsBurst { .. } => {
                prop_assert_eq!(v.outcome, OutcomeKind::Error);
                prop_assert!(!v.retry);
            }
        }
    }

    #[test]
    fn retry_after_seconds_and_dates(secs in 0u64..(400 * 86_400)) {
        prop_assert_eq!(parse_retry_after(&secs.to_string(), NOW), Ok(Nanos::from_secs(secs)));
        let at = Nanos::from_secs(NOW.as_secs_floor() + secs).as_system_time();
        let date = httpdate::fmt_http_date(at);
        prop_assert_eq!(parse_retry_after(&date, NOW), Ok(Nanos::from_secs(secs)));
        // a date already past is a present zero wait, never an error
        let past = Nanos::from_secs(NOW.as_secs_floor().saturating_sub(secs + 1)).as_system_time();
        prop_assert_eq!(parse_retry_after(&httpdate::fmt_http_date(past), NOW), Ok(Nanos::ZERO));
    }

    #[test]
    fn graphql_cost_numbers_never_panic(
        requested in prop_oneof![any::<f64>().prop_map(|x| x.to_string()), Just("null".to_string()), "-?[0-9]{1,30}(\\.[0-9]{1,5})?"],
        max in prop_oneof![any::<f64>().prop_map(|x| x.to_string()), "-?[0-9]{1,30}(\\.[0-9]{1,5})?"],
        avail in prop_oneof![any::<f64>().prop_map(|x| x.to_string()), "-?[0-9]{1,30}(\\.[0-9]{1,5})?"],
        rate in prop_oneof![any::<f64>().prop_map(|x| x.to_string()), Just("0".to_string()), "-?[0-9]{1,30}(\\.[0-9]{1,5})?"],
        status in prop::sample::select(vec![200u16, 429, 403]),
    ) {
        let body = format!(
            "{{\"errors\":[{{\"message\":\"Throttled\",\"extensions\":{{\"code\":\"THROTTLED\"}}}}],\"extensions\":{{\"cost\":{{\"requestedQueryCost\":{requested},\"actualQueryCost\":null,\"throttleStatus\":{{\"maximumAvailable\":{max},\"currentlyAvailable\":{avail},\"restoreRate\":{rate}}}}}}}}}"
        );
        let mut h = HeaderMap::new();
        h.insert("content-type", HeaderValue::from_static("application/json"));
        let v = parse_response(status, &h, Some(body.as_bytes()), NOW);
        // whatever the numbers, a wait is bounded, and never from a bad body
        if let Some(w) = v.retry_after {
            prop_assert!(w <= Nanos::from_secs(paceline_wire::parse::time::MAX_DELAY_SECS));
        }
        if let Some(p) = v.policy("graphql-cost") {
            prop_assert!(p.remaining <= p.quota);
            prop_assert_eq!(v.outcome, OutcomeKind::RateLimited);
        }
    }

    #[test]
    fn error_array_bodies_never_panic(
        code in prop::sample::select(vec!["REQUEST_LIMIT_EXCEEDED", "INSUFFICIENT_ACCESS", ""]),
        reason in prop::sample::select(vec!["rateLimitExceeded", "userRateLimitExceeded", "dailyLimitExceeded", "quotaExceeded", "forbidden"]),
        message in "[ -!#-\\[\\]-~]{0,60}",
        copies in 0usize..40,
        status in prop::sample::select(vec![200u16, 403, 429, 500]),
    ) {
        let one = format!("{{\"message\":\"{message}\",\"errorCode\":\"{code}\"}}");
        let salesforce = format!("[{}]", vec![one; copies].join(","));
        let google = format!(
            "{{\"error\":{{\"errors\":[{{\"domain\":\"usageLimits\",\"reason\":\"{reason}\",\"message\":\"{message}\"}}],\"code\":{status},\"message\":\"{message}\"}}}}"
        );
        let h = HeaderMap::new();
        for body in [salesforce, google] {
            let v = parse_response(status, &h, Some(body.as_bytes()), NOW);
            if status == 200 {
                prop_assert_eq!(v.outcome, OutcomeKind::Success);
            }
            if status == 403 && v.outcome != OutcomeKind::Error {
                prop_assert!(matches!(v.outcome, OutcomeKind::RateLimited | OutcomeKind::QuotaExhausted));
            }
        }
    }

    #[test]
    fn arbitrary_values_never_panic(
        name in prop::sample::select(vec![
            "retry-after", "ratelimit", "ratelimit-policy", "x-ratelimit-limit",
            "x-ratelimit-remaining", "x-ratelimit-reset", "x-ratelimit-reset-after",
            "x-ratelimit-reset-tokens", "anthropic-ratelimit-requests-reset",
            "ratelimit-limit", "x-shopify-shop-api-call-limit", "sforce-limit-info",
            "x-sentry-rate-limits", "zendesk-ratelimit-x", "x-ms-ratelimit-remaining-resource",
            "retry-after-ms", "age", "x-rate-limit-api-token-interval-ms",
            "x-ms-retry-after-ms", "x-ratelimit-retry-after", "x-should-retry",
            "stripe-should-retry",
        ]),
        value in "[ -~]{0,80}",
        status in 100u16..600,
        body in proptest::option::of("[ -~]{0,120}"),
    ) {
        let mut h = HeaderMap::new();
        if let Ok(v) = HeaderValue::from_str(&value) {
            h.append(HeaderName::from_static(name), v.clone());
            h.append(HeaderName::from_static("x-ratelimit-remaining"), v);
        }
        let v = parse_response(status, &h, body.as_deref().map(str::as_bytes), NOW);
        if let Some(i) = v.tightest {
            prop_assert!(i < v.policies.len());
            prop_assert_eq!(v.remaining, v.policies[i].remaining);
        }
        prop_assert!(v.retry_after != Some(Nanos::ZERO));
        if v.retry {
            prop_assert!(
                matches!(v.outcome, OutcomeKind::RateLimited | OutcomeKind::Overloaded)
                    || (v.should_retry == Some(true) && v.outcome != OutcomeKind::Success)
            );
        }
        if v.should_retry == Some(false) {
            prop_assert!(!v.retry);
        }
    }
}
