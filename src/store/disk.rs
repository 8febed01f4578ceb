//! [`DiskState`]: one look at a store directory, and the names of the store's files.
//!
//! The worker never trusts a single read of a directory another process writes. Every read of
//! store data is bracketed by two looks, and kept only if [`DiskState::unchanged_until`] holds
//! between them: neither `snapshot.bin` nor `wal.bin` was replaced (same id and inode), no
//! snapshot was in flight (`snapshot.intent` empty) at either look, and `wal.bin` did not
//! shrink. A WAL file only grows in place; snapshots and new WAL files arrive by rename, so an
//! open descriptor keeps reading the file it opened.
//!
//! A look reads only file metadata and the fixed-size headers of `snapshot.bin` and `wal.bin`.
//! It writes nothing. The backup side writes two files into a store directory:
//! `backup.lineage`, once ([`write_lineage`]), by write-temp-fsync-rename, and
//! [`SHIPPED_FILE`], the worker's journal of segments shipped since its newest restore point
//! (`worker::journal`, a cache: appended, emptied at each restore point, never shipped).
//!
//! Every look goes through a [`StoreDir`] ([`DiskState::look_in`]): it first re-checks that
//! the directory is still the one opened (and, in the service, inside its allowed root), then
//! reads every file relative to the opened directory, not following links, and refuses any
//! file that is not a regular file ([`super::dir`]). The small records (`backup.lineage`,
//! `backup.parent`) are read only below [`RECORD_CAP`].

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use uuid::Uuid;

use super::dir::{DirError, FileKind, RECORD_CAP, StoreDir};

use super::format::{
    FormatError, ParentRecord, SNAPSHOT_HEADER_LEN, SnapshotHeader, WAL_HEADER_LEN, WalHeader,
};

/// The live WAL.
pub const WAL_FILE: &str = "wal.bin";
/// The newest snapshot.
pub const SNAPSHOT_FILE: &str = "snapshot.bin";
/// Non-empty only while a snapshot is in flight.
pub const INTENT_FILE: &str = "snapshot.intent";
/// Closed WAL files, `archive/<number:020>.wal`.
pub const ARCHIVE_DIR: &str = "archive";
/// The engine's small metadata.
pub const META_FILE: &str = "store.meta";
/// Held (flock) by the engine while it has the store open.
pub const LOCK_FILE: &str = "store.lock";
/// The engine's last durable position.
pub const POSITION_FILE: &str = "wal.position";
/// The store's lineage id, written once by the first backup.
pub const LINEAGE_FILE: &str = "backup.lineage";
/// The restore point a store restored on boot came from.
pub const PARENT_FILE: &str = "backup.parent";
/// The worker's journal of the segments it shipped since its newest restore point.
pub const SHIPPED_FILE: &str = "backup.shipped";

/// The store's small files that travel with every restore point, when present.
pub const SIDE_FILES: &[&str] = &[META_FILE, LINEAGE_FILE];

/// The file name of archive `number`.
pub fn archive_name(number: u64) -> String {
    format!("{number:020}.wal")
}

/// The number of an archive file name, if it is one: exactly [`archive_name`]'s form, twenty
/// ASCII digits and `.wal` (`str::parse` alone would also take `+0000000000000000007.wal`, a
/// second file claiming archive 7).
pub fn parse_archive_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".wal")?;
    if digits.len() != 20 || !digits.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// What could not be looked at.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Format { path: PathBuf, source: FormatError },
    #[error("{path}: {detail}")]
    Invalid { path: PathBuf, detail: String },
    #[error("{dir}: not a store (no {WAL_FILE})")]
    NotAStore { dir: PathBuf },
    /// The directory or a file in it is not to be trusted (see [`super::dir`]).
    #[error(transparent)]
    Dir(#[from] DirError),
}

impl DiskError {
    /// The refusal, when the directory or a file in it is not to be trusted.
    pub fn refusal(&self) -> Option<&DirError> {
        match self {
            DiskError::Dir(e) if e.is_refusal() => Some(e),
            _ => None,
        }
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> DiskError + '_ {
    move |source| DiskError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// `snapshot.bin` as one look saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotState {
    pub header: SnapshotHeader,
    pub len: u64,
    pub inode: u64,
}

/// `wal.bin` as one look saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalState {
    pub header: WalHeader,
    pub len: u64,
    pub inode: u64,
}

/// One archive file as one look saw it (its header is read when it is shipped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveState {
    pub number: u64,
    pub len: u64,
    pub path: PathBuf,
}

/// One look at a store directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskState {
    pub dir: PathBuf,
    pub snapshot: Option<SnapshotState>,
    pub wal: WalState,
    /// `snapshot.intent` holds something: a snapshot is between writing and replacing wal.bin.
    pub intent: bool,
    /// Archives in ascending number.
    pub archives: Vec<ArchiveState>,
}

/// Reads up to `len` bytes from the start of the regular file `rel`, with its metadata; `None`
/// when absent.
fn read_header(
    store: &StoreDir,
    rel: &str,
    len: usize,
) -> Result<Option<(Vec<u8>, std::fs::Metadata)>, DiskError> {
    let Some(mut f) = store.open(rel, FileKind::Store)? else {
        return Ok(None);
    };
    let path = store.display_path(rel);
    let meta = f.metadata().map_err(io_err(&path))?;
    let mut buf = vec![0u8; len];
    let mut got = 0;
    while got < len {
        match f.read(&mut buf[got..]).map_err(io_err(&path))? {
            0 => break,
            n => got += n,
        }
    }
    buf.truncate(got);
    Ok(Some((buf, meta)))
}

/// Whether `name` is an archive's file name (`<number:020>.wal`), and its number.
impl DiskState {
    /// Looks at `dir` (blocking: call from the blocking pool): [`DiskState::look_in`] of a
    /// [`StoreDir`] with no allowed roots, opened for this look.
    pub fn look(dir: &Path) -> Result<DiskState, DiskError> {
        DiskState::look_in(&StoreDir::new(dir))
    }

    /// Looks at the store directory (blocking: call from the blocking pool), after
    /// [`StoreDir::check`]: a directory that left its root or was replaced is not looked at.
    pub fn look_in(store: &StoreDir) -> Result<DiskState, DiskError> {
        let dir = store.path();
        if !store.check()? {
            return Err(DiskError::NotAStore {
                dir: dir.to_path_buf(),
            });
        }
        let wal_path = store.display_path(WAL_FILE);
        let Some((buf, meta)) = read_header(store, WAL_FILE, WAL_HEADER_LEN)? else {
            return Err(DiskError::NotAStore {
                dir: dir.to_path_buf(),
            });
        };
        let header = WalHeader::decode(&buf).map_err(|source| DiskError::Format {
            path: wal_path.clone(),
            source,
        })?;
        let wal = WalState {
            header,
            len: meta.len(),
            inode: meta.ino(),
        };

        let snap_path = store.display_path(SNAPSHOT_FILE);
        let snapshot = match read_header(store, SNAPSHOT_FILE, SNAPSHOT_HEADER_LEN)? {
            None => None,
            Some((buf, meta)) => {
                let header = SnapshotHeader::decode(&buf).map_err(|source| DiskError::Format {
                    path: snap_path.clone(),
                    source,
                })?;
                if header.file_len() != meta.len() {
                    return Err(DiskError::Invalid {
                        path: snap_path,
                        detail: format!("{} bytes, header says {}", meta.len(), header.file_len()),
                    });
                }
                Some(SnapshotState {
                    header,
                    len: meta.len(),
                    inode: meta.ino(),
                })
            }
        };

        let intent = store
            .stat(INTENT_FILE, FileKind::Store)?
            .is_some_and(|m| m.len > 0);

        let archive_dir = dir.join(ARCHIVE_DIR);
        let mut archives: Vec<ArchiveState> = store
            .list(ARCHIVE_DIR, FileKind::Store, |name| {
                parse_archive_name(name).is_some()
            })?
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(name, st)| {
                Some(ArchiveState {
                    number: parse_archive_name(&name)?,
                    len: st.len,
                    path: archive_dir.join(name),
                })
            })
            .collect();
        archives.sort_by_key(|a| a.number);

        Ok(DiskState {
            dir: dir.to_path_buf(),
            snapshot,
            wal,
            intent,
            archives,
        })
    }

    /// [`DiskState::look_in`] on the blocking pool.
    pub async fn look_async(store: &StoreDir) -> Result<DiskState, DiskError> {
        let store = store.clone();
        tokio::task::spawn_blocking(move || DiskState::look_in(&store))
            .await
            .map_err(|e| DiskError::Invalid {
                path: PathBuf::new(),
                detail: format!("look task failed: {e}"),
            })?
    }

    /// The snapshot id, if there is a snapshot.
    pub fn snapshot_id(&self) -> Option<Uuid> {
        self.snapshot.map(|s| s.header.snapshot_id)
    }

    /// Whether a read made between `self` and `later` (a second look) saw one consistent
    /// state: the same snapshot and WAL files, no snapshot in flight, and a WAL that did not
    /// shrink.
    pub fn unchanged_until(&self, later: &DiskState) -> bool {
        let same_snapshot = match (&self.snapshot, &later.snapshot) {
            (None, None) => true,
            (Some(a), Some(b)) => {
                a.header.snapshot_id == b.header.snapshot_id && a.inode == b.inode
            }
            _ => false,
        };
        same_snapshot
            && !self.intent
            && !later.intent
            && self.wal.header.wal_id == later.wal.header.wal_id
            && self.wal.inode == later.wal.inode
            && later.wal.len >= self.wal.len
    }
}

/// The store's lineage, if it has one.
pub fn read_lineage(dir: &Path) -> Result<Option<Uuid>, DiskError> {
    read_lineage_in(&StoreDir::new(dir))
}

/// The store's lineage, if it has one (`backup.lineage`, a regular file of at most
/// [`RECORD_CAP`] bytes).
pub fn read_lineage_in(store: &StoreDir) -> Result<Option<Uuid>, DiskError> {
    let Some(bytes) = store.read_capped(LINEAGE_FILE, FileKind::Store, RECORD_CAP)? else {
        return Ok(None);
    };
    let invalid = |detail: String| DiskError::Invalid {
        path: store.display_path(LINEAGE_FILE),
        detail,
    };
    let text = String::from_utf8(bytes).map_err(|e| invalid(format!("not text: {e}")))?;
    Uuid::parse_str(text.trim())
        .map(Some)
        .map_err(|e| invalid(format!("not a lineage id: {e}")))
}

/// Writes `backup.lineage` (temp file, fsync, rename, fsync the directory), after checking
/// the directory ([`StoreDir::write_durably`]).
pub fn write_lineage(store: &StoreDir, lineage: Uuid) -> Result<(), DiskError> {
    Ok(store.write_durably(LINEAGE_FILE, format!("{lineage}\n").as_bytes())?)
}

/// Writes `backup.lineage` as [`write_lineage`] does unless the store has one already, and
/// returns the lineage the store has after. The workers of one store in one process (a primary
/// and its replica, each at its own destination) take turns here, so the first one's lineage
/// is the store's and the other reads it back rather than writing over it.
pub fn write_lineage_once(store: &StoreDir, lineage: Uuid) -> Result<Uuid, DiskError> {
    static WRITING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = WRITING.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(existing) = read_lineage_in(store)? {
        return Ok(existing);
    }
    write_lineage(store, lineage)?;
    Ok(lineage)
}

/// The parent record of a store restored on boot, if it has one.
pub fn read_parent(dir: &Path) -> Result<Option<ParentRecord>, DiskError> {
    read_parent_in(&StoreDir::new(dir))
}

/// The parent record (`backup.parent`, a regular file of at most [`RECORD_CAP`] bytes).
pub fn read_parent_in(store: &StoreDir) -> Result<Option<ParentRecord>, DiskError> {
    let Some(bytes) = store.read_capped(PARENT_FILE, FileKind::Store, RECORD_CAP)? else {
        return Ok(None);
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| DiskError::Invalid {
            path: store.display_path(PARENT_FILE),
            detail: format!("not a parent record: {e}"),
        })
}

/// Writes `name` in `dir` so that a crash leaves either the old file or the whole new one.
pub fn write_file_durably(dir: &Path, name: &str, data: &[u8]) -> Result<(), DiskError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = dir.join(format!(".{name}.tmp"));
    let path = dir.join(name);
    // The restoring user's alone (`0600`), as every file a restore writes.
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io_err(&tmp))?;
    f.write_all(data).map_err(io_err(&tmp))?;
    f.sync_all().map_err(io_err(&tmp))?;
    drop(f);
    std::fs::rename(&tmp, &path).map_err(io_err(&path))?;
    sync_dir(dir)
}

/// fsyncs a directory, so that renames and creations in it are durable.
pub fn sync_dir(dir: &Path) -> Result<(), DiskError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))
}

/// Whether some process holds `store.lock` (an engine has the store open).
pub fn lock_is_held(dir: &Path) -> Result<bool, DiskError> {
    lock_is_held_in(&StoreDir::new(dir))
}

/// Whether some process holds `store.lock` (a regular file, not followed).
pub fn lock_is_held_in(store: &StoreDir) -> Result<bool, DiskError> {
    use std::os::fd::AsRawFd;
    let Some(f) = store.open(LOCK_FILE, FileKind::Store)? else {
        return Ok(false);
    };
    // SAFETY: flock on a descriptor we own; released when `f` is dropped.
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
    if r == 0 {
        return Ok(false);
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(true)
    } else {
        Err(io_err(&store.display_path(LOCK_FILE))(err))
    }
}
