//! What the client knows about a request before it is sent, and the state
//! of one call across its attempts.

use http::Method;
use paceline_core::Nanos;
use serde::Serialize;

use crate::cost::Cost;
use crate::event::Mode;
use crate::scope::Marks;

/// The parts of a request that pacing and retrying depend on. Built with
/// [`RequestInfo::new`] (or `get`/`post`) and its `with_*` methods, so a
/// field added later breaks no caller.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RequestInfo {
    /// The method.
    pub method: Method,
    /// The pacing scope: by default the authority (`host:port`), to which
    /// the adapters add a hash of the request's credential (see
    /// `adapter::Scoping`, features `reqwest` and `tower`); set it to an
    /// account name to pace several hosts as one.
    pub scope: String,
    /// The path, without the query (used by per-endpoint policies).
    pub path: String,
    /// An idempotency key the application already chose, if any.
    pub idempotency_key: Option<String>,
    /// What the request spends beyond the one request it is (tokens,
    /// points, bytes…); empty: the estimate of each unit (see
    /// [`crate::cost`]). Every attempt of the call is charged it.
    pub cost: Cost,
}

impl RequestInfo {
    /// From a method and an absolute URL (`http://host:port/path?query`);
    /// a relative URL gets an empty scope.
    pub fn new(method: Method, url: &str) -> Self {
        let (scope, path) = split_url(url);
        RequestInfo {
            method,
            scope: scope.to_string(),
            path: path.to_string(),
            idempotency_key: None,
            cost: Cost::new(),
        }
    }

    /// A `GET` of `url`.
    pub fn get(url: &str) -> Self {
        RequestInfo::new(Method::GET, url)
    }

    /// A `POST` to `url`.
    pub fn post(url: &str) -> Self {
        RequestInfo::new(Method::POST, url)
    }

    /// Replaces the pacing scope.
    pub fn with_scope(mut self, scope: impl Into<String>) -> Self {
        self.scope = scope.into();
        self
    }

    /// Says what the request spends, unit by unit:
    /// `RequestInfo::post(url).with_cost(Cost::new().with("tokens", 1_200))`.
    pub fn with_cost(mut self, cost: Cost) -> Self {
        self.cost = cost;
        self
    }

    /// Uses the application's own idempotency key.
    pub fn with_idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }

    /// Whether the method is idempotent (RFC 9110): safe to resend after a
    /// network error even without a key.
    pub fn is_idempotent(&self) -> bool {
        matches!(
            self.method,
            Method::GET
                | Method::HEAD
                | Method::OPTIONS
                | Method::TRACE
                | Method::PUT
                | Method::DELETE
        )
    }
}

fn split_url(url: &str) -> (&str, &str) {
    let rest = match url.find("://") {
        Some(i) => &url[i + 3..],
        None => return ("", strip_query(url)),
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    let authority = authority.rsplit('@').next().unwrap_or(authority);
    let path = strip_query(&rest[end..]);
    (authority, if path.is_empty() { "/" } else { path })
}

fn strip_query(s: &str) -> &str {
    let end = s.find(['?', '#']).unwrap_or(s.len());
    &s[..end]
}

/// One attempt of a call, as the application can see it: the adapters put
/// it on the response they hand back (`response.extensions().get::<Attempt>()`)
/// and in the extensions an inner middleware or service receives, and the
/// client names it in its [`Event::Attempt`](crate::Event::Attempt) events
/// and in the diagnostics.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Attempt {
    /// The scope the attempt was paced in.
    pub scope: String,
    /// 1 for the first attempt, 2 for the first retry, and so on.
    pub number: u32,
    /// The `Idempotency-Key` the attempt carried, the same on every attempt
    /// of a call (none for a GET without one).
    pub idempotency_key: Option<String>,
}

/// One attempt on the wire.
#[derive(Clone, Debug)]
pub(crate) struct Flight {
    pub(crate) seq: u64,
    pub(crate) mode: Mode,
    pub(crate) sent_at: Nanos,
    /// What the scope's mirrors expected of it.
    pub(crate) marks: Marks,
}

/// One application request, across all its attempts. Made by
/// [`Client::call`](crate::Client::call); pass it to `before`, then to
/// `after` (or `after_error`) for every attempt.
#[derive(Clone, Debug)]
pub struct Call {
    pub(crate) info: RequestInfo,
    pub(crate) attempts: u32,
    pub(crate) key: Option<String>,
    pub(crate) not_before: Nanos,
    pub(crate) flight: Option<Flight>,
    pub(crate) last_status: Option<u16>,
    /// Where the client keeps this call's scope (a hint, checked by name).
    pub(crate) slot: Option<usize>,
}

impl Call {
    pub(crate) fn new(info: RequestInfo, key: Option<String>) -> Self {
        Call {
            info,
            attempts: 0,
            key,
            not_before: Nanos::ZERO,
            flight: None,
            last_status: None,
            slot: None,
        }
    }
    /// The request.
    pub fn info(&self) -> &RequestInfo {
        &self.info
    }
    /// Attempts sent so far.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }
    /// The `Idempotency-Key` to send with every attempt, if any. The same
    /// key is kept across retries.
    pub fn idempotency_key(&self) -> Option<&str> {
        self.key.as_deref()
    }
    /// Whether an attempt is on the wire (between `Go` and its answer).
    pub fn in_flight(&self) -> bool {
        self.flight.is_some()
    }
    /// The attempt sent last (or being sent), if any.
    pub fn attempt(&self) -> Option<Attempt> {
        (self.attempts > 0).then(|| Attempt {
            scope: self.info.scope.clone(),
            number: self.attempts,
            idempotency_key: self.key.clone(),
        })
    }
    /// The status of the last response, if any.
    pub fn last_status(&self) -> Option<u16> {
        self.last_status
    }
    /// Whether a network error on this call may be retried: idempotent
    /// method or an idempotency key.
    pub fn may_resend(&self) -> bool {
        self.info.is_idempotent() || self.key.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_scope_and_path() {
        let r = RequestInfo::get("http://127.0.0.1:8080/v1/labels?x=1");
        assert_eq!(r.scope, "127.0.0.1:8080");
        assert_eq!(r.path, "/v1/labels");
        let r = RequestInfo::get("https://user@api.example.com");
        assert_eq!(
            (r.scope.as_str(), r.path.as_str()),
            ("api.example.com", "/")
        );
        assert!(!RequestInfo::post("http://a/b").is_idempotent());
    }
}
