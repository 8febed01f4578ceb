//! [`StandbyError`]: why a standby, its catch-up or its promotion stopped, and which of those
//! the next poll may do better on ([`StandbyError::is_transient`]).

use std::path::PathBuf;

use uuid::Uuid;

use crate::bucket::BucketError;
use crate::restore::RestoreError;

/// Why a standby stopped.
#[derive(Debug, thiserror::Error)]
pub enum StandbyError {
    #[error("{0}")]
    BadOption(String),
    #[error(transparent)]
    Restore(#[from] RestoreError),
    #[error(transparent)]
    Bucket(#[from] BucketError),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is not a store a standby can follow: {detail}", dir.display())]
    NotAStore { dir: PathBuf, detail: String },
    #[error("{} is in use: an engine or another standby holds its store.lock", dir.display())]
    InUse { dir: PathBuf },
    #[error(
        "the prefix's newest restore point is lineage {prefix}'s, this standby follows lineage \
         {ours}: it stops (the primary was adopted away, or this is another store's prefix; \
         restore anew to follow it)"
    )]
    LineageChanged { ours: Uuid, prefix: Uuid },
    #[error(
        "{} holds {local} commits, more than the prefix's newest restore point ({prefix}): a \
         standby is never rewound",
        dir.display()
    )]
    Diverged {
        dir: PathBuf,
        local: u64,
        prefix: u64,
    },
    #[error("exchanging {} with {}: {source}", staged.display(), dir.display())]
    Exchange {
        staged: PathBuf,
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("a blocking task failed: {0}")]
    Join(String),
    /// A promotion's claim of LATEST failed (`promote::claim`).
    #[error("claiming LATEST for the promoted store: {0}")]
    Claim(crate::latest::LatestError),
    /// A promotion found the prefix moved on since it caught up (the old writer had not
    /// noticed the takeover yet): it catches up again (`promote::promote`).
    #[error("{} is behind the prefix: {detail}", dir.display())]
    Behind { dir: PathBuf, detail: String },
    /// Cancelled before the first restore or resume finished (nothing was put in place).
    #[error("stopped before the standby was in place")]
    Cancelled,
    /// A promotion's catch-up stopped short of segments listed past it (`promote::promote`):
    /// claiming LATEST there would cut them, and any commit acknowledged in them, from the
    /// prefix's history for good.
    #[error(
        "{} stops at commit {commit_seq}, but {} segment(s) listed past it were left out, the \
         first {}: not promoted (investigate them: damage, a second writer, or a key this \
         standby lacks)",
        dir.display(),
        left_out.len(),
        left_out.first().map(|l| l.to_string()).unwrap_or_default()
    )]
    LeftOut {
        dir: PathBuf,
        commit_seq: u64,
        left_out: Vec<crate::at_rest::chain::LeftOut>,
    },
}

impl StandbyError {
    pub(crate) fn join(e: tokio::task::JoinError) -> StandbyError {
        StandbyError::Join(e.to_string())
    }

    /// Whether the next poll may do better: the bucket's errors (after its own retries).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            StandbyError::Bucket(_) | StandbyError::Restore(RestoreError::Bucket(_))
        )
    }
}
