//! The soft-limit webhook: a fire-and-forget POST per event.
//!
//! Why fire and forget: the hook runs on the request path, and a slow or
//! dead receiver must never slow an API call down. Each event is posted
//! from its own task with a short timeout; a failure is logged and dropped.

use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Request, Uri};
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use paceline_server::{SoftLimitEvent, SoftLimitHook};

/// How long one delivery may take.
pub(crate) const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(2);

/// The JSON document posted for an event.
pub(crate) fn event_json(ev: &SoftLimitEvent) -> String {
    serde_json::json!({
        "event": "soft_limit",
        "plan": ev.plan,
        "policy": ev.policy,
        "key_hash": ev.key_hash.to_string(),
        "used": ev.used,
        "quota": ev.quota,
        "window_ends_unix_s": ev.window_ends.as_secs_ceil(),
    })
    .to_string()
}

/// A hook that posts each event to `uri` without waiting for it.
pub(crate) fn webhook(uri: Uri) -> SoftLimitHook {
    let mut conn = HttpConnector::new();
    conn.set_connect_timeout(Some(WEBHOOK_TIMEOUT));
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build(conn);
    SoftLimitHook::new(move |ev| {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut req = Request::post(uri.clone())
            .body(Full::new(Bytes::from(event_json(ev))))
            .expect("a valid request");
        req.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let client = client.clone();
        rt.spawn(async move {
            match tokio::time::timeout(WEBHOOK_TIMEOUT, client.request(req)).await {
                Ok(Ok(res)) if res.status().is_success() => {}
                Ok(Ok(res)) => tracing::warn!(
                    status = res.status().as_u16(),
                    "soft-limit webhook refused the event"
                ),
                Ok(Err(e)) => tracing::warn!(error = %e, "soft-limit webhook failed"),
                Err(_) => tracing::warn!("soft-limit webhook timed out"),
            }
        });
    })
}
