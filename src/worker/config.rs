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
        }
    }
}
