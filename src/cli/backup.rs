//! `backup`: ship a store to a destination, once or following it until SIGINT/SIGTERM.
//!
//! Both write the prefix only under its bucket lease. `--once` takes it as `retention` does
//! (`lease.rs`): refused, before anything is written, naming the holder while another holder's
//! lease is live (a `serve` holding the store, paused or not; a follower), and released at
//! the end. Without `--once` the worker takes it and, while another holds it, waits as a
//! standby (its health lines name the holder).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;

use std::sync::atomic::Ordering;

use mushroom_backup::bucket;
use mushroom_backup::health::WorkerState;
use mushroom_backup::lease::LeaseConfig;
use mushroom_backup::wal_source::LocalSource;
use mushroom_backup::worker::{BackupCounters, BackupWorker};

use super::settings::WorkerSettings;

#[derive(Args)]
pub struct BackupArgs {
    /// The store directory.
    #[arg(long)]
    store: PathBuf,
    /// The destination: file:///path or s3://bucket/prefix.
    #[arg(long)]
    to: String,
    /// Ship everything durable, write a restore point, run retention, and exit.
    #[arg(long)]
    once: bool,
    #[command(flatten)]
    settings: WorkerSettings,
    #[command(flatten)]
    encryption: super::encryption::EncryptionArgs,
}

pub async fn run(a: BackupArgs) -> anyhow::Result<ExitCode> {
    // Fail closed: a key that cannot be had stops here, before the bucket is touched.
    let encryption = a.encryption.load_for_writing("backup")?;
    let mut config = a.settings.config()?;
    if let Some(mode) = config.object_lock
        && !a.to.starts_with("s3://")
    {
        anyhow::bail!(
            "--object-lock {} needs an s3:// destination in a bucket with Object Lock enabled; \
             {} cannot lock objects",
            mode.name(),
            a.to
        );
    }
    config.encryption.keys = encryption;
    if !a
        .store
        .join(mushroom_backup::store::disk::WAL_FILE)
        .exists()
    {
        anyhow::bail!("{} is not a store (no wal.bin)", a.store.display());
    }
    let bucket = bucket::Open::read_write(&a.to, &super::bucket_token())
        .open()
        .await?;
    let source = Arc::new(LocalSource::new(a.store.clone()));
    let mut worker = BackupWorker::new(a.store.clone(), bucket, source, config);
    let lease = lease_config(&a)?;
    if !a.once {
        return follow(worker, lease).await;
    }
    let what = format!("backup of {} to {}", a.store.display(), a.to);
    let held = super::lease::take(
        worker.bucket(),
        lease,
        &what,
        "that backup ships this store already; stop it (or move or deregister the store) \
         before backing it up from here, or back it up to another destination",
    )
    .await?;
    let ran = worker.run_once_under(held.lease()).await;
    held.release().await;
    let report = ran
        .with_context(|| what.clone())?
        .with_context(|| what.clone())?;
    super::out::line(summary(&worker.counters(), report.deleted))?;
    Ok(ExitCode::SUCCESS)
}

/// The lease this backup takes: the TTL and conditional writes from the environment, the
/// latter off too when `--conditional off` says so.
fn lease_config(a: &BackupArgs) -> anyhow::Result<LeaseConfig> {
    let mut lease = LeaseConfig::from_env(a.store.display().to_string())?;
    lease.conditional = lease.conditional && a.settings.conditional_on(&Default::default())?;
    Ok(lease)
}

/// The one JSON line a backup prints on stdout when it ends.
fn summary(c: &BackupCounters, deleted: u64) -> serde_json::Value {
    serde_json::json!({
        "restore_point_commit_seq": c.restore_point_commit_seq.load(Ordering::Relaxed),
        "shipped_commit_seq": c.shipped_commit_seq.load(Ordering::Relaxed),
        "bytes_shipped": c.bytes_shipped.load(Ordering::Relaxed),
        // Of the objects this run uploaded: bytes as stored (compressed) and their plain bytes.
        "bytes_stored": c.bytes_shipped.load(Ordering::Relaxed),
        "bytes_logical": c.bytes_logical.load(Ordering::Relaxed),
        "objects_shipped": c.objects_shipped.load(Ordering::Relaxed),
        "objects_reused": c.objects_reused.load(Ordering::Relaxed),
        "restore_points": c.restore_points.load(Ordering::Relaxed),
        "lease_acquisitions": c.lease_acquisitions.load(Ordering::Relaxed),
        "deleted": deleted,
    })
}

/// Follows the store under the bucket lease until SIGINT/SIGTERM, logging every change of
/// health on stderr, then flushes a last restore point, releases the lease and exits 0.
pub(super) async fn follow(worker: BackupWorker, lease: LeaseConfig) -> anyhow::Result<ExitCode> {
    follow_until(worker, lease, super::shutdown_token()).await
}

/// [`follow`] until `shutdown` (a caller's [`super::shutdown_token`], taken before a signal
/// could come: `promote`'s, so a SIGTERM right after "promoted" is not lost).
pub(super) async fn follow_until(
    worker: BackupWorker,
    lease: LeaseConfig,
    shutdown: tokio_util::sync::CancellationToken,
) -> anyhow::Result<ExitCode> {
    let tasks = tokio_util::task::TaskTracker::new();
    let handle = worker.spawn(lease, shutdown.clone(), &tasks);
    let mut health = handle.watch_health();
    let counters = handle.counters();
    // Ends when the worker's health channel closes (its supervisor ended).
    tasks.spawn(async move {
        let mut last = None;
        loop {
            let h = health.borrow_and_update().clone();
            let state = (
                h.healthy,
                h.reason.clone(),
                h.lease_holder.clone(),
                h.lease_held,
            );
            if last.as_ref() == Some(&state) {
                if health.changed().await.is_err() {
                    return;
                }
                continue;
            }
            last = Some(state);
            let line = serde_json::json!({
                "healthy": h.healthy,
                "reason": h.reason,
                "lease_holder": h.lease_holder,
                "lease_held": h.lease_held,
                "durable_commit_seq": h.durable_commit_seq,
                "shipped_commit_seq": h.shipped_commit_seq,
                "restore_point_commit_seq": h.restore_point_commit_seq,
                "objects_shipped": counters.objects_shipped.load(Ordering::Relaxed),
                "notes": h.notes,
            });
            eprintln!("health {line}");
            if health.changed().await.is_err() {
                return;
            }
        }
    });
    let counters = handle.counters();
    let ended = handle.wait().await;
    tasks.close();
    tasks.wait().await;
    super::out::line(summary(&counters, 0))?;
    match ended {
        WorkerState::Exited(_) => Ok(ExitCode::SUCCESS),
        WorkerState::Panicked(msg) => anyhow::bail!("the backup worker panicked: {msg}"),
        WorkerState::Running => Ok(ExitCode::SUCCESS),
    }
}
