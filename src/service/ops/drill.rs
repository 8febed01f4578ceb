//! `Drill` and scheduled drills: the service's side of restore drills (the drill itself is
//! `crate::drill`: the real restore into scratch, checked against the manifest).
//!
//! # What a drill does here
//!
//! - The store must be this instance's (unknown: `NOT_FOUND`; another instance's:
//!   `FAILED_PRECONDITION` naming the owner). Nothing to drill — no restore point, or none
//!   reaching `at_commit_seq` — is `FAILED_PRECONDITION` with the restore's words (the
//!   reachable ranges), and records nothing.
//! - The drill reads the store's destination through a read-only bucket of its own, on the
//!   calling task (the RPC's, or the scheduler's): never the worker's loop, so it never
//!   delays WAL shipping. Its requests are counted into the store's usage (`bucket::usage`,
//!   `ctl cost`): a drill GETs a whole restore point, which the store's bill shows. Drills of one service run one at a time ([`ONE_AT_A_TIME`]): a
//!   call waits for the drill running, so scratch space holds one store at a time.
//! - Its outcome is written to the registry (`store_drills`, `crate::health::DrillResult`),
//!   then into the worker's record, so health shows it ([`crate::health`]: a failed drill
//!   is unhealthy, naming the object, until a drill succeeds) and metrics export it, and a
//!   `DrillFinished` event is published ([`run_one`]). The outcome carries the restore time
//!   predicted before the drill began (`predicted_ms`, at the rates kept for the destination's
//!   endpoint) beside the one measured; a drill that succeeded calibrates those rates
//!   (`crate::service::fleet::rto`). While it runs, health shows its progress.
//! - Scratch lives under `<data dir>/drills/` ([`scratch_root`]), `0700` whatever the umask,
//!   and the drilled store in it `0700`/`0600` (`drill::SCRATCH_MODE`): a drill of an
//!   encrypted store writes its plain bytes there. [`clear_scratch`] removes what a crash
//!   left there when the service starts, before any drill runs.
//!
//! # Scheduled drills
//!
//! A store with `drill_interval_ms` (0 or unset: none; else 1 minute to 30 days,
//! `limits::check_options`) is drilled by one scheduler task ([`schedule`], in the fleet's
//! tracker, ending on the fleet's shutdown token: a drill under way is dropped, and its
//! scratch removed). It looks once a [`TICK`]: a store never drilled is due once it has a
//! restore point; then a drill is due `drill_interval_ms` after the last one ended (the
//! registry's time, so a restart does not drill every store at once). A store whose newest
//! restore point restores more plain bytes than the byte budget (`serve --drill-max-bytes`,
//! [`DrillLimits`]; plain, as its manifest states them, since that is what the drill writes
//! into scratch, not the fewer bytes a compressed store takes in the bucket) is skipped, with
//! a health note saying so, and looked at again an interval later. The
//! budget applies to scheduled drills only: a Drill call is an operator's explicit ask.
//!
//! # What a crash leaves
//!
//! A drill's scratch directory (removed at the next start) and, if the crash came between the
//! registry and the worker, the registry's word, which the next start shows.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::bucket::throttle::TrafficClass;
use crate::drill::{self, DrillError};
use crate::health::DrillResult;
use crate::registry::StoreRecord;
use crate::restore::predict::Measured;
use crate::service::fleet::{Fleet, FleetError, StoreEntry, StoreOptions};
use crate::units::{millis_u64, unix_now_ms};

/// How often the scheduler looks for a drill due.
pub const TICK: Duration = Duration::from_secs(1);
/// A scheduled drill that found nothing to drill (no restore point yet) tries again this soon
/// (or at its interval, if shorter).
pub const RETRY_NOTHING_MS: i64 = 60_000;
/// The longest error a drill records (cut on a character boundary).
pub const MAX_ERROR_BYTES: usize = 2048;

/// Drills of this process, one at a time (see the module docs).
static ONE_AT_A_TIME: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// Where drills restore: `<data dir>/drills`.
pub fn scratch_root(data_dir: &Path) -> PathBuf {
    data_dir.join("drills")
}

/// Removes what earlier processes' drills left in the scratch root (call before any drill).
pub fn clear_scratch(data_dir: &Path) -> std::io::Result<()> {
    drill::clear_scratch(&scratch_root(data_dir))
}

/// `Drill` (see the module docs): the drill's outcome, recorded.
pub async fn drill(
    fleet: &Fleet,
    store_id: &str,
    at: Option<u64>,
    peer: Option<String>,
) -> Result<DrillResult, FleetError> {
    let entry = fleet.get_owned(store_id).await?;
    let result = run_one(fleet, &entry, at).await?;
    let outcome = if result.ok { "ok" } else { "failed" };
    let detail = format!(
        "commit {} from {} in {} ms{}",
        result.commit_seq,
        result.manifest_key,
        result.duration_ms,
        if result.ok {
            String::new()
        } else {
            format!(": {}", result.error)
        }
    );
    fleet
        .audit(
            "drill",
            Some(store_id),
            Some(&entry.record.store_dir),
            outcome,
            detail,
            peer,
        )
        .await;
    Ok(result)
}

/// One drill of `entry`, waiting for its turn: run, recorded in the registry and in health.
async fn run_one(
    fleet: &Fleet,
    entry: &StoreEntry,
    at: Option<u64>,
) -> Result<DrillResult, FleetError> {
    let _turn = ONE_AT_A_TIME
        .acquire()
        .await
        .map_err(|e| FleetError::Internal(format!("the drill semaphore: {e}")))?;
    let store_id = &entry.record.store_id;
    // Its requests are the store's cost (`bucket::usage`), as the worker's are.
    let bucket = fleet
        .buckets()
        .read_only(&entry.record.destination)
        .lane(fleet.store_lane(&entry.record.destination, store_id))
        .class(TrafficClass::Check)
        .usage(entry.usage.clone())
        .open()
        .await?;
    let root = scratch_root(&fleet.config().data_dir);
    let destination = &entry.record.destination;
    let how = drill::DrillOptions {
        keys: fleet.restore_keys(),
        rates: fleet.rto().rates(destination),
        tracker: crate::restore::progress::Progress::new(),
    };
    // Health shows the drill while it runs (`fleet::rto`), from the restore's own counters.
    let watch = fleet.rto().watch_drill(store_id, how.tracker.clone());
    let drilled = match drill::drill(bucket.as_ref(), &root, store_id, at, how).await {
        Ok(d) => d,
        Err(DrillError::Input(e)) => return Err(FleetError::Restore(e)),
        Err(e @ DrillError::Scratch { .. }) => return Err(FleetError::Internal(e.to_string())),
    };
    drop(watch);
    let now = unix_now_ms();
    let ok = drilled.failure.is_none();
    let last_ok = match (ok, entry.handle.last_drill()) {
        (true, _) => now,
        (false, Some(last)) => last.last_ok_at_unix_ms,
        (false, None) => 0,
    };
    let predicted = drilled.report.as_ref().map_or(0.0, |r| r.predicted_seconds);
    let result = DrillResult {
        ok,
        commit_seq: drilled.commit_seq,
        manifest_key: drilled.manifest_key.clone(),
        duration_ms: millis_u64(drilled.restore_time),
        bytes: drilled.bytes,
        error: bounded(drilled.failure.clone().unwrap_or_default()),
        finished_at_unix_ms: now,
        last_ok_at_unix_ms: last_ok,
        predicted_ms: millis_u64(Duration::try_from_secs_f64(predicted).unwrap_or_default()),
    };
    // A drill that restored what its manifest says measured this endpoint's rates.
    if let (true, Some(report), Some(shape)) = (ok, &drilled.report, drilled.shape) {
        let measured = Measured::of(report, shape, crate::service::fleet::rto::PARALLELISM);
        fleet
            .rto()
            .learn(fleet.registry(), destination, &measured)
            .await;
    }
    if ok {
        tracing::info!(store_id, commit_seq = result.commit_seq, manifest = %result.manifest_key, duration_ms = result.duration_ms, predicted_ms = result.predicted_ms, bytes = result.bytes, "a restore drill succeeded");
    } else {
        tracing::error!(store_id, manifest = %result.manifest_key, error = %result.error, "a restore drill failed");
    }
    // The registry first: a crash before the worker shows it leaves the registry's word.
    if let Err(e) = fleet.registry().set_drill(store_id, &result).await {
        tracing::warn!(store_id, error = %e, "cannot record the drill in the registry; it shows until this process stops");
    }
    entry.handle.record_drill(result.clone()).await;
    // Every drill, asked for or scheduled, once its outcome is in the registry and health.
    fleet.events().drill_finished(
        store_id,
        &crate::events::DrillOutcome {
            ok: result.ok,
            commit_seq: result.commit_seq,
            duration_ms: result.duration_ms,
            predicted_ms: result.predicted_ms,
            bytes: result.bytes,
            error: &result.error,
        },
    );
    Ok(result)
}

/// At most [`MAX_ERROR_BYTES`], on one line.
fn bounded(error: String) -> String {
    let one_line: String = error
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if one_line.len() <= MAX_ERROR_BYTES {
        return one_line;
    }
    let mut cut = MAX_ERROR_BYTES;
    while !one_line.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", &one_line[..cut])
}

/// A store's drill interval in ms, if it has one.
fn interval_of(record: &StoreRecord) -> Option<i64> {
    let options = StoreOptions::as_registered(record).ok()?;
    options
        .clamped()
        .drill_interval_ms
        .map(crate::units::i64_of)
}

/// Starts the scheduler (see the module docs) in the fleet's tracker.
pub fn schedule(fleet: Arc<Fleet>) {
    let tasks = fleet.tasks.clone();
    tasks.spawn(scheduler(fleet));
}

async fn scheduler(fleet: Arc<Fleet>) {
    let stop = fleet.shutdown_token().clone();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Options never change once registered: each store's interval is read once.
    let mut intervals: HashMap<String, Option<i64>> = HashMap::new();
    // Stores not to look at before then (skipped by the budget, or nothing to drill).
    let mut not_before: HashMap<String, i64> = HashMap::new();
    let mut ticks: u64 = 0;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        ticks += 1;
        let stores = fleet.list();
        if ticks.is_multiple_of(600) {
            // Forget the deregistered.
            let ids: std::collections::HashSet<&str> =
                stores.iter().map(|e| e.record.store_id.as_str()).collect();
            intervals.retain(|id, _| ids.contains(id.as_str()));
            not_before.retain(|id, _| ids.contains(id.as_str()));
        }
        for entry in stores {
            let id = entry.record.store_id.as_str();
            // No allocation for a store already seen: this runs for every store every tick.
            let interval = match intervals.get(id) {
                Some(i) => *i,
                None => {
                    let i = interval_of(&entry.record);
                    intervals.insert(id.to_string(), i);
                    i
                }
            };
            let Some(interval) = interval else {
                continue;
            };
            let now = unix_now_ms();
            if not_before.get(id).is_some_and(|t| now < *t) {
                continue;
            }
            let due = entry
                .handle
                .last_drill()
                .is_none_or(|d| now >= d.finished_at_unix_ms.saturating_add(interval));
            if !due || entry.handle.health().restore_point_commit_seq == 0 {
                continue;
            }
            let outcome = tokio::select! {
                _ = stop.cancelled() => return,
                o = scheduled(&fleet, &entry, interval) => o,
            };
            if let Some(until) = outcome {
                not_before.insert(id.to_string(), until);
            } else {
                not_before.remove(id);
            }
        }
    }
}

/// One scheduled drill of `entry`, unless over the budget; `Some(t)`: do not look again
/// before `t`.
async fn scheduled(fleet: &Fleet, entry: &StoreEntry, interval: i64) -> Option<i64> {
    let store_id = &entry.record.store_id;
    let max = fleet.config().drill.max_bytes;
    let now = unix_now_ms();
    if max > 0 {
        let opened = fleet
            .buckets()
            .read_only(&entry.record.destination)
            .lane(fleet.store_lane(&entry.record.destination, store_id))
            .class(TrafficClass::Check)
            .usage(entry.usage.clone())
            .open()
            .await;
        let size = match opened {
            Ok(b) => drill::newest_size(b.as_ref()).await.ok().flatten(),
            Err(_) => None,
        };
        if let Some((key, bytes)) = size.filter(|(_, bytes)| *bytes > max) {
            entry.handle.note_drill(Some(format!(
                "scheduled restore drills skip this store: its newest restore point {key} \
                 restores {bytes} bytes, over the drill budget of {max} bytes \
                 (serve --drill-max-bytes)"
            )));
            return Some(now.saturating_add(interval));
        }
    }
    entry.handle.note_drill(None);
    match run_one(fleet, entry, None).await {
        Ok(_) => None,
        Err(e) => {
            tracing::info!(store_id, error = %e, "a scheduled restore drill found nothing to drill");
            Some(now.saturating_add(interval.min(RETRY_NOTHING_MS)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_bounded_and_on_one_line() {
        assert_eq!(bounded("a\nb".into()), "a b");
        let long = "é".repeat(MAX_ERROR_BYTES);
        let cut = bounded(long);
        assert!(
            cut.len() <= MAX_ERROR_BYTES + '…'.len_utf8(),
            "{}",
            cut.len()
        );
        assert!(cut.ends_with('…'));
    }
}
