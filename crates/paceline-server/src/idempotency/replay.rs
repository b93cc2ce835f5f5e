//! The answers the idempotency layer writes itself: a replay of a stored
//! answer, and its problems (through the one problem vocabulary of
//! `paceline-wire`).

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Response, StatusCode};
use paceline_wire::problem::{self, Problem, ProblemKind};

use super::store::StoredAnswer;
use super::IdempotencySettings;

/// The field marking a replayed answer (`Idempotent-Replayed: true`, as
/// Stripe and the demo API write it).
pub const REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

const TRUE: HeaderValue = HeaderValue::from_static("true");

/// Marks, in a response's extensions, an answer the idempotency layer
/// wrote itself, the request going no further: a replay of a stored
/// answer, or a refusal of the request's key or body (a missing or
/// invalid key, a conflict, a duplicate in flight, a body too large, a
/// store that failed). A stage in front of the layer that charged the
/// request for what reaches the service behind (the gateway's global
/// plan) gives that charge back. (The `Idempotent-Replayed` field cannot
/// tell it: the service behind may send it too.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AnsweredHere;

/// `r` marked as answered by the layer itself.
pub(crate) fn here<B>(mut r: Response<B>) -> Response<B> {
    r.extensions_mut().insert(AnsweredHere);
    r
}

/// The stored answer again, marked as a replay.
pub(crate) fn replay(a: &StoredAnswer) -> Response<Bytes> {
    let mut r = Response::new(a.body.clone().unwrap_or_default());
    *r.status_mut() = a.status;
    *r.headers_mut() = a.headers.clone();
    r.headers_mut().insert(REPLAYED, TRUE);
    r
}

/// The fields of an answer worth keeping: all but the ones about the
/// connection it came on.
pub(crate) fn kept_fields(h: &HeaderMap) -> HeaderMap {
    use http::header::{CONNECTION, TE, TRAILER, TRANSFER_ENCODING, UPGRADE};
    let mut out = HeaderMap::with_capacity(h.len());
    for (k, v) in h {
        let hop = [CONNECTION, TE, TRAILER, TRANSFER_ENCODING, UPGRADE].contains(k)
            || k.as_str() == "keep-alive"
            || k.as_str().starts_with("proxy-");
        if !hop {
            out.append(k.clone(), v.clone());
        }
    }
    out
}

/// A problem answer of `kind` under `base`.
pub(crate) fn problem(base: &str, kind: ProblemKind, detail: &str) -> Response<Bytes> {
    problem::answer(&Problem::new(kind, base, detail))
}

/// `409 idempotency_conflict` (or the configured status).
pub(crate) fn conflict(s: &IdempotencySettings, base: &str, detail: &str) -> Response<Bytes> {
    let mut p = Problem::new(ProblemKind::IdempotencyConflict, base, detail);
    p.status = s.conflict_status;
    let mut r = problem::answer(&p);
    *r.status_mut() = StatusCode::from_u16(s.conflict_status).unwrap_or(StatusCode::CONFLICT);
    r
}

/// `409 idempotency_in_flight` with `Retry-After`.
pub(crate) fn in_flight(s: &IdempotencySettings, base: &str) -> Response<Bytes> {
    let mut p = Problem::new(
        ProblemKind::IdempotencyInFlight,
        base,
        "A request with this Idempotency-Key is still in progress; retry after Retry-After.",
    );
    p.retry_after_s = Some(s.in_flight_retry_after.as_secs_f64().ceil().max(1.0) as u64);
    problem::answer(&p)
}

/// The detail of a conflict with a request that ran.
pub(crate) const DIFFERENT: &str =
    "This Idempotency-Key was used with a different request (method, target or body).";
/// The detail for a key whose answer was too large to keep.
pub(crate) const NOT_KEPT: &str =
    "This Idempotency-Key was used; its answer was too large to keep, so it cannot be replayed.";
