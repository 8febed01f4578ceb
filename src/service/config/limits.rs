//! The bounds the server is started with (plain settings, checked at start): what one client
//! may hold ([`Limits`], applied by `edge::server_limits`), a pause's deadlines
//! ([`PauseLimits`], `ops::pause`), the scheduled drills' byte budget ([`DrillLimits`],
//! `ops::drill`) and the event log's retention ([`EventRetention`], `fleet::event_log`).

use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// A `ReportPosition` stream's first report is due within this.
    pub first_report_timeout: Duration,
    /// Every call but `Adopt` ends within this.
    pub call_timeout: Duration,
    /// `Adopt` (a whole restore) ends within this.
    pub adopt_timeout: Duration,
    /// Streams one connection may have open at once.
    pub max_concurrent_streams: u32,
    /// Calls one connection may have in their handlers at once; more wait.
    pub concurrency_per_connection: usize,
    /// How often the server pings a connection.
    pub keepalive_interval: Duration,
    /// A ping not answered within this drops the connection.
    pub keepalive_timeout: Duration,
    /// `WatchHealth` streams open at once on the server.
    pub max_health_watchers: usize,
    /// `ReportPosition` streams attached to one store at once; one more is refused
    /// `RESOURCE_EXHAUSTED`, so lying streams cannot pile up on a store
    /// (`wal_source::streamed`).
    pub max_streams_per_store: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            first_report_timeout: Duration::from_secs(5),
            call_timeout: Duration::from_secs(60),
            adopt_timeout: Duration::from_secs(6 * 3600),
            max_concurrent_streams: 256,
            concurrency_per_connection: 64,
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(20),
            max_health_watchers: 64,
            max_streams_per_store: crate::wal_source::DEFAULT_MAX_STREAMS,
        }
    }
}

impl Limits {
    /// Every limit must be positive: a zero would refuse everything, or mean "none".
    pub fn check(&self) -> Result<(), String> {
        let durations = [
            ("first_report_timeout_ms", self.first_report_timeout),
            ("call_timeout_ms", self.call_timeout),
            ("adopt_timeout_ms", self.adopt_timeout),
            ("keepalive_interval_ms", self.keepalive_interval),
            ("keepalive_timeout_ms", self.keepalive_timeout),
        ];
        for (name, d) in durations {
            if d.is_zero() {
                return Err(format!("limits: {name} must be at least 1 ms"));
            }
        }
        let counts = [
            (
                "max_concurrent_streams",
                u64::from(self.max_concurrent_streams),
            ),
            (
                "concurrency_per_connection",
                u64::try_from(self.concurrency_per_connection).unwrap_or(u64::MAX),
            ),
            (
                "max_health_watchers",
                u64::try_from(self.max_health_watchers).unwrap_or(u64::MAX),
            ),
            (
                "max_streams_per_store",
                u64::try_from(self.max_streams_per_store).unwrap_or(u64::MAX),
            ),
        ];
        for (name, n) in counts {
            if n == 0 {
                return Err(format!("limits: {name} must be at least 1"));
            }
        }
        Ok(())
    }
}

/// A pause's default and longest deadline, from now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PauseLimits {
    /// The deadline of a Pause that names none.
    pub default: Duration,
    /// The furthest deadline a Pause may name.
    pub max: Duration,
}

impl Default for PauseLimits {
    fn default() -> Self {
        Self {
            default: Duration::from_secs(3600),
            max: Duration::from_secs(24 * 3600),
        }
    }
}

/// The byte budget of scheduled drills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrillLimits {
    /// A store whose newest restore point restores more plain bytes is not drilled by the
    /// scheduler; 0: no budget.
    pub max_bytes: u64,
}

impl Default for DrillLimits {
    fn default() -> Self {
        Self {
            max_bytes: 10 << 30,
        }
    }
}

/// How much of the fleet's event log is kept (`serve --events-keep-days`, `--events-keep`):
/// events older than `keep_for` go, and all but the newest `keep`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventRetention {
    pub keep_for: Duration,
    pub keep: u64,
}

/// `--events-keep-days`: 1 day to 10 years.
pub const EVENTS_KEEP_DAYS: crate::worker::limits::Limit = crate::worker::limits::Limit {
    min: 1,
    max: 3650,
    unit: "days",
};
/// `--events-keep`: 1,000 to 100 million events (about a kilobyte each).
pub const EVENTS_KEEP: crate::worker::limits::Limit = crate::worker::limits::Limit {
    min: 1000,
    max: 100_000_000,
    unit: "",
};

impl EventRetention {
    /// Days and count checked against `EVENTS_KEEP_DAYS` and `EVENTS_KEEP`; the error
    /// names the flag and its range.
    pub fn new(keep_days: u64, keep: u64) -> Result<EventRetention, String> {
        let days = EVENTS_KEEP_DAYS.check("--events-keep-days", keep_days)?;
        let keep = EVENTS_KEEP.check("--events-keep", keep)?;
        Ok(EventRetention {
            keep_for: Duration::from_secs(days * 86_400),
            keep,
        })
    }
}

impl Default for EventRetention {
    /// A week, at most a million events.
    fn default() -> Self {
        EventRetention {
            keep_for: Duration::from_secs(7 * 86_400),
            keep: 1_000_000,
        }
    }
}
