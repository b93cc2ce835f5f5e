//! The bound on every pause inside a streamed body, either way: the
//! request body on its way to the upstream and the answer's on its way
//! back fail with [`BodyIdle`] when no frame comes for too long.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::Sleep;

use super::error::BoxError;
use crate::metrics as m;

pin_project! {
    /// A body that fails when no frame arrives for `idle`. The timer is
    /// armed only when the body has to wait, so a body that flows costs
    /// no timer work.
    pub(crate) struct IdleTimeout<B> {
        #[pin]
        body: B,
        sleep: Option<Pin<Box<Sleep>>>,
        idle: Duration,
        // a frame arrived since the timer was last armed
        moved: bool,
    }
}

impl<B> IdleTimeout<B> {
    /// Wraps `body`.
    pub(crate) fn new(body: B, idle: Duration) -> Self {
        IdleTimeout {
            body,
            sleep: None,
            idle,
            moved: true,
        }
    }
}

/// A body stalled longer than its idle bound.
#[derive(Debug)]
pub(crate) struct BodyIdle;

impl std::fmt::Display for BodyIdle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("body idle timeout")
    }
}

impl std::error::Error for BodyIdle {}

impl<B> Body for IdleTimeout<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        if let Poll::Ready(f) = this.body.poll_frame(cx) {
            *this.moved = true;
            return Poll::Ready(f.map(|r| r.map_err(Into::into)));
        }
        // waiting: (re)arm the timer from now if the body moved since
        let idle = *this.idle;
        let sleep = this
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
        if std::mem::take(this.moved) {
            sleep.as_mut().reset(tokio::time::Instant::now() + idle);
        }
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => {
                m::upstream_error("body_idle");
                Poll::Ready(Some(Err(Box::new(BodyIdle))))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::convert::Infallible;

    /// A body that never yields.
    struct Stalled;

    impl Body for Stalled {
        type Data = Bytes;
        type Error = Infallible;
        fn poll_frame(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            Poll::Pending
        }
    }

    /// One frame, then nothing.
    struct OneThenStall(bool);

    impl Body for OneThenStall {
        type Data = Bytes;
        type Error = Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            match std::mem::replace(&mut self.0, true) {
                false => Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"x"))))),
                true => Poll::Pending,
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_idle_bound_counts_from_the_last_frame() {
        let mut b = IdleTimeout::new(OneThenStall(false), Duration::from_secs(5));
        tokio::time::advance(Duration::from_secs(60)).await;
        // a frame ready at once passes, however late it is polled
        assert!(b.frame().await.unwrap().is_ok());
        let started = tokio::time::Instant::now();
        assert!(b.frame().await.unwrap().unwrap_err().is::<BodyIdle>());
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_body_times_out() {
        let mut b = IdleTimeout::new(Stalled, Duration::from_secs(5));
        let frame = b.frame().await.unwrap();
        assert!(frame.unwrap_err().is::<BodyIdle>());
    }
}
