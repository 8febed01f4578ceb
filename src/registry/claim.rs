//! [`InstanceClaim`]: at most one live process runs an instance id's stores.
//!
//! Stores belong to an instance id, not to a process. Two processes started with one id (a
//! second `serve` on the same data directory, a copied configuration, a host name reused)
//! would both respawn its stores; the bucket leases would keep them from corrupting a prefix,
//! but not from fighting over every lease. So a process claims its id in the registry before
//! it runs anything, and keeps the claim while it runs.
//!
//! # The claim
//!
//! The `instance_claims` table holds one row per instance id: a random nonce of the holding
//! process, its host, pid and start time, and a heartbeat. Every time is the **database's**
//! clock (PostgreSQL's `clock_timestamp()`, SQLite's `julianday('now')`), so instances on hosts
//! whose clocks disagree still judge one another's heartbeats on one clock.
//!
//! - [`InstanceClaim::take`]: inserts the row when there is none; when there is one whose
//!   heartbeat is older than `stale_after`, takes it over by compare-and-set on the nonce it
//!   saw (and the heartbeat still being stale), so of two processes taking over the same stale
//!   claim one wins; a fresher claim refuses with [`ClaimError::HeldElsewhere`], naming the
//!   holder. Every step is one statement; a lost race is read again and retried.
//! - [`InstanceClaim::take_as_after`]: the same, told which earlier processes are proven to
//!   have stopped ([`DeadHolder`]s, from the data directory's [`InstanceLock`]): a row whose
//!   nonce, host and pid are one of theirs is taken over at once by compare-and-set on that
//!   nonce, whatever its heartbeat. This is how `serve` restarts at once after a SIGKILL.
//!
//! # Taken over: proven dead, or only stale
//!
//! [`InstanceClaim::predecessor`] says which of the two a take-over was:
//! - [`Predecessor::ProvenDead`]: the lock the predecessor held for its whole life is free,
//!   so it has stopped, and nothing it started still writes (see [`crate::instance_lock`] for
//!   what the lock does not prove: a copied data directory, NFS).
//! - [`Predecessor::Stale`]: its heartbeat is older than `stale_after`. It stopped *renewing
//!   the registry*; it may still be running, cut off from the database, and writing buckets.
//!
//! The rule for a row whose nonce matches a dead holder's: the nonce is compared against the
//! row, never the heartbeat (a process killed a moment ago has as fresh a heartbeat as a live
//! one). What keeps a copied data directory from stealing a live claim is that its lock proves
//! nothing (the lock file's identity and host are recorded and checked), so it offers no dead
//! holders, and the claim is judged by its heartbeat as it always was. The host and pid are
//! compared too: a nonce is unique to one process, so they always agree when the nonce does;
//! a row that disagrees is not the process the lock speaks of, and proves nothing.
//! - [`InstanceClaim::renew`]: moves the heartbeat, only while the row still has this
//!   process's nonce; otherwise [`ClaimError::Lost`] (another process took the claim over, so
//!   this one was judged dead: it must stop running the stores).
//! - [`InstanceClaim::release`]: deletes the row if it is still this process's, so a restart
//!   claims at once instead of waiting for the claim to go stale.
//!
//! # What a claim proves, and what a crash leaves
//!
//! A crash leaves the row; it goes stale `stale_after` after its last heartbeat and is taken
//! over then. A claim whose heartbeat is older than `stale_after` by the database's clock means
//! its holder has not renewed for that long; a holder renewing every third of `stale_after`
//! that finds its claim taken ([`ClaimError::Lost`]) stops. [`InstanceClaim::predecessor`] keeps
//! the claim a take-over replaced, for whoever needs to know whose work it inherits. A
//! holder that cannot reach the registry for longer than `stale_after` may run on beside its
//! successor until its next renewal reaches the registry: the claim bounds how long two
//! processes share an id, the bucket leases keep them from corrupting any prefix meanwhile.

use std::fmt;
use std::time::Duration;

use sqlx::{AssertSqlSafe, ColumnIndex, Decode, Row, Type};

use super::{Backend, Registry, RegistryError};
use crate::instance_lock::DeadHolder;
#[cfg(doc)]
use crate::instance_lock::InstanceLock;

/// The database's clock, in milliseconds since the Unix epoch, per backend.
const SQLITE_NOW: &str = "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)";
const POSTGRES_NOW: &str = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)";

/// How many lost races [`InstanceClaim::take`] reads again before giving up.
const TAKE_ATTEMPTS: u32 = 5;

/// Who holds an instance id, as its `instance_claims` row says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRecord {
    pub instance_id: String,
    /// Random, new for every process: tells two processes with one id apart.
    pub nonce: String,
    pub host: String,
    pub pid: i64,
    /// When the process took the claim, by its own clock (ms since the Unix epoch).
    pub started_at_ms: i64,
    /// The last heartbeat, by the database's clock.
    pub heartbeat_ms: i64,
}

/// A claim as read now: the row and how long ago its heartbeat was, by the database's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimView {
    pub record: ClaimRecord,
    pub heartbeat_age: Duration,
}

impl fmt::Display for ClaimView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = &self.record;
        write!(
            f,
            "pid {} on host {}, started {}, last heartbeat {:.1} s ago",
            r.pid,
            r.host,
            crate::units::rfc3339_ms(r.started_at_ms),
            self.heartbeat_age.as_secs_f64()
        )
    }
}

impl ClaimRecord {
    /// The row of this process (host name, pid, now, a fresh nonce) for `instance_id`.
    pub fn for_this_process(instance_id: &str) -> ClaimRecord {
        ClaimRecord {
            instance_id: instance_id.to_string(),
            nonce: uuid::Uuid::new_v4().to_string(),
            host: crate::lease::host_name(),
            pid: i64::from(std::process::id()),
            started_at_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
            heartbeat_ms: 0,
        }
    }

    /// Whether this row is the claim of one of `dead`.
    fn held_by_one_of(&self, dead: &[DeadHolder]) -> bool {
        dead.iter()
            .any(|d| d.nonce == self.nonce && d.host == self.host && d.pid == self.pid)
    }
}

/// The claim a take-over replaced, and what is known of its holder; see the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Predecessor {
    /// Its holder is proven to have stopped: it held the data directory's lock until it died,
    /// and the lock is free. Taken over at once, whatever its heartbeat.
    ProvenDead(ClaimView),
    /// Its heartbeat was older than `stale_after`: its holder stopped renewing the registry,
    /// which does not prove it stopped writing the bucket.
    Stale(ClaimView),
}

impl Predecessor {
    /// The claim as it was read just before it was taken over.
    pub fn view(&self) -> &ClaimView {
        match self {
            Predecessor::ProvenDead(v) | Predecessor::Stale(v) => v,
        }
    }

    /// The nonce of the process it was.
    pub fn nonce(&self) -> &str {
        &self.view().record.nonce
    }

    /// Whether its holder is proven to have stopped.
    pub fn proven_dead(&self) -> bool {
        matches!(self, Predecessor::ProvenDead(_))
    }
}

/// Why a claim could not be taken or kept.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// A live process holds the id.
    #[error(
        "instance id {instance_id:?} is held by another live process ({holder}); stop that \
         process, or give this one its own --instance-id (a claim is taken over once its \
         heartbeat is {stale_after:?} old)"
    )]
    HeldElsewhere {
        instance_id: String,
        holder: ClaimView,
        stale_after: Duration,
    },
    /// The claim is no longer this process's: another process took it over.
    #[error(
        "the claim on instance id {instance_id:?} was taken over by another process ({}): this \
         process stops running its stores",
        .by.as_ref().map_or_else(|| "it has since released it".to_string(), ToString::to_string)
    )]
    Lost {
        instance_id: String,
        by: Option<ClaimView>,
    },
    /// Other processes kept changing the claim while this one tried to take it.
    #[error(
        "instance id {instance_id:?}: the claim changed {TAKE_ATTEMPTS} times while being taken"
    )]
    Contended { instance_id: String },
    #[error(transparent)]
    Registry(#[from] RegistryError),
}

/// This process's claim on its instance id.
#[derive(Debug)]
pub struct InstanceClaim {
    registry: Registry,
    record: ClaimRecord,
    stale_after: Duration,
    predecessor: Option<Predecessor>,
}

impl InstanceClaim {
    /// Claims `instance_id` for this process (host name, pid, a fresh nonce); see the module
    /// docs. `stale_after` is how old a claim's heartbeat must be to be taken over; renew at
    /// least every third of it.
    pub async fn take(
        registry: &Registry,
        instance_id: &str,
        stale_after: Duration,
    ) -> Result<InstanceClaim, ClaimError> {
        let mine = ClaimRecord::for_this_process(instance_id);
        InstanceClaim::take_as_after(registry, mine, stale_after, &[]).await
    }

    /// [`InstanceClaim::take`] with the row's identity given (tests pose as other processes).
    pub async fn take_as(
        registry: &Registry,
        mine: ClaimRecord,
        stale_after: Duration,
    ) -> Result<InstanceClaim, ClaimError> {
        InstanceClaim::take_as_after(registry, mine, stale_after, &[]).await
    }

    /// [`InstanceClaim::take_as`], knowing that the processes `dead` have stopped: a claim held
    /// by one of them is taken over at once ([`Predecessor::ProvenDead`]).
    pub async fn take_as_after(
        registry: &Registry,
        mine: ClaimRecord,
        stale_after: Duration,
        dead: &[DeadHolder],
    ) -> Result<InstanceClaim, ClaimError> {
        let stale_ms = i64::try_from(stale_after.as_millis()).unwrap_or(i64::MAX);
        for _ in 0..TAKE_ATTEMPTS {
            let predecessor = match registry.instance_claim(&mine.instance_id).await? {
                None => {
                    if !registry.insert_claim(&mine).await? {
                        continue;
                    }
                    None
                }
                Some(gone) if gone.record.held_by_one_of(dead) => {
                    if !registry
                        .take_over_claim(&mine, &gone.record.nonce, None)
                        .await?
                    {
                        continue;
                    }
                    Some(Predecessor::ProvenDead(gone))
                }
                Some(held) if held.heartbeat_age <= stale_after => {
                    return Err(ClaimError::HeldElsewhere {
                        instance_id: mine.instance_id,
                        holder: held,
                        stale_after,
                    });
                }
                Some(stale) => {
                    if !registry
                        .take_over_claim(&mine, &stale.record.nonce, Some(stale_ms))
                        .await?
                    {
                        continue;
                    }
                    Some(Predecessor::Stale(stale))
                }
            };
            let record = match registry.instance_claim(&mine.instance_id).await? {
                Some(v) if v.record.nonce == mine.nonce => v.record,
                by => {
                    return Err(ClaimError::Lost {
                        instance_id: mine.instance_id,
                        by,
                    });
                }
            };
            return Ok(InstanceClaim {
                registry: registry.clone(),
                record,
                stale_after,
                predecessor,
            });
        }
        Err(ClaimError::Contended {
            instance_id: mine.instance_id,
        })
    }

    /// The row as this process wrote it.
    pub fn record(&self) -> &ClaimRecord {
        &self.record
    }

    /// How old a heartbeat must be for the claim to be taken over.
    pub fn stale_after(&self) -> Duration {
        self.stale_after
    }

    /// The claim this one replaced, if it was a take-over, proven dead or only stale.
    pub fn taken_over(&self) -> Option<&ClaimView> {
        self.predecessor.as_ref().map(Predecessor::view)
    }

    /// The claim this one replaced and what is known of its holder, if it was a take-over.
    pub fn predecessor(&self) -> Option<&Predecessor> {
        self.predecessor.as_ref()
    }

    /// Moves the heartbeat; [`ClaimError::Lost`] when the claim is no longer this process's.
    pub async fn renew(&self) -> Result<(), ClaimError> {
        if self.registry.renew_claim(&self.record).await? {
            return Ok(());
        }
        Err(ClaimError::Lost {
            instance_id: self.record.instance_id.clone(),
            by: self
                .registry
                .instance_claim(&self.record.instance_id)
                .await?,
        })
    }

    /// Gives the claim up (a clean stop), if it is still this process's.
    pub async fn release(&self) -> Result<(), RegistryError> {
        self.registry.release_claim(&self.record).await
    }
}

impl Registry {
    /// `template` with `{now}` replaced by the database's clock in ms.
    fn at_db_time(&self, template: &str) -> String {
        let now = match self.backend {
            Backend::Sqlite(_) => SQLITE_NOW,
            Backend::Postgres(_) => POSTGRES_NOW,
        };
        template.replace("{now}", now)
    }

    /// The claim on `instance_id`, if any, with its heartbeat's age by the database's clock.
    pub async fn instance_claim(
        &self,
        instance_id: &str,
    ) -> Result<Option<ClaimView>, RegistryError> {
        let sql = self.at_db_time(
            "SELECT instance_id, nonce, host, pid, started_at_ms, heartbeat_ms, \
             CAST({now} AS BIGINT) AS now_ms FROM instance_claims WHERE instance_id = $1",
        );
        with_pool!(self, |pool| {
            let row = sqlx::query(AssertSqlSafe(sql))
                .bind(instance_id)
                .fetch_optional(pool)
                .await
                .map_err(|e| self.err(e))?;
            row.map(|r| claim_from_row(&r).map_err(|e| self.err(e)))
                .transpose()
        })
    }

    /// Inserts `c` as the claim; `false` when there already is one.
    async fn insert_claim(&self, c: &ClaimRecord) -> Result<bool, RegistryError> {
        let sql = self.at_db_time(
            "INSERT INTO instance_claims (instance_id, nonce, host, pid, started_at_ms, \
             heartbeat_ms) VALUES ($1, $2, $3, $4, $5, {now}) \
             ON CONFLICT (instance_id) DO NOTHING",
        );
        self.claim_statement(sql, c, None).await
    }

    /// Replaces the claim with nonce `old_nonce` by `c`: if its heartbeat is still older than
    /// `stale_ms` when that is given, whatever its heartbeat when not (its holder is proven
    /// dead); `false` when it is not replaced (renewed, or replaced meanwhile).
    async fn take_over_claim(
        &self,
        c: &ClaimRecord,
        old_nonce: &str,
        stale_ms: Option<i64>,
    ) -> Result<bool, RegistryError> {
        const SET: &str = "UPDATE instance_claims SET nonce = $2, host = $3, pid = $4, \
                           started_at_ms = $5, heartbeat_ms = {now} \
                           WHERE instance_id = $1 AND nonce = $6";
        let sql = match stale_ms {
            Some(_) => self.at_db_time(&format!("{SET} AND heartbeat_ms < {{now}} - $7")),
            None => self.at_db_time(SET),
        };
        self.claim_statement(sql, c, Some((old_nonce, stale_ms)))
            .await
    }

    async fn claim_statement(
        &self,
        sql: String,
        c: &ClaimRecord,
        take_over: Option<(&str, Option<i64>)>,
    ) -> Result<bool, RegistryError> {
        with_pool!(self, |pool| {
            let mut q = sqlx::query(AssertSqlSafe(sql))
                .bind(&c.instance_id)
                .bind(&c.nonce)
                .bind(&c.host)
                .bind(c.pid)
                .bind(c.started_at_ms);
            if let Some((nonce, stale_ms)) = take_over {
                q = q.bind(nonce);
                if let Some(stale_ms) = stale_ms {
                    q = q.bind(stale_ms);
                }
            }
            q.execute(pool).await.map(|done| done.rows_affected() == 1)
        })
        .map_err(|e| self.err(e))
    }

    /// Moves the heartbeat of `c`'s claim; `false` when the claim is not `c`'s any more.
    async fn renew_claim(&self, c: &ClaimRecord) -> Result<bool, RegistryError> {
        let sql = self.at_db_time(
            "UPDATE instance_claims SET heartbeat_ms = {now} \
             WHERE instance_id = $1 AND nonce = $2",
        );
        with_pool!(self, |pool| {
            sqlx::query(AssertSqlSafe(sql))
                .bind(&c.instance_id)
                .bind(&c.nonce)
                .execute(pool)
                .await
                .map(|done| done.rows_affected() == 1)
        })
        .map_err(|e| self.err(e))
    }

    /// Deletes `c`'s claim, if it is still `c`'s.
    async fn release_claim(&self, c: &ClaimRecord) -> Result<(), RegistryError> {
        const SQL: &str = "DELETE FROM instance_claims WHERE instance_id = $1 AND nonce = $2";
        with_pool!(self, |pool| {
            sqlx::query(SQL)
                .bind(&c.instance_id)
                .bind(&c.nonce)
                .execute(pool)
                .await
                .map(drop)
        })
        .map_err(|e| self.err(e))
    }
}

fn claim_from_row<R: Row>(row: &R) -> Result<ClaimView, sqlx::Error>
where
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    &'static str: ColumnIndex<R>,
{
    let record = ClaimRecord {
        instance_id: row.try_get("instance_id")?,
        nonce: row.try_get("nonce")?,
        host: row.try_get("host")?,
        pid: row.try_get("pid")?,
        started_at_ms: row.try_get("started_at_ms")?,
        heartbeat_ms: row.try_get("heartbeat_ms")?,
    };
    let now_ms: i64 = row.try_get("now_ms")?;
    let age = u64::try_from(now_ms.saturating_sub(record.heartbeat_ms)).unwrap_or(0);
    Ok(ClaimView {
        record,
        heartbeat_age: Duration::from_millis(age),
    })
}
