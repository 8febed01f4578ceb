//! [`BackupWorker::run_once_under`]: one run to the end ([`BackupWorker::run_once`]) under a
//! bucket lease the caller holds, as `backup --once` runs it (`cli/lease.rs` takes the lease
//! or refuses naming its holder, and releases it after).
//!
//! Every step runs under [`BucketLease::guard`]: a lease that stops holding (its renewals
//! failed past its deadline, or it was taken over) drops the run mid-request and answers
//! [`LeaseError::Lost`]; what the run uploaded until then is what a crash there would leave
//! (see the module docs of [`crate::worker`]). The acquisition is booked in the ledger like a
//! spawned worker's (`lease_acquisitions`, the `lease_acquired` event).

use super::{BackupWorker, RunReport, WorkerError};
use crate::lease::{BucketLease, LeaseError};

impl BackupWorker {
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
