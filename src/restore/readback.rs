//! Reading a restored store back before it is renamed into place: the format's reader for
//! every store, and the reference engine's for the stores it wrote.

use std::fs;
use std::io::ErrorKind;
use std::path::Path;

use uuid::Uuid;

use crate::store::disk::{ARCHIVE_DIR, SNAPSHOT_FILE, WAL_FILE, archive_name};
use crate::store::engine::ENGINE_NAME;
use crate::store::format::{decode_snapshot, scan_wal};

/// What a store directory holds according to the format's own reader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadBack {
    /// Commits the store holds: the snapshot's, or the last valid frame's if later.
    pub commit_seq: u64,
    pub wal_id: Uuid,
    pub wal_number: u64,
}

/// Reads a store directory with the format's reader: the snapshot (both CRCs), the archives
/// (consecutive numbers, floors chaining) and `wal.bin` (its floor continuing the chain).
/// Frame payloads are the engine's business and are not interpreted.
pub fn read_back(dir: &Path) -> Result<ReadBack, String> {
    let read = |p: &Path| fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
    let snap_path = dir.join(SNAPSHOT_FILE);
    let snapshot_seq = match fs::symlink_metadata(&snap_path) {
        Ok(_) => {
            let bytes = read(&snap_path)?;
            let (header, _) =
                decode_snapshot(&bytes).map_err(|e| format!("{SNAPSHOT_FILE}: {e}"))?;
            Some(header.commit_seq)
        }
        Err(e) if e.kind() == ErrorKind::NotFound => None,
        Err(e) => return Err(format!("{}: {e}", snap_path.display())),
    };
    let mut archives = Vec::new();
    match fs::read_dir(dir.join(ARCHIVE_DIR)) {
        Ok(entries) => {
            for entry in entries {
                let entry = entry.map_err(|e| format!("{ARCHIVE_DIR}: {e}"))?;
                let name = entry.file_name().to_string_lossy().into_owned();
                let number = name
                    .strip_suffix(".wal")
                    .filter(|n| n.len() == 20)
                    .and_then(|n| n.parse::<u64>().ok())
                    .ok_or_else(|| format!("{ARCHIVE_DIR}/{name}: not an archive name"))?;
                archives.push((number, entry.path()));
            }
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(format!("{ARCHIVE_DIR}: {e}")),
    }
    archives.sort();
    // The commit the next WAL file must start after, once known.
    let mut next: Option<(u64, u64)> = None; // (number, floor)
    let mut check = |what: &str, bytes: &[u8], number: Option<u64>| -> Result<_, String> {
        let scan = scan_wal(bytes).map_err(|e| format!("{what}: {e}"))?;
        if number.is_some_and(|n| n != scan.header.number) {
            return Err(format!("{what}: header says number {}", scan.header.number));
        }
        match next {
            Some((n, floor)) => {
                if scan.header.number != n || scan.header.floor != floor {
                    return Err(format!(
                        "{what}: number {} floor {}, expected number {n} floor {floor}",
                        scan.header.number, scan.header.floor
                    ));
                }
            }
            None => {
                if scan.header.floor > snapshot_seq.unwrap_or(0) {
                    return Err(format!(
                        "{what}: floor {} above the snapshot's {} commits",
                        scan.header.floor,
                        snapshot_seq.unwrap_or(0)
                    ));
                }
            }
        }
        next = Some((scan.header.number + 1, scan.last_seq));
        Ok(scan)
    };
    for (number, path) in &archives {
        let what = format!("{ARCHIVE_DIR}/{}", archive_name(*number));
        check(&what, &read(path)?, Some(*number))?;
    }
    let wal = check(WAL_FILE, &read(&dir.join(WAL_FILE))?, None)?;
    Ok(ReadBack {
        commit_seq: wal.last_seq.max(snapshot_seq.unwrap_or(0)),
        wal_id: wal.header.wal_id,
        wal_number: wal.header.number,
    })
}

/// Whether `store.meta` says the reference engine wrote the store: then its payloads are
/// known, and the engine's own reading ([`crate::store::engine::read_store`]: every commit
/// decoded and applied) is required to agree too. Stores of other engines get the format's
/// reading only: their payloads are their business.
pub(crate) fn is_reference_engine_store(dir: &Path) -> bool {
    fs::read(dir.join(crate::store::disk::META_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .is_some_and(|v| v.get("engine").and_then(|e| e.as_str()) == Some(ENGINE_NAME))
}
