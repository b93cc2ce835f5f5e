//! What a call can end in, other than a response.

use std::fmt;
use std::time::SystemTime;

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
        /// When the quota resets, on the client's clock.
        reset_at: SystemTime,
    },
    /// The wait the server asked for (or a window it published that ran
    /// out) lasts past the configured ceiling (`max_wait`), so the client
    /// neither sleeps it nor shortens it: the call fails at once, and every
    /// call to the same scope fails the same way until `until`. Try again
    /// after `until`.
    WaitTooLong {
        /// The earliest instant a request may go, on the client's clock.
        until: SystemTime,
        /// The policy that ran out, when the server named it (the problem
        /// body's `limit`, or the exhausted window resetting last).
        policy: Option<String>,
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
    /// The request's stated cost in one unit is more than a policy the
    /// server publishes can ever hold (1,200 tokens against a window of
    /// 1,000): no wait can make it fit. Split the request. The call ends
    /// before anything is sent.
    CostExceedsQuota {
        /// The policy.
        policy: String,
        /// The unit it counts (`tokens`, `points`, …).
        unit: String,
        /// The amount the request states.
        amount: u64,
        /// The policy's quota.
        quota: u64,
    },
    /// The adapter was asked again to send a request whose 429 or 503 it
    /// had already answered: another retrying layer (such as
    /// `reqwest-retry`) wraps it, and every retry of that layer would run
    /// all of the SDK's retries again. Keep one retrying layer.
    NestedRetry {
        /// The status the SDK handed back before.
        status: u16,
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
            ClientError::Throttled { .. }
                | ClientError::WaitTooLong { .. }
                | ClientError::CostExceedsQuota { .. }
        )
    }
    /// The instant after which trying again makes sense, when known.
    pub fn retry_at(&self) -> Option<SystemTime> {
        match self {
            ClientError::QuotaExceeded { reset_at, .. } => Some(*reset_at),
            ClientError::WaitTooLong { until, .. } => Some(*until),
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
            ClientError::NestedRetry { .. } => "nested_retry",
            ClientError::CostExceedsQuota { .. } => "cost_exceeds_quota",
        }
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::QuotaExceeded { policy, reset_at } => write!(
                f,
                "quota {policy:?} exceeded; it resets at {}",
                Utc(*reset_at)
            ),
            ClientError::WaitTooLong {
                until,
                policy: None,
            } => write!(
                f,
                "the server asked to wait until {}, past the configured ceiling",
                Utc(*until)
            ),
            ClientError::WaitTooLong {
                until,
                policy: Some(p),
            } => write!(
                f,
                "the server asked to wait until {} for {p:?}, past the configured ceiling",
                Utc(*until)
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
                write!(f, "retry budget spent ({})", LastStatus(*status))
            }
            ClientError::RetriesExhausted { attempts, status } => {
                write!(
                    f,
                    "gave up after {attempts} attempts ({})",
                    LastStatus(*status)
                )
            }
            ClientError::Transport { message } => write!(f, "transport error: {message}"),
            ClientError::BodyNotReplayable { cap } => write!(
                f,
                "the request body is a stream larger than {cap} bytes, so it cannot be retried; \
                 send a buffered body or raise the buffering cap"
            ),
            ClientError::CostExceedsQuota {
                policy,
                unit,
                amount,
                quota,
            } => write!(
                f,
                "the request costs {amount} {unit}, more than policy {policy:?} can ever hold                  ({quota}); split it"
            ),
            ClientError::NestedRetry { status } => write!(
                f,
                "another retrying layer (such as reqwest-retry) wraps paceline's and retried a \
                 {status} paceline had already retried, which multiplies the retries; remove \
                 it and let paceline retry"
            ),
        }
    }
}

impl std::error::Error for ClientError {}

/// `last status 429`, or `no response` after a network error.
struct LastStatus(Option<u16>);

impl fmt::Display for LastStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(s) => write!(f, "last status {s}"),
            None => f.write_str("no response"),
        }
    }
}

/// An instant as RFC 3339 in UTC, to the second (rounded up: the earliest
/// whole second at which trying again makes sense).
struct Utc(SystemTime);

impl fmt::Display for Utc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = Nanos::from_system_time(self.0);
        f.write_str(&paceline_wire::time::format_rfc3339_ceil(t))
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    #[test]
    fn messages_print_plainly() {
        let at = |s: u64| UNIX_EPOCH + Duration::from_secs(s);
        let quota = ClientError::QuotaExceeded {
            policy: "daily".into(),
            reset_at: at(1_796_256_000),
        };
        assert_eq!(
            quota.to_string(),
            "quota \"daily\" exceeded; it resets at 2026-12-03T00:00:00Z"
        );
        let spent = ClientError::RetriesExhausted {
            attempts: 3,
            status: Some(429),
        };
        assert_eq!(
            spent.to_string(),
            "gave up after 3 attempts (last status 429)"
        );
        let net = ClientError::RetriesExhausted {
            attempts: 3,
            status: None,
        };
        assert_eq!(net.to_string(), "gave up after 3 attempts (no response)");
        let long = ClientError::WaitTooLong {
            until: at(1_796_256_000),
            policy: Some("burst".into()),
        };
        assert_eq!(
            long.to_string(),
            "the server asked to wait until 2026-12-03T00:00:00Z for \"burst\", past the configured ceiling"
        );
        assert_eq!(long.retry_at(), Some(at(1_796_256_000)));
        assert_eq!(Utc(at(951_782_400)).to_string(), "2000-02-29T00:00:00Z");
        assert_eq!(
            Utc(at(0) + Duration::from_millis(1)).to_string(),
            "1970-01-01T00:00:01Z"
        );
    }
}
