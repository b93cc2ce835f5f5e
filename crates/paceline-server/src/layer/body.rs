//! The response body of the limit layer: the inner service's body, or a
//! short body the layer wrote itself (a problem, the usage document).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::usage::{run_detached, Meter};

pin_project! {
    /// Either the inner service's body or one written by the layer.
    #[project = BodyProj]
    #[allow(missing_docs)] // variant fields: the body itself
    pub enum RateLimitBody<B> {
        /// The inner service's body, untouched.
        Inner {
            #[pin]
            body: B,
            guard: Option<ReleaseGuard>,
            meter: Option<Box<Meter>>,
        },
        /// A complete body written by the layer.
        Full {
            data: Option<Bytes>,
        },
    }
}

impl<B> RateLimitBody<B> {
    pub(crate) fn inner(body: B) -> Self {
        RateLimitBody::Inner {
            body,
            guard: None,
            meter: None,
        }
    }
    pub(crate) fn guarded(body: B, guard: Option<ReleaseGuard>, meter: Option<Meter>) -> Self {
        RateLimitBody::Inner {
            body,
            guard,
            meter: meter.map(Box::new),
        }
    }
    pub(crate) fn full(data: impl Into<Bytes>) -> Self {
        let data: Bytes = data.into();
        RateLimitBody::Full {
            data: (!data.is_empty()).then_some(data),
        }
    }
}

impl<B> fmt::Debug for RateLimitBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RateLimitBody::Inner { guard, .. } => f
                .debug_struct("RateLimitBody::Inner")
                .field("guard", guard)
                .finish_non_exhaustive(),
            RateLimitBody::Full { data } => f
                .debug_struct("RateLimitBody::Full")
                .field("len", &data.as_ref().map_or(0, |d| d.len()))
                .finish(),
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
            BodyProj::Inner {
                mut body, meter, ..
            } => {
                let r = body.as_mut().poll_frame(cx);
                if let Some(m) = meter.as_mut() {
                    match &r {
                        Poll::Ready(Some(Ok(f))) => {
                            if let Some(d) = f.data_ref() {
                                m.data(d);
                            } else if let Some(t) = f.trailers_ref() {
                                m.trailers(t);
                            }
                            if body.is_end_stream() {
                                m.finish();
                            }
                        }
                        Poll::Ready(None) => m.finish(),
                        _ => {}
                    }
                }
                r
            }
            BodyProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        match self {
            RateLimitBody::Inner { body, .. } => body.is_end_stream(),
            RateLimitBody::Full { data } => data.is_none(),
        }
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        match self {
            RateLimitBody::Inner { body, .. } => body.size_hint(),
            RateLimitBody::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

/// Gives back a request's concurrency units when dropped: with the
/// response body once it is sent, or with the request if it is cancelled.
pub struct ReleaseGuard {
    release: Option<Pin<Box<dyn Future<Output = ()> + Send + 'static>>>,
}

impl ReleaseGuard {
    pub(crate) fn new(release: impl Future<Output = ()> + Send + 'static) -> Self {
        ReleaseGuard {
            release: Some(Box::pin(release)),
        }
    }
}

impl fmt::Debug for ReleaseGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReleaseGuard")
            .field("held", &self.release.is_some())
            .finish()
    }
}

impl Drop for ReleaseGuard {
    fn drop(&mut self) {
        // an in-process store answers at once; a remote one finishes on the runtime
        if let Some(release) = self.release.take() {
            run_detached(release, "concurrency units not released");
        }
    }
}
