//! # paceline-sim
//!
//! A deterministic discrete-event simulator in which simulated clients run
//! the real `paceline-client` code and a simulated gateway runs the real
//! `paceline-core` limiter and `paceline-wire` emitter, on virtual time.
//!
//! Why simulate: the claims that matter about rate limiting — a client that
//! reads the headers finishes as fast as one that hammers, with a fraction
//! of the requests; jitter turns a synchronised wave into a queue — are
//! claims about thousands of requests over minutes. On virtual time they
//! run in milliseconds and give the same answer for the same seed, so they
//! can be tests.
//!
//! The pieces: [`engine`] (timed events on integer nanoseconds, ties broken
//! by insertion order), [`rng`] (seeded ChaCha8 streams), [`edge`]
//! (per-second capacity shared fairly between keys), [`gateway`] (the
//! edge, injected faults, the real limiter and emitter), [`sdk`] (the real
//! client in the loop), [`fleet`] (workers doing jobs through a client),
//! the [`scenario`]s behind `paceline sim` and their [`report`]s; each
//! scenario renders its report as a plain-text table and an SVG plot
//! (`table` and `svg` in its module, on helpers private to the crate).
//!
//! ## The parts
//!
//! ```text
//!  scenario/{race,herd,export,throttle,incident,servers,load}.rs (parameters → report.rs)
//!        │ schedules
//!        ▼
//!  engine.rs  events on virtual nanoseconds ◄── rng.rs (seeded streams)
//!        │ a worker's request (fleet.rs)
//!        ▼
//!  gateway.rs ─► edge.rs (capacity per second, heaviest key dropped first)
//!        │      ─► injected faults (503s, outages)
//!        │      ─► paceline-core check_words (the real limiter)
//!        ▼
//!  sdk.rs  the answer written by paceline-wire, parsed back, and handed to
//!          the real paceline-client, which decides when to send again
//! ```
//!
//! ## A 429, inside this crate
//!
//! A worker of `fleet.rs` sends at a virtual instant from `engine.rs`;
//! `gateway.rs` lets it past the edge (`edge.rs`) and runs the real
//! `check_words` on the key's state; a denial becomes, in `sdk.rs`, the
//! head and problem body that `paceline-wire` writes for it, parsed back by
//! `paceline-wire` and observed by the worker's `paceline-client`, whose
//! answer (wait this long, retry or give up) schedules the worker's next
//! event.
//!
//! ```
//! use paceline_sim::scenario::race::{self, RaceParams};
//!
//! let report = race::run(&RaceParams::default(), 1);
//! let naive = &report.fleets[1];
//! assert_eq!(naive.name, "naive");
//! assert_eq!(naive.jobs_done, 50);
//! assert!(naive.requests > 100);
//! ```

#![forbid(unsafe_code)]

pub mod edge;
pub mod engine;
pub mod fleet;
pub mod gateway;
pub mod report;
pub mod rng;
pub mod scenario;
pub mod sdk;
mod svg;
mod table;
