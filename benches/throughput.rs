//! Backup and restore throughput against S3, each next to plain S3 requests of the same bytes.
//!
//! Run with `cargo bench --bench throughput`. It needs an S3 endpoint: the bench starts its own
//! `moto_server` from the crate's `.venv` (run `scripts/test.sh` once to create it) on a free
//! loopback port, or uses `MUSHROOM_TEST_S3_ENDPOINT` if that is set.
//!
//! # What is measured
//!
//! The bench writes one store with the reference engine: two snapshots, then a long stretch of
//! commits with rotations, so that a backup ships a snapshot, several archives and one large
//! WAL segment (plus the small objects: GENERATION, side files, manifest, LATEST). Then, for
//! each repetition, with a fresh prefix each time:
//!
//! - **backup**: a new `BackupWorker` and its `run_once()`, over the stack `bucket::open`
//!   builds (`Retrying` over `S3Bucket` with default options). The time covers everything one
//!   run does: resume (LIST, GET LATEST), reading and checking the local files, the uploads
//!   (multipart above the threshold), the manifest, LATEST and retention.
//! - **`S3Bucket::put`, worker's shape**: the objects that backup wrote (listed under its
//!   prefix, the same bytes) through the library's S3 layer alone, under `If-None-Match: *`,
//!   in the order and with the concurrency the worker uses (a generation's snapshot, archives
//!   and side files `worker::GENERATION_UPLOADS_IN_FLIGHT` at a time, everything else one at a
//!   time; a body above the multipart threshold as a multipart upload with 4 parts in
//!   flight), and in the worker's form: a snapshot or an archive streamed from a file holding
//!   its bytes (written before any timing), with its CRC-32 as the request's checksum, the rest
//!   from memory. It separates what the worker adds (resume, local reads and checks, manifest,
//!   LATEST, retention) from what the S3 layer adds or saves (the condition, checksums, and
//!   above the threshold multipart with its HEAD).
//! - **plain PUT, worker's shape**: the same bytes as plain `PutObject`s in the same shape, an
//!   object above the multipart threshold as part-size `PutObject`s with 4 in flight. No HEADs, no
//!   multipart create/complete, no local reads: only the bytes on the wire. Each body is the
//!   SDK's `ByteStream` of bytes in memory, which the SDK hashes twice before sending: CRC-32 for
//!   the checksum header and SHA-256 to sign the payload. The library's streamed uploads do
//!   neither (a streamed body goes unsigned, as the SDK sends every streamed body, and its
//!   CRC-32 is the one the worker's check computed), which is why backup can exceed 1.0.
//! - **plain PUT, N in flight**: the same part-size pieces of all objects at once, N in
//!   flight: about what the endpoint takes at best.
//! - **restore**: `restore::restore` of the newest restore point into a fresh directory
//!   (default options, so parallelism 8). Covers the plan (GET LATEST, the manifest, LIST of
//!   later segments), the download with CRC checks, the read-back of every file by the format's
//!   reader (overlapped with the download), the fsync of every file and directory, and the
//!   rename. The reference engine's own reading (`RestoreOptions::engine_check`) is not part of
//!   a default restore and so not measured.
//! - **plain GET**: the objects that restore point names, with the same parallelism and the
//!   same ranged GETs of [`RANGE_CHUNK`], each written with `pwrite` into a file of its own in a
//!   fresh directory; every file, then the directory, is fsynced, as restore does.
//!
//! # Reading the figures
//!
//! Throughput is the bytes of the objects (the same bytes on both sides of a ratio) over wall
//! time. `backup/plain` is the median throughput of backup over that of the worker-shaped plain
//! PUTs (the line after it splits that into the worker's share and the S3 layer's);
//! `restore/plain` that of restore over the plain GETs. 1.0 means the library costs
//! nothing beyond the requests it has to make; the target is 0.9 or more. The best-case PUT line
//! is headroom that sending more at once would reach, not an overhead of the library. The
//! `cores` columns are CPU seconds per wall second of the bench process and of the moto it
//! started (1.0 is one core busy; moto's Python runs about one core at most), so they show
//! which side was busy. The request table after each measurement says where the time of one
//! run went (time summed over calls, so more than the wall time where calls overlap). The
//! ratios of each repetition follow (backup and plain PUTs of one repetition ran seconds
//! apart at most, so moto's drift over a run touches both), with their median.
//!
//! moto is a Python server on the same machine, competing with the bench for CPU: absolute
//! figures say more about moto than about S3. The ratios are the point. So that neither side
//! of a ratio pays for moto's state left by the other, every measurement starts after a
//! `sync` (moto's temporary files written back) and, for the restore and the plain GETs, after
//! an untimed read of every object they fetch (moto's first read of an object after its PUT
//! is slower by half).
//!
//! # Settings (environment)
//!
//! | variable                        | default          | meaning                                |
//! |---------------------------------|------------------|----------------------------------------|
//! | `MUSHROOM_BENCH_COMMITS`        | 680000           | commits after the second snapshot      |
//! | `MUSHROOM_BENCH_VALUE_SIZE`     | 256              | bytes per value                        |
//! | `MUSHROOM_BENCH_ROTATE_BYTES`   | 16777216         | WAL rotation size (archive size)       |
//! | `MUSHROOM_BENCH_REPEATS`        | 9                | repetitions of every measurement       |
//! | `MUSHROOM_BENCH_CONCURRENCY`    | 8                | requests in flight, best-case PUT line |
//! | `MUSHROOM_BENCH_DIR`            | the temp dir     | where the store and restores are made  |

#[allow(dead_code)]
#[path = "../tests/support/s3.rs"]
mod s3_support;

use std::collections::BTreeMap;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use aws_sdk_s3::Client;
use aws_sdk_s3::primitives::ByteStream;
use bytes::Bytes;
use futures::{StreamExt, TryFutureExt, TryStreamExt};
use mushroom_backup::bucket::retry::{RetryPolicy, Retrying};
use mushroom_backup::bucket::s3::{S3Bucket, S3Options};
use mushroom_backup::bucket::{
    Body, Bucket, BucketError, DynBucket, ListPage, ListQuery, Object, ObjectMeta, PutCondition,
    PutOpts, list_all,
};
use mushroom_backup::manifest::{self, Latest, Manifest};
use mushroom_backup::restore::stage::RANGE_CHUNK;
use mushroom_backup::restore::{self, RestoreOptions};
use mushroom_backup::store::engine::{self, WriteOptions};
use mushroom_backup::wal_source::LocalSource;
use mushroom_backup::worker::{BackupWorker, WorkerConfig};
use tokio_util::sync::CancellationToken;

const MIB: f64 = 1024.0 * 1024.0;
/// Commits between the two snapshots written before the measured stretch.
const SNAPSHOT_EVERY: u64 = 10_000;
const TARGET_RATIO: f64 = 0.9;
/// Objects of one generation the worker uploads at once (`src/worker/generation.rs`): the
/// shape the baselines copy.
const WORKER_UPLOADS_IN_FLIGHT: usize = mushroom_backup::worker::GENERATION_UPLOADS_IN_FLIGHT;

/// What the environment asks for; see the module docs.
struct Settings {
    commits: u64,
    value_size: usize,
    rotate_bytes: u64,
    repeats: usize,
    concurrency: usize,
    dir: PathBuf,
}

impl Settings {
    fn from_env() -> Result<Settings> {
        fn var<T: std::str::FromStr>(name: &str, default: T) -> Result<T> {
            match std::env::var(name) {
                Ok(v) => v
                    .parse()
                    .map_err(|_| anyhow::anyhow!("{name}={v:?} is not a valid number")),
                Err(_) => Ok(default),
            }
        }
        let s = Settings {
            commits: var("MUSHROOM_BENCH_COMMITS", 680_000)?,
            value_size: var("MUSHROOM_BENCH_VALUE_SIZE", 256)?,
            rotate_bytes: var("MUSHROOM_BENCH_ROTATE_BYTES", 16 << 20)?,
            repeats: var("MUSHROOM_BENCH_REPEATS", 9)?,
            concurrency: var("MUSHROOM_BENCH_CONCURRENCY", 8)?,
            dir: std::env::var_os("MUSHROOM_BENCH_DIR")
                .map_or_else(std::env::temp_dir, PathBuf::from),
        };
        ensure!(s.repeats >= 1, "MUSHROOM_BENCH_REPEATS must be at least 1");
        ensure!(
            s.concurrency >= 1,
            "MUSHROOM_BENCH_CONCURRENCY must be at least 1"
        );
        Ok(s)
    }
}

/// The S3 endpoint: `MUSHROOM_TEST_S3_ENDPOINT`, else a moto started from `.venv`.
fn endpoint() -> Result<String> {
    if let Ok(url) = std::env::var(s3_support::ENDPOINT_ENV) {
        return Ok(url);
    }
    let moto = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/moto_server");
    if !moto.exists() {
        bail!(
            "{} is missing: run scripts/test.sh first (it creates .venv with moto), \
             or set {} to a running S3 endpoint",
            moto.display(),
            s3_support::ENDPOINT_ENV
        );
    }
    s3_support::endpoint().context("no S3 endpoint")
}

#[tokio::main]
async fn main() -> Result<()> {
    let settings = Settings::from_env()?;
    let endpoint = endpoint()?;
    let client = s3_support::client(&endpoint);
    let bucket = s3_support::create_bucket(&endpoint, "bench").await;
    let work = tempfile::Builder::new()
        .prefix("mushroom-bench-")
        .tempdir_in(&settings.dir)
        .with_context(|| format!("create a directory in {}", settings.dir.display()))?;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "machine: {cpus} CPUs; S3 at {endpoint}; files in {} ({})",
        work.path().display(),
        fs_kind(work.path())
    );

    let store = work.path().join("store");
    let started = Instant::now();
    write_store(&store, &settings)?;
    println!(
        "store: {} commits of {}-byte values after two snapshots, rotating at {} MiB; {:.1} MiB on \
         disk, written in {:.1} s",
        settings.commits,
        settings.value_size,
        settings.rotate_bytes as f64 / MIB,
        dir_bytes(&store)? as f64 / MIB,
        started.elapsed().as_secs_f64()
    );

    let s3 = S3Options::default();
    let bench = Bench {
        client,
        bucket,
        store,
        work: work.path().to_path_buf(),
        part_size: s3.part_size,
        multipart_threshold: s3.multipart_threshold,
        upload_concurrency: s3.upload_concurrency,
        concurrency: settings.concurrency,
        restore_parallelism: RestoreOptions::default().parallelism,
        repeats: settings.repeats,
        s3,
    };
    let mut results = Results::default();
    let items = bench.warm_up(&mut results).await?;
    for rep in 0..settings.repeats {
        bench.repetition(rep, &items, &mut results).await?;
    }
    results.print(&bench);
    Ok(())
}

/// Two snapshots, then `commits` commits with rotations and no snapshot: every WAL file after
/// the second snapshot is shipped.
fn write_store(dir: &Path, s: &Settings) -> Result<()> {
    let base = WriteOptions {
        value_size: s.value_size,
        rotate_bytes: s.rotate_bytes,
        seed: 1,
        ..WriteOptions::default()
    };
    engine::write_commits(
        dir,
        &WriteOptions {
            commits: 2 * SNAPSHOT_EVERY,
            snapshot_every: SNAPSHOT_EVERY,
            ..base.clone()
        },
    )?;
    engine::write_commits(
        dir,
        &WriteOptions {
            commits: s.commits,
            ..base
        },
    )?;
    Ok(())
}

/// Everything one repetition needs.
struct Bench {
    client: Client,
    bucket: String,
    store: PathBuf,
    work: PathBuf,
    s3: S3Options,
    part_size: u64,
    /// Bodies larger than this go up as multipart (the worker's S3 options).
    multipart_threshold: u64,
    /// Parts of one multipart upload in flight at once (the worker's only concurrency).
    upload_concurrency: usize,
    /// Requests in flight for the best-case PUT line.
    concurrency: usize,
    restore_parallelism: usize,
    repeats: usize,
}

/// One object of a measured set: its key under the prefix, and its bytes.
struct Item {
    key: String,
    data: Bytes,
    /// For a snapshot or an archive (which the worker uploads from the file it checked, with
    /// the check's CRC-32): the same bytes in a file of their own, and their CRC-32.
    file: Option<(Arc<std::fs::File>, u32)>,
}

/// The samples of one measurement, and the requests of its first run.
#[derive(Default)]
struct Measurement {
    times: Vec<Duration>,
    /// CPU seconds per wall second of each sample: this process, and its children (the moto
    /// the bench started; zero with an endpoint of one's own).
    cores: Vec<(f64, f64)>,
    bytes: u64,
    requests: Option<RequestLog>,
}

impl Measurement {
    fn record(&mut self, time: Duration, cpu: Cpu, bytes: u64) {
        let wall = time.as_secs_f64();
        self.cores.push((cpu.bench / wall, cpu.children / wall));
        self.times.push(time);
        self.bytes = bytes;
    }

    /// The median cores busy in this process and in moto.
    fn median_cores(&self) -> (f64, f64) {
        let mut bench: Vec<f64> = self.cores.iter().map(|c| c.0).collect();
        let mut moto: Vec<f64> = self.cores.iter().map(|c| c.1).collect();
        bench.sort_by(f64::total_cmp);
        moto.sort_by(f64::total_cmp);
        (median(&bench), median(&moto))
    }

    /// Throughput in MiB/s of every sample, sorted.
    fn rates(&self) -> Vec<f64> {
        let mut r: Vec<f64> = self
            .times
            .iter()
            .map(|t| self.bytes as f64 / MIB / t.as_secs_f64())
            .collect();
        r.sort_by(f64::total_cmp);
        r
    }

    fn median_rate(&self) -> f64 {
        median(&self.rates())
    }
}

fn median(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n.is_multiple_of(2) {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    } else {
        sorted[n / 2]
    }
}

#[derive(Default)]
struct Results {
    backup: Measurement,
    put_library: Measurement,
    put_shaped: Measurement,
    put_parallel: Measurement,
    restore: Measurement,
    get: Measurement,
    /// What the backup wrote: `(key, len)`.
    backup_objects: Vec<(String, u64)>,
}

impl Bench {
    /// The bench's own view of `prefix`: no retries, nothing logged.
    fn raw(&self, prefix: &str) -> S3Bucket {
        S3Bucket::new(self.client.clone(), &self.bucket, prefix, self.s3.clone())
    }

    /// A bucket rooted at `prefix`, as `bucket::open` builds it, with its requests logged.
    fn bucket(&self, prefix: &str, log: &RequestLog) -> DynBucket {
        let retrying = Retrying::new(
            Arc::new(self.raw(prefix)),
            RetryPolicy::default(),
            CancellationToken::new(),
        );
        Arc::new(Logged {
            inner: Arc::new(retrying),
            log: log.clone(),
        })
    }

    /// An untimed backup first: its objects are the bytes every baseline sends, and it warms
    /// up both sides (moto's first requests of a run, and the first connections, are slower
    /// than any after them, which would count against whichever measurement came first).
    async fn warm_up(&self, results: &mut Results) -> Result<Vec<Item>> {
        let prefix = "warm-up";
        let mut worker = BackupWorker::new(
            &self.store,
            self.bucket(prefix, &RequestLog::default()),
            Arc::new(LocalSource::new(&self.store)),
            WorkerConfig::default(),
        );
        worker.run_once().await.context("the warm-up backup")?;
        let objects = list_all(&self.raw(prefix), "").await?;
        results.backup_objects = objects.iter().map(|o| (o.key.clone(), o.len)).collect();
        let items = self.fetch(prefix, &objects).await?;
        self.delete_prefix(prefix).await?;
        Ok(items)
    }

    /// One repetition. The four uploads (backup and its three baselines) run in an order that
    /// turns by one place with each repetition: moto's speed drifts within a repetition (it
    /// frees the previous prefix's objects, its memory grows), and a fixed order would favour
    /// or handicap whatever always ran in the same place. The backup's restore and plain GETs
    /// follow it at once, and its prefix is deleted before the next upload, as every baseline's
    /// is: each upload starts with moto holding the same objects (none of this run's).
    async fn repetition(&self, rep: usize, items: &[Item], results: &mut Results) -> Result<()> {
        let mut order = [
            None,
            Some(PutBaseline::Library),
            Some(PutBaseline::Shaped),
            Some(PutBaseline::Parallel),
        ];
        let turn = rep % order.len();
        order.rotate_left(turn);
        for upload in order {
            match upload {
                None => self.backup_and_restore(rep, results).await?,
                Some(baseline) => self.baseline(baseline, rep, items, results).await?,
            }
        }
        eprintln!("repetition {} of {} done", rep + 1, self.repeats);
        Ok(())
    }

    /// The backup, then the restore of what it wrote and the plain GETs of the same objects,
    /// in an order that alternates with the repetition; then its prefix is deleted.
    ///
    /// Between the backup and the two, an untimed read of every object they fetch: moto's first
    /// read of an object after its PUT is slower than the next by half (a restore measured
    /// 1.5–1.8 s first, 1.1–1.2 s second, and plain GETs likewise), which would count against
    /// whichever of the two came first.
    async fn backup_and_restore(&self, rep: usize, results: &mut Results) -> Result<()> {
        let prefix = format!("backup-{rep}");
        self.backup(&prefix, results).await?;
        self.get_all(rep, &prefix, &mut Results::default()).await?;
        let (restored, got) = if rep.is_multiple_of(2) {
            let restored = self.restore(rep, &prefix, results).await?;
            (restored, self.get_all(rep, &prefix, results).await?)
        } else {
            let got = self.get_all(rep, &prefix, results).await?;
            (self.restore(rep, &prefix, results).await?, got)
        };
        ensure!(
            got == restored,
            "the plain GETs fetched {got} bytes, the restore {restored}"
        );
        self.delete_prefix(&prefix).await
    }

    /// The restore of `prefix` into a fresh directory (removed after); the bytes restored.
    async fn restore(&self, rep: usize, prefix: &str, results: &mut Results) -> Result<u64> {
        let log = RequestLog::default();
        let target = self.work.join(format!("restore-{rep}"));
        settle().await?;
        let watch = Stopwatch::start();
        let report = restore::restore(
            self.bucket(prefix, &log).as_ref(),
            &target,
            &RestoreOptions::default(),
        )
        .await
        .context("restore")?;
        let (time, cpu) = watch.stop();
        results.restore.record(time, cpu, report.bytes);
        results.restore.requests.get_or_insert(log);
        std::fs::remove_dir_all(&target)?;
        Ok(report.bytes)
    }

    /// The plain GETs of what the restore point of `prefix` names (removed after); the bytes.
    async fn get_all(&self, rep: usize, prefix: &str, results: &mut Results) -> Result<u64> {
        let pieces = self.restore_pieces(&self.raw(prefix)).await?;
        let got = self.work.join(format!("plain-get-{rep}"));
        settle().await?;
        let watch = Stopwatch::start();
        let bytes = self.get_plain(prefix, &pieces, &got).await?;
        let (time, cpu) = watch.stop();
        results.get.record(time, cpu, bytes);
        std::fs::remove_dir_all(&got)?;
        Ok(bytes)
    }

    /// The backup into `prefix` (kept for the restore that follows).
    async fn backup(&self, prefix: &str, results: &mut Results) -> Result<()> {
        let log = RequestLog::default();
        settle().await?;
        let watch = Stopwatch::start();
        let mut worker = BackupWorker::new(
            &self.store,
            self.bucket(prefix, &log),
            Arc::new(LocalSource::new(&self.store)),
            WorkerConfig::default(),
        );
        worker.run_once().await.context("backup")?;
        let (time, cpu) = watch.stop();

        let objects = list_all(&self.raw(prefix), "").await?;
        let bytes: u64 = objects.iter().map(|o| o.len).sum();
        results.backup.record(time, cpu, bytes);
        results.backup.requests.get_or_insert(log);
        Ok(())
    }

    /// One baseline upload of `items`, into a prefix of its own that is deleted after.
    async fn baseline(
        &self,
        baseline: PutBaseline,
        rep: usize,
        items: &[Item],
        results: &mut Results,
    ) -> Result<()> {
        let bytes: u64 = items.iter().map(|i| i.data.len() as u64).sum();
        let to = format!("plain-{}-{rep}", baseline.name());
        settle().await?;
        let watch = Stopwatch::start();
        match baseline {
            PutBaseline::Library => self.put_library(&to, items).await?,
            PutBaseline::Shaped => self.put_shaped(&to, items).await?,
            PutBaseline::Parallel => self.put_parallel(&to, items).await?,
        }
        let (time, cpu) = watch.stop();
        let measurement = match baseline {
            PutBaseline::Library => &mut results.put_library,
            PutBaseline::Shaped => &mut results.put_shaped,
            PutBaseline::Parallel => &mut results.put_parallel,
        };
        measurement.record(time, cpu, bytes);
        self.delete_prefix(&to).await
    }

    /// The bytes of `objects` under `prefix` (not timed).
    async fn fetch(&self, prefix: &str, objects: &[ObjectMeta]) -> Result<Vec<Item>> {
        let mut items = Vec::with_capacity(objects.len());
        for o in objects {
            let out = self
                .client
                .get_object()
                .bucket(&self.bucket)
                .key(format!("{prefix}/{}", o.key))
                .send()
                .await?;
            let data = out.body.collect().await?.into_bytes();
            let file = match is_checked_file(&o.key) {
                false => None,
                true => {
                    let mut f = tempfile::tempfile_in(&self.work)?;
                    std::io::Write::write_all(&mut f, &data)?;
                    Some((Arc::new(f), crc32fast::hash(&data)))
                }
            };
            items.push(Item {
                key: o.key.clone(),
                data,
                file,
            });
        }
        Ok(items)
    }

    /// `data` as the part-size pieces the worker's multipart upload would send.
    fn pieces(&self, data: &Bytes) -> Vec<Bytes> {
        if data.len() as u64 <= self.multipart_threshold {
            return vec![data.clone()];
        }
        let part = self.part_size as usize;
        (0..data.len())
            .step_by(part)
            .map(|at| data.slice(at..(at + part).min(data.len())))
            .collect()
    }

    async fn put(&self, key: String, data: Bytes) -> Result<()> {
        self.client
            .put_object()
            .bucket(&self.bucket)
            .key(key)
            .body(ByteStream::from(data))
            .send()
            .await
            .context("plain PutObject")?;
        Ok(())
    }

    /// Plain PUTs in the worker's shape: each object as its part-size pieces,
    /// `upload_concurrency` at a time.
    async fn put_shaped(&self, prefix: &str, items: &[Item]) -> Result<()> {
        in_worker_shape(items, |item| {
            futures::stream::iter(self.pieces(&item.data).into_iter().enumerate())
                .map(move |(i, piece)| self.put(format!("{prefix}/{}.{i}", item.key), piece))
                .buffered(self.upload_concurrency)
                .try_collect::<Vec<()>>()
                .map_ok(|_| ())
        })
        .await
    }

    /// Plain PUTs of every piece of every object, `concurrency` at a time.
    async fn put_parallel(&self, prefix: &str, items: &[Item]) -> Result<()> {
        let pieces: Vec<(String, Bytes)> = items
            .iter()
            .flat_map(|item| {
                self.pieces(&item.data)
                    .into_iter()
                    .enumerate()
                    .map(|(i, piece)| (format!("{prefix}/{}.{i}", item.key), piece))
            })
            .collect();
        futures::stream::iter(pieces)
            .map(|(key, piece)| self.put(key, piece))
            .buffer_unordered(self.concurrency)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    }

    /// The objects through the library's own `S3Bucket::put` under `If-None-Match: *`, in the
    /// worker's shape and form (snapshots and archives streamed from files with their CRC-32):
    /// multipart above the threshold (a HEAD first), but none of the worker's own work.
    async fn put_library(&self, prefix: &str, items: &[Item]) -> Result<()> {
        let s3 = self.raw(prefix);
        in_worker_shape(items, |item| {
            let body = match &item.file {
                Some((file, crc)) => Body::File {
                    file: file.clone(),
                    offset: 0,
                    len: item.data.len() as u64,
                    crc32: Some(*crc),
                },
                None => Body::Bytes(item.data.clone()),
            };
            s3.put(&item.key, body, PutCondition::IfNoneMatch)
                .map_ok(|_| ())
                .map_err(anyhow::Error::from)
        })
        .await
    }

    /// The objects the newest restore point names (what restore downloads), with their sizes.
    async fn restore_pieces(&self, bucket: &dyn Bucket) -> Result<Vec<(String, u64)>> {
        let latest = Latest::decode(&bucket.get(manifest::LATEST_KEY).await?.data)?;
        let m = Manifest::decode(&latest.manifest, &bucket.get(&latest.manifest).await?.data)?;
        Ok(m.objects().map(|o| (o.key.clone(), o.len)).collect())
    }

    /// Plain GETs of `objects` under `prefix` into files of their own in `dir`, as restore
    /// fetches them: ranged GETs of `RANGE_CHUNK` for larger objects, `restore_parallelism` in
    /// flight; then every file and the directory fsynced. Returns the bytes.
    async fn get_plain(&self, prefix: &str, objects: &[(String, u64)], dir: &Path) -> Result<u64> {
        std::fs::create_dir(dir)?;
        let mut files = Vec::with_capacity(objects.len());
        let mut chunks: Vec<(usize, String, Option<Range<u64>>)> = Vec::new();
        for (i, (key, len)) in objects.iter().enumerate() {
            files.push(Arc::new(std::fs::File::create(dir.join(i.to_string()))?));
            let full = format!("{prefix}/{key}");
            if *len <= RANGE_CHUNK {
                chunks.push((i, full, None));
                continue;
            }
            for start in (0..*len).step_by(RANGE_CHUNK as usize) {
                let range = start..(start + RANGE_CHUNK).min(*len);
                chunks.push((i, full.clone(), Some(range)));
            }
        }
        let bytes: u64 = futures::stream::iter(chunks)
            .map(|(i, key, range)| {
                let file = files[i].clone();
                async move {
                    let mut req = self.client.get_object().bucket(&self.bucket).key(key);
                    let offset = range.as_ref().map_or(0, |r| r.start);
                    if let Some(r) = range {
                        req = req.range(format!("bytes={}-{}", r.start, r.end - 1));
                    }
                    let data = req.send().await?.body.collect().await?.into_bytes();
                    let len = data.len() as u64;
                    tokio::task::spawn_blocking(move || file.write_all_at(&data, offset)).await??;
                    Ok::<_, anyhow::Error>(len)
                }
            })
            .buffer_unordered(self.restore_parallelism)
            .try_fold(0, |sum, n| async move { Ok(sum + n) })
            .await?;
        let dir = dir.to_path_buf();
        tokio::task::spawn_blocking(move || {
            for f in &files {
                f.sync_all()?;
            }
            std::fs::File::open(&dir)?.sync_all()
        })
        .await??;
        Ok(bytes)
    }

    /// Deletes every object under `prefix` (not timed), so the endpoint does not fill up.
    async fn delete_prefix(&self, prefix: &str) -> Result<()> {
        let s3 = self.raw(prefix);
        let objects = list_all(&s3, "").await?;
        futures::stream::iter(objects)
            .map(|o| {
                let s3 = &s3;
                async move { s3.delete(&o.key, None).await }
            })
            .buffer_unordered(self.concurrency)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    }
}

/// Writes back every dirty page of the machine, before each measurement (untimed): moto keeps
/// large objects in temporary files, and no measurement should wait behind the writeback of
/// the one before it (the fsyncs of a restore or of the plain GETs would). Hygiene, not a
/// measured cure: it did not remove the slower first read of fresh objects, which the untimed
/// read before restore and the plain GETs does.
async fn settle() -> Result<()> {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    tokio::task::spawn_blocking(|| unsafe { libc::sync() }).await?;
    Ok(())
}

/// Whether the worker uploads `key` from a file it checked (a snapshot or an archive).
fn is_checked_file(key: &str) -> bool {
    key.ends_with("/snapshot.bin") || key.contains("/archive/")
}

/// The PUT baselines of a backup.
#[derive(Clone, Copy)]
enum PutBaseline {
    /// `S3Bucket::put` in the worker's shape.
    Library,
    /// Plain `PutObject`s in the worker's shape.
    Shaped,
    /// Plain `PutObject`s, `concurrency` in flight.
    Parallel,
}

impl PutBaseline {
    fn name(self) -> &'static str {
        match self {
            PutBaseline::Library => "library",
            PutBaseline::Shaped => "shaped",
            PutBaseline::Parallel => "parallel",
        }
    }
}

/// Sends the objects a backup wrote with the concurrency the worker sends them: a
/// generation's snapshot, archives and side files [`WORKER_UPLOADS_IN_FLIGHT`] at a time, then
/// everything else (GENERATION, segments, manifest, LATEST) one after the other. `send` sends
/// one object.
async fn in_worker_shape<'a, F, Fut>(items: &'a [Item], send: F) -> Result<()>
where
    F: Fn(&'a Item) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let (generation, rest): (Vec<&Item>, Vec<&Item>) = items.iter().partition(|i| {
        ["/snapshot.bin", "/archive/", "/side/"]
            .iter()
            .any(|part| i.key.contains(part))
    });
    futures::stream::iter(generation)
        .map(&send)
        .buffer_unordered(WORKER_UPLOADS_IN_FLIGHT)
        .try_collect::<Vec<()>>()
        .await?;
    for item in rest {
        send(item).await?;
    }
    Ok(())
}

impl Results {
    fn print(&self, bench: &Bench) {
        let total: u64 = self.backup_objects.iter().map(|(_, len)| len).sum();
        println!(
            "backup writes {} objects, {:.1} MiB:",
            self.backup_objects.len(),
            total as f64 / MIB
        );
        for (key, len) in &self.backup_objects {
            println!("  {:>12} B  {key}", len);
        }
        println!(
            "part size {} MiB, {} parts in flight per upload, {} objects of a generation at once; \
             restore parallelism {}; {} repetitions",
            bench.part_size >> 20,
            bench.upload_concurrency,
            WORKER_UPLOADS_IN_FLIGHT,
            bench.restore_parallelism,
            bench.repeats
        );
        println!();
        println!(
            "{:<46} {:>7} {:>8} {:>8} {:>8} {:>7} {:>7}",
            "", "", "median", "min", "max", "bench", "moto"
        );
        println!(
            "{:<46} {:>7} {:>8} {:>8} {:>8} {:>7} {:>7}",
            "measurement", "MiB", "MiB/s", "MiB/s", "MiB/s", "cores", "cores"
        );
        let parallel = format!("plain PutObject, {} in flight", bench.concurrency);
        let get = format!(
            "plain GetObject+pwrite+fsync, {} in flight",
            bench.restore_parallelism
        );
        let rows: [(&str, &Measurement); 6] = [
            ("backup: BackupWorker::run_once", &self.backup),
            ("S3Bucket::put, worker's shape", &self.put_library),
            ("plain PutObject, worker's shape", &self.put_shaped),
            (&parallel, &self.put_parallel),
            ("restore: restore::restore", &self.restore),
            (&get, &self.get),
        ];
        for (name, m) in rows {
            let rates = m.rates();
            let (bench_cores, moto_cores) = m.median_cores();
            println!(
                "{:<46} {:>7.1} {:>8.1} {:>8.1} {:>8.1} {:>7.2} {:>7.2}",
                name,
                m.bytes as f64 / MIB,
                median(&rates),
                rates[0],
                rates[rates.len() - 1],
                bench_cores,
                moto_cores
            );
        }
        for (name, m) in [("backup", &self.backup), ("restore", &self.restore)] {
            if let Some(log) = &m.requests {
                let time = m.times[0];
                println!();
                println!(
                    "requests of the first {name} ({:.2} s wall):",
                    time.as_secs_f64()
                );
                log.print(time);
            }
        }
        let backup = self.backup.median_rate() / self.put_shaped.median_rate();
        let restore = self.restore.median_rate() / self.get.median_rate();
        let worker = self.backup.median_rate() / self.put_library.median_rate();
        let s3_layer = self.put_library.median_rate() / self.put_shaped.median_rate();
        println!();
        println!(
            "backup/plain splits into backup/S3Bucket::put {worker:.2} (the worker's own work) \
             and S3Bucket::put/plain {s3_layer:.2} (the S3 layer: conditions, checksums, multipart)"
        );
        for (name, a, b) in [
            ("backup/plain", &self.backup, &self.put_shaped),
            ("restore/plain", &self.restore, &self.get),
        ] {
            let ratios = paired(a, b);
            let list: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
            let mut sorted = ratios.clone();
            sorted.sort_by(f64::total_cmp);
            println!(
                "{name} in each repetition: {} (median {:.2})",
                list.join(" "),
                median(&sorted)
            );
        }
        println!(
            "backup/plain {backup:.2}  restore/plain {restore:.2}  (target >= {TARGET_RATIO})"
        );
    }
}

/// The throughput of `a` over that of `b` in each repetition: the two ran in the same
/// repetition, so the drift of moto's speed over a run (see [`Bench::repetition`]) touches both.
fn paired(a: &Measurement, b: &Measurement) -> Vec<f64> {
    a.times
        .iter()
        .zip(&b.times)
        .map(|(ta, tb)| (a.bytes as f64 / ta.as_secs_f64()) / (b.bytes as f64 / tb.as_secs_f64()))
        .collect()
}

/// Requests per operation, as one run's bucket calls saw them (retries included).
#[derive(Clone, Default)]
struct RequestLog(Arc<Mutex<BTreeMap<&'static str, OpStats>>>);

#[derive(Default, Clone, Copy)]
struct OpStats {
    calls: u64,
    bytes: u64,
    /// Summed over calls: more than the wall time when calls overlap.
    time: Duration,
}

impl RequestLog {
    fn add(&self, op: &'static str, bytes: u64, time: Duration) {
        let mut ops = self.0.lock().expect("the log's lock");
        let s = ops.entry(op).or_default();
        s.calls += 1;
        s.bytes += bytes;
        s.time += time;
    }

    fn print(&self, wall: Duration) {
        let ops = self.0.lock().expect("the log's lock");
        let mut in_calls = Duration::ZERO;
        for (op, s) in ops.iter() {
            println!(
                "  {op:<10} {:>5} calls {:>9.1} MiB {:>8.2} s",
                s.calls,
                s.bytes as f64 / MIB,
                s.time.as_secs_f64()
            );
            in_calls += s.time;
        }
        println!(
            "  bucket calls summed {:.2} s; wall time outside any call at least {:.2} s",
            in_calls.as_secs_f64(),
            wall.saturating_sub(in_calls).as_secs_f64()
        );
    }
}

/// A bucket that logs the time and bytes of every call to its inner bucket.
struct Logged {
    inner: DynBucket,
    log: RequestLog,
}

impl Logged {
    async fn timed<T>(
        &self,
        op: &'static str,
        bytes: impl FnOnce(&T) -> u64,
        call: impl Future<Output = Result<T, BucketError>>,
    ) -> Result<T, BucketError> {
        let started = Instant::now();
        let result = call.await;
        let n = result.as_ref().map_or(0, bytes);
        self.log.add(op, n, started.elapsed());
        result
    }
}

#[async_trait::async_trait]
impl Bucket for Logged {
    fn url(&self) -> String {
        self.inner.url()
    }

    async fn get_at_most(&self, key: &str, at_most: u64) -> Result<Object, BucketError> {
        let call = self.inner.get_at_most(key, at_most);
        self.timed("get", |o: &Object| o.data.len() as u64, call)
            .await
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, BucketError> {
        let call = self.inner.get_range(key, range);
        self.timed("get_range", |b: &Bytes| b.len() as u64, call)
            .await
    }

    async fn head(&self, key: &str) -> Result<Option<ObjectMeta>, BucketError> {
        self.timed("head", |_| 0, self.inner.head(key)).await
    }

    async fn put_with(&self, key: &str, body: Body, opts: PutOpts) -> Result<String, BucketError> {
        let len = body.len();
        self.timed("put", |_| len, self.inner.put_with(key, body, opts))
            .await
    }

    async fn delete(&self, key: &str, if_match: Option<&str>) -> Result<(), BucketError> {
        self.timed("delete", |_| 0, self.inner.delete(key, if_match))
            .await
    }

    async fn list(&self, query: ListQuery<'_>) -> Result<ListPage, BucketError> {
        let call = self.inner.list(query);
        self.timed("list", |_| 0, call).await
    }
}

/// Wall time and CPU time from its start.
struct Stopwatch {
    started: Instant,
    cpu: Cpu,
}

impl Stopwatch {
    fn start() -> Stopwatch {
        Stopwatch {
            started: Instant::now(),
            cpu: Cpu::now(),
        }
    }

    fn stop(self) -> (Duration, Cpu) {
        let cpu = Cpu::now();
        let used = Cpu {
            bench: cpu.bench - self.cpu.bench,
            children: cpu.children - self.cpu.children,
        };
        (self.started.elapsed(), used)
    }
}

/// CPU seconds (user and system) of this process and of its live child processes.
#[derive(Debug, Clone, Copy)]
struct Cpu {
    bench: f64,
    children: f64,
}

impl Cpu {
    fn now() -> Cpu {
        let mut children = 0.0;
        for task in std::fs::read_dir("/proc/self/task").into_iter().flatten() {
            let Ok(task) = task else { continue };
            let list = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for pid in list.split_whitespace() {
                children += proc_cpu(&format!("/proc/{pid}/stat"));
            }
        }
        Cpu {
            bench: proc_cpu("/proc/self/stat"),
            children,
        }
    }
}

/// utime + stime of a `/proc/<pid>/stat`, in seconds; 0 if it cannot be read.
fn proc_cpu(path: &str) -> f64 {
    let Ok(stat) = std::fs::read_to_string(path) else {
        return 0.0;
    };
    // The fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (ticks(11) + ticks(12)) / hz.max(1.0)
}

/// The total size of the files under `dir`.
fn dir_bytes(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() {
            dir_bytes(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}

/// The kind of file system `path` is on, by its `statfs` magic: fsync is free on tmpfs.
fn fs_kind(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return "unknown file system".into();
    };
    // SAFETY: a valid NUL-terminated path and a zeroed statfs buffer of the right type.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return "unknown file system".into();
    }
    match st.f_type as i64 {
        0xEF53 => "ext2/3/4".into(),
        0x0102_1994 => "tmpfs: fsync costs nothing here".into(),
        0x5846_5342 => "xfs".into(),
        0x9123_683E => "btrfs".into(),
        0x794C_7630 => "overlayfs".into(),
        t => format!("file system type {t:#x}"),
    }
}
