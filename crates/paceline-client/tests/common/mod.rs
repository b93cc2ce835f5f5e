//! A discrete-event driver: many workers, one client, one server, on a
//! manual clock. Nothing sleeps; the clock jumps from event to event.

#![allow(dead_code, unreachable_pub)]

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use http::HeaderMap;
use paceline_client::{After, Before, Call, Client, ClientError, Cost, RequestInfo};
use paceline_core::{Clock, Limiter, ManualClock, MemoryStore, Nanos, Plan, Policy};
use paceline_wire::{emit, Problem, PROBLEM_CONTENT_TYPE};

pub const T0: Nanos = Nanos::from_secs(1_790_000_000);

/// A response: status, headers, body.
pub type Resp = (u16, HeaderMap, Option<Vec<u8>>);

/// Which headers the test server publishes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Publish {
    /// IETF RateLimit fields on every response, Retry-After on 429.
    Full,
    /// Only Retry-After on 429.
    RetryAfterOnly,
    /// A bare 429.
    Bare,
}

/// A limiter behind a fake HTTP edge.
pub struct Server {
    pub limiter: Limiter<MemoryStore, ManualClock>,
    pub plan: Plan,
    pub publish: Publish,
}

impl Server {
    pub fn new(clock: &ManualClock, plan: Plan, publish: Publish) -> Self {
        Server {
            limiter: Limiter::new(MemoryStore::new(), clock.clone()),
            plan,
            publish,
        }
    }

    /// The race's server: a bucket 8 deep refilling 4 per second.
    pub fn race(clock: &ManualClock, publish: Publish) -> Self {
        let plan = Plan::new("race", vec![Policy::token_bucket("burst", 8, 2).unwrap()]).unwrap();
        Server::new(clock, plan, publish)
    }

    pub fn respond(&self, key: &str) -> Resp {
        let d = self.limiter.check_sync(&self.plan, key, 1).unwrap();
        let mut h = HeaderMap::new();
        let status = if d.is_allowed() { 200 } else { 429 };
        let mut body = None;
        match self.publish {
            Publish::Full => {
                emit::write_headers(&self.plan, &d, &emit::Dialects::default(), &mut h);
                if let Some(p) = Problem::from_decision(&self.plan, &d, "https://errors.test/") {
                    body = Some(p.to_json().into_bytes());
                    h.insert("content-type", PROBLEM_CONTENT_TYPE.parse().unwrap());
                }
            }
            Publish::RetryAfterOnly => {
                if let Some(s) = emit::retry_after_secs(&d) {
                    h.insert("retry-after", s.into());
                }
            }
            Publish::Bare => {}
        }
        (status, h, body)
    }
}

/// What a run did.
#[derive(Debug, Default)]
pub struct Run {
    pub done: u64,
    pub failed: Vec<ClientError>,
    pub requests: u64,
    pub retries: u64,
    pub by_status: BTreeMap<u16, u64>,
    /// Seconds from the start to the last job's end.
    pub finished_s: f64,
    /// When each attempt reached the server, and whether it was a retry.
    pub arrivals: Vec<(Nanos, bool)>,
    /// Every wait a retrying call was told, with the Retry-After it followed.
    pub retry_waits: Vec<(Nanos, Option<Nanos>)>,
}

impl Run {
    pub fn status(&self, s: u16) -> u64 {
        self.by_status.get(&s).copied().unwrap_or(0)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Wake,
    Arrive,
    Answer,
}

/// Drives `workers` workers through `jobs` jobs (or until `stop`).
/// `think` separates a worker's jobs; `latency` is the round trip.
pub struct Driver<'a> {
    pub client: &'a Client,
    pub clock: &'a ManualClock,
    pub workers: usize,
    pub jobs: u64,
    pub latency: Nanos,
    pub think: Nanos,
    pub stop: Option<Nanos>,
    pub url: &'a str,
    /// Spread start times and think times uniformly over `[0, 2·think]`.
    pub jitter_think: bool,
    /// Each way of each attempt takes `latency / 2` plus a uniform draw
    /// from `[0, spread]`, so attempts overtake one another.
    pub spread: Nanos,
    /// Seeds the latency draws.
    pub latency_seed: u64,
}

impl Driver<'_> {
    pub fn run(&self, server: &mut dyn FnMut(Nanos) -> Resp) -> Run {
        self.run_costed(&[], &mut |t, _| server(t))
    }

    /// Like [`Driver::run`], job `i` stating `costs[i]` (none past the
    /// end); the server is told the cost of the job it answers.
    pub fn run_costed(&self, costs: &[Cost], server: &mut dyn FnMut(Nanos, &Cost) -> Resp) -> Run {
        let none = Cost::new();
        let mut job_of: Vec<usize> = vec![0; self.workers];
        let mut run = Run::default();
        let mut heap: BinaryHeap<Reverse<(Nanos, u64, usize, Ev)>> = BinaryHeap::new();
        let mut seq = 0u64;
        let mut push = |heap: &mut BinaryHeap<_>, t: Nanos, w: usize, e: Ev| {
            seq += 1;
            heap.push(Reverse((t, seq, w, e)));
        };
        let start = self.clock.now();
        let mut calls: Vec<Option<Call>> = vec![None; self.workers];
        let mut answers: Vec<Option<Resp>> = vec![None; self.workers];
        let mut pending_ra: Vec<Option<Nanos>> = vec![None; self.workers];
        let mut issued = 0u64;
        let mut lcg = 0x9e37_79b9_7f4a_7c15u64;
        let jitter_think = self.jitter_think;
        let think_base = self.think;
        let mut think = move || {
            if !jitter_think {
                return think_base;
            }
            lcg = lcg
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            Nanos::new((lcg >> 11) % (2 * think_base.as_u64()).max(1))
        };
        for w in 0..self.workers {
            let at = if jitter_think {
                start.saturating_add(think())
            } else {
                start
            };
            push(&mut heap, at, w, Ev::Wake);
        }
        let half = Nanos::new(self.latency.as_u64() / 2);
        let spread = self.spread.as_u64();
        let mut lcg_way = 0x2545_f491_4f6c_dd1du64 ^ self.latency_seed;
        let mut way = move || {
            if spread == 0 {
                return half;
            }
            lcg_way = lcg_way
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            half.saturating_add(Nanos::new((lcg_way >> 11) % (spread + 1)))
        };
        let mut last_end = start;
        while let Some(Reverse((t, _, w, ev))) = heap.pop() {
            if self.stop.is_some_and(|s| t > s) {
                break;
            }
            self.clock.set(t);
            match ev {
                Ev::Wake => {
                    if calls[w].is_none() {
                        if issued >= self.jobs {
                            continue;
                        }
                        job_of[w] = issued as usize;
                        issued += 1;
                        let cost = costs.get(job_of[w]).cloned().unwrap_or_default();
                        let info = RequestInfo::get(self.url).with_cost(cost);
                        calls[w] = Some(self.client.call(info));
                    }
                    let call = calls[w].as_mut().unwrap();
                    match self.client.before(call) {
                        Before::Go => {
                            run.requests += 1;
                            let retry = call.attempts() > 1;
                            if retry {
                                run.retries += 1;
                            }
                            let at = t.saturating_add(way());
                            run.arrivals.push((at, retry));
                            push(&mut heap, at, w, Ev::Arrive);
                        }
                        Before::Wait(d) => push(
                            &mut heap,
                            t.saturating_add(d.max(Nanos::new(1))),
                            w,
                            Ev::Wake,
                        ),
                        Before::Drop(e) => {
                            run.failed.push(e);
                            calls[w] = None;
                            last_end = t;
                            push(&mut heap, t.saturating_add(think()), w, Ev::Wake);
                        }
                    }
                }
                Ev::Arrive => {
                    let resp = server(t, costs.get(job_of[w]).unwrap_or(&none));
                    *run.by_status.entry(resp.0).or_insert(0) += 1;
                    pending_ra[w] = resp
                        .1
                        .get("retry-after")
                        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                        .map(Nanos::from_secs);
                    answers[w] = Some(resp);
                    push(&mut heap, t.saturating_add(way()), w, Ev::Answer);
                }
                Ev::Answer => {
                    let (status, headers, body) = answers[w].take().unwrap();
                    let call = calls[w].as_mut().unwrap();
                    match self
                        .client
                        .after_response(call, status, &headers, body.as_deref())
                    {
                        After::Done => {
                            run.done += 1;
                            calls[w] = None;
                            last_end = t;
                            push(&mut heap, t.saturating_add(think()), w, Ev::Wake);
                        }
                        After::RetryAfter(d) => {
                            run.retry_waits.push((d, pending_ra[w]));
                            push(&mut heap, t.saturating_add(d), w, Ev::Wake);
                        }
                        After::Error(e) => {
                            run.failed.push(e);
                            calls[w] = None;
                            last_end = t;
                            push(&mut heap, t.saturating_add(think()), w, Ev::Wake);
                        }
                    }
                }
            }
        }
        run.finished_s = last_end.saturating_sub(start).as_secs_f64();
        run
    }
}

/// A client on `clock` with a fixed seed.
pub fn client(clock: &ManualClock, seed: u64) -> Client {
    Client::builder().clock(clock.clone()).seed(seed).build()
}
