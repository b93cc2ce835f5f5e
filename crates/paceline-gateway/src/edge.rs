//! The answers to HTTP/1.1 heads hyper refuses to parse, as problem
//! answers like every other refusal of the gateway.
//!
//! Why: hyper parses a request head before any service sees it (a head
//! the gateway's own HTTP/1.1 connection cannot take is handed to hyper
//! as it was read: `h1/conn.rs`). A head it cannot take gets hyper's bare
//! answer (no body): `431` for a head longer
//! than `gateway.max_head_bytes` or with more than [`MAX_FIELDS`] fields,
//! `414` for a request target longer than [`MAX_TARGET`] bytes (hyper's
//! own bound, which no setting moves), `400` for a `Content-Length` that is
//! not a number or a malformed field, and for the two largest 64-bit
//! lengths, which it keeps as internal markers, a `431` that should be a
//! `400`. Each becomes a problem answer naming the bound it broke.
//!
//! HTTP/2 heads are refused by the `h2` layer below hyper: a field list
//! past the bound it announces (`SETTINGS_MAX_HEADER_LIST_SIZE`, the same
//! `gateway.max_head_bytes`) gets a bare `431` on its stream and the
//! stream reset, the connection kept for the others. That answer is
//! written inside `h2`, with no way for the gateway to replace it.
//!
//! [`EdgeIo`] wraps the client socket. Such an answer is the last thing
//! hyper writes on a connection (it says `connection: close`, and nothing
//! else: no service wrote it), so the wrapper holds a write of exactly
//! that shape back, and when the connection ends it hands the socket and
//! the held bytes to [`finish`]. The connection's error then says why: the
//! gateway's problem answer goes out in place of hyper's, or, for any
//! other ending, the held bytes as they were. Every other write passes
//! straight through after a ten-byte comparison.
//!
//! The wrapper also counts the bytes of unfinished request heads in the
//! gateway's memory gauge ([`Buffered`]): what it reads while no request
//! is in flight on its connection is a head in the making, held until the
//! head is handed to the service ([`HeadBytes::dispatched`]). When the
//! gauge is at its bound, such a read is refused and the connection closed
//! before anything more is read. While a request is in flight, a read
//! takes at most [`BODY_READ`] bytes: what hyper holds of a body on its way
//! up is bounded by that, and counted in the body's read-ahead (see
//! `intake.rs`).

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use paceline_wire::problem::{self, Problem, ProblemKind};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

use crate::idle::Activity;
use crate::intake::Buffered;

/// The bytes of a connection's unfinished head counted in the gauge.
#[derive(Debug)]
pub(crate) struct HeadBytes {
    pending: AtomicUsize,
    /// The most counted for one connection: what it can hold of heads not
    /// handed on. HTTP/1: hyper's read buffer, bounded by the head bound
    /// (its last read may overshoot it); HTTP/2: one header block being
    /// decoded and a frame. Past it, bytes read are not kept (an HTTP/2
    /// connection whose streams `h2` refuses for their heads discards
    /// them), so they are not counted: a client cannot fill the gauge
    /// for everyone from one connection that never gets a request in.
    limit: usize,
    gauge: Arc<Buffered>,
}

impl HeadBytes {
    /// The head bytes of a connection whose heads are bounded by
    /// `max_head` bytes.
    pub(crate) fn new(gauge: Arc<Buffered>, max_head: usize) -> Arc<HeadBytes> {
        Arc::new(HeadBytes {
            pending: AtomicUsize::new(0),
            limit: 2 * max_head + BODY_READ,
            gauge,
        })
    }

    /// The head read so far went to the service: its bytes are no longer
    /// held for an unfinished head.
    pub(crate) fn dispatched(&self) {
        let n = self.pending.swap(0, Ordering::AcqRel);
        self.gauge.give_back(n);
    }
}

/// The gauge's part of a connection's socket.
pub(crate) struct Metered {
    pub(crate) head: Arc<HeadBytes>,
    pub(crate) activity: Arc<Activity>,
}

/// The most bytes one read takes while a request is in flight: the part of
/// a streaming body that hyper holds at once on an HTTP/1 connection.
pub(crate) const BODY_READ: usize = 16 * 1024;

/// The longest write taken for one of hyper's own answers.
const MAX_OWN_ANSWER: usize = 256;

/// The most fields a request head may have: hyper's HTTP/1 parser refuses
/// more (its default, which the gateway keeps: each field costs it room
/// for every head it parses).
pub(crate) const MAX_FIELDS: usize = 100;

/// The longest request target hyper's HTTP/1 parser takes, in bytes; not
/// configurable. It matters only when `gateway.max_head_bytes` is above
/// 64 KiB: a shorter head bound is met first.
pub(crate) const MAX_TARGET: usize = u16::MAX as usize - 1;

/// What a connection leaves behind for [`finish`]: the socket, the answer
/// held back, and how much was read since the gateway last wrote.
pub(crate) struct Left<T = TcpStream> {
    io: T,
    held: Vec<u8>,
    read_since_write: usize,
    lines_since_write: usize,
}

/// A client socket that holds back hyper's own answers (see the module
/// documentation).
pub(crate) struct EdgeIo<T = TcpStream> {
    io: Option<T>,
    held: Vec<u8>,
    /// Bytes read since the last write: a head past the bound has filled
    /// the read buffer, a bad length has not.
    read_since_write: usize,
    /// Line ends in the heads read since the last write: a head with too
    /// many fields has more than [`MAX_FIELDS`] of them, a bad length not.
    lines_since_write: usize,
    left: Option<oneshot::Sender<Left<T>>>,
    metered: Option<Metered>,
}

impl<T: AsyncRead + AsyncWrite + Unpin> EdgeIo<T> {
    /// Wraps `io` (a TCP socket, or a TLS stream over one); the receiver
    /// gets what is left when the connection ends with an answer held.
    pub(crate) fn new(io: T) -> (EdgeIo<T>, oneshot::Receiver<Left<T>>) {
        let (tx, rx) = oneshot::channel();
        let io = EdgeIo {
            io: Some(io),
            held: Vec::new(),
            read_since_write: 0,
            lines_since_write: 0,
            left: Some(tx),
            metered: None,
        };
        (io, rx)
    }

    /// Counts what is read for unfinished heads in the gauge of `m`.
    pub(crate) fn metered(mut self, m: Metered) -> Self {
        self.metered = Some(m);
        self
    }

    /// A read while a head is in the making: within the gauge's bound, or
    /// refused (the end of the stream: hyper closes the connection).
    fn poll_read_head(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let head = &*self.metered.as_ref().expect("metered").head;
        let gauge = &*head.gauge;
        let io = Pin::new(self.io.as_mut().expect("the socket is there until drop"));
        let room = head
            .limit
            .saturating_sub(head.pending.load(Ordering::Acquire));
        if room == 0 {
            // bytes that are not kept (see `HeadBytes::limit`)
            let before = buf.filled().len();
            let r = io.poll_read(cx, buf);
            self.read_since_write += buf.filled().len() - before;
            return r;
        }
        let want = buf.remaining().min(room);
        let got = gauge.reserve_up_to(want);
        if got == 0 {
            tracing::debug!("buffered bytes at their bound: connection closed");
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let r = if got == buf.remaining() {
            io.poll_read(cx, buf)
        } else {
            // near the bound: read no more than the room there is
            let mut room = vec![0u8; got];
            let mut small = ReadBuf::new(&mut room);
            let r = io.poll_read(cx, &mut small);
            buf.put_slice(small.filled());
            r
        };
        let n = buf.filled().len() - before;
        head.pending.fetch_add(n, Ordering::AcqRel);
        gauge.give_back(got - n);
        self.read_since_write += n;
        self.lines_since_write += newlines(&buf.filled()[before..]);
        r
    }

    fn io(&mut self) -> Pin<&mut T> {
        Pin::new(self.io.as_mut().expect("the socket is there until drop"))
    }

    /// Writes what is held, if anything, before anything else.
    #[inline]
    fn release(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.held.is_empty() {
            true => Poll::Ready(Ok(())),
            false => self.release_held(cx),
        }
    }

    #[cold]
    fn release_held(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.held.is_empty() {
            let held = std::mem::take(&mut self.held);
            let r = self.io().poll_write(cx, &held);
            self.held = held;
            match std::task::ready!(r) {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok(n) => {
                    self.held.drain(..n);
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        Poll::Ready(Ok(()))
    }
}

/// Whether `buf` is one of hyper's own answers: a `4xx` head alone that
/// closes the connection and announces no body.
fn is_own_answer(buf: &[u8]) -> bool {
    // the status's first digit first: most answers are not 4xx
    buf.len() <= MAX_OWN_ANSWER
        && buf.get(9) == Some(&b'4')
        && buf.starts_with(b"HTTP/1.1 4")
        && buf.ends_with(b"\r\n\r\n")
        && contains(buf, b"\r\nconnection: close\r\n")
        && contains(buf, b"\r\ncontent-length: 0\r\n")
        && !contains(buf, b"\r\ncontent-type:")
}

/// How many `\n` bytes `b` holds, read eight at a time: every head byte
/// read goes through it.
fn newlines(b: &[u8]) -> usize {
    const LOW: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    const ONES: u64 = 0x0101_0101_0101_0101;
    let mut chunks = b.chunks_exact(8);
    let mut n = 0;
    for c in &mut chunks {
        let word = u64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        // a byte that was `\n` is zero now
        let x = word ^ (ONES * u64::from(b'\n'));
        // the high bit of each zero byte, and of no other: no carry
        // crosses a byte, (x & 0x7f) + 0x7f being at most 0xfe
        let zero = !(((x & LOW) + LOW) | x | LOW);
        // one per zero byte, summed into the top byte
        n += ((zero >> 7).wrapping_mul(ONES) >> 56) as usize;
    }
    n + chunks.remainder().iter().filter(|&&c| c == b'\n').count()
}

fn contains(buf: &[u8], what: &[u8]) -> bool {
    buf.windows(what.len()).any(|w| w == what)
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for EdgeIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        std::task::ready!(this.release(cx))?;
        if this
            .metered
            .as_ref()
            .is_some_and(|m| m.activity.in_flight() == 0)
        {
            return this.poll_read_head(cx, buf);
        }
        let before = buf.filled().len();
        let r = if buf.remaining() <= BODY_READ {
            this.io().poll_read(cx, buf)
        } else {
            // a body's bytes, or the frames of an HTTP/2 connection: no
            // more than `BODY_READ` at once
            buf.initialize_unfilled_to(BODY_READ);
            let mut part = buf.take(BODY_READ);
            let r = this.io().poll_read(cx, &mut part);
            let n = part.filled().len();
            buf.advance(n);
            r
        };
        this.read_since_write += buf.filled().len() - before;
        r
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncWrite for EdgeIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        std::task::ready!(this.release(cx))?;
        if is_own_answer(buf) {
            this.held.extend_from_slice(buf);
            return Poll::Ready(Ok(buf.len()));
        }
        this.read_since_write = 0;
        this.lines_since_write = 0;
        this.io().poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // a held answer waits for the connection's end
        match this.held.is_empty() {
            true => this.io().poll_flush(cx),
            false => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match this.held.is_empty() {
            true => this.io().poll_shutdown(cx),
            // shut down by `finish`, once the answer is written
            false => Poll::Ready(Ok(())),
        }
    }
}

impl<T> Drop for EdgeIo<T> {
    fn drop(&mut self) {
        if let Some(m) = &self.metered {
            m.head.dispatched();
        }
        if self.held.is_empty() {
            return;
        }
        if let (Some(io), Some(tx)) = (self.io.take(), self.left.take()) {
            let _ = tx.send(Left {
                io,
                held: std::mem::take(&mut self.held),
                read_since_write: self.read_since_write,
                lines_since_write: self.lines_since_write,
            });
        }
    }
}

/// After a connection ended (with `error`, if it failed): writes the
/// answer it left held, as a problem answer under `base` when the error
/// says why, within `bound`.
pub(crate) async fn finish<T: AsyncWrite + Unpin>(
    left: oneshot::Receiver<Left<T>>,
    error: Option<Box<dyn std::error::Error + Send + Sync>>,
    max_head: usize,
    base: impl FnOnce() -> String,
    bound: Duration,
) {
    // a connection that held nothing sent nothing
    let Ok(mut left) = left.await else {
        return;
    };
    let read = Read {
        filled: left.read_since_write >= max_head,
        lines: left.lines_since_write,
        max_head,
    };
    let answer = error
        .as_deref()
        .and_then(|e| refusal(e, &read))
        .map(|(kind, detail)| wire(&problem::answer(&Problem::new(kind, &base(), detail))));
    let bytes = answer.as_deref().unwrap_or(&left.held);
    let _ = tokio::time::timeout(bound, async {
        left.io.write_all(bytes).await?;
        left.io.shutdown().await
    })
    .await;
}

/// What the connection had read of the head hyper refused.
struct Read {
    /// The connection's read buffer was full.
    filled: bool,
    /// Line ends read since the gateway last wrote.
    lines: usize,
    /// The head bound, `gateway.max_head_bytes`.
    max_head: usize,
}

/// The problem for a head hyper refused with `error`, its detail naming
/// the bound the head broke.
fn refusal(
    error: &(dyn std::error::Error + 'static),
    read: &Read,
) -> Option<(ProblemKind, String)> {
    const LENGTH: &str = "Content-Length must be one decimal number that fits in 64 bits.";
    let e = find_hyper(error)?;
    if !e.is_parse() {
        return None;
    }
    // hyper names some faults only in its message
    let text = e.to_string();
    if text.contains("URI too long") {
        return Some((
            ProblemKind::UriTooLong,
            format!("The request target is longer than {MAX_TARGET} bytes."),
        ));
    }
    if e.is_parse_too_large() {
        // a full buffer, too many fields, or one of the two lengths hyper
        // keeps as markers: told apart by what was read
        return Some(if read.filled {
            (
                ProblemKind::HeadTooLarge,
                format!("The request head is longer than {} bytes.", read.max_head),
            )
        } else if read.lines > MAX_FIELDS + 1 {
            (
                ProblemKind::HeadTooLarge,
                format!("The request head has more than {MAX_FIELDS} fields."),
            )
        } else {
            (ProblemKind::BadRequest, LENGTH.to_string())
        });
    }
    Some(match text.contains("content-length") {
        true => (ProblemKind::BadRequest, LENGTH.to_string()),
        false => (
            ProblemKind::BadRequest,
            "The request head could not be parsed.".to_string(),
        ),
    })
}

fn find_hyper<'a>(mut e: &'a (dyn std::error::Error + 'static)) -> Option<&'a hyper::Error> {
    loop {
        if let Some(h) = e.downcast_ref::<hyper::Error>() {
            return Some(h);
        }
        e = e.source()?;
    }
}

/// An answer as HTTP/1.1 bytes, closing the connection.
fn wire(r: &Response<Bytes>) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + r.body().len());
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(r.status().as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(r.status().canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in r.headers() {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"connection: close\r\ncontent-length: ");
    out.extend_from_slice(itoa::Buffer::new().format(r.body().len()).as_bytes());
    out.extend_from_slice(b"\r\n\r\n");
    out.extend_from_slice(r.body());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #[test]
        fn newlines_are_counted_as_a_byte_scan_counts_them(
            b in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::strategy::Just(b'\n'),
                    proptest::strategy::Just(b'\r'),
                    proptest::strategy::Just(0x8au8),
                    proptest::strategy::Just(0x0bu8),
                    proptest::strategy::Just(0u8),
                    proptest::strategy::Just(0xffu8),
                    0u8..=255,
                ],
                0..70,
            )
        ) {
            let by_byte = b.iter().filter(|&&c| c == b'\n').count();
            proptest::prop_assert_eq!(newlines(&b), by_byte);
        }
    }

    #[test]
    fn only_hypers_own_answers_are_held() {
        let own = b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\ndate: Tue, 01 Dec 2026 21:00:00 GMT\r\n\r\n";
        assert!(is_own_answer(own));
        assert!(!is_own_answer(
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
        ));
        let problem = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/problem+json\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";
        assert!(!is_own_answer(problem));
        let kept_open = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n";
        assert!(!is_own_answer(kept_open));
    }

    #[test]
    fn answers_are_written_whole() {
        let r = problem::answer(&Problem::new(ProblemKind::HeadTooLarge, "https://e/", "x"));
        let text = String::from_utf8(wire(&r)).unwrap();
        assert!(
            text.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"),
            "{text}"
        );
        assert!(text.contains("\r\nconnection: close\r\n"), "{text}");
        let (_, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(
            text.contains(&format!("\r\ncontent-length: {}\r\n", body.len())),
            "{text}"
        );
        assert!(
            body.contains("\"type\":\"https://e/head_too_large\""),
            "{body}"
        );
    }
}
