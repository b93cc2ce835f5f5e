//! Opening connections to the upstream: TCP, and for an `https://`
//! upstream TLS on it, both within the connect deadline.
//!
//! A connection is an [`Io`]: the socket itself, or the socket under
//! rustls. An enum rather than a generic or a trait object, so the own
//! client, its pool and its codec are the same code over both, and the
//! cleartext path pays a match per read or write and nothing else (no
//! allocation, no dynamic dispatch). The TLS stream is boxed: it is large,
//! and idle connections sit by the hundred in the pool's stack.
//!
//! ALPN says which HTTP versions a connection may carry, chosen by the
//! client that dials ([`Alpn`]): the own HTTP/1.1 client offers
//! `http/1.1` only, the HTTP/2 client `h2`, and `upstream_protocol =
//! "auto"` both, taking whatever the upstream picks. A handshake that
//! fails is a connect failure ([`UpstreamError::Connect`]): the request
//! never left, and the proxy gives its charge back. Its message keeps
//! rustls's reason ("invalid peer certificate: UnknownIssuer").

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use super::codec::Target;
use super::error::UpstreamError;

/// One connection to the upstream, cleartext or TLS.
pub(crate) enum Io {
    /// `http://`.
    Plain(TcpStream),
    /// `https://`.
    Tls(Box<TlsStream<TcpStream>>),
}

impl Io {
    /// Whether the upstream chose HTTP/2 by ALPN.
    pub(crate) fn is_h2(&self) -> bool {
        match self {
            Io::Plain(_) => false,
            Io::Tls(s) => s.get_ref().1.alpn_protocol() == Some(b"h2"),
        }
    }
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(&mut **s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(&mut **s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(&mut **s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(&mut **s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(&mut **s).poll_shutdown(cx),
        }
    }
}

/// The HTTP versions a TLS connection offers by ALPN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Alpn {
    /// `http/1.1` only.
    Http1,
    /// `h2` only.
    H2,
    /// `h2`, then `http/1.1`: the upstream picks.
    Either,
}

impl Alpn {
    fn protocols(self) -> Vec<Vec<u8>> {
        match self {
            Alpn::Http1 => vec![b"http/1.1".to_vec()],
            Alpn::H2 => vec![b"h2".to_vec()],
            Alpn::Either => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        }
    }
}

/// Opens connections to one upstream.
pub(crate) struct Dialer {
    host: String,
    port: u16,
    timeout: Duration,
    tls: Option<Tls>,
}

/// What TLS on a new connection needs.
struct Tls {
    connector: TlsConnector,
    /// The name checked (and for a DNS name, sent as SNI).
    name: ServerName<'static>,
}

impl Dialer {
    /// Cleartext connections to `target`, each opened within `timeout`.
    pub(crate) fn plain(target: &Target, timeout: Duration) -> Dialer {
        Dialer {
            host: target.host().to_string(),
            port: target.port(),
            timeout,
            tls: None,
        }
    }

    /// TLS connections to `target` on `config` offering `alpn`, each
    /// opened (TCP and handshake) within `timeout`.
    pub(crate) fn tls(
        target: &Target,
        timeout: Duration,
        config: &ClientConfig,
        alpn: Alpn,
    ) -> Result<Dialer, String> {
        let mut config = config.clone();
        config.alpn_protocols = alpn.protocols();
        Ok(Dialer {
            tls: Some(Tls {
                connector: TlsConnector::from(std::sync::Arc::new(config)),
                name: crate::tls::client::server_name(target.host())?,
            }),
            ..Dialer::plain(target, timeout)
        })
    }

    /// A new connection: TCP, then TLS if the upstream is `https://`, all
    /// within the connect deadline. Any failure is
    /// [`UpstreamError::Connect`].
    pub(crate) async fn dial(&self) -> Result<Io, UpstreamError> {
        let open = async {
            let tcp = TcpStream::connect((self.host.as_str(), self.port)).await?;
            let _ = tcp.set_nodelay(true);
            let Some(tls) = &self.tls else {
                return Ok(Io::Plain(tcp));
            };
            match tls.connector.connect(tls.name.clone(), tcp).await {
                Ok(s) => Ok(Io::Tls(Box::new(s))),
                Err(e) => Err(io::Error::new(
                    e.kind(),
                    format!("TLS handshake with {}:{}: {e}", self.host, self.port),
                )),
            }
        };
        match tokio::time::timeout(self.timeout, open).await {
            Ok(Ok(io)) => Ok(io),
            Ok(Err(e)) => Err(UpstreamError::Connect(e)),
            Err(_) => Err(UpstreamError::Connect(io::Error::new(
                io::ErrorKind::TimedOut,
                match self.tls {
                    None => "connect timed out",
                    Some(_) => "connect and TLS handshake timed out",
                },
            ))),
        }
    }
}
