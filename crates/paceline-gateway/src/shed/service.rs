//! The tower side of the shedder: a layer, its service and its body.
//!
//! The layer classifies each request once (the route's criticality is
//! what it sheds by) and hands the classification to the service it
//! guards (see [`CallClassified`]): the limit layer then does not match the
//! routes again. It times the call it guards to the head of the answer,
//! the latency the shedder's latency rule reads.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{HeaderValue, CONNECTION};
use http::{HeaderMap, Request, Response, Version};
use http_body::{Body, Frame, SizeHint};
use paceline_core::Nanos;
use paceline_core::{Clock, Store};
use paceline_server::{Criticality, RateLimit, RateLimitBody, RouteInfo};
use paceline_wire::problem::{self, Problem, ProblemKind};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use super::{ShedGuard, ShedTicket, Shedder};

/// Gives the limits in force when a request arrives: their routes say how
/// critical it is, their problem base prefixes the `type` of a shed answer.
pub type CurrentLimits = Arc<dyn Fn() -> paceline_server::Limits + Send + Sync>;

/// The service a [`LoadShed`] guards, handed the classification the shed
/// layer made of a request.
///
/// By default (an empty `impl` is enough) the classification goes into
/// the request's extensions, where a limit layer further in (or a
/// handler) finds it; the limit layer itself takes it directly
/// ([`RateLimit::call_classified`]), sparing the allocation an extension
/// takes.
pub trait CallClassified<ReqB>: Service<Request<ReqB>> {
    /// Calls with `req`, classified as `route`.
    fn call_classified(&mut self, mut req: Request<ReqB>, route: RouteInfo) -> Self::Future {
        req.extensions_mut().insert(route);
        self.call(req)
    }

    /// The rate-limit fields of the request's caller as they stand, for a
    /// shed answer (none by default).
    fn standing(&self, _req: &Request<ReqB>, _route: &RouteInfo) -> Option<http::HeaderMap> {
        None
    }

    /// Calls a clone of this service with `req` (classified when `route`
    /// is given), from a shared reference. The limit layer overrides it
    /// to answer a rejected request without the clone.
    fn call_shared(&self, req: Request<ReqB>, route: Option<RouteInfo>) -> Self::Future
    where
        Self: Clone,
    {
        let mut this = self.clone();
        match route {
            Some(route) => this.call_classified(req, route),
            None => this.call(req),
        }
    }
}

impl<I, S, C, ReqB, ResB> CallClassified<ReqB> for RateLimit<I, S, C>
where
    I: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    I::Future: Send + 'static,
    I::Error: Send + 'static,
    ReqB: Send + 'static,
    ResB: Send + 'static,
    S: Store,
    C: Clock,
{
    fn call_classified(&mut self, req: Request<ReqB>, route: RouteInfo) -> Self::Future {
        RateLimit::call_classified(self, req, route)
    }

    fn standing(&self, req: &Request<ReqB>, route: &RouteInfo) -> Option<http::HeaderMap> {
        RateLimit::standing(self, req, Some(route.clone()))
    }

    fn call_shared(&self, req: Request<ReqB>, route: Option<RouteInfo>) -> Self::Future {
        RateLimit::call_shared(self, req, route)
    }
}

/// A response body that tells an answer a layer under the shed layer
/// wrote by itself (a rate limiter's `429`, the usage document) from one
/// it passed on: the latency of the first is not the upstream's, and the
/// shed layer does not feed it to the latency rule.
pub trait OwnAnswer {
    /// Whether a layer wrote this body itself.
    fn is_own_answer(&self) -> bool;
}

impl<B> OwnAnswer for RateLimitBody<B> {
    fn is_own_answer(&self) -> bool {
        matches!(self, RateLimitBody::Full { .. })
    }
}

/// Wraps a service in [`LoadShed`].
#[derive(Clone)]
pub struct LoadShedLayer {
    inner: Arc<LayerInner>,
}

struct LayerInner {
    shedder: Shedder,
    limits: CurrentLimits,
    /// The unit of in-flight capacity is taken by a later stage
    /// ([`ShedTicket::redeem`]), not at the call.
    deferred: bool,
}

impl fmt::Debug for LoadShedLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadShedLayer")
            .field("shedder", &self.inner.shedder)
            .finish_non_exhaustive()
    }
}

impl LoadShedLayer {
    /// A layer shedding with `shedder`; `limits` gives the limits in
    /// force, read for each request (so a reload reaches it at once).
    pub fn new(shedder: Shedder, limits: CurrentLimits) -> Self {
        LoadShedLayer {
            inner: Arc::new(LayerInner {
                shedder,
                limits,
                deferred: false,
            }),
        }
    }

    /// A layer that decides from the head alone whether there is room
    /// (and sheds at once when there is not), but leaves taking the unit
    /// of in-flight capacity to a later stage, which
    /// [redeems](ShedTicket::redeem) a ticket and leaves it in its
    /// answer's extensions, where this layer finds it and holds the unit
    /// until the answer's body ends: the gateway does so once a request's
    /// body can flow, so requests still receiving their bodies (and those
    /// the limiter refuses) hold no unit, and a refused request costs no
    /// ticket at all. A request that never redeems one holds none; one
    /// that finds no room is the later stage's to shed.
    pub fn deferred(shedder: Shedder, limits: CurrentLimits) -> Self {
        LoadShedLayer {
            inner: Arc::new(LayerInner {
                shedder,
                limits,
                deferred: true,
            }),
        }
    }
}

impl<S> Layer<S> for LoadShedLayer {
    type Service = LoadShed<S>;
    fn layer(&self, inner: S) -> LoadShed<S> {
        LoadShed {
            inner,
            layer: self.clone(),
        }
    }
}

/// Answers `503 overloaded` instead of calling its inner service when the
/// [`Shedder`] says so; otherwise holds a unit of capacity until the
/// response body ends, and records how long the inner service took to the
/// head of an answer from the upstream (see [`OwnAnswer`]).
///
/// With shedding on, it classifies the request by the routes of the
/// limits in force and hands the [`RouteInfo`] to its inner service (see
/// [`CallClassified`]), so the limit layer after it does not match again.
#[derive(Clone)]
pub struct LoadShed<S> {
    inner: S,
    layer: LoadShedLayer,
}

impl<S: fmt::Debug> fmt::Debug for LoadShed<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadShed")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for LoadShed<S>
where
    S: CallClassified<ReqB, Response = Response<ResB>>,
    ResB: OwnAnswer,
{
    type Response = Response<ShedBody<ResB>>;
    type Error = S::Error;
    type Future = ShedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        match self.step(&req) {
            Err(shed) => shed,
            Ok((route, passed)) => {
                let started = passed.start();
                let call = match route {
                    Some(route) => self.inner.call_classified(req, route),
                    None => self.inner.call(req),
                };
                started.future(call)
            }
        }
    }
}

impl<S> LoadShed<S> {
    /// Like `call`, from a shared reference: a shed request and one the
    /// stage inside answers from its head touch nothing else (see
    /// [`CallClassified::call_shared`]).
    pub fn call_shared<ReqB, ResB>(&self, req: Request<ReqB>) -> ShedFuture<S::Future>
    where
        S: CallClassified<ReqB, Response = Response<ResB>> + Clone,
        ResB: OwnAnswer,
    {
        match self.step(&req) {
            Err(shed) => shed,
            Ok((route, passed)) => {
                let started = passed.start();
                started.future(self.inner.call_shared(req, route))
            }
        }
    }

    /// The shed layer's decision, from the head: the answer if shed, else
    /// the request's classification (when shedding is on) and how it
    /// passed. (The request is not moved in and out: it is a few hundred
    /// bytes, copied at each move.) The shed answer comes back by value,
    /// as the ready future it is returned in: boxing it would allocate on
    /// every shed request.
    #[allow(clippy::type_complexity, clippy::result_large_err)]
    fn step<ReqB, ResB>(
        &self,
        req: &Request<ReqB>,
    ) -> Result<(Option<RouteInfo>, Passed), ShedFuture<S::Future>>
    where
        S: CallClassified<ReqB, Response = Response<ResB>>,
        ResB: OwnAnswer,
    {
        let layer = &*self.layer.inner;
        let settings = layer.shedder.settings();
        // shedding off: no need to look, and nothing for the limit layer
        let classified = match settings.max_in_flight | settings.max_rps {
            0 => None,
            _ => {
                let limits = (layer.limits)();
                let info = limits.classify(req);
                Some((limits, info))
            }
        };
        let c = classified
            .as_ref()
            .map_or(Criticality::Critical, |(_, info)| info.criticality);
        // over the requests-per-second capacity: dropped before it holds
        // a unit of the in-flight one (see `rate.rs`)
        let passed = layer.shedder.admit_rate(&settings, req);
        let admitted = match (passed, layer.deferred && settings.max_in_flight > 0) {
            (false, _) => None,
            // room now, from the head; the unit is taken later
            (true, true) => layer
                .shedder
                .would_admit(&settings, c)
                .then_some(Passed::Deferred),
            (true, false) => layer.shedder.admit(&settings, c).map(Passed::Guard),
        };
        let Some(admitted) = admitted else {
            let reason = if passed { "in_flight" } else { "rate" };
            metrics::counter!(crate::metrics::SHED, "criticality" => c.as_str(), "reason" => reason)
                .increment(1);
            let close = req.version() <= Version::HTTP_11 && has_body(req.headers());
            // a known caller is told its counters on a 503 too (a read
            // that charges nothing)
            let standing = classified
                .as_ref()
                .and_then(|(_, info)| self.inner.standing(req, info));
            let limits = match classified {
                Some((limits, _)) => limits,
                None => (layer.limits)(),
            };
            let mut res = overloaded(limits.problem_base(), settings.retry_after_s, close);
            if let Some(fields) = standing {
                for (name, value) in &fields {
                    if !res.headers().contains_key(name) {
                        res.headers_mut().insert(name.clone(), value.clone());
                    }
                }
            }
            return Err(ShedFuture::Shed { res: Some(res) });
        };
        Ok((classified.map(|(_, route)| route), admitted))
    }
}

/// What a request passed with, and when its unit was taken: read before
/// the inner service is called, which may already do work.
struct Started(Option<ShedGuard>, Nanos);

impl Passed {
    fn start(self) -> Started {
        match self {
            Passed::Guard(g) => {
                let started = g.shedder.now();
                Started(Some(g), started)
            }
            Passed::Deferred => Started(None, Nanos::ZERO),
        }
    }
}

impl Started {
    /// The future of the inner call, holding what the request passed with.
    fn future<F>(self, call: F) -> ShedFuture<F> {
        let Started(guard, started) = self;
        ShedFuture::Inner {
            call,
            guard,
            started,
        }
    }
}

/// How a request passed the shed layer: holding its unit, or with room
/// for one that a later stage takes.
enum Passed {
    Guard(ShedGuard),
    Deferred,
}

pin_project! {
    /// The response future of [`LoadShed`]: the shedder's own answer, or
    /// the inner call holding its unit of capacity.
    #[project = ShedFutureProj]
    pub enum ShedFuture<F> {
        /// Shed: the `503` is ready.
        Shed {
            res: Option<Response<Bytes>>,
        },
        /// Admitted: the inner service's call.
        Inner {
            #[pin]
            call: F,
            guard: Option<ShedGuard>,
            // when its unit was taken, by the shedder's clock
            started: Nanos,
        },
    }
}

impl<F, B, E> Future for ShedFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: OwnAnswer,
{
    type Output = Result<Response<ShedBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            ShedFutureProj::Shed { res } => {
                let res = res.take().expect("polled after completion");
                Poll::Ready(Ok(res.map(ShedBody::full)))
            }
            ShedFutureProj::Inner {
                call,
                guard,
                started,
            } => {
                let mut res = std::task::ready!(call.poll(cx))?;
                // a deferred layer's unit, taken by a later stage
                let ticket = match guard {
                    Some(_) => None,
                    None => res.extensions_mut().remove::<ShedTicket>(),
                };
                let (guard, started) = match (guard.take(), ticket) {
                    (Some(g), _) => (Some(g), *started),
                    (None, Some(t)) => t.take().map_or((None, *started), |(g, at)| (Some(g), at)),
                    (None, None) => (None, *started),
                };
                if let Some(g) = &guard {
                    if is_upstream_answer(&res) {
                        // a clock set back gives zero, never an underflow
                        let waited = g.shedder.now().saturating_sub(started);
                        g.shedder.record_latency(waited.as_duration());
                    }
                }
                Poll::Ready(Ok(res.map(|body| ShedBody::Inner { body, guard })))
            }
        }
    }
}

/// Whether `res` is the upstream's answer: neither one a layer under the
/// shed layer wrote itself nor one the proxy wrote for a failed exchange.
fn is_upstream_answer<B: OwnAnswer>(res: &Response<B>) -> bool {
    !res.body().is_own_answer() && !crate::proxy::is_gateway_answer(res)
}

fn has_body(h: &HeaderMap) -> bool {
    h.contains_key(http::header::TRANSFER_ENCODING)
        || h.get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim() != "0")
}

/// The `503 overloaded` answer: problem+json, `Retry-After`, no-store.
pub fn overloaded(base: &str, retry_after_s: u64, close: bool) -> Response<Bytes> {
    let mut p = Problem::new(
        ProblemKind::Overloaded,
        base,
        "The service is overloaded and shed this request; it was not charged to any quota. Retry with jitter.",
    );
    p.retry_after_s = Some(retry_after_s.max(1));
    let mut r = problem::answer(&p);
    if close {
        r.headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    r
}

pin_project! {
    /// The inner body (holding its unit of capacity until it ends), or the
    /// shedder's own answer.
    #[project = ShedProj]
    #[allow(missing_docs)]
    pub enum ShedBody<B> {
        /// The inner service's body.
        Inner {
            #[pin]
            body: B,
            guard: Option<ShedGuard>,
        },
        /// The shedder's answer.
        Full {
            data: Option<Bytes>,
        },
    }
}

impl<B> ShedBody<B> {
    fn full(data: Bytes) -> Self {
        ShedBody::Full {
            data: (!data.is_empty()).then_some(data),
        }
    }
}

impl<B: Body<Data = Bytes>> Body for ShedBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project() {
            ShedProj::Inner { body, guard } => {
                let polled = body.poll_frame(cx);
                if let Poll::Ready(None | Some(Err(_))) = &polled {
                    guard.take();
                }
                polled
            }
            ShedProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        match self {
            ShedBody::Inner { body, .. } => body.is_end_stream(),
            ShedBody::Full { data } => data.is_none(),
        }
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        match self {
            ShedBody::Inner { body, .. } => body.size_hint(),
            ShedBody::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::time::Duration;

    use http_body_util::Empty;
    use paceline_core::{Clock, ManualClock, MemoryStore, Plan, Policy};
    use paceline_server::{Limits, RateLimiter, Route, RouteInfo};
    use paceline_wire::problem::ProblemKind;
    use tower::{Service, ServiceExt};

    use super::*;
    use crate::config::SheddingSettings;

    fn limits(rates_cost: u64) -> Limits {
        let plan = Plan::new("free", vec![Policy::token_bucket("burst", 20, 2).unwrap()]).unwrap();
        Limits::builder()
            .plan(plan)
            .key("sk_1", "free")
            .route(
                Route::new("GET", "/v1/rates")
                    .unwrap()
                    .with_cost(rates_cost)
                    .with_criticality(Criticality::Sheddable),
            )
            .build()
            .unwrap()
    }

    fn rates() -> Request<()> {
        Request::get("/v1/rates")
            .header("authorization", "Bearer sk_1")
            .body(())
            .unwrap()
    }

    fn slow_rule(clock: &ManualClock) -> Shedder {
        let settings = SheddingSettings {
            max_in_flight: 10,
            max_latency: Some(Duration::from_millis(50)),
            ..Default::default()
        };
        Shedder::with_clock(settings, Arc::new(clock.clone()))
    }

    /// The services the tests put under the shed layer take their
    /// classification in the extensions.
    impl<F, ReqB> CallClassified<ReqB> for tower::util::ServiceFn<F> where
        tower::util::ServiceFn<F>: Service<Request<ReqB>>
    {
    }

    type Answered<B> = std::future::Ready<Result<Response<B>, Infallible>>;

    /// An inner service whose answers take `took` by `clock`, written by
    /// `answer`.
    fn taking<B>(
        clock: &ManualClock,
        took: Duration,
        answer: fn() -> Response<B>,
    ) -> tower::util::ServiceFn<impl FnMut(Request<()>) -> Answered<B> + Clone> {
        let clock = clock.clone();
        tower::service_fn(move |_req: Request<()>| {
            clock.advance(took.into());
            std::future::ready(Ok(answer()))
        })
    }

    fn passed_on() -> Response<RateLimitBody<Empty<Bytes>>> {
        Response::new(RateLimitBody::Inner {
            body: Empty::new(),
            guard: None,
            meter: None,
        })
    }

    fn own_429() -> Response<RateLimitBody<Empty<Bytes>>> {
        let mut res = Response::new(RateLimitBody::Full {
            data: Some(Bytes::from_static(b"{}")),
        });
        *res.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
        res
    }

    fn proxy_502() -> Response<RateLimitBody<crate::proxy::ProxyBody>> {
        let res = crate::proxy::gateway_error("https://x.invalid/", ProblemKind::BadGateway, "no");
        res.map(|body| RateLimitBody::Inner {
            body,
            guard: None,
            meter: None,
        })
    }

    fn layer(shedder: &Shedder, limits: CurrentLimits) -> LoadShedLayer {
        LoadShedLayer::new(shedder.clone(), limits)
    }

    #[tokio::test]
    async fn a_deferred_layer_holds_the_ticket_left_in_the_answer_until_the_body_ends() {
        let clock = ManualClock::at_unix_secs(1_790_000_000);
        let shedder = slow_rule(&clock);
        let l = limits(1);
        let current: CurrentLimits = Arc::new(move || l.clone());
        // the stage below takes the unit (as the gateway's does once the
        // body can flow) and leaves its ticket in the answer
        let taker = shedder.clone();
        let below = tower::service_fn(move |_req: Request<()>| {
            let ticket = ShedTicket::redeem(&taker, Criticality::Sheddable).unwrap();
            let mut res = passed_on();
            res.extensions_mut().insert(ticket);
            std::future::ready(Ok::<_, Infallible>(res))
        });
        let mut svc = LoadShedLayer::deferred(shedder.clone(), current).layer(below);
        assert_eq!(shedder.in_flight(), 0);
        let res = svc.ready().await.unwrap().call(rates()).await.unwrap();
        // the answer's head is out: its body still holds the unit
        assert_eq!(shedder.in_flight(), 1);
        assert!(
            res.extensions().get::<ShedTicket>().is_none(),
            "taken by the layer"
        );
        drop(res);
        assert_eq!(shedder.in_flight(), 0);
    }

    #[tokio::test]
    async fn the_shed_layers_own_timing_feeds_the_latency_rule() {
        let clock = ManualClock::at_unix_secs(1_790_000_000);
        let shedder = slow_rule(&clock);
        let l = limits(1);
        let current: CurrentLimits = Arc::new(move || l.clone());
        let upstream = taking(&clock, Duration::from_millis(200), passed_on);
        let mut svc = layer(&shedder, current.clone()).layer(upstream);
        assert_eq!(shedder.latency(), None);
        let res = svc.ready().await.unwrap().call(rates()).await.unwrap();
        drop(res);
        // timed from the call to the answer's head, by the shedder's clock
        assert_eq!(shedder.latency(), Some(Duration::from_millis(200)));
        // the rule reads it: sheddable work is down to one probe
        let probe = shedder.try_admit(Criticality::Sheddable).unwrap();
        assert!(shedder.try_admit(Criticality::Sheddable).is_none());
        drop(probe);

        // answers written below the shed layer are not the upstream's: a
        // limiter's own 429 and the proxy's 502 leave the latency alone
        let mut limited =
            layer(&shedder, current.clone()).layer(taking(&clock, Duration::ZERO, own_429));
        let res = limited.ready().await.unwrap().call(rates()).await.unwrap();
        assert_eq!(res.status(), 429);
        drop(res); // its unit of capacity back
        let mut failed = layer(&shedder, current.clone()).layer(taking(
            &clock,
            Duration::from_secs(30),
            proxy_502,
        ));
        let res = failed.ready().await.unwrap().call(rates()).await.unwrap();
        assert_eq!(res.status(), 502);
        drop(res);
        assert_eq!(shedder.latency(), Some(Duration::from_millis(200)));

        // fast upstream answers bring it back under the bound
        let mut fast =
            layer(&shedder, current).layer(taking(&clock, Duration::from_millis(5), passed_on));
        for _ in 0..20 {
            let res = fast.ready().await.unwrap().call(rates()).await.unwrap();
            assert_eq!(res.status(), 200, "not shed");
        }
        assert!(shedder.latency().unwrap() < Duration::from_millis(50));
    }

    #[tokio::test]
    async fn a_clock_set_back_times_zero() {
        let clock = ManualClock::at_unix_secs(1_790_000_000);
        let shedder = slow_rule(&clock);
        let l = limits(1);
        let back = clock.clone();
        let upstream = tower::service_fn(move |_req: Request<()>| {
            back.set(
                back.now()
                    .saturating_sub(paceline_core::Nanos::from_secs(60)),
            );
            std::future::ready(Ok::<_, Infallible>(passed_on()))
        });
        let mut svc = layer(&shedder, Arc::new(move || l.clone())).layer(upstream);
        svc.ready().await.unwrap().call(rates()).await.unwrap();
        // the smallest sample the shedder keeps: one microsecond
        assert_eq!(shedder.latency(), Some(Duration::from_micros(1)));
    }

    /// The shed layer over the limit layer over a handler that keeps the
    /// classification it finds; the burst remaining and that
    /// classification.
    async fn through(
        shedder: &Shedder,
        limiter: &RateLimiter<MemoryStore, ManualClock>,
        current: CurrentLimits,
    ) -> (u64, Option<RouteInfo>) {
        let seen = Arc::new(parking_lot::Mutex::new(None));
        let kept = seen.clone();
        let handler = tower::service_fn(move |req: Request<()>| {
            *kept.lock() = req.extensions().get::<RouteInfo>().cloned();
            async { Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new())) }
        });
        let mut svc = tower::ServiceBuilder::new()
            .layer(layer(shedder, current))
            .layer(limiter.layer())
            .service(handler);
        let res = svc.ready().await.unwrap().call(rates()).await.unwrap();
        let field = res.headers()["ratelimit"].to_str().unwrap();
        let r = field.split(';').find_map(|p| p.strip_prefix("r=")).unwrap();
        let info = seen.lock().take();
        (r.parse().unwrap(), info)
    }

    #[tokio::test]
    async fn the_shed_layers_classification_reaches_the_limit_layer_and_handlers() {
        let clock = ManualClock::at_unix_secs(1_790_000_000);
        let shedder = slow_rule(&clock);
        let limiter = RateLimiter::new(limits(3), MemoryStore::new(), clock.clone());
        let l = limiter.clone();
        let (r, info) = through(&shedder, &limiter, Arc::new(move || l.limits())).await;
        assert_eq!(r, 17);
        let info = info.unwrap();
        assert_eq!((info.cost, info.criticality), (3, Criticality::Sheddable));
        assert_eq!(info, limiter.classify(&rates()));
        // shedding off: the limit layer classifies by itself, as alone
        shedder.set_settings(SheddingSettings::default());
        let l = limiter.clone();
        let (r, info) = through(&shedder, &limiter, Arc::new(move || l.limits())).await;
        assert_eq!((r, info.unwrap().cost), (14, 3));
    }

    #[tokio::test]
    async fn a_reload_between_the_shed_and_limit_layers_cannot_mix_configurations() {
        let clock = ManualClock::at_unix_secs(1_790_000_000);
        let shedder = slow_rule(&clock);
        let limiter = RateLimiter::new(limits(5), MemoryStore::new(), clock.clone());
        let l = limiter.clone();
        // the shed layer classifies by the limits in force, then a reload
        // lands before the limit layer decides
        let current: CurrentLimits = Arc::new(move || {
            let before = l.limits();
            l.reload(limits(2));
            before
        });
        let (r, info) = through(&shedder, &limiter, current).await;
        assert_eq!(r, 18, "decided wholly by the new limits: cost 2");
        assert_eq!(info.unwrap().cost, 2);
    }
}
