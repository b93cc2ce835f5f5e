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

use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::PoisonError;

use crossbeam_utils::sync::{ShardedLock, ShardedLockReadGuard, ShardedLockWriteGuard};
use xxhash_rust::xxh3::xxh3_128_with_seed;

use crate::algorithm;
use crate::check::{check_words, Cost};
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::group::{check_each, GroupDecision, GroupItem};
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

    /// Like [`Store::check`], with a cost per unit: content-bytes policies
    /// are charged `cost.bytes`, the others `cost.requests`. The default
    /// charges every policy `cost.requests`; stores that count bytes
    /// override it.
    fn check_cost(
        &self,
        plan: &Plan,
        key: &str,
        cost: Cost,
        now: Nanos,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        self.check(plan, key, cost.requests, now)
    }

    /// Gives back `amount` units of every concurrency policy of `plan`.
    fn release(
        &self,
        plan: &Plan,
        key: &str,
        amount: u64,
        now: Nanos,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Gives back, at `now`, a `cost` that [`Store::check_cost`] charged
    /// `key` at `charged` (a request admitted whose answer never came, say
    /// the upstream failed). Each policy gives back what it can without
    /// inventing room it never had:
    ///
    /// - token bucket (GCRA): the cost is credited, never past a full
    ///   bucket;
    /// - fixed and calendar windows: only while the window of the charge
    ///   is still the current one;
    /// - sliding counter: in the sub-window the charge went to;
    /// - sliding log: the entries stamped with the charge's instant;
    /// - concurrency: nothing (the request's lease gives its units back);
    /// - shadow policies: nothing.
    ///
    /// The default gives nothing back, so a store that cannot refund
    /// still compiles and charges as before.
    fn refund(
        &self,
        plan: &Plan,
        key: &str,
        cost: Cost,
        charged: Nanos,
        now: Nanos,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = (plan, key, cost, charged, now);
        std::future::ready(Ok(()))
    }

    /// Settles, at `now`, a request [`Store::check_cost`] admitted at
    /// `charged_at` with the estimate `charged`, now that its answer
    /// says it cost `actual`. Per policy, in the unit it counts:
    ///
    /// - more than the estimate: the difference is charged, whatever room
    ///   is left, since the work is done. The key may go into debt and is
    ///   refused until it is paid off, with a wait that says when (a token
    ///   bucket owes at most one full burst, its TAT at most `now + 2w`;
    ///   a fixed or calendar window's debt ends with the window; a sliding
    ///   window fills at most to its quota);
    /// - less than the estimate: the difference is given back as
    ///   [`Store::refund`] gives back, never more than was charged and
    ///   never room the key did not have;
    /// - concurrency caps and shadow policies: nothing.
    ///
    /// One atomic step per key. The default gives back what the answer
    /// did not use through [`Store::refund`] and charges nothing more: a
    /// store that can settle overrides it.
    fn settle(
        &self,
        plan: &Plan,
        key: &str,
        charged: Cost,
        actual: Cost,
        charged_at: Nanos,
        now: Nanos,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.refund(plan, key, charged.saturating_sub(actual), charged_at, now)
    }

    /// Checks every item of a group at `now` and charges them all only if
    /// every one admits its cost: a refused group charges nothing (see
    /// [`GroupDecision`]). An error means nothing is known of the group
    /// (and, as far as the store could, nothing was charged).
    ///
    /// The default, [`check_each`], checks one item after another and
    /// gives the charges back on a refusal: exact once it returns, but a
    /// concurrent caller may see a charge before it is given back. A store
    /// that can decide the group in one step overrides it:
    /// [`MemoryStore`] holds its group stripes while it decides, the
    /// Redis store sends the group as one atomic call.
    fn check_all(
        &self,
        items: &[GroupItem<'_>],
        now: Nanos,
    ) -> impl Future<Output = Result<GroupDecision, StoreError>> + Send {
        check_each(self, items, now)
    }

    /// The in-process memory store that answers for this one, if any:
    /// callers may then decide synchronously (no future, no I/O). A store
    /// that picks between kinds at run time returns its memory arm.
    fn memory(&self) -> Option<&MemoryStore> {
        None
    }

    /// The decision [`check_cost`](Store::check_cost) would give, if the
    /// store can give it at once from what this process holds (no I/O, no
    /// waiting): the memory store always can; a remote store can for a
    /// key its local cache answers (one over its limit until its retry
    /// time). `None` means: ask `check_cost`. Whatever it answers counts
    /// as that call (a charge made here is made).
    ///
    /// The default answers through [`memory`](Store::memory).
    fn check_local(
        &self,
        plan: &Plan,
        key: &str,
        cost: Cost,
        now: Nanos,
    ) -> Option<Result<Decision, StoreError>> {
        self.memory().map(|m| m.check_sync(plan, key, cost, now))
    }

    /// A key's standing as this store can tell it at once — no I/O, no
    /// charge — for the fields of an answer that does not ask the store
    /// (a shed `503`, a dashboard): what a cost-0 [`Store::check`] would
    /// answer, or `None` when the store cannot say without asking.
    ///
    /// The default reads the [`Store::memory`] arm, if any. A remote store
    /// may answer what it last heard for the key (its reset times aged to
    /// `now`), and `None` for a key it has not heard of: never an invented
    /// count.
    fn peek_local(&self, plan: &Plan, key: &str, now: Nanos) -> Option<Decision> {
        Some(self.memory()?.peek_sync(plan, key, now))
    }
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

/// A key's state: `[rest_at, policy words…]`, fixed-size for the common
/// small plans so an entry is one flat row in its table.
trait Slot: Sized {
    fn fresh(len: usize) -> Self;
    fn words_mut(&mut self) -> &mut [u64];
}

impl<const N: usize> Slot for [u64; N] {
    fn fresh(_: usize) -> Self {
        [0; N]
    }
    fn words_mut(&mut self) -> &mut [u64] {
        self
    }
}

impl Slot for Box<[u64]> {
    fn fresh(len: usize) -> Self {
        vec![0; len].into_boxed_slice()
    }
    fn words_mut(&mut self) -> &mut [u64] {
        self
    }
}

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

type Table<S> = HashMap<u128, S, BuildHasherDefault<PassThrough>>;

#[repr(align(128))]
struct Shard {
    /// One-word plans (a single token bucket, window or cap). Their rows
    /// are updated with a compare-and-swap under the shared lock, and the
    /// lock is sharded by thread: readers on different cores never write
    /// one cache line, so threads on one key do not serialise here.
    one: ShardedLock<OneWord>,
    /// Multi-word plans, checked under the exclusive lock.
    rows: RwLock<Rows>,
    /// Entries in both parts, for the shard's bound: counted on every
    /// insert and sweep, and recounted whenever both parts are swept.
    keys: AtomicUsize,
    /// When both parts were last swept because the shard was full.
    full_sweep_at: AtomicU64,
}

/// When a part of a shard is next swept.
struct Sweep {
    /// A sweep is due when the part holds this many entries.
    at: usize,
}

impl Default for Sweep {
    fn default() -> Self {
        Sweep { at: MIN_SWEEP }
    }
}

impl Sweep {
    fn done(&mut self, len: usize) {
        self.at = (len * 2).max(MIN_SWEEP);
    }
}

#[derive(Default)]
struct OneWord {
    t2: Table<[AtomicU64; 2]>,
    sweep: Sweep,
}

impl OneWord {
    /// Removes the entries at rest; returns how many went.
    fn sweep(&mut self, now: Nanos) -> usize {
        let (n, before) = (now.as_u64(), self.t2.len());
        self.t2.retain(|_, w| w[0].load(Ordering::Relaxed) > n);
        self.sweep.done(self.t2.len());
        before - self.t2.len()
    }
}

#[derive(Default)]
struct Rows {
    t3: Table<[u64; 3]>,
    t4: Table<[u64; 4]>,
    tn: Table<Box<[u64]>>,
    sweep: Sweep,
}

impl Rows {
    fn len(&self) -> usize {
        self.t3.len() + self.t4.len() + self.tn.len()
    }

    /// Checks a multi-word plan's key in the table of its row size.
    fn check(
        &mut self,
        h: u128,
        plan: &Plan,
        cost: Cost,
        now: Nanos,
        room: bool,
    ) -> Result<(Decision, bool), StoreError> {
        match plan.state_words() + 1 {
            3 => check_in(&mut self.t3, h, plan, cost, now, room),
            4 => check_in(&mut self.t4, h, plan, cost, now, room),
            _ => check_in(&mut self.tn, h, plan, cost, now, room),
        }
    }

    /// Removes the entries at rest; returns how many went.
    fn sweep(&mut self, now: Nanos) -> usize {
        let (n, before) = (now.as_u64(), self.len());
        self.t3.retain(|_, w| w[0] > n);
        self.t4.retain(|_, w| w[0] > n);
        self.tn.retain(|_, w| w[0] > n);
        self.sweep.done(self.len());
        before - self.len()
    }
}

impl Shard {
    /// Sweeps both parts (`one` before `rows`, the one order every path
    /// takes both locks in) and recounts the shard's entries.
    fn sweep(&self, now: Nanos) -> usize {
        let mut one = write(&self.one);
        let mut rows = self.rows.write();
        one.sweep(now);
        rows.sweep(now);
        let keys = one.t2.len() + rows.len();
        self.keys.store(keys, Ordering::Relaxed);
        keys
    }

    /// The shard is full: sweep both parts, at most once a second (a flood
    /// of new keys into a shard full of live ones must not turn every
    /// insert into a scan). Call with neither lock held; whether it swept.
    fn sweep_when_full(&self, now: Nanos) -> bool {
        let last = self.full_sweep_at.load(Ordering::Relaxed);
        let due = now >= Nanos::new(last).saturating_add(Nanos::SECOND);
        let claimed = due
            && self
                .full_sweep_at
                .compare_exchange(last, now.as_u64(), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok();
        if claimed {
            self.sweep(now);
        }
        claimed
    }

    /// Counts the entries a part's own sweep removed (a part sweeps when
    /// it has grown to its mark, which doubles with the live entries, so
    /// sweeping is amortised over the inserts).
    fn swept(&self, gone: usize) {
        if gone > 0 {
            self.keys.fetch_sub(gone, Ordering::Relaxed);
        }
    }

    /// Whether the shard's bound leaves room for one more entry.
    fn has_room(&self, max: usize) -> bool {
        self.keys.load(Ordering::Relaxed) < max
    }
}

struct Inner {
    shards: Box<[Shard]>,
    mask: usize,
    /// The secret seed of the key hash.
    seed: u64,
    max_per_shard: usize,
    /// Held by a group check while it decides (see
    /// [`MemoryStore::check_all_sync`]), by its keys' hashes.
    groups: Box<[parking_lot::Mutex<()>]>,
}

/// Stripes of the group lock (a power of two).
const GROUP_STRIPES: usize = 256;

/// The embedded store: per-key state in this process.
///
/// Keys are identified by a 128-bit hash (XXH3) of the key, seeded with a
/// random secret and the plan's identity, so no key string is kept: two
/// keys share state only if all 128 bits collide. Each entry holds the
/// instant it comes to rest; idle entries are swept when a shard grows.
/// Threads reading one-word plans take a lock sharded by thread, so they
/// do not contend on a key they share. Clones share the same state.
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
                one: ShardedLock::default(),
                rows: RwLock::default(),
                keys: AtomicUsize::new(0),
                full_sweep_at: AtomicU64::new(0),
            })
            .collect();
        MemoryStore {
            inner: Arc::new(Inner {
                shards,
                mask: n - 1,
                seed: rand::random(),
                max_per_shard: config.max_keys.div_ceil(n).max(1),
                groups: (0..GROUP_STRIPES)
                    .map(|_| parking_lot::Mutex::new(()))
                    .collect(),
            }),
        }
    }

    /// Live entries (including ones not yet swept).
    pub fn len(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|s| read(&s.one).t2.len() + s.rows.read().len())
            .sum()
    }

    /// Whether the store holds no entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Removes every entry at rest at `now`; returns how many remain.
    pub fn sweep(&self, now: Nanos) -> usize {
        self.inner.shards.iter().map(|s| s.sweep(now)).sum()
    }

    #[inline]
    fn hash(&self, plan: &Plan, key: &str) -> u128 {
        // A 128-bit hash of the key, seeded with a secret and the plan's
        // identity: keys of different plans never share state, and two
        // keys share one only if all 128 bits collide.
        xxh3_128_with_seed(key.as_bytes(), self.inner.seed ^ plan.identity())
    }

    #[inline]
    fn shard(&self, h: u128) -> &Shard {
        &self.inner.shards[(h >> 64) as usize & self.inner.mask]
    }

    /// The synchronous check (the embedded store never waits on I/O).
    #[inline]
    pub fn check_sync(
        &self,
        plan: &Plan,
        key: &str,
        cost: impl Into<Cost>,
        now: Nanos,
    ) -> Result<Decision, StoreError> {
        let cost = cost.into();
        let h = self.hash(plan, key);
        if plan.state_words() == 1 {
            // the common case, inlined into the caller: a known key of a
            // one-word plan, one shared lock and one compare-and-swap
            let shard = self.shard(h);
            if let Some(d) = read(&shard.one)
                .t2
                .get(&h)
                .map(|slot| cas_one(slot, plan, cost, now))
            {
                return Ok(d);
            }
            return check_one(shard, h, plan, cost, now, self.inner.max_per_shard);
        }
        self.check_rows(h, plan, cost, now)
    }

    /// A key's standing at `now`: what [`check_sync`](Self::check_sync)
    /// of cost 0 answers, read under the shared lock without writing the
    /// key's state, and without making an entry for a key the store does
    /// not hold (a fresh state answers for it).
    pub fn peek_sync(&self, plan: &Plan, key: &str, now: Nanos) -> Decision {
        let h = self.hash(plan, key);
        let shard = self.shard(h);
        let now_ns = now.as_u64();
        let mut words = [0u64; 8];
        let n = plan.state_words();
        if n == 1 {
            if let Some(slot) = read(&shard.one).t2.get(&h) {
                // the word before the mark, as `cas_one` reads them
                let old = slot[1].load(Ordering::Acquire);
                let rest = slot[0].load(Ordering::Acquire);
                // at rest: a fresh state answers the same
                words[0] = if rest <= now_ns { 0 } else { old };
            }
            return crate::check::peek_words(plan, &words[..1], now);
        }
        let g = shard.rows.read();
        let row = match n + 1 {
            3 => g.t3.get(&h).map(|w| &w[..]),
            4 => g.t4.get(&h).map(|w| &w[..]),
            _ => g.tn.get(&h).map(|w| &w[..]),
        };
        match row {
            Some(w) if w.len() == n + 1 && w[0] > now_ns => {
                crate::check::peek_words(plan, &w[1..], now)
            }
            // none, or at rest: a fresh state
            _ if n <= words.len() => crate::check::peek_words(plan, &words[..n], now),
            _ => crate::check::peek_words(plan, &vec![0; n], now),
        }
    }

    /// The check of a plan of several words, under the shard's row lock.
    #[inline(never)]
    fn check_rows(
        &self,
        h: u128,
        plan: &Plan,
        cost: Cost,
        now: Nanos,
    ) -> Result<Decision, StoreError> {
        let shard = self.shard(h);
        let max = self.inner.max_per_shard;
        for first in [true, false] {
            {
                let mut guard = shard.rows.write();
                let g = &mut *guard;
                if g.len() >= g.sweep.at {
                    shard.swept(g.sweep(now));
                }
                match g.check(h, plan, cost, now, shard.has_room(max)) {
                    Ok((d, inserted)) => {
                        if inserted {
                            shard.keys.fetch_add(1, Ordering::Relaxed);
                        }
                        return Ok(d);
                    }
                    Err(StoreError::Full) if first => {}
                    Err(e) => return Err(e),
                }
            }
            // full: sweep both parts (with this lock released) and retry
            // once
            if !first || !shard.sweep_when_full(now) {
                break;
            }
        }
        Err(StoreError::Full)
    }

    /// The synchronous group check (see [`Store::check_all`]): the stripes
    /// of the group's keys are held (in one order) while its items are
    /// checked one after another, each key's state kept before its check;
    /// on a refusal every state is put back as it was (shadow policies'
    /// counts and leases too) and each admitted item read again. So no
    /// other group check (nor a read made as one) sees a charge of a
    /// refused group; a single [`check_sync`] on one of the keys
    /// meanwhile may.
    ///
    /// [`check_sync`]: MemoryStore::check_sync
    pub fn check_all_sync(
        &self,
        items: &[GroupItem<'_>],
        now: Nanos,
    ) -> Result<GroupDecision, StoreError> {
        let mut ids: smallvec::SmallVec<[usize; 8]> = items
            .iter()
            .map(|it| self.hash(it.plan, it.key) as usize & (GROUP_STRIPES - 1))
            .collect();
        ids.sort_unstable();
        ids.dedup();
        let held: smallvec::SmallVec<[_; 8]> =
            ids.iter().map(|&i| self.inner.groups[i].lock()).collect();
        let mut saved = Vec::with_capacity(items.len());
        let mut decisions = Vec::with_capacity(items.len());
        let mut refused = false;
        for it in items {
            saved.push(self.save(it.plan, it.key));
            match self.check_sync(it.plan, it.key, it.cost, now) {
                Ok(d) => {
                    refused = !d.is_allowed();
                    decisions.push(Some(d));
                }
                Err(e) => {
                    self.put_back(items, &saved);
                    return Err(e);
                }
            }
            if refused {
                break;
            }
        }
        if refused {
            self.put_back(items, &saved);
            for (it, d) in items.iter().zip(decisions.iter_mut()) {
                if d.as_ref().is_some_and(Decision::is_allowed) {
                    *d = self
                        .check_sync(it.plan, it.key, Cost::requests(0), now)
                        .ok();
                }
            }
        }
        drop(held);
        decisions.resize(items.len(), None);
        Ok(GroupDecision { decisions })
    }

    /// A key's state as it is: its rest mark and words, or `None` when the
    /// store holds none.
    fn save(&self, plan: &Plan, key: &str) -> Saved {
        let h = self.hash(plan, key);
        let shard = self.shard(h);
        let words = if plan.state_words() == 1 {
            read(&shard.one)
                .t2
                .get(&h)
                .map(|s| vec![s[0].load(Ordering::Acquire), s[1].load(Ordering::Acquire)])
        } else {
            let g = shard.rows.read();
            match plan.state_words() + 1 {
                3 => g.t3.get(&h).map(|w| w.to_vec()),
                4 => g.t4.get(&h).map(|w| w.to_vec()),
                _ => g.tn.get(&h).map(|w| w.to_vec()),
            }
        };
        Saved { h, words }
    }

    /// Puts back the states [`save`](Self::save) kept for `items`, the
    /// last first (a key the group names twice ends as it was first).
    fn put_back(&self, items: &[GroupItem<'_>], saved: &[Saved]) {
        for (it, sv) in items.iter().zip(saved).rev() {
            let shard = self.shard(sv.h);
            let gone = if it.plan.state_words() == 1 {
                let mut g = write(&shard.one);
                match &sv.words {
                    Some(w) => {
                        if let Some(slot) = g.t2.get_mut(&sv.h) {
                            *slot[0].get_mut() = w[0];
                            *slot[1].get_mut() = w[1];
                        }
                        false
                    }
                    None => g.t2.remove(&sv.h).is_some(),
                }
            } else {
                let mut g = shard.rows.write();
                let g = &mut *g;
                match it.plan.state_words() + 1 {
                    3 => put_back_in(&mut g.t3, sv),
                    4 => put_back_in(&mut g.t4, sv),
                    _ => put_back_in(&mut g.tn, sv),
                }
            };
            if gone {
                shard.keys.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// The synchronous release of concurrency units.
    pub fn release_sync(&self, plan: &Plan, key: &str, amount: u64, now: Nanos) {
        let h = self.hash(plan, key);
        let shard = self.shard(h);
        if plan.state_words() == 1 {
            return release_one(&mut write(&shard.one).t2, h, plan, amount, now);
        }
        let mut g = shard.rows.write();
        let g = &mut *g;
        match plan.state_words() + 1 {
            3 => release_in(&mut g.t3, h, plan, amount, now),
            4 => release_in(&mut g.t4, h, plan, amount, now),
            _ => release_in(&mut g.tn, h, plan, amount, now),
        }
    }
}

impl MemoryStore {
    /// The synchronous refund (see [`Store::refund`]).
    pub fn refund_sync(&self, plan: &Plan, key: &str, cost: Cost, charged: Nanos, now: Nanos) {
        let h = self.hash(plan, key);
        let shard = self.shard(h);
        if plan.state_words() == 1 {
            let one = read(&shard.one);
            let Some(slot) = one.t2.get(&h) else {
                return;
            };
            loop {
                let old = slot[1].load(Ordering::Acquire);
                // at rest: nothing is charged any more
                if slot[0].load(Ordering::Acquire) <= now.as_u64() {
                    return;
                }
                let mut w = [old];
                crate::check::refund_words(plan, &mut w, cost, charged, now);
                if w[0] == old
                    || slot[1]
                        .compare_exchange_weak(old, w[0], Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                {
                    return;
                }
            }
        }
        let mut g = shard.rows.write();
        let g = &mut *g;
        match plan.state_words() + 1 {
            3 => refund_in(&mut g.t3, h, plan, cost, charged, now),
            4 => refund_in(&mut g.t4, h, plan, cost, charged, now),
            _ => refund_in(&mut g.tn, h, plan, cost, charged, now),
        }
    }
}

impl MemoryStore {
    /// The synchronous settle (see [`Store::settle`]), under the key's
    /// usual exclusion: a compare-and-swap for a one-word plan, the
    /// shard's row lock for the others. A key the store does not hold
    /// (never charged, or at rest since) is settled from a fresh state,
    /// and kept only if the settle leaves something to remember.
    /// [`StoreError::Full`] when such a key finds no room.
    pub fn settle_sync(
        &self,
        plan: &Plan,
        key: &str,
        charged: Cost,
        actual: Cost,
        charged_at: Nanos,
        now: Nanos,
    ) -> Result<(), StoreError> {
        let h = self.hash(plan, key);
        let shard = self.shard(h);
        let max = self.inner.max_per_shard;
        let step =
            |w: &mut [u64]| crate::check::settle_words(plan, w, charged, actual, charged_at, now);
        if plan.state_words() == 1 {
            if let Some(slot) = read(&shard.one).t2.get(&h) {
                settle_one(slot, step, now);
                return Ok(());
            }
            for first in [true, false] {
                {
                    let mut g = write(&shard.one);
                    if let Some(slot) = g.t2.get(&h) {
                        settle_one(slot, step, now);
                        return Ok(());
                    }
                    let mut w = [0u64];
                    let rest = step(&mut w);
                    if rest <= now {
                        return Ok(());
                    }
                    if shard.has_room(max) {
                        let mark = rest.as_u64().saturating_add(REST_SLACK_NS);
                        g.t2.insert(h, [AtomicU64::new(mark), AtomicU64::new(w[0])]);
                        shard.keys.fetch_add(1, Ordering::Relaxed);
                        return Ok(());
                    }
                }
                if !first || !shard.sweep_when_full(now) {
                    break;
                }
            }
            return Err(StoreError::Full);
        }
        for first in [true, false] {
            {
                let mut g = shard.rows.write();
                let g = &mut *g;
                let room = shard.has_room(max);
                let done = match plan.state_words() + 1 {
                    3 => settle_in(&mut g.t3, h, plan, room, step, now),
                    4 => settle_in(&mut g.t4, h, plan, room, step, now),
                    _ => settle_in(&mut g.tn, h, plan, room, step, now),
                };
                match done {
                    Some(inserted) => {
                        if inserted {
                            shard.keys.fetch_add(1, Ordering::Relaxed);
                        }
                        return Ok(());
                    }
                    None if first => {}
                    None => break,
                }
            }
            if !first || !shard.sweep_when_full(now) {
                break;
            }
        }
        Err(StoreError::Full)
    }
}

/// The settle of a one-word plan's key the store holds: a step on a
/// snapshot, published with a compare-and-swap, the rest mark raised
/// first (as [`cas_one`] does).
fn settle_one(slot: &[AtomicU64; 2], step: impl Fn(&mut [u64]) -> Nanos, now: Nanos) {
    loop {
        let old = slot[1].load(Ordering::Acquire);
        let rest = slot[0].load(Ordering::Acquire);
        let base = if rest <= now.as_u64() { 0 } else { old };
        let mut w = [base];
        let new_rest = step(&mut w).as_u64();
        if w[0] == base && base == old {
            return;
        }
        if new_rest > rest {
            slot[0].fetch_max(new_rest.saturating_add(REST_SLACK_NS), Ordering::AcqRel);
        }
        if slot[1]
            .compare_exchange_weak(old, w[0], Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            return;
        }
    }
}

/// The settle of a multi-word plan's key in its table: `Some(inserted)`
/// when done, `None` when a new key that matters found no `room`.
fn settle_in<S: Slot>(
    table: &mut Table<S>,
    h: u128,
    plan: &Plan,
    room: bool,
    step: impl Fn(&mut [u64]) -> Nanos,
    now: Nanos,
) -> Option<bool> {
    let len = plan.state_words() + 1;
    if let Some(slot) = table.get_mut(&h) {
        let w = slot.words_mut();
        if w.len() == len {
            if w[0] <= now.as_u64() {
                // at rest: a fresh state settles the same
                w.iter_mut().for_each(|x| *x = 0);
            }
            let rest = step(&mut w[1..]);
            w[0] = w[0].max(rest.as_u64());
            return Some(false);
        }
    }
    let mut fresh = S::fresh(len);
    let w = fresh.words_mut();
    let rest = step(&mut w[1..]);
    if rest <= now {
        return Some(false);
    }
    if !room {
        return None;
    }
    w[0] = rest.as_u64();
    table.insert(h, fresh);
    Some(true)
}

/// A key's state kept by a group check, to be put back on a refusal.
struct Saved {
    h: u128,
    words: Option<Vec<u64>>,
}

/// Puts a saved row back: its words, or (it had none) no entry; whether
/// an entry went. A saved row swept since was at rest, as good as none.
fn put_back_in<S: Slot>(table: &mut Table<S>, sv: &Saved) -> bool {
    match &sv.words {
        Some(w) => {
            if let Some(slot) = table.get_mut(&sv.h) {
                let cur = slot.words_mut();
                if cur.len() == w.len() {
                    cur.copy_from_slice(w);
                }
            }
            false
        }
        None => table.remove(&sv.h).is_some(),
    }
}

fn refund_in<S: Slot>(
    table: &mut Table<S>,
    h: u128,
    plan: &Plan,
    cost: Cost,
    charged: Nanos,
    now: Nanos,
) {
    let Some(slot) = table.get_mut(&h) else {
        return;
    };
    let w = slot.words_mut();
    // another layout, or at rest: nothing is charged any more
    if w.len() != plan.state_words() + 1 || w[0] <= now.as_u64() {
        return;
    }
    crate::check::refund_words(plan, &mut w[1..], cost, charged, now);
}

/// Checks in one table; also says whether the key was inserted.
/// `Err(StoreError::Full)`: a new key whose state matters found no `room`
/// (the caller sweeps the whole shard and tries once more).
#[inline]
fn check_in<S: Slot>(
    table: &mut Table<S>,
    h: u128,
    plan: &Plan,
    cost: Cost,
    now: Nanos,
    room: bool,
) -> Result<(Decision, bool), StoreError> {
    let len = plan.state_words() + 1;
    if let Some(slot) = table.get_mut(&h) {
        let w = slot.words_mut();
        if w.len() == len {
            if w[0] <= now.as_u64() {
                // at rest: a fresh state decides the same, and resetting it
                // keeps stale window indices from ever aliasing
                w.iter_mut().for_each(|x| *x = 0);
            }
            let (d, rest) = check_words(plan, &mut w[1..], now, cost);
            w[0] = rest.as_u64();
            return Ok((d, false));
        }
    }
    // A key never seen: decide on a fresh state, keep it only if it matters.
    let mut fresh = S::fresh(len);
    let w = fresh.words_mut();
    let (d, rest) = check_words(plan, &mut w[1..], now, cost);
    if rest <= now {
        return Ok((d, false));
    }
    if !room {
        return Err(StoreError::Full);
    }
    w[0] = rest.as_u64();
    table.insert(h, fresh);
    Ok((d, true))
}

/// How far past the instant a key comes to rest its mark is set when it
/// must move: a busy key raises the mark once per this span instead of on
/// every charge, so most charges are a single compare-and-swap. A mark
/// late by this much only keeps an idle key a little longer (a state at
/// rest decides the same as a fresh one).
const REST_SLACK_NS: u64 = 1_000_000_000;

/// The lock-free step for one-word plans: decide on a snapshot, publish
/// with a compare-and-swap, retry if another thread got there first.
#[inline]
fn cas_one(slot: &[AtomicU64; 2], plan: &Plan, cost: Cost, now: Nanos) -> Decision {
    let now_ns = now.as_u64();
    let p = plan.policy(0);
    let units = cost.of(p);
    if units <= p.burst() {
        // the usual step: the decision is built once, from the peek that won
        loop {
            let old = slot[1].load(Ordering::Acquire);
            let rest = slot[0].load(Ordering::Acquire);
            let base = if rest <= now_ns { 0 } else { old };
            let mut w = [base];
            let (pk, new_rest) = crate::check::single_step(p, &mut w, now_ns, units);
            if w[0] != base {
                if new_rest > rest {
                    slot[0].fetch_max(new_rest.saturating_add(REST_SLACK_NS), Ordering::AcqRel);
                }
                if slot[1]
                    .compare_exchange_weak(old, w[0], Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
                {
                    continue;
                }
            }
            return crate::check::single_decision(p, pk);
        }
    }
    loop {
        // The word before the mark: a thread raises the mark before it
        // publishes a word, so whoever reads that word also reads a mark
        // that covers it and never takes a live word for one at rest.
        let old = slot[1].load(Ordering::Acquire);
        let rest = slot[0].load(Ordering::Acquire);
        // at rest: a fresh state decides the same (and stale window
        // indices never alias)
        let base = if rest <= now_ns { 0 } else { old };
        let mut w = [base];
        let (d, new_rest) = check_words(plan, &mut w, now, cost);
        if w[0] == base {
            return d;
        }
        let new_rest = new_rest.as_u64();
        if new_rest > rest {
            let mark = new_rest.saturating_add(REST_SLACK_NS);
            slot[0].fetch_max(mark, Ordering::AcqRel);
        }
        if slot[1]
            .compare_exchange_weak(old, w[0], Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            return d;
        }
    }
}

/// A one-word plan's key not found under the shared lock: look again under
/// the exclusive one and insert it if its state matters.
#[inline(never)]
fn check_one(
    shard: &Shard,
    h: u128,
    plan: &Plan,
    cost: Cost,
    now: Nanos,
    max: usize,
) -> Result<Decision, StoreError> {
    for first in [true, false] {
        {
            let mut guard = write(&shard.one);
            let g = &mut *guard;
            if let Some(slot) = g.t2.get(&h) {
                return Ok(cas_one(slot, plan, cost, now));
            }
            let mut w = [0u64];
            let (d, rest) = check_words(plan, &mut w, now, cost);
            if rest <= now {
                return Ok(d);
            }
            if g.t2.len() >= g.sweep.at {
                shard.swept(g.sweep(now));
            }
            if shard.has_room(max) {
                let mark = rest.as_u64().saturating_add(REST_SLACK_NS);
                g.t2.insert(h, [AtomicU64::new(mark), AtomicU64::new(w[0])]);
                shard.keys.fetch_add(1, Ordering::Relaxed);
                return Ok(d);
            }
        }
        // full: sweep both parts (with this lock released) and retry once
        if !first || !shard.sweep_when_full(now) {
            break;
        }
    }
    Err(StoreError::Full)
}

/// The shared side of a thread-sharded lock. A panic while it was held
/// left whole rows behind (every write is a single store), so a poisoned
/// lock is used as is.
fn read<T>(lock: &ShardedLock<T>) -> ShardedLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

/// The exclusive side of a thread-sharded lock; see [`read`].
fn write<T>(lock: &ShardedLock<T>) -> ShardedLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

fn release_one(table: &mut Table<[AtomicU64; 2]>, h: u128, plan: &Plan, amount: u64, now: Nanos) {
    if let Some(slot) = table.get_mut(&h) {
        let mut w = [*slot[1].get_mut()];
        algorithm::release(plan.policy(0), &mut w, amount);
        *slot[1].get_mut() = w[0];
        if w[0] == 0 && plan.policy(0).algorithm() == crate::Algorithm::Concurrency {
            *slot[0].get_mut() = rest_after_release(plan, &w, now);
        }
    }
}

fn release_in<S: Slot>(table: &mut Table<S>, h: u128, plan: &Plan, amount: u64, now: Nanos) {
    let Some(slot) = table.get_mut(&h) else {
        return;
    };
    let w = slot.words_mut();
    if w.len() != plan.state_words() + 1 {
        return;
    }
    let mut busy = false;
    for (i, p) in plan.policies().iter().enumerate() {
        let off = 1 + plan.offset(i);
        let s = &mut w[off..off + p.state_words()];
        algorithm::release(p, s, amount);
        busy |= p.algorithm() == crate::Algorithm::Concurrency && s[0] > 0;
    }
    if !busy && w[0] == u64::MAX {
        // no lease out any more: at rest once the time-based policies are
        w[0] = rest_after_release(plan, &w[1..], now);
    }
}

fn rest_after_release(plan: &Plan, words: &[u64], now: Nanos) -> u64 {
    let mut rest = now.as_u64();
    for (i, p) in plan.policies().iter().enumerate() {
        let off = plan.offset(i);
        let s = &words[off..off + p.state_words()];
        rest = rest.max(match p.algorithm() {
            crate::Algorithm::TokenBucket => s[0],
            crate::Algorithm::Concurrency => 0,
            // windows: nothing older than two windows still counts
            _ => now.as_u64().saturating_add(p.window_ns().saturating_mul(2)),
        });
    }
    rest
}

impl Store for MemoryStore {
    fn memory(&self) -> Option<&MemoryStore> {
        Some(self)
    }

    fn check_cost(
        &self,
        plan: &Plan,
        key: &str,
        cost: Cost,
        now: Nanos,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        std::future::ready(self.check_sync(plan, key, cost, now))
    }

    fn check(
        &self,
        plan: &Plan,
        key: &str,
        cost: u64,
        now: Nanos,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        std::future::ready(self.check_sync(plan, key, cost, now))
    }

    fn check_all(
        &self,
        items: &[GroupItem<'_>],
        now: Nanos,
    ) -> impl Future<Output = Result<GroupDecision, StoreError>> + Send {
        std::future::ready(self.check_all_sync(items, now))
    }

    fn release(
        &self,
        plan: &Plan,
        key: &str,
        amount: u64,
        now: Nanos,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.release_sync(plan, key, amount, now);
        std::future::ready(Ok(()))
    }

    fn refund(
        &self,
        plan: &Plan,
        key: &str,
        cost: Cost,
        charged: Nanos,
        now: Nanos,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.refund_sync(plan, key, cost, charged, now);
        std::future::ready(Ok(()))
    }

    fn settle(
        &self,
        plan: &Plan,
        key: &str,
        charged: Cost,
        actual: Cost,
        charged_at: Nanos,
        now: Nanos,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(self.settle_sync(plan, key, charged, actual, charged_at, now))
    }
}
