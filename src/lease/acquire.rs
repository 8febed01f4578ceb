//! [`LeaseAcquirer`]: acquiring the lease, or taking over one this process has seen go stale.
//! The rules are in the [parent module's docs](super).

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backoff::Backoff;

use super::{BucketLease, LeaseConfig, LeaseError, LeaseRecord, LeaseState};
use crate::bucket::{BucketError, DynBucket, PutCondition, PutHint, PutOpts};
use crate::manifest::LEASE_KEY;

/// Rounds of "look, write, lose the race" before [`LeaseAcquirer::try_acquire`] gives up.
const MAX_ROUNDS: u32 = 3;

/// How one attempt to acquire ended.
#[derive(Debug)]
pub enum Acquisition {
    /// This process holds the lease now.
    Acquired(BucketLease),
    /// Someone else does (or this process has not yet seen it stale for a TTL).
    HeldElsewhere {
        /// The lease object's holder id, host and store (`?` for an unreadable object).
        holder: String,
        host: String,
        store: String,
        /// How long this process has seen the object's ETag unchanged.
        seen_unchanged_for: Duration,
        /// When to try again.
        retry_in: Duration,
    },
}

impl Acquisition {
    /// The lease state this outcome stands for, for health.
    pub fn state(&self) -> LeaseState {
        match self {
            Acquisition::Acquired(_) => LeaseState::Holding,
            Acquisition::HeldElsewhere {
                holder,
                host,
                store,
                ..
            } => LeaseState::HeldElsewhere {
                holder: holder.clone(),
                host: host.clone(),
                store: store.clone(),
            },
        }
    }
}

/// An attempt of [`LeaseAcquirer::acquire_observed`] that did not acquire the lease.
#[derive(Debug)]
pub enum Attempt<'a> {
    /// The bucket answered: another instance holds the lease.
    HeldElsewhere(&'a Acquisition),
    /// The request failed.
    Failed(&'a LeaseError),
}

/// Acquires the lease of one prefix, remembering across attempts which version of the lease
/// object this process saw first and when (on its own monotonic clock).
pub struct LeaseAcquirer {
    bucket: DynBucket,
    config: LeaseConfig,
    /// The ETag of the lease object at the last look, and when it was first seen.
    observed: Option<Observed>,
    /// Where an acquired lease's renewal task is spawned.
    tasks: TaskTracker,
}

struct Observed {
    etag: String,
    /// When the answer that first showed this ETag arrived.
    since: Instant,
}

impl LeaseAcquirer {
    pub fn new(bucket: DynBucket, config: LeaseConfig) -> Self {
        LeaseAcquirer {
            bucket,
            config,
            observed: None,
            tasks: TaskTracker::new(),
        }
    }

    /// Spawns the renewal task of every lease acquired through `tasks` (by default, a tracker
    /// of this acquirer's own), so that whoever waits on `tasks` waits for it too.
    pub fn tracked(mut self, tasks: TaskTracker) -> Self {
        self.tasks = tasks;
        self
    }

    pub fn config(&self) -> &LeaseConfig {
        &self.config
    }

    /// One attempt: acquire the lease if it is free, stale, or this holder's; otherwise say
    /// who holds it and when to look again.
    pub async fn try_acquire(&mut self) -> Result<Acquisition, LeaseError> {
        for _ in 0..MAX_ROUNDS {
            let asked = Instant::now();
            let found = match self.bucket.get(LEASE_KEY).await {
                Ok(object) => Some(object),
                Err(BucketError::NotFound { .. }) => None,
                Err(e) => return Err(e.into()),
            };
            let answered = Instant::now();
            let Some(object) = found else {
                self.observed = None;
                let cond = self.condition(PutCondition::IfNoneMatch);
                match self.write(LeaseRecord::new(&self.config, 0), cond).await? {
                    Some(lease) => return Ok(Acquisition::Acquired(lease)),
                    None => continue, // created by someone else meanwhile: look at theirs
                }
            };
            let record = LeaseRecord::from_json(&object.data).ok();
            let seen = match &self.observed {
                Some(o) if o.etag == object.etag => asked.saturating_duration_since(o.since),
                _ => {
                    self.observed = Some(Observed {
                        etag: object.etag.clone(),
                        since: answered,
                    });
                    Duration::ZERO
                }
            };
            let wait = match &record {
                Some(r) => self.config.ttl.max(r.ttl()),
                None => self.config.ttl,
            };
            let ours = record
                .as_ref()
                .is_some_and(|r| r.holder == self.config.holder);
            if ours || seen >= wait {
                let renewals = record.as_ref().map_or(0, LeaseRecord::next_renewals);
                let cond = self.condition(PutCondition::IfMatch(object.etag.clone()));
                match self
                    .write(LeaseRecord::new(&self.config, renewals), cond)
                    .await?
                {
                    Some(lease) => {
                        tracing::info!(
                            store = %self.config.store,
                            previous = ?record.as_ref().map(|r| &r.holder),
                            stale_for = ?seen,
                            "took over the bucket lease"
                        );
                        return Ok(Acquisition::Acquired(lease));
                    }
                    None => continue, // someone else took it over first: look at theirs
                }
            }
            let (holder, host, store) = match record {
                Some(r) => (r.holder, r.host, r.store),
                None => ("?".into(), "?".into(), "?".into()),
            };
            return Ok(Acquisition::HeldElsewhere {
                holder,
                host,
                store,
                seen_unchanged_for: seen,
                retry_in: self.config.renew_every().min(wait - seen),
            });
        }
        Err(LeaseError::Contended { rounds: MAX_ROUNDS })
    }

    /// Tries until the lease is acquired, waiting as [`Acquisition::HeldElsewhere`] says (and a
    /// third of a TTL after a failed request), until `cancel` is cancelled.
    pub async fn acquire(&mut self, cancel: &CancellationToken) -> Result<BucketLease, LeaseError> {
        let every = self.config.renew_every();
        let mut backoff = Backoff::new(every, every);
        let store = self.config.store.clone();
        self.acquire_observed(cancel, &mut backoff, |attempt| match attempt {
            Attempt::HeldElsewhere(Acquisition::HeldElsewhere {
                retry_in, holder, ..
            }) => {
                tracing::debug!(%holder, ?retry_in, "the bucket lease is held elsewhere");
            }
            Attempt::HeldElsewhere(_) => {}
            Attempt::Failed(e) => {
                tracing::warn!(%store, "acquiring the bucket lease: {e}");
            }
        })
        .await
    }

    /// The one acquisition loop: tries until the lease is acquired or `cancel` is cancelled,
    /// telling `observe` of every attempt that did not acquire it. While another instance holds
    /// it, waits as [`Acquisition::HeldElsewhere`] says (and resets `backoff`: the bucket
    /// answered); after a failed request, waits `backoff`'s next delay.
    ///
    /// `cancel` is checked before every attempt and races every wait, but never an attempt in
    /// flight: an attempt dropped after its write landed would leave a lease this process holds
    /// and never releases, so a successor would wait out its TTL.
    pub async fn acquire_observed(
        &mut self,
        cancel: &CancellationToken,
        backoff: &mut Backoff,
        mut observe: impl FnMut(Attempt<'_>),
    ) -> Result<BucketLease, LeaseError> {
        loop {
            if cancel.is_cancelled() {
                return Err(LeaseError::Cancelled);
            }
            let wait = {
                match self.try_acquire().await {
                    Ok(Acquisition::Acquired(lease)) => {
                        backoff.reset();
                        return Ok(lease);
                    }
                    Ok(other) => {
                        backoff.reset();
                        observe(Attempt::HeldElsewhere(&other));
                        match other {
                            Acquisition::HeldElsewhere { retry_in, .. } => retry_in,
                            Acquisition::Acquired(_) => unreachable!("matched above"),
                        }
                    }
                    Err(e) => {
                        observe(Attempt::Failed(&e));
                        backoff.next_delay()
                    }
                }
            };
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return Err(LeaseError::Cancelled),
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// `cond`, or a plain write when conditional writes are off.
    fn condition(&self, cond: PutCondition) -> PutCondition {
        if self.config.conditional {
            cond
        } else {
            PutCondition::None
        }
    }

    /// Writes the lease object: `Some(lease)` once written, `None` when refused (412).
    async fn write(
        &mut self,
        record: LeaseRecord,
        cond: PutCondition,
    ) -> Result<Option<BucketLease>, LeaseError> {
        let started = Instant::now();
        match self
            .bucket
            .put_with(LEASE_KEY, record.to_json().into(), frequent(cond))
            .await
        {
            Ok(etag) => {
                self.observed = None;
                let lease = BucketLease::start(
                    self.bucket.clone(),
                    self.config.clone(),
                    record,
                    etag,
                    started,
                    &self.tasks,
                );
                Ok(Some(lease))
            }
            Err(BucketError::PreconditionFailed { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

/// How the lease object is written: a frequent rewrite (`FsBucket` swaps it in place).
pub(super) fn frequent(cond: PutCondition) -> PutOpts {
    PutOpts {
        cond,
        hint: PutHint::FrequentRewrite,
    }
}
