//! [`IdempotencyLayer`] and its service [`Idempotency`]: what a request
//! with a key gets.
//!
//! A request the layer leaves alone (another method, a route without
//! keys, an optional route and no key) goes through with one wrapper
//! around its body and no allocation. A request with a key takes it in
//! the store in one step ([`IdempotencyStore::begin`]): the first runs,
//! its body digested as it streams; a retry is compared and replayed
//! from the store, its body read here and never sent on.
//!
//! The first execution runs in a task of its own: a client that goes
//! away (its connection cut) does not cancel it, so the answer is stored
//! and a retry finds it. If it ends without a final answer (the inner
//! service fails, or answers `429` or a `5xx` not configured final, or
//! the request body fails or is too large), its lease is given back,
//! even if it panics, and the next request with the key runs.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{Request, Response, StatusCode, Version};
use http_body::Body;
use paceline_core::{Clock, Nanos};
use paceline_wire::problem::ProblemKind;
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use super::body::IdempotencyBody;
use super::fingerprint::{
    digest_body, head_digest, BodyEnd, BoxError, DigestBody, EntryKey, Fingerprint,
};
use super::key::{read_key, KeyField};
use super::replay::{self, conflict, in_flight, problem};
use super::scope::IdempotencyScope;
use super::store::{Begin, Completed, Entry, IdempotencyStore, StoredAnswer};
use super::{IdempotencyMode, IdempotencySettings, InFlight};
use crate::HttpFuture;

/// What every service of one layer shares.
struct Shared<St, C> {
    store: St,
    clock: C,
    settings: IdempotencySettings,
}

/// Puts [`Idempotency`] in front of a service.
pub struct IdempotencyLayer<St, C, P> {
    shared: Arc<Shared<St, C>>,
    scope: P,
}

impl<St, C, P: Clone> Clone for IdempotencyLayer<St, C, P> {
    fn clone(&self) -> Self {
        IdempotencyLayer {
            shared: self.shared.clone(),
            scope: self.scope.clone(),
        }
    }
}

impl<St, C, P> std::fmt::Debug for IdempotencyLayer<St, C, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("settings", &self.shared.settings)
            .finish_non_exhaustive()
    }
}

impl<St, C, P> IdempotencyLayer<St, C, P> {
    /// A layer keeping keys in `store`, reading time from `clock`,
    /// applying to the requests `scope` names.
    pub fn new(store: St, clock: C, scope: P, settings: IdempotencySettings) -> Self {
        IdempotencyLayer {
            shared: Arc::new(Shared {
                store,
                clock,
                settings,
            }),
            scope,
        }
    }

    /// The same layer (the same store) with another scope: one per
    /// connection, say, knowing its peer.
    pub fn with_scope<Q>(&self, scope: Q) -> IdempotencyLayer<St, C, Q> {
        IdempotencyLayer {
            shared: self.shared.clone(),
            scope,
        }
    }

    /// The store.
    pub fn store(&self) -> &St {
        &self.shared.store
    }

    /// The settings.
    pub fn settings(&self) -> &IdempotencySettings {
        &self.shared.settings
    }
}

impl<I, St, C, P: Clone> Layer<I> for IdempotencyLayer<St, C, P> {
    type Service = Idempotency<I, St, C, P>;
    fn layer(&self, inner: I) -> Self::Service {
        Idempotency {
            inner,
            shared: self.shared.clone(),
            scope: self.scope.clone(),
        }
    }
}

/// The idempotency service; see [`crate::idempotency`].
pub struct Idempotency<I, St, C, P> {
    inner: I,
    shared: Arc<Shared<St, C>>,
    scope: P,
}

impl<I: Clone, St, C, P: Clone> Clone for Idempotency<I, St, C, P> {
    fn clone(&self) -> Self {
        Idempotency {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
            scope: self.scope.clone(),
        }
    }
}

impl<I: std::fmt::Debug, St, C, P> std::fmt::Debug for Idempotency<I, St, C, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotency")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

type Boxed<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<IdempotencyBody<B>>, E>> + Send + 'static>>;

pin_project! {
    /// The future of [`Idempotency`]: the inner call of a request left
    /// alone, an answer made at once, or the work of a request with a key.
    pub struct IdempotencyFuture<F: HttpFuture> {
        #[pin]
        kind: FutKind<F>,
    }
}

pin_project! {
    #[project = FutProj]
    enum FutKind<F: HttpFuture> {
        Pass { #[pin] fut: F },
        Ready { res: Option<Response<IdempotencyBody<F::Body>>> },
        Boxed { fut: Boxed<F::Body, F::Error> },
    }
}

impl<F: HttpFuture> std::fmt::Debug for IdempotencyFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyFuture").finish_non_exhaustive()
    }
}

impl<F: HttpFuture> Future for IdempotencyFuture<F> {
    type Output = Result<Response<IdempotencyBody<F::Body>>, F::Error>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            FutProj::Pass { fut } => fut
                .poll(cx)
                .map(|r| r.map(|res| res.map(IdempotencyBody::inner))),
            FutProj::Ready { res } => Poll::Ready(Ok(res.take().expect("polled after completion"))),
            FutProj::Boxed { fut } => fut.as_mut().poll(cx),
        }
    }
}

impl<F: HttpFuture> IdempotencyFuture<F> {
    fn pass(fut: F) -> Self {
        IdempotencyFuture {
            kind: FutKind::Pass { fut },
        }
    }
    fn ready(res: Response<Bytes>, close: bool) -> Self {
        let mut res = replay::here(res.map(IdempotencyBody::full));
        if close {
            crate::respond::close_connection(&mut res);
        }
        IdempotencyFuture {
            kind: FutKind::Ready { res: Some(res) },
        }
    }
}

fn nanos(d: Duration) -> Nanos {
    Nanos::from_duration(d)
}

impl<I, St, C, P, ReqB, ResB> Service<Request<ReqB>> for Idempotency<I, St, C, P>
where
    I: Service<Request<DigestBody<ReqB>>, Response = Response<ResB>> + Clone + Send + 'static,
    I::Future: Send + 'static,
    I::Error: Send + 'static,
    ReqB: Body<Data = Bytes> + Send + 'static,
    ReqB::Error: Into<BoxError>,
    ResB: Body<Data = Bytes> + Send + 'static,
    St: IdempotencyStore,
    C: Clock,
    P: IdempotencyScope,
{
    type Response = Response<IdempotencyBody<ResB>>;
    type Error = I::Error;
    type Future = IdempotencyFuture<I::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        if !super::applies_to(req.method()) {
            return IdempotencyFuture::pass(self.inner.call(req.map(DigestBody::pass)));
        }
        let (parts, body) = req.into_parts();
        let Some(scope) = self.scope.scope(&parts) else {
            let req = Request::from_parts(parts, DigestBody::pass(body));
            return IdempotencyFuture::pass(self.inner.call(req));
        };
        let s = &self.shared.settings;
        let base = self
            .scope
            .problem_base()
            .unwrap_or_else(|| s.problem_base.clone());
        // an answer made here leaves a body unread: HTTP/1.1 closes
        let has_body = parts.headers.contains_key(TRANSFER_ENCODING)
            || parts
                .headers
                .get(CONTENT_LENGTH)
                .is_some_and(|v| v.as_bytes() != b"0");
        let close = has_body && parts.version <= Version::HTTP_11;
        let key = match read_key(&parts.headers, s.max_key_len) {
            KeyField::Key(k) => scope.entry(k.as_str()),
            KeyField::Invalid(why) => {
                let p = problem(&base, ProblemKind::IdempotencyKeyInvalid, why);
                return IdempotencyFuture::ready(p, close);
            }
            KeyField::Absent => match scope.mode() {
                IdempotencyMode::Optional => {
                    let req = Request::from_parts(parts, DigestBody::pass(body));
                    return IdempotencyFuture::pass(self.inner.call(req));
                }
                IdempotencyMode::Required => {
                    let p = problem(
                        &base,
                        ProblemKind::IdempotencyKeyMissing,
                        "This route requires an Idempotency-Key; send one (a UUID, say) and reuse it on every retry.",
                    );
                    return IdempotencyFuture::ready(p, close);
                }
            },
        };
        let announced = parts
            .headers
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if announced.is_some_and(|n| n > s.max_body_bytes) {
            return IdempotencyFuture::ready(too_large(s, &base), close);
        }
        let target = parts
            .uri
            .path_and_query()
            .map_or_else(|| parts.uri.path(), |p| p.as_str());
        let head = head_digest(&parts.method, target);
        // the clone stays for the next call; the ready one serves this one
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        let fut = run(
            shared,
            base,
            inner,
            Request::from_parts(parts, body),
            key,
            head,
        );
        IdempotencyFuture {
            kind: FutKind::Boxed { fut: Box::pin(fut) },
        }
    }
}

fn too_large(s: &IdempotencySettings, base: &str) -> Response<Bytes> {
    let detail = format!(
        "The request body is larger than the {} bytes an idempotent request may carry.",
        s.max_body_bytes
    );
    problem(base, ProblemKind::PayloadTooLarge, &detail)
}

fn full<B>(r: Response<Bytes>) -> Response<IdempotencyBody<B>> {
    r.map(IdempotencyBody::full)
}

/// A request with a key: takes it, then runs, replays or refuses.
async fn run<I, St, C, ReqB, ResB>(
    shared: Arc<Shared<St, C>>,
    base: String,
    mut inner: I,
    req: Request<ReqB>,
    key: EntryKey,
    head: u64,
) -> Result<Response<IdempotencyBody<ResB>>, I::Error>
where
    I: Service<Request<DigestBody<ReqB>>, Response = Response<ResB>> + Send + 'static,
    I::Future: Send + 'static,
    I::Error: Send + 'static,
    ReqB: Body<Data = Bytes> + Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
    St: IdempotencyStore,
    C: Clock,
{
    let s = &shared.settings;
    let now = shared.clock.now();
    let begun = shared.store.begin(key, head, nanos(s.lease), now).await;
    let (parts, body) = req.into_parts();
    match begun {
        Err(e) => {
            tracing::warn!(error = %e, "idempotency store failed");
            let mut p = paceline_wire::problem::Problem::new(
                ProblemKind::Overloaded,
                &base,
                "The idempotency store is unavailable; retry shortly.",
            );
            p.retry_after_s = Some(1);
            Ok(replay::here(full(paceline_wire::problem::answer(&p))))
        }
        Ok(Begin::Acquired(token)) => {
            let end = Arc::new(OnceLock::new());
            let body = DigestBody::digested(body, s.max_body_bytes, end.clone());
            let call = inner.call(Request::from_parts(parts, body));
            let guard = LeaseGuard {
                shared: shared.clone(),
                key,
                token: Some(token),
            };
            let job = first(guard, base.clone(), call, end, head);
            match tokio::runtime::Handle::try_current() {
                // its own task: a client that goes away does not cancel it
                Ok(rt) => match rt.spawn(job).await {
                    Ok(r) => r,
                    Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                    Err(_) => Ok(full(problem(
                        &base,
                        ProblemKind::Overloaded,
                        "The server is shutting down.",
                    ))),
                },
                Err(_) => job.await,
            }
        }
        Ok(Begin::Existing(entry)) => {
            let res = existing(&shared, &base, entry, body, key, head).await;
            Ok(replay::here(full(res)))
        }
    }
}

/// A request whose key is taken: replayed, refused, or (in wait mode)
/// held until the first answer comes.
async fn existing<St: IdempotencyStore, C: Clock, B: Body<Data = Bytes>>(
    shared: &Shared<St, C>,
    base: &str,
    entry: Entry,
    body: B,
    key: EntryKey,
    head: u64,
) -> Response<Bytes> {
    let s = &shared.settings;
    let head_of = |e: &Entry| match e {
        Entry::InFlight { head } => *head,
        Entry::Done(c) => c.fingerprint.head,
    };
    if head_of(&entry) != head {
        return conflict(s, base, replay::DIFFERENT);
    }
    if matches!(entry, Entry::InFlight { .. }) && s.in_flight == InFlight::Reject {
        return in_flight(s, base);
    }
    let digest = match digest_body(body, s.max_body_bytes).await {
        Ok(d) => d,
        Err(BodyEnd::TooLarge) => return too_large(s, base),
        Err(_) => {
            return problem(
                base,
                ProblemKind::BadRequest,
                "The request body could not be read.",
            )
        }
    };
    let done = match entry {
        Entry::Done(c) => c,
        Entry::InFlight { .. } => match wait(shared, key).await {
            Some(c) => c,
            None => return in_flight(s, base),
        },
    };
    if done.fingerprint.body.is_some_and(|d| d != digest) {
        return conflict(s, base, replay::DIFFERENT);
    }
    match &done.answer.body {
        Some(_) => replay::replay(&done.answer),
        None => conflict(s, base, replay::NOT_KEPT),
    }
}

/// Waits for the request holding `key` to complete, at most the
/// configured wait: its answer, or `None` (still running, or it failed
/// and gave the key back).
async fn wait<St: IdempotencyStore, C: Clock>(
    shared: &Shared<St, C>,
    key: EntryKey,
) -> Option<Arc<Completed>> {
    let s = &shared.settings;
    let deadline = tokio::time::Instant::now() + s.max_wait;
    let mut step = Duration::from_millis(5);
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return None;
        }
        tokio::time::sleep(step.min(left)).await;
        step = (step * 2).min(Duration::from_millis(100));
        match shared.store.fetch(key, shared.clock.now()).await {
            Ok(Some(Entry::Done(c))) => return Some(c),
            Ok(Some(Entry::InFlight { .. })) => continue,
            Ok(None) | Err(_) => return None,
        }
    }
}

/// The lease of a first execution: completed with its answer, or given
/// back when dropped without one (failure, panic, cancellation).
struct LeaseGuard<St: IdempotencyStore, C: Clock> {
    shared: Arc<Shared<St, C>>,
    key: EntryKey,
    token: Option<u64>,
}

impl<St: IdempotencyStore, C: Clock> LeaseGuard<St, C> {
    async fn complete(mut self, done: Completed) {
        let Some(token) = self.token.take() else {
            return;
        };
        let sh = &self.shared;
        let now = sh.clock.now();
        let ttl = nanos(sh.settings.ttl);
        match sh.store.complete(self.key, token, done, ttl, now).await {
            Ok(true) => {}
            Ok(false) => tracing::warn!("idempotency lease ran out before the answer came"),
            Err(e) => {
                tracing::warn!(error = %e, "idempotency answer not stored");
                let _ = sh.store.release(self.key, token).await;
            }
        }
    }
}

impl<St: IdempotencyStore, C: Clock> Drop for LeaseGuard<St, C> {
    fn drop(&mut self) {
        let Some(token) = self.token.take() else {
            return;
        };
        let shared = self.shared.clone();
        let key = self.key;
        let mut release = Box::pin(async move {
            if let Err(e) = shared.store.release(key, token).await {
                tracing::warn!(error = %e, "idempotency key not released");
            }
        });
        // an in-process store answers at once; a remote one on the runtime
        let mut cx = Context::from_waker(Waker::noop());
        if release.as_mut().poll(&mut cx).is_pending() {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    rt.spawn(release);
                }
                Err(_) => tracing::warn!("idempotency key not released: no runtime"),
            }
        }
    }
}

/// The first execution: the inner call, then its answer stored (read
/// whole, up to the bound) or the key given back.
async fn first<St, C, F, ResB, E>(
    guard: LeaseGuard<St, C>,
    base: String,
    call: F,
    end: Arc<OnceLock<BodyEnd>>,
    head: u64,
) -> Result<Response<IdempotencyBody<ResB>>, E>
where
    St: IdempotencyStore,
    C: Clock,
    F: Future<Output = Result<Response<ResB>, E>>,
    ResB: Body<Data = Bytes>,
{
    let s = guard.shared.settings.clone();
    // an error drops the guard: the key is free again; one caused by a
    // body past its bound is that body's answer
    let res = match call.await {
        Ok(res) => res,
        Err(_) if end.get() == Some(&BodyEnd::TooLarge) => return Ok(full(too_large(&s, &base))),
        Err(e) => return Err(e),
    };
    let digest = match end.get() {
        Some(BodyEnd::Complete(d)) => Some(*d),
        Some(BodyEnd::TooLarge) => return Ok(full(too_large(&s, &base))),
        // the body failed: the client's own fault, not an answer to it
        Some(BodyEnd::Failed) => return Ok(res.map(IdempotencyBody::inner)),
        // answered before the body was read to its end (a service that
        // ignores it): it ran, so it is kept, matched by its head
        None => None,
    };
    let status = res.status();
    let final_answer = status != StatusCode::TOO_MANY_REQUESTS
        && status != StatusCode::SERVICE_UNAVAILABLE
        && (!status.is_server_error() || s.store_5xx);
    if !final_answer {
        return Ok(res.map(IdempotencyBody::inner));
    }
    let fingerprint = Fingerprint { head, body: digest };
    let (parts, body) = res.into_parts();
    let mut body = Box::pin(body);
    let mut buf = BytesMut::new();
    let stored = |b| StoredAnswer {
        status,
        headers: replay::kept_fields(&parts.headers),
        body: b,
    };
    loop {
        let frame = match poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
            None => break,
            Some(Ok(f)) => f,
            Some(Err(_)) => {
                return Ok(full(problem(
                    &base,
                    ProblemKind::BadGateway,
                    "The answer failed before it ended.",
                )))
            }
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if buf.len() + data.len() > s.max_answer_bytes {
            // too large to keep: it ran, and is not run again
            let answer = stored(None);
            guard
                .complete(Completed {
                    fingerprint,
                    answer,
                })
                .await;
            buf.extend_from_slice(&data);
            return Ok(Response::from_parts(
                parts,
                IdempotencyBody::rest(buf.freeze(), body),
            ));
        }
        buf.extend_from_slice(&data);
    }
    let bytes = buf.freeze();
    let answer = stored(Some(bytes.clone()));
    guard
        .complete(Completed {
            fingerprint,
            answer,
        })
        .await;
    Ok(Response::from_parts(parts, IdempotencyBody::full(bytes)))
}
