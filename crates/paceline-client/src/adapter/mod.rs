//! Pieces the async adapters share: a clock that follows tokio's (so
//! `tokio::time::pause` drives the client too), and a guard that lands an
//! attempt when its future is dropped.

use std::time::Duration;

use paceline_core::{Clock, Nanos};

use crate::{Call, Client};

pub use scoping::{PacingScope, RequestHead, ScopeFn, Scoping};

#[cfg(feature = "reqwest")]
pub mod reqwest;
mod scoping;
#[cfg(feature = "tower")]
pub mod tower;

/// Wall time that advances with tokio's clock: under
/// `tokio::time::pause()` it stands still until tokio's time is advanced,
/// so a whole client stack can be tested on virtual time.
#[derive(Clone, Debug)]
pub struct TokioClock {
    wall: Nanos,
    start: tokio::time::Instant,
}

impl TokioClock {
    /// Anchors at the current system time and tokio instant.
    pub fn new() -> Self {
        TokioClock {
            wall: Nanos::from_system_time(std::time::SystemTime::now()),
            start: tokio::time::Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        TokioClock::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Nanos {
        self.wall
            .saturating_add(Nanos::from_duration(self.start.elapsed()))
    }
}

/// A call that gives its in-flight attempt back if dropped mid-flight
/// (a cancelled future), so the scope never waits for an answer that will
/// not come.
pub(crate) struct Guard {
    pub(crate) client: Client,
    pub(crate) call: Call,
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.client.cancel(&mut self.call);
    }
}

pub(crate) async fn sleep(d: Nanos) {
    tokio::time::sleep(Duration::from(d)).await;
}

pub(crate) const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The header a server marks a replayed answer with (Stripe's, and
/// paceline's own idempotency layer's).
const REPLAYED: &str = "idempotent-replayed";

/// The first attempt of a call, under a key the client made for it, came
/// back as a replay: something between the adapter and the server sent it
/// before, most likely a retrying layer placed inside the adapter's, which
/// multiplies retries and bypasses pacing. A debug assertion (a warning in
/// release builds).
pub(crate) fn check_no_inner_resend(call: &Call, headers: &http::HeaderMap) {
    let fresh_key = call.info().idempotency_key.is_none() && call.idempotency_key().is_some();
    let replayed = headers
        .get(REPLAYED)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
    if call.attempts() == 1 && fresh_key && replayed {
        tracing::warn!(scope = call.info().scope.as_str(), "{INNER_RESEND}");
        debug_assert!(false, "{INNER_RESEND}");
    }
}

const INNER_RESEND: &str = "paceline: the first attempt of a call came back as a replay of the \
    Idempotency-Key paceline made for it, so something sent it before: a retrying middleware \
    added after paceline's (such as reqwest-retry) multiplies the retries and bypasses pacing; \
    keep one retrying layer (or, with ClientBuilder::seed, keys repeat across runs)";
