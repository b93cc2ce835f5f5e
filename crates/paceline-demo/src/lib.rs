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

#![forbid(unsafe_code)]

pub mod api;
mod dashboard;
pub mod race;
pub mod stack;
