//! The thundering herd: many clients rejected at once, all told the same
//! `Retry-After`. When do they come back?
//!
//! The model: `clients` SDK instances each send one request during a blip
//! in which the gateway answers every request with a 503 and
//! `Retry-After: 5` (an injected fault; nothing is charged). Each client
//! retries once the way its strategy says, and the scenario counts, per
//! second after the rejection, the retries that are sent:
//!
//! - `no_jitter`: sleep exactly `Retry-After` — every client returns in the
//!   same instant;
//! - `jitter`: the SDK's rule, `Retry-After + uniform(0, J)` with
//!   `J = min(20 s, max(1 s, Retry-After))` — the same clients spread evenly
//!   over the next `J` seconds.
//!
//! ```
//! use paceline_sim::scenario::herd::{self, HerdParams};
//!
//! let params = HerdParams { clients: 1_000, ..Default::default() };
//! let report = herd::run(&params, 7);
//! assert_eq!(report.series[0].per_second[0].requests, 1_000);
//! assert!(report.series[1].per_second.iter().all(|s| s.requests < 300));
//! ```

use paceline_client::{After as SdkAfter, Before as SdkBefore, Call, Client, RequestInfo};
use paceline_core::{Nanos, Plan, Policy};

use crate::engine::EventQueue;
use crate::gateway::{Answer, Fault, Gateway, Verdict};
use crate::report::{HerdReport, HerdSeries, PerSecond};
use crate::rng;
use crate::scenario::START;
use crate::sdk;
use crate::svg::{Chart, Series};

/// The numbers of the herd scenario.
#[derive(Clone, Debug, PartialEq)]
pub struct HerdParams {
    /// Clients rejected in the blip.
    pub clients: u64,
    /// How long the blip lasts.
    pub blip: Nanos,
    /// The `Retry-After` every rejection carries, in seconds.
    pub retry_after_s: u64,
    /// The status of the blip's rejections (503 or 429).
    pub status: u16,
    /// One-way latency between each client and the gateway.
    pub latency: Nanos,
}

impl Default for HerdParams {
    fn default() -> Self {
        HerdParams {
            clients: 10_000,
            blip: Nanos::from_secs(5),
            retry_after_s: 5,
            status: 503,
            latency: Nanos::from_millis(10),
        }
    }
}

/// How a client picks its retry instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Strategy {
    /// Exactly `Retry-After`.
    NoJitter,
    /// The SDK's rule: `Retry-After` plus jitter.
    Jitter,
}

impl Strategy {
    fn name(self) -> &'static str {
        match self {
            Strategy::NoJitter => "no_jitter",
            Strategy::Jitter => "jitter",
        }
    }
}

/// Runs both strategies.
pub fn run(params: &HerdParams, seed: u64) -> HerdReport {
    let series = [Strategy::NoJitter, Strategy::Jitter]
        .iter()
        .enumerate()
        .map(|(i, &s)| run_one(params, s, rng::derive(seed, i as u64)))
        .collect();
    HerdReport {
        series,
        clients: params.clients,
        retry_after_s: params.retry_after_s,
        seed,
    }
}

enum Ev {
    Send { client: u32 },
    Arrive { client: u32 },
    Answer { client: u32, answer: Answer },
}

/// One client of the herd: the SDK with its call, or a bare sleeper.
struct Member {
    sdk: Option<(Client, Call)>,
    attempts: u32,
    rejected_at: Option<Nanos>,
}

/// One strategy's retries, per second after the rejection.
pub fn run_one(params: &HerdParams, strategy: Strategy, seed: u64) -> HerdSeries {
    let n = params.clients as usize;
    let plan = Plan::new("herd", vec![Policy::token_bucket("burst", 100, 1).unwrap()]).unwrap();
    let blip = Fault {
        from: START,
        until: START.saturating_add(params.blip),
        status: params.status,
        retry_after_s: params.retry_after_s,
    };
    let mut gw = Gateway::new(plan, n).with_fault(blip);
    let mut q = EventQueue::new(START);
    let clock = q.clock().clone();
    let mut members: Vec<Member> = (0..n)
        .map(|i| Member {
            sdk: (strategy == Strategy::Jitter).then(|| {
                let c = sdk::client(&clock, rng::derive(seed, i as u64));
                let call = c.call(RequestInfo::get(sdk::URL));
                (c, call)
            }),
            attempts: 0,
            rejected_at: None,
        })
        .collect();
    for client in 0..params.clients as u32 {
        q.schedule_at(START, Ev::Send { client });
    }
    let ra = Nanos::from_secs(params.retry_after_s);
    let mut offsets: Vec<Nanos> = Vec::with_capacity(n);
    while let Some((now, ev)) = q.pop() {
        match ev {
            Ev::Send { client } => {
                let m = &mut members[client as usize];
                if let Some((c, call)) = &mut m.sdk {
                    match c.before(call) {
                        SdkBefore::Go => {}
                        SdkBefore::Wait(d) => {
                            q.schedule_in(d, Ev::Send { client });
                            continue;
                        }
                        SdkBefore::Drop(_) => continue,
                    }
                }
                m.attempts += 1;
                if let (true, Some(at)) = (m.attempts > 1, m.rejected_at) {
                    offsets.push(now.saturating_sub(at));
                }
                q.schedule_in(params.latency, Ev::Arrive { client });
            }
            Ev::Arrive { client } => {
                let answer = gw.handle(client as usize, 1, now);
                q.schedule_in(params.latency, Ev::Answer { client, answer });
            }
            Ev::Answer { client, answer } => {
                let m = &mut members[client as usize];
                let served = answer.verdict == Verdict::Served;
                if !served && m.rejected_at.is_none() {
                    m.rejected_at = Some(now);
                }
                let wait = match &mut m.sdk {
                    Some((c, call)) => {
                        let next = match sdk::observe(&gw, &answer, now) {
                            Some(obs) => c.after(call, &obs),
                            None => c.after_error(call, true, "connection reset"),
                        };
                        match next {
                            SdkAfter::RetryAfter(d) => Some(d),
                            _ => None,
                        }
                    }
                    None if served || m.attempts > 1 => None,
                    None => Some(ra),
                };
                if let Some(d) = wait {
                    q.schedule_in(d, Ev::Send { client });
                }
            }
        }
    }
    summarize(params, strategy, &offsets)
}

fn summarize(params: &HerdParams, strategy: Strategy, offsets: &[Nanos]) -> HerdSeries {
    let ra = params.retry_after_s;
    let span = ra.clamp(1, 20);
    let last = offsets
        .iter()
        .map(|o| o.as_secs_floor())
        .max()
        .unwrap_or(ra);
    let first = offsets
        .iter()
        .map(|o| o.as_secs_floor())
        .min()
        .unwrap_or(ra);
    let (from, to) = (first.min(ra), (last + 1).max(ra + span));
    let mut counts = vec![0u64; (to - from) as usize];
    let mut per_ms = std::collections::BTreeMap::<u64, u64>::new();
    for o in offsets {
        counts[(o.as_secs_floor() - from) as usize] += 1;
        *per_ms.entry(o.as_u64() / 1_000_000).or_default() += 1;
    }
    HerdSeries {
        name: strategy.name().to_string(),
        per_second: counts
            .iter()
            .enumerate()
            .map(|(i, &requests)| PerSecond {
                t_s: from + i as u64,
                requests,
            })
            .collect(),
        peak_per_ms: per_ms.values().copied().max().unwrap_or(0),
    }
}

/// Retries per second as a bar chart.
pub fn svg(report: &HerdReport) -> String {
    let title = format!(
        "{} clients told Retry-After: {} — retries per second",
        crate::table::count(report.clients),
        report.retry_after_s
    );
    let mut chart = Chart::bars(
        &title,
        "seconds after the rejection",
        "retries sent per second",
        1.0,
    );
    for s in &report.series {
        let label = match s.name.as_str() {
            "no_jitter" => "no jitter: sleep = Retry-After".to_string(),
            "jitter" => "Retry-After + uniform(0, J)".to_string(),
            other => other.to_string(),
        };
        let pts = s
            .per_second
            .iter()
            .map(|p| (p.t_s as f64, p.requests as f64))
            .collect();
        chart = chart.series(Series::new(label, pts));
    }
    chart.render()
}

/// Retries per second as a table.
pub fn table(report: &HerdReport) -> String {
    let mut header = vec!["seconds after rejection".to_string()];
    header.extend(report.series.iter().map(|s| s.name.replace('_', " ")));
    let n = report
        .series
        .iter()
        .map(|s| s.per_second.len())
        .max()
        .unwrap_or(0);
    let mut rows: Vec<Vec<String>> = (0..n)
        .map(|i| {
            let t = report.series[0]
                .per_second
                .get(i)
                .map(|p| p.t_s)
                .unwrap_or(0);
            let mut row = vec![format!("{}–{} s", t, t + 1)];
            for s in &report.series {
                row.push(
                    s.per_second
                        .get(i)
                        .map_or("-".into(), |p| crate::table::count(p.requests)),
                );
            }
            row
        })
        .collect();
    let mut peak = vec!["peak in one ms".to_string()];
    peak.extend(
        report
            .series
            .iter()
            .map(|s| crate::table::count(s.peak_per_ms)),
    );
    rows.push(peak);
    let h: Vec<&str> = header.iter().map(String::as_str).collect();
    crate::table::render(&h, &rows)
}
