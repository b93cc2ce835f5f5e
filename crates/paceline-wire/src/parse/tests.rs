//! Unit tests of the parse rules.

use super::*;
use http::{HeaderMap, HeaderName, HeaderValue};

pub(super) const NOW: Nanos = Nanos::from_secs(1_700_000_000);

pub(super) fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    h
}

#[test]
fn ietf_tightest_and_borrowed_quota() {
    let h = headers(&[
        (
            "RateLimit-Policy",
            r#""burst";q=20;w=2, "daily";q=10000;w=86400"#,
        ),
        (
            "RateLimit",
            r#""burst";r=7;t=1, "daily";r=2310;t=21600, "extra";r=3;t=5"#,
        ),
    ]);
    let v = parse_response(200, &h, None, NOW);
    assert_eq!(v.outcome, OutcomeKind::Success);
    assert_eq!(v.policies.len(), 3);
    // "extra" has no policy of its name: it has no quota.
    let t = v.tightest_policy().unwrap();
    assert_eq!(t.name, "extra");
    assert_eq!((v.limit, v.remaining), (None, Some(3)));
    assert_eq!(v.retry_after, None);
    assert_eq!(v.dialects, vec!["ietf".to_string()]);
}

fn reasons(v: &ResponseView, field: &str) -> Vec<String> {
    v.ignored
        .iter()
        .filter(|i| i.field == field)
        .map(|i| i.reason.clone())
        .collect()
}

#[test]
fn retry_after_precedence_and_leniency() {
    // Retry-After wins over an exhausted window.
    let h = headers(&[
        ("retry-after", "3"),
        ("ratelimit-policy", r#""d";q=10;w=86400"#),
        ("ratelimit", r#""d";r=0;t=500"#),
    ]);
    assert_eq!(
        parse_response(429, &h, None, NOW).retry_after,
        Some(Nanos::from_secs(3))
    );
    // A plain decimal is accepted leniently.
    let h = headers(&[("retry-after", "1.5")]);
    assert_eq!(
        parse_response(429, &h, None, NOW).retry_after,
        Some(Nanos::from_millis(1500))
    );
    // Invalid ones are ignored (not clamped): the exhausted window decides.
    for bad in ["-1", "1e30", "soon", "0x10", "5, 7"] {
        let h = headers(&[
            ("retry-after", bad),
            ("ratelimit-policy", r#""d";q=10;w=60"#),
            ("ratelimit", r#""d";r=0;t=40"#),
        ]);
        let v = parse_response(429, &h, None, NOW);
        assert_eq!(v.retry_after, Some(Nanos::from_secs(40)), "{bad}");
        assert_eq!(v.retry_after_header, None, "{bad}");
        assert_eq!(reasons(&v, "retry-after").len(), 1, "{bad}");
    }
    // Two header lines that disagree are ignored; two that agree are fine.
    let h = headers(&[("retry-after", "5"), ("retry-after", "9")]);
    assert_eq!(parse_response(429, &h, None, NOW).retry_after, None);
    let h = headers(&[("retry-after", "5"), ("retry-after", "5")]);
    assert_eq!(
        parse_response(429, &h, None, NOW).retry_after,
        Some(Nanos::from_secs(5))
    );
    // A date in the past, or zero: go now.
    let h = headers(&[("retry-after", "Sun, 06 Nov 1994 08:49:37 GMT")]);
    assert_eq!(parse_response(503, &h, None, NOW).retry_after, None);
}

#[test]
fn the_latest_exhausted_reset_in_any_unit_sets_the_wait() {
    let h = headers(&[
        ("x-ratelimit-limit-requests", "60"),
        ("x-ratelimit-remaining-requests", "0"),
        ("x-ratelimit-reset-requests", "2s"),
        ("x-ratelimit-limit-tokens", "1000"),
        ("x-ratelimit-remaining-tokens", "0"),
        ("x-ratelimit-reset-tokens", "45s"),
    ]);
    let v = parse_response(429, &h, None, NOW);
    assert_eq!(v.retry_after, Some(Nanos::from_secs(45)));
    // limit/remaining describe the request window only.
    assert_eq!((v.limit, v.remaining), (Some(60), Some(0)));
    assert_eq!(v.reset_in, Some(Nanos::from_secs(2)));
}

#[test]
fn tie_on_remaining_picks_the_later_reset() {
    let h = headers(&[
        ("ratelimit-policy", r#""a";q=10;w=10, "b";q=50;w=3600"#),
        ("ratelimit", r#""a";r=4;t=3, "b";r=4;t=900"#),
    ]);
    let v = parse_response(200, &h, None, NOW);
    assert_eq!(v.tightest_policy().unwrap().name, "b");
    assert_eq!(v.limit, Some(50));
}

#[test]
fn broken_structured_fields_are_ignored_whole() {
    for (field, value) in [
        ("ratelimit", r#""a";r=1;t=1, b;r=2;t=2"#),
        ("ratelimit", r#""a";r=-1;t=1"#),
        ("ratelimit", r#""a";r=1.5;t=1"#),
        ("ratelimit", r#""a";r=1234567890123456;t=1"#),
        ("ratelimit", r#""a";r=1;t=1,"#),
        ("ratelimit-policy", r#""a";q=10;w=1, "b""#),
        ("ratelimit-policy", r#""a";q=10;qu=requests"#),
    ] {
        let h = headers(&[
            (field, value),
            ("ratelimit-policy", r#""z";q=1;w=1"#),
            ("ratelimit", r#""z";r=1;t=1"#),
        ]);
        // The good line and the bad line are one field: all of it goes.
        let v = parse_response(200, &h, None, NOW);
        assert_eq!(reasons(&v, field).len(), 1, "{value}");
        let other = if field == "ratelimit" {
            "ratelimit-policy"
        } else {
            "ratelimit"
        };
        assert!(v.policies.iter().all(|p| p.name == "z"), "{value}");
        assert!(reasons(&v, other).is_empty(), "{value}");
    }
}

#[test]
fn cached_responses_do_not_count() {
    let h = headers(&[
        ("age", "12"),
        ("ratelimit", r#""a";r=0;t=50"#),
        ("x-ratelimit-remaining", "0"),
        ("retry-after", "5"),
    ]);
    let v = parse_response(200, &h, None, NOW);
    assert!(v.policies.is_empty());
    assert_eq!(v.ignored.len(), 2);
    assert_eq!(v.retry_after_header, Some(Nanos::from_secs(5)));
    let h = headers(&[("age", "0"), ("ratelimit", r#""a";r=0;t=50"#)]);
    assert_eq!(parse_response(200, &h, None, NOW).policies.len(), 1);
}

#[test]
fn huge_and_garbage_values_are_dropped_with_reasons() {
    let big = "7".repeat(10 * 1024);
    let h = headers(&[
        ("x-ratelimit-remaining", &big),
        ("x-ratelimit-limit", "lots"),
        ("x-ratelimit-reset", "1e30"),
        ("retry-after", &big),
    ]);
    let v = parse_response(429, &h, None, NOW);
    assert!(v.policies.is_empty());
    assert_eq!(v.retry_after, None);
    for f in [
        "x-ratelimit-remaining",
        "x-ratelimit-limit",
        "x-ratelimit-reset",
        "retry-after",
    ] {
        assert_eq!(reasons(&v, f).len(), 1, "{f}: {:?}", v.ignored);
    }
    // Epochs in milliseconds are told apart from seconds.
    let h = headers(&[
        ("x-ratelimit-remaining", "0"),
        (
            "x-ratelimit-reset",
            &(NOW.as_secs_floor() * 1000 + 30_000).to_string(),
        ),
    ]);
    assert_eq!(
        parse_response(200, &h, None, NOW).retry_after,
        Some(Nanos::from_secs(30))
    );
}

#[test]
fn problem_body_and_outcomes() {
    let body = br#"{"type":"https://docs.shiplane.example/errors/quota_exhausted","title":"Daily quota used up","status":429,"detail":"x","limit":"daily","retry_after_s":19200,"violated-policies":["daily"]}"#;
    let h = headers(&[
        ("content-type", "application/problem+json"),
        ("retry-after", "19200"),
    ]);
    let v = parse_response(429, &h, Some(body), NOW);
    assert_eq!(v.outcome, OutcomeKind::QuotaExhausted);
    assert!(!v.retry);
    let p = v.problem.unwrap();
    assert_eq!(p.code.as_deref(), Some("quota_exhausted"));
    assert_eq!(p.retry_after_s, Some(19_200.0));
    assert_eq!(p.violated_policies, vec!["daily".to_string()]);
    // A concurrency cap is never a quota, whatever its reset says.
    let h = headers(&[
        (
            "ratelimit-policy",
            r#""inflight";q=4;qu="concurrent-requests""#,
        ),
        ("ratelimit", r#""inflight";r=0;t=7200"#),
    ]);
    assert_eq!(
        parse_response(429, &h, None, NOW).outcome,
        OutcomeKind::RateLimited
    );
    // Status alone: 503 overloaded, 500 error, 201 success.
    assert_eq!(
        parse_response(503, &HeaderMap::new(), None, NOW).outcome,
        OutcomeKind::Overloaded
    );
    assert_eq!(
        parse_response(500, &HeaderMap::new(), None, NOW).outcome,
        OutcomeKind::Error
    );
    assert_eq!(
        parse_response(201, &HeaderMap::new(), None, NOW).outcome,
        OutcomeKind::Success
    );
    // Bad JSON under a JSON content type is reported.
    let h = headers(&[("content-type", "application/json")]);
    let v = parse_response(429, &h, Some(b"{nope"), NOW);
    assert_eq!(reasons(&v, "body").len(), 1);
}

#[test]
fn draft07_dictionary_takes_the_window_of_its_numbered_policy() {
    let h = headers(&[
        ("ratelimit-policy", "8;w=2"),
        ("ratelimit", "limit=8, remaining=7, reset=2"),
    ]);
    let v = parse_response(200, &h, None, NOW);
    let p = v.tightest_policy().unwrap();
    assert_eq!(
        (p.quota, p.window_s, p.remaining),
        (Some(8), Some(2), Some(7))
    );
    // a policy of another quota lends nothing
    let h = headers(&[
        ("ratelimit-policy", "100;w=60"),
        ("ratelimit", "limit=8, remaining=7, reset=2"),
    ]);
    let p = parse_response(200, &h, None, NOW).policies[0].clone();
    assert_eq!((p.quota, p.window_s), (Some(8), None));
}

mod structured_limits {
    //! RFC 9651's minimums, and the bounds past them.
    use super::*;
    use proptest::prelude::*;

    fn policy_list(n: usize, name_len: usize) -> (String, String) {
        let name = |i: usize| format!("{i:0>width$}", width = name_len.max(5));
        let pol: Vec<String> = (0..n)
            .map(|i| format!("\"{}\";q={};w=60", name(i), 100 + i))
            .collect();
        let lim: Vec<String> = (0..n)
            .map(|i| format!("\"{}\";r={};t=30", name(i), 50 + i))
            .collect();
        (pol.join(", "), lim.join(", "))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// Lists of up to 1,024 members are read whole, every policy
        /// joined with its counter.
        #[test]
        fn lists_up_to_1024_members_are_read(n in 1usize..=1_024) {
            let (pol, lim) = policy_list(n, 5);
            let h = headers(&[("ratelimit-policy", &pol), ("ratelimit", &lim)]);
            let v = parse_response(200, &h, None, NOW);
            prop_assert!(v.ignored.is_empty(), "{:?}", v.ignored);
            prop_assert_eq!(v.policies.len(), n);
            prop_assert!(v.policies.iter().all(|p| p.quota.is_some() && p.remaining.is_some()));
        }

        /// Past 1,024 members the field is ignored whole, with a reason.
        #[test]
        fn longer_lists_are_ignored_whole(extra in 1usize..200) {
            let (pol, _) = policy_list(1_024 + extra, 5);
            let h = headers(&[("ratelimit-policy", &pol)]);
            let v = parse_response(200, &h, None, NOW);
            prop_assert!(v.policies.is_empty());
            prop_assert!(reasons(&v, "ratelimit-policy").iter().any(|r| r.contains("1024")));
        }

        /// A member with up to 256 parameters is read; with more it is
        /// ignored whole. Either path (the fast one, or sfv for the
        /// parameters it does not take) agrees.
        #[test]
        fn parameters_up_to_256_per_member(n in 0usize..=300, boolean in any::<bool>()) {
            // q and w, and n − 2 (at least 0) others
            let others: String = (0..n.saturating_sub(2))
                .map(|i| if boolean { format!(";x{i}") } else { format!(";x{i}={i}") })
                .collect();
            let field = format!("\"p\";q=10;w=60{others}");
            let h = headers(&[("ratelimit-policy", &field)]);
            let v = parse_response(200, &h, None, NOW);
            let params = 2 + n.saturating_sub(2);
            if params <= 256 {
                prop_assert_eq!(v.policies.len(), 1, "{:?}", v.ignored);
                prop_assert_eq!(v.policies[0].quota, Some(10));
            } else {
                prop_assert!(v.policies.is_empty());
                prop_assert!(!reasons(&v, "ratelimit-policy").is_empty());
            }
        }

        /// Policy names of 1,024 characters (escapes included) are read.
        #[test]
        fn strings_of_1024_characters(body in "[a-z ]{1018}", escaped in any::<bool>()) {
            let name = if escaped { format!("ab\\\"{body}cd") } else { format!("abc{body}def") };
            let field = format!("\"{name}\";q=5;w=1");
            let h = headers(&[("ratelimit-policy", &field), ("ratelimit", &format!("\"{name}\";r=2;t=1"))]);
            let v = parse_response(200, &h, None, NOW);
            prop_assert_eq!(v.policies.len(), 1, "{:?}", v.ignored);
            prop_assert_eq!(v.policies[0].name.chars().count(), if escaped { 1_023 } else { 1_024 });
            prop_assert_eq!(v.remaining, Some(2));
        }
    }

    #[test]
    fn a_field_past_the_size_bound_is_ignored() {
        let (pol, _) = policy_list(1_000, 150);
        assert!(pol.len() > vendor::MAX_STRUCTURED_LEN);
        let v = parse_response(200, &headers(&[("ratelimit-policy", &pol)]), None, NOW);
        assert!(v.policies.is_empty());
        assert!(reasons(&v, "ratelimit-policy")[0].contains("too long"));
    }
}

#[test]
fn a_body_that_alone_states_a_monthly_or_spend_cap_is_a_quota() {
    // NOW is 2023-11-14T22:13:20Z
    let june = |s: &str| super::time::parse_rfc3339(s).unwrap().saturating_sub(NOW);
    let cases: &[(&str, &str)] = &[
        (
            r#"{"error": {"code": "monthly_limit_exceeded", "message": "Monthly request limit reached.", "reset_at": "2023-12-01T00:00:00Z"}}"#,
            "2023-12-01T00:00:00Z",
        ),
        (
            r#"{"error": "spend_cap_reached", "message": "Your spend cap was reached; it resets on 2023-12-01."}"#,
            "2023-12-01T00:00Z",
        ),
        (
            r#"{"message": "You have used up your monthly quota", "resets_at": 1701388800}"#,
            "2023-12-01T00:00Z",
        ),
        (
            r#"{"type": "billing_error", "detail": "Budget exceeded until 2023-12-01T00:00Z"}"#,
            "2023-12-01T00:00Z",
        ),
    ];
    for (body, reset) in cases {
        let h = headers(&[("content-type", "application/json")]);
        let v = parse_response(429, &h, Some(body.as_bytes()), NOW);
        assert_eq!(v.outcome, OutcomeKind::QuotaExhausted, "{body}");
        assert!(!v.retry, "{body}");
        assert_eq!(v.retry_after, Some(june(reset)), "{body}");
    }
    // a rate limit in words is still a rate limit
    let h = headers(&[("content-type", "application/json")]);
    let body =
        r#"{"error": {"type": "rate_limit_error", "message": "Too many requests per minute"}}"#;
    let v = parse_response(429, &h, Some(body.as_bytes()), NOW);
    assert_eq!(v.outcome, OutcomeKind::RateLimited);
}

#[test]
fn reset_instants_without_seconds() {
    // 2023-11-14T22:13:20Z: 22:15Z is 100 s away
    for (prefix, value) in [
        ("x-ratelimit-", "2023-11-14T22:15Z"),
        ("ratelimit-", "2023-11-14T22:15Z"),
        ("x-ratelimit-", "2023-11-14T23:15+01:00"),
    ] {
        let (remaining, name) = (format!("{prefix}remaining"), format!("{prefix}reset"));
        let h = headers(&[(remaining.as_str(), "0"), (name.as_str(), value)]);
        let v = parse_response(429, &h, None, NOW);
        assert_eq!(
            v.retry_after,
            Some(Nanos::from_secs(100)),
            "{name}: {value}"
        );
    }
}

#[test]
fn aws_throttling_codes_are_rate_limits_whatever_the_status() {
    // JSON protocols: `__type` with its namespace, in a 400
    let json = br#"{"__type": "com.amazon.coral.availability#ThrottlingException", "message": "Rate exceeded"}"#;
    let h = headers(&[("content-type", "application/x-amz-json-1.1")]);
    let v = parse_response(400, &h, Some(json), NOW);
    assert_eq!(v.outcome, OutcomeKind::RateLimited);
    assert!(v.retry);
    // XML protocols
    let xml = b"<ErrorResponse><Error><Type>Sender</Type><Code>Throttling</Code>\
        <Message>Rate exceeded</Message></Error></ErrorResponse>";
    let v = parse_response(
        400,
        &headers(&[("content-type", "text/xml")]),
        Some(xml),
        NOW,
    );
    assert_eq!((v.outcome, v.retry), (OutcomeKind::RateLimited, true));
    // the error type header alone
    let h = headers(&[(
        "x-amzn-ErrorType",
        "TooManyRequestsException:http://internal",
    )]);
    let v = parse_response(400, &h, None, NOW);
    assert_eq!((v.outcome, v.retry), (OutcomeKind::RateLimited, true));
    // other codes stay errors
    let other = br#"{"__type": "ValidationException", "message": "bad"}"#;
    let v = parse_response(400, &HeaderMap::new(), Some(other), NOW);
    assert_eq!((v.outcome, v.retry), (OutcomeKind::Error, false));
    let xml = b"<Error><Code>LimitExceededException</Code></Error>";
    let v = parse_response(400, &HeaderMap::new(), Some(xml), NOW);
    assert_eq!(v.outcome, OutcomeKind::Error);
}

#[test]
fn graphql_rate_limited_in_a_200_is_not_a_success() {
    let h = headers(&[
        ("x-ratelimit-limit", "5000"),
        ("x-ratelimit-remaining", "0"),
        ("x-ratelimit-reset", "1700001200"),
        ("x-ratelimit-resource", "graphql"),
    ]);
    let body = br#"{"errors": [{"type": "RATE_LIMITED", "message": "API rate limit exceeded for user ID 1."}]}"#;
    let v = parse_response(200, &h, Some(body), NOW);
    // the hourly graphql budget is used up: a quota, not retried
    assert_eq!(v.outcome, OutcomeKind::QuotaExhausted);
    assert!(!v.retry);
    assert_eq!(v.retry_after, Some(Nanos::from_secs(1_200)));
    // the same shape without the error is a success
    let ok = br#"{"data": {"viewer": {"login": "octocat"}}}"#;
    let v = parse_response(200, &h, Some(ok), NOW);
    assert_eq!(v.outcome, OutcomeKind::Success);
}

fn gemini_429(quota_id: &str) -> Vec<u8> {
    format!(
        r#"{{"error": {{"code": 429, "status": "RESOURCE_EXHAUSTED",
        "message": "You exceeded your current quota, please check your plan and billing details.",
        "details": [
          {{"@type": "type.googleapis.com/google.rpc.QuotaFailure",
            "violations": [{{"quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests", "quotaId": "{quota_id}"}}]}},
          {{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "34s"}}]}}}}"#
    )
    .into_bytes()
}

#[test]
fn google_retry_info_and_quota_failure_decide_wait_and_kind() {
    let h = headers(&[("content-type", "application/json")]);
    let minute = gemini_429("GenerateRequestsPerMinutePerProjectPerModel-FreeTier");
    let v = parse_response(429, &h, Some(&minute), NOW);
    // "billing details" in the message is not a spend cap here
    assert_eq!(v.outcome, OutcomeKind::RateLimited);
    assert!(v.retry);
    assert_eq!(v.retry_after, Some(Nanos::from_secs(34)));
    let day = gemini_429("GenerateRequestsPerDayPerProjectPerModel-FreeTier");
    let v = parse_response(429, &h, Some(&day), NOW);
    assert_eq!(v.outcome, OutcomeKind::QuotaExhausted);
    assert!(!v.retry);
}

#[test]
fn fastly_limits_are_hourly() {
    let h = headers(&[
        ("fastly-ratelimit-remaining", "0"),
        ("fastly-ratelimit-reset", "1700001800"),
    ]);
    let v = parse_response(429, &h, None, NOW);
    assert_eq!(v.policies[0].window_s, Some(3_600));
    assert_eq!(v.outcome, OutcomeKind::QuotaExhausted);
    assert_eq!(v.retry_after, Some(Nanos::from_secs(1_800)));
}

#[test]
fn early_draft_window_parameters() {
    let h = headers(&[
        (
            "x-ratelimit-limit",
            "100, 100;window=60, 10000;window=86400",
        ),
        ("x-ratelimit-remaining", "98"),
        ("x-ratelimit-reset", "3"),
    ]);
    let v = parse_response(200, &h, None, NOW);
    assert_eq!((v.limit, v.remaining), (Some(100), Some(98)));
    assert_eq!(v.tightest_policy().unwrap().window_s, Some(60));
}
