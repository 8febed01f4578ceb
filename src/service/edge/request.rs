//! From proto messages to the fleet's typed calls: what each request field means, and the
//! checks of fields that only the API has (a trigger kind, a page token, a WAL position). A
//! field that is not what it may be is a [`FieldError`] (`INVALID_ARGUMENT`, `error.rs`).

use std::collections::HashMap;

use uuid::Uuid;

use crate::listing::{Cursor, Page};
use crate::service::fleet::NewStore;
use crate::service::fleet::limits::{self, FieldError};
use crate::service::proto;
use crate::store::format::WalPosition;
use crate::worker::BackupTrigger;

/// What Register and Adopt ask for (the fleet checks every field; an enum value this version
/// does not know is refused here, with the directory asked for, for the audit row).
pub fn new_store(
    store_dir: String,
    destination: String,
    labels: HashMap<String, String>,
    o: Option<proto::StoreOptions>,
) -> Result<NewStore, (String, FieldError)> {
    let options = match crate::service::fleet::options::proto::from_proto(o) {
        Ok(options) => options,
        Err(e) => return Err((store_dir, e)),
    };
    Ok(NewStore {
        store_dir,
        destination,
        labels: labels.into_iter().collect(),
        options,
    })
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

/// What an `AdoptRequest` restores: `at_commit_seq` (0: not used) or `at_time` (RFC 3339
/// with a UTC offset; empty: not used), not both.
pub fn adopt_point(r: &proto::AdoptRequest) -> Result<crate::restore::Point, FieldError> {
    let time_ms = match r.at_time.as_str() {
        "" => None,
        t => Some(
            crate::restore::at_time::parse_instant(t, crate::units::unix_now_ms())
                .map_err(|e| FieldError(format!("at_time: {e}")))?,
        ),
    };
    if time_ms.is_some() && r.at_commit_seq != 0 {
        return Err(FieldError(
            "at_commit_seq and at_time are both set: give one of them".into(),
        ));
    }
    Ok(crate::restore::Point {
        commit_seq: (r.at_commit_seq != 0).then_some(r.at_commit_seq),
        time_ms,
    })
}

/// The fork a `BranchRequest` asks for: `at_commit_seq` or `at_time`, exactly one.
pub fn branch_point(r: &proto::BranchRequest) -> Result<crate::restore::Point, FieldError> {
    let p = adopt_point(&proto::AdoptRequest {
        at_commit_seq: r.at_commit_seq,
        at_time: r.at_time.clone(),
        ..Default::default()
    })?;
    if p.commit_seq.is_none() && p.time_ms.is_none() {
        return Err(FieldError(
            "give the fork: at_commit_seq (at least 1) or at_time".into(),
        ));
    }
    Ok(p)
}

/// Checks a `ListRestorePoints` request's store id and page token (empty, or one this server
/// gave: `crate::listing::Cursor::token`, or a bare manifest key as earlier servers gave);
/// returns the cursor the token names.
pub fn check_listing(r: &proto::ListRestorePointsRequest) -> Result<Option<Cursor>, FieldError> {
    limits::check_store_id(&r.store_id)?;
    limits::check_page_token(&r.page_token)?;
    if r.page_token.is_empty() {
        return Ok(None);
    }
    match Cursor::parse(&r.page_token) {
        Some(c) => Ok(Some(c)),
        None => Err(FieldError(format!(
            "page_token {:?} is not one this server gave",
            r.page_token
        ))),
    }
}

/// A page of restore points (valid ones, newest first) as the API answers it, with the token
/// of the next page (empty on the last).
pub fn page(page: Page) -> proto::ListRestorePointsResponse {
    let restore_points = page
        .points
        .into_iter()
        .map(|p| proto::RestorePoint {
            commit_seq: p.manifest.commit_seq,
            lineage: p.manifest.lineage.to_string(),
            generation: p.manifest.generation,
            created_at_unix_ms: crate::manifest::parse_time_ms(&p.manifest.created_at).unwrap_or(0),
            bytes: p.manifest.total_len().unwrap_or(0),
            is_latest: p.is_latest,
            encrypted: p.manifest.encrypted(),
            manifest_key: p.key,
        })
        .collect();
    proto::ListRestorePointsResponse {
        restore_points,
        next_page_token: page.next.map(|c| c.token()).unwrap_or_default(),
        earliest_unix_ms: 0,
        latest_unix_ms: 0,
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
