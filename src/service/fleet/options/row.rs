//! The registry's stored form of a store's options: the JSON object every version reads
//! (unknown keys of a newer version ignored, missing ones `None`), and a row read back as its
//! worker runs with it: each option in its range, or clamped into it.

use super::StoreOptions;
use crate::registry::StoreRecord;
use crate::service::fleet::FleetError;
use crate::service::fleet::admission::limits::{
    MAX_DRILL_INTERVAL_MS, MAX_RTO_TARGET_SECONDS, MIN_DRILL_INTERVAL_MS,
};

impl StoreOptions {
    /// The registry's stored form of these options.
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
                options.clamped()
            }
        })
    }

    /// A registry row's options as they were registered: decoded from the row's stored form,
    /// neither checked nor clamped (the one place that form is read; [`Self::of_row`] is what a
    /// worker runs with).
    pub fn as_registered(record: &StoreRecord) -> Result<StoreOptions, serde_json::Error> {
        serde_json::from_value(record.options.clone())
    }

    /// These options with every one brought into its range: what a store registered before
    /// the bounds (or with a registry edited by hand) runs with. Clamping only ever keeps more
    /// or works less often, never deletes sooner; the object lock and the standby role are
    /// never dropped (a write-once prefix written mutably would be refused by its worker, a
    /// standby run as a primary would write to its destination).
    pub fn clamped(&self) -> StoreOptions {
        StoreOptions {
            worker: self.worker.clamped(),
            drill_interval_ms: self
                .drill_interval_ms
                .map(|v| v.clamp(MIN_DRILL_INTERVAL_MS, MAX_DRILL_INTERVAL_MS)),
            rto_target_seconds: self
                .rto_target_seconds
                .map(|v| v.clamp(1, MAX_RTO_TARGET_SECONDS)),
            // A limit that does not parse is dropped (none is the service's default).
            limits: match crate::bucket::throttle::LimitSet::parse_all(&self.limits) {
                Ok(_) => self.limits.clone(),
                Err(_) => self
                    .limit_set()
                    .limits()
                    .iter()
                    .map(|l| l.to_string())
                    .collect(),
            },
            ..self.clone()
        }
    }
}
