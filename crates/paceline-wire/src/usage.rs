//! The usage document (`GET /v1/usage`): a plan, its limits, what is left
//! and when each is restored.
//!
//! Why here: the server layer writes it and the client SDK reads it to
//! seed its view before the first request; one type keeps the two in step.
//!
//! What the server writes (`reset_at` for every limit, RFC 3339, rounded
//! up to the second): for a window (fixed, or a calendar day), the end of
//! the current window, used or not; for a bucket, a sliding window or a
//! concurrency cap, the instant it is full again (now, when it is full).
//!
//! ```json
//! {"plan": "free", "limits": [
//!   {"name": "burst", "q": 20, "w": 2, "r": 7, "reset_at": "2026-09-30T18:00:02Z"},
//!   {"name": "daily", "q": 10000, "w": 86400, "r": 2310, "reset_at": "2026-10-01T00:00:00Z"}]}
//! ```
//!
//! What a reader accepts besides: extra fields (ignored), no `plan`,
//! `quota`/`window_s`/`remaining` for `q`/`w`/`r`, a reset as `t` or
//! `reset_in_s` seconds, and a unit as `unit` or `qu`.
//!
//! ```
//! use paceline_core::Nanos;
//! use paceline_wire::usage::Usage;
//!
//! let body = br#"{"limits":[{"name":"burst","quota":20,"remaining":7,"reset_in_s":1.5}]}"#;
//! let u = Usage::from_slice(body).unwrap();
//! assert_eq!(u.limits[0].q, Some(20));
//! assert_eq!(u.limits[0].reset_in(Nanos::ZERO), Some(Nanos::from_millis(1500)));
//! ```

use paceline_core::{Algorithm, Decision, Nanos, Plan, Policy, PolicyStatus};
use serde::{Deserialize, Deserializer, Serialize};

use crate::time::{format_rfc3339_ceil, parse_rfc3339};

/// The usage document.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// The plan's name (a reader ignores anything but a string here).
    #[serde(
        default,
        deserialize_with = "lenient_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub plan: Option<String>,
    /// The plan's limits, in plan order.
    pub limits: Vec<UsageLimit>,
}

/// One limit of the usage document.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct UsageLimit {
    /// The policy's name.
    pub name: String,
    /// The quota.
    #[serde(alias = "quota", skip_serializing_if = "Option::is_none")]
    pub q: Option<u64>,
    /// The window in seconds.
    #[serde(alias = "window_s", skip_serializing_if = "Option::is_none")]
    pub w: Option<u64>,
    /// Whole units left.
    #[serde(alias = "remaining", skip_serializing_if = "Option::is_none")]
    pub r: Option<u64>,
    /// When the limit is restored, RFC 3339: the end of the current window,
    /// or the instant a bucket is full again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reset_at: Option<String>,
    /// Seconds until the limit resets (when `reset_at` is not given).
    #[serde(alias = "reset_in_s", skip_serializing_if = "Option::is_none")]
    pub t: Option<f64>,
    /// What the limit counts (`requests` when absent).
    #[serde(alias = "qu", skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
}

fn lenient_string<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let v = serde_json::Value::deserialize(d)?;
    Ok(v.as_str().map(str::to_string))
}

/// Why a usage body could not be read.
pub type UsageError = serde_json::Error;

impl Usage {
    /// The document for `plan` given the decision `d` (of a zero-cost
    /// check) made at `now`.
    pub fn from_decision(plan: &Plan, d: &Decision, now: Nanos) -> Usage {
        let limits = plan
            .policies()
            .iter()
            .zip(&d.statuses)
            .map(|(p, s)| UsageLimit {
                name: p.name().to_string(),
                q: Some(p.quota()),
                w: Some(p.window_s()),
                r: Some(s.remaining),
                reset_at: Some(format_rfc3339_ceil(reset_instant(p, s, now))),
                t: None,
                unit: None,
            })
            .collect();
        Usage {
            plan: Some(plan.name().to_string()),
            limits,
        }
    }

    /// Reads a usage body.
    pub fn from_slice(body: &[u8]) -> Result<Usage, UsageError> {
        serde_json::from_slice(body)
    }

    /// The body as compact JSON.
    pub fn to_vec(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// When `p` is restored, as of `now`: a window at the end of the current
/// window (whatever was used of it, so a fresh daily quota says the next
/// reset), anything else when it is full again.
fn reset_instant(p: &Policy, s: &PolicyStatus, now: Nanos) -> Nanos {
    match p.algorithm() {
        Algorithm::FixedWindow { offset_s } => {
            let w = u128::from(p.window_s()) * 1_000_000_000;
            let off = u128::from(offset_s) * 1_000_000_000 % w.max(1);
            let t = u128::from(now.as_u64());
            // windows are [off + k*w, off + (k+1)*w)
            let end = ((t + w - off) / w.max(1)) * w + off;
            Nanos::new(u64::try_from(end).unwrap_or(u64::MAX))
        }
        _ => now.saturating_add(s.reset_after),
    }
}

impl UsageLimit {
    /// The wait from `now` until the limit resets: `reset_at` when given
    /// (`None` when it is not a date), else `t`.
    pub fn reset_in(&self, now: Nanos) -> Option<Nanos> {
        match (&self.reset_at, self.t) {
            (Some(at), _) => parse_rfc3339(at).map(|t| t.saturating_sub(now)),
            (None, Some(t)) => Some(Nanos::from_secs_f64(t)),
            _ => None,
        }
    }

    /// Whether the limit counts requests (no unit, or `requests`).
    pub fn counts_requests(&self) -> bool {
        self.unit.as_deref().is_none_or(|u| u == "requests")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use paceline_core::Policy;

    #[test]
    fn the_server_document_is_exactly_this() {
        let plan = Plan::new(
            "free",
            vec![
                Policy::token_bucket("burst", 20, 2).unwrap(),
                Policy::daily("daily", 10_000).unwrap(),
            ],
        )
        .unwrap();
        // 2026-09-30T18:00:00.5Z
        let now = Nanos::new(1_790_791_200_500_000_000);
        let mut d = Decision {
            outcome: paceline_core::Outcome::Allowed,
            statuses: Default::default(),
        };
        for (remaining, reset_after) in [(7, 1_000_000_000), (2310, 21_599_000_000_000)] {
            d.statuses.push(paceline_core::PolicyStatus {
                remaining,
                reset_after: Nanos::new(reset_after),
                would_deny: false,
            });
        }
        let doc = Usage::from_decision(&plan, &d, now);
        assert_eq!(
            String::from_utf8(doc.to_vec()).unwrap(),
            r#"{"plan":"free","limits":[{"name":"burst","q":20,"w":2,"r":7,"reset_at":"2026-09-30T18:00:02Z"},{"name":"daily","q":10000,"w":86400,"r":2310,"reset_at":"2026-10-01T00:00:00Z"}]}"#
        );
        assert_eq!(Usage::from_slice(&doc.to_vec()).unwrap(), doc);
    }

    #[test]
    fn every_limit_says_when_it_is_restored_fresh_used_or_spent() {
        use paceline_core::check_words;
        let plan = Plan::new(
            "free",
            vec![
                Policy::token_bucket("burst", 20, 2).unwrap(),
                Policy::daily("daily", 3).unwrap(),
                Policy::fixed_window("minute", 100, 60).unwrap(),
            ],
        )
        .unwrap();
        // 2026-09-30T18:40:00.25Z
        let now = Nanos::new(1_790_793_600_250_000_000);
        let mut w = vec![0; plan.state_words()];
        let at = |d: &Decision, t: Nanos| {
            let u = Usage::from_decision(&plan, d, t);
            u.limits
                .iter()
                .map(|l| l.reset_at.clone().expect("every limit has reset_at"))
                .collect::<Vec<_>>()
        };
        // fresh: the bucket is full now, the windows end where they end
        let (fresh, _) = check_words(&plan, &mut w, now, 0);
        assert_eq!(
            at(&fresh, now),
            [
                "2026-09-30T18:40:01Z",
                "2026-10-01T00:00:00Z",
                "2026-09-30T18:41:00Z"
            ]
        );
        // partly used: 2 of 3 today, 2 tokens out of the bucket (0.2 s)
        check_words(&plan, &mut w, now, 2);
        let (used, _) = check_words(&plan, &mut w, now, 0);
        assert_eq!(
            at(&used, now),
            [
                "2026-09-30T18:40:01Z",
                "2026-10-01T00:00:00Z",
                "2026-09-30T18:41:00Z"
            ]
        );
        // spent today
        check_words(&plan, &mut w, now, 1);
        let (spent, _) = check_words(&plan, &mut w, now, 1);
        assert!(!spent.is_allowed());
        assert_eq!(at(&spent, now)[1], "2026-10-01T00:00:00Z");
        // a window that resets at 06:00 ends at the next 06:00
        let six = Plan::new(
            "p",
            vec![Policy::new(
                "daily",
                Algorithm::FixedWindow { offset_s: 6 * 3600 },
                5,
                86_400,
            )
            .unwrap()],
        )
        .unwrap();
        let mut w = vec![0; six.state_words()];
        let (d, _) = check_words(&six, &mut w, now, 0);
        let u = Usage::from_decision(&six, &d, now);
        assert_eq!(
            u.limits[0].reset_at.as_deref(),
            Some("2026-10-01T06:00:00Z")
        );
    }

    #[test]
    fn a_reader_takes_the_synonyms_and_ignores_a_strange_plan() {
        let body = br#"{"plan":7,"limits":[{"name":"up","window_s":60,"qu":"content-bytes","t":2,"x":1}]}"#;
        let u = Usage::from_slice(body).unwrap();
        assert_eq!(u.plan, None);
        assert_eq!(u.limits[0].w, Some(60));
        assert!(!u.limits[0].counts_requests());
        assert_eq!(u.limits[0].reset_in(Nanos::ZERO), Some(Nanos::from_secs(2)));
        assert!(Usage::from_slice(b"{").is_err());
        assert!(Usage::from_slice(br#"{"plan":"p"}"#).is_err());
    }
}
