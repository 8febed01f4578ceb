//! Downloading one encoded object (compressed or sealed, `crate::at_rest`) into its file
//! ([`decode_piece`]), checked by the decoder (stored length and CRC, plain length, plain CRC
//! or a sealed entry's keyed tag) and, where the object is a whole WAL file, by the format's
//! reader as it is written.
//!
//! # A whole object: one pass in memory
//! An object fetched by one GET (up to [`super::fetch::WHOLE_OBJECT_MAX`] stored bytes: every
//! object at the default rotation) is held as the buffers the transport delivered, and its
//! plain bytes are made as they are read: [`Decoding`] pushes about [`FEED`] stored bytes at a
//! time through the decoder, hands the plain bytes out as a [`Read`], and writes each run of
//! them to the file (about [`WRITE_GROUP`] bytes a `pwrite`) once the reader has passed it,
//! while it is still in the cache.
//!
//! # Memory
//! The plain bytes held are those one feed of stored bytes decodes to and the reader has not
//! yet passed, and never more than [`PENDING_MAX`]: a feed of zstd may decode to up to
//! 32,768 times its size (`crate::at_rest::bounds`), so once a feed's plain bytes pass
//! [`PENDING_MAX`], those in memory and every later one of that feed go straight to the file,
//! and the reader reads them back from it (this one case writes bytes before the reader has
//! seen them; the reader still sees every byte, from the page cache). So an object costs its
//! stored bytes (counted against the restore's budget), [`PENDING_MAX`] of plain bytes and
//! the zstd window (at most 2^`ZSTD_WINDOW_LOG_MAX`), whatever its entry claims; an entry
//! claiming more plain bytes than its stored bytes can decode to is refused by the decoder
//! before any byte is written, naming the object.
//!
//! When the object is the whole of its file and that file is an archive or `wal.bin`, the
//! reader is the format's own (`check_wal`, as in `super::readback::check_file`), as for a raw
//! object in [`super::fetch`]: its CRC-32 of every plain byte is the plain CRC the decoder
//! checks against the entry (the decoder itself hashes no plain byte:
//! `Decoder::plain_crc_by_caller`), and its answer is the file's read-back. That file is then
//! not read again from disk: DESIGN.md §6 asks that the restored files be read back with the
//! format's reader, and this reader runs over exactly the bytes written to the file, in the
//! order written, each byte written only after the reader saw it (but for a feed that decodes
//! past [`PENDING_MAX`], whose bytes the reader reads back from the file: see "Memory"); a
//! second reading from the page cache would see the same bytes. Any other whole object (a snapshot, a side file, one
//! segment of several in `wal.bin`) is decoded the same way with a plain CRC pass in place of
//! the reader, and its file is read back from disk by `super::stage`.
//!
//! Errors keep their order of precedence: a stored byte that does not decode or authenticate
//! fails with the decoder's error naming the object, whatever the reader had said of the
//! bytes before it; a reader that finds no WAL file is drained to the end first, so that a
//! stored CRC or tag mismatch (naming the object) wins over the format's complaint.
//!
//! # A larger object: ranges in order
//! An object fetched by ranges is GET [`DECODE_AHEAD`] ranges ahead, in order, and its plain
//! bytes are written as they come (on the blocking pool); the decoder counts the plain CRC,
//! and `super::stage` reads the file back from disk.

use std::cell::RefCell;
use std::fs::File;
use std::io::{self, Read, Write};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;

use super::RestoreError;
use super::fetch::{WRITE_GROUP, ranges, wal_reading, write_error};
use super::piece::{Piece, blocking, whole_of};
use super::readback::{FileCheck, FileKind};
use crate::at_rest::AtRestError;
use crate::at_rest::decode::{Decoder, Ended};
use crate::at_rest::seal::GenerationKey;
use crate::bucket::{Bucket, Part};
use crate::manifest::ObjectEntry;
use crate::store::format::{CHECK_CHUNK, check_wal};

/// Ranges of one encoded object in flight at once (they are decoded in order).
pub const DECODE_AHEAD: usize = 3;
/// Stored bytes pushed through the decoder at a time, in the one-pass decoding.
pub const FEED: usize = 256 << 10;
/// Plain bytes of one feed held in memory at most in the one-pass decoding; the rest of that
/// feed's plain bytes go straight to the file (see "Memory" in the module docs).
pub const PENDING_MAX: usize = 4 << 20;

/// Bytes of GET responses one encoded object of `len` stored bytes holds in memory at most:
/// all of them when it is one GET, else its [`DECODE_AHEAD`] largest ranges. (Its plain bytes
/// are held a few hundred KiB at a time, see the module docs.)
pub(super) fn held_bytes(len: u64) -> u64 {
    let mut sizes: Vec<u64> = ranges(len).iter().map(|r| r.end - r.start).collect();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    sizes.iter().take(DECODE_AHEAD).sum()
}

/// Writes at increasing offsets of a file.
struct FileAt {
    file: Arc<File>,
    pos: u64,
}

impl Write for FileAt {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file.write_all_at(buf, self.pos)?;
        self.pos += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
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

/// Fetches an encoded object into its file at its offset; the decoder checks stored and plain
/// length and CRC (see the module docs). `whole_file`: the object is all of the file at that
/// path (relative to the store). Returns the file's read-back when the format's reader ran
/// over the plain bytes as they were written.
pub(super) async fn decode_piece(
    bucket: &dyn Bucket,
    piece: &Piece,
    entry: &ObjectEntry,
    key: Option<GenerationKey>,
    cached: Option<Bytes>,
    file: Arc<File>,
    whole_file: Option<PathBuf>,
) -> Result<Option<FileCheck>, RestoreError> {
    let rs = match &cached {
        Some(_) => std::iter::once(0..piece.len).collect(),
        None => ranges(piece.len),
    };
    if rs.len() > 1 {
        return decode_ranges(bucket, piece, entry, key, rs, file).await;
    }
    let started = std::time::Instant::now();
    let stored = match cached {
        Some(b) => vec![b],
        None => bucket.get_buffers(&piece.key, whole_of(piece)).await?,
    };
    check_stored_len(piece, 0..piece.len, &stored)?;
    let fetched = started.elapsed();
    let (entry, offset) = (entry.clone(), piece.offset);
    let check =
        blocking(move || decode_whole(&entry, key.as_ref(), &stored, file, offset, whole_file))
            .await?;
    tracing::debug!(
        key = %piece.key,
        bytes = piece.len,
        get = ?fetched,
        decode = ?(started.elapsed() - fetched),
        "decoded"
    );
    Ok(check)
}

fn check_stored_len(piece: &Piece, r: Range<u64>, data: &[Bytes]) -> Result<(), RestoreError> {
    let got: u64 = data.iter().map(|b| b.len() as u64).sum();
    if got == r.end - r.start {
        return Ok(());
    }
    Err(RestoreError::BadObject {
        key: piece.key.clone(),
        detail: format!(
            "{got} bytes at {}, the manifest states {} in all",
            r.start, piece.len
        ),
    })
}

/// The one-pass decoding of a whole object held in `stored` (see the module docs). Blocking.
fn decode_whole(
    entry: &ObjectEntry,
    key: Option<&GenerationKey>,
    stored: &[Bytes],
    file: Arc<File>,
    offset: u64,
    whole_file: Option<PathBuf>,
) -> Result<Option<FileCheck>, RestoreError> {
    let mut d = Decoding::new(entry, key, stored, file.clone(), offset)?;
    let wal = whole_file
        .as_deref()
        .filter(|rel| matches!(FileKind::of(rel), Ok(FileKind::Archive(_) | FileKind::Wal)));
    let Some(rel) = wal else {
        let mut hasher = crc32fast::Hasher::new();
        d.drain(Some(&mut hasher)).map_err(|e| d.error(e))?;
        d.finish(hasher.finalize())?;
        return Ok(None);
    };
    let checked = check_wal(&mut d, CHECK_CHUNK, &mut Vec::new());
    if let Some(e) = d.failed.take() {
        return Err(at_rest_error(e));
    }
    match wal_reading(checked, entry.plain_len(), rel, &entry.key, offset)? {
        Some((crc, check)) => {
            d.finish(crc)?;
            Ok(check)
        }
        // Not a WAL file: the decoder's checks first, from a CRC of the bytes as written.
        None => {
            d.drain(None).map_err(|e| d.error(e))?;
            let crc = crc_of_file(&file, offset, entry.plain_len()).map_err(write_error(offset))?;
            d.finish(crc)?;
            Ok(None)
        }
    }
}

/// The CRC-32 of `len` bytes of `file` from `offset` (the rare path of [`decode_whole`]).
fn crc_of_file(file: &File, mut offset: u64, len: u64) -> io::Result<u32> {
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; CHECK_CHUNK];
    let end = offset + len;
    while offset < end {
        let want = usize::try_from(end - offset).map_or(buf.len(), |n| n.min(buf.len()));
        let n = file.read_at(&mut buf[..want], offset)?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        hasher.update(&buf[..n]);
        offset += n as u64;
    }
    Ok(hasher.finalize())
}

/// The decoder's output in the one-pass decoding (see "Memory" in the module docs): plain
/// bytes in memory, then, once more than [`PENDING_MAX`] came of one feed, bytes already on
/// the file that the reader has not passed yet.
#[derive(Clone)]
struct Pending(Rc<RefCell<Output>>);

struct Output {
    file: Arc<File>,
    /// Plain bytes from file offset `base`; `mem[..written]` are on the file.
    mem: Vec<u8>,
    base: u64,
    written: usize,
    /// Bytes written straight to the file after `mem` (from `base + mem.len()`), not yet read.
    spilled: u64,
}

impl Output {
    /// Where the next plain byte goes.
    fn end(&self) -> u64 {
        self.base + crate::units::u64_len(self.mem.len()) + self.spilled
    }
}

impl Write for Pending {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut o = self.0.borrow_mut();
        if o.spilled == 0 && o.mem.len() + buf.len() <= PENDING_MAX {
            o.mem.extend_from_slice(buf);
            return Ok(buf.len());
        }
        if o.spilled == 0 {
            // From here on every byte of this feed is on the file: what is in memory first.
            let at = o.base + crate::units::u64_len(o.written);
            o.file.write_all_at(&o.mem[o.written..], at)?;
            o.written = o.mem.len();
        }
        let at = o.end();
        o.file.write_all_at(buf, at)?;
        o.spilled += crate::units::u64_len(buf.len());
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The plain bytes of a whole object, decoded from `stored` as they are read and written to
/// the file behind the reading (see the module docs).
struct Decoding<'a> {
    /// The object's key, for an error.
    key: &'a str,
    stored: &'a [Bytes],
    /// The next stored byte to decode: buffer `next`, byte `at` in it.
    next: usize,
    at: usize,
    decoder: Option<Decoder<Pending>>,
    ended: Option<Ended<Pending>>,
    /// The decoder's error, once it failed (the reader sees a plain I/O error).
    failed: Option<AtRestError>,
    pending: Pending,
    /// Bytes of this feed handed out: `mem` first, then the spilled bytes.
    read: u64,
}

impl<'a> Decoding<'a> {
    fn new(
        entry: &'a ObjectEntry,
        key: Option<&GenerationKey>,
        stored: &'a [Bytes],
        file: Arc<File>,
        offset: u64,
    ) -> Result<Self, RestoreError> {
        let pending = Pending(Rc::new(RefCell::new(Output {
            file,
            mem: Vec::new(),
            base: offset,
            written: 0,
            spilled: 0,
        })));
        let decoder =
            Decoder::plain_crc_by_caller(entry, key, pending.clone()).map_err(at_rest_error)?;
        Ok(Decoding {
            key: &entry.key,
            stored,
            next: 0,
            at: 0,
            decoder: Some(decoder),
            ended: None,
            failed: None,
            pending,
            read: 0,
        })
    }

    /// Where the next plain byte handed out is (for a write error).
    fn pos(&self) -> u64 {
        self.pending.0.borrow().base + self.read
    }

    /// Writes the bytes of `mem` handed out and not yet written.
    fn write_read(&mut self) -> io::Result<()> {
        let mut o = self.pending.0.borrow_mut();
        let upto = crate::units::usize_of(self.read).min(o.mem.len());
        if upto > o.written {
            let at = o.base + crate::units::u64_len(o.written);
            o.file.write_all_at(&o.mem[o.written..upto], at)?;
            o.written = upto;
        }
        Ok(())
    }

    /// Once every pending byte is handed out: writes them, and decodes the next stored bytes
    /// (or ends the decoder). `false` when the decoder had ended already.
    fn refill(&mut self) -> io::Result<bool> {
        self.write_read()?;
        {
            let mut o = self.pending.0.borrow_mut();
            o.base = o.end();
            o.mem.clear();
            (o.written, o.spilled) = (0, 0);
        }
        self.read = 0;
        let Some(decoder) = self.decoder.as_mut() else {
            return Ok(false);
        };
        while self
            .stored
            .get(self.next)
            .is_some_and(|b| self.at == b.len())
        {
            (self.next, self.at) = (self.next + 1, 0);
        }
        let step = match self.stored.get(self.next) {
            Some(b) => {
                let n = (b.len() - self.at).min(FEED);
                let r = decoder.write_stored(&b[self.at..self.at + n]);
                self.at += n;
                r
            }
            None => match self.decoder.take().map(Decoder::end) {
                Some(Ok(ended)) => {
                    self.ended = Some(ended);
                    Ok(())
                }
                Some(Err(e)) => Err(e),
                None => Ok(()),
            },
        };
        step.map(|()| true).map_err(|e| {
            self.decoder = None;
            self.failed = Some(e);
            io::Error::other("the object does not decode")
        })
    }

    /// Reads every plain byte left, hashing it into `hasher` if given, and writes it.
    fn drain(&mut self, mut hasher: Option<&mut crc32fast::Hasher>) -> io::Result<()> {
        let mut buf = Vec::new();
        loop {
            if let Some(h) = hasher.as_deref_mut() {
                loop {
                    let o = self.pending.0.borrow();
                    let mem = crate::units::u64_len(o.mem.len());
                    if self.read < mem {
                        h.update(&o.mem[crate::units::usize_of(self.read)..]);
                        self.read = mem;
                        continue;
                    }
                    // Spilled bytes: read back from the file, a chunk at a time.
                    let left = mem + o.spilled - self.read;
                    if left == 0 {
                        break;
                    }
                    buf.resize(crate::units::usize_of(left.min(CHECK_CHUNK as u64)), 0);
                    o.file.read_exact_at(&mut buf, o.base + self.read)?;
                    h.update(&buf);
                    self.read += crate::units::u64_len(buf.len());
                }
            } else {
                let o = self.pending.0.borrow();
                self.read = crate::units::u64_len(o.mem.len()) + o.spilled;
            }
            if !self.refill()? {
                return Ok(());
            }
        }
    }

    /// The error of a failed read: the decoder's if it failed, else a write error.
    fn error(&mut self, e: io::Error) -> RestoreError {
        match self.failed.take() {
            Some(e) => at_rest_error(e),
            None => write_error(self.pos())(e),
        }
    }

    /// After the last plain byte was read: the decoder's check of `plain_crc`.
    fn finish(mut self, plain_crc: u32) -> Result<(), RestoreError> {
        if let Some(e) = self.failed.take() {
            return Err(at_rest_error(e));
        }
        let ended = self.ended.take().ok_or_else(|| RestoreError::BadObject {
            key: self.key.to_string(),
            detail: "the decoding stopped before the end of the object".into(),
        })?;
        ended
            .check_with(plain_crc)
            .map(|_| ())
            .map_err(at_rest_error)
    }
}

impl Read for Decoding<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        loop {
            let n = {
                let o = self.pending.0.borrow();
                let mem = crate::units::u64_len(o.mem.len());
                if self.read < mem {
                    let from = crate::units::usize_of(self.read);
                    let n = out.len().min(o.mem.len() - from);
                    out[..n].copy_from_slice(&o.mem[from..from + n]);
                    n
                } else if self.read < mem + o.spilled {
                    // On the file already (a feed that decoded to more than PENDING_MAX).
                    let left = mem + o.spilled - self.read;
                    let n = out.len().min(crate::units::usize_of(left));
                    o.file.read_exact_at(&mut out[..n], o.base + self.read)?;
                    n
                } else {
                    0
                }
            };
            if n > 0 || out.is_empty() {
                self.read += crate::units::u64_len(n);
                let written = crate::units::u64_len(self.pending.0.borrow().written);
                if self.read.saturating_sub(written) >= WRITE_GROUP as u64 {
                    self.write_read()?;
                }
                return Ok(n);
            }
            if !self.refill()? {
                return Ok(0);
            }
        }
    }
}

/// Fetches an encoded object's ranges `rs` in order ([`DECODE_AHEAD`] in flight), decoding
/// them into its file at its offset; the decoder checks stored and plain length and CRC.
async fn decode_ranges(
    bucket: &dyn Bucket,
    piece: &Piece,
    entry: &ObjectEntry,
    key: Option<GenerationKey>,
    rs: Vec<Range<u64>>,
    file: Arc<File>,
) -> Result<Option<FileCheck>, RestoreError> {
    let out = FileAt {
        file,
        pos: piece.offset,
    };
    let mut decoder = Some(Decoder::new(entry, key.as_ref(), out).map_err(at_rest_error)?);
    let last = rs.len() - 1;
    let mut fetched = futures::stream::iter(rs.into_iter().enumerate())
        .map(|(i, r)| async move {
            // The last range asks for one byte more, to notice an object longer than stated.
            let end = if i == last { r.end + 1 } else { r.end };
            let data = bucket
                .get_buffers(&piece.key, Part::Range(r.start..end))
                .await?;
            Ok::<_, RestoreError>((r, data))
        })
        .buffered(DECODE_AHEAD);
    while let Some(next) = fetched.next().await {
        let (r, data) = next?;
        check_stored_len(piece, r, &data)?;
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
    blocking(move || d.finish().map(|_| None).map_err(at_rest_error)).await
}
