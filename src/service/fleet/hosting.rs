//! Starting and stopping the worker of a store whose owner changed while this process runs:
//! a store this instance was given (a failover claim, `super::super::failover`, or a planned
//! move, `super::super::moves`) and one taken from it.
//!
//! [`Fleet::host`] starts a worker the way [`Fleet::start`] respawns a registered store (its
//! pause and its last drill from the registry); the bucket lease then decides when it may
//! write (it waits as a standby while the previous owner's lease holds). [`Fleet::unhost`]
//! takes the store out of the fleet first (calls for it are forwarded to the owner the
//! registry names from then on), then stops its worker (flushing only when asked: a worker
//! whose store was claimed away may no longer hold its lease, and must not try to write) and
//! ends its position streams. Nothing is deleted: not the row, not the store lease of another
//! holder (a release deletes the lease object only while it is this worker's).

use std::sync::Arc;

use super::{Fleet, FleetError, StoreEntry};
use crate::registry::StoreRecord;

impl Fleet {
    /// Starts `record`'s worker here, unless one runs already (then that one). One at a time,
    /// so the reconcile and a move's `StartStore` never both start one store.
    pub(in crate::service) async fn host(
        &self,
        record: StoreRecord,
    ) -> Result<Arc<StoreEntry>, FleetError> {
        let _one = self.hosting.lock().await;
        if let Ok(entry) = self.get(&record.store_id) {
            return Ok(entry);
        }
        let id = record.store_id.clone();
        let pause = self.registry.pauses().await?.remove(&id);
        let drill = self.registry.drills().await?.remove(&id);
        let pause = pause.map(|p| crate::service::pause::from_record(&p));
        let entry = self.spawn(record, pause).await?;
        if let Some(d) = drill {
            entry
                .handle
                .set_drill(crate::service::drill::from_record(&d));
        }
        Ok(entry)
    }

    /// Takes `store_id` out of this fleet and stops its worker (see the module docs); `None`
    /// when it did not run here.
    pub(in crate::service) async fn unhost(
        &self,
        store_id: &str,
        flush: bool,
    ) -> Option<Arc<StoreEntry>> {
        let entry = self
            .stores
            .write()
            .expect("not poisoned")
            .remove(store_id)?;
        if flush {
            entry.handle.resume().await;
        }
        entry.handle.shutdown(flush).await;
        entry.source.close();
        crate::service::store_metrics::forget_store(store_id);
        Some(entry)
    }
}
