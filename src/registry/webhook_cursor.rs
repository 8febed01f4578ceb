//! Webhook cursors: the `webhook_cursors` table, one row per webhook (`serve --webhook-url`),
//! saying up to which position of the event log ([`super::events`]) it was delivered, and which
//! instance delivers it until when.
//!
//! A webhook is named by a key its instances derive alike from its URL as configured (a hash:
//! the URL may hold a token, and is never stored). Every instance configured with the same URL
//! shares the row: one at a time holds it ([`Registry::claim_webhook`], a compare-and-set that
//! succeeds for the holder or once the hold has lapsed) and delivers, moving the cursor and the
//! hold together ([`Registry::webhook_delivered`]); another takes over when the holder goes
//! silent past its hold.
//!
//! # What a crash leaves
//!
//! The cursor where the last [`Registry::webhook_delivered`] left it: everything after it is
//! delivered again by the next holder (at least once; a receiver drops duplicates by id).

use sqlx::Row;

use super::{Backend, Registry, RegistryError};

impl Registry {
    /// Creates the cursor of webhook `key` (shown as `name`) at position `at`, unless it exists.
    pub async fn init_webhook_cursor(
        &self,
        key: &str,
        name: &str,
        at: u64,
    ) -> Result<(), RegistryError> {
        const SQL: &str = "INSERT INTO webhook_cursors (webhook, name, delivered, holder, \
                           held_until_ms) VALUES ($1, $2, $3, '', 0) \
                           ON CONFLICT (webhook) DO NOTHING";
        with_pool!(self, |pool| {
            sqlx::query(SQL)
                .bind(key)
                .bind(name)
                .bind(i64::try_from(at).unwrap_or(i64::MAX))
                .execute(pool)
                .await
                .map(drop)
        })
        .map_err(|e| self.err(e))
    }

    /// Takes (or keeps) the delivery of webhook `key` for `holder` until `until_ms`, if no
    /// other holder's hold lasts past `now_ms`: the position delivered so far, or `None` (held
    /// by another, or no such cursor).
    pub async fn claim_webhook(
        &self,
        key: &str,
        holder: &str,
        now_ms: i64,
        until_ms: i64,
    ) -> Result<Option<u64>, RegistryError> {
        const SQL: &str = "UPDATE webhook_cursors SET holder = $2, held_until_ms = $4 \
                           WHERE webhook = $1 AND (holder = $2 OR held_until_ms < $3) \
                           RETURNING delivered";
        with_pool!(self, |pool| {
            let row = sqlx::query(SQL)
                .bind(key)
                .bind(holder)
                .bind(now_ms)
                .bind(until_ms)
                .fetch_optional(pool)
                .await;
            row.and_then(|r| {
                r.map(|r| {
                    r.try_get::<i64, _>(0)
                        .map(|d| u64::try_from(d).unwrap_or(0))
                })
                .transpose()
            })
        })
        .map_err(|e| self.err(e))
    }

    /// Moves the cursor of webhook `key` forward to `position` and the hold to `until_ms`, if
    /// `holder` still holds it; `false`: another instance took it over (nothing written).
    pub async fn webhook_delivered(
        &self,
        key: &str,
        holder: &str,
        position: u64,
        until_ms: i64,
    ) -> Result<bool, RegistryError> {
        const SQL: &str = "UPDATE webhook_cursors SET held_until_ms = $4, delivered = \
                           CASE WHEN delivered < $3 THEN $3 ELSE delivered END \
                           WHERE webhook = $1 AND holder = $2";
        with_pool!(self, |pool| {
            sqlx::query(SQL)
                .bind(key)
                .bind(holder)
                .bind(i64::try_from(position).unwrap_or(i64::MAX))
                .bind(until_ms)
                .execute(pool)
                .await
                .map(|r| r.rows_affected() > 0)
        })
        .map_err(|e| self.err(e))
    }

    /// Gives up the hold of webhook `key` if `holder` has it (at shutdown), so another
    /// instance may take over at once.
    pub async fn release_webhook(&self, key: &str, holder: &str) -> Result<(), RegistryError> {
        const SQL: &str = "UPDATE webhook_cursors SET held_until_ms = 0 \
                           WHERE webhook = $1 AND holder = $2";
        with_pool!(self, |pool| {
            sqlx::query(SQL)
                .bind(key)
                .bind(holder)
                .execute(pool)
                .await
                .map(drop)
        })
        .map_err(|e| self.err(e))
    }
}
