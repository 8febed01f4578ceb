//! Resume's taking back of the segments shipped since the newest restore point: the chain a
//! restore would take, each segment checked against the local WAL (vouched for by the
//! shipped-segment journal, or read), as [`super::from_bucket`] calls it (see
//! [`extend_with_shipped_segments`]). It reads the bucket and the store, and writes nothing:
//! a crash leaves nothing of it.

use std::collections::HashMap;

use uuid::Uuid;

use super::{Listed, SEGMENT_GETS};
use crate::manifest::SegmentEntry;
use crate::store::disk::DiskState;
use crate::store::format::{WAL_HEADER_LEN, WalPosition, scan_frames};
use crate::worker::WorkerError;
use crate::worker::ctx::Ctx;
use crate::worker::view::{Generation, get_opt, read_wal_range};

/// Where a segment of the chain comes from on resume.
pub(super) enum Got {
    /// This worker's own journal line, the listing agreeing (`super::journal`): no GET.
    Journal(crate::worker::journal::Shipped),
    /// Read from the bucket (`None`: gone since it was listed).
    Object(Option<crate::bucket::Object>),
}

/// Takes on the segments shipped after the newest manifest (by a run that stopped before its
/// next restore point), as long as they match the local WAL byte for byte.
///
/// The chain is the one a restore takes ([`crate::at_rest::chain`]: candidates from the
/// listing, none past `durable_len`; the path reaching furthest). A segment of it that the
/// shipped-segment journal vouches for ([`super::journal`]: this worker PUT it, the listing
/// shows the same length and ETag) is checked against the local WAL without a GET; the others
/// are fetched [`SEGMENT_GETS`] at a time, in order. Each is checked as it comes: a segment
/// that is missing, differs from the local WAL, or does not hold whole frames continuing the
/// commits before it is rejected, the GETs still in flight are dropped, and the path is
/// chosen again from where the chain stands (so a planted or stale segment never hides a
/// chain of the store's own that reaches further). With the journal, a restart after a busy
/// stretch costs one listing and local reads, not a GET per segment (issue 40, finding 7).
pub(super) async fn extend_with_shipped_segments(
    cx: &Ctx<'_>,
    pos: &WalPosition,
    g: &mut Generation,
    lineage: Uuid,
    listed: Vec<Listed>,
) -> Result<(), WorkerError> {
    use futures::StreamExt;
    let candidates = crate::at_rest::chain::Candidates::of(
        g.number,
        g.shipped_end,
        Some(pos.durable_len),
        listed.iter().map(|l| (l.key.clone(), l.len)),
    );
    for l in &candidates.left_out {
        tracing::warn!(key = %l.key, "a segment not taken on resume: {}", l.why);
    }
    if candidates.is_empty() {
        return Ok(());
    }
    let listed: HashMap<String, Listed> = listed.into_iter().map(|l| (l.key.clone(), l)).collect();
    let store = cx.store.clone();
    let journal = tokio::task::spawn_blocking(move || crate::worker::journal::read(&store))
        .await
        .unwrap_or_default();
    let number = g.number;
    let vouched = |step: &crate::at_rest::chain::Step| {
        let j = journal.get(&step.key)?;
        let l = listed.get(&step.key)?;
        let ours = j.lineage == lineage
            && j.generation == number
            && (j.segment.start, j.segment.end) == (step.start, step.end)
            && j.segment.object.len == l.len
            && crate::worker::journal::same_etag(&j.etag, &l.etag);
        ours.then(|| j.clone())
    };
    let disk = DiskState::look_async(cx.store).await?;
    let bucket = cx.bucket;
    let mut rejected: std::collections::HashSet<String> = std::collections::HashSet::new();
    let (mut from_journal, mut fetched_n) = (0usize, 0usize);
    'chain: loop {
        let chain = candidates.path(g.shipped_end, |k| rejected.contains(k));
        if chain.is_empty() {
            break;
        }
        let mut fetched = futures::stream::iter(chain)
            .map(|step| {
                let vouched = vouched(&step);
                async move {
                    let got = match vouched {
                        Some(j) => Got::Journal(j),
                        None => Got::Object(get_opt(bucket, &step.key).await?),
                    };
                    Ok::<_, WorkerError>((step, got))
                }
            })
            .buffered(SEGMENT_GETS);
        while let Some(next) = fetched.next().await {
            let (step, got) = next?;
            match &got {
                Got::Journal(_) => from_journal += 1,
                Got::Object(_) => fetched_n += 1,
            }
            match take_segment(cx, &disk, g, lineage, &step, got).await? {
                true => g.shipped_end = step.end,
                false => {
                    tracing::warn!(key = %step.key, "a shipped segment that does not continue the store's WAL: passed over");
                    rejected.insert(step.key);
                    continue 'chain;
                }
            }
        }
    }
    if from_journal + fetched_n > 0 {
        tracing::info!(
            from_journal,
            fetched = fetched_n,
            shipped_end = g.shipped_end,
            "took on the segments shipped since the newest restore point"
        );
    }
    Ok(())
}

/// Takes the segment of `step` onto `g` when it is the store's own WAL there and continues
/// its commits; `false` when not.
pub(super) async fn take_segment(
    cx: &Ctx<'_>,
    disk: &DiskState,
    g: &mut Generation,
    lineage: Uuid,
    step: &crate::at_rest::chain::Step,
    got: Got,
) -> Result<bool, WorkerError> {
    let (start, end) = (step.start, step.end);
    // The chain is contiguous by construction; checked again, as it is what matters.
    if start != g.shipped_end {
        return Ok(false);
    }
    let Some(local) = read_wal_range(cx, disk, start, end).await? else {
        return Ok(false);
    };
    let (mut object, frames) = match got {
        Got::Object(None) => return Ok(false),
        // Raw or encoded (a segment no manifest describes says so only by its bytes).
        Got::Object(Some(o)) => {
            let Some((object, plain)) =
                crate::at_rest::decode::recognise(&step.key, &o.data, end - start, g.seal.as_ref())
            else {
                return Ok(false);
            };
            if plain != local {
                return Ok(false);
            }
            (object, None)
        }
        // What this worker shipped: the local bytes must still be what it recorded.
        Got::Journal(j) => {
            let matches = crate::at_rest::seal::plain_matches(
                &j.segment.object,
                local.len() as u64,
                crc32fast::hash(&local),
                g.seal.as_ref(),
            );
            if !matches {
                return Ok(false);
            }
            (j.segment.object, Some(j.segment.frames))
        }
    };
    let body = if start == 0 {
        &local[WAL_HEADER_LEN.min(local.len())..]
    } else {
        &local[..]
    };
    let scan = scan_frames(body, g.shipped_seq() + 1);
    if scan.stop.is_some() || (start == 0 && local.len() < WAL_HEADER_LEN) {
        return Ok(false);
    }
    if frames.is_some_and(|f| f != scan.frames.len() as u64) {
        return Ok(false);
    }
    object.lineage = lineage;
    object.generation = g.number;
    g.segments.push(SegmentEntry {
        object,
        start,
        end,
        frames: scan.frames.len() as u64,
    });
    Ok(true)
}
