//! Seeding from the API's usage endpoint (`GET /v1/usage`).
//!
//! The first request of a scope otherwise goes alone, to learn the limits
//! from its response; a usage answer lets every worker start at once.
//!
//! Accepted shape (extra fields are ignored; `q`/`quota`, `w`/`window_s`,
//! `r`/`remaining` are synonyms; `reset_at` is RFC 3339, `reset_in_s` or
//! `t` seconds):
//!
//! ```json
//! {"plan": "free", "limits": [
//!   {"name": "burst", "q": 20, "w": 2, "r": 7},
//!   {"name": "daily", "q": 10000, "w": 86400, "r": 2310, "reset_at": "2026-10-01T00:00:00Z"}]}
//! ```

use paceline_core::Nanos;
use serde::Deserialize;

use crate::observe::PolicyObservation;

#[derive(Deserialize)]
struct Usage {
    limits: Vec<Limit>,
}

#[derive(Deserialize)]
struct Limit {
    name: String,
    #[serde(alias = "quota")]
    q: Option<u64>,
    #[serde(alias = "window_s")]
    w: Option<u64>,
    #[serde(alias = "remaining")]
    r: Option<u64>,
    reset_at: Option<String>,
    #[serde(alias = "reset_in_s")]
    t: Option<f64>,
    #[serde(alias = "qu")]
    unit: Option<String>,
}

/// Why a usage body could not be read.
#[derive(Debug)]
pub struct UsageError(serde_json::Error);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unreadable usage body: {}", self.0)
    }
}

impl std::error::Error for UsageError {}

/// Reads a usage body received at `now` into policies.
pub fn parse_usage(body: &[u8], now: Nanos) -> Result<Vec<PolicyObservation>, UsageError> {
    let u: Usage = serde_json::from_slice(body).map_err(UsageError)?;
    Ok(u.limits.into_iter().map(|l| limit(l, now)).collect())
}

fn limit(l: Limit, now: Nanos) -> PolicyObservation {
    let reset_in = match (&l.reset_at, l.t) {
        (Some(at), _) => {
            paceline_wire::parse::time::parse_rfc3339(at).map(|t| t.saturating_sub(now))
        }
        (None, Some(t)) => Some(Nanos::from_secs_f64(t)),
        _ => None,
    };
    PolicyObservation {
        name: l.name,
        quota: l.q,
        window_s: l.w,
        remaining: l.r,
        reset_in,
        counts_requests: l.unit.as_deref().is_none_or(|u| u == "requests"),
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
