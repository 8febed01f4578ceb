//! `serve`'s limits on what one client may hold (`mushroom_backup::service::Limits`): flags,
//! each also a `MUSHROOMDB_BACKUP_*` variable, and the `[limits]` table of the TOML file. A
//! flag or variable wins over the file, the file over the default.

use std::time::Duration;

use clap::Args;
use serde::Deserialize;

use mushroom_backup::bucket::throttle::{LimitSet, Schedule, ThrottleSettings, Window};
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
    /// A traffic class's limit at the instance scope, CLASS=BYTES_PER_SECOND[,requests=N]
    /// (classes bulk, restore, check, housekeeping; `unlimited` lifts one; the wal is never
    /// limited); repeatable; over the file's [limits] [default: check=50000000].
    #[arg(long = "limit", value_name = "CLASS=BYTES_PER_SECOND[,requests=N]")]
    limit: Vec<String>,
}

/// The classes' limits of one scope as the TOML writes them: a key per class, each
/// `BYTES_PER_SECOND[,requests=N]` (`bulk = "20000000,requests=100"`). (Fields of each table
/// rather than a flattened struct: serde refuses unknown keys only without `flatten`.)
macro_rules! class_items {
    ($t:expr) => {
        [
            ("bulk", &$t.bulk),
            ("restore", &$t.restore),
            ("check", &$t.check),
            ("housekeeping", &$t.housekeeping),
        ]
        .into_iter()
        .filter_map(|(c, v): (&str, &Option<String>)| v.as_ref().map(|v| format!("{c}={v}")))
        .collect::<Vec<String>>()
    };
}

/// One `[[limits.schedule]]` window: its days (`mon-fri`; all when left out), `from` and `to`
/// (`HH:MM`, UTC) and the limits it sets.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WindowToml {
    days: Option<String>,
    from: String,
    to: String,
    bulk: Option<String>,
    restore: Option<String>,
    check: Option<String>,
    housekeeping: Option<String>,
}

/// One `[[limits.endpoint]]`: the limits of every store's requests to one endpoint together.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointToml {
    endpoint: String,
    bulk: Option<String>,
    restore: Option<String>,
    check: Option<String>,
    housekeeping: Option<String>,
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
    bulk: Option<String>,
    restore: Option<String>,
    check: Option<String>,
    housekeeping: Option<String>,
    schedule: Option<Vec<WindowToml>>,
    endpoint: Option<Vec<EndpointToml>>,
}

impl LimitSettings {
    /// The throttle's settings: the file's classes with each `--limit` over them, its schedule
    /// and its endpoints, every value checked (an error names it).
    pub fn throttle_with(&self, file: &LimitsToml) -> Result<ThrottleSettings, String> {
        let from_file = LimitSet::parse_all(&class_items!(file))?;
        let flags = LimitSet::parse_all(&self.limit).map_err(|e| format!("--limit: {e}"))?;
        let mut windows = Vec::new();
        for w in file.schedule.iter().flatten() {
            let days = w.days.as_deref().unwrap_or("all");
            windows.push(
                Window::parse(days, &w.from, &w.to, &class_items!(w))
                    .map_err(|e| format!("[[limits.schedule]]: {e}"))?,
            );
        }
        let mut endpoints = std::collections::BTreeMap::new();
        for e in file.endpoint.iter().flatten() {
            let name = match e.endpoint.as_str() {
                "s3" | "file" => e.endpoint.clone(),
                other => mushroom_backup::bucket::url::normal_endpoint(other)
                    .map_err(|why| format!("[[limits.endpoint]] {other:?}: {why}"))?,
            };
            let limits = LimitSet::parse_all(&class_items!(e))
                .map_err(|why| format!("[[limits.endpoint]] {name}: {why}"))?;
            if endpoints
                .insert(name.clone(), LimitSet::none().with(&limits))
                .is_some()
            {
                return Err(format!("[[limits.endpoint]] {name} is given twice"));
            }
        }
        Ok(ThrottleSettings {
            instance: LimitSet::instance_default().with(&from_file).with(&flags),
            schedule: Schedule { windows },
            endpoints,
        })
    }

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
