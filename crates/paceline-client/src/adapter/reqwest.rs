//! A [`reqwest_middleware`] middleware.
//!
//! Every attempt is paced (the middleware sits below the retry loop it
//! runs), a 429 or 503 is retried as the contract says, and a POST carries
//! the same `Idempotency-Key` on every attempt. Errors the SDK raises come
//! back as `reqwest_middleware::Error::Middleware` wrapping a
//! [`ClientError`] you can downcast to; with [`Config::final_response`]
//! a call whose retries are spent hands back the server's last 429 or 503
//! instead, as `reqwest-retry` does.
//!
//! Versions: built against reqwest 0.13 and reqwest-middleware 0.5, both
//! re-exported ([`crate::reqwest`], [`crate::reqwest_middleware`]).
//! `RequestBuilder::json` needs reqwest-middleware's `json` feature (and
//! `query`, `form`, `multipart` theirs) in your own `Cargo.toml`.
//!
//! # Where it goes in the chain
//!
//! Middlewares run in the order they are added, each around the ones added
//! after it. So:
//!
//! - **Add it after** middlewares that should see one call (logging,
//!   metrics of calls, auth that refreshes a token and sends again).
//! - **Add before it** middlewares that should see every attempt (a
//!   per-attempt log, a check of the `Idempotency-Key`): the extensions
//!   they get hold the [`Attempt`] being sent.
//! - **Keep one retrying layer.** `reqwest-retry` beside this middleware
//!   multiplies the retries (three of its attempts, each of them three of
//!   ours). Inside (added after) it retries where this middleware cannot
//!   see or pace it; outside (added before), sending again a request
//!   whose 429 or 503 this middleware handed back fails with
//!   [`ClientError::NestedRetry`] instead of retrying it all again; inside,
//!   a first attempt whose answer is marked as a replay of the key the SDK
//!   made for it (`Idempotent-Replayed: true`, as paceline's gateway and
//!   Stripe send) trips a debug assertion (a warning in release builds).
//!
//! # A request's cost
//!
//! A request that spends more than one request's worth of a unit the
//! server counts (tokens, points) says so with a [`Cost`](crate::Cost) in
//! its extensions; every attempt is paced until each mirrored policy has
//! room for it (see [`crate::cost`]):
//!
//! ```no_run
//! # use paceline_client::{reqwest_middleware, Cost};
//! # async fn run(http: reqwest_middleware::ClientWithMiddleware) -> Result<(), reqwest_middleware::Error> {
//! let resp = http
//!     .post("https://llm.example/v1/chat/completions")
//!     .with_extension(Cost::new().with("tokens", 1_200))
//!     .send()
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! # What the response tells
//!
//! The response carries the [`Attempt`] that drew it
//! (`resp.extensions().get::<Attempt>()`: its number and its
//! `Idempotency-Key`), the [`Event::Attempt`](crate::Event::Attempt) and
//! [`Event::Retry`](crate::Event::Retry) events name every attempt's key,
//! and the diagnostics the last one of each scope.
//!
//! ```no_run
//! use paceline_client::adapter::reqwest::PacelineMiddleware;
//! use paceline_client::{reqwest, reqwest_middleware, Attempt, Client};
//!
//! async fn run() -> Result<(), reqwest_middleware::Error> {
//!     let sdk = Client::new(); // clone it into every worker: one shared state
//!     let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!         .with(PacelineMiddleware::new(sdk.clone()))
//!         .build();
//!     let resp = http.get("http://127.0.0.1:8080/v1/rates").send().await?;
//!     let attempt = resp.extensions().get::<Attempt>().cloned();
//!     println!("{} after {:?}", resp.status(), attempt.map(|a| a.number));
//!     Ok(())
//! }
//! ```

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use http::{Extensions, HeaderValue};
use http_body_util::BodyExt;
use parking_lot::Mutex;
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next, Result};
use tokio::sync::OnceCell;

use super::{check_no_inner_resend, sleep, Guard, RequestHead, Scoping, IDEMPOTENCY_KEY};
#[cfg(doc)]
use crate::Config;
use crate::{After, Attempt, Before, Client, ClientError, Mode, RequestInfo};

/// The most body bytes read from a 429 or 503 to classify it.
const PROBLEM_BODY_CAP: usize = 64 * 1024;

/// Paces and retries every request through a shared [`Client`].
#[derive(Clone, Debug)]
pub struct PacelineMiddleware {
    client: Client,
    scoping: Scoping,
    usage_path: Option<String>,
    usage_seeded: Arc<Mutex<HashMap<String, Arc<OnceCell<()>>>>>,
}

impl PacelineMiddleware {
    /// A middleware over `client` (clones share its state).
    pub fn new(client: Client) -> Self {
        PacelineMiddleware {
            client,
            scoping: Scoping::default(),
            usage_path: None,
            usage_seeded: Arc::default(),
        }
    }

    /// Seeds each new scope from the API's usage endpoint at `path` (for
    /// example `/v1/usage`) before its first request, sent with the same
    /// `Authorization` header (and key header, when one is set), so every worker can start at once instead
    /// of waiting for a first response. A failure is ignored: the scope
    /// then learns from its first response.
    pub fn usage_path(mut self, path: impl Into<String>) -> Self {
        self.usage_path = Some(path.into());
        self
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

    /// The scope a request is paced in, with the extensions it is sent with
    /// (for seeding a scope by hand, or to find it in the diagnostics).
    pub fn scope_of(&self, req: &Request, extensions: &Extensions) -> String {
        let info = RequestInfo::new(req.method().clone(), req.url().as_str());
        self.scoping.scope_of(
            &self.client,
            req.method(),
            &info.scope,
            &info.path,
            req.headers(),
            extensions,
        )
    }

    async fn seed_from_usage(
        &self,
        req: &Request,
        scope: &str,
        extensions: &mut Extensions,
        next: &Next<'_>,
    ) {
        let Some(path) = &self.usage_path else { return };
        if self.client.mode(scope).is_some_and(|m| m != Mode::Unseeded) {
            return;
        }
        // concurrent first requests of the scope wait for the one fetch
        let cell = self
            .usage_seeded
            .lock()
            .entry(scope.to_string())
            .or_default()
            .clone();
        cell.get_or_init(|| self.fetch_usage(req, path, scope, extensions, next))
            .await;
    }

    async fn fetch_usage(
        &self,
        req: &Request,
        path: &str,
        scope: &str,
        extensions: &mut Extensions,
        next: &Next<'_>,
    ) {
        let mut url = req.url().clone();
        url.set_path(path);
        url.set_query(None);
        let mut usage = Request::new(http::Method::GET, url);
        for name in [
            &http::header::AUTHORIZATION,
            self.scoping.credential_header(),
        ] {
            if let Some(v) = req.headers().get(name) {
                usage.headers_mut().insert(name.clone(), v.clone());
            }
        }
        let Ok(resp) = next.clone().run(usage, extensions).await else {
            return;
        };
        if !resp.status().is_success() {
            return;
        }
        if let Ok(body) = resp.bytes().await {
            if self.client.seed_usage(scope, &body).is_err() {
                tracing::debug!(scope, "usage endpoint answered an unreadable body");
            }
        }
    }
    /// The SDK client, for diagnostics.
    pub fn client(&self) -> &Client {
        &self.client
    }
}

fn sdk_error(e: ClientError) -> reqwest_middleware::Error {
    reqwest_middleware::Error::middleware(e)
}

/// Makes the request clonable: a streaming body is read into memory up to
/// the cap, or the call fails with a clear error.
async fn replayable(mut req: Request, cap: usize) -> Result<Request> {
    if req.try_clone().is_some() {
        return Ok(req);
    }
    let Some(body) = req.body_mut().take() else {
        return Ok(req);
    };
    let limited = http_body_util::Limited::new(body, cap);
    let bytes = match limited.collect().await {
        Ok(c) => c.to_bytes(),
        Err(_) => return Err(sdk_error(ClientError::BodyNotReplayable { cap })),
    };
    *req.body_mut() = Some(reqwest::Body::from(bytes));
    Ok(req)
}

fn transient(e: &reqwest_middleware::Error) -> bool {
    match e {
        reqwest_middleware::Error::Reqwest(e) => e.is_connect() || e.is_timeout() || e.is_request(),
        reqwest_middleware::Error::Middleware(_) => false,
    }
}

/// Left in the extensions when the middleware hands back a 429 or 503, so
/// that a retrying layer around it that sends the request again is caught.
#[derive(Clone, Copy, Debug)]
struct Answered(u16);

/// The response the application gets: the attempt that drew it in its
/// extensions (and in the caller's), and the SDK's error when
/// `final_response` hands back a rejection instead of the error.
fn hand_back(
    mut resp: Response,
    attempt: Attempt,
    error: Option<ClientError>,
    extensions: &mut Extensions,
) -> Response {
    let status = resp.status().as_u16();
    if matches!(status, 429 | 503) {
        extensions.insert(Answered(status));
    }
    resp.extensions_mut().insert(attempt);
    if let Some(e) = error {
        resp.extensions_mut().insert(e);
    }
    resp
}

#[async_trait::async_trait]
impl Middleware for PacelineMiddleware {
    async fn handle(
        &self,
        req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> Result<Response> {
        if let Some(Answered(status)) = extensions.get::<Answered>() {
            return Err(sdk_error(ClientError::NestedRetry { status: *status }));
        }
        let req = replayable(req, self.client.config().replay_buffer_cap).await?;
        let scope = self.scope_of(&req, extensions);
        let mut info = RequestInfo::new(req.method().clone(), req.url().as_str()).with_scope(scope);
        if let Some(k) = req
            .headers()
            .get(IDEMPOTENCY_KEY)
            .and_then(|v| v.to_str().ok())
        {
            info = info.with_idempotency_key(k);
        }
        if let Some(cost) = extensions.get::<crate::Cost>() {
            info = info.with_cost(cost.clone());
        }
        let scope = info.scope.clone();
        self.seed_from_usage(&req, &scope, extensions, &next).await;
        let final_response = self.client.config().final_response;
        let mut g = Guard {
            client: self.client.clone(),
            call: self.client.call(info),
        };
        loop {
            match g.client.before(&mut g.call) {
                Before::Go => {}
                Before::Wait(d) => {
                    sleep(d).await;
                    continue;
                }
                Before::Drop(e) => return Err(sdk_error(e)),
            }
            let mut attempt = req.try_clone().expect("the body was made replayable");
            if let Some(k) = g.call.idempotency_key() {
                if let Ok(v) = HeaderValue::from_str(k) {
                    attempt.headers_mut().insert(IDEMPOTENCY_KEY, v);
                }
            }
            let sent = g.call.attempt().expect("an attempt is on the wire");
            extensions.insert(sent.clone());
            let (after, resp) = match next.clone().run(attempt, extensions).await {
                Ok(resp) if !matches!(resp.status().as_u16(), 429 | 503) => {
                    check_no_inner_resend(&g.call, resp.headers());
                    let status = resp.status().as_u16();
                    let a = g
                        .client
                        .after_response(&mut g.call, status, resp.headers(), None);
                    (a, Some(resp))
                }
                Ok(resp) => classify_rejection(&mut g, resp).await,
                Err(e) => {
                    let a = g
                        .client
                        .after_error(&mut g.call, transient(&e), &e.to_string());
                    if let After::Error(ClientError::Transport { .. }) = a {
                        return Err(e);
                    }
                    (a, None)
                }
            };
            match (after, resp) {
                (After::Done, Some(resp)) => return Ok(hand_back(resp, sent, None, extensions)),
                (After::Done, None) => unreachable!("an error never ends a call as done"),
                (After::RetryAfter(d), _) => sleep(d).await,
                (After::Error(e), Some(resp)) if final_response => {
                    return Ok(hand_back(resp, sent, Some(e), extensions))
                }
                (After::Error(e), _) => return Err(sdk_error(e)),
            }
        }
    }
}

/// Reads a 429/503 body (bounded) so the problem document can tell a
/// burst from a quota, then rebuilds the response for the caller.
async fn classify_rejection(g: &mut Guard, resp: Response) -> (After, Option<Response>) {
    let status = resp.status();
    let headers = resp.headers().clone();
    let version = resp.version();
    let body: Bytes =
        match http_body_util::Limited::new(reqwest::Body::from(resp), PROBLEM_BODY_CAP)
            .collect()
            .await
        {
            Ok(c) => c.to_bytes(),
            Err(_) => Bytes::new(),
        };
    let a = g
        .client
        .after_response(&mut g.call, status.as_u16(), &headers, Some(&body));
    let mut rebuilt = http::Response::new(body);
    *rebuilt.status_mut() = status;
    *rebuilt.headers_mut() = headers;
    *rebuilt.version_mut() = version;
    (a, Some(Response::from(rebuilt)))
}
