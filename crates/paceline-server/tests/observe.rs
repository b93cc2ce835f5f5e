//! Metrics (Prometheus exposition) and logs of the layer. One test in this
//! binary: it installs the global recorder and subscriber.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Empty;
use metrics_exporter_prometheus::PrometheusBuilder;
use paceline_core::{ManualClock, MemoryStore, Nanos, Plan, Policy};
use paceline_server::{EscalationConfig, KeyHash, Limits, RateLimiter};
use tower::{Layer, ServiceExt};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// Keeps every event as `field=value` text and counts spans by name.
#[derive(Clone, Default)]
struct Capture {
    events: Arc<Mutex<Vec<String>>>,
    spans: Arc<Mutex<Vec<String>>>,
}

struct Text<'a>(&'a mut String);

impl Visit for Text<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, "{}={:?} ", field.name(), value);
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let mut s = span.metadata().name().to_string();
        s.push(' ');
        span.record(&mut Text(&mut s));
        let mut spans = self.spans.lock().unwrap();
        spans.push(s);
        Id::from_u64(spans.len() as u64)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut s = String::new();
        event.record(&mut Text(&mut s));
        self.events.lock().unwrap().push(s);
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

const SECRET: &str = "sk_secret_123";

#[tokio::test]
async fn metrics_and_logs() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let prom = recorder.handle();
    metrics::set_global_recorder(recorder).unwrap();
    let capture = Capture::default();
    tracing::subscriber::set_global_default(capture.clone()).unwrap();

    let plan = Plan::new(
        "free",
        vec![
            Policy::token_bucket("burst", 20, 2).unwrap(),
            Policy::daily("daily", 10_000).unwrap(),
            Policy::token_bucket("trial", 10, 2)
                .unwrap()
                .with_shadow(true),
        ],
    )
    .unwrap();
    let limits = Limits::builder()
        .plan(plan)
        .key(SECRET, "free")
        .escalation(EscalationConfig {
            extend_after: 3,
            block_after: 6,
            ..Default::default()
        })
        .build()
        .unwrap();
    let clock = ManualClock::at_unix_secs(1_790_769_600);
    let limiter = RateLimiter::new(limits, MemoryStore::new(), clock.clone());
    let svc = limiter
        .layer()
        .layer(tower::service_fn(|_r: Request<()>| async {
            Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
        }));
    let req = || {
        Request::get("/v1/rates")
            .header("authorization", format!("Bearer {SECRET}"))
            .body(())
            .unwrap()
    };
    let mut statuses = Vec::new();
    for _ in 0..30 {
        let res = svc.clone().oneshot(req()).await.unwrap();
        statuses.push(res.status().as_u16());
    }
    assert_eq!(statuses.iter().filter(|&&s| s == 200).count(), 20);
    clock.advance(Nanos::from_secs(3600));
    assert_eq!(svc.clone().oneshot(req()).await.unwrap().status(), 200);

    let text = prom.render();
    let line = |parts: &[&str]| {
        text.lines()
            .find(|l| parts.iter().all(|p| l.contains(p)))
            .unwrap_or_else(|| panic!("no line with {parts:?} in\n{text}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .parse::<f64>()
            .unwrap()
    };
    let allowed = line(&[
        "paceline_decisions_total{",
        "outcome=\"allowed\"",
        "policy=\"none\"",
    ]);
    assert_eq!(allowed, 21.0);
    let limited = line(&[
        "paceline_decisions_total{",
        "outcome=\"rate_limited\"",
        "policy=\"burst\"",
    ]);
    assert_eq!(limited, 10.0);
    // the shadow policy (10 per 2 s) would have refused 10 of the 20 admitted
    assert_eq!(
        line(&["paceline_shadow_rejections_total{", "policy=\"trial\""]),
        10.0
    );
    assert_eq!(
        line(&["paceline_escalations_total{", "level=\"extended\""]),
        1.0
    );
    assert_eq!(
        line(&["paceline_escalations_total{", "level=\"blocked\""]),
        1.0
    );
    let timed = line(&["paceline_decision_seconds_count", "outcome=\"allowed\""])
        + line(&[
            "paceline_decision_seconds_count",
            "outcome=\"rate_limited\"",
        ]);
    assert_eq!(timed, 31.0);
    assert!(!text.contains(SECRET));

    let events = capture.events.lock().unwrap().clone();
    let rejections: Vec<_> = events
        .iter()
        .filter(|e| e.contains("request rejected"))
        .collect();
    assert_eq!(rejections.len(), 10);
    let hash = KeyHash::of(&format!("k:{SECRET}")).to_string();
    assert!(rejections[0].contains("policy=burst"), "{}", rejections[0]);
    assert!(rejections[0].contains(&hash), "{}", rejections[0]);
    assert!(events.iter().any(|e| e.contains("key escalated")));
    assert!(
        events.iter().all(|e| !e.contains(SECRET)),
        "a log line carries the key"
    );
    let spans = capture.spans.lock().unwrap();
    assert_eq!(
        spans
            .iter()
            .filter(|s| s.starts_with("paceline.decide"))
            .count(),
        31
    );
    assert!(spans.iter().all(|s| !s.contains(SECRET)));
}
