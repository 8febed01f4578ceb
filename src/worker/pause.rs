//! Pausing a spawned worker: the [`PauseGate`] its runner passes before every step.
//!
//! A pause stops the worker's uploads, not the worker: the runner keeps (and, after a loss,
//! acquires again) the bucket lease, so no standby takes the prefix over, and the supervisor
//! keeps evaluating health. What it stops is every step — so no segment, archive, snapshot,
//! side file, manifest, LATEST or retention delete — and the last flush at shutdown. A pause
//! stops writes, not reads: a runner paused without a view of the bucket (started paused,
//! after a restart) reads LATEST once, so that health shows what the bucket holds rather than
//! 0 (`runner/paused.rs`).
//!
//! # The gate
//!
//! One watch channel holds the pause and whether a step is running. The runner begins a step
//! only through [`PauseGate::begin_step`], which in one critical section checks that no pause
//! is set and marks a step running; the mark goes when the returned [`Stepping`] is dropped.
//! [`PauseGate::pause`] sets the pause, then waits until no step is running. So once it
//! returns, no upload of the store is in flight and none starts until [`PauseGate::resume`]:
//! a step that began before the pause either sees it set (and does not begin) or is the one
//! waited for. The runner gives a step in flight when a pause arrives `shutdown_grace` to
//! finish, then drops it (and forgets its view of the bucket, as at shutdown), so the wait is
//! bounded by that grace (or, during the last flush, by `flush_timeout`).
//!
//! # Resume
//!
//! On Resume the runner forgets its view of the bucket and steps at once: the next step
//! resumes from the bucket's state as a restart would, with the same continuity and lineage
//! checks, and starts a new generation if the store's files moved on meanwhile.
//!
//! # What a crash leaves
//!
//! Nothing here: the gate is memory. The service stores the pause in its registry before it
//! sets the gate, and spawns a worker with the stored pause already set (so a restarted worker
//! uploads nothing before it is paused).

use std::sync::Arc;

use tokio::sync::watch;

use crate::health::Pause;

#[derive(Debug, Clone, Default)]
pub(super) struct GateState {
    pub(super) pause: Option<Pause>,
    /// A step (or the last flush) is running: it began while no pause was set.
    stepping: bool,
}

/// The pause of one worker, shared by its handle (sets it), runner (passes it before every
/// step) and supervisor (shows it in health).
#[derive(Debug, Clone)]
pub(super) struct PauseGate(Arc<watch::Sender<GateState>>);

/// A step is running while this lives.
#[derive(Debug)]
pub(super) struct Stepping(Arc<watch::Sender<GateState>>);

impl Drop for Stepping {
    fn drop(&mut self) {
        self.0.send_modify(|s| s.stepping = false);
    }
}

impl PauseGate {
    pub(super) fn new(pause: Option<Pause>) -> PauseGate {
        PauseGate(Arc::new(watch::Sender::new(GateState {
            pause,
            stepping: false,
        })))
    }

    /// Sets or replaces the pause (whether one was set already is returned), then waits until
    /// no step is running.
    pub(super) async fn pause(&self, pause: Pause) -> bool {
        let mut was = false;
        self.0.send_modify(|s| {
            was = s.pause.is_some();
            s.pause = Some(pause);
        });
        let mut rx = self.0.subscribe();
        // The sender lives in `self`: the wait ends only on the condition.
        let _ = rx.wait_for(|s| !s.stepping).await;
        was
    }

    /// Clears the pause; whether one was set.
    pub(super) fn resume(&self) -> bool {
        let mut was = false;
        self.0.send_if_modified(|s| {
            was = s.pause.take().is_some();
            was
        });
        was
    }

    pub(super) fn current(&self) -> Option<Pause> {
        self.0.borrow().pause.clone()
    }

    /// A step may begin: `None` while paused.
    pub(super) fn begin_step(&self) -> Option<Stepping> {
        let mut began = false;
        self.0.send_if_modified(|s| {
            began = s.pause.is_none();
            if began {
                s.stepping = true;
            }
            // Waiters wait for `stepping` to clear, not to be set: nobody to wake.
            false
        });
        began.then(|| Stepping(self.0.clone()))
    }

    pub(super) fn subscribe(&self) -> watch::Receiver<GateState> {
        self.0.subscribe()
    }
}

/// Waits until a pause is set (at once if one is).
pub(super) async fn paused(rx: &mut watch::Receiver<GateState>) {
    // The sender lives as long as the worker's gate: the wait ends only on the condition.
    let _ = rx.wait_for(|g| g.pause.is_some()).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pause(reason: &str) -> Pause {
        Pause {
            reason: reason.into(),
            paused_at_unix_ms: 1,
            until_unix_ms: 2,
        }
    }

    #[tokio::test]
    async fn a_pause_waits_for_the_step_in_flight_and_stops_the_next() {
        let gate = PauseGate::new(None);
        let step = gate.begin_step().expect("not paused");
        let mut pausing = Box::pin(gate.pause(pause("a")));
        use futures::FutureExt;
        assert!(
            (&mut pausing).now_or_never().is_none(),
            "returned while a step ran"
        );
        assert!(gate.begin_step().is_none(), "a step began after the pause");
        drop(step);
        assert!(!pausing.await, "was not paused before");
        assert!(
            gate.pause(pause("b")).await,
            "a second pause replaces the first"
        );
        assert_eq!(gate.current().unwrap().reason, "b");
        assert!(gate.resume());
        assert!(!gate.resume(), "resuming twice is fine");
        assert!(gate.begin_step().is_some());
    }
}
