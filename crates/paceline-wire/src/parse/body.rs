//! The response body: an RFC 9457 problem, and the providers' JSON error
//! shapes that change what a client should do (Discord's `retry_after`,
//! OpenAI's `insufficient_quota`, GitHub's secondary-limit message, Shopify
//! GraphQL's `throttleStatus`, a monthly or spend cap stated in words with
//! its reset date).

use http::HeaderMap;
use paceline_core::Nanos;
use serde::Serialize;
use serde_json::Value;

use super::time::{parse_go_duration, parse_reset, parse_rfc3339, MAX_DELAY_SECS};
use super::vendor::{is_aws_throttling_code, Acc};
use super::{PolicyView, Unit};

/// Bodies larger than this are not read.
pub(crate) const MAX_BODY: usize = 64 * 1024;

/// A parsed problem+json body.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ProblemView {
    /// The `type` URI.
    #[serde(rename = "type")]
    pub type_uri: Option<String>,
    /// The last segment of `type` (`rate_limited`, `quota_exhausted`, …).
    pub code: Option<String>,
    /// `title`.
    pub title: Option<String>,
    /// `status`.
    pub status: Option<u16>,
    /// `detail`.
    pub detail: Option<String>,
    /// `limit`: the policy that was hit.
    pub limit: Option<String>,
    /// `retry_after_s`.
    pub retry_after_s: Option<f64>,
    /// The IETF draft's `violated-policies`.
    #[serde(rename = "violated-policies")]
    pub violated_policies: Vec<String>,
}

fn content_type(headers: &HeaderMap) -> &str {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// Reads the body; returns the problem if it is one.
pub(crate) fn read_body(body: &[u8], headers: &HeaderMap, acc: &mut Acc) -> Option<ProblemView> {
    let trimmed = body.trim_ascii();
    if trimmed.is_empty() {
        return None;
    }
    let ct = content_type(headers).to_ascii_lowercase();
    let says_json = ct.contains("json");
    if trimmed[0] == b'<' {
        aws_xml_error(&trimmed[..trimmed.len().min(MAX_BODY)], acc);
        return None;
    }
    if !says_json && !matches!(trimmed[0], b'{' | b'[') {
        return None;
    }
    if trimmed.len() > MAX_BODY {
        acc.ignore(
            "body",
            format!("body too large to read ({} bytes)", trimmed.len()),
        );
        return None;
    }
    let v: Value = match serde_json::from_slice(trimmed) {
        Ok(v) => v,
        Err(e) => {
            if says_json {
                acc.ignore("body", format!("not valid JSON: {e}"));
            }
            return None;
        }
    };
    // Salesforce answers with an array of errors; the hints come first.
    vendor_hints(&v, acc);
    let obj = v.as_object()?;
    let is_problem = ct.starts_with("application/problem+json")
        || (obj.get("type").is_some_and(Value::is_string)
            && (obj.contains_key("title") || obj.contains_key("status")));
    if !is_problem {
        return None;
    }
    Some(problem(obj, acc))
}

fn string(v: Option<&Value>) -> Option<String> {
    v.and_then(Value::as_str)
        .map(|s| s.chars().take(1024).collect())
}

fn problem(obj: &serde_json::Map<String, Value>, acc: &mut Acc) -> ProblemView {
    let type_uri = string(obj.get("type"));
    let code = type_uri.as_deref().and_then(|t| {
        let seg = t.trim_end_matches('/').rsplit(['/', '#', ':']).next()?;
        (!seg.is_empty()).then(|| seg.to_string())
    });
    let mut p = ProblemView {
        type_uri,
        code,
        title: string(obj.get("title")),
        status: obj
            .get("status")
            .and_then(Value::as_u64)
            .and_then(|s| u16::try_from(s).ok()),
        detail: string(obj.get("detail")),
        limit: string(obj.get("limit")),
        retry_after_s: None,
        violated_policies: Vec::new(),
    };
    match obj.get("retry_after_s").map(secs_value) {
        Some(Ok(s)) => {
            p.retry_after_s = Some(s);
            acc.body_retry = acc.body_retry.or(Some(Nanos::from_secs_f64(s)));
        }
        Some(Err(e)) => acc.ignore("body.retry_after_s", e),
        None => {}
    }
    if let Some(list) = obj.get("violated-policies").and_then(Value::as_array) {
        p.violated_policies = list
            .iter()
            .filter_map(Value::as_str)
            .take(32)
            .map(str::to_string)
            .collect();
    }
    if p.limit.is_none() && p.violated_policies.len() == 1 {
        p.limit = p.violated_policies.first().cloned();
    }
    p
}

fn secs_value(v: &Value) -> Result<f64, String> {
    match v.as_f64() {
        Some(s) if s.is_finite() && s >= 0.0 && s <= MAX_DELAY_SECS as f64 => Ok(s),
        Some(s) => Err(format!("implausible wait {s}")),
        None => Err("not a number".into()),
    }
}

fn lower_str(v: Option<&Value>) -> String {
    v.and_then(Value::as_str).unwrap_or("").to_ascii_lowercase()
}

fn vendor_hints(v: &Value, acc: &mut Acc) {
    // Discord: {"message": "...", "retry_after": 64.57, "global": false}
    if let Some(ra) = v.get("retry_after") {
        match secs_value(ra) {
            Ok(s) => acc.body_retry = Some(Nanos::from_secs_f64(s)),
            Err(e) => acc.ignore("body.retry_after", e),
        }
        if v.get("global").and_then(Value::as_bool) == Some(true) {
            acc.set_global();
        }
    }
    let err = v.get("error");
    let (etype, ecode) = match err {
        Some(Value::Object(_)) => (
            lower_str(err.and_then(|e| e.get("type"))),
            lower_str(err.and_then(|e| e.get("code"))),
        ),
        // Slack: {"ok": false, "error": "ratelimited"}
        Some(Value::String(s)) => (s.to_ascii_lowercase(), String::new()),
        _ => (String::new(), String::new()),
    };
    // OpenAI: a billing quota is not a rate limit.
    if etype == "insufficient_quota" || ecode == "insufficient_quota" {
        acc.body_quota = true;
    }
    // OpenAI `rate_limit_exceeded`, Anthropic `rate_limit_error`, Stripe
    // `rate_limit`, Slack `ratelimited`.
    if [
        "rate_limit_exceeded",
        "rate_limit_error",
        "rate_limit",
        "ratelimited",
        "rate_limited",
    ]
    .iter()
    .any(|c| etype == *c || ecode == *c)
    {
        acc.body_rate_limited = true;
    }
    // HubSpot: {"errorType": "RATE_LIMIT", "policyName": "DAILY", ...}
    if lower_str(v.get("errorType")) == "rate_limit" {
        acc.body_rate_limited = true;
        if lower_str(v.get("policyName")).contains("daily") {
            acc.body_quota = true;
        }
    }
    // Google APIs: {"error": {"code": 429, "status": "RESOURCE_EXHAUSTED",
    //   "message": "Quota exceeded for quota metric ... 'Queries per day' ..."}}
    if let Some(e) = err.filter(|e| e.is_object()) {
        if lower_str(e.get("status")) == "resource_exhausted" {
            acc.body_rate_limited = true;
            if lower_str(e.get("message")).contains("per day") {
                acc.body_quota = true;
            }
        }
    }
    // GitHub: {"message": "You have exceeded a secondary rate limit...",
    //          "documentation_url": "https://docs.github.com/..."}
    let message = lower_str(v.get("message"));
    if message.contains("rate limit") {
        acc.body_rate_limited = true;
    }
    if lower_str(v.get("documentation_url")).contains("docs.github.com")
        || message.contains("secondary rate limit")
    {
        acc.github = true;
        acc.dialect("github");
    }
    let google_quota = match err {
        Some(e) => {
            google_reasons(e, acc);
            google_details(e, acc)
        }
        None => false,
    };
    aws_json_error(v, acc);
    graphql_rate_limited(v, acc);
    salesforce_errors(v, acc);
    shopify_graphql(v, acc);
    // Google's structured details already said which quota ran out; its
    // message's words ("billing details") are not a spend cap.
    if !google_quota {
        spend_cap(v, acc);
    }
}

/// Google's `google.rpc` details: a `RetryInfo` with the wait the server
/// asks for (`"retryDelay": "34s"`), and a `QuotaFailure` naming the quota
/// that ran out (`"quotaId": "GenerateRequestsPerMinutePerProjectPerModel"`).
/// A per-day or per-month quota is used up until it resets; any other is a
/// rate. Returns whether a `QuotaFailure` was found.
fn google_details(err: &Value, acc: &mut Acc) -> bool {
    let Some(list) = err.get("details").and_then(Value::as_array) else {
        return false;
    };
    let mut quota_failure = false;
    for d in list.iter().take(16) {
        let kind = d.get("@type").and_then(Value::as_str).unwrap_or("");
        if kind.ends_with("google.rpc.RetryInfo") {
            let delay = d.get("retryDelay").and_then(Value::as_str).unwrap_or("");
            match parse_go_duration(delay.trim()) {
                Some(w) => acc.body_retry = acc.body_retry.or(Some(w)),
                None => acc.ignore("body.error.details.retryDelay", "not a duration"),
            }
        } else if kind.ends_with("google.rpc.QuotaFailure") {
            quota_failure = true;
            acc.body_rate_limited = true;
            let violations = d.get("violations").and_then(Value::as_array);
            for v in violations.into_iter().flatten().take(16) {
                let names = ["quotaId", "quotaMetric", "subject"]
                    .iter()
                    .map(|k| lower_str(v.get(*k)))
                    .collect::<Vec<_>>()
                    .join(" ");
                if ["perday", "per_day", "per day", "permonth", "per_month"]
                    .iter()
                    .any(|w| names.contains(w))
                {
                    acc.body_quota = true;
                }
            }
        }
    }
    quota_failure
}

/// AWS JSON protocols: `{"__type": "com.amazon.coral.availability#ThrottlingException",
/// "message": "Rate exceeded"}` (also as `code`), usually in a 400.
fn aws_json_error(v: &Value, acc: &mut Acc) {
    let Some(t) = v
        .get("__type")
        .or_else(|| v.get("code"))
        .and_then(Value::as_str)
    else {
        return;
    };
    let code = t.rsplit('#').next().unwrap_or(t);
    let code = code.split(':').next().unwrap_or(code).trim();
    if is_aws_throttling_code(code) {
        acc.dialect("aws");
        acc.body_rate_limited = true;
        acc.rejected_by_limit = true;
    }
}

/// AWS XML protocols: `<Error><Code>Throttling</Code>…</Error>`, usually in
/// a 400 (S3's `SlowDown` in a 503).
fn aws_xml_error(body: &[u8], acc: &mut Acc) {
    let Ok(text) = std::str::from_utf8(body) else {
        return;
    };
    let Some(start) = text.find("<Code>").map(|i| i + "<Code>".len()) else {
        return;
    };
    let Some(len) = text[start..].find("</Code>") else {
        return;
    };
    if is_aws_throttling_code(text[start..start + len].trim()) {
        acc.dialect("aws");
        acc.body_rate_limited = true;
        acc.rejected_by_limit = true;
    }
}

/// A GraphQL answer refused by a rate limit, whatever its status: GitHub's
/// `{"errors": [{"type": "RATE_LIMITED", …}]}` arrives in a 200.
fn graphql_rate_limited(v: &Value, acc: &mut Acc) {
    let Some(errors) = v.get("errors").and_then(Value::as_array) else {
        return;
    };
    let limited = errors.iter().take(16).any(|e| {
        e.get("type").and_then(Value::as_str) == Some("RATE_LIMITED")
            || e.pointer("/extensions/code").and_then(Value::as_str) == Some("RATE_LIMITED")
    });
    if limited {
        acc.body_rate_limited = true;
        acc.rejected_by_limit = true;
    }
}

/// Google APIs' older error shape: `{"error": {"errors": [{"domain":
/// "usageLimits", "reason": "userRateLimitExceeded", …}], "code": 403}}`.
/// The rate reasons are rate limits (retried with backoff); the daily and
/// project quotas are used up until the quota resets.
fn google_reasons(err: &Value, acc: &mut Acc) {
    let Some(list) = err.get("errors").and_then(Value::as_array) else {
        return;
    };
    for e in list.iter().take(16) {
        match e.get("reason").and_then(Value::as_str).unwrap_or("") {
            "rateLimitExceeded" | "userRateLimitExceeded" => acc.body_rate_limited = true,
            "dailyLimitExceeded" | "quotaExceeded" => {
                acc.body_rate_limited = true;
                acc.body_quota = true;
            }
            _ => {}
        }
    }
}

/// Salesforce: `[{"message": "TotalRequests Limit exceeded.", "errorCode":
/// "REQUEST_LIMIT_EXCEEDED"}]` on a 403. `TotalRequests` is the org's
/// allocation over a rolling 24 hours, a quota; the same code for other
/// limits (concurrent long-running requests) is a short rate limit.
fn salesforce_errors(v: &Value, acc: &mut Acc) {
    let Some(list) = v.as_array() else {
        return;
    };
    for e in list.iter().take(16) {
        if e.get("errorCode").and_then(Value::as_str) != Some("REQUEST_LIMIT_EXCEEDED") {
            continue;
        }
        acc.body_rate_limited = true;
        acc.dialect("salesforce");
        if lower_str(e.get("message")).contains("totalrequests") {
            acc.body_quota = true;
        }
    }
}

/// Words that name a cap counted over a billing period, not a rate.
const CAP_PERIOD: &[&str] = &[
    "monthly",
    "per month",
    "this month",
    "spend",
    "spending",
    "billing",
    "budget",
    "credit",
];
/// Words that say the cap was hit.
const CAP_HIT: &[&str] = &[
    "limit",
    "cap",
    "quota",
    "exceeded",
    "exhausted",
    "reached",
    "used up",
];
/// Fields that carry the instant the cap resets.
const CAP_RESET_FIELDS: &[&str] = &[
    "reset_at",
    "resets_at",
    "reset_date",
    "reset_time",
    "resets_on",
    "reset",
    "next_reset",
    "retry_at",
];

/// A body that alone states a monthly or spend cap (a 429 with no
/// headers to tell): `{"error": {"code": "monthly_limit_exceeded",
/// "message": "…", "reset_at": "2024-06-01T00:00:00Z"}}` and the like. The
/// words make it a quota (surfaced, not retried); the reset date, from a
/// field or else from the message, says until when.
fn spend_cap(v: &Value, acc: &mut Acc) {
    let err = v.get("error");
    let mut text = String::new();
    for s in [
        v.get("code"),
        v.get("type"),
        v.get("message"),
        v.get("detail"),
        v.get("title"),
        err.filter(|e| e.is_string()),
        err.and_then(|e| e.get("code")),
        err.and_then(|e| e.get("type")),
        err.and_then(|e| e.get("message")),
    ]
    .into_iter()
    .flatten()
    .filter_map(Value::as_str)
    {
        text.extend(s.chars().take(1024).map(|c| match c {
            '_' | '-' => ' ',
            c => c.to_ascii_lowercase(),
        }));
        text.push(' ');
    }
    let period = CAP_PERIOD.iter().any(|w| text.contains(w));
    let hit = CAP_HIT.iter().any(|w| text.contains(w));
    if !(period && hit) {
        return;
    }
    acc.body_quota = true;
    acc.dialect("body-cap");
    let field = CAP_RESET_FIELDS
        .iter()
        .flat_map(|k| [v.get(*k), err.and_then(|e| e.get(*k))])
        .flatten()
        .find_map(|x| reset_value(x, acc.now));
    let reset = field.or_else(|| {
        let message = err
            .and_then(|e| e.get("message"))
            .or_else(|| v.get("message"))
            .or_else(|| v.get("detail"))
            .and_then(Value::as_str)?;
        date_in_text(message, acc.now)
    });
    match reset {
        Some(d) => acc.body_retry = acc.body_retry.or(Some(d)),
        None => acc.ignore("body", "a spend or monthly cap without a reset date"),
    }
}

/// A reset instant written as a date, an RFC 3339 instant (seconds
/// optional), or epoch seconds or milliseconds, as a delay from `now`.
fn reset_value(v: &Value, now: Nanos) -> Option<Nanos> {
    match v {
        Value::String(s) => date(s.trim(), now).or_else(|| parse_reset(s, now).ok().map(|r| r.0)),
        Value::Number(n) => parse_reset(&n.to_string(), now).ok().map(|r| r.0),
        _ => None,
    }
}

/// `2024-06-01` (midnight UTC) or an RFC 3339 instant.
fn date(s: &str, now: Nanos) -> Option<Nanos> {
    let b = s.as_bytes();
    let t = if b.len() == 10 && b[4] == b'-' && b[7] == b'-' {
        parse_rfc3339(&format!("{s}T00:00Z"))
    } else {
        parse_rfc3339(s)
    }?;
    Some(t.saturating_sub(now))
}

/// The first ISO 8601 date or instant in a message (`… resets on
/// 2024-06-01.`, `… until 2024-06-01T00:00Z`).
fn date_in_text(text: &str, now: Nanos) -> Option<Nanos> {
    let b = text.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| b.get(r).is_some_and(|p| p.iter().all(u8::is_ascii_digit));
    (0..b.len().saturating_sub(9)).find_map(|i| {
        let at_start = i == 0 || !b[i - 1].is_ascii_alphanumeric();
        if !(at_start
            && digits(i..i + 4)
            && b[i + 4] == b'-'
            && digits(i + 5..i + 7)
            && b[i + 7] == b'-'
            && digits(i + 8..i + 10))
        {
            return None;
        }
        // the longest instant starting here that parses
        let end = (i + 10..=b.len().min(i + 35))
            .rev()
            .find(|&e| text.is_char_boundary(e) && date(&text[i..e], now).is_some())?;
        date(&text[i..end], now)
    })
}

/// Shopify GraphQL: `extensions.cost.throttleStatus` is a leaky bucket of
/// cost points.
fn shopify_graphql(v: &Value, acc: &mut Acc) {
    let Some(ts) = v.pointer("/extensions/cost/throttleStatus") else {
        return;
    };
    let num = |k: &str| {
        ts.get(k)
            .and_then(Value::as_f64)
            .filter(|x| x.is_finite() && *x >= 0.0)
    };
    let (Some(max), Some(avail)) = (num("maximumAvailable"), num("currentlyAvailable")) else {
        acc.ignore(
            "body.extensions.cost",
            "throttleStatus without maximumAvailable/currentlyAvailable",
        );
        return;
    };
    acc.dialect("shopify-graphql");
    let mut p = PolicyView::named("graphql-cost", Unit::Other("cost-points".into()));
    p.quota = Some(max as u64);
    p.remaining = Some(avail.min(max) as u64);
    if let Some(rate) = num("restoreRate").filter(|r| *r > 0.0) {
        let full = (max - avail).max(0.0) / rate;
        p.reset_in = (full <= MAX_DELAY_SECS as f64).then(|| Nanos::from_secs_f64(full));
    }
    acc.push_policy(p);
    let throttled = v
        .get("errors")
        .and_then(Value::as_array)
        .is_some_and(|errs| {
            errs.iter()
                .any(|e| e.pointer("/extensions/code").and_then(Value::as_str) == Some("THROTTLED"))
        });
    if !throttled {
        return;
    }
    acc.body_rate_limited = true;
    acc.body_throttled = true;
    // The query runs once its requested cost is available again; a cost
    // above the bucket's size waits at most for a full restore.
    let requested = v
        .pointer("/extensions/cost/requestedQueryCost")
        .and_then(Value::as_f64)
        .filter(|x| x.is_finite() && *x >= 0.0);
    let rate = num("restoreRate").filter(|r| *r > 0.0);
    match (requested, rate) {
        (Some(cost), Some(rate)) => {
            let secs = (cost.min(max) - avail).max(0.0) / rate;
            if secs <= MAX_DELAY_SECS as f64 {
                acc.throttle_wait = Some(Nanos::from_secs_f64(secs));
            } else {
                acc.ignore("body.extensions.cost", format!("implausible wait {secs} s"));
            }
        }
        _ => acc.ignore(
            "body.extensions.cost",
            "throttled without requestedQueryCost or a positive restoreRate",
        ),
    }
}
