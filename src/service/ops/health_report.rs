//! The fleet's health reports: this instance's stores' health persisted to the registry, so
//! that every instance sharing it shows the whole fleet, and into `/metrics`
//! ([`report_health`]).
//!
//! # One task, one tick
//!
//! One task walks every store each `health_report_interval` (no timer per store). It writes, in
//! one transaction, the instance's heartbeat and the rows whose health changed since the last
//! written report, and records each changed store's series into `/metrics`
//! (`fleet::store_metrics`) and every store's usage (`usage.rs`).
//!
//! A store whose worker shows the same health serial and counters as at the last written
//! report is passed over without a copy of its health, its JSON or its metrics (all the same as
//! then): a quiet fleet's report costs a few atomic loads and one map lookup per store, and
//! allocates nothing for it.
//!
//! # A start is not the store's health
//!
//! A worker that has not yet learnt its bucket lease's state ([`StoreHealth::starting`]: right
//! after a restart, its first acquisition under way) is unhealthy, "starting", in `Health` and
//! in the registry, as it is. Its `/metrics` gauges are left out meanwhile, rather than showing
//! every store of a restarted instance unhealthy for the seconds until each first evaluation
//! (and the next report after it): a scrape shows a store from its first evaluation after the
//! start. A store still starting a lease TTL after the report first saw it so is recorded as it
//! is (unhealthy), so a store that cannot start still shows. `mushroom_backup_stores_unhealthy`
//! counts the same way.
//!
//! # What a crash leaves
//!
//! The registry holds the last written rows and heartbeat; what this task remembers is memory,
//! and the next process writes every store's row at its first report.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::health::StoreHealth;
use crate::service::fleet::{Fleet, StoreEntry};
use crate::units::unix_now_ms;

/// What [`report_health`] last read of a store's worker: its id, health serial and counters.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Reading {
    /// The worker's id (its lease holder id): another worker is another series of serials.
    worker: Arc<str>,
    health_serial: u64,
    counters: [u64; 4],
}

impl Reading {
    fn counters(handle: &crate::worker::BackupHandle) -> [u64; 4] {
        use std::sync::atomic::Ordering::Relaxed;
        let c = handle.counters();
        [
            c.bytes_shipped.load(Relaxed),
            c.objects_shipped.load(Relaxed),
            c.restore_points.load(Relaxed),
            c.failures.load(Relaxed),
        ]
    }

    fn of(handle: &crate::worker::BackupHandle) -> Reading {
        Reading {
            worker: handle.holder().into(),
            health_serial: handle.health_serial(),
            counters: Self::counters(handle),
        }
    }

    /// Whether `handle` shows what this reading read (without allocating).
    fn same(&self, handle: &crate::worker::BackupHandle) -> bool {
        self.health_serial == handle.health_serial()
            && *self.worker == *handle.holder()
            && self.counters == Self::counters(handle)
    }
}

/// What the report holds of a store as of its last written report.
#[derive(Debug)]
struct Reported {
    reading: Reading,
    /// The health JSON the registry holds for the store, as this task wrote it.
    json: String,
    /// Whether its `/metrics` gauges are out (not a start held back, see the module docs).
    recorded: bool,
    healthy: bool,
    /// The report's tick that last saw the store: a store missing from a tick is forgotten.
    tick: u64,
}

/// A store whose worker showed something new this tick: what to take as reported once the
/// registry write went through.
struct Changed {
    store_id: String,
    reading: Reading,
    json: String,
    recorded: bool,
    healthy: bool,
}

/// What the report task remembers between ticks.
#[derive(Default)]
struct Report {
    stores: HashMap<String, Reported>,
    /// Stores seen starting, and since when (see the module docs); only those.
    starting: HashMap<String, Instant>,
    tick: u64,
}

impl Report {
    /// Whether a store's `/metrics` gauges are held back: it is starting, and has not been
    /// for `grace` since this task first saw it so.
    fn held_back(&mut self, store_id: &str, health: &StoreHealth, grace: Duration) -> bool {
        if !health.starting {
            self.starting.remove(store_id);
            return false;
        }
        let since = *self
            .starting
            .entry(store_id.to_string())
            .or_insert_with(Instant::now);
        since.elapsed() < grace
    }

    /// One tick's look at `entries`: the stores whose worker showed something new (their health
    /// recorded into `/metrics` unless held back), of which `rows` the registry needs, and how
    /// many stores `/metrics` shows unhealthy.
    fn look(&mut self, entries: &[Arc<StoreEntry>], grace: Duration) -> Look {
        self.tick += 1;
        let mut look = Look::default();
        for entry in entries {
            let id = entry.record.store_id.as_str();
            if let Some(r) = self.stores.get_mut(id)
                && r.recorded
                && r.reading.same(&entry.handle)
            {
                r.tick = self.tick;
                look.unhealthy += usize::from(!r.healthy);
                continue;
            }
            let reading = Reading::of(&entry.handle);
            let h = entry.handle.health();
            let recorded = !self.held_back(id, &h, grace);
            if recorded {
                crate::service::fleet::store_metrics::record_store(
                    id,
                    entry.handle.holder(),
                    &h,
                    &entry.handle.counters(),
                );
                look.unhealthy += usize::from(!h.healthy);
            }
            let Ok(json) = serde_json::to_string(&h) else {
                continue;
            };
            if self.stores.get(id).is_none_or(|r| r.json != json) {
                look.rows.push((id.to_string(), json.clone()));
            }
            look.changed.push(Changed {
                store_id: id.to_string(),
                reading,
                json,
                recorded,
                healthy: h.healthy,
            });
        }
        look
    }

    /// The registry holds `look`'s rows now: takes its stores as reported, and forgets every
    /// store this tick did not see.
    fn written(&mut self, look: Look) {
        for c in look.changed {
            self.stores.insert(
                c.store_id,
                Reported {
                    reading: c.reading,
                    json: c.json,
                    recorded: c.recorded,
                    healthy: c.healthy,
                    tick: self.tick,
                },
            );
        }
        let tick = self.tick;
        self.stores.retain(|_, r| r.tick == tick);
        let stores = &self.stores;
        self.starting.retain(|id, _| stores.contains_key(id));
    }
}

/// What one tick found ([`Report::look`]).
#[derive(Default)]
struct Look {
    changed: Vec<Changed>,
    /// `(store_id, health JSON)` of the rows to write.
    rows: Vec<(String, String)>,
    unhealthy: usize,
}

/// Persists this instance's stores' health to the registry every `health_report_interval` and
/// records it into `/metrics`; see the module docs.
pub(in crate::service) async fn report_health(fleet: Arc<Fleet>) {
    let mut tick = tokio::time::interval(fleet.config().health_report_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut report = Report::default();
    // What the metrics were given of each store's usage, and which stores' projected requests
    // were over their budget (`usage.rs`).
    let mut usage = super::usage::UsageReport::default();
    let grace = fleet.config().lease_ttl;
    loop {
        tokio::select! {
            _ = fleet.shutdown_token().cancelled() => return,
            _ = tick.tick() => {}
        }
        let entries = fleet.list();
        let look = report.look(&entries, grace);
        crate::telemetry::record_fleet(entries.len(), look.unhealthy);
        // Requests change on every lease write and step, so usage is looked at every tick.
        usage.tick(&entries, &fleet.config().prices, fleet.events());
        fleet.refresh_branch_charges(&entries);
        crate::service::fleet::store_metrics::record_traffic(fleet.traffic().throttle());
        // Predicted restore times: arithmetic on what the workers hold (`rto_view.rs`).
        for e in &entries {
            let p = super::rto_view::predicted(&fleet, e);
            crate::service::fleet::store_metrics::record_rto(
                &e.record.store_id,
                p.latest,
                p.worst,
                e.options.rto_target_seconds,
            );
        }
        match fleet
            .registry()
            .report_health(&fleet.config().instance_id, unix_now_ms(), &look.rows)
            .await
        {
            Ok(()) => report.written(look),
            Err(e) => tracing::warn!(error = %e, "cannot persist health to the registry"),
        }
    }
}
