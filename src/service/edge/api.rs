//! The `BackupControl` gRPC API: each handler checks its caller, turns the request into a fleet
//! call (`request.rs` reads the fields) and the answer into a response. Errors are
//! [`ServiceError`]s, mapped to status in one place (`error.rs`); nothing here picks a code.

use std::sync::Arc;
use std::time::Duration;

use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use super::auth::{self, AuthError};
use super::error::ServiceError;
use super::health_watch::{HealthStream, HealthWatch};
use super::peer_auth::{self, Caller};
use super::position_stream::CommandStream;
use super::request::{self, new_store, position};
use super::watch_events::{EventStream, EventWatch};
use crate::service::cluster::forward::Peers;
use crate::service::fleet::limits;
use crate::service::fleet::{Fleet, FleetError, NewStore, StoreEntry};
use crate::service::ops::pause::{self, PauseAsk};
use crate::service::proto::{self, backup_control_server::BackupControl};
use crate::wal_source::{AttachError, StreamAttachment};
use route::{Routed, forward_meta, record_store_id};

#[macro_use]
mod route;

pub struct Api {
    fleet: Arc<Fleet>,
    /// The service's shutdown: ends the long-lived streams (`WatchHealth`, `ReportPosition`),
    /// which the server's graceful shutdown would otherwise wait for forever.
    shutdown: CancellationToken,
    /// Every `WatchHealth` stream, served by one poller.
    watchers: HealthWatch,
    /// The other instances, for calls about their stores (`forward.rs`).
    peers: Peers,
    /// Every `WatchEvents` stream.
    events: EventWatch,
}

impl Api {
    /// The API, and the `WatchHealth` poller (a task until `shutdown`).
    pub fn new(fleet: Arc<Fleet>, shutdown: CancellationToken, peers: Peers) -> Self {
        let polled = Arc::new(tokio::sync::Mutex::new(
            crate::service::ops::health_view::FleetHealth::new(fleet.clone()),
        ));
        let watchers = HealthWatch::start(
            move || {
                let polled = polled.clone();
                async move { polled.lock().await.poll().await.map_err(ServiceError::from) }
            },
            Duration::from_millis(250),
            fleet.config().limits.max_health_watchers,
            shutdown.clone(),
            &fleet.tasks,
        );
        let events = EventWatch::new(
            fleet.events().clone(),
            fleet.registry().clone(),
            fleet.config().limits.max_health_watchers,
            shutdown.clone(),
            &fleet.tasks,
        );
        Self {
            fleet,
            shutdown,
            watchers,
            peers,
            events,
        }
    }

    /// Checks who calls (`peer_auth.rs`): the admin token, or for any call but `ListStores`
    /// an authenticated peer.
    /// A Register's or Adopt's request as the fleet takes it; one it cannot take (an enum
    /// value this version does not know) is refused and audited, naming the field.
    async fn or_refused(
        &self,
        action: &str,
        asked: Result<NewStore, (String, limits::FieldError)>,
        peer: &Option<String>,
    ) -> Result<NewStore, Status> {
        match asked {
            Ok(new) => Ok(new),
            Err((dir, e)) => {
                let refused = self
                    .fleet
                    .refused(action, Some(&dir), e.into(), peer.clone());
                Err(err(refused.await))
            }
        }
    }

    fn caller<T>(&self, req: &Request<T>) -> Result<Caller, ServiceError> {
        self.check_caller(req, true)
    }

    /// [`Api::caller`] for a call no peer makes: the admin token only.
    fn admin<T>(&self, req: &Request<T>) -> Result<Caller, ServiceError> {
        self.check_caller(req, false)
    }

    fn check_caller<T>(&self, req: &Request<T>, peers_ok: bool) -> Result<Caller, ServiceError> {
        let config = self.fleet.config();
        let want = peer_auth::Expect {
            admin_token: config.admin_token.as_deref(),
            peer_token: config.peers.token.as_ref(),
            tls: config.tls.is_some(),
            peers_ok,
        };
        let certs = req.peer_certs();
        Ok(peer_auth::check(
            &want,
            req.metadata(),
            certs.as_deref().map(Vec::as_slice),
            peer(req),
        )?)
    }
}

/// An operator call's caller as the audit log names it, and its message (its caller was
/// checked once, by [`Api::caller`], before the call was routed).
fn operator<T>(req: Request<T>, caller: &Caller) -> (Option<String>, T) {
    (caller.audited(), req.into_inner())
}

fn peer<T>(req: &Request<T>) -> Option<String> {
    req.remote_addr().map(|a| a.to_string())
}

type Client = proto::backup_control_client::BackupControlClient<tonic::transport::Channel>;

#[tonic::async_trait]
impl BackupControl for Api {
    async fn register(
        &self,
        req: Request<proto::RegisterRequest>,
    ) -> Result<Response<proto::RegisterResponse>, Status> {
        let caller = self.caller(&req)?;
        let req = here_or_return!(
            self.local_or_forward(req, &caller, |mut c, r| async move { c.register(r).await })
                .await
        );
        let (peer, r) = operator(req, &caller);
        let asked = new_store(r.store_dir, r.destination, r.labels, r.options);
        let new = self.or_refused("register", asked, &peer).await?;
        let (record, token) = self.fleet.register(new, peer).await.map_err(err)?;
        record_store_id(&record.store_id);
        Ok(Response::new(proto::RegisterResponse {
            store_id: record.store_id,
            node_token: token,
        }))
    }

    async fn deregister(
        &self,
        req: Request<proto::DeregisterRequest>,
    ) -> Result<Response<proto::DeregisterResponse>, Status> {
        let caller = self.caller(&req)?;
        // Its owner's answer, or this instance's when the owner cannot be called
        // (`Target::StoreOrHere`).
        let req = here_or_return!(
            self.local_or_forward(
                req,
                &caller,
                |mut c, r| async move { c.deregister(r).await }
            )
            .await
        );
        let (peer, r) = operator(req, &caller);
        self.fleet
            .deregister(&r.store_id, r.flush, peer)
            .await
            .map_err(err)?;
        Ok(Response::new(proto::DeregisterResponse {}))
    }

    async fn trigger(
        &self,
        req: Request<proto::TriggerRequest>,
    ) -> Result<Response<proto::TriggerResponse>, Status> {
        let caller = self.caller(&req)?;
        let req = here_or_return!(
            self.local_or_forward(req, &caller, |mut c, r| async move { c.trigger(r).await })
                .await
        );
        let (peer, r) = operator(req, &caller);
        let entry = self.fleet.get_owned(&r.store_id).await.map_err(err)?;
        let trigger = request::trigger(r.kind).map_err(err)?;
        let (id, dir) = (
            Some(r.store_id.as_str()),
            Some(entry.record.store_dir.as_str()),
        );
        if let Some(p) = entry.handle.paused() {
            let e = FleetError::Paused {
                store: r.store_id.clone(),
                reason: p.reason,
            };
            let why = e.to_string();
            self.fleet
                .audit("trigger", id, dir, "refused", why, peer)
                .await;
            return Err(err(e));
        }
        entry.handle.trigger(trigger);
        if let Some(h) = entry.replica.as_ref().and_then(|r| r.handle()) {
            h.trigger(trigger);
        }
        let what = format!("{trigger:?} asked");
        self.fleet.audit("trigger", id, dir, "ok", what, peer).await;
        Ok(Response::new(proto::TriggerResponse {}))
    }

    async fn pause(
        &self,
        req: Request<proto::PauseRequest>,
    ) -> Result<Response<proto::PauseResponse>, Status> {
        let caller = self.caller(&req)?;
        let req = here_or_return!(
            self.local_or_forward(req, &caller, |mut c, r| async move { c.pause(r).await })
                .await
        );
        let (peer, r) = operator(req, &caller);
        let ask = PauseAsk {
            reason: r.reason,
            until_unix_ms: r.until_unix_ms,
        };
        let done = pause::pause(&self.fleet, &r.store_id, ask, peer)
            .await
            .map_err(err)?;
        Ok(Response::new(proto::PauseResponse {
            reason: done.pause.reason,
            until_unix_ms: done.pause.until_unix_ms,
            paused_at_unix_ms: done.pause.paused_at_unix_ms,
            was_paused: done.was_paused,
        }))
    }

    async fn resume(
        &self,
        req: Request<proto::ResumeRequest>,
    ) -> Result<Response<proto::ResumeResponse>, Status> {
        let caller = self.caller(&req)?;
        let req = here_or_return!(
            self.local_or_forward(req, &caller, |mut c, r| async move { c.resume(r).await })
                .await
        );
        let (peer, r) = operator(req, &caller);
        let was_paused = pause::resume(&self.fleet, &r.store_id, peer)
            .await
            .map_err(err)?;
        Ok(Response::new(proto::ResumeResponse { was_paused }))
    }

    async fn health(
        &self,
        req: Request<proto::HealthRequest>,
    ) -> Result<Response<proto::HealthResponse>, Status> {
        let caller = self.caller(&req)?;
        let req = here_or_return!(
            self.local_or_forward(req, &caller, |mut c, r| async move { c.health(r).await })
                .await
        );
        let r = req.into_inner();
        Ok(Response::new(self.health_of(&r.store_id).await?))
    }

    type WatchHealthStream = HealthStream;

    async fn watch_health(
        &self,
        req: Request<proto::HealthRequest>,
    ) -> Result<Response<HealthStream>, Status> {
        let caller = self.caller(&req)?;
        let store_id = req.get_ref().store_id.clone();
        let watch = |mut c: Client, r| async move { c.watch_health(r).await };
        if let Some(relayed) = self.relay_elsewhere(req, &caller, &store_id, watch).await? {
            return Ok(Response::new(relayed));
        }
        let first = self.health_of(&store_id).await?;
        Ok(Response::new(self.watchers.subscribe(store_id, first)?))
    }

    async fn list_stores(
        &self,
        req: Request<proto::ListStoresRequest>,
    ) -> Result<Response<proto::ListStoresResponse>, Status> {
        self.admin(&req)?;
        let stores = crate::service::ops::health_view::store_infos(&self.fleet)
            .await
            .map_err(err)?;
        Ok(Response::new(proto::ListStoresResponse { stores }))
    }

    async fn list_restore_points(
        &self,
        req: Request<proto::ListRestorePointsRequest>,
    ) -> Result<Response<proto::ListRestorePointsResponse>, Status> {
        let caller = self.caller(&req)?;
        let req = here_or_return!(
            self.local_or_forward(req, &caller, |mut c, r| async move {
                c.list_restore_points(r).await
            })
            .await
        );
        let r = req.into_inner();
        let cursor = request::check_listing(&r).map_err(err)?;
        let first = cursor.is_none();
        let (page, span) = self
            .fleet
            .restore_points(&r.store_id, cursor, limits::page_size(r.page_size), first)
            .await
            .map_err(err)?;
        let mut response = request::page(page);
        if let Some((earliest, latest)) = span {
            response.earliest_unix_ms = earliest;
            response.latest_unix_ms = latest;
        }
        Ok(Response::new(response))
    }

    async fn adopt(
        &self,
        req: Request<proto::AdoptRequest>,
    ) -> Result<Response<proto::AdoptResponse>, Status> {
        let caller = self.caller(&req)?;
        let req = here_or_return!(
            self.local_or_forward(req, &caller, |mut c, r| async move { c.adopt(r).await })
                .await
        );
        let (peer, r) = operator(req, &caller);
        let at = request::adopt_point(&r).map_err(err)?;
        let asked = new_store(r.store_dir, r.destination, r.labels, r.options);
        let new = self.or_refused("adopt", asked, &peer).await?;
        let (record, token, report) = self.fleet.adopt(new, at, peer).await.map_err(err)?;
        record_store_id(&record.store_id);
        Ok(Response::new(proto::AdoptResponse {
            store_id: record.store_id,
            node_token: token,
            commit_seq: report.commit_seq,
            parent_manifest: report.manifest_key,
            commit_time_unix_ms: report.commit_time_unix_ms.unwrap_or(0),
        }))
    }

    async fn branch(
        &self,
        req: Request<proto::BranchRequest>,
    ) -> Result<Response<proto::BranchResponse>, Status> {
        let caller = self.caller(&req)?;
        let req = here_or_return!(
            self.local_or_forward(req, &caller, |mut c, r| async move { c.branch(r).await })
                .await
        );
        let (peer, r) = operator(req, &caller);
        let at = request::branch_point(&r).map_err(err)?;
        limits::check_store_id(&r.store_id).map_err(|e| err(FleetError::from(e)))?;
        let new = match r.store_dir.is_empty() {
            true => None,
            false => Some(
                self.or_refused(
                    "branch",
                    new_store(r.store_dir, r.destination.clone(), r.labels, r.options),
                    &peer,
                )
                .await?,
            ),
        };
        let b = self
            .fleet
            .branch(&r.store_id, at, &r.destination, new, peer)
            .await
            .map_err(err)?;
        let (store_id, node_token) = b
            .store
            .map(|(rec, t)| (rec.store_id, t))
            .unwrap_or_default();
        if !store_id.is_empty() {
            record_store_id(&store_id);
        }
        Ok(Response::new(proto::BranchResponse {
            commit_seq: b.report.commit_seq,
            lineage: b.report.lineage.to_string(),
            parent_manifest: b.report.parent_manifest,
            holder: b.report.holder,
            requests: b.report.requests,
            bytes_written: b.report.bytes_written,
            store_id,
            node_token,
        }))
    }

    async fn promote(
        &self,
        req: Request<proto::PromoteRequest>,
    ) -> Result<Response<proto::PromoteResponse>, Status> {
        let caller = self.caller(&req)?;
        let req = here_or_return!(
            self.local_or_forward(req, &caller, |mut c, r| async move { c.promote(r).await })
                .await
        );
        let (peer, r) = operator(req, &caller);
        let p = self
            .fleet
            .promote(&r.store_id, r.wait_for_lease, peer)
            .await
            .map_err(err)?;
        Ok(Response::new(proto::PromoteResponse {
            store_id: p.store_id,
            lineage: p.lineage,
            commit_seq: p.commit_seq,
            parent_manifest: p.parent_manifest,
            fenced: p.fenced.unwrap_or_default(),
        }))
    }

    async fn drill(
        &self,
        req: Request<proto::DrillRequest>,
    ) -> Result<Response<proto::DrillResponse>, Status> {
        let caller = self.caller(&req)?;
        let req = here_or_return!(
            self.local_or_forward(req, &caller, |mut c, r| async move { c.drill(r).await })
                .await
        );
        let (peer, r) = operator(req, &caller);
        let at = (r.at_commit_seq != 0).then_some(r.at_commit_seq);
        let d = crate::service::ops::drill::drill(&self.fleet, &r.store_id, at, peer)
            .await
            .map_err(err)?;
        Ok(Response::new(proto::DrillResponse {
            ok: d.ok,
            commit_seq: d.commit_seq,
            duration_ms: d.duration_ms,
            bytes: d.bytes,
            error: d.error,
            manifest_key: d.manifest_key,
            finished_at_unix_ms: d.finished_at_unix_ms,
            predicted_seconds: d.predicted_ms as f64 / 1000.0,
            seconds: d.duration_ms as f64 / 1000.0,
        }))
    }

    async fn get_limits(
        &self,
        req: Request<proto::GetLimitsRequest>,
    ) -> Result<Response<proto::LimitsResponse>, Status> {
        let caller = self.caller(&req)?;
        let req = here_or_return!(
            self.local_or_forward(
                req,
                &caller,
                |mut c, r| async move { c.get_limits(r).await }
            )
            .await
        );
        let r = req.into_inner();
        let got = crate::service::ops::limits::get(&self.fleet, &r.store_id).await;
        Ok(Response::new(got.map_err(err)?))
    }

    async fn set_limits(
        &self,
        req: Request<proto::SetLimitsRequest>,
    ) -> Result<Response<proto::LimitsResponse>, Status> {
        let caller = self.caller(&req)?;
        let req = here_or_return!(
            self.local_or_forward(
                req,
                &caller,
                |mut c, r| async move { c.set_limits(r).await }
            )
            .await
        );
        let (peer, r) = operator(req, &caller);
        let set = crate::service::ops::limits::set(&self.fleet, &r.store_id, &r.limits, peer);
        Ok(Response::new(set.await.map_err(err)?))
    }

    async fn r#move(
        &self,
        req: Request<proto::MoveRequest>,
    ) -> Result<Response<proto::MoveResponse>, Status> {
        let caller = self.caller(&req)?;
        let req = here_or_return!(
            self.local_or_forward(req, &caller, |mut c, r| async move { c.r#move(r).await })
                .await
        );
        let meta = forward_meta(&req, &caller);
        let (peer, r) = operator(req, &caller);
        let (id, to) = (&r.store_id, &r.to_instance_id);
        let moved = crate::service::cluster::moves::move_store(
            &self.fleet,
            &self.peers,
            &meta,
            id,
            to,
            peer,
        );
        Ok(Response::new(moved.await?))
    }

    async fn drain(
        &self,
        req: Request<proto::DrainRequest>,
    ) -> Result<Response<proto::DrainResponse>, Status> {
        let caller = self.caller(&req)?;
        let who = req.get_ref().instance_id.clone();
        // Blank would mean "here" to the router: a drain of whichever instance was reached.
        if who.trim().is_empty() {
            return Err(Status::invalid_argument(
                "DrainRequest.instance_id is empty: name the instance to drain",
            ));
        }
        let req = here_or_return!(
            self.local_or_forward(req, &caller, |mut c, r| async move { c.drain(r).await })
                .await
        );
        let meta = forward_meta(&req, &caller);
        let (peer, r) = operator(req, &caller);
        let drained = crate::service::cluster::moves::drain(
            &self.fleet,
            &self.peers,
            &meta,
            r.parallel,
            peer,
        );
        Ok(Response::new(drained.await?))
    }

    async fn can_host(
        &self,
        req: Request<proto::CanHostRequest>,
    ) -> Result<Response<proto::CanHostResponse>, Status> {
        let caller = self.caller(&req)?;
        let id = &req.get_ref().store_id;
        crate::service::cluster::moves::can_host(&self.fleet, id, caller.audited()).await?;
        Ok(Response::new(proto::CanHostResponse {}))
    }

    async fn host(
        &self,
        req: Request<proto::HostRequest>,
    ) -> Result<Response<proto::HostResponse>, Status> {
        let caller = self.caller(&req)?;
        crate::service::cluster::moves::host(
            &self.fleet,
            &req.get_ref().store_id,
            caller.audited(),
        )
        .await?;
        Ok(Response::new(proto::HostResponse {}))
    }

    type WatchEventsStream = EventStream;

    async fn watch_events(
        &self,
        req: Request<proto::WatchEventsRequest>,
    ) -> Result<Response<EventStream>, Status> {
        let caller = self.caller(&req)?;
        let store_id = req.get_ref().store_id.clone();
        if let Some(after) = req.get_ref().after {
            // The log is the fleet's: any instance answers for every store.
            record_store_id(&store_id);
            return Ok(Response::new(self.events.resume(store_id, after).await?));
        }
        let watch = |mut c: Client, r| async move { c.watch_events(r).await };
        if let Some(relayed) = self.relay_elsewhere(req, &caller, &store_id, watch).await? {
            return Ok(Response::new(relayed));
        }
        if !store_id.is_empty() {
            self.fleet.get_owned(&store_id).await.map_err(err)?;
        }
        Ok(Response::new(self.events.subscribe(store_id)?))
    }

    type ReportPositionStream = CommandStream;

    async fn report_position(
        &self,
        req: Request<Streaming<proto::PositionReport>>,
    ) -> Result<Response<CommandStream>, Status> {
        let meta = req.metadata().clone();
        let from = peer(&req).unwrap_or_else(|| "an unknown peer".into());
        let mut inbound = req.into_inner();
        // The token is checked against the store the first report names: until it arrives the
        // caller is nobody, so it is due soon (server_limits.rs).
        let due = self.fleet.config().limits.first_report_timeout;
        let Ok(first) = tokio::time::timeout(due, inbound.next()).await else {
            return Err(ServiceError::NoFirstReport {
                ms: due.as_millis(),
            }
            .into());
        };
        let Some(first) = first else {
            return Err(err(request::no_first_report()));
        };
        let first = first?;
        // A store another instance runs: relay the stream there (forward.rs), to the owner
        // the registry names now (a stream cannot be retried elsewhere once it started).
        record_store_id(&first.store_id);
        let route = self
            .peers
            .route_uncached(&self.fleet, &meta, &first.store_id);
        if let Some(hop) = route.await? {
            let reports = futures::stream::once(std::future::ready(first))
                .chain(inbound.map_while(Result::ok));
            let relayed = hop
                .relay_positions(&meta, reports, self.shutdown.clone())
                .await?;
            return Ok(Response::new(relayed));
        }
        let (attachment, entry) = self.attach_node(&meta, &first, from)?;
        Ok(Response::new(super::position_stream::pump(
            &self.fleet,
            attachment,
            entry,
            inbound,
            self.shutdown.clone(),
        )))
    }
}

impl Api {
    /// Checks the node token of a stream's first report and attaches the stream to the store
    /// it names, its first report recorded. An unknown store and a wrong token get the same
    /// answer ([`auth::NODE_REFUSED`]).
    fn attach_node(
        &self,
        meta: &tonic::metadata::MetadataMap,
        first: &proto::PositionReport,
        from: String,
    ) -> Result<(StreamAttachment, Arc<StoreEntry>), ServiceError> {
        let entry = self.fleet.get(&first.store_id).ok();
        auth::require_node(
            meta,
            entry.as_ref().map(|e| e.record.node_token_hash.as_str()),
        )?;
        let Some(entry) = entry else {
            return Err(AuthError(auth::NODE_REFUSED.into()).into());
        };
        let position = position(first)?;
        let attachment = entry.source.attach(from).map_err(|e| match e {
            AttachError::Closed => ServiceError::Deregistered(first.store_id.clone()),
            AttachError::Full { cap } => ServiceError::TooManyStreams {
                store: first.store_id.clone(),
                cap,
            },
        })?;
        attachment.report(position);
        entry.nudge();
        Ok((attachment, entry))
    }

    async fn health_of(&self, store_id: &str) -> Result<proto::HealthResponse, ServiceError> {
        Ok(crate::service::ops::health_view::health_of(&self.fleet, store_id).await?)
    }
}

/// A fleet's (or a field's) error as the status the API answers (chosen in `error.rs`).
fn err(e: impl Into<ServiceError>) -> Status {
    Status::from(e.into())
}
