//! `backup`: ship a store to a destination, once or following it until SIGINT/SIGTERM.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;

use mushroom_backup::bucket;
use mushroom_backup::wal_source::LocalSource;
use mushroom_backup::worker::BackupWorker;

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
}

pub async fn run(a: BackupArgs) -> anyhow::Result<ExitCode> {
    let config = a.settings.config()?;
    if !a
        .store
        .join(mushroom_backup::store::disk::WAL_FILE)
        .exists()
    {
        anyhow::bail!("{} is not a store (no wal.bin)", a.store.display());
    }
    let bucket = bucket::open(&a.to).await?;
    let source = Arc::new(LocalSource::new(a.store.clone()));
    let mut worker = BackupWorker::new(a.store.clone(), bucket, source, config);
    let report = if a.once {
        worker.run_once().await
    } else {
        let token = super::shutdown_token();
        worker.follow(token).await
    }
    .with_context(|| format!("backup of {} to {}", a.store.display(), a.to))?;
    let counters = worker.counters();
    println!(
        "{}",
        serde_json::json!({
            "restore_point_commit_seq": counters.restore_point_commit_seq.load(std::sync::atomic::Ordering::Relaxed),
            "shipped_commit_seq": counters.shipped_commit_seq.load(std::sync::atomic::Ordering::Relaxed),
            "bytes_shipped": counters.bytes_shipped.load(std::sync::atomic::Ordering::Relaxed),
            "objects_shipped": counters.objects_shipped.load(std::sync::atomic::Ordering::Relaxed),
            "objects_reused": counters.objects_reused.load(std::sync::atomic::Ordering::Relaxed),
            "deleted": report.deleted,
        })
    );
    Ok(ExitCode::SUCCESS)
}
