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
//!   the whole refusal sealed into [`ANSWER`] (`Paceline-Answer`); the
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

mod answer;
mod rebuild;
mod seal;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use paceline_core::{Clock, SystemClock};
use paceline_server::RateLimit;
use tokio::net::TcpListener;
use tower_layer::Layer;

pub use rebuild::{
    rebuild, Unreadable, FORWARDED_HOST, FORWARDED_METHOD, FORWARDED_URI, MAX_TARGET,
    ORIGINAL_METHOD, ORIGINAL_URI,
};
pub use seal::SEALED_FOR_S;

use crate::config::{GatewayConfig, Http1Server};
use crate::h1::{self, ClientBody};
use crate::idle::{Activity, Ended, Shutdown, TrackedCall};
use crate::server::{Gateway, GatewayHandle};
use crate::shed::{CurrentLimits, LoadShedLayer};
use answer::{Allow, Shared};
use seal::Seal;

/// Where `paceline check` listens unless told otherwise.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8081";

/// `Paceline-Deny-Status`: sent by a proxy that passes on only some
/// statuses from its check (nginx: `401`, `403`); a refusal is then
/// answered with that status and sealed into [`ANSWER`].
pub const DENY_STATUS: &str = "paceline-deny-status";

/// `Paceline-Answer`: a refusal sealed by the check; sent back to the
/// check, it is answered as it was made.
pub const ANSWER: &str = "paceline-answer";

/// A bound forward-auth check, ready to [`run`](Check::run).
pub struct Check {
    listener: TcpListener,
    addr: SocketAddr,
    handle: GatewayHandle,
    reload: std::pin::Pin<Box<dyn Future<Output = ()> + Send>>,
    seal: Seal,
    shutdown_after: Duration,
    /// The gateway's bound on a request head (the check request carries
    /// the original's fields and a few more).
    max_head: usize,
    /// How long a connection may go with no check in flight (a head never
    /// finished, or an idle keep-alive connection): `client_header_ms`.
    header_wait: Duration,
    /// The longest a caller may take nothing of an answer
    /// (`body_idle_ms`).
    stall: Duration,
    /// Who serves HTTP/1.1 connections (`gateway.http1_server`).
    http1: Http1Server,
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
        let http1 = config.settings.http1_server;
        let stall = config.settings.timeouts.body_idle;
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
            stall,
            http1,
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
        // as in the gateway, the head bound is kept per connection (the
        // idle timer below), not with a timer armed for every head
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(None)
            .max_buf_size(self.max_head);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_header_list_size(self.max_head as u32);
        let builder = Arc::new(builder);
        let graceful = Shutdown::new();
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
            let stack = shed.layer(h.keys().layer(limited));
            let shared = shared.clone();
            // as in the gateway: a connection with no check in flight for
            // the head bound is closed, whoever serves it
            let activity = Activity::new();
            let idle = activity.clone();
            let dispatch = Arc::new(move |req: Request<ClientBody>| {
                let busy = activity.start();
                TrackedCall::new(shared.clone().answer(req, stack.clone()), busy)
            });
            let (for_hyper, builder) = (dispatch.clone(), builder.clone());
            let hyper = move |io| {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    for_hyper(req.map(ClientBody::from))
                });
                builder.serve_connection(TokioIo::new(io), svc).into_owned()
            };
            // a check request has no body: the gateway's own connection
            // serves it, hyper whatever it hands over (h1/conn.rs)
            let dispatch = move |req| dispatch(req);
            let conn = h1::connection(
                stream,
                dispatch,
                hyper,
                self.http1,
                self.max_head,
                self.stall,
            );
            let (stop, bound) = (graceful.watcher(), self.header_wait);
            tokio::spawn(async move {
                match crate::idle::watched(conn, idle.idle_for(bound), stop).await {
                    Ended::Conn(Err(e)) => {
                        tracing::debug!(error = %e, "check connection ended with an error")
                    }
                    Ended::Conn(Ok(())) => {}
                    Ended::Idle => tracing::debug!("check connection idle too long: closed"),
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
