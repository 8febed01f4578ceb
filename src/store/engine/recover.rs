//! Recovery as a pure reading of the files: [`read_store`] builds a [`StoreImage`] — the map,
//! the commit count, the WAL chain — and the list of [`Recovery`] steps that `Engine::open`
//! would apply, without taking a lock or writing anything. `Engine::open` applies the steps
//! with `repair` and reads again, so the engine and the read-only readers share one
//! definition of what a store holds.
//!
//! The reading, in order:
//!
//! 1. `snapshot.intent`: empty or missing means no snapshot in flight. Otherwise the snapshot
//!    it names *completed* if `snapshot.bin` carries its id (the rename happened); it is
//!    finished (new `wal.bin` if still needed, covered archives deleted, intent emptied).
//!    A snapshot that did not complete — or an intent that does not parse, which can only be
//!    a crash while it was being written — is rolled back: `snapshot.bin.tmp` is removed and
//!    the intent emptied; the old `snapshot.bin` and the WAL are untouched by then.
//! 2. `snapshot.bin`, if present, must decode (it is only ever created by rename): its map
//!    and `commit_seq` are the base.
//! 3. Archives, ascending by number. An archive whose last seq is at or below the snapshot's
//!    `commit_seq` is *covered*: it is not needed and not part of the chain (deleted when a
//!    completed snapshot is finished). The others must chain: consecutive numbers, each
//!    floor equal to the previous file's last seq, and the first floor at or below the base
//!    (0 without a snapshot) — otherwise commits are missing and the store is `Corrupt`.
//! 4. `wal.bin` continues the chain the same way. Missing `wal.bin` beside archives is a
//!    rotation that crashed between its two renames: a new one follows the last archive.
//!    A torn tail is cut (truncated to the valid length).
//! 5. Frames with `seq` greater than the snapshot's `commit_seq` are replayed in order.
//!
//! Stray `*.tmp` files of interrupted atomic writes are removed.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::EngineError;
use super::codec::{KvMap, apply_ops, decode_batch, decode_map};
use super::files::{
    self, ARCHIVE_DIR, INTENT, META, SNAPSHOT, STRAY_TMPS, WAL, fsync_dir, read_optional,
};
use crate::store::format::{
    SnapshotHeader, SnapshotIntent, TailStop, WalHeader, WalScan, decode_snapshot, scan_wal,
};

/// One closed WAL file found under `archive/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveInfo {
    pub number: u64,
    pub path: PathBuf,
    pub header: WalHeader,
    /// Seq of its last valid frame (its floor when it has none).
    pub last_seq: u64,
    /// Why its frames stopped before the end of the file, if they did.
    pub tail: Option<TailStop>,
    /// Wholly inside the snapshot: not part of the chain, deletable.
    pub covered: bool,
}

/// What `snapshot.intent` said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IntentState {
    /// Empty or missing: no snapshot in flight.
    Empty,
    /// `snapshot.bin` carries the intent's id: the snapshot completed, its protocol did not.
    Completed(SnapshotIntent),
    /// The snapshot did not reach `snapshot.bin` (`None`: the intent itself was torn).
    Incomplete(Option<SnapshotIntent>),
}

/// One step `Engine::open` takes to bring the files to a clean state; listed by
/// [`read_store`], applied in order by `Engine::open`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recovery {
    /// Remove a `*.tmp` left by an interrupted atomic write.
    RemoveStray(PathBuf),
    /// Start a new `wal.bin` with this number and floor (finishing a snapshot, or a rotation
    /// that crashed between renaming `wal.bin` away and renaming the new one in).
    NewWal { number: u64, floor: u64 },
    /// Delete an archive a completed snapshot covers.
    DeleteArchive(PathBuf),
    /// Cut a torn tail: truncate `wal.bin` to its valid length and fsync it.
    TruncateWal { valid_len: u64 },
    /// Empty `snapshot.intent` (after everything above is durable).
    EmptyIntent,
}

/// A store as recovery sees it, read without a lock and without writing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreImage {
    /// Commits the store holds (after recovery).
    pub commit_seq: u64,
    pub map: KvMap,
    pub snapshot: Option<SnapshotHeader>,
    /// Header of `wal.bin`; `None` when it is missing (see [`Recovery::NewWal`]).
    pub wal: Option<WalHeader>,
    /// Bytes of `wal.bin` that are header plus valid frames.
    pub wal_valid_len: u64,
    /// Bytes of `wal.bin` on disk (more than `wal_valid_len` with a torn tail).
    pub wal_file_len: u64,
    /// Why `wal.bin`'s frames stopped before its end, if they did.
    pub wal_tail: Option<TailStop>,
    pub archives: Vec<ArchiveInfo>,
    pub intent: IntentState,
    /// What `Engine::open` would do to these files; empty for a clean store.
    pub recovery: Vec<Recovery>,
}

impl StoreImage {
    pub fn digest(&self) -> StoreDigest {
        StoreDigest {
            commit_seq: self.commit_seq,
            digest: digest_map(&self.map),
        }
    }
}

/// `commit_seq` and a digest of the map: two stores holding the same commits compare equal.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct StoreDigest {
    pub commit_seq: u64,
    /// Hex SHA-256, see [`digest_map`].
    pub digest: String,
}

impl std::fmt::Display for StoreDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "commit_seq={} digest={}", self.commit_seq, self.digest)
    }
}

/// Hex SHA-256 over the map in key order, each key and value prefixed by its length (u64 LE).
pub fn digest_map(map: &KvMap) -> String {
    let mut h = Sha256::new();
    for (k, v) in map {
        h.update((k.len() as u64).to_le_bytes());
        h.update(k);
        h.update((v.len() as u64).to_le_bytes());
        h.update(v);
    }
    hex::encode(h.finalize())
}

/// The digest of the store in `dir`, read as [`read_store`] reads it.
pub fn digest(dir: &Path) -> Result<StoreDigest, EngineError> {
    Ok(read_store(dir)?.digest())
}

/// Reads the store in `dir` the way `Engine::open` recovers it, in memory: no lock is taken
/// and nothing is written. On a store another process is writing, the result is a view that
/// may be slightly behind, or a transient error if a snapshot or rotation renames files
/// between the reads.
pub fn read_store(dir: &Path) -> Result<StoreImage, EngineError> {
    let wal_path = dir.join(WAL);
    let snapshot_path = dir.join(SNAPSHOT);
    let wal_bytes = read_optional(&wal_path)?;
    let snapshot_bytes = read_optional(&snapshot_path)?;
    let archive_files = files::list_archives(dir)?;
    if wal_bytes.is_none() && snapshot_bytes.is_none() && archive_files.is_empty() {
        return Err(EngineError::NotAStore {
            dir: dir.to_path_buf(),
        });
    }
    check_meta(dir)?;

    let intent = read_intent(dir)?;
    let (snapshot, mut map) = read_snapshot(&snapshot_path, snapshot_bytes.as_deref())?;
    let base = snapshot.map_or(0, |s| s.commit_seq);
    let intent = intent_state(dir, intent, snapshot, base)?;
    let (archives, prev) = replay_archives(archive_files, snapshot.is_some(), base, &mut map)?;
    let tip = WalTip::read(
        &wal_path,
        wal_bytes.as_deref(),
        prev,
        base,
        &archives,
        &mut map,
    )?;
    let recovery = recovery_steps(dir, &wal_path, &intent, snapshot, base, &archives, &tip)?;
    Ok(StoreImage {
        commit_seq: base.max(tip.end),
        map,
        snapshot,
        wal: tip.wal,
        wal_valid_len: tip.valid_len,
        wal_file_len: tip.file_len,
        wal_tail: tip.tail,
        archives,
        intent,
        recovery,
    })
}

/// The snapshot's header and map, if `snapshot.bin` is there; else an empty map.
fn read_snapshot(
    path: &Path,
    bytes: Option<&[u8]>,
) -> Result<(Option<SnapshotHeader>, KvMap), EngineError> {
    let Some(b) = bytes else {
        return Ok((None, KvMap::new()));
    };
    let (header, payload) = decode_snapshot(b).map_err(|e| EngineError::format(path, e))?;
    let map = decode_map(payload).map_err(|e| EngineError::format(path, e))?;
    Ok((Some(header), map))
}

/// What `snapshot.intent` says given `snapshot.bin`: completed when the snapshot carries its
/// id (and then its commit_seq must be the snapshot's), else incomplete, or empty.
fn intent_state(
    dir: &Path,
    intent: Option<Option<SnapshotIntent>>,
    snapshot: Option<SnapshotHeader>,
    base: u64,
) -> Result<IntentState, EngineError> {
    Ok(match intent {
        None => IntentState::Empty,
        Some(Some(i)) if snapshot.is_some_and(|s| s.snapshot_id == i.snapshot_id) => {
            if i.commit_seq != base {
                return Err(EngineError::corrupt(
                    &dir.join(INTENT),
                    format!(
                        "intent says commit_seq {} but snapshot.bin holds {base}",
                        i.commit_seq
                    ),
                ));
            }
            IntentState::Completed(i)
        }
        Some(i) => IntentState::Incomplete(i),
    })
}

/// `(number, last_seq)` of the last WAL file taken into the chain.
type ChainLink = (u64, u64);

/// Reads every archive, replaying into `map` those the snapshot does not cover (each must
/// link to the one before). Returns them all, and `(number, last_seq)` of the last one taken
/// into the chain.
fn replay_archives(
    archive_files: Vec<(u64, PathBuf)>,
    has_snapshot: bool,
    base: u64,
    map: &mut KvMap,
) -> Result<(Vec<ArchiveInfo>, Option<ChainLink>), EngineError> {
    let mut archives = Vec::new();
    let mut prev: Option<ChainLink> = None;
    for (number, path) in archive_files {
        let bytes = std::fs::read(&path).map_err(|e| EngineError::io(&path, "read", e))?;
        let scan = scan_wal(&bytes).map_err(|e| EngineError::format(&path, e))?;
        if scan.header.number != number {
            return Err(EngineError::corrupt(
                &path,
                format!(
                    "header number {} differs from the file name",
                    scan.header.number
                ),
            ));
        }
        let covered = has_snapshot && scan.last_seq <= base;
        if !covered {
            check_link(&path, &scan.header, prev, base)?;
            replay(&path, &bytes, &scan, base, map)?;
            prev = Some((number, scan.last_seq));
        }
        archives.push(ArchiveInfo {
            number,
            path,
            header: scan.header,
            last_seq: scan.last_seq,
            tail: scan.stop,
            covered,
        });
    }
    Ok((archives, prev))
}

/// The end of the WAL chain: `wal.bin` as read and replayed, or, when it is missing, the one
/// to start after the last archive (a rotation that crashed between its renames).
struct WalTip {
    wal: Option<WalHeader>,
    valid_len: u64,
    file_len: u64,
    tail: Option<TailStop>,
    number: u64,
    floor: u64,
    /// The last commit of the chain.
    end: u64,
    /// The `wal.bin` to start, `(number, floor)`, when it is missing.
    new_wal: Option<(u64, u64)>,
}

impl WalTip {
    /// Reads `wal.bin` (`bytes`), which must link to the last archive of the chain (`prev`),
    /// and replays it into `map`; missing, continues from the last archive.
    fn read(
        wal_path: &Path,
        bytes: Option<&[u8]>,
        prev: Option<ChainLink>,
        base: u64,
        archives: &[ArchiveInfo],
        map: &mut KvMap,
    ) -> Result<WalTip, EngineError> {
        if let Some(bytes) = bytes {
            let scan = scan_wal(bytes).map_err(|e| EngineError::format(wal_path, e))?;
            check_link(wal_path, &scan.header, prev, base)?;
            replay(wal_path, bytes, &scan, base, map)?;
            let h = scan.header;
            return Ok(WalTip {
                wal: Some(h),
                valid_len: scan.valid_len,
                file_len: bytes.len() as u64,
                tail: scan.stop,
                number: h.number,
                floor: h.floor,
                end: scan.last_seq,
                new_wal: None,
            });
        }
        let Some(last) = archives.last() else {
            return Err(EngineError::corrupt(
                wal_path,
                "missing, and no archive to continue the WAL chain from",
            ));
        };
        let (number, floor) = (last.number + 1, last.last_seq);
        Ok(WalTip {
            wal: None,
            valid_len: 0,
            file_len: 0,
            tail: None,
            number,
            floor,
            end: floor,
            new_wal: Some((number, floor)),
        })
    }
}

/// The steps `Engine::open` takes on these files, in order: remove stray temporaries, start
/// a new `wal.bin` if needed, delete the archives a completed snapshot covers, cut a torn
/// tail, empty the intent. Fails if the chain ends before the snapshot.
fn recovery_steps(
    dir: &Path,
    wal_path: &Path,
    intent: &IntentState,
    snapshot: Option<SnapshotHeader>,
    base: u64,
    archives: &[ArchiveInfo],
    tip: &WalTip,
) -> Result<Vec<Recovery>, EngineError> {
    let mut recovery: Vec<Recovery> = STRAY_TMPS
        .iter()
        .map(|name| dir.join(name))
        .filter(|p| p.symlink_metadata().is_ok())
        .map(Recovery::RemoveStray)
        .collect();
    let end = tip.end;
    let mut new_wal = tip.new_wal;
    // A completed snapshot that did not keep its WAL replaces wal.bin, unless that happened
    // already (floor == base) or wal.bin holds commits beyond the snapshot.
    if matches!(intent, IntentState::Completed(_))
        && snapshot.is_some_and(|s| s.kept_wal_id.is_none())
        && end <= base
        && tip.floor < base
    {
        new_wal = Some((tip.number + 1, base));
    }
    let chain_end = match new_wal {
        Some((_, floor)) => floor.max(end),
        None => end,
    };
    if chain_end < base {
        return Err(EngineError::corrupt(
            wal_path,
            format!("the WAL chain ends at seq {end}, before the snapshot's commit_seq {base}"),
        ));
    }
    if let Some((number, floor)) = new_wal {
        recovery.push(Recovery::NewWal { number, floor });
    }
    if matches!(intent, IntentState::Completed(_)) {
        recovery.extend(
            archives
                .iter()
                .filter(|a| a.covered)
                .map(|a| Recovery::DeleteArchive(a.path.clone())),
        );
    }
    if tip.wal.is_some() && new_wal.is_none() && tip.valid_len < tip.file_len {
        recovery.push(Recovery::TruncateWal {
            valid_len: tip.valid_len,
        });
    }
    if *intent != IntentState::Empty {
        recovery.push(Recovery::EmptyIntent);
    }
    Ok(recovery)
}

/// Applies the steps [`read_store`] listed, in order, making each durable: directories are
/// fsynced before the intent is emptied, so a crash in the middle repeats the same steps.
pub(super) fn repair(dir: &Path, steps: &[Recovery]) -> Result<(), EngineError> {
    for step in steps {
        match step {
            Recovery::RemoveStray(path) | Recovery::DeleteArchive(path) => {
                files::remove_if_present(path)?;
            }
            Recovery::NewWal { number, floor } => {
                files::start_wal(dir, *number, *floor)?;
            }
            Recovery::TruncateWal { valid_len } => {
                let path = dir.join(WAL);
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map_err(|e| EngineError::io(&path, "open", e))?;
                f.set_len(*valid_len)
                    .map_err(|e| EngineError::io(&path, "truncate torn tail", e))?;
                f.sync_all()
                    .map_err(|e| EngineError::io(&path, "fsync", e))?;
            }
            Recovery::EmptyIntent => {
                let adir = dir.join(ARCHIVE_DIR);
                if adir.is_dir() {
                    fsync_dir(&adir)?;
                }
                fsync_dir(dir)?;
                files::rewrite_in_place(&dir.join(INTENT), b"")?;
            }
        }
    }
    if !steps.is_empty() {
        fsync_dir(dir)?;
    }
    Ok(())
}

/// `Some(None)` for an intent that does not parse, `None` for no intent.
fn read_intent(dir: &Path) -> Result<Option<Option<SnapshotIntent>>, EngineError> {
    let path = dir.join(INTENT);
    Ok(match read_optional(&path)? {
        None => None,
        Some(b) if b.is_empty() => None,
        Some(b) => match serde_json::from_slice::<SnapshotIntent>(&b) {
            Ok(i) => Some(Some(i)),
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "torn snapshot intent, rolling back");
                Some(None)
            }
        },
    })
}

/// `store.meta` is optional (a real node may not write one); if it is JSON with a `format`
/// field, that format must be ours.
fn check_meta(dir: &Path) -> Result<(), EngineError> {
    let path = dir.join(META);
    let Some(b) = read_optional(&path)? else {
        return Ok(());
    };
    match meta_format_problem(&b) {
        None => Ok(()),
        Some(problem) => Err(EngineError::corrupt(&path, problem)),
    }
}

/// Why the bytes of a `store.meta` name a store format this engine does not read, if they
/// do: JSON with a `format` field other than [`super::STORE_FORMAT`]. Anything else (not
/// JSON, no `format`) is another writer's business and passes.
pub fn meta_format_problem(meta: &[u8]) -> Option<String> {
    let format = serde_json::from_slice::<serde_json::Value>(meta)
        .ok()
        .and_then(|v| v.get("format").cloned())?;
    (format != super::STORE_FORMAT).then(|| {
        format!(
            "store format {format}, this engine reads format {}",
            super::STORE_FORMAT
        )
    })
}

/// Checks that a WAL file continues the chain after `prev` (number, last seq), or starts it
/// at or below `base`.
fn check_link(
    path: &Path,
    h: &WalHeader,
    prev: Option<(u64, u64)>,
    base: u64,
) -> Result<(), EngineError> {
    match prev {
        Some((number, last_seq)) => {
            if Some(h.number) != number.checked_add(1) {
                return Err(EngineError::corrupt(
                    path,
                    format!("WAL number {} does not follow {number}", h.number),
                ));
            }
            if h.floor != last_seq {
                return Err(EngineError::corrupt(
                    path,
                    format!(
                        "WAL floor {} but the previous file ends at seq {last_seq}",
                        h.floor
                    ),
                ));
            }
        }
        None if h.floor > base => {
            return Err(EngineError::corrupt(
                path,
                format!(
                    "the WAL chain starts after seq {} but the store holds only {base} before \
                     it: commits {}..={} are missing",
                    h.floor,
                    base + 1,
                    h.floor
                ),
            ));
        }
        None => {}
    }
    Ok(())
}

/// Applies the frames of one WAL file with `seq > base`.
fn replay(
    path: &Path,
    bytes: &[u8],
    scan: &WalScan,
    base: u64,
    map: &mut KvMap,
) -> Result<(), EngineError> {
    for frame in scan.frames.iter().filter(|f| f.seq > base) {
        let ops = decode_batch(frame.payload(bytes))
            .map_err(|e| EngineError::corrupt(path, format!("frame seq {}: {e}", frame.seq)))?;
        apply_ops(map, &ops);
    }
    Ok(())
}
