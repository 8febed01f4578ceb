//! Backup settings shared by the commands: flags, each also a `MUSHROOMDB_BACKUP_*` variable,
//! and (for `serve`) the `[worker]` table of the TOML file. A flag or variable wins over the
//! file, the file over the default.

use clap::Args;
use serde::Deserialize;

use mushroom_backup::worker::WorkerConfig;
use mushroom_backup::worker::overrides::{Source, WorkerOverrides};

#[derive(Args, Debug, Clone, Default)]
pub struct WorkerSettings {
    /// What a store may also set in its registry row (one record: `worker::overrides`).
    #[command(flatten)]
    pub overrides: WorkerOverrides,
    /// `off` for object stores without conditional PUT: every write becomes plain [default: on].
    #[arg(long, env = "MUSHROOMDB_BACKUP_LEASE_CONDITIONAL", value_parser = ["on", "off"])]
    pub conditional: Option<String>,
    /// Write into a prefix that holds generations of the other kind (plaintext beside
    /// encrypted ones, or encrypted beside plaintext); refused without it.
    #[arg(long)]
    pub allow_mixed_encryption: bool,
}

/// The `[worker]` table of the TOML file: the same record as the flags, plus the lease's TTL.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerToml {
    #[serde(flatten)]
    pub overrides: WorkerOverrides,
    pub conditional: Option<String>,
    pub lease_ttl_ms: Option<u64>,
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

    /// The flags' overrides over the file's, each checked and named as it was given.
    fn overrides(&self, file: &WorkerToml) -> anyhow::Result<WorkerOverrides> {
        self.overrides
            .check(Source::Flag)
            .map_err(anyhow::Error::msg)?;
        file.overrides
            .check(Source::Toml)
            .map_err(anyhow::Error::msg)?;
        let merged = self.overrides.or(&file.overrides);
        // A level from one and `none` from the other contradict each other too.
        merged
            .compression_for(Source::Flag)
            .map_err(anyhow::Error::msg)?;
        if let Some(mode) = merged.object_lock
            && !self.conditional_on(file)?
        {
            anyhow::bail!(
                "--object-lock {} needs conditional writes: a write-once prefix creates every \
                 object with If-None-Match (conditional = off given)",
                mode.name()
            );
        }
        Ok(merged)
    }

    pub fn config(&self) -> anyhow::Result<WorkerConfig> {
        self.config_with(&WorkerToml::default())
    }

    pub fn config_with(&self, file: &WorkerToml) -> anyhow::Result<WorkerConfig> {
        let base = WorkerConfig::default();
        let mut config = self.overrides(file)?.apply(&base);
        config.conditional_writes = self.conditional_on(file)?;
        config.encryption = mushroom_backup::crypto::WriterEncryption {
            keys: None,
            allow_mixed: self.allow_mixed_encryption,
        };
        Ok(config)
    }
}
