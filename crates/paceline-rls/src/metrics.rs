//! The service's metrics: envoyproxy/ratelimit's per-rule counters as
//! labelled Prometheus series, through the `metrics` facade (exported by
//! whatever recorder the process installs: `paceline rls` serves the
//! gateway's `/metrics` listener).
//!
//! | name | labels | counts |
//! |---|---|---|
//! | `ratelimit_service_rate_limit_total_hits` | `domain`, `key1` | hits (`hits_addend`) on a rule |
//! | `ratelimit_service_rate_limit_over_limit` | `domain`, `key1` | hits on the rule that refused the request |
//! | `ratelimit_service_rate_limit_near_limit` | `domain`, `key1` | admitted hits past 80% of the rule's limit |
//! | `ratelimit_service_rate_limit_within_limit` | `domain`, `key1` | admitted hits |
//! | `ratelimit_service_rate_limit_shadow_mode` | `domain`, `key1` | hits a shadow rule would have refused |
//! | `paceline_rls_store_errors_total` | `domain` | decisions the store did not answer in time |
//!
//! `key1` is envoyproxy/ratelimit's key: the descriptor path, `key_value`
//! where the configuration names a value (and the request's value under
//! `detailed_metric` or `value_to_metric`), levels joined by `.`.

/// Hits on a rule.
pub const TOTAL_HITS: &str = "ratelimit_service_rate_limit_total_hits";
/// Hits on the rule that refused a request.
pub const OVER_LIMIT: &str = "ratelimit_service_rate_limit_over_limit";
/// Admitted hits past 80% of a rule's limit.
pub const NEAR_LIMIT: &str = "ratelimit_service_rate_limit_near_limit";
/// Admitted hits.
pub const WITHIN_LIMIT: &str = "ratelimit_service_rate_limit_within_limit";
/// Hits a shadow rule would have refused.
pub const SHADOW_MODE: &str = "ratelimit_service_rate_limit_shadow_mode";
/// Decisions the store did not answer.
pub const STORE_ERRORS: &str = "paceline_rls_store_errors_total";

/// How one rule took one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Took {
    /// Admitted (and charged); `near`: past 80% of the limit after it.
    Within { near: bool },
    /// This rule refused the request.
    Over,
    /// A shadow rule that would have refused it.
    Shadow,
    /// Not decided (another rule refused first, or the store failed).
    Hit,
}

pub(crate) fn record(domain: &str, key: &str, hits: u64, took: Took) {
    let labels = [("domain", domain.to_string()), ("key1", key.to_string())];
    metrics::counter!(TOTAL_HITS, &labels).increment(hits);
    let more = match took {
        Took::Within { near: false } => &[WITHIN_LIMIT][..],
        Took::Within { near: true } => &[WITHIN_LIMIT, NEAR_LIMIT][..],
        Took::Over => &[OVER_LIMIT][..],
        Took::Shadow => &[SHADOW_MODE, WITHIN_LIMIT][..],
        Took::Hit => &[][..],
    };
    for name in more {
        metrics::counter!(*name, &labels).increment(hits);
    }
}

pub(crate) fn store_error(domain: &str) {
    metrics::counter!(STORE_ERRORS, "domain" => domain.to_string()).increment(1);
}
