//! The keep-alive pool: a stack of idle connections to one upstream, the
//! most recently used on top, each checked for age and for a close seen
//! while it sat idle before it is handed out again. Ages are read from the
//! gateway's clock. New connections come from its [`Dialer`] (TLS
//! included, for an `https://` upstream).

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use paceline_core::{Clock, Nanos};

use super::conn::{Conn, READ_CHUNK};
use super::dial::{Dialer, Io};
use super::error::UpstreamError;

/// Idle connections kept per upstream at most.
const MAX_IDLE: usize = 1024;

/// Keep-alive connections to one upstream, the most recently used on top.
pub(crate) struct Pool {
    idle: parking_lot::Mutex<Vec<Conn>>,
    dialer: Dialer,
    idle_timeout: Nanos,
    clock: Arc<dyn Clock>,
}

impl Pool {
    /// A pool of connections `dialer` opens, reading ages from `clock`.
    pub(crate) fn new(dialer: Dialer, idle_timeout: Duration, clock: Arc<dyn Clock>) -> Pool {
        Pool {
            idle: parking_lot::Mutex::new(Vec::new()),
            dialer,
            idle_timeout: Nanos::from_duration(idle_timeout),
            clock,
        }
    }

    /// The time by the pool's clock.
    pub(crate) fn now(&self) -> Nanos {
        self.clock.now()
    }

    /// An idle connection that is still open and not too old at `now`
    /// (ages saturate: a clock set back makes none too old).
    pub(crate) fn take(&self, now: Nanos) -> Option<Conn> {
        loop {
            // the lock is held for the pop only, not for the check
            let mut c = self.idle.lock().pop()?;
            if now.saturating_sub(c.since) < self.idle_timeout && !c.is_stale() {
                return Some(c);
            }
        }
    }

    /// A new connection.
    pub(crate) async fn connect(&self) -> Result<Conn, UpstreamError> {
        let mut conn = Conn::new(self.dialer.dial().await?);
        conn.since = self.now();
        Ok(conn)
    }

    /// Takes a connection opened elsewhere (by the HTTP/2 client, when
    /// the upstream chose HTTP/1.1) as an idle one.
    pub(crate) fn adopt(&self, io: Io) {
        let now = self.now();
        self.put(Conn::new(io), now);
    }

    /// Puts a connection whose exchange ended at `now` back on the stack.
    pub(crate) fn put(&self, mut conn: Conn, now: Nanos) {
        if !conn.buf.is_empty() {
            return;
        }
        conn.since = now;
        // don't keep a large buffer around for every idle connection
        if conn.buf.capacity() > 4 * READ_CHUNK {
            conn.buf = BytesMut::new();
        }
        let mut idle = self.idle.lock();
        // the oldest are at the bottom: drop the ones idle too long
        let stale = idle
            .iter()
            .take_while(|c| now.saturating_sub(c.since) >= self.idle_timeout)
            .count();
        if stale > 0 {
            idle.drain(..stale);
        }
        if idle.len() < MAX_IDLE {
            idle.push(conn);
        }
    }
}
