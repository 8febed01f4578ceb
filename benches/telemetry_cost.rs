//! What telemetry costs the backup: `BackupWorker::run_once` shipping a store of a few tens of
//! MiB (written by the reference engine) to a local-directory bucket, telemetry off vs on.
//!
//! - off: `telemetry::init` with logs only (no OTLP endpoint, no metrics), the bare bucket.
//! - on: OTLP/gRPC export to a receiver in this bench (batch span processor), the Prometheus
//!   recorder serving `/metrics`, the bucket behind `MeteredBucket`, the run inside a span
//!   carrying `store_id`; the default log filter, so bucket requests are metered but their
//!   DEBUG spans are off (what production runs).
//! - debug: as on, with DEBUG enabled for the crate, so every bucket request is an exported
//!   span too (the worst case).
//!
//! The subscriber and recorder are process-wide, so every run is a child process (this
//! binary again), off and on alternating so that drift on a busy machine hits both alike;
//! each child times only `run_once`. One warm-up round is dropped, then the medians of
//! `TELEMETRY_BENCH_RUNS` (default 5) rounds are printed with their ratios to off (target
//! ≥ 0.97). A second figure is the cost per bucket request: `head` on an in-memory bucket,
//! bare vs metered. `TELEMETRY_BENCH_MIB` sets the store size (default 32).
//!
//! `cargo bench --bench telemetry_cost` (add `--profile dev` where release builds are too
//! costly: debug figures overstate the per-request cost, the ratio much less so).

#[path = "../tests/support/otlp.rs"]
mod otlp;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use mushroom_backup::bucket::fs::FsBucket;
use mushroom_backup::bucket::mem::MemBucket;
use mushroom_backup::bucket::metered::MeteredBucket;
use mushroom_backup::bucket::{Body, DynBucket, PutCondition};
use mushroom_backup::health::{StoreHealth, WorkerState};
use mushroom_backup::store::engine::{WriteOptions, write_commits};
use mushroom_backup::telemetry::{self, LogFormat, TelemetryConfig};
use mushroom_backup::wal_source::LocalSource;
use mushroom_backup::worker::{BackupWorker, WorkerConfig};
use tracing::Instrument as _;

const CHILD: &str = "TELEMETRY_BENCH_CHILD";
const VALUE_SIZE: usize = 4000;
const HEAD_REQUESTS: u32 = 20_000;

fn main() {
    match std::env::var(CHILD).as_deref() {
        Ok("off") => child(false),
        Ok("on" | "debug") => child(true),
        _ => parent(),
    }
}

fn env_num(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// One child's figures: bytes shipped, seconds of `run_once`, nanoseconds per `head`.
struct RunFigures {
    bytes: u64,
    secs: f64,
    head_ns: f64,
}

fn parent() {
    let runs = env_num("TELEMETRY_BENCH_RUNS", 5).max(1);
    let mib = env_num("TELEMETRY_BENCH_MIB", 32).max(1);
    let tmp = tempfile::tempdir().expect("temp dir");
    let store = tmp.path().join("store");
    let commits = mib * (1 << 20) / (VALUE_SIZE as u64 + 32);
    let t = Instant::now();
    let report = write_commits(
        &store,
        &WriteOptions {
            commits,
            value_size: VALUE_SIZE,
            seed: 7,
            ..WriteOptions::default()
        },
    )
    .expect("write the store");
    println!(
        "store: {} commits of {VALUE_SIZE} B values ({:.1} s to write)",
        report.last_seq,
        t.elapsed().as_secs_f64()
    );

    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (receiver_addr, received) = rt.block_on(otlp::start());
    let _enter = rt.enter();

    let modes = ["off", "on", "debug"];
    let mut figures: [Vec<RunFigures>; 3] = Default::default();
    for round in 0..=runs {
        for (i, mode) in modes.into_iter().enumerate() {
            let bucket = tmp.path().join(format!("bucket-{round}-{mode}"));
            let f = run_child(mode, &store, &bucket, receiver_addr);
            std::fs::remove_dir_all(&bucket).ok();
            let label = if round == 0 { "warm-up" } else { "run" };
            println!(
                "{label} {round} {mode:>5}: {:.1} MiB in {:.3} s = {:.1} MiB/s; head {:.0} ns",
                f.bytes as f64 / (1 << 20) as f64,
                f.secs,
                f.bytes as f64 / (1 << 20) as f64 / f.secs,
                f.head_ns
            );
            if round > 0 {
                figures[i].push(f);
            }
        }
    }
    let throughput = |f: &Vec<RunFigures>| {
        median(
            f.iter()
                .map(|r| r.bytes as f64 / (1 << 20) as f64 / r.secs)
                .collect(),
        )
    };
    let head = |f: &Vec<RunFigures>| median(f.iter().map(|r| r.head_ns).collect());
    let off = throughput(&figures[0]);
    let head_off = head(&figures[0]);
    println!("median of {runs}: off {off:.1} MiB/s; in-memory head {head_off:.0} ns");
    for (i, mode) in modes.into_iter().enumerate().skip(1) {
        let (t, h) = (throughput(&figures[i]), head(&figures[i]));
        println!(
            "median of {runs}: {mode} {t:.1} MiB/s, ratio {mode}/off {:.3} (target >= 0.97); \
             metered head {h:.0} ns (+{:.0} ns a request)",
            t / off,
            h - head_off
        );
    }
    println!(
        "OTLP receiver: {} export requests, {} spans",
        received.requests(),
        received.spans().len()
    );
}

fn run_child(
    mode: &str,
    store: &Path,
    bucket: &Path,
    receiver: std::net::SocketAddr,
) -> RunFigures {
    let exe = std::env::current_exe().expect("own path");
    let mut cmd = Command::new(exe);
    cmd.arg(store)
        .arg(bucket)
        .env(CHILD, mode)
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env_remove("RUST_LOG")
        .env_remove(telemetry::LOG_ENV)
        .env("OTEL_SERVICE_NAME", "telemetry-bench");
    match mode {
        "off" => {
            cmd.env_remove("OTEL_EXPORTER_OTLP_ENDPOINT");
        }
        _ => {
            cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{receiver}"));
        }
    }
    if mode == "debug" {
        cmd.env(telemetry::LOG_ENV, "warn,mushroom_backup=debug");
    }
    let out = cmd.output().expect("run the bench child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{mode} child failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .unwrap_or_else(|| panic!("no RESULT line from the {mode} child:\n{stdout}"));
    let mut it = line.split_whitespace();
    let mut next = || it.next().expect("RESULT fields").to_string();
    RunFigures {
        bytes: next().parse().expect("bytes"),
        secs: next().parse().expect("secs"),
        head_ns: next().parse().expect("ns"),
    }
}

fn child(on: bool) {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let [store, bucket_root] = &args[..] else {
        panic!("usage: STORE BUCKET");
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let entered = rt.enter();
    let guard = telemetry::init(&TelemetryConfig {
        log_format: LogFormat::Json,
        metrics_listen: on.then(|| "127.0.0.1:0".parse().expect("address")),
        service_name_default: "mushroom-backup",
    })
    .expect("init telemetry");
    assert_eq!(guard.traces_exported(), on);

    let (bytes, secs, head_ns) = rt.block_on(async {
        std::fs::create_dir_all(bucket_root).expect("bucket dir");
        let fs: DynBucket = Arc::new(FsBucket::open(bucket_root).expect("open the bucket"));
        let bucket: DynBucket = if on {
            Arc::new(MeteredBucket::new(fs))
        } else {
            fs
        };
        let mut worker = BackupWorker::new(
            store,
            bucket,
            Arc::new(LocalSource::new(store)),
            WorkerConfig::default(),
        );
        let t = Instant::now();
        let run = worker
            .run_once()
            .instrument(tracing::info_span!("backup_run", store_id = "bench"));
        let report = run.await.expect("run_once");
        let secs = t.elapsed().as_secs_f64();
        let counters = worker.counters();
        let health = StoreHealth {
            healthy: true,
            reason: String::new(),
            reasons: Vec::new(),
            notes: Vec::new(),
            durable_commit_seq: counters.durable_commit_seq.load(Ordering::Relaxed),
            shipped_commit_seq: counters.shipped_commit_seq.load(Ordering::Relaxed),
            restore_point_commit_seq: counters.restore_point_commit_seq.load(Ordering::Relaxed),
            bucket_durable_commit_seq: counters.restore_point_commit_seq.load(Ordering::Relaxed),
            lag_seconds: 0.0,
            lease_holder: String::new(),
            lease_held: true,
            consecutive_failures: 0,
            last_error: None,
            worker: WorkerState::Running,
            activity: String::new(),
            paused: None,
            last_drill: None,
            immutable: None,
            starting: false,
            branched_from: None,
        };
        mushroom_backup::service::store_metrics::record_store("bench", "bench", &health, &counters);
        assert!(report.bytes > 0, "nothing shipped: {report:?}");
        let shipped = counters
            .bytes_shipped
            .load(Ordering::Relaxed)
            .max(report.bytes);
        (shipped, secs, head_cost(on).await)
    });
    println!("RESULT {bytes} {secs} {head_ns}");
    drop(guard);
    drop(entered);
}

/// Nanoseconds per `head` of an in-memory object, through `MeteredBucket` when `on`.
async fn head_cost(on: bool) -> f64 {
    let mem: DynBucket = Arc::new(MemBucket::new());
    mem.put(
        "k",
        Body::from(bytes::Bytes::from_static(b"v")),
        PutCondition::None,
    )
    .await
    .expect("put");
    let bucket: DynBucket = if on {
        Arc::new(MeteredBucket::new(mem))
    } else {
        mem
    };
    let t = Instant::now();
    for _ in 0..HEAD_REQUESTS {
        bucket.head("k").await.expect("head");
    }
    let ns = t.elapsed().as_nanos() as f64 / f64::from(HEAD_REQUESTS);
    // Let the batch processor catch up outside the measurement.
    tokio::time::sleep(Duration::from_millis(10)).await;
    ns
}
