//! The registry's audit log (one row per operator call) and the instances' health rows
//! (each instance's reports of its stores' health, and its heartbeat).

#[allow(unused_imports)]
use super::*;

impl Registry {
    /// Appends one entry to the audit log, each text field as [`audit_text`] bounds it.
    pub async fn record_audit(&self, entry: &AuditEntry) -> Result<(), RegistryError> {
        const SQL: &str = "INSERT INTO audit_log (at_ms, instance_id, action, store_id, \
                           store_dir, outcome, detail, peer) \
                           VALUES ($1, $2, $3, $4, $5, $6, $7, $8)";
        let text = |s: &str| audit_text(s);
        let opt = |s: &Option<String>| s.as_deref().map(audit_text);
        with_pool!(self, |pool| {
            sqlx::query(SQL)
                .bind(entry.at_ms)
                .bind(text(&entry.instance_id))
                .bind(text(&entry.action))
                .bind(opt(&entry.store_id))
                .bind(opt(&entry.store_dir))
                .bind(text(&entry.outcome))
                .bind(text(&entry.detail))
                .bind(opt(&entry.peer))
                .execute(pool)
                .await
                .map(drop)
        })
        .map_err(|e| self.err(e))
    }

    /// The newest `limit` audit entries, newest first (in the order they were appended).
    pub async fn audit_log(&self, limit: u32) -> Result<Vec<AuditEntry>, RegistryError> {
        const SQL: &str = "SELECT at_ms, instance_id, action, store_id, store_dir, outcome, \
                           detail, peer FROM audit_log ORDER BY id DESC LIMIT $1";
        with_pool!(self, |pool| {
            let rows = sqlx::query(SQL)
                .bind(i64::from(limit))
                .fetch_all(pool)
                .await;
            rows.map_err(|e| self.err(e))?
                .iter()
                .map(|r| audit_from_row(r).map_err(|e| self.err(e)))
                .collect()
        })
    }

    /// One health report of `instance_id`: its heartbeat, and the health of the stores whose
    /// health changed (`(store_id, health_json)`), in one transaction: one commit (one fsync)
    /// however many stores. Stores no longer registered (deregistered a moment ago, by any
    /// instance) are skipped.
    pub async fn report_health(
        &self,
        instance_id: &str,
        at_ms: i64,
        changed: &[(String, String)],
    ) -> Result<(), RegistryError> {
        const HEARTBEAT: &str = "INSERT INTO instances (instance_id, heartbeat_ms) \
                                 VALUES ($1, $2) ON CONFLICT (instance_id) DO UPDATE SET \
                                 heartbeat_ms = excluded.heartbeat_ms";
        // `WHERE EXISTS` skips a store deregistered meanwhile (a foreign-key violation would
        // abort the whole transaction); SQLite needs a WHERE before ON CONFLICT anyway.
        const HEALTH: &str = "INSERT INTO store_health (store_id, instance_id, reported_at_ms, \
                              health) SELECT CAST($1 AS TEXT), CAST($2 AS TEXT), \
                              CAST($3 AS BIGINT), CAST($4 AS TEXT) \
                              WHERE EXISTS (SELECT 1 FROM stores WHERE store_id = $1) \
                              ON CONFLICT (store_id) DO UPDATE SET \
                              instance_id = excluded.instance_id, \
                              reported_at_ms = excluded.reported_at_ms, \
                              health = excluded.health";
        with_pool!(self, |pool| {
            async {
                let mut tx = pool.begin().await?;
                sqlx::query(HEARTBEAT)
                    .bind(instance_id)
                    .bind(at_ms)
                    .execute(&mut *tx)
                    .await?;
                for (store_id, json) in changed {
                    sqlx::query(HEALTH)
                        .bind(store_id)
                        .bind(instance_id)
                        .bind(at_ms)
                        .bind(json)
                        .execute(&mut *tx)
                        .await?;
                }
                tx.commit().await
            }
            .await
        })
        .map_err(|e| self.err(e))
    }

    /// Every instance's last heartbeat, by instance id.
    pub async fn heartbeats(&self) -> Result<BTreeMap<String, i64>, RegistryError> {
        const SQL: &str = "SELECT instance_id, heartbeat_ms FROM instances";
        with_pool!(self, |pool| {
            let rows = sqlx::query(SQL).fetch_all(pool).await;
            rows.map_err(|e| self.err(e))?
                .iter()
                .map(|r| {
                    Ok((
                        r.try_get::<String, _>("instance_id")
                            .map_err(|e| self.err(e))?,
                        r.try_get::<i64, _>("heartbeat_ms")
                            .map_err(|e| self.err(e))?,
                    ))
                })
                .collect()
        })
    }

    /// Every store's last reported health, by `store_id`.
    pub async fn all_health(&self) -> Result<Vec<HealthRow>, RegistryError> {
        const SQL: &str = "SELECT store_id, instance_id, reported_at_ms, health \
                           FROM store_health ORDER BY store_id";
        with_pool!(self, |pool| {
            let rows = sqlx::query(SQL).fetch_all(pool).await;
            rows.map_err(|e| self.err(e))?
                .iter()
                .map(|r| health_from_row(r).map_err(|e| self.err(e)))
                .collect()
        })
    }
}

pub(super) fn audit_from_row<R: Row>(row: &R) -> Result<AuditEntry, sqlx::Error>
where
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Option<String>: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    &'static str: ColumnIndex<R>,
{
    Ok(AuditEntry {
        at_ms: row.try_get("at_ms")?,
        instance_id: row.try_get("instance_id")?,
        action: row.try_get("action")?,
        store_id: row.try_get("store_id")?,
        store_dir: row.try_get("store_dir")?,
        outcome: row.try_get("outcome")?,
        detail: row.try_get("detail")?,
        peer: row.try_get("peer")?,
    })
}

pub(super) fn health_from_row<R: Row>(row: &R) -> Result<HealthRow, sqlx::Error>
where
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    &'static str: ColumnIndex<R>,
{
    Ok(HealthRow {
        store_id: row.try_get("store_id")?,
        instance_id: row.try_get("instance_id")?,
        reported_at_ms: row.try_get("reported_at_ms")?,
        health_json: row.try_get("health")?,
    })
}
