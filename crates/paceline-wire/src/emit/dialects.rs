//! The header dialects a response can carry, and the older single-limit
//! ones written from the binding policy.
//!
//! Why apart from the IETF fields: `X-RateLimit-*` and draft-03 describe
//! one policy only, chosen by [`binding_policy`]; both the plain emitter
//! and the prepared one write them the same way, here.

use http::header::{HeaderMap, HeaderName, HeaderValue};
use paceline_core::{Decision, Plan, Unit};

/// Which header dialects a response carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Dialects {
    /// The IETF draft's `RateLimit-Policy` and `RateLimit` (structured fields).
    pub ietf: bool,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`
    /// (reset as delay seconds).
    pub x_ratelimit: bool,
    /// Draft-03 `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset`.
    pub draft03: bool,
}

impl Default for Dialects {
    fn default() -> Self {
        Dialects {
            ietf: true,
            x_ratelimit: false,
            draft03: false,
        }
    }
}

impl Dialects {
    /// Every dialect at once.
    pub fn all() -> Self {
        Dialects {
            ietf: true,
            x_ratelimit: true,
            draft03: true,
        }
    }
}

/// The policy the single-limit dialects describe: they cannot say what
/// they count, so only request policies qualify; the rejecting one if it
/// counts requests, else the one with the fewest units left (on a tie, the
/// one resetting last). `None` when no policy counts requests.
pub fn binding_policy(plan: &Plan, d: &Decision) -> Option<usize> {
    let n = plan.policies().len().min(d.statuses.len());
    let counts_requests = |i: usize| plan.policy(i).unit() == Unit::Requests;
    if let Some(i) = d
        .rejecting_policy()
        .filter(|&i| i < n && counts_requests(i))
    {
        return Some(i);
    }
    (0..n).filter(|&i| counts_requests(i)).min_by(|&a, &b| {
        let (sa, sb) = (&d.statuses[a], &d.statuses[b]);
        sa.remaining
            .cmp(&sb.remaining)
            .then(sb.reset_after.cmp(&sa.reset_after))
    })
}

fn set_num(headers: &mut HeaderMap, name: &'static str, value: u64) {
    headers.insert(HeaderName::from_static(name), HeaderValue::from(value));
}

/// Writes the older dialects `dialects` asks for (`X-RateLimit-*`,
/// draft-03), describing the binding policy; nothing for the IETF fields,
/// `Retry-After` or `Cache-Control`.
pub(crate) fn write_older(plan: &Plan, d: &Decision, dialects: &Dialects, headers: &mut HeaderMap) {
    if !(dialects.x_ratelimit || dialects.draft03) {
        return;
    }
    let Some(i) = binding_policy(plan, d) else {
        return;
    };
    let (p, s) = (plan.policy(i), d.statuses[i]);
    if dialects.x_ratelimit {
        set_num(headers, "x-ratelimit-limit", p.quota());
        set_num(headers, "x-ratelimit-remaining", s.remaining);
        set_num(headers, "x-ratelimit-reset", s.reset_secs());
    }
    if dialects.draft03 {
        set_num(headers, "ratelimit-limit", p.quota());
        set_num(headers, "ratelimit-remaining", s.remaining);
        set_num(headers, "ratelimit-reset", s.reset_secs());
    }
}
