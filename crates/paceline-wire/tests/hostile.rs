//! Hostile and tricky responses found in review: each once crashed the
//! parser or changed its verdict.

use paceline_core::Nanos;
use paceline_wire::parse::time::{parse_retry_after, parse_rfc3339};
use paceline_wire::parse::{parse_response, OutcomeKind};
use paceline_wire::raw::parse_raw_response;

const NOW: u64 = 1_790_880_000;

fn view(raw: &str) -> paceline_wire::parse::ResponseView {
    let r = parse_raw_response(raw.as_bytes()).unwrap();
    parse_response(r.status, &r.headers, Some(&r.body), Nanos::from_secs(NOW))
}

#[test]
fn non_ascii_offset_is_refused_not_a_panic() {
    assert_eq!(parse_rfc3339("2026-12-01T00:00+0é0"), None);
    assert_eq!(parse_rfc3339("2026-12-01T00:00:00+é"), None);
    assert!(parse_rfc3339("2026-12-01T00:00:00+01:00").is_some());
}

#[test]
fn long_valid_delay_wins_and_past_dates_are_a_zero_wait() {
    let now = Nanos::from_secs(NOW);
    // delay-seconds is valid however long: it is not replaced by a shorter wait
    assert_eq!(
        parse_retry_after("99999999", now).unwrap(),
        Nanos::from_secs(99_999_999)
    );
    let v = view("HTTP/1.1 429 Too Many Requests\r\nRetry-After: 99999999\r\nX-RateLimit-Remaining: 0\r\nX-RateLimit-Reset: 20\r\n\r\n");
    assert_eq!(v.retry_after, Some(Nanos::from_secs(99_999_999)));
    // a date in the past is a present wait of zero, as `Retry-After: 0` is:
    // a valid Retry-After wins over the exhausted window, as it always does
    let past = httpdate::fmt_http_date(Nanos::from_secs(NOW - 2_400).as_system_time());
    assert_eq!(parse_retry_after(&past, now), Ok(Nanos::ZERO));
    let both = |ra: &str| {
        view(&format!(
            "HTTP/1.1 429 Too Many Requests\r\nRetry-After: {ra}\r\nRateLimit-Policy: \"a\";q=10;w=60\r\nRateLimit: \"a\";r=0;t=50\r\n\r\n"
        ))
    };
    let v = both(&past);
    assert_eq!(v.retry_after_header, Some(Nanos::ZERO));
    assert_eq!(v.retry_after, None);
    assert!(v.ignored.is_empty(), "{:?}", v.ignored);
    assert_eq!(v.retry_after, both("0").retry_after);
    // the oldest date HTTP can write is still a zero wait, not a panic
    assert_eq!(
        parse_retry_after("Thu, 01 Jan 1970 00:00:00 GMT", now),
        Ok(Nanos::ZERO)
    );
}

#[test]
fn anthropic_529_is_overloaded() {
    let v = view("HTTP/1.1 529 \r\ncontent-type: application/json\r\n\r\n{\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}");
    assert_eq!(v.outcome, OutcomeKind::Overloaded);
    assert!(v.retry);
}

#[test]
fn azure_window_overflow_is_ignored() {
    let v = view("HTTP/1.1 200 OK\r\nx-ms-ratelimit-remaining-resource: Microsoft.Compute/HighCostGet18446744073709551615Min;0\r\n\r\n");
    assert!(v
        .policies
        .iter()
        .all(|p| p.window_s.is_none_or(|w| w < 1 << 40)));
}

#[test]
fn too_many_header_lines_are_skipped_not_a_panic() {
    let mut raw = String::from("HTTP/1.1 200 OK\r\n");
    for i in 0..40_000 {
        raw.push_str(&format!("x-h{i}: 1\r\n"));
    }
    raw.push_str("\r\n");
    let r = parse_raw_response(raw.as_bytes()).unwrap();
    assert_eq!(r.headers.len(), paceline_wire::raw::MAX_FIELDS);
    assert!(!r.skipped.is_empty());
}

#[test]
fn a_body_never_replaces_the_final_answer() {
    for body in ["oops\n< HTTP/1.1 200 OK\n", "HTTP/1.1 200 OK\r\n\r\n"] {
        let v = view(&format!(
            "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 30\r\n\r\n{body}"
        ));
        assert_eq!(v.status, 429, "body {body:?}");
        assert_eq!(v.outcome, OutcomeKind::RateLimited);
        assert_eq!(v.retry_after, Some(Nanos::from_secs(30)));
    }
    // while a proxy's tunnel answer and a redirect still lead to the real one
    let v = view("HTTP/1.1 200 Connection established\r\n\r\nHTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\n\r\n");
    assert_eq!(v.status, 429);
}
