//! The gateway: accept connections, run the layers, reload, shut down.
//!
//! Each request goes through, in order: the head read once (`front.rs`:
//! the path in normal form, the forms an upstream could read two ways
//! refused), the load shedder (from the head: so a shed request is charged
//! to nothing), the rate limiter of `paceline-server` (which answers 429s
//! and the usage endpoint from the request head alone, before any of the
//! body is read), the admitted request's body intake and unit of
//! in-flight capacity (`admitted.rs`), the idempotency layer (on the
//! routes configured with `idempotency`: a retried write is replayed,
//! never run twice), and the [`Proxy`]. HTTP/1.1 and HTTP/2 are served on
//! the same port: in cleartext (HTTP/2 by prior knowledge), or with
//! `[gateway.tls]` over TLS (HTTP/2 by ALPN), each handshake in a task of
//! its own within the bounds of `tls/server.rs`.
//!
//! A reload (SIGHUP, a change to the file, or [`GatewayHandle::reload`])
//! swaps the limits (plans, keys, routes, dialects, problem base, ...),
//! the shedding settings, the webhook, the keys file and the TLS
//! certificate (for new connections) in place: the
//! counters live in one store that outlives every configuration, and no
//! connection is dropped. The settings only a restart applies (listen,
//! upstream, store, metrics, timeouts, the request-head bound, escalation,
//! soft limit) are named in [`ReloadEvent::Applied`].
//!
//! A request head longer than `gateway.max_head_bytes` (64 KiB by default,
//! the bound kept on upstream answer heads too) is answered `431` and its
//! connection closed: HTTP/1.1 by the size of the connection's read buffer,
//! HTTP/2 by the field-list size it announces
//! (`SETTINGS_MAX_HEADER_LIST_SIZE`; there the `431` is the `h2` layer's
//! own, the stream reset and the connection kept). An HTTP/2 stream may
//! have [`H2_STREAM_WINDOW`] bytes of its body unread in the gateway, the
//! bound the read-ahead of `intake.rs` counts on. A configuration that
//! fails validation is refused and the old one keeps serving.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use paceline_core::{Clock, MemoryStore, SystemClock};

use crate::store::GatewayStore;
use paceline_server::{Limits, RateLimit, RateLimiter, RouteWanted};
use parking_lot::RwLock;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tower_layer::Layer;

use crate::admitted::Admitted;
use crate::config::{ConfigFileError, GatewayConfig, Http1Server, Settings};
use crate::edge::{HeadBytes, Metered};
use crate::h1::{self, ClientBody};
use crate::idle::{Activity, Ended, Shutdown, TrackedCall};
use crate::intake::Intake;
use crate::metrics as m;
use crate::proxy::Proxy;
use crate::shed::{CurrentLimits, LoadShedLayer, Shedder};
use crate::tls::server::TlsFront;
use paceline_server::ClientCert;

/// The flow-control window of an HTTP/2 request stream: the most of its
/// body a client may send before the gateway has passed it on (the
/// protocol's initial 65,535 bytes, rounded up).
pub(crate) const H2_STREAM_WINDOW: u32 = 64 * 1024;

/// The limiter a gateway runs: its store (in memory, or Redis) and a
/// shared clock.
pub type GatewayLimiter = RateLimiter<GatewayStore, Arc<dyn Clock>>;

/// What a reload did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReloadEvent {
    /// The new limits and shedding settings are in force; the notes list
    /// settings that only a restart applies.
    Applied {
        /// Settings that changed but need a restart.
        notes: Vec<String>,
    },
    /// The new configuration was refused; the old one keeps serving.
    Refused(ConfigFileError),
}

/// Told about every reload triggered by a signal or a file change.
pub type ReloadCallback = Arc<dyn Fn(&ReloadEvent) + Send + Sync>;

/// A bound gateway, ready to [`run`](Gateway::run).
pub struct Gateway {
    listener: TcpListener,
    addr: SocketAddr,
    metrics: Option<(TcpListener, SocketAddr)>,
    handle: GatewayHandle,
    on_reload: Option<ReloadCallback>,
    /// The configuration files' stamps when they were read: a change
    /// after that, even one made before the watcher first looks, reloads.
    stamps: Vec<Option<(SystemTime, u64)>>,
    #[cfg(unix)]
    hangup: Option<tokio::signal::unix::Signal>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// Controls a running gateway; cheap to clone.
#[derive(Clone)]
pub struct GatewayHandle {
    inner: Arc<HandleInner>,
}

impl std::fmt::Debug for GatewayHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayHandle").finish_non_exhaustive()
    }
}

struct HandleInner {
    limiter: GatewayLimiter,
    shedder: Shedder,
    intake: Intake,
    settings: RwLock<Settings>,
    sources: RwLock<Vec<PathBuf>>,
    /// The configuration file a reload reads, if there is one.
    file: Option<PathBuf>,
    /// The client-facing TLS, with `[gateway.tls]`.
    tls: RwLock<Option<Arc<TlsFront>>>,
    /// Keys looked up in Redis before the limiter, with
    /// `[gateway.keys_redis]`.
    keys: crate::keys::Keys,
    /// The plan charged for every request passed on (`global_plan`).
    global: Arc<crate::global::GlobalLimit>,
    stop: watch::Sender<bool>,
}

/// A listener that could not be bound, named by its setting and address
/// (the gateway binds more than one).
fn bind_error(field: &str, addr: SocketAddr, e: io::Error) -> io::Error {
    io::Error::new(
        e.kind(),
        format!("{field} = \"{addr}\": cannot listen there: {e}"),
    )
}

impl Gateway {
    /// Binds the listeners of `config`, reading time from the system clock.
    /// An address that cannot be bound is named in the error, with its
    /// setting (`gateway.listen`, `gateway.metrics_listen`).
    pub async fn bind(config: GatewayConfig) -> io::Result<Gateway> {
        Gateway::bind_with_clock(config, Arc::new(SystemClock::new())).await
    }

    /// Binds with an explicit clock (tests use a manual one): the limiter
    /// decides by it, and the shed layer's latencies and the upstream
    /// pool's ages are read from it (tokio's timers keep their own time).
    pub async fn bind_with_clock(
        config: GatewayConfig,
        clock: Arc<dyn Clock>,
    ) -> io::Result<Gateway> {
        let s = config.settings.clone();
        let listener = TcpListener::bind(s.listen)
            .await
            .map_err(|e| bind_error("gateway.listen", s.listen, e))?;
        let addr = listener.local_addr()?;
        let metrics = match s.metrics_listen {
            Some(a) => {
                let l = TcpListener::bind(a)
                    .await
                    .map_err(|e| bind_error("gateway.metrics_listen", a, e))?;
                let a = l.local_addr()?;
                Some((l, a))
            }
            None => None,
        };
        let hasher = config.limits.key_hasher();
        match hasher.origin() {
            paceline_server::SecretOrigin::Random => tracing::warn!("{}", hasher.statement()),
            _ => tracing::info!("{}", hasher.statement()),
        }
        let shedder = Shedder::with_clock(s.shedding, clock.clone());
        let intake = Intake::new(s.limits, s.timeouts, s.paths, clock.clone());
        let store = open_store(&s, config.limits.key_hasher()).await?;
        let limiter = RateLimiter::new(config.limits.clone(), store, clock);
        let keys = crate::keys::Keys::new(s.keys_redis.as_ref(), limiter.store(), &limiter);
        if let Some(uri) = &s.soft_limit_webhook {
            limiter.set_soft_limit_hook(crate::webhook::webhook(uri.clone()));
        }
        for w in &config.warnings {
            tracing::warn!("{w}");
        }
        let tls = match &s.tls {
            Some(t) => Some(Arc::new(
                TlsFront::new(t, intake.buffered.clone()).map_err(|e| {
                    io::Error::new(io::ErrorKind::InvalidInput, format!("gateway.tls: {e}"))
                })?,
            )),
            None => None,
        };
        let global = crate::global::GlobalLimit::new(global_plan(&s, &config.limits));
        let (stop, _) = watch::channel(false);
        let handle = GatewayHandle {
            inner: Arc::new(HandleInner {
                limiter,
                shedder,
                intake,
                settings: RwLock::new(s),
                sources: RwLock::new(config.sources.clone()),
                file: config.file.clone(),
                tls: RwLock::new(tls),
                keys,
                global,
                stop,
            }),
        };
        #[cfg(unix)]
        let hangup = match handle.inner.file.is_none() {
            true => None,
            false => Some(tokio::signal::unix::signal(
                tokio::signal::unix::SignalKind::hangup(),
            )?),
        };
        Ok(Gateway {
            listener,
            addr,
            metrics,
            stamps: handle.stamps(),
            handle,
            on_reload: None,
            #[cfg(unix)]
            hangup,
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The metrics address, if metrics are served.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(|(_, a)| *a)
    }

    /// A handle to reload or stop it.
    pub fn handle(&self) -> GatewayHandle {
        self.handle.clone()
    }

    /// Sets the callback told about reloads from signals and file changes
    /// (without one, they are logged through `tracing`).
    pub fn on_reload(mut self, f: impl Fn(&ReloadEvent) + Send + Sync + 'static) -> Self {
        self.on_reload = Some(Arc::new(f));
        self
    }

    /// Serves until `shutdown` completes (or [`GatewayHandle::shutdown`]),
    /// then stops accepting and waits up to the shutdown timeout for
    /// requests in flight to finish.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> io::Result<()> {
        let h = self.handle.clone();
        let settings = h.inner.settings.read().clone();
        let t = settings.timeouts;
        let proxy = Proxy::build(
            &settings.upstream,
            &settings.upstream_tls,
            settings.upstream_protocol,
            t,
            current_limits(&h),
            // the gateway's one clock, the limiter's
            h.inner.limiter.clock().clone(),
        )?;
        let shed = shed_layer(&h);
        let idempotency = crate::idempotency::layer(&h.inner.limiter);
        let mut builder = auto::Builder::new(TokioExecutor::new());
        // the client header bound is kept per connection (see `idle`), not
        // with a timer armed for every request head
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(None)
            .writev(false)
            .max_buf_size(settings.max_head_bytes);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_header_list_size(settings.max_head_bytes as u32)
            .initial_stream_window_size(H2_STREAM_WINDOW);
        let graceful = Shutdown::new();
        let serving = Arc::new(Serving {
            route_wanted: route_wanted(&h.inner.shedder),
            h: h.clone(),
            proxy,
            shed,
            idempotency,
            builder,
            max_head: settings.max_head_bytes,
            bound: t.client_header,
            stall: t.body_idle,
            http1: settings.http1_server,
        });
        let tls = h.inner.tls.read().clone();
        let mut tasks = Vec::new();
        if let Some((l, _)) = self.metrics {
            let degraded_ok = settings
                .redis
                .as_ref()
                .is_some_and(|r| r.ready_when_degraded);
            let probe = crate::ops::store_probe(h.inner.limiter.store().clone(), degraded_ok);
            tasks.push(tokio::spawn(crate::ops::serve(l, Some(probe))));
        }
        tasks.push(tokio::spawn(watch_config(
            h.clone(),
            self.on_reload.clone(),
            self.stamps,
            #[cfg(unix)]
            self.hangup,
        )));
        let mut stop = h.inner.stop.subscribe();
        let stopped = async move {
            loop {
                let now = *stop.borrow_and_update();
                if now || stop.changed().await.is_err() {
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
                        // out of descriptors and the like: breathe, go on
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                },
                _ = &mut shutdown => break,
                _ = &mut stopped => break,
            };
            let _ = stream.set_nodelay(true);
            match &tls {
                None => serving.serve(stream, peer, Link::Cleartext, graceful.watcher()),
                Some(front) => {
                    // the handshake in a task of its own, within its bounds
                    let (front, serving) = (front.clone(), serving.clone());
                    let watcher = graceful.watcher();
                    tokio::spawn(async move {
                        match front.accept(stream).await {
                            Ok(a) => serving.serve(a.stream, peer, Link::Tls(a.client), watcher),
                            Err(e) => tracing::debug!(%peer, reason = %e, "TLS handshake refused"),
                        }
                    });
                }
            }
        }
        drop(self.listener);
        tracing::info!("shutting down: waiting for requests in flight");
        if tokio::time::timeout(t.shutdown, graceful.shutdown())
            .await
            .is_err()
        {
            tracing::warn!("shutdown timeout: closing the remaining connections");
        }
        for task in tasks {
            task.abort();
        }
        Ok(())
    }
}

/// What every connection of a gateway is served with.
struct Serving {
    h: GatewayHandle,
    proxy: Proxy,
    shed: LoadShedLayer,
    idempotency: crate::idempotency::GatewayIdempotency,
    /// Which requests the limit layer leaves their route to.
    route_wanted: RouteWanted,
    builder: auto::Builder<TokioExecutor>,
    max_head: usize,
    bound: Duration,
    /// The longest a client may take nothing of an answer on the own
    /// HTTP/1.1 connection (`body_idle_ms`).
    stall: Duration,
    /// Who serves HTTP/1.1 connections.
    http1: Http1Server,
}

/// Whether a stage after the limit layer reads a request's route: the
/// idempotency layer, on the methods it looks at, and the admitted stage,
/// for the criticality its unit of in-flight capacity is taken at, while
/// shedding is on (asked per request: a reload may turn it on).
fn route_wanted(shedder: &Shedder) -> RouteWanted {
    let shedder = shedder.clone();
    Arc::new(move |method: &http::Method| {
        paceline_server::idempotency::applies_to(method) || shedder.settings().max_in_flight > 0
    })
}

/// How a client connection came in.
enum Link {
    /// Plain TCP.
    Cleartext,
    /// TLS, its handshake done, with the client's verified certificate
    /// under mutual TLS.
    Tls(Option<ClientCert>),
}

impl Serving {
    /// Serves the connection `io` from `peer` (a TCP socket, or a TLS
    /// stream whose handshake is done, as `link` says) in a task of its
    /// own.
    fn serve<T>(self: &Arc<Self>, io: T, peer: SocketAddr, link: Link, stop: watch::Receiver<()>)
    where
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let h = &self.h;
        // a stack per connection, knowing its peer: no address to put
        // into every request
        let keyed = self.idempotency.for_peer(peer).layer(
            self.proxy
                .with_peer(peer)
                .with_tls(matches!(link, Link::Tls(_))),
        );
        let client = match link {
            Link::Tls(client) => client,
            Link::Cleartext => None,
        };
        let retry = h.inner.shedder.settings().retry_after_s;
        let admitted = Admitted::new(
            keyed,
            h.inner.intake.clone(),
            h.inner.shedder.clone(),
            peer.ip(),
            current_limits(h),
            retry,
            (h.inner.global.clone(), h.inner.limiter.clone()),
        );
        let limited = RateLimit::new(admitted, h.inner.limiter.clone())
            .route_extension_if(self.route_wanted.clone());
        let stack = self.shed.layer(h.inner.keys.layer(limited.with_peer(peer)));
        let activity = Activity::new();
        let watched = activity.clone();
        let head = HeadBytes::new(h.inner.intake.buffered.clone(), self.max_head);
        let metered = Metered {
            head: head.clone(),
            activity: activity.clone(),
        };
        let (intake, limits) = (h.inner.intake.clone(), current_limits(h));
        let shedder = h.inner.shedder.clone();
        let dispatch = Arc::new(move |mut req: Request<ClientBody>| {
            let busy = activity.start();
            head.dispatched();
            if let Some(c) = &client {
                req.extensions_mut().insert(c.clone());
            }
            // decided up to the stack's call here: a head refused or
            // rejected costs no clone of the stack and no boxed future
            let retry = || shedder.settings().retry_after_s;
            let call = intake.serve(&stack, req, &limits, retry);
            TrackedCall::new(call, busy)
        });
        let (io, left) = crate::edge::EdgeIo::new(io);
        let io = io.metered(metered);
        let serving = self.clone();
        let for_hyper = dispatch.clone();
        let hyper = move |io| {
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                for_hyper(req.map(ClientBody::from))
            });
            serving
                .builder
                .serve_connection(TokioIo::new(io), svc)
                .into_owned()
        };
        let dispatch = move |req| dispatch(req);
        let conn = h1::connection(io, dispatch, hyper, self.http1, self.max_head, self.stall);
        let bound = self.bound;
        let (limiter, max_head) = (h.inner.limiter.clone(), self.max_head);
        tokio::spawn(async move {
            let mut error = None;
            match crate::idle::watched(conn, watched.idle_for(bound), stop).await {
                Ended::Conn(Err(e)) => {
                    tracing::debug!(error = %e, "connection ended with an error");
                    error = Some(e);
                }
                Ended::Conn(Ok(())) => {}
                Ended::Idle => tracing::debug!("connection idle too long: closed"),
            }
            let base = || limiter.limits().problem_base().to_string();
            crate::edge::finish(left, error, max_head, base, bound).await;
        });
    }
}

impl Gateway {
    /// The bound listener, the handle and the task that reloads the
    /// configuration (SIGHUP, a changed file), for a server that answers
    /// with the gateway's decisions another way: the forward-auth check
    /// (`check/`).
    pub(crate) fn into_check_parts(
        self,
    ) -> (
        TcpListener,
        GatewayHandle,
        impl Future<Output = ()> + Send + 'static,
    ) {
        let reload = watch_config(
            self.handle.clone(),
            self.on_reload,
            self.stamps,
            #[cfg(unix)]
            self.hangup,
        );
        (self.listener, self.handle, reload)
    }
}

impl GatewayHandle {
    /// The path settings in force (`[gateway.paths]`).
    pub(crate) fn paths(&self) -> crate::config::PathSettings {
        self.inner.settings.read().paths
    }

    /// The key lookup before the limiter (`[gateway.keys_redis]`).
    pub(crate) fn keys(&self) -> &crate::keys::Keys {
        &self.inner.keys
    }

    /// Told when [`GatewayHandle::shutdown`] is called.
    pub(crate) fn stop_watch(&self) -> watch::Receiver<bool> {
        self.inner.stop.subscribe()
    }
}

/// The shed layer decides from the head; an admitted request takes its
/// unit of in-flight capacity once its body can flow (`admitted.rs`).
fn shed_layer(h: &GatewayHandle) -> LoadShedLayer {
    LoadShedLayer::deferred(h.inner.shedder.clone(), current_limits(h))
}

/// The limits in force at each call, reloads included.
/// The plan `global_plan` names, from `limits` (checked to be there when
/// the configuration was read).
fn global_plan(s: &Settings, limits: &Limits) -> Option<paceline_core::Plan> {
    s.global_plan
        .as_deref()
        .and_then(|name| limits.plan(name).cloned())
}

fn current_limits(h: &GatewayHandle) -> CurrentLimits {
    let limiter = h.inner.limiter.clone();
    Arc::new(move || limiter.limits())
}

impl GatewayHandle {
    /// The rate limiter (its store holds the counters).
    pub fn limiter(&self) -> &GatewayLimiter {
        &self.inner.limiter
    }

    /// The shedder.
    pub fn shedder(&self) -> &Shedder {
        &self.inner.shedder
    }

    /// The bytes held now for clients in request heads (unfinished, or of
    /// requests in flight), in request bodies waiting in their intake, and
    /// as the read-ahead of bodies streaming upstream (bounded by
    /// `gateway.limits.max_buffered_bytes`).
    pub fn buffered_bytes(&self) -> usize {
        self.inner.intake.buffered.held()
    }

    /// The requests receiving their bodies in an intake now (bounded by
    /// `gateway.limits.max_receiving`).
    pub fn receiving(&self) -> u32 {
        self.inner.intake.receiving.taken()
    }

    /// The TLS handshakes with clients in progress now (0 in cleartext).
    pub fn tls_handshakes(&self) -> usize {
        self.inner
            .tls
            .read()
            .as_ref()
            .map_or(0, |f| f.in_progress())
    }

    /// Stops accepting and starts the graceful shutdown.
    pub fn shutdown(&self) {
        self.inner.stop.send_replace(true);
    }

    /// Reads the configuration file again and applies it, or refuses it.
    pub fn reload(&self) -> ReloadEvent {
        let Some(path) = self.inner.file.clone() else {
            return ReloadEvent::Applied {
                notes: vec!["no configuration file to reload".to_string()],
            };
        };
        let event = match GatewayConfig::load(&path) {
            Ok(cfg) => ReloadEvent::Applied {
                notes: self.apply(cfg),
            },
            Err(e) => ReloadEvent::Refused(e),
        };
        m::reload(matches!(event, ReloadEvent::Applied { .. }));
        event
    }

    /// Applies a validated configuration: the limits (read by the limiter
    /// and the shedder alike), shedding, the webhook, the keys file and
    /// watching at once; returns the settings that changed and need a
    /// restart.
    pub fn apply(&self, cfg: GatewayConfig) -> Vec<String> {
        let new = cfg.settings;
        let (notes, webhook_changed) = {
            let old = self.inner.settings.read();
            let notes = restart_notes(&old, &self.inner.limiter.limits(), &new, &cfg.limits);
            (notes, old.soft_limit_webhook != new.soft_limit_webhook)
        };
        if webhook_changed {
            match &new.soft_limit_webhook {
                Some(uri) => self
                    .inner
                    .limiter
                    .set_soft_limit_hook(crate::webhook::webhook(uri.clone())),
                None => self.inner.limiter.clear_soft_limit_hook(),
            }
        }
        self.inner.global.set(global_plan(&new, &cfg.limits));
        self.inner.limiter.reload(cfg.limits);
        self.inner.shedder.set_settings(new.shedding);
        let mut notes = notes;
        if let (Some(front), Some(t)) = (&*self.inner.tls.read(), &new.tls) {
            // read and checked by the load already: this reads them again,
            // and a file changed in between keeps the old certificate
            if let Err(e) = front.reload(t) {
                notes.push(format!(
                    "gateway.tls: the certificate in force keeps serving: {e}"
                ));
            }
        }
        *self.inner.sources.write() = cfg.sources;
        let mut s = self.inner.settings.write();
        s.shedding = new.shedding;
        s.soft_limit_webhook = new.soft_limit_webhook;
        s.watch = new.watch;
        s.global_plan = new.global_plan;
        if s.tls.is_some() && new.tls.is_some() {
            s.tls = new.tls;
        }
        notes
    }

    fn stamps(&self) -> Vec<Option<(SystemTime, u64)>> {
        self.inner
            .sources
            .read()
            .iter()
            .map(|p| {
                let md = std::fs::metadata(p).ok()?;
                Some((md.modified().ok()?, md.len()))
            })
            .collect()
    }
}

/// The store the settings name: in memory, or Redis (connected lazily, so
/// a server that is down at start only makes the first decisions fail
/// open or closed, per policy).
async fn open_store(s: &Settings, hasher: &paceline_server::KeyHasher) -> io::Result<GatewayStore> {
    match s.store {
        #[cfg(feature = "redis")]
        crate::config::StoreKind::Redis => {
            let r = s.redis.as_ref().ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, "gateway.redis is missing")
            })?;
            if matches!(hasher.origin(), paceline_server::SecretOrigin::Random) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "store = \"redis\" needs the same key-hash secret on every instance (gateway.key_hash_secret_file or PACELINE_KEY_HASH_SECRET); a random one per process would make each count alone",
                ));
            }
            let mut config = r.store_config();
            // key names under the deployment's secret, derived so that they
            // tell nothing of the hashes in logs
            config.key_secret = hasher.derive("redis key names").to_vec();
            paceline_redis::RedisStore::connect(config)
                .await
                .map(GatewayStore::Redis)
                .map_err(|e| io::Error::other(format!("gateway.redis.{e}")))
        }
        _ => {
            let _ = hasher; // the memory store's keys never leave the process
            Ok(GatewayStore::Memory(MemoryStore::new()))
        }
    }
}

/// The settings that changed from `old` to `new` and take a restart to
/// apply, as notes. Every setting of [`Settings`] is named here, so a new
/// one is either applied by [`GatewayHandle::apply`] or noted.
fn restart_notes(
    old: &Settings,
    old_limits: &Limits,
    new: &Settings,
    limits: &Limits,
) -> Vec<String> {
    let Settings {
        listen,
        upstream,
        store,
        redis,
        metrics_listen,
        timeouts,
        // applied: the hook is replaced or removed
        soft_limit_webhook: _,
        // applied: the shedder's settings are replaced
        shedding: _,
        // applied: read at every tick of the watcher
        watch: _,
        max_head_bytes,
        limits: gateway_limits,
        paths,
        // applied to new connections; turning TLS on or off is noted below
        tls,
        upstream_tls,
        upstream_protocol,
        http1_server,
        keys_redis,
        // applied: the global limit's plan is replaced
        global_plan: _,
    } = new;
    let mut notes = Vec::new();
    let mut note = |name: &str, changed: bool| {
        if changed {
            notes.push(format!("{name} changed; restart to apply it"));
        }
    };
    // bound, built or spawned once, when the gateway starts
    note("gateway.listen", old.listen != *listen);
    note("gateway.upstream", old.upstream != *upstream);
    note("gateway.store", old.store != *store);
    note("gateway.redis", old.redis != *redis);
    note(
        "gateway.metrics_listen",
        old.metrics_listen != *metrics_listen,
    );
    note("gateway.timeouts", old.timeouts != *timeouts);
    note(
        "gateway.max_head_bytes",
        old.max_head_bytes != *max_head_bytes,
    );
    note("gateway.limits", old.limits != *gateway_limits);
    note("gateway.paths", old.paths != *paths);
    note("gateway.tls", old.tls.is_some() != tls.is_some());
    note("gateway.upstream_tls", old.upstream_tls != *upstream_tls);
    note(
        "gateway.upstream_protocol",
        old.upstream_protocol != *upstream_protocol,
    );
    note("gateway.http1_server", old.http1_server != *http1_server);
    note("gateway.keys_redis", old.keys_redis != *keys_redis);
    // the limiter keeps these from its construction
    note("escalation", old_limits.escalation() != limits.escalation());
    // the idempotency layer and its store are built once (each route's
    // mode reloads with the routes)
    // (its problem base follows the limits in force)
    let (mut was, now) = (old_limits.idempotency().clone(), limits.idempotency());
    was.problem_base.clone_from(&now.problem_base);
    note("idempotency", was != *now);
    note("soft_limit", old_limits.soft_limit() != limits.soft_limit());
    notes
}

/// Reloads on SIGHUP and, when watching is on, when a source file changes.
async fn watch_config(
    h: GatewayHandle,
    on_reload: Option<ReloadCallback>,
    mut stamps: Vec<Option<(SystemTime, u64)>>,
    #[cfg(unix)] mut hangup: Option<tokio::signal::unix::Signal>,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        #[cfg(unix)]
        let hup = async {
            match &mut hangup {
                Some(s) => s.recv().await,
                None => std::future::pending().await,
            }
        };
        #[cfg(not(unix))]
        let hup = std::future::pending::<Option<()>>();
        let reload = tokio::select! {
            _ = hup => true,
            _ = tick.tick() => {
                let now = h.stamps();
                let changed = h.inner.file.is_some()
                    && h.inner.settings.read().watch
                    && now != stamps;
                stamps = now;
                changed
            }
        };
        if reload {
            let event = h.reload();
            stamps = h.stamps();
            match (&on_reload, &event) {
                (Some(f), _) => f(&event),
                (None, ReloadEvent::Applied { notes }) => {
                    tracing::info!(?notes, "configuration reloaded")
                }
                (None, ReloadEvent::Refused(e)) => {
                    tracing::error!(error = %e, "configuration refused; the old one keeps serving")
                }
            }
        }
    }
}

/// Serves `GET /metrics` in the Prometheus text format, `GET /healthz`
/// and `GET /readyz` (ready whenever the process serves) on `listener`
/// (`paceline rls`'s metrics listener; the gateway's own also asks its
/// store, see `ops.rs`).
pub async fn serve_metrics(listener: TcpListener) {
    crate::ops::serve(listener, None).await
}

/// Completes on SIGTERM or Ctrl-C. The handlers are installed when this is
/// called, not when the future is first polled.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send {
    #[cfg(unix)]
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let ctrl_c = tokio::signal::ctrl_c();
    async move {
        #[cfg(unix)]
        {
            let term = async {
                match term {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = term => {}
                _ = ctrl_c => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = ctrl_c.await;
        }
    }
}
