//! The upstream side of the proxy: HTTP/1.1 over pooled keep-alive
//! connections, driven inside the request's own task, in cleartext or
//! over TLS; or HTTP/2 on one multiplexed connection.
//!
//! A general client runs each connection as a task of its own and hands
//! requests, responses and body chunks over channels; for a proxy that
//! only ever sends one request at a time on a connection, that is most of
//! its cost. Here the request task writes the head, reads the response
//! head, and the response body reads the rest straight from the socket
//! while the client connection polls it. A response whose body came with
//! its head (the common case for API answers) gives its connection back
//! before the head is even returned.
//!
//! Message framing follows RFC 9112: `Content-Length`, `chunked`, or the
//! end of the connection; `1xx` answers are skipped; answers to `HEAD`
//! and `204`/`304` have no body. Anything malformed fails the exchange and
//! the connection is dropped, never reused.
//!
//! An `https://` upstream gets the same client on TLS connections: the
//! dialer opens TCP and then rustls (verification, SNI, ALPN, a client
//! certificate) within the connect deadline, and a connection is an enum
//! of the two, so the cleartext path costs a match and nothing more. A
//! handshake that fails is a connect failure: a `502` whose charge is
//! given back. `upstream_protocol = "http2"` (or `"auto"` when the
//! upstream picks `h2` by ALPN) speaks HTTP/2 through hyper's connection
//! instead, where framing and flow control need a task per connection
//! anyway; the head it sends is the one the codec writes.
//!
//! The pieces: [`codec`] says what the bytes mean and writes the request
//! head, without I/O (and gives hyper that head as fields); `dial` opens
//! connections, `conn` moves bytes over one of them, `pool` keeps the
//! idle ones, `body` streams an answer's body, and `client` puts them
//! together as the own HTTP/1.1 [`Upstream`]; `h2` is the HTTP/2 one, and
//! `choice` the [`UpstreamClient`] the proxy runs on, one of them as the
//! settings say. A second HTTP/1.1 [`Upstream`] over hyper's client, for
//! tests, checks the own one against it (`differential`), and every
//! transport is held against the others (`transports`).

mod body;
mod choice;
mod client;
mod codec;
mod conn;
mod dial;
mod error;
mod h2;
mod idle;
mod pool;

#[cfg(test)]
mod differential;
#[cfg(test)]
mod hyper;
#[cfg(test)]
mod test_certs;
#[cfg(test)]
mod transports;

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use http_body::Body;

pub(crate) use choice::UpstreamClient;
#[cfg(test)]
pub(crate) use client::Client;
pub(crate) use codec::strip_hop_by_hop;
pub(crate) use codec::Via;
#[allow(unused_imports)]
pub(crate) use codec::{Chunk, Framing, Step};
pub(crate) use error::BoxError;
pub(crate) use error::UpstreamError;
pub(crate) use idle::{BodyIdle, IdleTimeout};

/// A request as the proxy hands it to an [`Upstream`]: the client's head,
/// which the upstream client sends on by the codec's rules (hop-by-hop
/// fields left behind, `X-Forwarded-*` added), and the client's address.
#[derive(Clone, Copy)]
pub(crate) struct Outgoing<'a> {
    /// The client's request head.
    pub(crate) parts: &'a http::request::Parts,
    /// The client connection: its address, appended to `X-Forwarded-For`,
    /// and whether it is a trusted proxy.
    pub(crate) via: Via<'a>,
    /// Set once the whole head has been written to an upstream
    /// connection: from then on the upstream may be doing the work, and a
    /// failure keeps the request's charge.
    pub(crate) reached: &'a std::sync::atomic::AtomicBool,
}

/// An upstream's final answer: its head (hop-by-hop fields still in it)
/// and its body, still streaming.
pub(crate) struct Answer<B> {
    /// The status.
    pub(crate) status: StatusCode,
    /// The fields as the upstream sent them (framing fields that cannot
    /// be trusted already gone).
    pub(crate) headers: HeaderMap,
    /// The body.
    pub(crate) body: B,
    /// How long the upstream took to answer once the request was ready.
    pub(crate) waited: Duration,
}

impl<B> Answer<B> {
    /// The same answer with its body turned into another type.
    pub(crate) fn map<C>(self, f: impl FnOnce(B) -> C) -> Answer<C> {
        Answer {
            status: self.status,
            headers: self.headers,
            body: f(self.body),
            waited: self.waited,
        }
    }
}

/// A client to one upstream: sends a request with a body of type
/// `B` and gives back the answer's head and streaming body, or the kind of
/// failure the proxy answers for (a `502` for [`UpstreamError::Connect`]
/// and the upstream's faults, a `400`/`408` for
/// [`UpstreamError::RequestBody`]).
pub(crate) trait Upstream<B> {
    /// The answer's body.
    type Body: Body<Data = Bytes, Error: Into<BoxError>> + Send + 'static;

    /// Sends `req` with `body` and waits for the final answer's head.
    fn send(
        &self,
        req: Outgoing<'_>,
        body: B,
    ) -> impl Future<Output = Result<Answer<Self::Body>, UpstreamError>> + Send;
}
