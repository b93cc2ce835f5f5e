//! The layer over stores that answer later (as a remote store does) or not
//! at all: same decisions, and fail-open or fail-closed as each policy says.

use std::convert::Infallible;
use std::future::Future;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Empty};
use paceline_core::{
    Decision, FailMode, ManualClock, MemoryStore, Nanos, Plan, Policy, Store, StoreError,
};
use paceline_server::{Limits, RateLimiter};
use tower::{Layer, ServiceExt};

/// A memory store that answers only after yielding to the runtime.
#[derive(Clone, Default)]
struct Later(MemoryStore);

impl Store for Later {
    fn check(
        &self,
        plan: &Plan,
        key: &str,
        cost: u64,
        now: Nanos,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        let (s, plan, key) = (self.0.clone(), plan.clone(), key.to_string());
        async move {
            tokio::task::yield_now().await;
            s.check_sync(&plan, &key, cost, now)
        }
    }
    fn release(
        &self,
        plan: &Plan,
        key: &str,
        amount: u64,
        now: Nanos,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.0.release(plan, key, amount, now)
    }
}

/// A store that cannot be reached.
#[derive(Clone, Default)]
struct Down;

impl Store for Down {
    async fn check(&self, _: &Plan, _: &str, _: u64, _: Nanos) -> Result<Decision, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
    async fn release(&self, _: &Plan, _: &str, _: u64, _: Nanos) -> Result<(), StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
}

fn limits(fail: FailMode) -> Limits {
    let free = Plan::new(
        "free",
        vec![
            Policy::token_bucket("burst", 20, 2).unwrap(),
            Policy::daily("daily", 10_000).unwrap().with_fail_mode(fail),
        ],
    )
    .unwrap();
    Limits::builder()
        .plan(free)
        .key("sk", "free")
        .build()
        .unwrap()
}

fn req(path: &str) -> Request<()> {
    Request::get(path)
        .header("authorization", "Bearer sk")
        .body(())
        .unwrap()
}

fn ok() -> impl tower::Service<
    Request<()>,
    Response = Response<Empty<Bytes>>,
    Error = Infallible,
    Future: Send,
> + Clone
       + Send
       + 'static {
    tower::service_fn(|_r: Request<()>| async { Ok::<_, Infallible>(Response::new(Empty::new())) })
}

#[tokio::test]
async fn a_store_that_answers_later_decides_the_same() {
    let clock = ManualClock::at_unix_secs(1_790_769_600);
    let limiter = RateLimiter::new(limits(FailMode::Open), Later::default(), clock.clone());
    let svc = limiter.layer().layer(ok());
    for i in 1..=25u64 {
        let res = svc.clone().oneshot(req("/v1/rates")).await.unwrap();
        let rl = res.headers()["ratelimit"].to_str().unwrap().to_string();
        if i <= 20 {
            assert_eq!(res.status(), 200);
            assert!(rl.starts_with(&format!("\"burst\";r={};", 20 - i)), "{rl}");
        } else {
            assert_eq!(res.status(), 429);
            assert_eq!(res.headers()["retry-after"], "1");
            assert!(rl.contains("\"daily\";r=9980;"), "{rl}");
        }
    }
    let usage = svc.clone().oneshot(req("/v1/usage")).await.unwrap();
    let body = usage.into_body().collect().await.unwrap().to_bytes();
    let u: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(u["limits"][1]["r"], 9_980);
    clock.advance(Nanos::from_secs(1));
    assert_eq!(svc.oneshot(req("/v1/rates")).await.unwrap().status(), 200);
}

#[tokio::test]
async fn an_unreachable_store_fails_open_or_closed_per_policy() {
    let clock = ManualClock::at_unix_secs(1_790_769_600);
    let open = RateLimiter::new(limits(FailMode::Open), Down, clock.clone());
    let res = open
        .layer()
        .layer(ok())
        .oneshot(req("/v1/rates"))
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert!(res.headers().get("ratelimit").is_none());

    let closed = RateLimiter::new(limits(FailMode::Closed), Down, clock);
    let res = closed
        .layer()
        .layer(ok())
        .oneshot(req("/v1/rates"))
        .await
        .unwrap();
    assert_eq!(res.status(), 503);
    assert_eq!(res.headers()["retry-after"], "1");
    assert_eq!(res.headers()["cache-control"], "no-store");
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let p: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert!(p["type"].as_str().unwrap().ends_with("overloaded"));
}

/// A remote store with a local cache of denials: it answers a key over
/// its limit at once (`check_local`), everything else only later.
#[derive(Clone, Default)]
struct Cached {
    inner: Later,
    asked: std::sync::Arc<std::sync::atomic::AtomicU64>,
    peeked: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Store for Cached {
    fn check(
        &self,
        plan: &Plan,
        key: &str,
        cost: u64,
        now: Nanos,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        self.asked
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.check(plan, key, cost, now)
    }
    fn release(
        &self,
        plan: &Plan,
        key: &str,
        amount: u64,
        now: Nanos,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner.release(plan, key, amount, now)
    }
    fn check_local(
        &self,
        plan: &Plan,
        key: &str,
        cost: paceline_core::Cost,
        now: Nanos,
    ) -> Option<Result<Decision, StoreError>> {
        // a denial is answered here, anything else is asked for
        let d = self
            .inner
            .0
            .check_sync(plan, key, paceline_core::Cost::requests(0), now);
        match d {
            Ok(d) if d.statuses.iter().any(|s| s.remaining < cost.requests) => {
                Some(self.inner.0.check_sync(plan, key, cost, now))
            }
            _ => None,
        }
    }
    fn peek_local(&self, plan: &Plan, key: &str, now: Nanos) -> Option<Decision> {
        self.peeked
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner
            .0
            .check_sync(plan, key, paceline_core::Cost::requests(0), now)
            .ok()
    }
}

#[tokio::test]
async fn a_denial_the_store_answers_locally_never_waits_for_it() {
    let clock = ManualClock::at_unix_secs(1_790_769_600);
    let store = Cached::default();
    let limiter = RateLimiter::new(limits(FailMode::Open), store.clone(), clock.clone());
    let svc = limiter.layer().layer(ok());
    for _ in 0..20 {
        let res = svc.clone().oneshot(req("/v1/rates")).await.unwrap();
        assert_eq!(res.status(), 200);
    }
    let asked = store.asked.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(asked, 20);
    // over the limit: answered by the local cache, as a ready future
    for _ in 0..5 {
        let fut = svc.clone().oneshot(req("/v1/rates"));
        let res = ready_now(fut)
            .expect("a local denial is answered at once")
            .unwrap();
        assert_eq!(res.status(), 429);
        assert_eq!(res.headers()["retry-after"], "1");
    }
    assert_eq!(
        store.asked.load(std::sync::atomic::Ordering::Relaxed),
        asked
    );
}

/// Polls a future once: its output if it was ready.
fn ready_now<F: Future>(f: F) -> Option<F::Output> {
    let mut f = std::pin::pin!(f);
    let waker = std::task::Waker::noop();
    match f.as_mut().poll(&mut std::task::Context::from_waker(waker)) {
        std::task::Poll::Ready(r) => Some(r),
        std::task::Poll::Pending => None,
    }
}

#[tokio::test]
async fn a_held_key_takes_its_fields_from_a_peek_not_the_store() {
    let clock = ManualClock::at_unix_secs(1_790_769_600);
    let store = Cached::default();
    let limiter = RateLimiter::new(limits(FailMode::Open), store.clone(), clock.clone());
    let svc = limiter.layer().layer(ok());
    for _ in 0..20 {
        assert_eq!(
            svc.clone()
                .oneshot(req("/v1/rates"))
                .await
                .unwrap()
                .status(),
            200
        );
    }
    let asked = |s: &Cached| s.asked.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(asked(&store), 20);
    // inside its Retry-After the key keeps sending: escalation holds it
    let mut held = 0;
    for _ in 0..40 {
        let res = ready_now(svc.clone().oneshot(req("/v1/rates")))
            .expect("a refusal is answered at once")
            .unwrap();
        assert_eq!(res.status(), 429);
        let rl = res.headers()["ratelimit"].to_str().unwrap().to_string();
        assert!(rl.contains("\"burst\";r=0;"), "{rl}");
        assert!(rl.contains("\"daily\";r=9980;"), "{rl}");
        if res.headers()["retry-after"] != "1" {
            held += 1;
        }
    }
    assert!(held > 0, "escalation never held the key");
    assert_eq!(asked(&store), 20, "a held refusal asked the store");
    let peeked = store.peeked.load(std::sync::atomic::Ordering::Relaxed);
    // the refusal that escalated the key was the store's own; every
    // later one was held, its fields from a peek
    assert_eq!(peeked + 1, held, "{peeked} peeks for {held} longer waits");
}
