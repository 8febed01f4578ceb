//! What the worker knows of its prefix, and how it learns it again from the bucket (resume).
//!
//! The view is rebuilt from the bucket whenever the worker starts, and again after any write
//! the bucket refused: the worker keeps no state of its own besides `backup.lineage`.
//! Manifests and GENERATION claims are immutable, so the ones read are cached for as long as
//! the view lives.

mod shipped;
use shipped::*;
use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use uuid::Uuid;

use super::WorkerError;
use super::ctx::Ctx;
use super::lineage::{self, Decision, NewestRestorePoint};
use crate::bucket::{self, BucketError, DynBucket};
use crate::manifest::{
    self, ArchiveEntry, GenerationClaim, LATEST_KEY, Latest, Manifest, ParentRef, SegmentEntry,
    SideFileEntry, SnapshotEntry,
};
use crate::store::disk::{self, DiskState};
use crate::store::format::{WAL_HEADER_LEN, WalPosition, scan_frames};

/// The generation this worker is shipping.
#[derive(Debug, Clone)]
pub(super) struct Generation {
    pub number: u64,
    pub snapshot_id: Option<Uuid>,
    pub wal_id: Uuid,
    pub wal_number: u64,
    /// The floor in `wal.bin`'s header.
    pub wal_header_floor: u64,
    /// The floor of the first WAL file listed (first archive, else `wal.bin`).
    pub wal_floor: u64,
    pub snapshot: Option<SnapshotEntry>,
    pub archives: Vec<ArchiveEntry>,
    pub side_files: Vec<SideFileEntry>,
    pub segments: Vec<SegmentEntry>,
    /// Bytes of `wal.bin` shipped in segments.
    pub shipped_end: u64,
    /// The generation's data key, when it is encrypted: its new objects are sealed with it.
    pub seal: Option<crate::at_rest::seal::GenerationKey>,
}

impl Generation {
    /// Whether `pos` is on this generation's files (its snapshot and `wal.bin`): if not, a new
    /// generation starts.
    pub fn is_of(&self, pos: &WalPosition) -> bool {
        self.snapshot_id == pos.snapshot_id && self.wal_id == pos.wal_id
    }

    /// Commits the shipped segments reach.
    pub fn shipped_seq(&self) -> u64 {
        self.wal_header_floor + self.segments.iter().map(|s| s.frames).sum::<u64>()
    }

    pub fn manifest(&self, lineage: Uuid, parent: Option<ParentRef>) -> Manifest {
        let mut m = Manifest {
            format: manifest::FORMAT,
            lineage,
            generation: self.number,
            commit_seq: 0,
            created_at: manifest::now_rfc3339(),
            wal_floor: self.wal_floor,
            wal_id: self.wal_id,
            wal_number: self.wal_number,
            snapshot: self.snapshot.clone(),
            archives: self.archives.clone(),
            segments: self.segments.clone(),
            side_files: self.side_files.clone(),
            parent,
        };
        m.commit_seq = m.computed_commit_seq().expect("frame counts fit in u64");
        m
    }

    pub(super) fn from_manifest(m: &Manifest) -> Generation {
        Generation {
            number: m.generation,
            snapshot_id: m.snapshot.as_ref().map(|s| s.snapshot_id),
            wal_id: m.wal_id,
            wal_number: m.wal_number,
            wal_header_floor: m.wal_floor + m.archives.iter().map(|a| a.frames).sum::<u64>(),
            wal_floor: m.wal_floor,
            snapshot: m.snapshot.clone(),
            archives: m.archives.clone(),
            side_files: m.side_files.clone(),
            segments: m.segments.clone(),
            shipped_end: m.segments_end(),
            seal: None,
        }
    }
}

/// What the worker knows of its prefix.
pub(super) struct View {
    pub lineage: Uuid,
    /// Set while adopting a parent's prefix: named in this lineage's manifests.
    pub parent: Option<ParentRef>,
    /// The pointer to the newest restore point (`crate::latest`), and its version, as last
    /// written or read.
    pub latest: Option<(Latest, crate::latest::Version)>,
    /// The highest generation number in the prefix, any lineage.
    pub max_generation: u64,
    pub current: Option<Generation>,
    /// The newest manifest of this lineage that LATEST named or this worker wrote.
    pub newest_own: Option<Manifest>,
    /// A commit count whose manifest key belongs to the adopted parent: not rewritten.
    pub skip_restore_point_at: Option<u64>,
    /// Manifests read so far (`None`: junk).
    pub manifests: HashMap<String, Option<Manifest>>,
    /// GENERATION claims read so far (`None`: junk or missing).
    pub claims: HashMap<u64, Option<GenerationClaim>>,
    /// When resume found the prefix empty (no LATEST, no manifest, no generation): everything
    /// in it since was written after this (see [`super::retention`]).
    pub found_empty_at: Option<tokio::time::Instant>,
    /// What retention proved of the generations while this view lives.
    pub settled: super::retention::Settled,
    /// Generation keys opened or made so far (`None`: no key this worker has opens it).
    pub keys: HashMap<u64, Option<crate::at_rest::seal::GenerationKey>>,
    /// A write-once prefix's wrapper keys of each encrypted generation, listed once
    /// (`super::hold`).
    pub wrappers: HashMap<u64, Vec<String>>,
}

async fn get_opt(
    bucket: &DynBucket,
    key: &str,
) -> Result<Option<crate::bucket::Object>, WorkerError> {
    match bucket.get(key).await {
        Ok(o) => Ok(Some(o)),
        Err(BucketError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
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

impl View {
    /// Reads the prefix's state and decides, with the store's lineage, whether and how to go on.
    pub async fn resume(
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
        let (lineage, write_lineage, parent_ref) = match decision {
            Decision::Refuse(reason) => return Err(WorkerError::Refused { reason }),
            Decision::Proceed {
                lineage,
                write_lineage,
                parent,
            } => (lineage, write_lineage, parent),
        };

        // Every generation in the prefix, any lineage, and this lineage's segment keys.
        let mut max_generation = 0;
        let mut segment_keys: BTreeMap<u64, Vec<Listed>> = BTreeMap::new();
        let generations = generations?;
        super::keys::check_mixing(
            &generations,
            cx.encryption.keys.is_some(),
            cx.encryption.allow_mixed,
        )?;
        let wrapped: std::collections::BTreeSet<u64> = generations
            .iter()
            .filter_map(|o| crate::crypto::key_objects::parse_wrapper_key(&o.key))
            .map(|(g, _)| g)
            .collect();
        let found_empty_at =
            (!any_manifest && generations.is_empty()).then(tokio::time::Instant::now);
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

        let newest_own = newest.filter(|(_, m)| m.lineage == lineage).map(|(_, m)| m);
        let skip_restore_point_at = parent_ref
            .as_ref()
            .and_then(|p| manifest::parse_manifest_key(&p.manifest));
        let mut current = None;
        let mut keys = HashMap::new();
        if let Some(m) = &newest_own {
            // Continued only with its own kind, and (encrypted) with its key: else a new
            // generation starts (see `super::keys`).
            let seal = match (
                cx.encryption.keys.is_some(),
                wrapped.contains(&m.generation),
            ) {
                (true, true) => {
                    let k = super::keys::open_uncached(
                        bucket.as_ref(),
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
            // The same wal.bin: continue its segments (a new snapshot that kept the WAL starts
            // a new generation at the next step, which carries them over).
            if let Some(seal) = seal
                && m.wal_id == pos.wal_id
            {
                let mut g = Generation::from_manifest(m);
                g.seal = seal;
                check_not_diverged(cx, disk, pos, &g).await?;
                extend_with_shipped_segments(
                    cx,
                    pos,
                    &mut g,
                    lineage,
                    segment_keys.remove(&m.generation).unwrap_or_default(),
                )
                .await?;
                current = Some(g);
            }
        }

        if write_lineage {
            let store = cx.store.clone();
            let written =
                tokio::task::spawn_blocking(move || disk::write_lineage_once(&store, lineage))
                    .await
                    .map_err(|e| WorkerError::Store {
                        dir: cx.dir.clone(),
                        detail: e.to_string(),
                    })??;
            // The other worker of this store (primary or replica) wrote its lineage first:
            // this view was decided without it; the next step decides again with it.
            if written != lineage {
                return Err(WorkerError::Store {
                    dir: cx.dir.clone(),
                    detail: format!(
                        "backup.lineage was written meanwhile ({written}) by another worker of this store; looking again"
                    ),
                });
            }
        }
        Ok(View {
            lineage,
            parent: parent_ref,
            latest,
            max_generation,
            current,
            newest_own,
            skip_restore_point_at,
            manifests,
            claims: HashMap::new(),
            found_empty_at,
            settled: Default::default(),
            keys,
            wrappers: HashMap::new(),
        })
    }
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

/// Reads bytes `[start, end)` of `wal.bin` (blocking pool).
pub(super) async fn read_wal_range(
    cx: &Ctx<'_>,
    disk: &DiskState,
    start: u64,
    end: u64,
) -> Result<Option<Bytes>, WorkerError> {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let path = cx.dir.join(disk::WAL_FILE);
    let inode = disk.wal.inode;
    let store = cx.store.clone();
    let io = move |source| WorkerError::Io {
        path: path.clone(),
        source,
    };
    tokio::task::spawn_blocking(move || {
        let Some(f) = store
            .open(disk::WAL_FILE, crate::store::dir::FileKind::Store)
            .map_err(disk::DiskError::from)?
        else {
            return Ok(None);
        };
        if f.metadata().map_err(&io)?.ino() != inode {
            return Ok(None);
        }
        let mut buf = vec![0u8; crate::units::usize_of(end - start)];
        f.read_exact_at(&mut buf, start).map_err(&io)?;
        Ok(Some(Bytes::from(buf)))
    })
    .await
    .map_err(|e| WorkerError::Store {
        dir: cx.dir.clone(),
        detail: e.to_string(),
    })?
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
        match read_wal_range(cx, disk, last.start, last.end).await? {
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

/// Reads a GENERATION claim, cached.
pub(super) async fn claim(
    bucket: &DynBucket,
    claims: &mut HashMap<u64, Option<GenerationClaim>>,
    generation: u64,
) -> Result<Option<GenerationClaim>, WorkerError> {
    if let Some(c) = claims.get(&generation) {
        return Ok(c.clone());
    }
    let key = manifest::generation_key(generation);
    let c = match get_opt(bucket, &key).await? {
        Some(o) => GenerationClaim::decode(&key, &o.data).ok(),
        None => None,
    };
    claims.insert(generation, c.clone());
    Ok(c)
}
