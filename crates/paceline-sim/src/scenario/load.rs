//! Throughput: many SDK clients, each with its own key, each working
//! through its jobs as fast as its published limit allows.
//!
//! This is the simulator's own benchmark workload: every request goes the
//! whole way — the SDK's `before`, the event queue, the gateway's limiter,
//! the header emitter, the client's parser, the SDK's `after` — so the
//! time per simulated request measured here is what any scenario pays.
//!
//! ```
//! use paceline_sim::scenario::load::{self, LoadParams};
//!
//! let r = load::run(&LoadParams { clients: 10, jobs_each: 100, ..Default::default() }, 1);
//! assert_eq!(r.requests, 1_000);
//! assert_eq!(r.jobs_done, 1_000);
//! ```

use paceline_core::{ManualClock, Nanos, Plan, Policy};
use serde::{Deserialize, Serialize};

use crate::fleet::{self, AnyFleet, Fleet, FleetSpec, Network};
use crate::gateway::Gateway;
use crate::scenario::START;
use crate::sdk::Cooperative;

/// The numbers of the load.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadParams {
    /// SDK clients, one key and one worker each.
    pub clients: u32,
    /// Jobs per client, one request each.
    pub jobs_each: u64,
    /// Each key's bucket: `quota` per `window_s`.
    pub quota: u64,
    /// See `quota`.
    pub window_s: u64,
    /// One-way latency.
    pub latency: Nanos,
}

impl Default for LoadParams {
    fn default() -> Self {
        LoadParams {
            clients: 1_000,
            jobs_each: 1_000,
            quota: 20,
            window_s: 2,
            latency: Nanos::from_millis(5),
        }
    }
}

/// What the load did.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LoadReport {
    /// Requests sent by all clients.
    pub requests: u64,
    /// Jobs done by all clients.
    pub jobs_done: u64,
    /// 429s received by all clients.
    pub rejected_429: u64,
    /// Events the engine processed.
    pub events: u64,
    /// Virtual seconds the run lasted.
    pub virtual_s: f64,
}

/// Runs the load.
pub fn run(params: &LoadParams, seed: u64) -> LoadReport {
    let plan = Plan::new(
        "load",
        vec![Policy::token_bucket("burst", params.quota, params.window_s).expect("valid bucket")],
    )
    .expect("one policy");
    let clock = ManualClock::new(START);
    let mut gw = Gateway::new(plan, params.clients as usize);
    let mut fleets: Vec<Fleet<Cooperative>> = (0..params.clients as usize)
        .map(|key| {
            let spec = FleetSpec {
                name: format!("client-{key}"),
                workers: 1,
                jobs: params.jobs_each,
            };
            let coop = Cooperative::new(
                clock.clone(),
                crate::rng::derive(seed, key as u64),
                &gw,
                key,
                START,
            );
            Fleet::new(spec, coop)
        })
        .collect();
    let mut refs: Vec<&mut dyn AnyFleet> =
        fleets.iter_mut().map(|f| f as &mut dyn AnyFleet).collect();
    let net = Network {
        latency: params.latency,
        bucket: Nanos::from_secs(3_600),
        deadline: Nanos::from_secs(86_400),
    };
    let (reports, events) = fleet::run(&mut refs, &mut gw, clock.clone(), START, net);
    LoadReport {
        requests: reports.iter().map(|r| r.requests).sum(),
        jobs_done: reports.iter().map(|r| r.jobs_done).sum(),
        rejected_429: reports.iter().map(|r| r.rejected_429).sum(),
        events,
        virtual_s: paceline_core::Clock::now(&clock)
            .saturating_sub(START)
            .as_secs_f64(),
    }
}
