//! The per-store series of the metric contract (`crate::telemetry::metrics` names them), set
//! from a store's health and its worker's counters by [`record_store`]: the service calls it
//! periodically for every store it hosts, and [`forget_store`] when one is deregistered.
//!
//! # Counters from cumulative values
//!
//! [`BackupCounters`] are cumulative per worker, and a store's worker may be replaced (a
//! restart, a deregister and register again) by one whose counters start at zero. The
//! `metrics` crate's `absolute` keeps the maximum it has seen, so after such a restart the
//! exported counter would stand still until the new worker passed the old one's total. So
//! [`record_store`] remembers, per store, which worker it last read (by the worker id the
//! caller passes: the lease holder id, unique per worker) and its counters' values, and adds
//! the difference; another worker, or a value below the last one, is a new worker's, whose
//! whole value is added. The exported counters only rise, by what was really done.
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
//! [`forget_store`] hides the store's series from `/metrics`
//! ([`crate::telemetry::hide_store`]); a later [`record_store`] for the same id shows them
//! again, the counters continuing from where they were.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use metrics::{counter, gauge};

use crate::health::StoreHealth;
use crate::telemetry::metrics::{
    STORE_DURABLE_COMMIT_SEQ, STORE_FAILURES, STORE_HEALTHY, STORE_ID_LABEL, STORE_LAG_SECONDS,
    STORE_LAST_DRILL_BYTES, STORE_LAST_DRILL_DURATION, STORE_LAST_DRILL_OK,
    STORE_LAST_DRILL_SUCCESS_TIMESTAMP, STORE_LAST_RESTORE_POINT_TIMESTAMP, STORE_LEASE_HELD,
    STORE_LEASE_HELD_ELSEWHERE, STORE_LOGICAL_BYTES, STORE_PAUSED, STORE_RESTORE_POINT_COMMIT_SEQ,
    STORE_RESTORE_POINTS, STORE_SHIPPED_BYTES, STORE_SHIPPED_COMMIT_SEQ, STORE_SHIPPED_OBJECTS,
};
use crate::telemetry::{hide_store, show_store};
use crate::worker::BackupCounters;

/// What [`record_store`] remembers of a store between calls.
#[derive(Debug, Default, Clone, PartialEq)]
struct Seen {
    /// The id of the worker read last: another one is another worker.
    worker: String,
    shipped_bytes: u64,
    logical_bytes: u64,
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

fn seen() -> MutexGuard<'static, Option<HashMap<String, Seen>>> {
    SEEN.lock().unwrap_or_else(|e| e.into_inner())
}

fn flag(b: bool) -> f64 {
    if b { 1.0 } else { 0.0 }
}

/// Records one store's health and its worker's counters; `worker` identifies the worker
/// (see the module docs).
pub fn record_store(store_id: &str, worker: &str, health: &StoreHealth, counters: &BackupCounters) {
    if !crate::telemetry::recording() {
        // No recorder: every series would be a no-op, its labels allocated for nothing.
        return;
    }
    show_store(store_id);
    let label = [(STORE_ID_LABEL, store_id.to_string())];
    let held_elsewhere = !health.lease_held && !health.lease_holder.is_empty();
    gauge!(STORE_LAG_SECONDS, &label).set(health.lag_seconds);
    gauge!(STORE_HEALTHY, &label).set(flag(health.healthy));
    gauge!(STORE_DURABLE_COMMIT_SEQ, &label).set(health.durable_commit_seq as f64);
    gauge!(STORE_SHIPPED_COMMIT_SEQ, &label).set(health.shipped_commit_seq as f64);
    gauge!(STORE_RESTORE_POINT_COMMIT_SEQ, &label).set(health.restore_point_commit_seq as f64);
    gauge!(STORE_LEASE_HELD, &label).set(flag(health.lease_held));
    gauge!(STORE_LEASE_HELD_ELSEWHERE, &label).set(flag(held_elsewhere));
    gauge!(STORE_PAUSED, &label).set(flag(health.paused.is_some()));
    if let Some(d) = &health.last_drill {
        gauge!(STORE_LAST_DRILL_OK, &label).set(flag(d.ok));
        gauge!(STORE_LAST_DRILL_DURATION, &label).set(d.duration_ms as f64 / 1000.0);
        gauge!(STORE_LAST_DRILL_BYTES, &label).set(d.bytes as f64);
        if d.last_ok_at_unix_ms > 0 {
            gauge!(STORE_LAST_DRILL_SUCCESS_TIMESTAMP, &label)
                .set(d.last_ok_at_unix_ms as f64 / 1000.0);
        }
    }

    let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let logical = load(&counters.bytes_logical);
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
        if s.worker != worker {
            *s = Seen {
                worker: worker.to_string(),
                restore_point_commit_seq: s.restore_point_commit_seq,
                ..Seen::default()
            };
        }
        let grown = [
            growth(&mut s.shipped_bytes, bytes),
            growth(&mut s.shipped_objects, objects),
            growth(&mut s.restore_points, points),
            growth(&mut s.failures, failures),
            growth(&mut s.logical_bytes, logical),
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
        STORE_LOGICAL_BYTES,
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

/// Records a store's predicted restore times (`point` `latest` and `worst`) and its target,
/// when it has one. Nothing before the worker knows a restore point (a prediction of 0).
pub fn record_rto(store_id: &str, latest: f64, worst: f64, target: Option<u64>) {
    use crate::telemetry::metrics::{POINT_LABEL, PREDICTED_RTO, RTO_TARGET};
    if !crate::telemetry::recording() || latest <= 0.0 {
        return;
    }
    for (point, v) in [("latest", latest), ("worst", worst)] {
        let labels = [
            (STORE_ID_LABEL, store_id.to_string()),
            (POINT_LABEL, point.to_string()),
        ];
        gauge!(PREDICTED_RTO, &labels).set(v);
    }
    if let Some(t) = target.filter(|t| *t > 0) {
        gauge!(RTO_TARGET, &[(STORE_ID_LABEL, store_id.to_string())]).set(t as f64);
    }
}

/// Records each traffic class's limit and measured rate: the instance's (`throttle`) and every
/// store's scope held now.
pub fn record_traffic(throttle: &crate::bucket::throttle::Throttle) {
    use crate::bucket::throttle::TrafficClass;
    use crate::telemetry::metrics::{
        CLASS_LABEL, STORE_TRAFFIC_LIMIT, STORE_TRAFFIC_RATE, TRAFFIC_LIMIT, TRAFFIC_RATE,
    };
    if !crate::telemetry::recording() {
        return;
    }
    let (limits, measured) = (throttle.limits(), throttle.measured());
    for c in TrafficClass::ALL {
        let labels = [(CLASS_LABEL, c.name().to_string())];
        gauge!(TRAFFIC_LIMIT, &labels).set(limits.get(c).bytes_per_second as f64);
        gauge!(TRAFFIC_RATE, &labels).set(measured[c as usize].bytes_per_second);
    }
    for store in throttle.stores() {
        let (limits, measured) = (store.limits(), store.measured());
        for c in TrafficClass::ALL {
            let labels = [
                (STORE_ID_LABEL, store.name().to_string()),
                (CLASS_LABEL, c.name().to_string()),
            ];
            gauge!(STORE_TRAFFIC_LIMIT, &labels).set(limits.get(c).bytes_per_second as f64);
            gauge!(STORE_TRAFFIC_RATE, &labels).set(measured[c as usize].bytes_per_second);
        }
    }
}

/// Forgets a deregistered store: its series disappear from `/metrics` (see the module docs).
///
/// What [`record_store`] remembers of the store is kept, so a late record of the same worker
/// does not count its totals twice.
pub fn forget_store(store_id: &str) {
    hide_store(store_id);
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
}
