//! Retention (DESIGN.md section 8).
//!
//! Keeps every restore point younger than `keep_for` and every restore point of the newest
//! `keep_generations` generations of this lineage, and never the manifest just written or the
//! one LATEST names. It decides only on this lineage's manifests, and deletes only objects of
//! this lineage's generations that no remaining manifest of *any* lineage names (it reads every
//! manifest to know what they name). Objects of the generation being shipped, and of any
//! generation whose claim is younger than `orphan_grace`, are left alone: the former are
//! segments a manifest will name soon, the latter may belong to a run still uploading.
//!
//! A prefix that resume found empty is not listed until the shorter of `keep_for` and
//! `orphan_grace` has passed since: everything in it was written after that moment, so nothing
//! is old enough to go (manifests go at `keep_for`, unnamed objects at `orphan_grace` after
//! their claim). Skipping can only delay a deletion, never make one. A first backup of a store
//! so costs no LIST for retention.
//!
//! Order: manifests first, then the objects they no longer name. A crash between the two
//! leaves unnamed objects, which the next run deletes. GENERATION claims of emptied
//! generations are deleted too, except the highest number in the prefix, so numbers stay
//! unique.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use super::ctx::Ctx;
use super::view::{View, claim};
use super::{StepOutcome, WorkerError};
use crate::bucket::{self, BucketError};
use crate::manifest::{self, Manifest};

/// What retention keeps.
#[derive(Debug, Clone)]
pub struct RetentionPolicy {
    /// Keep every restore point younger than this.
    pub keep_for: Duration,
    /// Keep every restore point of this many newest generations of this lineage.
    pub keep_generations: u64,
    /// Leave a claimed generation no manifest names alone for this long.
    pub orphan_grace: Duration,
}

impl Default for RetentionPolicy {
    fn default() -> Self {
        Self {
            keep_for: Duration::from_secs(7 * 24 * 3600),
            keep_generations: 2,
            orphan_grace: Duration::from_secs(3600),
        }
    }
}

fn age_ms(created_at: &str, now_ms: i64) -> i64 {
    manifest::parse_time_ms(created_at).map_or(0, |t| now_ms.saturating_sub(t))
}

#[tracing::instrument(name = "backup.retention", skip_all)]
/// Runs retention under `policy` over the prefix `view` knows; the caller restarts its
/// retention timer.
pub(super) async fn run(
    cx: &Ctx<'_>,
    view: &mut View,
    policy: &RetentionPolicy,
) -> Result<StepOutcome, WorkerError> {
    let bucket = cx.bucket;
    if view
        .found_empty_at
        .is_some_and(|at| at.elapsed() < policy.keep_for.min(policy.orphan_grace))
    {
        return Ok(StepOutcome::Retention { deleted: 0 });
    }
    cx.activity.set(crate::health::StepPhase::RunningRetention);
    let lineage = view.lineage;
    let now_ms = manifest::parse_time_ms(&manifest::now_rfc3339()).unwrap_or(0);

    let keys: Vec<String> = bucket::list_all(bucket.as_ref(), manifest::MANIFESTS_PREFIX)
        .await?
        .into_iter()
        .filter(|o| manifest::parse_manifest_key(&o.key).is_some())
        .map(|o| o.key)
        .collect();
    view.manifests.retain(|k, _| keys.contains(k));
    for key in &keys {
        if view.manifests.contains_key(key) {
            continue;
        }
        let m = match bucket.get(key).await {
            Ok(o) => Manifest::decode(key, &o.data).ok(),
            Err(BucketError::NotFound { .. }) => continue,
            Err(e) => return Err(e.into()),
        };
        view.manifests.insert(key.clone(), m);
    }

    let mut protected: HashSet<String> = HashSet::new();
    if let Some((l, _)) = &view.latest {
        protected.insert(l.manifest.clone());
    }
    if let Some(m) = &view.newest_own {
        protected.insert(m.key());
    }
    let mut own_generations: Vec<u64> = view
        .manifests
        .values()
        .flatten()
        .filter(|m| m.lineage == lineage)
        .map(|m| m.generation)
        .collect();
    own_generations.sort_unstable();
    own_generations.dedup();
    let newest_generations: HashSet<u64> = own_generations
        .iter()
        .rev()
        .take(crate::units::usize_of(policy.keep_generations))
        .copied()
        .collect();
    let keep_for_ms = crate::units::millis_i64(policy.keep_for);
    let doomed: Vec<String> = view
        .manifests
        .iter()
        .filter_map(|(k, m)| m.as_ref().map(|m| (k, m)))
        .filter(|(k, m)| {
            m.lineage == lineage
                && !protected.contains(*k)
                && !newest_generations.contains(&m.generation)
                && age_ms(&m.created_at, now_ms) >= keep_for_ms
        })
        .map(|(k, _)| k.clone())
        .collect();
    let mut deleted = 0u64;
    for key in &doomed {
        bucket.delete(key, None).await?;
        view.manifests.remove(key);
        deleted += 1;
    }

    // What every remaining manifest names; junk manifests name nothing we could know, so while
    // one exists nothing of a generation it might name is safe: keep generations it could be.
    let named: HashSet<String> = view
        .manifests
        .values()
        .flatten()
        .flat_map(|m| m.objects().map(|o| o.key.clone()))
        .collect();
    let junk_present = view.manifests.values().any(|m| m.is_none());
    let current = view.current.as_ref().map_or(u64::MAX, |g| g.number);
    let mut by_generation: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for o in bucket::list_all(bucket.as_ref(), manifest::GEN_PREFIX).await? {
        if let Some(g) = manifest::parse_generation(&o.key) {
            by_generation.entry(g).or_default().push(o.key);
        }
    }
    let max_generation = by_generation.keys().next_back().copied().unwrap_or(0);
    let grace_ms = crate::units::millis_i64(policy.orphan_grace);
    for (g, keys) in by_generation {
        if g >= current || junk_present {
            continue;
        }
        let Some(c) = claim(bucket, &mut view.claims, g).await? else {
            continue;
        };
        if c.lineage != lineage || age_ms(&c.created_at, now_ms) < grace_ms {
            continue;
        }
        let claim_key = manifest::generation_key(g);
        let unnamed: Vec<&String> = keys
            .iter()
            .filter(|k| **k != claim_key && !named.contains(*k))
            .collect();
        let emptied = keys.iter().all(|k| *k == claim_key || !named.contains(k));
        for key in unnamed {
            bucket.delete(key, None).await?;
            deleted += 1;
        }
        if emptied && g != max_generation && keys.contains(&claim_key) {
            bucket.delete(&claim_key, None).await?;
            view.claims.remove(&g);
            deleted += 1;
        }
    }
    if deleted > 0 {
        tracing::info!(deleted, "retention deleted objects");
    }
    Ok(StepOutcome::Retention { deleted })
}
