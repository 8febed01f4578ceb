//! Backup settings shared by the commands: flags, each also a `MUSHROOMDB_BACKUP_*` variable.

use std::time::Duration;

use clap::Args;

use mushroom_backup::worker::{RetentionPolicy, WorkerConfig};

#[derive(Args, Debug, Clone)]
pub struct WorkerSettings {
    /// How often the durable WAL is shipped, in milliseconds.
    #[arg(
        long,
        env = "MUSHROOMDB_BACKUP_WAL_INTERVAL_MS",
        default_value_t = 1000
    )]
    pub wal_interval_ms: u64,
    /// How often a restore point is written while commits arrive, in milliseconds.
    #[arg(
        long,
        env = "MUSHROOMDB_BACKUP_RESTORE_POINT_INTERVAL_MS",
        default_value_t = 60_000
    )]
    pub restore_point_interval_ms: u64,
    /// How often retention runs, in milliseconds.
    #[arg(
        long,
        env = "MUSHROOMDB_BACKUP_RETENTION_INTERVAL_MS",
        default_value_t = 3_600_000
    )]
    pub retention_interval_ms: u64,
    /// Keep every restore point younger than this many milliseconds.
    #[arg(long, env = "MUSHROOMDB_BACKUP_KEEP_FOR_MS", default_value_t = 7 * 24 * 3_600_000)]
    pub keep_for_ms: u64,
    /// Keep every restore point of this many newest generations.
    #[arg(long, env = "MUSHROOMDB_BACKUP_KEEP_GENERATIONS", default_value_t = 2)]
    pub keep_generations: u64,
    /// Leave objects of a claimed generation no manifest names alone this long (ms).
    #[arg(
        long,
        env = "MUSHROOMDB_BACKUP_ORPHAN_GRACE_MS",
        default_value_t = 3_600_000
    )]
    pub orphan_grace_ms: u64,
    /// `off` for object stores without conditional PUT: every write becomes plain.
    #[arg(long, env = "MUSHROOMDB_BACKUP_LEASE_CONDITIONAL", default_value = "on", value_parser = ["on", "off"])]
    pub conditional: String,
}

impl WorkerSettings {
    pub fn config(&self) -> anyhow::Result<WorkerConfig> {
        if self.wal_interval_ms == 0 {
            anyhow::bail!("--wal-interval-ms must be at least 1");
        }
        if self.keep_generations == 0 {
            anyhow::bail!(
                "--keep-generations must be at least 1 (the newest generation is always kept)"
            );
        }
        Ok(WorkerConfig {
            wal_interval: Duration::from_millis(self.wal_interval_ms),
            restore_point_interval: Duration::from_millis(self.restore_point_interval_ms),
            retention_interval: Duration::from_millis(self.retention_interval_ms),
            retention: RetentionPolicy {
                keep_for: Duration::from_millis(self.keep_for_ms),
                keep_generations: self.keep_generations,
                orphan_grace: Duration::from_millis(self.orphan_grace_ms),
            },
            conditional_writes: self.conditional == "on",
            ..WorkerConfig::default()
        })
    }
}
