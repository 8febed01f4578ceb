//! What the worker knows of its prefix: the [`View`] (and the [`Generation`] it ships), and the
//! reads that go through its caches. How the view is learnt from the bucket is `resume/`.
//!
//! # Invariants
//! - The view is only what this worker saw the bucket accept or hold: it is rebuilt from the
//!   bucket whenever the worker starts, and again after any write the bucket refused (the
//!   worker keeps no state of its own besides `backup.lineage`).
//! - Manifests and GENERATION claims are immutable, so the ones read are cached for as long as
//!   the view lives.
//!
//! What a crash leaves: nothing; the view is memory, and the next worker resumes from the
//! bucket.

use std::collections::HashMap;

use bytes::Bytes;
use uuid::Uuid;

use super::WorkerError;
use super::ctx::Ctx;
use crate::bucket::{BucketError, DynBucket};
use crate::manifest::{
    self, ArchiveEntry, BranchOrigin, GenerationClaim, Latest, Manifest, ParentRef, SegmentEntry,
    SideFileEntry, SnapshotEntry,
};
use crate::store::disk::{self, DiskState};
use crate::store::format::WalPosition;

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

    pub fn manifest(
        &self,
        lineage: Uuid,
        parent: Option<ParentRef>,
        branched_from: Option<BranchOrigin>,
    ) -> Manifest {
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
            branch: None,
            branched_from,
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
    /// Where the prefix was branched from, when it is a branch (`crate::branch`): carried
    /// into every manifest this worker writes (`Manifest::branched_from`), shown in health.
    pub origin: Option<BranchOrigin>,
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
    pub settled: super::settled::Settled,
    /// Generation keys opened or made so far (`None`: no key this worker has opens it).
    pub keys: HashMap<u64, Option<crate::at_rest::seal::GenerationKey>>,
    /// A write-once prefix's wrapper keys of each encrypted generation, listed once
    /// (`super::hold`).
    pub wrappers: HashMap<u64, Vec<String>>,
    /// The branches' pins retention has read in this prefix (`crate::pins`).
    pub pins: crate::pins::Cache,
    /// What each live branch cut from this prefix is charged, as the last retention pass found
    /// (`crate::pins::Charge`; empty before one).
    pub branch_charges: Vec<crate::pins::Charge>,
}

/// A GET that answers `None` for an object that does not exist.
pub(super) async fn get_opt(
    bucket: &DynBucket,
    key: &str,
) -> Result<Option<crate::bucket::Object>, WorkerError> {
    match bucket.get(key).await {
        Ok(o) => Ok(Some(o)),
        Err(BucketError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e.into()),
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
