//! # paceline-core
//!
//! The server half's brain: named [`Policy`]s grouped in a [`Plan`], checked
//! together for a key with a cost, returning a [`Decision`] that carries
//! everything a response needs to publish (remaining, reset, which policy
//! denied and for how long).
//!
//! Why these pieces: a limit is only useful to a client if it is published,
//! and published numbers are only honest if every policy is checked and
//! charged atomically. So the algorithms are pure functions over integer
//! time (one module, private to this crate), the atomic step is a [`Store`] contract, and time
//! comes from a [`Clock`] so tests and the simulator run this exact code on
//! virtual time.
//!
//! ## The parts
//!
//! ```text
//!  policy.rs ──► plan.rs ──────────────┐     clock.rs (Clock: System, Manual)
//!  (one limit,    (policies checked    │          │ now
//!   validated)     together)           ▼          ▼
//!                          limiter.rs (Limiter: a store and a clock)
//!                                      │ plan, key, cost, now
//!                                      ▼
//!                 store.rs (Store trait; MemoryStore: sharded, bounded)
//!                                      │ the key's state words
//!                                      ▼
//!                 check.rs (check_words: every policy peeks, all commit or none)
//!                                      │ per policy
//!                                      ▼
//!                 algorithm.rs (GCRA, windows, sliding, concurrency;
//!                               pure functions over integer nanoseconds)
//!                                      │
//!                                      ▼
//!                 decision.rs (Decision: outcome + remaining/reset per policy)
//! ```
//!
//! `divide.rs` holds the exact division by a window's reciprocal that
//! `algorithm.rs` and `store.rs` share.
//!
//! ## A 429, inside this crate
//!
//! A server asks [`MemoryStore::check_sync`] (`store.rs`) with the plan,
//! the key, the cost and the time its [`Clock`] read (`clock.rs`); the
//! store hashes the key to a shard and runs [`check_words`] (`check.rs`) on
//! the key's state words; the first policy whose `peek` (`algorithm.rs`)
//! refuses makes the [`Decision`] (`decision.rs`) a [`Denial`] naming that
//! policy and its wait, and nothing is charged. The server's layers turn
//! it into headers from there.
//!
//! ```
//! use paceline_core::{Limiter, ManualClock, MemoryStore, Nanos, Outcome, Plan, Policy};
//!
//! // The Free plan: 20 per 2 s burst, 10,000 per UTC day.
//! let free = Plan::new("free", vec![
//!     Policy::token_bucket("burst", 20, 2).unwrap(),
//!     Policy::daily("daily", 10_000).unwrap(),
//! ]).unwrap();
//! let clock = ManualClock::new(Nanos::from_secs(1_790_000_000));
//! let limiter = Limiter::new(MemoryStore::new(), clock.clone());
//!
//! for _ in 0..20 {
//!     assert!(limiter.check_sync(&free, "sk_live_1", 1).unwrap().is_allowed());
//! }
//! let d = limiter.check_sync(&free, "sk_live_1", 1).unwrap();
//! let denial = d.denial().unwrap();
//! assert_eq!(free.policy(denial.policy).name(), "burst");
//! assert_eq!(denial.retry_after_secs(), 1);
//! // the denied request charged nothing, not even the daily quota
//! assert_eq!(d.statuses[1].remaining, 9_980);
//! ```

#![forbid(unsafe_code)]

mod algorithm;
mod check;
pub mod clock;
mod decision;
mod divide;
mod group;
pub mod lease;
mod limiter;
mod plan;
pub mod policy;
mod store;

pub use check::{check_words, refund_words, settle_words, Cost};
pub use clock::{Clock, ManualClock, Nanos, SystemClock};
pub use decision::{Decision, Denial, Outcome, PolicyStatus};
pub use group::{check_each, GroupDecision, GroupItem};
pub use limiter::{Lease, Limiter};
pub use plan::{Plan, PlanError, MAX_POLICIES};
pub use policy::{Algorithm, FailMode, Policy, PolicyError, PolicyKind, Share, Unit, UnitName};
pub use store::{MemoryStore, MemoryStoreConfig, Store, StoreError};
