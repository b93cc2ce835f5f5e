//! The idempotency store against a real redis-server: every step, leases
//! and answers that expire by themselves, fingerprints as stored, many
//! tasks (on two instances) racing for one key, the deadline, bounded
//! answers, hashed key names, and the layer itself on Redis.

#[path = "../src/testing.rs"]
mod testing;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use paceline_core::{ManualClock, Nanos, StoreError};
use paceline_redis::{RedisIdempotencyStore, RedisStoreConfig};
use paceline_server::idempotency::{
    BearerScope, Begin, Completed, Entry, EntryKey, Fingerprint, IdempotencyLayer, IdempotencyMode,
    IdempotencySettings, IdempotencyStore, StoredAnswer,
};
use tower::{Service, ServiceExt};

const LEASE: Nanos = Nanos::from_secs(60);
const TTL: Nanos = Nanos::from_secs(3600);
const NOW: Nanos = Nanos::ZERO;

async fn store(url: String, secret: &[u8]) -> RedisIdempotencyStore {
    let s = RedisIdempotencyStore::connect(RedisStoreConfig {
        urls: vec![url],
        key_secret: secret.to_vec(),
        ..RedisStoreConfig::default()
    })
    .await
    .unwrap()
    .with_deadline(Duration::from_secs(2));
    // the first step connects and loads the script
    s.fetch(EntryKey(0), NOW).await.unwrap();
    s
}

fn done(head: u64, body: &'static [u8]) -> Completed {
    let mut headers = HeaderMap::new();
    headers.insert("content-type", "application/json".parse().unwrap());
    Completed {
        fingerprint: Fingerprint {
            head,
            body: Some(0xfeed),
        },
        answer: StoredAnswer {
            status: StatusCode::CREATED,
            headers,
            body: Some(Bytes::from_static(body)),
        },
    }
}

fn acquired(b: Begin) -> u64 {
    match b {
        Begin::Acquired(t) => t,
        other => panic!("expected the lease, got {other:?}"),
    }
}

/// Polls `fetch` until the entry is gone (bounded).
async fn gone_within(s: &RedisIdempotencyStore, key: EntryKey, within: Duration) -> Duration {
    let start = Instant::now();
    loop {
        if s.fetch(key, NOW).await.unwrap().is_none() {
            return start.elapsed();
        }
        assert!(start.elapsed() < within, "the entry did not expire");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn every_step() {
    let server = testing::RedisServer::start();
    let s = store(server.url(), b"secret").await;
    let key = EntryKey::of("k:sk_1", "labels", "key-1");
    assert_eq!(s.fetch(key, NOW).await.unwrap(), None);

    let token = acquired(s.begin(key, 11, LEASE, NOW).await.unwrap());
    // taken: the second sees it in flight, with the first one's head
    assert_eq!(
        s.begin(key, 11, LEASE, NOW).await.unwrap(),
        Begin::Existing(Entry::InFlight { head: 11 })
    );
    assert_eq!(
        s.fetch(key, NOW).await.unwrap(),
        Some(Entry::InFlight { head: 11 })
    );
    // the lease is Redis's: PX set
    let pttl = server.cli(&format!("PTTL {}", s.key_name(key)));
    let ms: i64 = pttl.trim_start_matches(':').trim().parse().unwrap();
    assert!(ms > 50_000 && ms <= 60_000, "{pttl}");

    // only the holder completes
    assert!(!s
        .complete(key, token ^ 1, done(11, b"x"), TTL, NOW)
        .await
        .unwrap());
    let d = done(11, b"{\"label_id\":\"lbl_1\"}");
    assert!(s.complete(key, token, d.clone(), TTL, NOW).await.unwrap());
    let want = Entry::Done(Arc::new(d));
    assert_eq!(s.fetch(key, NOW).await.unwrap(), Some(want.clone()));
    assert_eq!(
        s.begin(key, 11, LEASE, NOW).await.unwrap(),
        Begin::Existing(want.clone())
    );
    // a stored answer is not released, not even by its token, nor
    // completed again
    s.release(key, token).await.unwrap();
    assert_eq!(s.fetch(key, NOW).await.unwrap(), Some(want));
    assert!(!s
        .complete(key, token, done(11, b"y"), TTL, NOW)
        .await
        .unwrap());
    let pttl = server.cli(&format!("PTTL {}", s.key_name(key)));
    let ms: i64 = pttl.trim_start_matches(':').trim().parse().unwrap();
    assert!(ms > 3_500_000 && ms <= 3_600_000, "{pttl}");

    // a released lease frees the key, and only its own token releases it
    let other = EntryKey::of("k:sk_1", "labels", "key-2");
    let t = acquired(s.begin(other, 5, LEASE, NOW).await.unwrap());
    s.release(other, t.wrapping_add(1)).await.unwrap();
    assert!(s.fetch(other, NOW).await.unwrap().is_some());
    s.release(other, t).await.unwrap();
    assert_eq!(s.fetch(other, NOW).await.unwrap(), None);
    let t2 = acquired(s.begin(other, 5, LEASE, NOW).await.unwrap());
    assert_ne!(t, t2);
    assert_eq!(s.expire(NOW).await.unwrap(), 0);
}

#[tokio::test]
async fn leases_expire_by_themselves() {
    let server = testing::RedisServer::start();
    let s = store(server.url(), b"secret").await;
    let key = EntryKey::of("k:sk_1", "labels", "dies");
    let token = acquired(s.begin(key, 1, Nanos::from_millis(150), NOW).await.unwrap());
    assert!(s.fetch(key, NOW).await.unwrap().is_some());
    // the holder died: nobody releases it
    let took = gone_within(&s, key, Duration::from_secs(3)).await;
    assert!(took >= Duration::from_millis(100), "{took:?}");
    let again = acquired(s.begin(key, 1, LEASE, NOW).await.unwrap());
    // the first holder comes back late: its answer is refused
    assert!(!s
        .complete(key, token, done(1, b"late"), TTL, NOW)
        .await
        .unwrap());
    assert!(s
        .complete(key, again, done(1, b"new"), TTL, NOW)
        .await
        .unwrap());
}

#[tokio::test]
async fn answers_expire_by_their_ttl() {
    let server = testing::RedisServer::start();
    let s = store(server.url(), b"secret").await;
    let key = EntryKey::of("k:sk_1", "labels", "old");
    let t = acquired(s.begin(key, 1, LEASE, NOW).await.unwrap());
    assert!(s
        .complete(key, t, done(1, b"{}"), Nanos::from_millis(200), NOW)
        .await
        .unwrap());
    assert!(matches!(
        s.fetch(key, NOW).await.unwrap(),
        Some(Entry::Done(_))
    ));
    let took = gone_within(&s, key, Duration::from_secs(3)).await;
    assert!(took >= Duration::from_millis(100), "{took:?}");
    // an expired key runs again
    acquired(s.begin(key, 1, LEASE, NOW).await.unwrap());
}

#[tokio::test]
async fn fingerprints_come_back_as_stored_so_conflicts_are_seen() {
    let server = testing::RedisServer::start();
    let s = store(server.url(), b"secret").await;
    let key = EntryKey::of("k:sk_1", "labels", "same");
    let t = acquired(s.begin(key, 1, LEASE, NOW).await.unwrap());
    // another head while in flight: the running one's head comes back
    assert_eq!(
        s.begin(key, 2, LEASE, NOW).await.unwrap(),
        Begin::Existing(Entry::InFlight { head: 1 })
    );
    let mut d = done(1, b"{}");
    d.fingerprint.body = Some(u128::MAX - 1);
    assert!(s.complete(key, t, d, TTL, NOW).await.unwrap());
    let Begin::Existing(Entry::Done(c)) = s.begin(key, 2, LEASE, NOW).await.unwrap() else {
        panic!("the stored answer")
    };
    assert_eq!(
        c.fingerprint,
        Fingerprint {
            head: 1,
            body: Some(u128::MAX - 1)
        }
    );
    // scopes never meet: another caller, same key string
    let theirs = EntryKey::of("k:sk_2", "labels", "same");
    acquired(s.begin(theirs, 1, LEASE, NOW).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tasks_on_two_instances_one_wins() {
    let server = testing::RedisServer::start();
    let a = store(server.url(), b"secret").await;
    let b = store(server.url(), b"secret").await;
    for round in 0..5 {
        let key = EntryKey::of("k:sk_1", "labels", &format!("race-{round}"));
        let wins = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for i in 0..64 {
            let s = if i % 2 == 0 { a.clone() } else { b.clone() };
            let wins = wins.clone();
            tasks.push(tokio::spawn(async move {
                match s.begin(key, 3, LEASE, NOW).await.unwrap() {
                    Begin::Acquired(_) => {
                        wins.fetch_add(1, Ordering::SeqCst);
                    }
                    Begin::Existing(Entry::InFlight { head }) => assert_eq!(head, 3),
                    Begin::Existing(other) => panic!("{other:?}"),
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(wins.load(Ordering::SeqCst), 1, "round {round}");
    }
}

#[tokio::test]
async fn a_silent_server_fails_within_the_deadline() {
    let server = testing::RedisServer::start();
    let s = store(server.url(), b"secret")
        .await
        .with_deadline(Duration::from_millis(100));
    assert_eq!(s.deadline(), Duration::from_millis(100));
    let key = EntryKey::of("k:sk_1", "labels", "paused");
    server.pause();
    let start = Instant::now();
    let r = s.begin(key, 1, LEASE, NOW).await;
    let took = start.elapsed();
    server.resume();
    assert!(matches!(r, Err(StoreError::Unavailable(_))), "{r:?}");
    assert!(took < Duration::from_millis(600), "{took:?}");
    for step in [s.fetch(key, NOW).await.map(|_| ()), s.release(key, 1).await] {
        step.unwrap();
    }
}

#[tokio::test]
async fn answers_are_bounded() {
    let server = testing::RedisServer::start();
    let mut settings = IdempotencySettings::default();
    settings.max_answer_bytes = 1024;
    let s = store(server.url(), b"secret")
        .await
        .for_settings(&settings)
        .with_max_value_bytes(4096);
    assert_eq!(s.max_value_bytes(), 4096);
    let key = EntryKey::of("k:sk_1", "labels", "big");
    let t = acquired(s.begin(key, 1, LEASE, NOW).await.unwrap());
    let body: &'static [u8] = Box::leak(vec![b'x'; 100_000].into_boxed_slice());
    assert!(s.complete(key, t, done(1, body), TTL, NOW).await.unwrap());
    let len = server.cli(&format!("STRLEN {}", s.key_name(key)));
    let len: usize = len.trim_start_matches(':').trim().parse().unwrap();
    assert!(len <= 4096, "{len}");
    // ran once, kept without its body: the layer refuses to replay it
    let Some(Entry::Done(c)) = s.fetch(key, NOW).await.unwrap() else {
        panic!("the answer")
    };
    assert_eq!(c.answer.body, None);
    assert_eq!(c.answer.status, StatusCode::CREATED);
    // the default bound follows the layer's settings
    let d = RedisIdempotencyStore::connect(RedisStoreConfig {
        urls: vec![server.url()],
        ..RedisStoreConfig::default()
    })
    .await
    .unwrap()
    .for_settings(&settings);
    assert_eq!(d.max_value_bytes(), 1024 + paceline_redis::ANSWER_HEAD_ROOM);
}

#[tokio::test]
async fn names_hide_scope_and_key_and_depend_on_the_secret() {
    let server = testing::RedisServer::start();
    let a = store(server.url(), b"one").await;
    let b = store(server.url(), b"two").await;
    let key = EntryKey::of("k:sk_live_secret", "labels", "key-visible");
    let name = a.key_name(key);
    assert!(
        name.starts_with("pl:idem:{") && name.ends_with('}'),
        "{name}"
    );
    assert!(!name.contains(&key.hex()), "{name}");
    assert_ne!(name, b.key_name(key));
    acquired(a.begin(key, 1, LEASE, NOW).await.unwrap());
    // another secret is another namespace
    acquired(b.begin(key, 1, LEASE, NOW).await.unwrap());
    let keys = server.cli("KEYS *");
    assert!(
        !keys.contains("sk_live") && !keys.contains("key-visible"),
        "{keys}"
    );
}

async fn text_of<B>(b: B) -> String
where
    B: http_body::Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    use http_body_util::BodyExt;
    String::from_utf8(b.collect().await.unwrap().to_bytes().to_vec()).unwrap()
}

async fn text<B>(r: http::Response<B>) -> (http::response::Parts, String)
where
    B: http_body::Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    let (p, b) = r.into_parts();
    (p, text_of(b).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_on_redis_replays_across_instances_and_refuses_conflicts() {
    let server = testing::RedisServer::start();
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = |s: RedisIdempotencyStore| {
        IdempotencyLayer::new(
            s,
            ManualClock::at_unix_secs(1_790_000_000),
            BearerScope::new(IdempotencyMode::Required),
            IdempotencySettings::default(),
        )
    };
    let svc = |s: RedisIdempotencyStore| {
        let runs = runs.clone();
        let inner = tower::service_fn(move |req: http::Request<_>| {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                // read to its end, so its digest is part of the fingerprint
                let _ = text_of(req.into_body()).await;
                let body =
                    http_body_util::Full::new(Bytes::from(format!("{{\"label_id\":\"lbl_{n}\"}}")));
                Ok::<_, std::convert::Infallible>(
                    http::Response::builder().status(201).body(body).unwrap(),
                )
            }
        });
        tower::ServiceBuilder::new().layer(layer(s)).service(inner)
    };
    let mut one = svc(store(server.url(), b"secret").await);
    let mut two = svc(store(server.url(), b"secret").await);
    let post = |body: &'static str| {
        http::Request::post("/v1/labels")
            .header("authorization", "Bearer sk_1")
            .header("idempotency-key", "\"k-1\"")
            .body(http_body_util::Full::new(Bytes::from_static(
                body.as_bytes(),
            )))
            .unwrap()
    };
    let (p, first) = text(one.ready().await.unwrap().call(post("{}")).await.unwrap()).await;
    assert_eq!(p.status, 201);
    let (p, again) = text(two.ready().await.unwrap().call(post("{}")).await.unwrap()).await;
    assert_eq!(p.status, 201);
    assert_eq!(p.headers["idempotent-replayed"], "true");
    assert_eq!(again, first);
    let (p, _) = text(
        two.ready()
            .await
            .unwrap()
            .call(post("{\"other\":1}"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(p.status, 409);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_step_on_a_cluster() {
    let cluster = testing::RedisCluster::start();
    let s = RedisIdempotencyStore::connect(RedisStoreConfig {
        urls: cluster.urls(),
        cluster: true,
        key_secret: b"secret".to_vec(),
        ..RedisStoreConfig::default()
    })
    .await
    .unwrap()
    .with_deadline(Duration::from_secs(2));
    // keys spread over the slots of all three masters
    for i in 0..30 {
        let key = EntryKey::of("k:sk_1", "labels", &format!("c-{i}"));
        let t = acquired(s.begin(key, 1, LEASE, NOW).await.unwrap());
        assert!(s.complete(key, t, done(1, b"{}"), TTL, NOW).await.unwrap());
        assert!(matches!(
            s.fetch(key, NOW).await.unwrap(),
            Some(Entry::Done(_))
        ));
        let other = EntryKey::of("k:sk_1", "labels", &format!("r-{i}"));
        let t = acquired(s.begin(other, 1, LEASE, NOW).await.unwrap());
        s.release(other, t).await.unwrap();
        assert_eq!(s.fetch(other, NOW).await.unwrap(), None);
    }
}
