//! `WatchEvents`: the event bus ([`crate::events`]) as a gRPC stream, of one store or of
//! every store; with `after`, the fleet's event log from that position on.
//!
//! # Live (no `after`)
//!
//! Each stream is a watcher of the bus and a task (in the fleet's tracker) that forwards what
//! it reads to the client through a small channel. A client that reads slowly holds up only
//! its own task: the bus does not wait for it, and when the task falls more than
//! [`crate::events::BUS_CAPACITY`] events behind, the client gets one `EVENT_KIND_LAGGED`
//! event, "lagged, N events dropped", and the stream goes on from the oldest event kept. A
//! store another instance runs is its owner's live stream, relayed (`api.rs`).
//!
//! # Resuming (`after`)
//!
//! The stream is the log ([`crate::service::fleet::event_log`]) read from position `after`
//! on, by this instance whoever runs the stores (the log is the fleet's): first what is there,
//! [`PAGE`] events a read, then, once caught up, a read whenever this instance appends to the
//! log and every [`TAIL_POLL`] for the other instances' events. One reader, one cursor (the
//! last position sent), positions in the log only grow: so there is no gap and no duplicate
//! between the replay and the live part, and a store that moved keeps one ordered history.
//! When positions after `after` were pruned already, the stream starts with one
//! `EVENT_KIND_PRUNED` event naming the oldest available position (its detail), whose
//! `position` is the last one gone (so that, like every event's, it is where to resume after)
//! and `dropped` how many positions are gone; it goes on from the oldest available. A registry that fails ends the stream with
//! `UNAVAILABLE`: resume after the last position seen. Events the registry did not take
//! (`crate::events::journal`) are never in it.
//!
//! At most `max_health_watchers` event streams are open at once (the same bound as, and
//! counted apart from, `WatchHealth`'s); one more is `RESOURCE_EXHAUSTED`
//! ([`EventWatchersFull`]). A stream ends when the client goes away, or with `UNAVAILABLE` at
//! the service's shutdown.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::Status;

use super::error::{EventWatchersFull, ServiceError};
use crate::events::{Bus, Event, Received};
use crate::registry::Registry;
use crate::service::fleet::{FleetError, event_log};
use crate::service::proto;

/// Events a resuming stream reads from the log at a time.
pub const PAGE: u32 = 256;
/// How often a resuming stream that caught up reads the log for other instances' events.
pub const TAIL_POLL: std::time::Duration = std::time::Duration::from_millis(250);

/// What a `WatchEvents` call answers.
pub type EventStream = Pin<Box<dyn Stream<Item = Result<proto::BackupEvent, Status>> + Send>>;

/// The bus, the log and the streams' slots.
pub struct EventWatch {
    bus: Bus,
    registry: Registry,
    slots: Arc<Semaphore>,
    max: usize,
    shutdown: CancellationToken,
    tasks: TaskTracker,
}

impl EventWatch {
    pub fn new(
        bus: Bus,
        registry: Registry,
        max: usize,
        shutdown: CancellationToken,
        tasks: &TaskTracker,
    ) -> Self {
        EventWatch {
            bus,
            registry,
            slots: Arc::new(Semaphore::new(max)),
            max,
            shutdown,
            tasks: tasks.clone(),
        }
    }

    /// A stream of the events of `store_id` (every store when empty) published from now on.
    pub fn subscribe(&self, store_id: String) -> Result<EventStream, ServiceError> {
        let slot = self
            .slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| EventWatchersFull { max: self.max })?;
        let mut watcher = self.bus.subscribe(store_id);
        let shutdown = self.shutdown.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        self.tasks.spawn(async move {
            let _slot = slot;
            loop {
                let next = tokio::select! {
                    _ = tx.closed() => return,
                    _ = shutdown.cancelled() => {
                        let _ = tx.send(Err(ServiceError::ShuttingDown.into())).await;
                        return;
                    }
                    next = watcher.next() => next,
                };
                let msg = match next {
                    None => return,
                    Some(Received::Event(e)) => to_proto(&e),
                    Some(Received::Lagged(n)) => lagged(n),
                };
                if tx.send(Ok(msg)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }

    /// A stream of the events of `store_id` (every store when empty) in the log after
    /// position `after`, then as they are appended (see the module docs).
    pub async fn resume(&self, store_id: String, after: u64) -> Result<EventStream, ServiceError> {
        if !store_id.is_empty()
            && self
                .registry
                .get_store(&store_id)
                .await
                .map_err(FleetError::from)?
                .is_none()
            && !self
                .registry
                .has_events_of(&store_id)
                .await
                .map_err(FleetError::from)?
        {
            return Err(FleetError::UnknownStore(store_id).into());
        }
        let slot = self
            .slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| EventWatchersFull { max: self.max })?;
        let mut wake = self.bus.logged_position();
        let registry = self.registry.clone();
        let shutdown = self.shutdown.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        self.tasks.spawn(async move {
            let _slot = slot;
            let store = (!store_id.is_empty()).then_some(store_id.as_str());
            let mut last = after;
            loop {
                // The newest position before the page (every one up to it is in the page's
                // reach: positions commit in order), the page, and what was pruned after it
                // (so a prune racing the read is never missed).
                let read = async {
                    let newest = registry.event_span().await?.last;
                    let page = event_log::after(&registry, last, store, PAGE).await?;
                    let span = registry.event_span().await?;
                    Ok::<_, crate::registry::RegistryError>((newest, page, span))
                };
                let (newest, page, span) = match read.await {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = tx
                            .send(Err(ServiceError::from(FleetError::from(e)).into()))
                            .await;
                        return;
                    }
                };
                if span.pruned_through > last {
                    // Positions after `last` may have gone before the page was read: the page
                    // is dropped, the marker says so, and the next round goes on after it.
                    if tx
                        .send(Ok(pruned(last, span.oldest_available())))
                        .await
                        .is_err()
                    {
                        return;
                    }
                    last = span.pruned_through;
                    continue;
                }
                let full = page.len() == PAGE as usize;
                for e in page {
                    last = e.position;
                    if tx.send(Ok(to_proto(&e))).await.is_err() {
                        return;
                    }
                }
                if full {
                    continue;
                }
                // A quiet store's watcher is past every position up to `newest` too, so a
                // prune of them is nothing it missed.
                last = last.max(newest);
                tokio::select! {
                    _ = tx.closed() => return,
                    _ = shutdown.cancelled() => {
                        let _ = tx.send(Err(ServiceError::ShuttingDown.into())).await;
                        return;
                    }
                    r = wake.changed() => if r.is_err() {
                        tokio::time::sleep(TAIL_POLL).await;
                    },
                    _ = tokio::time::sleep(TAIL_POLL) => {}
                }
            }
        });
        Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }
}

/// An event as the API sends it.
pub fn to_proto(e: &Event) -> proto::BackupEvent {
    use crate::events::EventKind as K;
    use proto::EventKind as P;
    let kind = match e.kind {
        K::HealthChanged => P::HealthChanged,
        K::Paused => P::Paused,
        K::Resumed => P::Resumed,
        K::RestorePointWritten => P::RestorePointWritten,
        K::DrillFinished => P::DrillFinished,
        K::LeaseAcquired => P::LeaseAcquired,
        K::LeaseLost => P::LeaseLost,
        K::LeaseTakenOver => P::LeaseTakenOver,
        K::GenerationStarted => P::GenerationStarted,
        K::RetentionDeleted => P::RetentionDeleted,
        K::Registered => P::Registered,
        K::Deregistered => P::Deregistered,
        K::OwnerChanged => P::OwnerChanged,
        K::BudgetExceeded => P::BudgetExceeded,
        K::Promoted => P::Promoted,
    };
    let f = &e.facts;
    proto::BackupEvent {
        position: e.position,
        seq: e.seq,
        kind: kind as i32,
        kind_name: e.kind.name().to_string(),
        store_id: e.store_id.clone(),
        time_unix_ms: e.time_unix_ms,
        detail: e.detail.clone(),
        trace_id: e.trace_id.clone(),
        id: e.id.clone(),
        commit_seq: f.commit_seq.unwrap_or(0),
        generation: f.generation.unwrap_or(0),
        count: f.count.unwrap_or(0),
        ok: f.ok.unwrap_or(false),
        duration_ms: f.duration_ms.unwrap_or(0),
        bytes: f.bytes.unwrap_or(0),
        healthy: f.healthy.unwrap_or(false),
        dropped: 0,
    }
}

/// The marker a resuming watcher gets when positions after `after` are gone (pruned).
fn pruned(after: u64, oldest: u64) -> proto::BackupEvent {
    let gone = oldest.saturating_sub(after + 1);
    proto::BackupEvent {
        kind: proto::EventKind::Pruned as i32,
        kind_name: "pruned".into(),
        time_unix_ms: crate::units::unix_now_ms(),
        detail: format!(
            "positions {} to {} are no longer kept (the log's retention): going on from {oldest}, the oldest available",
            after + 1,
            oldest - 1
        ),
        position: oldest - 1,
        dropped: gone,
        ..Default::default()
    }
}

/// The marker a lagging watcher gets.
fn lagged(n: u64) -> proto::BackupEvent {
    proto::BackupEvent {
        kind: proto::EventKind::Lagged as i32,
        kind_name: "lagged".into(),
        time_unix_ms: crate::units::unix_now_ms(),
        detail: format!("lagged, {n} events dropped: this stream read too slowly"),
        dropped: n,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{EventKind, NewEvent};
    use futures::StreamExt;

    /// A log of `n` events of store "s" on a fresh SQLite registry, written as the service
    /// writes them (a bus with a log, its writer).
    async fn logged(
        n: usize,
    ) -> (
        tempfile::TempDir,
        Registry,
        Bus,
        CancellationToken,
        TaskTracker,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/registry.db", dir.path().display());
        let registry = Registry::open(&url).await.unwrap();
        let (bus, feed) = Bus::logged();
        let (stop, tasks) = (CancellationToken::new(), TaskTracker::new());
        tasks.spawn(event_log::write(registry.clone(), feed, stop.clone()));
        let mut logged = bus.logged_position();
        for i in 0..n {
            bus.publish(NewEvent::new(EventKind::Paused, "s", format!("{i}")));
        }
        while *logged.borrow_and_update() < n as u64 {
            logged.changed().await.unwrap();
        }
        (dir, registry, bus, stop, tasks)
    }

    #[tokio::test]
    async fn a_resume_before_the_oldest_kept_starts_with_one_pruned_event_then_goes_on() {
        let (_dir, registry, bus, stop, tasks) = logged(6).await;
        // Positions 1 to 4 go; 5 and 6 stay.
        assert_eq!(registry.prune_events(0, 2).await.unwrap(), 4);
        let watch = EventWatch::new(bus.clone(), registry.clone(), 4, stop.clone(), &tasks);
        let mut s = watch.resume(String::new(), 1).await.unwrap();
        let marker = s.next().await.unwrap().unwrap();
        assert_eq!(marker.kind, proto::EventKind::Pruned as i32);
        assert_eq!((marker.position, marker.dropped), (4, 3));
        assert!(
            marker.detail.contains("oldest available"),
            "{}",
            marker.detail
        );
        let next = s.next().await.unwrap().unwrap();
        assert_eq!((next.position, next.detail.as_str()), (5, "4"));
        assert_eq!(s.next().await.unwrap().unwrap().position, 6);
        // Then live: a new event arrives with the next position, once.
        bus.publish(NewEvent::new(EventKind::Resumed, "s", "live"));
        let live = s.next().await.unwrap().unwrap();
        assert_eq!((live.position, live.detail.as_str()), (7, "live"));
        // After the newest: nothing old; an unknown store is refused.
        let mut after = watch.resume("s".into(), 7).await.unwrap();
        bus.publish(NewEvent::new(EventKind::Paused, "s", "eight"));
        assert_eq!(after.next().await.unwrap().unwrap().position, 8);
        assert!(watch.resume("nope".into(), 0).await.is_err());
        stop.cancel();
        drop((s, after));
        tasks.close();
        tasks.wait().await;
    }
}
