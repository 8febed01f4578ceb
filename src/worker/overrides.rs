//! One record for what a store may set over its service's worker configuration: the
//! `[worker]` table of the TOML file, the flags of `backup`, `serve` and `standby`, the
//! registry row of a registered store and the options of a `Register` request are all this
//! [`WorkerOverrides`] (the TOML table and the flags with a few service-wide settings beside
//! it; the request through its proto mapping at the edge, `crate::service::edge::options`).
//!
//! Each field is `None` for "the default below me": flags over the file, the file over the
//! built-in default, a store's options over the service's. [`WorkerOverrides::check`] checks
//! every set field against its range and names it as it was given ([`Source`]: a flag, a TOML
//! key or a request field); [`WorkerOverrides::apply`] lays the set fields over a
//! [`WorkerConfig`] and is only called on a checked record (or a registry row brought into
//! range, `crate::service::fleet::options::row`).
//!
//! Adding an option: a field here (its flag, variable and serde attributes on it), a line in
//! `check` and one in `apply`, then its proto field and its two lines of proto mapping.
//!
//! The serialized form is the registry's JSON: the enums are their lowercase words
//! (`"zstd"`, `"governance"`, `"sync"`), unset fields are left out, and unknown keys are
//! ignored, so a row written by either of two versions reads in the other.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::config::{DurabilityMode, WorkerConfig};
use super::limits::{self, Limit};
use crate::at_rest::{Compression, LEVELS};
use crate::bucket::write_once::LockMode;

/// How store data is compressed before upload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CompressionKind {
    Zstd,
    None,
}

impl std::str::FromStr for CompressionKind {
    type Err = String;

    /// `zstd` or `none`; anything else is refused naming what to use.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "zstd" => Ok(CompressionKind::Zstd),
            "none" => Ok(CompressionKind::None),
            other => Err(format!("{other:?} is not a codec: use zstd or none")),
        }
    }
}

/// Where a value was given, for the name an error gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A flag (or its variable): `--wal-interval-ms`.
    Flag,
    /// A key of the TOML file's `[worker]` table: `wal_interval_ms`.
    Toml,
    /// A field of a request's options: `options.wal_interval_ms` (0 there is "the
    /// service's default", so never a value here).
    Request,
}

impl Source {
    /// The name of `key` as this source spells it.
    pub fn name(self, key: &str) -> String {
        match self {
            Source::Flag => format!("--{}", key.replace('_', "-")),
            Source::Toml => key.to_string(),
            Source::Request => format!("options.{key}"),
        }
    }
}

/// What a store (or the file, or the flags) sets over the default; `None`: the default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, clap::Args)]
pub struct WorkerOverrides {
    /// How often the durable WAL is shipped, in milliseconds [default: 1000].
    #[arg(long, env = "MUSHROOMDB_BACKUP_WAL_INTERVAL_MS")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_interval_ms: Option<u64>,
    /// How often a restore point is written while commits arrive, in ms [default: 60000].
    #[arg(long, env = "MUSHROOMDB_BACKUP_RESTORE_POINT_INTERVAL_MS")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_point_interval_ms: Option<u64>,
    /// How often retention runs, in milliseconds [default: 3600000].
    #[arg(long, env = "MUSHROOMDB_BACKUP_RETENTION_INTERVAL_MS")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_interval_ms: Option<u64>,
    /// Keep every restore point younger than this many milliseconds [default: 7 days].
    #[arg(long, env = "MUSHROOMDB_BACKUP_KEEP_FOR_MS")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_for_ms: Option<u64>,
    /// Keep every restore point of this many newest generations [default: 2].
    #[arg(long, env = "MUSHROOMDB_BACKUP_KEEP_GENERATIONS")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_generations: Option<u64>,
    /// Keep the newest restore point of each of this many newest UTC days [default: 0, off].
    /// Any tier set replaces --keep-generations (see docs/operators-guide.md, "Retention by tiers").
    #[arg(long, env = "MUSHROOMDB_BACKUP_KEEP_DAILY")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_daily: Option<u64>,
    /// Keep the newest restore point of each of this many newest ISO weeks [default: 0, off].
    #[arg(long, env = "MUSHROOMDB_BACKUP_KEEP_WEEKLY")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_weekly: Option<u64>,
    /// Keep the newest restore point of each of this many newest months [default: 0, off].
    #[arg(long, env = "MUSHROOMDB_BACKUP_KEEP_MONTHLY")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_monthly: Option<u64>,
    /// How store data is compressed before upload: `zstd` or `none` [default: zstd]. Objects
    /// whose sample does not compress are stored raw either way.
    #[arg(long, env = "MUSHROOMDB_BACKUP_COMPRESSION", value_parser = str::parse::<CompressionKind>)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<CompressionKind>,
    /// The zstd level, 1 to 19 [default: 3].
    #[arg(
        long,
        env = "MUSHROOMDB_BACKUP_COMPRESSION_LEVEL",
        allow_negative_numbers = true
    )]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression_level: Option<i64>,
    /// Back up write-once: every object created once under S3 Object Lock in this mode,
    /// `governance` or `compliance`, retained as long as the retention policy keeps restore
    /// points, nothing rewritten or deleted but the lease (docs/immutable.md).
    /// Needs an s3:// destination in a bucket with Object Lock enabled [default: off].
    #[arg(long, env = "MUSHROOMDB_BACKUP_OBJECT_LOCK", value_enum)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_lock: Option<LockMode>,
    /// `async` (ship every --wal-interval-ms) or `sync` (ship as soon as a node reports, and
    /// acknowledge each commit once it is in the bucket) [default: async].
    #[arg(long, env = "MUSHROOMDB_BACKUP_DURABILITY", value_enum)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durability: Option<DurabilityMode>,
    /// The most WAL PUTs a second one store may cost, 1 to 1000 [default: 10].
    #[arg(long, env = "MUSHROOMDB_BACKUP_WAL_PUTS_PER_SECOND")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_puts_per_second: Option<u64>,
    /// Leave objects of a claimed generation no manifest names alone this long, ms [default: 1 h].
    #[arg(long, env = "MUSHROOMDB_BACKUP_ORPHAN_GRACE_MS")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orphan_grace_ms: Option<u64>,
}

/// A field out of its range, or two that contradict each other: the message names them as
/// they were given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct OverrideError(pub String);

/// The ranged fields, each with its key and its bounds: the one list `check` and `clamped`
/// both read (a new ranged option is one line here).
fn ranges(o: &mut WorkerOverrides) -> [(&'static str, &mut Option<u64>, Limit); 10] {
    [
        (
            "wal_interval_ms",
            &mut o.wal_interval_ms,
            limits::INTERVAL_MS,
        ),
        (
            "restore_point_interval_ms",
            &mut o.restore_point_interval_ms,
            limits::INTERVAL_MS,
        ),
        (
            "retention_interval_ms",
            &mut o.retention_interval_ms,
            limits::INTERVAL_MS,
        ),
        ("keep_for_ms", &mut o.keep_for_ms, limits::KEEP_FOR_MS),
        (
            "keep_generations",
            &mut o.keep_generations,
            limits::KEEP_GENERATIONS,
        ),
        ("keep_daily", &mut o.keep_daily, limits::KEEP_TIER),
        ("keep_weekly", &mut o.keep_weekly, limits::KEEP_TIER),
        ("keep_monthly", &mut o.keep_monthly, limits::KEEP_TIER),
        (
            "wal_puts_per_second",
            &mut o.wal_puts_per_second,
            limits::WAL_PUTS_PER_SECOND,
        ),
        (
            "orphan_grace_ms",
            &mut o.orphan_grace_ms,
            limits::ORPHAN_GRACE_MS,
        ),
    ]
}

/// A request's bound for `limit`, as its error shows it: a request's 0 is "the default", so
/// its smallest value is 1 whatever the flag's.
fn request_shown(key: &str, limit: Limit) -> String {
    match key {
        "keep_for_ms" => format!("{} (100 years)", limit.max),
        k if k.ends_with("_interval_ms") => format!("{} (1 day)", limit.max),
        _ => limit.max.to_string(),
    }
}

impl WorkerOverrides {
    /// Every set field in its range, and compression's two fields agreeing; the error names
    /// the field as `source` spells it.
    pub fn check(&self, source: Source) -> Result<(), OverrideError> {
        let mut read = self.clone();
        for (key, value, limit) in ranges(&mut read) {
            let Some(v) = *value else { continue };
            match source {
                Source::Request if key == "wal_puts_per_second" => {
                    limit.check(&source.name(key), v).map_err(|e| {
                        OverrideError(format!("{e}, or 0 for the service's default"))
                    })?;
                }
                Source::Request if !(1..=limit.max).contains(&v) => {
                    return Err(OverrideError(format!(
                        "{} must be 1 to {}, or 0 for the service's default ({v} given)",
                        source.name(key),
                        request_shown(key, limit)
                    )));
                }
                Source::Request => {}
                _ => {
                    limit.check(&source.name(key), v).map_err(OverrideError)?;
                }
            }
        }
        self.compression_for(source).map(|_| ())
    }

    /// The compression these fields ask for, if they ask for one (a level alone means zstd);
    /// an error names the fields as `source` spells them.
    pub fn compression_for(&self, source: Source) -> Result<Option<Compression>, OverrideError> {
        let (kind_field, level_field) = match source {
            // The file's keys were always named as the flags in these two messages.
            Source::Toml | Source::Flag => ("--compression", "--compression-level"),
            Source::Request => ("compression", "options.compression_level"),
        };
        match (self.compression, self.compression_level) {
            (None, None) => Ok(None),
            (Some(CompressionKind::None), Some(_)) => Err(OverrideError(format!(
                "{level_field} applies to {kind_field} zstd, not none"
            ))),
            (Some(CompressionKind::None), None) => Ok(Some(Compression::None)),
            (_, level) => {
                let level = level.unwrap_or(i64::from(crate::at_rest::DEFAULT_LEVEL));
                match i32::try_from(level) {
                    Ok(l) if LEVELS.contains(&l) => Ok(Some(Compression::Zstd { level: l })),
                    _ => Err(OverrideError(format!(
                        "{level_field} {level} is out of range: zstd levels are {} to {}",
                        LEVELS.start(),
                        LEVELS.end()
                    ))),
                }
            }
        }
    }

    /// `self`'s fields where set, `lower`'s elsewhere (flags over the file, say).
    pub fn or(&self, lower: &WorkerOverrides) -> WorkerOverrides {
        WorkerOverrides {
            wal_interval_ms: self.wal_interval_ms.or(lower.wal_interval_ms),
            restore_point_interval_ms: self
                .restore_point_interval_ms
                .or(lower.restore_point_interval_ms),
            retention_interval_ms: self.retention_interval_ms.or(lower.retention_interval_ms),
            keep_for_ms: self.keep_for_ms.or(lower.keep_for_ms),
            keep_generations: self.keep_generations.or(lower.keep_generations),
            keep_daily: self.keep_daily.or(lower.keep_daily),
            keep_weekly: self.keep_weekly.or(lower.keep_weekly),
            keep_monthly: self.keep_monthly.or(lower.keep_monthly),
            compression: self.compression.or(lower.compression),
            compression_level: self.compression_level.or(lower.compression_level),
            object_lock: self.object_lock.or(lower.object_lock),
            durability: self.durability.or(lower.durability),
            wal_puts_per_second: self.wal_puts_per_second.or(lower.wal_puts_per_second),
            orphan_grace_ms: self.orphan_grace_ms.or(lower.orphan_grace_ms),
        }
    }

    /// `base` with every set field laid over it (a field out of range is taken as given:
    /// check first).
    pub fn apply(&self, base: &WorkerConfig) -> WorkerConfig {
        let mut c = base.clone();
        let ms = Duration::from_millis;
        if let Some(v) = self.wal_interval_ms {
            c.wal_interval = ms(v);
        }
        if let Some(v) = self.restore_point_interval_ms {
            c.restore_point_interval = ms(v);
        }
        if let Some(v) = self.retention_interval_ms {
            c.retention_interval = ms(v);
        }
        if let Some(v) = self.keep_for_ms {
            c.retention.keep_for = ms(v);
        }
        if let Some(v) = self.keep_generations {
            c.retention.keep_generations = v;
        }
        if let Some(v) = self.keep_daily {
            c.retention.tiers.keep_daily = v;
        }
        if let Some(v) = self.keep_weekly {
            c.retention.tiers.keep_weekly = v;
        }
        if let Some(v) = self.keep_monthly {
            c.retention.tiers.keep_monthly = v;
        }
        if let Ok(Some(compression)) = self.compression_for(Source::Toml) {
            c.compression = compression;
        }
        if let Some(mode) = self.object_lock {
            c.object_lock = Some(mode);
        }
        if let Some(mode) = self.durability {
            c.durability = mode;
        }
        if let Some(v) = self.wal_puts_per_second {
            c.wal_puts_per_second = u32::try_from(v).unwrap_or(u32::MAX);
        }
        if let Some(v) = self.orphan_grace_ms {
            c.retention.orphan_grace = ms(v);
        }
        c
    }

    /// Every ranged field brought into its range (a registry row written before the bounds,
    /// or edited by hand); compression that cannot be used falls back to the default.
    /// Clamping only ever keeps more or works less often, never deletes sooner.
    pub fn clamped(&self) -> WorkerOverrides {
        let mut o = self.clone();
        for (_, field, limit) in ranges(&mut o) {
            *field = field.map(|v| v.clamp(limit.min.max(1), limit.max));
        }
        if self.compression_for(Source::Request).is_err() {
            (o.compression, o.compression_level) = (None, None);
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_form_is_the_lowercase_words_and_leaves_unset_fields_out() {
        let o = WorkerOverrides {
            compression: Some(CompressionKind::Zstd),
            object_lock: Some(LockMode::Governance),
            durability: Some(DurabilityMode::Sync),
            keep_for_ms: Some(5),
            ..WorkerOverrides::default()
        };
        let json = serde_json::to_value(&o).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"keep_for_ms": 5, "compression": "zstd",
                "object_lock": "governance", "durability": "sync"})
        );
        let back: WorkerOverrides =
            serde_json::from_value(serde_json::json!({"durability": "sync", "newer": 1})).unwrap();
        assert_eq!(back.durability, Some(DurabilityMode::Sync));
    }

    #[test]
    fn an_error_names_the_field_as_its_source_spells_it() {
        let o = WorkerOverrides {
            wal_interval_ms: Some(0),
            ..WorkerOverrides::default()
        };
        assert!(
            o.check(Source::Flag)
                .unwrap_err()
                .0
                .contains("--wal-interval-ms")
        );
        assert!(
            o.check(Source::Toml)
                .unwrap_err()
                .0
                .starts_with("wal_interval_ms")
        );
        let e = o.check(Source::Request).unwrap_err().0;
        assert!(e.contains("options.wal_interval_ms must be 1 to"), "{e}");
        let level = WorkerOverrides {
            compression: Some(CompressionKind::None),
            compression_level: Some(3),
            ..WorkerOverrides::default()
        };
        assert_eq!(
            level.check(Source::Request).unwrap_err().0,
            "options.compression_level applies to compression zstd, not none"
        );
    }

    #[test]
    fn flags_win_over_the_file_field_by_field() {
        let flags = WorkerOverrides {
            keep_daily: Some(3),
            ..WorkerOverrides::default()
        };
        let file = WorkerOverrides {
            keep_daily: Some(9),
            keep_weekly: Some(2),
            ..WorkerOverrides::default()
        };
        let o = flags.or(&file);
        assert_eq!((o.keep_daily, o.keep_weekly), (Some(3), Some(2)));
    }
}
