//! Escalation tells the truth, in process on a manual clock: a hold says
//! so and when it ends, `Retry-After` is never shorter than a policy's own
//! wait nor longer than the hold plus it, `RateLimit` agrees with the
//! answer, and a quota is never held past its reset.

use std::convert::Infallible;
use std::future::Future;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use paceline_core::{ManualClock, MemoryStore, Nanos, Plan, Policy};
use paceline_server::{EscalationConfig, Limits, RateLimiter};
use tower::{Layer, Service};

/// 2026-10-01T00:00:00Z
const MIDNIGHT: u64 = 1_790_812_800;

fn now_or_never<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("in-memory decisions are ready at once"),
    }
}

struct Got {
    status: u16,
    retry_after: Option<u64>,
    ratelimit: String,
    body: serde_json::Value,
}

impl Got {
    /// `param` (`r` or `t`) of `policy`'s item in `RateLimit`.
    fn item(&self, policy: &str, param: &str) -> u64 {
        let it = self
            .ratelimit
            .split(", ")
            .find(|i| i.starts_with(&format!("\"{policy}\"")))
            .unwrap_or_else(|| panic!("no {policy} in {:?}", self.ratelimit));
        it.split(';')
            .find_map(|p| p.strip_prefix(&format!("{param}=")))
            .unwrap()
            .parse()
            .unwrap()
    }
    fn detail(&self) -> &str {
        self.body["detail"].as_str().unwrap_or("")
    }
}

struct Api {
    clock: ManualClock,
    call: Box<dyn FnMut() -> Got>,
}

impl Api {
    fn new(plan: Plan, escalation: EscalationConfig, start_s: u64) -> Api {
        let limits = Limits::builder()
            .plan(plan)
            .key("sk_1", "p")
            .escalation(escalation)
            .build()
            .unwrap();
        let clock = ManualClock::at_unix_secs(start_s);
        let limiter = RateLimiter::new(limits, MemoryStore::new(), clock.clone());
        let mut svc = limiter
            .layer()
            .layer(tower::service_fn(|_r: Request<()>| async {
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"{}"))))
            }));
        let call = Box::new(move || {
            let req = Request::get("/v1/rates")
                .header("authorization", "Bearer sk_1")
                .body(())
                .unwrap();
            let res = now_or_never(svc.call(req)).unwrap();
            let (parts, body) = res.into_parts();
            let bytes = now_or_never(body.collect()).unwrap().to_bytes();
            let h = &parts.headers;
            Got {
                status: parts.status.as_u16(),
                retry_after: h
                    .get("retry-after")
                    .map(|v| v.to_str().unwrap().parse().unwrap()),
                ratelimit: h
                    .get("ratelimit")
                    .map_or(String::new(), |v| v.to_str().unwrap().to_string()),
                body: serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
            }
        });
        Api { clock, call }
    }
    fn send(&mut self) -> Got {
        (self.call)()
    }
    fn now_s(&self) -> f64 {
        use paceline_core::Clock;
        self.clock.now().as_secs_f64()
    }
}

fn escalation() -> EscalationConfig {
    EscalationConfig {
        extend_after: 5,
        extend_factor: 4,
        block_after: 15,
        block_for_s: 120,
        ..Default::default()
    }
}

#[test]
fn a_spent_daily_quota_is_never_held_past_its_reset() {
    let plan = Plan::new(
        "p",
        vec![
            Policy::token_bucket("burst", 20, 2).unwrap(),
            Policy::daily("daily", 30).unwrap(),
        ],
    )
    .unwrap();
    // the quota runs out 16,971 s before midnight
    let mut api = Api::new(plan, escalation(), MIDNIGHT - 16_971 - 30);
    for _ in 0..30 {
        assert_eq!(api.send().status, 200);
        api.clock.advance(Nanos::from_secs(1));
    }
    for i in 0..200 {
        let g = api.send();
        let to_reset = (MIDNIGHT as f64 - api.now_s()).ceil() as u64;
        assert_eq!(g.status, 429);
        assert_eq!(g.retry_after, Some(to_reset), "answer {i}");
        assert_eq!(g.item("daily", "t"), to_reset, "answer {i}");
        assert_eq!(g.item("daily", "r"), 0);
        assert_eq!(g.body["limit"], "daily");
        assert_eq!(g.body["retry_after_s"], to_reset);
        assert!(g.body["type"]
            .as_str()
            .unwrap()
            .ends_with("quota_exhausted"));
        api.clock.advance(Nanos::from_millis(10));
    }
}

#[test]
fn a_blocked_key_is_told_of_the_block_and_the_fields_agree() {
    let plan = Plan::new(
        "p",
        vec![
            Policy::token_bucket("burst", 20, 2).unwrap(),
            Policy::daily("daily", 10_000).unwrap(),
        ],
    )
    .unwrap();
    let mut api = Api::new(plan, escalation(), MIDNIGHT - 40_000);
    for _ in 0..20 {
        assert_eq!(api.send().status, 200);
    }
    let answers: Vec<Got> = (0..16).map(|_| api.send()).collect();
    let waits: Vec<u64> = answers.iter().map(|g| g.retry_after.unwrap()).collect();
    assert_eq!(waits[..5], [1, 1, 1, 1, 1]);
    assert!(waits[5..15].iter().all(|&w| w == 4), "{waits:?}");
    assert_eq!(waits[15], 120);
    // an extended wait says so, and its policy's fields agree
    let extended = &answers[6];
    assert!(
        extended.detail().contains("extended to 4 seconds"),
        "{}",
        extended.detail()
    );
    assert_eq!(
        (extended.item("burst", "r"), extended.item("burst", "t")),
        (0, 4)
    );
    let blocked = &answers[15];
    assert!(
        blocked.detail().contains("blocked for 120 seconds"),
        "{}",
        blocked.detail()
    );
    assert_eq!(
        (blocked.item("burst", "r"), blocked.item("burst", "t")),
        (0, 120)
    );
    // later in the block: the bucket has refilled, the block has not
    api.clock.advance(Nanos::from_secs(60));
    let g = api.send();
    assert_eq!((g.status, g.retry_after), (429, Some(60)));
    assert_eq!((g.item("burst", "r"), g.item("burst", "t")), (0, 60));
    assert_eq!(g.body["retry_after_s"], 60);
    assert!(
        g.detail().contains("blocked for 60 seconds"),
        "{}",
        g.detail()
    );
    assert!(!g.detail().contains("20 of 20"), "{}", g.detail());
    // the daily quota is told as it stands
    assert_eq!(g.item("daily", "r"), 10_000 - 20);
}

#[test]
fn a_block_never_hides_a_longer_real_wait() {
    // one request per ten minutes: the real wait outlasts the block
    let plan = Plan::new("p", vec![Policy::token_bucket("slow", 1, 600).unwrap()]).unwrap();
    let cfg = EscalationConfig {
        block_for_s: 60,
        ..escalation()
    };
    let mut api = Api::new(plan, cfg, MIDNIGHT - 40_000);
    let start = api.now_s();
    assert_eq!(api.send().status, 200);
    let mut blocked = 0;
    for _ in 0..40 {
        api.clock.advance(Nanos::from_millis(100));
        let g = api.send();
        assert_eq!(g.status, 429);
        let real = (start + 600.0 - api.now_s()).ceil() as u64;
        let ra = g.retry_after.unwrap();
        assert!(ra >= real, "Retry-After {ra} below the real wait {real}");
        assert_eq!(g.item("slow", "t"), ra, "RateLimit agrees with Retry-After");
        if g.detail().contains("blocked") {
            blocked += 1;
        }
        if blocked > 0 {
            assert!(
                ra <= 60 + real,
                "{ra} past the block plus the real wait {real}"
            );
        }
    }
}
