//! The runner's last phase ([`Runner::flush_under`]): at a clean shutdown, under the lease,
//! ship what is durable and write a restore point; and the flush wish that asks for it.
//!
//! # Invariants
//! - The wish is recorded before the worker's token is cancelled ([`FlushWish::record`]) and
//!   read once, by the runner ([`FlushWish::flush`]); a flush once asked for stays asked for,
//!   and a cancelled parent token without a wish flushes.
//! - A paused worker does not flush (the pause gate holds); the flush runs under the lease's
//!   guard, is bounded by `flush_timeout`, and is abandoned like a step when it does not end.
//!
//! What a crash leaves: what a step leaves (see `worker/mod.rs`); the wish is memory.

use std::sync::atomic::{AtomicU8, Ordering};

use super::Runner;
use crate::health::Activity;
use crate::lease::BucketLease;
use crate::worker::WorkerError;

/// Whether the last flush is wanted, recorded before the worker's token is cancelled.
#[derive(Debug, Default)]
pub(in crate::worker) struct FlushWish(AtomicU8);

impl FlushWish {
    const UNSET: u8 = 0;
    const NO_FLUSH: u8 = 1;
    const FLUSH: u8 = 2;

    /// Records a wish; a flush once asked for stays asked for.
    pub(in crate::worker) fn record(&self, flush: bool) {
        if flush {
            self.0.store(Self::FLUSH, Ordering::Release);
        } else {
            let _ = self.0.compare_exchange(
                Self::UNSET,
                Self::NO_FLUSH,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
    }

    /// Whether to flush at shutdown: unless asked not to (a cancelled parent token flushes).
    pub(in crate::worker) fn flush(&self) -> bool {
        self.0.load(Ordering::Acquire) != Self::NO_FLUSH
    }
}

/// The last flush's line for people: the restore point it wrote, or that there was nothing
/// new (not a debug dump of its report).
fn flushed(report: &crate::worker::RunReport) {
    match report.restore_point {
        Some(commit_seq) => tracing::info!(
            commit_seq,
            segments = report.segments,
            bytes = report.bytes,
            "flushed: a last restore point at commit {commit_seq}"
        ),
        None => tracing::info!("flushed: nothing new since the last restore point"),
    }
}

impl Runner {
    /// The last flush before a clean shutdown, under the lease; bounded so shutdown stays quick.
    pub(super) async fn flush_under(&mut self, lease: &BucketLease) {
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
            Ok(Ok(Ok(report))) => flushed(&report),
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
