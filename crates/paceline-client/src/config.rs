//! The client's settings, with the defaults the contract names.

use std::time::Duration;

use paceline_core::Nanos;

use crate::backoff::{Backoff, ABSENT};

/// The default [`Config::pace_margin`]: what `paceline demo`'s race
/// measured it needs on a busy machine, with room to spare (see the
/// crate's README).
pub const DEFAULT_PACE_MARGIN: Duration = Duration::from_millis(50);

/// Settings of a [`Client`](crate::Client). Every field has the documented
/// default; change what you need with struct update syntax.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Attempts per call when the provider publishes its limits (3).
    pub max_attempts: u32,
    /// Backoff for providers that publish nothing useful (1 s × 2 ± 10%,
    /// cap 300 s, 6 attempts).
    pub absent_backoff: Backoff,
    /// The retry budget's window (one minute).
    pub budget_window: Duration,
    /// Retries allowed, in percent of first attempts in the window (10).
    pub budget_percent: u32,
    /// Retries always allowed per window, so a quiet client can still
    /// retry a little (3).
    pub budget_min_retries: u32,
    /// The floor for small clients: retry tokens that come back per second
    /// (1). A client whose 10% allows fewer retries than the floor holds
    /// may still retry on these tokens; see [`crate::budget`]. Zero turns
    /// the floor off.
    pub budget_floor_per_s: u32,
    /// Retry tokens the floor holds when full (10: one burst of 429s to
    /// ten workers retries every one of them).
    pub budget_floor_burst: u32,
    /// The adaptive throttle's window (two minutes).
    pub throttle_window: Duration,
    /// The adaptive throttle's K (2).
    pub throttle_k: f64,
    /// Requests the throttle's window must hold before it drops anything (20).
    pub throttle_min_requests: u64,
    /// Waits longer than this are never slept: the call fails at once with
    /// the instant to come back ([`ClientError::WaitTooLong`](crate::ClientError::WaitTooLong)
    /// or, for a long-window quota, `QuotaExceeded`). A wait the server
    /// gave is never shortened to fit under it (300 s).
    pub max_wait: Duration,
    /// How long after a bucket mirror's slot a request in debt goes
    /// (50 ms): room for the server's clock, its scheduling and the
    /// network, which set the server's refill phase a little later than
    /// the mirror can know. A constant lag, not a slower rate: a fleet
    /// finishes this much after the floor, once.
    pub pace_margin: Duration,
    /// How often a request waiting for a scope's first answer looks again
    /// (5 ms).
    pub probe_poll: Duration,
    /// How long the other requests of an unseeded scope wait for the first
    /// one's answer before they go anyway (2 s).
    pub probe_timeout: Duration,
    /// Spacing a header-absent scope starts from (250 ms, that is 4
    /// requests per second); it shrinks by an eighth after each run of ten
    /// successes and doubles on a 429.
    pub absent_gap: Duration,
    /// Whether to add an `Idempotency-Key` to POST requests (true).
    pub idempotency_keys: bool,
    /// Consecutive 429s, despite obeying the headers, that double the
    /// spacing of a scope (2).
    pub escalate_after: u32,
    /// Successes in a row (spanning two reset windows) that halve it back (10).
    pub restore_after: u32,
    /// The largest spacing multiplier (64).
    pub max_factor: u32,
    /// The largest request body buffered so it can be replayed (1 MiB).
    pub replay_buffer_cap: usize,
    /// What the adapters hand back when a call ends in an error after a
    /// response (retries or the retry budget spent, a quota used up, a
    /// wait past `max_wait`): by default (false) the typed
    /// [`ClientError`](crate::ClientError); when true, the server's last
    /// response itself (the 429 or 503, as `reqwest-retry` does), with the
    /// error in its extensions (`response.extensions().get::<ClientError>()`).
    /// Errors without a response (local drops, network errors) stay errors.
    pub final_response: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_attempts: 3,
            absent_backoff: ABSENT,
            budget_window: Duration::from_secs(60),
            budget_percent: 10,
            budget_min_retries: 3,
            budget_floor_per_s: 1,
            budget_floor_burst: 10,
            throttle_window: Duration::from_secs(120),
            throttle_k: 2.0,
            throttle_min_requests: 20,
            max_wait: Duration::from_secs(300),
            pace_margin: DEFAULT_PACE_MARGIN,
            probe_poll: Duration::from_millis(5),
            probe_timeout: Duration::from_secs(2),
            absent_gap: Duration::from_millis(250),
            idempotency_keys: true,
            escalate_after: 2,
            restore_after: 10,
            max_factor: 64,
            replay_buffer_cap: 1 << 20,
            final_response: false,
        }
    }
}

/// A setting as the state machine counts time.
pub(crate) fn ns(d: Duration) -> Nanos {
    Nanos::from_duration(d)
}
