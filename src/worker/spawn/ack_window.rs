//! [`AckWindow`]: a sync worker publishes a durable position only within the acknowledgement
//! window of a confirming read of its lease (`worker/durable.rs`, "Published only within the
//! acknowledgement window"; the promise is [`crate::lease::LeaseRecord::ack_window_ms`]).
//!
//! # How
//! - After each release, a confirming read ([`LeaseHandle::confirm`]) starts in the
//!   background when the last one started more than half a window ago: it runs in the gap
//!   before the next commit, so a busy store's steps find the lease confirmed and no PUT waits
//!   behind a read at the server. A busy store so pays one GET per half window (2 a second at
//!   the default window of 1 s); an idle store pays nothing. A step after a quiet spell longer
//!   than the window ([`AckWindow::kick`]) starts its read beside its PUT: its ack waits for
//!   the later of the two.
//! - After the step ([`AckWindow::settle`]), what it offered is released only if the newest
//!   read that found the lease ours *started* at most a window ago; else it waits for the read
//!   in flight, or makes one, and looks again. A read that finds the lease taken ends it
//!   ([`LeaseError::Lost`]): nothing is released, and the runner breaks the chain. A read that
//!   fails says nothing: tried again up to [`TRIES`] times, then the position stays held back
//!   until the next step's settle (a commit is never acknowledged unconfirmed).
//!
//! # Invariant
//! Every position published at instant `t` follows a read started at `s >= t - window` that
//! found this worker's record: so no position is published later than a window after another
//! holder's write of the lease object landed.
//!
//! # What a crash leaves
//! Nothing: in memory. Positions held back die with the process, as published ones do.

use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::lease::{ACK_WINDOW, LeaseAcquirer, LeaseError, LeaseHandle};
use crate::worker::DurabilityMode;
use crate::worker::durable::DurableTx;

/// Confirming reads tried in one settle before the position is left for the next step.
const TRIES: u32 = 5;
/// The pause between two tries.
const RETRY: Duration = Duration::from_millis(100);

/// See the module docs.
pub(super) struct AckWindow {
    /// Where the reads run (the worker's tracker: whoever waits for the worker waits for them).
    tasks: TaskTracker,
    window: Duration,
    /// The start of the newest read that found the lease ours.
    confirmed_from: Option<Instant>,
    inflight: Option<JoinHandle<Result<Instant, LeaseError>>>,
}

/// Sets a worker up for its durability mode: in `sync`, `acquirer`'s records promise
/// [`ACK_WINDOW`] and `durable` is gated, and the fence that releases it is returned; in
/// `async`, neither.
pub(super) fn for_mode(
    mode: DurabilityMode,
    acquirer: &mut LeaseAcquirer,
    durable: &DurableTx,
    tasks: &TaskTracker,
) -> Option<AckWindow> {
    let fence = match mode {
        DurabilityMode::Sync => Some(AckWindow::new(ACK_WINDOW, tasks.clone())),
        DurabilityMode::Async => None,
    };
    acquirer.promising_ack_window(fence.as_ref().map(|f| f.window));
    durable.set_gated(fence.is_some());
    fence
}

impl AckWindow {
    pub(super) fn new(window: Duration, tasks: TaskTracker) -> Self {
        AckWindow {
            tasks,
            window,
            confirmed_from: None,
            inflight: None,
        }
    }

    /// Forgets every read: a new lease is confirmed afresh (a read of an earlier lease vouches
    /// for nothing under this one).
    pub(super) fn reset(&mut self) {
        self.confirmed_from = None;
        if let Some(h) = self.inflight.take() {
            h.abort();
        }
    }

    fn fresh(&self, within: Duration) -> bool {
        self.confirmed_from.is_some_and(|s| s.elapsed() <= within)
    }

    /// Before a step that may ship: starts a confirming read beside it when the last one is
    /// older than the window (the step's position could not be released without one) and none
    /// is in flight.
    pub(super) fn kick(&mut self, lease: &LeaseHandle) {
        self.read_unless_fresh(lease, self.window);
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

    /// [`AckWindow::settle`], or `None` once `token` is cancelled first (shutdown).
    pub(super) async fn settle_unless(
        &mut self,
        lease: &LeaseHandle,
        durable: &DurableTx,
        token: &CancellationToken,
    ) -> Option<Result<(), LeaseError>> {
        tokio::select! {
            r = self.settle(lease, durable) => Some(r),
            _ = token.cancelled() => None,
        }
    }

    /// After a step: publishes what it offered once a confirming read started within the
    /// window (see the module docs). `Err(Lost)`: the lease was taken or ended.
    pub(super) async fn settle(
        &mut self,
        lease: &LeaseHandle,
        durable: &DurableTx,
    ) -> Result<(), LeaseError> {
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
