//! Restore drills: the `store_drills` table, one row per store holding its last drill (the
//! service's `Drill` call or its scheduler), so that the outcome — and a failed drill's hold
//! on the store's health — survives a restart of the service.
//!
//! Each call is one statement. The service writes the row when a drill ends, before it shows
//! the outcome in health, so a crash between the two leaves the registry's word, which the
//! next start shows. A row goes with its store (`ON DELETE CASCADE`).
//!
//! A row holds a [`DrillResult`], the one drill outcome health shows and the service answers:
//! what the registry keeps is what health shows after a restart, field for field.

use std::collections::BTreeMap;

use sqlx::Row;

use super::{Backend, Registry, RegistryError};
use crate::health::DrillResult;
use crate::units::{i64_of, u64_of};

impl Registry {
    /// Records (replacing) the last drill of `store_id`. `false`, and nothing written, when no
    /// such store is registered (deregistered meanwhile).
    pub async fn set_drill(
        &self,
        store_id: &str,
        drill: &DrillResult,
    ) -> Result<bool, RegistryError> {
        const SQL: &str = "INSERT INTO store_drills (store_id, ok, commit_seq, manifest_key, \
                           duration_ms, bytes, error, finished_at_ms, last_ok_at_ms, predicted_ms) \
                           SELECT CAST($1 AS TEXT), CAST($2 AS BOOLEAN), CAST($3 AS BIGINT), \
                           CAST($4 AS TEXT), CAST($5 AS BIGINT), CAST($6 AS BIGINT), \
                           CAST($7 AS TEXT), CAST($8 AS BIGINT), CAST($9 AS BIGINT), \
                           CAST($10 AS BIGINT) \
                           WHERE EXISTS (SELECT 1 FROM stores WHERE store_id = $1) \
                           ON CONFLICT (store_id) DO UPDATE SET \
                           ok = excluded.ok, commit_seq = excluded.commit_seq, \
                           manifest_key = excluded.manifest_key, \
                           duration_ms = excluded.duration_ms, bytes = excluded.bytes, \
                           error = excluded.error, finished_at_ms = excluded.finished_at_ms, \
                           last_ok_at_ms = excluded.last_ok_at_ms, \
                           predicted_ms = excluded.predicted_ms";
        with_pool!(self, |pool| {
            sqlx::query(SQL)
                .bind(store_id)
                .bind(drill.ok)
                .bind(i64_of(drill.commit_seq))
                .bind(&drill.manifest_key)
                .bind(i64_of(drill.duration_ms))
                .bind(i64_of(drill.bytes))
                .bind(&drill.error)
                .bind(drill.finished_at_unix_ms)
                .bind(drill.last_ok_at_unix_ms)
                .bind(i64_of(drill.predicted_ms))
                .execute(pool)
                .await
                .map(|r| r.rows_affected() > 0)
        })
        .map_err(|e| self.err(e))
    }

    /// Every store's last drill, by `store_id` (read once when the service starts).
    pub async fn drills(&self) -> Result<BTreeMap<String, DrillResult>, RegistryError> {
        const SQL: &str = "SELECT store_id, ok, commit_seq, manifest_key, duration_ms, bytes, \
                           error, finished_at_ms, last_ok_at_ms, predicted_ms FROM store_drills";
        with_pool!(self, |pool| {
            let rows = sqlx::query(SQL).fetch_all(pool).await;
            rows.map_err(|e| self.err(e))?
                .iter()
                .map(|r| Ok((r.try_get::<String, _>("store_id")?, drill_from_row(r)?)))
                .collect::<Result<_, sqlx::Error>>()
                .map_err(|e| self.err(e))
        })
    }

    /// One store's last drill, if it had one: its row only (a store started while the
    /// service runs, `service::fleet::hosting`).
    pub async fn drill(&self, store_id: &str) -> Result<Option<DrillResult>, RegistryError> {
        const SQL: &str = "SELECT ok, commit_seq, manifest_key, duration_ms, bytes, error, \
                           finished_at_ms, last_ok_at_ms, predicted_ms FROM store_drills WHERE store_id = $1";
        with_pool!(self, |pool| {
            let row = sqlx::query(SQL).bind(store_id).fetch_optional(pool).await;
            row.and_then(|r| r.as_ref().map(drill_from_row).transpose())
                .map_err(|e| self.err(e))
        })
    }
}

fn drill_from_row<R: Row>(r: &R) -> Result<DrillResult, sqlx::Error>
where
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    for<'a> String: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
    for<'a> i64: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
    for<'a> bool: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
{
    Ok(DrillResult {
        ok: r.try_get("ok")?,
        commit_seq: u64_of(r.try_get("commit_seq")?),
        manifest_key: r.try_get("manifest_key")?,
        duration_ms: u64_of(r.try_get("duration_ms")?),
        bytes: u64_of(r.try_get("bytes")?),
        error: r.try_get("error")?,
        finished_at_unix_ms: r.try_get("finished_at_ms")?,
        last_ok_at_unix_ms: r.try_get("last_ok_at_ms")?,
        predicted_ms: u64_of(r.try_get("predicted_ms")?),
    })
}
