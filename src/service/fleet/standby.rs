//! A standby store ([`StoreOptions::standby`](super::StoreOptions), issue 28): the service
//! keeps the store's directory current from its destination with the standby library
//! (`crate::standby`, what `restore --follow` runs), one follower task per standby store, on
//! the fleet's tracker, with a cancellation token of the store's own (a child of the
//! service's shutdown).
//!
//! # Invariants
//! - A standby never writes to its destination: its bucket is opened read-only, it has no
//!   backup worker and takes no bucket lease (the prefix's writer keeps its own). Locally it
//!   writes only its directory (and holds its `store.lock` while following, so no node opens
//!   it), as `crate::standby` says.
//! - A standby is hosted in the role of a standby (`hosted.rs`), never as a primary: every
//!   call that needs a backup worker finds no worker and is refused naming why
//!   ([`FleetError::IsStandby`]).
//!   What each call does with a standby:
//!   - **Pause / Resume / Trigger / Drill**: refused (FAILED_PRECONDITION): a standby uploads
//!     nothing, so there is nothing to pause or trigger, and a drill of its destination is the
//!     primary's business. Stop following with Deregister; promote it to back it up.
//!   - **Move**: refused: its directory is on this host; register a standby on the other
//!     host instead (it restores from the bucket). **Drain** moves the primaries and leaves
//!     the standbys where they are.
//!   - A **failover claim** (the owner went silent) starts the follower on the claiming
//!     instance, as it starts a primary's worker there; the instance that lost it stops its
//!     follower.
//!   - **Deregister**: stops the follower (waiting for it to end: the directory is left as the
//!     last apply left it, a valid store), then deletes the row. `flush` has nothing to flush.
//!     Refused while a promotion of the store is under way (it ends as a primary or a
//!     standby; deregister that).
//!   - **Promote** (`promote.rs`): stops the follower, fences the old writer, catches up,
//!     adopts the prefix, then starts the store's backup worker as a primary's.
//! - A standby whose prefix moved to another lineage, or whose LATEST names another lineage
//!   as its adopter (the primary was promoted elsewhere, or adopted away), stops applying and
//!   stays unhealthy naming why until deregistered: it never applies another history.
//!
//! # What it does not do (yet)
//! - Its health is not written into the registry's health reports: another instance of a
//!   shared registry answers `Health` of a standby (not `fresh`) as never reported; ask its
//!   owner (`fresh`), which forwards.
//! - Registering a standby of a destination a store of the same registry backs up is refused
//!   as two stores sharing a destination (`conflicts.rs`): the standby belongs to another
//!   service (another registry), as a disaster-recovery copy does.
//!
//! # Lag
//! As of the follower's last poll of the destination (one LIST, `crate::standby::poll`):
//! - **commits**: the commits that poll found shipped past what the standby held: what the
//!   apply it triggered brought in (0 when the poll found nothing new);
//! - **seconds**: how long the oldest object that poll found (a segment, or a later
//!   generation's first object) had been in the bucket (its `Last-Modified`, the bucket's
//!   clock, against this host's) when it was applied, or until now while it is not applied
//!   yet (an apply that failed); 0 when the poll found nothing new.
//!
//! So a standby keeping up with a busy primary shows about one segment's commits and the
//! WAL interval plus a poll; an idle one 0 and 0. Polls come every second while there is news
//! and slow down to every 15 s on a quiet prefix (`crate::standby`'s defaults).
//!
//! # What it costs
//! One LIST a poll (240 an hour on an idle prefix), a GET per new segment, a restore per new
//! generation, and one GET of LATEST at most every idle poll interval (15 s) while the prefix
//! is quiet, to see a promotion elsewhere (240 an hour more on an idle prefix).
//!
//! # What a crash leaves
//! What `crate::standby` leaves at any apply step: a directory that opens as a valid store;
//! the next start of the service respawns the follower from the registry row (a standby row
//! stays a standby), which takes the directory up where it stands.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::admission::conflicts::Intent;
use super::admission::limits::{self, FieldError};
use super::admission::paths;
use super::{Done, Fleet, FleetError, NewStore, StoreOptions};
use crate::bucket::DynBucket;
use crate::registry::StoreRecord;
use crate::service::proto;
use crate::standby::{ApplyKind, ApplyReport, PollPace, StandbyError, StandbyOptions, Stepper};

/// Consecutive failed polls (after the bucket's own retries) before a standby is unhealthy.
const UNHEALTHY_AFTER_FAILURES: u32 = 3;

/// A registered standby and its follower.
pub struct StandbyEntry {
    pub record: StoreRecord,
    /// As registered (the options its worker runs with once promoted).
    pub options: StoreOptions,
    state: Arc<Mutex<FollowState>>,
    /// Bumped on every change of `state` (for `WatchHealth`'s marks).
    serial: Arc<AtomicU64>,
    /// Stops the follower.
    cancel: CancellationToken,
    /// Cancelled by the follower when it has ended (its directory lock released).
    ended: CancellationToken,
    /// Held by a promotion of this store (one at a time).
    pub(super) promoting: tokio::sync::Mutex<()>,
}

/// What the follower last saw and did.
#[derive(Debug, Clone, Default, PartialEq)]
struct FollowState {
    /// The commit the directory holds (once in place).
    commit_seq: u64,
    last_apply: String,
    lag_commits: u64,
    lag: Lag,
    /// Why it stopped applying for good (unhealthy until deregistered or promoted).
    stopped: Option<String>,
    last_error: Option<String>,
    consecutive_failures: u32,
}

/// The lag in seconds (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
enum Lag {
    #[default]
    None,
    /// Applied after waiting this long in the bucket.
    Applied { ms: i64 },
    /// Found, not applied yet: in the bucket since this instant (unix ms).
    Pending { since_ms: i64 },
}

impl Lag {
    fn seconds(self, now_ms: i64) -> f64 {
        let ms = match self {
            Lag::None => 0,
            Lag::Applied { ms } => ms,
            Lag::Pending { since_ms } => now_ms - since_ms,
        };
        ms.max(0) as f64 / 1000.0
    }
}

impl StandbyEntry {
    /// What changes when the standby's health does.
    pub fn mark(&self) -> u64 {
        self.serial.load(Ordering::Relaxed)
    }

    /// Stops the follower and waits until it has ended (its directory lock released).
    pub async fn stop(&self) {
        self.cancel.cancel();
        self.ended.cancelled().await;
    }

    /// The standby's health: the store's fields, `role = "standby"` and its lag.
    pub fn health(&self, instance_id: &str) -> proto::StoreHealth {
        let s = self.state.lock().expect("not poisoned").clone();
        let now = crate::units::unix_now_ms();
        let mut reasons = Vec::new();
        if let Some(why) = &s.stopped {
            reasons.push(why.clone());
        }
        if s.stopped.is_none() && s.consecutive_failures >= UNHEALTHY_AFTER_FAILURES {
            reasons.push(format!(
                "the standby's last {} polls of its destination failed: {}",
                s.consecutive_failures,
                s.last_error.as_deref().unwrap_or("?")
            ));
        }
        proto::StoreHealth {
            store_id: self.record.store_id.clone(),
            store_dir: self.record.store_dir.clone(),
            destination: self.record.destination.clone(),
            instance_id: instance_id.to_string(),
            owner_instance_id: self.record.instance_id.clone(),
            owner_since_unix_ms: self.record.owner_since_ms,
            reported_at_unix_ms: now,
            healthy: reasons.is_empty(),
            reason: reasons.first().cloned().unwrap_or_default(),
            reasons,
            consecutive_failures: s.consecutive_failures,
            last_error: s.last_error.unwrap_or_default(),
            role: "standby".into(),
            standby_lag_commits: s.lag_commits,
            standby_lag_seconds: s.lag.seconds(now),
            standby_last_apply: s.last_apply,
            standby_commit_seq: s.commit_seq,
            ..Default::default()
        }
    }
}

/// The follower's side of the state.
#[derive(Clone)]
struct Reporter {
    state: Arc<Mutex<FollowState>>,
    serial: Arc<AtomicU64>,
}

impl Reporter {
    fn update(&self, f: impl FnOnce(&mut FollowState)) {
        let mut s = self.state.lock().expect("not poisoned");
        let before = s.clone();
        f(&mut s);
        if *s != before {
            self.serial.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// An apply: `behind` the commits it brought in, `oldest_ms` the oldest object found.
    fn applied(&self, r: &ApplyReport, behind: u64, oldest_ms: Option<i64>) {
        let now = crate::units::unix_now_ms();
        self.update(|s| {
            s.commit_seq = r.at.commit_seq;
            s.last_apply = describe(r);
            s.lag_commits = behind;
            s.lag = match oldest_ms {
                Some(t) => Lag::Applied { ms: now - t },
                None => Lag::None,
            };
            s.last_error = None;
            s.consecutive_failures = 0;
        });
    }

    /// A poll that found nothing to apply (`found` objects listed: a later generation without
    /// its restore point yet, say).
    fn quiet(&self, found: usize, oldest_ms: Option<i64>) {
        self.update(|s| {
            s.lag_commits = 0;
            s.lag = match (found, oldest_ms) {
                (0, _) | (_, None) => Lag::None,
                (_, Some(t)) => Lag::Pending { since_ms: t },
            };
            if found == 0 {
                s.last_apply = format!("caught up at commit {}", s.commit_seq);
            }
            s.last_error = None;
            s.consecutive_failures = 0;
        });
    }

    fn failed(&self, e: &dyn std::fmt::Display) {
        self.update(|s| {
            s.last_error = Some(e.to_string());
            s.consecutive_failures = s.consecutive_failures.saturating_add(1);
        });
    }

    fn stopped(&self, why: String) {
        self.update(|s| s.stopped = Some(why));
    }
}

/// What an apply did, as health shows it.
fn describe(r: &ApplyReport) -> String {
    let at = &r.at;
    match r.applied {
        ApplyKind::Restored => format!(
            "restored generation {} at commit {}",
            at.generation, at.commit_seq
        ),
        ApplyKind::Resumed => format!(
            "resumed the directory at commit {} (generation {})",
            at.commit_seq, at.generation
        ),
        ApplyKind::Segments => format!(
            "applied {} segments up to commit {} (generation {})",
            r.segments, at.commit_seq, at.generation
        ),
        ApplyKind::Generation => format!(
            "restored generation {} at commit {}",
            at.generation, at.commit_seq
        ),
    }
}

/// Errors that end a standby for good (the rest are retried at the next poll).
fn is_final(e: &StandbyError) -> bool {
    matches!(
        e,
        StandbyError::LineageChanged { .. }
            | StandbyError::Diverged { .. }
            | StandbyError::NotAStore { .. }
            | StandbyError::InUse { .. }
            | StandbyError::BadOption(_)
    )
}

impl Fleet {
    /// Starts the follower of a standby `record` (see the module docs) and lists it.
    pub(super) async fn spawn_standby(
        &self,
        record: StoreRecord,
        options: StoreOptions,
    ) -> Result<Arc<StandbyEntry>, FleetError> {
        let dir = paths::check_store_dir(&record.store_dir, &self.config.allow_roots)?;
        let bucket = self.buckets.read_only(&record.destination).open().await?;
        let opts = StandbyOptions {
            keys: self.restore_keys(),
            ..StandbyOptions::default()
        };
        let reporter = Reporter {
            state: Arc::new(Mutex::new(FollowState {
                last_apply: "starting".into(),
                ..Default::default()
            })),
            serial: Arc::new(AtomicU64::new(1)),
        };
        let cancel = self.shutdown.child_token();
        let ended = CancellationToken::new();
        let entry = Arc::new(StandbyEntry {
            record,
            options,
            state: reporter.state.clone(),
            serial: reporter.serial.clone(),
            cancel: cancel.clone(),
            ended: ended.clone(),
            promoting: tokio::sync::Mutex::new(()),
        });
        let follower = Follower {
            bucket,
            dir,
            opts,
            cancel,
            reporter,
            store_id: entry.record.store_id.clone(),
        };
        self.tasks.spawn(async move {
            let _ended = ended.drop_guard();
            follower.run().await;
        });
        self.hosted.insert(
            &entry.record.store_id,
            super::Hosted::Standby(entry.clone()),
        );
        Ok(entry)
    }

    /// Deregisters a standby: its follower stopped (see `standby.rs`), its row deleted.
    pub(super) async fn deregister_standby(
        &self,
        store_id: &str,
        peer: Option<String>,
    ) -> Result<(), FleetError> {
        let Some(entry) = self.standby(store_id) else {
            return Err(FleetError::NotHere(store_id.to_string()));
        };
        // Not while it is being promoted: the promotion ends as a primary or a standby.
        let Ok(_one) = entry.promoting.try_lock() else {
            return Err(super::PromoteError::InProgress(store_id.to_string()).into());
        };
        self.remove_standby(store_id).await;
        self.registry.delete_store(store_id).await?;
        let done = Done::on(
            "deregister",
            &entry.record,
            "a standby: its follower stopped".into(),
            peer,
        );
        self.record(done, Some(super::deregistered(store_id, false)))
            .await;
        Ok(())
    }

    /// A standby this instance runs.
    pub fn standby(&self, store_id: &str) -> Option<Arc<StandbyEntry>> {
        self.hosted.standby(store_id)
    }

    /// Every standby this instance runs.
    pub fn standbys(&self) -> Vec<Arc<StandbyEntry>> {
        self.hosted.standbys()
    }

    /// Takes a standby out of the fleet, its follower stopped.
    pub(super) async fn remove_standby(&self, store_id: &str) -> Option<Arc<StandbyEntry>> {
        let entry = self.hosted.remove_standby(store_id)?;
        entry.stop().await;
        Some(entry)
    }
}

/// The checks a standby's registration adds ([`Fleet`]'s `check_new`): not through Adopt,
/// no replica (a standby writes nowhere), and a directory that exists (`dir`, resolved).
pub(super) fn check(new: &NewStore, dir: &Path, intent: Intent) -> Result<(), FleetError> {
    if !new.options.is_standby() {
        return Ok(());
    }
    if intent == Intent::Adopt {
        return Err(FieldError(
            "options.standby: Adopt restores a store to back it up; register a standby \
             (Register with options.standby) to follow a destination"
                .into(),
        )
        .into());
    }
    if !dir.is_dir() {
        return Err(FieldError(format!(
            "store_dir {}: {}: a standby's directory must exist (empty, to be restored \
             into, or a standby of this destination already)",
            limits::quote(&new.store_dir),
            match dir.exists() {
                true => "is not a directory",
                false => "is missing",
            }
        ))
        .into());
    }
    if new.options.replica().is_some() {
        return Err(FieldError(
            "options.standby: a standby writes to no destination, so it has no replica; \
             register the replica once it is promoted"
                .into(),
        )
        .into());
    }
    Ok(())
}

/// One standby's follower task.
struct Follower {
    bucket: DynBucket,
    dir: PathBuf,
    opts: StandbyOptions,
    cancel: CancellationToken,
    reporter: Reporter,
    store_id: String,
}

impl Follower {
    async fn run(self) {
        let Some(mut stepper) = self.start().await else {
            return;
        };
        let mut pace = PollPace::new(&self.opts);
        let mut latest_read: Option<Instant> = None;
        loop {
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                _ = tokio::time::sleep(pace.wait()) => {}
            }
            let before = stepper.at().commit_seq;
            let stepped = tokio::select! {
                _ = self.cancel.cancelled() => return,
                r = stepper.step(self.bucket.as_ref(), &self.dir, &self.opts) => r,
            };
            match stepped {
                Ok(polled) => match &polled.applied {
                    Some(r) => {
                        let behind = r.at.commit_seq.saturating_sub(before);
                        self.reporter.applied(r, behind, polled.oldest_found_ms);
                        pace.news();
                    }
                    None => {
                        self.reporter.quiet(polled.found, polled.oldest_found_ms);
                        pace.nothing();
                        let due =
                            latest_read.is_none_or(|t| t.elapsed() >= self.opts.idle_poll_interval);
                        if due {
                            latest_read = Some(Instant::now());
                            if let Some(why) = self.adopted_away(stepper.at().lineage).await {
                                return self.stop(why);
                            }
                        }
                    }
                },
                Err(e) if is_final(&e) => return self.stop(e.to_string()),
                Err(e) => {
                    tracing::warn!(store_id = %self.store_id, error = %e, "standby: a poll failed; retrying");
                    self.reporter.failed(&e);
                    pace.failed();
                }
            }
        }
    }

    /// Restores or takes up the directory, retried until it is in place (a prefix with no
    /// restore point yet, a bucket down), or `None` when stopped.
    async fn start(&self) -> Option<Stepper> {
        let mut wait = self.opts.poll_interval;
        loop {
            let started = tokio::select! {
                _ = self.cancel.cancelled() => return None,
                r = Stepper::start(self.bucket.as_ref(), &self.dir, &self.opts) => r,
            };
            match started {
                Ok((stepper, r)) => {
                    tracing::info!(store_id = %self.store_id, commit_seq = r.at.commit_seq, generation = r.at.generation, "standby in place");
                    self.reporter.applied(&r, 0, None);
                    return Some(stepper);
                }
                Err(StandbyError::Cancelled) => return None,
                Err(e) if is_final(&e) => {
                    self.stop(e.to_string());
                    return None;
                }
                Err(e) => {
                    tracing::warn!(store_id = %self.store_id, error = %e, "standby: not in place yet; retrying");
                    self.reporter.failed(&e);
                }
            }
            tokio::select! {
                _ = self.cancel.cancelled() => return None,
                _ = tokio::time::sleep(wait) => {}
            }
            wait = (wait * 2).min(self.opts.idle_poll_interval);
        }
    }

    /// Why the standby must stop, when LATEST names another lineage as its adopter (one GET);
    /// a read that fails is the next quiet poll's to retry.
    async fn adopted_away(&self, ours: uuid::Uuid) -> Option<String> {
        let c = crate::standby::promote::claimed(self.bucket.as_ref())
            .await
            .ok()??;
        (c.adopter != ours).then(|| {
            format!(
                "the primary was promoted or adopted away: LATEST gives restore point {} \
                 (lineage {}) to lineage {}; this standby follows lineage {ours} and stops \
                 applying (deregister it, or register a new standby to follow the new primary)",
                c.manifest, c.lineage, c.adopter
            )
        })
    }

    fn stop(&self, why: String) {
        tracing::error!(store_id = %self.store_id, %why, "standby stopped applying");
        self.reporter.stopped(why);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::standby::Applied;

    fn report(kind: ApplyKind, commit_seq: u64, segments: usize) -> ApplyReport {
        ApplyReport {
            applied: kind,
            at: Applied {
                lineage: uuid::Uuid::nil(),
                generation: 3,
                wal_end: 100,
                commit_seq,
                manifest: "manifests/1.json".into(),
            },
            segments,
            unix_ms: 0,
        }
    }

    fn reporter() -> Reporter {
        Reporter {
            state: Arc::new(Mutex::new(FollowState::default())),
            serial: Arc::new(AtomicU64::new(0)),
        }
    }

    #[test]
    fn the_lag_is_the_last_polls_and_falls_to_zero_on_a_poll_without_news() {
        let r = reporter();
        let now = crate::units::unix_now_ms();
        r.applied(&report(ApplyKind::Segments, 130, 2), 10, Some(now - 1500));
        let s = r.state.lock().unwrap().clone();
        assert_eq!(s.lag_commits, 10);
        let secs = s.lag.seconds(now);
        assert!((1.4..3.0).contains(&secs), "{secs}");
        assert_eq!(
            s.last_apply,
            "applied 2 segments up to commit 130 (generation 3)"
        );
        let serial = r.serial.load(Ordering::Relaxed);

        // Found, not applied (a generation without its restore point): the wait grows.
        r.quiet(1, Some(now - 10_000));
        let s = r.state.lock().unwrap().clone();
        assert_eq!(s.lag_commits, 0);
        assert!(s.lag.seconds(now + 5_000) >= 15.0);
        assert!(r.serial.load(Ordering::Relaxed) > serial);

        r.quiet(0, None);
        let s = r.state.lock().unwrap().clone();
        assert_eq!((s.lag_commits, s.lag.seconds(now)), (0, 0.0));
        assert_eq!(s.last_apply, "caught up at commit 130");
        // The same state again is no change.
        let serial = r.serial.load(Ordering::Relaxed);
        r.quiet(0, None);
        assert_eq!(r.serial.load(Ordering::Relaxed), serial);
    }

    #[test]
    fn failures_make_a_standby_unhealthy_only_after_a_few_and_a_stop_for_good() {
        let r = reporter();
        let entry = StandbyEntry {
            record: StoreRecord {
                store_id: "s".into(),
                store_dir: "/d".into(),
                destination: "s3://b/p".into(),
                labels: Default::default(),
                options: serde_json::json!({"standby": true}),
                node_token_hash: String::new(),
                instance_id: "i".into(),
                registered_at_ms: 0,
                owner_since_ms: 0,
            },
            options: StoreOptions::default(),
            state: r.state.clone(),
            serial: r.serial.clone(),
            cancel: CancellationToken::new(),
            ended: CancellationToken::new(),
            promoting: tokio::sync::Mutex::new(()),
        };
        r.failed(&"the bucket is down");
        let h = entry.health("i");
        assert!(h.healthy && h.role == "standby", "{h:?}");
        assert_eq!(h.last_error, "the bucket is down");
        for _ in 1..UNHEALTHY_AFTER_FAILURES {
            r.failed(&"the bucket is down");
        }
        let h = entry.health("i");
        assert!(
            !h.healthy && h.reason.contains("the bucket is down"),
            "{h:?}"
        );
        r.applied(&report(ApplyKind::Restored, 7, 0), 0, None);
        assert!(entry.health("i").healthy);
        assert_eq!(
            entry.health("i").standby_last_apply,
            "restored generation 3 at commit 7"
        );
        r.stopped("the prefix went to lineage x".into());
        let h = entry.health("i");
        assert!(
            !h.healthy && h.reason == "the prefix went to lineage x",
            "{h:?}"
        );
    }
}
