//! What a call can end in, other than a response.

use std::fmt;

use paceline_core::Nanos;

/// Why a call ended without a response the application should use.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientError {
    /// A long-window quota (for example a daily one) is used up: waiting
    /// helps only after `reset_at`. Never retried automatically.
    QuotaExceeded {
        /// The policy that ran out (`daily`), when the server named it.
        policy: String,
        /// When the quota resets (nanoseconds since the UNIX epoch).
        reset_at: Nanos,
    },
    /// The wait the server asked for is longer than the configured ceiling,
    /// so the client will not sleep it; try again after `until`.
    WaitTooLong {
        /// The earliest instant a request may go.
        until: Nanos,
    },
    /// The adaptive throttle dropped the request locally: most recent
    /// requests to this scope were rejected, so this one never left.
    Throttled {
        /// The drop probability at the time.
        probability_per_mille: u32,
    },
    /// The retry budget (a share of recent requests) is spent.
    BudgetExhausted {
        /// The status of the last response, if any.
        status: Option<u16>,
    },
    /// Every allowed attempt was made and failed.
    RetriesExhausted {
        /// Attempts made.
        attempts: u32,
        /// The status of the last response, if any.
        status: Option<u16>,
    },
    /// A network error that cannot be retried safely (a non-idempotent
    /// request without an idempotency key), or any non-transient one.
    Transport {
        /// What happened.
        message: String,
    },
    /// The request body cannot be sent again (a stream), and it is larger
    /// than the buffering cap, so a retry is impossible.
    BodyNotReplayable {
        /// The buffering cap in bytes.
        cap: usize,
    },
}

impl ClientError {
    /// Whether this is [`ClientError::QuotaExceeded`].
    pub fn is_quota_exceeded(&self) -> bool {
        matches!(self, ClientError::QuotaExceeded { .. })
    }
    /// Whether the request never left the client.
    pub fn is_local_drop(&self) -> bool {
        matches!(
            self,
            ClientError::Throttled { .. } | ClientError::WaitTooLong { .. }
        )
    }
    /// The instant after which trying again makes sense, when known.
    pub fn retry_at(&self) -> Option<Nanos> {
        match self {
            ClientError::QuotaExceeded { reset_at, .. } => Some(*reset_at),
            ClientError::WaitTooLong { until } => Some(*until),
            _ => None,
        }
    }
    /// A short stable name for the kind, used in events and summaries.
    pub fn kind(&self) -> &'static str {
        match self {
            ClientError::QuotaExceeded { .. } => "quota_exceeded",
            ClientError::WaitTooLong { .. } => "wait_too_long",
            ClientError::Throttled { .. } => "throttled",
            ClientError::BudgetExhausted { .. } => "budget_exhausted",
            ClientError::RetriesExhausted { .. } => "retries_exhausted",
            ClientError::Transport { .. } => "transport",
            ClientError::BodyNotReplayable { .. } => "body_not_replayable",
        }
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::QuotaExceeded { policy, reset_at } => write!(
                f,
                "quota {policy:?} exceeded; it resets at {}s after the epoch",
                reset_at.as_secs_ceil()
            ),
            ClientError::WaitTooLong { until } => write!(
                f,
                "the server asked to wait until {}s after the epoch, past the configured ceiling",
                until.as_secs_ceil()
            ),
            ClientError::Throttled {
                probability_per_mille,
            } => write!(
                f,
                "dropped locally by adaptive throttling (drop probability {}.{}%)",
                probability_per_mille / 10,
                probability_per_mille % 10
            ),
            ClientError::BudgetExhausted { status } => {
                write!(f, "retry budget spent (last status {status:?})")
            }
            ClientError::RetriesExhausted { attempts, status } => {
                write!(
                    f,
                    "gave up after {attempts} attempts (last status {status:?})"
                )
            }
            ClientError::Transport { message } => write!(f, "transport error: {message}"),
            ClientError::BodyNotReplayable { cap } => write!(
                f,
                "the request body is a stream larger than {cap} bytes, so it cannot be retried; \
                 send a buffered body or raise the buffering cap"
            ),
        }
    }
}

impl std::error::Error for ClientError {}
