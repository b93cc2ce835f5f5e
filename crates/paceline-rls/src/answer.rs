//! A request's decisions, as Envoy reads them: the overall code, a status
//! per descriptor, the IETF fields for every descriptor's limit and, on
//! `OVER_LIMIT`, `Retry-After` and the problem body.
//!
//! Nothing here formats a field or a body itself: the descriptors' rules
//! are put together as one plan of policies and their decisions as one
//! decision, so `paceline-wire` writes `RateLimit-Policy`, `RateLimit`,
//! `Retry-After` and the problem exactly as the gateway does.

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf::Duration;
use http::header::HeaderMap;
use paceline_core::{Decision, Denial, Nanos, Outcome, Plan, PolicyKind, PolicyStatus};
use paceline_wire::emit::{self, Dialects};
use paceline_wire::problem::{self, Problem, ProblemKind};
use smallvec::SmallVec;

use crate::config::{Limit, Match};

/// One descriptor's rule and what became of it.
pub(crate) struct Item {
    /// The descriptor's index in the request.
    pub(crate) descriptor: usize,
    pub(crate) m: Match,
    pub(crate) cost: u64,
    /// `is_negative_hits`: the hits are given back, not charged.
    pub(crate) negative: bool,
    pub(crate) state: State,
}

/// What the store (or the rule alone) said.
pub(crate) enum State {
    /// `unlimited: true`, or a rule a request-level refusal left alone.
    Unlimited,
    /// `requests_per_unit: 0`.
    Blocked,
    /// The store's decision (charged only when the request was admitted).
    Decided(Decision),
    /// The store did not answer.
    Unknown,
}

/// The request's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Every rule admitted it.
    Ok,
    /// Refused by the rule of this item.
    Over(usize),
    /// The store did not answer and the domain fails closed.
    Unavailable,
}

impl Item {
    /// Whether this item's rule refuses the request (never a shadow rule).
    pub(crate) fn refuses(&self) -> bool {
        if self.m.rule.shadow || self.negative {
            return false;
        }
        match &self.state {
            State::Blocked => true,
            State::Decided(d) => !d.is_allowed(),
            _ => false,
        }
    }
}

/// The response for `n` descriptors.
pub(crate) fn response(
    n: usize,
    items: &[Item],
    verdict: Verdict,
    now: Nanos,
    base: &str,
) -> RateLimitResponse {
    let mut statuses = vec![
        DescriptorStatus {
            code: Code::Ok as i32,
            ..Default::default()
        };
        n
    ];
    for (i, it) in items.iter().enumerate() {
        statuses[it.descriptor] = status(it, verdict == Verdict::Over(i), verdict, now);
    }
    let mut h = HeaderMap::new();
    let fields = Fields::of(items, verdict);
    if let Some((plan, d)) = &fields {
        emit::write_headers(plan, d, &Dialects::default(), &mut h);
    }
    let mut raw_body = Vec::new();
    let overall = match verdict {
        Verdict::Ok => Code::Ok,
        Verdict::Over(i) => {
            let p = match &fields {
                Some((plan, d)) if !d.is_allowed() => Problem::from_decision(plan, d, base),
                _ => None,
            };
            let p = p.unwrap_or_else(|| blocked_problem(&items[i], now, base));
            problem::write_fields(&p, &mut h);
            raw_body = p.to_json().into_bytes();
            Code::OverLimit
        }
        Verdict::Unavailable => {
            let mut p = Problem::new(
                ProblemKind::Overloaded,
                base,
                "The rate limiter cannot reach its store; retry shortly.",
            );
            p.retry_after_s = Some(1);
            problem::write_fields(&p, &mut h);
            raw_body = p.to_json().into_bytes();
            Code::OverLimit
        }
    };
    RateLimitResponse {
        overall_code: overall as i32,
        statuses,
        response_headers_to_add: headers(&h),
        raw_body,
        ..Default::default()
    }
}

fn status(it: &Item, deciding: bool, verdict: Verdict, now: Nanos) -> DescriptorStatus {
    let rule = &it.m.rule;
    let current_limit = rule.unit.map(|u| RateLimit {
        name: rule.given_name.clone().unwrap_or_default(),
        requests_per_unit: rule.requests_per_unit,
        unit: u.proto(),
    });
    let over = |yes: bool| match yes && !rule.shadow {
        true => Code::OverLimit,
        false => Code::Ok,
    };
    let (code, remaining, reset) = match &it.state {
        State::Unlimited => (Code::Ok, u32::MAX, None),
        State::Blocked => (over(true), 0, Some(window_end(it, now))),
        State::Decided(d) => {
            let st = d.statuses[0];
            // refused by this rule, or spent for this cost (a rule after
            // the refusing one is only read)
            let spent = deciding || (matches!(verdict, Verdict::Over(_)) && st.remaining < it.cost);
            let spent = spent || (!d.is_allowed() && verdict != Verdict::Ok);
            (over(spent), clamp(st.remaining), Some(st.reset_after))
        }
        State::Unknown => (over(verdict == Verdict::Unavailable), 0, None),
    };
    DescriptorStatus {
        code: code as i32,
        current_limit: match &it.state {
            State::Unlimited => None,
            _ => current_limit,
        },
        limit_remaining: remaining,
        duration_until_reset: reset.map(duration),
        ..Default::default()
    }
}

fn clamp(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn duration(n: Nanos) -> Duration {
    Duration {
        seconds: i64::try_from(n.as_secs_floor()).unwrap_or(i64::MAX),
        nanos: (n.as_u64() % 1_000_000_000) as i32,
    }
}

/// A blocked rule's window ends where an epoch-aligned window of its unit
/// does (envoyproxy/ratelimit's reset for any rule).
fn window_end(it: &Item, now: Nanos) -> Nanos {
    let w = it.m.rule.unit.map_or(1, |u| u.seconds()) * 1_000_000_000;
    Nanos::new(w - now.as_u64() % w)
}

/// The problem of a blocked rule (`requests_per_unit: 0`): no policy can
/// stand for it, so the problem names the rule itself.
fn blocked_problem(it: &Item, now: Nanos, base: &str) -> Problem {
    let rule = &it.m.rule;
    let long = rule.unit.is_some_and(|u| u.seconds() >= 3_600);
    let kind = match long {
        true => ProblemKind::QuotaExhausted,
        false => ProblemKind::RateLimited,
    };
    let mut p = Problem::new(
        kind,
        base,
        format!("Limit \"{}\" admits no requests.", rule.name),
    );
    p.limit = Some(rule.name.clone());
    p.retry_after_s = Some(window_end(it, now).as_secs_ceil().max(1));
    p.violated_policies = vec![rule.name.clone()];
    p
}

/// Every decided rule as one plan, and their decisions as one decision,
/// for the wire crate to write. A blocked rule has no policy (a quota of
/// 0 is none), so it publishes no fields; its `Retry-After` comes with
/// its problem.
struct Fields;

impl Fields {
    fn of(items: &[Item], verdict: Verdict) -> Option<(Plan, Decision)> {
        let mut policies = Vec::new();
        let mut statuses: SmallVec<[PolicyStatus; 2]> = SmallVec::new();
        let mut outcome = Outcome::Allowed;
        for (i, it) in items.iter().enumerate() {
            let (State::Decided(d), Limit::Plan(plan)) = (&it.state, &it.m.rule.limit) else {
                continue;
            };
            // at most a plan's worth, the last place kept for the refusing rule
            let room = paceline_core::MAX_POLICIES
                - usize::from(matches!(verdict, Verdict::Over(j) if j > i));
            if policies.len() >= room && verdict != Verdict::Over(i) {
                continue;
            }
            let p = plan.policy(0).clone();
            let unique = |n: &str| {
                !policies
                    .iter()
                    .any(|q: &paceline_core::Policy| q.name() == n)
            };
            let p = match unique(p.name()) {
                true => p,
                false => renamed(&p, policies.len(), &unique)?,
            };
            if verdict == Verdict::Over(i) {
                outcome = match d.outcome {
                    Outcome::Denied(den) => Outcome::Denied(Denial {
                        policy: policies.len(),
                        ..den
                    }),
                    Outcome::CostExceedsBurst { cost, .. } => Outcome::CostExceedsBurst {
                        policy: policies.len(),
                        cost,
                    },
                    Outcome::Allowed => Outcome::Allowed,
                };
            }
            policies.push(p);
            statuses.push(d.statuses[0]);
        }
        let plan = Plan::new("rls", policies).ok()?;
        Some((plan, Decision { outcome, statuses }))
    }
}

/// The same policy under a name no other in the answer has (two
/// descriptors that reach rules of one name).
fn renamed(
    p: &paceline_core::Policy,
    i: usize,
    unique: &dyn Fn(&str) -> bool,
) -> Option<paceline_core::Policy> {
    let base: String = p.name().chars().take(56).collect();
    let name = (2..)
        .map(|n| format!("{base}.{n}"))
        .take(64)
        .find(|n| unique(n))
        .unwrap_or_else(|| format!("{base}.{i}"));
    let q = paceline_core::Policy::new(&name, p.algorithm(), p.quota(), p.window_s()).ok()?;
    let q = match p.has_own_burst() {
        true => q.with_burst(p.burst()).ok()?,
        false => q,
    };
    let q = match p.kind() {
        PolicyKind::Quota => q.with_kind(PolicyKind::Quota),
        PolicyKind::Burst => q.with_kind(PolicyKind::Burst),
    };
    Some(q.with_shadow(p.is_shadow()))
}

/// The fields as Envoy's headers (the rate-limit filter puts them on the
/// answer it forwards, or on the `429` it writes).
fn headers(h: &HeaderMap) -> Vec<HeaderValue> {
    h.iter()
        .map(|(k, v)| HeaderValue {
            key: k.as_str().to_string(),
            value: String::from_utf8_lossy(v.as_bytes()).into_owned(),
            ..Default::default()
        })
        .collect()
}
