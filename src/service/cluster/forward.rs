//! Any instance answers every call: a store-scoped call that arrives at an instance which does
//! not run the store is forwarded to the store's owner, and the owner's answer returned
//! unchanged (issue 15, "one control plane over many instances").
//!
//! # Where a call goes
//!
//! [`Peers::route`] decides, for a call naming a store:
//! - the store runs here: handled here;
//! - the registry names another instance as its owner: forwarded there ([`Hop`]);
//! - the store is unknown, or the registry names this instance (a store whose worker is still
//!   starting): handled here, which answers as it always did (`NOT_FOUND`, ...).
//!
//! `WatchHealth` of one store and `WatchEvents` naming a store go the same way, and the
//! owner's stream is relayed back (`forward_stream.rs`), as is a node's `ReportPosition`.
//!
//! # The owner cache
//!
//! The owner and its address are read from the registry (one query) and remembered for
//! `--owner-cache-ms` (default 1 s; `owner_cache.rs`), so a steady stream of calls through a
//! non-owner reads the registry about once a second per store. A remembered owner may be
//! stale after a failover claim or a `ctl move`: when the owner it names answers
//! `FAILED_PRECONDITION` or `NOT_FOUND` (what the one-hop rule makes an instance that does not
//! run the store answer) or cannot be reached, it is forgotten, the registry is read again,
//! and if that names another owner or address the call is sent there, once, with what is left
//! of the caller's deadline. An owner the fresh read still names keeps its answer: a call is
//! never sent twice to the same owner, so a `FAILED_PRECONDITION` the real owner meant (a
//! paused store's `Trigger`) costs one registry read, not a second `Trigger`. A call whose
//! owner was just read (not remembered) is not retried: that read is as fresh as a retry's.
//! So an ownership change routes a call wrongly for at most one retry. A node's
//! `ReportPosition` stream is the exception: it reads the registry every time it is opened
//! ([`Peers::route_uncached`]), since its reports cannot be sent twice. (An owner that could
//! not be reached may have done the work before its connection broke, like any call whose
//! connection breaks; the retry then does it at the new owner too. Every forwarded call is
//! one a caller may repeat: a `Trigger`, a `Pause` replacing itself, a read.)
//!
//! `Register` and `Adopt` name the instance where the directory lives (`instance_id`, default
//! the instance called) and go there through [`Peers::hop_to`].
//!
//! # At most one hop
//!
//! A forwarded call carries [`FORWARDED_BY`] (the forwarding instance's id). An instance that
//! receives a forwarded call never forwards it again: it handles it itself, so a registry
//! that changed between the two reads (the store moved) answers `FAILED_PRECONDITION` naming
//! the owner the registry now names, never a loop. A client setting the header itself only
//! gets the local answer.
//!
//! # What a forwarded call carries
//!
//! - the message as received (re-encoded, so the owner checks every field again);
//! - the peer token when configured, never the admin token nor the caller's `authorization`
//!   (`peer_auth.rs`; without one, an instance enforcing an admin token forwards nothing:
//!   [`ForwardError::NoPeerToken`]), and the original caller's address;
//! - the caller's deadline: the remaining `grpc-timeout`, so the owner stops when the caller
//!   gives up; without one, [`DEFAULT_FORWARD_TIMEOUT`];
//! - the trace: a client span `grpc.forward` (naming the owner and its address) is the parent
//!   of the owner's `grpc.request`, through `traceparent`.
//!
//! Nothing else of the caller's metadata is passed on. A node's `ReportPosition` relay
//! carries the node's own `authorization` (its store's node token, which the owner checks)
//! and no peer token.
//!
//! # The owner's answer, unchanged
//!
//! The owner's response message, or its status (code, message and details), is returned as
//! the owner answered. When the owner cannot be reached (no connection, a connection that
//! broke before an answer) the call answers `UNAVAILABLE` naming the owner and its address:
//! [`ForwardError::Unreachable`]. An owner that advertises no address is
//! [`ForwardError::NoAddress`] (`FAILED_PRECONDITION`: it needs `--advertise-address`).
//!
//! # Transport
//!
//! One lazily connected channel per owner address, kept for the process's life and replaced
//! when the owner's advertised address changes (a restart on another port). Over TLS (this
//! instance serves TLS) the peers are reached with `https`, trusting the CA of
//! `--peer-ca` (default: `--tls-client-ca`, the CA one fleet's certificates share) and
//! presenting this instance's own certificate, so mutual TLS between instances needs
//! nothing more. The owner's certificate is checked against the name of the instance the
//! registry names as the owner ([`crate::service::config::peers::peer_name`]), not its advertised
//! address: a registry row pointing a store at any other process is refused by the
//! handshake (`UNAVAILABLE` naming the owner and why). That configuration is built once at start from files read and checked
//! there (`tls_files.rs`): a bad file stops `serve` naming it and its flag, and no call
//! here reads a file. Nothing here holds state a crash could leave half-done: a forwarded
//! call the owner finished but whose answer was lost is answered `UNAVAILABLE`, as any call
//! whose connection breaks.
//!
//! # How large a forwarded message may be
//!
//! [`FORWARD_MAX_MESSAGE`], 16 MiB, the same both ways (what this instance sends an owner
//! and what it accepts back). The largest message that goes through a hop is the
//! `DrainResponse` of an instance running the 10,000 stores one instance is sized for:
//! every store failed, each failure line at most [`super::moves::MAX_FAILED_LINE`] bytes,
//! is about 10.3 MB; every store moved, with instance ids of the longest (255 bytes), 5.7 MB
//! (`moves.rs`'s `the_largest_forwarded_message_fits` builds both). Everything else is far smaller: a
//! page of restore points (at most 1,000) is some 200 KB, one store's health or a request
//! with every label (64 of 1.25 KiB) under 100 KB. `ListStores`, whose answer (the whole
//! fleet) is the largest of all, is never forwarded: every instance answers it from the
//! registry. A bound of 64 MiB would let a broken or hostile peer make this instance hold
//! that much per call in flight for nothing a real answer needs.

mod status;
pub use status::*;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::propagation::Injector;
use tokio::time::Instant;
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic::{Code, Request, Response, Status};
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use super::owner_cache::{OWNER_CACHE_CAPACITY, Owner, OwnerCache};
use crate::registry::Registry;
use crate::service::fleet::{Fleet, FleetError};
use crate::service::proto::backup_control_client::BackupControlClient;

/// The metadata key a forwarded call carries: the id of the instance that forwarded it.
pub const FORWARDED_BY: &str = "x-mushroom-forwarded-by";

/// The metadata key of the peer token.
pub const PEER_TOKEN: &str = "x-mushroom-peer-token";

/// The metadata key of the address of the client a forwarded call came from.
pub const ORIGINAL_CALLER: &str = "x-mushroom-original-caller";

/// The deadline of a forwarded call whose caller set none.
pub const DEFAULT_FORWARD_TIMEOUT: Duration = Duration::from_secs(60);

pub use crate::service::config::peers::check_advertise_address;

/// The largest message a forwarded call sends or accepts back (see the module docs).
pub const FORWARD_MAX_MESSAGE: usize = 16 << 20;

/// How long connecting to an owner may take before the call is `UNAVAILABLE`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a call could not be forwarded to its store's owner.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error(
        "store {store} belongs to instance {owner}, which advertises no address: start it \
         with --advertise-address HOST:PORT (or a --listen that is not a wildcard)"
    )]
    NoAddress { store: String, owner: String },
    #[error(
        "instance {owner} (at {addr}), which store {store} belongs to, cannot be reached: \
         {detail}"
    )]
    Unreachable {
        store: String,
        owner: String,
        addr: String,
        detail: String,
    },
    #[error("instance {owner} advertises {addr:?}, which is not HOST:PORT: {detail}")]
    BadAddress {
        owner: String,
        addr: String,
        detail: String,
    },
    #[error("instance {0} is not known to the registry (no instance with that id ever started)")]
    UnknownInstance(String),
    /// A `Register` or `Adopt` forwarded here for another instance (the one hop is spent).
    #[error("this call was forwarded to instance {me} for instance {asked}: call {asked} itself")]
    NotThisInstance { asked: String, me: String },
    #[error(
        "calls between instances over TLS need the CA that signed the other instances' \
         certificates: set --peer-ca (or --tls-client-ca)"
    )]
    NoPeerCa,
    /// This instance enforces an admin token and has no peer token: the admin token is never
    /// sent to another instance.
    #[error(
        "store {store} belongs to instance {owner}, and this instance cannot forward calls: \
         it has no --peer-token-file (the token the fleet's instances share to call each \
         other; the admin token is never sent to another instance)"
    )]
    NoPeerToken { store: String, owner: String },
}

/// How this instance reaches the others. Cheap to clone: the clones share the channels and
/// the owner cache.
#[derive(Clone)]
pub struct Peers(Arc<PeersInner>);

struct PeersInner {
    me: String,
    /// How the peers are reached: over TLS when this instance serves TLS (they do too).
    tls: PeerTls,
    /// What a forwarded call carries to prove this instance is a peer (`peer_auth.rs`).
    credential: Credential,
    /// Owner instance id → (address, channel).
    channels: Mutex<HashMap<String, (String, Channel)>>,
    /// Store id → owner, read from the registry less than a second ago (`owner_cache.rs`).
    owners: OwnerCache,
}

/// How this instance reaches its peers, decided at start (`tls_files.rs` builds the TLS).
#[derive(Clone)]
pub enum PeerTls {
    /// This instance serves plain HTTP/2: so do its peers.
    Plain,
    /// This instance serves TLS, and trusts its peers by this (a CA and its own identity).
    Tls(ClientTlsConfig),
    /// This instance serves TLS but has no CA to trust its peers by: a call to forward
    /// answers [`ForwardError::NoPeerCa`].
    NoCa,
}

/// What forwarded calls carry: the peer token, or nothing (`refuse`: forward nothing, since
/// this instance enforces an admin token, which is never passed on).
#[derive(Clone)]
enum Credential {
    Token(MetadataValue<tonic::metadata::Ascii>),
    None { refuse: bool },
}

impl Peers {
    /// `owner_cache_ttl`: how long a store's owner read from the registry is used for
    /// forwarding (zero: every forwarded call reads the registry). `admin_token`: whether
    /// this instance enforces one (it is never sent); `peer_token`: the fleet's peer token.
    pub fn new(
        me: &str,
        tls: PeerTls,
        admin_token: bool,
        peer_token: Option<&crate::service::config::peers::PeerToken>,
        owner_cache_ttl: Duration,
    ) -> Peers {
        // A token is printable ASCII (checked when the service starts), so this parses.
        let credential = match peer_token.and_then(|t| t.expose().parse().ok()) {
            Some(t) => Credential::Token(t),
            None => Credential::None {
                refuse: admin_token,
            },
        };
        Peers(Arc::new(PeersInner {
            me: me.to_string(),
            tls,
            credential,
            channels: Mutex::new(HashMap::new()),
            owners: OwnerCache::new(owner_cache_ttl, OWNER_CACHE_CAPACITY),
        }))
    }

    /// Where a call naming `store_id` goes: `None` to handle it here, else the hop to its owner.
    /// The owner comes from the owner cache when it was read less than its TTL ago; such a hop
    /// reads the registry again, and retries once, when that owner disowns the store or cannot
    /// be reached ([`Hop::try_call`]).
    pub async fn route(
        &self,
        fleet: &Fleet,
        meta: &MetadataMap,
        store_id: &str,
    ) -> Result<Option<Hop>, super::ClusterError> {
        self.route_via(fleet, meta, store_id, true).await
    }

    /// [`Peers::route`] reading the owner from the registry, for a node's `ReportPosition`:
    /// its reports are consumed by the first owner asked, so it cannot be retried once sent,
    /// and a non-owner answers a node `UNAUTHENTICATED` (it has no token to check), which
    /// the node client takes as final. One registry read per stream opened.
    pub async fn route_uncached(
        &self,
        fleet: &Fleet,
        meta: &MetadataMap,
        store_id: &str,
    ) -> Result<Option<Hop>, super::ClusterError> {
        self.route_via(fleet, meta, store_id, false).await
    }

    async fn route_via(
        &self,
        fleet: &Fleet,
        meta: &MetadataMap,
        store_id: &str,
        cached: bool,
    ) -> Result<Option<Hop>, super::ClusterError> {
        // A malformed id is the local handler's to refuse, with no registry read.
        if forwarded(meta) || crate::service::fleet::limits::check_store_id(store_id).is_err() {
            return Ok(None);
        }
        match fleet.get(store_id) {
            Err(FleetError::NotHere(_)) => {}
            _ => return Ok(None),
        }
        // Uncached: a node's `ReportPosition` stream, which carries its own token (no peer's).
        let ask = Ask::of(meta, cached);
        if let Some(owner) = self.0.owners.get(store_id).filter(|_| cached) {
            let mut hop = self.hop_at(&owner.instance_id, &owner.addr, store_id, &ask)?;
            hop.stale = Some(Recheck {
                registry: fleet.registry().clone(),
                ask,
            });
            return Ok(Some(hop));
        }
        match self.lookup(fleet.registry(), store_id).await? {
            None => Ok(None),
            Some(owner) if owner.instance_id == self.0.me => Ok(None),
            Some(owner) => Ok(Some(self.hop_at(
                &owner.instance_id,
                &owner.addr,
                store_id,
                &ask,
            )?)),
        }
    }

    /// Forgets the remembered owner of `store_id` (it went away mid-stream).
    pub(in crate::service) fn forget_owner(&self, store_id: &str) {
        self.0.owners.forget(store_id);
    }

    /// The owner of `store_id` as the registry names it now, remembered when it is another
    /// instance that announced an address (`owner_cache.rs`).
    async fn lookup(
        &self,
        registry: &Registry,
        store_id: &str,
    ) -> Result<Option<Owner>, FleetError> {
        let found = registry.store_owner(store_id).await?;
        let owner = found.map(|(instance_id, addr)| Owner { instance_id, addr });
        if let Some(o) = &owner
            && o.instance_id != self.0.me
            && !o.addr.is_empty()
        {
            self.0.owners.put(store_id, o.clone());
        }
        Ok(owner)
    }

    /// The hop to instance `owner` for a call concerning `store` (a store id, or the directory
    /// a `Register` names), carrying what the call's `meta` says (see the module docs).
    pub async fn hop_to(
        &self,
        fleet: &Fleet,
        owner: &str,
        store: &str,
        meta: &MetadataMap,
    ) -> Result<Hop, super::ClusterError> {
        let info = fleet
            .registry()
            .instance(owner)
            .await
            .map_err(FleetError::from)?
            .ok_or_else(|| ForwardError::UnknownInstance(owner.to_string()))?;
        Ok(self.hop_at(owner, &info.advertise_address, store, &Ask::of(meta, true))?)
    }

    /// The hop to instance `owner`, which announced `addr` (empty: no address).
    fn hop_at(&self, owner: &str, addr: &str, store: &str, ask: &Ask) -> Result<Hop, ForwardError> {
        if addr.is_empty() {
            return Err(ForwardError::NoAddress {
                store: store.to_string(),
                owner: owner.to_string(),
            });
        }
        let credential = match (&self.0.credential, ask.call) {
            (Credential::None { refuse: true }, true) => {
                return Err(ForwardError::NoPeerToken {
                    store: store.to_string(),
                    owner: owner.to_string(),
                });
            }
            (Credential::Token(t), true) => Some(t.clone()),
            _ => None,
        };
        let channel = self.channel(owner, addr)?;
        let span = tracing::info_span!(
            "grpc.forward",
            otel.name = "forward",
            otel.kind = "client",
            peer.instance = owner,
            server.address = %addr,
        );
        let mut meta = MetadataMap::new();
        if let Some(token) = credential {
            meta.insert(PEER_TOKEN, token);
        }
        if let Some(origin) = ask.origin.clone().filter(|_| ask.call) {
            meta.insert(ORIGINAL_CALLER, origin);
        }
        if let Ok(me) = self.0.me.parse() {
            meta.insert(FORWARDED_BY, me);
        }
        let cx = span.context();
        opentelemetry::global::get_text_map_propagator(|p| {
            p.inject_context(&cx, &mut MetaInjector(&mut meta))
        });
        Ok(Hop {
            store: store.to_string(),
            owner: owner.to_string(),
            addr: addr.to_string(),
            client: BackupControlClient::new(channel)
                .max_decoding_message_size(FORWARD_MAX_MESSAGE)
                .max_encoding_message_size(FORWARD_MAX_MESSAGE),
            meta,
            deadline: ask.deadline,
            span,
            peers: self.clone(),
            stale: None,
        })
    }

    /// The channel to `owner` at `addr`, made (lazily connected) when there is none or the
    /// owner moved.
    fn channel(&self, owner: &str, addr: &str) -> Result<Channel, ForwardError> {
        let p = &*self.0;
        let mut channels = p.channels.lock().expect("channels lock");
        if let Some((a, c)) = channels.get(owner)
            && a == addr
        {
            return Ok(c.clone());
        }
        let bad = |detail: String| ForwardError::BadAddress {
            owner: owner.to_string(),
            addr: addr.to_string(),
            detail,
        };
        check_advertise_address(addr).map_err(bad)?;
        let scheme = match p.tls {
            PeerTls::Plain => "http",
            PeerTls::Tls(_) => "https",
            PeerTls::NoCa => return Err(ForwardError::NoPeerCa),
        };
        let mut ep = Endpoint::from_shared(format!("{scheme}://{addr}"))
            .map_err(|e| bad(e.to_string()))?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_while_idle(false);
        if let PeerTls::Tls(config) = &p.tls {
            // The owner's certificate must name the instance the registry names (peer_auth.rs).
            crate::service::config::peers::peer_server_name(owner).map_err(&bad)?;
            let config = config
                .clone()
                .domain_name(crate::service::config::peers::peer_name(owner));
            ep = ep.tls_config(config).map_err(|e| bad(e.to_string()))?;
        }
        let channel = ep.connect_lazy();
        channels.insert(owner.to_string(), (addr.to_string(), channel.clone()));
        Ok(channel)
    }
}

/// What a forwarded call takes from its caller: the original caller's address (which the
/// API put in [`ORIGINAL_CALLER`] after checking the caller), and the
/// caller's deadline as an instant (so a retry has only what is left of it).
#[derive(Clone)]
struct Ask {
    origin: Option<MetadataValue<tonic::metadata::Ascii>>,
    deadline: Option<Instant>,
    /// An operator's call, which carries the peer credential (`false`: a node's
    /// `ReportPosition` stream, which carries the node's own token).
    call: bool,
}

impl Ask {
    fn of(caller: &MetadataMap, call: bool) -> Ask {
        Ask {
            origin: caller.get(ORIGINAL_CALLER).cloned(),
            deadline: remaining_deadline(caller).map(|d| Instant::now() + d),
            call,
        }
    }
}

/// What a hop whose owner came from the owner cache needs to read the registry again and
/// retry once.
struct Recheck {
    registry: Registry,
    ask: Ask,
}

/// Whether a call was forwarded by another instance (see "At most one hop").
pub fn forwarded(meta: &MetadataMap) -> bool {
    meta.get(FORWARDED_BY).is_some()
}

/// One call on its way to a store's owner.
pub struct Hop {
    pub store: String,
    pub owner: String,
    pub addr: String,
    pub(in crate::service) client: BackupControlClient<Channel>,
    pub(in crate::service) meta: MetadataMap,
    /// The caller's deadline; `None`: it set none.
    pub(in crate::service) deadline: Option<Instant>,
    pub(in crate::service) span: tracing::Span,
    /// Whose owner cache forgets this owner when it disowns the store.
    pub(in crate::service) peers: Peers,
    /// `Some` when the owner came from the owner cache (it may be stale).
    stale: Option<Recheck>,
}

impl Hop {
    /// Sends `msg` with `call` (one client method): the owner's answer, or `Err` when it could
    /// not be reached.
    ///
    /// An owner that answers `FAILED_PRECONDITION` or `NOT_FOUND` (the one-hop rule's answer
    /// for a store it does not own) or cannot be reached is forgotten by the owner cache. When
    /// it came from the cache, the registry is read again and, if it now names another owner
    /// (or address), the call is sent there once, with what is left of the caller's deadline;
    /// an owner the registry still names keeps its answer (the call is never sent to it twice).
    pub async fn try_call<T, R, F, Fut>(
        self,
        msg: T,
        call: F,
    ) -> Result<Result<Response<R>, Status>, ForwardError>
    where
        T: Clone,
        F: Fn(BackupControlClient<Channel>, Request<T>) -> Fut,
        Fut: Future<Output = Result<Response<R>, Status>>,
    {
        let (_, answer) = self
            .try_call_at(msg, call, Some(DEFAULT_FORWARD_TIMEOUT))
            .await;
        answer
    }

    /// [`Hop::try_call`], saying which owner answered last; `default_timeout` is the deadline
    /// when the caller set none (`None`: no deadline, for a watch).
    pub(in crate::service) async fn try_call_at<T, R, F, Fut>(
        mut self,
        msg: T,
        call: F,
        default_timeout: Option<Duration>,
    ) -> (Owner, Answer<R>)
    where
        T: Clone,
        F: Fn(BackupControlClient<Channel>, Request<T>) -> Fut,
        Fut: Future<Output = Result<Response<R>, Status>>,
    {
        let stale = self.stale.take();
        let spare = stale.as_ref().map(|_| msg.clone());
        let (store, owner, addr) = (self.store.clone(), self.owner.clone(), self.addr.clone());
        let peers = self.peers.clone();
        let asked = Owner {
            instance_id: owner,
            addr,
        };
        let first = self.send(msg, &call, default_timeout).await;
        if !disowned(&first) {
            return (asked, first);
        }
        peers.0.owners.forget(&store);
        let (Some(recheck), Some(msg)) = (stale, spare) else {
            return (asked, first);
        };
        let now = match peers.lookup(&recheck.registry, &store).await {
            Ok(Some(now)) => now,
            // Deregistered meanwhile, or the registry cannot say: the owner's answer stands.
            Ok(None) | Err(_) => return (asked, first),
        };
        if now == asked || recheck.ask.deadline.is_some_and(|d| d <= Instant::now()) {
            return (asked, first);
        }
        tracing::debug!(%store, was = %asked.instance_id, now = %now.instance_id,
            "the store's owner changed: retrying there");
        let again = match peers.hop_at(&now.instance_id, &now.addr, &store, &recheck.ask) {
            Ok(hop) => hop.send(msg, &call, default_timeout).await,
            Err(e) => Err(e),
        };
        if disowned(&again) {
            peers.0.owners.forget(&store);
        }
        (now, again)
    }

    /// One send to this hop's owner.
    async fn send<T, R, F, Fut>(
        self,
        msg: T,
        call: &F,
        default_timeout: Option<Duration>,
    ) -> Answer<R>
    where
        F: Fn(BackupControlClient<Channel>, Request<T>) -> Fut,
        Fut: Future<Output = Result<Response<R>, Status>>,
    {
        let Hop {
            store,
            owner,
            addr,
            client,
            meta,
            deadline,
            span,
            ..
        } = self;
        let timeout = deadline
            .map(|d| d.saturating_duration_since(Instant::now()))
            .or(default_timeout);
        let mut req = Request::new(msg);
        *req.metadata_mut() = meta;
        if let Some(t) = timeout {
            req.set_timeout(t);
        }
        let answer = call(client, req).instrument(span.clone()).await;
        Ok(match answer {
            Ok(r) => Ok(Response::new(r.into_inner())),
            Err(s) if timed_out(&s) => Err(Status::deadline_exceeded(format!(
                "instance {owner} (at {addr}), which store {store} belongs to, did not answer \
                 within {} ms",
                timeout.unwrap_or_default().as_millis()
            ))),
            Err(s) if from_transport(&s) => {
                let detail = describe(&s);
                tracing::warn!(parent: &span, %owner, %addr, %detail, "a forwarded call found no owner");
                return Err(ForwardError::Unreachable {
                    store,
                    owner,
                    addr,
                    detail,
                });
            }
            Err(s) => Err(same_status(&s)),
        })
    }
}

/// An owner's answer, or why it could not be asked.
pub(in crate::service) type Answer<R> = Result<Result<Response<R>, Status>, ForwardError>;

#[cfg(test)]
mod tests;
