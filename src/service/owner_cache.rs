//! A short-lived memory of which instance owns a store and where it is reached, so that a
//! forwarded call (`forward.rs`) does not read the registry every time.
//!
//! # Invariants
//!
//! - An entry is used for at most `ttl` after the registry read that made it
//!   ([`OwnerCache::get`] treats an older one as absent); `ttl` zero caches nothing.
//! - At most `capacity` entries: a full cache first drops what has expired, then the oldest.
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

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// How long an owner is remembered by default (`serve --owner-cache-ms`).
pub const DEFAULT_OWNER_CACHE_TTL: Duration = Duration::from_secs(1);

/// How many stores' owners are remembered at most.
pub const OWNER_CACHE_CAPACITY: usize = 4096;

/// A store's owner and the address it announced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub instance_id: String,
    pub addr: String,
}

struct Entry {
    owner: Owner,
    read_at: Instant,
}

/// Store id → its owner, as read from the registry less than `ttl` ago.
pub struct OwnerCache {
    ttl: Duration,
    capacity: usize,
    entries: Mutex<HashMap<String, Entry>>,
}

impl OwnerCache {
    pub fn new(ttl: Duration, capacity: usize) -> OwnerCache {
        OwnerCache {
            ttl,
            capacity,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The owner of `store_id` read less than `ttl` ago, if any.
    pub fn get(&self, store_id: &str) -> Option<Owner> {
        let entries = self.entries.lock().expect("owner cache lock");
        entries
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
        if entries.len() >= self.capacity && !entries.contains_key(store_id) {
            entries.retain(|_, e| e.read_at.elapsed() < self.ttl);
            if entries.len() >= self.capacity
                && let Some(oldest) = entries
                    .iter()
                    .min_by_key(|(_, e)| e.read_at)
                    .map(|(k, _)| k.clone())
            {
                entries.remove(&oldest);
            }
        }
        let read_at = Instant::now();
        entries.insert(store_id.to_string(), Entry { owner, read_at });
    }

    /// Forgets what is remembered of `store_id` (its owner said the store is not its, or could
    /// not be reached).
    pub fn forget(&self, store_id: &str) {
        self.entries
            .lock()
            .expect("owner cache lock")
            .remove(store_id);
    }

    /// How many entries are held (expired ones included until they are dropped).
    pub fn len(&self) -> usize {
        self.entries.lock().expect("owner cache lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
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

    #[test]
    fn a_zero_ttl_caches_nothing() {
        let cache = OwnerCache::new(Duration::ZERO, 8);
        cache.put("s", owner("a"));
        assert!(cache.is_empty());
        assert_eq!(cache.get("s"), None);
    }
}
