//! Opening the SQLite registry: one file (plus its `-wal` and `-shm`), created with its parent
//! directory when missing.
//!
//! WAL journal mode, `synchronous = FULL` (an acknowledged registration survives power loss,
//! and the registry sees a handful of writes a minute), foreign keys on (health rows cascade
//! with their store), and a busy timeout so the pool's connections wait for each other's
//! writes instead of failing. A crash leaves the file at its last committed transaction; the
//! WAL is replayed on the next open.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use super::error::RegistryError;

/// How long a statement waits for another connection's write lock before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections in the pool: WAL lets readers run beside the one writer.
const MAX_CONNECTIONS: u32 = 4;
/// How long a call waits for a free connection.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// The schema, embedded at compile time from `migrations/sqlite` (version, description, SQL).
/// Listed by hand because `sqlx::migrate!` needs sqlx's `macros` feature; the version and
/// description are what that macro would derive from the file name, so switching is a no-op.
const MIGRATIONS: &[(i64, &str, &str)] = &[
    (
        1,
        "registry",
        include_str!("../../migrations/sqlite/0001_registry.sql"),
    ),
    (
        2,
        "instances",
        include_str!("../../migrations/sqlite/0002_instances.sql"),
    ),
    (
        3,
        "instance claims",
        include_str!("../../migrations/sqlite/0003_instance_claims.sql"),
    ),
    (
        4,
        "stores serial",
        include_str!("../../migrations/sqlite/0004_stores_serial.sql"),
    ),
    (
        5,
        "store pauses",
        include_str!("../../migrations/sqlite/0005_store_pauses.sql"),
    ),
    (
        6,
        "store drills",
        include_str!("../../migrations/sqlite/0006_store_drills.sql"),
    ),
    (
        7,
        "instance addresses",
        include_str!("../../migrations/sqlite/0007_instance_addresses.sql"),
    ),
    (
        8,
        "store owners",
        include_str!("../../migrations/sqlite/0008_store_owners.sql"),
    ),
    (
        9,
        "events",
        include_str!("../../migrations/sqlite/0009_events.sql"),
    ),
    (
        10,
        "restore rates",
        include_str!("../../migrations/sqlite/0010_restore_rates.sql"),
    ),
    (
        11,
        "restore samples",
        include_str!("../../migrations/sqlite/0011_restore_samples.sql"),
    ),
];

/// Opens (creating if missing) the SQLite registry named by `url` and applies the migrations.
/// Returns the pool and a description of where it is, for error messages.
pub(super) async fn open(url: &str) -> Result<(SqlitePool, String), RegistryError> {
    let path = file_path(url)?;
    let location = format!("sqlite {}", path.display());
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| RegistryError::Unavailable {
            detail: format!(
                "{location}: cannot create directory {}: {e}",
                parent.display()
            ),
        })?;
    }
    let options = SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .foreign_keys(true)
        .busy_timeout(BUSY_TIMEOUT);
    let pool = SqlitePoolOptions::new()
        .max_connections(MAX_CONNECTIONS)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_with(options)
        .await
        .map_err(|e| RegistryError::Unavailable {
            detail: format!("{location}: {e}"),
        })?;
    super::migrator(MIGRATIONS)
        .run(&pool)
        .await
        .map_err(RegistryError::Migrate)?;
    Ok((pool, location))
}

/// The file a `sqlite:` URL names. sqlx's parser does the work (percent-decoding, `?mode=`);
/// what it would accept but a registry cannot use is refused here.
fn file_path(url: &str) -> Result<PathBuf, RegistryError> {
    let bad = |reason: String| RegistryError::BadUrl {
        url: url.to_string(),
        reason,
    };
    let parsed = SqliteConnectOptions::from_str(url).map_err(|e| bad(e.to_string()))?;
    let path = parsed.get_filename();
    if path.as_os_str().is_empty() {
        return Err(bad(
            "no file name (expected sqlite:///abs/path.db or sqlite:rel.db)".into(),
        ));
    }
    if url.contains(":memory:") || url.contains("mode=memory") {
        return Err(bad(
            "in-memory databases are refused: the registry must outlive the process".into(),
        ));
    }
    if url.contains("mode=ro") {
        return Err(bad(
            "read-only mode is refused: the registry is written to".into()
        ));
    }
    Ok(Path::new(path).to_path_buf())
}
