//! Re-keying by re-wrapping: every generation's data key wrapped for new key-encryption keys,
//! then the old wrappers removed. No data object is read, written or deleted.
//!
//! 1. List every generation with wrappers (`gen/*/keys/`).
//! 2. For each, unwrap its data key with an old KEK and write a wrapper for every new KEK it
//!    lacks (write-once; one already there from an earlier, interrupted run is accepted when
//!    it is for the same data key, see [`super::key_objects::write_wrapper`]). Where both are
//!    there, the new wrappers are checked against the old one's data key (by id; a key file's
//!    by opening it). The lineage bound into a wrapper is the generation's GENERATION claim's
//!    (or, for a generation whose claim retention already removed, the old wrapper's own).
//! 3. Only when every generation has all its new wrappers, delete the old KEKs' wrappers.
//!    If any generation could not be re-wrapped (no old wrapper, a damaged one), nothing is
//!    deleted and the error names every such generation.
//! 4. List again and report generations that still have a wrapper for an old KEK: ones a
//!    writer created during the rekey with the old key (it wraps with whatever KEK it was
//!    configured with). Reconfigure writers first, then rekey; a re-run catches them.
//!
//! **Crash safety.** Until step 3 every generation keeps its old wrapper; a new one exists
//! before any old one goes; so after a crash at any request every generation opens with the
//! old key or the new (both, before step 3), and a re-run completes: step 2 finds the new
//! wrappers there, step 3 deletes what is left. After a complete run the old key alone opens
//! nothing under the prefix.
//!
//! **What it does not change: the data keys.** A rekey re-wraps; every generation keeps its
//! data key, and its objects are untouched. So an old wrapper kept from before (a copy of the
//! bucket, an old object version) with the old key still opens its generation. New data keys
//! come only with new generations (`worker::keys`: a random key per generation, at its
//! start); rotating them is starting one and letting retention remove the old ones (docs/using.md,
//! "Rotating the data keys").
//!
//! **The bucket lease.** Rekey does not take it: it writes only write-once wrappers and deletes
//! only the old KEKs', which no backup reads after writing them, so it can run beside a live
//! backup. The race with a writer is the one of step 4. Retention deleting a generation
//! during a rekey may leave a new wrapper in an otherwise empty generation (a small orphan,
//! harmless: it opens a key no data uses).

use std::collections::BTreeSet;

use tokio_util::sync::CancellationToken;

use crate::bucket::{Bucket, BucketError};
use crate::manifest::{self, GenerationClaim};

use super::key_objects::{
    KeyObjectError, Written, generations_with_wrappers, read_wrapper, wrapper_key, write_wrapper,
};
use super::keys::{KekId, list_ids};
use super::wrapper::{Binding, UnwrapKek, WrapKek};

/// What a rekey did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RekeyReport {
    /// Generations with wrappers when it started.
    pub generations: u64,
    /// New wrappers written.
    pub wrapped: u64,
    /// New wrappers that were already there (an earlier run).
    pub already_there: u64,
    /// Old wrappers deleted.
    pub deleted: u64,
}

/// Why a rekey stopped.
#[derive(Debug, thiserror::Error)]
pub enum RekeyError {
    #[error("rekey needs an old key that can unwrap (a key file or an age identity)")]
    NoOldKey,
    #[error("rekey needs a new key (a key file or an age recipient)")]
    NoNewKey,
    #[error("the new key (id {0}) is also an old key: nothing to rotate")]
    SameKey(KekId),
    #[error("{0}")]
    Bucket(#[from] BucketError),
    #[error(
        "nothing deleted: {} generation(s) could not be re-wrapped: {}",
        .0.len(), .0.iter().map(|(g, e)| format!("generation {g}: {e}")).collect::<Vec<_>>().join("; ")
    )]
    Incomplete(Vec<(u64, KeyObjectError)>),
    #[error(
        "generation(s) {} still have a wrapper for the old key (written by a backup still configured with it during the rekey?): reconfigure writers, then run rekey again",
        .0.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
    )]
    OldKeyStillUsed(Vec<u64>),
    #[error("cancelled")]
    Cancelled,
}

/// Re-wraps every generation under the prefix from `old` to `new`; see the module docs.
pub async fn rekey(
    bucket: &dyn Bucket,
    old: &[UnwrapKek],
    new: &[WrapKek],
    cancel: &CancellationToken,
) -> Result<RekeyReport, RekeyError> {
    if old.is_empty() {
        return Err(RekeyError::NoOldKey);
    }
    if new.is_empty() {
        return Err(RekeyError::NoNewKey);
    }
    let old_ids: BTreeSet<KekId> = old.iter().map(|k| k.id().clone()).collect();
    if let Some(k) = new.iter().find(|k| old_ids.contains(k.id())) {
        return Err(RekeyError::SameKey(k.id().clone()));
    }
    let listing = generations_with_wrappers(bucket).await?;
    let mut report = RekeyReport {
        generations: listing.len() as u64,
        ..RekeyReport::default()
    };
    let mut problems = Vec::new();
    for (&g, have) in &listing {
        if cancel.is_cancelled() {
            return Err(RekeyError::Cancelled);
        }
        let missing: Vec<&WrapKek> = new.iter().filter(|k| !have.contains(k.id())).collect();
        let old_there = old.iter().any(|k| have.contains(k.id()));
        if missing.is_empty() && !old_there {
            // Done by an earlier run (its old wrappers already deleted).
            continue;
        }
        match rewrap(bucket, g, have, old, new).await {
            Ok((wrapped, already)) => {
                report.wrapped += wrapped;
                report.already_there += already;
            }
            Err(KeyObjectError::Bucket(e)) => return Err(e.into()),
            Err(e) => problems.push((g, e)),
        }
    }
    if !problems.is_empty() {
        return Err(RekeyError::Incomplete(problems));
    }
    for (&g, have) in &listing {
        for id in have.intersection(&old_ids) {
            if cancel.is_cancelled() {
                return Err(RekeyError::Cancelled);
            }
            bucket.delete(&wrapper_key(g, id), None).await?;
            report.deleted += 1;
        }
    }
    let still: Vec<u64> = generations_with_wrappers(bucket)
        .await?
        .into_iter()
        .filter(|(_, ids)| !ids.is_disjoint(&old_ids))
        .map(|(g, _)| g)
        .collect();
    if !still.is_empty() {
        return Err(RekeyError::OldKeyStillUsed(still));
    }
    Ok(report)
}

/// Writes generation `g`'s missing new wrappers (and checks those already there); returns
/// (written, already there).
async fn rewrap(
    bucket: &dyn Bucket,
    g: u64,
    have: &BTreeSet<KekId>,
    old: &[UnwrapKek],
    new: &[WrapKek],
) -> Result<(u64, u64), KeyObjectError> {
    let Some(old_kek) = old.iter().find(|k| have.contains(k.id())) else {
        return Err(KeyObjectError::NotWrappedFor {
            generation: g,
            given: old.iter().map(|k| k.id().clone()).collect(),
            wrapped_for: have.iter().cloned().collect(),
        });
    };
    let key = wrapper_key(g, old_kek.id());
    let Some(wrapper) = read_wrapper(bucket, g, old_kek.id()).await? else {
        return Err(KeyObjectError::Bucket(BucketError::not_found(&key)));
    };
    let lineage = match claim_lineage(bucket, g).await? {
        Some(l) => l,
        None => {
            tracing::warn!(
                generation = g,
                "no GENERATION claim; binding the new wrappers to the old wrapper's lineage"
            );
            wrapper.lineage
        }
    };
    let binding = Binding {
        lineage,
        generation: g,
    };
    let data_key = wrapper.unwrap(&key, old_kek, binding)?;
    let (mut wrapped, mut already) = (0, 0);
    for kek in new {
        let check = match kek {
            WrapKek::KeyFile(k) => Some(UnwrapKek::KeyFile(k.clone())),
            WrapKek::Recipient(_) => None,
        };
        let w = kek.wrap(&data_key, binding)?;
        match write_wrapper(bucket, &w, &data_key, check.as_ref()).await? {
            Written::New => wrapped += 1,
            Written::AlreadyThere => already += 1,
        }
    }
    tracing::info!(
        generation = g,
        old = %old_kek.id(),
        new = %list_ids(new.iter().map(WrapKek::id)),
        "re-wrapped"
    );
    Ok((wrapped, already))
}

/// The lineage of generation `g`'s claim, or `None` when there is no claim.
async fn claim_lineage(bucket: &dyn Bucket, g: u64) -> Result<Option<uuid::Uuid>, KeyObjectError> {
    let key = manifest::generation_key(g);
    match bucket.get(&key).await {
        Ok(o) => match GenerationClaim::decode(&key, &o.data) {
            Ok(c) => Ok(Some(c.lineage)),
            Err(e) => {
                tracing::warn!(generation = g, error = %e, "unreadable GENERATION claim");
                Ok(None)
            }
        },
        Err(BucketError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}
