//! The flush wish of a shutdown: recorded before the worker's token is cancelled, read once
//! by the runner ([`FlushWish::flush`]). In memory only. And what the last flush says.

use std::sync::atomic::{AtomicU8, Ordering};

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
    pub(super) fn flush(&self) -> bool {
        self.0.load(Ordering::Acquire) != Self::NO_FLUSH
    }
}

/// The last flush's line for people: the restore point it wrote, or that there was nothing
/// new (not a debug dump of its report).
pub(super) fn flushed(report: &crate::worker::RunReport) {
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
