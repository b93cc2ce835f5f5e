//! Metrics and logs, through the `metrics` and `tracing` facades.
//!
//! Install any `metrics` recorder (the Prometheus exporter, for example)
//! and these series appear:
//!
//! | name | kind | labels |
//! |---|---|---|
//! | `paceline_decisions_total` | counter | `plan`, `policy` (the deciding one, `none` when admitted), `outcome` |
//! | `paceline_shadow_rejections_total` | counter | `plan`, `policy`: what a shadow policy would have rejected |
//! | `paceline_decision_seconds` | histogram | `outcome` |
//! | `paceline_store_errors_total` | counter | `plan` |
//! | `paceline_escalations_total` | counter | `plan`, `level` (`extended`, `blocked`) |
//! | `paceline_soft_limit_total` | counter | `plan`, `policy`: soft-limit hooks fired |
//!
//! `outcome` is one of `allowed`, `rate_limited`, `quota_exhausted`,
//! `cost_exceeds_burst`, `store_error`.

use std::sync::Arc;

use metrics::{counter, histogram, SharedString};

/// Decisions by plan, policy and outcome.
pub const DECISIONS: &str = "paceline_decisions_total";
/// Rejections a shadow policy would have made.
pub const SHADOW_REJECTIONS: &str = "paceline_shadow_rejections_total";
/// Time spent deciding, in seconds.
pub const DECISION_SECONDS: &str = "paceline_decision_seconds";
/// Store failures.
pub const STORE_ERRORS: &str = "paceline_store_errors_total";
/// Keys escalated.
pub const ESCALATIONS: &str = "paceline_escalations_total";
/// Soft-limit hooks fired.
pub const SOFT_LIMITS: &str = "paceline_soft_limit_total";

/// How a request ended, as a metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutcomeLabel {
    /// Admitted.
    Allowed,
    /// 429 on a burst policy.
    RateLimited,
    /// 429 on a quota.
    QuotaExhausted,
    /// 400: the cost can never fit.
    CostExceedsBurst,
    /// The store failed.
    StoreError,
}

impl OutcomeLabel {
    /// The label value.
    pub fn as_str(&self) -> &'static str {
        match self {
            OutcomeLabel::Allowed => "allowed",
            OutcomeLabel::RateLimited => "rate_limited",
            OutcomeLabel::QuotaExhausted => "quota_exhausted",
            OutcomeLabel::CostExceedsBurst => "cost_exceeds_burst",
            OutcomeLabel::StoreError => "store_error",
        }
    }
}

fn shared(s: &Arc<str>) -> SharedString {
    SharedString::from(s.clone())
}

pub(crate) fn decision(
    plan: &Arc<str>,
    policy: Option<&Arc<str>>,
    outcome: OutcomeLabel,
    seconds: f64,
) {
    let policy = policy
        .map(shared)
        .unwrap_or(SharedString::const_str("none"));
    counter!(DECISIONS, "plan" => shared(plan), "policy" => policy, "outcome" => outcome.as_str())
        .increment(1);
    histogram!(DECISION_SECONDS, "outcome" => outcome.as_str()).record(seconds);
}

pub(crate) fn shadow(plan: &Arc<str>, policy: &Arc<str>) {
    counter!(SHADOW_REJECTIONS, "plan" => shared(plan), "policy" => shared(policy)).increment(1);
}

pub(crate) fn store_error(plan: &Arc<str>) {
    counter!(STORE_ERRORS, "plan" => shared(plan)).increment(1);
}

pub(crate) fn escalation(plan: &Arc<str>, level: &'static str) {
    counter!(ESCALATIONS, "plan" => shared(plan), "level" => level).increment(1);
}

pub(crate) fn soft_limit(plan: &Arc<str>, policy: &Arc<str>) {
    counter!(SOFT_LIMITS, "plan" => shared(plan), "policy" => shared(policy)).increment(1);
}
