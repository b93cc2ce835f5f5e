//! TLS toward clients: the acceptor of `[gateway.tls]`, its reload, and
//! the bounds that keep unfinished handshakes from starving anyone.
//!
//! A handshake is work the gateway does for a client it knows nothing
//! about yet, so it is bounded the way an unfinished request head is:
//! - in time: from the accept, [`TlsSettings::handshake`] at most (the
//!   TCP connection is closed at the deadline);
//! - in number: at most [`TlsSettings::max_handshakes`] at once; a new
//!   connection past that closes the oldest unfinished one. A polite
//!   client finishes in a round trip or two, so what a flood of
//!   half-open handshakes displaces is itself;
//! - in memory: each handshake in progress holds [`HANDSHAKE_BYTES`] of
//!   the gateway's memory gauge (`gateway.limits.max_buffered_bytes`,
//!   shared with request heads and bodies), what rustls may buffer for
//!   it; with the gauge at its bound a new connection is closed at once.
//!
//! The configuration offers TLS 1.3 and 1.2, ALPN `h2` and `http/1.1`,
//! session resumption by tickets (rotated by rustls's ticketer) and by an
//! in-memory cache, and with `client_ca_file`, requires a client
//! certificate that chains to one of its CAs. A reload swaps in a new
//! configuration for new connections; the ones already open keep theirs.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use paceline_server::ClientCert;
use parking_lot::Mutex;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::config::TlsSettings;
use crate::intake::Buffered;
use crate::metrics as m;

/// The memory a handshake in progress is counted for: a full TLS record
/// as it arrives (16 KiB and its overhead), the handshake messages
/// rustls joins, and what it has to send.
pub(crate) const HANDSHAKE_BYTES: usize = 32 * 1024;

/// The verifier of client certificates chaining to the CAs in `ca_file`.
pub(crate) fn client_verifier(
    ca_file: &Path,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, String> {
    let roots = super::read_roots(ca_file)?;
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), super::provider())
        .build()
        .map_err(|e| format!("{}: cannot verify clients with it: {e}", ca_file.display()))
}

/// The server configuration of `s`, every file read and checked.
pub(crate) fn server_config(s: &TlsSettings) -> Result<Arc<ServerConfig>, String> {
    let key = Arc::new(super::certified_key(&s.cert_file, &s.key_file)?);
    let builder = ServerConfig::builder_with_provider(super::provider())
        .with_protocol_versions(super::VERSIONS)
        .map_err(|e| format!("TLS versions: {e}"))?;
    let builder = match &s.client_ca_file {
        Some(ca) => builder.with_client_cert_verifier(client_verifier(ca)?),
        None => builder.with_no_client_auth(),
    };
    let mut cfg = builder.with_cert_resolver(Arc::new(OneCert(key)));
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    cfg.ticketer =
        rustls::crypto::ring::Ticketer::new().map_err(|e| format!("session tickets: {e}"))?;
    Ok(Arc::new(cfg))
}

/// The one certificate the gateway serves, whatever name is asked for.
#[derive(Debug)]
struct OneCert(Arc<CertifiedKey>);

impl ResolvesServerCert for OneCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

/// What a new connection is handshaken with: swapped whole at a reload.
struct Current {
    acceptor: TlsAcceptor,
    deadline: Duration,
    max: usize,
}

/// The handshakes in progress, oldest first, each with the sender whose
/// drop closes it.
#[derive(Default)]
struct Pending {
    next: u64,
    open: BTreeMap<u64, oneshot::Sender<()>>,
}

/// The client-facing TLS of a gateway.
pub(crate) struct TlsFront {
    current: Mutex<Arc<Current>>,
    pending: Mutex<Pending>,
    gauge: Arc<Buffered>,
}

/// A connection whose handshake finished.
pub(crate) struct Accepted {
    /// The TLS stream.
    pub(crate) stream: TlsStream<TcpStream>,
    /// Its verified client certificate, with mutual TLS.
    pub(crate) client: Option<ClientCert>,
}

/// Why a handshake did not finish.
#[derive(Debug)]
pub(crate) enum Refused {
    /// The memory gauge had no room for another handshake.
    Memory,
    /// A newer connection took its place among the unfinished ones.
    Displaced,
    /// The deadline passed.
    Deadline,
    /// The client broke it off, or sent what is not TLS, or a
    /// certificate that does not verify.
    Failed(io::Error),
}

impl TlsFront {
    /// The front of `s`, counting handshakes in `gauge`.
    pub(crate) fn new(s: &TlsSettings, gauge: Arc<Buffered>) -> Result<TlsFront, String> {
        Ok(TlsFront {
            current: Mutex::new(Arc::new(current(s)?)),
            pending: Mutex::default(),
            gauge,
        })
    }

    /// Reads the files of `s` again; new connections get them. When one
    /// is broken, the configuration in force stays and the error says
    /// why.
    pub(crate) fn reload(&self, s: &TlsSettings) -> Result<(), String> {
        let new = current(s)?;
        *self.current.lock() = Arc::new(new);
        Ok(())
    }

    /// The handshakes in progress now.
    pub(crate) fn in_progress(&self) -> usize {
        self.pending.lock().open.len()
    }

    /// Runs the handshake of `tcp` within the bounds (see the module
    /// documentation).
    pub(crate) async fn accept(&self, tcp: TcpStream) -> Result<Accepted, Refused> {
        if !self.gauge.try_reserve(HANDSHAKE_BYTES) {
            m::tls_handshake("memory");
            return Err(Refused::Memory);
        }
        let cur = self.current.lock().clone();
        let (id, displaced) = self.enter(cur.max);
        let slot = Slot {
            front: self,
            id,
        };
        let r = tokio::select! {
            r = tokio::time::timeout(cur.deadline, cur.acceptor.accept(tcp)) => match r {
                Ok(Ok(stream)) => Ok(stream),
                Ok(Err(e)) => Err(Refused::Failed(e)),
                Err(_) => Err(Refused::Deadline),
            },
            _ = displaced => Err(Refused::Displaced),
        };
        drop(slot);
        let outcome = match &r {
            Ok(_) => "ok",
            Err(Refused::Memory) => "memory",
            Err(Refused::Displaced) => "displaced",
            Err(Refused::Deadline) => "deadline",
            Err(Refused::Failed(_)) => "failed",
        };
        m::tls_handshake(outcome);
        let stream = r?;
        let client = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .and_then(|c| super::subject(c))
            .map(|subject| ClientCert {
                subject: subject.into(),
            });
        Ok(Accepted { stream, client })
    }

    /// Takes a place among the handshakes in progress, closing the oldest
    /// when they are `max` already; the receiver completes if this one is
    /// displaced in turn.
    fn enter(&self, max: usize) -> (u64, oneshot::Receiver<()>) {
        let (tx, rx) = oneshot::channel();
        let mut p = self.pending.lock();
        while p.open.len() >= max {
            // dropping its sender wakes the oldest with its end
            p.open.pop_first();
        }
        let id = p.next;
        p.next += 1;
        p.open.insert(id, tx);
        (id, rx)
    }
}

/// A handshake's place and memory, given back however it ends.
struct Slot<'a> {
    front: &'a TlsFront,
    id: u64,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.front.pending.lock().open.remove(&self.id);
        self.front.gauge.give_back(HANDSHAKE_BYTES);
    }
}

fn current(s: &TlsSettings) -> Result<Current, String> {
    Ok(Current {
        acceptor: TlsAcceptor::from(server_config(s)?),
        deadline: s.handshake,
        max: s.max_handshakes.max(1) as usize,
    })
}
