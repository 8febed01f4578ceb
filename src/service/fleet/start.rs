//! The one builder of a store's worker: the primary's ([`Fleet::spawn`]), the replica's
//! (`replica.rs`) and a promoted standby's (`promote.rs`, through `spawn`) are all started
//! here, the same way: the destination's bucket opened read-write with a usage of its own,
//! the store's options laid over the service's worker configuration, the worker on the
//! store's one directory handle and position source, its bucket lease (TTL and conditional
//! writes as the service's) fenced by this instance's lease of the destination's lease root,
//! and its runner spawned paused (or not) on the fleet's tracker with a child of the fleet's
//! shutdown token.
//!
//! # What a crash leaves
//! Nothing of its own: a worker is only a process's; what its steps leave is the worker's
//! (`crate::worker`), and the registry row that a restart respawns it from is written before
//! it is started.

use std::sync::Arc;

use super::{Fleet, StoreOptions};
use crate::bucket::OpenError;
use crate::bucket::usage::Usage;
use crate::events::Emitter;
use crate::health::Pause;
use crate::lease::{LeaseAcquirer, LeaseConfig};
use crate::store::dir::StoreDir;
use crate::wal_source::StreamedSource;
use crate::worker::{BackupHandle, BackupWorker};

/// What one worker of a store is started with.
pub(super) struct WorkerSpec<'a> {
    /// The URL it backs up to: the store's destination, or its replica.
    pub destination: &'a str,
    /// The store's id: its throttle scope's name (the primary's and the replica's one scope).
    pub store_id: &'a str,
    /// Its bucket lease's holder name (the store id; the replica's says so).
    pub lease_name: String,
    pub options: &'a StoreOptions,
    /// The store's directory handle and position source, shared by its workers.
    pub store: &'a StoreDir,
    pub source: &'a Arc<StreamedSource>,
    pub pause: Option<Pause>,
    /// Where its events go (the primary's: the store's; a replica publishes none).
    pub events: Option<Emitter>,
}

/// A started worker and what it costs.
pub struct Running {
    pub handle: BackupHandle,
    /// Every request of the worker, its lease and its retention, at the bucket.
    pub usage: Arc<Usage>,
}

/// Why a worker could not start.
#[derive(Debug, thiserror::Error)]
pub(super) enum StartError {
    #[error(transparent)]
    Bucket(#[from] OpenError),
    #[error("its lease root: {0}")]
    LeaseRoot(String),
}

impl Fleet {
    /// Starts one worker of a store as the module docs say.
    pub(super) async fn start_worker(&self, spec: WorkerSpec<'_>) -> Result<Running, StartError> {
        let usage = Usage::new();
        let scope = (self.buckets.throttle()).store(spec.store_id, &spec.options.limit_set());
        let bucket = self
            .buckets
            .read_write(spec.destination)
            .lane(self.buckets.lane(spec.destination, Some(scope)))
            .usage(usage.clone())
            .open()
            .await?;
        let config = spec.options.apply(&self.config.worker);
        // Every change of a streamed position is a report, which the API nudges the worker
        // with (`api.rs`); with no stream the position comes from the directory, whose
        // changes the worker's watch signals.
        let mut worker = BackupWorker::new(spec.store.clone(), bucket, spec.source.clone(), config)
            .with_signalled_positions();
        if let Some(events) = spec.events {
            worker = worker.with_events(events);
        }
        let lease = LeaseConfig {
            ttl: self.config.lease_ttl,
            conditional: self.config.worker.conditional_writes,
            ..LeaseConfig::new(spec.lease_name)
        };
        let fence = self
            .leases
            .fence_for(spec.destination)
            .await
            .map_err(|e| StartError::LeaseRoot(e.to_string()))?;
        let acquirer = LeaseAcquirer::new(worker.bucket(), lease).fenced(fence);
        let handle = worker.spawn_paused(
            acquirer,
            spec.pause,
            self.shutdown.child_token(),
            &self.tasks,
        );
        Ok(Running { handle, usage })
    }
}
