//! The forward-auth check: the gateway's decisions for a proxy that
//! forwards the requests itself (nginx `auth_request`, Caddy
//! `forward_auth`, Traefik `ForwardAuth`).
//!
//! Why: not every deployment can put another reverse proxy in the path of
//! its traffic. Those proxies can ask a service, before they forward a
//! request, whether to forward it. [`Check`] is that service for the same
//! TOML file as `paceline gateway`: the same plans, keys, routes, identity
//! rules, store (Redis included) and shedding by requests per second, and
//! the one decision path (head screening, route, identity, limiter, store,
//! the prepared answer), so a refusal is the gateway's refusal byte for
//! byte.
//!
//! Each call is answered on any path, from the request the proxy describes
//! ([`rebuild`]: `X-Forwarded-Method`/`-Uri`/`-Host`, or nginx's
//! `X-Original-Method`/`-URI`, and every original field); no body is ever
//! read. Then:
//!
//! - the described request goes through the gateway's head screening
//!   (`front.rs`): its path in normal form before any route is matched, or
//!   `400`, so a spelling the upstream reads as another route cannot dodge
//!   its cost;
//! - the client address of per-IP keys is the check's socket peer (the
//!   proxy), or what `X-Forwarded-For`/`Forwarded` say when that peer is
//!   listed under `trusted_proxies`, as in the gateway;
//! - **admitted**: `200`, empty, with `RateLimit-Policy`, `RateLimit` (and
//!   the older dialects configured) and the soft-limit warning
//!   (`RateLimit-Warning`), for the proxy to copy onto the upstream's
//!   answer;
//! - **refused**: the gateway's answer (`429`, `503`, `401`, `400`, with
//!   `Retry-After`, the fields, `Cache-Control: no-store` and the problem
//!   body), which Caddy and Traefik pass on to the client as it is;
//! - **refused, for nginx**: a check request carrying
//!   `Paceline-Deny-Status: 403` (or `401`) gets that status instead, with
//!   the whole refusal sealed into `Paceline-Answer` ([`seal`]); the
//!   proxy's error page sends it back, and the check answers the refusal
//!   as it was made, deciding and charging nothing again (see
//!   `examples/nginx-check.conf`).
//!
//! What the check cannot do, since it never sees the upstream's answer
//! or the body: idempotency keys (`idempotency` routes are the gateway's
//! alone), giving back the charge of a request the upstream failed,
//! holding concurrency units past the decision, charging `content-bytes`
//! policies (the proxies do not pass the body's length), and shedding by
//! in-flight requests or upstream latency (`max_rps` applies). The usage
//! document is the check's own answer: route the usage path to the check
//! as a plain upstream.
//!
//! ```no_run
//! use paceline_gateway::{check::Check, GatewayConfig};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let config = GatewayConfig::load("examples/shiplane.toml".as_ref())?;
//! let check = Check::bind(config, "127.0.0.1:8081".parse()?).await?;
//! println!("checking on http://{}", check.local_addr());
//! check.run(paceline_gateway::shutdown_signal()).await?;
//! # Ok(()) }
//! ```

mod rebuild;
mod seal;

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, CONNECTION};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use paceline_core::{Clock, SystemClock};
use paceline_server::RateLimit;
use paceline_wire::problem::{self, Problem, ProblemKind};
use tokio::net::TcpListener;
use tower::ServiceExt;
use tower_layer::Layer;

pub use rebuild::{
    rebuild, Unreadable, FORWARDED_HOST, FORWARDED_METHOD, FORWARDED_URI, MAX_TARGET,
    ORIGINAL_METHOD, ORIGINAL_URI,
};
pub use seal::SEALED_FOR_S;

use crate::config::GatewayConfig;
use crate::server::{Gateway, GatewayHandle};
use crate::shed::{CurrentLimits, LoadShedLayer};
use seal::{Seal, Unopened};

/// Where `paceline check` listens unless told otherwise.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8081";

/// `Paceline-Deny-Status`: sent by a proxy that passes on only some
/// statuses from its check (nginx: `401`, `403`); a refusal is then
/// answered with that status and sealed into [`ANSWER`].
pub const DENY_STATUS: &str = "paceline-deny-status";

/// `Paceline-Answer`: a refusal sealed by the check; sent back to the
/// check, it is answered as it was made.
pub const ANSWER: &str = "paceline-answer";

/// The statuses [`DENY_STATUS`] may ask for.
const DENY_STATUSES: [u16; 2] = [401, 403];

/// A bound forward-auth check, ready to [`run`](Check::run).
pub struct Check {
    listener: TcpListener,
    addr: SocketAddr,
    handle: GatewayHandle,
    reload: std::pin::Pin<Box<dyn Future<Output = ()> + Send>>,
    seal: Seal,
    shutdown_after: Duration,
    /// The gateway's bound on a request head (the check request carries
    /// the original's fields and a few more), and on the wait for one.
    max_head: usize,
    header_wait: Duration,
}

impl std::fmt::Debug for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Check")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Check {
    /// Binds `listen` for the limits, store and shedding of `config` (its
    /// `gateway.listen`, `upstream` and `metrics_listen` are the gateway's
    /// and play no part), reading time from the system clock.
    pub async fn bind(config: GatewayConfig, listen: SocketAddr) -> io::Result<Check> {
        Check::bind_with_clock(config, listen, Arc::new(SystemClock::new())).await
    }

    /// Binds with an explicit clock (tests use a manual one).
    pub async fn bind_with_clock(
        mut config: GatewayConfig,
        listen: SocketAddr,
        clock: Arc<dyn Clock>,
    ) -> io::Result<Check> {
        config.settings.listen = listen;
        config.settings.metrics_listen = None;
        let seal = Seal::new(config.limits.key_hasher().derive("forward-auth answers"));
        let shutdown_after = config.settings.timeouts.shutdown;
        let max_head = config.settings.max_head_bytes;
        let header_wait = config.settings.timeouts.client_header;
        let gateway = Gateway::bind_with_clock(config, clock).await?;
        let addr = gateway.local_addr();
        let (listener, handle, reload) = gateway.into_check_parts();
        Ok(Check {
            listener,
            addr,
            handle,
            reload: Box::pin(reload),
            seal,
            shutdown_after,
            max_head,
            header_wait,
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// A handle to reload or stop it (the same as a gateway's: its limiter
    /// holds the counters).
    pub fn handle(&self) -> GatewayHandle {
        self.handle.clone()
    }

    /// Serves until `shutdown` completes (or [`GatewayHandle::shutdown`]),
    /// reloading on SIGHUP and, with `gateway.watch`, when the file
    /// changes; then waits up to the shutdown timeout for the calls in
    /// flight.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> io::Result<()> {
        let h = self.handle.clone();
        let reload = tokio::spawn(self.reload);
        let shared = Arc::new(Shared {
            handle: h.clone(),
            seal: self.seal,
        });
        let limits: CurrentLimits = {
            let limiter = h.limiter().clone();
            Arc::new(move || limiter.limits())
        };
        let shed = LoadShedLayer::deferred(h.shedder().clone(), limits);
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_wait)
            .max_buf_size(self.max_head);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_header_list_size(self.max_head as u32);
        let graceful = GracefulShutdown::new();
        let mut stop = h.stop_watch();
        let stopped = async move {
            while !*stop.borrow_and_update() {
                if stop.changed().await.is_err() {
                    return;
                }
            }
        };
        tokio::pin!(shutdown);
        tokio::pin!(stopped);
        loop {
            let (stream, peer) = tokio::select! {
                r = self.listener.accept() => match r {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                },
                _ = &mut shutdown => break,
                _ = &mut stopped => break,
            };
            let _ = stream.set_nodelay(true);
            // one stack per connection, knowing its peer (the proxy)
            let limited = RateLimit::new(Allow, h.limiter().clone()).with_peer(peer);
            let stack = shed.layer(limited);
            let shared = shared.clone();
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                shared.clone().answer(req, stack.clone())
            });
            let conn = builder
                .serve_connection(TokioIo::new(stream), svc)
                .into_owned();
            let conn = graceful.watch(conn);
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "check connection ended with an error");
                }
            });
        }
        drop(self.listener);
        if tokio::time::timeout(self.shutdown_after, graceful.shutdown())
            .await
            .is_err()
        {
            tracing::warn!("shutdown timeout: closing the remaining connections");
        }
        reload.abort();
        Ok(())
    }
}

/// The layers a described request goes through: the gateway's shed and
/// limit layers, then [`Allow`].
type Stack = crate::shed::LoadShed<RateLimit<Allow, crate::GatewayStore, Arc<dyn Clock>>>;

/// The body of the stack's answers.
type StackBody = crate::shed::ShedBody<paceline_server::RateLimitBody<Empty<Bytes>>>;

/// The stack's call, boxed (so the answer's future is plainly `Send`).
type Calling =
    std::pin::Pin<Box<dyn Future<Output = Result<Response<StackBody>, Infallible>> + Send>>;

/// A body being read whole, boxed likewise.
type Collecting = std::pin::Pin<
    Box<dyn Future<Output = Result<http_body_util::Collected<Bytes>, Infallible>> + Send>,
>;

/// The future of one check request's answer.
type Answering =
    std::pin::Pin<Box<dyn Future<Output = Result<Response<Full<Bytes>>, Infallible>> + Send>>;

/// What every connection of a check shares.
struct Shared {
    handle: GatewayHandle,
    seal: Seal,
}

impl Shared {
    /// The answer to one check request.
    fn answer(self: Arc<Self>, req: Request<Incoming>, stack: Stack) -> Answering {
        // the body, if any, is never read
        let (parts, _body) = req.into_parts();
        let base = self.handle.limiter().limits().problem_base().to_string();
        let now = self.handle.limiter().clock().now();
        let ready = |res: Response<Bytes>| -> Answering {
            Box::pin(std::future::ready(Ok(res.map(Full::new))))
        };
        if let Some(sealed) = parts.headers.get(ANSWER) {
            return ready(match self.seal.open(sealed.as_bytes(), now) {
                Ok(res) => res,
                Err(why) => bad(&base, unopened(why)),
            });
        }
        let deny = match deny_status(&parts.headers) {
            Ok(d) => d,
            Err(detail) => return ready(bad(&base, detail)),
        };
        let call = match described(&parts.headers, &self.handle, &base) {
            Ok(req) => stack.oneshot(req),
            Err(res) => return ready(self.refused(*res, deny, now)),
        };
        let call: Calling = Box::pin(call);
        Box::pin(async move {
            let res = match call.await {
                Ok(r) => r,
                Err(never) => match never {},
            };
            let allowed = res.extensions().get::<Allowed>().is_some();
            let (parts, body) = res.into_parts();
            // every body here is the layers' own, whole at once (or empty)
            let collect: Collecting = Box::pin(body.collect());
            let body = match collect.await {
                Ok(c) => c.to_bytes(),
                Err(never) => match never {},
            };
            let res = Response::from_parts(parts, body);
            let res = match allowed {
                true => res,
                false => self.refused(res, deny, now),
            };
            Ok(res.map(Full::new))
        })
    }

    /// A refusal (or the usage document) as the proxy is to get it: the
    /// check request's own connection stays open (a refusal's unread body
    /// is the proxy's to deal with, not the check's), and, when the proxy
    /// asked for a deny status, a refusal gets it and is sealed.
    fn refused(
        &self,
        mut res: Response<Bytes>,
        deny: Option<StatusCode>,
        now: paceline_core::Nanos,
    ) -> Response<Bytes> {
        res.headers_mut().remove(CONNECTION);
        match deny {
            Some(status) if res.status().as_u16() >= 400 => {
                let sealed = self.seal.seal(&res, now);
                *res.status_mut() = status;
                res.headers_mut().insert(ANSWER, sealed);
                res
            }
            _ => res,
        }
    }
}

/// The status a check request asks refusals to be answered with, if any.
fn deny_status(h: &http::HeaderMap) -> Result<Option<StatusCode>, String> {
    let mut all = h.get_all(DENY_STATUS).iter();
    let (Some(v), None) = (all.next(), all.next()) else {
        return match h.contains_key(DENY_STATUS) {
            true => Err("Paceline-Deny-Status is sent twice.".to_string()),
            false => Ok(None),
        };
    };
    let code = std::str::from_utf8(v.as_bytes())
        .ok()
        .and_then(|s| s.trim().parse::<u16>().ok())
        .filter(|c| DENY_STATUSES.contains(c))
        .ok_or_else(|| "Paceline-Deny-Status takes 401 or 403.".to_string())?;
    Ok(StatusCode::from_u16(code).ok())
}

/// The described request, rebuilt and screened as the gateway screens
/// its own heads; or the answer refusing it.
fn described(
    check: &http::HeaderMap,
    handle: &GatewayHandle,
    base: &str,
) -> Result<Request<()>, Box<Response<Bytes>>> {
    let mut req = rebuild(check).map_err(|e| Box::new(bad(base, e.detail().to_string())))?;
    crate::front::screen(&mut req, &handle.paths())
        .map_err(|r| Box::new(crate::front::answer(&r, base)))?;
    Ok(req)
}

/// A `400` problem answer with `detail`.
fn bad(base: &str, detail: String) -> Response<Bytes> {
    problem::answer(&Problem::new(ProblemKind::BadRequest, base, detail))
}

fn unopened(why: Unopened) -> String {
    match why {
        Unopened::Forged => "Paceline-Answer is not an answer this check sealed.".to_string(),
        Unopened::Expired => {
            format!("Paceline-Answer expired: a sealed answer is opened within {SEALED_FOR_S} s.")
        }
    }
}

/// Marks the answer of [`Allow`]: a request the layers passed on.
#[derive(Clone, Copy, Debug)]
struct Allowed;

/// What the limit layer passes an admitted request on to: an empty `200`,
/// marked [`Allowed`], which the layer decorates with the fields.
#[derive(Clone, Copy, Debug)]
struct Allow;

impl tower_service::Service<Request<()>> for Allow {
    type Response = Response<Empty<Bytes>>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<Empty<Bytes>>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<()>) -> Self::Future {
        let mut res = Response::new(Empty::new());
        res.extensions_mut().insert(Allowed);
        res.headers_mut().insert(
            http::header::CACHE_CONTROL,
            HeaderValue::from_static("no-store"),
        );
        std::future::ready(Ok(res))
    }
}
