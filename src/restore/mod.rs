//! Restore: rebuilding a store directory from a bucket (DESIGN.md section 6).
//!
//! [`restore`] chooses a restore point ([`plan`]), downloads it into a temporary directory
//! beside the target and renames it into place ([`stage`]).
//!
//! # What is restored
//! - By default, the manifest LATEST names (if LATEST is missing, unreadable or names a
//!   missing or invalid manifest: the newest valid manifest under `manifests/`, with a
//!   warning), **extended** by the segments of its generation shipped after it: starting at the
//!   manifest's last segment end, each next segment must start exactly where the previous one
//!   ended, be as long as its key says and hold whole frames with valid CRCs whose seqs continue
//!   the chain. The chain is the one that reaches furthest (`crate::at_rest::chain`, shared
//!   with the standby and the worker's resume; a segment failing its check is routed around).
//!   So the restore holds the newest commit shipped, not just the newest restore point.
//!   `restore_point_only` turns this off. Segments listed past where the chain ends that it
//!   did not take (another chain, a promotion's claim, a bad or oversized object) may hold
//!   later commits: the restore is refused before downloading, naming each and why
//!   ([`RestoreError::Partial`]), unless `allow_partial`, when the report lists them in
//!   `left_out`.
//! - With `at: Some(N)`: a restore point whose snapshot holds at most N commits and whose WAL,
//!   with later segments of its generation, reaches N; the one whose snapshot is nearest below
//!   N (least to download), and among those one whose manifest reaches N without segments. The
//!   WAL is cut right after frame `seq = N`; if N falls in an archive, that archive becomes
//!   `wal.bin` (cut) and later WAL files are not downloaded. An N that no restore point reaches
//!   is refused with the reachable ranges.
//! - With `at_time_ms: Some(T)` (`--at-time`): the newest commit shipped at or before the
//!   instant T by the bucket's own clock ([`at_time`] says how, and which times count), as an
//!   `--at` restore of that commit; the report names the commit and its time. Refused together
//!   with `at`.
//!
//! # Guarantees
//! - Every object is checked against its manifest entry (length and CRC-32); segments past the
//!   manifest against the CRCs of their frames, and then against the CRC of the bytes so
//!   checked. Side file names must be plain file names (a hostile manifest cannot write
//!   outside the store).
//! - Every file is read back with the format's own reader ([`readback`]: snapshot CRCs; every
//!   WAL frame's CRC and the seq chain within each WAL file; archive numbers and floors
//!   chaining; `wal.bin`'s header) over exactly the bytes written to the file: a file that is
//!   one whole archive or `wal.bin` object (raw, or decoded from one GET) in the same pass that
//!   writes it, each byte read before it is written (`fetch`, `decode`), every other file from
//!   disk. Each file is read, and fsynced, as soon as its last byte is written, overlapped with the
//!   downloads still in flight (a restore's CPU work and disk writes then hide behind its
//!   network waits; [`stage`] says how); `wal.bin` is read and fsynced again after an `--at`
//!   cut. Before the rename every file and directory is fsynced, and the
//!   files' readings must chain into a store that reports the expected `commit_seq`, with
//!   `wal.bin` the manifest's `wal_id`/`wal_number`. All of this runs on the temporary
//!   directory, so a mismatch never leaves a target behind.
//! - With `engine_check` (`restore --engine-check`), a store whose `store.meta` says the
//!   reference engine wrote it is also read by the engine (`store::engine::read_store`, every
//!   commit decoded into its map), which must agree on `commit_seq`; other engines' payloads
//!   are never interpreted. It is off by default: DESIGN.md section 6 asks for the format's
//!   reader only (frame payloads are the engine's business), and the engine's reading costs a
//!   second read of every file plus a decode and a map insert per commit, after the download
//!   (680,000 commits in `benches/throughput.rs`, where it held restores well below plain
//!   GETs), while checking nothing about the bytes that the frame CRCs and seq chain above do
//!   not: the bytes restored are the bytes the engine wrote. Tests compare the restored store's
//!   digest (`store::engine::digest`) themselves, and one runs the engine's check.
//! - All or nothing: the target appears (or an existing empty target is replaced) by one
//!   `rename`, then the parent directory is fsynced. On any error, and when the restore's
//!   future is dropped, the temporary directory is removed and the target is as it was: absent,
//!   or an empty directory. A non-empty target is refused before anything is downloaded (and
//!   again by the rename, should it fill up meanwhile).
//! - Boot restore (`adopt`): a new random `backup.lineage` and a `backup.parent` record naming
//!   the restore point are written into the staged store before the rename, so the backup
//!   worker adopts the prefix (DESIGN.md section 5).
//! - Private: the restored store is the restoring user's alone, whatever the umask. The
//!   temporary directory that becomes the target, and `archive/` in it, are created `0700`,
//!   every file `0600` ([`stage::DIR_MODE`], [`stage::FILE_MODE`]). The bucket records no
//!   modes, so none are restored: a store backed up `0750`/`0640` also comes back
//!   `0700`/`0600`; widen it after the restore if a group must read it. An existing empty
//!   target keeps its own mode (whoever made it chose it); the files in it are still `0600`.
//!
//! # Crash story
//! A process that dies mid-restore leaves only its temporary directory
//! `.<target name>.restore-<uuid>` beside the target, never a partial target. A resumable
//! restore ([`RestoreOptions::resumable`]; the CLI's `restore` always is) keeps a durable
//! record there of every object complete and checked ([`resume`]): the same restore run
//! again continues it, fetching only what was not complete; it also keeps the directory when
//! the bucket or the disk fails mid-way. Any other restore into the same target (another
//! prefix, restore point, commit or key set, or `--fresh`) discards it, naming it and why in
//! the log; a restore still running holds its lock and is left alone. Deleting it by hand is
//! always safe.
//!
//! # Progress and prediction
//! [`RestoreOptions::tracker`] is the restore's counters ([`progress`]): the terminal bar,
//! `restore --progress json` and a drill's activity in health read it. Before the download the
//! restore predicts its own time from the manifests ([`predict`], at
//! [`RestoreOptions::rates`]); the report carries the prediction and the measured seconds.
//!
//! # Limits
//! The `--at` cut walks `wal.bin`'s frame headers and the read-back reads each file a chunk at
//! a time, so neither holds a file whole; decoding holds a few MiB per object whatever its
//! entry claims (`decode`, `crate::at_rest::bounds`). A target that is
//! a mount point cannot be replaced by a rename and is refused: restore into a directory
//! inside it.

use std::fmt;
use std::io::IsTerminal;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};

use serde::Serialize;
use uuid::Uuid;

use crate::bucket::{Bucket, BucketError};
use crate::manifest::ManifestError;
use crate::store::disk::DiskError;
use crate::store::format::ParentRecord;

pub mod at_time;
pub mod calibrate;
mod cut;
mod decode;
mod fetch;
mod holder;
pub mod keys;
mod piece;
pub mod plan;
pub mod predict;
pub mod progress;
pub mod readback;
mod resume;
mod space;
pub mod stage;

pub use readback::{ReadBack, read_back};
pub use stage::side_file_name_problem;

/// How to restore.
#[derive(Debug, Clone, PartialEq)]
pub struct RestoreOptions {
    /// Restore exactly to commit N (see the module docs).
    pub at: Option<u64>,
    /// Restore the newest commit shipped at or before this instant (unix ms; see [`at_time`]).
    pub at_time_ms: Option<i64>,
    /// Stop at the restore point: do not extend it by later segments.
    pub restore_point_only: bool,
    /// Boot restore: write a new `backup.lineage` and a `backup.parent`.
    pub adopt: bool,
    /// Requests in flight at once.
    pub parallelism: usize,
    /// Show a progress bar (only when stderr is a terminal).
    pub progress: bool,
    /// The counters the restore advances: a clone shows how far it is ([`progress`]).
    pub tracker: progress::Progress,
    /// The rates its prediction is made at ([`predict`]; the report's `predicted_seconds`).
    pub rates: predict::Rates,
    /// Resumable ([`resume`]): continue what an interrupted run of the same restore left, keep
    /// the staging directory when the bucket or the disk fails mid-way.
    pub resumable: bool,
    /// With `resumable`: discard what earlier runs left and start over (`--fresh`).
    pub fresh: bool,
    /// Also read a reference-engine store with the engine before the rename (see the module
    /// docs).
    pub engine_check: bool,
    /// The keys encrypted generations are opened with ([`keys`]).
    pub keys: keys::RestoreKeys,
    /// Restore even when segments listed past what the chain reaches are left out
    /// ([`RestoreError::Partial`] otherwise, before anything is downloaded); the report's
    /// `left_out` names them.
    pub allow_partial: bool,
}

impl Default for RestoreOptions {
    fn default() -> Self {
        RestoreOptions {
            at: None,
            at_time_ms: None,
            restore_point_only: false,
            adopt: false,
            parallelism: 16,
            progress: false,
            tracker: progress::Progress::new(),
            rates: predict::Rates::default(),
            resumable: false,
            fresh: false,
            engine_check: false,
            keys: keys::RestoreKeys::default(),
            allow_partial: false,
        }
    }
}

/// Which commit a restore asks for: the newest (both `None`), commit N, or an instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Point {
    pub commit_seq: Option<u64>,
    /// Unix ms.
    pub time_ms: Option<i64>,
}

/// What a restore did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RestoreReport {
    /// Commits the restored store holds (read back from it).
    pub commit_seq: u64,
    /// With `at_time_ms`: when the bucket says that commit was shipped (unix ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit_time_unix_ms: Option<i64>,
    /// The manifest restored from.
    pub manifest_key: String,
    /// The manifest's lineage and generation.
    pub lineage: Uuid,
    pub generation: u64,
    /// Objects the restored store is made of, and their bytes (as stored).
    pub objects: usize,
    pub bytes: u64,
    /// Of `bytes`, fetched by this run.
    pub fetched_bytes: u64,
    /// Of `bytes`, kept from an earlier, interrupted run of the same restore ([`resume`]).
    pub resumed_bytes: u64,
    /// How long this run took, start to rename, and where the time went.
    pub seconds: f64,
    pub plan_seconds: f64,
    pub download_seconds: f64,
    pub finish_seconds: f64,
    /// The prediction made before the download began ([`predict`]), and whether its rates
    /// were measured on this machine.
    pub predicted_seconds: f64,
    pub predicted_calibrated: bool,
    /// What the restore moved, as its prediction saw it ([`predict::Shape`]): what a
    /// calibration ([`calibrate::Sample::of`]) measures it against.
    pub shape: predict::Shape,
    /// Segments past the manifest that extended it.
    pub extended_segments: usize,
    /// With `adopt`: the parent record written (`backup.parent`).
    pub parent: Option<ParentRecord>,
    /// With `adopt`: the new lineage written (`backup.lineage`).
    pub new_lineage: Option<Uuid>,
    /// Things an operator should know (a fallback from a bad LATEST, unused segments).
    pub warnings: Vec<String>,
    /// Listed segments past what was restored that the restore did not use, each with why
    /// (`at_rest::chain`): each may hold commits this restore does not. Not empty only with
    /// [`RestoreOptions::allow_partial`] (the restore is refused otherwise).
    pub left_out: Vec<crate::at_rest::chain::LeftOut>,
}

impl fmt::Display for RestoreReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "restored commit {}", self.commit_seq)?;
        if let Some(t) = self.commit_time_unix_ms {
            write!(f, ", shipped at {},", crate::units::rfc3339_ms(t))?;
        }
        write!(
            f,
            " from {} (lineage {}, generation {}",
            self.manifest_key, self.lineage, self.generation
        )?;
        if self.extended_segments > 0 {
            write!(f, ", extended by {} segments", self.extended_segments)?;
        }
        write!(f, "): {} objects, {} bytes", self.objects, self.bytes)?;
        if self.resumed_bytes > 0 {
            write!(
                f,
                " ({} kept from an interrupted run, {} fetched)",
                self.resumed_bytes, self.fetched_bytes
            )?;
        }
        write!(
            f,
            " in {:.1} s (predicted {:.1} s)",
            self.seconds, self.predicted_seconds
        )?;
        if let Some(l) = self.new_lineage {
            write!(f, "; adopted as lineage {l}")?;
        }
        for w in &self.warnings {
            write!(f, "\nwarning: {w}")?;
        }
        Ok(())
    }
}

/// Ranges of commits that `--at` can reach, merged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reachable(pub Vec<RangeInclusive<u64>>);

impl Reachable {
    /// Sorts and merges overlapping or adjacent ranges.
    pub fn merge(mut ranges: Vec<RangeInclusive<u64>>) -> Reachable {
        ranges.sort_by_key(|r| (*r.start(), *r.end()));
        let mut out: Vec<RangeInclusive<u64>> = Vec::new();
        for r in ranges {
            match out.last_mut() {
                Some(last) if *r.start() <= last.end().saturating_add(1) => {
                    if r.end() > last.end() {
                        *last = *last.start()..=*r.end();
                    }
                }
                _ => out.push(r),
            }
        }
        Reachable(out)
    }
}

impl fmt::Display for Reachable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return write!(f, "none");
        }
        for (i, r) in self.0.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{}..={}", r.start(), r.end())?;
        }
        Ok(())
    }
}

/// Why a restore failed. No target is left behind whatever the error.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("target {} is not empty", path.display())]
    TargetNotEmpty { path: PathBuf },
    #[error("target {}: {detail}", path.display())]
    BadTarget { path: PathBuf, detail: String },
    #[error("no restore point in {url}: {detail}")]
    NoRestorePoint { url: String, detail: String },
    #[error("no restore point reaches commit {at} (reachable: {reachable})")]
    Unreachable { at: u64, reachable: Reachable },
    /// An `--at-time` that is not a usable instant.
    #[error("--at-time {given:?} {detail}")]
    BadTime { given: String, detail: String },
    #[error(
        "{at} is before the earliest restorable instant {earliest}: nothing restorable had \
         been shipped by then"
    )]
    BeforeEarliest { at: String, earliest: String },
    /// Listed segments past what the chain reaches were left out (`crate::at_rest::chain`):
    /// they may hold commits a restore would silently miss. Refused before anything is
    /// downloaded unless [`RestoreOptions::allow_partial`].
    #[error(
        "the segments past the restore point reach commit {commit_seq}, but {} listed past \
         them were left out and may hold later commits: {}; investigate them (damage, a second \
         writer, a promotion's claim), or restore anyway with --allow-partial (or --at \
         {commit_seq})",
        left_out.len(),
        left_out.iter().map(|l| l.to_string()).collect::<Vec<_>>().join("; ")
    )]
    Partial {
        commit_seq: u64,
        left_out: Vec<crate::at_rest::chain::LeftOut>,
    },
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error("{key}: CRC mismatch (expected {expected:08x}, got {got:08x})")]
    CrcMismatch {
        key: String,
        expected: u32,
        got: u32,
    },
    /// An object that is not what its manifest entry says (length, name, content).
    #[error("{key}: {detail}")]
    BadObject { key: String, detail: String },
    #[error(transparent)]
    Bucket(#[from] BucketError),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Disk(#[from] DiskError),
    /// An encrypted generation that no key given opens (which key ids it needs).
    #[error("encrypted backup: {detail}")]
    Key { detail: String },
    /// The staged store does not read back as expected.
    #[error("read-back of {}: {detail}", dir.display())]
    ReadBack { dir: PathBuf, detail: String },
}

/// An I/O error of the file or directory `path`, as a restore reports it.
fn io(path: &Path) -> impl FnOnce(std::io::Error) -> RestoreError + '_ {
    move |source| RestoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The restore point `opts` asks for: by instant (`--at-time`, [`at_time`]) or by commit
/// ([`plan`]), not both (a branch is cut at it too).
pub(crate) async fn choose(
    bucket: &dyn Bucket,
    opts: &RestoreOptions,
) -> Result<plan::Plan, RestoreError> {
    match (opts.at_time_ms, opts.at) {
        (Some(t), Some(n)) => Err(RestoreError::BadTime {
            given: crate::units::rfc3339_ms(t),
            detail: format!("cannot be asked for together with commit {n}: choose one"),
        }),
        (Some(t), None) => at_time::choose_at_time(bucket, t, opts).await,
        (None, _) => plan::choose(bucket, opts).await,
    }
}

/// Restores a store from `bucket` into `target` (see the module docs for what is restored and
/// what is guaranteed).
#[tracing::instrument(name = "restore", skip_all, fields(target = %target.display(), at = ?opts.at))]
pub async fn restore(
    bucket: &dyn Bucket,
    target: &Path,
    opts: &RestoreOptions,
) -> Result<RestoreReport, RestoreError> {
    let started = std::time::Instant::now();
    let tracker = &opts.tracker;
    tracker.start(None);
    // Refuse a bad target before downloading anything.
    let t = target.to_path_buf();
    let target = tokio::task::spawn_blocking(move || stage::resolve_target(&t))
        .await
        .map_err(|e| RestoreError::BadTarget {
            path: target.to_path_buf(),
            detail: format!("check failed: {e}"),
        })??;
    let Prepared {
        plan,
        layout,
        predicted_seconds,
        staging,
        resumed,
        holder,
    } = prepare(bucket, &target, opts).await?;
    // A branch's objects are where its parent keeps them.
    let objects = holder.as_deref().unwrap_or(bucket);
    let parent = opts.adopt.then(|| ParentRecord {
        lineage: plan.manifest.lineage,
        manifest: plan.manifest_key.clone(),
        commit_seq: plan.manifest.commit_seq,
    });
    let new_lineage = opts.adopt.then(Uuid::new_v4);

    let plan_seconds = started.elapsed().as_secs_f64();
    tracker.download(layout.bytes(), layout.objects() as u64, resumed);
    let stage::Staging { temp, record, kept } = staging;
    let into = stage::Into {
        dir: temp.path(),
        kept: &kept,
        record: record.map(|r| std::sync::Arc::new(std::sync::Mutex::new(r))),
    };
    let parallelism = opts.parallelism.max(1);
    let download = stage::download(objects, into, &layout, &plan.cached, parallelism, tracker);
    let bar = opts.progress && std::io::stderr().is_terminal();
    let downloaded = match progress::drawing(download, bar.then_some(tracker)).await {
        Ok(d) => d,
        // The bucket or the disk failed: what is complete is worth keeping for a rerun.
        Err(e @ (RestoreError::Bucket(_) | RestoreError::Io { .. })) if opts.resumable => {
            temp.keep();
            return Err(e);
        }
        Err(e) => return Err(e),
    };
    let download_seconds = started.elapsed().as_secs_f64() - plan_seconds;
    tracker.set_phase(progress::Phase::Finish);

    let line = tracker.line();
    let mut report = RestoreReport {
        commit_seq: plan.commit_seq,
        commit_time_unix_ms: plan.commit_time_ms,
        manifest_key: plan.manifest_key.clone(),
        lineage: plan.manifest.lineage,
        generation: plan.manifest.generation,
        objects: layout.objects(),
        bytes: layout.bytes(),
        fetched_bytes: line.fetched_bytes,
        resumed_bytes: line.resumed_bytes,
        seconds: 0.0,
        plan_seconds,
        download_seconds,
        finish_seconds: 0.0,
        predicted_seconds,
        predicted_calibrated: opts.rates.calibrated,
        shape: layout.shape(plan.cut.is_some()),
        extended_segments: layout_extension_count(&plan),
        parent: parent.clone(),
        new_lineage,
        warnings: plan.warnings.clone(),
        left_out: plan.left_out.clone(),
    };
    let dest = target.clone();
    let engine_check = opts.engine_check;
    tokio::task::spawn_blocking(move || {
        let adopt = new_lineage.zip(parent.as_ref());
        stage::finish(temp.path(), downloaded, &layout, &plan, adopt, engine_check)?;
        temp.into_place(&dest)
    })
    .await
    .map_err(|e| RestoreError::BadTarget {
        path: target.path.clone(),
        detail: format!("finishing failed: {e}"),
    })??;
    tracker.set_phase(progress::Phase::Done);
    report.seconds = started.elapsed().as_secs_f64();
    report.finish_seconds = report.seconds - plan_seconds - download_seconds;
    // The caller says it to people (the CLI on stdout, the service in its answer and events):
    // at info it was said twice.
    tracing::debug!("{report}");
    Ok(report)
}

/// A restore planned and staged, before its download.
struct Prepared {
    plan: plan::Plan,
    layout: stage::Layout,
    predicted_seconds: f64,
    staging: stage::Staging,
    /// Bytes and objects an earlier run left complete.
    resumed: (u64, u64),
    /// The prefix holding a branch's objects ([`holder`]).
    holder: Option<crate::bucket::DynBucket>,
}

/// Chooses the restore point, opens every key it needs, predicts its time, and opens its
/// staging (continuing an interrupted run's when resumable); refuses a plan that leaves
/// listed data out, or that the target's disk cannot hold.
async fn prepare(
    bucket: &dyn Bucket,
    target: &stage::Target,
    opts: &RestoreOptions,
) -> Result<Prepared, RestoreError> {
    let mut plan = choose(bucket, opts).await?;
    let holder = holder::of(bucket, &mut plan)?;
    if !plan.left_out.is_empty() && !opts.allow_partial {
        return Err(RestoreError::Partial {
            commit_seq: plan.commit_seq,
            left_out: plan.left_out,
        });
    }
    let mut layout = stage::layout(&plan)?;
    // Every generation key before anything is staged: a missing or wrong key leaves nothing.
    let m = &plan.manifest;
    let entries = m.objects().chain(plan.extension.iter().map(|s| &s.object));
    opts.keys
        .open_all(holder.as_deref().unwrap_or(bucket), entries)
        .await?;
    layout.keys = opts.keys.clone();
    let shape = layout.shape(plan.cut.is_some());
    let predicted_seconds = predict::predict(&shape, &opts.rates, opts.parallelism.max(1));
    opts.tracker.start(Some(predicted_seconds));
    let identity = resume::Identity::of(&bucket.url(), &plan, layout.describe());
    let t = target.clone();
    let staging_layout = layout.clone();
    let resume = opts.resumable.then_some(opts.fresh);
    let staging = tokio::task::spawn_blocking(move || {
        // Resolve again: the target may have changed while the plan was made.
        stage::resolve_target(&t.path)?;
        stage::open_staging(&t, &staging_layout, resume.map(|fresh| (&identity, fresh)))
    })
    .await
    .map_err(|e| RestoreError::BadTarget {
        path: target.path.clone(),
        detail: format!("staging failed: {e}"),
    })??;
    let resumed = staging.kept.totals(layout.piece_lens());
    if let Some(detail) = space::space_problem(target, &layout, resumed.0) {
        if resumed.0 > 0 {
            staging.temp.keep();
        }
        return Err(RestoreError::BadTarget {
            path: target.path.clone(),
            detail,
        });
    }
    tracing::info!(
        manifest = %plan.manifest_key,
        commit_seq = plan.commit_seq,
        objects = layout.objects(),
        bytes = layout.bytes(),
        resumed_bytes = resumed.0,
        predicted_seconds,
        "restoring into {}",
        target.path.display()
    );
    Ok(Prepared {
        plan,
        layout,
        predicted_seconds,
        staging,
        resumed,
        holder,
    })
}

/// Extension segments the restore uses (with `--at`, only those up to N).
fn layout_extension_count(plan: &plan::Plan) -> usize {
    let mut seq = plan.manifest.commit_seq;
    let mut n = 0;
    for s in &plan.extension {
        if plan.cut.is_some_and(|cut| seq >= cut) {
            break;
        }
        seq += s.frames;
        n += 1;
    }
    n
}
