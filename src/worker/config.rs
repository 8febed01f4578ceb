//! How the worker paces itself ([`WorkerConfig`]) and the fixed numbers behind its defaults.
//! Plain data: nothing here does I/O or keeps state.

use std::time::Duration;

use super::RetentionPolicy;

/// First retry delay after a failure; doubles per failure up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(200);
/// Longest retry delay.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Consecutive failed steps after which the worker reports itself unhealthy.
pub const UNHEALTHY_AFTER_FAILURES: u32 = 5;
/// The shortest lag that makes the worker unhealthy: durable data unshipped for longer than
/// `max(MIN_UNHEALTHY_LAG, 10 × wal_interval)`.
pub const MIN_UNHEALTHY_LAG: Duration = Duration::from_secs(30);
/// The largest segment one step ships; a longer unshipped stretch goes up in several. A
/// restore refuses a segment claiming more (`at_rest::bounds`, where the number lives).
pub const MAX_SEGMENT_BYTES: u64 = crate::at_rest::bounds::SEGMENT_MAX;

/// How the worker paces itself.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// How often a follower ships the durable WAL.
    pub wal_interval: Duration,
    /// How often a restore point is written while commits arrive.
    pub restore_point_interval: Duration,
    /// How often retention runs.
    pub retention_interval: Duration,
    pub retention: RetentionPolicy,
    /// Conditional writes (`If-None-Match`, `If-Match`); off only for object stores without them.
    pub conditional_writes: bool,
    /// Durable data unshipped for longer than `max(this, 10 × wal_interval)` is unhealthy.
    pub min_unhealthy_lag: Duration,
    /// Retry delays after a failed step: the first, doubling up to the longest.
    pub first_backoff: Duration,
    pub max_backoff: Duration,
    /// How long the last flush at shutdown may take.
    pub flush_timeout: Duration,
    /// How often a refused prefix is checked again (without holding the lease meanwhile).
    pub refused_retry: Duration,
    /// At shutdown, how long an in-flight step may take to finish before it is abandoned.
    pub shutdown_grace: Duration,
    /// How store data is compressed before it goes up (`src/at_rest/`).
    pub compression: crate::at_rest::Compression,
    /// What each generation is encrypted with (none: plaintext); see `worker/keys.rs`.
    pub encryption: crate::crypto::WriterEncryption,
    /// Back the prefix up write-once, every object under this Object Lock mode, retained for
    /// [`super::retention::lock_period`] (`src/latest.rs`); `None`: the mutable layout.
    pub object_lock: Option<crate::bucket::write_once::LockMode>,
    /// When the durable WAL is shipped: every `wal_interval` (async), or as soon as a node's
    /// report or a write says there is something to ship (sync; see `ack/mod.rs`).
    pub durability: DurabilityMode,
    /// The most WAL PUTs a second ([`super::limits::WAL_PUTS_PER_SECOND`]): under heavy load
    /// the window a segment covers widens rather than requests queueing.
    pub wal_puts_per_second: u32,
}

impl WorkerConfig {
    /// How a write-once prefix's objects are locked: the mode, retained for
    /// [`super::retention::lock_period`]; `None` for the mutable layout.
    pub fn lock(&self) -> Option<crate::bucket::write_once::ObjectLock> {
        self.object_lock
            .map(|mode| crate::bucket::write_once::ObjectLock {
                mode,
                period: super::retention::lock_period(&self.retention),
            })
    }
}

/// The default [`WorkerConfig::wal_puts_per_second`].
pub const DEFAULT_WAL_PUTS_PER_SECOND: u32 = 10;

/// A store's `durability` option: `async` or `sync` as the flag, the TOML key and the
/// registry row write it.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum DurabilityMode {
    /// Ship every `wal_interval` (the default): costs what it always did.
    #[default]
    Async,
    /// Ship at once when a report (or a write) shows something to ship, one WAL PUT in
    /// flight, at most `wal_puts_per_second`.
    Sync,
}

impl DurabilityMode {
    /// `async` or `sync`; anything else is refused naming what was given.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "async" => Ok(Self::Async),
            "sync" => Ok(Self::Sync),
            other => Err(format!(
                "durability {other:?} is not one of \"async\", \"sync\""
            )),
        }
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Async => "async",
            Self::Sync => "sync",
        }
    }
}

impl WorkerConfig {
    /// The least time between the starts of two ticks that may ship a WAL segment.
    pub fn wal_put_gap(&self) -> Duration {
        Duration::from_secs(1) / self.wal_puts_per_second.max(1)
    }
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            wal_interval: Duration::from_secs(1),
            restore_point_interval: Duration::from_secs(60),
            retention_interval: Duration::from_secs(3600),
            retention: RetentionPolicy::default(),
            conditional_writes: true,
            min_unhealthy_lag: MIN_UNHEALTHY_LAG,
            first_backoff: FIRST_BACKOFF,
            max_backoff: MAX_BACKOFF,
            flush_timeout: Duration::from_secs(20),
            refused_retry: MAX_BACKOFF,
            shutdown_grace: Duration::from_secs(5),
            compression: crate::at_rest::Compression::default(),
            encryption: Default::default(),
            object_lock: None,
            durability: DurabilityMode::Async,
            wal_puts_per_second: DEFAULT_WAL_PUTS_PER_SECOND,
        }
    }
}
