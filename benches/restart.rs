//! The first acknowledgement after a restart of `serve` (issue 40, finding 7): how long a busy
//! `durability = sync` store acknowledges nothing once `serve` was SIGKILLed and started again.
//!
//! For each load of `LOADS` (default `10,30,60` seconds) and each path of `PATHS` (default
//! `moto,proxy`), one case on a fresh prefix of one moto (loopback) and a fresh data directory:
//!
//! 1. The release binary's `serve` with its S3 either straight at moto (`moto`) or through the
//!    fault proxy of `tests/support/fault_proxy.rs` in front of the same moto (`proxy`: its
//!    default plan, 5 % `503 SlowDown`, 3 % dropped after taking effect, 2 % delayed 200–800
//!    ms; its seed is printed, `MUSHROOM_FAULT_SEED` replays it). A store of the reference
//!    engine is registered with `durability = sync`, `wal_puts_per_second` `CAP` (default 200)
//!    and `restore_point_interval_ms` of an hour: past the generation's first restore point
//!    the whole load is backlog behind the newest restore point.
//! 2. This process opens the store (it holds `store.lock`, as a node does) and commits
//!    `VALUE_BYTES` (default 512) values at `RATE` (default 200) a second, each fsynced and
//!    reported through a [`NodeClient`], for the load's seconds after the first restore point.
//!    In its last second the acknowledgement must have moved (printed: acks flowing or not).
//! 3. The host's crash: `serve` SIGKILLed, the node client dropped unclosed (a killed node
//!    loses its stream; the engine is kept, as a restarted node reopens the same store and
//!    goes on committing, and the committer never pauses). Then at once `serve` is started
//!    again on the same data directory and arguments: it takes its store back from the
//!    registry under the data directory (the same instance id, proven dead by the data
//!    directory's lock: no lease TTL to wait out), and a new node client connects with the
//!    same store id and token as soon as the new address is known (its listening line).
//! 4. **first_ack**: from the new `serve`'s spawn until the node's durable watch first covers
//!    a commit made after the spawn (a `commit_seq` above every commit made until then, so
//!    above everything acknowledged before the kill). Printed beside it, all from the spawn:
//!    `listening` (its listening line read), `connected` (the new stream accepted),
//!    `first_durable` (the new stream's first `Durable` of any position, with how far it
//!    reached against the last ack before the kill); the requests moto logged under the
//!    prefix between the kill and the first ack (`gets` object GETs, `lists`, `puts`); and
//!    `backlog_segments`: WAL segments in the bucket at the kill past the newest restore point
//!    then (segment PUTs answered 200 in moto's log before the kill, in the newest restore
//!    point's generation, starting at or after its segments' end).
//!
//! Goal (issue 40): first_ack at most 2 s in every case. A case with no acknowledgement
//! within `NO_ACK_SECS` (default 120) says so and the run goes on. The exit code is 0 unless
//! the run itself failed (a `serve` that did not start, a store that never acknowledged
//! before the kill).
//!
//! `NODE_DELAY_MS` (default 0) holds the node's new client back that long after the new
//! `serve`'s spawn (the issue saw a node restarted 3 to 5 s after the service, through the
//! fault proxy, get no acknowledgement at all).
//!
//! `cargo bench --bench restart`; e.g. `LOADS=10 PATHS=moto,proxy cargo bench --bench restart`.
//! `RESTART_DIR` puts stores and data directories in that directory (e.g. `/dev/shm`: the
//! disk's fsyncs out of the commit rate); `MUSHROOMDB_BACKUP_LOG` sets the servers' log
//! filter; `RESTART_KEEP=1` keeps the work directory (the servers' logs, moto's) and prints it.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;

use mushroom_backup::bucket::Bucket;
use mushroom_backup::bucket::s3::{S3Bucket, S3Options};
use mushroom_backup::manifest::{self, Manifest};
use mushroom_backup::node_client::{DurableView, NodeClient, NodeClientConfig};
use mushroom_backup::service::proto::backup_control_client::BackupControlClient;
use mushroom_backup::service::proto::{self, RegisterRequest};
use mushroom_backup::store::engine::{Engine, EngineOptions, Op};

#[path = "../tests/support/fault_proxy.rs"]
#[allow(dead_code)]
mod fault_proxy;
#[path = "support/moto.rs"]
#[allow(dead_code)]
mod moto;
#[path = "support/serve.rs"]
mod serve;
use fault_proxy::{FaultCounts, FaultPlan, FaultProxy};
use serve::{Server, env_or, s3_client};

const BUCKET: &str = "restart-bench";
/// Longer than any load: the only restore point of a case is its generation's first.
const RESTORE_POINT_INTERVAL_MS: u64 = 3_600_000;
/// The goal of issue 40: the first acknowledgement at most this long after the restart.
const GOAL: Duration = Duration::from_secs(2);

/// Where `serve`'s S3 requests go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum S3Path {
    /// Straight to moto.
    Moto,
    /// Through the fault proxy in front of moto.
    Proxy,
}

impl S3Path {
    fn parse(s: &str) -> anyhow::Result<S3Path> {
        match s.trim() {
            "moto" => Ok(S3Path::Moto),
            "proxy" => Ok(S3Path::Proxy),
            other => anyhow::bail!("PATHS: {other:?} is not one of moto, proxy"),
        }
    }

    fn name(self) -> &'static str {
        match self {
            S3Path::Moto => "moto",
            S3Path::Proxy => "proxy",
        }
    }
}

/// What every case shares.
struct Bench {
    moto: moto::Moto,
    proxy: Option<FaultProxy>,
    /// moto straight, for reading a restore point back.
    client: aws_sdk_s3::Client,
    work: PathBuf,
    rate: f64,
    value_bytes: usize,
    cap: u32,
    no_ack: Duration,
    /// How long after the new `serve`'s spawn the node's new client connects (at the
    /// earliest: once the new address is known).
    node_delay: Duration,
}

/// One case's figures; durations from the new `serve`'s spawn.
struct Outcome {
    load: u64,
    path: S3Path,
    /// `None`: no acknowledgement of a commit made after the spawn within `NO_ACK_SECS`.
    first_ack: Option<Duration>,
    listening: Duration,
    connected: Option<Duration>,
    /// The new stream's first `Durable` (any position): when, and the `commit_seq` it covered.
    first_durable: Option<(Duration, u64)>,
    /// The highest acknowledgement before the kill, and the last commit made before the spawn.
    acked_before_kill: u64,
    committed_at_spawn: u64,
    /// Requests moto logged under the prefix from the kill until the first ack (or the timeout).
    requests: Requests,
    /// Segments past the newest restore point at the kill, `None` when it could not be told.
    backlog_segments: Option<usize>,
    /// The fault proxy's counts over the same span (proxy cases).
    faults: Option<FaultCounts>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Requests {
    gets: usize,
    lists: usize,
    puts: usize,
    total: usize,
}

impl Outcome {
    fn print(&self) {
        let secs = |d: Duration| format!("{:.2} s", d.as_secs_f64());
        let first_ack = match self.first_ack {
            Some(d) => format!(
                "{} (goal <= 2 s: {})",
                secs(d),
                if d <= GOAL { "met" } else { "missed" }
            ),
            None => "none (goal <= 2 s: missed)".to_string(),
        };
        let first_durable = match self.first_durable {
            Some((d, seq)) => format!(
                "{} (commit {seq}, {:+} against the last ack before the kill)",
                secs(d),
                i128::from(seq) - i128::from(self.acked_before_kill)
            ),
            None => "none".to_string(),
        };
        let backlog = self
            .backlog_segments
            .map_or_else(|| "?".to_string(), |n| n.to_string());
        let r = self.requests;
        println!(
            "restart load={}s path={} first_ack={first_ack} listening={} connected={} \
             first_durable={first_durable} gets={} lists={} puts={} requests={} \
             backlog_segments={backlog}",
            self.load,
            self.path.name(),
            secs(self.listening),
            self.connected.map_or_else(|| "never".to_string(), secs),
            r.gets,
            r.lists,
            r.puts,
            r.total,
        );
        println!(
            "  last ack before the kill: commit {}; last commit before the spawn: {}",
            self.acked_before_kill, self.committed_at_spawn
        );
        if let Some(f) = self.faults {
            println!(
                "  fault proxy from the kill to the first ack: {} requests, {} 503 SlowDown, {} \
                 dropped after forwarding, {} delayed",
                f.requests, f.slow_down, f.dropped, f.delayed
            );
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let loads: Vec<u64> = list_from("LOADS", "10,30,60")?
        .iter()
        .map(|l| l.parse().with_context(|| format!("LOADS: {l:?}")))
        .collect::<anyhow::Result<_>>()?;
    let paths: Vec<S3Path> = list_from("PATHS", "moto,proxy")?
        .iter()
        .map(|p| S3Path::parse(p))
        .collect::<anyhow::Result<_>>()?;
    let base = std::env::var_os("RESTART_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
    let work = tempfile::Builder::new()
        .prefix("mushroom-restart-bench-")
        .tempdir_in(&base)?;
    let moto = moto::Moto::start(&work.path().join("moto.log"))?;
    let client = s3_client(&moto.url);
    client.create_bucket().bucket(BUCKET).send().await?;
    let proxy = paths
        .contains(&S3Path::Proxy)
        .then(|| FaultProxy::start(&moto.url, FaultPlan::default()));
    let bench = Bench {
        proxy,
        client,
        work: work.path().to_path_buf(),
        rate: env_or("RATE", 200.0)?,
        value_bytes: env_or("VALUE_BYTES", 512)?,
        cap: env_or("CAP", 200)?,
        no_ack: Duration::from_secs(env_or("NO_ACK_SECS", 120)?),
        node_delay: Duration::from_millis(env_or("NODE_DELAY_MS", 0)?),
        moto,
    };
    println!(
        "restart of serve under load: durability = sync, wal_puts_per_second {} (CAP), {} \
         commits/s (RATE) of {} bytes (VALUE_BYTES), restore point interval {} s, the node back \
         {} ms after serve (NODE_DELAY_MS); loads {loads:?} s, paths {:?}{}",
        bench.cap,
        bench.rate,
        bench.value_bytes,
        RESTORE_POINT_INTERVAL_MS / 1000,
        bench.node_delay.as_millis(),
        paths.iter().map(|p| p.name()).collect::<Vec<_>>(),
        bench.proxy.as_ref().map_or_else(String::new, |p| format!(
            "; fault proxy seed {} (replay with {}={})",
            p.seed(),
            fault_proxy::SEED_ENV,
            p.seed()
        )),
    );

    let mut outcomes = Vec::new();
    let mut failed = Vec::new();
    for &load in &loads {
        for &path in &paths {
            match bench.case(load, path).await {
                Ok(o) => {
                    o.print();
                    outcomes.push(o);
                }
                Err(e) => {
                    println!("restart load={load}s path={} FAILED: {e:#}", path.name());
                    failed.push(format!("load={load}s path={}", path.name()));
                }
            }
        }
    }

    println!("summary (goal: first ack <= 2 s after the restart in every case):");
    for o in &outcomes {
        println!(
            "  load {:>3} s  {:<5}  first ack {:>8}  backlog {:>6} segments  {:>6} GETs  {}",
            o.load,
            o.path.name(),
            o.first_ack.map_or_else(
                || "none".to_string(),
                |d| format!("{:.2} s", d.as_secs_f64())
            ),
            o.backlog_segments
                .map_or_else(|| "?".to_string(), |n| n.to_string()),
            o.requests.gets,
            if o.first_ack.is_some_and(|d| d <= GOAL) {
                "met"
            } else {
                "missed"
            }
        );
    }
    let met = outcomes
        .iter()
        .filter(|o| o.first_ack.is_some_and(|d| d <= GOAL))
        .count();
    println!(
        "  goal met in {met} of {} cases{}",
        outcomes.len() + failed.len(),
        if failed.is_empty() {
            String::new()
        } else {
            format!("; failed to run: {}", failed.join(", "))
        }
    );
    if std::env::var("RESTART_KEEP").is_ok_and(|v| v == "1") {
        println!("work directory kept: {}", work.keep().display());
    }
    anyhow::ensure!(failed.is_empty(), "{} cases failed to run", failed.len());
    Ok(())
}

impl Bench {
    /// One case: load, kill, restart, first acknowledgement (see the module docs).
    async fn case(&self, load: u64, path: S3Path) -> anyhow::Result<Outcome> {
        let name = format!("l{load}-{}", path.name());
        let stores = self.work.join("stores");
        let dir = stores.join(&name);
        std::fs::create_dir_all(&dir)?;
        let data = self.work.join(format!("data-{name}"));
        let endpoint = match (path, &self.proxy) {
            (S3Path::Proxy, Some(p)) => p.url().to_string(),
            _ => self.moto.url.clone(),
        };
        let mut env = vec![
            ("AWS_ENDPOINT_URL", endpoint),
            ("AWS_REGION", "us-east-1".to_string()),
            ("AWS_ACCESS_KEY_ID", "test".to_string()),
            ("AWS_SECRET_ACCESS_KEY", "test".to_string()),
            ("MUSHROOMDB_BACKUP_S3_PATH_STYLE", "true".to_string()),
        ];
        if let Ok(filter) = std::env::var("MUSHROOMDB_BACKUP_LOG") {
            env.push(("MUSHROOMDB_BACKUP_LOG", filter));
        }
        let log = |n: u32| self.work.join(format!("serve-{name}-{n}.log"));
        let mut server = start_server(&data, &stores, &log(1), &env).await?;

        let mut control = BackupControlClient::connect(format!("http://{}", server.addr)).await?;
        let registered = control
            .register(RegisterRequest {
                store_dir: dir.to_str().context("utf-8 path")?.to_string(),
                destination: format!("s3://{BUCKET}/{name}"),
                options: Some(proto::StoreOptions {
                    durability: proto::Durability::Sync as i32,
                    wal_puts_per_second: self.cap,
                    restore_point_interval_ms: RESTORE_POINT_INTERVAL_MS,
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await?
            .into_inner();
        drop(control);
        let config = |addr: &str| {
            NodeClientConfig::new(
                format!("http://{addr}"),
                registered.store_id.clone(),
                registered.node_token.clone(),
            )
        };

        let engine = Engine::open(
            &dir,
            EngineOptions {
                group_commit: 0,
                ..Default::default()
            },
        )?;
        let node = Arc::new(NodeClient::connect(config(&server.addr))?);
        node.report(engine.position());
        node.wait_connected(Duration::from_secs(30)).await?;
        // The generation's first restore point: from here on everything shipped is backlog.
        node.wait_durable(engine.commit_seq(), Duration::from_secs(60))
            .await
            .context("the store's first restore point")?;

        let committer = Arc::new(Committer::default());
        *committer.node.lock().unwrap() = Some(node.clone());
        let commits = {
            let (c, rate, bytes) = (committer.clone(), self.rate, self.value_bytes);
            tokio::task::spawn_blocking(move || c.run(engine, rate, bytes))
        };
        // A sync node listens for acknowledgements all along (its reports go at once).
        let listening_before = node.durable();
        let loaded_from = (Instant::now(), committer.last.load(Ordering::SeqCst));
        tokio::time::sleep(Duration::from_secs(load.saturating_sub(1))).await;
        let second_last = acked(&listening_before);
        tokio::time::sleep(Duration::from_secs(1.min(load))).await;

        // The crash: serve and the node's stream at once; the committer goes on.
        let acked_before_kill = acked(&listening_before);
        let committed = committer.last.load(Ordering::SeqCst);
        server.kill()?;
        *committer.node.lock().unwrap() = None;
        drop((node, listening_before));
        // An offset into moto's log, not a read of it: the restart must not wait for that.
        let killed_at = self.moto.log_len();
        let faults_before = self.proxy.as_ref().map(FaultProxy::counts);
        let elapsed = loaded_from.0.elapsed().as_secs_f64();
        println!(
            "load={load}s path={}: {:.0} commits/s over {elapsed:.1} s; at the kill commit \
             {committed}, acked {acked_before_kill} ({} behind), acks {} in the last second \
             (+{})",
            path.name(),
            (committed - loaded_from.1) as f64 / elapsed,
            committed.saturating_sub(acked_before_kill),
            if acked_before_kill > second_last {
                "flowing"
            } else {
                "NOT flowing"
            },
            acked_before_kill.saturating_sub(second_last),
        );
        if let Err(e) = commits_running(&commits) {
            anyhow::bail!("the committer stopped: {e}");
        }

        // The restart: same data directory, same arguments; a new node client as soon as the
        // new address is known.
        let spawned = Instant::now();
        let committed_at_spawn = committer.last.load(Ordering::SeqCst);
        let server = start_server(&data, &stores, &log(2), &env).await;
        let listening = spawned.elapsed();
        let server = match server {
            Ok(s) => s,
            Err(e) => {
                committer.stop.store(true, Ordering::SeqCst);
                let _ = commits.await;
                return Err(e.context("the restarted serve"));
            }
        };
        // A node that comes back later than the service (`NODE_DELAY_MS`).
        tokio::time::sleep(self.node_delay.saturating_sub(spawned.elapsed())).await;
        let node = Arc::new(NodeClient::connect(config(&server.addr))?);
        let mut durable = node.durable();
        *committer.node.lock().unwrap() = Some(node.clone());
        let connected = {
            let node = node.clone();
            let timeout = self.no_ack;
            tokio::spawn(async move {
                node.wait_connected(timeout)
                    .await
                    .ok()
                    .map(|()| spawned.elapsed())
            })
        };
        let mut first_durable = None;
        let mut first_ack = None;
        let deadline = tokio::time::Instant::from_std(spawned + self.no_ack);
        while first_ack.is_none() {
            match tokio::time::timeout_at(deadline, durable.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => break,
            }
            let at = spawned.elapsed();
            let Some(ack) = durable.borrow_and_update().ack else {
                continue;
            };
            if first_durable.is_none() {
                first_durable = Some((at, ack.commit_seq));
            }
            if ack.commit_seq > committed_at_spawn {
                first_ack = Some(at);
            }
        }
        let acked_at = self.moto.log_len();
        let faults = match (&self.proxy, faults_before) {
            (Some(p), Some(before)) if path == S3Path::Proxy => Some(diff(&before, &p.counts())),
            _ => None,
        };
        let connected = connected.await.unwrap_or(None);

        committer.stop.store(true, Ordering::SeqCst);
        commits.await??;
        node.close().await;
        drop(server);

        let requests = requests_in(&self.moto.request_lines_in(killed_at..acked_at), &name);
        let bucket = S3Bucket::new(self.client.clone(), BUCKET, &name, S3Options::default());
        let killed_lines = self.moto.request_lines_in(0..killed_at);
        let backlog_segments = match backlog(&bucket, &killed_lines, &name).await {
            Ok(n) => Some(n),
            Err(e) => {
                println!("  backlog at the kill not told: {e:#}");
                None
            }
        };
        Ok(Outcome {
            load,
            path,
            first_ack,
            listening,
            connected,
            first_durable,
            acked_before_kill,
            committed_at_spawn,
            requests,
            backlog_segments,
            faults,
        })
    }
}

/// `serve` started (see [`Server::start_with_env`]) off the runtime's threads: it blocks until
/// the listening line.
async fn start_server(
    data: &Path,
    root: &Path,
    log: &Path,
    env: &[(&'static str, String)],
) -> anyhow::Result<Server> {
    let (data, root, log, env) = (
        data.to_path_buf(),
        root.to_path_buf(),
        log.to_path_buf(),
        env.to_vec(),
    );
    tokio::task::spawn_blocking(move || Server::start_with_env(&data, &root, &log, "", &env))
        .await?
}

/// The node side: commits at a steady rate until stopped, each reported through the node
/// client of the moment (none while the node is "down").
#[derive(Default)]
struct Committer {
    node: Mutex<Option<Arc<NodeClient>>>,
    stop: AtomicBool,
    /// The last commit made (fsynced).
    last: AtomicU64,
}

impl Committer {
    /// Commits `bytes`-byte values at `rate` a second (on a schedule from the first, catching
    /// up when late), each fsynced, until `stop`.
    fn run(&self, mut engine: Engine, rate: f64, bytes: usize) -> anyhow::Result<()> {
        let value = vec![b'v'; bytes];
        let start = Instant::now();
        let mut n = 0u64;
        while !self.stop.load(Ordering::SeqCst) {
            let due = start + Duration::from_secs_f64(n as f64 / rate);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            let seq = engine.commit_seq() + 1;
            engine.commit(&[Op::Put {
                key: format!("k{}", seq % 1000).into_bytes(),
                value: value.clone(),
            }])?;
            let position = engine.sync()?;
            self.last.store(position.commit_seq, Ordering::SeqCst);
            if let Some(node) = self.node.lock().unwrap().as_ref() {
                node.report(position);
            }
            n += 1;
        }
        Ok(())
    }
}

/// The highest acknowledgement of the watch's epoch (0 before its first).
fn acked(rx: &tokio::sync::watch::Receiver<DurableView>) -> u64 {
    rx.borrow().ack.map_or(0, |a| a.commit_seq)
}

/// An error if the committer's task already ended (it runs until told to stop).
fn commits_running(task: &tokio::task::JoinHandle<anyhow::Result<()>>) -> anyhow::Result<()> {
    anyhow::ensure!(!task.is_finished(), "it ended early");
    Ok(())
}

/// One request of moto's log: method, path (with query), status.
fn parse_request(line: &str) -> Option<(&str, &str, u16)> {
    let (_, rest) = line.split_once('"')?;
    let (request, after) = rest.split_once('"')?;
    let mut parts = request.split(' ');
    let (method, path) = (parts.next()?, parts.next()?);
    let status = after.split_whitespace().next()?.parse().ok()?;
    Some((method, path, status))
}

/// The requests among `lines` for the prefix `prefix` of the bench bucket, by kind.
fn requests_in(lines: &[String], prefix: &str) -> Requests {
    let objects = format!("/{BUCKET}/{prefix}/");
    // moto logs a LIST's prefix as the client sent it: the SDK leaves its `/`s unencoded.
    let listed = [format!("prefix={prefix}/"), format!("prefix={prefix}%2F")];
    let mut r = Requests::default();
    for (method, path, _) in lines.iter().filter_map(|l| parse_request(l)) {
        let object = path.starts_with(&objects);
        if !object && !listed.iter().any(|l| path.contains(l.as_str())) {
            continue;
        }
        r.total += 1;
        match method {
            "GET" if object => r.gets += 1,
            "GET" => r.lists += 1,
            "PUT" => r.puts += 1,
            _ => {}
        }
    }
    r
}

/// WAL segments in the bucket at the kill past the newest restore point then: of the
/// segment PUTs moto answered 200 before the kill (`lines`), those in the newest restore
/// point's generation starting at or after its segments' end (the restore point read back).
async fn backlog(bucket: &S3Bucket, lines: &[String], prefix: &str) -> anyhow::Result<usize> {
    let objects = format!("/{BUCKET}/{prefix}/");
    let written: Vec<&str> = lines
        .iter()
        .filter_map(|l| parse_request(l))
        .filter(|(method, _, status)| *method == "PUT" && *status == 200)
        .filter_map(|(_, path, _)| path.strip_prefix(&objects))
        .map(|key| key.split_once('?').map_or(key, |(k, _)| k))
        .collect();
    let newest = written
        .iter()
        .filter_map(|k| manifest::parse_manifest_key(k))
        .max()
        .context("no restore point before the kill")?;
    let key = manifest::manifest_key(newest);
    let restore_point = Manifest::decode(&key, &bucket.get(&key).await?.data)?;
    let (generation, end) = (restore_point.generation, restore_point.segments_end());
    let segments: std::collections::BTreeSet<(u64, u64)> = written
        .iter()
        .filter_map(|k| manifest::parse_segment_key(generation, k))
        .filter(|(start, _)| *start >= end)
        .collect();
    Ok(segments.len())
}

fn diff(before: &FaultCounts, after: &FaultCounts) -> FaultCounts {
    FaultCounts {
        requests: after.requests - before.requests,
        forwarded: after.forwarded - before.forwarded,
        slow_down: after.slow_down - before.slow_down,
        dropped: after.dropped - before.dropped,
        delayed: after.delayed - before.delayed,
        upstream_errors: after.upstream_errors - before.upstream_errors,
        answered_bytes: after.answered_bytes - before.answered_bytes,
        refused_down: after.refused_down - before.refused_down,
    }
}

/// `var`'s items (separated by commas, blanks dropped), else `default`'s.
fn list_from(var: &str, default: &str) -> anyhow::Result<Vec<String>> {
    let items: Vec<String> = std::env::var(var)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    anyhow::ensure!(!items.is_empty(), "{var} names nothing");
    Ok(items)
}
