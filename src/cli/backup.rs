//! `backup`: ship a store to a destination, once or continuously until SIGINT/SIGTERM.
//!
//! Both write the prefix only under its bucket lease. `--once` takes it as `retention` does
//! (`lease.rs`): refused, before anything is written, naming the holder while another holder's
//! lease is live (a `serve` holding the store, paused or not; a continuous `backup`), and released at
//! the end. Without `--once` the worker takes it and, while another holds it, waits as a
//! standby (its health lines name the holder).
//!
//! `--replica URL` names a second destination: a second worker on the same store directory,
//! with its own bucket lease (under the replica's prefix), its own retries, backoff and health.
//! The two share nothing but the store's files (which both only read, `backup.lineage` aside:
//! the first to need it writes it, the other reads it back, see
//! [`mushroom_backup::store::disk::write_lineage_once`]), so neither waits for the other: a
//! replica whose bucket is down is unhealthy on its own while the primary ships on, and the
//! other way round. Each health line names its `destination` (`primary` or `replica`) and URL.
//! Both prefixes hold the same lineage, so each restores to the store as far as it shipped.

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
    /// The destination: file:///path or s3://bucket/prefix (with ?endpoint=URL&region=R&profile=P
    /// to name its own S3 configuration).
    #[arg(long)]
    to: String,
    /// A second destination, filled by a second worker of its own (lease, health, retries):
    /// file:///path or s3://bucket/prefix[?endpoint=…&region=…&profile=…].
    #[arg(long, value_name = "URL")]
    replica: Option<String>,
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
    let destinations: Vec<(&str, &str)> = std::iter::once(("primary", a.to.as_str()))
        .chain(a.replica.as_deref().map(|r| ("replica", r)))
        .collect();
    if let Some(replica) = &a.replica
        && bucket::url::without_query(replica) == bucket::url::without_query(&a.to)
    {
        anyhow::bail!("--replica {replica} is the --to destination itself; name another prefix");
    }
    if let Some(mode) = config.object_lock {
        for (_, url) in &destinations {
            if !url.starts_with("s3://") {
                anyhow::bail!(
                    "--object-lock {} needs an s3:// destination in a bucket with Object Lock \
                     enabled; {url} cannot lock objects",
                    mode.name(),
                );
            }
        }
    }
    config.encryption.keys = encryption;
    if !a
        .store
        .join(mushroom_backup::store::disk::WAL_FILE)
        .exists()
    {
        anyhow::bail!("{} is not a store (no wal.bin)", a.store.display());
    }
    let mut workers = Vec::new();
    for (role, url) in &destinations {
        let bucket = bucket::Open::read_write(url, &super::bucket_token())
            .open()
            .await
            .with_context(|| format!("opening the {role} destination"))?;
        let source = Arc::new(LocalSource::new(a.store.clone()));
        let worker = BackupWorker::new(a.store.clone(), bucket, source, config.clone());
        workers.push(Destination {
            role,
            url,
            worker,
            lease: lease_config(&a)?,
        });
    }
    if !a.once {
        return run_continuously(workers).await;
    }
    // Each destination under its own lease, the primary first (it never waits for the
    // replica); one failing does not stop the other. Not at once: on a store never backed up,
    // two first steps together would each decide a lineage and the second one's `--once` fail
    // ("backup.lineage was written meanwhile"), where a continuous run just steps again.
    let mut ran = Vec::with_capacity(workers.len());
    for d in workers.iter_mut() {
        ran.push(once(d).await);
    }
    let mut summaries = Vec::new();
    let mut failed = None;
    for (d, ran) in workers.iter().zip(ran) {
        match ran {
            Ok(deleted) => summaries.push(summary(&d.worker.counters(), deleted)),
            Err(e) => {
                summaries.push(serde_json::json!({"error": format!("{e:#}")}));
                failed.get_or_insert(e);
            }
        }
    }
    if let Some(e) = failed {
        if summaries.len() > 1 {
            super::out::line(with_replica(summaries))?;
        }
        return Err(e);
    }
    super::out::line(with_replica(summaries))?;
    Ok(ExitCode::SUCCESS)
}

/// One destination of this backup: the primary (`--to`) or the replica.
pub(super) struct Destination<'a> {
    pub(super) role: &'static str,
    pub(super) url: &'a str,
    pub(super) worker: BackupWorker,
    pub(super) lease: LeaseConfig,
}

/// `backup --once` to one destination under its lease: the objects retention deleted.
async fn once(d: &mut Destination<'_>) -> anyhow::Result<u64> {
    let what = format!(
        "backup of {} to {}",
        d.worker.dir().display(),
        bucket::url::without_query(d.url)
    );
    let held = super::lease::take(
        d.worker.bucket(),
        d.lease.clone(),
        &what,
        "that backup ships this store already; stop it (or move or deregister the store) \
         before backing it up from here, or back it up to another destination",
    )
    .await?;
    let ran = d.worker.run_once_under(held.lease()).await;
    held.release().await;
    let report = ran
        .with_context(|| what.clone())?
        .with_context(|| what.clone())?;
    Ok(report.deleted)
}

/// The primary's summary, with the replica's under `replica` when there is one.
fn with_replica(mut summaries: Vec<serde_json::Value>) -> serde_json::Value {
    let replica = (summaries.len() > 1).then(|| summaries.pop()).flatten();
    let mut primary = summaries.pop().unwrap_or_default();
    if let (Some(r), Some(obj)) = (replica, primary.as_object_mut()) {
        obj.insert("replica".into(), r);
    }
    primary
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

/// Backs the store up continuously under each destination's bucket lease until
/// SIGINT/SIGTERM, logging every change of each one's health on stderr, then flushes a last
/// restore point to each, releases the leases and exits 0 (an error when a worker panicked).
pub(super) async fn run_continuously(workers: Vec<Destination<'_>>) -> anyhow::Result<ExitCode> {
    run_until(workers, super::shutdown_token()).await
}

/// [`run_continuously`] until `shutdown` (a caller's [`super::shutdown_token`], taken before a signal
/// could come: `promote`'s, so a SIGTERM right after "promoted" is not lost).
pub(super) async fn run_until(
    workers: Vec<Destination<'_>>,
    shutdown: tokio_util::sync::CancellationToken,
) -> anyhow::Result<ExitCode> {
    let tasks = tokio_util::task::TaskTracker::new();
    let mut handles = Vec::new();
    for d in workers {
        let handle = d.worker.spawn(d.lease, shutdown.clone(), &tasks);
        let name = (d.role, bucket::url::without_query(d.url).to_string());
        tasks.spawn(log_health(name, handle.watch_health(), handle.counters()));
        handles.push(handle);
    }
    let mut summaries = Vec::new();
    let mut panicked = None;
    for handle in handles {
        let counters = handle.counters();
        if let WorkerState::Panicked(msg) = handle.wait().await {
            panicked.get_or_insert(msg);
        }
        summaries.push(summary(&counters, 0));
    }
    tasks.close();
    tasks.wait().await;
    super::out::line(with_replica(summaries))?;
    match panicked {
        Some(msg) => anyhow::bail!("a backup worker panicked: {msg}"),
        None => Ok(ExitCode::SUCCESS),
    }
}

/// Logs every change of one destination's health state (healthy, reason, lease) and every new
/// restore point on stderr, as `health {json}`; ends when the worker's health channel closes
/// (its supervisor ended). (Shipping alone logs nothing: a line per segment would be noise.)
async fn log_health(
    (role, url): (&'static str, String),
    mut health: tokio::sync::watch::Receiver<mushroom_backup::health::StoreHealth>,
    counters: Arc<BackupCounters>,
) {
    let mut last = None;
    loop {
        let h = health.borrow_and_update().clone();
        let state = (
            h.healthy,
            h.reason.clone(),
            h.lease_holder.clone(),
            h.lease_held,
            h.restore_point_commit_seq,
        );
        if last.as_ref() != Some(&state) {
            last = Some(state);
            let line = serde_json::json!({
                "destination": role,
                "url": url,
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
        }
        if health.changed().await.is_err() {
            return;
        }
    }
}
