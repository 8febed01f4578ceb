//! Reading what a new generation ships besides `wal.bin` from the store directory: the
//! snapshot, the archives the restore point needs, and the side files.
//!
//! Everything is read and checked before the generation is claimed (see [`super::generation`]),
//! so a store in flux or with a corrupt archive never costs a claim: the snapshot's header must
//! name the snapshot the look saw, the archives must chain (consecutive numbers, each one's
//! frames whole, CRC-valid and ending where the next WAL file starts), and the WAL must start at
//! or below the snapshot. A file that is gone before it is opened (a snapshot deleting covered
//! archives) makes the reading `None`: the step defers and looks again. Each file is opened
//! once; once open, it is read, checked and uploaded from that descriptor.
//!
//! Every file is opened through the worker's [`StoreDir`]: relative to the store directory
//! opened once, not following links, and only if it is a regular file. Side files are read
//! whole only below [`SIDE_FILE_CAP`]; a side file that is a link, a FIFO, a device or too
//! large fails the step with an error naming it, before anything of the generation is
//! claimed or uploaded.
//!
//! The costly part — reading every needed archive and checking each frame's CRC, and the
//! snapshot's CRC — runs on one thread per core (the reading happens while no upload is in
//! flight, so the cores are otherwise idle); the checks are then applied in archive order, so
//! the error reported is the first one in the chain, as a sequential reading would report it.
//!
//! Nothing read is kept: each thread reads archive after archive, a piece at a time, through
//! one small buffer of its own (`format::check_wal`), so checking a chain costs a few hundred
//! KiB per core however long the chain, and each byte is scanned and hashed while it is in the
//! cache. What a generation uploads is read again, from the same descriptor
//! ([`LocalArchive::file`], [`LocalSnapshot::file`]): a file renamed or deleted meanwhile (a
//! snapshot removing covered archives) still ships from the inode that was checked, and the
//! format never rewrites an archive or a snapshot in place (a new snapshot replaces the old one
//! by rename). A store that did is caught at the upload: each file goes up with the CRC of its
//! check as a condition of the write ([`crate::bucket::Body`]), so bytes that changed since are
//! refused and leave no object, and the manifest's CRC is always that of the object it names.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use bytes::Bytes;
use uuid::Uuid;

use super::WorkerError;
use crate::store::dir::{DirError, FileKind, SIDE_FILE_CAP, StoreDir};
use crate::store::disk::{self, DiskError, DiskState};
use crate::store::format::{
    CHECK_CHUNK, CheckError, SNAPSHOT_HEADER_LEN, SnapshotHeader, WAL_HEADER_LEN, WalCheck,
    WalHeader, check_wal,
};

/// The snapshot as read from its open descriptor.
pub(super) struct LocalSnapshot {
    pub file: Arc<std::fs::File>,
    pub header: SnapshotHeader,
    pub len: u64,
    pub crc: u32,
}

/// An archive as checked: its open descriptor (what is uploaded), length, frames and CRC.
pub(super) struct LocalArchive {
    pub number: u64,
    pub file: Arc<std::fs::File>,
    pub len: u64,
    pub frames: u64,
    pub crc: u32,
}

/// The snapshot and archives a generation ships (its side files are read apart:
/// [`read_side_files`]).
pub(super) struct LocalGeneration {
    pub snapshot: Option<LocalSnapshot>,
    pub archives: Vec<LocalArchive>,
    pub wal_floor: u64,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> WorkerError + '_ {
    move |source| WorkerError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn corrupt(path: &Path, detail: String) -> WorkerError {
    WorkerError::CorruptArchive {
        path: path.to_path_buf(),
        detail,
    }
}

/// A piece of the costly reading.
enum Work<'a> {
    /// The CRC of the whole open snapshot file.
    SnapshotCrc(&'a std::fs::File, &'a Path, u64),
    /// An archive, open since its header was read: read in pieces and checked.
    Archive(&'a std::fs::File, &'a Path),
}

enum Done {
    SnapshotCrc(u32),
    Archive(WalCheck),
}

impl Work<'_> {
    /// Does the work, reading through `buf` (reused from one piece of work to the next).
    fn run(&self, buf: &mut Vec<u8>) -> Result<Done, WorkerError> {
        match *self {
            Work::SnapshotCrc(file, path, len) => {
                let mut hasher = crc32fast::Hasher::new();
                buf.resize(buf.len().max(CHECK_CHUNK), 0);
                let mut at = 0;
                while at < len {
                    let n = crate::units::usize_of(len - at).min(buf.len());
                    file.read_exact_at(&mut buf[..n], at).map_err(io(path))?;
                    hasher.update(&buf[..n]);
                    at += n as u64;
                }
                Ok(Done::SnapshotCrc(hasher.finalize()))
            }
            // The header was read with `pread`: the descriptor still reads from the start.
            Work::Archive(file, path) => match check_wal(file, CHECK_CHUNK, buf) {
                Ok(check) => Ok(Done::Archive(check)),
                Err(CheckError::Io(e)) => Err(io(path)(e)),
                Err(CheckError::Format(e)) => Err(corrupt(path, e.to_string())),
            },
        }
    }
}

/// Runs `work` on up to one thread per core; the results in the order of `work`. Once
/// `cancel` is set, no further piece starts (the results are then short: the caller gives up).
fn run_parallel(work: &[Work<'_>], cancel: &AtomicBool) -> Vec<Result<Done, WorkerError>> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(work.len());
    if threads <= 1 {
        let mut buf = Vec::new();
        return work
            .iter()
            .take_while(|_| !cancel.load(Ordering::Relaxed))
            .map(|w| w.run(&mut buf))
            .collect();
    }
    let next = AtomicUsize::new(0);
    let mut done: Vec<(usize, Result<Done, WorkerError>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let (mut mine, mut buf) = (Vec::new(), Vec::new());
                    loop {
                        if cancel.load(Ordering::Relaxed) {
                            break mine;
                        }
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(w) = work.get(i) else { break mine };
                        mine.push((i, w.run(&mut buf)));
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| match h.join() {
                Ok(mine) => mine,
                Err(panic) => std::panic::resume_unwind(panic),
            })
            .collect()
    });
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, r)| r).collect()
}

/// Reads the generation's files besides `wal.bin` as `disk` saw them; `None` if they changed
/// meanwhile (the caller defers), or if `cancel` was set. Blocking.
pub(super) fn read_local(
    store: &StoreDir,
    disk: &DiskState,
    cancel: &AtomicBool,
) -> Result<Option<LocalGeneration>, WorkerError> {
    let dir = store.path();
    let snap_path = store.display_path(disk::SNAPSHOT_FILE);
    let snapshot_file = match &disk.snapshot {
        None => None,
        Some(s) => match OpenSnapshot::open(store, &snap_path, s.header.snapshot_id)? {
            None => return Ok(None),
            opened => opened,
        },
    };
    let snap_seq = snapshot_file.as_ref().map(|s| s.header.commit_seq);
    let Some(opened) = OpenArchives::open(store, disk)? else {
        return Ok(None);
    };
    let wal = disk.wal.header;
    let needed = opened.needed(snap_seq);

    let mut work: Vec<Work<'_>> = needed
        .iter()
        .map(|&i| Work::Archive(&opened.files[i], &disk.archives[i].path))
        .collect();
    if let Some(s) = &snapshot_file {
        work.push(Work::SnapshotCrc(&s.file, &snap_path, s.len));
    }
    let done = run_parallel(&work, cancel);
    if done.len() < work.len() {
        return Ok(None);
    }
    let mut done = done.into_iter();

    let archives = opened.check_chain(dir, disk, &needed, &mut done)?;
    let snapshot = match snapshot_file {
        None => None,
        Some(s) => Some(s.with_crc(&mut done)?),
    };
    if let Some(last) = archives.last()
        && last.number + 1 != wal.number
    {
        return Err(WorkerError::Store {
            dir: dir.to_path_buf(),
            detail: format!(
                "archives end at {} but wal.bin is number {}",
                last.number, wal.number
            ),
        });
    }
    let wal_floor = needed
        .first()
        .map_or(wal.floor, |&i| opened.headers[i].floor);
    check_wal_floor(dir, wal_floor, snap_seq)?;
    Ok(Some(LocalGeneration {
        snapshot,
        archives,
        wal_floor,
    }))
}

/// The snapshot file opened, its header read, before its CRC is computed.
struct OpenSnapshot {
    file: std::fs::File,
    header: SnapshotHeader,
    len: u64,
}

impl OpenSnapshot {
    /// Opens the snapshot and reads its header; `None` if it is gone or is no longer snapshot
    /// `snapshot_id` (the disk changed).
    fn open(
        store: &StoreDir,
        snap_path: &Path,
        snapshot_id: Uuid,
    ) -> Result<Option<OpenSnapshot>, WorkerError> {
        let Some(file) = store
            .open(disk::SNAPSHOT_FILE, FileKind::Store)
            .map_err(refused)?
        else {
            return Ok(None);
        };
        let mut head = [0u8; SNAPSHOT_HEADER_LEN];
        file.read_exact_at(&mut head, 0).map_err(io(snap_path))?;
        let header = SnapshotHeader::decode(&head).map_err(|e| WorkerError::Store {
            dir: store.path().to_path_buf(),
            detail: format!("{}: {e}", snap_path.display()),
        })?;
        if header.snapshot_id != snapshot_id {
            return Ok(None);
        }
        let len = file.metadata().map_err(io(snap_path))?.len();
        Ok(Some(OpenSnapshot { file, header, len }))
    }

    /// The snapshot with the CRC the last piece of work computed.
    fn with_crc(
        self,
        done: &mut impl Iterator<Item = Result<Done, WorkerError>>,
    ) -> Result<LocalSnapshot, WorkerError> {
        let crc = match done.next().expect("one result per piece of work")? {
            Done::SnapshotCrc(crc) => crc,
            Done::Archive(_) => unreachable!("the snapshot comes last"),
        };
        Ok(LocalSnapshot {
            file: Arc::new(self.file),
            header: self.header,
            len: self.len,
            crc,
        })
    }
}

/// Every archive on disk, opened once (the needed ones are then checked, and uploaded, from
/// here), with its header.
struct OpenArchives {
    headers: Vec<WalHeader>,
    files: Vec<Arc<std::fs::File>>,
    /// wal.bin's floor: the last archive's last commit.
    wal_floor: u64,
}

impl OpenArchives {
    /// Opens each archive `disk` saw and reads its header, which must carry its number;
    /// `None` if one is gone (the disk changed).
    fn open(store: &StoreDir, disk: &DiskState) -> Result<Option<OpenArchives>, WorkerError> {
        let mut headers = Vec::with_capacity(disk.archives.len());
        let mut files = Vec::with_capacity(disk.archives.len());
        for a in &disk.archives {
            let rel = format!("{}/{}", disk::ARCHIVE_DIR, disk::archive_name(a.number));
            let Some(f) = store.open(&rel, FileKind::Store).map_err(refused)? else {
                return Ok(None);
            };
            let mut head = [0u8; WAL_HEADER_LEN];
            f.read_exact_at(&mut head, 0)
                .map_err(|e| corrupt(&a.path, format!("cannot read its header: {e}")))?;
            let h = WalHeader::decode(&head).map_err(|e| corrupt(&a.path, e.to_string()))?;
            if h.number != a.number {
                return Err(corrupt(
                    &a.path,
                    format!("its header says number {}", h.number),
                ));
            }
            headers.push(h);
            files.push(Arc::new(f));
        }
        Ok(Some(OpenArchives {
            headers,
            files,
            wal_floor: disk.wal.header.floor,
        }))
    }

    /// Archive `i`'s last commit: archive `i + 1`'s floor (wal.bin's floor for the last one).
    fn next_floor(&self, i: usize) -> u64 {
        self.headers.get(i + 1).map_or(self.wal_floor, |h| h.floor)
    }

    /// The archives the restore point needs: those holding commits after the snapshot's (all,
    /// without a snapshot).
    fn needed(&self, snap_seq: Option<u64>) -> Vec<usize> {
        (0..self.headers.len())
            .filter(|&i| snap_seq.is_none_or(|s| self.next_floor(i) > s))
            .collect()
    }

    /// The needed archives with the checks `done` holds for them, in order: numbers without a
    /// gap, each floor the last commit of the one before, whole frames up to the next file's
    /// floor.
    fn check_chain(
        &self,
        dir: &Path,
        disk: &DiskState,
        needed: &[usize],
        done: &mut impl Iterator<Item = Result<Done, WorkerError>>,
    ) -> Result<Vec<LocalArchive>, WorkerError> {
        let mut archives = Vec::new();
        let mut expect_number = None;
        let mut expect_floor = None;
        for &i in needed {
            let a = &disk.archives[i];
            let h = self.headers[i];
            if expect_number.is_some_and(|n| n != h.number) {
                return Err(WorkerError::Store {
                    dir: dir.to_path_buf(),
                    detail: format!(
                        "archive {} missing before {}",
                        expect_number.unwrap_or(0),
                        a.path.display()
                    ),
                });
            }
            if expect_floor.is_some_and(|f| f != h.floor) {
                return Err(corrupt(
                    &a.path,
                    format!("floor {} does not follow the previous archive", h.floor),
                ));
            }
            let read = match done.next().expect("one result per piece of work")? {
                Done::Archive(read) => read,
                Done::SnapshotCrc(_) => unreachable!("archives come first"),
            };
            if let Some(stop) = read.stop {
                return Err(corrupt(
                    &a.path,
                    format!("{stop} at byte {} of {}", read.valid_len, read.len),
                ));
            }
            if read.last_seq != self.next_floor(i) {
                return Err(corrupt(
                    &a.path,
                    format!(
                        "ends at commit {} but the next WAL file starts after {}",
                        read.last_seq,
                        self.next_floor(i)
                    ),
                ));
            }
            archives.push(LocalArchive {
                number: h.number,
                file: self.files[i].clone(),
                len: read.len,
                crc: read.crc,
                frames: read.frames,
            });
            expect_number = Some(h.number + 1);
            expect_floor = Some(read.last_seq);
        }
        Ok(archives)
    }
}

/// The WAL the generation ships must reach back to the snapshot (or to commit 0 without one):
/// else archives are missing.
fn check_wal_floor(dir: &Path, wal_floor: u64, snap_seq: Option<u64>) -> Result<(), WorkerError> {
    match snap_seq {
        Some(s) if wal_floor > s => Err(WorkerError::Store {
            dir: dir.to_path_buf(),
            detail: format!(
                "the WAL starts after commit {wal_floor} but the snapshot holds only {s}: archives are missing"
            ),
        }),
        None if wal_floor != 0 => Err(WorkerError::Store {
            dir: dir.to_path_buf(),
            detail: format!(
                "no snapshot, and the WAL starts after commit {wal_floor}: archives are missing"
            ),
        }),
        _ => Ok(()),
    }
}

/// A file the store directory refused to hand out, as a step error.
fn refused(e: DirError) -> WorkerError {
    WorkerError::Disk(DiskError::Dir(e))
}

/// The side files in the store directory (`disk::SIDE_FILES`), with their CRCs. Read apart
/// from [`read_local`], when the generation starts: a [`Reading`] may run beside the resume
/// that writes `backup.lineage`, and must not decide whether the generation ships it.
/// Each must be a regular file (not followed) of at most [`SIDE_FILE_CAP`] bytes; any other
/// fails the step, naming the file, and nothing of the generation is uploaded. Blocking.
pub(super) fn read_side_files(store: &StoreDir) -> Result<Vec<(String, Bytes, u32)>, WorkerError> {
    let mut side_files = Vec::new();
    for name in disk::SIDE_FILES {
        if let Some(b) = store
            .read_capped(name, FileKind::Side, SIDE_FILE_CAP)
            .map_err(refused)?
        {
            let crc = crc32fast::hash(&b);
            side_files.push((name.to_string(), Bytes::from(b), crc));
        }
    }
    Ok(side_files)
}

/// A reading of the generation's files ([`read_local`]) on the blocking pool, stopped before
/// its next file when dropped.
///
/// [`super::generation::start`] starts one after its look, or takes the one
/// [`BackupWorker::run_once`](super::BackupWorker::run_once) started beside a resume (which
/// costs the prefix's round trips), so that a first backup does not wait for the two one after
/// the other. A reading serves only a step whose look agrees with the one it was started after:
/// it then lies between that look and the step's second look, as any reading must.
pub(super) struct Reading {
    disk: DiskState,
    dir: PathBuf,
    cancel: Arc<AtomicBool>,
    task: Option<tokio::task::JoinHandle<Result<Option<LocalGeneration>, WorkerError>>>,
}

impl Reading {
    /// Starts reading what `disk` (a look just made) names, on the blocking pool.
    pub(super) fn start(store: &StoreDir, disk: &DiskState) -> Reading {
        let cancel = Arc::new(AtomicBool::new(false));
        let (store, look, stop) = (store.clone(), disk.clone(), cancel.clone());
        let dir = store.path().to_path_buf();
        let task = tokio::task::spawn_blocking(move || read_local(&store, &look, &stop));
        Reading {
            disk: disk.clone(),
            dir,
            cancel,
            task: Some(task),
        }
    }

    /// Whether this reading can serve a step whose look was `disk`: the same files, and
    /// nothing changed between the two looks.
    pub(super) fn serves(&self, disk: &DiskState) -> bool {
        self.disk.unchanged_until(disk) && self.disk.archives == disk.archives
    }

    /// Waits for the reading.
    pub(super) async fn finish(mut self) -> Result<Option<LocalGeneration>, WorkerError> {
        let task = self.task.take().expect("finished once");
        task.await.map_err(|e| WorkerError::Store {
            dir: self.dir.clone(),
            detail: e.to_string(),
        })?
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
    }
}
