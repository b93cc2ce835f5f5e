//! What the dialect tests share: a raw response read as `paceline inspect`
//! reads it, and short ways to look at the result.

use paceline_core::Nanos;
use paceline_wire::parse::{parse_response, ResponseView};
use paceline_wire::raw::parse_raw_response;

/// `raw` (a status line, fields, a blank line, a body) read at `now_secs`.
pub(crate) fn view(raw: &str, now_secs: u64) -> ResponseView {
    let r = parse_raw_response(raw.as_bytes()).expect("a response");
    let body = (!r.body.is_empty()).then_some(&r.body[..]);
    parse_response(r.status, &r.headers, body, Nanos::from_secs(now_secs))
}

/// A duration in seconds, rounded to the millisecond.
pub(crate) fn secs(n: Option<Nanos>) -> Option<f64> {
    n.map(|n| (n.as_secs_f64() * 1000.0).round() / 1000.0)
}

/// Whether the answer was read in `dialect`.
pub(crate) fn has(v: &ResponseView, dialect: &str) -> bool {
    v.dialects.iter().any(|d| d == dialect)
}
