//! The own HTTP/1.1 client, the [`Upstream`] the proxy runs on by
//! default: the head written by the codec with as much of the body as is
//! there already, on a pooled connection or a new one (cleartext or TLS,
//! as its dialer opens them), sent again when a reused connection lost it
//! before any answer came and that is safe; the answer's body read
//! straight from the connection.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http::uri::Authority;
use http::Method;
#[cfg(test)]
use http::Uri;
use http_body::Body;
use paceline_core::{Clock, Nanos};

use super::body::UpstreamBody;
use super::codec::{put_data, write_head, BodyFraming, Head, Target};
use super::conn::Conn;
use super::dial::{Dialer, Io};
use super::error::{BoxError, UpstreamError};
use super::idle::IdleTimeout;
use super::pool::Pool;
use super::{Answer, Outgoing, Upstream};
use crate::config::Timeouts;

/// The most request body bytes sent with the head when they are there at
/// once.
const COALESCE: usize = 64 * 1024;

/// The own client to one upstream, with its pool of keep-alive
/// connections.
pub(crate) struct Client {
    pool: Arc<Pool>,
    target: Target,
    body_idle: Duration,
}

impl Client {
    /// A client for `target` on connections `dialer` opens (cleartext or
    /// TLS), bounding pooled idleness and pauses inside the request body
    /// by `timeouts` (connecting is the dialer's), and reading latencies
    /// and pool ages from `clock`.
    pub(crate) fn new(
        target: Target,
        dialer: Dialer,
        timeouts: &Timeouts,
        clock: Arc<dyn Clock>,
    ) -> Client {
        Client {
            pool: Arc::new(Pool::new(dialer, timeouts.pool_idle, clock)),
            target,
            body_idle: timeouts.body_idle,
        }
    }

    /// A client for the cleartext `upstream` (`http://host:port[/base]`).
    #[cfg(test)]
    pub(crate) fn plain(upstream: &Uri, timeouts: &Timeouts, clock: Arc<dyn Clock>) -> Client {
        let target = Target::new(upstream);
        let dialer = Dialer::plain(&target, timeouts.connect);
        Client::new(target, dialer, timeouts, clock)
    }

    /// The upstream's authority.
    pub(crate) fn authority(&self) -> &Authority {
        self.target.authority()
    }

    /// Takes a connection the HTTP/2 client opened and the upstream chose
    /// HTTP/1.1 on (`upstream_protocol = "auto"`) into the pool.
    pub(crate) fn adopt(&self, io: Io) {
        self.pool.adopt(io);
    }

    /// Sends the head `out` (and the body still to stream, if any) on a
    /// pooled connection or a new one, and reads the answer's head.
    async fn exchange<B>(
        &self,
        method: &Method,
        out: &mut BytesMut,
        mut rest: Option<Streaming<'_, B>>,
        now: Nanos,
        reached: &AtomicBool,
    ) -> Result<(Head, Conn), UpstreamError>
    where
        B: Body<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        let pool = &self.pool;
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
            reached.store(true, Ordering::Release);
            if !replayable {
                // never sent again: the head and the first body bytes are
                // not kept while the rest streams
                *out = BytesMut::new();
            }
            let head = match rest.as_mut() {
                Some(s) => Box::pin(conn.stream_and_read(s.body, s.framing, s.sent, method)).await,
                None => conn.read_head(method).await,
            };
            match head {
                Ok(head) => return Ok((head, conn)),
                Err(UpstreamError::Closed) if again && method.is_idempotent() => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

impl<B> Upstream<B> for Client
where
    B: Body<Data = Bytes> + Unpin + Send,
    B::Error: Into<BoxError>,
{
    type Body = UpstreamBody;

    async fn send(
        &self,
        req: Outgoing<'_>,
        mut body: B,
    ) -> Result<Answer<UpstreamBody>, UpstreamError> {
        let parts = req.parts;
        let framing = BodyFraming::of(&body);
        // the head, and as much of the body as is there already
        let mut out = BytesMut::with_capacity(512);
        write_head(&mut out, &self.target, parts, req.via, framing);
        let (sent, whole) = match framing {
            None => (0, true),
            Some(f) => coalesce(&mut body, &mut out, f, f == BodyFraming::Chunked)
                .map_err(UpstreamError::RequestBody)?,
        };
        // a streamed body waits in its own allocation: the common future
        // stays small
        let mut rest = (!whole).then(|| Box::pin(IdleTimeout::new(body, self.body_idle)));
        let method = &parts.method;

        let started = self.pool.now();
        let streaming = match (rest.as_mut(), framing) {
            (Some(body), Some(framing)) => Some(Streaming {
                body,
                framing,
                sent,
            }),
            _ => None,
        };
        let (head, conn) = self
            .exchange(method, &mut out, streaming, started, req.reached)
            .await?;
        let now = self.pool.now();
        let Head {
            status,
            headers,
            framing,
            keep_alive,
        } = head;
        let body = UpstreamBody::new(conn, framing, keep_alive, self.pool.clone(), now);
        Ok(Answer {
            status,
            headers,
            body,
            // a clock set back gives zero, never an underflow
            waited: now.saturating_sub(started).as_duration(),
        })
    }
}

/// A request body still streaming after the head: how it is framed and
/// how much of it went with the head.
struct Streaming<'a, B> {
    body: &'a mut Pin<Box<IdleTimeout<B>>>,
    framing: BodyFraming,
    sent: u64,
}

/// Appends the body frames that are ready now to `out` (up to
/// [`COALESCE`] bytes), chunk-framed if `chunked` (and then with the last
/// chunk if that was all): how many body bytes that was, and whether it
/// was the whole body. A body that is not as long as its framing says
/// fails.
pub(super) fn coalesce<B>(
    body: &mut B,
    out: &mut BytesMut,
    framing: BodyFraming,
    chunked: bool,
) -> Result<(u64, bool), BoxError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
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
