//! `serve --webhook-url URL` (repeatable): every event, as a CloudEvents document
//! ([`super::cloudevents`]), POSTed to each webhook in the order published.
//!
//! # The URL and its filter
//!
//! An `http://` or `https://` URL with a host and no credentials (they would be logged; a
//! token belongs in the path or the query, which are never logged nor used as a metric label).
//! A `kinds` query parameter, if any, is the webhook's filter and is not sent:
//! `https://hooks.example/x?kinds=paused,drill_finished&token=t` posts only those two kinds
//! to `https://hooks.example/x?token=t`. Without it every kind is posted. A malformed URL, a
//! scheme other than http(s), an empty or unknown kind ([`EventKind::parse`]) is refused at
//! start, naming the flag and what was wrong.
//!
//! # Signatures
//!
//! With a secret (`serve --webhook-secret-file`, [`WebhookConfig::secret`]) every POST carries
//! the Standard Webhooks headers `webhook-id` (the event's id), `webhook-timestamp` (the
//! attempt's, in Unix seconds) and `webhook-signature` (`v1,` base64 HMAC-SHA256 of
//! `id.timestamp.body`): see [`super::signature`]. A retry is signed again, at its own time.
//!
//! # Errors never show the URL's path or query
//!
//! They may hold a token: a refused `--webhook-url` is named by its scheme and host at most,
//! and logs and metrics name a webhook by `host:port`.
//!
//! # Delivery
//!
//! Each webhook has a queue of at most [`QUEUE_CAP`] events (memory: about a kilobyte an
//! event, so ~10 MiB per webhook when full), filled by the bus as events are published (a push
//! under a short lock: a worker never waits for a webhook), and one task that posts the
//! oldest, waits for its answer, then posts the next: events arrive in order. An answer 2xx is
//! delivered (`outcome="ok"`). A connection refused, a timeout ([`POST_TIMEOUT`]), 408, 429
//! or 5xx is retried, the same event, with the one backoff of the program
//! ([`crate::backoff::Backoff`], [`FIRST_RETRY`] doubling to [`MAX_RETRY`]), for as long as it
//! takes (`outcome="failed"` per failed attempt; a log line when a webhook starts failing and
//! one when it delivers again). Any other answer (3xx — no redirect is followed —, 4xx) is
//! the receiver refusing that event: it is given up (`outcome="rejected"`, logged) and the
//! next is posted. While a receiver is down the queue grows; a push to a full queue drops the
//! oldest waiting event (`outcome="dropped"`, and a log line at the first drop and every
//! thousandth after). So a receiver that comes back gets every event published while it was
//! away, in order, as long as no more than [`QUEUE_CAP`] piled up (plus the one being retried).
//!
//! # Shutdown and crashes
//!
//! The delivery tasks end at the service's shutdown (or when their webhook is dropped): events
//! still queued then are not delivered. Queues are memory only; a crash loses them.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::http::{Client, Target};
use super::signature::WebhookSecret;
use super::{Bus, Event, EventKind, Sink, cloudevents};
use crate::backoff::Backoff;
use crate::telemetry::metrics::WEBHOOK_DELIVERIES;

/// Events waiting per webhook, at most.
pub const QUEUE_CAP: usize = 10_000;
/// First delay before an event is posted again.
pub const FIRST_RETRY: Duration = Duration::from_millis(100);
/// Longest delay between two attempts.
pub const MAX_RETRY: Duration = Duration::from_secs(10);
/// How long one POST may take, connecting included.
pub const POST_TIMEOUT: Duration = Duration::from_secs(10);

/// One `--webhook-url`: where, which kinds (`None`: all), and the secret its deliveries are
/// signed with (`None`: unsigned).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookConfig {
    pub target: Target,
    pub kinds: Option<BTreeSet<EventKind>>,
    pub secret: Option<WebhookSecret>,
}

impl WebhookConfig {
    /// A `--webhook-url` value (see the module docs); an error names what was wrong.
    pub fn parse(value: &str) -> Result<WebhookConfig, String> {
        // The parser's words only (`e` never holds the input): the value may hold a token.
        let mut url = url::Url::parse(value.trim()).map_err(|e| {
            format!("--webhook-url: not a URL ({e}); give e.g. https://hooks.example/path")
        })?;
        let mut kinds = None;
        let mut rest = Vec::new();
        for (k, v) in url.query_pairs() {
            if k == "kinds" {
                let set = kinds.get_or_insert_with(BTreeSet::new);
                for name in v.split(',') {
                    if name.trim().is_empty() {
                        return Err(format!(
                            "--webhook-url: an empty kind in kinds={v:?} (names separated by commas)"
                        ));
                    }
                    set.insert(EventKind::parse(name).map_err(|e| format!("--webhook-url: {e}"))?);
                }
            } else {
                rest.push((k.into_owned(), v.into_owned()));
            }
        }
        if kinds.is_some() {
            if rest.is_empty() {
                url.set_query(None);
            } else {
                url.query_pairs_mut().clear().extend_pairs(rest);
            }
        }
        let target = Target::parse(url).map_err(|e| format!("--webhook-url {e}"))?;
        Ok(WebhookConfig {
            target,
            kinds,
            secret: None,
        })
    }

    pub fn wants(&self, kind: EventKind) -> bool {
        self.kinds.as_ref().is_none_or(|k| k.contains(&kind))
    }
}

/// A webhook's queue: the bus's [`Sink`] for it.
struct Queue {
    config: WebhookConfig,
    name: String,
    cap: usize,
    waiting: std::sync::Mutex<VecDeque<Arc<Event>>>,
    wake: Notify,
    dropped: AtomicU64,
}

impl Sink for Queue {
    fn offer(&self, event: &Arc<Event>) {
        if !self.config.wants(event.kind) {
            return;
        }
        let dropped = {
            let mut q = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
            q.push_back(event.clone());
            (q.len() > self.cap).then(|| q.pop_front())
        };
        if let Some(Some(oldest)) = dropped {
            let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            metrics::counter!(WEBHOOK_DELIVERIES, "webhook" => self.name.clone(), "outcome" => "dropped")
                .increment(1);
            if n == 1 || n.is_multiple_of(1000) {
                tracing::warn!(
                    webhook = %self.name,
                    dropped = n,
                    oldest_seq = oldest.seq,
                    "a webhook's queue is full ({} events): dropped its oldest event ({n} so far)",
                    self.cap
                );
            }
        }
        self.wake.notify_one();
    }
}

impl Queue {
    fn new(config: WebhookConfig, cap: usize) -> Queue {
        Queue {
            name: config.target.name(),
            config,
            cap,
            waiting: std::sync::Mutex::new(VecDeque::new()),
            wake: Notify::new(),
            dropped: AtomicU64::new(0),
        }
    }

    fn pop(&self) -> Option<Arc<Event>> {
        self.waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
    }
}

/// The configured webhooks, checked and with their client built: [`Webhooks::prepare`] can
/// fail (no root certificates for an https webhook), [`Webhooks::start`] cannot.
pub struct Webhooks {
    configs: Vec<WebhookConfig>,
    client: Option<Client>,
    cap: usize,
}

impl Webhooks {
    pub fn prepare(configs: &[WebhookConfig]) -> Result<Webhooks, String> {
        let client = if configs.is_empty() {
            None
        } else {
            Some(Client::new(configs.iter().any(|w| w.target.is_tls()))?)
        };
        Ok(Webhooks {
            configs: configs.to_vec(),
            client,
            cap: QUEUE_CAP,
        })
    }

    /// Puts every webhook's queue on `bus`: events published from now on wait for
    /// [`Deliveries::spawn`]. `instance_id` makes the documents' `source`.
    pub fn attach(self, bus: &Bus, instance_id: &str) -> Deliveries {
        let queues = self
            .configs
            .into_iter()
            .map(|w| {
                let queue = Arc::new(Queue::new(w, self.cap));
                bus.add_sink(queue.clone());
                queue
            })
            .collect();
        Deliveries {
            queues,
            client: self.client,
            source: cloudevents::source(instance_id),
        }
    }
}

/// The webhooks' queues, on the bus, waiting for their delivery tasks.
pub struct Deliveries {
    queues: Vec<Arc<Queue>>,
    client: Option<Client>,
    source: String,
}

impl Deliveries {
    /// A delivery task per webhook in `tasks`, until `shutdown`.
    pub fn spawn(self, shutdown: &CancellationToken, tasks: &TaskTracker) {
        let Some(client) = self.client else {
            return;
        };
        for queue in self.queues {
            tracing::info!(webhook = %queue.name, kinds = ?queue.config.kinds, "posting events to a webhook");
            tasks.spawn(deliver(
                queue,
                client.clone(),
                self.source.clone(),
                shutdown.clone(),
            ));
        }
    }
}

/// What an answer means for the event.
enum Answer {
    Delivered,
    Retry(String),
    Rejected(u16),
}

fn judge(r: Result<u16, super::http::PostError>) -> Answer {
    match r {
        Ok(s) if (200..300).contains(&s) => Answer::Delivered,
        Ok(s) if s == 408 || s == 429 || s >= 500 => Answer::Retry(format!("answered {s}")),
        Ok(s) => Answer::Rejected(s),
        Err(e) => Answer::Retry(e.to_string()),
    }
}

/// The webhook's task: posts the oldest waiting event until it is delivered or rejected, then
/// the next (see the module docs).
async fn deliver(queue: Arc<Queue>, client: Client, source: String, shutdown: CancellationToken) {
    let name = queue.name.clone();
    let count = |outcome: &'static str| {
        metrics::counter!(WEBHOOK_DELIVERIES, "webhook" => name.clone(), "outcome" => outcome)
            .increment(1);
    };
    let mut backoff = Backoff::new(FIRST_RETRY, MAX_RETRY);
    let mut failing = false;
    loop {
        let Some(event) = queue.pop() else {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = queue.wake.notified() => continue,
            }
        };
        let body = match serde_json::to_vec(&cloudevents::document(&event, &source)) {
            Ok(b) => Bytes::from(b),
            Err(e) => {
                tracing::error!(webhook = %name, seq = event.seq, error = %e, "cannot encode an event; skipped");
                continue;
            }
        };
        loop {
            let headers = queue
                .config
                .secret
                .as_ref()
                .map_or_else(Vec::new, |s| s.headers(&event.id, unix_seconds(), &body));
            let posted = tokio::select! {
                _ = shutdown.cancelled() => return,
                r = client.post(&queue.config.target, cloudevents::CONTENT_TYPE, &headers, body.clone(), POST_TIMEOUT) => r,
            };
            match judge(posted) {
                Answer::Delivered => {
                    count("ok");
                    if failing {
                        failing = false;
                        tracing::info!(webhook = %name, attempts = backoff.attempts() + 1, "the webhook takes events again");
                    }
                    backoff.reset();
                    break;
                }
                Answer::Rejected(status) => {
                    count("rejected");
                    tracing::warn!(webhook = %name, seq = event.seq, kind = %event.kind, status, "the webhook refused an event; given up");
                    backoff.reset();
                    break;
                }
                Answer::Retry(why) => {
                    count("failed");
                    if !failing {
                        failing = true;
                        tracing::warn!(webhook = %name, seq = event.seq, error = %why, "posting to the webhook failed; retrying with backoff, events queue meanwhile");
                    } else {
                        tracing::debug!(webhook = %name, seq = event.seq, error = %why, "posting to the webhook failed again");
                    }
                    if !backoff.wait(&shutdown).await {
                        return;
                    }
                }
            }
        }
    }
}

/// Now, in whole seconds since the Unix epoch (a `webhook-timestamp`).
fn unix_seconds() -> u64 {
    u64::try_from(crate::units::unix_now_ms().max(0) / 1000).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::NewEvent;

    #[test]
    fn a_kinds_parameter_is_the_filter_and_is_not_sent() {
        let w = WebhookConfig::parse("http://127.0.0.1:9/x?a=1&kinds=paused,drill_finished&b=2")
            .unwrap();
        assert_eq!(w.target.url.as_str(), "http://127.0.0.1:9/x?a=1&b=2");
        assert!(w.wants(EventKind::Paused) && w.wants(EventKind::DrillFinished));
        assert!(!w.wants(EventKind::Resumed));
        let all = WebhookConfig::parse("https://hooks.example/p?token=t").unwrap();
        assert!(all.kinds.is_none() && all.wants(EventKind::Resumed));
        assert_eq!(all.target.url.as_str(), "https://hooks.example/p?token=t");
        assert_eq!(all.target.name(), "hooks.example:443");
    }

    #[test]
    fn bad_urls_and_kinds_are_refused_saying_what() {
        for (bad, says) in [
            ("not a url", "not a URL"),
            ("ftp://h/x", "not http or https"),
            (
                "http://h/x?kinds=paused,nope",
                "unknown event kind \"nope\"",
            ),
            ("http://h/x?kinds=", "an empty kind"),
            ("http://u:p@h/x", "credentials"),
        ] {
            let e = WebhookConfig::parse(bad).unwrap_err();
            assert!(
                e.contains(says) && e.contains("--webhook-url"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn a_refused_url_never_shows_its_path_or_query() {
        for bad in [
            "ftp://h/SECRET?token=SECRET",
            "unix:/SECRET?token=SECRET",
            "http://u:SECRET@h/SECRET?token=SECRET",
            "http://h/x?token=SECRET&kinds=nope",
            "http://h:99999/SECRET?token=SECRET",
        ] {
            let e = WebhookConfig::parse(bad).unwrap_err();
            assert!(
                !e.contains("SECRET") && e.contains("--webhook-url"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn a_full_queue_drops_its_oldest() {
        let bus = Bus::new();
        let q = Arc::new(Queue::new(
            WebhookConfig::parse("http://127.0.0.1:9/?kinds=paused").unwrap(),
            3,
        ));
        bus.add_sink(q.clone());
        for i in 0..5 {
            bus.publish(NewEvent::new(EventKind::Paused, "s", format!("{i}")));
            bus.publish(NewEvent::new(EventKind::Resumed, "s", "filtered out"));
        }
        let left: Vec<String> = std::iter::from_fn(|| q.pop())
            .map(|e| e.detail.clone())
            .collect();
        assert_eq!(left, ["2", "3", "4"]);
        assert_eq!(q.dropped.load(Ordering::Relaxed), 2);
    }

    /// A receiver answering `statuses` in turn (then 200): the `seq` of every POST it took.
    async fn receiver(statuses: Vec<u16>) -> (String, tokio::sync::mpsc::UnboundedReceiver<u64>) {
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
                tx.send(doc["data"]["seq"].as_u64().unwrap()).unwrap();
                let status = statuses.next().unwrap_or(200);
                let answer = format!("HTTP/1.1 {status} X\r\ncontent-length: 0\r\n\r\n");
                conn.get_mut().write_all(answer.as_bytes()).await.unwrap();
            }
        });
        (url, rx)
    }

    #[tokio::test]
    async fn a_5xx_is_retried_a_4xx_given_up_and_the_next_event_goes_on() {
        let (url, mut posts) = receiver(vec![503, 400]).await;
        let bus = Bus::new();
        let stop = CancellationToken::new();
        let tasks = TaskTracker::new();
        Webhooks::prepare(&[WebhookConfig::parse(&url).unwrap()])
            .unwrap()
            .attach(&bus, "i")
            .spawn(&stop, &tasks);
        bus.publish(NewEvent::new(EventKind::Paused, "s", "one"));
        bus.publish(NewEvent::new(EventKind::Resumed, "s", "two"));
        let mut got = Vec::new();
        while got.len() < 3 {
            got.push(posts.recv().await.unwrap());
        }
        // 1 answered 503 (retried), then 400 (given up); 2 delivered.
        assert_eq!(got, [1, 1, 2]);
        stop.cancel();
        tasks.close();
        tasks.wait().await;
    }
}
