//! Backup settings shared by the commands: flags, each also a `MUSHROOMDB_BACKUP_*` variable,
//! and (for `serve`) the `[worker]` table of the TOML file. A flag or variable wins over the
//! file, the file over the default.

use clap::Args;
use serde::Deserialize;

use mushroom_backup::at_rest::Compression;
use mushroom_backup::bucket::write_once::LockMode;
use mushroom_backup::worker::limits::{self, Limit};
use mushroom_backup::worker::{DurabilityMode, RetentionPolicy, WorkerConfig};

#[derive(Args, Debug, Clone, Default)]
pub struct WorkerSettings {
    /// How often the durable WAL is shipped, in milliseconds [default: 1000].
    #[arg(long, env = "MUSHROOMDB_BACKUP_WAL_INTERVAL_MS")]
    pub wal_interval_ms: Option<u64>,
    /// How often a restore point is written while commits arrive, in ms [default: 60000].
    #[arg(long, env = "MUSHROOMDB_BACKUP_RESTORE_POINT_INTERVAL_MS")]
    pub restore_point_interval_ms: Option<u64>,
    /// How often retention runs, in milliseconds [default: 3600000].
    #[arg(long, env = "MUSHROOMDB_BACKUP_RETENTION_INTERVAL_MS")]
    pub retention_interval_ms: Option<u64>,
    /// Keep every restore point younger than this many milliseconds [default: 7 days].
    #[arg(long, env = "MUSHROOMDB_BACKUP_KEEP_FOR_MS")]
    pub keep_for_ms: Option<u64>,
    /// Keep every restore point of this many newest generations [default: 2].
    #[arg(long, env = "MUSHROOMDB_BACKUP_KEEP_GENERATIONS")]
    pub keep_generations: Option<u64>,
    /// Keep the newest restore point of each of this many newest UTC days [default: 0, off].
    /// Any tier set replaces --keep-generations (see docs/operators-guide.md, "Retention by tiers").
    #[arg(long, env = "MUSHROOMDB_BACKUP_KEEP_DAILY")]
    pub keep_daily: Option<u64>,
    /// Keep the newest restore point of each of this many newest ISO weeks [default: 0, off].
    #[arg(long, env = "MUSHROOMDB_BACKUP_KEEP_WEEKLY")]
    pub keep_weekly: Option<u64>,
    /// Keep the newest restore point of each of this many newest months [default: 0, off].
    #[arg(long, env = "MUSHROOMDB_BACKUP_KEEP_MONTHLY")]
    pub keep_monthly: Option<u64>,
    /// Leave objects of a claimed generation no manifest names alone this long, ms [default: 1 h].
    #[arg(long, env = "MUSHROOMDB_BACKUP_ORPHAN_GRACE_MS")]
    pub orphan_grace_ms: Option<u64>,
    /// `off` for object stores without conditional PUT: every write becomes plain [default: on].
    #[arg(long, env = "MUSHROOMDB_BACKUP_LEASE_CONDITIONAL", value_parser = ["on", "off"])]
    pub conditional: Option<String>,
    /// How store data is compressed before upload: `zstd` or `none` [default: zstd]. Objects
    /// whose sample does not compress are stored raw either way.
    #[arg(long, env = "MUSHROOMDB_BACKUP_COMPRESSION")]
    pub compression: Option<String>,
    /// The zstd level, 1 to 19 [default: 3].
    #[arg(
        long,
        env = "MUSHROOMDB_BACKUP_COMPRESSION_LEVEL",
        allow_negative_numbers = true
    )]
    pub compression_level: Option<i64>,
    /// Back up write-once: every object created once under S3 Object Lock in this mode,
    /// `governance` or `compliance`, retained as long as the retention policy keeps restore
    /// points, nothing rewritten or deleted but the lease (docs/immutable.md).
    /// Needs an s3:// destination in a bucket with Object Lock enabled [default: off].
    #[arg(long, env = "MUSHROOMDB_BACKUP_OBJECT_LOCK", value_parser = ["governance", "compliance"])]
    pub object_lock: Option<String>,
    /// `async` (ship every --wal-interval-ms) or `sync` (ship as soon as a node reports, and
    /// acknowledge each commit once it is in the bucket) [default: async].
    #[arg(long, env = "MUSHROOMDB_BACKUP_DURABILITY", value_parser = ["async", "sync"])]
    pub durability: Option<String>,
    /// The most WAL PUTs a second one store may cost, 1 to 1000 [default: 10].
    #[arg(long, env = "MUSHROOMDB_BACKUP_WAL_PUTS_PER_SECOND")]
    pub wal_puts_per_second: Option<u64>,
    /// Write into a prefix that holds generations of the other kind (plaintext beside
    /// encrypted ones, or encrypted beside plaintext); refused without it.
    #[arg(long)]
    pub allow_mixed_encryption: bool,
}

/// The `[worker]` table of the TOML file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerToml {
    pub wal_interval_ms: Option<u64>,
    pub restore_point_interval_ms: Option<u64>,
    pub retention_interval_ms: Option<u64>,
    pub keep_for_ms: Option<u64>,
    pub keep_generations: Option<u64>,
    pub keep_daily: Option<u64>,
    pub keep_weekly: Option<u64>,
    pub keep_monthly: Option<u64>,
    pub orphan_grace_ms: Option<u64>,
    pub conditional: Option<String>,
    pub lease_ttl_ms: Option<u64>,
    pub compression: Option<String>,
    pub compression_level: Option<u32>,
    pub object_lock: Option<String>,
    pub durability: Option<String>,
    pub wal_puts_per_second: Option<u64>,
}

impl WorkerSettings {
    /// Whether conditional writes are on.
    pub fn conditional_on(&self, file: &WorkerToml) -> anyhow::Result<bool> {
        match self
            .conditional
            .as_deref()
            .or(file.conditional.as_deref())
            .unwrap_or("on")
        {
            "on" => Ok(true),
            "off" => Ok(false),
            other => anyhow::bail!("conditional = {other:?}: must be \"on\" or \"off\""),
        }
    }

    /// The compression the flags (over the file) ask for; a level is checked against its
    /// range and refused with `none`.
    pub fn compression(&self, file: &WorkerToml) -> anyhow::Result<Compression> {
        let kind = self
            .compression
            .as_deref()
            .or(file.compression.as_deref())
            .unwrap_or("zstd");
        let level = self
            .compression_level
            .or(file.compression_level.map(i64::from));
        if kind == "none" && level.is_some() {
            anyhow::bail!("--compression-level applies to --compression zstd, not none");
        }
        Compression::parse(kind, level).map_err(anyhow::Error::msg)
    }

    /// The Object Lock mode the flag (over the file) asks for; refused with conditional
    /// writes off, which a write-once prefix cannot do without.
    pub fn object_lock(&self, file: &WorkerToml) -> anyhow::Result<Option<LockMode>> {
        let mode = match (self.object_lock.as_deref(), file.object_lock.as_deref()) {
            (Some(m), _) => {
                LockMode::parse(m).map_err(|e| anyhow::anyhow!("--object-lock: {e}"))?
            }
            (None, Some(m)) => {
                LockMode::parse(m).map_err(|e| anyhow::anyhow!("object_lock: {e}"))?
            }
            (None, None) => return Ok(None),
        };
        if !self.conditional_on(file)? {
            anyhow::bail!(
                "--object-lock {} needs conditional writes: a write-once prefix creates every \
                 object with If-None-Match (conditional = off given)",
                mode.name()
            );
        }
        Ok(Some(mode))
    }

    pub fn config(&self) -> anyhow::Result<WorkerConfig> {
        self.config_with(&WorkerToml::default())
    }

    pub fn config_with(&self, file: &WorkerToml) -> anyhow::Result<WorkerConfig> {
        let base = WorkerConfig::default();
        // Flag (or variable) over file over default; a value given is checked against its
        // range, named as it was given.
        let ms =
            |flag: &str, key: &str, given: (Option<u64>, Option<u64>), limit: Limit, default| {
                match given {
                    (Some(v), _) => limit.check_ms(flag, v).map_err(anyhow::Error::msg),
                    (None, Some(v)) => limit.check_ms(key, v).map_err(anyhow::Error::msg),
                    (None, None) => Ok(default),
                }
            };
        let keep_generations = match (self.keep_generations, file.keep_generations) {
            (Some(v), _) => limits::KEEP_GENERATIONS
                .check("--keep-generations", v)
                .map_err(anyhow::Error::msg)?,
            (None, Some(v)) => limits::KEEP_GENERATIONS
                .check("keep_generations", v)
                .map_err(anyhow::Error::msg)?,
            (None, None) => base.retention.keep_generations,
        };
        let tier = |flag: &str, key: &str, given: (Option<u64>, Option<u64>)| match given {
            (Some(v), _) => limits::KEEP_TIER.check(flag, v).map_err(anyhow::Error::msg),
            (None, Some(v)) => limits::KEEP_TIER.check(key, v).map_err(anyhow::Error::msg),
            (None, None) => Ok(0),
        };
        let tiers = mushroom_backup::worker::tiers::Tiers {
            keep_daily: tier(
                "--keep-daily",
                "keep_daily",
                (self.keep_daily, file.keep_daily),
            )?,
            keep_weekly: tier(
                "--keep-weekly",
                "keep_weekly",
                (self.keep_weekly, file.keep_weekly),
            )?,
            keep_monthly: tier(
                "--keep-monthly",
                "keep_monthly",
                (self.keep_monthly, file.keep_monthly),
            )?,
        };
        let durability = match self.durability.as_deref().or(file.durability.as_deref()) {
            Some(d) => DurabilityMode::parse(d).map_err(anyhow::Error::msg)?,
            None => base.durability,
        };
        let wal_puts_per_second = match (self.wal_puts_per_second, file.wal_puts_per_second) {
            (Some(v), _) => limits::WAL_PUTS_PER_SECOND.check("--wal-puts-per-second", v),
            (None, Some(v)) => limits::WAL_PUTS_PER_SECOND.check("wal_puts_per_second", v),
            (None, None) => Ok(u64::from(base.wal_puts_per_second)),
        }
        .map_err(anyhow::Error::msg)?;
        Ok(WorkerConfig {
            durability,
            wal_puts_per_second: u32::try_from(wal_puts_per_second)?,
            wal_interval: ms(
                "--wal-interval-ms",
                "wal_interval_ms",
                (self.wal_interval_ms, file.wal_interval_ms),
                limits::INTERVAL_MS,
                base.wal_interval,
            )?,
            restore_point_interval: ms(
                "--restore-point-interval-ms",
                "restore_point_interval_ms",
                (
                    self.restore_point_interval_ms,
                    file.restore_point_interval_ms,
                ),
                limits::INTERVAL_MS,
                base.restore_point_interval,
            )?,
            retention_interval: ms(
                "--retention-interval-ms",
                "retention_interval_ms",
                (self.retention_interval_ms, file.retention_interval_ms),
                limits::INTERVAL_MS,
                base.retention_interval,
            )?,
            retention: RetentionPolicy {
                keep_for: ms(
                    "--keep-for-ms",
                    "keep_for_ms",
                    (self.keep_for_ms, file.keep_for_ms),
                    limits::KEEP_FOR_MS,
                    base.retention.keep_for,
                )?,
                keep_generations,
                orphan_grace: ms(
                    "--orphan-grace-ms",
                    "orphan_grace_ms",
                    (self.orphan_grace_ms, file.orphan_grace_ms),
                    limits::ORPHAN_GRACE_MS,
                    base.retention.orphan_grace,
                )?,
                tiers,
            },
            conditional_writes: self.conditional_on(file)?,
            compression: self.compression(file)?,
            object_lock: self.object_lock(file)?,
            encryption: mushroom_backup::crypto::WriterEncryption {
                keys: None,
                allow_mixed: self.allow_mixed_encryption,
            },
            ..base
        })
    }
}
