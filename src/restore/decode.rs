//! Downloading one encoded object ([`decode_piece`]): its ranges in order, [`DECODE_AHEAD`]
//! in flight, pushed through the at-rest decoder into its file (see [`super::stage`]).

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;

use super::RestoreError;
use super::fetch::ranges;
use super::stage::{Piece, blocking};
use crate::at_rest::AtRestError;
use crate::at_rest::decode::Decoder;
use crate::bucket::Bucket;
use crate::manifest::ObjectEntry;

/// Ranges of one encoded object in flight at once (they are decoded in order).
pub const DECODE_AHEAD: usize = 3;

/// Writes at increasing offsets of a file.
struct FileAt {
    file: Arc<File>,
    pos: u64,
}

impl std::io::Write for FileAt {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.file.write_all_at(buf, self.pos)?;
        self.pos += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn at_rest_error(e: AtRestError) -> RestoreError {
    match e {
        AtRestError::Io { key, what, source } => RestoreError::Io {
            path: PathBuf::from(format!("({what} of {key})")),
            source,
        },
        AtRestError::Corrupt { key, detail } => RestoreError::BadObject { key, detail },
        AtRestError::Sealed { key } => RestoreError::Key {
            detail: format!("{key} is encrypted and no key for its generation was opened"),
        },
        e @ (AtRestError::Changed { .. } | AtRestError::Settings { .. }) => {
            RestoreError::BadObject {
                key: String::new(),
                detail: e.to_string(),
            }
        }
    }
}

/// Fetches an encoded object's ranges in order ([`DECODE_AHEAD`] in flight), decoding them
/// into its file at its offset; the decoder checks stored and plain length and CRC.
pub(super) async fn decode_piece(
    bucket: &dyn Bucket,
    piece: &Piece,
    entry: &ObjectEntry,
    key: Option<crate::at_rest::seal::GenerationKey>,
    cached: Option<Bytes>,
    file: Arc<File>,
) -> Result<(), RestoreError> {
    let out = FileAt {
        file,
        pos: piece.offset,
    };
    let mut decoder = Some(Decoder::new(entry, key.as_ref(), out).map_err(at_rest_error)?);
    let ranges: Vec<Range<u64>> = match &cached {
        Some(_) => std::iter::once(0..piece.len).collect(),
        None => ranges(piece.len),
    };
    let last = ranges.len() - 1;
    let mut fetched = futures::stream::iter(ranges.into_iter().enumerate())
        .map(|(i, r)| {
            let cached = cached.clone();
            async move {
                if let Some(b) = cached {
                    return Ok::<_, RestoreError>((r, vec![b]));
                }
                // The last range asks for one byte more, to notice an object longer than stated.
                let end = if i == last { r.end + 1 } else { r.end };
                let whole = i == 0 && last == 0;
                let data = bucket
                    .get_buffers(&piece.key, (!whole).then_some(r.start..end))
                    .await?;
                Ok((r, data))
            }
        })
        .buffered(DECODE_AHEAD);
    while let Some(next) = fetched.next().await {
        let (r, data) = next?;
        let got: u64 = data.iter().map(|b| b.len() as u64).sum();
        if got != r.end - r.start {
            return Err(RestoreError::BadObject {
                key: piece.key.clone(),
                detail: format!(
                    "{got} bytes at {}, the manifest states {} in all",
                    r.start, piece.len
                ),
            });
        }
        let mut d = decoder.take().expect("decoder is put back");
        decoder = Some(
            blocking(move || {
                for b in &data {
                    d.write_stored(b).map_err(at_rest_error)?;
                }
                Ok(d)
            })
            .await?,
        );
    }
    let d = decoder.take().expect("decoder is put back");
    blocking(move || d.finish().map(|_| ()).map_err(at_rest_error)).await
}
