//! Resume: how the worker learns its [`View`] of the prefix from the bucket
//! ([`from_bucket`]), and decides with the store's lineage whether and how to go on.
//!
//! # What it reads
//! LATEST and the manifest it names (or, with no LATEST, the newest valid manifest listed),
//! the store's `backup.lineage` and parent, and one listing of `gen/` that skips the segments
//! the newest restore point already names ([`list_generations`]). Then it continues its
//! lineage's newest generation while the store's files are still its: the same `wal.bin`, the
//! WAL checked against the last shipped segment (a diverged store is refused, not spliced,
//! [`check_not_diverged`]), and its own segments past the manifest taken back (`shipped.rs`:
//! vouched for by the journal, or read). Otherwise the next step starts a new generation.
//!
//! # Invariants
//! - A refusal by the lineage decision comes before anything else it found wrong.
//! - Nothing is written to the bucket. One write to the store, once: `backup.lineage` on a
//!   store's first backup; when the other worker of the store wrote a different one first, the
//!   resume fails and the next step decides again with it.
//! - A generation is continued only with its own kind, and (encrypted) with its key
//!   (`keys.rs`); mixing encrypted and plain generations is refused unless allowed.
//!
//! What a crash leaves: at most `backup.lineage`, which a restart reads back.

mod shipped;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use uuid::Uuid;

use super::WorkerError;
use super::ctx::Ctx;
use super::lineage::{self, Decision, NewestRestorePoint};
use super::view::{Generation, View, get_opt};
use crate::bucket::{self, DynBucket};
use crate::manifest::{self, LATEST_KEY, Latest, Manifest, ParentRef};
use crate::store::disk::{self, DiskState};
use crate::store::format::WalPosition;
use shipped::extend_with_shipped_segments;

/// Reads the prefix's state and decides, with the store's lineage, whether and how to go on.
pub(super) async fn from_bucket(
    cx: &Ctx<'_>,
    disk: &DiskState,
    pos: &WalPosition,
) -> Result<View, WorkerError> {
    cx.activity.set(crate::health::StepPhase::Resuming);
    let bucket = cx.bucket;
    let Found {
        latest,
        manifests,
        any_manifest,
        newest,
    } = newest_restore_point(bucket, cx.form).await?;
    let generations = list_generations(bucket, newest.as_ref().map(|(_, m)| m)).await;
    let (lineage, write_lineage, parent) = decide(cx, pos, &latest, &newest).await?;
    let mut listing = Listing::of(cx, generations?, any_manifest)?;
    // The decision proceeded: the newest restore point is this history's (own or adopted).
    let origin = newest.as_ref().and_then(|(_, m)| m.origin().cloned());
    let newest_own = newest.filter(|(_, m)| m.lineage == lineage).map(|(_, m)| m);
    let skip_restore_point_at = parent
        .as_ref()
        .and_then(|p| manifest::parse_manifest_key(&p.manifest));
    let (current, keys) = match &newest_own {
        Some(m) => continue_newest(cx, disk, pos, lineage, m, &mut listing).await?,
        None => (None, HashMap::new()),
    };
    if write_lineage {
        write_lineage_once(cx, lineage).await?;
    }
    Ok(View {
        lineage,
        parent,
        origin,
        latest,
        max_generation: listing.max_generation,
        current,
        newest_own,
        skip_restore_point_at,
        manifests,
        claims: HashMap::new(),
        found_empty_at: listing.found_empty_at,
        settled: Default::default(),
        keys,
        wrappers: HashMap::new(),
        pins: HashMap::new(),
        branch_charges: Vec::new(),
    })
}

/// The store's lineage and parent, read, and the lineage decision with the newest restore
/// point: `(lineage, whether to write it, the parent to name)`, or the refusal.
async fn decide(
    cx: &Ctx<'_>,
    pos: &WalPosition,
    latest: &Option<(Latest, crate::latest::Version)>,
    newest: &Option<(String, Manifest)>,
) -> Result<(Uuid, bool, Option<ParentRef>), WorkerError> {
    let store = cx.store.clone();
    let (store_lineage, parent) = tokio::task::spawn_blocking(move || {
        Ok::<_, disk::DiskError>((
            disk::read_lineage_in(&store)?,
            disk::read_parent_in(&store)?,
        ))
    })
    .await
    .map_err(|e| WorkerError::Store {
        dir: cx.dir.clone(),
        detail: e.to_string(),
    })??;
    let decision = lineage::decide(
        store_lineage,
        parent.as_ref(),
        pos.commit_seq,
        newest
            .as_ref()
            .map(|(key, m)| NewestRestorePoint::of(key, m, latest.as_ref().map(|(l, _)| l))),
        Uuid::new_v4,
    );
    match decision {
        Decision::Refuse(reason) => Err(WorkerError::Refused { reason }),
        Decision::Proceed {
            lineage,
            write_lineage,
            parent,
        } => Ok((lineage, write_lineage, parent)),
    }
}

/// What the listing of `gen/` says: every generation in the prefix, any lineage, and this
/// lineage's segment keys.
struct Listing {
    max_generation: u64,
    /// Segment keys by generation.
    segment_keys: BTreeMap<u64, Vec<Listed>>,
    /// Generations with a wrapper key (encrypted).
    wrapped: BTreeSet<u64>,
    /// The prefix was empty: no LATEST, no manifest, no generation.
    found_empty_at: Option<tokio::time::Instant>,
}

impl Listing {
    fn of(
        cx: &Ctx<'_>,
        generations: Vec<crate::bucket::ObjectMeta>,
        any_manifest: bool,
    ) -> Result<Listing, WorkerError> {
        super::keys::check_mixing(
            &generations,
            cx.encryption.keys.is_some(),
            cx.encryption.allow_mixed,
        )?;
        let wrapped: BTreeSet<u64> = generations
            .iter()
            .filter_map(|o| crate::crypto::key_objects::parse_wrapper_key(&o.key))
            .map(|(g, _)| g)
            .collect();
        let found_empty_at =
            (!any_manifest && generations.is_empty()).then(tokio::time::Instant::now);
        let mut max_generation = 0;
        let mut segment_keys: BTreeMap<u64, Vec<Listed>> = BTreeMap::new();
        for o in generations {
            let Some(g) = manifest::parse_generation(&o.key) else {
                continue;
            };
            max_generation = max_generation.max(g);
            // Which of them can be segments, and the chain through them, is chosen as a restore
            // chooses it (`at_rest::chain`): one longer than any encoding of its key's range
            // (a hostile object could be gigabytes) or claiming more than a writer ships is
            // never read.
            if manifest::parse_segment_key(g, &o.key).is_some() {
                segment_keys.entry(g).or_default().push(Listed {
                    key: o.key,
                    len: o.len,
                    etag: o.etag,
                });
            }
        }
        Ok(Listing {
            max_generation,
            segment_keys,
            wrapped,
            found_empty_at,
        })
    }
}

/// The generation of this lineage's newest manifest `m`, continued when the store is still on
/// its `wal.bin` (a new snapshot that kept the WAL starts a new generation at the next step,
/// which carries its segments over), with the generation keys opened on the way.
async fn continue_newest(
    cx: &Ctx<'_>,
    disk: &DiskState,
    pos: &WalPosition,
    lineage: Uuid,
    m: &Manifest,
    listing: &mut Listing,
) -> Result<GenerationKeys, WorkerError> {
    let mut keys = HashMap::new();
    // Continued only with its own kind, and (encrypted) with its key: else a new generation
    // starts (see `super::keys`).
    let seal = match (
        cx.encryption.keys.is_some(),
        listing.wrapped.contains(&m.generation),
    ) {
        (true, true) => {
            let k = super::keys::open_uncached(
                cx.bucket.as_ref(),
                cx.encryption.keys.as_ref(),
                lineage,
                m.generation,
            )
            .await?;
            keys.insert(m.generation, k.clone());
            k.map(Some)
        }
        (false, false) => Some(None),
        _ => None,
    };
    let Some(seal) = seal else {
        return Ok((None, keys));
    };
    if m.wal_id != pos.wal_id {
        return Ok((None, keys));
    }
    let mut g = Generation::from_manifest(m);
    g.seal = seal;
    check_not_diverged(cx, disk, pos, &g).await?;
    let listed = listing
        .segment_keys
        .remove(&m.generation)
        .unwrap_or_default();
    extend_with_shipped_segments(cx, pos, &mut g, lineage, listed).await?;
    Ok((Some(g), keys))
}

/// The generation continued, if any, and the generation keys opened.
type GenerationKeys = (
    Option<Generation>,
    HashMap<u64, Option<crate::at_rest::seal::GenerationKey>>,
);

/// Writes `backup.lineage` on a store's first backup. The other worker of this store (primary
/// or replica) may have written its lineage first: this view was decided without it, so the
/// resume fails, and the next step decides again with it.
async fn write_lineage_once(cx: &Ctx<'_>, lineage: Uuid) -> Result<(), WorkerError> {
    let store = cx.store.clone();
    let written = tokio::task::spawn_blocking(move || disk::write_lineage_once(&store, lineage))
        .await
        .map_err(|e| WorkerError::Store {
            dir: cx.dir.clone(),
            detail: e.to_string(),
        })??;
    if written != lineage {
        return Err(WorkerError::Store {
            dir: cx.dir.clone(),
            detail: format!(
                "backup.lineage was written meanwhile ({written}) by another worker of this store; looking again"
            ),
        });
    }
    Ok(())
}

/// What resume reads of the prefix's restore points: LATEST and the manifest it names, or
/// (with no LATEST: a crash after the first manifest, or an empty prefix) the newest valid
/// manifest listed.
struct Found {
    latest: Option<(Latest, crate::latest::Version)>,
    manifests: HashMap<String, Option<Manifest>>,
    any_manifest: bool,
    newest: Option<(String, Manifest)>,
}

async fn newest_restore_point(
    bucket: &DynBucket,
    form: crate::latest::Form,
) -> Result<Found, WorkerError> {
    let latest = match crate::latest::read_as(bucket.as_ref(), form).await? {
        None => None,
        Some(found) => {
            let l = found.latest.map_err(|e| WorkerError::BadBucket {
                key: found.key,
                detail: e.to_string(),
            })?;
            Some((l, found.version))
        }
    };
    let mut manifests: HashMap<String, Option<Manifest>> = HashMap::new();
    let mut any_manifest = latest.is_some();
    let newest = match &latest {
        Some((l, _)) => {
            let Some(o) = get_opt(bucket, &l.manifest).await? else {
                return Err(WorkerError::BadBucket {
                    key: LATEST_KEY.into(),
                    detail: format!("names {}, which does not exist", l.manifest),
                });
            };
            let m = Manifest::decode(&l.manifest, &o.data).map_err(|e| WorkerError::BadBucket {
                key: l.manifest.clone(),
                detail: format!("LATEST names an invalid manifest: {e}"),
            })?;
            manifests.insert(l.manifest.clone(), Some(m.clone()));
            Some((l.manifest.clone(), m))
        }
        None => {
            // No LATEST: a crash after the first manifest, or an empty prefix.
            let mut keys: Vec<(u64, String)> =
                bucket::list_all(bucket.as_ref(), manifest::MANIFESTS_PREFIX)
                    .await?
                    .into_iter()
                    .filter_map(|o| manifest::parse_manifest_key(&o.key).map(|n| (n, o.key)))
                    .collect();
            keys.sort();
            any_manifest = !keys.is_empty();
            if any_manifest && form == crate::latest::Form::Mutable {
                // Manifests without LATEST: a crash before the first LATEST, or a write-once
                // prefix, which a mutable writer refuses.
                crate::latest::refuse_pointers(bucket.as_ref()).await?;
            }
            let mut found = None;
            for (_, key) in keys.into_iter().rev() {
                let Some(o) = get_opt(bucket, &key).await? else {
                    continue;
                };
                match Manifest::decode(&key, &o.data) {
                    Ok(m) => {
                        manifests.insert(key.clone(), Some(m.clone()));
                        found = Some((key, m));
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(%key, error = %e, "skipping an invalid manifest");
                        manifests.insert(key, None);
                    }
                }
            }
            found
        }
    };
    Ok(Found {
        latest,
        manifests,
        any_manifest,
        newest,
    })
}

/// Every object under `gen/` a resume needs: all of them but the segments of the newest
/// restore point's generation that it names, which can be tens of thousands (a LIST page per
/// thousand: 3.4 s for 12,000 on moto, security review 4, finding 7) and are never read
/// again. `gen/` is listed page by page as before (one LIST for a small prefix); a page that
/// reaches that generation's segments short of the last one the manifest names jumps there
/// (`StartAfter` the one before it, so the last named one still shows the generation has data
/// to `keys::check_mixing`), and the listing goes on from it to the end: the segments past the
/// restore point (the chain continues after the last named one) and later generations.
async fn list_generations(
    bucket: &DynBucket,
    newest: Option<&Manifest>,
) -> Result<Vec<crate::bucket::ObjectMeta>, crate::bucket::BucketError> {
    let wal = newest.map(|m| manifest::segments_prefix(m.generation));
    let skip_to = newest.and_then(|m| {
        let named: Vec<&str> = m
            .segments
            .iter()
            .filter(|s| s.object.generation == m.generation)
            .map(|s| s.object.key.as_str())
            .collect();
        (named.len() >= 2).then(|| named[named.len() - 2].to_string())
    });
    let mut out: Vec<crate::bucket::ObjectMeta> = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut query = crate::bucket::ListQuery::new(manifest::GEN_PREFIX, None, 1000);
        if let Some(a) = &after {
            query = query.starting_after(a.clone());
        }
        let page = bucket.list(query).await?;
        out.extend(page.objects);
        let (Some(_), Some(last)) = (page.next_token, out.last()) else {
            return Ok(out);
        };
        let last = last.key.clone();
        after = Some(match (&wal, &skip_to) {
            (Some(w), Some(to)) if last.starts_with(w.as_str()) && last < *to => to.clone(),
            _ => last,
        });
    }
}

/// Refuses a store whose `wal.bin` no longer holds what the prefix shipped of it (a store
/// restored from an older backup and written to since, say): continuing would splice two
/// histories.
async fn check_not_diverged(
    cx: &Ctx<'_>,
    disk: &DiskState,
    pos: &WalPosition,
    g: &Generation,
) -> Result<(), WorkerError> {
    let Some(last) = g.segments.last() else {
        return Ok(());
    };
    let diverged = if pos.durable_len < last.end {
        true
    } else {
        match super::view::read_wal_range(cx, disk, last.start, last.end).await? {
            Some(local) => !crate::at_rest::seal::plain_matches(
                &last.object,
                local.len() as u64,
                crc32fast::hash(&local),
                g.seal.as_ref(),
            ),
            None => false,
        }
    };
    if diverged {
        return Err(WorkerError::Refused {
            reason: format!(
                "the store's wal.bin no longer matches what {} holds of it: the store diverged from \
                 this prefix (restored from an older backup and written to since?); back it up to a new prefix",
                last.object.key
            ),
        });
    }
    Ok(())
}

/// Segment GETs in flight at once while resume takes on shipped segments.
const SEGMENT_GETS: usize = 8;

/// A segment key as the listing showed it.
#[derive(Debug, Clone)]
struct Listed {
    key: String,
    len: u64,
    etag: String,
}
