//! The event log: the `events` table, every event of the fleet in one order, so that a watcher
//! or a webhook can resume where it left off after a restart, a failover or a move.
//!
//! # Invariants
//!
//! - A row's `position` is assigned by the database when the row is appended and only grows:
//!   SQLite's `AUTOINCREMENT` never reuses one; PostgreSQL's sequence is taken under an
//!   advisory lock ([`EVENTS_LOCK`]) held until the commit, so appends of different instances
//!   commit in position order and a reader that has seen position `p` will never later see a
//!   row below `p` appear. Positions may skip numbers (a rolled-back append), never go back.
//! - [`Registry::append_events`] appends a batch in one transaction (one commit, one fsync,
//!   however many events): all of it or none.
//! - Pruning ([`Registry::prune_events`]) removes rows from the oldest end only, and records
//!   the highest position removed (`events_pruned.through`), so [`EventSpan::pruned_through`]
//!   says exactly which positions are gone even when no row is left.
//!
//! # What a crash leaves
//!
//! An append committed or not, whole. An append that failed with
//! [`RegistryError::Unavailable`] may have committed: its rows then stand, with their ids.

use sqlx::Row;

use super::{Backend, Registry, RegistryError};

/// The advisory-lock key appends take on PostgreSQL ("mshrmevt" in ASCII).
const EVENTS_LOCK: i64 = 0x6d73_6872_6d65_7674;

/// An event on its way into the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRow {
    /// The event's UUID, unique in the log.
    pub id: String,
    pub store_id: String,
    /// When it happened, milliseconds since the Unix epoch (what pruning by age reads).
    pub at_ms: i64,
    /// The event as JSON, stored as given.
    pub body: String,
}

/// An event in the log: its row and its position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedEvent {
    pub position: u64,
    pub row: EventRow,
}

/// What the log holds: positions up to `pruned_through` are gone; `last` is the newest
/// appended (0: none ever).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EventSpan {
    pub pruned_through: u64,
    pub last: u64,
}

impl EventSpan {
    /// The oldest position a reader can still get: the one after the last pruned.
    pub fn oldest_available(&self) -> u64 {
        self.pruned_through + 1
    }
}

fn position(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn sql_position(p: u64) -> i64 {
    i64::try_from(p).unwrap_or(i64::MAX)
}

impl Registry {
    /// Appends `rows` in one transaction, in order; their positions, in the same order.
    pub async fn append_events(&self, rows: &[EventRow]) -> Result<Vec<u64>, RegistryError> {
        const INSERT: &str = "INSERT INTO events (id, store_id, at_ms, body) \
                              VALUES ($1, $2, $3, $4) RETURNING position";
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        macro_rules! insert_all {
            ($tx:ident) => {{
                let mut positions = Vec::with_capacity(rows.len());
                for r in rows {
                    let row = sqlx::query(INSERT)
                        .bind(&r.id)
                        .bind(&r.store_id)
                        .bind(r.at_ms)
                        .bind(&r.body)
                        .fetch_one(&mut *$tx)
                        .await?;
                    positions.push(position(row.try_get::<i64, _>(0)?));
                }
                $tx.commit().await?;
                Ok::<_, sqlx::Error>(positions)
            }};
        }
        match &self.backend {
            Backend::Sqlite(pool) => {
                async {
                    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
                    insert_all!(tx)
                }
                .await
            }
            Backend::Postgres(pool) => {
                async {
                    let mut tx = pool.begin().await?;
                    sqlx::query("SELECT pg_advisory_xact_lock($1)")
                        .bind(EVENTS_LOCK)
                        .execute(&mut *tx)
                        .await?;
                    insert_all!(tx)
                }
                .await
            }
        }
        .map_err(|e| self.err(e))
    }

    /// At most `limit` events after position `after`, of `store_id` (every store's when
    /// `None`), in position order.
    pub async fn events_after(
        &self,
        after: u64,
        store_id: Option<&str>,
        limit: u32,
    ) -> Result<Vec<LoggedEvent>, RegistryError> {
        const ALL: &str = "SELECT position, id, store_id, at_ms, body FROM events \
                           WHERE position > $1 ORDER BY position LIMIT $2";
        const ONE: &str = "SELECT position, id, store_id, at_ms, body FROM events \
                           WHERE store_id = $3 AND position > $1 ORDER BY position LIMIT $2";
        with_pool!(self, |pool| {
            let rows = match store_id {
                None => {
                    sqlx::query(ALL)
                        .bind(sql_position(after))
                        .bind(i64::from(limit))
                        .fetch_all(pool)
                        .await
                }
                Some(id) => {
                    sqlx::query(ONE)
                        .bind(sql_position(after))
                        .bind(i64::from(limit))
                        .bind(id)
                        .fetch_all(pool)
                        .await
                }
            };
            rows.and_then(|rows| {
                rows.iter()
                    .map(|r| {
                        Ok(LoggedEvent {
                            position: position(r.try_get("position")?),
                            row: EventRow {
                                id: r.try_get("id")?,
                                store_id: r.try_get("store_id")?,
                                at_ms: r.try_get("at_ms")?,
                                body: r.try_get("body")?,
                            },
                        })
                    })
                    .collect()
            })
        })
        .map_err(|e| self.err(e))
    }

    /// Which positions are gone and which is the newest.
    pub async fn event_span(&self) -> Result<EventSpan, RegistryError> {
        const SQL: &str = "SELECT (SELECT through FROM events_pruned WHERE id = 1) AS through, \
                           (SELECT COALESCE(MAX(position), 0) FROM events) AS last";
        with_pool!(self, |pool| {
            let row = sqlx::query(SQL).fetch_one(pool).await;
            row.and_then(|r| {
                let through = position(r.try_get::<Option<i64>, _>("through")?.unwrap_or(0));
                let last = position(r.try_get::<i64, _>("last")?);
                Ok(EventSpan {
                    pruned_through: through,
                    last: last.max(through),
                })
            })
        })
        .map_err(|e| self.err(e))
    }

    /// Whether the log holds any event of `store_id`.
    pub async fn has_events_of(&self, store_id: &str) -> Result<bool, RegistryError> {
        const SQL: &str = "SELECT position FROM events WHERE store_id = $1 LIMIT 1";
        with_pool!(self, |pool| {
            let row = sqlx::query(SQL).bind(store_id).fetch_optional(pool).await;
            row.map(|r| r.is_some())
        })
        .map_err(|e| self.err(e))
    }

    /// Removes, from the oldest end, every event older than `before_ms` and all but the newest
    /// `keep`; how many it removed. Records the highest position removed (see the module docs).
    pub async fn prune_events(&self, before_ms: i64, keep: u64) -> Result<u64, RegistryError> {
        const AGED: &str = "SELECT COALESCE(MAX(position), 0) FROM events WHERE at_ms < $1";
        const LAST: &str = "SELECT COALESCE(MAX(position), 0) FROM events";
        const DELETE: &str = "DELETE FROM events WHERE position <= $1";
        const THROUGH: &str = "UPDATE events_pruned SET through = \
                               CASE WHEN through < $1 THEN $1 ELSE through END WHERE id = 1";
        with_pool!(self, |pool| {
            async {
                let mut tx = pool.begin().await?;
                let aged: i64 = sqlx::query(AGED)
                    .bind(before_ms)
                    .fetch_one(&mut *tx)
                    .await?
                    .try_get(0)?;
                let last: i64 = sqlx::query(LAST).fetch_one(&mut *tx).await?.try_get(0)?;
                let over = last.saturating_sub(sql_position(keep)).max(0);
                let cut = aged.max(over);
                if cut == 0 {
                    tx.rollback().await?;
                    return Ok(0);
                }
                let deleted = sqlx::query(DELETE).bind(cut).execute(&mut *tx).await?;
                sqlx::query(THROUGH).bind(cut).execute(&mut *tx).await?;
                tx.commit().await?;
                Ok::<_, sqlx::Error>(deleted.rows_affected())
            }
            .await
        })
        .map_err(|e| self.err(e))
    }
}
