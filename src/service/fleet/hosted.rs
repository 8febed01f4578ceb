//! The stores this instance hosts, in one map keyed by store id, each with its role: a
//! primary (its backup worker, and its replica's when it has one: [`StoreEntry`]) or a
//! standby (its follower: [`StandbyEntry`]). One map, so a store has exactly one role here
//! at any moment: a promotion replaces the standby with the primary under one lock, and no
//! call can find a store both following and backing up its destination.
//!
//! # What a crash leaves
//! Nothing: the map is the process's; the registry rows it is rebuilt from at start say each
//! store's role (`StoreOptions::standby`).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use super::{StandbyEntry, StoreEntry};

/// A hosted store, by role.
#[derive(Clone)]
pub enum Hosted {
    /// Backed up by a worker of this instance (and its replica's).
    Primary(Arc<StoreEntry>),
    /// Kept current from its destination, never written to it, until promoted.
    Standby(Arc<StandbyEntry>),
}

/// Every store this instance hosts.
#[derive(Default)]
pub(super) struct HostedMap(RwLock<BTreeMap<String, Hosted>>);

impl HostedMap {
    pub fn get(&self, store_id: &str) -> Option<Hosted> {
        self.0.read().expect("not poisoned").get(store_id).cloned()
    }

    pub fn standby(&self, store_id: &str) -> Option<Arc<StandbyEntry>> {
        match self.get(store_id)? {
            Hosted::Standby(s) => Some(s),
            Hosted::Primary(_) => None,
        }
    }

    /// Hosts `store_id` in `role`, in place of whatever role it had here.
    pub fn insert(&self, store_id: &str, role: Hosted) {
        self.0
            .write()
            .expect("not poisoned")
            .insert(store_id.to_string(), role);
    }

    /// Takes `store_id` out if it is a standby here.
    pub fn remove_standby(&self, store_id: &str) -> Option<Arc<StandbyEntry>> {
        let mut map = self.0.write().expect("not poisoned");
        match map.get(store_id)? {
            Hosted::Standby(_) => match map.remove(store_id)? {
                Hosted::Standby(s) => Some(s),
                Hosted::Primary(_) => None,
            },
            Hosted::Primary(_) => None,
        }
    }

    /// Takes `store_id` out if it is a primary here.
    pub fn remove_primary(&self, store_id: &str) -> Option<Arc<StoreEntry>> {
        let mut map = self.0.write().expect("not poisoned");
        match map.get(store_id)? {
            Hosted::Primary(_) => match map.remove(store_id)? {
                Hosted::Primary(e) => Some(e),
                Hosted::Standby(_) => None,
            },
            Hosted::Standby(_) => None,
        }
    }

    pub fn primaries(&self) -> Vec<Arc<StoreEntry>> {
        let map = self.0.read().expect("not poisoned");
        map.values()
            .filter_map(|h| match h {
                Hosted::Primary(e) => Some(e.clone()),
                Hosted::Standby(_) => None,
            })
            .collect()
    }

    pub fn standbys(&self) -> Vec<Arc<StandbyEntry>> {
        let map = self.0.read().expect("not poisoned");
        map.values()
            .filter_map(|h| match h {
                Hosted::Standby(s) => Some(s.clone()),
                Hosted::Primary(_) => None,
            })
            .collect()
    }
}
