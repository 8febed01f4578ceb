//! The stores other instances own (a shared PostgreSQL registry), as the registry last heard
//! of them: their records, their owners' last health reports and heartbeats, and whether the
//! owner has gone silent (`owner_silent_after`). Read-only: nothing here writes.

use std::collections::BTreeMap;

use super::fleet::{Fleet, FleetError};
use crate::registry::StoreRecord;

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

fn now_ms() -> i64 {
    crate::units::unix_now_ms()
}

impl Fleet {
    /// The stores other instances own, with what they last reported.
    pub async fn remote(&self) -> Result<Vec<RemoteStore>, FleetError> {
        let me = &self.config().instance_id;
        let records = self.registry().list_stores(None).await?;
        let mut health: BTreeMap<String, crate::registry::HealthRow> = self
            .registry()
            .all_health()
            .await?
            .into_iter()
            .map(|h| (h.store_id.clone(), h))
            .collect();
        let heartbeats = self.registry().heartbeats().await?;
        let silent_ms = crate::units::millis_i64(self.config().owner_silent_after);
        let now = now_ms();
        Ok(records
            .into_iter()
            .filter(|r| &r.instance_id != me)
            .map(|record| {
                let row = health.remove(&record.store_id);
                // A row is rewritten only when the health changes: the owner's heartbeat says
                // whether the unchanged report still stands.
                let heartbeat = heartbeats.get(&record.instance_id).copied();
                let reported_at_ms = row
                    .as_ref()
                    .map(|r| r.reported_at_ms.max(heartbeat.unwrap_or(i64::MIN)));
                RemoteStore {
                    health: row.and_then(|r| serde_json::from_str(&r.health_json).ok()),
                    silent: reported_at_ms.is_none_or(|t| now - t > silent_ms),
                    reported_at_ms,
                    record,
                }
            })
            .collect())
    }
}
