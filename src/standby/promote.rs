//! Promotion of a standalone standby (`mushroom-backup promote --dir DIR --from URL`): the
//! standby's directory becomes the prefix's primary, without two writers and without a fork.
//!
//! # The steps (the caller holds the prefix's bucket lease throughout)
//! 1. **Fence**: the caller takes the prefix's lease (`cli/standby.rs`, as `backup --once` does:
//!    refused naming a live holder; `--wait-for-lease` waits until the holder's lease is stale,
//!    at most its TTL after its last renewal). A holder's `may_write` ends a tenth of a TTL
//!    before its lease can be taken over (DESIGN.md section 7), so once the lease is taken the
//!    old writer has stopped writing by its own clock; its next conditional write of LATEST
//!    fails once step 4 has moved LATEST, and its restart is refused by the lineage rule.
//! 2. **Apply everything durable** ([`catch_up`]): the standby's own apply, until a poll finds
//!    nothing new. Under the lease nothing new can come.
//! 3. **Adopt** ([`adopt`]): the restore point LATEST names must be of the lineage followed, of
//!    the generation the directory holds and at most its commits; `backup.parent` names it
//!    (`{lineage, manifest, commit_seq}` of that restore point, as a boot restore writes it),
//!    then a new random `backup.lineage` is written, each write-tmp-fsync-rename. The worker's
//!    adoption rule (`worker::lineage`) then lets the directory write the prefix as its own
//!    lineage, after every generation in it, while LATEST names exactly that parent.
//! 4. **Back up**: the caller hands the lease, unreleased, to a backup worker with the same
//!    holder id (the lease is then its own: taken at once, so no one else can take it in
//!    between) and follows the directory as `backup` does. Its first generation is of the new
//!    lineage, after every generation in the prefix, and holds every commit applied; its first
//!    restore point comes with the first new commit (an adopting store never rewrites its
//!    parent's restore-point key, `manifests/<commit_seq>`), and moves LATEST to the new
//!    lineage. From then on the old primary is refused by the lineage rule too; until then by
//!    the lease, which the worker renews.
//!
//! # What a crash leaves
//! Before step 3: a standby (restart `restore --follow` or `promote`). Between the two writes
//! of step 3: a parent record beside the followed lineage's `backup.lineage`: the directory is
//! still a standby of that lineage, and `promote` again finishes the job (it rewrites both).
//! After step 3, before step 4 finished: a store of the new lineage whose parent LATEST still
//! names: `backup` adopts the prefix (`promote` again refuses it: it is no longer a standby of
//! the lineage LATEST names). The lease object a crash leaves goes stale within its TTL.

use std::path::Path;

use serde::Serialize;
use uuid::Uuid;

use super::{Applied, StandbyError, StandbyOptions, blocking};
use crate::bucket::Bucket;
use crate::restore::plan::latest_restore_point;
use crate::store::disk::{LINEAGE_FILE, PARENT_FILE, write_file_durably};
use crate::store::format::ParentRecord;

/// What a promotion wrote into the directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Adopted {
    /// What the directory holds: every commit the prefix had shipped.
    pub applied: Applied,
    /// `backup.parent`: the restore point LATEST names.
    pub parent: ParentRecord,
    /// `backup.lineage`: the directory's own lineage from now on.
    pub new_lineage: Uuid,
}

/// Step 2: applies everything the prefix holds into `dir` (restoring it if empty), until a
/// poll finds nothing new; returns where it stands.
pub async fn catch_up(
    bucket: &dyn Bucket,
    dir: &Path,
    opts: &StandbyOptions,
) -> Result<Applied, StandbyError> {
    opts.check()?;
    let crash = super::Crash(opts.crash_at);
    let (mut now, _) = super::start(bucket, dir, opts, &crash).await?;
    loop {
        match super::step(bucket, dir, &now.at, opts, &crash).await? {
            Some((next, _, _)) => {
                now = super::Following {
                    at: next.at,
                    _lock: next.lock.unwrap_or(now._lock),
                }
            }
            None => return Ok(now.at),
        }
    }
}

/// Step 3 (see the module docs) for a directory at `applied`.
pub async fn adopt(
    bucket: &dyn Bucket,
    dir: &Path,
    applied: &Applied,
) -> Result<Adopted, StandbyError> {
    let (key, m) = latest_restore_point(bucket, &mut Vec::new()).await?;
    if m.lineage != applied.lineage {
        return Err(StandbyError::LineageChanged {
            ours: applied.lineage,
            prefix: m.lineage,
        });
    }
    if m.generation != applied.generation || m.commit_seq > applied.commit_seq {
        return Err(StandbyError::NotAStore {
            dir: dir.to_path_buf(),
            detail: format!(
                "it holds generation {} to commit {}, but LATEST names {key} (generation {}, \
                 commit {}): it is not caught up; promote again",
                applied.generation, applied.commit_seq, m.generation, m.commit_seq
            ),
        });
    }
    let parent = ParentRecord {
        lineage: m.lineage,
        manifest: key,
        commit_seq: m.commit_seq,
    };
    let new_lineage = Uuid::new_v4();
    let record = serde_json::to_vec(&parent).map_err(|e| StandbyError::NotAStore {
        dir: dir.to_path_buf(),
        detail: format!("parent record: {e}"),
    })?;
    let d = dir.to_path_buf();
    blocking(move || {
        let write = |name: &str, data: &[u8]| {
            write_file_durably(&d, name, data).map_err(|e| StandbyError::NotAStore {
                dir: d.clone(),
                detail: e.to_string(),
            })
        };
        write(PARENT_FILE, &record)?;
        write(LINEAGE_FILE, format!("{new_lineage}\n").as_bytes())
    })
    .await?;
    Ok(Adopted {
        applied: applied.clone(),
        parent,
        new_lineage,
    })
}
