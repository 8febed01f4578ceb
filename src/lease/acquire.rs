//! [`LeaseAcquirer`]: acquiring the lease, or taking over one this process has seen go stale.
//! The rules are in the [parent module's docs](super).

mod take_over;
pub use take_over::{Fenced, TakeOver};

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backoff::Backoff;

use super::fence_watch::{FenceWatch, Verdict};
use super::instance::{Fence, FenceHold};
use super::{BucketLease, FenceRef, LeaseConfig, LeaseError, LeaseHandle, LeaseRecord, LeaseState};
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
    /// Under an instance lease: held first, and named in the store lease, which is then not
    /// renewed ([`super::instance`]). `None`: the lease renews itself.
    fence: Option<Fence>,
    /// Holder ids proven to have stopped (a restarted process's predecessor): a lease naming
    /// one is taken at once.
    proven_dead: Vec<String>,
    /// Judges the instance lease a store lease names, when it names one.
    watch: FenceWatch,
    /// The lease object's key: [`LEASE_KEY`] unless [`LeaseAcquirer::at_key`].
    key: String,
    /// The window promised in every record this acquirer writes
    /// ([`super::LeaseRecord::ack_window_ms`]); `None`: no promise.
    ack_window: Option<std::time::Duration>,
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
            fence: None,
            proven_dead: Vec::new(),
            watch: FenceWatch::new(),
            key: LEASE_KEY.to_string(),
            ack_window: None,
        }
    }

    /// Every record this acquirer writes promises `window` for durable acknowledgements
    /// ([`super::LeaseRecord::ack_window_ms`]): the holder then publishes a durable position
    /// only within `window` of a confirming read ([`super::LeaseHandle::confirm`]). `None`
    /// takes the promise back for the next acquisition.
    pub fn promising_ack_window(&mut self, window: Option<std::time::Duration>) {
        self.ack_window = window;
    }

    /// The window this acquirer promises ([`LeaseAcquirer::promising_ack_window`]).
    pub fn ack_window(&self) -> Option<std::time::Duration> {
        self.ack_window
    }

    /// The lease object is `key` (an instance lease's) rather than [`LEASE_KEY`].
    pub fn at_key(mut self, key: &str) -> Self {
        self.key = key.to_string();
        self
    }

    /// Acquires the lease under `fence`, an instance lease: the store lease names it, is
    /// written once per acquisition and never renewed, and holds while the fence does.
    pub fn fenced(mut self, fence: Fence) -> Self {
        self.watch = FenceWatch::at(fence.bucket());
        self.fence = Some(fence);
        self
    }

    /// Reads the instance leases that store leases name from `root` (the lease root of this
    /// prefix's destination) instead of opening it from the destination's URL.
    pub fn watching_fences_in(mut self, root: DynBucket) -> Self {
        self.watch = FenceWatch::at(root);
        self
    }

    /// Takes at once a lease whose holder is one of `holders`: ids proven to have stopped.
    pub fn proven_dead(mut self, holders: Vec<String>) -> Self {
        self.proven_dead = holders;
        self
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
    /// who holds it and when to look again. Under a fence, the fence is held first (an
    /// instance lease held elsewhere is answered as [`Acquisition::HeldElsewhere`]).
    #[tracing::instrument(name = "lease.acquire", skip_all, fields(store_id = %self.config.store))]
    pub async fn try_acquire(&mut self) -> Result<Acquisition, LeaseError> {
        let fence = match &self.fence {
            None => None,
            Some(f) => match f.hold().await? {
                FenceHold::Held(handle) => Some(handle),
                FenceHold::Elsewhere(answer) => return Ok(answer),
            },
        };
        let me = match &self.fence {
            Some(f) => f.holder().to_string(),
            None => self.config.holder.clone(),
        };
        for _ in 0..MAX_ROUNDS {
            let asked = Instant::now();
            let found = match self.bucket.get(&self.key).await {
                Ok(object) => Some(object),
                Err(BucketError::NotFound { .. }) => None,
                Err(e) => return Err(e.into()),
            };
            let answered = Instant::now();
            let Some(object) = found else {
                self.observed = None;
                let cond = self.condition(PutCondition::IfNoneMatch);
                let record = self.record(&me, 0);
                match self.write(record, cond, fence.as_ref()).await? {
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
            let mut wait = match &record {
                Some(r) => self.config.ttl.max(r.ttl()),
                None => self.config.ttl,
            };
            let ours = record
                .as_ref()
                .is_some_and(|r| r.holder == me || self.proven_dead.contains(&r.holder));
            let mut seen_for = seen;
            let mut host_seen = None;
            let stopped = if ours {
                Some("it is this holder's")
            } else if let Some(f) = record
                .as_ref()
                .and_then(|r| r.fence.as_ref())
                // Not a key any holder of ours writes: the store lease is judged by itself.
                .filter(|f| f.is_plausible())
            {
                match self.judge(f, fence.as_ref()).await? {
                    Verdict::Stopped { why } => Some(why),
                    Verdict::Alive {
                        host,
                        seen,
                        wait: w,
                    } => {
                        (seen_for, wait, host_seen) = (seen, w, Some(host));
                        None
                    }
                }
            } else if seen >= wait {
                Some("it was not renewed for a TTL")
            } else if super::stale_by_bucket_clock(object.age, wait) {
                Some("the bucket's clock shows it unrenewed for a TTL")
            } else {
                None
            };
            if let Some(why) = stopped {
                let renewals = record.as_ref().map_or(0, LeaseRecord::next_renewals);
                let cond = self.condition(PutCondition::IfMatch(object.etag.clone()));
                let new = self.record(&me, renewals);
                match self.write(new, cond, fence.as_ref()).await? {
                    Some(lease) => {
                        if !ours {
                            tracing::info!(
                                store = %self.config.store,
                                previous = ?record.as_ref().map(|r| &r.holder),
                                stale_for = ?seen_for,
                                why,
                                "took over the bucket lease"
                            );
                        }
                        return Ok(Acquisition::Acquired(lease));
                    }
                    None => continue, // someone else took it over first: look at theirs
                }
            }
            let (holder, host, store) = match record {
                Some(r) => (r.holder, host_seen.unwrap_or(r.host), r.store),
                None => ("?".into(), "?".into(), "?".into()),
            };
            return Ok(Acquisition::HeldElsewhere {
                holder,
                host,
                store,
                seen_unchanged_for: seen_for,
                retry_in: self
                    .config
                    .renew_every()
                    .min(wait.saturating_sub(seen_for))
                    .max(Duration::from_millis(1)),
            });
        }
        Err(LeaseError::Contended { rounds: MAX_ROUNDS })
    }

    /// Whether the holder of a store lease naming `named` has stopped. A fence that is this
    /// acquirer's own instance lease, now held by this process under a new holder id, proves
    /// it without a request: taking an instance lease over means its former holder stopped.
    async fn judge(
        &mut self,
        named: &FenceRef,
        ours: Option<&LeaseHandle>,
    ) -> Result<Verdict, LeaseError> {
        if let (Some(f), Some(_)) = (&self.fence, ours)
            && f.key() == named.key
        {
            return Ok(Verdict::Stopped {
                why: "its instance lease is held by this process now",
            });
        }
        let url = self.bucket.url();
        self.watch.judge(&url, named, self.config.ttl).await
    }

    /// The record this acquirer writes, holder `me`, under its fence if it has one.
    fn record(&self, me: &str, renewals: u64) -> LeaseRecord {
        let mut record = LeaseRecord::new(&self.config, renewals);
        record.holder = me.to_string();
        record.ack_window_ms = self.ack_window.map(crate::units::millis_u64);
        if let Some(f) = &self.fence {
            record.ttl_ms = crate::units::millis_u64(f.ttl());
            record.fence = Some(FenceRef {
                key: f.key().to_string(),
                holder: me.to_string(),
            });
        }
        record
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
        fence: Option<&LeaseHandle>,
    ) -> Result<Option<BucketLease>, LeaseError> {
        let started = Instant::now();
        match self
            .bucket
            .put_with(&self.key, record.to_json().into(), frequent(cond))
            .await
        {
            Ok(etag) => {
                self.observed = None;
                if let Some(fence) = fence {
                    return Ok(Some(BucketLease::start_fenced(
                        self.bucket.clone(),
                        self.key.clone(),
                        self.config.clone(),
                        record,
                        etag,
                        fence.clone(),
                    )));
                }
                let lease = BucketLease::start(
                    self.bucket.clone(),
                    self.key.clone(),
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
        retain: None,
    }
}
