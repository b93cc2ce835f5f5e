//! The responses the layer writes itself: rejections and the usage document.

use bytes::Bytes;
use http::header::{
    HeaderValue, CACHE_CONTROL, CONNECTION, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE,
};
use http::{HeaderMap, Response, StatusCode};
use paceline_core::{Decision, Nanos, Plan, PolicyKind};
use paceline_wire::emit::{self, Dialects};
use paceline_wire::problem::{Problem, ProblemKind, PROBLEM_CONTENT_TYPE};
use serde::Serialize;

use crate::time::rfc3339;

const NO_STORE: HeaderValue = HeaderValue::from_static("no-store");

/// Writes the rate-limit fields of `d`: every chosen dialect when the
/// identity publishes counters, else only `Retry-After` on a denial.
pub(crate) fn write_fields(
    plan: &Plan,
    d: &Decision,
    dialects: &Dialects,
    publish: bool,
    h: &mut HeaderMap,
) {
    if publish {
        emit::write_headers(plan, d, dialects, h);
    } else if let Some(s) = emit::retry_after_secs(d) {
        h.insert(RETRY_AFTER, HeaderValue::from(s));
    }
}

fn problem_response(p: &Problem, close: bool) -> Response<Bytes> {
    let mut r = Response::new(Bytes::from(p.to_json()));
    *r.status_mut() = StatusCode::from_u16(p.status).unwrap_or(StatusCode::TOO_MANY_REQUESTS);
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_CONTENT_TYPE));
    h.insert(CACHE_CONTROL, NO_STORE);
    if close {
        // the request body was never read: do not reuse the connection
        h.insert(CONNECTION, HeaderValue::from_static("close"));
    }
    r
}

/// The response for a rejected decision (429 or 400).
pub(crate) fn rejection(
    plan: &Plan,
    d: &Decision,
    dialects: &Dialects,
    publish: bool,
    base: &str,
    close: bool,
) -> Response<Bytes> {
    let mut p = Problem::from_decision(plan, d, base)
        .unwrap_or_else(|| Problem::new(ProblemKind::RateLimited, base, "Too many requests."));
    if !publish {
        // anonymous limits tell no numbers that would help pace an attack
        p.detail = "Too many requests from this client; retry later.".to_string();
    }
    let mut r = problem_response(&p, close);
    write_fields(plan, d, dialects, publish, r.headers_mut());
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
    let mut r = problem_response(&p, close);
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
pub(crate) fn usage(plan: &Plan, d: &Decision, now: Nanos, dialects: &Dialects) -> Response<Bytes> {
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
    write_fields(plan, d, dialects, true, h);
    r
}
