//! [`BackupHandle`]: what the serve loop (the fleet, the CLI's `backup`) holds of a running
//! worker, and the [`BackupTrigger`]s it sends. Through it the worker is paused and resumed,
//! triggered, nudged, read (health, figures, the durable position) and shut down and waited
//! for. The handle writes the runner's record only for a drill's outcome; everything else goes
//! through the worker's channels (triggers, the pause gate, the token). Dropping the handle
//! does not stop the worker. In memory only: a crash leaves nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::BackupCounters;
use super::pause::PauseGate;
use super::runner::{FlushWish, Triggers};
use super::status::{Status, record};
use crate::health::{DrillResult, Pause, StoreHealth, WorkerState};
use crate::store::watch::Signal;

/// What the serve loop tells the worker, over a watch channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackupTrigger {
    /// Ship what is durable now.
    Ship,
    /// Write a restore point now (for what is shipped, once it is).
    RestorePoint,
    /// Run retention now.
    Retention,
    /// Stop; with `flush`, ship what is durable and write a restore point first. The same as
    /// [`BackupHandle::shutdown`] without the wait.
    Shutdown { flush: bool },
}

/// The running worker, as the serve loop holds it.
pub struct BackupHandle {
    /// [`BackupHandle::health_serial`].
    pub(super) serial: Arc<AtomicU64>,
    /// The store's change signal ([`super::BackupWorker::changes`]).
    pub(super) changes: Signal,
    pub(super) triggers: watch::Sender<Triggers>,
    /// The worker's token (a child of the caller's): cancelled by a shutdown.
    pub(super) stop: CancellationToken,
    pub(super) flush: Arc<FlushWish>,
    pub(super) health: watch::Receiver<StoreHealth>,
    pub(super) counters: Arc<BackupCounters>,
    /// `Some` once the supervisor has ended, with how the worker ended.
    pub(super) ended: watch::Receiver<Option<WorkerState>>,
    pub(super) holder: String,
    pub(super) gate: PauseGate,
    /// The runner's record, for what the service records in it (a drill's outcome).
    pub(super) status: Status,
    /// How far a restore reaches (`durable.rs`), and the store's durability mode.
    pub(super) durable: watch::Receiver<super::durable::Durability>,
    pub(super) mode: super::DurabilityMode,
}

impl BackupHandle {
    /// Pauses the worker's uploads (replacing the reason and deadline of a pause already set:
    /// `true` then), and returns once no step is in flight: from then on the worker uploads
    /// nothing, and deletes nothing, until [`Self::resume`]. It keeps its bucket lease. By
    /// then [`Self::health`] shows the pause (unless the worker has ended).
    pub async fn pause(&self, pause: Pause) -> bool {
        let was = self.gate.pause(pause.clone()).await;
        self.nudge();
        self.health_shows(Some(pause)).await;
        was
    }

    /// Ends the pause (`false`: there was none); the worker steps at once. Returns once
    /// [`Self::health`] no longer shows a pause (or the worker has ended).
    pub async fn resume(&self) -> bool {
        let was = self.gate.resume();
        self.nudge();
        self.health_shows(None).await;
        was
    }

    /// Waits until the supervisor's health shows `pause` (it evaluates within a
    /// `wal_interval` of a nudge), or the worker ends.
    pub(super) async fn health_shows(&self, pause: Option<Pause>) {
        let mut health = self.health.clone();
        let mut ended = self.ended.clone();
        // Both senders live as long as the worker's tasks; a closed channel ends the wait.
        tokio::select! {
            _ = async { let _ = health.wait_for(|h| h.paused == pause).await; } => {}
            _ = async { let _ = ended.wait_for(|e| e.is_some()).await; } => {}
        }
    }

    /// Records a restore drill's outcome (the service's `Drill`; see `crate::health`), and
    /// returns once [`Self::health`] shows it (or the worker has ended).
    pub async fn record_drill(&self, drill: DrillResult) {
        let shown = Some(drill.clone());
        self.set_drill(drill);
        let mut health = self.health.clone();
        let mut ended = self.ended.clone();
        tokio::select! {
            _ = async { let _ = health.wait_for(|h| h.last_drill == shown).await; } => {}
            _ = async { let _ = ended.wait_for(|e| e.is_some()).await; } => {}
        }
    }

    /// Records a drill's outcome without waiting for health to show it (the registry's, at
    /// start).
    pub fn set_drill(&self, drill: DrillResult) {
        record(&self.status, |s| s.drill = Some(drill));
    }

    /// The last drill recorded, if any.
    pub fn last_drill(&self) -> Option<DrillResult> {
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drill
            .clone()
    }

    /// Sets (or clears) the note saying why scheduled drills skip the store.
    pub fn note_drill(&self, note: Option<String>) {
        let same = self.status.lock().is_ok_and(|s| s.drill_note == note);
        if !same {
            record(&self.status, |s| s.drill_note = note);
        }
    }

    /// The pause, while one is set.
    pub fn paused(&self) -> Option<Pause> {
        self.gate.current()
    }

    pub fn trigger(&self, trigger: BackupTrigger) {
        match trigger {
            BackupTrigger::Ship => self.triggers.send_modify(|t| t.ship += 1),
            BackupTrigger::RestorePoint => self.triggers.send_modify(|t| t.restore_point += 1),
            BackupTrigger::Retention => self.triggers.send_modify(|t| t.retention += 1),
            BackupTrigger::Shutdown { flush } => self.stop_with(flush),
        }
    }

    /// Something of the store may have changed that its directory does not show (a node
    /// reported a position, a stream ended): a resting worker and supervisor look again.
    pub fn nudge(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Records the flush wish, then cancels the worker's token.
    pub(super) fn stop_with(&self, flush: bool) {
        self.flush.record(flush);
        self.stop.cancel();
    }

    /// The latest health.
    pub fn health(&self) -> StoreHealth {
        self.health.borrow().clone()
    }

    /// Whether the latest health is healthy (without copying it).
    pub fn healthy(&self) -> bool {
        self.health.borrow().healthy
    }

    /// Counts the evaluations that replaced the health (a change of any field, the lag's
    /// included): while it stays the same, so does [`Self::health`].
    pub fn health_serial(&self) -> u64 {
        self.serial.load(Ordering::Acquire)
    }

    /// Health, changing whenever it does.
    pub fn watch_health(&self) -> watch::Receiver<StoreHealth> {
        self.health.clone()
    }

    pub fn counters(&self) -> Arc<BackupCounters> {
        self.counters.clone()
    }

    /// The worker's durable position and its chain breaks (`durable.rs`), changing whenever
    /// they do.
    pub fn watch_durable(&self) -> watch::Receiver<crate::worker::durable::Durability> {
        self.durable.clone()
    }

    /// The store's `durability` option as the worker runs with it.
    pub fn durability_mode(&self) -> crate::worker::DurabilityMode {
        self.mode
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
        self.stop_with(flush);
        self.wait().await
    }

    /// Waits for the worker to end (a shutdown token, or a shutdown sent earlier).
    pub async fn wait(&self) -> WorkerState {
        let mut ended = self.ended.clone();
        match ended.wait_for(|e| e.is_some()).await {
            Ok(state) => state.clone().expect("waited for Some"),
            Err(_) => WorkerState::Panicked("the supervisor vanished".into()),
        }
    }
}
