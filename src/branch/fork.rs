//! Where a branch is cut: the parent's restore point that reaches the fork commit, found with
//! as few requests as the parent allows, and the branch manifest that names its objects.
//!
//! # The restore point
//! For `--at N`: the first manifest at or past N (one LIST page of `manifests/` starting at N,
//! one GET) when its snapshot holds at most N commits; otherwise the search `restore --at`
//! makes (every manifest, and the segments past them). For `--at-time` ([`at_time`]): the
//! commit `restore --at-time` restores (`crate::restore::at_time`: the greatest event at or
//! before the instant, by the bucket's times), found from one LIST of `manifests/`, a GET of
//! the newest manifest at or before the instant (of each, when several share its second), one
//! LIST of its generation's segments past it and, when a segment is the event, a GET of the
//! next manifest naming it (else the segments from the manifest to it, each read and checked).
//! Anything this reading cannot decide (a manifest that is not valid, an object without a
//! time, a chain of segments that breaks) takes the full search instead.
//!
//! One difference from `restore --at-time`, by design: only the generation of the newest
//! restore point at the instant is looked at. A segment of another generation shipped after
//! that restore point (the old primary of a promotion, still shipping into the prefix after
//! the promoted store's restore point) is no fork point of a branch; `restore --at-time`, which
//! orders events by time alone, may restore it. On a prefix with one writer at a time the two
//! always agree (`tests/branch_props.rs` compares them on every instant it branches at).
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
use crate::bucket::{Bucket, ListQuery, ObjectMeta, list_all};
use crate::manifest::{
    self, BranchOrigin, MANIFESTS_PREFIX, Manifest, parse_segment_key, segments_prefix,
};
use crate::restore::RestoreOptions;
use crate::restore::plan::{self, ChainStart, ExtendHow, Plan};

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

/// The parent's restore point at the instant `t_ms` (unix ms), cut at the commit
/// `restore --at-time` restores (see the module docs).
pub(crate) async fn at_time(
    parent: &dyn Bucket,
    t_ms: i64,
    opts: &RestoreOptions,
) -> Result<Plan, BranchError> {
    if let Some(plan) = newest_at(parent, t_ms, opts).await? {
        return Ok(plan);
    }
    let opts = RestoreOptions {
        at: None,
        at_time_ms: Some(t_ms),
        ..opts.clone()
    };
    Ok(crate::restore::choose(parent, &opts).await?)
}

/// [`at_time`] from the newest restore point at `t_ms` and its generation's segments past it;
/// `None` when that reading cannot decide (the caller searches every event).
async fn newest_at(
    parent: &dyn Bucket,
    t_ms: i64,
    opts: &RestoreOptions,
) -> Result<Option<Plan>, BranchError> {
    let mut timed = Vec::new();
    for meta in list_all(parent, MANIFESTS_PREFIX).await? {
        match (manifest::parse_manifest_key(&meta.key), meta.modified_ms) {
            (Some(_), Some(t)) => timed.push((t, meta.key)),
            _ => return Ok(None),
        }
    }
    let Some(t_m) = timed.iter().map(|(t, _)| *t).filter(|t| *t <= t_ms).max() else {
        return Ok(None);
    };
    // Events of one second are ordered by generation, then offset: of the manifests listed at
    // that time, the one furthest on.
    let mut newest: Option<(String, Manifest)> = None;
    for (_, key) in timed.iter().filter(|(t, _)| *t == t_m) {
        let Ok(m) = plan::load_manifest(parent, key).await? else {
            return Ok(None);
        };
        let further =
            |n: &Manifest| (m.generation, m.segments_end()) > (n.generation, n.segments_end());
        if newest.as_ref().is_none_or(|(_, n)| further(n)) {
            newest = Some((key.clone(), m));
        }
    }
    let Some((key, m)) = newest else {
        return Ok(None);
    };
    let restore_point = |m: Manifest, key: String| Plan {
        commit_seq: m.commit_seq,
        cut: m.cut(),
        manifest: m,
        manifest_key: key,
        extension: Vec::new(),
        cached: Default::default(),
        commit_time_ms: Some(t_m),
        warnings: Vec::new(),
        left_out: Vec::new(),
    };
    // A branch manifest is extended by nothing.
    if m.branch.is_some() || opts.restore_point_only {
        return Ok(Some(restore_point(m, key)));
    }
    // Its generation's segments past it: one at or before the instant and not before the
    // manifest is a later event (its time is its own: a manifest reaching it is no later).
    let end = m.segments_end();
    let prefix = segments_prefix(m.generation);
    let listed = list_after(parent, &prefix, &format!("{prefix}{end:020}")).await?;
    let Some(event) = segment_event(&listed, m.generation, end, t_m..=t_ms) else {
        return Ok(None);
    };
    let Some((t_event, seg_end, seg_key)) = event else {
        return Ok(Some(restore_point(m, key)));
    };
    // The commit at its end: from the next manifest when it names the segment (one GET),
    // else by reading the segments from the restore point to it.
    let next = timed
        .iter()
        .filter(|(t, k)| *t > t_ms || (*t == t_m && *k != key))
        .min_by_key(|(t, k)| (*t, k.as_str()));
    if let Some((_, next_key)) = next
        && let Ok(n) = plan::load_manifest(parent, next_key).await?
        && n.generation == m.generation
        && n.branch.is_none()
        && let Some(seq) = n.commit_at_segment_end(seg_key)
    {
        return Ok(Some(Plan {
            commit_seq: seq,
            cut: Some(seq),
            commit_time_ms: Some(t_event),
            ..restore_point(n, next_key.clone())
        }));
    }
    let from = ChainStart {
        lineage: m.lineage,
        generation: m.generation,
        end,
        reach: m.commit_seq,
    };
    let how = ExtendHow {
        limit: None,
        until: Some(seg_end),
        parallelism: opts.parallelism.max(1),
        keep_plain: false,
    };
    let ext = plan::extend_listed(parent, &from, listed, &how, &opts.keys).await?;
    if ext.end != seg_end {
        return Ok(None);
    }
    Ok(Some(Plan {
        commit_seq: ext.reach,
        cut: Some(ext.reach),
        commit_time_ms: Some(t_event),
        extension: ext.segments,
        cached: ext.cached,
        warnings: ext.warnings,
        ..restore_point(m, key)
    }))
}

/// Of the segments of generation `generation` `listed` past offset `end`, the one whose
/// event is the latest within `times` (the newest restore point's time to the instant): its
/// time, end offset and key; `Some(None)` when none is; `None` when the listing cannot decide
/// (an object without a time, or one shipped before the restore point yet not in it: its
/// event's time is the earliest manifest's reaching it, which only the full search knows).
fn segment_event(
    listed: &[ObjectMeta],
    generation: u64,
    end: u64,
    times: std::ops::RangeInclusive<i64>,
) -> Option<Option<(i64, u64, &str)>> {
    let mut event: Option<(i64, u64, &str)> = None;
    for o in listed {
        let Some((start, seg_end)) = parse_segment_key(generation, &o.key) else {
            continue;
        };
        let t = o.modified_ms?;
        if start < end {
            continue;
        }
        if t < *times.start() {
            return None;
        }
        if times.contains(&t) && event.is_none_or(|(et, ee, _)| (t, seg_end) > (et, ee)) {
            event = Some((t, seg_end, &o.key));
        }
    }
    Some(event)
}

/// Every object under `prefix` whose key sorts after `after`.
async fn list_after(
    bucket: &dyn Bucket,
    prefix: &str,
    after: &str,
) -> Result<Vec<ObjectMeta>, BranchError> {
    let mut out = Vec::new();
    let mut token = None;
    loop {
        let page = bucket
            .list(ListQuery::new(prefix, token, 1000).starting_after(after))
            .await?;
        out.extend(page.objects);
        match page.next_token {
            Some(t) => token = Some(t),
            None => return Ok(out),
        }
    }
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
