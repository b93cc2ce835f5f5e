//! The scenarios behind `paceline sim`, each a pure function of its
//! parameters and a seed.
//!
//! | scenario | question it answers |
//! |---|---|
//! | [`race`] | two fleets, one reading the headers, one hammering: who finishes first, at what cost? |
//! | [`export`] | the same contest at the scale of a nightly export |
//! | [`herd`] | ten thousand clients rejected together: when do they come back? |
//! | [`throttle`] | how much does adaptive throttling drop as accepts fall? |
//! | [`incident`] | during an outage, how much extra load do the SDK's retries add? |
//! | [`servers`] | one key through several gateway instances: counted per instance, or once? |
//! | [`load`] | how fast does the simulator run? (its benchmark workload) |

pub mod export;
pub mod herd;
pub mod incident;
pub mod load;
pub mod race;
pub mod servers;
pub mod throttle;

use paceline_core::Nanos;

/// The virtual instant every scenario starts at: 2026-09-21 10:40:00 UTC,
/// far from a day boundary so daily windows do not reset mid-run.
pub const START: Nanos = Nanos::from_secs(1_790_160_000);
