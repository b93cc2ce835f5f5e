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
