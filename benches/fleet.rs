//! The fleet benchmark: 1,000 stores on one `serve` instance, at the default intervals.
//!
//! Untimed set-up: 1,000 small reference-engine stores (20 commits each) under one allowed root.
//! Then the release binary's `serve` starts (port 0, a temporary data dir, SQLite registry),
//! every store is registered over gRPC with its own local-directory destination (bounded
//! concurrency), and the benchmark measures
//!
//! - how long registering takes, and how long until every store reports healthy with all its
//!   commits shipped (target: within 2 minutes of the first Register);
//! - the server's CPU while the fleet idles (utime + stime deltas of `/proc/PID/stat`, as % of
//!   one core; target: under 5 %) and its resident memory (`VmRSS`; target: under 400 MiB);
//! - to tell what the idle CPU is spent on: context switches (wakeups) per second, read and
//!   write syscalls per second, and CPU by thread name;
//! - how long SIGTERM takes (every store flushes a last restore point; target: exit 0 within
//!   3 minutes).
//!
//! Nothing polls the server while it idles. The process exits non-zero when a target is missed.
//!
//! The idle measurement starts `FLEET_SETTLE_SECS` (default 15) after the fleet turned
//! healthy, so that it sees the steady state: every worker renews its bucket lease for the first
//! time a third of a TTL (10 s) after acquiring it, and on the local-directory bucket that first
//! renewal creates the lease's scratch file (`src/bucket/fs/mod.rs`), a one-off cost per store.
//! Set it to 0 to include that round.
//!
//! `cargo bench --bench fleet`; `FLEET_STORES`, `FLEET_COMMITS`, `FLEET_IDLE_SECS` and
//! `FLEET_CONCURRENCY` change the shape (defaults 1000, 20, 60, 16); `MUSHROOM_BACKUP_BIN` runs
//! another binary than this build's (e.g. a copy, when several work trees share one target dir);
//! `FLEET_SERVE_ARGS` adds flags to `serve`, to see what a setting costs (the targets are for
//! the defaults).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use tonic::transport::Channel;

use mushroom_backup::service::proto::backup_control_client::BackupControlClient;
use mushroom_backup::service::proto::{HealthRequest, RegisterRequest};
use mushroom_backup::store::engine::{self, WriteOptions};

#[path = "support/serve.rs"]
mod serve;
use serve::{Server, env_or, memory, sample, syscalls, ticks_by_thread, verdict};

const HEALTHY_WITHIN: Duration = Duration::from_secs(120);
const IDLE_CPU_TARGET_PCT: f64 = 5.0;
const RSS_TARGET_MIB: f64 = 400.0;
/// Every store flushes a last restore point on SIGTERM; a deployment's grace period is finite.
const SHUTDOWN_WITHIN: Duration = Duration::from_secs(180);

struct Shape {
    stores: usize,
    commits: u64,
    idle: Duration,
    /// Waited after the fleet turned healthy, before the idle measurement (see the docs).
    settle: Duration,
    concurrency: usize,
}

fn create_stores(root: &Path, shape: &Shape) -> anyhow::Result<Vec<PathBuf>> {
    let dirs: Vec<PathBuf> = (0..shape.stores)
        .map(|i| root.join(format!("store-{i:04}")))
        .collect();
    std::thread::scope(|s| {
        let workers: Vec<_> = dirs
            .chunks(dirs.len().div_ceil(4).max(1))
            .map(|chunk| {
                s.spawn(move || -> anyhow::Result<()> {
                    for (i, dir) in chunk.iter().enumerate() {
                        let opts = WriteOptions {
                            commits: shape.commits,
                            seed: i as u64,
                            ..WriteOptions::default()
                        };
                        engine::write_commits(dir, &opts)
                            .with_context(|| format!("write {}", dir.display()))?;
                    }
                    Ok(())
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().expect("a writer thread panicked"))
    })?;
    Ok(dirs)
}

async fn register_all(
    client: &BackupControlClient<Channel>,
    dirs: &[PathBuf],
    buckets: &Path,
    concurrency: usize,
) -> anyhow::Result<()> {
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(dirs.iter().enumerate())
        .map(|(i, dir)| {
            let mut client = client.clone();
            let destination = format!("file://{}/store-{i:04}", buckets.display());
            async move {
                client
                    .register(RegisterRequest {
                        store_dir: dir.display().to_string(),
                        destination,
                        ..RegisterRequest::default()
                    })
                    .await
                    .with_context(|| format!("Register {}", dir.display()))?;
                Ok(())
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    results.into_iter().collect()
}

/// Polls Health (every store) until every one is healthy with `commits` durable and shipped.
/// Returns when that first held, or `None` at the deadline (printing what was still missing).
async fn wait_all_healthy(
    client: &BackupControlClient<Channel>,
    stores: usize,
    commits: u64,
    start: Instant,
    deadline: Duration,
) -> anyhow::Result<Option<Duration>> {
    let mut client = client.clone();
    let mut last_print = Instant::now();
    loop {
        let health = client
            .health(HealthRequest::default())
            .await
            .context("Health")?
            .into_inner();
        let done = health
            .stores
            .iter()
            .filter(|h| {
                h.healthy && h.durable_commit_seq == commits && h.shipped_commit_seq == commits
            })
            .count();
        if done == stores && health.stores.len() == stores {
            return Ok(Some(start.elapsed()));
        }
        if start.elapsed() > deadline {
            let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
            for h in health.stores.iter().filter(|h| !h.healthy) {
                *reasons.entry(h.reason.clone()).or_default() += 1;
            }
            println!("  not all healthy: {done}/{stores}; unhealthy by reason: {reasons:?}");
            return Ok(None);
        }
        if last_print.elapsed() > Duration::from_secs(10) {
            println!(
                "  {:>5.1} s: {done}/{stores} healthy with all commits shipped",
                start.elapsed().as_secs_f64()
            );
            last_print = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn bench(shape: Shape) -> anyhow::Result<bool> {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path().join("stores");
    let buckets = tmp.path().join("buckets");
    std::fs::create_dir_all(&root)?;
    std::fs::create_dir_all(&buckets)?;
    let root = std::fs::canonicalize(&root)?;

    let t = Instant::now();
    let dirs = create_stores(&root, &shape)?;
    println!(
        "set-up: {} stores of {} commits written in {:.1} s (not timed)",
        dirs.len(),
        shape.commits,
        t.elapsed().as_secs_f64()
    );

    let log = tmp.path().join("serve.log");
    let extra = std::env::var("FLEET_SERVE_ARGS").unwrap_or_default();
    let mut server = Server::start(&tmp.path().join("data"), &root, &log, &extra)?;
    let pid = server.pid();
    let channel = Channel::from_shared(format!("http://{}", server.addr))?
        .connect()
        .await?;
    let client = BackupControlClient::new(channel).max_decoding_message_size(64 << 20);
    let (rss_empty, _, _) = memory(pid)?;

    let start = Instant::now();
    register_all(&client, &dirs, &buckets, shape.concurrency).await?;
    let registered = start.elapsed();
    println!(
        "registered {} stores in {:.1} s ({:.0}/s, {} at a time)",
        dirs.len(),
        registered.as_secs_f64(),
        dirs.len() as f64 / registered.as_secs_f64(),
        shape.concurrency
    );
    let healthy = wait_all_healthy(
        &client,
        dirs.len(),
        shape.commits,
        start,
        HEALTHY_WITHIN + Duration::from_secs(60),
    )
    .await?;
    let (rss_busy, _, _) = memory(pid)?;

    // Idle: nothing calls the server.
    if !shape.settle.is_zero() {
        println!("settling {} s", shape.settle.as_secs());
        tokio::time::sleep(shape.settle).await;
    }
    println!(
        "idling {} s (serve pid {pid}, for perf or strace)",
        shape.idle.as_secs()
    );
    let (r0, w0) = syscalls(pid);
    let s0 = sample(pid)?;
    let threads0 = ticks_by_thread(pid);
    let t0 = Instant::now();
    tokio::time::sleep(shape.idle).await;
    let secs = t0.elapsed().as_secs_f64();
    let s1 = sample(pid)?;
    let threads1 = ticks_by_thread(pid);
    let (r1, w1) = syscalls(pid);
    let (rss, hwm, threads) = memory(pid)?;
    let cpu_pct = serve::cpu_pct(&s0, &s1, secs);

    let healthy_ok = healthy.is_some_and(|d| d <= HEALTHY_WITHIN);
    let cpu_ok = cpu_pct < IDLE_CPU_TARGET_PCT;
    let rss_ok = rss < RSS_TARGET_MIB;
    println!();
    if extra.trim().is_empty() {
        println!("fleet of {} stores, default intervals:", dirs.len());
    } else {
        println!(
            "fleet of {} stores, serve {extra} (targets are for the defaults):",
            dirs.len()
        );
    }
    println!(
        "  registration           {:>8.1} s",
        registered.as_secs_f64()
    );
    match healthy {
        Some(d) => println!(
            "  all healthy + shipped  {:>8.1} s   target < {} s    {}",
            d.as_secs_f64(),
            HEALTHY_WITHIN.as_secs(),
            verdict(healthy_ok)
        ),
        None => println!(
            "  all healthy + shipped     never   target < {} s    {}",
            HEALTHY_WITHIN.as_secs(),
            verdict(false)
        ),
    }
    println!(
        "  idle CPU ({:.0} s)       {:>8.2} % of one core   target < {IDLE_CPU_TARGET_PCT} %   {}",
        secs,
        cpu_pct,
        verdict(cpu_ok)
    );
    println!(
        "  resident memory        {:>8.1} MiB   target < {RSS_TARGET_MIB} MiB   {}",
        rss,
        verdict(rss_ok)
    );
    println!(
        "    (empty server {rss_empty:.1} MiB, after catch-up {rss_busy:.1} MiB, peak {hwm:.1} MiB, {threads} threads)"
    );
    println!(
        "  idle wakeups           {:>8.0} context switches/s",
        (s1.ctx_switches - s0.ctx_switches) as f64 / secs
    );
    println!(
        "  idle syscalls          {:>8.0} reads/s, {:.0} writes/s",
        (r1 - r0) as f64 / secs,
        (w1 - w0) as f64 / secs
    );
    println!("  idle CPU by thread name:");
    serve::print_cpu_by_thread(&threads0, &threads1, secs);

    // A graceful shutdown waits for open connections: close ours first, as a client would.
    drop(client);
    let stopped = server.stop(SHUTDOWN_WITHIN).await?;
    let shutdown_ok = stopped.is_some_and(|(status, _)| status.success());
    match stopped {
        Some((status, took)) => println!(
            "  shutdown (SIGTERM)     {:>8.1} s, {status}   target: exit 0 within {} s   {}",
            took.as_secs_f64(),
            SHUTDOWN_WITHIN.as_secs(),
            verdict(shutdown_ok)
        ),
        None => println!(
            "  shutdown (SIGTERM)     still running after {} s   target: exit 0   {}",
            SHUTDOWN_WITHIN.as_secs(),
            verdict(false)
        ),
    }
    if !shutdown_ok {
        println!("  the last 20 lines of serve's log:");
        for l in serve::log_tail(&log, 20) {
            println!("    {l}");
        }
    }
    Ok(healthy_ok && cpu_ok && rss_ok && shutdown_ok)
}

fn main() -> ExitCode {
    let shape = || -> anyhow::Result<Shape> {
        Ok(Shape {
            stores: env_or("FLEET_STORES", 1000)?,
            commits: env_or("FLEET_COMMITS", 20)?,
            idle: Duration::from_secs(env_or("FLEET_IDLE_SECS", 60)?),
            settle: Duration::from_secs(env_or("FLEET_SETTLE_SECS", 15)?),
            concurrency: env_or("FLEET_CONCURRENCY", 16)?,
        })
    };
    let run = || -> anyhow::Result<bool> {
        let shape = shape()?;
        // One thread: the client should cost the 2-core machine as little as possible.
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(bench(shape))
    };
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            println!("fleet: a target was missed (above)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("fleet: {e:#}");
            ExitCode::FAILURE
        }
    }
}
