//! The responses the layer writes itself besides a decision's (which
//! `paceline_wire::emit::PreparedPlan` writes): the usage document and the
//! answers that name no policy.

use bytes::Bytes;
use http::header::{HeaderValue, CACHE_CONTROL, CONNECTION, CONTENT_TYPE, WWW_AUTHENTICATE};
use http::Response;
use paceline_core::{Decision, Nanos, Plan};
use paceline_wire::emit::{Dialects, PreparedPlan};
use paceline_wire::problem::{self, Problem, ProblemKind};
use paceline_wire::usage::Usage;

use crate::identity::{KeySource, Stranger};

/// Marks a response that answers a request whose body was never read: the
/// connection is not reused.
pub(crate) fn close_connection<B>(r: &mut Response<B>) {
    r.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
}

/// 503 when the store is down and a policy fails closed.
pub(crate) fn unavailable(base: &str) -> Response<Bytes> {
    let mut p = Problem::new(
        ProblemKind::Overloaded,
        base,
        "The rate limiter cannot reach its store; retry shortly.",
    );
    p.retry_after_s = Some(1);
    problem::answer(&p)
}

/// 503 for a request whose key could not be looked up (the gateway's
/// Redis key map did not answer in time, and nothing cached tells).
pub(crate) fn keys_unavailable(base: &str) -> Response<Bytes> {
    let mut p = Problem::new(
        ProblemKind::Overloaded,
        base,
        "The key of this request cannot be looked up now; retry shortly.",
    );
    p.retry_after_s = Some(1);
    problem::answer(&p)
}

/// 401 for a request without a known key, where the configuration gives
/// it no plan (and from the usage endpoint for any such request): `no key`
/// and `unknown key` are told apart by type and detail, and the detail
/// says where the key goes. A bearer token that does not verify is told
/// why (the same reason in `WWW-Authenticate`'s `error_description`).
pub(crate) fn unauthorized(base: &str, why: Stranger, source: &KeySource) -> Response<Bytes> {
    let send = match source {
        KeySource::Header(name) => format!("in the {name} header"),
        KeySource::ClientIp => "from a configured client address".to_string(),
        KeySource::Route => "on a configured route".to_string(),
        KeySource::ClientCert => "as the subject of a TLS client certificate".to_string(),
        KeySource::Jwt => "as Authorization: Bearer <JWT>".to_string(),
        KeySource::ConsumerHeader => {
            "through the authentication layer in front of this service".to_string()
        }
        _ => "as Authorization: Bearer <key>".to_string(),
    };
    let (what, one) = match source {
        KeySource::Jwt => ("bearer token", "token"),
        KeySource::ConsumerHeader => ("authenticated caller", "caller"),
        _ => ("API key", "key"),
    };
    let (kind, detail, challenge) = match why {
        Stranger::Missing => (
            ProblemKind::Unauthorized,
            format!("This request sends no {what}; send yours {send}."),
            HeaderValue::from_static("Bearer"),
        ),
        Stranger::Unknown => (
            ProblemKind::UnknownKey,
            format!("The {what} this request sends is not known here; send a valid {one} {send}."),
            HeaderValue::from_static("Bearer error=\"invalid_token\""),
        ),
        Stranger::Unreadable => (
            ProblemKind::UnknownKey,
            format!("The credential this request sends cannot be read as one {what}; send your {one} {send}."),
            HeaderValue::from_static("Bearer error=\"invalid_request\""),
        ),
        Stranger::BadToken(e) => (
            ProblemKind::UnknownKey,
            format!("The bearer token this request sends is not accepted: {e}; send a valid {one} {send}."),
            HeaderValue::from_str(&format!(
                "Bearer error=\"invalid_token\", error_description=\"{e}\""
            ))
            .unwrap_or(HeaderValue::from_static("Bearer error=\"invalid_token\"")),
        ),
        Stranger::Unavailable => return keys_unavailable(base),
    };
    let mut r = problem::answer(&Problem::new(kind, base, detail));
    if matches!(source, KeySource::ApiKey | KeySource::Jwt) {
        r.headers_mut().insert(WWW_AUTHENTICATE, challenge);
    }
    r
}

/// 411: the plan counts content bytes, and this body's length is unknown
/// until it has been read (a chunked upload); decided from the head, so it
/// is refused rather than let through uncounted.
pub(crate) fn length_required(base: &str) -> Response<Bytes> {
    problem::answer(&Problem::new(
        ProblemKind::LengthRequired,
        base,
        "This plan counts request bytes: send the body with a Content-Length.",
    ))
}

/// The usage document: plan, limits, what is left and, for quotas, when
/// they reset.
pub(crate) fn usage(
    plan: &Plan,
    meta: &PreparedPlan,
    d: &Decision,
    now: Nanos,
    dialects: &Dialects,
) -> Response<Bytes> {
    let doc = Usage::from_decision(plan, d, now);
    let mut r = Response::new(Bytes::from(doc.to_vec()));
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    meta.write_fields(plan, d, dialects, true, h);
    r
}
