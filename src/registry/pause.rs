//! Paused stores: the `store_pauses` table, one row per store whose uploads an operator paused
//! (the service's `Pause`), so that a pause survives a restart of the service.
//!
//! Each call is one statement. The service writes the row before it pauses the worker and
//! deletes it before it resumes it, so a crash between the two leaves the registry saying
//! what the next start does: a store whose row stands starts paused, one whose row is gone
//! starts shipping. A row goes with its store (`ON DELETE CASCADE`).

use std::collections::BTreeMap;

use sqlx::Row;

use super::{Backend, Registry, RegistryError};

/// One paused store's pause.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PauseRecord {
    /// Why, as the operator said (bounded and printable: the service checks it).
    pub reason: String,
    /// Since when, milliseconds since the Unix epoch.
    pub paused_at_ms: i64,
    /// The deadline, milliseconds since the Unix epoch: past it the store is unhealthy.
    pub until_ms: i64,
}

impl Registry {
    /// Records (or replaces) the pause of `store_id`. `false`, and nothing written, when no
    /// such store is registered (deregistered a moment ago).
    pub async fn set_pause(
        &self,
        store_id: &str,
        pause: &PauseRecord,
    ) -> Result<bool, RegistryError> {
        // `WHERE EXISTS` answers a store deleted meanwhile with no row rather than a
        // foreign-key violation; SQLite needs a WHERE before ON CONFLICT anyway.
        const SQL: &str = "INSERT INTO store_pauses (store_id, reason, paused_at_ms, until_ms) \
                           SELECT CAST($1 AS TEXT), CAST($2 AS TEXT), CAST($3 AS BIGINT), \
                           CAST($4 AS BIGINT) \
                           WHERE EXISTS (SELECT 1 FROM stores WHERE store_id = $1) \
                           ON CONFLICT (store_id) DO UPDATE SET \
                           reason = excluded.reason, \
                           paused_at_ms = excluded.paused_at_ms, \
                           until_ms = excluded.until_ms";
        with_pool!(self, |pool| {
            sqlx::query(SQL)
                .bind(store_id)
                .bind(&pause.reason)
                .bind(pause.paused_at_ms)
                .bind(pause.until_ms)
                .execute(pool)
                .await
                .map(|r| r.rows_affected() > 0)
        })
        .map_err(|e| self.err(e))
    }

    /// Removes the pause of `store_id`; whether there was one.
    pub async fn clear_pause(&self, store_id: &str) -> Result<bool, RegistryError> {
        const SQL: &str = "DELETE FROM store_pauses WHERE store_id = $1";
        with_pool!(self, |pool| {
            sqlx::query(SQL)
                .bind(store_id)
                .execute(pool)
                .await
                .map(|r| r.rows_affected() > 0)
        })
        .map_err(|e| self.err(e))
    }

    /// Every paused store's pause, by `store_id` (read once when the service starts).
    pub async fn pauses(&self) -> Result<BTreeMap<String, PauseRecord>, RegistryError> {
        const SQL: &str = "SELECT store_id, reason, paused_at_ms, until_ms FROM store_pauses";
        with_pool!(self, |pool| {
            let rows = sqlx::query(SQL).fetch_all(pool).await;
            rows.map_err(|e| self.err(e))?
                .iter()
                .map(|r| Ok((r.try_get::<String, _>("store_id")?, pause_from_row(r)?)))
                .collect::<Result<_, sqlx::Error>>()
                .map_err(|e| self.err(e))
        })
    }

    /// The pause of one store, if it is paused: its row only (a store started while the
    /// service runs, `service::fleet::hosting`).
    pub async fn pause(&self, store_id: &str) -> Result<Option<PauseRecord>, RegistryError> {
        const SQL: &str =
            "SELECT reason, paused_at_ms, until_ms FROM store_pauses WHERE store_id = $1";
        with_pool!(self, |pool| {
            let row = sqlx::query(SQL).bind(store_id).fetch_optional(pool).await;
            row.and_then(|r| r.as_ref().map(pause_from_row).transpose())
                .map_err(|e| self.err(e))
        })
    }
}

fn pause_from_row<R: Row>(r: &R) -> Result<PauseRecord, sqlx::Error>
where
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    for<'a> String: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
    for<'a> i64: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
{
    Ok(PauseRecord {
        reason: r.try_get("reason")?,
        paused_at_ms: r.try_get("paused_at_ms")?,
        until_ms: r.try_get("until_ms")?,
    })
}
