//! `paceline sim`: the deterministic scenarios, as tables, JSON and SVG.

use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;
use paceline_core::Nanos;
use paceline_sim::scenario::{export, herd, incident, race, servers, throttle};
use serde::Serialize;

/// Arguments of `paceline sim`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Subcommand, Debug)]
enum Scenario {
    /// Two fleets, one reading the headers and one hammering, share a gateway.
    Race(RaceArgs),
    /// Ten thousand clients rejected in a blip: when do they come back?
    Herd(HerdArgs),
    /// A 12,000-record export under 10/s with a burst of 50.
    Export(ExportArgs),
    /// Adaptive throttling: local drops against the accept ratio.
    Throttle(ThrottleArgs),
    /// An outage: how much extra load do the SDK's retries add?
    Incident(IncidentArgs),
    /// One key through several gateway instances: counted per instance, or once?
    Servers(ServersArgs),
}

/// Options every scenario takes.
#[derive(clap::Args, Debug)]
struct Output {
    /// Seed of the run's randomness (same seed, same output).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print the result as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Also write a plot of the run to FILE (SVG).
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
struct RaceArgs {
    #[command(flatten)]
    out: Output,
    /// Workers per fleet.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    workers: u32,
    /// Jobs per fleet (one request each).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    jobs: u64,
    /// Bucket depth: the burst each key may send at once.
    #[arg(long, default_value_t = 8)]
    quota: u64,
    /// Seconds to refill the whole bucket (rate = quota / window).
    #[arg(long = "window-s", default_value_t = 2)]
    window_s: u64,
    /// Requests per second the gateway's edge passes (0: unlimited).
    #[arg(long, default_value_t = 40)]
    capacity: u64,
    /// The naive fleet's pause before sending again, in milliseconds.
    #[arg(long = "naive-retry-ms", default_value_t = 100)]
    naive_retry_ms: u64,
    /// One-way latency between a worker and the gateway, in milliseconds.
    #[arg(long = "latency-ms", default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=60_000))]
    latency_ms: u64,
}

#[derive(clap::Args, Debug)]
struct HerdArgs {
    #[command(flatten)]
    out: Output,
    /// Clients rejected in the blip.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    clients: u64,
    /// Length of the blip, in seconds.
    #[arg(long = "blip-s", default_value_t = 5)]
    blip_s: u64,
    /// The Retry-After every rejection carries, in seconds.
    #[arg(long = "retry-after-s", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    retry_after_s: u64,
    /// Status of the blip's rejections.
    #[arg(long, default_value_t = 503, value_parser = parse_status)]
    status: u16,
    /// One-way latency, in milliseconds.
    #[arg(long = "latency-ms", default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=60_000))]
    latency_ms: u64,
}

#[derive(clap::Args, Debug)]
struct ExportArgs {
    #[command(flatten)]
    out: Output,
    /// Records to fetch, one request each.
    #[arg(long, default_value_t = 12_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    records: u64,
    /// Workers per fleet.
    #[arg(long, default_value_t = 40, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    workers: u32,
    /// Bucket depth (the burst).
    #[arg(long, default_value_t = 50)]
    quota: u64,
    /// Seconds to refill the whole bucket (rate = quota / window).
    #[arg(long = "window-s", default_value_t = 5)]
    window_s: u64,
    /// Requests per second the gateway's edge passes (0: unlimited).
    #[arg(long, default_value_t = 0)]
    capacity: u64,
    /// The naive fleet's pause before retrying, in milliseconds.
    #[arg(long = "naive-retry-ms", default_value_t = 0)]
    naive_retry_ms: u64,
    /// One-way latency, in milliseconds.
    #[arg(long = "latency-ms", default_value_t = 100, value_parser = clap::value_parser!(u64).range(0..=60_000))]
    latency_ms: u64,
}

#[derive(clap::Args, Debug)]
struct ThrottleArgs {
    #[command(flatten)]
    out: Output,
    /// The multipliers K, one curve each.
    #[arg(long = "k", value_delimiter = ',', default_values_t = [2.0, 1.1])]
    ks: Vec<f64>,
    /// Requests per second the application asks for.
    #[arg(long, default_value_t = 50)]
    demand: u64,
    /// Seconds each point is measured after a two-minute warm-up.
    #[arg(long = "measure-s", default_value_t = 180)]
    measure_s: u64,
}

#[derive(clap::Args, Debug)]
struct IncidentArgs {
    #[command(flatten)]
    out: Output,
    /// Calls per second the application makes.
    #[arg(long, default_value_t = 100)]
    rate: u64,
    /// Seconds of normal traffic before the incident.
    #[arg(long = "before-s", default_value_t = 120)]
    before_s: u64,
    /// Seconds the incident lasts.
    #[arg(long = "incident-s", default_value_t = 300)]
    incident_s: u64,
    /// Seconds of healthy traffic after the incident.
    #[arg(long = "after-s", default_value_t = 900)]
    after_s: u64,
    /// Status the server answers during the incident.
    #[arg(long, default_value_t = 503, value_parser = parse_status)]
    status: u16,
    /// Retry-After sent during the incident, in seconds (0: none).
    #[arg(long = "retry-after-s", default_value_t = 1)]
    retry_after_s: u64,
}

#[derive(clap::Args, Debug)]
struct ServersArgs {
    #[command(flatten)]
    out: Output,
    /// Gateway instances behind the round-robin balancer.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=1_000))]
    instances: u32,
    /// Seconds the naive fleet keeps sending.
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    seconds: u64,
    /// Workers of the naive fleet.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    workers: u32,
    /// Bucket depth: the burst the key may send at once.
    #[arg(long, default_value_t = 20)]
    burst: u64,
    /// Seconds to refill the whole bucket (rate = burst / window).
    #[arg(long = "window-s", default_value_t = 2)]
    window_s: u64,
    /// Requests per UTC day.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..))]
    daily: u64,
    /// The naive fleet's pause before sending a refused request again, in milliseconds.
    #[arg(long = "retry-ms", default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    retry_ms: u64,
    /// One-way latency, in milliseconds.
    #[arg(long = "latency-ms", default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=60_000))]
    latency_ms: u64,
    /// Each instance's share of the requests, comma-separated (`3,2,1`:
    /// the first takes half); round robin when left out.
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(0..=1_000))]
    weights: Option<Vec<u32>>,
    /// The largest slice of the leased run.
    #[arg(long = "max-slice", default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_slice: u64,
}

/// Runs `paceline sim`.
pub(crate) fn run(args: Args) -> anyhow::Result<i32> {
    match args.scenario {
        Scenario::Race(a) => {
            let p = race::RaceParams {
                workers: a.workers,
                jobs: a.jobs,
                quota: a.quota,
                window_s: a.window_s,
                capacity: a.capacity,
                naive_retry: Nanos::from_millis(a.naive_retry_ms),
                latency: Nanos::from_millis(a.latency_ms),
                ..Default::default()
            };
            check_bucket(a.quota, a.window_s)?;
            let r = race::run(&p, a.out.seed);
            emit(&a.out, &r, || race::table(&r.fleets), || race::svg(&r))
        }
        Scenario::Herd(a) => {
            let p = herd::HerdParams {
                clients: a.clients,
                blip: Nanos::from_secs(a.blip_s),
                retry_after_s: a.retry_after_s,
                status: a.status,
                latency: Nanos::from_millis(a.latency_ms),
            };
            let r = herd::run(&p, a.out.seed);
            emit(&a.out, &r, || herd::table(&r), || herd::svg(&r))
        }
        Scenario::Export(a) => {
            check_bucket(a.quota, a.window_s)?;
            let p = export::ExportParams {
                records: a.records,
                workers: a.workers,
                quota: a.quota,
                window_s: a.window_s,
                capacity: a.capacity,
                naive_retry: Nanos::from_millis(a.naive_retry_ms),
                latency: Nanos::from_millis(a.latency_ms),
                ..Default::default()
            };
            let r = export::run(&p, a.out.seed);
            emit(&a.out, &r, || export::table(&r), || export::svg(&r))
        }
        Scenario::Throttle(a) => {
            if a.ks.iter().any(|k| !k.is_finite() || *k < 1.0) {
                anyhow::bail!(
                    "--k: each multiplier must be a number of at least 1 (e.g. --k 2,1.1)"
                );
            }
            let p = throttle::ThrottleParams {
                ks: a.ks,
                demand: a.demand.max(1),
                measure: Nanos::from_secs(a.measure_s.max(1)),
                ..Default::default()
            };
            let r = throttle::run(&p, a.out.seed);
            emit(&a.out, &r, || throttle::table(&r), || throttle::svg(&r))
        }
        Scenario::Incident(a) => {
            let p = incident::IncidentParams {
                rate: a.rate.max(1),
                before: Nanos::from_secs(a.before_s.max(1)),
                incident: Nanos::from_secs(a.incident_s.max(1)),
                after: Nanos::from_secs(a.after_s),
                status: a.status,
                retry_after_s: a.retry_after_s,
                ..Default::default()
            };
            let r = incident::run(&p, a.out.seed);
            emit(&a.out, &r, || incident::table(&r), || incident::svg(&r))
        }
        Scenario::Servers(a) => {
            check_named_bucket("--burst", a.burst, a.window_s)?;
            let p = servers::ServersParams {
                instances: a.instances,
                seconds: a.seconds,
                workers: a.workers,
                burst: a.burst,
                window_s: a.window_s,
                daily: a.daily,
                retry: Nanos::from_millis(a.retry_ms),
                latency: Nanos::from_millis(a.latency_ms),
                weights: a.weights.clone(),
                max_slice: a.max_slice,
            };
            if let Some(w) = &p.weights {
                if w.len() != p.instances as usize || w.iter().all(|&x| x == 0) {
                    anyhow::bail!(
                        "--weights: give one weight per instance ({}), not all zero",
                        p.instances
                    );
                }
            }
            let r = servers::run(&p, a.out.seed);
            emit(&a.out, &r, || servers::table(&r), || servers::svg(&r))
        }
    }
}

fn parse_status(s: &str) -> Result<u16, String> {
    match s {
        "429" => Ok(429),
        "503" => Ok(503),
        _ => Err(format!("{s:?}: the status must be 429 or 503")),
    }
}

fn check_bucket(quota: u64, window_s: u64) -> anyhow::Result<()> {
    check_named_bucket("--quota", quota, window_s)
}

fn check_named_bucket(flag: &str, depth: u64, window_s: u64) -> anyhow::Result<()> {
    paceline_core::Policy::token_bucket("burst", depth, window_s)
        .map(|_| ())
        .map_err(|e| anyhow::anyhow!("{flag} {depth} --window-s {window_s}: {e}"))
}

fn emit<R: Serialize>(
    out: &Output,
    report: &R,
    table: impl FnOnce() -> String,
    svg: impl FnOnce() -> String,
) -> anyhow::Result<i32> {
    if let Some(path) = &out.svg {
        std::fs::write(path, svg()).with_context(|| format!("writing {}", path.display()))?;
    }
    if out.json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        print!("{}", table());
    }
    Ok(0)
}
