//! Standbys in the service: `ctl standby` (the service's `Register` with
//! `StoreOptions.standby`: the service keeps the directory current from the destination and
//! never writes to it) and `ctl promote` (its `Promote`: the standby becomes the primary).
//! How `ctl health` shows a standby is in `view.rs`.

use serde_json::json;

use mushroom_backup::service::proto;

use super::client::{Ctl, StoreFlags, failed, print};

/// `ctl standby` and `ctl promote` (issue 28).
#[derive(clap::Subcommand)]
pub(super) enum StandbyCall {
    /// Register a standby: the service keeps DIR (empty, or a standby of this destination
    /// already) current from the destination and never writes to it, until `promote`.
    /// Prints the store id and node token (the token serves once the store is promoted).
    Standby {
        /// Absolute store directory under one of the server's allowed roots (it must exist).
        #[arg(long)]
        dir: String,
        /// The destination to follow: file:///path or s3://bucket/prefix.
        #[arg(long)]
        destination: String,
        /// Labels, and the options its worker runs with once promoted.
        #[command(flatten)]
        store: Box<StoreFlags>,
    },
    /// Make a standby the primary of its destination: fence the old writer through the bucket
    /// lease, apply everything durable, adopt the prefix, start backing up.
    Promote {
        store_id: String,
        /// Where the old writer cannot be proven fenced (an async primary held by a `serve`,
        /// which promises no acknowledgement window), wait until its lease is stale instead of
        /// refusing.
        #[arg(long)]
        wait_for_lease: bool,
    },
}

pub(super) async fn run(ctl: &mut Ctl, j: bool, call: StandbyCall) -> anyhow::Result<()> {
    match call {
        StandbyCall::Standby {
            dir,
            destination,
            store,
        } => super::calls::register(ctl, j, dir, destination, *store, true).await,
        StandbyCall::Promote {
            store_id,
            wait_for_lease,
        } => promote(ctl, j, store_id, wait_for_lease).await,
    }
}

/// `ctl promote`: a promotion waits for the old writer's lease, so it has no deadline of
/// ctl's (the server's adopt_timeout_ms bounds it).
async fn promote(
    ctl: &mut Ctl,
    j: bool,
    store_id: String,
    wait_for_lease: bool,
) -> anyhow::Result<()> {
    let req = proto::PromoteRequest {
        store_id,
        wait_for_lease,
    };
    let r = ctl
        .client
        .promote(ctl.request(req, false))
        .await
        .map_err(|s| failed("Promote", s))?
        .into_inner();
    print(
        j,
        json!({
            "store_id": r.store_id,
            "lineage": r.lineage,
            "commit_seq": r.commit_seq,
            "parent_manifest": r.parent_manifest,
            "fenced": r.fenced,
        }),
        format!(
            "promoted store {} at commit {} (lineage {}, parent {}){}",
            r.store_id,
            r.commit_seq,
            r.lineage,
            r.parent_manifest,
            match r.fenced.as_str() {
                "" => String::new(),
                f => format!("; took the lease over from {f}"),
            }
        ),
    )?;
    Ok(())
}
