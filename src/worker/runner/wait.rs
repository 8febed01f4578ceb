//! The runner's one wait while it holds the lease ([`Runner::next_wake`]): the only `select!`
//! between two ticks, and what each thing that can wake it means ([`Wake`]).
//!
//! # Invariants
//! - Shutdown (the worker's token) and a lease that stops holding are always watched: no rest
//!   and no pace outlasts either.
//! - A rest ends on the store's change signal, a trigger, or its deadline; in sync mode the
//!   signal also brings the next tick forward, no sooner than the pace allows (`pace.rs`).
//! - A closed trigger channel (the handle dropped) is not a shutdown: triggers just stop.
//!
//! What a crash leaves: nothing; waiting writes nothing.

use tokio::time::Instant;

use super::Triggers;
use super::{Runner, Spell};

/// What woke the runner while it holds the lease.
pub(super) enum Wake {
    /// The worker's token was cancelled.
    Shutdown,
    /// The store's change signal, while resting or in sync mode.
    Changed,
    /// The lease stopped holding.
    Lost,
    /// A trigger arrived: the counters as they are now.
    Triggered(Triggers),
    /// The next tick is due, or the rest's deadline came.
    Due,
}

impl Runner {
    /// Waits for whichever comes first (see [`Wake`]).
    pub(super) async fn next_wake(&mut self, spell: &mut Spell) -> Wake {
        loop {
            let due = spell
                .rest
                .as_ref()
                .map_or_else(|| spell.pace.due(spell.next_step), |r| r.0);
            let on_change = spell.rest.is_some() || spell.pace.wakes_on_change();
            tokio::select! {
                // Shutdown: the one way to stop.
                _ = self.token.cancelled() => return Wake::Shutdown,
                // The store changed: ends a rest, and in sync mode brings the tick forward.
                _ = spell.changes.changed(), if on_change => return Wake::Changed,
                // Expired, taken over, or its instance lease ended.
                _ = spell.lost.cancelled() => return Wake::Lost,
                // A trigger, or the handle dropped (then triggers stop, and the wait goes on).
                r = self.triggers.changed(), if spell.triggers_open => match r {
                    Ok(()) => return Wake::Triggered(*self.triggers.borrow_and_update()),
                    Err(_) => spell.triggers_open = false,
                },
                // The tick (held back by the pace), or the rest's deadline.
                _ = tokio::time::sleep_until(due) => return Wake::Due,
            }
        }
    }

    /// The store changed: back to the regular tick (at most one per `wal_interval`); in sync
    /// mode, a tick at once, as soon as the cap's token bucket allows (`pace.rs`).
    pub(super) fn woken_by_change(&self, spell: &mut Spell) {
        if let Some((_, guard)) = spell.rest.take() {
            guard.wake();
        }
        spell.next_step = spell.pace.on_change(spell.next_step);
        tracing::trace!(store_id = %self.store_id, in = ?spell.pace.due(spell.next_step).saturating_duration_since(Instant::now()), "store changed: next tick");
    }

    /// Acts on the triggers that arrived since the last look: a restore point or retention is
    /// requested from the worker; a ship needs nothing more than the tick that follows.
    pub(super) fn take_triggers(&mut self, now: Triggers) {
        if now.restore_point != self.seen.restore_point {
            self.worker.request_restore_point();
        }
        if now.retention != self.seen.retention {
            self.worker.request_retention();
        }
        self.seen = now;
    }
}
