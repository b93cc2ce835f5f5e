//! The one writer of a problem answer: status, header fields and body.
//!
//! Why one: every answer with a problem body (the server layer's
//! rejections, the gateway's own errors, the load shedder's `503`, the demo
//! upstream's) must carry the same media type, must not be cached and must
//! repeat `retry_after_s` in `Retry-After`; written here once, no caller can
//! forget one of them.

use bytes::Bytes;
use http::header::{HeaderMap, HeaderValue, CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};

use super::{Problem, PROBLEM_CONTENT_TYPE};
use crate::emit::seconds_value;

const NO_STORE: HeaderValue = HeaderValue::from_static("no-store");

/// The complete answer for `p`: its status, `Content-Type:
/// application/problem+json`, `Cache-Control: no-store`, `Retry-After` when
/// the problem has a `retry_after_s`, and the JSON body.
///
/// ```
/// use paceline_wire::problem::{self, Problem, ProblemKind};
///
/// let mut p = Problem::new(ProblemKind::Overloaded, "https://e.x/errors/", "Retry shortly.");
/// p.retry_after_s = Some(2);
/// let r = problem::answer(&p);
/// assert_eq!(r.status(), 503);
/// assert_eq!(r.headers()["content-type"], problem::PROBLEM_CONTENT_TYPE);
/// assert_eq!(r.headers()["cache-control"], "no-store");
/// assert_eq!(r.headers()["retry-after"], "2");
/// ```
pub fn answer(p: &Problem) -> Response<Bytes> {
    let mut r = Response::new(Bytes::from(p.to_json()));
    *r.status_mut() = StatusCode::from_u16(p.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    write_fields(p, r.headers_mut());
    r
}

/// Writes the header fields of the answer for `p` into `h`, replacing any
/// earlier values: `Content-Type`, `Cache-Control: no-store` and, when the
/// problem has a `retry_after_s`, `Retry-After`.
pub fn write_fields(p: &Problem, h: &mut HeaderMap) {
    h.insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_CONTENT_TYPE));
    h.insert(CACHE_CONTROL, NO_STORE);
    if let Some(secs) = p.retry_after_s {
        h.insert(RETRY_AFTER, seconds_value(secs));
    }
}

/// Appends the fields every problem answer starts with (`Content-Type`,
/// `Cache-Control`) to a head being prepared.
pub(crate) fn put_problem_fields(h: &mut HeaderMap) {
    h.append(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_CONTENT_TYPE));
    h.append(CACHE_CONTROL, NO_STORE);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::ProblemKind;

    #[test]
    fn an_answer_without_a_wait_has_no_retry_after() {
        let p = Problem::new(
            ProblemKind::BadGateway,
            "x:",
            "The upstream could not be reached.",
        );
        let r = answer(&p);
        assert_eq!(r.status(), StatusCode::BAD_GATEWAY);
        let names: Vec<_> = r.headers().keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["content-type", "cache-control"]);
        let v: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
        assert_eq!(v["type"], "x:bad_gateway");
        assert_eq!(v["title"], "Bad Gateway");
    }
}
