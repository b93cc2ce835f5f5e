//! The gateway's metrics, and a Prometheus endpoint for them and for the
//! rate limiter's.
//!
//! | name | kind | labels |
//! |---|---|---|
//! | `paceline_gateway_shed_total` | counter | `criticality`, `reason` (`in_flight`, `rate`) |
//! | `paceline_gateway_upstream_seconds` | histogram | — |
//! | `paceline_gateway_upstream_errors_total` | counter | `kind` (`connect`, `request`, `timeout`, `body_idle`) |
//! | `paceline_gateway_reloads_total` | counter | `result` (`applied`, `refused`) |
//! | `paceline_gateway_request_body_deadlines_total` | counter | `deadline` (`total`, `rate`) |
//! | `paceline_gateway_intake_refused_total` | counter | `reason` (`receiving`, `memory`, `idle`) |
//! | `paceline_gateway_tls_handshakes_total` | counter | `outcome` (`ok`, `failed`, `deadline`, `displaced`, `memory`) |
//! | `paceline_gateway_key_lookups_total` | counter | `outcome` (`found`, `not_found`, `stale`, `unavailable`) |
//! | `paceline_gateway_global_refused_total` | counter | `reason` (`limit`, `store`) |
//! | `paceline_gateway_global_given_back_total` | counter | — |
//!
//! plus every series of [`paceline_server::telemetry`].

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// Requests shed, by criticality and reason.
pub const SHED: &str = "paceline_gateway_shed_total";
/// Time to the upstream's response head.
pub const UPSTREAM_SECONDS: &str = "paceline_gateway_upstream_seconds";
/// Upstream failures, by kind.
pub const UPSTREAM_ERRORS: &str = "paceline_gateway_upstream_errors_total";
/// Configuration reloads, by result.
pub const RELOADS: &str = "paceline_gateway_reloads_total";
/// Request bodies cut off by a deadline, by deadline.
pub const BODY_DEADLINES: &str = "paceline_gateway_request_body_deadlines_total";
/// Requests refused by the body intake, by reason.
pub const INTAKE_REFUSED: &str = "paceline_gateway_intake_refused_total";

/// Keys looked up in Redis (`[gateway.keys_redis]`), by outcome.
pub const KEY_LOOKUPS: &str = "paceline_gateway_key_lookups_total";

/// Requests the global plan refused (`[gateway] global_plan`), by reason:
/// its limit, or a store failure under `fail = "closed"`.
pub const GLOBAL_REFUSED: &str = "paceline_gateway_global_refused_total";

pub(crate) fn global_refused(reason: &'static str) {
    metrics::counter!(GLOBAL_REFUSED, "reason" => reason).increment(1);
}

/// Charges given back to the global plan: requests it passed that never
/// reached the upstream (refused or shed on the way, never sent, or
/// answered by the idempotency layer: a replay, a refused key).
pub const GLOBAL_GIVEN_BACK: &str = "paceline_gateway_global_given_back_total";

pub(crate) fn global_given_back() {
    metrics::counter!(GLOBAL_GIVEN_BACK).increment(1);
}

/// TLS handshakes with clients, by outcome.
pub const TLS_HANDSHAKES: &str = "paceline_gateway_tls_handshakes_total";

pub(crate) fn tls_handshake(outcome: &'static str) {
    metrics::counter!(TLS_HANDSHAKES, "outcome" => outcome).increment(1);
}

pub(crate) fn request_body_deadline(b: crate::intake::Breach) {
    let which = match b {
        crate::intake::Breach::Total => "total",
        crate::intake::Breach::Slow => "rate",
    };
    metrics::counter!(BODY_DEADLINES, "deadline" => which).increment(1);
}

pub(crate) fn intake_refused(reason: &'static str) {
    metrics::counter!(INTAKE_REFUSED, "reason" => reason).increment(1);
}

pub(crate) fn upstream_latency(d: Duration) {
    metrics::histogram!(UPSTREAM_SECONDS).record(d.as_secs_f64());
}

pub(crate) fn upstream_error(kind: &'static str) {
    metrics::counter!(UPSTREAM_ERRORS, "kind" => kind).increment(1);
}

pub(crate) fn reload(applied: bool) {
    let result = if applied { "applied" } else { "refused" };
    metrics::counter!(RELOADS, "result" => result).increment(1);
}

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the Prometheus recorder for this process (once) and returns
/// its handle; `None` when another recorder was installed first.
pub fn prometheus() -> Option<PrometheusHandle> {
    HANDLE
        .get_or_init(|| PrometheusBuilder::new().install_recorder().ok())
        .clone()
}
