//! [`RateLimit`], the service: it decides from the head before calling the
//! inner service, and its [`ResponseFuture`] is ready at once (and
//! allocates nothing) when the answer is made in process, and holds the
//! inner service's future inline (allocating nothing of its own) when
//! the request was admitted in process.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use paceline_core::{Clock, Store};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::{HttpFuture, RateLimitBody, ReleaseGuard};
use crate::limiter::{Admitted, Peer, Verdict};
use crate::respond::close_connection;
use crate::{RateLimiter, RouteInfo};

type Boxed<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<RateLimitBody<B>>, E>> + Send + 'static>>;

pin_project! {
    /// The future of [`RateLimit`]: a rejection decided in process is
    /// ready at once and allocates nothing; a request passed or admitted
    /// in process holds the inner service's future `F` inline (with what
    /// its answer needs from the limiter: `S` and `C` are the limiter's
    /// store and clock); only a decision the store makes remotely, or an
    /// answer that settles or gives back its charge, is boxed.
    pub struct ResponseFuture<F: HttpFuture, S, C> {
        #[pin]
        kind: Kind<F, S, C>,
    }
}

pin_project! {
    #[project = KindProj]
    #[project_replace = KindReplace]
    enum Kind<F: HttpFuture, S, C> {
        Ready { res: Option<Response<RateLimitBody<F::Body>>> },
        Call {
            #[pin]
            fut: F,
            // `None` for a request no limit applies to; boxed (a small
            // block) so that the future every request moves, a refused
            // one's too, stays small
            admit: Option<Box<(Admit<S, C>, Finisher<S, C, F::Body, F::Error>)>>,
        },
        Boxed { fut: Boxed<F::Body, F::Error> },
    }
}

/// Boxes [`Admit::finish`]: made where the store and clock are known to
/// be [`Store`] and [`Clock`], so that polling needs no bounds of its own.
type Finisher<S, C, B, E> = fn(Admit<S, C>, Response<B>) -> Boxed<B, E>;

/// What an admitted request's answer needs once it is there: the
/// decision's fields, the units held, and the limiter to settle or give
/// back its charge.
struct Admit<S, C> {
    limiter: RateLimiter<S, C>,
    admitted: Admitted,
    guard: Option<ReleaseGuard>,
}

impl<S, C> Admit<S, C> {
    /// The answer, decorated, when nothing is left to do with the store;
    /// else the answer and this back, for [`finish`](Self::finish).
    // inlined into its one caller, which takes the parts at once: nothing
    // large is returned through memory
    #[allow(clippy::result_large_err)]
    fn try_finish<B>(
        self,
        res: Response<B>,
    ) -> Result<Response<RateLimitBody<B>>, (Self, Response<B>)> {
        let failed = res.extensions().get::<super::UpstreamFailed>().is_some();
        if failed || self.admitted.reports_usage() {
            return Err((self, res));
        }
        let Admit {
            admitted, guard, ..
        } = self;
        let mut res = res;
        admitted.decorate(res.headers_mut());
        Ok(res.map(|b| RateLimitBody::guarded(b, guard, None)))
    }
}

impl<S: Store, C: Clock> Admit<S, C> {
    /// The answer, its charge given back (the upstream's answer never
    /// came) or settled from its head (or by a meter on its body), then
    /// decorated.
    async fn finish<B>(self, mut res: Response<B>) -> Response<RateLimitBody<B>> {
        let Admit {
            limiter,
            mut admitted,
            guard,
        } = self;
        let mut meter = None;
        if let Some(&failed) = res.extensions().get::<super::UpstreamFailed>() {
            // the answer never came: the charge may go back
            limiter.refund(&mut admitted, failed).await;
        } else if admitted.reports_usage() {
            // a charge the answer reports: settled from its head, or from
            // its body as it goes by
            let head = res.headers();
            meter = limiter.settle_head(&mut admitted, head).await;
        }
        admitted.decorate(res.headers_mut());
        res.map(|b| RateLimitBody::guarded(b, guard, meter))
    }

    /// [`finish`](Self::finish), boxed.
    fn boxed<B, E>(self, res: Response<B>) -> Boxed<B, E>
    where
        B: Send + 'static,
    {
        Box::pin(async move { Ok(self.finish(res).await) })
    }
}

impl<F: HttpFuture, S, C> ResponseFuture<F, S, C> {
    fn ready(res: Response<RateLimitBody<F::Body>>) -> Self {
        ResponseFuture {
            kind: Kind::Ready { res: Some(res) },
        }
    }
}

impl<F: HttpFuture, S, C> Future for ResponseFuture<F, S, C> {
    type Output = Result<Response<RateLimitBody<F::Body>>, F::Error>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut kind = self.project().kind;
        let mut fut = match kind.as_mut().project() {
            KindProj::Ready { res } => {
                return Poll::Ready(Ok(res.take().expect("polled after completion")))
            }
            KindProj::Boxed { fut } => return fut.as_mut().poll(cx),
            KindProj::Call { fut, admit } => {
                let res = std::task::ready!(fut.poll(cx))?;
                let Some(admit) = admit.take() else {
                    return Poll::Ready(Ok(res.map(RateLimitBody::inner)));
                };
                let (admit, finisher) = *admit;
                match admit.try_finish(res) {
                    Ok(res) => return Poll::Ready(Ok(res)),
                    Err((admit, res)) => finisher(admit, res),
                }
            }
        };
        // rarely: the store to hear from before the answer goes on, in a
        // box of its own so the common future carries none of its state
        let polled = fut.as_mut().poll(cx);
        kind.project_replace(Kind::Boxed { fut });
        polled
    }
}

impl<F: HttpFuture, S, C> fmt::Debug for ResponseFuture<F, S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            Kind::Ready { .. } => "ready",
            Kind::Call { .. } => "call",
            Kind::Boxed { .. } => "boxed",
        };
        f.debug_struct("ResponseFuture")
            .field("kind", &kind)
            .finish()
    }
}

/// Says from a request's method whether a stage after the limit layer
/// reads the request's [`RouteInfo`](crate::RouteInfo) (see
/// [`RateLimit::route_extension_if`]).
pub type RouteWanted = Arc<dyn Fn(&http::Method) -> bool + Send + Sync>;

/// A service that admits, rejects or answers (usage) before its inner
/// service sees the request.
pub struct RateLimit<I, S, C> {
    inner: I,
    limiter: RateLimiter<S, C>,
    peer: Option<Peer>,
    /// `None`: every request let through carries its route.
    route_wanted: Option<RouteWanted>,
}

impl<I, S, C> RateLimit<I, S, C> {
    /// Wraps `inner`.
    pub fn new(inner: I, limiter: RateLimiter<S, C>) -> Self {
        RateLimit {
            inner,
            limiter,
            peer: None,
            route_wanted: None,
        }
    }
    /// Sets the socket peer of the one connection this service serves, for
    /// requests whose extensions name none (see [`crate::PeerAddr`]): a
    /// server that builds a service per connection then need not insert
    /// the address into every request.
    pub fn with_peer(mut self, peer: std::net::SocketAddr) -> Self {
        self.peer = Some(Peer::new(peer.ip()));
        self
    }
    /// Leaves the classification out of the extensions of a request this
    /// service lets through unless `wanted` says, from the request's
    /// method, that a stage after it reads it. By default every such
    /// request carries it (see [`call_classified`](Self::call_classified)),
    /// at the cost of the allocations an extension takes; a stack whose
    /// later stages read the route of some requests only (an idempotency
    /// layer: `POST` and `PATCH`) spares the others. `wanted` is asked per
    /// request, so it may read settings that change at run time.
    pub fn route_extension_if(mut self, wanted: RouteWanted) -> Self {
        self.route_wanted = Some(wanted);
        self
    }
    /// The limiter.
    pub fn limiter(&self) -> &RateLimiter<S, C> {
        &self.limiter
    }
}

impl<I: Clone, S, C> Clone for RateLimit<I, S, C> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            limiter: self.limiter.clone(),
            peer: self.peer.clone(),
            route_wanted: self.route_wanted.clone(),
        }
    }
}

impl<I: fmt::Debug, S, C> fmt::Debug for RateLimit<I, S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<I, S, C, ReqB, ResB> Service<Request<ReqB>> for RateLimit<I, S, C>
where
    I: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    I::Future: Send + 'static,
    I::Error: Send + 'static,
    ReqB: Send + 'static,
    ResB: Send + 'static,
    S: Store,
    C: Clock,
{
    type Response = Response<RateLimitBody<ResB>>;
    type Error = I::Error;
    type Future = ResponseFuture<I::Future, S, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    /// Decides with the classification found in the request's extensions
    /// (made by the limits in force), or classifies the request itself.
    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        self.serve(req, None)
    }
}

impl<I, S: Store, C: Clock> RateLimit<I, S, C> {
    /// The rate-limit fields of `req`'s key as they stand, read without
    /// charging anything: for an answer a layer before this one writes
    /// itself (a load shedder's `503`), so that it too carries
    /// `RateLimit-Policy` and `RateLimit`. `None` for a caller that is not
    /// told its counters (anonymous, or without a known key), for the
    /// usage endpoint, and when the store cannot tell the key's standing
    /// without I/O ([`Store::peek_local`]: a store outside the process
    /// answers only keys it has heard of).
    pub fn standing<B>(
        &self,
        req: &Request<B>,
        route: Option<crate::RouteInfo>,
    ) -> Option<http::HeaderMap> {
        self.limiter.standing(req, self.peer.as_ref(), route)
    }
}

impl<I, S, C> RateLimit<I, S, C> {
    /// Calls with `req` classified as `route` by a layer before this one
    /// (with [`RateLimiter::classify`] or
    /// [`Limits::classify`](crate::Limits::classify)): the layer does not
    /// match the routes again, and a request it lets through carries
    /// `route` in its extensions, as if the layer had made it. A
    /// classification made by limits since replaced is not used: the layer
    /// classifies again by the limits in force, so one decision never mixes
    /// two configurations.
    ///
    /// The same as inserting `route` into the request's extensions and
    /// calling, without the allocation an extension takes.
    pub fn call_classified<ReqB, ResB>(
        &mut self,
        req: Request<ReqB>,
        route: crate::RouteInfo,
    ) -> ResponseFuture<I::Future, S, C>
    where
        I: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
        I::Future: Send + 'static,
        I::Error: Send + 'static,
        ReqB: Send + 'static,
        ResB: Send + 'static,
        S: Store,
        C: Clock,
    {
        self.serve(req, Some(route))
    }

    /// Like [`call_classified`](Self::call_classified) (or `call`, with no
    /// route given), from a shared reference: a request the limiter
    /// answers from its head (a `429`, a `401`) touches nothing else, and
    /// an admitted one calls a clone of the inner service. For inner
    /// services that are always ready (their `poll_ready` is `Ready` and
    /// changes nothing), such as a per-connection stack called once per
    /// request: it spares a rejected request the clone of the whole stack.
    pub fn call_shared<ReqB, ResB>(
        &self,
        req: Request<ReqB>,
        route: Option<crate::RouteInfo>,
    ) -> ResponseFuture<I::Future, S, C>
    where
        I: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
        I::Future: Send + 'static,
        I::Error: Send + 'static,
        ReqB: Send + 'static,
        ResB: Send + 'static,
        S: Store,
        C: Clock,
    {
        let on = Stage {
            limiter: &self.limiter,
            peer: self.peer.as_ref(),
            route_wanted: self.route_wanted.as_ref(),
        };
        serve(on, req, route, || self.inner.clone())
    }

    fn serve<ReqB, ResB>(
        &mut self,
        req: Request<ReqB>,
        given: Option<crate::RouteInfo>,
    ) -> ResponseFuture<I::Future, S, C>
    where
        I: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
        I::Future: Send + 'static,
        I::Error: Send + 'static,
        ReqB: Send + 'static,
        ResB: Send + 'static,
        S: Store,
        C: Clock,
    {
        let RateLimit {
            inner,
            limiter,
            peer,
            route_wanted,
        } = self;
        let on = Stage {
            limiter,
            peer: peer.as_ref(),
            route_wanted: route_wanted.as_ref(),
        };
        // the clone polled ready is the one called
        serve(on, req, given, || {
            let clone = inner.clone();
            std::mem::replace(inner, clone)
        })
    }
}

/// What the limit layer's step decides with: the limiter, the
/// connection's peer, and whether a route is to be passed on.
struct Stage<'a, S, C> {
    limiter: &'a RateLimiter<S, C>,
    peer: Option<&'a Peer>,
    route_wanted: Option<&'a RouteWanted>,
}

/// Leaves `route`, the classification the decision was made with, in the
/// extensions of the request let through, unless `wanted` says that no
/// stage after reads it.
fn pass_route<B>(req: &mut Request<B>, route: Option<RouteInfo>, wanted: Option<&RouteWanted>) {
    if let Some(route) = route {
        if wanted.is_none_or(|w| w(req.method())) {
            req.extensions_mut().insert(route);
        }
    }
}

/// The limit layer's step: decided from the head when it can be (the
/// answer is ready, and `take_inner` is never called), else the inner
/// service taken and called once the limiter admits.
fn serve<I, S, C, ReqB, ResB>(
    on: Stage<'_, S, C>,
    mut req: Request<ReqB>,
    given: Option<crate::RouteInfo>,
    take_inner: impl FnOnce() -> I,
) -> ResponseFuture<I::Future, S, C>
where
    I: Service<Request<ReqB>, Response = Response<ResB>> + Send + 'static,
    I::Future: Send + 'static,
    I::Error: Send + 'static,
    ReqB: Send + 'static,
    ResB: Send + 'static,
    S: Store,
    C: Clock,
{
    let Stage {
        limiter,
        peer,
        route_wanted,
    } = on;
    let mut prepared = limiter.prepare(&req, peer, given);
    prepared.strip_untrusted(req.headers_mut());
    let later = match limiter.decide_now(&mut prepared) {
        // answered without the inner service; the request and its unread
        // body are dropped here, the inner readiness is kept
        Ok(Verdict::Respond(r)) => return ResponseFuture::ready(r.map(RateLimitBody::full)),
        Ok(Verdict::Reject(mut r)) => {
            if prepared.close {
                close_connection(&mut r);
            }
            return ResponseFuture::ready(r.map(RateLimitBody::full));
        }
        // a classification found in the extensions stays; one made here
        // is left for the handlers after this layer
        Ok(Verdict::Pass) => {
            pass_route(&mut req, prepared.route.take(), route_wanted);
            let fut = take_inner().call(req);
            return ResponseFuture {
                kind: Kind::Call { fut, admit: None },
            };
        }
        Ok(Verdict::Admit(admitted)) => {
            // held units go back when the response body is done, or with
            // this future if the call fails or is cancelled
            let guard = limiter.release_guard(&admitted);
            pass_route(&mut req, prepared.route.take(), route_wanted);
            let fut = take_inner().call(req);
            let admit = Admit {
                limiter: limiter.clone(),
                admitted,
                guard,
            };
            return ResponseFuture {
                kind: Kind::Call {
                    fut,
                    admit: Some(Box::new((admit, Admit::boxed))),
                },
            };
        }
        Err(later) => later,
    };
    // the store answers remotely: the clone stays for the next call; the
    // ready one serves this one
    let mut inner = take_inner();
    let limiter = limiter.clone();
    let route_wanted = route_wanted.cloned();
    let fut = async move {
        let verdict = limiter.decide_later(&mut prepared, later).await;
        match verdict {
            Verdict::Pass => {
                pass_route(&mut req, prepared.route, route_wanted.as_ref());
                Ok(inner.call(req).await?.map(RateLimitBody::inner))
            }
            Verdict::Respond(r) => Ok(r.map(RateLimitBody::full)),
            Verdict::Reject(mut r) => {
                if prepared.close {
                    close_connection(&mut r);
                }
                Ok(r.map(RateLimitBody::full))
            }
            Verdict::Admit(admitted) => {
                let guard = limiter.release_guard(&admitted);
                pass_route(&mut req, prepared.route, route_wanted.as_ref());
                let res = inner.call(req).await?;
                let admit = Admit {
                    limiter,
                    admitted,
                    guard,
                };
                Ok(match admit.try_finish(res) {
                    Ok(res) => res,
                    Err((admit, res)) => Box::pin(admit.finish(res)).await,
                })
            }
        }
    };
    ResponseFuture {
        kind: Kind::Boxed { fut: Box::pin(fut) },
    }
}
