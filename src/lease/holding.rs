//! [`BucketLease`]: a held lease, its renewal task, and [`LeaseHandle`]s to check it.
//! The rules are in the [parent module's docs](super).
//!
//! # Invariants
//! - `may_write` holds iff the lease has not ended and now is before the deadline; the deadline
//!   only moves forward, and only while the lease holds: once `may_write` is false it stays
//!   false (a renewal that succeeds after the deadline does not revive it).
//! - The holds token is cancelled exactly when the lease ends and never before. It ends on a
//!   412, release, drop, or the deadline passing — noticed by the renewal task's timer, or by
//!   whoever finds it passed first (`may_write`, `guard`, `status`), so nobody sees `may_write`
//!   false with the token not yet cancelled.
//! - `in_bucket` is the lease object as this holder last knew it to be there, updated by every
//!   successful write even after the lease ended, so release deletes the right version.
//! - A renewal refused (412) over an object that holds this holder's own record (holder id and
//!   store: written by this very process, the lease object reached under two names) is no
//!   takeover: the lease renews over that version at its next attempt, its deadline unmoved.
//! - A *fenced* lease (a store lease under an instance lease, [`BucketLease::start_fenced`])
//!   has no renewal task and no deadline of its own: it holds while it has not ended and its
//!   fence holds, and its token is a child of the fence's, so it is cancelled the moment the
//!   fence stops holding. Whoever first finds the fence ended ends the fenced lease too, with
//!   [`LostReason::InstanceLeaseEnded`].

use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use super::acquire::frequent;
use super::{
    LeaseConfig, LeaseError, LeaseRecord, LeaseState, LeaseStatus, LostReason, ReleaseOutcome,
};
use crate::bucket::{BucketError, DynBucket, Object, PutCondition};

/// A held bucket lease. Renews itself from a task it owns until released or dropped; dropping
/// it without [`BucketLease::release`] leaves the lease object behind, as a crash would.
#[derive(Debug)]
pub struct BucketLease {
    handle: LeaseHandle,
    /// Stops the renewal task.
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
}

/// A cheap, cloneable view of a [`BucketLease`] for the code that writes under it: whether it
/// holds, its token, [`LeaseHandle::guard`], its status. It does not keep the lease alive.
#[derive(Clone, Debug)]
pub struct LeaseHandle {
    shared: Arc<Shared>,
}

struct Shared {
    bucket: DynBucket,
    /// The lease object's key: [`LEASE_KEY`](crate::manifest::LEASE_KEY) for a store lease.
    key: String,
    config: LeaseConfig,
    /// The instance lease this (store) lease holds under; `None`: it renews itself.
    fence: Option<LeaseHandle>,
    /// Cancelled the moment the lease stops holding.
    holds: CancellationToken,
    state: Mutex<State>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("bucket", &self.bucket.url())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

struct State {
    /// The lease object as last known to be in the bucket, and its ETag.
    in_bucket: (LeaseRecord, String),
    /// `may_write` holds until then (unless `ended`).
    deadline: Instant,
    renewals: u64,
    last_error: Option<String>,
    /// The renewal being attempted, retried with the same content until it succeeds.
    pending: Option<Pending>,
    ended: Option<LeaseState>,
}

struct Pending {
    record: LeaseRecord,
    body: Bytes,
    /// The start of the first attempt that failed indeterminately: it may have landed since.
    may_have_landed_from: Option<Instant>,
}

/// How one renewal attempt ended.
enum Renewal {
    /// Written; the next renewal is due a renewal interval after `base`.
    Renewed {
        base: Instant,
    },
    Failed,
    TakenOver,
}

impl BucketLease {
    /// Starts holding: `record` was written with ETag `etag` by a request started at `started`.
    pub(super) fn start(
        bucket: DynBucket,
        key: String,
        config: LeaseConfig,
        record: LeaseRecord,
        etag: String,
        started: Instant,
        tasks: &tokio_util::task::TaskTracker,
    ) -> BucketLease {
        let deadline = started + config.may_write_for();
        tracing::info!(store = %config.store, holder = %config.holder, "holding the bucket lease");
        let shared = Arc::new(Shared {
            bucket,
            key,
            config,
            fence: None,
            holds: CancellationToken::new(),
            state: Mutex::new(State {
                in_bucket: (record, etag),
                deadline,
                renewals: 0,
                last_error: None,
                pending: None,
                ended: None,
            }),
        });
        let stop = CancellationToken::new();
        let task = tasks.spawn(renew_loop(shared.clone(), stop.clone(), started));
        BucketLease {
            handle: LeaseHandle { shared },
            stop,
            task: Some(task),
        }
    }

    /// Starts holding a store lease under `fence` (an instance lease): `record` was written
    /// with ETag `etag`. Nothing renews it; it holds while `fence` does (see the module docs).
    pub(super) fn start_fenced(
        bucket: DynBucket,
        key: String,
        config: LeaseConfig,
        record: LeaseRecord,
        etag: String,
        fence: LeaseHandle,
    ) -> BucketLease {
        tracing::debug!(store = %config.store, fence = %fence.shared.config.holder, "holding the store lease under the instance lease");
        let holds = fence.shared.holds.child_token();
        let shared = Arc::new(Shared {
            bucket,
            key,
            config,
            fence: Some(fence),
            holds,
            state: Mutex::new(State {
                in_bucket: (record, etag),
                // Unused: the fence's deadline is the one that counts.
                deadline: Instant::now(),
                renewals: 0,
                last_error: None,
                pending: None,
                ended: None,
            }),
        });
        BucketLease {
            handle: LeaseHandle { shared },
            stop: CancellationToken::new(),
            task: None,
        }
    }

    /// A handle for the code that writes under this lease.
    pub fn handle(&self) -> LeaseHandle {
        self.handle.clone()
    }

    /// See [`LeaseHandle::may_write`].
    pub fn may_write(&self) -> bool {
        self.handle.may_write()
    }

    /// See [`LeaseHandle::token`].
    pub fn token(&self) -> CancellationToken {
        self.handle.token()
    }

    /// See [`LeaseHandle::guard`].
    pub async fn guard<F: Future>(&self, fut: F) -> Result<F::Output, LeaseError> {
        self.handle.guard(fut).await
    }

    /// See [`LeaseHandle::status`].
    pub fn status(&self) -> LeaseStatus {
        self.handle.status()
    }

    /// Whether the lease uses conditional writes; `false` is best effort.
    pub fn is_conditional(&self) -> bool {
        self.handle.shared.config.conditional
    }

    /// Stops holding and renewing (a renewal in flight is let finish, at most until the
    /// deadline), then deletes the lease object with `If-Match` on the version this holder last
    /// wrote, so a successor acquires at once. A 412 means it was taken over meanwhile: that is
    /// [`ReleaseOutcome::TakenOver`], and the object is left alone. After a failed delete the
    /// object stays, and a successor takes it over after a TTL.
    pub async fn release(mut self) -> Result<ReleaseOutcome, LeaseError> {
        let shared = self.handle.shared.clone();
        shared.end(LeaseState::Released, true);
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        let outcome = shared.delete().await;
        tracing::info!(store = %shared.config.store, ?outcome, "released the bucket lease");
        outcome
    }
}

impl Drop for BucketLease {
    fn drop(&mut self) {
        self.stop.cancel();
        self.handle.shared.end(LeaseState::Released, false);
    }
}

impl LeaseHandle {
    /// Whether this process may write to the prefix now: the lease has not been lost or
    /// released, and now is before the start of the last successful renewal (or of the
    /// acquisition) plus the TTL minus the margin. Once false, false for good.
    pub fn may_write(&self) -> bool {
        self.shared.holding_until().is_some()
    }

    /// A token cancelled the moment `may_write` stops holding.
    pub fn token(&self) -> CancellationToken {
        self.shared.holds.clone()
    }

    /// Runs `fut` while the lease holds: [`LeaseError::Lost`] without polling it when the lease
    /// does not hold, and [`LeaseError::Lost`] the moment it stops holding, dropping `fut` (a
    /// request in flight is cancelled, and may or may not have taken effect).
    pub async fn guard<F: Future>(&self, fut: F) -> Result<F::Output, LeaseError> {
        let mut fut = std::pin::pin!(fut);
        loop {
            let Some(deadline) = self.shared.holding_until() else {
                return Err(LeaseError::Lost);
            };
            tokio::select! {
                biased;
                _ = self.shared.holds.cancelled() => return Err(LeaseError::Lost),
                // Renewed since, or not: look again. (Not waiting on the renewal task's timer
                // keeps the deadline exact whatever the order tasks wake in.)
                _ = sleep_until(deadline) => {}
                out = &mut fut => return Ok(out),
            }
        }
    }

    /// A **confirming read** (see [`super::LeaseRecord::ack_window_ms`]): reads the lease
    /// object and answers the instant this read started when it still holds the record this
    /// holder wrote. When it names another holder or is gone, the lease was taken over (a
    /// promotion, `lease::TakeOver`): the lease ends, [`LostReason::TakenOver`], and the
    /// answer is [`LeaseError::Lost`]. A failed read says nothing either way (the error).
    pub async fn confirm(&self) -> Result<Instant, LeaseError> {
        let started = Instant::now();
        if self.shared.holding_until().is_none() {
            return Err(LeaseError::Lost);
        }
        // Holder and store: in the service every store of an instance has the instance's
        // holder id.
        let ours = {
            let r = &self.shared.state().in_bucket.0;
            (r.holder.clone(), r.store.clone())
        };
        let theirs = match self.shared.bucket.get(&self.shared.key).await {
            Ok(object) => LeaseRecord::from_json(&object.data)
                .map(|r| (r.holder, r.store))
                .unwrap_or_else(|_| ("(not a lease record)".into(), String::new())),
            Err(BucketError::NotFound { .. }) => ("(no lease object)".into(), String::new()),
            Err(e) => return Err(e.into()),
        };
        if theirs != ours {
            tracing::warn!(store = %self.shared.config.store, holder = %theirs.0, "the bucket lease was taken over");
            self.shared.lose(LostReason::TakenOver);
            return Err(LeaseError::Lost);
        }
        match self.shared.holding_until() {
            Some(_) => Ok(started),
            None => Err(LeaseError::Lost),
        }
    }

    /// Where the lease stands, for health.
    pub fn status(&self) -> LeaseStatus {
        let shared = &self.shared;
        // Ends the lease first if its deadline has passed.
        shared.holding_until();
        let state = shared.state();
        let now_state = state.ended.clone().unwrap_or(LeaseState::Holding);
        let (renewals, last_renewal_error) = match &shared.fence {
            // A fenced lease is renewed by its fence.
            Some(fence) => {
                let f = fence.shared.state();
                (f.renewals, f.last_error.clone())
            }
            None => (state.renewals, state.last_error.clone()),
        };
        LeaseStatus {
            state: now_state,
            holder: shared.config.holder.clone(),
            host: shared.config.host.clone(),
            store: shared.config.store.clone(),
            ttl: shared.config.ttl,
            conditional: shared.config.conditional,
            renewals,
            last_renewal_error,
        }
    }
}

/// Renews the lease every renewal interval until stopped, lost, or past its deadline.
async fn renew_loop(shared: Arc<Shared>, stop: CancellationToken, acquired: Instant) {
    let mut next = shared
        .config
        .renewal_at(acquired + shared.config.renew_every());
    loop {
        let deadline = shared.state().deadline;
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = sleep_until(deadline) => return shared.lose(LostReason::Expired),
            _ = sleep_until(next) => {}
        }
        // Not raced against `stop`: release lets a renewal in flight finish so that it knows
        // which version to delete.
        let outcome = tokio::select! {
            biased;
            outcome = shared.renew_once() => outcome,
            _ = sleep_until(deadline) => return shared.lose(LostReason::Expired),
        };
        match outcome {
            Renewal::Renewed { base } => {
                next = shared.config.renewal_at(base + shared.config.renew_every());
            }
            Renewal::Failed => next = Instant::now() + shared.config.renew_retry(),
            Renewal::TakenOver => return shared.lose(LostReason::TakenOver),
        }
    }
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        // Every update under the lock is a few assignments that leave it consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The deadline, while the lease holds. Whoever first finds the deadline passed ends the
    /// lease, so that nobody sees `may_write` false while the token is not yet cancelled.
    fn holding_until(&self) -> Option<Instant> {
        let state = self.state();
        if state.ended.is_some() {
            return None;
        }
        if let Some(fence) = &self.fence {
            drop(state);
            // The fence's own check ends the fence (cancelling its token, and so this one's)
            // before it answers `None`.
            return match fence.shared.holding_until() {
                Some(deadline) => Some(deadline),
                None => {
                    self.lose(LostReason::InstanceLeaseEnded);
                    None
                }
            };
        }
        if Instant::now() < state.deadline {
            return Some(state.deadline);
        }
        drop(state);
        self.lose(LostReason::Expired);
        None
    }

    /// Ends the lease (the first end wins, unless `overrule`) and cancels its token.
    fn end(&self, how: LeaseState, overrule: bool) {
        let mut state = self.state();
        if state.ended.is_none() || overrule {
            state.ended = Some(how);
        }
        drop(state);
        self.holds.cancel();
    }

    fn lose(&self, reason: LostReason) {
        let state = self.state();
        if state.ended.is_none() {
            let last_error = state.last_error.as_deref();
            tracing::warn!(store = %self.config.store, ?reason, ?last_error, "lost the bucket lease");
        }
        drop(state);
        self.end(LeaseState::Lost { reason }, false);
    }

    /// One renewal attempt: the pending record (the next renewal's, made on the first attempt)
    /// written over the version last known to be there.
    #[tracing::instrument(name = "lease.renew", skip_all, fields(store_id = %self.config.store))]
    async fn renew_once(&self) -> Renewal {
        let started = Instant::now();
        let (body, etag) = {
            let mut state = self.state();
            let (record, etag) = &state.in_bucket;
            let etag = etag.clone();
            let next = LeaseRecord {
                renewals: record.next_renewals(),
                ..record.clone()
            };
            let pending = state.pending.get_or_insert_with(|| Pending {
                body: next.to_json(),
                record: next,
                may_have_landed_from: None,
            });
            (pending.body.clone(), etag)
        };
        let written = if self.config.conditional {
            self.bucket
                .put_with(
                    &self.key,
                    body.into(),
                    frequent(PutCondition::IfMatch(etag)),
                )
                .await
        } else {
            self.put_if_still_ours(body, &etag).await
        };
        match written {
            Ok(etag) => self.renewed(started, etag),
            // Refused: an earlier attempt of ours landed, or the object holds this holder's
            // own record (written by this process under another name), or someone else wrote
            // or deleted it.
            Err(BucketError::PreconditionFailed { .. }) => match self.bucket.get(&self.key).await {
                Ok(there) => match self.landed(&there) {
                    Some(base) => self.renewed(base, there.etag),
                    None if self.is_own(&there) => self.resync(there),
                    None => Renewal::TakenOver,
                },
                Err(BucketError::NotFound { .. }) => Renewal::TakenOver,
                Err(e) => self.failed(started, &e),
            },
            Err(e) => self.failed(started, &e),
        }
    }

    /// The renewal of a lease without conditional writes: a plain PUT, only when the object
    /// is still the version this holder wrote (best effort: not atomic).
    async fn put_if_still_ours(&self, body: Bytes, etag: &str) -> Result<String, BucketError> {
        let there = match self.bucket.get(&self.key).await {
            Ok(there) => there,
            Err(BucketError::NotFound { .. }) => {
                return Err(BucketError::precondition_failed(&self.key));
            }
            Err(e) => return Err(e),
        };
        if there.etag != etag {
            // Perhaps an earlier attempt of ours landed: the caller reads it and decides.
            return Err(BucketError::precondition_failed(&self.key));
        }
        self.bucket
            .put(&self.key, body.into(), PutCondition::None)
            .await
    }

    /// Whether `there` holds this holder's own record for this lease (its holder id, which
    /// is this process's, and its store): nobody else wrote it, so it is no takeover.
    fn is_own(&self, there: &Object) -> bool {
        LeaseRecord::from_json(&there.data).is_ok_and(|r| {
            let state = self.state();
            let ours = &state.in_bucket.0;
            r.holder == ours.holder && r.store == ours.store
        })
    }

    /// The object holds this holder's own record, written by this process other than through
    /// this lease (one lease object reached under two names): no takeover, but no renewal
    /// either. The next attempt renews over that version, after the retry delay; the deadline
    /// stays where the last renewal of this lease put it. Counted, with the error health shows.
    fn resync(&self, there: Object) -> Renewal {
        let Ok(record) = LeaseRecord::from_json(&there.data) else {
            return Renewal::TakenOver; // cannot happen: is_own parsed it
        };
        tracing::warn!(store = %self.config.store, key = %self.key, "a renewal was refused: the lease object was rewritten with this holder's own record; renewing over it");
        let mut state = self.state();
        state.in_bucket = (record, there.etag);
        state.pending = None;
        state.last_error = Some(format!(
            "{} was rewritten with this holder's own record by another writer in this process",
            self.key
        ));
        Renewal::Failed
    }

    /// When the object `there` is exactly the pending renewal of an attempt whose answer was
    /// lost, that attempt took effect: the start of the first such attempt.
    fn landed(&self, there: &Object) -> Option<Instant> {
        let state = self.state();
        let pending = state.pending.as_ref()?;
        let from = pending.may_have_landed_from?;
        (pending.body == there.data).then_some(from)
    }

    /// The pending renewal is in the bucket with `etag`, written by a request started at
    /// `base`.
    fn renewed(&self, base: Instant, etag: String) -> Renewal {
        let mut state = self.state();
        let Some(pending) = state.pending.take() else {
            return Renewal::Failed; // cannot happen: renew_once made it
        };
        state.in_bucket = (pending.record, etag);
        state.renewals += 1;
        state.last_error = None;
        if state.ended.is_none() && Instant::now() < state.deadline {
            let deadline = base + self.config.may_write_for();
            state.deadline = state.deadline.max(deadline);
        }
        Renewal::Renewed { base }
    }

    fn failed(&self, started: Instant, e: &BucketError) -> Renewal {
        tracing::warn!(store = %self.config.store, "renewing the bucket lease: {e}");
        let mut state = self.state();
        state.last_error = Some(e.to_string());
        if e.is_indeterminate()
            && let Some(pending) = state.pending.as_mut()
        {
            pending.may_have_landed_from.get_or_insert(started);
        }
        Renewal::Failed
    }

    /// Deletes the lease object if it is (still) this holder's.
    async fn delete(&self) -> Result<ReleaseOutcome, LeaseError> {
        let etag = self.state().in_bucket.1.clone();
        let first = if self.config.conditional {
            self.bucket.delete(&self.key, Some(&etag)).await
        } else {
            Err(BucketError::precondition_failed(&self.key)) // look before deleting: there is no If-Match
        };
        match first {
            Ok(()) => return Ok(ReleaseOutcome::Deleted),
            Err(BucketError::PreconditionFailed { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        let there = match self.bucket.get(&self.key).await {
            Ok(there) => there,
            Err(BucketError::NotFound { .. }) => return Ok(ReleaseOutcome::TakenOver),
            Err(e) => return Err(e.into()),
        };
        let ours = there.etag == etag || self.landed(&there).is_some();
        if !ours {
            return Ok(ReleaseOutcome::TakenOver);
        }
        let if_match = self.config.conditional.then_some(there.etag.as_str());
        match self.bucket.delete(&self.key, if_match).await {
            Ok(()) => Ok(ReleaseOutcome::Deleted),
            Err(BucketError::PreconditionFailed { .. }) => Ok(ReleaseOutcome::TakenOver),
            Err(e) => Err(e.into()),
        }
    }
}
