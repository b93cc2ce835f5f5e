//! # paceline-demo
//!
//! The live parts of `paceline demo`, kept out of the command line so the
//! binary only parses arguments and prints:
//!
//! - [`api`]: the Shiplane-style demo API, an upstream that counts what
//!   reaches it and knows nothing of rate limits;
//! - [`stack`]: the demo API with the gateway in front of it;
//! - [`race`]: the two-fleet race over real HTTP, with the real server
//!   layer and the real SDK, on the simulator's
//!   [`RaceParams`](paceline_sim::scenario::race::RaceParams) and reported
//!   as its [`FleetReport`](paceline_sim::report::FleetReport)s, so
//!   `paceline demo` and `paceline sim race` run and report one race;
//! - the race's live dashboard, served beside its edge.
//!
//! ## The parts
//!
//! ```text
//!  race.rs ── two fleets (the SDK over reqwest; naive retries) ──► the race's edge
//!     │                                                               │
//!     │ RaceParams, FleetReport (paceline-sim)                       ▼
//!     ▼                                            paceline-server's limit layer
//!  dashboard.rs + dashboard/race.html  (samples, /race.json, re-run)
//!
//!  stack.rs ── paceline-gateway (examples/shiplane.toml) ──► api.rs (the demo API)
//! ```
//!
//! ## A 429, inside this crate
//!
//! A naive worker of `race.rs` sends to the race's edge, whose limit layer
//! (`paceline-server`) refuses it from the head; the worker counts the 429
//! and sends again 100 ms later, while the cooperative worker's SDK reads
//! the same answer's fields and waits them out. `dashboard.rs` samples both
//! fleets' counters for the page.

#![forbid(unsafe_code)]

pub mod api;
mod dashboard;
pub mod race;
pub mod stack;
