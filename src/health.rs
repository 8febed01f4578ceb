//! Health of one store's backup (DESIGN.md section 7), kept by the runner, never by the
//! worker: a dead or stuck worker can never report itself healthy.
//!
//! The runner (see [`crate::worker::BackupHandle`]) records what it sees in a
//! [`RunnerStatus`] — the lease's state, consecutive failed steps and the last error, a
//! refusal of the prefix, how the worker task ended. A supervisor task beside it re-evaluates
//! [`StoreHealth`] every `wal_interval`, whatever the worker is doing: it reads the durable
//! position from the WAL source itself, so data left unshipped by a stuck worker shows as lag.
//!
//! Unhealthy, each with its reason, in this order of precedence (the order in which
//! [`evaluate`] checks them, so `reason` is the first that holds and `reasons` lists them so):
//! 1. the worker task exited or panicked;
//! 2. the store directory is refused: it left its allowed root or was replaced, or a file in
//!    it is not a regular file of a sane size (see [`crate::store::dir`]), naming the path
//!    (and the root) — the worker reads and uploads nothing from it meanwhile;
//! 3. the prefix is refused (lineage), naming the cause;
//! 4. not holding the bucket lease: another instance holds it (naming the holder), or it was
//!    lost, or released while the worker runs (after a refused write), or not acquired yet
//!    (starting); or held again, but lost 3 times in 10 minutes ([`lease_losses`]);
//! 5. [`UNHEALTHY_AFTER_FAILURES`](crate::worker::UNHEALTHY_AFTER_FAILURES) or more
//!    consecutive failed steps, naming the last error;
//! 6. the WAL source refuses what it is told (a node reported a position the store's files
//!    contradict, see [`crate::wal_source::streamed`]), naming what and who, while it holds;
//! 7. durable data unshipped for longer than `max(min_unhealthy_lag, 10 × wal_interval)`;
//! 8. a write-once (Object Lock) store's last restore point names objects whose lock could not
//!    be held until the restore point must be kept ([`ImmutableHealth`], checked by the worker
//!    at each restore point it writes, `crate::worker`'s `hold.rs`), counting them.
//!
//! A **pause** ([`Pause`], the service's `Pause` call) changes this: while the store is paused
//! its unshipped data is the operator's doing, so the lag (7) is no reason; within its
//! deadline the store stays healthy, with the pause in [`StoreHealth::paused`] and a note.
//! Past its deadline (the supervisor compares it with the wall clock at every evaluation:
//! [`RunnerStatus::pause_overdue`]) the store is unhealthy, "paused past its deadline", placed
//! after the lease (4): it stays paused, uploading nothing, until Resume — a deadline is an
//! alarm, not an automatic resume, so that a pause forgotten is seen rather than undone.
//!
//! Health also says what the runner is doing ([`StoreHealth::activity`]: waiting for the
//! lease, retrying, flushing…) and, while a step runs, which part of it ([`StepPhase`]:
//! "uploading archive 12 of 40", "shipping a segment"…), so a step that hangs shows what it
//! hangs on before the lag limit. The step writes its phase into a [`StepActivity`] at most
//! once per object or phase; the supervisor reads it when it evaluates health.
//!
//! Conditional writes being off is not unhealthy, but health says so in `notes`.
//!
//! A **restore drill** ([`DrillResult`], the service's `Drill`, recorded by the service into
//! the runner's record) that failed makes the store unhealthy, with the drill's error (naming
//! the object that failed), placed after the consecutive failures (5), until a drill succeeds;
//! the last drill is in [`StoreHealth::last_drill`] whatever its outcome. A scheduled drill
//! skipped (over the service's byte budget) is a note ([`RunnerStatus::drill_note`]).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::lease::LeaseState;
mod activity;
pub mod lease_losses;

pub use activity::{Activity, StepActivity, StepPhase};

/// How the worker task ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "state", content = "detail")]
pub enum WorkerState {
    Running,
    /// It returned: shut down, or gave up.
    Exited(String),
    /// It panicked, with the panic's message.
    Panicked(String),
}

/// What the runner records for the supervisor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerStatus {
    pub worker: WorkerState,
    /// `None` before the first acquisition attempt.
    pub lease: Option<LeaseState>,
    pub conditional_writes: bool,
    pub refused: Option<String>,
    /// The last step failed because the store directory (or a file in it) is not to be
    /// trusted; cleared by the next step that goes through.
    pub store_refused: Option<String>,
    pub consecutive_failures: u32,
    pub last_error: Option<String>,
    /// [`WalSource::problem`](crate::wal_source::WalSource::problem), as the supervisor last
    /// read it.
    pub source_problem: Option<String>,
    /// What the runner is doing now (coarse: it changes per step, not per request).
    pub activity: Activity,
    /// The running step's phase, as the supervisor last read it from the [`StepActivity`];
    /// shown in place of [`Activity::Stepping`] (and beside [`Activity::Flushing`]).
    pub step: Option<StepPhase>,
    /// The store's uploads are paused (the runner records it when it applies a pause).
    pub pause: Option<Pause>,
    /// The pause's deadline has passed, as the supervisor last read the clock.
    pub pause_overdue: bool,
    /// The last restore drill (the service records it; see the module docs).
    pub drill: Option<DrillResult>,
    /// Why a scheduled drill was skipped, while it is.
    pub drill_note: Option<String>,
    pub lease_losses: lease_losses::LeaseLosses,
}

/// A restore drill's outcome: the real restore of a restore point into scratch, checked
/// against its manifest (`crate::drill`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrillResult {
    pub ok: bool,
    /// The commit restored (on a failure: the restore point that failed, if known, else 0).
    pub commit_seq: u64,
    pub manifest_key: String,
    /// The measured restore time.
    pub duration_ms: u64,
    /// Bytes of the objects restored, as stored.
    pub bytes: u64,
    /// Why it failed, naming the object; empty when ok.
    pub error: String,
    pub finished_at_unix_ms: i64,
    /// When a drill of the store last succeeded (0: never), this one included.
    pub last_ok_at_unix_ms: i64,
    /// The restore time predicted before the drill began (`crate::restore::predict`), ms; 0
    /// when none was made (a drill recorded before predictions were).
    #[serde(default)]
    pub predicted_ms: u64,
}

/// A pause of a store's uploads: why, since and until when (milliseconds since the epoch).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pause {
    pub reason: String,
    pub paused_at_unix_ms: i64,
    /// The deadline: past it the store is unhealthy (and still paused).
    pub until_unix_ms: i64,
}

impl Pause {
    /// Whether the deadline has passed at `now_unix_ms`.
    pub fn overdue_at(&self, now_unix_ms: i64) -> bool {
        now_unix_ms >= self.until_unix_ms
    }
}

pub use crate::units::rfc3339_ms;

impl Default for RunnerStatus {
    fn default() -> Self {
        Self {
            worker: WorkerState::Running,
            lease: None,
            conditional_writes: true,
            refused: None,
            store_refused: None,
            consecutive_failures: 0,
            last_error: None,
            source_problem: None,
            activity: Activity::Starting,
            step: None,
            pause: None,
            pause_overdue: false,
            drill: None,
            drill_note: None,
            lease_losses: Default::default(),
        }
    }
}

/// The thresholds of health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthPolicy {
    pub wal_interval: Duration,
    pub min_unhealthy_lag: Duration,
    pub unhealthy_after_failures: u32,
}

impl HealthPolicy {
    /// Durable data unshipped for longer than this is unhealthy.
    pub fn max_lag(&self) -> Duration {
        self.min_unhealthy_lag.max(self.wal_interval * 10)
    }
}

/// One store's health, as dashboards and alerts read it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoreHealth {
    pub healthy: bool,
    /// Why it is unhealthy (the most important reason); empty when healthy.
    pub reason: String,
    /// Every reason that holds, most important first.
    pub reasons: Vec<String>,
    /// Facts an operator should know that are not unhealthy (conditional writes off).
    pub notes: Vec<String>,
    pub durable_commit_seq: u64,
    pub shipped_commit_seq: u64,
    pub restore_point_commit_seq: u64,
    /// How far a restore of the prefix reaches (0 while unknown): taken with
    /// `shipped_commit_seq` and `restore_point_commit_seq` at one moment, so never above the
    /// one nor below the other (`worker::figures`).
    #[serde(default)]
    pub bucket_durable_commit_seq: u64,
    /// How long durable data has been waiting to be shipped (0 when all is shipped).
    pub lag_seconds: f64,
    /// Who holds the bucket lease, as `holder@host` (empty when unknown).
    pub lease_holder: String,
    /// Whether this instance holds the lease.
    pub lease_held: bool,
    pub consecutive_failures: u32,
    pub last_error: Option<String>,
    pub worker: WorkerState,
    /// What the runner is doing ([`Activity`]); not part of [`Self::same_state`], so a change
    /// of it alone is not a change of health (watchers are not woken per step).
    #[serde(default)]
    pub activity: String,
    /// The pause, while the store is paused (see the module docs).
    #[serde(default)]
    pub paused: Option<Pause>,
    /// The last restore drill, whatever its outcome.
    #[serde(default)]
    pub last_drill: Option<DrillResult>,
    /// A write-once store's last immutability check; `None` for the mutable layout or before
    /// the worker's first restore point.
    #[serde(default)]
    pub immutable: Option<ImmutableHealth>,
    /// The running worker has not yet learnt its bucket lease's state (its first acquisition
    /// is under way): unhealthy, "starting", but a health of the worker's start rather than
    /// of the store. `/metrics` leaves a starting store's gauges out (`service::ops::health_report`).
    #[serde(default)]
    pub starting: bool,
    /// Where the store's prefix was branched from, when it is a branch (`crate::branch`): the
    /// parent prefix, its lineage and restore point, and the fork commit.
    #[serde(default)]
    pub branched_from: Option<crate::manifest::BranchOrigin>,
}

impl StoreHealth {
    /// The same health but for what changes on every tick (the lag's exact value) and the
    /// activity.
    pub fn same_state(&self, other: &StoreHealth) -> bool {
        // Every field named (no `..`), so a new field cannot be forgotten here; no clones, as
        // this runs for every store at every tick.
        let StoreHealth {
            healthy,
            reason,
            reasons,
            notes,
            durable_commit_seq,
            shipped_commit_seq,
            restore_point_commit_seq,
            bucket_durable_commit_seq,
            lag_seconds,
            lease_holder,
            lease_held,
            consecutive_failures,
            last_error,
            worker,
            activity: _,
            paused,
            last_drill,
            immutable,
            starting,
            branched_from,
        } = self;
        *healthy == other.healthy
            && *reason == other.reason
            && *reasons == other.reasons
            && *notes == other.notes
            && *durable_commit_seq == other.durable_commit_seq
            && *shipped_commit_seq == other.shipped_commit_seq
            && *restore_point_commit_seq == other.restore_point_commit_seq
            && *bucket_durable_commit_seq == other.bucket_durable_commit_seq
            && lag_seconds.floor() == other.lag_seconds.floor()
            && *lease_holder == other.lease_holder
            && *lease_held == other.lease_held
            && *consecutive_failures == other.consecutive_failures
            && *last_error == other.last_error
            && *worker == other.worker
            && *paused == other.paused
            && *last_drill == other.last_drill
            && immutable.map(|i| i.objects_short) == other.immutable.map(|i| i.objects_short)
            && *starting == other.starting
            && *branched_from == other.branched_from
    }
}

/// A write-once store's immutability, as its worker checked it at its last restore point:
/// every object the restore point names held under Object Lock until it must be kept. The
/// check costs no request for what the worker created or extended in the last day, a
/// `PutObjectRetention` per reused object about once a day, and a HEAD per object it never
/// wrote (after a restart or takeover), once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ImmutableHealth {
    pub checked_at_unix_ms: i64,
    /// Objects of that restore point whose lock could not be extended (unhealthy when any).
    pub objects_short: u64,
    /// Since the worker started: locks extended, and HEADs sent to learn a lock.
    pub lock_extensions: u64,
    pub lock_heads: u64,
}

/// What the supervisor measured this tick.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Progress {
    pub durable_commit_seq: u64,
    /// These three are one [`crate::worker::BucketFigures`], taken together.
    pub shipped_commit_seq: u64,
    pub restore_point_commit_seq: u64,
    pub bucket_durable_commit_seq: u64,
    /// How long durable commits have been unshipped (zero when none are).
    pub unshipped_for: Duration,
    pub immutable: Option<ImmutableHealth>,
    /// Where the prefix was branched from (the worker's view of it).
    pub branched_from: Option<crate::manifest::BranchOrigin>,
}

/// Evaluates health: a pure function of what the runner recorded and what was measured.
pub fn evaluate(
    status: &RunnerStatus,
    progress: Progress,
    policy: &HealthPolicy,
    own_holder: &str,
) -> StoreHealth {
    let mut reasons = Vec::new();
    match &status.worker {
        WorkerState::Running => {}
        WorkerState::Exited(why) => reasons.push(format!("the backup worker exited: {why}")),
        WorkerState::Panicked(msg) => reasons.push(format!("the backup worker panicked: {msg}")),
    }
    if let Some(r) = &status.store_refused {
        reasons.push(r.clone());
    }
    if let Some(r) = &status.refused {
        reasons.push(format!("prefix refused: {r}"));
    }
    let (lease_holder, lease_held) = lease_of(status, own_holder, &mut reasons);
    if let Some(p) = status.pause.as_ref().filter(|_| status.pause_overdue) {
        reasons.push(format!(
            "paused past its deadline ({}; reason: {}): it stays paused, uploading nothing, \
             until Resume",
            rfc3339_ms(p.until_unix_ms),
            p.reason
        ));
    }
    if status.consecutive_failures >= policy.unhealthy_after_failures {
        reasons.push(format!(
            "{} consecutive backup steps failed; last: {}",
            status.consecutive_failures,
            status.last_error.as_deref().unwrap_or("unknown")
        ));
    }
    if let Some(d) = status.drill.as_ref().filter(|d| !d.ok) {
        reasons.push(format!(
            "the last restore drill failed ({}): {}; until a drill succeeds",
            rfc3339_ms(d.finished_at_unix_ms),
            d.error
        ));
    }
    if let Some(p) = &status.source_problem {
        reasons.push(format!("position reports refused: {p}"));
    }
    if status.pause.is_none() && progress.unshipped_for > policy.max_lag() {
        reasons.push(format!(
            "durable commits {}..={} unshipped for {:.0} s (limit {:.0} s)",
            progress.shipped_commit_seq + 1,
            progress.durable_commit_seq,
            progress.unshipped_for.as_secs_f64(),
            policy.max_lag().as_secs_f64()
        ));
    }
    if let Some(i) = progress.immutable.filter(|i| i.objects_short > 0) {
        reasons.push(format!(
            "{} objects named by the restore point written at {} are locked for less time than \
             it must be kept (the bucket refused to extend their Object Lock retention)",
            i.objects_short,
            rfc3339_ms(i.checked_at_unix_ms)
        ));
    }
    let notes = notes_of(status);
    StoreHealth {
        healthy: reasons.is_empty(),
        reason: reasons.first().cloned().unwrap_or_default(),
        reasons,
        notes,
        durable_commit_seq: progress.durable_commit_seq,
        shipped_commit_seq: progress.shipped_commit_seq,
        restore_point_commit_seq: progress.restore_point_commit_seq,
        bucket_durable_commit_seq: progress.bucket_durable_commit_seq,
        lag_seconds: progress.unshipped_for.as_secs_f64(),
        lease_holder,
        lease_held,
        consecutive_failures: status.consecutive_failures,
        last_error: status.last_error.clone(),
        worker: status.worker.clone(),
        activity: activity_text(status),
        paused: status.pause.clone(),
        last_drill: status.drill.clone(),
        immutable: progress.immutable,
        starting: status.lease.is_none() && status.worker == WorkerState::Running,
        branched_from: progress.branched_from,
    }
}

/// The lease's holder as health shows it, and whether this instance holds it; pushes to
/// `reasons` why the store is unhealthy on the lease's account, if it is.
fn lease_of(status: &RunnerStatus, own_holder: &str, reasons: &mut Vec<String>) -> (String, bool) {
    match &status.lease {
        Some(LeaseState::Holding) => {
            reasons.extend(status.lease_losses.reason());
            (own_holder.to_string(), true)
        }
        Some(LeaseState::HeldElsewhere {
            holder,
            host,
            store,
        }) => {
            reasons.push(format!(
                "the bucket lease is held by another instance ({holder} on {host}, store {store}); \
                 this one uploads nothing until it is released or goes stale"
            ));
            (format!("{holder}@{host}"), false)
        }
        Some(LeaseState::Lost { reason }) => {
            reasons.push(format!(
                "the bucket lease was lost ({reason:?}); acquiring it again"
            ));
            (String::new(), false)
        }
        Some(LeaseState::Released) => {
            if status.worker == WorkerState::Running {
                reasons.push("the bucket lease is released; acquiring it again".to_string());
            }
            (String::new(), false)
        }
        None => {
            reasons.push("starting: the bucket lease is not acquired yet".to_string());
            (String::new(), false)
        }
    }
}

/// What health notes without the store being unhealthy for it: conditional writes off, a
/// pause, the drill's note.
fn notes_of(status: &RunnerStatus) -> Vec<String> {
    let mut notes = Vec::new();
    if !status.conditional_writes {
        notes.push(
            "conditional writes are off (MUSHROOMDB_BACKUP_LEASE_CONDITIONAL=off): the lease is best effort \
             and nothing fences a second writer"
                .to_string(),
        );
    }
    if let Some(p) = &status.pause {
        notes.push(format!(
            "paused since {} until {} (reason: {}): uploading nothing until Resume",
            rfc3339_ms(p.paused_at_unix_ms),
            rfc3339_ms(p.until_unix_ms),
            p.reason
        ));
    }
    notes.extend(status.drill_note.clone());
    notes
}

/// What the worker is doing, with the phase of its step.
fn activity_text(status: &RunnerStatus) -> String {
    match (&status.activity, &status.step) {
        (Activity::Stepping, Some(phase)) => phase.to_string(),
        (Activity::Flushing, Some(phase)) => format!("flushing: {phase}"),
        (activity, _) => activity.to_string(),
    }
}

#[cfg(test)]
mod tests;
