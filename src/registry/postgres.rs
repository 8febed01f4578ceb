//! Opening the PostgreSQL registry, which several service instances share.
//!
//! One connection is opened first, under [`CONNECT_TIMEOUT`], so a failure reports its real
//! cause (refused, timed out, authentication, no such database) instead of the pool's
//! "timed out"; the error names host, port and database, never the password. Migrations run
//! under sqlx's advisory lock, so instances starting together apply each one exactly once.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{ConnectOptions, Connection};

use super::error::{RegistryError, redact_url};

/// How long opening one connection may take before the server counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections per instance: the registry is a few small statements a second at most.
const MAX_CONNECTIONS: u32 = 5;
/// How long a call waits for a connection (including opening one) before `Unavailable`.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);
/// Idle connections are closed after this, so a quiet instance holds none.
const IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// The schema, embedded at compile time from `migrations/postgres` (see `sqlite.rs` for why
/// the list is by hand).
const MIGRATIONS: &[(i64, &str, &str)] = &[
    (
        1,
        "registry",
        include_str!("../../migrations/postgres/0001_registry.sql"),
    ),
    (
        2,
        "instances",
        include_str!("../../migrations/postgres/0002_instances.sql"),
    ),
    (
        3,
        "instance claims",
        include_str!("../../migrations/postgres/0003_instance_claims.sql"),
    ),
    (
        4,
        "stores serial",
        include_str!("../../migrations/postgres/0004_stores_serial.sql"),
    ),
    (
        5,
        "store pauses",
        include_str!("../../migrations/postgres/0005_store_pauses.sql"),
    ),
    (
        6,
        "store drills",
        include_str!("../../migrations/postgres/0006_store_drills.sql"),
    ),
    (
        7,
        "instance addresses",
        include_str!("../../migrations/postgres/0007_instance_addresses.sql"),
    ),
    (
        8,
        "store owners",
        include_str!("../../migrations/postgres/0008_store_owners.sql"),
    ),
    (
        9,
        "events",
        include_str!("../../migrations/postgres/0009_events.sql"),
    ),
    (
        10,
        "restore rates",
        include_str!("../../migrations/postgres/0010_restore_rates.sql"),
    ),
    (
        11,
        "restore samples",
        include_str!("../../migrations/postgres/0011_restore_samples.sql"),
    ),
];

/// Connects to the PostgreSQL registry named by `url` and applies the migrations. Returns the
/// pool and a description of where it is, for error messages.
pub(super) async fn open(url: &str) -> Result<(PgPool, String), RegistryError> {
    let options = PgConnectOptions::from_str(url).map_err(|e| RegistryError::BadUrl {
        url: redact_url(url),
        reason: e.to_string(),
    })?;
    let location = describe(&options);
    let unavailable = |why: String| RegistryError::Unavailable {
        detail: format!("{location}: {why}"),
    };

    let probe = tokio::time::timeout(CONNECT_TIMEOUT, options.connect())
        .await
        .map_err(|_| unavailable(format!("no connection within {CONNECT_TIMEOUT:?}")))?;
    let mut probe: PgConnection = probe.map_err(|e| unavailable(e.to_string()))?;
    let migrated = super::migrator(MIGRATIONS).run(&mut probe).await;
    // Closing politely is a courtesy; the server notices a dropped socket too.
    let _ = probe.close().await;
    migrated.map_err(RegistryError::Migrate)?;

    let pool = PgPoolOptions::new()
        .max_connections(MAX_CONNECTIONS)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .idle_timeout(IDLE_TIMEOUT)
        .connect_with(options)
        .await
        .map_err(|e| unavailable(e.to_string()))?;
    Ok((pool, location))
}

/// `postgres host:port/database` (or the socket directory), without user or password.
fn describe(options: &PgConnectOptions) -> String {
    let database = options
        .get_database()
        .unwrap_or_else(|| options.get_username());
    match options.get_socket() {
        Some(socket) => format!("postgres {}/{database}", socket.display()),
        None => format!(
            "postgres {}:{}/{database}",
            options.get_host(),
            options.get_port()
        ),
    }
}
