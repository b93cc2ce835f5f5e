//! # paceline-client
//!
//! The client half of the rate-limit contract: read what the server
//! publishes, pace so that 429 is the exception, retry only what can
//! succeed, and never join a thundering herd.
//!
//! Why a transport-free core: the same decisions must hold for a `reqwest`
//! client, a `tower` stack, a CLI and a simulator running on virtual time.
//! So [`Client`] does no I/O and reads time from a
//! [`Clock`]: before each attempt it answers
//! [`Before::Go`], [`Before::Wait`] or [`Before::Drop`]; after each response
//! it answers [`After::Done`], [`After::RetryAfter`] or [`After::Error`].
//! Adapters (features `reqwest` and `tower`) turn those answers into sleeps
//! and sends.
//!
//! The pieces, each usable alone:
//!
//! - [`budget::RetryBudget`]: retries at most 10% of the last minute's
//!   requests, exact integer arithmetic, with a floor of retry tokens (10,
//!   one back per second) for clients too small for a share to help;
//! - [`throttle::AdaptiveThrottle`] and [`throttle::drop_probability`]: the
//!   SRE book's client-side throttling over two minutes;
//! - [`jitter::retry_wait`]: `Retry-After + uniform(0, J)`, or full jitter;
//! - [`backoff::ABSENT`]: exponential backoff for providers that publish
//!   nothing;
//! - per-scope mirrored buckets, a pause shared by every request of a
//!   scope, escalation and restore, and a [`Snapshot`] of it all.
//!
//! ## The parts
//!
//! ```text
//!  adapter/ reqwest.rs, tower.rs  sleeps and sends what the client decides
//!        │ request.rs (RequestInfo → Call, with its Idempotency-Key)
//!        ▼
//!  client.rs   before: go / wait / drop        after: done / retry / error
//!     ├─► scope.rs   a scope's mirrored policies (bucket.rs), its pause,
//!     │              escalation and restore, seeded by usage.rs
//!     ├─► budget.rs  retries ≤ 10% of recent requests, with a floor ─┐ window.rs
//!     ├─► throttle.rs drop locally what would be rejected anyway    ─┘ (exact counts)
//!     ├─► jitter.rs, backoff.rs  how long a retry waits
//!     ├─► observe.rs  a response as the client needs it (from paceline-wire)
//!     └─► event.rs, diag.rs, error.rs  what it tells: events, a snapshot, errors
//!  config.rs   every setting, with the contract's defaults
//! ```
//!
//! ## A 429, file by file
//!
//! An adapter (`adapter/reqwest.rs` or `adapter/tower.rs`) hands the
//! response's head and body to `paceline-wire`, whose view becomes an
//! [`Observation`] (`observe.rs`); [`Client::after`] (`client.rs`) updates
//! the scope's mirrored policies and pause (`scope.rs`, `bucket.rs`) and,
//! for a burst 429, asks the budget (`budget.rs`) and the wait
//! (`jitter.rs`) before answering [`After::RetryAfter`]; a quota 429
//! becomes [`ClientError::QuotaExceeded`] (`error.rs`). The next
//! [`Client::before`] of any call to that scope waits out the pause.
//!
//! ```
//! use paceline_client::{After, Before, Client, ClientError, Observation, RequestInfo, ResponseKind};
//! use paceline_client::{ManualClock, Nanos};
//!
//! let clock = ManualClock::new(Nanos::from_secs(1_790_000_000));
//! let client = Client::builder().clock(clock.clone()).seed(1).build();
//!
//! // A daily quota runs out: the call fails at once with the reset time.
//! let mut call = client.call(RequestInfo::post("http://api.test/v1/labels"));
//! assert!(call.idempotency_key().is_some());
//! assert_eq!(client.before(&mut call), Before::Go);
//! let mut quota = Observation::bare(429).with_retry_after(Nanos::from_secs(19_200));
//! quota.kind = ResponseKind::QuotaExhausted;
//! quota.limit = Some("daily".into());
//! match client.after(&mut call, &quota) {
//!     After::Error(ClientError::QuotaExceeded { policy, reset_at }) => {
//!         assert_eq!(policy, "daily");
//!         assert_eq!(reset_at, Nanos::from_secs(1_790_000_000 + 19_200).as_system_time());
//!     }
//!     other => panic!("{other:?}"),
//! }
//! ```

#![forbid(unsafe_code)]

#[cfg(any(feature = "reqwest", feature = "tower"))]
pub mod adapter;
pub mod backoff;
mod bucket;
pub mod budget;
mod client;
mod config;
pub mod cost;
mod diag;
mod error;
mod event;
pub mod jitter;
mod observe;
mod request;
mod scope;
pub mod throttle;
pub mod usage;
pub mod window;

pub use bucket::QUOTA_WINDOW;
pub use client::{After, Before, Client, ClientBuilder};
pub use config::{Config, DEFAULT_PACE_MARGIN};
pub use cost::Cost;
pub use diag::{PolicySnapshot, ScopeSnapshot, Snapshot, UnitSnapshot};
pub use error::ClientError;
pub use event::{Event, Hook, Mode};
pub use observe::{Observation, PolicyObservation, ResponseKind};
pub use request::{Attempt, Call, RequestInfo};

/// Time as the state machine counts it: [`Nanos`] are integer nanoseconds
/// (an instant is nanoseconds since the UNIX epoch on the client's
/// [`Clock`]; convert with `Nanos::from_duration`, `as_duration`,
/// `from_system_time` and `as_system_time`). [`ManualClock`] moves only
/// when told to, for tests and simulations; [`SystemClock`] is the
/// default. Settings, errors and events speak `Duration` and `SystemTime`.
pub use paceline_core::{Clock, ManualClock, Nanos, SystemClock};

/// `rand` (0.8), whose traits seed and drive the client's random draws
/// (`ClientBuilder::rng`, the jitter and throttle functions).
pub use rand;

/// The `http` crate the public API speaks (methods, header maps).
pub use http;
/// `reqwest` at the version the middleware is built against (0.13): use
/// this one, or a `reqwest = "0.13"` of your own, so the types match.
#[cfg(feature = "reqwest")]
pub use reqwest;
/// `reqwest-middleware` at the version the middleware implements (0.5).
#[cfg(feature = "reqwest")]
pub use reqwest_middleware;
/// The body types the tower adapter sends (`Full<Bytes>`).
#[cfg(feature = "tower")]
pub use {bytes, http_body, http_body_util};
/// `tower-layer` and `tower-service` (0.3), which the tower adapter
/// implements.
#[cfg(feature = "tower")]
pub use {tower_layer, tower_service};

/// The README, whose example is compiled as a doctest.
#[cfg(all(doctest, feature = "reqwest"))]
#[doc = include_str!("../README.md")]
struct Readme;
