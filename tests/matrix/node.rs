//! The node of a cell: a real process committing into the store and reporting each synced
//! position to the service over gRPC, killed with SIGKILL when the cell's host dies.
//!
//! - Incompressible data: the reference node itself (`mushroom-backup node`), whose workload
//!   is `ValueKind::Random`; in sync mode with `--acked-log`.
//! - Compressible data: the reference node has no `--value-kind` (`store write` has), so this
//!   test binary runs itself as the node ([`run_text_node`], behind the ignored test
//!   `matrix_node_process`): the same engine, the same node client, the same workload with
//!   `ValueKind::Text` values, the same acked log (one `commit_seq commit_unix_ms ack_unix_ms`
//!   line per acknowledged commit, fsynced before the next acknowledgement; waits in commit
//!   order, a failed wait leaves its commit unacknowledged). It goes once `node --value-kind`
//!   exists.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mushroom_backup::node_client::{NodeClient, NodeClientConfig};
use mushroom_backup::store::engine::{Engine, EngineOptions, ValueKind, workload_ops_of};

use crate::support::binary;

/// The variable that makes the test binary's `matrix_node_process` run as a node: a JSON
/// [`NodeSpec`].
pub const NODE_ENV: &str = "MATRIX_NODE_SPEC";

/// Commits a second the node is asked for.
pub const RATE: f64 = 40.0;
/// Bytes of each value.
pub const VALUE_SIZE: usize = 256;
/// The workload's seed (the reference node's default).
pub const SEED: u64 = 0;

/// What a node is asked to do.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
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

impl NodeSpec {
    pub fn value_kind(&self) -> ValueKind {
        self.kind.parse().expect("a value kind")
    }
}

/// The command of the node of `spec`: the reference node for random values, this test binary
/// for text.
pub fn command(spec: &NodeSpec) -> Command {
    if spec.value_kind() == ValueKind::Random {
        let mut cmd = binary::command("http://unused.invalid");
        cmd.arg("node")
            .arg("--store")
            .arg(&spec.store)
            .args(["--server", &spec.server, "--store-id", &spec.store_id])
            .args(["--commits", "10000000", "--rate", &RATE.to_string()])
            .args(["--value-size", &VALUE_SIZE.to_string()])
            .args(["--seed", &SEED.to_string()])
            .env("MUSHROOMDB_BACKUP_NODE_TOKEN", &spec.token);
        if let Some(log) = &spec.acked_log {
            cmd.args(["--durability", "sync", "--ack-timeout-ms", "20000"])
                .arg("--acked-log")
                .arg(log);
        }
        return cmd;
    }
    let exe = std::env::current_exe().expect("the test binary");
    let mut cmd = Command::new(exe);
    cmd.args(["matrix_node_process", "--exact", "--ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(NODE_ENV, serde_json::to_string(spec).unwrap())
        .env(
            "MUSHROOMDB_BACKUP_LOG",
            std::env::var("MUSHROOMDB_BACKUP_LOG").unwrap_or_default(),
        );
    cmd
}

/// The node of a text cell, run inside the re-executed test binary until it is killed.
pub async fn run_text_node(spec: NodeSpec) {
    let mut config = NodeClientConfig::new(&spec.server, &spec.store_id, &spec.token);
    if spec.acked_log.is_some() {
        // As the reference node in sync mode: a report never waits out the spacing.
        config.min_report_interval = Duration::from_millis(1);
    }
    let client = Arc::new(NodeClient::connect(config).expect("connect the node client"));
    let dir = spec.store.clone();
    let mut engine = tokio::task::spawn_blocking(move || {
        Engine::open(
            &dir,
            EngineOptions {
                rotate_bytes: 0,
                snapshot_every: 0,
                keep_wal_on_snapshot: false,
                group_commit: 0,
            },
        )
    })
    .await
    .unwrap()
    .expect("open the store");
    client.report(engine.position());
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<(u64, i64)>();
    if let Some(log) = spec.acked_log.clone() {
        tokio::spawn(acknowledge(client.clone(), log, rx));
    }
    let kind = spec.value_kind();
    let writer = {
        let client = client.clone();
        tokio::task::spawn_blocking(move || {
            let start = Instant::now();
            for written in 0u64.. {
                let due = start + Duration::from_secs_f64(written as f64 / RATE);
                std::thread::sleep(due.saturating_duration_since(Instant::now()));
                let seq = engine.commit_seq() + 1;
                engine
                    .commit(&workload_ops_of(kind, SEED, seq, VALUE_SIZE))
                    .expect("commit");
                let pos = engine.sync().expect("sync");
                client.report(pos);
                let _ = tx.send((pos.commit_seq, mushroom_backup::units::unix_now_ms()));
            }
        })
    };
    writer.await.unwrap();
}

/// The acked log: waits for each commit in order, appends a line per commit an
/// acknowledgement covers and fsyncs it before waiting for the next.
async fn acknowledge(
    client: Arc<NodeClient>,
    log: PathBuf,
    mut commits: tokio::sync::mpsc::UnboundedReceiver<(u64, i64)>,
) {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .expect("open the acked log");
    let mut pending = std::collections::VecDeque::new();
    loop {
        if pending.is_empty() {
            match commits.recv().await {
                Some(c) => pending.push_back(c),
                None => return,
            }
        }
        let (seq, _) = *pending.front().unwrap();
        let waited = client.wait_durable(seq, Duration::from_secs(20)).await;
        while let Ok(c) = commits.try_recv() {
            pending.push_back(c);
        }
        match waited {
            Ok(ack) => {
                let now = mushroom_backup::units::unix_now_ms();
                let mut lines = String::new();
                while let Some(&(s, at)) = pending.front() {
                    if s > ack.commit_seq {
                        break;
                    }
                    pending.pop_front();
                    lines.push_str(&format!("{s} {at} {now}\n"));
                }
                file = tokio::task::spawn_blocking(move || {
                    file.write_all(lines.as_bytes())
                        .expect("append to the acked log");
                    file.sync_data().expect("fsync the acked log");
                    file
                })
                .await
                .unwrap();
            }
            Err(e) => {
                eprintln!("commit {seq} not acknowledged: {e}");
                pending.pop_front();
            }
        }
    }
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
