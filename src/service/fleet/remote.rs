//! The stores other instances own (a shared PostgreSQL registry), as the registry last heard
//! of them: their records, their owners' last health reports and heartbeats, and whether the
//! owner has gone silent (`owner_silent_after`). Read-only: nothing here writes.
//!
//! The fleet's view ([`Fleet::remote`]) reads each table once: the `stores` rows (which carry
//! each store's owner and since when, so the owners of this instance's stores come from the
//! same read), every health report and every heartbeat. One store's view
//! ([`Fleet::remote_one`]) reads that store's rows only.

use std::collections::BTreeMap;

use super::{Fleet, FleetError};
use crate::registry::{HealthRow, Owner, StoreRecord, StoreReport};

/// A store another instance owns, as the shared registry last heard of it.
pub struct RemoteStore {
    pub record: StoreRecord,
    /// The owner's last report, if it ever reported.
    pub health: Option<crate::health::StoreHealth>,
    /// When the owner was last heard from (its report of this store, or a later heartbeat
    /// while that report still stood); `None` if it never reported this store.
    pub reported_at_ms: Option<i64>,
    /// The owner has not reported for longer than `owner_silent_after`.
    pub silent: bool,
}

/// What [`Fleet::remote`] read: the other instances' stores, and every registered store's
/// owner (this instance's too), from the one read of the rows.
pub struct Remote {
    pub stores: Vec<RemoteStore>,
    pub owners: BTreeMap<String, Owner>,
}

fn now_ms() -> i64 {
    crate::units::unix_now_ms()
}

impl Fleet {
    /// The stores other instances own, with what they last reported, and every store's owner.
    pub async fn remote(&self) -> Result<Remote, FleetError> {
        let me = &self.config().instance_id;
        let records = self.registry().list_stores(None).await?;
        let mut health: BTreeMap<String, HealthRow> = self
            .registry()
            .all_health()
            .await?
            .into_iter()
            .map(|h| (h.store_id.clone(), h))
            .collect();
        let heartbeats = self.registry().heartbeats().await?;
        let owners = records
            .iter()
            .map(|r| {
                let owner = Owner {
                    instance_id: r.instance_id.clone(),
                    since_ms: r.owner_since_ms,
                };
                (r.store_id.clone(), owner)
            })
            .collect();
        let stores = records
            .into_iter()
            .filter(|r| &r.instance_id != me)
            .map(|record| {
                let row = health.remove(&record.store_id);
                let heartbeat = heartbeats.get(&record.instance_id).copied();
                self.remote_store(record, row, heartbeat)
            })
            .collect();
        Ok(Remote { stores, owners })
    }

    /// One store another instance owns, from its rows only; `None` when no store has this id,
    /// or it is this instance's own (with no worker here).
    pub async fn remote_one(&self, store_id: &str) -> Result<Option<RemoteStore>, FleetError> {
        let Some(StoreReport {
            record,
            health,
            heartbeat_ms,
        }) = self.registry().store_report(store_id).await?
        else {
            return Ok(None);
        };
        if record.instance_id == self.config().instance_id {
            return Ok(None);
        }
        Ok(Some(self.remote_store(record, health, heartbeat_ms)))
    }

    fn remote_store(
        &self,
        record: StoreRecord,
        row: Option<HealthRow>,
        heartbeat: Option<i64>,
    ) -> RemoteStore {
        let silent_ms = crate::units::millis_i64(self.config().owner_silent_after);
        // A row is rewritten only when the health changes: the owner's heartbeat says whether
        // the unchanged report still stands.
        let reported_at_ms = row
            .as_ref()
            .map(|r| r.reported_at_ms.max(heartbeat.unwrap_or(i64::MIN)));
        RemoteStore {
            health: row.and_then(|r| serde_json::from_str(&r.health_json).ok()),
            silent: reported_at_ms.is_none_or(|t| now_ms() - t > silent_ms),
            reported_at_ms,
            record,
        }
    }
}
