//! The upstream side of the proxy: HTTP/1.1 over pooled keep-alive
//! connections, driven inside the request's own task.
//!
//! A general client runs each connection as a task of its own and hands
//! requests, responses and body chunks over channels; for a proxy that
//! only ever sends one request at a time on a connection, that is most of
//! its cost. Here the request task writes the head, reads the response
//! head, and the response body reads the rest straight from the socket
//! while the client connection polls it. A response whose body came with
//! its head (the common case for API answers) gives its connection back
//! before the head is even returned.
//!
//! Message framing follows RFC 9112: `Content-Length`, `chunked`, or the
//! end of the connection; `1xx` answers are skipped; answers to `HEAD`
//! and `204`/`304` have no body. Anything malformed fails the exchange and
//! the connection is dropped, never reused.

use std::fmt;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use quanta::Instant;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Version};
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The longest response head accepted.
const MAX_HEAD: usize = 64 * 1024;
/// The most fields in a response head.
const MAX_FIELDS: usize = 100;
/// The longest chunk-size line (with extensions) accepted.
const MAX_CHUNK_LINE: usize = 4096;
/// The most trailer bytes skipped after the last chunk.
const MAX_TRAILERS: usize = 16 * 1024;
/// Bytes reserved when the read buffer runs low.
const READ_CHUNK: usize = 16 * 1024;
/// The least spare room a read is made with.
const MIN_READ: usize = 4 * 1024;
/// Idle connections kept per upstream at most.
const MAX_IDLE: usize = 1024;

/// Why an exchange with the upstream failed.
#[derive(Debug)]
pub(crate) enum UpstreamError {
    /// No connection could be opened.
    Connect(io::Error),
    /// The connection ended before any byte of an answer arrived.
    Closed,
    /// Reading or writing failed.
    Io(io::Error),
    /// The answer broke the protocol.
    Protocol(&'static str),
    /// The client's request body failed or stalled.
    RequestBody(crate::proxy::BoxError),
}

impl fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UpstreamError::Connect(e) => write!(f, "connect: {e}"),
            UpstreamError::Closed => f.write_str("connection closed before an answer"),
            UpstreamError::Io(e) => write!(f, "i/o: {e}"),
            UpstreamError::Protocol(what) => write!(f, "malformed answer: {what}"),
            UpstreamError::RequestBody(e) => write!(f, "request body: {e}"),
        }
    }
}

impl std::error::Error for UpstreamError {}

/// An error inside a response body.
#[derive(Debug)]
pub(crate) struct BodyError(&'static str);

impl fmt::Display for BodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "upstream body: {}", self.0)
    }
}

impl std::error::Error for BodyError {}

/// One keep-alive HTTP/1.1 connection to the upstream.
pub(crate) struct Conn {
    io: TcpStream,
    /// Bytes read and not consumed yet.
    buf: BytesMut,
    /// When it last went idle.
    since: Instant,
}

impl Conn {
    /// Opens a connection within `timeout`.
    pub(crate) async fn connect(
        host: &str,
        port: u16,
        timeout: Duration,
    ) -> Result<Conn, UpstreamError> {
        let dial = TcpStream::connect((host, port));
        let io = match tokio::time::timeout(timeout, dial).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(UpstreamError::Connect(e)),
            Err(_) => {
                return Err(UpstreamError::Connect(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "connect timed out",
                )))
            }
        };
        let _ = io.set_nodelay(true);
        Ok(Conn {
            io,
            buf: BytesMut::new(),
            since: Instant::now(),
        })
    }

    /// True when the connection cannot carry another request: it has been
    /// seen closed, or it sent something nobody asked for. Costs no system
    /// call unless the socket was reported readable while idle.
    fn is_stale(&self) -> bool {
        if !self.buf.is_empty() {
            return true;
        }
        let mut probe = [0u8; 1];
        match self.io.try_read(&mut probe) {
            Err(e) => e.kind() != io::ErrorKind::WouldBlock,
            // the end of the stream, or bytes that answer nothing
            Ok(_) => true,
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
        Ok(())
    }

    /// Reads until a final (non-`1xx`) response head is complete, and
    /// takes it out of the buffer.
    pub(crate) async fn read_head(&mut self, method: &Method) -> Result<Head, UpstreamError> {
        read_head(&mut self.io, &mut self.buf, method).await
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
        B::Error: Into<crate::proxy::BoxError>,
    {
        let (mut rd, mut wr) = self.io.split();
        let send = send_rest(&mut wr, body, framing, sent);
        let read = read_head(&mut rd, &mut self.buf, method);
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
}

/// How a streamed request body is framed upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BodyFraming {
    /// `Content-Length` of this many bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// Appends one piece of body to `out`, chunk-framed when `chunked`.
pub(crate) fn put_data(out: &mut BytesMut, data: &[u8], chunked: bool) {
    use bytes::BufMut;
    if data.is_empty() {
        return;
    }
    if chunked {
        use std::fmt::Write;
        // BytesMut grows as it is written to: this cannot fail
        let _ = write!(out, "{:x}\r\n", data.len());
        out.put_slice(data);
        out.put_slice(b"\r\n");
    } else {
        out.put_slice(data);
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
    B::Error: Into<crate::proxy::BoxError>,
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
    }
    match framing {
        BodyFraming::Length(n) if sent != n => Err(UpstreamError::RequestBody(
            "body shorter than its length".into(),
        )),
        BodyFraming::Length(_) => Ok(()),
        BodyFraming::Chunked => wr.write_all(b"0\r\n\r\n").await.map_err(UpstreamError::Io),
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
            Err(e) if !received && is_reset(&e) => return Err(UpstreamError::Closed),
            Err(e) => return Err(UpstreamError::Io(e)),
        }
    }
}

/// Room to read into: the buffer's spare space while there is enough of
/// it (answers are small; one allocation serves many), else a fresh chunk.
fn make_room(buf: &mut BytesMut) {
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

/// Keep-alive connections to one upstream, the most recently used on top.
pub(crate) struct Pool {
    idle: parking_lot::Mutex<Vec<Conn>>,
    host: String,
    port: u16,
    connect_timeout: Duration,
    idle_timeout: Duration,
}

impl Pool {
    /// A pool for `host:port`.
    pub(crate) fn new(
        host: &str,
        port: u16,
        connect_timeout: Duration,
        idle_timeout: Duration,
    ) -> Pool {
        Pool {
            idle: parking_lot::Mutex::new(Vec::new()),
            host: host.to_string(),
            port,
            connect_timeout,
            idle_timeout,
        }
    }

    /// An idle connection that is still open and not too old at `now`.
    pub(crate) fn take(&self, now: Instant) -> Option<Conn> {
        loop {
            // the lock is held for the pop only, not for the check
            let c = self.idle.lock().pop()?;
            if now.saturating_duration_since(c.since) < self.idle_timeout && !c.is_stale() {
                return Some(c);
            }
        }
    }

    /// A new connection.
    pub(crate) async fn connect(&self) -> Result<Conn, UpstreamError> {
        Conn::connect(&self.host, self.port, self.connect_timeout).await
    }

    /// Puts a connection whose exchange ended at `now` back on the stack.
    pub(crate) fn put(&self, mut conn: Conn, now: Instant) {
        if !conn.buf.is_empty() {
            return;
        }
        conn.since = now;
        // don't keep a large buffer around for every idle connection
        if conn.buf.capacity() > 4 * READ_CHUNK {
            conn.buf = BytesMut::new();
        }
        let mut idle = self.idle.lock();
        // the oldest are at the bottom: drop the ones idle too long
        let stale = idle
            .iter()
            .take_while(|c| now.saturating_duration_since(c.since) >= self.idle_timeout)
            .count();
        if stale > 0 {
            idle.drain(..stale);
        }
        if idle.len() < MAX_IDLE {
            idle.push(conn);
        }
    }
}

/// A final response head and how its body is framed.
#[derive(Debug)]
pub(crate) struct Head {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) framing: Framing,
    /// The connection may carry another request once the body is read.
    pub(crate) keep_alive: bool,
}

/// How a response body ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Framing {
    /// After this many more bytes.
    Length(u64),
    /// With the last chunk.
    Chunked(Chunk),
    /// When the upstream closes the connection.
    Close,
}

/// Where a chunked decoder is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Chunk {
    /// Expecting a chunk-size line.
    Size,
    /// Inside a chunk, with this many bytes left.
    Data(u64),
    /// Expecting the CRLF after a chunk's data.
    DataEnd,
    /// After the last chunk, skipping trailer fields (bytes skipped so far).
    Trailers(usize),
    /// Done.
    End,
}

/// Parses a response head at the start of `buf`: `Ok(None)` when more
/// bytes are needed. Interim (`1xx`) heads are consumed and skipped.
pub(crate) fn parse_head(
    buf: &mut BytesMut,
    method: &Method,
) -> Result<Option<Head>, UpstreamError> {
    loop {
        // left uninitialised: the parser writes only the fields it finds
        let mut fields =
            [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_FIELDS];
        let mut res = httparse::Response::new(&mut []);
        let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
            &mut res,
            buf,
            &mut fields,
        );
        let len = match parsed {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => {
                return Err(UpstreamError::Protocol("too many fields"))
            }
            Err(_) => return Err(UpstreamError::Protocol("unparsable head")),
        };
        let code = res.code.unwrap_or(0);
        let status =
            StatusCode::from_u16(code).map_err(|_| UpstreamError::Protocol("bad status code"))?;
        if status == StatusCode::SWITCHING_PROTOCOLS {
            return Err(UpstreamError::Protocol("protocol switch not supported"));
        }
        if status.is_informational() {
            buf.advance(len);
            continue;
        }
        let version = match res.version {
            Some(0) => Version::HTTP_10,
            _ => Version::HTTP_11,
        };
        // one pass: where each field is (its value will share the head's
        // bytes instead of being copied), and what frames the body
        let base = buf.as_ptr() as usize;
        let mut spans = [(0u32, 0u32, 0u32, 0u32); MAX_FIELDS];
        let mut scan = Scan::default();
        for (span, f) in spans.iter_mut().zip(res.headers.iter()) {
            let name = f.name.as_bytes();
            scan.field(name, f.value)?;
            let ns = (name.as_ptr() as usize - base) as u32;
            let vs = (f.value.as_ptr() as usize - base) as u32;
            *span = (ns, ns + name.len() as u32, vs, vs + f.value.len() as u32);
        }
        if scan.chunked.is_some() && version == Version::HTTP_10 {
            return Err(UpstreamError::Protocol(
                "transfer-encoding in an HTTP/1.0 answer",
            ));
        }
        if scan.chunked == Some(false) {
            return Err(UpstreamError::Protocol(
                "a transfer coding other than chunked",
            ));
        }
        let count = res.headers.len();
        let head = buf.split_to(len).freeze();
        // room for the fields the layers add on the way back
        let mut headers = HeaderMap::with_capacity(count + 6);
        for &(ns, ne, vs, ve) in &spans[..count] {
            let name = HeaderName::from_bytes(&head[ns as usize..ne as usize])
                .map_err(|_| UpstreamError::Protocol("bad field name"))?;
            let value = HeaderValue::from_maybe_shared(head.slice(vs as usize..ve as usize))
                .map_err(|_| UpstreamError::Protocol("bad field value"))?;
            headers.append(name, value);
        }
        if scan.chunked.is_some() {
            // the chunks frame the body; a length beside them means nothing
            // and must not reach the client (RFC 9112 §6.3)
            headers.remove(http::header::CONTENT_LENGTH);
        }
        let framing = scan.framing(status, method);
        let keep_alive = scan.keep_alive(version) && framing != Framing::Close;
        return Ok(Some(Head {
            status,
            headers,
            framing,
            keep_alive,
        }));
    }
}

/// What a response head says about its body and its connection.
#[derive(Default)]
struct Scan {
    length: Option<u64>,
    /// `Some(true)` when `Transfer-Encoding` is `chunked` alone,
    /// `Some(false)` when it names anything else (refused).
    chunked: Option<bool>,
    close: bool,
    keep_alive: bool,
}

impl Scan {
    fn field(&mut self, name: &[u8], value: &[u8]) -> Result<(), UpstreamError> {
        if name.eq_ignore_ascii_case(b"content-length") {
            for part in value.split(|&b| b == b',') {
                let n = parse_decimal(trim(part))
                    .ok_or(UpstreamError::Protocol("bad content-length"))?;
                if self.length.is_some_and(|l| l != n) {
                    return Err(UpstreamError::Protocol("conflicting content-length"));
                }
                self.length = Some(n);
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            // chunked alone: a body under another coding could be neither
            // framed nor passed on as it is (the field does not travel)
            for t in value
                .split(|&b| b == b',')
                .map(trim)
                .filter(|t| !t.is_empty())
            {
                let first = self.chunked.is_none();
                self.chunked = Some(first && t.eq_ignore_ascii_case(b"chunked"));
            }
            self.chunked = self.chunked.or(Some(false));
        } else if name.eq_ignore_ascii_case(b"connection") {
            for t in value.split(|&b| b == b',') {
                let t = trim(t);
                self.close |= t.eq_ignore_ascii_case(b"close");
                self.keep_alive |= t.eq_ignore_ascii_case(b"keep-alive");
            }
        }
        Ok(())
    }

    /// How the body is delimited (RFC 9112 §6.3).
    fn framing(&self, status: StatusCode, method: &Method) -> Framing {
        if method == Method::HEAD
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED
        {
            return Framing::Length(0);
        }
        match (self.chunked, self.length) {
            (Some(_), _) => Framing::Chunked(Chunk::Size),
            (None, Some(n)) => Framing::Length(n),
            (None, None) => Framing::Close,
        }
    }

    /// Whether the upstream keeps the connection open after this answer.
    fn keep_alive(&self, version: Version) -> bool {
        match version {
            Version::HTTP_10 => self.keep_alive && !self.close,
            _ => !self.close,
        }
    }
}

fn trim(b: &[u8]) -> &[u8] {
    let start = b
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &b[start..end]
}

fn parse_decimal(b: &[u8]) -> Option<u64> {
    if b.is_empty() || b.len() > 19 {
        return None;
    }
    b.iter().try_fold(0u64, |n, &c| {
        c.is_ascii_digit().then(|| n * 10 + u64::from(c - b'0'))
    })
}

/// What the decoder found in the buffer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Body bytes.
    Data(Bytes),
    /// The buffer holds no complete next piece.
    NeedMore,
    /// The body is complete.
    End,
}

impl Framing {
    /// Takes the next piece of body out of `buf`.
    pub(crate) fn decode(&mut self, buf: &mut BytesMut) -> Result<Step, BodyError> {
        match self {
            Framing::Length(0) => Ok(Step::End),
            Framing::Length(left) => {
                if buf.is_empty() {
                    return Ok(Step::NeedMore);
                }
                let n = (*left).min(buf.len() as u64) as usize;
                *left -= n as u64;
                Ok(Step::Data(buf.split_to(n).freeze()))
            }
            Framing::Close => match buf.is_empty() {
                true => Ok(Step::NeedMore),
                false => Ok(Step::Data(buf.split().freeze())),
            },
            Framing::Chunked(state) => decode_chunked(state, buf),
        }
    }

    /// True once nothing more is to come.
    pub(crate) fn is_end(&self) -> bool {
        matches!(self, Framing::Length(0) | Framing::Chunked(Chunk::End))
    }
}

fn decode_chunked(state: &mut Chunk, buf: &mut BytesMut) -> Result<Step, BodyError> {
    loop {
        match state {
            Chunk::Size => {
                let Some(eol) = find_crlf(buf, MAX_CHUNK_LINE)? else {
                    return Ok(Step::NeedMore);
                };
                let line = &buf[..eol];
                let digits = line.iter().take_while(|c| c.is_ascii_hexdigit()).count();
                if digits == 0 || digits > 16 {
                    return Err(BodyError("bad chunk size"));
                }
                let rest = &line[digits..];
                let rest_ok = rest
                    .iter()
                    .position(|&c| c == b';')
                    .map_or(rest, |p| &rest[..p])
                    .iter()
                    .all(|&c| c == b' ' || c == b'\t');
                if !rest_ok {
                    return Err(BodyError("bad chunk size"));
                }
                let size = line[..digits].iter().fold(0u64, |n, &c| {
                    (n << 4) | u64::from((c as char).to_digit(16).unwrap_or(0))
                });
                buf.advance(eol + 2);
                *state = match size {
                    0 => Chunk::Trailers(0),
                    n => Chunk::Data(n),
                };
            }
            Chunk::Data(left) => {
                if buf.is_empty() {
                    return Ok(Step::NeedMore);
                }
                let n = (*left).min(buf.len() as u64) as usize;
                *left -= n as u64;
                if *left == 0 {
                    *state = Chunk::DataEnd;
                }
                return Ok(Step::Data(buf.split_to(n).freeze()));
            }
            Chunk::DataEnd => {
                if buf.len() < 2 {
                    return Ok(Step::NeedMore);
                }
                if &buf[..2] != b"\r\n" {
                    return Err(BodyError("chunk not followed by CRLF"));
                }
                buf.advance(2);
                *state = Chunk::Size;
            }
            Chunk::Trailers(seen) => {
                let room = MAX_TRAILERS.saturating_sub(*seen);
                let Some(eol) = find_crlf(buf, room)? else {
                    return Ok(Step::NeedMore);
                };
                buf.advance(eol + 2);
                match eol {
                    0 => *state = Chunk::End,
                    n => *seen += n + 2,
                }
            }
            Chunk::End => return Ok(Step::End),
        }
    }
}

/// The position of the first CRLF in `buf`, looked for within `limit`
/// bytes; a bare LF is an error.
fn find_crlf(buf: &[u8], limit: usize) -> Result<Option<usize>, BodyError> {
    match buf
        .iter()
        .take(limit.saturating_add(1))
        .position(|&c| c == b'\n')
    {
        Some(0) => Err(BodyError("bare LF")),
        Some(p) if buf[p - 1] == b'\r' => Ok(Some(p - 1)),
        Some(_) => Err(BodyError("bare LF")),
        None if buf.len() > limit => Err(BodyError("line too long")),
        None => Ok(None),
    }
}

/// A response body read straight from its upstream connection, which goes
/// back to the pool the moment the body is complete. A body dropped
/// before its end closes the connection.
pub(crate) struct UpstreamBody {
    /// Body bytes that came with the head.
    ready: Option<Bytes>,
    framing: Framing,
    conn: Option<Conn>,
    keep_alive: bool,
    pool: Arc<Pool>,
}

impl UpstreamBody {
    /// The body that follows a head read from `conn` at `now`.
    pub(crate) fn new(
        mut conn: Conn,
        framing: Framing,
        keep_alive: bool,
        pool: Arc<Pool>,
        now: Instant,
    ) -> Self {
        let mut framing = framing;
        // the whole body is often in the buffer already: take it now and
        // free the connection before the answer is even written
        let ready = match &framing {
            Framing::Length(n) if (conn.buf.len() as u64) >= *n => {
                match framing.decode(&mut conn.buf) {
                    Ok(Step::Data(b)) => Some(b),
                    _ => None,
                }
            }
            _ => None,
        };
        let mut body = UpstreamBody {
            ready,
            framing,
            conn: Some(conn),
            keep_alive,
            pool,
        };
        if body.framing.is_end() {
            body.finish(now);
        }
        body
    }

    /// The body is complete: the connection goes back if it can be reused.
    fn finish(&mut self, now: Instant) {
        if let Some(conn) = self.conn.take() {
            if self.keep_alive {
                self.pool.put(conn, now);
            }
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        if let Some(b) = this.ready.take() {
            return Poll::Ready(Some(Ok(Frame::data(b))));
        }
        loop {
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            match this.framing.decode(&mut conn.buf) {
                Ok(Step::Data(b)) => {
                    if this.framing.is_end() {
                        this.finish(Instant::now());
                    }
                    return Poll::Ready(Some(Ok(Frame::data(b))));
                }
                Ok(Step::End) => {
                    this.finish(Instant::now());
                    return Poll::Ready(None);
                }
                Ok(Step::NeedMore) => {}
                Err(e) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(e)));
                }
            }
            make_room(&mut conn.buf);
            match conn.io.try_read_buf(&mut conn.buf) {
                Ok(0) => {
                    this.conn = None;
                    return match this.framing {
                        Framing::Close => Poll::Ready(None),
                        _ => Poll::Ready(Some(Err(BodyError("connection closed mid-body")))),
                    };
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    match conn.io.poll_read_ready(cx) {
                        Poll::Ready(Ok(())) => {}
                        Poll::Ready(Err(_)) => {
                            this.conn = None;
                            return Poll::Ready(Some(Err(BodyError("read failed"))));
                        }
                        Poll::Pending => return Poll::Pending,
                    }
                }
                Err(_) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(BodyError("read failed"))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ready.is_none() && (self.framing.is_end() || self.conn.is_none())
    }

    fn size_hint(&self) -> SizeHint {
        let ready = self.ready.as_ref().map_or(0, |b| b.len() as u64);
        match self.framing {
            Framing::Length(n) => SizeHint::with_exact(n + ready),
            Framing::Chunked(Chunk::End) => SizeHint::with_exact(ready),
            _ => {
                let mut h = SizeHint::new();
                h.set_lower(ready);
                h
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(text: &str, method: Method) -> Result<Option<Head>, UpstreamError> {
        let mut b = BytesMut::from(text);
        parse_head(&mut b, &method)
    }

    fn decode_all(framing: &mut Framing, wire: &[u8], step: usize) -> Result<Vec<u8>, BodyError> {
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        let mut fed = 0;
        loop {
            match framing.decode(&mut buf)? {
                Step::Data(b) => out.extend_from_slice(&b),
                Step::End => return Ok(out),
                Step::NeedMore if fed >= wire.len() => return Err(BodyError("short")),
                Step::NeedMore => {
                    let n = step.min(wire.len() - fed);
                    buf.extend_from_slice(&wire[fed..fed + n]);
                    fed += n;
                }
            }
        }
    }

    #[test]
    fn heads_are_parsed_with_their_framing() {
        let h = head(
            "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-a: 1\r\nx-a: 2\r\n\r\nok",
            Method::GET,
        )
        .unwrap()
        .unwrap();
        assert_eq!(h.status, 200);
        assert_eq!(h.framing, Framing::Length(2));
        assert!(h.keep_alive);
        assert_eq!(h.headers.get_all("x-a").iter().count(), 2);

        let h = head(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: Chunked\r\n\r\n",
            Method::GET,
        )
        .unwrap()
        .unwrap();
        assert_eq!(h.framing, Framing::Chunked(Chunk::Size));
        // any other coding, a repeated one, or a coding in a 1.0 answer
        // is refused
        for te in ["gzip", "gzip, chunked", "chunked, chunked", ""] {
            let text = format!("HTTP/1.1 200 OK\r\ntransfer-encoding: {te}\r\n\r\n");
            assert!(head(&text, Method::GET).is_err(), "{te:?}");
        }
        let text = "HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
        assert!(head(text, Method::GET).is_err());
        // chunks win over a length, which is dropped
        let h = head(
            "HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n",
            Method::GET,
        )
        .unwrap()
        .unwrap();
        assert_eq!(h.framing, Framing::Chunked(Chunk::Size));
        assert!(h.headers.get("content-length").is_none());
        let h = head("HTTP/1.1 200 OK\r\n\r\n", Method::GET)
            .unwrap()
            .unwrap();
        assert_eq!(h.framing, Framing::Close);
        let h = head("HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n", Method::HEAD)
            .unwrap()
            .unwrap();
        assert_eq!(h.framing, Framing::Length(0));
        let h = head("HTTP/1.1 304 Not Modified\r\n\r\n", Method::GET)
            .unwrap()
            .unwrap();
        assert_eq!(h.framing, Framing::Length(0));
        assert!(h.keep_alive);
        let h = head("HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n", Method::GET)
            .unwrap()
            .unwrap();
        assert!(!h.keep_alive, "1.0 closes unless asked to keep alive");
        let h = head(
            "HTTP/1.0 200 OK\r\ncontent-length: 0\r\nconnection: keep-alive\r\n\r\n",
            Method::GET,
        )
        .unwrap()
        .unwrap();
        assert!(h.keep_alive);
        let h = head(
            "HTTP/1.1 200 OK\r\nconnection: Close\r\ncontent-length: 0\r\n\r\n",
            Method::GET,
        )
        .unwrap()
        .unwrap();
        assert!(!h.keep_alive);
    }

    #[test]
    fn interim_answers_are_skipped_and_partial_heads_wait() {
        let mut b = BytesMut::from(
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 0\r\n\r\n",
        );
        let h = parse_head(&mut b, &Method::POST).unwrap().unwrap();
        assert_eq!(h.status, 201);
        assert!(b.is_empty());
        assert!(head("HTTP/1.1 200 OK\r\ncontent-le", Method::GET)
            .unwrap()
            .is_none());
        assert!(head("HTTP/1.1 100 Continue\r\n\r\n", Method::GET)
            .unwrap()
            .is_none());
    }

    #[test]
    fn malformed_heads_are_refused() {
        for text in [
            "HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 1.5\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 99999999999999999999\r\n\r\n",
            "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n\r\n",
            "HTTP/1.1 2x0 What\r\n\r\n",
            "SMTP ready\r\n\r\n",
        ] {
            assert!(head(text, Method::GET).is_err(), "{text:?}");
        }
        // repeated but equal lengths are one length
        let h = head(
            "HTTP/1.1 200 OK\r\ncontent-length: 2, 2\r\n\r\n",
            Method::GET,
        )
        .unwrap()
        .unwrap();
        assert_eq!(h.framing, Framing::Length(2));
    }

    #[test]
    fn chunked_bodies_decode_whatever_the_read_sizes() {
        let wire = b"5;ext=1\r\nhello\r\n1\r\n \r\n6\r\nworld!\r\n0\r\nx-trailer: 1\r\n\r\n";
        for step in [1, 2, 3, 7, 64] {
            let mut f = Framing::Chunked(Chunk::Size);
            assert_eq!(
                decode_all(&mut f, wire, step).unwrap(),
                b"hello world!",
                "{step}"
            );
            assert!(f.is_end());
        }
    }

    #[test]
    fn broken_chunked_bodies_fail() {
        for wire in [
            &b"zz\r\nhello\r\n0\r\n\r\n"[..],
            b"5\r\nhelloX\r\n0\r\n\r\n",
            b"5\nhello\r\n0\r\n\r\n",
            b"11111111111111111\r\n",
            b"5 x\r\nhello\r\n0\r\n\r\n",
        ] {
            let mut f = Framing::Chunked(Chunk::Size);
            assert!(
                decode_all(&mut f, wire, 64).is_err(),
                "{:?}",
                String::from_utf8_lossy(wire)
            );
        }
        let long = vec![b'1'; MAX_CHUNK_LINE + 10];
        let mut f = Framing::Chunked(Chunk::Size);
        assert!(decode_all(&mut f, &long, 64).is_err());
        // trailers are bounded, however their lines fall on the limit
        for len in [
            MAX_TRAILERS - 3,
            MAX_TRAILERS - 2,
            MAX_TRAILERS - 1,
            MAX_TRAILERS,
        ] {
            let mut wire = b"0\r\n".to_vec();
            wire.extend(std::iter::repeat_n(b'x', len));
            wire.extend_from_slice(b"\r\nx-more: 1\r\n\r\n");
            let mut f = Framing::Chunked(Chunk::Size);
            assert!(decode_all(&mut f, &wire, 4096).is_err(), "{len}");
        }
    }

    #[test]
    fn length_bodies_stop_at_their_length() {
        let mut f = Framing::Length(5);
        let mut buf = BytesMut::from(&b"helloHTTP/1.1"[..]);
        assert_eq!(
            f.decode(&mut buf).unwrap(),
            Step::Data(Bytes::from_static(b"hello"))
        );
        assert_eq!(f.decode(&mut buf).unwrap(), Step::End);
        assert_eq!(&buf[..], b"HTTP/1.1", "the rest stays in the buffer");
    }

    #[test]
    fn decimal_lengths() {
        assert_eq!(parse_decimal(b"0"), Some(0));
        assert_eq!(parse_decimal(b"18446744073709551615"), None, "20 digits");
        assert_eq!(
            parse_decimal(b"1844674407370955161"),
            Some(1844674407370955161)
        );
        assert_eq!(parse_decimal(b"+1"), None);
        assert_eq!(parse_decimal(b""), None);
    }

    mod props {
        use super::super::*;
        use proptest::prelude::*;

        /// Feeds `wire` to `framing` in pieces of the given sizes.
        fn decode_in(
            framing: &mut Framing,
            wire: &[u8],
            sizes: &[usize],
        ) -> Result<(Vec<u8>, Vec<u8>), BodyError> {
            let mut buf = BytesMut::new();
            let mut out = Vec::new();
            let mut fed = 0;
            let mut next = sizes.iter().cycle();
            loop {
                match framing.decode(&mut buf)? {
                    Step::Data(b) => out.extend_from_slice(&b),
                    Step::End => return Ok((out, buf.to_vec())),
                    Step::NeedMore if fed >= wire.len() => return Err(BodyError("short")),
                    Step::NeedMore => {
                        let n = (*next.next().unwrap()).clamp(1, wire.len() - fed);
                        buf.extend_from_slice(&wire[fed..fed + n]);
                        fed += n;
                    }
                }
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            /// Whatever an upstream sends, parsing and decoding answer
            /// without panicking.
            #[test]
            fn hostile_bytes_never_panic(wire in prop::collection::vec(any::<u8>(), 0..600), sizes in prop::collection::vec(1usize..64, 1..8)) {
                for method in [Method::GET, Method::HEAD] {
                    let mut b = BytesMut::from(&wire[..]);
                    let _ = parse_head(&mut b, &method);
                }
                let mut chunked = Framing::Chunked(Chunk::Size);
                let _ = decode_in(&mut chunked, &wire, &sizes);
                // the same bytes after a plausible head
                let mut head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
                head.extend_from_slice(&wire);
                let mut b = BytesMut::from(&head[..]);
                let _ = parse_head(&mut b, &Method::GET);
            }

            /// A chunked body decodes to what was encoded, however it is
            /// split into chunks and reads, and bytes after it stay put.
            #[test]
            fn chunked_bodies_round_trip(
                body in prop::collection::vec(any::<u8>(), 0..2000),
                cuts in prop::collection::vec(1usize..300, 1..10),
                sizes in prop::collection::vec(1usize..100, 1..10),
                ext in any::<bool>(),
            ) {
                let mut wire = Vec::new();
                let mut rest = &body[..];
                let mut cut = cuts.iter().cycle();
                while !rest.is_empty() {
                    let n = (*cut.next().unwrap()).min(rest.len());
                    let ext = if ext { ";name=\"v\"" } else { "" };
                    wire.extend_from_slice(format!("{n:X}{ext}\r\n").as_bytes());
                    wire.extend_from_slice(&rest[..n]);
                    wire.extend_from_slice(b"\r\n");
                    rest = &rest[n..];
                }
                wire.extend_from_slice(b"0\r\nx-sum: 1\r\n\r\nHTTP/1.1 next");
                let mut f = Framing::Chunked(Chunk::Size);
                let (out, left) = decode_in(&mut f, &wire, &sizes).unwrap();
                prop_assert_eq!(out, body);
                prop_assert!(f.is_end());
                prop_assert!(b"HTTP/1.1 next".starts_with(&left), "{:?}", left);
            }

            /// A head is not taken until it is complete, and then it is
            /// the same head wherever the bytes were cut.
            #[test]
            fn heads_wait_for_their_end(cut in 0usize..80) {
                let text: &[u8] = b"HTTP/1.1 201 Created\r\ncontent-length: 4\r\nx-a: b\r\n\r\nbody";
                let cut = cut.min(text.len());
                let mut b = BytesMut::from(&text[..cut]);
                let first = parse_head(&mut b, &Method::POST).unwrap();
                let head_len = text.len() - 4;
                prop_assert_eq!(first.is_some(), cut >= head_len);
                b.extend_from_slice(&text[cut..]);
                let h = match first {
                    Some(h) => h,
                    None => parse_head(&mut b, &Method::POST).unwrap().unwrap(),
                };
                prop_assert_eq!(h.status, 201);
                prop_assert_eq!(h.framing, Framing::Length(4));
                prop_assert_eq!(&h.headers["x-a"], "b");
                prop_assert_eq!(&b[..], b"body");
            }
        }
    }
}
