//! The store's on-disk formats: WAL files, snapshot files and the `wal.position` record.
//!
//! All integers are little-endian; CRC is CRC-32 (IEEE). These formats are shared with real
//! database nodes (DESIGN.md section 2), so every decoder here treats its input as hostile:
//! a short, corrupt or oversized input is an error naming what was wrong, never a panic.
//!
//! A WAL file is a 48-byte header followed by frames. A frame is one commit:
//! `len` (u32), `crc` (u32, CRC of the `seq` bytes then the payload), `seq` (u64), payload.
//! A torn or corrupt tail (short read, bad CRC, wrong seq) ends the log: everything before it
//! counts, nothing after it. [`scan_frames`] reports where the valid prefix ends and why.

use std::fmt;

use uuid::Uuid;

/// Magic of every WAL file (`wal.bin` and archives).
pub const WAL_MAGIC: &[u8; 8] = b"MDBWAL01";
/// Magic of a snapshot file.
pub const SNAPSHOT_MAGIC: &[u8; 8] = b"MDBSNP01";
/// Magic of the `wal.position` record.
pub const POSITION_MAGIC: &[u8; 8] = b"MDBPOS01";
/// Bytes of a WAL file header.
pub const WAL_HEADER_LEN: usize = 48;
/// Bytes of a frame header (`len`, `crc`, `seq`).
pub const FRAME_HEADER_LEN: usize = 16;
/// Bytes of a snapshot header.
pub const SNAPSHOT_HEADER_LEN: usize = 60;
/// Bytes of the trailing payload CRC of a snapshot.
pub const SNAPSHOT_TRAILER_LEN: usize = 4;
/// Bytes of a `wal.position` record.
pub const POSITION_LEN: usize = 68;
/// Largest frame payload a decoder accepts; a larger `len` is corruption, not a frame.
pub const MAX_FRAME_PAYLOAD: u32 = 64 << 20;

/// What was wrong with bytes that should have been one of the store's formats.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("{what}: too short ({have} bytes, need {need})")]
    Truncated {
        what: &'static str,
        have: usize,
        need: usize,
    },
    #[error("{what}: bad magic {found:?}")]
    BadMagic { what: &'static str, found: String },
    #[error("{what}: header CRC mismatch")]
    HeaderCrc { what: &'static str },
    #[error("{what}: payload CRC mismatch")]
    PayloadCrc { what: &'static str },
    #[error("{what}: {detail}")]
    Invalid { what: &'static str, detail: String },
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn uuid_at(b: &[u8], at: usize) -> Uuid {
    Uuid::from_bytes(b[at..at + 16].try_into().expect("16 bytes"))
}

fn check_magic(what: &'static str, b: &[u8], magic: &[u8; 8]) -> Result<(), FormatError> {
    if &b[..8] != magic {
        return Err(FormatError::BadMagic {
            what,
            found: String::from_utf8_lossy(&b[..8]).into_owned(),
        });
    }
    Ok(())
}

fn need(what: &'static str, b: &[u8], need: usize) -> Result<(), FormatError> {
    if b.len() < need {
        return Err(FormatError::Truncated {
            what,
            have: b.len(),
            need,
        });
    }
    Ok(())
}

/// The header of a WAL file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalHeader {
    /// New for every WAL file.
    pub wal_id: Uuid,
    /// Position in the chain; an archive keeps its number.
    pub number: u64,
    /// Commits before this file's first frame.
    pub floor: u64,
}

impl WalHeader {
    pub fn encode(&self) -> [u8; WAL_HEADER_LEN] {
        let mut b = [0u8; WAL_HEADER_LEN];
        b[..8].copy_from_slice(WAL_MAGIC);
        b[8..24].copy_from_slice(self.wal_id.as_bytes());
        b[24..32].copy_from_slice(&self.number.to_le_bytes());
        b[32..40].copy_from_slice(&self.floor.to_le_bytes());
        let crc = crc32fast::hash(&b[..40]);
        b[40..44].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self, FormatError> {
        const WHAT: &str = "WAL header";
        need(WHAT, b, WAL_HEADER_LEN)?;
        check_magic(WHAT, b, WAL_MAGIC)?;
        if crc32fast::hash(&b[..40]) != u32_at(b, 40) {
            return Err(FormatError::HeaderCrc { what: WHAT });
        }
        let floor = u64_at(b, 32);
        if floor == u64::MAX {
            // The first frame would carry seq `floor + 1`, which does not exist.
            return Err(FormatError::Invalid {
                what: WHAT,
                detail: format!("floor {floor} leaves no seq for a frame"),
            });
        }
        Ok(Self {
            wal_id: uuid_at(b, 8),
            number: u64_at(b, 24),
            floor,
        })
    }
}

/// A frame header's payload length and seq, as laid out in the WAL: `len u32 | crc u32 | seq
/// u64` (the CRC is checked where the payload is read, [`scan_frames`]).
pub fn frame_header(b: &[u8; FRAME_HEADER_LEN]) -> (u64, u64) {
    (u64::from(u32_at(b, 0)), u64_at(b, 8))
}

/// CRC of a frame: of its `seq` bytes followed by the payload, which lie side by side in the
/// encoded frame (`seq_and_payload` is that part of it), so one pass hashes both.
pub fn frame_crc(seq_and_payload: &[u8]) -> u32 {
    crc32fast::hash(seq_and_payload)
}

/// Appends one encoded frame to `out`.
pub fn encode_frame(seq: u64, payload: &[u8], out: &mut Vec<u8>) {
    let len = u32::try_from(payload.len()).expect("frame payload fits in u32");
    out.extend_from_slice(&len.to_le_bytes());
    let crc_at = out.len();
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(payload);
    let crc = frame_crc(&out[crc_at + 4..]);
    out[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
}

/// Why a scan of frames stopped before the end of its input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TailStop {
    /// Fewer bytes than a frame header or its payload.
    Short,
    /// The frame's CRC does not match.
    BadCrc,
    /// The frame's `seq` is not the expected next one.
    WrongSeq { expected: u64, found: u64 },
    /// The frame's `len` is over [`MAX_FRAME_PAYLOAD`].
    Oversized { len: u32 },
}

impl fmt::Display for TailStop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TailStop::Short => write!(f, "short frame"),
            TailStop::BadCrc => write!(f, "frame CRC mismatch"),
            TailStop::WrongSeq { expected, found } => {
                write!(f, "frame seq {found}, expected {expected}")
            }
            TailStop::Oversized { len } => write!(f, "frame length {len} over the limit"),
        }
    }
}

/// One valid frame found by [`scan_frames`]; offsets are into the scanned buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameSpan {
    pub seq: u64,
    /// Offset of the frame header.
    pub start: usize,
    /// Offset just past the payload.
    pub end: usize,
}

impl FrameSpan {
    pub fn payload<'a>(&self, buf: &'a [u8]) -> &'a [u8] {
        &buf[self.start + FRAME_HEADER_LEN..self.end]
    }
}

/// The valid frames at the start of a buffer of frames.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameScan {
    pub frames: Vec<FrameSpan>,
    /// Bytes of the buffer covered by valid frames (a frame boundary).
    pub valid_len: usize,
    /// Seq of the last valid frame, or `first_seq - 1` (wrapping) when there is none.
    pub last_seq: u64,
    /// Why the scan stopped early; `None` when every byte was a valid frame.
    pub stop: Option<TailStop>,
}

/// Scans frames from the start of `buf`, the first expected to carry `first_seq`.
pub fn scan_frames(buf: &[u8], first_seq: u64) -> FrameScan {
    let mut frames = Vec::new();
    let run = scan_run(buf, Some(first_seq), first_seq.wrapping_sub(1), |f| {
        frames.push(f)
    });
    FrameScan {
        frames,
        valid_len: run.valid_len,
        last_seq: run.last_seq,
        stop: run.stop,
    }
}

/// How a run of frames ended: the state a scan of what follows continues from.
struct ScanRun {
    valid_len: usize,
    last_seq: u64,
    /// The seq the next frame must carry; `None` once a frame with seq `u64::MAX` was taken:
    /// nothing can follow it.
    expected: Option<u64>,
    stop: Option<TailStop>,
}

/// The frame scan itself: each valid frame from the start of `buf` to `frame`, until the
/// buffer ends or a frame is not valid. `last_seq` is what to report when no frame is valid.
fn scan_run(
    buf: &[u8],
    mut expected: Option<u64>,
    mut last_seq: u64,
    mut frame: impl FnMut(FrameSpan),
) -> ScanRun {
    let mut at = 0usize;
    let stop = loop {
        if at == buf.len() {
            break None;
        }
        if buf.len() - at < FRAME_HEADER_LEN {
            break Some(TailStop::Short);
        }
        let len = u32_at(buf, at);
        if len > MAX_FRAME_PAYLOAD {
            break Some(TailStop::Oversized { len });
        }
        let end = at + FRAME_HEADER_LEN + len as usize;
        if end > buf.len() {
            break Some(TailStop::Short);
        }
        let crc = u32_at(buf, at + 4);
        let seq = u64_at(buf, at + 8);
        if frame_crc(&buf[at + 8..end]) != crc {
            break Some(TailStop::BadCrc);
        }
        if expected != Some(seq) {
            break Some(TailStop::WrongSeq {
                expected: expected.unwrap_or(u64::MAX),
                found: seq,
            });
        }
        frame(FrameSpan {
            seq,
            start: at,
            end,
        });
        last_seq = seq;
        expected = seq.checked_add(1);
        at = end;
    };
    ScanRun {
        valid_len: at,
        last_seq,
        expected,
        stop,
    }
}

/// A whole WAL file scanned: its header and the valid frames after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalScan {
    pub header: WalHeader,
    /// Frames, with offsets into the whole file (header included).
    pub frames: Vec<FrameSpan>,
    /// Bytes of the file that count: header plus valid frames.
    pub valid_len: u64,
    /// Seq of the last valid frame, or `floor` when there is none.
    pub last_seq: u64,
    pub stop: Option<TailStop>,
}

/// Scans a whole WAL file held in memory. A bad header is an error; a bad tail is not.
pub fn scan_wal(file: &[u8]) -> Result<WalScan, FormatError> {
    let header = WalHeader::decode(file)?;
    // `decode` rejects `floor == u64::MAX`, so this cannot overflow.
    let scan = scan_frames(&file[WAL_HEADER_LEN..], header.floor + 1);
    Ok(WalScan {
        header,
        frames: scan
            .frames
            .into_iter()
            .map(|f| FrameSpan {
                seq: f.seq,
                start: f.start + WAL_HEADER_LEN,
                end: f.end + WAL_HEADER_LEN,
            })
            .collect(),
        valid_len: (WAL_HEADER_LEN + scan.valid_len) as u64,
        last_seq: scan.last_seq,
        stop: scan.stop,
    })
}

/// A whole WAL file checked as it was read ([`check_wal`]): what [`scan_wal`] says of the same
/// bytes, without the frame spans, and the length and CRC-32 of all of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalCheck {
    pub header: WalHeader,
    /// Valid frames.
    pub frames: u64,
    /// Bytes of the file that count: header plus valid frames.
    pub valid_len: u64,
    /// Seq of the last valid frame, or `floor` when there is none.
    pub last_seq: u64,
    pub stop: Option<TailStop>,
    /// Bytes read: the whole file.
    pub len: u64,
    /// CRC-32 of every byte read (valid frames or not).
    pub crc: u32,
}

/// A piece size for [`check_wal`]: small enough that each piece is scanned and hashed while
/// it is in the cache.
pub const CHECK_CHUNK: usize = 256 << 10;

/// Why [`check_wal`] could not say.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Format(#[from] FormatError),
}

/// [`scan_wal`] of everything `read` yields, and its CRC, reading about `chunk` bytes at a
/// time into `buf` (which keeps its allocation from one call to the next).
///
/// The bytes are looked at while they are in the cache: a file is read once, in pieces that
/// fit in it, rather than copied whole into memory and then scanned and hashed from memory in
/// two more passes (on this machine the copy alone ran at a third of the speed of the pieces).
/// Only a frame longer than `chunk` makes `buf` grow, to that frame, a chunk at a time as its
/// bytes arrive (never to the length a frame header claims before they do). The answer is exactly
/// [`scan_wal`]'s on the same bytes, wherever the pieces end.
pub fn check_wal(
    mut read: impl std::io::Read,
    chunk: usize,
    buf: &mut Vec<u8>,
) -> Result<WalCheck, CheckError> {
    let chunk = chunk.max(WAL_HEADER_LEN).max(FRAME_HEADER_LEN);
    let mut hasher = crc32fast::Hasher::new();
    let mut len = 0u64;
    // `buf[..filled]` holds bytes read and not yet scanned past. `buf` is zeroed only when it
    // grows (once, then kept from one call to the next): each read overwrites its tail.
    let mut filled = 0usize;
    // Reads until `buf` holds at least `want` bytes or the input ends; hashes what it read.
    // `buf` grows at most a chunk past the bytes already read: a frame header's `len` (up to
    // `MAX_FRAME_PAYLOAD`) is not trusted to size it before its bytes exist, so a short
    // hostile file costs a chunk, not the length it claims.
    let mut fill = |buf: &mut Vec<u8>, filled: &mut usize, want: usize| -> std::io::Result<bool> {
        while *filled < want {
            let room = want.min(*filled + chunk);
            if buf.len() < room {
                buf.resize(room, 0);
            }
            let n = loop {
                match read.read(&mut buf[*filled..]) {
                    Ok(n) => break n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            };
            if n == 0 {
                return Ok(true);
            }
            hasher.update(&buf[*filled..*filled + n]);
            len += n as u64;
            *filled += n;
        }
        Ok(false)
    };
    let mut eof = fill(buf, &mut filled, chunk)?;
    let header = WalHeader::decode(&buf[..filled])?;
    let mut start = WAL_HEADER_LEN;
    let mut valid_len = WAL_HEADER_LEN as u64;
    let mut frames = 0u64;
    let mut expected = Some(header.floor + 1);
    let mut last_seq = header.floor;
    let stop = loop {
        let run = scan_run(&buf[start..filled], expected, last_seq, |_| frames += 1);
        valid_len += run.valid_len as u64;
        (expected, last_seq) = (run.expected, run.last_seq);
        let rest = start + run.valid_len;
        match run.stop {
            // The bytes ran out, not the frames: read on, keeping the frame cut in two.
            None | Some(TailStop::Short) if !eof => {
                buf.copy_within(rest..filled, 0);
                filled -= rest;
                start = 0;
                // A frame cut after its header: read at least all of it (its length is at
                // most `MAX_FRAME_PAYLOAD`, or the run would have stopped at it).
                let frame = if filled >= FRAME_HEADER_LEN {
                    FRAME_HEADER_LEN + u32_at(buf, 0) as usize
                } else {
                    0
                };
                eof = fill(buf, &mut filled, chunk.max(frame))?;
            }
            stop => break stop,
        }
    };
    // What follows the valid frames still counts towards the file's length and CRC.
    while !eof {
        filled = 0;
        eof = fill(buf, &mut filled, chunk)?;
    }
    Ok(WalCheck {
        header,
        frames,
        valid_len,
        last_seq,
        stop,
        len,
        crc: hasher.finalize(),
    })
}

/// The header of a snapshot file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotHeader {
    pub snapshot_id: Uuid,
    /// Commits the snapshot holds.
    pub commit_seq: u64,
    /// The WAL this snapshot kept, whose frames with `seq <= commit_seq` it already holds.
    pub kept_wal_id: Option<Uuid>,
    pub payload_len: u64,
}

impl SnapshotHeader {
    pub fn encode(&self) -> [u8; SNAPSHOT_HEADER_LEN] {
        let mut b = [0u8; SNAPSHOT_HEADER_LEN];
        b[..8].copy_from_slice(SNAPSHOT_MAGIC);
        b[8..24].copy_from_slice(self.snapshot_id.as_bytes());
        b[24..32].copy_from_slice(&self.commit_seq.to_le_bytes());
        b[32..48].copy_from_slice(self.kept_wal_id.unwrap_or(Uuid::nil()).as_bytes());
        b[48..56].copy_from_slice(&self.payload_len.to_le_bytes());
        let crc = crc32fast::hash(&b[..56]);
        b[56..60].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self, FormatError> {
        const WHAT: &str = "snapshot header";
        need(WHAT, b, SNAPSHOT_HEADER_LEN)?;
        check_magic(WHAT, b, SNAPSHOT_MAGIC)?;
        if crc32fast::hash(&b[..56]) != u32_at(b, 56) {
            return Err(FormatError::HeaderCrc { what: WHAT });
        }
        let kept = uuid_at(b, 32);
        Ok(Self {
            snapshot_id: uuid_at(b, 8),
            commit_seq: u64_at(b, 24),
            kept_wal_id: (!kept.is_nil()).then_some(kept),
            payload_len: u64_at(b, 48),
        })
    }

    /// Length of the whole snapshot file this header describes.
    ///
    /// Saturates instead of overflowing: a hostile `payload_len` near `u64::MAX` must make
    /// [`decode_snapshot`] fail its length check, not panic.
    pub fn file_len(&self) -> u64 {
        (SNAPSHOT_HEADER_LEN as u64 + SNAPSHOT_TRAILER_LEN as u64).saturating_add(self.payload_len)
    }
}

/// Encodes a whole snapshot file.
pub fn encode_snapshot(
    snapshot_id: Uuid,
    commit_seq: u64,
    kept_wal_id: Option<Uuid>,
    payload: &[u8],
) -> Vec<u8> {
    let header = SnapshotHeader {
        snapshot_id,
        commit_seq,
        kept_wal_id,
        payload_len: payload.len() as u64,
    };
    let mut out = Vec::with_capacity(crate::units::usize_of(header.file_len()));
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(payload);
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out
}

/// Decodes a whole snapshot file, checking lengths and both CRCs; returns the header and payload.
pub fn decode_snapshot(file: &[u8]) -> Result<(SnapshotHeader, &[u8]), FormatError> {
    let header = SnapshotHeader::decode(file)?;
    let want = header.file_len();
    if file.len() as u64 != want {
        return Err(FormatError::Invalid {
            what: "snapshot",
            detail: format!("file is {} bytes, header says {want}", file.len()),
        });
    }
    let payload = &file[SNAPSHOT_HEADER_LEN..file.len() - SNAPSHOT_TRAILER_LEN];
    if crc32fast::hash(payload) != u32_at(file, file.len() - SNAPSHOT_TRAILER_LEN) {
        return Err(FormatError::PayloadCrc { what: "snapshot" });
    }
    Ok((header, payload))
}

/// [`decode_snapshot`]'s checks of everything `read` yields, reading about `chunk` bytes at a
/// time: the same answer (the header, or the same error), holding a chunk rather than the
/// file, so a restored snapshot is read back whatever its size (or a hostile header's
/// `payload_len`).
pub fn check_snapshot(
    mut read: impl std::io::Read,
    chunk: usize,
) -> Result<SnapshotHeader, CheckError> {
    use std::io::Read;
    let mut head = Vec::with_capacity(SNAPSHOT_HEADER_LEN);
    (&mut read)
        .take(SNAPSHOT_HEADER_LEN as u64)
        .read_to_end(&mut head)?;
    let header = SnapshotHeader::decode(&head)?;
    let want = header.file_len();
    let payload_end = want.saturating_sub(SNAPSHOT_TRAILER_LEN as u64);
    let mut hasher = crc32fast::Hasher::new();
    let mut trailer = Vec::with_capacity(SNAPSHOT_TRAILER_LEN);
    let mut pos = SNAPSHOT_HEADER_LEN as u64;
    let mut buf = vec![0u8; chunk.max(1)];
    loop {
        let n = match read.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        let b = &buf[..n];
        let payload = usize::try_from(payload_end.saturating_sub(pos)).map_or(n, |p| p.min(n));
        hasher.update(&b[..payload]);
        let room = SNAPSHOT_TRAILER_LEN - trailer.len();
        trailer.extend_from_slice(&b[payload..n.min(payload + room)]);
        pos += n as u64;
    }
    if pos != want {
        return Err(FormatError::Invalid {
            what: "snapshot",
            detail: format!("file is {pos} bytes, header says {want}"),
        }
        .into());
    }
    if hasher.finalize() != u32_at(&trailer, 0) {
        return Err(FormatError::PayloadCrc { what: "snapshot" }.into());
    }
    Ok(header)
}

/// A durable WAL position: how much of which `wal.bin`, beside which snapshot, is fsynced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WalPosition {
    pub snapshot_id: Option<Uuid>,
    pub wal_id: Uuid,
    pub wal_number: u64,
    /// Bytes of `wal.bin` that are fsynced; always at a frame boundary.
    pub durable_len: u64,
    /// Commits durable in total.
    pub commit_seq: u64,
}

impl WalPosition {
    pub fn encode(&self) -> [u8; POSITION_LEN] {
        let mut b = [0u8; POSITION_LEN];
        b[..8].copy_from_slice(POSITION_MAGIC);
        b[8..24].copy_from_slice(self.snapshot_id.unwrap_or(Uuid::nil()).as_bytes());
        b[24..40].copy_from_slice(self.wal_id.as_bytes());
        b[40..48].copy_from_slice(&self.wal_number.to_le_bytes());
        b[48..56].copy_from_slice(&self.durable_len.to_le_bytes());
        b[56..64].copy_from_slice(&self.commit_seq.to_le_bytes());
        let crc = crc32fast::hash(&b[..64]);
        b[64..68].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self, FormatError> {
        const WHAT: &str = "wal.position";
        need(WHAT, b, POSITION_LEN)?;
        check_magic(WHAT, b, POSITION_MAGIC)?;
        if crc32fast::hash(&b[..64]) != u32_at(b, 64) {
            return Err(FormatError::HeaderCrc { what: WHAT });
        }
        let snap = uuid_at(b, 8);
        Ok(Self {
            snapshot_id: (!snap.is_nil()).then_some(snap),
            wal_id: uuid_at(b, 24),
            wal_number: u64_at(b, 40),
            durable_len: u64_at(b, 48),
            commit_seq: u64_at(b, 56),
        })
    }
}

/// `snapshot.intent` while a snapshot is in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SnapshotIntent {
    pub snapshot_id: Uuid,
    pub commit_seq: u64,
}

/// `backup.parent`: the restore point a store was booted from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ParentRecord {
    pub lineage: Uuid,
    /// Key of the parent's manifest, relative to the prefix (`manifests/<seq>.json`).
    pub manifest: String,
    pub commit_seq: u64,
}

#[cfg(test)]
mod tests;
