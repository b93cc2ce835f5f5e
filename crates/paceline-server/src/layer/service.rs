use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Request, Response};
use paceline_core::{Clock, Store};
use tower_service::Service;

use super::RateLimitBody;
use crate::limiter::Verdict;
use crate::RateLimiter;

/// The future of [`RateLimit`].
pub type ResponseFuture<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<RateLimitBody<B>>, E>> + Send + 'static>>;

/// A service that admits, rejects or answers (usage) before its inner
/// service sees the request.
pub struct RateLimit<I, S, C> {
    inner: I,
    limiter: RateLimiter<S, C>,
}

impl<I, S, C> RateLimit<I, S, C> {
    /// Wraps `inner`.
    pub fn new(inner: I, limiter: RateLimiter<S, C>) -> Self {
        RateLimit { inner, limiter }
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

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let prepared = self.limiter.prepare(&req);
        let route = prepared.route.clone();
        // the clone stays for the next call; the ready one serves this one
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let limiter = self.limiter.clone();
        Box::pin(async move {
            let mut req = req;
            match limiter.decide(prepared).await {
                Verdict::Pass => {
                    req.extensions_mut().insert(route);
                    Ok(inner.call(req).await?.map(RateLimitBody::inner))
                }
                // the request (and its unread body) is dropped here
                Verdict::Respond(r) => Ok(r.map(RateLimitBody::full)),
                Verdict::Admit(admitted) => {
                    // held units go back when the response body is done,
                    // or here if the call fails or is cancelled
                    let guard = limiter.release_guard(&admitted);
                    req.extensions_mut().insert(route);
                    let mut res = inner.call(req).await?;
                    admitted.decorate(res.headers_mut());
                    Ok(res.map(|b| RateLimitBody::guarded(b, guard)))
                }
            }
        })
    }
}
