//! A client's HTTP/1.1 connection, served by the gateway itself for as
//! long as its requests are the common kind, then by hyper.
//!
//! Why: a `429` from the head or a `GET` proxied to an instant upstream is
//! the work a rate-limiting edge does most, and hyper's server connection
//! (its dispatcher, buffers and answer encoding) was the largest part of
//! it. This connection reads heads with the gateway's own parser
//! (`request.rs`), hands each request to the same stack, and writes the
//! answer in one piece when it is whole.
//!
//! It serves HTTP/1.1 requests that announce no body and expect nothing:
//! every `GET`, most `DELETE`s, `HEAD` and `OPTIONS`. Anything else (a
//! body, `Expect`, `Upgrade`, `CONNECT`, HTTP/1.0, the HTTP/2 preface, a
//! head that does not parse or is too long) is handed over, with every
//! byte read so far, to hyper, which serves the connection from that
//! request on exactly as it serves a connection from its start: the
//! intake's bounds, `100 Continue` once admitted, the problem answers to
//! heads it refuses (`edge.rs`). So hyper keeps the rare and the hard
//! cases, and both ways of serving are held to the same tests.
//!
//! As with hyper's:
//! - a client that closes its side while its request is in flight has
//!   the request dropped (and with it the upstream call);
//! - pipelined requests are answered in order, one at a time;
//! - a graceful shutdown ends the connection at once when it waits for a
//!   head, otherwise after the answer in progress;
//! - an answer says `connection: close` when the connection ends after it.
//!
//! Beyond hyper's: a client that takes nothing of an answer for
//! `body_idle_ms` has its connection closed, whoever serves it (a
//! connection handed to hyper has the same bound on its writes, in
//! [`Rewind`]). One that sends requests and never reads would otherwise
//! hold it for ever, a request always in flight, out of the idle timer's
//! reach. No timer is made for an answer that goes into the socket's
//! buffer at once.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, DATE, TRANSFER_ENCODING};
use http::{HeaderMap, Method, Request, Response, StatusCode, Version};
use http_body::{Body, Frame};
use hyper_util::server::graceful::GracefulConnection;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use super::body::ClientBody;
use super::request::{parse_request, RequestHead};
use crate::upstream::Framing;

/// Bytes read at a time while a head is awaited.
const READ: usize = 8 * 1024;
/// An answer is written once this much of it is waiting.
const WRITE: usize = 64 * 1024;
/// The most room for answers a connection keeps between requests.
const KEPT: usize = 16 * 1024;

/// What the connection and its owner share.
#[derive(Debug, Default)]
pub(crate) struct Flags {
    /// A graceful shutdown was asked for.
    stop: AtomicBool,
    /// The connection waits for a new head with nothing read of it.
    idle: AtomicBool,
}

/// How serving a connection ended.
pub(crate) enum Outcome<T> {
    /// The connection is done (closed by either side).
    Done,
    /// A request this connection does not serve: hyper takes over, with
    /// the bytes read so far in front.
    HandOver(Rewind<T>),
}

/// Serves `io` until the connection ends or a request must go to hyper;
/// each request through `dispatch`.
pub(crate) async fn serve<T, D, F, B, E>(
    mut io: T,
    dispatch: D,
    max_head: usize,
    stall: Duration,
    flags: Arc<Flags>,
) -> Outcome<T>
where
    T: AsyncRead + AsyncWrite + Unpin,
    D: Fn(Request<ClientBody>) -> F,
    F: Future<Output = Result<Response<B>, E>>,
    B: Body<Data = Bytes>,
{
    let mut buf = BytesMut::new();
    let mut out = BytesMut::new();
    let mut date = super::date::Date::default();
    loop {
        let head = loop {
            if !buf.is_empty() {
                match parse_request(&mut buf, max_head) {
                    Ok(Some(head)) => break head,
                    Ok(None) => {}
                    Err(_) => return hand_over(io, None, buf, stall),
                }
            } else {
                flags.idle.store(true, Ordering::Release);
                if flags.stop.load(Ordering::Acquire) {
                    return Outcome::Done;
                }
            }
            // an emptied buffer starts over at its beginning when it can
            let reclaimed = buf.is_empty() && buf.try_reclaim(READ);
            if !reclaimed && buf.capacity() - buf.len() < READ / 4 {
                buf.reserve(READ);
            }
            let read = io.read_buf(&mut buf).await;
            flags.idle.store(false, Ordering::Release);
            match read {
                Ok(0) | Err(_) => return Outcome::Done,
                Ok(_) => {}
            }
        };
        if !served_here(&head) {
            let raw = head.raw.clone();
            return hand_over(io, Some(raw), buf, stall);
        }
        let RequestHead {
            parts,
            keep_alive,
            trailers,
            ..
        } = head;
        let no_body = parts.method == Method::HEAD;
        let call = dispatch(Request::from_parts(parts, ClientBody::Empty));
        let res = match until_answered(&mut io, &mut buf, call, max_head).await {
            Some(Ok(res)) => res,
            Some(Err(_)) | None => return Outcome::Done,
        };
        let keep_alive = keep_alive && !flags.stop.load(Ordering::Acquire);
        let Ok(keep_alive) = write_answer(
            &mut io,
            &mut out,
            res,
            Written {
                keep_alive,
                no_body,
                trailers,
                stall,
            },
            &mut date,
        )
        .await
        else {
            return Outcome::Done;
        };
        if !keep_alive {
            let _ = io.shutdown().await;
            return Outcome::Done;
        }
        if out.capacity() > KEPT {
            // a large answer's room is not kept for the next
            out = BytesMut::new();
        }
    }
}

/// Whether this connection serves the request of `head` (see the module
/// documentation).
fn served_here(head: &RequestHead) -> bool {
    head.parts.version == Version::HTTP_11
        && head.framing == Framing::Length(0)
        && !head.unusual
        && head.parts.method != Method::CONNECT
}

fn hand_over<T>(io: T, head: Option<Bytes>, rest: BytesMut, stall: Duration) -> Outcome<T> {
    let pre = match head {
        None => rest.freeze(),
        Some(head) if rest.is_empty() => head,
        Some(head) => {
            let mut all = BytesMut::with_capacity(head.len() + rest.len());
            all.extend_from_slice(&head);
            all.extend_from_slice(&rest);
            all.freeze()
        }
    };
    Outcome::HandOver(Rewind {
        pre,
        inner: io,
        stall,
        waiting: None,
    })
}

/// The answer to `call`, while the connection is watched: `None` when the
/// client closed its side (or the socket failed) first, the call dropped.
/// Bytes the client sends meanwhile (a pipelined request) are kept in
/// `buf`, up to a head's bound.
async fn until_answered<T, F, R>(
    io: &mut T,
    buf: &mut BytesMut,
    call: F,
    max_head: usize,
) -> Option<R>
where
    T: AsyncRead + Unpin,
    F: Future<Output = R>,
{
    let mut call = std::pin::pin!(call);
    let mut reading = true;
    std::future::poll_fn(|cx| {
        if let Poll::Ready(r) = call.as_mut().poll(cx) {
            return Poll::Ready(Some(r));
        }
        while reading {
            if buf.len() >= max_head {
                // enough waiting: the next head is read once this is done
                reading = false;
                break;
            }
            if buf.capacity() - buf.len() < READ / 4 {
                buf.reserve(READ);
            }
            // a read future made and polled here: it holds nothing
            // between polls
            let read = std::pin::pin!(io.read_buf(buf));
            match read.poll(cx) {
                Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => return Poll::Ready(None),
                Poll::Ready(Ok(_)) => continue,
                Poll::Pending => break,
            }
        }
        Poll::Pending
    })
    .await
}

/// How an answer is written.
struct Written {
    /// The connection may carry another request after it.
    keep_alive: bool,
    /// The answer to `HEAD`: its fields, none of its body.
    no_body: bool,
    /// The client accepts trailer fields (`TE: trailers`).
    trailers: bool,
    /// The longest the client may take nothing of the answer.
    stall: Duration,
}

/// Writes `res`; whether the connection lives on after it.
async fn write_answer<T, B>(
    io: &mut T,
    out: &mut BytesMut,
    res: Response<B>,
    how: Written,
    date: &mut super::date::Date,
) -> std::io::Result<bool>
where
    T: AsyncWrite + Unpin,
    B: Body<Data = Bytes>,
{
    let (parts, body) = res.into_parts();
    let status = parts.status;
    let no_body = how.no_body
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
        || status.is_informational();
    let mut keep_alive = how.keep_alive;
    put_status_line(out, status);
    let mut dated = false;
    let mut closing = false;
    let mut said = None;
    for (name, value) in &parts.headers {
        if name == CONTENT_LENGTH {
            said = super::scan::parse_decimal(value.as_bytes());
            continue;
        }
        if name == TRANSFER_ENCODING {
            continue;
        }
        if name == CONNECTION {
            closing |= super::scan::lists(value.as_bytes(), b"close");
        }
        dated |= name == DATE;
        put_field(out, name, value);
    }
    // written: the map's room serves a later head
    super::stock::give(parts.headers);
    if closing {
        keep_alive = false;
    } else if !keep_alive {
        out.put_slice(b"connection: close\r\n");
    }
    // the length the answer says, or its body's as far as known; the
    // answer to `HEAD` and a `304` carry no body and say only the length
    // their head says (of the body a `GET` would get)
    let length = match status == StatusCode::NO_CONTENT || status.is_informational() {
        true => None,
        false if no_body => said,
        false => said.or_else(|| body.size_hint().exact()),
    };
    let chunked = length.is_none() && !no_body;
    if let Some(n) = length {
        out.put_slice(b"content-length: ");
        out.put_slice(itoa::Buffer::new().format(n).as_bytes());
        out.put_slice(b"\r\n");
    } else if chunked {
        out.put_slice(b"transfer-encoding: chunked\r\n");
    }
    if !dated {
        out.put_slice(b"date: ");
        out.put_slice(date.now());
        out.put_slice(b"\r\n");
    }
    out.put_slice(b"\r\n");
    if no_body {
        drop(body);
        send(io, out, how.stall).await?;
        return Ok(keep_alive);
    }
    let mut body = std::pin::pin!(body);
    let mut sent = 0u64;
    loop {
        // what is there already goes out with what waits; the rest is
        // awaited once that is written
        let frame = match poll_now(body.as_mut()) {
            Some(f) => f,
            None => {
                if !out.is_empty() {
                    send(io, out, how.stall).await?;
                }
                std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await
            }
        };
        match frame {
            None => break,
            Some(Err(_)) => return Err(std::io::ErrorKind::Other.into()),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => {
                    if data.is_empty() {
                        continue;
                    }
                    sent += data.len() as u64;
                    if length.is_some_and(|n| sent > n) {
                        return Err(std::io::ErrorKind::InvalidData.into());
                    }
                    if chunked {
                        put_hex(out, data.len());
                        out.put_slice(b"\r\n");
                        out.put_slice(&data);
                        out.put_slice(b"\r\n");
                    } else {
                        out.put_slice(&data);
                    }
                }
                Err(frame) => {
                    if let (true, true, Ok(fields)) = (chunked, how.trailers, frame.into_trailers())
                    {
                        out.put_slice(b"0\r\n");
                        put_fields(out, &fields);
                        out.put_slice(b"\r\n");
                        send(io, out, how.stall).await?;
                        return Ok(keep_alive);
                    }
                }
            },
        }
        if out.len() >= WRITE {
            send(io, out, how.stall).await?;
        }
    }
    if length.is_some_and(|n| sent != n) {
        return Err(std::io::ErrorKind::InvalidData.into());
    }
    if chunked {
        out.put_slice(b"0\r\n\r\n");
    }
    send(io, out, how.stall).await?;
    Ok(keep_alive)
}

/// Writes all of `out`, flushes it, and empties it. Most answers go into
/// the socket's buffer at once, and no timer is made for them; past that,
/// each wait for the client to take more is bounded by `stall`. Without
/// the bound, a client that sends requests and never reads the answers
/// would hold its connection, a request in flight, for ever: the idle
/// timer counts only time with no request in flight.
async fn send<T: AsyncWrite + Unpin>(
    io: &mut T,
    out: &mut BytesMut,
    stall: Duration,
) -> std::io::Result<()> {
    let mut at = 0;
    // (the context is not held across the waits below: it is not `Send`)
    if try_send(io, out, &mut at)? {
        out.clear();
        return Ok(());
    }
    let stalled = |_| std::io::Error::from(std::io::ErrorKind::TimedOut);
    while at < out.len() {
        let n = tokio::time::timeout(stall, io.write(&out[at..]))
            .await
            .map_err(stalled)??;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        at += n;
    }
    tokio::time::timeout(stall, io.flush())
        .await
        .map_err(stalled)??;
    out.clear();
    Ok(())
}

/// Writes what it can of `out` from `at` on and flushes, without waiting:
/// whether all of it went.
fn try_send<T: AsyncWrite + Unpin>(
    io: &mut T,
    out: &BytesMut,
    at: &mut usize,
) -> std::io::Result<bool> {
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        let now = match *at < out.len() {
            true => Pin::new(&mut *io).poll_write(&mut cx, &out[*at..]),
            false => match Pin::new(&mut *io).poll_flush(&mut cx) {
                Poll::Ready(Ok(())) => return Ok(true),
                Poll::Ready(Err(e)) => return Err(e),
                Poll::Pending => return Ok(false),
            },
        };
        match now {
            Poll::Ready(Ok(0)) => return Err(std::io::ErrorKind::WriteZero.into()),
            Poll::Ready(Ok(n)) => *at += n,
            Poll::Ready(Err(e)) => return Err(e),
            Poll::Pending => return Ok(false),
        }
    }
}

/// `n` in lowercase hexadecimal, as a chunk's size.
fn put_hex(out: &mut BytesMut, n: usize) {
    let mut digits = [0u8; 16];
    let mut i = digits.len();
    let mut n = n;
    loop {
        i -= 1;
        digits[i] = b"0123456789abcdef"[n & 0xf];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    out.put_slice(&digits[i..]);
}

/// The status line: the common ones written whole, any other from its
/// code and reason.
fn put_status_line(out: &mut BytesMut, status: StatusCode) {
    let line: &[u8] = match status.as_u16() {
        200 => b"HTTP/1.1 200 OK\r\n",
        201 => b"HTTP/1.1 201 Created\r\n",
        204 => b"HTTP/1.1 204 No Content\r\n",
        304 => b"HTTP/1.1 304 Not Modified\r\n",
        400 => b"HTTP/1.1 400 Bad Request\r\n",
        401 => b"HTTP/1.1 401 Unauthorized\r\n",
        404 => b"HTTP/1.1 404 Not Found\r\n",
        429 => b"HTTP/1.1 429 Too Many Requests\r\n",
        502 => b"HTTP/1.1 502 Bad Gateway\r\n",
        503 => b"HTTP/1.1 503 Service Unavailable\r\n",
        _ => {
            out.put_slice(b"HTTP/1.1 ");
            out.put_slice(status.as_str().as_bytes());
            out.put_u8(b' ');
            out.put_slice(status.canonical_reason().unwrap_or("").as_bytes());
            out.put_slice(b"\r\n");
            return;
        }
    };
    out.put_slice(line);
}

fn put_fields(out: &mut BytesMut, fields: &HeaderMap) {
    for (name, value) in fields {
        put_field(out, name, value);
    }
}

/// One field line.
fn put_field(out: &mut BytesMut, name: &http::HeaderName, value: &http::HeaderValue) {
    out.put_slice(name.as_str().as_bytes());
    out.put_slice(b": ");
    out.put_slice(value.as_bytes());
    out.put_slice(b"\r\n");
}

/// What a body's `poll_frame` gives when ready.
type Next<B> = Option<Result<Frame<<B as Body>::Data>, <B as Body>::Error>>;

/// The body's next frame if it is there without waiting.
fn poll_now<B: Body>(body: Pin<&mut B>) -> Option<Next<B>> {
    let mut cx = Context::from_waker(Waker::noop());
    match body.poll_frame(&mut cx) {
        Poll::Ready(f) => Some(f),
        Poll::Pending => None,
    }
}

/// A connection with bytes already read in front of it: what hyper reads
/// first when it takes a connection over. Its writes carry the own
/// connection's bound: a client that takes nothing for `stall` fails the
/// write, and hyper ends the connection (HTTP/1 and HTTP/2 alike). The
/// timer is made only once a write has to wait.
pub(crate) struct Rewind<T> {
    pre: Bytes,
    inner: T,
    stall: Duration,
    /// Since the first write that had to wait, none having gone since.
    waiting: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<T> Rewind<T> {
    /// `inner`, nothing read in front, its writes bounded by `stall`.
    pub(crate) fn new(inner: T, stall: Duration) -> Rewind<T> {
        Rewind {
            pre: Bytes::new(),
            inner,
            stall,
            waiting: None,
        }
    }

    /// What a write that went (or failed) or waits gives: waiting past
    /// the bound is an error.
    fn bounded<R>(
        &mut self,
        cx: &mut Context<'_>,
        r: Poll<std::io::Result<R>>,
    ) -> Poll<std::io::Result<R>> {
        if r.is_ready() {
            self.waiting = None;
            return r;
        }
        let stall = self.stall;
        let waiting = self
            .waiting
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(stall)));
        match waiting.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::ErrorKind::TimedOut.into())),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Rewind<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if !this.pre.is_empty() {
            let n = this.pre.len().min(buf.remaining());
            buf.put_slice(&this.pre.split_to(n));
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Rewind<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.bounded(cx, r)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.bounded(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_flush(cx);
        this.bounded(cx, r)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

pin_project_lite::pin_project! {
    /// A client connection: served here first (see the module
    /// documentation), by hyper once it is handed over.
    #[project = ConnProj]
    pub(crate) enum Conn<O, H, M> {
        /// Served here.
        Own {
            #[pin]
            own: O,
            make: Option<M>,
            flags: Arc<Flags>,
        },
        /// Served by hyper.
        Hyper {
            #[pin]
            conn: H,
        },
    }
}

/// A client connection on `io`, served as `how` says: here, each request
/// through `dispatch`, until it hands over to the connection `hyper`
/// makes; or by that connection from its start. The gateway's and the
/// forward-auth check's.
pub(crate) fn connection<T, D, F, B, E, H, M>(
    io: T,
    dispatch: D,
    hyper: M,
    how: crate::config::Http1Server,
    max_head: usize,
    stall: Duration,
) -> Conn<impl Future<Output = Outcome<T>>, H, M>
where
    T: AsyncRead + AsyncWrite + Unpin,
    D: Fn(Request<ClientBody>) -> F,
    F: Future<Output = Result<Response<B>, E>>,
    B: Body<Data = Bytes>,
    M: FnOnce(Rewind<T>) -> H,
{
    match how {
        crate::config::Http1Server::Paceline => {
            let flags = Arc::new(Flags::default());
            let own = serve(io, dispatch, max_head, stall, flags.clone());
            Conn::own(own, hyper, flags)
        }
        crate::config::Http1Server::Hyper => Conn::hyper(hyper(Rewind::new(io, stall))),
    }
}

impl<O, H, M> Conn<O, H, M> {
    /// A connection served by `own` until it hands over, then by the
    /// connection `make` makes of what it hands over.
    pub(crate) fn own(own: O, make: M, flags: Arc<Flags>) -> Self {
        Conn::Own {
            own,
            make: Some(make),
            flags,
        }
    }

    /// A connection served by hyper from its start.
    pub(crate) fn hyper(conn: H) -> Self {
        Conn::Hyper { conn }
    }
}

impl<T, O, H, M> Future for Conn<O, H, M>
where
    O: Future<Output = Outcome<T>>,
    H: GracefulConnection,
    M: FnOnce(Rewind<T>) -> H,
{
    type Output = Result<(), H::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let next = match self.as_mut().project() {
                ConnProj::Hyper { conn } => return conn.poll(cx),
                ConnProj::Own { own, make, flags } => match own.poll(cx) {
                    Poll::Ready(Outcome::Done) => return Poll::Ready(Ok(())),
                    Poll::Ready(Outcome::HandOver(io)) => {
                        let make = make.take().expect("handed over once");
                        (make(io), flags.stop.load(Ordering::Acquire))
                    }
                    Poll::Pending => {
                        if flags.stop.load(Ordering::Acquire) && flags.idle.load(Ordering::Acquire)
                        {
                            return Poll::Ready(Ok(()));
                        }
                        return Poll::Pending;
                    }
                },
            };
            let (conn, stopping) = next;
            self.set(Conn::Hyper { conn });
            if stopping {
                if let ConnProj::Hyper { conn } = self.as_mut().project() {
                    conn.graceful_shutdown();
                }
            }
        }
    }
}

impl<T, O, H, M> crate::idle::Graceful for Conn<O, H, M>
where
    O: Future<Output = Outcome<T>>,
    H: GracefulConnection,
    M: FnOnce(Rewind<T>) -> H,
{
    type Error = H::Error;

    fn graceful_shutdown(self: Pin<&mut Self>) {
        match self.project() {
            ConnProj::Own { flags, .. } => flags.stop.store(true, Ordering::Release),
            ConnProj::Hyper { conn } => conn.graceful_shutdown(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_sizes_are_lowercase_hex() {
        for n in [0usize, 1, 9, 10, 15, 16, 255, 4096, 65_535, usize::MAX] {
            let mut out = BytesMut::new();
            put_hex(&mut out, n);
            assert_eq!(&out[..], format!("{n:x}").as_bytes());
        }
    }

    #[test]
    fn status_lines_written_whole_are_the_code_and_its_reason() {
        for code in 100..600 {
            let status = StatusCode::from_u16(code).unwrap();
            let mut out = BytesMut::new();
            put_status_line(&mut out, status);
            let reason = status.canonical_reason().unwrap_or("");
            assert_eq!(
                out,
                format!("HTTP/1.1 {code} {reason}\r\n").as_bytes(),
                "{code}"
            );
        }
    }
}
