//! [`BucketFigures`]: what the bucket holds of a store — commits shipped, the newest restore
//! point, and how far a restore reaches — taken together at one moment, so that one health
//! answer never contradicts itself.
//!
//! # Why one snapshot
//!
//! Health used to read the shipped and restore-point counters at the supervisor's last
//! evaluation (up to a `wal_interval` old) and the durable position live at the answer, and the
//! worker published the durable position *before* it booked the step's counters. So an answer
//! could say a restore reaches commit 1125 while only 1044 were shipped, and a store spawned
//! paused (its first step never ran, so nothing was published) said a restore reaches 0 beside
//! a restore point at 1032.
//!
//! # Invariants
//!
//! The figures are written in one place ([`super::ledger::Ledger::publish_figures`]) after a
//! step booked its outcome and offered its durable position, and after a paused runner read
//! LATEST; readers take them whole ([`tokio::sync::watch`]). Within one value:
//! - `reaches` is the highest durable position offered in the worker's current chain
//!   ([`super::durable::DurableTx::offered`]): what a restore of the prefix reaches, as far as
//!   this worker saw the bucket accept. In `durability = sync` a node is told it once the
//!   acknowledgement window allows (`ack/window.rs`); a node is never told more;
//! - `restore_point <= reaches` whenever LATEST names this worker's newest restore point (a
//!   restore starts from it), so a known restore point is never shown beside a restore that
//!   reaches 0;
//! - `reaches <= shipped`: shipped counts the commits in the bucket, in segments or in a
//!   restore point, and whatever a restore reaches is in the bucket.
//!
//! They are the bucket as the worker last saw it: after a lost lease they stay until its next
//! step (a resume, once the lease is back) reads the bucket again, while health's reasons say
//! the lease was lost; a node was told `DurabilityLost` at the loss.
//!
//! # What a crash leaves behind
//!
//! Nothing: memory only. A restarted worker starts from zero and shows the bucket's figures
//! once its first step (or, paused, its read of LATEST) has read them.

use std::sync::atomic::Ordering;

use super::BackupCounters;
use super::durable::DurablePosition;

/// What the bucket holds of a store, taken together (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BucketFigures {
    /// Commits in the bucket, in segments or in a restore point.
    pub shipped: u64,
    /// Commits in the newest restore point this worker wrote or found.
    pub restore_point: u64,
    /// Commits a restore of the prefix reaches now; 0 while unknown.
    pub reaches: u64,
}

impl BucketFigures {
    /// The figures from the counters the step just booked and the durable position offered.
    pub(super) fn of(counters: &BackupCounters, offered: Option<DurablePosition>) -> Self {
        let restore_point = counters.restore_point_commit_seq.load(Ordering::Relaxed);
        let reaches = offered.map_or(0, |p| p.commit_seq);
        // A restore point's commits and whatever a restore reaches are in the bucket, even when
        // the segment counter is behind them (a new generation's snapshot, before its first
        // segment; a paused runner that read LATEST only).
        let shipped = counters
            .shipped_commit_seq
            .load(Ordering::Relaxed)
            .max(restore_point)
            .max(reaches);
        BucketFigures {
            shipped,
            restore_point,
            reaches,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_covers_the_restore_point_and_what_a_restore_reaches() {
        let c = BackupCounters::default();
        assert_eq!(BucketFigures::of(&c, None), BucketFigures::default());
        // A new generation's restore point, before any of its segments.
        c.shipped_commit_seq.store(890, Ordering::Relaxed);
        c.restore_point_commit_seq.store(1000, Ordering::Relaxed);
        let at = |commit_seq| DurablePosition {
            generation: 2,
            commit_seq,
            in_restore_point: commit_seq == 1000,
        };
        assert_eq!(
            BucketFigures::of(&c, Some(at(1000))),
            BucketFigures {
                shipped: 1000,
                restore_point: 1000,
                reaches: 1000
            }
        );
        c.shipped_commit_seq.store(1044, Ordering::Relaxed);
        assert_eq!(
            BucketFigures::of(&c, Some(at(1044))),
            BucketFigures {
                shipped: 1044,
                restore_point: 1000,
                reaches: 1044
            }
        );
    }
}
