//! The responses the layer writes itself: rejections and the usage document.

use std::fmt::Write as _;

use bytes::Bytes;
use http::header::{
    HeaderName, HeaderValue, CACHE_CONTROL, CONNECTION, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE,
};
use http::{HeaderMap, Response, StatusCode};
use paceline_core::{Decision, Denial, Nanos, Outcome, Plan, PolicyKind, PolicyStatus};
use paceline_wire::emit::{self, Dialects};
use paceline_wire::problem::{Problem, ProblemKind, PROBLEM_CONTENT_TYPE};
use serde::Serialize;

use crate::time::rfc3339;

const NO_STORE: HeaderValue = HeaderValue::from_static("no-store");

const RATELIMIT_POLICY: HeaderName = HeaderName::from_static(emit::RATELIMIT_POLICY);
const RATELIMIT: HeaderName = HeaderName::from_static(emit::RATELIMIT);
const ANONYMOUS_DETAIL: &str = "Too many requests from this client; retry later.";

/// What never changes for a plan, prepared once so a rejection costs a few
/// string copies: the `RateLimit-Policy` value and, per policy, the
/// problem body up to its per-request members.
#[derive(Debug)]
pub(crate) struct PlanMeta {
    policy_field: Option<HeaderValue>,
    /// Per policy: [published, anonymous] problem JSON without its closing
    /// brace, `retry_after_s` and `violated-policies`.
    problems: Vec<[String; 2]>,
}

impl PlanMeta {
    pub(crate) fn new(plan: &Plan, base: &str) -> PlanMeta {
        let policy_field = HeaderValue::try_from(emit::policy_field(plan)).ok();
        let problems = (0..plan.policies().len())
            .map(|i| {
                let mut d = Decision {
                    outcome: Outcome::Denied(Denial {
                        policy: i,
                        kind: plan.policy(i).kind(),
                        retry_after: Nanos::SECOND,
                    }),
                    statuses: Default::default(),
                };
                for j in 0..plan.policies().len() {
                    d.statuses.push(PolicyStatus {
                        remaining: 0,
                        reset_after: Nanos::ZERO,
                        would_deny: i == j,
                    });
                }
                let mut p = Problem::from_decision(plan, &d, base)
                    .unwrap_or_else(|| Problem::new(ProblemKind::RateLimited, base, ""));
                p.retry_after_s = None;
                p.violated_policies.clear();
                let published = open_json(p.to_json());
                p.detail = ANONYMOUS_DETAIL.to_string();
                [published, open_json(p.to_json())]
            })
            .collect();
        PlanMeta {
            policy_field,
            problems,
        }
    }
}

fn open_json(mut s: String) -> String {
    if s.ends_with('}') {
        s.pop();
    }
    s
}

/// Writes the rate-limit fields of `d`: every chosen dialect when the
/// identity publishes counters, else only `Retry-After` on a denial.
pub(crate) fn write_fields(
    plan: &Plan,
    meta: &PlanMeta,
    d: &Decision,
    dialects: &Dialects,
    publish: bool,
    h: &mut HeaderMap,
) {
    if !publish {
        if let Some(s) = emit::retry_after_secs(d) {
            h.insert(RETRY_AFTER, HeaderValue::from(s));
        }
        return;
    }
    if dialects.ietf {
        if let Some(v) = &meta.policy_field {
            h.insert(RATELIMIT_POLICY, v.clone());
        }
        if let Ok(v) = HeaderValue::try_from(ratelimit_field(plan, d)) {
            h.insert(RATELIMIT, v);
        }
    }
    // the older dialects, and Retry-After with no-store on a denial
    let rest = Dialects {
        ietf: false,
        ..*dialects
    };
    emit::write_headers(plan, d, &rest, h);
}

/// The IETF `RateLimit` field, as `paceline_wire::emit::ratelimit_field`
/// writes it, without a general serializer: policy names are token-safe
/// (core validates them), so the items need no escaping.
fn ratelimit_field(plan: &Plan, d: &Decision) -> String {
    let mut out = String::with_capacity(32 * d.statuses.len());
    for (i, (p, s)) in plan.policies().iter().zip(&d.statuses).enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push('"');
        out.push_str(p.name());
        out.push_str("\";r=");
        push_int(&mut out, s.remaining);
        out.push_str(";t=");
        push_int(&mut out, s.reset_secs());
    }
    out
}

/// Appends a structured-field integer (at most 15 digits, clamped).
fn push_int(out: &mut String, n: u64) {
    let mut n = n.min(999_999_999_999_999);
    let mut digits = [0u8; 15];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.push_str(std::str::from_utf8(&digits[i..]).unwrap_or("0"));
}

fn problem_response(json: String, status: u16, close: bool) -> Response<Bytes> {
    let mut r = Response::new(Bytes::from(json));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::TOO_MANY_REQUESTS);
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_CONTENT_TYPE));
    h.insert(CACHE_CONTROL, NO_STORE);
    if close {
        // the request body was never read: do not reuse the connection
        h.insert(CONNECTION, HeaderValue::from_static("close"));
    }
    r
}

/// The problem body of a denial, from the prepared prefix.
fn denial_json(plan: &Plan, meta: &PlanMeta, d: &Decision, den: &Denial, publish: bool) -> String {
    let prefix = &meta.problems[den.policy][usize::from(!publish)];
    let mut body = String::with_capacity(prefix.len() + 64);
    body.push_str(prefix);
    body.push_str(",\"retry_after_s\":");
    push_int(&mut body, den.retry_after_secs());
    body.push_str(",\"violated-policies\":[\"");
    // policy names are token-safe: no escaping needed
    body.push_str(plan.policy(den.policy).name());
    body.push('"');
    for (i, s) in d.statuses.iter().enumerate() {
        let p = plan.policy(i);
        if i != den.policy && s.would_deny && !p.is_shadow() {
            let _ = write!(body, ",\"{}\"", p.name());
        }
    }
    body.push_str("]}");
    body
}

/// The response for a rejected decision (429 or 400).
pub(crate) fn rejection(
    plan: &Plan,
    meta: &PlanMeta,
    d: &Decision,
    dialects: &Dialects,
    publish: bool,
    base: &str,
    close: bool,
) -> Response<Bytes> {
    let (json, status) = match &d.outcome {
        Outcome::Denied(den) => (denial_json(plan, meta, d, den, publish), 429),
        _ => {
            let mut p = Problem::from_decision(plan, d, base).unwrap_or_else(|| {
                Problem::new(ProblemKind::RateLimited, base, "Too many requests.")
            });
            if !publish {
                p.detail = ANONYMOUS_DETAIL.to_string();
            }
            (p.to_json(), p.status)
        }
    };
    let mut r = problem_response(json, status, close);
    write_fields(plan, meta, d, dialects, publish, r.headers_mut());
    r
}

/// 503 when the store is down and a policy fails closed.
pub(crate) fn unavailable(base: &str, close: bool) -> Response<Bytes> {
    let mut p = Problem::new(
        ProblemKind::Overloaded,
        base,
        "The rate limiter cannot reach its store; retry shortly.",
    );
    p.retry_after_s = Some(1);
    let mut r = problem_response(p.to_json(), p.status, close);
    r.headers_mut().insert(RETRY_AFTER, HeaderValue::from(1u64));
    r
}

/// 401 from the usage endpoint for a request without a known key.
pub(crate) fn unauthorized(base: &str) -> Response<Bytes> {
    #[derive(Serialize)]
    struct Body<'a> {
        #[serde(rename = "type")]
        type_uri: String,
        title: &'a str,
        status: u16,
        detail: &'a str,
    }
    let body = Body {
        type_uri: format!("{base}unauthorized"),
        title: "API key required",
        status: 401,
        detail: "Send your API key as Authorization: Bearer <key> to read its usage.",
    };
    let mut r = Response::new(Bytes::from(serde_json::to_vec(&body).unwrap_or_default()));
    *r.status_mut() = StatusCode::UNAUTHORIZED;
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_CONTENT_TYPE));
    h.insert(CACHE_CONTROL, NO_STORE);
    h.insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    r
}

#[derive(Serialize)]
struct Usage<'a> {
    plan: &'a str,
    limits: Vec<UsageLimit<'a>>,
}

#[derive(Serialize)]
struct UsageLimit<'a> {
    name: &'a str,
    q: u64,
    w: u64,
    r: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    reset_at: Option<String>,
}

/// The usage document: plan, limits, what is left and, for quotas, when
/// they reset.
pub(crate) fn usage(
    plan: &Plan,
    meta: &PlanMeta,
    d: &Decision,
    now: Nanos,
    dialects: &Dialects,
) -> Response<Bytes> {
    let limits = plan
        .policies()
        .iter()
        .zip(&d.statuses)
        .map(|(p, s)| UsageLimit {
            name: p.name(),
            q: p.quota(),
            w: p.window_s(),
            r: s.remaining,
            reset_at: (p.kind() == PolicyKind::Quota)
                .then(|| rfc3339(now.saturating_add(s.reset_after))),
        })
        .collect();
    let doc = Usage {
        plan: plan.name(),
        limits,
    };
    let mut r = Response::new(Bytes::from(serde_json::to_vec(&doc).unwrap_or_default()));
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert(CACHE_CONTROL, NO_STORE);
    write_fields(plan, meta, d, dialects, true, h);
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use paceline_core::{MemoryStore, Policy};
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn ratelimit_field_matches_the_wire_crate(
            items in prop::collection::vec((any::<u64>(), any::<u64>()), 1..5),
        ) {
            let policies = (0..items.len())
                .map(|i| Policy::token_bucket(&format!("p-{i}.x_y"), 10, 1).unwrap())
                .collect();
            let plan = Plan::new("p", policies).unwrap();
            let mut d = Decision { outcome: Outcome::Allowed, statuses: Default::default() };
            for (r, t) in items {
                d.statuses.push(PolicyStatus { remaining: r, reset_after: Nanos::new(t), would_deny: false });
            }
            prop_assert_eq!(ratelimit_field(&plan, &d), emit::ratelimit_field(&plan, &d));
        }
    }

    #[test]
    fn prepared_problem_matches_the_wire_problem() {
        let plan = Plan::new(
            "free",
            vec![
                Policy::token_bucket("burst", 20, 2).unwrap(),
                Policy::daily("daily", 5).unwrap(),
            ],
        )
        .unwrap();
        let meta = PlanMeta::new(&plan, "https://errors.invalid/");
        let store = MemoryStore::new();
        let now = Nanos::from_secs(1_790_793_600);
        for _ in 0..5 {
            store.check_sync(&plan, "k", 1, now).unwrap();
        }
        for _ in 0..20 {
            let d = store.check_sync(&plan, "k", 1, now).unwrap();
            let den = d.denial().unwrap();
            let ours = denial_json(&plan, &meta, &d, den, true);
            let theirs = Problem::from_decision(&plan, &d, "https://errors.invalid/")
                .unwrap()
                .to_json();
            let a: serde_json::Value = serde_json::from_str(&ours).unwrap();
            let b: serde_json::Value = serde_json::from_str(&theirs).unwrap();
            assert_eq!(a, b);
            assert_eq!(a["retry_after_s"], 19_200);
        }
    }
}
