//! Fetching one raw object, or one range of a large one, into its file ([`fetch_chunk`]):
//! which GETs an object takes ([`ranges`]), and how the response's bytes reach the disk and
//! are checked, each byte looked at once while it is in the cache.
//!
//! # One pass over the bytes
//! A response is kept in the buffers the transport delivered (`Bucket::get_buffers`: no copy
//! into one buffer, and no response checksum of the SDK's: the manifest's CRC is ours) and
//! written with positioned, vectored writes of about [`WRITE_GROUP`] bytes each (a single
//! `pwrite` of a whole 16 MiB object costs this machine's kernel several times the CPU of
//! the same bytes in 256 KiB writes). The CRC-32 the manifest states is computed over those
//! buffers once.
//!
//! When the chunk is the whole of its file (an archive, and `wal.bin` when it is one object),
//! the format's reader ([`check_wal`], the same reader as `super::readback::check_file`) runs
//! over the buffers instead, and each group of them is written as soon as the reader has
//! passed it: the reader's CRC-32 of every byte is the object's CRC, checked against the
//! manifest, and its answer is the file's read-back. That file is then not read again from
//! disk: the read-back DESIGN.md §6 asks for is the format's reader over exactly the bytes
//! written to the file, computed once, rather than a second reading of them from the page
//! cache (which would see the same bytes). A write error fails the chunk. An encoded object
//! fetched by one GET gets the same pass over its decoded bytes (`super::decode`). Every other
//! file (a snapshot, a `wal.bin` of several segments, an object fetched by ranges) is read
//! back from disk as before (`super::stage`). Reading a ranged file in order behind its
//! download instead was tried (ranges complete out of order, so each kept its buffers and
//! budget until the reader passed it): no faster at 4 GiB, where the disk binds, and one of
//! its 1 GiB restores took 3.1 s against 1.5 s for every run of this build (ranges waiting
//! for a reader the 2-core machine has descheduled hold budget the download needs; the cause
//! was not proven). The read-back from the page cache stays.
//!
//! # One writer at a time per file
//! The ranges of one large object complete in parallel, but their writes into the file take
//! turns (a lock per file, held for one range's writes, its CRC computed before): buffered
//! writes to one ext4 file are serialised by the kernel anyway (the inode's lock), and a
//! writer waiting there spins on the CPU while the holder copies (`rwsem_spin_on_owner`:
//! 11 % of a 4 GiB restore's samples in `perf`, on a 2-core machine where the server and the
//! network want that core). Waiting on our lock sleeps: in the same profile with turns,
//! nothing spins and the restore's CPU fell from 6.0 to 4.1 s; over three restores of each
//! build, wall and CPU differed by less than this machine's run-to-run spread (4.5-5.8 s wall,
//! 4.0-4.8 s CPU, both). Kept because it removes the spinning, not for a measured speed-up.
//! (Starting each range's writeback as it lands, `sync_file_range`, was tried too and taken
//! out: two sets of three alternating 4 GiB restores averaged 7.1 and 7.7 s with it, 7.5 and
//! 6.8 s without.)
//!
//! Nothing here fsyncs: the caller fsyncs each file once all its pieces are written.

use std::fs::File;
use std::io::{IoSlice, Read};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;

use super::RestoreError;
use super::piece::{Piece, blocking, whole_of};
use super::readback::{FileCheck, FileKind};
use crate::bucket::{Bucket, Part};
use crate::store::format::{CHECK_CHUNK, CheckError, WalCheck, check_wal};

/// Objects up to this size are fetched by one whole-object GET (see "How objects are
/// fetched" in the docs of [`super::stage`]).
pub const WHOLE_OBJECT_MAX: u64 = 64 << 20;
/// Larger objects are fetched by ranged GETs of this size, in parallel; a tail shorter than
/// half of it joins the range before it.
pub const RANGE_CHUNK: u64 = 16 << 20;
/// Bytes of GET responses in flight (held in memory until written) at once. 256 MiB let a
/// 4 GiB restore of 256 MiB archives peak at 313 MiB resident (the allocator's arenas keep
/// more than is in flight); at 128 MiB it peaked at 174 MiB and restored as fast, the server
/// and the page cache, not the number of responses held, setting the pace.
pub const BYTES_IN_FLIGHT: u64 = 128 << 20;
/// Bytes of one positioned write (more only where one buffer is larger).
pub const WRITE_GROUP: usize = 256 << 10;

/// The byte ranges an object of `len` bytes is fetched by, in order: one (the whole object)
/// up to [`WHOLE_OBJECT_MAX`], else [`RANGE_CHUNK`]s with a short tail folded into the last.
pub fn ranges(len: u64) -> Vec<Range<u64>> {
    if len <= WHOLE_OBJECT_MAX {
        return std::iter::once(0..len).collect();
    }
    let mut out = Vec::new();
    let mut start = 0;
    while start < len {
        let mut end = (start + RANGE_CHUNK).min(len);
        if len - end < RANGE_CHUNK / 2 {
            end = len;
        }
        out.push(start..end);
        start = end;
    }
    out
}

/// Permits of [`BYTES_IN_FLIGHT`] (in MiB) that a response of `len` bytes takes: at least one,
/// at most all.
pub(super) fn budget_permits(len: u64) -> u32 {
    let mib = len.div_ceil(1 << 20).max(1);
    u32::try_from(mib.min(BYTES_IN_FLIGHT >> 20)).unwrap_or(u32::MAX)
}

/// One GET: a whole object, or one range of a large one.
#[derive(Debug, Clone)]
pub(super) struct Chunk {
    pub piece: usize,
    pub index: usize,
    pub range: Range<u64>,
    pub whole: bool,
}

/// What one fetched chunk leaves: the CRC state of its bytes, and, when it was the whole of
/// its file and the format's reader ran over it, the file's read-back.
pub(super) struct Fetched {
    pub hasher: crc32fast::Hasher,
    pub check: Option<FileCheck>,
}

/// Fetches one chunk, checks its length, writes it at its offset (see the module docs) when
/// it is the file's `turn`; `whole_file`: the chunk is all of the file at that path
/// (relative to the store).
pub(super) async fn fetch_chunk(
    bucket: &dyn Bucket,
    piece: &Piece,
    c: &Chunk,
    cached: Option<Bytes>,
    (file, turn): (Arc<File>, Arc<Mutex<()>>),
    whole_file: Option<PathBuf>,
) -> Result<Fetched, RestoreError> {
    let bufs = match cached {
        Some(b) => vec![b],
        None if c.whole => bucket.get_buffers(&piece.key, whole_of(piece)).await?,
        None => {
            // The last range asks for one byte more, to notice an object longer than stated.
            let end = if c.range.end == piece.len {
                piece.len + 1
            } else {
                c.range.end
            };
            bucket
                .get_buffers(&piece.key, Part::Range(c.range.start..end))
                .await?
        }
    };
    let want = c.range.end - c.range.start;
    let got: u64 = bufs.iter().map(|b| b.len() as u64).sum();
    if got != want {
        let detail = if got > want {
            format!("longer than the {} bytes the manifest states", piece.len)
        } else {
            format!(
                "{} bytes, the manifest states {}",
                c.range.start + got,
                piece.len
            )
        };
        return Err(RestoreError::BadObject {
            key: piece.key.clone(),
            detail,
        });
    }
    let offset = piece.offset + c.range.start;
    let key = piece.key.clone();
    blocking(move || match whole_file {
        Some(rel) if matches!(FileKind::of(&rel), Ok(FileKind::Archive(_) | FileKind::Wal)) => {
            check_while_writing(&file, offset, &bufs, &rel, &key)
        }
        _ => {
            let mut hasher = crc32fast::Hasher::new();
            let mut w = WriteBehind::new(&file, offset, &bufs);
            for b in &bufs {
                hasher.update(b);
            }
            // A poisoned lock only says another writer panicked; the turn is still ours.
            let _turn = turn.lock().unwrap_or_else(PoisonError::into_inner);
            w.write_all().map_err(write_error(offset))?;
            Ok(Fetched {
                hasher,
                check: None,
            })
        }
    })
    .await
}

pub(super) fn write_error(offset: u64) -> impl FnOnce(std::io::Error) -> RestoreError {
    move |source| RestoreError::Io {
        path: PathBuf::from(format!("(file at offset {offset})")),
        source,
    }
}

/// The format's reader over `bufs` (a whole WAL file, `rel`), writing them behind it.
fn check_while_writing(
    file: &File,
    offset: u64,
    bufs: &[Bytes],
    rel: &Path,
    key: &str,
) -> Result<Fetched, RestoreError> {
    let mut w = WriteBehind::new(file, offset, bufs);
    let checked = check_wal(&mut w, CHECK_CHUNK, &mut Vec::new());
    // Written in full whatever the reader said (it reads to the end unless a read failed).
    w.write_all().map_err(write_error(offset))?;
    let len = bufs.iter().map(|b| b.len() as u64).sum();
    match wal_reading(checked, len, rel, key, offset)? {
        Some((crc, check)) => Ok(Fetched {
            hasher: crc32fast::Hasher::new_with_initial_len(crc, len),
            check,
        }),
        None => {
            let mut hasher = crc32fast::Hasher::new();
            bufs.iter().for_each(|b| hasher.update(b));
            Ok(Fetched {
                hasher,
                check: None,
            })
        }
    }
}

/// What the format's reader over the `len` bytes of a whole WAL file `rel` (the object `key`,
/// at `offset` of its file) says, as the caller needs it: the CRC-32 of every byte and the
/// file's read-back, or `Ok(None)` when the bytes are not a WAL file. Then the caller computes
/// their CRC itself (a mismatch with the manifest is the better error) and leaves the reading
/// to the read-back from disk, which reports the format's complaint. The read-back is also
/// left to the disk (`Some((crc, None))`) for an archive whose header names another number,
/// so that the complaint is worded as `check_file` words it.
pub(super) fn wal_reading(
    checked: Result<WalCheck, CheckError>,
    len: u64,
    rel: &Path,
    key: &str,
    offset: u64,
) -> Result<Option<(u32, Option<FileCheck>)>, RestoreError> {
    let check = match checked {
        Ok(check) => check,
        Err(CheckError::Io(source)) => return Err(write_error(offset)(source)),
        Err(CheckError::Format(_)) => return Ok(None),
    };
    if check.len != len {
        return Err(RestoreError::BadObject {
            key: key.to_string(),
            detail: format!("the reader saw {} of its {len} bytes", check.len),
        });
    }
    if let Ok(FileKind::Archive(number)) = FileKind::of(rel)
        && check.header.number != number
    {
        return Ok(Some((check.crc, None)));
    }
    Ok(Some((
        check.crc,
        Some(FileCheck::Wal {
            header: check.header,
            last_seq: check.last_seq,
        }),
    )))
}

/// Hands `bufs` out in order as a [`Read`], and writes them to `file` (the first at
/// `offset`) in positioned writes of about [`WRITE_GROUP`] bytes as soon as they have been
/// read past: each buffer is written while the reader's pass has it in the cache.
struct WriteBehind<'a> {
    file: &'a File,
    bufs: &'a [Bytes],
    /// The reading position: buffer `i`, byte `pos` in it.
    i: usize,
    pos: usize,
    /// `bufs[..written]` are on the file; the next one goes at `at`.
    written: usize,
    at: u64,
}

impl<'a> WriteBehind<'a> {
    fn new(file: &'a File, offset: u64, bufs: &'a [Bytes]) -> Self {
        WriteBehind {
            file,
            bufs,
            i: 0,
            pos: 0,
            written: 0,
            at: offset,
        }
    }

    /// Writes the buffers read past, once they make a group (or `all`: every one read past).
    fn write_read(&mut self, all: bool) -> std::io::Result<()> {
        loop {
            let mut end = self.written;
            let mut bytes = 0;
            while end < self.i && bytes < WRITE_GROUP && end - self.written < 512 {
                bytes += self.bufs[end].len();
                end += 1;
            }
            if end == self.written || (bytes < WRITE_GROUP && !all) {
                return Ok(());
            }
            write_all_vectored_at(self.file, &self.bufs[self.written..end], self.at)?;
            self.at += bytes as u64;
            self.written = end;
        }
    }

    /// Writes every buffer not written yet, read or not.
    fn write_all(&mut self) -> std::io::Result<()> {
        self.i = self.bufs.len();
        self.pos = 0;
        self.write_read(true)
    }
}

impl Read for WriteBehind<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.i < self.bufs.len() && self.pos == self.bufs[self.i].len() {
            self.i += 1;
            self.pos = 0;
            self.write_read(false)?;
        }
        let Some(b) = self.bufs.get(self.i) else {
            self.write_read(true)?;
            return Ok(0);
        };
        let n = out.len().min(b.len() - self.pos);
        out[..n].copy_from_slice(&b[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// `pwritev(2)` of every byte of `bufs` at `offset`, however many calls it takes.
fn write_all_vectored_at(file: &File, bufs: &[Bytes], mut offset: u64) -> std::io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = bufs.iter().map(|b| IoSlice::new(b)).collect();
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        // At most IOV_MAX (1024 on Linux) slices a call.
        let count = rest.len().min(1024);
        match rustix::io::pwritev(file, &rest[..count], offset) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                offset += n as u64;
                IoSlice::advance_slices(&mut rest, n);
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
