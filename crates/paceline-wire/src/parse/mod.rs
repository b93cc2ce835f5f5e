//! Parsing: one response's headers (and body) folded into a single
//! normalised [`ResponseView`], whatever dialect the server speaks.
//!
//! Why one view: a client paces and retries the same way whether the
//! server wrote the IETF draft's `RateLimit`, GitHub's `x-ratelimit-*`,
//! OpenAI's `x-ratelimit-reset-tokens: 6m0s` or Anthropic's RFC 3339
//! resets. Every recognised dialect becomes [`PolicyView`]s; every value
//! that was dropped is listed in [`ResponseView::ignored`] with the reason.
//!
//! The rules, in brief (see [`parse_response`]):
//!
//! - `retry_after`: a valid millisecond hint (`retry-after-ms`,
//!   `x-ms-retry-after-ms`, `x-amz-retry-after`) wins, being finer than
//!   whole seconds; then a valid `Retry-After` (delay-seconds, an HTTP-date
//!   minus now, zero once the date has passed, leniently a plain decimal);
//!   then `x-ratelimit-retry-after` in seconds. An invalid one (negative,
//!   exponent, text, several different values) is ignored, not clamped.
//!   Otherwise a throttled body's exact wait (Shopify GraphQL: the points
//!   the query needs at the restore rate). Otherwise the wait lasts until
//!   every exhausted window (remaining 0, any unit; on a 429, also a window
//!   known only by its reset) has reset. Otherwise a retry hint in the
//!   body (Discord's `retry_after`, Google's `RetryInfo`), then a
//!   provider's documented floor (GitHub's secondary limit
//!   without headers: 60 s). A zero wait is `None`;
//!   [`ResponseView::retry_after_header`] still shows a present zero.
//! - `limit`/`remaining`/`reset_in` describe the tightest window counted in
//!   requests: the fewest remaining, and on a tie the one resetting last.
//! - A structured field that fails to parse or breaks its constraints is
//!   ignored whole; rate-limit fields on a response with `Age` > 0 are
//!   ignored; reset values follow the rule in [`time`] (delay, epoch
//!   seconds, epoch milliseconds when ≥ 10^12, or a date).
//! - `outcome`: 429, 420, a throttled body whatever the status (Shopify
//!   GraphQL's `THROTTLED` in a 200), an answer that names its own rate
//!   limit whatever the status (GitHub GraphQL's `RATE_LIMITED` in a 200,
//!   an AWS throttling code such as `ThrottlingException` in a 400), and a
//!   403 with rate-limit evidence (a
//!   body that says so, such as Salesforce's `REQUEST_LIMIT_EXCEEDED` or
//!   Google's `rateLimitExceeded`, a request window at 0, a `Retry-After`) are
//!   `quota_exhausted` when the binding limit (the one the body names, else
//!   the exhausted one resetting last) has a window of an hour or more (or,
//!   window unknown, resets an hour or more away), or when the body says
//!   so; otherwise `rate_limited`, and always for concurrency caps. 503 is
//!   `overloaded`; other 4xx/5xx are `error`. `retry` is true for
//!   `rate_limited` and `overloaded`, unless the server's explicit verdict
//!   (`Stripe-Should-Retry` / `x-should-retry`) says otherwise: on any
//!   answer but a success, `false` forbids a retry and `true` allows one
//!   (a 409, a 500), whatever the status.
//!
//! ```
//! use http::HeaderMap;
//! use paceline_core::Nanos;
//! use paceline_wire::parse::{parse_response, OutcomeKind};
//!
//! let mut h = HeaderMap::new();
//! h.insert("ratelimit-policy", r#""burst";q=20;w=2, "daily";q=10000;w=86400"#.parse().unwrap());
//! h.insert("ratelimit", r#""burst";r=0;t=1, "daily";r=2310;t=21600"#.parse().unwrap());
//! h.insert("retry-after", "1".parse().unwrap());
//! let v = parse_response(429, &h, None, Nanos::from_secs(1_700_000_000));
//! assert_eq!(v.outcome, OutcomeKind::RateLimited);
//! assert!(v.retry);
//! assert_eq!(v.retry_after, Some(Nanos::SECOND));
//! assert_eq!((v.limit, v.remaining), (Some(20), Some(0)));
//! ```

mod body;
mod ietf;
pub mod time;
mod vendor;

use http::HeaderMap;
use paceline_core::Nanos;
use serde::Serialize;

pub use body::ProblemView;
pub use time::parse_retry_after;

/// What kind of answer a response is, for a client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum OutcomeKind {
    /// Not an error (1xx–3xx, and 2xx in particular).
    Success,
    /// A short-window limit: retry after the wait.
    RateLimited,
    /// A long-window quota is used up: surface it, do not retry.
    QuotaExhausted,
    /// The server shed load (503): retry with jitter.
    Overloaded,
    /// Any other error.
    Error,
}

impl OutcomeKind {
    /// The snake_case name used in JSON.
    pub fn as_str(&self) -> &'static str {
        match self {
            OutcomeKind::Success => "success",
            OutcomeKind::RateLimited => "rate_limited",
            OutcomeKind::QuotaExhausted => "quota_exhausted",
            OutcomeKind::Overloaded => "overloaded",
            OutcomeKind::Error => "error",
        }
    }
}

/// What a policy counts.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Unit {
    /// Requests (the default when nothing says otherwise).
    Requests,
    /// Tokens (language-model APIs).
    Tokens,
    /// Bytes of content.
    ContentBytes,
    /// Requests in flight at once.
    ConcurrentRequests,
    /// Anything else (complexity points, spend, percentages…).
    Other(String),
}

impl Unit {
    /// The unit's name, as the IETF draft's `qu` would write it.
    pub fn as_str(&self) -> &str {
        match self {
            Unit::Requests => "requests",
            Unit::Tokens => "tokens",
            Unit::ContentBytes => "content-bytes",
            Unit::ConcurrentRequests => "concurrent-requests",
            Unit::Other(s) => s,
        }
    }
    /// Reads a `qu` value.
    pub fn from_name(s: &str) -> Unit {
        match s {
            "requests" => Unit::Requests,
            "tokens" => Unit::Tokens,
            "content-bytes" => Unit::ContentBytes,
            "concurrent-requests" => Unit::ConcurrentRequests,
            other => Unit::Other(other.to_string()),
        }
    }
    /// Whether this counts requests over a window (the only unit that
    /// defines `limit`/`remaining`/`reset_in`).
    pub fn is_requests(&self) -> bool {
        *self == Unit::Requests
    }
}

impl Serialize for Unit {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// One limit as the server described it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyView {
    /// The policy's name (the IETF name, a provider's resource or
    /// qualifier such as `tokens`, or the dialect's name).
    pub name: String,
    /// The quota per window, when stated.
    pub quota: Option<u64>,
    /// The window in seconds, when stated or documented.
    pub window_s: Option<u64>,
    /// Units left.
    pub remaining: Option<u64>,
    /// Time until the policy resets (is fully restored).
    pub reset_in: Option<Nanos>,
    /// What the policy counts.
    pub unit: Unit,
    /// What the limit applies to, when the server says (a GitHub resource,
    /// a Discord bucket…).
    pub scope: Option<String>,
}

impl PolicyView {
    /// A policy with only a name and unit.
    pub fn named(name: impl Into<String>, unit: Unit) -> PolicyView {
        PolicyView {
            name: name.into(),
            quota: None,
            window_s: None,
            remaining: None,
            reset_in: None,
            unit,
            scope: None,
        }
    }
    /// Nothing is left of it.
    pub fn is_exhausted(&self) -> bool {
        self.remaining == Some(0)
    }
    /// Only a reset is known: no quota, nothing about what is left.
    pub fn is_bare_reset(&self) -> bool {
        self.quota.is_none() && self.remaining.is_none() && self.reset_in.is_some()
    }
}

/// A value that was dropped, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Ignored {
    /// The header (or `body`).
    pub field: String,
    /// Why it was not used.
    pub reason: String,
}

/// Everything a client concludes from one response.
#[derive(Clone, Debug, PartialEq)]
pub struct ResponseView {
    /// The HTTP status.
    pub status: u16,
    /// What kind of answer this is.
    pub outcome: OutcomeKind,
    /// Whether the SDK would retry it.
    pub retry: bool,
    /// The wait before the next request to that scope; `None` when it may
    /// go now.
    pub retry_after: Option<Nanos>,
    /// What a valid `Retry-After` (or vendor millisecond hint) said.
    pub retry_after_header: Option<Nanos>,
    /// `Stripe-Should-Retry` / `x-should-retry`, when present.
    pub should_retry: Option<bool>,
    /// Every limit described, in the order read.
    pub policies: Vec<PolicyView>,
    /// Index into `policies` of the tightest request window.
    pub tightest: Option<usize>,
    /// The tightest request window's quota.
    pub limit: Option<u64>,
    /// The tightest request window's remaining units.
    pub remaining: Option<u64>,
    /// The tightest request window's reset.
    pub reset_in: Option<Nanos>,
    /// The dialects recognised (`ietf`, `x-ratelimit`, `github`, …).
    pub dialects: Vec<String>,
    /// What was dropped, and why.
    pub ignored: Vec<Ignored>,
    /// The problem+json body, if there was one.
    pub problem: Option<ProblemView>,
}

impl ResponseView {
    /// The tightest request window, if any.
    pub fn tightest_policy(&self) -> Option<&PolicyView> {
        self.tightest.map(|i| &self.policies[i])
    }
    /// The policy named `name`.
    pub fn policy(&self, name: &str) -> Option<&PolicyView> {
        self.policies.iter().find(|p| p.name == name)
    }
    /// The view as the JSON object `paceline inspect` prints.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self.report()).unwrap_or_default()
    }

    /// The view as `paceline inspect` reports it, fields in the contract's
    /// order: serialize it with `serde_json`.
    pub fn report(&self) -> Report {
        let secs = |n: Option<Nanos>| n.map(secs_json);
        Report {
            status: self.status,
            outcome: self.outcome,
            retry: self.retry,
            retry_after_s: secs(self.retry_after),
            limit: self.limit,
            remaining: self.remaining,
            reset_in_s: secs(self.reset_in),
            policies: self
                .policies
                .iter()
                .map(|p| PolicyReport {
                    name: p.name.clone(),
                    quota: p.quota,
                    window_s: p.window_s,
                    remaining: p.remaining,
                    reset_in_s: secs(p.reset_in),
                    unit: p.unit.clone(),
                    scope: p.scope.clone(),
                })
                .collect(),
            dialects: self.dialects.clone(),
            ignored: self.ignored.clone(),
            retry_after_header_s: secs(self.retry_after_header),
            should_retry: self.should_retry,
            problem: self.problem.clone(),
        }
    }
}

/// One policy in a [`Report`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PolicyReport {
    /// The policy's name.
    pub name: String,
    /// Its quota, when known.
    pub quota: Option<u64>,
    /// Its window in seconds, when known.
    pub window_s: Option<u64>,
    /// Units left, when known.
    pub remaining: Option<u64>,
    /// Seconds until it resets, when known.
    pub reset_in_s: Option<serde_json::Value>,
    /// What it counts.
    pub unit: Unit,
    /// What it applies to, when said.
    pub scope: Option<String>,
}

/// The JSON object `paceline inspect` prints (see the CLI contract).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    /// The HTTP status.
    pub status: u16,
    /// `success`, `rate_limited`, `quota_exhausted`, `overloaded` or `error`.
    pub outcome: OutcomeKind,
    /// Whether the SDK would retry.
    pub retry: bool,
    /// Seconds to wait before the next request to that scope; null: go now.
    pub retry_after_s: Option<serde_json::Value>,
    /// The tightest request window's quota.
    pub limit: Option<u64>,
    /// The tightest request window's remaining units.
    pub remaining: Option<u64>,
    /// Seconds until the tightest request window resets.
    pub reset_in_s: Option<serde_json::Value>,
    /// Every policy read.
    pub policies: Vec<PolicyReport>,
    /// The dialects recognised.
    pub dialects: Vec<String>,
    /// What was dropped, and why.
    pub ignored: Vec<Ignored>,
    /// What `Retry-After` (or a vendor hint) said, if valid.
    pub retry_after_header_s: Option<serde_json::Value>,
    /// `Stripe-Should-Retry` / `x-should-retry`.
    pub should_retry: Option<bool>,
    /// The problem body, if any.
    pub problem: Option<ProblemView>,
}

/// Seconds as a JSON number: an integer when whole, else to the millisecond
/// (rounded up, so a wait is never shown short).
pub fn secs_json(n: Nanos) -> serde_json::Value {
    let ns = n.as_u64();
    if ns % 1_000_000_000 == 0 {
        serde_json::Value::from(ns / 1_000_000_000)
    } else {
        let ms = ns.div_ceil(1_000_000);
        if ms % 1000 == 0 {
            serde_json::Value::from(ms / 1000)
        } else {
            serde_json::Value::from(ms as f64 / 1000.0)
        }
    }
}

/// Parses one response: its status, headers, optional body and the time it
/// was received. Never panics; see the module docs for the rules.
pub fn parse_response(
    status: u16,
    headers: &HeaderMap,
    body: Option<&[u8]>,
    now: Nanos,
) -> ResponseView {
    let mut acc = vendor::Acc::new(now);
    acc.read_headers(headers);
    let problem = body.and_then(|b| body::read_body(b, headers, &mut acc));
    acc.finish(status, problem)
}

#[cfg(test)]
mod tests;
