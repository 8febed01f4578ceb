//! Branches: a new prefix that restores to exactly a parent prefix's state at one commit,
//! naming the parent's objects where they are (no data object copied or rewritten), under a
//! lineage of its own; and the pins that keep those objects from the parent's retention.
//!
//! # A branch, request by request ([`create`])
//! 1. The branch prefix must be in the parent's bucket (reached through its sibling, the same
//!    client), neither the parent's prefix nor inside it (nor around it), and hold nothing:
//!    one LIST of one key.
//! 2. The parent's restore point reaching the fork commit ([`fork`]; usually a LIST and a GET).
//! 3. **The pin**, `pins/<branch lineage>.json`, created once in the prefix holding the objects
//!    (the parent's, or for a branch of a branch, the prefix its parent's objects are in):
//!    every key the branch names there.
//! 4. **The check**: what protected those objects when they were read still does: the
//!    parent's manifest is still there (a retention pass deletes manifests before it reads
//!    pins, so one that missed the pin still keeps what that manifest names), or for a branch
//!    of a branch, its parent's pin is still there and not released. If not, the pin is
//!    released at once and the branch refused ([`BranchError::Raced`]).
//! 5. **The branch manifest** (`manifests/<N>.json`, created once), then **LATEST**
//!    (`If-None-Match`).
//!
//! Seven requests at best (the LIST of the branch, the LIST and GET of the parent's
//! manifest, the pin, the HEAD, the manifest, LATEST), whatever the store's size.
//!
//! # What a crash leaves
//! - Before the pin: nothing.
//! - A pin without its branch manifest: retention holds its objects for its `orphan_grace` (an
//!   hour by default) and then reclaims the pin (its manifest is not there; `crate::pins`).
//! - The manifest without LATEST: a complete branch (a restore and a worker's resume find the
//!   newest manifest by listing when LATEST is missing, with a warning).
//!
//! # Limits
//! A fork in the segments an older generation shipped past its last manifest (before its
//! next snapshot) is held by the pin from the moment the pin exists, but a retention pass of
//! the parent that read its pins just before may still delete them: those segments are named
//! by no manifest, so step 4 has nothing to check. Forks at or before a restore point, or in
//! the generation being shipped, have no such gap. A write-once parent (Object Lock): the pin
//! is created as every object is, but the objects it holds are not yet held past their own
//! retain-until dates.

pub mod delete;
pub mod fork;

use std::sync::Arc;

use serde::Serialize;
use uuid::Uuid;

use futures::StreamExt;

use crate::bucket::counting::CountingBucket;
use crate::bucket::write_once::{CLOCK_SLACK, ObjectLock, Retention, WriteOnce};
use crate::bucket::{self, Body, Bucket, BucketError, DynBucket, ListQuery, PutCondition};
use crate::manifest::{self, Latest, Manifest, Pin, Release};
use crate::restore::{RestoreError, RestoreOptions};

/// Why a branch could not be made or deleted.
#[derive(Debug, thiserror::Error)]
pub enum BranchError {
    #[error("branch destination {url}: {detail}")]
    Destination { url: String, detail: String },
    #[error("parent: {detail}")]
    Parent { detail: String },
    #[error(transparent)]
    Restore(#[from] RestoreError),
    #[error(transparent)]
    Bucket(#[from] BucketError),
    #[error(
        "the parent's restore point changed while the branch was cut ({detail}); nothing was \
         branched (its pin is released): try again"
    )]
    Raced { detail: String },
    #[error("{url} is not a branch: {detail}")]
    NotABranch { url: String, detail: String },
}

/// Where a branch is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForkAt {
    Commit(u64),
    /// Unix ms, resolved as `restore --at-time` resolves it.
    Time(i64),
}

/// What a branch did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BranchReport {
    /// The branch prefix's URL.
    pub branch: String,
    /// The fork commit: what the branch restores to.
    pub commit_seq: u64,
    /// The branch's lineage.
    pub lineage: Uuid,
    /// The parent prefix, its restore point and lineage.
    pub parent: String,
    pub parent_manifest: String,
    pub parent_lineage: Uuid,
    /// The prefix holding the objects the branch names (and its pin).
    pub holder: String,
    /// The branch manifest's key.
    pub manifest: String,
    /// Objects the branch names, and their stored bytes (kept alive by its pin).
    pub objects: u64,
    pub pinned_bytes: u64,
    /// Bucket requests the branch made (every kind; not the caller's opening of the parent,
    /// which the CLI checks with a LIST of its own), and bytes it wrote.
    pub requests: u64,
    pub bytes_written: u64,
    pub seconds: f64,
}

impl std::fmt::Display for BranchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "branched {} at commit {} into {} (lineage {}): {} objects ({} bytes) of {} named \
             where they are, none copied; {} requests, {} bytes written, {:.2} s",
            self.parent,
            self.commit_seq,
            self.branch,
            self.lineage,
            self.objects,
            self.pinned_bytes,
            self.holder,
            self.requests,
            self.bytes_written,
            self.seconds
        )
    }
}

/// A prefix's URL as a branch manifest names it: no query, an S3 prefix without slashes at
/// its ends.
pub fn prefix_url(url: &str) -> Result<String, BranchError> {
    let bad = |detail: String| BranchError::Destination {
        url: bucket::url::without_query(url).to_string(),
        detail,
    };
    let plain = match bucket::url::parse(url).map_err(|e| bad(e.to_string()))? {
        bucket::url::DestinationUrl::File(p) => format!("file://{}", p.trim_end_matches('/')),
        bucket::url::DestinationUrl::S3 { bucket, prefix, .. } if prefix.is_empty() => {
            format!("s3://{bucket}")
        }
        bucket::url::DestinationUrl::S3 { bucket, prefix, .. } => format!("s3://{bucket}/{prefix}"),
    };
    match manifest::prefix_url_problem(&plain) {
        Some(why) => Err(bad(why.to_string())),
        None => Ok(plain),
    }
}

/// Whether one of the two prefixes is the other or holds it.
fn nested(a: &str, b: &str) -> bool {
    let (a, b) = (format!("{a}/"), format!("{b}/"));
    a.starts_with(&b) || b.starts_with(&a)
}

/// Cuts a branch of `parent` (opened read-write at `parent_url`) at `at` into `branch_url`;
/// see the module docs. `opts` are the restore options the fork point is chosen with (its
/// keys open an encrypted parent's extension segments).
pub async fn create(
    parent: DynBucket,
    parent_url: &str,
    branch_url: &str,
    at: ForkAt,
    opts: &RestoreOptions,
    lock: Option<ObjectLock>,
) -> Result<BranchReport, BranchError> {
    let started = std::time::Instant::now();
    let (parent_url, branch_url) = (prefix_url(parent_url)?, prefix_url(branch_url)?);
    if nested(&parent_url, &branch_url) {
        return Err(BranchError::Destination {
            url: branch_url,
            detail: format!("is {parent_url} or overlaps it: a branch needs a prefix of its own"),
        });
    }
    // Write-once: every object created under Object Lock, nothing overwritten or deleted (the
    // sibling of a write-once bucket is one too, sharing its memory of dates).
    let parent = match lock {
        Some(lock) => Arc::new(WriteOnce::new(parent, lock)) as DynBucket,
        None => parent,
    };
    let counted = Arc::new(CountingBucket::new(parent));
    let parent: DynBucket = counted.clone();
    let branch = sibling_made(parent.as_ref(), &branch_url)?;
    let first = branch.list(ListQuery::new("", None, 1)).await?;
    if let Some(o) = first.objects.first() {
        return Err(BranchError::Destination {
            url: branch_url,
            detail: format!("holds {} already: a branch goes to an empty prefix", o.key),
        });
    }
    let plan = match at {
        ForkAt::Commit(n) => fork::at_commit(parent.as_ref(), n, opts).await?,
        ForkAt::Time(t) => fork::at_time(parent.as_ref(), t, opts).await?,
    };
    let lineage = Uuid::new_v4();
    let m = fork::manifest_of(&plan, &parent_url, lineage)?;
    let holder_url = m.holder().unwrap_or(&parent_url).to_string();
    let holder = if holder_url == parent_url {
        parent.clone()
    } else {
        parent.sibling(&holder_url)?
    };
    let pin = Pin {
        branch: branch_url.clone(),
        lineage,
        manifest: m.key(),
        commit_seq: m.commit_seq,
        created_at: manifest::now_rfc3339(),
        keys: m.objects().map(|o| o.key.clone()).collect(),
        lens: m.objects().map(|o| o.len).collect(),
    };
    let mut written = 0u64;
    let pin_bytes = pin.encode();
    written += pin_bytes.len() as u64;
    create_once(holder.as_ref(), &manifest::pin_key(lineage), pin_bytes).await?;
    if let Some(detail) = still_held(parent.as_ref(), holder.as_ref(), &plan).await? {
        release(holder.as_ref(), lineage).await?;
        return Err(BranchError::Raced { detail });
    }
    if let Some(lock) = lock
        && let Err(e) = hold(holder.as_ref(), &m, lock).await
    {
        release(holder.as_ref(), lineage).await?;
        return Err(e);
    }
    let body = m.encode();
    written += body.len() as u64;
    create_once(branch.as_ref(), &m.key(), body).await?;
    let latest = Latest {
        manifest: m.key(),
        commit_seq: m.commit_seq,
        lineage,
        adopted_by: None,
        adopted_at: None,
    };
    written += latest.encode().len() as u64;
    let form = match lock {
        Some(_) => crate::latest::Form::WriteOnce,
        None => crate::latest::Form::Mutable,
    };
    crate::latest::write(branch.as_ref(), &latest, None, form, true)
        .await
        .map_err(|e| match e {
            crate::latest::LatestError::Bucket(b) => BranchError::Bucket(b),
            e => BranchError::Destination {
                url: branch_url.clone(),
                detail: format!("its LATEST: {e}"),
            },
        })?;
    Ok(BranchReport {
        branch: branch_url,
        commit_seq: m.commit_seq,
        lineage,
        parent: parent_url,
        parent_manifest: plan.manifest_key.clone(),
        parent_lineage: plan.manifest.lineage,
        holder: holder_url,
        manifest: m.key(),
        objects: m.objects().count() as u64,
        pinned_bytes: m.total_len().unwrap_or(0),
        requests: counted.counts().snapshot().total,
        bytes_written: written,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Holds every object branch manifest `m` names in `holder` (and, when encrypted, its
/// generations' wrapped data keys, a LIST each) under Object Lock until a restore point
/// created now must be kept, as a write-once worker holds what its restore point reuses
/// (`crate::worker::hold`): nothing for an object locked late enough already, a
/// `PutObjectRetention` (after a HEAD) for one that is not. An object the bucket refuses to
/// hold refuses the branch, naming it.
async fn hold(holder: &dyn Bucket, m: &Manifest, lock: ObjectLock) -> Result<(), BranchError> {
    use crate::crypto::key_objects;
    let mut keys: std::collections::BTreeSet<String> = m.objects().map(|o| o.key.clone()).collect();
    for (g, _) in key_objects::generations_to_open(m.objects()) {
        for o in bucket::list_all(holder, &key_objects::keys_prefix(g)).await? {
            if key_objects::is_wrapper_key(&o.key) {
                keys.insert(o.key);
            }
        }
    }
    let slack = i64::try_from(CLOCK_SLACK.as_millis()).unwrap_or(i64::MAX);
    let now = lock.retention_now();
    let until = Retention {
        mode: now.mode,
        until_ms: now.until_ms.saturating_sub(slack),
    };
    let results: Vec<(String, Result<(), BucketError>)> = futures::stream::iter(keys)
        .map(|key| async move {
            let r = holder.put_retention(&key, until).await;
            (key, r)
        })
        .buffer_unordered(8)
        .collect()
        .await;
    for (key, r) in results {
        r.map_err(|e| BranchError::Parent {
            detail: format!("{key} cannot be held under Object Lock for the branch: {e}"),
        })?;
    }
    Ok(())
}

/// The branch prefix, through the parent's sibling: a local directory is made a bucket first,
/// as any destination is when first written (an S3 prefix needs no making).
fn sibling_made(parent: &dyn Bucket, url: &str) -> Result<DynBucket, BranchError> {
    let unreachable = |e: &dyn std::fmt::Display| BranchError::Destination {
        url: url.to_string(),
        detail: format!("not reachable as a prefix of the parent's bucket: {e}"),
    };
    if let Some(dir) = url.strip_prefix("file://") {
        bucket::fs::FsBucket::open(std::path::Path::new(dir)).map_err(|e| unreachable(&e))?;
    }
    parent.sibling(url).map_err(|e| unreachable(&e))
}

/// Creates `key` once (`If-None-Match: *`); a retry that finds its own bytes there is its own
/// write.
async fn create_once(bucket: &dyn Bucket, key: &str, body: Vec<u8>) -> Result<(), BranchError> {
    bucket::put_immutable(bucket, key, Body::from(body), &PutCondition::IfNoneMatch).await?;
    Ok(())
}

/// Releases the pin of branch `lineage` in `holder` (created once; one already there is this
/// release done before).
pub(crate) async fn release(holder: &dyn Bucket, lineage: Uuid) -> Result<(), BucketError> {
    let r = Release {
        lineage,
        released_at: manifest::now_rfc3339(),
    };
    let key = manifest::release_key(lineage);
    match holder
        .put(&key, Body::from(r.encode()), PutCondition::IfNoneMatch)
        .await
    {
        Ok(_) | Err(BucketError::PreconditionFailed { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// After the pin: why the objects the branch names may have lost their protection while they
/// were read, if they may have (see the module docs, step 4).
async fn still_held(
    parent: &dyn Bucket,
    holder: &dyn Bucket,
    plan: &crate::restore::plan::Plan,
) -> Result<Option<String>, BucketError> {
    if plan.manifest.branch.is_none() {
        return Ok(match parent.head(&plan.manifest_key).await? {
            Some(_) => None,
            None => Some(format!("{} was deleted by retention", plan.manifest_key)),
        });
    }
    // A branch of a branch: its parent's objects are held by the parent's pin.
    let parent_lineage = plan.manifest.lineage;
    if holder
        .head(&manifest::release_key(parent_lineage))
        .await?
        .is_some()
    {
        return Ok(Some(format!(
            "the parent branch {parent_lineage} was deleted"
        )));
    }
    Ok(
        match holder.head(&manifest::pin_key(parent_lineage)).await? {
            Some(_) => None,
            None => Some(format!("the parent branch {parent_lineage} holds no pin")),
        },
    )
}
