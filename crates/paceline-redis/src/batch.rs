//! The batcher: decisions from every task of this instance queue here, and
//! one background task sends them to Redis many per call, one call per
//! cluster slot, with several calls in flight. A decision that finds no
//! call in flight and nothing queued (a lone caller) is sent at once by
//! its own task, without the hop through the queue.
//!
//! Bounds: the queue holds at most `queue` decisions (a full queue fails a
//! decision at once, never waits); one call carries at most `batch_max`;
//! at most `max_in_flight` calls are out at once (sent by the batcher or
//! directly), each cut off at the deadline; on a single server, at most
//! one per connection (the server runs calls one after another, so more
//! calls out would only split the batches: fewer, larger calls cost it
//! less per decision). A batch is what has queued by the time a call can
//! go out: the batcher waits for a free call first, then (after letting
//! the callers an answer just woke queue their next decisions) takes
//! everything queued. A decision whose caller already gave up is not
//! sent.
//!
//! A group (decisions admitted together or not at all) is one job: its
//! decisions ride one call, next to each other, never split between calls
//! (a group larger than `batch_max` goes alone), and the script decides
//! them as one (see `core.lua`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::{Cmd, Value};
use smallvec::SmallVec;
use tokio::sync::{mpsc, oneshot, Semaphore};

use paceline_core::{Decision, Nanos, Plan, Share, StoreError};

use crate::link::{Link, Lone};
use crate::script::{self, Op};

/// One decision to send.
pub(crate) struct Req {
    pub(crate) row: String,
    pub(crate) slot: u16,
    pub(crate) plan: Plan,
    pub(crate) spec: Arc<str>,
    pub(crate) op: Op,
    /// The caller's instant, when decisions read the caller's clock.
    pub(crate) now: Option<Nanos>,
    /// Whether this decision belongs to the group of the one before it.
    pub(crate) joins: bool,
}

/// The decisions of one job: one, or a group.
pub(crate) type Reqs = SmallVec<[Req; 1]>;

/// What a decision gets back: a check its decision, a release or a
/// refund nothing.
pub(crate) type Answer = Result<Option<Decision>, StoreError>;

/// What a job gets back: an answer per decision, or the call's error.
pub(crate) type Answers = Result<SmallVec<[Option<Decision>; 1]>, StoreError>;

struct Job {
    reqs: Reqs,
    reply: oneshot::Sender<Answers>,
}

/// Counters the store reports.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) calls: AtomicU64,
    pub(crate) direct: AtomicU64,
    pub(crate) sent: AtomicU64,
    pub(crate) errors: AtomicU64,
}

pub(crate) struct Settings {
    /// Whether the store is on a cluster (calls are per slot there, so
    /// they go to many servers at once).
    pub(crate) cluster: bool,
    /// Connections to each server.
    pub(crate) connections: usize,
    pub(crate) batch_max: usize,
    pub(crate) linger: Duration,
    pub(crate) max_in_flight: usize,
    pub(crate) deadline: Duration,
    pub(crate) ttl_slack_ms: u64,
    pub(crate) lease_ttl_ms: u64,
}

/// Where decisions are submitted.
pub(crate) struct Batcher {
    queue: mpsc::Sender<Job>,
    permits: Arc<Semaphore>,
    link: Arc<Link>,
    settings: Arc<Settings>,
    counters: Arc<Counters>,
}

/// Starts the batcher's task.
pub(crate) fn start(
    link: Arc<Link>,
    settings: Settings,
    queue: usize,
    counters: Arc<Counters>,
) -> Batcher {
    let (tx, rx) = mpsc::channel(queue);
    let mut settings = settings;
    if !settings.cluster {
        settings.max_in_flight = settings.max_in_flight.min(settings.connections).max(1);
    }
    let permits = Arc::new(Semaphore::new(settings.max_in_flight));
    let settings = Arc::new(settings);
    tokio::spawn(run(
        rx,
        link.clone(),
        settings.clone(),
        counters.clone(),
        permits.clone(),
    ));
    Batcher {
        queue: tx,
        permits,
        link,
        settings,
        counters,
    }
}

impl Batcher {
    /// Sends one decision and waits for its answer, at most the deadline.
    pub(crate) async fn submit(&self, req: Req) -> Answer {
        let mut answers = self.submit_all(smallvec::smallvec![req]).await?;
        answers
            .pop()
            .ok_or_else(|| StoreError::Protocol("a decision answered nothing".into()))
    }

    /// Sends the decisions of `reqs` in one call (a group, when they say
    /// so) and waits for their answers, at most the deadline.
    pub(crate) async fn submit_all(&self, reqs: Reqs) -> Answers {
        let s = &self.settings;
        // no batch gathering (nothing queued, no call out, no linger
        // asked for): a batch would be this decision alone, so send it
        // from here
        if s.linger.is_zero()
            && self.queue.capacity() == self.queue.max_capacity()
            && self.permits.available_permits() == s.max_in_flight
        {
            if let Ok(permit) = self.permits.try_acquire() {
                self.counters.direct.fetch_add(1, Ordering::Relaxed);
                let refs: SmallVec<[&Req; 1]> = reqs.iter().collect();
                let r = match call(&self.link, s, &self.counters, &refs).await {
                    Ok(values) => answers(&values, &mut 0, &reqs),
                    Err(e) => Err(e),
                };
                drop(permit);
                return r;
            }
        }
        let (tx, rx) = oneshot::channel();
        if self.queue.try_send(Job { reqs, reply: tx }).is_err() {
            self.counters.errors.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("paceline_redis_errors_total", "kind" => "queue_full").increment(1);
            return Err(StoreError::Unavailable("the Redis queue is full".into()));
        }
        match tokio::time::timeout(s.deadline, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(StoreError::Unavailable("the batcher stopped".into())),
            Err(_) => Err(StoreError::Unavailable(
                "Redis did not answer within the deadline".into(),
            )),
        }
    }
}

async fn run(
    mut rx: mpsc::Receiver<Job>,
    link: Arc<Link>,
    settings: Arc<Settings>,
    counters: Arc<Counters>,
    permits: Arc<Semaphore>,
) {
    let gather_max = settings.batch_max * settings.max_in_flight;
    let mut jobs: Vec<Job> = Vec::new();
    while let Some(first) = rx.recv().await {
        jobs.push(first);
        // the batch is what has queued by the time a call can go out: the
        // decisions that arrive while every call is out ride the next one
        // together, instead of waiting in many small groups
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let mut held = Some(permit);
        // the callers an answer just woke run first and queue their next
        // decisions, which then ride this call
        tokio::task::yield_now().await;
        while jobs.len() < gather_max {
            match rx.try_recv() {
                Ok(j) => jobs.push(j),
                Err(_) => break,
            }
        }
        if !settings.linger.is_zero() && jobs.len() < settings.batch_max {
            let until = tokio::time::Instant::now() + settings.linger;
            while jobs.len() < settings.batch_max {
                match tokio::time::timeout_at(until, rx.recv()).await {
                    Ok(Some(j)) => jobs.push(j),
                    _ => break,
                }
            }
        }
        jobs.retain(|j| !j.reply.is_closed());
        // one call per slot (and per instant, on the caller's clock),
        // arrival order kept within each (a job's decisions share both)
        let group_of = |j: &Job| (j.reqs[0].slot, j.reqs[0].now);
        if jobs.windows(2).any(|w| group_of(&w[0]) != group_of(&w[1])) {
            jobs.sort_by_key(group_of);
        }
        let mut rest = std::mem::take(&mut jobs).into_iter().peekable();
        while let Some(j) = rest.next() {
            let key = group_of(&j);
            let mut group = Vec::with_capacity(settings.batch_max.min(64));
            let mut size = j.reqs.len();
            group.push(j);
            // whole jobs only: a group's decisions are never split
            while let Some(n) = rest.peek() {
                if group_of(n) != key || size + n.reqs.len() > settings.batch_max {
                    break;
                }
                size += n.reqs.len();
                group.push(rest.next().expect("peeked"));
            }
            let permit = match held.take() {
                Some(p) => p,
                None => match permits.clone().acquire_owned().await {
                    Ok(p) => p,
                    Err(_) => return,
                },
            };
            let (link, settings, counters) = (link.clone(), settings.clone(), counters.clone());
            tokio::spawn(async move {
                send(&link, &settings, &counters, group).await;
                drop(permit);
            });
        }
        // every decision gathered was cancelled: the call slot goes back
        drop(held);
    }
}

/// Sends one call's jobs and hands each its answers.
async fn send(link: &Link, settings: &Settings, counters: &Counters, group: Vec<Job>) {
    let reqs: Vec<&Req> = group.iter().flat_map(|j| j.reqs.iter()).collect();
    let result = call(link, settings, counters, &reqs).await;
    drop(reqs);
    match result {
        Ok(values) => {
            let mut at = 0;
            for j in group {
                let a = answers(&values, &mut at, &j.reqs);
                let _ = j.reply.send(a);
            }
        }
        Err(e) => {
            for j in group {
                let _ = j.reply.send(Err(e.clone()));
            }
        }
    }
}

/// The keys and arguments of one call (see `core.lua`).
fn fill(cmd: &mut Cmd, reqs: &[&Req], settings: &Settings) {
    for r in reqs {
        cmd.arg(r.row.as_bytes());
    }
    script::push_clock(cmd, reqs[0].now);
    cmd.arg(settings.ttl_slack_ms).arg(settings.lease_ttl_ms);
    // each plan's spec once
    let mut specs: SmallVec<[&Arc<str>; 4]> = SmallVec::new();
    let mut index: SmallVec<[usize; 64]> = SmallVec::with_capacity(reqs.len());
    for r in reqs {
        let i = match specs
            .iter()
            .position(|s| Arc::ptr_eq(s, &r.spec) || **s == r.spec)
        {
            Some(i) => i,
            None => {
                specs.push(&r.spec);
                specs.len() - 1
            }
        };
        index.push(i);
    }
    cmd.arg(specs.len());
    for s in &specs {
        cmd.arg(s.as_bytes());
    }
    // each distinct operation once, and an index into them per decision:
    // a batch mostly repeats one operation (a check costing one request)
    let mut ops: SmallVec<[(usize, Op); 4]> = SmallVec::new();
    let mut seen: HashMap<(usize, Op), usize> = HashMap::new();
    let mut which: SmallVec<[usize; 64]> = SmallVec::with_capacity(reqs.len());
    for (r, &i) in reqs.iter().zip(&index) {
        let op = (i, script::sent_op(r.op, &r.plan));
        let at = if let Some(at) = ops.iter().rev().take(8).position(|o| *o == op) {
            ops.len() - 1 - at
        } else if let Some(&at) = seen.get(&op) {
            at
        } else {
            ops.push(op);
            if ops.len() > 8 {
                if seen.is_empty() {
                    seen.extend(ops.iter().enumerate().map(|(k, o)| (*o, k)));
                } else {
                    seen.insert(op, ops.len() - 1);
                }
            }
            ops.len() - 1
        };
        which.push(at + 1);
    }
    cmd.arg(ops.len());
    cmd.arg(script::op_index(&which, ops.len()));
    for &(i, op) in &ops {
        script::push_op(cmd, i, op);
    }
    // the groups, only when the call holds one
    if reqs.iter().any(|r| r.joins) {
        let joins: Vec<u8> = reqs.iter().map(|r| u8::from(r.joins)).collect();
        cmd.arg(joins);
    }
}

/// One call to Redis for `reqs` (one slot, one instant), cut at the
/// deadline; the reply's values, as many as the decisions take.
async fn call(
    link: &Link,
    settings: &Settings,
    counters: &Counters,
    reqs: &[&Req],
) -> Result<Vec<Value>, StoreError> {
    counters.calls.fetch_add(1, Ordering::Relaxed);
    counters
        .sent
        .fetch_add(reqs.len() as u64, Ordering::Relaxed);
    metrics::histogram!("paceline_redis_batch_size").record(reqs.len() as f64);
    let started = Instant::now();
    let filler = |cmd: &mut Cmd| fill(cmd, reqs, settings);
    // a lone check (one caller, above all) goes in the library's shorter
    // form; on the caller's own connection if its plan is counted exactly
    // (a slice taken or given back must not run late: see `direct.rs`)
    let r0 = reqs[0];
    let costs = match script::sent_op(r0.op, &r0.plan) {
        Op::Check { requests, bytes } if reqs.len() == 1 && !r0.joins => Some((requests, bytes)),
        _ => None,
    };
    let lone_filler = |cmd: &mut Cmd| {
        let (requests, bytes) = costs.unwrap_or_default();
        script::push_one(
            cmd,
            &r0.row,
            r0.now,
            settings.ttl_slack_ms,
            settings.lease_ttl_ms,
            &r0.spec,
            requests,
            bytes,
        );
    };
    let lone = costs.map(|_| Lone {
        fill: &lone_filler,
        direct: r0
            .plan
            .policies()
            .iter()
            .all(|p| matches!(p.share(), Share::Exact)),
    });
    let result =
        match tokio::time::timeout(settings.deadline, link.run(reqs.len(), &filler, lone)).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Unavailable(
                "Redis did not answer within the deadline".into(),
            )),
        };
    metrics::histogram!("paceline_redis_call_seconds").record(started.elapsed().as_secs_f64());
    let result = result.and_then(|values| {
        let want: usize = reqs.iter().map(|r| script::reply_len(r.op, &r.plan)).sum();
        if values.len() == want {
            Ok(values)
        } else {
            Err(StoreError::Protocol(format!(
                "the reply has {} values where {want} were due",
                values.len()
            )))
        }
    });
    if let Err(e) = &result {
        counters.errors.fetch_add(1, Ordering::Relaxed);
        let kind = match e {
            StoreError::Unavailable(_) => "unavailable",
            _ => "protocol",
        };
        metrics::counter!("paceline_redis_errors_total", "kind" => kind).increment(1);
    }
    result
}

/// The answers of a job's decisions, read from the reply's values at
/// `at` (moved past them).
fn answers(values: &[Value], at: &mut usize, reqs: &[Req]) -> Answers {
    reqs.iter().map(|r| answer(values, at, r)).collect()
}

/// The answer of `req`, read from the reply's values at `at` (moved past
/// them). The reply's length was checked against every decision's.
fn answer(values: &[Value], at: &mut usize, req: &Req) -> Answer {
    let n = script::reply_len(req.op, &req.plan);
    let mine = &values[*at..*at + n];
    *at += n;
    match req.op {
        Op::Check { requests, bytes } => {
            script::parse_decision(mine, &req.plan, requests, bytes).map(Some)
        }
        _ => script::parse_done(mine).map(|()| None),
    }
}
