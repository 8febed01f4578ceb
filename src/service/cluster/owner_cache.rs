//! A short-lived memory of which instance owns a store and where it is reached, so that a
//! forwarded call (`forward.rs`) does not read the registry every time.
//!
//! # Invariants
//!
//! - An entry is used for at most `ttl` after the registry read that made it
//!   ([`OwnerCache::get`] treats an older one as absent); `ttl` zero caches nothing.
//! - At most `capacity` entries ([`OWNER_CACHE_CAPACITY`], 16,384: the 10,000 stores one
//!   fleet is sized for, with room, so a non-owner serving the whole fleet keeps every
//!   store's owner; about 250 bytes each, 4 MiB when full). A [`OwnerCache::put`] first drops
//!   the entries that expired, then, when still full, the oldest; never more work than that:
//!   - the entries' read order is kept beside them in a queue; every put is read at "now" and
//!     every entry has the same `ttl`, so the queue is also in expiry order, and what a put
//!     drops is at the queue's front (no scan of the map);
//!   - a put replacing an entry, and a forget, leave the entry's older record in the queue;
//!     a record is known stale by its sequence number and dropped when it reaches the front,
//!     and when stale records make the queue twice the capacity it is compacted once (one
//!     pass, after at least `capacity` puts: amortised O(1) per put).
//! - Only answers worth remembering go in: a store owned by another instance that announced
//!   an address. An unknown store, one this instance owns, and an owner with no address are
//!   read again on the next call (a newly registered store is never "unknown" for a second).
//! - An entry is forgotten ([`OwnerCache::forget`]) as soon as the owner it names answers that
//!   the store is not its (the one-hop rule: `FAILED_PRECONDITION` or `NOT_FOUND`) or cannot be
//!   reached; the caller then reads the registry again and retries once (`forward.rs`). So an
//!   ownership change (a failover claim, `ctl move`) routes a call wrongly for at most that
//!   one retry, never for the rest of the `ttl`.
//!
//! Memory only: a crash or restart starts empty, and nothing here is ever written anywhere.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// How long an owner is remembered by default (`serve --owner-cache-ms`).
pub const DEFAULT_OWNER_CACHE_TTL: Duration = Duration::from_secs(1);

/// How many stores' owners are remembered at most (see the module docs).
pub const OWNER_CACHE_CAPACITY: usize = 16_384;

/// A store's owner and the address it announced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub instance_id: String,
    pub addr: String,
}

struct Entry {
    owner: Owner,
    read_at: Instant,
    /// The number of the put that made it: its record in [`Entries::order`].
    seq: u64,
}

/// The entries and their read order.
#[derive(Default)]
struct Entries {
    by_store: HashMap<String, Entry>,
    /// `(seq, store id)` of every put, oldest first; a record whose `seq` is not its store's
    /// entry's any more is stale (replaced or forgotten).
    order: VecDeque<(u64, String)>,
    next_seq: u64,
}

impl Entries {
    /// Whether `(seq, store)` is the record of a held entry.
    fn current(&self, seq: u64, store: &str) -> bool {
        self.by_store.get(store).is_some_and(|e| e.seq == seq)
    }

    /// Drops stale records and expired entries from the queue's front, then the oldest
    /// entries while more than `capacity` are held; compacts a queue grown past twice the
    /// capacity.
    fn trim(&mut self, capacity: usize, ttl: Duration) {
        while let Some((seq, store)) = self.order.front() {
            let (seq, store) = (*seq, store.as_str());
            if !self.current(seq, store) {
                self.order.pop_front();
                continue;
            }
            let expired = self.by_store[store].read_at.elapsed() >= ttl;
            if !expired && self.by_store.len() <= capacity {
                break;
            }
            self.by_store.remove(store);
            self.order.pop_front();
        }
        if self.order.len() > 2 * capacity {
            let by_store = &self.by_store;
            self.order
                .retain(|(seq, store)| by_store.get(store).is_some_and(|e| e.seq == *seq));
        }
    }
}

/// Store id → its owner, as read from the registry less than `ttl` ago.
pub struct OwnerCache {
    ttl: Duration,
    capacity: usize,
    entries: Mutex<Entries>,
}

impl OwnerCache {
    pub fn new(ttl: Duration, capacity: usize) -> OwnerCache {
        OwnerCache {
            ttl,
            capacity,
            entries: Mutex::new(Entries::default()),
        }
    }

    /// The owner of `store_id` read less than `ttl` ago, if any.
    pub fn get(&self, store_id: &str) -> Option<Owner> {
        let entries = self.entries.lock().expect("owner cache lock");
        entries
            .by_store
            .get(store_id)
            .filter(|e| e.read_at.elapsed() < self.ttl)
            .map(|e| e.owner.clone())
    }

    /// Remembers `owner` for `store_id`, as just read from the registry.
    pub fn put(&self, store_id: &str, owner: Owner) {
        if self.ttl.is_zero() || self.capacity == 0 {
            return;
        }
        let mut entries = self.entries.lock().expect("owner cache lock");
        let seq = entries.next_seq;
        entries.next_seq += 1;
        let read_at = Instant::now();
        entries.by_store.insert(
            store_id.to_string(),
            Entry {
                owner,
                read_at,
                seq,
            },
        );
        entries.order.push_back((seq, store_id.to_string()));
        entries.trim(self.capacity, self.ttl);
    }

    /// Forgets what is remembered of `store_id` (its owner said the store is not its, or could
    /// not be reached).
    pub fn forget(&self, store_id: &str) {
        self.entries
            .lock()
            .expect("owner cache lock")
            .by_store
            .remove(store_id);
    }

    /// How many entries are held (expired ones included until they are dropped).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries
            .lock()
            .expect("owner cache lock")
            .by_store
            .len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many records the read-order queue holds (live and stale): at most twice the
    /// capacity, plus one.
    #[cfg(test)]
    pub fn queued(&self) -> usize {
        self.entries.lock().expect("owner cache lock").order.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(id: &str) -> Owner {
        Owner {
            instance_id: id.into(),
            addr: format!("{id}:1"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_owner_is_remembered_for_the_ttl_and_no_longer() {
        let cache = OwnerCache::new(Duration::from_secs(1), 8);
        cache.put("s", owner("a"));
        assert_eq!(cache.get("s"), Some(owner("a")));
        tokio::time::advance(Duration::from_millis(999)).await;
        assert_eq!(cache.get("s"), Some(owner("a")));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(cache.get("s"), None);
        cache.put("s", owner("b"));
        assert_eq!(cache.get("s"), Some(owner("b")));
        cache.forget("s");
        assert_eq!(cache.get("s"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_cache_drops_the_expired_then_the_oldest() {
        let cache = OwnerCache::new(Duration::from_secs(1), 3);
        cache.put("old", owner("a"));
        tokio::time::advance(Duration::from_secs(2)).await;
        cache.put("s1", owner("a"));
        tokio::time::advance(Duration::from_millis(10)).await;
        cache.put("s2", owner("b"));
        tokio::time::advance(Duration::from_millis(10)).await;
        // Full: "old" has expired and goes first.
        cache.put("s3", owner("c"));
        assert_eq!(cache.len(), 3);
        assert_eq!(cache.get("s1"), Some(owner("a")));
        // Full of live entries: the oldest ("s1") goes.
        cache.put("s4", owner("d"));
        assert_eq!(cache.len(), 3);
        assert_eq!(cache.get("s1"), None);
        assert_eq!(cache.get("s2"), Some(owner("b")));
        assert_eq!(cache.get("s4"), Some(owner("d")));
        // Replacing an entry of a full cache drops nothing.
        cache.put("s4", owner("e"));
        assert_eq!(cache.len(), 3);
        assert_eq!(cache.get("s2"), Some(owner("b")));
    }

    #[tokio::test(start_paused = true)]
    async fn a_fleet_of_ten_thousand_fits_and_a_larger_one_keeps_the_bound() {
        let cache = OwnerCache::new(Duration::from_secs(60), OWNER_CACHE_CAPACITY);
        let id = |i: usize| format!("store-{i}");
        for i in 0..10_000 {
            cache.put(&id(i), owner("a"));
        }
        assert_eq!(cache.len(), 10_000);
        assert!((0..10_000).all(|i| cache.get(&id(i)).is_some()));
        // Twice the capacity of distinct stores: the newest `capacity` stay, the rest went
        // oldest first.
        let n = 2 * OWNER_CACHE_CAPACITY;
        for i in 10_000..10_000 + n {
            cache.put(&id(i), owner("b"));
            assert!(cache.len() <= OWNER_CACHE_CAPACITY);
        }
        assert_eq!(cache.len(), OWNER_CACHE_CAPACITY);
        assert_eq!(cache.get(&id(10_000 + n - OWNER_CACHE_CAPACITY - 1)), None);
        assert!(cache.get(&id(10_000 + n - OWNER_CACHE_CAPACITY)).is_some());
        assert!(cache.get(&id(10_000 + n - 1)).is_some());
        assert!(cache.queued() <= 2 * OWNER_CACHE_CAPACITY + 1);
    }

    #[tokio::test(start_paused = true)]
    async fn replacing_and_forgetting_never_grow_the_queue_past_twice_the_capacity() {
        let cache = OwnerCache::new(Duration::from_secs(60), 64);
        // One store replaced and forgotten over and over behind a live oldest entry: every
        // put leaves a stale record, which compaction drops.
        cache.put("oldest", owner("a"));
        for i in 0..10_000 {
            cache.put("hot", owner(if i % 2 == 0 { "b" } else { "c" }));
            if i % 3 == 1 {
                cache.forget("hot");
            }
            assert!(cache.queued() <= 2 * 64 + 1, "{} at {i}", cache.queued());
        }
        assert_eq!(cache.get("oldest"), Some(owner("a")));
        assert_eq!(cache.get("hot"), Some(owner("c")));
        assert_eq!(cache.len(), 2);
        // Expired entries go at the next put, whatever the count.
        tokio::time::advance(Duration::from_secs(61)).await;
        cache.put("new", owner("d"));
        assert_eq!(cache.len(), 1);
        assert_eq!(cache.queued(), 1);
    }

    #[test]
    fn a_zero_ttl_caches_nothing() {
        let cache = OwnerCache::new(Duration::ZERO, 8);
        cache.put("s", owner("a"));
        assert!(cache.is_empty());
        assert_eq!(cache.get("s"), None);
    }
}
