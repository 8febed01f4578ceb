//! The fleet benchmark: 1,000 stores (or 5,000, 10,000…) on one `serve` instance, at the default
//! intervals.
//!
//! Untimed set-up: 1,000 small reference-engine stores (20 commits each) under one allowed root.
//! Then the release binary's `serve` starts (port 0, a temporary data dir, SQLite registry),
//! every store is registered over gRPC with its own local-directory destination (bounded
//! concurrency), and the benchmark measures
//!
//! - how long registering takes, and how long until every store reports healthy with all its
//!   commits shipped (target: within 2 minutes of the first Register);
//! - the server's CPU while the fleet idles (utime + stime deltas of `/proc/PID/stat`, as % of
//!   one core; target: under 5 %) and its resident memory (`VmRSS`; target: under 512 MiB);
//! - to tell what the idle CPU is spent on: context switches (wakeups) per second, read and
//!   write syscalls per second, and CPU by thread name;
//! - the server's open file descriptors (entries of `/proc/PID/fd`), after the idle window;
//! - with `FLEET_S3=1`, bucket requests per hour while idle, counted at the bucket: every store
//!   backs up to `s3://fleet/store-N` on a `moto_server` the benchmark starts from the crate's
//!   `.venv` (its request log, one line per request, is counted over the idle window). On the
//!   default local-directory destinations that figure is not measured.
//! - after the idle window, a crash: SIGKILL, one more commit in every store, `serve` started
//!   again on its data directory, and how long until every store has shipped that commit
//!   (target: within 15 s, not a lease TTL; `FLEET_RESTART=0` skips it);
//! - how long SIGTERM takes (every store flushes a last restore point; target: exit 0 within
//!   3 minutes).
//!
//! What is measured is what an operator sees: the idle window is 30 s (`FLEET_IDLE_SECS`)
//! starting 20 s (`FLEET_SETTLE_SECS`) after every store turned healthy, at the default
//! settings, with one `WatchHealth` stream of the whole fleet open from before the first
//! Register to the end of the window (`FLEET_WATCHERS`, default 1: the operator's
//! `mb ctl watch-health`, or a dashboard; 0 for a server nothing watches). Nothing else calls
//! the server while it idles (the Health polls that wait for the fleet to turn healthy have
//! stopped). The process exits non-zero when a target is missed.
//!
//! `cargo bench --bench fleet`; `FLEET_STORES` (a number, or a list run one after the other:
//! `FLEET_STORES=1000,5000,10000`, with a table of all at the end), `FLEET_COMMITS`,
//! `FLEET_IDLE_SECS`, `FLEET_SETTLE_SECS` and `FLEET_CONCURRENCY` change the shape (defaults
//! 1000, 20, 30, 20, 16);
//! `FLEET_LEASE_TTL_MS` sets the bucket lease's TTL (`MUSHROOMDB_BACKUP_LEASE_TTL_MS` of the
//! server; renewals every third of it), to see the fleet without most renewals;
//! `MUSHROOM_BACKUP_BIN` runs
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

#[path = "support/moto.rs"]
mod moto;
#[path = "support/serve.rs"]
mod serve;
use moto::Moto;
use serve::{Server, append_commits, env_or, memory, sample, syscalls, ticks_by_thread, verdict};

const HEALTHY_WITHIN: Duration = Duration::from_secs(120);
const IDLE_CPU_TARGET_PCT: f64 = 5.0;
const RSS_TARGET_MIB: f64 = 512.0;
/// Every store flushes a last restore point on SIGTERM; a deployment's grace period is finite.
const SHUTDOWN_WITHIN: Duration = Duration::from_secs(180);
/// "Within a few seconds, not a TTL" (30 s) of a restart after SIGKILL.
const RESTART_WITHIN: Duration = Duration::from_secs(15);

struct Shape {
    stores: usize,
    commits: u64,
    idle: Duration,
    /// Waited after the fleet turned healthy, before the idle measurement (see the docs).
    settle: Duration,
    concurrency: usize,
    /// Back up to S3 (a moto server of the benchmark's own) rather than local directories.
    s3: bool,
    lease_ttl_ms: Option<u64>,
    /// After the idle window: SIGKILL, one more commit in every store, start again.
    restart: bool,
    /// WatchHealth streams of the whole fleet kept open (as `mb ctl watch-health` does).
    watchers: usize,
}

/// One run's figures, for the table at the end.
struct Figures {
    stores: usize,
    registered: Duration,
    healthy: Option<Duration>,
    idle_cpu_pct: f64,
    rss_mib: f64,
    fds: usize,
    ctx_per_sec: f64,
    requests_per_hour: Option<f64>,
    /// From the restart after SIGKILL until every store had shipped its new commit.
    restart: Option<Duration>,
    ok: bool,
}

impl Moto {
    /// Requests served so far, whatever their status ([`Moto::request_lines`]).
    fn requests(&self) -> usize {
        self.request_lines().len()
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.url.clone()),
            ("AWS_ACCESS_KEY_ID", "test".into()),
            ("AWS_SECRET_ACCESS_KEY", "test".into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
    }

    async fn create_bucket(&self, name: &str) -> anyhow::Result<()> {
        use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
        let conf = aws_sdk_s3::config::Builder::new()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new("test", "test", None, None, "fleet"))
            .endpoint_url(&self.url)
            .force_path_style(true)
            .build();
        aws_sdk_s3::Client::from_conf(conf)
            .create_bucket()
            .bucket(name)
            .send()
            .await
            .with_context(|| format!("create bucket {name}"))?;
        Ok(())
    }
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

fn create_stores(root: &Path, shape: &Shape) -> anyhow::Result<Vec<PathBuf>> {
    let dirs: Vec<PathBuf> = (0..shape.stores)
        .map(|i| root.join(format!("store-{i:04}")))
        .collect();
    append_commits(&dirs, shape.commits)?;
    Ok(dirs)
}

async fn register_all(
    client: &BackupControlClient<Channel>,
    dirs: &[PathBuf],
    buckets: &str,
    concurrency: usize,
) -> anyhow::Result<()> {
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(dirs.iter().enumerate())
        .map(|(i, dir)| {
            let mut client = client.clone();
            let destination = format!("{buckets}/store-{i:04}");
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

async fn bench(shape: &Shape) -> anyhow::Result<Figures> {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path().join("stores");
    let buckets = tmp.path().join("buckets");
    std::fs::create_dir_all(&root)?;
    std::fs::create_dir_all(&buckets)?;
    let root = std::fs::canonicalize(&root)?;

    let t = Instant::now();
    let dirs = create_stores(&root, shape)?;
    println!(
        "set-up: {} stores of {} commits written in {:.1} s (not timed)",
        dirs.len(),
        shape.commits,
        t.elapsed().as_secs_f64()
    );

    let log = tmp.path().join("serve.log");
    let extra = std::env::var("FLEET_SERVE_ARGS").unwrap_or_default();
    let moto = if shape.s3 {
        let moto = Moto::start(&tmp.path().join("moto.log"))?;
        moto.create_bucket("fleet").await?;
        Some(moto)
    } else {
        None
    };
    let mut env = moto.as_ref().map(Moto::env).unwrap_or_default();
    if let Some(ttl) = shape.lease_ttl_ms {
        env.push(("MUSHROOMDB_BACKUP_LEASE_TTL_MS", ttl.to_string()));
    }
    let destinations = match &moto {
        Some(_) => "s3://fleet".to_string(),
        None => format!("file://{}", buckets.display()),
    };
    let mut server = Server::start_with_env(&tmp.path().join("data"), &root, &log, &extra, &env)?;
    let pid = server.pid();
    let channel = Channel::from_shared(format!("http://{}", server.addr))?
        .connect()
        .await?;
    let mut client = BackupControlClient::new(channel).max_decoding_message_size(64 << 20);
    let (rss_empty, _, _) = memory(pid)?;
    // What an operator keeps open: `mb ctl watch-health` (a WatchHealth stream of every store),
    // read as it answers, for the whole run.
    let mut watchers = Vec::new();
    for _ in 0..shape.watchers {
        let mut stream = client
            .watch_health(HealthRequest::default())
            .await
            .context("WatchHealth")?
            .into_inner();
        watchers.push(tokio::spawn(async move {
            let mut answers = 0u64;
            while let Ok(Some(_)) = stream.message().await {
                answers += 1;
            }
            answers
        }));
    }

    let start = Instant::now();
    if let Err(e) = register_all(&client, &dirs, &destinations, shape.concurrency).await {
        // The temporary directory goes with the error: keep what says why.
        let kept = std::env::temp_dir().join(format!("fleet-serve-{pid}.log"));
        let _ = std::fs::copy(&log, &kept);
        let fds = open_fds(pid);
        anyhow::bail!(
            "{e} (server log kept in {}; {fds} fds open)",
            kept.display()
        );
    }
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
    let q0 = moto.as_ref().map(Moto::requests);
    let (r0, w0) = syscalls(pid);
    let s0 = sample(pid)?;
    let threads0 = ticks_by_thread(pid);
    let t0 = Instant::now();
    tokio::time::sleep(shape.idle).await;
    let secs = t0.elapsed().as_secs_f64();
    let s1 = sample(pid)?;
    let threads1 = ticks_by_thread(pid);
    let (r1, w1) = syscalls(pid);
    let q1 = moto.as_ref().map(Moto::requests);
    let (rss, hwm, threads) = memory(pid)?;
    let fds = open_fds(pid);
    let requests_per_hour = q0
        .zip(q1)
        .map(|(a, b)| b.saturating_sub(a) as f64 / secs * 3600.0);
    let cpu_pct = serve::cpu_pct(&s0, &s1, secs);

    let healthy_ok = healthy.is_some_and(|d| d <= HEALTHY_WITHIN);
    let cpu_ok = cpu_pct < IDLE_CPU_TARGET_PCT;
    let rss_ok = rss < RSS_TARGET_MIB;
    println!();
    let dest = if shape.s3 {
        "S3 (moto)"
    } else {
        "local directories"
    };
    let ttl = shape
        .lease_ttl_ms
        .map_or(String::new(), |t| format!(", lease TTL {t} ms"));
    if extra.trim().is_empty() {
        println!(
            "fleet of {} stores on {dest}{ttl}, default intervals, {} WatchHealth streams open:",
            dirs.len(),
            shape.watchers
        );
    } else {
        println!(
            "fleet of {} stores on {dest}{ttl}, serve {extra}, {} WatchHealth streams open (targets are for the defaults):",
            dirs.len(),
            shape.watchers
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
    println!("  open file descriptors  {fds:>8}");
    match requests_per_hour {
        Some(r) => println!("  idle bucket requests   {r:>8.0} per hour (counted at moto)"),
        None => {
            println!("  idle bucket requests        n/a   (FLEET_S3=1 counts them at the bucket)")
        }
    }
    // Saturating: a thread that ended between the samples takes its switches with it.
    let ctx_per_sec = s1.ctx_switches.saturating_sub(s0.ctx_switches) as f64 / secs;
    println!("  idle wakeups           {ctx_per_sec:>8.0} context switches/s");
    println!(
        "  idle syscalls          {:>8.0} reads/s, {:.0} writes/s",
        (r1 - r0) as f64 / secs,
        (w1 - w0) as f64 / secs
    );
    println!("  idle CPU by thread name:");
    serve::print_cpu_by_thread(&threads0, &threads1, secs);

    for w in &watchers {
        w.abort();
    }

    // A crash and a restart: SIGKILL, one more commit in every store (not timed), `serve`
    // again on the same data directory. Its lock proves the killed process dead, so its claim,
    // its instance lease and every store lease are taken at once, not a lease TTL later.
    let mut restart = None;
    let mut restart_ok = true;
    if shape.restart {
        drop(client);
        server.kill()?;
        append_commits(&dirs, 1)?;
        let t = Instant::now();
        server = Server::start_with_env(&tmp.path().join("data"), &root, &log, &extra, &env)?;
        let channel = Channel::from_shared(format!("http://{}", server.addr))?
            .connect()
            .await?;
        client = BackupControlClient::new(channel).max_decoding_message_size(64 << 20);
        restart =
            wait_all_healthy(&client, dirs.len(), shape.commits + 1, t, HEALTHY_WITHIN).await?;
        restart_ok = restart.is_some_and(|d| d <= RESTART_WITHIN);
        match restart {
            Some(d) => println!(
                "  restart after SIGKILL  {:>8.1} s until every store shipped its new commit   target < {} s   {}",
                d.as_secs_f64(),
                RESTART_WITHIN.as_secs(),
                verdict(restart_ok)
            ),
            None => println!("  restart after SIGKILL     never   {}", verdict(false)),
        }
    }

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
    Ok(Figures {
        stores: dirs.len(),
        registered,
        healthy,
        idle_cpu_pct: cpu_pct,
        rss_mib: rss,
        fds,
        ctx_per_sec,
        requests_per_hour,
        restart,
        ok: healthy_ok && cpu_ok && rss_ok && shutdown_ok && restart_ok,
    })
}

fn table(all: &[Figures]) {
    println!();
    println!(
        "| stores | registration | all healthy | idle CPU | resident | open fds | wakeups/s | idle requests/hour | restart after SIGKILL |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for f in all {
        println!(
            "| {} | {:.1} s | {} | {:.2} % | {:.1} MiB | {} | {:.0} | {} | {} |",
            f.stores,
            f.registered.as_secs_f64(),
            f.healthy
                .map_or("never".to_string(), |d| format!("{:.1} s", d.as_secs_f64())),
            f.idle_cpu_pct,
            f.rss_mib,
            f.fds,
            f.ctx_per_sec,
            f.requests_per_hour
                .map_or("n/a".to_string(), |r| format!("{r:.0}")),
            f.restart
                .map_or("n/a".to_string(), |d| format!("{:.1} s", d.as_secs_f64())),
        );
    }
}

fn main() -> ExitCode {
    let shapes = || -> anyhow::Result<Vec<Shape>> {
        let sizes = std::env::var("FLEET_STORES").unwrap_or_else(|_| "1000".into());
        let mut shapes = Vec::new();
        for size in sizes.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            shapes.push(Shape {
                stores: size
                    .parse()
                    .map_err(|_| anyhow::anyhow!("FLEET_STORES: {size:?} is not a number"))?,
                commits: env_or("FLEET_COMMITS", 20)?,
                idle: Duration::from_secs(env_or("FLEET_IDLE_SECS", 30)?),
                settle: Duration::from_secs(env_or("FLEET_SETTLE_SECS", 20)?),
                concurrency: env_or("FLEET_CONCURRENCY", 16)?,
                s3: std::env::var("FLEET_S3").is_ok_and(|v| v == "1"),
                lease_ttl_ms: match std::env::var("FLEET_LEASE_TTL_MS") {
                    Ok(v) => Some(v.parse().map_err(|_| {
                        anyhow::anyhow!("FLEET_LEASE_TTL_MS={v:?} is not a number")
                    })?),
                    Err(_) => None,
                },
                restart: std::env::var("FLEET_RESTART").map_or(true, |v| v != "0"),
                watchers: env_or("FLEET_WATCHERS", 1)?,
            });
        }
        Ok(shapes)
    };
    let run = || -> anyhow::Result<bool> {
        let shapes = shapes()?;
        // One thread: the client should cost the 2-core machine as little as possible.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let mut all = Vec::new();
        for shape in &shapes {
            all.push(rt.block_on(bench(shape))?);
        }
        table(&all);
        Ok(all.iter().all(|f| f.ok))
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
