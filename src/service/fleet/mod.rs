//! The fleet: one backup worker (with its lease, supervisor and health) per registered store
//! directory, and the registry that outlives the process.
//!
//! Registering (and Adopt) first checks every field of the request (`limits`, `paths`,
//! `destination`); Adopt also checks the new store against every registered one
//! (`conflicts`) before it reads the prefix. The registry row is written in one transaction
//! with that conflict check, under the registry's registration lock, so two instances cannot
//! both register stores that contradict each other. A refusal is audited and leaves no row.
//!
//! Registering writes the registry row first and then starts the worker; if the worker cannot
//! start, the row is removed again, so a crash between the two leaves a registered store that
//! the next start respawns (never a worker the registry does not know). Deregistering stops the
//! worker (flushing when asked) before deleting the row, then ends the store's position
//! streams. On start every store this instance owns is respawned, its directory checked again
//! against the allowed roots. A running worker checks its directory again at every look
//! ([`StoreDir::confined`]): one whose directory left its root or was replaced reads and
//! writes nothing there, and its health says why.
//!
//! Every hosted store is in one map with its role (`hosted.rs`): a primary has a worker (and
//! its replica's, `replica.rs`), all started by one builder (`start.rs`); a standby
//! (`StoreOptions::standby`) has a follower instead (`standby.rs`, which says what each call
//! does with a standby), until `Promote` (`promote.rs`) puts a primary in its place.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::config::ServiceConfig;
use crate::bucket;
use crate::bucket::throttle::TrafficClass;
use crate::events::{Bus, EventKind, Facts, NewEvent};
use crate::lease::{InstanceLeaseConfig, InstanceLeases, instance};
use crate::registry::{self, InstanceClaim, Predecessor, Registry, StoreRecord};
use crate::restore::{self, RestoreOptions};
use crate::store::dir::StoreDir;
use crate::wal_source::StreamedSource;
use crate::worker::BackupHandle;
use admission::conflicts::{Candidate, Intent};
use admission::destination::{Destination, Placement};
use admission::limits::FieldError;

pub use options::StoreOptions;

/// One registered store with its running worker.
pub struct StoreEntry {
    pub record: StoreRecord,
    pub handle: BackupHandle,
    pub source: Arc<StreamedSource>,
    /// Every request the worker, its lease and retention send, at the bucket (`bucket::usage`).
    pub usage: Arc<bucket::usage::Usage>,
    /// The store's options as it runs with them (its request budget, for health).
    pub options: StoreOptions,
    /// The replica's worker, when the options name one (`replica.rs`).
    pub replica: Option<ReplicaEntry>,
}

impl StoreEntry {
    /// Stops the store's workers, the primary's and the replica's, at once (each flushing when
    /// `flush`); see [`BackupHandle::shutdown`].
    pub async fn shutdown(&self, flush: bool) {
        let replica = async {
            if let Some(h) = self.replica.as_ref().and_then(ReplicaEntry::handle) {
                h.shutdown(flush).await;
            }
        };
        futures::join!(self.handle.shutdown(flush), replica);
    }

    /// Tells both workers a node reported a position.
    pub fn nudge(&self) {
        self.handle.nudge();
        if let Some(h) = self.replica.as_ref().and_then(ReplicaEntry::handle) {
            h.nudge();
        }
    }
}

/// What a client asks to register.
pub struct NewStore {
    pub store_dir: String,
    pub destination: String,
    pub labels: BTreeMap<String, String>,
    pub options: StoreOptions,
}

/// A [`NewStore`] whose fields passed their checks: its resolved directory, its destination
/// and the URL to record for it.
struct Checked {
    dir: PathBuf,
    destination: Destination,
    url: String,
    intent: Intent,
}

impl Checked {
    fn candidate(&self) -> Candidate<'_> {
        Candidate {
            dir: &self.dir,
            destination: &self.url,
            parsed: &self.destination,
            intent: self.intent,
        }
    }
}

pub struct Fleet {
    /// Every long-lived task of the service (the claim's renewal, the health reports, the
    /// API's streams and pollers, every worker's runner, supervisor and lease renewal): closed
    /// and waited for at shutdown ([`Fleet::stop_tasks`]).
    pub tasks: TaskTracker,
    registry: Registry,
    config: Arc<ServiceConfig>,
    /// Every store this instance hosts, primary or standby (`hosted.rs`).
    hosted: hosted::HostedMap,
    shutdown: CancellationToken,
    /// This process's claim on its instance id, renewed by [`keep_claim`].
    claim: InstanceClaim,
    /// Cancelled, with the reason in `claim_lost_why`, when the claim was taken over.
    claim_lost: CancellationToken,
    claim_lost_why: std::sync::Mutex<Option<String>>,
    /// One bucket lease per lease root, fencing every store's lease under it: the only lease
    /// renewals the service sends ([`crate::lease::instance`]).
    leases: InstanceLeases,
    /// The registered stores indexed for registration checks, kept from one to the next.
    conflicts: conflicts::Memo,
    /// Every event of the service and its workers (`crate::events`).
    events: Bus,
    /// Held while a store given to this instance is started (`fleet/hosting.rs`).
    hosting: tokio::sync::Mutex<()>,
    /// Opens every bucket of the instance: one S3 client per configuration, and a token
    /// cancelled only by [`Fleet::stop_tasks`], after the last flushes and lease releases
    /// (the shutdown token is cancelled before them: a worker flushes on it).
    buckets: bucket::Opener,
    /// Restore rates per endpoint and the drills under way (`rto.rs`).
    rto: rto::Rto,
    /// Bytes each branch prefix keeps alive only through its pin in a parent's prefix, by the
    /// branch's URL, as this instance's workers of those parents last found them (refreshed
    /// at the health report's tick: [`Fleet::refresh_branch_charges`]).
    branch_charges: std::sync::Mutex<HashMap<String, u64>>,
    /// The instance's throttle, its base limits and schedule (`traffic.rs`).
    traffic: Arc<traffic::Traffic>,
}

// The admission's modules keep their paths (`fleet::limits`, …): the other rooms check
// request fields with them.
pub use admission::{conflicts, destination, limits, paths};
pub use error::FleetError;
pub use hosted::Hosted;
pub(in crate::service) use record::Done;
pub use remote::RemoteStore;
pub use replica::ReplicaEntry;
pub use standby::StandbyEntry;

pub(crate) mod admission;
mod branch;
mod claim_renewal;
mod deregister;
mod error;
pub mod event_log;
mod hosted;
mod hosting;
mod promote;
mod shared_id;
mod start;
pub mod traffic;
pub use promote::PromoteError;
pub mod options;
mod record;
pub mod remote;
mod replica;
pub mod rto;
mod standby;
pub mod store_metrics;

fn now_ms() -> i64 {
    crate::units::unix_now_ms()
}

impl Fleet {
    /// Opens the fleet under this process's `claim` on its instance id and respawns a worker
    /// for every store the instance owns. The claim is renewed every third of its
    /// [`stale_after`](InstanceClaim::stale_after) (or every `health_report_interval`, if
    /// sooner); when it turns out taken over, [`Fleet::claim_lost`] is cancelled.
    pub async fn start(
        registry: Registry,
        claim: InstanceClaim,
        config: Arc<ServiceConfig>,
        shutdown: CancellationToken,
        events: Bus,
    ) -> Result<Arc<Fleet>, FleetError> {
        match claim.predecessor() {
            Some(Predecessor::ProvenDead(previous)) => {
                tracing::info!(instance_id = %config.instance_id, previous = %previous, "took over at once the claim of this data directory's previous process, proven stopped by its lock");
            }
            Some(Predecessor::Stale(previous)) => {
                tracing::warn!(instance_id = %config.instance_id, previous = %previous, "took over the stale claim of a process that stopped renewing it");
            }
            None => {}
        }
        let tasks = TaskTracker::new();
        // A predecessor its lock proves dead wrote its leases under its nonce: they are taken
        // at once. One only stale may still be writing: its leases go by the usual rules.
        let proven_dead = claim
            .predecessor()
            .filter(|p| p.proven_dead())
            .map(|p| instance::holder_id(&config.instance_id, p.nonce()))
            .into_iter()
            .collect();
        let traffic = traffic::Traffic::new(&config.throttle);
        let buckets =
            bucket::Opener::throttled(CancellationToken::new(), traffic.throttle().clone());
        let leases = InstanceLeases::new(
            InstanceLeaseConfig {
                ttl: config.lease_ttl,
                conditional: config.worker.conditional_writes,
                proven_dead,
                ..InstanceLeaseConfig::new(&config.instance_id, &claim.record().nonce)
            },
            &tasks,
            buckets.clone(),
        );
        let rto = rto::Rto::load(&registry).await;
        let fleet = Arc::new(Fleet {
            tasks,
            leases,
            conflicts: conflicts::Memo::default(),
            registry,
            config,
            hosted: hosted::HostedMap::default(),
            shutdown,
            claim,
            claim_lost: CancellationToken::new(),
            claim_lost_why: std::sync::Mutex::new(None),
            events,
            hosting: tokio::sync::Mutex::new(()),
            buckets,
            rto,
            branch_charges: Default::default(),
            traffic,
        });
        fleet
            .tasks
            .spawn(fleet.traffic.clone().keep(fleet.shutdown.clone()));
        fleet.tasks.spawn(claim_renewal::keep_claim(fleet.clone()));
        let mine = fleet
            .registry
            .list_stores(Some(&fleet.config.instance_id))
            .await?;
        let count = mine.len();
        fleet.refuse_a_shared_instance_id(&mine).await?;
        let mut pauses = fleet.registry.pauses().await?;
        let mut drills = fleet.registry.drills().await?;
        for record in mine {
            let id = record.store_id.clone();
            let (pause, drill) = (pauses.remove(&id), drills.remove(&id));
            // The store stays registered (an operator may fix its root or destination) if
            // this fails; it just has no worker in this process.
            if let Err(e) = fleet.respawn(record, pause, drill).await {
                tracing::error!(store_id = %id, error = %e, "cannot respawn a registered store")
            }
        }
        tracing::info!(stores = count, "respawned the registered stores");
        Ok(fleet)
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Restore rates per endpoint and the drills under way (`rto.rs`).
    pub fn rto(&self) -> &rto::Rto {
        &self.rto
    }

    /// Cancelled at shutdown: the fleet's long-lived tasks end on it.
    pub(super) fn shutdown_token(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// Cancelled when another process took this instance id's claim over: this process must
    /// stop running its stores ([`Fleet::claim_lost_why`] says who took it).
    pub fn claim_lost(&self) -> CancellationToken {
        self.claim_lost.clone()
    }

    /// Why the claim was lost, once it was.
    pub fn claim_lost_why(&self) -> Option<String> {
        self.claim_lost_why.lock().expect("not poisoned").clone()
    }

    /// Gives up the instance claim after a clean stop, so a restart claims it at once.
    pub async fn release_claim(&self) {
        if let Err(e) = self.claim.release().await {
            tracing::warn!(error = %e, "cannot release the instance claim; it goes stale by itself");
        }
    }

    /// What every bucket of this instance is opened with (see the field).
    pub fn buckets(&self) -> &bucket::Opener {
        &self.buckets
    }

    pub fn config(&self) -> &ServiceConfig {
        &self.config
    }

    /// The event bus: what `WatchEvents` and the webhooks hear, and where to publish.
    pub fn events(&self) -> &Bus {
        &self.events
    }

    /// Starts a store's worker (paused, with the pause the registry holds for it) with its
    /// options, checked (a registration's) or brought into range (a row's,
    /// [`StoreOptions::of_row`]): the worker takes them as they are.
    async fn spawn(
        &self,
        record: StoreRecord,
        options: StoreOptions,
        pause: Option<crate::health::Pause>,
    ) -> Result<Arc<StoreEntry>, FleetError> {
        let dir = paths::check_store_dir(&record.store_dir, &self.config.allow_roots)?;
        if let Err(e) = destination::check(&record.destination, self.placement()) {
            // Checked at registration; a root narrowed since does not stop a running backup.
            tracing::warn!(store_id = %record.store_id, error = %e, "a registered destination is no longer one Register would accept");
        }
        // One directory handle for the workers and their WAL source: opened once, inside the
        // allowed roots, and re-checked at every look (`crate::store::dir`).
        let store = StoreDir::confined(dir.clone(), self.config.allow_roots.clone());
        let source = StreamedSource::with_max_streams(
            store.clone(),
            self.config.limits.max_streams_per_store,
        );
        let start::Running { handle, usage } = self
            .start_worker(start::WorkerSpec {
                destination: &record.destination,
                store_id: &record.store_id,
                lease_name: record.store_id.clone(),
                options: &options,
                store: &store,
                source: &source,
                pause: pause.clone(),
                events: Some(self.events.emitter(&record.store_id)),
            })
            .await
            .map_err(|e| match e {
                start::StartError::Bucket(e) => FleetError::from(e),
                start::StartError::LeaseRoot(e) => FleetError::LeaseRoot(e),
            })?;
        // Once the primary runs: a replica that cannot start leaves it running.
        let replica = self
            .spawn_replica(&record, &options, &store, &source, pause)
            .await;
        let entry = Arc::new(StoreEntry {
            record,
            handle,
            source,
            usage,
            options,
            replica,
        });
        self.hosted
            .insert(&entry.record.store_id, Hosted::Primary(entry.clone()));
        Ok(entry)
    }

    /// Registers a store and starts its worker (a standby's follower: `standby.rs`); returns
    /// its row and node token.
    pub async fn register(
        &self,
        new: NewStore,
        peer: Option<String>,
    ) -> Result<(StoreRecord, String), FleetError> {
        let checked = match self.check_new(&new, Intent::Register) {
            Ok(checked) => checked,
            Err(e) => {
                return Err(self
                    .refused("register", Some(&new.store_dir), e, peer)
                    .await);
            }
        };
        let standby = new.options.is_standby();
        let event = move |r: &StoreRecord| {
            let detail = match standby {
                true => format!(
                    "registered {} as a standby of {}",
                    r.store_dir, r.destination
                ),
                false => format!("registered {} backing up to {}", r.store_dir, r.destination),
            };
            NewEvent::new(EventKind::Registered, &r.store_id, detail)
        };
        self.insert_and_spawn(new, checked, "register", String::new(), peer, event)
            .await
    }

    /// Where `file://` destinations may be.
    fn placement(&self) -> Placement<'_> {
        Placement {
            store_roots: &self.config.allow_roots,
            data_dir: &self.config.data_dir,
            destination_roots: &self.config.allow_destination_roots,
            endpoints: &self.config.allow_endpoints,
        }
    }

    /// Checks every field of `new`: limits, the directory's root, the destination's shape and
    /// place. (Against the registered stores: in the insert, and for Adopt before it reads.)
    fn check_new(&self, new: &NewStore, intent: Intent) -> Result<Checked, FleetError> {
        let dir = paths::check_store_dir(&new.store_dir, &self.config.allow_roots)?;
        let destination = destination::check(&new.destination, self.placement())?;
        limits::check_labels(&new.labels)?;
        new.options.check()?;
        standby::check(new, &dir, intent)?;
        new.options
            .check_object_lock_destination(&new.destination, self.config.worker.object_lock)?;
        new.options.check_replica(
            &destination,
            self.placement(),
            self.config.worker.object_lock,
        )?;
        if dir.to_str().is_none() {
            return Err(FieldError("store_dir resolves to a non-UTF-8 path".into()).into());
        }
        Ok(Checked {
            url: destination.url(&new.destination),
            dir,
            destination,
            intent,
        })
    }

    async fn insert_and_spawn(
        &self,
        new: NewStore,
        checked: Checked,
        action: &str,
        detail: String,
        peer: Option<String>,
        event: impl FnOnce(&StoreRecord) -> NewEvent + Send,
    ) -> Result<(StoreRecord, String), FleetError> {
        let token = registry::new_node_token();
        let now = now_ms();
        let record = StoreRecord {
            store_id: uuid::Uuid::new_v4().to_string(),
            store_dir: checked.dir.to_string_lossy().into_owned(),
            destination: checked.url.clone(),
            labels: new.labels,
            options: new.options.to_row(),
            node_token_hash: registry::hash_token(&token),
            instance_id: self.config.instance_id.clone(),
            registered_at_ms: now,
            owner_since_ms: now,
        };
        // Against every registered store, final: under the registry's lock, in the insert's
        // transaction.
        let inserted = self
            .registry
            .insert_store_checked(&record, |registered| {
                conflicts::find_in(&self.conflicts, &checked.candidate(), registered)
            })
            .await;
        let refusal = match inserted {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(FleetError::from(e)),
            Err(e) => Some(FleetError::from(e)),
        };
        if let Some(e) = refusal {
            return Err(self.refused(action, Some(&record.store_dir), e, peer).await);
        }
        let spawned = match new.options.is_standby() {
            true => self
                .spawn_standby(record.clone(), new.options)
                .await
                .map(|_| ()),
            false => self
                .spawn(record.clone(), new.options, None)
                .await
                .map(|_| ()),
        };
        match spawned {
            Ok(()) => {
                let done = Done {
                    action,
                    store_id: &record.store_id,
                    store_dir: &record.store_dir,
                    detail,
                    peer,
                };
                self.record(done, Some(event(&record))).await;
                tracing::info!(store_id = %record.store_id, store_dir = %record.store_dir, destination = %record.destination, "{action}ed a store");
                Ok((record, token))
            }
            Err(e) => {
                let _ = self.registry.delete_store(&record.store_id).await;
                Err(self.refused(action, Some(&record.store_dir), e, peer).await)
            }
        }
    }

    /// A store this instance runs ([`FleetError::Field`] for what cannot be a store id,
    /// [`FleetError::NotHere`] for a store this instance does not run).
    pub fn get(&self, store_id: &str) -> Result<Arc<StoreEntry>, FleetError> {
        limits::check_store_id(store_id)?;
        match self.hosted.get(store_id) {
            Some(Hosted::Primary(e)) => Ok(e),
            Some(Hosted::Standby(s)) => Err(FleetError::IsStandby {
                store: store_id.to_string(),
                destination: s.record.destination.clone(),
            }),
            None => Err(FleetError::NotHere(store_id.to_string())),
        }
    }

    /// A store in the registry that this instance does not run ([`Fleet::get`] said
    /// [`FleetError::NotHere`]); [`FleetError::UnknownStore`] if no instance has it.
    pub(crate) async fn registered(&self, store_id: &str) -> Result<StoreRecord, FleetError> {
        self.registry
            .get_store(store_id)
            .await?
            .ok_or_else(|| FleetError::UnknownStore(store_id.to_string()))
    }

    /// The instance's unwrapping keys, for Adopt and drills (a key file; public-key mode has
    /// none, and an encrypted prefix then refuses with the key ids it needs).
    pub fn restore_keys(&self) -> restore::keys::RestoreKeys {
        let keys = self.config.worker.encryption.keys.as_ref();
        restore::keys::RestoreKeys::new(keys.map(|e| e.unwrap.clone()).unwrap_or_default())
    }

    /// The destination of any store in the registry (local or owned by another instance).
    pub async fn destination_of(&self, store_id: &str) -> Result<String, FleetError> {
        match self.get(store_id) {
            Ok(e) => Ok(e.record.destination.clone()),
            Err(FleetError::NotHere(_)) => Ok(self.registered(store_id).await?.destination),
            Err(e) => Err(e),
        }
    }

    /// A local store, or — for a store another instance owns — an error naming the owner.
    pub async fn get_owned(&self, store_id: &str) -> Result<Arc<StoreEntry>, FleetError> {
        match self.get(store_id) {
            Ok(e) => Ok(e),
            Err(FleetError::NotHere(_)) => Err(FleetError::OwnedElsewhere {
                store: store_id.to_string(),
                owner: self.registered(store_id).await?.instance_id,
            }),
            Err(e) => Err(e),
        }
    }

    /// One page of the restore points of any store in the registry, read from its
    /// destination at the cost of a page (`crate::listing`).
    pub async fn restore_points(
        &self,
        store_id: &str,
        cursor: Option<crate::listing::Cursor>,
        page_size: usize,
        with_span: bool,
    ) -> Result<(crate::listing::Page, Option<(i64, i64)>), FleetError> {
        let destination = self.destination_of(store_id).await?;
        let bucket = (self.buckets.read_only(&destination))
            .lane(self.store_lane(&destination, store_id))
            .class(TrafficClass::Housekeeping)
            .open()
            .await?;
        let page = crate::listing::page(bucket.as_ref(), cursor, page_size).await?;
        let span = match with_span {
            true => restore::at_time::restorable_span(bucket.as_ref())
                .await
                .map_err(FleetError::Restore)?,
            false => None,
        };
        Ok((page, span))
    }

    /// Every primary this instance hosts (the standbys: [`Fleet::standbys`]).
    pub fn list(&self) -> Vec<Arc<StoreEntry>> {
        self.hosted.primaries()
    }

    /// Boot restore into an empty or missing directory, then registration (the worker adopts).
    pub async fn adopt(
        &self,
        new: NewStore,
        at: restore::Point,
        peer: Option<String>,
    ) -> Result<(StoreRecord, String, restore::RestoreReport), FleetError> {
        let checked = match self.check_adopt(&new).await {
            Ok(checked) => checked,
            Err(e) => return Err(self.refused("adopt", Some(&new.store_dir), e, peer).await),
        };
        let bucket = (self.buckets.read_only(&checked.url))
            .class(TrafficClass::Restore)
            .open()
            .await?;
        let opts = RestoreOptions {
            at: at.commit_seq,
            at_time_ms: at.time_ms,
            adopt: true,
            keys: self.restore_keys(),
            rates: self.rto.rates(&checked.url),
            parallelism: rto::PARALLELISM,
            ..RestoreOptions::default()
        };
        let report = match restore::restore(bucket.as_ref(), &checked.dir, &opts).await {
            Ok(r) => {
                self.rto
                    .learn_restore(&self.registry, &checked.url, &r, &opts)
                    .await;
                r
            }
            Err(e) => {
                let e = FleetError::Restore(e);
                return Err(self.refused("adopt", Some(&new.store_dir), e, peer).await);
            }
        };
        let detail = format!(
            "restored commit {} from {}",
            report.commit_seq, report.manifest_key
        );
        let event = |r: &StoreRecord| {
            let detail = format!(
                "adopted {} at commit {} from {}",
                r.store_dir, report.commit_seq, report.manifest_key
            );
            NewEvent::new(EventKind::Registered, &r.store_id, detail).with(Facts {
                commit_seq: Some(report.commit_seq),
                ..Facts::default()
            })
        };
        let (record, token) = self
            .insert_and_spawn(new, checked, "adopt", detail, peer, event)
            .await?;
        Ok((record, token, report))
    }

    async fn check_adopt(&self, new: &NewStore) -> Result<Checked, FleetError> {
        let checked = self.check_new(new, Intent::Adopt)?;
        // Before the restore reads the prefix; the insert checks again, under the lock.
        let registered = self.registry.list_stores(None).await?;
        if let Some(e) = conflicts::find(&checked.candidate(), &registered) {
            return Err(e.into());
        }
        let dir = &checked.dir;
        match std::fs::read_dir(dir) {
            Ok(mut entries) => {
                if entries.next().is_some() {
                    return Err(FleetError::AdoptTarget(format!(
                        "{} is not empty: Adopt restores only into an empty or missing directory",
                        dir.display()
                    )));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(FleetError::AdoptTarget(format!("{}: {e}", dir.display())));
            }
        }
        Ok(checked)
    }

    /// Stops every worker (each flushes a last restore point and releases its lease).
    pub async fn shutdown_all(&self, flush: bool) {
        let entries = self.list();
        let standbys = self.standbys();
        let followers = futures::future::join_all(standbys.iter().map(|s| s.stop()));
        let workers = futures::future::join_all(entries.iter().map(|e| e.shutdown(flush)));
        futures::join!(followers, workers);
    }

    /// Releases the instance leases: after [`Fleet::shutdown_all`], once no store writes.
    pub async fn release_leases(&self) {
        self.leases.release_all().await;
    }

    /// Closes [`Fleet::tasks`] and waits for every task in it to end (each ends on its
    /// cancellation token: call this after cancelling them).
    pub async fn stop_tasks(&self) {
        // Nothing flushes any more: a request still retrying (a drill's, a listing's) ends.
        self.buckets.cancel_token().cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }
}

/// The event of a store deregistered (`flush`: after a last flush).
fn deregistered(store_id: &str, flush: bool) -> NewEvent {
    let how = if flush { " after a last flush" } else { "" };
    NewEvent::new(
        EventKind::Deregistered,
        store_id,
        format!("deregistered{how}"),
    )
}
