//! [`BackupWorker::run_once`]: steps until nothing is left to do, and [`BackupWorker::run_once_under`]: that run under a
//! bucket lease the caller holds, as `backup --once` runs it (`cli/lease.rs` takes the lease
//! or refuses naming its holder, and releases it after).
//!
//! Every step runs under [`BucketLease::guard`]: a lease that stops holding (its renewals
//! failed past its deadline, or it was taken over) drops the run mid-request and answers
//! [`LeaseError::Lost`]; what the run uploaded until then is what a crash there would leave
//! (see the module docs of [`crate::worker`]). The acquisition is booked in the ledger like a
//! spawned worker's (`lease_acquisitions`, the `lease_acquired` event).

use std::time::Duration;

use super::{BackupWorker, StepMode, StepOutcome, WorkerError};
use crate::lease::{BucketLease, LeaseError};

impl BackupWorker {
    /// Steps until nothing is left: everything durable shipped, a restore point written for
    /// it, and retention run. Defers (a snapshot in flight, a source catching up) are waited
    /// out for a few seconds.
    ///
    /// A resume here starts reading the store's files beside its requests ([`local::Reading`]),
    /// so a first backup waits for the longer of the two rather than both. [`Self::step`] does
    /// not: a service resumes every worker at its start, and most find their generation already
    /// in the prefix, so reading ahead there would cost every store's archives for nothing.
    pub async fn run_once(&mut self) -> Result<RunReport, WorkerError> {
        self.restore_point_requested = true;
        self.retention_requested = true;
        let mut report = RunReport::default();
        let mut deferred = 0u32;
        loop {
            match self.step_as(StepMode::ReadAhead).await? {
                StepOutcome::Idle => break,
                StepOutcome::Deferred(reason) => {
                    deferred += 1;
                    if deferred > 100 {
                        return Err(WorkerError::Busy(reason));
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                outcome => report.record(&outcome),
            }
        }
        Ok(report)
    }

    /// [`BackupWorker::run_once`] under `lease`, just acquired by the caller, which releases
    /// it afterwards. Starts from the bucket's state.
    pub async fn run_once_under(
        &mut self,
        lease: &BucketLease,
    ) -> Result<Result<RunReport, WorkerError>, LeaseError> {
        self.ledger.lease_acquired();
        self.forget_view();
        lease.guard(self.run_once()).await
    }
}

/// What [`BackupWorker::run_once`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RunReport {
    pub generations: u64,
    pub segments: u64,
    pub bytes: u64,
    pub restore_point: Option<u64>,
    pub deleted: u64,
}

impl RunReport {
    fn record(&mut self, outcome: &StepOutcome) {
        match outcome {
            StepOutcome::NewGeneration { .. } => self.generations += 1,
            StepOutcome::Shipped { bytes, .. } => {
                self.segments += 1;
                self.bytes += bytes;
            }
            StepOutcome::RestorePoint { commit_seq, .. } => self.restore_point = Some(*commit_seq),
            StepOutcome::Retention { deleted } => self.deleted += deleted,
            _ => {}
        }
    }
}
