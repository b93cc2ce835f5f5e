//! The streaming response body of the own client: body bytes decoded by
//! the codec's framing straight out of the connection's buffer, the
//! connection going back to the pool the moment the body is complete.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use paceline_core::Nanos;

use super::codec::{Chunk, Framing, Step};
use super::conn::Conn;
use super::error::BodyError;
use super::pool::Pool;

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
        now: Nanos,
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
    fn finish(&mut self, now: Nanos) {
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
                        let now = this.pool.now();
                        this.finish(now);
                    }
                    return Poll::Ready(Some(Ok(Frame::data(b))));
                }
                Ok(Step::End) => {
                    let now = this.pool.now();
                    this.finish(now);
                    return Poll::Ready(None);
                }
                Ok(Step::NeedMore) => {}
                Err(e) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(e)));
                }
            }
            match conn.poll_fill(cx) {
                Poll::Ready(Ok(0)) => {
                    this.conn = None;
                    return match this.framing {
                        Framing::Close => Poll::Ready(None),
                        _ => Poll::Ready(Some(Err(BodyError("connection closed mid-body")))),
                    };
                }
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(_)) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(BodyError("read failed"))));
                }
                Poll::Pending => return Poll::Pending,
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
