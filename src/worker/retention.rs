//! Retention (DESIGN.md section 8).
//!
//! Which restore points a pass keeps is one pure function, [`keep`], which `retention
//! --dry-run` calls too, so a dry run shows exactly the selection a pass makes.
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
//! # Which generations are listed
//! The first run in a view's life lists all of `gen/`. It then remembers, in the view
//! ([`Settled`](super::settled::Settled)), which generations hold nothing retention may
//! delete: every object there was named by a manifest when listed (unnamed ones were just
//! deleted), or the generation is another lineage's, or its claim cannot be read (never acted
//! on). A later run lists
//! `gen/<g>/` only for the generations that may have changed since:
//! - those not settled (the generation being shipped, a claim younger than `orphan_grace`,
//!   everything while a junk manifest is present);
//! - those an object of a manifest that is gone names: the manifests this run deletes, and
//!   any manifest read earlier that the listing of `manifests/` no longer shows (another
//!   lineage's retention, an operator). A junk manifest gone, whose content was never known,
//!   makes the run list all of `gen/` again;
//! - the generations numbered after the last run's listing, up to the one being shipped (a
//!   generation this worker shipped and has since left).
//!
//! That is enough because an object can become deletable only by losing the last manifest
//! naming it (every such manifest was read, so its disappearance is seen in the listing of
//! `manifests/`), or by being uploaded into a generation that is not settled: only the
//! generation being shipped is written to, under this worker's lease. Over
//! [`MAX_NARROW_LISTS`] generations to look at, one listing of all of `gen/` is cheaper and is
//! made instead. `manifests/` is listed every run (1 request per 1,000 keys): its keys say
//! which manifests of every lineage are there, which the safety rule needs. A new view (a
//! restart, a lost lease) starts over with a full listing; what is remembered only ever skips
//! a LIST whose keys retention would not act on, never makes a deletion.
//!
//! # Tiers
//! With any of `keep_daily`, `keep_weekly`, `keep_monthly` set ([`super::tiers`]), this
//! lineage's restore points are kept by those rules and `keep_for` alone: `keep_generations`
//! no longer keeps every point of the newest generations (it would keep everything of a store
//! whose generation rarely changes). The manifest just written and the one LATEST names are
//! still never deleted, and what goes is still only what no remaining manifest (of any
//! lineage) names, so a kept restore point keeps every object it needs, whichever generation
//! holds it. Which objects are orphans is decided as before, and a generation's wrapped data
//! keys (`gen/<g>/keys/`) go only with its last named object, whatever rule dropped the
//! restore points: a kept tier point keeps its generation's keys.
//!
//! Order: manifests first, then the objects they no longer name, then (of a generation left
//! with no named object) its wrapped data keys (`gen/<g>/keys/`), then its claim. So no data
//! object is ever left without its key. A crash between any two leaves unnamed objects, which
//! the next run deletes. GENERATION claims of emptied
//! generations are deleted too, except the highest number in the prefix, so numbers stay
//! unique.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

pub use super::settled::MAX_NARROW_LISTS;
use super::view::{View, claim};
use super::{StepOutcome, WorkerError};
use crate::bucket::{self, BucketError, DynBucket};
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
    /// Grandfather-father-son tiers over restore points ([`super::tiers`]); when any is set
    /// they replace `keep_generations` (see the module docs).
    pub tiers: super::tiers::Tiers,
}

impl Default for RetentionPolicy {
    fn default() -> Self {
        Self {
            keep_for: Duration::from_secs(7 * 24 * 3600),
            keep_generations: 2,
            orphan_grace: Duration::from_secs(3600),
            tiers: super::tiers::Tiers::default(),
        }
    }
}

/// How long each object of a write-once prefix is retained under Object Lock
/// (`crate::bucket::write_once`): the longest the policy keeps a restore point by its age (its
/// `keep_for`, or its oldest tier: a day, a week, 31 days per step), plus a day for the writer's
/// clock against the bucket's.
pub fn lock_period(policy: &RetentionPolicy) -> Duration {
    const DAY: u64 = 24 * 3600;
    let tiers = &policy.tiers;
    let tier_secs = [
        tiers.keep_daily.saturating_mul(DAY),
        tiers.keep_weekly.saturating_mul(7 * DAY),
        tiers.keep_monthly.saturating_mul(31 * DAY),
    ];
    let longest = tier_secs
        .into_iter()
        .map(Duration::from_secs)
        .fold(policy.keep_for, Duration::max);
    longest.saturating_add(crate::bucket::write_once::CLOCK_SLACK)
}

/// Why a pass keeps one of its lineage's restore points ([`keep`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    /// Never deleted: named by LATEST, or the lineage's newest (the one just written).
    Protected,
    /// Without tiers: younger than `keep_for` (or of a time that cannot be read).
    KeepFor,
    /// Without tiers: of one of the `keep_generations` newest generations.
    KeepGenerations,
    /// With tiers ([`super::tiers::keep`]): `keep_for`, a tier, or an unreadable time.
    Tier(super::tiers::Reason),
}

impl Kept {
    pub fn name(self) -> &'static str {
        match self {
            Kept::Protected => "protected",
            Kept::KeepFor => "keep_for",
            Kept::KeepGenerations => "keep_generations",
            Kept::Tier(r) => r.name(),
        }
    }
}

/// The selection of a pass: which of one lineage's restore points (`own`: manifest key →
/// manifest, every one of the lineage the pass runs for) `policy` keeps at `now_ms`, each with
/// the first rule that keeps it; a pass deletes every other. `protected` (LATEST's manifest,
/// the lineage's newest) is always kept. The one function both a worker's pass and
/// `retention --dry-run` decide by, so that a dry run cannot disagree with a pass.
pub fn keep<'a>(
    own: &BTreeMap<&'a String, &'a Manifest>,
    protected: &HashSet<String>,
    policy: &RetentionPolicy,
    now_ms: i64,
) -> BTreeMap<&'a String, Kept> {
    let mut kept: BTreeMap<&'a String, Kept> = own
        .keys()
        .filter(|k| protected.contains(**k))
        .map(|k| (*k, Kept::Protected))
        .collect();
    if policy.tiers.enabled() {
        let times: BTreeMap<&'a String, Option<i64>> = own
            .iter()
            .map(|(k, m)| (*k, manifest::parse_time_ms(&m.created_at)))
            .collect();
        for (k, r) in super::tiers::keep(&times, now_ms, policy.keep_for, &policy.tiers) {
            kept.entry(k).or_insert(Kept::Tier(r));
        }
        return kept;
    }
    let mut generations: Vec<u64> = own.values().map(|m| m.generation).collect();
    generations.sort_unstable();
    generations.dedup();
    let newest: HashSet<u64> = generations
        .iter()
        .rev()
        .take(crate::units::usize_of(policy.keep_generations))
        .copied()
        .collect();
    let keep_for_ms = crate::units::millis_i64(policy.keep_for);
    for (k, m) in own {
        if age_ms(&m.created_at, now_ms) < keep_for_ms {
            kept.entry(*k).or_insert(Kept::KeepFor);
        } else if newest.contains(&m.generation) {
            kept.entry(*k).or_insert(Kept::KeepGenerations);
        }
    }
    kept
}

fn age_ms(created_at: &str, now_ms: i64) -> i64 {
    manifest::parse_time_ms(created_at).map_or(0, |t| now_ms.saturating_sub(t))
}

#[tracing::instrument(name = "backup.retention", skip_all)]
/// Runs retention under `policy` over the prefix `view` knows; the caller restarts its
/// retention timer.
pub(super) async fn run(
    bucket: &DynBucket,
    activity: &crate::health::StepActivity,
    view: &mut View,
    policy: &RetentionPolicy,
) -> Result<StepOutcome, WorkerError> {
    if view
        .found_empty_at
        .is_some_and(|at| at.elapsed() < policy.keep_for.min(policy.orphan_grace))
    {
        return Ok(StepOutcome::Retention { deleted: 0 });
    }
    activity.set(crate::health::StepPhase::RunningRetention);
    let now_ms = manifest::parse_time_ms(&manifest::now_rfc3339()).unwrap_or(0);

    read_manifests(bucket, view).await?;
    let mut deleted = delete_unkept_manifests(bucket, view, policy, now_ms).await?;
    // Read after the manifests are deleted: a branch checks its fork manifest is still there
    // after its pin is written, so a pin this misses names only what a remaining manifest does
    // (`crate::branch`).
    let pins =
        crate::pins::read(bucket.as_ref(), now_ms, policy.orphan_grace, &mut view.pins).await?;
    if !pins.reclaimable.is_empty() {
        // What a pin held may now go: look at every generation again.
        view.settled.list_all = true;
    }

    let current = view.current.as_ref().map_or(u64::MAX, |g| g.number);
    // This lineage's generations are numbered at most `max_generation`, and the one being
    // shipped is never touched: generations below `upper` are the ones to look at.
    let upper = current.min(view.max_generation.saturating_add(1));
    let (by_generation, max_generation) = list_generations(bucket, view, upper).await?;
    let mut sweep = Sweep::new(view, policy, now_ms, current, upper, max_generation);
    view.branch_charges = pins.charges(&sweep.named);
    sweep.named.extend(pins.keys());
    for (g, keys) in by_generation {
        deleted += sweep.generation(bucket, view, g, keys).await?;
    }
    if upper > 0 {
        let through = view.settled.through.map_or(upper - 1, |t| t.max(upper - 1));
        view.settled.through = Some(through);
    }
    view.settled.list_all = false;
    deleted += crate::pins::reclaim(bucket.as_ref(), &pins.reclaimable).await?;
    if deleted > 0 {
        tracing::info!(deleted, "retention deleted objects");
    }
    Ok(StepOutcome::Retention { deleted })
}

/// Lists `manifests/` and brings the view's manifests up to it: those gone are forgotten
/// (the generations they named may have lost their last manifest), new ones are read (a
/// manifest that does not decode is kept as junk, `None`).
async fn read_manifests(bucket: &DynBucket, view: &mut View) -> Result<(), WorkerError> {
    let keys: Vec<String> = bucket::list_all(bucket.as_ref(), manifest::MANIFESTS_PREFIX)
        .await?
        .into_iter()
        .filter(|o| manifest::parse_manifest_key(&o.key).is_some())
        .map(|o| o.key)
        .collect();
    let listed: HashSet<&String> = keys.iter().collect();
    for (k, m) in &view.manifests {
        if !listed.contains(k) {
            view.settled.manifest_gone(m.as_ref());
        }
    }
    view.manifests.retain(|k, _| listed.contains(k));
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
    Ok(())
}

/// Deletes this lineage's manifests that [`keep`] does not keep (LATEST's manifest and the
/// newest own one are protected); returns how many went.
async fn delete_unkept_manifests(
    bucket: &DynBucket,
    view: &mut View,
    policy: &RetentionPolicy,
    now_ms: i64,
) -> Result<u64, WorkerError> {
    let mut protected: HashSet<String> = HashSet::new();
    if let Some((l, _)) = &view.latest {
        protected.insert(l.manifest.clone());
    }
    if let Some(m) = &view.newest_own {
        protected.insert(m.key());
    }
    let own: BTreeMap<&String, &Manifest> = view
        .manifests
        .iter()
        .filter_map(|(k, m)| m.as_ref().map(|m| (k, m)))
        .filter(|(_, m)| m.lineage == view.lineage)
        .collect();
    let kept = keep(&own, &protected, policy, now_ms);
    let doomed: Vec<String> = own
        .keys()
        .filter(|k| !kept.contains_key(*k))
        .map(|k| (*k).clone())
        .collect();
    let mut deleted = 0u64;
    for key in &doomed {
        if let Some(m) = view.manifests.get(key) {
            view.settled.manifest_gone(m.as_ref());
        }
        bucket.delete(key, None).await?;
        view.manifests.remove(key);
        deleted += 1;
    }
    Ok(deleted)
}

/// Lists the generations to look at ([`super::settled::Settled::narrow`]: all of `gen/`, or one by one below
/// `upper`), their keys by generation, and the highest generation number the prefix holds
/// (whose claim is never deleted).
async fn list_generations(
    bucket: &DynBucket,
    view: &mut View,
    upper: u64,
) -> Result<(BTreeMap<u64, Vec<String>>, u64), WorkerError> {
    let mut by_generation: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    let Some(look) = view.settled.narrow(upper) else {
        // Until this run ends, the next one lists everything too.
        view.settled.list_all = true;
        view.settled.unsettled.clear();
        for o in bucket::list_all(bucket.as_ref(), manifest::GEN_PREFIX).await? {
            if let Some(g) = manifest::parse_generation(&o.key) {
                by_generation.entry(g).or_default().push(o.key);
            }
        }
        let max_generation = by_generation.keys().next_back().copied().unwrap_or(0);
        return Ok((by_generation, max_generation));
    };
    for g in look {
        let keys: Vec<String> = bucket::list_all(bucket.as_ref(), &manifest::generation_prefix(g))
            .await?
            .into_iter()
            .map(|o| o.key)
            .collect();
        if keys.is_empty() {
            // An empty generation holds nothing to delete.
            view.settled.unsettled.remove(&g);
        } else {
            by_generation.insert(g, keys);
        }
    }
    let listed_max = by_generation.keys().next_back().copied().unwrap_or(0);
    let max_generation = listed_max
        .max(view.max_generation)
        .max(view.settled.through.unwrap_or(0));
    Ok((by_generation, max_generation))
}

/// Deleting the objects of listed generations that no remaining manifest names.
struct Sweep {
    lineage: uuid::Uuid,
    now_ms: i64,
    grace_ms: i64,
    /// The generation being shipped (`u64::MAX` when none): never touched, nor any after it.
    current: u64,
    /// Generations below this are the ones looked at ([`run`]).
    upper: u64,
    /// The highest generation number in the prefix: its claim stays, so numbers stay unique.
    max_generation: u64,
    /// What every remaining manifest names.
    named: HashSet<String>,
    /// Junk manifests name nothing we could know, so while one exists nothing of a generation
    /// it might name is safe: keep generations it could be.
    junk_present: bool,
}

impl Sweep {
    /// The sweep of one run, from what the view's remaining manifests name.
    fn new(
        view: &View,
        policy: &RetentionPolicy,
        now_ms: i64,
        current: u64,
        upper: u64,
        max_generation: u64,
    ) -> Sweep {
        Sweep {
            lineage: view.lineage,
            now_ms,
            grace_ms: crate::units::millis_i64(policy.orphan_grace),
            current,
            upper,
            max_generation,
            named: view
                .manifests
                .values()
                .flatten()
                // A branch manifest's objects are another prefix's: they name nothing here.
                .flat_map(|m| {
                    m.objects()
                        .filter(|o| o.prefix.is_none())
                        .map(|o| o.key.clone())
                })
                .collect(),
            junk_present: view.manifests.values().any(|m| m.is_none()),
        }
    }

    /// Sweeps generation `g` (listed as `keys`) if it is this lineage's and past its grace:
    /// its unnamed objects, then, once nothing of it is named, its wrapped data keys and (but
    /// for the highest) its claim. Records whether it is settled; returns how many went.
    async fn generation(
        &self,
        bucket: &DynBucket,
        view: &mut View,
        g: u64,
        keys: Vec<String>,
    ) -> Result<u64, WorkerError> {
        if g >= self.current || self.junk_present {
            if g < self.upper {
                view.settled.unsettled.insert(g);
            }
            return Ok(0);
        }
        let Some(c) = claim(bucket, &mut view.claims, g).await? else {
            // No readable claim (cached as such): never acted on.
            view.settled.unsettled.remove(&g);
            return Ok(0);
        };
        if c.lineage != self.lineage {
            view.settled.unsettled.remove(&g);
            return Ok(0);
        }
        if age_ms(&c.created_at, self.now_ms) < self.grace_ms {
            view.settled.unsettled.insert(g);
            return Ok(0);
        }
        let claim_key = manifest::generation_key(g);
        // Wrapped data keys (`gen/<g>/keys/`) are part of the generation, like its claim:
        // kept while any object of it is named, deleted after its last data object.
        let is_wrapper = |k: &str| crate::crypto::key_objects::is_wrapper_key(k);
        let unnamed: Vec<&String> = keys
            .iter()
            .filter(|k| **k != claim_key && !is_wrapper(k) && !self.named.contains(*k))
            .collect();
        let emptied = keys
            .iter()
            .all(|k| *k == claim_key || is_wrapper(k) || !self.named.contains(k));
        view.settled.unsettled.insert(g);
        let mut deleted = 0;
        for key in unnamed {
            bucket.delete(key, None).await?;
            deleted += 1;
        }
        if emptied {
            for key in keys.iter().filter(|k| is_wrapper(k)) {
                bucket.delete(key, None).await?;
                deleted += 1;
            }
        }
        if emptied && g != self.max_generation && keys.contains(&claim_key) {
            bucket.delete(&claim_key, None).await?;
            view.claims.remove(&g);
            deleted += 1;
        }
        // Every object left is named by a manifest that is there.
        view.settled.unsettled.remove(&g);
        Ok(deleted)
    }
}
