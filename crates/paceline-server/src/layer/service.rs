//! [`RateLimit`], the service: it decides from the head before calling the
//! inner service, and its [`ResponseFuture`] is ready at once (and
//! allocates nothing) when the answer is made in process.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Request, Response};
use paceline_core::{Clock, Store};
use tower_service::Service;

use super::RateLimitBody;
use crate::limiter::Verdict;
use crate::respond::close_connection;
use crate::RateLimiter;

type Boxed<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<RateLimitBody<B>>, E>> + Send + 'static>>;

/// The future of [`RateLimit`]: a rejection decided in process is ready at
/// once and allocates nothing; anything that calls the inner service or a
/// remote store is boxed.
pub struct ResponseFuture<B, E> {
    kind: Kind<B, E>,
}

enum Kind<B, E> {
    Ready(Option<Response<RateLimitBody<B>>>),
    Boxed(Boxed<B, E>),
}

// Nothing inside is ever pinned in place: the ready response is moved out
// and the boxed future is pinned on the heap.
impl<B, E> Unpin for ResponseFuture<B, E> {}

impl<B, E> ResponseFuture<B, E> {
    fn ready(res: Response<RateLimitBody<B>>) -> Self {
        ResponseFuture {
            kind: Kind::Ready(Some(res)),
        }
    }
}

impl<B, E> Future for ResponseFuture<B, E> {
    type Output = Result<Response<RateLimitBody<B>>, E>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.get_mut().kind {
            Kind::Ready(r) => Poll::Ready(Ok(r.take().expect("polled after completion"))),
            Kind::Boxed(f) => f.as_mut().poll(cx),
        }
    }
}

impl<B, E> fmt::Debug for ResponseFuture<B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            Kind::Ready(_) => "ready",
            Kind::Boxed(_) => "boxed",
        };
        f.debug_struct("ResponseFuture")
            .field("kind", &kind)
            .finish()
    }
}

/// A service that admits, rejects or answers (usage) before its inner
/// service sees the request.
pub struct RateLimit<I, S, C> {
    inner: I,
    limiter: RateLimiter<S, C>,
    peer: Option<std::net::IpAddr>,
}

impl<I, S, C> RateLimit<I, S, C> {
    /// Wraps `inner`.
    pub fn new(inner: I, limiter: RateLimiter<S, C>) -> Self {
        RateLimit {
            inner,
            limiter,
            peer: None,
        }
    }
    /// Sets the socket peer of the one connection this service serves, for
    /// requests whose extensions name none (see [`crate::PeerAddr`]): a
    /// server that builds a service per connection then need not insert
    /// the address into every request.
    pub fn with_peer(mut self, peer: std::net::SocketAddr) -> Self {
        self.peer = Some(peer.ip());
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
            peer: self.peer,
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
    type Future = ResponseFuture<ResB, I::Error>;

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
        self.limiter.standing(req, self.peer, route)
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
    ) -> ResponseFuture<ResB, I::Error>
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
    ) -> ResponseFuture<ResB, I::Error>
    where
        I: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
        I::Future: Send + 'static,
        I::Error: Send + 'static,
        ReqB: Send + 'static,
        ResB: Send + 'static,
        S: Store,
        C: Clock,
    {
        serve(&self.limiter, self.peer, req, route, || self.inner.clone())
    }

    fn serve<ReqB, ResB>(
        &mut self,
        req: Request<ReqB>,
        given: Option<crate::RouteInfo>,
    ) -> ResponseFuture<ResB, I::Error>
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
        } = self;
        // the clone polled ready is the one called
        serve(limiter, *peer, req, given, || {
            let clone = inner.clone();
            std::mem::replace(inner, clone)
        })
    }
}

/// The limit layer's step: decided from the head when it can be (the
/// answer is ready, and `take_inner` is never called), else the inner
/// service taken and called once the limiter admits.
fn serve<I, S, C, ReqB, ResB>(
    limiter: &RateLimiter<S, C>,
    peer: Option<std::net::IpAddr>,
    mut req: Request<ReqB>,
    given: Option<crate::RouteInfo>,
    take_inner: impl FnOnce() -> I,
) -> ResponseFuture<ResB, I::Error>
where
    I: Service<Request<ReqB>, Response = Response<ResB>> + Send + 'static,
    I::Future: Send + 'static,
    I::Error: Send + 'static,
    ReqB: Send + 'static,
    ResB: Send + 'static,
    S: Store,
    C: Clock,
{
    {
        let prepared = limiter.prepare(&req, peer, given);
        prepared.strip_untrusted(req.headers_mut());
        let now = limiter.decide_now(&prepared);
        match now {
            // answered without the inner service; the request and its
            // unread body are dropped here, the inner readiness is kept
            Ok(Verdict::Respond(r)) => return ResponseFuture::ready(r.map(RateLimitBody::full)),
            Ok(Verdict::Reject(mut r)) => {
                if prepared.close {
                    close_connection(&mut r);
                }
                return ResponseFuture::ready(r.map(RateLimitBody::full));
            }
            _ => {}
        }
        // the clone stays for the next call; the ready one serves this one
        let mut inner = take_inner();
        let limiter = limiter.clone();
        let fut = async move {
            let verdict = match now {
                Ok(v) => v,
                Err(later) => limiter.decide_later(&prepared, later).await,
            };
            match verdict {
                Verdict::Pass => {
                    if let Some(route) = prepared.route {
                        req.extensions_mut().insert(route);
                    }
                    Ok(inner.call(req).await?.map(RateLimitBody::inner))
                }
                Verdict::Respond(r) => Ok(r.map(RateLimitBody::full)),
                Verdict::Reject(mut r) => {
                    if prepared.close {
                        close_connection(&mut r);
                    }
                    Ok(r.map(RateLimitBody::full))
                }
                Verdict::Admit(mut admitted) => {
                    // held units go back when the response body is done,
                    // or here if the call fails or is cancelled
                    let guard = limiter.release_guard(&admitted);
                    // a classification found in the extensions stays; one
                    // made here is left for the handlers after this layer
                    if let Some(route) = prepared.route {
                        req.extensions_mut().insert(route);
                    }
                    let mut res = inner.call(req).await?;
                    let mut meter = None;
                    if let Some(&failed) = res.extensions().get::<super::UpstreamFailed>() {
                        // the answer never came: the charge may go back
                        limiter.refund(&mut admitted, failed).await;
                    } else if admitted.reports_usage() {
                        // a charge the answer reports: settled from its
                        // head, or from its body as it goes by (boxed: a
                        // request without it carries none of its state)
                        let head = res.headers();
                        meter = Box::pin(limiter.settle_head(&mut admitted, head)).await;
                    }
                    admitted.decorate(res.headers_mut());
                    Ok(res.map(|b| RateLimitBody::guarded(b, guard, meter)))
                }
            }
        };
        ResponseFuture {
            kind: Kind::Boxed(Box::pin(fut)),
        }
    }
}
