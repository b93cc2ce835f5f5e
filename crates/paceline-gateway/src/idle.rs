//! Closing client connections that send nothing useful, with one timer per
//! connection instead of one per request.
//!
//! A connection is closed once no request has been in flight on it for the
//! whole bound: a client that never finishes a request head, or a
//! keep-alive connection left idle. A request counts from the moment its
//! head has been read until its response body is done with. The timer
//! sleeps the bound, then looks at what happened meanwhile and sleeps again
//! only as long as still needed, so a busy connection costs one timer
//! expiry per bound however many requests it carries.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::Instant;

/// What one connection is doing, shared between its requests and its timer.
#[derive(Debug)]
pub(crate) struct Activity {
    base: Instant,
    in_flight: AtomicU32,
    /// When the last request ended, in nanoseconds after `base`.
    last: AtomicU64,
}

impl Activity {
    /// A connection accepted now.
    pub(crate) fn new() -> Arc<Activity> {
        Arc::new(Activity {
            base: Instant::now(),
            in_flight: AtomicU32::new(0),
            last: AtomicU64::new(0),
        })
    }

    /// A request starts; it ends when the guard drops.
    pub(crate) fn start(self: &Arc<Self>) -> Busy {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        Busy(self.clone())
    }

    /// Requests in flight now.
    pub(crate) fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Completes once no request has been in flight for `bound`.
    pub(crate) async fn idle_for(&self, bound: Duration) {
        let sleep = tokio::time::sleep_until(self.base + bound);
        tokio::pin!(sleep);
        loop {
            sleep.as_mut().await;
            let now = Instant::now();
            let deadline = match self.in_flight.load(Ordering::Relaxed) {
                0 => {
                    let last = Duration::from_nanos(self.last.load(Ordering::Relaxed));
                    self.base + last + bound
                }
                _ => now + bound,
            };
            if deadline <= now {
                return;
            }
            sleep.as_mut().reset(deadline);
        }
    }
}

/// One request in flight.
#[derive(Debug)]
pub(crate) struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        let a = &self.0;
        let since = a.base.elapsed().as_nanos() as u64;
        a.last.fetch_max(since, Ordering::Relaxed);
        a.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

pin_project! {
    /// A response body that holds its request's [`Busy`] until it is
    /// dropped.
    pub(crate) struct Tracked<B> {
        #[pin]
        body: B,
        busy: Busy,
    }
}

impl<B> Tracked<B> {
    pub(crate) fn new(body: B, busy: Busy) -> Self {
        Tracked { body, busy }
    }
}

impl<B: Body<Data = Bytes>> Body for Tracked<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        self.project().body.poll_frame(cx)
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

pin_project! {
    /// A response future whose body, once there, carries the request's
    /// [`Busy`].
    pub(crate) struct TrackedCall<F> {
        #[pin]
        call: F,
        busy: Option<Busy>,
    }
}

impl<F> TrackedCall<F> {
    pub(crate) fn new(call: F, busy: Busy) -> Self {
        TrackedCall {
            call,
            busy: Some(busy),
        }
    }
}

impl<F, B, E> Future for TrackedCall<F>
where
    F: Future<Output = Result<http::Response<B>, E>>,
{
    type Output = Result<http::Response<Tracked<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.call.poll(cx) {
            Poll::Ready(Ok(res)) => {
                let busy = this.busy.take().expect("polled after completion");
                Poll::Ready(Ok(res.map(|body| Tracked::new(body, busy))))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_untouched_connection_times_out_at_the_bound() {
        let a = Activity::new();
        let started = Instant::now();
        a.idle_for(Duration::from_secs(10)).await;
        assert_eq!(started.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn the_bound_counts_from_the_last_request_end() {
        let a = Activity::new();
        let started = Instant::now();
        let busy = a.start();
        let b = a.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(25)).await;
            drop(busy);
            tokio::time::sleep(Duration::from_secs(3)).await;
            // a short request in between moves the end again
            drop(b.start());
        });
        a.idle_for(Duration::from_secs(10)).await;
        assert_eq!(started.elapsed(), Duration::from_secs(38));
    }
}
