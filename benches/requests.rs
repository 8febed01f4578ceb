//! What continuous backup costs in bucket requests, per hour and by kind, measured on a real
//! spawned worker (DESIGN.md sections 5 and 7).
//!
//! # What runs
//!
//! For each scenario a store is created with the reference engine (1,000 commits), held open
//! in-process by a writer thread and read through an [`InProcessSource`] on the engine's
//! position handle. A real [`BackupWorker::spawn`] under a real [`LeaseConfig`] backs it up to
//! a local-directory [`FsBucket`] in a temp dir (`MUSHROOM_BENCH_DIR` to put it elsewhere),
//! through a key-classifying counter this bench wraps around the bucket, so PUTs are split by
//! what they write: WAL segments (`gen/*/wal/`), manifests, `LATEST`, the `lease`, and anything
//! else (`GENERATION`, snapshots, archives, side files). The worker's own
//! [`BackupCounters::requests`] counts the same requests and is printed beside the total as a
//! cross-check.
//!
//! - **idle**: no commits while measured; default settings (wal_interval 1 s,
//!   restore_point_interval 60 s, lease TTL 30 s, retention_interval 1 h).
//! - **busy**: 100 commits/s, each committed with `workload_ops` and synced on its own.
//!
//! Warm-up is not measured: the first acquisition, the resume, the first generation's uploads
//! and restore point, and the first retention run all happen before the first of two
//! snapshots of the counts ([`RequestCountsSnapshot::since`]); the figures are the requests
//! between the two snapshots, scaled to an hour of schedule.
//!
//! # Time compression
//!
//! A real hour is too long for a benchmark, so every interval (wal_interval,
//! restore_point_interval, lease TTL, retention_interval, backoffs) is divided by `K` and the
//! commit rate multiplied by it: the request counts are a function of the intervals, so a
//! window of `T` seconds at `K` stands for `T × K` seconds of schedule and the per-hour figures
//! are `count × 3600 / (T × K)`. What compression does not scale is the time a request or an
//! fsync takes: the closer a step's requests come to the compressed intervals, the less
//! faithful it is, which is why `MUSHROOM_BENCH_REAL=1` adds an uncompressed run to compare.
//!
//! # Settings (environment)
//!
//! - `MUSHROOM_BENCH_K` (default 20): the compression factor.
//! - `MUSHROOM_BENCH_SECS` (default 180): the measured window of the compressed run, in wall
//!   seconds (180 s at K = 20 is one hour of schedule).
//! - `MUSHROOM_BENCH_REAL=1`: also run uncompressed, for `MUSHROOM_BENCH_REAL_SECS` (default
//!   180) wall seconds of window.
//! - `MUSHROOM_BENCH_ONLY=idle|busy`: one scenario only.
//!
//! # Reading the table
//!
//! `measured/h` is the scaled count; `expected/h` is DESIGN.md's figure (section 5: 3,600
//! segment PUTs, 120 manifests, 120 LATEST writes and 360 lease renewals an hour at 100
//! commits/s; an idle store only its ~360 renewals); `ratio` is measured/expected, `extra` where
//! nothing was expected. A window catches whole restore points and retention runs only, so a
//! short window is off by up to one of each (a 3-minute uncompressed window: ±20 restore points
//! an hour). The checks below the table say whether the idle store sent anything besides lease
//! renewals and the hourly retention run's LISTs, and whether either store LISTed outside
//! retention.
//!
//! Run with `cargo bench --bench requests`.

#[path = "../tests/support/hooked.rs"]
mod hooked;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hooked::Hooked;
use mushroom_backup::bucket::DynBucket;
use mushroom_backup::bucket::counting::RequestCountsSnapshot;
use mushroom_backup::bucket::faults::Op;
use mushroom_backup::bucket::fs::FsBucket;
use mushroom_backup::health::StoreHealth;
use mushroom_backup::lease::LeaseConfig;
use mushroom_backup::manifest::{GEN_PREFIX, LATEST_KEY, LEASE_KEY, MANIFESTS_PREFIX};
use mushroom_backup::store::engine::{Engine, EngineOptions, workload_ops};
use mushroom_backup::wal_source::InProcessSource;
use mushroom_backup::worker::{BackupCounters, BackupHandle, BackupWorker, WorkerConfig};
use tokio_util::sync::CancellationToken;

/// Commits in the store before the worker starts.
const INITIAL_COMMITS: u64 = 1000;
const VALUE_SIZE: usize = 64;
const SEED: u64 = 7;
/// Schedule time (divided by K) waited after the first restore point before measuring: more
/// than one restore-point interval, and past the first retention run.
const WARM_UP: Duration = Duration::from_secs(90);
const HOUR: f64 = 3600.0;

// ---------------------------------------------------------------------------------------------
// Counting by kind and key

/// What a key (or a listed prefix) is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Segment,
    Manifest,
    Latest,
    Lease,
    Other,
}
const CLASSES: [Class; 5] = [
    Class::Segment,
    Class::Manifest,
    Class::Latest,
    Class::Lease,
    Class::Other,
];

impl Class {
    fn of(key: &str) -> Class {
        if key == LATEST_KEY {
            Class::Latest
        } else if key == LEASE_KEY {
            Class::Lease
        } else if key.starts_with(MANIFESTS_PREFIX) {
            Class::Manifest
        } else if key.starts_with("gen/") && key.contains("/wal/") {
            Class::Segment
        } else {
            Class::Other
        }
    }

    fn name(self) -> &'static str {
        match self {
            Class::Segment => "segment",
            Class::Manifest => "manifest",
            Class::Latest => "LATEST",
            Class::Lease => "lease",
            Class::Other => "other",
        }
    }
}

/// Requests by kind and class.
#[derive(Default)]
struct KeyCounts {
    n: [[AtomicU64; CLASSES.len()]; Op::ALL.len()],
}

#[derive(Debug, Clone, Copy, Default)]
struct KeySnapshot {
    n: [[u64; CLASSES.len()]; Op::ALL.len()],
}

impl KeyCounts {
    fn record(&self, kind: Op, key: &str) {
        self.n[kind as usize][Class::of(key) as usize].fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> KeySnapshot {
        let mut s = KeySnapshot::default();
        for (k, row) in self.n.iter().enumerate() {
            for (c, n) in row.iter().enumerate() {
                s.n[k][c] = n.load(Ordering::Relaxed);
            }
        }
        s
    }
}

impl KeySnapshot {
    fn since(&self, earlier: &KeySnapshot) -> KeySnapshot {
        let mut s = *self;
        for k in 0..Op::ALL.len() {
            for c in 0..CLASSES.len() {
                s.n[k][c] -= earlier.n[k][c];
            }
        }
        s
    }

    fn get(&self, kind: Op, class: Class) -> u64 {
        self.n[kind as usize][class as usize]
    }

    fn kind(&self, kind: Op) -> u64 {
        self.n[kind as usize].iter().sum()
    }

    fn total(&self) -> u64 {
        Op::ALL.iter().map(|k| self.kind(*k)).sum()
    }
}

// ---------------------------------------------------------------------------------------------
// Scenarios

#[derive(Debug, Clone, Copy)]
struct Scenario {
    name: &'static str,
    /// Commits per second of schedule (before compression).
    commits_per_sec: f64,
}

const IDLE: Scenario = Scenario {
    name: "idle",
    commits_per_sec: 0.0,
};
const BUSY: Scenario = Scenario {
    name: "busy",
    commits_per_sec: 100.0,
};

/// What one run measured.
struct Measured {
    scenario: Scenario,
    k: f64,
    window: Duration,
    requests: KeySnapshot,
    /// The worker's own count of the same requests.
    worker_requests: RequestCountsSnapshot,
    commits: u64,
    segments: u64,
    restore_points: u64,
    lease_acquisitions: u64,
    /// Retention runs in the window: first pages of a `manifests/` listing.
    retention_runs: u64,
    /// LISTs in the window of a prefix retention does not list.
    other_lists: u64,
    /// Commits per second of the writer, in schedule time.
    commits_per_sec: f64,
    health: StoreHealth,
}

impl Measured {
    /// Wall seconds of the window times K, as hours.
    fn hours(&self) -> f64 {
        self.window.as_secs_f64() * self.k / HOUR
    }

    fn per_hour(&self, n: u64) -> f64 {
        n as f64 / self.hours()
    }
}

/// The default intervals, divided by `k`.
fn compressed(k: f64) -> (WorkerConfig, Duration) {
    let d = WorkerConfig::default();
    let s = |x: Duration| x.div_f64(k);
    let config = WorkerConfig {
        wal_interval: s(d.wal_interval),
        restore_point_interval: s(d.restore_point_interval),
        retention_interval: s(d.retention_interval),
        min_unhealthy_lag: s(d.min_unhealthy_lag),
        first_backoff: s(d.first_backoff),
        max_backoff: s(d.max_backoff),
        refused_retry: s(d.refused_retry),
        ..d
    };
    (config, s(mushroom_backup::lease::DEFAULT_TTL))
}

/// Commits at `rate` per second (0: none), each synced, until `stop`; returns the count.
fn write_at(mut engine: Engine, rate: f64, stop: Arc<AtomicBool>) -> u64 {
    let start = Instant::now();
    let mut written = 0u64;
    while !stop.load(Ordering::Relaxed) {
        if rate <= 0.0 {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        let due = start + Duration::from_secs_f64(written as f64 / rate);
        let now = Instant::now();
        if now < due {
            std::thread::sleep((due - now).min(Duration::from_millis(20)));
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

async fn wait_for(h: &BackupHandle, what: &str, pred: impl Fn(&StoreHealth) -> bool) {
    let mut rx = h.watch_health();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let now = rx.borrow_and_update().clone();
        if pred(&now) {
            return;
        }
        if tokio::time::timeout_at(deadline, rx.changed())
            .await
            .is_err()
        {
            panic!("timed out waiting for {what}; health is {now:#?}");
        }
    }
}

fn snapshot(c: &BackupCounters) -> [u64; 4] {
    let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
    [
        n(&c.durable_commit_seq),
        n(&c.segments_shipped),
        n(&c.restore_points),
        n(&c.lease_acquisitions),
    ]
}

async fn measure(scenario: Scenario, k: f64, window: Duration, root: &Path) -> Measured {
    let dir = tempfile::Builder::new()
        .prefix("mushroom-requests-")
        .tempdir_in(root)
        .expect("temp dir");
    let (store, bucket_dir) = (dir.path().join("store"), dir.path().join("bucket"));
    let mut engine = Engine::open(
        &store,
        EngineOptions {
            group_commit: 0,
            ..EngineOptions::default()
        },
    )
    .expect("open the store");
    for seq in 1..=INITIAL_COMMITS {
        engine
            .commit(&workload_ops(SEED, seq, VALUE_SIZE))
            .expect("commit");
    }
    engine.sync().expect("sync");
    let position = engine.position_handle();
    let stop = Arc::new(AtomicBool::new(false));
    let rate = scenario.commits_per_sec * k;
    let writer = {
        let stop = stop.clone();
        std::thread::spawn(move || write_at(engine, rate, stop))
    };

    let counts = Arc::new(KeyCounts::default());
    let other_lists = Arc::new(AtomicU64::new(0));
    // Requests counted by kind and by what the key is; LISTs of a prefix other than the two
    // retention lists (`manifests/`, `gen/`) apart.
    let bucket: DynBucket = Arc::new(Hooked {
        inner: Arc::new(FsBucket::open(&bucket_dir).expect("open the bucket")),
        hook: {
            let (counts, other_lists) = (counts.clone(), other_lists.clone());
            move |op: Op, key: &str| {
                counts.record(op, key);
                if op == Op::List && key != MANIFESTS_PREFIX && key != GEN_PREFIX {
                    other_lists.fetch_add(1, Ordering::Relaxed);
                }
            }
        },
    });
    let (config, ttl) = compressed(k);
    let wal_interval = config.wal_interval;
    let source = Arc::new(InProcessSource::new(move || position.get()));
    let worker = BackupWorker::new(&store, bucket, source, config);
    let lease = LeaseConfig {
        ttl,
        holder: format!("requests-bench-{}", scenario.name),
        ..LeaseConfig::new(format!("bench-{}", scenario.name))
    };
    let tasks = tokio_util::task::TaskTracker::new();
    let handle = worker.spawn(lease, CancellationToken::new(), &tasks);

    wait_for(&handle, "the first restore point", |h| {
        h.lease_held && h.restore_point_commit_seq >= INITIAL_COMMITS
    })
    .await;
    tokio::time::sleep(WARM_UP.div_f64(k)).await;

    let c = handle.counters();
    let lists0 = other_lists.load(Ordering::Relaxed);
    let (keys0, own0, n0, t0) = (
        counts.snapshot(),
        c.requests.snapshot(),
        snapshot(&c),
        Instant::now(),
    );
    tokio::time::sleep(window).await;
    let lists1 = other_lists.load(Ordering::Relaxed);
    let (keys1, own1, n1, t1) = (
        counts.snapshot(),
        c.requests.snapshot(),
        snapshot(&c),
        Instant::now(),
    );
    let health = handle.health();

    let ended = handle.shutdown(true).await;
    stop.store(true, Ordering::Relaxed);
    let written = writer.join().expect("the writer panicked");
    eprintln!(
        "  [{} K={k}] worker {ended:?}; the writer committed {written} ({:.0}/s asked), \
         wal_interval {wal_interval:?}",
        scenario.name, rate
    );
    let requests = keys1.since(&keys0);
    Measured {
        scenario,
        k,
        window: t1 - t0,
        retention_runs: retention_runs(&requests),
        other_lists: lists1 - lists0,
        commits_per_sec: (n1[0] - n0[0]) as f64 / ((t1 - t0).as_secs_f64() * k),
        requests,
        worker_requests: own1.since(&own0),
        commits: n1[0] - n0[0],
        segments: n1[1] - n0[1],
        restore_points: n1[2] - n0[2],
        lease_acquisitions: n1[3] - n0[3],
        health,
    }
}

/// Retention lists `manifests/` then `gen/` (every object under it, a page per 1000) once a
/// run; nothing else lists `manifests/` in steady state (the resume does, after an
/// acquisition).
fn retention_runs(r: &KeySnapshot) -> u64 {
    r.get(Op::List, Class::Manifest)
}

// ---------------------------------------------------------------------------------------------
// Report

/// DESIGN.md section 5's figures, per hour.
fn expected(scenario: Scenario, kind: Op, class: Option<Class>) -> f64 {
    let busy = scenario.commits_per_sec > 0.0;
    match (kind, class) {
        (Op::Put, Some(Class::Lease)) => 360.0,
        (Op::Put, Some(Class::Segment)) if busy => 3600.0,
        (Op::Put, Some(Class::Manifest)) if busy => 120.0,
        (Op::Put, Some(Class::Latest)) if busy => 120.0,
        _ => 0.0,
    }
}

fn ratio(measured: f64, expected: f64) -> String {
    if expected > 0.0 {
        format!("{:.2}", measured / expected)
    } else if measured > 0.0 {
        "extra".into()
    } else {
        "-".into()
    }
}

/// The classes of a kind's requests, when they are not all of one obvious class.
fn by_class(r: &KeySnapshot, m: &Measured, kind: Op) -> String {
    CLASSES
        .iter()
        .filter(|c| r.get(kind, **c) > 0)
        .map(|c| format!("{} {:.0}", c.name(), m.per_hour(r.get(kind, *c))))
        .collect::<Vec<_>>()
        .join(", ")
}

fn print(m: &Measured) {
    let r = &m.requests;
    let sc = m.scenario;
    println!();
    println!(
        "== {} store, {} commits/s, K = {} ({:.1} s window = {:.2} h of schedule)",
        sc.name,
        sc.commits_per_sec,
        m.k,
        m.window.as_secs_f64(),
        m.hours()
    );
    println!(
        "{:<16}{:>13}{:>13}{:>8}   by key (per hour)",
        "requests", "measured/h", "expected/h", "ratio"
    );
    let row = |label: &str, n: u64, exp: f64, detail: String| {
        let per = m.per_hour(n);
        println!(
            "{label:<16}{per:>13.0}{exp:>13.0}{:>8}   {detail}",
            ratio(per, exp)
        );
    };
    let mut expected_total = 0.0;
    for kind in Op::ALL {
        if kind == Op::Put {
            for class in CLASSES {
                let exp = expected(sc, kind, Some(class));
                expected_total += exp;
                row(
                    &format!("put {}", class.name()),
                    r.get(kind, class),
                    exp,
                    String::new(),
                );
            }
        } else {
            let exp = expected(sc, kind, None);
            expected_total += exp;
            row(kind.name(), r.kind(kind), exp, by_class(r, m, kind));
        }
    }
    row(
        "total",
        r.total(),
        expected_total,
        format!(
            "the worker's own count: {:.0}",
            m.per_hour(m.worker_requests.total)
        ),
    );
    println!(
        "per hour: {:.0} commits, {:.0} segments shipped, {:.0} restore points, \
         {} retention run(s) and {} lease acquisition(s) in the window",
        m.per_hour(m.commits),
        m.per_hour(m.segments),
        m.per_hour(m.restore_points),
        m.retention_runs,
        m.lease_acquisitions
    );
    if sc.commits_per_sec > 0.0 && m.commits_per_sec < 0.9 * sc.commits_per_sec {
        println!(
            "  (the writer reached {:.0} of the {} commits/s asked (fsync-bound); the requests \
             do not depend on the rate as long as every wal_interval has commits)",
            m.commits_per_sec, sc.commits_per_sec
        );
    }
    if sc.commits_per_sec > 0.0 {
        println!(
            "  (DESIGN's 120 manifests/LATEST an hour is twice what its own default \
             restore_point_interval of 60 s gives: 3600 / 60 = 60)"
        );
    }

    let check = |ok: bool, what: String| {
        println!("check {}: {what}", if ok { "ok  " } else { "FAIL" });
    };
    check(
        m.health.healthy,
        format!("healthy at the end of the window ({})", m.health.reason),
    );
    check(
        m.lease_acquisitions == 0,
        format!(
            "the lease was held throughout ({} acquisitions)",
            m.lease_acquisitions
        ),
    );
    // Only the resume (after an acquisition) and retention list; retention lists
    // `manifests/` and `gen/`, page by page.
    check(
        m.other_lists == 0 && m.lease_acquisitions == 0,
        format!(
            "no LIST besides retention's: {} LIST in {} retention run(s) (retention_interval \
             1 h; {} of manifests/, {} of gen/, which grows with every segment kept)",
            r.kind(Op::List),
            m.retention_runs,
            r.get(Op::List, Class::Manifest),
            r.kind(Op::List) - r.get(Op::List, Class::Manifest) - m.other_lists,
        ),
    );
    if sc.commits_per_sec == 0.0 {
        let lease_puts = r.get(Op::Put, Class::Lease);
        let others = r.total() - lease_puts - r.kind(Op::List);
        check(
            others == 0,
            format!(
                "idle: nothing but lease renewals (and retention's LISTs): {others} other requests"
            ),
        );
    }
    let renew_every = mushroom_backup::lease::DEFAULT_TTL.as_secs_f64() / 3.0;
    let renewals = m.per_hour(r.get(Op::Put, Class::Lease));
    check(
        renewals <= HOUR / renew_every * 1.05,
        format!(
            "lease renewals no more often than TTL/3: {renewals:.0}/h, at most {:.0}/h",
            HOUR / renew_every
        ),
    );
    if m.worker_requests.total != r.total() {
        println!(
            "note: the bench's count ({}) and the worker's ({}) differ by requests started \
             between the two snapshots",
            r.total(),
            m.worker_requests.total
        );
    }
}

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v} does not parse")),
        Err(_) => default,
    }
}

fn main() {
    let k: f64 = env("MUSHROOM_BENCH_K", 20.0);
    let secs: f64 = env("MUSHROOM_BENCH_SECS", 180.0);
    let real = env("MUSHROOM_BENCH_REAL", 0u8) == 1;
    let real_secs: f64 = env("MUSHROOM_BENCH_REAL_SECS", 180.0);
    let only: String = env("MUSHROOM_BENCH_ONLY", String::new());
    let root: PathBuf = env("MUSHROOM_BENCH_DIR", std::env::temp_dir());
    assert!(k >= 1.0, "MUSHROOM_BENCH_K must be at least 1");
    let scenarios: Vec<Scenario> = [IDLE, BUSY]
        .into_iter()
        .filter(|s| only.is_empty() || s.name == only)
        .collect();
    let mut runs = vec![(k, secs)];
    if real {
        runs.push((1.0, real_secs));
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    println!(
        "bucket requests per hour of a spawned worker (FsBucket in {})",
        root.display()
    );
    for (k, secs) in runs {
        for s in &scenarios {
            let m = rt.block_on(measure(*s, k, Duration::from_secs_f64(secs), &root));
            print(&m);
        }
    }
}
