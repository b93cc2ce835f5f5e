//! Soft limits: a warning before the hard stop.
//!
//! Why: a quota that runs out without notice stops a merchant's business
//! for the rest of the window. From a configurable share of a quota (80% by
//! default) every admitted response names the policy and the use in a
//! `RateLimit-Warning` field, and a hook (an email, a webhook) fires once per
//! key per window. Only long-window quotas warn; a burst refills in seconds.

use std::fmt;
use std::sync::Arc;

use paceline_core::{Nanos, PolicyKind};

use crate::identity::KeyHash;
use crate::state::{BoundedMap, Expiring};

/// The response field that carries a soft-limit warning, as a structured
/// field list: `"daily";used=8000;q=10000`.
pub const WARNING_HEADER: &str = "ratelimit-warning";

/// What a soft-limit hook is told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SoftLimitEvent {
    /// The key's plan.
    pub plan: String,
    /// The policy past its threshold.
    pub policy: String,
    /// A fingerprint of the key (never the key itself).
    pub key_hash: KeyHash,
    /// Units used in this window.
    pub used: u64,
    /// The policy's quota.
    pub quota: u64,
    /// When the window resets.
    pub window_ends: Nanos,
}

/// Called once per key, policy and window when use crosses the threshold.
/// It runs on the request path: hand slow work (a webhook) to a queue.
#[derive(Clone)]
pub struct SoftLimitHook(pub(crate) Arc<dyn Fn(&SoftLimitEvent) + Send + Sync>);

impl SoftLimitHook {
    /// Wraps a callback.
    pub fn new(f: impl Fn(&SoftLimitEvent) + Send + Sync + 'static) -> Self {
        SoftLimitHook(Arc::new(f))
    }
}

impl fmt::Debug for SoftLimitHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SoftLimitHook")
    }
}

#[derive(Default)]
struct Mark {
    window_ends: u64,
}

impl Expiring for Mark {
    fn expires(&self) -> u64 {
        self.window_ends
    }
}

pub(crate) struct SoftLimits {
    /// Threshold in parts per million of the quota.
    ppm: u64,
    marks: BoundedMap<Mark>,
}

impl SoftLimits {
    pub(crate) fn new(threshold: f64, max_keys: usize) -> Self {
        SoftLimits {
            ppm: (threshold * 1e6).round() as u64,
            marks: BoundedMap::new(max_keys),
        }
    }

    /// Whether `used` of `quota` is past the threshold for a policy of `kind`.
    pub(crate) fn past(&self, kind: PolicyKind, used: u64, quota: u64) -> bool {
        kind == PolicyKind::Quota
            && self.ppm <= 1_000_000
            && u128::from(used) * 1_000_000 >= u128::from(quota) * u128::from(self.ppm)
    }

    /// Marks the key's window as warned; true only the first time per window.
    pub(crate) fn first_in_window(
        &self,
        key: KeyHash,
        policy: usize,
        now: Nanos,
        window_ends: Nanos,
    ) -> bool {
        let id = key.0 ^ (policy as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.marks
            .with(id, now.as_u64(), |m| {
                if m.window_ends > now.as_u64() {
                    false
                } else {
                    m.window_ends = window_ends.as_u64();
                    true
                }
            })
            .unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threshold_and_once_per_window() {
        let s = SoftLimits::new(0.8, 1000);
        assert!(!s.past(PolicyKind::Quota, 7_999, 10_000));
        assert!(s.past(PolicyKind::Quota, 8_000, 10_000));
        assert!(!s.past(PolicyKind::Burst, 20, 20));
        let k = KeyHash::of("k");
        let now = Nanos::from_secs(100);
        let end = Nanos::from_secs(200);
        assert!(s.first_in_window(k, 1, now, end));
        assert!(!s.first_in_window(k, 1, Nanos::from_secs(150), end));
        assert!(s.first_in_window(k, 0, now, end));
        assert!(s.first_in_window(k, 1, end, Nanos::from_secs(300)));
    }

    #[test]
    fn disabled_above_one() {
        let s = SoftLimits::new(1.5, 10);
        assert!(!s.past(PolicyKind::Quota, 10, 10));
    }
}
