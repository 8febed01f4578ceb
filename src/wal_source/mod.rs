//! [`WalSource`]: where the worker learns how much of the WAL is durable (DESIGN.md section 3).
//!
//! A source returns a [`WalPosition`]: which `snapshot.bin` and `wal.bin` the engine's state is
//! on, how many bytes of `wal.bin` are fsynced (always at a frame boundary) and how many
//! commits are durable. **No source ever reports bytes that are not fsynced**: a backup ahead
//! of its store would make the store look rewound after a crash.
//!
//! Sources here:
//! - [`FileSource`]: reads the `wal.position` record the engine rewrites after each group
//!   fsync (never ahead of what is durable). A torn read (bad CRC) is read again.
//! - [`OfflineSource`]: for a store whose `store.lock` nobody holds: fsyncs `wal.bin` itself
//!   (allowed on a read-only descriptor) and takes its valid frames as durable. It scans only
//!   the bytes added since its last call, and while `wal.bin` and `snapshot.bin` keep their
//!   inode, length and mtime since its last fsync it answers from that read (nothing was
//!   written since, so nothing new can need syncing). It reads [`OFFLINE_SCAN_CHUNK`] bytes at
//!   a time, so a huge or sparse `wal.bin` costs time, never memory.
//! - [`LocalSource`]: the file source while an engine holds `store.lock`, the offline source
//!   otherwise (the standalone `backup` command). It answers from its last read while the
//!   directory's [`DirWatch`] says nothing was written since.
//! - [`InProcessSource`]: a closure over an embedded engine's position handle.
//! - [`StreamedSource`] (in [`streamed`]): what database nodes report on `ReportPosition`
//!   streams, counted only as far as the store's files bear it out (`proof.rs`); the service's
//!   workers use it.
//!
//! Every source that reads the store directory reads it through a [`StoreDir`]: each read
//! re-checks the directory ([`StoreDir::check`]), and every file (`wal.position`, `wal.bin`,
//! `snapshot.bin`, `store.lock`) is opened relative to the directory opened once, not
//! following links, regular files only; `wal.position` is read only below [`RECORD_CAP`].
//!
//! [`WalSource::request_refresh`] is the worker's catch-up request, sent when the files on disk
//! show a snapshot or WAL the source has not reported; sources that read the disk themselves
//! ignore it.

use std::io::Read;
use std::path::Path;
use std::sync::{Arc, Mutex};

use uuid::Uuid;

use crate::store::dir::{DirError, FileKind, RECORD_CAP, StoreDir};
use crate::store::disk::{self, DiskError, DiskState, POSITION_FILE, WAL_FILE};
use crate::store::format::{
    FRAME_HEADER_LEN, POSITION_LEN, SnapshotHeader, TailStop, WAL_HEADER_LEN, WalHeader,
    WalPosition, scan_frames,
};
use crate::store::watch::DirWatch;

mod proof;
pub mod streamed;

pub use streamed::{AttachError, DEFAULT_MAX_STREAMS, StreamAttachment, StreamedSource};

/// Why no position could be read.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// A file could not be read or decoded, or the directory is not to be trusted.
    #[error(transparent)]
    Disk(#[from] disk::DiskError),
    #[error("{0}")]
    Unavailable(String),
}

impl From<DirError> for SourceError {
    fn from(e: DirError) -> Self {
        SourceError::Disk(disk::DiskError::Dir(e))
    }
}

/// Where the worker learns how much of the WAL is durable.
#[async_trait::async_trait]
pub trait WalSource: Send + Sync + 'static {
    /// The durable position. Takes no engine lock.
    async fn durable_wal_position(&self) -> Result<WalPosition, SourceError>;

    /// Asks the engine to catch up with files on disk it has not reported (a new snapshot or
    /// WAL written by another process). The default does nothing.
    fn request_refresh(&self) {}

    /// Why the source's reports cannot be trusted now, if they cannot: health is unhealthy
    /// with this reason while it holds. The default: never.
    fn problem(&self) -> Option<String> {
        None
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SourceError + '_ {
    move |source| {
        SourceError::Disk(DiskError::Io {
            path: path.to_path_buf(),
            source,
        })
    }
}

/// Reads `wal.position`.
pub struct FileSource {
    store: StoreDir,
}

impl FileSource {
    pub fn new(dir: impl Into<StoreDir>) -> Self {
        Self { store: dir.into() }
    }

    /// Reads the record: a regular file (not followed) of at most [`RECORD_CAP`] bytes.
    fn read(store: &StoreDir) -> Result<WalPosition, SourceError> {
        let path = store.display_path(POSITION_FILE);
        let mut last = None;
        // The record is rewritten in place: a read racing a rewrite sees a bad CRC; read again.
        for _ in 0..20 {
            let bytes = store
                .read_capped(POSITION_FILE, FileKind::Store, RECORD_CAP)?
                .ok_or_else(|| DiskError::Io {
                    path: path.clone(),
                    source: std::io::ErrorKind::NotFound.into(),
                })?;
            match WalPosition::decode(&bytes[..bytes.len().min(POSITION_LEN)]) {
                Ok(p) => return Ok(p),
                Err(e) => last = Some(e),
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        Err(DiskError::Format {
            path,
            source: last.expect("at least one attempt"),
        }
        .into())
    }
}

#[async_trait::async_trait]
impl WalSource for FileSource {
    async fn durable_wal_position(&self) -> Result<WalPosition, SourceError> {
        let store = self.store.clone();
        blocking(move || {
            store.check()?;
            FileSource::read(&store)
        })
        .await
    }
}

/// What the offline source learnt from its last scan of one `wal.bin`.
#[derive(Debug, Clone, Copy)]
struct Scanned {
    wal_id: Uuid,
    inode: u64,
    valid_len: u64,
    last_seq: u64,
    /// The file's length and mtime when it was last fsynced and scanned: while both are
    /// unchanged nothing was written since, so the position stands without another fsync.
    file_len: u64,
    mtime_ns: i128,
    position: Option<WalPosition>,
    /// `snapshot.bin`'s (inode, mtime) when its id was read.
    snapshot_stamp: Option<(u64, i128)>,
}

/// Reads the store itself, for a store nobody has open. Clones share what was scanned.
#[derive(Clone)]
pub struct OfflineSource {
    store: StoreDir,
    scanned: Arc<Mutex<Option<Scanned>>>,
}

impl OfflineSource {
    pub fn new(dir: impl Into<StoreDir>) -> Self {
        Self {
            store: dir.into(),
            scanned: Arc::new(Mutex::new(None)),
        }
    }

    fn read(&self) -> Result<WalPosition, SourceError> {
        use std::os::unix::fs::MetadataExt;
        let store = &self.store;
        let path = store.display_path(WAL_FILE);
        let missing = || DiskError::Io {
            path: path.clone(),
            source: std::io::ErrorKind::NotFound.into(),
        };
        let stamp = |m: &std::fs::Metadata| {
            (
                m.ino(),
                m.len(),
                m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
            )
        };
        let snap_stamp = snapshot_stamp(store)?;
        // Fast path: nothing written to wal.bin or snapshot.bin since the last fsync and scan.
        if let Some(s) = *self.scanned.lock().expect("not poisoned") {
            let m = store.stat(WAL_FILE, FileKind::Store)?.ok_or_else(missing)?;
            if let Some(p) = s.position
                && (m.ino, m.len, m.mtime_ns) == (s.inode, s.file_len, s.mtime_ns)
                && snap_stamp == s.snapshot_stamp
            {
                return Ok(p);
            }
        }
        let mut f = store.open(WAL_FILE, FileKind::Store)?.ok_or_else(missing)?;
        // Whatever is in the file now becomes durable: fsync it before trusting any of it.
        f.sync_all().map_err(io(&path))?;
        let (meta, header) = read_wal_header(&mut f, &path)?;
        let prev = *self.scanned.lock().expect("not poisoned");
        let (mut at, mut last_seq) = match prev {
            Some(s)
                if s.wal_id == header.wal_id
                    && s.inode == meta.ino()
                    && s.valid_len <= meta.len() =>
            {
                (s.valid_len, s.last_seq)
            }
            _ => (WAL_HEADER_LEN as u64, header.floor),
        };
        (at, last_seq) = scan_tail(&f, &path, meta.len(), at, last_seq)?;
        let snapshot_id = read_snapshot_id(store)?;
        let position = WalPosition {
            snapshot_id,
            wal_id: header.wal_id,
            wal_number: header.number,
            durable_len: at,
            commit_seq: last_seq,
        };
        let (inode, file_len, mtime_ns) = stamp(&meta);
        *self.scanned.lock().expect("not poisoned") = Some(Scanned {
            wal_id: header.wal_id,
            inode,
            valid_len: at,
            last_seq,
            file_len,
            mtime_ns,
            position: Some(position),
            snapshot_stamp: snap_stamp,
        });
        Ok(position)
    }
}

/// Bytes of `wal.bin` the offline source reads and scans at a time (more only to hold one
/// frame, at most `MAX_FRAME_PAYLOAD`): a huge (or sparse) `wal.bin` costs time, not memory.
pub const OFFLINE_SCAN_CHUNK: usize = 8 << 20;

/// Scans the valid frames of `f` (of `file_len` bytes) from offset `at`, the first carrying
/// `last_seq + 1`, a chunk at a time; returns the offset after the last valid frame and its
/// seq.
fn scan_tail(
    f: &std::fs::File,
    path: &Path,
    file_len: u64,
    mut at: u64,
    mut last_seq: u64,
) -> Result<(u64, u64), SourceError> {
    use std::os::unix::fs::FileExt;
    let mut buf = Vec::new();
    let mut want = OFFLINE_SCAN_CHUNK;
    while at < file_len {
        let left = usize::try_from(file_len - at).unwrap_or(usize::MAX);
        let len = want.min(left);
        buf.resize(len, 0);
        let mut got = 0;
        while got < len {
            match f.read_at(&mut buf[got..], at + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io(path)(e)),
            }
        }
        let scan = scan_frames(&buf[..got], last_seq + 1);
        at += scan.valid_len as u64;
        last_seq = scan.last_seq;
        want = OFFLINE_SCAN_CHUNK;
        match scan.stop {
            // Every byte read was whole frames: read on.
            None if got == len => {}
            // A frame cut by the chunk's end: read on from it, all of it at least.
            Some(TailStop::Short) if got == len && len < left => {
                let rest = &buf[scan.valid_len..got];
                if rest.len() >= FRAME_HEADER_LEN {
                    let frame_len = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes"));
                    want = want.max(FRAME_HEADER_LEN + frame_len as usize);
                }
            }
            // The end of the file (or of what is valid).
            _ => break,
        }
    }
    Ok((at, last_seq))
}

/// `snapshot.bin`'s (inode, mtime), or `None` when there is none.
/// `wal.bin`'s metadata and header, read from the start of `f` (opened at `path`).
fn read_wal_header(
    f: &mut std::fs::File,
    path: &Path,
) -> Result<(std::fs::Metadata, WalHeader), SourceError> {
    let meta = f.metadata().map_err(io(path))?;
    let mut head = [0u8; WAL_HEADER_LEN];
    f.read_exact(&mut head).map_err(io(path))?;
    let header = WalHeader::decode(&head).map_err(|source| DiskError::Format {
        path: path.to_path_buf(),
        source,
    })?;
    Ok((meta, header))
}

fn snapshot_stamp(store: &StoreDir) -> Result<Option<(u64, i128)>, SourceError> {
    Ok(store
        .stat(disk::SNAPSHOT_FILE, FileKind::Store)?
        .map(|m| (m.ino, m.mtime_ns)))
}

fn read_snapshot_id(store: &StoreDir) -> Result<Option<Uuid>, SourceError> {
    let path = store.display_path(disk::SNAPSHOT_FILE);
    let Some(mut f) = store.open(disk::SNAPSHOT_FILE, FileKind::Store)? else {
        return Ok(None);
    };
    let mut buf = [0u8; crate::store::format::SNAPSHOT_HEADER_LEN];
    f.read_exact(&mut buf).map_err(io(&path))?;
    let h = SnapshotHeader::decode(&buf).map_err(|source| DiskError::Format { path, source })?;
    Ok(Some(h.snapshot_id))
}

#[async_trait::async_trait]
impl WalSource for OfflineSource {
    async fn durable_wal_position(&self) -> Result<WalPosition, SourceError> {
        let me = self.clone();
        blocking(move || {
            me.store.check()?;
            me.read()
        })
        .await
    }
}

/// The file source while an engine holds `store.lock`, the offline source otherwise.
///
/// It answers from its last read, without touching the disk, while the store directory's
/// [`DirWatch`] stamp is the one taken before that read and the read is younger than
/// [`DirWatch::trust`]: nothing in the directory was written since, so a new read would find the
/// same position (or, were the lock's holder to change without writing anything, a position no
/// further on). An idle store so costs one non-blocking `read` of the process's inotify queue.
pub struct LocalSource {
    store: StoreDir,
    offline: OfflineSource,
    watch: DirWatch,
    last: Mutex<Option<LastRead>>,
}

/// A read of [`LocalSource`] and the stamp taken before it.
#[derive(Clone, Copy)]
struct LastRead {
    stamp: u64,
    at: tokio::time::Instant,
    position: WalPosition,
}

impl LocalSource {
    pub fn new(dir: impl Into<StoreDir>) -> Self {
        let store: StoreDir = dir.into();
        Self {
            offline: OfflineSource::new(store.clone()),
            watch: DirWatch::new(store.path()),
            last: Mutex::new(None),
            store,
        }
    }
}

#[async_trait::async_trait]
impl WalSource for LocalSource {
    async fn durable_wal_position(&self) -> Result<WalPosition, SourceError> {
        let stamp = self.watch.stamp();
        let last = *self.last.lock().expect("not poisoned");
        if let (Some(stamp), Some(last)) = (stamp, last)
            && last.stamp == stamp
            && last.at.elapsed() < self.watch.trust()
        {
            return Ok(last.position);
        }
        let at = tokio::time::Instant::now();
        let store = self.store.clone();
        let offline = self.offline.clone();
        let position = blocking(move || {
            // Every read re-checks the directory (see `crate::store::dir`).
            store.check()?;
            if disk::lock_is_held_in(&store)? {
                FileSource::read(&store)
            } else {
                offline.read()
            }
        })
        .await?;
        *self.last.lock().expect("not poisoned") = stamp.map(|stamp| LastRead {
            stamp,
            at,
            position,
        });
        Ok(position)
    }
}

/// A position read from an embedded engine.
pub struct InProcessSource {
    read: Arc<dyn Fn() -> WalPosition + Send + Sync>,
}

impl InProcessSource {
    pub fn new(read: impl Fn() -> WalPosition + Send + Sync + 'static) -> Self {
        Self {
            read: Arc::new(read),
        }
    }
}

#[async_trait::async_trait]
impl WalSource for InProcessSource {
    async fn durable_wal_position(&self) -> Result<WalPosition, SourceError> {
        Ok((self.read)())
    }
}

/// Whether a position names the snapshot and WAL file a look saw on disk.
pub fn names_disk(pos: &WalPosition, disk: &DiskState) -> bool {
    pos.snapshot_id == disk.snapshot_id() && pos.wal_id == disk.wal.header.wal_id
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, SourceError> + Send + 'static,
) -> Result<T, SourceError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| SourceError::Unavailable(format!("position read task failed: {e}")))?
}
