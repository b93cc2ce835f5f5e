//! Small bounded per-key state (escalation strikes, soft-limit marks),
//! keyed by a key's hash and forgotten once it stops mattering.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use parking_lot::Mutex;

const SHARDS: usize = 16;

/// Something that can tell when it stops mattering.
pub(crate) trait Expiring {
    /// The instant (ns) after which the entry can be dropped.
    fn expires(&self) -> u64;
}

#[derive(Default)]
struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type Map<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

/// A sharded map with a ceiling on entries: expired entries are swept when
/// a shard fills, and a new key finding the shard still full is not
/// tracked (the feature fails open for it, memory stays bounded).
pub(crate) struct BoundedMap<V> {
    shards: Box<[Mutex<Map<V>>]>,
    per_shard: usize,
}

impl<V: Expiring + Default> BoundedMap<V> {
    pub(crate) fn new(max_entries: usize) -> Self {
        BoundedMap {
            shards: (0..SHARDS).map(|_| Mutex::new(Map::default())).collect(),
            per_shard: max_entries.div_ceil(SHARDS).max(1),
        }
    }

    /// Runs `f` on the entry of `id` (created fresh if absent and there is
    /// room); `None` when the map is full of live entries.
    pub(crate) fn with<R>(&self, id: u64, now: u64, f: impl FnOnce(&mut V) -> R) -> Option<R> {
        let mut g = self.shards[(id >> 60) as usize % SHARDS].lock();
        if !g.contains_key(&id) && g.len() >= self.per_shard {
            g.retain(|_, v| v.expires() > now);
            if g.len() >= self.per_shard {
                return None;
            }
        }
        Some(f(g.entry(id).or_default()))
    }

    /// Runs `f` on the entry of `id` if it has one (creating none): one
    /// lock and one lookup.
    pub(crate) fn with_existing<R>(&self, id: u64, f: impl FnOnce(&mut V) -> R) -> Option<R> {
        let mut g = self.shards[(id >> 60) as usize % SHARDS].lock();
        g.get_mut(&id).map(f)
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct E(u64);
    impl Expiring for E {
        fn expires(&self) -> u64 {
            self.0
        }
    }

    #[test]
    fn stays_bounded_and_sweeps() {
        let m: BoundedMap<E> = BoundedMap::new(32);
        let mut stored = 0;
        for id in 0..10_000u64 {
            let id = id.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            if m.with(id, 0, |e| e.0 = 100).is_some() {
                stored += 1;
            }
        }
        assert!(m.len() <= 32, "{}", m.len());
        assert_eq!(stored, m.len());
        // once expired, new keys find room again
        assert!(m.with(12345u64 << 60, 200, |e| e.0 = 300).is_some());
    }
}
