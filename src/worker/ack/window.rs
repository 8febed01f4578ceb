//! [`AckWindow`]: how a sync worker keeps the acknowledgement window's invariant (stated once,
//! in the room's docs, `ack/mod.rs`): a durable position is published only within the window
//! of the start of a confirming read of its lease that found the lease still its own (the
//! promise is [`crate::lease::LeaseRecord::ack_window_ms`]). The runner calls
//! [`AckWindow::before_step`] and [`AckWindow::after_step`]; in `durability = async` both do
//! nothing.
//!
//! # How
//! - After each release, a confirming read ([`LeaseHandle::confirm`]) starts in the
//!   background when the last one started more than half a window ago: it runs in the gap
//!   before the next commit, so a busy store's steps find the lease confirmed and no PUT waits
//!   behind a read at the server. A busy store so pays one GET per half window (2 a second at
//!   the default window of 1 s); an idle store pays nothing. A step after a quiet spell longer
//!   than the window ([`AckWindow::before_step`]) starts its read beside its PUT: its ack waits
//!   for the later of the two.
//! - After the step ([`AckWindow::after_step`]), what it offered is released only if the
//!   newest read that found the lease ours *started* at most a window ago; else it waits for
//!   the read in flight, or makes one, and looks again. A read that finds the lease taken ends
//!   it ([`LeaseError::Lost`]): nothing is released, and the runner breaks the chain. A read
//!   that fails says nothing: tried again up to [`TRIES`] times, then the position stays held
//!   back until the next step's settle (a commit is never acknowledged unconfirmed).
//! - A new lease ([`AckWindow::reset`]) is confirmed afresh: a read under an earlier lease
//!   vouches for nothing under this one.
//!
//! # What a crash leaves
//! Nothing: in memory. Positions held back die with the process, as published ones do.

use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::DurableTx;
use crate::lease::{ACK_WINDOW, BucketLease, LeaseAcquirer, LeaseError, LeaseHandle};
use crate::worker::DurabilityMode;

/// Confirming reads tried in one settle before the position is left for the next step.
const TRIES: u32 = 5;
/// The pause between two tries.
const RETRY: Duration = Duration::from_millis(100);

/// A runner's acknowledgement window (see the module docs): in `durability = async`, nothing.
pub(in crate::worker) struct AckWindow {
    /// `None` in `durability = async`: positions are published at once, nothing is confirmed.
    confirming: Option<Confirming>,
}

/// How [`AckWindow::after_step`] ended.
pub(in crate::worker) enum Settled {
    /// What the step offered is released; or there was nothing to release, or the reads
    /// failed and it waits for the next step (never released unconfirmed).
    Done,
    /// A confirming read found the lease taken, or the lease ended: nothing was released.
    Lost,
    /// Shutdown came first.
    Shutdown,
}

impl AckWindow {
    /// Sets a worker up for its durability mode: in `sync`, `acquirer`'s records promise
    /// [`ACK_WINDOW`] and `durable` is gated, and the window releases it; in `async`, neither.
    pub(in crate::worker) fn for_mode(
        mode: DurabilityMode,
        acquirer: &mut LeaseAcquirer,
        durable: &DurableTx,
        tasks: &TaskTracker,
    ) -> AckWindow {
        let confirming = match mode {
            DurabilityMode::Sync => Some(Confirming::new(ACK_WINDOW, tasks.clone())),
            DurabilityMode::Async => None,
        };
        acquirer.promising_ack_window(confirming.as_ref().map(|c| c.window));
        durable.set_gated(confirming.is_some());
        AckWindow { confirming }
    }

    /// A new lease is held: it is confirmed afresh.
    pub(in crate::worker) fn reset(&mut self) {
        if let Some(c) = &mut self.confirming {
            c.reset();
        }
    }

    /// Before a step that may ship: starts a confirming read beside it when the last one is
    /// older than the window (the step's position could not be released without one) and none
    /// is in flight.
    pub(in crate::worker) fn before_step(&mut self, lease: &BucketLease) {
        if let Some(c) = &mut self.confirming {
            let window = c.window;
            c.read_unless_fresh(&lease.handle(), window);
        }
    }

    /// After a step that succeeded: publishes what it offered once a confirming read started
    /// within the window (module docs), unless `stop` is cancelled first.
    pub(in crate::worker) async fn after_step(
        &mut self,
        lease: &BucketLease,
        durable: &DurableTx,
        stop: &CancellationToken,
    ) -> Settled {
        let Some(c) = &mut self.confirming else {
            return Settled::Done;
        };
        let handle = lease.handle();
        tokio::select! {
            r = c.settle(&handle, durable) => match r {
                Ok(()) => Settled::Done,
                Err(_) => Settled::Lost,
            },
            _ = stop.cancelled() => Settled::Shutdown,
        }
    }
}

/// The window's reads, in `durability = sync`.
struct Confirming {
    /// Where the reads run (the worker's tracker: whoever waits for the worker waits for them).
    tasks: TaskTracker,
    window: Duration,
    /// The start of the newest read that found the lease ours.
    confirmed_from: Option<Instant>,
    inflight: Option<JoinHandle<Result<Instant, LeaseError>>>,
}

impl Confirming {
    fn new(window: Duration, tasks: TaskTracker) -> Self {
        Confirming {
            tasks,
            window,
            confirmed_from: None,
            inflight: None,
        }
    }

    /// Forgets every read (a read under an earlier lease vouches for nothing under this one).
    fn reset(&mut self) {
        self.confirmed_from = None;
        if let Some(h) = self.inflight.take() {
            h.abort();
        }
    }

    fn fresh(&self, within: Duration) -> bool {
        self.confirmed_from.is_some_and(|s| s.elapsed() <= within)
    }

    /// After a release: starts a confirming read when the last one is older than half a
    /// window, so that it runs in the gap before the next commit rather than beside its PUT
    /// (a busy store's steps then find the lease confirmed, and no PUT waits behind a read at
    /// the server).
    fn refresh(&mut self, lease: &LeaseHandle) {
        self.read_unless_fresh(lease, self.window / 2);
    }

    fn read_unless_fresh(&mut self, lease: &LeaseHandle, within: Duration) {
        if self.inflight.as_ref().is_some_and(|h| !h.is_finished()) {
            return;
        }
        if let Some(done) = self.inflight.take() {
            self.absorb_finished(done);
        }
        if self.fresh(within) {
            return;
        }
        let lease = lease.clone();
        self.inflight = Some(self.tasks.spawn(async move { lease.confirm().await }));
    }

    /// Books a finished read's start (its failure is looked at again by `settle`).
    fn absorb_finished(&mut self, done: JoinHandle<Result<Instant, LeaseError>>) {
        if let Some(Ok(Ok(s))) = futures::FutureExt::now_or_never(done) {
            self.note(s);
        }
    }

    fn note(&mut self, started: Instant) {
        if self.confirmed_from.is_none_or(|c| c < started) {
            self.confirmed_from = Some(started);
        }
    }

    /// After a step: publishes what it offered once a confirming read started within the
    /// window (see the module docs). `Err(Lost)`: the lease was taken or ended.
    async fn settle(&mut self, lease: &LeaseHandle, durable: &DurableTx) -> Result<(), LeaseError> {
        if !durable.has_pending() {
            return Ok(());
        }
        let mut failures = 0;
        loop {
            if self.fresh(self.window) {
                durable.release();
                self.refresh(lease);
                return Ok(());
            }
            let read = match self.inflight.take() {
                Some(h) => h.await.unwrap_or(Err(LeaseError::Lost)),
                None => lease.confirm().await,
            };
            match read {
                Ok(started) => self.note(started),
                Err(LeaseError::Lost) => return Err(LeaseError::Lost),
                Err(e) => {
                    failures += 1;
                    tracing::debug!(error = %e, failures, "a confirming read of the lease failed");
                    if failures >= TRIES {
                        return Ok(());
                    }
                    tokio::time::sleep(RETRY).await;
                }
            }
        }
    }
}
