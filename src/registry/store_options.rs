//! A store's options rewritten in place (the `options` column of its `stores` row): what a
//! promotion changes when a standby becomes a primary (the service's `Promote`), so that the
//! next start of the service runs it as a primary.
//!
//! One statement; a crash before it leaves the row as it was (the store is respawned as
//! what the row says), after it the new options.

use super::{Backend, Registry, RegistryError};

impl Registry {
    /// Replaces the options of `store_id` with `options` (their JSON row form); `false`, and
    /// nothing written, when no such store is registered.
    pub async fn set_store_options(
        &self,
        store_id: &str,
        options: &serde_json::Value,
    ) -> Result<bool, RegistryError> {
        const SQL: &str = "UPDATE stores SET options = $2 WHERE store_id = $1";
        let options = options.to_string();
        with_pool!(self, |pool| {
            sqlx::query(SQL)
                .bind(store_id)
                .bind(&options)
                .execute(pool)
                .await
                .map(|r| r.rows_affected() > 0)
        })
        .map_err(|e| self.err(e))
    }
}
