//! What can go wrong with an upstream exchange, in the kinds the proxy
//! tells apart (a `502` for an upstream that cannot be reached or breaks
//! the protocol, a `400`/`408` for the client's own body), shared by the
//! codec, the connection and both client implementations.

use std::fmt;
use std::io;

/// Errors inside a streamed body.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why an exchange with the upstream failed.
#[derive(Debug)]
pub(crate) enum UpstreamError {
    /// No connection could be opened.
    Connect(io::Error),
    /// The connection ended before any byte of an answer arrived.
    Closed,
    /// Reading or writing failed.
    Io(io::Error),
    /// The answer broke the protocol.
    Protocol(&'static str),
    /// The client's request body failed or stalled.
    RequestBody(BoxError),
}

impl fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UpstreamError::Connect(e) => write!(f, "connect: {e}"),
            UpstreamError::Closed => f.write_str("connection closed before an answer"),
            UpstreamError::Io(e) => write!(f, "i/o: {e}"),
            UpstreamError::Protocol(what) => write!(f, "malformed answer: {what}"),
            UpstreamError::RequestBody(e) => write!(f, "request body: {e}"),
        }
    }
}

impl std::error::Error for UpstreamError {}

/// An error inside a response body.
#[derive(Debug)]
pub(crate) struct BodyError(pub(crate) &'static str);

impl fmt::Display for BodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "upstream body: {}", self.0)
    }
}

impl std::error::Error for BodyError {}
