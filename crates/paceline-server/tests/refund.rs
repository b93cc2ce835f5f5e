//! The limit layer gives a charge back when its inner service marks the
//! answer [`UpstreamFailed::NeverSent`], unless the plan charges upstream
//! failures, and keeps the charge of one marked
//! [`UpstreamFailed::AfterSending`] (the upstream may have done the work)
//! unless the plan refunds those too; the file settings and the builder
//! agree, and a setting for a plan that does not exist is refused.

use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Empty;
use paceline_core::{ManualClock, MemoryStore, Plan, Policy};
use paceline_server::{ConfigErrorKind, Limits, LimitsConfig, RateLimiter, UpstreamFailed};
use tower::{Service, ServiceExt};

fn limits(charge: bool) -> Limits {
    limits_with(charge, false)
}

fn limits_with(charge: bool, refund_sent: bool) -> Limits {
    let plan = Plan::new(
        "free",
        vec![
            Policy::token_bucket("burst", 10, 10).unwrap(),
            Policy::daily("daily", 100).unwrap(),
        ],
    )
    .unwrap();
    Limits::builder()
        .plan(plan)
        .key("sk_1", "free")
        .charge_upstream_failures("free", charge)
        .refund_sent_failures("free", refund_sent)
        .build()
        .unwrap()
}

/// Sends one request through the layer over a service that answers `502`
/// (marked with `failed`); the burst and daily remaining after it.
async fn through(
    limiter: &RateLimiter<MemoryStore, ManualClock>,
    failed: Option<UpstreamFailed>,
) -> Vec<u64> {
    let inner = tower::service_fn(move |_req: Request<()>| async move {
        let mut res = Response::new(Empty::<Bytes>::new());
        *res.status_mut() = http::StatusCode::BAD_GATEWAY;
        if let Some(f) = failed {
            res.extensions_mut().insert(f);
        }
        Ok::<_, Infallible>(res)
    });
    let mut svc = tower::ServiceBuilder::new()
        .layer(limiter.layer())
        .service(inner);
    let req = Request::get("/v1/x")
        .header("authorization", "Bearer sk_1")
        .body(())
        .unwrap();
    let res = svc.ready().await.unwrap().call(req).await.unwrap();
    assert_eq!(res.status(), 502);
    // the answer's own fields tell the budget after the refund
    let field = res.headers()["ratelimit"].to_str().unwrap().to_string();
    drop(res);
    let probe = Request::get("/v1/usage")
        .header("authorization", "Bearer sk_1")
        .body(())
        .unwrap();
    let res = svc.ready().await.unwrap().call(probe).await.unwrap();
    let body = http_body_util::BodyExt::collect(res.into_body())
        .await
        .unwrap()
        .to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let left: Vec<u64> = v["limits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["r"].as_u64().unwrap())
        .collect();
    assert!(
        field.contains(&format!("\"burst\";r={};", left[0])),
        "{field} {left:?}"
    );
    left
}

#[tokio::test]
async fn an_upstream_failure_is_given_back_by_default() {
    let clock = ManualClock::at_unix_secs(1_790_000_000);
    let limiter = RateLimiter::new(limits(false), MemoryStore::new(), clock);
    assert_eq!(through(&limiter, NEVER).await, vec![10, 100]);
    // an answer that is not marked stays charged
    assert_eq!(through(&limiter, None).await, vec![9, 99]);
}

const NEVER: Option<UpstreamFailed> = Some(UpstreamFailed::NeverSent);
const SENT: Option<UpstreamFailed> = Some(UpstreamFailed::AfterSending);

#[tokio::test]
async fn a_failure_after_the_head_was_sent_stays_charged_unless_the_plan_refunds_it() {
    let clock = ManualClock::at_unix_secs(1_790_000_000);
    let limiter = RateLimiter::new(limits(false), MemoryStore::new(), clock.clone());
    assert_eq!(through(&limiter, SENT).await, vec![9, 99]);
    let limiter = RateLimiter::new(limits_with(false, true), MemoryStore::new(), clock.clone());
    assert_eq!(through(&limiter, SENT).await, vec![10, 100]);
    // charging every failure wins over refunding the sent ones
    let limiter = RateLimiter::new(limits_with(true, true), MemoryStore::new(), clock);
    assert_eq!(through(&limiter, SENT).await, vec![9, 99]);
    assert_eq!(through(&limiter, NEVER).await, vec![8, 98]);
}

#[tokio::test]
async fn a_plan_may_charge_upstream_failures() {
    let clock = ManualClock::at_unix_secs(1_790_000_000);
    let limiter = RateLimiter::new(limits(true), MemoryStore::new(), clock);
    assert_eq!(through(&limiter, NEVER).await, vec![9, 99]);
}

#[test]
fn the_file_setting_reaches_the_plan_and_unknown_plans_are_refused() {
    let text = r#"
[plans.free]
charge_upstream_failures = true
policies = [{ name = "b", algorithm = "token_bucket", q = 1, w = 1 }]
"#;
    let m: LimitsConfig = toml::from_str(text).unwrap();
    assert!(m.plans["free"].charge_upstream_failures);
    m.build().unwrap();
    let m: LimitsConfig =
        toml::from_str(&text.replace("charge_upstream_failures = true\n", "")).unwrap();
    assert!(!m.plans["free"].charge_upstream_failures, "off by default");
    assert!(!m.plans["free"].refund_sent_failures, "off by default");
    let m: LimitsConfig = toml::from_str(&text.replace(
        "charge_upstream_failures = true",
        "refund_sent_failures = true",
    ))
    .unwrap();
    assert!(m.plans["free"].refund_sent_failures);
    m.build().unwrap();
    let plan = Plan::new("free", vec![Policy::token_bucket("b", 1, 1).unwrap()]).unwrap();
    let e = Limits::builder()
        .plan(plan)
        .charge_upstream_failures("gold", true)
        .build()
        .unwrap_err();
    assert_eq!(e.kind(), ConfigErrorKind::UnknownPlan);
}
