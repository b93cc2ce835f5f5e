//! Dialects that were once misread: each case is built from
//! the provider's documented example (the source is named above each test)
//! and fed through the raw-response reader, as `paceline inspect` does.

use paceline_core::Nanos;
use paceline_wire::parse::{OutcomeKind, Unit};

mod common;

use common::{has, secs, view};

// RFC 9110, section 10.2.3 "Retry-After": an HTTP-date is the instant after
// which to retry; once it has passed, the wait is over. It is a field the
// server sent (zero wait), exactly like `Retry-After: 0`, not a missing one.
#[test]
fn retry_after_date_in_the_past_is_a_zero_wait() {
    let now = 946_684_799 + 120; // two minutes after the RFC's example date
    let past = "HTTP/1.1 429 Too Many Requests\nRetry-After: Fri, 31 Dec 1999 23:59:59 GMT\n\n";
    let v = view(past, now);
    assert_eq!(v.retry_after_header, Some(Nanos::ZERO));
    assert!(v.retry_after.is_none(), "a zero wait: it may go now");
    assert!(v.ignored.is_empty(), "{:?}", v.ignored);
    assert!(v.retry);
    let zero = view("HTTP/1.1 429 Too Many Requests\nRetry-After: 0\n\n", now);
    assert_eq!(
        (v.retry_after, v.retry_after_header, v.outcome),
        (zero.retry_after, zero.retry_after_header, zero.outcome)
    );
    // present, it is rate-limit evidence on a 403 (GitHub's secondary limit)
    let v = view(&past.replace("429 Too Many Requests", "403 Forbidden"), now);
    assert_eq!(v.outcome, OutcomeKind::RateLimited);
}

// Atlassian developer docs, Jira Cloud platform, "Rate limiting": a 429 may
// carry `Retry-After` (seconds) and `X-RateLimit-Reset`, "the timestamp (in
// ISO 8601 format) when the rate limit will reset, calculated as the request
// timestamp plus the Retry-After period", written `yyyy-MM-ddTHH:mmZ`;
// `X-RateLimit-NearLimit: true` when little is left. The instant is read as
// written (the minute's start); Retry-After, when present, is the exact wait.
#[test]
fn atlassian_minute_precision_reset() {
    let now = 1_704_902_500; // 2024-01-10T16:01:40Z
    let raw = "HTTP/1.1 429 Too Many Requests\nRetry-After: 30\nX-RateLimit-Reset: 2024-01-10T16:02Z\nX-RateLimit-NearLimit: true\n\n";
    let v = view(raw, now);
    assert_eq!(secs(v.retry_after), Some(30.0));
    let p = v.policy("x-ratelimit").expect("a reset-only policy");
    // request + Retry-After is 16:02:10, written as the minute 16:02
    assert_eq!(secs(p.reset_in), Some(20.0));
    assert_eq!((p.quota, p.remaining), (None, None));
    assert!(v.limit.is_none() && v.remaining.is_none());
    // without Retry-After, the reset of the rejected request is the wait
    let v = view(&raw.replace("Retry-After: 30\n", ""), now);
    assert_eq!(secs(v.retry_after), Some(20.0));
    assert_eq!(v.outcome, OutcomeKind::RateLimited);
    // on a success a bare reset is described, never a wait
    let v = view(
        "HTTP/1.1 200 OK\nX-RateLimit-Reset: 2024-01-10T16:02Z\nX-RateLimit-NearLimit: true\n\n",
        now,
    );
    assert_eq!(secs(v.policy("x-ratelimit").unwrap().reset_in), Some(20.0));
    assert!(v.retry_after.is_none());
}

// Shopify dev docs, "REST Admin API rate limits": a leaky bucket of 40
// requests leaking 2 per second (400 and 20 for Shopify Plus), shown as
// `X-Shopify-Shop-Api-Call-Limit: 32/40`. The header gives no reset: the
// bucket's drain is the documented rate, published as the window that
// rate implies (40 per 20 s), not as a reset the server stated.
#[test]
fn shopify_rest_call_limit_invents_no_reset() {
    let v = view(
        "HTTP/1.1 200 OK\nX-Shopify-Shop-Api-Call-Limit: 32/40\n\n",
        1_700_000_000,
    );
    assert!(has(&v, "shopify"));
    assert_eq!((v.limit, v.remaining), (Some(40), Some(8)));
    assert!(v.reset_in.is_none());
    let p = v.policy("shopify").unwrap();
    assert_eq!((p.reset_in, p.window_s), (None, Some(20)));
    let plus = view(
        "HTTP/1.1 200 OK\nX-Shopify-Shop-Api-Call-Limit: 399/400\n\n",
        1_700_000_000,
    );
    let p = plus.policy("shopify").unwrap();
    assert_eq!(
        (p.remaining, p.reset_in, p.window_s),
        (Some(1), None, Some(20))
    );
}

// OpenAI API reference, "Retries" in the official SDKs (openai-python
// `_calculate_retry_timeout`): `retry-after-ms` is read before `retry-after`;
// Azure OpenAI sends `x-ms-retry-after-ms` beside `Retry-After`. The
// millisecond value is the finer one and wins over whole seconds.
#[test]
fn millisecond_hints_beat_a_coarser_retry_after() {
    let v = view(
        "HTTP/1.1 429 Too Many Requests\nretry-after: 2\nretry-after-ms: 1500\n\n",
        1_700_000_000,
    );
    assert_eq!(secs(v.retry_after), Some(1.5));
    assert_eq!(secs(v.retry_after_header), Some(1.5));
    let v = view(
        "HTTP/1.1 429 Too Many Requests\nRetry-After: 1\nx-ms-retry-after-ms: 250\n\n",
        1_700_000_000,
    );
    assert_eq!(secs(v.retry_after), Some(0.25));
    // an invalid millisecond hint leaves Retry-After in charge
    let v = view(
        "HTTP/1.1 429 Too Many Requests\nRetry-After: 3\nretry-after-ms: -5\n\n",
        1_700_000_000,
    );
    assert_eq!(secs(v.retry_after), Some(3.0));
    assert!(v.ignored.iter().any(|i| i.field == "retry-after-ms"));
    // a coarse seconds hint does not override Retry-After
    let v = view(
        "HTTP/1.1 429 Too Many Requests\nRetry-After: 3\nX-RateLimit-Retry-After: 9\n\n",
        1_700_000_000,
    );
    assert_eq!(secs(v.retry_after), Some(3.0));
}

// OpenAI and Anthropic SDKs ("Retries": the `x-should-retry` header is the
// server's explicit verdict) and Stripe docs, "Error handling" →
// "Stripe-Should-Retry": `false` means do not retry even a 429 or 503,
// `true` means a retry is safe even where the status alone says no.
#[test]
fn should_retry_verdict_overrides_the_status() {
    let cases = [
        ("429 Too Many Requests", "x-should-retry: false", false),
        ("503 Service Unavailable", "x-should-retry: false", false),
        ("500 Internal Server Error", "x-should-retry: true", true),
        ("409 Conflict", "Stripe-Should-Retry: true", true),
        ("409 Conflict", "Stripe-Should-Retry: false", false),
        (
            "500 Internal Server Error",
            "Stripe-Should-Retry: TRUE",
            true,
        ),
    ];
    for (status, header, retry) in cases {
        let v = view(&format!("HTTP/1.1 {status}\n{header}\n\n"), 0);
        assert_eq!(v.retry, retry, "{status} with {header}");
        assert_eq!(v.should_retry, Some(retry), "{status} with {header}");
    }
    // the status still says what happened; the verdict only says whether to retry
    let v = view(
        "HTTP/1.1 500 Internal Server Error\nx-should-retry: true\n\n",
        0,
    );
    assert_eq!(v.outcome, OutcomeKind::Error);
    // a success is never retried, whatever the header says
    let v = view("HTTP/1.1 200 OK\nx-should-retry: true\n\n", 0);
    assert!(!v.retry);
}

// Shopify dev docs, "GraphQL Admin API rate limits" → "Cost calculation"
// and "Throttled requests": a throttled query is answered 200 with an
// error whose `extensions.code` is `THROTTLED` and the cost extension; the
// bucket restores `restoreRate` points per second, so the query can run
// once `requestedQueryCost` points are available again.
#[test]
fn shopify_graphql_throttled_inside_a_200() {
    let raw = "HTTP/1.1 200 OK\ncontent-type: application/json\n\n{\"errors\":[{\"message\":\"Throttled\",\"extensions\":{\"code\":\"THROTTLED\",\"documentation\":\"https://shopify.dev/api/usage/rate-limits\"}}],\"extensions\":{\"cost\":{\"requestedQueryCost\":752,\"actualQueryCost\":null,\"throttleStatus\":{\"maximumAvailable\":1000.0,\"currentlyAvailable\":2,\"restoreRate\":50.0}}}}";
    let v = view(raw, 1_700_000_000);
    assert!(has(&v, "shopify-graphql"));
    assert_eq!(v.outcome, OutcomeKind::RateLimited);
    assert!(v.retry);
    // (752 - 2) / 50 = 15 s
    assert_eq!(secs(v.retry_after), Some(15.0));
    let p = v.policy("graphql-cost").unwrap();
    assert_eq!(p.unit, Unit::Other("cost-points".into()));
    assert_eq!((p.quota, p.remaining), (Some(1000), Some(2)));
    assert!(v.limit.is_none(), "cost points are not a request window");
    // a successful answer keeps the policy and is not a rejection
    let ok = "HTTP/1.1 200 OK\ncontent-type: application/json\n\n{\"data\":{},\"extensions\":{\"cost\":{\"requestedQueryCost\":101,\"actualQueryCost\":46,\"throttleStatus\":{\"maximumAvailable\":1000.0,\"currentlyAvailable\":954,\"restoreRate\":50.0}}}}";
    let v = view(ok, 1_700_000_000);
    assert_eq!(v.outcome, OutcomeKind::Success);
    assert!(!v.retry && v.retry_after.is_none());
    assert_eq!(v.policy("graphql-cost").unwrap().remaining, Some(954));
    // a request costlier than the whole bucket waits at most a full restore
    let v = view(&raw.replace("752", "5000"), 1_700_000_000);
    assert_eq!(secs(v.retry_after), Some(19.96));
}

// Salesforce REST API Developer Guide, "Status Codes and Error Responses"
// (403: "If the error code is REQUEST_LIMIT_EXCEEDED, you've exceeded API
// request limits in your org") and "API Request Limits and Allocations"
// (`TotalRequests Limit exceeded.`, a rolling 24 hours; `Sforce-Limit-Info`
// on every answer). A daily allocation used up: a quota, not a permission
// error and not a retry.
#[test]
fn salesforce_request_limit_exceeded_403() {
    let raw = "HTTP/1.1 403 Forbidden\nSforce-Limit-Info: api-usage=25/5000\ncontent-type: application/json;charset=UTF-8\n\n[{\"message\":\"TotalRequests Limit exceeded.\",\"errorCode\":\"REQUEST_LIMIT_EXCEEDED\"}]";
    let v = view(raw, 1_700_000_000);
    assert!(has(&v, "salesforce"));
    assert_eq!(v.outcome, OutcomeKind::QuotaExhausted);
    assert!(!v.retry);
    // the same code for a short limit (concurrent long-running requests)
    let v = view(
        &raw.replace("TotalRequests Limit", "ConcurrentPerOrgLongTxn Limit"),
        1_700_000_000,
    );
    assert_eq!(v.outcome, OutcomeKind::RateLimited);
    // any other 403 stays a permission error
    let v = view(
        "HTTP/1.1 403 Forbidden\ncontent-type: application/json\n\n[{\"message\":\"The requested resource does not exist\",\"errorCode\":\"INSUFFICIENT_ACCESS\"}]",
        1_700_000_000,
    );
    assert_eq!(v.outcome, OutcomeKind::Error);
}

// Google Drive API docs, "Resolve errors": "403: User rate limit exceeded"
// (`userRateLimitExceeded`), "403: Rate limit exceeded"
// (`rateLimitExceeded`), both to retry with backoff, and "403: Daily limit
// exceeded" (`dailyLimitExceeded`); YouTube Data API docs, "Errors":
// `quotaExceeded` (403). The per-day ones are quotas, not retried soon.
#[test]
fn google_usage_limits_403() {
    let body = |reason: &str, message: &str| {
        format!(
            "HTTP/1.1 403 Forbidden\ncontent-type: application/json; charset=UTF-8\n\n{{\"error\":{{\"errors\":[{{\"domain\":\"usageLimits\",\"reason\":\"{reason}\",\"message\":\"{message}\"}}],\"code\":403,\"message\":\"{message}\"}}}}"
        )
    };
    for reason in ["userRateLimitExceeded", "rateLimitExceeded"] {
        let v = view(&body(reason, "Rate Limit Exceeded"), 0);
        assert_eq!(v.outcome, OutcomeKind::RateLimited, "{reason}");
        assert!(v.retry, "{reason}");
    }
    for reason in ["dailyLimitExceeded", "quotaExceeded"] {
        let v = view(&body(reason, "Daily Limit Exceeded"), 0);
        assert_eq!(v.outcome, OutcomeKind::QuotaExhausted, "{reason}");
        assert!(!v.retry, "{reason}");
    }
    let v = view(&body("insufficientFilePermissions", "Forbidden"), 0);
    assert_eq!(v.outcome, OutcomeKind::Error);
}

// draft-ietf-httpapi-ratelimit-headers, latest source text (section
// "RateLimit Field"): the item's parameters are still `r` (now described
// as the available quota) and `t` (the effective window), and `r` is
// REQUIRED. A renaming (`a`, and `w` in place of `t`) was only proposed in
// the discussion of the working group's pull request #164; an item written
// in those names alone lacks `r` and is ignored whole, with a reason.
#[test]
fn ietf_latest_draft_parameter_names() {
    let v = view(
        "HTTP/1.1 200 OK\nRateLimit-Policy: \"burst\";q=100;w=60\nRateLimit: \"burst\";r=80;t=45\n\n",
        0,
    );
    assert_eq!((v.limit, v.remaining), (Some(100), Some(80)));
    assert_eq!(secs(v.reset_in), Some(45.0));
    let v = view(
        "HTTP/1.1 200 OK\nRateLimit-Policy: \"burst\";q=100;w=60\nRateLimit: \"burst\";a=80;w=45\n\n",
        0,
    );
    assert_eq!(v.remaining, None);
    assert!(v.ignored.iter().any(|i| i.field == "ratelimit"));
}
