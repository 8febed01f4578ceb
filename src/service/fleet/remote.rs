//! The stores other instances own (a shared PostgreSQL registry), as the registry last heard
//! of them: their records, their owners' last health reports and heartbeats, and whether the
//! owner has gone silent (`owner_silent_after`). Read-only: nothing here writes.
//!
//! The fleet's view ([`Fleet::remote`]) is two reads: every store's owner and since when (three
//! columns of `stores`), and the rows, health reports and owners' heartbeats of the stores
//! other instances own, joined (none of this instance's own stores' rows or reports, which its
//! workers know better). One store's view ([`Fleet::remote_one`]) reads that store's rows only.

use std::collections::BTreeMap;

use super::{Fleet, FleetError};
use crate::registry::{HealthRow, Owner, StoreRecord, StoreReport};

/// A store another instance owns, as the shared registry last heard of it.
#[derive(Debug, PartialEq)]
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
/// owner (this instance's too).
#[derive(Debug, PartialEq)]
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
        let owners = self.registry().owners().await?;
        let stores = self
            .registry()
            .reports_of_others(me)
            .await?
            .into_iter()
            .map(|r| self.remote_store(r.record, r.health, r.heartbeat_ms))
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
