//! `ctl limits show [STORE_ID]` and `ctl limits set [--store STORE_ID] CLASS=…`: the throttle's
//! limits of the instance (or of one store, asked of its owner), each class's limit beside
//! the rate measured over the last 10 s; a table, or one JSON document with `--json`
//! (`classes.<class>.limit` and `.rate`, bytes a second, 0: no limit).

use clap::{Args, Subcommand};
use mushroom_backup::service::proto;
use serde_json::{Value, json};

use super::client::{Ctl, failed, print};

#[derive(Args)]
pub struct LimitsArgs {
    #[command(subcommand)]
    call: LimitsCall,
}

#[derive(Subcommand)]
enum LimitsCall {
    /// The instance's limits (its base, with the schedule's open windows over it, and the
    /// schedule), or one store's own with the instance's beside them.
    Show {
        store_id: Option<String>,
        /// Another instance of the cluster [default: the one called].
        #[arg(long)]
        instance: Option<String>,
    },
    /// Set limits live, over those in force: the instance's (until it restarts) or, with
    /// --store, the store's own (kept in its options). `CLASS=unlimited` lifts one.
    Set {
        /// CLASS=BYTES_PER_SECOND[,requests=N]; classes bulk, restore, check, housekeeping.
        #[arg(required = true, value_name = "CLASS=BYTES_PER_SECOND[,requests=N]")]
        limits: Vec<String>,
        #[arg(long)]
        store: Option<String>,
        #[arg(long)]
        instance: Option<String>,
    },
}

pub(super) async fn run(ctl: &mut Ctl, j: bool, a: LimitsArgs) -> anyhow::Result<()> {
    let r = match a.call {
        LimitsCall::Show { store_id, instance } => {
            let req = proto::GetLimitsRequest {
                store_id: store_id.unwrap_or_default(),
                instance_id: instance.unwrap_or_default(),
            };
            let r = ctl.client.get_limits(ctl.request(req, true)).await;
            r.map_err(|s| failed("GetLimits", s))?.into_inner()
        }
        LimitsCall::Set {
            limits,
            store,
            instance,
        } => {
            let req = proto::SetLimitsRequest {
                store_id: store.unwrap_or_default(),
                instance_id: instance.unwrap_or_default(),
                limits,
            };
            let r = ctl.client.set_limits(ctl.request(req, true)).await;
            r.map_err(|s| failed("SetLimits", s))?.into_inner()
        }
    };
    print(j, limits_json(&r), text(&r))
}

/// The JSON of an answer: the scope, each class's limit and rate, the limits set and the
/// schedule.
fn limits_json(r: &proto::LimitsResponse) -> Value {
    json!({
        "store_id": (!r.store_id.is_empty()).then_some(&r.store_id),
        "instance_id": r.instance_id,
        "classes": classes_json(&r.classes),
        "limits": r.limits,
        "schedule": r.schedule,
    })
}

/// `{class: {limit, rate, requests_limit, requests_rate[, instance_limit, …]}}`: what
/// `ctl health --json` shows as a store's `traffic` too.
pub(super) fn classes_json(classes: &[proto::ClassTraffic]) -> Value {
    let mut out = serde_json::Map::new();
    for c in classes {
        out.insert(
            c.class.clone(),
            json!({
                "limit": c.limit_bytes_per_second,
                "rate": c.rate_bytes_per_second.round(),
                "requests_limit": c.limit_requests_per_second,
                "requests_rate": (c.rate_requests_per_second * 10.0).round() / 10.0,
                "instance_limit": c.instance_limit_bytes_per_second,
                "instance_requests_limit": c.instance_limit_requests_per_second,
            }),
        );
    }
    Value::Object(out)
}

fn text(r: &proto::LimitsResponse) -> String {
    let scope = match r.store_id.is_empty() {
        true => format!("instance {}", r.instance_id),
        false => format!("store {} (on instance {})", r.store_id, r.instance_id),
    };
    let mut out = format!(
        "{scope}\n{:<13} {:>16} {:>16} {:>10} {:>10}\n",
        "class", "limit B/s", "rate B/s", "limit r/s", "rate r/s"
    );
    let n = |v: u64| match v {
        0 => "-".to_string(),
        v => v.to_string(),
    };
    for c in &r.classes {
        out += &format!(
            "{:<13} {:>16} {:>16.0} {:>10} {:>10.1}\n",
            c.class,
            n(c.limit_bytes_per_second),
            c.rate_bytes_per_second,
            n(c.limit_requests_per_second),
            c.rate_requests_per_second
        );
    }
    if !r.schedule.is_empty() {
        out += "schedule (UTC):\n";
        for w in &r.schedule {
            out += &format!("  {w}\n");
        }
    }
    out
}
