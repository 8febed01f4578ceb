//! Which instance owns each store, and since when: the `instance_id` and `owner_since_ms`
//! columns of `stores` (migration 0008), changed only by a compare-and-set.
//!
//! # The one write: [`Registry::change_owner`]
//!
//! `UPDATE stores SET instance_id = to, owner_since_ms = now WHERE store_id = s AND
//! instance_id = from`, in one transaction with a move of `stores_serial` (so the next
//! registration check reads the rows again). The row changes only when it still names `from`:
//! of any number of instances racing to take one store from one owner, exactly one sees
//! `rows_affected == 1` ([`Claimed::Won`]); every other one sees the row already changed
//! ([`Claimed::Lost`], naming the owner it found) or gone ([`Claimed::Gone`]). The database's
//! row lock orders the racers; no lock of ours is taken. Used by failover claims
//! (`service::failover`) and planned moves (`service::moves`).
//!
//! # The reads
//!
//! Every [`super::StoreRecord`] carries its owner and since when, so a read of the rows serves
//! lists and the fleet's health at once. Besides: [`Registry::owners`] (every store's owner,
//! one query), [`Registry::owner`] (one store's, for the `Health` of a store running here) and
//! [`Registry::owned_stores`] (the ids of one instance's stores and since when, one query, for
//! the reconcile that stops the workers of stores claimed away).
//!
//! # What a crash leaves
//!
//! The row changed or not (one transaction). A change whose answer was lost
//! ([`RegistryError::Unavailable`]) may have landed: the caller re-reads the owner
//! ([`Registry::owners`]) before acting on it, and the reconcile of both instances settles
//! it (the winner's loop starts the store, the loser's stops it).

use std::collections::BTreeMap;

use sqlx::Row;

use super::{Backend, Registry, RegistryError};

/// A store's owner as the registry holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub instance_id: String,
    /// Since when, milliseconds since the Unix epoch (its registration, or the claim or move
    /// that gave it to this instance).
    pub since_ms: i64,
}

/// What a [`Registry::change_owner`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claimed {
    /// The row named the expected owner and names the new one now.
    Won,
    /// The row names another owner than the expected one (someone else won, or it moved).
    Lost { owner: String },
    /// No such store (deregistered).
    Gone,
}

impl Registry {
    /// Gives `store_id` to `to` if, and only if, `from` owns it now (see the module docs).
    pub async fn change_owner(
        &self,
        store_id: &str,
        from: &str,
        to: &str,
        at_ms: i64,
    ) -> Result<Claimed, RegistryError> {
        const CAS: &str = "UPDATE stores SET instance_id = $1, owner_since_ms = $2 \
                           WHERE store_id = $3 AND instance_id = $4";
        const BUMP: &str = "UPDATE stores_serial SET serial = serial + 1 WHERE id = 1";
        const NOW: &str = "SELECT instance_id FROM stores WHERE store_id = $1";
        *self.checked() = None;
        with_pool!(self, |pool| {
            async {
                let mut tx = pool.begin().await?;
                let changed = sqlx::query(CAS)
                    .bind(to)
                    .bind(at_ms)
                    .bind(store_id)
                    .bind(from)
                    .execute(&mut *tx)
                    .await?;
                if changed.rows_affected() == 1 {
                    sqlx::query(BUMP).execute(&mut *tx).await?;
                    tx.commit().await?;
                    return Ok(Claimed::Won);
                }
                let now: Option<String> = sqlx::query_scalar(NOW)
                    .bind(store_id)
                    .fetch_optional(&mut *tx)
                    .await?;
                tx.rollback().await?;
                Ok::<_, sqlx::Error>(match now {
                    Some(owner) => Claimed::Lost { owner },
                    None => Claimed::Gone,
                })
            }
            .await
        })
        .map_err(|e| self.err(e))
    }

    /// Every registered store's owner and since when, by store id.
    pub async fn owners(&self) -> Result<BTreeMap<String, Owner>, RegistryError> {
        const SQL: &str = "SELECT store_id, instance_id, owner_since_ms FROM stores";
        with_pool!(self, |pool| {
            let rows = sqlx::query(SQL).fetch_all(pool).await;
            rows.and_then(|rows| {
                rows.iter()
                    .map(|r| {
                        Ok((
                            r.try_get::<String, _>("store_id")?,
                            Owner {
                                instance_id: r.try_get("instance_id")?,
                                since_ms: r.try_get("owner_since_ms")?,
                            },
                        ))
                    })
                    .collect()
            })
        })
        .map_err(|e| self.err(e))
    }

    /// One store's owner and since when (`None`: not registered): what `owners` gives for one
    /// store, without reading every row.
    pub async fn owner(&self, store_id: &str) -> Result<Option<Owner>, RegistryError> {
        const SQL: &str = "SELECT instance_id, owner_since_ms FROM stores WHERE store_id = $1";
        with_pool!(self, |pool| {
            sqlx::query_as::<_, (String, i64)>(SQL)
                .bind(store_id)
                .fetch_optional(pool)
                .await
                .map(|row| {
                    row.map(|(instance_id, since_ms)| Owner {
                        instance_id,
                        since_ms,
                    })
                })
        })
        .map_err(|e| self.err(e))
    }

    /// The stores `instance_id` owns: their ids and since when (`owner_since_ms`).
    pub async fn owned_stores(
        &self,
        instance_id: &str,
    ) -> Result<BTreeMap<String, i64>, RegistryError> {
        const SQL: &str = "SELECT store_id, owner_since_ms FROM stores WHERE instance_id = $1";
        with_pool!(self, |pool| {
            sqlx::query_as::<_, (String, i64)>(SQL)
                .bind(instance_id)
                .fetch_all(pool)
                .await
                .map(|rows| rows.into_iter().collect())
        })
        .map_err(|e| self.err(e))
    }
}
