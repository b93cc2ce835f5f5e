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

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::Incoming;
use paceline_server::idempotency::IdempotencyBody;
use paceline_server::{Criticality, RouteInfo, UpstreamFailed};
use tower_service::Service;

use crate::intake::{refusal_answer, Intake, Refusal, RequestBody};
use crate::proxy::ProxyBody;
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
}

impl<S> Admitted<S> {
    pub(crate) fn new(
        inner: S,
        intake: Intake,
        shedder: Shedder,
        peer: IpAddr,
        limits: CurrentLimits,
        retry_after_s: u64,
    ) -> Self {
        Admitted {
            inner,
            shared: Arc::new(Shared {
                intake,
                shedder,
                peer,
                limits,
                retry_after_s,
            }),
        }
    }
}

impl<S> Service<Request<Incoming>> for Admitted<S>
where
    S: Service<Request<RequestBody>, Response = Response<InnerBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<InnerBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        // the clone polled ready is the one called
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let this = self.shared.clone();
        Box::pin(async move {
            let req = match this.intake.take(req, this.peer).await {
                Ok(req) => req,
                Err(r) => return Ok(this.refused(r)),
            };
            // the unit of in-flight capacity the shed layer found room
            // for from the head, taken now the body can flow; the shed
            // layer finds it in the answer and holds it to the body's end
            let ticket = match this.shedder.settings().max_in_flight {
                0 => None,
                _ => {
                    let c = req
                        .extensions()
                        .get::<RouteInfo>()
                        .map_or(Criticality::Critical, |r| r.criticality);
                    match ShedTicket::redeem(&this.shedder, c) {
                        Some(t) => Some(t),
                        None => return Ok(this.refused(Refusal::Overloaded)),
                    }
                }
            };
            let mut res = inner.call(req).await?;
            if let Some(t) = ticket {
                res.extensions_mut().insert(t);
            }
            Ok(res)
        })
    }
}

impl Shared {
    /// The answer to a request refused here, marked for the limit layer.
    fn refused(&self, r: Refusal) -> Response<InnerBody> {
        let limits = (self.limits)();
        let res = refusal_answer(r, limits.problem_base(), self.retry_after_s);
        let mut res = res.map(|b: Bytes| IdempotencyBody::whole(b));
        let failed = match r {
            Refusal::Overloaded => UpstreamFailed::Shed,
            Refusal::Timeout | Refusal::Broken => UpstreamFailed::NeverSent,
        };
        res.extensions_mut().insert(failed);
        crate::proxy::mark_gateway_answer(&mut res);
        res
    }
}
