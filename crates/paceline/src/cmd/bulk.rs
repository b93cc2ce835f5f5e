//! `paceline bulk`: run a list of requests with N workers through the SDK.
//!
//! Input: one request per line, either a URL (a GET) or a JSON object
//! `{"method": "POST", "url": "...", "headers": {"k": "v"}, "body": ...}`
//! (`body` a string sent as is, or any other JSON value sent as JSON).
//! Blank lines and lines starting with `#` are skipped.
//!
//! With the SDK every attempt is paced and retried politely, and no job is
//! lost to pacing or to the retry budget: a job whose retry the SDK refused
//! (budget spent, attempts used up, dropped by the adaptive throttle, a
//! transient network error) waits and goes back to the queue. A job fails
//! only on a definitive answer: a quota used up, a status that is not worth
//! retrying, or a wait past `--max-wait` (counted from its first attempt);
//! the summary names each failed job and why. `--naive` runs the same list
//! the way a careless client would (retry every 100 ms, ignoring
//! `Retry-After`, up to `--naive-attempts` attempts a job) for comparison.
//!
//! A job may cost more than one request in a unit the API counts (tokens,
//! points): `--cost-column tokens` reads each JSON line's `tokens` field as
//! the job's cost in tokens (`--cost-column est=tokens`: the field `est`,
//! in tokens), and the SDK paces every attempt until each of the API's
//! windows of that unit has room for it. A line without the field (or a
//! bare URL line) states no cost: the SDK charges its running estimate.

use std::collections::{BTreeMap, VecDeque};
use std::io::Read;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use paceline_client::adapter::reqwest::PacelineMiddleware;
use paceline_client::{Client as Sdk, ClientError, Cost, Event};
use paceline_core::{Nanos, SystemClock};
use paceline_sim::scenario::race::floor_s;
use parking_lot::Mutex;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION};
use reqwest::Method;
use serde::Serialize;

/// Arguments of `paceline bulk`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// The request list: a file, or `-` (the default) for stdin.
    #[arg(value_name = "FILE|-")]
    input: Option<PathBuf>,
    /// Concurrent workers.
    #[arg(long, short = 'w', default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    workers: u32,
    /// API key, sent as `Authorization: Bearer KEY`.
    #[arg(long)]
    key: Option<String>,
    /// Print the summary as one JSON object.
    #[arg(long)]
    json: bool,
    /// Run without the SDK: retry every 100 ms, ignoring Retry-After.
    #[arg(long)]
    naive: bool,
    /// The sustained rate (requests per second) the API allows, to compute
    /// the floor time; learned from the responses when not given.
    #[arg(long, value_name = "R")]
    rate: Option<f64>,
    /// The burst the API forgives (with --rate); learned when not given.
    #[arg(long, value_name = "B")]
    burst: Option<u64>,
    /// A usage endpoint (URL) to seed the SDK's pacing before the first request.
    #[arg(long, value_name = "URL")]
    usage: Option<String>,
    /// Per-request timeout in seconds.
    #[arg(long, default_value_t = 30.0)]
    timeout: f64,
    /// The longest wait, in seconds: a wait the SDK is asked for past it,
    /// or a job still not done this long after its first attempt, fails
    /// the job.
    #[arg(long, default_value_t = 300)]
    max_wait: u64,
    /// With --naive: attempts a job gets before it fails.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    naive_attempts: u32,
    /// A job's cost in a unit the API counts beside requests (tokens,
    /// points…): the JSON lines' field FIELD holds it, counted in UNIT
    /// (FIELD itself when no `=UNIT`), a whole number 0 or more (a decimal
    /// is rounded up); a line without the field states no cost, and the
    /// SDK charges its estimate. Repeat for several units.
    #[arg(long, value_name = "FIELD[=UNIT]", value_parser = parse_cost_column)]
    cost_column: Vec<CostColumn>,
    /// Hide the progress bar.
    #[arg(long)]
    no_progress: bool,
    /// Print every SDK retry, drop and mode change (escalation alerts are
    /// always printed).
    #[arg(long, short = 'v')]
    verbose: bool,
}

/// One request of the list.
#[derive(Clone, Debug, PartialEq)]
struct Job {
    method: Method,
    url: String,
    headers: Vec<(String, String)>,
    body: Option<Vec<u8>>,
    /// What the job states it spends beyond one request.
    cost: Cost,
}

/// `--cost-column FIELD[=UNIT]`: where a job's cost in one unit is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CostColumn {
    field: String,
    unit: String,
}

fn parse_cost_column(s: &str) -> Result<CostColumn, String> {
    let (field, unit) = s.split_once('=').unwrap_or((s, s));
    let (field, unit) = (field.trim(), unit.trim());
    if field.is_empty() || unit.is_empty() {
        return Err(format!(
            "expected FIELD or FIELD=UNIT (such as tokens, or est_tokens=tokens), got {s:?}"
        ));
    }
    Ok(CostColumn {
        field: field.to_string(),
        unit: unit.to_ascii_lowercase(),
    })
}

/// The job's cost from the line's cost columns.
fn job_cost(line: &serde_json::Value, columns: &[CostColumn]) -> anyhow::Result<Cost> {
    let mut cost = Cost::new();
    for c in columns {
        let text = match line.get(&c.field) {
            None | Some(serde_json::Value::Null) => continue,
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(n @ serde_json::Value::Number(_)) => n.to_string(),
            Some(other) => bail!("field {:?}: expected a number, got {other}", c.field),
        };
        let n = Cost::parse_amount(&text).with_context(|| format!("field {:?}", c.field))?;
        cost.set(&c.unit, n);
    }
    Ok(cost)
}

#[derive(serde::Deserialize)]
struct JobLine {
    #[serde(default)]
    method: Option<String>,
    url: String,
    #[serde(default)]
    headers: Option<serde_json::Value>,
    #[serde(default)]
    body: Option<serde_json::Value>,
}

fn parse_jobs(text: &str, columns: &[CostColumn]) -> anyhow::Result<Vec<Job>> {
    let mut jobs = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let job = parse_line(line, columns).with_context(|| format!("line {}", i + 1))?;
        jobs.push(job);
    }
    Ok(jobs)
}

fn parse_line(line: &str, columns: &[CostColumn]) -> anyhow::Result<Job> {
    if !line.starts_with('{') {
        check_url(line)?;
        return Ok(Job {
            method: Method::GET,
            url: line.to_string(),
            headers: Vec::new(),
            body: None,
            cost: Cost::new(),
        });
    }
    let raw: serde_json::Value = serde_json::from_str(line).context("not a JSON request object")?;
    let cost = job_cost(&raw, columns)?;
    let j: JobLine = serde_json::from_value(raw).context("not a JSON request object")?;
    check_url(&j.url)?;
    let method = j.method.as_deref().unwrap_or("GET").to_ascii_uppercase();
    let method = Method::from_bytes(method.as_bytes()).context("bad method")?;
    let mut headers = Vec::new();
    match j.headers {
        None | Some(serde_json::Value::Null) => {}
        Some(serde_json::Value::Object(m)) => {
            for (k, v) in m {
                let v = match v {
                    serde_json::Value::String(s) => s,
                    other => other.to_string(),
                };
                headers.push((k, v));
            }
        }
        Some(serde_json::Value::Array(a)) => {
            for pair in a {
                match pair.as_array().map(Vec::as_slice) {
                    Some([serde_json::Value::String(k), serde_json::Value::String(v)]) => {
                        headers.push((k.clone(), v.clone()))
                    }
                    _ => bail!("headers: each entry must be [\"name\", \"value\"]"),
                }
            }
        }
        Some(_) => bail!("headers must be an object or a list of [name, value] pairs"),
    }
    let body = match j.body {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(s)) => Some(s.into_bytes()),
        Some(v) => {
            if !headers
                .iter()
                .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
            {
                headers.push(("content-type".into(), "application/json".into()));
            }
            Some(v.to_string().into_bytes())
        }
    };
    for (k, v) in &headers {
        HeaderName::from_bytes(k.as_bytes()).with_context(|| format!("bad header name {k:?}"))?;
        HeaderValue::from_str(v).with_context(|| format!("bad value for header {k:?}"))?;
    }
    Ok(Job {
        method,
        url: j.url,
        headers,
        body,
        cost,
    })
}

/// Gives a POST or PATCH job its `Idempotency-Key`, unless its line
/// names one: every attempt of the job sends it, requeued ones too.
fn keyed(sdk: &Sdk, job: &mut Job) {
    let writes = job.method == Method::POST || job.method == Method::PATCH;
    let has = job
        .headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("idempotency-key"));
    if writes && !has {
        job.headers
            .push(("idempotency-key".into(), sdk.idempotency_key()));
    }
}

fn check_url(url: &str) -> anyhow::Result<()> {
    let u = reqwest::Url::parse(url).with_context(|| format!("bad URL {url:?}"))?;
    if !matches!(u.scheme(), "http") {
        bail!("only http:// URLs are supported (this build has no TLS): {url:?}");
    }
    Ok(())
}

/// A job that failed, and why.
#[derive(Clone, Debug, Serialize)]
struct Failure {
    /// The job's place in the list (1 for the first).
    job: usize,
    url: String,
    /// `quota_exceeded`, `wait_too_long`, `max_wait_exceeded`,
    /// `status_<code>`, `naive_attempts_exhausted`, `transport`, …
    reason: String,
    /// The last status the job got, if any.
    status: Option<u16>,
    /// Times the job went back to the queue before it failed.
    requeued: u32,
}

/// A job on its way through the queue.
struct Queued {
    index: usize,
    job: Job,
    /// Times it went back to the queue.
    requeued: u32,
    /// When its first attempt started.
    first: Option<Instant>,
}

/// What became of one run of a job.
enum Outcome {
    Done,
    /// Definitive: the job fails.
    Failed {
        reason: String,
        status: Option<u16>,
    },
    /// Refused for now (budget, attempts, throttle, network): try again.
    Again {
        reason: String,
        status: Option<u16>,
    },
}

/// What the run did, shared by the workers.
#[derive(Default)]
struct Tally {
    requests: AtomicU64,
    retries: AtomicU64,
    done: AtomicU64,
    failed: AtomicU64,
    requeued: AtomicU64,
    failures: Mutex<Vec<Failure>>,
    by_status: Mutex<BTreeMap<u16, u64>>,
    errors: Mutex<BTreeMap<String, u64>>,
    /// The tightest short-window request policy seen: (burst q, window w s).
    learned: Mutex<Option<(u64, u64)>>,
}

impl Tally {
    fn response(&self, status: u16, headers: &HeaderMap) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        *self.by_status.lock().entry(status).or_insert(0) += 1;
        let published =
            headers.contains_key("ratelimit-policy") || headers.contains_key("x-ratelimit-limit");
        let unknown = self.learned.lock().is_none();
        if published && unknown {
            self.learn(status, headers);
        }
    }

    fn learn(&self, status: u16, headers: &HeaderMap) {
        let now = Nanos::from_system_time(std::time::SystemTime::now());
        let view = paceline_wire::parse_response(status, headers, None, now);
        let best = view
            .policies
            .iter()
            .filter(|p| p.unit.is_requests())
            .filter_map(|p| Some((p.quota?, p.window_s?)))
            .filter(|&(q, w)| q > 0 && w > 0 && w < 3_600)
            .min_by(|a, b| (a.0 as f64 / a.1 as f64).total_cmp(&(b.0 as f64 / b.1 as f64)));
        if let Some(b) = best {
            *self.learned.lock() = Some(b);
        }
    }

    fn error(&self, kind: &str) {
        *self.errors.lock().entry(kind.to_string()).or_insert(0) += 1;
    }
}

/// Counts every attempt that gets an answer, below the SDK's retry loop.
struct Counter(Arc<Tally>);

#[async_trait::async_trait]
impl reqwest_middleware::Middleware for Counter {
    async fn handle(
        &self,
        req: reqwest::Request,
        ext: &mut http::Extensions,
        next: reqwest_middleware::Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let r = next.run(req, ext).await;
        match &r {
            Ok(resp) => self.0.response(resp.status().as_u16(), resp.headers()),
            Err(_) => {
                self.0.requests.fetch_add(1, Ordering::Relaxed);
            }
        }
        r
    }
}

/// The summary (`--json` prints it as is).
#[derive(Debug, Serialize)]
struct Summary {
    mode: &'static str,
    jobs: u64,
    jobs_done: u64,
    jobs_failed: u64,
    requests: u64,
    by_status: BTreeMap<String, u64>,
    retries: u64,
    local_drops: u64,
    elapsed_s: f64,
    floor_s: Option<f64>,
    errors: BTreeMap<String, u64>,
    /// Times a job whose retry was refused went back to the queue.
    requeued: u64,
    /// Every failed job, in list order, with its reason.
    failures: Vec<Failure>,
}

/// Runs `paceline bulk`.
pub(crate) fn run(args: Args) -> anyhow::Result<i32> {
    let text = read_input(args.input.as_deref())?;
    let jobs = parse_jobs(&text, &args.cost_column)?;
    if jobs.is_empty() {
        bail!("the request list is empty");
    }
    if !(args.timeout > 0.0 && args.timeout.is_finite()) {
        bail!("--timeout must be a positive number of seconds");
    }
    if let Some(r) = args.rate {
        if !(r > 0.0 && r.is_finite()) {
            bail!("--rate must be a positive number of requests per second");
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let summary = rt.block_on(execute(&args, jobs))?;
    print_summary(&summary, args.json)?;
    Ok(if summary.jobs_done == summary.jobs {
        0
    } else {
        1
    })
}

fn read_input(path: Option<&std::path::Path>) -> anyhow::Result<String> {
    match path {
        None => read_stdin(),
        Some(p) if p.as_os_str() == "-" => read_stdin(),
        Some(p) => {
            std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))
        }
    }
}

fn read_stdin() -> anyhow::Result<String> {
    let mut s = String::new();
    std::io::stdin()
        .read_to_string(&mut s)
        .context("cannot read stdin")?;
    Ok(s)
}

fn progress(n: u64, hidden: bool) -> indicatif::ProgressBar {
    if hidden {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(n);
    let style = indicatif::ProgressStyle::with_template(
        "{elapsed_precise} [{bar:30}] {pos}/{len} jobs  {msg}",
    )
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
    .progress_chars("=> ");
    bar.set_style(style);
    bar
}

async fn execute(args: &Args, jobs: Vec<Job>) -> anyhow::Result<Summary> {
    let n = jobs.len() as u64;
    let tally = Arc::new(Tally::default());
    let timeout = Duration::from_secs_f64(args.timeout);
    let plain = reqwest::Client::builder().timeout(timeout).build()?;
    let sdk = Sdk::builder()
        .clock(SystemClock::new())
        .max_wait(Duration::from_secs(args.max_wait))
        .build();
    let paced = PacelineMiddleware::new(sdk.clone());
    if let (Some(url), false) = (&args.usage, args.naive) {
        seed(&paced, &plain, url, args.key.as_deref()).await?;
    }
    let http = if args.naive {
        reqwest_middleware::ClientBuilder::new(plain)
            .with(Counter(tally.clone()))
            .build()
    } else {
        reqwest_middleware::ClientBuilder::new(plain)
            .with(paced)
            .with(Counter(tally.clone()))
            .build()
    };
    let bar = progress(n, args.no_progress);
    watch(&sdk, &bar, args.verbose);
    if args.naive {
        bar.set_message(format!(
            "naive: at most {} attempts a job",
            args.naive_attempts
        ));
    }
    let queue: Arc<Mutex<VecDeque<Queued>>> = Arc::new(Mutex::new(
        jobs.into_iter()
            .enumerate()
            .map(|(i, mut job)| {
                // one key per job, kept when it goes back to the queue: a
                // job that ran before its answer was lost is not run twice
                if !args.naive {
                    keyed(&sdk, &mut job);
                }
                Queued {
                    index: i + 1,
                    job,
                    requeued: 0,
                    first: None,
                }
            })
            .collect(),
    ));
    // jobs neither done nor failed: a worker stays while any is left, as a
    // job waiting to go back to the queue may still need it
    let open = Arc::new(AtomicU64::new(n));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..args.workers.min(n as u32) {
        let w = Arc::new(Worker {
            http: http.clone(),
            tally: tally.clone(),
            key: args.key.clone(),
            naive: args.naive,
            naive_attempts: args.naive_attempts,
            max_wait: Duration::from_secs(args.max_wait),
            bar: bar.clone(),
        });
        let queue = queue.clone();
        let open = open.clone();
        workers.push(tokio::spawn(async move {
            while open.load(Ordering::Acquire) > 0 {
                let next = queue.lock().pop_front();
                let Some(q) = next else {
                    tokio::time::sleep(IDLE_POLL).await;
                    continue;
                };
                if let Some(back) = w.run(q, &open).await {
                    // wait off the worker, then back to the end of the queue
                    let (delay, q) = back;
                    let queue = queue.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(delay).await;
                        queue.lock().push_back(q);
                    });
                }
            }
        }));
    }
    for w in workers {
        w.await?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let diag = sdk.diagnostics();
    let (retries, drops) = if args.naive {
        (tally.retries.load(Ordering::Relaxed), 0)
    } else {
        (diag.retries, diag.local_drops)
    };
    let floor = match (args.rate, args.burst, *tally.learned.lock()) {
        (Some(r), b, _) => Some(floor_s(n, b.unwrap_or(0), r)),
        (None, b, Some((q, w))) => Some(floor_s(n, b.unwrap_or(q), q as f64 / w as f64)),
        (None, _, None) => None,
    };
    let by_status = tally
        .by_status
        .lock()
        .iter()
        .map(|(k, v)| (k.to_string(), *v))
        .collect();
    let errors = tally.errors.lock().clone();
    let mut failures = tally.failures.lock().clone();
    failures.sort_by_key(|f| f.job);
    Ok(Summary {
        mode: if args.naive { "naive" } else { "sdk" },
        jobs: n,
        jobs_done: tally.done.load(Ordering::Relaxed),
        jobs_failed: tally.failed.load(Ordering::Relaxed),
        requests: tally.requests.load(Ordering::Relaxed),
        by_status,
        retries,
        local_drops: drops,
        elapsed_s: (elapsed * 1000.0).round() / 1000.0,
        floor_s: floor.map(|f| (f * 1000.0).round() / 1000.0),
        errors,
        requeued: tally.requeued.load(Ordering::Relaxed),
        failures,
    })
}

/// Prints the SDK's alerts (and with `verbose` every event) above the bar.
fn watch(sdk: &Sdk, bar: &indicatif::ProgressBar, verbose: bool) {
    let bar = bar.clone();
    sdk.subscribe(move |e| {
        let line = match e {
            Event::Escalated { scope, factor } => {
                format!("alert: {scope}: 429s although the headers were obeyed; spacing x{factor}")
            }
            _ if !verbose => return,
            Event::Restored { scope, factor } => format!("{scope}: spacing back to x{factor}"),
            Event::ModeChange { scope, from, to } => {
                format!("{scope}: mode {} -> {}", from.as_str(), to.as_str())
            }
            Event::Retry {
                scope,
                attempt,
                wait,
                status,
                ..
            } => format!(
                "{scope}: retry after attempt {attempt} (status {}) in {:.2} s",
                status.map_or("none".to_string(), |s| s.to_string()),
                wait.as_secs_f64()
            ),
            Event::Drop { scope, error } => format!("{scope}: gave up: {error}"),
            _ => return,
        };
        if bar.is_hidden() {
            eprintln!("{line}");
        } else {
            bar.println(line);
        }
    });
}

async fn seed(
    paced: &PacelineMiddleware,
    http: &reqwest::Client,
    url: &str,
    key: Option<&str>,
) -> anyhow::Result<()> {
    let mut req = http.get(url);
    if let Some(k) = key {
        req = req.header(AUTHORIZATION, format!("Bearer {k}"));
    }
    let req = req.build()?;
    // the scope the jobs will be paced in: the host and the key's hash
    let scope = paced.scope_of(&req, &http::Extensions::new());
    let body = http.execute(req).await?.error_for_status()?.bytes().await?;
    paced
        .client()
        .seed_usage(&scope, &body)
        .map_err(|e| anyhow::anyhow!("usage endpoint {url}: {e}"))?;
    Ok(())
}

struct Worker {
    http: reqwest_middleware::ClientWithMiddleware,
    tally: Arc<Tally>,
    key: Option<String>,
    naive: bool,
    naive_attempts: u32,
    max_wait: Duration,
    bar: indicatif::ProgressBar,
}

/// The naive client's fixed pause between attempts.
const NAIVE_RETRY: Duration = Duration::from_millis(100);
/// How often an idle worker looks for a job coming back to the queue.
const IDLE_POLL: Duration = Duration::from_millis(10);
/// The wait before a refused job goes back to the queue: full jitter over
/// `min(REQUEUE_CAP, REQUEUE_BASE · 2^n)` after its n-th refusal (a wait
/// the server asked for is kept by the SDK's pacing on top of it).
const REQUEUE_BASE: Duration = Duration::from_millis(250);
const REQUEUE_CAP: Duration = Duration::from_secs(20);

fn requeue_delay(n: u32) -> Duration {
    let cap = REQUEUE_BASE
        .saturating_mul(1u32 << n.min(16))
        .min(REQUEUE_CAP);
    // a cheap uniform draw: the sub-second nanoseconds of the wall clock
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    cap.mul_f64(f64::from(nanos) / 1e9)
}

impl Worker {
    fn request(&self, job: &Job) -> reqwest_middleware::RequestBuilder {
        let mut req = self.http.request(job.method.clone(), &job.url);
        for (k, v) in &job.headers {
            req = req.header(k.as_str(), v.as_str());
        }
        if let Some(k) = &self.key {
            req = req.header(AUTHORIZATION, format!("Bearer {k}"));
        }
        if let Some(b) = &job.body {
            req = req.body(b.clone());
        }
        if !job.cost.is_empty() {
            req = req.with_extension(job.cost.clone());
        }
        req
    }

    /// Runs one job; returns it with a delay when it goes back to the
    /// queue, and settles it (done or failed) otherwise.
    async fn run(&self, mut q: Queued, open: &AtomicU64) -> Option<(Duration, Queued)> {
        let first = *q.first.get_or_insert_with(Instant::now);
        let outcome = if self.naive {
            self.naive(&q.job).await
        } else {
            self.polite(&q.job).await
        };
        let failed = match outcome {
            Outcome::Done => None,
            Outcome::Failed { reason, status } => Some((reason, status)),
            Outcome::Again { reason, status } => {
                let delay = requeue_delay(q.requeued);
                if first.elapsed() + delay <= self.max_wait {
                    q.requeued += 1;
                    self.tally.requeued.fetch_add(1, Ordering::Relaxed);
                    return Some((delay, q));
                }
                Some((format!("max_wait_exceeded ({reason})"), status))
            }
        };
        match failed {
            None => {
                self.tally.done.fetch_add(1, Ordering::Relaxed);
            }
            Some((reason, status)) => {
                self.tally.failed.fetch_add(1, Ordering::Relaxed);
                self.tally
                    .error(reason.split(' ').next().unwrap_or(&reason));
                self.tally.failures.lock().push(Failure {
                    job: q.index,
                    url: q.job.url.clone(),
                    reason,
                    status,
                    requeued: q.requeued,
                });
            }
        }
        open.fetch_sub(1, Ordering::AcqRel);
        self.bar.inc(1);
        let s = self.tally.by_status.lock();
        let count = |c: u16| s.get(&c).copied().unwrap_or(0);
        let mut msg = format!(
            "{} requests  429: {}  503: {}",
            self.tally.requests.load(Ordering::Relaxed),
            count(429),
            count(503)
        );
        if self.naive {
            msg.push_str(&format!(
                "  (naive: at most {} attempts a job)",
                self.naive_attempts
            ));
        }
        self.bar.set_message(msg);
        None
    }

    async fn polite(&self, job: &Job) -> Outcome {
        match self.request(job).send().await {
            Ok(r) if r.status().as_u16() < 400 => Outcome::Done,
            Ok(r) => {
                let status = r.status().as_u16();
                Outcome::Failed {
                    reason: format!("status_{status}"),
                    status: Some(status),
                }
            }
            Err(reqwest_middleware::Error::Middleware(e)) => {
                match e.downcast_ref::<ClientError>() {
                    // the server said when to come back, or the client chose to
                    // hold back: the job is not lost, only later
                    Some(
                        e @ (ClientError::BudgetExhausted { status }
                        | ClientError::RetriesExhausted { status, .. }),
                    ) => Outcome::Again {
                        reason: e.kind().to_string(),
                        status: *status,
                    },
                    Some(e @ (ClientError::Throttled { .. } | ClientError::Transport { .. })) => {
                        Outcome::Again {
                            reason: e.kind().to_string(),
                            status: None,
                        }
                    }
                    Some(e) => Outcome::Failed {
                        reason: e.kind().to_string(),
                        status: None,
                    },
                    None => Outcome::Failed {
                        reason: "middleware".into(),
                        status: None,
                    },
                }
            }
            Err(reqwest_middleware::Error::Reqwest(_)) => Outcome::Again {
                reason: "transport".into(),
                status: None,
            },
        }
    }

    async fn naive(&self, job: &Job) -> Outcome {
        let mut last = None;
        for attempt in 0..self.naive_attempts {
            if attempt > 0 {
                self.tally.retries.fetch_add(1, Ordering::Relaxed);
            }
            match self.request(job).send().await {
                Ok(r) if matches!(r.status().as_u16(), 429 | 503) => {
                    last = Some(r.status().as_u16())
                }
                Ok(r) if r.status().as_u16() < 400 => return Outcome::Done,
                Ok(r) => {
                    let status = r.status().as_u16();
                    return Outcome::Failed {
                        reason: format!("status_{status}"),
                        status: Some(status),
                    };
                }
                Err(_) => {}
            }
            tokio::time::sleep(NAIVE_RETRY).await;
        }
        Outcome::Failed {
            reason: "naive_attempts_exhausted".into(),
            status: last,
        }
    }
}

fn print_summary(s: &Summary, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(s)?);
        return Ok(());
    }
    let mut out = String::new();
    let mut row = |k: &str, v: String| out.push_str(&format!("{k:<14}{v}\n"));
    row("mode", s.mode.to_string());
    row("jobs", s.jobs.to_string());
    row("jobs done", s.jobs_done.to_string());
    if s.jobs_failed > 0 {
        row("jobs failed", s.jobs_failed.to_string());
    }
    row("requests", s.requests.to_string());
    for (status, n) in &s.by_status {
        row(&format!("  {status}"), n.to_string());
    }
    row("retries", s.retries.to_string());
    row("local drops", s.local_drops.to_string());
    row("elapsed", format!("{:.2} s", s.elapsed_s));
    row(
        "floor",
        s.floor_s.map_or_else(
            || "unknown (pass --rate)".to_string(),
            |f| format!("{f:.2} s"),
        ),
    );
    if s.requeued > 0 {
        row("requeued", s.requeued.to_string());
    }
    for (kind, n) in &s.errors {
        row(&format!("error {kind}"), n.to_string());
    }
    for f in &s.failures {
        let status = f
            .status
            .map_or(String::new(), |c| format!(" (last status {c})"));
        out.push_str(&format!(
            "failed job {}: {} {}{status}\n",
            f.job, f.url, f.reason
        ));
    }
    print!("{out}");
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_write_gets_its_key_once_and_keeps_it_when_requeued() {
        let sdk = Sdk::builder().seed(1).build();
        let line = |m: &str, h: &str| {
            parse_line(
                &format!(r#"{{"method":"{m}","url":"http://127.0.0.1:1/a","headers":{{{h}}}}}"#),
                &[],
            )
            .unwrap()
        };
        let key = |j: &Job| {
            j.headers
                .iter()
                .filter(|(k, _)| k.eq_ignore_ascii_case("idempotency-key"))
                .map(|(_, v)| v.clone())
                .collect::<Vec<_>>()
        };
        let mut post = line("POST", "");
        keyed(&sdk, &mut post);
        let k = key(&post);
        assert_eq!(k.len(), 1);
        // the job goes back to the queue as it is: its key with it
        let requeued = post.clone();
        assert_eq!(key(&requeued), k);
        let mut patch = line("PATCH", "");
        keyed(&sdk, &mut patch);
        assert_eq!(key(&patch).len(), 1);
        assert_ne!(key(&patch), k);
        let mut own = line("POST", r#""Idempotency-Key":"mine""#);
        keyed(&sdk, &mut own);
        assert_eq!(key(&own), ["mine"]);
        let mut get = line("GET", "");
        keyed(&sdk, &mut get);
        assert!(key(&get).is_empty());
    }

    use super::*;

    #[test]
    fn reads_urls_and_json_lines() {
        let text = "# a comment\n\nhttp://127.0.0.1:1/a\n\
            {\"method\":\"post\",\"url\":\"http://127.0.0.1:1/b\",\"headers\":{\"x-a\":\"1\"},\"body\":{\"n\":2}}\n\
            {\"url\":\"http://127.0.0.1:1/c\",\"headers\":[[\"x-b\",\"2\"]],\"body\":\"raw\"}\n";
        let jobs = parse_jobs(text, &[]).unwrap();
        assert_eq!(jobs.len(), 3);
        assert_eq!(jobs[0].method, Method::GET);
        assert_eq!(jobs[1].method, Method::POST);
        assert_eq!(jobs[1].body.as_deref(), Some(&b"{\"n\":2}"[..]));
        assert!(jobs[1]
            .headers
            .contains(&("content-type".into(), "application/json".into())));
        assert_eq!(jobs[2].headers, vec![("x-b".to_string(), "2".to_string())]);
        assert_eq!(jobs[2].body.as_deref(), Some(&b"raw"[..]));
    }

    #[test]
    fn bad_lines_name_their_line() {
        let e = parse_jobs("http://127.0.0.1/a\nnot a url\n", &[]).unwrap_err();
        assert!(format!("{e:#}").contains("line 2"), "{e:#}");
        let e = parse_jobs("{\"url\":\"https://x/\"}", &[]).unwrap_err();
        assert!(format!("{e:#}").contains("http://"), "{e:#}");
        let e = parse_jobs(
            "{\"url\":\"http://x/\",\"headers\":{\"bad name\":\"v\"}}",
            &[],
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("header"), "{e:#}");
    }

    #[test]
    fn cost_columns_give_each_job_its_cost() {
        let cols = [
            parse_cost_column("tokens").unwrap(),
            parse_cost_column("pts = Points").unwrap(),
        ];
        assert_eq!(cols[1].unit, "points");
        let text = r#"http://127.0.0.1:1/a
            {"url":"http://127.0.0.1:1/b","tokens":1200,"pts":"3"}
            {"url":"http://127.0.0.1:1/c","tokens":0.5,"pts":null}
"#;
        let jobs = parse_jobs(text, &cols).unwrap();
        assert!(jobs[0].cost.is_empty());
        assert_eq!(
            jobs[1].cost,
            Cost::new().with("tokens", 1_200).with("points", 3)
        );
        assert_eq!(jobs[2].cost, Cost::new().with("tokens", 1), "rounded up");
        for bad in ["-5", "\"many\"", "1e300", "[1]", "true"] {
            let line = format!("{{\"url\":\"http://127.0.0.1:1/d\",\"tokens\":{bad}}}");
            let e = parse_jobs(&format!("http://127.0.0.1:1/a\n{line}\n"), &cols).unwrap_err();
            let msg = format!("{e:#}");
            assert!(
                msg.contains("line 2") && msg.contains("tokens"),
                "{bad}: {msg}"
            );
        }
        assert!(parse_cost_column("=tokens").is_err());
        assert!(parse_cost_column("tokens=").is_err());
    }

    #[test]
    fn the_floor_of_the_race() {
        assert_eq!(floor_s(50, 8, 4.0), 10.5);
        assert_eq!(floor_s(12_000, 50, 10.0), 1_195.0);
    }
}
