//! `WatchHealth`: every watcher is served from one poller.
//!
//! One task reads the health of every store ([`HealthWatch::start`]'s `poll`: the local
//! workers' records and, with a shared registry, the other instances' reports) every
//! `interval` while at least one watcher is open, and publishes the snapshot on a `watch`
//! channel when it changed. `poll` may answer "as before" (`None`) without building a snapshot
//! (`ops::health_view::FleetHealth` does when nothing of the fleet changed). Each watcher's task only filters that snapshot to its store and
//! sends what changed for it; so N watchers cost one registry read per interval, not N. With
//! no watcher the poller sleeps until one subscribes. A poll that took long (a fleet of
//! thousands of stores) stretches the interval after it to [`POLL_SHARE`] times its length,
//! so one open `mb ctl watch-health` (or a dashboard's stream) never costs an idle fleet more
//! than a small share of a core, however many stores it has.
//!
//! At most `max` watchers are open at once; one more is refused ([`WatchersFull`],
//! `RESOURCE_EXHAUSTED`) naming the limit. A watcher's slot is freed when its stream ends (the client went away, the
//! store went away, the service stops).
//!
//! "Changed" ignores what changes with the clock alone: `reported_at_unix_ms`, sub-second lag,
//! and the usage's window with what is projected from it (monthly requests and costs). So an
//! idle fleet is not sent to its watchers again at every poll.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use tokio::sync::{Notify, Semaphore, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::Status;

use super::error::{ServiceError, WatchersFull};
use crate::service::fleet::FleetError;
use crate::service::proto;

/// What a `WatchHealth` call answers.
pub type HealthStream = Pin<Box<dyn Stream<Item = Result<proto::HealthResponse, Status>> + Send>>;

/// The poller's last snapshot: none yet, every store's health, or why it could not be read.
type Snapshot = Option<Result<Arc<proto::HealthResponse>, Status>>;

/// The shared poller and the watchers' slots.
pub struct HealthWatch {
    feed: Arc<watch::Sender<Snapshot>>,
    /// Wakes the idle poller when a watcher subscribes.
    wake: Arc<Notify>,
    slots: Arc<Semaphore>,
    max: usize,
    shutdown: CancellationToken,
    tasks: TaskTracker,
}

impl HealthWatch {
    /// Starts the poller (a task in `tasks`, until `shutdown`; so is each watcher's). `poll`
    /// reads the health of every store.
    pub fn start<F, Fut>(
        poll: F,
        interval: Duration,
        max: usize,
        shutdown: CancellationToken,
        tasks: &TaskTracker,
    ) -> HealthWatch
    where
        F: Fn() -> Fut + Send + 'static,
        Fut: Future<Output = Result<Option<proto::HealthResponse>, ServiceError>> + Send + 'static,
    {
        let (tx, _) = watch::channel(None);
        let feed = Arc::new(tx);
        let wake = Arc::new(Notify::new());
        tasks.spawn(poller(
            feed.clone(),
            wake.clone(),
            poll,
            interval,
            shutdown.clone(),
        ));
        HealthWatch {
            feed,
            wake,
            slots: Arc::new(Semaphore::new(max)),
            max,
            shutdown,
            tasks: tasks.clone(),
        }
    }

    /// A watcher of `store_id` (every store when empty) whose first answer is `first`; then
    /// an answer whenever its part of the snapshot changes.
    pub fn subscribe(
        &self,
        store_id: String,
        first: proto::HealthResponse,
    ) -> Result<HealthStream, ServiceError> {
        let slot = self
            .slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| WatchersFull { max: self.max })?;
        let mut feed = self.feed.subscribe();
        self.wake.notify_one();
        let shutdown = self.shutdown.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        self.tasks.spawn(async move {
            let _slot = slot;
            let mut last = comparable(&first);
            if tx.send(Ok(first)).await.is_err() {
                return;
            }
            loop {
                tokio::select! {
                    _ = tx.closed() => return,
                    _ = shutdown.cancelled() => {
                        let _ = tx.send(Err(ServiceError::ShuttingDown.into())).await;
                        return;
                    }
                    changed = feed.changed() => if changed.is_err() { return },
                }
                let snapshot = feed.borrow_and_update().clone();
                let now = match snapshot {
                    None => continue,
                    Some(Err(status)) => {
                        let _ = tx.send(Err(status)).await;
                        return;
                    }
                    Some(Ok(all)) => match part(&all, &store_id) {
                        Ok(now) => now,
                        Err(e) => {
                            let _ = tx.send(Err(e.into())).await;
                            return;
                        }
                    },
                };
                let cmp = comparable(&now);
                if cmp != last {
                    last = cmp;
                    if tx.send(Ok(now)).await.is_err() {
                        return;
                    }
                }
            }
        });
        Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }
}

/// The poller rests at least this many times as long as its last poll took: a poll reads
/// every store (10,000 take tens of milliseconds), so a big fleet is polled less often than
/// `interval` rather than the poller taking more than a 1/`POLL_SHARE` of a core.
const POLL_SHARE: u32 = 50;

async fn poller<F, Fut>(
    feed: Arc<watch::Sender<Snapshot>>,
    wake: Arc<Notify>,
    poll: F,
    interval: Duration,
    shutdown: CancellationToken,
) where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<Option<proto::HealthResponse>, ServiceError>>,
{
    let mut last: Option<proto::HealthResponse> = None;
    let mut pause = interval;
    loop {
        if feed.receiver_count() == 0 {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = wake.notified() => continue,
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
        let started = tokio::time::Instant::now();
        match poll().await {
            Ok(None) => {}
            Ok(Some(all)) => {
                let cmp = comparable(&all);
                if last.as_ref() != Some(&cmp) {
                    last = Some(cmp);
                    feed.send_replace(Some(Ok(Arc::new(all))));
                }
            }
            Err(e) => {
                last = None;
                feed.send_replace(Some(Err(e.into())));
            }
        }
        pause = interval.max(started.elapsed() * POLL_SHARE);
    }
}

/// The part of the snapshot a watcher of `store_id` sees.
fn part(
    all: &proto::HealthResponse,
    store_id: &str,
) -> Result<proto::HealthResponse, ServiceError> {
    if store_id.is_empty() {
        return Ok(all.clone());
    }
    match all.stores.iter().find(|s| s.store_id == store_id) {
        Some(s) => Ok(proto::HealthResponse {
            stores: vec![s.clone()],
        }),
        None => Err(FleetError::UnknownStore(store_id.to_string()).into()),
    }
}

/// What "changed" compares: without the read time, the lag's fraction of a second, and the
/// usage's window and projections (see the module docs).
fn comparable(r: &proto::HealthResponse) -> proto::HealthResponse {
    let mut r = r.clone();
    for s in &mut r.stores {
        s.reported_at_unix_ms = 0;
        s.lag_seconds = s.lag_seconds.floor();
        if let Some(u) = &mut s.usage {
            u.window_ms = 0;
            u.projected_monthly_requests = 0;
            u.estimated_monthly_cost_usd = 0.0;
            u.requests_monthly_cost_usd = 0.0;
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use tokio_stream::StreamExt as _;

    use super::*;

    fn health(commit: u64) -> proto::HealthResponse {
        proto::HealthResponse {
            stores: vec![proto::StoreHealth {
                store_id: "s".into(),
                durable_commit_seq: commit,
                ..Default::default()
            }],
        }
    }

    #[tokio::test(start_paused = true)]
    async fn many_watchers_one_poll_per_interval_and_a_cap() {
        let polls = Arc::new(AtomicU64::new(0));
        let stop = CancellationToken::new();
        let counter = polls.clone();
        let w = HealthWatch::start(
            move || {
                let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                async move { Ok(Some(health(n))) }
            },
            Duration::from_millis(250),
            20,
            stop.clone(),
            &TaskTracker::new(),
        );
        let mut streams: Vec<HealthStream> = (0..20)
            .map(|_| w.subscribe("s".into(), health(0)).expect("a slot"))
            .collect();
        let refused = w
            .subscribe("s".into(), health(0))
            .err()
            .expect("over the cap");
        assert!(
            matches!(&refused, ServiceError::WatchersFull(w) if w.to_string().contains("20")),
            "{refused:?}"
        );
        for s in &mut streams {
            assert_eq!(s.next().await.unwrap().unwrap(), health(0));
        }
        // Every watcher sees every change, and the registry was read once per change.
        for want in 1..=5u64 {
            for s in &mut streams {
                let got = s.next().await.unwrap().unwrap();
                assert_eq!(got.stores[0].durable_commit_seq, want);
            }
        }
        let n = polls.load(Ordering::SeqCst);
        assert!(
            (5..=6).contains(&n),
            "{n} polls for 20 watchers and 5 changes"
        );
        // A closed stream frees its slot.
        drop(streams.pop());
        let mut again = loop {
            match w.subscribe("s".into(), health(0)) {
                Ok(s) => break s,
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        };
        assert_eq!(again.next().await.unwrap().unwrap(), health(0));
        stop.cancel();
    }
}
