//! What a runner is doing right now, for health and `ctl health`: the part of a step that is
//! running ([`StepPhase`]), published by the worker's children through a [`StepActivity`],
//! and the runner's [`Activity`] around it (waiting, backing off, stopped). Nothing here is
//! persisted: a restart starts at "resuming".

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
/// Which part of a step is running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepPhase {
    /// Reading the bucket's state (LATEST, the newest manifest, the generations).
    Resuming,
    /// Reading and checking the store's files for a new generation.
    ReadingFiles,
    /// Writing a generation's GENERATION claim.
    Claiming {
        generation: u64,
    },
    /// Uploading one of a generation's new objects: the oldest still in flight, `what` naming it
    /// ("the snapshot", "archive 12 of 40", "side file NAME"); `done` of `of` are up.
    Uploading {
        generation: u64,
        what: String,
        done: u64,
        of: u64,
    },
    /// Uploading a WAL segment.
    ShippingSegment {
        generation: u64,
        bytes: u64,
    },
    /// Writing a manifest and LATEST.
    WritingRestorePoint {
        commit_seq: u64,
    },
    RunningRetention,
}

impl std::fmt::Display for StepPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StepPhase::Resuming => f.write_str("resuming from the bucket's state"),
            StepPhase::ReadingFiles => f.write_str("reading the store's files"),
            StepPhase::Claiming { generation } => write!(f, "claiming generation {generation}"),
            StepPhase::Uploading {
                generation,
                what,
                done,
                of,
            } => write!(
                f,
                "uploading {what} (generation {generation}, {done} of {of} objects up)"
            ),
            StepPhase::ShippingSegment { generation, bytes } => write!(
                f,
                "shipping a segment of generation {generation} ({bytes} bytes)"
            ),
            StepPhase::WritingRestorePoint { commit_seq } => {
                write!(f, "writing a restore point at commit {commit_seq}")
            }
            StepPhase::RunningRetention => f.write_str("running retention"),
        }
    }
}

/// The running step's [`StepPhase`], shared by the worker (writes, at most once per object or
/// phase) and its supervisor (reads, when it evaluates health). Clearing one that is clear
/// takes no lock, so a step that does nothing costs an atomic load.
#[derive(Debug, Clone, Default)]
pub struct StepActivity(Arc<StepActivityInner>);

#[derive(Debug, Default)]
struct StepActivityInner {
    set: AtomicBool,
    phase: Mutex<Option<StepPhase>>,
}

impl StepActivity {
    pub fn set(&self, phase: StepPhase) {
        *self.0.phase.lock().unwrap_or_else(|p| p.into_inner()) = Some(phase);
        self.0.set.store(true, Ordering::Release);
    }

    /// The step ended (or is starting): no phase.
    pub fn clear(&self) {
        if self.0.set.load(Ordering::Acquire) && self.0.set.swap(false, Ordering::AcqRel) {
            *self.0.phase.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
    }

    pub fn get(&self) -> Option<StepPhase> {
        if !self.0.set.load(Ordering::Acquire) {
            return None;
        }
        self.0
            .phase
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// What the runner is doing, for [`StoreHealth::activity`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Activity {
    #[default]
    Starting,
    /// Trying to acquire the bucket lease.
    AcquiringLease,
    /// Another instance holds the lease (`holder@host`).
    WaitingForLease { holder: String },
    /// A step is running; health shows its [`StepPhase`] instead once the step reports one
    /// (resuming, uploading a generation's objects, shipping a segment, writing a restore point,
    /// running retention).
    Stepping,
    /// Holding the lease, nothing to do until the next tick.
    Idle,
    /// A step failed; the next one is due after a backoff.
    Retrying,
    /// Waiting to check a refused prefix again, without the lease.
    Refused,
    /// Holding the lease, uploading nothing until Resume.
    Paused,
    /// The last flush before shutdown.
    Flushing,
    /// The runner returned.
    Stopped,
}

impl std::fmt::Display for Activity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Activity::Starting => f.write_str("starting"),
            Activity::AcquiringLease => f.write_str("acquiring the bucket lease"),
            Activity::WaitingForLease { holder } => {
                write!(f, "waiting for the bucket lease (held by {holder})")
            }
            Activity::Stepping => f.write_str("stepping"),
            Activity::Idle => f.write_str("idle"),
            Activity::Retrying => f.write_str("retrying after a failed step"),
            Activity::Refused => f.write_str("waiting to check the refused prefix again"),
            Activity::Paused => f.write_str("paused: uploading nothing until Resume"),
            Activity::Flushing => f.write_str("flushing"),
            Activity::Stopped => f.write_str("stopped"),
        }
    }
}
