//! The idempotency layer: a retried write never runs twice.
//!
//! Why a layer: a client that retries a POST after a timeout cannot know
//! whether the first one ran. With an `Idempotency-Key` (the IETF httpapi
//! draft's field, or Stripe's bare form), the first request with a key
//! runs and its final answer is stored; a retry with the same key and the
//! same request gets that answer again, marked
//! `Idempotent-Replayed: true`, and the service behind never sees it. Any
//! tower service taking `http` requests with streaming bodies can sit
//! behind it; it needs no other layer.
//!
//! What it answers itself:
//!
//! | case | answer |
//! |---|---|
//! | a route that requires a key, POST/PATCH without one | 400 `idempotency_key_missing` |
//! | a key that is not one (too long, not printable, two fields) | 400 `idempotency_key_invalid` |
//! | the same key, another method, target or body | 409 `idempotency_conflict` (422 as a setting) |
//! | the same key while the first still runs | 409 `idempotency_in_flight` with `Retry-After`, or (a setting) the first answer once it comes |
//! | a body larger than allowed | 413 `payload_too_large` |
//!
//! A key is scoped by who sends it and where ([`IdempotencyScope`]): two
//! callers using the same key string, or one caller on two routes, never
//! meet. The first request's fingerprint is its method, target and a
//! digest of its body, read while the body streams on; its final answer
//! (status, fields, body, each bounded) is kept for a TTL (24 h by
//! default). The first execution runs to its end even if its client goes
//! away, so a retry finds the answer. An upstream that fails before a
//! final answer (an error, a `5xx` unless configured final, a `429`)
//! frees the key, so the retry runs.
//!
//! The parts: `key.rs` reads the field, `fingerprint.rs` digests scope,
//! head and body, `store.rs` is the store's trait and `memory.rs` the
//! bounded in-process store, `scope.rs` says which requests it applies to
//! and as whom, `service.rs` is the layer and its service, `replay.rs`
//! the answers it writes, and `body.rs` the body of its answers.
//!
//! ```
//! use paceline_core::ManualClock;
//! use paceline_server::idempotency::{
//!     BearerScope, IdempotencyLayer, IdempotencyMode, IdempotencySettings,
//!     MemoryIdempotencyStore,
//! };
//! use tower::{Service, ServiceExt};
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let layer = IdempotencyLayer::new(
//!     MemoryIdempotencyStore::default(),
//!     ManualClock::at_unix_secs(1_790_000_000),
//!     BearerScope::new(IdempotencyMode::Required),
//!     IdempotencySettings::default(),
//! );
//! let label = tower::service_fn(|_req: http::Request<_>| async {
//!     let body = http_body_util::Full::new(bytes::Bytes::from_static(b"{\"label_id\":\"lbl_1\"}"));
//!     Ok::<_, std::convert::Infallible>(http::Response::builder().status(201).body(body).unwrap())
//! });
//! let mut svc = tower::ServiceBuilder::new().layer(layer).service(label);
//! let post = |key: Option<&str>| {
//!     let mut b = http::Request::post("/v1/labels").header("authorization", "Bearer sk_1");
//!     if let Some(k) = key { b = b.header("idempotency-key", k); }
//!     b.body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}"))).unwrap()
//! };
//!
//! let first = svc.ready().await.unwrap().call(post(Some("\"k-1\""))).await.unwrap();
//! assert_eq!(first.status(), 201);
//! let again = svc.ready().await.unwrap().call(post(Some("k-1"))).await.unwrap();
//! assert_eq!(again.status(), 201);
//! assert_eq!(again.headers()["idempotent-replayed"], "true");
//! let none = svc.ready().await.unwrap().call(post(None)).await.unwrap();
//! assert_eq!(none.status(), 400);
//! # });
//! ```

mod body;
mod fingerprint;
mod key;
mod memory;
mod replay;
mod scope;
mod service;
mod store;

use std::time::Duration;

use serde::Deserialize;

/// Whether the layer looks at requests of `method` at all: `POST` and
/// `PATCH` (the methods that are not idempotent by definition); any
/// other goes on untouched, whatever its route's mode.
pub fn applies_to(method: &http::Method) -> bool {
    matches!(*method, http::Method::POST | http::Method::PATCH)
}

pub use body::IdempotencyBody;
pub use fingerprint::{BodyTooLarge, BoxError, DigestBody, EntryKey, Fingerprint};
pub use key::{DEFAULT_MAX_KEY_LEN, IDEMPOTENCY_KEY};
pub use memory::{MemoryIdempotencyStore, DEFAULT_MAX_STORE_BYTES, ENTRY_OVERHEAD};
pub use replay::{AnsweredHere, REPLAYED};
pub use scope::{BearerScope, IdempotencyScope, LimiterScope, Scope};
pub use service::{Idempotency, IdempotencyFuture, IdempotencyLayer};
pub use store::{Begin, Completed, Entry, IdempotencyStore, StoredAnswer};

/// Whether a route takes idempotency keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdempotencyMode {
    /// A POST or PATCH without a key is refused with 400.
    Required,
    /// A key is honoured when one is sent.
    Optional,
}

/// What a request with the key of one still running gets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InFlight {
    /// 409 `idempotency_in_flight` with `Retry-After` (the default).
    #[default]
    Reject,
    /// Waits (at most [`IdempotencySettings::max_wait`]) for the first
    /// answer and replays it; 409 `idempotency_in_flight` if none comes.
    Wait,
}

/// The default TTL of a stored answer: 24 hours.
pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 3600);
/// The default lease of a first execution: 5 minutes.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(300);
/// The default bound of a request body: 1 MiB.
pub const DEFAULT_MAX_BODY_BYTES: u64 = 1024 * 1024;
/// The default bound of a stored answer's body: 256 KiB.
pub const DEFAULT_MAX_ANSWER_BYTES: usize = 256 * 1024;
/// The default `Retry-After` of an in-flight answer: 1 second.
pub const DEFAULT_IN_FLIGHT_RETRY_AFTER: Duration = Duration::from_secs(1);
/// The default longest wait for a first answer: 10 seconds.
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(10);

/// The layer's settings; every bound has a default.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct IdempotencySettings {
    /// How long a final answer is kept for replay.
    pub ttl: Duration,
    /// How long a first execution holds its key before another request
    /// may take it (it outlives the upstream's timeouts; a process that
    /// dies mid-request frees its keys after it).
    pub lease: Duration,
    /// The largest request body digested; a larger one is answered 413.
    pub max_body_bytes: u64,
    /// The largest answer body stored; a larger answer is sent on but not
    /// kept, and a retry is told it cannot be replayed (409).
    pub max_answer_bytes: usize,
    /// The longest key accepted.
    pub max_key_len: usize,
    /// The status of a conflict: 409 (the default, the project's error
    /// table) or 422 (the IETF draft's).
    pub conflict_status: u16,
    /// What a duplicate of a request still running gets.
    pub in_flight: InFlight,
    /// The `Retry-After` of an in-flight answer.
    pub in_flight_retry_after: Duration,
    /// The longest a duplicate waits with [`InFlight::Wait`].
    pub max_wait: Duration,
    /// Whether a `5xx` answer of the upstream is final (stored and
    /// replayed); by default it frees the key so a retry runs.
    pub store_5xx: bool,
    /// The base URI of the problem types the layer answers with.
    pub problem_base: String,
    /// The cap in bytes of an in-memory store built for these settings
    /// ([`MemoryIdempotencyStore::new`]); the layer itself does not read it.
    pub max_store_bytes: usize,
}

impl Default for IdempotencySettings {
    fn default() -> Self {
        IdempotencySettings {
            ttl: DEFAULT_TTL,
            lease: DEFAULT_LEASE,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_answer_bytes: DEFAULT_MAX_ANSWER_BYTES,
            max_key_len: DEFAULT_MAX_KEY_LEN,
            conflict_status: 409,
            in_flight: InFlight::Reject,
            in_flight_retry_after: DEFAULT_IN_FLIGHT_RETRY_AFTER,
            max_wait: DEFAULT_MAX_WAIT,
            store_5xx: false,
            problem_base: crate::DEFAULT_PROBLEM_BASE.to_string(),
            max_store_bytes: DEFAULT_MAX_STORE_BYTES,
        }
    }
}
