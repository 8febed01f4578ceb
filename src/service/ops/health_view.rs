//! What `Health`, `WatchHealth` and `ListStores` answer for each store: a local worker's
//! health, or another instance's last report of its store (unhealthy once that owner went
//! silent), and — for every store, local or not — its owner and since when, as the registry
//! holds them.
//!
//! Registry reads per answer: the fleet's `Health` and `ListStores` read the `stores` rows
//! once (each row carries its owner: [`crate::registry::StoreRecord::owner_since_ms`]), and
//! `Health` also every health report and heartbeat (`remote.rs`). One store's `Health` reads
//! that store's rows only: its owner row when it runs here (the registry's word, not the
//! worker's copy, so a store claimed away shows its new owner before the reconcile stops it
//! here), else its row, its health report and its owner's heartbeat in one join.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::registry::Owner;
use crate::service::fleet::remote::Remote;
use crate::service::fleet::{
    Fleet, FleetError, ReplicaEntry, StandbyEntry, StoreEntry, StoreOptions,
};
use crate::service::proto;

fn now_ms() -> i64 {
    crate::units::unix_now_ms()
}

/// The health of one store (NOT_FOUND if no instance has it), or of every store when empty,
/// each with its owner from the registry.
pub(in crate::service) async fn health_of(
    fleet: &Fleet,
    store_id: &str,
) -> Result<proto::HealthResponse, FleetError> {
    if !store_id.is_empty() {
        if let Some(s) = fleet.standby(store_id) {
            return Ok(proto::HealthResponse {
                stores: vec![s.health(&fleet.config().instance_id)],
            });
        }
        let h = match fleet.get(store_id) {
            Ok(e) => {
                let mut h = local_health(fleet, &e);
                // The worker's own answer stands when the registry cannot be read: the owner
                // shown is then the one this instance was started with.
                match fleet.registry().owner(store_id).await {
                    Ok(Some(o)) => set_owner(&mut h, &o),
                    Ok(None) => {}
                    Err(e) => tracing::warn!(
                        store_id,
                        error = %e,
                        "the registry's owner row could not be read; Health shows the worker's own"
                    ),
                }
                h
            }
            Err(FleetError::NotHere(_)) => match fleet.remote_one(store_id).await? {
                Some(r) => remote_health(&r),
                None => return Err(FleetError::UnknownStore(store_id.to_string())),
            },
            Err(e) => return Err(e),
        };
        return Ok(proto::HealthResponse { stores: vec![h] });
    }
    let remote = fleet.remote().await?;
    Ok(fleet_health(fleet, &fleet.list(), &remote))
}

/// Every store's health: `local_stores` (this instance's, with their owners from `remote`),
/// then the stores of `remote` not running here.
fn fleet_health(
    fleet: &Fleet,
    local_stores: &[Arc<StoreEntry>],
    remote: &Remote,
) -> proto::HealthResponse {
    let standbys = fleet.standbys();
    let here: BTreeSet<&str> = local_stores
        .iter()
        .map(|e| e.record.store_id.as_str())
        .chain(standbys.iter().map(|s| s.record.store_id.as_str()))
        .collect();
    let mut stores: Vec<proto::StoreHealth> = local_stores
        .iter()
        .map(|e| {
            let mut h = local_health(fleet, e);
            if let Some(o) = remote.owners.get(&e.record.store_id) {
                set_owner(&mut h, o);
            }
            h
        })
        .collect();
    stores.extend(standbys.iter().map(|s| {
        let mut h = s.health(&fleet.config().instance_id);
        if let Some(o) = remote.owners.get(&s.record.store_id) {
            set_owner(&mut h, o);
        }
        h
    }));
    // A store claimed away that still runs here (until the reconcile stops it) shows once.
    let elsewhere = remote.stores.iter();
    stores.extend(
        elsewhere
            .filter(|r| !here.contains(r.record.store_id.as_str()))
            .map(remote_health),
    );
    proto::HealthResponse { stores }
}

/// The whole fleet's health for the `WatchHealth` poller ([`FleetHealth::poll`]), remembering
/// what it read, so that a poll of a fleet where nothing changed costs a few atomic loads per
/// store and no registry read:
///
/// - the registry's part (every store's owner; the stores other instances own, with their
///   reports and whether their owner went silent) is read again once `reread` has passed since
///   the last read: other instances report every `health_report_interval`, so reading more
///   often finds nothing new (an owner changed by a claim or a move shows within it too);
/// - the answer is built again only when the registry's part changed or a local store shows
///   something new ([`local_mark`]); otherwise the poll answers `None`, "as before".
pub(in crate::service) struct FleetHealth {
    fleet: Arc<Fleet>,
    reread: Duration,
    remote: Option<(Instant, Remote)>,
    /// [`local_mark`] of the last answer.
    mark: Option<u64>,
}

impl FleetHealth {
    pub fn new(fleet: Arc<Fleet>) -> FleetHealth {
        FleetHealth {
            reread: fleet.config().health_report_interval,
            fleet,
            remote: None,
            mark: None,
        }
    }

    /// Every store's health, or `None` when neither the registry's part nor a local store
    /// changed since the last answer (see the type's docs).
    pub async fn poll(&mut self) -> Result<Option<proto::HealthResponse>, FleetError> {
        let mut remote_changed = false;
        if self
            .remote
            .as_ref()
            .is_none_or(|(at, _)| at.elapsed() >= self.reread)
        {
            // A failed read forgets the last one: the next poll reads again, and answers.
            let read = self.fleet.remote().await;
            let last = self.remote.take();
            let read = read?;
            remote_changed = last.is_none_or(|(_, r)| r != read);
            self.remote = Some((Instant::now(), read));
        }
        let local = self.fleet.list();
        let mark = local_mark(&local, &self.fleet.config().prices, &self.fleet.standbys());
        if !remote_changed && self.mark == Some(mark) {
            return Ok(None);
        }
        self.mark = Some(mark);
        let (_, remote) = self.remote.as_ref().expect("read above");
        Ok(Some(fleet_health(&self.fleet, &local, remote)))
    }
}

/// What a local store's part of the answer changes with, but for the clock (the read time, the
/// lag's growth between evaluations, the usage's window and what is projected from it), hashed
/// over every store: which stores run here, their health serial (every change of health),
/// their counters, their request counts (and so their stored bytes), and for a store with a
/// request budget, whether its projection is over it.
fn local_mark(
    local: &[Arc<StoreEntry>],
    prices: &crate::cost::Prices,
    standbys: &[Arc<StandbyEntry>],
) -> u64 {
    use std::hash::{Hash, Hasher};
    use std::sync::atomic::Ordering::Relaxed;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    local.len().hash(&mut h);
    for s in standbys {
        (Arc::as_ptr(s) as usize, s.mark()).hash(&mut h);
    }
    for e in local {
        let counters = e.handle.counters();
        (
            Arc::as_ptr(e) as usize,
            e.handle.health_serial(),
            counters.bytes_shipped.load(Relaxed),
            counters.bytes_logical.load(Relaxed),
            e.usage.requests_so_far(),
            e.replica.as_ref().map(|r| r.mark()),
        )
            .hash(&mut h);
        if e.options.monthly_request_budget.unwrap_or(0) > 0 {
            super::usage::priced(e, prices).note.is_some().hash(&mut h);
        }
    }
    h.finish()
}

fn set_owner(h: &mut proto::StoreHealth, o: &Owner) {
    h.owner_instance_id = o.instance_id.clone();
    h.owner_since_unix_ms = o.since_ms;
}

/// Every store this instance runs, then every other one in the registry, with its owner: one
/// read of the rows.
pub(in crate::service) async fn store_infos(
    fleet: &Fleet,
) -> Result<Vec<proto::StoreInfo>, FleetError> {
    let prices = &fleet.config().prices;
    let me = &fleet.config().instance_id;
    let rows = fleet.registry().list_stores(None).await?;
    let by_id: BTreeMap<&str, &crate::registry::StoreRecord> =
        rows.iter().map(|r| (r.store_id.as_str(), r)).collect();
    let local = fleet.list();
    let standbys = fleet.standbys();
    let here: BTreeSet<&str> = local
        .iter()
        .map(|e| e.record.store_id.as_str())
        .chain(standbys.iter().map(|s| s.record.store_id.as_str()))
        .collect();
    let mut stores: Vec<proto::StoreInfo> = local
        .iter()
        .map(|e| {
            let mut info = proto::StoreInfo {
                usage: Some(super::usage::with_branch_charges(
                    super::usage::priced(e, prices).proto(),
                    fleet,
                    e,
                    prices,
                )),
                ..store_info(&e.record)
            };
            // The row as read now: the owner may have changed since the worker started.
            if let Some(row) = by_id.get(e.record.store_id.as_str()) {
                info.owner_instance_id = row.instance_id.clone();
                info.owner_since_unix_ms = row.owner_since_ms;
            }
            info
        })
        .collect();
    stores.extend(standbys.iter().map(|s| {
        let row = by_id.get(s.record.store_id.as_str()).copied();
        store_info(row.unwrap_or(&s.record))
    }));
    stores.extend(
        rows.iter()
            .filter(|r| &r.instance_id != me && !here.contains(r.store_id.as_str()))
            .map(store_info),
    );
    Ok(stores)
}

/// A store running here: its worker's health, with the instance's encryption fields, its
/// predicted restore times and the drill running now (`super::rto_view`).
fn local_health(fleet: &Fleet, e: &StoreEntry) -> proto::StoreHealth {
    let config = fleet.config();
    let mut h = encryption(store_health(e, &config.instance_id, &config.prices), fleet);
    h.usage = h
        .usage
        .map(|u| super::usage::with_branch_charges(u, fleet, e, &config.prices));
    h.traffic = super::limits::store_traffic(fleet, &e.record.store_id, &e.options);
    // The store's own interval, else the service's: no whole configuration built per read.
    let interval = (e.options.worker.restore_point_interval_ms).map_or(
        config.worker.restore_point_interval,
        std::time::Duration::from_millis,
    );
    h.notes.extend(super::limits::held_back_note(
        fleet,
        &e.record.store_id,
        interval,
    ));
    super::rto_view::with_rto(h, fleet, e)
}

fn store_health(
    e: &StoreEntry,
    instance_id: &str,
    prices: &crate::cost::Prices,
) -> proto::StoreHealth {
    let mut h = e.handle.health();
    // Cost (`usage.rs`): the usage, and a projection over the request budget as a note.
    let usage = super::usage::priced(e, prices);
    h.notes.extend(usage.note.clone());
    let counters = e.handle.counters();
    let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    proto::StoreHealth {
        store_id: e.record.store_id.clone(),
        store_dir: e.record.store_dir.clone(),
        instance_id: instance_id.to_string(),
        role: "primary".into(),
        reported_at_unix_ms: now_ms(),
        destination: e.record.destination.clone(),
        bytes_stored: load(&counters.bytes_shipped),
        bytes_logical: load(&counters.bytes_logical),
        usage: Some(usage.proto()),
        durability: e.handle.durability_mode().as_str().to_string(),
        replica: e.replica.as_ref().map(|r| {
            let budget = e.options.monthly_request_budget.unwrap_or(0);
            Box::new(replica_health(r, budget, prices))
        }),
        ..health_fields(h)
    }
}

/// A replica's own health (`StoreHealth.replica`): its worker's, with its usage; unhealthy
/// naming why when its worker could not start.
fn replica_health(
    r: &ReplicaEntry,
    budget: u64,
    prices: &crate::cost::Prices,
) -> proto::StoreHealth {
    let destination = r.url.clone();
    match &r.running {
        Ok(running) => {
            let mut h = running.handle.health();
            let usage = super::usage::priced_usage(&running.usage, budget, prices);
            h.notes.extend(usage.note.clone());
            let counters = running.handle.counters();
            let load =
                |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
            proto::StoreHealth {
                destination,
                bytes_stored: load(&counters.bytes_shipped),
                bytes_logical: load(&counters.bytes_logical),
                usage: Some(usage.proto()),
                ..health_fields(h)
            }
        }
        Err(why) => {
            let reason = format!("the replica's worker could not start: {why}");
            proto::StoreHealth {
                destination,
                healthy: false,
                reasons: vec![reason.clone()],
                reason,
                ..Default::default()
            }
        }
    }
}

/// The one mapping of a store's health to the API's fields, for a store hosted here (its
/// worker's health now) and for one another instance owns (its owner's last report); the
/// callers add whose and where it is.
fn health_fields(h: crate::health::StoreHealth) -> proto::StoreHealth {
    proto::StoreHealth {
        healthy: h.healthy,
        reason: h.reason,
        durable_commit_seq: h.durable_commit_seq,
        shipped_commit_seq: h.shipped_commit_seq,
        restore_point_commit_seq: h.restore_point_commit_seq,
        // One snapshot with the two above (`worker::figures`), never read apart from them.
        bucket_durable_commit_seq: h.bucket_durable_commit_seq,
        lag_seconds: h.lag_seconds,
        lease_holder: h.lease_holder,
        reasons: h.reasons,
        notes: h.notes,
        lease_held: h.lease_held,
        consecutive_failures: h.consecutive_failures,
        last_error: h.last_error.unwrap_or_default(),
        activity: h.activity,
        last_drill: h.last_drill.as_ref().map(drill_result),
        immutable: h.immutable.map(|i| proto::ImmutableCheck {
            checked_at_unix_ms: i.checked_at_unix_ms,
            objects_short: i.objects_short,
            lock_extensions: i.lock_extensions,
            lock_heads: i.lock_heads,
        }),
        branch_of: h.branched_from.map(|b| proto::BranchOf {
            parent: b.prefix,
            parent_lineage: b.lineage.to_string(),
            parent_manifest: b.manifest,
            commit_seq: b.commit_seq,
        }),
        ..pause_fields(h.paused.as_ref())
    }
}

/// A drill's outcome as `StoreHealth.last_drill` shows it.
fn drill_result(d: &crate::health::DrillResult) -> proto::DrillResult {
    proto::DrillResult {
        ok: d.ok,
        commit_seq: d.commit_seq,
        duration_ms: d.duration_ms,
        bytes: d.bytes,
        error: d.error.clone(),
        finished_at_unix_ms: d.finished_at_unix_ms,
        last_ok_at_unix_ms: d.last_ok_at_unix_ms,
        manifest_key: d.manifest_key.clone(),
        predicted_ms: d.predicted_ms,
    }
}

/// A local store's encryption fields: the instance's keys, which every worker uses.
fn encryption(mut h: proto::StoreHealth, fleet: &Fleet) -> proto::StoreHealth {
    if let Some(k) = &fleet.config().worker.encryption.keys {
        h.encrypted = true;
        h.key_ids = k.wrap_ids().iter().map(|i| i.to_string()).collect();
    }
    h
}

/// The pause fields of a `StoreHealth` (the rest default).
fn pause_fields(p: Option<&crate::health::Pause>) -> proto::StoreHealth {
    match p {
        None => proto::StoreHealth::default(),
        Some(p) => proto::StoreHealth {
            paused: true,
            paused_reason: p.reason.clone(),
            paused_until_unix_ms: p.until_unix_ms,
            paused_at_unix_ms: p.paused_at_unix_ms,
            ..Default::default()
        },
    }
}

fn store_info(r: &crate::registry::StoreRecord) -> proto::StoreInfo {
    let opts = StoreOptions::as_registered(r).unwrap_or_default();
    proto::StoreInfo {
        store_id: r.store_id.clone(),
        store_dir: r.store_dir.clone(),
        destination: r.destination.clone(),
        instance_id: r.instance_id.clone(),
        labels: r.labels.clone().into_iter().collect(),
        registered_at_unix_ms: r.registered_at_ms,
        options: Some(crate::service::fleet::options::proto::to_proto(&opts)),
        owner_instance_id: r.instance_id.clone(),
        owner_since_unix_ms: r.owner_since_ms,
        ..Default::default()
    }
}

/// A store another instance owns, from its last report; unhealthy when the owner went silent.
fn remote_health(r: &crate::service::fleet::RemoteStore) -> proto::StoreHealth {
    let mut out = proto::StoreHealth {
        store_id: r.record.store_id.clone(),
        store_dir: r.record.store_dir.clone(),
        destination: r.record.destination.clone(),
        instance_id: r.record.instance_id.clone(),
        reported_at_unix_ms: r.reported_at_ms.unwrap_or(0),
        owner_instance_id: r.record.instance_id.clone(),
        owner_since_unix_ms: r.record.owner_since_ms,
        ..r.health.clone().map(health_fields).unwrap_or_default()
    };
    if r.silent {
        let why = match r.reported_at_ms {
            Some(t) => format!(
                "the owning instance {} has not reported this store's health for {} s; is it running?",
                r.record.instance_id,
                (now_ms() - t).max(0) / 1000
            ),
            None => format!(
                "the owning instance {} has never reported this store's health; is it running?",
                r.record.instance_id
            ),
        };
        out.healthy = false;
        out.reasons.insert(0, why.clone());
        out.reason = why;
    }
    out
}
