//! Reading a restored store back before it is renamed into place: the format's reader for
//! every store, and, on request, the reference engine's for the stores it wrote.
//!
//! The format's reading has two halves. [`check_file`] reads one file of the store: a
//! snapshot (both CRCs) or a WAL file (its header, then every frame's CRC and the seq chain
//! within it). [`chain`] then checks how the files fit together: consecutive archive numbers,
//! each floor equal to the previous file's last commit, the first floor at or below the
//! snapshot's `commit_seq`. [`read_back`] does both on a directory; a restore runs
//! [`check_file`] on each file as soon as its last byte is written, overlapped with the
//! downloads still in flight, and [`chain`] at the end, so the read-back costs the restore
//! little more than the chain check. Both read the files as written, never the downloaded
//! bytes in memory, a chunk at a time (a file is never held whole, whatever its size).

use std::fs;
use std::io::ErrorKind;
use std::path::Path;

use uuid::Uuid;

use crate::store::disk::{ARCHIVE_DIR, SNAPSHOT_FILE, WAL_FILE, archive_name};
use crate::store::engine::ENGINE_NAME;
use crate::store::format::{CHECK_CHUNK, CheckError, WalHeader, check_snapshot, check_wal};

/// What a store directory holds according to the format's own reader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadBack {
    /// Commits the store holds: the snapshot's, or the last valid frame's if later.
    pub commit_seq: u64,
    pub wal_id: Uuid,
    pub wal_number: u64,
}

/// The kind of a store file, by its path relative to the store directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileKind {
    Snapshot,
    /// An archive, with the number its name gives.
    Archive(u64),
    Wal,
    /// A side file: its content is not the format's business.
    Other,
}

impl FileKind {
    /// The kind of the file at `rel` (relative to the store directory).
    pub(crate) fn of(rel: &Path) -> Result<FileKind, String> {
        if rel == Path::new(SNAPSHOT_FILE) {
            return Ok(FileKind::Snapshot);
        }
        if rel == Path::new(WAL_FILE) {
            return Ok(FileKind::Wal);
        }
        match rel.strip_prefix(ARCHIVE_DIR) {
            Ok(name) => {
                let name = name.to_string_lossy();
                name.strip_suffix(".wal")
                    .filter(|n| n.len() == 20)
                    .and_then(|n| n.parse::<u64>().ok())
                    .map(FileKind::Archive)
                    .ok_or_else(|| format!("{ARCHIVE_DIR}/{name}: not an archive name"))
            }
            Err(_) => Ok(FileKind::Other),
        }
    }
}

/// What the format's reader found in one file of the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileCheck {
    /// A snapshot whose CRCs hold, with the commits it holds.
    Snapshot { commit_seq: u64 },
    /// A WAL file: its header, and the seq of its last valid frame (its floor without one).
    Wal { header: WalHeader, last_seq: u64 },
    /// Not read: a side file.
    Other,
}

/// Reads the file at `rel` under `dir` with the format's reader (see [`FileCheck`]). A WAL file
/// whose frames stop early is not an error here: [`chain`] sees its last commit.
pub(crate) fn check_file(dir: &Path, rel: &Path) -> Result<FileCheck, String> {
    let kind = FileKind::of(rel)?;
    let path = dir.join(rel);
    let what = rel.display();
    let io = |e: std::io::Error| format!("{}: {e}", path.display());
    match kind {
        FileKind::Other => Ok(FileCheck::Other),
        FileKind::Snapshot => {
            let file = fs::File::open(&path).map_err(io)?;
            let header = check_snapshot(&file, CHECK_CHUNK).map_err(|e| match e {
                CheckError::Io(e) => io(e),
                CheckError::Format(e) => format!("{what}: {e}"),
            })?;
            Ok(FileCheck::Snapshot {
                commit_seq: header.commit_seq,
            })
        }
        FileKind::Archive(_) | FileKind::Wal => {
            let file = fs::File::open(&path).map_err(io)?;
            let check = check_wal(&file, CHECK_CHUNK, &mut Vec::new()).map_err(|e| match e {
                CheckError::Io(e) => io(e),
                CheckError::Format(e) => format!("{what}: {e}"),
            })?;
            if let FileKind::Archive(number) = kind
                && check.header.number != number
            {
                return Err(format!(
                    "{what}: header says number {}",
                    check.header.number
                ));
            }
            Ok(FileCheck::Wal {
                header: check.header,
                last_seq: check.last_seq,
            })
        }
    }
}

/// Checks how the files of a store fit together, from their [`check_file`] results keyed by
/// their paths relative to the store directory: at most one snapshot, archives with
/// consecutive numbers, each WAL file's floor equal to the previous one's last commit (the
/// first at or below the snapshot's `commit_seq`), and `wal.bin` last.
pub(crate) fn chain<'a>(
    files: impl IntoIterator<Item = (&'a Path, FileCheck)>,
) -> Result<ReadBack, String> {
    let mut snapshot_seq = None;
    let mut archives = Vec::new();
    let mut wal = None;
    for (rel, check) in files {
        match (FileKind::of(rel)?, check) {
            (FileKind::Snapshot, FileCheck::Snapshot { commit_seq }) => {
                snapshot_seq = Some(commit_seq)
            }
            (FileKind::Archive(n), FileCheck::Wal { header, last_seq }) => {
                archives.push((n, header, last_seq))
            }
            (FileKind::Wal, FileCheck::Wal { header, last_seq }) => wal = Some((header, last_seq)),
            (FileKind::Other, _) => {}
            (_, check) => return Err(format!("{}: read as {check:?}", rel.display())),
        }
    }
    let Some(wal) = wal else {
        return Err(format!("{WAL_FILE} is missing"));
    };
    archives.sort_by_key(|a| a.0);
    // The (number, floor) the next WAL file must have, once known.
    let mut next: Option<(u64, u64)> = None;
    let link = |what: &str, header: &WalHeader, last_seq: u64, next: &mut Option<(u64, u64)>| {
        match *next {
            Some((n, floor)) => {
                if header.number != n || header.floor != floor {
                    return Err(format!(
                        "{what}: number {} floor {}, expected number {n} floor {floor}",
                        header.number, header.floor
                    ));
                }
            }
            None => {
                if header.floor > snapshot_seq.unwrap_or(0) {
                    return Err(format!(
                        "{what}: floor {} above the snapshot's {} commits",
                        header.floor,
                        snapshot_seq.unwrap_or(0)
                    ));
                }
            }
        }
        *next = Some((header.number + 1, last_seq));
        Ok(())
    };
    for (number, header, last_seq) in &archives {
        let what = format!("{ARCHIVE_DIR}/{}", archive_name(*number));
        link(&what, header, *last_seq, &mut next)?;
    }
    let (header, last_seq) = wal;
    link(WAL_FILE, &header, last_seq, &mut next)?;
    Ok(ReadBack {
        commit_seq: last_seq.max(snapshot_seq.unwrap_or(0)),
        wal_id: header.wal_id,
        wal_number: header.number,
    })
}

/// Reads a store directory with the format's reader: the snapshot (both CRCs), the archives
/// (consecutive numbers, floors chaining) and `wal.bin` (its floor continuing the chain).
/// Frame payloads are the engine's business and are not interpreted.
pub fn read_back(dir: &Path) -> Result<ReadBack, String> {
    let mut rels: Vec<std::path::PathBuf> = Vec::new();
    match fs::symlink_metadata(dir.join(SNAPSHOT_FILE)) {
        Ok(_) => rels.push(SNAPSHOT_FILE.into()),
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(format!("{}: {e}", dir.join(SNAPSHOT_FILE).display())),
    }
    match fs::read_dir(dir.join(ARCHIVE_DIR)) {
        Ok(entries) => {
            for entry in entries {
                let entry = entry.map_err(|e| format!("{ARCHIVE_DIR}: {e}"))?;
                rels.push(Path::new(ARCHIVE_DIR).join(entry.file_name()));
            }
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(format!("{ARCHIVE_DIR}: {e}")),
    }
    rels.push(WAL_FILE.into());
    let mut checks = Vec::with_capacity(rels.len());
    for rel in &rels {
        checks.push((rel.as_path(), check_file(dir, rel)?));
    }
    chain(checks)
}

/// Whether `store.meta` says the reference engine wrote the store: then its payloads are
/// known, and [`crate::store::engine::read_store`] (every commit decoded and applied) can read
/// it. Stores of other engines get the format's reading only: their payloads are their
/// business.
pub(crate) fn is_reference_engine_store(dir: &Path) -> bool {
    fs::read(dir.join(crate::store::disk::META_FILE)).is_ok_and(|b| is_reference_engine_meta(&b))
}

/// Whether the bytes of a `store.meta` say the reference engine wrote the store.
pub fn is_reference_engine_meta(meta: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(meta)
        .is_ok_and(|v| v.get("engine").and_then(|e| e.as_str()) == Some(ENGINE_NAME))
}
