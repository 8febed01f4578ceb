//! A quiet store rests (`src/worker/status.rs`): once everything is shipped, neither its runner
//! nor its supervisor asks anything until something can have changed — and then they do at
//! once: a write to its directory, a node's position report. Each wake-up here is needed
//! within a minute, while a resting store's only deadline of its own (the directory watch's
//! trust, 5 minutes on a local filesystem) is far later, so a missed wake-up fails the test.

mod support;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use mushroom_backup::health::StoreHealth;
use mushroom_backup::lease::LeaseConfig;
use mushroom_backup::node_client::position_report;
use mushroom_backup::service::proto::{self, backup_control_client::BackupControlClient};
use mushroom_backup::store::format::WalPosition;
use mushroom_backup::wal_source::{LocalSource, SourceError, WalSource};
use mushroom_backup::worker::{BackupHandle, BackupWorker};
use support::serve::{self, Serve};
use support::store;
use support::wait_for;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

const WITHIN: Duration = Duration::from_secs(60);

/// The local source, counting its reads: every tick of the runner on a quiet store and every
/// health evaluation by the supervisor reads it once.
struct Counted {
    inner: LocalSource,
    reads: AtomicU64,
}

#[async_trait::async_trait]
impl WalSource for Counted {
    async fn durable_wal_position(&self) -> Result<WalPosition, SourceError> {
        self.reads.fetch_add(1, Relaxed);
        self.inner.durable_wal_position().await
    }
}

async fn until_health(h: &BackupHandle, what: &str, ok: impl Fn(&StoreHealth) -> bool) {
    wait_for(WITHIN, what, || {
        let now = h.health();
        let r = if ok(&now) {
            Ok(())
        } else {
            Err(format!("{now:?}"))
        };
        async move { r }
    })
    .await
}

/// Waits until 50 intervals (10 ms each) go by without a read of the source: the store rests.
/// Ticking every interval, it never would.
async fn until_resting(source: &Counted) {
    wait_for(
        WITHIN,
        "50 intervals without a read of the source",
        || async {
            let before = source.reads.load(Relaxed);
            tokio::time::sleep(Duration::from_millis(500)).await;
            let after = source.reads.load(Relaxed);
            if after == before {
                Ok(())
            } else {
                Err(format!("{} reads in 500 ms", after - before))
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_store_rests_until_its_directory_changes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    store::write(&dir, 50, 0, 0);
    let source = Arc::new(Counted {
        inner: LocalSource::new(&dir),
        reads: AtomicU64::new(0),
    });
    let worker = BackupWorker::new(
        &dir,
        store::fs_bucket(&tmp.path().join("b")),
        source.clone(),
        store::config(),
    )
    .with_signalled_positions();
    let lease = LeaseConfig {
        // No renewal while the test runs: nothing but the store wakes the worker.
        ttl: Duration::from_secs(3600),
        ..LeaseConfig::new("resting")
    };
    let tasks = TaskTracker::new();
    let h = worker.spawn(lease, CancellationToken::new(), &tasks);
    until_health(&h, "50 commits shipped, with a restore point", |s| {
        s.healthy && s.shipped_commit_seq == 50 && s.restore_point_commit_seq == 50
    })
    .await;
    until_resting(&source).await;

    // Three writes, each seen without a tick to find it: shipped, restore point, health.
    let mut written = 50;
    for (commits, snapshot_every) in [(10, 0), (30, 20), (1, 0)] {
        store::write(&dir, commits, snapshot_every, 0);
        written += commits;
        until_health(&h, "the new commits shipped and in health", |s| {
            s.healthy
                && s.durable_commit_seq == written
                && s.shipped_commit_seq == written
                && s.restore_point_commit_seq == written
        })
        .await;
        until_resting(&source).await;
    }
    assert_eq!(
        h.shutdown(true).await,
        mushroom_backup::health::WorkerState::Exited("shut down".into())
    );
}

/// `serve`, a store open in this process's engine and a raw `ReportPosition` stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_resting_store_wakes_for_a_node_report() {
    let tmp = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(tmp.path()).unwrap();
    let root = base.join("stores");
    std::fs::create_dir_all(&root).unwrap();
    let server = Serve::start(
        "serve (resting)",
        serve::command(&base.join("data"), &root, &[]),
    );
    let dir = root.join("node");
    let mut engine = support::store::open_engine(&dir);
    let mut c = server.client().await;
    let reg = register(&mut c, &dir, &base.join("bucket")).await;
    let id = reg.store_id.clone();

    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let p10 = store::commit_synced(&mut engine, 10);
    tx.send(position_report(&id, &p10)).await.unwrap();
    let mut req = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    req.metadata_mut().insert(
        "authorization",
        format!("Bearer {}", reg.node_token).parse().unwrap(),
    );
    let commands = c.report_position(req).await.expect("ReportPosition");
    wait_health(&mut c, &id, |h| h.healthy && h.shipped_commit_seq == 10).await;

    // Commits on disk the node has not reported yet: the directory changed, the position did
    // not; the worker looks, finds the same position and rests again.
    let p15 = store::commit_synced(&mut engine, 5);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let h = health(&mut c, &id).await;
    assert_eq!(
        h.shipped_commit_seq, 10,
        "shipped what no report named: {h:?}"
    );

    // The report is all that changes now: it must wake the store.
    tx.send(position_report(&id, &p15)).await.unwrap();
    wait_health(&mut c, &id, |h| {
        h.healthy && h.durable_commit_seq == 15 && h.shipped_commit_seq == 15
    })
    .await;
    drop(tx);
    drop(commands);
    server.terminate();
}

async fn register(
    c: &mut BackupControlClient<tonic::transport::Channel>,
    dir: &Path,
    bucket: &Path,
) -> proto::RegisterResponse {
    c.register(support::register_req(dir, &support::file_url(bucket)))
        .await
        .expect("Register")
        .into_inner()
}

async fn health(
    c: &mut BackupControlClient<tonic::transport::Channel>,
    id: &str,
) -> proto::StoreHealth {
    c.health(proto::HealthRequest {
        store_id: id.into(),
        fresh: false,
    })
    .await
    .expect("Health")
    .into_inner()
    .stores
    .into_iter()
    .next()
    .expect("one store")
}

async fn wait_health(
    c: &mut BackupControlClient<tonic::transport::Channel>,
    id: &str,
    ok: impl Fn(&proto::StoreHealth) -> bool,
) {
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        let h = health(c, id).await;
        if ok(&h) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "waited {WITHIN:?}; last health: {h:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
