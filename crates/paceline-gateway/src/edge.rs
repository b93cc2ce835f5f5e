//! The answers to HTTP/1.1 heads hyper refuses to parse, as problem
//! answers like every other refusal of the gateway.
//!
//! Why: hyper parses a request head before any service sees it. A head it
//! cannot take — longer than `gateway.max_head_bytes`, a `Content-Length`
//! that is not a number, a malformed field — gets hyper's bare answer
//! (`400` or `431`, no body), and for the two largest 64-bit lengths,
//! which it keeps as internal markers, a `431` that should be a `400`.
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
//! before anything more is read.

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
    gauge: Arc<Buffered>,
}

impl HeadBytes {
    pub(crate) fn new(gauge: Arc<Buffered>) -> Arc<HeadBytes> {
        Arc::new(HeadBytes {
            pending: AtomicUsize::new(0),
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

/// The longest write taken for one of hyper's own answers.
const MAX_OWN_ANSWER: usize = 256;

/// What a connection leaves behind for [`finish`]: the socket, the answer
/// held back, and how much was read since the gateway last wrote.
pub(crate) struct Left {
    io: TcpStream,
    held: Vec<u8>,
    read_since_write: usize,
}

/// A client socket that holds back hyper's own answers (see the module
/// documentation).
pub(crate) struct EdgeIo {
    io: Option<TcpStream>,
    held: Vec<u8>,
    /// Bytes read since the last write: a head past the bound has filled
    /// the read buffer, a bad length has not.
    read_since_write: usize,
    left: Option<oneshot::Sender<Left>>,
    metered: Option<Metered>,
}

impl EdgeIo {
    /// Wraps `io`; the receiver gets what is left when the connection
    /// ends with an answer held.
    pub(crate) fn new(io: TcpStream) -> (EdgeIo, oneshot::Receiver<Left>) {
        let (tx, rx) = oneshot::channel();
        let io = EdgeIo {
            io: Some(io),
            held: Vec::new(),
            read_since_write: 0,
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
    #[cold]
    fn poll_read_head(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let (gauge, head) = {
            let m = self.metered.as_ref().expect("metered");
            (m.head.gauge.clone(), m.head.clone())
        };
        let want = buf.remaining();
        let got = gauge.reserve_up_to(want);
        if got == 0 {
            tracing::debug!("buffered bytes at their bound: connection closed");
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let r = if got == want {
            self.io().poll_read(cx, buf)
        } else {
            // near the bound: read no more than the room there is
            let mut room = vec![0u8; got];
            let mut small = ReadBuf::new(&mut room);
            let r = self.io().poll_read(cx, &mut small);
            buf.put_slice(small.filled());
            r
        };
        let n = buf.filled().len() - before;
        head.pending.fetch_add(n, Ordering::AcqRel);
        gauge.give_back(got - n);
        self.read_since_write += n;
        r
    }

    fn io(&mut self) -> Pin<&mut TcpStream> {
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

fn contains(buf: &[u8], what: &[u8]) -> bool {
    buf.windows(what.len()).any(|w| w == what)
}

impl AsyncRead for EdgeIo {
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
        let r = this.io().poll_read(cx, buf);
        this.read_since_write += buf.filled().len() - before;
        r
    }
}

impl AsyncWrite for EdgeIo {
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

impl Drop for EdgeIo {
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
            });
        }
    }
}

/// After a connection ended (with `error`, if it failed): writes the
/// answer it left held, as a problem answer under `base` when the error
/// says why, within `bound`.
pub(crate) async fn finish(
    left: oneshot::Receiver<Left>,
    error: Option<Box<dyn std::error::Error + Send + Sync>>,
    max_head: usize,
    base: impl FnOnce() -> String,
    bound: Duration,
) {
    // a connection that held nothing sent nothing
    let Ok(mut left) = left.await else {
        return;
    };
    let answer = error
        .as_deref()
        .and_then(|e| refusal(e, left.read_since_write >= max_head))
        .map(|(kind, detail)| wire(&problem::answer(&Problem::new(kind, &base(), detail))));
    let bytes = answer.as_deref().unwrap_or(&left.held);
    let _ = tokio::time::timeout(bound, async {
        left.io.write_all(bytes).await?;
        left.io.shutdown().await
    })
    .await;
}

/// The problem for a head hyper refused with `error`; `filled`: the
/// connection's read buffer was full.
fn refusal(
    error: &(dyn std::error::Error + 'static),
    filled: bool,
) -> Option<(ProblemKind, &'static str)> {
    let e = find_hyper(error)?;
    if e.is_parse_too_large() {
        return Some(match filled {
            true => (
                ProblemKind::HeadTooLarge,
                "The request head is longer than this gateway accepts.",
            ),
            false => (
                ProblemKind::BadRequest,
                "Content-Length must be one decimal number that fits in 64 bits.",
            ),
        });
    }
    if !e.is_parse() {
        return None;
    }
    // hyper names the fault only in its message
    let text = e.to_string();
    Some(match text.contains("content-length") {
        true => (
            ProblemKind::BadRequest,
            "Content-Length must be one decimal number that fits in 64 bits.",
        ),
        false if text.contains("URI too long") => return None,
        false => (
            ProblemKind::BadRequest,
            "The request head could not be parsed.",
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
