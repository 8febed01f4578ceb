//! What Register and Adopt check of a store's options, before anything is written: each
//! option in its range (the worker's through [`WorkerOverrides::check`], named as request
//! fields), and the options that depend on the destination: a write-once store (`object_lock`)
//! needs an `s3://` destination, since a local directory cannot lock an object; a replica is a
//! destination Register would take, apart from the store's own, and write-once too when the
//! store is.
//!
//! The replica (issue 29) is a second destination filled by a second worker of the store's own
//! (`super::super::replica`), from the same directory, with its own bucket lease, supervisor,
//! health, usage and retention. Not checked against other stores' destinations or replicas
//! (an operator's choice, as two services backing one store up to two places would be).
//!
//! [`WorkerOverrides::check`]: crate::worker::overrides::WorkerOverrides::check

use super::StoreOptions;
use crate::bucket::write_once::LockMode;
use crate::service::fleet::admission::destination::{self, Destination, Placement};
use crate::service::fleet::admission::limits::{
    FieldError, MAX_DESTINATION_BYTES, MAX_DRILL_INTERVAL_MS, MAX_RTO_TARGET_SECONDS,
    MIN_DRILL_INTERVAL_MS, check_text,
};
use crate::worker::overrides::Source;

impl StoreOptions {
    /// Each option unset or in its range, named as a request's field.
    pub fn check(&self) -> Result<(), FieldError> {
        self.worker
            .check(Source::Request)
            .map_err(|e| FieldError(e.0))?;
        if let Some(r) = &self.replica {
            check_text("options.replica", r, MAX_DESTINATION_BYTES)?;
        }
        if let Some(v) = self.drill_interval_ms
            && !(MIN_DRILL_INTERVAL_MS..=MAX_DRILL_INTERVAL_MS).contains(&v)
        {
            return Err(FieldError(format!(
                "options.drill_interval_ms must be {MIN_DRILL_INTERVAL_MS} (1 minute) to \
                 {MAX_DRILL_INTERVAL_MS} (30 days), or 0 for no scheduled drills ({v} given)"
            )));
        }
        if let Some(v) = self.rto_target_seconds
            && !(1..=MAX_RTO_TARGET_SECONDS).contains(&v)
        {
            return Err(FieldError(format!(
                "options.rto_target_seconds must be 1 to {MAX_RTO_TARGET_SECONDS} (30 days), \
                 or 0 for no target ({v} given)"
            )));
        }
        crate::bucket::throttle::LimitSet::parse_all(&self.limits)
            .map_err(|e| FieldError(format!("options.limits: {e}")))?;
        Ok(())
    }

    /// A write-once store's destination must be S3 (by its own option, or the service's
    /// default `service`).
    pub fn check_object_lock_destination(
        &self,
        destination: &str,
        service: Option<LockMode>,
    ) -> Result<(), FieldError> {
        let (field, mode) = match (self.object_lock(), service) {
            (Some(mode), _) => ("options.object_lock", mode),
            (None, Some(mode)) => ("the service's object_lock", mode),
            (None, None) => return Ok(()),
        };
        match destination.starts_with("s3://") {
            true => Ok(()),
            false => Err(FieldError(format!(
                "{field} {} needs an s3:// destination in a bucket with Object Lock enabled; \
                 {destination} cannot lock objects",
                mode.name()
            ))),
        }
    }

    /// A replica (if any) that is a destination Register would take, apart from the store's
    /// own `primary`, and S3 when the store is write-once (by its own option, or the service's
    /// default `service`).
    pub fn check_replica(
        &self,
        primary: &Destination,
        placement: Placement<'_>,
        service: Option<LockMode>,
    ) -> Result<(), FieldError> {
        let Some(raw) = self.replica() else {
            return Ok(());
        };
        let field = |why: String| FieldError(format!("options.replica: {why}"));
        crate::bucket::url::parse(raw).map_err(|e| field(e.to_string()))?;
        let replica = destination::check(raw, placement).map_err(|e| field(e.to_string()))?;
        if replica.overlaps(primary) {
            return Err(field(format!(
                "{} shares objects with the store's destination: a replica needs a prefix of \
                 its own",
                crate::bucket::url::without_query(raw)
            )));
        }
        if (self.object_lock().is_some() || service.is_some()) && !raw.starts_with("s3://") {
            return Err(field(format!(
                "a write-once store's replica must be write-once too, in an s3:// bucket with \
                 Object Lock enabled; {} cannot lock objects",
                crate::bucket::url::without_query(raw)
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::overrides::WorkerOverrides;
    use std::path::{Path, PathBuf};

    fn locked(mode: LockMode) -> StoreOptions {
        StoreOptions {
            worker: WorkerOverrides {
                object_lock: Some(mode),
                ..WorkerOverrides::default()
            },
            ..StoreOptions::default()
        }
    }

    #[test]
    fn a_write_once_store_needs_an_s3_destination() {
        let o = locked(LockMode::Compliance);
        let e = o
            .check_object_lock_destination("file:///tmp/x", None)
            .unwrap_err();
        assert!(e.0.contains("s3://"), "{}", e.0);
        assert!(o.check_object_lock_destination("s3://b/p", None).is_ok());
        let e = StoreOptions::default()
            .check_object_lock_destination("file:///tmp/x", Some(LockMode::Governance))
            .unwrap_err();
        assert!(
            e.0.contains("the service's object_lock governance"),
            "{}",
            e.0
        );
    }

    fn check(primary: &str, replica: &str, lock: bool) -> Result<(), FieldError> {
        let o = StoreOptions {
            replica: Some(replica.to_string()),
            ..match lock {
                true => locked(LockMode::Governance),
                false => StoreOptions::default(),
            }
        };
        let roots = [PathBuf::from("/srv/stores")];
        let placement = Placement {
            store_roots: &roots,
            data_dir: Path::new("/var/lib/mb"),
            destination_roots: &[],
            endpoints: &["http://h:9000".to_string()],
        };
        o.check_replica(&Destination::parse(primary).unwrap(), placement, None)
    }

    #[test]
    fn a_replica_is_a_destination_of_its_own() {
        assert!(
            check(
                "s3://a/p",
                "s3://b/p?endpoint=http://h:9000&region=r",
                false
            )
            .is_ok()
        );
        assert!(check("s3://a/p", "s3://a/q", true).is_ok());
        for (replica, lock, says) in [
            ("s3://a/p", false, "shares objects"),
            ("s3://a/p/sub?region=r", false, "shares objects"),
            ("s3://a", false, "shares objects"),
            ("s3://b/p?regoin=r", false, "unknown query key"),
            ("s3://b/p?endpoint=", false, "endpoint is blank"),
            ("http://b/p", false, "must start with"),
            ("file:///srv/stores/x", false, "store root"),
            ("file:///backups/r", true, "write-once"),
        ] {
            let e = check("s3://a/p", replica, lock).unwrap_err().0;
            assert!(e.starts_with("options.replica"), "{replica}: {e}");
            assert!(e.contains(says), "{replica}: {e}");
        }
        assert!(StoreOptions::default().replica().is_none());
    }
}
