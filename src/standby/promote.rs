//! Promotion of a standalone standby (`mushroom-backup promote --dir DIR --from URL`): the
//! standby's directory becomes the prefix's primary, without two writers and without a fork.
//!
//! # The steps (the caller holds the prefix's bucket lease throughout)
//! 1. **Fence** (`cli/standby.rs`): a prefix whose LATEST is claimed already is refused at
//!    once, naming the adopter. Otherwise the caller takes the prefix's lease over at once,
//!    live holder or not (`lease::TakeOver`: `If-Match` on the ETag read, so of two racing
//!    promotions, or a promotion and the holder's renewal, exactly one write lands; the other
//!    promotion is refused naming the record that won). Then it waits until the old holder
//!    has certainly stopped **acknowledging**:
//!    - a holder in `durability = sync` promises an acknowledgement window in its lease
//!      record (`lease::ACK_WINDOW`, 1 s): it publishes a durable position only within that
//!      window of the start of a read of its lease object that found it still its own
//!      (`worker/ack/mod.rs`). So `window + window/10 + 50 ms` (1.15 s) after the takeover it
//!      publishes nothing more, whatever the TTL and whichever kind of lease it holds (a
//!      `standalone` one, or a `serve`'s under its instance lease): `lease::Fenced::AckWindow`.
//!      It may still *write* until it notices (its next confirming read, within half a
//!      window while commits come, or its next renewal or refused conditional write); what it
//!      writes meanwhile is past what step 2 reads, and step 4 keeps it out of the history;
//!    - a holder that promises no window (async, an older binary) stops at its next renewal
//!      (refused) or at the latest at its deadline, which the bucket's clock bounds: at most
//!      `0.9 TTL + 1 s` after the takeover, less the age of the version taken over
//!      (`lease::Fenced::Deadline`). Where even that cannot be proven (a `serve`'s store lease
//!      without the promise, a bucket that gives no clock, conditional writes off), the
//!      promotion is refused, nothing written, unless `--wait-for-lease`, which waits until
//!      the lease is stale.
//! 2. **Apply everything durable** ([`catch_up`]): the standby's own apply, until a poll finds
//!    nothing new. Every position the old primary published rests on objects whose PUT was
//!    answered before it published, so before the wait of step 1 ended: a LIST started now
//!    sees them (S3 is strongly consistent). So every commit it acknowledged is applied.
//! 3. **Adopt** ([`adopt`]): the restore point LATEST names must be of the lineage followed, of
//!    the generation the directory holds and at most its commits, and not claimed already;
//!    `backup.parent` names it (`{lineage, manifest, commit_seq}` of that restore point, as a
//!    boot restore writes it), then a new random `backup.lineage` is written, each
//!    write-tmp-fsync-rename. The worker's adoption rule (`worker::lineage`) then lets the
//!    directory write the prefix as its own lineage, after every generation in it, while LATEST
//!    names exactly that parent.
//! 4. **Claim LATEST** ([`claim`]) before saying "promoted": LATEST is rewritten, `If-Match` on
//!    the version step 3 read, naming the same restore point plus `adopted_by`: the new
//!    lineage ([`Latest::adopted_by`]), and where the promoted store's copy of the history
//!    ends ([`Latest::adopted_at`]: generation, WAL offset, commit): a restore of the prefix
//!    stops there, so segments the old primary shipped after step 2 (it had not noticed, or
//!    its requests were delayed in the network) are never restored, and the prefix's history
//!    is exactly the promoted store's. The promoted store cannot write a restore point of its
//!    own yet: its commit count is its parent's, and that manifest key is the parent's
//!    (DESIGN.md section 4: one commit count, one key). The claim is what moves LATEST instead.
//!    From then on the lineage rule refuses the old primary (and any other adopter), whether or
//!    not the promoted process is still running: its next LATEST write is refused (412: it
//!    forgets its view, drops its lease, and its resume is refused, naming the promotion), and
//!    so is its restart. LATEST still names a valid restore point of the lineage it says, so
//!    a reader that knows nothing of the claim restores the parent's point and its trailing
//!    segments; ours stop at `adopted_at`, which is what the promoted store holds. If the claim is refused (the old writer moved LATEST since step
//!    3: commits it wrote, maybe acknowledged), the adoption is given back (`backup.lineage`
//!    names the followed lineage again, then `backup.parent` goes), and steps 2 to 4 run again,
//!    [`CLAIM_ROUNDS`] times at most ([`promote`]). A restore point the old writer wrote after
//!    step 2 (adopt finds the directory behind: [`StandbyError::Behind`]) likewise sends it
//!    back to step 2.
//! 5. **Back up**: the caller hands the lease, unreleased, to a backup worker with the same
//!    holder id (the lease is then its own: taken at once, so no one else can take it in
//!    between) and follows the directory as `backup` does. Its first generation is of the new
//!    lineage, after every generation in the prefix, and holds every commit applied; its first
//!    restore point comes with the first new commit and moves LATEST to the new lineage (no
//!    `adopted_by` any more: the restore point is its own).
//!
//! This deviates from DESIGN.md sections 4, 5 and 7: LATEST has an optional `adopted_by`
//! field, the lineage rule refuses every store but the one it names, and a promotion takes a
//! live lease over (section 7 takes only a lease stale for a TTL), then waits out its
//! holder's acknowledgement window (a new optional lease record field, `ack_window_ms`) or
//! its deadline by the bucket's clock before writing anything but the lease; LATEST's claim
//! also says where the adopter's history ends (`adopted_at`), and a restore stops there.
//!
//! # What it does not do
//! A promotion that took a lease from another promotion still in progress (before its claim)
//! makes that one's worker wait as a standby; LATEST's claim decides which of the two wins
//! (the other is refused at its claim, naming the winner's lineage), and the loser releases
//! the lease. RTO: with a sync primary, the 1.15 s window plus a poll; with an async one at the
//! default 30 s TTL, the wait for the old holder's deadline is 17 to 28 s (it renews every
//! 10 s). A manifest the old primary writes after the promotion (delayed in the network) stays
//! in `manifests/` as a restore point of its lineage (`restore --at` can reach it): the default
//! restore, LATEST and every manifest of the promoted lineage name none of its writes after
//! step 2.
//!
//! # What a crash leaves
//! Before step 3: a standby (restart `restore --follow` or `promote`). Between the two writes
//! of step 3 (or of giving an adoption back): a parent record beside the followed lineage's
//! `backup.lineage`: the directory is still a standby of that lineage, and `promote` again
//! finishes the job (it rewrites both). After step 3, before the claim: a store of the new
//! lineage whose parent LATEST still names, unclaimed: `backup --store DIR` adopts the prefix
//! (`promote` again refuses it: it is no longer a standby of the lineage LATEST names). After
//! the claim: a promoted store, which `backup --store DIR` backs up; every other store is
//! refused the prefix. The lease object a crash leaves goes stale within its TTL.

use std::path::Path;

use serde::Serialize;
use uuid::Uuid;

use super::{Applied, StandbyError, StandbyOptions, blocking};
use crate::bucket::Bucket;
use crate::latest::{self, LatestError};
use crate::manifest::{AdoptedAt, Latest};
use crate::restore::plan::latest_restore_point;
use crate::store::disk::{LINEAGE_FILE, PARENT_FILE, write_file_durably};
use crate::store::format::ParentRecord;

/// What a promotion wrote into the directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Adopted {
    /// What the directory holds: every commit the prefix had shipped.
    pub applied: Applied,
    /// `backup.parent`: the restore point LATEST names.
    pub parent: ParentRecord,
    /// `backup.lineage`: the directory's own lineage from now on.
    pub new_lineage: Uuid,
}

/// Step 2: applies everything the prefix holds into `dir` (restoring it if empty), until a
/// poll finds nothing new; returns where it stands.
pub async fn catch_up(
    bucket: &dyn Bucket,
    dir: &Path,
    opts: &StandbyOptions,
) -> Result<Applied, StandbyError> {
    opts.check()?;
    let crash = super::Crash(opts.crash_at);
    let (mut now, _) = super::start(bucket, dir, opts, &crash).await?;
    loop {
        match super::step(bucket, dir, &now.at, opts, &crash).await? {
            Some((next, _, _)) => {
                now = super::Following {
                    at: next.at,
                    _lock: next.lock.unwrap_or(now._lock),
                }
            }
            None => return Ok(now.at),
        }
    }
}

/// A promotion's claim found in LATEST ([`Latest::adopted_by`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// The restore point LATEST names (the parent's).
    pub manifest: String,
    /// Its lineage: the one that was promoted away.
    pub lineage: Uuid,
    /// The lineage the prefix was given to.
    pub adopter: Uuid,
}

/// Whether the prefix was promoted already: the claim LATEST holds, if any (one GET). A
/// LATEST that is missing or not valid holds no claim.
pub async fn claimed(bucket: &dyn Bucket) -> Result<Option<Claimed>, crate::bucket::BucketError> {
    Ok(match latest::read(bucket).await? {
        Some(latest::Found { latest: Ok(l), .. }) => l.adopted_by.map(|adopter| Claimed {
            manifest: l.manifest,
            lineage: l.lineage,
            adopter,
        }),
        _ => None,
    })
}

/// How many times [`promote`] catches up again after the old writer moved LATEST under it.
const CLAIM_ROUNDS: u32 = 5;

/// Steps 2 to 4 (see the module docs): catch up, adopt, claim LATEST; when the claim is
/// refused (the old writer moved LATEST since it was read: commits it may have acknowledged),
/// gives the adoption back, catches up again and retries, [`CLAIM_ROUNDS`] times at most.
pub async fn promote(
    bucket: &dyn Bucket,
    dir: &Path,
    opts: &StandbyOptions,
) -> Result<Adopted, StandbyError> {
    for round in 1..=CLAIM_ROUNDS {
        let applied = catch_up(bucket, dir, opts).await?;
        match nothing_left_out(bucket, dir, &applied, opts).await {
            Ok(()) => {}
            Err(StandbyError::Behind { detail, .. }) if round < CLAIM_ROUNDS => {
                tracing::warn!(round, %detail, "the prefix moved on during the promotion: catching up again");
                continue;
            }
            Err(e) => return Err(e),
        }
        let (adopted, version) = match adopt(bucket, dir, &applied).await {
            Ok(adopted) => adopted,
            // The old writer wrote a restore point after the catch-up (it has not noticed the
            // takeover yet): nothing was written here; catch up again.
            Err(StandbyError::Behind { detail, .. }) if round < CLAIM_ROUNDS => {
                tracing::warn!(round, %detail, "the prefix moved on during the promotion: catching up again");
                continue;
            }
            Err(e) => return Err(e),
        };
        match claim(bucket, &adopted, &version).await {
            Ok(()) => return Ok(adopted),
            Err(LatestError::Moved { key }) => {
                tracing::warn!(
                    round,
                    %key,
                    "the old writer moved LATEST during the promotion: catching up again"
                );
                unadopt(dir, applied.lineage).await?;
            }
            Err(e) => return Err(StandbyError::Claim(e)),
        }
    }
    Err(StandbyError::Claim(LatestError::Moved {
        key: format!("LATEST (moved under each of {CLAIM_ROUNDS} claims)"),
    }))
}

/// Refuses a promotion whose catch-up stopped short of segments listed past it
/// ([`StandbyError::LeftOut`]): the chain past `at` is chosen as a restore chooses it
/// (`at_rest::chain`), and anything it leaves out ending past `at` that a writer could have
/// written may hold acknowledged commits the claim would cut away. Segments that do continue
/// it (a PUT of the old writer that landed after the catch-up) are [`StandbyError::Behind`]:
/// catch up again.
async fn nothing_left_out(
    bucket: &dyn Bucket,
    dir: &Path,
    at: &Applied,
    opts: &StandbyOptions,
) -> Result<(), StandbyError> {
    let seen = super::poll::poll(bucket, at.generation, at.wal_end).await?;
    let ext = super::extend_from(bucket, at, seen.listed, opts, false).await?;
    if !ext.segments.is_empty() {
        return Err(StandbyError::Behind {
            dir: dir.to_path_buf(),
            detail: format!(
                "segments past commit {} arrived after the catch-up",
                at.commit_seq
            ),
        });
    }
    // What no writer makes (a key claiming more than a writer ships, stored bytes no
    // encoding of its range has) holds nothing acknowledged: it does not stop a failover.
    let left_out: Vec<_> = ext
        .left_out
        .into_iter()
        .filter(|l| l.could_be_a_writers())
        .collect();
    if !left_out.is_empty() {
        return Err(StandbyError::LeftOut {
            dir: dir.to_path_buf(),
            commit_seq: at.commit_seq,
            left_out,
        });
    }
    Ok(())
}

/// Step 4: LATEST names the parent's restore point for `adopted.new_lineage`
/// ([`Latest::adopted_by`]), written conditional on `version`, the version [`adopt`] read.
pub async fn claim(
    bucket: &dyn Bucket,
    adopted: &Adopted,
    version: &latest::Version,
) -> Result<(), LatestError> {
    let claimed = Latest {
        manifest: adopted.parent.manifest.clone(),
        commit_seq: adopted.parent.commit_seq,
        lineage: adopted.parent.lineage,
        adopted_by: Some(adopted.new_lineage),
        adopted_at: Some(AdoptedAt {
            generation: adopted.applied.generation,
            wal_end: adopted.applied.wal_end,
            commit_seq: adopted.applied.commit_seq,
        }),
    };
    let form = match version {
        latest::Version::Etag(_) => latest::Form::Mutable,
        latest::Version::Pointer(_) => latest::Form::WriteOnce,
    };
    latest::write(bucket, &claimed, Some(version), form, true).await?;
    Ok(())
}

/// Undoes [`adopt`] after a refused claim: `backup.lineage` names `followed` again, then
/// `backup.parent` goes (a crash between the two leaves the state between adopt's two writes:
/// still a standby).
async fn unadopt(dir: &Path, followed: Uuid) -> Result<(), StandbyError> {
    let d = dir.to_path_buf();
    blocking(move || {
        let fail = |detail: String| StandbyError::NotAStore {
            dir: d.clone(),
            detail,
        };
        write_file_durably(&d, LINEAGE_FILE, format!("{followed}\n").as_bytes())
            .map_err(|e| fail(e.to_string()))?;
        match std::fs::remove_file(d.join(PARENT_FILE)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(fail(format!("removing {PARENT_FILE}: {e}"))),
        }
        crate::store::disk::sync_dir(&d).map_err(|e| fail(e.to_string()))
    })
    .await
}

/// Step 3 (see the module docs) for a directory at `applied`; also returns the version of
/// LATEST read, for [`claim`].
pub async fn adopt(
    bucket: &dyn Bucket,
    dir: &Path,
    applied: &Applied,
) -> Result<(Adopted, latest::Version), StandbyError> {
    let found = latest::read(bucket).await?;
    let (key, m) = latest_restore_point(bucket, &mut Vec::new()).await?;
    let (version, named) = match found {
        Some(latest::Found {
            version,
            latest: Ok(l),
            ..
        }) if l.manifest == key && l.lineage == m.lineage && l.commit_seq == m.commit_seq => {
            (version, l)
        }
        _ => {
            return Err(StandbyError::Behind {
                dir: dir.to_path_buf(),
                detail: format!(
                    "LATEST does not name the prefix's newest restore point {key} (it is \
                     missing, not valid, or moved while read): promote again"
                ),
            });
        }
    };
    if let Some(adopter) = named.adopted_by {
        return Err(StandbyError::NotAStore {
            dir: dir.to_path_buf(),
            detail: format!(
                "the prefix was promoted already: LATEST gives {key} to lineage {adopter}; back \
                 that store up (`backup --store DIR`), or restore anew from the prefix"
            ),
        });
    }
    if m.lineage != applied.lineage {
        return Err(StandbyError::LineageChanged {
            ours: applied.lineage,
            prefix: m.lineage,
        });
    }
    if m.generation != applied.generation || m.commit_seq > applied.commit_seq {
        return Err(StandbyError::Behind {
            dir: dir.to_path_buf(),
            detail: format!(
                "it holds generation {} to commit {}, but LATEST names {key} (generation {}, \
                 commit {}): it is not caught up; promote again",
                applied.generation, applied.commit_seq, m.generation, m.commit_seq
            ),
        });
    }
    let parent = ParentRecord {
        lineage: m.lineage,
        manifest: key,
        commit_seq: m.commit_seq,
    };
    let new_lineage = Uuid::new_v4();
    let record = serde_json::to_vec(&parent).map_err(|e| StandbyError::NotAStore {
        dir: dir.to_path_buf(),
        detail: format!("parent record: {e}"),
    })?;
    let d = dir.to_path_buf();
    blocking(move || {
        let write = |name: &str, data: &[u8]| {
            write_file_durably(&d, name, data).map_err(|e| StandbyError::NotAStore {
                dir: d.clone(),
                detail: e.to_string(),
            })
        };
        write(PARENT_FILE, &record)?;
        write(LINEAGE_FILE, format!("{new_lineage}\n").as_bytes())
    })
    .await?;
    Ok((
        Adopted {
            applied: applied.clone(),
            parent,
            new_lineage,
        },
        version,
    ))
}
