//! Applying what the bucket holds to a standby's directory, in numbered steps
//! ([`ApplyStep`]), each leaving a store that opens.
//!
//! # Segments of the generation followed: append, then fsync
//! Segments past the applied end were checked by the restore's own chain rule
//! (`restore::plan::extend_listed`: length from the key, every frame's CRC, seqs continuing the
//! commits applied, the longest valid one where several start at one offset). Their plain
//! bytes are the bytes of the generation's `wal.bin` at exactly those offsets, so they are
//! appended to `wal.bin` as they are, then `wal.bin` is fsynced (`fdatasync`). A crash before
//! the fsync leaves `wal.bin` with a tail of whole or torn frames past the applied end: the
//! format ends the log at the first frame that is short, has a bad CRC or a wrong seq
//! (DESIGN.md section 2), so the store opens at a commit at or after the last one applied,
//! and the restart cuts `wal.bin` back to a segment boundary before it appends again
//! ([`super::local::trim_tail`]).
//!
//! # A new generation: staged beside, then exchanged
//! A snapshot or a new WAL file (a new generation, section 4) is restored by the restore
//! itself (LATEST's restore point extended by the segments after it; every object checked
//! against its entry, every file read back and fsynced) into `.<name>.standby-<uuid>` beside
//! the directory, and the two directories are exchanged in one `renameat2(RENAME_EXCHANGE)`;
//! then the parent directory is fsynced and the old store (now under the staged name) is
//! removed. Every moment the directory's name holds one whole store: the old one or the new
//! one. A crash leaves at most a staged directory, which the restart removes
//! ([`super::local::remove_stale`]). The standby holds `store.lock` in the directory it
//! serves; the staged store's lock is taken before the exchange.

use std::fs;
use std::io::Write;
use std::path::Path;

use bytes::Bytes;
use serde::Serialize;

use super::local::{self, io};
use super::{Applied, Crash, StandbyError};
use crate::restore::{self, RestoreOptions};
use crate::store::disk::WAL_FILE;

/// The numbered points of an apply between which a crash may fall (`--crash-at-step`, for
/// tests: the process exits right there, as a kill would leave it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ApplyStep {
    /// 1: segments fetched and checked, nothing written.
    SegmentsFetched = 1,
    /// 2: half of the first segment's bytes appended (a torn append).
    SegmentTorn = 2,
    /// 3: every segment appended, `wal.bin` not yet fsynced.
    SegmentsWritten = 3,
    /// 4: `wal.bin` fsynced.
    SegmentsSynced = 4,
    /// 5: a new generation staged beside the directory, not yet exchanged.
    GenerationStaged = 5,
    /// 6: exchanged, the parent directory not yet fsynced.
    GenerationExchanged = 6,
    /// 7: the parent fsynced, the old store not yet removed.
    GenerationSynced = 7,
}

impl ApplyStep {
    /// Every step, in order.
    pub const ALL: [ApplyStep; 7] = [
        ApplyStep::SegmentsFetched,
        ApplyStep::SegmentTorn,
        ApplyStep::SegmentsWritten,
        ApplyStep::SegmentsSynced,
        ApplyStep::GenerationStaged,
        ApplyStep::GenerationExchanged,
        ApplyStep::GenerationSynced,
    ];

    /// The step numbered `n` (1 to 7).
    pub fn from_number(n: u8) -> Option<ApplyStep> {
        ApplyStep::ALL.iter().copied().find(|s| *s as u8 == n)
    }
}

/// Appends `plain` (checked segments continuing `at.wal_end`, in order, ending at `end` and
/// reaching `reach` commits) to `dir/wal.bin` and fsyncs it. Blocking.
pub(crate) fn append(
    dir: &Path,
    at: &Applied,
    plain: &[Bytes],
    end: u64,
    reach: u64,
    crash: &Crash,
) -> Result<Applied, StandbyError> {
    crash.at(ApplyStep::SegmentsFetched);
    let wal = dir.join(WAL_FILE);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .open(&wal)
        .map_err(io(&wal))?;
    let len = f.metadata().map_err(io(&wal))?.len();
    if len != at.wal_end {
        // Only this process appends; anything else is someone writing into a standby.
        return Err(StandbyError::NotAStore {
            dir: dir.to_path_buf(),
            detail: format!(
                "{WAL_FILE} is {len} bytes, the standby applied {}: written by someone else",
                at.wal_end
            ),
        });
    }
    use std::io::Seek;
    f.seek(std::io::SeekFrom::End(0)).map_err(io(&wal))?;
    let mut written = 0u64;
    for (i, bytes) in plain.iter().enumerate() {
        if i == 0 && crash.wants(ApplyStep::SegmentTorn) {
            f.write_all(&bytes[..bytes.len() / 2]).map_err(io(&wal))?;
            crash.at(ApplyStep::SegmentTorn);
        }
        f.write_all(bytes).map_err(io(&wal))?;
        written += bytes.len() as u64;
    }
    if at.wal_end + written != end {
        return Err(StandbyError::NotAStore {
            dir: dir.to_path_buf(),
            detail: format!(
                "segments of {written} bytes from offset {} do not end at {end}",
                at.wal_end
            ),
        });
    }
    crash.at(ApplyStep::SegmentsWritten);
    f.sync_data().map_err(io(&wal))?;
    crash.at(ApplyStep::SegmentsSynced);
    Ok(Applied {
        wal_end: end,
        commit_seq: reach,
        ..at.clone()
    })
}

/// A generation restored beside the directory, checked, not yet in place.
pub(crate) struct Staged {
    pub path: std::path::PathBuf,
    pub report: restore::RestoreReport,
    pub local: local::LocalStore,
}

/// Restores the newest restore point (extended by its segments) into a fresh staged
/// directory beside `dir` (see the module docs). A failure or a drop removes it (the
/// restore's own guarantee; a staged store that fails its look is removed here).
pub(crate) async fn stage(
    bucket: &dyn crate::bucket::Bucket,
    dir: &Path,
    opts: &RestoreOptions,
) -> Result<Staged, StandbyError> {
    let path = local::staged_path(dir)?;
    let report = restore::restore(bucket, &path, opts).await?;
    let p = path.clone();
    let looked = tokio::task::spawn_blocking(move || local::look(&p))
        .await
        .map_err(StandbyError::join)?;
    match looked {
        Ok(local) => Ok(Staged {
            path,
            report,
            local,
        }),
        Err(e) => {
            let _ = fs::remove_dir_all(&path);
            Err(e)
        }
    }
}

/// Puts a staged generation in place of `dir` (see the module docs) and returns the lock of
/// the store now in place. Blocking.
pub(crate) fn exchange(
    dir: &Path,
    staged: &Staged,
    crash: &Crash,
) -> Result<fs::File, StandbyError> {
    let lock = super::lock(&staged.path)?;
    crash.at(ApplyStep::GenerationStaged);
    local::exchange(&staged.path, dir)?;
    crash.at(ApplyStep::GenerationExchanged);
    let parent = local::parent(dir);
    crate::store::disk::sync_dir(parent).map_err(|e| StandbyError::NotAStore {
        dir: parent.to_path_buf(),
        detail: e.to_string(),
    })?;
    crash.at(ApplyStep::GenerationSynced);
    // The old store, now under the staged name.
    fs::remove_dir_all(&staged.path).map_err(io(&staged.path))?;
    crate::store::disk::sync_dir(parent).map_err(|e| StandbyError::NotAStore {
        dir: parent.to_path_buf(),
        detail: e.to_string(),
    })?;
    Ok(lock)
}
