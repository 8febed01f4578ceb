//! One object of a restore and where its bytes go ([`Piece`]), and the two helpers every
//! stage of the download uses on it: the whole-object read ([`whole_of`]) and blocking file
//! work on the blocking pool ([`blocking`]). Below `stage`, `fetch` and `decode`, which all
//! use them, so none of those three imports another for them.
//!
//! # What a crash leaves
//! Nothing of its own: it holds no state.

use std::path::PathBuf;

use super::RestoreError;
use crate::bucket::Part;
use crate::manifest::ObjectEntry;

/// One object and where its bytes go.
#[derive(Debug, Clone)]
pub(super) struct Piece {
    pub key: String,
    pub len: u64,
    pub(super) crc: u32,
    /// Index into the layout's files (`stage::Layout`).
    pub(super) file: usize,
    /// Where the object's first byte goes in that file.
    pub offset: u64,
    /// The entry, when the object is encoded (decoded on the way in).
    pub(super) encoded: Option<ObjectEntry>,
}

/// A whole-object read of `piece`: one byte more than the manifest states, so that a longer
/// object is seen (and refused by the caller's length check, naming it) without reading more.
pub(super) fn whole_of(piece: &Piece) -> Part {
    Part::Whole {
        at_most: piece.len.saturating_add(1),
    }
}

/// Runs blocking file-system work on the blocking pool.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, RestoreError> + Send + 'static,
) -> Result<T, RestoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| RestoreError::Io {
            path: PathBuf::new(),
            source: std::io::Error::other(format!("blocking task failed: {e}")),
        })?
}
