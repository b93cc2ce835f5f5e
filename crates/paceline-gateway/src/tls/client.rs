//! TLS toward the upstream (`[gateway.upstream_tls]`): the client
//! configuration an `https://` upstream is reached with.
//!
//! Verification is on unless the one loudly named switch turns it off:
//! the upstream's chain must lead to one of the system's roots (read once
//! per process by `rustls-native-certs`: the platform's store, or the
//! files `SSL_CERT_FILE`/`SSL_CERT_DIR` name) or to a CA of `ca_file`, and
//! name the upstream's host. A DNS host is also sent as SNI; an IP
//! address is not (TLS has no SNI for addresses) and is checked against
//! the certificate's IP address names instead. A client certificate
//! (`cert_file`/`key_file`) is presented to an upstream that asks for one.
//!
//! `insecure_skip_verify_for_tests_only` accepts any certificate (the
//! handshake's signatures are still checked, so the connection is at
//! least bound to the key the upstream showed): for tests against
//! throwaway certificates, never for a real upstream; the config warns
//! about it at every start.
//!
//! ALPN is left to the caller, which knows which HTTP versions it can
//! speak on the connection (see `upstream/dial.rs`). Sessions are resumed
//! from rustls's in-memory cache, so a pool that opens connections again
//! mostly pays for abbreviated handshakes.

use std::sync::{Arc, OnceLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::ResolvesClientCert;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::config::UpstreamTlsSettings;

/// The client configuration of `s`, without ALPN: every file read and
/// checked, the system's roots added to `ca_file`'s. An error says which
/// file is wrong, or that no root at all could be found.
pub(crate) fn client_config(s: &UpstreamTlsSettings) -> Result<ClientConfig, String> {
    let builder = ClientConfig::builder_with_provider(super::provider())
        .with_protocol_versions(super::VERSIONS)
        .map_err(|e| format!("TLS versions: {e}"))?;
    let builder = match s.insecure_skip_verify_for_tests_only {
        true => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(SkipVerify(super::provider()))),
        false => builder.with_root_certificates(roots(s)?),
    };
    let cfg = match (&s.cert_file, &s.key_file) {
        (Some(cert), Some(key)) => {
            let ck = super::certified_key(cert, key)?;
            builder.with_client_cert_resolver(Arc::new(OneClientCert(Arc::new(ck))))
        }
        _ => builder.with_no_client_auth(),
    };
    Ok(cfg)
}

/// The name the upstream's certificate is checked against, from its host
/// (an IPv6 address without brackets): a DNS name, also sent as SNI, or
/// an IP address, which is not.
pub(crate) fn server_name(host: &str) -> Result<ServerName<'static>, String> {
    ServerName::try_from(host.to_string())
        .map_err(|e| format!("{host:?} is neither a DNS name nor an IP address: {e}"))
}

/// The roots an upstream's chain may lead to: the system's and
/// `ca_file`'s.
fn roots(s: &UpstreamTlsSettings) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    roots.extend(system_roots().roots.iter().cloned());
    if let Some(ca) = &s.ca_file {
        roots.extend(super::read_roots(ca)?.roots);
    }
    if roots.is_empty() {
        return Err(
            "no trusted root certificates for the https:// upstream: the system has none \
             (SSL_CERT_FILE / SSL_CERT_DIR can name them) and [gateway.upstream_tls] has no ca_file"
                .to_string(),
        );
    }
    Ok(roots)
}

/// The system's roots, read once per process; what could not be read is
/// logged, not fatal (the `ca_file` may be all an upstream needs).
fn system_roots() -> &'static RootCertStore {
    static ROOTS: OnceLock<RootCertStore> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        for e in &found.errors {
            tracing::warn!(error = %e, "reading the system's root certificates");
        }
        let mut roots = RootCertStore::empty();
        let (_, unusable) = roots.add_parsable_certificates(found.certs);
        if unusable > 0 {
            tracing::debug!(unusable, "system root certificates skipped");
        }
        roots
    })
}

/// The client certificate presented to an upstream that asks for one.
#[derive(Debug)]
struct OneClientCert(Arc<CertifiedKey>);

impl ResolvesClientCert for OneClientCert {
    fn resolve(&self, _: &[&[u8]], _: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// Accepts any certificate, checking only that the handshake was signed
/// by its key (`insecure_skip_verify_for_tests_only`).
#[derive(Debug)]
struct SkipVerify(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for SkipVerify {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
