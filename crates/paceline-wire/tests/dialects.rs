//! Each provider's dialect, read from the examples the provider itself
//! documents (the source is named above each test). The responses are fed
//! through the raw-response reader exactly as `paceline inspect` does.

use paceline_wire::parse::{OutcomeKind, Unit};

mod common;

use common::{has, secs, view};

// IETF draft-ietf-httpapi-ratelimit-headers (-09 and later), section
// "Examples": a policy of 100 per 10 s with 50 left, resetting in 30 s.
#[test]
fn ietf_draft_example() {
    let v = view(
        "HTTP/1.1 200 Ok\r\nRateLimit-Policy: \"default\";q=100;w=10\r\nRateLimit: \"default\";r=50;t=30\r\n\r\n{}",
        1_700_000_000,
    );
    assert!(has(&v, "ietf"));
    assert_eq!((v.limit, v.remaining), (Some(100), Some(50)));
    assert_eq!(secs(v.reset_in), Some(30.0));
    assert_eq!(v.policies[0].window_s, Some(10));
    assert_eq!(v.outcome, OutcomeKind::Success);
    assert!(!v.retry && v.retry_after.is_none());
}

// Cloudflare API docs, "Rate limits": the API answers with
// `Ratelimit: "default";r=50;t=30` and `Ratelimit-Policy: "default";q=1200;w=300`.
#[test]
fn cloudflare_api() {
    let v = view(
        "HTTP/2 200\nratelimit: \"default\";r=50;t=30\nratelimit-policy: \"default\";q=1200;w=300\n\n",
        1_700_000_000,
    );
    assert_eq!((v.limit, v.remaining), (Some(1200), Some(50)));
    assert_eq!(v.policies[0].window_s, Some(300));
}

// GitHub REST docs, "Rate limits for the REST API" → "Checking the status
// of your rate limit": x-ratelimit-limit/-remaining/-used/-reset/-resource.
#[test]
fn github_primary_headers() {
    let raw = "HTTP/2 200\nx-ratelimit-limit: 5000\nx-ratelimit-remaining: 4999\nx-ratelimit-used: 1\nx-ratelimit-reset: 1691591363\nx-ratelimit-resource: core\n\n";
    let v = view(raw, 1_691_591_363 - 1_800);
    assert!(has(&v, "x-ratelimit") && has(&v, "github"));
    let p = v.tightest_policy().unwrap();
    assert_eq!(p.name, "core");
    assert_eq!(p.window_s, Some(3_600));
    assert_eq!((v.limit, v.remaining), (Some(5000), Some(4999)));
    assert_eq!(secs(v.reset_in), Some(1_800.0));
    assert!(v.retry_after.is_none());
}

// GitHub REST docs, "Exceeding the primary rate limit": a 403 (or 429) with
// x-ratelimit-remaining 0; wait until x-ratelimit-reset (epoch seconds). The
// primary limit is hourly, so this is a quota, not a burst.
#[test]
fn github_primary_exhausted() {
    let raw = "HTTP/2 403\nx-ratelimit-limit: 60\nx-ratelimit-remaining: 0\nx-ratelimit-used: 60\nx-ratelimit-reset: 1377013266\nx-ratelimit-resource: core\ncontent-type: application/json\n\n{\"message\": \"API rate limit exceeded for xxx.xxx.xxx.xxx. (But here's the good news: Authenticated requests get a higher rate limit. Check out the documentation for more details.)\", \"documentation_url\": \"https://docs.github.com/rest/overview/rate-limits-for-the-rest-api\"}";
    let v = view(raw, 1_377_013_266 - 1_200);
    assert_eq!(v.outcome, OutcomeKind::QuotaExhausted);
    assert!(!v.retry);
    assert_eq!(secs(v.retry_after), Some(1_200.0));
}

// GitHub REST docs, "About secondary rate limits": when neither retry-after
// nor x-ratelimit-remaining 0 is present, wait at least one minute.
#[test]
fn github_secondary_floor() {
    let raw = "HTTP/2 403\nx-ratelimit-limit: 5000\nx-ratelimit-remaining: 4990\nx-ratelimit-reset: 1700003000\nx-ratelimit-resource: core\nx-github-request-id: CCEE:9972:181CEB0\ncontent-type: application/json\n\n{\"message\": \"You have exceeded a secondary rate limit. Please wait a few minutes before you try again.\", \"documentation_url\": \"https://docs.github.com/free-pro-team@latest/rest/overview/resources-in-the-rest-api#secondary-rate-limits\"}";
    let v = view(raw, 1_700_000_000);
    assert_eq!(v.outcome, OutcomeKind::RateLimited);
    assert!(v.retry);
    assert_eq!(secs(v.retry_after), Some(60.0));
    // With retry-after present, it wins.
    let raw = raw.replacen("x-ratelimit-limit", "retry-after: 90\nx-ratelimit-limit", 1);
    assert_eq!(secs(view(&raw, 1_700_000_000).retry_after), Some(90.0));
}

// Discord developer docs, "Rate Limits" → "Example Exceeded User Rate Limit
// Response" (written as curl -v prints it).
#[test]
fn discord_user_limit() {
    let raw = "< HTTP/1.1 429 TOO MANY REQUESTS\n< Content-Type: application/json\n< Retry-After: 65\n< X-RateLimit-Limit: 10\n< X-RateLimit-Remaining: 0\n< X-RateLimit-Reset: 1470173023.123\n< X-RateLimit-Reset-After: 64.57\n< X-RateLimit-Bucket: abcd1234\n< X-RateLimit-Scope: user\n{\n  \"message\": \"You are being rate limited.\",\n  \"retry_after\": 64.57,\n  \"global\": false\n}\n";
    let v = view(raw, 1_470_173_023 - 64);
    assert!(has(&v, "discord"));
    assert_eq!(v.outcome, OutcomeKind::RateLimited);
    assert!(v.retry);
    assert_eq!(secs(v.retry_after), Some(65.0));
    let p = v.tightest_policy().unwrap();
    assert_eq!((p.quota, p.remaining), (Some(10), Some(0)));
    // Reset-After is preferred to the epoch Reset.
    assert_eq!(secs(p.reset_in), Some(64.57));
    assert_eq!(p.scope.as_deref(), Some("abcd1234"));
}

// Discord developer docs, "Example Exceeded Resource Rate Limit Response"
// and "Example Exceeded Global Rate Limit Response".
#[test]
fn discord_shared_and_global() {
    let raw = "< HTTP/1.1 429 TOO MANY REQUESTS\n< Content-Type: application/json\n< Retry-After: 1337\n< X-RateLimit-Limit: 10\n< X-RateLimit-Remaining: 9\n< X-RateLimit-Reset: 1470173023.123\n< X-RateLimit-Reset-After: 64.57\n< X-RateLimit-Bucket: abcd1234\n< X-RateLimit-Scope: shared\n{\n  \"message\": \"The resource is being rate limited.\",\n  \"retry_after\": 1336.57,\n  \"global\": false\n}\n";
    let v = view(raw, 1_470_173_000);
    assert_eq!(secs(v.retry_after), Some(1_337.0));
    assert_eq!(v.outcome, OutcomeKind::RateLimited);
    let raw = "< HTTP/1.1 429 TOO MANY REQUESTS\n< Content-Type: application/json\n< Retry-After: 65\n< X-RateLimit-Global: true\n< X-RateLimit-Scope: global\n{\n  \"message\": \"You are being rate limited.\",\n  \"retry_after\": 64.57,\n  \"global\": true\n}\n";
    let v = view(raw, 1_470_173_000);
    assert_eq!(secs(v.retry_after), Some(65.0));
    assert!(v.retry);
}

// OpenAI platform docs, "Rate limits" → "Rate limits in headers": the
// example values, with reset durations `1s` and `6m0s`.
#[test]
fn openai_headers() {
    let raw = "HTTP/1.1 200 OK\nx-ratelimit-limit-requests: 60\nx-ratelimit-limit-tokens: 150000\nx-ratelimit-remaining-requests: 59\nx-ratelimit-remaining-tokens: 149984\nx-ratelimit-reset-requests: 1s\nx-ratelimit-reset-tokens: 6m0s\n\n";
    let v = view(raw, 1_700_000_000);
    assert!(has(&v, "openai"));
    assert_eq!(v.policies.len(), 2);
    let req = v.policy("requests").unwrap();
    assert_eq!(
        (req.quota, req.remaining, secs(req.reset_in)),
        (Some(60), Some(59), Some(1.0))
    );
    let tok = v.policy("tokens").unwrap();
    assert_eq!(tok.unit, Unit::Tokens);
    assert_eq!(secs(tok.reset_in), Some(360.0));
    // Only the request window defines limit/remaining.
    assert_eq!((v.limit, v.remaining), (Some(60), Some(59)));
}

// OpenAI: tokens run out (reset `20ms` style durations), no Retry-After;
// the wait is the exhausted token window's reset.
#[test]
fn openai_tokens_exhausted() {
    let raw = "HTTP/1.1 429 Too Many Requests\nx-ratelimit-limit-requests: 60\nx-ratelimit-remaining-requests: 58\nx-ratelimit-reset-requests: 1.5s\nx-ratelimit-limit-tokens: 150000\nx-ratelimit-remaining-tokens: 0\nx-ratelimit-reset-tokens: 2m30s\ncontent-type: application/json\n\n{\"error\": {\"message\": \"Rate limit reached for gpt-4o on tokens per min (TPM)\", \"type\": \"tokens\", \"param\": null, \"code\": \"rate_limit_exceeded\"}}";
    let v = view(raw, 1_700_000_000);
    assert_eq!(v.outcome, OutcomeKind::RateLimited);
    assert!(v.retry);
    assert_eq!(secs(v.retry_after), Some(150.0));
    assert_eq!(v.remaining, Some(58));
}

// OpenAI error-codes guide: a 429 "You exceeded your current quota" with
// type/code `insufficient_quota` is a billing quota, not a rate limit.
#[test]
fn openai_insufficient_quota() {
    let raw = "HTTP/1.1 429 Too Many Requests\ncontent-type: application/json\n\n{\"error\": {\"message\": \"You exceeded your current quota, please check your plan and billing details.\", \"type\": \"insufficient_quota\", \"param\": null, \"code\": \"insufficient_quota\"}}";
    let v = view(raw, 1_700_000_000);
    assert_eq!(v.outcome, OutcomeKind::QuotaExhausted);
    assert!(!v.retry);
}

// Azure OpenAI: `retry-after-ms` as the only hint; the Responses API also
// sends `-1` counters, which are ignored with a reason.
#[test]
fn azure_openai_ms_hint_and_negative_counters() {
    let raw = "HTTP/1.1 429 Too Many Requests\nretry-after-ms: 1500\nx-ratelimit-limit-tokens: -1\nx-ratelimit-remaining-tokens: -1\nx-ratelimit-reset-tokens: 0\n\n";
    let v = view(raw, 1_700_000_000);
    assert_eq!(secs(v.retry_after), Some(1.5));
    assert_eq!(secs(v.retry_after_header), Some(1.5));
    assert!(v
        .ignored
        .iter()
        .any(|i| i.field == "x-ratelimit-remaining-tokens"));
}

// Anthropic API docs, "Rate limits" → "Response headers": RFC 3339 resets
// and `retry-after` on a 429 (`rate_limit_error`).
#[test]
fn anthropic_headers() {
    let raw = "HTTP/1.1 429 Too Many Requests\nretry-after: 30\nanthropic-ratelimit-requests-limit: 50\nanthropic-ratelimit-requests-remaining: 0\nanthropic-ratelimit-requests-reset: 2023-11-14T22:13:50Z\nanthropic-ratelimit-input-tokens-limit: 40000\nanthropic-ratelimit-input-tokens-remaining: 39000\nanthropic-ratelimit-input-tokens-reset: 2023-11-14T22:13:21Z\ncontent-type: application/json\n\n{\"type\": \"error\", \"error\": {\"type\": \"rate_limit_error\", \"message\": \"Number of request tokens has exceeded your per-minute rate limit\"}}";
    let v = view(raw, 1_700_000_000); // 2023-11-14T22:13:20Z
    assert!(has(&v, "anthropic"));
    assert_eq!(v.outcome, OutcomeKind::RateLimited);
    assert_eq!(secs(v.retry_after), Some(30.0));
    let req = v.policy("requests").unwrap();
    assert_eq!(
        (req.quota, req.remaining, secs(req.reset_in)),
        (Some(50), Some(0), Some(30.0))
    );
    assert_eq!(v.policy("input-tokens").unwrap().unit, Unit::Tokens);
}

// Shopify dev docs, "REST Admin API rate limits": `X-Shopify-Shop-Api-Call-Limit: 40/40`
// and `Retry-After: 2.0` on the 429.
#[test]
fn shopify_rest() {
    let raw = "HTTP/1.1 429 Too Many Requests\nX-Shopify-Shop-Api-Call-Limit: 40/40\nRetry-After: 2.0\n\n";
    let v = view(raw, 1_700_000_000);
    assert!(has(&v, "shopify"));
    assert_eq!(secs(v.retry_after), Some(2.0));
    assert_eq!((v.limit, v.remaining), (Some(40), Some(0)));
    assert_eq!(v.outcome, OutcomeKind::RateLimited);
    let v = view(
        "HTTP/1.1 200 OK\nX-Shopify-Shop-Api-Call-Limit: 32/40\n\n",
        0,
    );
    assert_eq!(v.remaining, Some(8));
}

// Shopify dev docs, "GraphQL Admin API rate limits": the cost extension.
#[test]
fn shopify_graphql_cost() {
    let raw = "HTTP/1.1 200 OK\ncontent-type: application/json\n\n{\"data\": {}, \"extensions\": {\"cost\": {\"requestedQueryCost\": 101, \"actualQueryCost\": 46, \"throttleStatus\": {\"maximumAvailable\": 1000, \"currentlyAvailable\": 954, \"restoreRate\": 50}}}}";
    let v = view(raw, 0);
    let p = v.policy("graphql-cost").unwrap();
    assert_eq!((p.quota, p.remaining), (Some(1000), Some(954)));
    assert_eq!(secs(p.reset_in), Some(0.92));
    assert!(v.limit.is_none(), "cost points are not a request window");
}

// X (Twitter) API docs, "Rate limits" → response headers.
#[test]
fn twitter_x() {
    let raw = "HTTP/1.1 429 Too Many Requests\nx-rate-limit-limit: 900\nx-rate-limit-remaining: 0\nx-rate-limit-reset: 1705420800\n\n";
    let v = view(raw, 1_705_420_800 - 600);
    assert!(has(&v, "x-rate-limit"));
    assert_eq!(secs(v.retry_after), Some(600.0));
    assert_eq!(v.outcome, OutcomeKind::RateLimited);
    assert_eq!(v.limit, Some(900));
}

// Okta developer docs, "Rate limit best practices": X-Rate-Limit-Limit,
// -Remaining, -Reset (epoch seconds).
#[test]
fn okta() {
    let raw = "HTTP/1.1 200 OK\nX-Rate-Limit-Limit: 600\nX-Rate-Limit-Remaining: 598\nX-Rate-Limit-Reset: 1609459200\n\n";
    let v = view(raw, 1_609_459_200 - 45);
    assert_eq!(
        (v.limit, v.remaining, secs(v.reset_in)),
        (Some(600), Some(598), Some(45.0))
    );
}

// GitLab docs, "Rate limits" → "HTTP response headers": RateLimit-Name,
// -Limit, -Observed, -Remaining, -Reset (epoch), -ResetTime (HTTP-date).
#[test]
fn gitlab() {
    let raw = "HTTP/1.1 200 OK\nRateLimit-Name: throttle_authenticated_api\nRateLimit-Limit: 2000\nRateLimit-Observed: 6\nRateLimit-Remaining: 1994\nRateLimit-Reset: 1641505278\nRateLimit-ResetTime: Thu, 06 Jan 2022 21:41:18 GMT\n\n";
    let v = view(raw, 1_641_505_278 - 60);
    assert!(has(&v, "gitlab"));
    let p = v.tightest_policy().unwrap();
    assert_eq!(p.name, "throttle_authenticated_api");
    assert_eq!(
        (v.limit, v.remaining, secs(v.reset_in)),
        (Some(2000), Some(1994), Some(60.0))
    );
}

// Docker docs, "Docker Hub pull usage and limits": `ratelimit-limit: 100;w=21600`,
// `ratelimit-remaining: 76;w=21600`.
#[test]
fn docker_hub() {
    let raw = "HTTP/1.1 200 OK\nratelimit-limit: 100;w=21600\nratelimit-remaining: 76;w=21600\ndocker-ratelimit-source: 192.0.2.1\n\n";
    let v = view(raw, 0);
    assert!(has(&v, "ietf-draft03"));
    assert_eq!((v.limit, v.remaining), (Some(100), Some(76)));
    assert_eq!(v.tightest_policy().unwrap().window_s, Some(21_600));
}

// Draft-03 of the IETF draft: RateLimit-Limit with quota policies,
// RateLimit-Reset as delay seconds.
#[test]
fn ietf_draft03() {
    let raw = "HTTP/1.1 200 OK\nRateLimit-Limit: 10, 10;w=1, 50;w=60\nRateLimit-Remaining: 9\nRateLimit-Reset: 1\n\n";
    let v = view(raw, 1_700_000_000);
    assert_eq!(
        (v.limit, v.remaining, secs(v.reset_in)),
        (Some(10), Some(9), Some(1.0))
    );
    assert_eq!(v.tightest_policy().unwrap().window_s, Some(1));
}

// Reddit API wiki, "Rules": X-Ratelimit-Used, X-Ratelimit-Remaining
// (a decimal) and X-Ratelimit-Reset (seconds until the period ends).
#[test]
fn reddit() {
    let raw = "HTTP/1.1 200 OK\nx-ratelimit-used: 2\nx-ratelimit-remaining: 598.0\nx-ratelimit-reset: 372\n\n";
    let v = view(raw, 1_700_000_000);
    // The limit is what was used plus what is left.
    assert_eq!(
        (v.limit, v.remaining, secs(v.reset_in)),
        (Some(600), Some(598), Some(372.0))
    );
}

// Zendesk developer docs, "Rate limits": account and endpoint limits side
// by side.
#[test]
fn zendesk() {
    let raw = "HTTP/1.1 200 OK\nx-rate-limit: 700\nratelimit-limit: 700\nx-rate-limit-remaining: 699\nratelimit-remaining: 699\nratelimit-reset: 41\nzendesk-ratelimit-tickets-index: total=100; remaining=99; resets=41\n\n";
    let v = view(raw, 0);
    assert!(has(&v, "zendesk"));
    // The account limit appears once, with the reset the draft-03 field gave.
    let account: Vec<_> = v.policies.iter().filter(|p| p.quota == Some(700)).collect();
    assert_eq!(account.len(), 1);
    assert_eq!(secs(account[0].reset_in), Some(41.0));
    let p = v.tightest_policy().unwrap();
    assert_eq!(p.name, "tickets-index");
    assert_eq!((v.limit, v.remaining), (Some(100), Some(99)));
}

// Atlassian Jira Cloud docs, "Rate limiting": ISO 8601 reset without
// seconds, X-RateLimit-NearLimit and RateLimit-Reason, Retry-After on 429.
#[test]
fn atlassian() {
    let raw = "HTTP/1.1 429 Too Many Requests\nRetry-After: 1800\nX-RateLimit-Limit: 350\nX-RateLimit-Remaining: 0\nX-RateLimit-Reset: 2023-11-14T22:43Z\nX-RateLimit-NearLimit: true\nRateLimit-Reason: jira-quota-tenant-based\n\n";
    let v = view(raw, 1_700_000_000);
    assert_eq!(secs(v.retry_after), Some(1_800.0));
    assert_eq!(secs(v.reset_in), Some(1_780.0));
}

// Sentry developer docs, "Rate Limiting" (SDK): X-Sentry-Rate-Limits with
// per-category waits; a 429 must wait for every listed category.
#[test]
fn sentry_ingest() {
    let raw = "HTTP/1.1 429 Too Many Requests\nX-Sentry-Rate-Limits: 60:transaction:key, 2700:default;error;security:organization\n\n";
    let v = view(raw, 0);
    assert!(has(&v, "sentry"));
    assert_eq!(secs(v.retry_after), Some(2_700.0));
    assert_eq!(v.policies.len(), 2);
}

// Sentry web API docs, "Rate Limits": X-Sentry-Rate-Limit-Limit, -Remaining,
// -Reset, -ConcurrentLimit, -ConcurrentRemaining.
#[test]
fn sentry_web_api() {
    let raw = "HTTP/1.1 200 OK\nX-Sentry-Rate-Limit-Limit: 50\nX-Sentry-Rate-Limit-Remaining: 49\nX-Sentry-Rate-Limit-Reset: 1700000001\nX-Sentry-Rate-Limit-ConcurrentLimit: 25\nX-Sentry-Rate-Limit-ConcurrentRemaining: 24\n\n";
    let v = view(raw, 1_700_000_000);
    assert_eq!((v.limit, v.remaining), (Some(50), Some(49)));
    let c = v.policy("concurrent").unwrap();
    assert_eq!(
        (c.unit.clone(), c.remaining),
        (Unit::ConcurrentRequests, Some(24))
    );
}

// HubSpot developer docs, "API usage details": daily, ten-second interval
// and per-second limits in one response.
#[test]
fn hubspot() {
    let raw = "HTTP/1.1 200 OK\nX-HubSpot-RateLimit-Daily: 250000\nX-HubSpot-RateLimit-Daily-Remaining: 249991\nX-HubSpot-RateLimit-Interval-Milliseconds: 10000\nX-HubSpot-RateLimit-Max: 100\nX-HubSpot-RateLimit-Remaining: 99\nX-HubSpot-RateLimit-Secondly: 10\nX-HubSpot-RateLimit-Secondly-Remaining: 9\n\n";
    let v = view(raw, 0);
    assert!(has(&v, "hubspot"));
    assert_eq!(v.policy("daily").unwrap().window_s, Some(86_400));
    assert_eq!(v.policy("interval").unwrap().window_s, Some(10));
    let t = v.tightest_policy().unwrap();
    assert_eq!((t.name.as_str(), t.window_s), ("secondly", Some(1)));
    assert_eq!((v.limit, v.remaining), (Some(10), Some(9)));
}

// Trello REST docs, "Rate limits": per-token and per-key limits with the
// interval in milliseconds.
#[test]
fn trello() {
    let raw = "HTTP/1.1 200 OK\nx-rate-limit-api-token-interval-ms: 10000\nx-rate-limit-api-token-max: 100\nx-rate-limit-api-token-remaining: 99\nx-rate-limit-api-key-interval-ms: 10000\nx-rate-limit-api-key-max: 300\nx-rate-limit-api-key-remaining: 298\n\n";
    let v = view(raw, 0);
    let t = v.tightest_policy().unwrap();
    assert_eq!(
        (t.name.as_str(), t.window_s, t.remaining),
        ("api-token", Some(10), Some(99))
    );
}

// Stripe docs, "Rate limits" and "Error handling": a 429 with code
// `rate_limit`; `Stripe-Should-Retry` says whether a retry is safe.
#[test]
fn stripe() {
    let raw = "HTTP/1.1 429 Too Many Requests\nStripe-Should-Retry: true\ncontent-type: application/json\n\n{\"error\": {\"code\": \"rate_limit\", \"message\": \"Request rate limit exceeded.\", \"type\": \"invalid_request_error\"}}";
    let v = view(raw, 0);
    assert_eq!(v.should_retry, Some(true));
    assert!(v.retry);
    assert_eq!(v.outcome, OutcomeKind::RateLimited);
    let raw = "HTTP/1.1 409 Conflict\nStripe-Should-Retry: false\n\n";
    let v = view(raw, 0);
    assert_eq!(
        (v.should_retry, v.retry, v.outcome),
        (Some(false), false, OutcomeKind::Error)
    );
}

// Slack API docs, "Rate limits": a 429 with only Retry-After.
#[test]
fn slack() {
    let raw = "HTTP/1.1 429 Too Many Requests\nRetry-After: 30\ncontent-type: application/json\n\n{\"ok\": false, \"error\": \"ratelimited\"}";
    let v = view(raw, 0);
    assert_eq!(secs(v.retry_after), Some(30.0));
    assert!(v.retry);
}

// Azure Resource Manager docs, "Understand how Azure Resource Manager
// throttles requests": remaining-only counters and the Compute resource list.
#[test]
fn azure_resource_manager() {
    let raw = "HTTP/1.1 200 OK\nx-ms-ratelimit-remaining-subscription-reads: 11999\nx-ms-ratelimit-remaining-resource: Microsoft.Compute/HighCostGet3Min;107,Microsoft.Compute/HighCostGet30Min;587\n\n";
    let v = view(raw, 0);
    assert!(has(&v, "azure"));
    assert_eq!(
        v.policy("subscription-reads").unwrap().remaining,
        Some(11_999)
    );
    let p = v.policy("Microsoft.Compute/HighCostGet3Min").unwrap();
    assert_eq!((p.remaining, p.window_s), (Some(107), Some(180)));
    assert_eq!(v.remaining, Some(107));
}

// Heroku Platform API reference, "Rate Limits": RateLimit-Remaining only.
#[test]
fn heroku() {
    let v = view("HTTP/1.1 200 OK\nRateLimit-Remaining: 4499\n\n", 0);
    assert_eq!((v.limit, v.remaining), (None, Some(4499)));
}

// Salesforce REST docs, "Limit Info Header": `Sforce-Limit-Info: api-usage=25/5000`.
#[test]
fn salesforce() {
    let v = view(
        "HTTP/1.1 200 OK\nSforce-Limit-Info: api-usage=25/5000\n\n",
        0,
    );
    let p = v.policy("api-usage").unwrap();
    assert_eq!(
        (p.quota, p.remaining, p.window_s),
        (Some(5000), Some(4975), Some(86_400))
    );
}

// MailerLite docs, "API rate limits": X-RateLimit-Retry-After in seconds.
#[test]
fn mailerlite_retry_hint() {
    let raw = "HTTP/1.1 429 Too Many Requests\nX-RateLimit-Limit: 60\nX-RateLimit-Remaining: 0\nX-RateLimit-Retry-After: 12\n\n";
    let v = view(raw, 0);
    assert_eq!(secs(v.retry_after), Some(12.0));
}

// lemlist API docs, "Rate limits": X-RateLimit-Reset as a JavaScript date
// string, 20 requests per 2 seconds.
#[test]
fn lemlist_js_date() {
    let raw = "HTTP/1.1 200 OK\nRetry-After: 2\nX-RateLimit-Limit: 20\nX-RateLimit-Remaining: 7\nX-RateLimit-Reset: Tue Feb 16 2021 09:02:42 GMT+0100 (Central European Standard Time)\n\n";
    let v = view(raw, 1_613_462_560); // 2021-02-16T08:02:40Z
    assert_eq!(secs(v.reset_in), Some(2.0));
    assert_eq!(v.remaining, Some(7));
}

// RFC 9110 section 10.2.3: Retry-After as an HTTP-date.
#[test]
fn retry_after_http_date() {
    let raw = "HTTP/1.1 503 Service Unavailable\nRetry-After: Fri, 31 Dec 1999 23:59:59 GMT\n\n";
    let v = view(raw, 946_684_799 - 120);
    assert_eq!(v.outcome, OutcomeKind::Overloaded);
    assert!(v.retry);
    assert_eq!(secs(v.retry_after), Some(120.0));
}

// Kong Gateway docs, "Rate Limiting" plugin: per-period headers next to the
// draft-03 ones.
#[test]
fn kong() {
    let raw = "HTTP/1.1 200 OK\nRateLimit-Limit: 6\nRateLimit-Remaining: 4\nRateLimit-Reset: 47\nX-RateLimit-Limit-Minute: 10\nX-RateLimit-Remaining-Minute: 9\nX-RateLimit-Limit-Hour: 100\nX-RateLimit-Remaining-Hour: 4\n\n";
    let v = view(raw, 0);
    assert_eq!(v.policy("minute").unwrap().window_s, Some(60));
    assert_eq!(v.policy("hour").unwrap().window_s, Some(3_600));
    // Two windows with 4 left: the one resetting last wins the tie; the
    // hour window's reset is unknown, so the draft-03 one (47 s) is tightest.
    assert_eq!(v.remaining, Some(4));
}

// Zoom developer docs, "Rate limits": X-RateLimit-Type tells a daily limit
// from a per-second one.
#[test]
fn zoom_daily_limit() {
    let raw = "HTTP/1.1 429 Too Many Requests\nX-RateLimit-Category: Heavy\nX-RateLimit-Type: Daily-limit\nX-RateLimit-Limit: 60000\nX-RateLimit-Remaining: 0\n\n";
    let v = view(raw, 0);
    assert_eq!(v.tightest_policy().unwrap().window_s, Some(86_400));
    assert_eq!(v.outcome, OutcomeKind::QuotaExhausted);
    assert!(!v.retry);
}

// Freshdesk API docs, "Rate limit": X-Ratelimit-Total / -Remaining.
#[test]
fn freshdesk() {
    let raw = "HTTP/1.1 200 OK\nX-Ratelimit-Total: 400\nX-Ratelimit-Remaining: 395\nX-Ratelimit-Used-CurrentRequest: 1\n\n";
    let v = view(raw, 0);
    assert_eq!((v.limit, v.remaining), (Some(400), Some(395)));
}

// Etsy Open API v3 docs, "Rate limits": per-second and per-day allowances.
#[test]
fn etsy() {
    let raw = "HTTP/1.1 200 OK\nx-limit-per-second: 10\nx-remaining-this-second: 9\nx-limit-per-day: 10000\nx-remaining-today: 9998\n\n";
    let v = view(raw, 0);
    assert!(has(&v, "etsy"));
    assert_eq!(v.policy("day").unwrap().window_s, Some(86_400));
    assert_eq!((v.limit, v.remaining), (Some(10), Some(9)));
}

// HubSpot developer docs, "API usage guidelines": the 429 body names the
// policy that was hit.
#[test]
fn hubspot_daily_429_body() {
    let raw = "HTTP/1.1 429 Too Many Requests\ncontent-type: application/json\n\n{\"status\": \"error\", \"message\": \"You have reached your daily limit.\", \"errorType\": \"RATE_LIMIT\", \"correlationId\": \"c033cdaa-2c40-4a64-ae48-b4cec88dad24\", \"policyName\": \"DAILY\", \"requestId\": \"3d3e35b7-0dae-4b9f-a6e3-9c230cbcf8dd\"}";
    let v = view(raw, 0);
    assert_eq!(v.outcome, OutcomeKind::QuotaExhausted);
}

// Google Cloud APIs, "Errors" (RESOURCE_EXHAUSTED): a per-day quota in the
// message is a quota, a per-minute one a rate limit.
#[test]
fn google_resource_exhausted() {
    let day = "HTTP/1.1 429 Too Many Requests\ncontent-type: application/json\n\n{\"error\": {\"code\": 429, \"message\": \"Quota exceeded for quota metric 'Queries' and limit 'Queries per day' of service 'example.googleapis.com'\", \"status\": \"RESOURCE_EXHAUSTED\"}}";
    assert_eq!(view(day, 0).outcome, OutcomeKind::QuotaExhausted);
    let minute = day.replace("per day", "per minute");
    let v = view(&minute, 0);
    assert_eq!(v.outcome, OutcomeKind::RateLimited);
    assert!(v.retry);
}

// Twilio docs, error 20429 "Too Many Requests": no rate-limit headers, only
// the status; the client backs off on its own.
#[test]
fn twilio_bare_429() {
    let raw = "HTTP/1.1 429 Too Many Requests\ncontent-type: application/json\n\n{\"code\": 20429, \"message\": \"Too Many Requests\", \"more_info\": \"https://www.twilio.com/docs/errors/20429\", \"status\": 429}";
    let v = view(raw, 0);
    assert_eq!(v.outcome, OutcomeKind::RateLimited);
    assert!(v.retry);
    assert!(v.retry_after.is_none());
    assert!(v.dialects.is_empty());
}

// SendGrid v3 docs, "Rate Limits": X-RateLimit-Reset in epoch seconds.
#[test]
fn sendgrid() {
    let raw = "HTTP/1.1 429 TOO MANY REQUESTS\nX-RateLimit-Limit: 150\nX-RateLimit-Remaining: 0\nX-RateLimit-Reset: 1392815263\n\n{\"errors\": [{\"field\": null, \"message\": \"too many requests\"}]}";
    let v = view(raw, 1_392_815_263 - 20);
    assert_eq!(secs(v.retry_after), Some(20.0));
    assert_eq!(v.outcome, OutcomeKind::RateLimited);
}

// Linear API docs, "Rate limiting": request and complexity budgets with
// resets in epoch milliseconds.
#[test]
fn linear() {
    let raw = "HTTP/1.1 200 OK\nX-RateLimit-Requests-Limit: 1500\nX-RateLimit-Requests-Remaining: 1499\nX-RateLimit-Requests-Reset: 1700003600000\nX-RateLimit-Complexity-Limit: 250000\nX-RateLimit-Complexity-Remaining: 249000\nX-RateLimit-Complexity-Reset: 1700003600000\n\n";
    let v = view(raw, 1_700_000_000);
    assert_eq!((v.limit, v.remaining), (Some(1500), Some(1499)));
    assert_eq!(secs(v.reset_in), Some(3_600.0));
    assert!(matches!(
        v.policy("complexity").unwrap().unit,
        Unit::Other(_)
    ));
}

// Fastly API docs, "Rate limiting": Fastly-RateLimit-Remaining and
// Fastly-RateLimit-Reset (epoch seconds).
#[test]
fn fastly() {
    let raw =
        "HTTP/1.1 200 OK\nFastly-RateLimit-Remaining: 999\nFastly-RateLimit-Reset: 1700000300\n\n";
    let v = view(raw, 1_700_000_000);
    assert_eq!((v.remaining, secs(v.reset_in)), (Some(999), Some(300.0)));
}

// Mastodon API docs, "Rate limits": X-RateLimit-Reset as an ISO 8601
// timestamp with milliseconds.
#[test]
fn mastodon() {
    let raw = "HTTP/1.1 200 OK\nX-RateLimit-Limit: 300\nX-RateLimit-Remaining: 299\nX-RateLimit-Reset: 2023-11-14T22:15:00.000Z\n\n";
    let v = view(raw, 1_700_000_000);
    assert_eq!(secs(v.reset_in), Some(100.0));
}
