//! From proto messages to the fleet's typed calls: what each request field means, and the
//! checks of fields that only the API has (a trigger kind, a page token, a WAL position). A
//! field that is not what it may be is a [`FieldError`] (`INVALID_ARGUMENT`, `error.rs`).

use std::collections::HashMap;

use uuid::Uuid;

use super::fleet::{NewStore, StoreOptions};
use super::limits::{self, FieldError};
use super::proto;
use crate::store::format::WalPosition;
use crate::verify::RestorePointInfo;
use crate::worker::BackupTrigger;

/// A store's options: 0 (or no options at all) is the service's default.
pub fn options(o: Option<proto::StoreOptions>) -> StoreOptions {
    let o = o.unwrap_or_default();
    let nz = |v: u64| (v != 0).then_some(v);
    StoreOptions {
        wal_interval_ms: nz(o.wal_interval_ms),
        restore_point_interval_ms: nz(o.restore_point_interval_ms),
        retention_interval_ms: nz(o.retention_interval_ms),
        keep_for_ms: nz(o.keep_for_ms),
        keep_generations: nz(o.keep_generations),
    }
}

/// The proto form of a store's options (the service's default: 0).
pub fn proto_options(o: &StoreOptions) -> proto::StoreOptions {
    proto::StoreOptions {
        wal_interval_ms: o.wal_interval_ms.unwrap_or(0),
        restore_point_interval_ms: o.restore_point_interval_ms.unwrap_or(0),
        retention_interval_ms: o.retention_interval_ms.unwrap_or(0),
        keep_for_ms: o.keep_for_ms.unwrap_or(0),
        keep_generations: o.keep_generations.unwrap_or(0),
    }
}

/// What Register and Adopt ask for (the fleet checks every field).
pub fn new_store(
    store_dir: String,
    destination: String,
    labels: HashMap<String, String>,
    o: Option<proto::StoreOptions>,
) -> NewStore {
    NewStore {
        store_dir,
        destination,
        labels: labels.into_iter().collect(),
        options: options(o),
    }
}

/// The trigger a `TriggerRequest.kind` names.
pub fn trigger(kind: i32) -> Result<BackupTrigger, FieldError> {
    match proto::TriggerKind::try_from(kind) {
        Ok(proto::TriggerKind::Ship) => Ok(BackupTrigger::Ship),
        Ok(proto::TriggerKind::RestorePoint) => Ok(BackupTrigger::RestorePoint),
        Ok(proto::TriggerKind::Retention) => Ok(BackupTrigger::Retention),
        _ => Err(FieldError(format!(
            "kind {kind} is not a trigger (SHIP, RESTORE_POINT or RETENTION)"
        ))),
    }
}

/// Checks a `ListRestorePoints` request's store id and page token (empty, or one this server
/// gave: a manifest key).
pub fn check_listing(r: &proto::ListRestorePointsRequest) -> Result<(), FieldError> {
    limits::check_store_id(&r.store_id)?;
    limits::check_page_token(&r.page_token)?;
    if !r.page_token.is_empty() && crate::manifest::parse_manifest_key(&r.page_token).is_none() {
        return Err(FieldError(format!(
            "page_token {:?} is not one this server gave",
            r.page_token
        )));
    }
    Ok(())
}

/// One page of `points` (the readable ones, newest first) after `page_token`, and the token
/// of the next page (empty on the last).
pub fn page(
    mut points: Vec<RestorePointInfo>,
    page_token: &str,
    page_size: u32,
) -> proto::ListRestorePointsResponse {
    let size = limits::page_size(page_size);
    points.retain(|p| p.error.is_none());
    points.sort_by(|a, b| b.key.cmp(&a.key));
    let start = if page_token.is_empty() {
        0
    } else {
        points
            .iter()
            .position(|p| p.key.as_str() < page_token)
            .unwrap_or(points.len())
    };
    let page: Vec<_> = points[start..].iter().take(size).collect();
    let next_page_token = if start + page.len() < points.len() {
        page.last().map(|p| p.key.clone()).unwrap_or_default()
    } else {
        String::new()
    };
    let restore_points = page
        .into_iter()
        .map(|p| proto::RestorePoint {
            commit_seq: p.commit_seq.unwrap_or(0),
            manifest_key: p.key.clone(),
            lineage: p.lineage.map(|l| l.to_string()).unwrap_or_default(),
            generation: p.generation.unwrap_or(0),
            created_at_unix_ms: p
                .created_at
                .as_deref()
                .and_then(crate::manifest::parse_time_ms)
                .unwrap_or(0),
            bytes: p.bytes.unwrap_or(0),
            is_latest: p.is_latest,
        })
        .collect();
    proto::ListRestorePointsResponse {
        restore_points,
        next_page_token,
    }
}

fn parse_uuid(field: &str, s: &str) -> Result<Uuid, FieldError> {
    Uuid::parse_str(s).map_err(|e| FieldError(format!("{field} {s:?} is not a UUID: {e}")))
}

/// The WAL position a node reports.
pub fn position(r: &proto::PositionReport) -> Result<WalPosition, FieldError> {
    Ok(WalPosition {
        snapshot_id: if r.snapshot_id.is_empty() {
            None
        } else {
            Some(parse_uuid("snapshot_id", &r.snapshot_id)?)
        },
        wal_id: parse_uuid("wal_id", &r.wal_id)?,
        wal_number: r.wal_number,
        durable_len: r.durable_len,
        commit_seq: r.commit_seq,
    })
}

/// A report on a stream that reports for `store_id`: the stream's store, always.
pub fn same_store(store_id: &str, r: &proto::PositionReport) -> Result<(), FieldError> {
    if r.store_id != store_id {
        return Err(FieldError(format!(
            "a stream reports for one store ({store_id}), not {}",
            r.store_id
        )));
    }
    Ok(())
}

/// A `ReportPosition` stream that ended before its first report.
pub fn no_first_report() -> FieldError {
    FieldError("the stream ended before its first report".into())
}
