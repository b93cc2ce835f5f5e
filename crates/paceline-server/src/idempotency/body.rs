//! The response body of the idempotency layer: the inner service's body
//! as it streams, an answer written whole (a replay, a problem, a first
//! answer read to be stored), or the start of an answer too large to keep
//! followed by the rest of it.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// The body of an answer that went through the idempotency layer.
    #[project = Proj]
    pub struct IdempotencyBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Full { data: Option<Bytes> },
        Rest { first: Option<Bytes>, body: Pin<Box<B>> },
    }
}

impl<B> std::fmt::Debug for IdempotencyBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            Kind::Inner { .. } => "inner",
            Kind::Full { .. } => "full",
            Kind::Rest { .. } => "rest",
        };
        f.debug_struct("IdempotencyBody")
            .field("kind", &kind)
            .finish()
    }
}

impl<B> IdempotencyBody<B> {
    pub(crate) fn inner(body: B) -> Self {
        IdempotencyBody {
            kind: Kind::Inner { body },
        }
    }
    /// A body written whole: an answer a stage in front of the
    /// idempotency layer gives in place of the inner service's.
    pub fn whole(data: Bytes) -> Self {
        Self::full(data)
    }
    pub(crate) fn full(data: Bytes) -> Self {
        IdempotencyBody {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }
    pub(crate) fn rest(first: Bytes, body: Pin<Box<B>>) -> Self {
        IdempotencyBody {
            kind: Kind::Rest {
                first: (!first.is_empty()).then_some(first),
                body,
            },
        }
    }
}

impl<B> Body for IdempotencyBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            KindProj::Rest { first, body } => match first.take() {
                Some(d) => Poll::Ready(Some(Ok(Frame::data(d)))),
                None => body.as_mut().poll_frame(cx),
            },
        }
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
            Kind::Rest { first, body } => first.is_none() && body.is_end_stream(),
        }
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Rest { first, body } => {
                let n = first.as_ref().map_or(0, |d| d.len() as u64);
                let h = body.size_hint();
                let mut s = SizeHint::new();
                s.set_lower(h.lower() + n);
                if let Some(u) = h.upper() {
                    s.set_upper(u + n);
                }
                s
            }
        }
    }
}
