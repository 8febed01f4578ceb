//! Shipping `wal.bin` from the shipped end to the durable length as one segment.
//!
//! The read is bracketed by two looks ([`DiskState::unchanged_until`]) and kept only if neither
//! the snapshot, the WAL file nor the intent changed and the WAL did not shrink. The bytes must
//! parse as whole frames continuing the shipped commits (the first segment of a WAL starts with
//! its header): a source that reports a length off a frame boundary, or bytes that do not
//! parse below the durable length, fail the step rather than ship something a restore would
//! cut. A segment is written with `If-None-Match: *`; a crash after the PUT leaves a segment no
//! manifest names, which a resuming worker takes on (it matches the local WAL) or retention
//! removes. Each segment shipped is appended to the shipped-segment journal
//! ([`super::journal`]), so a restart takes it back without a GET. The segment goes up encoded ([`super::upload::Uploader::put_encoded`]); its
//! entry's plain length is `end - start`, what `Manifest::check` and restore check.

use bytes::Bytes;
use uuid::Uuid;

use super::ctx::Ctx;
use super::view::{View, read_wal_range};
use super::{DeferReason, MAX_SEGMENT_BYTES, StepOutcome, WorkerError};
use crate::at_rest::encode::Plain;
use crate::health::StepPhase;
use crate::manifest::{self, SegmentEntry};
use crate::store::disk::DiskState;
use crate::store::format::{WAL_HEADER_LEN, WalHeader, WalPosition, scan_frames};

#[tracing::instrument(name = "backup.segment", skip_all, fields(generation = tracing::field::Empty, commit_seq = pos.commit_seq))]
pub(super) async fn ship(
    cx: &Ctx<'_>,
    view: &mut View,
    disk: &DiskState,
    pos: &WalPosition,
) -> Result<StepOutcome, WorkerError> {
    let (start, first_seq, number, wal_id) = {
        let g = view.current.as_ref().expect("generation started");
        (g.shipped_end, g.shipped_seq() + 1, g.number, g.wal_id)
    };
    tracing::Span::current().record("generation", number);
    let capped = pos.durable_len - start > MAX_SEGMENT_BYTES;
    let end = if capped {
        start + MAX_SEGMENT_BYTES
    } else {
        pos.durable_len
    };
    let Some(bytes) = read_segment(cx, disk, start, end, wal_id).await? else {
        return Ok(StepOutcome::Deferred(DeferReason::Changed));
    };
    let (keep, frames) = whole_frames(cx, bytes, start, end, capped, first_seq)?;
    let end = start + keep.len() as u64;
    if end == pos.durable_len && first_seq - 1 + frames != pos.commit_seq {
        return Err(WorkerError::Store {
            dir: cx.dir.clone(),
            detail: format!(
                "the WAL source says {} commits are durable but wal.bin's frames reach {}",
                pos.commit_seq,
                first_seq - 1 + frames
            ),
        });
    }

    let key = manifest::segment_key(number, start, end);
    let len = keep.len() as u64;
    cx.activity.set(StepPhase::ShippingSegment {
        generation: number,
        bytes: len,
    });
    let lineage = view.lineage;
    // Sealed with the current generation's key (the step's uploader may predate it).
    let mut uploader = cx.uploader.clone();
    uploader.encoding.seal = view.current.as_ref().and_then(|g| g.seal.clone());
    let (object, etag) = uploader
        .put_encoded_tagged(&key, Plain::Bytes(keep), lineage, number)
        .await?;
    let stored = object.len;
    // Counted shipped (and so acknowledged under `durability = sync`) only when a restore
    // would take it: the one bound every reader applies (`at_rest::chain`).
    if let Some(why) = crate::at_rest::chain::segment_stored_problem(end - start, stored) {
        return Err(WorkerError::Store {
            dir: cx.dir.clone(),
            detail: format!(
                "{key} was shipped as {why}: a restore would not take it, so it is not counted"
            ),
        });
    }

    let segment = SegmentEntry {
        object,
        start,
        end,
        frames,
    };
    let shipped = super::journal::Shipped {
        lineage,
        generation: number,
        segment: segment.clone(),
        etag,
    };
    journal(cx, shipped, &key).await;
    let g = view.current.as_mut().expect("generation started");
    g.segments.push(segment);
    g.shipped_end = end;
    Ok(StepOutcome::Shipped {
        key,
        bytes: stored,
        logical: len,
        frames,
        shipped_commit_seq: g.shipped_seq(),
    })
}

/// Reads `wal.bin` bytes `start..end`, then looks at the disk again; `None` when the files
/// changed meanwhile, or when the first segment's header names another WAL than `wal_id`.
async fn read_segment(
    cx: &Ctx<'_>,
    disk: &DiskState,
    start: u64,
    end: u64,
    wal_id: Uuid,
) -> Result<Option<Bytes>, WorkerError> {
    let Some(bytes) = read_wal_range(cx, disk, start, end).await? else {
        return Ok(None);
    };
    let after = DiskState::look_async(cx.store).await?;
    if !disk.unchanged_until(&after) {
        return Ok(None);
    }
    if start == 0 {
        let h = WalHeader::decode(&bytes).map_err(|e| WorkerError::Store {
            dir: cx.dir.clone(),
            detail: format!("wal.bin: {e}"),
        })?;
        if h.wal_id != wal_id {
            return Ok(None);
        }
    }
    Ok(Some(bytes))
}

/// The read bytes as whole frames continuing at commit `first_seq` (after the header, for
/// the first segment), and how many frames they hold. A segment `capped` at the size limit is
/// cut at its last whole frame; otherwise bytes below the durable length that do not parse
/// whole fail the step.
fn whole_frames(
    cx: &Ctx<'_>,
    bytes: Bytes,
    start: u64,
    end: u64,
    capped: bool,
    first_seq: u64,
) -> Result<(Bytes, u64), WorkerError> {
    let header_len = if start == 0 { WAL_HEADER_LEN } else { 0 };
    let scan = scan_frames(&bytes[header_len..], first_seq);
    let valid = header_len + scan.valid_len;
    let keep = if valid == bytes.len() {
        bytes
    } else if capped && scan.valid_len > 0 {
        bytes.slice(..valid)
    } else {
        return Err(WorkerError::Store {
            dir: cx.dir.clone(),
            detail: format!(
                "wal.bin bytes {start}..{end} below the durable position do not parse as whole frames \
                 ({} after {} valid bytes): the WAL source reported a position that is not durable frames",
                scan.stop
                    .map_or_else(|| "short".to_string(), |s| s.to_string()),
                valid
            ),
        });
    };
    let frames = scan
        .frames
        .iter()
        .take_while(|f| (header_len + f.end) as u64 <= keep.len() as u64)
        .count() as u64;
    Ok((keep, frames))
}

/// Appends the shipped segment to the journal, which lets a restart take it back without
/// reading it (`journal`). Not appended (the journal full, or an error), it is only warned
/// of: a restart reads the segment again.
async fn journal(cx: &Ctx<'_>, shipped: super::journal::Shipped, key: &str) {
    let store = cx.store.clone();
    let appended =
        tokio::task::spawn_blocking(move || super::journal::append(&store, &shipped)).await;
    let failed = match appended {
        Ok(Ok(true)) => None,
        Ok(Ok(false)) => Some(format!(
            "it holds {} bytes already",
            super::journal::JOURNAL_CAP
        )),
        Ok(Err(e)) => Some(e.to_string()),
        Err(e) => Some(e.to_string()),
    };
    if let Some(e) = failed {
        tracing::warn!(%key, "not in the shipped-segment journal (a restart reads it again): {e}");
    }
}
