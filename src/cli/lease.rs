//! The bucket lease of the one-shot commands that write a prefix: `backup --once` and
//! `retention` without `--dry-run` (`backup` without `--once` is a worker, which takes the
//! lease itself and waits for it as a standby).
//!
//! Each takes the prefix's lease as a worker does ([`LeaseAcquirer::try_acquire`], one attempt:
//! a free lease, a stale one, or one whose instance lease is gone is taken), writes only under
//! [`BucketLease::guard`](mushroom_backup::lease::BucketLease::guard), and releases it at the
//! end, so a worker waiting for it takes over at once. While another holder's lease is live
//! (a `serve` holding the store, paused or not, or a follower) the command is refused before
//! it writes anything, naming that holder, its host and its store: it does not wait, because a
//! live holder is a running backup that keeps the lease for as long as it runs, and a command
//! waiting behind it would never end. A holder that died is taken over as a worker would:
//! within a TTL of its last renewal (by the bucket's clock), so a run after a crash is refused
//! for at most that long.
//!
//! # What a crash leaves
//!
//! The lease object naming this process, as a crashed worker leaves it: the next writer takes
//! it over once the bucket's clock shows it unrenewed for a TTL.

use anyhow::anyhow;
use mushroom_backup::bucket::DynBucket;
use mushroom_backup::lease::{Acquisition, BucketLease, LeaseAcquirer, LeaseConfig};
use tokio_util::task::TaskTracker;

/// A lease a command holds, and the tracker its renewal task runs on.
pub(super) struct Held {
    lease: BucketLease,
    tasks: TaskTracker,
}

/// Takes the lease of `bucket`'s prefix for `what` ("retention of URL"), or refuses naming the
/// holder; `hint` says what to do instead.
pub(super) async fn take(
    bucket: DynBucket,
    config: LeaseConfig,
    what: &str,
    hint: &str,
) -> anyhow::Result<Held> {
    let tasks = TaskTracker::new();
    let mut acquirer = LeaseAcquirer::new(bucket, config).tracked(tasks.clone());
    let acquired = acquirer
        .try_acquire()
        .await
        .map_err(|e| anyhow!("{what}: {e}"));
    let lease = match acquired {
        Ok(Acquisition::Acquired(lease)) => lease,
        Ok(Acquisition::HeldElsewhere {
            holder,
            host,
            store,
            ..
        }) => {
            tasks.close();
            tasks.wait().await;
            anyhow::bail!(
                "{what}: refused, nothing changed: the bucket lease is held by {holder} on {host} \
                 (store {store}); one writer at a time: {hint} (a dead holder's lease goes stale \
                 within its TTL)"
            )
        }
        Err(e) => {
            tasks.close();
            tasks.wait().await;
            return Err(e);
        }
    };
    Ok(Held { lease, tasks })
}

impl Held {
    pub(super) fn lease(&self) -> &BucketLease {
        &self.lease
    }

    /// Stops renewing and deletes the lease object (a failure is logged: the object then goes
    /// stale within its TTL).
    pub(super) async fn release(self) {
        if let Err(e) = self.lease.release().await {
            tracing::warn!(error = %e, "releasing the bucket lease failed: it goes stale within its TTL");
        }
        self.tasks.close();
        self.tasks.wait().await;
    }
}
