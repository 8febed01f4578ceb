//! Which instance owns a store: `ctl move STORE --to INSTANCE` and `ctl drain INSTANCE` (the
//! service's `Move` and `Drain`, `service::moves`), and how `ctl health` and `ctl list` show a
//! store's owner and since when (`StoreHealth.owner_instance_id` / `owner_since_unix_ms`).

use std::process::ExitCode;

use serde_json::{Value, json};

use mushroom_backup::health::rfc3339_ms;
use mushroom_backup::service::{self, proto};

use super::client::{Ctl, failed, print};

/// `\n  owner B since <time>` for `ctl health` and `ctl list`; empty when the answer named
/// none (an older server).
pub(super) fn owner_text(owner: &str, since_ms: i64) -> String {
    if owner.is_empty() {
        return String::new();
    }
    format!("\n  owner {owner} since {}", rfc3339_ms(since_ms))
}

/// `ctl move` and `ctl drain` (issue 15 part 5).
#[derive(Debug, clap::Subcommand)]
pub(super) enum MoveCall {
    /// Move a store to another live instance of its owner's failover group: the owner
    /// flushes (ships what is durable, writes a restore point), stops and releases the
    /// lease, the registry row changes owner, the target starts. A paused store is moved
    /// without a flush and stays paused on the target until Resume. A refused move changes
    /// nothing.
    Move {
        store_id: String,
        /// The instance to move it to.
        #[arg(long)]
        to: String,
    },
    /// Move every store of an instance to live members of its failover group (before
    /// maintenance), several at once; a store that cannot move stays where it was and the
    /// others go on; exits 1 if any store stayed.
    Drain {
        instance_id: String,
        /// How many stores are moved at once, 1 to 16 [default: the server's, 4].
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(service::MAX_DRAIN_PARALLEL)))]
        parallel: Option<u32>,
    },
}

/// Runs a [`MoveCall`]: 1 unless everything asked for moved.
pub(super) async fn run(ctl: &mut Ctl, j: bool, call: MoveCall) -> anyhow::Result<ExitCode> {
    match call {
        MoveCall::Move { store_id, to } => {
            let req = proto::MoveRequest {
                store_id,
                to_instance_id: to,
            };
            let r = ctl
                .client
                .r#move(ctl.request(req, false))
                .await
                .map_err(|s| failed("Move", s))?
                .into_inner();
            print(j, moved_json(&r), moved_text(&r))?;
            Ok(ExitCode::SUCCESS)
        }
        MoveCall::Drain {
            instance_id,
            parallel,
        } => {
            let req = proto::DrainRequest {
                instance_id,
                parallel: parallel.unwrap_or(0),
            };
            let r = ctl
                .client
                .drain(ctl.request(req, false))
                .await
                .map_err(|s| failed("Drain", s))?
                .into_inner();
            let mut text: Vec<String> = r.moved.iter().map(moved_text).collect();
            text.extend(r.failed.iter().map(|f| format!("NOT MOVED: {f}")));
            let moved: Vec<Value> = r.moved.iter().map(moved_json).collect();
            print(
                j,
                json!({ "moved": moved, "failed": r.failed }),
                text.join("\n"),
            )?;
            Ok(if r.failed.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
    }
}

fn moved_json(r: &proto::MoveResponse) -> Value {
    json!({
        "store_id": r.store_id,
        "from_instance_id": r.from_instance_id,
        "to_instance_id": r.to_instance_id,
        "restore_point_commit_seq": r.restore_point_commit_seq,
    })
}

fn moved_text(r: &proto::MoveResponse) -> String {
    format!(
        "moved store {} from {} to {} (restore point {})",
        r.store_id, r.from_instance_id, r.to_instance_id, r.restore_point_commit_seq
    )
}
