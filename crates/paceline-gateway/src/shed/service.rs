//! The tower side of the shedder: a layer, its service and its body.
//!
//! The layer classifies each request once (the route's criticality is
//! what it sheds by) and leaves the classification in the request's
//! extensions for the limit layer after it; it times the call it guards
//! to the head of the answer, the latency the shedder's latency rule
//! reads.

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
use paceline_server::{Criticality, RateLimitBody};
use paceline_wire::problem::{self, Problem, ProblemKind};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use super::{ShedGuard, Shedder};

/// Gives the limits in force when a request arrives: their routes say how
/// critical it is, their problem base prefixes the `type` of a shed answer.
pub type CurrentLimits = Arc<dyn Fn() -> paceline_server::Limits + Send + Sync>;

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
            inner: Arc::new(LayerInner { shedder, limits }),
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
/// limits in force and leaves the [`RouteInfo`](paceline_server::RouteInfo)
/// in its extensions, so the limit layer after it does not match again.
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
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: OwnAnswer,
{
    type Response = Response<ShedBody<ResB>>;
    type Error = S::Error;
    type Future = ShedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqB>) -> Self::Future {
        let layer = &*self.layer.inner;
        let settings = layer.shedder.settings();
        // shedding off: no need to look, and nothing for the limit layer
        let classified = match settings.max_in_flight {
            0 => None,
            _ => {
                let limits = (layer.limits)();
                let info = limits.classify(&req);
                Some((limits, info))
            }
        };
        let c = classified
            .as_ref()
            .map_or(Criticality::Critical, |(_, info)| info.criticality);
        let Some(guard) = layer.shedder.admit(&settings, c) else {
            metrics::counter!(crate::metrics::SHED, "criticality" => c.as_str()).increment(1);
            let close = req.version() <= Version::HTTP_11 && has_body(req.headers());
            let limits = match classified {
                Some((limits, _)) => limits,
                None => (layer.limits)(),
            };
            let res = overloaded(limits.problem_base(), settings.retry_after_s, close);
            return ShedFuture::Shed { res: Some(res) };
        };
        if let Some((_, info)) = classified {
            req.extensions_mut().insert(info);
        }
        let started = guard.shedder.now();
        ShedFuture::Inner {
            call: self.inner.call(req),
            guard: Some(guard),
            started,
        }
    }
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
            // when it was called, by the shedder's clock
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
                let res = std::task::ready!(call.poll(cx))?;
                let guard = guard.take();
                if let Some(g) = &guard {
                    if is_upstream_answer(&res) {
                        // a clock set back gives zero, never an underflow
                        let waited = g.shedder.now().saturating_sub(*started);
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

    fn is_end_stream(&self) -> bool {
        match self {
            ShedBody::Inner { body, .. } => body.is_end_stream(),
            ShedBody::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ShedBody::Inner { body, .. } => body.size_hint(),
            ShedBody::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
