//! Per-store options as the registry stores them (JSON in the store's row): each `None`
//! means the service's default, and [`StoreOptions::apply`] lays the set ones over the
//! service's worker configuration. Unknown JSON keys of a newer version are ignored and
//! missing ones are `None`, so a row written by either version reads in the other. The
//! ranges are checked (and clamped for old rows) in `limits`.
//!
//! One record from the API to the worker: a request's options ([`StoreOptions::from_proto`])
//! are checked once at registration, stored ([`StoreOptions::to_row`]) and handed to the
//! worker as they are; a row read back (a restart, a failover, a move) is decoded once
//! ([`StoreOptions::of_row`]), and [`StoreOptions::apply`] lays them over the worker's
//! configuration.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::FleetError;
use super::limits::{self, FieldError};
use crate::registry::StoreRecord;
use crate::service::proto;
use crate::worker::{DurabilityMode, WorkerConfig};

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
    /// `governance` or `compliance`: a write-once prefix (`store_object_lock.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_lock: Option<String>,
    /// `async` or `sync` (`crate::worker::durable`); `None`: the service's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durability: Option<String>,
    /// The cap on WAL PUTs a second (`crate::worker::limits::WAL_PUTS_PER_SECOND`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_puts_per_second: Option<u64>,
    /// A second destination with a worker of its own (`store_replica.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
    /// A standby of the destination (`standby.rs`): followed, never written, until promoted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standby: Option<bool>,
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
        if let Ok(Some(mode)) = self.object_lock() {
            c.object_lock = Some(mode);
        }
        if let Some(Ok(mode)) = self.durability.as_deref().map(DurabilityMode::parse) {
            c.durability = mode;
        }
        if let Some(v) = self.wal_puts_per_second {
            c.wal_puts_per_second = u32::try_from(v).unwrap_or(u32::MAX);
        }
        c
    }

    /// Whether the store is a standby (`standby.rs`).
    pub fn is_standby(&self) -> bool {
        self.standby == Some(true)
    }

    /// The registry's stored form of these options: the JSON object every version reads
    /// (see the module docs).
    pub fn to_row(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("options serialize to JSON")
    }

    /// A registry row's options as its worker runs with them, read once: each in its range,
    /// or clamped into it (a row registered before the bounds, or edited by hand), with a
    /// warning.
    pub fn of_row(record: &StoreRecord) -> Result<StoreOptions, FleetError> {
        let options = Self::as_registered(record).map_err(|e| {
            FleetError::Internal(format!(
                "store {} has unreadable options: {e}",
                record.store_id
            ))
        })?;
        Ok(match options.check() {
            Ok(()) => options,
            Err(e) => {
                // Registered before the bounds: run within them rather than not at all.
                tracing::warn!(store_id = %record.store_id, error = %e, "a registered option is out of range: running with it clamped into range");
                limits::clamp_options(&options)
            }
        })
    }

    /// A registry row's options as they were registered: decoded from the row's stored form,
    /// neither checked nor clamped (the one place that form is read; [`Self::of_row`] is what a
    /// worker runs with).
    pub fn as_registered(record: &StoreRecord) -> Result<StoreOptions, serde_json::Error> {
        serde_json::from_value(record.options.clone())
    }

    /// Each option unset or in its range ([`limits::check_options`]).
    pub fn check(&self) -> Result<(), FieldError> {
        limits::check_options(self)
    }

    /// A store's options: 0 (or no options at all) is the service's default.
    pub fn from_proto(o: Option<proto::StoreOptions>) -> StoreOptions {
        let o = o.unwrap_or_default();
        let nz = |v: u64| (v != 0).then_some(v);
        StoreOptions {
            wal_interval_ms: nz(o.wal_interval_ms),
            restore_point_interval_ms: nz(o.restore_point_interval_ms),
            retention_interval_ms: nz(o.retention_interval_ms),
            keep_for_ms: nz(o.keep_for_ms),
            keep_generations: nz(o.keep_generations),
            compression: match proto::Compression::try_from(o.compression) {
                Ok(proto::Compression::Zstd) => Some("zstd".into()),
                Ok(proto::Compression::None) => Some("none".into()),
                Ok(proto::Compression::Unspecified) => None,
                // Refused by the options' check, naming the field.
                Err(_) => Some(format!("enum value {}", o.compression)),
            },
            compression_level: (o.compression_level != 0).then_some(o.compression_level),
            drill_interval_ms: nz(o.drill_interval_ms),
            monthly_request_budget: nz(o.monthly_request_budget),
            keep_daily: nz(o.keep_daily),
            keep_weekly: nz(o.keep_weekly),
            keep_monthly: nz(o.keep_monthly),
            object_lock: Self::object_lock_of_proto(o.object_lock),
            durability: match proto::Durability::try_from(o.durability) {
                Ok(proto::Durability::Async) => Some("async".into()),
                Ok(proto::Durability::Sync) => Some("sync".into()),
                Ok(proto::Durability::Unspecified) => None,
                // Refused by the options' check, naming the field.
                Err(_) => Some(format!("enum value {}", o.durability)),
            },
            wal_puts_per_second: nz(u64::from(o.wal_puts_per_second)),
            replica: (!o.replica.is_empty()).then_some(o.replica),
            standby: o.standby.then_some(true),
        }
    }

    /// The proto form of a store's options (the service's default: 0).
    pub fn to_proto(&self) -> proto::StoreOptions {
        let o = self;
        proto::StoreOptions {
            wal_interval_ms: o.wal_interval_ms.unwrap_or(0),
            restore_point_interval_ms: o.restore_point_interval_ms.unwrap_or(0),
            retention_interval_ms: o.retention_interval_ms.unwrap_or(0),
            keep_for_ms: o.keep_for_ms.unwrap_or(0),
            keep_generations: o.keep_generations.unwrap_or(0),
            compression: match o.compression.as_deref() {
                Some("zstd") => proto::Compression::Zstd as i32,
                Some("none") => proto::Compression::None as i32,
                _ => proto::Compression::Unspecified as i32,
            },
            compression_level: o.compression_level.unwrap_or(0),
            drill_interval_ms: o.drill_interval_ms.unwrap_or(0),
            monthly_request_budget: o.monthly_request_budget.unwrap_or(0),
            keep_daily: o.keep_daily.unwrap_or(0),
            keep_weekly: o.keep_weekly.unwrap_or(0),
            keep_monthly: o.keep_monthly.unwrap_or(0),
            object_lock: self.object_lock_to_proto(),
            durability: match o.durability.as_deref() {
                Some("async") => proto::Durability::Async as i32,
                Some("sync") => proto::Durability::Sync as i32,
                _ => proto::Durability::Unspecified as i32,
            },
            wal_puts_per_second: o
                .wal_puts_per_second
                .map_or(0, |v| u32::try_from(v).unwrap_or(u32::MAX)),
            replica: o.replica.clone().unwrap_or_default(),
            standby: o.is_standby(),
        }
    }
}
