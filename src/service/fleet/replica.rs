//! A store's replica ([`StoreOptions::replica`](super::StoreOptions)): a second worker of the
//! store, shipping the same store directory to a second destination (see `options/check.rs`
//! for what Register accepts).
//!
//! The replica worker is built as the primary is, by the one builder (`start.rs`: same
//! options, same directory handle and position source, so what a node reports counts for
//! both) with its own bucket (its URL's
//! endpoint, region and profile: `crate::bucket::url`), its own usage, its own bucket lease
//! (`lease` under the replica's prefix, fenced by this instance's lease of the replica's lease
//! root) and its own supervisor, hence its own health, lag and cost. Nothing of the primary
//! waits for it: its steps, retries and backoff are its own; a replica whose bucket is gone
//! is unhealthy in `StoreHealth.replica` while the store's own health is the primary's.
//! Durable acknowledgements (sync durability) come from the primary only.
//!
//! A replica that cannot even be started (its lease root or bucket cannot be opened: no
//! region, say) leaves the primary running and shows as an unhealthy replica naming why.
//!
//! # What a crash leaves
//! What a crash of any worker leaves, in the replica's prefix; nothing local (both workers
//! share `backup.lineage`, written once by whichever needs it first).

use std::sync::Arc;

use super::start::WorkerSpec;
use super::{Fleet, StoreOptions};
use crate::bucket;
use crate::health::Pause;
use crate::registry::StoreRecord;
use crate::store::dir::StoreDir;
use crate::wal_source::StreamedSource;
use crate::worker::BackupHandle;

/// A store's replica: its destination and its running worker, or why it is not running.
pub struct ReplicaEntry {
    /// As registered (`options.replica`).
    pub url: String,
    pub running: Result<RunningReplica, String>,
}

/// A replica's worker and what it costs.
pub type RunningReplica = super::start::Running;

impl ReplicaEntry {
    /// What changes when the replica's health or usage does (for `WatchHealth`'s marks).
    pub fn mark(&self) -> (u64, u64) {
        match &self.running {
            Ok(r) => (r.handle.health_serial(), r.usage.requests_so_far()),
            Err(_) => (0, 0),
        }
    }

    /// The replica's handle, when its worker runs.
    pub fn handle(&self) -> Option<&BackupHandle> {
        self.running.as_ref().ok().map(|r| &r.handle)
    }
}

impl Fleet {
    /// Starts the replica's worker of `record`, if its options name one: see the module docs.
    pub(super) async fn spawn_replica(
        &self,
        record: &StoreRecord,
        options: &StoreOptions,
        store: &StoreDir,
        source: &Arc<StreamedSource>,
        pause: Option<Pause>,
    ) -> Option<ReplicaEntry> {
        let url = options.replica()?.to_string();
        let running = self
            .start_replica(record, options, &url, store, source, pause)
            .await;
        if let Err(why) = &running {
            tracing::error!(store_id = %record.store_id, replica = %bucket::url::without_query(&url), error = %why, "the replica's worker could not start; the primary runs on");
        }
        Some(ReplicaEntry { url, running })
    }

    async fn start_replica(
        &self,
        record: &StoreRecord,
        options: &StoreOptions,
        url: &str,
        store: &StoreDir,
        source: &Arc<StreamedSource>,
        pause: Option<Pause>,
    ) -> Result<RunningReplica, String> {
        self.start_worker(WorkerSpec {
            destination: url,
            store_id: &record.store_id,
            lease_name: format!("{} (replica)", record.store_id),
            options,
            store,
            source,
            pause,
            events: None,
        })
        .await
        .map_err(|e| e.to_string())
    }
}
