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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::webhook::WebhookConfig;
    use crate::events::{Bus, EventKind, NewEvent};
    use tokio_util::task::TaskTracker;

    /// A receiver answering `statuses` in turn (then 200): the `(position, id)` of every POST.
    async fn receiver(
        statuses: Vec<u16>,
    ) -> (
        String,
        tokio::sync::mpsc::UnboundedReceiver<(u64, String)>,
        TaskTracker,
    ) {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let tracker = TaskTracker::new();
        tracker.spawn(async move {
            let mut statuses = statuses.into_iter();
            loop {
                let (conn, _) = listener.accept().await.unwrap();
                let mut conn = BufReader::new(conn);
                let mut len = 0;
                loop {
                    let mut line = String::new();
                    conn.read_line(&mut line).await.unwrap();
                    if line.trim().is_empty() {
                        break;
                    }
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        len = v.trim().parse().unwrap();
                    }
                }
                let mut body = vec![0; len];
                conn.read_exact(&mut body).await.unwrap();
                let doc: serde_json::Value = serde_json::from_slice(&body).unwrap();
                let position: u64 = doc["position"].as_str().unwrap().parse().unwrap();
                assert_eq!(doc["data"]["position"], position);
                tx.send((position, doc["id"].as_str().unwrap().to_string()))
                    .unwrap();
                let status = statuses.next().unwrap_or(200);
                let answer = format!("HTTP/1.1 {status} X\r\ncontent-length: 0\r\n\r\n");
                conn.get_mut().write_all(answer.as_bytes()).await.unwrap();
            }
        });
        (url, rx, tracker)
    }

    /// The service's wiring in small: a bus with a log on a real SQLite registry, its writer,
    /// and the webhooks delivering from the log.
    async fn start(
        registry: &Registry,
        url: &str,
        stop: &CancellationToken,
        tasks: &TaskTracker,
    ) -> Bus {
        let (bus, feed) = Bus::logged();
        let hooks = Webhooks::prepare(&[WebhookConfig::parse(url).unwrap()]).unwrap();
        init_cursors(registry, &hooks).await.unwrap();
        tasks.spawn(write(registry.clone(), feed, stop.clone()));
        hooks.spawn(
            "i",
            Arc::new(RegistryOutbox::new(registry.clone(), "i")),
            &bus.logged_position(),
            stop,
            tasks,
        );
        bus
    }

    #[tokio::test]
    async fn a_registry_that_fails_never_holds_an_event_back_from_live_watchers() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/registry.db", dir.path().display());
        let registry = Registry::open(&url).await.unwrap();
        registry.close().await;
        let (bus, feed) = Bus::logged();
        let mut watcher = bus.subscribe(String::new());
        let (stop, tasks) = (CancellationToken::new(), TaskTracker::new());
        tasks.spawn(write(registry, feed, stop.clone()));
        bus.publish(NewEvent::new(EventKind::Paused, "s", "unlogged"));
        match watcher.next().await {
            Some(crate::events::Received::Event(e)) => {
                assert_eq!((e.position, e.detail.as_str()), (0, "unlogged"));
            }
            other => panic!("{other:?}"),
        }
        stop.cancel();
        tasks.close();
        tasks.wait().await;
    }

    #[tokio::test]
    async fn a_5xx_is_retried_a_4xx_given_up_and_a_restart_goes_on_from_the_cursor() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/registry.db", dir.path().display());
        let registry = Registry::open(&url).await.unwrap();
        let (hook, mut posts, _receiver) = receiver(vec![503, 400]).await;
        let (stop, tasks) = (CancellationToken::new(), TaskTracker::new());
        let bus = start(&registry, &hook, &stop, &tasks).await;
        bus.publish(NewEvent::new(EventKind::Paused, "s", "one"));
        bus.publish(NewEvent::new(EventKind::Resumed, "s", "two"));
        let mut got = Vec::new();
        while got.len() < 3 {
            got.push(posts.recv().await.unwrap());
        }
        // 1 answered 503 (retried, same id), then 400 (given up); 2 delivered.
        let positions: Vec<u64> = got.iter().map(|g| g.0).collect();
        assert_eq!(positions, [1, 1, 2]);
        assert_eq!(got[0].1, got[1].1, "a retry carries the same id");
        stop.cancel();
        tasks.close();
        tasks.wait().await;

        // Published while no delivery runs: the next start posts it, from the cursor: not
        // 1 again (given up, and written), perhaps 2 again (the stop may have come before its
        // answer was read: at least once), then 3.
        registry
            .append_events(&[row(&Event {
                id: "after-the-stop".into(),
                position: 0,
                seq: 9,
                kind: EventKind::Paused,
                store_id: "s".into(),
                time_unix_ms: 1,
                detail: "three".into(),
                trace_id: String::new(),
                facts: Default::default(),
            })])
            .await
            .unwrap();
        let (stop, tasks) = (CancellationToken::new(), TaskTracker::new());
        let _bus = start(&registry, &hook, &stop, &tasks).await;
        let mut again = Vec::new();
        while again.last().is_none_or(|(p, _)| *p != 3) {
            again.push(posts.recv().await.unwrap());
        }
        assert_eq!(again.last().unwrap().1, "after-the-stop");
        assert!(
            again[..again.len() - 1].iter().all(|a| *a == got[2]),
            "{again:?}"
        );
        stop.cancel();
        tasks.close();
        tasks.wait().await;
    }
}
