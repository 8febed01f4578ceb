//! A store's options in the protocol: `proto::StoreOptions` (where 0, an empty string and
//! `UNSPECIFIED` mean "the service's default") to the typed [`StoreOptions`] and back. The
//! one place the proto form is spelled out: the edge maps a request with [`from_proto`], the
//! health view a registry row with [`to_proto`] (both rooms sit above the fleet, so the
//! mapping sits here, beside the record), and the CLI's `ctl register` builds a
//! [`StoreOptions`] and sends it through [`to_proto`] too. Nothing else of the fleet sees
//! the proto form.
//!
//! An enum value this version does not know is refused here, naming the field (the edge
//! audits the refusal); ranges are checked with the rest (`check.rs`).

use super::StoreOptions;
use crate::bucket::write_once::LockMode;
use crate::service::fleet::admission::limits::FieldError;
use crate::service::proto;
use crate::worker::DurabilityMode;
use crate::worker::overrides::{CompressionKind, WorkerOverrides};

/// A request's options: 0 (or no options at all) is the service's default.
pub fn from_proto(o: Option<proto::StoreOptions>) -> Result<StoreOptions, FieldError> {
    let o = o.unwrap_or_default();
    let nz = |v: u64| (v != 0).then_some(v);
    Ok(StoreOptions {
        worker: WorkerOverrides {
            wal_interval_ms: nz(o.wal_interval_ms),
            restore_point_interval_ms: nz(o.restore_point_interval_ms),
            retention_interval_ms: nz(o.retention_interval_ms),
            keep_for_ms: nz(o.keep_for_ms),
            keep_generations: nz(o.keep_generations),
            keep_daily: nz(o.keep_daily),
            keep_weekly: nz(o.keep_weekly),
            keep_monthly: nz(o.keep_monthly),
            compression: compression_of(o.compression)?,
            compression_level: (o.compression_level != 0).then_some(i64::from(o.compression_level)),
            object_lock: lock_of(o.object_lock)?,
            durability: durability_of(o.durability)?,
            wal_puts_per_second: nz(u64::from(o.wal_puts_per_second)),
            orphan_grace_ms: nz(o.orphan_grace_ms),
        },
        drill_interval_ms: nz(o.drill_interval_ms),
        monthly_request_budget: nz(o.monthly_request_budget),
        rto_target_seconds: nz(o.rto_target_seconds),
        replica: (!o.replica.is_empty()).then_some(o.replica),
        standby: o.standby.then_some(true),
        limits: o.limits,
    })
}

/// The proto form of a store's options (the service's default: 0).
pub fn to_proto(o: &StoreOptions) -> proto::StoreOptions {
    let w = &o.worker;
    proto::StoreOptions {
        wal_interval_ms: w.wal_interval_ms.unwrap_or(0),
        restore_point_interval_ms: w.restore_point_interval_ms.unwrap_or(0),
        retention_interval_ms: w.retention_interval_ms.unwrap_or(0),
        keep_for_ms: w.keep_for_ms.unwrap_or(0),
        keep_generations: w.keep_generations.unwrap_or(0),
        keep_daily: w.keep_daily.unwrap_or(0),
        keep_weekly: w.keep_weekly.unwrap_or(0),
        keep_monthly: w.keep_monthly.unwrap_or(0),
        compression: match w.compression {
            Some(CompressionKind::Zstd) => proto::Compression::Zstd,
            Some(CompressionKind::None) => proto::Compression::None,
            None => proto::Compression::Unspecified,
        } as i32,
        compression_level: w
            .compression_level
            .map_or(0, |v| u32::try_from(v).unwrap_or(0)),
        object_lock: match w.object_lock {
            Some(LockMode::Governance) => proto::ObjectLockMode::Governance,
            Some(LockMode::Compliance) => proto::ObjectLockMode::Compliance,
            None => proto::ObjectLockMode::Unspecified,
        } as i32,
        durability: match w.durability {
            Some(DurabilityMode::Async) => proto::Durability::Async,
            Some(DurabilityMode::Sync) => proto::Durability::Sync,
            None => proto::Durability::Unspecified,
        } as i32,
        wal_puts_per_second: w
            .wal_puts_per_second
            .map_or(0, |v| u32::try_from(v).unwrap_or(u32::MAX)),
        orphan_grace_ms: w.orphan_grace_ms.unwrap_or(0),
        drill_interval_ms: o.drill_interval_ms.unwrap_or(0),
        monthly_request_budget: o.monthly_request_budget.unwrap_or(0),
        rto_target_seconds: o.rto_target_seconds.unwrap_or(0),
        replica: o.replica.clone().unwrap_or_default(),
        standby: o.is_standby(),
        limits: o.limits.clone(),
    }
}

fn compression_of(v: i32) -> Result<Option<CompressionKind>, FieldError> {
    match proto::Compression::try_from(v) {
        Ok(proto::Compression::Zstd) => Ok(Some(CompressionKind::Zstd)),
        Ok(proto::Compression::None) => Ok(Some(CompressionKind::None)),
        Ok(proto::Compression::Unspecified) => Ok(None),
        Err(_) => Err(FieldError(format!(
            "options.compression \"enum value {v}\" is not a codec: use zstd or none"
        ))),
    }
}

/// `options.object_lock` as a mode (`None`: unset).
pub fn lock_of(v: i32) -> Result<Option<LockMode>, FieldError> {
    match proto::ObjectLockMode::try_from(v) {
        Ok(proto::ObjectLockMode::Unspecified) => Ok(None),
        Ok(proto::ObjectLockMode::Governance) => Ok(Some(LockMode::Governance)),
        Ok(proto::ObjectLockMode::Compliance) => Ok(Some(LockMode::Compliance)),
        Err(_) => Err(FieldError(format!(
            "options.object_lock: object lock mode \"enum value {v}\": must be \"governance\" \
             or \"compliance\""
        ))),
    }
}

/// `options.durability` as a mode (`None`: unset).
pub fn durability_of(v: i32) -> Result<Option<DurabilityMode>, FieldError> {
    match proto::Durability::try_from(v) {
        Ok(proto::Durability::Async) => Ok(Some(DurabilityMode::Async)),
        Ok(proto::Durability::Sync) => Ok(Some(DurabilityMode::Sync)),
        Ok(proto::Durability::Unspecified) => Ok(None),
        Err(_) => Err(FieldError(format!(
            "options.durability \"enum value {v}\" is not one of \"async\", \"sync\""
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_option_round_trips_and_unknown_enum_values_are_named() {
        let full = proto::StoreOptions {
            wal_interval_ms: 1,
            restore_point_interval_ms: 2,
            retention_interval_ms: 3,
            keep_for_ms: 4,
            keep_generations: 5,
            compression: proto::Compression::Zstd as i32,
            compression_level: 7,
            drill_interval_ms: 60_000,
            monthly_request_budget: 9,
            keep_daily: 10,
            keep_weekly: 11,
            keep_monthly: 12,
            object_lock: proto::ObjectLockMode::Compliance as i32,
            durability: proto::Durability::Sync as i32,
            wal_puts_per_second: 13,
            orphan_grace_ms: 14,
            replica: "s3://b/r".into(),
            standby: true,
            rto_target_seconds: 15,
            limits: vec!["bulk=16".into()],
        };
        let typed = from_proto(Some(full.clone())).unwrap();
        assert_eq!(to_proto(&typed), full);
        assert_eq!(
            to_proto(&from_proto(None).unwrap()),
            proto::StoreOptions::default()
        );
        for (bad, field) in [
            (
                proto::StoreOptions {
                    compression: 7,
                    ..Default::default()
                },
                "options.compression",
            ),
            (
                proto::StoreOptions {
                    object_lock: 7,
                    ..Default::default()
                },
                "options.object_lock",
            ),
            (
                proto::StoreOptions {
                    durability: 7,
                    ..Default::default()
                },
                "options.durability",
            ),
        ] {
            let e = from_proto(Some(bad)).unwrap_err().0;
            assert!(e.starts_with(field), "{e}");
        }
    }
}
