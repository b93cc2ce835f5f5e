//! Emitting: a [`Decision`] turned into the headers a response publishes.
//!
//! Why structured fields: the IETF draft's `RateLimit-Policy` and
//! `RateLimit` carry every policy of a plan in one line each, with quoted
//! names, so a client sees the burst limit and the daily quota together.
//! The fields are serialized with `sfv`, so a name that is not a valid
//! structured-field string can never produce a malformed header.
//!
//! Older clients read one limit only; [`Dialects`] adds the
//! `X-RateLimit-*` and draft-03 `RateLimit-Limit/-Remaining/-Reset` fields,
//! describing the binding policy (the denying one, else the one with the
//! fewest units left). Their reset is a delay in seconds, as draft-03
//! defines it.
//!
//! A server answering many requests prepares each plan once
//! ([`PreparedPlan`]): the fixed parts of its fields and of its `429`, so
//! that a request only adds its numbers.
//!
//! ```
//! use paceline_core::{ManualClock, Limiter, MemoryStore, Nanos, Plan, Policy};
//! use paceline_wire::emit;
//!
//! let plan = Plan::new("free", vec![
//!     Policy::token_bucket("burst", 20, 2).unwrap(),
//!     Policy::daily("daily", 10_000).unwrap(),
//! ]).unwrap();
//! assert_eq!(emit::policy_field(&plan), r#""burst";q=20;w=2, "daily";q=10000;w=86400"#);
//!
//! let limiter = Limiter::new(MemoryStore::new(), ManualClock::at_unix_secs(1_790_000_000));
//! let d = limiter.check_sync(&plan, "key", 1).unwrap();
//! let mut headers = http::HeaderMap::new();
//! emit::write_headers(&plan, &d, &emit::Dialects::default(), &mut headers);
//! assert!(headers["ratelimit"].to_str().unwrap().starts_with(r#""burst";r=19;t=1"#));
//! ```

use http::header::{HeaderMap, HeaderName, HeaderValue, CACHE_CONTROL, RETRY_AFTER};
use paceline_core::{Decision, Outcome, Plan, Policy, Unit};
use sfv::{KeyRef, ListSerializer, StringRef};

mod dialects;
mod prepared;

pub use dialects::{binding_policy, Dialects};
pub use prepared::{seconds_value, Hold, PreparedPlan};

/// The IETF draft's header names.
pub const RATELIMIT_POLICY: &str = "ratelimit-policy";
/// The IETF draft's header name for what is left.
pub const RATELIMIT: &str = "ratelimit";

fn key(k: &'static str) -> &'static KeyRef {
    // Every key used here is a constant, valid lowercase key.
    KeyRef::from_str(k).expect("constant structured-field key")
}

fn name_ref(policy: &Policy) -> Option<&StringRef> {
    StringRef::from_str(policy.name()).ok()
}

/// A structured-field integer: at most 15 digits, so larger values clamp
/// rather than fail.
#[inline]
pub(crate) fn sf_clamp(n: u64) -> u64 {
    n.min(999_999_999_999_999)
}

fn sf_int(n: u64) -> sfv::Integer {
    // the clamped value always fits
    sfv::Integer::constant(sf_clamp(n) as i64)
}

/// `RateLimit-Policy`: every policy of the plan with its quota `q`, window
/// `w` in seconds and, when not requests, its unit `qu`.
///
/// A concurrency cap has no window, so it carries no `w`.
pub fn policy_field(plan: &Plan) -> String {
    let mut out = String::with_capacity(24 * plan.policies().len());
    {
        let mut ser = ListSerializer::with_buffer(&mut out);
        for p in plan.policies() {
            let Some(name) = name_ref(p) else { continue };
            let mut params = ser.bare_item(name).parameter(key("q"), sf_int(p.quota()));
            if p.unit() != Unit::ConcurrentRequests {
                params = params.parameter(key("w"), sf_int(p.window_s()));
            }
            if p.unit() != Unit::Requests {
                if let Ok(u) = StringRef::from_str(p.unit().as_str()) {
                    params.parameter(key("qu"), u);
                }
            }
        }
        let _ = ser.finish();
    }
    out
}

/// `RateLimit`: per policy, `r` whole units left and `t` whole seconds until
/// the policy is fully restored (rounded up).
///
/// Written by the same writer as [`PreparedPlan`]'s field, into a heap
/// buffer.
pub fn ratelimit_field(plan: &Plan, d: &Decision) -> String {
    prepared::ratelimit_string(plan, d)
}

/// `Retry-After` in whole seconds (rounded up, at least 1) when the decision
/// is a denial that a wait can clear.
pub fn retry_after_secs(d: &Decision) -> Option<u64> {
    d.denial().map(|den| den.retry_after_secs())
}

fn set(headers: &mut HeaderMap, name: &'static str, value: String) {
    if let Ok(v) = HeaderValue::try_from(value) {
        headers.insert(HeaderName::from_static(name), v);
    }
}

/// Writes the rate-limit headers for `d` into `headers`, replacing any
/// earlier values: the chosen dialects, and on a denial `Retry-After`
/// (whole seconds, at least 1) with `Cache-Control: no-store`.
pub fn write_headers(plan: &Plan, d: &Decision, dialects: &Dialects, headers: &mut HeaderMap) {
    if dialects.ietf {
        set(headers, RATELIMIT_POLICY, policy_field(plan));
        set(headers, RATELIMIT, ratelimit_field(plan, d));
    }
    dialects::write_older(plan, d, dialects, headers);
    write_denial_fields(d, headers);
}

/// On a denial, `Retry-After` (whole seconds, at least 1) and
/// `Cache-Control: no-store`.
#[inline]
pub(crate) fn write_denial_fields(d: &Decision, headers: &mut HeaderMap) {
    if let Outcome::Denied(den) = d.outcome {
        headers.insert(RETRY_AFTER, seconds_value(den.retry_after_secs()));
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use paceline_core::{Denial, Nanos, PolicyKind, PolicyStatus};
    use smallvec_shim::statuses;

    mod smallvec_shim {
        use paceline_core::{Decision, PolicyStatus};
        pub(super) fn statuses(v: &[PolicyStatus]) -> Decision {
            let mut d = Decision {
                outcome: paceline_core::Outcome::Allowed,
                statuses: Default::default(),
            };
            d.statuses.extend(v.iter().copied());
            d
        }
    }

    fn free() -> Plan {
        Plan::new(
            "free",
            vec![
                Policy::token_bucket("burst", 20, 2).unwrap(),
                Policy::daily("daily", 10_000).unwrap(),
            ],
        )
        .unwrap()
    }

    fn st(remaining: u64, secs: u64) -> PolicyStatus {
        PolicyStatus {
            remaining,
            reset_after: Nanos::from_secs(secs),
            would_deny: false,
        }
    }

    #[test]
    fn design_doc_example_fields() {
        let plan = free();
        let d = statuses(&[st(7, 1), st(2310, 21_600)]);
        assert_eq!(
            policy_field(&plan),
            r#""burst";q=20;w=2, "daily";q=10000;w=86400"#
        );
        assert_eq!(
            ratelimit_field(&plan, &d),
            r#""burst";r=7;t=1, "daily";r=2310;t=21600"#
        );
        assert_eq!(retry_after_secs(&d), None);
    }

    #[test]
    fn unit_and_concurrency_parameters() {
        let plan = Plan::new(
            "p",
            vec![
                Policy::token_bucket("bytes", 1_000_000, 60)
                    .unwrap()
                    .with_unit(Unit::ContentBytes)
                    .unwrap(),
                Policy::concurrency("inflight", 4).unwrap(),
            ],
        )
        .unwrap();
        assert_eq!(
            policy_field(&plan),
            r#""bytes";q=1000000;w=60;qu="content-bytes", "inflight";q=4;qu="concurrent-requests""#
        );
    }

    #[test]
    fn denial_writes_retry_after_and_all_dialects() {
        let plan = free();
        let mut d = statuses(&[st(0, 2), st(9_000, 3_600)]);
        d.outcome = Outcome::Denied(Denial {
            policy: 0,
            kind: PolicyKind::Burst,
            retry_after: Nanos::new(100_000_001),
        });
        let mut h = HeaderMap::new();
        write_headers(&plan, &d, &Dialects::all(), &mut h);
        assert_eq!(h["retry-after"], "1");
        assert_eq!(h["cache-control"], "no-store");
        assert_eq!(h["x-ratelimit-limit"], "20");
        assert_eq!(h["x-ratelimit-remaining"], "0");
        assert_eq!(h["x-ratelimit-reset"], "2");
        assert_eq!(h["ratelimit-limit"], "20");
        assert_eq!(h["ratelimit"], r#""burst";r=0;t=2, "daily";r=9000;t=3600"#);
        assert_eq!(retry_after_secs(&d), Some(1));
    }

    #[test]
    fn binding_policy_prefers_fewest_remaining_then_latest_reset() {
        let plan = free();
        let d = statuses(&[st(5, 1), st(5, 100)]);
        assert_eq!(binding_policy(&plan, &d), Some(1));
        let d = statuses(&[st(4, 1), st(5, 100)]);
        assert_eq!(binding_policy(&plan, &d), Some(0));
    }
}
