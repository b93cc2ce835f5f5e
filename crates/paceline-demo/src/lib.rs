//! # paceline-demo
//!
//! The live parts of `paceline demo`, kept out of the command line so the
//! binary only parses arguments and prints:
//!
//! - [`api`]: the Shiplane-style demo API, an upstream that counts what
//!   reaches it and knows nothing of rate limits;
//! - [`stack`]: the demo API with the gateway in front of it;
//! - [`race`]: the two-fleet race over real HTTP, through the real
//!   gateway (`paceline-gateway` with `max_rps` for the edge) and the real
//!   SDK, on the simulator's
//!   [`RaceParams`](paceline_sim::scenario::race::RaceParams) and reported
//!   as its [`FleetReport`](paceline_sim::report::FleetReport)s, so
//!   `paceline demo` and `paceline sim race` run and report one race;
//! - [`front`]: the round-robin front of several gateway instances
//!   (`paceline demo --instances N`), and [`local_redis`]: a
//!   `redis-server` of the demo's own for `--store redis`;
//! - the race's live dashboard (`dashboard.rs`, pages embedded), pushed
//!   by server-sent events.
//!
//! ## The parts
//!
//! ```text
//!  race.rs ── two fleets (the SDK over reqwest; naive retries) ──► RaceStack
//!     │   Tap: every answer counted off the wire          paceline-gateway
//!     │                                                  (max_rps, buckets)
//!     │ RaceParams, FleetReport (paceline-sim)                  │
//!     ▼                                                         ▼
//!  dashboard.rs + dashboard/  (SSE feed, controls,        api.rs (the demo API,
//!     race.json, sim.json)                                 counts what is served)
//!
//!  stack.rs ── paceline-gateway (examples/shiplane.toml) ──► api.rs (the demo API)
//! ```
//!
//! ## A 429, inside this crate
//!
//! A naive worker of `race.rs` sends to the race's gateway, whose limit
//! layer (`paceline-server`) refuses it from the head; the tap under the
//! worker's client counts the 429, and the worker sends again 100 ms
//! later, while the cooperative worker's SDK reads the same answer's
//! fields and waits them out. Every [`race::TICK`] the run reads each
//! bucket from the gateway's limiter and what the demo API served, and
//! `dashboard.rs` pushes it to the pages.

#![forbid(unsafe_code)]

pub mod api;
mod dashboard;
pub mod front;
pub mod local_redis;
pub mod race;
pub mod stack;
