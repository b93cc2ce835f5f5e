//! # paceline-redis
//!
//! Many servers, one count. A bucket held per process multiplies the
//! published limit by the number of instances; [`RedisStore`] keeps the
//! count in Redis instead, so every gateway and every tower layer on the
//! same Redis (or Redis Cluster) enforces the limit it publishes.
//!
//! It is the core's [`Store`](paceline_core::Store) contract: all of a
//! request's policies (token bucket/GCRA, fixed and calendar windows,
//! sliding log and counter, concurrency leases) are checked and charged in
//! one atomic server-side step, a denied request charges nothing, and a
//! cost of 0 reads without charging — decision for decision what
//! [`MemoryStore`](paceline_core::MemoryStore) answers (a property test
//! runs the same random operations against both). Decisions read the Redis
//! server's clock (`TIME`), so skewed instance clocks do not matter.
//!
//! Built on the `redis` crate (redis-rs): the most used Redis client for
//! Rust, kept by the Redis organisation, with Tokio multiplexed
//! connections that reconnect by themselves, an async Cluster client that
//! follows `MOVED`/`ASK`, and rustls TLS — everything this store needs and
//! nothing it has to wrap twice (`fred` would do as well; its own
//! pipelining and pooling would sit under the batcher here unused).
//!
//! [`RedisIdempotencyStore`] is the idempotency layer's store
//! (`paceline_server::idempotency`) in Redis, so a retried write that
//! lands on another instance finds the first answer: one Redis key per
//! entry, named by a keyed hash of the caller, the route and the
//! `Idempotency-Key` (a secret of its own; [`RedisStore::idempotency_store`]
//! puts it on the limiter's connections), each step one round trip (a
//! small script for `begin`, `complete` and `release`, a `GET` for
//! `fetch`), leases and answers expiring by `PX` on the server's clock,
//! answers bounded ([`RedisIdempotencyStore::for_settings`]), and every
//! step cut at a deadline ([`DEFAULT_IDEMPOTENCY_DEADLINE`]) that fails
//! as unavailable (the layer answers `503`).
//!
//! ## The parts
//!
//! ```text
//!  Store::check (store.rs: RedisStore)
//!     │ 1. deny cache (cache.rs): a key already over its limit, until its
//!     │    retry time → the cached denial, no round trip; the layer asks
//!     │    this part first, synchronously (Store::check_local)
//!     │ 2. row name (keys.rs): pl:{keyed hash of the key}:plan — one
//!     │    hash tag per client key, so one cluster slot
//!     ▼
//!  batch.rs (one task: bounded queue → one call per slot, ≤ batch_max,
//!     │      ≤ max_in_flight calls (one per connection on a single
//!     │      server), each cut at the deadline; a lone decision with
//!     │      nothing in flight is sent at once)
//!     ▼
//!  link.rs (FCALL paceline_v8_run, or paceline_v8_one for a lone
//!     │     check, FUNCTION LOAD on demand; EVALSHA + EVAL on NOSCRIPT
//!     │     for servers without functions; direct.rs: a lone exact
//!     │     check on a connection the caller drives itself)
//!     ▼
//!  lua/core.lua (every decision of the batch: the core's algorithms on
//!     │          exact integers; rows kept with a TTL)
//!     ▼
//!  script.rs (the reply's flat integers → Decisions; each plan's spec
//!             and support check worked out once)
//!
//!  RedisIdempotencyStore (idempotency.rs): pl:idem:{keyed hash} → a
//!     lease or an answer, one script call or GET per step, PX expiry
//!
//!  Redis away: StoreError::Unavailable within the deadline → the
//!  limiter's fail open/closed per policy, or (config.rs: Degraded) a
//!  local MemoryStore on a share of each quota for fail-open plans;
//!  degraded.rs keeps what it charged and leased, so each refund, settle
//!  and release goes back to the side that took it, never both.
//!
//!  Store::settle (store.rs): what an answer cost beyond its check (or
//!  short of it) as one operation of a call (core.lua's `settle`, op
//!  `s`): more is charged into a bounded debt, less given back as a
//!  refund is, with the memory store's rules.
//!
//!  Store::check_all (store.rs: a group, all or nothing): the group's
//!  decisions ride one call, side by side (batch.rs never splits a job),
//!  and core.lua checks them in order, each seeing the charges before it;
//!  if one refuses, every row goes back as it was and the others answer
//!  their standing, so a refused group charges nothing and no other
//!  caller sees its charges. The deny cache refuses a group at once when
//!  it holds one of its items (that item would refuse it in Redis too);
//!  Redis away, the degraded limiter decides the group as the memory
//!  store does. On a cluster a group is one call only when its rows share
//!  a slot (each key is its own hash tag); across slots it is decided
//!  item by item, its charges given back on a refusal.
//!
//!  Store::peek_local (standing.rs): the last answer Redis gave per key,
//!  bounded, read with no round trip and no charge (a shed 503's
//!  RateLimit fields, a request held by escalation); nothing for a key
//!  not heard of.
//! ```
//!
//! ## Metrics
//!
//! Through the `metrics` facade (the gateway exports them for Prometheus):
//! `paceline_redis_call_seconds` (histogram: each call's latency),
//! `paceline_redis_batch_size` (histogram: decisions per call),
//! `paceline_redis_errors_total{kind}` (`unavailable`, `protocol`,
//! `queue_full`), `paceline_redis_deny_cache_hits_total`,
//! `paceline_redis_degraded` (gauge: 1 while the degraded limiter
//! decides), `paceline_redis_degraded_decisions_total`,
//! `paceline_redis_degraded_seconds` (histogram: each degraded period's
//! length, so its sum is the time spent degraded) and
//! `paceline_redis_library_loads_total`.
//!
//! ## A 429, inside this crate
//!
//! `RedisStore::check` (`store.rs`) finds no cached denial (`cache.rs`),
//! names the row (`keys.rs`) and queues the decision; the batcher
//! (`batch.rs`) sends it with the others queued for the same slot as one
//! `FCALL` (`link.rs`); the Lua (`lua/core.lua`) peeks every policy, finds
//! the burst empty, charges nothing and answers `1 0 <wait> …`
//! (denied, by policy 0, then each policy's standing); `script.rs` turns
//! those integers into a [`Decision`](paceline_core::Decision)
//! whose denial names the policy, and `store.rs` keeps it in the deny
//! cache until the wait is over, so the client's next tries are answered
//! without Redis, and without a future: the layer's `check_local` finds
//! them there before it would wait on the store.
//!
//! ```no_run
//! use paceline_core::{Nanos, Plan, Policy, Store};
//! use paceline_redis::{RedisStore, RedisStoreConfig};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::connect(RedisStoreConfig {
//!     urls: vec!["redis://127.0.0.1:6379".into()],
//!     key_secret: b"a per-deployment secret".to_vec(),
//!     ..RedisStoreConfig::default()
//! })
//! .await?;
//! let free = Plan::new("free", vec![
//!     Policy::token_bucket("burst", 20, 2)?,
//!     Policy::daily("daily", 10_000)?,
//! ])?;
//! // the instant is ignored: the server's clock decides
//! let d = store.check(&free, "k:sk_live_1", 1, Nanos::ZERO).await?;
//! assert!(d.is_allowed());
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]

mod batch;
mod cache;
mod config;
mod degraded;
mod direct;
mod idempotency;
mod keys;
mod link;
mod script;
mod standing;
mod store;
#[cfg(feature = "testing")]
pub mod testing;

pub use config::{
    check_ca, check_url, redact, ClockSource, ConfigError, Degraded, RedisStoreConfig, Scripting,
    DEFAULT_DEADLINE, MAX_BATCH, MAX_DEADLINE, MAX_LEASE_TTL, MAX_LINGER,
};
pub use idempotency::{RedisIdempotencyStore, ANSWER_HEAD_ROOM, DEFAULT_IDEMPOTENCY_DEADLINE};
pub use store::{
    supports, RedisStats, RedisStore, MAX_CONCURRENCY_QUOTA, MAX_COUNTER_QUOTA,
    MAX_SLIDING_WINDOW_SECS,
};
