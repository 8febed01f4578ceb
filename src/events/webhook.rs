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
//! # Delivery: from the log, at least once
//!
//! Deliveries come from the registry's event log ([`Outbox`]), never from memory: each webhook
//! has a cursor in the registry (the last position delivered), keyed by [`WebhookConfig::key`]
//! (a hash of the URL as configured, so every instance configured with it shares one cursor).
//! One instance at a time holds a webhook's delivery (a claim in the registry, renewed as it
//! delivers, [`HOLD`] long); the others stand by and take over when the holder goes silent past
//! its hold. The holder posts the events after the cursor, oldest first, one at a time: events
//! arrive in position order, every store's, whichever instance published them. An answer 2xx
//! is delivered (`outcome="ok"`). A connection refused, a timeout ([`POST_TIMEOUT`]), 408, 429
//! or 5xx is retried, the same event, with the one backoff of the program
//! ([`crate::backoff::Backoff`], [`FIRST_RETRY`] doubling to [`MAX_RETRY`]), for as long as it
//! takes (`outcome="failed"` per failed attempt; a log line when a webhook starts failing and
//! one when it delivers again). Any other answer (3xx — no redirect is followed —, 4xx) is
//! the receiver refusing that event: it is given up (`outcome="rejected"`, logged) and the
//! next is posted. The cursor moves past an event once it was delivered or given up, written
//! after each batch of at most [`BATCH`] and at least every [`CURSOR_EVERY`]. A receiver down
//! for a while gets every event the log still holds (its retention: `serve
//! --events-keep-days`, `--events-keep`), in order.
//!
//! Each document's `id` is the event's id (also the `webhook-id` header when signed) and its
//! `position` extension attribute the event's position: a receiver drops a redelivered event
//! by its id.
//!
//! # Shutdown and crashes
//!
//! At the service's shutdown a delivery task writes its cursor, gives up its hold and ends.
//! A crash (SIGKILL) leaves the cursor where it was last written: the events after it are
//! posted again after the restart, or by another instance once the hold lapsed (at least
//! once).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::BoxFuture;
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::http::{Client, Target};
use super::signature::WebhookSecret;
use super::{Event, EventKind, cloudevents};
use crate::backoff::Backoff;
use crate::telemetry::metrics::WEBHOOK_DELIVERIES;

/// Events read from the log at a time, and the most posted between two cursor writes.
pub const BATCH: u32 = 100;
/// The longest a delivered event waits for its cursor write.
pub const CURSOR_EVERY: Duration = Duration::from_millis(250);
/// How long a claim on a webhook's delivery lasts unless renewed (renewed at a third of it).
pub const HOLD: Duration = Duration::from_secs(15);
/// How often a delivery with nothing to post looks at the log for other instances' events
/// (its own instance's wake it at once).
pub const POLL: Duration = Duration::from_secs(1);
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

    /// The key of this webhook's cursor in the registry: SHA-256 (hex) of its URL and its
    /// filter, the same on every instance configured alike; never the URL, which may hold a
    /// token.
    pub fn key(&self) -> String {
        let mut h = Sha256::new();
        h.update(self.target.url.as_str().as_bytes());
        for k in self.kinds.iter().flatten() {
            h.update(b"\0");
            h.update(k.name().as_bytes());
        }
        h.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// The log and the webhooks' cursors, as the deliveries use them (the service's registry,
/// `service::fleet::event_log`); errors are one line, logged as they are.
pub trait Outbox: Send + Sync + 'static {
    /// Takes or keeps the delivery of webhook `key` for this instance: the position delivered
    /// so far; `None`: another instance delivers it.
    fn claim<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<u64>, String>>;
    /// At most `limit` events after `position`, every store's, in position order.
    fn after(&self, position: u64, limit: u32) -> BoxFuture<'_, Result<Vec<Event>, String>>;
    /// Webhook `key` was delivered up to `position`, and its claim is renewed; `false`: another
    /// instance took it over.
    fn delivered<'a>(&'a self, key: &'a str, position: u64) -> BoxFuture<'a, Result<bool, String>>;
    /// Gives up the claim on webhook `key` (at shutdown).
    fn release<'a>(&'a self, key: &'a str) -> BoxFuture<'a, ()>;
}

/// The configured webhooks, checked and with their client built: [`Webhooks::prepare`] can
/// fail (no root certificates for an https webhook), [`Webhooks::spawn`] cannot.
pub struct Webhooks {
    configs: Vec<WebhookConfig>,
    client: Option<Client>,
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
        })
    }

    /// Every webhook's cursor key ([`WebhookConfig::key`]) and name (`host:port`).
    pub fn cursors(&self) -> Vec<(String, String)> {
        self.configs
            .iter()
            .map(|w| (w.key(), w.target.name()))
            .collect()
    }

    /// A delivery task per webhook in `tasks`, from `outbox`, woken when this instance
    /// appends to the log (`wake`), until `shutdown`. `instance_id` makes the documents'
    /// `source`.
    pub fn spawn(
        self,
        instance_id: &str,
        outbox: Arc<dyn Outbox>,
        wake: &watch::Receiver<u64>,
        shutdown: &CancellationToken,
        tasks: &TaskTracker,
    ) {
        let Some(client) = self.client else {
            return;
        };
        let source = cloudevents::source(instance_id);
        for config in self.configs {
            tracing::info!(webhook = %config.target.name(), kinds = ?config.kinds, "posting events to a webhook");
            tasks.spawn(
                Delivery {
                    name: config.target.name(),
                    key: config.key(),
                    config,
                    client: client.clone(),
                    source: source.clone(),
                    outbox: outbox.clone(),
                    shutdown: shutdown.clone(),
                }
                .run(wake.clone()),
            );
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

/// One webhook's delivery task (see the module docs).
struct Delivery {
    config: WebhookConfig,
    name: String,
    key: String,
    client: Client,
    source: String,
    outbox: Arc<dyn Outbox>,
    shutdown: CancellationToken,
}

/// How a delivery round ended.
enum Stop {
    Shutdown,
    /// Another instance holds the webhook now.
    Lost,
}

impl Delivery {
    async fn run(self, mut wake: watch::Receiver<u64>) {
        let mut standing_by = false;
        loop {
            match self.outbox.claim(&self.key).await {
                Ok(Some(cursor)) => {
                    if standing_by {
                        standing_by = false;
                        tracing::info!(webhook = %self.name, cursor, "this instance delivers the webhook now");
                    }
                    match self.deliver_from(cursor, &mut wake).await {
                        Stop::Shutdown => {
                            self.outbox.release(&self.key).await;
                            return;
                        }
                        Stop::Lost => {
                            tracing::info!(webhook = %self.name, "another instance took the webhook's delivery over");
                        }
                    }
                }
                Ok(None) => {
                    if !standing_by {
                        standing_by = true;
                        tracing::info!(webhook = %self.name, "another instance delivers the webhook: standing by");
                    }
                }
                Err(e) => {
                    tracing::warn!(webhook = %self.name, error = %e, "cannot claim the webhook's delivery; trying again");
                }
            }
            if !self.sleep(HOLD / 3).await {
                return;
            }
        }
    }

    /// Waits `d`; `false` at shutdown.
    async fn sleep(&self, d: Duration) -> bool {
        tokio::select! {
            _ = self.shutdown.cancelled() => false,
            _ = tokio::time::sleep(d) => true,
        }
    }

    /// Posts every event after `cursor` while this instance holds the webhook.
    async fn deliver_from(&self, mut cursor: u64, wake: &mut watch::Receiver<u64>) -> Stop {
        let mut backoff = Backoff::new(FIRST_RETRY, MAX_RETRY);
        let mut failing = false;
        let mut renewed = Instant::now();
        loop {
            let batch = match self.outbox.after(cursor, BATCH).await {
                Ok(b) => b,
                Err(e) => {
                    tracing::warn!(webhook = %self.name, error = %e, "cannot read the event log; trying again");
                    if !self.sleep(POLL).await {
                        return Stop::Shutdown;
                    }
                    continue;
                }
            };
            if batch.is_empty() {
                if renewed.elapsed() >= HOLD / 3 {
                    match self.outbox.claim(&self.key).await {
                        Ok(Some(_)) => renewed = Instant::now(),
                        Ok(None) => return Stop::Lost,
                        Err(e) => {
                            tracing::warn!(webhook = %self.name, error = %e, "cannot renew the webhook's claim")
                        }
                    }
                }
                tokio::select! {
                    _ = self.shutdown.cancelled() => return Stop::Shutdown,
                    r = wake.changed() => if r.is_err() && !self.sleep(POLL).await {
                        return Stop::Shutdown;
                    },
                    _ = tokio::time::sleep(POLL) => {}
                }
                continue;
            }
            let mut written = Instant::now();
            let mut unwritten = false;
            for event in batch {
                if self.config.wants(event.kind)
                    && !self.post(&event, &mut backoff, &mut failing).await
                {
                    // Shutdown: what was delivered is written, the rest waits in the log.
                    if unwritten {
                        let _ = self.outbox.delivered(&self.key, cursor).await;
                    }
                    return Stop::Shutdown;
                }
                cursor = event.position;
                unwritten = true;
                if written.elapsed() >= CURSOR_EVERY {
                    match self.write(cursor).await {
                        Some(true) => {}
                        Some(false) => return Stop::Lost,
                        None => {}
                    }
                    written = Instant::now();
                    renewed = written;
                    unwritten = false;
                }
            }
            if unwritten {
                match self.write(cursor).await {
                    Some(false) => return Stop::Lost,
                    Some(true) => renewed = Instant::now(),
                    None => {}
                }
            }
        }
    }

    /// Writes the cursor; `None`: the registry failed (logged; the next write carries it).
    async fn write(&self, cursor: u64) -> Option<bool> {
        match self.outbox.delivered(&self.key, cursor).await {
            Ok(held) => Some(held),
            Err(e) => {
                tracing::warn!(webhook = %self.name, cursor, error = %e, "cannot write the webhook's cursor");
                None
            }
        }
    }

    /// Posts `event` until it is delivered or rejected; `false` at shutdown.
    async fn post(&self, event: &Event, backoff: &mut Backoff, failing: &mut bool) -> bool {
        let name = &self.name;
        let count = |outcome: &'static str| {
            metrics::counter!(WEBHOOK_DELIVERIES, "webhook" => name.clone(), "outcome" => outcome)
                .increment(1);
        };
        let body = match serde_json::to_vec(&cloudevents::document(event, &self.source)) {
            Ok(b) => Bytes::from(b),
            Err(e) => {
                tracing::error!(webhook = %name, position = event.position, error = %e, "cannot encode an event; skipped");
                return true;
            }
        };
        loop {
            let headers = self
                .config
                .secret
                .as_ref()
                .map_or_else(Vec::new, |s| s.headers(&event.id, unix_seconds(), &body));
            let posted = tokio::select! {
                _ = self.shutdown.cancelled() => return false,
                r = self.client.post(&self.config.target, cloudevents::CONTENT_TYPE, &headers, body.clone(), POST_TIMEOUT) => r,
            };
            match judge(posted) {
                Answer::Delivered => {
                    count("ok");
                    if *failing {
                        *failing = false;
                        tracing::info!(webhook = %name, attempts = backoff.attempts() + 1, "the webhook takes events again");
                    }
                    backoff.reset();
                    return true;
                }
                Answer::Rejected(status) => {
                    count("rejected");
                    tracing::warn!(webhook = %name, position = event.position, kind = %event.kind, status, "the webhook refused an event; given up");
                    backoff.reset();
                    return true;
                }
                Answer::Retry(why) => {
                    count("failed");
                    if !*failing {
                        *failing = true;
                        tracing::warn!(webhook = %name, position = event.position, error = %why, "posting to the webhook failed; retrying with backoff, events wait in the log meanwhile");
                    } else {
                        tracing::debug!(webhook = %name, position = event.position, error = %why, "posting to the webhook failed again");
                    }
                    if !backoff.wait(&self.shutdown).await {
                        return false;
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
    fn a_cursor_key_is_the_same_for_the_same_url_and_filter_and_holds_no_token() {
        let key = |u: &str| WebhookConfig::parse(u).unwrap().key();
        let k = key("https://h/x?token=SECRET&kinds=paused");
        assert_eq!(k, key("https://h/x?token=SECRET&kinds=paused"));
        assert_eq!(k.len(), 64);
        assert!(!k.contains("SECRET"));
        assert_ne!(
            k,
            key("https://h/x?token=SECRET"),
            "another filter, another cursor"
        );
        assert_ne!(k, key("https://h/x?token=OTHER&kinds=paused"));
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
}
