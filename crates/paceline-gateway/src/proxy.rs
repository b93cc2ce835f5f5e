//! The forwarding service: one request to the upstream and its response
//! back, both bodies streamed.
//!
//! It speaks HTTP/1.1 to the upstream itself, inside the request's task,
//! over a pool of keep-alive connections (a stack of idle connections, one
//! going back on it the moment its response body ends), in cleartext or
//! over TLS for an `https://` upstream; or HTTP/2 on one multiplexed
//! connection when `upstream_protocol` asks for it (see
//! [`crate::upstream`]). A TLS handshake that fails (an unknown issuer, a
//! name that does not match) is a connect failure: `502`, logged with
//! rustls's reason, its charge given back. It strips
//! hop-by-hop fields both ways, appends the client to `X-Forwarded-For`
//! (replacing what a client that is no trusted proxy sent there),
//! and bounds every phase: connecting, waiting for the response head, and
//! every pause inside either body. A request body streams while the answer
//! is watched for, so an upstream may answer early. An upstream that cannot
//! be reached gives `502`, one too slow to answer `504` (unless what it
//! waited for was the client's own body, stalled or slower than the least
//! rate: then `408`, the connection closed); an answer whose
//! framing cannot be trusted (conflicting lengths, transfer codings other
//! than chunked) gives `502`. A request that a reused connection lost
//! before any answer came (the upstream closed it while it sat idle) is
//! sent again on another connection when that is safe: its body is not
//! streaming, and it is idempotent or none of it was written. The `502`s
//! and `504`s written because the upstream's answer never came are marked
//! [`paceline_server::UpstreamFailed`], saying whether the request's head
//! had been written to the upstream: by default the charge of one that
//! never reached it is given back, and that of one that did stands (the
//! upstream may have done the work).

use std::convert::Infallible;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::BodyExt;
use paceline_core::Clock;
use paceline_server::{PeerAddr, UpstreamFailed};
use paceline_wire::problem::{self, Problem, ProblemKind};
use std::sync::atomic::{AtomicBool, Ordering};
use tower_service::Service;

use crate::config::{Timeouts, UpstreamProtocol, UpstreamTlsSettings};
use crate::intake::{BodyProgress, RequestBody};
use crate::metrics as m;
use crate::shed::CurrentLimits;
use crate::upstream::{Answer, Outgoing, Upstream, UpstreamClient, UpstreamError, Via};

pub(crate) use crate::upstream::{strip_hop_by_hop, BodyIdle, BoxError, IdleTimeout};

/// The body of a request as the proxy gets it: the client's, through the
/// idempotency layer (which digests it on the routes that take keys and
/// passes it on untouched elsewhere).
pub(crate) type ClientBody = paceline_server::idempotency::DigestBody<RequestBody>;

/// The body of every response the gateway sends.
pub(crate) type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// Forwards requests to one upstream. Clones share the connection pool.
#[derive(Clone)]
pub(crate) struct Proxy {
    inner: Arc<ProxyInner>,
    /// The bound on the upstream's answer head, one timer per client
    /// connection.
    answer_timer: AnswerTimer,
    /// The client connection's peer, for requests that carry no
    /// [`PeerAddr`].
    peer: Option<IpAddr>,
    /// Whether the client connection is TLS.
    tls: bool,
}

struct ProxyInner {
    upstream: UpstreamClient<ClientBody>,
    timeouts: Timeouts,
    /// The limits in force: their problem base prefixes the types of the
    /// gateway's own answers, so a reload reaches these too.
    limits: CurrentLimits,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("upstream", self.inner.upstream.authority())
            .finish_non_exhaustive()
    }
}

impl Proxy {
    /// A proxy to `upstream` (`http[s]://host[:port][/base]`) speaking
    /// `protocol` to it, with `tls` for an `https://` one; the problem
    /// types of the proxy's own answers (an upstream that fails, say) are
    /// under the problem base of the limits `limits` gives at the time;
    /// upstream latencies and the ages of pooled connections are read
    /// from `clock`. Fails (`InvalidInput`, saying why) when the upstream
    /// TLS configuration cannot be built: a file unreadable since the
    /// config was checked, or no trusted root at all.
    pub(crate) fn build(
        upstream: &Uri,
        tls: &UpstreamTlsSettings,
        protocol: UpstreamProtocol,
        timeouts: Timeouts,
        limits: CurrentLimits,
        clock: Arc<dyn Clock>,
    ) -> std::io::Result<Self> {
        let upstream = UpstreamClient::new(upstream, tls, protocol, &timeouts, clock)
            .map_err(|m| std::io::Error::new(std::io::ErrorKind::InvalidInput, m))?;
        Ok(Proxy {
            inner: Arc::new(ProxyInner {
                upstream,
                timeouts,
                limits,
            }),
            answer_timer: AnswerTimer::default(),
            peer: None,
            tls: false,
        })
    }

    /// The same proxy (sharing the pool) for the one client connection
    /// whose peer is `peer`: its requests need not carry a [`PeerAddr`].
    pub(crate) fn with_peer(&self, peer: std::net::SocketAddr) -> Self {
        Proxy {
            inner: self.inner.clone(),
            answer_timer: AnswerTimer::default(),
            peer: Some(peer.ip()),
            tls: self.tls,
        }
    }

    /// The same proxy for a client connection that is TLS (`tls`) or not:
    /// what `X-Forwarded-Proto` says upstream.
    pub(crate) fn with_tls(mut self, tls: bool) -> Self {
        self.tls = tls;
        self
    }

    /// Forwards one request, its head and body apart: the future holds
    /// them once (an `async fn` taking the request would hold it beside
    /// its parts, and a future calling it the request again).
    async fn forward(
        self,
        mut parts: http::request::Parts,
        body: ClientBody,
    ) -> Result<Response<ProxyBody>, Infallible> {
        let this = &*self.inner;
        // (a CONNECT never gets here: `front.rs` answers it)
        // how much of a body still coming was in when the upstream was
        // first waited for
        let progress = parts.extensions.get::<Arc<BodyProgress>>().cloned();
        let before = progress.as_ref().map_or(0, |p| p.received());
        let peer = parts
            .extensions
            .get::<PeerAddr>()
            .map(|p| p.0.ip())
            .or(self.peer);
        let trusted = |ip| (this.limits)().trusted_proxies().contains(ip);
        let via = Via {
            peer,
            trusted: &trusted,
            tls: self.tls,
        };
        let reached = AtomicBool::new(false);
        let out = Outgoing {
            parts: &parts,
            via,
            reached: &reached,
        };
        // boxed where it is made: the exchange is the largest state of
        // the request's future (about 2 KiB), and moved by value it would
        // be copied at every stage that wraps it (the timeout, this
        // future, the box of `call`)
        let exchange = Box::pin(this.upstream.send(out, body));
        // whether the upstream may have done the work when its answer failed
        let failed = |reached: &AtomicBool| match reached.load(Ordering::Acquire) {
            true => UpstreamFailed::AfterSending,
            false => UpstreamFailed::NeverSent,
        };
        let answer = self
            .answer_timer
            .within(this.timeouts.upstream_header, exchange)
            .await;
        // the request is written: its map's room serves a later head
        crate::h1::give_map(std::mem::take(&mut parts.headers));
        Ok(match answer {
            Ok(Ok(answer)) => {
                let Answer {
                    status,
                    mut headers,
                    body,
                    waited,
                } = answer;
                m::upstream_latency(waited);
                strip_hop_by_hop(&mut headers);
                let body = IdleTimeout::new(body, this.timeouts.body_idle);
                let mut res = Response::new(body.boxed_unsync());
                *res.status_mut() = status;
                *res.headers_mut() = headers;
                res
            }
            Ok(Err(UpstreamError::RequestBody(e))) => {
                request_body_error((this.limits)().problem_base(), &e)
            }
            Ok(Err(e)) => {
                let connect = matches!(e, UpstreamError::Connect(_));
                m::upstream_error(if connect { "connect" } else { "request" });
                tracing::warn!(error = %e, "upstream request failed");
                let detail = match connect {
                    true => "The upstream could not be reached.",
                    false => "The upstream failed before answering.",
                };
                upstream_failed(
                    gateway_error(
                        (this.limits)().problem_base(),
                        ProblemKind::BadGateway,
                        detail,
                    ),
                    failed(&reached),
                )
            }
            Err(_)
                if progress
                    .as_ref()
                    .is_some_and(|p| p.client_stalled(before, this.timeouts.upstream_header)) =>
            {
                // the upstream was waiting for the rest of the body, which
                // the client stopped sending: the client's fault, a 408,
                // and the upstream connection went with the exchange.
                // Unlike a 504 its charge is kept, as every 408 after
                // admission is: the request was admitted and held an
                // upstream connection, and a refund would let a client
                // that stalls after its first bytes occupy upstreams
                // without spending anything. (The intake's own 408 charges
                // nothing because it comes before the limiter, with
                // nothing sent upstream.)
                tracing::debug!(
                    timeout_ms = this.timeouts.upstream_header.as_millis() as u64,
                    "request body stalled while the upstream waited for it"
                );
                request_body_stalled((this.limits)().problem_base())
            }
            Err(_) => {
                m::upstream_error("timeout");
                tracing::warn!(
                    timeout_ms = this.timeouts.upstream_header.as_millis() as u64,
                    "upstream timed out"
                );
                upstream_failed(
                    gateway_error(
                        (this.limits)().problem_base(),
                        ProblemKind::GatewayTimeout,
                        "The upstream did not answer in time.",
                    ),
                    failed(&reached),
                )
            }
        })
    }
}

/// The bound on the wait for the upstream's answer head, with one timer
/// per client connection instead of one per request: a timer made,
/// registered and cancelled for every request is most of what the bound
/// costs, and it almost never fires. A request takes the connection's
/// timer (or makes one, when another request holds it: HTTP/2) and gives
/// it back still armed; its deadline is an earlier request's at the
/// soonest, so when it fires before the request's own deadline it is
/// set again to that one. A quiet connection's timer fires once more,
/// for nothing, a bound after its last request.
#[derive(Clone, Default)]
struct AnswerTimer(Arc<parking_lot::Mutex<Option<Pin<Box<tokio::time::Sleep>>>>>);

/// The upstream's answer head did not come within its bound.
struct Late;

impl AnswerTimer {
    /// `fut`'s output, or [`Late`] once `bound` has passed from now.
    async fn within<F: Future>(&self, bound: Duration, fut: F) -> Result<F::Output, Late> {
        let deadline = tokio::time::Instant::now() + bound;
        let mut timer = self.0.lock().take();
        let mut fut = std::pin::pin!(fut);
        let out = std::future::poll_fn(|cx| {
            if let Poll::Ready(out) = fut.as_mut().poll(cx) {
                return Poll::Ready(Ok(out));
            }
            let t = timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
            if t.deadline() > deadline {
                t.as_mut().reset(deadline);
            }
            loop {
                std::task::ready!(t.as_mut().poll(cx));
                if t.deadline() >= deadline {
                    return Poll::Ready(Err(Late));
                }
                // an earlier request's deadline: on to this one's
                t.as_mut().reset(deadline);
            }
        })
        .await;
        if let Some(t) = timer {
            *self.0.lock() = Some(t);
        }
        out
    }
}

/// Marks a `502`/`504` written because the upstream's answer never came,
/// saying whether the head had reached the upstream: the limit layer gives
/// the charge of a request that never did back (unless its plan charges
/// upstream failures) and keeps that of one that did (unless its plan
/// refunds those too).
fn upstream_failed(mut res: Response<ProxyBody>, failed: UpstreamFailed) -> Response<ProxyBody> {
    res.extensions_mut().insert(failed);
    res
}

/// The answer when the client's own body failed: the connection is
/// closed (what is left of the body is not read), and the upstream
/// connection it was going to was dropped.
fn request_body_error(base: &str, e: &BoxError) -> Response<ProxyBody> {
    m::upstream_error("request_body");
    let mut res = if e.is::<BodyIdle>() {
        gateway_error(
            base,
            ProblemKind::RequestTimeout,
            "The request body stalled longer than allowed.",
        )
    } else if crate::intake::is_deadline(e) {
        gateway_error(
            base,
            ProblemKind::RequestTimeout,
            "The request body came too slowly or took too long.",
        )
    } else {
        gateway_error(
            base,
            ProblemKind::BadRequest,
            "The request body could not be read.",
        )
    };
    res.headers_mut().insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("close"),
    );
    res
}

/// The answer when the upstream's answer was late because the client's
/// body stalled: `408`, the connection closed.
fn request_body_stalled(base: &str) -> Response<ProxyBody> {
    m::upstream_error("request_body");
    let mut res = gateway_error(
        base,
        ProblemKind::RequestTimeout,
        "The request body stalled while the upstream waited for it.",
    );
    res.headers_mut().insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("close"),
    );
    res
}

impl Service<Request<ClientBody>> for Proxy {
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<ClientBody>) -> Self::Future {
        let (parts, body) = req.into_parts();
        Box::pin(self.clone().forward(parts, body))
    }
}

/// Marks the answers the proxy writes itself (the upstream failed, or the
/// request could not be sent) in their extensions: their latency is not
/// the upstream's.
#[derive(Clone, Copy, Debug)]
struct GatewayAnswer;

/// A problem answer written by the gateway itself, its type under `base`.
pub(crate) fn gateway_error(base: &str, kind: ProblemKind, detail: &str) -> Response<ProxyBody> {
    let mut res = problem::answer(&Problem::new(kind, base, detail)).map(full);
    res.extensions_mut().insert(GatewayAnswer);
    res
}

/// Marks `res` as an answer the gateway wrote itself.
pub(crate) fn mark_gateway_answer<B>(res: &mut Response<B>) {
    res.extensions_mut().insert(GatewayAnswer);
}

/// Whether the proxy wrote `res` itself rather than passing on the
/// upstream's answer.
pub(crate) fn is_gateway_answer<B>(res: &Response<B>) -> bool {
    res.extensions().get::<GatewayAnswer>().is_some()
}

/// A complete body.
pub(crate) fn full(data: impl Into<Bytes>) -> ProxyBody {
    http_body_util::Full::new(data.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_kept_timer_bounds_each_request_from_its_own_start() {
        let timer = AnswerTimer::default();
        let bound = Duration::from_secs(10);
        let answered = timer.within(bound, tokio::time::sleep(Duration::from_secs(1)));
        assert!(answered.await.is_ok());
        // the timer is kept, armed for the first request's deadline (10 s)
        tokio::time::sleep(Duration::from_secs(5)).await;
        let started = tokio::time::Instant::now();
        let late = timer.within(bound, std::future::pending::<()>()).await;
        assert!(late.is_err());
        assert_eq!(started.elapsed(), bound);
        // and again once it has fired
        let started = tokio::time::Instant::now();
        assert!(timer
            .within(bound, std::future::pending::<()>())
            .await
            .is_err());
        assert_eq!(started.elapsed(), bound);
    }

    #[tokio::test(start_paused = true)]
    async fn requests_at_once_each_have_their_bound() {
        let timer = AnswerTimer::default();
        let bound = Duration::from_secs(10);
        let started = tokio::time::Instant::now();
        let first = async {
            let r = timer.within(bound, std::future::pending::<()>()).await;
            (r.is_err(), started.elapsed())
        };
        let second = async {
            tokio::time::sleep(Duration::from_secs(3)).await;
            let r = timer.within(bound, std::future::pending::<()>()).await;
            (r.is_err(), started.elapsed())
        };
        let (a, b) = tokio::join!(first, second);
        assert_eq!(a, (true, bound));
        assert_eq!(b, (true, bound + Duration::from_secs(3)));
    }
}
