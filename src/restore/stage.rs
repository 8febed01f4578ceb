//! Staging a restore: the temporary directory beside the target, the parallel download into
//! it (each file read back with the format's reader and fsynced as soon as it is complete,
//! overlapped with the rest of the download), the `--at` cut, the final read-back check, and
//! the rename into place.
//!
//! # When files are fsynced
//! Each file is fsynced as soon as its last byte is written, on the blocking pool, at most
//! [`FSYNCS_IN_FLIGHT`] at once, while the other downloads go on (and beside its read-back,
//! which reads the page cache and needs no fsync first): the disk writes of a restore overlap
//! its network waits, and what is left after the last GET is that file's fsync, the
//! directories' and the rename. (Restores used to fsync them one after another after the
//! download, leaving the whole store's writeback on the restore's tail. On this machine's
//! disk that tail is small: `benches/s5cmd.rs` measured restores of 2.15 s before and 2.10 s
//! after, median of 5, beside 1.1 s for `s5cmd cp` followed by a `sync` of every file; the
//! rest of the gap is the number and concurrency of GETs, not fsync.)
//! [`download`] returns only when every file's read-back and fsync have succeeded; any
//! failure fails the restore before anything is renamed. An `--at` cut truncates `wal.bin`
//! after that and fsyncs it again; the files `adopt` writes are written durably;
//! [`finish`] then fsyncs `archive/`, the store directory, and after the rename its parent.
//! A crash at any point leaves only the temporary directory: continued by the next run of
//! the same resumable restore (`super::resume`), removed by any other.
//!
//! The temporary directory is `.<name>.restore-<uuid>` in the target's parent (same file
//! system, so the final rename is atomic). It holds `.restore.lock`, `flock`ed for as long as
//! its restore runs, so that the clean-up of leftovers (`open_staging`, run by every restore
//! into the same target) never removes or continues the directory of a restore that is still
//! running; and, for a resumable restore, `.restore.record` (`super::resume`). Both are
//! removed just before the rename; the lock itself is released when the restore ends.
//!
//! # How objects are fetched
//! An object up to [`WHOLE_OBJECT_MAX`] (64 MiB: every archive, snapshot and segment at the
//! default 16 MiB rotation) is one whole-object GET; a larger one is [`RANGE_CHUNK`] (16 MiB)
//! ranged GETs with a tail under half a chunk folded into the range before it (never a GET of
//! a few KiB). Up to `parallelism` GETs (default 16) run at once, and the responses held in
//! memory are bounded by [`BYTES_IN_FLIGHT`] (128 MiB) whatever the parallelism. Why: a
//! store's object is usually 16 MiB plus a header; as three ranged GETs (8, 8 MiB and a few
//! KiB) it cost three requests, and S3-like servers that read an object whole for every ranged
//! GET (moto does) three whole reads: `benches/s5cmd.rs` measured 42 GETs, 8 at a time, and
//! 0.53x s5cmd's download + fsync, against 18 whole GETs after this change (the figures are
//! in docs/testing.md's table, row `s5cmd`). A whole GET's length is checked
//! against the manifest like a range's.
//!
//! An encoded object (compressed or sealed, `src/at_rest/`) cannot be fetched by ranges into
//! plain offsets: it is one job of the download ([`super::decode`]). Up to
//! [`WHOLE_OBJECT_MAX`] stored bytes it is one GET, decoded in one pass in memory as it is
//! written, and, when it is a whole archive or `wal.bin`, read by the format's reader in the
//! same pass (no read-back from disk, as for a raw object); a larger one GETs its ranges in
//! order, [`super::decode::DECODE_AHEAD`] ahead, pushes them through the decoder into its
//! file as they come, and is read back from disk. The decoder checks the stored length and
//! CRC and the plain length and CRC (or keyed tag). Its share of [`BYTES_IN_FLIGHT`] is what
//! it holds: the whole object, or its `DECODE_AHEAD` largest ranges. Encoded objects still
//! download in parallel with each other and with raw ones.
//! An object stored raw (codec `none`) keeps the ranged path.

mod downloading;
pub(crate) use downloading::*;
use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::io::ErrorKind;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::Semaphore;
use uuid::Uuid;

use super::decode::{decode_piece, held_bytes};
pub use super::fetch::{BYTES_IN_FLIGHT, RANGE_CHUNK, WHOLE_OBJECT_MAX, WRITE_GROUP, ranges};
use super::fetch::{Chunk, budget_permits, fetch_chunk};
use super::piece::{Piece, blocking};
use super::plan::Plan;
use super::readback::{FileCheck, ReadBack, chain, check_file, is_reference_engine_store};
use super::resume::{Identity, Kept, Record};
use super::{RestoreError, io};
use crate::bucket::Bucket;
use crate::manifest::ObjectEntry;
use crate::store::disk::{
    ARCHIVE_DIR, INTENT_FILE, LINEAGE_FILE, LOCK_FILE, PARENT_FILE, POSITION_FILE, SHIPPED_FILE,
    SNAPSHOT_FILE, WAL_FILE, archive_name, sync_dir, write_file_durably,
};
use crate::store::format::ParentRecord;

/// The lock file inside a temporary restore directory.
const LOCK_NAME: &str = ".restore.lock";
/// What the restore creates its directories with (the temporary one, which becomes the
/// target, and `archive/`): the restoring user's alone, whatever the umask.
pub const DIR_MODE: u32 = 0o700;
/// What the restore creates its files with (and `backup.lineage`, `backup.parent`).
pub const FILE_MODE: u32 = 0o600;

/// Creates the directory `path` with [`DIR_MODE`] (a umask can only narrow it further).
fn create_private_dir(path: &Path) -> Result<(), RestoreError> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new()
        .mode(DIR_MODE)
        .create(path)
        .map_err(io(path))
}

/// Creates (or truncates) the file `path`, new ones with [`FILE_MODE`]; opened read-write, since
/// a decoding that runs ahead of its reader reads back what it wrote (`super::decode`).
fn create_private_file(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .mode(FILE_MODE)
        .open(path)
}

/// Opens the file `path` read-write, creating it with [`FILE_MODE`], never truncating it.
fn open_private_file(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(FILE_MODE)
        .open(path)
}

/// Complete files being fsynced at once during a download (each on a blocking thread).
pub const FSYNCS_IN_FLIGHT: usize = 4;

/// The target directory, resolved: absolute, symlinks followed.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub path: PathBuf,
    pub parent: PathBuf,
    pub name: String,
}

/// Resolves `target` and refuses a target that exists and is not an empty directory on the
/// same file system as its parent. Blocking; cheap.
pub(crate) fn resolve_target(target: &Path) -> Result<Target, RestoreError> {
    let bad = |detail: &str| RestoreError::BadTarget {
        path: target.to_path_buf(),
        detail: detail.to_string(),
    };
    let abs = if target.is_absolute() {
        target.to_path_buf()
    } else {
        std::env::current_dir().map_err(io(target))?.join(target)
    };
    let path = match fs::symlink_metadata(&abs) {
        Ok(_) => fs::canonicalize(&abs).map_err(io(&abs))?,
        Err(e) if e.kind() == ErrorKind::NotFound => abs,
        Err(e) => return Err(io(&abs)(e)),
    };
    let (Some(parent), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str()))
    else {
        return Err(bad("needs a directory name (not `/`, `.` or `..`)"));
    };
    let resolved = Target {
        parent: parent.to_path_buf(),
        name: name.to_string(),
        path: path.clone(),
    };
    let meta = match fs::metadata(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(resolved),
        Err(e) => return Err(io(&path)(e)),
    };
    if !meta.is_dir() {
        return Err(bad("exists and is not a directory"));
    }
    if fs::read_dir(&path).map_err(io(&path))?.next().is_some() {
        return Err(RestoreError::TargetNotEmpty { path });
    }
    let parent_meta = fs::metadata(parent).map_err(io(parent))?;
    if parent_meta.dev() != meta.dev() {
        return Err(bad(
            "is a mount point, which cannot be replaced atomically; restore into a new \
             directory inside it",
        ));
    }
    Ok(resolved)
}

/// The temporary directory of one restore. Dropping it (any failure, a panic, or the restore's
/// future being dropped) removes it; [`TempDir::into_place`] disarms it.
pub(crate) struct TempDir {
    path: PathBuf,
    armed: bool,
    /// Held for as long as the restore runs.
    _lock: File,
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if self.armed
            && let Err(e) = fs::remove_dir_all(&self.path)
        {
            tracing::warn!("cannot remove {}: {e}", self.path.display());
        }
    }
}

fn temp_prefix(name: &str) -> String {
    format!(".{name}.restore-")
}

/// The temporary directories earlier restores into this target left behind, each locked by
/// this restore (those whose restore still holds the lock are skipped: it is running).
fn leftovers(target: &Target) -> Result<Vec<(PathBuf, File)>, RestoreError> {
    let prefix = temp_prefix(&target.name);
    let entries = match fs::read_dir(&target.parent) {
        Ok(e) => e,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(&target.parent)(e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io(&target.parent))?;
        if !entry.file_name().to_string_lossy().starts_with(&prefix) {
            continue;
        }
        let dir = entry.path();
        let lock_path = dir.join(LOCK_NAME);
        let lock = match File::open(&lock_path) {
            Ok(lock) => lock,
            // A directory without its lock file (a crash before it was made): nobody runs it.
            Err(_) => create_private_file(&lock_path).map_err(io(&lock_path))?,
        };
        // SAFETY: flock on a descriptor we own; released when `lock` is dropped.
        let r = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if r != 0 {
            tracing::info!("{} belongs to a restore in progress", dir.display());
            continue;
        }
        out.push((dir, lock));
    }
    Ok(out)
}

/// Removes temporary directories that earlier restores into this target left behind (they
/// crashed), skipping those whose restore still holds the lock.
pub(crate) fn remove_stale(target: &Target) -> Result<(), RestoreError> {
    for (dir, _lock) in leftovers(target)? {
        tracing::info!("removing {}, left by an interrupted restore", dir.display());
        fs::remove_dir_all(&dir).map_err(io(&dir))?;
    }
    Ok(())
}

/// Where a restore stages its store: a new temporary directory, or (resumable) one an earlier
/// run of the same restore left, with what it keeps.
pub(crate) struct Staging {
    pub temp: TempDir,
    /// The staging record (`super::resume`), for a resumable restore.
    pub record: Option<Record>,
    pub kept: Kept,
}

/// Opens the staging of a restore of `layout` into `target`. Without `resume`: removes what
/// earlier restores left and creates a new temporary directory. With `resume` (the identity
/// of this restore, and whether `--fresh` discards everything): continues the first leftover
/// whose record names the same identity (`super::resume`), discarding every other one and
/// naming it and why in the log; or creates a new one with its record.
pub(crate) fn open_staging(
    target: &Target,
    layout: &Layout,
    resume: Option<(&Identity, bool)>,
) -> Result<Staging, RestoreError> {
    let Some((identity, fresh)) = resume else {
        return Ok(Staging {
            temp: create_temp(target)?,
            record: None,
            kept: Kept::none(layout.objects()),
        });
    };
    fs::create_dir_all(&target.parent).map_err(io(&target.parent))?;
    let keys: Vec<&str> = layout.piece_keys().collect();
    let mut found = None;
    for (dir, lock) in leftovers(target)? {
        let why = match (fresh, &found) {
            (true, _) => "--fresh discards what earlier runs left".to_string(),
            (false, Some(_)) => "another staging directory of this restore is continued".into(),
            (false, None) => match private_problem(&dir)
                .map_or_else(|| Record::resume(&dir, identity, &keys), Err)
            {
                Ok((record, kept)) => {
                    let (bytes, objects) = kept.totals(layout.piece_lens());
                    tracing::info!(
                        "continuing the interrupted restore in {}: {objects} objects \
                         ({bytes} bytes) complete and checked are kept",
                        dir.display()
                    );
                    found = Some((dir, lock, record, kept));
                    continue;
                }
                Err(why) => why,
            },
        };
        tracing::info!(
            "discarding {}, left by an interrupted restore: {why} (this one restores {identity})",
            dir.display()
        );
        fs::remove_dir_all(&dir).map_err(io(&dir))?;
    }
    if let Some((path, lock, record, kept)) = found {
        let temp = TempDir {
            path,
            armed: true,
            _lock: lock,
        };
        return Ok(Staging {
            temp,
            record: Some(record),
            kept,
        });
    }
    let temp = create_temp(target)?;
    let record = Record::create(temp.path(), identity)?;
    Ok(Staging {
        temp,
        record: Some(record),
        kept: Kept::none(layout.objects()),
    })
}

/// Why the staging directory `dir` may hold what this user did not put there, if it may: it
/// must be this user's and writable by nobody else (its objects are kept on the word of its
/// record).
fn private_problem(dir: &Path) -> Option<String> {
    let meta = match fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) => return Some(format!("it cannot be read: {e}")),
    };
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if !meta.is_dir() || meta.uid() != me || meta.mode() & 0o022 != 0 {
        return Some(format!(
            "it is not a directory of this user's alone (owner {}, mode {:o})",
            meta.uid(),
            meta.mode() & 0o7777
        ));
    }
    None
}

/// Creates the temporary directory beside `target`: [`DIR_MODE`], or the target's permissions
/// if it exists (an empty directory someone made for it).
pub(crate) fn create_temp(target: &Target) -> Result<TempDir, RestoreError> {
    fs::create_dir_all(&target.parent).map_err(io(&target.parent))?;
    remove_stale(target)?;
    let path = target
        .parent
        .join(format!("{}{}", temp_prefix(&target.name), Uuid::new_v4()));
    create_private_dir(&path)?;
    let lock_path = path.join(LOCK_NAME);
    let lock = match create_private_file(&lock_path) {
        Ok(f) => f,
        Err(e) => {
            let _ = fs::remove_dir_all(&path);
            return Err(io(&lock_path)(e));
        }
    };
    // SAFETY: flock on a descriptor we own; a fresh file nobody else can hold yet.
    unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    let temp = TempDir {
        path,
        armed: true,
        _lock: lock,
    };
    if let Ok(meta) = fs::metadata(&target.path) {
        let mode = fs::Permissions::from_mode(meta.permissions().mode());
        fs::set_permissions(&temp.path, mode).map_err(io(&temp.path))?;
    }
    Ok(temp)
}

impl TempDir {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Leaves the directory (and what it holds) for the next run of the same restore to
    /// continue (`super::resume`).
    pub fn keep(mut self) {
        self.armed = false;
        tracing::warn!(
            "kept {} for the next run of this restore to continue (the same command; --fresh \
             starts over)",
            self.path.display()
        );
    }

    /// Renames the directory over the target (replacing it if it is an empty directory) and
    /// makes the rename durable.
    pub fn into_place(mut self, target: &Target) -> Result<(), RestoreError> {
        let lock = self.path.join(LOCK_NAME);
        fs::remove_file(&lock).map_err(io(&lock))?;
        super::resume::remove_record(&self.path)?;
        sync_dir(&self.path)?;
        match fs::rename(&self.path, &target.path) {
            Ok(()) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::DirectoryNotEmpty | ErrorKind::AlreadyExists
                ) =>
            {
                return Err(RestoreError::TargetNotEmpty {
                    path: target.path.clone(),
                });
            }
            Err(e) => return Err(io(&target.path)(e)),
        }
        self.armed = false;
        sync_dir(&target.parent)?;
        Ok(())
    }
}

/// The files of the restored store and the objects that fill them.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    /// Paths relative to the store directory.
    files: Vec<PathBuf>,
    pieces: Vec<Piece>,
    has_archives: bool,
    /// `(wal_id, number)` the restored `wal.bin` must carry; the id is `None` when `--at`
    /// makes an archive the live WAL.
    live_wal: (Option<Uuid>, u64),
    /// The generation keys of its sealed objects (`super::keys`), set before the download.
    pub keys: super::keys::RestoreKeys,
}

impl Layout {
    pub fn objects(&self) -> usize {
        self.pieces.len()
    }

    pub fn bytes(&self) -> u64 {
        self.pieces.iter().map(|p| p.len).sum()
    }

    /// Each object's stored length, in order.
    pub fn piece_lens(&self) -> impl Iterator<Item = u64> + '_ {
        self.pieces.iter().map(|p| p.len)
    }

    /// Each object's key, in order.
    pub fn piece_keys(&self) -> impl Iterator<Item = &str> {
        self.pieces.iter().map(|p| p.key.as_str())
    }

    /// Each object with its file, as words: what a staging record's identity digests
    /// (`super::resume`).
    pub fn describe(&self) -> impl Iterator<Item = (String, String)> + '_ {
        self.pieces.iter().map(|p| {
            let file = self.files[p.file].display().to_string();
            let codec = p
                .encoded
                .as_ref()
                .map(|e| format!("{e:?}"))
                .unwrap_or_default();
            let piece = format!("{} {} {:08x} {} {codec}", p.key, p.len, p.crc, p.offset);
            (file, piece)
        })
    }

    /// What the restore moves, for its prediction (`super::predict`); `cut`: whether an
    /// `--at` cut reads `wal.bin` again.
    pub fn shape(&self, cut: bool) -> super::predict::Shape {
        let mut s = super::predict::Shape {
            objects: self.pieces.len() as u64,
            ..Default::default()
        };
        for p in &self.pieces {
            s.stored_bytes += p.len;
            let plain = p.encoded.as_ref().map_or(p.len, |e| e.plain_len());
            s.plain_bytes += plain;
            if p.encoded.is_some() {
                s.plain_encoded_bytes += plain;
            }
            if cut && self.files[p.file] == Path::new(WAL_FILE) {
                s.plain_cut_bytes += plain;
            }
        }
        s
    }

    /// Each object's key and the plain bytes its entry states (`super::space`).
    pub fn claims(&self) -> impl Iterator<Item = (&str, u64)> {
        self.pieces.iter().map(|p| {
            let plain = p.encoded.as_ref().map_or(p.len, |e| e.plain_len());
            (p.key.as_str(), plain)
        })
    }
}

/// Why a side file's name cannot be restored as given, if it cannot: it must be a plain file
/// name, not hidden, and not one of the files the restore itself rebuilds or the engine owns.
pub fn side_file_name_problem(name: &str) -> Option<String> {
    const RESERVED: &[&str] = &[
        WAL_FILE,
        SNAPSHOT_FILE,
        ARCHIVE_DIR,
        INTENT_FILE,
        LOCK_FILE,
        POSITION_FILE,
        // Written by an adopting restore alone: one from the bucket would give a plain restore
        // a parent it does not have (the worker never ships it).
        PARENT_FILE,
        // The worker's own cache of what it shipped (`worker::journal`), never shipped.
        SHIPPED_FILE,
    ];
    if name.is_empty() || name.contains(['/', '\0']) || name.starts_with('.') {
        Some(format!("side file name {name:?} is not a plain file name"))
    } else if RESERVED.contains(&name) {
        Some(format!(
            "side file name {name:?} is reserved for the store's own files"
        ))
    } else {
        None
    }
}

/// Where each object of `plan` goes. With a cut at N, only the WAL files up to the one holding
/// frame N are downloaded: an archive holding N becomes `wal.bin` (later archives and segments
/// are not needed), otherwise segments after the one holding N are left out.
pub(crate) fn layout(plan: &Plan) -> Result<Layout, RestoreError> {
    let m = &plan.manifest;
    // A stored length no object has, or a total no restore plans, would size the plan of its
    // ranged GETs (one per 16 MiB): refused before anything is sized by it.
    let mut total: u64 = 0;
    for o in m.objects().chain(plan.extension.iter().map(|s| &s.object)) {
        let problem = crate::at_rest::bounds::stored_len_problem(o.len).or_else(|| {
            total = total.saturating_add(o.len);
            crate::at_rest::bounds::restore_total_problem(total)
        });
        if let Some(detail) = problem {
            return Err(RestoreError::BadObject {
                key: o.key.clone(),
                detail,
            });
        }
    }
    let mut files: Vec<PathBuf> = Vec::new();
    let mut pieces = Vec::new();
    let mut add = |rel: PathBuf, object: &ObjectEntry, offset: u64| {
        let file = match files.iter().position(|f| *f == rel) {
            Some(i) => i,
            None => {
                files.push(rel);
                files.len() - 1
            }
        };
        pieces.push(Piece {
            key: object.key.clone(),
            len: object.len,
            crc: object.crc,
            file,
            offset,
            encoded: object.is_encoded().then(|| object.clone()),
        });
    };
    if let Some(s) = &m.snapshot {
        add(SNAPSHOT_FILE.into(), &s.object, 0);
    }
    let mut floor = m.wal_floor;
    let mut live_wal = None;
    let mut has_archives = false;
    for a in &m.archives {
        let last = floor + a.frames;
        if plan.cut.is_some_and(|n| last >= n) {
            add(WAL_FILE.into(), &a.object, 0);
            live_wal = Some((None, a.number));
            break;
        }
        add(
            Path::new(ARCHIVE_DIR).join(archive_name(a.number)),
            &a.object,
            0,
        );
        has_archives = true;
        floor = last;
    }
    let live_wal = match live_wal {
        Some(w) => w,
        None => {
            let mut seq = floor;
            for (i, s) in m.segments.iter().chain(&plan.extension).enumerate() {
                if i > 0 && plan.cut.is_some_and(|n| seq >= n) {
                    break;
                }
                add(WAL_FILE.into(), &s.object, s.start);
                seq += s.frames;
            }
            (Some(m.wal_id), m.wal_number)
        }
    };
    let mut names = HashSet::new();
    for side in &m.side_files {
        if let Some(problem) = side_file_name_problem(&side.name) {
            return Err(RestoreError::BadObject {
                key: side.object.key.clone(),
                detail: problem,
            });
        }
        if !names.insert(side.name.as_str()) {
            return Err(RestoreError::BadObject {
                key: side.object.key.clone(),
                detail: format!("side file {:?} is listed twice", side.name),
            });
        }
        add(side.name.clone().into(), &side.object, 0);
    }
    Ok(Layout {
        files,
        pieces,
        has_archives,
        live_wal,
        keys: Default::default(),
    })
}

/// After the download (every file already fsynced): cuts the WAL for `--at` (fsyncing and
/// reading `wal.bin` back again), writes the adoption files, fsyncs the directories, and
/// checks how the files read
/// back fit together ([`chain`]): the store must report `plan.commit_seq` and the expected
/// `wal.bin`. With `engine_check`, a store the reference engine wrote is also read by the
/// engine, which must agree. Blocking.
pub(crate) fn finish(
    dir: &Path,
    downloaded: Downloaded,
    layout: &Layout,
    plan: &Plan,
    adopt: Option<(Uuid, &ParentRecord)>,
    engine_check: bool,
) -> Result<ReadBack, RestoreError> {
    let Downloaded { mut checks } = downloaded;
    let read_back_error = |detail| RestoreError::ReadBack {
        dir: dir.to_path_buf(),
        detail,
    };
    if let Some(n) = plan.cut {
        super::cut::cut_wal(dir, n)?;
        if let Some(i) = layout.files.iter().position(|f| f == Path::new(WAL_FILE)) {
            checks[i] = check_file(dir, Path::new(WAL_FILE)).map_err(read_back_error)?;
        }
    }
    if let Some((lineage, parent)) = adopt {
        write_file_durably(dir, LINEAGE_FILE, format!("{lineage}\n").as_bytes())?;
        let json = serde_json::to_vec(parent).map_err(|e| RestoreError::Io {
            path: dir.join(PARENT_FILE),
            source: std::io::Error::other(e),
        })?;
        write_file_durably(dir, PARENT_FILE, &json)?;
    }
    if layout.has_archives {
        sync_dir(&dir.join(ARCHIVE_DIR))?;
    }
    sync_dir(dir)?;
    let back =
        chain(layout.files.iter().map(PathBuf::as_path).zip(checks)).map_err(read_back_error)?;
    if engine_check && is_reference_engine_store(dir) {
        let image = crate::store::engine::read_store(dir).map_err(|e| RestoreError::ReadBack {
            dir: dir.to_path_buf(),
            detail: format!("the reference engine cannot read it: {e}"),
        })?;
        if image.commit_seq != plan.commit_seq {
            return Err(RestoreError::ReadBack {
                dir: dir.to_path_buf(),
                detail: format!(
                    "the reference engine reads commit {}, expected {}",
                    image.commit_seq, plan.commit_seq
                ),
            });
        }
    }
    let (want_id, want_number) = layout.live_wal;
    if back.commit_seq != plan.commit_seq
        || want_id.is_some_and(|id| id != back.wal_id)
        || back.wal_number != want_number
    {
        return Err(RestoreError::ReadBack {
            dir: dir.to_path_buf(),
            detail: format!(
                "the restored store reports commit {} in {WAL_FILE} {} number {}, expected \
                 commit {} in number {want_number}",
                back.commit_seq, back.wal_id, back.wal_number, plan.commit_seq
            ),
        });
    }
    Ok(back)
}
