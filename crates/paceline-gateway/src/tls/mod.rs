//! TLS material, for both sides of the gateway: PEM files read into what
//! rustls takes, checked the way an operator needs (a key that does not
//! belong to its certificate, a file with no certificate in it, a
//! certificate out of its validity dates), and the crypto provider.
//!
//! The provider is rustls's `ring`: it builds with a C compiler alone (no
//! CMake, no Go, unlike `aws-lc-rs`), it is the one the Redis store's TLS
//! already uses, so the workspace carries one provider, and it has every
//! suite the gateway offers (TLS 1.3's three, TLS 1.2's ECDHE suites with
//! AES-GCM and ChaCha20-Poly1305). Configurations take the provider
//! explicitly, so nothing depends on a process-wide default.
//!
//! `server` is the client-facing side (`[gateway.tls]`): the acceptor,
//! its reload and the bounds on handshakes.

pub(crate) mod client;
pub(crate) mod server;

use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use rustls::crypto::CryptoProvider;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// The crypto provider every TLS configuration of the gateway is built on.
pub(crate) fn provider() -> Arc<CryptoProvider> {
    static P: std::sync::OnceLock<Arc<CryptoProvider>> = std::sync::OnceLock::new();
    P.get_or_init(|| Arc::new(rustls::crypto::ring::default_provider()))
        .clone()
}

/// The protocol versions offered: TLS 1.3 and 1.2, nothing older.
pub(crate) static VERSIONS: &[&rustls::SupportedProtocolVersion] =
    &[&rustls::version::TLS13, &rustls::version::TLS12];

/// The certificates of the PEM file at `path`, in order (a full chain:
/// the leaf first). An unreadable file or one without a certificate is an
/// error that says which.
pub(crate) fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let text = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let certs = CertificateDer::pem_slice_iter(&text)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: not PEM certificates: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{}: no certificate in it; expected PEM blocks \"-----BEGIN CERTIFICATE-----\"",
            path.display()
        ));
    }
    Ok(certs)
}

/// The private key of the PEM file at `path` (PKCS#8, PKCS#1 or SEC1).
pub(crate) fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    let text = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    PrivateKeyDer::from_pem_slice(&text).map_err(|e| {
        format!(
            "{}: no private key in it ({e}); expected a PEM \"PRIVATE KEY\" block",
            path.display()
        )
    })
}

/// A certificate chain and its key, checked to belong together: the
/// public key of the chain's first certificate is the key's.
pub(crate) fn certified_key(cert_file: &Path, key_file: &Path) -> Result<CertifiedKey, String> {
    let certs = read_certs(cert_file)?;
    let key = read_key(key_file)?;
    let signing = provider()
        .key_provider
        .load_private_key(key)
        .map_err(|e| format!("{}: unusable private key: {e}", key_file.display()))?;
    let ck = CertifiedKey::new(certs, signing);
    ck.keys_match().map_err(|e| {
        format!(
            "{} does not belong to the certificate of {} ({e})",
            key_file.display(),
            cert_file.display()
        )
    })?;
    Ok(ck)
}

/// A trust store of the certificates in the PEM file at `path`.
pub(crate) fn read_roots(path: &Path) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in read_certs(path)? {
        roots
            .add(c)
            .map_err(|e| format!("{}: not a usable CA certificate: {e}", path.display()))?;
    }
    Ok(roots)
}

/// Warnings about the validity dates of the certificates in `certs` (from
/// `file`) at `now`: one that has expired or is not valid yet, with its
/// date, and one that expires within 30 days.
pub(crate) fn validity_warnings(
    file: &Path,
    certs: &[CertificateDer<'_>],
    now: SystemTime,
) -> Vec<String> {
    let now = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let mut out = Vec::new();
    for (i, der) in certs.iter().enumerate() {
        let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
            out.push(format!(
                "{}: certificate {} could not be read as X.509",
                file.display(),
                i + 1
            ));
            continue;
        };
        let v = cert.validity();
        let (from, until) = (v.not_before.timestamp(), v.not_after.timestamp());
        let which = match i {
            0 => "the certificate".to_string(),
            _ => format!("chain certificate {} ({})", i + 1, cert.subject()),
        };
        if until < now {
            out.push(format!(
                "{}: {which} expired on {}",
                file.display(),
                date(until)
            ));
        } else if from > now {
            out.push(format!(
                "{}: {which} is not valid before {}",
                file.display(),
                date(from)
            ));
        } else if until - now < 30 * 86_400 {
            out.push(format!(
                "{}: {which} expires on {}",
                file.display(),
                date(until)
            ));
        }
    }
    out
}

/// A time as an HTTP date (`Tue, 01 Dec 2026 21:00:00 GMT`).
fn date(unix: i64) -> String {
    let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(unix.max(0) as u64);
    httpdate::fmt_http_date(t)
}

/// The subject of a DER certificate, as RFC 4514 writes a distinguished
/// name (`CN=client-1,O=Example`), or `None` if it is not X.509.
pub(crate) fn subject(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    Some(cert.subject().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A self-signed certificate valid from 2020-01-01 to 2030-01-01.
    fn dated() -> CertificateDer<'static> {
        let mut p = rcgen::CertificateParams::new(vec!["x.test".to_string()]).unwrap();
        p.not_before = rcgen::date_time_ymd(2020, 1, 1);
        p.not_after = rcgen::date_time_ymd(2030, 1, 1);
        let key = rcgen::KeyPair::generate().unwrap();
        p.self_signed(&key).unwrap().der().clone()
    }

    fn at(y_m_d_unix: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(y_m_d_unix)
    }

    #[test]
    fn every_validity_date_is_told_with_its_date_and_a_valid_one_is_not() {
        let c = [dated()];
        let f = Path::new("c.pem");
        // 2025-06-01: well within
        assert!(validity_warnings(f, &c, at(1_748_736_000)).is_empty());
        // 2019-06-01: not yet
        let w = validity_warnings(f, &c, at(1_559_347_200));
        assert_eq!(w.len(), 1);
        assert!(w[0].contains("not valid before Wed, 01 Jan 2020"), "{w:?}");
        // 2029-12-20: within 30 days of the end
        let w = validity_warnings(f, &c, at(1_892_419_200));
        assert!(w[0].contains("expires on Tue, 01 Jan 2030"), "{w:?}");
        // 2031-01-01: over
        let w = validity_warnings(f, &c, at(1_924_992_000));
        assert!(w[0].contains("expired on Tue, 01 Jan 2030"), "{w:?}");
        // not X.509 at all
        let junk = [CertificateDer::from(vec![0x30, 0x03, 0x02, 0x01, 0x00])];
        let w = validity_warnings(f, &junk, at(1_748_736_000));
        assert!(w[0].contains("could not be read as X.509"), "{w:?}");
    }

    #[test]
    fn a_subject_reads_as_rfc_4514_writes_it() {
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "billing");
        p.distinguished_name
            .push(rcgen::DnType::OrganizationName, "Example");
        let key = rcgen::KeyPair::generate().unwrap();
        let der = p.self_signed(&key).unwrap().der().clone();
        let s = subject(&der).unwrap();
        assert!(s.contains("CN=billing") && s.contains("O=Example"), "{s}");
        assert_eq!(subject(&[1, 2, 3]), None);
    }
}
