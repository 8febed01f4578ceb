//! The fleet's event log on the registry (`crate::registry`'s `events` table): the writer that
//! appends what the bus publishes ([`write`]), its pruning ([`prune`]), the reading of it
//! ([`after`], for `WatchEvents` with `after`) and the webhooks' outbox ([`RegistryOutbox`]).
//!
//! # Invariants
//!
//! - One writer per process, appending the bus's queue a batch at a time (at most
//!   [`crate::events::journal::BATCH`] events, one transaction), in publish order; the batch
//!   goes to live watchers after its commit, with its positions. A batch the registry refused
//!   goes to live watchers without positions (counted `mushroom_backup_events_unlogged_total`,
//!   a warning when the registry starts failing and a line when it takes events again): a
//!   registry outage never holds a worker up, and costs the log those events.
//! - At shutdown the writer ends after appending everything published before the workers'
//!   token was cancelled (the last flushes' events included).
//! - Pruning runs at start and every [`PRUNE_EVERY`], on every instance (two prunes of one
//!   log agree: each removes from the oldest end).
//!
//! # What a crash leaves
//!
//! The events appended stand; those still queued are lost (see `crate::events::journal`).

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use super::Fleet;
use crate::events::Event;
use crate::events::journal::Feed;
use crate::events::webhook::{HOLD, Outbox, Webhooks};
use crate::registry::{EventRow, LoggedEvent, Registry, RegistryError};

/// How often the log is pruned.
pub const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// Appends what `feed` gives to the log until `stop` (then what was queued before it).
pub(in crate::service) async fn write(registry: Registry, feed: Feed, stop: CancellationToken) {
    let mut failing = false;
    while let Some(batch) = feed.next(&stop).await {
        let rows: Vec<EventRow> = batch.iter().map(row).collect();
        match registry.append_events(&rows).await {
            Ok(positions) => {
                if failing {
                    failing = false;
                    tracing::info!("the registry takes events into the log again");
                }
                feed.appended(batch, &positions);
            }
            Err(e) => {
                if !failing {
                    failing = true;
                    tracing::warn!(error = %e, events = batch.len(), "the registry did not take events into the log: they go to live watchers without a position, and are neither replayed nor posted to webhooks");
                } else {
                    tracing::debug!(error = %e, events = batch.len(), "the registry did not take events again");
                }
                feed.unlogged(batch);
            }
        }
    }
}

/// An event as the log stores it.
fn row(e: &Event) -> EventRow {
    EventRow {
        id: e.id.clone(),
        store_id: e.store_id.clone(),
        at_ms: e.time_unix_ms,
        // An event is plain data: it always serializes.
        body: serde_json::to_string(e).unwrap_or_default(),
    }
}

/// An event from the log; `None` (logged) when its body does not read back.
fn event(l: LoggedEvent) -> Option<Event> {
    match serde_json::from_str::<Event>(&l.row.body) {
        Ok(mut e) => {
            e.position = l.position;
            Some(e)
        }
        Err(e) => {
            tracing::error!(position = l.position, error = %e, "an event in the log does not read back; skipped");
            None
        }
    }
}

/// At most `limit` events after position `after`, of `store_id` (every store's when `None`),
/// in position order.
pub async fn after(
    registry: &Registry,
    after: u64,
    store_id: Option<&str>,
    limit: u32,
) -> Result<Vec<Event>, RegistryError> {
    Ok(registry
        .events_after(after, store_id, limit)
        .await?
        .into_iter()
        .filter_map(event)
        .collect())
}

/// Prunes the log by `fleet`'s retention at start and every [`PRUNE_EVERY`], until `stop`.
pub(in crate::service) async fn prune(fleet: Arc<Fleet>, stop: CancellationToken) {
    let retention = fleet.config().event_retention;
    let mut tick = tokio::time::interval(PRUNE_EVERY);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let before = crate::units::unix_now_ms()
            - i64::try_from(retention.keep_for.as_millis()).unwrap_or(i64::MAX);
        match fleet.registry().prune_events(before, retention.keep).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(events = n, "pruned the event log"),
            Err(e) => tracing::warn!(error = %e, "cannot prune the event log"),
        }
    }
}

/// Creates every webhook's cursor missing from the registry at the log's newest position: a
/// webhook new to the fleet gets what is published from now on. Before the fleet publishes.
pub(in crate::service) async fn init_cursors(
    registry: &Registry,
    webhooks: &Webhooks,
) -> Result<(), RegistryError> {
    let cursors = webhooks.cursors();
    if cursors.is_empty() {
        return Ok(());
    }
    let last = registry.event_span().await?.last;
    for (key, name) in cursors {
        registry.init_webhook_cursor(&key, &name, last).await?;
    }
    Ok(())
}

/// The webhooks' [`Outbox`] on the registry, for instance `instance_id`.
pub struct RegistryOutbox {
    registry: Registry,
    instance_id: String,
}

impl RegistryOutbox {
    pub fn new(registry: Registry, instance_id: &str) -> RegistryOutbox {
        RegistryOutbox {
            registry,
            instance_id: instance_id.to_string(),
        }
    }

    fn until(&self) -> (i64, i64) {
        let now = crate::units::unix_now_ms();
        (
            now,
            now + i64::try_from(HOLD.as_millis()).unwrap_or(i64::MAX),
        )
    }
}

impl Outbox for RegistryOutbox {
    fn claim<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<u64>, String>> {
        Box::pin(async move {
            let (now, until) = self.until();
            self.registry
                .claim_webhook(key, &self.instance_id, now, until)
                .await
                .map_err(|e| e.to_string())
        })
    }

    fn after(&self, position: u64, limit: u32) -> BoxFuture<'_, Result<Vec<Event>, String>> {
        Box::pin(async move {
            after(&self.registry, position, None, limit)
                .await
                .map_err(|e| e.to_string())
        })
    }

    fn delivered<'a>(&'a self, key: &'a str, position: u64) -> BoxFuture<'a, Result<bool, String>> {
        Box::pin(async move {
            let (_, until) = self.until();
            self.registry
                .webhook_delivered(key, &self.instance_id, position, until)
                .await
                .map_err(|e| e.to_string())
        })
    }

    fn release<'a>(&'a self, key: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if let Err(e) = self.registry.release_webhook(key, &self.instance_id).await {
                tracing::debug!(error = %e, "cannot give up a webhook's claim; it lapses by itself");
            }
        })
    }
}
