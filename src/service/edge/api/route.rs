//! "Local or forward", once for every handler: a call about a store another instance runs,
//! or naming another instance, goes to that instance (`cluster::forward`: one hop, the owner
//! cache, one retry) and its answer is the call's; any other call is answered here. What a
//! call is about is its [`Addressed::target`].

use std::future::Future;

use tonic::{Request, Response, Status};

use super::{Api, Client, err};
use crate::service::cluster::ClusterError;
use crate::service::cluster::forward::{self, ForwardError, Hop};
use crate::service::edge::forward_stream::Relayed;
use crate::service::edge::peer_auth::{self, Caller};
use crate::service::fleet::limits;
use crate::service::proto;

/// Where a call is answered: here (the request, for the handler to go on with), or by the
/// instance it was forwarded to (its answer).
pub(super) enum Routed<T, R> {
    Here(Request<T>),
    There(Result<Response<R>, Status>),
}

/// A handler goes on with the request when its call is answered here, and returns the
/// forwarded answer otherwise.
macro_rules! here_or_return {
    ($routed:expr) => {
        match $routed? {
            Routed::Here(req) => req,
            Routed::There(answer) => return answer,
        }
    };
}

/// What a call is about, for routing.
pub(super) enum Target<'a> {
    /// A store: its owner answers.
    Store(&'a str),
    /// An instance named by the call (empty: this one), for a store directory there.
    Instance { id: &'a str, store_dir: &'a str },
    /// A store, answered here whoever owns it (a health read from the registry).
    Here(&'a str),
    /// A store: its owner answers when it can be called and answers; otherwise this instance
    /// does (Deregister: where a store whose owner has been silent long enough may be
    /// forgotten, and one whose owner is still heard from is refused, naming it).
    StoreOrHere(&'a str),
}

/// A request that says what it is about.
pub(super) trait Addressed {
    fn target(&self) -> Target<'_>;
}

macro_rules! about_store {
    ($($t:ty),* $(,)?) => {
        $(impl Addressed for $t {
            fn target(&self) -> Target<'_> {
                Target::Store(&self.store_id)
            }
        })*
    };
}

about_store!(
    proto::TriggerRequest,
    proto::PauseRequest,
    proto::ResumeRequest,
    proto::ListRestorePointsRequest,
    proto::DrillRequest,
    proto::MoveRequest,
    proto::PromoteRequest,
);

macro_rules! about_instance {
    ($($t:ty),* $(,)?) => {
        $(impl Addressed for $t {
            fn target(&self) -> Target<'_> {
                Target::Instance {
                    id: &self.instance_id,
                    store_dir: &self.store_dir,
                }
            }
        })*
    };
}

about_instance!(
    proto::RegisterRequest,
    proto::AdoptRequest,
    proto::BranchRequest
);

impl Addressed for proto::DeregisterRequest {
    fn target(&self) -> Target<'_> {
        Target::StoreOrHere(&self.store_id)
    }
}

impl Addressed for proto::DrainRequest {
    fn target(&self) -> Target<'_> {
        Target::Instance {
            id: &self.instance_id,
            store_dir: &self.instance_id,
        }
    }
}

macro_rules! about_limits {
    ($($t:ty),* $(,)?) => {
        $(impl Addressed for $t {
            /// A store's limits: its owner's; the instance's: the instance named (or this one).
            fn target(&self) -> Target<'_> {
                match self.store_id.is_empty() {
                    true => Target::Instance { id: &self.instance_id, store_dir: "" },
                    false => Target::Store(&self.store_id),
                }
            }
        })*
    };
}

about_limits!(proto::GetLimitsRequest, proto::SetLimitsRequest);

impl Addressed for proto::HealthRequest {
    /// A fresh health read asks the owner; any other is the registry's, read here.
    fn target(&self) -> Target<'_> {
        if self.fresh {
            Target::Store(&self.store_id)
        } else {
            Target::Here(&self.store_id)
        }
    }
}

impl Api {
    /// Answers `req` where it belongs: `Routed::Here` for the handler to answer, or the answer
    /// of the instance it was forwarded to, sent with `call` (one client method).
    pub(super) async fn local_or_forward<T, R, F, Fut>(
        &self,
        req: Request<T>,
        caller: &Caller,
        call: F,
    ) -> Result<Routed<T, R>, Status>
    where
        T: Addressed + Clone,
        F: Fn(Client, Request<T>) -> Fut,
        Fut: Future<Output = Result<Response<R>, Status>>,
    {
        let (hop, or_here) = match req.get_ref().target() {
            Target::Store(store_id) => (self.route(&req, caller, store_id).await?, false),
            Target::Instance { id, store_dir } => {
                let hop = self.route_to_instance(&req, caller, id, store_dir).await?;
                (hop, false)
            }
            Target::Here(store_id) => {
                record_store_id(store_id);
                (None, false)
            }
            Target::StoreOrHere(store_id) => {
                record_store_id(store_id);
                let meta = forward_meta(&req, caller);
                match self.peers.route(&self.fleet, &meta, store_id).await {
                    // No peer token where an admin token is enforced: the owner cannot be
                    // called from here.
                    Err(ClusterError::Forward(ForwardError::NoPeerToken { .. })) => (None, true),
                    other => (other?, true),
                }
            }
        };
        Ok(match hop {
            Some(hop) if or_here => match hop.try_call(req.get_ref().clone(), call).await {
                Ok(answer) => Routed::There(answer),
                Err(_) => Routed::Here(req),
            },
            Some(hop) => Routed::There(hop.call(req.into_inner(), call).await),
            None => Routed::Here(req),
        })
    }

    /// The hop to the owner of `store_id` when another instance runs it (`forward.rs`); puts
    /// the store on the call's span, for both paths (the handlers do not again).
    pub(super) async fn route<T>(
        &self,
        req: &Request<T>,
        caller: &Caller,
        store_id: &str,
    ) -> Result<Option<Hop>, Status> {
        self.route_meta(&forward_meta(req, caller), store_id).await
    }

    /// A watch stream (`WatchHealth`, `WatchEvents`) of a store another instance runs: its
    /// owner's live stream, relayed (`forward_stream.rs`); `None`: the store is answered here.
    pub(super) async fn relay_elsewhere<T, M, F, Fut>(
        &self,
        req: Request<T>,
        caller: &Caller,
        store_id: &str,
        call: F,
    ) -> Result<Option<Relayed<M>>, Status>
    where
        T: Clone,
        M: Send + 'static,
        F: Fn(Client, Request<T>) -> Fut,
        Fut: Future<Output = Result<Response<tonic::Streaming<M>>, Status>>,
    {
        let Some(hop) = self.route(&req, caller, store_id).await? else {
            return Ok(None);
        };
        let relayed = hop.relay_watch(req.into_inner(), call, self.shutdown.clone());
        Ok(Some(relayed.await?))
    }

    pub(super) async fn route_meta(
        &self,
        meta: &tonic::metadata::MetadataMap,
        store_id: &str,
    ) -> Result<Option<Hop>, Status> {
        record_store_id(store_id);
        Ok(self.peers.route(&self.fleet, meta, store_id).await?)
    }

    /// The hop to `instance_id` for a `Register` or `Adopt` naming it; `None`: this instance.
    async fn route_to_instance<T>(
        &self,
        req: &Request<T>,
        caller: &Caller,
        instance_id: &str,
        store_dir: &str,
    ) -> Result<Option<Hop>, Status> {
        let me = &self.fleet.config().instance_id;
        if instance_id.is_empty() || instance_id == me {
            return Ok(None);
        }
        limits::check_text("instance_id", instance_id, limits::MAX_INSTANCE_ID_BYTES)
            .map_err(err)?;
        if forward::forwarded(req.metadata()) {
            return Err(err(ForwardError::NotThisInstance {
                asked: instance_id.to_string(),
                me: me.clone(),
            }));
        }
        let hop = self
            .peers
            .hop_to(
                &self.fleet,
                instance_id,
                store_dir,
                &forward_meta(req, caller),
            )
            .await
            .map_err(err)?;
        Ok(Some(hop))
    }
}

/// The metadata a call forwarded from here starts from: the caller's, with the original
/// caller's address set from the checked caller (never the header a client sent).
pub(super) fn forward_meta<T>(req: &Request<T>, caller: &Caller) -> tonic::metadata::MetadataMap {
    let mut meta = req.metadata().clone();
    meta.remove(peer_auth::ORIGINAL_CALLER);
    if let Some(origin) = caller.origin().and_then(|o| o.parse().ok()) {
        meta.insert(peer_auth::ORIGINAL_CALLER, origin);
    }
    meta
}

/// Puts the store a call concerns on the call's span (`grpc.request`), so that a trace search
/// by store finds the calls beside the worker's steps.
pub(super) fn record_store_id(store_id: &str) {
    if !store_id.is_empty() {
        tracing::Span::current().record("store_id", store_id);
    }
}
