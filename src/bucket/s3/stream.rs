//! A file range sent as a `PutObject` body straight from its descriptor, checked against the
//! CRC-32 it was given with.
//!
//! The range is read a piece at a time with `pread` on the blocking pool, one piece ahead of
//! the socket, and each piece is hashed right after its read, while it is in the cache. Nothing
//! of the range is held in memory beyond the piece being sent and the one being read. The
//! request carries the stated CRC-32 as its `x-amz-checksum-crc32` header, so S3 checks the
//! bytes it receives, and the SDK neither hashes the body again nor (a streamed body being
//! unsigned, as the SDK sends every streamed body) computes its SHA-256.
//!
//! The last piece is held back until the CRC of the whole range is known: if it is not the
//! stated one (the file changed after it was checked), the body ends in an error instead, the
//! request never carries all of its `Content-Length` bytes, and no store can complete it. So a
//! changed file leaves no object, whether or not the store checks checksums itself (moto, for
//! one, does not). [`Outcome`] tells the caller why a body failed, so that the failure is
//! reported as what it is (determinate: the object was not written) rather than as a dropped
//! connection.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use tokio::task::JoinHandle;

use crate::bucket::body::{check_crc32, pread};

/// Bytes read (and sent) at a time: large enough that the hops to the blocking pool cost
/// nothing next to the copy, small enough that a piece is hashed while it is in the cache.
const PIECE: u64 = 256 << 10;

/// Why a body stopped early, for the caller to report once the request has failed.
#[derive(Debug, Clone, Default)]
pub(super) struct Outcome(Arc<Mutex<Option<String>>>);

impl Outcome {
    fn fail(&self, why: String) -> io::Error {
        let err = io::Error::new(io::ErrorKind::InvalidData, why.clone());
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
        err
    }

    /// The reason the body failed, if it did.
    pub(super) fn failure(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// `[offset, offset + len)` of `file`, streamed; see the module docs.
pub(super) struct FileBody {
    file: Arc<std::fs::File>,
    /// Where the next read starts, and where the range ends (absolute offsets).
    next: u64,
    end: u64,
    /// Bytes not yet handed to the socket.
    unsent: u64,
    stated: u32,
    /// The CRC of what was read so far; with the read in flight while one is.
    crc: Option<crc32fast::Hasher>,
    reading: Option<JoinHandle<io::Result<(Bytes, crc32fast::Hasher)>>>,
    outcome: Outcome,
}

impl FileBody {
    pub(super) fn new(
        file: Arc<std::fs::File>,
        offset: u64,
        len: u64,
        stated: u32,
        outcome: Outcome,
    ) -> FileBody {
        FileBody {
            file,
            next: offset,
            end: offset + len,
            unsent: len,
            stated,
            crc: Some(crc32fast::Hasher::new()),
            reading: None,
            outcome,
        }
    }

    /// Starts reading the next piece (and hashing it) on the blocking pool.
    fn read_next(&mut self) {
        let (file, at) = (self.file.clone(), self.next);
        let n = PIECE.min(self.end - at);
        let mut crc = self.crc.take().expect("one read at a time");
        self.next += n;
        self.reading = Some(tokio::task::spawn_blocking(move || {
            let piece = pread(&file, at, n)?;
            crc.update(&piece);
            Ok((piece, crc))
        }));
    }
}

impl http_body::Body for FileBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = self.get_mut();
        if this.reading.is_none() {
            if this.unsent == 0 {
                return Poll::Ready(None);
            }
            this.read_next();
        }
        let reading = this.reading.as_mut().expect("started above");
        let read = ready!(Pin::new(reading).poll(cx));
        this.reading = None;
        let (piece, crc) = match read {
            Ok(Ok(read)) => read,
            Ok(Err(e)) => return Poll::Ready(Some(Err(this.outcome.fail(e.to_string())))),
            Err(e) => return Poll::Ready(Some(Err(this.outcome.fail(e.to_string())))),
        };
        if this.next < this.end {
            this.crc = Some(crc);
            this.read_next();
        } else if let Err(why) = check_crc32(this.stated, crc.finalize()) {
            // The last piece: sent only if the whole range matches.
            return Poll::Ready(Some(Err(this.outcome.fail(why))));
        }
        this.unsent -= piece.len() as u64;
        Poll::Ready(Some(Ok(Frame::data(piece))))
    }

    fn is_end_stream(&self) -> bool {
        self.unsent == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.unsent)
    }
}
