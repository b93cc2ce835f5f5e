//! The batcher: decisions from every task of this instance queue here, and
//! one background task sends them to Redis many per call, one call per
//! cluster slot, with several calls in flight.
//!
//! Bounds: the queue holds at most `queue` decisions (a full queue fails a
//! decision at once, never waits); one call carries at most `batch_max`;
//! at most `max_in_flight` calls are out at once, each cut off at the
//! deadline. A decision whose caller already gave up is not sent.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, Semaphore};

use paceline_core::{Nanos, StoreError};

use crate::link::Link;
use crate::script::{self, Op};

pub(crate) struct Job {
    pub(crate) row: String,
    pub(crate) slot: u16,
    pub(crate) spec: Arc<str>,
    pub(crate) op: Op,
    /// The caller's instant, when decisions read the caller's clock.
    pub(crate) now: Option<Nanos>,
    pub(crate) reply: oneshot::Sender<Result<String, StoreError>>,
}

/// Counters the store reports.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) calls: AtomicU64,
    pub(crate) sent: AtomicU64,
    pub(crate) errors: AtomicU64,
}

pub(crate) struct Settings {
    pub(crate) batch_max: usize,
    pub(crate) linger: Duration,
    pub(crate) max_in_flight: usize,
    pub(crate) deadline: Duration,
    pub(crate) ttl_slack_ms: u64,
    pub(crate) lease_ttl_ms: u64,
}

/// Starts the batcher; returns where to queue decisions.
pub(crate) fn start(
    link: Arc<Link>,
    settings: Settings,
    queue: usize,
    counters: Arc<Counters>,
) -> mpsc::Sender<Job> {
    let (tx, rx) = mpsc::channel(queue);
    tokio::spawn(run(rx, link, Arc::new(settings), counters));
    tx
}

async fn run(
    mut rx: mpsc::Receiver<Job>,
    link: Arc<Link>,
    settings: Arc<Settings>,
    counters: Arc<Counters>,
) {
    let permits = Arc::new(Semaphore::new(settings.max_in_flight));
    let gather_max = settings.batch_max * settings.max_in_flight;
    let mut jobs: Vec<Job> = Vec::new();
    while let Some(first) = rx.recv().await {
        jobs.push(first);
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
        // arrival order kept within each
        jobs.sort_by_key(|j| (j.slot, j.now));
        let mut rest = std::mem::take(&mut jobs).into_iter().peekable();
        while let Some(j) = rest.next() {
            let mut group = vec![j];
            while group.len() < settings.batch_max {
                match rest.peek() {
                    Some(n) if n.slot == group[0].slot && n.now == group[0].now => {
                        group.push(rest.next().expect("peeked"))
                    }
                    _ => break,
                }
            }
            let Ok(permit) = permits.clone().acquire_owned().await else {
                return;
            };
            let (link, settings, counters) = (link.clone(), settings.clone(), counters.clone());
            tokio::spawn(async move {
                send(&link, &settings, &counters, group).await;
                drop(permit);
            });
        }
    }
}

async fn send(link: &Link, settings: &Settings, counters: &Counters, group: Vec<Job>) {
    let mut specs: Vec<Arc<str>> = Vec::new();
    let mut index = Vec::with_capacity(group.len());
    for j in &group {
        let i = match specs
            .iter()
            .position(|s| Arc::ptr_eq(s, &j.spec) || **s == *j.spec)
        {
            Some(i) => i,
            None => {
                specs.push(j.spec.clone());
                specs.len() - 1
            }
        };
        index.push(i);
    }
    let mut args = Vec::with_capacity(4 + specs.len() + 4 * group.len());
    args.push(script::clock_arg(group[0].now));
    args.push(settings.ttl_slack_ms.to_string());
    args.push(settings.lease_ttl_ms.to_string());
    args.push(specs.len().to_string());
    args.extend(specs.iter().map(|s| s.to_string()));
    for (j, &i) in group.iter().zip(&index) {
        script::push_op(&mut args, i, j.op);
    }
    let keys: Vec<String> = group.iter().map(|j| j.row.clone()).collect();
    counters.calls.fetch_add(1, Ordering::Relaxed);
    counters
        .sent
        .fetch_add(group.len() as u64, Ordering::Relaxed);
    metrics::histogram!("paceline_redis_batch_size").record(group.len() as f64);
    let started = Instant::now();
    let result = match tokio::time::timeout(settings.deadline, link.run(&keys, &args)).await {
        Ok(r) => r,
        Err(_) => Err(StoreError::Unavailable(
            "Redis did not answer within the deadline".into(),
        )),
    };
    metrics::histogram!("paceline_redis_call_seconds").record(started.elapsed().as_secs_f64());
    match result {
        Ok(text) => {
            let mut lines = text.split('\n');
            for j in group {
                let r = match lines.next() {
                    Some(l) => Ok(l.to_string()),
                    None => Err(StoreError::Protocol("reply has too few lines".into())),
                };
                let _ = j.reply.send(r);
            }
        }
        Err(e) => {
            counters.errors.fetch_add(1, Ordering::Relaxed);
            let kind = match e {
                StoreError::Unavailable(_) => "unavailable",
                _ => "protocol",
            };
            metrics::counter!("paceline_redis_errors_total", "kind" => kind).increment(1);
            for j in group {
                let _ = j.reply.send(Err(e.clone()));
            }
        }
    }
}
