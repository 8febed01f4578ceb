//! When the runner's next tick comes: every `wal_interval` (on the process's tick grid,
//! `crate::pacing`), and in `durability = sync` also as soon as the store's change signal is
//! raised (a node's report, a write to the directory) — but never sooner than
//! [`WorkerConfig::wal_put_gap`] after the start of the last tick that shipped a segment (a
//! tick that found nothing to ship, woken by the write just before its report, does not hold
//! the report's tick back).
//!
//! A tick ships at most one segment (`tick_step` in `spawn.rs`), so the gap caps WAL PUTs a
//! second at `wal_puts_per_second`; there is never more than one in flight, because the
//! runner steps one step at a time. What becomes durable while a PUT flies waits for the next
//! tick, which takes all of it in one segment: under load the window a segment covers widens,
//! requests do not queue. A store whose signal stays quiet costs no tick at all in either
//! mode (the runner rests, `rest.rs`). In memory only: a crash leaves nothing.

use std::time::Duration;

use tokio::time::Instant;

use crate::worker::{DurabilityMode, WorkerConfig};

/// The runner's pacing; see the module docs.
pub(super) struct Pace {
    sync: bool,
    gap: Duration,
    /// When the tick running now (or the last one) started.
    tick: Option<Instant>,
    /// When the last tick that shipped a segment started.
    last_ship: Option<Instant>,
}

impl Pace {
    pub(super) fn new(config: &WorkerConfig) -> Self {
        Self {
            sync: config.durability == DurabilityMode::Sync,
            gap: config.wal_put_gap(),
            tick: None,
            last_ship: None,
        }
    }

    /// Whether a change of the store wakes the runner even while it is not resting.
    pub(super) fn wakes_on_change(&self) -> bool {
        self.sync
    }

    /// A tick starts now; returns when the next regular one is due.
    pub(super) fn tick_started(&mut self, wal_interval: Duration) -> Instant {
        let now = Instant::now();
        self.tick = Some(now);
        let regular = crate::pacing::coalesce(now + wal_interval, wal_interval);
        regular.max(now + self.gap)
    }

    /// The tick running now shipped a segment.
    pub(super) fn shipped(&mut self) {
        self.last_ship = self.tick;
    }

    /// The store changed: the next tick, given the one scheduled (`next`). In sync mode as
    /// soon as the gap allows; else unchanged.
    pub(super) fn on_change(&self, next: Instant) -> Instant {
        if !self.sync {
            return next;
        }
        let soonest = self
            .last_ship
            .map_or_else(Instant::now, |t| t + self.gap)
            .max(Instant::now());
        soonest.min(next)
    }
}
