//! What `Health`, `WatchHealth` and `ListStores` answer for each store: a local worker's
//! health, or another instance's last report of its store (unhealthy once that owner went
//! silent), and — for every store, local or not — its owner and since when, as the registry
//! holds them ([`crate::registry::Registry::owners`], one read per answer).

use super::error::ServiceError;
use super::fleet::{Fleet, FleetError, StoreEntry, StoreOptions};
use super::proto;
use super::request;

fn now_ms() -> i64 {
    crate::units::unix_now_ms()
}

/// The health of one store (NOT_FOUND if no instance has it), or of every store when empty,
/// each with its owner from the registry.
pub(super) async fn health_of(
    fleet: &Fleet,
    store_id: &str,
) -> Result<proto::HealthResponse, ServiceError> {
    let mut r = health_rows(fleet, store_id).await?;
    // One store's Health reads its own row, not every store's (10,000 rows at fleet scale).
    let owners = if store_id.is_empty() {
        fleet.registry().owners().await
    } else {
        let one = fleet.registry().owner(store_id).await;
        one.map(|o| o.into_iter().map(|o| (store_id.to_string(), o)).collect())
    };
    let owners = owners.map_err(FleetError::from)?;
    for h in &mut r.stores {
        if let Some(o) = owners.get(&h.store_id) {
            h.owner_instance_id = o.instance_id.clone();
            h.owner_since_unix_ms = o.since_ms;
        }
    }
    Ok(r)
}

/// Every store this instance runs, then every other one in the registry, with its owner.
pub(super) async fn store_infos(fleet: &Fleet) -> Result<Vec<proto::StoreInfo>, FleetError> {
    let prices = &fleet.config().prices;
    let mut stores: Vec<proto::StoreInfo> = fleet
        .list()
        .iter()
        .map(|e| proto::StoreInfo {
            usage: Some(super::usage::priced(e, prices).proto()),
            ..store_info(&e.record)
        })
        .collect();
    stores.extend(fleet.remote().await?.iter().map(|r| store_info(&r.record)));
    let owners = fleet.registry().owners().await?;
    for s in &mut stores {
        if let Some(o) = owners.get(&s.store_id) {
            s.owner_instance_id = o.instance_id.clone();
            s.owner_since_unix_ms = o.since_ms;
        }
    }
    Ok(stores)
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
        healthy: h.healthy,
        reason: h.reason,
        durable_commit_seq: h.durable_commit_seq,
        shipped_commit_seq: h.shipped_commit_seq,
        restore_point_commit_seq: h.restore_point_commit_seq,
        lag_seconds: h.lag_seconds,
        lease_holder: h.lease_holder,
        instance_id: instance_id.to_string(),
        reasons: h.reasons,
        notes: h.notes,
        reported_at_unix_ms: now_ms(),
        destination: e.record.destination.clone(),
        lease_held: h.lease_held,
        consecutive_failures: h.consecutive_failures,
        last_error: h.last_error.unwrap_or_default(),
        bytes_stored: load(&counters.bytes_shipped),
        bytes_logical: load(&counters.bytes_logical),
        last_drill: h.last_drill.as_ref().map(drill_result),
        usage: Some(usage.proto()),
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
    let opts: StoreOptions = serde_json::from_value(r.options.clone()).unwrap_or_default();
    proto::StoreInfo {
        store_id: r.store_id.clone(),
        store_dir: r.store_dir.clone(),
        destination: r.destination.clone(),
        instance_id: r.instance_id.clone(),
        labels: r.labels.clone().into_iter().collect(),
        registered_at_unix_ms: r.registered_at_ms,
        options: Some(request::proto_options(&opts)),
        ..Default::default()
    }
}

async fn health_rows(fleet: &Fleet, store_id: &str) -> Result<proto::HealthResponse, ServiceError> {
    let id = &fleet.config().instance_id;
    if !store_id.is_empty() {
        match fleet.get(store_id) {
            Ok(e) => {
                return Ok(proto::HealthResponse {
                    stores: vec![encryption(
                        store_health(&e, id, &fleet.config().prices),
                        fleet,
                    )],
                });
            }
            Err(FleetError::NotHere(_)) => {}
            Err(e) => return Err(e.into()),
        }
        let remote = fleet.remote().await?;
        return match remote.iter().find(|r| r.record.store_id == store_id) {
            Some(r) => Ok(proto::HealthResponse {
                stores: vec![remote_health(r)],
            }),
            None => Err(FleetError::UnknownStore(store_id.to_string()).into()),
        };
    }
    let mut stores: Vec<proto::StoreHealth> = fleet
        .list()
        .iter()
        .map(|e| encryption(store_health(e, id, &fleet.config().prices), fleet))
        .collect();
    stores.extend(fleet.remote().await?.iter().map(remote_health));
    Ok(proto::HealthResponse { stores })
}

/// A store another instance owns, from its last report; unhealthy when the owner went silent.
fn remote_health(r: &super::fleet::RemoteStore) -> proto::StoreHealth {
    let mut out = proto::StoreHealth {
        store_id: r.record.store_id.clone(),
        store_dir: r.record.store_dir.clone(),
        destination: r.record.destination.clone(),
        instance_id: r.record.instance_id.clone(),
        reported_at_unix_ms: r.reported_at_ms.unwrap_or(0),
        ..Default::default()
    };
    if let Some(h) = &r.health {
        out.healthy = h.healthy;
        out.reason = h.reason.clone();
        out.reasons = h.reasons.clone();
        out.notes = h.notes.clone();
        out.durable_commit_seq = h.durable_commit_seq;
        out.shipped_commit_seq = h.shipped_commit_seq;
        out.restore_point_commit_seq = h.restore_point_commit_seq;
        out.lag_seconds = h.lag_seconds;
        out.lease_holder = h.lease_holder.clone();
        out.lease_held = h.lease_held;
        out.consecutive_failures = h.consecutive_failures;
        out.last_error = h.last_error.clone().unwrap_or_default();
        let p = pause_fields(h.paused.as_ref());
        out.paused = p.paused;
        out.paused_reason = p.paused_reason;
        out.paused_until_unix_ms = p.paused_until_unix_ms;
        out.paused_at_unix_ms = p.paused_at_unix_ms;
        out.last_drill = h.last_drill.as_ref().map(drill_result);
    }
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
