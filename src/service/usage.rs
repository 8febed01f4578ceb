//! A store's cost as the API, `/metrics` and the budget see it: its worker's
//! [`Usage`](crate::bucket::usage::Usage) (counted at the bucket, under the retry layer, so
//! every request its worker, lease and retention send, retries included) priced by the
//! service's [`Prices`] ([`crate::cost`]).
//!
//! Not a store's: the instance lease (one object per lease root, shared by every store there;
//! `crate::lease::instance`), and the read-only opens of `ListRestorePoints`, Adopt's read
//! phase and restores. A store's restore drills are its own (`super::drill` opens them
//! counted into its usage). A store another instance owns has no usage here.
//!
//! # The request budget
//!
//! A store's `options.monthly_request_budget` (0: none) is compared with the projected
//! requests a month ([`crate::cost::estimate`]); a projection over it is a health note (the
//! store stays healthy) and `Usage.over_budget`. [`BudgetWatch`] sees a store cross into its
//! budget's overrun once per crossing and publishes a `budget_exceeded` event then (on the
//! fleet's bus, at the health report's tick): a store that stays over is not published again
//! until its projection came back within the budget. What a crash leaves: nothing; the next
//! process starts counting anew, and publishes again if its projection is over.
//!
//! # Metrics
//!
//! [`record_usage`] adds what a store's usage grew by since its last call to
//! `mushroom_backup_store_requests_total{store_id,op}` and the bytes counters, and sets the
//! stored-bytes and estimate gauges. A new worker (its usage a new object) starts from zero
//! and its whole count is added, so the counters only rise (as in `store_metrics`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use metrics::{counter, gauge};

use super::fleet::StoreEntry;
use super::proto;
use crate::bucket::usage::{RequestClass, Usage, UsageSnapshot};
use crate::cost::{self, Estimate, Prices};
use crate::events::{Bus, EventKind, Facts, NewEvent};
use crate::telemetry::metrics::{
    STORE_DOWNLOADED_BYTES, STORE_ESTIMATED_MONTHLY_COST, STORE_ID_LABEL, STORE_REQUESTS,
    STORE_STORED_BYTES, STORE_UPLOADED_BYTES,
};

/// A store's usage now, its estimate, and its budget note if the projection is over budget.
pub struct Priced {
    pub snapshot: UsageSnapshot,
    pub estimate: Estimate,
    pub budget: u64,
    pub note: Option<String>,
}

pub fn priced(e: &StoreEntry, prices: &Prices) -> Priced {
    let snapshot = e.usage.snapshot();
    let estimate = cost::estimate(&snapshot, prices);
    let budget = e.options.monthly_request_budget.unwrap_or(0);
    Priced {
        snapshot,
        estimate,
        budget,
        note: cost::budget_note(&estimate, budget),
    }
}

impl Priced {
    pub fn proto(&self) -> proto::Usage {
        let s = &self.snapshot;
        proto::Usage {
            put_requests: s.put,
            get_requests: s.get,
            list_requests: s.list,
            head_requests: s.head,
            delete_requests: s.delete,
            bytes_uploaded: s.bytes_uploaded,
            bytes_downloaded: s.bytes_downloaded,
            bytes_stored: s.bytes_stored,
            objects_stored: s.objects_stored,
            projected_monthly_requests: self.estimate.monthly_requests,
            estimated_monthly_cost_usd: self.estimate.monthly_usd,
            requests_monthly_cost_usd: self.estimate.requests_usd,
            storage_monthly_cost_usd: self.estimate.storage_usd,
            since_unix_ms: s.since_unix_ms,
            window_ms: s.window_ms,
            monthly_request_budget: self.budget,
            over_budget: self.note.is_some(),
        }
    }
}

/// Which stores' projections were over budget at the last look; see the module docs.
#[derive(Default)]
pub(super) struct BudgetWatch {
    over: HashMap<String, bool>,
}

impl BudgetWatch {
    /// Looks at every store of `entries`: a store whose projection went over its budget since
    /// the last look is published on `bus` (once per crossing: a store over it at the last look
    /// too is not published again; one that came back within it is, when it crosses again).
    pub fn look(&mut self, entries: &[Arc<StoreEntry>], prices: &Prices, bus: &Bus) {
        let mut now = HashMap::with_capacity(entries.len());
        for e in entries {
            let p = priced(e, prices);
            let over = p.note.is_some();
            let id = &e.record.store_id;
            if over && !self.over.get(id).copied().unwrap_or(false) {
                tracing::warn!(
                    store_id = %id,
                    projected = p.estimate.monthly_requests,
                    budget = p.budget,
                    "the store's projected requests a month are over its budget"
                );
                bus.publish(
                    NewEvent::new(
                        EventKind::BudgetExceeded,
                        id,
                        format!(
                            "projected {} requests a month, over the budget of {} \
                             (options.monthly_request_budget)",
                            p.estimate.monthly_requests, p.budget
                        ),
                    )
                    .with(Facts {
                        count: Some(p.estimate.monthly_requests),
                        ..Facts::default()
                    }),
                );
            }
            now.insert(id.clone(), over);
        }
        self.over = now;
    }
}

/// What [`record_usage`] last saw of a store: which usage, and its counts then.
struct Seen {
    usage: Weak<Usage>,
    counts: [u64; 7],
}

static SEEN: Mutex<Option<HashMap<String, Seen>>> = Mutex::new(None);

fn counts(s: &UsageSnapshot) -> [u64; 7] {
    [
        s.put,
        s.get,
        s.list,
        s.head,
        s.delete,
        s.bytes_uploaded,
        s.bytes_downloaded,
    ]
}

/// Records one store's usage into `/metrics`; see the module docs.
pub fn record_usage(e: &StoreEntry, prices: &Prices) {
    let p = priced(e, prices);
    let now = counts(&p.snapshot);
    let grown = {
        let mut all = SEEN.lock().unwrap_or_else(|e| e.into_inner());
        let all = all.get_or_insert_with(HashMap::new);
        let seen = all
            .entry(e.record.store_id.clone())
            .or_insert_with(|| Seen {
                usage: Arc::downgrade(&e.usage),
                counts: [0; 7],
            });
        if !Weak::ptr_eq(&seen.usage, &Arc::downgrade(&e.usage)) {
            *seen = Seen {
                usage: Arc::downgrade(&e.usage),
                counts: [0; 7],
            };
        }
        let mut grown = [0; 7];
        for (i, g) in grown.iter_mut().enumerate() {
            *g = now[i].saturating_sub(seen.counts[i]);
        }
        seen.counts = now;
        grown
    };
    let id = e.record.store_id.clone();
    for (i, class) in RequestClass::ALL.iter().enumerate() {
        let labels = [
            (STORE_ID_LABEL, id.clone()),
            ("op", class.name().to_string()),
        ];
        counter!(STORE_REQUESTS, &labels).increment(grown[i]);
    }
    let label = [(STORE_ID_LABEL, id)];
    counter!(STORE_UPLOADED_BYTES, &label).increment(grown[5]);
    counter!(STORE_DOWNLOADED_BYTES, &label).increment(grown[6]);
    gauge!(STORE_STORED_BYTES, &label).set(p.snapshot.bytes_stored as f64);
    gauge!(STORE_ESTIMATED_MONTHLY_COST, &label).set(p.estimate.monthly_usd);
}
