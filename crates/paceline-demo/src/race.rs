//! The two-fleet race over real HTTP, through the real gateway: the race
//! `paceline sim race` runs on virtual time, run live.
//!
//! It takes the simulator's [`RaceParams`] and reports each fleet as the
//! simulator's [`FleetReport`], so the two commands state one race and
//! report it the same way. Each run starts its own [`RaceStack`]: the demo
//! API behind `paceline-gateway`, configured like any deployment (a token
//! bucket per fleet's key, `[gateway.shedding] max_rps` for the edge's
//! capacity). The cooperative fleet sends through the SDK over reqwest (it
//! reads the headers and paces); the naive fleet sends again every
//! `naive_retry` and ignores `Retry-After`.
//!
//! What is counted, and where: every answer the gateway gives a fleet
//! (200, `429`, `503` from the edge) as it comes off the wire, below the
//! SDK (so each of its attempts is seen); what was served, by the demo API
//! (what reached it with the fleet's key); the tokens in each bucket, by
//! the gateway's own limiter ([`paceline_server::RateLimiter::peek_key`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use paceline_gateway::{Gateway, GatewayConfig, GatewayHandle};
use paceline_sim::report::FleetReport;
use paceline_sim::scenario::race::RaceParams;
use parking_lot::Mutex;
use reqwest_middleware::ClientWithMiddleware;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::api::{self as demo, DemoOptions, DemoUpstream};

/// The fleets' names and API keys, cooperative first.
pub const FLEETS: [(&str, &str); 2] = [
    ("cooperative", "sk_race_cooperative"),
    ("naive", "sk_race_naive"),
];

/// How often the page is sent the race's state while it runs.
pub const TICK: Duration = Duration::from_millis(100);

/// The most ticks one run keeps (a run that never ends stops recording
/// after this many; 10 minutes at [`TICK`]).
pub const MAX_TICKS: usize = 6_000;

/// The most messages a page may fall behind by before it is let go.
const FEED_BACKLOG: usize = 512;

/// The most pages listening at once.
pub const MAX_LISTENERS: usize = 64;

/// The most round trips of the cooperative fleet one run keeps.
const MAX_ROUND_TRIPS: usize = 100_000;

/// The most gateway instances one race goes through.
pub const MAX_INSTANCES: u32 = 16;

/// How long a gateway waits for Redis before deciding without it: long
/// enough that a busy machine's late answer is not taken for an outage
/// (which would admit the request uncounted).
pub const REDIS_DEADLINE_MS: u64 = 250;

/// Where the race's gateways keep their counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Store {
    /// Each instance in its own memory: each counts alone.
    Memory,
    /// One Redis shared by every instance: one count.
    Redis,
}

/// How many gateways the race goes through, and where they count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Deployment {
    /// Gateway instances, behind a round-robin front when more than one
    /// (1..=[`MAX_INSTANCES`]).
    pub instances: u32,
    /// The Redis every instance counts in; `None`: the memory store.
    pub redis_url: Option<String>,
}

impl Default for Deployment {
    fn default() -> Self {
        Deployment {
            instances: 1,
            redis_url: None,
        }
    }
}

impl Deployment {
    /// Where the instances count.
    pub fn store(&self) -> Store {
        match self.redis_url {
            Some(_) => Store::Redis,
            None => Store::Memory,
        }
    }

    /// Why this deployment cannot be run, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        if !(1..=MAX_INSTANCES).contains(&self.instances) {
            return Err(format!(
                "instances = {} is outside 1..={MAX_INSTANCES}",
                self.instances
            ));
        }
        Ok(())
    }
}

/// What a person may change between runs (the dashboard's controls).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Controls {
    /// Tokens a second each bucket refills: the rate the API sells.
    pub refill_per_s: u64,
    /// Tokens each bucket holds: the burst it forgives.
    pub depth: u64,
    /// Workers per fleet.
    pub workers: u32,
}

/// The bounds of [`Controls`]: refill rate, depth, workers.
pub const CONTROL_BOUNDS: [(&str, u64, u64); 3] = [
    ("refill_per_s", 1, 40),
    ("depth", 1, 200),
    ("workers", 1, 100),
];

impl Controls {
    /// The controls of `p`.
    pub fn of(p: &RaceParams) -> Controls {
        Controls {
            refill_per_s: p.quota / p.window_s.max(1),
            depth: p.quota,
            workers: p.workers,
        }
    }

    /// `base` with these controls applied, or why they cannot be run.
    pub fn apply(&self, base: &RaceParams) -> Result<RaceParams, String> {
        let values = [self.refill_per_s, self.depth, u64::from(self.workers)];
        for ((name, lo, hi), v) in CONTROL_BOUNDS.iter().zip(values) {
            if !(*lo..=*hi).contains(&v) {
                return Err(format!("{name} = {v} is outside {lo}..={hi}"));
            }
        }
        if self.depth % self.refill_per_s != 0 {
            return Err(format!(
                "a depth of {} does not refill in a whole number of seconds at {}/s \
                 (the gateway's policies count whole seconds): pick a depth that is a \
                 multiple of the refill rate",
                self.depth, self.refill_per_s
            ));
        }
        Ok(RaceParams {
            quota: self.depth,
            window_s: self.depth / self.refill_per_s,
            workers: self.workers,
            ..base.clone()
        })
    }
}

/// The gateway configuration of a race on `p` in front of `upstream`:
/// what a deployment would write.
pub fn gateway_toml(
    p: &RaceParams,
    upstream: std::net::SocketAddr,
    redis_url: Option<&str>,
) -> String {
    let (store, redis) = match redis_url {
        Some(url) => (
            "store = \"redis\"\n",
            format!("\n[gateway.redis]\nurl = \"{url}\"\ndeadline_ms = {REDIS_DEADLINE_MS}\n"),
        ),
        None => ("", String::new()),
    };
    let keys: String = FLEETS
        .iter()
        .map(|(_, k)| format!("{k} = \"race\"\n"))
        .collect();
    format!(
        r#"[gateway]
listen = "127.0.0.1:0"
upstream = "http://{upstream}"
watch = false
{store}
[gateway.shedding]
max_rps = {capacity}
{redis}
[plans.race]
policies = [{{ name = "burst", algorithm = "token_bucket", q = {q}, w = {w} }}]

[keys]
{keys}
# the race shows pacing, not punishment: escalation would block the
# naive fleet outright
[escalation]
enabled = false
"#,
        capacity = p.capacity,
        q = p.quota,
        w = p.window_s,
    )
}

/// One gateway process's worth, in this process.
struct Instance {
    url: String,
    handle: GatewayHandle,
    served: tokio::task::JoinHandle<std::io::Result<()>>,
}

/// What one run races against: the demo API and the gateways in front of
/// it; with more than one, a round-robin front is the entry.
pub struct RaceStack {
    api: DemoUpstream,
    instances: Vec<Instance>,
    front: Option<crate::front::Front>,
    entry: String,
    params: RaceParams,
}

/// A fresh key-hash secret: one per run, shared by its instances (so they
/// name a key's row in Redis alike, and a run does not find the last
/// run's counts).
pub(crate) fn run_secret() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl RaceStack {
    /// Starts the demo API and the gateways of `d` configured for `p`
    /// (behind a round-robin front when more than one), all on free
    /// loopback ports.
    pub async fn start(p: &RaceParams, d: &Deployment) -> anyhow::Result<RaceStack> {
        d.check().map_err(anyhow::Error::msg)?;
        let api = demo::serve(([127, 0, 0, 1], 0).into(), DemoOptions::default())
            .await
            .context("starting the demo API")?;
        let text = gateway_toml(p, api.addr(), d.redis_url.as_deref());
        let secret = run_secret();
        let env =
            |var: &str| (var == paceline_gateway::KEY_HASH_SECRET_ENV).then(|| secret.clone());
        let mut instances = Vec::new();
        for n in 1..=d.instances {
            let config = GatewayConfig::parse_with_env(&text, "race.toml", None, &env)
                .map_err(|e| anyhow::anyhow!("the race's gateway configuration: {e}"))?;
            let gateway = Gateway::bind(config)
                .await
                .with_context(|| format!("starting the race's gateway {n}"))?;
            let url = format!("http://{}", gateway.local_addr());
            let handle = gateway.handle();
            let served = tokio::spawn(gateway.run(std::future::pending()));
            instances.push(Instance {
                url,
                handle,
                served,
            });
        }
        let (front, entry) = if instances.len() > 1 {
            let urls = instances.iter().map(|i| i.url.clone()).collect();
            let front = crate::front::Front::start(([127, 0, 0, 1], 0).into(), urls).await?;
            let entry = format!("http://{}", front.addr());
            (Some(front), entry)
        } else {
            (None, instances[0].url.clone())
        };
        Ok(RaceStack {
            api,
            instances,
            front,
            entry,
            params: p.clone(),
        })
    }

    /// Where the fleets send: the front, or the one gateway.
    pub fn entry(&self) -> &str {
        &self.entry
    }

    /// The tokens in `key`'s bucket as the (first) gateway sees them now
    /// (fractional; `None` for a key it does not know; with the count in
    /// Redis, as Redis last answered that gateway for the key, `None`
    /// before its first answer).
    pub fn tokens(&self, key: &str) -> Option<f64> {
        let (_, d) = self.instances[0].handle.limiter().peek_key(key)?;
        let to_full = d.statuses.first()?.reset_after.as_secs_f64();
        let p = &self.params;
        let depth = p.quota as f64;
        Some((depth - to_full * p.rate_per_s()).clamp(0.0, depth))
    }

    /// Requests with `key` that reached the demo API: served.
    pub fn served(&self, key: &str) -> u64 {
        self.api.hits_by_key(key)
    }

    /// The time by the gateway's clock.
    pub fn clock_now(&self) -> paceline_core::Nanos {
        use paceline_core::Clock;
        self.instances[0].handle.limiter().clock().now()
    }

    /// Stops every gateway, letting requests in flight finish.
    pub async fn stop(self) -> anyhow::Result<()> {
        if let Some(front) = self.front {
            front.stop();
        }
        for i in self.instances {
            i.handle.shutdown();
            i.served.await.context("a gateway task failed")??;
        }
        Ok(())
    }
}

/// Live counters of one fleet.
#[derive(Default)]
pub(crate) struct Counters {
    /// Job requests that got an answer from the gateway (or failed).
    pub(crate) requests: AtomicU64,
    /// 2xx answers.
    pub(crate) answered_2xx: AtomicU64,
    pub(crate) rejected_429: AtomicU64,
    /// `503`s: dropped at the edge.
    pub(crate) dropped: AtomicU64,
    /// What reached the demo API (read at each tick and at the end).
    pub(crate) served: AtomicU64,
    /// Requests a worker sent again after a failed one.
    pub(crate) retries: AtomicU64,
    pub(crate) jobs_done: AtomicU64,
    pub(crate) finished_at_ms: AtomicU64,
    /// Whole tokens left by the last answer's `RateLimit` field, plus one
    /// (0: none yet): the bucket as published, when it cannot be read.
    pub(crate) published_left: AtomicU64,
}

/// One fleet at one tick.
#[derive(Clone, Debug, Serialize)]
pub struct FleetTick {
    /// Jobs done.
    pub jobs_done: u64,
    /// Requests answered so far.
    pub requests: u64,
    /// Requests the API served.
    pub served: u64,
    /// `429`s.
    pub rejected_429: u64,
    /// Dropped at the edge (`503`).
    pub dropped: u64,
    /// Tokens in the fleet's bucket, as the gateway sees them.
    pub tokens: f64,
    /// When the fleet finished (seconds), once it has.
    pub finished_at_s: Option<f64>,
}

/// The race's state at one instant, as the page is sent it.
#[derive(Clone, Debug, Serialize)]
pub struct Tick {
    /// Seconds since the start.
    pub t_s: f64,
    /// Cooperative, then naive.
    pub fleets: [FleetTick; 2],
}

/// The last answer the cooperative fleet's SDK read, and what it read.
#[derive(Clone, Debug, Serialize)]
pub struct LastResponse {
    /// Seconds since the start.
    pub t_s: f64,
    /// The status.
    pub status: u16,
    /// The rate-limit fields as sent (`RateLimit-Policy`, `RateLimit`,
    /// `Retry-After`).
    pub fields: Vec<(String, String)>,
    /// What the client concludes (`success`, `rate_limited`, ...).
    pub outcome: String,
    /// The bucket's depth, as published.
    pub limit: Option<u64>,
    /// Whole tokens left.
    pub remaining: Option<u64>,
    /// Seconds until the bucket is full again.
    pub reset_in_s: Option<f64>,
    /// The window the depth refills over, in seconds.
    pub window_s: Option<u64>,
    /// Seconds to wait before the next request, when it may not go now.
    pub retry_after_s: Option<f64>,
}

/// One run of the race.
pub(crate) struct Run {
    pub(crate) params: RaceParams,
    started: Instant,
    pub(crate) fleets: [Counters; 2],
    pub(crate) ticks: Mutex<Vec<Tick>>,
    pub(crate) last_response: Mutex<Option<LastResponse>>,
    /// The cooperative fleet's round trips, in microseconds.
    round_trips_us: Mutex<Vec<u64>>,
    sdk: Mutex<Option<paceline_client::Client>>,
    pub(crate) results: Mutex<Option<Vec<FleetReport>>>,
    /// What each fleet was admitted against one limit, once done.
    pub(crate) admitted: Mutex<Option<Vec<Admitted>>>,
}

impl Run {
    fn new(params: RaceParams) -> Run {
        Run {
            params,
            started: Instant::now(),
            fleets: Default::default(),
            ticks: Mutex::new(Vec::new()),
            last_response: Mutex::new(None),
            round_trips_us: Mutex::new(Vec::new()),
            sdk: Mutex::new(None),
            results: Mutex::new(None),
            admitted: Mutex::new(None),
        }
    }

    fn elapsed_s(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    fn finished_at_s(&self, f: usize) -> Option<f64> {
        let c = &self.fleets[f];
        (c.jobs_done.load(Ordering::Relaxed) >= self.params.jobs)
            .then(|| c.finished_at_ms.load(Ordering::Relaxed) as f64 / 1000.0)
    }

    /// Reads what the gateway and the API hold now.
    fn tick(&self, stack: &RaceStack) -> Tick {
        let fleets = [0, 1].map(|f| {
            let c = &self.fleets[f];
            let key = FLEETS[f].1;
            c.served.store(stack.served(key), Ordering::Relaxed);
            FleetTick {
                jobs_done: c.jobs_done.load(Ordering::Relaxed),
                requests: c.requests.load(Ordering::Relaxed),
                served: c.served.load(Ordering::Relaxed),
                rejected_429: c.rejected_429.load(Ordering::Relaxed),
                dropped: c.dropped.load(Ordering::Relaxed),
                tokens: stack
                    .tokens(key)
                    .or_else(|| {
                        let left = c.published_left.load(Ordering::Relaxed);
                        (left > 0).then(|| (left - 1) as f64)
                    })
                    .unwrap_or(0.0),
                finished_at_s: self.finished_at_s(f),
            }
        });
        Tick {
            t_s: (self.elapsed_s() * 1000.0).round() / 1000.0,
            fleets,
        }
    }

    /// The results, cooperative first.
    pub(crate) fn reports(&self) -> Vec<FleetReport> {
        let sdk = self.sdk.lock().as_ref().map(|s| s.diagnostics());
        FLEETS
            .iter()
            .zip(&self.fleets)
            .enumerate()
            .map(|(i, ((name, _), c))| {
                let (sdk_retries, local_drops) = match (&sdk, i) {
                    (Some(d), 0) => (d.retries, d.local_drops),
                    _ => (0, 0),
                };
                let dropped = c.dropped.load(Ordering::Relaxed);
                FleetReport {
                    name: name.to_string(),
                    jobs: self.params.jobs,
                    jobs_done: c.jobs_done.load(Ordering::Relaxed),
                    requests: c.requests.load(Ordering::Relaxed),
                    rejected_429: c.rejected_429.load(Ordering::Relaxed),
                    dropped,
                    finished_at_s: self.finished_at_s(i),
                    rejected_503: dropped,
                    retries: c.retries.load(Ordering::Relaxed) + sdk_retries,
                    local_drops,
                    jobs_failed: 0,
                    timeline: Default::default(),
                    served: Some(c.served.load(Ordering::Relaxed)),
                    tokens_left: self
                        .ticks
                        .lock()
                        .last()
                        .map(|t| t.fleets[i].tokens.floor() as u64),
                }
            })
            .collect()
    }

    /// The cooperative fleet's round trips: p50, p99 and the longest, in
    /// milliseconds (what the SDK's pacing margin must cover).
    pub(crate) fn round_trips_ms(&self) -> Option<[f64; 3]> {
        let mut v = self.round_trips_us.lock().clone();
        if v.is_empty() {
            return None;
        }
        v.sort_unstable();
        let at = |q: f64| v[((v.len() - 1) as f64 * q).floor() as usize] as f64 / 1000.0;
        Some([at(0.5), at(0.99), at(1.0)])
    }
}

/// The race: its settings, the last run and the feed the page listens to.
pub struct Race {
    params: Mutex<RaceParams>,
    run: Mutex<Option<Arc<Run>>>,
    running: AtomicBool,
    runs: AtomicU64,
    /// The pages listening.
    feed: Mutex<Vec<mpsc::Sender<Arc<str>>>>,
    /// The cooperative fleet's SDK pace margin (the SDK's default unless
    /// set, to measure what it must be).
    margin: Mutex<std::time::Duration>,
    /// The gateways each run goes through.
    deployment: Mutex<Deployment>,
}

impl Race {
    /// A race on `params` (only `workers`, `jobs`, `quota`, `window_s`,
    /// `capacity` and `naive_retry` apply: the network is real).
    pub fn new(params: RaceParams) -> Arc<Race> {
        Arc::new(Race {
            params: Mutex::new(params),
            run: Mutex::new(None),
            running: AtomicBool::new(false),
            runs: AtomicU64::new(0),
            feed: Mutex::new(Vec::new()),
            margin: Mutex::new(paceline_client::DEFAULT_PACE_MARGIN),
            deployment: Mutex::new(Deployment::default()),
        })
    }

    /// The numbers the next run uses.
    pub fn params(&self) -> RaceParams {
        self.params.lock().clone()
    }

    /// Changes the numbers of the next run; refused while one runs.
    pub fn set_controls(&self, c: Controls) -> Result<RaceParams, String> {
        if self.is_running() {
            return Err("a race is running; wait for it to finish".into());
        }
        let p = c.apply(&self.params())?;
        *self.params.lock() = p.clone();
        Ok(p)
    }

    /// Sets the cooperative fleet's SDK pace margin (to measure what it
    /// must be; the SDK's default otherwise).
    pub fn set_pace_margin(&self, margin: std::time::Duration) {
        *self.margin.lock() = margin;
    }

    fn pace_margin(&self) -> std::time::Duration {
        *self.margin.lock()
    }

    /// Sets the gateways each run goes through; refused when out of
    /// bounds or while a run is under way.
    pub fn set_deployment(&self, d: Deployment) -> Result<(), String> {
        d.check()?;
        if self.is_running() {
            return Err("a race is running; wait for it to finish".into());
        }
        *self.deployment.lock() = d;
        Ok(())
    }

    /// The gateways each run goes through.
    pub fn deployment(&self) -> Deployment {
        self.deployment.lock().clone()
    }

    /// Whether a run is under way.
    pub fn is_running(&self) -> bool {
        self.running.load(Ordering::Acquire)
    }

    /// Runs started so far.
    pub fn runs(&self) -> u64 {
        self.runs.load(Ordering::Relaxed)
    }

    pub(crate) fn last_run(&self) -> Option<Arc<Run>> {
        self.run.lock().clone()
    }

    /// Listens to what the pages are sent (JSON messages); the oldest
    /// listener is let go when [`MAX_LISTENERS`] already listen.
    pub(crate) fn subscribe(&self) -> mpsc::Receiver<Arc<str>> {
        let (tx, rx) = mpsc::channel(FEED_BACKLOG);
        let mut feed = self.feed.lock();
        if feed.len() >= MAX_LISTENERS {
            feed.remove(0);
        }
        feed.push(tx);
        rx
    }

    fn send(&self, msg: serde_json::Value) {
        let msg: Arc<str> = msg.to_string().into();
        // a page gone, or too far behind, is let go
        self.feed
            .lock()
            .retain(|tx| tx.try_send(msg.clone()).is_ok());
    }

    /// The results of the last run (nothing done before the first).
    pub fn results(&self) -> Vec<FleetReport> {
        match self.last_run() {
            Some(run) => run.reports(),
            None => Run::new(self.params()).reports(),
        }
    }
}

/// Binds the race's dashboard on `listen` and returns the listener and
/// its URL.
pub async fn bind(listen: &str) -> anyhow::Result<(tokio::net::TcpListener, String)> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let url = format!("http://{}", listener.local_addr()?);
    Ok((listener, url))
}

/// Serves the race's dashboard on `listener` until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, race: Arc<Race>) {
    if let Err(e) = axum::serve(listener, crate::dashboard::routes(race)).await {
        eprintln!("paceline: dashboard stopped: {e}");
    }
}

/// Clears the running flag however a run ends.
struct Running<'a>(&'a AtomicBool);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// The outcome of one run: the fleets, and how close the cooperative
/// fleet's pacing came to a 429.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    /// The race's floor, in seconds.
    pub floor_s: f64,
    /// Cooperative, then naive.
    pub fleets: Vec<FleetReport>,
    /// What the cooperative fleet's pacing had to cover.
    pub pacing: Pacing,
    /// Gateway instances the fleets went through (behind a round-robin
    /// front when more than one).
    pub instances: u32,
    /// Where the instances counted.
    pub store: Store,
    /// Per fleet, what was admitted against what the published limit
    /// allows over the same time.
    pub admitted: Vec<Admitted>,
}

/// One fleet's admitted requests against the published limit.
#[derive(Clone, Debug, Serialize)]
pub struct Admitted {
    /// The fleet.
    pub name: String,
    /// Requests the API served (admitted by the gateways).
    pub admitted: u64,
    /// The most one published limit admits from a full bucket over the
    /// fleet's run (until it finished, or the race ended): the depth plus
    /// the refill over that time.
    pub one_limit_allows: f64,
    /// `admitted / one_limit_allows`: about 1 when the instances count as
    /// one, about the instance count when each counts alone.
    pub times_the_limit: f64,
}

/// Each fleet's admitted requests against what one limit of `p` allows
/// over its run (`ended_s` for a fleet that did not finish).
pub fn admitted(p: &RaceParams, fleets: &[FleetReport], ended_s: f64) -> Vec<Admitted> {
    fleets
        .iter()
        .map(|f| {
            let t = f.finished_at_s.unwrap_or(ended_s);
            let allows = p.quota as f64 + p.rate_per_s() * t;
            let admitted = f.served.unwrap_or(0);
            Admitted {
                name: f.name.clone(),
                admitted,
                one_limit_allows: (allows * 10.0).round() / 10.0,
                times_the_limit: (admitted as f64 / allows.max(1.0) * 100.0).round() / 100.0,
            }
        })
        .collect()
}

/// The lines under the result table saying what the admitted numbers
/// mean.
pub fn admitted_lines(p: &RaceParams, r: &RunReport) -> String {
    use std::fmt::Write;
    let store = match r.store {
        Store::Memory if r.instances > 1 => "each in its own memory, each counting alone",
        Store::Memory => "in memory",
        Store::Redis => "in one shared Redis, counting as one",
    };
    let mut out = format!(
        "{} gateway instance{} ({store}); published limit per key: {} tokens, refilled {}/s\n",
        r.instances,
        if r.instances == 1 { "" } else { "s" },
        p.quota,
        p.rate_per_s(),
    );
    for a in &r.admitted {
        let _ = writeln!(
            out,
            "  {:<12} admitted {:>4}; one limit allows {:>6.1} over its run: {:.2}x the limit",
            a.name, a.admitted, a.one_limit_allows, a.times_the_limit
        );
    }
    out.push_str(
        "  (admitted: requests served; one limit allows: the depth plus the refill until the \
         fleet finished; about 1x: the instances count as one, about Nx: each counts alone)\n",
    );
    out
}

/// What the cooperative fleet's pacing had to cover, measured in one run.
#[derive(Clone, Debug, Serialize)]
pub struct Pacing {
    /// The SDK's pace margin in force, in milliseconds.
    pub margin_ms: f64,
    /// Round trips to the gateway (p50, p99, max), in milliseconds.
    pub round_trip_ms: Option<[f64; 3]>,
    /// The least headroom any request had: how long before it arrived
    /// (at the API, behind the gateway) a bucket on those arrivals would
    /// have held its token, in milliseconds; below 0, that request would
    /// have been refused.
    pub min_headroom_ms: Option<f64>,
    /// How far the gateway's clock moved from the client's over the run,
    /// in milliseconds (positive: the gateway's ran ahead).
    pub clock_drift_ms: f64,
}

/// The least headroom of the paced requests among `arrivals` (in order;
/// those after the first `quota`, the burst) under a bucket of `quota`
/// units refilling over `window_s`, full at the first: how long before
/// each arrived its token was there; in milliseconds.
pub fn min_headroom_ms(arrivals: &[Instant], quota: u64, window_s: u64) -> Option<f64> {
    let first = *arrivals.first()?;
    let span = window_s as f64;
    let emission = span / quota.max(1) as f64;
    let mut tat = 0.0f64;
    let mut least = None::<f64>;
    for (i, a) in arrivals.iter().enumerate() {
        let at = a.duration_since(first).as_secs_f64();
        let after = tat.max(at) + emission;
        // the burst spends what is there; the paced ones are measured
        if i as u64 >= quota {
            let h = span - (after - at);
            least = Some(least.map_or(h, |l| l.min(h)));
        }
        tat = after;
    }
    least.map(|l| (l * 1e6).round() / 1e3)
}

/// Runs one race on the race's current numbers, against a stack of its
/// own; refused while another runs.
pub async fn run(race: Arc<Race>) -> anyhow::Result<RunReport> {
    if race
        .running
        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        anyhow::bail!("a race is already running");
    }
    let _running = Running(&race.running);
    let params = race.params();
    let deployment = race.deployment();
    let stack = Arc::new(RaceStack::start(&params, &deployment).await?);
    let run = Arc::new(Run::new(params.clone()));
    *race.run.lock() = Some(run.clone());
    race.runs.fetch_add(1, Ordering::Relaxed);
    race.send(serde_json::json!({
        "type": "start",
        "run": race.runs(),
        "controls": Controls::of(&params),
        "capacity_per_s": params.capacity,
        "jobs": params.jobs,
        "floor_s": params.floor_s(),
        "instances": deployment.instances,
        "store": deployment.store(),
    }));
    let sampler = tokio::spawn(sample(race.clone(), run.clone(), stack.clone()));
    let entry = stack.entry().to_string();
    let (gateway_t0, client_t0) = (stack.clock_now(), Instant::now());
    let margin = race.pace_margin();
    let coop = tokio::spawn(cooperative(run.clone(), entry.clone(), margin));
    let naive = tokio::spawn(naive(run.clone(), entry));
    let (a, b) = (coop.await, naive.await);
    sampler.abort();
    let _ = sampler.await;
    a??;
    b??;
    push_tick(&race, &run, &stack);
    let fleets = run.reports();
    *run.results.lock() = Some(fleets.clone());
    *run.admitted.lock() = Some(admitted(&params, &fleets, run.elapsed_s()));
    let (gateway_moved, client_moved) = (
        stack.clock_now().saturating_sub(gateway_t0).as_secs_f64(),
        client_t0.elapsed().as_secs_f64(),
    );
    let arrivals = stack.api.job_arrivals(FLEETS[0].1);
    let report = RunReport {
        floor_s: params.floor_s(),
        fleets,
        pacing: Pacing {
            margin_ms: margin.as_secs_f64() * 1000.0,
            round_trip_ms: run.round_trips_ms(),
            min_headroom_ms: min_headroom_ms(&arrivals, params.quota, params.window_s),
            clock_drift_ms: ((gateway_moved - client_moved) * 1e6).round() / 1e3,
        },
        instances: deployment.instances,
        store: deployment.store(),
        admitted: run.admitted.lock().clone().unwrap_or_default(),
    };
    race.send(serde_json::json!({
        "type": "done",
        "report": report,
        "table": paceline_sim::scenario::race::table(&report.fleets),
    }));
    if let Ok(stack) = Arc::try_unwrap(stack) {
        stack.stop().await?;
    }
    Ok(report)
}

fn push_tick(race: &Race, run: &Run, stack: &RaceStack) {
    let tick = run.tick(stack);
    let last = run.last_response.lock().clone();
    {
        let mut ticks = run.ticks.lock();
        if ticks.len() < MAX_TICKS {
            ticks.push(tick.clone());
        }
    }
    race.send(serde_json::json!({ "type": "tick", "tick": tick, "last_response": last }));
}

/// Sends the state every [`TICK`] until aborted.
async fn sample(race: Arc<Race>, run: Arc<Run>, stack: Arc<RaceStack>) {
    let mut every = tokio::time::interval(TICK);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        push_tick(&race, &run, &stack);
    }
}

/// Counts every answer the gateway gives one fleet, as it comes off the
/// wire (below the SDK: each attempt is seen).
struct Tap {
    run: Arc<Run>,
    fleet: usize,
}

#[async_trait::async_trait]
impl reqwest_middleware::Middleware for Tap {
    async fn handle(
        &self,
        req: reqwest::Request,
        extensions: &mut http::Extensions,
        next: reqwest_middleware::Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        // the SDK's usage seed is not one of the jobs
        if !req.url().path().starts_with("/v1/jobs/") {
            return next.run(req, extensions).await;
        }
        let sent = Instant::now();
        let res = next.run(req, extensions).await;
        let c = &self.run.fleets[self.fleet];
        c.requests.fetch_add(1, Ordering::Relaxed);
        let Ok(resp) = &res else { return res };
        match resp.status().as_u16() {
            200..=299 => c.answered_2xx.fetch_add(1, Ordering::Relaxed),
            429 => c.rejected_429.fetch_add(1, Ordering::Relaxed),
            503 => c.dropped.fetch_add(1, Ordering::Relaxed),
            _ => 0,
        };
        let last = read_answer(self.run.elapsed_s(), resp);
        if let Some(left) = last.remaining {
            c.published_left.store(left + 1, Ordering::Relaxed);
        }
        if self.fleet == 0 {
            let mut trips = self.run.round_trips_us.lock();
            if trips.len() < MAX_ROUND_TRIPS {
                trips.push(sent.elapsed().as_micros() as u64);
            }
            drop(trips);
            *self.run.last_response.lock() = Some(last);
        }
        res
    }
}

/// What the SDK's parser reads off an answer (its head: the fields it
/// paces by).
fn read_answer(t_s: f64, resp: &reqwest::Response) -> LastResponse {
    let now = paceline_core::Nanos::from_system_time(std::time::SystemTime::now());
    let status = resp.status().as_u16();
    let v = paceline_wire::parse::parse_response(status, resp.headers(), None, now);
    let fields = resp
        .headers()
        .iter()
        .filter(|(k, _)| k.as_str().starts_with("ratelimit") || k.as_str() == "retry-after")
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
        .collect();
    let secs = |n: paceline_core::Nanos| (n.as_secs_f64() * 1000.0).round() / 1000.0;
    LastResponse {
        t_s: (t_s * 1000.0).round() / 1000.0,
        status,
        fields,
        outcome: v.outcome.as_str().to_string(),
        limit: v.limit,
        remaining: v.remaining,
        reset_in_s: v.reset_in.map(secs),
        window_s: v.tightest_policy().and_then(|p| p.window_s),
        retry_after_s: v.retry_after.map(secs),
    }
}

/// A job queue shared by one fleet's workers.
fn queue(n: u64) -> Arc<Mutex<std::ops::Range<u64>>> {
    Arc::new(Mutex::new(0..n))
}

fn job_done(run: &Run, fleet: usize) {
    let c = &run.fleets[fleet];
    let done = c.jobs_done.fetch_add(1, Ordering::Relaxed) + 1;
    if done == run.params.jobs {
        let ms = run.started.elapsed().as_millis() as u64;
        c.finished_at_ms.store(ms, Ordering::Relaxed);
    }
}

/// Runs `fleet`'s workers over its jobs: each job is sent through `http` to
/// the gateway at `base` until it succeeds, with `pause` between a failed
/// attempt and the next.
async fn workers(
    run: Arc<Run>,
    fleet: usize,
    http: ClientWithMiddleware,
    base: String,
    pause: Duration,
) -> anyhow::Result<()> {
    let key = FLEETS[fleet].1;
    let jobs = queue(run.params.jobs);
    let workers: Vec<_> = (0..run.params.workers)
        .map(|_| {
            let (run, http, jobs, base) = (run.clone(), http.clone(), jobs.clone(), base.clone());
            tokio::spawn(async move {
                loop {
                    let Some(n) = jobs.lock().next() else { break };
                    loop {
                        let resp = http
                            .get(format!("{base}/v1/jobs/{n}"))
                            .bearer_auth(key)
                            .send()
                            .await;
                        if matches!(&resp, Ok(r) if r.status().is_success()) {
                            break;
                        }
                        tokio::time::sleep(pause).await;
                        run.fleets[fleet].retries.fetch_add(1, Ordering::Relaxed);
                    }
                    job_done(&run, fleet);
                }
            })
        })
        .collect();
    for w in workers {
        w.await?;
    }
    Ok(())
}

/// The cooperative fleet: the SDK over reqwest, seeded from the usage
/// endpoint, as any user would set it up.
async fn cooperative(
    run: Arc<Run>,
    base: String,
    margin: std::time::Duration,
) -> anyhow::Result<()> {
    use paceline_client::adapter::reqwest::PacelineMiddleware;
    let config = paceline_client::Config {
        pace_margin: margin,
        ..Default::default()
    };
    let sdk = paceline_client::Client::builder()
        .clock(paceline_client::adapter::TokioClock::new())
        .config(config)
        .build();
    *run.sdk.lock() = Some(sdk.clone());
    let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(PacelineMiddleware::new(sdk).usage_path("/v1/usage"))
        .with(Tap {
            run: run.clone(),
            fleet: 0,
        })
        .build();
    // the SDK gave up on an attempt (budget, drop, attempts): it paces the
    // next one itself, so the pause is short
    workers(run, 0, http, base, Duration::from_millis(10)).await
}

/// The naive fleet: plain requests, the same pause after any failure.
async fn naive(run: Arc<Run>, base: String) -> anyhow::Result<()> {
    let pause = run.params.naive_retry.as_duration();
    let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(Tap {
            run: run.clone(),
            fleet: 1,
        })
        .build();
    workers(run, 1, http, base, pause).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_before_a_run_are_the_sims_fleets_with_nothing_done() {
        let race = Race::new(RaceParams::default());
        let r = race.results();
        let names: Vec<&str> = r.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["cooperative", "naive"]);
        for f in &r {
            assert_eq!((f.jobs, f.jobs_done, f.requests), (50, 0, 0));
            assert_eq!(f.finished_at_s, None);
            assert_eq!(f.served, Some(0));
        }
        assert!(!race.is_running());
    }

    #[test]
    fn controls_round_trip_and_are_bounded() {
        let base = RaceParams::default();
        let c = Controls::of(&base);
        assert_eq!(
            c,
            Controls {
                refill_per_s: 4,
                depth: 8,
                workers: 10
            }
        );
        let p = Controls {
            refill_per_s: 2,
            depth: 16,
            workers: 3,
        }
        .apply(&base)
        .unwrap();
        assert_eq!((p.quota, p.window_s, p.workers), (16, 8, 3));
        assert_eq!(p.floor_s(), 17.0);
        let bad = |refill_per_s, depth, workers| {
            Controls {
                refill_per_s,
                depth,
                workers,
            }
            .apply(&base)
            .unwrap_err()
        };
        assert!(bad(0, 8, 10).contains("refill_per_s = 0"));
        assert!(bad(4, 201, 10).contains("depth = 201"));
        assert!(bad(4, 8, 0).contains("workers = 0"));
        assert!(bad(4, 6, 10).contains("multiple of the refill rate"));
    }

    #[test]
    fn headroom_is_how_long_before_its_arrival_a_token_was_there() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // 8 at once from full, then one every 250 ms, 10 ms late
        let mut arrivals: Vec<Instant> = (0..8).map(|_| at(0)).collect();
        arrivals.extend((1..=4).map(|k| at(250 * k + 10)));
        assert_eq!(min_headroom_ms(&arrivals, 8, 2), Some(10.0));
        assert_eq!(min_headroom_ms(&arrivals[..8], 8, 2), None, "no paced one");
        // one early: refused by a bucket on those arrivals
        arrivals.push(at(250 * 5 - 5));
        assert_eq!(min_headroom_ms(&arrivals, 8, 2), Some(-5.0));
        assert_eq!(min_headroom_ms(&[], 8, 2), None);
    }

    #[test]
    fn admitted_is_measured_against_one_limit_over_the_fleets_run() {
        let p = RaceParams::default();
        let mut fleets = Race::new(p.clone()).results();
        // one bucket: 50 at the floor is the limit exactly
        fleets[0].served = Some(50);
        fleets[0].finished_at_s = Some(10.5);
        // three alone: 50 by 2.17 s is three times what one allows
        fleets[1].served = Some(50);
        fleets[1].finished_at_s = Some(26.0 / 12.0);
        let a = admitted(&p, &fleets, 20.0);
        assert_eq!((a[0].one_limit_allows, a[0].times_the_limit), (50.0, 1.0));
        assert_eq!((a[1].one_limit_allows, a[1].times_the_limit), (16.7, 3.0));
        // a fleet that did not finish is measured to the race's end
        fleets[1].finished_at_s = None;
        fleets[1].served = Some(20);
        let a = admitted(&p, &fleets, 3.0);
        assert_eq!((a[1].one_limit_allows, a[1].times_the_limit), (20.0, 1.0));
        let report = RunReport {
            floor_s: p.floor_s(),
            fleets,
            pacing: Pacing {
                margin_ms: 20.0,
                round_trip_ms: None,
                min_headroom_ms: None,
                clock_drift_ms: 0.0,
            },
            instances: 3,
            store: Store::Memory,
            admitted: a,
        };
        let text = admitted_lines(&p, &report);
        assert!(text.starts_with("3 gateway instances (each in its own memory, each counting alone); published limit per key: 8 tokens, refilled 4/s"), "{text}");
        assert!(
            text.contains(
                "naive        admitted   20; one limit allows   20.0 over its run: 1.00x the limit"
            ),
            "{text}"
        );
        let v = serde_json::to_value(&report).unwrap();
        assert_eq!(
            (v["instances"].as_u64(), v["store"].as_str()),
            (Some(3), Some("memory"))
        );
    }

    #[test]
    fn deployments_are_bounded() {
        let d = |instances| Deployment {
            instances,
            redis_url: None,
        };
        assert_eq!(Deployment::default(), d(1));
        assert!(d(1).check().is_ok() && d(MAX_INSTANCES).check().is_ok());
        assert!(d(0).check().unwrap_err().contains("instances = 0"));
        assert!(d(17).check().unwrap_err().contains("1..=16"));
        let race = Race::new(RaceParams::default());
        assert!(race.set_deployment(d(0)).is_err());
        assert_eq!(race.deployment(), d(1));
        let redis = Deployment {
            instances: 3,
            redis_url: Some("redis://127.0.0.1:6379".into()),
        };
        race.set_deployment(redis.clone()).unwrap();
        assert_eq!((race.deployment(), redis.store()), (redis, Store::Redis));
    }

    #[test]
    fn the_redis_race_configuration_names_the_store_and_a_patient_deadline() {
        let p = RaceParams::default();
        let text = gateway_toml(
            &p,
            "127.0.0.1:9".parse().unwrap(),
            Some("redis://127.0.0.1:6390"),
        );
        assert!(
            text.contains("[gateway]\nlisten = \"127.0.0.1:0\""),
            "{text}"
        );
        assert!(text.contains("store = \"redis\"\n"), "{text}");
        assert!(
            text.contains("[gateway.redis]\nurl = \"redis://127.0.0.1:6390\"\ndeadline_ms = 250\n"),
            "{text}"
        );
        // without the redis feature the gateway refuses it by name; with
        // it, the run's secret makes it valid
        let secret = run_secret();
        assert_eq!(secret.len(), 64);
        assert_ne!(secret, run_secret(), "one secret per run");
        let env = |v: &str| (v == paceline_gateway::KEY_HASH_SECRET_ENV).then(|| secret.clone());
        match GatewayConfig::parse_with_env(&text, "race.toml", None, &env) {
            Ok(cfg) => assert_eq!(cfg.settings.store, paceline_gateway::StoreKind::Redis),
            Err(e) => assert!(e.to_string().contains("redis"), "{e}"),
        }
        assert!(!gateway_toml(&p, "127.0.0.1:9".parse().unwrap(), None).contains("redis"));
    }

    #[test]
    fn the_race_configuration_is_a_valid_gateway_file() {
        let p = RaceParams::default();
        let text = gateway_toml(&p, "127.0.0.1:9".parse().unwrap(), None);
        let cfg = GatewayConfig::parse(&text, "race.toml", None).unwrap();
        assert_eq!(cfg.settings.shedding.max_rps, 40);
        for (_, key) in FLEETS {
            let plan = cfg.limits.plan_for_key(key).unwrap();
            assert_eq!(
                paceline_wire::emit::policy_field(plan),
                r#""burst";q=8;w=2"#
            );
        }
        assert!(!cfg.limits.escalation().enabled);
    }
}
