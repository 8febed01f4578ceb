//! `--at`'s cut of the restored `wal.bin` after commit N, walking the frame headers on disk.

use std::fs;
use std::path::Path;

use super::RestoreError;
use super::io;
use crate::store::disk::WAL_FILE;
use crate::store::format::{FRAME_HEADER_LEN, WAL_HEADER_LEN, WalHeader, frame_header};

/// Cuts `wal.bin` after frame `seq = n`, found by walking the frame headers (a header of
/// 16 bytes read a frame at a time: the file is never held whole, whatever its size). The
/// file was read back with the format's reader before, and is read back again after the
/// cut, so the walk takes each header's length and seq as they are and stops at the first
/// that does not continue the chain or runs past the end.
pub(super) fn cut_wal(dir: &Path, n: u64) -> Result<(), RestoreError> {
    use std::os::unix::fs::FileExt;
    let path = dir.join(WAL_FILE);
    let bad = |detail: String| RestoreError::ReadBack {
        dir: dir.to_path_buf(),
        detail,
    };
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(io(&path))?;
    let len = f.metadata().map_err(io(&path))?.len();
    let mut head = vec![0u8; WAL_HEADER_LEN.min(crate::units::usize_of(len))];
    f.read_exact_at(&mut head, 0).map_err(io(&path))?;
    let header = WalHeader::decode(&head).map_err(|e| bad(format!("{WAL_FILE}: {e}")))?;
    let mut at = WAL_HEADER_LEN as u64;
    let mut last_seq = header.floor;
    let mut frame = [0u8; FRAME_HEADER_LEN];
    while last_seq != n && at + FRAME_HEADER_LEN as u64 <= len {
        f.read_exact_at(&mut frame, at).map_err(io(&path))?;
        let (payload, seq) = frame_header(&frame);
        let end = at + FRAME_HEADER_LEN as u64 + payload;
        if Some(seq) != last_seq.checked_add(1) || end > len {
            break;
        }
        (last_seq, at) = (seq, end);
    }
    if last_seq != n {
        return Err(bad(format!(
            "{WAL_FILE} holds commits {}..={last_seq}, not {n}",
            header.floor + 1
        )));
    }
    if at < len {
        f.set_len(at).map_err(io(&path))?;
        f.sync_all().map_err(io(&path))?;
    }
    Ok(())
}
