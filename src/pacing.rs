//! Coalesced ticks: a thousand idle stores should wake the process a few dozen times a second,
//! not a few thousand.
//!
//! Every store's runner and supervisor tick once per `wal_interval`, and its bucket lease is
//! renewed every third of a TTL, each on its own timer. With the stores' phases spread over the
//! interval, the runtime would wake for nearly every millisecond, and each wake-up costs more than
//! the idle tick it serves. [`coalesce`] rounds a deadline *up* to a grid shared by the whole
//! process (a tenth of the period, at most [`MAX_GRID`]), so the ticks of all stores fall on a few
//! instants per second and are served together. A tick so comes at most one grid step late; nothing
//! is ever early. Periods too short for a grid of `MIN_GRID` (tests) are not rounded.

use std::sync::OnceLock;
use std::time::Duration;

use tokio::time::Instant;

/// The coarsest grid: a tick is at most this late.
pub const MAX_GRID: Duration = Duration::from_millis(100);
/// A finer grid than this is not worth it (and would shift the short ticks of tests).
const MIN_GRID: Duration = Duration::from_millis(5);

/// `deadline`, rounded up to the process-wide grid for ticks of `period`.
pub fn coalesce(deadline: Instant, period: Duration) -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let grid = (period / 10).min(MAX_GRID);
    if grid < MIN_GRID {
        return deadline;
    }
    let epoch = *EPOCH.get_or_init(Instant::now);
    // Before the epoch (a paused test clock started earlier): not rounded.
    let Some(since) = deadline.checked_duration_since(epoch) else {
        return deadline;
    };
    let grid_ns = grid.as_nanos();
    let late_ns = (grid_ns - since.as_nanos() % grid_ns) % grid_ns;
    deadline + Duration::from_nanos(u64::try_from(late_ns).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_round_up_onto_one_grid_and_never_earlier() {
        let period = Duration::from_secs(1);
        let base = Instant::now();
        let mut seen = std::collections::BTreeSet::new();
        for ms in 0..1000u64 {
            let d = base + Duration::from_millis(ms) + Duration::from_micros(ms * 7 % 1000);
            let c = coalesce(d, period);
            assert!(c >= d && c - d < MAX_GRID, "{ms}: {:?} late", c - d);
            assert_eq!(coalesce(c, period), c, "a grid instant stays put");
            seen.insert(c);
        }
        // A thousand phases over one second fall on about 10 instants.
        assert!(seen.len() <= 11, "{} instants", seen.len());
        // Short periods are left alone.
        let d = base + Duration::from_micros(1234);
        assert_eq!(coalesce(d, Duration::from_millis(10)), d);
    }
}
