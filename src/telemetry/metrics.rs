//! The metric contract: names, labels and meaning that dashboards and alert rules rely on.
//! Renaming one, or adding a label of high cardinality, breaks them.
//!
//! Per store, label `store_id` only, set by [`record_store`] (the service calls it
//! periodically for every store it hosts):
//!
//! | name | type | unit | from |
//! | --- | --- | --- | --- |
//! | `mushroom_backup_store_lag_seconds` | gauge | seconds | [`StoreHealth::lag_seconds`] |
//! | `mushroom_backup_store_healthy` | gauge | 0/1 | [`StoreHealth::healthy`] |
//! | `mushroom_backup_store_durable_commit_seq` | gauge | commits | [`StoreHealth::durable_commit_seq`] |
//! | `mushroom_backup_store_shipped_commit_seq` | gauge | commits | [`StoreHealth::shipped_commit_seq`] |
//! | `mushroom_backup_store_restore_point_commit_seq` | gauge | commits | [`StoreHealth::restore_point_commit_seq`] |
//! | `mushroom_backup_store_lease_held` | gauge | 0/1 | [`StoreHealth::lease_held`] |
//! | `mushroom_backup_store_lease_held_elsewhere` | gauge | 0/1 | not held here and a holder is named |
//! | `mushroom_backup_store_last_restore_point_timestamp_seconds` | gauge | unix seconds | see below |
//! | `mushroom_backup_store_shipped_bytes_total` | counter | bytes | [`BackupCounters::bytes_shipped`] |
//! | `mushroom_backup_store_shipped_objects_total` | counter | objects | [`BackupCounters::objects_shipped`] |
//! | `mushroom_backup_store_restore_points_total` | counter | restore points | [`BackupCounters::restore_points`] |
//! | `mushroom_backup_store_failures_total` | counter | failed steps | [`BackupCounters::failures`] |
//!
//! Fleet, no labels, set by [`record_fleet`]: `mushroom_backup_stores` (stores hosted) and
//! `mushroom_backup_stores_unhealthy`.
//!
//! Bucket requests, labels `op` (`get`, `get_range`, `head`, `put`, `delete`, `list`) and
//! `outcome` (`ok`, `not_found`, `precondition_failed`, `conflict`, `transient`,
//! `permanent`, `cancelled`, `crashed`), recorded by
//! [`MeteredBucket`](crate::bucket::metered::MeteredBucket):
//! `mushroom_backup_bucket_request_duration_seconds` (histogram, [`BUCKET_DURATION_BUCKETS`])
//! and `mushroom_backup_bucket_requests_total` (counter).
//!
//! # Counters from cumulative values
//!
//! [`BackupCounters`] are cumulative per worker, and a store's worker may be replaced (a
//! restart, a deregister and register again) by one whose counters start at zero. The
//! `metrics` crate's `absolute` keeps the maximum it has seen, so after such a restart the
//! exported counter would stand still until the new worker passed the old one's total. So
//! [`record_store`] remembers, per store, which `BackupCounters` it last read (by address)
//! and their values, and adds the difference; other counters, or a value below the last one,
//! are a new worker's, whose whole value is added. The exported counters only rise, by what
//! was really done.
//!
//! # The last restore point's time
//!
//! Neither [`StoreHealth`] nor [`BackupCounters`] carries when the newest restore point was
//! written, so `…_last_restore_point_timestamp_seconds` is the wall-clock time at which
//! [`record_store`] first saw the store's restore point commit seq change (or its
//! `restore_points` counter rise). It is absent until then: a process that resumed a prefix
//! with an older restore point does not know that point's time. Its precision is the
//! service's recording period.
//!
//! # Forgetting a store
//!
//! The `metrics` crate cannot delete a series. [`forget_store`] hides every series labelled with its `store_id` from `/metrics` (so a
//! deregistered store neither alerts nor shows as stale data); a later [`record_store`] for
//! the same id shows them again, the counters continuing from where they were. The hidden
//! series still take a little memory in the recorder: one entry per metric and store ever
//! registered in the process's life.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard, RwLock};

use metrics::{Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge};

use crate::health::StoreHealth;
use crate::worker::BackupCounters;

pub const STORE_LAG_SECONDS: &str = "mushroom_backup_store_lag_seconds";
pub const STORE_HEALTHY: &str = "mushroom_backup_store_healthy";
pub const STORE_DURABLE_COMMIT_SEQ: &str = "mushroom_backup_store_durable_commit_seq";
pub const STORE_SHIPPED_COMMIT_SEQ: &str = "mushroom_backup_store_shipped_commit_seq";
pub const STORE_RESTORE_POINT_COMMIT_SEQ: &str = "mushroom_backup_store_restore_point_commit_seq";
pub const STORE_LEASE_HELD: &str = "mushroom_backup_store_lease_held";
pub const STORE_LEASE_HELD_ELSEWHERE: &str = "mushroom_backup_store_lease_held_elsewhere";
pub const STORE_LAST_RESTORE_POINT_TIMESTAMP: &str =
    "mushroom_backup_store_last_restore_point_timestamp_seconds";
pub const STORE_SHIPPED_BYTES: &str = "mushroom_backup_store_shipped_bytes_total";
pub const STORE_SHIPPED_OBJECTS: &str = "mushroom_backup_store_shipped_objects_total";
pub const STORE_RESTORE_POINTS: &str = "mushroom_backup_store_restore_points_total";
pub const STORE_FAILURES: &str = "mushroom_backup_store_failures_total";
pub const STORES: &str = "mushroom_backup_stores";
pub const STORES_UNHEALTHY: &str = "mushroom_backup_stores_unhealthy";
pub const BUCKET_REQUEST_DURATION: &str = "mushroom_backup_bucket_request_duration_seconds";
pub const BUCKET_REQUESTS: &str = "mushroom_backup_bucket_requests_total";

/// The label of every per-store series.
pub const STORE_ID_LABEL: &str = "store_id";

/// Histogram buckets of bucket request durations, seconds: from a local-directory HEAD to a
/// large multipart upload.
pub const BUCKET_DURATION_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// Describes every metric of the contract (help text and unit) to the installed recorder.
pub fn describe() {
    let g = |name: &'static str, unit: Option<Unit>, help: &'static str| match unit {
        Some(u) => describe_gauge!(name, u, help),
        None => describe_gauge!(name, help),
    };
    g(
        STORE_LAG_SECONDS,
        Some(Unit::Seconds),
        "How long durable commits have been waiting to be shipped (0 when all are shipped).",
    );
    g(
        STORE_HEALTHY,
        None,
        "1 when the store's backup is healthy, 0 when not (the health API names the reason).",
    );
    g(
        STORE_DURABLE_COMMIT_SEQ,
        Some(Unit::Count),
        "The newest commit durable in the store, as the WAL source reports it.",
    );
    g(
        STORE_SHIPPED_COMMIT_SEQ,
        Some(Unit::Count),
        "The newest commit shipped to the bucket in a WAL segment.",
    );
    g(
        STORE_RESTORE_POINT_COMMIT_SEQ,
        Some(Unit::Count),
        "The commit of the newest restore point this worker wrote or found.",
    );
    g(
        STORE_LEASE_HELD,
        None,
        "1 while this instance holds the store's bucket lease.",
    );
    g(
        STORE_LEASE_HELD_ELSEWHERE,
        None,
        "1 while another instance holds the store's bucket lease (this one uploads nothing).",
    );
    g(
        STORE_LAST_RESTORE_POINT_TIMESTAMP,
        Some(Unit::Seconds),
        "Unix time at which this process saw the store's newest restore point appear.",
    );
    describe_counter!(
        STORE_SHIPPED_BYTES,
        Unit::Bytes,
        "Bytes uploaded for the store (segments, snapshots, archives, side files)."
    );
    describe_counter!(
        STORE_SHIPPED_OBJECTS,
        Unit::Count,
        "Objects uploaded for the store."
    );
    describe_counter!(
        STORE_RESTORE_POINTS,
        Unit::Count,
        "Restore points written for the store."
    );
    describe_counter!(
        STORE_FAILURES,
        Unit::Count,
        "Backup steps of the store that failed."
    );
    describe_gauge!(STORES, Unit::Count, "Stores this instance hosts.");
    describe_gauge!(
        STORES_UNHEALTHY,
        Unit::Count,
        "Stores this instance hosts whose backup is unhealthy."
    );
    describe_histogram!(
        BUCKET_REQUEST_DURATION,
        Unit::Seconds,
        "Duration of bucket (object store) requests, by operation and outcome."
    );
    describe_counter!(
        BUCKET_REQUESTS,
        Unit::Count,
        "Bucket (object store) requests, by operation and outcome."
    );
}

/// What [`record_store`] remembers of a store between calls.
#[derive(Debug, Default, Clone, PartialEq)]
struct Seen {
    /// The address of the [`BackupCounters`] read last: another one is another worker.
    counters: usize,
    shipped_bytes: u64,
    shipped_objects: u64,
    restore_points: u64,
    failures: u64,
    restore_point_commit_seq: Option<u64>,
}

/// How much a cumulative counter grew since `last`; a smaller value is a new worker's total.
fn growth(last: &mut u64, now: u64) -> u64 {
    let grown = if now >= *last { now - *last } else { now };
    *last = now;
    grown
}

static SEEN: Mutex<Option<HashMap<String, Seen>>> = Mutex::new(None);
static FORGOTTEN: RwLock<Option<HashSet<String>>> = RwLock::new(None);

fn seen() -> MutexGuard<'static, Option<HashMap<String, Seen>>> {
    SEEN.lock().unwrap_or_else(|e| e.into_inner())
}

fn unforget(store_id: &str) {
    let forgotten = FORGOTTEN.read().unwrap_or_else(|e| e.into_inner());
    if !forgotten.as_ref().is_some_and(|f| f.contains(store_id)) {
        return;
    }
    drop(forgotten);
    if let Some(f) = FORGOTTEN
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .as_mut()
    {
        f.remove(store_id);
    }
}

fn flag(b: bool) -> f64 {
    if b { 1.0 } else { 0.0 }
}

/// Records one store's health and counters; see the module docs for each series.
pub fn record_store(store_id: &str, health: &StoreHealth, counters: &BackupCounters) {
    unforget(store_id);
    let label = [(STORE_ID_LABEL, store_id.to_string())];
    let held_elsewhere = !health.lease_held && !health.lease_holder.is_empty();
    gauge!(STORE_LAG_SECONDS, &label).set(health.lag_seconds);
    gauge!(STORE_HEALTHY, &label).set(flag(health.healthy));
    gauge!(STORE_DURABLE_COMMIT_SEQ, &label).set(health.durable_commit_seq as f64);
    gauge!(STORE_SHIPPED_COMMIT_SEQ, &label).set(health.shipped_commit_seq as f64);
    gauge!(STORE_RESTORE_POINT_COMMIT_SEQ, &label).set(health.restore_point_commit_seq as f64);
    gauge!(STORE_LEASE_HELD, &label).set(flag(health.lease_held));
    gauge!(STORE_LEASE_HELD_ELSEWHERE, &label).set(flag(held_elsewhere));

    let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    let (bytes, objects, points, failures) = (
        load(&counters.bytes_shipped),
        load(&counters.objects_shipped),
        load(&counters.restore_points),
        load(&counters.failures),
    );
    let (grown, new_restore_point) = {
        let mut all = seen();
        let s = all
            .get_or_insert_with(HashMap::new)
            .entry(store_id.to_string())
            .or_default();
        let identity = counters as *const BackupCounters as usize;
        if s.counters != identity {
            *s = Seen {
                counters: identity,
                restore_point_commit_seq: s.restore_point_commit_seq,
                ..Seen::default()
            };
        }
        let grown = [
            growth(&mut s.shipped_bytes, bytes),
            growth(&mut s.shipped_objects, objects),
            growth(&mut s.restore_points, points),
            growth(&mut s.failures, failures),
        ];
        let seq = health.restore_point_commit_seq;
        let new_restore_point = match s.restore_point_commit_seq.replace(seq) {
            Some(last) => last != seq || grown[2] > 0,
            // The first look: a restore point this worker wrote is new; one it found is not.
            None => grown[2] > 0,
        };
        (grown, new_restore_point)
    };
    for (name, n) in [
        STORE_SHIPPED_BYTES,
        STORE_SHIPPED_OBJECTS,
        STORE_RESTORE_POINTS,
        STORE_FAILURES,
    ]
    .into_iter()
    .zip(grown)
    {
        // Registered even at zero, so every store has every series from its first record.
        counter!(name, &label).increment(n);
    }
    if new_restore_point && health.restore_point_commit_seq > 0 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        gauge!(STORE_LAST_RESTORE_POINT_TIMESTAMP, &label).set(now);
    }
}

/// Forgets a deregistered store: its series disappear from `/metrics` (see the module docs).
///
/// What [`record_store`] remembers of the store is kept, so a late record of the same worker
/// does not count its totals twice.
pub fn forget_store(store_id: &str) {
    FORGOTTEN
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashSet::new)
        .insert(store_id.to_string());
}

/// Records the fleet: stores hosted, and how many of them are unhealthy.
pub fn record_fleet(stores: usize, unhealthy: usize) {
    gauge!(STORES).set(stores as f64);
    gauge!(STORES_UNHEALTHY).set(unhealthy as f64);
}

/// `text` (the Prometheus text format) without the samples of forgotten stores.
pub(super) fn hide_forgotten(text: String) -> String {
    let forgotten = FORGOTTEN.read().unwrap_or_else(|e| e.into_inner());
    let Some(ids) = forgotten.as_ref().filter(|f| !f.is_empty()) else {
        return text;
    };
    let needles: Vec<String> = ids
        .iter()
        .map(|id| format!("{STORE_ID_LABEL}=\"{}\"", escape_label_value(id)))
        .collect();
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let is_sample = !line.starts_with('#');
        if is_sample && needles.iter().any(|n| line.contains(n.as_str())) {
            continue;
        }
        out.push_str(line);
    }
    out
}

/// A label value as the text format writes it.
fn escape_label_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_adds_differences_and_a_restart_adds_its_whole_value() {
        let mut last = 0;
        assert_eq!(growth(&mut last, 10), 10);
        assert_eq!(growth(&mut last, 10), 0);
        assert_eq!(growth(&mut last, 25), 15);
        // A new worker, counting from zero again.
        assert_eq!(growth(&mut last, 4), 4);
        assert_eq!(growth(&mut last, 9), 5);
    }

    #[test]
    fn hidden_stores_lose_their_samples_and_nothing_else() {
        forget_store("gone\"x");
        let text = "# HELP m help\n# TYPE m gauge\nm{store_id=\"keep\"} 1\n\
                    m{store_id=\"gone\\\"x\"} 2\nm{store_id=\"gone\\\"xy\"} 3\n";
        let out = hide_forgotten(text.to_string());
        assert_eq!(
            out,
            "# HELP m help\n# TYPE m gauge\nm{store_id=\"keep\"} 1\nm{store_id=\"gone\\\"xy\"} 3\n"
        );
        unforget("gone\"x");
        assert_eq!(hide_forgotten(text.to_string()), text);
    }
}
