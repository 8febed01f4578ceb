//! The spawned worker: the lease decides who writes, health names every unhealthy cause, a
//! refused LATEST drops the lease, and a worker that panics is never reported healthy.
//!
//! Real time with short intervals (every wait is for a condition, with a generous deadline);
//! lease timings under paused time are in `tests/lease.rs`.

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use mushroom_backup::bucket::faults::{Fault, FaultPlan, FaultyBucket, Op};
use mushroom_backup::bucket::{Body, DynBucket, PutCondition};
use mushroom_backup::health::{StoreHealth, WorkerState};
use mushroom_backup::lease::{Acquisition, LeaseAcquirer, LeaseConfig};
use mushroom_backup::manifest::{self, Latest};
use mushroom_backup::worker::{BackupHandle, BackupTrigger, WorkerConfig};
use support::store::{config, fs_bucket, worker, write};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

fn lease(holder: &str) -> LeaseConfig {
    LeaseConfig {
        ttl: Duration::from_millis(600),
        holder: holder.into(),
        ..LeaseConfig::new("test-store")
    }
}

/// A temp dir holding a store (`s`) of `commits` commits and a bucket directory (`b`).
fn store_of(commits: u64) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let (store, root) = (t.path().join("s"), t.path().join("b"));
    write(&store, commits, 0, 0);
    (t, store, root)
}

/// A worker of `store` over `bucket` (the [`fast`] config), spawned under the lease as
/// `holder`, with a token and a task tracker of its own.
fn spawned(store: &Path, bucket: DynBucket, holder: &str) -> BackupHandle {
    worker(store, bucket, fast()).spawn(
        lease(holder),
        CancellationToken::new(),
        &TaskTracker::new(),
    )
}

/// A local-directory bucket at `root` behind `plan`.
fn faulty(root: &Path, plan: FaultPlan) -> DynBucket {
    Arc::new(FaultyBucket::new(fs_bucket(root), plan))
}

/// Whether the bucket at `root` holds no lease.
async fn no_lease_in(root: &Path) -> bool {
    fs_bucket(root)
        .head(manifest::LEASE_KEY)
        .await
        .unwrap()
        .is_none()
}

fn fast() -> WorkerConfig {
    WorkerConfig {
        wal_interval: Duration::from_millis(20),
        min_unhealthy_lag: Duration::from_millis(300),
        ..config()
    }
}

/// Waits (up to 20 s) until health satisfies `pred`, and returns it.
async fn wait_for(
    h: &BackupHandle,
    what: &str,
    pred: impl Fn(&StoreHealth) -> bool,
) -> StoreHealth {
    let mut rx = h.watch_health();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let now = rx.borrow_and_update().clone();
        if pred(&now) {
            return now;
        }
        if tokio::time::timeout_at(deadline, rx.changed())
            .await
            .is_err()
        {
            panic!("timed out waiting for {what}; health is {now:#?}");
        }
    }
}

#[tokio::test]
async fn the_second_worker_ships_nothing_names_the_holder_and_takes_over_after_release() {
    let (_t, store, root) = store_of(300);
    let first = spawned(&store, fs_bucket(&root), "first");
    wait_for(&first, "the first to ship", |h| {
        h.healthy && h.shipped_commit_seq == 300
    })
    .await;
    let second = spawned(&store, fs_bucket(&root), "second");
    let h = wait_for(&second, "the second to see the holder", |h| {
        !h.lease_holder.is_empty()
    })
    .await;
    assert!(!h.healthy);
    assert!(
        h.reason.contains("held by another instance (first on"),
        "{}",
        h.reason
    );
    write(&store, 100, 0, 0);
    wait_for(&first, "the first to ship more", |h| {
        h.shipped_commit_seq == 400
    })
    .await;
    assert_eq!(
        second.counters().objects_shipped.load(Ordering::Relaxed),
        0,
        "the second uploaded while the first held the lease"
    );

    // A clean shutdown deletes the lease: the second takes over at once (well within a TTL
    // of staleness it would otherwise wait for).
    assert_eq!(
        first.shutdown(true).await,
        WorkerState::Exited("shut down".into())
    );
    write(&store, 50, 0, 0);
    let h = wait_for(&second, "the second to take over", |h| {
        h.lease_held && h.shipped_commit_seq == 450
    })
    .await;
    assert!(h.healthy, "{h:#?}");
    second.trigger(BackupTrigger::RestorePoint);
    wait_for(&second, "a restore point by the second", |h| {
        h.restore_point_commit_seq == 450
    })
    .await;
    let ended = second.shutdown(true).await;
    assert_eq!(ended, WorkerState::Exited("shut down".into()));
    assert!(no_lease_in(&root).await, "shutdown left the lease");
}

#[tokio::test]
async fn a_lease_held_elsewhere_is_unhealthy_and_names_its_holder() {
    let (_t, store, root) = store_of(10);
    let b = fs_bucket(&root);
    let Acquisition::Acquired(other) = LeaseAcquirer::new(b.clone(), lease("other-instance"))
        .try_acquire()
        .await
        .unwrap()
    else {
        panic!("the test could not take the lease")
    };
    let w = spawned(&store, b.clone(), "me");
    let h = wait_for(&w, "held elsewhere", |h| {
        h.reason.contains("other-instance")
    })
    .await;
    assert!(!h.healthy && !h.lease_held);
    // While the other keeps renewing, this one never writes; the lag grows unhealthy too.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(w.counters().objects_shipped.load(Ordering::Relaxed), 0);
    assert!(
        w.health().reasons.iter().any(|r| r.contains("unshipped")),
        "{:#?}",
        w.health()
    );
    other.release().await.unwrap();
    wait_for(&w, "healthy once released", |h| h.healthy).await;
    w.shutdown(false).await;
}

#[tokio::test]
async fn consecutive_failures_are_unhealthy_with_the_last_error() {
    let (_t, store, root) = store_of(10);
    // Every put but the lease's fails.
    let plan = FaultPlan::custom(|r| {
        if r.op == Op::Put && r.key != manifest::LEASE_KEY {
            Fault::Fail
        } else {
            Fault::Pass
        }
    });
    let b = faulty(&root, plan);
    let w = spawned(&store, b, "me");
    let h = wait_for(&w, "failures", |h| h.consecutive_failures >= 5).await;
    assert!(!h.healthy);
    assert!(
        h.reason.contains("consecutive backup steps failed"),
        "{}",
        h.reason
    );
    assert!(
        h.reason.contains("injected") || h.last_error.is_some(),
        "{h:#?}"
    );
    w.shutdown(false).await;
}

#[tokio::test]
async fn unshipped_durable_data_is_unhealthy_lag() {
    let (_t, store, root) = store_of(10);
    // Segment uploads hang for a minute: the worker is stuck, the store moves on.
    let b = puts_hang(&root, |key| key.contains("/wal/"));
    let w = spawned(&store, b, "me");
    let h = wait_for(&w, "lag", |h| h.reason.contains("unshipped")).await;
    assert!(
        h.durable_commit_seq == 10 && h.shipped_commit_seq == 0,
        "{h:#?}"
    );
    assert!(h.lease_held, "stuck, but still holding the lease");
    w.shutdown(false).await;
}

#[tokio::test]
async fn a_refused_prefix_is_unhealthy_with_the_cause_and_releases_the_lease() {
    let t = tempfile::tempdir().unwrap();
    let (a, b_store, root) = (t.path().join("a"), t.path().join("b"), t.path().join("bk"));
    write(&a, 50, 0, 0);
    worker(&a, fs_bucket(&root), config())
        .run_once()
        .await
        .unwrap();
    write(&b_store, 80, 0, 0);
    let w = spawned(&b_store, fs_bucket(&root), "me");
    let h = wait_for(&w, "refused", |h| h.reason.contains("prefix refused")).await;
    assert!(h.reason.contains("no backup.lineage"), "{}", h.reason);
    wait_for(&w, "the lease released", |_| true).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(no_lease_in(&root).await, "a refused worker kept the lease");
    w.shutdown(false).await;
}

#[tokio::test]
async fn a_panicking_worker_is_reported_unhealthy_never_healthy() {
    let (_t, store, root) = store_of(10);
    let plan = FaultPlan::custom(|r| {
        if r.op == Op::Put && r.key.ends_with("GENERATION") {
            panic!("injected panic in an upload");
        }
        Fault::Pass
    });
    let b = faulty(&root, plan);
    let w = spawned(&store, b, "me");
    let h = wait_for(&w, "the panic", |h| {
        matches!(h.worker, WorkerState::Panicked(_))
    })
    .await;
    assert!(!h.healthy);
    assert!(
        h.reason.contains("panicked: injected panic in an upload"),
        "{}",
        h.reason
    );
    // It stays unhealthy: the supervisor has ended with the worker, and health says so.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!w.health().healthy);
    assert!(w.is_finished());
}

#[tokio::test]
async fn a_worker_that_exited_is_unhealthy() {
    let (_t, store, root) = store_of(10);
    let token = CancellationToken::new();
    let w = worker(&store, fs_bucket(&root), fast()).spawn(
        lease("me"),
        token.clone(),
        &TaskTracker::new(),
    );
    wait_for(&w, "healthy", |h| h.healthy).await;
    token.cancel();
    let h = wait_for(&w, "exited", |h| matches!(h.worker, WorkerState::Exited(_))).await;
    assert!(!h.healthy && h.reason.contains("exited"), "{h:#?}");
    assert_eq!(
        h.restore_point_commit_seq, 10,
        "shutdown flushed no restore point: {h:#?}"
    );
}

#[tokio::test]
async fn a_refused_latest_drops_the_lease_and_the_worker_starts_over() {
    let (_t, store, root) = store_of(100);
    let b = fs_bucket(&root);
    let w = spawned(&store, b.clone(), "me");
    wait_for(&w, "a first restore point", |h| {
        h.restore_point_commit_seq == 100
    })
    .await;
    // Another writer moves LATEST behind the worker's back (same content, new ETag on a
    // rewrite is not guaranteed, so write a different but valid LATEST naming the manifest).
    let latest = Latest::decode(&b.get(manifest::LATEST_KEY).await.unwrap().data).unwrap();
    let mut moved = latest.encode();
    moved.insert(moved.len() - 1, b' ');
    b.put(manifest::LATEST_KEY, Body::from(moved), PutCondition::None)
        .await
        .unwrap();
    write(&store, 20, 0, 0);
    w.trigger(BackupTrigger::RestorePoint);
    wait_for(&w, "the next restore point", |h| {
        h.restore_point_commit_seq == 120
    })
    .await;
    assert!(
        w.counters().lease_losses.load(Ordering::Relaxed) >= 1,
        "the refused LATEST did not drop the lease"
    );
    assert!(w.counters().lease_acquisitions.load(Ordering::Relaxed) >= 2);
    let now = Latest::decode(&b.get(manifest::LATEST_KEY).await.unwrap().data).unwrap();
    assert_eq!(now.commit_seq, 120);
    w.shutdown(false).await;
}

#[tokio::test]
async fn after_shutdown_nothing_the_worker_spawned_is_left_running() {
    let (_t, store, root) = store_of(10);
    let tasks = TaskTracker::new();
    let w = worker(&store, fs_bucket(&root), fast()).spawn(
        lease("me"),
        CancellationToken::new(),
        &tasks,
    );
    wait_for(&w, "the lease held and a restore point", |h| {
        h.lease_held && h.restore_point_commit_seq == 10
    })
    .await;
    // Runner, supervisor, end-watcher and the lease's renewal task.
    assert!(tasks.len() >= 4, "{} tasks tracked", tasks.len());
    assert!(matches!(w.shutdown(true).await, WorkerState::Exited(_)));
    tasks.close();
    tokio::time::timeout(Duration::from_secs(10), tasks.wait())
        .await
        .expect("every tracked task ended");
    assert!(tasks.is_empty(), "{} tasks still running", tasks.len());
}

#[tokio::test]
async fn dropping_the_trigger_channel_does_not_stop_the_worker() {
    let (_t, store, root) = store_of(10);
    let tasks = TaskTracker::new();
    let token = CancellationToken::new();
    let w = worker(&store, fs_bucket(&root), fast()).spawn(lease("me"), token.clone(), &tasks);
    let mut health = w.watch_health();
    let counters = w.counters();
    wait_for(&w, "healthy", |h| h.healthy).await;
    drop(w);
    // Still running: it ships what becomes durable later.
    write(&store, 5, 0, 0);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while counters.shipped_commit_seq.load(Ordering::Relaxed) < 15 {
        assert!(tokio::time::Instant::now() < deadline, "the worker stopped");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(health.borrow_and_update().worker, WorkerState::Running);
    token.cancel();
    tasks.close();
    tokio::time::timeout(Duration::from_secs(10), tasks.wait())
        .await
        .expect("the token stops it");
}

#[tokio::test]
async fn health_says_what_the_runner_is_doing() {
    let (_t, store, root) = store_of(10);
    let first = spawned(&store, fs_bucket(&root), "first");
    poll_for(&first, "idle", |h| h.lease_held && h.activity == "idle").await;
    let second = spawned(&store, fs_bucket(&root), "second");
    let h = poll_for(&second, "waiting for the lease", |h| {
        h.activity.starts_with("waiting for the bucket lease")
    })
    .await;
    assert!(h.activity.contains("first@"), "{h:#?}");
    first.shutdown(false).await;
    second.shutdown(false).await;
}

/// A local-directory bucket at `root` whose PUTs of the keys `hangs` picks take a minute.
fn puts_hang(root: &Path, hangs: fn(&str) -> bool) -> DynBucket {
    let plan = FaultPlan::custom(move |r| {
        if r.op == Op::Put && hangs(r.key) {
            Fault::Delay(Duration::from_secs(60))
        } else {
            Fault::Pass
        }
    });
    faulty(root, plan)
}

/// Polls health (up to 20 s) until it satisfies `pred`: the activity alone changing does not
/// wake a watcher of health (see `StoreHealth::same_state`), so [`wait_for`] would not see it.
async fn poll_for(
    h: &BackupHandle,
    what: &str,
    pred: impl Fn(&StoreHealth) -> bool,
) -> StoreHealth {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let now = h.health();
        if pred(&now) {
            return now;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}; health is {now:#?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_step_hung_in_an_upload_names_that_upload_in_health() {
    let t = tempfile::tempdir().unwrap();
    let (store, root) = (t.path().join("s"), t.path().join("b"));
    write(&store, 100, 40, 0);
    // The snapshot's upload hangs: the step is stuck in it, everything else goes through.
    let b = puts_hang(&root, |key| key.ends_with("snapshot.bin"));
    let w = spawned(&store, b, "me");
    let h = poll_for(&w, "the snapshot's upload in health", |h| {
        h.activity.starts_with("uploading the snapshot")
    })
    .await;
    assert!(h.activity.contains("generation 1"), "{h:#?}");
    assert!(h.lease_held, "stuck in an upload, but holding the lease");
    w.shutdown(false).await;
}

/// Issue 27: in `durability = sync`, a lease that stops holding cancels the WAL PUT in flight
/// (it never lands) and breaks the durable chain with the reason, before anything else is
/// published: a node's waits that PUT would have acknowledged fail (the stream says
/// `DurabilityLost` on a chain break, `position_stream.rs`), none is acknowledged.
#[tokio::test]
async fn a_lost_lease_cancels_the_wal_put_in_flight_and_breaks_the_durable_chain() {
    use std::sync::atomic::AtomicBool;
    use support::store::{commit_more, tree};
    let (_t, store, root) = store_of(20);
    // Once cut: every WAL segment PUT hangs a minute and every lease renewal fails.
    let cut = Arc::new(AtomicBool::new(false));
    let c = cut.clone();
    let plan = FaultPlan::custom(move |r| {
        if !c.load(Ordering::SeqCst) || r.op != Op::Put {
            Fault::Pass
        } else if r.key.contains("/wal/") {
            Fault::Delay(Duration::from_secs(60))
        } else if r.key == manifest::LEASE_KEY {
            Fault::Fail
        } else {
            Fault::Pass
        }
    });
    let faulty = Arc::new(FaultyBucket::new(fs_bucket(&root), plan));
    let b: DynBucket = faulty.clone();
    let config = WorkerConfig {
        durability: mushroom_backup::worker::DurabilityMode::Sync,
        ..fast()
    };
    let w =
        worker(&store, b, config).spawn(lease("me"), CancellationToken::new(), &TaskTracker::new());
    let mut durable = w.watch_durable();
    let deadline = Duration::from_secs(20);
    tokio::time::timeout(
        deadline,
        durable.wait_for(|d| d.position.is_some_and(|p| p.commit_seq == 20)),
    )
    .await
    .expect("commit 20 durable in time")
    .expect("the worker runs");
    assert_eq!(durable.borrow().chain, 0);
    let segments = |root: &std::path::Path| -> Vec<std::path::PathBuf> {
        tree(root)
            .into_keys()
            .filter(|k| k.to_string_lossy().contains("/wal/"))
            .collect()
    };
    let before = segments(&root);

    cut.store(true, Ordering::SeqCst);
    assert_eq!(commit_more(&store, 5), 25);
    // The renewals fail: at the lease's deadline the step is dropped and the chain breaks.
    let broken = tokio::time::timeout(deadline, durable.wait_for(|d| d.chain == 1))
        .await
        .expect("the chain broke in time")
        .expect("the worker runs")
        .clone();
    assert_eq!(broken.position, None, "{broken:?}");
    let why = broken.broken.unwrap_or_default();
    assert!(why.contains("lease"), "the reason names the lease: {why:?}");
    assert!(
        faulty
            .log()
            .iter()
            .any(|e| e.op == Op::Put && e.key.contains("/wal/") && e.fault != Fault::Pass),
        "no WAL PUT was in flight when the lease went: {:?}",
        faulty.log()
    );
    // Commit 25 was never published, and the cancelled PUT never lands.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(segments(&root), before, "a cancelled WAL PUT landed");
    assert!(
        durable.borrow().position.is_none_or(|p| p.commit_seq < 25),
        "{:?}",
        durable.borrow()
    );
    w.shutdown(false).await;
}
