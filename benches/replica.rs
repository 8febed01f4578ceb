//! A replica (`--replica`, issue 29): how far the replica's worker lags behind the primary's at
//! 100 commits/s, and what each destination costs in requests an hour, counted at the server.
//!
//! # What runs
//!
//! One `moto_server` on loopback (its request log counts the requests at the server, by
//! bucket: path-style requests name their bucket first). A store made with the reference
//! engine (1,000 commits), held open in-process by a writer thread committing and syncing 100
//! commits/s, read through one [`InProcessSource`] on the engine's position handle. Two real
//! [`BackupWorker::spawn`]s on it, each under its own [`LeaseConfig`] (renewing, as standalone
//! `backup --replica` runs them): the primary to `s3://primary/p?endpoint=…&region=…` and the
//! replica to `s3://replica/r?endpoint=…&region=…`, both opened from their URLs' queries as the
//! binary opens them, on one set of shared S3 clients. Default settings (wal_interval 1 s,
//! restore_point_interval 60 s, lease TTL 30 s, retention_interval 1 h): no time compression.
//!
//! After both hold their lease and wrote a first restore point, the window starts: every
//! 20 ms the bench reads both workers' shipped commit (their counters, as the ledger sets them)
//! and records the replica's lag behind the primary, in commits shipped (primary − replica, 0
//! when the replica is ahead) and so in seconds at the commit rate; and each one's lag behind
//! the store (the engine's durable commit, from its position handle, − shipped). The table prints p50, p99 and max of each; then each
//! destination's requests in the window (at the server, and by the worker's own usage count as
//! a cross-check) scaled to an hour, and the replica's over the primary's.
//!
//! A third worker on the same store ships it write-once (`--object-lock governance`) to a
//! bucket with Object Lock enabled, `s3://locked/l`: its requests beside the primary's are the
//! write-once mode's cost against the normal mode's (issue 29: at most 10 % more busy). After
//! the busy window the writer stops and, once every worker shipped everything, an idle window
//! counts each destination's requests again (issue 29: the write-once mode costs nothing more
//! idle; standalone workers renew their lease, ~360 an hour each, in both modes).
//!
//! # Settings (environment)
//! - `MUSHROOM_BENCH_SECS` (default 60): the busy window, in wall seconds.
//! - `MUSHROOM_BENCH_IDLE_SECS` (default 30): the idle window.
//! - `MUSHROOM_BENCH_RATE` (default 100): commits a second.
//!
//! Run with `cargo bench --bench replica` (needs `.venv` with moto: `scripts/test.sh` makes it).

#[path = "support/moto.rs"]
mod moto;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mushroom_backup::bucket::write_once::LockMode;
use mushroom_backup::bucket::{self, s3::Clients};
use mushroom_backup::lease::LeaseConfig;
use mushroom_backup::store::engine::{Engine, EngineOptions, workload_ops};
use mushroom_backup::wal_source::InProcessSource;
use mushroom_backup::worker::{BackupHandle, BackupWorker, WorkerConfig};
use tokio_util::sync::CancellationToken;

const INITIAL_COMMITS: u64 = 1000;
const VALUE_SIZE: usize = 64;
const SEED: u64 = 29;
const HOUR: f64 = 3600.0;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Commits and syncs `rate` commits a second until `stop`.
fn write_at(mut engine: Engine, rate: u64, stop: Arc<AtomicBool>) -> u64 {
    let start = Instant::now();
    let mut written = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let due = start + Duration::from_secs_f64(written as f64 / rate as f64);
        let now = Instant::now();
        if now < due {
            std::thread::sleep((due - now).min(Duration::from_millis(5)));
            continue;
        }
        let seq = engine.commit_seq() + 1;
        engine
            .commit(&workload_ops(SEED, seq, VALUE_SIZE))
            .expect("commit");
        engine.sync().expect("sync");
        written += 1;
    }
    engine.close().expect("close the store");
    written
}

/// p50, p99 and max of `v` (sorted here).
fn quantiles(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99), at(1.0))
}

/// Requests at the server naming `bucket` (path-style: `"METHOD /bucket…`).
fn at_server(moto: &moto::Moto, bucket: &str) -> u64 {
    let needle = format!(" /{bucket}");
    moto.request_lines()
        .iter()
        .filter(|l| l.contains(&needle))
        .count() as u64
}

async fn create_bucket(endpoint: &str, name: &str, locked: bool) {
    let conf = aws_sdk_s3::config::Builder::new()
        .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
        .region(aws_sdk_s3::config::Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .force_path_style(true)
        .credentials_provider(aws_sdk_s3::config::Credentials::new(
            "bench", "bench", None, None, "bench",
        ))
        .build();
    aws_sdk_s3::Client::from_conf(conf)
        .create_bucket()
        .bucket(name)
        .object_lock_enabled_for_bucket(locked)
        .send()
        .await
        .expect("create a bucket");
}

async fn wait_until(h: &BackupHandle, what: &str, f: impl Fn(u64, bool) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let s = h.health();
        if f(s.restore_point_commit_seq, s.lease_held) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {s:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn main() -> anyhow::Result<()> {
    // SAFETY: no other thread runs yet (the runtime is built below).
    unsafe {
        std::env::set_var("AWS_ACCESS_KEY_ID", "bench");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "bench");
        std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
        std::env::remove_var("AWS_ENDPOINT_URL");
        std::env::remove_var("AWS_PROFILE");
    }
    let window = Duration::from_secs(env_u64("MUSHROOM_BENCH_SECS", 60));
    let rate = env_u64("MUSHROOM_BENCH_RATE", 100).max(1);
    let tmp = tempfile::tempdir()?;
    let moto = moto::Moto::start(&tmp.path().join("moto.log"))?;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(run(&moto, tmp.path(), window, rate))
}

async fn run(
    moto: &moto::Moto,
    root: &std::path::Path,
    window: Duration,
    rate: u64,
) -> anyhow::Result<()> {
    for (b, locked) in [("primary", false), ("replica", false), ("locked", true)] {
        create_bucket(&moto.url, b, locked).await;
    }
    let store = root.join("store");
    let mut engine = Engine::open(
        &store,
        EngineOptions {
            group_commit: 0,
            ..EngineOptions::default()
        },
    )?;
    for seq in 1..=INITIAL_COMMITS {
        engine.commit(&workload_ops(SEED, seq, VALUE_SIZE))?;
    }
    engine.sync()?;
    let position = engine.position_handle();
    let committed = position.clone();
    let source = Arc::new(InProcessSource::new(move || position.get()));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        std::thread::spawn(move || write_at(engine, rate, stop))
    };

    let clients = Clients::default();
    let cancel = CancellationToken::new();
    let tasks = tokio_util::task::TaskTracker::new();
    let mut handles = Vec::new();
    let mut usages = Vec::new();
    for (name, prefix) in [("primary", "p"), ("replica", "r"), ("locked", "l")] {
        let url = format!(
            "s3://{name}/{prefix}?endpoint={}&region=us-east-1",
            moto.url
        );
        let usage = bucket::usage::Usage::new();
        let b = bucket::Open::read_write(&url, &cancel)
            .clients(&clients)
            .usage(usage.clone())
            .open()
            .await?;
        let config = WorkerConfig {
            object_lock: (name == "locked").then_some(LockMode::Governance),
            ..WorkerConfig::default()
        };
        let worker = BackupWorker::new(&store, b, source.clone(), config);
        let lease = LeaseConfig::new(format!("bench {name}"));
        handles.push(worker.spawn(lease, cancel.clone(), &tasks));
        usages.push(usage);
    }
    for (h, name) in handles.iter().zip(["primary", "replica", "locked"]) {
        wait_until(h, &format!("{name}: a first restore point"), |rp, held| {
            held && rp >= INITIAL_COMMITS
        })
        .await;
    }

    let counts = |moto: &moto::Moto| {
        [
            at_server(moto, "primary"),
            at_server(moto, "replica"),
            at_server(moto, "locked"),
        ]
    };
    let used = || -> Vec<u64> { usages.iter().map(|u| u.requests_so_far()).collect() };
    let (at0, use0) = (counts(moto), used());
    let t0 = Instant::now();
    let (mut behind_primary, mut p_behind_store, mut r_behind_store) =
        (Vec::new(), Vec::new(), Vec::new());
    let shipped = |h: &BackupHandle| h.counters().shipped_commit_seq.load(Ordering::Relaxed);
    while t0.elapsed() < window {
        let store_at = committed.get().commit_seq;
        let (p, r) = (shipped(&handles[0]), shipped(&handles[1]));
        behind_primary.push(p.saturating_sub(r) as f64);
        p_behind_store.push(store_at.saturating_sub(p) as f64);
        r_behind_store.push(store_at.saturating_sub(r) as f64);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let secs = t0.elapsed().as_secs_f64();
    let (at1, use1) = (counts(moto), used());
    stop.store(true, Ordering::Relaxed);
    let written = writer.join().expect("the writer");
    let last = INITIAL_COMMITS + written;
    for (h, name) in handles.iter().zip(["primary", "replica", "locked"]) {
        wait_until(h, &format!("{name}: everything shipped"), |rp, _| {
            rp >= last
        })
        .await;
    }
    let idle = Duration::from_secs(env_u64("MUSHROOM_BENCH_IDLE_SECS", 30));
    let at2 = counts(moto);
    let i0 = Instant::now();
    tokio::time::sleep(idle).await;
    let idle_secs = i0.elapsed().as_secs_f64();
    let at3 = counts(moto);
    cancel.cancel();
    for h in &handles {
        h.shutdown(false).await;
    }
    tasks.close();
    tasks.wait().await;

    println!(
        "replica bench: {rate} commits/s for {secs:.1} s ({written} commits written in all), \
         default intervals, moto on loopback, {} samples every 20 ms",
        behind_primary.len()
    );
    println!(
        "{:<34} {:>10} {:>10} {:>10}",
        "lag (commits; seconds at the rate)", "p50", "p99", "max"
    );
    for (what, v) in [
        ("replica behind primary", &mut behind_primary),
        ("primary behind store", &mut p_behind_store),
        ("replica behind store", &mut r_behind_store),
    ] {
        let (p50, p99, max) = quantiles(v);
        let s = |c: f64| format!("{c:.0} ({:.2}s)", c / rate as f64);
        println!("{what:<34} {:>10} {:>10} {:>10}", s(p50), s(p99), s(max));
    }
    println!(
        "{:<34} {:>12} {:>12} {:>14} {:>12} {:>12}",
        "requests", "busy window", "busy /hour", "worker's count", "idle window", "idle /hour"
    );
    let names = ["primary", "replica", "locked (write-once)"];
    for (i, what) in names.iter().enumerate() {
        let (busy, idle_n) = (at1[i] - at0[i], at3[i] - at2[i]);
        println!(
            "{what:<34} {busy:>12} {:>12.0} {:>14} {idle_n:>12} {:>12.0}",
            busy as f64 * HOUR / secs,
            use1[i] - use0[i],
            idle_n as f64 * HOUR / idle_secs,
        );
    }
    let ratio = |i: usize, j: usize, a: &[u64; 3], b: &[u64; 3]| {
        (a[i] - b[i]) as f64 / (a[j] - b[j]).max(1) as f64
    };
    println!(
        "replica / primary requests, busy: {:.3}",
        ratio(1, 0, &at1, &at0)
    );
    println!(
        "write-once / normal requests, busy: {:.3} (issue 29: at most 1.10); idle: {} vs {} \
         in {idle_secs:.0} s (issue 29: no more)",
        ratio(2, 0, &at1, &at0),
        at3[2] - at2[2],
        at3[0] - at2[0],
    );
    Ok(())
}
