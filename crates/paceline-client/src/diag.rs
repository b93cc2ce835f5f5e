//! The diagnostics snapshot: what the client knows and did, as data.

use std::collections::BTreeMap;

use paceline_core::Nanos;
use serde::Serialize;

use crate::budget::BudgetStats;
use crate::cost::REQUESTS;
use crate::event::Mode;
use crate::request::Attempt;
use crate::scope::Scope;

/// One mirrored policy.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PolicySnapshot {
    /// The policy name.
    pub name: String,
    /// The endpoint it applies to, when it is per endpoint.
    pub endpoint: Option<String>,
    /// Quota `q`, if published.
    pub quota: Option<u64>,
    /// Window `w` in seconds, if published.
    pub window_s: Option<u64>,
    /// Whole units the mirror thinks are left.
    pub available: Option<u64>,
    /// How the server runs the window, as far as its answers tell:
    /// `bucket` (refills continuously), `fixed` (restores all at once at
    /// the reset) or `window` (only remaining and reset known).
    pub window_kind: &'static str,
    /// What the policy counts: `requests`, `tokens`, `points`, … (see
    /// [`crate::cost`]).
    pub unit: String,
}

/// One unit other than requests that a scope's policies count.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct UnitSnapshot {
    /// The unit (`tokens`, `points`, `content-bytes`, …).
    pub unit: String,
    /// The mirrored policies counting it.
    pub policies: Vec<String>,
    /// Whole units the tightest of those policies has left, as the
    /// mirror sees it.
    pub available: Option<u64>,
    /// Units charged so far (stated amounts and estimates, retries
    /// included).
    pub charged: u64,
    /// Attempts that stated their amount.
    pub stated: u64,
    /// Attempts charged the estimate.
    pub estimated: u64,
    /// The running average of what a request spends, when anything was
    /// seen (stated amounts, and what answers showed was spent).
    pub estimate: Option<f64>,
    /// What a request without a stated amount is charged now.
    pub charge: u64,
}

/// One scope.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ScopeSnapshot {
    /// The scope name (authority or account).
    pub scope: String,
    /// The pacing mode.
    pub mode: Mode,
    /// The spacing multiplier from escalation (1 when not escalated).
    pub factor: u32,
    /// Header-absent spacing between requests, seconds.
    pub gap_s: f64,
    /// Seconds left of a pause every request of the scope obeys.
    pub paused_for_s: f64,
    /// The adaptive throttle's drop probability now.
    pub drop_probability: f64,
    /// Attempts on the wire.
    pub in_flight: usize,
    /// Attempts sent (first and retries).
    pub requests: u64,
    /// Retries sent.
    pub retries: u64,
    /// Attempts that never left the client.
    pub drops: u64,
    /// The mirrored policies.
    pub policies: Vec<PolicySnapshot>,
    /// Seconds since the last 429, if any.
    pub last_429_ago_s: Option<f64>,
    /// The last 429's headers.
    pub last_429_headers: Vec<(String, String)>,
    /// The last attempt sent.
    pub last_attempt: Option<Attempt>,
    /// The attempt that drew the last 429.
    pub last_429_attempt: Option<Attempt>,
    /// Per unit other than requests: what is left, charged and estimated.
    pub units: Vec<UnitSnapshot>,
}

impl ScopeSnapshot {
    pub(crate) fn of(s: &Scope, now: Nanos) -> Self {
        ScopeSnapshot {
            scope: s.name.clone(),
            mode: s.mode,
            factor: s.factor,
            gap_s: s.gap.as_secs_f64(),
            paused_for_s: s.pause_until.saturating_sub(now).as_secs_f64(),
            drop_probability: s.throttle.probability(now),
            in_flight: s.in_flight.len(),
            requests: s.requests,
            retries: s.retries,
            drops: s.drops,
            policies: s
                .all_mirrors()
                .map(|m| PolicySnapshot {
                    name: m.name.clone(),
                    endpoint: m.endpoint.clone(),
                    quota: m.quota,
                    window_s: m.window.map(|w| w.as_secs_floor()),
                    available: m.available(now),
                    window_kind: m.kind(),
                    unit: m.unit.clone(),
                })
                .collect(),
            last_429_ago_s: s
                .last_429
                .as_ref()
                .map(|(t, _)| now.saturating_sub(*t).as_secs_f64()),
            last_429_headers: s
                .last_429
                .as_ref()
                .map(|(_, h)| h.clone())
                .unwrap_or_default(),
            last_attempt: attempt(s, &s.last_attempt),
            last_429_attempt: attempt(s, &s.last_429_attempt),
            units: units(s, now),
        }
    }
}

fn units(s: &Scope, now: Nanos) -> Vec<UnitSnapshot> {
    let mut out: Vec<UnitSnapshot> = Vec::new();
    for m in s.all_mirrors().filter(|m| m.unit != REQUESTS) {
        let left = m.available(now);
        match out.iter_mut().find(|u| u.unit == m.unit) {
            Some(u) => {
                u.policies.push(m.name.clone());
                u.available = match (u.available, left) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            None => {
                let stat = s.units.get(&m.unit).copied().unwrap_or_default();
                out.push(UnitSnapshot {
                    unit: m.unit.clone(),
                    policies: vec![m.name.clone()],
                    available: left,
                    charged: stat.charged,
                    stated: stat.stated,
                    estimated: stat.estimated,
                    estimate: stat.estimate.mean(),
                    charge: stat.estimate.charge(),
                })
            }
        }
    }
    out.sort_by(|a, b| a.unit.cmp(&b.unit));
    out
}

fn attempt(s: &Scope, a: &Option<(u32, Option<String>)>) -> Option<Attempt> {
    a.as_ref().map(|(number, key)| Attempt {
        scope: s.name.clone(),
        number: *number,
        idempotency_key: key.clone(),
    })
}

/// Everything the client knows and did, at one instant.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Snapshot {
    /// When (seconds since the UNIX epoch on the client's clock).
    pub at_s: f64,
    /// Calls started.
    pub calls: u64,
    /// Attempts sent.
    pub requests: u64,
    /// Retries scheduled.
    pub retries: u64,
    /// Attempts that never left the client (adaptive throttle, a wait over
    /// the ceiling, a quota known to be spent).
    pub local_drops: u64,
    /// Calls that ended in an error after a response or a network error
    /// (quota exceeded, retries or budget used up, a wait over the ceiling,
    /// a transport error).
    pub gave_up: u64,
    /// Network errors.
    pub transport_errors: u64,
    /// Responses by status (in JSON, an object keyed by the status).
    pub by_status: BTreeMap<u16, u64>,
    /// Attempts per second over the last minute.
    pub request_rate_per_s: f64,
    /// Retries per second over the last minute.
    pub retry_rate_per_s: f64,
    /// The retry budget.
    pub budget: BudgetStats,
    /// Per scope.
    pub scopes: Vec<ScopeSnapshot>,
}
