//! The incident rule: during an outage, the SDK's retries stay at or below
//! 10% of its normal traffic.
//!
//! The model: an application makes `rate` calls per second, evenly spaced,
//! through one SDK client. For `before` the service is healthy (a
//! generous limit, every answer a 200 with headers); then for `incident`
//! every request gets a 503 (or 429) with a short `Retry-After`; then it
//! recovers. The SDK retries what can be retried, under its retry budget
//! (10% of the last minute's first attempts, plus a small reserve), while
//! its adaptive throttle drops first attempts as accepts vanish. The run
//! counts, per second, the first attempts sent, the retries sent and the
//! calls dropped locally or given up on (the application waits at most
//! `deadline` for a call to be sent), and compares the retries during the
//! incident to the normal traffic before it.
//!
//! The other end of the scale, [`small_client`]: 40 calls, and a short
//! burst of 429s that rejects about ten of them at once. A share of 10%
//! would allow four retries in all; the budget's floor (a bucket of retry
//! tokens) lets every one of them through, since the server said when to
//! come back.
//!
//! ```
//! use paceline_core::Nanos;
//! use paceline_sim::scenario::incident::{self, IncidentParams};
//!
//! let p = IncidentParams { incident: Nanos::from_secs(120), ..Default::default() };
//! let r = incident::run(&p, 3);
//! assert!(r.retries_peak_minute_ratio <= 0.10);
//!
//! let small = incident::small_client(true, 1);
//! assert_eq!((small.calls_done, small.retries_refused), (40, 0));
//! ```

use paceline_client::{
    After as SdkAfter, Before as SdkBefore, Call, Client, ClientError, Config, RequestInfo,
};
use paceline_core::{Nanos, Plan, Policy};
use serde::{Deserialize, Serialize};

use crate::engine::EventQueue;
use crate::gateway::{Answer, Fault, Gateway};
use crate::report::round3;
use crate::scenario::START;
use crate::sdk;
use crate::svg::{Chart, Series};

/// The numbers of the incident scenario.
#[derive(Clone, Debug, PartialEq)]
pub struct IncidentParams {
    /// Calls per second the application makes.
    pub rate: u64,
    /// Healthy time before the incident.
    pub before: Nanos,
    /// How long the incident lasts.
    pub incident: Nanos,
    /// Healthy time after it.
    pub after: Nanos,
    /// The status answered during the incident.
    pub status: u16,
    /// The `Retry-After` sent during the incident (0: none).
    pub retry_after_s: u64,
    /// One-way latency.
    pub latency: Nanos,
    /// How long the application lets a call wait to be sent before it
    /// gives up on it.
    pub deadline: Nanos,
}

impl Default for IncidentParams {
    fn default() -> Self {
        IncidentParams {
            rate: 100,
            before: Nanos::from_secs(120),
            incident: Nanos::from_secs(300),
            after: Nanos::from_secs(900),
            status: 503,
            retry_after_s: 1,
            latency: Nanos::from_millis(20),
            deadline: Nanos::from_secs(30),
        }
    }
}

/// What the incident did to the client's traffic.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct IncidentReport {
    /// First attempts per second before the incident.
    pub normal_rps: f64,
    /// When the incident started and ended, seconds from the start.
    pub incident_from_s: f64,
    /// See `incident_from_s`.
    pub incident_until_s: f64,
    /// Retries sent during the incident.
    pub retries: u64,
    /// Retries per second during the incident, on average.
    pub retries_per_s: f64,
    /// Retries during the incident divided by the normal traffic of the
    /// same length.
    pub retries_ratio: f64,
    /// The largest number of retries in any 60 s of the incident, divided
    /// by a minute of normal traffic (the rule: at most 0.10).
    pub retries_peak_minute_ratio: f64,
    /// First attempts sent during the incident.
    pub first_attempts: u64,
    /// Calls the client dropped locally during the incident.
    pub local_drops: u64,
    /// Seconds from the end of the incident until the client sends 90% of
    /// its normal traffic again (over ten seconds); `null` if it never did
    /// within the run.
    pub recovered_after_s: Option<f64>,
    /// Calls the application gave up on during the incident (they could
    /// not be sent before its deadline).
    pub timed_out: u64,
    /// Per second from the start: first attempts sent, retries sent, calls
    /// dropped locally, calls given up on.
    pub per_second: Vec<[u64; 4]>,
    /// The seed of the run.
    pub seed: u64,
}

enum Ev {
    Call,
    Before { call: usize },
    Arrive { call: usize },
    Answer { call: usize, answer: Answer },
}

/// Runs the incident.
pub fn run(params: &IncidentParams, seed: u64) -> IncidentReport {
    let plan = Plan::new(
        "healthy",
        vec![
            Policy::token_bucket("burst", params.rate.saturating_mul(4).max(1), 1).expect("valid"),
        ],
    )
    .expect("one policy");
    let from = START.saturating_add(params.before);
    let until = from.saturating_add(params.incident);
    let end = until.saturating_add(params.after);
    let fault = Fault {
        from,
        until,
        status: params.status,
        retry_after_s: params.retry_after_s,
    };
    let mut gw = Gateway::new(plan, 1).with_fault(fault);
    let mut q = EventQueue::new(START);
    let client = sdk::client(q.clock(), seed);
    sdk::seed_from_usage(&client, &gw, 0, START);
    let mut calls: Vec<Option<Call>> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut started: Vec<Nanos> = Vec::new();
    let step = Nanos::new(1_000_000_000 / params.rate.max(1));
    let secs = (end.saturating_sub(START).as_secs_ceil() as usize).max(1);
    let mut per_second = vec![[0u64; 4]; secs];
    q.schedule_at(START, Ev::Call);
    while let Some((now, ev)) = q.pop() {
        let sec = now.saturating_sub(START).as_secs_floor() as usize;
        match ev {
            Ev::Call => {
                let call = client.call(RequestInfo::get(sdk::URL));
                let idx = match free.pop() {
                    Some(i) => {
                        calls[i] = Some(call);
                        started[i] = now;
                        i
                    }
                    None => {
                        calls.push(Some(call));
                        started.push(now);
                        calls.len() - 1
                    }
                };
                q.schedule_in(Nanos::ZERO, Ev::Before { call: idx });
                if now.saturating_add(step) < end {
                    q.schedule_in(step, Ev::Call);
                }
            }
            Ev::Before { call } => {
                let c = calls[call].as_mut().expect("live call");
                match client.before(c) {
                    SdkBefore::Go => {
                        let slot = if c.attempts() > 1 { 1 } else { 0 };
                        per_second[sec.min(secs - 1)][slot] += 1;
                        q.schedule_in(params.latency, Ev::Arrive { call });
                    }
                    SdkBefore::Wait(d)
                        if now.saturating_add(d)
                            <= started[call].saturating_add(params.deadline) =>
                    {
                        q.schedule_in(d.max(Nanos::new(1)), Ev::Before { call })
                    }
                    SdkBefore::Wait(_) => {
                        // the application's deadline passes first: it gives up
                        client.cancel(c);
                        per_second[sec.min(secs - 1)][3] += 1;
                        calls[call] = None;
                        free.push(call);
                    }
                    SdkBefore::Drop(_) => {
                        per_second[sec.min(secs - 1)][2] += 1;
                        calls[call] = None;
                        free.push(call);
                    }
                }
            }
            Ev::Arrive { call } => {
                let answer = gw.handle(0, 1, now);
                q.schedule_in(params.latency, Ev::Answer { call, answer });
            }
            Ev::Answer { call, answer } => {
                let c = calls[call].as_mut().expect("live call");
                let next = match sdk::observe(&gw, &answer, now) {
                    Some(obs) => client.after(c, &obs),
                    None => client.after_error(c, true, "connection reset"),
                };
                if let SdkAfter::RetryAfter(d) = next {
                    q.schedule_in(d, Ev::Before { call });
                } else {
                    calls[call] = None;
                    free.push(call);
                }
            }
        }
    }
    summarize(params, per_second, seed)
}

fn summarize(params: &IncidentParams, per_second: Vec<[u64; 4]>, seed: u64) -> IncidentReport {
    let b = params.before.as_secs_floor() as usize;
    let e = b + params.incident.as_secs_floor() as usize;
    // skip the first seconds of the healthy period (start-up)
    let warm = (b / 4).min(10);
    let normal: u64 = per_second[warm..b].iter().map(|s| s[0]).sum();
    let normal_rps = normal as f64 / (b - warm).max(1) as f64;
    let during = &per_second[b..e.min(per_second.len())];
    let retries: u64 = during.iter().map(|s| s[1]).sum();
    let first: u64 = during.iter().map(|s| s[0]).sum();
    let drops: u64 = during.iter().map(|s| s[2]).sum();
    let timed_out: u64 = during.iter().map(|s| s[3]).sum();
    let len = during.len().max(1) as f64;
    let minute = 60.min(during.len()).max(1);
    let peak = during
        .windows(minute)
        .map(|w| w.iter().map(|s| s[1]).sum::<u64>())
        .max()
        .unwrap_or(0);
    let normal_minute = normal_rps * minute as f64;
    let recovered_after_s = per_second
        .get(e..)
        .unwrap_or(&[])
        .windows(10)
        .position(|w| w.iter().map(|s| s[0]).sum::<u64>() as f64 >= 9.0 * normal_rps)
        .map(|i| i as f64);
    IncidentReport {
        normal_rps: round3(normal_rps),
        incident_from_s: params.before.as_secs_f64(),
        incident_until_s: params.before.saturating_add(params.incident).as_secs_f64(),
        retries,
        retries_per_s: round3(retries as f64 / len),
        retries_ratio: round3(retries as f64 / (normal_rps * len).max(1.0)),
        retries_peak_minute_ratio: round3(peak as f64 / normal_minute.max(1.0)),
        first_attempts: first,
        local_drops: drops,
        recovered_after_s,
        timed_out,
        per_second,
        seed,
    }
}

/// What a burst of 429s did to a small client.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SmallClientReport {
    /// Calls the application made.
    pub calls: u64,
    /// Calls that ended in a 200.
    pub calls_done: u64,
    /// 429s answered.
    pub rejected_429: u64,
    /// Retries the SDK wanted to make (a 429 with attempts left).
    pub retries_wanted: u64,
    /// Retries the budget let through.
    pub retries_granted: u64,
    /// Retries the budget refused (the call failed with `budget_exhausted`).
    pub retries_refused: u64,
    /// The floor the budget kept: tokens back per second, and its depth.
    pub floor_per_s: u32,
    /// See `floor_per_s`.
    pub floor_burst: u32,
}

/// The small-client case: 40 calls in four waves of ten (at 0, 1, 2 and
/// 3 s, the way ten workers start together) through one SDK client; the
/// second wave meets a burst of 429s with `Retry-After: 1` (ten calls
/// rejected at once). With `floor` the budget keeps its
/// default floor; without, only the 10% share and its reserve of three.
pub fn small_client(floor: bool, seed: u64) -> SmallClientReport {
    const CALLS: u64 = 40;
    let plan = Plan::new(
        "small",
        vec![Policy::token_bucket("burst", 100, 1).expect("valid")],
    )
    .expect("one policy");
    let latency = Nanos::from_millis(20);
    let fault = Fault {
        from: START.saturating_add(Nanos::from_millis(1_000)),
        until: START.saturating_add(Nanos::from_millis(1_100)),
        status: 429,
        retry_after_s: 1,
    };
    let mut gw = Gateway::new(plan, 1).with_fault(fault);
    let mut q = EventQueue::new(START);
    let mut config = Config::default();
    if !floor {
        config.budget_floor_per_s = 0;
    }
    let (floor_per_s, floor_burst) = (config.budget_floor_per_s, config.budget_floor_burst);
    let client = Client::builder()
        .clock(q.clock().clone())
        .seed(seed)
        .config(config)
        .build();
    let mut calls: Vec<Option<Call>> = Vec::new();
    let mut report = SmallClientReport {
        calls: CALLS,
        calls_done: 0,
        rejected_429: 0,
        retries_wanted: 0,
        retries_granted: 0,
        retries_refused: 0,
        floor_per_s,
        floor_burst,
    };
    for i in 0..CALLS {
        q.schedule_at(START.saturating_add(Nanos::from_secs(i / 10)), Ev::Call);
    }
    while let Some((now, ev)) = q.pop() {
        match ev {
            Ev::Call => {
                calls.push(Some(client.call(RequestInfo::get(sdk::URL))));
                q.schedule_in(
                    Nanos::ZERO,
                    Ev::Before {
                        call: calls.len() - 1,
                    },
                );
            }
            Ev::Before { call } => {
                let c = calls[call].as_mut().expect("live call");
                match client.before(c) {
                    SdkBefore::Go => q.schedule_in(latency, Ev::Arrive { call }),
                    SdkBefore::Wait(d) => q.schedule_in(d.max(Nanos::new(1)), Ev::Before { call }),
                    SdkBefore::Drop(_) => calls[call] = None,
                }
            }
            Ev::Arrive { call } => {
                let answer = gw.handle(0, 1, now);
                q.schedule_in(latency, Ev::Answer { call, answer });
            }
            Ev::Answer { call, answer } => {
                let c = calls[call].as_mut().expect("live call");
                let Some(obs) = sdk::observe(&gw, &answer, now) else {
                    calls[call] = None;
                    continue;
                };
                if obs.status == 429 {
                    report.rejected_429 += 1;
                    if c.attempts() < client.config().max_attempts {
                        report.retries_wanted += 1;
                    }
                }
                match client.after(c, &obs) {
                    SdkAfter::RetryAfter(d) => {
                        report.retries_granted += 1;
                        q.schedule_in(d, Ev::Before { call });
                    }
                    SdkAfter::Done => {
                        if obs.status < 400 {
                            report.calls_done += 1;
                        }
                        calls[call] = None;
                    }
                    SdkAfter::Error(ClientError::BudgetExhausted { .. }) => {
                        report.retries_refused += 1;
                        calls[call] = None;
                    }
                    SdkAfter::Error(_) => calls[call] = None,
                }
            }
        }
    }
    report
}

/// Traffic through the incident, in ten-second averages.
pub fn svg(report: &IncidentReport) -> String {
    const AVG: usize = 10;
    let pts = |i: usize| -> Vec<(f64, f64)> {
        report
            .per_second
            .chunks(AVG)
            .enumerate()
            .map(|(t, c)| {
                let sum: u64 = c.iter().map(|s| s[i]).sum();
                ((t * AVG) as f64, sum as f64 / c.len() as f64)
            })
            .collect()
    };
    let n = report.per_second.len() as f64;
    let cap = report.normal_rps * 0.10;
    Chart::lines(
        "The SDK through an incident",
        "seconds from the start",
        "per second (10 s averages)",
    )
    .band(report.incident_from_s, report.incident_until_s, "incident")
    .series(Series::new("first attempts sent", pts(0)))
    .series(Series::new("retries sent", pts(1)))
    .series(Series::new("dropped locally (throttle)", pts(2)))
    .series(Series::new("given up (deadline)", pts(3)))
    .series(Series::new("10% of normal traffic", vec![(0.0, cap), (n, cap)]).dashed())
    .render()
}

/// The incident as a table.
pub fn table(r: &IncidentReport) -> String {
    let rows = vec![
        vec![
            "normal traffic".into(),
            format!("{:.1} req/s", r.normal_rps),
        ],
        vec![
            "incident".into(),
            format!("{:.0}–{:.0} s", r.incident_from_s, r.incident_until_s),
        ],
        vec![
            "first attempts sent during it".into(),
            crate::table::count(r.first_attempts),
        ],
        vec![
            "dropped locally during it".into(),
            crate::table::count(r.local_drops),
        ],
        vec![
            "given up on during it".into(),
            crate::table::count(r.timed_out),
        ],
        vec![
            "back to 90% of normal after".into(),
            r.recovered_after_s
                .map_or("not within the run".into(), |s| format!("{s:.0} s")),
        ],
        vec![
            "retries sent during it".into(),
            crate::table::count(r.retries),
        ],
        vec![
            "retries per second".into(),
            format!("{:.2}", r.retries_per_s),
        ],
        vec![
            "retries / normal traffic".into(),
            format!("{:.1}%", r.retries_ratio * 100.0),
        ],
        vec![
            "worst minute / normal minute".into(),
            format!("{:.1}% (rule: ≤ 10%)", r.retries_peak_minute_ratio * 100.0),
        ],
    ];
    crate::table::render(&["measure", "value"], &rows)
}
