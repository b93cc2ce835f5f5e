//! Events the client raises, for tracing and for subscribed hooks.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::error::ClientError;

/// The pacing mode of a scope.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[non_exhaustive]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Nothing heard yet: one request probes, the others wait for it.
    Unseeded,
    /// The provider publishes its limits; the client mirrors them.
    Paced,
    /// The provider publishes nothing useful: conservative local pacing and
    /// exponential backoff.
    HeaderAbsent,
}

impl Mode {
    /// The mode's name.
    pub fn as_str(&self) -> &'static str {
        match self {
            Mode::Unseeded => "unseeded",
            Mode::Paced => "paced",
            Mode::HeaderAbsent => "header_absent",
        }
    }
}

/// Something the client did or noticed.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Event {
    /// A request was held back for `wait`.
    Wait {
        /// The scope.
        scope: String,
        /// How long.
        wait: Duration,
        /// Why: `pacing`, `pause`, `probe` or `retry`.
        reason: &'static str,
    },
    /// An attempt goes on the wire now (raised only when a hook is
    /// subscribed or a tracing subscriber wants debug events).
    Attempt {
        /// The scope.
        scope: String,
        /// 1 for the first attempt, 2 for the first retry, and so on.
        attempt: u32,
        /// The `Idempotency-Key` it carries, the same on every attempt.
        idempotency_key: Option<String>,
    },
    /// A failed attempt will be retried after `wait`.
    Retry {
        /// The scope.
        scope: String,
        /// Attempts made so far.
        attempt: u32,
        /// The `Idempotency-Key` the retry will carry again.
        idempotency_key: Option<String>,
        /// The wait before the next attempt.
        wait: Duration,
        /// The status that caused it (None for a network error).
        status: Option<u16>,
    },
    /// A call ended locally, without (another) request.
    Drop {
        /// The scope.
        scope: String,
        /// Why.
        error: ClientError,
    },
    /// A scope changed pacing mode.
    ModeChange {
        /// The scope.
        scope: String,
        /// Before.
        from: Mode,
        /// After.
        to: Mode,
    },
    /// Repeated 429s although the client obeyed the headers: the spacing
    /// of the scope was doubled. This is an alert.
    Escalated {
        /// The scope.
        scope: String,
        /// The spacing multiplier now in force.
        factor: u32,
    },
    /// A sustained run of successes halved the spacing multiplier.
    Restored {
        /// The scope.
        scope: String,
        /// The spacing multiplier now in force.
        factor: u32,
    },
}

/// A subscriber to [`Event`]s.
pub type Hook = Arc<dyn Fn(&Event) + Send + Sync>;

/// Whether a tracing subscriber wants the wait events [`trace`] writes.
pub(crate) fn waits_traced() -> bool {
    tracing::enabled!(tracing::Level::DEBUG)
}

pub(crate) fn trace(e: &Event) {
    match e {
        Event::Wait {
            scope,
            wait,
            reason,
        } => tracing::debug!(
            scope,
            wait_ms = wait.as_millis() as u64,
            reason,
            "paceline wait"
        ),
        Event::Attempt {
            scope,
            attempt,
            idempotency_key,
        } => tracing::debug!(
            scope,
            attempt,
            idempotency_key = idempotency_key.as_deref(),
            "paceline attempt"
        ),
        Event::Retry {
            scope,
            attempt,
            idempotency_key,
            wait,
            status,
        } => tracing::info!(
            scope,
            attempt,
            idempotency_key = idempotency_key.as_deref(),
            wait_ms = wait.as_millis() as u64,
            status,
            "paceline retry"
        ),
        Event::Drop { scope, error } => {
            tracing::info!(scope, kind = error.kind(), %error, "paceline drop")
        }
        Event::ModeChange { scope, from, to } => {
            tracing::info!(
                scope,
                from = from.as_str(),
                to = to.as_str(),
                "paceline mode change"
            )
        }
        Event::Escalated { scope, factor } => {
            tracing::warn!(
                scope,
                factor,
                "paceline escalated: repeated 429 despite obeying the headers"
            )
        }
        Event::Restored { scope, factor } => tracing::info!(scope, factor, "paceline restored"),
    }
}
