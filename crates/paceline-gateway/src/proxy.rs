//! The forwarding service: one request to the upstream and its response
//! back, both bodies streamed.
//!
//! It keeps a pool of keep-alive HTTP/1.1 connections to the upstream (its
//! own, small: a stack of idle senders, a connection going back on it the
//! moment its response body ends), strips hop-by-hop fields both ways, appends the client to
//! `X-Forwarded-For`, and bounds every phase: connecting, waiting for the
//! response head, and every pause inside either body. An upstream that
//! cannot be reached gives `502`, one too slow to answer `504`.

use std::convert::Infallible;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::{Authority, PathAndQuery};
use http::{Request, Response, StatusCode, Uri, Version};
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::client::conn::http1::{self as h1, SendRequest};
use hyper_util::rt::TokioIo;
use paceline_server::PeerAddr;
use parking_lot::Mutex;
use pin_project_lite::pin_project;
use tokio::net::TcpStream;
use tokio::time::Sleep;
use tower_service::Service;

use crate::config::Timeouts;
use crate::metrics as m;
use crate::shed::Shedder;

/// Errors inside a streamed body.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of every response the gateway sends.
pub type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// The request body sent upstream: the client's, with an idle bound.
type UpstreamBody = IdleTimeout<Incoming>;

/// Forwards requests to one upstream. Clones share the connection pool.
#[derive(Clone)]
pub struct Proxy {
    inner: Arc<ProxyInner>,
}

struct ProxyInner {
    pool: Pool,
    target: Target,
    timeouts: Timeouts,
    shedder: Option<Shedder>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("upstream", &self.inner.target.authority)
            .finish_non_exhaustive()
    }
}

struct Target {
    authority: Authority,
    /// The upstream's base path without a trailing `/` (often empty).
    base: String,
}

impl Proxy {
    /// A proxy to `upstream` (`http://host:port[/base]`); the shedder, if
    /// any, is told every upstream latency.
    pub fn new(upstream: &Uri, timeouts: Timeouts, shedder: Option<Shedder>) -> Self {
        let parts = upstream.clone().into_parts();
        let target = Target {
            authority: parts
                .authority
                .unwrap_or_else(|| Authority::from_static("127.0.0.1")),
            base: parts
                .path_and_query
                .map(|p| p.path().trim_end_matches('/').to_string())
                .unwrap_or_default(),
        };
        let host = target.authority.host();
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        let pool = Pool {
            idle: Mutex::new(Vec::new()),
            host: host.to_string(),
            port: target.authority.port_u16().unwrap_or(80),
            connect_timeout: timeouts.connect,
            idle_timeout: timeouts.pool_idle,
        };
        Proxy {
            inner: Arc::new(ProxyInner {
                pool,
                target,
                timeouts,
                shedder,
            }),
        }
    }

    /// The request target sent upstream, in origin form: the upstream's
    /// base path, then the client's path and query.
    fn upstream_uri(&self, uri: &Uri) -> Uri {
        let target = &self.inner.target;
        let pq = match (uri.path_and_query(), target.base.is_empty()) {
            (Some(pq), true) => pq.clone(),
            (pq, _) => {
                let pq = pq.map_or("/", PathAndQuery::as_str);
                match PathAndQuery::try_from(format!("{}{}", target.base, pq)) {
                    Ok(p) => p,
                    Err(_) => PathAndQuery::from_static("/"),
                }
            }
        };
        Uri::from(pq)
    }

    /// Forwards one request.
    pub async fn forward(&self, req: Request<Incoming>) -> Response<ProxyBody> {
        let this = &*self.inner;
        let (mut parts, body) = req.into_parts();
        let peer = parts.extensions.get::<PeerAddr>().map(|p| p.0.ip());
        let host = original_host(&parts.uri, &parts.headers);
        strip_hop_by_hop(&mut parts.headers);
        let host = match host {
            Some(h) => h,
            None => HeaderValue::from_str(this.target.authority.as_str())
                .unwrap_or_else(|_| HeaderValue::from_static("localhost")),
        };
        parts.headers.insert(header::HOST, host);
        if let Some(ip) = peer {
            append_forwarded_for(&mut parts.headers, ip);
        }
        parts
            .headers
            .insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
        parts.uri = self.upstream_uri(&parts.uri);
        parts.version = Version::HTTP_11;
        let body = IdleTimeout::new(body, this.timeouts.body_idle);
        let out = Request::from_parts(parts, body);
        let started = Instant::now();
        let sent = tokio::time::timeout(this.timeouts.upstream_header, this.pool.send(out));
        match sent.await {
            Ok(Ok((res, conn))) => {
                let took = started.elapsed();
                m::upstream_latency(took);
                if let Some(s) = &this.shedder {
                    s.record_latency(took);
                }
                let (mut parts, body) = res.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                let body = Recycle::new(body, conn, self.inner.clone());
                let body = IdleTimeout::new(body, this.timeouts.body_idle);
                Response::from_parts(parts, body.boxed_unsync())
            }
            Ok(Err(e)) => {
                let connect = matches!(e, SendError::Connect(_));
                m::upstream_error(if connect { "connect" } else { "request" });
                tracing::warn!(error = %e, "upstream request failed");
                let detail = match connect {
                    true => "The upstream could not be reached.",
                    false => "The upstream failed before answering.",
                };
                gateway_error(StatusCode::BAD_GATEWAY, detail)
            }
            Err(_) => {
                m::upstream_error("timeout");
                tracing::warn!(
                    timeout_ms = this.timeouts.upstream_header.as_millis() as u64,
                    "upstream timed out"
                );
                gateway_error(
                    StatusCode::GATEWAY_TIMEOUT,
                    "The upstream did not answer in time.",
                )
            }
        }
    }
}

impl Service<Request<Incoming>> for Proxy {
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.forward(req).await) })
    }
}

/// Idle connections kept per upstream at most.
const MAX_IDLE: usize = 1024;

/// Keep-alive HTTP/1.1 connections to one upstream. Each connection runs
/// as its own task; the pool keeps the idle senders, the most recently
/// used on top.
struct Pool {
    idle: Mutex<Vec<IdleConn>>,
    host: String,
    port: u16,
    connect_timeout: Duration,
    idle_timeout: Duration,
}

struct IdleConn {
    tx: SendRequest<UpstreamBody>,
    since: Instant,
}

/// Why a request got no response.
#[derive(Debug)]
enum SendError {
    /// No connection could be opened.
    Connect(BoxError),
    /// The connection failed while the request was under way.
    Request(hyper::Error),
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Connect(e) => write!(f, "connect: {e}"),
            SendError::Request(e) => write!(f, "request: {e}"),
        }
    }
}

impl Pool {
    /// An idle connection that is still open and not too old.
    fn take(&self) -> Option<SendRequest<UpstreamBody>> {
        let mut idle = self.idle.lock();
        while let Some(c) = idle.pop() {
            if !c.tx.is_closed() && c.since.elapsed() < self.idle_timeout {
                return Some(c.tx);
            }
        }
        None
    }

    /// Puts a connection whose exchange is over back on the stack.
    fn put(&self, tx: SendRequest<UpstreamBody>) {
        if tx.is_closed() {
            return;
        }
        let now = Instant::now();
        let mut idle = self.idle.lock();
        // the oldest are at the bottom: drop the ones idle too long
        let stale = idle
            .iter()
            .take_while(|c| now.duration_since(c.since) >= self.idle_timeout)
            .count();
        if stale > 0 {
            idle.drain(..stale);
        }
        if idle.len() < MAX_IDLE {
            idle.push(IdleConn { tx, since: now });
        }
    }

    async fn connect(&self) -> Result<SendRequest<UpstreamBody>, SendError> {
        let dial = TcpStream::connect((self.host.as_str(), self.port));
        let stream = match tokio::time::timeout(self.connect_timeout, dial).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(SendError::Connect(Box::new(e))),
            Err(_) => return Err(SendError::Connect("connect timed out".into())),
        };
        let _ = stream.set_nodelay(true);
        // heads and small bodies in one buffer: one plain write each
        let (tx, conn) = h1::Builder::new()
            .writev(false)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| SendError::Connect(Box::new(e)))?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "upstream connection ended with an error");
            }
        });
        Ok(tx)
    }

    /// Sends `req` on an idle connection, or a new one. A request that a
    /// reused connection refused before sending any of it (the upstream
    /// closed it meanwhile) is tried again on another.
    async fn send(
        &self,
        mut req: Request<UpstreamBody>,
    ) -> Result<(Response<Incoming>, SendRequest<UpstreamBody>), SendError> {
        loop {
            let (mut tx, reused) = match self.take() {
                Some(tx) => (tx, true),
                None => (self.connect().await?, false),
            };
            if let Err(e) = tx.ready().await {
                match reused {
                    true => continue,
                    false => return Err(SendError::Request(e)),
                }
            }
            match tx.try_send_request(req).await {
                Ok(res) => return Ok((res, tx)),
                Err(mut e) => match e.take_message() {
                    Some(r) if reused => req = r,
                    _ => return Err(SendError::Request(e.into_error())),
                },
            }
        }
    }
}

pin_project! {
    /// A response body that hands its connection back to the pool as soon
    /// as it ends. A body dropped before its end takes the connection with
    /// it.
    struct Recycle<B> {
        #[pin]
        body: B,
        conn: Option<(SendRequest<UpstreamBody>, Arc<ProxyInner>)>,
    }
}

impl<B: Body> Recycle<B> {
    fn new(body: B, tx: SendRequest<UpstreamBody>, owner: Arc<ProxyInner>) -> Self {
        let mut r = Recycle {
            body,
            conn: Some((tx, owner)),
        };
        if r.body.is_end_stream() {
            r.give_back();
        }
        r
    }

    fn give_back(&mut self) {
        if let Some((tx, owner)) = self.conn.take() {
            owner.pool.put(tx);
        }
    }
}

impl<B: Body> Body for Recycle<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let mut this = self.project();
        let polled = this.body.as_mut().poll_frame(cx);
        let ended = match &polled {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(_))) => this.body.is_end_stream(),
            _ => false,
        };
        if ended {
            if let Some((tx, owner)) = this.conn.take() {
                owner.pool.put(tx);
            }
        }
        if let Poll::Ready(Some(Err(_))) = &polled {
            // a broken body leaves its connection unusable
            this.conn.take();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A small problem+json answer written by the gateway itself.
pub(crate) fn gateway_error(status: StatusCode, detail: &str) -> Response<ProxyBody> {
    let body = serde_json::json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or("Error"),
        "status": status.as_u16(),
        "detail": detail,
    })
    .to_string();
    let mut r = Response::new(full(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// A complete body.
pub(crate) fn full(data: impl Into<Bytes>) -> ProxyBody {
    http_body_util::Full::new(data.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// The `Host` the client asked for: its `Host` field, or the authority of
/// an HTTP/2 or absolute-form request.
fn original_host(uri: &Uri, headers: &HeaderMap) -> Option<HeaderValue> {
    if let Some(h) = headers.get(header::HOST) {
        return Some(h.clone());
    }
    uri.authority()
        .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

/// Removes the fields that describe one connection, not the message
/// (RFC 9110 §7.6.1), including any named in `Connection`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // most messages carry none: one pass over the names instead of a
    // lookup per field
    let any = headers
        .keys()
        .any(|k| k == header::UPGRADE || HOP_BY_HOP.contains(k));
    if !any {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for h in named.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(h);
    }
    headers.remove(header::UPGRADE);
}

/// Appends `ip` to `X-Forwarded-For` (one field, comma-separated).
pub fn append_forwarded_for(headers: &mut HeaderMap, ip: IpAddr) {
    use std::fmt::Write;
    let mut value = String::with_capacity(48);
    for prior in headers.get_all(&X_FORWARDED_FOR) {
        if let Ok(p) = prior.to_str() {
            value.push_str(p);
            value.push_str(", ");
        }
    }
    let _ = write!(value, "{ip}");
    if let Ok(v) = HeaderValue::try_from(value) {
        headers.insert(X_FORWARDED_FOR, v);
    }
}

pin_project! {
    /// A body that fails when no frame arrives for `idle`. The timer is
    /// armed only when the body has to wait, so a body that flows costs
    /// no timer work.
    pub struct IdleTimeout<B> {
        #[pin]
        body: B,
        sleep: Option<Pin<Box<Sleep>>>,
        idle: Duration,
        // a frame arrived since the timer was last armed
        moved: bool,
    }
}

impl<B> IdleTimeout<B> {
    /// Wraps `body`.
    pub fn new(body: B, idle: Duration) -> Self {
        IdleTimeout {
            body,
            sleep: None,
            idle,
            moved: true,
        }
    }
}

/// A body stalled longer than its idle bound.
#[derive(Debug)]
pub struct BodyIdle;

impl std::fmt::Display for BodyIdle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("body idle timeout")
    }
}

impl std::error::Error for BodyIdle {}

impl<B> Body for IdleTimeout<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        if let Poll::Ready(f) = this.body.poll_frame(cx) {
            *this.moved = true;
            return Poll::Ready(f.map(|r| r.map_err(Into::into)));
        }
        // waiting: (re)arm the timer from now if the body moved since
        let idle = *this.idle;
        let sleep = this
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
        if std::mem::take(this.moved) {
            sleep.as_mut().reset(tokio::time::Instant::now() + idle);
        }
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => {
                m::upstream_error("body_idle");
                Poll::Ready(Some(Err(Box::new(BodyIdle))))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_fields_go() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("te", HeaderValue::from_static("trailers"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        h.insert("upgrade", HeaderValue::from_static("websocket"));
        h.insert("authorization", HeaderValue::from_static("Bearer k"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(h.contains_key("authorization"));
    }

    #[test]
    fn forwarded_for_is_appended() {
        let mut h = HeaderMap::new();
        append_forwarded_for(&mut h, "10.0.0.1".parse().unwrap());
        assert_eq!(h["x-forwarded-for"], "10.0.0.1");
        h.append("x-forwarded-for", HeaderValue::from_static("10.0.0.2"));
        append_forwarded_for(&mut h, "::1".parse().unwrap());
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 10.0.0.2, ::1");
        assert_eq!(h.get_all("x-forwarded-for").iter().count(), 1);
    }

    #[test]
    fn upstream_uris_keep_path_and_query() {
        let p = Proxy::new(
            &"http://127.0.0.1:9/api/".parse().unwrap(),
            Timeouts::default(),
            None,
        );
        let u = p.upstream_uri(&"/v1/rates?from=NYC".parse().unwrap());
        assert_eq!(u.to_string(), "/api/v1/rates?from=NYC");
        let p = Proxy::new(
            &"http://127.0.0.1:9".parse().unwrap(),
            Timeouts::default(),
            None,
        );
        let u = p.upstream_uri(&"http://example.com/v1/rates?x=1".parse().unwrap());
        assert_eq!(u.to_string(), "/v1/rates?x=1");
    }

    /// A body that never yields.
    struct Stalled;

    impl Body for Stalled {
        type Data = Bytes;
        type Error = Infallible;
        fn poll_frame(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            Poll::Pending
        }
    }

    /// One frame, then nothing.
    struct OneThenStall(bool);

    impl Body for OneThenStall {
        type Data = Bytes;
        type Error = Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            match std::mem::replace(&mut self.0, true) {
                false => Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"x"))))),
                true => Poll::Pending,
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_idle_bound_counts_from_the_last_frame() {
        let mut b = IdleTimeout::new(OneThenStall(false), Duration::from_secs(5));
        tokio::time::advance(Duration::from_secs(60)).await;
        // a frame ready at once passes, however late it is polled
        assert!(b.frame().await.unwrap().is_ok());
        let started = tokio::time::Instant::now();
        assert!(b.frame().await.unwrap().unwrap_err().is::<BodyIdle>());
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_body_times_out() {
        let mut b = IdleTimeout::new(Stalled, Duration::from_secs(5));
        let frame = b.frame().await.unwrap();
        assert!(frame.unwrap_err().is::<BodyIdle>());
    }
}
