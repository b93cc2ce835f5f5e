//! The value a check returns: everything the response headers, the problem
//! body and the metrics need, so the wire crate only formats it.

use smallvec::SmallVec;

use crate::clock::Nanos;
use crate::policy::PolicyKind;

/// One policy's state as the response should publish it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicyStatus {
    /// Whole units left (rounded down): after this request's charge when it
    /// was admitted, as things stand when it was denied.
    pub remaining: u64,
    /// Time until the policy is fully restored.
    pub reset_after: Nanos,
    /// This policy alone would have denied the request (possible with
    /// shadow policies and on denial).
    pub would_deny: bool,
}

impl PolicyStatus {
    /// Seconds until fully restored, rounded up (the IETF `t` parameter).
    pub fn reset_secs(&self) -> u64 {
        self.reset_after.as_secs_ceil()
    }
}

/// Why a request was turned away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Denial {
    /// Index of the policy that sets the wait (the longest wait of all
    /// denying policies).
    pub policy: usize,
    /// Whether that policy is a burst limit or a long quota.
    pub kind: PolicyKind,
    /// Time until the request would fit under every policy.
    pub retry_after: Nanos,
}

impl Denial {
    /// The wait in whole seconds, rounded up, at least 1 (`Retry-After`).
    pub fn retry_after_secs(&self) -> u64 {
        self.retry_after.as_secs_ceil().max(1)
    }
}

/// The outcome of a check.
///
/// Deliberately exhaustive: every caller must answer every outcome, so a
/// new one is a breaking change that the compiler points out everywhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted; every policy was charged.
    Allowed,
    /// Denied; nothing was charged.
    Denied(Denial),
    /// The cost is more than the policy can ever hold: no wait helps.
    CostExceedsBurst {
        /// Index of the policy too small for the cost.
        policy: usize,
        /// The request's cost.
        cost: u64,
    },
}

/// The answer to "may this key spend `cost` now?", per policy of its plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Allowed, denied, or never possible.
    pub outcome: Outcome,
    /// Per policy, in the plan's order.
    pub statuses: SmallVec<[PolicyStatus; 2]>,
}

impl Decision {
    /// Whether the request may go on.
    pub fn is_allowed(&self) -> bool {
        matches!(self.outcome, Outcome::Allowed)
    }
    /// The denial, if the request was denied for a wait.
    pub fn denial(&self) -> Option<&Denial> {
        match &self.outcome {
            Outcome::Denied(d) => Some(d),
            _ => None,
        }
    }
    /// Index of the policy that caused a rejection of either kind.
    pub fn rejecting_policy(&self) -> Option<usize> {
        match self.outcome {
            Outcome::Allowed => None,
            Outcome::Denied(d) => Some(d.policy),
            Outcome::CostExceedsBurst { policy, .. } => Some(policy),
        }
    }
}
