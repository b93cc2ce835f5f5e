//! The classification seam: a request's [`RouteInfo`] is made once, by
//! whichever layer needs it first, and travels in its extensions. The
//! limit layer decides with one it finds there (made by the limits in
//! force) instead of matching the routes again, classifies by itself when
//! there is none, and never decides with a classification made by limits
//! since replaced.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Empty;
use paceline_core::{ManualClock, MemoryStore, Plan, Policy};
use paceline_server::{Criticality, Limits, RateLimiter, Route, RouteInfo};
use tower::{Service, ServiceExt};

type Limiter = RateLimiter<MemoryStore, ManualClock>;

fn limits(rates_cost: u64) -> Limits {
    let plan = Plan::new("free", vec![Policy::token_bucket("burst", 20, 2).unwrap()]).unwrap();
    let login = Plan::new("login", vec![Policy::fixed_window("login", 5, 60).unwrap()]).unwrap();
    Limits::builder()
        .plan(plan)
        .plan(login)
        .key("sk_1", "free")
        .route(
            Route::new("GET", "/v1/rates")
                .unwrap()
                .with_cost(rates_cost)
                .with_criticality(Criticality::Sheddable),
        )
        .route(
            Route::new("POST", "/v1/login")
                .unwrap()
                .anonymous(Some("login")),
        )
        .build()
        .unwrap()
}

fn limiter(l: Limits) -> Limiter {
    RateLimiter::new(
        l,
        MemoryStore::new(),
        ManualClock::at_unix_secs(1_790_000_000),
    )
}

fn get(path: &str) -> Request<()> {
    Request::get(path)
        .header("authorization", "Bearer sk_1")
        .body(())
        .unwrap()
}

/// Calls the limit layer over a handler that keeps the classification it
/// finds; gives the burst remaining after the call and that classification.
async fn call(limiter: &Limiter, req: Request<()>) -> (Response<()>, Option<RouteInfo>) {
    let seen = Arc::new(Mutex::new(None));
    let kept = seen.clone();
    let handler = tower::service_fn(move |req: Request<()>| {
        *kept.lock().unwrap() = req.extensions().get::<RouteInfo>().cloned();
        async { Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new())) }
    });
    let mut svc = tower::ServiceBuilder::new()
        .layer(limiter.layer())
        .service(handler);
    let res = svc.ready().await.unwrap().call(req).await.unwrap();
    let info = seen.lock().unwrap().take();
    (res.map(|_| ()), info)
}

/// The burst remaining, from the `RateLimit` field.
fn remaining(res: &Response<()>) -> u64 {
    let field = res.headers()["ratelimit"].to_str().unwrap();
    let r = field.split(';').find_map(|p| p.strip_prefix("r=")).unwrap();
    r.parse().unwrap()
}

#[tokio::test]
async fn without_a_classification_the_layer_classifies_and_leaves_it() {
    let l = limiter(limits(3));
    let (res, info) = call(&l, get("/v1/rates")).await;
    assert_eq!(remaining(&res), 17);
    let info = info.expect("the layer leaves its classification");
    assert_eq!(info.pattern.as_deref(), Some("/v1/rates"));
    assert_eq!((info.cost, info.criticality), (3, Criticality::Sheddable));
    // the limiter's own classify gives what the layer made
    assert_eq!(l.classify(&get("/v1/rates")), info);
    // unmatched: cost 1, critical
    let (res, info) = call(&l, get("/v1/other")).await;
    assert_eq!(remaining(&res), 16);
    let info = info.unwrap();
    assert_eq!(
        (info.pattern, info.cost, info.criticality),
        (None, 1, Criticality::Critical)
    );
}

#[tokio::test]
async fn a_classification_in_the_extensions_is_used_not_matched_again() {
    let l = limiter(limits(3));
    let mut req = get("/v1/rates");
    let mut info = l.classify(&req);
    assert_eq!(info.cost, 3);
    // a classification saying otherwise than the routes is honoured: the
    // layer did not match them again
    info.cost = 7;
    req.extensions_mut().insert(info.clone());
    let (res, seen) = call(&l, req).await;
    assert_eq!(remaining(&res), 13, "charged the found cost, 7");
    assert_eq!(seen.unwrap().cost, 7, "the found one is what handlers see");

    // an anonymous route's plan travels in it too: limited per client IP
    // under the login plan, no counters published
    let mut login = Request::post("/v1/login").body(()).unwrap();
    let info = l.classify(&login);
    login.extensions_mut().insert(info);
    let (res, seen) = call(&l, login).await;
    assert_eq!(res.status(), 200);
    assert!(res.headers().get("ratelimit").is_none());
    assert_eq!(seen.unwrap().pattern.as_deref(), Some("/v1/login"));
}

#[tokio::test]
async fn a_reload_between_classifying_and_limiting_cannot_mix_configurations() {
    let l = limiter(limits(5));
    let mut req = get("/v1/rates");
    let mut info = l.classify(&req);
    assert_eq!(info.cost, 5);
    info.cost = 9;
    req.extensions_mut().insert(info);
    // the limits change after the request was classified
    l.reload(limits(2));
    let (res, seen) = call(&l, req).await;
    assert_eq!(
        remaining(&res),
        18,
        "decided wholly by the limits in force: cost 2"
    );
    let seen = seen.unwrap();
    assert_eq!(seen.cost, 2, "handlers see the classification decided with");
    assert_eq!(seen, l.classify(&get("/v1/rates")));

    // one made by other limits altogether (the same routes) is not used
    // either
    let mut req = get("/v1/rates");
    let mut foreign = limits(2).classify(&req);
    foreign.cost = 9;
    req.extensions_mut().insert(foreign);
    let (res, seen) = call(&l, req).await;
    assert_eq!(remaining(&res), 16);
    assert_eq!(seen.unwrap().cost, 2);
}

/// Like [`call`], handing `route` over with `call_classified`.
async fn call_with(
    limiter: &Limiter,
    req: Request<()>,
    route: RouteInfo,
) -> (Response<()>, Option<RouteInfo>) {
    let seen = Arc::new(Mutex::new(None));
    let kept = seen.clone();
    let handler = tower::service_fn(move |req: Request<()>| {
        *kept.lock().unwrap() = req.extensions().get::<RouteInfo>().cloned();
        async { Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new())) }
    });
    let mut svc = paceline_server::RateLimit::new(handler, limiter.clone());
    let res = svc.call_classified(req, route).await.unwrap();
    let info = seen.lock().unwrap().take();
    (res.map(|_| ()), info)
}

#[tokio::test]
async fn a_classification_handed_over_is_used_and_left_for_handlers() {
    let l = limiter(limits(3));
    let mut info = l.classify(&get("/v1/rates"));
    info.cost = 6;
    let (res, seen) = call_with(&l, get("/v1/rates"), info).await;
    assert_eq!(remaining(&res), 14, "charged the handed cost, 6");
    let seen = seen.expect("left in the extensions");
    assert_eq!(seen.cost, 6);
    assert_eq!(seen.pattern.as_deref(), Some("/v1/rates"));

    // handed over, then the limits change: not used
    let mut stale = l.classify(&get("/v1/rates"));
    stale.cost = 6;
    l.reload(limits(2));
    let (res, seen) = call_with(&l, get("/v1/rates"), stale).await;
    assert_eq!(remaining(&res), 12);
    assert_eq!(seen.unwrap(), l.classify(&get("/v1/rates")));
}

#[tokio::test]
async fn the_route_is_left_only_where_a_stage_after_wants_it() {
    let l = limiter(limits(3));
    let seen = Arc::new(Mutex::new(None));
    let kept = seen.clone();
    let handler = tower::service_fn(move |req: Request<()>| {
        *kept.lock().unwrap() = Some(req.extensions().get::<RouteInfo>().cloned());
        async { Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new())) }
    });
    let posts = |m: &http::Method| *m == http::Method::POST;
    let svc =
        paceline_server::RateLimit::new(handler, l.clone()).route_extension_if(Arc::new(posts));
    let take = || seen.lock().unwrap().take().expect("the handler was called");
    // a GET nobody after reads the route of: decided the same, left bare
    let res = svc.clone().oneshot(get("/v1/rates")).await.unwrap();
    assert_eq!(remaining(&res.map(|_| ())), 17);
    assert_eq!(take(), None);
    // handed over: still decided with, and not passed on
    let mut info = l.classify(&get("/v1/rates"));
    info.cost = 6;
    let res = svc.clone().call_classified(get("/v1/rates"), info).await;
    assert_eq!(remaining(&res.unwrap().map(|_| ())), 11);
    assert_eq!(take(), None);
    // a POST, which a stage after reads it for: passed on
    let login = Request::post("/v1/login").body(()).unwrap();
    let res = svc.clone().oneshot(login).await.unwrap();
    assert_eq!(res.status(), 200);
    let info = take().expect("left for the stage after");
    assert_eq!(info.pattern.as_deref(), Some("/v1/login"));
}
