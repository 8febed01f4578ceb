//! Choosing what to restore: the restore point, the segments of its generation that extend it,
//! and for `--at N` the restore point that reaches N with the least to download.
//!
//! Everything here only reads the bucket. Segments past a manifest have no manifest entry to
//! check them against, so each is downloaded once here and checked frame by frame (length from
//! its key, every frame's CRC, seqs continuing the chain); its CRC is then recorded so that the
//! download into the store is checked like any other object. Up to [`EXTENSION_CACHE_BYTES`]
//! of those bytes are kept in memory and not downloaded a second time. A segment key whose
//! range is longer than a writer ships (`at_rest::bounds::SEGMENT_MAX`) fails the plan naming
//! the object, before it is read: its decoding is then held to that length.

use std::collections::{BTreeMap, HashMap, HashSet};

use bytes::Bytes;
use futures::StreamExt;

use super::{Reachable, RestoreError, RestoreOptions};
use crate::at_rest::chain::{Candidates, LeftOut, Step};
use crate::bucket::{Bucket, BucketError, list_all};
use crate::manifest::{
    AdoptedAt, LATEST_KEY, MANIFESTS_PREFIX, Manifest, SegmentEntry, segments_prefix,
};
use crate::store::format::scan_frames;

/// Bytes of validated extension segments kept in memory for the download that follows.
pub const EXTENSION_CACHE_BYTES: u64 = 64 << 20;

/// What a restore will download and what the restored store must report.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub manifest: Manifest,
    pub manifest_key: String,
    /// Segments of the manifest's generation past its last segment, checked, in order.
    pub extension: Vec<SegmentEntry>,
    /// Bytes of extension segments kept from their check, by key.
    pub cached: HashMap<String, Bytes>,
    /// The commit the restored store reports.
    pub commit_seq: u64,
    /// `Some(N)` for `--at N`: the WAL is cut after frame `seq = N`.
    pub cut: Option<u64>,
    /// For `--at-time`: when the bucket says the commit restored was shipped (unix ms).
    pub commit_time_ms: Option<i64>,
    pub warnings: Vec<String>,
    /// Listed data past the restored end that the chain did not take (default restores only;
    /// `--at`/`--at-time` stop short on purpose).
    pub left_out: Vec<LeftOut>,
}

/// Chooses the restore point for `opts` by commit: the newest, or `--at` (see the module docs
/// of [`super`]; `--at-time` is `super::at_time`'s, which extends with this module).
pub(crate) async fn choose(
    bucket: &dyn Bucket,
    opts: &RestoreOptions,
) -> Result<Plan, RestoreError> {
    let parallelism = opts.parallelism.max(1);
    match opts.at {
        None => {
            let mut warnings = Vec::new();
            let (manifest_key, manifest, adopted_at) =
                latest_restore_point_adopted(bucket, &mut warnings).await?;
            // A promotion's claim: the prefix's history is the adopter's, which ends at
            // `adopted_at` (what the old writer shipped after is not restored).
            let until = adopted_at
                .filter(|a| a.generation == manifest.generation)
                .map(|a| a.wal_end);
            let ext = if opts.restore_point_only {
                Extension::none(&manifest)
            } else {
                let ext = extend(bucket, &manifest, None, until, parallelism, &opts.keys).await?;
                if let Some(a) = adopted_at.filter(|a| ext.reach != a.commit_seq) {
                    let w = format!(
                        "{LATEST_KEY} was claimed by a promotion holding commit {} of \
                         generation {}, but the segments of that generation reach commit {}",
                        a.commit_seq, a.generation, ext.reach
                    );
                    tracing::warn!("{w}");
                    warnings.push(w);
                }
                ext
            };
            warnings.extend(ext.warnings);
            // A branch manifest's WAL may run past its fork: cut there.
            let cut = manifest.cut();
            Ok(Plan {
                left_out: ext.left_out,
                commit_seq: ext.reach,
                manifest,
                manifest_key,
                extension: ext.segments,
                cached: ext.cached,
                cut,
                commit_time_ms: None,
                warnings,
            })
        }
        Some(n) => choose_at(bucket, n, opts.restore_point_only, parallelism, &opts.keys).await,
    }
}

/// Fetches and decodes one manifest: `Ok(Err(why))` when it is missing or not valid.
pub(crate) async fn load_manifest(
    bucket: &dyn Bucket,
    key: &str,
) -> Result<Result<Manifest, String>, RestoreError> {
    match bucket.get(key).await {
        Ok(obj) => Ok(Manifest::decode(key, &obj.data).map_err(|e| e.to_string())),
        Err(BucketError::NotFound { .. }) => Ok(Err(format!("{key}: no such object"))),
        Err(e) => Err(e.into()),
    }
}

/// The manifest LATEST names; if LATEST is missing or names a missing or bad manifest, the
/// newest valid manifest under `manifests/`, with a warning saying so.
pub(crate) async fn latest_restore_point(
    bucket: &dyn Bucket,
    warnings: &mut Vec<String>,
) -> Result<(String, Manifest), RestoreError> {
    let (key, m, _) = latest_restore_point_adopted(bucket, warnings).await?;
    Ok((key, m))
}

/// [`latest_restore_point`], and where a promotion that claimed LATEST holds its history to
/// ([`crate::manifest::Latest::adopted_at`]; `None` when LATEST was not claimed, or was not
/// used).
pub(crate) async fn latest_restore_point_adopted(
    bucket: &dyn Bucket,
    warnings: &mut Vec<String>,
) -> Result<(String, Manifest, Option<AdoptedAt>), RestoreError> {
    let why = match crate::latest::read(bucket).await {
        Ok(Some(found)) => match found.latest {
            Ok(latest) => match load_manifest(bucket, &latest.manifest).await? {
                Ok(m) if m.commit_seq == latest.commit_seq && m.lineage == latest.lineage => {
                    let adopted_at = latest.adopted_by.and(latest.adopted_at);
                    return Ok((latest.manifest, m, adopted_at));
                }
                Ok(m) => format!(
                    "{LATEST_KEY} says commit {} of lineage {}, but {} holds commit {} of lineage {}",
                    latest.commit_seq, latest.lineage, latest.manifest, m.commit_seq, m.lineage
                ),
                Err(why) => format!("{LATEST_KEY} names a manifest that is not valid: {why}"),
            },
            Err(e) => e.to_string(),
        },
        Ok(None) => format!("there is no {LATEST_KEY}"),
        Err(e) => return Err(e.into()),
    };
    let mut keys: Vec<String> = list_all(bucket, MANIFESTS_PREFIX)
        .await?
        .into_iter()
        .map(|o| o.key)
        .collect();
    keys.sort();
    let mut skipped = Vec::new();
    for key in keys.iter().rev() {
        match load_manifest(bucket, key).await? {
            Ok(m) => {
                let mut w = format!("{why}; restoring the newest valid manifest, {key}");
                if !skipped.is_empty() {
                    w.push_str(&format!(
                        " (skipped newer, not valid: {})",
                        skipped.join("; ")
                    ));
                }
                tracing::warn!("{w}");
                warnings.push(w);
                return Ok((key.clone(), m, None));
            }
            Err(e) => skipped.push(e),
        }
    }
    Err(RestoreError::NoRestorePoint {
        url: bucket.url(),
        detail: if skipped.is_empty() {
            why
        } else {
            format!("{why}; no valid manifest: {}", skipped.join("; "))
        },
    })
}

/// Every valid manifest under `manifests/` (invalid ones become warnings).
async fn all_manifests(
    bucket: &dyn Bucket,
    parallelism: usize,
    warnings: &mut Vec<String>,
) -> Result<Vec<(String, Manifest)>, RestoreError> {
    let keys: Vec<String> = list_all(bucket, MANIFESTS_PREFIX)
        .await?
        .into_iter()
        .map(|o| o.key)
        .collect();
    let loaded: Vec<_> = futures::stream::iter(keys)
        .map(|key| async move { (load_manifest(bucket, &key).await, key) })
        .buffered(parallelism)
        .collect()
        .await;
    let mut out = Vec::new();
    for (result, key) in loaded {
        match result? {
            Ok(m) => out.push((key, m)),
            Err(why) => {
                let w = format!("skipping a manifest that is not valid: {why}");
                tracing::warn!("{w}");
                warnings.push(w);
            }
        }
    }
    Ok(out)
}

fn snapshot_seq(m: &Manifest) -> u64 {
    m.snapshot.as_ref().map_or(0, |s| s.commit_seq)
}

/// `--at n`: among the restore points whose snapshot holds at most `n` commits, the one with
/// the snapshot nearest below `n` whose WAL (with later segments of its generation) reaches
/// `n`; among those, one whose manifest already reaches `n` (the smallest), else the newest
/// generation whose segments do.
async fn choose_at(
    bucket: &dyn Bucket,
    n: u64,
    restore_point_only: bool,
    parallelism: usize,
    keys: &super::keys::RestoreKeys,
) -> Result<Plan, RestoreError> {
    let mut warnings = Vec::new();
    let all = all_manifests(bucket, parallelism, &mut warnings).await?;
    let mut by_snapshot: BTreeMap<u64, Vec<&(String, Manifest)>> = BTreeMap::new();
    for entry in &all {
        by_snapshot
            .entry(snapshot_seq(&entry.1))
            .or_default()
            .push(entry);
    }
    let plan = |(key, m): &(String, Manifest), ext: Extension, mut warnings: Vec<String>| {
        warnings.extend(ext.warnings);
        Plan {
            manifest: m.clone(),
            manifest_key: key.clone(),
            extension: ext.segments,
            cached: ext.cached,
            commit_seq: n,
            cut: Some(n),
            commit_time_ms: None,
            warnings,
            left_out: Vec::new(),
        }
    };
    // Full reach of each generation's newest manifest, as far as it was computed.
    let mut reach: HashMap<u64, u64> = HashMap::new();
    for (_, group) in by_snapshot.range(..=n).rev() {
        if let Some(best) = group
            .iter()
            .filter(|(_, m)| m.commit_seq >= n)
            .min_by_key(|(_, m)| m.commit_seq)
        {
            return Ok(plan(best, Extension::none(&best.1), warnings));
        }
        if restore_point_only {
            continue;
        }
        for newest in newest_per_generation(group).into_values().rev() {
            let ext = extend(bucket, &newest.1, Some(n), None, parallelism, keys).await?;
            if ext.reach >= n {
                return Ok(plan(newest, ext, warnings));
            }
            reach.insert(newest.1.generation, ext.reach);
        }
    }
    // Unreachable: name what is reachable.
    let mut ranges = Vec::new();
    let mut generations: BTreeMap<u64, Vec<&(String, Manifest)>> = BTreeMap::new();
    for entry in &all {
        generations
            .entry(entry.1.generation)
            .or_default()
            .push(entry);
    }
    for (generation, entries) in &generations {
        let low = entries
            .iter()
            .map(|e| snapshot_seq(&e.1))
            .min()
            .unwrap_or(0);
        let newest = entries
            .iter()
            .max_by_key(|e| e.1.commit_seq)
            .expect("a group is never empty");
        let high = match reach.get(generation) {
            Some(r) => *r,
            None if restore_point_only => newest.1.commit_seq,
            None => {
                extend(bucket, &newest.1, None, None, parallelism, keys)
                    .await?
                    .reach
            }
        };
        ranges.push(low..=high);
    }
    Err(RestoreError::Unreachable {
        at: n,
        reachable: Reachable::merge(ranges),
    })
}

/// The newest manifest of each generation in `group`, by generation.
fn newest_per_generation<'a>(
    group: &[&'a (String, Manifest)],
) -> BTreeMap<u64, &'a (String, Manifest)> {
    let mut newest: BTreeMap<u64, &(String, Manifest)> = BTreeMap::new();
    for &entry in group {
        let slot = newest.entry(entry.1.generation).or_insert(entry);
        if entry.1.commit_seq > slot.1.commit_seq {
            *slot = entry;
        }
    }
    newest
}

/// The segments that extend a manifest, and the commit they reach.
#[derive(Debug, Default)]
pub(crate) struct Extension {
    pub segments: Vec<SegmentEntry>,
    pub cached: HashMap<String, Bytes>,
    /// With [`ExtendHow::keep_plain`]: each segment's plain bytes, in the order of `segments`.
    pub plain: Vec<Bytes>,
    /// The commit the manifest's WAL reaches with these segments.
    pub reach: u64,
    /// The WAL offset they reach.
    pub end: u64,
    pub warnings: Vec<String>,
    /// Listed segments ending past `end` that the chain did not take, and why: each may hold
    /// commits this extension does not reach (`at_rest::chain`).
    pub left_out: Vec<LeftOut>,
}

impl Extension {
    fn none(m: &Manifest) -> Extension {
        Extension {
            reach: m.commit_seq,
            end: m.segments_end(),
            ..Extension::default()
        }
    }
}

/// Follows the segments of `m`'s generation from `m.segments_end()`: each must start where the
/// last one ended and hold whole, valid frames continuing the seq. Stops at the first gap, at
/// an invalid segment with no valid alternative, once `limit` (a commit) is reached, or at
/// the WAL offset `until` (segments ending past it are not taken). Where several start at one
/// offset the longest valid one is taken.
pub(crate) async fn extend(
    bucket: &dyn Bucket,
    m: &Manifest,
    limit: Option<u64>,
    until: Option<u64>,
    parallelism: usize,
    keys: &super::keys::RestoreKeys,
) -> Result<Extension, RestoreError> {
    // A branch manifest belongs to no generation of this prefix: nothing extends it.
    if m.branch.is_some() {
        return Ok(Extension::none(m));
    }
    let listed = list_all(bucket, &segments_prefix(m.generation)).await?;
    let from = ChainStart {
        lineage: m.lineage,
        generation: m.generation,
        end: m.segments_end(),
        reach: m.commit_seq,
    };
    let how = ExtendHow {
        limit,
        until,
        parallelism,
        keep_plain: false,
    };
    extend_listed(bucket, &from, listed, &how, keys).await
}

/// Where a chain of segments continues: a generation's WAL at offset `end`, `reach` commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChainStart {
    pub lineage: uuid::Uuid,
    pub generation: u64,
    pub end: u64,
    pub reach: u64,
}

/// How [`extend_listed`] follows a chain (see [`extend`] for `limit` and `until`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ExtendHow {
    pub limit: Option<u64>,
    pub until: Option<u64>,
    pub parallelism: usize,
    /// Keep every taken segment's plain bytes in [`Extension::plain`], in order (a standby
    /// appends them; a restore downloads again what it did not cache).
    pub keep_plain: bool,
}

/// [`extend`] over the objects `listed` (any keys; those that are not segments of the
/// generation at or past `from.end` are passed over): the chain that continues `from`.
pub(crate) async fn extend_listed(
    bucket: &dyn Bucket,
    from: &ChainStart,
    listed: Vec<crate::bucket::ObjectMeta>,
    how: &ExtendHow,
    keys: &super::keys::RestoreKeys,
) -> Result<Extension, RestoreError> {
    // One choice of chain for every reader (`at_rest::chain`): candidates from the listing
    // alone, then the path that reaches furthest, chosen again around each rejected segment.
    let candidates = Candidates::of(
        from.generation,
        from.end,
        how.until,
        listed.into_iter().map(|o| (o.key, o.len)),
    );
    let mut follow = Following::new(from, how);
    for l in &candidates.left_out {
        tracing::warn!("{l}; not used");
        follow.ext.warnings.push(format!("{l}; not used"));
    }
    // The generation's key when it is encrypted: then every segment must be sealed with it
    // (`at_rest::decode::recognise`), never merely raw or zstd bytes that parse.
    let open = match candidates.is_empty() {
        true => None,
        false => {
            keys.of_generation(bucket, from.lineage, from.generation)
                .await?
        }
    };
    'chain: loop {
        if follow.limit_reached() {
            break;
        }
        let chain = candidates.path(follow.pos, |k| follow.rejected.contains_key(k));
        if chain.is_empty() {
            break;
        }
        let mut fetched = futures::stream::iter(chain)
            .map(|step| async move {
                let got = bucket.get(&step.key).await;
                (step, got)
            })
            .buffered(how.parallelism);
        while let Some((step, got)) = fetched.next().await {
            if !follow.segment(step, got, open.as_ref())? {
                continue 'chain;
            }
            if follow.limit_reached() {
                break 'chain;
            }
        }
    }
    follow.note_not_taken(&candidates);
    Ok(follow.ext)
}

/// The state of [`extend_listed`] following a chain: the extension so far, where it stands,
/// and which listed segments it took or rejected (and why).
struct Following<'a> {
    from: &'a ChainStart,
    limit: Option<u64>,
    keep_plain: bool,
    ext: Extension,
    /// The WAL offset the chain has reached.
    pos: u64,
    rejected: HashMap<String, String>,
    used: HashSet<String>,
    /// Bytes of taken segments kept in [`Extension::cached`].
    cached_bytes: u64,
}

impl<'a> Following<'a> {
    /// Nothing followed yet: the extension starts where `from` ends.
    fn new(from: &'a ChainStart, how: &ExtendHow) -> Following<'a> {
        Following {
            from,
            limit: how.limit,
            keep_plain: how.keep_plain,
            ext: Extension {
                reach: from.reach,
                end: from.end,
                ..Extension::default()
            },
            pos: from.end,
            rejected: HashMap::new(),
            used: HashSet::new(),
            cached_bytes: 0,
        }
    }

    /// Whether the chain reached the commit limit (`--at N`).
    fn limit_reached(&self) -> bool {
        self.limit.is_some_and(|n| self.ext.reach >= n)
    }

    /// Passes over segment `key` for good, warning why.
    fn reject(&mut self, key: String, why: String) {
        let w = format!("{key}: {why}; not used");
        tracing::warn!("{w}");
        self.ext.warnings.push(w);
        self.rejected.insert(key, why);
    }

    /// Takes the fetched segment of `step` into the chain if it is what its key says: sealed
    /// with the generation's key exactly when it is encrypted, decoding to whole frames that
    /// continue the chain. Returns whether it was taken (else it is rejected, and the chain is
    /// chosen again around it).
    fn segment(
        &mut self,
        step: Step,
        got: Result<crate::bucket::Object, BucketError>,
        open: Option<&crate::at_rest::seal::OpenKey>,
    ) -> Result<bool, RestoreError> {
        let Step { start, end, key } = step;
        let data = match got {
            Ok(obj) => obj.data,
            // Listed, then gone (retention): treat as absent.
            Err(BucketError::NotFound { .. }) => {
                self.reject(key, "listed, then gone".into());
                return Ok(false);
            }
            Err(e) => return Err(e.into()),
        };
        let Some((object, plain)) =
            crate::at_rest::decode::recognise(&key, &data, end - start, open)
        else {
            let why = match (
                open.is_some(),
                data.starts_with(crate::crypto::stream::MAGIC),
            ) {
                (true, false) => "not sealed, in an encrypted generation: anyone able to \
                                  write to the bucket could have made it"
                    .to_string(),
                (false, true) => "sealed, in a plaintext generation".to_string(),
                _ => format!(
                    "{} bytes that neither are nor decode to the {} its key says",
                    data.len(),
                    end - start
                ),
            };
            self.reject(key, why);
            return Ok(false);
        };
        match check_frames(&plain, end - start, self.ext.reach + 1) {
            Ok(frames) => {
                let segment = SegmentEntry {
                    object,
                    start,
                    end,
                    frames,
                };
                self.take(key, segment, data, plain);
                Ok(true)
            }
            Err(why) => {
                self.reject(key, why);
                Ok(false)
            }
        }
    }

    /// Adds a checked segment to the chain, as an object of `from`'s generation; keeps its
    /// stored bytes while the cache has room, and its plain bytes if asked.
    fn take(&mut self, key: String, mut segment: SegmentEntry, data: Bytes, plain: Bytes) {
        self.ext.reach += segment.frames;
        if self.cached_bytes + data.len() as u64 <= EXTENSION_CACHE_BYTES {
            self.cached_bytes += data.len() as u64;
            self.ext.cached.insert(key.clone(), data);
        }
        segment.object.lineage = self.from.lineage;
        segment.object.generation = self.from.generation;
        if self.keep_plain {
            self.ext.plain.push(plain);
        }
        self.used.insert(key);
        self.pos = segment.end;
        self.ext.end = segment.end;
        self.ext.segments.push(segment);
    }

    /// What was listed past the chain's end and not taken: data that may hold commits this
    /// chain does not, warned of and kept in [`Extension::left_out`]. A limit (`--at N`)
    /// reached leaves later segments out on purpose.
    fn note_not_taken(&mut self, candidates: &Candidates) {
        if self.limit_reached() {
            return;
        }
        let pos = self.pos;
        let not_taken = candidates.not_taken(&self.used, &self.rejected, pos);
        if let Some(first) = not_taken.iter().find(|l| l.end > pos) {
            let w = format!(
                "segments of generation {} stop at offset {pos} (commit {}); {} listed past it \
                 not used, the first {first}",
                self.from.generation,
                self.ext.reach,
                not_taken.iter().filter(|l| l.end > pos).count(),
            );
            tracing::warn!("{w}");
            self.ext.warnings.push(w);
        }
        self.ext.left_out = not_taken.into_iter().filter(|l| l.end > pos).collect();
    }
}

/// Checks that `data` is `len` bytes of whole, valid frames starting at `first_seq`; returns
/// the number of frames.
pub(crate) fn check_frames(data: &[u8], len: u64, first_seq: u64) -> Result<u64, String> {
    if data.len() as u64 != len {
        return Err(format!("{} bytes, expected {len}", data.len()));
    }
    let scan = scan_frames(data, first_seq);
    if let Some(stop) = scan.stop {
        return Err(format!("{stop} at byte {}", scan.valid_len));
    }
    if scan.frames.is_empty() {
        return Err("no frames".into());
    }
    Ok(scan.frames.len() as u64)
}
