//! A registered store's options, typed: what it sets over the service's worker configuration
//! ([`WorkerOverrides`], the record the TOML file and the flags are too) and what only a
//! registered store has (scheduled drills, a request budget, a replica, the standby role).
//! Every `None` means the service's default.
//!
//! One record from the API to the worker: a request's options (mapped from proto once,
//! `proto.rs`) are checked once at registration (`check.rs`), stored
//! (`row.rs`, the registry's JSON) and handed to the worker as they are; a row read back (a
//! restart, a failover, a move) is decoded once and brought into range
//! ([`StoreOptions::of_row`]), and [`StoreOptions::apply`] lays them over the worker's
//! configuration.

use serde::{Deserialize, Serialize};

use crate::bucket::throttle::{ClassLimit, LimitSet};
use crate::bucket::write_once::LockMode;
use crate::worker::WorkerConfig;
use crate::worker::overrides::WorkerOverrides;

mod check;
pub mod proto;
mod row;

/// Per-store settings stored in the registry; `None` = the service's default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreOptions {
    /// What the store's worker runs with over the service's `[worker]` settings.
    #[serde(flatten)]
    pub worker: WorkerOverrides,
    /// Scheduled restore drills, every this many ms (`crate::service::ops::drill`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drill_interval_ms: Option<u64>,
    /// Requests a month; a projection over it is a health note (`crate::cost`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monthly_request_budget: Option<u64>,
    /// The restore time the store must stay under, seconds; a prediction over it is a health
    /// note and a metric (`crate::service::fleet::rto`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rto_target_seconds: Option<u64>,
    /// A second destination with a worker of its own (`check.rs`, `super::replica`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
    /// A standby of the destination (`super::standby`): followed, never written, until
    /// promoted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standby: Option<bool>,
    /// The store's own traffic limits, `CLASS=BYTES_PER_SECOND[,requests=N]` each
    /// (`crate::bucket::throttle`; changed live by SetLimits, `super::limits`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub limits: Vec<String>,
}

impl StoreOptions {
    /// The worker's configuration: `base` (the service's) with these options over it.
    pub fn apply(&self, base: &WorkerConfig) -> WorkerConfig {
        self.worker.apply(base)
    }

    /// Whether the store is a standby (`super::standby`).
    pub fn is_standby(&self) -> bool {
        self.standby == Some(true)
    }

    /// The replica's URL, if the store names one.
    pub fn replica(&self) -> Option<&str> {
        self.replica.as_deref().filter(|r| !r.is_empty())
    }

    /// The store's own traffic limits (those that parse: a row's are checked when registered,
    /// and [`Self::clamped`] drops any that do not).
    pub fn limit_set(&self) -> LimitSet {
        let parsed = self.limits.iter().filter_map(|l| ClassLimit::parse(l).ok());
        LimitSet::none().with(&parsed.collect::<Vec<_>>())
    }

    /// The store's own Object Lock mode, if it sets one.
    pub fn object_lock(&self) -> Option<LockMode> {
        self.worker.object_lock
    }
}
