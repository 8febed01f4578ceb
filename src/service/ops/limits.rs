//! `GetLimits` and `SetLimits`: the throttle's limits of the instance or of one store, each
//! class's limit beside the rate measured (`crate::bucket::throttle`, `fleet::traffic`), and
//! the same per store in its health ([`store_traffic`]).
//!
//! - The instance (no store): `SetLimits` sets limits over the base in force (the schedule's
//!   open windows still over them) and applies them at once; until the process ends.
//! - A store (answered by its owner, as every store-scoped call): `SetLimits` writes the
//!   store's options with the limits set over its own (`StoreOptions.limits`, one registry
//!   statement: a crash before it changes nothing, after it the next start applies them),
//!   then applies them to its scope at once (its primary and replica share one).
//!
//! Limits are checked before anything is looked up or written: one that does not parse is
//! `INVALID_ARGUMENT` naming it; none at all is refused too.

use crate::bucket::throttle::{LimitSet, Measured, StoreScope, TrafficClass};
use crate::service::fleet::admission::limits::FieldError;
use crate::service::fleet::{Fleet, FleetError, options::StoreOptions};
use crate::service::proto;

/// What `GetLimits` answers for `store_id` (empty: this instance).
pub async fn get(fleet: &Fleet, store_id: &str) -> Result<proto::LimitsResponse, FleetError> {
    let instance_id = fleet.config().instance_id.clone();
    let traffic = fleet.traffic();
    if store_id.is_empty() {
        let throttle = traffic.throttle();
        return Ok(proto::LimitsResponse {
            store_id: String::new(),
            instance_id,
            classes: classes(&throttle.limits(), &throttle.measured(), None),
            limits: strings(&throttle.limits()),
            schedule: traffic.schedule_lines(crate::units::unix_now_ms()),
        });
    }
    let options = owned_options(fleet, store_id).await?;
    Ok(proto::LimitsResponse {
        store_id: store_id.to_string(),
        instance_id,
        classes: store_traffic(fleet, store_id, &options),
        limits: strings(&options.limit_set()),
        schedule: Vec::new(),
    })
}

/// What `SetLimits` does (see the module docs); answers as [`get`] does after it.
pub async fn set(
    fleet: &Fleet,
    store_id: &str,
    limits: &[String],
    peer: Option<String>,
) -> Result<proto::LimitsResponse, FleetError> {
    let parsed = LimitSet::parse_all(limits).map_err(|e| FieldError(format!("limits: {e}")))?;
    if parsed.is_empty() {
        return Err(FieldError(
            "limits: none given (CLASS=BYTES_PER_SECOND[,requests=N], e.g. bulk=20000000)".into(),
        )
        .into());
    }
    let shown: Vec<String> = parsed.iter().map(|l| l.to_string()).collect();
    if store_id.is_empty() {
        fleet.traffic().set_instance(&parsed);
        tracing::info!(peer = peer.as_deref().unwrap_or(""), limits = %shown.join(" "), "set the instance's traffic limits");
        return get(fleet, "").await;
    }
    let mut options = owned_options(fleet, store_id).await?;
    let set = options.limit_set().with(&parsed);
    options.limits = strings(&set);
    if !fleet
        .registry()
        .set_store_options(store_id, &options.to_row())
        .await?
    {
        return Err(FleetError::UnknownStore(store_id.to_string()));
    }
    if let Some(scope) = fleet.traffic().throttle().store_named(store_id) {
        scope.set_limits(&set);
    }
    tracing::info!(store_id, peer = peer.as_deref().unwrap_or(""), limits = %shown.join(" "), "set a store's traffic limits");
    get(fleet, store_id).await
}

/// The options of `store_id`, which this instance must own.
async fn owned_options(fleet: &Fleet, store_id: &str) -> Result<StoreOptions, FleetError> {
    let record = fleet.registered(store_id).await?;
    if record.instance_id != fleet.config().instance_id {
        return Err(FleetError::OwnedElsewhere {
            store: store_id.to_string(),
            owner: record.instance_id,
        });
    }
    StoreOptions::of_row(&record)
}

/// Each class of the store `store_id` (its own limits `options`, the instance's beside them,
/// and what its scope measured while one is held): `GetLimits` and `StoreHealth.traffic`.
pub fn store_traffic(
    fleet: &Fleet,
    store_id: &str,
    options: &StoreOptions,
) -> Vec<proto::ClassTraffic> {
    let throttle = fleet.traffic().throttle();
    let scope: Option<std::sync::Arc<StoreScope>> = throttle.store_named(store_id);
    let (own, measured) = match &scope {
        Some(s) => (s.limits(), s.measured()),
        None => (options.limit_set(), Default::default()),
    };
    classes(&own, &measured, Some(&throttle.limits()))
}

/// The health note of a store whose bulk uploads a limit has held back for longer than its
/// restore-point interval: its restore points come later than asked (its WAL does not).
pub fn held_back_note(
    fleet: &Fleet,
    store_id: &str,
    interval: std::time::Duration,
) -> Option<String> {
    let scope = fleet.traffic().throttle().store_named(store_id)?;
    let held = scope
        .held_back(TrafficClass::Bulk)
        .filter(|h| *h > interval)?;
    Some(format!(
        "bulk uploads (snapshots, archives) held back by a traffic limit for {}s, longer than \
         the restore-point interval ({}s): restore points come later than asked; the WAL is \
         not delayed (ctl limits show {store_id})",
        held.as_secs(),
        interval.as_secs()
    ))
}

/// Every class, wal first: `limits` and `measured` at one scope, the instance's `beside`.
fn classes(
    limits: &LimitSet,
    measured: &[Measured; TrafficClass::ALL.len()],
    beside: Option<&LimitSet>,
) -> Vec<proto::ClassTraffic> {
    TrafficClass::ALL
        .into_iter()
        .map(|c| {
            let (l, m) = (limits.get(c), measured[c as usize]);
            let i = beside.map(|b| b.get(c)).unwrap_or_default();
            proto::ClassTraffic {
                class: c.name().to_string(),
                limit_bytes_per_second: l.bytes_per_second,
                limit_requests_per_second: l.requests_per_second,
                rate_bytes_per_second: m.bytes_per_second,
                rate_requests_per_second: m.requests_per_second,
                instance_limit_bytes_per_second: i.bytes_per_second,
                instance_limit_requests_per_second: i.requests_per_second,
            }
        })
        .collect()
}

fn strings(limits: &LimitSet) -> Vec<String> {
    limits.limits().iter().map(|l| l.to_string()).collect()
}
