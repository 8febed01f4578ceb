//! Following a store: step every `wal_interval` until cancelled, then flush a last restore
//! point. Failures back off from [`FIRST_BACKOFF`] doubling to [`MAX_BACKOFF`]; a refusal of
//! the prefix ends the run (nothing will change it but an operator).
//!
//! Cancellation is checked between steps, never inside one, so a step's requests are never
//! cut halfway by shutdown; every sleep races the token.

use tokio_util::sync::CancellationToken;

use super::{BackupWorker, FIRST_BACKOFF, MAX_BACKOFF, RunReport, StepOutcome, WorkerError};

impl BackupWorker {
    /// Follows the store until `cancel`, then flushes (ships what is durable and writes a
    /// restore point) and returns what the flush did.
    pub async fn follow(&mut self, cancel: CancellationToken) -> Result<RunReport, WorkerError> {
        let mut backoff = FIRST_BACKOFF;
        let mut failures = 0u32;
        while !cancel.is_cancelled() {
            let mut delay = self.config.wal_interval;
            loop {
                if cancel.is_cancelled() {
                    break;
                }
                match self.step().await {
                    Ok(StepOutcome::Idle) | Ok(StepOutcome::Deferred(_)) => {
                        backoff = FIRST_BACKOFF;
                        if failures > 0 {
                            tracing::info!("backup recovered after {failures} failed steps");
                            failures = 0;
                        }
                        break;
                    }
                    Ok(outcome) => tracing::debug!(?outcome, "step"),
                    Err(e) if e.is_refusal() => return Err(e),
                    Err(e) => {
                        failures += 1;
                        tracing::warn!(error = %e, failures, retry_in = ?backoff, "backup step failed");
                        delay = backoff;
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                        break;
                    }
                }
            }
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep(delay) => {}
            }
        }
        tracing::info!("flushing a last restore point");
        self.run_once().await
    }
}
