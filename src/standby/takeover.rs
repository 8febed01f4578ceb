//! The takeover of a promotion ([`take_over`]): the one call a promotion makes to be sure the
//! prefix's old writer has stopped, the standalone `promote` (`cli/standby.rs`) and the
//! service's `Promote` (`service/fleet/promote.rs`) alike:
//!
//! - take the prefix's bucket lease over at once ([`LeaseAcquirer::take_over_now`]: `If-Match`
//!   on the version read, so of two racing promotions exactly one lands, the other is refused
//!   naming the winner), then wait `fenced_in`: the old holder's acknowledgement window when
//!   its record promises one (a sync store, whichever kind of lease; 1.15 s), else its
//!   deadline by the bucket's clock (`standby::promote` says why either is enough);
//! - where that cannot be proven (an async store of a `serve`, whose store lease follows its
//!   instance lease; a bucket without a clock; conditional writes off): with
//!   `wait_for_lease`, wait until the lease is stale (plain [`LeaseAcquirer::try_acquire`]
//!   attempts, which judge a `serve`'s lease by its instance lease), at most two TTLs and
//!   5 s; otherwise refuse, nothing written, naming why.
//!
//! # The hand-over to the store's worker
//! The lease is taken as a plain (renewing) [`BucketLease`] under the caller's holder id: the
//! standalone `promote`'s own, or in the service the holder id of its instance lease for the
//! destination's lease root ([`Fence::holder`](crate::lease::Fence::holder)), so the
//! promotion's lease does not end with a hiccup of the instance lease while it catches up.
//! When the promotion is done, [`TakenOver::hand_over`] stops renewing and leaves the object as
//! it is; the store's worker then starts under that same holder id (the service's fenced
//! acquirer, or the CLI's worker with the same [`LeaseConfig`]): the object is its own, taken
//! at once ("it is this holder's"), so no other writer can take it in between (it is live for
//! a TTL after its last renewal). No new lease API is needed.
//!
//! # What a crash leaves
//! The lease object naming the promotion's holder id, unrenewed: any other writer (a service's
//! next start has a new nonce, so a new holder id) takes it once it is stale (a TTL).

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::bucket::DynBucket;
use crate::lease::{Acquisition, BucketLease, LeaseAcquirer, LeaseConfig, LeaseError, TakeOver};

/// Why the old writer's lease could not be taken over (nothing was written).
#[derive(Debug, thiserror::Error)]
pub enum TakeoverError {
    #[error(
        "the old writer cannot be proven fenced: {0}; stop it first, or promote with \
         --wait-for-lease (wait_for_lease) to wait until its lease is stale"
    )]
    Unprovable(String),
    #[error(
        "another writer took the bucket lease first: it is held by {holder} on {host} (store \
         {store})"
    )]
    HeldElsewhere {
        holder: String,
        host: String,
        store: String,
    },
    #[error(
        "waited {waited_s} s for the bucket lease to go stale: it is still held by {holder} \
         on {host} (store {store}); its writer is alive: stop it first"
    )]
    StillHeld {
        waited_s: u64,
        holder: String,
        host: String,
        store: String,
    },
    #[error("the bucket lease: {0}")]
    Lease(#[from] LeaseError),
    #[error("interrupted (the service is stopping)")]
    Interrupted,
}

/// A lease held for a promotion.
pub struct TakenOver {
    lease: BucketLease,
    tasks: TaskTracker,
    /// The holder taken over (holder on host (store)), when there was one.
    pub previous: Option<String>,
}

impl TakenOver {
    /// Stops renewing and leaves the lease object, for the store's worker (the same holder
    /// id) to take at once (see the module docs).
    pub async fn hand_over(self) {
        drop(self.lease);
        self.tasks.close();
        self.tasks.wait().await;
    }

    /// Stops renewing and deletes the lease object (a promotion that failed).
    pub async fn release(self) {
        if let Err(e) = self.lease.release().await {
            tracing::warn!(error = %e, "cannot release the promotion's bucket lease; it goes stale by itself");
        }
        self.tasks.close();
        self.tasks.wait().await;
    }
}

/// Fences the old writer of `bucket`'s prefix (see the module docs); `config` names this
/// instance's holder id for the destination's lease root.
pub async fn take_over(
    bucket: DynBucket,
    config: LeaseConfig,
    wait_for_lease: bool,
    cancel: &CancellationToken,
) -> Result<TakenOver, TakeoverError> {
    let tasks = TaskTracker::new();
    let ttl = config.ttl;
    let mut acquirer = LeaseAcquirer::new(bucket, config).tracked(tasks.clone());
    let taken = acquirer.take_over_now().await;
    let result = match taken {
        Ok(TakeOver::Taken {
            lease,
            previous,
            fenced_in,
            proof,
        }) => {
            let previous =
                previous.map(|(h, host, store)| format!("{h} on {host} (store {store})"));
            if let Some(p) = &previous {
                tracing::info!(previous = %p, ?fenced_in, ?proof, "promotion: took the bucket lease over");
            }
            // Past its acknowledgement window (a sync holder: `lease::Fenced::AckWindow`) or
            // its deadline, which the bucket's clock bounds, the old holder acknowledges
            // nothing more.
            tokio::select! {
                _ = cancel.cancelled() => {
                    let _ = lease.release().await;
                    Err(TakeoverError::Interrupted)
                }
                _ = tokio::time::sleep(fenced_in) => Ok((lease, previous)),
            }
        }
        Ok(TakeOver::HeldElsewhere(Acquisition::Acquired(lease))) => Ok((lease, None)),
        Ok(TakeOver::HeldElsewhere(Acquisition::HeldElsewhere {
            holder,
            host,
            store,
            ..
        })) => Err(TakeoverError::HeldElsewhere {
            holder,
            host,
            store,
        }),
        Ok(TakeOver::Unprovable(why)) if wait_for_lease => {
            tracing::info!(%why, "promotion: waiting until the bucket lease is stale");
            wait_until_stale(&mut acquirer, ttl, cancel).await
        }
        Ok(TakeOver::Unprovable(why)) => Err(TakeoverError::Unprovable(why)),
        Err(e) => Err(e.into()),
    };
    match result {
        Ok((lease, previous)) => Ok(TakenOver {
            lease,
            tasks,
            previous,
        }),
        Err(e) => {
            tasks.close();
            tasks.wait().await;
            Err(e)
        }
    }
}

/// `wait_for_lease`: tries as a worker would until the lease is taken, at most two TTLs and
/// 5 s (past that, a holder alive at the start is still alive); the lease, and the holder it
/// was waited for (when one was seen).
async fn wait_until_stale(
    acquirer: &mut LeaseAcquirer,
    ttl: Duration,
    cancel: &CancellationToken,
) -> Result<(BucketLease, Option<String>), TakeoverError> {
    let started = tokio::time::Instant::now();
    let give_up = ttl * 2 + Duration::from_secs(5);
    let mut seen = None;
    loop {
        match acquirer.try_acquire().await? {
            Acquisition::Acquired(lease) => return Ok((lease, seen)),
            Acquisition::HeldElsewhere {
                holder,
                host,
                store,
                retry_in,
                ..
            } => {
                if started.elapsed() >= give_up {
                    return Err(TakeoverError::StillHeld {
                        waited_s: started.elapsed().as_secs(),
                        holder,
                        host,
                        store,
                    });
                }
                tracing::info!(%holder, %host, ?retry_in, "promotion: the bucket lease is still held; waiting");
                seen = Some(format!("{holder} on {host} (store {store})"));
                tokio::select! {
                    _ = cancel.cancelled() => return Err(TakeoverError::Interrupted),
                    _ = tokio::time::sleep(retry_in.min(Duration::from_secs(1))) => {}
                }
            }
        }
    }
}
