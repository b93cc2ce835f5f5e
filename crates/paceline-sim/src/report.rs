//! What the scenarios return: plain data, serialised as the JSON the CLI
//! prints (the field names are part of the command line's contract).

use serde::{Deserialize, Serialize};

/// One fleet's outcome in a race or an export.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FleetReport {
    /// `cooperative` or `naive`.
    pub name: String,
    /// Jobs the fleet had to do.
    pub jobs: u64,
    /// Jobs done (a 2xx received).
    pub jobs_done: u64,
    /// Requests sent, first attempts and retries alike.
    pub requests: u64,
    /// 429 responses received.
    pub rejected_429: u64,
    /// Requests shed at the gateway's edge (no response).
    pub dropped: u64,
    /// Seconds from the start until the last job was done (`null` if the
    /// fleet never finished).
    pub finished_at_s: Option<f64>,
    /// 503 responses received.
    pub rejected_503: u64,
    /// Requests that were retries of an earlier attempt.
    pub retries: u64,
    /// Requests the client refused to send (adaptive throttling).
    pub local_drops: u64,
    /// Jobs given up on (an error the client says no wait can fix).
    pub jobs_failed: u64,
    /// Requests per time bucket; the JSON leaves it out when none were
    /// kept (the live race keeps no buckets).
    #[serde(default, skip_serializing_if = "Timeline::is_empty")]
    pub timeline: Timeline,
    /// 2xx responses counted as they left the edge; the live race of
    /// `paceline demo` fills it, the simulator's JSON leaves it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served: Option<u64>,
    /// What was left of the fleet's bucket as the last response published
    /// it; the live race fills it, the simulator's JSON leaves it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_left: Option<u64>,
}

/// Counts per time bucket, from the start of the run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Timeline {
    /// Bucket width in seconds.
    pub bucket_s: f64,
    /// Requests sent in each bucket.
    pub sent: Vec<u64>,
    /// 2xx received in each bucket.
    pub served: Vec<u64>,
    /// 429s and 503s received in each bucket.
    pub rejected: Vec<u64>,
    /// Requests shed at the edge in each bucket.
    pub dropped: Vec<u64>,
}

impl Timeline {
    /// Whether nothing was kept: no bucket width and no counts.
    pub fn is_empty(&self) -> bool {
        self.bucket_s == 0.0
            && [&self.sent, &self.served, &self.rejected, &self.dropped]
                .iter()
                .all(|v| v.is_empty())
    }

    pub(crate) fn bump(v: &mut Vec<u64>, bucket: usize) {
        if v.len() <= bucket {
            v.resize(bucket + 1, 0);
        }
        v[bucket] += 1;
    }

    pub(crate) fn square(&mut self) {
        let n = [&self.sent, &self.served, &self.rejected, &self.dropped]
            .iter()
            .map(|v| v.len())
            .max()
            .unwrap_or(0);
        for v in [
            &mut self.sent,
            &mut self.served,
            &mut self.rejected,
            &mut self.dropped,
        ] {
            v.resize(n, 0);
        }
    }
}

/// `paceline sim race`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RaceReport {
    /// Cooperative first, then naive.
    pub fleets: Vec<FleetReport>,
    /// The fastest any fleet can finish: the burst at once, the rest at the
    /// refill rate.
    pub floor_s: f64,
    /// The seed of the run.
    pub seed: u64,
}

/// `paceline sim export`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ExportReport {
    /// The fastest the export can finish.
    pub floor_s: f64,
    /// Cooperative first, then naive.
    pub fleets: Vec<FleetReport>,
    /// The seed of the run.
    pub seed: u64,
}

/// `paceline sim herd`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct HerdReport {
    /// `no_jitter` first, then `jitter`.
    pub series: Vec<HerdSeries>,
    /// Clients rejected in the blip.
    pub clients: u64,
    /// The `Retry-After` they were told, seconds.
    pub retry_after_s: u64,
    /// The seed of the run.
    pub seed: u64,
}

/// Retries per second after the rejection, for one retry strategy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct HerdSeries {
    /// `no_jitter` or `jitter`.
    pub name: String,
    /// One entry per second.
    pub per_second: Vec<PerSecond>,
    /// The most retries that arrived within any one millisecond.
    pub peak_per_ms: u64,
}

/// Requests arriving in one second.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PerSecond {
    /// Start of the second, counted from the rejection.
    pub t_s: u64,
    /// Requests that arrived in it.
    pub requests: u64,
}

/// `paceline sim throttle`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ThrottleReport {
    /// One curve per K.
    pub curves: Vec<ThrottleCurve>,
    /// The seed of the run.
    pub seed: u64,
}

/// The drop probability against the accept ratio, for one K.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ThrottleCurve {
    /// The multiplier.
    pub k: f64,
    /// One point per accept ratio.
    pub points: Vec<ThrottlePoint>,
}

/// One point of a throttle curve.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ThrottlePoint {
    /// Accepts divided by requests, as the client counted them.
    pub accept_ratio: f64,
    /// The share of requests the client dropped locally, as simulated.
    pub drop_probability: f64,
    /// `max(0, 1 − K · accept_ratio)`: what the formula predicts.
    pub formula: f64,
    /// The share of sent requests the server could accept (the setting).
    pub server_capacity_ratio: f64,
    /// Requests the application asked for while measured.
    pub requests: u64,
}

/// `paceline sim servers`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ServersReport {
    /// Gateway instances behind the balancer.
    pub instances: u32,
    /// Seconds the fleet sent for.
    pub seconds: u64,
    /// What one count admits in that time: the published limit.
    pub limit: u64,
    /// Each instance's share of the requests (`None`: round robin).
    pub weights: Option<Vec<u32>>,
    /// The largest slice of the leased run.
    pub max_slice: u64,
    /// `per_instance` first, then `shared`, then `leased`.
    pub runs: Vec<ServersRun>,
    /// The seed of the run.
    pub seed: u64,
}

/// One way of counting, and what the key got through it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ServersRun {
    /// `per_instance` (a store per process) or `shared` (one store).
    pub store: String,
    /// Requests that reached an instance.
    pub requests: u64,
    /// Requests admitted (200).
    pub admitted: u64,
    /// 429s answered.
    pub rejected_429: u64,
    /// `admitted / limit`: 1.0 when the published limit holds.
    pub admitted_per_limit: f64,
    /// Jobs the fleet saw done: `admitted`, less answers still on their way
    /// when the run ended.
    pub jobs_done: u64,
    /// Admissions in each second of the run.
    pub admitted_per_s: Vec<u64>,
    /// Calls to the shared count (none for a count per instance).
    pub round_trips: u64,
    /// `round_trips` per request received.
    pub round_trips_per_decision: f64,
}

/// Rounds to milliseconds' worth of decimals, so JSON stays short.
pub(crate) fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}
