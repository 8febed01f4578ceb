//! Streams relayed to a store's owner (`forward.rs` decides where a call goes): a node's
//! `ReportPosition` stream, and `WatchHealth` / `WatchEvents` of one store, so a dashboard
//! behind a load balancer sees the owner's live stream whichever instance it reached.
//!
//! # What a relayed stream does
//!
//! - A watch is opened at the owner like any forwarded call: the owner cache and its one
//!   retry when the owner disowns the store, the peer credential (never the caller's
//!   `authorization`, `peer_auth.rs`), the trace; the caller's deadline when it set one, and no deadline else (a watch
//!   lives as long as its client wants). A node's stream goes to the owner the registry
//!   names when it opens (`Peers::route_uncached`), with the node's own `authorization`.
//! - Each message the owner sends is passed on as it comes, and the owner's status when it ends
//!   the stream, unchanged.
//! - Nothing is spawned: the relay is pulled by the caller's response. When the caller goes
//!   away, the response is dropped, with it the stream from the owner, whose call is reset:
//!   the owner's watch ends and frees its slot (`--max-health-watchers` counts there).
//! - It ends with `UNAVAILABLE` naming the owner when the owner goes away mid-stream (the
//!   owner cache forgets it, so the caller's next watch reads the registry again); with
//!   `UNAVAILABLE` (shutting down) at this instance's shutdown; with `DEADLINE_EXCEEDED` when
//!   the caller's deadline passes.
//!
//! Nothing here holds state past the stream: a crash ends the relayed streams as it ends the
//! local ones, and clients reconnect.

use std::future::Future;
use std::pin::Pin;

use futures::Stream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::metadata::MetadataMap;
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument as _;

use super::error::ServiceError;
use crate::service::cluster::forward::{
    ForwardError, Hop, describe, disowns, from_transport, same_status,
};
use crate::service::cluster::owner_cache::Owner;
use crate::service::proto::{self, backup_control_client::BackupControlClient};

/// The owner's messages as relayed here.
pub type Relayed<M> = Pin<Box<dyn Stream<Item = Result<M, Status>> + Send>>;

/// The owner's answers to a relayed `ReportPosition` stream.
pub type PositionRelay = Relayed<proto::NodeCommand>;

impl Hop {
    /// Sends `msg` with `call` (one client method) and answers as the owner did.
    pub async fn call<T, R, F, Fut>(self, msg: T, call: F) -> Result<Response<R>, Status>
    where
        T: Clone,
        F: Fn(BackupControlClient<Channel>, Request<T>) -> Fut,
        Fut: Future<Output = Result<Response<R>, Status>>,
    {
        match self.try_call(msg, call).await {
            Ok(answer) => answer,
            Err(e) => Err(ServiceError::from(e).into()),
        }
    }

    /// Relays a server stream (`WatchHealth`, `WatchEvents`) opened with `call` to the owner.
    /// An owner that cannot be reached is `UNAVAILABLE` naming it.
    pub async fn relay_watch<T, M, F, Fut>(
        self,
        msg: T,
        call: F,
        shutdown: CancellationToken,
    ) -> Result<Relayed<M>, Status>
    where
        T: Clone,
        M: Send + 'static,
        F: Fn(BackupControlClient<Channel>, Request<T>) -> Fut,
        Fut: Future<Output = Result<Response<Streaming<M>>, Status>>,
    {
        let store = self.store.clone();
        let deadline = self.deadline;
        let peers = self.peers.clone();
        let (answered, answer) = self.try_call_at(msg, call, None).await;
        let stream = match answer {
            Ok(Ok(r)) => r.into_inner(),
            Ok(Err(s)) => return Err(s),
            Err(e) => return Err(ServiceError::from(e).into()),
        };
        let lost = move |s: &Status| {
            if from_transport(s) {
                peers.forget_owner(&store);
            }
            lost_status(&store, &answered, s)
        };
        Ok(relay(stream, lost, deadline, shutdown))
    }

    /// Relays a `ReportPosition` stream to the owner: `reports` go there with the node's own
    /// `authorization` (the owner checks the node token; this instance has nothing to check it
    /// against) and no deadline; the owner's commands come back, and its status when it ends
    /// the stream. Ends with `UNAVAILABLE` when `shutdown` fires, or when the owner goes away
    /// (the node reconnects, to whichever instance, and reaches the store's owner then: an
    /// owner that could not be reached is forgotten by the owner cache).
    pub async fn relay_positions<S>(
        self,
        caller: &MetadataMap,
        reports: S,
        shutdown: CancellationToken,
    ) -> Result<PositionRelay, Status>
    where
        S: Stream<Item = proto::PositionReport> + Send + 'static,
    {
        let Hop {
            store,
            owner,
            addr,
            mut client,
            mut meta,
            span,
            peers,
            ..
        } = self;
        match caller.get("authorization") {
            Some(auth) => meta.insert("authorization", auth.clone()),
            None => meta.remove("authorization"),
        };
        let mut req = Request::new(reports);
        *req.metadata_mut() = meta;
        let answered = Owner {
            instance_id: owner,
            addr,
        };
        let lost = move |s: &Status| {
            if from_transport(s) || disowns(s) {
                peers.forget_owner(&store);
            }
            lost_status(&store, &answered, s)
        };
        let commands = match client.report_position(req).instrument(span).await {
            Ok(r) => r.into_inner(),
            Err(s) => return Err(lost(&s)),
        };
        Ok(relay(commands, lost, None, shutdown))
    }
}

/// A status of the stream from `owner`: its own, unchanged, or `UNAVAILABLE` naming it when
/// the connection to it broke.
fn lost_status(store: &str, owner: &Owner, s: &Status) -> Status {
    if from_transport(s) {
        ServiceError::from(ForwardError::Unreachable {
            store: store.to_string(),
            owner: owner.instance_id.clone(),
            addr: owner.addr.clone(),
            detail: describe(s),
        })
        .into()
    } else {
        same_status(s)
    }
}

/// What a relay is pulled through.
struct Relay<M, L> {
    from: Streaming<M>,
    lost: L,
    /// Fires with the status that ends the relay early (shutdown, the caller's deadline).
    stop: Pin<Box<dyn Future<Output = Status> + Send>>,
    done: bool,
}

/// `from`, passed on until it ends, breaks (`lost` makes the status), `shutdown` fires or the
/// `deadline` passes.
fn relay<M, L>(
    from: Streaming<M>,
    lost: L,
    deadline: Option<Instant>,
    shutdown: CancellationToken,
) -> Relayed<M>
where
    M: Send + 'static,
    L: Fn(&Status) -> Status + Send + 'static,
{
    let stop = Box::pin(async move {
        let expiry = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = shutdown.cancelled_owned() => Status::from(ServiceError::ShuttingDown),
            _ = expiry => Status::deadline_exceeded(
                "the caller's deadline passed: the stream relayed from the store's owner ends",
            ),
        }
    });
    let state = Relay {
        from,
        lost,
        stop,
        done: false,
    };
    Box::pin(futures::stream::unfold(state, |mut s| async move {
        if s.done {
            return None;
        }
        tokio::select! {
            why = &mut s.stop => {
                s.done = true;
                Some((Err(why), s))
            }
            next = s.from.message() => match next {
                Ok(Some(m)) => Some((Ok(m), s)),
                Ok(None) => None,
                Err(e) => {
                    s.done = true;
                    let status = (s.lost)(&e);
                    Some((Err(status), s))
                }
            },
        }
    }))
}
