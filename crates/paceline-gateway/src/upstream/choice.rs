//! The client the proxy runs on, as `upstream_protocol` and the
//! upstream's scheme choose it: the own HTTP/1.1 client (cleartext or
//! TLS), hyper's HTTP/2 connection (h2c or `h2` over TLS), or for
//! `"auto"` over TLS both, HTTP/2 while the upstream picks `h2` by ALPN.
//!
//! An enum over the concrete clients rather than a trait object: the
//! proxy's common path (HTTP/1.1) pays a match, no allocation and no
//! dynamic dispatch, and the answer's body is an enum the same way.
//!
//! `"auto"` finds out on the first connection: the HTTP/2 client opens
//! it offering `h2` and `http/1.1`; if the upstream picks `h2`, requests
//! go over HTTP/2 from then on; if it picks `http/1.1` (or nothing), the
//! connection goes to the own client's pool, and every request from then
//! on goes over HTTP/1.1 (until the gateway restarts). In cleartext,
//! `"auto"` is HTTP/1.1: without ALPN there is nothing to find out from.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::uri::Authority;
use http::Uri;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use paceline_core::Clock;

use super::body::UpstreamBody;
use super::client::Client;
use super::codec::Target;
use super::dial::{Alpn, Dialer};
use super::error::{BoxError, UpstreamError};
use super::h2::{H2Client, Routed};
use super::{Answer, Outgoing, Upstream};
use crate::config::{Timeouts, UpstreamProtocol, UpstreamTlsSettings};

/// The client to the upstream, in the HTTP version the settings choose.
pub(crate) enum UpstreamClient<B> {
    /// HTTP/1.1, the own client.
    Http1(Client),
    /// HTTP/2.
    Http2(H2Client<B>),
    /// `"auto"` over TLS: HTTP/2 while the upstream picks `h2`, else
    /// HTTP/1.1.
    Auto {
        /// For an upstream that picked `http/1.1`.
        h1: Client,
        /// Finds out, and speaks HTTP/2 to an upstream that picked `h2`.
        h2: H2Client<B>,
    },
}

impl<B> UpstreamClient<B>
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    /// The client for `upstream` (`http[s]://host[:port][/base]`) speaking
    /// `protocol`, with `tls` for an `https://` one; its phases bounded
    /// by `timeouts`, latencies and pool ages read from `clock`. Fails
    /// when the TLS configuration cannot be built (a file gone unreadable
    /// since the config was read, no trusted root at all).
    pub(crate) fn new(
        upstream: &Uri,
        tls: &UpstreamTlsSettings,
        protocol: UpstreamProtocol,
        timeouts: &Timeouts,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, String> {
        let target = Target::new(upstream);
        let connect = timeouts.connect;
        if !target.is_https() {
            let dialer = Dialer::plain(&target, connect);
            return Ok(match protocol {
                UpstreamProtocol::Http2 => {
                    UpstreamClient::Http2(H2Client::new(target, dialer, false, timeouts, clock))
                }
                // `auto` in cleartext: no ALPN to find HTTP/2 out by
                _ => UpstreamClient::Http1(Client::new(target, dialer, timeouts, clock)),
            });
        }
        let config = crate::tls::client::client_config(tls)?;
        let dialer = |alpn| Dialer::tls(&target, connect, &config, alpn);
        Ok(match protocol {
            UpstreamProtocol::Http2 => {
                let dialer = dialer(Alpn::H2)?;
                UpstreamClient::Http2(H2Client::new(target, dialer, false, timeouts, clock))
            }
            UpstreamProtocol::Auto => {
                let h1 = Client::new(
                    Target::new(upstream),
                    dialer(Alpn::Http1)?,
                    timeouts,
                    clock.clone(),
                );
                let dialer = dialer(Alpn::Either)?;
                let h2 = H2Client::new(target, dialer, true, timeouts, clock);
                UpstreamClient::Auto { h1, h2 }
            }
            _ => {
                let dialer = dialer(Alpn::Http1)?;
                UpstreamClient::Http1(Client::new(target, dialer, timeouts, clock))
            }
        })
    }

    /// The upstream's authority.
    pub(crate) fn authority(&self) -> &Authority {
        match self {
            UpstreamClient::Http1(c) | UpstreamClient::Auto { h1: c, .. } => c.authority(),
            UpstreamClient::Http2(c) => c.authority(),
        }
    }
}

impl<B> Upstream<B> for UpstreamClient<B>
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    type Body = AnswerBody;

    fn send(
        &self,
        req: Outgoing<'_>,
        body: B,
    ) -> impl Future<Output = Result<Answer<AnswerBody>, UpstreamError>> + Send {
        // not an `async fn`: its state would hold the arguments beside the
        // client's future; and the HTTP/2 exchange, several times the own
        // client's state, is boxed, so no HTTP/1.1 exchange grows by it
        match self {
            UpstreamClient::Http1(c) => Sending::Http1 {
                f: c.send(req, body),
            },
            _ => Sending::Other {
                f: Box::pin(self.send_other(req, body)),
            },
        }
    }
}

pin_project_lite::pin_project! {
    /// The future of [`UpstreamClient::send`]: the own client's exchange
    /// in place, the others boxed.
    #[project = SendingProj]
    enum Sending<H, O> {
        Http1 { #[pin] f: H },
        Other { #[pin] f: O },
    }
}

impl<H, O> Future for Sending<H, O>
where
    H: Future<Output = Result<Answer<UpstreamBody>, UpstreamError>>,
    O: Future<Output = Result<Answer<AnswerBody>, UpstreamError>>,
{
    type Output = Result<Answer<AnswerBody>, UpstreamError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            SendingProj::Http1 { f } => f.poll(cx).map(|r| r.map(AnswerBody::h1)),
            SendingProj::Other { f } => f.poll(cx),
        }
    }
}

impl<B> UpstreamClient<B>
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    /// [`Upstream::send`] for HTTP/2 and `"auto"`.
    async fn send_other(
        &self,
        req: Outgoing<'_>,
        body: B,
    ) -> Result<Answer<AnswerBody>, UpstreamError> {
        let (h1, h2) = match self {
            UpstreamClient::Http1(c) => return c.send(req, body).await.map(AnswerBody::h1),
            UpstreamClient::Http2(c) => return c.send(req, body).await.map(AnswerBody::h2),
            UpstreamClient::Auto { h1, h2 } => (h1, h2),
        };
        let body = match h2.chose_http1() {
            true => body,
            false => match h2.send_routed(req, body).await {
                Routed::Done(r) => return r.map(AnswerBody::h2),
                Routed::Http1(io, body) => {
                    if let Some(io) = io {
                        h1.adopt(io);
                    }
                    body
                }
            },
        };
        h1.send(req, body).await.map(AnswerBody::h1)
    }
}

/// An answer's body, from whichever client got it.
pub(crate) enum AnswerBody {
    /// The own client's, read straight from its connection.
    H1(UpstreamBody),
    /// hyper's HTTP/2 stream.
    H2(Incoming),
}

impl AnswerBody {
    fn h1(a: Answer<UpstreamBody>) -> Answer<AnswerBody> {
        a.map(AnswerBody::H1)
    }

    fn h2(a: Answer<Incoming>) -> Answer<AnswerBody> {
        a.map(AnswerBody::H2)
    }
}

impl Body for AnswerBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            AnswerBody::H1(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            AnswerBody::H2(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            AnswerBody::H1(b) => b.is_end_stream(),
            AnswerBody::H2(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            AnswerBody::H1(b) => b.size_hint(),
            AnswerBody::H2(b) => b.size_hint(),
        }
    }
}
