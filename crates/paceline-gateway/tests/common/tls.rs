//! A TLS client for the tests of the gateway's TLS: a connector trusting
//! a test CA, a handshake within the tests' bound, and HTTP/1.1 over it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use paceline_gateway::{Gateway, GatewayConfig, GatewayHandle};

use super::certs::{Leaf, TestCa};
use super::{counting_upstream, LIMIT};

/// A TLS client trusting `ca`, offering `alpn`, with `cert` as its
/// client certificate if given.
pub(crate) fn connector(ca: &Path, alpn: &[&[u8]], cert: Option<&Leaf>) -> TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    let pem = std::fs::read(ca).unwrap();
    for c in rustls::pki_types::pem::PemObject::pem_slice_iter(&pem) {
        let c: CertificateDer<'static> = c.unwrap();
        roots.add(c).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let mut cfg = match cert {
        None => builder.with_no_client_auth(),
        Some(leaf) => {
            use rustls::pki_types::pem::PemObject;
            let pem = std::fs::read(&leaf.cert_file).unwrap();
            let chain = CertificateDer::pem_slice_iter(&pem)
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = rustls::pki_types::PrivateKeyDer::from_pem_file(&leaf.key_file).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
    };
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    TlsConnector::from(Arc::new(cfg))
}

/// A TLS connection to `addr` (the handshake within [`LIMIT`]).
pub(crate) async fn tls_connect(
    c: &TlsConnector,
    addr: SocketAddr,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from("127.0.0.1").unwrap();
    tokio::time::timeout(LIMIT, c.connect(name, tcp))
        .await
        .map_err(|_| std::io::Error::other("handshake took too long"))?
}

/// An HTTP/1.1 connection over TLS: its sender, and the leaf certificate
/// the server showed.
pub(crate) async fn h1(
    c: &TlsConnector,
    addr: SocketAddr,
) -> (
    hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    CertificateDer<'static>,
) {
    let tls = tls_connect(c, addr).await.expect("handshake");
    let leaf = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    (send, leaf)
}

/// `GET path` with `Bearer key` on `send`: the status and the RateLimit
/// field.
pub(crate) async fn get(
    send: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    path: &str,
    key: Option<&str>,
) -> (u16, Option<String>) {
    let mut req = Request::get(path).header("host", "127.0.0.1");
    if let Some(k) = key {
        req = req.header("authorization", format!("Bearer {k}"));
    }
    // the connection takes the next request once the last answer is done
    tokio::time::timeout(LIMIT, send.ready())
        .await
        .expect("the connection ready in time")
        .expect("the connection open");
    let res = tokio::time::timeout(LIMIT, send.send_request(req.body(Empty::new()).unwrap()))
        .await
        .expect("an answer in time")
        .expect("an answer");
    let status = res.status().as_u16();
    let limit = res
        .headers()
        .get("ratelimit")
        .map(|v| v.to_str().unwrap().to_string());
    let _ = res.into_body().collect().await;
    (status, limit)
}

/// A gateway with TLS on a fresh CA's certificate and `tls` lines more in
/// `[gateway.tls]`: its address, handle, and the CA's file.
pub(crate) async fn tls_gateway(
    dir: &std::path::Path,
    tls: &str,
) -> (SocketAddr, GatewayHandle, PathBuf) {
    let ca = TestCa::new(dir, "ca");
    let leaf = ca.server(dir, "gw", &["127.0.0.1"]);
    let (api, _) = counting_upstream().await;
    let text = format!(
        r#"[gateway]
listen = "127.0.0.1:0"
upstream = "http://{api}"
watch = false

[gateway.tls]
cert_file = {:?}
key_file = {:?}
{tls}

[plans.free]
policies = [{{ name = "burst", algorithm = "token_bucket", q = 1000000, w = 1 }}]

[keys]
sk_a = "free"
"#,
        leaf.cert_file, leaf.key_file
    );
    let gw = Gateway::bind(GatewayConfig::parse(&text, "h.toml", None).unwrap())
        .await
        .unwrap();
    let (addr, handle) = (gw.local_addr(), gw.handle());
    tokio::spawn(gw.run(std::future::pending()));
    (addr, handle, ca.cert_file.clone())
}
