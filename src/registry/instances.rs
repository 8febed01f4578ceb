//! The instances sharing a registry: where each answers the others' calls and which failover
//! group it belongs to, beside its heartbeat (the `instances` table).
//!
//! An instance announces itself ([`Registry::announce_instance`]) once it holds its instance
//! claim, so a second process refused the id never overwrites the live one's address. The
//! row is never deleted: a stopped instance's address stays, and a call forwarded to it finds
//! nobody listening and answers `UNAVAILABLE` naming it. Its heartbeat
//! ([`Registry::report_health`]) says whether it is alive.
//!
//! The table's `started_at_ms` column (migration 0007) is no longer written or read: nothing
//! showed it (the process's start is in `instance_claims`). It keeps its default of 0; no
//! migration drops it.
//!
//! One statement per call; a crash leaves the row as it was or as announced.

use sqlx::Row;

use super::{Backend, Registry, RegistryError};

/// One instance as the registry knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceInfo {
    pub instance_id: String,
    /// `HOST:PORT` where it answers calls; empty when it announced none.
    pub advertise_address: String,
    /// Its failover group; empty: none.
    pub failover_group: String,
    /// Its last heartbeat, milliseconds since the Unix epoch (0: never).
    pub heartbeat_ms: i64,
}

impl Registry {
    /// Records where `instance_id` answers and its group, and counts as a heartbeat.
    pub async fn announce_instance(
        &self,
        instance_id: &str,
        advertise_address: &str,
        failover_group: &str,
        at_ms: i64,
    ) -> Result<(), RegistryError> {
        const SQL: &str = "INSERT INTO instances (instance_id, heartbeat_ms, advertise_address, \
                           failover_group) VALUES ($1, $2, $3, $4) \
                           ON CONFLICT (instance_id) DO UPDATE SET \
                           heartbeat_ms = excluded.heartbeat_ms, \
                           advertise_address = excluded.advertise_address, \
                           failover_group = excluded.failover_group";
        with_pool!(self, |pool| {
            sqlx::query(SQL)
                .bind(instance_id)
                .bind(at_ms)
                .bind(advertise_address)
                .bind(failover_group)
                .execute(pool)
                .await
                .map(|_| ())
        })
        .map_err(|e| self.err(e))
    }

    /// One instance, if it ever reported or announced itself.
    pub async fn instance(&self, instance_id: &str) -> Result<Option<InstanceInfo>, RegistryError> {
        const SQL: &str = "SELECT instance_id, heartbeat_ms, advertise_address, failover_group \
                           FROM instances WHERE instance_id = $1";
        with_pool!(self, |pool| {
            let row = sqlx::query(SQL)
                .bind(instance_id)
                .fetch_optional(pool)
                .await;
            match row {
                Err(e) => Err(e),
                Ok(None) => Ok(None),
                Ok(Some(r)) => info_from_row(&r).map(Some),
            }
        })
        .map_err(|e| self.err(e))
    }

    /// The instance that owns `store_id` and the address it announced (empty: none, or it never
    /// announced itself), in one read; `None` when no such store is registered.
    pub async fn store_owner(
        &self,
        store_id: &str,
    ) -> Result<Option<(String, String)>, RegistryError> {
        const SQL: &str = "SELECT s.instance_id, i.advertise_address FROM stores s \
                           LEFT JOIN instances i ON i.instance_id = s.instance_id \
                           WHERE s.store_id = $1";
        with_pool!(self, |pool| {
            let row = sqlx::query(SQL).bind(store_id).fetch_optional(pool).await;
            row.and_then(|row| {
                row.map(|r| {
                    let owner: String = r.try_get("instance_id")?;
                    let addr: Option<String> = r.try_get("advertise_address")?;
                    Ok((owner, addr.unwrap_or_default()))
                })
                .transpose()
            })
        })
        .map_err(|e| self.err(e))
    }

    /// Every instance that ever reported or announced itself, by instance id.
    pub async fn instances(&self) -> Result<Vec<InstanceInfo>, RegistryError> {
        const SQL: &str = "SELECT instance_id, heartbeat_ms, advertise_address, failover_group \
                           FROM instances ORDER BY instance_id";
        with_pool!(self, |pool| {
            let rows = sqlx::query(SQL).fetch_all(pool).await;
            rows.and_then(|rows| rows.iter().map(info_from_row).collect())
        })
        .map_err(|e| self.err(e))
    }
}

fn info_from_row<R: Row>(r: &R) -> Result<InstanceInfo, sqlx::Error>
where
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    for<'a> String: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
    for<'a> i64: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
{
    Ok(InstanceInfo {
        instance_id: r.try_get("instance_id")?,
        advertise_address: r.try_get("advertise_address")?,
        failover_group: r.try_get("failover_group")?,
        heartbeat_ms: r.try_get("heartbeat_ms")?,
    })
}
