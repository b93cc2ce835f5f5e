//! What the client needs to know about a response, whoever parsed it.
//!
//! The header dialects are read by `paceline-wire`; the client folds the
//! result into an [`Observation`]: the outcome, the wait the server asked
//! for, vendor retry hints and every policy with what is left of it. The
//! simulator can also build observations directly.

use http::HeaderMap;
use paceline_core::Nanos;
use paceline_wire::parse::{OutcomeKind, PolicyView, ResponseView};

/// How a response ended, from the client's point of view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResponseKind {
    /// Anything the server accepted (2xx, 3xx, and 4xx/5xx other than the
    /// rate-limit ones: those go back to the application unchanged).
    Success,
    /// 429 for a short window: retry after the wait.
    RateLimited,
    /// 429 for a long-window quota: surface it, do not retry.
    QuotaExhausted,
    /// 503: the server is overloaded.
    Overloaded,
    /// 409 with `Retry-After`: a request with the same `Idempotency-Key`
    /// is still running (`idempotency_in_flight`); retried after the wait,
    /// with the same key. A 409 or 422 without one (a key reused with
    /// another request) is an [`Error`](ResponseKind::Error), never
    /// retried.
    InFlight,
    /// Another error status.
    Error,
}

/// One published policy and what is left of it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicyObservation {
    /// The policy name (empty for dialects without names).
    pub name: String,
    /// Quota `q`.
    pub quota: Option<u64>,
    /// Window `w` in seconds.
    pub window_s: Option<u64>,
    /// Units left `r`.
    pub remaining: Option<u64>,
    /// Time until the policy resets `t`.
    pub reset_in: Option<Nanos>,
    /// Whether the policy counts requests (not tokens, bytes or spend).
    pub counts_requests: bool,
    /// Whether the policy applies per endpoint rather than per account.
    pub per_endpoint: bool,
    /// What the policy counts when not requests: `tokens`,
    /// `content-bytes`, `points` (Shopify GraphQL cost points, GitHub
    /// GraphQL points), `concurrent-requests` or a server's own `qu`
    /// (see [`crate::cost`]). Empty (the default) means requests.
    pub unit: String,
}

impl PolicyObservation {
    /// The unit's name (`requests` when `unit` is empty).
    pub fn unit_name(&self) -> &str {
        match self.unit.as_str() {
            "" => crate::cost::REQUESTS,
            u => u,
        }
    }

    /// Whether the client keeps a mirror of this policy and paces on it:
    /// a policy of requests, or of another unit whose quota is published
    /// (without one, an amount cannot be weighed against it). Concurrency
    /// caps are not windows, and are not mirrored.
    pub fn is_mirrored(&self) -> bool {
        match self.unit_name() {
            crate::cost::REQUESTS => self.counts_requests,
            "concurrent-requests" => false,
            _ => self.quota.is_some_and(|q| q > 0),
        }
    }
}

/// A response, as far as pacing and retrying are concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observation {
    /// The HTTP status.
    pub status: u16,
    /// The outcome.
    pub kind: ResponseKind,
    /// The wait the server asked for (`Retry-After` or a vendor hint such
    /// as `retry-after-ms` or `x-amz-retry-after`).
    pub retry_after: Option<Nanos>,
    /// An explicit retry hint (`Stripe-Should-Retry`, `x-should-retry`).
    pub should_retry: Option<bool>,
    /// Every policy the response published.
    pub policies: Vec<PolicyObservation>,
    /// The policy the rejection names (problem body `limit`), if any.
    pub limit: Option<String>,
    /// The raw headers, kept for diagnostics of 429s (may be empty).
    pub headers: Vec<(String, String)>,
}

impl Observation {
    /// A response with a status and no useful headers; the kind follows the
    /// status (429 → rate limited, 503 → overloaded).
    pub fn bare(status: u16) -> Self {
        let kind = match status {
            429 => ResponseKind::RateLimited,
            503 => ResponseKind::Overloaded,
            s if s >= 400 => ResponseKind::Error,
            _ => ResponseKind::Success,
        };
        Observation {
            status,
            kind,
            retry_after: None,
            should_retry: None,
            policies: Vec::new(),
            limit: None,
            headers: Vec::new(),
        }
    }

    /// Sets the wait the server asked for (a 409 with a wait is a
    /// request still in flight under the same key).
    pub fn with_retry_after(mut self, ra: Nanos) -> Self {
        self.retry_after = Some(ra);
        if self.status == 409 && self.kind == ResponseKind::Error {
            self.kind = ResponseKind::InFlight;
        }
        self
    }

    /// Adds a named policy with everything known about it.
    pub fn with_policy(
        self,
        name: &str,
        quota: u64,
        window_s: u64,
        remaining: u64,
        reset_in: Nanos,
    ) -> Self {
        self.with_unit_policy(name, "", quota, window_s, remaining, reset_in)
    }

    /// Adds a named policy counting `unit` (`tokens`, `points`, …) with
    /// everything known about it.
    pub fn with_unit_policy(
        mut self,
        name: &str,
        unit: &str,
        quota: u64,
        window_s: u64,
        remaining: u64,
        reset_in: Nanos,
    ) -> Self {
        let unit = unit.trim().to_ascii_lowercase();
        self.policies.push(PolicyObservation {
            name: name.to_string(),
            quota: Some(quota),
            window_s: Some(window_s),
            remaining: Some(remaining),
            reset_in: Some(reset_in),
            counts_requests: unit == crate::cost::REQUESTS || unit.is_empty(),
            per_endpoint: false,
            unit,
        });
        self
    }

    /// Whether the response published any usable policy: one the client
    /// mirrors, with a count of what is left.
    pub fn has_limits(&self) -> bool {
        self.policies
            .iter()
            .any(|p| p.is_mirrored() && p.remaining.is_some())
    }
}

/// Scope values that mean "the whole account", not one endpoint.
const ACCOUNT_SCOPES: &[&str] = &[
    "user",
    "global",
    "shared",
    "account",
    "ip",
    "key",
    "organization",
    "resource",
];

/// Scope values that say outright that the limit is kept per endpoint.
const ENDPOINT_SCOPES: &[&str] = &["endpoint", "route", "path", "per-endpoint", "method"];

/// The names the generic header families give their policies: Zendesk's
/// account-wide limit arrives under these, its endpoint limits under their
/// own names.
const FAMILY_NAMES: &[&str] = &["ratelimit", "x-ratelimit", "x-rate-limit"];

/// Whether a published policy is kept per endpoint (URL path) rather than
/// for the whole account. Only scopes that genuinely are per route count:
/// an explicit endpoint scope, a Discord bucket (`X-RateLimit-Bucket`, one
/// per route), a Zendesk endpoint limit (`Zendesk-RateLimit-<endpoint>`).
/// Everything else, GitHub resources (`core`, `search`, `graphql`…) and
/// Azure resources included, is one counter for the whole host.
fn is_per_endpoint(p: &PolicyView, dialects: &[String]) -> bool {
    let has = |d: &str| dialects.iter().any(|x| x == d);
    match p.scope.as_deref() {
        Some(s) if ENDPOINT_SCOPES.iter().any(|e| e.eq_ignore_ascii_case(s)) => true,
        Some(s) if ACCOUNT_SCOPES.iter().any(|a| a.eq_ignore_ascii_case(s)) => false,
        // a bucket hash: GitHub and Azure name account-wide resources
        Some(_) => has("discord") && !has("github") && !has("azure"),
        None => {
            has("zendesk")
                && !p.name.is_empty()
                && !FAMILY_NAMES.iter().any(|f| f.eq_ignore_ascii_case(&p.name))
        }
    }
}

impl PolicyObservation {
    /// From a parsed policy, without knowing the dialect it came in: only
    /// a scope that names an endpoint outright makes it per endpoint.
    pub fn from_view(p: &PolicyView) -> Self {
        PolicyObservation::build(p.name.clone(), p, &[])
    }

    /// From a parsed policy of a response that spoke `dialects` (see
    /// [`ResponseView::dialects`]), which tell per-route buckets from
    /// account-wide resources.
    pub fn from_view_in(p: &PolicyView, dialects: &[String]) -> Self {
        PolicyObservation::build(p.name.clone(), p, dialects)
    }

    fn build(name: String, p: &PolicyView, dialects: &[String]) -> Self {
        let unit = unit_of(p, dialects);
        PolicyObservation {
            per_endpoint: is_per_endpoint(p, dialects),
            name,
            quota: p.quota,
            window_s: p.window_s.or_else(|| documented_window(p, &unit, dialects)),
            remaining: p.remaining,
            reset_in: p.reset_in,
            counts_requests: unit == crate::cost::REQUESTS,
            unit,
        }
    }
}

/// The client's name for what a parsed policy counts: the parser's unit,
/// except GitHub's GraphQL resource, which counts points (a query costs
/// one or more), not requests.
fn unit_of(p: &PolicyView, dialects: &[String]) -> String {
    let github = dialects.iter().any(|d| d == "github");
    if github && p.scope.as_deref() == Some("graphql") {
        return "points".to_string();
    }
    crate::cost::unit_name(&p.unit)
}

/// The window of a policy that publishes none, when its provider
/// documents one: OpenAI's and Anthropic's request and token limits are
/// per minute, replenished continuously (their reset fields give the time
/// to a full restore, not the window). Known, the window lets the mirror
/// refill as the server does instead of waiting for each full restore.
/// Other providers share OpenAI's header names (Linear's hourly
/// `x-ratelimit-requests-*`), so a reset further off than a minute, which
/// no per-minute window can need, keeps the window unknown.
fn documented_window(p: &PolicyView, unit: &str, dialects: &[String]) -> Option<u64> {
    let per_minute = dialects.iter().any(|d| d == "openai" || d == "anthropic");
    let fits = p.reset_in.is_none_or(|t| t <= Nanos::from_secs(60));
    (per_minute && fits && matches!(unit, "requests" | "tokens")).then_some(60)
}

impl PolicyObservation {
    /// A copy without the name, for a caller that took it.
    fn renamed(self, name: String) -> Self {
        PolicyObservation { name, ..self }
    }
}

impl Observation {
    /// From a response parsed by `paceline-wire`.
    pub fn from_view(v: &ResponseView) -> Self {
        let kind = match v.outcome {
            OutcomeKind::Success => ResponseKind::Success,
            OutcomeKind::RateLimited => ResponseKind::RateLimited,
            OutcomeKind::QuotaExhausted => ResponseKind::QuotaExhausted,
            OutcomeKind::Overloaded => ResponseKind::Overloaded,
            OutcomeKind::Error if v.status == 409 && v.retry_after.is_some() => {
                ResponseKind::InFlight
            }
            // a verdict this SDK does not know is not retried blindly
            _ => ResponseKind::Error,
        };
        let limit = v.problem.as_ref().and_then(|p| {
            p.limit
                .clone()
                .or_else(|| p.violated_policies.first().cloned())
        });
        let limit = limit.or_else(|| {
            (kind == ResponseKind::QuotaExhausted)
                .then(|| {
                    v.policies
                        .iter()
                        .filter(|p| p.is_exhausted())
                        .max_by_key(|p| p.reset_in)
                        .map(|p| p.name.clone())
                })
                .flatten()
        });
        Observation {
            status: v.status,
            kind,
            retry_after: v.retry_after,
            should_retry: v.should_retry,
            policies: v
                .policies
                .iter()
                .map(|p| PolicyObservation::from_view_in(p, &v.dialects))
                .collect(),
            limit,
            headers: Vec::new(),
        }
    }

    /// From a parsed response, taken by value (no copies of the names).
    pub fn from_view_owned(mut v: ResponseView) -> Self {
        let policies = std::mem::take(&mut v.policies);
        let mut obs = Observation::from_view(&v);
        obs.policies = policies
            .into_iter()
            .map(|mut p| {
                let built = PolicyObservation::build(String::new(), &p, &v.dialects);
                built.renamed(std::mem::take(&mut p.name))
            })
            .collect();
        if obs.kind == ResponseKind::QuotaExhausted && obs.limit.is_none() {
            obs.limit = obs
                .policies
                .iter()
                .filter(|p| p.remaining == Some(0))
                .max_by_key(|p| p.reset_in)
                .map(|p| p.name.clone());
        }
        obs
    }

    /// Parses a response (status, headers, optional body) received at `now`.
    /// The headers of a 429 are kept for diagnostics.
    pub fn parse(status: u16, headers: &HeaderMap, body: Option<&[u8]>, now: Nanos) -> Self {
        let view = paceline_wire::parse_response(status, headers, body, now);
        let mut obs = Observation::from_view_owned(view);
        if obs.retry_after.is_none() {
            obs.retry_after = absurd_retry_after(headers);
        }
        if status == 429 {
            obs.headers = headers
                .iter()
                .map(|(k, v)| {
                    (
                        k.as_str().to_string(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect();
        }
        obs
    }
}

/// A `Retry-After` of plain digits too large for the parser to take at face
/// value (years): kept as a wait, so that the client refuses to sleep it
/// and reports the instant instead of retrying at once.
fn absurd_retry_after(headers: &HeaderMap) -> Option<Nanos> {
    let v = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if v.is_empty() || v.len() > 20 || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let secs: u64 = v.parse().unwrap_or(u64::MAX);
    (secs > paceline_wire::parse::time::MAX_DELAY_SECS).then(|| Nanos::from_secs(secs))
}
