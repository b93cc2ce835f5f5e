//! Adaptive throttling, measured: how much a client drops locally as the
//! share of its requests the server accepts falls.
//!
//! The model: one SDK client whose application asks for `demand` requests
//! per second, evenly spaced, and never retries. The server behind it can
//! accept only a share of the demand (a token bucket of `ratio · demand`
//! per second with ten seconds of depth, run by the real limiter) and,
//! publishing nothing, sheds the rest with a bare 503; at a share of zero
//! every request meets a 503. The server is healthy for the first window
//! (so the run follows a client whose backend degrades), degraded for a
//! second window of warm-up, and then the run measures the share of
//! asked-for requests the client dropped, and the accept ratio the client
//! itself counted (accepts over requests).
//!
//! For large counts the SRE book's formula gives
//! `p ≈ max(0, 1 − K · accept_ratio)`: the client keeps sending about K
//! times what the server accepts, and drops the rest.
//!
//! ```
//! use paceline_sim::scenario::throttle::{self, ThrottleParams};
//!
//! let params = ThrottleParams { ratios: vec![0.3], ks: vec![2.0], ..Default::default() };
//! let report = throttle::run(&params, 1);
//! let p = &report.curves[0].points[0];
//! assert!((p.drop_probability - 0.4).abs() < 0.03);
//! ```

use paceline_client::{Before, Client, Config, RequestInfo};
use paceline_core::{ManualClock, Nanos, Plan, Policy};

use crate::gateway::{Fault, Gateway, Verdict};
use crate::report::{round3, ThrottleCurve, ThrottlePoint, ThrottleReport};
use crate::rng;
use crate::scenario::START;
use crate::sdk;
use crate::svg::{Chart, Series};

/// The numbers of the throttle scenario.
#[derive(Clone, Debug, PartialEq)]
pub struct ThrottleParams {
    /// The multipliers K to draw a curve for.
    pub ks: Vec<f64>,
    /// The shares of demand the server can accept, one point each.
    pub ratios: Vec<f64>,
    /// Requests per second the application asks for.
    pub demand: u64,
    /// The throttle's window (and the warm-up before measuring).
    pub window: Nanos,
    /// How long each point is measured after the warm-up.
    pub measure: Nanos,
}

impl Default for ThrottleParams {
    fn default() -> Self {
        ThrottleParams {
            ks: vec![2.0, 1.1],
            ratios: (0..=10).map(|i| f64::from(i) / 10.0).collect(),
            demand: 50,
            window: Nanos::from_secs(120),
            measure: Nanos::from_secs(180),
        }
    }
}

/// Runs every (K, ratio) point.
pub fn run(params: &ThrottleParams, seed: u64) -> ThrottleReport {
    let curves = params
        .ks
        .iter()
        .enumerate()
        .map(|(ki, &k)| ThrottleCurve {
            k,
            points: params
                .ratios
                .iter()
                .enumerate()
                .map(|(ri, &ratio)| {
                    let s = rng::derive(seed, (ki * 1_000 + ri) as u64);
                    point(params, k, ratio, s)
                })
                .collect(),
        })
        .collect();
    ThrottleReport { curves, seed }
}

fn gateway_for(demand: u64, ratio: f64) -> Gateway {
    let per_s = (ratio * demand as f64).round() as u64;
    if per_s == 0 {
        let plan = Plan::new(
            "down",
            vec![Policy::token_bucket("capacity", 1, 1).unwrap()],
        )
        .unwrap();
        let outage = Fault {
            from: Nanos::ZERO,
            until: Nanos::MAX,
            status: 503,
            retry_after_s: 0,
        };
        return Gateway::new(plan, 1).with_fault(outage).silent();
    }
    let plan = Plan::new(
        "capacity",
        vec![Policy::token_bucket("capacity", per_s * 10, 10).expect("positive capacity")],
    )
    .expect("one policy");
    Gateway::new(plan, 1).silent()
}

fn point(params: &ThrottleParams, k: f64, ratio: f64, seed: u64) -> ThrottlePoint {
    // a healthy window first (every request accepted), so the run measures
    // a client whose server degrades, not one starting cold
    let mut gateways = [
        gateway_for(params.demand, 4.0),
        gateway_for(params.demand, ratio),
    ];
    let clock = ManualClock::new(START);
    let config = Config {
        throttle_window: params.window.into(),
        throttle_k: k,
        ..Config::default()
    };
    let client = Client::builder()
        .clock(clock.clone())
        .seed(seed)
        .config(config)
        .build();
    let step = Nanos::new(1_000_000_000 / params.demand.max(1));
    let degrade_at = START.saturating_add(params.window);
    let measure_from = degrade_at.saturating_add(params.window);
    let end = measure_from.saturating_add(params.measure);
    let (mut asked, mut dropped, mut accepted) = (0u64, 0u64, 0u64);
    let mut now = START;
    while now < end {
        clock.set(now);
        let measured = u64::from(now >= measure_from);
        let gw = &mut gateways[usize::from(now >= degrade_at)];
        let mut call = client.call(RequestInfo::get(sdk::URL));
        match client.before(&mut call) {
            Before::Go => {
                let answer = gw.handle(0, 1, now);
                accepted += measured * u64::from(answer.verdict == Verdict::Served);
                if let Some(obs) = sdk::observe(gw, &answer, now) {
                    // the application does not retry here: only the
                    // throttle's counts matter
                    let _ = client.after(&mut call, &obs);
                }
            }
            Before::Wait(_) => client.cancel(&mut call),
            Before::Drop(_) => dropped += measured,
        }
        asked += measured;
        now = now.saturating_add(step);
    }
    let accept_ratio = accepted as f64 / asked.max(1) as f64;
    ThrottlePoint {
        accept_ratio: round3(accept_ratio),
        drop_probability: round3(dropped as f64 / asked.max(1) as f64),
        formula: round3((1.0 - k * accept_ratio).max(0.0)),
        server_capacity_ratio: ratio,
        requests: asked,
    }
}

/// The drop curves as a plot.
pub fn svg(report: &ThrottleReport) -> String {
    let mut chart = Chart::lines(
        "Adaptive throttling: local drops as accepts fall",
        "accept ratio (accepts / requests, last 2 min)",
        "share of requests dropped locally",
    );
    for (i, c) in report.curves.iter().enumerate() {
        let pts = c
            .points
            .iter()
            .map(|p| (p.accept_ratio, p.drop_probability))
            .collect();
        chart = chart.series(
            Series::new(format!("K = {} (simulated)", c.k), pts)
                .markers()
                .color(i),
        );
        let formula = (0..=100)
            .map(|j| {
                let x = f64::from(j) / 100.0;
                (x, (1.0 - c.k * x).max(0.0))
            })
            .collect();
        chart = chart.series(
            Series::new(format!("K = {}: max(0, 1 − K·ratio)", c.k), formula)
                .dashed()
                .color(i),
        );
    }
    chart.render()
}

/// The curves as a table, one row per ratio.
pub fn table(report: &ThrottleReport) -> String {
    let mut header = vec!["accept ratio".to_string()];
    for c in &report.curves {
        header.push(format!("K={} simulated", c.k));
        header.push(format!("K={} formula", c.k));
    }
    let n = report.curves.first().map_or(0, |c| c.points.len());
    let rows: Vec<Vec<String>> = (0..n)
        .map(|i| {
            let mut row = vec![format!(
                "{:.1}",
                report.curves[0].points[i].server_capacity_ratio
            )];
            for c in &report.curves {
                let p = &c.points[i];
                row.push(format!("{:.3}", p.drop_probability));
                row.push(format!("{:.3}", p.formula));
            }
            row
        })
        .collect();
    let h: Vec<&str> = header.iter().map(String::as_str).collect();
    crate::table::render(&h, &rows)
}
