//! What a step of the worker reports: its outcome (`StepOutcome`, `DeferReason`), the mode it
//! runs in (`StepMode`), and the counters the worker keeps across steps (`BackupCounters`).

#[allow(unused_imports)]
use super::*;

/// Why a step did nothing this time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeferReason {
    /// `snapshot.intent` holds something.
    SnapshotInFlight,
    /// The position does not name the files on disk; a refresh was requested.
    CatchUp,
    /// The files changed under a read; it will be done again.
    Changed,
}

impl std::fmt::Display for DeferReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DeferReason::SnapshotInFlight => "a snapshot is in flight",
            DeferReason::CatchUp => "the WAL source has not caught up with the files on disk",
            DeferReason::Changed => "the store's files changed during a read",
        })
    }
}

/// What one step did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepOutcome {
    /// Read the bucket's state (first step, or after a refusal of a write).
    Resumed {
        lineage: uuid::Uuid,
        generation: Option<u64>,
        /// Commits the resumed generation has shipped.
        shipped_commit_seq: Option<u64>,
        /// Commits in this lineage's newest restore point.
        restore_point_commit_seq: Option<u64>,
    },
    Deferred(DeferReason),
    /// Claimed a generation and uploaded its snapshot, archives and side files.
    NewGeneration {
        generation: u64,
        uploaded: u64,
        reused: u64,
        /// Bytes of the uploaded objects, as stored (encoded).
        bytes: u64,
        /// Their plain bytes.
        logical: u64,
    },
    /// Shipped one WAL segment.
    Shipped {
        key: String,
        /// Bytes of the segment as stored (encoded).
        bytes: u64,
        /// Its plain bytes (of `wal.bin`).
        logical: u64,
        frames: u64,
        /// Commits shipped in the generation after it.
        shipped_commit_seq: u64,
    },
    /// Wrote a manifest (or found it written) and moved LATEST.
    RestorePoint {
        key: String,
        commit_seq: u64,
    },
    /// Ran retention.
    Retention {
        deleted: u64,
    },
    /// Nothing to do.
    Idle,
}

/// How [`BackupWorker::step_as`] steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepMode {
    /// One unit of work: resume, start a generation, ship a segment, a restore point,
    /// retention, or nothing ([`BackupWorker::step`]).
    Full,
    /// [`Self::Full`], and a resume also starts reading the store's files
    /// ([`BackupWorker::run_once`]; see there).
    ReadAhead,
    /// After a tick shipped its segment: only a restore point when due, then retention when
    /// due (see the runner's `tick_step`).
    AfterShipping,
}

/// The worker's counters, shared with whoever reports them. Written only by the step's
/// outcome ledger (`ledger.rs`).
#[derive(Debug, Default)]
pub struct BackupCounters {
    /// Bytes uploaded of store data, as stored (after compression).
    pub bytes_shipped: AtomicU64,
    /// The plain bytes of the same objects: what they hold of the store.
    pub bytes_logical: AtomicU64,
    pub objects_shipped: AtomicU64,
    pub objects_reused: AtomicU64,
    pub segments_shipped: AtomicU64,
    pub restore_points: AtomicU64,
    pub generations: AtomicU64,
    pub objects_deleted: AtomicU64,
    pub failures: AtomicU64,
    /// Commits durable in the store, as last read from the source (by the worker or its
    /// supervisor).
    pub durable_commit_seq: AtomicU64,
    /// Commits shipped (in segments).
    pub shipped_commit_seq: AtomicU64,
    /// Commits in the newest restore point this worker wrote or found.
    pub restore_point_commit_seq: AtomicU64,
    /// Times the bucket lease was acquired (the first time, and every takeover after).
    pub lease_acquisitions: AtomicU64,
    /// Times the lease was lost or dropped (taken over, expired, or a write refused).
    pub lease_losses: AtomicU64,
    /// Times a step looked at the store directory. An idle store is not looked at while its
    /// [`DirWatch`] says nothing changed (see [`Quiet`]).
    pub looks: AtomicU64,
    /// Every request this worker (and its lease) sent to the bucket, by kind.
    pub requests: Arc<crate::bucket::counting::RequestCounts>,
    /// A write-once prefix's holds of reused objects, and the last check (`hold.rs`).
    pub immutable: Arc<crate::bucket::write_once::HoldCounts>,
    /// The restore points the worker knows and what restoring each moves (`shapes.rs`), for
    /// health's predicted restore time.
    pub shapes: Arc<super::shapes::KnownShapes>,
    /// Where the store's prefix was branched from, when it is a branch, as the worker's view
    /// of the prefix last said (`crate::branch`; health names the parent and fork commit).
    pub branched_from: std::sync::Mutex<Option<crate::manifest::BranchOrigin>>,
    /// What each live branch cut from the prefix is charged, as the last retention pass found
    /// (`crate::pins::Charge`): the service charges it to the branch's store.
    pub branch_charges: std::sync::Mutex<Vec<crate::pins::Charge>>,
}

/// Sets `cell` to `value` when it differs (a comparison, no clone, when nothing changed).
pub(super) fn publish<T: Clone + PartialEq>(cell: &std::sync::Mutex<T>, value: &T) {
    let mut held = cell.lock().unwrap_or_else(|p| p.into_inner());
    if *held != *value {
        held.clone_from(value);
    }
}

impl BackupCounters {
    /// [`BackupCounters::branch_charges`], copied.
    pub fn branch_charges(&self) -> Vec<crate::pins::Charge> {
        self.branch_charges
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// [`BackupCounters::branched_from`], copied.
    pub fn branch_origin(&self) -> Option<crate::manifest::BranchOrigin> {
        self.branched_from
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}
