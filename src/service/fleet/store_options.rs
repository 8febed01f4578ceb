//! Per-store options as the registry stores them (JSON in the store's row): each `None`
//! means the service's default, and [`StoreOptions::apply`] lays the set ones over the
//! service's worker configuration. Unknown JSON keys of a newer version are ignored and
//! missing ones are `None`, so a row written by either version reads in the other. The
//! ranges are checked (and clamped for old rows) in `limits`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::limits::{self, FieldError};
use crate::worker::WorkerConfig;

/// Per-store settings stored in the registry; `None` = the service's default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreOptions {
    pub wal_interval_ms: Option<u64>,
    pub restore_point_interval_ms: Option<u64>,
    pub retention_interval_ms: Option<u64>,
    pub keep_for_ms: Option<u64>,
    pub keep_generations: Option<u64>,
    /// `zstd` or `none` (`src/at_rest/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression_level: Option<u32>,
    /// Scheduled restore drills, every this many ms (`crate::service::ops::drill`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drill_interval_ms: Option<u64>,
    /// Requests a month; a projection over it is a health note (`crate::cost`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monthly_request_budget: Option<u64>,
    /// Retention tiers (`crate::worker::tiers`); `None`: the service's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_daily: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_weekly: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_monthly: Option<u64>,
}

impl StoreOptions {
    pub fn apply(&self, base: &WorkerConfig) -> WorkerConfig {
        let mut c = base.clone();
        let ms = Duration::from_millis;
        if let Some(v) = self.wal_interval_ms {
            c.wal_interval = ms(v);
        }
        if let Some(v) = self.restore_point_interval_ms {
            c.restore_point_interval = ms(v);
        }
        if let Some(v) = self.retention_interval_ms {
            c.retention_interval = ms(v);
        }
        if let Some(v) = self.keep_for_ms {
            c.retention.keep_for = ms(v);
        }
        if let Some(v) = self.keep_generations {
            c.retention.keep_generations = v;
        }
        if let Some(v) = self.keep_daily {
            c.retention.tiers.keep_daily = v;
        }
        if let Some(v) = self.keep_weekly {
            c.retention.tiers.keep_weekly = v;
        }
        if let Some(v) = self.keep_monthly {
            c.retention.tiers.keep_monthly = v;
        }
        if let Ok(Some(compression)) = self.compression() {
            c.compression = compression;
        }
        c
    }

    /// Each option unset or in its range ([`limits::check_options`]).
    pub fn check(&self) -> Result<(), FieldError> {
        limits::check_options(self)
    }
}
