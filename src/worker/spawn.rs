//! [`BackupWorker::spawn`]: the worker as a long-running task under the bucket lease, with a
//! supervisor that keeps its health.
//!
//! The runner acquires the prefix's [`BucketLease`] before it uploads anything. While another
//! instance holds a fresh lease it uploads nothing, records the holder (health names it) and
//! tries again every third of a TTL, so a successor takes over within about a TTL of a
//! holder's death, and at once after a clean shutdown (which deletes the lease). Holding the
//! lease, it ticks every `wal_interval` (and at once on a [`BackupTrigger`]): a tick steps until
//! nothing is left, but ships at most one segment (more only to work off a backlog near
//! [`MAX_SEGMENT_BYTES`](super::MAX_SEGMENT_BYTES) a segment), so a busy store costs one
//! segment PUT per `wal_interval` however slow a PUT is, and still gets its restore points
//! (see `tick_step`). Every step runs
//! under [`BucketLease::guard`], so a lease that stops holding cancels the step's in-flight
//! requests. A lost lease is dropped and the next acquisition starts from the bucket's state
//! afresh ([`BackupWorker::forget_view`]). A write the bucket refuses (another writer) drops
//! the lease too. A refused prefix releases the lease (it may be another store's to write) and
//! is checked again every `refused_retry`. Shutdown: flush (ship what is durable, write a restore
//! point), then delete the lease.
//!
//! The supervisor owns the runner's task: it re-evaluates health every `wal_interval` from what
//! the runner recorded and the durable position (the worker's reading when the worker read it
//! since the last tick, else one the supervisor reads from the WAL source itself) and the
//! source's [`problem`](WalSource::problem), and a runner that returns or panics is reported unhealthy with the reason. The lag it judges is
//! the age of the oldest commit still unshipped, by when it first saw that commit durable.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{BackupCounters, BackupWorker, FIRST_BACKOFF, StepOutcome, WorkerError};
use crate::health::{self, HealthPolicy, Progress, RunnerStatus, StoreHealth, WorkerState};
use crate::lease::{Acquisition, BucketLease, LeaseAcquirer, LeaseConfig, LeaseError, LeaseState};
use crate::wal_source::WalSource;

/// What the serve loop tells the worker, over a watch channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackupTrigger {
    /// Ship what is durable now.
    Ship,
    /// Write a restore point now (for what is shipped, once it is).
    RestorePoint,
    /// Run retention now.
    Retention,
    /// Stop; with `flush`, ship what is durable and write a restore point first.
    Shutdown { flush: bool },
}

/// Triggers as counters, so that none is lost when several arrive between two looks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Triggers {
    ship: u64,
    restore_point: u64,
    retention: u64,
    shutdown: Option<bool>,
}

/// The running worker, as the serve loop holds it.
pub struct BackupHandle {
    triggers: watch::Sender<Triggers>,
    /// Cancelled by a shutdown trigger (or the caller's token): abandons an in-flight step.
    stop: CancellationToken,
    health: watch::Receiver<StoreHealth>,
    counters: Arc<BackupCounters>,
    /// `Some` once the supervisor has ended, with how the worker ended.
    ended: watch::Receiver<Option<WorkerState>>,
    holder: String,
}

impl BackupHandle {
    pub fn trigger(&self, trigger: BackupTrigger) {
        self.triggers.send_modify(|t| match trigger {
            BackupTrigger::Ship => t.ship += 1,
            BackupTrigger::RestorePoint => t.restore_point += 1,
            BackupTrigger::Retention => t.retention += 1,
            BackupTrigger::Shutdown { flush } => {
                t.shutdown = Some(flush || t.shutdown == Some(true))
            }
        });
        if let BackupTrigger::Shutdown { .. } = trigger {
            self.stop.cancel();
        }
    }

    /// The latest health.
    pub fn health(&self) -> StoreHealth {
        self.health.borrow().clone()
    }

    /// Health, changing whenever it does.
    pub fn watch_health(&self) -> watch::Receiver<StoreHealth> {
        self.health.clone()
    }

    pub fn counters(&self) -> Arc<BackupCounters> {
        self.counters.clone()
    }

    /// This worker's lease holder id.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Whether the worker task has ended.
    pub fn is_finished(&self) -> bool {
        self.ended.borrow().is_some()
    }

    /// Stops the worker (flushing first when asked) and waits for it; returns how it ended.
    pub async fn shutdown(&self, flush: bool) -> WorkerState {
        self.trigger(BackupTrigger::Shutdown { flush });
        self.wait().await
    }

    /// Waits for the worker to end (a shutdown token, or a trigger sent earlier).
    pub async fn wait(&self) -> WorkerState {
        let mut ended = self.ended.clone();
        match ended.wait_for(|e| e.is_some()).await {
            Ok(state) => state.clone().expect("waited for Some"),
            Err(_) => WorkerState::Panicked("the supervisor vanished".into()),
        }
    }
}

/// Shared between the runner (writes) and the supervisor (reads).
type Status = Arc<Mutex<RunnerStatus>>;

fn record(status: &Status, f: impl FnOnce(&mut RunnerStatus)) {
    f(&mut status.lock().unwrap_or_else(|p| p.into_inner()));
}

/// A step (or a quiet tick) went through: whatever failed or was refused before is over.
fn step_succeeded(status: &Status) {
    record(status, |s| {
        s.consecutive_failures = 0;
        s.refused = None;
        s.store_refused = None;
    });
}

impl BackupWorker {
    /// Runs the worker as a task under the lease, with a supervisor keeping its health. The
    /// task stops on `shutdown` (flushing) or on a [`BackupTrigger::Shutdown`].
    pub fn spawn(self, lease: LeaseConfig, shutdown: CancellationToken) -> BackupHandle {
        let (trigger_tx, trigger_rx) = watch::channel(Triggers::default());
        let policy = HealthPolicy {
            wal_interval: self.config.wal_interval,
            min_unhealthy_lag: self.config.min_unhealthy_lag,
            unhealthy_after_failures: super::UNHEALTHY_AFTER_FAILURES,
        };
        let status: Status = Arc::new(Mutex::new(RunnerStatus {
            conditional_writes: lease.conditional && self.config.conditional_writes,
            ..RunnerStatus::default()
        }));
        let holder = lease.holder.clone();
        let first = health::evaluate(
            &status.lock().expect("fresh").clone(),
            Progress::default(),
            &policy,
            &holder,
        );
        let (health_tx, health_rx) = watch::channel(first);
        let counters = self.counters.clone();
        let source = self.source.clone();
        let stop = shutdown.child_token();
        let runner = tokio::spawn(run(self, lease, trigger_rx, stop.clone(), status.clone()));
        let (ended_tx, ended) = watch::channel(None);
        let supervisor = tokio::spawn(supervise(
            runner,
            source,
            counters.clone(),
            status,
            policy,
            holder.clone(),
            health_tx,
        ));
        tokio::spawn(async move {
            let state = match supervisor.await {
                Ok(state) => state,
                Err(e) => WorkerState::Panicked(format!("the supervisor failed: {e}")),
            };
            let _ = ended_tx.send(Some(state));
        });
        BackupHandle {
            triggers: trigger_tx,
            stop,
            health: health_rx,
            counters,
            ended,
            holder,
        }
    }
}

/// How a spell of holding the lease ended.
enum Holding {
    Shutdown {
        flush: bool,
    },
    Lost,
    /// A conditional write was refused: another writer; drop the lease and start over.
    ConcurrentWriter,
    Refused,
}

async fn run(
    mut worker: BackupWorker,
    lease_config: LeaseConfig,
    mut triggers: watch::Receiver<Triggers>,
    shutdown: CancellationToken,
    status: Status,
) -> String {
    let store_id = lease_config.store.clone();
    let mut acquirer = LeaseAcquirer::new(worker.bucket.clone(), lease_config);
    let mut seen = *triggers.borrow_and_update();
    let mut backoff = FIRST_BACKOFF;
    loop {
        if shutdown.is_cancelled() || seen.shutdown.is_some() {
            return "shut down".into();
        }
        let wait = match acquirer.try_acquire().await {
            Ok(Acquisition::Acquired(lease)) => {
                backoff = FIRST_BACKOFF;
                record(&status, |s| s.lease = Some(LeaseState::Holding));
                super::BackupCounters::add(&worker.counters.lease_acquisitions, 1);
                tracing::info!(store = %worker.dir.display(), "acquired the bucket lease");
                worker.forget_view();
                let end = hold(
                    &mut worker,
                    &lease,
                    &mut triggers,
                    &mut seen,
                    &shutdown,
                    &status,
                    &store_id,
                )
                .await;
                match end {
                    Holding::Shutdown { flush } => {
                        if flush {
                            flush_under(&mut worker, &lease, &status).await;
                        }
                        let _ = lease.release().await;
                        record(&status, |s| s.lease = Some(LeaseState::Released));
                        return "shut down".into();
                    }
                    Holding::Lost => {
                        record(&status, |s| s.lease = Some(lease.status().state));
                        super::BackupCounters::add(&worker.counters.lease_losses, 1);
                        tracing::warn!(store = %worker.dir.display(), "lost the bucket lease; acquiring it again");
                        drop(lease);
                        Duration::ZERO
                    }
                    Holding::ConcurrentWriter => {
                        super::BackupCounters::add(&worker.counters.lease_losses, 1);
                        let _ = lease.release().await;
                        record(&status, |s| s.lease = Some(LeaseState::Released));
                        backoff
                    }
                    Holding::Refused => {
                        let _ = lease.release().await;
                        record(&status, |s| s.lease = Some(LeaseState::Released));
                        worker.config.refused_retry
                    }
                }
            }
            Ok(other) => {
                let retry_in = match &other {
                    Acquisition::HeldElsewhere { retry_in, .. } => *retry_in,
                    Acquisition::Acquired(_) => unreachable!("matched above"),
                };
                // The bucket answered: whatever failed before is over.
                backoff = FIRST_BACKOFF;
                record(&status, |s| {
                    s.lease = Some(other.state());
                    s.consecutive_failures = 0;
                });
                retry_in
            }
            Err(e) => {
                tracing::warn!(store = %worker.dir.display(), error = %e, "acquiring the bucket lease failed");
                record(&status, |s| {
                    s.consecutive_failures += 1;
                    s.last_error = Some(e.to_string());
                });
                let d = backoff;
                backoff = (backoff * 2).min(worker.config.max_backoff);
                d
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = triggers.changed() => { seen.shutdown = triggers.borrow_and_update().shutdown.or(seen.shutdown); }
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// Steps while the lease holds, until shutdown or the lease stops holding.
async fn hold(
    worker: &mut BackupWorker,
    lease: &BucketLease,
    triggers: &mut watch::Receiver<Triggers>,
    seen: &mut Triggers,
    shutdown: &CancellationToken,
    status: &Status,
    store_id: &str,
) -> Holding {
    use tracing::Instrument;
    let mut backoff = worker.config.first_backoff;
    let mut next_step = Instant::now();
    let lost = lease.token();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => {
                return Holding::Shutdown { flush: triggers.borrow().shutdown.unwrap_or(true) };
            }
            _ = lost.cancelled() => return Holding::Lost,
            r = triggers.changed() => {
                if r.is_err() {
                    return Holding::Shutdown { flush: true };
                }
                let now = *triggers.borrow_and_update();
                if let Some(flush) = now.shutdown {
                    return Holding::Shutdown { flush };
                }
                if now.restore_point != seen.restore_point {
                    worker.request_restore_point();
                }
                if now.retention != seen.retention {
                    worker.request_retention();
                }
                *seen = now;
            }
            _ = tokio::time::sleep_until(next_step) => {}
        }
        next_step = crate::pacing::coalesce(
            Instant::now() + worker.config.wal_interval,
            worker.config.wal_interval,
        );
        let mut shipped = false;
        loop {
            if !lease.may_write() {
                return Holding::Lost;
            }
            // A quiet store's tick answers without a look, a request or a span.
            if !shipped && matches!(worker.quiet().await, Ok(true)) {
                step_succeeded(status);
                break;
            }
            let grace = worker.config.shutdown_grace;
            let span = tracing::info_span!("backup.step", store_id = %store_id);
            let mut step = Box::pin(lease.guard(tick_step(worker, shipped)).instrument(span));
            let stepped = tokio::select! {
                r = &mut step => r,
                _ = shutdown.cancelled() => {
                    // Let the step finish if it can; abandon it only if it hangs (a request
                    // that never answers must not hold up shutdown).
                    let finished = tokio::time::timeout(grace, &mut step).await.is_ok();
                    drop(step);
                    if !finished {
                        // Its requests were dropped mid-way (a blocking file write may even
                        // land later): what it learnt is not to be trusted.
                        worker.forget_view();
                    }
                    let flush = triggers.borrow().shutdown.unwrap_or(true);
                    return Holding::Shutdown { flush };
                }
            };
            drop(step);
            match stepped {
                Err(LeaseError::Lost) | Err(_) => return Holding::Lost,
                Ok(Ok(StepOutcome::Idle)) | Ok(Ok(StepOutcome::Deferred(_))) => {
                    backoff = worker.config.first_backoff;
                    step_succeeded(status);
                    break;
                }
                Ok(Ok(outcome)) => {
                    tracing::debug!(?outcome, "step");
                    if let StepOutcome::Shipped { bytes, .. } = outcome {
                        // A segment near the cap means a backlog: ship on at once.
                        shipped = bytes < super::MAX_SEGMENT_BYTES / 2;
                    }
                    step_succeeded(status);
                }
                Ok(Err(e)) => {
                    tracing::warn!(store = %worker.dir.display(), error = %e, "backup step failed");
                    let refusal = e.is_refusal();
                    record(status, |s| {
                        s.last_error = Some(e.to_string());
                        s.store_refused = e.store_refusal().map(|r| r.to_string());
                        if let WorkerError::Refused { reason } = &e {
                            s.refused = Some(reason.clone());
                        } else {
                            s.consecutive_failures += 1;
                        }
                    });
                    if refusal {
                        return Holding::Refused;
                    }
                    if matches!(e, WorkerError::ConcurrentWriter { .. }) {
                        return Holding::ConcurrentWriter;
                    }
                    next_step = Instant::now() + backoff;
                    backoff = (backoff * 2).min(worker.config.max_backoff);
                    break;
                }
            }
        }
    }
}

/// One step of a tick. Until the tick has shipped its segment, [`BackupWorker::step`]; after,
/// only what a step finds to do once everything is shipped — a restore point when one is due,
/// then retention when due — and what became durable while the segment went up waits for the
/// next tick. Stepping on would ship it at once: with commits arriving faster than a PUT takes,
/// a step would never find everything shipped, so segments would go up back to back (one per
/// PUT's latency, not one per `wal_interval`) and no restore point would be written.
async fn tick_step(worker: &mut BackupWorker, shipped: bool) -> Result<StepOutcome, WorkerError> {
    if !shipped {
        return worker.step().await;
    }
    let result = async {
        if worker.restore_point_due()
            && let Some(outcome) = super::restore_point::write(worker).await?
        {
            return Ok(outcome);
        }
        if worker.retention_due() {
            return super::retention::run(worker).await;
        }
        Ok(StepOutcome::Idle)
    }
    .await;
    // What `step` does with a failure.
    if let Err(e) = &result {
        if matches!(e, WorkerError::ConcurrentWriter { .. }) {
            worker.forget_view();
        }
        BackupCounters::add(&worker.counters.failures, 1);
    }
    result
}

/// The last flush before a clean shutdown, under the lease; bounded so shutdown stays quick.
async fn flush_under(worker: &mut BackupWorker, lease: &BucketLease, status: &Status) {
    let timeout = worker.config.flush_timeout;
    let flush = async {
        match lease.guard(worker.run_once()).await {
            // Another writer — or a write of an abandoned step landing late: start over once.
            Ok(Err(WorkerError::ConcurrentWriter { .. })) => {
                worker.forget_view();
                lease.guard(worker.run_once()).await
            }
            other => other,
        }
    };
    match tokio::time::timeout(timeout, flush).await {
        Ok(Ok(Ok(report))) => tracing::info!(?report, "flushed a last restore point"),
        Ok(Ok(Err(e))) => {
            tracing::warn!(error = %e, "the last flush failed");
            record(status, |s| {
                s.last_error = Some(format!("the last flush failed: {e}"))
            });
        }
        Ok(Err(e)) => tracing::warn!(error = %e, "the lease stopped holding during the last flush"),
        Err(_) => tracing::warn!("the last flush did not finish in time"),
    }
}

#[allow(clippy::too_many_arguments)]
async fn supervise(
    mut runner: JoinHandle<String>,
    source: Arc<dyn WalSource>,
    counters: Arc<BackupCounters>,
    status: Status,
    policy: HealthPolicy,
    holder: String,
    health: watch::Sender<StoreHealth>,
) -> WorkerState {
    let mut unshipped = Unshipped::default();
    // The inputs of the last evaluation.
    let mut evaluated: Option<(Progress, RunnerStatus)> = None;
    // `counters.durable_reads` at the last tick.
    let mut worker_reads = 0;
    let period = policy.wal_interval;
    let mut next_tick = Instant::now();
    let ended = loop {
        tokio::select! {
            r = &mut runner => break match r {
                Ok(why) => WorkerState::Exited(why),
                Err(e) if e.is_panic() => {
                    let p = e.into_panic();
                    let msg = p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "a panic without a message".into());
                    WorkerState::Panicked(msg)
                }
                Err(e) => WorkerState::Exited(format!("the task was cancelled: {e}")),
            },
            _ = tokio::time::sleep_until(next_tick) => {}
        }
        next_tick = crate::pacing::coalesce(Instant::now() + period, period);
        let reads = counters
            .durable_reads
            .load(std::sync::atomic::Ordering::Acquire);
        let durable = if reads != worker_reads {
            // The worker read the durable position since the last tick: that reading will do.
            worker_reads = reads;
            counters
                .durable_commit_seq
                .load(std::sync::atomic::Ordering::Relaxed)
        } else {
            // Otherwise read it ourselves: a stuck worker must still show lag. Most reads answer
            // at once (a reported or cached position): only the others get a timer.
            let mut read = source.durable_wal_position();
            let read = match futures::FutureExt::now_or_never(&mut read) {
                Some(r) => Ok(r),
                None => {
                    tokio::time::timeout(policy.wal_interval.max(Duration::from_millis(100)), read)
                        .await
                }
            };
            match read {
                Ok(Ok(p)) => {
                    super::BackupCounters::set(&counters.durable_commit_seq, p.commit_seq);
                    p.commit_seq
                }
                _ => counters
                    .durable_commit_seq
                    .load(std::sync::atomic::Ordering::Relaxed),
            }
        };
        let progress = progress(&counters, durable, &mut unshipped);
        // Health is a function of these two: when neither changed, neither did it.
        let s = {
            let mut now = status.lock().unwrap_or_else(|p| p.into_inner());
            now.source_problem = source.problem();
            if evaluated
                .as_ref()
                .is_some_and(|(p, st)| *p == progress && *st == *now)
            {
                continue;
            }
            now.clone()
        };
        let next = health::evaluate(&s, progress, &policy, &holder);
        health.send_if_modified(|h| {
            let changed = !h.same_state(&next);
            *h = next;
            changed
        });
        evaluated = Some((progress, s));
    };
    record(&status, |s| s.worker = ended.clone());
    let durable = counters
        .durable_commit_seq
        .load(std::sync::atomic::Ordering::Relaxed);
    let progress = progress(&counters, durable, &mut unshipped);
    let s = status.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let _ = health.send(health::evaluate(&s, progress, &policy, &holder));
    ended
}

fn progress(counters: &BackupCounters, durable: u64, unshipped: &mut Unshipped) -> Progress {
    use std::sync::atomic::Ordering::Relaxed;
    let shipped = counters.shipped_commit_seq.load(Relaxed);
    Progress {
        durable_commit_seq: durable,
        shipped_commit_seq: shipped,
        restore_point_commit_seq: counters.restore_point_commit_seq.load(Relaxed),
        unshipped_for: unshipped.lag(durable, shipped, Instant::now()),
    }
}

/// When the supervisor first saw commits durable, so that the lag is the age of the oldest
/// commit still unshipped. (How long durable has been above shipped at every look is not it:
/// at a busy store it always is, as commits keep arriving between a segment and the next look,
/// so a store that keeps up would turn unhealthy.)
#[derive(Debug, Default)]
struct Unshipped {
    /// `(durable_commit_seq, when first seen)`, oldest first, each above the shipped seq.
    seen: std::collections::VecDeque<(u64, Instant)>,
}

impl Unshipped {
    /// Looks kept; beyond, two are merged into one, which errs towards a longer lag.
    const KEEP: usize = 64;

    fn lag(&mut self, durable: u64, shipped: u64, now: Instant) -> Duration {
        if durable <= shipped {
            self.seen.clear();
            return Duration::ZERO;
        }
        while self.seen.front().is_some_and(|&(seq, _)| seq <= shipped) {
            self.seen.pop_front();
        }
        if self.seen.back().is_none_or(|&(seq, _)| seq < durable) {
            self.seen.push_back((durable, now));
        }
        if self.seen.len() > Self::KEEP
            && let Some((_, earlier)) = self.seen.remove(1)
        {
            self.seen[1].1 = earlier;
        }
        self.seen.front().map_or(Duration::ZERO, |&(_, t)| now - t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lag_is_the_age_of_the_oldest_unshipped_commit() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut u = Unshipped::default();
        assert_eq!(u.lag(10, 10, t0), Duration::ZERO);
        // A busy store that keeps up: something unshipped at every look, but each look's
        // commits shipped by the next.
        assert_eq!(u.lag(20, 10, t0 + s(1)), s(0));
        assert_eq!(u.lag(30, 20, t0 + s(2)), s(0));
        assert_eq!(u.lag(40, 30, t0 + s(3)), s(0));
        // A stuck one: the oldest unshipped commit ages.
        assert_eq!(u.lag(50, 30, t0 + s(4)), s(1));
        assert_eq!(u.lag(60, 30, t0 + s(9)), s(6));
        assert_eq!(u.lag(60, 45, t0 + s(10)), s(6));
        assert_eq!(u.lag(60, 50, t0 + s(10)), s(1));
        assert_eq!(u.lag(60, 60, t0 + s(11)), Duration::ZERO);
        // Many looks while stuck: still measured from the first.
        for i in 0..200 {
            u.lag(100 + i, 60, t0 + s(20 + i));
        }
        assert!(u.seen.len() <= Unshipped::KEEP);
        assert_eq!(u.lag(400, 60, t0 + s(300)), s(280));
        // Commit 151 was first seen at 71 s; merged looks may only make it look older.
        assert!(u.lag(400, 150, t0 + s(300)) >= s(229));
    }
}
