//! The kinds of problem the project answers with: status, stable code and
//! title of each, in one table.
//!
//! Why a table: the server layer, the gateway, its load shedder and the
//! demo upstream all answer with problem bodies; a kind named here is
//! written the same way by each of them, and a client can match its code.

use serde::Serialize;

/// Every answer with a problem body the project sends, by its stable code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ProblemKind {
    /// 429: a short-window policy is empty; retry after `Retry-After`.
    RateLimited,
    /// 429: a long-window quota is used up; do not retry before the reset.
    QuotaExhausted,
    /// 503: the load shedder refused the request; retry with jitter.
    Overloaded,
    /// 400: the request costs more than a policy can ever hold.
    CostExceedsBurst,
    /// 409: the same `Idempotency-Key` came with a different body.
    IdempotencyConflict,
    /// 400: the route requires an `Idempotency-Key` and none was sent.
    IdempotencyKeyMissing,
    /// 409: a request with the same `Idempotency-Key` is still in flight;
    /// retry after `Retry-After` (waiting can succeed).
    IdempotencyInFlight,
    /// 400: the `Idempotency-Key` is not a key: not a structured-field
    /// string or a bare printable value, too long, or sent twice.
    IdempotencyKeyInvalid,
    /// 401: the request carries no key, where the configuration gives a
    /// request without one no plan.
    Unauthorized,
    /// 401: the request carries a key the configuration does not know, and
    /// gives unknown keys no plan.
    UnknownKey,
    /// 400: the request carries more than one credential (two
    /// `Authorization` fields, or the key header twice): which one counts
    /// is not guessed.
    DuplicateCredentials,
    /// 404: nothing is there.
    NotFound,
    /// 405: the method is not served (the gateway does not tunnel
    /// `CONNECT`).
    MethodNotAllowed,
    /// 400: the request could not be read.
    BadRequest,
    /// 408: the request body stalled.
    RequestTimeout,
    /// 411: the body's length must be known before it is read.
    LengthRequired,
    /// 413: the request body is larger than allowed.
    PayloadTooLarge,
    /// 414: the request target is longer than allowed.
    UriTooLong,
    /// 431: the request head is longer than allowed.
    HeadTooLarge,
    /// 501: the request uses a transfer coding that is not supported (only
    /// `chunked` is).
    NotImplemented,
    /// 502: the upstream could not be reached or failed.
    BadGateway,
    /// 504: the upstream did not answer in time.
    GatewayTimeout,
}

impl ProblemKind {
    /// Every kind, in a fixed order.
    pub const ALL: [ProblemKind; 22] = [
        ProblemKind::RateLimited,
        ProblemKind::QuotaExhausted,
        ProblemKind::Overloaded,
        ProblemKind::CostExceedsBurst,
        ProblemKind::IdempotencyConflict,
        ProblemKind::IdempotencyKeyMissing,
        ProblemKind::IdempotencyInFlight,
        ProblemKind::IdempotencyKeyInvalid,
        ProblemKind::Unauthorized,
        ProblemKind::UnknownKey,
        ProblemKind::DuplicateCredentials,
        ProblemKind::NotFound,
        ProblemKind::MethodNotAllowed,
        ProblemKind::BadRequest,
        ProblemKind::RequestTimeout,
        ProblemKind::LengthRequired,
        ProblemKind::PayloadTooLarge,
        ProblemKind::UriTooLong,
        ProblemKind::HeadTooLarge,
        ProblemKind::NotImplemented,
        ProblemKind::BadGateway,
        ProblemKind::GatewayTimeout,
    ];

    /// The HTTP status code.
    pub fn status(&self) -> u16 {
        match self {
            ProblemKind::RateLimited | ProblemKind::QuotaExhausted => 429,
            ProblemKind::Overloaded => 503,
            ProblemKind::CostExceedsBurst
            | ProblemKind::IdempotencyKeyMissing
            | ProblemKind::IdempotencyKeyInvalid
            | ProblemKind::BadRequest
            | ProblemKind::DuplicateCredentials => 400,
            ProblemKind::IdempotencyConflict | ProblemKind::IdempotencyInFlight => 409,
            ProblemKind::Unauthorized | ProblemKind::UnknownKey => 401,
            ProblemKind::NotFound => 404,
            ProblemKind::MethodNotAllowed => 405,
            ProblemKind::RequestTimeout => 408,
            ProblemKind::LengthRequired => 411,
            ProblemKind::PayloadTooLarge => 413,
            ProblemKind::UriTooLong => 414,
            ProblemKind::HeadTooLarge => 431,
            ProblemKind::NotImplemented => 501,
            ProblemKind::BadGateway => 502,
            ProblemKind::GatewayTimeout => 504,
        }
    }

    /// The stable code the problem `type` ends in.
    pub fn code(&self) -> &'static str {
        match self {
            ProblemKind::RateLimited => "rate_limited",
            ProblemKind::QuotaExhausted => "quota_exhausted",
            ProblemKind::Overloaded => "overloaded",
            ProblemKind::CostExceedsBurst => "cost_exceeds_burst",
            ProblemKind::IdempotencyConflict => "idempotency_conflict",
            ProblemKind::IdempotencyKeyMissing => "idempotency_key_missing",
            ProblemKind::IdempotencyInFlight => "idempotency_in_flight",
            ProblemKind::IdempotencyKeyInvalid => "idempotency_key_invalid",
            ProblemKind::Unauthorized => "unauthorized",
            ProblemKind::UnknownKey => "unknown_key",
            ProblemKind::DuplicateCredentials => "duplicate_credentials",
            ProblemKind::NotFound => "not_found",
            ProblemKind::MethodNotAllowed => "method_not_allowed",
            ProblemKind::BadRequest => "bad_request",
            ProblemKind::RequestTimeout => "request_timeout",
            ProblemKind::LengthRequired => "length_required",
            ProblemKind::PayloadTooLarge => "payload_too_large",
            ProblemKind::UriTooLong => "uri_too_long",
            ProblemKind::HeadTooLarge => "head_too_large",
            ProblemKind::NotImplemented => "not_implemented",
            ProblemKind::BadGateway => "bad_gateway",
            ProblemKind::GatewayTimeout => "gateway_timeout",
        }
    }

    /// The kind whose code is `code`.
    pub fn from_code(code: &str) -> Option<ProblemKind> {
        ProblemKind::ALL.into_iter().find(|k| k.code() == code)
    }

    /// A short human summary.
    pub fn title(&self) -> &'static str {
        match self {
            ProblemKind::RateLimited => "Too many requests",
            ProblemKind::QuotaExhausted => "Quota used up",
            ProblemKind::Overloaded => "Service overloaded",
            ProblemKind::CostExceedsBurst => "Request costs more than the limit allows",
            ProblemKind::IdempotencyConflict => "Idempotency key reused with a different request",
            ProblemKind::IdempotencyKeyMissing => "Idempotency key required",
            ProblemKind::IdempotencyInFlight => "Request with this idempotency key in progress",
            ProblemKind::IdempotencyKeyInvalid => "Idempotency key not valid",
            ProblemKind::Unauthorized => "API key required",
            ProblemKind::UnknownKey => "Unknown API key",
            ProblemKind::DuplicateCredentials => "More than one credential",
            ProblemKind::NotFound => "Not Found",
            ProblemKind::MethodNotAllowed => "Method Not Allowed",
            ProblemKind::BadRequest => "Bad Request",
            ProblemKind::RequestTimeout => "Request Timeout",
            ProblemKind::LengthRequired => "Content-Length required",
            ProblemKind::PayloadTooLarge => "Payload Too Large",
            ProblemKind::UriTooLong => "URI Too Long",
            ProblemKind::HeadTooLarge => "Request Header Fields Too Large",
            ProblemKind::NotImplemented => "Not Implemented",
            ProblemKind::BadGateway => "Bad Gateway",
            ProblemKind::GatewayTimeout => "Gateway Timeout",
        }
    }

    /// Whether a client should retry this rejection by itself (a request
    /// still in flight under the same idempotency key: after its
    /// `Retry-After`; a conflict never).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            ProblemKind::RateLimited | ProblemKind::Overloaded | ProblemKind::IdempotencyInFlight
        )
    }

    /// Whether the body names policies: `limit` and `violated-policies` are
    /// written (possibly `null` and empty) for the rate-limiting answers
    /// and left out of the others.
    pub(crate) fn names_policies(&self) -> bool {
        matches!(
            self,
            ProblemKind::RateLimited
                | ProblemKind::QuotaExhausted
                | ProblemKind::Overloaded
                | ProblemKind::CostExceedsBurst
                | ProblemKind::IdempotencyConflict
                | ProblemKind::IdempotencyKeyMissing
                | ProblemKind::IdempotencyInFlight
                | ProblemKind::IdempotencyKeyInvalid
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_statuses() {
        for k in ProblemKind::ALL {
            assert_eq!(ProblemKind::from_code(k.code()), Some(k));
        }
        let policy_kinds = ProblemKind::ALL.into_iter().filter(|k| k.names_policies());
        for k in policy_kinds {
            assert!([400, 409, 429, 503].contains(&k.status()));
        }
    }

    #[test]
    fn the_gateway_statuses_keep_their_reason_phrases() {
        for k in ProblemKind::ALL.into_iter().filter(|k| !k.names_policies()) {
            let status = http::StatusCode::from_u16(k.status()).unwrap();
            if !matches!(
                k,
                ProblemKind::Unauthorized
                    | ProblemKind::UnknownKey
                    | ProblemKind::LengthRequired
                    | ProblemKind::DuplicateCredentials
            ) {
                assert_eq!(status.canonical_reason(), Some(k.title()), "{k:?}");
            }
        }
        assert_eq!(ProblemKind::Unauthorized.status(), 401);
        assert_eq!(ProblemKind::UnknownKey.status(), 401);
        assert_eq!(ProblemKind::LengthRequired.status(), 411);
        assert_eq!(ProblemKind::PayloadTooLarge.status(), 413);
        assert_eq!(ProblemKind::UriTooLong.status(), 414);
        assert_eq!(ProblemKind::DuplicateCredentials.status(), 400);
        assert_eq!(ProblemKind::NotImplemented.status(), 501);
    }

    #[test]
    fn idempotency_kinds_have_their_own_types() {
        let kinds = [
            ProblemKind::IdempotencyConflict,
            ProblemKind::IdempotencyInFlight,
            ProblemKind::IdempotencyKeyMissing,
            ProblemKind::IdempotencyKeyInvalid,
        ];
        let codes: std::collections::HashSet<_> = kinds.iter().map(|k| k.code()).collect();
        assert_eq!(codes.len(), kinds.len());
        assert_eq!(ProblemKind::IdempotencyInFlight.status(), 409);
        assert_eq!(ProblemKind::IdempotencyKeyInvalid.status(), 400);
        // waiting can end an in-flight answer; a conflict never ends
        assert!(ProblemKind::IdempotencyInFlight.is_retryable());
        assert!(!ProblemKind::IdempotencyConflict.is_retryable());
        assert!(!ProblemKind::IdempotencyKeyMissing.is_retryable());
    }
}
