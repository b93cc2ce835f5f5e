//! The request body type every stage of the gateway reads: hyper's, on
//! the connections hyper serves, or the gateway's own.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use crate::upstream::BoxError;

/// A client's request body.
#[derive(Debug)]
pub(crate) enum ClientBody {
    /// Read by hyper (HTTP/2, and HTTP/1 where hyper serves it).
    Hyper(Incoming),
    /// None: the head announced no body.
    Empty,
}

impl From<Incoming> for ClientBody {
    fn from(b: Incoming) -> Self {
        ClientBody::Hyper(b)
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            ClientBody::Hyper(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            ClientBody::Empty => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ClientBody::Hyper(b) => b.is_end_stream(),
            ClientBody::Empty => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ClientBody::Hyper(b) => b.size_hint(),
            ClientBody::Empty => SizeHint::with_exact(0),
        }
    }
}
