//! One keep-alive HTTP/1.1 connection to the upstream, cleartext or TLS
//! (an [`Io`]): writing a request, reading until the codec has a whole
//! answer head (while the rest of a request body streams), and filling
//! its buffer for the response body.
//!
//! The cleartext socket keeps its fast paths (a read attempted before
//! readiness is awaited, the socket split by reference while a body
//! streams); under TLS the same steps go through rustls, which may hold
//! bytes on either side, so writes are flushed and a close while idle is
//! looked for in what rustls decrypts, not in the raw socket.

use std::future::Future;
use std::io;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::Method;
use http_body::Body;
use paceline_core::Nanos;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::codec::{parse_head, put_data, BodyFraming, Head, MAX_HEAD};
use super::dial::Io;
use super::error::{BoxError, UpstreamError};

/// Bytes reserved when the read buffer runs low.
pub(super) const READ_CHUNK: usize = 16 * 1024;
/// The least spare room a read is made with.
const MIN_READ: usize = 4 * 1024;

/// One keep-alive HTTP/1.1 connection to the upstream.
pub(crate) struct Conn {
    io: Io,
    /// Bytes read and not consumed yet.
    pub(super) buf: BytesMut,
    /// When it last went idle, by the pool's clock.
    pub(super) since: Nanos,
}

impl Conn {
    /// A connection on `io`, just opened (the pool stamps its age).
    pub(crate) fn new(io: Io) -> Conn {
        Conn {
            io,
            buf: BytesMut::new(),
            since: Nanos::ZERO,
        }
    }

    /// True when the connection cannot carry another request: it has been
    /// seen closed, or it sent something nobody asked for. Costs no system
    /// call unless the socket was reported readable while idle.
    ///
    /// Under TLS the raw socket is not read (its bytes are records, and
    /// some are expected while idle: TLS 1.3 session tickets); rustls
    /// reads and decrypts what is there without waiting: a `close_notify`
    /// or the end of the stream is a close, decrypted bytes (or bytes it
    /// held already) answer nothing, and records with no data in them
    /// leave the connection usable.
    pub(super) fn is_stale(&mut self) -> bool {
        if !self.buf.is_empty() {
            return true;
        }
        let mut probe = [0u8; 1];
        match &mut self.io {
            Io::Plain(s) => match s.try_read(&mut probe) {
                Err(e) => e.kind() != io::ErrorKind::WouldBlock,
                // the end of the stream, or bytes that answer nothing
                Ok(_) => true,
            },
            Io::Tls(s) => {
                let mut cx = Context::from_waker(std::task::Waker::noop());
                let mut probe = tokio::io::ReadBuf::new(&mut probe);
                // ready with nothing read: the end; with a byte: unasked
                tokio::io::AsyncRead::poll_read(std::pin::Pin::new(&mut **s), &mut cx, &mut probe)
                    .is_ready()
            }
        }
    }

    /// Writes `bytes` whole. On failure it also says whether any of them
    /// went out (a request none of which was written is safe to send
    /// again elsewhere).
    pub(crate) async fn write_all(&mut self, bytes: &[u8]) -> Result<(), (bool, UpstreamError)> {
        let mut done = 0;
        while done < bytes.len() {
            match self.io.write(&bytes[done..]).await {
                Ok(0) => {
                    let e = io::Error::from(io::ErrorKind::WriteZero);
                    return Err((done > 0, UpstreamError::Io(e)));
                }
                Ok(n) => done += n,
                Err(e) => return Err((done > 0, UpstreamError::Io(e))),
            }
        }
        if let Io::Tls(s) = &mut self.io {
            // rustls may hold records the socket had no room for: they go
            // out now (a failure here counts as some of it having gone)
            s.flush().await.map_err(|e| (true, UpstreamError::Io(e)))?;
        }
        Ok(())
    }

    /// Reads until a final (non-`1xx`) response head is complete, and
    /// takes it out of the buffer.
    pub(crate) async fn read_head(&mut self, method: &Method) -> Result<Head, UpstreamError> {
        read_head(&mut self.io, &mut self.buf, method).await
    }

    /// Reads what has arrived into the buffer without waiting: the number
    /// of bytes read (0: the upstream closed the connection), or `Pending`
    /// once nothing is there and the task will be woken when there is.
    pub(super) fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        make_room(&mut self.buf);
        match &mut self.io {
            Io::Plain(s) => loop {
                match s.try_read_buf(&mut self.buf) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        match s.poll_read_ready(cx) {
                            Poll::Ready(Ok(())) => {}
                            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                            Poll::Pending => return Poll::Pending,
                        }
                    }
                    done => return Poll::Ready(done),
                }
            },
            Io::Tls(s) => {
                // a read future polled once: it holds nothing across
                // polls, so a new one each time loses nothing
                let read = std::pin::pin!(s.read_buf(&mut self.buf));
                read.poll(cx)
            }
        }
    }

    /// Streams the rest of a request body (`sent` bytes of it went with
    /// the head) while watching for the answer: an upstream may answer
    /// before it has read the whole body (a `413`, say), or answer while it
    /// reads (streaming both ways). An answer that comes before the body
    /// is all sent ends the sending, and the connection is not reused.
    pub(crate) async fn stream_and_read<B>(
        &mut self,
        body: &mut B,
        framing: BodyFraming,
        sent: u64,
        method: &Method,
    ) -> Result<Head, UpstreamError>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: Into<BoxError>,
    {
        match &mut self.io {
            Io::Plain(s) => {
                let (mut rd, mut wr) = s.split();
                let send = send_rest(&mut wr, body, framing, sent);
                let read = read_head(&mut rd, &mut self.buf, method);
                both(send, read).await
            }
            Io::Tls(s) => {
                // one stream that both reads and writes: split behind a
                // lock (an allocation per streamed body, under TLS only)
                let (mut rd, mut wr) = tokio::io::split(&mut **s);
                let send = send_rest(&mut wr, body, framing, sent);
                let read = read_head(&mut rd, &mut self.buf, method);
                both(send, read).await
            }
        }
    }
}

/// Drives `send` (the rest of a request body) and `read` (the answer
/// head) together until the head is there: see
/// [`Conn::stream_and_read`].
async fn both<S, R>(send: S, read: R) -> Result<Head, UpstreamError>
where
    S: Future<Output = Result<(), UpstreamError>>,
    R: Future<Output = Result<Head, UpstreamError>>,
{
    tokio::pin!(send, read);
    let mut sending = true;
    let mut whole = false;
    loop {
        tokio::select! {
            biased;
            head = &mut read => {
                let mut head = head?;
                head.keep_alive &= whole;
                return Ok(head);
            }
            done = &mut send, if sending => {
                sending = false;
                match done {
                    Ok(()) => whole = true,
                    // the client's fault: no answer is waited for
                    Err(e @ UpstreamError::RequestBody(_)) => return Err(e),
                    // the upstream stopped reading: its answer may
                    // still come
                    Err(_) => {}
                }
            }
        }
    }
}

/// Writes the rest of a request body; a body that ends short of (or runs
/// past) its declared length fails, so the upstream never takes the next
/// request's bytes for this one's.
async fn send_rest<W, B>(
    wr: &mut W,
    body: &mut B,
    framing: BodyFraming,
    mut sent: u64,
) -> Result<(), UpstreamError>
where
    W: tokio::io::AsyncWrite + Unpin,
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    use http_body_util::BodyExt;
    let chunked = framing == BodyFraming::Chunked;
    let mut out = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| UpstreamError::RequestBody(e.into()))?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers are not passed on
        };
        sent += data.len() as u64;
        if let BodyFraming::Length(n) = framing {
            if sent > n {
                return Err(UpstreamError::RequestBody(
                    "body longer than its length".into(),
                ));
            }
        }
        out.clear();
        put_data(&mut out, &data, chunked);
        wr.write_all(&out).await.map_err(UpstreamError::Io)?;
        // what TLS holds back goes out before the next frame is waited
        // for (a socket's flush does nothing)
        wr.flush().await.map_err(UpstreamError::Io)?;
    }
    match framing {
        BodyFraming::Length(n) if sent != n => Err(UpstreamError::RequestBody(
            "body shorter than its length".into(),
        )),
        BodyFraming::Length(_) => Ok(()),
        BodyFraming::Chunked => {
            wr.write_all(b"0\r\n\r\n")
                .await
                .map_err(UpstreamError::Io)?;
            wr.flush().await.map_err(UpstreamError::Io)
        }
    }
}

/// Reads from `rd` into `buf` until a final (non-`1xx`) response head is
/// complete, and takes it out of the buffer.
async fn read_head<R: tokio::io::AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut BytesMut,
    method: &Method,
) -> Result<Head, UpstreamError> {
    let mut received = false;
    loop {
        if !buf.is_empty() {
            received = true;
            if let Some(head) = parse_head(buf, method)? {
                return Ok(head);
            }
            if buf.len() > MAX_HEAD {
                return Err(UpstreamError::Protocol("response head too large"));
            }
        }
        make_room(buf);
        match rd.read_buf(buf).await {
            Ok(0) if received => {
                return Err(UpstreamError::Protocol("connection closed inside the head"))
            }
            Ok(0) => return Err(UpstreamError::Closed),
            Ok(_) => {}
            // (under TLS an end without `close_notify` is an error, not
            // an empty read: before any byte, it is the same close)
            Err(e) if !received && (is_reset(&e) || e.kind() == io::ErrorKind::UnexpectedEof) => {
                return Err(UpstreamError::Closed)
            }
            Err(e) => return Err(UpstreamError::Io(e)),
        }
    }
}

/// Room to read into: the buffer's spare space while there is enough of
/// it (answers are small; one allocation serves many), else a fresh chunk.
///
/// A buffer whose bytes were all taken, and which nothing else still
/// holds a part of, starts again at its beginning: reads do not walk on
/// through fresh memory, answer after answer, until the room runs out.
/// With many connections that walk is a buffer's whole size each, where
/// reading at the start keeps to the few cache lines an answer fills.
fn make_room(buf: &mut BytesMut) {
    if buf.is_empty() && buf.try_reclaim(READ_CHUNK) {
        return;
    }
    if buf.capacity() - buf.len() < MIN_READ {
        buf.reserve(READ_CHUNK);
    }
}

fn is_reset(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fills `buf` as a read would, and takes the bytes out as an answer
    /// does: what was taken is returned, still sharing the buffer.
    fn answer(buf: &mut BytesMut, n: usize) -> Bytes {
        make_room(buf);
        buf.extend_from_slice(&vec![b'x'; n]);
        buf.split_to(n).freeze()
    }

    #[test]
    fn an_emptied_buffer_reads_at_its_start_again() {
        let mut buf = BytesMut::new();
        let start = answer(&mut buf, 300).as_ptr();
        // every answer taken and let go: each read lands where the
        // previous one did, not 300 bytes further on
        for _ in 0..100 {
            assert_eq!(answer(&mut buf, 300).as_ptr(), start);
        }
        // a part still held elsewhere (a body chunk not yet written)
        // keeps its bytes: the next read goes past it
        let held = answer(&mut buf, 300);
        let next = answer(&mut buf, 300);
        assert_eq!(held.as_ptr(), start);
        assert_eq!(next.as_ptr(), start.wrapping_add(300));
        assert!(held.iter().all(|&b| b == b'x'));
    }
}
