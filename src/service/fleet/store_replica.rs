//! A store's replica option ([`StoreOptions::replica`], issue 29): a second destination, filled
//! by a second worker of the store's own (see [`super::Fleet`]'s `spawn`), from the same store
//! directory, with its own bucket lease (fenced by this instance's lease of the replica's lease
//! root), its own supervisor and health (`StoreHealth.replica`), its own usage and its own
//! retention. The primary never waits for it: the two share the store's files (which both only
//! read, `backup.lineage` aside: [`crate::store::disk::write_lineage_once`]) and the node's
//! position reports, nothing else.
//!
//! Checked at Register and Adopt as a destination is (shape, query, place), and refused when
//! it shares objects with the store's own destination or when the store is write-once and the
//! replica is not S3. Not checked against other stores' destinations or replicas (an
//! operator's choice, as two services backing one store up to two places would be).

use super::StoreOptions;
use super::destination::{self, Destination, Placement};
use super::limits::FieldError;
use crate::bucket::write_once::LockMode;

impl StoreOptions {
    /// The replica's URL, if the store names one.
    pub fn replica(&self) -> Option<&str> {
        self.replica.as_deref().filter(|r| !r.is_empty())
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
        if (self.object_lock.is_some() || service.is_some()) && !raw.starts_with("s3://") {
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
    use std::path::{Path, PathBuf};

    fn check(primary: &str, replica: &str, lock: bool) -> Result<(), FieldError> {
        let o = StoreOptions {
            replica: Some(replica.to_string()),
            object_lock: lock.then(|| "governance".to_string()),
            ..Default::default()
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
