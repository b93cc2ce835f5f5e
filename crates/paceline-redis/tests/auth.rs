//! The store with a username and password (`redis://user:password@…`),
//! against a `redis-server` of its own with an ACL user: the store logs in
//! as that user; a wrong password is a clear error within the deadline,
//! never a hang, and never shows the password.

#[path = "../src/testing.rs"]
mod testing;

use std::time::{Duration, Instant};

use paceline_core::{Nanos, Plan, Policy, Store, StoreError};
use paceline_redis::{RedisStore, RedisStoreConfig};
use testing::RedisServer;

fn burst() -> Plan {
    Plan::new(
        "free",
        vec![Policy::token_bucket("burst", 3, 3_600).unwrap()],
    )
    .unwrap()
}

fn config(url: String) -> RedisStoreConfig {
    RedisStoreConfig {
        urls: vec![url],
        deadline: Duration::from_millis(500),
        connect_timeout: Duration::from_millis(500),
        key_secret: b"test".to_vec(),
        ..RedisStoreConfig::default()
    }
}

/// Tries a decision until one comes (the first connects), for at most 5 s.
async fn first(s: &RedisStore, plan: &Plan, key: &str) -> Result<bool, StoreError> {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        match s.check(plan, key, 1, Nanos::ZERO).await {
            Ok(d) => return Ok(d.is_allowed()),
            Err(e) if Instant::now() >= until => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// An ACL user that may run everything the store needs.
const USER: [&str; 7] = [
    "--user",
    "paceline",
    "on",
    ">s3cret-pw",
    "~*",
    "&*",
    "+@all",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_username_and_password_in_the_url_log_in() {
    let server = RedisServer::start_with(&USER);
    let url = format!("redis://paceline:s3cret-pw@127.0.0.1:{}", server.port());
    let s = RedisStore::connect(config(url)).await.unwrap();
    let plan = burst();
    assert!(first(&s, &plan, "k:a").await.unwrap());
    let who = s.command(redis::cmd("ACL").arg("WHOAMI")).await.unwrap();
    assert_eq!(
        who,
        redis::Value::BulkString(b"paceline".to_vec()),
        "{who:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_a_clear_error_within_the_deadline() {
    let server = RedisServer::start_with(&USER);
    let url = format!("redis://paceline:wrong@127.0.0.1:{}", server.port());
    let s = RedisStore::connect(config(url)).await.unwrap();
    for _ in 0..3 {
        let t = Instant::now();
        let e = s.check(&burst(), "k:a", 1, Nanos::ZERO).await.unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        let text = e.to_string().to_ascii_lowercase();
        assert!(text.contains("authentication failed"), "{e}");
        // and the password is not in it
        assert!(!text.contains("paceline:wrong"), "{e}");
    }
}
