//! Where a branch's objects are read from. A branch manifest (`manifest::BranchOrigin`) names
//! the objects of one other prefix, its holder (`Manifest::holder`: the parent's prefix, or
//! for a branch of a branch the prefix its parent's objects are under). Its restore reads them
//! there, through the bucket's sibling of that prefix (same bucket, client and wrappers), and
//! reads the holder's wrapped generation keys with them; the keys of the manifest entries are
//! then the holder's own. The branch prefix itself is read for its manifests only.
//!
//! A hostile branch manifest can make a restore read another prefix: of the same bucket only
//! on S3 (`Bucket::sibling` refuses another bucket), any existing directory the restorer can
//! read for a `file://` destination (nothing is created in it). Either way with the
//! restorer's own access, and every object read is still checked against its entry: it cannot
//! bring in bytes its manifest did not describe. The holder is logged.
//!
//! # What a crash leaves
//! Nothing: it only reads.

use super::RestoreError;
use super::plan::Plan;
use crate::bucket::{Bucket, DynBucket};

/// The bucket holding `plan`'s objects when its manifest is a branch's (its entries' prefixes
/// cleared: keys of that bucket), `None` when they are under `bucket`'s own prefix.
pub(crate) fn of(bucket: &dyn Bucket, plan: &mut Plan) -> Result<Option<DynBucket>, RestoreError> {
    let Some(holder) = plan.manifest.take_holder() else {
        return Ok(None);
    };
    let source = bucket.sibling(&holder)?;
    tracing::info!(
        branch = %crate::bucket::url::without_query(&bucket.url()),
        holder = %holder,
        fork = plan.manifest.commit_seq,
        "restoring a branch: its objects are read where its parent keeps them"
    );
    Ok(Some(source))
}
