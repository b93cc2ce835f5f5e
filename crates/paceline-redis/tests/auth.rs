//! The store with a username and password (`redis://user:password@…`),
//! against a `redis-server` of its own with an ACL user: the store logs in
//! as that user; a wrong password is a clear error within the deadline,
//! never a hang, and never shows the password.

mod common;
#[path = "../src/testing.rs"]
mod testing;

use std::time::{Duration, Instant};

use common::{assert_logged_in_as_user, burst, config, first, USER};
use paceline_core::{Nanos, Store};
use paceline_redis::RedisStore;
use testing::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_username_and_password_in_the_url_log_in() {
    let server = RedisServer::start_with(&USER);
    let url = format!("redis://paceline:s3cret-pw@127.0.0.1:{}", server.port());
    let s = RedisStore::connect(config(url)).await.unwrap();
    let plan = burst();
    assert!(first(&s, &plan, "k:a").await.unwrap());
    assert_logged_in_as_user(&s).await;
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
