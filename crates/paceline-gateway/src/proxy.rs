//! The forwarding service: one request to the upstream and its response
//! back, both bodies streamed.
//!
//! It speaks HTTP/1.1 to the upstream itself, inside the request's task,
//! over a pool of keep-alive connections (a stack of idle connections, one
//! going back on it the moment its response body ends). It strips
//! hop-by-hop fields both ways, appends the client to `X-Forwarded-For`,
//! and bounds every phase: connecting, waiting for the response head, and
//! every pause inside either body. A request body streams while the answer
//! is watched for, so an upstream may answer early. An upstream that cannot
//! be reached gives `502`, one too slow to answer `504`; an answer whose
//! framing cannot be trusted (conflicting lengths, transfer codings other
//! than chunked) gives `502`. A request that a reused connection lost
//! before any answer came (the upstream closed it while it sat idle) is
//! sent again on another connection when that is safe: its body is not
//! streaming, and it is idempotent or none of it was written.

use std::convert::Infallible;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use quanta::Instant;

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName};
use http::uri::{Authority, PathAndQuery};
use http::{Method, Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use paceline_server::PeerAddr;
use paceline_wire::problem::{self, Problem, ProblemKind};
use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower_service::Service;

use crate::config::Timeouts;
use crate::metrics as m;
use crate::shed::Shedder;
use crate::upstream::{put_data, BodyFraming, Conn, Head, Pool, UpstreamBody, UpstreamError};

/// Errors inside a streamed body.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of every response the gateway sends.
pub type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// Forwards requests to one upstream. Clones share the connection pool.
#[derive(Clone)]
pub struct Proxy {
    inner: Arc<ProxyInner>,
    /// The client connection's peer, for requests that carry no
    /// [`PeerAddr`].
    peer: Option<IpAddr>,
}

struct ProxyInner {
    pool: Arc<Pool>,
    target: Target,
    timeouts: Timeouts,
    shedder: Option<Shedder>,
    /// The base of the problem types of the gateway's own answers.
    problem_base: Box<str>,
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

/// The most request body bytes sent with the head when they are there at
/// once.
const COALESCE: usize = 64 * 1024;

impl Proxy {
    /// A proxy to `upstream` (`http://host:port[/base]`); the shedder, if
    /// any, is told every upstream latency; the problem types of the
    /// proxy's own answers (an upstream that fails, say) are under
    /// `problem_base`.
    pub fn new(
        upstream: &Uri,
        timeouts: Timeouts,
        shedder: Option<Shedder>,
        problem_base: &str,
    ) -> Self {
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
        let pool = Pool::new(
            host,
            target.authority.port_u16().unwrap_or(80),
            timeouts.connect,
            timeouts.pool_idle,
        );
        Proxy {
            inner: Arc::new(ProxyInner {
                pool: Arc::new(pool),
                target,
                timeouts,
                shedder,
                problem_base: problem_base.into(),
            }),
            peer: None,
        }
    }

    /// The same proxy (sharing the pool) for the one client connection
    /// whose peer is `peer`: its requests need not carry a [`PeerAddr`].
    pub fn with_peer(&self, peer: std::net::SocketAddr) -> Self {
        Proxy {
            inner: self.inner.clone(),
            peer: Some(peer.ip()),
        }
    }

    /// Writes the request target sent upstream, in origin form: the
    /// upstream's base path, then the client's path and query.
    fn put_target(&self, uri: &Uri, out: &mut BytesMut) {
        let pq = uri.path_and_query().map_or("/", PathAndQuery::as_str);
        // `OPTIONS *` asks about the server as a whole: no base path
        if pq != "*" {
            out.put_slice(self.inner.target.base.as_bytes());
        }
        out.put_slice(pq.as_bytes());
    }

    /// Forwards one request.
    pub async fn forward(&self, req: Request<Incoming>) -> Response<ProxyBody> {
        let this = &*self.inner;
        if req.method() == Method::CONNECT {
            // a tunnel is not a request this proxy forwards
            let base = &this.problem_base;
            return gateway_error(
                base,
                ProblemKind::MethodNotAllowed,
                "CONNECT is not forwarded.",
            );
        }
        let (parts, mut body) = req.into_parts();
        // how the body goes upstream; `None`: there is none
        let framing = match (body.is_end_stream(), body.size_hint().exact()) {
            (true, _) => None,
            (false, Some(n)) => Some(BodyFraming::Length(n)),
            (false, None) => Some(BodyFraming::Chunked),
        };

        // the head, and as much of the body as is there already
        let mut out = BytesMut::with_capacity(512);
        out.put_slice(parts.method.as_str().as_bytes());
        out.put_u8(b' ');
        self.put_target(&parts.uri, &mut out);
        out.put_slice(b" HTTP/1.1\r\n");
        let peer = parts
            .extensions
            .get::<PeerAddr>()
            .map(|p| p.0.ip())
            .or(self.peer);
        let had_length = put_fields(&parts, &this.target.authority, peer, &mut out);
        match framing {
            None if had_length || expects_body(&parts.method) => {
                out.put_slice(b"content-length: 0\r\n")
            }
            None => {}
            Some(BodyFraming::Length(n)) => {
                out.put_slice(b"content-length: ");
                out.put_slice(itoa::Buffer::new().format(n).as_bytes());
                out.put_slice(b"\r\n");
            }
            Some(BodyFraming::Chunked) => out.put_slice(b"transfer-encoding: chunked\r\n"),
        }
        out.put_slice(b"\r\n");
        let (sent, whole) = match framing {
            None => (0, true),
            Some(f) => match coalesce(&mut body, &mut out, f) {
                Ok(x) => x,
                Err(e) => return request_body_error(&this.problem_base, &e),
            },
        };
        // a streamed body waits in its own allocation: the common future
        // stays small
        let mut rest = (!whole).then(|| Box::pin(IdleTimeout::new(body, this.timeouts.body_idle)));
        let method = parts.method;

        let started = Instant::now();
        let exchange = self.exchange(&method, &out, rest.as_mut(), framing, sent, started);
        match tokio::time::timeout(this.timeouts.upstream_header, exchange).await {
            Ok(Ok((head, conn))) => {
                let now = Instant::now();
                let took = now.saturating_duration_since(started);
                m::upstream_latency(took);
                if let Some(s) = &this.shedder {
                    s.record_latency(took);
                }
                let Head {
                    status,
                    mut headers,
                    framing,
                    keep_alive,
                } = head;
                strip_hop_by_hop(&mut headers);
                let body = UpstreamBody::new(conn, framing, keep_alive, this.pool.clone(), now);
                let body = IdleTimeout::new(body, this.timeouts.body_idle);
                let mut res = Response::new(body.boxed_unsync());
                *res.status_mut() = status;
                *res.headers_mut() = headers;
                res
            }
            Ok(Err(UpstreamError::RequestBody(e))) => request_body_error(&this.problem_base, &e),
            Ok(Err(e)) => {
                let connect = matches!(e, UpstreamError::Connect(_));
                m::upstream_error(if connect { "connect" } else { "request" });
                tracing::warn!(error = %e, "upstream request failed");
                let detail = match connect {
                    true => "The upstream could not be reached.",
                    false => "The upstream failed before answering.",
                };
                gateway_error(&this.problem_base, ProblemKind::BadGateway, detail)
            }
            Err(_) => {
                m::upstream_error("timeout");
                tracing::warn!(
                    timeout_ms = this.timeouts.upstream_header.as_millis() as u64,
                    "upstream timed out"
                );
                gateway_error(
                    &this.problem_base,
                    ProblemKind::GatewayTimeout,
                    "The upstream did not answer in time.",
                )
            }
        }
    }

    /// Sends the head `out` (and the body still to stream, if any) on a
    /// pooled connection or a new one, and reads the answer's head.
    async fn exchange(
        &self,
        method: &Method,
        out: &[u8],
        mut rest: Option<&mut Pin<Box<IdleTimeout<Incoming>>>>,
        framing: Option<BodyFraming>,
        sent: u64,
        now: Instant,
    ) -> Result<(Head, Conn), UpstreamError> {
        let pool = &self.inner.pool;
        // a request can go again only while all of it is in `out`
        let replayable = rest.is_none();
        loop {
            let (mut conn, reused) = match pool.take(now) {
                Some(c) => (c, true),
                // boxed: the rare path keeps the common future small
                None => (Box::pin(pool.connect()).await?, false),
            };
            let again = reused && replayable;
            if let Err((some_went, e)) = conn.write_all(out).await {
                // a connection the upstream had closed: nothing of the
                // request reached it, or only what is safe to repeat
                match again && (!some_went || method.is_idempotent()) {
                    true => continue,
                    false => return Err(e),
                }
            }
            let head = match (rest.as_deref_mut(), framing) {
                (Some(body), Some(framing)) => {
                    Box::pin(conn.stream_and_read(body, framing, sent, method)).await
                }
                _ => conn.read_head(method).await,
            };
            match head {
                Ok(head) => return Ok((head, conn)),
                Err(UpstreamError::Closed) if again && method.is_idempotent() => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

/// Methods whose requests are expected to carry a body.
fn expects_body(m: &Method) -> bool {
    m == Method::POST || m == Method::PUT || m == Method::PATCH
}

/// Appends the body frames that are ready now to `out` (up to
/// [`COALESCE`] bytes): how many bytes that was, and whether it was the
/// whole body.
fn coalesce(
    body: &mut Incoming,
    out: &mut BytesMut,
    framing: BodyFraming,
) -> Result<(u64, bool), BoxError> {
    let chunked = framing == BodyFraming::Chunked;
    let mut cx = Context::from_waker(Waker::noop());
    let mut taken = 0u64;
    let mut ended = body.is_end_stream();
    while taken < COALESCE as u64 && !ended {
        match Pin::new(&mut *body).poll_frame(&mut cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    taken += data.len() as u64;
                    put_data(out, &data, chunked);
                }
                ended = body.is_end_stream();
            }
            Poll::Ready(Some(Err(e))) => return Err(e.into()),
            Poll::Ready(None) => ended = true,
            Poll::Pending => break,
        }
    }
    if let BodyFraming::Length(n) = framing {
        if taken > n || (ended && taken != n) {
            return Err("request body does not match its length".into());
        }
    }
    if ended && chunked {
        out.put_slice(b"0\r\n\r\n");
    }
    Ok((taken, ended))
}

/// The answer when the client's own body failed.
fn request_body_error(base: &str, e: &BoxError) -> Response<ProxyBody> {
    m::upstream_error("request_body");
    match e.is::<BodyIdle>() {
        true => gateway_error(
            base,
            ProblemKind::RequestTimeout,
            "The request body stalled longer than allowed.",
        ),
        false => gateway_error(
            base,
            ProblemKind::BadRequest,
            "The request body could not be read.",
        ),
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

/// A problem answer written by the gateway itself, its type under `base`.
pub(crate) fn gateway_error(base: &str, kind: ProblemKind, detail: &str) -> Response<ProxyBody> {
    problem::answer(&Problem::new(kind, base, detail)).map(full)
}

/// A complete body.
pub(crate) fn full(data: impl Into<Bytes>) -> ProxyBody {
    http_body_util::Full::new(data.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// Writes the request's fields as they go upstream: `Host` first (the
/// authority of an HTTP/2 or absolute-form request, or the client's
/// `Host`, or the upstream's), then the client's end-to-end fields, then
/// `X-Forwarded-For` with the client appended and `X-Forwarded-Proto`.
/// Hop-by-hop fields (RFC 9110 §7.6.1, with any named in `Connection`) and
/// the client's framing fields stay behind; the caller writes the framing.
/// True when the client sent a `Content-Length`.
fn put_fields(
    parts: &http::request::Parts,
    upstream: &Authority,
    peer: Option<IpAddr>,
    out: &mut BytesMut,
) -> bool {
    let headers = &parts.headers;
    out.put_slice(b"host: ");
    // the target's authority wins over `Host` (RFC 9112 §3.2.2)
    match (parts.uri.authority(), headers.get(header::HOST)) {
        (Some(a), _) => out.put_slice(a.as_str().as_bytes()),
        (None, Some(h)) => out.put_slice(h.as_bytes()),
        (None, None) => out.put_slice(upstream.as_str().as_bytes()),
    }
    out.put_slice(b"\r\n");
    // fields the client named in `Connection` (rare: looked up only then)
    let named: Vec<HeaderName> = match headers.contains_key(header::CONNECTION) {
        false => Vec::new(),
        true => headers
            .get_all(header::CONNECTION)
            .iter()
            .flat_map(|v| v.as_bytes().split(|&b| b == b','))
            .filter_map(|t| HeaderName::from_bytes(t.trim_ascii()).ok())
            .collect(),
    };
    let mut had_length = false;
    let mut forwarded: Option<String> = None;
    for (name, value) in headers {
        if name == header::HOST || name == X_FORWARDED_PROTO || is_hop_by_hop(name) {
            continue;
        }
        if name == header::CONTENT_LENGTH {
            had_length = true;
            continue;
        }
        if !named.is_empty() && named.contains(name) {
            continue;
        }
        if name == X_FORWARDED_FOR {
            let f = forwarded.get_or_insert_with(String::new);
            if let Ok(v) = value.to_str() {
                f.push_str(v);
                f.push_str(", ");
            }
            continue;
        }
        out.put_slice(name.as_str().as_bytes());
        out.put_slice(b": ");
        out.put_slice(value.as_bytes());
        out.put_slice(b"\r\n");
    }
    if let Some(ip) = peer {
        let mut f = forwarded.unwrap_or_default();
        paceline_server::identity::push_ip(&mut f, ip);
        out.put_slice(b"x-forwarded-for: ");
        out.put_slice(f.as_bytes());
        out.put_slice(b"\r\n");
    } else if let Some(f) = forwarded {
        out.put_slice(b"x-forwarded-for: ");
        out.put_slice(f.trim_end_matches(", ").as_bytes());
        out.put_slice(b"\r\n");
    }
    out.put_slice(b"x-forwarded-proto: http\r\n");
    had_length
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

fn is_hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(name)
}

/// Removes the fields that describe one connection, not the message
/// (RFC 9110 §7.6.1), including any named in `Connection`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // most messages carry none: one pass over the names instead of a
    // lookup per field
    if !headers.keys().any(is_hop_by_hop) {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .filter_map(|t| HeaderName::from_bytes(t.trim_ascii()).ok())
        .collect();
    for h in named.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(h);
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
    use http::header::HeaderValue;

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

    /// The fields `put_fields` writes for a request with `fields`.
    fn sent(fields: &[(&str, &str)], peer: Option<&str>) -> String {
        let mut req = Request::get("/x");
        for (n, v) in fields {
            req = req.header(*n, *v);
        }
        let (parts, ()) = req.body(()).unwrap().into_parts();
        let mut out = BytesMut::new();
        let upstream = Authority::from_static("up:80");
        let len = put_fields(
            &parts,
            &upstream,
            peer.map(|p| p.parse().unwrap()),
            &mut out,
        );
        let text = String::from_utf8(out.to_vec()).unwrap();
        format!("{text}length={len}")
    }

    #[test]
    fn forwarded_for_is_appended_and_hop_by_hop_fields_stay_behind() {
        assert_eq!(
            sent(&[("host", "api.example")], Some("10.0.0.1")),
            "host: api.example\r\nx-forwarded-for: 10.0.0.1\r\nx-forwarded-proto: http\r\nlength=false"
        );
        let text = sent(
            &[
                ("x-forwarded-for", "10.0.0.1"),
                ("x-forwarded-for", "10.0.0.2"),
                ("connection", "keep-alive, x-secret"),
                ("x-secret", "1"),
                ("keep-alive", "timeout=5"),
                ("te", "trailers"),
                ("transfer-encoding", "chunked"),
                ("upgrade", "websocket"),
                ("x-forwarded-proto", "https"),
                ("content-length", "3"),
                ("authorization", "Bearer k"),
            ],
            Some("::1"),
        );
        assert_eq!(
            text,
            "host: up:80\r\nauthorization: Bearer k\r\n\
             x-forwarded-for: 10.0.0.1, 10.0.0.2, ::1\r\nx-forwarded-proto: http\r\nlength=true"
        );
        // without a peer the prior chain is passed on as it was
        assert!(sent(&[("x-forwarded-for", "10.0.0.9")], None)
            .contains("\r\nx-forwarded-for: 10.0.0.9\r\n"));
    }

    #[test]
    fn upstream_uris_keep_path_and_query() {
        let p = Proxy::new(
            &"http://127.0.0.1:9/api/".parse().unwrap(),
            Timeouts::default(),
            None,
            "x:",
        );
        let target = |p: &Proxy, uri: &str| {
            let mut out = BytesMut::new();
            p.put_target(&uri.parse().unwrap(), &mut out);
            String::from_utf8(out.to_vec()).unwrap()
        };
        assert_eq!(target(&p, "/v1/rates?from=NYC"), "/api/v1/rates?from=NYC");
        let p = Proxy::new(
            &"http://127.0.0.1:9".parse().unwrap(),
            Timeouts::default(),
            None,
            "x:",
        );
        assert_eq!(
            target(&p, "http://example.com/v1/rates?x=1"),
            "/v1/rates?x=1"
        );
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
