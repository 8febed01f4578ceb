//! Deregistering a store: its worker stopped (flushed or not), its row and tokens removed;
//! a store whose owning instance has gone silent may be deregistered from another.

#[allow(unused_imports)]
use super::*;

impl Fleet {
    pub async fn deregister(
        &self,
        store_id: &str,
        flush: bool,
        peer: Option<String>,
    ) -> Result<(), FleetError> {
        let entry = match self.get(store_id) {
            Ok(entry) => entry,
            Err(FleetError::IsStandby { .. }) => {
                return self.deregister_standby(store_id, peer).await;
            }
            Err(FleetError::NotHere(_)) => {
                return self
                    .deregister_of_a_silent_owner(store_id, flush, peer)
                    .await;
            }
            Err(e) => return Err(e),
        };
        if flush {
            // A flush asked for is an upload asked for: a paused store flushes too.
            entry.handle.resume().await;
            if let Some(h) = entry.replica.as_ref().and_then(ReplicaEntry::handle) {
                h.resume().await;
            }
        }
        entry.shutdown(flush).await;
        self.registry.delete_store(store_id).await?;
        self.hosted.remove_primary(store_id);
        // The node's streams end (NOT_FOUND, "was deregistered"); none attaches any more.
        entry.source.close();
        store_metrics::forget_store(store_id);
        let done = Done::on("deregister", &entry.record, format!("flush={flush}"), peer);
        self.record(done, Some(deregistered(store_id, flush))).await;
        Ok(())
    }

    /// Deregisters a store another instance owns, when that instance has gone silent (its
    /// heartbeat is older than `owner_silent_after`, or it never wrote one): after a host loss
    /// only the registry row is left of the store, and while it stands the store's prefix
    /// cannot be adopted elsewhere. An owner still heard from keeps its store: deregister it
    /// there, where its worker is stopped first. Should a silent owner come back, its worker
    /// still runs until it stops (the bucket lease keeps one writer meanwhile); it is not
    /// respawned.
    pub(super) async fn deregister_of_a_silent_owner(
        &self,
        store_id: &str,
        flush: bool,
        peer: Option<String>,
    ) -> Result<(), FleetError> {
        let record = self.registered(store_id).await?;
        let owner = &record.instance_id;
        let heard_ms = self.registry.heartbeats().await?.get(owner).copied();
        let silent_ms = crate::units::millis_i64(self.config.owner_silent_after);
        // This instance's own store without a worker (it failed to respawn): only the row is left.
        let mine = *owner == self.config.instance_id;
        if !mine && heard_ms.is_some_and(|t| now_ms().saturating_sub(t) <= silent_ms) {
            return Err(FleetError::OwnerAlive {
                store: store_id.to_string(),
                owner: owner.clone(),
                silent_ms,
            });
        }
        self.registry.delete_store(store_id).await?;
        tracing::warn!(store_id, owner = %owner, "deregistered a store that had no worker here");
        let done = Done {
            action: "deregister",
            store_id,
            store_dir: &record.store_dir,
            detail: if mine {
                "no worker was running: the registry row only".to_string()
            } else {
                format!("owner {owner} silent: its registry row only")
            },
            peer,
        };
        self.record(done, Some(deregistered(store_id, flush))).await;
        Ok(())
    }
}
