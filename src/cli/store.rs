//! `store write` and `store digest`: the reference engine from the command line.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};

use mushroom_backup::store::engine::{self, ValueKind, WriteOptions};

#[derive(Subcommand)]
pub enum StoreCommand {
    /// Create or open a store and append N deterministic commits (same seed, same data).
    Write(WriteArgs),
    /// Print `{"commit_seq": N, "digest": "..."}` of a store (a torn tail does not change it).
    Digest {
        /// The store directory.
        dir: PathBuf,
    },
}

#[derive(Args)]
pub struct WriteArgs {
    /// The store directory (created if missing).
    dir: PathBuf,
    /// Commits to append.
    #[arg(long)]
    commits: u64,
    /// Bytes of each value.
    #[arg(long, default_value_t = 64)]
    value_size: usize,
    /// Commits per second (each synced on its own); as fast as possible when absent.
    #[arg(long)]
    rate: Option<f64>,
    /// Snapshot every K commits (0: never).
    #[arg(long, default_value_t = 0)]
    snapshot_every: u64,
    /// Rotate wal.bin past this many bytes (0: never).
    #[arg(long, default_value_t = 0)]
    rotate_bytes: u64,
    /// Snapshots keep wal.bin instead of starting a new one.
    #[arg(long)]
    keep_wal_on_snapshot: bool,
    /// Seed of the deterministic workload.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// What values hold: `random` bytes (incompressible) or `text` rows from a fixed
    /// vocabulary (compress at least 3:1 with zstd).
    #[arg(long, default_value = "random")]
    value_kind: ValueKind,
}

pub async fn run(cmd: StoreCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        StoreCommand::Write(a) => {
            let stop = super::shutdown_flag();
            let opts = WriteOptions {
                commits: a.commits,
                value_size: a.value_size,
                rate_per_sec: a.rate,
                snapshot_every: a.snapshot_every,
                rotate_bytes: a.rotate_bytes,
                keep_wal_on_snapshot: a.keep_wal_on_snapshot,
                seed: a.seed,
                value_kind: a.value_kind,
                stop: Some(stop),
            };
            let dir = a.dir.clone();
            let report = tokio::task::spawn_blocking(move || engine::write_commits(&dir, &opts))
                .await
                .context("the write task failed")?
                .with_context(|| format!("store write {}", a.dir.display()))?;
            super::out::line(serde_json::json!({
                "first_seq": report.first_seq,
                "last_seq": report.last_seq,
                "written": report.written,
                "stopped": report.stopped,
                "commit_seq": report.digest.commit_seq,
                "digest": report.digest.digest,
            }))?;
            Ok(ExitCode::SUCCESS)
        }
        StoreCommand::Digest { dir } => {
            let d = dir.clone();
            let digest = tokio::task::spawn_blocking(move || engine::digest(&d))
                .await
                .context("the digest task failed")?
                .with_context(|| format!("store digest {}", dir.display()))?;
            super::out::line(serde_json::to_string(&digest)?)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}
