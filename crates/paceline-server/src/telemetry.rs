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
//! | `paceline_refunds_total` | counter | `plan`: charges given back because the upstream's answer never came |
//!
//! `outcome` is one of `allowed`, `rate_limited`, `quota_exhausted`,
//! `cost_exceeds_burst`, `store_error`.

use std::sync::Arc;

use metrics::{Key, Label, Level, Metadata, SharedString};

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
/// Charges given back because the upstream's answer never came.
pub const REFUNDS: &str = "paceline_refunds_total";

/// Charges settled from what the answer reported, by `way`: `more` (the
/// answer used more than the estimate), `less` or `same`.
pub const SETTLES: &str = "paceline_settles_total";

/// Units of a named unit moved by settles, by `way`: charged beyond the
/// estimate (`more`) or given back (`less`).
pub const SETTLED_UNITS: &str = "paceline_settled_units_total";

/// One charge settled: `charged` units estimated, `used` reported.
pub(crate) fn settled(plan: &Arc<str>, charged: u64, used: u64) {
    let (way, n) = match used.cmp(&charged) {
        std::cmp::Ordering::Greater => ("more", used - charged),
        std::cmp::Ordering::Less => ("less", charged - used),
        std::cmp::Ordering::Equal => ("same", 0),
    };
    metrics::counter!(SETTLES, "plan" => plan.to_string(), "way" => way).increment(1);
    if n > 0 {
        metrics::counter!(SETTLED_UNITS, "plan" => plan.to_string(), "way" => way).increment(n);
    }
}

/// One charge given back (the failure path: a label made on the spot).
pub(crate) fn refunded(plan: &Arc<str>) {
    metrics::counter!(REFUNDS, "plan" => plan.to_string()).increment(1);
}

/// How a request ended, as a metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
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

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

static ALLOWED: [Label; 1] = [Label::from_static_parts("outcome", "allowed")];
static RATE_LIMITED: [Label; 1] = [Label::from_static_parts("outcome", "rate_limited")];
static QUOTA_EXHAUSTED: [Label; 1] = [Label::from_static_parts("outcome", "quota_exhausted")];
static COST_EXCEEDS_BURST: [Label; 1] = [Label::from_static_parts("outcome", "cost_exceeds_burst")];
static STORE_ERROR: [Label; 1] = [Label::from_static_parts("outcome", "store_error")];

/// The histogram keys, one per outcome.
static SECONDS: [Key; 5] = [
    Key::from_static_parts(DECISION_SECONDS, &ALLOWED),
    Key::from_static_parts(DECISION_SECONDS, &RATE_LIMITED),
    Key::from_static_parts(DECISION_SECONDS, &QUOTA_EXHAUSTED),
    Key::from_static_parts(DECISION_SECONDS, &COST_EXCEEDS_BURST),
    Key::from_static_parts(DECISION_SECONDS, &STORE_ERROR),
];

/// Every metric key of one plan, built once so a decision registers its
/// series by reference instead of building labels each time (the recorder
/// is looked up per call, so one installed later still sees everything).
#[derive(Debug)]
pub(crate) struct PlanKeys {
    allowed: Key,
    store_error: Key,
    /// Per policy: rate_limited, quota_exhausted, cost_exceeds_burst.
    rejected: Vec<[Key; 3]>,
    shadow: Vec<Key>,
    soft: Vec<Key>,
    escalation: [Key; 2],
    store_errors: Key,
}

fn shared(s: &Arc<str>) -> SharedString {
    SharedString::from(s.clone())
}

fn key(name: &'static str, labels: Vec<Label>) -> Key {
    Key::from_parts(name, labels)
}

impl PlanKeys {
    pub(crate) fn new(plan: &Arc<str>, policies: &[Arc<str>]) -> PlanKeys {
        let pl = || Label::new("plan", shared(plan));
        let decision = |policy: SharedString, outcome: &'static str| {
            key(
                DECISIONS,
                vec![
                    pl(),
                    Label::new("policy", policy),
                    Label::new("outcome", outcome),
                ],
            )
        };
        let none = || SharedString::const_str("none");
        let per = |name: &'static str, p: &Arc<str>| {
            key(name, vec![pl(), Label::new("policy", shared(p))])
        };
        PlanKeys {
            allowed: decision(none(), "allowed"),
            store_error: decision(none(), "store_error"),
            rejected: policies
                .iter()
                .map(|p| {
                    [
                        decision(shared(p), "rate_limited"),
                        decision(shared(p), "quota_exhausted"),
                        decision(shared(p), "cost_exceeds_burst"),
                    ]
                })
                .collect(),
            shadow: policies.iter().map(|p| per(SHADOW_REJECTIONS, p)).collect(),
            soft: policies.iter().map(|p| per(SOFT_LIMITS, p)).collect(),
            escalation: [
                key(ESCALATIONS, vec![pl(), Label::new("level", "extended")]),
                key(ESCALATIONS, vec![pl(), Label::new("level", "blocked")]),
            ],
            store_errors: key(STORE_ERRORS, vec![pl()]),
        }
    }
}

fn count(key: &Key) {
    metrics::with_recorder(|r| r.register_counter(key, &METADATA).increment(1));
}

pub(crate) fn decision(
    keys: &PlanKeys,
    policy: Option<usize>,
    outcome: OutcomeLabel,
    seconds: f64,
) {
    let (counter, slot) = match (outcome, policy) {
        (OutcomeLabel::Allowed, _) => (&keys.allowed, 0),
        (OutcomeLabel::RateLimited, Some(i)) => (&keys.rejected[i][0], 1),
        (OutcomeLabel::QuotaExhausted, Some(i)) => (&keys.rejected[i][1], 2),
        (OutcomeLabel::CostExceedsBurst, Some(i)) => (&keys.rejected[i][2], 3),
        _ => (&keys.store_error, 4),
    };
    metrics::with_recorder(|r| {
        r.register_counter(counter, &METADATA).increment(1);
        r.register_histogram(&SECONDS[slot], &METADATA)
            .record(seconds);
    });
}

pub(crate) fn shadow(keys: &PlanKeys, policy: usize) {
    count(&keys.shadow[policy]);
}

pub(crate) fn store_error(keys: &PlanKeys) {
    count(&keys.store_errors);
}

pub(crate) fn escalation(keys: &PlanKeys, level: crate::escalation::Level) {
    let i = match level {
        crate::escalation::Level::Extended => 0,
        crate::escalation::Level::Blocked => 1,
    };
    count(&keys.escalation[i]);
}

pub(crate) fn soft_limit(keys: &PlanKeys, policy: usize) {
    count(&keys.soft[policy]);
}
