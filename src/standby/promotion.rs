//! The promotion sequence, once, for the CLI's `promote` and the service's `Promote`: a
//! prefix promoted already is refused naming the adopter; the prefix's bucket lease is taken
//! over and the old writer's acknowledgements waited out (`takeover`); everything durable is
//! applied and the prefix adopted and claimed (`promote`); on a failure after the takeover the
//! lease is released, so nothing but the lease was written. The caller gets the lease back
//! held ([`Promotion::fenced`]) and hands it, unreleased, to its backup worker, which has the
//! same holder id (`TakenOver::hand_over`): the lease passes without a gap, so the old writer
//! cannot take it back in between.
//!
//! # What a crash leaves
//! What each step's module says (`takeover`, `promote`): before the adoption a standby and
//! a lease that goes stale within its TTL; after it, a promoted store.

use std::path::Path;

use tokio_util::sync::CancellationToken;

use super::promote::{self, Adopted, Claimed};
use super::takeover::{self, TakenOver, TakeoverError};
use super::{StandbyError, StandbyOptions};
use crate::bucket::{BucketError, DynBucket};
use crate::lease::LeaseConfig;

/// A promotion done: what the directory holds now, and the prefix's lease, held.
pub struct Promotion {
    pub adopted: Adopted,
    pub fenced: TakenOver,
}

/// Why a promotion did not happen (in every case nothing but the lease was written, and the
/// lease was released).
#[derive(Debug, thiserror::Error)]
pub enum PromotionError {
    /// LATEST is claimed already: another promotion won.
    #[error(
        "the prefix was promoted already: LATEST gives restore point {} to lineage {}",
        .0.manifest,
        .0.adopter
    )]
    AlreadyPromoted(Claimed),
    /// The lease could not be taken over, or its holder not proven fenced.
    #[error(transparent)]
    Takeover(#[from] TakeoverError),
    /// The catch-up, the adoption or the claim failed.
    #[error(transparent)]
    Promote(#[from] StandbyError),
    /// LATEST could not be read.
    #[error(transparent)]
    Bucket(#[from] BucketError),
}

/// Promotes the standby in `dir` to the writer of `bucket`'s prefix, under the lease
/// `lease` names (see the module docs); `wait_for_lease` waits for a lease that cannot be
/// proven fenced to go stale instead of refusing.
pub async fn promote_fenced(
    bucket: DynBucket,
    dir: &Path,
    lease: LeaseConfig,
    wait_for_lease: bool,
    opts: &StandbyOptions,
    cancel: &CancellationToken,
) -> Result<Promotion, PromotionError> {
    refuse_promoted(bucket.as_ref()).await?;
    let fenced = match takeover::take_over(bucket.clone(), lease, wait_for_lease, cancel).await {
        Ok(fenced) => fenced,
        Err(e) => {
            // Held by another writer: when that is a promotion that won meanwhile, LATEST
            // names it, which says more than the lease.
            refuse_promoted(bucket.as_ref()).await?;
            return Err(e.into());
        }
    };
    match promote::promote(bucket.as_ref(), dir, opts).await {
        Ok(adopted) => Ok(Promotion { adopted, fenced }),
        Err(e) => {
            fenced.release().await;
            Err(e.into())
        }
    }
}

/// A prefix promoted already is refused, naming the winner (one GET of LATEST).
async fn refuse_promoted(bucket: &dyn crate::bucket::Bucket) -> Result<(), PromotionError> {
    match promote::claimed(bucket).await? {
        Some(c) => Err(PromotionError::AlreadyPromoted(c)),
        None => Ok(()),
    }
}
