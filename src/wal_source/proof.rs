//! What the store's files say of a position a node reported: confirmed, stale, or contradicted.
//!
//! A node is trusted to report only what it fsynced; the files cannot show what is fsynced,
//! but they can show what a report claims that is not there at all. [`check`] reads `wal.bin`
//! (its header and the frames up to the reported `durable_len`) and `snapshot.bin`'s header:
//!
//! - **Confirmed**: the report names `wal.bin` (id and number), whole valid frames end exactly at
//!   its `durable_len`, the last carrying its `commit_seq`, and it names `snapshot.bin`.
//! - **Stale**: it names a WAL file the store has moved past (an archived or deleted one) with
//!   no more commits than `wal.bin` starts after, or an older snapshot: true once, no longer
//!   the store's state. A node reports only after the files it names are in place, so a true
//!   report can fall behind the files but never run ahead of them.
//! - **Contradicted**: anything else — more commits than the WAL files on disk hold, a length
//!   past the end of `wal.bin`, a length off the frames, a number that is not `wal.bin`'s.
//!
//! The frames are scanned from a known boundary when there is one (the last confirmed position
//! in the same file), so confirming a node that reports every group commit reads only the bytes
//! added since, in pieces of [`CHECK_CHUNK`]. A report that the known boundary already
//! contradicts is not scanned at all: every frame holds one commit, numbered on from the one
//! before, so a length at or below the boundary's holds fewer commits than it (the same number
//! only at the same length), and one past it holds more. Such a report (a length below the
//! mark's with more commits than it) used to be scanned from `wal.bin`'s header, every time a
//! stream sent one, under the lock every report of the store waits for (security review 4,
//! Low 4); it now costs no read beyond the header. No report that would raise the mark is
//! scanned from the header while a boundary in the same file is known. Nothing here writes.

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;

use super::{SourceError, io, read_snapshot_id, read_wal_header};
use crate::store::dir::{FileKind, StoreDir};
use crate::store::disk::{DiskError, WAL_FILE};
use crate::store::format::{CHECK_CHUNK, WAL_HEADER_LEN, WalHeader, WalPosition, check_wal};

/// What the files say of one reported position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Verdict {
    /// The files confirm it; `inode` is `wal.bin`'s, for scanning on from it next time.
    Confirmed { inode: u64 },
    /// It names files the store has moved past.
    Stale,
    /// The files contradict it; why, in words.
    Contradicted(String),
}

/// What [`check`] found, and how many bytes of frames it read to find it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Checked {
    pub verdict: Verdict,
    /// Bytes of `wal.bin`'s frames read (its header aside): 0 when the header or a known
    /// boundary settled it.
    pub scanned: u64,
}

impl From<Verdict> for Checked {
    fn from(verdict: Verdict) -> Self {
        Checked {
            verdict,
            scanned: 0,
        }
    }
}

/// A position the files confirmed, and the `wal.bin` inode they confirmed it in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Confirmed {
    pub position: WalPosition,
    pub inode: u64,
}

/// Checks `pos` against the files in `dir`; `known` is an earlier confirmed position, whose
/// frames need not be read again when `pos` continues it in the same file.
pub(super) fn check(
    dir: &StoreDir,
    pos: &WalPosition,
    known: Option<&Confirmed>,
) -> Result<Checked, SourceError> {
    let path = dir.display_path(WAL_FILE);
    let Some(mut f) = dir.open(WAL_FILE, FileKind::Store)? else {
        return Err(io(&path)(std::io::ErrorKind::NotFound.into()));
    };
    let (meta, header) = read_wal_header(&mut f, &path)?;
    let contradicted = |why: String| Ok(Verdict::Contradicted(why).into());
    if pos.wal_id != header.wal_id {
        if pos.commit_seq > header.floor {
            return contradicted(format!(
                "it names WAL file {} with {} commits, but wal.bin is WAL file {} and starts after commit {}",
                pos.wal_id, pos.commit_seq, header.wal_id, header.floor
            ));
        }
        return Ok(Verdict::Stale.into());
    }
    if pos.wal_number != header.number {
        return contradicted(format!(
            "it names wal.bin as WAL number {}, but the file is number {}",
            pos.wal_number, header.number
        ));
    }
    if pos.durable_len < WAL_HEADER_LEN as u64 || pos.durable_len > meta.len() {
        return contradicted(format!(
            "its durable_len {} is not within wal.bin's {} bytes",
            pos.durable_len,
            meta.len()
        ));
    }
    if pos.commit_seq < header.floor {
        return contradicted(format!(
            "its commit_seq {} is below wal.bin's floor {}",
            pos.commit_seq, header.floor
        ));
    }
    let same_file = known.filter(|k| k.position.wal_id == pos.wal_id && k.inode == meta.ino());
    if let Some(k) = same_file
        && let Some(why) = beside(pos, &k.position)
    {
        return contradicted(why);
    }
    let (start, floor) = match same_file {
        Some(k) if k.position.durable_len <= pos.durable_len => {
            (k.position.durable_len, k.position.commit_seq)
        }
        _ => (WAL_HEADER_LEN as u64, header.floor),
    };
    // The frames after `start` as a WAL file of their own: a header whose floor is the commit
    // before them, so `check_wal` scans them in pieces and expects the right first seq.
    let Ok(floor_header) = WalHeader::decode(&WalHeader { floor, ..header }.encode()) else {
        return contradicted(format!(
            "its commit_seq {} leaves no room for a frame",
            pos.commit_seq
        ));
    };
    f.seek(SeekFrom::Start(start)).map_err(io(&path))?;
    let frames = std::io::Cursor::new(floor_header.encode()).chain(f.take(pos.durable_len - start));
    let scanned = check_wal(frames, CHECK_CHUNK, &mut Vec::new()).map_err(|e| match e {
        crate::store::format::CheckError::Io(source) => DiskError::Io {
            path: path.clone(),
            source,
        },
        crate::store::format::CheckError::Format(source) => DiskError::Format {
            path: path.clone(),
            source,
        },
    })?;
    let read = pos.durable_len - start;
    let reached = start + (scanned.valid_len - WAL_HEADER_LEN as u64);
    if reached != pos.durable_len || scanned.last_seq != pos.commit_seq {
        return Ok(Checked {
            verdict: Verdict::Contradicted(format!(
                "it says {} commits end at byte {} of wal.bin, but the valid frames there end at \
                 byte {} with commit {}",
                pos.commit_seq, pos.durable_len, reached, scanned.last_seq
            )),
            scanned: read,
        });
    }
    let verdict = if read_snapshot_id(dir)? != pos.snapshot_id {
        Verdict::Stale
    } else {
        Verdict::Confirmed { inode: meta.ino() }
    };
    Ok(Checked {
        verdict,
        scanned: read,
    })
}

/// Why `pos` cannot be a frame boundary of the file in which `known` is one, if it cannot:
/// frames hold one commit each, numbered on, so more bytes hold more commits.
fn beside(pos: &WalPosition, known: &WalPosition) -> Option<String> {
    use std::cmp::Ordering;
    let fits = match pos.durable_len.cmp(&known.durable_len) {
        Ordering::Less => pos.commit_seq < known.commit_seq,
        Ordering::Equal => pos.commit_seq == known.commit_seq,
        Ordering::Greater => pos.commit_seq > known.commit_seq,
    };
    (!fits).then(|| {
        format!(
            "it says {} commits end at byte {} of wal.bin, but commit {} ends at byte {} \
             (confirmed before), and every frame holds one commit",
            pos.commit_seq, pos.durable_len, known.commit_seq, known.durable_len
        )
    })
}
