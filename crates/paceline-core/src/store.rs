//! Where per-key state lives.
//!
//! A [`Store`] checks and charges all of a request's policies in one atomic
//! step. [`MemoryStore`] keeps the state in this process: sharded, bounded
//! and self-cleaning. Other crates put the same contract over a shared
//! service (Redis), so many gateway instances share one count.

use std::fmt;
use std::future::Future;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use parking_lot::Mutex;
use siphasher::sip128::{Hasher128, SipHasher13};
use smallvec::SmallVec;
use std::collections::HashMap;

use crate::algorithm;
use crate::check::check_words;
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::plan::Plan;

/// A store could not answer.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreError {
    /// The store is unreachable or timed out.
    Unavailable(String),
    /// The store is full of live keys and will not take a new one.
    Full,
    /// The store answered something that makes no sense.
    Protocol(String),
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Unavailable(m) => write!(f, "store unavailable: {m}"),
            StoreError::Full => f.write_str("store full: too many live keys"),
            StoreError::Protocol(m) => write!(f, "store protocol error: {m}"),
        }
    }
}

impl std::error::Error for StoreError {}

/// Per-key state behind one atomic check-and-charge.
pub trait Store: Send + Sync + 'static {
    /// Checks `cost` against every policy of `plan` for `key` at `now`,
    /// charging all of them if all admit. A cost of 0 reads without charging.
    fn check(
        &self,
        plan: &Plan,
        key: &str,
        cost: u64,
        now: Nanos,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send;

    /// Gives back `amount` units of every concurrency policy of `plan`.
    fn release(
        &self,
        plan: &Plan,
        key: &str,
        amount: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// Settings of a [`MemoryStore`].
#[derive(Clone, Debug)]
pub struct MemoryStoreConfig {
    /// Number of lock shards (rounded up to a power of two).
    pub shards: usize,
    /// The most live keys kept; a new key beyond it is refused with
    /// [`StoreError::Full`] once idle keys have been evicted.
    pub max_keys: usize,
}

impl Default for MemoryStoreConfig {
    fn default() -> Self {
        MemoryStoreConfig {
            shards: 64,
            max_keys: 10_000_000,
        }
    }
}

type Words = SmallVec<[u64; 2]>;

#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u128(&mut self, n: u128) {
        self.0 = n as u64;
    }
}

type Map = HashMap<u128, Words, BuildHasherDefault<PassThrough>>;

#[repr(align(128))]
struct Shard {
    inner: Mutex<ShardInner>,
}

struct ShardInner {
    map: Map,
    sweep_at: usize,
    last_sweep: Nanos,
}

struct Inner {
    shards: Box<[Shard]>,
    shift: u32,
    k0: u64,
    k1: u64,
    max_per_shard: usize,
}

/// The embedded store: per-key state in this process.
///
/// Keys are identified by a keyed 128-bit SipHash of the plan's layout, the
/// plan name and the key, so no key string is kept (a collision between
/// two keys would need 2^64 work against a secret key). Each entry holds the
/// instant it comes to rest; idle entries are swept when a shard grows.
/// Clones share the same state.
///
/// ```
/// use paceline_core::{MemoryStore, Plan, Policy, Nanos};
///
/// let store = MemoryStore::new();
/// let plan = Plan::new("p", vec![Policy::token_bucket("burst", 2, 1).unwrap()]).unwrap();
/// let now = Nanos::from_secs(10);
/// assert!(store.check_sync(&plan, "key", 1, now).unwrap().is_allowed());
/// assert!(store.check_sync(&plan, "key", 1, now).unwrap().is_allowed());
/// assert!(!store.check_sync(&plan, "key", 1, now).unwrap().is_allowed());
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("shards", &self.inner.shards.len())
            .field("keys", &self.len())
            .finish()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

const MIN_SWEEP: usize = 1024;

impl MemoryStore {
    /// A store with default settings.
    pub fn new() -> Self {
        MemoryStore::with_config(MemoryStoreConfig::default())
    }

    /// A store with the given settings.
    pub fn with_config(config: MemoryStoreConfig) -> Self {
        let n = config.shards.clamp(1, 1 << 16).next_power_of_two();
        let shards = (0..n)
            .map(|_| Shard {
                inner: Mutex::new(ShardInner {
                    map: Map::default(),
                    sweep_at: MIN_SWEEP,
                    last_sweep: Nanos::ZERO,
                }),
            })
            .collect();
        MemoryStore {
            inner: Arc::new(Inner {
                shards,
                shift: 128 - n.trailing_zeros(),
                k0: rand::random(),
                k1: rand::random(),
                max_per_shard: config.max_keys.div_ceil(n).max(1),
            }),
        }
    }

    /// Live entries (including ones not yet swept).
    pub fn len(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|s| s.inner.lock().map.len())
            .sum()
    }

    /// Whether the store holds no entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Removes every entry at rest at `now`; returns how many remain.
    pub fn sweep(&self, now: Nanos) -> usize {
        self.inner
            .shards
            .iter()
            .map(|s| {
                let mut g = s.inner.lock();
                g.map.retain(|_, w| w[0] > now.as_u64());
                g.map.len()
            })
            .sum()
    }

    #[inline]
    fn hash(&self, plan: &Plan, key: &str) -> u128 {
        let mut h = SipHasher13::new_with_keys(self.inner.k0, self.inner.k1);
        h.write_u64(plan.layout_fingerprint());
        h.write(plan.name().as_bytes());
        h.write_u8(0xff);
        h.write(key.as_bytes());
        h.finish128().as_u128()
    }

    #[inline]
    fn shard(&self, h: u128) -> &Shard {
        let idx = if self.inner.shift >= 128 {
            0
        } else {
            (h >> self.inner.shift) as usize
        };
        &self.inner.shards[idx]
    }

    /// The synchronous check (the embedded store never waits on I/O).
    pub fn check_sync(
        &self,
        plan: &Plan,
        key: &str,
        cost: u64,
        now: Nanos,
    ) -> Result<Decision, StoreError> {
        let h = self.hash(plan, key);
        let shard = self.shard(h);
        let mut g = shard.inner.lock();
        let words_len = plan.state_words() + 1;
        if let Some(w) = g.map.get_mut(&h) {
            if w.len() == words_len {
                let (d, rest) = check_words(plan, &mut w[1..], now, cost);
                w[0] = rest.as_u64();
                return Ok(d);
            }
        }
        // A key never seen (or seen under another layout): a fresh state.
        let mut fresh: Words = SmallVec::from_elem(0, words_len);
        let (d, rest) = check_words(plan, &mut fresh[1..], now, cost);
        if rest > now {
            fresh[0] = rest.as_u64();
            self.insert(&mut g, h, fresh, now)?;
        }
        Ok(d)
    }

    fn insert(
        &self,
        g: &mut ShardInner,
        h: u128,
        words: Words,
        now: Nanos,
    ) -> Result<(), StoreError> {
        let full = g.map.len() >= self.inner.max_per_shard;
        // When full of live keys, sweep at most once a second: a flood of
        // new keys must not turn every insert into a scan.
        if g.map.len() >= g.sweep_at || (full && now >= g.last_sweep.saturating_add(Nanos::SECOND))
        {
            g.map.retain(|_, w| w[0] > now.as_u64());
            g.sweep_at = (g.map.len() * 2).max(MIN_SWEEP);
            g.last_sweep = now;
        }
        if g.map.len() >= self.inner.max_per_shard {
            return Err(StoreError::Full);
        }
        g.map.insert(h, words);
        Ok(())
    }

    /// The synchronous release of concurrency units.
    pub fn release_sync(&self, plan: &Plan, key: &str, amount: u64) {
        let h = self.hash(plan, key);
        let mut g = self.shard(h).inner.lock();
        let remove = match g.map.get_mut(&h) {
            Some(w) if w.len() == plan.state_words() + 1 => {
                let mut busy = false;
                for (i, p) in plan.policies().iter().enumerate() {
                    let off = 1 + plan.offset(i);
                    let slice = &mut w[off..off + p.state_words()];
                    algorithm::release(p, slice, amount);
                    busy |= p.algorithm() == crate::Algorithm::Concurrency && slice[0] > 0;
                }
                if !busy && w[0] == u64::MAX {
                    // no more leases out: rest when the time-based policies do
                    w[0] = rest_after_release(plan, &w[1..]);
                }
                w[0] == 0
            }
            _ => false,
        };
        if remove {
            g.map.remove(&h);
        }
    }
}

fn rest_after_release(plan: &Plan, words: &[u64]) -> u64 {
    use crate::Algorithm;
    let mut rest = 0u64;
    for (i, p) in plan.policies().iter().enumerate() {
        let off = plan.offset(i);
        let s = &words[off..off + p.state_words()];
        let w = p.window_ns();
        rest = rest.max(match p.algorithm() {
            Algorithm::TokenBucket => s[0],
            Algorithm::Concurrency => 0,
            Algorithm::FixedWindow { offset_s } => s[0]
                .saturating_mul(w)
                .saturating_add(offset_s * 1_000_000_000),
            Algorithm::SlidingCounter => s[0].saturating_add(2).saturating_mul(w),
            Algorithm::SlidingLog => s[1..].iter().max().copied().unwrap_or(0).saturating_add(w),
        });
    }
    rest
}

impl Store for MemoryStore {
    fn check(
        &self,
        plan: &Plan,
        key: &str,
        cost: u64,
        now: Nanos,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        std::future::ready(self.check_sync(plan, key, cost, now))
    }

    fn release(
        &self,
        plan: &Plan,
        key: &str,
        amount: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.release_sync(plan, key, amount);
        std::future::ready(Ok(()))
    }
}
