//! What a standby's directory holds, read with the format's own reader, and making it ready
//! to follow: the one place a standby looks at its directory as a whole.
//!
//! [`look`] reads the store (`restore::read_back`: snapshot CRCs, every frame of every WAL
//! file, archives chaining) and `wal.bin`'s valid length ([`LocalStore::wal_end`]). A torn tail
//! (an append a crash cut short) is not an error here, as for the format: everything before it
//! counts. [`trim_tail`] cuts `wal.bin` back to a length the bucket's segments start at, so
//! that appends continue the bytes of the generation's WAL exactly.
//!
//! Staged generations (`.<name>.standby-<uuid>` beside the directory, and the restore's own
//! temporary directories inside their names) are what a crash between two steps of a
//! generation change leaves; [`remove_stale`] deletes them before anything else is done.

use std::fs;
use std::io::{ErrorKind, Read};
use std::path::{Path, PathBuf};

use uuid::Uuid;

use super::StandbyError;
use crate::store::disk::{SNAPSHOT_FILE, WAL_FILE};
use crate::store::format::{CHECK_CHUNK, SNAPSHOT_HEADER_LEN, SnapshotHeader, check_wal};

/// A standby directory as the format's reader sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalStore {
    /// Commits the store holds.
    pub commit_seq: u64,
    pub snapshot_id: Option<Uuid>,
    pub wal_id: Uuid,
    /// Bytes of `wal.bin` that count: its header and its valid frames.
    pub wal_end: u64,
    /// Bytes of `wal.bin` on disk (more than `wal_end` after a torn append).
    pub wal_len: u64,
    /// The store's `backup.lineage`, if it has one.
    pub lineage: Option<Uuid>,
}

/// The error of a local file operation.
pub(crate) fn io(path: &Path) -> impl Fn(std::io::Error) -> StandbyError + '_ {
    move |source| StandbyError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Whether `dir` is missing or an empty directory: a standby then starts with a restore.
pub fn is_empty(dir: &Path) -> Result<bool, StandbyError> {
    match fs::read_dir(dir) {
        Ok(mut entries) => Ok(entries.next().is_none()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(true),
        Err(e) => Err(io(dir)(e)),
    }
}

/// Reads the store in `dir` (see the module docs).
pub fn look(dir: &Path) -> Result<LocalStore, StandbyError> {
    let read = crate::restore::read_back(dir).map_err(|detail| StandbyError::NotAStore {
        dir: dir.to_path_buf(),
        detail,
    })?;
    let wal = dir.join(WAL_FILE);
    let check = check_wal(
        fs::File::open(&wal).map_err(io(&wal))?,
        CHECK_CHUNK,
        &mut Vec::new(),
    )
    .map_err(|e| StandbyError::NotAStore {
        dir: dir.to_path_buf(),
        detail: format!("{WAL_FILE}: {e}"),
    })?;
    let snapshot_id = snapshot_id(dir)?;
    let lineage = crate::store::disk::read_lineage(dir).map_err(|e| StandbyError::NotAStore {
        dir: dir.to_path_buf(),
        detail: e.to_string(),
    })?;
    Ok(LocalStore {
        commit_seq: read.commit_seq,
        snapshot_id,
        wal_id: read.wal_id,
        wal_end: check.valid_len,
        wal_len: check.len,
        lineage,
    })
}

/// The id in `snapshot.bin`'s header (its CRCs were checked by [`look`]'s reading).
fn snapshot_id(dir: &Path) -> Result<Option<Uuid>, StandbyError> {
    let path = dir.join(SNAPSHOT_FILE);
    let mut f = match fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(&path)(e)),
    };
    let mut head = [0u8; SNAPSHOT_HEADER_LEN];
    f.read_exact(&mut head).map_err(io(&path))?;
    let header = SnapshotHeader::decode(&head).map_err(|e| StandbyError::NotAStore {
        dir: dir.to_path_buf(),
        detail: format!("{SNAPSHOT_FILE}: {e}"),
    })?;
    Ok(Some(header.snapshot_id))
}

/// Cuts `wal.bin` to `len` bytes (at or below its valid length, so only bytes of a torn
/// append or of a partly applied segment go) and fsyncs it.
pub fn trim_tail(dir: &Path, len: u64) -> Result<(), StandbyError> {
    let wal = dir.join(WAL_FILE);
    let f = fs::OpenOptions::new()
        .write(true)
        .open(&wal)
        .map_err(io(&wal))?;
    f.set_len(len).map_err(io(&wal))?;
    f.sync_all().map_err(io(&wal))
}

/// The name prefix of a directory staged beside `dir` for a new generation.
pub(crate) fn staged_prefix(dir: &Path) -> Result<String, StandbyError> {
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| StandbyError::NotAStore {
            dir: dir.to_path_buf(),
            detail: "a standby directory needs a UTF-8 name".into(),
        })?;
    Ok(format!(".{name}.standby-"))
}

/// A fresh path beside `dir` to stage a generation in.
pub(crate) fn staged_path(dir: &Path) -> Result<PathBuf, StandbyError> {
    let prefix = staged_prefix(dir)?;
    Ok(parent(dir).join(format!("{prefix}{}", Uuid::new_v4())))
}

/// The directory `dir` lies in.
pub(crate) fn parent(dir: &Path) -> &Path {
    match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Removes what a crash during a generation change left beside `dir` (see the module docs).
pub fn remove_stale(dir: &Path) -> Result<usize, StandbyError> {
    let prefix = staged_prefix(dir)?;
    // The restore into a staged path makes its own `.<staged name>.restore-<uuid>`.
    let restore_prefix = format!(".{prefix}");
    let parent = parent(dir);
    let entries = match fs::read_dir(parent) {
        Ok(e) => e,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io(parent)(e)),
    };
    let mut removed = 0;
    for entry in entries {
        let entry = entry.map_err(io(parent))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !(name.starts_with(&prefix) || name.starts_with(&restore_prefix)) {
            continue;
        }
        let path = entry.path();
        // Never follow a link someone put there: only real directories are ours.
        let meta = fs::symlink_metadata(&path).map_err(io(&path))?;
        if !meta.is_dir() {
            continue;
        }
        tracing::info!(
            "removing {} (left by an interrupted standby)",
            path.display()
        );
        fs::remove_dir_all(&path).map_err(io(&path))?;
        removed += 1;
    }
    if removed > 0 {
        crate::store::disk::sync_dir(parent).map_err(|e| StandbyError::NotAStore {
            dir: parent.to_path_buf(),
            detail: e.to_string(),
        })?;
    }
    Ok(removed)
}

/// Exchanges `a` and `b` (two directories) in one step: `renameat2(RENAME_EXCHANGE)`. Every
/// moment either holds one whole store; there is no instant without `b`.
pub(crate) fn exchange(a: &Path, b: &Path) -> Result<(), StandbyError> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| {
        CString::new(p.as_os_str().as_bytes()).map_err(|_| StandbyError::NotAStore {
            dir: p.to_path_buf(),
            detail: "a path with a NUL byte".into(),
        })
    };
    let (ca, cb) = (c(a)?, c(b)?);
    // SAFETY: two NUL-terminated paths that live across the call; no memory is shared.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        return Err(StandbyError::Exchange {
            staged: a.to_path_buf(),
            dir: b.to_path_buf(),
            source: e,
        });
    }
    Ok(())
}
