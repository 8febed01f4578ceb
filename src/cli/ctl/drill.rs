//! `ctl drill STORE [--at SEQ]`: a restore drill (the service's `Drill`), and how `ctl health`
//! shows a store's last drill. A drill that ran but failed prints its error and exits 1 (so a
//! cron job or a CI step fails on it); a call the service refused exits 1 with the call's code.

use serde_json::{Value, json};

use mushroom_backup::health::rfc3339_ms;
use mushroom_backup::service::proto;

use super::client::{Ctl, failed, print};

/// `ctl drill`: whether the drill succeeded.
pub(super) async fn drill(
    ctl: &mut Ctl,
    j: bool,
    store_id: String,
    at: Option<u64>,
) -> anyhow::Result<bool> {
    let req = proto::DrillRequest {
        store_id: store_id.clone(),
        at_commit_seq: at.unwrap_or(0),
    };
    // A drill restores a whole store: the service bounds it (its adopt_timeout), not --timeout-ms.
    let r = ctl
        .client
        .drill(ctl.request(req, false))
        .await
        .map_err(|s| failed("Drill", s))?
        .into_inner();
    print(
        j,
        json!({
            "store_id": store_id,
            "ok": r.ok,
            "commit_seq": r.commit_seq,
            "manifest_key": r.manifest_key,
            "duration_ms": r.duration_ms,
            "bytes": r.bytes,
            "error": r.error,
            "finished_at_unix_ms": r.finished_at_unix_ms,
        }),
        if r.ok {
            format!(
                "drill of store {store_id} succeeded: commit {} from {} restored and checked in \
                 {} ms ({} bytes)",
                r.commit_seq, r.manifest_key, r.duration_ms, r.bytes
            )
        } else {
            format!("drill of store {store_id} FAILED: {}", r.error)
        },
    )?;
    Ok(r.ok)
}

/// `last_drill` of `ctl health --json`.
pub(super) fn last_drill_json(d: Option<&proto::DrillResult>) -> Value {
    match d {
        None => Value::Null,
        Some(d) => json!({
            "ok": d.ok,
            "commit_seq": d.commit_seq,
            "manifest_key": d.manifest_key,
            "duration_ms": d.duration_ms,
            "bytes": d.bytes,
            "error": d.error,
            "finished_at_unix_ms": d.finished_at_unix_ms,
            "last_ok_at_unix_ms": d.last_ok_at_unix_ms,
        }),
    }
}

/// The line `ctl health` prints for a store's last drill (empty: never drilled).
pub(super) fn last_drill_text(d: Option<&proto::DrillResult>) -> String {
    match d {
        None => String::new(),
        Some(d) if d.ok => format!(
            "\n  last drill: ok at {} (commit {}, {} ms, {} bytes)",
            rfc3339_ms(d.finished_at_unix_ms),
            d.commit_seq,
            d.duration_ms,
            d.bytes
        ),
        Some(d) => format!(
            "\n  last drill: FAILED at {}: {}",
            rfc3339_ms(d.finished_at_unix_ms),
            d.error
        ),
    }
}
