//! Certificates for the tests of this module: the integration tests'
//! helper (`tests/common/certs.rs`, a CA and the leaves it signs), and a
//! rustls server configuration for a leaf.

use std::sync::Arc;

use rustls::ServerConfig;

#[allow(dead_code, unreachable_pub)]
#[path = "../../tests/common/certs.rs"]
mod certs;

pub(crate) use certs::{Leaf, TestCa};

/// A server configuration for `leaf`, offering `alpn`.
pub(crate) fn server_config(leaf: &Leaf, alpn: &[&[u8]]) -> Arc<ServerConfig> {
    let certs = crate::tls::read_certs(&leaf.cert_file).unwrap();
    let key = crate::tls::read_key(&leaf.key_file).unwrap();
    let mut cfg = ServerConfig::builder_with_provider(crate::tls::provider())
        .with_protocol_versions(crate::tls::VERSIONS)
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(cfg)
}
