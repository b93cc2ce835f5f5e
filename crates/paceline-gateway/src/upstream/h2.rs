//! HTTP/2 to the upstream (`upstream_protocol = "http2"`, and `"auto"`
//! when the upstream picks `h2` by ALPN): hyper's HTTP/2 connection
//! (`hyper::client::conn::http2`), one per upstream, every request a
//! stream on it.
//!
//! Why hyper here and not the own client: HTTP/2 is framing, flow control
//! and HPACK, state shared by every request on the connection, which
//! needs a task of its own driving the connection; the own client's
//! design (the request's task doing the I/O) does not carry over, and
//! what made it faster than hyper for HTTP/1.1 (no channels and no task
//! per connection) is what HTTP/2 needs anyway.
//!
//! Why one `SendRequest` kept and cloned rather than hyper-util's pooled
//! client: the pool of an HTTP/2 upstream is one connection, so there is
//! little to pool; opening it here keeps what the proxy's rules need in
//! plain sight: the connection opened by the gateway's own [`Dialer`]
//! (TLS, SNI, ALPN, the client certificate, the connect deadline on TCP,
//! handshake and the HTTP/2 preface together), the moment a request is
//! handed to the connection (`reached`, which decides refunds), and what
//! an error means (a connect failure, a stream the upstream refused, the
//! client's own body). Concurrent requests wait for one connection being
//! opened rather than each opening their own; a connection that died, or
//! sat idle past `timeouts.pool_idle`, is replaced by the next request.
//!
//! The head is the codec's ([`hyper_head`]): hop-by-hop fields gone,
//! `X-Forwarded-*` added, `Host` as the `:authority`. The request body
//! that is there at once goes with the head in one piece (up to 64 KiB),
//! and a request all of which is here can go again: when the connection
//! went away before the request was handed to it, or the upstream
//! refused its stream unprocessed (`REFUSED_STREAM`, or a `GOAWAY` below
//! its id, as a server sends when it retires a connection), it is sent
//! on a new connection. A refusal of a request whose body was streaming
//! is a `502` whose charge is given back (the upstream did nothing). The
//! rest of a body streams under `timeouts.body_idle`; a client body that
//! fails or does not match its length fails the exchange as the client's
//! fault (`400`/`408`), as with the own client.
//!
//! PINGs while requests are in flight find a connection that died without
//! a word (every request on it would otherwise wait for its deadline).

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::uri::Authority;
use http::Request;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http2::{self, SendRequest};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use paceline_core::{Clock, Nanos};

use super::client::coalesce;
use super::codec::{hyper_head, BodyFraming, Target, Version};
use super::dial::{Dialer, Io};
use super::error::{BoxError, UpstreamError};
use super::idle::IdleTimeout;
use super::{Answer, Outgoing, Upstream};
use crate::config::Timeouts;

/// How often a connection with requests in flight is PINGed.
const PING_EVERY: Duration = Duration::from_secs(10);
/// How long a PING may go unanswered before the connection is closed.
const PING_TIMEOUT: Duration = Duration::from_secs(10);
/// How many times a request goes out at most (again only when the
/// upstream did not process it, each time on a newer connection). A
/// server that retires connections after a few requests refuses every
/// stream past the last it takes, so a burst of requests may need a few
/// connections in turn; the bound is for a server that refuses
/// everything.
const ATTEMPTS: usize = 10;

/// The HTTP/2 client to one upstream.
pub(crate) struct H2Client<B> {
    target: Target,
    dialer: Dialer,
    builder: http2::Builder<TokioExecutor>,
    /// The connection in use.
    live: parking_lot::Mutex<Option<Live<B>>>,
    /// Held while a connection is opened.
    opening: tokio::sync::Mutex<()>,
    /// How many connections were opened (each one's number tells it
    /// apart when it is retired).
    opened: std::sync::atomic::AtomicU64,
    /// `"auto"`: a connection the upstream chose HTTP/1.1 on is handed
    /// back instead of failing.
    auto: bool,
    /// `"auto"`, and the upstream chose HTTP/1.1.
    http1: AtomicBool,
    connect: Duration,
    pool_idle: Nanos,
    body_idle: Duration,
    clock: Arc<dyn Clock>,
}

/// The connection in use, and when a request last took it.
struct Live<B> {
    send: SendRequest<ReqBody<B>>,
    number: u64,
    used: Nanos,
}

/// A connection to send on, or the news that the upstream speaks
/// HTTP/1.1.
enum Link<B> {
    /// Send on this (the connection's number with it).
    H2(SendRequest<ReqBody<B>>, u64),
    /// `"auto"`: the upstream chose HTTP/1.1; the connection that found
    /// it out, if this request opened it.
    Http1(Option<Io>),
}

/// What [`H2Client::send_routed`] did with a request.
pub(crate) enum Routed<B> {
    /// It went over HTTP/2.
    Done(Result<Answer<Incoming>, UpstreamError>),
    /// `"auto"`, and the upstream speaks HTTP/1.1: the request is
    /// untouched, with the connection that found it out if there is one.
    Http1(Option<Io>, B),
}

impl<B> H2Client<B>
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    /// A client for `target` on connections `dialer` opens: h2c by prior
    /// knowledge on a cleartext one, `h2` by ALPN under TLS. With `auto`,
    /// an upstream that picks `http/1.1` is remembered and its connection
    /// handed back ([`Routed::Http1`]); without, it is a connect failure.
    pub(crate) fn new(
        target: Target,
        dialer: Dialer,
        auto: bool,
        timeouts: &Timeouts,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let mut builder = http2::Builder::new(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            .keep_alive_interval(PING_EVERY)
            .keep_alive_timeout(PING_TIMEOUT)
            .keep_alive_while_idle(false);
        H2Client {
            target,
            dialer,
            builder,
            live: parking_lot::Mutex::new(None),
            opening: tokio::sync::Mutex::new(()),
            opened: std::sync::atomic::AtomicU64::new(0),
            auto,
            http1: AtomicBool::new(false),
            connect: timeouts.connect,
            pool_idle: Nanos::from_duration(timeouts.pool_idle),
            body_idle: timeouts.body_idle,
            clock,
        }
    }

    /// The upstream's authority.
    pub(crate) fn authority(&self) -> &Authority {
        self.target.authority()
    }

    /// `"auto"`, and the upstream chose HTTP/1.1.
    pub(crate) fn chose_http1(&self) -> bool {
        self.http1.load(Ordering::Acquire)
    }

    /// The connection in use, if it is open and was not idle too long
    /// at `now`; it counts as used from `now`.
    fn current(&self, now: Nanos) -> Option<(SendRequest<ReqBody<B>>, u64)> {
        let mut live = self.live.lock();
        match live.as_mut() {
            Some(l) if !l.send.is_closed() && now.saturating_sub(l.used) < self.pool_idle => {
                l.used = now;
                Some((l.send.clone(), l.number))
            }
            _ => {
                // dropping the last sender lets an idle connection close
                *live = None;
                None
            }
        }
    }

    /// Stops sending new requests on connection `number` (it refused
    /// one): the next request opens another. Requests in flight on it
    /// finish there.
    fn retire(&self, number: u64) {
        let mut live = self.live.lock();
        if live.as_ref().is_some_and(|l| l.number == number) {
            *live = None;
        }
    }

    /// A connection to send on: the one in use, or a new one (one
    /// request opens it, the others wait for it).
    async fn link(&self, now: Nanos) -> Result<Link<B>, UpstreamError> {
        if let Some((send, n)) = self.current(now) {
            return Ok(Link::H2(send, n));
        }
        let _opening = self.opening.lock().await;
        if self.chose_http1() {
            return Ok(Link::Http1(None));
        }
        // opened by another request while this one waited
        if let Some((send, n)) = self.current(self.clock.now()) {
            return Ok(Link::H2(send, n));
        }
        let io = self.dialer.dial().await?;
        if self.target.is_https() && !io.is_h2() {
            if self.auto {
                tracing::info!(
                    upstream = %self.target.authority(),
                    "the upstream chose HTTP/1.1 by ALPN: speaking HTTP/1.1 to it"
                );
                self.http1.store(true, Ordering::Release);
                return Ok(Link::Http1(Some(io)));
            }
            return Err(UpstreamError::Connect(io::Error::new(
                io::ErrorKind::InvalidData,
                "the upstream did not agree to HTTP/2 (no ALPN h2); \
                 upstream_protocol = \"auto\" or \"http1\" would speak HTTP/1.1 to it",
            )));
        }
        let handshake = self.builder.handshake(TokioIo::new(io));
        let (send, conn) = match tokio::time::timeout(self.connect, handshake).await {
            Ok(Ok(pair)) => pair,
            Ok(Err(e)) => {
                let e = io::Error::other(format!("HTTP/2 handshake: {e}"));
                return Err(UpstreamError::Connect(e));
            }
            Err(_) => {
                let e = io::Error::new(io::ErrorKind::TimedOut, "HTTP/2 handshake timed out");
                return Err(UpstreamError::Connect(e));
            }
        };
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "upstream HTTP/2 connection ended");
            }
        });
        let number = self.opened.fetch_add(1, Ordering::Relaxed);
        *self.live.lock() = Some(Live {
            send: send.clone(),
            number,
            used: self.clock.now(),
        });
        Ok(Link::H2(send, number))
    }

    /// Sends `req` with `body` over HTTP/2, or with `"auto"` hands it
    /// back untouched when the upstream speaks HTTP/1.1.
    pub(crate) async fn send_routed(&self, req: Outgoing<'_>, body: B) -> Routed<B> {
        let started = self.clock.now();
        match self.link(started).await {
            Ok(Link::H2(send, n)) => Routed::Done(self.exchange(req, body, started, send, n).await),
            Ok(Link::Http1(io)) => Routed::Http1(io, body),
            Err(e) => Routed::Done(Err(e)),
        }
    }

    /// The exchange on `send` (connection `number`), and on new
    /// connections while the upstream refuses the request unprocessed and
    /// all of it is here to go again.
    async fn exchange(
        &self,
        req: Outgoing<'_>,
        mut body: B,
        started: Nanos,
        mut send: SendRequest<ReqBody<B>>,
        mut number: u64,
    ) -> Result<Answer<Incoming>, UpstreamError> {
        let parts = req.parts;
        let framing = BodyFraming::of(&body);
        let mut head = Some(hyper_head(
            &self.target,
            parts,
            req.via,
            framing,
            Version::Http2,
        )?);
        // what is there of the body now goes with the head
        let mut first = BytesMut::new();
        let (taken, whole) = match framing {
            None => (0, true),
            Some(f) => {
                coalesce(&mut body, &mut first, f, false).map_err(UpstreamError::RequestBody)?
            }
        };
        let first = first.freeze();
        let failed = Arc::new(parking_lot::Mutex::new(None));
        let mut rest = (!whole).then(|| Tracked {
            body: IdleTimeout::new(body, self.body_idle),
            failed: failed.clone(),
            left: match framing {
                Some(BodyFraming::Length(n)) => Some(n - taken),
                _ => None,
            },
        });
        for attempt in 1..=ATTEMPTS {
            let (uri, headers) = match head.take() {
                Some(h) => h,
                None => hyper_head(&self.target, parts, req.via, framing, Version::Http2)?,
            };
            let mut request = Request::new(ReqBody {
                first: (!first.is_empty()).then(|| first.clone()),
                rest: rest.take(),
            });
            *request.method_mut() = parts.method.clone();
            *request.uri_mut() = uri;
            *request.headers_mut() = headers;
            // handed to the connection: from here the upstream may get it
            req.reached.store(true, Ordering::Release);
            let mut e = match send.try_send_request(request).await {
                Ok(res) => {
                    let now = self.clock.now();
                    let (head, body) = res.into_parts();
                    return Ok(Answer {
                        status: head.status,
                        headers: head.headers,
                        body,
                        waited: now.saturating_sub(started).as_duration(),
                    });
                }
                Err(e) => e,
            };
            if let Some(e) = failed.lock().take() {
                return Err(UpstreamError::RequestBody(e));
            }
            let unsent = e.take_message();
            let error = e.into_error();
            if unsent.is_none() && !unprocessed(&error) {
                return Err(classify(error));
            }
            // the upstream did nothing with it: never sent, as far as
            // refunds go
            req.reached.store(false, Ordering::Release);
            self.retire(number);
            let again = match unsent {
                Some(r) => {
                    rest = r.into_body().rest;
                    true
                }
                None => whole,
            };
            if !again || attempt == ATTEMPTS {
                tracing::debug!(error = ?error, attempt, "upstream refused the request unprocessed");
                return Err(UpstreamError::Closed);
            }
            tracing::debug!(error = ?error, attempt, "upstream refused the request unprocessed: sending it again");
            match self.link(self.clock.now()).await? {
                Link::H2(s, n) => (send, number) = (s, n),
                // the upstream turned to HTTP/1.1 between two connections
                // (`"auto"`): this request fails, unprocessed; the next
                // ones go over HTTP/1.1
                Link::Http1(_) => return Err(UpstreamError::Closed),
            }
        }
        Err(UpstreamError::Closed)
    }
}

impl<B> Upstream<B> for H2Client<B>
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    type Body = Incoming;

    async fn send(&self, req: Outgoing<'_>, body: B) -> Result<Answer<Incoming>, UpstreamError> {
        match self.send_routed(req, body).await {
            Routed::Done(r) => r,
            // only with `auto`, which the proxy drives through `Auto`
            Routed::Http1(..) => Err(UpstreamError::Connect(io::Error::new(
                io::ErrorKind::InvalidData,
                "the upstream chose HTTP/1.1",
            ))),
        }
    }
}

/// Whether the upstream certainly did not process a request that failed
/// with `e`: the connection was gone before the request was handed to it,
/// or the upstream refused the stream (`REFUSED_STREAM`) or announced a
/// `GOAWAY` below it (RFC 9113 §6.8, §8.7).
fn unprocessed(e: &hyper::Error) -> bool {
    if e.is_canceled() {
        return true;
    }
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        if let Some(h2) = c.downcast_ref::<h2::Error>() {
            return h2.reason() == Some(h2::Reason::REFUSED_STREAM)
                || (h2.is_go_away() && h2.is_remote());
        }
        cause = c.source();
    }
    false
}

/// The kind of failure an HTTP/2 exchange error is, as the proxy tells
/// them apart (the client's own body was looked at before).
fn classify(e: hyper::Error) -> UpstreamError {
    if e.is_timeout() {
        return UpstreamError::Io(io::Error::new(io::ErrorKind::TimedOut, e));
    }
    UpstreamError::Io(io::Error::other(e))
}

/// A request body as it goes to hyper: what was there at once, then the
/// rest, streaming.
pub(crate) struct ReqBody<B> {
    first: Option<Bytes>,
    rest: Option<Tracked<B>>,
}

/// The streaming rest of a request body: its pauses bounded, its length
/// checked, and its failure kept for the exchange to report (hyper only
/// resets the stream).
struct Tracked<B> {
    body: IdleTimeout<B>,
    failed: Arc<parking_lot::Mutex<Option<BoxError>>>,
    /// Bytes still to come of a body of known length.
    left: Option<u64>,
}

/// What hyper is told when the client's body failed (the cause goes to
/// the exchange).
#[derive(Debug)]
struct ClientBodyFailed;

impl std::fmt::Display for ClientBodyFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the client's request body failed")
    }
}

impl std::error::Error for ClientBodyFailed {}

impl<B> Tracked<B> {
    fn fail(&mut self, e: BoxError) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.failed.lock().get_or_insert(e);
        Poll::Ready(Some(Err(Box::new(ClientBodyFailed))))
    }
}

impl<B> Body for ReqBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Some(b) = this.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(b))));
        }
        let Some(rest) = this.rest.as_mut() else {
            return Poll::Ready(None);
        };
        match Pin::new(&mut rest.body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let Ok(data) = frame.into_data() else {
                    // trailers are not passed on
                    return Poll::Ready(None);
                };
                if let Some(left) = rest.left.as_mut() {
                    match left.checked_sub(data.len() as u64) {
                        Some(l) => *left = l,
                        None => return rest.fail("body longer than its length".into()),
                    }
                }
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            Poll::Ready(Some(Err(e))) => rest.fail(e),
            Poll::Ready(None) if rest.left.is_some_and(|l| l > 0) => {
                rest.fail("body shorter than its length".into())
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.rest.as_ref().is_none_or(|r| r.body.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        let first = self.first.as_ref().map_or(0, |b| b.len() as u64);
        match &self.rest {
            None => SizeHint::with_exact(first),
            Some(Tracked { left: Some(n), .. }) => SizeHint::with_exact(first + n),
            Some(_) => {
                let mut h = SizeHint::new();
                h.set_lower(first);
                h
            }
        }
    }
}
