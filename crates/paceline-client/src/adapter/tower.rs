//! A `tower` layer for hyper (or any `http`) clients.
//!
//! [`PacelineLayer`] wraps a service that takes
//! `http::Request<Full<Bytes>>`; the layered service takes requests with
//! any body, reads it once (up to the replay cap) so every attempt can
//! send it again, paces each attempt, and retries 429 and 503 as the
//! contract says. Rejections are classified from their headers (the body
//! stays untouched for the caller). Errors are boxed: a
//! [`ClientError`] from the SDK, or the inner
//! service's error; with [`Config::final_response`](crate::Config::final_response)
//! a call whose retries are spent ends with the server's last 429 or 503
//! instead. The response, and each request the inner service gets, carry
//! the [`Attempt`](crate::Attempt) in their extensions (its number and `Idempotency-Key`).
//!
//! A request that spends more than one request's worth of a unit the
//! server counts (tokens, points) carries a [`Cost`](crate::Cost) in its
//! extensions (`req.extensions_mut().insert(Cost::new().with("tokens",
//! 1_200))`); see [`crate::cost`].
//!
//! Versions: `tower-layer` and `tower-service` 0.3 (what tower 0.5 uses),
//! `http` 1 and `http-body` 1 (what hyper 1 and hyper-util 0.1 use), all
//! re-exported from the crate's root with `bytes` and `http-body-util`.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use bytes::Bytes;
//! use http_body_util::Full;
//! use hyper_util::client::legacy::Client as Hyper;
//! use hyper_util::rt::TokioExecutor;
//! use paceline_client::adapter::tower::PacelineLayer;
//! use tower::{Layer, Service, ServiceExt};
//!
//! let hyper: Hyper<_, Full<Bytes>> = Hyper::builder(TokioExecutor::new()).build_http();
//! let mut svc = PacelineLayer::new(paceline_client::Client::new()).layer(hyper);
//! let req = http::Request::get("http://127.0.0.1:8080/v1/rates").body(Full::new(Bytes::new()))?;
//! let resp = ServiceExt::<http::Request<Full<Bytes>>>::ready(&mut svc).await?.call(req).await?;
//! println!("{}", resp.status());
//! # Ok(()) }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body_util::{BodyExt, Full, Limited};
use tower_layer::Layer;
use tower_service::Service;

use super::{check_no_inner_resend, sleep, Guard, RequestHead, Scoping, IDEMPOTENCY_KEY};
use crate::{After, Before, Client, ClientError, RequestInfo};

/// A boxed error: a [`ClientError`] or the inner service's error.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Adds pacing and polite retries to an HTTP client service.
#[derive(Clone, Debug)]
pub struct PacelineLayer {
    client: Client,
    scoping: Scoping,
}

impl PacelineLayer {
    /// A layer over `client` (clones share its state).
    pub fn new(client: Client) -> Self {
        PacelineLayer {
            client,
            scoping: Scoping::default(),
        }
    }

    /// Reads the credential that names a request's scope from `header`
    /// instead of `Authorization` (see [`Scoping`]).
    pub fn key_header(mut self, header: http::HeaderName) -> Self {
        self.scoping = self.scoping.key_header(header);
        self
    }

    /// Names every request's scope with `f` (see [`Scoping`]); a
    /// [`PacingScope`](super::PacingScope) extension on a request still wins.
    pub fn scope_fn(
        mut self,
        f: impl Fn(&RequestHead<'_>) -> String + Send + Sync + 'static,
    ) -> Self {
        self.scoping = self.scoping.scope_fn(f);
        self
    }
}

impl<S> Layer<S> for PacelineLayer {
    type Service = Paceline<S>;
    fn layer(&self, inner: S) -> Paceline<S> {
        Paceline {
            inner,
            client: self.client.clone(),
            scoping: self.scoping.clone(),
        }
    }
}

/// The service [`PacelineLayer`] builds.
#[derive(Clone, Debug)]
pub struct Paceline<S> {
    inner: S,
    client: Client,
    scoping: Scoping,
}

impl<S> Paceline<S> {
    /// The SDK client, for diagnostics.
    pub fn client(&self) -> &Client {
        &self.client
    }
}

impl<S, B, RB> Service<Request<B>> for Paceline<S>
where
    S: Service<Request<Full<Bytes>>, Response = Response<RB>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    RB: Send + 'static,
{
    type Response = Response<RB>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<RB>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // readiness of the inner service is awaited per attempt
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let inner = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, inner);
        let client = self.client.clone();
        let scoping = self.scoping.clone();
        Box::pin(run(client, scoping, inner, req))
    }
}

async fn run<S, B, RB>(
    client: Client,
    scoping: Scoping,
    mut inner: S,
    req: Request<B>,
) -> Result<Response<RB>, BoxError>
where
    S: Service<Request<Full<Bytes>>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    B: http_body::Body,
    B::Error: Into<BoxError>,
{
    let cap = client.config().replay_buffer_cap;
    let (parts, body) = req.into_parts();
    let body = match Limited::new(body, cap).collect().await {
        Ok(c) => c.to_bytes(),
        Err(_) => return Err(Box::new(ClientError::BodyNotReplayable { cap })),
    };
    let mut info = RequestInfo::new(parts.method.clone(), &parts.uri.to_string());
    if let Some(h) = parts
        .headers
        .get(http::header::HOST)
        .and_then(|v| v.to_str().ok())
    {
        if info.scope.is_empty() {
            info.scope = h.to_string();
        }
    }
    if let Some(cost) = parts.extensions.get::<crate::Cost>() {
        info.cost = cost.clone();
    }
    info.scope = scoping.scope_of(
        &client,
        &parts.method,
        &info.scope,
        &info.path,
        &parts.headers,
        &parts.extensions,
    );
    if let Some(k) = parts
        .headers
        .get(IDEMPOTENCY_KEY)
        .and_then(|v| v.to_str().ok())
    {
        info = info.with_idempotency_key(k);
    }
    let final_response = client.config().final_response;
    let mut g = Guard {
        call: client.call(info),
        client,
    };
    loop {
        match g.client.before(&mut g.call) {
            Before::Go => {}
            Before::Wait(d) => {
                sleep(d).await;
                continue;
            }
            Before::Drop(e) => return Err(Box::new(e)),
        }
        let mut attempt = Request::from_parts(parts.clone(), Full::new(body.clone()));
        if let Some(k) = g.call.idempotency_key() {
            if let Ok(v) = HeaderValue::from_str(k) {
                attempt.headers_mut().insert(IDEMPOTENCY_KEY, v);
            }
        }
        let sent = g.call.attempt().expect("an attempt is on the wire");
        attempt.extensions_mut().insert(sent.clone());
        let ready: Result<(), BoxError> = std::future::poll_fn(|cx| inner.poll_ready(cx))
            .await
            .map_err(Into::into);
        if let Err(e) = ready {
            g.client.cancel(&mut g.call);
            return Err(e);
        }
        let result: Result<Response<RB>, BoxError> = inner.call(attempt).await.map_err(Into::into);
        match result {
            Ok(mut resp) => {
                check_no_inner_resend(&g.call, resp.headers());
                let status = resp.status().as_u16();
                match g
                    .client
                    .after_response(&mut g.call, status, resp.headers(), None)
                {
                    After::Done => {
                        resp.extensions_mut().insert(sent);
                        return Ok(resp);
                    }
                    After::RetryAfter(d) => sleep(d).await,
                    After::Error(e) if final_response => {
                        resp.extensions_mut().insert(sent);
                        resp.extensions_mut().insert(e);
                        return Ok(resp);
                    }
                    After::Error(e) => return Err(Box::new(e)),
                }
            }
            Err(e) => match g.client.after_error(&mut g.call, true, &e.to_string()) {
                After::RetryAfter(d) => sleep(d).await,
                After::Error(ClientError::Transport { .. }) | After::Done => return Err(e),
                After::Error(sdk) => return Err(Box::new(sdk)),
            },
        }
    }
}
