//! The registry: which stores the service backs up, what it did about them, and how they are.
//!
//! It lives in SQLite (the default, `<data-dir>/registry.db`, nothing to install) or in
//! PostgreSQL (several service instances sharing one registry). [`Registry::open`] picks the
//! backend from the URL and applies the schema in `migrations/<backend>/` before returning.
//!
//! # What is stored
//!
//! - `stores`: one row per registered store directory ([`StoreRecord`]). `store_id` and
//!   `store_dir` are each unique, so two registrations of one directory cannot both succeed,
//!   whichever instance makes them. The node token is stored only as its hash ([`token`]).
//!   `instance_id` names the service instance that runs the store's worker, and
//!   `owner_since_ms` since when (its registration, or the failover claim or planned move
//!   that gave it to that instance: [`Registry::change_owner`], a compare-and-set,
//!   `ownership.rs`); both are in every [`StoreRecord`] read, so one read of the table
//!   says who owns what.
//!   [`Registry::insert_store_unless`] checks a new store against every registered one and
//!   inserts it in one transaction, under a lock every registration takes.
//! - `audit_log`: append-only ([`AuditEntry`]), one row per register, deregister, adopt,
//!   refusal or failure, from every instance; read newest first. Each text field is stored
//!   bounded and escaped ([`audit_text`]), so whatever a refused request held, its entry is
//!   at most a few KiB and writes on both backends alike.
//! - `store_health`: the last health an instance reported for each store ([`HealthRow`]),
//!   overwritten when it changes and deleted with its store (`ON DELETE CASCADE`).
//! - `instances`: each instance's last heartbeat ([`Registry::report_health`] writes it on
//!   every report), so that an owner whose stores' health did not change still counts as
//!   heard from.
//!   It also holds where each instance answers the others' calls and its failover group
//!   ([`InstanceInfo`], `instances.rs`), written when the instance starts.
//! - `instance_claims`: which live process holds each instance id ([`InstanceClaim`]), so
//!   that two processes started with one id never both run its stores.
//! - `store_pauses`: the stores whose uploads an operator paused ([`PauseRecord`]), deleted on
//!   Resume and with their store (`ON DELETE CASCADE`).
//! - `store_drills`: each store's last restore drill ([`crate::health::DrillResult`]), replaced by the next,
//!   deleted with its store.
//! - `restore_rates`: the restore rates measured per destination endpoint (`rates.rs`), and
//!   `store_drills.predicted_ms`, each drill's prediction made before it.
//! - `events`: the fleet's event log, in one order of positions, pruned by age and count
//!   (`events.rs`); `webhook_cursors`: how far each webhook was delivered, and by whom
//!   (`webhook_cursor.rs`).
//!
//! # Crash story
//!
//! Every call is a single SQL statement or transaction, which the database commits or rolls
//! back as a whole:
//! a crash (of the service or the database) mid-call leaves the row written or not written,
//! never half. Nothing spans two calls, so a crash between two calls — say after
//! [`Registry::insert_store`] but before [`Registry::record_audit`] — leaves the first done and
//! the second not; the service orders its calls so that this is harmless (a registration
//! without its audit row, never an audit row for a registration that did not happen).
//!
//! A call that fails with [`RegistryError::Unavailable`] may or may not have been applied (the
//! connection can drop after the commit): re-read before acting. The other errors are
//! determinate: nothing was written.
//!
//! # Several instances
//!
//! Instances sharing a PostgreSQL registry see each other's committed writes at once; the
//! unique keys and the registration lock settle races between them. The registry says which
//! instance should run each store (its row's owner, changed only by a compare-and-set, so
//! racing claimants have one winner) and that one process at a time runs an instance id's
//! stores ([`InstanceClaim`]); which process *writes* a store's prefix is still the bucket
//! lease's to decide.
//!
//! Write access to the registry is admin access: its rows say who owns each store, where
//! each instance answers and what each store backs up, so whoever writes them directs the
//! fleet's calls and backups. What the instances send where a row points is bounded by
//! `service::peer_auth` (the peer token, never the admin token; over TLS only to a
//! certificate naming the instance the row names).
//!
//! # The registration check
//!
//! [`Registry::insert_store_unless`] checks a new store against every registered one, under the
//! registration lock. Reading every row for every registration made registering a fleet
//! quadratic (10,000 stores: 50 million rows read). So the table `stores_serial` counts the
//! changes to `stores`: every insert and delete moves it in its own transaction. A check reads
//! the serial (under the lock) and, when it is the one this handle left after its own last
//! check, checks against the stores it read then plus those it inserted since; otherwise it
//! reads every row again. Another instance's insert or delete moves the serial, so it is never
//! missed. A commit whose answer was lost forgets what was read (the next check reads again).
//! Each full read gets a number unique in the process ([`Registered::read`]); the stores a
//! check is shown under one number only grow at the end, so the service keeps an index of
//! them from one check to the next (`service::conflicts`) instead of walking every store.

mod error;
mod postgres;
mod sqlite;
pub mod token;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::{ColumnIndex, Decode, PgPool, Row, SqlSafeStr, SqlitePool, Type};

pub use error::RegistryError;
pub(crate) use error::redact_url;
pub use token::{hash_token, new_node_token, token_matches};

use error::{classify, stores_unique_violation};

/// A registered store, as the `stores` table holds it.
#[derive(Clone, PartialEq, Eq)]
pub struct StoreRecord {
    /// The service-assigned identity, stable for the store's life.
    pub store_id: String,
    /// The store's directory on the node; unique across the registry.
    pub store_dir: String,
    /// Where its backups go (a bucket URL and prefix).
    pub destination: String,
    /// Operator-chosen labels, for listing and dashboards.
    pub labels: BTreeMap<String, String>,
    /// The worker options the store was registered with, as JSON.
    pub options: serde_json::Value,
    /// [`hash_token`] of the store's node token (never the token itself).
    pub node_token_hash: String,
    /// The service instance that runs the store's worker.
    pub instance_id: String,
    /// When it was registered, milliseconds since the Unix epoch.
    pub registered_at_ms: i64,
    /// Since when `instance_id` owns it, milliseconds since the Unix epoch: its registration,
    /// or the failover claim or planned move that gave it to that instance.
    pub owner_since_ms: i64,
}

/// Like the derived `Debug`, but the token hash is cut to its first 8 digits: enough to tell
/// two apart in a log, too little to be worth anything.
impl fmt::Debug for StoreRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hash_prefix = self.node_token_hash.get(..8).unwrap_or("");
        f.debug_struct("StoreRecord")
            .field("store_id", &self.store_id)
            .field("store_dir", &self.store_dir)
            .field("destination", &self.destination)
            .field("labels", &self.labels)
            .field("options", &self.options)
            .field("node_token_hash", &format_args!("{hash_prefix}…"))
            .field("instance_id", &self.instance_id)
            .field("registered_at_ms", &self.registered_at_ms)
            .field("owner_since_ms", &self.owner_since_ms)
            .finish()
    }
}

/// One row of the audit log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEntry {
    /// When, milliseconds since the Unix epoch.
    pub at_ms: i64,
    /// The instance that acted.
    pub instance_id: String,
    /// `register`, `deregister`, `adopt`, `refused`, …
    pub action: String,
    pub store_id: Option<String>,
    pub store_dir: Option<String>,
    /// `ok`, `refused` or `error`.
    pub outcome: String,
    /// A human-readable account: what was refused and why, or the error.
    pub detail: String,
    /// The gRPC peer that asked, when there was one.
    pub peer: Option<String>,
}

/// The last health reported for one store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthRow {
    pub store_id: String,
    /// The instance that reported it.
    pub instance_id: String,
    pub reported_at_ms: i64,
    /// The health record as JSON, stored as given.
    pub health_json: String,
}

/// A handle on the registry database: a small connection pool, cheap to clone.
#[derive(Clone)]
pub struct Registry {
    backend: Backend,
    /// Where the database is, without secrets, for error messages.
    location: String,
    /// The stores as the last registration check read them, and the `stores_serial` then.
    checked: Arc<Mutex<Option<Checked>>>,
}

/// What [`Registry::insert_store_unless`] read last: valid while `stores_serial` is `serial`.
struct Checked {
    serial: i64,
    stores: Vec<StoreRecord>,
    /// Which full read `stores` grew from (see [`Registered::read`]).
    read: u64,
}

/// The stores a registration check is shown: every store registered, by any instance.
#[derive(Clone, Copy)]
pub struct Registered<'a> {
    pub stores: &'a [StoreRecord],
    /// Names the full read of the table these stores descend from, unique in the process:
    /// two checks shown the same `read` were shown the same stores in the same order, the
    /// later one perhaps with more at the end (the stores inserted since). So a caller may
    /// keep what it derived from the stores of one read and add only the new tail.
    pub read: u64,
}

/// A fresh [`Registered::read`].
fn next_read() -> u64 {
    static READS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    READS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

#[derive(Clone)]
enum Backend {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// Runs `$body` with `$pool` bound to whichever pool `$registry` has. The body is compiled
/// once per backend, so one SQL text serves both (`$1`-style placeholders work in both).
macro_rules! with_pool {
    ($registry:expr, |$pool:ident| $body:expr) => {
        match &$registry.backend {
            Backend::Sqlite($pool) => $body,
            Backend::Postgres($pool) => $body,
        }
    };
}

/// `SELECT <every stores column> FROM stores <tail>`, as one literal.
macro_rules! select_stores {
    ($tail:literal) => {
        concat!(
            "SELECT store_id, store_dir, destination, labels, options, node_token_hash, ",
            "instance_id, registered_at_ms, owner_since_ms FROM stores ",
            $tail
        )
    };
}

/// The advisory-lock key registrations take on PostgreSQL (`insert_store_unless`): any
/// constant no other lock user of the database picks ("mshrmreg" in ASCII).
const REGISTRATION_LOCK: i64 = 0x6d73_6872_6d72_6567;

/// The most bytes an audit-log text field keeps (a store path's limit, 4 KiB).
pub const AUDIT_FIELD_MAX_BYTES: usize = 4096;

/// `s` as the audit log stores it: control characters (NUL above all, which PostgreSQL cannot
/// store in `TEXT`) escaped as `\u{..}`, and cut to at most [`AUDIT_FIELD_MAX_BYTES`] bytes
/// on a character boundary, ending `… (N bytes)` with the original length when cut. The same
/// on both backends, so an entry reads back the same wherever it was written.
pub fn audit_text(s: &str) -> String {
    let mut escaped = String::with_capacity(s.len().min(AUDIT_FIELD_MAX_BYTES));
    for c in s.chars() {
        if c.is_control() {
            escaped.extend(c.escape_unicode());
        } else {
            escaped.push(c);
        }
        if escaped.len() > AUDIT_FIELD_MAX_BYTES {
            break;
        }
    }
    if escaped.len() <= AUDIT_FIELD_MAX_BYTES {
        return escaped;
    }
    let suffix = format!("… ({} bytes)", s.len());
    let mut cut = AUDIT_FIELD_MAX_BYTES - suffix.len();
    while !escaped.is_char_boundary(cut) {
        cut -= 1;
    }
    escaped.truncate(cut);
    escaped.push_str(&suffix);
    escaped
}

// After the macros above, which it uses.
mod audit_health;
mod claim;
pub use claim::{ClaimError, ClaimRecord, ClaimView, InstanceClaim, Predecessor};
mod instances;
pub use instances::InstanceInfo;
mod pause;
pub use pause::PauseRecord;
mod drill;
mod ownership;
pub use ownership::{Claimed, Owner};
mod report;
pub use report::StoreReport;
mod events;
pub use events::{EventRow, EventSpan, LoggedEvent};
mod rates;
pub use rates::KeptRates;
mod store_options;
mod webhook_cursor;

impl Registry {
    /// Opens the registry at `url` and applies any migrations it lacks:
    /// `sqlite:///abs/path/registry.db` or `sqlite:relative.db` (creating the file and its
    /// parent directory), or `postgres://user:pass@host:port/db` (`postgresql://` too).
    pub async fn open(url: &str) -> Result<Registry, RegistryError> {
        if url.starts_with("sqlite:") {
            let (pool, location) = sqlite::open(url).await?;
            Ok(Registry {
                backend: Backend::Sqlite(pool),
                location,
                checked: Arc::default(),
            })
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let (pool, location) = postgres::open(url).await?;
            Ok(Registry {
                backend: Backend::Postgres(pool),
                location,
                checked: Arc::default(),
            })
        } else {
            Err(RegistryError::BadUrl {
                url: error::redact_url(url),
                reason: "expected a sqlite: or postgres:// URL".into(),
            })
        }
    }

    /// `"sqlite"` or `"postgres"`.
    pub fn kind(&self) -> &'static str {
        match self.backend {
            Backend::Sqlite(_) => "sqlite",
            Backend::Postgres(_) => "postgres",
        }
    }

    /// Where the database is (file, or host, port and database), without secrets.
    pub fn location(&self) -> &str {
        &self.location
    }

    /// Checks that the database answers.
    pub async fn ping(&self) -> Result<(), RegistryError> {
        with_pool!(self, |pool| sqlx::query("SELECT 1")
            .execute(pool)
            .await
            .map(drop))
        .map_err(|e| self.err(e))
    }

    /// Closes the pool, waiting for calls in flight. Other clones see `Unavailable` after.
    pub async fn close(&self) {
        with_pool!(self, |pool| pool.close().await)
    }

    /// Adds a store. [`RegistryError::AlreadyExists`] (`what` = `"store_dir"` or `"store_id"`)
    /// when either is taken; nothing is written then.
    pub async fn insert_store(&self, rec: &StoreRecord) -> Result<(), RegistryError> {
        self.insert_store_unless(rec, |_| None::<std::convert::Infallible>)
            .await
            .map(|checked| checked.unwrap_or_else(|never| match never {}))
    }

    /// Adds a store unless `refuse`, shown every store registered (by any instance), finds a
    /// reason against it: `Ok(Err(reason))`, and nothing is written. The read and the insert
    /// are one transaction under a registry-wide lock (PostgreSQL: a transaction-level advisory
    /// lock, so instances sharing the registry take turns; SQLite: the write lock that
    /// `BEGIN IMMEDIATE` takes), so two registrations can never both pass the check against
    /// each other. Errors as [`Registry::insert_store`].
    pub async fn insert_store_unless<E>(
        &self,
        rec: &StoreRecord,
        refuse: impl FnOnce(&[StoreRecord]) -> Option<E>,
    ) -> Result<Result<(), E>, RegistryError> {
        self.insert_store_checked(rec, |registered| refuse(registered.stores))
            .await
    }

    /// [`Registry::insert_store_unless`], with `refuse` told which read the stores descend
    /// from ([`Registered::read`]), so that it can keep an index of them across calls.
    pub async fn insert_store_checked<E>(
        &self,
        rec: &StoreRecord,
        refuse: impl FnOnce(Registered<'_>) -> Option<E>,
    ) -> Result<Result<(), E>, RegistryError> {
        const ALL: &str = select_stores!("ORDER BY registered_at_ms, store_id");
        const SERIAL: &str = "SELECT serial FROM stores_serial WHERE id = 1";
        const BUMP: &str = "UPDATE stores_serial SET serial = serial + 1 WHERE id = 1";
        const INSERT: &str = "INSERT INTO stores (store_id, store_dir, destination, labels, \
                              options, node_token_hash, instance_id, registered_at_ms, \
                              owner_since_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)";
        let labels = serde_json::to_string(&rec.labels).expect("string maps serialize");
        let options = rec.options.to_string();
        // Called exactly once below, on whichever stores the check uses.
        let mut refuse = Some(refuse);
        let mut refuse = |stores: &[StoreRecord], read: u64| {
            refuse.take().and_then(|f| f(Registered { stores, read }))
        };
        // The body, once per backend: read the serial, and every store unless the serial
        // says the ones read last are still those; ask `refuse`; insert, move the serial,
        // commit; then remember the stores with this one, at the new serial.
        macro_rules! read_check_insert {
            ($tx:ident) => {{
                let serial: i64 = sqlx::query_scalar(SERIAL)
                    .fetch_one(&mut *$tx)
                    .await
                    .map_err(|e| self.err(e))?;
                let cached = {
                    let mut checked = self.checked();
                    match checked.as_ref() {
                        Some(c) if c.serial == serial => Some(refuse(&c.stores, c.read)),
                        _ => {
                            *checked = None;
                            None
                        }
                    }
                };
                let (verdict, read) = match cached {
                    Some(verdict) => (verdict, None),
                    None => {
                        let rows = sqlx::query(ALL)
                            .fetch_all(&mut *$tx)
                            .await
                            .map_err(|e| self.err(e))?;
                        let stores = rows
                            .iter()
                            .map(|r| store_from_row(r, &self.location))
                            .collect::<Result<Vec<_>, _>>()?;
                        let read = next_read();
                        (refuse(&stores, read), Some((stores, read)))
                    }
                };
                if let Some(reason) = verdict {
                    $tx.rollback().await.map_err(|e| self.err(e))?;
                    if let Some((stores, read)) = read {
                        *self.checked() = Some(Checked {
                            serial,
                            stores,
                            read,
                        });
                    }
                    return Ok(Err(reason));
                }
                sqlx::query(INSERT)
                    .bind(&rec.store_id)
                    .bind(&rec.store_dir)
                    .bind(&rec.destination)
                    .bind(&labels)
                    .bind(&options)
                    .bind(&rec.node_token_hash)
                    .bind(&rec.instance_id)
                    .bind(rec.registered_at_ms)
                    .bind(rec.owner_since_ms)
                    .execute(&mut *$tx)
                    .await
                    .map_err(|e| self.insert_error(e, rec))?;
                sqlx::query(BUMP)
                    .execute(&mut *$tx)
                    .await
                    .map_err(|e| self.err(e))?;
                // Forgotten until the commit is known to have landed: a commit whose answer
                // was lost leaves the serial moved or not, and the next check reads again.
                let mut stores = match read {
                    Some(read) => Some(read),
                    None => self.checked().take().map(|c| (c.stores, c.read)),
                };
                $tx.commit().await.map_err(|e| self.err(e))?;
                if let Some((stores, _)) = stores.as_mut() {
                    stores.push(rec.clone());
                }
                *self.checked() = stores.map(|(stores, read)| Checked {
                    serial: serial + 1,
                    stores,
                    read,
                });
                Ok(Ok(()))
            }};
        }
        match &self.backend {
            Backend::Sqlite(pool) => {
                let mut tx = pool
                    .begin_with("BEGIN IMMEDIATE")
                    .await
                    .map_err(|e| self.err(e))?;
                read_check_insert!(tx)
            }
            Backend::Postgres(pool) => {
                let mut tx = pool.begin().await.map_err(|e| self.err(e))?;
                sqlx::query("SELECT pg_advisory_xact_lock($1)")
                    .bind(REGISTRATION_LOCK)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| self.err(e))?;
                read_check_insert!(tx)
            }
        }
    }

    fn checked(&self) -> std::sync::MutexGuard<'_, Option<Checked>> {
        // Every update under the lock is one assignment.
        self.checked.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sorts a failed insert of `rec`: a unique key taken, or the database failing.
    fn insert_error(&self, e: sqlx::Error, rec: &StoreRecord) -> RegistryError {
        match stores_unique_violation(&e) {
            Some("store_id") => RegistryError::AlreadyExists {
                what: "store_id",
                value: rec.store_id.clone(),
            },
            Some(what) => RegistryError::AlreadyExists {
                what,
                value: rec.store_dir.clone(),
            },
            None => self.err(e),
        }
    }

    /// Removes a store (and its health row). `false` when there was none. Moves
    /// `stores_serial` in the same transaction, so the next registration check reads again.
    pub async fn delete_store(&self, store_id: &str) -> Result<bool, RegistryError> {
        const SQL: &str = "DELETE FROM stores WHERE store_id = $1";
        const BUMP: &str = "UPDATE stores_serial SET serial = serial + 1 WHERE id = 1";
        *self.checked() = None;
        with_pool!(self, |pool| {
            async {
                let mut tx = pool.begin().await?;
                let deleted = sqlx::query(SQL).bind(store_id).execute(&mut *tx).await?;
                if deleted.rows_affected() > 0 {
                    sqlx::query(BUMP).execute(&mut *tx).await?;
                }
                tx.commit().await?;
                Ok::<_, sqlx::Error>(deleted.rows_affected() > 0)
            }
            .await
        })
        .map_err(|e| self.err(e))
    }

    /// The store with this id, if registered.
    pub async fn get_store(&self, store_id: &str) -> Result<Option<StoreRecord>, RegistryError> {
        const SQL: &str = select_stores!("WHERE store_id = $1");
        with_pool!(self, |pool| {
            let row = sqlx::query(SQL).bind(store_id).fetch_optional(pool).await;
            row.map_err(|e| self.err(e))?
                .map(|r| store_from_row(&r, &self.location))
                .transpose()
        })
    }

    /// The store registered for this directory, if any.
    pub async fn find_by_dir(&self, store_dir: &str) -> Result<Option<StoreRecord>, RegistryError> {
        const SQL: &str = select_stores!("WHERE store_dir = $1");
        with_pool!(self, |pool| {
            let row = sqlx::query(SQL).bind(store_dir).fetch_optional(pool).await;
            row.map_err(|e| self.err(e))?
                .map(|r| store_from_row(&r, &self.location))
                .transpose()
        })
    }

    /// All stores, or those of one instance, oldest registration first (ties by `store_id`).
    pub async fn list_stores(
        &self,
        instance_id: Option<&str>,
    ) -> Result<Vec<StoreRecord>, RegistryError> {
        const ALL: &str = select_stores!("ORDER BY registered_at_ms, store_id");
        const ONE: &str =
            select_stores!("WHERE instance_id = $1 ORDER BY registered_at_ms, store_id");
        with_pool!(self, |pool| {
            let rows = match instance_id {
                None => sqlx::query(ALL).fetch_all(pool).await,
                Some(id) => sqlx::query(ONE).bind(id).fetch_all(pool).await,
            };
            rows.map_err(|e| self.err(e))?
                .iter()
                .map(|r| store_from_row(r, &self.location))
                .collect()
        })
    }

    fn err(&self, e: sqlx::Error) -> RegistryError {
        classify(&self.location, e)
    }
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("location", &self.location)
            .finish_non_exhaustive()
    }
}

fn store_from_row<R: Row>(row: &R, location: &str) -> Result<StoreRecord, RegistryError>
where
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    &'static str: ColumnIndex<R>,
{
    let get = |column: &'static str| -> Result<String, RegistryError> {
        row.try_get(column).map_err(|e| classify(location, e))
    };
    let store_id = get("store_id")?;
    let corrupt = |column: &str, e: serde_json::Error| RegistryError::Corrupt {
        detail: format!("{location}: stores.{column} of {store_id:?} is not valid JSON: {e}"),
    };
    let labels = serde_json::from_str(&get("labels")?).map_err(|e| corrupt("labels", e))?;
    let options = serde_json::from_str(&get("options")?).map_err(|e| corrupt("options", e))?;
    Ok(StoreRecord {
        store_dir: get("store_dir")?,
        destination: get("destination")?,
        labels,
        options,
        node_token_hash: get("node_token_hash")?,
        instance_id: get("instance_id")?,
        registered_at_ms: row
            .try_get("registered_at_ms")
            .map_err(|e| classify(location, e))?,
        owner_since_ms: row
            .try_get("owner_since_ms")
            .map_err(|e| classify(location, e))?,
        store_id,
    })
}

/// A `Migrator` over migrations embedded with `include_str!` (version, description, SQL).
fn migrator(migrations: &'static [(i64, &'static str, &'static str)]) -> Migrator {
    Migrator::with_migrations(
        migrations
            .iter()
            .map(|&(version, description, sql)| {
                Migration::new(
                    version,
                    description.into(),
                    MigrationType::Simple,
                    sql.into_sql_str(),
                    false,
                )
            })
            .collect(),
    )
}
