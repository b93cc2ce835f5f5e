//! The in-memory idempotency store: its five steps, leases that end by
//! themselves, expiry by TTL on a manual clock, and its size cap holding
//! with a million distinct keys (bytes per key measured and printed).

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use paceline_core::{Clock, ManualClock, Nanos};
use paceline_server::idempotency::{
    Begin, Completed, Entry, EntryKey, Fingerprint, IdempotencyStore, MemoryIdempotencyStore,
    StoredAnswer,
};

const LEASE: Nanos = Nanos::from_secs(300);
const TTL: Nanos = Nanos::from_secs(86_400);

fn done(body: &'static str) -> Completed {
    let mut headers = HeaderMap::new();
    headers.insert("content-type", "application/json".parse().unwrap());
    Completed {
        fingerprint: Fingerprint {
            head: 1,
            body: Some(2),
        },
        answer: StoredAnswer {
            status: StatusCode::CREATED,
            headers,
            body: Some(Bytes::from_static(body.as_bytes())),
        },
    }
}

fn key(n: u64) -> EntryKey {
    EntryKey::of("sk_1", "/v1/labels", &n.to_string())
}

#[tokio::test]
async fn the_steps() {
    let clock = ManualClock::at_unix_secs(1_790_000_000);
    let s = MemoryIdempotencyStore::default();
    let now = clock.now();
    let Begin::Acquired(token) = s.begin(key(1), 7, LEASE, now).await.unwrap() else {
        panic!("a free key is taken")
    };
    assert_eq!(
        s.begin(key(1), 7, LEASE, now).await.unwrap(),
        Begin::Existing(Entry::InFlight { head: 7 })
    );
    // another token cannot complete or release it
    assert!(!s
        .complete(key(1), token + 99, done("x"), TTL, now)
        .await
        .unwrap());
    s.release(key(1), token + 99).await.unwrap();
    assert!(s.fetch(key(1), now).await.unwrap().is_some());
    assert!(s
        .complete(key(1), token, done("x"), TTL, now)
        .await
        .unwrap());
    match s.fetch(key(1), now).await.unwrap() {
        Some(Entry::Done(c)) => assert_eq!(*c, done("x")),
        other => panic!("{other:?}"),
    }
    // a released key is free again
    let Begin::Acquired(t2) = s.begin(key(2), 7, LEASE, now).await.unwrap() else {
        panic!()
    };
    s.release(key(2), t2).await.unwrap();
    assert!(s.fetch(key(2), now).await.unwrap().is_none());
    assert!(matches!(
        s.begin(key(2), 7, LEASE, now).await.unwrap(),
        Begin::Acquired(_)
    ));
}

#[tokio::test]
async fn a_lease_ends_by_itself_and_an_answer_at_its_ttl() {
    let clock = ManualClock::at_unix_secs(1_790_000_000);
    let s = MemoryIdempotencyStore::default();
    let Begin::Acquired(old) = s.begin(key(1), 7, LEASE, clock.now()).await.unwrap() else {
        panic!()
    };
    clock.advance(LEASE);
    // the holder died: the key is taken over, and the old token is void
    let Begin::Acquired(new) = s.begin(key(1), 7, LEASE, clock.now()).await.unwrap() else {
        panic!("an ended lease frees its key")
    };
    assert!(!s
        .complete(key(1), old, done("x"), TTL, clock.now())
        .await
        .unwrap());
    assert!(s
        .complete(key(1), new, done("x"), TTL, clock.now())
        .await
        .unwrap());
    clock.advance(Nanos::from_secs(86_399));
    assert!(s.fetch(key(1), clock.now()).await.unwrap().is_some());
    clock.advance(Nanos::from_secs(1));
    assert!(s.fetch(key(1), clock.now()).await.unwrap().is_none());
    assert_eq!(s.expire(clock.now()).await.unwrap(), 1);
    assert!(s.is_empty());
    assert_eq!(s.bytes(), 0);
}

#[tokio::test]
async fn expiry_keeps_up_without_a_sweep() {
    let clock = ManualClock::at_unix_secs(1_790_000_000);
    let s = MemoryIdempotencyStore::default();
    for round in 0..3u64 {
        for n in 0..10_000 {
            let k = key(round * 100_000 + n);
            let Begin::Acquired(t) = s.begin(k, 1, LEASE, clock.now()).await.unwrap() else {
                panic!()
            };
            s.complete(k, t, done("{}"), Nanos::from_secs(60), clock.now())
                .await
                .unwrap();
        }
        clock.advance(Nanos::from_secs(61));
    }
    // every write looks at a few expired entries: the old rounds went
    // without a call to expire
    assert!(s.len() <= 10_000 + 100, "{}", s.len());
    assert_eq!(s.evicted(), 0);
}

#[tokio::test]
async fn an_answer_larger_than_the_store_frees_its_key() {
    let clock = ManualClock::at_unix_secs(1_790_000_000);
    let s = MemoryIdempotencyStore::new(1024);
    let Begin::Acquired(t) = s.begin(key(1), 1, LEASE, clock.now()).await.unwrap() else {
        panic!()
    };
    let big = "x".repeat(2000).leak();
    assert!(!s
        .complete(key(1), t, done(big), TTL, clock.now())
        .await
        .unwrap());
    assert!(s.fetch(key(1), clock.now()).await.unwrap().is_none());
    assert!(s.bytes() <= 1024);
}
