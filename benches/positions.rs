//! The position path at fleet scale: `NODES` database nodes streaming their durable WAL
//! positions (`ReportPosition`) to one `serve` instance, `RATE` commits (and reports) a second
//! each.
//!
//! Untimed set-up: `NODES` + 1 small reference-engine stores (10 commits each) under one allowed
//! root, the release binary's `serve` on port 0 (temporary data dir, SQLite registry,
//! `--wal-interval-ms POSBENCH_WAL_INTERVAL_MS`), every store registered over gRPC with its own
//! local-directory destination, and a wait until every store is healthy with its commits
//! shipped. Then this process opens every store with the reference engine (it holds
//! `store.lock`, as a database node does) and connects one [`NodeClient`] per store (real gRPC
//! over TCP, one connection each). `POSBENCH_THREADS` threads drive the engines: each node
//! commits, fsyncs and reports its position `RATE` times a second, the nodes' phases spread
//! evenly over the period. The positions are the engine's own, so the service confirms every
//! one against the files (`src/wal_source/proof.rs`) before it ships anything.
//!
//! After `POSBENCH_WARMUP_SECS` (default 5) the benchmark measures, for `SECS`:
//!
//! - the service's CPU (utime + stime of `/proc/PID/stat`, as % of one core; also per report,
//!   and by thread name) and its resident memory (`VmRSS`, the highest of one-second samples);
//! - the report-to-ship latency of `POSBENCH_SAMPLE` (default 20) stores spread over the fleet:
//!   from the moment `NodeClient::report` returned for a commit (after its fsync) until a
//!   segment covering its `durable_len` is in the store's bucket (a thread lists each sampled
//!   destination's `gen/<newest>/wal/` every `POSBENCH_POLL_MS`, default 10; the local-directory
//!   bucket renames an object into place whole, so a listed segment is in the bucket). p50,
//!   p99 and max of every commit reported inside the window; target p99 ≤ 2 × wal_interval
//!   (a tick every wal_interval ships what is durable, plus the PUT).
//!
//! Then the fleet stops committing (its streams stay open) and the **node-side overhead** is
//! measured on the extra store: the reference engine committing as fast as it can, each commit
//! fsynced, with `NodeClient::report` after every sync or without it, in
//! `POSBENCH_OVERHEAD_ROUNDS` (default 50) pairs of `POSBENCH_OVERHEAD_ROUND_MS` (default 200)
//! windows, the order turning each pair, after an untimed warm-up of each. The client stays
//! connected throughout: "without" is the engine alone with an idle client, "with" adds the
//! report, the client's task sending it, and the server's reading of it. Printed: the
//! throughput lost (overall, and the mean of the pairs with its 95 % interval; target under
//! 1 %, judged on the overall figure, "unclear" when it misses but the interval reaches below
//! 1 %), and the CPU per commit of this process and of the committing thread with and without
//! (getrusage), which the disk's noise does not blur.
//!
//! Last, every client closes (its stream read to its end) and `serve` gets SIGTERM.
//!
//! `cargo bench --bench positions`; `NODES`, `RATE`, `SECS` (defaults 1000, 10, 30) give the
//! shape (`NODES=50` for a quick run). `POSBENCH_DIR` puts the stores and buckets in that
//! directory instead of the system's temporary one (e.g. `/dev/shm` to take the disk's fsyncs
//! out); `POSBENCH_SERVE_ARGS` adds flags to `serve`; `MUSHROOM_BACKUP_BIN` runs another
//! binary than this build's; `POSBENCH_MIN_REPORT_INTERVAL_MS` sets the clients'
//! `min_report_interval` (0: every report sent on its own, as before it existed). The process
//! exits non-zero when a target is missed.

//!
//! # What it showed (docs/testing.md has the figures)
//!
//! - On the ext4 disk the fleet cannot run at all as asked: the nodes' fdatasyncs (one per
//!   commit, `POSBENCH_THREADS` at a time) and the `file://` bucket's fsyncs (file and
//!   directory, per segment PUT) share one virtual disk, the nodes reach a quarter of the
//!   10,000 commits a second and shipping lags seconds. On tmpfs the service keeps up with all
//!   10,000 reports a second at 0.7 of a core; the report-to-ship tail (p99 about 3 × the
//!   wal_interval) then most likely comes from the worker, not the position path (not
//!   profiled yet): every worker ticks on the process's one tick grid (`pacing::coalesce`),
//!   so the 1,000 steps and segment PUTs of a second start together and the last of the burst
//!   waits for the others.
//! - The node-side cost was a wake-up and a write per report; `min_report_interval` (10 ms,
//!   `src/node_client.rs`) took it from +84 to +6 µs of CPU per commit at 3,000 commits/s.
//!   Throughput with and without reporting differs by less than this VM's disk noise.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use tonic::transport::Channel;

use mushroom_backup::manifest;
use mushroom_backup::node_client::{
    ConnectionState, DEFAULT_MIN_REPORT_INTERVAL, NodeClient, NodeClientConfig,
};
use mushroom_backup::service::proto::backup_control_client::BackupControlClient;
use mushroom_backup::service::proto::{HealthRequest, RegisterRequest};
use mushroom_backup::store::engine::{Engine, EngineOptions, workload_ops};

#[path = "support/serve.rs"]
mod serve;
use serve::{Server, append_commits, env_or, verdict};

const SETUP_COMMITS: u64 = 10;
const VALUE_SIZE: usize = 64;
const OVERHEAD_TARGET_PCT: f64 = 1.0;
const HEALTHY_WITHIN: Duration = Duration::from_secs(180);
const SHUTDOWN_WITHIN: Duration = Duration::from_secs(180);

struct Shape {
    nodes: usize,
    rate: f64,
    secs: u64,
    warmup: Duration,
    wal_interval: Duration,
    sample: usize,
    poll: Duration,
    threads: usize,
    concurrency: usize,
    overhead_rounds: usize,
    overhead_round: Duration,
    /// The clients' `min_report_interval`.
    min_report_interval: Duration,
    dir: Option<PathBuf>,
}

impl Shape {
    fn from_env() -> anyhow::Result<Shape> {
        let shape = Shape {
            nodes: env_or("NODES", 1000)?,
            rate: env_or("RATE", 10.0)?,
            secs: env_or("SECS", 30)?,
            warmup: Duration::from_secs(env_or("POSBENCH_WARMUP_SECS", 5)?),
            wal_interval: Duration::from_millis(env_or("POSBENCH_WAL_INTERVAL_MS", 1000)?),
            sample: env_or("POSBENCH_SAMPLE", 20)?,
            poll: Duration::from_millis(env_or("POSBENCH_POLL_MS", 10)?),
            threads: env_or("POSBENCH_THREADS", 8)?,
            concurrency: env_or("POSBENCH_CONCURRENCY", 16)?,
            overhead_rounds: env_or("POSBENCH_OVERHEAD_ROUNDS", 50)?,
            overhead_round: Duration::from_millis(env_or("POSBENCH_OVERHEAD_ROUND_MS", 200)?),
            min_report_interval: Duration::from_millis(env_or(
                "POSBENCH_MIN_REPORT_INTERVAL_MS",
                DEFAULT_MIN_REPORT_INTERVAL.as_millis() as u64,
            )?),
            dir: std::env::var_os("POSBENCH_DIR").map(PathBuf::from),
        };
        anyhow::ensure!(shape.nodes > 0, "NODES must be at least 1");
        anyhow::ensure!(
            shape.rate.is_finite() && shape.rate > 0.0,
            "RATE must be a positive number of reports a second"
        );
        anyhow::ensure!(shape.secs > 0, "SECS must be at least 1");
        anyhow::ensure!(shape.threads > 0, "POSBENCH_THREADS must be at least 1");
        anyhow::ensure!(
            shape.concurrency > 0,
            "POSBENCH_CONCURRENCY must be at least 1"
        );
        anyhow::ensure!(
            shape.overhead_rounds > 0,
            "POSBENCH_OVERHEAD_ROUNDS must be at least 1"
        );
        Ok(shape)
    }
}

/// A sampled store: the commits its node reported that are not yet seen shipped, and the
/// latencies of those that were.
struct Probe {
    /// The store's local-directory destination.
    bucket: PathBuf,
    /// `(durable_len, reported at, inside the measured window)`, oldest first.
    pending: Mutex<VecDeque<(u64, Instant, bool)>>,
    latencies: Mutex<Vec<Duration>>,
}

impl Probe {
    /// The highest end of a segment in the store's newest generation (0: none yet).
    fn shipped_end(&self) -> u64 {
        let Ok(gens) = std::fs::read_dir(self.bucket.join("gen")) else {
            return 0;
        };
        let newest = gens
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u64>().ok())
            .max();
        let Some(generation) = newest else {
            return 0;
        };
        let prefix = manifest::segments_prefix(generation);
        let Ok(segments) = std::fs::read_dir(self.bucket.join(&prefix)) else {
            return 0;
        };
        segments
            .flatten()
            .filter_map(|e| {
                let name = e.file_name();
                let key = format!("{prefix}{}", name.to_str()?);
                manifest::parse_segment_key(generation, &key).map(|(_, end)| end)
            })
            .max()
            .unwrap_or(0)
    }

    /// Pops every pending commit the bucket now holds; `true` if an in-window one is left.
    fn settle(&self) -> bool {
        let end = self.shipped_end();
        let now = Instant::now();
        let mut pending = self.pending.lock().expect("not poisoned");
        let mut latencies = self.latencies.lock().expect("not poisoned");
        while let Some(&(len, at, in_window)) = pending.front() {
            if len > end {
                break;
            }
            pending.pop_front();
            if in_window {
                latencies.push(now.saturating_duration_since(at));
            }
        }
        pending.iter().any(|p| p.2)
    }
}

/// What the driving threads share with the rest.
#[derive(Default)]
struct Control {
    stop: AtomicBool,
    measuring: AtomicBool,
    /// Commits made (each synced and reported).
    commits: AtomicU64,
    /// Commits due that were skipped because the node fell a whole period behind.
    skipped: AtomicU64,
}

/// One database node: its engine and its position reporter.
struct Node {
    engine: Engine,
    client: Arc<NodeClient>,
    seed: u64,
    probe: Option<Arc<Probe>>,
}

impl Node {
    /// One commit, fsynced, then reported.
    fn commit(&mut self, measuring: bool) -> anyhow::Result<()> {
        let seq = self.engine.commit_seq() + 1;
        self.engine
            .commit(&workload_ops(self.seed, seq, VALUE_SIZE))?;
        let pos = self.engine.sync()?;
        self.client.report(pos);
        if let Some(p) = &self.probe {
            p.pending.lock().expect("not poisoned").push_back((
                pos.durable_len,
                Instant::now(),
                measuring,
            ));
        }
        Ok(())
    }
}

/// Commits on every node of `nodes` once per `period`, node `first + i` at phase
/// `(first + i) / total` of it, until `control.stop`.
fn drive(
    nodes: &mut [Node],
    first: usize,
    total: usize,
    period: Duration,
    start: Instant,
    control: &Control,
) -> anyhow::Result<()> {
    let mut due: Vec<Instant> = (0..nodes.len())
        .map(|i| start + period.mul_f64((first + i) as f64 / total as f64))
        .collect();
    while !control.stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        let next = *due.iter().min().expect("a thread has nodes");
        if next > now {
            std::thread::sleep((next - now).min(Duration::from_millis(50)));
            continue;
        }
        let measuring = control.measuring.load(Ordering::Relaxed);
        for (node, due) in nodes.iter_mut().zip(due.iter_mut()) {
            if *due > now {
                continue;
            }
            node.commit(measuring)?;
            control.commits.fetch_add(1, Ordering::Relaxed);
            *due += period;
            let late = now.saturating_duration_since(*due);
            if late >= period {
                let skip = (late.as_secs_f64() / period.as_secs_f64()) as u32;
                control
                    .skipped
                    .fetch_add(u64::from(skip), Ordering::Relaxed);
                *due += period * skip;
            }
        }
    }
    Ok(())
}

/// Lists the sampled buckets every `poll` until `stop` (and nothing in-window is pending).
fn watch_probes(probes: &[Arc<Probe>], poll: Duration, stop: &AtomicBool) {
    loop {
        let mut left = false;
        for p in probes {
            left |= p.settle();
        }
        if stop.load(Ordering::Relaxed) && !left {
            return;
        }
        std::thread::sleep(poll);
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn create_stores(root: &Path, count: usize) -> anyhow::Result<Vec<PathBuf>> {
    let dirs: Vec<PathBuf> = (0..count)
        .map(|i| root.join(format!("store-{i:04}")))
        .collect();
    append_commits(&dirs, SETUP_COMMITS)?;
    Ok(dirs)
}

/// Registers every store (in order): the store ids and node tokens.
async fn register_all(
    client: &BackupControlClient<Channel>,
    dirs: &[PathBuf],
    buckets: &Path,
    concurrency: usize,
) -> anyhow::Result<Vec<(String, String)>> {
    let results: Vec<anyhow::Result<(String, String)>> =
        futures::stream::iter(dirs.iter().enumerate())
            .map(|(i, dir)| {
                let mut client = client.clone();
                let destination = format!("file://{}/store-{i:04}", buckets.display());
                async move {
                    let r = client
                        .register(RegisterRequest {
                            store_dir: dir.display().to_string(),
                            destination,
                            ..RegisterRequest::default()
                        })
                        .await
                        .with_context(|| format!("Register {}", dir.display()))?
                        .into_inner();
                    Ok((r.store_id, r.node_token))
                }
            })
            .buffered(concurrency)
            .collect()
            .await;
    results.into_iter().collect()
}

/// Polls Health until every store is healthy with its set-up commits shipped.
async fn wait_all_healthy(
    client: &BackupControlClient<Channel>,
    stores: usize,
) -> anyhow::Result<Duration> {
    let mut client = client.clone();
    let start = Instant::now();
    loop {
        let health = client
            .health(HealthRequest::default())
            .await
            .context("Health")?
            .into_inner();
        let done = health
            .stores
            .iter()
            .filter(|h| h.healthy && h.shipped_commit_seq == SETUP_COMMITS)
            .count();
        if done == stores {
            return Ok(start.elapsed());
        }
        anyhow::ensure!(
            start.elapsed() < HEALTHY_WITHIN,
            "only {done}/{stores} stores healthy with their commits shipped after {} s",
            HEALTHY_WITHIN.as_secs()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Opens every store with the reference engine (each commit synced on its own).
fn open_engines(dirs: &[PathBuf]) -> anyhow::Result<Vec<Engine>> {
    let opts = EngineOptions {
        group_commit: 0,
        ..EngineOptions::default()
    };
    std::thread::scope(|s| {
        let workers: Vec<_> = dirs
            .chunks(dirs.len().div_ceil(4).max(1))
            .map(|chunk| {
                s.spawn(move || -> anyhow::Result<Vec<Engine>> {
                    chunk
                        .iter()
                        .map(|d| {
                            Engine::open(d, opts).with_context(|| format!("open {}", d.display()))
                        })
                        .collect()
                })
            })
            .collect();
        let mut out = Vec::with_capacity(dirs.len());
        for w in workers {
            out.extend(w.join().expect("an opening thread panicked")?);
        }
        Ok(out)
    })
}

/// CPU time (user + system) of this process (`RUSAGE_SELF`) or this thread (`RUSAGE_THREAD`).
fn cpu_time(who: libc::c_int) -> Duration {
    // SAFETY: getrusage writes into the struct we own; it has no other preconditions.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(who, &mut u) };
    let t = |tv: libc::timeval| Duration::new(tv.tv_sec as u64, tv.tv_usec as u32 * 1000);
    t(u.ru_utime) + t(u.ru_stime)
}

/// One overhead window: the commits made in it and the CPU they took.
#[derive(Debug, Default, Clone, Copy)]
struct Window {
    commits: u64,
    secs: f64,
    /// The committing thread's CPU.
    thread_cpu: Duration,
    /// The whole process's CPU (the client's task and its connection included).
    process_cpu: Duration,
}

impl std::ops::AddAssign for Window {
    fn add_assign(&mut self, o: Window) {
        self.commits += o.commits;
        self.secs += o.secs;
        self.thread_cpu += o.thread_cpu;
        self.process_cpu += o.process_cpu;
    }
}

impl Window {
    fn rate(&self) -> f64 {
        self.commits as f64 / self.secs.max(1e-9)
    }

    fn us_per_commit(cpu: Duration, commits: u64) -> f64 {
        cpu.as_secs_f64() * 1e6 / commits.max(1) as f64
    }
}

/// Commits for `window` as fast as the engine goes, reporting each when `report`.
fn commits_for(node: &mut Node, report: bool, window: Duration) -> anyhow::Result<Window> {
    let (process0, thread0) = (cpu_time(libc::RUSAGE_SELF), cpu_time(libc::RUSAGE_THREAD));
    let start = Instant::now();
    let until = start + window;
    let mut commits = 0;
    while Instant::now() < until {
        let seq = node.engine.commit_seq() + 1;
        node.engine
            .commit(&workload_ops(node.seed, seq, VALUE_SIZE))?;
        let pos = node.engine.sync()?;
        if report {
            node.client.report(pos);
        }
        commits += 1;
    }
    Ok(Window {
        commits,
        secs: start.elapsed().as_secs_f64(),
        thread_cpu: cpu_time(libc::RUSAGE_THREAD) - thread0,
        process_cpu: cpu_time(libc::RUSAGE_SELF) - process0,
    })
}

/// `rounds` pairs of windows with and without reporting, the order turning each pair (after
/// an untimed warm-up of each), as `(with, without)`.
fn overhead(
    node: &mut Node,
    rounds: usize,
    round: Duration,
) -> anyhow::Result<Vec<(Window, Window)>> {
    commits_for(node, true, round)?;
    commits_for(node, false, round)?;
    let mut out = Vec::with_capacity(rounds);
    for r in 0..rounds {
        out.push(if r % 2 == 0 {
            let with = commits_for(node, true, round)?;
            (with, commits_for(node, false, round)?)
        } else {
            let without = commits_for(node, false, round)?;
            (commits_for(node, true, round)?, without)
        });
    }
    Ok(out)
}

/// Mean and half-width of a 95 % confidence interval (normal approximation).
fn mean_ci(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    if xs.len() < 2 {
        return (mean, f64::INFINITY);
    }
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, 1.96 * (var / n).sqrt())
}

async fn bench(shape: Shape) -> anyhow::Result<bool> {
    let tmp = match &shape.dir {
        Some(d) => tempfile::tempdir_in(d)?,
        None => tempfile::tempdir()?,
    };
    let root = tmp.path().join("stores");
    let buckets = tmp.path().join("buckets");
    std::fs::create_dir_all(&root)?;
    std::fs::create_dir_all(&buckets)?;
    let root = std::fs::canonicalize(&root)?;
    let buckets = std::fs::canonicalize(&buckets)?;

    // The fleet's stores, and one more for the overhead measurement (registered too, so its
    // reports are real ones the server reads and checks).
    let t = Instant::now();
    let dirs = create_stores(&root, shape.nodes + 1)?;
    println!(
        "set-up: {} stores of {SETUP_COMMITS} commits written in {:.1} s (not timed)",
        dirs.len(),
        t.elapsed().as_secs_f64()
    );

    let log = tmp.path().join("serve.log");
    let extra = format!(
        "--wal-interval-ms {} {}",
        shape.wal_interval.as_millis(),
        std::env::var("POSBENCH_SERVE_ARGS").unwrap_or_default()
    );
    let mut server = Server::start(&tmp.path().join("data"), &root, &log, &extra)?;
    let pid = server.pid();
    let addr = format!("http://{}", server.addr);
    let channel = Channel::from_shared(addr.clone())?.connect().await?;
    let control_client = BackupControlClient::new(channel).max_decoding_message_size(64 << 20);

    let t = Instant::now();
    let ids = register_all(&control_client, &dirs, &buckets, shape.concurrency).await?;
    let healthy = wait_all_healthy(&control_client, dirs.len()).await?;
    println!(
        "registered {} stores in {:.1} s; all healthy with their commits shipped {:.1} s later",
        ids.len(),
        t.elapsed().as_secs_f64() - healthy.as_secs_f64(),
        healthy.as_secs_f64()
    );

    let t = Instant::now();
    let engines = {
        let dirs = dirs.clone();
        tokio::task::spawn_blocking(move || open_engines(&dirs)).await??
    };
    // Sampled stores, spread evenly over the fleet.
    let sample = shape.sample.min(shape.nodes);
    let sampled = |i: usize| sample > 0 && i.is_multiple_of(shape.nodes.div_ceil(sample));
    let mut nodes = Vec::with_capacity(engines.len());
    let mut probes = Vec::new();
    for (i, (engine, (store_id, token))) in engines.into_iter().zip(&ids).enumerate() {
        let mut config = NodeClientConfig::new(addr.clone(), store_id.clone(), token.clone());
        config.min_report_interval = shape.min_report_interval;
        let client = Arc::new(NodeClient::connect(config)?);
        // The opening position is durable (recovery fsyncs): reported first, as a node does.
        client.report(engine.position());
        let probe = (i < shape.nodes && sampled(i)).then(|| {
            Arc::new(Probe {
                bucket: buckets.join(format!("store-{i:04}")),
                pending: Mutex::new(VecDeque::new()),
                latencies: Mutex::new(Vec::new()),
            })
        });
        probes.extend(probe.clone());
        nodes.push(Node {
            engine,
            client,
            seed: i as u64,
            probe,
        });
    }
    let connected: Vec<_> = futures::future::join_all(
        nodes
            .iter()
            .map(|n| n.client.wait_connected(Duration::from_secs(60))),
    )
    .await;
    let refused = connected.iter().filter(|r| r.is_err()).count();
    anyhow::ensure!(
        refused == 0,
        "{refused} node clients did not connect; first: {:?}",
        connected.iter().find_map(|r| r.as_ref().err())
    );
    println!(
        "{} engines opened and their clients connected in {:.1} s",
        nodes.len(),
        t.elapsed().as_secs_f64()
    );
    let mut overhead_node = nodes.pop().expect("the extra store");
    let clients: Vec<Arc<NodeClient>> = nodes.iter().map(|n| n.client.clone()).collect();

    // The fleet reports.
    let control = Arc::new(Control::default());
    let watcher_stop = Arc::new(AtomicBool::new(false));
    let period = Duration::from_secs_f64(1.0 / shape.rate);
    let drive_start = Instant::now();
    let per_thread = nodes.len().div_ceil(shape.threads);
    let total = nodes.len();
    let mut drivers = Vec::new();
    let mut first = 0;
    while !nodes.is_empty() {
        let mut mine: Vec<Node> = nodes.drain(..per_thread.min(nodes.len())).collect();
        let control = control.clone();
        let at = first;
        first += mine.len();
        drivers.push(std::thread::spawn(move || -> anyhow::Result<Vec<Node>> {
            drive(&mut mine, at, total, period, drive_start, &control)?;
            Ok(mine)
        }));
    }
    let watcher = {
        let probes = probes.clone();
        let stop = watcher_stop.clone();
        let poll = shape.poll;
        std::thread::spawn(move || watch_probes(&probes, poll, &stop))
    };

    println!(
        "{} nodes reporting {} times a second each; warming up {} s",
        total,
        shape.rate,
        shape.warmup.as_secs()
    );
    tokio::time::sleep(shape.warmup).await;
    println!("measuring {} s (serve pid {pid})", shape.secs);
    let me = std::process::id();
    let (rss_before, _, _) = serve::memory(pid)?;
    let s0 = serve::sample(pid)?;
    let own0 = serve::sample(me)?;
    let threads0 = serve::ticks_by_thread(pid);
    let (r0, w0) = serve::syscalls(pid);
    let c0 = control.commits.load(Ordering::Relaxed);
    let k0 = control.skipped.load(Ordering::Relaxed);
    control.measuring.store(true, Ordering::Relaxed);
    let t0 = Instant::now();
    let mut rss_max = rss_before;
    let window = Duration::from_secs(shape.secs);
    while t0.elapsed() < window {
        tokio::time::sleep(Duration::from_secs(1).min(window.saturating_sub(t0.elapsed()))).await;
        rss_max = rss_max.max(serve::memory(pid)?.0);
    }
    control.measuring.store(false, Ordering::Relaxed);
    let secs = t0.elapsed().as_secs_f64();
    let s1 = serve::sample(pid)?;
    let own1 = serve::sample(me)?;
    let threads1 = serve::ticks_by_thread(pid);
    let (r1, w1) = serve::syscalls(pid);
    let commits = control.commits.load(Ordering::Relaxed) - c0;
    let skipped = control.skipped.load(Ordering::Relaxed) - k0;
    let (rss_after, hwm, server_threads) = serve::memory(pid)?;

    // The fleet stops committing; its streams stay open.
    control.stop.store(true, Ordering::Relaxed);
    let mut nodes = Vec::with_capacity(total);
    for d in drivers {
        nodes.extend(d.join().expect("a driver thread panicked")?);
    }
    // Commits reported inside the window get until a generous deadline to be seen shipped.
    let drain = Instant::now();
    while probes
        .iter()
        .any(|p| p.pending.lock().expect("ok").iter().any(|e| e.2))
        && drain.elapsed() < shape.wal_interval * 5 + Duration::from_secs(10)
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    watcher_stop.store(true, Ordering::Relaxed);
    let unshipped: usize = probes
        .iter()
        .map(|p| {
            let mut pending = p.pending.lock().expect("ok");
            let n = pending.iter().filter(|e| e.2).count();
            pending.clear();
            n
        })
        .sum();
    watcher.join().expect("the watcher panicked");
    let mut latencies: Vec<Duration> = probes
        .iter()
        .flat_map(|p| p.latencies.lock().expect("ok").clone())
        .collect();
    latencies.sort();

    // Node-side overhead, on the extra store, while the fleet's streams stay open.
    let (rounds, round) = (shape.overhead_rounds, shape.overhead_round);
    let (overhead_node, pairs) = tokio::task::spawn_blocking(move || {
        let pairs = overhead(&mut overhead_node, rounds, round);
        (overhead_node, pairs)
    })
    .await?;
    let pairs = pairs?;
    let (mut with, mut without) = (Window::default(), Window::default());
    for &(w, wo) in &pairs {
        with += w;
        without += wo;
    }
    // Overhead in throughput: overall, and the mean of the pairs' own (with its 95 % interval).
    let ratio = with.rate() / without.rate().max(1e-9);
    let overhead_pct = (1.0 - ratio) * 100.0;
    let per_pair: Vec<f64> = pairs
        .iter()
        .map(|(w, wo)| (1.0 - w.rate() / wo.rate().max(1e-9)) * 100.0)
        .collect();
    let (pair_mean, pair_ci) = mean_ci(&per_pair);

    // Figures.
    let cpu = serve::cpu_pct(&s0, &s1, secs);
    let own_cpu = serve::cpu_pct(&own0, &own1, secs);
    let reports_per_s = commits as f64 / secs;
    let target_rate = total as f64 * shape.rate;
    let p50 = percentile(&latencies, 0.50);
    let p99 = percentile(&latencies, 0.99);
    let max = latencies.last().copied().unwrap_or_default();
    let latency_target = shape.wal_interval * 2;
    let latency_ok = !latencies.is_empty() && unshipped == 0 && p99 <= latency_target;
    let rate_ok = reports_per_s >= target_rate * 0.95;
    println!();
    println!(
        "{total} nodes x {} reports/s on one instance, wal_interval {} ms, clients' min_report_interval {} ms{}:",
        shape.rate,
        shape.wal_interval.as_millis(),
        shape.min_report_interval.as_millis(),
        if extra.trim().is_empty() {
            String::new()
        } else {
            format!(" (serve {})", extra.trim())
        }
    );
    println!(
        "  reports (commits)      {reports_per_s:>8.0} /s of {target_rate:.0} wanted; {skipped} skipped (a node a period behind)   {}",
        verdict(rate_ok)
    );
    println!(
        "  service CPU ({secs:.0} s)     {cpu:>8.1} % of one core ({:.1} µs per report)",
        cpu / 100.0 * 1e6 / reports_per_s.max(1.0)
    );
    println!(
        "  service memory         {rss_max:>8.1} MiB resident at most ({rss_before:.1} before, {rss_after:.1} after, peak {hwm:.1}; {server_threads} threads)"
    );
    println!(
        "  service wakeups        {:>8.0} context switches/s; {:.0} reads/s, {:.0} writes/s",
        (s1.ctx_switches - s0.ctx_switches) as f64 / secs,
        (r1 - r0) as f64 / secs,
        (w1 - w0) as f64 / secs
    );
    println!("  service CPU by thread name:");
    serve::print_cpu_by_thread(&threads0, &threads1, secs);
    println!(
        "  this process (nodes)   {own_cpu:>8.1} % of one core ({} engines, {} clients)",
        total + 1,
        total + 1
    );
    println!(
        "  report-to-ship         p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms over {} commits of {} stores; {unshipped} unshipped   target p99 <= {} ms   {}",
        ms(p50),
        ms(p99),
        ms(max),
        latencies.len(),
        probes.len(),
        latency_target.as_millis(),
        verdict(latency_ok)
    );
    let cpu_with = Window::us_per_commit(with.process_cpu, with.commits);
    let cpu_without = Window::us_per_commit(without.process_cpu, without.commits);
    let thread_with = Window::us_per_commit(with.thread_cpu, with.commits);
    let thread_without = Window::us_per_commit(without.thread_cpu, without.commits);
    // Judged on the point estimate; "noise" when the interval is too wide to tell either way.
    let overhead_verdict = if overhead_pct < OVERHEAD_TARGET_PCT {
        "ok"
    } else if pair_mean - pair_ci >= OVERHEAD_TARGET_PCT {
        "MISSED"
    } else {
        "unclear (noise)"
    };
    let overhead_ok = overhead_verdict != "MISSED";
    println!(
        "  node overhead          {overhead_pct:>8.2} % fewer commits/s with reporting ({:.0} vs {:.0} commits/s, fsync each; {rounds} pairs of {} ms); per pair {pair_mean:.2} ± {pair_ci:.2} %   target < {OVERHEAD_TARGET_PCT} %   {overhead_verdict}",
        with.rate(),
        without.rate(),
        round.as_millis(),
    );
    println!(
        "    CPU per commit       {cpu_with:.1} µs with, {cpu_without:.1} µs without in this process ({:+.1} µs: the report, the client's task, its writes); committing thread {thread_with:.1} vs {thread_without:.1} µs",
        cpu_with - cpu_without
    );

    // Every stream ends cleanly, then the server stops.
    let not_connected = clients
        .iter()
        .chain(std::iter::once(&overhead_node.client))
        .filter(|c| c.state() != ConnectionState::Connected)
        .count();
    if not_connected > 0 {
        println!("  {not_connected} node clients were not connected at the end");
    }
    futures::future::join_all(
        clients
            .iter()
            .chain(std::iter::once(&overhead_node.client))
            .map(|c| c.close()),
    )
    .await;
    drop(clients);
    tokio::task::spawn_blocking(move || {
        drop(nodes);
        drop(overhead_node);
    })
    .await?;
    drop(control_client);
    let stopped = server.stop(SHUTDOWN_WITHIN).await?;
    let shutdown_ok = stopped.is_some_and(|(status, _)| status.success());
    match stopped {
        Some((status, took)) => println!(
            "  shutdown (SIGTERM)     {:>8.1} s, {status}   {}",
            took.as_secs_f64(),
            verdict(shutdown_ok)
        ),
        None => println!(
            "  shutdown (SIGTERM)     still running after {} s   {}",
            SHUTDOWN_WITHIN.as_secs(),
            verdict(false)
        ),
    }
    if !(shutdown_ok && latency_ok && rate_ok) {
        println!("  the last 20 lines of serve's log:");
        for l in serve::log_tail(&log, 20) {
            println!("    {l}");
        }
    }
    Ok(rate_ok && latency_ok && overhead_ok && shutdown_ok && not_connected == 0)
}

fn main() -> ExitCode {
    let run = || -> anyhow::Result<bool> {
        let shape = Shape::from_env()?;
        // Two runtime threads for the clients; the engines run on their own threads.
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?
            .block_on(bench(shape))
    };
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            println!("positions: a target was missed (above)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("positions: {e:#}");
            ExitCode::FAILURE
        }
    }
}
