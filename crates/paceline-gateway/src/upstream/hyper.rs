//! A second [`Upstream`] over hyper's pooled client
//! (`hyper_util::client::legacy`), sending the fields of the head the
//! codec writes, for tests to hold the own client against: where the
//! two disagree on an answer, one of them changed or the difference is
//! meant (the own client refuses some framing hyper takes).

use std::error::Error as _;
use std::io;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Uri};
use http_body::Body;
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use paceline_core::{Clock, SystemClock};

use super::codec::{hyper_head, BodyFraming, Target, Version};
use super::error::{BoxError, UpstreamError};
use super::idle::{BodyIdle, IdleTimeout};
use super::{Answer, Outgoing, Upstream};
use crate::config::Timeouts;

/// hyper's HTTP/1.1 client to one upstream.
pub(crate) struct HyperClient<B> {
    client: hyper_util::client::legacy::Client<HttpConnector, IdleTimeout<B>>,
    target: Target,
    body_idle: Duration,
    clock: SystemClock,
}

impl<B> HyperClient<B>
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    /// A client for `upstream` (`http://host:port[/base]`) with the bounds
    /// of `timeouts`, as the own client has them.
    pub(crate) fn new(upstream: &Uri, timeouts: &Timeouts) -> Self {
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(timeouts.connect));
        http.set_nodelay(true);
        let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .pool_idle_timeout(timeouts.pool_idle)
            .pool_timer(TokioTimer::new())
            .build(http);
        HyperClient {
            client,
            target: Target::new(upstream),
            body_idle: timeouts.body_idle,
            clock: SystemClock::new(),
        }
    }
}

impl<B> Upstream<B> for HyperClient<B>
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    type Body = Incoming;

    async fn send(&self, req: Outgoing<'_>, body: B) -> Result<Answer<Incoming>, UpstreamError> {
        let parts = req.parts;
        // the head as the own client writes it, as fields: hyper writes
        // them as they are, framing included
        let framing = BodyFraming::of(&body);
        let (uri, headers) = hyper_head(&self.target, parts, req.via, framing, Version::Http1)?;
        let mut request = Request::new(IdleTimeout::new(body, self.body_idle));
        *request.method_mut() = parts.method.clone();
        *request.uri_mut() = uri;
        *request.headers_mut() = headers;

        let started = self.clock.now();
        let res = self.client.request(request).await.map_err(classify)?;
        let waited = self.clock.now().saturating_sub(started).as_duration();
        let (head, body) = res.into_parts();
        Ok(Answer {
            status: head.status,
            headers: head.headers,
            body,
            waited,
        })
    }
}

/// The kind of failure a hyper client error is, as the proxy tells them
/// apart.
fn classify(e: hyper_util::client::legacy::Error) -> UpstreamError {
    if e.is_connect() {
        return UpstreamError::Connect(io::Error::other(e));
    }
    let mut cause = e.source();
    while let Some(c) = cause {
        if c.is::<BodyIdle>() {
            return UpstreamError::RequestBody(Box::new(BodyIdle));
        }
        if let Some(h) = c.downcast_ref::<hyper::Error>() {
            if h.is_user() {
                return UpstreamError::RequestBody(e.into());
            }
            if h.is_incomplete_message() {
                return UpstreamError::Closed;
            }
            if h.is_parse() || h.is_parse_too_large() || h.is_parse_status() {
                return UpstreamError::Protocol("unparsable head");
            }
        }
        if let Some(io) = c.downcast_ref::<io::Error>() {
            return UpstreamError::Io(io::Error::new(io.kind(), io.to_string()));
        }
        cause = c.source();
    }
    UpstreamError::Protocol("the exchange failed")
}
