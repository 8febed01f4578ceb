//! [`EngineError`]: what can go wrong opening, writing or reading a store.
//!
//! Every variant names the file (or directory) and the problem, so a message read in a log
//! or on a terminal is enough to find the broken piece.

use std::io;
use std::path::{Path, PathBuf};

use crate::store::format::FormatError;

/// An error of the reference engine or of the read-only store readers.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A system call on `path` failed.
    #[error("{}: {op}: {source}", path.display())]
    Io {
        path: PathBuf,
        /// What was being done (`open`, `fdatasync`, `rename to …`).
        op: String,
        #[source]
        source: io::Error,
    },
    /// Another process (or another `Engine` in this one) holds `store.lock`.
    #[error("{}: store is locked by another engine (flock on store.lock is held)", dir.display())]
    Locked { dir: PathBuf },
    /// A file's bytes are not the format they should be (bad magic, CRC, length).
    #[error("{}: {source}", file.display())]
    Format {
        file: PathBuf,
        #[source]
        source: FormatError,
    },
    /// The files are individually readable but do not fit together (a broken WAL chain, a
    /// snapshot newer than its WAL, a commit payload that does not decode).
    #[error("{}: {detail}", file.display())]
    Corrupt { file: PathBuf, detail: String },
    /// `dir` holds no store (no `wal.bin`, no snapshot, no archives).
    #[error("{}: not a store (no wal.bin, snapshot.bin or archive)", dir.display())]
    NotAStore { dir: PathBuf },
    /// A commit's payload would exceed the frame limit.
    #[error("commit payload of {len} bytes is over the frame limit of {max} bytes")]
    TooLarge { len: usize, max: u32 },
    /// The options make no sense (a zero or negative rate, an oversized value).
    #[error("invalid options: {0}")]
    InvalidOptions(String),
    /// An earlier write or fsync failed; what is durable is unknown, so the engine refuses
    /// further work until it is reopened (recovery then decides what survived).
    #[error("{}: engine stopped after an earlier failure, reopen the store: {reason}", dir.display())]
    Failed { dir: PathBuf, reason: String },
    /// A crash point injected by a unit test (the engine stops as if the process died).
    #[cfg(test)]
    #[error("injected crash at {0}")]
    InjectedCrash(String),
}

impl EngineError {
    pub(crate) fn io(path: &Path, op: impl Into<String>, source: io::Error) -> Self {
        EngineError::Io {
            path: path.to_path_buf(),
            op: op.into(),
            source,
        }
    }

    pub(crate) fn format(file: &Path, source: FormatError) -> Self {
        EngineError::Format {
            file: file.to_path_buf(),
            source,
        }
    }

    pub(crate) fn corrupt(file: &Path, detail: impl Into<String>) -> Self {
        EngineError::Corrupt {
            file: file.to_path_buf(),
            detail: detail.into(),
        }
    }
}
