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
//! store stays healthy) and `Usage.over_budget`. The budget watch sees a store cross into its
//! budget's overrun once per crossing and publishes a `budget_exceeded` event then (on the
//! fleet's bus, at the health report's tick): a store that stays over is not published again
//! until its projection came back within the budget. What a crash leaves: nothing; the next
//! process starts counting anew, and publishes again if its projection is over.
//!
//! # One figure a tick
//!
//! The health report's tick ([`UsageReport::tick`]) prices each store's usage once and hands
//! that figure to both the metrics and the budget watch, so the two never disagree about a
//! tick. A store is priced only when something takes the figure: `/metrics` when metrics are
//! recorded (`--metrics-listen`), the budget watch when the store has a budget. So a fleet of
//! 10,000 stores without either costs a field read per store and tick.
//!
//! # Metrics
//!
//! A store's first tick registers its series: `mushroom_backup_store_requests_total{store_id,op}`
//! and the bytes counters at its whole count, the stored-bytes and estimate gauges. Each later
//! tick adds what its usage grew by and sets the gauges that moved; a store whose usage stands
//! still costs a lookup. A new worker (its usage a new object) starts from zero and its whole
//! count is added, so the counters only rise (as in `store_metrics`). What it remembers of a
//! store (its usage, counts and gauges at the last tick) lives in the report task and holds
//! only the stores of the last tick: a store deregistered or moved away is forgotten at the
//! next one (there is no process-wide map to prune).

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use metrics::{counter, gauge};

use crate::bucket::usage::{RequestClass, Usage, UsageSnapshot};
use crate::cost::{self, Estimate, Prices};
use crate::events::{Bus, EventKind, Facts, NewEvent};
use crate::service::fleet::StoreEntry;
use crate::service::proto;
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
    priced_usage(
        &e.usage,
        e.options.monthly_request_budget.unwrap_or(0),
        prices,
    )
}

/// [`priced`] for any usage (a replica's) under the request budget `budget` (0: none).
pub fn priced_usage(usage: &crate::bucket::usage::Usage, budget: u64, prices: &Prices) -> Priced {
    let snapshot = usage.snapshot();
    let estimate = cost::estimate(&snapshot, prices);
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
            // Branches' share: `with_branch_charges`, which has the fleet.
            held_for_branches_bytes: 0,
            pinned_in_parent_bytes: 0,
        }
    }
}

/// `u` with what branches change of the store's bill (`proto::Usage.held_for_branches_bytes`,
/// `pinned_in_parent_bytes`): the bytes kept only for branches cut from its prefix go to
/// them, the bytes it keeps in a parent's prefix only through its pin come here, and the
/// storage cost and estimate are priced on what remains.
pub fn with_branch_charges(
    mut u: proto::Usage,
    fleet: &crate::service::fleet::Fleet,
    e: &StoreEntry,
    prices: &Prices,
) -> proto::Usage {
    u.held_for_branches_bytes = e
        .handle
        .counters()
        .branch_charges()
        .iter()
        .map(|c| c.bytes)
        .sum();
    u.pinned_in_parent_bytes = fleet.pinned_in_parent(&e.record.destination);
    if u.held_for_branches_bytes > 0 || u.pinned_in_parent_bytes > 0 {
        let billed = u
            .bytes_stored
            .saturating_sub(u.held_for_branches_bytes)
            .saturating_add(u.pinned_in_parent_bytes);
        let storage = cost::storage_usd(billed, prices);
        u.estimated_monthly_cost_usd += storage - u.storage_monthly_cost_usd;
        u.storage_monthly_cost_usd = storage;
    }
    u
}

/// One store's figure at a tick: priced once ([`priced`]), handed to both the metrics and the
/// budget watch.
pub(in crate::service) struct Tick<'a> {
    pub store_id: &'a str,
    pub usage: &'a Arc<Usage>,
    pub priced: Priced,
}

/// What the health report's tick does with the stores' usage (see the module docs): it prices
/// each store once and hands that figure to `/metrics` and to the budget watch. It remembers
/// only the stores of the last tick: a store deregistered or moved away since is forgotten.
#[derive(Default)]
pub(in crate::service) struct UsageReport {
    metrics: UsageMetrics,
    budgets: BudgetWatch,
}

impl UsageReport {
    /// One tick over this instance's stores. A store is priced only when something takes the
    /// figure: `/metrics` when metrics are recorded, the budget watch when it has a budget. An
    /// idle fleet without either costs a field read per store.
    pub fn tick(&mut self, entries: &[Arc<StoreEntry>], prices: &Prices, bus: &Bus) {
        let recording = crate::telemetry::recording();
        let stores: Vec<Tick<'_>> = entries
            .iter()
            .filter(|e| recording || e.options.monthly_request_budget.unwrap_or(0) > 0)
            .map(|e| Tick {
                store_id: &e.record.store_id,
                usage: &e.usage,
                priced: priced(e, prices),
            })
            .collect();
        self.look(&stores, bus);
    }

    /// [`UsageReport::tick`] on figures already priced.
    pub fn look(&mut self, stores: &[Tick<'_>], bus: &Bus) {
        self.metrics.record(stores);
        self.budgets.look(stores, bus);
    }

    /// How many stores it remembers (those of the last tick).
    #[cfg(test)]
    fn remembered(&self) -> (usize, usize) {
        (self.metrics.seen.len(), self.budgets.over.len())
    }
}

/// The stores whose projections were over budget at the last look; see the module docs.
#[derive(Default)]
struct BudgetWatch {
    over: std::collections::HashSet<String>,
}

impl BudgetWatch {
    /// Looks at every store of `stores`: a store whose projection went over its budget since
    /// the last look is published on `bus` (once per crossing: a store over it at the last look
    /// too is not published again; one that came back within it is, when it crosses again).
    /// A store not among `stores` is within its budget (it has none, or it is gone).
    fn look(&mut self, stores: &[Tick<'_>], bus: &Bus) {
        let was_over = std::mem::take(&mut self.over);
        for s in stores {
            let p = &s.priced;
            if p.note.is_none() {
                continue;
            }
            let id = s.store_id;
            if !was_over.contains(id) {
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
            self.over.insert(id.to_string());
        }
    }
}

/// What the metrics were last given of a store: which usage, its counts and gauges then, and
/// the last look that saw it.
struct Seen {
    usage: Weak<Usage>,
    counts: [u64; 7],
    stored_bytes: u64,
    monthly_usd: f64,
    look: u64,
}

/// What `/metrics` was given of each store at the last tick; see the module docs.
#[derive(Default)]
struct UsageMetrics {
    seen: HashMap<String, Seen>,
    looks: u64,
}

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

impl UsageMetrics {
    /// Records `stores` into `/metrics`, and forgets every store not among them. A store's
    /// first look registers every series (counters at zero included); after that only what
    /// changed is given (a store whose usage stands still costs a lookup).
    fn record(&mut self, stores: &[Tick<'_>]) {
        self.looks += 1;
        for s in stores {
            let figure = counts(&s.priced.snapshot);
            let usage = Arc::downgrade(s.usage);
            let seen = match self.seen.get_mut(s.store_id) {
                // Another worker's usage is a new one: its whole count is new.
                Some(seen) if Weak::ptr_eq(&seen.usage, &usage) => seen,
                _ => {
                    export_all(s.store_id, &figure, &s.priced);
                    self.seen.insert(
                        s.store_id.to_string(),
                        Seen {
                            usage,
                            counts: figure,
                            stored_bytes: s.priced.snapshot.bytes_stored,
                            monthly_usd: s.priced.estimate.monthly_usd,
                            look: self.looks,
                        },
                    );
                    continue;
                }
            };
            seen.look = self.looks;
            export_changes(s.store_id, seen, &figure, &s.priced);
        }
        let looks = self.looks;
        self.seen.retain(|_, s| s.look == looks);
    }
}

fn store_label(store_id: &str) -> [(&'static str, String); 1] {
    [(STORE_ID_LABEL, store_id.to_string())]
}

/// Adds `n` to the store's counter of `figure`'s `i`th count (see [`counts`]).
fn add(store_id: &str, i: usize, n: u64) {
    match RequestClass::ALL.get(i) {
        Some(class) => {
            let labels = [
                (STORE_ID_LABEL, store_id.to_string()),
                ("op", class.name().to_string()),
            ];
            counter!(STORE_REQUESTS, &labels).increment(n);
        }
        None if i == 5 => counter!(STORE_UPLOADED_BYTES, &store_label(store_id)).increment(n),
        None => counter!(STORE_DOWNLOADED_BYTES, &store_label(store_id)).increment(n),
    }
}

/// A store's first look: every counter (at its whole count) and both gauges.
fn export_all(store_id: &str, figure: &[u64; 7], p: &Priced) {
    for (i, n) in figure.iter().enumerate() {
        add(store_id, i, *n);
    }
    let label = store_label(store_id);
    gauge!(STORE_STORED_BYTES, &label).set(p.snapshot.bytes_stored as f64);
    gauge!(STORE_ESTIMATED_MONTHLY_COST, &label).set(p.estimate.monthly_usd);
}

/// What grew since `seen` is added, the gauges that moved are set; `seen` becomes `figure`.
fn export_changes(store_id: &str, seen: &mut Seen, figure: &[u64; 7], p: &Priced) {
    for (i, (last, now)) in seen.counts.iter_mut().zip(figure).enumerate() {
        let grown = now.saturating_sub(*last);
        *last = *now;
        if grown > 0 {
            add(store_id, i, grown);
        }
    }
    if seen.stored_bytes != p.snapshot.bytes_stored {
        seen.stored_bytes = p.snapshot.bytes_stored;
        gauge!(STORE_STORED_BYTES, &store_label(store_id)).set(p.snapshot.bytes_stored as f64);
    }
    // The estimate moves as the window grows, for a store that sent any request.
    if seen.monthly_usd.to_bits() != p.estimate.monthly_usd.to_bits() {
        seen.monthly_usd = p.estimate.monthly_usd;
        gauge!(STORE_ESTIMATED_MONTHLY_COST, &store_label(store_id)).set(p.estimate.monthly_usd);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::Received;

    /// A figure over a budget of 1 (1,000 PUTs in a minute), as if priced from a busy usage.
    fn over_budget(prices: &Prices) -> Priced {
        let snapshot = UsageSnapshot {
            put: 1000,
            window_ms: 60_000,
            ..UsageSnapshot::default()
        };
        let estimate = cost::estimate(&snapshot, prices);
        Priced {
            snapshot,
            estimate,
            budget: 1,
            note: cost::budget_note(&estimate, 1),
        }
    }

    fn within_budget(prices: &Prices) -> Priced {
        Priced {
            budget: u64::MAX,
            note: None,
            ..over_budget(prices)
        }
    }

    async fn next_event(w: &mut crate::events::Watcher) -> Arc<crate::events::Event> {
        match w.next().await {
            Some(Received::Event(e)) => e,
            other => panic!("no event: {other:?}"),
        }
    }

    /// The budget watch publishes the figure the tick priced, not one of its own: a usage with
    /// no request (within any budget) handed a figure over budget is published over budget.
    #[tokio::test]
    async fn the_budget_watch_takes_the_figure_the_tick_priced() {
        let (prices, bus) = (Prices::default(), Bus::new());
        let mut watcher = bus.subscribe(String::new());
        let usage = Usage::new();
        let figure = over_budget(&prices);
        let projected = figure.estimate.monthly_requests;
        let mut report = UsageReport::default();
        report.look(
            &[Tick {
                store_id: "s",
                usage: &usage,
                priced: figure,
            }],
            &bus,
        );
        let e = next_event(&mut watcher).await;
        assert_eq!(
            (e.kind, e.facts.count),
            (EventKind::BudgetExceeded, Some(projected))
        );
    }

    /// A store deregistered (or moved away) is forgotten at the next tick: nothing of it is
    /// kept, by the metrics or by the budget watch.
    #[test]
    fn a_store_gone_is_forgotten() {
        let (prices, bus) = (Prices::default(), Bus::new());
        let usage = Usage::new();
        let mut report = UsageReport::default();
        report.look(
            &[Tick {
                store_id: "registered",
                usage: &usage,
                priced: over_budget(&prices),
            }],
            &bus,
        );
        assert_eq!(report.remembered(), (1, 1));
        report.look(&[], &bus);
        assert_eq!(report.remembered(), (0, 0));
    }

    /// Over, back within the budget, over again: two events.
    #[tokio::test]
    async fn a_store_back_within_its_budget_is_published_when_over_again() {
        let (prices, bus) = (Prices::default(), Bus::new());
        let mut watcher = bus.subscribe(String::new());
        let usage = Usage::new();
        let mut report = UsageReport::default();
        let mut tick = |priced: Priced| {
            report.look(
                &[Tick {
                    store_id: "s",
                    usage: &usage,
                    priced,
                }],
                &bus,
            );
        };
        tick(over_budget(&prices));
        tick(over_budget(&prices));
        tick(within_budget(&prices));
        tick(over_budget(&prices));
        bus.publish(NewEvent::new(EventKind::Registered, "end", "end"));
        let mut kinds = Vec::new();
        loop {
            let e = next_event(&mut watcher).await;
            if e.store_id == "end" {
                break;
            }
            kinds.push(e.kind);
        }
        assert_eq!(
            kinds,
            [EventKind::BudgetExceeded, EventKind::BudgetExceeded]
        );
    }
}
