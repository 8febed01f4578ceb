//! `mushroom-backup serve`: the gRPC control plane hosting one backup worker per registered
//! store directory (DESIGN.md section 1).
//!
//! # Rooms
//!
//! The service is five rooms whose imports run one way, top to bottom; a room names only the
//! rooms below it (`tests/architecture.rs`, `ROOMS`), so the domain never imports the edge:
//!
//! 1. [`edge`]: the gRPC edge, thin. [`edge::api`]: the `BackupControl` handlers, a translation
//!    from proto messages to typed calls and back ([`edge::request`]: what the request fields
//!    mean); [`edge::error`]: the one place a gRPC status code is chosen, for every room's
//!    typed errors; [`edge::auth`], [`edge::peer_auth`]: admin, node and peer tokens;
//!    [`edge::server_limits`]: what one client may hold (streams, calls in flight, deadlines);
//!    [`edge::tls_files`]: every TLS file read with the capped secret-file reader and checked
//!    once at start, before the claim (a bad one stops `serve` naming the file and its flag);
//!    [`edge::health_watch`]: every `WatchHealth` stream served by one poller;
//!    [`edge::watch_events`]: `WatchEvents`, the event bus ([`crate::events`]) as a stream;
//!    [`edge::forward_stream`]: streams relayed to another instance.
//! 2. [`cluster`]: the instances together. [`cluster::forward`]: where a call for another
//!    instance's store goes; [`cluster::failover`]: failover groups. Every instance reconciles
//!    the workers it runs with the registry rows it owns (stopping those claimed or moved
//!    away, starting those given to it); an instance of a `--failover-group` claims, one
//!    compare-and-set per store, the stores of a member silent for `--owner-silent-after-ms`
//!    whose directories it sees. The registry row says who should run a store, the bucket
//!    lease who may write it: a claimant waits as a standby until the silent owner's lease has
//!    expired (the timeline, and what a crash at each step leaves, are in the module's docs).
//!    [`cluster::moves`]: `Move` and `Drain`, planned handovers within a group: the owner
//!    checks the target (live, in its group, sees the directory: `CanHost`), flushes and stops
//!    the worker (releasing the lease), compare-and-sets the row, and tells the target to start
//!    it (`Host`). Its errors: [`cluster::ClusterError`].
//! 3. [`ops`]: acts on hosted stores. [`ops::pause`]: `Pause` and `Resume`, stored in the
//!    registry; [`ops::drill`]: `Drill` and scheduled restore drills. Drills restore into
//!    `<data_dir>/drills/`, from which [`run`] removes at start what a crash left (drills'
//!    directories only), before any drill runs; the scheduler is one task of the fleet's
//!    tracker. [`ops::usage`]: requests and their price; `health_view`: local and remote
//!    stores' health as the API shows it; `health_report`: every hosted store's health to the
//!    registry.
//! 4. [`fleet`]: the workers and the registry, answering [`fleet::FleetError`]s; admission
//!    ([`fleet::paths`]: what a store directory may be; [`fleet::destination`]: what a
//!    destination may be; [`fleet::limits`]: the bounds of every request field;
//!    [`fleet::conflicts`]: a new store against the registered ones); [`fleet::store_metrics`]:
//!    every hosted store's health and counters as Prometheus series.
//! 5. [`config`]: the resolved configuration, plain settings every room may read.
//!
//! Beside the rooms: [`proto`], the generated messages, and [`codec`] (malformed requests are
//! `INVALID_ARGUMENT`). This module, above them all, starts them ([`run`]).
//!
//! The standard `grpc.health.v1` service reports SERVING while the registry answers, and
//! server reflection describes the API, as `grpc.reflection.v1` and as `v1alpha` (which
//! Python's `grpcio-reflection`, older grpcurl and most GUI clients speak). The handlers
//! publish registered, deregistered, paused and resumed; the workers the rest.
//!
//! Shutdown (SIGTERM, or the token): the listener stops taking calls, the long-lived streams
//! (`ReportPosition`, `WatchHealth`) end with `UNAVAILABLE` (the graceful shutdown waits for
//! every connection to close, and they never would by themselves), every worker flushes a
//! last restore point and releases its lease, the instance claim is released, then [`run`]
//! returns. Every long-lived task of the service (the claim's renewal, the health reports to
//! the registry and to `grpc.health.v1`, the `WatchHealth` poller and watchers, each
//! `ReportPosition` stream) runs in the fleet's one [`TaskTracker`](tokio_util::task::TaskTracker)
//! (`Fleet::tasks`); after the cancellation tokens, shutdown closes it and waits for all of them.
//!
//! One process per data directory: [`run`] first takes the directory's lock
//! ([`InstanceLock`], `<data_dir>/instance.lock`) and refuses to start, naming the holder's
//! pid, while another live process holds it; it holds the lock until it returns, after every
//! task and worker has stopped, and records in it the nonce of its claim.
//!
//! One process per instance id: [`run`] claims the id in the registry
//! ([`InstanceClaim`]) before it respawns any store, and refuses to start, naming the holder,
//! while another live process holds it. A claim whose holder the lock proves dead (the
//! previous process of this data directory, killed a moment ago) is taken over at once; any
//! other claim only once its heartbeat is `owner_silent_after` old
//! ([`crate::registry::Predecessor`] says which it was). Should another process take the claim over while this
//! one runs (this one was judged dead: no renewal for `owner_silent_after`), it stops serving,
//! stops its workers without a last flush, and [`run`] returns [`ServeError::Claim`].

// The rooms are the crate's own (`pub(crate)`): what the library offers outside is `run`, its
// configuration, the protocol and the per-store metric series.
pub(crate) mod cluster;
pub mod codec;
pub(crate) mod config;
pub(crate) mod edge;
pub(crate) mod fleet;
pub(crate) mod ops;

use ops::drill;
pub mod proto;

pub use cluster::moves::MAX_DRAIN_PARALLEL;
pub use config::limits::{DrillLimits, EventRetention, PauseLimits};
pub use config::peers::PeerToken;
pub use edge::tls_files;
pub use fleet::options::StoreOptions;
pub use fleet::options::proto as store_options_proto;
pub use fleet::store_metrics;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tonic::transport::Server;

pub use config::{Limits, PeerSettings, ServiceConfig, TlsFiles};
use fleet::Fleet;
use proto::backup_control_server::BackupControlServer;

use crate::instance_lock::{InstanceLock, LockError};
use crate::registry::{ClaimRecord, InstanceClaim, Registry};

/// A running server's address, for whoever started it.
#[derive(Debug, Clone)]
pub struct Started {
    pub addr: std::net::SocketAddr,
}

/// Why the service could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{0}")]
    Config(String),
    #[error("registry {url}: {source}")]
    Registry {
        url: String,
        source: crate::registry::RegistryError,
    },
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("TLS: {0}")]
    Tls(String),
    /// A TLS file (`--tls-cert`, `--tls-key`, `--tls-client-ca`, `--peer-ca`) cannot be used.
    #[error("TLS: {0}")]
    TlsFile(#[from] tls_files::TlsFileError),
    #[error("the server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("starting the fleet: {0}")]
    Fleet(#[from] fleet::FleetError),
    /// Another live process holds this instance id, or took it over while this one ran.
    #[error("{0}")]
    Claim(String),
    /// Another live process runs on this data directory, or its lock file cannot be used.
    #[error(transparent)]
    Lock(#[from] LockError),
}

/// Runs the service until `shutdown`; `started` hears the bound address once it listens.
///
/// The phases, in order: take the data directory ([`take_data_dir`]); open the registry;
/// prepare everything that can fail without side effects ([`prepare`]: the port, TLS,
/// reflection, webhooks), so a start that fails leaves no claim behind to block the next one;
/// claim the instance id and announce it; start the fleet and its loops ([`start_fleet`]);
/// serve until shutdown or a lost claim; then stop ([`stop`]).
pub async fn run(
    config: ServiceConfig,
    shutdown: CancellationToken,
    started: Option<tokio::sync::oneshot::Sender<Started>>,
) -> Result<(), ServeError> {
    config.check().map_err(ServeError::Config)?;
    let (mine, lock) = take_data_dir(&config)?;
    let registry = Registry::open(&config.registry_url)
        .await
        .map_err(|source| registry_error(&config, source))?;
    let (prepared, webhooks) = prepare(&config).await?;
    let claim =
        InstanceClaim::take_as_after(&registry, mine, config.owner_silent_after, lock.dead())
            .await
            .map_err(|e| ServeError::Claim(e.to_string()))?;
    // What a crashed process's drills left (before any drill of this one can run).
    drill::clear_scratch(&config.data_dir).map_err(|e| {
        ServeError::Config(format!(
            "drill scratch {}: {e}",
            drill::scratch_root(&config.data_dir).display()
        ))
    })?;
    announce(&registry, &config, prepared.addr).await?;
    let config = Arc::new(config);
    let workers = shutdown.child_token();
    let kind = registry.kind();
    let fleet = start_fleet(registry, claim, &config, &workers, webhooks).await?;
    // Serving stops on shutdown, or when another process took this instance id over.
    let serving = shutdown.child_token();
    stop_serving_on_a_lost_claim(&fleet, &serving);
    let reporter_stop = shutdown.child_token();
    let health_service = health_service(&fleet, &reporter_stop).await;
    let addr = prepared.addr;
    tracing::info!(%addr, instance_id = %config.instance_id, registry = kind, "listening");
    log_operator_auth(&config, addr);
    if kind == "postgres" && config.admin_token.is_some() && config.peers.token.is_none() {
        tracing::warn!(
            "no --peer-token-file: calls for stores other instances own are refused here, \
             since the admin token is never sent to another instance (peer_auth.rs)"
        );
    }
    if let Some(tx) = started {
        let _ = tx.send(Started { addr });
    }
    let result = serve(prepared, health_service, &fleet, &config, &serving).await;
    serving.cancel();
    reporter_stop.cancel();
    stop(&fleet, &workers, lock).await?;
    result.map_err(ServeError::from)
}

fn registry_error(config: &ServiceConfig, source: crate::registry::RegistryError) -> ServeError {
    ServeError::Registry {
        url: crate::registry::redact_url(&config.registry_url),
        source,
    }
}

/// The data directory's lock first, before the registry (which may live in it) and the
/// port: a second process on this directory is refused naming the first. Held until [`run`]
/// returns, after every task and worker has stopped. The allowed roots are created too.
fn take_data_dir(config: &ServiceConfig) -> Result<(ClaimRecord, InstanceLock), ServeError> {
    std::fs::create_dir_all(&config.data_dir)
        .map_err(|e| ServeError::Config(format!("data dir {}: {e}", config.data_dir.display())))?;
    let mine = ClaimRecord::for_this_process(&config.instance_id);
    let mut lock = InstanceLock::take(&config.data_dir, &mine.host)?;
    if let Some(why) = lock.unproven() {
        tracing::info!(lock = %lock.path().display(), "the previous holder of the lock is not proven dead: {why}");
    }
    lock.record(&mine.nonce, mine.pid, mine.started_at_ms)?;
    for root in &config.allow_roots {
        std::fs::create_dir_all(root)
            .map_err(|e| ServeError::Config(format!("allowed root {}: {e}", root.display())))?;
    }
    Ok((mine, lock))
}

/// The layers every call passes: the trace context, then the call's deadline.
type Layers = tower::layer::util::Stack<
    edge::server_limits::CallTimeoutLayer,
    tower::layer::util::Stack<crate::telemetry::GrpcTraceLayer, tower::layer::util::Identity>,
>;

/// What [`prepare`] readied: nothing of it is visible to another process yet.
struct Prepared {
    listener: tokio::net::TcpListener,
    addr: std::net::SocketAddr,
    /// The server with its limits, TLS and the reflection services; the control and health
    /// services are added once the fleet runs.
    router: tonic::transport::server::Router<Layers>,
    peer_tls: cluster::forward::PeerTls,
}

/// Everything that can fail without side effects, before the claim: the reflection
/// services, the port, every TLS file (read and checked here, once: `tls_files.rs`; the
/// peers' for forwarded calls then never touch the disk), the webhooks.
async fn prepare(
    config: &ServiceConfig,
) -> Result<(Prepared, crate::events::webhook::Webhooks), ServeError> {
    // Both reflection versions list both reflection services.
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .include_reflection_service(false)
            .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(
                tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
            )
    };
    let reflection_error = |e| ServeError::Config(format!("reflection: {e}"));
    let reflection_v1 = reflection().build_v1().map_err(reflection_error)?;
    let reflection_v1alpha = reflection().build_v1alpha().map_err(reflection_error)?;
    let bind_error = |source| ServeError::Bind {
        addr: config.listen,
        source,
    };
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(bind_error)?;
    let addr = listener.local_addr().map_err(bind_error)?;
    let limits = &config.limits;
    let mut server = Server::builder()
        .max_concurrent_streams(limits.max_concurrent_streams)
        .concurrency_limit_per_connection(limits.concurrency_per_connection)
        .http2_keepalive_interval(Some(limits.keepalive_interval))
        .http2_keepalive_timeout(Some(limits.keepalive_timeout))
        .layer(crate::telemetry::grpc_trace_layer())
        .layer(limits.call_timeouts());
    let peer_tls = match &config.tls {
        Some(tls) => {
            let loaded = tls_files::load(tls, config.peers.peer_ca.as_deref())?;
            server = server
                .tls_config(loaded.server)
                .map_err(|e| ServeError::Tls(crate::units::error_chain(&e)))?;
            match loaded.peers {
                Some(c) => cluster::forward::PeerTls::Tls(c),
                None => cluster::forward::PeerTls::NoCa,
            }
        }
        None => cluster::forward::PeerTls::Plain,
    };
    let webhooks =
        crate::events::webhook::Webhooks::prepare(&config.webhooks).map_err(ServeError::Config)?;
    let prepared = Prepared {
        listener,
        addr,
        router: server
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha),
        peer_tls,
    };
    Ok((prepared, webhooks))
}

/// Starts the fleet (which respawns the instance's stores) and its loops: the event log's
/// writer and pruner, the health reports to the registry (ops), the failover reconcile
/// (cluster), the webhooks and the drill schedule.
async fn start_fleet(
    registry: Registry,
    claim: InstanceClaim,
    config: &Arc<ServiceConfig>,
    workers: &CancellationToken,
    webhooks: crate::events::webhook::Webhooks,
) -> Result<Arc<Fleet>, ServeError> {
    // The event log's writer starts with the fleet; what the fleet publishes before waits in
    // the bus's queue. A webhook new to the fleet starts at the log's end (before any event).
    let (events, feed) = crate::events::Bus::logged();
    fleet::event_log::init_cursors(&registry, &webhooks)
        .await
        .map_err(|source| registry_error(config, source))?;
    let fleet = Fleet::start(registry, claim, config.clone(), workers.clone(), events).await?;
    fleet.tasks.spawn(fleet::event_log::write(
        fleet.registry().clone(),
        feed,
        workers.clone(),
    ));
    fleet
        .tasks
        .spawn(fleet::event_log::prune(fleet.clone(), workers.clone()));
    // The fleet's own loops, below the rooms that run them.
    fleet
        .tasks
        .spawn(ops::health_report::report_health(fleet.clone()));
    fleet.tasks.spawn(cluster::failover::run(fleet.clone()));
    // They end with the workers; what they did not deliver waits in the log.
    webhooks.spawn(
        &config.instance_id,
        Arc::new(fleet::event_log::RegistryOutbox::new(
            fleet.registry().clone(),
            &config.instance_id,
        )),
        &fleet.events().logged_position(),
        workers,
        &fleet.tasks,
    );
    drill::schedule(fleet.clone());
    Ok(fleet)
}

/// Cancels `serving` when another process takes this instance id over.
fn stop_serving_on_a_lost_claim(fleet: &Arc<Fleet>, serving: &CancellationToken) {
    let lost = fleet.claim_lost();
    let serving = serving.clone();
    fleet.tasks.spawn(async move {
        tokio::select! {
            _ = lost.cancelled() => serving.cancel(),
            _ = serving.cancelled() => {}
        }
    });
}

/// The gRPC health service: SERVING while the registry answers its ping (every 5 s), until
/// `stop`.
async fn health_service(
    fleet: &Arc<Fleet>,
    stop: &CancellationToken,
) -> tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health> {
    let (reporter, service) = tonic_health::server::health_reporter();
    reporter
        .set_serving::<BackupControlServer<edge::api::Api>>()
        .await;
    let polled = fleet.clone();
    let stop = stop.clone();
    fleet.tasks.spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            match polled.registry().ping().await {
                Ok(()) => {
                    reporter
                        .set_serving::<BackupControlServer<edge::api::Api>>()
                        .await
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the registry does not answer: NOT_SERVING");
                    reporter
                        .set_not_serving::<BackupControlServer<edge::api::Api>>()
                        .await
                }
            }
        }
    });
    service
}

/// Serves the control and health services on the prepared listener until `serving` is
/// cancelled.
async fn serve(
    prepared: Prepared,
    health_service: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
    fleet: &Arc<Fleet>,
    config: &ServiceConfig,
    serving: &CancellationToken,
) -> Result<(), tonic::transport::Error> {
    let stop = serving.clone();
    let peers = cluster::forward::Peers::new(
        &config.instance_id,
        prepared.peer_tls,
        config.admin_token.is_some(),
        config.peers.token.as_ref(),
        config
            .peers
            .owner_cache
            .unwrap_or(cluster::owner_cache::DEFAULT_OWNER_CACHE_TTL),
    );
    prepared
        .router
        .add_service(health_service)
        .add_service(BackupControlServer::new(edge::api::Api::new(
            fleet.clone(),
            serving.clone(),
            peers,
        )))
        .serve_with_incoming_shutdown(
            // TCP_NODELAY on every accepted connection: a `Durable` acknowledgement is a few
            // bytes written right after another small frame (a WINDOW_UPDATE for the node's
            // report), and Nagle's algorithm would hold it until the node's delayed ACK, which
            // comes with its next report: measured, every sync ack at 100 commits/s arriving
            // 10 ms (one commit) late once the two fell into step (`benches/durable.rs`).
            tokio_stream::StreamExt::map(
                tokio_stream::wrappers::TcpListenerStream::new(prepared.listener),
                |accepted| {
                    accepted.inspect(|tcp| {
                        let _ = tcp.set_nodelay(true);
                    })
                },
            ),
            async move {
                stop.cancelled().await;
            },
        )
        .await
}

/// Stops the fleet after serving ended: with a last flush of every store, then gives up the
/// claim; or, when another process took the claim over (it runs these stores now), at once,
/// without a flush, keeping the claim, and returns why.
async fn stop(
    fleet: &Arc<Fleet>,
    workers: &CancellationToken,
    lock: InstanceLock,
) -> Result<(), ServeError> {
    let lost = fleet.claim_lost_why();
    if lost.is_none() {
        tracing::info!("stopping: flushing every store");
    }
    fleet.shutdown_all(lost.is_none()).await;
    fleet.release_leases().await;
    workers.cancel();
    fleet.stop_tasks().await;
    if let Some(why) = lost {
        drop(lock);
        return Err(ServeError::Claim(why));
    }
    fleet.release_claim().await;
    drop(lock);
    Ok(())
}

/// Writes where this instance answers the others' calls, and its failover group, into the
/// registry (after the claim: a refused process never overwrites the live one's address).
async fn announce(
    registry: &Registry,
    config: &ServiceConfig,
    addr: std::net::SocketAddr,
) -> Result<(), ServeError> {
    let advertised = match &config.peers.advertise_address {
        Some(a) => a.clone(),
        None if !addr.ip().is_unspecified() => addr.to_string(),
        None => {
            tracing::warn!(
                %addr,
                "listening on a wildcard address without --advertise-address: the other \
                 instances sharing the registry cannot forward calls for this instance's stores"
            );
            String::new()
        }
    };
    let group = config.peers.failover_group.as_deref().unwrap_or("");
    registry
        .announce_instance(
            &config.instance_id,
            &advertised,
            group,
            crate::units::unix_now_ms(),
        )
        .await
        .map_err(|source| ServeError::Registry {
            url: crate::registry::redact_url(&config.registry_url),
            source,
        })?;
    tracing::info!(advertise_address = %advertised, failover_group = group, "announced to the registry");
    Ok(())
}

/// Says at start, loudly when it matters, who may make operator calls.
fn log_operator_auth(config: &ServiceConfig, addr: std::net::SocketAddr) {
    if config.admin_token.is_some() {
        return;
    }
    if config.no_operator_auth {
        tracing::error!(
            %addr,
            "OPERATOR AUTH IS OFF (no_operator_auth): anyone who can connect to {addr} may \
             register, deregister, trigger and adopt stores; only behind something that \
             authenticates every caller"
        );
    } else {
        tracing::warn!(
            %addr,
            "no admin token: every local user and process that can connect to {addr} may make \
             operator calls; set MUSHROOMDB_BACKUP_ADMIN_TOKEN or admin_token_file"
        );
    }
}
