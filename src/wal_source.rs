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
//!   written since, so nothing new can need syncing).
//! - [`LocalSource`]: the file source while an engine holds `store.lock`, the offline source
//!   otherwise (the standalone `backup` command). It answers from its last read while the
//!   directory's [`DirWatch`] says nothing was written since.
//! - [`InProcessSource`]: a closure over an embedded engine's position handle.
//! - [`StreamedSource`] (in [`streamed`]): what database nodes report on `ReportPosition`
//!   streams, counted only as far as the store's files bear it out (`proof.rs`); the service's
//!   workers use it.
//!
//! [`WalSource::request_refresh`] is the worker's catch-up request, sent when the files on disk
//! show a snapshot or WAL the source has not reported; sources that read the disk themselves
//! ignore it.

use std::io::{ErrorKind, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use uuid::Uuid;

use crate::store::disk::{self, DiskState, POSITION_FILE, WAL_FILE};
use crate::store::format::{
    FormatError, POSITION_LEN, SnapshotHeader, WAL_HEADER_LEN, WalHeader, WalPosition, scan_frames,
};
use crate::store::watch::DirWatch;

mod proof;
pub mod streamed;

pub use streamed::{Closed, StreamAttachment, StreamedSource};

/// Why no position could be read.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Format { path: PathBuf, source: FormatError },
    #[error(transparent)]
    Disk(#[from] disk::DiskError),
    #[error("{0}")]
    Unavailable(String),
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

    /// A short name for health and logs.
    fn kind(&self) -> &'static str;
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SourceError + '_ {
    move |source| SourceError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Reads `wal.position`.
pub struct FileSource {
    dir: PathBuf,
}

impl FileSource {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    fn read(dir: &Path) -> Result<WalPosition, SourceError> {
        let path = dir.join(POSITION_FILE);
        let mut last = None;
        // The record is rewritten in place: a read racing a rewrite sees a bad CRC; read again.
        for _ in 0..20 {
            let bytes = std::fs::read(&path).map_err(io(&path))?;
            match WalPosition::decode(&bytes[..bytes.len().min(POSITION_LEN)]) {
                Ok(p) => return Ok(p),
                Err(e) => last = Some(e),
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        Err(SourceError::Format {
            path,
            source: last.expect("at least one attempt"),
        })
    }
}

#[async_trait::async_trait]
impl WalSource for FileSource {
    async fn durable_wal_position(&self) -> Result<WalPosition, SourceError> {
        let dir = self.dir.clone();
        blocking(move || FileSource::read(&dir)).await
    }

    fn kind(&self) -> &'static str {
        "file"
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
    dir: PathBuf,
    scanned: Arc<Mutex<Option<Scanned>>>,
}

impl OfflineSource {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            scanned: Arc::new(Mutex::new(None)),
        }
    }

    fn read(&self) -> Result<WalPosition, SourceError> {
        use std::os::unix::fs::MetadataExt;
        let path = self.dir.join(WAL_FILE);
        let stamp = |m: &std::fs::Metadata| {
            (
                m.ino(),
                m.len(),
                m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
            )
        };
        let snap_stamp = snapshot_stamp(&self.dir)?;
        // Fast path: nothing written to wal.bin or snapshot.bin since the last fsync and scan.
        if let Some(s) = *self.scanned.lock().expect("not poisoned") {
            let m = std::fs::metadata(&path).map_err(io(&path))?;
            if let Some(p) = s.position
                && stamp(&m) == (s.inode, s.file_len, s.mtime_ns)
                && snap_stamp == s.snapshot_stamp
            {
                return Ok(p);
            }
        }
        let mut f = std::fs::File::open(&path).map_err(io(&path))?;
        // Whatever is in the file now becomes durable: fsync it before trusting any of it.
        f.sync_all().map_err(io(&path))?;
        let meta = f.metadata().map_err(io(&path))?;
        let mut head = [0u8; WAL_HEADER_LEN];
        f.read_exact(&mut head).map_err(io(&path))?;
        let header = WalHeader::decode(&head).map_err(|source| SourceError::Format {
            path: path.clone(),
            source,
        })?;
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
        if at < meta.len() {
            f.seek(SeekFrom::Start(at)).map_err(io(&path))?;
            let mut rest = Vec::with_capacity((meta.len() - at) as usize);
            f.read_to_end(&mut rest).map_err(io(&path))?;
            let scan = scan_frames(&rest, last_seq + 1);
            at += scan.valid_len as u64;
            last_seq = scan.last_seq;
        }
        let snapshot_id = read_snapshot_id(&self.dir)?;
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

/// `snapshot.bin`'s (inode, mtime), or `None` when there is none.
fn snapshot_stamp(dir: &Path) -> Result<Option<(u64, i128)>, SourceError> {
    use std::os::unix::fs::MetadataExt;
    let path = dir.join(disk::SNAPSHOT_FILE);
    match std::fs::metadata(&path) {
        Ok(m) => Ok(Some((
            m.ino(),
            m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
        ))),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(&path)(e)),
    }
}

fn read_snapshot_id(dir: &Path) -> Result<Option<Uuid>, SourceError> {
    let path = dir.join(disk::SNAPSHOT_FILE);
    let mut f = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(&path)(e)),
    };
    let mut buf = [0u8; crate::store::format::SNAPSHOT_HEADER_LEN];
    f.read_exact(&mut buf).map_err(io(&path))?;
    let h = SnapshotHeader::decode(&buf).map_err(|source| SourceError::Format { path, source })?;
    Ok(Some(h.snapshot_id))
}

#[async_trait::async_trait]
impl WalSource for OfflineSource {
    async fn durable_wal_position(&self) -> Result<WalPosition, SourceError> {
        let me = self.clone();
        blocking(move || me.read()).await
    }

    fn kind(&self) -> &'static str {
        "offline"
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
    dir: PathBuf,
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
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        let dir = dir.into();
        Self {
            offline: OfflineSource::new(dir.clone()),
            watch: DirWatch::new(dir.clone()),
            last: Mutex::new(None),
            dir,
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
        let dir = self.dir.clone();
        let offline = self.offline.clone();
        let position = blocking(move || {
            if disk::lock_is_held(&dir)? {
                FileSource::read(&dir)
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

    fn kind(&self) -> &'static str {
        "local"
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

    fn kind(&self) -> &'static str {
        "in-process"
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
