//! The outcome ledger: the one place the worker's [`BackupCounters`] are written, from what a
//! step returned ([`Ledger::step`]) and from the few events outside a step (a look at the
//! directory, a reading of the durable position, the lease acquired or lost). The step's
//! children (`generation`, `segment`, `restore_point`, `retention`) return what they did in
//! their [`StepOutcome`] and bump nothing.
//!
//! The same outcomes are the worker's events ([`crate::events`]): a generation started, a
//! restore point written, retention deleting objects, the lease acquired, lost or taken over,
//! and (from the supervisor) health changed, published through the ledger's
//! [`Emitter`](crate::events::Emitter) (none outside the service: nothing is published).
//!
//! Also [`DurableReading`], the hand-off of the durable position from the worker to the
//! supervisor, so that the supervisor reads the source itself only when the worker has not,
//! and the [`BucketFigures`] health shows, published whole after the counters are booked
//! (`figures.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::sync::watch;

use super::durable::DurableTx;
use super::figures::BucketFigures;
use super::{BackupCounters, StepOutcome, WorkerError};
use crate::events::{Emitter, EventKind, Facts};

/// The newest reading of the durable position, and whether the supervisor has taken it.
#[derive(Debug, Default)]
pub struct DurableReading {
    commit_seq: AtomicU64,
    fresh: AtomicBool,
}

impl DurableReading {
    /// A fresh reading of the durable position.
    pub fn record(&self, commit_seq: u64) {
        self.commit_seq.store(commit_seq, Ordering::Relaxed);
        self.fresh.store(true, Ordering::Release);
    }

    /// The reading recorded since the last call, if any.
    pub fn take_fresh(&self) -> Option<u64> {
        self.fresh
            .swap(false, Ordering::Acquire)
            .then(|| self.commit_seq.load(Ordering::Relaxed))
    }
}

/// Writes the counters; see the module docs.
#[derive(Debug, Clone)]
pub(crate) struct Ledger {
    counters: Arc<BackupCounters>,
    durable: Arc<DurableReading>,
    events: Emitter,
    /// What the bucket holds, taken together (`figures.rs`); the supervisor watches it.
    figures: Arc<watch::Sender<BucketFigures>>,
}

fn add(field: &AtomicU64, n: u64) {
    field.fetch_add(n, Ordering::Relaxed);
}

fn set(field: &AtomicU64, n: u64) {
    field.store(n, Ordering::Relaxed);
}

impl Ledger {
    pub(crate) fn new(counters: Arc<BackupCounters>) -> Self {
        Ledger {
            counters,
            durable: Arc::new(DurableReading::default()),
            events: Emitter::default(),
            figures: Arc::new(watch::channel(BucketFigures::default()).0),
        }
    }

    /// Takes the bucket's figures from the counters as booked now and the durable position
    /// `durable` offered, and publishes them whole (`figures.rs`). Called after the counters
    /// and the durable position of a step (or of a paused runner's read of LATEST) are set.
    pub(crate) fn publish_figures(&self, durable: &DurableTx) {
        let now = BucketFigures::of(&self.counters, durable.offered());
        self.figures.send_if_modified(|f| {
            let changed = *f != now;
            *f = now;
            changed
        });
    }

    /// The bucket's figures, changing whenever they do.
    pub(crate) fn watch_figures(&self) -> watch::Receiver<BucketFigures> {
        self.figures.subscribe()
    }

    /// Publishes the worker's events through `events` from now on.
    pub(crate) fn set_events(&mut self, events: Emitter) {
        self.events = events;
    }

    /// The worker's emitter (for a drill, health).
    pub(crate) fn events(&self) -> &Emitter {
        &self.events
    }

    pub(crate) fn counters(&self) -> &Arc<BackupCounters> {
        &self.counters
    }

    /// The worker's readings, for the supervisor.
    pub(crate) fn durable_reading(&self) -> Arc<DurableReading> {
        self.durable.clone()
    }

    /// A step looked at the store directory.
    pub(crate) fn looked(&self) {
        add(&self.counters.looks, 1);
    }

    /// The worker read the durable position.
    pub(crate) fn durable(&self, commit_seq: u64) {
        set(&self.counters.durable_commit_seq, commit_seq);
        self.durable.record(commit_seq);
    }

    /// The supervisor read the durable position itself (not a hand-off: it read it).
    pub(crate) fn durable_by_supervisor(&self, commit_seq: u64) {
        set(&self.counters.durable_commit_seq, commit_seq);
    }

    /// A paused runner read what LATEST holds for its lineage (`runner/paused.rs`): shipped and
    /// in a restore point at least that far. Raises the positions, never lowers them.
    pub(crate) fn bucket_position(&self, commit_seq: u64) {
        let c = &*self.counters;
        c.shipped_commit_seq
            .fetch_max(commit_seq, Ordering::Relaxed);
        c.restore_point_commit_seq
            .fetch_max(commit_seq, Ordering::Relaxed);
    }

    pub(crate) fn lease_acquired(&self) {
        add(&self.counters.lease_acquisitions, 1);
        self.events.emit(
            EventKind::LeaseAcquired,
            "acquired the bucket lease",
            Facts::default(),
        );
    }

    /// The lease stopped holding, `why`; `taken_over` when another holder replaced it.
    pub(crate) fn lease_lost(&self, why: &str, taken_over: bool) {
        add(&self.counters.lease_losses, 1);
        let kind = if taken_over {
            EventKind::LeaseTakenOver
        } else {
            EventKind::LeaseLost
        };
        self.events.emit(kind, why, Facts::default());
    }

    /// What one step did (or that it failed).
    pub(crate) fn step(&self, result: &Result<StepOutcome, WorkerError>) {
        let c = &*self.counters;
        let outcome = match result {
            Ok(outcome) => outcome,
            Err(_) => return add(&c.failures, 1),
        };
        match outcome {
            StepOutcome::Resumed {
                shipped_commit_seq,
                restore_point_commit_seq,
                ..
            } => {
                if let Some(seq) = shipped_commit_seq {
                    set(&c.shipped_commit_seq, *seq);
                }
                if let Some(seq) = restore_point_commit_seq {
                    set(&c.restore_point_commit_seq, *seq);
                }
            }
            StepOutcome::NewGeneration {
                generation,
                uploaded,
                reused,
                bytes,
                logical,
                ..
            } => {
                add(&c.generations, 1);
                self.events.emit(
                    EventKind::GenerationStarted,
                    format!("started generation {generation}: {uploaded} objects uploaded, {reused} reused"),
                    Facts {
                        generation: Some(*generation),
                        ..Facts::default()
                    },
                );
                add(&c.objects_shipped, *uploaded);
                add(&c.objects_reused, *reused);
                add(&c.bytes_shipped, *bytes);
                add(&c.bytes_logical, *logical);
            }
            StepOutcome::Shipped {
                bytes,
                logical,
                shipped_commit_seq,
                ..
            } => {
                set(&c.shipped_commit_seq, *shipped_commit_seq);
                add(&c.segments_shipped, 1);
                add(&c.objects_shipped, 1);
                add(&c.bytes_shipped, *bytes);
                add(&c.bytes_logical, *logical);
            }
            StepOutcome::RestorePoint { commit_seq, key } => {
                add(&c.restore_points, 1);
                set(&c.restore_point_commit_seq, *commit_seq);
                self.events.emit(
                    EventKind::RestorePointWritten,
                    format!("restore point at commit {commit_seq}: {key}"),
                    Facts {
                        commit_seq: Some(*commit_seq),
                        ..Facts::default()
                    },
                );
            }
            StepOutcome::Retention { deleted } => {
                add(&c.objects_deleted, *deleted);
                if *deleted > 0 {
                    self.events.emit(
                        EventKind::RetentionDeleted,
                        format!("retention deleted {deleted} objects"),
                        Facts {
                            count: Some(*deleted),
                            ..Facts::default()
                        },
                    );
                }
            }
            StepOutcome::Deferred(_) | StepOutcome::Idle => {}
        }
    }
}

impl super::BackupWorker {
    /// Publishes this worker's events through `events` (a bus bound to its store); without
    /// it the worker publishes nothing.
    pub fn with_events(mut self, events: Emitter) -> Self {
        self.ledger.set_events(events);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reading_is_taken_once() {
        let r = DurableReading::default();
        assert_eq!(r.take_fresh(), None);
        r.record(5);
        r.record(7);
        assert_eq!(r.take_fresh(), Some(7));
        assert_eq!(r.take_fresh(), None);
    }
}
