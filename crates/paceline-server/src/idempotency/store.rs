//! [`IdempotencyStore`]: where keys, leases and stored answers live.
//!
//! Five steps, each one atomic on its own, so a store over a network
//! (Redis, say) does each in one round trip (a script or a conditional
//! write):
//!
//! - [`begin`](IdempotencyStore::begin): put-if-absent with a lease. The
//!   first request of a key gets the lease (a token); any other gets what
//!   is there (in flight, or the stored answer), in the same step.
//! - [`complete`](IdempotencyStore::complete): the lease holder stores
//!   the fingerprint and final answer, with the TTL.
//! - [`fetch`](IdempotencyStore::fetch): what is there now (a waiting
//!   duplicate polls it).
//! - [`release`](IdempotencyStore::release): the lease holder gives the
//!   key back (the upstream failed before a final answer).
//! - [`expire`](IdempotencyStore::expire): drops what has outlived its
//!   time (a store with its own expiry makes this a no-op).
//!
//! A lease also ends by itself at its deadline, so a process that dies
//! mid-request does not hold a key forever.

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use paceline_core::{Nanos, StoreError};

use super::fingerprint::{EntryKey, Fingerprint};

/// A final answer, as stored for replay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredAnswer {
    /// The status.
    pub status: StatusCode,
    /// The header fields (hop-by-hop fields left out).
    pub headers: HeaderMap,
    /// The body; `None` when it was larger than the answers kept, so the
    /// request ran once but cannot be replayed.
    pub body: Option<Bytes>,
}

impl StoredAnswer {
    /// The bytes it takes: its field map (by its capacity: a slot and an
    /// index per field it can hold), the fields' text and its body.
    pub fn size(&self) -> usize {
        const PER_SLOT: usize = 112;
        let text: usize = self
            .headers
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len())
            .sum();
        self.headers.capacity() * PER_SLOT + text + self.body.as_ref().map_or(0, Bytes::len)
    }
}

/// A completed request: its fingerprint and its answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completed {
    /// The fingerprint of the request that ran.
    pub fingerprint: Fingerprint,
    /// Its final answer.
    pub answer: StoredAnswer,
}

/// What a key holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    /// A request with it is running; `head` is its fingerprint's head
    /// (method and target; the body's digest is not known yet).
    InFlight {
        /// The running request's method and target, digested.
        head: u64,
    },
    /// A request with it ran; its answer is stored.
    Done(Arc<Completed>),
}

/// The outcome of [`IdempotencyStore::begin`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Begin {
    /// The key was free: this request runs, holding the lease `token`.
    Acquired(u64),
    /// The key is taken.
    Existing(Entry),
}

/// Keys, leases and stored answers, in five steps, each one atomic and
/// one round trip for a store over the network: `begin` (put-if-absent
/// with a lease, or what is there), `complete`, `fetch`, `release` and
/// `expire`. A lease also ends by itself at its deadline.
pub trait IdempotencyStore: Send + Sync + 'static {
    /// Takes `key` for a request whose head digests to `head`, leased until
    /// `now + lease`, if it holds nothing live; otherwise says what it
    /// holds.
    fn begin(
        &self,
        key: EntryKey,
        head: u64,
        lease: Nanos,
        now: Nanos,
    ) -> impl Future<Output = Result<Begin, StoreError>> + Send;

    /// Stores `done` under `key` for `ttl` from `now`, if `token` still
    /// holds its lease; `false` when it does not (the lease ran out and
    /// another request took the key).
    fn complete(
        &self,
        key: EntryKey,
        token: u64,
        done: Completed,
        ttl: Nanos,
        now: Nanos,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// What `key` holds at `now` (`None`: nothing live).
    fn fetch(
        &self,
        key: EntryKey,
        now: Nanos,
    ) -> impl Future<Output = Result<Option<Entry>, StoreError>> + Send;

    /// Frees `key` if `token` holds its lease.
    fn release(
        &self,
        key: EntryKey,
        token: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Drops what expired by `now`; how many entries went.
    fn expire(&self, now: Nanos) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

impl<T: IdempotencyStore> IdempotencyStore for Arc<T> {
    fn begin(
        &self,
        key: EntryKey,
        head: u64,
        lease: Nanos,
        now: Nanos,
    ) -> impl Future<Output = Result<Begin, StoreError>> + Send {
        (**self).begin(key, head, lease, now)
    }
    fn complete(
        &self,
        key: EntryKey,
        token: u64,
        done: Completed,
        ttl: Nanos,
        now: Nanos,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        (**self).complete(key, token, done, ttl, now)
    }
    fn fetch(
        &self,
        key: EntryKey,
        now: Nanos,
    ) -> impl Future<Output = Result<Option<Entry>, StoreError>> + Send {
        (**self).fetch(key, now)
    }
    fn release(
        &self,
        key: EntryKey,
        token: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).release(key, token)
    }
    fn expire(&self, now: Nanos) -> impl Future<Output = Result<u64, StoreError>> + Send {
        (**self).expire(now)
    }
}
