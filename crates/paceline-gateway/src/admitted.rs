//! What a request the limiter admitted goes through before the upstream:
//! its body's intake, then its unit of in-flight capacity.
//!
//! Why after the limiter: a rejection is decided from the head alone. A
//! client over its limit that announces a large body gets its `429` at
//! once (with `Expect: 100-continue`, instead of `100 Continue`), and
//! never holds a receiving place or makes the gateway wait for its first
//! bytes. Only an admitted request's body is taken in (`intake.rs`), and
//! only once it can flow does the request take its unit of in-flight
//! capacity (a [`ShedTicket`], for the room the shed layer found from the
//! head, left in the answer for the shed layer to hold), so slow senders
//! still hold none and a refused request costs no ticket.
//!
//! First of all, before the body is touched, the request is charged to
//! the global plan when one is in force (`global.rs`): past it, `503`.
//! The global plan counts what reaches the upstream, so a request charged
//! to it that then goes no further gets that charge back: refused here,
//! shed, never sent (the upstream could not be reached), or answered by
//! the idempotency layer itself (a replay, a refused key). Otherwise a
//! client replaying one stored answer could spend everyone's share of
//! the upstream without reaching it once.
//!
//! An admitted request refused here never went anywhere: its answer is
//! marked [`UpstreamFailed`], so the limit layer gives its charge back. A
//! body that never arrives (`408`) or cannot be read (`400`) counts as
//! never sent (given back unless the plan charges upstream failures); a
//! request shed for load (`503`: no receiving place, no room in the memory
//! bound, or no in-flight unit left by now) is always given back.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::h1::ClientBody as Incoming;
use bytes::Bytes;
use http::{Request, Response};
use paceline_server::idempotency::{AnsweredHere, IdempotencyBody};
use paceline_server::{Criticality, HttpFuture, RouteInfo, UpstreamFailed};
use tower_service::Service;

use crate::global::{GlobalLimit, Said};
use crate::intake::{refusal_answer, Begun, Intake, Refusal, RequestBody};
use crate::proxy::ProxyBody;
use crate::server::GatewayLimiter;
use crate::shed::{CurrentLimits, ShedTicket, Shedder};

/// The answer body of the stages after this one.
type InnerBody = IdempotencyBody<ProxyBody>;

/// Takes an admitted request's body in and its in-flight unit, then
/// calls the inner service; one per client connection.
#[derive(Clone)]
pub(crate) struct Admitted<S> {
    inner: S,
    /// The connection's own, shared by its requests: one count to clone.
    shared: Arc<Shared>,
}

struct Shared {
    intake: Intake,
    /// The deferred shed layer's shedder: the unit is taken here.
    shedder: Shedder,
    peer: IpAddr,
    limits: CurrentLimits,
    retry_after_s: u64,
    /// The global plan, and the limiter whose store and clock count it.
    global: Arc<GlobalLimit>,
    limiter: GatewayLimiter,
}

impl<S> Admitted<S> {
    pub(crate) fn new(
        inner: S,
        intake: Intake,
        shedder: Shedder,
        peer: IpAddr,
        limits: CurrentLimits,
        retry_after_s: u64,
        (global, limiter): (Arc<GlobalLimit>, GatewayLimiter),
    ) -> Self {
        Admitted {
            inner,
            shared: Arc::new(Shared {
                intake,
                shedder,
                peer,
                limits,
                retry_after_s,
                global,
                limiter,
            }),
        }
    }
}

/// Where a request stands with the global plan, when one is in force:
/// charged already (the store answered at once), or still to be asked
/// (before anything else). Either way, the plan and the instant of the
/// charge, for giving it back.
enum Global {
    Charged(paceline_core::Plan, paceline_core::Nanos),
    Ask(paceline_core::Plan, paceline_core::Nanos),
}

impl<S> Service<Request<Incoming>> for Admitted<S>
where
    S: Service<Request<RequestBody>, Response = Response<InnerBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<InnerBody>;
    type Error = S::Error;
    type Future = AdmittedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        use http_body::Body;
        let body = !req.body().is_end_stream();
        let this = &*self.shared;
        let mut global = None;
        if let Some(plan) = this.global.plan() {
            let now = this.limiter.clock().now();
            global = match crate::global::check_now(&this.limiter, &plan, now, &this.limits, body) {
                Some(Said::Pass) => Some(Global::Charged(plan, now)),
                Some(Said::Refuse(res)) => return AdmittedFuture::answer(this.shed(res)),
                None => Some(Global::Ask(plan, now)),
            };
        }
        // (with a global plan, boxed: its charge may have to be given
        // back once the answer is known)
        if body || global.is_some() {
            return self.later(req, global);
        }
        // a request without a body is handed on at once: no future of
        // this stage's own to make, move or box
        let req = match this.intake.begin(req, this.peer) {
            Ok(Begun::Taken(req)) => req,
            Ok(Begun::Waiting(req)) => return self.wait(req),
            Err(r) => return AdmittedFuture::answer(this.refused(r)),
        };
        match this.redeem(&req) {
            Ok(ticket) => AdmittedFuture::Call {
                call: self.inner.call(req),
                ticket,
            },
            Err(r) => AdmittedFuture::answer(this.refused(r)),
        }
    }
}

/// What a boxed stage does once the body's intake has answered: the
/// refusal's answer, or the in-flight unit taken and the inner call made
/// (the unit left in the answer for the shed layer).
async fn go_on<S>(
    this: &Shared,
    inner: &mut S,
    req: Result<Request<RequestBody>, Refusal>,
) -> Result<Response<InnerBody>, S::Error>
where
    S: Service<Request<RequestBody>, Response = Response<InnerBody>>,
{
    let req = match req {
        Ok(req) => req,
        Err(r) => return Ok(this.refused(r)),
    };
    let ticket = match this.redeem(&req) {
        Ok(ticket) => ticket,
        Err(r) => return Ok(this.refused(r)),
    };
    let mut res = inner.call(req).await?;
    if let Some(t) = ticket {
        res.extensions_mut().insert(t);
    }
    Ok(res)
}

impl<S> Admitted<S>
where
    S: Service<Request<RequestBody>, Response = Response<InnerBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    /// The future of a request with a body, boxed: its intake starts when
    /// it is first polled, by when what came with the head has been read
    /// (a body that came whole with its head then needs no receiving
    /// place), and waits for the rest if it must.
    fn later(
        &mut self,
        req: Request<Incoming>,
        global: Option<Global>,
    ) -> AdmittedFuture<S::Future> {
        // the clone polled ready is the one called
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let this = self.shared.clone();
        AdmittedFuture::Waiting {
            fut: Box::pin(async move {
                let charged = match global {
                    Some(Global::Ask(plan, now)) => {
                        use http_body::Body;
                        let close = !req.body().is_end_stream();
                        let said = crate::global::check_later(
                            &this.limiter,
                            &plan,
                            now,
                            &this.limits,
                            close,
                        )
                        .await;
                        if let Said::Refuse(res) = said {
                            return Ok(this.shed(res));
                        }
                        Some((plan, now))
                    }
                    Some(Global::Charged(plan, now)) => Some((plan, now)),
                    None => None,
                };
                let req = match this.intake.begin(req, this.peer) {
                    Ok(Begun::Taken(req)) => Ok(req),
                    Ok(Begun::Waiting(req)) => this.intake.wait(req).await,
                    Err(r) => Err(r),
                };
                let res = go_on(&this, &mut inner, req).await?;
                if let Some((plan, at)) = charged {
                    if went_no_further(&res) {
                        crate::global::give_back(&this.limiter, &plan, at).await;
                    }
                }
                Ok(res)
            }),
        }
    }

    /// The future of a request whose body is still to come: it waits for
    /// the intake in a box of its own, then goes on as [`Service::call`]
    /// does.
    fn wait(&mut self, req: Box<Request<RequestBody>>) -> AdmittedFuture<S::Future> {
        // the clone polled ready is the one called
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let this = self.shared.clone();
        AdmittedFuture::Waiting {
            fut: Box::pin(async move {
                let req = this.intake.wait(req).await;
                go_on(&this, &mut inner, req).await
            }),
        }
    }
}

pin_project_lite::pin_project! {
    /// The future of [`Admitted`]: a refusal ready at once, the inner call
    /// (holding the request's unit of in-flight capacity), or a request
    /// waiting for its body, boxed.
    #[project = AdmittedProj]
    pub(crate) enum AdmittedFuture<F: HttpFuture> {
        /// Refused here.
        Ready { res: Option<Response<F::Body>> },
        /// Handed on.
        Call {
            #[pin]
            call: F,
            ticket: Option<ShedTicket>,
        },
        /// Its body still to come.
        Waiting { fut: Pin<Box<dyn Future<Output = Result<Response<F::Body>, F::Error>> + Send>> },
    }
}

impl<F: HttpFuture> AdmittedFuture<F> {
    fn answer(res: Response<F::Body>) -> Self {
        AdmittedFuture::Ready { res: Some(res) }
    }
}

// its body and error are the inner future's (see `HttpFuture`)
impl<F: HttpFuture> Future for AdmittedFuture<F> {
    type Output = Result<Response<F::Body>, F::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            AdmittedProj::Ready { res } => {
                Poll::Ready(Ok(res.take().expect("polled after completion")))
            }
            AdmittedProj::Call { call, ticket } => {
                let mut res = std::task::ready!(call.poll(cx))?;
                // the shed layer finds the unit in the answer and holds it
                // to the body's end
                if let Some(t) = ticket.take() {
                    res.extensions_mut().insert(t);
                }
                Poll::Ready(Ok(res))
            }
            AdmittedProj::Waiting { fut } => fut.as_mut().poll(cx),
        }
    }
}

impl Shared {
    /// The unit of in-flight capacity the shed layer found room for from
    /// the head, taken now the body can flow (none when shedding is off);
    /// the shed layer finds it in the answer and holds it to the body's
    /// end. `Err` when there is no room left by now.
    fn redeem<B>(&self, req: &Request<B>) -> Result<Option<ShedTicket>, Refusal> {
        if self.shedder.settings().max_in_flight == 0 {
            return Ok(None);
        }
        let c = req
            .extensions()
            .get::<RouteInfo>()
            .map_or(Criticality::Critical, |r| r.criticality);
        match ShedTicket::redeem(&self.shedder, c) {
            Some(t) => Ok(Some(t)),
            None => Err(Refusal::Overloaded),
        }
    }

    /// The answer to a request refused here, marked for the limit layer.
    fn refused(&self, r: Refusal) -> Response<InnerBody> {
        let limits = (self.limits)();
        let res = refusal_answer(r, limits.problem_base(), self.retry_after_s);
        let failed = match r {
            Refusal::Overloaded => UpstreamFailed::Shed,
            Refusal::Timeout | Refusal::Broken => UpstreamFailed::NeverSent,
        };
        mark(res, failed)
    }

    /// The global plan's refusal, marked shed for the limit layer (the
    /// key's charge is given back).
    fn shed(&self, res: Response<Bytes>) -> Response<InnerBody> {
        mark(res, UpstreamFailed::Shed)
    }
}

/// Whether the request `res` answers never reached the upstream: refused
/// or shed on the way, never sent, or answered by the idempotency layer.
fn went_no_further<B>(res: &Response<B>) -> bool {
    let ext = res.extensions();
    matches!(
        ext.get::<UpstreamFailed>(),
        Some(UpstreamFailed::NeverSent | UpstreamFailed::Shed)
    ) || ext.get::<AnsweredHere>().is_some()
}

/// `res` as this stage's answer, marked for the limit layer.
fn mark(res: Response<Bytes>, failed: UpstreamFailed) -> Response<InnerBody> {
    let mut res = res.map(|b: Bytes| IdempotencyBody::whole(b));
    res.extensions_mut().insert(failed);
    crate::proxy::mark_gateway_answer(&mut res);
    res
}
