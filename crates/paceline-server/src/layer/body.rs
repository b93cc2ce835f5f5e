//! The response body of the limit layer: the inner service's body, or a
//! short body the layer wrote itself (a problem, the usage document).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// Either the inner service's body or one written by the layer.
    #[project = BodyProj]
    #[allow(missing_docs)] // variant fields: the body itself
    pub enum RateLimitBody<B> {
        /// The inner service's body, untouched.
        Inner {
            #[pin]
            body: B,
        },
        /// A complete body written by the layer.
        Full {
            data: Option<Bytes>,
        },
    }
}

impl<B> RateLimitBody<B> {
    pub(crate) fn inner(body: B) -> Self {
        RateLimitBody::Inner { body }
    }
    pub(crate) fn full(data: impl Into<Bytes>) -> Self {
        let data: Bytes = data.into();
        RateLimitBody::Full {
            data: (!data.is_empty()).then_some(data),
        }
    }
}

impl<B> Body for RateLimitBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.project() {
            BodyProj::Inner { body } => body.poll_frame(cx),
            BodyProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RateLimitBody::Inner { body } => body.is_end_stream(),
            RateLimitBody::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RateLimitBody::Inner { body } => body.size_hint(),
            RateLimitBody::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
