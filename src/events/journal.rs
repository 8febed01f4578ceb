//! The log's queue: events published on a bus with a log ([`super::Bus::logged`]) wait here
//! until the log's writer (the service's, `service::fleet::event_log`) took a batch, appended
//! it to the registry and handed it on ([`Feed::appended`]): only then do live watchers see it,
//! with its position.
//!
//! # Invariants
//!
//! - Publishing never waits for the writer: a push under a short lock. At most [`QUEUE_CAP`]
//!   events wait; past that (a registry that hangs rather than fails) an event goes to live
//!   watchers at once, without a position, and is counted `mushroom_backup_events_unlogged_total`.
//! - The writer takes events in the order they were published, at most [`BATCH`] at a time
//!   (one registry transaction each: 10,000 events are 20 commits, not 10,000), and hands each
//!   batch on in that order. A batch the registry refused goes to live watchers without
//!   positions ([`Feed::unlogged`], counted, logged): it is never replayed nor posted to a
//!   webhook, and the writer tries the next batch as usual.
//!
//! # What a crash leaves
//!
//! The events still waiting are lost with the process; those appended stand in the log.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{Bus, Event};
use crate::telemetry::metrics::EVENTS_UNLOGGED;

/// Events waiting for the writer, at most (about a kilobyte each).
pub const QUEUE_CAP: usize = 100_000;
/// Events the writer appends in one transaction, at most.
pub const BATCH: usize = 500;

/// The events waiting for the writer.
#[derive(Default)]
pub(super) struct Queue {
    waiting: Mutex<VecDeque<Event>>,
    wake: Notify,
    overflowed: AtomicU64,
}

impl Queue {
    /// Queues `event` for the writer; gives it back when [`QUEUE_CAP`] are waiting already.
    pub(super) fn push(&self, event: Event) -> Option<Event> {
        {
            let mut q = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
            if q.len() < QUEUE_CAP {
                q.push_back(event);
                drop(q);
                self.wake.notify_one();
                return None;
            }
        }
        metrics::counter!(EVENTS_UNLOGGED).increment(1);
        let n = self.overflowed.fetch_add(1, Ordering::Relaxed) + 1;
        if n == 1 || n.is_multiple_of(1000) {
            tracing::warn!(
                waiting = QUEUE_CAP,
                unlogged = n,
                "{QUEUE_CAP} events wait for the registry's event log: this one goes to live \
                 watchers only, without a position ({n} so far)"
            );
        }
        Some(event)
    }

    fn take(&self, max: usize) -> Vec<Event> {
        let mut q = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        let n = q.len().min(max);
        q.drain(..n).collect()
    }
}

/// The writer's end of a bus with a log.
pub struct Feed {
    bus: Bus,
    queue: Arc<Queue>,
}

impl Feed {
    pub(super) fn new(bus: Bus, queue: Arc<Queue>) -> Feed {
        Feed { bus, queue }
    }

    /// The bus this feed writes for.
    pub fn bus(&self) -> &Bus {
        &self.bus
    }

    /// The oldest events waiting, at most [`BATCH`], waiting for one; `None` once `stop` is
    /// cancelled and nothing waits (what was published before the stop is still given).
    pub async fn next(&self, stop: &CancellationToken) -> Option<Vec<Event>> {
        loop {
            let batch = self.queue.take(BATCH);
            if !batch.is_empty() {
                return Some(batch);
            }
            if stop.is_cancelled() {
                return None;
            }
            tokio::select! {
                _ = self.queue.wake.notified() => {}
                _ = stop.cancelled() => {}
            }
        }
    }

    /// Hands `events`, appended to the log at `positions` (in the same order), to live
    /// watchers, and tells readers of the log that it grew.
    pub fn appended(&self, mut events: Vec<Event>, positions: &[u64]) {
        for (e, p) in events.iter_mut().zip(positions) {
            e.position = *p;
        }
        if let Some(last) = positions.iter().max() {
            self.bus.inner.logged.send_if_modified(|l| {
                let grew = *last > *l;
                *l = (*l).max(*last);
                grew
            });
        }
        self.bus.go_live(events);
    }

    /// Hands `events`, which the log did not take, to live watchers without positions
    /// (counted; see the module docs).
    pub fn unlogged(&self, events: Vec<Event>) {
        metrics::counter!(EVENTS_UNLOGGED).increment(events.len() as u64);
        self.bus.go_live(events);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{EventKind, NewEvent, Received};

    #[tokio::test]
    async fn watchers_hear_an_event_only_once_the_writer_handed_it_on_with_its_position() {
        let (bus, feed) = Bus::logged();
        let mut watcher = bus.subscribe(String::new());
        let mut logged = bus.logged_position();
        for i in 0..3 {
            bus.publish(NewEvent::new(EventKind::Paused, "s", format!("{i}")));
        }
        let stop = CancellationToken::new();
        let batch = feed.next(&stop).await.expect("a batch");
        assert_eq!(batch.len(), 3);
        assert!(batch.windows(2).all(|w| w[0].seq < w[1].seq));
        // Nothing is live before the writer hands it on.
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(50), watcher.next())
                .await
                .is_err()
        );
        feed.appended(batch, &[7, 8, 9]);
        for want in [7, 8, 9] {
            match watcher.next().await {
                Some(Received::Event(e)) => assert_eq!(e.position, want),
                other => panic!("{other:?}"),
            }
        }
        logged.changed().await.unwrap();
        assert_eq!(*logged.borrow(), 9);
        bus.publish(NewEvent::new(EventKind::Resumed, "s", "refused"));
        let batch = feed.next(&stop).await.expect("a batch");
        feed.unlogged(batch);
        match watcher.next().await {
            Some(Received::Event(e)) => assert_eq!((e.position, e.kind), (0, EventKind::Resumed)),
            other => panic!("{other:?}"),
        }
        stop.cancel();
        assert!(
            feed.next(&stop).await.is_none(),
            "stopped with nothing waiting"
        );
    }
}
