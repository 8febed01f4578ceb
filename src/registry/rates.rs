//! Restore rates: the `restore_rates` table, one row per destination endpoint (the S3
//! endpoint and bucket, or `file://` for directory buckets) holding the rates this instance's
//! drills and restores measured there, smoothed (the service's `restore::predict::Rates`,
//! field for field), and how many measurements went into them. Health predicts every store's restore time from
//! them (`service::fleet::rto`).
//!
//! Each call is one statement: a crash leaves the row as the last write left it, and at worst
//! loses the newest measurement (the next drill measures again). The rows belong to no store
//! and outlive them: an endpoint's rates are the endpoint's, whichever store measured them.

use std::collections::BTreeMap;

use sqlx::Row;

use super::{Backend, Registry, RegistryError};
use crate::units::{i64_of, u64_of};

/// An endpoint's kept rates (measured: never the defaults) and how many measurements made
/// them.
#[derive(Debug, Clone, PartialEq)]
pub struct KeptRates {
    pub download_bytes_per_second: f64,
    pub first_byte_seconds: f64,
    pub decode_bytes_per_second: f64,
    pub check_bytes_per_second: f64,
    pub fixed_seconds: f64,
    pub samples: u64,
    pub updated_at_ms: i64,
    /// The recent measurements the rates were fitted to (`restore::calibrate::Sample`s, a
    /// JSON array; `[]` in rows written before they were kept).
    pub recent: String,
}

impl Registry {
    /// Writes (replacing) the rates kept for `endpoint`.
    pub async fn set_rates(&self, endpoint: &str, kept: &KeptRates) -> Result<(), RegistryError> {
        const SQL: &str = "INSERT INTO restore_rates (endpoint, download_bytes_per_second, \
                           first_byte_seconds, decode_bytes_per_second, check_bytes_per_second, \
                           fixed_seconds, samples, updated_at_ms, recent) \
                           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
                           ON CONFLICT (endpoint) DO UPDATE SET \
                           download_bytes_per_second = excluded.download_bytes_per_second, \
                           first_byte_seconds = excluded.first_byte_seconds, \
                           decode_bytes_per_second = excluded.decode_bytes_per_second, \
                           check_bytes_per_second = excluded.check_bytes_per_second, \
                           fixed_seconds = excluded.fixed_seconds, \
                           samples = excluded.samples, updated_at_ms = excluded.updated_at_ms, \
                           recent = excluded.recent";
        let r = kept;
        with_pool!(self, |pool| {
            sqlx::query(SQL)
                .bind(endpoint)
                .bind(r.download_bytes_per_second)
                .bind(r.first_byte_seconds)
                .bind(r.decode_bytes_per_second)
                .bind(r.check_bytes_per_second)
                .bind(r.fixed_seconds)
                .bind(i64_of(kept.samples))
                .bind(kept.updated_at_ms)
                .bind(&kept.recent)
                .execute(pool)
                .await
                .map(|_| ())
        })
        .map_err(|e| self.err(e))
    }

    /// Every endpoint's kept rates (read once when the service starts).
    pub async fn all_rates(&self) -> Result<BTreeMap<String, KeptRates>, RegistryError> {
        const SQL: &str = "SELECT endpoint, download_bytes_per_second, first_byte_seconds, \
                           decode_bytes_per_second, check_bytes_per_second, fixed_seconds, \
                           samples, updated_at_ms, recent FROM restore_rates";
        with_pool!(self, |pool| {
            let rows = sqlx::query(SQL).fetch_all(pool).await;
            rows.map_err(|e| self.err(e))?
                .iter()
                .map(|r| {
                    let kept = KeptRates {
                        download_bytes_per_second: r.try_get("download_bytes_per_second")?,
                        first_byte_seconds: r.try_get("first_byte_seconds")?,
                        decode_bytes_per_second: r.try_get("decode_bytes_per_second")?,
                        check_bytes_per_second: r.try_get("check_bytes_per_second")?,
                        fixed_seconds: r.try_get("fixed_seconds")?,
                        samples: u64_of(r.try_get("samples")?),
                        updated_at_ms: r.try_get("updated_at_ms")?,
                        recent: r.try_get("recent")?,
                    };
                    Ok((r.try_get::<String, _>("endpoint")?, kept))
                })
                .collect::<Result<_, sqlx::Error>>()
                .map_err(|e| self.err(e))
        })
    }
}
