//! One tick of the runner ([`Runner::tick`]): steps until nothing is left, and
//! [`classify`] of each step's result into what the tick does next ([`Next`]).
//!
//! # Invariants
//! - A tick ships at most one segment (more only to work off a backlog near
//!   [`MAX_SEGMENT_BYTES`] a segment), so a busy store costs one segment PUT per
//!   `wal_interval` however slow a PUT is, and still gets its restore points ([`tick_step`]).
//! - Before each step: the lease still allows writes, the pause gate lets it through (and is
//!   held until the step's outcome is booked), and a quiet store's tick answers without a
//!   look, a request or a span. The first step of a tick records the runner as stepping.
//! - Each step runs under [`BucketLease::guard`]. At shutdown or a pause it gets
//!   `shutdown_grace` to finish; one abandoned leaves a view that is not trusted
//!   ([`BackupWorker::forget_view`]).
//! - What a step that succeeded offered as durable is settled by the acknowledgement window
//!   ([`crate::worker::ack::AckWindow::after_step`]) before the tick goes on.
//! - A failed step is recorded (its error, a refusal) and the next tick backs off; a refused
//!   prefix or another writer ends the spell of holding.
//!
//! What a crash leaves: what a step leaves (see `worker/mod.rs`); the tick itself is memory.

use tokio::sync::watch;
use tokio::time::Instant;
use tracing::Instrument;

use super::{Holding, Runner, Spell};
use crate::health::Activity;
use crate::lease::{BucketLease, LeaseError};
use crate::worker::ack::Settled;
use crate::worker::pause::GateState;
use crate::worker::{BackupWorker, MAX_SEGMENT_BYTES, StepMode, StepOutcome, WorkerError};

/// How a tick ended.
pub(super) enum TickEnd {
    /// Nothing more to do, or a failed step backed off: the runner rests or waits.
    Done,
    /// A pause stopped it: the runner holds the lease paused (`paused.rs`).
    Paused,
    /// The spell of holding ends.
    Holding(Holding),
}

/// What a step's result means for the tick ([`classify`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    /// It did something (`shipped`: the bytes of the segment it shipped): step again.
    Again { shipped: Option<u64> },
    /// Nothing (more) to do, or deferred: the tick is over.
    Rest,
    /// It failed: the next tick after a backoff.
    BackOff,
    /// The lease stopped holding under it.
    Lost,
    /// The prefix was refused: release the lease, check again later.
    Refused,
    /// A conditional write was refused: another writer; drop the lease and start over.
    ConcurrentWriter,
}

/// How running one step ended.
enum Stepped {
    Done(Result<Result<StepOutcome, WorkerError>, LeaseError>),
    /// Shutdown came while it ran.
    Shutdown,
    /// A pause came while it ran, and it did not finish within the grace.
    Paused,
}

/// What a step's result means for the tick.
fn classify(stepped: &Result<Result<StepOutcome, WorkerError>, LeaseError>) -> Next {
    match stepped {
        Err(_) => Next::Lost,
        Ok(Ok(StepOutcome::Idle | StepOutcome::Deferred(_))) => Next::Rest,
        Ok(Ok(StepOutcome::Shipped { bytes, .. })) => Next::Again {
            shipped: Some(*bytes),
        },
        Ok(Ok(_)) => Next::Again { shipped: None },
        Ok(Err(e)) if e.is_refusal() => Next::Refused,
        Ok(Err(WorkerError::ConcurrentWriter { .. })) => Next::ConcurrentWriter,
        Ok(Err(_)) => Next::BackOff,
    }
}

impl Runner {
    /// Steps until nothing is left (see the module docs).
    pub(super) async fn tick(&mut self, lease: &BucketLease, spell: &mut Spell) -> TickEnd {
        // The tick has shipped its segment: only a restore point or retention from here on.
        let mut shipped = false;
        let mut stepped_once = false;
        loop {
            if !lease.may_write() {
                return TickEnd::Holding(Holding::Lost);
            }
            // Held until the step's outcome is booked; a pause waits for it.
            let Some(_stepping) = self.gate.begin_step() else {
                return TickEnd::Paused;
            };
            // A quiet store's tick answers without a look, a request or a span.
            if !shipped && matches!(self.worker.quiet().await, Ok(true)) {
                self.step_succeeded();
                return TickEnd::Done;
            }
            if !stepped_once {
                stepped_once = true;
                self.record(|s| s.activity = Activity::Stepping);
            }
            self.ack.before_step(lease);
            let stepped = match self.step(lease, shipped, &mut spell.pausing).await {
                Stepped::Done(r) => r,
                Stepped::Shutdown => return TickEnd::Holding(Holding::Shutdown),
                Stepped::Paused => return TickEnd::Paused,
            };
            if let Ok(Ok(_)) = &stepped {
                match self
                    .ack
                    .after_step(lease, &self.worker.durable, &self.token)
                    .await
                {
                    Settled::Done => {}
                    Settled::Lost => return TickEnd::Holding(Holding::Lost),
                    Settled::Shutdown => return TickEnd::Holding(Holding::Shutdown),
                }
            }
            let next = classify(&stepped);
            match &stepped {
                Ok(Ok(outcome)) if matches!(next, Next::Again { .. }) => {
                    tracing::debug!(?outcome, "step");
                }
                Ok(Err(e)) => self.step_failed(e),
                _ => {}
            }
            match next {
                Next::Again { shipped: bytes } => {
                    if let Some(bytes) = bytes {
                        spell.pace.shipped();
                        // A segment near the cap means a backlog: ship on at once.
                        shipped = bytes < MAX_SEGMENT_BYTES / 2;
                    }
                    self.step_succeeded();
                }
                Next::Rest => {
                    spell.backoff.reset();
                    self.step_succeeded();
                    self.record(|s| s.activity = Activity::Idle);
                    return TickEnd::Done;
                }
                Next::BackOff => {
                    let until = Instant::now() + spell.backoff.next_delay();
                    spell.next_step = spell.pace.back_off(until);
                    return TickEnd::Done;
                }
                Next::Lost => return TickEnd::Holding(Holding::Lost),
                Next::Refused => return TickEnd::Holding(Holding::Refused),
                Next::ConcurrentWriter => return TickEnd::Holding(Holding::ConcurrentWriter),
            }
        }
    }

    /// Runs one step under the lease's guard. At shutdown or a pause the step may finish
    /// within `shutdown_grace`, and is abandoned if it hangs (a request that never answers must
    /// not hold up either): its requests are dropped mid-way (a blocking file write may even
    /// land later), so what it learnt is not to be trusted.
    async fn step(
        &mut self,
        lease: &BucketLease,
        shipped: bool,
        pausing: &mut watch::Receiver<GateState>,
    ) -> Stepped {
        let grace = self.worker.config.shutdown_grace;
        let span = tracing::info_span!("backup.step", store_id = %self.store_id);
        let mut step = Box::pin(
            lease
                .guard(tick_step(&mut self.worker, shipped))
                .instrument(span),
        );
        tokio::select! {
            r = &mut step => Stepped::Done(r),
            _ = self.token.cancelled() => {
                let finished = tokio::time::timeout(grace, &mut step).await.is_ok();
                drop(step);
                if !finished {
                    self.worker.forget_view();
                }
                Stepped::Shutdown
            }
            () = crate::worker::pause::paused(pausing) => {
                match tokio::time::timeout(grace, &mut step).await {
                    Ok(r) => Stepped::Done(r),
                    Err(_) => {
                        drop(step);
                        self.worker.forget_view();
                        Stepped::Paused
                    }
                }
            }
        }
    }

    /// Records a failed step: its error, a refusal of the prefix or of the store, or one more
    /// consecutive failure.
    fn step_failed(&self, e: &WorkerError) {
        tracing::warn!(store = %self.worker.dir.display(), error = %e, "backup step failed");
        self.record(|s| {
            s.last_error = Some(e.to_string());
            s.store_refused = e.store_refusal().map(|r| r.to_string());
            if let WorkerError::Refused { reason } = e {
                s.refused = Some(reason.clone());
            } else {
                s.consecutive_failures += 1;
            }
            s.activity = Activity::Retrying;
        });
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_result_is_classified_once() {
        let lost: Result<Result<StepOutcome, WorkerError>, LeaseError> = Err(LeaseError::Lost);
        assert_eq!(classify(&lost), Next::Lost);
        assert_eq!(classify(&Ok(Ok(StepOutcome::Idle))), Next::Rest);
        let refused = WorkerError::Refused {
            reason: "another store's prefix".into(),
        };
        assert_eq!(classify(&Ok(Err(refused))), Next::Refused);
    }
}
