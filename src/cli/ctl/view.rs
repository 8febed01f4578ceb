//! How `ctl` shows answers: the JSON documents of `--json` and the text for people (split
//! out of ctl.rs, which holds the calls).

use serde_json::{Value, json};

use mushroom_backup::health::rfc3339_ms;
use mushroom_backup::service::{proto, store_options_proto};

pub(super) fn health_json(r: &proto::HealthResponse) -> Value {
    let stores: Vec<Value> = r.stores.iter().map(store_health_json).collect();
    json!({ "stores": stores })
}

/// One store's health; its replica's (when it names one) under `replica`, in the same shape.
fn store_health_json(s: &proto::StoreHealth) -> Value {
    let mut v = store_state_json(s);
    // Apart: one json! of every field passes the macro's recursion limit.
    for (k, x) in [
        ("activity", json!(s.activity)),
        (
            "drilling",
            json!(s.drilling.as_ref().map(super::drill::drilling_json)),
        ),
        ("predicted_rto_seconds", json!(s.predicted_rto_seconds)),
        (
            "predicted_rto_worst_seconds",
            json!(s.predicted_rto_worst_seconds),
        ),
        ("rto_calibrated", json!(s.rto_calibrated)),
        ("rto_target_seconds", json!(s.rto_target_seconds)),
        ("traffic", super::limits::classes_json(&s.traffic)),
        (
            "branch_of",
            json!(s.branch_of.as_ref().map(|b| json!({
                "parent": b.parent,
                "parent_lineage": b.parent_lineage,
                "parent_manifest": b.parent_manifest,
                "commit_seq": b.commit_seq,
            }))),
        ),
    ] {
        v[k] = x;
    }
    v
}

fn store_state_json(s: &proto::StoreHealth) -> Value {
    json!({
        "store_id": s.store_id,
        "store_dir": s.store_dir,
        "destination": s.destination,
        "role": s.role,
        "standby_lag_commits": s.standby_lag_commits,
        "standby_lag_seconds": s.standby_lag_seconds,
        "standby_last_apply": s.standby_last_apply,
        "standby_commit_seq": s.standby_commit_seq,
        "healthy": s.healthy,
        "reason": s.reason,
        "reasons": s.reasons,
        "notes": s.notes,
        "durable_commit_seq": s.durable_commit_seq,
        "shipped_commit_seq": s.shipped_commit_seq,
        "restore_point_commit_seq": s.restore_point_commit_seq,
        "lag_seconds": s.lag_seconds,
        "lease_holder": s.lease_holder,
        "lease_held": s.lease_held,
        "instance_id": s.instance_id,
        "consecutive_failures": s.consecutive_failures,
        "last_error": s.last_error,
        "reported_at_unix_ms": s.reported_at_unix_ms,
        "paused": s.paused,
        "paused_reason": s.paused_reason,
        "paused_until_unix_ms": s.paused_until_unix_ms,
        "paused_at_unix_ms": s.paused_at_unix_ms,
        "last_drill": super::drill::last_drill_json(s.last_drill.as_ref()),
        "owner_instance_id": s.owner_instance_id,
        "owner_since_unix_ms": s.owner_since_unix_ms,
        "durability": s.durability,
        "bucket_durable_commit_seq": s.bucket_durable_commit_seq,
        "immutable": s.immutable.as_ref().map(|i| json!({
            "checked_at_unix_ms": i.checked_at_unix_ms,
            "objects_short": i.objects_short,
            "lock_extensions": i.lock_extensions,
            "lock_heads": i.lock_heads,
        })),
        "replica": s.replica.as_deref().map(store_health_json),
    })
}

pub(super) fn health_text(r: &proto::HealthResponse) -> String {
    if r.stores.is_empty() {
        return "no stores".into();
    }
    r.stores
        .iter()
        .map(|s| {
            let mut state = if s.healthy {
                "healthy".to_string()
            } else {
                format!("UNHEALTHY: {}", s.reason)
            };
            if s.paused {
                // Since when, on the first line: with the positions below it, what an SRE asks
                // of a paused store ("paused since …, shipped N").
                state.push_str(&format!(
                    "  PAUSED since {} until {}: {}",
                    rfc3339_ms(s.paused_at_unix_ms),
                    rfc3339_ms(s.paused_until_unix_ms),
                    s.paused_reason
                ));
            }
            if s.role == "standby" {
                return format!(
                    "{}  {}  {state}\n  role standby of {}  at commit {}  lag {} commits \
                     {:.1}s  last apply: {}{}",
                    s.store_id,
                    s.store_dir,
                    s.destination,
                    s.standby_commit_seq,
                    s.standby_lag_commits,
                    s.standby_lag_seconds,
                    or_dash(&s.standby_last_apply),
                    if s.last_error.is_empty() {
                        String::new()
                    } else {
                        format!("\n  last error: {}", s.last_error)
                    }
                );
            }
            let mut line = format!(
                "{}  {}  {state}\n  role {}  durable {}  shipped {}  restore point {}  lag {:.1}s  lease {}",
                s.store_id,
                s.store_dir,
                if s.role.is_empty() { "primary" } else { &s.role },
                s.durable_commit_seq,
                s.shipped_commit_seq,
                s.restore_point_commit_seq,
                s.lag_seconds,
                or_dash(&s.lease_holder),
            );
            if !s.durability.is_empty() {
                line.push_str(&format!(
                    "\n  durability {}  in the bucket (a restore reaches) {}",
                    s.durability, s.bucket_durable_commit_seq
                ));
            }
            if let Some(b) = &s.branch_of {
                line.push_str(&format!(
                    "\n  branch of {} at commit {} (its restore point {}, lineage {})",
                    b.parent, b.commit_seq, b.parent_manifest, b.parent_lineage
                ));
            }
            if !s.last_error.is_empty() {
                line.push_str(&format!("\n  last error: {}", s.last_error));
            }
            line.push_str(&super::drill::rto_text(s));
            if let Some(i) = &s.immutable {
                line.push_str(&format!(
                    "\n  immutable: {} objects short of their lock date at {} ({} locks \
                     extended, {} HEADs)",
                    i.objects_short,
                    mushroom_backup::units::rfc3339_ms(i.checked_at_unix_ms),
                    i.lock_extensions,
                    i.lock_heads
                ));
            }
            line.push_str(&super::drill::last_drill_text(
                s.last_drill.as_ref(),
            ));
            if let Some(r) = &s.replica {
                line.push_str(&format!(
                    "\n  replica {}  {}\n    durable {}  shipped {}  restore point {}  lag {:.1}s",
                    r.destination,
                    if r.healthy {
                        "healthy".to_string()
                    } else {
                        format!("UNHEALTHY: {}", r.reason)
                    },
                    r.durable_commit_seq,
                    r.shipped_commit_seq,
                    r.restore_point_commit_seq,
                    r.lag_seconds,
                ));
            }
            line.push_str(&super::moves::owner_text(
                &s.owner_instance_id,
                s.owner_since_unix_ms,
            ));
            for n in &s.notes {
                line.push_str(&format!("\n  note: {n}"));
            }
            line
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn options_json(o: Option<proto::StoreOptions>) -> Value {
    let o = o.unwrap_or_default();
    json!({
        "wal_interval_ms": o.wal_interval_ms,
        "restore_point_interval_ms": o.restore_point_interval_ms,
        "retention_interval_ms": o.retention_interval_ms,
        "keep_for_ms": o.keep_for_ms,
        "keep_generations": o.keep_generations,
        "keep_daily": o.keep_daily,
        "keep_weekly": o.keep_weekly,
        "keep_monthly": o.keep_monthly,
        "drill_interval_ms": o.drill_interval_ms,
        "monthly_request_budget": o.monthly_request_budget,
        "rto_target_seconds": o.rto_target_seconds,
        // The words of the one mapping (`store_options_proto`); a value this version does
        // not know shows as unset.
        "object_lock": store_options_proto::lock_of(o.object_lock)
            .ok()
            .flatten()
            .map(|m| m.name()),
        "durability": store_options_proto::durability_of(o.durability)
            .ok()
            .flatten()
            .map_or("", |d| d.as_str()),
        "wal_puts_per_second": o.wal_puts_per_second,
        "orphan_grace_ms": o.orphan_grace_ms,
        "replica": o.replica,
    })
}

pub(super) fn store_json(s: &proto::StoreInfo) -> Value {
    json!({
        "store_id": s.store_id,
        "store_dir": s.store_dir,
        "destination": s.destination,
        "instance_id": s.instance_id,
        "labels": s.labels,
        "registered_at_unix_ms": s.registered_at_unix_ms,
        "options": options_json(s.options.clone()),
        "owner_instance_id": s.owner_instance_id,
        "owner_since_unix_ms": s.owner_since_unix_ms,
    })
}

pub(super) fn restore_point_json(p: &proto::RestorePoint) -> Value {
    json!({
        "commit_seq": p.commit_seq,
        "manifest_key": p.manifest_key,
        "lineage": p.lineage,
        "generation": p.generation,
        "created_at_unix_ms": p.created_at_unix_ms,
        "bytes": p.bytes,
        "is_latest": p.is_latest,
    })
}

/// `s`, or `-` for an empty field.
fn or_dash(s: &str) -> &str {
    if s.is_empty() { "-" } else { s }
}
