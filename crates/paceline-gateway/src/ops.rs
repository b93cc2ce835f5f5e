//! The operations listener (`gateway.metrics_listen`): `GET /metrics` in
//! the Prometheus text format, `GET /healthz` and `GET /readyz`.
//!
//! - `/healthz` answers `200` while the process serves: a liveness probe
//!   that restarts only a gateway that no longer answers at all.
//! - `/readyz` answers `200` when the configuration is loaded (it is, once
//!   the gateway runs: a broken file at a reload keeps the old one) and
//!   the store can decide: always for the memory store; for Redis, when
//!   it answers a `PING` within the store's deadline, or, with
//!   `ready_when_degraded = true`, while the degraded limiter decides in
//!   its place. Otherwise `503` with the reason, so an orchestrator takes
//!   the instance out of rotation instead of letting it answer every
//!   request from a degraded or failing store. Each probe asks the store
//!   afresh: the answer is never older than one deadline.
//!
//! Both answer JSON (`{"status": "ready", ...}`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::metrics as m;
use crate::proxy::{full, ProxyBody};
use crate::store::GatewayStore;

/// What a readiness probe found: ready or not, and the JSON that says why.
pub(crate) type Readiness = (bool, serde_json::Value);

/// Asks whether the gateway is ready (see the module documentation).
pub(crate) type ReadyProbe =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Readiness> + Send>> + Send + Sync>;

/// The probe of a gateway deciding on `store`.
pub(crate) fn store_probe(store: GatewayStore, ready_when_degraded: bool) -> ReadyProbe {
    Arc::new(move || {
        let store = store.clone();
        Box::pin(async move { store_readiness(&store, ready_when_degraded).await })
    })
}

async fn store_readiness(store: &GatewayStore, ready_when_degraded: bool) -> Readiness {
    match store {
        #[cfg(feature = "redis")]
        GatewayStore::Redis(r) => match r.ping().await {
            Ok(took) => (
                true,
                serde_json::json!({
                    "status": "ready",
                    "store": "redis",
                    "round_trip_ms": took.as_secs_f64() * 1000.0,
                }),
            ),
            Err(e) => {
                let (has_mode, _) = r.degraded_mode();
                let ready = ready_when_degraded && has_mode;
                let status = if ready { "degraded" } else { "not_ready" };
                (
                    ready,
                    serde_json::json!({
                        "status": status,
                        "store": "redis",
                        "reason": format!("Redis does not answer: {e}"),
                    }),
                )
            }
        },
        _ => {
            let _ = ready_when_degraded;
            (
                true,
                serde_json::json!({"status": "ready", "store": "memory"}),
            )
        }
    }
}

/// Serves the operations endpoints on `listener`; without a probe
/// `/readyz` answers ready whenever the process serves.
pub(crate) async fn serve(listener: TcpListener, probe: Option<ReadyProbe>) {
    let handle = m::prometheus();
    if handle.is_none() {
        tracing::warn!("another metrics recorder is installed; /metrics stays empty");
    }
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let (handle, probe) = (handle.clone(), probe.clone());
        let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
            let (handle, probe) = (handle.clone(), probe.clone());
            async move {
                let res = match req.uri().path() {
                    "/metrics" => {
                        let text = handle.as_ref().map(|h| h.render()).unwrap_or_default();
                        let mut r = Response::new(full(text));
                        r.headers_mut().insert(
                            http::header::CONTENT_TYPE,
                            http::HeaderValue::from_static("text/plain; version=0.0.4"),
                        );
                        r
                    }
                    "/healthz" => json(StatusCode::OK, &serde_json::json!({"status": "alive"})),
                    "/readyz" => {
                        let (ready, body) = match &probe {
                            Some(p) => p().await,
                            None => (true, serde_json::json!({"status": "ready"})),
                        };
                        let status = match ready {
                            true => StatusCode::OK,
                            false => StatusCode::SERVICE_UNAVAILABLE,
                        };
                        json(status, &body)
                    }
                    _ => {
                        let mut r = Response::new(full("not found\n"));
                        *r.status_mut() = StatusCode::NOT_FOUND;
                        r
                    }
                };
                Ok::<_, std::convert::Infallible>(res)
            }
        });
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

fn json(status: StatusCode, body: &serde_json::Value) -> Response<ProxyBody> {
    let mut r = Response::new(full(format!("{body}\n")));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r.headers_mut().insert(
        http::header::CACHE_CONTROL,
        http::HeaderValue::from_static("no-store"),
    );
    r
}
