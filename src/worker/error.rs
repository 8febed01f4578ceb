//! [`WorkerError`]: why a step failed, and how the runner reads it (a refusal that no retry
//! changes, a concurrent writer, a transient failure of the bucket).

use std::path::PathBuf;

use super::DeferReason;
use crate::bucket::BucketError;
use crate::store::dir::DirError;
use crate::store::disk::DiskError;
use crate::wal_source::SourceError;

/// Why a step failed.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Bucket(#[from] BucketError),
    #[error(transparent)]
    Disk(#[from] DiskError),
    #[error("WAL source: {0}")]
    Source(#[from] SourceError),
    /// The prefix is refused (lineage): nothing was uploaded or deleted.
    #[error("prefix refused: {reason}")]
    Refused { reason: String },
    #[error("corrupt archive {path}: {detail}; no restore point is written over it")]
    CorruptArchive { path: PathBuf, detail: String },
    #[error("store {dir}: {detail}")]
    Store { dir: PathBuf, detail: String },
    #[error("another writer is active on this prefix ({key} was refused); starting over")]
    ConcurrentWriter { key: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("bucket content {key}: {detail}")]
    BadBucket { key: String, detail: String },
    #[error("the store stayed busy ({0}) for too long")]
    Busy(DeferReason),
    #[error("encoding {0}")]
    Encode(#[from] crate::at_rest::AtRestError),
}

impl From<crate::latest::LatestError> for WorkerError {
    fn from(e: crate::latest::LatestError) -> WorkerError {
        use crate::latest::LatestError as L;
        match e {
            L::Bucket(e) => WorkerError::Bucket(e),
            L::Moved { key } => WorkerError::ConcurrentWriter { key },
            e @ (L::OtherForm { .. } | L::BothForms { .. } | L::NoNextPointer { .. }) => {
                WorkerError::Refused {
                    reason: e.to_string(),
                }
            }
        }
    }
}

impl WorkerError {
    /// A refusal stays until an operator acts: retrying it quickly is pointless.
    pub fn is_refusal(&self) -> bool {
        matches!(self, WorkerError::Refused { .. })
    }

    /// The store directory's refusal, when the directory left its root, was replaced, or a
    /// file in it is not a regular file of a sane size (see [`crate::store::dir`]).
    pub fn store_refusal(&self) -> Option<&DirError> {
        match self {
            WorkerError::Disk(d) | WorkerError::Source(SourceError::Disk(d)) => d.refusal(),
            _ => None,
        }
    }
}
