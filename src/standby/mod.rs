//! A standby: a store directory kept current from the bucket (`restore --follow`; issue 28).
//!
//! ("Follow" already names `backup`'s follow mode, which follows a *store* and ships it; a
//! standby follows a *prefix* and applies it.) [`follow`] restores the prefix's newest commit
//! into the directory (or resumes the store already there), then polls the bucket and applies
//! what was shipped since, until its cancellation token fires. It only reads the bucket: open
//! it read-only (`bucket::Open::read_only`). A library API with a cancellation token and no
//! process state, so a worker can run it as well as the CLI.
//!
//! # What it applies
//! - **Segments** of the generation it follows, past what it applied: checked by the restore's
//!   chain rule (length, every frame's CRC, seqs continuing the commits applied), appended to
//!   `wal.bin` and fsynced ([`apply`]).
//! - **A new generation** (a snapshot, a WAL rotation: new archives, a new `wal.bin`): once
//!   LATEST names a restore point of a later generation of the same lineage, that restore
//!   point, extended by its segments, is restored beside the directory and exchanged with it in
//!   one rename ([`apply`]). Side files (`store.meta`, `backup.lineage`) come with each
//!   generation: a side file changed within a generation reaches the standby with the next one.
//!
//! # What a poll costs ([`poll`])
//! One LIST of `gen/` starting after the applied end: it shows the new segments of the
//! generation followed and whether a later generation exists. LATEST (one GET, and its
//! manifest's) is read only when a later generation exists and no segment of the one followed
//! is left; then a restore of the new generation (what it downloads: its snapshot, archives,
//! segments, side files). Each new segment costs one GET.
//!
//! Polls come every `poll_interval` (default 1 s) while there is news, so a busy prefix is
//! followed within one WAL interval (the backup ships a segment per `wal_interval`) plus one
//! poll plus the request times. (DESIGN.md section 5 says "never poll the bucket with LIST in
//! steady state": that is the backup worker's rule, which learns of new data from its own
//! store; a standby has nothing but the bucket to learn from, and one LIST a poll is the
//! cheapest look that sees both new segments and new generations.) After [`IDLE_AFTER`] polls without news the interval doubles
//! up to `idle_poll_interval` (default 15 s): an **idle prefix costs one LIST per 15 s, 4 a
//! minute, 240 an hour** (plus 14 in the first 40 s of quiet: 10 at 1 s, then 2, 4 and 8 s),
//! measured by `benches/standby.rs`.
//! The price: the first commit after a quiet spell reaches the standby up to one idle
//! interval late. Bucket errors are retried by the bucket's retry layer, then by the next
//! poll; they never stop the standby.
//!
//! # Invariants
//! - The directory is at every moment a store the format's reader opens (`restore::read_back`,
//!   `store::engine::read_store`), at some commit of the followed lineage's history, never
//!   ahead of what the bucket holds.
//! - Nothing is written to the bucket; locally, only the directory, its `store.lock` (held
//!   while following, so no engine opens a standby and no two standbys share one) and staged
//!   directories beside it. `backup.lineage` and `backup.parent` are never written (they come
//!   from the bucket as the primary's side files).
//! - A prefix that moves to another lineage (an adoption, a different store) stops the
//!   standby with [`StandbyError::LineageChanged`]: it never applies another history. A
//!   directory holding more commits than the prefix (or another lineage's) is refused, never
//!   rewound by a restore.
//!
//! # Crash story
//! Each apply runs in numbered steps ([`ApplyStep`]), and a crash between any two leaves a
//! store that opens: after an append, a `wal.bin` with a whole or torn tail (the format ends
//! the log at the first bad frame); during a generation change, the old or the new store under
//! the directory's name and a staged directory beside it. A restart removes staged
//! directories, cuts `wal.bin` back to a segment boundary the bucket knows (one LIST of the
//! generation's segments), and resumes from there. `tests/standby.rs` crashes the process at
//! every step and checks both. The future [`follow`] returns may be dropped at any await:
//! local writes run on the blocking pool to the end of their step.

use std::fs::File;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::bucket::{Bucket, list_all};
use crate::manifest::{parse_segment_key, segments_prefix};
use crate::restore::plan::{ChainStart, ExtendHow, extend_listed, latest_restore_point};
use crate::restore::{RestoreOptions, keys::RestoreKeys};

pub mod apply;
mod error;
pub mod local;
pub mod poll;
pub mod promote;
pub mod promotion;
pub mod takeover;

pub use apply::ApplyStep;
pub use error::StandbyError;

/// Default poll interval while there is news.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Default longest interval between polls of a quiet prefix.
pub const DEFAULT_IDLE_POLL_INTERVAL: Duration = Duration::from_secs(15);
/// The range of both intervals.
pub const POLL_INTERVAL_MIN: Duration = Duration::from_millis(100);
pub const POLL_INTERVAL_MAX: Duration = Duration::from_secs(3600);
/// Polls without news before polls slow down.
pub const IDLE_AFTER: u32 = 10;
/// The exit status of a crash injected at an [`ApplyStep`].
pub const CRASH_EXIT: i32 = 86;

/// How a standby follows.
#[derive(Debug, Clone)]
pub struct StandbyOptions {
    pub poll_interval: Duration,
    pub idle_poll_interval: Duration,
    /// Downloads in flight at once (restores and segment fetches).
    pub parallelism: usize,
    /// Keys to open encrypted generations with.
    pub keys: RestoreKeys,
    /// For tests: exit the process (status [`CRASH_EXIT`]) at this step of the first apply
    /// that reaches it.
    pub crash_at: Option<ApplyStep>,
}

impl Default for StandbyOptions {
    fn default() -> Self {
        StandbyOptions {
            poll_interval: DEFAULT_POLL_INTERVAL,
            idle_poll_interval: DEFAULT_IDLE_POLL_INTERVAL,
            parallelism: RestoreOptions::default().parallelism,
            keys: RestoreKeys::default(),
            crash_at: None,
        }
    }
}

impl StandbyOptions {
    /// Refuses an interval outside its range, naming it.
    pub fn check(&self) -> Result<(), StandbyError> {
        let range = POLL_INTERVAL_MIN..=POLL_INTERVAL_MAX;
        for (name, d) in [
            ("poll interval", self.poll_interval),
            ("idle poll interval", self.idle_poll_interval),
        ] {
            if !range.contains(&d) {
                return Err(StandbyError::BadOption(format!(
                    "{name} {} ms is outside {}..={} ms",
                    d.as_millis(),
                    POLL_INTERVAL_MIN.as_millis(),
                    POLL_INTERVAL_MAX.as_millis()
                )));
            }
        }
        if self.idle_poll_interval < self.poll_interval {
            return Err(StandbyError::BadOption(format!(
                "idle poll interval {} ms is below the poll interval {} ms",
                self.idle_poll_interval.as_millis(),
                self.poll_interval.as_millis()
            )));
        }
        if self.parallelism == 0 {
            return Err(StandbyError::BadOption(
                "parallelism must be at least 1".into(),
            ));
        }
        Ok(())
    }

    fn restore_options(&self) -> RestoreOptions {
        RestoreOptions {
            parallelism: self.parallelism,
            keys: self.keys.clone(),
            // A standby applies the segments past a restore point itself, poll by poll, and
            // its promotion refuses data left out (`promote::nothing_left_out`).
            allow_partial: true,
            ..RestoreOptions::default()
        }
    }
}

/// Where a standby stands, in the bucket's terms.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Applied {
    /// The lineage followed.
    pub lineage: Uuid,
    /// The generation whose `wal.bin` the directory's is.
    pub generation: u64,
    /// Bytes of that `wal.bin` applied (a segment boundary).
    pub wal_end: u64,
    /// Commits the directory holds.
    pub commit_seq: u64,
    /// The restore point the generation was entered from.
    pub manifest: String,
}

/// What one apply did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ApplyKind {
    /// The directory was empty: the prefix was restored into it.
    Restored,
    /// The store already there was taken up where it stood.
    Resumed,
    /// Segments appended.
    Segments,
    /// A new generation exchanged in.
    Generation,
}

/// One apply, as the CLI prints it (one JSON line each).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ApplyReport {
    pub applied: ApplyKind,
    #[serde(flatten)]
    pub at: Applied,
    /// Segments appended (for `segments`).
    pub segments: usize,
    /// When it was applied (unix ms, this host's clock).
    pub unix_ms: i64,
}

/// The crash hook of [`StandbyOptions::crash_at`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Crash(Option<ApplyStep>);

impl Crash {
    pub(crate) fn wants(&self, step: ApplyStep) -> bool {
        self.0 == Some(step)
    }

    /// Exits the process here if asked to (a test's crash; nothing is flushed or removed).
    pub(crate) fn at(&self, step: ApplyStep) {
        if self.wants(step) {
            eprintln!("standby: crashing at step {} ({step:?})", step as u8);
            std::process::exit(CRASH_EXIT);
        }
    }
}

/// Takes `store.lock` in `dir` (see the module docs).
pub(crate) fn lock(dir: &Path) -> Result<File, StandbyError> {
    crate::store::engine::lock_store(dir).map_err(|e| match e {
        crate::store::engine::EngineError::Locked { .. } => StandbyError::InUse {
            dir: dir.to_path_buf(),
        },
        e => StandbyError::NotAStore {
            dir: dir.to_path_buf(),
            detail: e.to_string(),
        },
    })
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StandbyError> + Send + 'static,
) -> Result<T, StandbyError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(StandbyError::join)?
}

/// A standby at work: its place and the lock on its directory.
struct Following {
    at: Applied,
    _lock: File,
}

/// When a standby polls next (see the module docs): every `poll_interval` while there is
/// news; after [`IDLE_AFTER`] polls without news, or after each failed poll, the wait doubles
/// up to `idle_poll_interval`. [`follow`] and the service's follower pace themselves with it.
#[derive(Debug, Clone)]
pub struct PollPace {
    wait: Duration,
    quiet: u32,
    poll: Duration,
    idle: Duration,
}

impl PollPace {
    pub fn new(opts: &StandbyOptions) -> Self {
        PollPace {
            wait: opts.poll_interval,
            quiet: 0,
            poll: opts.poll_interval,
            idle: opts.idle_poll_interval,
        }
    }

    /// How long to wait before the next poll.
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// A poll applied something: back to the busy interval.
    pub fn news(&mut self) {
        self.wait = self.poll;
        self.quiet = 0;
    }

    /// A poll found nothing to apply.
    pub fn nothing(&mut self) {
        self.quiet = self.quiet.saturating_add(1);
        if self.quiet >= IDLE_AFTER {
            self.slower();
        }
    }

    /// A poll failed (to be retried).
    pub fn failed(&mut self) {
        self.slower();
    }

    fn slower(&mut self) {
        self.wait = (self.wait * 2).min(self.idle);
    }
}

/// Follows the prefix of `bucket` into `dir` until `cancel` fires (see the module docs);
/// `on_apply` hears of every apply. Returns where it stood.
pub async fn follow(
    bucket: &dyn Bucket,
    dir: &Path,
    opts: &StandbyOptions,
    cancel: &CancellationToken,
    mut on_apply: impl FnMut(&ApplyReport) + Send,
) -> Result<Applied, StandbyError> {
    let (mut stepper, first) = tokio::select! {
        _ = cancel.cancelled() => return Err(StandbyError::Cancelled),
        r = Stepper::start(bucket, dir, opts) => r?,
    };
    on_apply(&first);
    let mut pace = PollPace::new(opts);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return Ok(stepper.at().clone()),
            _ = tokio::time::sleep(pace.wait()) => {}
        }
        let stepped = tokio::select! {
            _ = cancel.cancelled() => return Ok(stepper.at().clone()),
            r = stepper.step(bucket, dir, opts) => r,
        };
        match stepped {
            Ok(Polled {
                applied: Some(r), ..
            }) => {
                on_apply(&r);
                pace.news();
            }
            Ok(_) => pace.nothing(),
            Err(e) if e.is_transient() => {
                tracing::warn!(
                    "standby of {}: {e}; retrying at the next poll",
                    dir.display()
                );
                pace.failed();
            }
            Err(e) => return Err(e),
        }
    }
}

/// A standby stepped by its caller, one poll at a time ([`follow`] is the loop the CLI runs;
/// the service's follower runs its own, to report each poll's lag, both paced by
/// [`PollPace`]): the start, polls and applies, with the directory's lock held from
/// [`Stepper::start`] until it is dropped.
pub struct Stepper {
    now: Following,
    crash: Crash,
}

/// One [`Stepper::step`]: what its poll found and what was applied.
#[derive(Debug, Clone)]
pub struct Polled {
    /// The apply, when the poll found something to apply.
    pub applied: Option<ApplyReport>,
    /// Objects the poll listed past what was applied (new segments, a later generation's).
    pub found: usize,
    /// The oldest `Last-Modified` (unix ms, the bucket's clock) among them.
    pub oldest_found_ms: Option<i64>,
}

impl Stepper {
    /// Restores into an empty `dir`, or takes up the store there ([`follow`]'s start).
    pub async fn start(
        bucket: &dyn Bucket,
        dir: &Path,
        opts: &StandbyOptions,
    ) -> Result<(Stepper, ApplyReport), StandbyError> {
        opts.check()?;
        let crash = Crash(opts.crash_at);
        let (now, kind) = start(bucket, dir, opts, &crash).await?;
        let r = report(kind, &now.at, 0);
        Ok((Stepper { now, crash }, r))
    }

    /// Where the standby stands.
    pub fn at(&self) -> &Applied {
        &self.now.at
    }

    /// One poll (one LIST), and the apply of what it found.
    pub async fn step(
        &mut self,
        bucket: &dyn Bucket,
        dir: &Path,
        opts: &StandbyOptions,
    ) -> Result<Polled, StandbyError> {
        let at = &self.now.at;
        let seen = poll::poll(bucket, at.generation, at.wal_end).await?;
        let found = seen.listed.len();
        let oldest_found_ms = seen.listed.iter().filter_map(|o| o.modified_ms).min();
        let stepped = apply_seen(bucket, dir, at, opts, &self.crash, seen).await?;
        let applied = stepped.map(|(next, kind, segments)| {
            let r = report(kind, &next.at, segments);
            if let Some(lock) = next.lock {
                self.now._lock = lock;
            }
            self.now.at = next.at;
            r
        });
        Ok(Polled {
            applied,
            found,
            oldest_found_ms,
        })
    }
}

fn report(kind: ApplyKind, at: &Applied, segments: usize) -> ApplyReport {
    ApplyReport {
        applied: kind,
        at: at.clone(),
        segments,
        unix_ms: crate::units::unix_now_ms(),
    }
}

/// What a step moved to: where the standby stands, and the new lock after an exchange.
struct Next {
    at: Applied,
    lock: Option<File>,
}

/// Restores into an empty directory, or takes up the store there (see the module docs).
async fn start(
    bucket: &dyn Bucket,
    dir: &Path,
    opts: &StandbyOptions,
    crash: &Crash,
) -> Result<(Following, ApplyKind), StandbyError> {
    let d = dir.to_path_buf();
    blocking(move || local::remove_stale(&d)).await?;
    let d = dir.to_path_buf();
    let kind = if blocking(move || local::is_empty(&d)).await? {
        crate::restore::restore(bucket, dir, &opts.restore_options()).await?;
        ApplyKind::Restored
    } else {
        ApplyKind::Resumed
    };
    let d = dir.to_path_buf();
    let (lock, here) = blocking(move || Ok((lock(&d)?, local::look(&d)?))).await?;
    let (manifest_key, m) = latest_restore_point(bucket, &mut Vec::new()).await?;
    if let Some(ours) = here.lineage
        && ours != m.lineage
    {
        return Err(StandbyError::LineageChanged {
            ours,
            prefix: m.lineage,
        });
    }
    let same_files =
        (m.snapshot.as_ref().map(|s| s.snapshot_id), m.wal_id) == (here.snapshot_id, here.wal_id);
    if !same_files {
        if m.commit_seq < here.commit_seq {
            return Err(StandbyError::Diverged {
                dir: dir.to_path_buf(),
                local: here.commit_seq,
                prefix: m.commit_seq,
            });
        }
        // The generation the directory came from is passed over: only what it holds counts.
        let at = Applied {
            lineage: m.lineage,
            generation: m.generation,
            wal_end: 0,
            commit_seq: here.commit_seq,
            manifest: manifest_key,
        };
        let next = change_generation(bucket, dir, &at, None, opts, crash)
            .await?
            .ok_or_else(|| StandbyError::Diverged {
                dir: dir.to_path_buf(),
                local: here.commit_seq,
                prefix: m.commit_seq,
            })?;
        let lock = next.lock.unwrap_or(lock);
        return Ok((
            Following {
                at: next.at,
                _lock: lock,
            },
            ApplyKind::Generation,
        ));
    }
    // Cut a torn or partly applied tail back to a boundary of the bucket's segments.
    let mut bounds: Vec<u64> = list_all(bucket, &segments_prefix(m.generation))
        .await?
        .iter()
        .filter_map(|o| parse_segment_key(m.generation, &o.key))
        .flat_map(|(s, e)| [s, e])
        .collect();
    bounds.push(m.segments_end());
    let cut = bounds
        .into_iter()
        .filter(|b| *b <= here.wal_end)
        .max()
        .ok_or_else(|| StandbyError::NotAStore {
            dir: dir.to_path_buf(),
            detail: format!(
                "its wal.bin ({} valid bytes) is shorter than any segment of generation {}",
                here.wal_end, m.generation
            ),
        })?;
    let here = if cut < here.wal_len {
        tracing::info!(
            "standby {}: cutting wal.bin from {} to {cut} bytes (a segment boundary)",
            dir.display(),
            here.wal_len
        );
        let d = dir.to_path_buf();
        blocking(move || {
            local::trim_tail(&d, cut)?;
            local::look(&d)
        })
        .await?
    } else {
        here
    };
    let at = Applied {
        lineage: m.lineage,
        generation: m.generation,
        wal_end: here.wal_end,
        commit_seq: here.commit_seq,
        manifest: manifest_key,
    };
    Ok((Following { at, _lock: lock }, kind))
}

/// One poll and what it applies: `None` when there was nothing to apply.
async fn step(
    bucket: &dyn Bucket,
    dir: &Path,
    at: &Applied,
    opts: &StandbyOptions,
    crash: &Crash,
) -> Result<Option<(Next, ApplyKind, usize)>, StandbyError> {
    let seen = poll::poll(bucket, at.generation, at.wal_end).await?;
    apply_seen(bucket, dir, at, opts, crash, seen).await
}

/// What one poll saw ([`poll::Seen`]) applied: `None` when there was nothing to apply.
async fn apply_seen(
    bucket: &dyn Bucket,
    dir: &Path,
    at: &Applied,
    opts: &StandbyOptions,
    crash: &Crash,
    seen: poll::Seen,
) -> Result<Option<(Next, ApplyKind, usize)>, StandbyError> {
    if seen.listed.is_empty() {
        return Ok(None);
    }
    let ext = extend_from(bucket, at, seen.listed, opts, true).await?;
    if !ext.segments.is_empty() {
        let (d, a, c) = (dir.to_path_buf(), at.clone(), *crash);
        let n = ext.segments.len();
        let (plain, end, reach) = (ext.plain, ext.end, ext.reach);
        let next = blocking(move || apply::append(&d, &a, &plain, end, reach, &c)).await?;
        return Ok(Some((
            Next {
                at: next,
                lock: None,
            },
            ApplyKind::Segments,
            n,
        )));
    }
    if !seen.later_generation {
        return Ok(None);
    }
    Ok(
        change_generation(bucket, dir, at, Some(at.generation), opts, crash)
            .await?
            .map(|next| (next, ApplyKind::Generation, 0)),
    )
}

/// The chain of the segments `listed` that continues what was applied (`at`), chosen as a
/// restore chooses it (`restore::plan::extend_listed`), with each segment's plain bytes when
/// `keep_plain`.
pub(crate) async fn extend_from(
    bucket: &dyn Bucket,
    at: &Applied,
    listed: Vec<crate::bucket::ObjectMeta>,
    opts: &StandbyOptions,
    keep_plain: bool,
) -> Result<crate::restore::plan::Extension, StandbyError> {
    let from = ChainStart {
        lineage: at.lineage,
        generation: at.generation,
        end: at.wal_end,
        reach: at.commit_seq,
    };
    let how = ExtendHow {
        limit: None,
        until: None,
        parallelism: opts.parallelism,
        keep_plain,
    };
    Ok(extend_listed(bucket, &from, listed, &how, &opts.keys).await?)
}

/// Moves to the generation of the newest restore point, if it is of the lineage followed,
/// later than `newer_than` (when given) and holds at least the commits applied (see
/// [`apply`]).
async fn change_generation(
    bucket: &dyn Bucket,
    dir: &Path,
    at: &Applied,
    newer_than: Option<u64>,
    opts: &StandbyOptions,
    crash: &Crash,
) -> Result<Option<Next>, StandbyError> {
    let (_, m) = latest_restore_point(bucket, &mut Vec::new()).await?;
    if m.lineage != at.lineage {
        return Err(StandbyError::LineageChanged {
            ours: at.lineage,
            prefix: m.lineage,
        });
    }
    if newer_than.is_some_and(|g| m.generation <= g) {
        // The later generation has no restore point yet: wait for it.
        return Ok(None);
    }
    let staged = apply::stage(bucket, dir, &opts.restore_options()).await?;
    let fits = staged.report.lineage == at.lineage
        && newer_than.is_none_or(|g| staged.report.generation > g)
        && staged.local.commit_seq >= at.commit_seq;
    if !fits {
        let p = staged.path.clone();
        blocking(move || std::fs::remove_dir_all(&p).map_err(local::io(&p))).await?;
        tracing::warn!(
            "standby {}: the restore point {} (lineage {}, generation {}, commit {}) does not \
             follow what was applied; waiting",
            dir.display(),
            staged.report.manifest_key,
            staged.report.lineage,
            staged.report.generation,
            staged.local.commit_seq
        );
        return Ok(None);
    }
    let next = Applied {
        lineage: at.lineage,
        generation: staged.report.generation,
        wal_end: staged.local.wal_end,
        commit_seq: staged.local.commit_seq,
        manifest: staged.report.manifest_key.clone(),
    };
    let (d, c) = (dir.to_path_buf(), *crash);
    let lock = blocking(move || apply::exchange(&d, &staged, &c)).await?;
    Ok(Some(Next {
        at: next,
        lock: Some(lock),
    }))
}
