//! The [`Runner`]: one store's worker under the bucket lease, as a task (spawned by
//! `spawn.rs`, beside the supervisor that keeps its health).
//!
//! # Phases
//! [`Runner::run`] goes round three phases, each preceded by one write of the runner's record
//! (`status.rs`), until the worker's token is cancelled:
//! - **acquire** ([`Runner::acquire`]): the prefix's [`BucketLease`], before anything is
//!   uploaded. Every attempt's outcome is recorded (another holder, which health names; a
//!   failure, with its error). While another instance holds a fresh lease the runner tries again
//!   every third of a TTL, so a successor takes over within about a TTL of a holder's death, and
//!   at once after a clean shutdown (which deletes the lease). Failed acquisitions back off
//!   ([`Backoff`], `first_backoff` doubling to `max_backoff`).
//! - **hold** ([`Runner::hold`]): recorded as holding the lease; the one wait
//!   ([`Runner::next_wake`], `wait.rs`), then a tick ([`Runner::tick`], `tick.rs`), then rest
//!   or wait for the next tick, until the spell ends ([`Holding`]). Ticks come every
//!   `wal_interval`, at once on a trigger, and in sync mode as soon as the store changes, no
//!   faster than the cap on WAL PUTs (`pace.rs`). Paused, the runner keeps the lease and writes
//!   nothing (`paused.rs`).
//! - **flush** ([`Runner::flush_under`], `flush.rs`): recorded as flushing; at a clean shutdown
//!   that asked for it, ship what is durable and write a restore point, under the lease and
//!   bounded by `flush_timeout`. Then the lease is deleted.
//!
//! How a spell ended decides what follows: a lost lease is dropped and acquired again at once;
//! a write the bucket refuses (another writer) releases it and backs off; a refused prefix
//! releases it (it may be another store's to write) and is checked again every
//! `refused_retry`. Each of these breaks the durable position's chain (`ack/mod.rs`), and the
//! next acquisition starts from the bucket's state afresh ([`BackupWorker::forget_view`]).
//!
//! # Invariants
//! - Nothing is uploaded without the lease: every step runs under [`BucketLease::guard`], so
//!   a lease that stops holding cancels the step's in-flight requests, and a step starts only
//!   while [`BucketLease::may_write`].
//! - One step at a time, and every step (and the last flush) passes the pause gate
//!   (`pause.rs`); a pause waits for the step in flight.
//! - One way to stop: the worker's token. The runner watches nothing else; a step in flight at
//!   shutdown or at a pause gets `shutdown_grace` to finish, and one abandoned leaves a view
//!   that is not trusted ([`BackupWorker::forget_view`]).
//! - A published durable position holds only under this runner's lease: in sync mode it is
//!   released only within the acknowledgement window ([`AckWindow`], two calls: before and
//!   after a step).
//!
//! # What a crash leaves
//! The lease object, until its TTL runs out (a clean shutdown deletes it); nothing else: the
//! runner's state is memory.

mod flush;
mod pace;
mod paused;
mod tick;
mod wait;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::BackupWorker;
use super::ack::AckWindow;
use super::pause::{GateState, PauseGate};
use super::status::{RestGuard, Status, record};
use crate::backoff::Backoff;
use crate::health::{Activity, RunnerStatus};
use crate::lease::{Attempt, BucketLease, LeaseAcquirer, LeaseState, LostReason};

pub(super) use flush::FlushWish;

/// Triggers as counters, so that none is lost when several arrive between two looks: the
/// handle counts them up ([`super::BackupHandle::trigger`]), the runner takes them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(in crate::worker) struct Triggers {
    pub(in crate::worker) ship: u64,
    pub(in crate::worker) restore_point: u64,
    pub(in crate::worker) retention: u64,
}

/// How the runner's task ended: health says "the backup worker exited: " and this
/// ([`std::fmt::Display`], the one place its text is chosen). A lost lease, a refused prefix
/// and another writer end a spell of holding ([`Holding`]), not the runner; a panic ends the
/// task, and the supervisor reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RunnerExit {
    /// The worker's token was cancelled: a shutdown, or the caller's token.
    Shutdown,
}

impl std::fmt::Display for RunnerExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunnerExit::Shutdown => f.write_str("shut down"),
        }
    }
}

/// How a spell of holding the lease ended.
enum Holding {
    Shutdown,
    Lost,
    /// A conditional write was refused: another writer; drop the lease and start over.
    ConcurrentWriter,
    Refused,
}

/// The runner's task: the worker and everything it steps with.
pub(super) struct Runner {
    pub(super) worker: BackupWorker,
    pub(super) acquirer: LeaseAcquirer,
    pub(super) store_id: String,
    pub(super) triggers: watch::Receiver<Triggers>,
    /// The triggers acted on so far.
    pub(super) seen: Triggers,
    /// The worker's token: its cancellation is the one way to stop.
    pub(super) token: CancellationToken,
    pub(super) flush: Arc<FlushWish>,
    pub(super) status: Status,
    /// After a failed acquisition, or a write refused by another writer.
    pub(super) backoff: Backoff,
    /// Passed before every step and the last flush (`pause.rs`).
    pub(super) gate: PauseGate,
    /// What publishes the durable position, in sync mode within the window (`ack/`).
    pub(super) ack: AckWindow,
}

/// What one spell of holding the lease keeps from tick to tick.
struct Spell {
    /// When the next regular tick is due (the pace may hold it back: [`pace::Pace::due`]).
    next_step: Instant,
    pace: pace::Pace,
    /// Failed steps back off; one that goes through resets it.
    backoff: Backoff,
    /// Cancelled when the lease stops holding.
    lost: CancellationToken,
    /// A closed trigger channel (the handle dropped) is not a shutdown: triggers just stop.
    triggers_open: bool,
    /// The store's change signal: ends a rest; in sync mode, brings the next tick forward.
    changes: watch::Receiver<u64>,
    /// Resting (`status.rs`): until when, unless the store's signal comes first.
    rest: Option<(Instant, RestGuard)>,
    /// A pause arriving while a step runs (`pause.rs`).
    pausing: watch::Receiver<GateState>,
}

impl Runner {
    fn record(&self, f: impl FnOnce(&mut RunnerStatus)) {
        record(&self.status, f);
    }

    /// A step (or a quiet tick) went through: whatever failed or was refused before is over.
    fn step_succeeded(&self) {
        self.record(|s| {
            s.consecutive_failures = 0;
            s.refused = None;
            s.store_refused = None;
        });
    }

    /// The task: the phases until shutdown, then the chain broken and the runner recorded as
    /// stopped.
    pub(super) async fn run(mut self) -> RunnerExit {
        self.seen = *self.triggers.borrow_and_update();
        let exit = self.acquire_and_hold().await;
        self.worker
            .durable
            .break_chain(&format!("the backup worker stopped ({exit})"));
        self.record(|s| s.activity = Activity::Stopped);
        exit
    }

    async fn acquire_and_hold(&mut self) -> RunnerExit {
        loop {
            let Some(lease) = self.acquire().await else {
                return RunnerExit::Shutdown;
            };
            self.record(|s| s.lease = Some(LeaseState::Holding));
            self.worker.ledger.lease_acquired();
            tracing::info!(store = %self.worker.dir.display(), "acquired the bucket lease");
            self.worker.forget_view();
            self.ack.reset();
            let holding = self.hold(&lease).await;
            let Some(wait) = self.let_go(lease, holding).await else {
                return RunnerExit::Shutdown;
            };
            tokio::select! {
                _ = self.token.cancelled() => return RunnerExit::Shutdown,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Phase one: the lease, tried until it is ours (`None`: shut down first). Each attempt's
    /// outcome is recorded. An attempt in flight is never dropped (only the waits between
    /// attempts race the token): a dropped attempt whose write landed would hold the lease
    /// until its TTL runs out.
    async fn acquire(&mut self) -> Option<BucketLease> {
        let (status, dir) = (&self.status, self.worker.dir.display());
        let observe = |attempt: Attempt<'_>| match attempt {
            Attempt::HeldElsewhere(other) => record(status, |s| {
                let state = other.state();
                if let LeaseState::HeldElsewhere { holder, host, .. } = &state {
                    s.activity = Activity::WaitingForLease {
                        holder: format!("{holder}@{host}"),
                    };
                }
                // The bucket answered: whatever failed before is over.
                s.lease = Some(state);
                s.consecutive_failures = 0;
            }),
            Attempt::Failed(e) => {
                tracing::warn!(store = %dir, error = %e, "acquiring the bucket lease failed");
                record(status, |s| {
                    s.consecutive_failures += 1;
                    s.last_error = Some(e.to_string());
                    s.activity = Activity::AcquiringLease;
                });
            }
        };
        self.acquirer
            .acquire_observed(&self.token, &mut self.backoff, observe)
            .await
            .ok()
    }

    /// Phase two: steps while the lease holds, a tick at a time, until shutdown or the lease
    /// stops holding (or must be let go: another writer, a refused prefix).
    async fn hold(&mut self, lease: &BucketLease) -> Holding {
        let wal_interval = self.worker.config.wal_interval;
        let mut spell = Spell {
            next_step: Instant::now(),
            pace: pace::Pace::new(&self.worker.config),
            backoff: Backoff::new(
                self.worker.config.first_backoff,
                self.worker.config.max_backoff,
            ),
            lost: lease.token(),
            triggers_open: true,
            changes: self.worker.changes().subscribe(),
            rest: None,
            pausing: self.gate.subscribe(),
        };
        loop {
            match self.next_wake(&mut spell).await {
                wait::Wake::Shutdown => return Holding::Shutdown,
                wait::Wake::Lost => return Holding::Lost,
                wait::Wake::Changed => {
                    self.woken_by_change(&mut spell);
                    continue;
                }
                wait::Wake::Triggered(now) => self.take_triggers(now),
                wait::Wake::Due => {}
            }
            spell.rest = None;
            // Changes from here on wake the next rest: none slips between this and the stamp.
            spell.changes.borrow_and_update();
            spell.next_step = spell.pace.tick_started(wal_interval);
            tracing::trace!(store_id = %self.store_id, "tick");
            match self.tick(lease, &mut spell).await {
                tick::TickEnd::Done => {}
                tick::TickEnd::Paused => match self.hold_paused(lease).await {
                    Some(holding) => return holding,
                    None => {
                        spell.next_step = Instant::now();
                        continue;
                    }
                },
                tick::TickEnd::Holding(holding) => return holding,
            }
            if let Some(until) = self.worker.quiet_until() {
                let until = crate::pacing::coalesce(until.max(spell.next_step), wal_interval);
                spell.rest = Some((until, self.status.rest()));
            }
        }
    }

    /// After a spell of holding: the last flush and the lease deleted at shutdown (`None`:
    /// the runner is done), else the lease dropped or released, the chain broken, and how long
    /// to wait before acquiring again.
    async fn let_go(&mut self, lease: BucketLease, holding: Holding) -> Option<Duration> {
        match holding {
            Holding::Shutdown => {
                if self.flush.flush() {
                    self.flush_under(&lease).await;
                }
                let _ = lease.release().await;
                self.record(|s| s.lease = Some(LeaseState::Released));
                None
            }
            Holding::Lost => {
                let state = lease.status().state;
                let taken_over = matches!(
                    state,
                    LeaseState::Lost {
                        reason: LostReason::TakenOver
                    }
                );
                let why = lost_why(&state);
                self.worker.ledger.lease_lost(why, taken_over);
                self.worker.durable.break_chain(why);
                self.record(|s| s.lease_lost(state));
                tracing::warn!(store = %self.worker.dir.display(), "lost the bucket lease; acquiring it again");
                drop(lease);
                Some(Duration::ZERO)
            }
            Holding::ConcurrentWriter => {
                let why = "another writer is active on the prefix: dropped the bucket lease";
                self.worker.ledger.lease_lost(why, false);
                self.worker.durable.break_chain(why);
                let _ = lease.release().await;
                self.record(|s| s.lease = Some(LeaseState::Released));
                Some(self.backoff.next_delay())
            }
            Holding::Refused => {
                self.worker
                    .durable
                    .break_chain("the prefix was refused: released the bucket lease");
                let _ = lease.release().await;
                self.record(|s| {
                    s.lease = Some(LeaseState::Released);
                    s.activity = Activity::Refused;
                });
                Some(self.worker.config.refused_retry)
            }
        }
    }
}

/// Why a lease stopped holding, for the ledger, the chain's break and health.
fn lost_why(state: &LeaseState) -> &'static str {
    match state {
        LeaseState::Lost {
            reason: LostReason::TakenOver,
        } => "another holder replaced the bucket lease",
        LeaseState::Lost {
            reason: LostReason::Expired,
        } => "the bucket lease expired: renewals failed until its deadline",
        LeaseState::Lost {
            reason: LostReason::InstanceLeaseEnded,
        } => "the instance lease fencing the bucket lease stopped holding",
        _ => "the bucket lease stopped holding",
    }
}
