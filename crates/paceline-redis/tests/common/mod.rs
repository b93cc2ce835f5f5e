//! What the log-in tests share (`auth.rs` over plain TCP, `tls.rs` over
//! TLS): a small plan, a store configuration with short deadlines, a first
//! decision that waits for the connection, and an ACL user.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use paceline_core::{Nanos, Plan, Policy, Store, StoreError};
use paceline_redis::{RedisStore, RedisStoreConfig};

/// Three requests an hour.
pub(crate) fn burst() -> Plan {
    Plan::new(
        "free",
        vec![Policy::token_bucket("burst", 3, 3_600).unwrap()],
    )
    .unwrap()
}

pub(crate) fn config(url: String) -> RedisStoreConfig {
    RedisStoreConfig {
        urls: vec![url],
        deadline: Duration::from_millis(500),
        connect_timeout: Duration::from_millis(500),
        key_secret: b"test".to_vec(),
        ..RedisStoreConfig::default()
    }
}

/// Tries a decision until one comes (the first connects), for at most 5 s.
pub(crate) async fn first(s: &RedisStore, plan: &Plan, key: &str) -> Result<bool, StoreError> {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        match s.check(plan, key, 1, Nanos::ZERO).await {
            Ok(d) => return Ok(d.is_allowed()),
            Err(e) if Instant::now() >= until => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// An ACL user that may run everything the store needs (`redis-server`
/// arguments), whose password is `s3cret-pw`.
pub(crate) const USER: [&str; 7] = [
    "--user",
    "paceline",
    "on",
    ">s3cret-pw",
    "~*",
    "&*",
    "+@all",
];

/// Asserts that the store is logged in as the ACL user.
pub(crate) async fn assert_logged_in_as_user(s: &RedisStore) {
    let who = s.command(redis::cmd("ACL").arg("WHOAMI")).await.unwrap();
    assert_eq!(
        who,
        redis::Value::BulkString(b"paceline".to_vec()),
        "{who:?}"
    );
}
