//! Where a branch is cut: the parent's restore point that reaches the fork commit, found with
//! as few requests as the parent allows, and the branch manifest that names its objects.
//!
//! # The restore point
//! For `--at N`: the first manifest at or past N (one LIST page of `manifests/` starting at N,
//! one GET) when its snapshot holds at most N commits; otherwise the search `restore --at`
//! makes (every manifest, and the segments past them). For `--at-time`: the commit
//! `restore --at-time` restores, by the same rule.
//!
//! # The manifest
//! The parent's restore point as it is (its snapshot, archives, side files and segments, plus
//! the segments past it the fork needs, each as checked), the segments after the one holding N
//! left out, every object named where the parent keeps it (`ObjectEntry::prefix`), under a
//! new lineage, `generation` 0 and `commit_seq` N; the restore cuts the WAL right after frame
//! N, exactly as `restore --at N` of the parent does.
//!
//! # What a crash leaves
//! Nothing: it only reads.

use uuid::Uuid;

use super::BranchError;
use crate::bucket::{Bucket, ListQuery};
use crate::manifest::{self, BranchOrigin, MANIFESTS_PREFIX, Manifest};
use crate::restore::RestoreOptions;
use crate::restore::plan::{self, Plan};

/// The parent's restore point reaching commit `n` (see the module docs).
pub(crate) async fn at_commit(
    parent: &dyn Bucket,
    n: u64,
    opts: &RestoreOptions,
) -> Result<Plan, BranchError> {
    if n > 0 {
        let page = parent
            .list(
                ListQuery::new(MANIFESTS_PREFIX, None, 1)
                    .starting_after(manifest::manifest_key(n - 1)),
            )
            .await?;
        if let Some(o) = page.objects.first()
            && manifest::parse_manifest_key(&o.key).is_some_and(|c| c >= n)
            && let Ok(m) = plan::load_manifest(parent, &o.key).await?
            && m.snapshot.as_ref().map_or(0, |s| s.commit_seq) <= n
            && m.commit_seq >= n
        {
            return Ok(Plan {
                manifest_key: o.key.clone(),
                manifest: m,
                extension: Vec::new(),
                cached: Default::default(),
                commit_seq: n,
                cut: Some(n),
                commit_time_ms: None,
                warnings: Vec::new(),
                left_out: Vec::new(),
            });
        }
    }
    let opts = RestoreOptions {
        at: Some(n),
        at_time_ms: None,
        ..opts.clone()
    };
    Ok(crate::restore::choose(parent, &opts).await?)
}

/// The branch manifest of `plan` (cut at `plan.commit_seq`) for a branch of lineage `lineage`
/// whose parent prefix is `parent_url`.
pub(crate) fn manifest_of(
    plan: &Plan,
    parent_url: &str,
    lineage: Uuid,
) -> Result<Manifest, BranchError> {
    let n = plan.commit_seq;
    let mut m = plan.manifest.clone();
    m.segments.extend(plan.extension.iter().cloned());
    // The WAL files up to the one holding N: segments after it are not needed (when N is in
    // an archive, the first segment stays: a manifest always names wal.bin's start).
    let mut seq = m.wal_floor + m.archives.iter().map(|a| a.frames).sum::<u64>();
    let mut keep = 0;
    for (i, s) in m.segments.iter().enumerate() {
        if i > 0 && seq >= n {
            break;
        }
        seq += s.frames;
        keep = i + 1;
    }
    m.segments.truncate(keep.max(1));
    for o in m.objects_mut() {
        if o.prefix.is_none() {
            o.prefix = Some(parent_url.to_string());
        }
    }
    m.branch = Some(BranchOrigin {
        prefix: parent_url.to_string(),
        lineage: plan.manifest.lineage,
        manifest: plan.manifest_key.clone(),
        commit_seq: n,
    });
    m.lineage = lineage;
    m.generation = 0;
    m.commit_seq = n;
    m.created_at = manifest::now_rfc3339();
    m.parent = None;
    m.branched_from = None;
    m.check(&m.key()).map_err(|e| BranchError::Parent {
        detail: format!(
            "its restore point {} cannot be branched: {e}",
            plan.manifest_key
        ),
    })?;
    Ok(m)
}
