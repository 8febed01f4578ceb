//! Stores as the registry last heard of them: a row, the last health reported for it and its
//! owner's heartbeat, in one read (a join of `stores`, `store_health` and `instances`).
//! [`Registry::store_report`] reads one store's (the `Health` of one store another instance
//! owns, `service::remote`): that store's rows only, however many stores the fleet has.
//! [`Registry::reports_of_others`] reads those of every store another instance owns (the
//! fleet's `Health` and `WatchHealth`): an instance reads none of its own stores' rows or
//! health reports, which it knows better from its workers.
//!
//! Read-only: one statement, so a crash leaves nothing.

use sqlx::{ColumnIndex, Decode, Row, Type};

use super::{Backend, HealthRow, Registry, RegistryError, StoreRecord, store_from_row};

/// What [`Registry::store_report`] read.
#[derive(Debug, Clone)]
pub struct StoreReport {
    pub record: StoreRecord,
    /// The last health reported for the store, if any was.
    pub health: Option<HealthRow>,
    /// The owner's last heartbeat, if it ever reported or announced itself.
    pub heartbeat_ms: Option<i64>,
}

/// The statement both reads run, the columns, `FROM` and the joins, then `$tail`, as one
/// literal.
macro_rules! select_reports {
    ($tail:literal) => {
        concat!(
            "SELECT s.store_id, s.store_dir, s.destination, s.labels, s.options, ",
            "s.node_token_hash, s.instance_id, s.registered_at_ms, s.owner_since_ms, ",
            "h.instance_id AS reporter, h.reported_at_ms, h.health, i.heartbeat_ms ",
            "FROM stores s LEFT JOIN store_health h ON h.store_id = s.store_id ",
            "LEFT JOIN instances i ON i.instance_id = s.instance_id ",
            $tail
        )
    };
}

impl Registry {
    /// `store_id`'s row, last health report and owner's heartbeat (`None`: not registered).
    pub async fn store_report(&self, store_id: &str) -> Result<Option<StoreReport>, RegistryError> {
        const SQL: &str = select_reports!("WHERE s.store_id = $1");
        with_pool!(self, |pool| {
            let row = sqlx::query(SQL).bind(store_id).fetch_optional(pool).await;
            match row.map_err(|e| self.err(e))? {
                Some(r) => report_from_row(&r, &self.location).map(Some),
                None => Ok(None),
            }
        })
    }

    /// What [`Registry::store_report`] reads, for every store an instance other than
    /// `instance_id` owns, in the order of registration.
    pub async fn reports_of_others(
        &self,
        instance_id: &str,
    ) -> Result<Vec<StoreReport>, RegistryError> {
        const SQL: &str =
            select_reports!("WHERE s.instance_id <> $1 ORDER BY s.registered_at_ms, s.store_id");
        with_pool!(self, |pool| {
            let rows = sqlx::query(SQL).bind(instance_id).fetch_all(pool).await;
            rows.map_err(|e| self.err(e))?
                .iter()
                .map(|r| report_from_row(r, &self.location))
                .collect()
        })
    }
}

/// A row of [`select_reports`] as a [`StoreReport`].
fn report_from_row<R: Row>(r: &R, location: &str) -> Result<StoreReport, RegistryError>
where
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Option<String>: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Option<i64>: Decode<'r, R::Database> + Type<R::Database>,
    &'static str: ColumnIndex<R>,
{
    let record = store_from_row(r, location)?;
    let extra = || -> Result<_, sqlx::Error> {
        let reporter: Option<String> = r.try_get("reporter")?;
        let reported_at_ms: Option<i64> = r.try_get("reported_at_ms")?;
        let health: Option<String> = r.try_get("health")?;
        let heartbeat_ms: Option<i64> = r.try_get("heartbeat_ms")?;
        let health = match (reporter, reported_at_ms, health) {
            (Some(instance_id), Some(reported_at_ms), Some(health_json)) => Some(HealthRow {
                store_id: record.store_id.clone(),
                instance_id,
                reported_at_ms,
                health_json,
            }),
            _ => None,
        };
        Ok((health, heartbeat_ms))
    };
    let (health, heartbeat_ms) = extra().map_err(|e| super::error::classify(location, e))?;
    Ok(StoreReport {
        record,
        health,
        heartbeat_ms,
    })
}
