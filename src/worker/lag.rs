//! The lag health judges: the age of the oldest durable commit still unshipped, by when the
//! supervisor first saw it durable ([`Unshipped`]), and the [`Progress`] built from it and one
//! snapshot of the bucket's figures (`figures.rs`).

use std::time::Duration;

use tokio::time::Instant;

use super::BackupCounters;
use super::figures::BucketFigures;
use crate::health::Progress;

/// The progress of a store whose durable position is `durable` and whose bucket holds
/// `bucket` (one snapshot of it, `figures.rs`), with its lag.
pub(super) fn progress(
    counters: &BackupCounters,
    durable: u64,
    bucket: BucketFigures,
    unshipped: &mut Unshipped,
) -> Progress {
    let shipped = bucket.shipped;
    Progress {
        durable_commit_seq: durable,
        shipped_commit_seq: shipped,
        restore_point_commit_seq: bucket.restore_point,
        bucket_durable_commit_seq: bucket.reaches,
        unshipped_for: unshipped.lag(durable, shipped, Instant::now()),
        immutable: immutable(&counters.immutable),
        branched_from: counters.branch_origin(),
    }
}

/// A write-once store's last check, once its worker has made one.
fn immutable(h: &crate::bucket::write_once::HoldCounts) -> Option<crate::health::ImmutableHealth> {
    use std::sync::atomic::Ordering::Relaxed;
    let checked_at_unix_ms = h.checked_at_ms.load(Relaxed);
    (checked_at_unix_ms != 0).then(|| crate::health::ImmutableHealth {
        checked_at_unix_ms,
        objects_short: h.short.load(Relaxed),
        lock_extensions: h.extensions(),
        lock_heads: h.heads(),
    })
}

/// When the supervisor first saw commits durable, so that the lag is the age of the oldest
/// commit still unshipped. (How long durable has been above shipped at every look is not it:
/// at a busy store it always is, as commits keep arriving between a segment and the next look,
/// so a store that keeps up would turn unhealthy.)
#[derive(Debug, Default)]
pub(super) struct Unshipped {
    /// `(durable_commit_seq, when first seen)`, oldest first, each above the shipped seq.
    seen: std::collections::VecDeque<(u64, Instant)>,
}

impl Unshipped {
    /// Looks kept; beyond, two are merged into one, which errs towards a longer lag.
    const KEEP: usize = 64;

    pub(super) fn lag(&mut self, durable: u64, shipped: u64, now: Instant) -> Duration {
        if durable <= shipped {
            self.seen.clear();
            return Duration::ZERO;
        }
        while self.seen.front().is_some_and(|&(seq, _)| seq <= shipped) {
            self.seen.pop_front();
        }
        if self.seen.back().is_none_or(|&(seq, _)| seq < durable) {
            self.seen.push_back((durable, now));
        }
        if self.seen.len() > Self::KEEP
            && let Some((_, earlier)) = self.seen.remove(1)
        {
            self.seen[1].1 = earlier;
        }
        self.seen.front().map_or(Duration::ZERO, |&(_, t)| now - t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lag_is_the_age_of_the_oldest_unshipped_commit() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut u = Unshipped::default();
        assert_eq!(u.lag(10, 10, t0), Duration::ZERO);
        // A busy store that keeps up: something unshipped at every look, but each look's
        // commits shipped by the next.
        assert_eq!(u.lag(20, 10, t0 + s(1)), s(0));
        assert_eq!(u.lag(30, 20, t0 + s(2)), s(0));
        assert_eq!(u.lag(40, 30, t0 + s(3)), s(0));
        // A stuck one: the oldest unshipped commit ages.
        assert_eq!(u.lag(50, 30, t0 + s(4)), s(1));
        assert_eq!(u.lag(60, 30, t0 + s(9)), s(6));
        assert_eq!(u.lag(60, 45, t0 + s(10)), s(6));
        assert_eq!(u.lag(60, 50, t0 + s(10)), s(1));
        assert_eq!(u.lag(60, 60, t0 + s(11)), Duration::ZERO);
        // Many looks while stuck: still measured from the first.
        for i in 0..200 {
            u.lag(100 + i, 60, t0 + s(20 + i));
        }
        assert!(u.seen.len() <= Unshipped::KEEP);
        assert_eq!(u.lag(400, 60, t0 + s(300)), s(280));
        // Commit 151 was first seen at 71 s; merged looks may only make it look older.
        assert!(u.lag(400, 150, t0 + s(300)) >= s(229));
    }
}
