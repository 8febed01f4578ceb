//! Writing a restore point: the manifest, then LATEST (or, in a write-once prefix, the next
//! pointer: `crate::latest`).
//!
//! The manifest is written with `If-None-Match: *`. A key that already exists is not rewritten:
//! if it is this lineage's (a crashed run wrote it before moving LATEST) it names the same
//! commits of the same history, and LATEST moves to it; if it is the adopted parent's (a store
//! restored on boot, before its first commit) it is left alone and no restore point is written
//! until the next commit. Any other owner is another writer. LATEST is written with `If-Match`
//! on the ETag last written or read (a write-once prefix's next pointer with
//! `If-None-Match`); a refusal is another writer too. A crash between the two
//! writes leaves a manifest LATEST does not name yet, which is still a valid restore point.
//!
//! In a write-once prefix, every object the manifest names is first held under Object Lock
//! until the restore point must be kept, and the manifest is created with the matching date
//! (`hold.rs`); the mutable layout sends nothing more.

use super::ctx::Ctx;
use super::view::View;
use super::{StepOutcome, WorkerError};
use crate::bucket::{Body, BucketError, GET_MAX, PutOpts};
use crate::health::StepPhase;
use crate::manifest::{Latest, Manifest};

/// Writes a restore point for everything shipped; `None` when there is nothing to write. The
/// caller restarts its restore-point timer on `Some`.
#[tracing::instrument(name = "backup.restore_point", skip_all, fields(generation = tracing::field::Empty, commit_seq = tracing::field::Empty))]
pub(super) async fn write(
    cx: &Ctx<'_>,
    view: &mut View,
) -> Result<Option<StepOutcome>, WorkerError> {
    let cond = cx.cond_create();
    let conditional = cx.conditional_writes;
    let bucket = cx.bucket;
    let g = view.current.as_ref().expect("generation started");
    let mut m = g.manifest(view.lineage, view.parent.clone(), view.origin.clone());
    let key = m.key();
    tracing::Span::current().record("generation", m.generation);
    tracing::Span::current().record("commit_seq", m.commit_seq);
    debug_assert!(m.check(&key).is_ok(), "{:?}", m.check(&key));
    cx.activity.set(StepPhase::WritingRestorePoint {
        commit_seq: m.commit_seq,
    });

    let encoded = m.encode();
    if encoded.len() as u64 > GET_MAX {
        // Every reader refuses a manifest past what a whole-object read takes: one that
        // long would be a restore point nothing restores.
        return Err(WorkerError::Store {
            dir: cx.dir.clone(),
            detail: format!(
                "the restore point at commit {} would be a manifest of {} bytes, more than \
                 the {GET_MAX} a reader takes: its generation names too many segments; a \
                 checkpoint of the store starts a new one",
                m.commit_seq,
                encoded.len()
            ),
        });
    }
    // A write-once prefix: what the manifest reuses is held until it must be kept, and the
    // manifest is created with the retention those holds were taken for (`hold.rs`).
    let opts = PutOpts {
        retain: super::hold::hold(cx, &mut view.wrappers, &m).await?,
        ..PutOpts::from(cond)
    };
    match bucket.put_with(&key, Body::from(encoded), opts).await {
        Ok(_) => {}
        Err(BucketError::PreconditionFailed { .. }) => {
            let there = bucket.get(&key).await?;
            match Manifest::decode(&key, &there.data) {
                // Written by an earlier run of this lineage (it crashed before LATEST): the
                // same commits of the same history. What the bucket holds is the restore
                // point from now on, so retention keeps what *it* names.
                Ok(existing) if existing.lineage == view.lineage => m = existing,
                Ok(existing)
                    if view
                        .parent
                        .as_ref()
                        .is_some_and(|p| p.lineage == existing.lineage && p.manifest == key) =>
                {
                    view.skip_restore_point_at = Some(m.commit_seq);
                    return Ok(None);
                }
                _ => return Err(WorkerError::ConcurrentWriter { key }),
            }
        }
        Err(e) => return Err(e.into()),
    }

    let latest = Latest {
        manifest: key.clone(),
        commit_seq: m.commit_seq,
        lineage: view.lineage,
        adopted_by: None,
        adopted_at: None,
    };
    let prev = view.latest.as_ref().map(|(_, v)| v);
    let version =
        crate::latest::write(bucket.as_ref(), &latest, prev, cx.form, conditional).await?;
    view.latest = Some((latest, version));
    view.manifests.insert(key.clone(), Some(m.clone()));
    let commit_seq = m.commit_seq;
    view.newest_own = Some(m);
    // Every segment shipped so far is in this manifest: the journal's lines are done with.
    let store = cx.store.clone();
    match tokio::task::spawn_blocking(move || super::journal::clear(&store)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!("emptying the shipped-segment journal: {e}"),
        Err(e) => tracing::warn!("emptying the shipped-segment journal: {e}"),
    }
    tracing::info!(%key, commit_seq, "wrote a restore point");
    Ok(Some(StepOutcome::RestorePoint { key, commit_seq }))
}
