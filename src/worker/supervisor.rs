//! The supervisor of a spawned worker (see `spawn.rs`; the runner it watches is `runner/`):
//! health, re-evaluated every `wal_interval` from what the runner records (`status.rs`), the
//! durable position and the pause, whatever the worker is doing, and at once when the
//! bucket's figures change (`figures.rs`: shipped, restore point and a restore's reach, taken
//! together, so one answer never contradicts itself); it owns the runner's task and reports
//! how it ended.
//!
//! A pause's deadline is a wall-clock instant: the supervisor compares it with the clock at
//! every evaluation ([`crate::health::RunnerStatus::pause_overdue`]), and never rests while
//! the store is paused: it ticks every `wal_interval` then, so a pause turns overdue in health
//! within one `wal_interval` of its deadline.
//!
//! What a crash leaves: nothing, all of it is memory.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::{JoinError, JoinHandle};
use tokio::time::Instant;

use super::DurableReading;
use super::lag::{Unshipped, progress};
use super::pause::PauseGate;
use super::runner::RunnerExit;
use super::status::{Status, record};
use crate::health::{self, HealthPolicy, Progress, RunnerStatus, StoreHealth, WorkerState};
use crate::store::watch::Signal;
use crate::wal_source::WalSource;

/// The supervisor's task: health, from what the runner records and the durable position.
pub(super) struct Supervisor {
    /// [`BackupHandle::health_serial`].
    pub(super) serial: Arc<AtomicU64>,
    /// The store's change signal: wakes a resting supervisor.
    pub(super) changes: Signal,
    pub(super) source: Arc<dyn WalSource>,
    /// The running step's phase, read at each evaluation.
    pub(super) activity: health::StepActivity,
    /// The worker's ledger: the supervisor's own readings of the durable position go there.
    pub(super) ledger: super::ledger::Ledger,
    pub(super) status: Status,
    pub(super) policy: HealthPolicy,
    pub(super) holder: String,
    pub(super) health: watch::Sender<StoreHealth>,
    /// The worker's pause, shown in health with whether its deadline passed.
    pub(super) gate: PauseGate,
}

impl Supervisor {
    /// Evaluates health until the runner's task ends, then once more with how it ended.
    pub(super) async fn run(self, mut runner: JoinHandle<RunnerExit>) -> WorkerState {
        let mut unshipped = Unshipped::default();
        // The inputs of the last evaluation.
        let mut evaluated: Option<(Progress, RunnerStatus)> = None;
        let counters = self.ledger.counters().clone();
        let readings = self.ledger.durable_reading();
        // What the bucket holds: a change is evaluated at once, so health shows a restore's
        // reach with the counters it was taken with, never one without the other.
        let mut figures = self.ledger.watch_figures();
        let period = self.policy.wal_interval;
        let mut next_tick = Instant::now();
        // Resting (`super::status`): woken by the store's signal or the runner's record.
        let mut resting = false;
        let mut changes = self.changes.subscribe();
        let mut recorded = self.status.recorded();
        let ended = loop {
            tokio::select! {
                r = &mut runner => break ended(r),
                _ = super::status::changed(&mut changes, &mut recorded), if resting => {
                    // Evaluate at the regular tick (at most one per `wal_interval`).
                    resting = false;
                    continue;
                }
                _ = tokio::time::sleep_until(next_tick), if !resting => {}
                // The sender lives in the ledger, which this task holds: only a change ends it.
                _ = figures.changed() => {}
            }
            // Changes from here on wake the next rest.
            changes.borrow_and_update();
            recorded.borrow_and_update();
            let runner_rests = self.status.resting();
            next_tick = crate::pacing::coalesce(Instant::now() + period, period);
            let durable = self.durable_now(&readings).await;
            let bucket = *figures.borrow_and_update();
            let progress = progress(&counters, durable, bucket, &mut unshipped);
            // Nothing unshipped: no lag can grow while the runner rests.
            // Nor while paused: a pause's deadline comes by the clock alone.
            resting = runner_rests
                && progress.durable_commit_seq <= progress.shipped_commit_seq
                && self.gate.current().is_none();
            // Health is a function of these two: when neither changed, neither did it.
            let Some(s) = self.status_if_changed(&progress, evaluated.as_ref()) else {
                continue;
            };
            self.publish(&s, progress.clone());
            evaluated = Some((progress, s));
        };
        record(&self.status, |s| s.worker = ended.clone());
        let durable = counters.durable_commit_seq.load(Ordering::Relaxed);
        let bucket = *figures.borrow();
        let progress = progress(&counters, durable, bucket, &mut unshipped);
        let s = self
            .status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let _ = self
            .health
            .send(health::evaluate(&s, progress, &self.policy, &self.holder));
        self.serial.fetch_add(1, Ordering::Release);
        ended
    }

    /// The durable position for this evaluation: the worker's reading when it read one since
    /// the last, else one the supervisor reads itself (a stuck worker must still show lag),
    /// else the last known.
    async fn durable_now(&self, readings: &DurableReading) -> u64 {
        if let Some(seq) = readings.take_fresh() {
            return seq;
        }
        // Most reads answer at once (a reported or cached position): only the others get a
        // timer.
        let mut read = self.source.durable_wal_position();
        let read = match futures::FutureExt::now_or_never(&mut read) {
            Some(r) => Ok(r),
            None => {
                let wait = self.policy.wal_interval.max(Duration::from_millis(100));
                tokio::time::timeout(wait, read).await
            }
        };
        match read {
            Ok(Ok(p)) => {
                self.ledger.durable_by_supervisor(p.commit_seq);
                p.commit_seq
            }
            _ => self
                .ledger
                .counters()
                .durable_commit_seq
                .load(Ordering::Relaxed),
        }
    }

    /// The runner's record with the supervisor's own fields brought up to date (the source's
    /// problem, the pause and whether it is overdue, the step's phase, the lease losses still
    /// counted); `None` when neither it nor `progress` changed since the last evaluation.
    fn status_if_changed(
        &self,
        progress: &Progress,
        evaluated: Option<&(Progress, RunnerStatus)>,
    ) -> Option<RunnerStatus> {
        let mut now = self.status.lock().unwrap_or_else(|p| p.into_inner());
        now.source_problem = self.source.problem();
        now.pause = self.gate.current();
        now.pause_overdue = now
            .pause
            .as_ref()
            .is_some_and(|p| p.overdue_at(crate::units::unix_now_ms()));
        now.step = self.activity.get();
        now.lease_losses.count(tokio::time::Instant::now());
        if evaluated.is_some_and(|(p, st)| p == progress && *st == *now) {
            return None;
        }
        Some(now.clone())
    }

    /// Evaluates and publishes health, and an event when it turned or changed its reason.
    fn publish(&self, s: &RunnerStatus, progress: Progress) {
        let next = health::evaluate(s, progress, &self.policy, &self.holder);
        let mut turned = None;
        self.health.send_if_modified(|h| {
            let changed = !h.same_state(&next);
            if h.healthy != next.healthy || h.reason != next.reason {
                turned = Some((next.healthy, next.reason.clone()));
            }
            *h = next;
            changed
        });
        if let Some((healthy, reason)) = turned {
            health_changed(&self.ledger, healthy, &reason);
        }
        self.serial.fetch_add(1, Ordering::Release);
    }
}

/// How the runner's task ended, as health says it: its [`RunnerExit`], a panic with its
/// message, or a cancelled task.
fn ended(joined: Result<RunnerExit, JoinError>) -> WorkerState {
    match joined {
        Ok(exit) => WorkerState::Exited(exit.to_string()),
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
    }
}

/// Publishes that the store turned healthy or unhealthy, or changed its main reason.
fn health_changed(ledger: &super::ledger::Ledger, healthy: bool, reason: &str) {
    let detail = if healthy {
        "healthy".to_string()
    } else {
        format!("unhealthy: {reason}")
    };
    ledger.events().emit(
        crate::events::EventKind::HealthChanged,
        detail,
        crate::events::Facts {
            healthy: Some(healthy),
            ..Default::default()
        },
    );
}
