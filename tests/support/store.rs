//! Stores and local buckets for tests: the reference engine's deterministic workload, a fast
//! worker configuration, and a byte-for-byte picture of a bucket directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use mushroom_backup::bucket::DynBucket;
use mushroom_backup::bucket::fs::FsBucket;
use mushroom_backup::store::engine::{self, StoreDigest, WriteOptions};
use mushroom_backup::wal_source::LocalSource;
use mushroom_backup::worker::{BackupWorker, RetentionPolicy, WorkerConfig};

/// Appends `commits` workload commits (seed 1) to the store in `dir`.
pub fn write(dir: &Path, commits: u64, snapshot_every: u64, rotate_bytes: u64) -> StoreDigest {
    write_with(
        dir,
        WriteOptions {
            commits,
            snapshot_every,
            rotate_bytes,
            seed: 1,
            ..WriteOptions::default()
        },
    )
}

pub fn write_with(dir: &Path, opts: WriteOptions) -> StoreDigest {
    engine::write_commits(dir, &opts)
        .expect("write commits")
        .digest
}

pub fn digest(dir: &Path) -> StoreDigest {
    engine::digest(dir).expect("digest")
}

/// A worker configuration that keeps everything and never waits.
pub fn config() -> WorkerConfig {
    WorkerConfig {
        wal_interval: Duration::from_millis(10),
        restore_point_interval: Duration::from_millis(0),
        retention_interval: Duration::from_secs(3600),
        retention: RetentionPolicy {
            keep_for: Duration::from_secs(3600),
            keep_generations: 100,
            orphan_grace: Duration::from_secs(3600),
            ..RetentionPolicy::default()
        },
        conditional_writes: true,
        first_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(200),
        shutdown_grace: Duration::from_millis(500),
        ..WorkerConfig::default()
    }
}

/// `file://` URL of the local bucket `root`.
pub fn file_url(root: &Path) -> String {
    format!("file://{}", root.display())
}

/// Every key under `prefix` of `bucket`.
pub async fn keys_under(bucket: &DynBucket, prefix: &str) -> std::collections::BTreeSet<String> {
    mushroom_backup::bucket::list_all(bucket.as_ref(), prefix)
        .await
        .expect("a listing")
        .into_iter()
        .map(|o| o.key)
        .collect()
}

/// The most aggressive retention a pass takes: the newest generation, nothing else, no grace.
pub fn newest_generation_only() -> RetentionPolicy {
    RetentionPolicy {
        keep_for: Duration::ZERO,
        keep_generations: 1,
        orphan_grace: Duration::ZERO,
        ..RetentionPolicy::default()
    }
}

pub fn fs_bucket(root: &Path) -> DynBucket {
    Arc::new(FsBucket::open(root).expect("open fs bucket"))
}

/// `rounds` generations of the store in `dir` backed up to the local bucket `bucket` (200
/// commits a round, a snapshot every 150), a restore point each.
pub async fn generations(dir: &Path, bucket: &Path, rounds: usize) {
    for _ in 0..rounds {
        write(dir, 200, 150, 0);
        worker(dir, fs_bucket(bucket), config())
            .run_once()
            .await
            .expect("a backup");
    }
}

pub fn worker(dir: &Path, bucket: DynBucket, config: WorkerConfig) -> BackupWorker {
    BackupWorker::new(dir, bucket, Arc::new(LocalSource::new(dir)), config)
}

/// Every file under `root` (but the bucket's own `.lock` and `.tmp`) with its bytes.
pub fn tree(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries {
            let e = e.expect("dir entry");
            let p = e.path();
            let rel = p.strip_prefix(root).expect("under root").to_path_buf();
            if rel == Path::new(".lock") || rel.starts_with(".tmp") {
                continue;
            }
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                out.insert(rel, std::fs::read(&p).expect("read"));
            }
        }
    }
    walk(root, root, &mut out);
    out
}

/// [`tree`] of a `file://` bucket, leases aside: what a backup wrote, without the lease objects
/// a holder (re)writes (a paused store keeps, and may renew, its lease; a move's target takes
/// it).
pub fn tree_but_leases(bucket: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut t = tree(bucket);
    t.retain(|p, _| {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        name != "lease" && !name.ends_with(".lease")
    });
    t
}

/// Copies a store directory (a stand-in for "the same store at an earlier moment").
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read dir") {
        let e = e.expect("entry");
        let target = to.join(e.file_name());
        if e.path().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).expect("copy");
        }
    }
}

/// The store in `dir`, opened in this process (and locked by it) as a node would: every commit
/// its own group, so each `sync` makes exactly that commit durable.
pub fn open_engine(dir: &Path) -> engine::Engine {
    engine::Engine::open(
        dir,
        engine::EngineOptions {
            group_commit: 0,
            ..Default::default()
        },
    )
    .expect("open the store")
}

/// `n` commits written straight into the store in `dir` (no service running to report to), the
/// store closed again: its commit sequence after them.
pub fn commit_more(dir: &Path, n: u64) -> u64 {
    let mut engine = open_engine(dir);
    commit_synced(&mut engine, n);
    engine.commit_seq()
}

/// `n` commits of the deterministic workload (seed 3, 64-byte values), each synced; the
/// position after the last.
pub fn commit_synced(
    engine: &mut engine::Engine,
    n: u64,
) -> mushroom_backup::store::format::WalPosition {
    let mut pos = engine.position();
    for _ in 0..n {
        let seq = engine.commit_seq() + 1;
        engine.commit(&engine::workload_ops(3, seq, 64)).unwrap();
        pos = engine.sync().unwrap();
    }
    pos
}
