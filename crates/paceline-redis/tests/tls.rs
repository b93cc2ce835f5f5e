//! The store over `rediss://`, against a `redis-server` of its own with a
//! TLS port: a CA and a server certificate made at test time (for
//! 127.0.0.1), the store trusting that CA and deciding over TLS; one that
//! trusts only the web roots refused, never used; an ACL user's name and
//! password over TLS too (`auth.rs` has them over plain TCP).
#![cfg(feature = "tls")]

mod common;
#[path = "../src/testing.rs"]
mod testing;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{assert_logged_in_as_user, burst, config, first, USER};
use paceline_core::{Nanos, Store, StoreError};
use paceline_redis::{RedisStore, RedisStoreConfig};
use testing::{RedisServer, TlsFiles};

/// A CA and a certificate it signed for 127.0.0.1, written to `dir`.
fn certificates(dir: &Path) -> (TlsFiles, Vec<u8>) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "paceline test CA");
    ca.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    let ca = ca.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    leaf.distinguished_name
        .push(rcgen::DnType::CommonName, "127.0.0.1");
    leaf.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let leaf = leaf.signed_by(&key, &ca, &ca_key).unwrap();
    std::fs::create_dir_all(dir).unwrap();
    let files = TlsFiles {
        cert: dir.join("server.pem"),
        key: dir.join("server.key"),
        ca: dir.join("ca.pem"),
    };
    std::fs::write(&files.cert, leaf.pem()).unwrap();
    std::fs::write(&files.key, key.serialize_pem()).unwrap();
    std::fs::write(&files.ca, ca.pem()).unwrap();
    (files, ca.pem().into_bytes())
}

fn scratch(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("paceline-tls-{name}-{}", std::process::id()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_go_over_tls_to_a_server_whose_ca_is_given() {
    assert!(
        testing::tls_available(),
        "this redis-server was built without TLS"
    );
    let dir = scratch("ok");
    let (files, ca) = certificates(&dir);
    let server = RedisServer::start_tls(&files, &[]);
    let s = RedisStore::connect(RedisStoreConfig {
        tls_ca: Some(ca),
        ..config(server.tls_url())
    })
    .await
    .unwrap();
    let plan = burst();
    assert!(first(&s, &plan, "k:a").await.unwrap());
    assert!(s
        .check(&plan, "k:a", 1, Nanos::ZERO)
        .await
        .unwrap()
        .is_allowed());
    assert!(s
        .check(&plan, "k:a", 1, Nanos::ZERO)
        .await
        .unwrap()
        .is_allowed());
    assert!(!s
        .check(&plan, "k:a", 1, Nanos::ZERO)
        .await
        .unwrap()
        .is_allowed());
    // the count is in the server behind the TLS port
    assert!(server.cli("FUNCTION LIST").contains("paceline_v8"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_ca_is_not_trusted_is_refused_not_used() {
    assert!(testing::tls_available());
    let dir = scratch("untrusted");
    let (files, _) = certificates(&dir);
    let server = RedisServer::start_tls(&files, &[]);
    // no CA given: only the web roots are trusted
    let s = RedisStore::connect(config(server.tls_url())).await.unwrap();
    let t = Instant::now();
    let e = s.check(&burst(), "k:a", 1, Nanos::ZERO).await.unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert!(matches!(e, StoreError::Unavailable(_)), "{e}");
    // the reason, by name (not a panic, not a bare timeout)
    assert!(e.to_string().contains("certificate"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_username_and_password_work_over_tls_too() {
    assert!(testing::tls_available());
    let dir = scratch("acl");
    let (files, ca) = certificates(&dir);
    let server = RedisServer::start_tls(&files, &USER);
    let url = server
        .tls_url()
        .replacen("rediss://", "rediss://paceline:s3cret-pw@", 1);
    let s = RedisStore::connect(RedisStoreConfig {
        tls_ca: Some(ca),
        ..config(url)
    })
    .await
    .unwrap();
    assert!(first(&s, &burst(), "k:a").await.unwrap());
    assert_logged_in_as_user(&s).await;
    let _ = std::fs::remove_dir_all(&dir);
}
