//! The registry's errors, and the one place sqlx errors are sorted into them.
//!
//! Sorting is by what the caller can do about it: [`RegistryError::AlreadyExists`] is an answer
//! about the data (the write did not happen), [`RegistryError::Unavailable`] is the database
//! being out of reach or busy past the wait for it (a write that failed this way may or may
//! not have happened: re-read before acting), the rest are bugs or damage.
//! Constraint violations are recognised by the database's error code and constraint name,
//! never by message text.

use sqlx::error::ErrorKind;

/// What a registry call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// A store with this `store_dir` or `store_id` is already registered; nothing was written.
    #[error("a store with {what} {value:?} is already registered")]
    AlreadyExists {
        /// `"store_dir"` or `"store_id"`: the column whose uniqueness was violated.
        what: &'static str,
        value: String,
    },
    /// The registry URL cannot be used. `url` has any password replaced by `***`.
    #[error("bad registry URL {url:?}: {reason}")]
    BadUrl { url: String, reason: String },
    /// The database cannot be reached or dropped the connection. The detail names the host
    /// and database (or the file), never the password.
    #[error("registry database unavailable: {detail}")]
    Unavailable { detail: String },
    /// Applying the schema migrations failed (or the database has migrations this binary does
    /// not know, or an applied migration was edited).
    #[error("applying the registry migrations failed: {0}")]
    Migrate(#[source] sqlx::migrate::MigrateError),
    /// The database refused a statement for a reason not sorted above.
    #[error("registry database error: {0}")]
    Database(#[source] sqlx::Error),
    /// A row holds something this code cannot read back (bad JSON, a wrong column type).
    #[error("corrupt registry row: {detail}")]
    Corrupt { detail: String },
}

/// Sorts a sqlx error from a statement against the database at `location` (a description
/// without secrets, such as `postgres 127.0.0.1:5432/registry`).
pub(crate) fn classify(location: &str, e: sqlx::Error) -> RegistryError {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => RegistryError::Unavailable {
            detail: format!("{location}: {e}"),
        },
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => RegistryError::Corrupt {
            detail: format!("{location}: {e}"),
        },
        // Another writer held the database past the wait for it: out of reach for now, as a
        // dropped connection is, and worth a retry (not a bug of ours).
        sqlx::Error::Database(ref db) if busy(db.code().as_deref()) => RegistryError::Unavailable {
            detail: format!("{location}: busy, another writer held it too long: {e}"),
        },
        other => RegistryError::Database(other),
    }
}

/// Whether a database error code says the database was busy or locked: SQLite's
/// `SQLITE_BUSY` and `SQLITE_LOCKED` with their extended codes (the low byte is the primary
/// code), PostgreSQL's `lock_not_available`.
fn busy(code: Option<&str>) -> bool {
    match code {
        Some("55P03") => true,
        Some(code) => code.parse::<u32>().is_ok_and(|c| matches!(c & 0xff, 5 | 6)),
        None => false,
    }
}

/// The constraint names the migrations give the `stores` table's unique keys.
const STORES_PKEY: &str = "stores_pkey";
const STORES_DIR_KEY: &str = "stores_store_dir_key";
/// SQLite's extended result codes for the two kinds of unique violation (it reports no
/// constraint name; `stores` has exactly one key of each kind).
const SQLITE_CONSTRAINT_PRIMARYKEY: &str = "1555";
const SQLITE_CONSTRAINT_UNIQUE: &str = "2067";

/// Which column of `stores` a unique violation is about, if `e` is one.
pub(crate) fn stores_unique_violation(e: &sqlx::Error) -> Option<&'static str> {
    let db = e.as_database_error()?;
    if db.kind() != ErrorKind::UniqueViolation {
        return None;
    }
    match db.constraint() {
        Some(STORES_PKEY) => Some("store_id"),
        Some(STORES_DIR_KEY) => Some("store_dir"),
        Some(_) => None,
        None => match db.code().as_deref() {
            Some(SQLITE_CONSTRAINT_PRIMARYKEY) => Some("store_id"),
            Some(SQLITE_CONSTRAINT_UNIQUE) => Some("store_dir"),
            _ => None,
        },
    }
}

/// `url` with the password of its user-info part, if any, replaced by `***`. Works on strings
/// that do not parse as URLs too, so a [`RegistryError::BadUrl`] never echoes a password.
pub(crate) fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let rest_start = scheme_end + 3;
    let rest = &url[rest_start..];
    // The last `@` before any query: a password holding an unescaped `/` or `@` is still
    // covered (redacting too much is harmless, too little is not).
    let before_query = &rest[..rest.find(['?', '#']).unwrap_or(rest.len())];
    let Some(at) = before_query.rfind('@') else {
        return url.to_string();
    };
    let userinfo = &rest[..at];
    let Some(colon) = userinfo.find(':') else {
        return url.to_string();
    };
    format!(
        "{}{}:***{}",
        &url[..rest_start],
        &userinfo[..colon],
        &url[rest_start + at..]
    )
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn redacts_only_the_password() {
        assert_eq!(
            redact_url("postgres://u:p%40ss@h:5/db?x=1"),
            "postgres://u:***@h:5/db?x=1"
        );
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(
            redact_url("postgres://u:pw@h:nope/db"),
            "postgres://u:***@h:nope/db"
        );
        assert_eq!(
            redact_url("postgres://u:p/w@d@h/db"),
            "postgres://u:***@h/db"
        );
        assert_eq!(redact_url("sqlite:///a/b.db"), "sqlite:///a/b.db");
        assert_eq!(redact_url("not a url"), "not a url");
    }
}
