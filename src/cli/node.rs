//! `node`: the demo database node. Runs the reference engine in-process on a store directory,
//! appends the same deterministic commits as `store write`, syncing each, and reports every
//! synced position to the service through [`NodeClient`]. It answers `Refresh` by reporting
//! its current position again, and exits 0 once its last commit has been reported, printing
//! `{"commit_seq", "digest", "written", "stopped"}`. SIGTERM or SIGINT stop it after the
//! commit in progress (still reported, still exit 0, `"stopped": true`).
//!
//! With `--durability sync` it also holds each commit's acknowledgement until the service
//! says the commit is in the bucket (`node_ack.rs`), and reports at most 1 ms apart (not the
//! client's default 10 ms, which would be added to acks): `--acked-log FILE` gets one line per
//! acknowledged commit, `commit_seq commit_unix_ms ack_unix_ms`, written and fsynced before
//! the next acknowledgement, so a SIGKILL never leaves a line for a commit that was not
//! acknowledged. The output then adds `"acknowledged"` and `"unacknowledged"` (waits that
//! failed: the stream broke, the service lost its lease, or the wait timed out).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;

use mushroom_backup::node_client::{NodeClient, NodeClientConfig};
use mushroom_backup::store::engine::{Engine, EngineOptions, ValueKind, workload_ops_of};
use mushroom_backup::store::format::WalPosition;

#[derive(Args)]
pub struct NodeArgs {
    /// The store directory (created if missing).
    #[arg(long)]
    store: PathBuf,
    /// The service: http://host:port or https://host:port.
    #[arg(long, env = "MUSHROOMDB_BACKUP_SERVER")]
    server: String,
    /// The store id Register (or Adopt) returned.
    #[arg(long)]
    store_id: String,
    /// The node token Register (or Adopt) returned (prefer the variable: argv is public).
    #[arg(long, env = "MUSHROOMDB_BACKUP_NODE_TOKEN", hide_env_values = true)]
    token: String,
    #[command(flatten)]
    tls: super::client_tls::ClientTlsArgs,
    /// Commits to append.
    #[arg(long, default_value_t = 1000)]
    commits: u64,
    /// Commits per second; as fast as possible when absent (each is synced on its own anyway).
    #[arg(long)]
    rate: Option<f64>,
    /// Seed of the deterministic workload (the same as `store write --seed`).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Bytes of each value.
    #[arg(long, default_value_t = 64)]
    value_size: usize,
    /// What values hold: `random` bytes (incompressible) or `text` rows from a fixed
    /// vocabulary (compress at least 3:1 with zstd), as `store write --value-kind`.
    #[arg(long, default_value = "random")]
    value_kind: ValueKind,
    /// Snapshot every K commits (0: never).
    #[arg(long, default_value_t = 0)]
    snapshot_every: u64,
    /// Rotate wal.bin past this many bytes (0: never).
    #[arg(long, default_value_t = 0)]
    rotate_bytes: u64,
    /// How long to wait, at the end, for the last position to reach the service, in ms.
    #[arg(long, default_value_t = 30_000)]
    flush_timeout_ms: u64,
    /// `sync`: acknowledge a commit only once the service says it is in the bucket (register
    /// the store with `--durability sync` too, or acknowledgements wait for `wal_interval`).
    #[arg(long, value_parser = ["async", "sync"], default_value = "async")]
    durability: String,
    /// With `--durability sync`: append `commit_seq commit_unix_ms ack_unix_ms` per
    /// acknowledged commit to this file (fsynced before the next).
    #[arg(long)]
    acked_log: Option<PathBuf>,
    /// With `--durability sync`: how long one commit may wait for its acknowledgement, in ms
    /// (1 to 3600000).
    #[arg(long, default_value_t = 30_000)]
    ack_timeout_ms: u64,
}

/// The node client's report spacing with `--durability sync`: what the durable bench measured
/// an ack at 100 commits/s within about two PUTs with (p99 10.5 ms against 22–30 ms at the
/// default 10 ms), at the cost of a report per commit up to a thousand a second. The node
/// client now skips the spacing on its own while the acker's `wait_durable` is pending (p99
/// 10.5–14.3 ms at the default); this still covers the moment between two waits.
const SYNC_MIN_REPORT_INTERVAL: Duration = Duration::from_millis(1);

pub async fn run(a: NodeArgs) -> anyhow::Result<ExitCode> {
    check_args(&a)?;
    let sync = a.durability == "sync";
    let client = connect(&a, sync)?;
    let engine = open_engine(&a).await?;
    // The opening position is durable (recovery fsyncs): report it before the first commit.
    client.report(engine.position());

    // Refresh: our state is always the engine's own, so report the newest durable position
    // again (the handle reads it without touching the engine). `reporting` orders that read
    // and report against the writer's: a refresh never reports a position older than one the
    // writer reported just before.
    let reporting = Arc::new(std::sync::Mutex::new(()));
    let handle = engine.position_handle();
    let mut refresh = client.refresh_requests();
    let tasks = tokio_util::task::TaskTracker::new();
    let refresher = {
        let client = client.clone();
        let reporting = reporting.clone();
        tasks.spawn(async move {
            while let Ok(r) = refresh.recv().await {
                tracing::info!(reason = %r.reason, "refresh requested: reporting again");
                let _order = reporting.lock().unwrap_or_else(|p| p.into_inner());
                client.report(handle.get());
            }
        })
    };

    let stop = super::shutdown_flag();
    let (acks, acker) = if sync {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let acker = super::node_ack::Acker::open(
            client.clone(),
            a.acked_log.as_deref(),
            Duration::from_millis(a.ack_timeout_ms),
        )?;
        (Some(tx), Some(tasks.spawn(acker.run(rx))))
    } else {
        (None, None)
    };
    let writer = {
        let client = client.clone();
        let stop = stop.clone();
        let (commits, rate) = (a.commits, a.rate);
        let workload = Workload {
            seed: a.seed,
            value_size: a.value_size,
            kind: a.value_kind,
        };
        let report = move |pos: WalPosition| {
            let _order = reporting.lock().unwrap_or_else(|p| p.into_inner());
            client.report(pos);
            // Waited for in commit order by the acker.
            if let Some(acks) = &acks {
                let _ = acks.send((pos.commit_seq, mushroom_backup::units::unix_now_ms()));
            }
        };
        tokio::task::spawn_blocking(move || write(engine, &report, &stop, commits, rate, workload))
    };
    let outcome = writer.await.context("the writer task failed")?;
    let (engine, written) = outcome.context("writing commits")?;
    // Every commit's wait ends (acknowledged or failed) before the stream closes.
    let acked = match acker {
        Some(acker) => Some(acker.await.context("the acknowledging task failed")??),
        None => None,
    };
    let timeout = Duration::from_millis(a.flush_timeout_ms);
    let flushed = client.flush(timeout).await;
    client.close().await;
    refresher.abort();
    tasks.close();
    tasks.wait().await;
    flushed.context("reporting the last position to the service")?;
    let digest = engine.digest();
    let mut out = serde_json::json!({
        "commit_seq": digest.commit_seq,
        "digest": digest.digest,
        "written": written,
        "stopped": stop.load(Ordering::SeqCst),
    });
    if let Some(acked) = acked {
        out["acknowledged"] = acked.acknowledged.into();
        out["unacknowledged"] = acked.unacknowledged.into();
    }
    super::out::line(out)?;
    Ok(ExitCode::SUCCESS)
}

/// Refuses flags that cannot work together or are out of range.
fn check_args(a: &NodeArgs) -> anyhow::Result<()> {
    if let Some(rate) = a.rate
        && !(rate.is_finite() && rate > 0.0)
    {
        anyhow::bail!("--rate {rate} must be a positive number of commits per second");
    }
    if a.acked_log.is_some() && a.durability != "sync" {
        anyhow::bail!("--acked-log needs --durability sync: only then are commits acknowledged");
    }
    if !(1..=3_600_000).contains(&a.ack_timeout_ms) {
        anyhow::bail!(
            "--ack-timeout-ms {} is out of range: it must be from 1 to 3600000",
            a.ack_timeout_ms
        );
    }
    Ok(())
}

/// The node client to the service, with its TLS material; with `sync`, reports spaced as
/// little as [`SYNC_MIN_REPORT_INTERVAL`].
fn connect(a: &NodeArgs, sync: bool) -> anyhow::Result<Arc<NodeClient>> {
    let mut config = NodeClientConfig::new(a.server.clone(), a.store_id.clone(), a.token.clone());
    let pem = a.tls.read()?;
    config.tls_ca_pem = pem.ca;
    config.tls_client_identity_pem = pem.identity;
    if sync {
        // Every commit waits for its report to reach the service: the default spacing (10 ms)
        // would add up to that to each ack (`benches/durable.rs`, `MIN_REPORT_MS`).
        config.min_report_interval = SYNC_MIN_REPORT_INTERVAL;
    }
    Ok(Arc::new(NodeClient::connect(config)?))
}

/// Opens (and recovers) the store the node writes, on the blocking pool.
async fn open_engine(a: &NodeArgs) -> anyhow::Result<Engine> {
    let dir = a.store.clone();
    let opts = EngineOptions {
        rotate_bytes: a.rotate_bytes,
        snapshot_every: a.snapshot_every,
        keep_wal_on_snapshot: false,
        group_commit: 0,
    };
    tokio::task::spawn_blocking(move || Engine::open(&dir, opts))
        .await
        .context("the engine task failed")?
        .with_context(|| format!("open the store {}", a.store.display()))
}

/// What each commit holds: the deterministic workload of `seed` (as `store write`).
#[derive(Clone, Copy)]
struct Workload {
    seed: u64,
    value_size: usize,
    kind: ValueKind,
}

/// Appends the commits, syncing and reporting each; returns the engine (still open, so the
/// digest below is of what was reported) and how many commits were written.
fn write(
    mut engine: Engine,
    report: &dyn Fn(WalPosition),
    stop: &AtomicBool,
    commits: u64,
    rate: Option<f64>,
    w: Workload,
) -> anyhow::Result<(Engine, u64)> {
    let start = Instant::now();
    let mut written = 0u64;
    while written < commits && !stop.load(Ordering::SeqCst) {
        if let Some(rate) = rate {
            let due = start + Duration::from_secs_f64(written as f64 / rate);
            if !sleep_until(due, stop) {
                break;
            }
        }
        let seq = engine.commit_seq() + 1;
        engine.commit(&workload_ops_of(w.kind, w.seed, seq, w.value_size))?;
        report(engine.sync()?);
        written += 1;
    }
    Ok((engine, written))
}

/// Sleeps until `due` in short steps; `false` if `stop` was set first.
fn sleep_until(due: Instant, stop: &AtomicBool) -> bool {
    loop {
        if stop.load(Ordering::SeqCst) {
            return false;
        }
        let now = Instant::now();
        if now >= due {
            return true;
        }
        std::thread::sleep((due - now).min(Duration::from_millis(20)));
    }
}
