//! The in-memory idempotency store's size, alone in its test binary (the
//! process's resident size is read, so nothing else may run beside it):
//! a million distinct keys stay under the cap, and the bytes it counts
//! per key cover what the process really grows by (both printed).

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use paceline_core::{Clock, ManualClock, Nanos};
use paceline_server::idempotency::{
    Begin, Completed, EntryKey, Fingerprint, IdempotencyStore, MemoryIdempotencyStore,
    StoredAnswer, ENTRY_OVERHEAD,
};

const LEASE: Nanos = Nanos::from_secs(300);
const TTL: Nanos = Nanos::from_secs(86_400);

fn done(body: &'static str) -> Completed {
    let mut headers = HeaderMap::with_capacity(1);
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

fn rss_bytes() -> Option<usize> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: usize = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

async fn a_million_distinct_keys_stay_under_the_cap() {
    let clock = ManualClock::at_unix_secs(1_790_000_000);
    let cap = 32 * 1024 * 1024;
    let s = MemoryIdempotencyStore::new(cap);
    let before = rss_bytes();
    let mut most = 0;
    for n in 0..1_000_000u64 {
        let k = key(n);
        let now = clock.now();
        let Begin::Acquired(t) = s.begin(k, 1, LEASE, now).await.unwrap() else {
            panic!("distinct keys never meet")
        };
        assert!(s
            .complete(k, t, done("{\"label_id\":\"lbl_77120\"}"), TTL, now)
            .await
            .unwrap());
        if n % 1000 == 0 {
            clock.advance(Nanos::from_millis(1));
            most = most.max(s.bytes());
        }
    }
    assert!(most <= cap && s.bytes() <= cap, "{most} > {cap}");
    assert!(s.evicted() > 0);
    let entries = s.len();
    let per_key = s.bytes() / entries;
    let after = rss_bytes();
    println!(
        "1,000,000 keys: {entries} kept under a {cap}-byte cap, {} evicted; {per_key} bytes per key counted \
         (overhead {ENTRY_OVERHEAD}); resident growth {:?} bytes ({:?} per kept key)",
        s.evicted(),
        after.zip(before).map(|(a, b)| a.saturating_sub(b)),
        after.zip(before).map(|(a, b)| a.saturating_sub(b) / entries),
    );
    // the newest keys are the ones kept
    assert!(s.fetch(key(999_999), clock.now()).await.unwrap().is_some());
    assert!(s.fetch(key(0), clock.now()).await.unwrap().is_none());
}

async fn the_bytes_counted_per_key_cover_what_the_process_grows_by() {
    // no eviction: what the process grows by is what the entries take
    let clock = ManualClock::at_unix_secs(1_790_000_000);
    let s = MemoryIdempotencyStore::new(usize::MAX / 2);
    let n = 200_000u64;
    let before = rss_bytes();
    for i in 0..n {
        let k = key(i);
        let Begin::Acquired(t) = s.begin(k, 1, LEASE, clock.now()).await.unwrap() else {
            panic!()
        };
        s.complete(k, t, done("{\"label_id\":\"lbl_77120\"}"), TTL, clock.now())
            .await
            .unwrap();
    }
    let counted = s.bytes() / n as usize;
    let Some(grown) = rss_bytes()
        .zip(before)
        .map(|(a, b)| a.saturating_sub(b) / n as usize)
    else {
        return;
    };
    println!("{n} keys: {counted} bytes per key counted, {grown} per key resident");
    // the count may not fall far short of what is really taken
    assert!(counted * 2 >= grown, "{counted} counted, {grown} resident");
}

#[tokio::test]
async fn memory_stays_bounded() {
    // first the measurement (nothing evicted yet), then the million
    the_bytes_counted_per_key_cover_what_the_process_grows_by().await;
    a_million_distinct_keys_stay_under_the_cap().await;
}
