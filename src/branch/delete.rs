//! `branch delete`: a branch given up. Its pin in the prefix holding its objects is
//! released, so the next retention pass there reclaims what only the branch named; then its
//! fork manifest (and LATEST, while it names it) is deleted from the branch prefix, which then
//! claims no restore point whose objects may go.
//!
//! What the branch prefix holds of its own (restore points a store restored from the branch
//! backed up there, under its own lineage, with its own objects) stays: it names nothing of the
//! parent, and that prefix's own retention keeps or drops it as for any prefix.
//!
//! A write-once branch (`--object-lock`): the release is created under Object Lock and nothing
//! is deleted; the fork manifest and its pointer stay until the bucket's lifecycle removes them.
//!
//! # What a crash leaves
//! - Before the release: the branch, whole.
//! - After it: the branch is gone as far as the parent is concerned (its objects may be
//!   reclaimed); its fork manifest may still be listed, and a restore of it fails naming the
//!   missing object. Running `branch delete` again finishes (the release is created once; a
//!   second run finds it there).

use serde::Serialize;
use uuid::Uuid;

use super::BranchError;
use crate::bucket::write_once::{ObjectLock, WriteOnce};
use crate::bucket::{self, BucketError, DynBucket};
use crate::manifest::{self, LATEST_KEY, MANIFESTS_PREFIX, Manifest};

/// What a `branch delete` did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeleteReport {
    pub branch: String,
    pub lineage: Uuid,
    /// The prefix whose pin was released.
    pub holder: String,
    /// The fork manifest's key, deleted from the branch prefix (kept in a write-once one:
    /// `manifest_deleted` false; a restore of it then fails naming an object reclaimed).
    pub manifest: String,
    pub manifest_deleted: bool,
    pub latest_deleted: bool,
    /// Restore points of the branch prefix's own that stay (a store backed up into it).
    pub own_restore_points_left: u64,
}

impl std::fmt::Display for DeleteReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "deleted branch {} (lineage {}): its pin in {} is released (the next retention \
             there reclaims what only the branch named), {} {}",
            self.branch,
            self.lineage,
            self.holder,
            self.manifest,
            if self.manifest_deleted {
                "deleted"
            } else {
                "kept (a write-once prefix: the bucket's lifecycle removes it)"
            }
        )?;
        if self.latest_deleted {
            write!(f, " with {LATEST_KEY}")?;
        }
        if self.own_restore_points_left > 0 {
            write!(
                f,
                "; {} restore points of its own stay in the prefix (its retention keeps or \
                 drops them)",
                self.own_restore_points_left
            )?;
        }
        Ok(())
    }
}

/// The branch manifest of the prefix `bucket`: the oldest manifest that is a branch's. `Ok(None)`
/// when there is none. Lists `manifests/` and reads manifests oldest first until it finds it
/// (the fork is the prefix's first restore point).
pub async fn find(bucket: &dyn bucket::Bucket) -> Result<(Option<Manifest>, u64), BucketError> {
    let mut keys: Vec<String> = bucket::list_all(bucket, MANIFESTS_PREFIX)
        .await?
        .into_iter()
        .map(|o| o.key)
        .filter(|k| manifest::parse_manifest_key(k).is_some())
        .collect();
    keys.sort();
    let total = keys.len() as u64;
    for key in keys {
        let m = match bucket.get(&key).await {
            Ok(o) => Manifest::decode(&key, &o.data).ok(),
            Err(BucketError::NotFound { .. }) => None,
            Err(e) => return Err(e),
        };
        if let Some(m) = m.filter(|m| m.branch.is_some()) {
            return Ok((Some(m), total));
        }
    }
    Ok((None, total))
}

/// Deletes the branch at `branch` (opened read-write at `url`); see the module docs.
pub async fn delete(
    branch: DynBucket,
    url: &str,
    lock: Option<ObjectLock>,
) -> Result<DeleteReport, BranchError> {
    let url = super::prefix_url(url)?;
    let branch = match lock {
        Some(lock) => std::sync::Arc::new(WriteOnce::new(branch, lock)) as DynBucket,
        None => branch,
    };
    let (fork, manifests) = find(branch.as_ref()).await?;
    let Some(m) = fork else {
        return Err(BranchError::NotABranch {
            url,
            detail: format!(
                "none of its {manifests} restore points is a branch manifest (already deleted, \
                 or never a branch)"
            ),
        });
    };
    let holder_url = m.holder().unwrap_or_default().to_string();
    let holder = branch.sibling(&holder_url)?;
    super::release(holder.as_ref(), m.lineage).await?;
    let key = m.key();
    let mut latest_deleted = false;
    if lock.is_some() {
        tracing::info!(branch = %url, lineage = %m.lineage, holder = %holder_url, "released a write-once branch");
        return Ok(DeleteReport {
            branch: url,
            lineage: m.lineage,
            holder: holder_url,
            manifest: key,
            manifest_deleted: false,
            latest_deleted,
            own_restore_points_left: manifests.saturating_sub(1),
        });
    }
    if let Some(found) = crate::latest::read(branch.as_ref()).await?
        && found.latest.as_ref().is_ok_and(|l| l.manifest == key)
        && let crate::latest::Version::Etag(etag) = &found.version
    {
        match branch.delete(LATEST_KEY, Some(etag)).await {
            Ok(()) => latest_deleted = true,
            // Moved meanwhile (a store backed up into the branch): it names its own now.
            Err(BucketError::PreconditionFailed { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    branch.delete(&key, None).await?;
    tracing::info!(branch = %url, lineage = %m.lineage, holder = %holder_url, "deleted a branch");
    Ok(DeleteReport {
        branch: url,
        lineage: m.lineage,
        holder: holder_url,
        manifest: key,
        manifest_deleted: true,
        latest_deleted,
        own_restore_points_left: manifests.saturating_sub(1),
    })
}
