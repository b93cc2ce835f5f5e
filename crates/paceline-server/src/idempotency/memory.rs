//! [`MemoryIdempotencyStore`]: the store of one process, bounded in bytes.
//!
//! Two bounds: time (an answer lives for its TTL, a lease until its
//! deadline) and size (every entry's bytes are counted, its answer
//! included, and the oldest entries go first when a new one would pass
//! the cap). Entries are queued in the order they were written; expiry
//! and eviction both take from the front, a little at every step, so no
//! sweeping task is needed and no step takes long. A queue item whose
//! entry was since rewritten or removed is skipped (and counted in the
//! bytes until it is).

use std::collections::{HashMap, VecDeque};
use std::future::{ready, Future};
use std::sync::Arc;

use paceline_core::{Nanos, StoreError};
use parking_lot::Mutex;

use super::fingerprint::EntryKey;
use super::store::{Begin, Completed, Entry, IdempotencyStore};

/// The default cap: 64 MiB.
pub const DEFAULT_MAX_STORE_BYTES: usize = 64 * 1024 * 1024;

/// The queue items looked at, beyond the ones that must go, at every
/// step: expiry keeps up with the writes without a sweeping task.
const SWEEP: usize = 4;

/// The bytes an entry takes besides its answer: the map's slot (its
/// control byte and the load factor's spare room included) and its two
/// queue items at most.
pub const ENTRY_OVERHEAD: usize =
    (std::mem::size_of::<(u128, Slot)>() + 1) * 8 / 7 + 2 * std::mem::size_of::<Queued>();

/// A bounded in-memory [`IdempotencyStore`]; clones share the entries.
#[derive(Clone)]
pub struct MemoryIdempotencyStore {
    inner: Arc<Mutex<Inner>>,
}

impl std::fmt::Debug for MemoryIdempotencyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let i = self.inner.lock();
        f.debug_struct("MemoryIdempotencyStore")
            .field("entries", &i.map.len())
            .field("bytes", &i.bytes)
            .field("max_bytes", &i.max_bytes)
            .finish()
    }
}

struct Slot {
    /// Which write this is: queue items of older ones are stale.
    generation: u64,
    expires: Nanos,
    /// The bytes counted for it, answer included.
    size: usize,
    state: State,
}

enum State {
    Leased { token: u64, head: u64 },
    Done(Arc<Completed>),
}

struct Queued {
    key: u128,
    generation: u64,
}

struct Inner {
    map: HashMap<u128, Slot, ahash::RandomState>,
    queue: VecDeque<Queued>,
    /// Bytes counted: every entry's size and every queue item.
    bytes: usize,
    max_bytes: usize,
    next: u64,
    evicted: u64,
}

impl Default for MemoryIdempotencyStore {
    fn default() -> Self {
        MemoryIdempotencyStore::new(DEFAULT_MAX_STORE_BYTES)
    }
}

impl MemoryIdempotencyStore {
    /// A store holding at most `max_bytes` (entries, answers and queue).
    pub fn new(max_bytes: usize) -> Self {
        MemoryIdempotencyStore {
            inner: Arc::new(Mutex::new(Inner {
                map: HashMap::default(),
                queue: VecDeque::new(),
                bytes: 0,
                max_bytes,
                next: 1,
                evicted: 0,
            })),
        }
    }

    /// Live entries (in flight or done, expired ones not yet dropped
    /// included).
    pub fn len(&self) -> usize {
        self.inner.lock().map.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes counted now; never more than the cap.
    pub fn bytes(&self) -> usize {
        self.inner.lock().bytes
    }

    /// The cap in bytes.
    pub fn max_bytes(&self) -> usize {
        self.inner.lock().max_bytes
    }

    /// Entries dropped to stay under the cap (not by expiry) so far.
    pub fn evicted(&self) -> u64 {
        self.inner.lock().evicted
    }
}

/// What the front of the queue was.
enum Front {
    Removed,
    Stale,
    Kept,
    Empty,
}

const QUEUED: usize = std::mem::size_of::<Queued>();

impl Inner {
    fn generation(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    /// Looks at the front queue item: drops its entry if the item is the
    /// entry's latest write and `drop` says so, skips it if stale.
    fn pop_front(&mut self, drop: impl Fn(&Slot) -> bool) -> Front {
        let Some(q) = self.queue.front() else {
            return Front::Empty;
        };
        let live = self
            .map
            .get(&q.key)
            .filter(|s| s.generation == q.generation);
        let front = match live {
            Some(s) if !drop(s) => return Front::Kept,
            Some(_) => {
                let s = self.map.remove(&q.key).expect("looked up above");
                self.bytes -= s.size;
                Front::Removed
            }
            None => Front::Stale,
        };
        self.queue.pop_front();
        self.bytes -= QUEUED;
        front
    }

    /// Drops expired entries and stale items from the front: all it
    /// finds when `all`, else a few.
    fn sweep(&mut self, now: Nanos, all: bool) -> u64 {
        let mut removed = 0;
        let mut looked = 0;
        while all || looked < SWEEP {
            looked += 1;
            match self.pop_front(|s| s.expires <= now) {
                Front::Removed => removed += 1,
                Front::Stale => {}
                Front::Kept | Front::Empty => break,
            }
        }
        removed
    }

    /// Makes room for `size` more bytes, oldest first.
    fn make_room(&mut self, size: usize) {
        while self.bytes + size > self.max_bytes {
            match self.pop_front(|_| true) {
                Front::Removed => self.evicted += 1,
                Front::Stale | Front::Kept => {}
                Front::Empty => break,
            }
        }
    }

    /// Writes `state` under `key` until `expires`; false when it cannot
    /// fit under the cap even alone.
    fn write(&mut self, key: u128, state: State, extra: usize, expires: Nanos) -> bool {
        let size = ENTRY_OVERHEAD - 2 * QUEUED + extra;
        if size + QUEUED > self.max_bytes {
            return false;
        }
        if let Some(old) = self.map.remove(&key) {
            self.bytes -= old.size;
        }
        self.make_room(size + QUEUED);
        let generation = self.generation();
        self.map.insert(
            key,
            Slot {
                generation,
                expires,
                size,
                state,
            },
        );
        self.queue.push_back(Queued { key, generation });
        self.bytes += size + QUEUED;
        true
    }

    fn live(&self, key: u128, now: Nanos) -> Option<&Slot> {
        self.map.get(&key).filter(|s| s.expires > now)
    }
}

fn entry_of(s: &Slot) -> Entry {
    match &s.state {
        State::Leased { head, .. } => Entry::InFlight { head: *head },
        State::Done(c) => Entry::Done(c.clone()),
    }
}

impl IdempotencyStore for MemoryIdempotencyStore {
    fn begin(
        &self,
        key: EntryKey,
        head: u64,
        lease: Nanos,
        now: Nanos,
    ) -> impl Future<Output = Result<Begin, StoreError>> + Send {
        let mut i = self.inner.lock();
        i.sweep(now, false);
        if let Some(s) = i.live(key.0, now) {
            return ready(Ok(Begin::Existing(entry_of(s))));
        }
        let token = i.generation();
        let state = State::Leased { token, head };
        let r = match i.write(key.0, state, 0, now.saturating_add(lease)) {
            true => Ok(Begin::Acquired(token)),
            false => Err(StoreError::Full),
        };
        ready(r)
    }

    fn complete(
        &self,
        key: EntryKey,
        token: u64,
        done: Completed,
        ttl: Nanos,
        now: Nanos,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let mut i = self.inner.lock();
        let held = matches!(
            i.map.get(&key.0).map(|s| &s.state),
            Some(State::Leased { token: t, .. }) if *t == token
        );
        if !held {
            return ready(Ok(false));
        }
        let extra = done.answer.size() + std::mem::size_of::<Completed>() + 16;
        let stored = i.write(
            key.0,
            State::Done(Arc::new(done)),
            extra,
            now.saturating_add(ttl),
        );
        if !stored {
            // an answer larger than the whole store: the key is freed
            if let Some(s) = i.map.remove(&key.0) {
                i.bytes -= s.size;
            }
        }
        ready(Ok(stored))
    }

    fn fetch(
        &self,
        key: EntryKey,
        now: Nanos,
    ) -> impl Future<Output = Result<Option<Entry>, StoreError>> + Send {
        let i = self.inner.lock();
        ready(Ok(i.live(key.0, now).map(entry_of)))
    }

    fn release(
        &self,
        key: EntryKey,
        token: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let mut i = self.inner.lock();
        let held = matches!(
            i.map.get(&key.0).map(|s| &s.state),
            Some(State::Leased { token: t, .. }) if *t == token
        );
        if held {
            let s = i.map.remove(&key.0).expect("looked up above");
            i.bytes -= s.size;
        }
        ready(Ok(()))
    }

    fn expire(&self, now: Nanos) -> impl Future<Output = Result<u64, StoreError>> + Send {
        ready(Ok(self.inner.lock().sweep(now, true)))
    }
}
