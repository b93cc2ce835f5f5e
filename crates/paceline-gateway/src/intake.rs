//! The intake of request bodies: what a client may make the gateway wait
//! for and hold before its request counts against anything shared.
//!
//! Why: a request counts in flight (against the shedder's
//! `max_in_flight`) once it holds a unit of that capacity. Were that the
//! moment its head is read, a few hundred connections sending their bodies
//! at a byte a second would hold every place, and every client, critical
//! routes included, would get `503` for as long as they cared to keep it
//! up. So a request the limiter admitted (it decides from the head, before
//! any of this: see `admitted.rs`) whose body has not all come with its
//! head first waits here:
//!
//! - it takes a *receiving* place, at most `gateway.limits.max_receiving`
//!   overall and `max_receiving_per_ip` per client address (`503
//!   overloaded` past either), kept until its whole body has arrived;
//! - it waits until `gateway.limits.intake_bytes` of its body (or all of
//!   it) are in, the bytes counted against the memory bound below, and
//!   only then takes its unit of in-flight capacity and goes on to the
//!   upstream.
//!
//! Every request body, in the intake and afterwards while it streams up,
//! is held to two deadlines ([`Pace`]): the whole body within
//! `gateway.timeouts.request_body_ms` of its head, and, once
//! `body_rate_grace_ms` has passed, at least `gateway.limits.min_body_rate`
//! bytes a second over every `body_rate_window_ms` it was waited for.
//! Breaking either is answered `408` when no answer has started, the
//! connection closed, and the upstream connection the body was going to is
//! dropped, never reused. The rate is only judged while the gateway is
//! waiting on the client: an upstream slow to read does not make its
//! client look slow.
//!
//! [`Buffered`] is the one gauge of bytes held for clients: unfinished
//! request heads (counted by the connection's socket wrapper in `edge.rs`
//! while no request is in flight on it), the heads of requests in flight
//! (until their answer's head; an HTTP/2 connection may have many), bodies
//! in their intake, and, for
//! every body still streaming up once its intake is done, its
//! [`READ_AHEAD`]: what of it the gateway may hold at once on its way
//! through, bounded per body by construction (a socket read of at most
//! [`crate::edge::BODY_READ`] for HTTP/1, the stream's flow-control window
//! for HTTP/2, the frame being sent up and its framed copy). Past
//! `gateway.limits.max_buffered_bytes` a connection with no request in
//! flight is closed before anything more is read from it, and a new
//! intake (or a body that would stream on past it) is refused with `503`.
//!
//! A body that goes upstream carries its [`BodyProgress`], so that when the
//! upstream's answer is late the proxy can tell a client that stopped
//! sending (`408`) from an upstream that did not answer (`504`).
//!
//! Time is read from the gateway's clock where a deadline is decided;
//! tokio's timers only wake the body up to look.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, CONNECTION};
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use paceline_core::{Clock, Nanos};
use paceline_wire::problem::{self, Problem, ProblemKind};
use parking_lot::Mutex;
use tokio::time::Sleep;

use crate::config::{GatewayLimits, PathSettings, Timeouts};
use crate::upstream::BoxError;

// ---------------------------------------------------------------------------
// The memory gauge
// ---------------------------------------------------------------------------

/// Bytes held for clients across all connections, against one bound.
#[derive(Debug)]
pub(crate) struct Buffered {
    held: AtomicUsize,
    cap: usize,
}

impl Buffered {
    /// A gauge bounded by `cap` bytes.
    pub(crate) fn new(cap: usize) -> Arc<Buffered> {
        Arc::new(Buffered {
            held: AtomicUsize::new(0),
            cap,
        })
    }

    /// The bytes held now.
    pub(crate) fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    /// Reserves as much of `want` as the bound leaves room for: the bytes
    /// reserved (0 when full).
    pub(crate) fn reserve_up_to(&self, want: usize) -> usize {
        let mut got = 0;
        let _ = self
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                got = want.min(self.cap.saturating_sub(cur));
                (got > 0).then_some(cur + got)
            });
        got
    }

    /// Reserves exactly `n` bytes, or nothing.
    pub(crate) fn try_reserve(&self, n: usize) -> bool {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                (cur.checked_add(n)? <= self.cap).then_some(cur + n)
            })
            .is_ok()
    }

    /// Counts `n` bytes held already (they came with a head that was
    /// counted as they were read), whatever the bound.
    pub(crate) fn add(&self, n: usize) {
        self.held.fetch_add(n, Ordering::AcqRel);
    }

    /// Gives `n` reserved bytes back.
    pub(crate) fn give_back(&self, n: usize) {
        if n > 0 {
            self.held.fetch_sub(n, Ordering::AcqRel);
        }
    }
}

/// The bytes of the gauge a request body holds for as long as it streams
/// on after its intake: the most of it the gateway can hold at once on its
/// way up. HTTP/1: a socket read hyper holds (at most
/// [`crate::edge::BODY_READ`]), the frame being written up and its framed
/// copy, each no larger; HTTP/2: the stream's window
/// ([`crate::server::H2_STREAM_WINDOW`]) and the same frame and copy (a
/// frame is at most 16 KiB).
pub(crate) const READ_AHEAD: usize = 128 * 1024;

// ---------------------------------------------------------------------------
// Progress, for the proxy
// ---------------------------------------------------------------------------

/// How far a request body has come, shared with the proxy through the
/// request's extensions: when the upstream's answer is late while the body
/// is still coming, it says whether the client is to blame.
#[derive(Debug)]
pub(crate) struct BodyProgress {
    /// Body bytes received from the client so far.
    received: AtomicU64,
    /// No more is to come: the body ended, failed or broke a deadline.
    done: AtomicBool,
    /// The gateway's last look at the client's body found nothing there:
    /// it is waiting on the client (not on an upstream slow to read).
    waiting: AtomicBool,
    /// `gateway.limits.min_body_rate`.
    min_rate: u64,
}

impl BodyProgress {
    fn new(min_rate: u64) -> Arc<BodyProgress> {
        Arc::new(BodyProgress {
            received: AtomicU64::new(0),
            done: AtomicBool::new(false),
            waiting: AtomicBool::new(false),
            min_rate,
        })
    }

    /// Body bytes received so far.
    pub(crate) fn received(&self) -> u64 {
        self.received.load(Ordering::Acquire)
    }

    /// Whether a body that had `before` bytes in when the upstream was
    /// first waited for, `waited` ago, is what the upstream still waits
    /// for: not all in, the gateway waiting on the client for more, and
    /// less of it came in the wait than the least rate asks (nothing at
    /// all, with the rate rule off).
    pub(crate) fn client_stalled(&self, before: u64, waited: Duration) -> bool {
        if self.done.load(Ordering::Acquire) || !self.waiting.load(Ordering::Acquire) {
            return false;
        }
        let got = self.received().saturating_sub(before);
        let need = (u128::from(self.min_rate) * waited.as_nanos()).div_ceil(1_000_000_000);
        u128::from(got) < need.max(1)
    }

    fn data(&self, n: usize) {
        self.received.fetch_add(n as u64, Ordering::AcqRel);
        self.waiting.store(false, Ordering::Release);
    }
}

// ---------------------------------------------------------------------------
// Receiving places
// ---------------------------------------------------------------------------

/// The places of requests still receiving their bodies, overall and per
/// client address.
#[derive(Debug)]
pub(crate) struct Receiving {
    state: Mutex<(u32, HashMap<IpAddr, u32>)>,
    max: u32,
    per_ip: u32,
}

impl Receiving {
    pub(crate) fn new(max: u32, per_ip: u32) -> Arc<Receiving> {
        Arc::new(Receiving {
            state: Mutex::new((0, HashMap::new())),
            max,
            per_ip,
        })
    }

    /// A place for a body from `ip`, or `None` when either bound is reached.
    pub(crate) fn try_take(self: &Arc<Self>, ip: IpAddr) -> Option<ReceivingPlace> {
        let mut g = self.state.lock();
        let (total, by_ip) = &mut *g;
        if *total >= self.max {
            return None;
        }
        let n = by_ip.entry(ip).or_insert(0);
        if *n >= self.per_ip {
            return None;
        }
        *n += 1;
        *total += 1;
        Some(ReceivingPlace {
            of: self.clone(),
            ip,
        })
    }

    /// Places taken now.
    pub(crate) fn taken(&self) -> u32 {
        self.state.lock().0
    }
}

/// One receiving place, given back when dropped.
#[derive(Debug)]
pub(crate) struct ReceivingPlace {
    of: Arc<Receiving>,
    ip: IpAddr,
}

impl Drop for ReceivingPlace {
    fn drop(&mut self) {
        let mut g = self.of.state.lock();
        let (total, by_ip) = &mut *g;
        *total -= 1;
        if let Some(n) = by_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                by_ip.remove(&self.ip);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The deadlines
// ---------------------------------------------------------------------------

/// Which deadline a request body broke.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Breach {
    /// The whole body took longer than `request_body_ms`.
    Total,
    /// It came slower than `min_body_rate` over a window.
    Slow,
}

/// A request body that broke one of its deadlines.
#[derive(Debug)]
pub(crate) struct BodyDeadline(pub(crate) Breach);

impl std::fmt::Display for BodyDeadline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Breach::Total => f.write_str("request body took longer than allowed"),
            Breach::Slow => f.write_str("request body slower than the least rate"),
        }
    }
}

impl std::error::Error for BodyDeadline {}

/// How many samples of a body's progress a window keeps.
const SAMPLES_PER_WINDOW: u64 = 8;

/// The deadlines of one request body, decided on times read from the
/// gateway's clock: no I/O, no timers.
#[derive(Clone, Debug)]
pub(crate) struct Pace {
    start: Nanos,
    total: Nanos,
    /// Bytes per second; 0: no rate rule.
    min_rate: u64,
    window: Nanos,
    grace: Nanos,
    received: u64,
    /// When data last arrived.
    last_data: Nanos,
    /// `(when, bytes received before then)`, oldest first, one per
    /// `window / SAMPLES_PER_WINDOW` at most.
    samples: VecDeque<(Nanos, u64)>,
}

impl Pace {
    /// The deadlines of a body whose head was read at `start`.
    pub(crate) fn new(start: Nanos, t: &Timeouts, min_rate: u64) -> Pace {
        let mut samples = VecDeque::with_capacity(SAMPLES_PER_WINDOW as usize + 2);
        samples.push_back((start, 0));
        Pace {
            start,
            total: Nanos::from(t.request_body),
            min_rate,
            window: Nanos::from(t.body_rate_window).max(Nanos::new(1)),
            grace: Nanos::from(t.body_rate_grace),
            received: 0,
            last_data: start,
            samples,
        }
    }

    /// `n` more bytes arrived at `now`.
    pub(crate) fn on_data(&mut self, now: Nanos, n: u64) {
        let step = (self.window.as_u64() / SAMPLES_PER_WINDOW).max(1);
        let last = self.samples.back().map_or(Nanos::ZERO, |s| s.0);
        if now.saturating_sub(last).as_u64() >= step {
            // what had arrived before this data
            self.samples.push_back((now, self.received));
        }
        self.received = self.received.saturating_add(n);
        self.last_data = now;
        self.trim(now);
    }

    /// Drops samples older than one window before `now`, keeping the
    /// newest of those as the window's starting point.
    fn trim(&mut self, now: Nanos) {
        let floor = now.saturating_sub(self.window);
        while self.samples.len() > 1 && self.samples[1].0 <= floor {
            self.samples.pop_front();
        }
    }

    /// Whether the whole-body deadline has passed at `now`.
    pub(crate) fn total_passed(&self, now: Nanos) -> bool {
        now.saturating_sub(self.start) >= self.total
    }

    /// Judges the body at `now`, while the gateway waits on the client.
    pub(crate) fn check(&mut self, now: Nanos) -> Result<(), Breach> {
        if self.total_passed(now) {
            return Err(Breach::Total);
        }
        let since = now.saturating_sub(self.start);
        if self.min_rate == 0 || since < self.grace || since < self.window {
            return Ok(());
        }
        self.trim(now);
        // the bytes of the last window: none if nothing came in it, else
        // those since the newest sample at or before its start
        let floor = now.saturating_sub(self.window);
        let got = match self.last_data <= floor {
            true => 0,
            false => self.received - self.samples[0].1,
        };
        let need =
            (u128::from(self.min_rate) * u128::from(self.window.as_u64())).div_ceil(1_000_000_000);
        match u128::from(got) >= need {
            true => Ok(()),
            false => Err(Breach::Slow),
        }
    }

    /// When to look again while waiting on the client, from `now`.
    pub(crate) fn next_look(&self, now: Nanos) -> Duration {
        let to_total = (self.start.saturating_add(self.total)).saturating_sub(now);
        let step = match self.min_rate {
            0 => to_total,
            _ => {
                let to_grace = self.start.saturating_add(self.grace).saturating_sub(now);
                let quarter = Nanos::new(self.window.as_u64() / 4).max(Nanos::new(1_000_000));
                to_grace.max(quarter)
            }
        };
        to_total.min(step).max(Nanos::new(1_000_000)).as_duration()
    }
}

// ---------------------------------------------------------------------------
// The body
// ---------------------------------------------------------------------------

/// A request body as the rest of the gateway sees it: the frames its
/// intake took first (their bytes held against the memory gauge until
/// they are passed on), then the rest straight from the client, all of it
/// held to its [`Pace`].
///
/// A body with nothing to come (most requests) is one null pointer; one
/// that flows keeps its state in a box. Every stage after the intake
/// moves the request by value, so its size is paid at each of them: the
/// state inline made a request 480 bytes instead of 232.
pub(crate) struct RequestBody<B = crate::h1::ClientBody>(Option<Box<Flow<B>>>);

/// The state of a body that flows (see [`RequestBody`]).
struct Flow<B> {
    front: VecDeque<Frame<Bytes>>,
    /// Bytes of `front` counted in the gauge.
    held: usize,
    gauge: Option<Arc<Buffered>>,
    rest: Option<B>,
    paced: Option<Paced>,
    /// Given back once the body has all arrived.
    place: Option<ReceivingPlace>,
    /// Whether the client announced the body's length: a body of unknown
    /// length stays one (chunked on the way up) even when the intake took
    /// all of it.
    announced: bool,
    /// Bytes of the gauge held as this body's [`READ_AHEAD`] while it
    /// streams on past its intake.
    ahead: usize,
    progress: Option<Arc<BodyProgress>>,
}

struct Paced {
    pace: Pace,
    clock: Arc<dyn Clock>,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl<B> RequestBody<B> {
    /// A body with nothing more to come.
    pub(crate) fn empty() -> Self {
        RequestBody(None)
    }

    fn flowing(flow: Flow<B>) -> Self {
        RequestBody(Some(Box::new(flow)))
    }

    /// Bytes the intake holds.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.0.as_ref().map_or(0, |f| f.held)
    }
}

impl<B> Body for RequestBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut().0.as_deref_mut() {
            None => Poll::Ready(None),
            Some(flow) => flow.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.0.as_ref().is_none_or(|f| f.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.0
            .as_ref()
            .map_or(SizeHint::with_exact(0), |f| f.size_hint())
    }
}

impl<B> Flow<B> {
    fn front_len(&self) -> u64 {
        self.front
            .iter()
            .filter_map(|f| f.data_ref())
            .map(|d| d.len() as u64)
            .sum()
    }
}

impl<B> Drop for Flow<B> {
    fn drop(&mut self) {
        if let Some(g) = &self.gauge {
            g.give_back(std::mem::take(&mut self.held) + std::mem::take(&mut self.ahead));
        }
    }
}

impl<B> Flow<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    /// Polls the client's body once, held to the deadlines: `Pending`
    /// arms the timer that looks again.
    fn poll_rest(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let Some(rest) = self.rest.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(rest).poll_frame(cx);
        let Some(p) = self.paced.as_mut() else {
            return match polled {
                Poll::Ready(f) => {
                    if !matches!(f, Some(Ok(_))) {
                        self.rest = None;
                    }
                    Poll::Ready(f.map(|r| r.map_err(Into::into)))
                }
                Poll::Pending => Poll::Pending,
            };
        };
        let now = p.clock.now();
        match polled {
            Poll::Ready(Some(Ok(frame))) => {
                if p.pace.total_passed(now) {
                    return self.breach(Breach::Total);
                }
                if let Some(d) = frame.data_ref() {
                    p.pace.on_data(now, d.len() as u64);
                    if let Some(pr) = &self.progress {
                        pr.data(d.len());
                    }
                }
                if self.rest.as_ref().is_some_and(|r| r.is_end_stream()) {
                    self.ended();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(other) => {
                self.ended();
                Poll::Ready(other.map(|r| r.map_err(Into::into)))
            }
            Poll::Pending => {
                if let Err(b) = p.pace.check(now) {
                    return self.breach(b);
                }
                if let Some(pr) = &self.progress {
                    pr.waiting.store(true, Ordering::Release);
                }
                let wait = p.pace.next_look(now);
                let at = tokio::time::Instant::now() + wait;
                let sleep = p
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
                sleep.as_mut().reset(at);
                if sleep.as_mut().poll(cx).is_ready() {
                    // woken at once: look again on the next poll
                    cx.waker().wake_by_ref();
                }
                Poll::Pending
            }
        }
    }

    fn breach(&mut self, b: Breach) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        crate::metrics::request_body_deadline(b);
        self.ended();
        Poll::Ready(Some(Err(Box::new(BodyDeadline(b)))))
    }

    /// Nothing more comes from the client: its place and read-ahead go
    /// back.
    fn ended(&mut self) {
        self.rest = None;
        self.paced = None;
        self.place = None;
        if let Some(g) = &self.gauge {
            g.give_back(std::mem::take(&mut self.ahead));
        }
        if let Some(pr) = &self.progress {
            pr.done.store(true, Ordering::Release);
        }
    }
}

// what `RequestBody`'s `Body` asks of a body that flows
impl<B> Flow<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    /// The frames the intake took first, then the client's.
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self;
        if let Some(f) = this.front.pop_front() {
            let n = f.data_ref().map_or(0, |d| d.len()).min(this.held);
            this.held -= n;
            if let Some(g) = &this.gauge {
                g.give_back(n);
            }
            return Poll::Ready(Some(Ok(f)));
        }
        this.poll_rest(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.front.is_empty() && self.rest.as_ref().is_none_or(|r| r.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        let front = self.front_len();
        match &self.rest {
            None if self.announced => SizeHint::with_exact(front),
            None => {
                let mut h = SizeHint::new();
                h.set_lower(front);
                h
            }
            Some(r) => {
                let h = r.size_hint();
                let mut out = SizeHint::new();
                out.set_lower(h.lower().saturating_add(front));
                if let Some(u) = h.upper() {
                    out.set_upper(u.saturating_add(front));
                }
                out
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The intake
// ---------------------------------------------------------------------------

/// Why an intake refused a request, answered before anything is charged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No receiving place, or no room in the memory bound: `503`.
    Overloaded,
    /// A deadline passed, or the body stalled past `body_idle_ms`: `408`.
    Timeout,
    /// The body could not be read: `400`.
    Broken,
}

/// Takes request bodies in (see the module documentation); clones share
/// the gauge and the places.
#[derive(Clone)]
pub(crate) struct Intake {
    pub(crate) buffered: Arc<Buffered>,
    pub(crate) receiving: Arc<Receiving>,
    limits: GatewayLimits,
    timeouts: Timeouts,
    /// How paths are read before anything else looks at them.
    paths: PathSettings,
    clock: Arc<dyn Clock>,
}

impl Intake {
    pub(crate) fn new(
        limits: GatewayLimits,
        timeouts: Timeouts,
        paths: PathSettings,
        clock: Arc<dyn Clock>,
    ) -> Intake {
        Intake {
            buffered: Buffered::new(limits.max_buffered_bytes),
            receiving: Receiving::new(limits.max_receiving, limits.max_receiving_per_ip),
            limits,
            timeouts,
            paths,
            clock,
        }
    }

    /// Takes `req`'s body in from client `peer`: the request to hand on,
    /// or why it is refused.
    #[cfg(test)]
    pub(crate) async fn take<B>(
        &self,
        req: Request<B>,
        peer: IpAddr,
    ) -> Result<Request<RequestBody<B>>, Refusal>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: Into<BoxError>,
    {
        match self.begin(req, peer)? {
            Begun::Taken(req) => Ok(req),
            Begun::Waiting(waiting) => self.wait(waiting).await,
        }
    }

    /// What of `req`'s body can be taken in from client `peer` without
    /// waiting: the request to hand on when that was enough (no body, or
    /// all the intake wants of it already in memory), else the request
    /// holding its receiving place for [`wait`](Self::wait), or why it is
    /// refused. Done from a reference, with no future: a request without
    /// a body to wait for costs none.
    pub(crate) fn begin<B>(&self, req: Request<B>, peer: IpAddr) -> Result<Begun<B>, Refusal>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: Into<BoxError>,
    {
        let (mut parts, body) = req.into_parts();
        if body.is_end_stream() {
            return Ok(Begun::Taken(Request::from_parts(
                parts,
                RequestBody::empty(),
            )));
        }
        let now = self.clock.now();
        let announced = body.size_hint().exact().is_some();
        let progress = BodyProgress::new(self.limits.min_body_rate);
        parts.extensions.insert(progress.clone());
        let mut rb = Flow {
            front: VecDeque::new(),
            held: 0,
            gauge: Some(self.buffered.clone()),
            rest: Some(body),
            paced: Some(Paced {
                pace: Pace::new(now, &self.timeouts, self.limits.min_body_rate),
                clock: self.clock.clone(),
                sleep: None,
            }),
            place: None,
            announced,
            ahead: 0,
            progress: Some(progress),
        };
        let want = self.limits.intake_bytes;
        // what came with the head is in memory already: taken, counted
        if take_ready(&mut rb, want)? {
            read_ahead(&mut rb)?;
            return Ok(Begun::Taken(Request::from_parts(
                parts,
                RequestBody::flowing(rb),
            )));
        }
        // the rest has to be waited for: a place, and room for it
        rb.place = Some(self.receiving.try_take(peer).ok_or_else(|| {
            crate::metrics::intake_refused("receiving");
            Refusal::Overloaded
        })?);
        Ok(Begun::Waiting(Box::new(Request::from_parts(
            parts,
            RequestBody::flowing(rb),
        ))))
    }

    /// Waits for the rest of the intake of a request [`begin`](Self::begin)
    /// could not finish.
    pub(crate) async fn wait<B>(
        &self,
        req: Box<Request<RequestBody<B>>>,
    ) -> Result<Request<RequestBody<B>>, Refusal>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: Into<BoxError>,
    {
        let (parts, mut body) = (*req).into_parts();
        let Some(rb) = body.0.as_deref_mut() else {
            return Ok(Request::from_parts(parts, body));
        };
        let want = self.limits.intake_bytes;
        let idle = self.timeouts.body_idle;
        while rb.rest.is_some() && rb.held < want {
            let frame = std::future::poll_fn(|cx| take_frame(rb, cx, Some(want)));
            match tokio::time::timeout(idle, frame).await {
                Ok(r) => r?,
                Err(_) => {
                    crate::metrics::intake_refused("idle");
                    return Err(Refusal::Timeout);
                }
            }
        }
        read_ahead(rb)?;
        Ok(Request::from_parts(parts, body))
    }
}

/// How far [`Intake::begin`] got with a request's body.
// the common variant is the large one, handed on at once; the rare one is
// boxed because it moves into a future
#[allow(clippy::large_enum_variant)]
pub(crate) enum Begun<B> {
    /// Taken in: the request goes on.
    Taken(Request<RequestBody<B>>),
    /// Its receiving place held, the rest to wait for ([`Intake::wait`]);
    /// boxed, as it goes into the future that waits.
    Waiting(Box<Request<RequestBody<B>>>),
}

/// A body that streams on past its intake holds its [`READ_AHEAD`] in the
/// gauge until it has all arrived (less when fewer bytes are left to come:
/// the frame and its copy hold at most twice those); without room for it,
/// it is refused.
fn read_ahead<B: Body>(rb: &mut Flow<B>) -> Result<(), Refusal> {
    let Some(rest) = &rb.rest else {
        return Ok(());
    };
    let want = match rest.size_hint().upper() {
        Some(left) => usize::try_from(left.saturating_mul(2).saturating_add(64))
            .map_or(READ_AHEAD, |n| n.min(READ_AHEAD)),
        None => READ_AHEAD,
    };
    let gauge = rb.gauge.as_ref().expect("an intake has a gauge");
    if !gauge.try_reserve(want) {
        crate::metrics::intake_refused("memory");
        return Err(Refusal::Overloaded);
    }
    rb.ahead = want;
    Ok(())
}

/// Takes what of the client's body is there without waiting, up to
/// `want` bytes: whether that was enough (or all of it).
fn take_ready<B>(rb: &mut Flow<B>, want: usize) -> Result<bool, Refusal>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if rb.rest.is_none() || rb.held >= want {
            return Ok(true);
        }
        match take_frame(rb, &mut cx, None) {
            Poll::Ready(r) => r?,
            Poll::Pending => return Ok(false),
        }
    }
}

/// Takes one frame of the client's body into the intake's front;
/// `bounded`: the bytes must find room in the gauge (else they are there
/// already, and counted whatever the bound).
fn take_frame<B>(
    rb: &mut Flow<B>,
    cx: &mut Context<'_>,
    bounded: Option<usize>,
) -> Poll<Result<(), Refusal>>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    match rb.poll_rest(cx) {
        Poll::Ready(Some(Ok(frame))) => {
            let n = frame.data_ref().map_or(0, |d| d.len());
            let gauge = rb.gauge.clone().expect("an intake has a gauge");
            match bounded {
                None => gauge.add(n),
                Some(_) if gauge.try_reserve(n) => {}
                Some(_) => {
                    crate::metrics::intake_refused("memory");
                    return Poll::Ready(Err(Refusal::Overloaded));
                }
            }
            rb.held += n;
            rb.front.push_back(frame);
            Poll::Ready(Ok(()))
        }
        Poll::Ready(None) => Poll::Ready(Ok(())),
        Poll::Ready(Some(Err(e))) => Poll::Ready(Err(match e.is::<BodyDeadline>() {
            true => Refusal::Timeout,
            false => Refusal::Broken,
        })),
        Poll::Pending => Poll::Pending,
    }
}

/// The answer to a refused intake, under the problem base `base`; it
/// closes the connection (the body is left unread).
pub(crate) fn refusal_answer(r: Refusal, base: &str, retry_after_s: u64) -> Response<Bytes> {
    let mut res = match r {
        Refusal::Overloaded => crate::shed::overloaded(base, retry_after_s, true),
        Refusal::Timeout => problem::answer(&Problem::new(
            ProblemKind::RequestTimeout,
            base,
            "The request body came too slowly or took too long.",
        )),
        Refusal::Broken => problem::answer(&Problem::new(
            ProblemKind::BadRequest,
            base,
            "The request body could not be read.",
        )),
    };
    res.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    res
}

impl Intake {
    /// Reads `req`'s head once (`front.rs`), counts it in the memory
    /// gauge while it is in flight, then calls `svc` with it (whose
    /// stages take the body in once the limiter has admitted it: see
    /// `admitted.rs`); a refused head is answered here, under the problem
    /// base of the limits in force, charged to nothing.
    ///
    /// Everything up to the call is done before the returned future is
    /// first polled, from shared references: a head refused here or
    /// answered from the head further in (a shed `503`, a `429`) costs no
    /// clone of the stack and no allocation of a future.
    pub(crate) fn serve<S, B>(
        &self,
        svc: &crate::shed::LoadShed<S>,
        mut req: Request<crate::h1::ClientBody>,
        base: &crate::shed::CurrentLimits,
        retry_after_s: impl FnOnce() -> u64,
    ) -> Served<S::Future>
    where
        S: crate::shed::CallClassified<crate::h1::ClientBody, Response = Response<B>> + Clone,
        B: crate::shed::OwnAnswer,
    {
        if let Err(r) = crate::front::screen(&mut req, &self.paths) {
            let res = crate::front::answer(&r, base().problem_base());
            return Served::answer(res);
        }
        // the head stays in memory while its request is in flight (an
        // HTTP/2 connection has many): counted until the answer's head
        match HeadHeld::reserve(&self.buffered, head_size(&req)) {
            Some(held) => Served::Call {
                call: svc.call_shared(req),
                held: Some(held),
            },
            None => {
                crate::metrics::intake_refused("memory");
                let res =
                    refusal_answer(Refusal::Overloaded, base().problem_base(), retry_after_s());
                Served::answer(res)
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// The future of [`Intake::serve`]: a head refused at once, or the
    /// stack's call with the head counted until its answer's head.
    #[project = ServedProj]
    pub(crate) enum Served<F> {
        /// Refused here.
        Ready { res: Option<Response<Bytes>> },
        /// On to the stack.
        Call {
            #[pin]
            call: crate::shed::ShedFuture<F>,
            held: Option<HeadHeld>,
        },
    }
}

impl<F> Served<F> {
    fn answer(res: Response<Bytes>) -> Served<F> {
        Served::Ready { res: Some(res) }
    }
}

impl<F, B, E> Future for Served<F>
where
    crate::shed::ShedFuture<F>: Future<Output = Result<Response<crate::shed::ShedBody<B>>, E>>,
{
    type Output = Result<Response<crate::shed::ShedBody<B>>, E>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            ServedProj::Ready { res } => {
                let res = res.take().expect("polled after completion");
                Poll::Ready(Ok(res.map(|data| crate::shed::ShedBody::Full {
                    data: (!data.is_empty()).then_some(data),
                })))
            }
            ServedProj::Call { call, held } => {
                let out = std::task::ready!(call.poll(cx));
                // the answer's head is here: the request's head is let go
                held.take();
                Poll::Ready(out)
            }
        }
    }
}

/// The bytes of a request head in flight, held in the gauge until dropped.
struct HeadHeld {
    gauge: Arc<Buffered>,
    n: usize,
}

impl HeadHeld {
    fn reserve(gauge: &Arc<Buffered>, n: usize) -> Option<HeadHeld> {
        gauge.try_reserve(n).then(|| HeadHeld {
            gauge: gauge.clone(),
            n,
        })
    }
}

impl Drop for HeadHeld {
    fn drop(&mut self) {
        self.gauge.give_back(self.n);
    }
}

/// About the bytes `req`'s head takes: its target, and each field's name
/// and value with the 32 bytes of overhead HTTP/2 counts for one.
fn head_size<B>(req: &Request<B>) -> usize {
    let target = req.uri().path_and_query().map_or(1, |p| p.as_str().len())
        + req.uri().authority().map_or(0, |a| a.as_str().len());
    req.headers().iter().fold(target + 64, |n, (name, value)| {
        n + name.as_str().len() + value.len() + 32
    })
}

/// Whether a request body error is a broken deadline.
pub(crate) fn is_deadline(e: &BoxError) -> bool {
    e.is::<BodyDeadline>()
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[tokio::test]
    async fn a_body_with_nothing_to_come_is_one_pointer_and_ends_at_once() {
        // every stage after the intake moves the request by value
        assert_eq!(
            std::mem::size_of::<RequestBody>(),
            std::mem::size_of::<usize>()
        );
        let mut body = RequestBody::<crate::h1::ClientBody>::empty();
        assert!(body.is_end_stream());
        assert_eq!(body.size_hint().exact(), Some(0));
        let frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
        assert!(frame.is_none());
        assert_eq!(body.held(), 0);
    }

    fn timeouts(total_s: u64, window_s: u64, grace_s: u64) -> Timeouts {
        Timeouts {
            request_body: Duration::from_secs(total_s),
            body_rate_window: Duration::from_secs(window_s),
            body_rate_grace: Duration::from_secs(grace_s),
            ..Timeouts::default()
        }
    }

    #[test]
    fn a_body_at_the_rate_passes_and_one_below_it_fails_after_the_grace() {
        let t = timeouts(300, 10, 10);
        let start = Nanos::new(1_000 * S);
        // 100 bytes a second against a least rate of 100: fine throughout
        let mut ok = Pace::new(start, &t, 100);
        for s in 1..=60 {
            let now = start.saturating_add(Nanos::new(s * S));
            ok.on_data(now, 100);
            assert_eq!(ok.check(now), Ok(()), "at {s} s");
        }
        // 1 byte a second: not judged within the grace, refused after it
        let mut slow = Pace::new(start, &t, 100);
        for s in 1..=9 {
            let now = start.saturating_add(Nanos::new(s * S));
            slow.on_data(now, 1);
            assert_eq!(slow.check(now), Ok(()), "in the grace at {s} s");
        }
        let now = start.saturating_add(Nanos::new(11 * S));
        slow.on_data(now, 1);
        assert_eq!(slow.check(now), Err(Breach::Slow));
    }

    #[test]
    fn the_rate_is_the_last_windows() {
        let t = timeouts(300, 10, 0);
        let start = Nanos::new(5 * S);
        let mut p = Pace::new(start, &t, 100);
        // a fast start, then a stall: the stall is judged on its own
        p.on_data(start.saturating_add(Nanos::new(S)), 100_000);
        assert_eq!(p.check(start.saturating_add(Nanos::new(10 * S))), Ok(()));
        assert_eq!(
            p.check(start.saturating_add(Nanos::new(12 * S))),
            Err(Breach::Slow)
        );
        // no rule: never slow
        let mut off = Pace::new(start, &t, 0);
        assert_eq!(off.check(start.saturating_add(Nanos::new(200 * S))), Ok(()));
    }

    #[test]
    fn the_whole_body_is_bounded() {
        let t = timeouts(30, 10, 10);
        let start = Nanos::new(S);
        let mut p = Pace::new(start, &t, 0);
        assert_eq!(p.check(start.saturating_add(Nanos::new(29 * S))), Ok(()));
        assert!(!p.total_passed(start.saturating_add(Nanos::new(29 * S))));
        assert_eq!(
            p.check(start.saturating_add(Nanos::new(30 * S))),
            Err(Breach::Total)
        );
        // the next look never passes the deadline
        let at = start.saturating_add(Nanos::new(25 * S));
        assert!(p.next_look(at) <= Duration::from_secs(5));
    }

    proptest::proptest! {
        /// A body that keeps the least rate (each piece at least as large
        /// as the time since the last one asks for) is never judged slow,
        /// however its pieces are spaced; one that stops is, within a
        /// window and a quarter of its last piece.
        #[test]
        fn a_body_at_the_rate_is_never_slow_and_a_stopped_one_is(
            gaps in proptest::collection::vec(1u64..3_000, 1..200),
            rate in 1u64..100_000,
        ) {
            let t = timeouts(100_000, 4, 2);
            let start = Nanos::new(1_000 * S);
            let mut p = Pace::new(start, &t, rate);
            let mut now = start;
            for gap_ms in gaps {
                // waited on the client for the gap, judged along the way
                for k in 1..=4 {
                    let at = now.saturating_add(Nanos::from_millis(gap_ms * k / 4));
                    proptest::prop_assert_eq!(p.check(at), Ok(()));
                }
                now = now.saturating_add(Nanos::from_millis(gap_ms));
                // the piece pays for its gap, and for a whole window when
                // the gap was longer
                let ms = gap_ms.max(4_000);
                p.on_data(now, (rate * ms).div_ceil(1_000));
                proptest::prop_assert_eq!(p.check(now), Ok(()));
            }
            let stopped = now.saturating_add(Nanos::from_millis(5_001));
            proptest::prop_assert_eq!(p.check(stopped), Err(Breach::Slow));
        }
    }

    #[test]
    fn samples_stay_bounded() {
        let t = timeouts(300, 8, 0);
        let start = Nanos::new(S);
        let mut p = Pace::new(start, &t, 1);
        for i in 0..100_000u64 {
            p.on_data(start.saturating_add(Nanos::new(i * 1_000_000)), 1);
        }
        assert!(
            p.samples.len() <= SAMPLES_PER_WINDOW as usize + 2,
            "{}",
            p.samples.len()
        );
    }

    #[test]
    fn the_gauge_never_passes_its_bound() {
        let g = Buffered::new(100);
        assert_eq!(g.reserve_up_to(60), 60);
        assert_eq!(g.reserve_up_to(60), 40);
        assert_eq!(g.reserve_up_to(1), 0);
        assert!(!g.try_reserve(1));
        g.give_back(50);
        assert!(g.try_reserve(50));
        assert!(!g.try_reserve(1));
        assert_eq!(g.held(), 100);
    }

    #[test]
    fn receiving_places_are_bounded_overall_and_per_address() {
        let r = Receiving::new(3, 2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let a1 = r.try_take(a).unwrap();
        let _a2 = r.try_take(a).unwrap();
        assert!(r.try_take(a).is_none(), "per address");
        let _b1 = r.try_take(b).unwrap();
        assert!(r.try_take(b).is_none(), "overall");
        drop(a1);
        let _b2 = r.try_take(b).unwrap();
        assert_eq!(r.taken(), 3);
    }

    /// A body whose frames come one per poll, each after a pending poll;
    /// `sized`: it says how much is left.
    struct Trickle {
        left: usize,
        ready: bool,
        sized: bool,
    }

    impl Body for Trickle {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            if self.left == 0 {
                return Poll::Ready(None);
            }
            let was = self.ready;
            self.ready = !was;
            if !was {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            self.left -= 1;
            Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"0123456789")))))
        }
        fn is_end_stream(&self) -> bool {
            self.left == 0
        }
        fn size_hint(&self) -> SizeHint {
            match self.sized {
                true => SizeHint::with_exact(self.left as u64 * 10),
                false => SizeHint::default(),
            }
        }
    }

    #[tokio::test]
    async fn an_intake_holds_its_bytes_in_the_gauge_until_they_are_passed_on() {
        let clock: Arc<dyn Clock> = Arc::new(paceline_core::ManualClock::at_unix_secs(1_000));
        let limits = GatewayLimits {
            intake_bytes: 35,
            ..GatewayLimits::default()
        };
        let intake = Intake::new(limits, Timeouts::default(), PathSettings::default(), clock);
        let req = Request::post("/")
            .body(Trickle {
                left: 10,
                ready: false,
                sized: false,
            })
            .unwrap();
        let peer: IpAddr = "127.0.0.1".parse().unwrap();
        let req = intake.take(req, peer).await.unwrap();
        let mut body = req.into_body();
        assert_eq!(body.held(), 40);
        // the rest still to come holds its read-ahead too
        assert_eq!(intake.buffered.held(), 40 + READ_AHEAD);
        assert_eq!(intake.receiving.taken(), 1);
        use http_body_util::BodyExt;
        let all = (&mut body).collect().await.unwrap().to_bytes();
        assert_eq!(all.len(), 100);
        assert_eq!(intake.buffered.held(), 0);
        assert_eq!(intake.receiving.taken(), 0, "given back at the end");
    }

    #[tokio::test]
    async fn a_body_with_little_left_holds_a_read_ahead_to_match() {
        let clock: Arc<dyn Clock> = Arc::new(paceline_core::ManualClock::at_unix_secs(1_000));
        let limits = GatewayLimits {
            intake_bytes: 35,
            ..GatewayLimits::default()
        };
        let intake = Intake::new(limits, Timeouts::default(), PathSettings::default(), clock);
        let req = Request::post("/")
            .body(Trickle {
                left: 10,
                ready: false,
                sized: true,
            })
            .unwrap();
        let peer: IpAddr = "127.0.0.1".parse().unwrap();
        let body = intake.take(req, peer).await.unwrap().into_body();
        // 40 bytes in, 60 to come: twice those and a little, not 128 KiB
        assert_eq!(intake.buffered.held(), 40 + 2 * 60 + 64);
        drop(body);
        assert_eq!(intake.buffered.held(), 0);
    }

    #[tokio::test]
    async fn a_full_gauge_refuses_an_intake() {
        let clock: Arc<dyn Clock> = Arc::new(paceline_core::ManualClock::at_unix_secs(1_000));
        let intake = Intake::new(
            GatewayLimits::default(),
            Timeouts::default(),
            PathSettings::default(),
            clock,
        );
        let all = intake.buffered.reserve_up_to(usize::MAX);
        let req = Request::post("/")
            .body(Trickle {
                left: 10,
                ready: false,
                sized: false,
            })
            .unwrap();
        let peer: IpAddr = "127.0.0.1".parse().unwrap();
        let r = intake.take(req, peer).await.map(|_| ());
        assert_eq!(r, Err(Refusal::Overloaded));
        intake.buffered.give_back(all);
        assert_eq!(intake.buffered.held(), 0);
        assert_eq!(intake.receiving.taken(), 0);
    }
}
