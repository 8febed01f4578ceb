//! [`BackupWorker::spawn`]: the worker as a long-running task under the bucket lease, with a
//! supervisor that keeps its health, and the [`BackupHandle`] the caller keeps.
//!
//! Three tasks, each spawned through the caller's [`TaskTracker`]: the [`Runner`] (the worker
//! under the lease, `runner/`), the [`Supervisor`] (health, `supervisor.rs`), and a small task
//! that publishes how the supervisor ended. The lease's renewal task and the acknowledgement
//! window's confirming reads are spawned through the same tracker (see
//! [`LeaseAcquirer::tracked`], `ack/window.rs`). So once a worker has stopped, closing and
//! waiting on the tracker returns, and nothing it spawned is left running.
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
//! [`BackupHandle::pause`] stops every step (and the last flush) while the runner keeps the
//! lease; [`BackupHandle::resume`] lets them go on from the bucket's state (see `pause.rs`).
//! A runner paused without knowing the bucket (started paused) reads LATEST once, so health
//! shows what the bucket holds (`runner/paused.rs`).
//!
//! A quiet store's runner and supervisor **rest** between the events that can change it
//! instead of ticking every `wal_interval` (see [`super::status`]; a deviation from DESIGN.md
//! section 7's "every `wal_interval`", with the same health).
//!
//! # Health
//!
//! The supervisor owns the runner's task: it re-evaluates health every `wal_interval` from what
//! the runner recorded and the durable position (the worker's reading when the worker read it
//! since the last tick, else one the supervisor reads from the WAL source itself) and the
//! source's [`problem`](WalSource::problem) and the running step's phase
//! ([`StepActivity`](health::StepActivity), shown as the activity but not a change of health),
//! and a runner that returns or panics is reported
//! unhealthy with the reason. The lag it judges is the age of the oldest commit still
//! unshipped, by when it first saw that commit durable.
//!
//! What a crash leaves: the lease object until its TTL (see `runner/`); the rest is memory.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::BackupWorker;
use super::ack::AckWindow;
use super::handle::BackupHandle;
use super::pause::PauseGate;
use super::runner::Triggers;
use super::runner::{FlushWish, Runner};
use super::status::{Status, StatusCell};
use super::supervisor::Supervisor;
use crate::backoff::Backoff;
use crate::health::{self, HealthPolicy, Pause, Progress, RunnerStatus, WorkerState};
use crate::lease::{LeaseAcquirer, LeaseConfig};
#[cfg(doc)]
use crate::wal_source::WalSource;

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
