//! RFC 9457 problem details for every answer with a problem body the
//! project sends: the server layer's rejections, the gateway's own errors,
//! the load shedder's `503` and the demo upstream's answers.
//!
//! Why a body at all: `429` alone cannot tell "slow down for a second" from
//! "your daily quota is gone until midnight". The body's `type` ends in a
//! stable code, `limit` names the policy that was hit and `retry_after_s`
//! repeats the `Retry-After` header, so a client can tell a burst from a
//! quota without guessing. `violated-policies` is the IETF draft's name for
//! the same fact.
//!
//! [`ProblemKind`] names every such answer (status, code, title), and
//! [`answer`] is the one writer of the answer's status, fields and body.
//!
//! ```
//! use paceline_wire::problem::{Problem, ProblemKind};
//!
//! let p = Problem::new(ProblemKind::Overloaded, "https://docs.example/errors/", "Try again shortly.");
//! assert_eq!(p.status, 503);
//! assert_eq!(p.type_uri, "https://docs.example/errors/overloaded");
//! assert!(p.to_json().contains(r#""type":"https://docs.example/errors/overloaded""#));
//! ```

use paceline_core::policy::DAY_SECS;
use paceline_core::{Decision, Outcome, Plan, PolicyKind, Unit};
use serde::ser::{Serialize, SerializeStruct, Serializer};

mod kind;
mod write;

pub use kind::ProblemKind;
pub(crate) use write::put_problem_fields;
pub use write::{answer, write_fields};

/// The media type of a problem body.
pub const PROBLEM_CONTENT_TYPE: &str = "application/problem+json";

/// The `detail` of a rejection for an identity that is not told its
/// counters (an anonymous client): it names no numbers.
pub const ANONYMOUS_DETAIL: &str = "Too many requests from this client; retry later.";

/// An RFC 9457 problem body.
///
/// Serialized as `type`, `title`, `status`, `detail`, then, for the
/// answers about limits (rate limits, quotas, overload, idempotency),
/// `limit`, `retry_after_s` (when set) and `violated-policies`; the other
/// answers (a missing key, an upstream failure) carry `retry_after_s` only
/// when set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// Which rejection this is (not serialized: `type` carries it).
    pub kind: ProblemKind,
    /// The `type` URI: the base URI followed by the code.
    pub type_uri: String,
    /// A short summary.
    pub title: String,
    /// The HTTP status code.
    pub status: u16,
    /// What happened, in words.
    pub detail: String,
    /// The name of the policy that was hit; `null` when no policy was (an
    /// overloaded server, an idempotency conflict). Always written, so a
    /// client can rely on the field being there.
    pub limit: Option<String>,
    /// Equal to the `Retry-After` header.
    pub retry_after_s: Option<u64>,
    /// The IETF draft's list of the policies that denied the request
    /// (empty when none did). Always written.
    pub violated_policies: Vec<String>,
}

impl Serialize for Problem {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let policies = self.kind.names_policies();
        let len = 4 + usize::from(self.retry_after_s.is_some()) + 2 * usize::from(policies);
        let mut st = s.serialize_struct("Problem", len)?;
        st.serialize_field("type", &self.type_uri)?;
        st.serialize_field("title", &self.title)?;
        st.serialize_field("status", &self.status)?;
        st.serialize_field("detail", &self.detail)?;
        if policies {
            st.serialize_field("limit", &self.limit)?;
        }
        if let Some(secs) = self.retry_after_s {
            st.serialize_field("retry_after_s", &secs)?;
        }
        if policies {
            st.serialize_field("violated-policies", &self.violated_policies)?;
        }
        st.end()
    }
}

impl Problem {
    /// A problem of `kind` with its standard title and status.
    pub fn new(kind: ProblemKind, base_uri: &str, detail: impl Into<String>) -> Problem {
        Problem {
            kind,
            type_uri: format!("{base_uri}{}", kind.code()),
            title: kind.title().to_string(),
            status: kind.status(),
            detail: detail.into(),
            limit: None,
            retry_after_s: None,
            violated_policies: Vec::new(),
        }
    }

    /// The problem for a rejected decision; `None` when it was allowed.
    ///
    /// A denial by a quota policy is `quota_exhausted`, by a burst policy
    /// `rate_limited` (both 429, with `retry_after_s`); a cost larger than a
    /// policy can hold is `cost_exceeds_burst` (400).
    pub fn from_decision(plan: &Plan, d: &Decision, base_uri: &str) -> Option<Problem> {
        match d.outcome {
            Outcome::Allowed => None,
            Outcome::Denied(den) => {
                let policy = plan.policy(den.policy);
                let kind = match den.kind {
                    PolicyKind::Quota => ProblemKind::QuotaExhausted,
                    PolicyKind::Burst => ProblemKind::RateLimited,
                };
                let mut p = Problem::new(kind, base_uri, denial_detail(plan, den.policy));
                if kind == ProblemKind::QuotaExhausted && policy.window_s() == DAY_SECS {
                    p.title = "Daily quota used up".to_string();
                }
                p.limit = Some(policy.name().to_string());
                p.retry_after_s = Some(den.retry_after_secs());
                p.violated_policies = violated(plan, d, den.policy);
                Some(p)
            }
            Outcome::CostExceedsBurst { policy, cost } => {
                let pol = plan.policy(policy);
                let detail = format!(
                    "This request costs {} {}; policy \"{}\" holds at most {}. Split it into smaller requests.",
                    thousands(cost),
                    unit_words(pol.unit()),
                    pol.name(),
                    thousands(pol.quota())
                );
                let mut p = Problem::new(ProblemKind::CostExceedsBurst, base_uri, detail);
                p.limit = Some(pol.name().to_string());
                p.violated_policies = vec![pol.name().to_string()];
                Some(p)
            }
        }
    }

    /// The body as compact JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| String::from("{}"))
    }
}

/// The policies that denied: the one that sets the wait first, then the
/// others in plan order. Shadow policies only observe, so they are never
/// named as violated.
fn violated(plan: &Plan, d: &Decision, binding: usize) -> Vec<String> {
    let mut names = vec![plan.policy(binding).name().to_string()];
    names.extend(
        d.statuses
            .iter()
            .enumerate()
            .filter(|&(i, s)| {
                s.would_deny
                    && i != binding
                    && i < plan.policies().len()
                    && !plan.policy(i).is_shadow()
            })
            .map(|(i, _)| plan.policy(i).name().to_string()),
    );
    names
}

fn denial_detail(plan: &Plan, index: usize) -> String {
    let p = plan.policy(index);
    let q = thousands(p.quota());
    let unit = unit_words(p.unit());
    if p.unit() == Unit::ConcurrentRequests {
        return format!(
            "{q} of {q} concurrent requests in flight ({} plan).",
            plan.name()
        );
    }
    let period = if p.window_s() == DAY_SECS {
        "today".to_string()
    } else {
        format!("in the last {}", window_words(p.window_s()))
    };
    format!("{q} of {q} {unit} used {period} ({} plan).", plan.name())
}

fn unit_words(u: Unit) -> &'static str {
    match u {
        Unit::ContentBytes => "bytes",
        Unit::ConcurrentRequests => "concurrent requests",
        _ => "requests",
    }
}

fn window_words(w: u64) -> String {
    match w {
        1 => "second".to_string(),
        60 => "minute".to_string(),
        3_600 => "hour".to_string(),
        w if w % 3_600 == 0 => format!("{} hours", w / 3_600),
        w if w % 60 == 0 => format!("{} minutes", w / 60),
        w => format!("{w} seconds"),
    }
}

/// `10000` as `10,000`: a count with thousands separators, as problem
/// details and reports print it.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use paceline_core::{Denial, Nanos, Policy, PolicyStatus};

    const BASE: &str = "https://docs.shiplane.example/errors/";

    fn free() -> Plan {
        Plan::new(
            "Free",
            vec![
                Policy::token_bucket("burst", 20, 2).unwrap(),
                Policy::daily("daily", 10_000).unwrap(),
            ],
        )
        .unwrap()
    }

    fn decision(outcome: Outcome, deny: [bool; 2]) -> Decision {
        let mut d = Decision {
            outcome,
            statuses: Default::default(),
        };
        for (i, w) in deny.into_iter().enumerate() {
            d.statuses.push(PolicyStatus {
                remaining: if w { 0 } else { 5 },
                reset_after: Nanos::from_secs(1 + i as u64),
                would_deny: w,
            });
        }
        d
    }

    #[test]
    fn violated_names_the_binding_policy_first_and_never_a_shadow() {
        use paceline_core::{check_words, Nanos, Policy};
        let plan = Plan::new(
            "p",
            vec![
                Policy::token_bucket("shadowed", 1, 1)
                    .unwrap()
                    .with_shadow(true),
                Policy::token_bucket("burst", 1, 1).unwrap(),
                Policy::fixed_window("minute", 1, 60).unwrap(),
            ],
        )
        .unwrap();
        let mut w = vec![0; plan.state_words()];
        let now = Nanos::from_secs(1_000_030);
        assert!(check_words(&plan, &mut w, now, 1).0.is_allowed());
        let (d, _) = check_words(&plan, &mut w, now, 1);
        let p = Problem::from_decision(&plan, &d, "https://e.x/").unwrap();
        assert_eq!(p.limit.as_deref(), Some("minute"));
        assert_eq!(p.violated_policies, vec!["minute", "burst"]);
    }

    #[test]
    fn daily_quota_example_from_the_design_doc() {
        // Free key, daily quota out at 18:40 UTC: 5 h 20 min to midnight.
        let d = decision(
            Outcome::Denied(Denial {
                policy: 1,
                kind: PolicyKind::Quota,
                retry_after: Nanos::from_secs(19_200),
            }),
            [false, true],
        );
        let p = Problem::from_decision(&free(), &d, BASE).unwrap();
        assert_eq!(p.status, 429);
        assert_eq!(p.type_uri, format!("{BASE}quota_exhausted"));
        assert_eq!(p.title, "Daily quota used up");
        assert_eq!(p.limit.as_deref(), Some("daily"));
        assert_eq!(p.retry_after_s, Some(19_200));
        assert_eq!(
            p.detail,
            "10,000 of 10,000 requests used today (Free plan)."
        );
        let v: serde_json::Value = serde_json::from_str(&p.to_json()).unwrap();
        assert_eq!(v["violated-policies"], serde_json::json!(["daily"]));
        assert_eq!(v["retry_after_s"], 19_200);
        assert_eq!(v["type"], format!("{BASE}quota_exhausted"));
    }

    #[test]
    fn burst_denial_is_rate_limited_with_at_least_one_second() {
        let d = decision(
            Outcome::Denied(Denial {
                policy: 0,
                kind: PolicyKind::Burst,
                retry_after: Nanos::new(1),
            }),
            [true, false],
        );
        let p = Problem::from_decision(&free(), &d, BASE).unwrap();
        assert_eq!(p.kind, ProblemKind::RateLimited);
        assert_eq!(p.retry_after_s, Some(1));
        assert_eq!(p.violated_policies, vec!["burst".to_string()]);
        assert_eq!(
            p.detail,
            "20 of 20 requests used in the last 2 seconds (Free plan)."
        );
    }

    #[test]
    fn cost_exceeds_burst_is_400_without_retry() {
        let d = decision(
            Outcome::CostExceedsBurst {
                policy: 0,
                cost: 25,
            },
            [false, false],
        );
        let p = Problem::from_decision(&free(), &d, BASE).unwrap();
        assert_eq!(p.status, 400);
        assert_eq!(p.retry_after_s, None);
        assert!(!p.to_json().contains("retry_after_s"));
        assert!(
            Problem::from_decision(&free(), &decision(Outcome::Allowed, [false; 2]), BASE)
                .is_none()
        );
    }

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(12), "12");
    }

    #[test]
    fn answers_without_policies_write_the_four_members() {
        let p = Problem::new(ProblemKind::Unauthorized, "x:", "d");
        assert_eq!(
            p.to_json(),
            r#"{"type":"x:unauthorized","title":"API key required","status":401,"detail":"d"}"#
        );
        let mut p = Problem::new(ProblemKind::Overloaded, "x:", "d");
        p.retry_after_s = Some(2);
        assert_eq!(
            p.to_json(),
            r#"{"type":"x:overloaded","title":"Service overloaded","status":503,"detail":"d","limit":null,"retry_after_s":2,"violated-policies":[]}"#
        );
    }
}
