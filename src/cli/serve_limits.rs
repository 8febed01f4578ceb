//! `serve`'s limits on what one client may hold (`mushroom_backup::service::Limits`): flags,
//! each also a `MUSHROOMDB_BACKUP_*` variable, and the `[limits]` table of the TOML file. A
//! flag or variable wins over the file, the file over the default.

use std::time::Duration;

use clap::Args;
use serde::Deserialize;

use mushroom_backup::service::Limits;

#[derive(Args, Debug, Clone, Default)]
pub struct LimitSettings {
    /// A ReportPosition stream's first report (and token check) is due within this, ms
    /// [default: 5000].
    #[arg(long, env = "MUSHROOMDB_BACKUP_FIRST_REPORT_TIMEOUT_MS")]
    first_report_timeout_ms: Option<u64>,
    /// Every call but Adopt ends within this, ms [default: 60000].
    #[arg(long, env = "MUSHROOMDB_BACKUP_CALL_TIMEOUT_MS")]
    call_timeout_ms: Option<u64>,
    /// Adopt (a whole restore) ends within this, ms [default: 6 hours].
    #[arg(long, env = "MUSHROOMDB_BACKUP_ADOPT_TIMEOUT_MS")]
    adopt_timeout_ms: Option<u64>,
    /// Streams one connection may have open at once [default: 256].
    #[arg(long, env = "MUSHROOMDB_BACKUP_MAX_CONCURRENT_STREAMS")]
    max_concurrent_streams: Option<u32>,
    /// Calls one connection may have in their handlers at once; more wait [default: 64].
    #[arg(long, env = "MUSHROOMDB_BACKUP_CONCURRENCY_PER_CONNECTION")]
    concurrency_per_connection: Option<usize>,
    /// How often the server pings each connection, ms [default: 30000].
    #[arg(long, env = "MUSHROOMDB_BACKUP_KEEPALIVE_INTERVAL_MS")]
    keepalive_interval_ms: Option<u64>,
    /// A ping not answered within this drops the connection, ms [default: 20000].
    #[arg(long, env = "MUSHROOMDB_BACKUP_KEEPALIVE_TIMEOUT_MS")]
    keepalive_timeout_ms: Option<u64>,
    /// WatchHealth streams open at once on the server; more are RESOURCE_EXHAUSTED [default: 64].
    #[arg(long, env = "MUSHROOMDB_BACKUP_MAX_HEALTH_WATCHERS")]
    max_health_watchers: Option<usize>,
    /// ReportPosition streams attached to one store at once; more are RESOURCE_EXHAUSTED
    /// [default: 16].
    #[arg(long, env = "MUSHROOMDB_BACKUP_MAX_STREAMS_PER_STORE")]
    max_streams_per_store: Option<usize>,
}

/// The `[limits]` table of the TOML file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsToml {
    first_report_timeout_ms: Option<u64>,
    call_timeout_ms: Option<u64>,
    adopt_timeout_ms: Option<u64>,
    max_concurrent_streams: Option<u32>,
    concurrency_per_connection: Option<usize>,
    keepalive_interval_ms: Option<u64>,
    keepalive_timeout_ms: Option<u64>,
    max_health_watchers: Option<usize>,
    max_streams_per_store: Option<usize>,
}

impl LimitSettings {
    /// The limits, from the flags, then the file, then the defaults (checked by the service).
    pub fn limits_with(&self, file: &LimitsToml) -> Limits {
        let d = Limits::default();
        let ms = |flag: Option<u64>, key: Option<u64>, default: Duration| {
            flag.or(key).map_or(default, Duration::from_millis)
        };
        Limits {
            first_report_timeout: ms(
                self.first_report_timeout_ms,
                file.first_report_timeout_ms,
                d.first_report_timeout,
            ),
            call_timeout: ms(self.call_timeout_ms, file.call_timeout_ms, d.call_timeout),
            adopt_timeout: ms(
                self.adopt_timeout_ms,
                file.adopt_timeout_ms,
                d.adopt_timeout,
            ),
            max_concurrent_streams: self
                .max_concurrent_streams
                .or(file.max_concurrent_streams)
                .unwrap_or(d.max_concurrent_streams),
            concurrency_per_connection: self
                .concurrency_per_connection
                .or(file.concurrency_per_connection)
                .unwrap_or(d.concurrency_per_connection),
            keepalive_interval: ms(
                self.keepalive_interval_ms,
                file.keepalive_interval_ms,
                d.keepalive_interval,
            ),
            keepalive_timeout: ms(
                self.keepalive_timeout_ms,
                file.keepalive_timeout_ms,
                d.keepalive_timeout,
            ),
            max_health_watchers: self
                .max_health_watchers
                .or(file.max_health_watchers)
                .unwrap_or(d.max_health_watchers),
            max_streams_per_store: self
                .max_streams_per_store
                .or(file.max_streams_per_store)
                .unwrap_or(d.max_streams_per_store),
        }
    }
}
