//! [`BackupWorker::spawn`]: the worker as a long-running task under the bucket lease, with a
//! supervisor that keeps its health.
//!
//! Three tasks, each spawned through the caller's [`TaskTracker`]: the [`Runner`] (the worker
//! under the lease), the [`Supervisor`] (health, `supervisor.rs`), and a small task that
//! publishes how the supervisor ended. The lease's renewal task is spawned through the same tracker (see
//! [`LeaseAcquirer::tracked`]). So once a worker has stopped, closing and waiting on the tracker
//! returns, and nothing it spawned is left running.
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
//! is checked again every `refused_retry`. Failed steps and failed acquisitions back off
//! ([`Backoff`], `first_backoff` doubling to `max_backoff`).
//!
//! [`BackupHandle::pause`] stops every step (and the last flush) while the runner keeps the
//! lease; [`BackupHandle::resume`] lets them go on from the bucket's state (see `pause.rs`).
//! A runner paused without knowing the bucket (started paused) reads LATEST once, so health
//! shows what the bucket holds (`spawn/paused.rs`).
//!
//! # Shutdown
//!
//! One mechanism: the worker's cancellation token (a child of the caller's). The runner
//! watches nothing else. [`BackupHandle::shutdown`] records whether to flush, then cancels the
//! token; cancelling the caller's token without a wish recorded flushes. The wish is read in
//! one place ([`FlushWish::flush`]). Dropping the handle (and with it the trigger channel) does
//! not stop the worker. Shutdown: flush (ship what is durable, write a restore point), then
//! delete the lease.
//!
//! A quiet store's runner and supervisor **rest** between the events that can change it
//! instead of ticking every `wal_interval` (see [`super::status`]; a deviation from DESIGN.md
//! section 7's "every `wal_interval`", with the same health).
//!
//! The supervisor owns the runner's task: it re-evaluates health every `wal_interval` from what
//! the runner recorded and the durable position (the worker's reading when the worker read it
//! since the last tick, else one the supervisor reads from the WAL source itself) and the
//! source's [`problem`](WalSource::problem) and the running step's phase
//! ([`StepActivity`](health::StepActivity), shown as the activity but not a change of health),
//! and a runner that returns or panics is reported
//! unhealthy with the reason. The lag it judges is the age of the oldest commit still
//! unshipped, by when it first saw that commit durable.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::ack::{AckWindow, Settled};
use super::handle::{BackupHandle, Triggers};
use super::pause::PauseGate;
use super::status::{Status, StatusCell, record};
use super::supervisor::Supervisor;
use super::{BackupWorker, StepMode, StepOutcome, WorkerError};
use crate::backoff::Backoff;
use crate::health::{self, Activity, HealthPolicy, Pause, Progress, RunnerStatus, WorkerState};
use crate::lease::{
    Attempt, BucketLease, LeaseAcquirer, LeaseConfig, LeaseError, LeaseState, LostReason,
};

mod flush;
mod pace;
mod paused;

pub(super) use flush::FlushWish;

impl BackupWorker {
    /// Runs the worker as a task under the lease, with a supervisor keeping its health, every
    /// task spawned through `tasks`. The worker stops when `shutdown` is cancelled (flushing)
    /// or on [`BackupHandle::shutdown`].
    pub fn spawn(
        self,
        lease: LeaseConfig,
        shutdown: CancellationToken,
        tasks: &TaskTracker,
    ) -> BackupHandle {
        let acquirer = LeaseAcquirer::new(self.bucket.clone(), lease);
        self.spawn_under(acquirer, shutdown, tasks)
    }

    /// [`BackupWorker::spawn`] with the lease taken by `acquirer`: e.g. one
    /// [fenced](LeaseAcquirer::fenced) by the instance lease, so that the store costs no
    /// renewals.
    pub fn spawn_under(
        self,
        acquirer: LeaseAcquirer,
        shutdown: CancellationToken,
        tasks: &TaskTracker,
    ) -> BackupHandle {
        self.spawn_paused(acquirer, None, shutdown, tasks)
    }

    /// [`BackupWorker::spawn_under`], paused from the start when `pause` is set (a store the
    /// registry says is paused): the runner takes the lease, and uploads nothing until
    /// [`BackupHandle::resume`].
    pub fn spawn_paused(
        self,
        acquirer: LeaseAcquirer,
        pause: Option<Pause>,
        shutdown: CancellationToken,
        tasks: &TaskTracker,
    ) -> BackupHandle {
        let mut acquirer = acquirer;
        let mode = self.config.durability; // sync: the ack window (`ack/`)
        let ack = AckWindow::for_mode(mode, &mut acquirer, &self.durable, tasks);
        let lease = acquirer.config().clone();
        let (trigger_tx, trigger_rx) = watch::channel(Triggers::default());
        let policy = HealthPolicy {
            wal_interval: self.config.wal_interval,
            min_unhealthy_lag: self.config.min_unhealthy_lag,
            unhealthy_after_failures: super::UNHEALTHY_AFTER_FAILURES,
        };
        // Paused from the first health on, not from the supervisor's first tick.
        let status: Status = StatusCell::new(RunnerStatus {
            conditional_writes: lease.conditional && self.config.conditional_writes,
            pause_overdue: pause
                .as_ref()
                .is_some_and(|p| p.overdue_at(crate::units::unix_now_ms())),
            pause: pause.clone(),
            ..RunnerStatus::default()
        });
        let gate = PauseGate::new(pause);
        let changes = self.changes();
        let holder = lease.holder.clone();
        let first = health::evaluate(
            &status.lock().expect("fresh").clone(),
            Progress::default(),
            &policy,
            &holder,
        );
        let (health_tx, health_rx) = watch::channel(first);
        let ledger = self.ledger.clone();
        let counters = ledger.counters().clone();
        let source = self.source.clone();
        let stop = shutdown.child_token();
        let flush = Arc::new(FlushWish::default());
        let (durable, mode) = (self.durable.subscribe(), self.config.durability);
        let activity = self.activity.clone();
        let first_backoff = self.config.first_backoff;
        let max_backoff = self.config.max_backoff;
        let runner = Runner {
            store_id: lease.store.clone(),
            acquirer: acquirer.tracked(tasks.clone()),
            worker: self,
            triggers: trigger_rx,
            seen: Triggers::default(),
            token: stop.clone(),
            flush: flush.clone(),
            status: status.clone(),
            backoff: Backoff::new(first_backoff, max_backoff),
            gate: gate.clone(),
            ack,
        };
        let runner = tasks.spawn(runner.run());
        let (ended_tx, ended) = watch::channel(None);
        let serial = Arc::new(AtomicU64::new(0));
        let drill_status = status.clone();
        let supervisor = Supervisor {
            serial: serial.clone(),
            changes: changes.clone(),
            source,
            activity,
            ledger,
            status,
            policy,
            holder: holder.clone(),
            health: health_tx,
            gate: gate.clone(),
        };
        let supervisor = tasks.spawn(supervisor.run(runner));
        tasks.spawn(async move {
            let state = match supervisor.await {
                Ok(state) => state,
                Err(e) => WorkerState::Panicked(format!("the supervisor failed: {e}")),
            };
            let _ = ended_tx.send(Some(state));
        });
        BackupHandle {
            serial,
            changes,
            triggers: trigger_tx,
            stop,
            flush,
            health: health_rx,
            counters,
            ended,
            holder,
            gate,
            status: drill_status,
            durable,
            mode,
        }
    }
}

/// How a spell of holding the lease ended.
enum Holding {
    Shutdown,
    Lost,
    /// A conditional write was refused: another writer; drop the lease and start over.
    ConcurrentWriter,
    Refused,
}

/// The runner's task: the worker and everything it steps with.
struct Runner {
    worker: BackupWorker,
    acquirer: LeaseAcquirer,
    store_id: String,
    triggers: watch::Receiver<Triggers>,
    /// The triggers acted on so far.
    seen: Triggers,
    /// The worker's token: its cancellation is the one way to stop.
    token: CancellationToken,
    flush: Arc<FlushWish>,
    status: Status,
    /// After a failed acquisition, or a write refused by another writer.
    backoff: Backoff,
    /// Passed before every step and the last flush (`pause.rs`).
    gate: PauseGate,
    /// What publishes the durable position, in sync mode within the window (`ack/`).
    ack: AckWindow,
}

impl Runner {
    fn record(&self, f: impl FnOnce(&mut RunnerStatus)) {
        record(&self.status, f);
    }

    /// A step (or a quiet tick) went through: whatever failed or was refused before is over.
    fn step_succeeded(&self) {
        self.record(|s| {
            s.consecutive_failures = 0;
            s.refused = None;
            s.store_refused = None;
        });
    }

    async fn run(mut self) -> String {
        self.seen = *self.triggers.borrow_and_update();
        let why = self.acquire_and_hold().await;
        self.worker
            .durable
            .break_chain(&format!("the backup worker stopped ({why})"));
        self.record(|s| s.activity = Activity::Stopped);
        why
    }

    async fn acquire_and_hold(&mut self) -> String {
        loop {
            let lease = {
                let (status, dir) = (&self.status, self.worker.dir.display());
                let observe = |attempt: Attempt<'_>| match attempt {
                    Attempt::HeldElsewhere(other) => record(status, |s| {
                        let state = other.state();
                        if let LeaseState::HeldElsewhere { holder, host, .. } = &state {
                            s.activity = Activity::WaitingForLease {
                                holder: format!("{holder}@{host}"),
                            };
                        }
                        // The bucket answered: whatever failed before is over.
                        s.lease = Some(state);
                        s.consecutive_failures = 0;
                    }),
                    Attempt::Failed(e) => {
                        tracing::warn!(store = %dir, error = %e, "acquiring the bucket lease failed");
                        record(status, |s| {
                            s.consecutive_failures += 1;
                            s.last_error = Some(e.to_string());
                            s.activity = Activity::AcquiringLease;
                        });
                    }
                };
                match self
                    .acquirer
                    .acquire_observed(&self.token, &mut self.backoff, observe)
                    .await
                {
                    Ok(lease) => lease,
                    Err(_) => return "shut down".into(),
                }
            };
            self.record(|s| s.lease = Some(LeaseState::Holding));
            self.worker.ledger.lease_acquired();
            tracing::info!(store = %self.worker.dir.display(), "acquired the bucket lease");
            self.worker.forget_view();
            self.ack.reset();
            let wait = match self.hold(&lease).await {
                Holding::Shutdown => {
                    if self.flush.flush() {
                        self.flush_under(&lease).await;
                    }
                    let _ = lease.release().await;
                    self.record(|s| s.lease = Some(LeaseState::Released));
                    return "shut down".into();
                }
                Holding::Lost => {
                    let state = lease.status().state;
                    let taken_over = matches!(
                        state,
                        LeaseState::Lost {
                            reason: LostReason::TakenOver
                        }
                    );
                    let why = match &state {
                        LeaseState::Lost {
                            reason: LostReason::TakenOver,
                        } => "another holder replaced the bucket lease",
                        LeaseState::Lost {
                            reason: LostReason::Expired,
                        } => "the bucket lease expired: renewals failed until its deadline",
                        LeaseState::Lost {
                            reason: LostReason::InstanceLeaseEnded,
                        } => "the instance lease fencing the bucket lease stopped holding",
                        _ => "the bucket lease stopped holding",
                    };
                    self.worker.ledger.lease_lost(why, taken_over);
                    self.worker.durable.break_chain(why);
                    self.record(|s| s.lease_lost(state));
                    tracing::warn!(store = %self.worker.dir.display(), "lost the bucket lease; acquiring it again");
                    drop(lease);
                    Duration::ZERO
                }
                Holding::ConcurrentWriter => {
                    let why = "another writer is active on the prefix: dropped the bucket lease";
                    self.worker.ledger.lease_lost(why, false);
                    self.worker.durable.break_chain(why);
                    let _ = lease.release().await;
                    self.record(|s| s.lease = Some(LeaseState::Released));
                    self.backoff.next_delay()
                }
                Holding::Refused => {
                    self.worker
                        .durable
                        .break_chain("the prefix was refused: released the bucket lease");
                    let _ = lease.release().await;
                    self.record(|s| {
                        s.lease = Some(LeaseState::Released);
                        s.activity = Activity::Refused;
                    });
                    self.worker.config.refused_retry
                }
            };
            tokio::select! {
                _ = self.token.cancelled() => return "shut down".into(),
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Steps while the lease holds, until shutdown or the lease stops holding.
    async fn hold(&mut self, lease: &BucketLease) -> Holding {
        use tracing::Instrument;
        let wal_interval = self.worker.config.wal_interval;
        let mut backoff = Backoff::new(
            self.worker.config.first_backoff,
            self.worker.config.max_backoff,
        );
        let mut next_step = Instant::now();
        let mut pace = pace::Pace::new(&self.worker.config);
        let lost = lease.token();
        // A closed trigger channel (the handle dropped) is not a shutdown: triggers just stop.
        let mut triggers_open = true;
        // Resting (`super::status`): until when, unless the store's signal comes first.
        let mut changes = self.worker.changes().subscribe();
        let mut rest: Option<(Instant, super::status::RestGuard)> = None;
        // A pause arriving while a step runs (`pause.rs`).
        let mut pausing = self.gate.subscribe();
        loop {
            tokio::select! {
                _ = self.token.cancelled() => return Holding::Shutdown,
                _ = changes.changed(), if rest.is_some() || pace.wakes_on_change() => {
                    // Back to the regular tick (at most one per `wal_interval`); in sync mode,
                    // a tick at once, as soon as the cap's token bucket allows (`pace.rs`).
                    if let Some((_, guard)) = rest.take() {
                        guard.wake();
                    }
                    next_step = pace.on_change(next_step);
                    tracing::trace!(store_id = %self.store_id, in = ?pace.due(next_step).saturating_duration_since(Instant::now()), "store changed: next tick");
                    continue;
                }
                _ = lost.cancelled() => return Holding::Lost,
                r = self.triggers.changed(), if triggers_open => {
                    if r.is_err() {
                        triggers_open = false;
                        continue;
                    }
                    let now = *self.triggers.borrow_and_update();
                    if now.restore_point != self.seen.restore_point {
                        self.worker.request_restore_point();
                    }
                    if now.retention != self.seen.retention {
                        self.worker.request_retention();
                    }
                    self.seen = now;
                }
                _ = tokio::time::sleep_until(rest.as_ref().map_or_else(|| pace.due(next_step), |r| r.0)) => {}
            }
            rest = None;
            // Changes from here on wake the next rest: none slips between this and the stamp.
            changes.borrow_and_update();
            next_step = pace.tick_started(wal_interval);
            tracing::trace!(store_id = %self.store_id, "tick");
            let mut shipped = false;
            let mut stepped_once = false;
            let mut paused = false;
            loop {
                if !lease.may_write() {
                    return Holding::Lost;
                }
                // Held until the step's outcome is booked; a pause waits for it.
                let Some(_stepping) = self.gate.begin_step() else {
                    paused = true;
                    break;
                };
                // A quiet store's tick answers without a look, a request or a span.
                if !shipped && matches!(self.worker.quiet().await, Ok(true)) {
                    self.step_succeeded();
                    break;
                }
                if !stepped_once {
                    stepped_once = true;
                    self.record(|s| s.activity = Activity::Stepping);
                }
                self.ack.before_step(lease);
                let grace = self.worker.config.shutdown_grace;
                let span = tracing::info_span!("backup.step", store_id = %self.store_id);
                let mut step = Box::pin(
                    lease
                        .guard(tick_step(&mut self.worker, shipped))
                        .instrument(span),
                );
                let stepped = tokio::select! {
                    r = &mut step => r,
                    _ = self.token.cancelled() => {
                        // Let the step finish if it can; abandon it only if it hangs (a request
                        // that never answers must not hold up shutdown).
                        let finished = tokio::time::timeout(grace, &mut step).await.is_ok();
                        drop(step);
                        if !finished {
                            // Its requests were dropped mid-way (a blocking file write may even
                            // land later): what it learnt is not to be trusted.
                            self.worker.forget_view();
                        }
                        return Holding::Shutdown;
                    }
                    () = super::pause::paused(&mut pausing) => {
                        // As at shutdown: the step may finish, and is abandoned if it hangs.
                        match tokio::time::timeout(grace, &mut step).await {
                            Ok(r) => r,
                            Err(_) => {
                                drop(step);
                                self.worker.forget_view();
                                paused = true;
                                break;
                            }
                        }
                    }
                };
                drop(step);
                if let Ok(Ok(_)) = &stepped {
                    match self
                        .ack
                        .after_step(lease, &self.worker.durable, &self.token)
                        .await
                    {
                        Settled::Done => {}
                        Settled::Lost => return Holding::Lost,
                        Settled::Shutdown => return Holding::Shutdown,
                    }
                }
                match stepped {
                    Err(LeaseError::Lost) | Err(_) => return Holding::Lost,
                    Ok(Ok(StepOutcome::Idle)) | Ok(Ok(StepOutcome::Deferred(_))) => {
                        backoff.reset();
                        self.step_succeeded();
                        self.record(|s| s.activity = Activity::Idle);
                        break;
                    }
                    Ok(Ok(outcome)) => {
                        tracing::debug!(?outcome, "step");
                        if let StepOutcome::Shipped { bytes, .. } = outcome {
                            pace.shipped();
                            // A segment near the cap means a backlog: ship on at once.
                            shipped = bytes < super::MAX_SEGMENT_BYTES / 2;
                        }
                        self.step_succeeded();
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(store = %self.worker.dir.display(), error = %e, "backup step failed");
                        let refusal = e.is_refusal();
                        self.record(|s| {
                            s.last_error = Some(e.to_string());
                            s.store_refused = e.store_refusal().map(|r| r.to_string());
                            if let WorkerError::Refused { reason } = &e {
                                s.refused = Some(reason.clone());
                            } else {
                                s.consecutive_failures += 1;
                            }
                            s.activity = Activity::Retrying;
                        });
                        if refusal {
                            return Holding::Refused;
                        }
                        if matches!(e, WorkerError::ConcurrentWriter { .. }) {
                            return Holding::ConcurrentWriter;
                        }
                        next_step = pace.back_off(Instant::now() + backoff.next_delay());
                        break;
                    }
                }
            }
            if paused {
                match self.hold_paused(lease).await {
                    Some(holding) => return holding,
                    None => {
                        next_step = Instant::now();
                        continue;
                    }
                }
            }
            if let Some(until) = self.worker.quiet_until() {
                let until = crate::pacing::coalesce(until.max(next_step), wal_interval);
                rest = Some((until, self.status.rest()));
            }
        }
    }

    /// The last flush before a clean shutdown, under the lease; bounded so shutdown stays quick.
    async fn flush_under(&mut self, lease: &BucketLease) {
        let Some(_stepping) = self.gate.begin_step() else {
            tracing::info!(store_id = %self.store_id, "paused: no last flush");
            return;
        };
        self.record(|s| s.activity = Activity::Flushing);
        let worker = &mut self.worker;
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
            Ok(Ok(Ok(report))) => flush::flushed(&report),
            Ok(Ok(Err(e))) => {
                tracing::warn!(error = %e, "the last flush failed");
                self.record(|s| s.last_error = Some(format!("the last flush failed: {e}")));
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "the lease stopped holding during the last flush")
            }
            Err(_) => tracing::warn!("the last flush did not finish in time"),
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
    worker
        .step_as(if shipped {
            StepMode::AfterShipping
        } else {
            StepMode::Full
        })
        .await
}
