//! The fleet's health reports: this instance's stores' health persisted to the registry, so
//! that every instance sharing it shows the whole fleet ([`report_health`]).

use std::sync::Arc;

use crate::service::fleet::Fleet;
use crate::units::unix_now_ms;

/// What [`report_health`] last saw of a store's worker: its id, health serial and counters.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Shown {
    /// The worker's id (its lease holder id): another worker is another series of serials.
    worker: Arc<str>,
    health_serial: u64,
    counters: [u64; 4],
}

impl Shown {
    fn of(handle: &crate::worker::BackupHandle) -> Shown {
        use std::sync::atomic::Ordering::Relaxed;
        let c = handle.counters();
        Shown {
            worker: handle.holder().into(),
            health_serial: handle.health_serial(),
            counters: [
                c.bytes_shipped.load(Relaxed),
                c.objects_shipped.load(Relaxed),
                c.restore_points.load(Relaxed),
                c.failures.load(Relaxed),
            ],
        }
    }
}

/// Persists this instance's stores' health to the registry every `health_report_interval`, so
/// that every instance sharing the registry shows the whole fleet: in one transaction, a
/// heartbeat and the rows whose health changed since the last report that was written.
/// A store whose worker shows the same health serial and counters as at the last written
/// report is passed over without a copy of its health, its JSON or its metrics (all the same as
/// then): a quiet fleet's report costs a few atomic loads per store.
pub(in crate::service) async fn report_health(fleet: Arc<Fleet>) {
    let mut tick = tokio::time::interval(fleet.config().health_report_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // What the registry holds for each store, as far as this task wrote it.
    let mut written: std::collections::HashMap<String, String> = Default::default();
    // What each store's worker showed at the last report: while it shows the same, its health,
    // counters and metrics are what they were, and it costs no copy, no JSON, no metric.
    let mut shown: std::collections::HashMap<String, Shown> = Default::default();
    // What the metrics were given of each store's usage, and which stores' projected requests
    // were over their budget (`usage.rs`).
    let mut usage = super::usage::UsageReport::default();
    loop {
        tokio::select! {
            _ = fleet.shutdown_token().cancelled() => return,
            _ = tick.tick() => {}
        }
        let entries = fleet.list();
        let unhealthy = entries.iter().filter(|e| !e.handle.healthy()).count();
        crate::telemetry::record_fleet(entries.len(), unhealthy);
        // Requests change on every lease write and step, so usage is recorded every tick:
        // priced once, into the metrics and the budget watch.
        usage.tick(&entries, &fleet.config().prices, fleet.events());
        let mut changed = Vec::new();
        // Taken as shown once the report is written.
        let mut seen = Vec::new();
        for entry in &entries {
            let now = Shown::of(&entry.handle);
            if shown.get(&entry.record.store_id) == Some(&now) {
                continue;
            }
            seen.push((entry.record.store_id.clone(), now));
            let h = entry.handle.health();
            let (id, worker) = (&entry.record.store_id, entry.handle.holder());
            crate::service::fleet::store_metrics::record_store(
                id,
                worker,
                &h,
                &entry.handle.counters(),
            );
            let Ok(json) = serde_json::to_string(&h) else {
                continue;
            };
            if written.get(&entry.record.store_id) != Some(&json) {
                changed.push((entry.record.store_id.clone(), json));
            }
        }
        match fleet
            .registry()
            .report_health(&fleet.config().instance_id, unix_now_ms(), &changed)
            .await
        {
            Ok(()) => {
                let live: std::collections::HashSet<&str> =
                    entries.iter().map(|e| e.record.store_id.as_str()).collect();
                written.retain(|id, _| live.contains(id.as_str()));
                shown.retain(|id, _| live.contains(id.as_str()));
                shown.extend(seen);
                written.extend(changed);
            }
            Err(e) => tracing::warn!(error = %e, "cannot persist health to the registry"),
        }
    }
}
