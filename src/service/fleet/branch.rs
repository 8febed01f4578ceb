//! `Branch`: a branch of a registered store's prefix (`crate::branch`), and with a store
//! directory, its restore there and registration, as `Adopt` does; and what each branch of a
//! store running here is charged (`crate::pins::Charge`), for its store's bill.
//!
//! # What a crash leaves
//! What `crate::branch::create` leaves (no branch, or a complete one), then what `Adopt`
//! leaves (no store, or a registered one).

use std::collections::HashMap;
use std::sync::Arc;

use super::admission::{destination, limits::FieldError};
use super::options::StoreOptions;
use super::{Fleet, FleetError, NewStore, StoreEntry};
use crate::branch::{self, BranchReport, ForkAt};
use crate::registry::StoreRecord;
use crate::restore::{self, RestoreOptions};

/// What a `Branch` did: the branch, and with a directory, the store registered and its token.
pub struct Branched {
    pub report: BranchReport,
    pub store: Option<(StoreRecord, String)>,
}

impl Fleet {
    /// Cuts a branch of `store_id`'s prefix at `at` into `destination`; with `new` (its
    /// destination the branch's), restores and registers it.
    pub async fn branch(
        &self,
        store_id: &str,
        at: restore::Point,
        destination: &str,
        new: Option<NewStore>,
        peer: Option<String>,
    ) -> Result<Branched, FleetError> {
        let at = match (at.commit_seq, at.time_ms) {
            (Some(n), None) => ForkAt::Commit(n),
            (None, Some(t)) => ForkAt::Time(t),
            _ => {
                return Err(FieldError("give one of at_commit_seq and at_time".into()).into());
            }
        };
        let checked = destination::check(destination, self.placement())?;
        // One lookup: the store's destination, and its options (a branch of a write-once store
        // is write-once, locked as the store's objects are).
        let record = match self.get(store_id) {
            Ok(e) => e.record.clone(),
            Err(FleetError::NotHere(_)) => self.registered(store_id).await?,
            Err(e) => return Err(e),
        };
        let parent_url = record.destination.clone();
        let options = StoreOptions::as_registered(&record).unwrap_or_default();
        let lock = options.apply(&self.config().worker).lock();
        let parent = self.buckets.read_write(&parent_url).open().await?;
        let opts = RestoreOptions {
            keys: self.restore_keys(),
            ..RestoreOptions::default()
        };
        let url = checked.url(destination);
        let report = branch::create(parent, &parent_url, &url, at, &opts, lock).await?;
        tracing::info!(store_id, branch = %report.branch, commit_seq = report.commit_seq, "branched");
        let store = match new {
            None => None,
            Some(new) => {
                let (record, token, _) = self.adopt(new, restore::Point::default(), peer).await?;
                Some((record, token))
            }
        };
        Ok(Branched { report, store })
    }

    /// Gathers what the workers of `entries` found each branch cut from their prefixes is
    /// charged (`crate::pins::Charge`), by branch URL.
    pub fn refresh_branch_charges(&self, entries: &[Arc<StoreEntry>]) {
        let mut by_branch: HashMap<String, u64> = HashMap::new();
        for e in entries {
            for c in e.handle.counters().branch_charges() {
                let sum = by_branch.entry(c.branch).or_default();
                *sum = sum.saturating_add(c.bytes);
            }
        }
        *self
            .branch_charges
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = by_branch;
    }

    /// The bytes a store whose destination is `url` keeps alive in a parent's prefix only
    /// through its pin, as last gathered (0 when it is no branch, or its parent runs
    /// elsewhere).
    pub fn pinned_in_parent(&self, url: &str) -> u64 {
        let Ok(url) = crate::branch::prefix_url(url) else {
            return 0;
        };
        self.branch_charges
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&url)
            .copied()
            .unwrap_or(0)
    }
}
