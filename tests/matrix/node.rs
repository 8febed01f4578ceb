//! The node of a cell: the reference node (`mushroom-backup node`), a real process committing
//! into the store and reporting each synced position to the service over gRPC, killed with
//! SIGKILL when the cell's host dies. Its values are the cell's data: `--value-kind random`
//! (incompressible) or `text` (compressible); in sync mode it logs every acknowledged commit
//! (`--acked-log`: one `commit_seq commit_unix_ms ack_unix_ms` line per commit, fsynced before
//! the next acknowledgement).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::binary;

/// Commits a second the node is asked for.
pub const RATE: f64 = 40.0;
/// Bytes of each value.
pub const VALUE_SIZE: usize = 256;
/// The workload's seed (the reference node's default).
pub const SEED: u64 = 0;

/// What a node is asked to do.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    pub store: PathBuf,
    pub server: String,
    pub store_id: String,
    pub token: String,
    /// `text` or `random`.
    pub kind: String,
    /// Sync mode: wait for each commit's acknowledgement and log it here.
    pub acked_log: Option<PathBuf>,
}

/// The command of the node of `spec`.
pub fn command(spec: &NodeSpec) -> Command {
    let mut cmd = binary::command("http://unused.invalid");
    cmd.arg("node")
        .arg("--store")
        .arg(&spec.store)
        .args(["--server", &spec.server, "--store-id", &spec.store_id])
        .args(["--commits", "10000000", "--rate", &RATE.to_string()])
        .args(["--value-size", &VALUE_SIZE.to_string()])
        .args(["--value-kind", &spec.kind])
        .args(["--seed", &SEED.to_string()])
        .env("MUSHROOMDB_BACKUP_NODE_TOKEN", &spec.token);
    if let Some(log) = &spec.acked_log {
        cmd.args(["--durability", "sync", "--ack-timeout-ms", "20000"])
            .arg("--acked-log")
            .arg(log);
    }
    cmd
}

/// The node of a cell for the service at `addr`.
pub fn spec(
    addr: SocketAddr,
    store: &Path,
    (id, token): (&str, &str),
    random: bool,
    acked_log: Option<&Path>,
) -> NodeSpec {
    NodeSpec {
        store: store.to_path_buf(),
        server: format!("http://{addr}"),
        store_id: id.to_string(),
        token: token.to_string(),
        kind: if random { "random" } else { "text" }.to_string(),
        acked_log: acked_log.map(Path::to_path_buf),
    }
}
