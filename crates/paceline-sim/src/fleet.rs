//! Fleets of workers doing jobs through one gateway: the model behind the
//! race and the export.
//!
//! A fleet is `workers` workers sharing one API key and one client, taking
//! jobs (one request each) from a common queue. A worker asks its client
//! whether to send; the request travels `latency` to the gateway, is
//! answered there, and the answer travels `latency` back, where the client
//! decides: done, retry after a wait, or give up. Every fleet in a world
//! shares the gateway (and its edge capacity), each with its own key.

use paceline_core::Nanos;

use crate::engine::EventQueue;
use crate::gateway::{Answer, Gateway, Verdict};
use crate::report::{round3, FleetReport, Timeline};

/// What a client says before a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Before<T> {
    /// Send it now; hand the ticket back with the answer.
    Send(T),
    /// Ask again after this long.
    Wait(Nanos),
    /// Refused locally (adaptive throttling): the attempt fails here.
    Drop,
}

/// What a client says about an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum After {
    /// The job is done.
    Done,
    /// Send the same job again after this long.
    Retry(Nanos),
    /// The client gives up on this attempt; the job goes back to the queue
    /// after this long (a transient failure the application retries).
    Requeue(Nanos),
    /// No wait can fix it (a quota used up, a request too big): abandon.
    Abandon,
}

/// A fleet's client: the policy deciding when to send and what to do with
/// each answer. One value serves all of a fleet's workers.
pub trait FleetClient {
    /// What travels with a request in flight.
    type Ticket;
    /// Before `worker` sends an attempt (`attempt` 1 for a job's first
    /// request).
    fn before(&mut self, worker: usize, attempt: u32, now: Nanos) -> Before<Self::Ticket>;
    /// After the answer to `worker`'s attempt.
    fn after(
        &mut self,
        worker: usize,
        ticket: Self::Ticket,
        answer: &Answer,
        gateway: &Gateway,
        now: Nanos,
    ) -> After;
}

/// The naive client: sends whenever asked, ignores every header, and on
/// any failure sends the same request again after a fixed pause.
#[derive(Clone, Copy, Debug)]
pub struct Naive {
    /// The pause before a retry (zero: immediately).
    pub retry_every: Nanos,
}

impl FleetClient for Naive {
    type Ticket = ();

    fn before(&mut self, _worker: usize, _attempt: u32, _now: Nanos) -> Before<()> {
        Before::Send(())
    }

    fn after(&mut self, _: usize, _: (), answer: &Answer, _: &Gateway, _: Nanos) -> After {
        match answer.verdict {
            Verdict::Served => After::Done,
            _ => After::Retry(self.retry_every),
        }
    }
}

/// The shape of one fleet.
#[derive(Clone, Debug)]
pub struct FleetSpec {
    /// Its name in reports.
    pub name: String,
    /// Workers sending in parallel.
    pub workers: u32,
    /// Jobs to do, one request each.
    pub jobs: u64,
}

/// How requests travel and how long a run may last.
#[derive(Clone, Copy, Debug)]
pub struct Network {
    /// One-way latency, client to gateway (and back).
    pub latency: Nanos,
    /// Width of a timeline bucket.
    pub bucket: Nanos,
    /// Stop here even if jobs remain.
    pub deadline: Nanos,
}

enum Ev {
    Ready {
        fleet: usize,
        worker: usize,
    },
    Arrive {
        fleet: usize,
        worker: usize,
    },
    Respond {
        fleet: usize,
        worker: usize,
        answer: Answer,
    },
}

struct Worker<T> {
    job: bool,
    attempt: u32,
    ticket: Option<T>,
}

/// One fleet's client and its workers' state as the run goes.
pub struct Fleet<C: FleetClient> {
    spec: FleetSpec,
    client: C,
    workers: Vec<Worker<C::Ticket>>,
    queued: u64,
    report: FleetReport,
    done_at: Option<Nanos>,
}

impl<C: FleetClient> Fleet<C> {
    /// A fleet of `spec` using `client`.
    pub fn new(spec: FleetSpec, client: C) -> Self {
        let workers = (0..spec.workers)
            .map(|_| Worker {
                job: false,
                attempt: 0,
                ticket: None,
            })
            .collect();
        let report = FleetReport {
            name: spec.name.clone(),
            jobs: spec.jobs,
            jobs_done: 0,
            requests: 0,
            rejected_429: 0,
            dropped: 0,
            finished_at_s: None,
            rejected_503: 0,
            retries: 0,
            local_drops: 0,
            jobs_failed: 0,
            timeline: Timeline::default(),
            served: None,
            tokens_left: None,
        };
        Fleet {
            queued: spec.jobs,
            spec,
            client,
            workers,
            report,
            done_at: None,
        }
    }

    /// The client, for inspection after a run.
    pub fn client(&self) -> &C {
        &self.client
    }

    fn settled(&self) -> bool {
        self.report.jobs_done + self.report.jobs_failed >= self.spec.jobs
    }
}

/// Object-safe face of a fleet, so fleets with different clients share a run.
pub trait AnyFleet {
    /// Handles one of this fleet's events.
    #[doc(hidden)]
    fn on_ready(&mut self, w: usize, ctx: &mut Ctx<'_>);
    #[doc(hidden)]
    fn on_respond(&mut self, w: usize, answer: Answer, ctx: &mut Ctx<'_>);
    /// Whether every job is done or abandoned.
    fn is_settled(&self) -> bool;
    /// Number of workers.
    fn worker_count(&self) -> usize;
    /// The report, with times counted from `start`.
    fn finish(&mut self, start: Nanos, bucket: Nanos) -> FleetReport;
}

/// What a fleet's handlers may touch.
#[doc(hidden)]
pub struct Ctx<'a> {
    queue: &'a mut EventQueue<Ev>,
    gateway: &'a Gateway,
    fleet: usize,
    net: Network,
    start: Nanos,
}

impl Ctx<'_> {
    fn bucket(&self, now: Nanos) -> usize {
        (now.saturating_sub(self.start).as_u64() / self.net.bucket.as_u64().max(1)) as usize
    }
}

impl<C: FleetClient> AnyFleet for Fleet<C> {
    fn on_ready(&mut self, w: usize, ctx: &mut Ctx<'_>) {
        let now = ctx.queue.now();
        let worker = &mut self.workers[w];
        if !worker.job {
            if self.queued == 0 {
                return;
            }
            self.queued -= 1;
            worker.job = true;
            worker.attempt = 1;
        }
        match self.client.before(w, worker.attempt, now) {
            Before::Send(t) => {
                worker.ticket = Some(t);
                self.report.requests += 1;
                if worker.attempt > 1 {
                    self.report.retries += 1;
                }
                Timeline::bump(&mut self.report.timeline.sent, ctx.bucket(now));
                let (fleet, worker) = (ctx.fleet, w);
                ctx.queue
                    .schedule_in(ctx.net.latency, Ev::Arrive { fleet, worker });
            }
            Before::Wait(d) => {
                let (fleet, worker) = (ctx.fleet, w);
                ctx.queue
                    .schedule_in(d.max(Nanos::new(1)), Ev::Ready { fleet, worker });
            }
            Before::Drop => {
                self.report.local_drops += 1;
                worker.job = false;
                self.queued += 1;
                let (fleet, worker) = (ctx.fleet, w);
                ctx.queue
                    .schedule_in(Nanos::SECOND, Ev::Ready { fleet, worker });
            }
        }
    }

    fn on_respond(&mut self, w: usize, answer: Answer, ctx: &mut Ctx<'_>) {
        let now = ctx.queue.now();
        let b = ctx.bucket(now);
        let tl = &mut self.report.timeline;
        match answer.status() {
            None => {
                self.report.dropped += 1;
                Timeline::bump(&mut tl.dropped, b);
            }
            Some(429) => {
                self.report.rejected_429 += 1;
                Timeline::bump(&mut tl.rejected, b);
            }
            Some(503) => {
                self.report.rejected_503 += 1;
                Timeline::bump(&mut tl.rejected, b);
            }
            Some(s) if (200..300).contains(&s) => Timeline::bump(&mut tl.served, b),
            Some(_) => {}
        }
        let worker = &mut self.workers[w];
        let Some(ticket) = worker.ticket.take() else {
            return;
        };
        let again = match self.client.after(w, ticket, &answer, ctx.gateway, now) {
            After::Done => {
                worker.job = false;
                self.report.jobs_done += 1;
                Nanos::ZERO
            }
            After::Retry(d) => {
                worker.attempt += 1;
                d
            }
            After::Requeue(d) => {
                worker.job = false;
                self.queued += 1;
                d
            }
            After::Abandon => {
                worker.job = false;
                self.report.jobs_failed += 1;
                Nanos::ZERO
            }
        };
        if self.done_at.is_none() && self.settled() {
            self.done_at = Some(now);
        }
        if again == Nanos::ZERO {
            // the worker moves on at once: no need for a trip through the queue
            self.on_ready(w, ctx);
        } else {
            let (fleet, worker) = (ctx.fleet, w);
            ctx.queue.schedule_in(again, Ev::Ready { fleet, worker });
        }
    }

    fn is_settled(&self) -> bool {
        self.settled()
    }

    fn worker_count(&self) -> usize {
        self.workers.len()
    }

    fn finish(&mut self, start: Nanos, bucket: Nanos) -> FleetReport {
        let mut r = self.report.clone();
        r.finished_at_s = self
            .done_at
            .filter(|_| r.jobs_done == r.jobs)
            .map(|t| round3(t.saturating_sub(start).as_secs_f64()));
        r.timeline.bucket_s = bucket.as_secs_f64();
        r.timeline.square();
        r
    }
}

/// Runs `fleets` (fleet `i` uses key `i`) against `gateway` from `start`
/// until every fleet is settled or the deadline passes. Returns the reports
/// and the number of events processed.
pub fn run(
    fleets: &mut [&mut dyn AnyFleet],
    gateway: &mut Gateway,
    queue_clock: paceline_core::ManualClock,
    start: Nanos,
    net: Network,
) -> (Vec<FleetReport>, u64) {
    queue_clock.set(start);
    let mut queue = EventQueue::with_clock(queue_clock);
    for (fleet, f) in fleets.iter().enumerate() {
        for worker in 0..f.worker_count() {
            queue.schedule_at(start, Ev::Ready { fleet, worker });
        }
    }
    let deadline = start.saturating_add(net.deadline);
    let mut settled: Vec<bool> = fleets.iter().map(|f| f.is_settled()).collect();
    let mut unsettled = settled.iter().filter(|s| !**s).count();
    while let Some((now, ev)) = queue.pop() {
        if now > deadline || unsettled == 0 {
            break;
        }
        let fleet = match ev {
            Ev::Ready { fleet, worker } => {
                let mut ctx = Ctx {
                    queue: &mut queue,
                    gateway,
                    fleet,
                    net,
                    start,
                };
                fleets[fleet].on_ready(worker, &mut ctx);
                fleet
            }
            Ev::Arrive { fleet, worker } => {
                let answer = gateway.handle(fleet, 1, now);
                queue.schedule_in(
                    net.latency,
                    Ev::Respond {
                        fleet,
                        worker,
                        answer,
                    },
                );
                continue;
            }
            Ev::Respond {
                fleet,
                worker,
                answer,
            } => {
                let mut ctx = Ctx {
                    queue: &mut queue,
                    gateway,
                    fleet,
                    net,
                    start,
                };
                fleets[fleet].on_respond(worker, answer, &mut ctx);
                fleet
            }
        };
        if !settled[fleet] && fleets[fleet].is_settled() {
            settled[fleet] = true;
            unsettled -= 1;
        }
    }
    let reports = fleets
        .iter_mut()
        .map(|f| f.finish(start, net.bucket))
        .collect();
    (reports, queue.popped())
}
