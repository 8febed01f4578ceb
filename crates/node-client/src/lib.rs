//! `mushroom-node-client`: [`NodeClient`], the position reporter a database node embeds
//! (DESIGN.md section 3).
//!
//! It depends on the protocol (`mushroom-proto`: messages and client, no server), the formats
//! (`mushroom-format`: [`WalPosition`]) and the backoff (`mushroom-backoff`), and on nothing of
//! the service: an engine that adds it gets a tonic client channel (TLS on aws-lc-rs), tokio
//! and little else. `examples/engine.rs` in this crate is a whole engine embedding it.
//!
//! Waiting until a commit is durable in the bucket: [`NodeClient::wait_durable`] and the watch
//! [`NodeClient::durable`] (`durable.rs`: what an acknowledgement means, and why a lost
//! stream or a moved owner fails waits rather than acknowledging them).
//!
//! A node that backs up through `mushroom-backup serve` tells the service how much of its WAL
//! is durable, after every group commit, on the `ReportPosition` stream. This module is that
//! stream's client side, written for an engine author:
//!
//! ```no_run
//! # async fn demo(engine_sync: impl Fn() -> mushroom_format::store::WalPosition) {
//! use std::time::Duration;
//! use mushroom_node_client::{NodeClient, NodeClientConfig};
//!
//! let client = NodeClient::connect(NodeClientConfig::new(
//!     "http://127.0.0.1:50051", "the-store-id", "the-node-token",
//! )).expect("a well-formed configuration");
//! // After every fsync of the WAL (cheap: never blocks, never fails):
//! client.report(engine_sync());
//! // Before exiting: wait until the last position reached the server, then end the stream.
//! client.flush(Duration::from_secs(10)).await.expect("reported");
//! client.close().await;
//! # }
//! ```
//!
//! # What it promises
//!
//! - [`NodeClient::report`] only stores the position in a watch channel (the newest wins) and
//!   returns: the engine's commit path never waits for the network, and a slow or absent
//!   server costs nothing but memory for one position. Only positions the engine has fsynced
//!   may be reported: the service backs up what it is told is durable.
//! - A background task owns the connection: it connects (never blocking `connect`), sends every
//!   newest position on the stream with `authorization: Bearer <token>`, and on a broken
//!   connection reconnects with exponential backoff (`first_backoff` doubling to
//!   `max_backoff`), sending the newest position first thing on every new stream. Positions
//!   superseded while disconnected are never sent: only the newest matters.
//! - Reports on a stream are at least `min_report_interval` apart (10 ms by default): a
//!   position reported sooner waits for the rest of the interval, and what is reported
//!   meanwhile coalesces into the newest. A node reporting every group commit at thousands a
//!   second thus sends at most a hundred reports a second, and while the task waits out the
//!   interval nothing listens on the channel, so [`NodeClient::report`] wakes no thread: the
//!   commit path pays a few atomic operations, not a wake-up and a write per commit. At the
//!   usual rates (a report every few tens of milliseconds or slower) every report goes at
//!   once. Closing cuts the wait short: the newest position goes before the stream ends.
//!   So does anyone waiting for an acknowledgement (a [`NodeClient::wait_durable`] pending or
//!   a [`NodeClient::durable`] receiver alive): then every report goes at once, because a
//!   `durability = sync` engine holds each commit's ack until the service's `Durable`, and
//!   the spacing would add up to its length to every ack (at 100 commits/s and 10 ms, most of
//!   the gap). Such an engine needs no tuning; one that never waits keeps the coalescing.
//! - `UNAUTHENTICATED`, `NOT_FOUND`, `PERMISSION_DENIED`, `INVALID_ARGUMENT` and
//!   `UNIMPLEMENTED` are permanent: the task stops (no endless reconnect loop), the state turns
//!   [`ConnectionState::Failed`] and [`NodeClient::last_error`] says why. Anything else is
//!   retried; `last_error` names the latest failure meanwhile.
//! - A `Refresh` from the server (the files on disk show a snapshot or WAL the node has not
//!   reported) reaches every [`NodeClient::refresh_requests`] receiver and the optional
//!   `on_refresh` callback. The engine should re-read its files and report its position again
//!   (the same position is sent again too: every `report` call is sent, equal or not, unless
//!   a newer one supersedes it first).
//! - [`NodeClient::flush`] waits until the newest position was handed to a stream the server
//!   accepted (it answered the call after checking the token). The protocol has no per-report
//!   acknowledgement, so a connection that breaks right after may lose it; then the reconnect
//!   sends it again. [`NodeClient::close`] is the strong end: it half-closes the stream after
//!   the newest position and waits until the server has read the stream to its end.
//!
//! # Shutdown
//!
//! One cancellation token inside the client: [`close`](NodeClient::close) and dropping the
//! client cancel it; the task then sends what is pending, ends the stream and exits. Dropping
//! does not wait for any of that; `close` does (bounded by `close_timeout`).

mod task;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Status};

use mushroom_backoff::Backoff;
use mushroom_format::store::WalPosition;
use mushroom_format::units::error_chain;
use mushroom_proto::{self as proto, backup_control_client::BackupControlClient};

mod durable;
pub use durable::{DurableAck, DurableView};

/// Called with the reason of every `Refresh`.
pub type RefreshCallback = Arc<dyn Fn(&str) + Send + Sync>;

/// The default [`NodeClientConfig::min_report_interval`]: a hundred reports a second at most,
/// a hundredth of the default `wal_interval` of delay at most.
pub const DEFAULT_MIN_REPORT_INTERVAL: Duration = Duration::from_millis(10);

/// The largest [`NodeClientConfig::min_report_interval`] accepted (the default
/// `wal_interval`).
pub const MAX_MIN_REPORT_INTERVAL: Duration = Duration::from_secs(1);

/// How to reach the service and who this node is.
#[derive(Clone)]
pub struct NodeClientConfig {
    /// `http://host:port`, or `https://host:port` (then `tls_ca_pem` or the system's roots).
    pub server: String,
    /// The store id `Register` or `Adopt` returned.
    pub store_id: String,
    /// The node token `Register` or `Adopt` returned (shown once by the server).
    pub token: String,
    /// PEM of the CA that signed the server's certificate, for `https://`.
    pub tls_ca_pem: Option<Vec<u8>>,
    /// PEM certificate and private key this node presents, for a server that requires client
    /// certificates (mutual TLS); `https://` only.
    pub tls_client_identity_pem: Option<(Vec<u8>, Vec<u8>)>,
    /// The first reconnect delay; doubles per failed attempt up to `max_backoff`.
    pub first_backoff: Duration,
    pub max_backoff: Duration,
    /// How long one connection attempt may take.
    pub connect_timeout: Duration,
    /// How long [`NodeClient::close`] waits for the server to read the stream to its end.
    pub close_timeout: Duration,
    /// Called (on the client's task) with the reason of every `Refresh`; keep it short.
    pub on_refresh: Option<RefreshCallback>,
    /// The least time between two reports on a stream (zero: none). Positions reported
    /// faster coalesce into the newest, so a node committing thousands of times a second
    /// sends at most one report per interval, and its `report` calls wake nothing meanwhile.
    /// Delays a report by at most this; the service ships every `wal_interval` (1 s). Not
    /// applied while someone waits for an acknowledgement (see the module docs).
    pub min_report_interval: Duration,
}

impl NodeClientConfig {
    /// A configuration with the default timings (backoff 100 ms doubling to 10 s).
    pub fn new(
        server: impl Into<String>,
        store_id: impl Into<String>,
        token: impl Into<String>,
    ) -> Self {
        Self {
            server: server.into(),
            store_id: store_id.into(),
            token: token.into(),
            tls_ca_pem: None,
            tls_client_identity_pem: None,
            first_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            close_timeout: Duration::from_secs(10),
            on_refresh: None,
            min_report_interval: DEFAULT_MIN_REPORT_INTERVAL,
        }
    }
}

impl std::fmt::Debug for NodeClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
        f.debug_struct("NodeClientConfig")
            .field("server", &self.server)
            .field("store_id", &self.store_id)
            .field("tls_ca_pem", &self.tls_ca_pem.as_ref().map(|_| "…"))
            .field(
                "tls_client_identity_pem",
                &self.tls_client_identity_pem.as_ref().map(|_| "…"),
            )
            .field("first_backoff", &self.first_backoff)
            .field("max_backoff", &self.max_backoff)
            .field("min_report_interval", &self.min_report_interval)
            .finish_non_exhaustive()
    }
}

/// What went wrong; `Clone` so that [`NodeClient::last_error`] can hand it out.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NodeClientError {
    #[error("bad configuration: {0}")]
    Config(String),
    /// The server answered with a code retrying cannot change (a wrong token, an unknown
    /// store): the client stopped.
    #[error("the server refused the node: {}: {message}", code_name(*code))]
    Rejected { code: Code, message: String },
    /// No connection (retried).
    #[error("cannot connect to {server}: {detail}")]
    Connect { server: String, detail: String },
    /// The stream broke or ended (retried).
    #[error("the position stream broke: {}: {message}", code_name(*code))]
    Stream { code: Code, message: String },
    #[error("the newest position was not reported within {0:?}")]
    Timeout(Duration),
    #[error("the client is closed")]
    Closed,
    /// What the service vouched for may no longer hold (`durable.rs`): the wait failed, no
    /// acknowledgement was made up.
    #[error("durability lost before the commit was acknowledged: {0}")]
    DurabilityLost(String),
    #[error("commit {commit_seq} was not acknowledged as durable within {waited:?}")]
    NotDurable { commit_seq: u64, waited: Duration },
}

impl NodeClientError {
    /// Whether the client gave up (it will not reconnect).
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            NodeClientError::Rejected { .. } | NodeClientError::Config(_)
        )
    }
}

/// The gRPC name of a status code (`NOT_FOUND`), as operators read it in logs and docs.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// Codes that retrying cannot fix.
fn permanent(code: Code) -> bool {
    matches!(
        code,
        Code::Unauthenticated
            | Code::NotFound
            | Code::PermissionDenied
            | Code::InvalidArgument
            | Code::Unimplemented
    )
}

/// Where the connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionState {
    /// Connecting (or waiting for the server to accept the stream).
    Connecting,
    /// The server accepted the stream.
    Connected,
    /// The last attempt failed; the next one starts after `delay`.
    Backoff { attempt: u32, delay: Duration },
    /// Permanently refused: see [`NodeClient::last_error`].
    Failed,
    /// Closed by the client.
    Closed,
}

/// A `Refresh` command from the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefreshRequest {
    pub reason: String,
}

/// The newest report: its number (every `report` call gets the next one) and position.
type Newest = Option<(u64, WalPosition)>;

/// What the task tells the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Progress {
    state: ConnectionState,
    /// Number of the newest report handed to the current stream (0: none).
    sent: u64,
}

struct Shared {
    progress: watch::Sender<Progress>,
    last_error: Mutex<Option<NodeClientError>>,
    refresh: broadcast::Sender<RefreshRequest>,
    durable: durable::DurableTx,
    /// Cuts the report spacing short when someone waits for an acknowledgement
    /// ([`durable::awaited`]).
    urgent: tokio::sync::Notify,
}

impl Shared {
    fn set_error(&self, e: NodeClientError) {
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
    }

    fn set_state(&self, state: ConnectionState) {
        self.progress.send_modify(|p| p.state = state);
    }
}

/// The position reporter; see the module docs. Cheap to share behind an `Arc`.
pub struct NodeClient {
    newest: watch::Sender<Newest>,
    shared: Arc<Shared>,
    stop: CancellationToken,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Tracks `task`: after `close`, nothing the client spawned is left running.
    tasks: tokio_util::task::TaskTracker,
    close_timeout: Duration,
}

impl NodeClient {
    /// Checks the configuration and starts the background task; returns at once (the
    /// connection is made in the background). Must be called inside a Tokio runtime.
    pub fn connect(config: NodeClientConfig) -> Result<NodeClient, NodeClientError> {
        let endpoint = endpoint(&config)?;
        let auth: tonic::metadata::MetadataValue<tonic::metadata::Ascii> =
            format!("Bearer {}", config.token)
                .parse()
                .map_err(|_| NodeClientError::Config("the token must be printable ASCII".into()))?;
        if config.token.trim().is_empty() {
            return Err(NodeClientError::Config("the token is empty".into()));
        }
        if config.store_id.is_empty() {
            return Err(NodeClientError::Config("the store id is empty".into()));
        }
        if config.first_backoff.is_zero() || config.max_backoff < config.first_backoff {
            return Err(NodeClientError::Config(
                "backoff: first must be positive and at most max".into(),
            ));
        }
        if config.min_report_interval > MAX_MIN_REPORT_INTERVAL {
            return Err(NodeClientError::Config(format!(
                "min_report_interval {:?} is above {MAX_MIN_REPORT_INTERVAL:?}: reports would lag \
                 the service's shipping",
                config.min_report_interval
            )));
        }
        let (newest, newest_rx) = watch::channel(None);
        let shared = Arc::new(Shared {
            progress: watch::channel(Progress {
                state: ConnectionState::Connecting,
                sent: 0,
            })
            .0,
            last_error: Mutex::new(None),
            refresh: broadcast::channel(16).0,
            durable: watch::channel(DurableView::default()).0,
            urgent: tokio::sync::Notify::new(),
        });
        let stop = CancellationToken::new();
        let task = Task {
            endpoint,
            auth,
            config: config.clone(),
            newest: newest_rx,
            shared: shared.clone(),
            stop: stop.clone(),
        };
        // The client's one long-lived task, tracked; `close` waits for it.
        let tasks = tokio_util::task::TaskTracker::new();
        let handle = tasks.spawn(task.run());
        tasks.close();
        Ok(NodeClient {
            newest,
            shared,
            stop,
            task: Mutex::new(Some(handle)),
            tasks,
            close_timeout: config.close_timeout,
        })
    }

    /// Reports a durable position: stores it as the newest and returns at once. Never blocks
    /// and never fails; every call is sent (unless a newer one supersedes it first), at once
    /// while someone waits for an acknowledgement (see the module docs).
    pub fn report(&self, position: WalPosition) {
        self.newest.send_modify(|n| {
            let next = n.map_or(1, |(seq, _)| seq + 1);
            *n = Some((next, position));
        });
        if durable::awaited(&self.shared) {
            self.shared.urgent.notify_one();
        }
    }

    /// The newest position reported, if any.
    pub fn newest(&self) -> Option<WalPosition> {
        self.newest.borrow().map(|(_, p)| p)
    }

    /// `Refresh` requests from the server, from now on. An engine that gets one re-reads its
    /// files and calls [`report`](Self::report) again.
    pub fn refresh_requests(&self) -> broadcast::Receiver<RefreshRequest> {
        self.shared.refresh.subscribe()
    }

    /// Where the connection is.
    pub fn state(&self) -> ConnectionState {
        self.shared.progress.borrow().state
    }

    /// The latest failure (of a connection attempt, a stream, or the permanent one).
    pub fn last_error(&self) -> Option<NodeClientError> {
        self.shared
            .last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Waits until the server has accepted the stream; fails if it refuses the node or the
    /// timeout passes first.
    pub async fn wait_connected(&self, timeout: Duration) -> Result<(), NodeClientError> {
        self.wait_for(timeout, |p| p.state == ConnectionState::Connected)
            .await
    }

    /// Waits until the newest position reported so far was handed to a stream the server
    /// accepted (see the module docs for what that does and does not prove).
    pub async fn flush(&self, timeout: Duration) -> Result<(), NodeClientError> {
        let Some((target, _)) = *self.newest.borrow() else {
            return Ok(());
        };
        self.wait_for(timeout, |p| {
            p.state == ConnectionState::Connected && p.sent >= target
        })
        .await
    }

    async fn wait_for(
        &self,
        timeout: Duration,
        done: impl Fn(&Progress) -> bool,
    ) -> Result<(), NodeClientError> {
        let mut rx = self.shared.progress.subscribe();
        let wait = rx.wait_for(|p| {
            done(p) || matches!(p.state, ConnectionState::Failed | ConnectionState::Closed)
        });
        match tokio::time::timeout(timeout, wait).await {
            Err(_) => Err(NodeClientError::Timeout(timeout)),
            Ok(Err(_)) => Err(NodeClientError::Closed),
            Ok(Ok(p)) if done(&p) => Ok(()),
            Ok(Ok(p)) if p.state == ConnectionState::Failed => {
                Err(self.last_error().unwrap_or(NodeClientError::Closed))
            }
            Ok(Ok(_)) => Err(NodeClientError::Closed),
        }
    }

    /// Sends what is pending, ends the stream, and waits (up to `close_timeout`) until the
    /// server has read it to its end. Reports after this are ignored.
    pub async fn close(&self) {
        self.stop.cancel();
        let handle = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(mut handle) = handle
            && tokio::time::timeout(self.close_timeout, &mut handle)
                .await
                .is_err()
        {
            handle.abort();
            tracing::warn!("the position stream did not end in time; dropped it");
        }
        // An aborted task ends at its next poll.
        self.tasks.wait().await;
        self.shared.set_state(ConnectionState::Closed);
    }
}

impl Drop for NodeClient {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn endpoint(config: &NodeClientConfig) -> Result<Endpoint, NodeClientError> {
    let bad = |why: String| NodeClientError::Config(format!("server {:?}: {why}", config.server));
    // `http::Uri` (tonic's own) rather than a URL parser: one fewer dependency tree (IDNA) for
    // an engine, and the address is parsed as the channel will read it.
    let uri: http::Uri = config
        .server
        .parse()
        .map_err(|e: http::uri::InvalidUri| bad(e.to_string()))?;
    let tls = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        other => {
            return Err(bad(format!(
                "the scheme must be http or https, not {}",
                other.unwrap_or("none")
            )));
        }
    };
    let mut ep = Endpoint::from_shared(config.server.clone())
        .map_err(|e| bad(e.to_string()))?
        .connect_timeout(config.connect_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(20))
        .keep_alive_while_idle(true);
    if tls {
        let mut t = ClientTlsConfig::new();
        if let Some(host) = uri.host() {
            t = t.domain_name(host.to_string());
        }
        if let Some(ca) = &config.tls_ca_pem {
            t = t.ca_certificate(Certificate::from_pem(ca));
        }
        if let Some((cert, key)) = &config.tls_client_identity_pem {
            t = t.identity(Identity::from_pem(cert, key));
        }
        ep = ep.tls_config(t).map_err(|e| bad(format!("TLS: {e}")))?;
    } else if config.tls_client_identity_pem.is_some() {
        return Err(bad(
            "a client certificate needs an https:// server".to_string()
        ));
    }
    Ok(ep)
}

/// The background task: connect, stream, reconnect.
struct Task {
    endpoint: Endpoint,
    auth: tonic::metadata::MetadataValue<tonic::metadata::Ascii>,
    config: NodeClientConfig,
    newest: watch::Receiver<Newest>,
    shared: Arc<Shared>,
    stop: CancellationToken,
}

/// How one connection ended.
enum Ended {
    /// The client closed and the server read the stream to its end.
    Closed,
    /// Retry after a backoff; `accepted` says whether the server had accepted the stream.
    Retry {
        error: NodeClientError,
        accepted: bool,
    },
    Permanent(NodeClientError),
}

/// The wire form of a position.
pub fn position_report(store_id: &str, pos: &WalPosition) -> proto::PositionReport {
    proto::PositionReport {
        store_id: store_id.to_string(),
        snapshot_id: pos.snapshot_id.map(|s| s.to_string()).unwrap_or_default(),
        wal_id: pos.wal_id.to_string(),
        wal_number: pos.wal_number,
        durable_len: pos.durable_len,
        commit_seq: pos.commit_seq,
    }
}
