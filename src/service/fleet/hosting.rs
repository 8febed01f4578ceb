//! Starting and stopping the worker of a store whose owner changed while this process runs:
//! a store this instance was given (a failover claim, `super::super::failover`, or a planned
//! move, `super::super::moves`) and one taken from it; and the start of a registered store's
//! worker with what the registry holds for it, which [`Fleet::start`] uses too.
//!
//! [`Fleet::host`] starts a worker the way [`Fleet::start`] respawns a registered store
//! ([`Fleet::respawn`]: its pause and its last drill from the registry; `host` reads that
//! store's rows only, `start` every row once); the bucket lease then decides when it may
//! write (it waits as a standby while the previous owner's lease holds). [`Fleet::unhost`]
//! takes the store out of the fleet first (calls for it are forwarded to the owner the
//! registry names from then on), then stops its worker without a flush (a worker whose store
//! was claimed away may no longer hold its lease, and must not try to write; a planned move
//! flushes before it changes the row) and ends its position streams. Nothing is deleted: not
//! the row, not the store lease of another holder (a release deletes the lease object only
//! while it is this worker's).

use std::sync::Arc;

use super::{Fleet, FleetError, StoreEntry, StoreOptions};
use crate::health::{DrillResult, Pause};
use crate::registry::{PauseRecord, StoreRecord};

impl Fleet {
    /// Starts `record`'s worker here, unless one runs already (then that one). One at a time,
    /// so the reconcile and a move's `StartStore` never both start one store.
    pub(in crate::service) async fn host(&self, record: StoreRecord) -> Result<(), FleetError> {
        let _one = self.hosting.lock().await;
        if self.get(&record.store_id).is_ok() || self.standby(&record.store_id).is_some() {
            return Ok(());
        }
        let pause = self.registry.pause(&record.store_id).await?;
        let drill = self.registry.drill(&record.store_id).await?;
        self.respawn(record, pause, drill).await
    }

    /// Starts a registered store's worker, paused with its pause from the registry and
    /// showing its last drill (a standby's follower instead, for a standby row).
    pub(super) async fn respawn(
        &self,
        record: StoreRecord,
        pause: Option<PauseRecord>,
        drill: Option<DrillResult>,
    ) -> Result<(), FleetError> {
        let pause = pause.map(|p| pause_of(&p));
        let options = StoreOptions::of_row(&record)?;
        if options.is_standby() {
            // A standby's follower (`standby.rs`): no worker, so no pause and no drill.
            self.spawn_standby(record, options).await?;
            return Ok(());
        }
        let entry = self.spawn(record, options, pause).await?;
        if let Some(d) = drill {
            entry.handle.set_drill(d);
        }
        Ok(())
    }

    /// Takes `store_id` out of this fleet and stops its worker, without a flush (see the
    /// module docs); `None` when it did not run here.
    pub(in crate::service) async fn unhost(&self, store_id: &str) -> Option<Arc<StoreEntry>> {
        if let Some(s) = self.remove_standby(store_id).await {
            tracing::info!(store_id = %s.record.store_id, "stopped following a standby claimed away");
            return None;
        }
        let entry = self.hosted.remove_primary(store_id)?;
        entry.shutdown(false).await;
        entry.source.close();
        super::store_metrics::forget_store(store_id);
        Some(entry)
    }
}

/// The pause a store's registry row holds, as the worker takes it.
fn pause_of(r: &PauseRecord) -> Pause {
    Pause {
        reason: r.reason.clone(),
        paused_at_unix_ms: r.paused_at_ms,
        until_unix_ms: r.until_ms,
    }
}
