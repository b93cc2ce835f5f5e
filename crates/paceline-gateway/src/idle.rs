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
//!
//! [`Watched`] runs a connection with that timer and the gateway's
//! shutdown signal ([`Shutdown`]) beside it. The two are polled only when
//! one of them woke the connection's task, not on every read and write
//! of the connection: a `select!` (or hyper's graceful watcher) polls
//! every branch on every wake-up, a timer and a channel each time.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::sync::watch;
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

/// The gateway's graceful shutdown: tells every watched connection to
/// finish the request it is on and close, then waits until all of them
/// have.
pub(crate) struct Shutdown {
    tx: watch::Sender<()>,
}

impl Shutdown {
    pub(crate) fn new() -> Shutdown {
        Shutdown {
            tx: watch::channel(()).0,
        }
    }

    /// The signal for one connection: taken before its task starts (a
    /// connection whose TLS handshake ends after the shutdown began still
    /// sees it).
    pub(crate) fn watcher(&self) -> watch::Receiver<()> {
        self.tx.subscribe()
    }

    /// Signals every connection, and completes once every watcher is gone.
    pub(crate) async fn shutdown(self) {
        let _ = self.tx.send(());
        self.tx.closed().await;
    }
}

/// A connection that can be told to finish what it is doing and end.
pub(crate) trait Graceful: Future<Output = Result<(), Self::Error>> {
    /// Why the connection failed.
    type Error;
    /// Asks the connection to end after the request in progress.
    fn graceful_shutdown(self: Pin<&mut Self>);
}

/// How a [`Watched`] connection ended.
pub(crate) enum Ended<E> {
    /// The connection ended by itself (a graceful shutdown included).
    Conn(Result<(), E>),
    /// No request was in flight for the whole bound: the connection is
    /// dropped.
    Idle,
}

/// Whether the timer or the shutdown signal woke the connection's task,
/// and the task to wake.
#[derive(Default)]
struct Side {
    woken: AtomicBool,
    task: parking_lot::Mutex<Option<Waker>>,
}

impl Side {
    /// Keeps `w` as the task to wake.
    fn set_task(&self, w: &Waker) {
        *self.task.lock() = Some(w.clone());
    }
}

impl Wake for Side {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        if let Some(t) = &*self.task.lock() {
            t.wake_by_ref();
        }
    }
}

pin_project! {
    /// A client connection with its idle timer and the shutdown signal
    /// beside it, both polled only after one of them woke the task (see
    /// the module documentation).
    pub(crate) struct Watched<C, S: Future, I> {
        #[pin]
        conn: C,
        #[pin]
        idle: I,
        #[pin]
        stop: S,
        // once the shutdown was seen (the connection is told once), its
        // receiver, kept until the connection ends: the shutdown waits
        // for it
        stopped: Option<S::Output>,
        side: Arc<Side>,
        waker: Waker,
        // the task's waker last given to `side`: compared without its lock
        task: Option<Waker>,
    }
}

/// `conn`, dropped when `idle` completes and told to finish when `stop`
/// changes (or its sender is gone).
pub(crate) fn watched<C, I>(
    conn: C,
    idle: I,
    mut stop: watch::Receiver<()>,
) -> Watched<C, impl Future<Output = watch::Receiver<()>>, I> {
    let side = Arc::new(Side {
        // the first poll polls everything, which registers the wakers
        woken: AtomicBool::new(true),
        task: parking_lot::Mutex::new(None),
    });
    Watched {
        conn,
        idle,
        stop: async move {
            let _ = stop.changed().await;
            stop
        },
        stopped: None,
        waker: Waker::from(side.clone()),
        side,
        task: None,
    }
}

impl<C, S, I> Future for Watched<C, S, I>
where
    C: Graceful,
    S: Future,
    I: Future<Output = ()>,
{
    type Output = Ended<C::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if !this.task.as_ref().is_some_and(|t| t.will_wake(cx.waker())) {
            *this.task = Some(cx.waker().clone());
            this.side.set_task(cx.waker());
        }
        if this.side.woken.swap(false, Ordering::AcqRel) {
            // polled with the side's own waker: a wake-up of either says
            // so before it wakes the task
            let mut side = Context::from_waker(this.waker);
            if this.stopped.is_none() {
                if let Poll::Ready(rx) = this.stop.poll(&mut side) {
                    *this.stopped = Some(rx);
                    this.conn.as_mut().graceful_shutdown();
                }
            }
            if this.idle.poll(&mut side).is_ready() {
                return Poll::Ready(Ended::Idle);
            }
        }
        this.conn.poll(cx).map(Ended::Conn)
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
