//! A store's Object Lock option ([`StoreOptions::object_lock`]): `governance` or `compliance`
//! makes its prefix write-once (`crate::latest`, `crate::bucket::write_once`); unset, the
//! service's default. Only an `s3://` destination can hold it: a local directory cannot lock
//! an object, so Register refuses the pair rather than a worker failing at its first upload.

use super::StoreOptions;
use super::limits::FieldError;
use crate::bucket::write_once::LockMode;
use crate::service::proto;

impl StoreOptions {
    /// The lock mode these options ask for, if any; an error names the field.
    pub fn object_lock(&self) -> Result<Option<LockMode>, String> {
        self.object_lock
            .as_deref()
            .map(|m| LockMode::parse(m).map_err(|e| format!("options.object_lock: {e}")))
            .transpose()
    }

    /// A write-once store's destination must be S3 (by its own option, or the service's
    /// default `service`).
    pub fn check_object_lock_destination(
        &self,
        destination: &str,
        service: Option<LockMode>,
    ) -> Result<(), FieldError> {
        let (field, mode) = match (self.object_lock.as_deref(), service) {
            (Some(mode), _) => ("options.object_lock", mode),
            (None, Some(mode)) => ("the service's object_lock", mode.name()),
            (None, None) => return Ok(()),
        };
        match mode {
            mode if !destination.starts_with("s3://") => Err(FieldError(format!(
                "{field} {mode} needs an s3:// destination in a bucket with Object \
                 Lock enabled; {destination} cannot lock objects"
            ))),
            _ => Ok(()),
        }
    }

    pub(super) fn object_lock_of_proto(v: i32) -> Option<String> {
        match proto::ObjectLockMode::try_from(v) {
            Ok(proto::ObjectLockMode::Unspecified) => None,
            Ok(proto::ObjectLockMode::Governance) => Some("governance".into()),
            Ok(proto::ObjectLockMode::Compliance) => Some("compliance".into()),
            // Refused by the options' check, naming the field.
            Err(_) => Some(format!("enum value {v}")),
        }
    }

    pub(super) fn object_lock_to_proto(&self) -> i32 {
        let mode = match self.object_lock() {
            Ok(Some(LockMode::Governance)) => proto::ObjectLockMode::Governance,
            Ok(Some(LockMode::Compliance)) => proto::ObjectLockMode::Compliance,
            _ => proto::ObjectLockMode::Unspecified,
        };
        mode as i32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_round_trip_and_bad_values_are_named() {
        for v in [0, 1, 2] {
            let o = StoreOptions {
                object_lock: StoreOptions::object_lock_of_proto(v),
                ..Default::default()
            };
            assert!(o.object_lock().is_ok());
            assert_eq!(o.object_lock_to_proto(), v);
        }
        let bad = StoreOptions {
            object_lock: StoreOptions::object_lock_of_proto(7),
            ..Default::default()
        };
        assert!(
            bad.object_lock()
                .unwrap_err()
                .contains("options.object_lock")
        );
        assert!(bad.check().is_err());
        let locked = StoreOptions {
            object_lock: Some("compliance".into()),
            ..Default::default()
        };
        let e = locked
            .check_object_lock_destination("file:///tmp/x", None)
            .unwrap_err();
        assert!(e.0.contains("s3://"), "{}", e.0);
        assert!(
            locked
                .check_object_lock_destination("s3://b/p", None)
                .is_ok()
        );
        let e = StoreOptions::default()
            .check_object_lock_destination("file:///tmp/x", Some(LockMode::Governance))
            .unwrap_err();
        assert!(
            e.0.contains("the service's object_lock governance"),
            "{}",
            e.0
        );
    }
}
