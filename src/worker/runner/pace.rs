//! When the runner's next tick comes: every `wal_interval` (on the process's tick grid,
//! `crate::pacing`), and in `durability = sync` also as soon as the store's change signal is
//! raised (a node's report, a write to the directory) — but no tick starts before the
//! **allowance** of the cap on WAL PUTs says a segment may ship.
//!
//! # The cap: a token bucket
//!
//! A tick ships at most one segment (`tick_step` in `tick.rs`), and there is never more than
//! one in flight, because the runner steps one step at a time. The cap is a token bucket
//! (kept as GCRA: one instant, `tat`) filling at `wal_puts_per_second` and holding
//! [`BURST`] tokens; a tick that shipped takes one, counted from the tick's start. So:
//! - a lone report after a quiet spell (the bucket full) ships **at once**, with no wait for a
//!   gap since the last PUT: a store committing at or below the cap pays one PUT of latency,
//!   however its commits fall against the grid;
//! - under sustained load a segment ships every `1 / wal_puts_per_second`: WAL PUTs a second
//!   stay at the cap over any window of a few seconds (at most `BURST - 1` more in any one
//!   second), and what becomes durable meanwhile waits for the next tick, which takes all of
//!   it in one segment: the window a segment covers widens, requests do not queue.
//!
//! A tick that found nothing to ship (woken by the write to `wal.bin` just before its report)
//! takes no token, so it never holds the report's tick back. A failed step's backoff holds
//! every tick back, changes included ([`Pace::back_off`]): under a failing bucket the retries
//! follow the backoff, not the rate of reports. A store whose signal stays quiet
//! costs no tick at all in either mode (the runner rests, `status.rs`). In memory only: a crash
//! leaves nothing (a restarted runner starts with a full bucket: at most `BURST` segments
//! sooner than the cap would have allowed, once).

use std::time::Duration;

use tokio::time::Instant;

use crate::worker::{DurabilityMode, WorkerConfig};

/// Segments that may ship back to back after a quiet spell before the cap's rate applies:
/// one absorbs the jitter of commits arriving at about the cap's rate, without letting a
/// burst cost more than one extra PUT.
pub(super) const BURST: u32 = 2;

/// The runner's pacing; see the module docs.
pub(super) struct Pace {
    sync: bool,
    /// The cap's interval: `1 s / wal_puts_per_second`.
    gap: Duration,
    /// When the tick running now (or the last one) started.
    tick: Option<Instant>,
    /// The token bucket's theoretical arrival time: a segment may ship from
    /// `tat - (BURST - 1) * gap` on; `None` while the bucket is full.
    tat: Option<Instant>,
    /// After a failed step: no tick before then, whatever changes (a retry storm at the rate
    /// of reports, under a failing bucket, would cost requests the cap does not count).
    backoff: Option<Instant>,
}

impl Pace {
    pub(super) fn new(config: &WorkerConfig) -> Self {
        Self {
            sync: config.durability == DurabilityMode::Sync,
            gap: config.wal_put_gap(),
            tick: None,
            tat: None,
            backoff: None,
        }
    }

    /// Whether a change of the store wakes the runner even while it is not resting.
    pub(super) fn wakes_on_change(&self) -> bool {
        self.sync
    }

    /// A tick starts now; returns when the next regular one is due (before the allowance:
    /// see [`Self::due`]).
    pub(super) fn tick_started(&mut self, wal_interval: Duration) -> Instant {
        let now = Instant::now();
        self.tick = Some(now);
        self.backoff = None;
        crate::pacing::coalesce(now + wal_interval, wal_interval)
    }

    /// The tick's step failed: the next tick comes at `until`, and no change brings it sooner.
    pub(super) fn back_off(&mut self, until: Instant) -> Instant {
        self.backoff = Some(until);
        until
    }

    /// The tick running now shipped a segment: it takes a token.
    pub(super) fn shipped(&mut self) {
        let Some(tick) = self.tick else {
            return;
        };
        let from = self.tat.map_or(tick, |tat| tat.max(tick));
        self.tat = Some(from + self.gap);
    }

    /// From when a segment may ship (the bucket holds a token).
    fn allowance(&self) -> Option<Instant> {
        let tolerance = self.gap * (BURST - 1);
        self.tat
            .map(|tat| tat.checked_sub(tolerance).unwrap_or(tat))
    }

    /// When a tick scheduled for `next` may start: not before the allowance, nor before the
    /// end of a backoff.
    pub(super) fn due(&self, next: Instant) -> Instant {
        let next = self.backoff.map_or(next, |b| next.max(b));
        self.allowance().map_or(next, |a| next.max(a))
    }

    /// The store changed: the next tick, given the one scheduled (`next`). In sync mode at
    /// once (the allowance still applies, [`Self::due`]); else unchanged.
    pub(super) fn on_change(&self, next: Instant) -> Instant {
        if !self.sync {
            return next;
        }
        next.min(Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pace(cap: u32) -> Pace {
        Pace {
            sync: true,
            gap: Duration::from_secs(1) / cap,
            tick: None,
            tat: None,
            backoff: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_report_ships_at_once_and_sustained_load_keeps_to_the_cap() {
        let mut p = pace(10);
        let second = Duration::from_secs(1);
        // Quiet: a change is due at once, twice in a row (the burst).
        for _ in 0..BURST {
            let now = Instant::now();
            assert_eq!(p.due(p.on_change(now + second)), now);
            p.tick_started(second);
            p.shipped();
        }
        // The bucket is empty: the next waits a gap.
        let now = Instant::now();
        assert_eq!(p.due(p.on_change(now + second)), now + p.gap);
        // Sustained: ticks as soon as allowed ship 10 a second.
        let start = Instant::now();
        let mut shipped = 0;
        while Instant::now() < start + 10 * second {
            let at = p.due(p.on_change(Instant::now() + second));
            tokio::time::sleep_until(at).await;
            p.tick_started(second);
            p.shipped();
            shipped += 1;
        }
        assert!(
            (100..=101).contains(&shipped),
            "{shipped} in 10 s at cap 10"
        );
        // A tick that ships nothing takes no token: after a quiet gap, at once again.
        tokio::time::sleep(second).await;
        p.tick_started(second);
        let now = Instant::now();
        assert_eq!(p.due(p.on_change(now + second)), now);
        // A failed step's backoff holds every change back.
        let until = p.back_off(now + second);
        assert_eq!(p.due(p.on_change(until)), now + second);
    }
}
