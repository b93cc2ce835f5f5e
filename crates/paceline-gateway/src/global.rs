//! One limit on everything passed to the upstream, counted once for every
//! gateway on the store (`[gateway] global_plan`).
//!
//! Why: a key's plan bounds what one client may send; it does not bound
//! what the upstream receives from all clients together ("at most 5,000
//! requests a second reach the API, from all gateways"). The plan named
//! by `global_plan` is charged for each request the limiter let through,
//! under one key shared by every gateway on the store, so on Redis the
//! instances count together. Leased (`share = "leased"`), the instances
//! take slices of it and decide almost every request without a round
//! trip, within the stated overshoot bound.
//!
//! Why after the key's own limit: a request its key's plan refuses never
//! reaches the upstream, so it must not spend the upstream's budget; a
//! flood of over-limit requests from one client would otherwise starve
//! everyone else. A request the global plan refuses is answered `503
//! overloaded` with the plan's wait as `Retry-After`, before its body is
//! read, and its key's charge is given back (it is marked shed).
//!
//! A store failure follows the plan's policies: fail open (the default)
//! lets the request through, `fail = "closed"` refuses it.
//!
//! A request the plan passed that then goes no further gets its charge
//! back (`admitted.rs`): refused or shed on the way, never sent (no
//! upstream connection could be had), or answered by the idempotency
//! layer itself (a replay of a stored answer, a refused key). Without
//! this a client could spend the upstream's budget for everyone by
//! replaying one stored answer, which costs the upstream nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::Response;
use paceline_core::{Cost, Decision, FailMode, Nanos, Plan, Store, StoreError};
use parking_lot::RwLock;

use crate::server::GatewayLimiter;
use crate::shed::CurrentLimits;

/// The key the global plan is counted under, the same on every gateway.
pub const GLOBAL_KEY: &str = "paceline:global";

/// The global plan in force, if any; shared by the connections and
/// replaced on reload.
#[derive(Default)]
pub(crate) struct GlobalLimit {
    on: AtomicBool,
    plan: RwLock<Option<Plan>>,
}

/// What the global plan says of one request.
pub(crate) enum Said {
    /// Pass it on.
    Pass,
    /// Refuse it, with this answer.
    Refuse(Response<Bytes>),
}

impl GlobalLimit {
    pub(crate) fn new(plan: Option<Plan>) -> Arc<GlobalLimit> {
        let g = Arc::new(GlobalLimit::default());
        g.set(plan);
        g
    }

    /// Puts `plan` in force (`None`: no global limit).
    pub(crate) fn set(&self, plan: Option<Plan>) {
        let mut p = self.plan.write();
        self.on.store(plan.is_some(), Ordering::Release);
        *p = plan;
    }

    /// The plan in force; one load when there is none.
    #[inline]
    pub(crate) fn plan(&self) -> Option<Plan> {
        if !self.on.load(Ordering::Acquire) {
            return None;
        }
        self.plan.read().clone()
    }
}

/// Charges one request to the global plan if the store can answer at
/// once (the memory store; a leased slice), `None` when it must be asked.
pub(crate) fn check_now(
    limiter: &GatewayLimiter,
    plan: &Plan,
    now: Nanos,
    limits: &CurrentLimits,
    close: bool,
) -> Option<Said> {
    let r = limiter
        .store()
        .check_local(plan, GLOBAL_KEY, Cost::requests(1), now)?;
    Some(said(plan, r, limits, close))
}

/// Charges one request to the global plan, asking the store.
pub(crate) async fn check_later(
    limiter: &GatewayLimiter,
    plan: &Plan,
    now: Nanos,
    limits: &CurrentLimits,
    close: bool,
) -> Said {
    let r = limiter
        .store()
        .check_cost(plan, GLOBAL_KEY, Cost::requests(1), now)
        .await;
    said(plan, r, limits, close)
}

/// Gives back the charge of a request the global plan passed at
/// `charged` and which then never reached the upstream (see
/// `admitted.rs`). A store that fails to take it back keeps it, as a
/// refund that fails does for a key.
pub(crate) async fn give_back(limiter: &GatewayLimiter, plan: &Plan, charged: Nanos) {
    let now = limiter.clock().now();
    let given = limiter
        .store()
        .refund(plan, GLOBAL_KEY, Cost::requests(1), charged, now)
        .await;
    match given {
        Ok(()) => crate::metrics::global_given_back(),
        Err(e) => tracing::warn!(error = %e, "global limit: giving a charge back failed"),
    }
}

/// What the store's answer means; the limits in force (for the problem
/// base) are read only for a refusal.
fn said(plan: &Plan, r: Result<Decision, StoreError>, limits: &CurrentLimits, close: bool) -> Said {
    let base = || limits().problem_base().to_string();
    match r {
        Ok(d) if d.is_allowed() => Said::Pass,
        Ok(d) => {
            let wait = d.denial().map_or(1, |den| den.retry_after_secs());
            crate::metrics::global_refused("limit");
            Said::Refuse(crate::shed::overloaded(&base(), wait, close))
        }
        Err(e) => {
            let closed = plan
                .policies()
                .iter()
                .any(|p| !p.is_shadow() && p.fail_mode() == FailMode::Closed);
            tracing::warn!(error = %e, closed, "global limit: store failed");
            match closed {
                true => {
                    crate::metrics::global_refused("store");
                    Said::Refuse(crate::shed::overloaded(&base(), 1, close))
                }
                false => Said::Pass,
            }
        }
    }
}
