//! The runner's record ([`StatusCell`]: what the runner writes through [`record`] and the
//! supervisor reads to evaluate health), and **resting**: a quiet store's runner and supervisor
//! sleep until something can have changed. The runner and the supervisor both import this
//! room, and neither imports the other.
//!
//! # The record
//! One writer, the runner (and the handle, for a drill's outcome), always through [`record`],
//! which wakes the supervisor; the supervisor sets its own fields (the source's problem, the
//! pause, the step's phase) under the lock when it evaluates, which wakes nobody.
//!
//! # Resting
//! A store that is doing nothing must cost nothing between the events that can change that:
//! its directory changing (the [`DirWatch`](crate::store::watch::DirWatch) signal), a node's
//! position report (the service raises the same signal, [`super::BackupHandle::nudge`]), a
//! trigger, what the runner records, or a deadline it really has (the directory watch's trust
//! running out, a restore point or retention falling due: [`super::BackupWorker::quiet_until`]).
//! Ticking every `wal_interval` instead cost a 10,000-store fleet a sixth of a core while it
//! idled.
//!
//! ## The runner
//! After a tick that found the store quiet, with every change of it signalled, the runner
//! **rests**: it sleeps until the signal, a trigger, its lease stopping to hold, shutdown, or
//! the quiet deadline. Woken by the signal it goes back to its regular tick (at most one per
//! `wal_interval`, on the process's grid: a store written to all the time still ships one
//! segment per interval), which checks, as before, whether the store is still quiet. The signal
//! is marked seen before a tick's quiet check takes the directory's stamp, so a change during
//! the tick wakes the next rest at once: a rest never sleeps through a change.
//!
//! ## The supervisor
//! The supervisor rests while the runner rests **and** nothing durable is unshipped (so no lag
//! can grow: the lag deadline only exists while something is unshipped, and then it ticks every
//! `wal_interval` as DESIGN.md section 7 has it). Resting, it is woken by the store's signal or
//! by anything the runner records ([`StatusCell`]), and evaluates health then (at most once per
//! `wal_interval`). Everything health is a function of changes only through those: the runner's
//! record, the counters (written by steps, which the runner records the start and end of), the
//! durable position (signalled), the source's problem (set when a report is checked, and
//! reports are signalled). A worker that exits ends the runner's task, which the supervisor
//! awaits whether it rests or not. So health is what a tick every `wal_interval` would show.
//!
//! # What a crash leaves
//! Nothing: all of it is memory.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LockResult, Mutex, MutexGuard};

use tokio::sync::watch;

use crate::health::RunnerStatus;

/// The runner's record, shared with the supervisor, which is woken by every [`record`].
#[derive(Debug)]
pub(super) struct StatusCell {
    status: Mutex<RunnerStatus>,
    /// Raised after every [`record`].
    recorded: watch::Sender<u64>,
    /// The runner rests (see the module docs).
    resting: AtomicBool,
}

impl StatusCell {
    pub(super) fn new(status: RunnerStatus) -> Arc<StatusCell> {
        Arc::new(StatusCell {
            status: Mutex::new(status),
            recorded: watch::channel(0).0,
            resting: AtomicBool::new(false),
        })
    }

    /// The record, for reading (or the supervisor's own fields); changes made through this
    /// raise nothing: the runner writes through [`record`].
    pub(super) fn lock(&self) -> LockResult<MutexGuard<'_, RunnerStatus>> {
        self.status.lock()
    }

    pub(super) fn recorded(&self) -> watch::Receiver<u64> {
        self.recorded.subscribe()
    }

    pub(super) fn resting(&self) -> bool {
        self.resting.load(Ordering::Acquire)
    }

    /// The runner rests from now until the guard is dropped ([`RestGuard::wake`]).
    pub(super) fn rest(self: &Arc<Self>) -> RestGuard {
        self.resting.store(true, Ordering::Release);
        RestGuard(self.clone())
    }
}

/// Shared between the runner (writes) and the supervisor (reads).
pub(super) type Status = Arc<StatusCell>;

/// Changes the runner's record, then wakes the supervisor.
pub(super) fn record(status: &StatusCell, f: impl FnOnce(&mut RunnerStatus)) {
    f(&mut status.lock().unwrap_or_else(|p| p.into_inner()));
    status.recorded.send_modify(|n| *n = n.wrapping_add(1));
}

/// While held, the runner rests; dropped (woken, or the hold loop returning), it no longer
/// does, and the supervisor is told.
#[derive(Debug)]
pub(super) struct RestGuard(Arc<StatusCell>);

impl RestGuard {
    pub(super) fn wake(self) {}
}

impl Drop for RestGuard {
    fn drop(&mut self) {
        self.0.resting.store(false, Ordering::Release);
        self.0.recorded.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// Waits until either receiver sees a change (a closed channel never wakes: its sender lives
/// as long as the worker, so that is the worker going away, which ends the wait elsewhere).
pub(super) async fn changed(a: &mut watch::Receiver<u64>, b: &mut watch::Receiver<u64>) {
    let forever = || std::future::pending::<()>();
    tokio::select! {
        r = a.changed() => if r.is_err() { forever().await },
        r = b.changed() => if r.is_err() { forever().await },
    }
}
