//! A [`reqwest_middleware`] middleware.
//!
//! Every attempt is paced (the middleware sits below the retry loop it
//! runs), a 429 or 503 is retried as the contract says, and a POST carries
//! the same `Idempotency-Key` on every attempt. Errors the SDK raises come
//! back as `reqwest_middleware::Error::Middleware` wrapping a
//! [`ClientError`] you can downcast to.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use paceline_client::adapter::reqwest::PacelineMiddleware;
//! use paceline_client::Client;
//!
//! let sdk = Client::new(); // clone it into every worker: one shared state
//! let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!     .with(PacelineMiddleware::new(sdk.clone()))
//!     .build();
//! let resp = http.get("http://127.0.0.1:8080/v1/rates").send().await?;
//! println!("{}", resp.status());
//! # Ok(()) }
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

use super::{sleep, Guard, RequestHead, Scoping, IDEMPOTENCY_KEY};
use crate::{After, Before, Client, ClientError, Mode, RequestInfo};

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
    /// `Authorization` header, so every worker can start at once instead
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

#[async_trait::async_trait]
impl Middleware for PacelineMiddleware {
    async fn handle(
        &self,
        req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> Result<Response> {
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
        let scope = info.scope.clone();
        self.seed_from_usage(&req, &scope, extensions, &next).await;
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
            let after = match next.clone().run(attempt, extensions).await {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    if !matches!(status, 429 | 503) {
                        let a = g
                            .client
                            .after_response(&mut g.call, status, resp.headers(), None);
                        if a == After::Done {
                            return Ok(resp);
                        }
                        (a, None)
                    } else {
                        let (a, rebuilt) = classify_rejection(&mut g, resp).await;
                        (a, Some(rebuilt))
                    }
                }
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
            match after {
                (After::Done, Some(resp)) => return Ok(resp),
                (After::Done, None) => unreachable!("a passed-through response returned above"),
                (After::RetryAfter(d), _) => sleep(d).await,
                (After::Error(e), _) => return Err(sdk_error(e)),
            }
        }
    }
}

/// Reads a 429/503 body (bounded) so the problem document can tell a
/// burst from a quota, then rebuilds the response for the caller.
async fn classify_rejection(g: &mut Guard, resp: Response) -> (After, Response) {
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
    (a, Response::from(rebuilt))
}
