//! Events: what happens to stores, as it happens, for whoever watches (`WatchEvents`) and for
//! webhooks ([`webhook`]).
//!
//! - [`Event`]: one typed event ([`EventKind`]) of one store, with its time, a one-line
//!   detail, the kind's facts ([`Facts`]) and the trace id of the work that caused it (the
//!   current span's, from [`crate::telemetry::current_trace_id`]; empty when nothing is traced).
//! - [`Bus`]: the process's one bus. [`Bus::publish`] never blocks and never fails: it numbers
//!   the event and, on a bus with a log ([`Bus::logged`], the service's), queues it for the
//!   log's writer ([`journal`]), which appends it to the registry's event log (giving it its
//!   fleet-wide `position`) and only then hands it to the bounded broadcast ring of
//!   [`BUS_CAPACITY`] events that every watcher reads at its own pace; on a bus without a log
//!   it goes to the ring at once. A watcher that falls more than the ring behind is not waited
//!   for: its next read answers [`Received::Lagged`] with how many events it missed, then goes
//!   on from the oldest one still in the ring. A watcher that must miss nothing, across
//!   restarts too, reads the log (`WatchEvents` with `after`); so do the webhooks.
//! - [`Emitter`]: a bus bound to one store, which the worker holds (or holds none: a worker
//!   outside the service publishes nothing).
//! - [`cloudevents`]: an event as a CloudEvents 1.0 JSON document; [`webhook`]: the
//!   `serve --webhook-url` deliveries, from the log; [`http`]: the one-request HTTP(S) client
//!   they use; [`signature`]: their Standard Webhooks signature.
//!
//! # Invariants
//!
//! - Events are numbered (`seq`) in the order they are published, under one lock with the
//!   push to the log's queue; the writer appends and hands them to the ring in that order, so
//!   every watcher sees them in `seq` order, and logged ones in `position` order too.
//! - Publishing costs a lock, an allocation and a queue push; no I/O, no await. A worker is
//!   never delayed by a watcher, a webhook or the registry ([`journal`] says what happens to
//!   an event the registry does not take).
//!
//! # What a crash leaves
//!
//! Events appended to the log stand (they are replayed to whoever resumes, and the webhooks
//! deliver them after a restart); those still queued for the writer are lost with the process,
//! as the ring is.

pub mod cloudevents;
pub mod http;
pub mod journal;
pub mod signature;
pub mod webhook;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

/// Events a watcher may fall behind before it is told it lagged.
pub const BUS_CAPACITY: usize = 1024;

/// What happened. [`EventKind::name`] is the name in CloudEvents types
/// (`dev.mushroom.backup.<name>`), webhook filters and `ctl watch-events`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// Healthy turned unhealthy or back, or the main reason changed.
    HealthChanged,
    Paused,
    Resumed,
    /// A manifest was written and LATEST moved.
    RestorePointWritten,
    /// A restore drill ended, well or not.
    DrillFinished,
    LeaseAcquired,
    /// The lease stopped holding: expired, a write refused by another writer, the instance
    /// lease ended.
    LeaseLost,
    /// Another holder replaced the lease.
    LeaseTakenOver,
    /// A new generation was claimed and its snapshot uploaded.
    GenerationStarted,
    /// Retention deleted objects.
    RetentionDeleted,
    Registered,
    Deregistered,
    /// Another instance owns the store now: a failover claim or a planned move
    /// (`service::failover`, `service::moves`).
    OwnerChanged,
    /// The projected requests a month went over the store's request budget (once per overrun).
    BudgetExceeded,
    /// A standby became the primary of its destination (`commit_seq`: where the promoted copy
    /// ends; `service::fleet::promote`).
    Promoted,
}

impl EventKind {
    pub const ALL: [EventKind; 15] = [
        EventKind::HealthChanged,
        EventKind::Paused,
        EventKind::Resumed,
        EventKind::RestorePointWritten,
        EventKind::DrillFinished,
        EventKind::LeaseAcquired,
        EventKind::LeaseLost,
        EventKind::LeaseTakenOver,
        EventKind::GenerationStarted,
        EventKind::RetentionDeleted,
        EventKind::Registered,
        EventKind::Deregistered,
        EventKind::OwnerChanged,
        EventKind::BudgetExceeded,
        EventKind::Promoted,
    ];

    pub fn name(self) -> &'static str {
        match self {
            EventKind::HealthChanged => "health_changed",
            EventKind::Paused => "paused",
            EventKind::Resumed => "resumed",
            EventKind::RestorePointWritten => "restore_point_written",
            EventKind::DrillFinished => "drill_finished",
            EventKind::LeaseAcquired => "lease_acquired",
            EventKind::LeaseLost => "lease_lost",
            EventKind::LeaseTakenOver => "lease_taken_over",
            EventKind::GenerationStarted => "generation_started",
            EventKind::RetentionDeleted => "retention_deleted",
            EventKind::Registered => "registered",
            EventKind::Deregistered => "deregistered",
            EventKind::OwnerChanged => "owner_changed",
            EventKind::BudgetExceeded => "budget_exceeded",
            EventKind::Promoted => "promoted",
        }
    }

    /// The kind named `name` ([`Self::name`]); an unknown name is an error listing the known.
    pub fn parse(name: &str) -> Result<EventKind, String> {
        let name = name.trim();
        EventKind::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or_else(|| {
                let known: Vec<&str> = EventKind::ALL.iter().map(|k| k.name()).collect();
                format!("unknown event kind {name:?} (known: {})", known.join(", "))
            })
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The facts an event's kind has; `None` where it has none (left out of JSON).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Facts {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit_seq: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// Objects (retention); projected requests a month (budget exceeded).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// Whether the drill succeeded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ok: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// Health after the change.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub healthy: Option<bool>,
}

/// One event; see the module docs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Unique (a UUID): the CloudEvents id, so a receiver can drop a redelivered one.
    pub id: String,
    /// Its place in the fleet's event log, increasing (`crate::registry`'s `events`); 0: not
    /// in the log (a bus without one, or an event the registry did not take).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub position: u64,
    /// The publishing process's number of it, increasing.
    pub seq: u64,
    pub kind: EventKind,
    pub store_id: String,
    pub time_unix_ms: i64,
    pub detail: String,
    /// Hex, of the span current where it was published; empty when none was traced.
    pub trace_id: String,
    #[serde(flatten)]
    pub facts: Facts,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// An event before the bus numbers it.
#[derive(Debug, Clone)]
pub struct NewEvent {
    pub kind: EventKind,
    pub store_id: String,
    pub detail: String,
    pub facts: Facts,
}

impl NewEvent {
    pub fn new(kind: EventKind, store_id: &str, detail: impl Into<String>) -> NewEvent {
        NewEvent {
            kind,
            store_id: store_id.to_string(),
            detail: detail.into(),
            facts: Facts::default(),
        }
    }

    pub fn with(mut self, facts: Facts) -> NewEvent {
        self.facts = facts;
        self
    }
}

/// The process's event bus; cheap to clone (see the module docs).
#[derive(Clone)]
pub struct Bus {
    inner: Arc<Inner>,
}

struct Inner {
    ring: broadcast::Sender<Arc<Event>>,
    /// Held while an event is numbered and handed on, so every reader sees `seq` order.
    order: Mutex<()>,
    seq: AtomicU64,
    /// The log's queue, on a bus with a log.
    journal: Option<Arc<journal::Queue>>,
    /// The newest position appended to the log by this process (a wake for readers of the log).
    logged: tokio::sync::watch::Sender<u64>,
}

impl Default for Bus {
    fn default() -> Self {
        Self::new()
    }
}

impl Bus {
    /// A bus without a log: events go to the ring as they are published.
    pub fn new() -> Bus {
        Bus::with_journal(None)
    }

    /// A bus with a log: events wait in the returned feed until its writer appended them
    /// ([`journal`]).
    pub fn logged() -> (Bus, journal::Feed) {
        let queue = Arc::new(journal::Queue::default());
        let bus = Bus::with_journal(Some(queue.clone()));
        (bus.clone(), journal::Feed::new(bus, queue))
    }

    fn with_journal(journal: Option<Arc<journal::Queue>>) -> Bus {
        let (ring, _) = broadcast::channel(BUS_CAPACITY);
        Bus {
            inner: Arc::new(Inner {
                ring,
                order: Mutex::new(()),
                seq: AtomicU64::new(0),
                journal,
                logged: tokio::sync::watch::Sender::new(0),
            }),
        }
    }

    /// The newest position this process appended to the log, changing as it appends.
    pub fn logged_position(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.logged.subscribe()
    }

    /// Hands events to the ring, in order (the log's writer, after appending them).
    fn go_live(&self, events: impl IntoIterator<Item = Event>) {
        let _order = self.inner.order.lock().unwrap_or_else(|p| p.into_inner());
        for event in events {
            // No watcher is not an error.
            let _ = self.inner.ring.send(Arc::new(event));
        }
    }

    /// Publishes `new` (never blocks; see the module docs), with the current span's trace id.
    pub fn publish(&self, new: NewEvent) {
        let trace_id = crate::telemetry::current_trace_id().unwrap_or_default();
        let time_unix_ms = crate::units::unix_now_ms();
        let order = self.inner.order.lock().unwrap_or_else(|p| p.into_inner());
        let event = Event {
            id: uuid::Uuid::new_v4().to_string(),
            position: 0,
            seq: self.inner.seq.fetch_add(1, Ordering::Relaxed) + 1,
            kind: new.kind,
            store_id: new.store_id,
            time_unix_ms,
            detail: new.detail,
            trace_id,
            facts: new.facts,
        };
        metrics::counter!(
            crate::telemetry::metrics::EVENTS_PUBLISHED,
            "kind" => event.kind.name()
        )
        .increment(1);
        tracing::debug!(kind = %event.kind, store_id = %event.store_id, detail = %event.detail, "event");
        let event = match &self.inner.journal {
            Some(journal) => match journal.push(event) {
                None => return,
                // Too many waiting for the registry: live at once, unlogged (counted).
                Some(event) => event,
            },
            None => event,
        };
        // No watcher is not an error.
        let _ = self.inner.ring.send(Arc::new(event));
        drop(order);
    }

    /// A watcher of the events published from now on, of `store_id` (every store when empty).
    pub fn subscribe(&self, store_id: String) -> Watcher {
        Watcher {
            ring: self.inner.ring.subscribe(),
            store_id,
        }
    }

    /// The bus bound to `store_id`.
    pub fn emitter(&self, store_id: &str) -> Emitter {
        Emitter {
            bus: Some(self.clone()),
            store_id: store_id.to_string(),
        }
    }

    /// Publishes that a restore drill of `store_id` ended: `ok`, the commit it restored, how
    /// long it took and how many bytes it restored; `error` says why it failed (empty if ok).
    pub fn drill_finished(&self, store_id: &str, d: &DrillOutcome<'_>) {
        let detail = match (d.ok, d.predicted_ms) {
            (true, 0) => format!(
                "drill restored commit {} ({} bytes) in {} ms",
                d.commit_seq, d.bytes, d.duration_ms
            ),
            (true, p) => format!(
                "drill restored commit {} ({} bytes) in {} ms (predicted {p} ms)",
                d.commit_seq, d.bytes, d.duration_ms
            ),
            (false, _) => format!("drill failed: {}", d.error),
        };
        self.publish(
            NewEvent::new(EventKind::DrillFinished, store_id, detail).with(Facts {
                ok: Some(d.ok),
                commit_seq: Some(d.commit_seq),
                duration_ms: Some(d.duration_ms),
                bytes: Some(d.bytes),
                ..Facts::default()
            }),
        );
    }
}

/// A restore drill's outcome, as [`Bus::drill_finished`] publishes it.
#[derive(Debug, Clone, Copy)]
pub struct DrillOutcome<'a> {
    pub ok: bool,
    pub commit_seq: u64,
    /// Measured, and predicted before the drill began (0: none made).
    pub duration_ms: u64,
    pub predicted_ms: u64,
    pub bytes: u64,
    /// Why it failed; empty if ok.
    pub error: &'a str,
}

/// What a watcher reads next.
#[derive(Debug, Clone)]
pub enum Received {
    Event(Arc<Event>),
    /// The watcher fell behind: this many events (of every store) were dropped for it.
    Lagged(u64),
}

/// One watcher's place in the bus ([`Bus::subscribe`]).
pub struct Watcher {
    ring: broadcast::Receiver<Arc<Event>>,
    store_id: String,
}

impl Watcher {
    /// The next event of the watched store, or how many this watcher missed; `None` once the
    /// bus is gone.
    pub async fn next(&mut self) -> Option<Received> {
        loop {
            match self.ring.recv().await {
                Ok(e) if self.store_id.is_empty() || e.store_id == self.store_id => {
                    return Some(Received::Event(e));
                }
                Ok(_) => continue,
                Err(broadcast::error::RecvError::Lagged(n)) => return Some(Received::Lagged(n)),
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }
}

/// A bus bound to one store, or none (publishes nothing): what a worker holds.
#[derive(Clone, Default)]
pub struct Emitter {
    bus: Option<Bus>,
    store_id: String,
}

impl std::fmt::Debug for Emitter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Emitter")
            .field("store_id", &self.store_id)
            .field("bus", &self.bus.is_some())
            .finish()
    }
}

impl Emitter {
    /// Publishes an event of this emitter's store.
    pub fn emit(&self, kind: EventKind, detail: impl Into<String>, facts: Facts) {
        if let Some(bus) = &self.bus {
            bus.publish(NewEvent::new(kind, &self.store_id, detail).with(facts));
        }
    }

    /// [`Bus::drill_finished`] for this emitter's store.
    pub fn drill_finished(&self, d: &DrillOutcome<'_>) {
        if let Some(bus) = &self.bus {
            bus.drill_finished(&self.store_id, d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_slow_watcher_is_told_how_many_it_missed_and_publishing_never_waits() {
        let bus = Bus::new();
        let mut slow = bus.subscribe(String::new());
        let mut one = bus.subscribe("b".into());
        let total = BUS_CAPACITY as u64 + 10;
        for i in 0..total {
            let store = if i == 3 { "b" } else { "a" };
            bus.publish(NewEvent::new(EventKind::Paused, store, format!("{i}")));
        }
        match slow.next().await {
            Some(Received::Lagged(n)) => assert_eq!(n, 10),
            other => panic!("expected a lag marker, got {other:?}"),
        }
        match slow.next().await {
            Some(Received::Event(e)) => assert_eq!(e.seq, 11, "the oldest kept"),
            other => panic!("{other:?}"),
        }
        // The filtered watcher lagged too (the ring is shared), then sees only its store.
        match one.next().await {
            Some(Received::Lagged(n)) => assert_eq!(n, 10),
            other => panic!("expected a lag marker, got {other:?}"),
        }
        // (It is still a full ring behind: the next publish makes it lag by one more.)
        bus.publish(NewEvent::new(EventKind::Resumed, "b", "mine"));
        loop {
            match one.next().await {
                Some(Received::Lagged(n)) => assert_eq!(n, 1),
                Some(Received::Event(e)) => {
                    assert_eq!((e.store_id.as_str(), e.kind), ("b", EventKind::Resumed));
                    break;
                }
                None => panic!("the bus closed"),
            }
        }
    }

    #[test]
    fn kinds_parse_by_name_and_an_unknown_one_lists_the_known() {
        for k in EventKind::ALL {
            assert_eq!(EventKind::parse(k.name()), Ok(k));
        }
        let e = EventKind::parse("pasued").unwrap_err();
        assert!(e.contains("pasued") && e.contains("drill_finished"), "{e}");
    }
}
