//! The backup worker: ships WAL segments, snapshots, archives and side files, and writes the
//! manifests that name consistent restore points.
//!
//! # What it reads, and what it never touches
//!
//! It reads the store's files through ordinary OS reads on Tokio's blocking pool, and one
//! value from the engine: [`WalSource::durable_wal_position`], which says how much of
//! `wal.bin` is fsynced, in which generation, and which `snapshot.bin` and `wal.bin` files the
//! engine's state is on. Reading it takes no engine lock, so it cannot slow a write. When the
//! files on disk show a snapshot or WAL the engine has not reported, the worker asks the source
//! to catch up ([`WalSource::request_refresh`]) and defers. It writes one file into the store
//! directory, once: `backup.lineage`, on the first backup of a store (see [`lineage`]).
//!
//! Every read and that one write go through the worker's [`StoreDir`]
//! ([`crate::store::dir`]): the directory is opened once and files are opened relative to it,
//! never through a link, regular files only, small files below a cap. Every look re-checks
//! that the directory is still the one opened and (in the service) inside its allowed root,
//! and every upload of store data follows such a look made after the data was read: a
//! directory that left its root or was replaced, or a file that is a link, a FIFO, a device or
//! too large, fails the step with a [`DirError`] naming it, nothing of that step is uploaded,
//! and health shows the reason at once ([`WorkerError::store_refusal`]).
//!
//! # Consistency
//!
//! A restore point is a snapshot plus the WAL that starts beside it, and which ones those are
//! comes from the files on disk:
//! - Nothing is read while `snapshot.intent` holds anything: the step is deferred, not failed.
//! - Every read is bracketed by two looks at the directory, and kept only if
//!   [`DiskState::unchanged_until`] holds between them.
//! - A restore point is built only when the position names the snapshot and WAL file on disk;
//!   a new generation starts whenever either changes.
//! - A manifest's `commit_seq` is computed from the objects it lists, so it is what the
//!   restored store reports, by construction.
//!
//! # Objects and ordering
//!
//! Every object a manifest names is immutable (see [`crate::manifest`]); a manifest is written
//! only after every object it names exists, and LATEST only after its manifest. Retention
//! deletes only what no retained manifest names. So at any point — a crash between any two
//! requests included — every manifest in the bucket verifies, and LATEST names one of them.
//!
//! # Writes the bucket can refuse
//!
//! Immutable objects (GENERATION, segments, side files, snapshots, archives) are written with
//! `If-None-Match: *`; an object already there is accepted only with the same content (a retry,
//! or a crashed run's upload). Snapshots and archives go up with the CRC-32 of their check as
//! a condition of the write ([`crate::bucket::Body`]): a file that changed after its check
//! leaves no object. Manifests are written with `If-None-Match: *`; LATEST with
//! `If-Match` on the ETag this worker last wrote or read. A refusal of GENERATION, a manifest
//! or LATEST means another writer is active: the step fails with
//! [`WorkerError::ConcurrentWriter`] and the worker forgets its view of the bucket, so its next
//! step starts afresh from the bucket's state. With conditional writes off (object stores
//! without conditional PUT) every write is plain.
//!
//! # Resume
//!
//! No local state but `backup.lineage` and a cache ([`journal`]): a (re)starting worker reads
//! LATEST, the newest manifest and the generations under `gen/`, and continues its lineage's
//! newest generation while the store's files are still its (WAL checked against the last
//! shipped segment: a diverged store is refused, not spliced; its own segments past the
//! manifest taken back via the journal, no GET), or starts a new one. Retention aside, its only LIST.
//! That LIST reads every segment past the newest restore point (a page per thousand): so a
//! restore point falls due not only every `restore_point_interval` but also once
//! [`MAX_BACKLOG_SEGMENTS`] segments are past the newest one, whatever the interval, and a
//! restart takes back at most about one page of them (security review 4, finding 7: a first
//! acknowledgement 2.45 s after a restart on moto past 60 s of load, 12,000 segments listed,
//! with an interval of an hour). A deviation from the design's clock-only trigger.
//!
//! # Idle stores
//!
//! A step that found nothing to do remembers the directory's [`DirWatch`] stamp (taken before
//! its look) and the durable position it used. While the stamp and the position are unchanged
//! and neither a restore point nor retention is due, the next step answers
//! [`StepOutcome::Idle`] without looking at the directory: no write completed in it since, so a
//! look would find what the last one found. The stamp is exact for completed writes (see
//! [`crate::store::watch`]); writes it cannot see (through `mmap`, or by another host on a
//! network filesystem) are found within [`DirWatch::trust`], after which a step looks again. And
//! a spawned worker does not even tick while quiet: it rests until the directory's watch (or
//! the service, on a node's report) raises its change signal, or until the deadline
//! [`BackupWorker::quiet_until`] names (see `status.rs`).
//!
//! # One step, one ledger
//!
//! Every step goes through [`BackupWorker::step_as`], in one of its [`StepMode`]s: `Full`
//! ([`BackupWorker::step`]), `ReadAhead` ([`BackupWorker::run_once`]) and `AfterShipping` (the
//! runner's tick after a segment: only a restore point or retention). Its [`StepOutcome`] says
//! what it did (objects, bytes, the commits shipped or named by a restore point, a deferral and
//! why); `step_as` books it, or the failure, in one place: the ledger (`ledger.rs`) is the only
//! writer of [`BackupCounters`], and a refusal by another writer forgets the view there. The
//! children (`generation`, `segment`, `restore_point`, `retention`, and `resume`)
//! do not see the worker: each takes a `Ctx` (`ctx.rs`: the store directory, the bucket, the
//! `Uploader` of `upload.rs` that every store-data upload goes through, whether conditional
//! writes are on), the worker's `View` by `&mut`, and what else it needs (the disk state and
//! position, the retention policy, a reading started ahead); it returns what it did and counts
//! nothing. The worker splits its borrows to call them (`BackupWorker::parts`) and keeps its
//! own state — timers, requests, the idle stamp — itself. The durable position the worker
//! reads is handed to the supervisor through a [`DurableReading`], and the phase a step is in
//! ("uploading archive 3 of 9", "shipping a segment"…) through a [`StepActivity`] the children
//! write once per object or phase and `step_as` clears (a quiet tick writes nothing).
//!
//! # Cancellation
//!
//! Which futures may be dropped where:
//! - A step may be dropped at any await. The runner drops one only at shutdown, after letting
//!   it run for `shutdown_grace`; it then calls [`BackupWorker::forget_view`], because what the
//!   step learnt of the bucket (an upload that may or may not have landed) is not to be
//!   trusted. The next step resumes from the bucket's state.
//! - Every step runs under the lease's guard ([`crate::lease::BucketLease::guard`]): a lease
//!   that stops holding drops the step, cancelling its in-flight requests; the runner then drops
//!   the lease and forgets the view at the next acquisition.
//! - Reads of the store run on Tokio's blocking pool: dropping the step does not stop them, so
//!   a read (never a write to the bucket: uploads follow the read in the step itself) may
//!   finish after the step is gone; its result is discarded.
//! - The last flush at shutdown is bounded by `flush_timeout`, then abandoned the same way.
//! - A lease acquisition in flight is never dropped (only the waits between attempts race the
//!   token): a dropped attempt whose write landed would hold the lease until its TTL runs out.
//!
//! [`BackupWorker::run_once`] and [`BackupWorker::step`] take no lease: they are for tests and
//! for callers that hold one themselves (`backup --once` runs
//! [`BackupWorker::run_once_under`] its lease).

/// Segments past the newest restore point at which the next one falls due, whatever the
/// interval (see "Resume"): one LIST page of them for a restart to take back. A busy sync store
/// at 200 segment PUTs a second writes a restore point every 5 s (two PUTs more per thousand).
pub const MAX_BACKLOG_SEGMENTS: usize = 1000;

mod outcome;
pub use outcome::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use crate::bucket::{DynBucket, throttle};
use crate::health::StepActivity;
use crate::store::dir::StoreDir;
use crate::store::disk::DiskState;
use crate::store::watch::{DirWatch, Signal};
use crate::wal_source::{WalSource, names_disk};

pub mod ack;
mod config;
mod ctx;
/// The acknowledgement room under its older name: `worker::durable::{DurableTx, Durability,
/// DurablePosition}` are [`ack`]'s.
pub use ack as durable;
mod error;
mod figures;
mod generation;
mod handle;
mod hold;
pub mod journal;
mod keys;
mod lag;
mod ledger;
pub mod limits;
pub mod lineage;
mod local;
mod once;
pub mod overrides;
pub use once::RunReport;
mod pause;
mod restore_point;
mod resume;
pub mod retention;
pub mod retention_pass;
mod runner;
mod segment;
mod settled;
mod shapes;
mod spawn;
mod status;
mod supervisor;
pub mod tiers;
mod upload;
mod view;

pub use config::{
    DEFAULT_WAL_PUTS_PER_SECOND, DurabilityMode, FIRST_BACKOFF, MAX_BACKOFF, MAX_SEGMENT_BYTES,
    MIN_UNHEALTHY_LAG, UNHEALTHY_AFTER_FAILURES, WorkerConfig,
};
pub use error::WorkerError;
pub use figures::BucketFigures;
pub use generation::GENERATION_UPLOADS_IN_FLIGHT;
pub use handle::{BackupHandle, BackupTrigger};
pub use ledger::DurableReading;
pub use retention::RetentionPolicy;
pub use shapes::{KnownPoints, KnownShapes, PointSize};

/// The backup worker of one store directory and one prefix.
pub struct BackupWorker {
    /// The store directory's path (for messages); every read goes through `store`.
    dir: PathBuf,
    store: StoreDir,
    bucket: DynBucket,
    source: Arc<dyn WalSource>,
    config: WorkerConfig,
    /// Writes the counters, from each step's outcome.
    ledger: ledger::Ledger,
    /// What this worker knows of the prefix; `None` until resumed, and after a refusal.
    view: Option<view::View>,
    last_restore_point: Option<tokio::time::Instant>,
    last_retention: Option<tokio::time::Instant>,
    restore_point_requested: bool,
    retention_requested: bool,
    /// Says when the store directory has not changed since an idle step.
    watch: DirWatch,
    /// Raised on the directory's changes ([`Self::changes`]).
    changes: Signal,
    /// Every change of the source's position raises `changes` too
    /// ([`Self::with_signalled_positions`]).
    positions_signalled: bool,
    /// The last step found nothing to do, with this stamp and position (see [`Quiet`]).
    quiet: Option<Quiet>,
    /// The reading a resume started ([`Self::run_once`]), for the step that starts a generation.
    read_ahead: Option<local::Reading>,
    /// The running step's phase, for the supervisor's health; set by the step's children,
    /// cleared by [`Self::step_as`].
    activity: StepActivity,
    /// How far a restore reaches, published after every step that succeeded (`ack/mod.rs`).
    durable: ack::DurableTx,
}

/// What an idle step saw: while the directory's stamp and the durable position are the same,
/// and nothing time-driven is due, another step would find nothing to do either, so
/// [`BackupWorker::step`] answers [`StepOutcome::Idle`] without looking at the directory. The
/// stamp is exact for writes that completed before it was taken ([`crate::store::watch`]); what
/// it cannot see is found within [`DirWatch::trust`], after which a step looks again.
#[derive(Debug, Clone, Copy)]
struct Quiet {
    /// Taken before the look that found nothing to do.
    stamp: u64,
    position: crate::store::format::WalPosition,
    at: tokio::time::Instant,
}

impl BackupWorker {
    pub fn new(
        dir: impl Into<StoreDir>,
        bucket: DynBucket,
        source: Arc<dyn WalSource>,
        config: WorkerConfig,
    ) -> Self {
        let counters = Arc::new(BackupCounters::default());
        // Counted below the write-once wrapper: what it refuses or answers itself (a hold of
        // an object already held long enough) sends nothing, and is not counted.
        let bucket: DynBucket = Arc::new(crate::bucket::counting::CountingBucket::with_counts(
            bucket,
            counters.requests.clone(),
        ));
        // A write-once prefix's writer creates objects under Object Lock and deletes nothing
        // but its lease (`crate::bucket::write_once`).
        let bucket: DynBucket = match config.lock() {
            Some(lock) => Arc::new(
                crate::bucket::write_once::WriteOnce::new(bucket, lock)
                    .counting_into(counters.immutable.clone()),
            ),
            None => bucket,
        };
        let store: StoreDir = dir.into();
        let dir = store.path().to_path_buf();
        let changes = crate::store::watch::signal();
        // A sync store ships as soon as its files change: no signal of it may be held back.
        let watch = match config.durability {
            DurabilityMode::Sync => DirWatch::signalling_urgently,
            DurabilityMode::Async => DirWatch::signalling,
        };
        Self {
            watch: watch(dir.clone(), changes.clone()),
            changes,
            positions_signalled: false,
            quiet: None,
            dir,
            store,
            bucket,
            source,
            config,
            ledger: ledger::Ledger::new(counters),
            view: None,
            last_restore_point: None,
            last_retention: None,
            restore_point_requested: false,
            retention_requested: false,
            read_ahead: None,
            activity: StepActivity::default(),
            durable: ack::DurableTx::default(),
        }
    }

    /// The bucket as the worker writes it (its requests counted in the worker's counters): for
    /// a [`LeaseAcquirer`](crate::lease::LeaseAcquirer) given to
    /// [`BackupWorker::spawn_under`].
    pub fn bucket(&self) -> DynBucket {
        self.bucket.clone()
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn counters(&self) -> Arc<BackupCounters> {
        self.ledger.counters().clone()
    }

    pub fn config(&self) -> &WorkerConfig {
        &self.config
    }

    /// The worker's durable position (see `ack/mod.rs`): readers subscribe to it.
    pub fn durable(&self) -> &ack::DurableTx {
        &self.durable
    }

    /// Asks for a restore point at the next step that has commits past the newest one.
    pub fn request_restore_point(&mut self) {
        self.restore_point_requested = true;
    }

    /// Asks for retention at the next step.
    pub fn request_retention(&mut self) {
        self.retention_requested = true;
    }

    /// Forgets the view of the bucket: the next step resumes from the bucket's state.
    pub fn forget_view(&mut self) {
        self.view = None;
        self.quiet = None;
        self.read_ahead = None;
    }

    /// What the step's children borrow ([`ctx::Ctx`]), and the view beside it: the borrows
    /// are split so that a child gets the view by `&mut` and nothing else of the worker.
    fn parts(&mut self) -> (ctx::Ctx<'_>, &mut Option<view::View>) {
        let cx = ctx::Ctx {
            dir: &self.dir,
            store: &self.store,
            bucket: &self.bucket,
            uploader: upload::Uploader {
                bucket: self.bucket.clone(),
                cond: ctx::cond_create(self.config.conditional_writes),
                encoding: crate::at_rest::encode::EncodeOptions {
                    compression: self.config.compression,
                    seal: None, // set by the generation and segment uploads
                },
            },
            conditional_writes: self.config.conditional_writes,
            activity: &self.activity,
            encryption: &self.config.encryption,
            form: match self.config.object_lock {
                Some(_) => crate::latest::Form::WriteOnce,
                None => crate::latest::Form::Mutable,
            },
            lock: self.config.lock(),
            holds: &self.ledger.counters().immutable,
        };
        (cx, &mut self.view)
    }

    /// Does one unit of work ([`StepMode::Full`]).
    pub async fn step(&mut self) -> Result<StepOutcome, WorkerError> {
        self.step_as(StepMode::Full).await
    }

    /// The one step: does one unit of work as `mode` says, then books its outcome in one place
    /// (the counters; a refusal by another writer forgets the view of the bucket).
    pub async fn step_as(&mut self, mode: StepMode) -> Result<StepOutcome, WorkerError> {
        // A step dropped mid-way left its phase behind.
        self.activity.clear();
        let result = match mode {
            StepMode::Full => self.full_step(false).await,
            StepMode::ReadAhead => self.full_step(true).await,
            StepMode::AfterShipping => self.after_shipping().await,
        };
        if let Err(WorkerError::ConcurrentWriter { .. }) = &result {
            self.forget_view();
        }
        // The counters first, then the durable position: a reader that sees the position sees
        // the commits it covers booked (`figures.rs`).
        self.ledger.step(&result);
        if result.is_ok() {
            if let Some(pos) = self.view.as_ref().and_then(ack::of_view) {
                self.durable.offer(pos);
            }
            self.ledger.publish_figures(&self.durable);
            if let Some(view) = &self.view {
                let counters = self.ledger.counters();
                shapes::publish(&counters.shapes, view);
                outcome::publish(&counters.branched_from, &view.origin);
                outcome::publish(&counters.branch_charges, &view.branch_charges);
            }
        }
        self.activity.clear();
        result
    }

    /// What a step finds to do once everything is shipped: a restore point when one is due,
    /// then retention when due.
    async fn after_shipping(&mut self) -> Result<StepOutcome, WorkerError> {
        if self.restore_point_due() {
            let (cx, view) = self.parts();
            let view = view.as_mut().expect("resumed");
            if let Some(outcome) = restore_point::write(&cx, view).await? {
                self.last_restore_point = Some(tokio::time::Instant::now());
                self.restore_point_requested = false;
                return Ok(outcome);
            }
        }
        if self.retention_due() {
            // Counted as run from its start, whatever it ends with.
            self.retention_requested = false;
            self.last_retention = Some(tokio::time::Instant::now());
            if self.config.object_lock.is_some() {
                // A write-once prefix: nothing is deleted; the bucket expires (`src/latest.rs`).
                return Ok(StepOutcome::Retention { deleted: 0 });
            }
            let policy = self.config.retention.clone();
            let (cx, view) = self.parts();
            let view = view.as_mut().expect("resumed");
            // Every request of the pass is housekeeping (`crate::bucket::throttle`).
            let pass = retention::run(cx.bucket, cx.activity, view, &policy);
            return throttle::in_class(throttle::TrafficClass::Housekeeping, pass).await;
        }
        Ok(StepOutcome::Idle)
    }

    /// Whether a step would find nothing to do without looking at the directory (see
    /// [`Quiet`]): the last step was idle, and neither the directory's stamp nor the durable
    /// position changed since, and nothing time-driven is due. Sends no request.
    pub async fn quiet(&mut self) -> Result<bool, WorkerError> {
        if self.quiet.is_none() {
            return Ok(false);
        }
        let stamp = self.watch.stamp();
        self.still_quiet(stamp).await
    }

    /// [`BackupWorker::quiet`] with the directory's stamp already taken.
    async fn still_quiet(&mut self, stamp: Option<u64>) -> Result<bool, WorkerError> {
        let Some(quiet) = self.quiet.take() else {
            return Ok(false);
        };
        if stamp == Some(quiet.stamp)
            && quiet.at.elapsed() < self.watch.trust()
            && self.view.is_some()
            && !self.restore_point_due()
            && !self.retention_due()
        {
            let pos = self.source.durable_wal_position().await?;
            self.ledger.durable(pos.commit_seq);
            if pos == quiet.position {
                self.quiet = Some(quiet);
                return Ok(true);
            }
        }
        Ok(false)
    }

    async fn full_step(&mut self, read_ahead: bool) -> Result<StepOutcome, WorkerError> {
        // One stamp serves both the quiet check and, when the look finds nothing, the next one.
        let stamp = self.watch.stamp();
        if self.still_quiet(stamp).await? {
            return Ok(StepOutcome::Idle);
        }
        let looked_at = tokio::time::Instant::now();
        self.ledger.looked();
        let disk = DiskState::look_async(&self.store).await?;
        if disk.intent {
            return Ok(StepOutcome::Deferred(DeferReason::SnapshotInFlight));
        }
        // Started before the position is read (an offline source fsyncs and scans wal.bin for
        // it); a step that defers drops it.
        let ahead =
            (read_ahead && self.view.is_none()).then(|| local::Reading::start(&self.store, &disk));
        let pos = self.source.durable_wal_position().await?;
        self.ledger.durable(pos.commit_seq);
        if !names_disk(&pos, &disk) || pos.durable_len > disk.wal.len {
            self.source.request_refresh();
            return Ok(StepOutcome::Deferred(DeferReason::CatchUp));
        }

        let Some(view) = self.view.as_mut() else {
            let (cx, _) = self.parts();
            let view = resume::from_bucket(&cx, &disk, &pos).await?;
            // Kept only for a step that starts a generation.
            let continues = view.current.as_ref().is_some_and(|g| g.is_of(&pos));
            self.read_ahead = ahead.filter(|_| !continues);
            let outcome = StepOutcome::Resumed {
                lineage: view.lineage,
                generation: view.current.as_ref().map(|g| g.number),
                shipped_commit_seq: view.current.as_ref().map(|g| g.shipped_seq()),
                restore_point_commit_seq: view.newest_own.as_ref().map(|m| m.commit_seq),
            };
            self.view = Some(view);
            return Ok(outcome);
        };

        if !view.current.as_ref().is_some_and(|g| g.is_of(&pos)) {
            let read_ahead = self.read_ahead.take();
            let (cx, view) = self.parts();
            let view = view.as_mut().expect("resumed");
            return generation::start(&cx, view, read_ahead, &disk, &pos).await;
        }
        let current = view.current.as_ref().expect("checked above");
        if pos.durable_len > current.shipped_end {
            let (cx, view) = self.parts();
            let view = view.as_mut().expect("resumed");
            return segment::ship(&cx, view, &disk, &pos).await;
        }
        if pos.durable_len < current.shipped_end {
            return Err(WorkerError::Store {
                dir: self.dir.clone(),
                detail: format!(
                    "wal.bin's durable length {} is below what was already shipped ({}): the store was rewound",
                    pos.durable_len, current.shipped_end
                ),
            });
        }
        let outcome = self.after_shipping().await?;
        if outcome != StepOutcome::Idle {
            return Ok(outcome);
        }
        self.quiet = stamp.map(|stamp| Quiet {
            stamp,
            position: pos,
            at: looked_at,
        });
        Ok(StepOutcome::Idle)
    }

    fn restore_point_due(&self) -> bool {
        let now = tokio::time::Instant::now();
        self.restore_point_due_at(now).is_some_and(|t| t <= now)
    }

    /// When a restore point falls due (`now` or earlier: it is), or `None` while none will by
    /// the clock alone (nothing shipped since the last one).
    fn restore_point_due_at(&self, now: tokio::time::Instant) -> Option<tokio::time::Instant> {
        let view = self.view.as_ref()?;
        let current = view.current.as_ref()?;
        let newest = view.newest_own.as_ref().map(|m| m.commit_seq);
        let fresh_generation = newest.is_none()
            || view
                .newest_own
                .as_ref()
                .is_some_and(|m| m.generation != current.number);
        if current.segments.is_empty() || newest == Some(current.shipped_seq()) {
            return None;
        }
        if view.skip_restore_point_at == Some(current.shipped_seq()) {
            return None;
        }
        if self.restore_point_requested || fresh_generation {
            return Some(now);
        }
        // A backlog of segments no restore point names is what a restart lists and takes on
        // again before it ships (and acknowledges) anything: bounded by a count, whatever the
        // interval (security review 4, finding 7).
        let named_end = view
            .newest_own
            .as_ref()
            .filter(|m| m.generation == current.number)
            .map_or(0, |m| m.segments_end());
        let backlog = current
            .segments
            .iter()
            .rev()
            .take_while(|s| s.end > named_end)
            .take(MAX_BACKLOG_SEGMENTS)
            .count();
        if backlog >= MAX_BACKLOG_SEGMENTS {
            return Some(now);
        }
        Some(
            self.last_restore_point
                .map_or(now, |t| t + self.config.restore_point_interval),
        )
    }

    fn retention_due(&self) -> bool {
        let now = tokio::time::Instant::now();
        self.retention_due_at(now) <= now
    }

    /// When retention falls due (`now` or earlier: it is).
    fn retention_due_at(&self, now: tokio::time::Instant) -> tokio::time::Instant {
        match self.last_retention {
            Some(t) if !self.retention_requested => t + self.config.retention_interval,
            _ => now,
        }
    }

    /// While the last step found the store quiet: the first instant at which a step could find
    /// something to do that nothing signals — the stamp's trust running out, a restore point or
    /// retention falling due. `None` when the worker cannot rest: it is not quiet, or a change
    /// could go unsignalled on [`Self::changes`] (the directory is not watched with the
    /// `dir-watch` thread, or the source's positions are not signalled: see
    /// [`Self::with_signalled_positions`]). A runner may sleep until then, or until the
    /// signal is raised.
    pub fn quiet_until(&self) -> Option<tokio::time::Instant> {
        let quiet = self.quiet.as_ref()?;
        if !self.positions_signalled || !self.watch.signals() {
            return None;
        }
        let now = tokio::time::Instant::now();
        let mut until = quiet.at + self.watch.trust();
        if let Some(t) = self.restore_point_due_at(now) {
            until = until.min(t);
        }
        Some(until.min(self.retention_due_at(now)))
    }

    /// Raised whenever the store directory changes (and by whoever else knows of a change:
    /// the service, on a node's position report): a resting runner's wake-up.
    pub fn changes(&self) -> Signal {
        self.changes.clone()
    }

    /// Declares that every change of the source's durable position is signalled on
    /// [`Self::changes`]: true of sources that read the store directory (its writes raise the
    /// signal), and of the service's streamed sources, whose reports the service signals. Only
    /// then may a quiet worker rest past `wal_interval` ([`Self::quiet_until`]).
    pub fn with_signalled_positions(mut self) -> Self {
        self.positions_signalled = true;
        self
    }
}
