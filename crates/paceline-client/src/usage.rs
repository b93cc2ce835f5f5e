//! Seeding from the API's usage endpoint (`GET /v1/usage`).
//!
//! The first request of a scope otherwise goes alone, to learn the limits
//! from its response; a usage answer lets every worker start at once.
//!
//! The document is `paceline_wire::usage::Usage`, the type the server
//! writes. Accepted shape (extra fields are ignored; `q`/`quota`,
//! `w`/`window_s`, `r`/`remaining` are synonyms; `reset_at` is RFC 3339,
//! `reset_in_s` or `t` seconds):
//!
//! ```json
//! {"plan": "free", "limits": [
//!   {"name": "burst", "q": 20, "w": 2, "r": 7},
//!   {"name": "daily", "q": 10000, "w": 86400, "r": 2310, "reset_at": "2026-10-01T00:00:00Z"}]}
//! ```

use paceline_core::Nanos;
use paceline_wire::usage::{Usage, UsageLimit};

use crate::observe::PolicyObservation;

/// Why a usage body could not be read.
#[derive(Debug)]
pub struct UsageError(paceline_wire::usage::UsageError);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unreadable usage body: {}", self.0)
    }
}

impl std::error::Error for UsageError {}

/// Reads a usage body received at `now` into policies.
pub fn parse_usage(body: &[u8], now: Nanos) -> Result<Vec<PolicyObservation>, UsageError> {
    let u = Usage::from_slice(body).map_err(UsageError)?;
    Ok(u.limits.into_iter().map(|l| limit(l, now)).collect())
}

fn limit(l: UsageLimit, now: Nanos) -> PolicyObservation {
    let unit = l
        .unit
        .as_deref()
        .map(|u| crate::cost::unit_name(&paceline_wire::parse::Unit::from_name(u)))
        .unwrap_or_default();
    PolicyObservation {
        reset_in: l.reset_in(now),
        counts_requests: l.counts_requests(),
        unit,
        name: l.name,
        quota: l.q,
        window_s: l.w,
        remaining: l.r,
        per_endpoint: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_shiplane_usage_body() {
        let body = br#"{"plan":"free","limits":[{"name":"burst","q":20,"w":2,"r":7},
            {"name":"daily","q":10000,"w":86400,"r":2310,"reset_at":"2026-10-01T00:00:00Z"}]}"#;
        // 2026-09-30T18:00:00Z
        let now = Nanos::from_secs(1_790_791_200);
        let p = parse_usage(body, now).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].remaining, Some(7));
        assert_eq!(p[1].reset_in, Some(Nanos::from_secs(6 * 3600)));
        assert!(parse_usage(b"{", now).is_err());
    }
}
