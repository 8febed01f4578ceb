//! `ctl cost [--store ID]`: each store's requests by class, bytes and estimated monthly cost,
//! from the `usage` of its health (`Health`); a table, or one JSON document with `--json`.
//! A store another instance owns shows no usage here (ask that instance).

use clap::Args;
use mushroom_backup::service::proto;
use serde_json::{Value, json};

use super::client::{Ctl, print};

#[derive(Args)]
pub struct CostArgs {
    /// Only this store [default: every store].
    #[arg(long)]
    store: Option<String>,
}

pub(super) async fn cost(ctl: &mut Ctl, j: bool, a: CostArgs) -> anyhow::Result<()> {
    // One store's usage is counted only by its owner: ask it (forwarded) rather than read the
    // registry's last report, which has none.
    let fresh = a.store.is_some();
    let r = ctl.health(a.store, fresh).await?;
    let stores: Vec<Value> = r.stores.iter().map(cost_json).collect();
    print(j, json!({ "stores": stores }), table(&r.stores))?;
    Ok(())
}

fn cost_json(h: &proto::StoreHealth) -> Value {
    let Some(u) = &h.usage else {
        return json!({"store_id": h.store_id, "usage": null, "instance_id": h.instance_id});
    };
    json!({
        "store_id": h.store_id,
        "instance_id": h.instance_id,
        "usage": {
            "requests": {
                "put": u.put_requests,
                "get": u.get_requests,
                "list": u.list_requests,
                "head": u.head_requests,
                "delete": u.delete_requests,
            },
            "bytes_uploaded": u.bytes_uploaded,
            "bytes_downloaded": u.bytes_downloaded,
            "bytes_stored": u.bytes_stored,
            "objects_stored": u.objects_stored,
            "projected_monthly_requests": u.projected_monthly_requests,
            "estimated_monthly_cost_usd": u.estimated_monthly_cost_usd,
            "requests_monthly_cost_usd": u.requests_monthly_cost_usd,
            "storage_monthly_cost_usd": u.storage_monthly_cost_usd,
            "since_unix_ms": u.since_unix_ms,
            "window_ms": u.window_ms,
            "monthly_request_budget": u.monthly_request_budget,
            "over_budget": u.over_budget,
            "held_for_branches_bytes": u.held_for_branches_bytes,
            "pinned_in_parent_bytes": u.pinned_in_parent_bytes,
        },
    })
}

fn table(stores: &[proto::StoreHealth]) -> String {
    let mut out = format!(
        "{:<38} {:>8} {:>8} {:>6} {:>6} {:>7} {:>12} {:>12} {:>12} {:>12} {:>10}\n",
        "STORE",
        "PUT",
        "GET",
        "LIST",
        "HEAD",
        "DELETE",
        "UP",
        "DOWN",
        "STORED",
        "REQ/MONTH",
        "USD/MONTH"
    );
    for h in stores {
        let Some(u) = &h.usage else {
            out.push_str(&format!(
                "{:<38} (owned by instance {}: ask it)\n",
                h.store_id, h.instance_id
            ));
            continue;
        };
        out.push_str(&format!(
            "{:<38} {:>8} {:>8} {:>6} {:>6} {:>7} {:>12} {:>12} {:>12} {:>12} {:>10.4}{}\n",
            h.store_id,
            u.put_requests,
            u.get_requests,
            u.list_requests,
            u.head_requests,
            u.delete_requests,
            bytes(u.bytes_uploaded),
            bytes(u.bytes_downloaded),
            bytes(u.bytes_stored),
            u.projected_monthly_requests,
            u.estimated_monthly_cost_usd,
            if u.over_budget {
                format!("  over budget ({} a month)", u.monthly_request_budget)
            } else {
                String::new()
            }
        ));
        if u.held_for_branches_bytes > 0 {
            out.push_str(&format!(
                "{:<38} of which {} kept only for branches (charged to them)\n",
                "",
                bytes(u.held_for_branches_bytes)
            ));
        }
        if u.pinned_in_parent_bytes > 0 {
            out.push_str(&format!(
                "{:<38} plus {} of its parent's kept only for this branch (charged here)\n",
                "",
                bytes(u.pinned_in_parent_bytes)
            ));
        }
    }
    out
}

/// `n` bytes in the largest binary unit that keeps it at least 1.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}
