//! File names of a store and the few file-system moves the engine is built from:
//! write-tmp-fsync-rename, directory fsync, in-place rewrites, and the `store.lock` flock.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use uuid::Uuid;

use super::EngineError;
use crate::store::format::WalHeader;

pub const WAL: &str = "wal.bin";
pub const SNAPSHOT: &str = "snapshot.bin";
pub const SNAPSHOT_TMP: &str = "snapshot.bin.tmp";
pub const INTENT: &str = "snapshot.intent";
pub const ARCHIVE_DIR: &str = "archive";
pub const META: &str = "store.meta";
pub const LOCK: &str = "store.lock";
pub const POSITION: &str = "wal.position";
/// Temporary files the engine's own atomic writes leave behind when interrupted.
pub const WAL_TMP: &str = "wal.bin.tmp";
pub const STRAY_TMPS: &[&str] = &[WAL_TMP, SNAPSHOT_TMP, "store.meta.tmp"];

/// `archive/<number:020>.wal`, relative to the store.
pub fn archive_name(number: u64) -> String {
    format!("{number:020}.wal")
}

/// The number of an archive file name, if it is one (`<20 digits>.wal`).
pub use crate::store::disk::parse_archive_name;

/// Reads a whole file, or `None` if it does not exist.
pub fn read_optional(path: &Path) -> Result<Option<Vec<u8>>, EngineError> {
    match fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(EngineError::io(path, "read", e)),
    }
}

/// fsyncs a directory, making renames, creations and deletions in it durable.
pub fn fsync_dir(dir: &Path) -> Result<(), EngineError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| EngineError::io(dir, "fsync directory", e))
}

/// Creates `dir` (and parents) if missing; fsyncs its parent when it was created.
pub fn ensure_dir(dir: &Path) -> Result<(), EngineError> {
    if dir.is_dir() {
        return Ok(());
    }
    fs::create_dir_all(dir).map_err(|e| EngineError::io(dir, "create directory", e))?;
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        fsync_dir(parent)?;
    }
    Ok(())
}

/// Writes `bytes` to `<name>.tmp` in `dir`, fsyncs it, renames it over `name` and fsyncs
/// `dir`: afterwards `name` holds either its old content or all of `bytes`, never a mix.
pub fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), EngineError> {
    let tmp = dir.join(format!("{name}.tmp"));
    write_synced(&tmp, bytes)?;
    rename(&tmp, &dir.join(name))?;
    fsync_dir(dir)
}

/// Creates (or truncates) `path`, writes `bytes` and fsyncs it.
pub fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), EngineError> {
    let mut f = File::create(path).map_err(|e| EngineError::io(path, "create", e))?;
    f.write_all(bytes)
        .map_err(|e| EngineError::io(path, "write", e))?;
    f.sync_all().map_err(|e| EngineError::io(path, "fsync", e))
}

/// Starts a new, empty `wal.bin` (a fresh `wal_id`) by write-tmp-fsync-rename, replacing
/// any old one atomically, and fsyncs the store directory.
pub fn start_wal(dir: &Path, number: u64, floor: u64) -> Result<WalHeader, EngineError> {
    let header = WalHeader {
        wal_id: Uuid::new_v4(),
        number,
        floor,
    };
    write_atomic(dir, WAL, &header.encode())?;
    Ok(header)
}

/// Replaces the content of `path` in place (truncate, write, fsync); creates it if missing.
pub fn rewrite_in_place(path: &Path, bytes: &[u8]) -> Result<(), EngineError> {
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(|e| EngineError::io(path, "open for rewrite", e))?;
    f.write_all(bytes)
        .map_err(|e| EngineError::io(path, "write", e))?;
    f.sync_all().map_err(|e| EngineError::io(path, "fsync", e))
}

pub fn rename(from: &Path, to: &Path) -> Result<(), EngineError> {
    fs::rename(from, to)
        .map_err(|e| EngineError::io(from, format!("rename to {}", to.display()), e))
}

/// Removes a file; a file already gone is fine.
pub fn remove_if_present(path: &Path) -> Result<(), EngineError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(EngineError::io(path, "remove", e)),
    }
}

/// Opens (creating if needed) `store.lock` and takes an exclusive, non-blocking flock on it.
/// The lock lives as long as the returned file.
pub fn lock_store(dir: &Path) -> Result<File, EngineError> {
    let path = dir.join(LOCK);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| EngineError::io(&path, "open", e))?;
    // SAFETY: flock on a descriptor we own; no memory is involved.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::WouldBlock {
            return Err(EngineError::Locked {
                dir: dir.to_path_buf(),
            });
        }
        return Err(EngineError::io(&path, "flock", e));
    }
    Ok(f)
}

/// Names under `dir/archive` that are archive files, with their numbers, ascending.
pub fn list_archives(dir: &Path) -> Result<Vec<(u64, PathBuf)>, EngineError> {
    let adir = dir.join(ARCHIVE_DIR);
    let entries = match fs::read_dir(&adir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(EngineError::io(&adir, "list", e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| EngineError::io(&adir, "list", e))?;
        if let Some(n) = entry.file_name().to_str().and_then(parse_archive_name) {
            out.push((n, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archive_names_round_trip() {
        assert_eq!(archive_name(7), "00000000000000000007.wal");
        assert_eq!(parse_archive_name(&archive_name(7)), Some(7));
        assert_eq!(parse_archive_name(&archive_name(u64::MAX)), Some(u64::MAX));
        assert_eq!(parse_archive_name("7.wal"), None);
        assert_eq!(parse_archive_name("0000000000000000000x.wal"), None);
        assert_eq!(parse_archive_name("00000000000000000007.wal.tmp"), None);
        assert_eq!(parse_archive_name("99999999999999999999.wal"), None);
    }
}
