//! `WatchEvents`: the event bus ([`crate::events`]) as a gRPC stream, of one store or of
//! every store.
//!
//! Each stream is a watcher of the bus and a task (in the fleet's tracker) that forwards what
//! it reads to the client through a small channel. A client that reads slowly holds up only
//! its own task: the bus does not wait for it, and when the task falls more than
//! [`crate::events::BUS_CAPACITY`] events behind, the client gets one `EVENT_KIND_LAGGED`
//! event, "lagged, N events dropped", and the stream goes on from the oldest event kept.
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

use super::error::ServiceError;
use crate::events::{Bus, Event, Received};
use crate::service::proto;

/// One more event stream than the server allows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{max} WatchEvents streams are open, the server's limit (max_health_watchers): close one")]
pub struct EventWatchersFull {
    pub max: usize,
}

/// What a `WatchEvents` call answers.
pub type EventStream = Pin<Box<dyn Stream<Item = Result<proto::BackupEvent, Status>> + Send>>;

/// The bus and the streams' slots.
pub struct EventWatch {
    bus: Bus,
    slots: Arc<Semaphore>,
    max: usize,
    shutdown: CancellationToken,
    tasks: TaskTracker,
}

impl EventWatch {
    pub fn new(bus: Bus, max: usize, shutdown: CancellationToken, tasks: &TaskTracker) -> Self {
        EventWatch {
            bus,
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
    };
    let f = &e.facts;
    proto::BackupEvent {
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
