//! The metric contract: names, labels and meaning that dashboards and alert rules rely on.
//! Renaming one, or adding a label of high cardinality, breaks them.
//!
//! This module holds the names, their help text ([`describe`]) and what needs no knowledge of
//! the layers above telemetry: the fleet gauges ([`record_fleet`]) and the hiding of a store's
//! series ([`hide_store`]). The per-store series are set by the service (its `store_metrics`
//! module, which reads a store's health and its worker's counters).
//!
//! Per store, label `store_id` ([`STORE_ID_LABEL`]) only:
//!
//! | name | type | unit | from |
//! | --- | --- | --- | --- |
//! | `mushroom_backup_store_lag_seconds` | gauge | seconds | the store health's `lag_seconds` |
//! | `mushroom_backup_store_healthy` | gauge | 0/1 | the store health's `healthy` |
//! | `mushroom_backup_store_durable_commit_seq` | gauge | commits | `durable_commit_seq` |
//! | `mushroom_backup_store_shipped_commit_seq` | gauge | commits | `shipped_commit_seq` |
//! | `mushroom_backup_store_restore_point_commit_seq` | gauge | commits | `restore_point_commit_seq` |
//! | `mushroom_backup_store_lease_held` | gauge | 0/1 | `lease_held` |
//! | `mushroom_backup_store_lease_held_elsewhere` | gauge | 0/1 | not held here and a holder is named |
//! | `mushroom_backup_store_paused` | gauge | 0/1 | the store health's `paused` (an operator's Pause) |
//! | `mushroom_backup_store_last_restore_point_timestamp_seconds` | gauge | unix seconds | when this process saw the newest restore point appear |
//! | `mushroom_backup_store_last_drill_ok` | gauge | 0/1 | the last restore drill's outcome (absent until a drill) |
//! | `mushroom_backup_store_last_drill_success_timestamp_seconds` | gauge | unix seconds | when a drill of the store last succeeded (absent until one did) |
//! | `mushroom_backup_store_last_drill_duration_seconds` | gauge | seconds | the last drill's measured restore time |
//! | `mushroom_backup_store_last_drill_bytes` | gauge | bytes | bytes the last drill restored (as stored) |
//! | `mushroom_backup_predicted_rto_seconds` | gauge, label `point` (`latest`, `worst`) | seconds | the predicted restore time of the newest / the worst retained restore point (`StoreHealth.predicted_rto_*`; absent until the worker knows a restore point) |
//! | `mushroom_backup_rto_target_seconds` | gauge | seconds | the store's `rto_target_seconds` (absent when it has none) |
//! | `mushroom_backup_store_traffic_limit_bytes_per_second` | gauge, label `class` | bytes/s | the store's own limit of the class (0: none; `crate::bucket::throttle`) |
//! | `mushroom_backup_store_traffic_rate_bytes_per_second` | gauge, label `class` | bytes/s | what the store's requests of the class moved over the last 10 s |
//! | `mushroom_backup_store_shipped_bytes_total` | counter | bytes | the worker's `bytes_shipped`: store data as stored (compressed) |
//! | `mushroom_backup_store_logical_bytes_total` | counter | bytes | the worker's `bytes_logical`: the plain bytes of the same objects |
//! | `mushroom_backup_store_shipped_objects_total` | counter | objects | the worker's `objects_shipped` |
//! | `mushroom_backup_store_restore_points_total` | counter | restore points | the worker's `restore_points` |
//! | `mushroom_backup_store_failures_total` | counter | failed steps | the worker's `failures` |
//! | `mushroom_backup_store_requests_total` | counter, label `op` (`put`, `get`, `list`, `head`, `delete`) | requests | the store's bucket usage: every attempt its worker, lease and retention sent |
//! | `mushroom_backup_store_uploaded_bytes_total` | counter | bytes | bodies sent, every attempt |
//! | `mushroom_backup_store_downloaded_bytes_total` | counter | bytes | bodies received |
//! | `mushroom_backup_store_stored_bytes` | gauge | bytes | what the worker knows is under its prefix |
//! | `mushroom_backup_store_estimated_monthly_cost_usd` | gauge | dollars | the month projected at the price table (`crate::cost`) |
//!
//! Events, set by `crate::events`: `mushroom_backup_events_published_total{kind}` and
//! `mushroom_backup_webhook_deliveries_total{webhook,outcome}` (`webhook`: the URL's host and
//! port; `outcome`: `ok`, `failed`, `rejected`, `dropped`).
//!
//! Fleet, no labels, set by [`record_fleet`]: `mushroom_backup_stores` (stores hosted) and
//! `mushroom_backup_stores_unhealthy`. The instance's traffic, label `class` (`wal`, `bulk`,
//! `restore`, `check`, `housekeeping`): `mushroom_backup_traffic_limit_bytes_per_second` (the
//! limit in force, 0: none) and `mushroom_backup_traffic_rate_bytes_per_second` (the last 10 s).
//!
//! Bucket requests, labels `op` (`get`, `get_range`, `head`, `put`, `delete`, `list`) and
//! `outcome` (`ok`, `not_found`, `precondition_failed`, `conflict`, `transient`,
//! `permanent`, `cancelled`, `crashed`), recorded by the bucket layer's `MeteredBucket`:
//! `mushroom_backup_bucket_request_duration_seconds` (histogram, [`BUCKET_DURATION_BUCKETS`])
//! and `mushroom_backup_bucket_requests_total` (counter).
//!
//! # Hiding a store
//!
//! The `metrics` crate cannot delete a series. [`hide_store`] hides every series labelled
//! with a `store_id` from `/metrics` (so a deregistered store neither alerts nor shows as
//! stale data); [`show_store`] shows them again, counters continuing from where they were.
//! The hidden series still take a little memory in the recorder: one entry per metric and
//! store ever registered in the process's life.

use std::collections::HashSet;
use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, Ordering};

use metrics::{Unit, describe_counter, describe_gauge, describe_histogram, gauge};

pub const STORE_LAG_SECONDS: &str = "mushroom_backup_store_lag_seconds";
pub const STORE_HEALTHY: &str = "mushroom_backup_store_healthy";
pub const STORE_DURABLE_COMMIT_SEQ: &str = "mushroom_backup_store_durable_commit_seq";
pub const STORE_SHIPPED_COMMIT_SEQ: &str = "mushroom_backup_store_shipped_commit_seq";
pub const STORE_RESTORE_POINT_COMMIT_SEQ: &str = "mushroom_backup_store_restore_point_commit_seq";
pub const STORE_LEASE_HELD: &str = "mushroom_backup_store_lease_held";
pub const STORE_LEASE_HELD_ELSEWHERE: &str = "mushroom_backup_store_lease_held_elsewhere";
pub const STORE_PAUSED: &str = "mushroom_backup_store_paused";
pub const STORE_LAST_RESTORE_POINT_TIMESTAMP: &str =
    "mushroom_backup_store_last_restore_point_timestamp_seconds";
pub const STORE_LAST_DRILL_OK: &str = "mushroom_backup_store_last_drill_ok";
pub const STORE_LAST_DRILL_SUCCESS_TIMESTAMP: &str =
    "mushroom_backup_store_last_drill_success_timestamp_seconds";
pub const STORE_LAST_DRILL_DURATION: &str = "mushroom_backup_store_last_drill_duration_seconds";
pub const STORE_LAST_DRILL_BYTES: &str = "mushroom_backup_store_last_drill_bytes";
pub const PREDICTED_RTO: &str = "mushroom_backup_predicted_rto_seconds";
pub const RTO_TARGET: &str = "mushroom_backup_rto_target_seconds";
pub const STORE_TRAFFIC_LIMIT: &str = "mushroom_backup_store_traffic_limit_bytes_per_second";
pub const STORE_TRAFFIC_RATE: &str = "mushroom_backup_store_traffic_rate_bytes_per_second";
pub const TRAFFIC_LIMIT: &str = "mushroom_backup_traffic_limit_bytes_per_second";
pub const TRAFFIC_RATE: &str = "mushroom_backup_traffic_rate_bytes_per_second";
/// The label of the traffic series: a traffic class's name.
pub const CLASS_LABEL: &str = "class";
/// The label of [`PREDICTED_RTO`]: `latest` or `worst`.
pub const POINT_LABEL: &str = "point";
pub const STORE_SHIPPED_BYTES: &str = "mushroom_backup_store_shipped_bytes_total";
pub const STORE_LOGICAL_BYTES: &str = "mushroom_backup_store_logical_bytes_total";
pub const STORE_SHIPPED_OBJECTS: &str = "mushroom_backup_store_shipped_objects_total";
pub const STORE_RESTORE_POINTS: &str = "mushroom_backup_store_restore_points_total";
pub const STORE_FAILURES: &str = "mushroom_backup_store_failures_total";
pub const STORE_REQUESTS: &str = "mushroom_backup_store_requests_total";
pub const STORE_UPLOADED_BYTES: &str = "mushroom_backup_store_uploaded_bytes_total";
pub const STORE_DOWNLOADED_BYTES: &str = "mushroom_backup_store_downloaded_bytes_total";
pub const STORE_STORED_BYTES: &str = "mushroom_backup_store_stored_bytes";
pub const STORE_ESTIMATED_MONTHLY_COST: &str = "mushroom_backup_store_estimated_monthly_cost_usd";
pub const STORES: &str = "mushroom_backup_stores";
pub const STORES_UNHEALTHY: &str = "mushroom_backup_stores_unhealthy";
pub const BUCKET_REQUEST_DURATION: &str = "mushroom_backup_bucket_request_duration_seconds";
pub const BUCKET_REQUESTS: &str = "mushroom_backup_bucket_requests_total";
// Events (`crate::events`).
pub const EVENTS_PUBLISHED: &str = "mushroom_backup_events_published_total";
pub const WEBHOOK_DELIVERIES: &str = "mushroom_backup_webhook_deliveries_total";
pub const EVENTS_UNLOGGED: &str = "mushroom_backup_events_unlogged_total";

/// The label of every per-store series.
pub const STORE_ID_LABEL: &str = "store_id";

/// Histogram buckets of bucket request durations, seconds: from a local-directory HEAD to a
/// large multipart upload.
pub const BUCKET_DURATION_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// Describes every metric of the contract (help text and unit) to the installed recorder.
pub fn describe() {
    describe_store_state();
    describe_store_drills();
    describe_store_traffic();
    describe_instance();
    describe_events();
}

/// Describes one gauge, with its unit when it has one.
fn g(name: &'static str, unit: Option<Unit>, help: &'static str) {
    match unit {
        Some(u) => describe_gauge!(name, u, help),
        None => describe_gauge!(name, help),
    }
}

/// The per-store gauges of where its backup stands: lag, health, commits, lease, pause, newest
/// restore point.
fn describe_store_state() {
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
        STORE_PAUSED,
        None,
        "1 while an operator's Pause stops the store's uploads (the health API names the reason and deadline).",
    );
    g(
        STORE_LAST_RESTORE_POINT_TIMESTAMP,
        Some(Unit::Seconds),
        "Unix time at which this process saw the store's newest restore point appear.",
    );
}

/// The per-store gauges of its last restore drill.
fn describe_store_drills() {
    g(
        STORE_LAST_DRILL_OK,
        None,
        "1 when the store's last restore drill succeeded, 0 when it failed (the health API names the object).",
    );
    g(
        STORE_LAST_DRILL_SUCCESS_TIMESTAMP,
        Some(Unit::Seconds),
        "Unix time at which a restore drill of the store last succeeded.",
    );
    g(
        STORE_LAST_DRILL_DURATION,
        Some(Unit::Seconds),
        "The measured restore time of the store's last restore drill.",
    );
    g(
        STORE_LAST_DRILL_BYTES,
        Some(Unit::Bytes),
        "Bytes the store's last restore drill restored, as stored.",
    );
    for (name, what) in [
        (
            STORE_TRAFFIC_LIMIT,
            "The store's own limit of a traffic class (0: none).",
        ),
        (
            STORE_TRAFFIC_RATE,
            "Bytes a second the store's requests of a traffic class moved over the last 10 s.",
        ),
        (
            TRAFFIC_LIMIT,
            "The instance's limit of a traffic class in force (0: none).",
        ),
        (
            TRAFFIC_RATE,
            "Bytes a second the instance's requests of a traffic class moved over the last 10 s.",
        ),
    ] {
        g(name, None, what);
    }
    g(
        PREDICTED_RTO,
        Some(Unit::Seconds),
        "The predicted end-to-end restore time of the store's newest (point=latest) and worst retained (point=worst) restore point.",
    );
    g(
        RTO_TARGET,
        Some(Unit::Seconds),
        "The store's rto_target_seconds option: the restore time it must stay under.",
    );
}

/// The per-store series of what its worker sent and stored: requests, bytes, cost, objects,
/// restore points, failures.
fn describe_store_traffic() {
    describe_counter!(
        STORE_REQUESTS,
        Unit::Count,
        "Requests the store's worker (its lease and retention too) sent to its bucket, every \
         attempt, by billing class (op)."
    );
    describe_counter!(
        STORE_UPLOADED_BYTES,
        Unit::Bytes,
        "Bytes of request bodies sent to the store's bucket, every attempt."
    );
    describe_counter!(
        STORE_DOWNLOADED_BYTES,
        Unit::Bytes,
        "Bytes of object bodies read from the store's bucket."
    );
    g(
        STORE_STORED_BYTES,
        Some(Unit::Bytes),
        "Bytes the store's worker knows are stored under its prefix (its listings, uploads, deletes).",
    );
    g(
        STORE_ESTIMATED_MONTHLY_COST,
        None,
        "The store's monthly cost in US dollars projected from its requests since the worker started and its stored bytes, at the service's price table.",
    );
    describe_counter!(
        STORE_SHIPPED_BYTES,
        Unit::Bytes,
        "Bytes uploaded for the store (segments, snapshots, archives, side files), as stored \
         (after compression)."
    );
    describe_counter!(
        STORE_LOGICAL_BYTES,
        Unit::Bytes,
        "Plain bytes of the objects uploaded for the store (before compression)."
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
}

/// The instance-wide series: stores hosted, and every bucket request.
fn describe_instance() {
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

/// The series of events (`crate::events`): published, delivered to webhooks, not logged.
fn describe_events() {
    describe_counter!(
        EVENTS_PUBLISHED,
        Unit::Count,
        "Events published on the event bus, by kind."
    );
    describe_counter!(
        WEBHOOK_DELIVERIES,
        Unit::Count,
        "Webhook deliveries by webhook (its host) and outcome: ok, failed (an attempt, retried), \
         rejected (a 4xx, given up)."
    );
    describe_counter!(
        EVENTS_UNLOGGED,
        Unit::Count,
        "Events the registry's event log did not take (it failed, or too many waited): sent to \
         live watchers without a position, never replayed nor posted to webhooks."
    );
}

static HIDDEN: RwLock<Option<HashSet<String>>> = RwLock::new(None);

/// Set once the Prometheus recorder is installed ([`recording`]).
static RECORDING: AtomicBool = AtomicBool::new(false);

/// Whether metrics are recorded (`--metrics-listen`): without a recorder every `metrics` call
/// is a no-op, yet building a per-store series' key allocates its labels, so the service's
/// per-store recording (10,000 stores every few seconds) asks this first and skips the work.
pub fn recording() -> bool {
    RECORDING.load(Ordering::Acquire)
}

/// Called once the recorder is installed (`prometheus.rs`).
pub(super) fn set_recording() {
    RECORDING.store(true, Ordering::Release);
}

/// Hides every series labelled `store_id="<store_id>"` from `/metrics` (see the module docs).
pub fn hide_store(store_id: &str) {
    HIDDEN
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashSet::new)
        .insert(store_id.to_string());
}

/// Shows a store's series again after [`hide_store`]; cheap (a read lock) when it is not
/// hidden.
pub fn show_store(store_id: &str) {
    let hidden = HIDDEN.read().unwrap_or_else(|e| e.into_inner());
    if !hidden.as_ref().is_some_and(|f| f.contains(store_id)) {
        return;
    }
    drop(hidden);
    if let Some(f) = HIDDEN.write().unwrap_or_else(|e| e.into_inner()).as_mut() {
        f.remove(store_id);
    }
}

/// Records the fleet: stores hosted, and how many of them are unhealthy.
pub fn record_fleet(stores: usize, unhealthy: usize) {
    gauge!(STORES).set(stores as f64);
    gauge!(STORES_UNHEALTHY).set(unhealthy as f64);
}

/// `text` (the Prometheus text format) without the samples of hidden stores.
pub(super) fn without_hidden(text: String) -> String {
    let hidden = HIDDEN.read().unwrap_or_else(|e| e.into_inner());
    let Some(ids) = hidden.as_ref().filter(|f| !f.is_empty()) else {
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
    fn hidden_stores_lose_their_samples_and_nothing_else() {
        hide_store("gone\"x");
        let text = "# HELP m help\n# TYPE m gauge\nm{store_id=\"keep\"} 1\n\
                    m{store_id=\"gone\\\"x\"} 2\nm{store_id=\"gone\\\"xy\"} 3\n";
        let out = without_hidden(text.to_string());
        assert_eq!(
            out,
            "# HELP m help\n# TYPE m gauge\nm{store_id=\"keep\"} 1\nm{store_id=\"gone\\\"xy\"} 3\n"
        );
        show_store("gone\"x");
        assert_eq!(without_hidden(text.to_string()), text);
    }
}
