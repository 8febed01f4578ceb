//! Starting a generation: claim its number, then upload the snapshot, the archives the restore
//! point needs and the side files, reusing what the prefix already holds.
//!
//! A generation starts whenever the snapshot or the WAL file on disk changes. Its GENERATION
//! object is written with `If-None-Match: *` before anything else of it, so two writers cannot
//! both own one number. The local files are read (and the archive chain checked) before the
//! claim, bracketed by two looks; a crash after the claim leaves a claimed generation with some
//! objects and no manifest, which retention removes after its grace period.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use uuid::Uuid;

use super::view::Generation;
use super::{BackupCounters, BackupWorker, DeferReason, StepOutcome, WorkerError};
use crate::bucket::{self, Body, BucketError, Created, DynBucket, PutCondition};
use crate::manifest::{
    self, ArchiveEntry, GenerationClaim, ObjectEntry, SideFileEntry, SnapshotEntry,
};
use crate::store::disk::{self, DiskState};
use crate::store::format::{SnapshotHeader, WAL_HEADER_LEN, WalHeader, WalPosition, scan_wal};

/// The snapshot as read from its open descriptor.
struct LocalSnapshot {
    file: Arc<std::fs::File>,
    header: SnapshotHeader,
    len: u64,
    crc: u32,
}

struct LocalArchive {
    number: u64,
    bytes: Bytes,
    frames: u64,
    crc: u32,
}

/// Everything of the store a generation ships besides `wal.bin`.
struct LocalGeneration {
    snapshot: Option<LocalSnapshot>,
    archives: Vec<LocalArchive>,
    side_files: Vec<(String, Bytes, u32)>,
    wal_floor: u64,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> WorkerError + '_ {
    move |source| WorkerError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn read_local(dir: &Path, disk: &DiskState) -> Result<Option<LocalGeneration>, WorkerError> {
    let snapshot = match &disk.snapshot {
        None => None,
        Some(s) => {
            let path = dir.join(disk::SNAPSHOT_FILE);
            let file = std::fs::File::open(&path).map_err(io(&path))?;
            let mut head = [0u8; crate::store::format::SNAPSHOT_HEADER_LEN];
            file.read_exact_at(&mut head, 0).map_err(io(&path))?;
            let header = SnapshotHeader::decode(&head).map_err(|e| WorkerError::Store {
                dir: dir.to_path_buf(),
                detail: format!("{}: {e}", path.display()),
            })?;
            if header.snapshot_id != s.header.snapshot_id {
                return Ok(None);
            }
            let len = file.metadata().map_err(io(&path))?.len();
            let mut hasher = crc32fast::Hasher::new();
            let mut buf = vec![0u8; 1 << 20];
            let mut at = 0;
            while at < len {
                let n = ((len - at) as usize).min(buf.len());
                file.read_exact_at(&mut buf[..n], at).map_err(io(&path))?;
                hasher.update(&buf[..n]);
                at += n as u64;
            }
            Some(LocalSnapshot {
                file: Arc::new(file),
                header,
                len,
                crc: hasher.finalize(),
            })
        }
    };
    let snap_seq = snapshot.as_ref().map(|s| s.header.commit_seq);

    // Archive k's last commit is archive k+1's floor (wal.bin's floor for the last one).
    let mut headers = Vec::with_capacity(disk.archives.len());
    for a in &disk.archives {
        let f = match std::fs::File::open(&a.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(&a.path)(e)),
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
    }
    let wal = disk.wal.header;
    let mut needed = Vec::new();
    for i in 0..disk.archives.len() {
        let next_floor = headers.get(i + 1).map_or(wal.floor, |h| h.floor);
        if snap_seq.is_none_or(|s| next_floor > s) {
            needed.push(i);
        }
    }
    let mut archives = Vec::new();
    let mut expect_number = None;
    let mut expect_floor = None;
    for &i in &needed {
        let a = &disk.archives[i];
        let h = headers[i];
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
        let bytes = match std::fs::read(&a.path) {
            Ok(b) => Bytes::from(b),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(&a.path)(e)),
        };
        let scan = scan_wal(&bytes).map_err(|e| corrupt(&a.path, e.to_string()))?;
        if let Some(stop) = scan.stop {
            return Err(corrupt(
                &a.path,
                format!("{stop} at byte {} of {}", scan.valid_len, bytes.len()),
            ));
        }
        let next_floor = headers.get(i + 1).map_or(wal.floor, |h| h.floor);
        if scan.last_seq != next_floor {
            return Err(corrupt(
                &a.path,
                format!(
                    "ends at commit {} but the next WAL file starts after {next_floor}",
                    scan.last_seq
                ),
            ));
        }
        archives.push(LocalArchive {
            number: h.number,
            crc: crc32fast::hash(&bytes),
            frames: scan.frames.len() as u64,
            bytes,
        });
        expect_number = Some(h.number + 1);
        expect_floor = Some(scan.last_seq);
    }
    if let Some(n) = expect_number
        && n != wal.number
    {
        return Err(WorkerError::Store {
            dir: dir.to_path_buf(),
            detail: format!(
                "archives end at {} but wal.bin is number {}",
                n - 1,
                wal.number
            ),
        });
    }
    let wal_floor = needed.first().map_or(wal.floor, |&i| headers[i].floor);
    match snap_seq {
        Some(s) if wal_floor > s => {
            return Err(WorkerError::Store {
                dir: dir.to_path_buf(),
                detail: format!(
                    "the WAL starts after commit {wal_floor} but the snapshot holds only {s}: archives are missing"
                ),
            });
        }
        None if wal_floor != 0 => {
            return Err(WorkerError::Store {
                dir: dir.to_path_buf(),
                detail: format!(
                    "no snapshot, and the WAL starts after commit {wal_floor}: archives are missing"
                ),
            });
        }
        _ => {}
    }

    let mut side_files = Vec::new();
    for name in disk::SIDE_FILES {
        let path = dir.join(name);
        match std::fs::read(&path) {
            Ok(b) => {
                let crc = crc32fast::hash(&b);
                side_files.push((name.to_string(), Bytes::from(b), crc));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(&path)(e)),
        }
    }
    Ok(Some(LocalGeneration {
        snapshot,
        archives,
        side_files,
        wal_floor,
    }))
}

fn corrupt(path: &Path, detail: String) -> WorkerError {
    WorkerError::CorruptArchive {
        path: path.to_path_buf(),
        detail,
    }
}

/// Uploads a write-once object; an object already there with other content means another
/// writer owns this generation.
pub(super) async fn upload(
    bucket: &DynBucket,
    key: &str,
    body: Body,
    cond: &PutCondition,
    check_absent_first: bool,
) -> Result<Created, WorkerError> {
    if check_absent_first
        && *cond != PutCondition::None
        && let Some(meta) = bucket.head(key).await?
        && meta.len != body.len()
    {
        return Err(WorkerError::ConcurrentWriter { key: key.into() });
    }
    match bucket::put_immutable(bucket.as_ref(), key, body, cond).await {
        Ok(c) => Ok(c),
        Err(BucketError::PreconditionFailed { .. }) => {
            Err(WorkerError::ConcurrentWriter { key: key.into() })
        }
        Err(e) => Err(e.into()),
    }
}

fn entry(key: String, len: u64, crc: u32, lineage: Uuid, generation: u64) -> ObjectEntry {
    ObjectEntry {
        key,
        len,
        crc,
        lineage,
        generation,
    }
}

/// Claims generation `max + 1` for the files on disk and uploads what it needs.
#[tracing::instrument(name = "backup.generation", skip_all, fields(generation = tracing::field::Empty))]
pub(super) async fn start(
    w: &mut BackupWorker,
    disk: &DiskState,
    pos: &WalPosition,
) -> Result<StepOutcome, WorkerError> {
    let dir: PathBuf = w.dir.clone();
    let look = disk.clone();
    let local = tokio::task::spawn_blocking(move || read_local(&dir, &look))
        .await
        .map_err(|e| WorkerError::Store {
            dir: w.dir.clone(),
            detail: e.to_string(),
        })??;
    let Some(local) = local else {
        return Ok(StepOutcome::Deferred(DeferReason::Changed));
    };
    let after = DiskState::look_async(&w.dir).await?;
    if !disk.unchanged_until(&after) {
        return Ok(StepOutcome::Deferred(DeferReason::Changed));
    }

    let cond = w.cond_create();
    let bucket = w.bucket.clone();
    let counters = w.counters.clone();
    let view = w.view.as_mut().expect("resumed");
    let lineage = view.lineage;
    let number = view.max_generation + 1;
    tracing::Span::current().record("generation", number);
    let claim = GenerationClaim {
        lineage,
        generation: number,
        snapshot_id: pos.snapshot_id,
        wal_id: pos.wal_id,
        wal_number: disk.wal.header.number,
        created_at: manifest::now_rfc3339(),
    };
    upload(
        &bucket,
        &manifest::generation_key(number),
        Body::from(claim.encode()),
        &cond,
        false,
    )
    .await?;
    view.max_generation = number;
    view.claims.insert(number, Some(claim));

    // What this lineage already holds, newest first: the generation being replaced, then the
    // newest manifest.
    let known_snapshot = view
        .current
        .iter()
        .filter_map(|g| g.snapshot.clone())
        .chain(view.newest_own.iter().filter_map(|m| m.snapshot.clone()))
        .collect::<Vec<_>>();
    let known_archives: Vec<ArchiveEntry> = view
        .current
        .iter()
        .flat_map(|g| g.archives.clone())
        .chain(view.newest_own.iter().flat_map(|m| m.archives.clone()))
        .collect();
    let known_side: Vec<SideFileEntry> = view
        .current
        .iter()
        .flat_map(|g| g.side_files.clone())
        .chain(view.newest_own.iter().flat_map(|m| m.side_files.clone()))
        .collect();

    let (mut uploaded, mut reused, mut bytes) = (0u64, 0u64, 0u64);
    let snapshot = match &local.snapshot {
        None => None,
        Some(s) => {
            let reuse = known_snapshot.iter().find(|k| {
                k.snapshot_id == s.header.snapshot_id
                    && k.object.len == s.len
                    && k.object.crc == s.crc
            });
            Some(match reuse {
                Some(k) => {
                    reused += 1;
                    k.clone()
                }
                None => {
                    let key = manifest::snapshot_key(number);
                    let body = Body::File {
                        file: s.file.clone(),
                        offset: 0,
                        len: s.len,
                    };
                    upload(&bucket, &key, body, &cond, true).await?;
                    uploaded += 1;
                    bytes += s.len;
                    SnapshotEntry {
                        object: entry(key, s.len, s.crc, lineage, number),
                        snapshot_id: s.header.snapshot_id,
                        commit_seq: s.header.commit_seq,
                    }
                }
            })
        }
    };
    let mut archives = Vec::new();
    for a in &local.archives {
        let reuse = known_archives.iter().find(|k| {
            k.number == a.number && k.object.len == a.bytes.len() as u64 && k.object.crc == a.crc
        });
        archives.push(match reuse {
            Some(k) => {
                reused += 1;
                k.clone()
            }
            None => {
                let key = manifest::archive_key(number, a.number);
                upload(&bucket, &key, Body::Bytes(a.bytes.clone()), &cond, true).await?;
                uploaded += 1;
                bytes += a.bytes.len() as u64;
                ArchiveEntry {
                    object: entry(key, a.bytes.len() as u64, a.crc, lineage, number),
                    number: a.number,
                    frames: a.frames,
                }
            }
        });
    }
    let mut side_files = Vec::new();
    for (name, data, crc) in &local.side_files {
        let reuse = known_side
            .iter()
            .find(|k| &k.name == name && k.object.len == data.len() as u64 && k.object.crc == *crc);
        side_files.push(match reuse {
            Some(k) => {
                reused += 1;
                k.clone()
            }
            None => {
                let key = manifest::side_key(number, name, *crc);
                upload(&bucket, &key, Body::Bytes(data.clone()), &cond, false).await?;
                uploaded += 1;
                bytes += data.len() as u64;
                SideFileEntry {
                    object: entry(key, data.len() as u64, *crc, lineage, number),
                    name: name.clone(),
                }
            }
        });
    }

    // The same wal.bin as the generation being replaced (a snapshot that kept its WAL): its
    // shipped segments stay valid, and the manifest names them.
    let (segments, shipped_end) = match &view.current {
        Some(g) if g.wal_id == pos.wal_id => (g.segments.clone(), g.shipped_end),
        _ => (Vec::new(), 0),
    };
    view.current = Some(Generation {
        number,
        snapshot_id: pos.snapshot_id,
        wal_id: pos.wal_id,
        wal_number: disk.wal.header.number,
        wal_header_floor: disk.wal.header.floor,
        wal_floor: local.wal_floor,
        snapshot,
        archives,
        side_files,
        segments,
        shipped_end,
    });
    BackupCounters::add(&counters.generations, 1);
    BackupCounters::add(&counters.objects_shipped, uploaded);
    BackupCounters::add(&counters.objects_reused, reused);
    BackupCounters::add(&counters.bytes_shipped, bytes);
    tracing::info!(
        generation = number,
        uploaded,
        reused,
        "started a generation"
    );
    Ok(StepOutcome::NewGeneration {
        generation: number,
        uploaded,
        reused,
    })
}
